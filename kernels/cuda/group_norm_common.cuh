// GroupNorm's per-element epilogue (normalise, gamma/beta, act, FiLM, residual, post_act) and its statistics, for the
// GroupNorm kernels (norm.cu) and any kernel that normalises a GroupNorm's output itself.
#pragma once
#include <cstddef>
#include <cstdint>

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

/// Elements of one group that the one-block GroupNorm kernels hold in registers (256 threads x 8).
constexpr int kGroupNormBlockElements = 2048;

/// Whether group_norm_gemm_layout takes p: every group within one block's registers.
inline bool group_norm_gemm_layout_fits(const GroupNormParams& p) {
    return p.groups > 0 && std::int64_t(p.channels / p.groups) * p.length <= kGroupNormBlockElements;
}

/// GroupNorm (with p's epilogue, into p.y) of a conv output held as a library GEMM's d[b * length + t][c] plus
/// bias[c] (may be null) instead of p.x (norm.cu); the caller checks group_norm_gemm_layout_fits(p).
void group_norm_gemm_layout(const GroupNormParams& p, const float* d, const float* bias, cudaStream_t st);

}  // namespace flowedge::cuda::detail
