// torch.nn.GroupNorm on any backend, with the fused activation / FiLM / residual epilogue of GroupNormParams.
#pragma once
#include <cstdint>
#include <string>

#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// Optional epilogue fused after a GroupNorm (order: activation, FiLM, residual, post-activation; see GroupNormParams).
struct GroupNormEpilogue {
    Activation act = Activation::None;
    /// FiLM [batch, 2*channels] (scale | bias, plain scale) with row stride film_stride (0 = 2*channels), or null.
    const float* film = nullptr;
    int film_stride = 0;
    /// [2*channels] added to every batch row of film (GroupNormParams::film_shared), or null.
    const float* film_shared = nullptr;
    /// Residual [batch, channels, length] added after the activation and FiLM, or null.
    const float* residual = nullptr;
    /// Activation applied last, after the residual (a ResNet BasicBlock's relu(bn2(x) + identity)).
    Activation post_act = Activation::None;
};

/// torch.nn.GroupNorm(groups, channels, eps, affine=True) on x: [batch, channels, length] (biased variance),
/// followed by the optional epilogue. weight/bias: [channels].
template <Backend B>
class GroupNorm {
public:
    struct Config {
        int channels = 0;
        int groups = 1;
        float eps = 1e-5f;
    };

    GroupNorm() = default;
    explicit GroupNorm(Config cfg) : m_cfg(cfg) {
        check(cfg.channels > 0 && cfg.groups > 0 && cfg.channels % cfg.groups == 0, "group_norm",
              "channels must be a positive multiple of groups" +
                  expected_got("multiple of " + std::to_string(cfg.groups), cfg.channels));
    }

    const Config& config() const { return m_cfg; }

    /// Lists ("weight", [channels]) and ("bias", [channels]) as in the PyTorch state dict.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.channels}, Storage::Vector);
        f("bias", m_bias, Shape{m_cfg.channels}, Storage::Vector);
    }

    /// y = epilogue(groupnorm(x)). x, y: [batch, channels, length] (y may not alias x or residual).
    void forward(Context<B>& ctx, View<const float, B> x, View<float, B> y, const GroupNormEpilogue& epi = {}) const {
        if (!(x.shape.rank == 3)) [[unlikely]] fail(ErrorKind::BadShape, "group_norm", "input must be [batch, channels, length]" + expected_got(3, x.shape.rank));
        const int batch = int(x.dim(0)), len = int(x.dim(2));
        check_shape(x, Shape{batch, m_cfg.channels, len}, "group_norm", "input");
        check_shape(y, Shape{batch, m_cfg.channels, len}, "group_norm", "output");
        GroupNormParams p = params(batch, len, epi);
        p.x = x.data;
        p.y = y.data;
        Ops<B>::group_norm(p, ctx.stream);
    }

    /// The op's parameters for `batch` rows of `len` positions with the epilogue `epi` (x and y unset).
    GroupNormParams params(int batch, int len, const GroupNormEpilogue& epi) const {
        GroupNormParams p;
        p.gamma = m_weight.f32();
        p.beta = m_bias.f32();
        p.batch = batch;
        p.channels = m_cfg.channels;
        p.length = len;
        p.groups = m_cfg.groups;
        p.eps = m_cfg.eps;
        p.act = epi.act;
        p.film = epi.film;
        p.film_stride = epi.film_stride;
        p.film_shared = epi.film_shared;
        p.residual = epi.residual;
        p.post_act = epi.post_act;
        return p;
    }

    std::int64_t n_parameters() const { return 2 * std::int64_t(m_cfg.channels); }

private:
    Config m_cfg{};
    Parameter<B> m_weight;
    Parameter<B> m_bias;
};

}  // namespace flowedge
