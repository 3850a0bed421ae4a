// torch.nn.Conv1d generic path: one thread per output element, float accumulation in (channel, tap) order; the
// exact fallback for every shape the row and tiled paths do not take (docs/kernels/cuda_conv.md).
#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "conv1d_paths.cuh"

namespace flowedge::cuda {
namespace {

template <class T>
__global__ void conv1d_generic_kernel(Conv1dParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
    const T* w = static_cast<const T*>(p.w.data);
    for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
         idx += std::int64_t(gridDim.x) * blockDim.x) {
        const int t = int(idx % p.out_length);
        const int o = int((idx / p.out_length) % p.out_channels);
        const int b = int(idx / (std::int64_t(p.out_length) * p.out_channels));
        const float* xb = p.x + std::size_t(b) * p.in_channels * p.in_length;
        float acc = 0.f;
        for (int i = 0; i < p.in_channels; ++i) {
            const std::size_t wbase = (std::size_t(o) * p.in_channels + i) * p.kernel;
            for (int k = 0; k < p.kernel; ++k) {
                const int pos = t * p.stride + k - p.pad;
                if (pos >= 0 && pos < p.in_length)
                    acc += detail::load_w<T>(w, wbase + k) * __ldg(xb + std::size_t(i) * p.in_length + pos);
            }
        }
        if (p.bias) acc += p.bias[o];
        p.y[idx] = acc;
    }
}

}  // namespace

namespace detail {

template <class T>
void launch_conv1d_generic(const Conv1dParams& p, cudaStream_t st) {
    const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
    detail::launch_pdl(conv1d_generic_kernel<T>, dim3(detail::blocks_for(total, 128)), dim3(128), 0, st, p);
}

template void launch_conv1d_generic<float>(const Conv1dParams&, cudaStream_t);
template void launch_conv1d_generic<bf16>(const Conv1dParams&, cudaStream_t);
template void launch_conv1d_generic<f16>(const Conv1dParams&, cudaStream_t);

}  // namespace detail
}  // namespace flowedge::cuda
