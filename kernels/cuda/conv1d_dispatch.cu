// torch.nn.Conv1d entry point: decides which path runs for a shape (tensor-core GEMM or implicit GEMM under TF32/BF16
// math for batched calls, the library's F32 GEMM for batched F32 calls that ask for it (f32_gemm), else the exact
// row, tiled or generic kernel), and Conv1d + GroupNorm (conv1d_group_norm); the table of shapes and paths is in
// docs/kernels/cuda_conv.md.
#include <cstdint>
#include <string_view>

#include "common.cuh"
#include "conv1d_paths.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {

namespace {

/// Whether conv1d may route p to a GEMM path: opt-in TF32/BF16 math, or F32 math with f32_gemm, on the calls the
/// tensor-core paths take (batched).
bool gemm_candidate(const Conv1dParams& p) {
    if (conv1d_mma_selected(p)) return true;
    if (!(p.math == MathMode::F32 && p.f32_gemm)) return false;
    Conv1dParams q = p;
    q.math = MathMode::TF32;
    return conv1d_mma_selected(q);
}

}  // namespace

void conv1d(const Conv1dParams& p, Stream s) {
    constexpr std::string_view comp = "cuda conv1d";
    detail::check_conv1d(p, comp);
    // Opt-in TF32/BF16 tensor-core paths: cuBLASLt (gemm_lt.cu) for F32 weights and for BF16 weights under BF16
    // math; F32 weights it declines (no scratch, say) go to conv_mma.cu. 16-bit weights the GEMM declines stay on
    // the exact kernels, which are faster than conv_mma.cu for them. F32 math with f32_gemm: the library's F32 GEMM
    // for the calls the tensor-core paths would take (batched), else exact.
    if (gemm_candidate(p)) {
        if (conv1d_gemm(p, s)) return;
        if (p.math != MathMode::F32 && p.w.dtype == DType::F32) return conv1d_mma(p, s);
    }
    const cudaStream_t st = detail::resolve(s);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        if (detail::try_conv1d_row<T>(p, st) || detail::try_conv1d_tiled<T>(p, st)) return;
        detail::launch_conv1d_generic<T>(p, st);
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv1d");
}

void conv1d_group_norm(const Conv1dGroupNormParams& p, Stream s) {
    // Batched calls on the library GEMM: the norm reads the GEMM's [position][channel] output plus the bias itself,
    // so the transpose kernel and the raw output's round trip through memory go. Otherwise the two ops (at batch 1,
    // GroupNorm folded into the conv before it gained nothing and into the conv after it lost:
    // docs/kernels/cuda_conv.md).
    if (gemm_candidate(p.conv) && conv1d_gemm_group_norm(p, s)) return;
    conv1d(p.conv, s);
    group_norm(p.norm, s);
}

}  // namespace flowedge::cuda
