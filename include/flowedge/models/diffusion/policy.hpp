// LeRobot's whole DiffusionPolicy on any backend: observation normalisation, the RGB encoders, the n_obs_steps
// observation queue, the U-Net sampler and the n_action_steps action queue — reset() / select_action() as LeRobot's
// policy plus its pre/post-processors do them, from a pretrained_model folder, with no Python.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/models/batch_fit.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/diffusion/lerobot_policy_folder.hpp"
#include "flowedge/models/diffusion/rgb_encoder.hpp"
#include "flowedge/models/feature_norm_buffers.hpp"
#include "flowedge/models/model_execution.hpp"
#include "flowedge/models/policy_observation.hpp"
#include "flowedge/noise.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/realtime.hpp"

namespace flowedge {

/// Load-time choices of a DiffusionPolicy.
struct PolicyOptions {
    LoadOptions load{};                     ///< weight storage dtype (F32 default, BF16/F16 opt-in)
    int steps = 0;                          ///< inference steps; 0 = the checkpoint's num_inference_steps (LeRobot's rule)
    std::optional<Scheduler> scheduler{};   ///< default: the checkpoint's noise_scheduler_type
    std::uint64_t seed = 0;                 ///< seeded noise when the caller gives none (see select_action)
    bool warm_up = true;                    ///< run warm_up() at the end of load (see there)
    int batch = 1;                          ///< independent environments served by each select_action (all sized at load)
};

/// The whole LeRobot Diffusion Policy. Everything is allocated at load; reset() and select_action() never allocate.
/// On CUDA each select_action enqueues one recorded graph (normalise, encode the new frames, and when the action
/// queue is empty: the 10-step sampler and un-normalisation) after uploading the observation.
///
/// With PolicyOptions::batch = N > 1 it serves N independent environments (vectorised evaluation): each has its own
/// observation and action queues, seed and reset; one select_action over N observations encodes the frames of every
/// environment that needs them in one encoder call per camera (one call for all cameras when they share an encoder
/// and a frame shape), and samples every environment whose action queue ran out in one U-Net call of that many rows.
template <Backend B>
class DiffusionPolicy {
public:
    /// Opens a LeRobot DiffusionPolicy pretrained_model folder (config.json, model.safetensors, processors).
    static DiffusionPolicy load(const std::filesystem::path& folder, const PolicyOptions& opts = {}) {
        return DiffusionPolicy(io::open_lerobot_diffusion_policy(folder), opts);
    }

    DiffusionPolicy(io::LeRobotDiffusionPolicy folder, const PolicyOptions& opts)
        : m_meta(std::move(folder)), m_batch(checked_batch(opts.batch)), m_head(DiffusionHead<B>::load(m_meta.head, opts.load, m_batch)) {
        const DiffusionConfig& c = m_head.config();
        m_sample.scheduler = opts.scheduler.value_or(c.scheduler);
        m_sample.steps = opts.steps > 0 ? opts.steps : (c.num_inference_steps > 0 ? c.num_inference_steps : c.num_train_timesteps);
        m_head.schedule().check_steps(m_sample.steps);
        m_seed = opts.seed;
        if (m_meta.cameras.size() > std::size(m_layouts))
            fail(ErrorKind::Unsupported, "policy", "too many cameras" + expected_got("<= " + std::to_string(std::size(m_layouts)),
                                                                                     m_meta.cameras.size()));
        for (std::size_t cam = 0; cam < m_meta.cameras.size(); ++cam) {
            const io::PolicyCamera& pc = m_meta.cameras[cam];
            DiffusionRgbEncoder<B> enc(rgb_encoder_config_from_lerobot(m_meta.config, pc.height, pc.width));
            // Shared encoder: every camera binds the same tensors (zero-copy on the CPU); separate: rgb_encoder.N.
            const std::string prefix = m_meta.separate_encoders ? "diffusion.rgb_encoder." + std::to_string(cam) + "." : "diffusion.rgb_encoder.";
            enc.load(m_meta.head.weights, prefix, opts.load);
            enc.set_normalization(pc.norm.kind, pc.norm.offset.data(), pc.norm.denom.data());
            m_encoders.push_back(std::move(enc));
        }
        m_feature_dim = m_encoders.empty() ? 0 : m_encoders.front().feature_dim();
        m_per_step = m_meta.per_step_dim(m_feature_dim);
        if (c.global_cond_dim != m_per_step * c.n_obs_steps)
            fail(ErrorKind::BadFile, "policy", "condition width of the U-Net disagrees with the observation features" +
                                                   expected_got(m_per_step * c.n_obs_steps, c.global_cond_dim));
        const std::size_t N = std::size_t(m_batch);
        plan_encoder_groups();
        check_batch_fits<B>("policy", m_batch, [this](int b) { return batch_bytes(b); });
        for (const EncoderGroup& g : m_groups) m_frames.emplace_back(g.n_cams * N * frame_bytes(g.first_cam, ImageLayout::F32Chw));
        const std::size_t G = std::size_t(c.global_cond_dim), ha = std::size_t(c.horizon) * c.action_dim;
        m_cond = Buffer<float, B>(N * G);
        m_cond_rows = Buffer<float, B>(m_batch > 1 ? N * G : 1);
        m_features = Buffer<float, B>(std::max<std::size_t>(N * m_meta.cameras.size() * std::size_t(m_feature_dim), 1));
        m_state_in = Buffer<float, B>(N * std::size_t(std::max(m_meta.state_dim, 1)));
        m_env_in = Buffer<float, B>(N * std::size_t(std::max(m_meta.env_dim, 1)));
        m_noise = Buffer<float, B>(N * ha);
        m_chunk = Buffer<float, B>(N * ha);
        m_state_norm = FeatureNormBuffers<B>::upload(m_meta.state_norm);
        m_env_norm = FeatureNormBuffers<B>::upload(m_meta.env_norm);
        m_noise_host.resize(N * ha);
        m_chunk_host.resize(N * ha);
        m_actions.resize(N * std::size_t(c.n_action_steps) * c.action_dim);
        m_envs.resize(N);
        for (std::size_t e = 0; e < N; ++e) m_envs[e].seed = env_seed(m_seed, int(e));
        m_encode_envs.resize(N);
        m_sample_envs.resize(N);
        m_row_seeds.resize(N);
        m_exec = Execution("policy", encoder_workspace_bytes(m_batch));
        Memory<B>::synchronize();
        if (opts.warm_up) warm_up();
    }

