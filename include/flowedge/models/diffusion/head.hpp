// LeRobot's Diffusion Policy head (conditional 1-D U-Net + DDIM/DDPM sampler), written once over Ops<B>.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "flowedge/graph.hpp"
#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"
#include "flowedge/layers/conv1d.hpp"
#include "flowedge/layers/conv_transpose1d.hpp"
#include "flowedge/layers/linear.hpp"
#include "flowedge/layers/unet_blocks.hpp"
#include "flowedge/models/diffusion/config.hpp"
#include "flowedge/models/diffusion/schedulers.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// LeRobot DiffusionConditionalUnet1d (FiLM scale modulation on): eps = unet(x, t, global_cond).
/// x, eps: [batch, horizon, action_dim]; global_cond: [batch, global_cond_dim]. Works channel-major
/// [batch, channels, length] inside. Parameter names are those under `diffusion.unet.` in LeRobot's state dict.
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
        auto res = [&](int in, int out) { return ResBlock({.in = in, .out = out, .cond_dim = cd, .kernel = k, .groups = g}); };
        const int S = cfg.stages();
        for (int s = 0; s < S; ++s) {
            const int in = s == 0 ? cfg.action_dim : cfg.down_dims[std::size_t(s - 1)];
            const int out = cfg.down_dims[std::size_t(s)];
            Down d{res(in, out), res(out, out), {}};
            if (s < S - 1) d.downsample.emplace(typename Conv1d<B>::Config{.in = out, .out = out, .kernel = 3, .stride = 2, .pad = 1});
            m_down.push_back(std::move(d));
        }
        const int wide = cfg.down_dims.back();
        m_mid.push_back(res(wide, wide));
        m_mid.push_back(res(wide, wide));
        for (int s = S - 1; s >= 1; --s) {
            const int hi = cfg.down_dims[std::size_t(s)], lo = cfg.down_dims[std::size_t(s - 1)];
            m_up.push_back(Up{res(2 * hi, lo), res(lo, lo),
                              ConvTranspose1d<B>({.in = lo, .out = lo, .kernel = 4, .stride = 2, .pad = 1})});
        }
        const int d0 = cfg.down_dims[0];
        m_final_block = Conv1dBlock<B>({.in = d0, .out = d0, .kernel = k, .groups = 8});
        m_final_conv = Conv1d<B>({.in = d0, .out = cfg.action_dim, .kernel = 1});
        // Identity matrices for the [H, A] <-> [A, H] layout changes, done as Linear ops (y = I @ X^T).
        std::vector<float> ia(std::size_t(cfg.action_dim) * cfg.action_dim, 0.f), ih(std::size_t(cfg.horizon) * cfg.horizon, 0.f);
        for (int i = 0; i < cfg.action_dim; ++i) ia[std::size_t(i) * cfg.action_dim + i] = 1.f;
        for (int i = 0; i < cfg.horizon; ++i) ih[std::size_t(i) * cfg.horizon + i] = 1.f;
        m_eye_a = Buffer<float, B>(ia.size());
        m_eye_h = Buffer<float, B>(ih.size());
        Memory<B>::copy_from_host(m_eye_a.data(), ia.data(), ia.size() * sizeof(float));
        Memory<B>::copy_from_host(m_eye_h.data(), ih.data(), ih.size() * sizeof(float));
        Memory<B>::synchronize();
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
            sub(p + "0.", m_down[s].r0);
            sub(p + "1.", m_down[s].r1);
            if (m_down[s].downsample) sub(p + "2.", *m_down[s].downsample);
        }
        for (std::size_t m = 0; m < m_mid.size(); ++m) sub("mid_modules." + std::to_string(m) + ".", m_mid[m]);
        for (std::size_t u = 0; u < m_up.size(); ++u) {
            const std::string p = "up_modules." + std::to_string(u) + ".";
            sub(p + "0.", m_up[u].r0);
            sub(p + "1.", m_up[u].r1);
            sub(p + "2.", m_up[u].upsample);
        }
        sub("final_conv.0.", m_final_block);
        sub("final_conv.1.", m_final_conv);
    }

    /// Number of U-Net parameters (251,511,938 for PushT).
    std::int64_t n_parameters() const {
        std::int64_t n = m_te1.n_parameters() + m_te2.n_parameters();
        for (const auto& d : m_down) n += d.r0.n_parameters() + d.r1.n_parameters() + (d.downsample ? d.downsample->n_parameters() : 0);
        for (const auto& m : m_mid) n += m.n_parameters();
        for (const auto& u : m_up) n += u.r0.n_parameters() + u.r1.n_parameters() + u.upsample.n_parameters();
        return n + m_final_block.n_parameters() + m_final_conv.n_parameters();
    }

    /// Largest channels*length of any activation per batch element (sizes the ping-pong buffers).
    static std::size_t max_activation(const Config& c) {
        std::size_t m = std::size_t(c.action_dim) * c.horizon;
        const int S = c.stages();
        for (int s = 0; s < S; ++s) {
            const std::size_t L = std::size_t(c.horizon >> s);
            m = std::max(m, std::size_t(c.down_dims[std::size_t(s)]) * L);
            if (s < S - 1) m = std::max(m, std::size_t(c.down_dims[std::size_t(s)]) * (L / 2));
        }
        int width = c.down_dims.back();
        for (int s = S - 1; s >= 1; --s) {
            const std::size_t L = std::size_t(c.horizon >> s);
            const int lo = c.down_dims[std::size_t(s - 1)];
            m = std::max(m, std::size_t(width + c.down_dims[std::size_t(s)]) * L);  // concat
            m = std::max(m, std::size_t(lo) * L * 2);                                   // resblocks + upsample
            width = lo;
        }
        return m;
    }

    /// Floats of one residual block's FiLM vector [batch, 2*out] inside the shared FiLM buffer (each slice starts
    /// 256-byte aligned, like a workspace take).
    static std::size_t film_slice(int batch, int out) { return (std::size_t(batch) * 2 * std::size_t(out) + 63) / 64 * 64; }

    /// Floats of all residual blocks' FiLM vectors, which forward() computes up front into one workspace buffer.
    static std::size_t film_floats(const Config& c, int batch) {
        const int S = c.stages();
        std::size_t n = 0;
        for (int s = 0; s < S; ++s) n += 2 * film_slice(batch, c.down_dims[std::size_t(s)]);      // down r0, r1
        n += 2 * film_slice(batch, c.down_dims.back());                                             // mid 0, 1
        for (int s = S - 1; s >= 1; --s) n += 2 * film_slice(batch, c.down_dims[std::size_t(s - 1)]);  // up r0, r1
        return n;
    }

    /// Scratch bytes forward() takes from the context's workspace for `batch` samples.
    static std::size_t workspace_bytes(const Config& c, int batch) {
        auto f32 = [](std::size_t n) { return Workspace<B>::template bytes_for<float>(n); };
        const std::size_t bsz = std::size_t(batch);
        const int td = c.step_embed_dim, S = c.stages();
        std::size_t n = 2 * f32(bsz * c.action_dim * c.horizon);                    // x channel-major, eps channel-major
        n += f32(bsz * td) + f32(bsz * 4 * td) + f32(bsz * td) + f32(bsz * c.cond_dim());  // step embedding, g
        n += f32(film_floats(c, batch));                                             // every block's FiLM vector
        for (int s = 0; s < S; ++s) n += f32(bsz * c.down_dims[std::size_t(s)] * (c.horizon >> s));  // skips
        n += 3 * f32(bsz * max_activation(c));                                       // rotating activations
        // The largest residual block's own scratch (taken above everything else; its FiLM vector is already counted).
        std::size_t blk = Conv1dBlock<B>::workspace_bytes({.in = c.down_dims[0], .out = c.down_dims[0], .kernel = c.kernel_size}, batch, c.horizon);
        for_each_res_block_shape(c, [&](int in, int out, int L) {
            blk = std::max(blk, ResBlock::workspace_bytes_given_film({.in = in, .out = out, .cond_dim = c.cond_dim(), .kernel = c.kernel_size,
                                                           .groups = c.n_groups}, batch, L));
        });
        // A convolution's backend scratch (non-F32 math) is taken and returned inside the conv, on top of whatever
        // its block holds, so the largest one is added once.
        return n + blk + max_conv_scratch_bytes(c, batch);
    }

    /// Calls f(in, out, length) for every residual block forward() runs, in order (down stages, mid, up stages).
    template <class F>
    static void for_each_res_block_shape(const Config& c, F&& f) {
        const int S = c.stages();
        for (int s = 0; s < S; ++s) {
            const int in = s == 0 ? c.action_dim : c.down_dims[std::size_t(s - 1)], out = c.down_dims[std::size_t(s)];
            f(in, out, c.horizon >> s);
            f(out, out, c.horizon >> s);
        }
        f(c.down_dims.back(), c.down_dims.back(), c.horizon >> (S - 1));
        f(c.down_dims.back(), c.down_dims.back(), c.horizon >> (S - 1));
        for (int s = S - 1; s >= 1; --s) {
            f(2 * c.down_dims[std::size_t(s)], c.down_dims[std::size_t(s - 1)], c.horizon >> s);
            f(c.down_dims[std::size_t(s - 1)], c.down_dims[std::size_t(s - 1)], c.horizon >> s);
        }
    }

    /// Largest Conv1d::scratch_bytes over every convolution forward() runs (0 on the CPU).
    static std::size_t max_conv_scratch_bytes(const Config& c, int batch) {
        const int k = c.kernel_size;
        std::size_t m = 0;
        auto conv = [&](int in, int out, int kernel, int stride, int pad, int L) {
            m = std::max(m, Conv1d<B>::scratch_bytes({.in = in, .out = out, .kernel = kernel, .stride = stride, .pad = pad}, batch, L));
        };
        for_each_res_block_shape(c, [&](int in, int out, int L) {
            conv(in, out, k, 1, k / 2, L);             // conv1
            conv(out, out, k, 1, k / 2, L);            // conv2
            if (in != out) conv(in, out, 1, 1, 0, L);  // residual 1x1
        });
        for (int s = 0; s + 1 < c.stages(); ++s)  // downsamples
            conv(c.down_dims[std::size_t(s)], c.down_dims[std::size_t(s)], 3, 2, 1, c.horizon >> s);
        conv(c.down_dims[0], c.down_dims[0], k, 1, k / 2, c.horizon);  // final conv block
        conv(c.down_dims[0], c.action_dim, 1, 1, 0, c.horizon);        // final 1x1
        return m;
    }

    /// eps = unet(x, timestep, cond). x, eps: [batch, horizon, action_dim] (x and eps must not alias);
    /// cond: [batch, global_cond_dim]. All scratch comes from ctx.workspace (returned on exit).
    void forward(Context<B>& ctx, View<const float, B> x, float timestep, View<const float, B> cond, View<float, B> eps) const {
        const Config& c = m_cfg;
        const int batch = int(x.dim(0)), H = c.horizon, A = c.action_dim, td = c.step_embed_dim, S = c.stages();
        check_shape(x, Shape{batch, H, A}, "diffusion", "sample");
        check_shape(eps, Shape{batch, H, A}, "diffusion", "epsilon");
        check_shape(cond, Shape{batch, c.global_cond_dim}, "diffusion", "global condition");
        Workspace<B>& ws = *ctx.workspace;
        typename Workspace<B>::Mark mark(ws);
        // [B, H, A] -> [B, A, H]: per sample y[a, h] = sum_i I_A[a, i] * x[h, i].
        // (Exact: one product per output is non-zero; kMaxLinearBatch samples per op, one launch on the GPU.)
        View<float, B> xt = ws.template take<float>(Shape{batch, A, H});
        View<float, B> et = ws.template take<float>(Shape{batch, A, H});
        transpose_samples(ctx, m_eye_a.data(), x.data, xt.data, batch, A, H);
        // Step embedding and FiLM input g = mish([e | cond]).
        View<float, B> sn = ws.template take<float>(Shape{batch, td});
        SinusoidParams sp;
        sp.t = timestep;
        sp.out = sn.data;
        sp.rows = batch;
        sp.half = td / 2;
        sp.denom = float(td / 2 - 1);
        Ops<B>::sinusoid(sp, ctx.stream);
        View<float, B> h1 = ws.template take<float>(Shape{batch, 4 * td});
        m_te1.forward(ctx, sn.data, h1.data, batch, Activation::Mish);
        View<float, B> e = ws.template take<float>(Shape{batch, td});
        m_te2.forward(ctx, h1.data, e.data, batch);
        View<float, B> g = ws.template take<float>(Shape{batch, c.cond_dim()});
        ConcatParams cp;
        cp.a = e.data;
        cp.b = cond.data;
        cp.y = g.data;
        cp.batch = batch;
        cp.ca = td;
        cp.cb = c.global_cond_dim;
        cp.length = 1;
        Ops<B>::concat_channels(cp, ctx.stream);
        ActivationParams ap;
        ap.x = g.data;
        ap.y = g.data;
        ap.n = g.numel();
        ap.act = Activation::Mish;
        Ops<B>::activation(ap, ctx.stream);
        // Every residual block's FiLM vector [batch, 2*out] from the shared g, packed in forward order, computed by
        // linear_batch ops of up to kMaxLinearBatch blocks each (one launch on the GPU instead of one per block).
        View<float, B> films = ws.template take<float>(Shape{std::int64_t(film_floats(c, batch))});
        {
            LinearBatchParams lb;
            std::int64_t off = 0;
            for_each_res_block([&](const ResBlock& blk) {
                lb.items[lb.n_items] = blk.film_params(g.data, films.data + off, batch);
                lb.items[lb.n_items++].math = ctx.math;  // like Linear::forward (the step encoder's linears)
                off += std::int64_t(film_slice(batch, blk.config().out));
                if (lb.n_items == kMaxLinearBatch) {
                    Ops<B>::linear_batch(lb, ctx.stream);
                    lb.n_items = 0;
                }
            });
            if (lb.n_items > 0) Ops<B>::linear_batch(lb, ctx.stream);
        }
        // Persistent buffers: skips and three rotating activations.
        float* skip[8] = {};
        for (int s = 0; s < S; ++s)
            skip[s] = ws.template take<float>(Shape{batch, c.down_dims[std::size_t(s)], H >> s}).data;
        const std::int64_t maxact = std::int64_t(max_activation(c));
        float* rot[3];
        for (auto& r : rot) r = ws.template take<float>(Shape{batch, maxact}).data;
        auto free_buf = [&](const float* a, const float* b2) {
            for (float* r : rot)
                if (r != a && r != b2) return r;
            return rot[0];  // unreachable: three buffers, two excluded
        };
        View<const float, B> cur = xt;
        std::int64_t film_at = 0;  // blocks run in for_each_res_block order, so their FiLM vectors come in sequence
        auto run_res = [&](const ResBlock& blk, View<const float, B> in, float* out_data) {
            View<float, B> out{out_data, Shape{batch, blk.config().out, in.dim(2)}};
            const View<const float, B> film{films.data + film_at, Shape{batch, 2 * blk.config().out}};
            film_at += std::int64_t(film_slice(batch, blk.config().out));
            blk.forward_with_film(ctx, in, film, out);
            return View<const float, B>(out);
        };
        for (int s = 0; s < S; ++s) {
            const Down& d = m_down[std::size_t(s)];
            View<const float, B> a = run_res(d.r0, cur, free_buf(cur.data, nullptr));
            cur = run_res(d.r1, a, skip[s]);
            if (d.downsample) {
                View<float, B> out{free_buf(cur.data, nullptr), Shape{batch, d.downsample->config().out, d.downsample->out_length(int(cur.dim(2)))}};
                d.downsample->forward(ctx, cur, out);
                cur = out;
            }
        }
        for (const ResBlock& m : m_mid) cur = run_res(m, cur, free_buf(cur.data, nullptr));
        for (std::size_t u = 0; u < m_up.size(); ++u) {
            const int s = S - 1 - int(u);
            const int L = int(cur.dim(2)), cs = c.down_dims[std::size_t(s)];
            View<float, B> cat{free_buf(cur.data, nullptr), Shape{batch, cur.dim(1) + cs, L}};
            ConcatParams cc;
            cc.a = cur.data;
            cc.b = skip[s];
            cc.y = cat.data;
            cc.batch = batch;
            cc.ca = int(cur.dim(1));
            cc.cb = cs;
            cc.length = L;
            Ops<B>::concat_channels(cc, ctx.stream);
            View<const float, B> a = run_res(m_up[u].r0, cat, free_buf(cat.data, nullptr));
            View<const float, B> b2 = run_res(m_up[u].r1, a, free_buf(a.data, nullptr));
            View<float, B> out{free_buf(b2.data, nullptr), Shape{batch, m_up[u].upsample.config().out, m_up[u].upsample.out_length(L)}};
            m_up[u].upsample.forward(ctx, b2, out);
            cur = out;
        }
        if (film_at != films.numel()) [[unlikely]]
            fail("diffusion", "FiLM vectors consumed out of order" + expected_got(films.numel(), film_at));
        View<float, B> fin{free_buf(cur.data, nullptr), Shape{batch, c.down_dims[0], H}};
        m_final_block.forward(ctx, cur, fin);
        m_final_conv.forward(ctx, fin, et);
        // [B, A, H] -> [B, H, A]: per sample y[h, a] = sum_i I_H[h, i] * et[a, i].
        transpose_samples(ctx, m_eye_h.data(), et.data, eps.data, batch, H, A);
    }

    /// For each sample b: y_b [rows, cols] = eye [rows, rows] @ x_b^T with x_b [cols, rows], i.e. the transpose of
    /// x_b, as linears (weights = the sample, exact) batched kMaxLinearBatch per op.
    static void transpose_samples(Context<B>& ctx, const float* eye, const float* x, float* y, int batch, int rows, int cols) {
        LinearBatchParams lb;
        for (int b = 0; b < batch; ++b) {
            LinearParams& p = lb.items[lb.n_items++];
            p = LinearParams{};
            p.x = eye;
            p.w = {x + std::size_t(b) * rows * cols, DType::F32};
            p.y = y + std::size_t(b) * rows * cols;
            p.rows = rows;
            p.in = rows;
            p.out = cols;
            if (lb.n_items == kMaxLinearBatch || b + 1 == batch) {
                Ops<B>::linear_batch(lb, ctx.stream);
                lb.n_items = 0;
            }
        }
    }

    /// Bytes of all bound parameters plus the identity matrices.
    std::size_t device_bytes() {
        std::size_t n = m_eye_a.bytes() + m_eye_h.bytes();
        visit_parameters([&](const std::string&, Parameter<B>& p, const Shape&, Storage) { n += p.loaded() ? p.bytes() : 0; });
        return n;
    }

