// One Mamba-1 mixer (in_proj -> causal conv -> x_proj/dt_proj -> selective scan -> gate -> out_proj),
// written once over Ops<B>; prefill and streaming decode are the same code with a different length.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "flowedge/workspace.hpp"  // before linear.hpp, which uses Context<B>
#include "flowedge/layers/linear.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"

namespace flowedge {

/// transformers MambaMixer (the slow path, identical math): for n: [L, d_model] and a running state,
/// h += out_proj((scan(u, dt, B, C) + D*u) * silu(z)), with xz = in_proj(n), u = silu(conv(x)), docs/models.md#mamba-layer.
/// Per-sequence state: conv [d_conv-1, d_inner] (last raw x rows, oldest first) and ssm [d_inner, d_state].
template <Backend B>
class MambaMixer {
public:
    struct Config {
        int d_model = 0;
        int d_inner = 0;
        int d_state = 0;
        int d_conv = 4;
        int dt_rank = 0;
    };

    MambaMixer() = default;
    explicit MambaMixer(Config cfg)
        : m_cfg(cfg),
          m_in_proj({.in = cfg.d_model, .out = 2 * cfg.d_inner, .bias = false, .small_rows = true}),
          m_x_proj({.in = cfg.d_inner, .out = cfg.dt_rank + 2 * cfg.d_state, .bias = false, .small_rows = true}),
          m_dt_proj({.in = cfg.dt_rank, .out = cfg.d_inner, .bias = true, .small_rows = true}),
          m_out_proj({.in = cfg.d_inner, .out = cfg.d_model, .bias = false, .small_rows = true}) {}

    const Config& config() const { return m_cfg; }

    /// Floats of per-sequence state: conv rows then the ssm matrix.
    std::size_t state_floats() const { return conv_state_floats() + ssm_state_floats(); }
    std::size_t conv_state_floats() const { return std::size_t(m_cfg.d_conv - 1) * m_cfg.d_inner; }
    std::size_t ssm_state_floats() const { return std::size_t(m_cfg.d_inner) * m_cfg.d_state; }

    /// Scratch bytes forward() takes from the workspace for up to `max_tokens` tokens.
    std::size_t workspace_bytes(int max_tokens) const {
        const std::size_t L = std::size_t(max_tokens);
        const int di = m_cfg.d_inner;
        return Workspace<B>::template bytes_for<float>(L * 2 * di)                                   // xz
               + Workspace<B>::template bytes_for<float>(L * di)                                     // u
               + Workspace<B>::template bytes_for<float>(L * (m_cfg.dt_rank + 2 * m_cfg.d_state))  // dt_low|B|C
               + Workspace<B>::template bytes_for<float>(L * di)                                     // dt
               + Workspace<B>::template bytes_for<float>(L * di);                                    // y
    }

    /// Lists the PyTorch state-dict names: in_proj.weight [2*di, dm], conv1d.weight [di, 1, K], conv1d.bias [di],
    /// x_proj.weight [R+2S, di], dt_proj.weight [di, R], dt_proj.bias [di], A_log [di, S], D [di], out_proj.weight [dm, di].
    template <class F>
    void visit_parameters(F&& f) {
        auto sub = [&](const char* prefix) {
            return [&f, prefix](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) {
                f(std::string(prefix) + n, p, s, st);
            };
        };
        m_in_proj.visit_parameters(sub("in_proj."));
        f("conv1d.weight", m_conv_w, Shape{m_cfg.d_inner, 1, m_cfg.d_conv}, Storage::Vector);
        f("conv1d.bias", m_conv_b, Shape{m_cfg.d_inner}, Storage::Vector);
        m_x_proj.visit_parameters(sub("x_proj."));
        m_dt_proj.visit_parameters(sub("dt_proj."));
        f("A_log", m_A_log, Shape{m_cfg.d_inner, m_cfg.d_state}, Storage::Vector);
        f("D", m_D, Shape{m_cfg.d_inner}, Storage::Vector);
        m_out_proj.visit_parameters(sub("out_proj."));
    }

    /// Binds every tensor under `prefix` (e.g. "backbone.layers.0.mixer.") and precomputes A = -exp(A_log).
    void load(const std::shared_ptr<const io::SafeTensors>& file, const std::string& prefix, const LoadOptions& opts) {
        bind_parameters<B>(*this, file, prefix, opts, "mamba");
        const io::TensorInfo* t = file->find(prefix + "A_log");
        const std::size_t n = ssm_state_floats();
        std::vector<float> a(n);
        Parameter<B>::convert(t->data, t->dtype, a.data(), DType::F32, n);
        for (std::size_t i = 0; i < n; ++i) {
            if (!std::isfinite(a[i]))
                fail(ErrorKind::BadFile, "mamba", "tensor '" + prefix + "A_log' has a non-finite value at index " + std::to_string(i));
            a[i] = -std::exp(a[i]);
        }
        m_A.assign_f32(a, Shape{m_cfg.d_inner, m_cfg.d_state});
    }

    /// Readies the projections' prepared weights for arithmetic m (Linear::set_math); no allocation.
    void set_math(MathMode m) {
        for (Linear<B>* l : {&m_in_proj, &m_x_proj, &m_dt_proj, &m_out_proj}) l->set_math(m);
    }
    /// Bytes of the projections' prepared weights (the backend's small-row copies; 0 when none).
    std::size_t prepared_bytes() const {
        return m_in_proj.prepared_bytes() + m_x_proj.prepared_bytes() + m_dt_proj.prepared_bytes() + m_out_proj.prepared_bytes();
    }

