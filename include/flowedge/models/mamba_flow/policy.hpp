// The Mamba + flow-matching policy: token prefix -> backbone prefill -> last hidden row -> flow solve,
// loaded from one mamba_flow.safetensors where either part may be absent.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <span>

#include "flowedge/models/mamba_flow/flow_head.hpp"
#include "flowedge/models/mamba_flow/mamba.hpp"

namespace flowedge {

/// Mamba backbone + flow head from one checkpoint (docs/formats.md#mamba-flow-checkpoint). A backbone-only file
/// gives hidden states, a head-only file samples from an external condition; act() needs both, and then
/// the head's condition width Cd must equal the backbone's d_model (checked at load).
template <Backend B>
class MambaFlowPolicy {
public:
    MambaFlowPolicy(MambaFlowPolicy&&) noexcept = default;
    MambaFlowPolicy& operator=(MambaFlowPolicy&&) noexcept = default;

    /// Loads whatever parts `path` holds (at least one). max_tokens bounds a prefill, max_batch a flow solve.
    static MambaFlowPolicy load(const std::filesystem::path& path, const LoadOptions& opts = {}, int max_tokens = 512,
                                int max_batch = 1) {
        return load(io::SafeTensors::open(path), opts, max_tokens, max_batch);
    }
    static MambaFlowPolicy load(std::shared_ptr<const io::SafeTensors> file, const LoadOptions& opts = {},
                                int max_tokens = 512, int max_batch = 1) {
        MambaFlowPolicy p;
        if (Mamba<B>::find_prefix(*file)) p.m_backbone.emplace(Mamba<B>::load(file, opts, max_tokens));
        if (FlowHead<B>::present(*file)) p.m_head.emplace(FlowHead<B>::load(file, opts, max_batch));
        if (!p.m_backbone && !p.m_head)
            fail(ErrorKind::BadFile, "mamba_flow", file->path().string() +
                                   ": neither a backbone nor a flow head (expected 'backbone.embeddings.weight' or 'flow.in_proj.weight')");
        if (p.m_backbone && p.m_head && p.m_head->config().cond_dim != p.m_backbone->config().d_model)
            fail(ErrorKind::BadFile, "mamba_flow", "flow head condition width must equal the backbone width" +
                                   expected_got(p.m_backbone->config().d_model, p.m_head->config().cond_dim));
        return p;
    }

    bool has_backbone() const { return m_backbone.has_value(); }
    bool has_head() const { return m_head.has_value(); }

    /// The backbone; an Error for a head-only file.
    Mamba<B>& backbone() {
        if (!m_backbone) fail(ErrorKind::Unsupported, "mamba_flow", "this checkpoint has no backbone (head-only file)");
        return *m_backbone;
    }
    /// The flow head; an Error for a backbone-only file.
    FlowHead<B>& head() {
        if (!m_head) fail(ErrorKind::Unsupported, "mamba_flow", "this checkpoint has no flow head (backbone-only file)");
        return *m_head;
    }

    /// Arithmetic of every projection of both parts (Mamba<B>::set_math, FlowHead<B>::set_math; default
    /// MathMode::F32 = exact, BF16 an opt-in with the per-projection bound stated there). Validated like
    /// DiffusionHead::set_math; an Error during an active flow solve. Applies to whichever parts the file has.
    void set_math(MathMode m) {
        check_math_mode(m, "mamba_flow");
        if (m_head) m_head->set_math(m);  // first: the only one that can refuse (active solve)
        if (m_backbone) m_backbone->set_math(m);
    }
    MathMode math() const { return m_head ? m_head->math() : m_backbone->math(); }

    /// Bytes of both parts' prepared projection weights (the backend's small-row copies; 0 when none).
    std::size_t prepared_bytes() const {
        return (m_backbone ? m_backbone->prepared_bytes() : 0) + (m_head ? m_head->prepared_bytes() : 0);
    }

