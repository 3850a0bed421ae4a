// LeRobot's whole ACT policy (Action Chunking with Transformers) on a backend: observation normalisation, the
// ResNet18 backbone per camera, the transformer encoder over [latent, state, env state, camera pixels] tokens, the
// decoder over chunk_size action queries, the action head, and select_action's n_action_steps queue or temporal
// ensembling, from a pretrained_model folder with no Python. Inference only: the VAE encoder is not run (the latent
// is zero, as LeRobot does in eval) and its tensors are ignored. On CUDA a chunk is one recorded graph.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/layers/conv2d.hpp"
#include "flowedge/layers/layer_norm.hpp"
#include "flowedge/layers/linear.hpp"
#include "flowedge/layers/resnet.hpp"
#include "flowedge/models/act/config.hpp"
#include "flowedge/models/act/lerobot_act_folder.hpp"
#include "flowedge/models/act/transformer.hpp"
#include "flowedge/models/feature_norm_buffers.hpp"
#include "flowedge/models/model_execution.hpp"
#include "flowedge/models/policy_observation.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/realtime.hpp"

namespace flowedge {

/// How select_action turns chunks into actions, replacing config.json's choice (LeRobot's eval-time
/// --policy.temporal_ensemble_coeff / --policy.n_action_steps); validated by LeRobot's rules.
struct ActSelection {
    std::optional<double> temporal_ensemble_coeff{};  ///< set: ensemble every step (n_action_steps must be 1)
    int n_action_steps = 1;
};

/// The work of one ACT chunk per part: multiply-adds of the matrix products (convolutions, linears, attention's
/// q k^T and p v; LayerNorm, softmax and activations not counted) and parameters read.
struct ActChunkCost {
    struct Part {
        double macs = 0;
        double parameters = 0;
    };
    Part tokens;   ///< the backbones, the 1x1 input projections and the 1-D token projections
    Part encoder;  ///< the encoder layers (and a pre-norm encoder's final LayerNorm)
    Part decoder;  ///< the decoder layers over chunk_size queries, the final LayerNorm and the action head
    double macs() const { return tokens.macs + encoder.macs + decoder.macs; }
    double parameters() const { return tokens.parameters + encoder.parameters + decoder.parameters; }
};

/// The host's steady clock in milliseconds (ActPolicy::time_parts' default clock).
inline double steady_clock_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Host milliseconds of one chunk's parts as ActPolicy::time_parts ran them (each synchronized before the clock reads).
struct ActPartTimes {
    double tokens_ms = 0, encoder_ms = 0, decoder_ms = 0;
};

/// Load-time choices of an ActPolicy.
struct ActPolicyOptions {
    LoadOptions load{};
    std::optional<ActSelection> selection{};  ///< default: the folder's temporal_ensemble_coeff and n_action_steps
    bool warm_up = true;                      ///< run warm_up() at the end of load (see there)
};

/// The whole LeRobot ACT policy, batch 1. Everything is allocated at load; reset(), predict_action_chunk() and
/// select_action() never allocate. On CUDA each chunk uploads the observation, replays one recorded graph (state
/// and frame normalisation, the backbones, encoder, decoder and action head; one graph per combination of frame
/// layouts) and copies the chunk back.
template <Backend B>
class ActPolicy {
public:
    /// Opens a LeRobot ACTPolicy pretrained_model folder (config.json, model.safetensors, processors).
    static ActPolicy load(const std::filesystem::path& folder, const ActPolicyOptions& opts = {}) {
        return ActPolicy(io::open_lerobot_act_folder(folder), opts);
    }