    DiffusionPolicy(DiffusionPolicy&&) noexcept = default;
    DiffusionPolicy& operator=(DiffusionPolicy&&) noexcept = default;

    const DiffusionConfig& config() const { return m_head.config(); }
    int action_dim() const { return m_head.config().action_dim; }
    int state_dim() const { return m_meta.state_dim; }
    int env_dim() const { return m_meta.env_dim; }
    const std::string& state_key() const { return m_meta.state_key; }
    const std::string& env_key() const { return m_meta.env_key; }
    const std::vector<io::PolicyCamera>& cameras() const { return m_meta.cameras; }
    int image_feature_dim() const { return m_feature_dim; }
    int steps() const { return m_sample.steps; }
    Scheduler scheduler() const { return m_sample.scheduler; }
    /// Environments served per select_action (PolicyOptions::batch).
    int batch() const { return m_batch; }
    /// Chunks environment `env` generated since its last reset; the last select_action generated one for it when it grew.
    int chunks_generated(int env = 0) const { return m_envs[checked_env(env)].chunk_index; }
    DiffusionHead<B>& head() { return m_head; }

    /// All ops run on `s` from now on (the recorded graphs are dropped).
    void set_stream(Stream s) {
        m_exec.set_stream(s);
        m_head.set_stream(s);
    }
    /// Real-time options (docs/realtime.md), from the thread that will call select_action, after load. On CUDA: a
    /// stream of the device's highest priority replaces the current one (warm_up() records the graphs again) and the observation, noise and chunk copies go through page-locked staging buffers. Then the
    /// process/thread part (realtime::apply): this thread and the OpenMP workers pinned / given the SCHED_FIFO
    /// priority, memory locked or pre-faulted. Options turn things on; a later call without one does not undo it.
    /// Throws flowedge::Error naming the limit and its fix when the system refuses.
    RealtimeReport set_realtime(const RealtimeOptions& o) {
        m_exec.check_live("set_realtime", "DiffusionPolicy");
        if (o.high_priority_stream && !m_priority_stream) {
            const Stream s = Memory<B>::create_priority_stream();  // none on the CPU
            if (s.handle) {
                m_priority_stream.reset(s.handle);
                set_stream(s);
                warm_up();  // the new stream dropped the graphs load() recorded
            }
        }
        if (o.pinned_staging && !m_pinned) allocate_pinned_staging();
        RealtimeReport r = realtime::apply(o);
        r.high_priority_stream = m_priority_stream != nullptr;
        r.pinned_staging = m_pinned != nullptr;
        return r;
    }

    /// Arithmetic of the U-Net (see DiffusionHead::set_math); the encoder stays exact.
    void set_math(MathMode m) {
        m_head.set_math(m);
        m_exec.drop_graphs();
    }

