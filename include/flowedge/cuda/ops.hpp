// Ops<Cuda>: the backend boundary for NVIDIA GPUs, forwarding every primitive to a precompiled launcher.
#pragma once
#include <cstddef>
#include <memory>
#include <string_view>

#include "flowedge/backend.hpp"
#include "flowedge/cuda/launchers.hpp"
#include "flowedge/cuda/memory.hpp"
#include "flowedge/op_checks.hpp"
#include "flowedge/op_params.hpp"
#include "flowedge/op_params_transformer.hpp"
#include "flowedge/tensor.hpp"
#include "flowedge/weights.hpp"

namespace flowedge {

/// CUDA primitives: asynchronous on `s` (nullptr = default stream); see op_params.hpp for the math. Each op first runs
/// the shared check_args of op_checks.hpp (same errors as Ops<Cpu>), then its launcher, which adds the kernels' own limits.
template <>
struct Ops<Cuda> {
    static void copy_from_host(void* dst, const void* src, std::size_t bytes, Stream s = {}) { Memory<Cuda>::copy_from_host(dst, src, bytes, s); }
    static void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream s = {}) { Memory<Cuda>::copy_to_host(dst, src, bytes, s); }
    static void copy(void* dst, const void* src, std::size_t bytes, Stream s = {}) { Memory<Cuda>::copy(dst, src, bytes, s); }
    static void fill_zero(void* dst, std::size_t bytes, Stream s = {}) { Memory<Cuda>::fill_zero(dst, bytes, s); }
    static void synchronize(Stream s = {}) { Memory<Cuda>::synchronize(s); }

    /// The weight-preparation hook: the kernels read every weight as stored, so nothing is prepared. No CUDA kernel
    /// reads int8 weights: a quantisation request is an error, not ignored.
    static std::unique_ptr<PreparedWeight> prepare_weight(Storage, const WeightRef&, const Shape&, std::string_view what,
                                                          WeightQuant q = WeightQuant::None) {
        if (q != WeightQuant::None) {
            const char* name = q == WeightQuant::W8A8 ? "W8A8" : "Int8";
            fail(ErrorKind::Unsupported, "cuda", std::string(what) + ": LoadOptions::quantize = " + name + " has no CUDA kernels" +
                                                     expected_got("quantize = None on the CUDA backend", name));
        }
        return nullptr;
    }

    static void linear(const LinearParams& p, Stream s = {}) { check_args(p); cuda::linear(p, s); }
    static void linear_batch(const LinearBatchParams& p, Stream s = {}) { check_args(p); cuda::linear_batch(p, s); }
    /// false (nothing launched) where the fused solve does not apply: run the per-op steps (cuda::flow_solve).
    static bool flow_solve(const FlowSolveParams& p, Stream s = {}) { return cuda::flow_solve(p, s); }
    static bool mamba_flow_act(const MambaFlowActParams& p, Stream s = {}) { return cuda::mamba_flow_act(p, s); }
    static void conv1d(const Conv1dParams& p, Stream s = {}) { check_args(p); cuda::conv1d(p, s); }
    static std::size_t conv1d_scratch_bytes(const Conv1dParams& p) { return cuda::conv1d_scratch_bytes(p); }
    static void prepare_math(MathMode m) { cuda::prepare_math(m); }
    static void conv_transpose1d(const ConvTranspose1dParams& p, Stream s = {}) { check_args(p); cuda::conv_transpose1d(p, s); }
    static std::size_t conv_transpose1d_scratch_bytes(const ConvTranspose1dParams& p) { return cuda::conv_transpose1d_scratch_bytes(p); }
    static void group_norm(const GroupNormParams& p, Stream s = {}) { check_args(p); cuda::group_norm(p, s); }
    static void conv1d_group_norm(const Conv1dGroupNormParams& p, Stream s = {}) { check_args(p); cuda::conv1d_group_norm(p, s); }
    static void rms_norm(const RmsNormParams& p, Stream s = {}) { check_args(p); cuda::rms_norm(p, s); }
    static void activation(const ActivationParams& p, Stream s = {}) { check_args(p); cuda::activation(p, s); }
    static void axpby(const AxpbyParams& p, Stream s = {}) { check_args(p); cuda::axpby(p, s); }
    static void concat_channels(const ConcatParams& p, Stream s = {}) { check_args(p); cuda::concat_channels(p, s); }
    static void sinusoid(const SinusoidParams& p, Stream s = {}) { check_args(p); cuda::sinusoid(p, s); }
    static void embedding(const EmbeddingParams& p, Stream s = {}) { check_args(p); cuda::embedding(p, s); }
    static void causal_conv(const CausalConvParams& p, Stream s = {}) { check_args(p); cuda::causal_conv(p, s); }
    static void selective_scan(const SelectiveScanParams& p, Stream s = {}) { check_args(p); cuda::selective_scan(p, s); }
    static void diffusion_step(const DiffusionStepParams& p, Stream s = {}) { check_args(p); cuda::diffusion_step(p, s); }
    static void unnormalize(const UnnormalizeParams& p, Stream s = {}) { check_args(p); cuda::unnormalize(p, s); }
    /// Non-F32 math (or f32_gemm) with scratch: the library GEMM (conv2d_gemm.cu) where it applies; otherwise the
    /// exact kernels.
    static void conv2d(const Conv2dParams& p, Stream s = {}) {
        check_args(p);
        if ((p.math != MathMode::F32 || p.f32_gemm) && cuda::conv2d_gemm(p, s)) return;
        cuda::conv2d(p, s);
    }
    static std::size_t conv2d_scratch_bytes(const Conv2dParams& p) { return cuda::conv2d_scratch_bytes(p); }
    /// Conv2d + GroupNorm as one launch where the fused kernel applies (false: nothing ran; run the two ops).
    static bool conv2d_group_norm(const Conv2dGroupNormParams& p, Stream s = {}) {
        check_args(p.conv);
        return cuda::conv2d_group_norm(p, s);
    }
    static void max_pool2d(const MaxPool2dParams& p, Stream s = {}) { check_args(p); cuda::max_pool2d(p, s); }
    static void spatial_softmax(const SpatialSoftmaxParams& p, Stream s = {}) { check_args(p); cuda::spatial_softmax(p, s); }
    static void normalize(const NormalizeParams& p, Stream s = {}) { check_args(p); cuda::normalize(p, s); }
    static void image_to_tensor(const ImageToTensorParams& p, Stream s = {}) { check_args(p); cuda::image_to_tensor(p, s); }
    static void resize(const ResizeParams& p, Stream s = {}) { check_args(p); cuda::resize(p, s); }

    // ---- transformer ops (op_params_transformer.hpp; kernels/cuda/transformer.cu) ----
    static void layer_norm(const LayerNormParams& p, Stream s = {}) { check_args(p); cuda::layer_norm(p, s); }
    static void attention(const AttentionParams& p, Stream s = {}) { check_args(p); cuda::attention(p, s); }
    static void gelu(const GeluParams& p, Stream s = {}) { check_args(p); cuda::gelu(p, s); }
    static void transpose(const TransposeParams& p, Stream s = {}) { check_args(p); cuda::transpose(p, s); }
    static void position_embedding_2d(const PositionEmbedding2dParams& p, Stream s = {}) { check_args(p); cuda::position_embedding_2d(p, s); }
};

}  // namespace flowedge
