// torch.nn.Linear on any backend: the weight keeps its storage dtype and is widened on the fly.
#pragma once
#include <concepts>
#include <string>
#include <type_traits>

#include "flowedge/cpu/kernels_packed.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

namespace detail {
/// Linear<B>'s packed-copy slot on backends other than the CPU: nothing.
struct NoPackedLinear {};
}  // namespace detail

/// torch.nn.Linear(in, out, bias): y = act(x @ weight^T + bias).
/// x: [rows, in] (row stride ld_x), y: [rows, out] (row stride ld_y); weight: [out, in]; bias: [out].
template <Backend B>
class Linear {
public:
    struct Config {
        int in = 0;
        int out = 0;
        bool bias = true;
        /// Storage::StreamedMatrix for the weight (CPU: packed like a kernel-1 Conv1d). For linears run at a row or
        /// two on weights that come from DRAM every call; forward() then needs contiguous rows and no accumulate.
        bool streamed = false;
    };

    Linear() = default;
    explicit Linear(Config cfg) : m_cfg(cfg) {}

    const Config& config() const { return m_cfg; }

    /// Lists ("weight", [out, in]) and ("bias", [out]) as in the PyTorch state dict.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.out, m_cfg.in}, m_cfg.streamed ? Storage::StreamedMatrix : Storage::Matrix);
        if (m_cfg.bias) f("bias", m_bias, Shape{m_cfg.out}, Storage::Vector);
    }

    /// The op parameters of forward(x, y, rows, ...) without running it (e.g. to gather several linears into one
    /// Ops<B>::linear_batch). x: [rows, in] (row stride ld_x, 0 = in); y: [rows, out] (row stride ld_y, 0 = out).
    LinearParams params(const float* x, float* y, int rows, Activation act = Activation::None, bool accumulate = false,
                        int ld_x = 0, int ld_y = 0) const {
        LinearParams p;
        p.x = x;
        p.w = m_weight.ref();
        p.bias = m_cfg.bias ? m_bias.f32() : nullptr;
        p.y = y;
        p.rows = rows;
        p.in = m_cfg.in;
        p.out = m_cfg.out;
        p.ld_x = ld_x;
        p.ld_y = ld_y;
        p.act = act;
        p.accumulate = accumulate;
        return p;
    }

    /// y[r, :] = act(x[r, :] @ weight^T + bias) (+ y[r, :] when accumulate) for `rows` rows.
    /// On the CPU with a packed copy that serves ctx.math (pack_for_small_batches), the packed axpy kernels run
    /// (cpu/kernels_packed.hpp: each output summed sequentially over k, so a row's result does not depend on the
    /// row count); otherwise Ops<B>::linear.
    void forward(Context<B>& ctx, const float* x, float* y, int rows, Activation act = Activation::None,
                 bool accumulate = false, int ld_x = 0, int ld_y = 0) const {
        LinearParams p = params(x, y, rows, act, accumulate, ld_x, ld_y);
        p.math = ctx.math;
        if constexpr (std::same_as<B, Cpu>) {
            if (m_packed.serves(p.math)) {
                m_packed.linear(p);
                return;
            }
        }
        Ops<B>::linear(p, ctx.stream);
    }

    /// Opt-in, CPU only (a no-op on other backends and in builds without AVX2/AVX-512): keeps a k-major packed copy
    /// of the weight for small row counts (decode, flow solves, short prefills), packed for arithmetic m. Call after
    /// the weights are bound (load time: this allocates packed_bytes() of host memory once); the bound weight data
    /// must stay alive (set_packed_math repacks from it).
    void pack_for_small_batches(MathMode m = MathMode::F32) {
        if (m_weight.packed()) fail("linear", "pack_for_small_batches on a streamed weight (already in the Conv1d block layout)");
        if constexpr (std::same_as<B, Cpu>) m_packed.pack(m_weight.ref(), m_cfg.in, m_cfg.out, m);
    }
    /// Readies the packed copy (if any) for forward() calls with ctx.math = m: repacks in place when m needs another
    /// layout (F32/F16 weights: BF16-rounded pairs under MathMode::BF16). No allocation. Models call it from their
    /// set_math; a forward() whose ctx.math the packed copy does not serve runs Ops<B>::linear instead.
    void set_packed_math(MathMode m) {
        if constexpr (std::same_as<B, Cpu>) m_packed.set_math(m);
    }
    /// Host bytes of the packed copy (0 when none).
    std::size_t packed_bytes() const {
        if constexpr (std::same_as<B, Cpu>) return m_packed.bytes();
        else return 0;
    }

    const Parameter<B>& weight() const { return m_weight; }
    std::int64_t n_parameters() const { return std::int64_t(m_cfg.in) * m_cfg.out + (m_cfg.bias ? m_cfg.out : 0); }

private:
    Config m_cfg{};
    Parameter<B> m_weight;
    Parameter<B> m_bias;
    [[no_unique_address]] std::conditional_t<std::same_as<B, Cpu>, cpu::PackedLinear, detail::NoPackedLinear> m_packed;
};

}  // namespace flowedge