    /// LeRobot's reset() for every environment: empties the observation and action queues (call at every episode
    /// start). `seed` replaces the policy's seed when given; environment e then draws from seed + (e << 32), so
    /// environment 0 of a batch draws what a batch-1 policy with the same seed draws.
    void reset(std::optional<std::uint64_t> seed = std::nullopt) {
        m_exec.check_live("reset", "DiffusionPolicy");
        if (seed) m_seed = *seed;
        for (std::size_t e = 0; e < m_envs.size(); ++e) restart(m_envs[e], env_seed(m_seed, int(e)));
    }

    /// reset() of environment `env` alone (its episode ended while the others go on). `seed` gives it the seed
    /// reset(seed) would (seed + (env << 32)); without one it keeps its own.
    void reset_env(int env, std::optional<std::uint64_t> seed = std::nullopt) {
        m_exec.check_live("reset_env", "DiffusionPolicy");
        EnvQueue& q = m_envs[checked_env(env)];
        restart(q, seed ? env_seed(*seed, env) : q.seed);
    }

    /// Runs every kind of tick once (n_action_steps + 1 ticks on a zero observation with frames in `layout`, every
    /// environment in step: the first tick that fills the queues and samples, plain pops, the pop that encodes for
    /// the next chunk, a later chunk), then empties the queues as reset() does, leaving the reset state and seeds as
    /// they were. It records the CUDA graph of each tick kind and touches every weight and scratch page, so that
    /// afterwards every tick costs what it will cost in the loop. load() calls it unless PolicyOptions::warm_up is
    /// false; call it again before feeding frames in another layout.
    void warm_up(ImageLayout layout = ImageLayout::U8Hwc) {
        const std::vector<EnvQueue> saved = m_envs;  // load-time allocations: warm_up is not a tick
        const ZeroObservation zero(m_meta.state_dim, m_meta.env_dim, m_meta.cameras, layout);
        std::vector<float> actions(std::size_t(m_batch) * std::size_t(action_dim()));
        const std::vector<PolicyObservation> obs(std::size_t(m_batch), zero.view());
        reset();
        for (int t = 0; t <= config().n_action_steps; ++t) select_action(std::span<const PolicyObservation>(obs), actions);
        for (std::size_t e = 0; e < m_envs.size(); ++e) {
            restart(m_envs[e], saved[e].seed);
            m_envs[e].was_reset = saved[e].was_reset;
        }
    }

    /// LeRobot's select_action() for a batch-1 policy (an error naming the batch otherwise): normalises the
    /// observation and pushes it on the n_obs_steps queue (the first call after reset() fills the queue with it),
    /// encodes its frames once if the next chunk will use them (their features stay in the queue), and when the
    /// action queue is empty samples a chunk from `noise` ([horizon, action_dim] standard normal, when given) or from
    /// seeded noise (chunk k after reset: normals 0.. of SplitMix stream seed + 2k; DDPM step noise: stream seed + 2k + 1),
    /// keeps rows [n_obs_steps - 1, n_obs_steps - 1 + n_action_steps) un-normalised, and pops the next: `action` [action_dim].
    void select_action(const PolicyObservation& obs, std::span<float> action, std::span<const float> noise = {}) {
        m_exec.check_live("select_action", "DiffusionPolicy");
        if (m_batch != 1) [[unlikely]]
            fail(ErrorKind::BadInput, "policy", "select_action(observation) serves one environment but this policy serves a batch "
                                                "(pass one observation per environment)" + expected_got("batch 1", m_batch));
        select_action(std::span<const PolicyObservation>(&obs, 1), action, noise);
    }

    /// select_action() of every environment at once: obs holds one observation per environment (batch()),
    /// actions [batch, action_dim] row-major receives each one's next action, and noise, when given, is
    /// [batch, horizon, action_dim] of which row e is used only if environment e samples a chunk at this tick (its
    /// seed_e + 2k streams otherwise, seed_e as reset() says). The environments that sample are gathered into one
    /// U-Net call; the results are the batch-1 ones up to the last bits of batched linears and convolutions.
    void select_action(std::span<const PolicyObservation> obs, std::span<float> actions, std::span<const float> noise = {}) {
        m_exec.check_live("select_action", "DiffusionPolicy");
        check_tick(obs, actions, noise);
        run_tick(obs, actions, noise);
    }

