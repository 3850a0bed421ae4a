// What the cuBLASLt paths share (gemm_lt.cu: linear and conv1d; conv2d_gemm.cu: conv2d): the GEMM shape a plan is
// cached under, the operand kinds, the library workspace size, TF32 rounding and one entry point that runs a GEMM
// on the device's handle with a cached plan.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace flowedge::cuda::lt {

/// cuBLASLt workspace for split-K and similar algorithms (enough for the PushT shapes at batch 64: 2048 x 256
/// outputs x up to 16 splits of floats = 32 MB).
constexpr std::size_t kLtWorkspaceBytes = std::size_t(32) << 20;
/// Alignment of every scratch region (the workspace arena's, Workspace<B>::kAlign).
constexpr std::size_t kAlign = 256;

constexpr std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

/// Operand types: TF32 (F32 operands, CUBLAS_COMPUTE_32F_FAST_TF32), BF16 (float accumulation) or F32 (F32
/// operands and products, CUBLAS_COMPUTE_32F: the library's SIMT SGEMM, the F32-math path).
enum class GemmKind { Tf32, Bf16, F32 };

/// Column-major view, as cuBLASLt sees memory: D (m x n, column stride ldd, float) = A^T * B with A stored k x m
/// (row-major [m][k], column stride k; the linear's and conv1d's weights, conv2d's im2col panel) and B k x n
/// (column stride ldb); with a_mk, D = A * B with A stored m x k (row-major [k][m], column stride m: the transposed
/// conv's weights [in][out * kernel]). align_*: the alignment the A / B / D pointers are known to have.
struct GemmShape {
    GemmKind kind = GemmKind::Tf32;
    bool a_mk = false;
    int m = 0, n = 0, k = 0;
    int ldb = 0, ldd = 0;
    int align_w = 256, align_b = 256, align_d = 256;
    bool bias = false;         // CUBLASLT_EPILOGUE_BIAS (bias[m], float)
    bool relu = false;         // CUBLASLT_EPILOGUE_RELU(_BIAS): max(0, .) after the bias
    std::size_t workspace = 0;
};

/// Largest power of two (<= 256) dividing the address: what the heuristic may assume about a pointer.
inline int pointer_alignment(const void* p) {
    const auto v = reinterpret_cast<std::uintptr_t>(p);
    int a = 256;
    while (a > 1 && v % std::uintptr_t(a) != 0) a /= 2;
    return a;
}

/// D = A^T * B on stream st for shape g (no bias epilogue), with g.workspace bytes of library workspace at
/// `workspace`. Returns false, launching nothing, when there is no handle (none yet while a graph is being captured)
/// or the library has no algorithm for the shape. Plans are cached per shape, the handle per device (gemm_lt.cu).
bool gemm(const GemmShape& g, const void* a, const void* b, float* d, void* workspace, cudaStream_t st);

/// FLOWEDGE_CUDA_LT_AUTOTUNE=1 (read once): plans time their candidate algorithms on their first call (gemm_lt.cu,
/// tune()). Graph captures then start on an idle device (device.cu), so that a first call made while capturing can
/// time the candidates on a side stream without racing earlier work on the same buffers.
bool autotune_enabled();

/// Round to TF32 (10 explicit mantissa bits), nearest, ties away: the value the tensor cores then use exactly.
__device__ __forceinline__ float round_tf32(float v) {
    std::uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
}

}  // namespace flowedge::cuda::lt
