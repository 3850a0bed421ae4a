// torch.nn.Linear on any backend: the weight keeps its storage dtype and is widened on the fly; the backend may
// prepare its own layout at load from what the config says the weight is for (weights.hpp).
#pragma once
#include <string>

#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// torch.nn.Linear(in, out, bias): y = act(x @ weight^T + bias).
/// x: [rows, in] (row stride ld_x), y: [rows, out] (row stride ld_y); weight: [out, in]; bias: [out].
template <Backend B>
class Linear {
public:
    struct Config {
        int in = 0;
        int out = 0;
        bool bias = true;
        /// Storage::StreamedMatrix: run at a row or two on weights that come from DRAM every call (the backend may
        /// lay them out for streaming; forward() then needs contiguous rows and no accumulate).
        bool streamed = false;
        /// Storage::SmallRowsMatrix: run at a few rows per call on weights that stay in cache (decode, flow solves,
        /// short prefills; the backend may keep a copy laid out for that beside the stored weight).
        bool small_rows = false;
        /// Storage::ManyRowsMatrix: run at many rows per call (ACT's tokens and queries; the backend may keep a copy
        /// laid out for its GEMM beside the stored weight).
        bool many_rows = false;
    };

    Linear() = default;
    explicit Linear(Config cfg) : m_cfg(cfg) {}

    const Config& config() const { return m_cfg; }

    /// Lists ("weight", [out, in]) and ("bias", [out]) as in the PyTorch state dict.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.out, m_cfg.in},
          m_cfg.streamed     ? Storage::StreamedMatrix
          : m_cfg.small_rows ? Storage::SmallRowsMatrix
          : m_cfg.many_rows  ? Storage::ManyRowsMatrix
                             : Storage::Matrix);
        if (m_cfg.bias) f("bias", m_bias, Shape{m_cfg.out}, Storage::Vector);
    }

    /// The op parameters of forward(x, y, rows, ...) without running it (e.g. to gather several linears into one
    /// Ops<B>::linear_batch). x: [rows, in] (row stride ld_x, 0 = in); y: [rows, out] (row stride ld_y, 0 = out).
    LinearParams params(const float* x, float* y, int rows, Activation act = Activation::None, bool accumulate = false,
                        int ld_x = 0, int ld_y = 0) const {
        LinearParams p;
        p.x = x;
        p.w = m_weight.ref();
        p.bias = m_cfg.bias ? m_bias.f32() : nullptr;
        p.y = y;
        p.rows = rows;
        p.in = m_cfg.in;
        p.out = m_cfg.out;
        p.ld_x = ld_x;
        p.ld_y = ld_y;
        p.act = act;
        p.accumulate = accumulate;
        return p;
    }

    /// y[r, :] = act(x[r, :] @ weight^T + bias) (+ y[r, :] when accumulate) for `rows` rows, at ctx.math.
    void forward(Context<B>& ctx, const float* x, float* y, int rows, Activation act = Activation::None,
                 bool accumulate = false, int ld_x = 0, int ld_y = 0) const {
        LinearParams p = params(x, y, rows, act, accumulate, ld_x, ld_y);
        p.math = ctx.math;
        p.f32_gemm = ctx.f32_gemm;
        Ops<B>::linear(p, ctx.stream);
    }

    /// Readies the weight's prepared form for arithmetic m (Parameter::set_math); no allocation.
    void set_math(MathMode m) { m_weight.set_math(m); }
    /// Bytes of the backend's prepared form of the weight (0 when none).
    std::size_t prepared_bytes() const { return m_weight.prepared_bytes(); }

    const Parameter<B>& weight() const { return m_weight; }
    const Parameter<B>& bias() const { return m_bias; }  ///< unbound (null data) without Config::bias
    std::int64_t n_parameters() const { return std::int64_t(m_cfg.in) * m_cfg.out + (m_cfg.bias ? m_cfg.out : 0); }

private:
    Config m_cfg{};
    Parameter<B> m_weight;
    Parameter<B> m_bias;
};

}  // namespace flowedge
