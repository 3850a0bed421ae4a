// LeRobot's conditional 1-D U-Net (DiffusionConditionalUnet1d) written once over Ops<B>, in its channel-major layout.
// Its scratch size is measured by running forward()'s own walk with a WorkspaceMeter, so there is no sizing code
// to keep in step with the network.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "flowedge/layers/conv1d.hpp"
#include "flowedge/layers/conv_transpose1d.hpp"
#include "flowedge/layers/linear.hpp"
#include "flowedge/layers/unet_blocks.hpp"
#include "flowedge/models/diffusion/config.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// LeRobot DiffusionConditionalUnet1d (FiLM scale modulation on): eps = unet(x, t, global_cond), in the layout the
/// network computes in: x, eps: [batch, action_dim, horizon] (LeRobot rearranges its [batch, horizon, action_dim]
/// input to this at entry and back at exit; a sampler here keeps its state in this layout instead);
/// global_cond: [batch, global_cond_dim]. Parameter names are those under `diffusion.unet.` in LeRobot's state dict.
template <Backend B>
class ConditionalUnet1d {
public:
    using Config = DiffusionConfig;
    using ResBlock = ConditionalResidualBlock1d<B>;

    ConditionalUnet1d() = default;
    /// Builds the layer structure for `cfg` (validated); parameters stay unbound until visit_parameters binds them.
    explicit ConditionalUnet1d(const Config& cfg) : m_cfg(cfg) {
        cfg.validate();
        const int td = cfg.step_embed_dim, cd = cfg.cond_dim(), k = cfg.kernel_size, g = cfg.n_groups;
        m_te1 = Linear<B>({.in = td, .out = 4 * td});
        m_te2 = Linear<B>({.in = 4 * td, .out = td});
        // Residual blocks are kept in the order forward() runs them; stages refer to them by index.
        auto res = [&](int in, int out) {
            m_res.push_back(ResBlock({.in = in, .out = out, .cond_dim = cd, .kernel = k, .groups = g}));
            return int(m_res.size()) - 1;
        };
        const int S = cfg.stages();
        for (int s = 0; s < S; ++s) {
            const int in = s == 0 ? cfg.action_dim : cfg.down_dims[std::size_t(s - 1)];
            const int out = cfg.down_dims[std::size_t(s)];
            const int r0 = res(in, out), r1 = res(out, out);
            Down d{r0, r1, {}};
            if (s < S - 1) d.downsample.emplace(typename Conv1d<B>::Config{.in = out, .out = out, .kernel = 3, .stride = 2, .pad = 1});
            m_down.push_back(std::move(d));
        }
        const int wide = cfg.down_dims.back();
        m_mid[0] = res(wide, wide);
        m_mid[1] = res(wide, wide);
        for (int s = S - 1; s >= 1; --s) {
            const int hi = cfg.down_dims[std::size_t(s)], lo = cfg.down_dims[std::size_t(s - 1)];
            const int r0 = res(2 * hi, lo), r1 = res(lo, lo);
            m_up.push_back(Up{r0, r1, ConvTranspose1d<B>({.in = lo, .out = lo, .kernel = 4, .stride = 2, .pad = 1})});
        }
        const int d0 = cfg.down_dims[0];
        m_final_block = Conv1dBlock<B>({.in = d0, .out = d0, .kernel = k, .groups = 8});
        m_final_conv = Conv1d<B>({.in = d0, .out = cfg.action_dim, .kernel = 1});
        // The two activation buffers are as large as forward()'s largest activation, found by a measuring pass.
        WorkspaceMeter<B> meter;
        m_activation_floats = walk(meter, Pass{.batch = 1}).largest_activation;
    }

    const Config& config() const { return m_cfg; }

