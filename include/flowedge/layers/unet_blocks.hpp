// The building blocks of LeRobot's conditional 1-D U-Net (DiffusionConv1dBlock, DiffusionConditionalResidualBlock1d).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "flowedge/layers/conv1d.hpp"
#include "flowedge/layers/group_norm.hpp"
#include "flowedge/layers/linear.hpp"

namespace flowedge {

/// LeRobot DiffusionConv1dBlock: Conv1d(in, out, k, padding k//2) -> GroupNorm(groups, out) -> Mish,
/// executed as one conv1d_group_norm op (the norm's epilogue may add FiLM and a residual after Mish).
/// x: [batch, in, length] -> y: [batch, out, length]. State-dict names: block.0.{weight,bias}, block.1.{weight,bias}.
template <Backend B>
class Conv1dBlock {
public:
    struct Config {
        int in = 0;
        int out = 0;
        int kernel = 5;
        int groups = 8;
    };

    Conv1dBlock() = default;
    explicit Conv1dBlock(Config cfg)
        : m_cfg(cfg),
          m_conv({.in = cfg.in, .out = cfg.out, .kernel = cfg.kernel, .stride = 1, .pad = cfg.kernel / 2}),
          m_norm({.channels = cfg.out, .groups = cfg.groups}) {
        check(cfg.kernel % 2 == 1, "conv1d_block", "kernel must be odd to keep the length" + expected_got("odd", cfg.kernel));
    }

    const Config& config() const { return m_cfg; }

    template <class F>
    void visit_parameters(F&& f) {
        m_conv.visit_parameters([&](const std::string& n, auto& p, const Shape& s, Storage st) { f("block.0." + n, p, s, st); });
        m_norm.visit_parameters([&](const std::string& n, auto& p, const Shape& s, Storage st) { f("block.1." + n, p, s, st); });
    }

    /// Scratch bytes forward() takes from the context's workspace.
    static std::size_t workspace_bytes(const Config& cfg, int batch, int length) {
        return Workspace<B>::template bytes_for<float>(std::size_t(batch) * cfg.out * length);
    }

    /// y = epi(mish(groupnorm(conv(x)))). x: [batch, in, length]; y: [batch, out, length] (must not alias x).
    void forward(Context<B>& ctx, View<const float, B> x, View<float, B> y, GroupNormEpilogue epi = {}) const {
        typename Workspace<B>::Mark mark(*ctx.workspace);
        const Shape s{x.dim(0), m_cfg.out, x.dim(2)};
        check_shape(y, s, "conv1d_block", "output");
        View<float, B> h = ctx.workspace->template take<float>(s);  // the raw conv output (params() checks x)
        Conv1dGroupNormParams q;
        q.norm = m_norm.params(int(x.dim(0)), int(x.dim(2)), with_mish(epi));
        q.norm.x = h.data;
        q.norm.y = y.data;
        m_conv.launch(ctx, m_conv.params(ctx, x, h), [&](const Conv1dParams& c) {
            q.conv = c;
            Ops<B>::conv1d_group_norm(q, ctx.stream);
        });
    }

    std::int64_t n_parameters() const { return m_conv.n_parameters() + m_norm.n_parameters(); }

private:
    /// The block's activation (LeRobot's Conv1dBlock ends in Mish) on the caller's epilogue.
    static GroupNormEpilogue with_mish(GroupNormEpilogue epi) {
        epi.act = Activation::Mish;
        return epi;
    }

    Config m_cfg{};
    Conv1d<B> m_conv;
    GroupNorm<B> m_norm;
};

/// LeRobot DiffusionConditionalResidualBlock1d with FiLM scale modulation:
///   a = conv1(x); [scale | bias] = cond_encoder(g) (Linear(cond_dim, 2*out) on an already-Mish'ed g);
///   a = scale * a + bias; y = conv2(a) + (in == out ? x : residual_conv(x)).
/// The FiLM and the residual are fused into the two GroupNorm epilogues.
/// x: [batch, in, length]; g: [batch, cond_dim] = mish([step embedding | global cond]); y: [batch, out, length].
/// State-dict names: conv1.block.{0,1}.*, cond_encoder.1.*, conv2.block.{0,1}.*, residual_conv.* (when in != out).
template <Backend B>
class ConditionalResidualBlock1d {
public:
    struct Config {
        int in = 0;
        int out = 0;
        int cond_dim = 0;
        int kernel = 5;
        int groups = 8;
    };

    ConditionalResidualBlock1d() = default;
    explicit ConditionalResidualBlock1d(Config cfg)
        : m_cfg(cfg),
          m_conv1({.in = cfg.in, .out = cfg.out, .kernel = cfg.kernel, .groups = cfg.groups}),
          m_film({.in = cfg.cond_dim, .out = 2 * cfg.out, .bias = true, .streamed = true}),
          m_conv2({.in = cfg.out, .out = cfg.out, .kernel = cfg.kernel, .groups = cfg.groups}) {
        check(cfg.cond_dim > 0, "residual_block", "cond_dim must be positive" + expected_got("> 0", cfg.cond_dim));
        if (cfg.in != cfg.out) m_residual.emplace(typename Conv1d<B>::Config{.in = cfg.in, .out = cfg.out, .kernel = 1});
    }