    ActPolicy(io::LeRobotActFolder folder, const ActPolicyOptions& opts) : m_meta(std::move(folder)) {
        ActConfig& c = m_meta.config;
        if (opts.selection) {
            c.temporal_ensemble_coeff = opts.selection->temporal_ensemble_coeff;
            c.n_action_steps = opts.selection->n_action_steps;
            c.validate("ActPolicyOptions::selection");
        }
        const int D = c.dim_model, C = c.chunk_size, A = m_meta.action_dim;
        const auto& file = m_meta.weights;
        const LoadOptions& lo = opts.load;
        // ACT's weights are convolutions and linears read from cache, none of the kinds quantize applies to
        // (quantizable()): the request is refused rather than silently ignored.
        if (lo.quantize != WeightQuant::None)
            fail(ErrorKind::Unsupported, "act", std::string("LoadOptions::quantize = ") + weight_quant_name(lo.quantize) +
                                                    " applies to Diffusion Policy U-Nets only" + expected_got("none", weight_quant_name(lo.quantize)));
        m_n_1d = 1 + (m_meta.state_dim > 0) + (m_meta.env_dim > 0);

        std::size_t ws = 256;
        if (m_meta.cameras.size() > kMaxCameras)
            fail(ErrorKind::Unsupported, "act", "too many cameras" + expected_got("<= " + std::to_string(kMaxCameras), m_meta.cameras.size()));
        if (!m_meta.cameras.empty()) {
            const io::PolicyCamera& cam0 = m_meta.cameras.front();
            m_backbone = ResNet18Backbone<B>({.height = cam0.height, .width = cam0.width, .torchvision_names = true});
            m_backbone.load(file, "model.backbone.", lo);
            m_img_proj = Conv2d<B>({.in = ResNet18Backbone<B>::kOutChannels, .out = D, .kernel = 1, .bias = true});
            m_img_proj.load(file, "model.encoder_img_feat_input_proj.", "", lo, "act");
            m_feat_h = m_backbone.out_h();
            m_feat_w = m_backbone.out_w();
            // With the tensor-core scratch of every convolution (CUDA; sized now, used under set_math(TF32/BF16)).
            ws = std::max({ws, m_backbone.workspace_bytes(1, true), m_img_proj.scratch_bytes(1, m_feat_h, m_feat_w)});
            for (const io::PolicyCamera& pc : m_meta.cameras) {
                m_frames.emplace_back(std::size_t(pc.channels) * pc.height * pc.width * sizeof(float));
                m_cam_norm.push_back(FeatureNormBuffers<B>::upload(pc.norm));
            }
            m_image = Buffer<float, B>(std::size_t(3) * cam0.height * cam0.width);
            m_feat = Buffer<float, B>(std::size_t(ResNet18Backbone<B>::kOutChannels) * m_feat_h * m_feat_w);
            m_proj = Buffer<float, B>(std::size_t(D) * m_feat_h * m_feat_w);
        }
        m_n_tokens = m_n_1d + int(m_meta.cameras.size()) * m_feat_h * m_feat_w;

        m_latent_proj = Linear<B>({.in = c.latent_dim, .out = D});
        bind_parameters<B>(m_latent_proj, file, "model.encoder_latent_input_proj.", lo, "act");
        if (m_meta.state_dim > 0) {
            m_state_proj = Linear<B>({.in = m_meta.state_dim, .out = D});
            bind_parameters<B>(m_state_proj, file, "model.encoder_robot_state_input_proj.", lo, "act");
        }
        if (m_meta.env_dim > 0) {
            m_env_proj = Linear<B>({.in = m_meta.env_dim, .out = D});
            bind_parameters<B>(m_env_proj, file, "model.encoder_env_state_input_proj.", lo, "act");
        }
        Table pos_1d{.shape = Shape{m_n_1d, D}, .weight = {}}, dec_pos{.shape = Shape{C, D}, .weight = {}};
        bind_parameters<B>(pos_1d, file, "model.encoder_1d_feature_pos_embed.", lo, "act");
        bind_parameters<B>(dec_pos, file, "model.decoder_pos_embed.", lo, "act");
        m_dec_pos = std::move(dec_pos.weight);
        for (int l = 0; l < c.n_encoder_layers; ++l) {
            m_encoder.emplace_back(c);
            m_encoder.back().load(file, "model.encoder.layers." + std::to_string(l) + ".", lo);
        }
        if (c.pre_norm) {
            m_encoder_norm = LayerNorm<B>({.dim = D});
            bind_parameters<B>(m_encoder_norm, file, "model.encoder.norm.", lo, "act");
        }
        for (int l = 0; l < c.n_decoder_layers; ++l) {
            m_decoder.emplace_back(c);
            m_decoder.back().load(file, "model.decoder.layers." + std::to_string(l) + ".", lo);
        }
        m_decoder_norm = LayerNorm<B>({.dim = D});
        bind_parameters<B>(m_decoder_norm, file, "model.decoder.norm.", lo, "act");
        m_action_head = Linear<B>({.in = D, .out = A});
        bind_parameters<B>(m_action_head, file, "model.action_head.", lo, "act");

        const std::size_t S = std::size_t(m_n_tokens), rows = std::size_t(std::max(m_n_tokens, C));
        m_tokens = Buffer<float, B>(S * D);
        m_pos = Buffer<float, B>(S * D);
        m_memory_keys = Buffer<float, B>(S * D);
        m_queries = Buffer<float, B>(std::size_t(C) * D);
        m_zero_latent = Buffer<float, B>(std::size_t(c.latent_dim));
        m_state_in = Buffer<float, B>(std::size_t(std::max(m_meta.state_dim, 1)));
        m_env_in = Buffer<float, B>(std::size_t(std::max(m_meta.env_dim, 1)));
        m_state_norm = FeatureNormBuffers<B>::upload(m_meta.state_norm);
        m_env_norm = FeatureNormBuffers<B>::upload(m_meta.env_norm);
        for (Buffer<float, B>* b : {&m_q, &m_k, &m_v, &m_heads, &m_sum, &m_normed, &m_branch}) *b = Buffer<float, B>(rows * D);
        m_hidden = Buffer<float, B>(rows * std::size_t(c.dim_feedforward));
        m_chunk = Buffer<float, B>(std::size_t(C) * A);
        m_exec = Execution("act", ws);
        // The 300-row encoder linears and the 480x640 backbone are GEMMs: under F32 math they run on the backend
        // library's F32 GEMM where it has one (CUDA: cuBLASLt, no TF32), the workspace holding every conv's scratch.
        m_exec.use_f32_gemm(true);

        // Constant inputs, written once: the zero latent and the encoder position embeddings, [1-D learned rows |
        // the 2-D sinusoidal table of every camera's feature map].
        const Stream stream = m_exec.stream();
        Memory<B>::fill_zero(m_zero_latent.data(), m_zero_latent.bytes(), stream);
        Memory<B>::copy(m_pos.data(), pos_1d.weight.f32(), std::size_t(m_n_1d) * D * sizeof(float), stream);
        const std::size_t hw = std::size_t(m_feat_h) * m_feat_w;
        for (std::size_t cam = 0; cam < m_meta.cameras.size(); ++cam) {
            PositionEmbedding2dParams pe;
            pe.y = m_pos.data() + (std::size_t(m_n_1d) + cam * hw) * D;
            pe.h = m_feat_h;
            pe.w = m_feat_w;
            pe.dim = D;
            Ops<B>::position_embedding_2d(pe, stream);
        }
        Memory<B>::synchronize(stream);
        m_chunk_host.resize(std::size_t(C) * A);
        m_queue.resize(std::size_t(c.n_action_steps) * A);
        if (c.temporal_ensemble_coeff) {
            // ACTTemporalEnsembler's weights in float32, as torch computes them: exp(-coeff * i) (the coefficient
            // rounded to float first, as torch's scalar is) and their running sum.
            m_ens_w.resize(std::size_t(C));
            m_ens_cumsum.resize(std::size_t(C));
            const float neg_coeff = float(-*c.temporal_ensemble_coeff);
            float run = 0.f;
            for (int i = 0; i < C; ++i) {
                m_ens_w[std::size_t(i)] = std::exp(neg_coeff * float(i));
                run += m_ens_w[std::size_t(i)];
                m_ens_cumsum[std::size_t(i)] = run;
            }
            m_ens.resize(std::size_t(C) * A);
            m_ens_count.resize(std::size_t(C));
        }
        if (opts.warm_up) warm_up();
    }