private:
    /// Calls f(const ResBlock&) for every residual block in the order forward() runs them: down (r0, r1 per
    /// stage), mid, up (r0, r1 per stage).
    template <class F>
    void for_each_res_block(F&& f) const {
        for (const Down& d : m_down) {
            f(d.r0);
            f(d.r1);
        }
        for (const ResBlock& m : m_mid) f(m);
        for (const Up& u : m_up) {
            f(u.r0);
            f(u.r1);
        }
    }

    struct Down {
        ResBlock r0, r1;
        std::optional<Conv1d<B>> downsample;
    };
    struct Up {
        ResBlock r0, r1;
        ConvTranspose1d<B> upsample;
    };
    Config m_cfg{};
    Linear<B> m_te1, m_te2;
    std::vector<Down> m_down;
    std::vector<ResBlock> m_mid;
    std::vector<Up> m_up;
    Conv1dBlock<B> m_final_block;
    Conv1d<B> m_final_conv;
    Buffer<float, B> m_eye_a, m_eye_h;
};

/// "f32" / "tf32" / "bf16" (DiffusionHead::set_math; the Python `math` property and the C API use these names).
constexpr const char* math_mode_name(MathMode m) {
    return m == MathMode::TF32 ? "tf32" : m == MathMode::BF16 ? "bf16" : "f32";
}

