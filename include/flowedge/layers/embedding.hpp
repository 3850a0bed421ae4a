// Token embedding table (torch.nn.Embedding); ids must be validated on the host before they reach the op.
#pragma once
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// torch.nn.Embedding(vocab, dim): y[r, :] = weight[ids[r], :]. weight: [vocab, dim]; y: [rows, dim].
template <Backend B>
class Embedding {
public:
    struct Config {
        int vocab = 0;
        int dim = 0;
    };

    Embedding() = default;
    explicit Embedding(Config cfg) : m_cfg(cfg) {}

    const Config& config() const { return m_cfg; }

    /// Lists ("weight", [vocab, dim]) as in the PyTorch state dict. Kept in its storage dtype.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.vocab, m_cfg.dim}, Storage::Matrix);
    }

    /// Gathers `rows` rows. `ids` lives on backend B and every id must already be in [0, vocab).
    void forward(Context<B>& ctx, const std::int32_t* ids, float* y, int rows) const {
        EmbeddingParams p;
        p.ids = ids;
        p.table = m_weight.ref();
        p.y = y;
        p.rows = rows;
        p.dim = m_cfg.dim;
        Ops<B>::embedding(p, ctx.stream);
    }

    const Parameter<B>& weight() const { return m_weight; }

private:
    Config m_cfg{};
    Parameter<B> m_weight;
};

}  // namespace flowedge
