// torch.nn.Conv1d tiled path: any length and padding for kernel/stride in {5/1, 3/1, 3/2, 1/1} (the row path's
// lane layout over tiles of output positions, with the input window staged per channel chunk), for the lengths and
// paddings the row path does not take. Launch geometry and numerics: docs/kernels/cuda_conv.md.
#include <cstddef>

#include "common.cuh"
#include "conv1d_paths.cuh"
#include "conv_common.cuh"

namespace flowedge::cuda {
namespace {

constexpr int kMaxDynSmem = 46 * 1024;  // + static reduction scratch stays under the 48 KiB default

/// One block: ob_per_block output channels x LT output positions (from t0 = blockIdx.y * LT) of batch element
/// blockIdx.z; the 8/ob_per_block warps of one output split in_channels. Per chunk of 128 * wpo channels the block
/// stages the input window of the tile ((LT-1)*S + KS positions, padded to an odd XWP) in shared memory as float4
/// of 4 channels, while the next chunk's weights are already in flight in registers. T weight type, KS kernel,
/// S stride, LT tile length.
template <class T, int KS, int S, int LT>
__global__ void __launch_bounds__(detail::kConvThreads) conv1d_tiled_kernel(Conv1dParams p, int ob_per_block) {
    constexpr int XW = (LT - 1) * S + KS;
    constexpr int XWP = XW | 1;
    extern __shared__ float4 xs[];  // [32 * wpo groups][XWP] float4 = 4 channels at one input position
    __shared__ float red[detail::kConvWarps][LT];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wpo = detail::kConvWarps / ob_per_block;
    const int ob = warp / wpo, ws = warp % wpo;
    const int o = blockIdx.x * ob_per_block + ob;
    const bool o_ok = o < p.out_channels;
    const int b = blockIdx.z;
    const int t0 = blockIdx.y * LT;
    const int in = p.in_channels;
    const int ch_chunk = 128 * wpo;
    const int g_local = ws * 32 + lane;
    const int x_start = t0 * S - p.pad;
    const float* xb = p.x + std::size_t(b) * in * p.in_length;
    const T* wrow = static_cast<const T*>(p.w.data) + std::size_t(o_ok ? o : 0) * in * KS;

    float acc[LT];
#pragma unroll
    for (int t = 0; t < LT; ++t) acc[t] = 0.f;

    float wn[4 * KS];
    auto load_weights = [&](int c0, float* dst) {
        const int c = c0 + 4 * g_local;
        if (o_ok && c < in) {
            const T* src = wrow + std::size_t(c) * KS;
#pragma unroll
            for (int q = 0; q < KS; ++q) detail::load4<T>(src + 4 * q, dst + 4 * q);
        } else {
#pragma unroll
            for (int q = 0; q < 4 * KS; ++q) dst[q] = 0.f;
        }
    };
    load_weights(0, wn);
    detail::pdl_wait();  // the input (previous kernel's output) is complete from here on
    detail::pdl_allow_next();

    float* xsf = reinterpret_cast<float*>(xs);
    for (int c0 = 0; c0 < in; c0 += ch_chunk) {
        float wc[4 * KS];
#pragma unroll
        for (int q = 0; q < 4 * KS; ++q) wc[q] = wn[q];
        if (c0 + ch_chunk < in) load_weights(c0 + ch_chunk, wn);  // in flight during this chunk

        __syncthreads();  // previous chunk's readers are done with xs
        const int n_stage = ch_chunk * XW;
        for (int idx = threadIdx.x; idx < n_stage; idx += detail::kConvThreads) {
            const int cl = idx / XW;
            const int j = idx - cl * XW;
            const int c = c0 + cl;
            const int pos = x_start + j;
            float v = 0.f;
            if (c < in && pos >= 0 && pos < p.in_length) v = __ldg(xb + std::size_t(c) * p.in_length + pos);
            xsf[((cl >> 2) * XWP + j) * 4 + (cl & 3)] = v;
        }
        __syncthreads();

#pragma unroll
        for (int j = 0; j < XW; ++j) {
            const float4 xv = xs[g_local * XWP + j];
            const float xa[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
#pragma unroll
                for (int t = 0; t < LT; ++t) {
                    const int k = j - t * S;
                    if (k >= 0 && k < KS) acc[t] += wc[cc * KS + k] * xa[cc];
                }
            }
        }
    }

    detail::reduce_and_store<LT>(acc, red, wpo, ob_per_block, [&](int obi, int t, float sum) {
        const int o2 = blockIdx.x * ob_per_block + obi;
        if (o2 < p.out_channels && t0 + t < p.out_length) {
            if (p.bias) sum += p.bias[o2];
            p.y[(std::size_t(b) * p.out_channels + o2) * p.out_length + t0 + t] = sum;
        }
    });
}

/// Output channels per block: 8, halved while the grid has fewer than 2 blocks per SM and the halved block's staged
/// window (twice the warps per output, twice the chunk) still fits in kMaxDynSmem.
template <class T, int KS, int S, int LT>
void launch_conv1d_tiled(const Conv1dParams& p, cudaStream_t st) {
    constexpr int XW = (LT - 1) * S + KS;
    constexpr int XWP = XW | 1;
    const int n_tiles = (p.out_length + LT - 1) / LT;
    auto smem_for = [](int ob) { return 128 * (detail::kConvWarps / ob) / 4 * XWP * int(sizeof(float4)); };
    const long long target = 2LL * detail::sm_count();
    int ob = 8;
    while (ob > 1 && (long long)((p.out_channels + ob - 1) / ob) * n_tiles * p.batch < target &&
           smem_for(ob / 2) <= kMaxDynSmem)
        ob /= 2;
    const dim3 grid(unsigned((p.out_channels + ob - 1) / ob), unsigned(n_tiles), unsigned(p.batch));
    detail::launch_pdl(conv1d_tiled_kernel<T, KS, S, LT>, grid, dim3(detail::kConvThreads), smem_for(ob), st, p, ob);
}

/// Tile length: the smallest of 2, 4, 8 that covers out_length, else tiles of 16.
template <class T, int KS, int S>
void launch_conv1d_tiled_lt(const Conv1dParams& p, cudaStream_t st) {
    if (p.out_length <= 2) launch_conv1d_tiled<T, KS, S, 2>(p, st);
    else if (p.out_length <= 4) launch_conv1d_tiled<T, KS, S, 4>(p, st);
    else if (p.out_length <= 8) launch_conv1d_tiled<T, KS, S, 8>(p, st);
    else launch_conv1d_tiled<T, KS, S, 16>(p, st);
}

}  // namespace

namespace detail {

template <class T>
bool try_conv1d_tiled(const Conv1dParams& p, cudaStream_t st) {
    const std::size_t wal = sizeof(T) == 4 ? 16 : 8;
    if (p.in_channels % 4 != 0 || !detail::aligned(p.w.data, wal)) return false;
    if (p.kernel == 5 && p.stride == 1) launch_conv1d_tiled_lt<T, 5, 1>(p, st);
    else if (p.kernel == 3 && p.stride == 1) launch_conv1d_tiled_lt<T, 3, 1>(p, st);
    else if (p.kernel == 3 && p.stride == 2) launch_conv1d_tiled_lt<T, 3, 2>(p, st);
    else if (p.kernel == 1 && p.stride == 1) launch_conv1d_tiled_lt<T, 1, 1>(p, st);
    else return false;
    return true;
}

template bool try_conv1d_tiled<float>(const Conv1dParams&, cudaStream_t);
template bool try_conv1d_tiled<bf16>(const Conv1dParams&, cudaStream_t);
template bool try_conv1d_tiled<f16>(const Conv1dParams&, cudaStream_t);

}  // namespace detail
}  // namespace flowedge::cuda