/// Parses "f32" / "tf32" / "bf16" (any case); anything else is an error naming the value.
inline MathMode parse_math_mode(std::string_view name) {
    std::string lower(name);
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "f32") return MathMode::F32;
    if (lower == "tf32") return MathMode::TF32;
    if (lower == "bf16") return MathMode::BF16;
    fail("diffusion", "unknown math mode '" + std::string(name) + "'" + expected_got("f32, tf32 or bf16", std::string(name)));
}

/// Options of one DiffusionHead::sample call.
struct SampleOptions {
    int steps = 10;                           ///< inference steps N in [1, num_train_timesteps]
    Scheduler scheduler = Scheduler::Ddim;    ///< DDIM (eta 0) or DDPM
    std::uint64_t seed = 0;                   ///< DDPM noise seed (batch element b uses seed + b)
};

/// LeRobot Diffusion Policy action head: conditional 1-D U-Net + DDIM/DDPM sampler + MIN_MAX un-normalisation.
/// Everything (weights, workspace, staging buffers, scheduler tables) is allocated at load; sample() and
/// denoise() never allocate. A whole sample is enqueued on one stream inside Graph<B>::run (one CUDA graph launch).
template <Backend B>
class DiffusionHead {
public:
    using Config = DiffusionConfig;

    /// Loads a LeRobot pretrained_model folder (or its model.safetensors) or a compact *.flowedge.safetensors file,
    /// sized for up to `max_batch` samples per call.
    static DiffusionHead load(const std::filesystem::path& path, const LoadOptions& opts = {}, int max_batch = 1) {
        return load(io::open_diffusion_checkpoint(path), opts, max_batch);
    }

