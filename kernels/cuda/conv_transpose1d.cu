// torch.nn.ConvTranspose1d: the U-Net's x2 upsampling (kernel 4, stride 2, pad 1, input rows of <= 16 positions)
// as a weight stream with sector-wide loads, and an exact generic kernel for every other shape; batched calls under a
// GEMM request go to cuBLASLt (gemm_lt.cu).
// Launch geometry and numerics: docs/kernels/cuda_conv.md.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common.cuh"
#include "conv_common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

/// x2 upsampling (kernel 4, stride 2, pad 1, out_length = 2 * LIN, LIN <= 16): weights [in, out, 4] are streamed
/// along i; in a warp, lanes form (32/ot) x ot (i, o) pairs, so each load reads whole 32-byte sectors (ot consecutive
/// o, 4 taps each, for one i), and the 8 warps split i. Block: ot output channels of batch element blockIdx.y.
/// Partial sums are reduced over the lanes of one o, then over the warps in warp order (deterministic).
template <class T, int LIN>
__global__ void __launch_bounds__(detail::kConvThreads) conv_transpose1d_up2_kernel(ConvTranspose1dParams p, int ot) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    constexpr int LOUT = 2 * LIN;
    __shared__ float red[detail::kConvWarps][8][LOUT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int isub = lane / ot, osub = lane % ot;
    const int ipw = 32 / ot;
    const int o = blockIdx.x * ot + osub;
    const bool o_ok = o < p.out_channels;
    const int b = blockIdx.y;
    const float* xb = p.x + std::size_t(b) * p.in_channels * LIN;
    const T* w = static_cast<const T*>(p.w.data);

    float acc[LOUT];
#pragma unroll
    for (int t = 0; t < LOUT; ++t) acc[t] = 0.f;

    if (o_ok) {
#pragma unroll 2
        for (int i = warp * ipw + isub; i < p.in_channels; i += detail::kConvWarps * ipw) {
            float w4[4];
            detail::load4<T>(w + (std::size_t(i) * p.out_channels + o) * 4, w4);
            float xv[LIN];
            const float* xr = xb + std::size_t(i) * LIN;
            if constexpr (LIN % 4 == 0) {
#pragma unroll
                for (int s = 0; s < LIN; s += 4) {
                    const float4 v = __ldg(reinterpret_cast<const float4*>(xr + s));
                    xv[s] = v.x; xv[s + 1] = v.y; xv[s + 2] = v.z; xv[s + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int s = 0; s < LIN; ++s) xv[s] = __ldg(xr + s);
            }
#pragma unroll
            for (int s = 0; s < LIN; ++s) {
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int t = 2 * s - 1 + k;
                    if (t >= 0 && t < LOUT) acc[t] += w4[k] * xv[s];
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < LOUT; ++t) {
        float v = acc[t];
        for (int off = 16; off >= ot; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (isub == 0) red[warp][osub][t] = v;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < ot * LOUT; idx += detail::kConvThreads) {
        const int os = idx / LOUT, t = idx % LOUT;
        const int o2 = blockIdx.x * ot + os;
        if (o2 < p.out_channels) {
            float sum = 0.f;
#pragma unroll
            for (int w2 = 0; w2 < detail::kConvWarps; ++w2) sum += red[w2][os][t];
            if (p.bias) sum += p.bias[o2];
            p.y[(std::size_t(b) * p.out_channels + o2) * LOUT + t] = sum;
        }
    }
}

/// Any shape: one thread per output element, float accumulation in (channel, tap) order.
template <class T>
__global__ void conv_transpose1d_generic_kernel(ConvTranspose1dParams p) {
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
            for (int k = 0; k < p.kernel; ++k) {
                const int num = t + p.pad - k;
                if (num < 0 || num % p.stride != 0) continue;
                const int s = num / p.stride;
                if (s >= p.in_length) continue;
                acc += detail::load_w<T>(w, (std::size_t(i) * p.out_channels + o) * p.kernel + k) *
                       __ldg(xb + std::size_t(i) * p.in_length + s);
            }
        }
        if (p.bias) acc += p.bias[o];
        p.y[idx] = acc;
    }
}

/// ot: the smallest whose per-i stretch is a whole 32-byte sector, doubled (up to 8) while the grid would still have
/// >= 2 blocks per SM.
template <class T, int LIN>
void launch_conv_transpose1d_up2(const ConvTranspose1dParams& p, cudaStream_t st) {
    const long long target = 2LL * detail::sm_count();
    int ot = sizeof(T) == 4 ? 2 : 4;  // smallest OT whose per-i stretch is a whole 32-byte sector
    while (ot < 8 && (long long)((p.out_channels + 2 * ot - 1) / (2 * ot)) * p.batch >= target) ot *= 2;
    const dim3 grid(unsigned((p.out_channels + ot - 1) / ot), unsigned(p.batch));
    detail::launch_pdl(conv_transpose1d_up2_kernel<T, LIN>, dim3(grid), dim3(detail::kConvThreads), 0, st, p, ot);
}

template <class T>
bool try_conv_transpose1d_up2(const ConvTranspose1dParams& p, cudaStream_t st) {
    const std::size_t wal = sizeof(T) == 4 ? 16 : 8;
    if (p.kernel != 4 || p.stride != 2 || p.pad != 1 || p.out_length != 2 * p.in_length) return false;
    if (!detail::aligned(p.w.data, wal) || !detail::aligned(p.x, 16)) return false;
    switch (p.in_length) {
        case 1: launch_conv_transpose1d_up2<T, 1>(p, st); return true;
        case 2: launch_conv_transpose1d_up2<T, 2>(p, st); return true;
        case 4: launch_conv_transpose1d_up2<T, 4>(p, st); return true;
        case 8: launch_conv_transpose1d_up2<T, 8>(p, st); return true;
        case 16: launch_conv_transpose1d_up2<T, 16>(p, st); return true;
        default: return false;
    }
}

}  // namespace

void conv_transpose1d(const ConvTranspose1dParams& p, Stream s) {
    constexpr std::string_view comp = "cuda conv_transpose1d";
    check(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_length > 0 && p.kernel > 0 &&
              p.stride > 0 && p.pad >= 0,
          comp, "sizes must be positive (pad non-negative)");
    check(p.x && p.w.data && p.y, comp, "null x, w or y pointer");
    const int base = (p.in_length - 1) * p.stride - 2 * p.pad + p.kernel;
    if (!(p.out_length >= base && p.out_length < base + p.stride && p.out_length > 0)) [[unlikely]]
        fail(comp, "out_length inconsistent with in_length/kernel/stride/pad" +
             expected_got(std::to_string(base) + ".." + std::to_string(base + p.stride - 1), p.out_length));
    // Batched calls under a GEMM request (TF32/BF16 math, or F32 math with f32_gemm) with scratch: one library GEMM
    // over every (output channel, tap) pair plus a tap gather (gemm_lt.cu). The up2 kernel below re-reads all the
    // weights per batch row.
    if (p.scratch && conv_transpose1d_gemm(p, s)) return;
    const cudaStream_t st = detail::resolve(s);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        if (try_conv_transpose1d_up2<T>(p, st)) return;
        const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
        detail::launch_pdl(conv_transpose1d_generic_kernel<T>, dim3(detail::blocks_for(total, 128)), dim3(128), 0,
                           st, p);
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv_transpose1d");
}

}  // namespace flowedge::cuda
