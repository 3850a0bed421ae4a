// torch.nn.MultiheadAttention (batch_first False, no mask, eval) for batch 1: the packed input projection split at
// load into its query / key / value parts, so queries, keys and values may come from different inputs (DETR-style
// position embeddings are added to queries and keys only).
#pragma once
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flowedge/io/safetensors.hpp"
#include "flowedge/layers/conv2d.hpp"
#include "flowedge/layers/linear.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// Buffers on the backend one MultiheadAttention call works in, each with room for max(n_q, n_kv) rows of dim floats.
struct AttentionScratch {
    float *q = nullptr, *k = nullptr, *v = nullptr, *heads = nullptr;
};

/// nn.MultiheadAttention(dim, n_heads): out = out_proj(attention(q_in W_q^T + b_q, k_in W_k^T + b_k, v_in W_v^T + b_v))
/// with W_q, W_k, W_v the row blocks [0, dim), [dim, 2 dim), [2 dim, 3 dim) of in_proj_weight [3 dim, dim].
/// q_in: [n_q, dim], k_in and v_in: [n_kv, dim], out: [n_q, dim].
template <Backend B>
class MultiheadAttention {
public:
    struct Config {
        int dim = 0;
        int n_heads = 1;
    };
    using Scratch = AttentionScratch;

    MultiheadAttention() = default;
    explicit MultiheadAttention(Config cfg) : m_cfg(cfg), m_out({.in = cfg.dim, .out = cfg.dim, .many_rows = true}) {
        check(cfg.dim > 0 && cfg.n_heads > 0 && cfg.dim % cfg.n_heads == 0, "multihead_attention",
              "dim must be a positive multiple of n_heads" + expected_got("dim % n_heads == 0",
                                                                          std::to_string(cfg.dim) + " % " + std::to_string(cfg.n_heads)));
    }

    const Config& config() const { return m_cfg; }

    /// Binds `prefix`in_proj_weight [3 dim, dim], in_proj_bias [3 dim], out_proj.weight, out_proj.bias. The packed
    /// projection is split on the host and stored in the file's dtype (or opts.weight_dtype).
    void load(const std::shared_ptr<const io::SafeTensors>& file, const std::string& prefix, const LoadOptions& opts,
              std::string_view component) {
        const int D = m_cfg.dim;
        const io::TensorInfo& w = require_tensor(*file, prefix + "in_proj_weight", Shape{3 * D, D}, component);
        const io::TensorInfo& b = require_tensor(*file, prefix + "in_proj_bias", Shape{3 * D}, component);
        std::vector<float> wv(std::size_t(3) * D * D), bv(std::size_t(3) * D);
        Parameter<Cpu>::convert(w.data, w.dtype, wv.data(), DType::F32, wv.size());
        Parameter<Cpu>::convert(b.data, b.dtype, bv.data(), DType::F32, bv.size());
        const DType dtype = opts.weight_dtype.value_or(w.dtype);
        const std::size_t block = std::size_t(D) * D;
        for (int part = 0; part < 3; ++part) {
            const std::string name = prefix + "in_proj_weight[" + std::to_string(part * D) + ":" + std::to_string((part + 1) * D) + "]";
            m_in_w[part].assign(std::span<const float>(wv.data() + part * block, block), Shape{D, D}, dtype, Storage::ManyRowsMatrix, name,
                                component);
            m_in_b[part].assign_f32(std::vector<float>(bv.begin() + part * D, bv.begin() + (part + 1) * D), Shape{D});
        }
        bind_parameters<B>(m_out, file, prefix + "out_proj.", opts, component);
    }

    /// out = attention output of (q_in, k_in, v_in), or out += it with `accumulate` (a pre-norm block's residual add).
    /// k_in and v_in may be the same rows; out must not overlap the scratch.
    void forward(Context<B>& ctx, const float* q_in, const float* k_in, const float* v_in, int n_q, int n_kv, const Scratch& s,
                 float* out, bool accumulate = false) const {
        project(ctx, 0, q_in, s.q, n_q);
        project(ctx, 1, k_in, s.k, n_kv);
        project(ctx, 2, v_in, s.v, n_kv);
        AttentionParams a;
        a.q = s.q;
        a.k = s.k;
        a.v = s.v;
        a.out = s.heads;
        a.n_q = n_q;
        a.n_kv = n_kv;
        a.n_heads = m_cfg.n_heads;
        a.head_dim = m_cfg.dim / m_cfg.n_heads;
        a.scale = float(1.0 / std::sqrt(double(a.head_dim)));
        Ops<B>::attention(a, ctx.stream);
        m_out.forward(ctx, s.heads, out, n_q, Activation::None, accumulate);
    }

    std::int64_t n_parameters() const { return 3 * std::int64_t(m_cfg.dim) * (m_cfg.dim + 1) + m_out.n_parameters(); }

private:
    void project(Context<B>& ctx, int part, const float* x, float* y, int rows) const {
        LinearParams p;
        p.x = x;
        p.w = m_in_w[part].ref();
        p.bias = m_in_b[part].f32();
        p.y = y;
        p.rows = rows;
        p.in = m_cfg.dim;
        p.out = m_cfg.dim;
        p.math = ctx.math;
        p.f32_gemm = ctx.f32_gemm;
        Ops<B>::linear(p, ctx.stream);
    }

    Config m_cfg{};
    Parameter<B> m_in_w[3], m_in_b[3];
    Linear<B> m_out;
};

}  // namespace flowedge
