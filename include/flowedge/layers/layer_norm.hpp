// torch.nn.LayerNorm over the last dimension, with the residual add of a post-norm transformer block fused in.
#pragma once
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// torch.nn.LayerNorm(dim, eps) (elementwise affine): y[r, :] = (t - mean(t)) / sqrt(var(t) + eps) * weight + bias
/// with t = x[r, :] (+ residual[r, :]). x, residual, y: [rows, dim]; weight, bias: [dim].
template <Backend B>
class LayerNorm {
public:
    struct Config {
        int dim = 0;
        float eps = 1e-5f;
    };

    LayerNorm() = default;
    explicit LayerNorm(Config cfg) : m_cfg(cfg) {}

    const Config& config() const { return m_cfg; }

    /// Lists ("weight", [dim]) and ("bias", [dim]) as in the PyTorch state dict.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.dim}, Storage::Vector);
        f("bias", m_bias, Shape{m_cfg.dim}, Storage::Vector);
    }

    /// y = layer_norm(x + residual) for `rows` rows (residual may be null; y may equal x or residual).
    void forward(Context<B>& ctx, const float* x, const float* residual, float* y, int rows) const {
        LayerNormParams p;
        p.x = x;
        p.residual = residual;
        p.gamma = m_weight.f32();
        p.beta = m_bias.f32();
        p.y = y;
        p.rows = rows;
        p.dim = m_cfg.dim;
        p.eps = m_cfg.eps;
        Ops<B>::layer_norm(p, ctx.stream);
    }

    std::int64_t n_parameters() const { return 2 * std::int64_t(m_cfg.dim); }

private:
    Config m_cfg{};
    Parameter<B> m_weight, m_bias;
};

}  // namespace flowedge
