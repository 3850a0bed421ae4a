// torch.nn.Conv1d entry point: decides which path runs for a shape (tensor-core GEMM or implicit GEMM under
// TF32/BF16 math for batched calls, the library's F32 GEMM for batched F32 calls that ask for it (f32_gemm), else
// the exact row, tiled or generic kernel); the table of shapes and paths is
// in docs/kernels/cuda_conv.md.
#include <cstdint>
#include <string_view>

#include "common.cuh"
#include "conv1d_paths.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {

void conv1d(const Conv1dParams& p, Stream s) {
    constexpr std::string_view comp = "cuda conv1d";
    detail::check_conv1d(p, comp);
    // Opt-in TF32/BF16 tensor-core paths: cuBLASLt (gemm_lt.cu) for F32 weights and for BF16 weights under BF16
    // math; F32 weights it declines (no scratch, say) go to conv_mma.cu. 16-bit weights the GEMM declines stay on
    // the exact kernels, which are faster than conv_mma.cu for them.
    if (conv1d_mma_selected(p)) {
        if (conv1d_gemm(p, s)) return;
        if (p.w.dtype == DType::F32) return conv1d_mma(p, s);
    } else if (p.math == MathMode::F32 && p.f32_gemm) {
        // F32 math on the library's F32 GEMM for the calls the tensor-core paths would take (batched), else exact.
        Conv1dParams q = p;
        q.math = MathMode::TF32;
        if (conv1d_mma_selected(q) && conv1d_gemm(p, s)) return;
    }
    const cudaStream_t st = detail::resolve(s);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        if (detail::try_conv1d_row<T>(p, st) || detail::try_conv1d_tiled<T>(p, st)) return;
        detail::launch_conv1d_generic<T>(p, st);
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv1d");
}

}  // namespace flowedge::cuda