    /// Lists every parameter with its name under `diffusion.unet.` (e.g. "down_modules.0.0.conv1.block.0.weight").
    template <class F>
    void visit_parameters(F&& f) {
        auto sub = [&](const std::string& prefix, auto& module) {
            module.visit_parameters([&](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f(prefix + n, p, s, st); });
        };
        sub("diffusion_step_encoder.1.", m_te1);
        sub("diffusion_step_encoder.3.", m_te2);
        for (std::size_t s = 0; s < m_down.size(); ++s) {
            const std::string p = "down_modules." + std::to_string(s) + ".";
            sub(p + "0.", m_res[std::size_t(m_down[s].r0)]);
            sub(p + "1.", m_res[std::size_t(m_down[s].r1)]);
            if (m_down[s].downsample) sub(p + "2.", *m_down[s].downsample);
        }
        for (std::size_t m = 0; m < m_mid.size(); ++m) sub("mid_modules." + std::to_string(m) + ".", m_res[std::size_t(m_mid[m])]);
        for (std::size_t u = 0; u < m_up.size(); ++u) {
            const std::string p = "up_modules." + std::to_string(u) + ".";
            sub(p + "0.", m_res[std::size_t(m_up[u].r0)]);
            sub(p + "1.", m_res[std::size_t(m_up[u].r1)]);
            sub(p + "2.", m_up[u].upsample);
        }
        sub("final_conv.0.", m_final_block);
        sub("final_conv.1.", m_final_conv);
    }

    /// Number of U-Net parameters (251,511,938 for PushT).
    std::int64_t n_parameters() const {
        std::int64_t n = m_te1.n_parameters() + m_te2.n_parameters();
        for (const ResBlock& r : m_res) n += r.n_parameters();
        for (const Down& d : m_down) n += d.downsample ? d.downsample->n_parameters() : 0;
        for (const Up& u : m_up) n += u.upsample.n_parameters();
        return n + m_final_block.n_parameters() + m_final_conv.n_parameters();
    }

    /// Bytes of all bound parameters.
    std::size_t device_bytes() {
        std::size_t n = 0;
        visit_parameters([&](const std::string&, Parameter<B>& p, const Shape&, Storage) { n += p.loaded() ? p.bytes() : 0; });
        return n;
    }

    /// Most timesteps one condition() call computes FiLM rows for (it bounds the rows' scratch; a sampler with more
    /// steps conditions each run of this many steps in turn).
    static constexpr int kMaxFilmSteps = 16;

    /// Every residual block's FiLM vectors for `batch` samples over a run of `steps` timesteps, from condition().
    /// cond_encoder(mish([e(t) | cond])) is a Linear, so it splits into a part of the timestep (with the bias) and a
    /// part of the condition, which is the same at every step of a sample: block k's FiLM vector at step i is
    /// per_sample[k][b] + per_step[k][i] (added in the GroupNorm epilogue, GroupNormParams::film_shared).
    struct Conditioning {
        const float* per_sample = nullptr;  ///< block k's [batch, 2*out] at film_offset(k, batch)
        const float* per_step = nullptr;    ///< block k's [steps, 2*out] at film_offset(k, steps)
        int batch = 0, steps = 0;
    };

    /// Scratch bytes of condition() for `steps` timesteps plus forward() for `batch` samples: the code that takes them,
    /// run with a WorkspaceMeter (it counts every take and each layer's scratch, including a convolution's backend
    /// scratch under a non-F32 MathMode, and runs no op). steps = 1: what the one-call forward() takes.
    std::size_t workspace_bytes(int batch, int steps = 1) const {
        WorkspaceMeter<B> meter;
        take_conditioning(meter, CondPass{.batch = batch, .steps = steps});
        walk(meter, Pass{.batch = batch});
        return meter.peak();
    }

    /// The FiLM vectors of timesteps t0, t0 + dt, ..., t0 + (steps-1)*dt (1 <= steps <= kMaxFilmSteps) for the
    /// conditions cond: [batch, global_cond_dim], in buffers taken from ctx.workspace that the caller keeps (and
    /// returns with a Mark) while forward() uses them. Weights read once for all the steps.
    Conditioning condition(Context<B>& ctx, float t0, float dt, int steps, View<const float, B> cond) const {
        const int batch = int(cond.dim(0));
        check_shape(cond, Shape{batch, m_cfg.global_cond_dim}, "diffusion", "global condition");
        if (!(steps >= 1 && steps <= kMaxFilmSteps)) [[unlikely]]
            fail("diffusion", "FiLM steps out of range" + expected_got("1.." + std::to_string(kMaxFilmSteps), steps));
        return take_conditioning(*ctx.workspace, CondPass{.ctx = &ctx, .batch = batch, .steps = steps, .t0 = t0, .dt = dt, .cond = cond.data});
    }

