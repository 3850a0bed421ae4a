// Ops<Cpu>: every primitive of op_params.hpp on the host, header-only, synchronous and allocation-free. This file is
// the table: each op checks its arguments, then runs in the process's kernel set (cpu/kernels.hpp, picked by CPUID
// in cpu/isa.hpp); which kernel runs for which weight is decided here and in cpu/weights.hpp. Scratch (im2col
// panels, partial sums) lives in fixed arrays on the calling thread's stack; nothing touches the heap.
#pragma once
#include <concepts>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "flowedge/cpu/kernels.hpp"
#include "flowedge/cpu/memory.hpp"
#include "flowedge/cpu/weights.hpp"
#include "flowedge/error.hpp"
#include "flowedge/op_checks.hpp"
#include "flowedge/op_params.hpp"
#include "flowedge/op_params_transformer.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/weights.hpp"

/// Throws flowedge::Error("flowedge: cpu <op>: <msg>") unless cond; the message is only built on failure.
#define FLOWEDGE_CPU_REQUIRE(cond, op, msg)                                     \
    do {                                                                        \
        if (!(cond)) [[unlikely]] ::flowedge::fail(std::string("cpu ") + (op), (msg)); \
    } while (0)

namespace flowedge {

/// Host backend: header-only, runs synchronously on the calling thread (plus OpenMP workers for the
/// large weight-streaming ops), never allocates. Stream arguments are ignored.
/// A (constrained) partial specialization rather than Ops<Cpu> spelled out, so that it is a class template
/// specialization: a member is instantiated only where it is used, and a project can compile all of them once
/// (FLOWEDGE_CPU_OPS_EXTERN below).
template <Backend B>
    requires std::same_as<B, Cpu>
struct Ops<B> {
    /// The weight-preparation hook: the layout this process's kernel set wants for a bound tensor (cpu/weights.hpp),
    /// or null to read it as stored. Load time only.
    static std::unique_ptr<PreparedWeight> prepare_weight(Storage s, const WeightRef& w, const Shape& shape, std::string_view what,
                                                          WeightQuant q = WeightQuant::None) {
        return cpu::prepare_weight(s, w, shape, what, q);
    }

    /// torch.nn.Linear with fused bias, activation and optional accumulate (see LinearParams).
    static void linear(const LinearParams& p, Stream = {}) {
        check_args(p);
        if (p.rows == 0) return;
        if (const cpu::PackedWeight* pw = cpu::packed_weight(p.w)) {
            if (pw->kind() == cpu::PackedWeight::Kind::ConvBlocks) {
                check_packed_linear(p);
#if defined(FLOWEDGE_CPU_X86)
                cpu::avx2::linear_on_blocks(p, pw->data(), pw->int8());
#endif
                return;
            }
            if (pw->serves(p.math)) {
                FLOWEDGE_CPU_REQUIRE(p.in == pw->in() && p.out == pw->out(), "linear",
                                     "shape differs from the packed weights" +
                                         expected_got(std::to_string(pw->in()) + " -> " + std::to_string(pw->out()),
                                                      std::to_string(p.in) + " -> " + std::to_string(p.out)));
                if (pw->layout() == cpu::PackedLayout::F32Groups) FLOWEDGE_CPU_SIMD_KERNEL(pw->isa(), packed_gemm_linear(p, pw->data()));
                else FLOWEDGE_CPU_SIMD_KERNEL(pw->isa(), packed_linear(p, pw->data(), pw->layout(), pw->bf16_math(p.math)));
                return;
            }
        }
        FLOWEDGE_CPU_REQUIRE(p.w.data, "linear", "the packed weights do not serve this math mode and the stored tensor is gone");
        FLOWEDGE_CPU_KERNEL(linear(p, cpu::bf16_math_available()));
    }

    /// What a linear on conv blocks (Storage::StreamedMatrix on the AVX2 set) supports: contiguous rows, no
    /// accumulate; every MathMode computes exactly there (as conv1d on packed weights).
    static void check_packed_linear(const LinearParams& p) {
        FLOWEDGE_CPU_REQUIRE((p.ld_x == 0 || p.ld_x == p.in) && (p.ld_y == 0 || p.ld_y == p.out) && !p.accumulate, "linear",
                             "packed (streamed) weights need contiguous rows and no accumulate" +
                                 expected_got("ld_x = in, ld_y = out, accumulate off",
                                              std::to_string(p.ld_x) + "/" + std::to_string(p.ld_y) + "/" +
                                                  (p.accumulate ? "on" : "off")));
    }

