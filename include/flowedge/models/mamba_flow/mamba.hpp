// Mamba-1 backbone (token ids -> hidden states) over any backend: prefill, streaming decode and
// portable decode state, with every buffer allocated at load.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "flowedge/io/safetensors.hpp"
#include "flowedge/layers/embedding.hpp"
#include "flowedge/layers/mamba_mixer.hpp"
#include "flowedge/layers/rms_norm.hpp"
#include "flowedge/models/mamba_flow/state_format.hpp"
#include "flowedge/models/model_execution.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// Mamba-1 backbone, transformers MambaModel (embeddings -> n_layers x MambaBlock -> norm_f), docs/models.md#mamba-1-backbone.
/// Tensors `backbone.embeddings.weight [vocab, d_model]`, `backbone.layers.{i}.norm.weight`,
/// `backbone.layers.{i}.mixer.*`, `backbone.norm_f.weight` (a file without the `backbone.` prefix, as saved
/// from MambaModel itself, is accepted too). The configuration is read from the tensor shapes.
template <Backend B>
class Mamba {
public:
    /// Shapes read from the checkpoint.
    struct Config {
        int n_layers = 0;
        int d_model = 0;
        int d_inner = 0;
        int d_state = 0;
        int d_conv = 0;
        int dt_rank = 0;
        int vocab = 0;
        float eps = 1e-5f;
    };

    /// Version written into export_state() headers; import_state() accepts only this one (MambaStateFormat).
    static constexpr std::uint32_t kStateVersion = MambaStateFormat::kVersion;
    /// Bytes of the export_state() header that precedes the float payload.
    static constexpr std::size_t kStateHeaderBytes = MambaStateFormat::kHeaderBytes;

    Mamba(Mamba&&) noexcept = default;
    Mamba& operator=(Mamba&&) noexcept = default;

    /// The tensor-name prefix of the backbone in `file` ("backbone." or ""), or nullopt when there is none.
    static std::optional<std::string> find_prefix(const io::SafeTensors& file) {
        if (file.find("backbone.embeddings.weight")) return std::string("backbone.");
        if (file.find("embeddings.weight") && file.find("norm_f.weight")) return std::string();
        return std::nullopt;
    }

    /// Reads the configuration from tensor shapes under `prefix`, checking every shape for consistency.
    static Config read_config(const io::SafeTensors& file, const std::string& prefix) {
        auto need = [&](const std::string& key, int rank) -> const io::TensorInfo& {
            const io::TensorInfo* t = file.find(prefix + key);
            if (!t) fail(ErrorKind::BadFile, "mamba", file.path().string() + ": missing tensor '" + prefix + key + "'");
            if (t->shape.rank != rank)
                fail(ErrorKind::BadFile, "mamba", "tensor '" + prefix + key + "' has the wrong rank" + expected_got(rank, t->shape.rank));
            return *t;
        };
        Config c;
        const auto& emb = need("embeddings.weight", 2);
        c.vocab = int(emb.shape[0]);
        c.d_model = int(emb.shape[1]);
        while (file.find(prefix + "layers." + std::to_string(c.n_layers) + ".mixer.in_proj.weight")) ++c.n_layers;
        if (c.n_layers == 0) fail(ErrorKind::BadFile, "mamba", file.path().string() + ": no layers (expected '" + prefix + "layers.0.mixer.in_proj.weight')");
        const std::string l0 = "layers.0.mixer.";
        const auto& in_proj = need(l0 + "in_proj.weight", 2);
        if (in_proj.shape[0] % 2 != 0) fail(ErrorKind::BadFile, "mamba", "in_proj rows must be even (2*d_inner)" + expected_got("even", in_proj.shape[0]));
        c.d_inner = int(in_proj.shape[0] / 2);
        c.d_conv = int(need(l0 + "conv1d.weight", 3).shape[2]);
        c.d_state = int(need(l0 + "A_log", 2).shape[1]);
        c.dt_rank = int(need(l0 + "dt_proj.weight", 2).shape[1]);
        if (c.vocab <= 0 || c.d_model <= 0 || c.d_inner <= 0 || c.d_state <= 0 || c.d_conv < 1 || c.dt_rank <= 0)
            fail(ErrorKind::BadFile, "mamba", "degenerate shapes in " + file.path().string());
        return c;
    }

    /// Loads the backbone from a safetensors file. `max_tokens` bounds one prefill (all scratch is sized for it).
    static Mamba load(const std::filesystem::path& path, const LoadOptions& opts = {}, int max_tokens = 512) {
        return load(io::SafeTensors::open(path), opts, max_tokens);
    }

