// Device helpers shared by the bandwidth-bound conv kernels (conv1d_row.cu, conv1d_tiled.cu, conv_transpose1d.cu):
// block size, raw weight loads and the fixed-order block reduction. Design notes: docs/kernels/cuda_conv.md.
#pragma once
#include <type_traits>

#include "common.cuh"

namespace flowedge::cuda::detail {

/// Threads per block of the row, tiled and transposed-conv kernels: 8 warps, which split a weight row's channels.
constexpr int kConvThreads = 256;
constexpr int kConvWarps = kConvThreads / 32;

/// The raw load unit of `n` consecutive stored weights: 16 bytes (uint4) or 8 bytes (uint2).
template <class T, int n>
using RawUnit = std::conditional_t<n * sizeof(T) == 16, uint4, uint2>;

/// 4 consecutive weights widened to float: one 16-byte load (F32) or one 8-byte load (BF16/F16).
template <class T>
__device__ __forceinline__ void load4(const T* p, float* out) {
    widen_raw<T>(__ldg(reinterpret_cast<const RawUnit<T, 4>*>(p)), out);
}

/// Ends a block of the row or tiled path. Each lane holds NV partial sums (its outputs x positions); `red` is
/// the block's [kConvWarps][NV] shared scratch. Lanes are reduced by a warp butterfly, then the `wpo` warps that
/// share one output group (warps g*wpo .. g*wpo+wpo-1) are summed in warp order, so the result is deterministic.
/// store(g, v, sum) is called once per (group g < n_groups, value v < NV) with the fixed-order sum (no bias).
template <int NV, class Store>
__device__ __forceinline__ void reduce_and_store(float (&acc)[NV], float (*red)[NV], int wpo, int n_groups,
                                                 Store&& store) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
        const float s = warp_sum(acc[v]);
        if (lane == 0) red[warp][v] = s;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n_groups * NV; idx += kConvThreads) {
        const int g = idx / NV, v = idx % NV;
        float sum = 0.f;
        for (int w2 = 0; w2 < wpo; ++w2) sum += red[g * wpo + w2][v];
        store(g, v, sum);
    }
}

}  // namespace flowedge::cuda::detail
