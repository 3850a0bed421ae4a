// torch.nn.Conv1d on any backend: weight kept in its storage dtype, shapes checked, compute in Ops<B>.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "flowedge/layers/conv1d_params.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// torch.nn.Conv1d(in, out, kernel, stride, padding, bias=True), groups 1, dilation 1, zero padding.
/// x: [batch, in, in_length] -> y: [batch, out, out_length], out_length = (in_length + 2*pad - kernel)/stride + 1;
/// weight: [out, in, kernel]; bias: [out].
template <Backend B>
class Conv1d {
public:
    struct Config {
        int in = 0;
        int out = 0;
        int kernel = 1;
        int stride = 1;
        int pad = 0;
        bool bias = true;
    };

    Conv1d() = default;
    explicit Conv1d(Config cfg) : m_cfg(cfg) {
        check(cfg.in > 0 && cfg.out > 0 && cfg.kernel > 0 && cfg.stride > 0 && cfg.pad >= 0, "conv1d",
              "invalid config (in " + std::to_string(cfg.in) + ", out " + std::to_string(cfg.out) + ", kernel " +
                  std::to_string(cfg.kernel) + ", stride " + std::to_string(cfg.stride) + ", pad " +
                  std::to_string(cfg.pad) + ")");
    }

    const Config& config() const { return m_cfg; }

    /// Output length for an input of `in_length` columns.
    int out_length(int in_length) const { return out_length(m_cfg, in_length); }
    static int out_length(const Config& c, int in_length) { return (in_length + 2 * c.pad - c.kernel) / c.stride + 1; }

    /// Lists ("weight", [out, in, kernel]) and ("bias", [out]) as in the PyTorch state dict.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.out, m_cfg.in, m_cfg.kernel}, Storage::ConvWeight);
        if (m_cfg.bias) f("bias", m_bias, Shape{m_cfg.out}, Storage::Vector);
    }

    /// y = conv1d(x). x: [batch, in, in_length]; y: [batch, out, out_length(in_length)]. Uses ctx.math (MathMode).
    void forward(Context<B>& ctx, View<const float, B> x, View<float, B> y) const {
        launch(ctx, params(ctx, x, y), [&](const Conv1dParams& p) { Ops<B>::conv1d(p, ctx.stream); });
    }

    /// The op's parameters for y = conv1d(x) under ctx's math, shapes checked (no scratch: launch() adds it).
    Conv1dParams params(const Context<B>& ctx, View<const float, B> x, View<float, B> y) const {
        if (!(x.shape.rank == 3)) [[unlikely]] fail(ErrorKind::BadShape, "conv1d", "input must be [batch, channels, length]" + expected_got(3, x.shape.rank));
        const int batch = int(x.dim(0)), len = int(x.dim(2));
        check_shape(x, Shape{batch, m_cfg.in, len}, "conv1d", "input");
        if (!(out_length(len) > 0)) [[unlikely]] fail("conv1d", "input too short" + expected_got(">= " + std::to_string(m_cfg.kernel - 2 * m_cfg.pad), len));
        check_shape(y, Shape{batch, m_cfg.out, out_length(len)}, "conv1d", "output");
        auto p = detail::conv1d_geometry<Conv1dParams>(m_cfg, batch, len, out_length(len));
        p.x = x.data;
        p.w = m_weight.ref();
        p.bias = m_cfg.bias ? m_bias.f32() : nullptr;
        p.y = y.data;
        p.math = ctx.math;
        p.f32_gemm = ctx.f32_gemm;
        return p;
    }

    /// Runs op(p) (an Ops<B> call taking Conv1dParams) with backend scratch attached where a library GEMM path may
    /// want it (CUDA: cuBLASLt panel + output; Context::with_gemm_scratch).
    template <class Op>
    void launch(Context<B>& ctx, const Conv1dParams& p, Op&& op) const {
        ctx.with_gemm_scratch(p, [&] { return Ops<B>::conv1d_scratch_bytes(p); }, op);
    }

    /// Backend scratch a forward() of config c over `batch` x `in_length` may take for a library GEMM path (non-F32
    /// MathMode or Context::f32_gemm; 0 on the CPU); models add the largest to their workspace at load.
    static std::size_t scratch_bytes(const Config& c, int batch, int in_length) {
        const auto p = detail::conv1d_geometry<Conv1dParams>(c, batch, in_length, out_length(c, in_length));
        return p.out_length > 0 ? Ops<B>::conv1d_scratch_bytes(p) : 0;
    }

    const Parameter<B>& weight() const { return m_weight; }
    const Parameter<B>& bias() const { return m_bias; }
    std::int64_t n_parameters() const {
        return std::int64_t(m_cfg.out) * m_cfg.in * m_cfg.kernel + (m_cfg.bias ? m_cfg.out : 0);
    }

private:
    Config m_cfg{};
    Parameter<B> m_weight;
    Parameter<B> m_bias;
};

}  // namespace flowedge
