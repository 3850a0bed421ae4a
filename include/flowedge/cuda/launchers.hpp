// Declarations of the CUDA launchers behind Ops<Cuda>; the kernels live in kernels/cuda/*.cu.
//
// Every launcher enqueues on the given stream (Stream.handle is a cudaStream_t, nullptr = default
// stream), never synchronizes, checks its arguments cheaply (flowedge::Error on misuse) and checks the
// launch (flowedge::Error carrying file:line and the CUDA error string). All pointers are device
// pointers. Weight dtypes F32/BF16/F16 are dispatched at run time to templated kernels.
#pragma once
#include "flowedge/backend.hpp"
#include "flowedge/op_params.hpp"

namespace flowedge::cuda {

void linear(const LinearParams& p, Stream s);
/// All items of `p` in one kernel launch; each output equals linear() on its item (same per-output math).
void linear_batch(const LinearBatchParams& p, Stream s);
void conv1d(const Conv1dParams& p, Stream s);
void conv_transpose1d(const ConvTranspose1dParams& p, Stream s);
void group_norm(const GroupNormParams& p, Stream s);
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

}  // namespace flowedge::cuda
