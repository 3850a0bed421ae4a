// The exact (float-accumulating) torch.nn.Conv1d paths that conv1d() in conv1d_dispatch.cu chooses between, each
// defined in its own .cu and instantiated there for float, bf16 and f16 weights. Which shape takes which path:
// docs/kernels/cuda_conv.md.
#pragma once
#include <cuda_runtime.h>

#include "flowedge/op_params.hpp"

namespace flowedge::cuda::detail {

/// Row path (conv1d_row.cu): launches and returns true for 'same' padding (pad = kernel/2), kernel/stride in
/// {5/1, 3/1, 3/2, 1/1}, in_length in {1, 2, 4, 8, 16}, in_channels % 4 == 0, 16-byte aligned x and weights (8-byte
/// for 16-bit weights); otherwise returns false and launches nothing.
template <class T>
bool try_conv1d_row(const Conv1dParams& p, cudaStream_t st);

/// Tiled path (conv1d_tiled.cu): launches and returns true for any length and padding with kernel/stride in
/// {5/1, 3/1, 3/2, 1/1}, in_channels % 4 == 0 and aligned weights; otherwise returns false and launches nothing.
template <class T>
bool try_conv1d_tiled(const Conv1dParams& p, cudaStream_t st);

/// Generic path (conv1d_generic.cu): one thread per output element; any shape conv1d accepts.
template <class T>
void launch_conv1d_generic(const Conv1dParams& p, cudaStream_t st);

}  // namespace flowedge::cuda::detail
