// The torch.nn.Conv2d paths that conv2d() in conv2d.cu chooses between beside its own tile kernel. Which shape takes
// which path: docs/kernels/cuda.md (Image ops).
#pragma once
#include <cuda_runtime.h>

#include "flowedge/op_params.hpp"

namespace flowedge::cuda::detail {

/// K-stream path (conv2d_kstream.cu) for output maps of <= 9 pixels with a long reduction: launches and returns true
/// when K = in_channels * kernel_h * kernel_w is a multiple of 4 and >= 2048, the weights are aligned for 4-element
/// loads and the block's input columns fit its shared memory; otherwise returns false and launches nothing. `p` is already checked
/// by conv2d(). FLOWEDGE_CUDA_CONV2D_NO_KSTREAM=1 turns the path off (A/B timing).
bool try_conv2d_kstream(const Conv2dParams& p, cudaStream_t st);

}  // namespace flowedge::cuda::detail
