// RMSNorm as used by Mamba (MambaRMSNorm): one learned scale per feature, statistics in float32.
#pragma once
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// transformers MambaRMSNorm(dim, eps): y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight.
/// x, y: [rows, dim]; weight: [dim].
template <Backend B>
class RmsNorm {
public:
    struct Config {
        int dim = 0;
        float eps = 1e-5f;
    };

    RmsNorm() = default;
    explicit RmsNorm(Config cfg) : m_cfg(cfg) {}

    const Config& config() const { return m_cfg; }

    /// Lists ("weight", [dim]) as in the PyTorch state dict.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.dim}, Storage::Vector);
    }

    /// y = rmsnorm(x) * weight for `rows` rows (x may equal y).
    void forward(Context<B>& ctx, const float* x, float* y, int rows) const {
        RmsNormParams p;
        p.x = x;
        p.weight = m_weight.f32();
        p.y = y;
        p.rows = rows;
        p.dim = m_cfg.dim;
        p.eps = m_cfg.eps;
        Ops<B>::rms_norm(p, ctx.stream);
    }

    const Parameter<B>& weight() const { return m_weight; }

private:
    Config m_cfg{};
    Parameter<B> m_weight;
};

}  // namespace flowedge
