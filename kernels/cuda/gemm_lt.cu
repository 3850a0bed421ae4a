// Opt-in tensor-core torch.nn.Conv1d for batched calls on cuBLASLt: an explicit im2col panel in the caller's
// scratch, one library GEMM (TF32 or BF16 operands, float accumulation), then a transpose that adds the bias.
// conv_mma.cu's own WMMA implicit GEMM was correct but staging-bound (~12.5 TFLOPS at PushT batch 64, 128.5 ms per
// sample); a tuned library GEMM on the same operands is the way to the tensor cores' rate.
//
// GEMM view (column-major, as cuBLASLt sees memory): D (O x N) = W (O x Kg) * P^T, N = batch*out_length,
// Kg = in_channels*kernel, n = b*out_length + t, kk = i*kernel + k.
//   A = the weights as stored, row-major [O][Kg] = column-major Kg x O, used transposed (CUBLAS_OP_T);
//   B = the panel P[n][kk] = x[b, i, t*stride + k - pad] (0 outside [0, in_length)) = column-major Kg x N (OP_N);
//   D = [n][o] floats (column-major O x N), then y[b, o, t] = D[n][o] + bias[o] (transpose kernel).
// Operand types: F32 weights -> TF32 GEMM (CUBLAS_COMPUTE_32F_FAST_TF32; the panel is rounded to TF32 with
// round-to-nearest when it is written, the weights are converted by the library), under either TF32 or BF16 math
// (TF32 is the more exact of the two, so a BF16 request stays within its bound); BF16 weights under BF16 math ->
// BF16 GEMM (panel rounded to BF16, nearest-even; weights exact). Other combinations (F16 weights, BF16 weights
// under TF32 math) keep conv_mma.cu's kernels, which round each operand to the requested format themselves.
//
// Error per output (for the tests): each product is off by at most (u_w + u_x + u_w u_x)|w||x| with u_x the panel's
// rounding (TF32 RN 2^-11, BF16 RNE 2^-8) and u_w the library's conversion of F32 weights to TF32 (taken as
// truncation, 2^-10, since cuBLASLt does not document its rounding; 0 for BF16 weights); the float accumulation,
// in whatever order and split the library picks, adds at most ~Kg * 2^-24 relative to sum|w||x| (first-order
// bound for recursive summation), plus the bias add 2^-24|y|:
//   TF32: |y - y_exact| <= (2^-10 + 2^-11 + Kg * 2^-24) * sum_{i,k} |w||x|; BF16: (2^-8 + Kg * 2^-24) * sum |w||x|.
// Determinism: cuBLASLt gives bitwise identical results run to run for a fixed algorithm on one GPU model; the
// algorithm is chosen once per shape (heuristic, cached), and split-K reductions use the workspace, not atomics.
//
// Resources: one cuBLASLt handle per device, created by prepare_math() (DiffusionHead::set_math) or by the first
// call outside a graph capture, kept for the process (like the runtime's per-device attribute caches). No device
// allocation here: the panel, the GEMM output and the library's workspace come from Conv1dParams::scratch, which
// the model sizes at load (conv1d_scratch_bytes). A call made while capturing before any handle exists, a shape
// the heuristic has no algorithm for, missing scratch or FLOWEDGE_CUDA_NO_LT=1 use conv_mma.cu instead.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"
#include "flowedge/cuda/runtime.hpp"