    ActPolicy(ActPolicy&&) noexcept = default;
    ActPolicy& operator=(ActPolicy&&) noexcept = default;

    const ActConfig& config() const { return m_meta.config; }
    int action_dim() const { return m_meta.action_dim; }
    int state_dim() const { return m_meta.state_dim; }
    int env_dim() const { return m_meta.env_dim; }
    const std::string& state_key() const { return m_meta.state_key; }
    const std::string& env_key() const { return m_meta.env_key; }
    const std::vector<io::PolicyCamera>& cameras() const { return m_meta.cameras; }
    /// Encoder tokens per chunk: latent, state, env state, then feature_h * feature_w per camera.
    int n_tokens() const { return m_n_tokens; }
    int feature_h() const { return m_feat_h; }
    int feature_w() const { return m_feat_w; }
    /// Chunks predicted since the last reset().
    int chunks_generated() const { return m_chunk_index; }

    /// The multiply-adds and parameters of one chunk, per part (counted from the config and the backbone's convs).
    ActChunkCost cost() const {
        const ActConfig& c = m_meta.config;
        const double D = c.dim_model, F = c.dim_feedforward, S = m_n_tokens, Q = c.chunk_size, A = m_meta.action_dim;
        const double hw = double(m_feat_h) * m_feat_w, n_cam = double(m_meta.cameras.size()), in_1d = c.latent_dim + m_meta.state_dim + m_meta.env_dim;
        const double norm = 2 * D, attn = 4 * D * (D + 1), ffn = 2 * D * F + F + D;
        ActChunkCost k;
        if (n_cam > 0) {
            k.tokens.macs = n_cam * (double(m_backbone.macs(1)) + hw * ResNet18Backbone<B>::kOutChannels * D);
            k.tokens.parameters = double(m_backbone.n_parameters()) + ResNet18Backbone<B>::kOutChannels * D + D;
        }
        k.tokens.macs += in_1d * D;
        k.tokens.parameters += (in_1d + 2 * m_n_1d) * D;  // 1-D projections, their biases, the 1-D position embedding
        // Per encoder layer: q, k, v and output projections of S rows, scores and weighted sums (S x S per dim), FFN.
        k.encoder.macs = c.n_encoder_layers * (4 * S * D * D + 2 * S * S * D + 2 * S * D * F);
        k.encoder.parameters = c.n_encoder_layers * (attn + ffn + 2 * norm) + (c.pre_norm ? norm : 0);
        // Per decoder layer: self-attention over Q queries; cross-attention with q and output projections of Q rows and
        // k, v projections of the S memory rows; FFN of Q rows. Then the action head.
        k.decoder.macs = c.n_decoder_layers * (4 * Q * D * D + 2 * Q * Q * D + 2 * Q * D * D + 2 * S * D * D + 2 * Q * S * D + 2 * Q * D * F) +
                         Q * D * A;
        k.decoder.parameters = c.n_decoder_layers * (2 * attn + ffn + 3 * norm) + Q * D + norm + D * A + A;
        return k;
    }

