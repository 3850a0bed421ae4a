// LeRobot's whole DiffusionPolicy on any backend: observation normalisation, the RGB encoders, the n_obs_steps
// observation queue, the U-Net sampler and the n_action_steps action queue — reset() / select_action() as LeRobot's
// policy plus its pre/post-processors do them, from a pretrained_model folder, with no Python.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
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
};

/// The whole LeRobot Diffusion Policy. Everything is allocated at load; reset() and select_action() never allocate.
/// On CUDA each select_action enqueues one recorded graph (normalise, encode the new frames, and when the action
/// queue is empty: the 10-step sampler and un-normalisation) after uploading the observation.
template <Backend B>
class DiffusionPolicy {
public:
    /// Opens a LeRobot DiffusionPolicy pretrained_model folder (config.json, model.safetensors, processors).
    static DiffusionPolicy load(const std::filesystem::path& folder, const PolicyOptions& opts = {}) {
        return DiffusionPolicy(io::open_lerobot_diffusion_policy(folder), opts);
    }

    DiffusionPolicy(io::LeRobotDiffusionPolicy folder, const PolicyOptions& opts)
        : m_meta(std::move(folder)), m_head(DiffusionHead<B>::load(m_meta.head, opts.load, 1)) {
        const DiffusionConfig& c = m_head.config();
        m_sample.scheduler = opts.scheduler.value_or(c.scheduler);
        m_sample.steps = opts.steps > 0 ? opts.steps : (c.num_inference_steps > 0 ? c.num_inference_steps : c.num_train_timesteps);
        m_head.schedule().check_steps(m_sample.steps);
        m_seed = opts.seed;
        if (m_meta.cameras.size() > std::size(m_layouts))
            fail(ErrorKind::Unsupported, "policy", "too many cameras" + expected_got("<= " + std::to_string(std::size(m_layouts)),
                                                                                     m_meta.cameras.size()));
        std::size_t ws = 0;
        for (std::size_t cam = 0; cam < m_meta.cameras.size(); ++cam) {
            const io::PolicyCamera& pc = m_meta.cameras[cam];
            DiffusionRgbEncoder<B> enc(rgb_encoder_config_from_lerobot(m_meta.config, pc.height, pc.width));
            // Shared encoder: every camera binds the same tensors (zero-copy on the CPU); separate: rgb_encoder.N.
            const std::string prefix = m_meta.separate_encoders ? "diffusion.rgb_encoder." + std::to_string(cam) + "." : "diffusion.rgb_encoder.";
            enc.load(m_meta.head.weights, prefix, opts.load);
            enc.set_normalization(pc.norm.kind, pc.norm.offset.data(), pc.norm.denom.data());
            ws = std::max(ws, enc.workspace_bytes(1));
            m_encoders.push_back(std::move(enc));
            m_frames.emplace_back(std::size_t(pc.channels) * pc.height * pc.width * sizeof(float));
        }
        m_feature_dim = m_encoders.empty() ? 0 : m_encoders.front().feature_dim();
        m_per_step = m_meta.per_step_dim(m_feature_dim);
        if (c.global_cond_dim != m_per_step * c.n_obs_steps)
            fail(ErrorKind::BadFile, "policy", "condition width of the U-Net disagrees with the observation features" +
                                                   expected_got(m_per_step * c.n_obs_steps, c.global_cond_dim));
        m_cond = Buffer<float, B>(std::size_t(c.n_obs_steps) * m_per_step);
        m_state_in = Buffer<float, B>(std::size_t(m_meta.state_dim));
        m_env_in = Buffer<float, B>(std::size_t(std::max(m_meta.env_dim, 1)));
        const std::size_t ha = std::size_t(c.horizon) * c.action_dim;
        m_noise = Buffer<float, B>(ha);
        m_chunk = Buffer<float, B>(ha);
        m_state_norm = FeatureNormBuffers<B>::upload(m_meta.state_norm);
        m_env_norm = FeatureNormBuffers<B>::upload(m_meta.env_norm);
        m_noise_host.resize(ha);
        m_chunk_host.resize(ha);
        m_actions.resize(std::size_t(c.n_action_steps) * c.action_dim);
        m_exec = Execution("policy", std::max<std::size_t>(ws, 256));
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
    /// Chunks generated since the last reset(); the last select_action generated one when it grew.
    int chunks_generated() const { return m_chunk_index; }
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

    /// LeRobot's reset(): empties the observation and action queues (call at every episode start). `seed` replaces
    /// the seed of the generated noise when given.
    void reset(std::optional<std::uint64_t> seed = std::nullopt) {
        m_exec.check_live("reset", "DiffusionPolicy");
        if (seed) m_seed = *seed;
        m_was_reset = true;
        m_obs_filled = false;
        m_queue_len = m_queue_pos = 0;
        m_chunk_index = 0;
    }

    /// Runs every kind of tick once (n_action_steps + 1 ticks on a zero observation with frames in `layout`: the
    /// first tick that fills the queues and samples, plain pops, the pop that encodes for the next chunk, a later
    /// chunk), then empties the queues as reset() does, leaving the reset state and seed as they were. It records
    /// the CUDA graph of each tick kind and touches every weight and scratch page, so that afterwards every tick
    /// costs what it will cost in the loop. load() calls it unless PolicyOptions::warm_up is false; call it again
    /// before feeding frames in another layout.
    void warm_up(ImageLayout layout = ImageLayout::U8Hwc) {
        const bool was_reset = m_was_reset;
        const std::vector<float> state(std::size_t(m_meta.state_dim), 0.0f), env(std::size_t(m_meta.env_dim), 0.0f);
        std::vector<float> action(static_cast<std::size_t>(action_dim()));
        std::vector<std::vector<std::byte>> pixels;
        std::vector<PolicyFrame> frames;
        for (std::size_t cam = 0; cam < m_meta.cameras.size(); ++cam) {
            const io::PolicyCamera& pc = m_meta.cameras[cam];
            pixels.emplace_back(frame_bytes(cam, layout), std::byte{0});
            frames.push_back(PolicyFrame{pixels.back().data(), layout, pc.height, pc.width});
        }
        const PolicyObservation obs{state, env, frames};
        reset();
        for (int t = 0; t <= config().n_action_steps; ++t) select_action(obs, action);
        reset();
        m_was_reset = was_reset;
    }

    /// LeRobot's select_action(): normalises the observation and pushes it on the n_obs_steps queue (the first call
    /// after reset() fills the queue with it), encodes its frames once if the next chunk will use them (their features
    /// stay in the queue), and when the
    /// action queue is empty samples a chunk from `noise` ([horizon, action_dim] standard normal, when given) or from
    /// seeded noise (chunk k after reset: normals 0.. of SplitMix stream seed + 2k; DDPM step noise: stream seed + 2k + 1),
    /// keeps rows [n_obs_steps - 1, n_obs_steps - 1 + n_action_steps) un-normalised, and pops the next: `action` [action_dim].
    void select_action(const PolicyObservation& obs, std::span<float> action, std::span<const float> noise = {}) {
        m_exec.check_live("select_action", "DiffusionPolicy");
        if (!m_was_reset) [[unlikely]]
            fail(ErrorKind::BadInput, "policy", "select_action() before reset() (call reset() at the start of every episode)");
        check_observation(obs, action, noise);
        const DiffusionConfig& c = m_head.config();
        const Stream stream = m_exec.stream();
        const bool fill = !m_obs_filled;
        const bool chunk = m_queue_pos == m_queue_len;
        // A frame is encoded only if it will still be in the observation window when the next chunk is sampled (that
        // chunk comes after the actions left in the queue run out): LeRobot's amount of encoder work, and a chunk tick
        // encodes only its own frame because the older ones in the window were encoded as they arrived.
        const bool encode = fill || m_queue_len - m_queue_pos < c.n_obs_steps;
        Memory<B>::copy_from_host(m_state_in.data(), staged(m_stage.state, obs.state.data(), obs.state.size_bytes()),
                                  obs.state.size_bytes(), stream);
        if (m_meta.env_dim > 0)
            Memory<B>::copy_from_host(m_env_in.data(), staged(m_stage.env, obs.env_state.data(), obs.env_state.size_bytes()),
                                      obs.env_state.size_bytes(), stream);
        std::uint64_t key = (fill ? 1u : 0u) | (chunk ? 2u : 0u) | (encode ? 4u : 0u);
        for (std::size_t cam = 0; encode && cam < m_encoders.size(); ++cam) {
            const PolicyFrame& f = obs.images[cam];
            const std::size_t bytes = frame_bytes(cam, f.layout);
            Memory<B>::copy_from_host(m_frames[cam].data(), staged(m_stage.frames[cam], f.data, bytes), bytes, stream);
            m_layouts[cam] = f.layout;
            key |= std::uint64_t(f.layout == ImageLayout::F32Chw) << (8 + cam);
        }
        if (chunk) {
            const std::uint64_t stream_seed = m_seed + 2 * std::uint64_t(m_chunk_index);
            if (noise.empty()) fill_normal(stream_seed, 0, m_noise_host.data(), m_noise_host.size());
            else std::copy(noise.begin(), noise.end(), m_noise_host.begin());
            const std::size_t bytes = m_noise_host.size() * sizeof(float);
            Memory<B>::copy_from_host(m_noise.data(), staged(m_stage.noise, m_noise_host.data(), bytes), bytes, stream);
            m_head.stage_seed(stream_seed + 1);
        }
        m_exec.run(0, key, [&] { enqueue_tick(fill, chunk, encode); });
        if (chunk) {
            const std::size_t bytes = m_chunk_host.size() * sizeof(float);
            Memory<B>::copy_to_host(m_stage.chunk ? static_cast<void*>(m_stage.chunk) : m_chunk_host.data(), m_chunk.data(), bytes, stream);
            Memory<B>::synchronize(stream);
            if (m_stage.chunk) std::memcpy(m_chunk_host.data(), m_stage.chunk, bytes);
            for (std::size_t i = 0; i < m_chunk_host.size(); ++i)
                if (!std::isfinite(m_chunk_host[i])) [[unlikely]]
                    fail(ErrorKind::NonFinite, "policy", "non-finite action in chunk " + std::to_string(m_chunk_index) + " (element " +
                                                             std::to_string(i) + ")");
            const std::size_t A = std::size_t(c.action_dim), first = std::size_t(c.n_obs_steps - 1);
            std::copy_n(m_chunk_host.begin() + std::ptrdiff_t(first * A), m_actions.size(), m_actions.begin());
            m_queue_len = c.n_action_steps;
            m_queue_pos = 0;
            ++m_chunk_index;
        } else {
            Memory<B>::synchronize(stream);
        }
        m_obs_filled = true;
        const std::size_t A = std::size_t(c.action_dim);
        std::copy_n(m_actions.begin() + std::ptrdiff_t(std::size_t(m_queue_pos) * A), A, action.begin());
        ++m_queue_pos;
    }

    /// Bytes held on B (weights, buffers, workspaces).
    std::size_t device_bytes() {
        std::size_t n = m_head.device_bytes() + m_cond.bytes() + m_state_in.bytes() + m_env_in.bytes() + m_noise.bytes() +
                        m_chunk.bytes() + m_exec.workspace().capacity();
        for (auto& e : m_encoders) n += e.device_bytes();
        for (auto& f : m_frames) n += f.bytes();
        return n;
    }

private:
    std::size_t frame_bytes(std::size_t cam, ImageLayout layout) const {
        const io::PolicyCamera& pc = m_meta.cameras[cam];
        return std::size_t(pc.channels) * pc.height * pc.width * (layout == ImageLayout::U8Hwc ? 1 : sizeof(float));
    }

    /// Every input checked before anything is enqueued: sizes, layouts, finiteness (a NaN state or float frame would
    /// otherwise come back as a silent NaN action or poison the queue).
    void check_observation(const PolicyObservation& obs, std::span<float> action, std::span<const float> noise) const {
        const DiffusionConfig& c = m_head.config();
        // Messages are built only on failure (`what` is a callable): select_action must not allocate.
        const auto need = [](bool ok, ErrorKind k, auto&& what) {
            if (!ok) [[unlikely]] fail(k, "policy", what());
        };
        need(action.size() == std::size_t(c.action_dim), ErrorKind::BadShape,
             [&] { return "action output has the wrong size" + expected_got(c.action_dim, action.size()); });
        check_policy_observation(obs, "policy", m_meta.state_key, m_meta.state_dim, m_meta.env_key, m_meta.env_dim, m_meta.cameras);
        if (!noise.empty()) {
            need(noise.size() == m_noise_host.size(), ErrorKind::BadShape, [&] {
                return "noise has the wrong size" + expected_got("[horizon, action_dim] = " + std::to_string(m_noise_host.size()), noise.size());
            });
            for (std::size_t i = 0; i < noise.size(); ++i)
                need(std::isfinite(noise[i]), ErrorKind::NonFinite, [&] {
                    return "noise element " + std::to_string(i) + " is not finite" + expected_got("finite", std::to_string(noise[i]));
                });
        }
    }

    /// The recorded part of one select_action: shift the observation queue (or, on the first call, fill it), write the
    /// newest step's normalised state, image features (when `encode`; otherwise that row's features are never read, the
    /// row leaves the window before the next chunk) and environment state into the condition rows, and sample when
    /// the action queue is empty. The condition buffer is LeRobot's global_cond: [n_obs_steps, state | cam0 features
    /// | cam1 features | ... | env state], flattened.
    void enqueue_tick(bool fill, bool chunk, bool encode) {
        const DiffusionConfig& c = m_head.config();
        Context<B> ctx = m_exec.context();
        const Stream stream = m_exec.stream();
        const std::size_t P = std::size_t(m_per_step), rows = std::size_t(c.n_obs_steps);
        float* cond = m_cond.data();
        float* last = cond + (rows - 1) * P;
        if (!fill)
            for (std::size_t r = 0; r + 1 < rows; ++r) Memory<B>::copy(cond + r * P, cond + (r + 1) * P, P * sizeof(float), stream);
        m_state_norm.apply(m_state_in.data(), last, m_meta.state_dim, stream);
        for (std::size_t cam = 0; encode && cam < m_encoders.size(); ++cam) {
            m_exec.workspace().reset();
            float* feat = last + m_meta.state_dim + cam * std::size_t(m_feature_dim);
            m_encoders[cam].forward(ctx, m_frames[cam].data(), m_layouts[cam], 1, View<float, B>{feat, Shape{1, m_feature_dim}});
        }
        if (m_meta.env_dim > 0)
            m_env_norm.apply(m_env_in.data(), last + m_meta.state_dim + m_encoders.size() * std::size_t(m_feature_dim), m_meta.env_dim,
                             stream);
        if (fill)
            for (std::size_t r = 0; r + 1 < rows; ++r) Memory<B>::copy(cond + r * P, last, P * sizeof(float), stream);
        if (chunk) m_head.enqueue_sample_on_device(cond, m_noise.data(), m_chunk.data(), m_sample, 1, true);
    }

    /// Host pointer a copy to the device reads: `src` itself, or its copy in the page-locked staging slot when the
    /// policy has one (pinned_staging).
    static const void* staged(std::byte* slot, const void* src, std::size_t bytes) {
        if (slot == nullptr) return src;
        std::memcpy(slot, src, bytes);
        return slot;
    }

    /// One page-locked block holding every host side of a tick's copies, each slot 64-byte aligned.
    void allocate_pinned_staging() {
        const auto round = [](std::size_t n) { return (n + 63) / 64 * 64; };
        const std::size_t ha = m_noise_host.size() * sizeof(float);
        std::size_t total = round(std::size_t(m_meta.state_dim) * sizeof(float)) +
                            round(std::size_t(std::max(m_meta.env_dim, 1)) * sizeof(float)) + 2 * round(ha);
        for (const auto& f : m_frames) total += round(f.bytes());
        m_pinned.reset(static_cast<std::byte*>(Memory<B>::allocate_pinned(total)));
        if (!m_pinned) return;  // the CPU: copies read the caller's memory directly
        std::byte* next = m_pinned.get();
        const auto take = [&](std::size_t bytes) { return std::exchange(next, next + round(bytes)); };
        m_stage.state = take(std::size_t(m_meta.state_dim) * sizeof(float));
        m_stage.env = take(std::size_t(std::max(m_meta.env_dim, 1)) * sizeof(float));
        m_stage.noise = take(ha);
        m_stage.chunk = take(ha);
        for (std::size_t cam = 0; cam < m_frames.size(); ++cam) m_stage.frames[cam] = take(m_frames[cam].bytes());
    }

    using Execution = ModelExecution<B, 1>;
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
        std::byte* frames[kMaxCameras]{};
    };

    // Declared first, destroyed last: the stream outlives every graph and buffer that used it.
    std::unique_ptr<void, StreamRelease> m_priority_stream;
    std::unique_ptr<std::byte, PinnedRelease> m_pinned;
    Staging m_stage;
    io::LeRobotDiffusionPolicy m_meta;
    DiffusionHead<B> m_head;
    std::vector<DiffusionRgbEncoder<B>> m_encoders;
    std::vector<Buffer<std::byte, B>> m_frames;  ///< per camera: the uploaded frame (float CHW size: fits either layout)
    ImageLayout m_layouts[kMaxCameras]{};         ///< per camera: the layout of the uploaded frame
    int m_feature_dim = 0, m_per_step = 0;
    SampleOptions m_sample{};
    std::uint64_t m_seed = 0;
    Buffer<float, B> m_cond, m_state_in, m_env_in, m_noise, m_chunk;
    FeatureNormBuffers<B> m_state_norm, m_env_norm;
    std::vector<float> m_noise_host, m_chunk_host, m_actions;
    int m_queue_len = 0, m_queue_pos = 0, m_chunk_index = 0;
    bool m_was_reset = false, m_obs_filled = false;
    Execution m_exec;
};

}  // namespace flowedge