    /// Bytes held on B (weights, buffers, workspaces).
    std::size_t device_bytes() {
        std::size_t n = m_head.device_bytes() + m_cond.bytes() + m_cond_rows.bytes() + m_features.bytes() + m_state_in.bytes() +
                        m_env_in.bytes() + m_noise.bytes() + m_chunk.bytes() + m_exec.workspace().capacity();
        for (auto& e : m_encoders) n += e.device_bytes();
        for (auto& f : m_frames) n += f.bytes();
        return n;
    }

private:
    /// One environment's queues: actions [queue_pos, queue_len) of its chunk are still to be popped.
    struct EnvQueue {
        std::uint64_t seed = 0;
        int queue_len = 0, queue_pos = 0, chunk_index = 0;
        bool was_reset = false, obs_filled = false;
    };
    /// Cameras [first_cam, first_cam + n_cams) encoded by encoder first_cam in one call.
    struct EncoderGroup {
        std::size_t first_cam = 0, n_cams = 1;
    };

    static int checked_batch(int batch) {
        if (!(batch >= 1)) [[unlikely]] fail(ErrorKind::BadInput, "policy", "batch must be positive" + expected_got(">= 1", batch));
        return batch;
    }
    std::size_t checked_env(int env) const {
        if (!(env >= 0 && env < m_batch)) [[unlikely]]
            fail(ErrorKind::BadInput, "policy", "environment index out of range" + expected_got("0.." + std::to_string(m_batch - 1), env));
        return std::size_t(env);
    }
    static std::uint64_t env_seed(std::uint64_t seed, int env) { return seed + (std::uint64_t(env) << 32); }
    static void restart(EnvQueue& q, std::uint64_t seed) {
        q = EnvQueue{};
        q.seed = seed;
        q.was_reset = true;
    }

    /// With a batch and one encoder shared by cameras of one frame shape and image statistics, all cameras go through
    /// one encoder call;
    /// otherwise (and at batch 1, which keeps the single-environment policy's calls) each camera has its own.
    void plan_encoder_groups() {
        const auto& cams = m_meta.cameras;
        const bool alike = std::all_of(cams.begin(), cams.end(), [&](const io::PolicyCamera& pc) {
            const io::PolicyCamera& c0 = cams.front();
            return pc.channels == c0.channels && pc.height == c0.height && pc.width == c0.width && pc.norm.kind == c0.norm.kind &&
                   pc.norm.offset == c0.norm.offset && pc.norm.denom == c0.norm.denom;
        });
        if (m_batch > 1 && !m_meta.separate_encoders && alike && !cams.empty()) m_groups.push_back({0, cams.size()});
        else
            for (std::size_t cam = 0; cam < cams.size(); ++cam) m_groups.push_back({cam, 1});
    }

    /// The encoders' shared workspace for `batch` environments (each group encodes its cameras' frames at once).
    std::size_t encoder_workspace_bytes(int batch) const {
        std::size_t ws = 256;
        for (const EncoderGroup& g : m_groups) ws = std::max(ws, m_encoders[g.first_cam].workspace_bytes(int(g.n_cams * batch)));
        return ws;
    }
    /// Bytes the constructor allocates for `batch` environments beyond the head's (which checks its own): the
    /// encoder workspace, the frame buffers and the condition/noise/chunk buffers.
    std::size_t batch_bytes(int batch) const {
        const DiffusionConfig& c = m_head.config();
        const std::size_t N = std::size_t(batch), f = sizeof(float), G = std::size_t(c.global_cond_dim),
                          ha = std::size_t(c.horizon) * c.action_dim;
        std::size_t n = encoder_workspace_bytes(batch);
        for (const EncoderGroup& g : m_groups) n += g.n_cams * N * frame_bytes(g.first_cam, ImageLayout::F32Chw);
        n += (2 * N * G + N * m_meta.cameras.size() * std::size_t(m_feature_dim)) * f;
        n += N * std::size_t(std::max(m_meta.state_dim, 1) + std::max(m_meta.env_dim, 1)) * f + 2 * N * ha * f;
        return n;
    }

    std::size_t frame_bytes(std::size_t cam, ImageLayout layout) const { return policy_frame_bytes(m_meta.cameras[cam], layout); }
    /// Byte offset in its group's frame buffer of camera `cam`'s frame for encode slot j of m. Cameras of a group in
    /// one layout are packed [n_cams * m] frames (one encoder call); mixed layouts get a block of m float frames each.
    std::size_t frame_offset(const EncoderGroup& g, std::size_t cam, std::size_t j, std::size_t m) const {
        const std::size_t c = cam - g.first_cam, row = frame_bytes(cam, m_layouts[cam]);
        return group_layout_uniform(g) ? (c * m + j) * row : c * m * frame_bytes(cam, ImageLayout::F32Chw) + j * row;
    }
    bool group_layout_uniform(const EncoderGroup& g) const {
        for (std::size_t cam = g.first_cam + 1; cam < g.first_cam + g.n_cams; ++cam)
            if (m_layouts[cam] != m_layouts[g.first_cam]) return false;
        return true;
    }

