// GroupNorm's per-element epilogue (normalise, gamma/beta, act, FiLM, residual, post_act) and its statistics, shared
// by the GroupNorm kernels (norm.cu) and by the conv row path, which normalises its staged input in shared memory
// when the conv consumes a GroupNorm's output (group_norm_conv1d, conv1d_row.cu).
#pragma once
#include <cstddef>

#include "common.cuh"
#include "flowedge/op_params.hpp"

namespace flowedge::cuda::detail {

/// Batch row `b` of the FiLM tensor, or null.
__device__ __forceinline__ const float* group_film(const GroupNormParams& p, int b) {
    const int fs = p.film_stride ? p.film_stride : 2 * p.channels;
    return p.film ? p.film + std::size_t(b) * fs : nullptr;
}

/// Element i of a FiLM row (scale at c, bias at channels + c): the row, plus the shared row if set.
__device__ __forceinline__ float film_term(const GroupNormParams& p, const float* film, int i) {
    return p.film_shared ? film[i] + p.film_shared[i] : film[i];
}

/// One output element: normalise, gamma/beta, act, FiLM (scale*a + bias), residual, post_act.
__device__ __forceinline__ float group_norm_epilogue(const GroupNormParams& p, bool film, float xi, float mean_f,
                                                     float rstd_f, float gamma, float beta, float f_scale, float f_bias,
                                                     float res) {
    const float scale = p.gamma ? gamma * rstd_f : rstd_f;  // same float evaluation order as Ops<Cpu>
    float a = (xi - mean_f) * scale + beta;
    a = apply_act(p.act, a);
    if (film) a = f_scale * a + f_bias;
    if (p.residual) a += res;
    return apply_act(p.post_act, a);  // after the residual (ResNet BasicBlock: ReLU)
}

/// (mean, rstd) in float from the double sum `s` and sum of squares `q` of a group's `n` elements. The variance
/// E[x^2] - mean^2 in double: float inputs, so the cancellation costs ~1e-13 relative for the groups here, far below
/// the float rounding of rstd (the CPU's two-pass form gives the same float rstd).
__device__ __forceinline__ float2 group_stats(double s, double q, double n, float eps) {
    const double mean = s / n;
    const double var = fmax(q / n - mean * mean, 0.0);
    return make_float2(float(mean), float(1.0 / sqrt(var + double(eps))));
}

/// Shared memory group_norm_staged() needs beside the staged rows: one (sum, sum of squares) slot per (group, warp)
/// and one (mean, rstd) per group.
__host__ __device__ constexpr int group_norm_staged_bytes(int groups, int warps) {
    return groups * warps * int(sizeof(double2)) + groups * int(sizeof(float2));
}

/// GroupNorm p (and its epilogue) of batch element `b`, applied in place to that element's input staged in shared
/// memory by a consuming kernel: channel c at position t is xs[t * stride + col(c)], LIN positions, p.channels
/// channels. Requires p.channels and p.channels / p.groups to be multiples of 32 (a warp's 32 channels lie in one
/// group) and `scratch`: group_norm_staged_bytes(p.groups, kThreads / 32) bytes of shared memory, 16-byte aligned.
/// Fixed summation order: a lane sums its channel's LIN values, a warp butterfly its 32 channels, each warp adds
/// those into its own slot of the group in channel order, thread g the group's slots in warp order; every block of a
/// grid normalises the same element with the same bits. Ends with a barrier: xs holds the normalised input.
template <int LIN, int kThreads, class Col>
__device__ void group_norm_staged(float* xs, int stride, Col col, const GroupNormParams& p, int b, void* scratch) {
    constexpr int kWarps = kThreads / 32;
    double2* part = static_cast<double2*>(scratch);  // [groups][kWarps]
    float2* stats = reinterpret_cast<float2*>(part + p.groups * kWarps);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int cpg = p.channels / p.groups;
    if (lane == 0)
        for (int g = 0; g < p.groups; ++g) part[g * kWarps + warp] = make_double2(0.0, 0.0);
    for (int c0 = warp * 32; c0 < p.channels; c0 += kThreads) {
        const int c = c0 + lane;
        double s = 0.0, q = 0.0;
#pragma unroll
        for (int t = 0; t < LIN; ++t) {
            const double v = xs[t * stride + col(c)];
            s += v;
            q += v * v;
        }
        s = warp_sum(s);
        q = warp_sum(q);
        if (lane == 0) {
            double2& slot = part[(c0 / cpg) * kWarps + warp];
            slot.x += s;
            slot.y += q;
        }
    }
    __syncthreads();
    for (int g = threadIdx.x; g < p.groups; g += kThreads) {
        double s = 0.0, q = 0.0;
        for (int w = 0; w < kWarps; ++w) {
            s += part[g * kWarps + w].x;
            q += part[g * kWarps + w].y;
        }
        stats[g] = group_stats(s, q, double(cpg) * LIN, p.eps);
    }
    __syncthreads();
    const float* film = group_film(p, b);
    for (int c = threadIdx.x; c < p.channels; c += kThreads) {
        const float2 st = stats[c / cpg];
        const float gamma = p.gamma ? p.gamma[c] : 1.f, beta = p.beta ? p.beta[c] : 0.f;
        const float f_scale = film ? film_term(p, film, c) : 1.f, f_bias = film ? film_term(p, film, p.channels + c) : 0.f;
        const float* res = p.residual ? p.residual + (std::size_t(b) * p.channels + c) * LIN : nullptr;
#pragma unroll
        for (int t = 0; t < LIN; ++t) {
            float& v = xs[t * stride + col(c)];
            v = group_norm_epilogue(p, film != nullptr, v, st.x, st.y, gamma, beta, f_scale, f_bias, res ? res[t] : 0.f);
        }
    }
    __syncthreads();
}

}  // namespace flowedge::cuda::detail