    /// Arithmetic of the products (default MathMode::F32: every product exact in float, as LeRobot's float32 eval;
    /// on CUDA the linears of >= 32 rows and the convolutions run on cuBLASLt's F32 GEMM, as PyTorch's F32 does).
    /// MathMode::TF32 / BF16 are opt-in and round where the backend has a faster path:
    ///   CUDA (sm_80+): every linear of >= 32 rows (the attention projections, the cross-attention k/v over the
    ///   encoder memory, the feed-forward linears with their ReLU, the action head; accumulating ones add into the
    ///   residual in the GEMM) runs on the cuBLASLt TF32 GEMM (F32 weights: TF32 under either mode), and the
    ///   backbone's convolutions and the 1x1 input projection run im2col + the same GEMM (conv2d_gemm.cu). Attention
    ///   scores, softmax and weighted sums, LayerNorm, the one-row token projections and the state/image
    ///   normalisation stay exact.
    ///   CPU: MathMode::BF16 rounds both operands of every linear with rows longer than 8 to BF16 (float accumulation)
    ///   where the CPU has AVX512_BF16 (the linear kernels' rule); TF32 computes exactly; convolutions stay exact.
    /// Drops the recorded graph (the next chunk records it again); a no-op when m is the current mode.
    void set_math(MathMode m) {
        m_exec.check_live("set_math", "ActPolicy");
        if (!m_exec.switch_math(m)) return;
        for (Linear<B>* l : {&m_latent_proj, &m_state_proj, &m_env_proj, &m_action_head}) l->set_math(m);
        for (ActEncoderLayer<B>& layer : m_encoder) layer.set_math(m);
        for (ActDecoderLayer<B>& layer : m_decoder) layer.set_math(m);
    }
    MathMode math() const { return m_exec.math(); }

