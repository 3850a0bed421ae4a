// The transformer primitives (ACT's encoder and decoder): one POD params struct per op and its argument checks, shared
// by every backend's Ops table like op_params.hpp / op_checks.hpp. Kept in their own header so the op family can grow
// (and gain CUDA kernels) without touching the convolutional ops.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "flowedge/error.hpp"
#include "flowedge/op_checks.hpp"

namespace flowedge {

/// torch.nn.LayerNorm over the last dimension, optionally of a sum (the residual add before a post-norm):
///   t = x[r, :] + residual[r, :] (float32 add; x alone when residual is null),
///   y[r, d] = (t[d] - mean(t)) / sqrt(var(t) + eps) * gamma[d] + beta[d]   (biased variance, statistics in double).
/// x, residual, y: [rows, dim]; gamma, beta: [dim] (null = 1 / 0). y may equal x or residual.
struct LayerNormParams {
    const float* x = nullptr;
    const float* residual = nullptr;
    const float* gamma = nullptr;
    const float* beta = nullptr;
    float* y = nullptr;
    int rows = 0, dim = 0;
    float eps = 1e-5f;
};

/// Scaled dot-product attention of torch.nn.MultiheadAttention after its input projections, no mask, no dropout:
/// per head h (columns [h * head_dim, (h + 1) * head_dim) of q, k, v and out),
///   out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j, h]) v[j, h]   (exact float32 softmax: max-subtracted exp).
/// q: [n_q, n_heads * head_dim] (row stride ld_q, 0 = contiguous), k and v: [n_kv, ...] (ld_k, ld_v),
/// out: [n_q, n_heads * head_dim] (ld_out); out must not overlap q, k or v.
struct AttentionParams {
    const float* q = nullptr;
    const float* k = nullptr;
    const float* v = nullptr;
    float* out = nullptr;
    int n_q = 0, n_kv = 0, n_heads = 0, head_dim = 0;
    int ld_q = 0, ld_k = 0, ld_v = 0, ld_out = 0;
    float scale = 1.f;  ///< torch: 1 / sqrt(head_dim)
};

/// torch.nn.functional.gelu (approximate='none'): y = x / 2 * (1 + erf(x / sqrt(2))), elementwise; y may equal x.
struct GeluParams {
    const float* x = nullptr;
    float* y = nullptr;
    std::int64_t n = 0;
};

/// y[c, r] = x[r, c]: a [rows, cols] matrix to [cols, rows] (channel-major feature maps to token rows).
struct TransposeParams {
    const float* x = nullptr;
    float* y = nullptr;
    int rows = 0, cols = 0;
};

/// LeRobot's ACTSinusoidalPositionEmbedding2d(dim / 2) for an h x w feature map, written token-major:
/// y[r * w + c, :] = [embed(r + 1, h) | embed(c + 1, w)], each half of dim / 2 channels interleaving
/// sin (even i) and cos (odd i) of  2 pi p / (n + 1e-6) / 10000^(2 floor(i / 2) / (dim / 2))  (float32, as torch).
/// y: [h * w, dim]; dim must be even.
struct PositionEmbedding2dParams {
    float* y = nullptr;
    int h = 0, w = 0, dim = 0;
};

/// Ops::layer_norm: positive sizes, eps >= 0, x and y set.
inline void check_args(const LayerNormParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "layer_norm";
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("rows >= 0, dim > 0", fields({{"rows", p.rows}, {"dim", p.dim}})));
    if (!(p.eps >= 0.f)) [[unlikely]] fail(op, "eps must be non-negative" + expected_got(">= 0", std::to_string(p.eps)));
    if (p.rows > 0 && !(p.x && p.y)) [[unlikely]] fail(op, "null x or y pointer");
}

/// Ops::attention: positive sizes, strides at least the row, finite scale, pointers set, out apart from q, k, v.
inline void check_args(const AttentionParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "attention";
    if (!(p.n_q >= 0 && p.n_kv > 0 && p.n_heads > 0 && p.head_dim > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("n_q >= 0, n_kv, n_heads, head_dim > 0",
                                                         fields({{"n_q", p.n_q}, {"n_kv", p.n_kv}, {"n_heads", p.n_heads},
                                                                 {"head_dim", p.head_dim}})));
    const long long width = (long long)p.n_heads * p.head_dim;
    for (const auto& [name, ld] : {std::pair{"ld_q", p.ld_q}, {"ld_k", p.ld_k}, {"ld_v", p.ld_v}, {"ld_out", p.ld_out}})
        if (!(ld == 0 || ld >= width)) [[unlikely]]
            fail(op, std::string("row stride shorter than the row") +
                         expected_got(std::string(name) + " >= n_heads * head_dim = " + std::to_string(width) + " (0 = contiguous)", ld));
    if (!(p.scale == p.scale && p.scale - p.scale == 0.f)) [[unlikely]] fail(op, "scale must be finite" + expected_got("finite", std::to_string(p.scale)));
    if (p.n_q == 0) return;
    if (!(p.q && p.k && p.v && p.out)) [[unlikely]] fail(op, "null q, k, v or out pointer");
    const auto end = [&](const float* base, int n, int ld) { return base + (long long)(n - 1) * (ld ? ld : width) + width; };
    const float* out_end = end(p.out, p.n_q, p.ld_out);
    const auto overlaps = [&](const float* base, const float* base_end) { return p.out < base_end && base < out_end; };
    if (overlaps(p.q, end(p.q, p.n_q, p.ld_q)) || overlaps(p.k, end(p.k, p.n_kv, p.ld_k)) || overlaps(p.v, end(p.v, p.n_kv, p.ld_v)))
        [[unlikely]]
        fail(op, "out overlaps q, k or v (the inputs are read after out is written)");
}

/// Ops::gelu: n >= 0, x and y set.
inline void check_args(const GeluParams& p) {
    if (p.n < 0) [[unlikely]] fail("gelu", "negative size" + expected_got(">= 0", p.n));
    if (p.n > 0 && !(p.x && p.y)) [[unlikely]] fail("gelu", "null x or y pointer");
}

/// Ops::transpose: positive sizes, x and y set and apart.
inline void check_args(const TransposeParams& p) {
    using namespace op_checks_detail;
    if (!(p.rows > 0 && p.cols > 0)) [[unlikely]]
        fail("transpose", "sizes must be positive" + expected_got("rows, cols > 0", fields({{"rows", p.rows}, {"cols", p.cols}})));
    if (!(p.x && p.y)) [[unlikely]] fail("transpose", "null x or y pointer");
    const long long n = (long long)p.rows * p.cols;
    if (p.y < p.x + n && p.x < p.y + n) [[unlikely]] fail("transpose", "x and y overlap (the op is out of place)");
}

/// Ops::position_embedding_2d: positive map size, an even positive dim, y set.
inline void check_args(const PositionEmbedding2dParams& p) {
    using namespace op_checks_detail;
    if (!(p.h > 0 && p.w > 0 && p.dim > 0 && p.dim % 2 == 0)) [[unlikely]]
        fail("position_embedding_2d", "sizes must be positive and dim even" +
                                          expected_got("h, w > 0, dim > 0 and even", fields({{"h", p.h}, {"w", p.w}, {"dim", p.dim}})));
    if (!p.y) [[unlikely]] fail("position_embedding_2d", "null y pointer");
}

}  // namespace flowedge