    /// Several independent linears in one op (see LinearBatchParams): every item is validated first, then each runs
    /// through linear() in item order, so results equal the single op bit for bit.
    static void linear_batch(const LinearBatchParams& p, Stream s = {}) {
        check_args(p);
#if defined(FLOWEDGE_CPU_X86)
        // Items all on conv blocks (the U-Net's FiLM projections on the AVX2 set) share one parallel region.
        {
            const void* blocks[kMaxLinearBatch];
            bool int8[kMaxLinearBatch];
            double macs = 0;
            bool all_blocks = true;
            for (int i = 0; i < p.n_items && all_blocks; ++i) {
                const LinearParams& it = p.items[i];
                const cpu::PackedWeight* pw = cpu::packed_weight(it.w);
                all_blocks = pw && pw->kind() == cpu::PackedWeight::Kind::ConvBlocks && it.rows > 0;
                blocks[i] = all_blocks ? pw->data() : nullptr;
                int8[i] = all_blocks && pw->int8();
                macs += double(it.rows) * it.in * it.out;
            }
            if (all_blocks && macs >= cpu::kParallelMacs) {
                for (int i = 0; i < p.n_items; ++i) check_packed_linear(p.items[i]);
                cpu::avx2::linear_batch_on_blocks(p, blocks, int8);
                return;
            }
        }
#endif
        for (int i = 0; i < p.n_items; ++i) linear(p.items[i], s);
    }

    /// Device scratch a conv1d of p's shape may use under a non-F32 MathMode (Conv1dParams::scratch): none here,
    /// the CPU kernels build their panels in thread-local buffers.
    static std::size_t conv1d_scratch_bytes(const Conv1dParams&) { return 0; }
    /// Likewise for conv_transpose1d (ConvTranspose1dParams::scratch): none.
    static std::size_t conv_transpose1d_scratch_bytes(const ConvTranspose1dParams&) { return 0; }
    /// Readies what MathMode m needs before graphs are recorded (the CUDA tensor-core GEMM library); nothing here.
    static void prepare_math(MathMode) {}

    /// torch.nn.Conv1d (groups 1, dilation 1, zero padding). x: [batch, in, in_length] -> y: [batch, out, out_length].
    static void conv1d(const Conv1dParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_REQUIRE(p.kernel <= 1024, "conv1d", "kernel too long" + expected_got("<= 1024", p.kernel));
        const cpu::PackedWeight* pw = cpu::packed_weight(p.w);
        FLOWEDGE_CPU_KERNEL(conv1d(p, pw ? pw->data() : nullptr, pw && pw->int8(), cpu::bf16_math_available()));
    }

    /// torch.nn.ConvTranspose1d (groups 1, dilation 1), weight [in, out, k]; output_padding = out_length - minimum.
    static void conv_transpose1d(const ConvTranspose1dParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_REQUIRE(p.in_length * cpu::round_up16(std::size_t(p.kernel)) <= cpu::kScratchFloats,
                             "conv_transpose1d", "in_length * kernel too large for the stack scratch" +
                                                     expected_got("<= 65536 floats", p.in_length * p.kernel));
        const cpu::PackedWeight* pw = cpu::packed_weight(p.w);
        FLOWEDGE_CPU_KERNEL(conv_transpose1d(p, pw ? pw->data() : nullptr, pw && pw->int8()));
    }

    /// torch.nn.GroupNorm + fused act -> FiLM (scale * a + bias) -> residual epilogue. Statistics in double.
    static void group_norm(const GroupNormParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_KERNEL(group_norm(p));
    }

    /// A GroupNorm of a Conv1d's output: the two ops in turn (conv.y holds the raw conv output).
    static void conv1d_group_norm(const Conv1dGroupNormParams& p, Stream s = {}) {
        check_args(p);
        conv1d(p.conv, s);
        group_norm(p.norm, s);
    }

    /// Mamba RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, per row. x, y: [rows, dim].
    static void rms_norm(const RmsNormParams& p, Stream = {}) {
        check_args(p);
        if (p.rows == 0) return;
        FLOWEDGE_CPU_KERNEL(rms_norm(p));
    }

    /// Elementwise y = act(x) (x may equal y).
    static void activation(const ActivationParams& p, Stream = {}) {
        check_args(p);
        if (p.n == 0) return;
        FLOWEDGE_CPU_KERNEL(activation(p));
    }

    /// Elementwise out = a*x + b*y (out may alias x or y; y may be null when b == 0).
    static void axpby(const AxpbyParams& p, Stream = {}) {
        check_args(p);
        if (p.n == 0) return;
        FLOWEDGE_CPU_KERNEL(axpby(p));
    }