    /// Every input checked before anything is enqueued: counts, sizes, that each environment was reset, each
    /// observation (sizes, layouts, finiteness: a NaN state or float frame would otherwise come back as a silent NaN
    /// action or poison the queue), one frame layout per camera across environments, and the noise rows that will be
    /// used. Messages name the environment when there is a batch and are built only on failure (no allocation).
    void check_tick(std::span<const PolicyObservation> obs, std::span<float> actions, std::span<const float> noise) const {
        const DiffusionConfig& c = m_head.config();
        const auto need = [](bool ok, ErrorKind k, std::string_view component, auto&& what) {
            if (!ok) [[unlikely]] fail(k, component, what());
        };
        const std::size_t N = std::size_t(m_batch), A = std::size_t(c.action_dim), ha = std::size_t(c.horizon) * A;
        const bool batched = m_batch > 1;
        need(obs.size() == N, ErrorKind::BadShape, "policy",
             [&] { return "wrong number of observations (one per environment)" + expected_got(N, obs.size()); });
        need(actions.size() == N * A, ErrorKind::BadShape, "policy", [&] {
            return "action output has the wrong size" +
                   (batched ? expected_got("[batch, action_dim] = " + std::to_string(N * A), actions.size()) : expected_got(A, actions.size()));
        });
        need(noise.empty() || noise.size() == N * ha, ErrorKind::BadShape, "policy", [&] {
            return "noise has the wrong size" + expected_got(std::string(batched ? "[batch, horizon, action_dim] = " : "[horizon, action_dim] = ") +
                                                                 std::to_string(N * ha),
                                                             noise.size());
        });
        for (std::size_t e = 0; e < N; ++e) {
            char component[32] = "policy";
            if (batched) std::snprintf(component, sizeof component, "policy env %zu", e);
            const EnvQueue& q = m_envs[e];
            need(q.was_reset, ErrorKind::BadInput, component,
                 [&] { return std::string("select_action() before reset() (call reset() at the start of every episode)"); });
            check_policy_observation(obs[e], component, m_meta.state_key, m_meta.state_dim, m_meta.env_key, m_meta.env_dim, m_meta.cameras);
            for (std::size_t cam = 0; cam < m_meta.cameras.size(); ++cam)
                need(obs[e].images[cam].layout == obs[0].images[cam].layout, ErrorKind::BadInput, component, [&] {
                    return "'" + m_meta.cameras[cam].key + "': frames of one camera must share a layout across environments" +
                           expected_got(int(obs[0].images[cam].layout), int(obs[e].images[cam].layout));
                });
            if (noise.empty() || q.queue_pos != q.queue_len) continue;
            for (std::size_t i = e * ha; i < (e + 1) * ha; ++i)
                need(std::isfinite(noise[i]), ErrorKind::NonFinite, component, [&] {
                    return "noise element " + std::to_string(i) + " is not finite" + expected_got("finite", std::to_string(noise[i]));
                });
        }
    }