    /// eps = unet(x, the timestep of row `step` of films). x, eps: [batch, action_dim, horizon] (must not alias).
    /// All scratch comes from ctx.workspace (returned on exit).
    void forward(Context<B>& ctx, View<const float, B> x, const Conditioning& films, int step, View<float, B> eps) const {
        const Config& c = m_cfg;
        const int batch = int(x.dim(0));
        check_shape(x, Shape{batch, c.action_dim, c.horizon}, "diffusion", "sample");
        check_shape(eps, Shape{batch, c.action_dim, c.horizon}, "diffusion", "epsilon");
        if (!(films.batch == batch && step >= 0 && step < films.steps)) [[unlikely]]
            fail("diffusion", "FiLM rows do not cover this call" +
                                  expected_got("batch " + std::to_string(batch) + ", step < " + std::to_string(films.steps),
                                               "batch " + std::to_string(films.batch) + ", step " + std::to_string(step)));
        typename Workspace<B>::Mark mark(*ctx.workspace);
        walk(*ctx.workspace, Pass{.ctx = &ctx, .batch = batch, .films = films, .step = step, .x = x.data, .eps = eps.data});
    }

    /// eps = unet(x, timestep, cond) in one call. x, eps: [batch, action_dim, horizon] (must not alias);
    /// cond: [batch, global_cond_dim]. All scratch comes from ctx.workspace (returned on exit).
    void forward(Context<B>& ctx, View<const float, B> x, float timestep, View<const float, B> cond, View<float, B> eps) const {
        typename Workspace<B>::Mark mark(*ctx.workspace);
        forward(ctx, x, condition(ctx, timestep, 0.f, 1, cond), 0, eps);
    }

    /// Offset (floats) of residual block k's FiLM slice in a Conditioning buffer of `rows` rows per block (each slice
    /// starts 256-byte aligned, like a workspace take).
    std::int64_t film_offset(std::size_t k, int rows) const {
        std::int64_t at = 0;
        for (std::size_t j = 0; j < k; ++j) at += film_slice(rows, m_res[j].config().out);
        return at;
    }

private:
    struct Down {
        int r0, r1;  ///< indices into m_res
        std::optional<Conv1d<B>> downsample;
    };
    struct Up {
        int r0, r1;  ///< indices into m_res
        ConvTranspose1d<B> upsample;
    };

    /// One call of walk(): what it runs on (null in a measuring pass) and for how many samples.
    struct Pass {
        Context<B>* ctx = nullptr;
        int batch = 1;
        Conditioning films{};
        int step = 0;
        const float* x = nullptr;
        float* eps = nullptr;
    };
    /// One call of take_conditioning(), like Pass.
    struct CondPass {
        Context<B>* ctx = nullptr;
        int batch = 1, steps = 1;
        float t0 = 0.f, dt = 0.f;
        const float* cond = nullptr;
    };
    struct WalkResult {
        std::int64_t largest_activation = 0;  ///< channels * length of the largest activation buffered in turn, per sample
    };

    /// Floats of one residual block's FiLM vector [batch, 2*out] inside the shared FiLM buffer (each slice starts
    /// 256-byte aligned, like a workspace take).
    static std::int64_t film_slice(int batch, int out) { return (std::int64_t(batch) * 2 * out + 63) / 64 * 64; }

