// torch.nn.MaxPool2d(kernel, stride, padding) (dilation 1, ceil_mode off), as after the ResNet stem
// (3x3 / 2, pad 1: 64 x 42 x 42 -> 64 x 21 x 21).
// One thread per output in a grid-stride loop of 256-thread blocks; the window is clipped to the image (padding
// never wins) and scanned row by row with PyTorch's CPU rule `v > max || isnan(v)`, so a NaN anywhere in the window
// gives NaN. Exact (a max), hence deterministic.
#include <string>
#include <string_view>

#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) max_pool2d_kernel(MaxPool2dParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): x is an earlier kernel's output
    detail::pdl_allow_next();
    const std::int64_t per_plane = std::int64_t(p.out_h) * p.out_w;
    const std::int64_t n = std::int64_t(p.batch) * p.channels * per_plane;
    for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < n;
         idx += std::int64_t(gridDim.x) * blockDim.x) {
        const std::int64_t plane = idx / per_plane;
        const int q = int(idx - plane * per_plane);
        const int r = q / p.out_w, c = q - r * p.out_w;
        const int h0 = r * p.stride - p.pad, w0 = c * p.stride - p.pad;
        const int h_lo = max(h0, 0), h_hi = min(h0 + p.kernel, p.in_h);
        const int w_lo = max(w0, 0), w_hi = min(w0 + p.kernel, p.in_w);
        const float* x = p.x + plane * p.in_h * p.in_w;
        float m = -INFINITY;
        for (int h = h_lo; h < h_hi; ++h)
            for (int w = w_lo; w < w_hi; ++w) {
                const float v = x[std::int64_t(h) * p.in_w + w];
                if (v > m || v != v) m = v;
            }
        p.y[idx] = m;
    }
}

}  // namespace

void max_pool2d(const MaxPool2dParams& p, Stream s) {
    constexpr std::string_view comp = "cuda max_pool2d";
    check(p.batch > 0 && p.channels > 0 && p.in_h > 0 && p.in_w > 0 && p.kernel > 0 && p.stride > 0 && p.pad >= 0 &&
              2 * p.pad <= p.kernel,
          comp, "sizes must be positive (0 <= pad <= kernel / 2)");
    const long long want_h = ((long long)p.in_h + 2LL * p.pad - p.kernel) / p.stride + 1;
    const long long want_w = ((long long)p.in_w + 2LL * p.pad - p.kernel) / p.stride + 1;
    if (!(want_h >= 1 && want_w >= 1 && p.out_h == want_h && p.out_w == want_w)) [[unlikely]]
        fail(comp, "output size inconsistent with input, kernel, stride and pad" +
             expected_got(std::to_string(want_h) + " x " + std::to_string(want_w),
             std::to_string(p.out_h) + " x " + std::to_string(p.out_w)));
    check(p.x && p.y, comp, "null x or y pointer");
    const std::int64_t n = std::int64_t(p.batch) * p.channels * p.out_h * p.out_w;
    detail::launch_pdl(max_pool2d_kernel, dim3(detail::blocks_for(n, kThreads, 8LL * detail::sm_count())),
                       dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("max_pool2d_kernel");
}

}  // namespace flowedge::cuda