    /// One chunk from `obs` run part by part outside any recorded graph, the stream synchronized after each part (the
    /// per-part latency table of bench/act_bench), each part timed with `clock_ms` (milliseconds; default the host's
    /// steady clock). The queue, the ensemble and the chunk count stay as they were.
    ActPartTimes time_parts(const PolicyObservation& obs, double (*clock_ms)() = steady_clock_ms) {
        m_exec.check_live("time_parts", "ActPolicy");
        check_observation(obs);
        const Stream stream = m_exec.stream();
        upload_observation(obs);
        Memory<B>::synchronize(stream);
        ActPartTimes t;
        auto timed = [&](double& ms, auto&& part) {
            const double t0 = clock_ms();
            part();
            Memory<B>::synchronize(stream);
            ms = clock_ms() - t0;
        };
        timed(t.tokens_ms, [&] { enqueue_tokens(); });
        timed(t.encoder_ms, [&] { enqueue_encoder(); });
        timed(t.decoder_ms, [&] { enqueue_decoder(); });
        return t;
    }

    /// LeRobot's reset(): empties the action queue or the temporal ensemble (call at every episode start).
    void reset() {
        m_exec.check_live("reset", "ActPolicy");
        m_was_reset = true;
        m_queue_len = m_queue_pos = 0;
        m_ens_len = 0;
        m_chunk_index = 0;
    }

    /// Predicts one chunk from a zero observation with frames in `layout`, leaving the queue, the ensemble and the
    /// chunk count as they were: records the CUDA graph for that layout and touches every weight and buffer page, so
    /// that the first real chunk costs what every chunk costs. load() calls it for U8Hwc frames unless
    /// ActPolicyOptions::warm_up is false; call it again before feeding frames in another layout.
    void warm_up(ImageLayout layout = ImageLayout::U8Hwc) {
        m_exec.check_live("warm_up", "ActPolicy");
        const ZeroObservation zero(m_meta.state_dim, m_meta.env_dim, m_meta.cameras, layout);
        const int chunks = m_chunk_index;
        run_chunk(zero.view());
        m_chunk_index = chunks;
    }

    /// LeRobot's predict_action_chunk(): the normalised action chunk for one observation. chunk: [chunk_size, action_dim].
    void predict_action_chunk(const PolicyObservation& obs, std::span<float> chunk) {
        m_exec.check_live("predict_action_chunk", "ActPolicy");
        check_observation(obs);
        if (chunk.size() != m_chunk_host.size()) [[unlikely]]
            fail(ErrorKind::BadShape, "act", "chunk output has the wrong size" +
                                                 expected_got("[chunk_size, action_dim] = " + std::to_string(m_chunk_host.size()), chunk.size()));
        run_chunk(obs);
        std::copy(m_chunk_host.begin(), m_chunk_host.end(), chunk.begin());
    }

    /// LeRobot's select_action() with its post-processor: with temporal ensembling, predicts a chunk every call and
    /// returns the ensembled first action; otherwise predicts when the queue is empty and pops the next of the
    /// chunk's first n_action_steps actions. action: [action_dim], un-normalised.
    void select_action(const PolicyObservation& obs, std::span<float> action) {
        m_exec.check_live("select_action", "ActPolicy");
        if (!m_was_reset) [[unlikely]]
            fail(ErrorKind::BadInput, "act", "select_action() before reset() (call reset() at the start of every episode)");
        check_observation(obs);
        const std::size_t A = std::size_t(m_meta.action_dim);
        if (action.size() != A) [[unlikely]]
            fail(ErrorKind::BadShape, "act", "action output has the wrong size" + expected_got(A, action.size()));
        const float* next = nullptr;
        if (m_meta.config.temporal_ensemble_coeff) {
            run_chunk(obs);
            next = ensemble_update();
        } else {
            if (m_queue_pos == m_queue_len) {
                run_chunk(obs);
                std::copy_n(m_chunk_host.begin(), m_queue.size(), m_queue.begin());
                m_queue_len = m_meta.config.n_action_steps;
                m_queue_pos = 0;
            }
            next = m_queue.data() + std::size_t(m_queue_pos++) * A;
        }
        for (std::size_t d = 0; d < A; ++d) action[d] = m_meta.action.apply(next[d], d);
    }