    /// Loads from an already opened checkpoint (e.g. io::lerobot_diffusion_from_parts or one opened once and
    /// shared: with zero-copy CPU weights, every head loaded from the same checkpoint shares its mapping).
    static DiffusionHead load(const io::DiffusionCheckpoint& ck, const LoadOptions& opts = {}, int max_batch = 1) {
        DiffusionHead h(ck.config, max_batch);
        h.m_unet.visit_parameters([&](const std::string& name, Parameter<B>& p, const Shape& shape, Storage st) {
            p.load(ck.tensor(name), shape, st, opts, ck.weights, "diffusion");
        });
        h.set_action_range(ck.action_min, ck.action_max);
        return h;
    }

    /// Builds the structure and all buffers for `cfg` without weights (bind them through visit_parameters,
    /// then call set_action_range). Used by load() and by tests.
    DiffusionHead(const Config& cfg, int max_batch)
        : m_cfg(cfg), m_max_batch(max_batch), m_unet(cfg), m_schedule(cfg.num_train_timesteps) {
        check(max_batch >= 1, "diffusion", "max_batch must be positive" + expected_got(">= 1", max_batch));
        const std::size_t bha = std::size_t(max_batch) * cfg.horizon * cfg.action_dim;
        m_cond_in = Buffer<float, B>(std::size_t(max_batch) * cfg.global_cond_dim);
        m_x_in = Buffer<float, B>(bha);
        m_out = Buffer<float, B>(bha);
        m_seed = Buffer<std::uint64_t, B>(1);
        m_action_min = Buffer<float, B>(std::size_t(cfg.action_dim));
        m_action_max = Buffer<float, B>(std::size_t(cfg.action_dim));
        m_ws = Workspace<B>(workspace_bytes(cfg, max_batch));
    }

