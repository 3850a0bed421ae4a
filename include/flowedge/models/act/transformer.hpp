// ACT's transformer blocks (LeRobot modeling_act.py ACTEncoderLayer / ACTDecoderLayer, eval mode: dropout is the
// identity), post-norm or pre-norm, over Ops<B>. Tokens are rows: x [tokens, dim_model] (batch 1).
#pragma once
#include <memory>
#include <string>

#include "flowedge/io/safetensors.hpp"
#include "flowedge/layers/layer_norm.hpp"
#include "flowedge/layers/linear.hpp"
#include "flowedge/layers/multihead_attention.hpp"
#include "flowedge/models/act/config.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"

namespace flowedge {

/// Buffers on B the blocks work in, each with room for max(encoder tokens, chunk_size) rows.
struct ActScratch {
    AttentionScratch attn;          ///< q, k, v, heads: [rows, dim_model]
    float* sum = nullptr;     ///< [rows, dim_model]: x + position embedding (queries and keys)
    float* normed = nullptr;  ///< [rows, dim_model]: a pre-norm block's normalised input
    float* branch = nullptr;  ///< [rows, dim_model]: an attention or feed-forward output before the residual add
    float* hidden = nullptr;  ///< [rows, dim_feedforward]
};

namespace act_detail {

/// x + pos for `rows` rows of `dim` (Ops<B>::axpby).
template <Backend B>
void add_rows(Context<B>& ctx, const float* x, const float* pos, float* out, int rows, int dim) {
    AxpbyParams p;
    p.x = x;
    p.y = pos;
    p.out = out;
    p.a = 1.f;
    p.b = 1.f;
    p.n = std::int64_t(rows) * dim;
    Ops<B>::axpby(p, ctx.stream);
}

/// linear2(activation(linear1(x))) into `out` (+= with accumulate). x: [rows, dim]; hidden: [rows, dim_feedforward].
template <Backend B>
void feed_forward(Context<B>& ctx, const Linear<B>& l1, const Linear<B>& l2, ActFeedForward act, const float* x, float* hidden,
                  float* out, int rows, bool accumulate) {
    l1.forward(ctx, x, hidden, rows, act == ActFeedForward::Relu ? Activation::Relu : Activation::None);
    if (act == ActFeedForward::Gelu) {
        GeluParams g;
        g.x = hidden;
        g.y = hidden;
        g.n = std::int64_t(rows) * l1.config().out;
        Ops<B>::gelu(g, ctx.stream);
    }
    l2.forward(ctx, hidden, out, rows, Activation::None, accumulate);
}

}  // namespace act_detail

/// ACTEncoderLayer: self-attention (queries and keys get the position embedding, values do not) and the feed-forward
/// block, each with its residual add and LayerNorm (after it: post-norm; before it: pre-norm).
template <Backend B>
class ActEncoderLayer {
public:
    ActEncoderLayer() = default;
    explicit ActEncoderLayer(const ActConfig& c)
        : m_cfg(c),
          m_attn({.dim = c.dim_model, .n_heads = c.n_heads}),
          m_linear1({.in = c.dim_model, .out = c.dim_feedforward, .many_rows = true}),
          m_linear2({.in = c.dim_feedforward, .out = c.dim_model, .many_rows = true}),
          m_norm1({.dim = c.dim_model}),
          m_norm2({.dim = c.dim_model}) {}

    /// Binds `prefix`self_attn.*, linear1.*, linear2.*, norm1.*, norm2.* (e.g. prefix "model.encoder.layers.0.").
    void load(const std::shared_ptr<const io::SafeTensors>& file, const std::string& prefix, const LoadOptions& opts) {
        m_attn.load(file, prefix + "self_attn.", opts, "act");
        bind_parameters<B>(m_linear1, file, prefix + "linear1.", opts, "act");
        bind_parameters<B>(m_linear2, file, prefix + "linear2.", opts, "act");
        bind_parameters<B>(m_norm1, file, prefix + "norm1.", opts, "act");
        bind_parameters<B>(m_norm2, file, prefix + "norm2.", opts, "act");
    }

    /// x <- layer(x) in place. x, pos: [n, dim_model].
    void forward(Context<B>& ctx, float* x, const float* pos, int n, const ActScratch& s) const {
        const int D = m_cfg.dim_model;
        if (m_cfg.pre_norm) {
            m_norm1.forward(ctx, x, nullptr, s.normed, n);
            act_detail::add_rows(ctx, s.normed, pos, s.sum, n, D);
            m_attn.forward(ctx, s.sum, s.sum, s.normed, n, n, s.attn, x, true);
            m_norm2.forward(ctx, x, nullptr, s.normed, n);
            act_detail::feed_forward(ctx, m_linear1, m_linear2, m_cfg.feedforward, s.normed, s.hidden, x, n, true);
        } else {
            act_detail::add_rows(ctx, x, pos, s.sum, n, D);
            m_attn.forward(ctx, s.sum, s.sum, x, n, n, s.attn, s.branch);
            m_norm1.forward(ctx, s.branch, x, x, n);
            act_detail::feed_forward(ctx, m_linear1, m_linear2, m_cfg.feedforward, x, s.hidden, s.branch, n, false);
            m_norm2.forward(ctx, s.branch, x, x, n);
        }
    }