namespace flowedge::cuda {
namespace {

/// cuBLASLt workspace for split-K and similar algorithms (enough for the PushT shapes at batch 64: 2048 x 256
/// outputs x up to 16 splits of floats = 32 MB).
constexpr std::size_t kLtWorkspaceBytes = std::size_t(32) << 20;
constexpr std::size_t kAlign = 256;

constexpr std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

enum class GemmKind { Tf32, Bf16 };

/// The GEMM conv1d_gemm would run for p, if any (weight dtype x math, see the file comment).
bool gemm_kind(const Conv1dParams& p, GemmKind& kind) {
    if (p.w.dtype == DType::F32 && (p.math == MathMode::TF32 || p.math == MathMode::BF16)) {
        kind = GemmKind::Tf32;
        return true;
    }
    if (p.w.dtype == DType::BF16 && p.math == MathMode::BF16) {
        kind = GemmKind::Bf16;
        return true;
    }
    return false;
}

struct ScratchLayout {
    std::size_t panel = 0, out = 0, total = 0;
};
/// [panel N x Kg (4 bytes per element, enough for both kinds) | D N x O floats | library workspace].
ScratchLayout scratch_layout(const Conv1dParams& p) {
    const std::size_t n = std::size_t(p.batch) * std::size_t(p.out_length);
    const std::size_t kg = std::size_t(p.in_channels) * std::size_t(p.kernel);
    ScratchLayout s;
    s.panel = align_up(n * kg * sizeof(float));
    s.out = align_up(n * std::size_t(p.out_channels) * sizeof(float));
    s.total = s.panel + s.out + kLtWorkspaceBytes;
    return s;
}

void lt_check(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS) [[unlikely]]
        fail("cuda conv1d_gemm", std::string(what) + " failed: cuBLASLt status " + std::to_string(int(st)));
}

/// One GEMM shape's descriptors and chosen algorithm (created once, kept for the process).
struct Plan {
    bool usable = false;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

struct DeviceLt {
    std::mutex mutex;
    cublasLtHandle_t handle = nullptr;
    // (kind, m, n, k, alignment of the weight pointer) -> plan
    std::map<std::tuple<int, int, int, int, int>, Plan> plans;
};

DeviceLt& device_lt() {
    static DeviceLt devices[64];
    int dev = 0;
    FLOWEDGE_CUDA_CHECK(cudaGetDevice(&dev));
    return devices[dev & 63];
}

/// Largest power of two (<= 256) dividing the address: what the heuristic may assume about the weight pointer.
int pointer_alignment(const void* p) {
    const auto v = reinterpret_cast<std::uintptr_t>(p);
    int a = 256;
    while (a > 1 && v % std::uintptr_t(a) != 0) a /= 2;
    return a;
}

const Plan& plan_for(DeviceLt& lt, GemmKind kind, int m, int n, int k, int align_w) {
    const auto key = std::make_tuple(int(kind), m, n, k, align_w);
    auto it = lt.plans.find(key);
    if (it != lt.plans.end()) return it->second;
    Plan pl;
    const cudaDataType_t ab = kind == GemmKind::Tf32 ? CUDA_R_32F : CUDA_R_16BF;
    const cublasComputeType_t compute = kind == GemmKind::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    lt_check(cublasLtMatmulDescCreate(&pl.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    lt_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
    lt_check(cublasLtMatrixLayoutCreate(&pl.a, ab, std::uint64_t(k), std::uint64_t(m), std::int64_t(k)), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&pl.b, ab, std::uint64_t(k), std::uint64_t(n), std::int64_t(k)), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&pl.d, CUDA_R_32F, std::uint64_t(m), std::uint64_t(n), std::int64_t(m)), "layout D");
    cublasLtMatmulPreference_t pref = nullptr;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t ws = kLtWorkspaceBytes;
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "set workspace");
    const std::uint32_t al_w = std::uint32_t(align_w), al_s = 256;
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_w, sizeof(al_w)), "set align A");
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_s, sizeof(al_s)), "set align B");
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_s, sizeof(al_s)), "set align C");
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_s, sizeof(al_s)), "set align D");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt.handle, pl.op, pl.a, pl.b, pl.d, pl.d, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
        pl.algo = result.algo;
        pl.usable = true;
    }
    return lt.plans.emplace(key, pl).first->second;
}

bool capturing(cudaStream_t st) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FLOWEDGE_CUDA_CHECK(cudaStreamIsCapturing(st, &status));
    return status != cudaStreamCaptureStatusNone;
}

/// Round to TF32 (10 explicit mantissa bits), nearest, ties away: the value the tensor cores then use exactly.
__device__ __forceinline__ float round_tf32(float v) {
    std::uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
}

/// P[n][kk] = x[b, i, t*stride + k - pad] (0 outside), n = b*out_length + t, kk = i*kernel + k, rounded to the
/// GEMM's operand type. Block rows (grid y) walk n, threads walk kk: coalesced panel writes; the reads gather from
/// short x rows that stay in L1/L2.
template <class P>
__global__ void conv1d_im2col_kernel(const Conv1dParams p, P* __restrict__ panel, int n_total) {
    detail::pdl_wait();
    const int kg = p.in_channels * p.kernel;
    for (int n = blockIdx.y; n < n_total; n += gridDim.y) {
        const int b = n / p.out_length, t = n - b * p.out_length;
        const float* __restrict__ xb = p.x + std::size_t(b) * p.in_channels * p.in_length;
        P* __restrict__ row = panel + std::size_t(n) * kg;
        for (int kk = blockIdx.x * blockDim.x + threadIdx.x; kk < kg; kk += gridDim.x * blockDim.x) {
            const int i = kk / p.kernel, k = kk - i * p.kernel;
            const int src = t * p.stride + k - p.pad;
            const float v = (src >= 0 && src < p.in_length) ? xb[std::size_t(i) * p.in_length + src] : 0.f;
            if constexpr (std::is_same_v<P, float>) row[kk] = round_tf32(v);
            else row[kk] = __float2bfloat16_rn(v);
        }
    }
}