    /// One checked tick: decides per environment what it does (fill its queue, encode, sample), uploads the states,
    /// the frames to encode and the noise, enqueues the work, then pops one action per environment.
    void run_tick(std::span<const PolicyObservation> obs, std::span<float> actions, std::span<const float> noise) {
        const DiffusionConfig& c = m_head.config();
        const Stream stream = m_exec.stream();
        const std::size_t N = std::size_t(m_batch), A = std::size_t(c.action_dim), ha = std::size_t(c.horizon) * A;
        const std::size_t S = std::size_t(m_meta.state_dim), E = std::size_t(m_meta.env_dim);
        std::size_t m = 0, n = 0, n_fill = 0;
        for (std::size_t e = 0; e < N; ++e) {
            const EnvQueue& q = m_envs[e];
            // A frame is encoded only if it will still be in the observation window when the env's next chunk is
            // sampled (after the actions left in its queue run out): LeRobot's amount of encoder work, and a chunk tick
            // encodes only its own frame because the older ones in the window were encoded as they arrived.
            const bool fill = !q.obs_filled, chunk = q.queue_pos == q.queue_len;
            n_fill += fill;
            if (fill || q.queue_len - q.queue_pos < c.n_obs_steps) m_encode_envs[m++] = int(e);
            if (chunk) m_sample_envs[n++] = int(e);
            Memory<B>::copy_from_host(m_state_in.data() + e * S, staged(m_stage.state, e * S * sizeof(float), obs[e].state.data(), S * sizeof(float)),
                                      S * sizeof(float), stream);
            if (E > 0)
                Memory<B>::copy_from_host(m_env_in.data() + e * E, staged(m_stage.env, e * E * sizeof(float), obs[e].env_state.data(), E * sizeof(float)),
                                          E * sizeof(float), stream);
        }
        std::uint64_t layout_bits = 0;
        if (m > 0)
            for (std::size_t cam = 0; cam < m_meta.cameras.size(); ++cam) {
                m_layouts[cam] = obs[0].images[cam].layout;
                layout_bits |= std::uint64_t(m_layouts[cam] == ImageLayout::F32Chw) << cam;
            }
        for (std::size_t g = 0; g < m_groups.size(); ++g)
            for (std::size_t cam = m_groups[g].first_cam; cam < m_groups[g].first_cam + m_groups[g].n_cams; ++cam)
                for (std::size_t j = 0; j < m; ++j) {
                    const PolicyFrame& f = obs[std::size_t(m_encode_envs[j])].images[cam];
                    const std::size_t bytes = frame_bytes(cam, f.layout), at = frame_offset(m_groups[g], cam, j, m);
                    Memory<B>::copy_from_host(m_frames[g].data() + at, staged(m_stage.frames[g], at, f.data, bytes), bytes, stream);
                }
        for (std::size_t j = 0; j < n; ++j) {
            const std::size_t e = std::size_t(m_sample_envs[j]);
            const std::uint64_t stream_seed = m_envs[e].seed + 2 * std::uint64_t(m_envs[e].chunk_index);
            float* dst = m_noise_host.data() + j * ha;
            if (noise.empty()) fill_normal(stream_seed, 0, dst, ha);
            else std::copy_n(noise.begin() + std::ptrdiff_t(e * ha), ha, dst);
            m_row_seeds[j] = stream_seed + 1;
        }
        if (n > 0) {
            const std::size_t bytes = n * ha * sizeof(float);
            Memory<B>::copy_from_host(m_noise.data(), staged(m_stage.noise, 0, m_noise_host.data(), bytes), bytes, stream);
            m_head.stage_row_seeds(std::span<const std::uint64_t>(m_row_seeds.data(), n));
        }
        enqueue_tick(m, n, n_fill, layout_bits);
        if (n > 0) {
            const std::size_t bytes = n * ha * sizeof(float);
            Memory<B>::copy_to_host(m_stage.chunk ? static_cast<void*>(m_stage.chunk) : m_chunk_host.data(), m_chunk.data(), bytes, stream);
            Memory<B>::synchronize(stream);
            if (m_stage.chunk) std::memcpy(m_chunk_host.data(), m_stage.chunk, bytes);
            const std::size_t first = std::size_t(c.n_obs_steps - 1), NA = std::size_t(c.n_action_steps) * A;
            for (std::size_t j = 0; j < n; ++j) {
                const std::size_t e = std::size_t(m_sample_envs[j]);
                EnvQueue& q = m_envs[e];
                const float* chunk = m_chunk_host.data() + j * ha;
                for (std::size_t i = 0; i < ha; ++i)
                    if (!std::isfinite(chunk[i])) [[unlikely]]
                        fail(ErrorKind::NonFinite, "policy", "non-finite action in chunk " + std::to_string(q.chunk_index) +
                                                                 (m_batch > 1 ? " of environment " + std::to_string(e) : std::string()) +
                                                                 " (element " + std::to_string(i) + ")");
                std::copy_n(chunk + first * A, NA, m_actions.begin() + std::ptrdiff_t(e * NA));
                q.queue_len = c.n_action_steps;
                q.queue_pos = 0;
                ++q.chunk_index;
            }
        } else {
            Memory<B>::synchronize(stream);
        }
        for (std::size_t e = 0; e < N; ++e) {
            EnvQueue& q = m_envs[e];
            q.obs_filled = true;
            const auto from = m_actions.begin() + std::ptrdiff_t((e * std::size_t(c.n_action_steps) + std::size_t(q.queue_pos)) * A);
            std::copy_n(from, A, actions.begin() + std::ptrdiff_t(e * A));
            ++q.queue_pos;
        }
    }

