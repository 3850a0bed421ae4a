// torch.nn.ConvTranspose1d on any backend (the Diffusion Policy U-Net's 2x upsampler).
#pragma once
#include <cstdint>
#include <string>

#include "flowedge/layers/conv1d_params.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// torch.nn.ConvTranspose1d(in, out, kernel, stride, padding, bias=True), groups 1, dilation 1, output_padding 0.
/// x: [batch, in, in_length] -> y: [batch, out, (in_length - 1)*stride - 2*pad + kernel];
/// weight: [in, out, kernel] (PyTorch's transposed layout); bias: [out].
template <Backend B>
class ConvTranspose1d {
public:
    struct Config {
        int in = 0;
        int out = 0;
        int kernel = 4;
        int stride = 2;
        int pad = 1;
        bool bias = true;
    };

    ConvTranspose1d() = default;
    explicit ConvTranspose1d(Config cfg) : m_cfg(cfg) {
        check(cfg.in > 0 && cfg.out > 0 && cfg.kernel > 0 && cfg.stride > 0 && cfg.pad >= 0, "conv_transpose1d",
              "invalid config (in " + std::to_string(cfg.in) + ", out " + std::to_string(cfg.out) + ", kernel " +
                  std::to_string(cfg.kernel) + ")");
    }

    const Config& config() const { return m_cfg; }

    /// Output length for an input of `in_length` columns.
    int out_length(int in_length) const { return out_length(m_cfg, in_length); }
    static int out_length(const Config& c, int in_length) { return (in_length - 1) * c.stride - 2 * c.pad + c.kernel; }

    /// Lists ("weight", [in, out, kernel]) and ("bias", [out]) as in the PyTorch state dict.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.in, m_cfg.out, m_cfg.kernel}, Storage::ConvTransposeWeight);
        if (m_cfg.bias) f("bias", m_bias, Shape{m_cfg.out}, Storage::Vector);
    }

    /// y = conv_transpose1d(x). x: [batch, in, in_length]; y: [batch, out, out_length(in_length)]. Uses ctx.math and
    /// ctx.f32_gemm (a batched call may run as a library GEMM on CUDA).
    void forward(Context<B>& ctx, View<const float, B> x, View<float, B> y) const {
        if (!(x.shape.rank == 3)) [[unlikely]] fail(ErrorKind::BadShape, "conv_transpose1d",
              "input must be [batch, channels, length]" + expected_got(3, x.shape.rank));
        const int batch = int(x.dim(0)), len = int(x.dim(2));
        check_shape(x, Shape{batch, m_cfg.in, len}, "conv_transpose1d", "input");
        if (!(len > 0 && out_length(len) > 0)) [[unlikely]] fail("conv_transpose1d", "empty input or output" + expected_got("> 0", len));
        check_shape(y, Shape{batch, m_cfg.out, out_length(len)}, "conv_transpose1d", "output");
        auto p = detail::conv1d_geometry<ConvTranspose1dParams>(m_cfg, batch, len, out_length(len));
        p.x = x.data;
        p.w = m_weight.ref();
        p.bias = m_cfg.bias ? m_bias.f32() : nullptr;
        p.y = y.data;
        p.math = ctx.math;
        p.f32_gemm = ctx.f32_gemm;
        ctx.with_gemm_scratch(p, [&] { return Ops<B>::conv_transpose1d_scratch_bytes(p); },
                              [&](const ConvTranspose1dParams& q) { Ops<B>::conv_transpose1d(q, ctx.stream); });
    }

    /// Backend scratch a forward() over `batch` x `in_length` may take for a library GEMM path (as
    /// Conv1d::scratch_bytes; 0 on the CPU); models add the largest to their workspace at load.
    static std::size_t scratch_bytes(const Config& c, int batch, int in_length) {
        const auto p = detail::conv1d_geometry<ConvTranspose1dParams>(c, batch, in_length, out_length(c, in_length));
        return p.out_length > 0 ? Ops<B>::conv_transpose1d_scratch_bytes(p) : 0;
    }

    const Parameter<B>& weight() const { return m_weight; }
    std::int64_t n_parameters() const {
        return std::int64_t(m_cfg.in) * m_cfg.out * m_cfg.kernel + (m_cfg.bias ? m_cfg.out : 0);
    }

private:
    Config m_cfg{};
    Parameter<B> m_weight;
    Parameter<B> m_bias;
};

}  // namespace flowedge