    /// Bytes held on B for buffers and the workspace (weights mapped from the file are not counted).
    std::size_t buffer_bytes() const {
        std::size_t n = m_exec.workspace().capacity();
        for (const Buffer<float, B>* b : {&m_image, &m_feat, &m_proj, &m_tokens, &m_pos, &m_memory_keys, &m_queries, &m_q, &m_k, &m_v,
                                          &m_heads, &m_sum, &m_normed, &m_branch, &m_hidden, &m_chunk})
            n += b->bytes();
        for (const auto& f : m_frames) n += f.bytes();
        return n;
    }

    /// Real-time options (docs/realtime.md), from the thread that will call select_action, after load. On CUDA a
    /// stream of the device's highest priority replaces the current one (warm_up() records the graph again); the
    /// observation copies stay pageable (pinned_staging is the Diffusion Policy's for now and is reported false).
    /// Then the process/thread part (realtime::apply). Throws flowedge::Error naming the limit and its fix when the
    /// system refuses.
    RealtimeReport set_realtime(const RealtimeOptions& o) {
        m_exec.check_live("set_realtime", "ActPolicy");
        if (o.high_priority_stream && !m_priority_stream) {
            const Stream s = Memory<B>::create_priority_stream();  // none on the CPU
            if (s.handle) {
                m_priority_stream.reset(s.handle);
                m_exec.set_stream(s);
                warm_up();  // the new stream dropped the graph load() recorded
            }
        }
        RealtimeReport r = realtime::apply(o);
        r.high_priority_stream = m_priority_stream != nullptr;
        return r;
    }

private:
    /// Release of set_realtime's stream (the CPU never creates one).
    struct StreamRelease {
        void operator()(void* s) const noexcept { Memory<B>::destroy_stream(Stream{s}); }
    };
    /// A learned table bound whole by name ("weight"), e.g. nn.Embedding(n, dim).weight used as position embeddings.
    struct Table {
        Shape shape;
        Parameter<B> weight;
        template <class F>
        void visit_parameters(F&& f) {
            f("weight", weight, shape, Storage::Vector);
        }
    };
    std::size_t frame_bytes(std::size_t cam, ImageLayout layout) const { return policy_frame_bytes(m_meta.cameras[cam], layout); }

    /// Every input checked before anything runs: sizes, layouts, finiteness.
    void check_observation(const PolicyObservation& obs) const {
        check_policy_observation(obs, "act", m_meta.state_key, m_meta.state_dim, m_meta.env_key, m_meta.env_dim, m_meta.cameras);
    }

    /// One ACT forward pass (LeRobot's ACT.forward in eval) into m_chunk_host: [chunk_size, action_dim], normalised.
    /// The observation is uploaded first (pageable host copies stay outside the recorded graph), then the graph of
    /// this combination of frame layouts runs, then the chunk comes back.
    void run_chunk(const PolicyObservation& obs) {
        const Stream stream = m_exec.stream();
        const std::uint64_t key = upload_observation(obs);
        m_exec.run(0, key, [&] { enqueue_chunk(); });
        Memory<B>::copy_to_host(m_chunk_host.data(), m_chunk.data(), m_chunk_host.size() * sizeof(float), stream);
        Memory<B>::synchronize(stream);
        for (std::size_t i = 0; i < m_chunk_host.size(); ++i)
            if (!std::isfinite(m_chunk_host[i])) [[unlikely]]
                fail(ErrorKind::NonFinite, "act", "non-finite action in chunk " + std::to_string(m_chunk_index) + " (element " + std::to_string(i) + ")");
        ++m_chunk_index;
    }

    /// Copies the state, environment state and frames to B (pageable host copies, outside any recorded graph) and
    /// notes each frame's layout; returns the graph key of this combination of layouts.
    std::uint64_t upload_observation(const PolicyObservation& obs) {
        const Stream stream = m_exec.stream();
        if (m_meta.state_dim > 0) Memory<B>::copy_from_host(m_state_in.data(), obs.state.data(), obs.state.size_bytes(), stream);
        if (m_meta.env_dim > 0) Memory<B>::copy_from_host(m_env_in.data(), obs.env_state.data(), obs.env_state.size_bytes(), stream);
        std::uint64_t key = 0;
        for (std::size_t cam = 0; cam < m_meta.cameras.size(); ++cam) {
            const PolicyFrame& f = obs.images[cam];
            Memory<B>::copy_from_host(m_frames[cam].data(), f.data, frame_bytes(cam, f.layout), stream);
            m_layouts[cam] = f.layout;
            key |= std::uint64_t(f.layout == ImageLayout::F32Chw) << cam;
        }
        return key;
    }