    /// Enqueues a tick's device work. When every environment does the same (always at batch 1, and in lockstep
    /// evaluation) the whole tick is one recorded graph keyed by what it does and the frame layouts, as many kinds as a
    /// single environment has. Otherwise (queues out of phase) the per-environment row updates and copies are enqueued
    /// directly and only the encoder (keyed by its frame count m and the layouts) and the sampler (keyed by its row
    /// count n, over the gathered conditions) are recorded; each graph cache keeps at most Graph's kMaxKeys keys.
    void enqueue_tick(std::size_t m, std::size_t n, std::size_t n_fill, std::uint64_t layout_bits) {
        const std::size_t N = std::size_t(m_batch);
        const bool uniform = (m == 0 || m == N) && (n == 0 || n == N) && (n_fill == 0 || n_fill == N);
        if (uniform) {
            const std::uint64_t key = (n_fill ? 1u : 0u) | (n ? 2u : 0u) | (m ? 4u : 0u) | (layout_bits << 8);
            m_exec.run(0, key, [&] {
                enqueue_observation_rows();
                if (m > 0) enqueue_encode(m);
                enqueue_feature_rows(m);
                if (n > 0) m_head.enqueue_sample_on_device(m_cond.data(), m_noise.data(), m_chunk.data(), m_sample, int(n), true);
            });
            return;
        }
        enqueue_observation_rows();
        if (m > 0) m_exec.run(1, std::uint64_t(m) | (layout_bits << 32), [&] { enqueue_encode(m); });
        enqueue_feature_rows(m);
        if (n > 0) {
            const std::size_t G = std::size_t(m_head.config().global_cond_dim);
            for (std::size_t j = 0; j < n; ++j)
                Memory<B>::copy(m_cond_rows.data() + j * G, m_cond.data() + std::size_t(m_sample_envs[j]) * G, G * sizeof(float), m_exec.stream());
            m_exec.run(2, std::uint64_t(n), [&] {
                m_head.enqueue_sample_on_device(m_cond_rows.data(), m_noise.data(), m_chunk.data(), m_sample, int(n), true);
            });
        }
    }

    /// Every environment's condition rows for this tick: shift its observation queue by one (unless it is being
    /// filled) and write the newest step's normalised state and environment state. The condition buffer is LeRobot's
    /// global_cond per environment: [batch, n_obs_steps, state | cam0 features | cam1 features | ... | env state].
    void enqueue_observation_rows() {
        const DiffusionConfig& c = m_head.config();
        const Stream stream = m_exec.stream();
        const std::size_t P = std::size_t(m_per_step), rows = std::size_t(c.n_obs_steps), G = std::size_t(c.global_cond_dim);
        const std::size_t S = std::size_t(m_meta.state_dim), E = std::size_t(m_meta.env_dim);
        for (std::size_t e = 0; e < m_envs.size(); ++e) {
            float* cond = m_cond.data() + e * G;
            float* last = cond + (rows - 1) * P;
            if (m_envs[e].obs_filled)
                for (std::size_t r = 0; r + 1 < rows; ++r) Memory<B>::copy(cond + r * P, cond + (r + 1) * P, P * sizeof(float), stream);
            m_state_norm.apply(m_state_in.data() + e * S, last, m_meta.state_dim, stream);
            if (E > 0) m_env_norm.apply(m_env_in.data() + e * E, last + S + m_encoders.size() * std::size_t(m_feature_dim), m_meta.env_dim, stream);
        }
    }

    /// Encodes the m uploaded frames of every camera into m_features: camera cam's features of encode slot j at row
    /// cam * m + j ([n_cameras * m, feature_dim]).
    void enqueue_encode(std::size_t m) {
        Context<B> ctx = m_exec.context();
        const std::size_t F = std::size_t(m_feature_dim);
        for (std::size_t g = 0; g < m_groups.size(); ++g) {
            const EncoderGroup& grp = m_groups[g];
            const bool one_call = group_layout_uniform(grp);
            for (std::size_t cam = grp.first_cam; cam < grp.first_cam + grp.n_cams; cam += one_call ? grp.n_cams : 1) {
                const std::size_t frames = one_call ? grp.n_cams * m : m;
                m_exec.workspace().reset();
                m_encoders[cam].forward(ctx, m_frames[g].data() + frame_offset(grp, cam, 0, m), m_layouts[cam], int(frames),
                                                  View<float, B>{m_features.data() + cam * m * F, Shape{std::int64_t(frames), std::int64_t(F)}});
            }
        }
    }

