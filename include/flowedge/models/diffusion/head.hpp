// LeRobot's Diffusion Policy action head: the conditional 1-D U-Net driven by a DDIM/DDPM sampler, written once over
// Ops<B>, with everything allocated at load.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "flowedge/models/batch_fit.hpp"
#include "flowedge/models/diffusion/config.hpp"
#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"
#include "flowedge/models/diffusion/sample_layout.hpp"
#include "flowedge/models/diffusion/schedulers.hpp"
#include "flowedge/models/diffusion/unet.hpp"
#include "flowedge/models/model_execution.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

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
        DiffusionHead h(ck.config, max_batch, Memory<B>::host_accessible ? 0 : uploaded_weight_bytes(ck, opts));
        h.m_unet.visit_parameters([&](const std::string& name, Parameter<B>& p, const Shape& shape, Storage st) {
            p.load(ck.tensor(name), shape, st, opts, ck.weights, "diffusion");
        });
        h.set_action_range(ck.action_min, ck.action_max);
        return h;
    }

    /// Builds the structure and all buffers for `cfg` without weights (bind them through visit_parameters,
    /// then call set_action_range). Used by load() and by tests. `weight_bytes`: what the weights will take in
    /// Memory<B> once uploaded, counted with the batch-sized buffers by the fit check before anything is allocated.
    DiffusionHead(const Config& cfg, int max_batch, std::size_t weight_bytes = 0)
        : m_cfg(cfg), m_max_batch(max_batch), m_unet(cfg), m_layout(cfg.action_dim, cfg.horizon), m_schedule(cfg.num_train_timesteps) {
        check(max_batch >= 1, "diffusion", "max_batch must be positive" + expected_got(">= 1", max_batch));
        check_batch_fits<B>("diffusion", max_batch, [&](int b) { return weight_bytes + batch_bytes(b); });
        const std::size_t bha = std::size_t(max_batch) * cfg.horizon * cfg.action_dim;
        m_cond_in = Buffer<float, B>(std::size_t(max_batch) * cfg.global_cond_dim);
        m_x_in = Buffer<float, B>(bha);
        m_out = Buffer<float, B>(bha);
        m_seed = Buffer<std::uint64_t, B>(std::size_t(max_batch));
        m_seed_host.resize(std::size_t(max_batch));
        m_action_min = Buffer<float, B>(std::size_t(cfg.action_dim));
        m_action_max = Buffer<float, B>(std::size_t(cfg.action_dim));
        m_exec = Execution("diffusion", workspace_bytes(max_batch));
        // Batched F32 calls (batch * length >= 32 for a conv, >= 32 rows for a linear) run their convolutions and
        // FiLM linears on the backend library's F32 GEMM (CUDA cuBLASLt); batch 1 keeps the exact kernels.
        m_exec.use_f32_gemm(true);
    }

    DiffusionHead(DiffusionHead&&) noexcept = default;
    DiffusionHead& operator=(DiffusionHead&&) noexcept = default;

    /// Workspace bytes for calls of up to `batch` samples: the sampler's buffers plus the U-Net's scratch, measured
    /// from the code that takes them (take_sampler_buffers, ConditionalUnet1d::workspace_bytes).
    std::size_t workspace_bytes(int batch) const {
        WorkspaceMeter<B> meter;
        take_sampler_buffers(meter, batch);
        meter.reserve(m_unet.workspace_bytes(batch, std::min(ConditionalUnet1d<B>::kMaxFilmSteps, m_cfg.num_train_timesteps)));
        return meter.peak();
    }

    /// Bytes allocated at load for calls of up to `batch` samples: the workspace and the batch-sized buffers.
    std::size_t batch_bytes(int batch) const {
        const std::size_t b = std::size_t(batch), bha = b * m_cfg.horizon * m_cfg.action_dim;
        return workspace_bytes(batch) + (b * m_cfg.global_cond_dim + 2 * bha) * sizeof(float) + b * sizeof(std::uint64_t);
    }

    /// The U-Net weights' bytes once uploaded in the dtype `opts` asks for (the checkpoint's own dtype by default).
    static std::size_t uploaded_weight_bytes(const io::DiffusionCheckpoint& ck, const LoadOptions& opts) {
        std::size_t n = 0;
        for (const io::TensorInfo& t : ck.weights->tensors())
            if (ck.compact || t.name.starts_with("diffusion.unet."))
                n += std::size_t(t.shape.numel()) * dtype_size(opts.weight_dtype.value_or(t.dtype));
        return n;
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
        return m_unet.device_bytes() + m_layout.device_bytes() + m_cond_in.bytes() + m_x_in.bytes() + m_out.bytes() +
               m_seed.bytes() + m_action_min.bytes() + m_action_max.bytes() + m_exec.workspace().capacity();
    }
    const std::vector<float>& action_min() const { return m_min_host; }
    const std::vector<float>& action_max() const { return m_max_host; }
    const NoiseSchedule& schedule() const { return m_schedule; }
    ConditionalUnet1d<B>& unet() { return m_unet; }
    /// The stream every call runs on (default: the backend's default stream).
    void set_stream(Stream s) { m_exec.set_stream(s); }

    /// Arithmetic of the U-Net convolutions, FiLM and step-encoder linears (MathMode, default F32 = exact; the layout
    /// transposes always stay exact). TF32/BF16 are an opt-in: on tensor-core GPUs (CUDA sm_80+) for batched convs
    /// (used where batch*length >= 32, e.g. batch 8 at the PushT lengths; batch 1 stays exact); on the CPU BF16 (not TF32) runs the
    /// convs and linears on vdpbf16ps where the build targets AVX512_BF16 (BF16-rounded activations, float
    /// accumulation; any batch), else the CPU computes exactly. Changing it drops the recorded graphs (re-captured on
    /// the next call; no device allocation). Error vs F32: per-op bounds in op_params.hpp (MathMode); end-to-end on
    /// the test configurations see test/cuda/test_cuda_models.cpp and test/diffusion/test_diffusion_head.cpp.
    void set_math(MathMode m) { m_exec.switch_math(m); }
    MathMode math() const { return m_exec.math(); }

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
        m_exec.run(0, key, [&] {
            Context<B> ctx = m_exec.context();
            m_exec.workspace().reset();
            const SamplerBuffers s = take_sampler_buffers(m_exec.workspace(), batch);
            m_layout.to_unet(ctx, m_x_in.data(), s.unet_x.data, batch);
            m_unet.forward(ctx, s.unet_x, float(timestep), cond_in(batch), s.unet_eps);
            m_layout.to_sample(ctx, s.unet_eps.data, m_out.data(), batch);
        });
        Memory<B>::copy_to_host(eps.data(), m_out.data(), eps.size_bytes(), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
        for (std::size_t i = 0; i < eps.size(); ++i)
            if (!std::isfinite(eps[i])) [[unlikely]]
                fail(ErrorKind::NonFinite, "diffusion", "non-finite epsilon at timestep " + std::to_string(timestep) + " (element " + std::to_string(i) + ")");
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
        if (!(batch >= 1 && horizon.size() == std::size_t(batch) * H * A)) [[unlikely]] fail(ErrorKind::BadShape, "diffusion",
              "horizon has the wrong size" + expected_got(std::size_t(batch) * H * A, horizon.size()));
        if (!(out.size() == std::size_t(batch) * N * A)) [[unlikely]] fail(ErrorKind::BadShape, "diffusion",
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

    /// For models that run the head inside their own recorded graph (DiffusionPolicy): enqueues a whole sample on this
    /// head's stream and workspace from buffers on B, cond [batch, global_cond_dim] and noise [batch, horizon,
    /// action_dim] (normalised units), into out [batch, horizon, action_dim] (un-normalised when unnormalize_out); no
    /// staging, graph or synchronisation. DDPM seeds must have been set with stage_seed() or stage_row_seeds() earlier on
    /// the stream.
    void enqueue_sample_on_device(const float* cond, const float* noise, float* out, const SampleOptions& opts, int batch,
                                  bool unnormalize_out) {
        check_live("enqueue_sample_on_device");
        check_batch(batch);
        m_schedule.check_steps(opts.steps);
        if (!(opts.scheduler == Scheduler::Ddim || opts.scheduler == Scheduler::Ddpm)) [[unlikely]] fail("diffusion",
              "unknown scheduler" + expected_got("ddim or ddpm", int(opts.scheduler)));
        enqueue_sample(cond, noise, out, opts, batch, unnormalize_out, NoStepHook{});
    }
    /// Enqueues the copy of a DDPM seed into the device-side seeds the recorded samplers read (see DiffusionStepParams):
    /// batch element b draws from stream seed + b.
    void stage_seed(std::uint64_t seed) {
        for (std::size_t b = 0; b < m_seed_host.size(); ++b) m_seed_host[b] = seed + b;
        Memory<B>::copy_from_host(m_seed.data(), m_seed_host.data(), m_seed_host.size() * sizeof(std::uint64_t), m_exec.stream());
    }
    /// Per-row DDPM seeds: batch element b of the next enqueued sample draws from stream seeds[b] (independent
    /// environments sampled in one call, DiffusionPolicy). At most max_batch seeds.
    void stage_row_seeds(std::span<const std::uint64_t> seeds) {
        if (!(seeds.size() >= 1 && seeds.size() <= m_seed_host.size())) [[unlikely]]
            fail("diffusion", "row seeds out of range" + expected_got("1.." + std::to_string(m_max_batch), seeds.size()));
        std::copy(seeds.begin(), seeds.end(), m_seed_host.begin());
        Memory<B>::copy_from_host(m_seed.data(), m_seed_host.data(), seeds.size_bytes(), m_exec.stream());
    }

private:
    View<const float, B> cond_in(int batch) const { return {m_cond_in.data(), Shape{batch, m_cfg.global_cond_dim}}; }

    /// The sampler's workspace buffers of batch * horizon * action_dim floats each: the state and epsilon (in the
    /// sample or the U-Net layout, see enqueue_sample) and the U-Net-layout input and output of a step that keeps its
    /// state in the sample layout (also a transpose target for the non-finite diagnosis).
    struct SamplerBuffers {
        View<float, B> state, eps, unet_x, unet_eps;
    };
    template <class Arena>
    SamplerBuffers take_sampler_buffers(Arena& ws, int batch) const {
        const Shape bha{batch, m_cfg.horizon, m_cfg.action_dim}, bah{batch, m_cfg.action_dim, m_cfg.horizon};
        SamplerBuffers s;
        s.state = ws.template take<float>(bha);
        s.eps = ws.template take<float>(bha);
        s.unet_x = ws.template take<float>(bah);
        s.unet_eps = ws.template take<float>(bah);
        return s;
    }

    /// A moved-from head owns no buffers: every public method that uses them refuses with an Error.
    void check_live(const char* what) const { m_exec.check_live(what, "DiffusionHead"); }

    void check_batch(int batch) const {
        if (!(batch >= 1 && batch <= m_max_batch)) [[unlikely]] fail("diffusion", "batch out of range" + expected_got("1.." + std::to_string(m_max_batch), batch));
    }

    void check_inputs(std::span<const float> cond, std::span<const float> x, std::span<float> y, int batch, const char* x_name) const {
        const std::size_t nc = std::size_t(batch) * m_cfg.global_cond_dim;
        const std::size_t nx = std::size_t(batch) * m_cfg.horizon * m_cfg.action_dim;
        if (!(cond.size() == nc)) [[unlikely]] fail(ErrorKind::BadShape, "diffusion", "condition has the wrong size" + expected_got(nc, cond.size()));
        if (!(x.size() == nx)) [[unlikely]] fail(ErrorKind::BadShape, "diffusion", std::string(x_name) + " has the wrong size" + expected_got(nx, x.size()));
        if (!(y.size() == nx)) [[unlikely]] fail(ErrorKind::BadShape, "diffusion", "output has the wrong size" + expected_got(nx, y.size()));
        for (std::size_t i = 0; i < nc; ++i)
            if (!std::isfinite(cond[i])) [[unlikely]]
                fail(ErrorKind::NonFinite, "diffusion", "non-finite condition value at index " + std::to_string(i) + expected_got("finite", std::to_string(cond[i])));
        for (std::size_t i = 0; i < nx; ++i)
            if (!std::isfinite(x[i])) [[unlikely]]
                fail(ErrorKind::NonFinite, "diffusion", "non-finite " + std::string(x_name) + " value at index " + std::to_string(i) +
                                      expected_got("finite", std::to_string(x[i])));
    }

    void stage_inputs(std::span<const float> cond, std::span<const float> x, int) {
        Memory<B>::copy_from_host(m_cond_in.data(), cond.data(), cond.size_bytes(), m_exec.stream());
        Memory<B>::copy_from_host(m_x_in.data(), x.data(), x.size_bytes(), m_exec.stream());
    }

    /// A no-op after_step for enqueue_sample.
    struct NoStepHook {
        void operator()(int, int, const float*) const {}
    };

    /// Enqueues the whole sampler: state = noise; N x (U-Net, scheduler step); output (un-normalised or not).
    /// The state stays in the U-Net's layout [batch, action_dim, horizon] for the whole sample, transposed once from
    /// the noise and once into the output: the scheduler step is elementwise, and a DDPM step draws each element's
    /// noise by its sample-layout index (DiffusionStepParams::channel_major_length), so the draws are those of
    /// docs/models.md#seeded-noise. `after_step(i, t, state)` runs after each step with the state in the sample
    /// layout (only the non-finite diagnosis passes one).
    template <class Hook>
    void enqueue_sample(const SampleOptions& opts, int batch, bool unnormalize_out, Hook&& after_step) {
        enqueue_sample(m_cond_in.data(), m_x_in.data(), m_out.data(), opts, batch, unnormalize_out, std::forward<Hook>(after_step));
    }
    template <class Hook>
    void enqueue_sample(const float* cond, const float* noise, float* out, const SampleOptions& opts, int batch,
                        bool unnormalize_out, Hook&& after_step) {
        constexpr bool kHook = !std::is_same_v<std::decay_t<Hook>, NoStepHook>;
        Context<B> ctx = m_exec.context();
        const Stream stream = m_exec.stream();
        m_exec.workspace().reset();
        const SamplerBuffers s = take_sampler_buffers(m_exec.workspace(), batch);
        const std::size_t per = std::size_t(m_cfg.horizon) * m_cfg.action_dim;
        const View<const float, B> cond_view{cond, Shape{batch, m_cfg.global_cond_dim}};
        m_layout.to_unet(ctx, noise, s.state.data, batch);
        std::uint64_t draws = 0;
        // The FiLM vectors of up to kMaxFilmSteps steps at a time: the weights of every block's cond_encoder are read
        // once per run of steps instead of once per step (NoiseSchedule::timestep is evenly spaced: t_0 + i * dt).
        constexpr int kFilmRun = ConditionalUnet1d<B>::kMaxFilmSteps;
        for (int i0 = 0; i0 < opts.steps; i0 += kFilmRun) {
            const int n = std::min(kFilmRun, opts.steps - i0);
            const int t0 = m_schedule.timestep(i0, opts.steps);
            const int dt = n > 1 ? m_schedule.timestep(i0 + 1, opts.steps) - t0 : 0;
            typename Workspace<B>::Mark films_mark(m_exec.workspace());
            const auto films = m_unet.condition(ctx, float(t0), float(dt), n, cond_view);
            for (int i = i0; i < i0 + n; ++i) {
                m_unet.forward(ctx, View<const float, B>{s.state.data, s.unet_x.shape}, films, i - i0,
                               View<float, B>{s.eps.data, s.unet_eps.shape});
                DiffusionStepParams p;
                p.x = s.state.data;
                p.eps = s.eps.data;
                p.batch = batch;
                p.per_sample = int(per);
                p.clip = m_cfg.clip_sample;
                p.clip_range = m_cfg.clip_sample_range;
                p.seed = opts.seed;
                p.seed_ptr = m_seed.data();
                p.seed_per_row = true;
                p.draw_offset = draws;
                p.channel_major_length = m_cfg.horizon;
                if (m_schedule.step_coefficients(opts.scheduler, i, opts.steps, p)) draws += per;
                Ops<B>::diffusion_step(p, stream);
                if constexpr (kHook) {
                    m_layout.to_sample(ctx, s.state.data, s.unet_x.data, batch);
                    after_step(i, m_schedule.timestep(i, opts.steps), s.unet_x.data);
                }
            }
        }
        // The final state in the sample layout (into the output directly when nothing else is applied).
        float* final_state = unnormalize_out ? s.eps.data : out;
        m_layout.to_sample(ctx, s.state.data, final_state, batch);
        if (unnormalize_out) {
            UnnormalizeParams u;
            u.x = final_state;
            u.y = out;
            u.min = m_action_min.data();
            u.max = m_action_max.data();
            u.rows = batch * m_cfg.horizon;
            u.dim = m_cfg.action_dim;
            Ops<B>::unnormalize(u, stream);
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
        stage_seed(opts.seed);
        const std::uint64_t key = (unnormalize_out ? 1u : 2u) | (std::uint64_t(opts.scheduler) << 4) |
                                  (std::uint64_t(opts.steps) << 8) | (std::uint64_t(batch) << 32);
        m_exec.run(0, key, [&] { enqueue_sample(opts, batch, unnormalize_out, NoStepHook{}); });
        Memory<B>::copy_to_host(result.data(), m_out.data(), result.size_bytes(), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
        for (float v : result)
            if (!std::isfinite(v)) [[unlikely]]
                diagnose_non_finite(opts, batch, unnormalize_out, result);
    }

    /// Slow path, only after a non-finite output: replays the sampler eagerly, checking the state after every
    /// step, and throws naming the first step whose result is not finite.
    [[noreturn]] void diagnose_non_finite(const SampleOptions& opts, int batch, bool unnormalize_out, std::span<float> scratch) {
        enqueue_sample(opts, batch, unnormalize_out, [&](int i, int t, const float* state) {
            Memory<B>::copy_to_host(scratch.data(), state, scratch.size_bytes(), m_exec.stream());
            Memory<B>::synchronize(m_exec.stream());
            for (std::size_t k = 0; k < scratch.size(); ++k)
                if (!std::isfinite(scratch[k]))
                    fail(ErrorKind::NonFinite, "diffusion", "non-finite sample after step " + std::to_string(i) + " of " + std::to_string(opts.steps) +
                                          " (timestep " + std::to_string(t) + ", element " + std::to_string(k) + ")");
        });
        fail(ErrorKind::NonFinite, "diffusion", "non-finite output after un-normalisation (action range produces inf/nan)");
    }

    using Execution = ModelExecution<B, 1>;  // one graph cache: sample and denoise calls differ by key

    Config m_cfg{};
    int m_max_batch = 1;
    ConditionalUnet1d<B> m_unet;
    SampleLayout<B> m_layout;
    NoiseSchedule m_schedule;
    Buffer<float, B> m_cond_in, m_x_in, m_out;
    Buffer<std::uint64_t, B> m_seed;
    std::vector<std::uint64_t> m_seed_host;  ///< [max_batch] source of the seeds' asynchronous upload (must outlive the copy)
    Buffer<float, B> m_action_min, m_action_max;
    std::vector<float> m_min_host, m_max_host;
    Execution m_exec;
};

}  // namespace flowedge