    DiffusionHead(DiffusionHead&&) noexcept = default;
    DiffusionHead& operator=(DiffusionHead&&) noexcept = default;

    /// Workspace bytes for `max_batch`: the sampler state and epsilon plus the U-Net's scratch.
    static std::size_t workspace_bytes(const Config& cfg, int max_batch) {
        return 2 * Workspace<B>::template bytes_for<float>(std::size_t(max_batch) * cfg.horizon * cfg.action_dim) +
               ConditionalUnet1d<B>::workspace_bytes(cfg, max_batch);
    }

    /// Sets the MIN_MAX action range ([action_dim] each, min < max).
    void set_action_range(std::span<const float> mn, std::span<const float> mx) {
        check_live("set_action_range");
        check(int(mn.size()) == m_cfg.action_dim && int(mx.size()) == m_cfg.action_dim, "diffusion",
              "action range has the wrong size" + expected_got(m_cfg.action_dim, mn.size()));
        for (int a = 0; a < m_cfg.action_dim; ++a)
            check(mn[std::size_t(a)] < mx[std::size_t(a)], "diffusion",
                  "action min must be below max for dimension " + std::to_string(a) +
                      expected_got("min < max", std::to_string(mn[std::size_t(a)]) + " >= " + std::to_string(mx[std::size_t(a)])));
        m_min_host.assign(mn.begin(), mn.end());
        m_max_host.assign(mx.begin(), mx.end());
        Memory<B>::copy_from_host(m_action_min.data(), mn.data(), mn.size_bytes());
        Memory<B>::copy_from_host(m_action_max.data(), mx.data(), mx.size_bytes());
        Memory<B>::synchronize();
    }

    const Config& config() const { return m_cfg; }
    int max_batch() const { return m_max_batch; }
    /// U-Net parameter count (251,511,938 for PushT).
    std::int64_t n_parameters() const { return m_unet.n_parameters(); }
    /// Bytes held on B: parameters, staging buffers, workspace.
    std::size_t device_bytes() {
        return m_unet.device_bytes() + m_cond_in.bytes() + m_x_in.bytes() + m_out.bytes() + m_seed.bytes() +
               m_action_min.bytes() + m_action_max.bytes() + m_ws.capacity();
    }
    const std::vector<float>& action_min() const { return m_min_host; }
    const std::vector<float>& action_max() const { return m_max_host; }
    const NoiseSchedule& schedule() const { return m_schedule; }
    ConditionalUnet1d<B>& unet() { return m_unet; }
    /// The stream every call runs on (default: the backend's default stream).
    void set_stream(Stream s) {
        m_stream = s;
        m_graph.reset();
    }

