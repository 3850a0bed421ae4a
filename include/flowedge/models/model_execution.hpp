// What every model does the same way around its network: the stream it enqueues on, the requested arithmetic, the
// scratch workspace allocated at load, the recorded graphs that both invalidate, and the moved-from check.
#pragma once
#include <array>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "flowedge/graph.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// "f32" / "tf32" / "bf16" (set_math of every model; the Python `math` property and the C API use these names).
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

/// Throws unless `m` is one of the defined MathMode values (a C or Python caller can pass any integer).
inline void check_math_mode(MathMode m, std::string_view component) {
    if (!(m == MathMode::F32 || m == MathMode::TF32 || m == MathMode::BF16)) [[unlikely]]
        fail(component, "unknown math mode" + expected_got("f32, tf32 or bf16", int(m)));
}

/// The execution state a model holds next to its layers: stream, MathMode, the workspace sized at load and
/// `NGraphs` recorded-graph caches (Graph<B>, one per kind of call the model replays). Changing the stream or the
/// math drops every recorded graph, since a capture bakes both in. A moved-from model has a workspace of capacity 0,
/// which is what check_live() refuses.
template <Backend B, std::size_t NGraphs>
class ModelExecution {
public:
    ModelExecution() = default;
    /// Allocates the workspace (`workspace_bytes` > 0) for `component`, the model's name in error messages.
    ModelExecution(std::string_view component, std::size_t workspace_bytes)
        : m_component(component), m_ws(workspace_bytes) {}

    ModelExecution(ModelExecution&&) noexcept = default;
    ModelExecution& operator=(ModelExecution&&) noexcept = default;

    Stream stream() const { return m_stream; }
    MathMode math() const { return m_math; }
    Workspace<B>& workspace() { return m_ws; }
    const Workspace<B>& workspace() const { return m_ws; }

    /// Ops run on `s` from now on; the recorded graphs are dropped (re-captured on the next call).
    void set_stream(Stream s) {
        m_stream = s;
        drop_graphs();
    }

    /// Switches the requested arithmetic to `m` (validated): prepares the backend for it (CUDA: creates the GEMM
    /// library handle now, not inside a graph capture) and drops the recorded graphs. Returns false, doing nothing,
    /// when `m` is already the current mode.
    bool switch_math(MathMode m) {
        check_math_mode(m, m_component);
        if (m == m_math) return false;
        Ops<B>::prepare_math(m);
        m_math = m;
        drop_graphs();
        return true;
    }

    /// Lets the contexts' GEMM-shaped ops run on the backend library's F32 GEMM under F32 math (Context::f32_gemm;
    /// the workspace must hold every convolution's backend scratch). CUDA: creates the library handle now, not
    /// inside a graph capture. Drops the recorded graphs.
    void use_f32_gemm(bool on) {
        if (on) Ops<B>::prepare_math(MathMode::F32);
        m_f32_gemm = on;
        drop_graphs();
    }
    bool f32_gemm() const { return m_f32_gemm; }

    /// Context whose ops take scratch from this model's workspace.
    Context<B> context() { return {m_stream, &m_ws, m_math, m_f32_gemm}; }
    /// Context for ops that take no scratch (layers such as Linear, which never touch the workspace).
    Context<B> context_without_scratch() const { return {m_stream, nullptr, m_math, m_f32_gemm}; }

    /// Enqueues `enqueue()` through recorded graph `g` under `key` (captured the first time, replayed after).
    template <class F>
    void run(std::size_t g, std::uint64_t key, F&& enqueue) {
        m_graphs[g].run(m_stream, key, std::forward<F>(enqueue));
    }

    void drop_graphs() {
        for (Graph<B>& g : m_graphs) g.reset();
    }

    /// Every public method that touches a model's buffers starts here: a moved-from model is an Error, not a crash.
    /// `model` names the type in the message ("DiffusionHead", "Mamba", ...).
    void check_live(const char* what, const char* model) const {
        if (m_ws.capacity() == 0) [[unlikely]]
            fail(m_component, std::string(what) + "() on a moved-from " + model +
                                  " (it holds no weights or buffers; use the object it was moved into)");
    }

private:
    std::string_view m_component;  ///< points at a string literal
    Stream m_stream{};
    MathMode m_math = MathMode::F32;
    bool m_f32_gemm = false;
    Workspace<B> m_ws;
    std::array<Graph<B>, NGraphs> m_graphs;
};

}  // namespace flowedge