    /// Loads the backbone from an opened file (shared with other heads loading from the same file).
    static Mamba load(std::shared_ptr<const io::SafeTensors> file, const LoadOptions& opts = {}, int max_tokens = 512) {
        auto prefix = find_prefix(*file);
        if (!prefix) fail(ErrorKind::BadFile, "mamba", file->path().string() + ": no backbone (expected tensor 'backbone.embeddings.weight')");
        return Mamba(file, *prefix, opts, max_tokens);
    }

    const Config& config() const { return m_cfg; }
    int max_tokens() const { return m_max_tokens; }
    /// Identifier of the loaded weights (hash of tensor names, shapes and sampled bytes); part of exported state.
    std::uint64_t model_id() const { return m_model_id; }
    /// Stream every op is enqueued on (default stream unless set).
    void set_stream(Stream s) { m_exec.set_stream(s); }

    /// Arithmetic of the projections (in_proj, x_proj, dt_proj, out_proj of every layer), default MathMode::F32 =
    /// exact. BF16 is an opt-in: backends with a BF16 linear path (Ops<Cpu>::linear with vdpbf16ps; others where
    /// implemented) round each product's activation row to BF16 (RNE, u = 2^-8) and multiply it with the weights in
    /// BF16 (F32 weights rounded too) with float accumulation, so each projection output is within about
    /// (2u + u^2) * sum_i |w_i| |x_i| of the exact one; a backend or shape without such a path computes exactly.
    /// TF32 is accepted (the GPU's tensor-core mode where a backend has it) and is exact on the CPU. The scan, conv
    /// and norms always run in float. Changing it drops the recorded graphs (re-captured on the next call; no
    /// allocation). Results stay deterministic in every mode. End-to-end bound: test/mamba_flow/test_math.cpp.
    void set_math(MathMode m) {
        if (!m_exec.switch_math(m)) return;
        for (Layer& l : m_layers) l.mixer.set_math(m);  // prepared weights: in place, no allocation
    }
    MathMode math() const { return m_exec.math(); }

    /// Bytes of the projections' prepared weights (the backend's small-row copies made at load; 0 when none).
    std::size_t prepared_bytes() const {
        std::size_t n = 0;
        for (const Layer& l : m_layers) n += l.mixer.prepared_bytes();
        return n;
    }

    /// Scratch bytes for a prefill of up to `max_tokens` tokens (the workspace allocated at load).
    std::size_t workspace_bytes(int max_tokens) const {
        return Workspace<B>::template bytes_for<float>(std::size_t(max_tokens) * m_cfg.d_model) +
               (m_layers.empty() ? 0 : m_layers[0].mixer.workspace_bytes(max_tokens));
    }