    /// Arithmetic of the U-Net convolutions, FiLM and step-encoder linears (MathMode, default F32 = exact; the layout
    /// transposes always stay exact). TF32/BF16 are an opt-in: on tensor-core GPUs (CUDA sm_80+) for batched convs
    /// (used where batch*length >= 256, e.g. batch 64; smaller calls stay exact); on the CPU BF16 (not TF32) runs the
    /// convs and linears on vdpbf16ps where the build targets AVX512_BF16 (BF16-rounded activations, float
    /// accumulation; any batch), else the CPU computes exactly. Changing it drops the recorded graphs (re-captured on
    /// the next call; no device allocation). Error vs F32: per-op bounds in op_params.hpp (MathMode); end-to-end on
    /// the test configurations see test/cuda/test_cuda_models.cpp and test/diffusion/test_diffusion_head.cpp.
    void set_math(MathMode m) {
        if (!(m == MathMode::F32 || m == MathMode::TF32 || m == MathMode::BF16)) [[unlikely]]
            fail("diffusion", "unknown math mode" + expected_got("f32, tf32 or bf16", int(m)));
        if (m == m_math) return;
        Ops<B>::prepare_math(m);  // CUDA: creates the GEMM library handle now, not inside a graph capture
        m_math = m;
        m_graph.reset();
    }
    MathMode math() const { return m_math; }

    /// Lists every U-Net parameter (names under diffusion.unet.).
    template <class F>
    void visit_parameters(F&& f) { m_unet.visit_parameters(std::forward<F>(f)); }

    /// One U-Net call: eps = unet(sample, timestep, cond). cond: [batch, global_cond_dim];
    /// sample, eps: [batch, horizon, action_dim] in normalised action units; timestep in [0, T).
    void denoise(std::span<const float> cond, std::span<const float> sample, int timestep, std::span<float> eps, int batch) {
        check_live("denoise");
        check_batch(batch);
        if (!(timestep >= 0 && timestep < m_cfg.num_train_timesteps)) [[unlikely]] fail("diffusion",
              "timestep out of range" + expected_got("0.." + std::to_string(m_cfg.num_train_timesteps - 1), timestep));
        check_inputs(cond, sample, eps, batch, "sample");
        stage_inputs(cond, sample, batch);
        const std::uint64_t key = 3u | (std::uint64_t(timestep) << 8) | (std::uint64_t(batch) << 32);
        Context<B> ctx{m_stream, &m_ws, m_math};
        m_graph.run(m_stream, key, [&] {
            m_ws.reset();
            m_unet.forward(ctx, x_in(batch), float(timestep), cond_in(batch), out(batch));
        });
        Memory<B>::copy_to_host(eps.data(), m_out.data(), eps.size_bytes(), m_stream);
        Memory<B>::synchronize(m_stream);
        for (std::size_t i = 0; i < eps.size(); ++i)
            if (!std::isfinite(eps[i])) [[unlikely]]
                fail("diffusion", "non-finite epsilon at timestep " + std::to_string(timestep) + " (element " + std::to_string(i) + ")");
    }

    /// Samples actions: starting from `noise` [batch, horizon, action_dim] (standard normal, normalised units), runs
    /// opts.steps scheduler steps conditioned on cond [batch, global_cond_dim] and writes the un-normalised
    /// trajectory to actions [batch, horizon, action_dim].
    void sample(std::span<const float> cond, std::span<const float> noise, std::span<float> actions,
                const SampleOptions& opts = {}, int batch = 1) {
        run_sample(cond, noise, actions, opts, batch, true);
    }

    /// Same as sample() but writes the final sample in normalised units ([-1, 1] action space, before MIN_MAX).
    void sample_normalized(std::span<const float> cond, std::span<const float> noise, std::span<float> out,
                           const SampleOptions& opts = {}, int batch = 1) {
        run_sample(cond, noise, out, opts, batch, false);
    }

    /// Rows LeRobot executes: horizon rows [n_obs_steps-1, n_obs_steps-1+n_action_steps) of each sample.
    /// horizon: [batch, horizon, action_dim] -> out: [batch, n_action_steps, action_dim].
    void executed_actions(std::span<const float> horizon, std::span<float> out, int batch = 1) const {
        const std::size_t H = std::size_t(m_cfg.horizon), A = std::size_t(m_cfg.action_dim), N = std::size_t(m_cfg.n_action_steps);
        if (!(batch >= 1 && horizon.size() == std::size_t(batch) * H * A)) [[unlikely]] fail("diffusion",
              "horizon has the wrong size" + expected_got(std::size_t(batch) * H * A, horizon.size()));
        if (!(out.size() == std::size_t(batch) * N * A)) [[unlikely]] fail("diffusion",
              "executed actions have the wrong size" + expected_got(std::size_t(batch) * N * A, out.size()));
        const std::size_t first = std::size_t(m_cfg.n_obs_steps - 1);
        for (std::size_t b = 0; b < std::size_t(batch); ++b)
            std::copy_n(horizon.begin() + std::ptrdiff_t((b * H + first) * A), N * A, out.begin() + std::ptrdiff_t(b * N * A));
    }