    /// torch.cat([a, b], dim=1) for [batch, c, length] tensors.
    static void concat_channels(const ConcatParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_KERNEL(concat_channels(p));
    }

    /// Sinusoidal time features: out[r] = [sin(t*f_i) | cos(t*f_i)], f_i = exp(-(i * (log_base / denom))) in float32.
    static void sinusoid(const SinusoidParams& p, Stream = {}) {
        check_args(p);
        if (p.rows == 0) return;
        FLOWEDGE_CPU_KERNEL(sinusoid(p));
    }

    /// torch.nn.Embedding: y[r, :] = table[ids[r], :] widened to float (ids validated by the caller).
    static void embedding(const EmbeddingParams& p, Stream = {}) {
        check_args(p);
        if (p.rows == 0) return;
        FLOWEDGE_CPU_KERNEL(embedding(p));
    }

    /// Mamba causal depthwise conv + SiLU with a rolling (kernel-1)-row history in `state`.
    static void causal_conv(const CausalConvParams& p, Stream = {}) {
        check_args(p);
        if (p.length == 0) return;
        FLOWEDGE_CPU_KERNEL(causal_conv(p));
    }

    /// Mamba-1 selective scan with D skip and SiLU(z) gate (see SelectiveScanParams), continuing from state.
    static void selective_scan(const SelectiveScanParams& p, Stream = {}) {
        check_args(p);
        if (p.length == 0) return;
        FLOWEDGE_CPU_KERNEL(selective_scan(p));
    }

    /// One DDIM/DDPM update of x: [batch, per_sample] given eps (docs/models.md#schedulers); DDPM noise by global draw index.
    static void diffusion_step(const DiffusionStepParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_KERNEL(diffusion_step(p));
    }

    /// MIN_MAX un-normalisation y = (x + 1) / 2 * (max - min) + min per column. x, y: [rows, dim].
    static void unnormalize(const UnnormalizeParams& p, Stream = {}) {
        check_args(p);
        if (p.rows == 0) return;
        FLOWEDGE_CPU_KERNEL(unnormalize(p));
    }

    /// torch.nn.Conv2d (groups 1, dilation 1, zero padding) + bias + residual + act. x: [batch, in, in_h, in_w] ->
    /// y: [batch, out, out_h, out_w]; weights row-major [out, in, kh, kw] (kernels/conv2d.hpp) or their output blocks
    /// (Storage::Conv2dWeight on the SIMD sets: kernels/conv2d_packed.hpp).
    static void conv2d(const Conv2dParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_REQUIRE(!p.residual || (p.residual != p.y), "conv2d", "residual aliases y (the residual is read after y is written)");
        if (const cpu::PackedWeight* pw = cpu::packed_weight(p.w)) {
            const int R = p.in_channels * p.kernel_h * p.kernel_w;
            FLOWEDGE_CPU_REQUIRE(pw->kind() == cpu::PackedWeight::Kind::Conv2dBlocks && pw->out() == p.out_channels && pw->in() == R,
                                 "conv2d", "prepared weights of another kind or shape" +
                                     expected_got("Conv2d blocks of " + std::to_string(p.out_channels) + " x " + std::to_string(R),
                                                  std::to_string(pw->out()) + " x " + std::to_string(pw->in())));
#if defined(FLOWEDGE_CPU_X86)
            if (const float* u = pw->winograd()) {
                if (pw->isa() == cpu::Isa::Avx512) {
                    if (const cpu::avx512::Conv2dWinogradPlan wk(p); wk.ok) return cpu::avx512::conv2d_winograd(p, wk, u);
                } else if (const cpu::avx2::Conv2dWinogradPlan wk(p); wk.ok) {
                    return cpu::avx2::conv2d_winograd(p, wk, u);
                }
            }
#endif
            FLOWEDGE_CPU_SIMD_KERNEL(pw->isa(), conv2d_packed(p, pw->data(), pw->dtype()));
            return;
        }
        FLOWEDGE_CPU_KERNEL(conv2d(p));
    }

    /// torch.nn.MaxPool2d(kernel, stride, pad), NaN propagating. x: [batch, c, in_h, in_w] -> y: [batch, c, out_h, out_w].
    static void max_pool2d(const MaxPool2dParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_KERNEL(max_pool2d(p));
    }

    /// LeRobot SpatialSoftmax keypoints: softmax over positions, expected pos_grid coordinates. x: [rows, positions] -> y: [rows, 2].
    static void spatial_softmax(const SpatialSoftmaxParams& p, Stream = {}) {
        check_args(p);
        if (p.rows == 0) return;
        FLOWEDGE_CPU_KERNEL(spatial_softmax(p));
    }