    /// Runs the whole sequence from a fresh state (the state is reset first); afterwards the state holds the
    /// sequence, so step() continues it. tokens: [L], 1 <= L <= max_tokens; hidden: [L, d_model] (host).
    /// Matches MambaModel(input_ids).last_hidden_state[0].
    void prefill(std::span<const std::int32_t> tokens, std::span<float> hidden) {
        check_live("prefill");
        check_length(tokens.size());
        if (!(hidden.size() >= tokens.size() * std::size_t(m_cfg.d_model))) [[unlikely]]
            fail("mamba", "prefill output too small" + expected_got(tokens.size() * std::size_t(m_cfg.d_model), hidden.size()));
        const float* out = prefill_device(tokens);
        Memory<B>::copy_to_host(hidden.data(), out, tokens.size() * std::size_t(m_cfg.d_model) * sizeof(float), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
    }

    /// Decodes one more token: hidden: [d_model] (host), the final-norm hidden state of that token.
    void step(std::int32_t token, std::span<float> hidden) {
        check_live("step");
        if (!(hidden.size() >= std::size_t(m_cfg.d_model))) [[unlikely]]
            fail("mamba", "step output too small" + expected_got(m_cfg.d_model, hidden.size()));
        const float* out = step_device(token);
        Memory<B>::copy_to_host(hidden.data(), out, std::size_t(m_cfg.d_model) * sizeof(float), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
    }

    /// prefill() leaving the result on the backend: returns hidden [L, d_model] in backend memory, valid
    /// until the next call. Enqueued on the model's stream (not synchronized).
    const float* prefill_device(std::span<const std::int32_t> tokens) {
        check_live("prefill");
        check_length(tokens.size());
        const int L = int(tokens.size());
        validate_tokens(tokens);
        Memory<B>::copy_from_host(m_ids.data(), tokens.data(), tokens.size() * sizeof(std::int32_t), m_exec.stream());
        m_exec.run(kPrefillGraph, std::uint64_t(L), [this, L] {
            Memory<B>::fill_zero(m_state.data(), m_state.bytes(), m_exec.stream());
            forward(L);
        });
        return m_out.data();
    }

    /// prefill_device() for callers that need only the LAST token's hidden row (MambaFlowPolicy::act's condition):
    /// every layer still runs on all L tokens (the conv and scan states need them), but the last layer's out_proj
    /// residual and the final norm run on the last row only. Returns hidden [d_model] of token L-1 in backend memory,
    /// valid until the next call; the decode state afterwards equals prefill_device's. On the CPU the row equals
    /// prefill_device's last row bit for bit (the packed projections do not depend on the row count).
    const float* prefill_last_device(std::span<const std::int32_t> tokens) {
        check_live("prefill");
        check_length(tokens.size());
        const int L = int(tokens.size());
        validate_tokens(tokens);
        Memory<B>::copy_from_host(m_ids.data(), tokens.data(), tokens.size() * sizeof(std::int32_t), m_exec.stream());
        m_exec.run(kPrefillLastGraph, std::uint64_t(L), [this, L] {
            Memory<B>::fill_zero(m_state.data(), m_state.bytes(), m_exec.stream());
            forward(L, /*last_only=*/true);
        });
        return m_out.data() + std::size_t(L - 1) * std::size_t(m_cfg.d_model);
    }

    /// step() leaving the result on the backend: returns hidden [d_model] in backend memory.
    const float* step_device(std::int32_t token) {
        check_live("step");
        validate_tokens(std::span<const std::int32_t>(&token, 1));
        Memory<B>::copy_from_host(m_ids.data(), &token, sizeof(std::int32_t), m_exec.stream());
        m_exec.run(kStepGraph, 1, [this] { forward(1); });
        return m_out.data();
    }

    /// Forgets the sequence: zero conv and ssm state (the next step() starts a new sequence).
    /// The backbone part of a fused Mamba-flow action (MambaFlowActParams, Ops<B>::mamba_flow_act): a prefill of
    /// `tokens` from a reset as prefill_last_device() computes it; the op writes the state and the last hidden row
    /// (prefill_last_device's result). Tokens are validated; false (p partly filled) where the op cannot take this
    /// backbone: math other than F32, a tensor not stored as F32, more layers or tokens than the op's limits.
    bool fused_act_params(std::span<const std::int32_t> tokens, MambaFlowActParams& p) {
        check_live("prefill");
        check_length(tokens.size());
        validate_tokens(tokens);
        const int L = int(tokens.size());
        if (math() != MathMode::F32 || m_cfg.n_layers > kMambaActMaxLayers || L > kMambaActMaxTokens) return false;
        auto f32 = [](const Parameter<B>& q) { return q.dtype() == DType::F32 ? static_cast<const float*>(q.ref().data) : nullptr; };
        p.embedding = f32(m_embedding.weight());
        p.norm_f = f32(m_norm_f.weight());
        if (!p.embedding || !p.norm_f) return false;
        p.hidden = m_out.data() + std::size_t(L - 1) * std::size_t(m_cfg.d_model);
        const std::size_t per_layer = m_layers[0].mixer.state_floats();
        for (int i = 0; i < m_cfg.n_layers; ++i) {
            const Layer& layer = m_layers[std::size_t(i)];
            float* conv_state = m_state.data() + std::size_t(i) * per_layer;
            MambaLayerTensors& t = p.layers[i];
            unsigned vec = 0;
            if (!layer.mixer.fused_tensors(t, vec, conv_state, conv_state + layer.mixer.conv_state_floats())) return false;
            t.norm = f32(layer.norm.weight());
            if (!t.norm) return false;
            p.vec_mask |= vec << (4 * i);
        }
        p.n_layers = m_cfg.n_layers;
        p.d_model = m_cfg.d_model;
        p.d_inner = m_cfg.d_inner;
        p.d_state = m_cfg.d_state;
        p.d_conv = m_cfg.d_conv;
        p.dt_rank = m_cfg.dt_rank;
        p.eps = m_cfg.eps;
        p.n_tokens = L;
        std::copy(tokens.begin(), tokens.end(), p.tokens);
        return true;
    }
    Stream stream() const { return m_exec.stream(); }

    void reset() {
        check_live("reset");
        Memory<B>::fill_zero(m_state.data(), m_state.bytes(), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
    }

    /// Bytes export_state() writes: header plus n_layers x (conv [d_conv-1, d_inner] + ssm [d_inner, d_state]) floats.
    std::size_t state_bytes() const { return kStateHeaderBytes + m_state.bytes(); }

    /// Serialises the decode state (versioned header, shape fingerprint, model id, FNV-1a checksum). Allocates
    /// the returned vector; use the span overload to stay allocation-free.
    std::vector<std::byte> export_state() const {
        std::vector<std::byte> out(state_bytes());
        export_state(std::span<std::byte>(out));
        return out;
    }

    /// Serialises the decode state into `out` (at least state_bytes() bytes); returns the bytes written.
    std::size_t export_state(std::span<std::byte> out) const {
        check_live("export_state");
        if (!(out.size() >= state_bytes())) [[unlikely]]
            fail("mamba", "export_state buffer too small" + expected_got(state_bytes(), out.size()));
        std::byte* payload = out.data() + kStateHeaderBytes;
        Memory<B>::copy_to_host(payload, m_state.data(), m_state.bytes(), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
        MambaStateHeader h = state_header();
        h.checksum = detail::fnv1a(payload, m_state.bytes());
        MambaStateFormat::write(h, out.data());
        return state_bytes();
    }

    /// Restores a state written by export_state() of the same model. Rejects (flowedge::Error, state unchanged)
    /// bad magic, another version, another shape or model, a wrong size or a checksum mismatch.
    void import_state(std::span<const std::byte> in) {
        check_live("import_state");
        MambaStateFormat::check(in, state_header());
        const std::byte* payload = in.data() + kStateHeaderBytes;
        Memory<B>::copy_from_host(m_state.data(), payload, m_state.bytes(), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
    }

    /// Lists every parameter with its PyTorch state-dict name relative to the backbone prefix.
    template <class F>
    void visit_parameters(F&& f) {
        auto sub = [&f](std::string prefix) {
            return [&f, prefix](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f(prefix + n, p, s, st); };
        };
        m_embedding.visit_parameters(sub("embeddings."));
        for (int i = 0; i < m_cfg.n_layers; ++i) {
            const std::string l = "layers." + std::to_string(i) + ".";
            m_layers[std::size_t(i)].norm.visit_parameters(sub(l + "norm."));
            m_layers[std::size_t(i)].mixer.visit_parameters(sub(l + "mixer."));
        }
        m_norm_f.visit_parameters(sub("norm_f."));
    }

private:
    struct Layer {
        RmsNorm<B> norm;
        MambaMixer<B> mixer;
    };

    /// The graphs this model replays, one per kind of call.
    enum GraphKind : std::size_t { kPrefillGraph, kPrefillLastGraph, kStepGraph, kGraphKinds };
    using Execution = ModelExecution<B, kGraphKinds>;

    /// This model's state header (shape fingerprint, model id, payload size; checksum left 0).
    MambaStateHeader state_header() const {
        MambaStateHeader h;
        h.n_layers = std::uint32_t(m_cfg.n_layers);
        h.d_model = std::uint32_t(m_cfg.d_model);
        h.d_inner = std::uint32_t(m_cfg.d_inner);
        h.d_state = std::uint32_t(m_cfg.d_state);
        h.d_conv = std::uint32_t(m_cfg.d_conv);
        h.dt_rank = std::uint32_t(m_cfg.dt_rank);
        h.model_id = m_model_id;
        h.payload_bytes = m_state.bytes();
        return h;
    }

    Mamba(const std::shared_ptr<const io::SafeTensors>& file, const std::string& prefix, const LoadOptions& opts,
          int max_tokens)
        : m_cfg(read_config(*file, prefix)), m_max_tokens(max_tokens) {
        if (max_tokens < 1) fail("mamba", "max_tokens must be positive" + expected_got(">= 1", max_tokens));
        m_embedding = Embedding<B>({.vocab = m_cfg.vocab, .dim = m_cfg.d_model});
        m_norm_f = RmsNorm<B>({.dim = m_cfg.d_model, .eps = m_cfg.eps});
        m_layers.reserve(std::size_t(m_cfg.n_layers));
        const typename MambaMixer<B>::Config mc{.d_model = m_cfg.d_model, .d_inner = m_cfg.d_inner,
                                                .d_state = m_cfg.d_state, .d_conv = m_cfg.d_conv, .dt_rank = m_cfg.dt_rank};
        for (int i = 0; i < m_cfg.n_layers; ++i)
            m_layers.push_back(Layer{RmsNorm<B>({.dim = m_cfg.d_model, .eps = m_cfg.eps}), MambaMixer<B>(mc)});

        bind_parameters<B>(m_embedding, file, prefix + "embeddings.", opts, "mamba");
        for (int i = 0; i < m_cfg.n_layers; ++i) {
            const std::string l = prefix + "layers." + std::to_string(i) + ".";
            bind_parameters<B>(m_layers[std::size_t(i)].norm, file, l + "norm.", opts, "mamba");
            m_layers[std::size_t(i)].mixer.load(file, l + "mixer.", opts);
        }
        bind_parameters<B>(m_norm_f, file, prefix + "norm_f.", opts, "mamba");
        m_model_id = compute_model_id(*file, prefix);

        const std::size_t rows = std::size_t(max_tokens), dm = std::size_t(m_cfg.d_model);
        m_ids = Buffer<std::int32_t, B>(rows);
        m_h = Buffer<float, B>(rows * dm);
        m_out = Buffer<float, B>(rows * dm);
        m_state = Buffer<float, B>(std::size_t(m_cfg.n_layers) * m_layers[0].mixer.state_floats());
        m_exec = Execution("mamba", workspace_bytes(max_tokens));
        reset();
    }

    /// Hash of the backbone tensors' names, dtypes, shapes and (up to) the first and last 4 KiB of each.
    std::uint64_t compute_model_id(const io::SafeTensors& file, const std::string& prefix) {
        std::uint64_t h = detail::kFnvOffset;
        visit_parameters([&](const std::string& name, Parameter<B>&, const Shape&, Storage) {
            const io::TensorInfo* t = file.find(prefix + name);
            h = detail::fnv1a(name.data(), name.size(), h);
            h = detail::fnv1a(&t->shape.dims, sizeof t->shape.dims, h);
            const std::size_t bytes = std::size_t(t->shape.numel()) * dtype_size(t->dtype);
            const auto* p = static_cast<const std::byte*>(t->data);
            const std::size_t head = std::min<std::size_t>(bytes, 4096);
            h = detail::fnv1a(p, head, h);
            if (bytes > head) h = detail::fnv1a(p + bytes - std::min<std::size_t>(bytes - head, 4096), std::min<std::size_t>(bytes - head, 4096), h);
        });
        return h;
    }

    void check_live(const char* what) const { m_exec.check_live(what, "Mamba"); }

    void check_length(std::size_t n) const {
        if (n == 0 || n > std::size_t(m_max_tokens))
            fail("mamba", "prefill length out of range" + expected_got("1.." + std::to_string(m_max_tokens), std::to_string(n)));
    }

    void validate_tokens(std::span<const std::int32_t> tokens) const {
        for (std::size_t i = 0; i < tokens.size(); ++i) {
            if (tokens[i] < 0 || tokens[i] >= m_cfg.vocab) [[unlikely]]
                fail("mamba", "token id out of range at position " + std::to_string(i) +
                                  expected_got("0 <= id < " + std::to_string(m_cfg.vocab), tokens[i]));
        }
    }

    /// Embedding -> layers (continuing from m_state) -> norm_f for L tokens already in m_ids; result in m_out.
    /// last_only: the last layer adds its mixer output to the last row of m_h only and norm_f runs on that row only
    /// (m_out row L-1 is the result; the other rows of m_h/m_out are left stale, and they are not state).
    void forward(int L, bool last_only = false) {
        Context<B> ctx = m_exec.context();
        m_exec.workspace().reset();
        float* n = m_exec.workspace().template take<float>(Shape{L, m_cfg.d_model}).data;
        m_embedding.forward(ctx, m_ids.data(), m_h.data(), L);
        const std::size_t per_layer = m_layers[0].mixer.state_floats();
        for (int i = 0; i < m_cfg.n_layers; ++i) {
            const Layer& layer = m_layers[std::size_t(i)];
            float* conv_state = m_state.data() + std::size_t(i) * per_layer;
            float* ssm_state = conv_state + layer.mixer.conv_state_floats();
            layer.norm.forward(ctx, m_h.data(), n, L);
            const bool last_layer = i == m_cfg.n_layers - 1;
            layer.mixer.forward(ctx, n, m_h.data(), L, conv_state, ssm_state, last_only && last_layer ? L - 1 : 0);
        }
        const std::size_t r0 = last_only ? std::size_t(L - 1) * std::size_t(m_cfg.d_model) : 0;
        m_norm_f.forward(ctx, m_h.data() + r0, m_out.data() + r0, last_only ? 1 : L);
    }

    Config m_cfg{};
    int m_max_tokens = 0;
    std::uint64_t m_model_id = 0;
    Embedding<B> m_embedding;
    std::vector<Layer> m_layers;
    RmsNorm<B> m_norm_f;
    Buffer<std::int32_t, B> m_ids;
    Buffer<float, B> m_h, m_out, m_state;
    Execution m_exec;
};

}  // namespace flowedge