    const Config& config() const { return m_cfg; }

    template <class F>
    void visit_parameters(F&& f) {
        m_conv1.visit_parameters([&](const std::string& n, auto& p, const Shape& s, Storage st) { f("conv1." + n, p, s, st); });
        m_film.visit_parameters([&](const std::string& n, auto& p, const Shape& s, Storage st) { f("cond_encoder.1." + n, p, s, st); });
        m_conv2.visit_parameters([&](const std::string& n, auto& p, const Shape& s, Storage st) { f("conv2." + n, p, s, st); });
        if (m_residual)
            m_residual->visit_parameters([&](const std::string& n, auto& p, const Shape& s, Storage st) { f("residual_conv." + n, p, s, st); });
    }

    /// Bytes of this block's FiLM vector [batch, 2*out] in a workspace.
    static std::size_t film_bytes(const Config& cfg, int batch) {
        return Workspace<B>::template bytes_for<float>(std::size_t(batch) * 2 * cfg.out);
    }

    /// Scratch bytes forward_with_film() takes from the context's workspace.
    static std::size_t workspace_bytes_given_film(const Config& cfg, int batch, int length) {
        const std::size_t act = Workspace<B>::template bytes_for<float>(std::size_t(batch) * cfg.out * length);
        return act /* conv1's block output */ + (cfg.in != cfg.out ? act : 0) /* residual conv */ +
               Conv1dBlock<B>::workspace_bytes({.in = cfg.in, .out = cfg.out, .kernel = cfg.kernel, .groups = cfg.groups}, batch, length);
    }

    /// Scratch bytes forward() takes from the context's workspace (the FiLM vector plus forward_with_film's).
    static std::size_t workspace_bytes(const Config& cfg, int batch, int length) {
        return film_bytes(cfg, batch) + workspace_bytes_given_film(cfg, batch, length);
    }

    /// The cond_encoder linear as op parameters: film[b, :] = g[b, :] @ W^T + bias, without running it, so a caller
    /// can compute the FiLM vectors of many blocks in one Ops<B>::linear_batch.
    /// g: [batch, cond_dim] (Mish already applied); film: [batch, 2*out] = [scale | bias].
    LinearParams film_params(const float* g, float* film, int batch) const { return m_film.params(g, film, batch); }

    /// y = block(x, g), computing the FiLM vector itself. x: [batch, in, length]; g: [batch, cond_dim] (Mish already
    /// applied); y: [batch, out, length], must not alias x.
    void forward(Context<B>& ctx, View<const float, B> x, View<const float, B> g, View<float, B> y) const {
        const std::int64_t batch = x.dim(0);
        check_shape(g, Shape{batch, m_cfg.cond_dim}, "residual_block", "condition");
        typename Workspace<B>::Mark mark(*ctx.workspace);
        View<float, B> film = ctx.workspace->template take<float>(Shape{batch, 2 * m_cfg.out});
        m_film.forward(ctx, g.data, film.data, int(batch));
        forward_with_film(ctx, x, film, y);
    }

    /// y = block(x) given the precomputed FiLM vector (cond_encoder(g), see film_params), or its two parts.
    /// x: [batch, in, length]; film: [batch, 2*out] = [scale | bias], plus film_shared [2*out] in every batch row when
    /// set (GroupNormParams::film_shared); y: [batch, out, length], must not alias x.
    void forward_with_film(Context<B>& ctx, View<const float, B> x, View<const float, B> film, View<float, B> y,
                           const float* film_shared = nullptr) const {
        const std::int64_t batch = x.dim(0), len = x.dim(2);
        check_shape(film, Shape{batch, 2 * m_cfg.out}, "residual_block", "FiLM vector");
        check(x.data != y.data, "residual_block", "output aliases the input");
        typename Workspace<B>::Mark mark(*ctx.workspace);
        Workspace<B>& ws = *ctx.workspace;
        const float* residual = x.data;
        if (m_residual) {
            View<float, B> r = ws.template take<float>(Shape{batch, m_cfg.out, len});
            m_residual->forward(ctx, x, r);
            residual = r.data;
        } else {
            check_shape(x, Shape{batch, m_cfg.out, len}, "residual_block", "identity residual");
        }
        View<float, B> a = ws.template take<float>(Shape{batch, m_cfg.out, len});
        m_conv1.forward(ctx, x, a, {.film = film.data, .film_stride = 2 * m_cfg.out, .film_shared = film_shared});
        m_conv2.forward(ctx, a, y, {.residual = residual});
    }

    std::int64_t n_parameters() const {
        return m_conv1.n_parameters() + m_film.n_parameters() + m_conv2.n_parameters() +
               (m_residual ? m_residual->n_parameters() : 0);
    }

private:
    Config m_cfg{};
    Conv1dBlock<B> m_conv1;
    Linear<B> m_film;
    Conv1dBlock<B> m_conv2;
    std::optional<Conv1d<B>> m_residual;
};

}  // namespace flowedge