    /// Bytes a convolution may take as backend scratch (non-F32 MathMode; 0 on the CPU), rounded like a take.
    static std::size_t conv_scratch(const typename Conv1d<B>::Config& c, int batch, int length) {
        return Workspace<B>::template bytes_for<std::byte>(Conv1d<B>::scratch_bytes(c, batch, length));
    }
    /// Scratch of run_final: the block's output, the block's own scratch and the larger backend scratch of the two
    /// convolutions.
    std::size_t final_scratch(int batch, int length) const {
        const auto& c = m_final_block.config();
        return Workspace<B>::template bytes_for<float>(std::size_t(batch) * c.out * length) +
               Conv1dBlock<B>::workspace_bytes(c, batch, length) +
               std::max(conv_scratch({.in = c.in, .out = c.out, .kernel = c.kernel, .stride = 1, .pad = c.kernel / 2}, batch, length),
                        conv_scratch(m_final_conv.config(), batch, length));
    }
    /// eps = final_conv(final_block(x)). x: [batch, down_dims[0], horizon]; eps: [batch, action_dim, horizon].
    void run_final(Context<B>& ctx, View<const float, B> x, View<float, B> eps) const {
        typename Workspace<B>::Mark mark(*ctx.workspace);
        View<float, B> z = ctx.workspace->template take<float>(Shape{x.dim(0), m_final_block.config().out, x.dim(2)});
        m_final_block.forward(ctx, x, z);
        m_final_conv.forward(ctx, z, eps);
    }
    /// Scratch of one ResBlock::forward_with_film: its own plus the largest backend scratch of its convolutions
    /// (conv1, conv2, the 1x1 residual), each taken on top of what the block holds.
    static std::size_t scratch_of(const ResBlock& blk, int batch, int length) {
        const auto& c = blk.config();
        std::size_t conv = std::max(conv_scratch({.in = c.in, .out = c.out, .kernel = c.kernel, .stride = 1, .pad = c.kernel / 2}, batch, length),
                                    conv_scratch({.in = c.out, .out = c.out, .kernel = c.kernel, .stride = 1, .pad = c.kernel / 2}, batch, length));
        if (c.in != c.out) conv = std::max(conv, conv_scratch({.in = c.in, .out = c.out, .kernel = 1}, batch, length));
        return ResBlock::workspace_bytes_given_film(c, batch, length) + conv;
    }
    static std::size_t scratch_of(const Conv1d<B>& conv, int batch, int length) { return conv_scratch(conv.config(), batch, length); }
    static std::size_t scratch_of(const ConvTranspose1d<B>& up, int batch, int length) {
        return Workspace<B>::template bytes_for<std::byte>(ConvTranspose1d<B>::scratch_bytes(up.config(), batch, length));
    }