    /// The recorded part of a chunk, from the uploaded state, environment state and frames (in m_layouts) to m_chunk.
    void enqueue_chunk() {
        enqueue_tokens();
        enqueue_encoder();
        enqueue_decoder();
    }

    /// The encoder's input tokens into m_tokens: the zero latent's projection, the normalised robot state's and
    /// environment state's projections, then each camera's normalised frame -> layer4 [512, h, w] -> 1x1 projection
    /// [D, h, w] -> rows [h * w, D].
    void enqueue_tokens() {
        const int D = m_meta.config.dim_model;
        Context<B> ctx = m_exec.context();
        const Stream stream = m_exec.stream();
        float* tokens = m_tokens.data();
        m_latent_proj.forward(ctx, m_zero_latent.data(), tokens, 1);
        int row = 1;
        if (m_meta.state_dim > 0) {
            m_state_norm.apply(m_state_in.data(), m_state_in.data(), m_meta.state_dim, stream);
            m_state_proj.forward(ctx, m_state_in.data(), tokens + std::size_t(row++) * D, 1);
        }
        if (m_meta.env_dim > 0) {
            m_env_norm.apply(m_env_in.data(), m_env_in.data(), m_meta.env_dim, stream);
            m_env_proj.forward(ctx, m_env_in.data(), tokens + std::size_t(row++) * D, 1);
        }
        const int hw = m_feat_h * m_feat_w;
        for (std::size_t cam = 0; cam < m_meta.cameras.size(); ++cam) {
            const io::PolicyCamera& pc = m_meta.cameras[cam];
            ImageToTensorParams it;
            it.x = m_frames[cam].data();
            it.layout = m_layouts[cam];
            it.y = m_image.data();
            it.offset = m_cam_norm[cam].offset.data();
            it.denom = m_cam_norm[cam].denom.data();
            it.kind = m_cam_norm[cam].kind;
            it.channels = pc.channels;
            it.height = it.out_h = pc.height;
            it.width = it.out_w = pc.width;
            Ops<B>::image_to_tensor(it, stream);
            m_exec.workspace().reset();
            const View<float, B> feat{m_feat.data(), Shape{1, ResNet18Backbone<B>::kOutChannels, m_feat_h, m_feat_w}};
            m_backbone.forward(ctx, View<const float, B>{m_image.data(), Shape{1, pc.channels, pc.height, pc.width}}, feat);
            m_img_proj.forward(ctx, View<const float, B>{feat.data, feat.shape}, View<float, B>{m_proj.data(), Shape{1, D, m_feat_h, m_feat_w}});
            TransposeParams tp;
            tp.x = m_proj.data();
            tp.y = tokens + (std::size_t(m_n_1d) + cam * std::size_t(hw)) * D;
            tp.rows = D;
            tp.cols = hw;
            Ops<B>::transpose(tp, stream);
        }
    }

    ActScratch scratch() {
        return {.attn = {.q = m_q.data(), .k = m_k.data(), .v = m_v.data(), .heads = m_heads.data()},
                .sum = m_sum.data(), .normed = m_normed.data(), .branch = m_branch.data(), .hidden = m_hidden.data()};
    }

    /// The encoder layers over m_tokens in place (and the final LayerNorm of a pre-norm encoder).
    void enqueue_encoder() {
        Context<B> ctx = m_exec.context();
        const ActScratch s = scratch();
        for (const ActEncoderLayer<B>& layer : m_encoder) layer.forward(ctx, m_tokens.data(), m_pos.data(), m_n_tokens, s);
        if (m_meta.config.pre_norm) m_encoder_norm.forward(ctx, m_tokens.data(), nullptr, m_tokens.data(), m_n_tokens);
    }