    /// Un-normalises one value of action dimension a (host helper): (x + 1) / 2 * (max - min) + min.
    float unnormalize(float x, int a) const {
        if (!(a >= 0 && std::size_t(a) < m_min_host.size())) [[unlikely]]
            fail("diffusion", "unnormalize: action dimension out of range" +
                                  expected_got("0.." + std::to_string(int(m_min_host.size()) - 1), a));
        return (x + 1.f) / 2.f * (m_max_host[std::size_t(a)] - m_min_host[std::size_t(a)]) + m_min_host[std::size_t(a)];
    }

private:
    View<const float, B> cond_in(int batch) const { return {m_cond_in.data(), Shape{batch, m_cfg.global_cond_dim}}; }
    View<const float, B> x_in(int batch) const { return {m_x_in.data(), Shape{batch, m_cfg.horizon, m_cfg.action_dim}}; }
    View<float, B> out(int batch) { return {m_out.data(), Shape{batch, m_cfg.horizon, m_cfg.action_dim}}; }

    /// A moved-from head owns no buffers: every public method that uses them refuses with an Error.
    void check_live(const char* what) const {
        if (!m_out.data()) [[unlikely]]
            fail("diffusion", std::string(what) + "() on a moved-from DiffusionHead (it holds no weights or buffers; use the object it was moved into)");
    }

    void check_batch(int batch) const {
        if (!(batch >= 1 && batch <= m_max_batch)) [[unlikely]] fail("diffusion", "batch out of range" + expected_got("1.." + std::to_string(m_max_batch), batch));
    }

    void check_inputs(std::span<const float> cond, std::span<const float> x, std::span<float> y, int batch, const char* x_name) const {
        const std::size_t nc = std::size_t(batch) * m_cfg.global_cond_dim;
        const std::size_t nx = std::size_t(batch) * m_cfg.horizon * m_cfg.action_dim;
        if (!(cond.size() == nc)) [[unlikely]] fail("diffusion", "condition has the wrong size" + expected_got(nc, cond.size()));
        if (!(x.size() == nx)) [[unlikely]] fail("diffusion", std::string(x_name) + " has the wrong size" + expected_got(nx, x.size()));
        if (!(y.size() == nx)) [[unlikely]] fail("diffusion", "output has the wrong size" + expected_got(nx, y.size()));
        for (std::size_t i = 0; i < nc; ++i)
            if (!std::isfinite(cond[i])) [[unlikely]]
                fail("diffusion", "non-finite condition value at index " + std::to_string(i) + expected_got("finite", std::to_string(cond[i])));
        for (std::size_t i = 0; i < nx; ++i)
            if (!std::isfinite(x[i])) [[unlikely]]
                fail("diffusion", "non-finite " + std::string(x_name) + " value at index " + std::to_string(i) +
                                      expected_got("finite", std::to_string(x[i])));
    }

    void stage_inputs(std::span<const float> cond, std::span<const float> x, int) {
        Memory<B>::copy_from_host(m_cond_in.data(), cond.data(), cond.size_bytes(), m_stream);
        Memory<B>::copy_from_host(m_x_in.data(), x.data(), x.size_bytes(), m_stream);
    }

    /// Enqueues the whole sampler: state = noise; N x (U-Net, scheduler step); output (un-normalised or not).
    /// `after_step(i, state)` runs after each step (a no-op except in the non-finite diagnosis).
    template <class Hook>
    void enqueue_sample(const SampleOptions& opts, int batch, bool unnormalize_out, Hook&& after_step) {
        Context<B> ctx{m_stream, &m_ws, m_math};
        m_ws.reset();
        const Shape shp{batch, m_cfg.horizon, m_cfg.action_dim};
        View<float, B> state = m_ws.template take<float>(shp);
        View<float, B> eps = m_ws.template take<float>(shp);
        const std::size_t per = std::size_t(m_cfg.horizon) * m_cfg.action_dim;
        Memory<B>::copy(state.data, m_x_in.data(), std::size_t(batch) * per * sizeof(float), m_stream);
        std::uint64_t draws = 0;
        for (int i = 0; i < opts.steps; ++i) {
            const int t = m_schedule.timestep(i, opts.steps);
            m_unet.forward(ctx, state, float(t), cond_in(batch), eps);
            DiffusionStepParams p;
            p.x = state.data;
            p.eps = eps.data;
            p.batch = batch;
            p.per_sample = int(per);
            p.clip = m_cfg.clip_sample;
            p.clip_range = m_cfg.clip_sample_range;
            p.seed = opts.seed;
            p.seed_ptr = m_seed.data();
            p.draw_offset = draws;
            if (m_schedule.step_coefficients(opts.scheduler, i, opts.steps, p)) draws += per;
            Ops<B>::diffusion_step(p, m_stream);
            after_step(i, t, state);
        }
        if (unnormalize_out) {
            UnnormalizeParams u;
            u.x = state.data;
            u.y = m_out.data();
            u.min = m_action_min.data();
            u.max = m_action_max.data();
            u.rows = batch * m_cfg.horizon;
            u.dim = m_cfg.action_dim;
            Ops<B>::unnormalize(u, m_stream);
        } else {
            Memory<B>::copy(m_out.data(), state.data, std::size_t(batch) * per * sizeof(float), m_stream);
        }
    }