    /// condition(): takes the Conditioning buffers (kept on return) and, inside a Mark, the scratch that computes them:
    /// the step encoder on `steps` sinusoid rows, then one zeroed matrix G of steps + batch rows of cond_dim,
    /// rows [mish(e(t_i)) | 0] and [0 | mish(cond_b)] (mish(0) = 0), and every block's cond_encoder linear on the two
    /// row sets (with its bias on the timestep rows only) by linear_batch ops. With a WorkspaceMeter it only takes.
    template <class Arena>
    Conditioning take_conditioning(Arena& ws, const CondPass& pass) const {
        constexpr bool kRun = std::is_same_v<Arena, Workspace<B>>;
        const Config& c = m_cfg;
        const int batch = pass.batch, n = pass.steps, td = c.step_embed_dim, cd = c.cond_dim();
        Conditioning films;
        films.batch = batch;
        films.steps = n;
        float* per_step = ws.template take<float>(Shape{film_offset(m_res.size(), n)}).data;
        float* per_sample = ws.template take<float>(Shape{film_offset(m_res.size(), batch)}).data;
        films.per_step = per_step;
        films.per_sample = per_sample;
        typename Arena::Mark mark(ws);
        View<float, B> sn = ws.template take<float>(Shape{n, td});
        View<float, B> h1 = ws.template take<float>(Shape{n, 4 * td});
        // G: [n + batch, cond_dim], then `batch` rows of td zeros (the left half of the condition rows' concat).
        View<float, B> g = ws.template take<float>(Shape{(std::int64_t(n) + batch) * cd + std::int64_t(batch) * td});
        if constexpr (kRun) {
            Context<B>& ctx = *pass.ctx;
            float* g_cond = g.data + std::int64_t(n) * cd;
            const float* zeros = g_cond + std::int64_t(batch) * cd;
            Memory<B>::fill_zero(g.data, std::size_t(g.numel()) * sizeof(float), ctx.stream);
            SinusoidParams sp;
            sp.t = pass.t0;
            sp.t_step = pass.dt;
            sp.out = sn.data;
            sp.rows = n;
            sp.half = td / 2;
            sp.denom = float(td / 2 - 1);
            Ops<B>::sinusoid(sp, ctx.stream);
            m_te1.forward(ctx, sn.data, h1.data, n, Activation::Mish);
            m_te2.forward(ctx, h1.data, g.data, n, Activation::None, false, 0, cd);
            ConcatParams cp;
            cp.a = zeros;
            cp.b = pass.cond;
            cp.y = g_cond;
            cp.batch = batch;
            cp.ca = td;
            cp.cb = c.global_cond_dim;
            cp.length = 1;
            Ops<B>::concat_channels(cp, ctx.stream);
            ActivationParams ap;
            ap.x = g.data;
            ap.y = g.data;
            ap.n = (std::int64_t(n) + batch) * cd;
            ap.act = Activation::Mish;
            Ops<B>::activation(ap, ctx.stream);
            // Each block's linear on the timestep rows (with the bias) and on the condition rows (without), up to
            // kMaxLinearBatch per op (one launch on the GPU).
            LinearBatchParams lb;
            auto add = [&](LinearParams item) {
                item.math = ctx.math;  // like Linear::forward (the step encoder's linears)
                item.f32_gemm = ctx.f32_gemm;
                lb.items[lb.n_items++] = item;
                if (lb.n_items == kMaxLinearBatch) {
                    Ops<B>::linear_batch(lb, ctx.stream);
                    lb.n_items = 0;
                }
            };
            for (std::size_t k = 0; k < m_res.size(); ++k) {
                add(m_res[k].film_params(g.data, per_step + film_offset(k, n), n));
                LinearParams pc = m_res[k].film_params(g_cond, per_sample + film_offset(k, batch), batch);
                pc.bias = nullptr;
                add(pc);
            }
            if (lb.n_items > 0) Ops<B>::linear_batch(lb, ctx.stream);
        }
        return films;
    }