/// y[b, o, t] = d[n][o] + bias[o], n = b*out_length + t: a 32 x 32 tile transpose through shared memory
/// (reads coalesced along o, writes along n, which is t-contiguous within each batch row).
__global__ void conv1d_gemm_out_kernel(const Conv1dParams p, const float* __restrict__ d, int n_total) {
    __shared__ float tile[32][33];
    detail::pdl_wait();
    const int o0 = blockIdx.x * 32, n0 = blockIdx.y * 32;
    const int O = p.out_channels;
    for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        const int n = n0 + r, o = o0 + threadIdx.x;
        if (n < n_total && o < O) tile[r][threadIdx.x] = d[std::size_t(n) * O + o];
    }
    __syncthreads();
    for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        const int o = o0 + r, n = n0 + threadIdx.x;
        if (n < n_total && o < O) {
            const int b = n / p.out_length, t = n - b * p.out_length;
            const float v = tile[threadIdx.x][r];
            p.y[(std::size_t(b) * O + o) * p.out_length + t] = p.bias ? v + p.bias[o] : v;
        }
    }
}

}  // namespace

void prepare_math(MathMode m) {
    if (m == MathMode::F32 || !device_available() || detail::compute_major() < 8) return;
    DeviceLt& lt = device_lt();
    std::lock_guard<std::mutex> lock(lt.mutex);
    if (!lt.handle) lt_check(cublasLtCreate(&lt.handle), "cublasLtCreate");
}

std::size_t conv1d_scratch_bytes(const Conv1dParams& p) {
    if (p.batch <= 0 || p.out_length <= 0 || p.in_channels <= 0 || p.kernel <= 0 || p.out_channels <= 0) return 0;
    if (!device_available()) return 0;
    Conv1dParams q = p;
    q.math = MathMode::TF32;  // the scratch is sized at load, whatever math is asked for later
    if (!conv1d_mma_selected(q)) return 0;
    return scratch_layout(p).total;
}

bool conv1d_gemm(const Conv1dParams& p, Stream s) {
    GemmKind kind{};
    if (!gemm_kind(p, kind) || detail::env_flag("FLOWEDGE_CUDA_NO_LT")) return false;
    const ScratchLayout sl = scratch_layout(p);
    if (!p.scratch || p.scratch_bytes < sl.total || !detail::aligned(p.scratch, kAlign)) return false;
    const std::int64_t n = std::int64_t(p.batch) * p.out_length, kg = std::int64_t(p.in_channels) * p.kernel;
    if (n >= (std::int64_t(1) << 31) || kg >= (std::int64_t(1) << 31)) return false;
    const cudaStream_t st = detail::resolve(s);
    DeviceLt& lt = device_lt();
    std::lock_guard<std::mutex> lock(lt.mutex);
    if (!lt.handle) {
        if (capturing(st)) return false;  // cublasLtCreate may allocate: not inside a capture
        lt_check(cublasLtCreate(&lt.handle), "cublasLtCreate");
    }
    const Plan& pl = plan_for(lt, kind, p.out_channels, int(n), int(kg), pointer_alignment(p.w.data));
    if (!pl.usable) return false;
    auto* base = static_cast<unsigned char*>(p.scratch);
    void* panel = base;
    float* d = reinterpret_cast<float*>(base + sl.panel);
    void* ws = base + sl.panel + sl.out;
    const dim3 im2col_grid(unsigned((kg + 255) / 256), unsigned(std::min<std::int64_t>(n, 65535)));
    if (kind == GemmKind::Tf32)
        detail::launch_pdl(conv1d_im2col_kernel<float>, im2col_grid, dim3(256), 0, st, p, static_cast<float*>(panel), int(n));
    else
        detail::launch_pdl(conv1d_im2col_kernel<__nv_bfloat16>, im2col_grid, dim3(256), 0, st, p,
                           static_cast<__nv_bfloat16*>(panel), int(n));
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv1d_im2col");
    const float alpha = 1.f, beta = 0.f;
    lt_check(cublasLtMatmul(lt.handle, pl.op, &alpha, p.w.data, pl.a, panel, pl.b, &beta, d, pl.d, d, pl.d, &pl.algo, ws,
                            kLtWorkspaceBytes, st),
             "cublasLtMatmul");
    const dim3 grid(unsigned((p.out_channels + 31) / 32), unsigned((n + 31) / 32));
    detail::launch_pdl(conv1d_gemm_out_kernel, grid, dim3(32, 8), 0, st, p, static_cast<const float*>(d), int(n));
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv1d_gemm_out");
    return true;
}

}  // namespace flowedge::cuda