    /// h[t, :] += mixer(n)[t, :] for `length` tokens, continuing from conv_state/ssm_state (zero them for a
    /// fresh sequence). n, h: [length, d_model] on B; conv_state: [d_conv-1, d_inner]; ssm_state: [d_inner, d_state].
    /// out_from > 0: only rows t >= out_from of h get the residual (the scan's output and out_proj are computed for
    /// those rows only; the states still advance over every token), for callers that need just the last rows.
    /// The tensors for a backend's fused action (MambaFlowActParams) with this layer's state buffers, and in `vec`
    /// (bits 0..3: in_proj, x_proj, dt_proj, out_proj) whether the single linear op takes its 16-byte vector path
    /// for each product as forward() calls it (x rows in 256-byte aligned workspace slices). False, leaving `t`
    /// unspecified, when a tensor is not stored as F32 (the fused op reads F32 only).
    bool fused_tensors(MambaLayerTensors& t, unsigned& vec, float* conv_state, float* ssm_state) const {
        auto f32 = [](const Parameter<B>& q) { return q.dtype() == DType::F32 ? static_cast<const float*>(q.ref().data) : nullptr; };
        t.in_proj = f32(m_in_proj.weight());
        t.conv_w = f32(m_conv_w);
        t.conv_b = m_conv_b.dtype() == DType::F32 ? m_conv_b.f32() : nullptr;
        t.x_proj = f32(m_x_proj.weight());
        t.dt_proj = f32(m_dt_proj.weight());
        t.dt_bias = f32(m_dt_proj.bias());
        t.A = m_A.f32();
        t.D = f32(m_D);
        t.out_proj = f32(m_out_proj.weight());
        t.conv_state = conv_state;
        t.ssm_state = ssm_state;
        if (!(t.in_proj && t.conv_w && t.conv_b && t.x_proj && t.dt_proj && t.dt_bias && t.D && t.out_proj)) return false;
        const int di = m_cfg.d_inner, R = m_cfg.dt_rank, ld_dbl = R + 2 * m_cfg.d_state;
        // forward()'s x rows are workspace slices (256-byte aligned): an aligned stand-in gives the same choice.
        alignas(16) const float x[4] = {};
        vec = unsigned(linear_f32_vector_path(t.in_proj, x, m_cfg.d_model)) |
              unsigned(linear_f32_vector_path(t.x_proj, x, di)) << 1 |
              unsigned(linear_f32_vector_path(t.dt_proj, x, R, ld_dbl)) << 2 |
              unsigned(linear_f32_vector_path(t.out_proj, x, di)) << 3;
        return true;
    }

    void forward(Context<B>& ctx, const float* n, float* h, int length, float* conv_state, float* ssm_state,
                 int out_from = 0) const {
        typename Workspace<B>::Mark mark(*ctx.workspace);
        const int di = m_cfg.d_inner, S = m_cfg.d_state, R = m_cfg.dt_rank, ld_dbl = R + 2 * S;
        float* xz = ctx.workspace->template take<float>(Shape{length, 2 * di}).data;
        float* u = ctx.workspace->template take<float>(Shape{length, di}).data;
        float* dbl = ctx.workspace->template take<float>(Shape{length, ld_dbl}).data;
        float* dt = ctx.workspace->template take<float>(Shape{length, di}).data;
        float* y = ctx.workspace->template take<float>(Shape{length, di}).data;

        m_in_proj.forward(ctx, n, xz, length);  // [L, 2*di]: x | z

        CausalConvParams cp;
        cp.x = xz;
        cp.ld_x = 2 * di;
        cp.w = m_conv_w.ref();
        cp.bias = m_conv_b.f32();
        cp.state = conv_state;
        cp.u = u;
        cp.length = length;
        cp.channels = di;
        cp.kernel = m_cfg.d_conv;
        Ops<B>::causal_conv(cp, ctx.stream);

        m_x_proj.forward(ctx, u, dbl, length);                                    // [L, R | S | S]
        // dt = softplus(dt_low W^T + b): the CPU scan applies the softplus as it reads dt (one pass fewer).
        constexpr bool kScanSoftplus = std::is_same_v<B, Cpu>;
        m_dt_proj.forward(ctx, dbl, dt, length, kScanSoftplus ? Activation::None : Activation::Softplus, false, ld_dbl);

        SelectiveScanParams sp;
        sp.u = u;
        sp.dt = dt;
        sp.A = m_A.f32();
        sp.B = dbl + R;
        sp.C = dbl + R + S;
        sp.ld_bc = ld_dbl;
        sp.D = m_D.f32();
        sp.z = xz + di;
        sp.ld_z = 2 * di;
        sp.state = ssm_state;
        sp.y = y;
        sp.length = length;
        sp.channels = di;
        sp.d_state = S;
        sp.dt_softplus = kScanSoftplus;
        sp.y_from = out_from;
        Ops<B>::selective_scan(sp, ctx.stream);

        const std::size_t skip = std::size_t(out_from);
        m_out_proj.forward(ctx, y + skip * di, h + skip * m_cfg.d_model, length - out_from, Activation::None,
                           /*accumulate=*/true);  // residual add
    }

private:
    Config m_cfg{};
    Linear<B> m_in_proj, m_x_proj, m_dt_proj, m_out_proj;
    Parameter<B> m_conv_w, m_conv_b, m_A_log, m_D, m_A;
};

}  // namespace flowedge
