// torch.nn.Linear on the GPU as a weight stream: each weight element is read once per row block with
// 16-byte coalesced loads; the few activation rows ride along in registers.
//
// Launch geometry: 256 threads = 8 warps per block, one warp per output feature o (grid = ceil(out/8),
// capped and grid-strided). A warp walks w[o, :] with 16-byte loads (4 F32 or 8 BF16/F16 elements per
// lane per step, 512 contiguous bytes per warp per step) and keeps kRows partial sums per lane; rows
// beyond kRows are processed in further passes over the same (by then L1/L2-resident) weight row.
// Numerics: float accumulation per lane in index order, then a butterfly warp reduction; bias and the
// activation are applied once, in float, with precise math.
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;

template <class T, bool Vec>
__global__ void __launch_bounds__(kWarps * 32) linear_kernel(LinearParams p) {
    detail::pdl_wait();  // launched with launch_pdl: x (and y when accumulating) come from earlier kernels
    detail::pdl_allow_next();
    const int lane = threadIdx.x & 31;
    const int ld_x = p.ld_x ? p.ld_x : p.in;
    const int ld_y = p.ld_y ? p.ld_y : p.out;
    const T* w = static_cast<const T*>(p.w.data);
    for (int o = blockIdx.x * kWarps + (threadIdx.x >> 5); o < p.out; o += gridDim.x * kWarps) {
        const T* wrow = w + std::size_t(o) * p.in;
        for (int r0 = 0; r0 < p.rows; r0 += kRows) {
            float acc[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r] = 0.f;
            if constexpr (Vec) {
                constexpr int V = detail::Vec16<T>::n;
#pragma unroll 4
                for (int i = lane * V; i < p.in; i += 32 * V) {
                    float wv[V];
                    detail::load_w16<T>(wrow + i, wv);
#pragma unroll
                    for (int r = 0; r < kRows; ++r) {
                        if (r0 + r < p.rows) {
                            const float* xr = p.x + std::size_t(r0 + r) * ld_x + i;
#pragma unroll
                            for (int q = 0; q < V; q += 4) {
                                const float4 xv = __ldg(reinterpret_cast<const float4*>(xr + q));
                                acc[r] += wv[q] * xv.x;
                                acc[r] += wv[q + 1] * xv.y;
                                acc[r] += wv[q + 2] * xv.z;
                                acc[r] += wv[q + 3] * xv.w;
                            }
                        }
                    }
                }
            } else {
#pragma unroll 4
                for (int i = lane; i < p.in; i += 32) {
                    const float wv = detail::load_w<T>(wrow, i);
#pragma unroll
                    for (int r = 0; r < kRows; ++r)
                        if (r0 + r < p.rows) acc[r] += wv * __ldg(p.x + std::size_t(r0 + r) * ld_x + i);
                }
            }
            float mine = 0.f;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const float s = detail::warp_sum(acc[r]);
                if (lane == r) mine = s;
            }
            const int r = r0 + lane;
            if (lane < kRows && r < p.rows) {
                float v = mine + (p.bias ? p.bias[o] : 0.f);
                v = detail::apply_act(p.act, v);
                float* yp = p.y + std::size_t(r) * ld_y + o;
                *yp = p.accumulate ? *yp + v : v;
            }
        }
    }
}

}  // namespace

void linear(const LinearParams& p, Stream s) {
    check(p.rows >= 0 && p.in > 0 && p.out > 0, "cuda linear", "sizes must be positive" +
          expected_got("rows >= 0, in > 0, out > 0", std::to_string(p.rows) + "x" + std::to_string(p.in) + "->" + std::to_string(p.out)));
    check(p.x && p.w.data && p.y, "cuda linear", "null x, w or y pointer");
    const int ld_x = p.ld_x ? p.ld_x : p.in;
    const int ld_y = p.ld_y ? p.ld_y : p.out;
    check(ld_x >= p.in && ld_y >= p.out, "cuda linear", "row stride smaller than the row" +
          expected_got(">= " + std::to_string(p.in) + "/" + std::to_string(p.out), std::to_string(ld_x) + "/" + std::to_string(ld_y)));
    if (p.rows == 0) return;
    const cudaStream_t st = detail::resolve(s);
    const unsigned grid = detail::blocks_for(p.out, kWarps, 1 << 20);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        constexpr int V = detail::Vec16<T>::n;
        const bool vec = p.in % V == 0 && ld_x % 4 == 0 && detail::aligned(p.w.data, 16) && detail::aligned(p.x, 16);
        if (vec) detail::launch_pdl(linear_kernel<T, true>, dim3(grid), dim3(kWarps * 32), 0, st, p);
        else detail::launch_pdl(linear_kernel<T, false>, dim3(grid), dim3(kWarps * 32), 0, st, p);
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("linear_kernel");
}

}  // namespace flowedge::cuda