    /// Action width A of the head.
    int action_dim() { return head().config().action_dim; }

    /// One action chunk per noise row: prefill(tokens) (state reset first; Mamba::prefill_last_device, which skips the
    /// last layer's out_proj and the final norm for all but the last row), condition = last hidden row,
    /// then a flow solve. tokens: [L]; noise, out: [batch, A] (host), batch <= max_batch; every row shares the condition.
    void act(std::span<const std::int32_t> tokens, std::span<const float> noise, std::span<float> out, Solver solver,
             int steps) {
        Mamba<B>& m = backbone();
        FlowHead<B>& h = head();
        const int A = h.config().action_dim;
        if (!(!noise.empty() && noise.size() % std::size_t(A) == 0)) [[unlikely]]
            fail(ErrorKind::BadShape, "mamba_flow", "noise must be [batch, action_dim]" + expected_got("a multiple of " + std::to_string(A), noise.size()));
        const int batch = int(noise.size() / std::size_t(A));
        m_last_act_fused = batch == 1 && m_fused_act && act_fused(tokens, noise, out, solver, steps);
        if (m_last_act_fused) return;
        const float* last = m.prefill_last_device(tokens);  // only the last row feeds the head
        h.begin_device(last, noise, solver, steps, batch, /*cond_stride=*/0);  // every row reads the same condition
        h.advance(steps);
        h.result(out);
    }

    /// Opt-in: lets a batch-1 act() at F32 math run as the backend's fused op (CUDA: the state reset, the prefill, the
    /// condition and every solver step in one thread-block cluster launch, tokens and noise passed by value;
    /// Ops<Cuda>::mamba_flow_act), built to give the per-op path's action, state and hidden row bit for bit
    /// (test/cuda/test_cuda_models.cpp). Off by default until a GPU run has confirmed it. Where the op does not apply
    /// (batch > 1, BF16 math, a prefix over 16 tokens, more than 64 steps, ...) act() takes the per-op path.
    void set_fused_act(bool on) { m_fused_act = on; }
    bool fused_act() const { return m_fused_act; }
    /// Whether the last act() ran as the fused op (with set_fused_act(true): false where the op did not apply, e.g.
    /// the layout outgrows the device's shared memory per block).
    bool last_act_fused() const { return m_last_act_fused; }

private:
    MambaFlowPolicy() = default;

    /// act() at batch 1 as the backend's fused op; false (nothing changed but validation) where it does not apply.
    bool act_fused(std::span<const std::int32_t> tokens, std::span<const float> noise, std::span<float> out, Solver solver,
                   int steps) {
        if constexpr (requires(const MambaFlowActParams& q) { Ops<B>::mamba_flow_act(q, Stream{}); }) {
            Mamba<B>& m = *m_backbone;
            FlowHead<B>& h = *m_head;
            MambaFlowActParams p;
            if (!m.fused_act_params(tokens, p) || !h.begin_fused_act(noise, solver, steps, p)) return false;
            // The time table begin_fused_act() may have just built is on the head's stream.
            if (h.stream().handle != m.stream().handle) Memory<B>::synchronize(h.stream());
            if (!Ops<B>::mamba_flow_act(p, m.stream())) {
                h.cancel();
                return false;
            }
            // The head copies the action back on its own stream: wait here only when that is another stream (the
            // copy back itself returns once the data is on the host).
            if (h.stream().handle != m.stream().handle) Memory<B>::synchronize(m.stream());
            // A non-finite action: the per-op path recomputes it and its result() names the step.
            return h.end_fused_act(out);
        } else {
            (void)tokens, (void)noise, (void)out, (void)solver, (void)steps;
            return false;
        }
    }


    std::optional<Mamba<B>> m_backbone;
    std::optional<FlowHead<B>> m_head;
    bool m_fused_act = false;  ///< set_fused_act
    bool m_last_act_fused = false;
};

}  // namespace flowedge
