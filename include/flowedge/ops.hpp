// The backend boundary: every primitive a backend must provide, as static functions of Ops<B>.
//
// Layers and models call only Ops<B>; they never test which backend they run on. A backend provides:
//   memory:   allocate / deallocate (via Memory<B>), copy_from_host, copy_to_host, copy, fill_zero, synchronize
//   compute:  linear, linear_batch, conv1d, conv_transpose1d, group_norm, conv1d_group_norm, rms_norm, activation, axpby,
//             concat_channels, sinusoid, embedding, causal_conv, selective_scan, diffusion_step, unnormalize,
//             images: conv2d, max_pool2d, spatial_softmax, normalize, image_to_tensor, resize
//             transformer (op_params_transformer.hpp): layer_norm, attention, gelu, transpose, position_embedding_2d
//             (Ops<Cpu> only so far: a model using them is instantiated on Cpu until their CUDA kernels exist)
// each taking (const XxxParams&, Stream). Launchers never synchronize; Ops<Cpu> runs synchronously.
#pragma once
#include "flowedge/backend.hpp"
#include "flowedge/op_params.hpp"
#include "flowedge/op_params_transformer.hpp"
#include "flowedge/tensor.hpp"

namespace flowedge {

/// Primitive operations of backend B; specialised by cpu/ops.hpp and cuda/ops.hpp.
template <Backend B>
struct Ops {
    static_assert(backend_available_v<B>,
                  "flowedge: the Cuda backend is not built: configure with -DFLOWEDGE_BACKEND=cuda and link "
                  "flowedge::cuda (which defines FLOWEDGE_WITH_CUDA)");
};

}  // namespace flowedge

#include "flowedge/cpu/ops.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/ops.hpp"
#endif