    /// The network, step by step, as forward() runs it. With a Workspace<B> it enqueues every op; with a
    /// WorkspaceMeter<B> it takes the same buffers (as null views) and, instead of calling a layer, reserves the scratch
    /// that layer takes, so the meter's peak is forward()'s workspace need.
    template <class Arena>
    WalkResult walk(Arena& ws, const Pass& pass) const {
        constexpr bool kRun = std::is_same_v<Arena, Workspace<B>>;
        const Config& c = m_cfg;
        const int batch = pass.batch, H = c.horizon, S = c.stages();
        WalkResult result;
        // Runs a layer, or in a measuring pass reserves the scratch it takes (`scratch()`: bytes).
        auto layer = [&](auto&& scratch, auto&& run) {
            if constexpr (kRun) run();
            else ws.reserve(scratch());
        };

        // Two activation buffers used in turn (no op reads two of them; each writes into the one its input is not in)
        // plus one skip buffer per down stage, kept for the up stage that concatenates it.
        std::array<float*, 2> rot{};
        for (float*& r : rot) r = ws.template take<float>(Shape{batch, m_activation_floats}).data;
        // An activation and the buffer holding it: 0 or 1 of rot, or -1 for one outside them (input, skip).
        struct Act {
            View<const float, B> v;
            int slot;
        };
        auto next_slot = [](int busy) { return busy == 0 ? 1 : 0; };
        auto into_slot = [&](int slot, Shape s) {
            result.largest_activation = std::max(result.largest_activation, s.numel() / batch);
            if constexpr (kRun)
                if (!(s.numel() <= std::int64_t(batch) * m_activation_floats)) [[unlikely]]
                    fail(ErrorKind::Internal, "diffusion", "activation larger than its buffer" + expected_got(std::int64_t(batch) * m_activation_floats, s.numel()));
            return View<float, B>{rot[std::size_t(slot)], s};
        };
        auto run_res = [&](int k, const Act& in, View<float, B> out) {
            const ResBlock& blk = m_res[std::size_t(k)];
            const int L = int(in.v.dim(2));
            layer([&] { return scratch_of(blk, batch, L); }, [&] {
                const Conditioning& f = pass.films;
                const int two_out = 2 * blk.config().out;
                const View<const float, B> film{f.per_sample + film_offset(std::size_t(k), batch), Shape{batch, two_out}};
                blk.forward_with_film(*pass.ctx, in.v, film, out, f.per_step + film_offset(std::size_t(k), f.steps) + std::int64_t(pass.step) * two_out);
            });
        };

        Act cur{View<const float, B>{pass.x, Shape{batch, c.action_dim, H}}, -1};
        std::array<float*, 8> skip{};
        int L = H;
        for (int s = 0; s < S; ++s) {
            const Down& d = m_down[std::size_t(s)];
            const int out = c.down_dims[std::size_t(s)];
            const int a_slot = next_slot(cur.slot);
            View<float, B> a = into_slot(a_slot, Shape{batch, out, L});
            run_res(d.r0, cur, a);
            View<float, B> sk = ws.template take<float>(Shape{batch, out, L});
            skip[std::size_t(s)] = sk.data;
            run_res(d.r1, Act{a, a_slot}, sk);
            cur = Act{sk, -1};
            if (d.downsample) {
                const Conv1d<B>& conv = *d.downsample;
                View<float, B> y = into_slot(0, Shape{batch, conv.config().out, conv.out_length(L)});
                layer([&] { return scratch_of(conv, batch, L); }, [&] { conv.forward(*pass.ctx, cur.v, y); });
                cur = Act{y, 0};
                L = conv.out_length(L);
            }
        }
        for (int m : m_mid) {
            const int slot = next_slot(cur.slot);
            View<float, B> y = into_slot(slot, Shape{batch, m_res[std::size_t(m)].config().out, L});
            run_res(m, cur, y);
            cur = Act{y, slot};
        }
        for (std::size_t u = 0; u < m_up.size(); ++u) {
            const Up& up = m_up[u];
            const int s = S - 1 - int(u), cs = c.down_dims[std::size_t(s)];
            const int cat_slot = next_slot(cur.slot);
            View<float, B> cat = into_slot(cat_slot, Shape{batch, cur.v.dim(1) + cs, L});
            if constexpr (kRun) {
                ConcatParams cc;
                cc.a = cur.v.data;
                cc.b = skip[std::size_t(s)];
                cc.y = cat.data;
                cc.batch = batch;
                cc.ca = int(cur.v.dim(1));
                cc.cb = cs;
                cc.length = L;
                Ops<B>::concat_channels(cc, pass.ctx->stream);
            }
            const int a_slot = next_slot(cat_slot);
            View<float, B> a = into_slot(a_slot, Shape{batch, m_res[std::size_t(up.r0)].config().out, L});
            run_res(up.r0, Act{cat, cat_slot}, a);
            const int b_slot = next_slot(a_slot);
            View<float, B> b2 = into_slot(b_slot, Shape{batch, m_res[std::size_t(up.r1)].config().out, L});
            run_res(up.r1, Act{a, a_slot}, b2);
            const int y_slot = next_slot(b_slot);
            View<float, B> y = into_slot(y_slot, Shape{batch, up.upsample.config().out, up.upsample.out_length(L)});
            layer([&] { return scratch_of(up.upsample, batch, L); }, [&] { up.upsample.forward(*pass.ctx, b2, y); });
            cur = Act{y, y_slot};
            L = up.upsample.out_length(L);
        }
        const View<float, B> eps{pass.eps, Shape{batch, c.action_dim, L}};
        layer([&] { return final_scratch(batch, L); }, [&] { run_final(*pass.ctx, cur.v, eps); });
        return result;
    }

    Config m_cfg{};
    Linear<B> m_te1, m_te2;
    std::vector<ResBlock> m_res;  ///< every residual block, in the order forward() runs them
    std::vector<Down> m_down;
    std::array<int, 2> m_mid{};   ///< indices into m_res
    std::vector<Up> m_up;
    Conv1dBlock<B> m_final_block;
    Conv1d<B> m_final_conv;
    std::int64_t m_activation_floats = 0;  ///< per sample: the size of each of the two activation buffers
};

}  // namespace flowedge
