// Declarations of the CUDA launchers behind Ops<Cuda>; the kernels live in kernels/cuda/*.cu.
//
// Every launcher enqueues on the given stream (Stream.handle is a cudaStream_t, nullptr = default
// stream), never synchronizes, checks its arguments cheaply (flowedge::Error on misuse) and checks the
// launch (flowedge::Error carrying file:line and the CUDA error string). All pointers are device
// pointers. Weight dtypes F32/BF16/F16 are dispatched at run time to templated kernels.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "flowedge/backend.hpp"
#include "flowedge/op_params.hpp"
#include "flowedge/op_params_transformer.hpp"

namespace flowedge::cuda {

/// p.math TF32/BF16 (or F32 with p.f32_gemm) and >= 32 rows: linear_gemm where it takes p, else float tiles (another
/// summation order, within the F32 tolerance); otherwise the exact kernels.
void linear(const LinearParams& p, Stream s);
/// cuBLASLt GEMM for a linear (kernels/cuda/gemm_lt.cu): TF32 under TF32/BF16 math, F32 (CUBLAS_COMPUTE_32F) under
/// F32 math with p.f32_gemm. Returns false, launching nothing, unless the weights are F32, p.rows >= 32, the activation
/// is None or ReLU (None when accumulating), a handle exists (or can be created outside a capture) and the library has
/// an algorithm; FLOWEDGE_CUDA_NO_LT=1 turns it off.
bool linear_gemm(const LinearParams& p, Stream s);
/// A batch-1 flow solve's steps as one thread-block cluster (kernels/cuda/flow_solve.cu): returns false, launching
/// nothing, where it does not apply (no clusters below sm_90, H not a multiple of the cluster size, the weights larger
/// than the cluster's shared memory); the caller then runs the per-op steps.
bool flow_solve(const FlowSolveParams& p, Stream s);
/// A whole batch-1 Mamba-flow action as one thread-block cluster (kernels/cuda/flow_solve.cu): false, launching
/// nothing, where it does not apply (the flow_solve conditions, d_inner or d_model not a multiple of 8, d_state > 32,
/// R + 2S > 64, cond width != d_model, more layers or tokens than the limits, shared memory).
bool mamba_flow_act(const MambaFlowActParams& p, Stream s);
/// The phase clock of the last fused flow_solve / mamba_flow_act launch (a diagnostic; bench/mamba_flow_bench
/// --phases): one entry per phase in order, block 0's SM cycles from the previous phase end to this one, and the
/// launch's global-timer span. Empty unless FLOWEDGE_CUDA_FLOW_PHASES=1 was set before the first fused launch.
/// Synchronises the device.
struct FlowPhaseProfile {
    struct Phase {
        std::string name;
        long long cycles = 0;
    };
    std::vector<Phase> phases;
    double total_ns = 0;
};
FlowPhaseProfile last_flow_phases();
/// All items of `p` in one kernel launch; each output equals linear() on its item (same per-output math).
void linear_batch(const LinearBatchParams& p, Stream s);
/// p.math == TF32/BF16 and conv1d_mma_selected(p): runs conv1d_gemm when it applies, else conv1d_mma for F32
/// weights; F32 math with p.f32_gemm on a call conv1d_mma_selected would take under TF32: conv1d_gemm's F32 GEMM
/// when it applies; otherwise (and for 16-bit weights the GEMM declines) the exact float kernels.
void conv1d(const Conv1dParams& p, Stream s);
/// Tensor-core implicit GEMM (kernels/cuda/conv_mma.cu): D[o, b*out_length + t] = bias[o] + sum_{i,k} W[o, i*kernel + k] *
/// X[b, i, t*stride + k - pad], operands rounded to p.math (TF32 or BF16, float accumulation), deterministic.
/// Any shape conv1d accepts; p.math must not be F32 and the device must be sm_80+ (flowedge::Error otherwise).
/// `tile` picks the block tile: 0 = automatic (the rule in conv_mma.cu), 1 = 64x64, 2 = 32x64, 3 = 32x32,
/// 4 / 5 = 128x128 with K split over a 2 / 4-block cluster (sm_90 only) (tests and A/B timing).
void conv1d_mma(const Conv1dParams& p, Stream s, int tile = 0);
/// cuBLASLt conv1d (kernels/cuda/gemm_lt.cu): im2col panel in p.scratch, one TF32 (F32 weights), BF16 (BF16 weights,
/// BF16 math) or F32 (F32 weights, F32 math, p.f32_gemm) library GEMM, transpose + bias. Returns false, launching
/// nothing, when it does not apply (math F32 without f32_gemm, other weight dtype/math pairs, p.scratch missing or smaller than conv1d_scratch_bytes(p), no
/// library handle while a graph is being captured, no algorithm for the shape, FLOWEDGE_CUDA_NO_LT=1); conv1d then
/// runs conv1d_mma. Bound and determinism: see gemm_lt.cu.
bool conv1d_gemm(const Conv1dParams& p, Stream s);
/// Scratch bytes conv1d_gemm needs for p's shape when conv1d would route it to the tensor-core path under TF32/BF16
/// math (p.math itself is ignored: models size their workspace at load), else 0.
std::size_t conv1d_scratch_bytes(const Conv1dParams& p);
/// Creates the cuBLASLt handle of the current device (so that graphs captured later can use it) for MathMode m, or
/// for F32 ops with f32_gemm; no-op without an sm_80+ device.
void prepare_math(MathMode m);
/// Whether conv1d routes `p` to conv1d_mma: p.math != F32, an sm_80+ device and batch*out_length >= the minimum
/// (32, or FLOWEDGE_CUDA_MMA_MIN_N from the environment, read once; a huge value turns the path off).
bool conv1d_mma_selected(const Conv1dParams& p);
void conv_transpose1d(const ConvTranspose1dParams& p, Stream s);
/// cuBLASLt conv_transpose1d (gemm_lt.cu), for batched calls: x transposed into a [batch * in_length][in] panel in
/// p.scratch, one library GEMM D[n][o * kernel + k] = sum_i w[i, o, k] * x[b, i, s] (n = b * in_length + s; operand
/// kinds and bound as conv1d_gemm's with Kg = in_channels * kernel), then each output gathers its taps and adds the
/// bias. Returns false, launching nothing, where conv1d_gemm would (and for batch * in_length below the routing
/// minimum); conv_transpose1d then runs its exact kernels.
bool conv_transpose1d_gemm(const ConvTranspose1dParams& p, Stream s);
/// Scratch bytes conv_transpose1d_gemm needs for p's shape when the call is batched enough for it (p.math ignored,
/// as conv1d_scratch_bytes), else 0.
std::size_t conv_transpose1d_scratch_bytes(const ConvTranspose1dParams& p);
void group_norm(const GroupNormParams& p, Stream s);
/// GroupNorm(conv(x)): where conv1d would run cuBLASLt's GEMM (conv1d_gemm) and a group fits one block (<= 2048
/// elements), im2col + GEMM, then the norm reads the GEMM's [position][channel] output plus the conv bias itself
/// (conv1d_gemm_group_norm; p.conv.y unwritten); otherwise conv1d then group_norm.
void conv1d_group_norm(const Conv1dGroupNormParams& p, Stream s);
/// The library-GEMM form of conv1d_group_norm (gemm_lt.cu): false, launching nothing, where conv1d_gemm would
/// decline or a group exceeds 2048 elements.
bool conv1d_gemm_group_norm(const Conv1dGroupNormParams& p, Stream s);
void rms_norm(const RmsNormParams& p, Stream s);
void activation(const ActivationParams& p, Stream s);
void axpby(const AxpbyParams& p, Stream s);
void concat_channels(const ConcatParams& p, Stream s);
void sinusoid(const SinusoidParams& p, Stream s);
void embedding(const EmbeddingParams& p, Stream s);
void causal_conv(const CausalConvParams& p, Stream s);
void selective_scan(const SelectiveScanParams& p, Stream s);
void diffusion_step(const DiffusionStepParams& p, Stream s);
void unnormalize(const UnnormalizeParams& p, Stream s);
// Image ops (the RGB encoder and its preprocessing).
/// The exact kernels (CUDA cores; p.math is ignored here: Ops<Cuda>::conv2d tries conv2d_gemm first when it is not F32
/// or p.f32_gemm is set).
void conv2d(const Conv2dParams& p, Stream s);
/// cuBLASLt conv2d (kernels/cuda/conv2d_gemm.cu): per image an im2col panel in p.scratch and one TF32 (F32 weights),
/// BF16 (BF16 weights, BF16 math) or F32 (F32 weights, F32 math, p.f32_gemm) GEMM writing y, then bias / residual /
/// ReLU. Returns false, leaving y untouched, when it does not apply (math F32 without f32_gemm, other weight
/// dtype/math pairs, an activation other than None/ReLU,
/// p.scratch missing or smaller than conv2d_scratch_bytes(p), no sm_80+ device, no library handle while a graph is
/// being captured, no algorithm for the shape, FLOWEDGE_CUDA_NO_LT=1). Bound and determinism: see conv2d_gemm.cu.
bool conv2d_gemm(const Conv2dParams& p, Stream s);
/// Conv2d + GroupNorm in one launch (kernels/cuda/conv2d_group_norm.cu: one thread-block cluster per image and group);
/// false, with nothing launched, where it does not apply (below sm_90, non-F32 weights or math, a conv bias, residual
/// or activation, FiLM, a group of more than 16384 outputs (8192 where the device runs clusters of 8 only), the
/// shared memory).
bool conv2d_group_norm(const Conv2dGroupNormParams& p, Stream s);
/// Scratch bytes conv2d_gemm needs for p's shape on an sm_80+ device (p.math itself is ignored: models size their
/// workspace at load), else 0.
std::size_t conv2d_scratch_bytes(const Conv2dParams& p);
void max_pool2d(const MaxPool2dParams& p, Stream s);
void spatial_softmax(const SpatialSoftmaxParams& p, Stream s);
void normalize(const NormalizeParams& p, Stream s);
void image_to_tensor(const ImageToTensorParams& p, Stream s);
void resize(const ResizeParams& p, Stream s);
// Transformer ops (ACT's encoder and decoder; kernels/cuda/transformer.cu).
void layer_norm(const LayerNormParams& p, Stream s);
/// Fused multi-head attention; n_kv is bounded by one block's score tile in shared memory (about 3,400 keys at
/// head_dim 64 on sm_90) and head_dim by 256 (flowedge::Error beyond).
void attention(const AttentionParams& p, Stream s);
void gelu(const GeluParams& p, Stream s);
void transpose(const TransposeParams& p, Stream s);
void position_embedding_2d(const PositionEmbedding2dParams& p, Stream s);

}  // namespace flowedge::cuda