    /// LeRobot feature normalisation (MeanStd / MinMax / Identity per column). x, y: [rows, dim] (x may equal y).
    static void normalize(const NormalizeParams& p, Stream = {}) {
        check_args(p);
        if (p.rows == 0) return;
        FLOWEDGE_CPU_KERNEL(normalize(p));
    }

    /// Camera frames (uint8 HWC / 255 or float CHW) to normalised float CHW, cut to a window.
    static void image_to_tensor(const ImageToTensorParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_KERNEL(image_to_tensor(p));
    }

    /// torchvision Resize (bilinear, align_corners False, antialias as given) + the crop window. x: [planes, in_h, in_w]
    /// -> y: [planes, out_h, out_w]. The taps of both axes and one output row's width-pass rows live in stack scratch.
    static void resize(const ResizeParams& p, Stream = {}) {
        check_args(p);
        const int max_out = cpu::scalar::kResizeMaxOut;
        FLOWEDGE_CPU_REQUIRE(p.out_h <= max_out && p.out_w <= max_out, "resize",
                             "window too large for the stack taps" +
                                 expected_got("out_h, out_w <= " + std::to_string(max_out),
                                              std::to_string(p.out_h) + " x " + std::to_string(p.out_w)));
        const std::size_t kw = std::size_t(cpu::scalar::resize_max_taps(p.in_w, p.resized_w, p.antialias));
        const std::size_t kh = std::size_t(cpu::scalar::resize_max_taps(p.in_h, p.resized_h, p.antialias));
        const std::size_t need = std::size_t(p.out_w) * kw + std::size_t(p.out_h) * kh + kh * std::size_t(p.out_w);
        FLOWEDGE_CPU_REQUIRE(need <= cpu::kScratchFloats, "resize",
                             "downscale too strong for the stack scratch" +
                                 expected_got("<= " + std::to_string(cpu::kScratchFloats) + " floats of taps and rows", need));
        FLOWEDGE_CPU_KERNEL(resize(p));
    }

    // ---- transformer ops (op_params_transformer.hpp) ----

    /// torch.nn.LayerNorm of x (+ residual) per row, statistics in double. x, residual, y: [rows, dim].
    static void layer_norm(const LayerNormParams& p, Stream = {}) {
        check_args(p);
        if (p.rows == 0) return;
        FLOWEDGE_CPU_KERNEL(layer_norm(p));
    }

    /// Multi-head softmax(scale q k^T) v, exact float32 softmax. One query's scores and output row live on the stack.
    static void attention(const AttentionParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_REQUIRE(p.n_kv <= cpu::scalar::kAttentionMaxKeys && p.head_dim <= cpu::scalar::kAttentionMaxHeadDim, "attention",
                             "too many keys or too wide a head for the stack scratch" +
                                 expected_got("n_kv <= " + std::to_string(cpu::scalar::kAttentionMaxKeys) + ", head_dim <= " +
                                                  std::to_string(cpu::scalar::kAttentionMaxHeadDim),
                                              std::to_string(p.n_kv) + ", " + std::to_string(p.head_dim)));
        if (p.n_q == 0) return;
        FLOWEDGE_CPU_KERNEL(attention(p));
    }

    /// Exact (erf) GELU, elementwise (x may equal y).
    static void gelu(const GeluParams& p, Stream = {}) {
        check_args(p);
        if (p.n == 0) return;
        FLOWEDGE_CPU_KERNEL(gelu(p));
    }

    /// [rows, cols] -> [cols, rows].
    static void transpose(const TransposeParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_KERNEL(transpose(p));
    }

    /// LeRobot's ACTSinusoidalPositionEmbedding2d of an h x w map, token-major [h * w, dim].
    static void position_embedding_2d(const PositionEmbedding2dParams& p, Stream = {}) {
        check_args(p);
        FLOWEDGE_CPU_KERNEL(position_embedding_2d(p));
    }
};

}  // namespace flowedge

// FLOWEDGE_CPU_OPS_EXTERN: this translation unit uses the CPU ops compiled elsewhere, in one translation unit that
// says `template struct flowedge::Ops<flowedge::Cpu>;` (after including this header). At -O0/-Og GCC and Clang then
// emit none of the ops or the kernels behind them here, which is most of the compile time of a TU that calls ops; an
// optimising build still inlines (and so compiles) what it calls. The sanitized test suite uses it
// (FLOWEDGE_TEST_SHARED_MODELS; test/support/cpu_models_ops.cpp).
#ifdef FLOWEDGE_CPU_OPS_EXTERN
extern template struct flowedge::Ops<flowedge::Cpu>;
#endif