    /// Copies the new features of the m encoded environments into their newest condition row (the other environments'
    /// newest row leaves the window before their next chunk, so its features are never read), then fills the
    /// observation queue of every environment on its first tick with copies of that row.
    void enqueue_feature_rows(std::size_t m) {
        const DiffusionConfig& c = m_head.config();
        const Stream stream = m_exec.stream();
        const std::size_t P = std::size_t(m_per_step), rows = std::size_t(c.n_obs_steps), G = std::size_t(c.global_cond_dim);
        const std::size_t F = std::size_t(m_feature_dim), S = std::size_t(m_meta.state_dim);
        for (std::size_t j = 0; j < m; ++j) {
            float* last = m_cond.data() + std::size_t(m_encode_envs[j]) * G + (rows - 1) * P;
            for (std::size_t cam = 0; cam < m_encoders.size(); ++cam)
                Memory<B>::copy(last + S + cam * F, m_features.data() + (cam * m + j) * F, F * sizeof(float), stream);
        }
        for (std::size_t e = 0; e < m_envs.size(); ++e) {
            if (m_envs[e].obs_filled) continue;
            float* cond = m_cond.data() + e * G;
            for (std::size_t r = 0; r + 1 < rows; ++r) Memory<B>::copy(cond + r * P, cond + (rows - 1) * P, P * sizeof(float), stream);
        }
    }

    /// Host pointer a copy to the device reads: `src` itself, or its copy at `offset` in the page-locked staging slot
    /// when the policy has one (pinned_staging).
    static const void* staged(std::byte* slot, std::size_t offset, const void* src, std::size_t bytes) {
        if (slot == nullptr) return src;
        std::memcpy(slot + offset, src, bytes);
        return slot + offset;
    }

    /// One page-locked block holding every host side of a tick's copies, each slot 64-byte aligned.
    void allocate_pinned_staging() {
        const auto round = [](std::size_t n) { return (n + 63) / 64 * 64; };
        const std::size_t N = std::size_t(m_batch), ha = m_noise_host.size() * sizeof(float);
        const std::size_t state = N * std::size_t(std::max(m_meta.state_dim, 1)) * sizeof(float);
        const std::size_t env = N * std::size_t(std::max(m_meta.env_dim, 1)) * sizeof(float);
        std::size_t total = round(state) + round(env) + 2 * round(ha);
        for (const auto& f : m_frames) total += round(f.bytes());
        m_pinned.reset(static_cast<std::byte*>(Memory<B>::allocate_pinned(total)));
        if (!m_pinned) return;  // the CPU: copies read the caller's memory directly
        std::byte* next = m_pinned.get();
        const auto take = [&](std::size_t bytes) { return std::exchange(next, next + round(bytes)); };
        m_stage.state = take(state);
        m_stage.env = take(env);
        m_stage.noise = take(ha);
        m_stage.chunk = take(ha);
        for (std::size_t g = 0; g < m_frames.size(); ++g) m_stage.frames[g] = take(m_frames[g].bytes());
    }

    using Execution = ModelExecution<B, 3>;  ///< graphs: whole uniform ticks, encoder calls, sampler calls
    static constexpr std::size_t kMaxCameras = 32;  ///< size of the per-camera tables

    /// Release of the set_realtime resources (the CPU never creates them).
    struct StreamRelease {
        void operator()(void* s) const noexcept { Memory<B>::destroy_stream(Stream{s}); }
    };
    struct PinnedRelease {
        void operator()(std::byte* p) const noexcept { Memory<B>::deallocate_pinned(p); }
    };
    /// Host slots of the pinned staging block (all null without pinned_staging).
    struct Staging {
        std::byte *state = nullptr, *env = nullptr, *noise = nullptr, *chunk = nullptr;
        std::byte* frames[kMaxCameras]{};  ///< per encoder group
    };

    // Declared first, destroyed last: the stream outlives every graph and buffer that used it.
    std::unique_ptr<void, StreamRelease> m_priority_stream;
    std::unique_ptr<std::byte, PinnedRelease> m_pinned;
    Staging m_stage;
    io::LeRobotDiffusionPolicy m_meta;
    int m_batch = 1;
    DiffusionHead<B> m_head;
    std::vector<DiffusionRgbEncoder<B>> m_encoders;
    std::vector<EncoderGroup> m_groups;
    std::vector<Buffer<std::byte, B>> m_frames;  ///< per encoder group: the uploaded frames (float CHW size: fits either layout)
    ImageLayout m_layouts[kMaxCameras]{};         ///< per camera: the layout of the uploaded frames
    int m_feature_dim = 0, m_per_step = 0;
    SampleOptions m_sample{};
    std::uint64_t m_seed = 0;
    Buffer<float, B> m_cond, m_cond_rows, m_features, m_state_in, m_env_in, m_noise, m_chunk;
    FeatureNormBuffers<B> m_state_norm, m_env_norm;
    std::vector<float> m_noise_host, m_chunk_host, m_actions;
    std::vector<EnvQueue> m_envs;
    std::vector<int> m_encode_envs, m_sample_envs;  ///< this tick's environments that encode / sample, in order
    std::vector<std::uint64_t> m_row_seeds;         ///< this tick's DDPM seed per sampled row
    Execution m_exec;
};

}  // namespace flowedge