    /// The decoder over zero queries with the learned decoder position embedding (keys see the encoder's embedding),
    /// its final LayerNorm and the action head into m_chunk.
    void enqueue_decoder() {
        const ActConfig& c = m_meta.config;
        const int D = c.dim_model, C = c.chunk_size, S = m_n_tokens;
        Context<B> ctx = m_exec.context();
        const ActScratch s = scratch();
        act_detail::add_rows(ctx, m_tokens.data(), m_pos.data(), m_memory_keys.data(), S, D);
        Memory<B>::fill_zero(m_queries.data(), m_queries.bytes(), m_exec.stream());
        for (const ActDecoderLayer<B>& layer : m_decoder)
            layer.forward(ctx, m_queries.data(), m_dec_pos.f32(), C, m_memory_keys.data(), m_tokens.data(), S, s);
        m_decoder_norm.forward(ctx, m_queries.data(), nullptr, m_queries.data(), C);
        m_action_head.forward(ctx, m_queries.data(), m_chunk.data(), C);
    }

    /// ACTTemporalEnsembler.update with the chunk in m_chunk_host, in float32 as torch does; returns the consumed
    /// first row (normalised). Rows held: the running averages of the future steps, each with its count.
    const float* ensemble_update() {
        const std::size_t C = std::size_t(m_meta.config.chunk_size), A = std::size_t(m_meta.action_dim);
        if (m_ens_len == 0) {
            std::copy(m_chunk_host.begin(), m_chunk_host.end(), m_ens.begin());
            std::fill(m_ens_count.begin(), m_ens_count.end(), 1);
        } else {
            for (std::size_t i = 0; i + 1 < C; ++i) {
                const int n = m_ens_count[i];
                for (std::size_t d = 0; d < A; ++d) {
                    float& e = m_ens[i * A + d];
                    e *= m_ens_cumsum[std::size_t(n - 1)];
                    e += m_chunk_host[i * A + d] * m_ens_w[std::size_t(n)];
                    e /= m_ens_cumsum[std::size_t(n)];
                }
                m_ens_count[i] = std::min(n + 1, int(C));
            }
            std::copy_n(m_chunk_host.begin() + std::ptrdiff_t((C - 1) * A), A, m_ens.begin() + std::ptrdiff_t((C - 1) * A));
            m_ens_count[C - 1] = 1;
        }
        // Consume the first row: it goes to m_queue's front, the rest shift up one row.
        std::copy_n(m_ens.begin(), A, m_queue.begin());
        std::copy(m_ens.begin() + std::ptrdiff_t(A), m_ens.end(), m_ens.begin());
        std::copy(m_ens_count.begin() + 1, m_ens_count.end(), m_ens_count.begin());
        m_ens_len = C - 1;
        return m_queue.data();
    }

    using Execution = ModelExecution<B, 1>;
    static constexpr std::size_t kMaxCameras = 32;  ///< bits of the graph key (one frame layout per camera)

    // Declared first, destroyed last: the stream outlives every graph and buffer that used it.
    std::unique_ptr<void, StreamRelease> m_priority_stream;
    io::LeRobotActFolder m_meta;
    int m_n_1d = 1, m_n_tokens = 0, m_feat_h = 0, m_feat_w = 0;
    ResNet18Backbone<B> m_backbone;
    Conv2d<B> m_img_proj;
    Linear<B> m_latent_proj, m_state_proj, m_env_proj, m_action_head;
    Parameter<B> m_dec_pos;
    std::vector<ActEncoderLayer<B>> m_encoder;
    std::vector<ActDecoderLayer<B>> m_decoder;
    LayerNorm<B> m_encoder_norm, m_decoder_norm;
    std::vector<Buffer<std::byte, B>> m_frames;  ///< per camera: the uploaded frame (float CHW size: fits either layout)
    ImageLayout m_layouts[kMaxCameras]{};         ///< per camera: the layout of the uploaded frame
    std::vector<FeatureNormBuffers<B>> m_cam_norm;
    FeatureNormBuffers<B> m_state_norm, m_env_norm;
    Buffer<float, B> m_image, m_feat, m_proj, m_tokens, m_pos, m_memory_keys, m_queries, m_zero_latent, m_state_in, m_env_in;
    Buffer<float, B> m_q, m_k, m_v, m_heads, m_sum, m_normed, m_branch, m_hidden, m_chunk;
    std::vector<float> m_chunk_host, m_queue;
    std::vector<float> m_ens, m_ens_w, m_ens_cumsum;
    std::vector<int> m_ens_count;
    std::size_t m_ens_len = 0;
    int m_queue_len = 0, m_queue_pos = 0, m_chunk_index = 0;
    bool m_was_reset = false;
    Execution m_exec;
};

}  // namespace flowedge