    void run_sample(std::span<const float> cond, std::span<const float> noise, std::span<float> result,
                    const SampleOptions& opts, int batch, bool unnormalize_out) {
        check_live("sample");
        check_batch(batch);
        m_schedule.check_steps(opts.steps);
        if (!(opts.scheduler == Scheduler::Ddim || opts.scheduler == Scheduler::Ddpm)) [[unlikely]] fail("diffusion",
              "unknown scheduler" + expected_got("ddim or ddpm", int(opts.scheduler)));
        check_inputs(cond, noise, result, batch, "noise");
        stage_inputs(cond, noise, batch);
        Memory<B>::copy_from_host(m_seed.data(), &opts.seed, sizeof(std::uint64_t), m_stream);
        const std::uint64_t key = (unnormalize_out ? 1u : 2u) | (std::uint64_t(opts.scheduler) << 4) |
                                  (std::uint64_t(opts.steps) << 8) | (std::uint64_t(batch) << 32);
        m_graph.run(m_stream, key, [&] { enqueue_sample(opts, batch, unnormalize_out, [](int, int, View<float, B>) {}); });
        Memory<B>::copy_to_host(result.data(), m_out.data(), result.size_bytes(), m_stream);
        Memory<B>::synchronize(m_stream);
        for (float v : result)
            if (!std::isfinite(v)) [[unlikely]]
                diagnose_nonfinite(opts, batch, unnormalize_out, result);
    }

    /// Slow path, only after a non-finite output: replays the sampler eagerly, checking the state after every
    /// step, and throws naming the first step whose result is not finite.
    [[noreturn]] void diagnose_nonfinite(const SampleOptions& opts, int batch, bool unnormalize_out, std::span<float> scratch) {
        enqueue_sample(opts, batch, unnormalize_out, [&](int i, int t, View<float, B> state) {
            Memory<B>::copy_to_host(scratch.data(), state.data, scratch.size_bytes(), m_stream);
            Memory<B>::synchronize(m_stream);
            for (std::size_t k = 0; k < scratch.size(); ++k)
                if (!std::isfinite(scratch[k]))
                    fail("diffusion", "non-finite sample after step " + std::to_string(i) + " of " + std::to_string(opts.steps) +
                                          " (timestep " + std::to_string(t) + ", element " + std::to_string(k) + ")");
        });
        fail("diffusion", "non-finite output after un-normalisation (action range produces inf/nan)");
    }

    Config m_cfg{};
    int m_max_batch = 1;
    ConditionalUnet1d<B> m_unet;
    NoiseSchedule m_schedule;
    Buffer<float, B> m_cond_in, m_x_in, m_out;
    Buffer<std::uint64_t, B> m_seed;
    Buffer<float, B> m_action_min, m_action_max;
    std::vector<float> m_min_host, m_max_host;
    Workspace<B> m_ws;
    Graph<B> m_graph;
    Stream m_stream{};
    MathMode m_math = MathMode::F32;
};

/// Writes checkpoint `src` (LeRobot folder or compact file) as a compact *.flowedge.safetensors file (SPEC 2) at `dst`:
/// conv/linear weights stored as `dtype` (round-to-nearest-even), biases and norm parameters as F32.
inline void export_diffusion_compact(const std::filesystem::path& src, const std::filesystem::path& dst, DType dtype = DType::F32) {
    const io::DiffusionCheckpoint ck = io::open_diffusion_checkpoint(src);
    ConditionalUnet1d<Cpu> skeleton(ck.config);
    io::SafeTensorsWriter out;
    std::vector<std::byte> buf;
    skeleton.visit_parameters([&](const std::string& name, Parameter<Cpu>&, const Shape& shape, Storage st) {
        const io::TensorInfo& t = ck.tensor(name);
        if (!(t.shape == shape))
            fail("lerobot", ck.source.string() + ": tensor '" + ck.key(name) + "' has the wrong shape" + expected_got(shape.str(), t.shape.str()));
        const DType want = st == Storage::Vector ? DType::F32 : dtype;
        const std::size_t n = std::size_t(shape.numel());
        buf.resize(n * dtype_size(want));
        Parameter<Cpu>::convert(t.data, t.dtype, buf.data(), want, n);
        out.add(io::diffusion_compact_name(name), want, shape, buf.data());
    });
    const auto meta = io::diffusion_meta(ck.config);
    std::vector<float> dims(ck.config.down_dims.begin(), ck.config.down_dims.end());
    out.add("dp.action_min", DType::F32, Shape{ck.config.action_dim}, ck.action_min.data());
    out.add("dp.action_max", DType::F32, Shape{ck.config.action_dim}, ck.action_max.data());
    out.add("dp.dims", DType::F32, Shape{std::int64_t(dims.size())}, dims.data());
    out.add("dp.meta", DType::F32, Shape{io::kDiffusionMetaSize}, meta.data());
    out.write(dst);
}

}  // namespace flowedge