    /// Readies the feed-forward weights' prepared form for arithmetic m (Linear::set_math; no allocation).
    void set_math(MathMode m) {
        m_linear1.set_math(m);
        m_linear2.set_math(m);
    }

private:
    ActConfig m_cfg{};
    MultiheadAttention<B> m_attn;
    Linear<B> m_linear1, m_linear2;
    LayerNorm<B> m_norm1, m_norm2;
};

/// ACTDecoderLayer: self-attention over the action queries, cross-attention to the encoder output (queries get the
/// decoder position embedding, keys the encoder's, values neither), then the feed-forward block; each with its
/// residual add and LayerNorm (post- or pre-norm).
template <Backend B>
class ActDecoderLayer {
public:
    ActDecoderLayer() = default;
    explicit ActDecoderLayer(const ActConfig& c)
        : m_cfg(c),
          m_self({.dim = c.dim_model, .n_heads = c.n_heads}),
          m_cross({.dim = c.dim_model, .n_heads = c.n_heads}),
          m_linear1({.in = c.dim_model, .out = c.dim_feedforward, .many_rows = true}),
          m_linear2({.in = c.dim_feedforward, .out = c.dim_model, .many_rows = true}),
          m_norm1({.dim = c.dim_model}),
          m_norm2({.dim = c.dim_model}),
          m_norm3({.dim = c.dim_model}) {}

    /// Binds `prefix`self_attn.*, multihead_attn.*, linear1.*, linear2.*, norm1..3.* (prefix "model.decoder.layers.0.").
    void load(const std::shared_ptr<const io::SafeTensors>& file, const std::string& prefix, const LoadOptions& opts) {
        m_self.load(file, prefix + "self_attn.", opts, "act");
        m_cross.load(file, prefix + "multihead_attn.", opts, "act");
        bind_parameters<B>(m_linear1, file, prefix + "linear1.", opts, "act");
        bind_parameters<B>(m_linear2, file, prefix + "linear2.", opts, "act");
        bind_parameters<B>(m_norm1, file, prefix + "norm1.", opts, "act");
        bind_parameters<B>(m_norm2, file, prefix + "norm2.", opts, "act");
        bind_parameters<B>(m_norm3, file, prefix + "norm3.", opts, "act");
    }

    /// x <- layer(x, memory) in place. x, pos: [n, dim_model]; memory_keys = memory + its position embedding and
    /// memory: [n_mem, dim_model].
    void forward(Context<B>& ctx, float* x, const float* pos, int n, const float* memory_keys, const float* memory, int n_mem,
                 const ActScratch& s) const {
        const int D = m_cfg.dim_model;
        if (m_cfg.pre_norm) {
            m_norm1.forward(ctx, x, nullptr, s.normed, n);
            act_detail::add_rows(ctx, s.normed, pos, s.sum, n, D);
            m_self.forward(ctx, s.sum, s.sum, s.normed, n, n, s.attn, x, true);
            m_norm2.forward(ctx, x, nullptr, s.normed, n);
            act_detail::add_rows(ctx, s.normed, pos, s.sum, n, D);
            m_cross.forward(ctx, s.sum, memory_keys, memory, n, n_mem, s.attn, x, true);
            m_norm3.forward(ctx, x, nullptr, s.normed, n);
            act_detail::feed_forward(ctx, m_linear1, m_linear2, m_cfg.feedforward, s.normed, s.hidden, x, n, true);
        } else {
            act_detail::add_rows(ctx, x, pos, s.sum, n, D);
            m_self.forward(ctx, s.sum, s.sum, x, n, n, s.attn, s.branch);
            m_norm1.forward(ctx, s.branch, x, x, n);
            act_detail::add_rows(ctx, x, pos, s.sum, n, D);
            m_cross.forward(ctx, s.sum, memory_keys, memory, n, n_mem, s.attn, s.branch);
            m_norm2.forward(ctx, s.branch, x, x, n);
            act_detail::feed_forward(ctx, m_linear1, m_linear2, m_cfg.feedforward, x, s.hidden, s.branch, n, false);
            m_norm3.forward(ctx, s.branch, x, x, n);
        }
    }

    /// Readies the feed-forward weights' prepared form for arithmetic m (Linear::set_math; no allocation).
    void set_math(MathMode m) {
        m_linear1.set_math(m);
        m_linear2.set_math(m);
    }

private:
    ActConfig m_cfg{};
    MultiheadAttention<B> m_self, m_cross;
    Linear<B> m_linear1, m_linear2;
    LayerNorm<B> m_norm1, m_norm2, m_norm3;
};

}  // namespace flowedge
