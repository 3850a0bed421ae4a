// Library-GEMM paths on cuBLASLt for batched calls (MathMode TF32/BF16, or F32 with f32_gemm): torch.nn.Linear with
// many rows (linear_gemm: y = x W^T + bias straight from the caller's row-major x and y, no copies), torch.nn.Conv1d
// (conv1d_gemm, below; conv1d_gemm_group_norm hands the GEMM's output to a GroupNorm that reads that layout itself)
// and torch.nn.ConvTranspose1d (conv_transpose1d_gemm: the same GEMM over every output channel x tap, with the
// weights [in][out * kernel] as stored, on x transposed by the kernel-1 im2col, then a gather of each output's taps).
//
// Linear: D (out x rows, column-major = y [rows][out] with row stride ld_y) = W (out x in) * X^T, X = x [rows][in]
// (column-major in x rows, ld_x), bias and ReLU through the library's epilogues, accumulate as beta = 1 (C = D = y);
// F32 weights only, rows >= kLinearMinRows, no workspace: a TF32 GEMM under TF32/BF16 math (x converted by the
// library: both operands as for F32 weights below), an F32 GEMM (CUBLAS_COMPUTE_32F) under F32 math when the caller
// asks for it (LinearParams::f32_gemm). Anything else keeps linear.cu's exact kernels.
//
// Conv1d for batched calls on cuBLASLt: an explicit im2col panel in the caller's
// scratch, one library GEMM (TF32 or BF16 operands, float accumulation), then a transpose that adds the bias.
// conv_mma.cu's own WMMA implicit GEMM is correct but staging-bound far below the tensor cores' rate; a tuned
// library GEMM on the same operands reaches it (docs/performance/cuda.md).
//
// GEMM view (column-major, as cuBLASLt sees memory): D (O x N) = W (O x Kg) * P^T, N = batch*out_length,
// Kg = in_channels*kernel, n = b*out_length + t, kk = i*kernel + k.
//   A = the weights as stored, row-major [O][Kg] = column-major Kg x O, used transposed (CUBLAS_OP_T);
//   B = the panel P[n][kk] = x[b, i, t*stride + k - pad] (0 outside [0, in_length)) = column-major Kg x N (OP_N);
//   D = [n][o] floats (column-major O x N), then y[b, o, t] = D[n][o] + bias[o] (transpose kernel).
// Operand types: F32 weights -> TF32 GEMM (CUBLAS_COMPUTE_32F_FAST_TF32; the panel is rounded to TF32 with
// round-to-nearest when it is written, the weights are converted by the library), under either TF32 or BF16 math
// (TF32 is the more exact of the two, so a BF16 request stays within its bound); BF16 weights under BF16 math ->
// BF16 GEMM (panel rounded to BF16, nearest-even; weights exact); F32 weights under F32 math with
// Conv1dParams::f32_gemm -> F32 GEMM (CUBLAS_COMPUTE_32F, panel exact: an F32 GEMM's error, ~Kg 2^-24 sum|w||x| at
// worst). Other combinations (F16 weights, BF16 weights under TF32 math) run the exact kernels (faster there than
// conv_mma.cu's WMMA; see conv1d_dispatch.cu).
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
// the heuristic has no algorithm for, missing scratch or FLOWEDGE_CUDA_NO_LT=1 fall back to conv_mma.cu (F32
// weights) or the exact kernels (16-bit weights).
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "common.cuh"
#include "gemm_lt.cuh"
#include "group_norm_common.cuh"
#include "flowedge/cuda/launchers.hpp"
#include "flowedge/cuda/device.hpp"

namespace flowedge::cuda {
using namespace lt;
namespace {

/// Fewest rows for which a linear goes to the library GEMM (below, the exact GEMV-style kernels stream the weights
/// once for all rows and are faster).
constexpr int kLinearMinRows = 32;

/// The GEMM conv1d_gemm would run for p, if any (weight dtype x math, see the file comment).
bool gemm_kind(const Conv1dParams& p, GemmKind& kind) {
    if (p.w.dtype == DType::F32 && p.math == MathMode::F32 && p.f32_gemm) {
        kind = GemmKind::F32;
        return true;
    }
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

/// A transposed conv as a kernel-1 Conv1d with out_channels * kernel outputs: its im2col panel is x transposed to
/// [n][i] (n = b * in_length + s) and its GEMM gives D[n][o * kernel + k] (the weights [in][out * kernel] used as
/// stored, GemmShape::a_mk).
Conv1dParams transpose_as_conv(const ConvTranspose1dParams& p) {
    Conv1dParams q;
    q.x = p.x;
    q.w = p.w;
    q.batch = p.batch;
    q.in_channels = p.in_channels;
    q.out_channels = p.out_channels * p.kernel;
    q.in_length = p.in_length;
    q.out_length = p.in_length;
    q.math = p.math;
    q.f32_gemm = p.f32_gemm;
    q.scratch = p.scratch;
    q.scratch_bytes = p.scratch_bytes;
    return q;
}

/// Whether a GEMM path may take q: the calls the tensor-core conv path takes (batched), whatever the math asked.
bool batched_enough(Conv1dParams q) {
    q.math = MathMode::TF32;
    return conv1d_mma_selected(q);
}

void lt_check(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS) [[unlikely]]
        fail(ErrorKind::Device, "cuda gemm_lt", std::string(what) + " failed: cuBLASLt status " + std::to_string(int(st)));
}

/// Heuristic candidates timed per shape under FLOWEDGE_CUDA_LT_AUTOTUNE=1, and the split-K variants added to them
/// (kSplitKs of each of the first kSplitKBases candidates that support split-K, for plans with a workspace).
constexpr int kHeuristicCandidates = 8;
constexpr int kSplitKs[] = {2, 4, 8};
constexpr int kSplitKBases = 2;
constexpr int kAutotuneCandidates = kHeuristicCandidates + kSplitKBases * int(std::size(kSplitKs));

/// One GEMM shape's descriptors and chosen algorithm (created once, kept for the process). candidates: the
/// heuristic's algorithms, best first (several only under FLOWEDGE_CUDA_LT_AUTOTUNE=1, see tune()).
struct Plan {
    bool usable = false;
    bool tuned = false;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    cublasLtMatmulAlgo_t candidates[kAutotuneCandidates]{};
    int n_candidates = 0;
};

/// What a plan depends on: operand kind, A's layout, the GEMM's m x n x k, leading dimensions of B and D, the
/// alignment the weight / B / D pointers are known to have, the bias and ReLU epilogues (linears) and the workspace
/// the algorithm may use (conv: kLtWorkspaceBytes, linear: none).
using PlanKey = std::tuple<int, bool, int, int, int, int, int, int, int, int, bool, bool, std::size_t>;

struct DeviceLt {
    std::mutex mutex;
    cublasLtHandle_t handle = nullptr;
    std::map<PlanKey, Plan> plans;
    // Autotuning only: the stream and events tune() times candidates with, made with the handle (outside a capture).
    cudaStream_t tune_stream = nullptr;
    cudaEvent_t tune_start = nullptr, tune_stop = nullptr;
};

DeviceLt& device_lt() {
    static DeviceLt devices[64];
    int dev = 0;
    FLOWEDGE_CUDA_CHECK(cudaGetDevice(&dev));
    return devices[dev & 63];
}

/// The split-K variants of the plan's first kSplitKBases candidates, so that autotuning also tries splitting K where
/// the heuristic's tiles leave SMs idle (the U-Net's deep convs at batch 64: M = 2048 or 1024 outputs, N = 256
/// columns, K up to 10240). Only reductions through the workspace (deterministic, no atomics) that
/// cublasLtMatmulAlgoCheck accepts within `workspace` bytes.
void add_split_k(DeviceLt& lt, Plan& pl, std::size_t workspace) {
    const int bases = std::min(pl.n_candidates, kSplitKBases);
    for (int i = 0; i < bases; ++i) {
        std::int32_t support = 0;
        std::uint32_t schemes = 0;
        std::size_t written = 0;
        if (cublasLtMatmulAlgoCapGetAttribute(&pl.candidates[i], CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support,
                                              sizeof(support), &written) != CUBLAS_STATUS_SUCCESS || !support)
            continue;
        if (cublasLtMatmulAlgoCapGetAttribute(&pl.candidates[i], CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes,
                                              sizeof(schemes), &written) != CUBLAS_STATUS_SUCCESS)
            continue;
        const std::uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        if (!(schemes & scheme)) continue;
        for (const int splits : kSplitKs) {
            cublasLtMatmulAlgo_t algo = pl.candidates[i];
            const std::uint32_t n = std::uint32_t(splits);
            if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &n, sizeof(n)) != CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme)) !=
                    CUBLAS_STATUS_SUCCESS)
                continue;
            cublasLtMatmulHeuristicResult_t check{};
            if (cublasLtMatmulAlgoCheck(lt.handle, pl.op, pl.a, pl.b, pl.d, pl.d, &algo, &check) == CUBLAS_STATUS_SUCCESS &&
                check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= workspace)
                pl.candidates[pl.n_candidates++] = algo;
        }
    }
}

Plan& plan_for(DeviceLt& lt, const GemmShape& g) {
    const PlanKey key{int(g.kind), g.a_mk, g.m, g.n, g.k, g.ldb, g.ldd, g.align_w, g.align_b, g.align_d, g.bias, g.relu, g.workspace};
    auto it = lt.plans.find(key);
    if (it != lt.plans.end()) return it->second;
    Plan pl;
    const cudaDataType_t ab = g.kind == GemmKind::Bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute = g.kind == GemmKind::Tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    lt_check(cublasLtMatmulDescCreate(&pl.op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = g.a_mk ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    lt_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
    if (g.bias || g.relu) {
        const cublasLtEpilogue_t epi = g.bias ? (g.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS) : CUBLASLT_EPILOGUE_RELU;
        lt_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "set EPILOGUE");
    }
    if (g.bias) {
        const cudaDataType_t bias_type = CUDA_R_32F;
        lt_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
                 "set BIAS_DATA_TYPE");
    }
    if (g.a_mk) lt_check(cublasLtMatrixLayoutCreate(&pl.a, ab, std::uint64_t(g.m), std::uint64_t(g.k), std::int64_t(g.m)), "layout A");
    else lt_check(cublasLtMatrixLayoutCreate(&pl.a, ab, std::uint64_t(g.k), std::uint64_t(g.m), std::int64_t(g.k)), "layout A");
    lt_check(cublasLtMatrixLayoutCreate(&pl.b, ab, std::uint64_t(g.k), std::uint64_t(g.n), std::int64_t(g.ldb)), "layout B");
    lt_check(cublasLtMatrixLayoutCreate(&pl.d, CUDA_R_32F, std::uint64_t(g.m), std::uint64_t(g.n), std::int64_t(g.ldd)), "layout D");
    cublasLtMatmulPreference_t pref = nullptr;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t ws = g.workspace;
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "set workspace");
    const std::uint32_t al_a = std::uint32_t(g.align_w), al_b = std::uint32_t(g.align_b), al_d = std::uint32_t(g.align_d);
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)), "set align A");
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)), "set align B");
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)), "set align C");
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)), "set align D");
    cublasLtMatmulHeuristicResult_t results[kHeuristicCandidates]{};
    int found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt.handle, pl.op, pl.a, pl.b, pl.d, pl.d, pref,
                                                             autotune_enabled() ? kHeuristicCandidates : 1, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs == CUBLAS_STATUS_SUCCESS)
        for (int i = 0; i < found; ++i)
            if (results[i].state == CUBLAS_STATUS_SUCCESS) pl.candidates[pl.n_candidates++] = results[i].algo;
    if (autotune_enabled() && g.workspace > 0) add_split_k(lt, pl, g.workspace);
    if (pl.n_candidates > 0) {
        pl.algo = pl.candidates[0];
        pl.usable = true;
    }
    return lt.plans.emplace(key, pl).first->second;
}

bool capturing(cudaStream_t st) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FLOWEDGE_CUDA_CHECK(cudaStreamIsCapturing(st, &status));
    return status != cudaStreamCaptureStatusNone;
}

/// FLOWEDGE_CUDA_LT_AUTOTUNE=1: the plan's first call times every candidate on the call's own operands (2 runs each
/// after a warm-up; the caller's D is only overwritten, beta = 0) and keeps the fastest for the process. Off by
/// default: the choice then depends on timing, so two processes may pick different algorithms and differ in the last
/// bits (the heuristic's first choice is the same every run). Models make their first calls inside a graph capture,
/// so the timing runs on the handle's own stream, outside the capture: the thread's capture mode is relaxed for it
/// (cudaThreadExchangeStreamCaptureMode), and the capture began on an idle device (graph_begin_capture), so nothing
/// still in flight uses the operands or the workspace.
void tune(DeviceLt& lt, Plan& pl, const void* a, const void* b, float* d, void* ws, std::size_t ws_bytes, cudaStream_t st) {
    if (pl.tuned) return;
    pl.tuned = true;
    if (pl.n_candidates < 2 || !lt.tune_stream) return;
    const bool in_capture = capturing(st);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (in_capture) FLOWEDGE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    else FLOWEDGE_CUDA_CHECK(cudaStreamSynchronize(st));  // the operands are ready, and nothing else uses them
    const cudaStream_t ts = lt.tune_stream;
    const float alpha = 1.f, beta = 0.f;
    float best = INFINITY;
    for (int i = 0; i < pl.n_candidates; ++i) {
        const cublasLtMatmulAlgo_t& algo = pl.candidates[i];
        auto run = [&] {
            return cublasLtMatmul(lt.handle, pl.op, &alpha, a, pl.a, b, pl.b, &beta, d, pl.d, d, pl.d, &algo, ws, ws_bytes, ts);
        };
        if (run() != CUBLAS_STATUS_SUCCESS) continue;
        FLOWEDGE_CUDA_CHECK(cudaEventRecord(lt.tune_start, ts));
        bool ok = run() == CUBLAS_STATUS_SUCCESS && run() == CUBLAS_STATUS_SUCCESS;
        FLOWEDGE_CUDA_CHECK(cudaEventRecord(lt.tune_stop, ts));
        FLOWEDGE_CUDA_CHECK(cudaEventSynchronize(lt.tune_stop));
        float ms = 0.f;
        FLOWEDGE_CUDA_CHECK(cudaEventElapsedTime(&ms, lt.tune_start, lt.tune_stop));
        if (ok && ms < best) {
            best = ms;
            pl.algo = algo;
        }
    }
    FLOWEDGE_CUDA_CHECK(cudaStreamSynchronize(ts));
    if (in_capture) FLOWEDGE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));  // back to the capture's mode
}

/// Creates the device's handle (and, for autotuning, the stream and events tune() times on); never inside a capture.
void create_handle(DeviceLt& lt) {
    lt_check(cublasLtCreate(&lt.handle), "cublasLtCreate");
    if (autotune_enabled()) {
        FLOWEDGE_CUDA_CHECK(cudaStreamCreateWithFlags(&lt.tune_stream, cudaStreamNonBlocking));
        FLOWEDGE_CUDA_CHECK(cudaEventCreate(&lt.tune_start));
        FLOWEDGE_CUDA_CHECK(cudaEventCreate(&lt.tune_stop));
    }
}

/// The device's handle, created here unless a capture is in progress (cublasLtCreate may allocate); null then.
cublasLtHandle_t handle_outside_capture(DeviceLt& lt, cudaStream_t st) {
    if (!lt.handle && !capturing(st)) create_handle(lt);
    return lt.handle;
}

/// Channels per im2col block and the longest kernel whose taps the block stages in shared memory.
constexpr int kIm2colChannels = 128;
constexpr int kIm2colMaxKernel = 8;

/// P[n][i*kernel + k] = x[b, i, t*stride + k - pad] (0 outside), n = b*out_length + t, rounded to the GEMM's
/// operand type. A block owns one panel row n (grid y, strided) and kIm2colChannels channels (grid x): each thread
/// gathers the taps of one channel (a short x row) into shared memory, then the block writes the
/// kIm2colChannels*kernel consecutive panel elements with consecutive threads (coalesced): one thread per element
/// pays 64-bit index divisions, one thread per channel writing its taps directly makes strided stores (their ncu
/// times: docs/performance/cuda.md).
template <class P, bool Tf32>
__global__ void __launch_bounds__(kIm2colChannels) conv1d_im2col_kernel(const Conv1dParams p, P* __restrict__ panel, int n_total) {
    __shared__ P taps[kIm2colChannels * kIm2colMaxKernel];
    detail::pdl_wait();
    const int kg = p.in_channels * p.kernel;
    const int i0 = blockIdx.x * kIm2colChannels;
    const int n_ch = min(kIm2colChannels, p.in_channels - i0);
    const int n_el = n_ch * p.kernel;
    for (int n = blockIdx.y; n < n_total; n += gridDim.y) {
        const int b = n / p.out_length, t = n - b * p.out_length;
        const int src0 = t * p.stride - p.pad;
        if (threadIdx.x < n_ch) {
            const float* __restrict__ xr = p.x + (std::size_t(b) * p.in_channels + i0 + threadIdx.x) * p.in_length;
            for (int k = 0; k < p.kernel; ++k) {
                const int src = src0 + k;
                const float v = (src >= 0 && src < p.in_length) ? xr[src] : 0.f;
                if constexpr (std::is_same_v<P, __nv_bfloat16>) taps[threadIdx.x * p.kernel + k] = __float2bfloat16_rn(v);
                else if constexpr (Tf32) taps[threadIdx.x * p.kernel + k] = round_tf32(v);
                else taps[threadIdx.x * p.kernel + k] = v;
            }
        }
        __syncthreads();
        P* __restrict__ out = panel + std::size_t(n) * kg + std::size_t(i0) * p.kernel;
        for (int e = threadIdx.x; e < n_el; e += kIm2colChannels) out[e] = taps[e];
        __syncthreads();  // taps is refilled for the next row
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
    const int L = p.out_length;
    if (32 % L == 0) {
        // The tile's 32 rows n are 32/L whole batch rows; for each, y[b, o0..o0+31, 0..L-1] is contiguous: write it
        // with consecutive threads (t fastest, then o).
        const int tid = threadIdx.y * blockDim.x + threadIdx.x, n_threads = blockDim.x * blockDim.y;
        for (int idx = tid; idx < 32 * 32; idx += n_threads) {
            const int t = idx % L, rest = idx / L, ol = rest & 31, bl = rest >> 5;
            const int n = n0 + bl * L + t, o = o0 + ol;
            if (n < n_total && o < O) {
                const float v = tile[bl * L + t][ol];
                p.y[(std::size_t(n / L) * O + o) * L + t] = p.bias ? v + p.bias[o] : v;
            }
        }
        return;
    }
    for (int r = threadIdx.y; r < 32; r += blockDim.y) {
        const int o = o0 + r, n = n0 + threadIdx.x;
        if (n < n_total && o < O) {
            const int b = n / L, t = n - b * L;
            const float v = tile[threadIdx.x][r];
            p.y[(std::size_t(b) * O + o) * L + t] = p.bias ? v + p.bias[o] : v;
        }
    }
}

/// y[b, o, t] = bias[o] + sum over taps k (ascending) with t + pad - k = s * stride, 0 <= s < in_length, of
/// d[b * in_length + s][o * kernel + k]: the transposed conv's outputs from its per-tap GEMM. One thread per output,
/// t fastest (coalesced writes; the <= 2 taps of the U-Net's upsampler are reads from L2).
__global__ void conv_transpose1d_col2im_kernel(const ConvTranspose1dParams p, const float* __restrict__ d) {
    detail::pdl_wait();
    const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
    const std::int64_t m = std::int64_t(p.out_channels) * p.kernel;
    for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
         idx += std::int64_t(gridDim.x) * blockDim.x) {
        const int t = int(idx % p.out_length);
        const std::int64_t bo = idx / p.out_length;
        const int o = int(bo % p.out_channels), b = int(bo / p.out_channels);
        float acc = 0.f;
        for (int k = 0; k < p.kernel; ++k) {
            const int num = t + p.pad - k;
            if (num < 0 || num % p.stride != 0) continue;
            const int s = num / p.stride;
            if (s >= p.in_length) continue;
            acc += d[(std::int64_t(b) * p.in_length + s) * m + std::int64_t(o) * p.kernel + k];
        }
        p.y[idx] = p.bias ? acc + p.bias[o] : acc;
    }
}

/// The im2col panel of q for GEMM kind `kind` (rounded to its operand type) into `panel`.
void launch_im2col(const Conv1dParams& q, GemmKind kind, void* panel, std::int64_t n, cudaStream_t st) {
    const dim3 grid(unsigned((q.in_channels + kIm2colChannels - 1) / kIm2colChannels), unsigned(std::min<std::int64_t>(n, 65535)));
    if (kind == GemmKind::Tf32)
        detail::launch_pdl(conv1d_im2col_kernel<float, true>, grid, dim3(kIm2colChannels), 0, st, q, static_cast<float*>(panel), int(n));
    else if (kind == GemmKind::F32)
        detail::launch_pdl(conv1d_im2col_kernel<float, false>, grid, dim3(kIm2colChannels), 0, st, q, static_cast<float*>(panel), int(n));
    else
        detail::launch_pdl(conv1d_im2col_kernel<__nv_bfloat16, false>, grid, dim3(kIm2colChannels), 0, st, q,
                           static_cast<__nv_bfloat16*>(panel), int(n));
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv1d_im2col");
}

}  // namespace

bool lt::autotune_enabled() {
    static const bool on = detail::env_flag("FLOWEDGE_CUDA_LT_AUTOTUNE");
    return on;
}

bool lt::gemm(const GemmShape& g, const void* a, const void* b, float* d, void* workspace, cudaStream_t st) {
    DeviceLt& lt = device_lt();
    std::lock_guard<std::mutex> lock(lt.mutex);
    if (!handle_outside_capture(lt, st)) return false;
    Plan& pl = plan_for(lt, g);
    if (!pl.usable) return false;
    tune(lt, pl, a, b, d, workspace, g.workspace, st);
    const float alpha = 1.f, beta = 0.f;
    lt_check(cublasLtMatmul(lt.handle, pl.op, &alpha, a, pl.a, b, pl.b, &beta, d, pl.d, d, pl.d, &pl.algo, workspace,
                            g.workspace, st),
             "cublasLtMatmul");
    return true;
}

void prepare_math(MathMode) {
    if (!device_available() || detail::compute_major() < 8) return;
    DeviceLt& lt = device_lt();
    std::lock_guard<std::mutex> lock(lt.mutex);
    if (!lt.handle) create_handle(lt);
}

bool linear_gemm(const LinearParams& p, Stream s) {
    if ((p.math == MathMode::F32 && !p.f32_gemm) || p.w.dtype != DType::F32 || p.rows < kLinearMinRows ||
        detail::env_flag("FLOWEDGE_CUDA_NO_LT"))
        return false;
    // The library's epilogues: bias, then ReLU; accumulating (beta = 1) only without an activation, since the
    // library would apply it to the sum, torch to the product alone.
    if (!(p.act == Activation::None || p.act == Activation::Relu) || (p.accumulate && p.act != Activation::None)) return false;
    if (!device_available() || detail::compute_major() < 8) return false;
    const cudaStream_t st = detail::resolve(s);
    DeviceLt& lt = device_lt();
    std::lock_guard<std::mutex> lock(lt.mutex);
    if (!handle_outside_capture(lt, st)) return false;
    GemmShape g;
    g.kind = p.math == MathMode::F32 ? GemmKind::F32 : GemmKind::Tf32;
    g.m = p.out;
    g.n = p.rows;
    g.k = p.in;
    g.ldb = p.ld_x ? p.ld_x : p.in;
    g.ldd = p.ld_y ? p.ld_y : p.out;
    g.align_w = pointer_alignment(p.w.data);
    g.align_b = pointer_alignment(p.x);
    g.align_d = pointer_alignment(p.y);
    g.bias = p.bias != nullptr;
    g.relu = p.act == Activation::Relu;
    Plan& pl = plan_for(lt, g);
    if (!pl.usable) return false;
    if (g.bias)
        lt_check(cublasLtMatmulDescSetAttribute(pl.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)),
                 "set BIAS_POINTER");
    if (!p.accumulate) tune(lt, pl, p.w.data, p.x, p.y, nullptr, 0, st);  // an accumulating call's reruns would add up
    const float alpha = 1.f, beta = p.accumulate ? 1.f : 0.f;
    lt_check(cublasLtMatmul(lt.handle, pl.op, &alpha, p.w.data, pl.a, p.x, pl.b, &beta, p.y, pl.d, p.y, pl.d, &pl.algo,
                            nullptr, 0, st),
             "cublasLtMatmul");
    return true;
}

std::size_t conv1d_scratch_bytes(const Conv1dParams& p) {
    if (p.batch <= 0 || p.out_length <= 0 || p.in_channels <= 0 || p.kernel <= 0 || p.out_channels <= 0) return 0;
    if (!device_available()) return 0;
    Conv1dParams q = p;
    q.math = MathMode::TF32;  // the scratch is sized at load, whatever math is asked for later
    if (!conv1d_mma_selected(q)) return 0;
    return scratch_layout(p).total;
}

namespace {

/// The im2col panel and library GEMM of p into p.scratch: returns the GEMM's output D[n][o] (n = b * out_length + t,
/// no bias), or null, launching nothing, where the library path declines. a_mk: p is a transposed conv's view
/// (transpose_as_conv), its weights [in][out] used as stored.
const float* im2col_gemm(const Conv1dParams& p, bool a_mk, cudaStream_t st) {
    GemmKind kind{};
    if (!gemm_kind(p, kind) || detail::env_flag("FLOWEDGE_CUDA_NO_LT")) return nullptr;
    if (p.kernel > kIm2colMaxKernel) return nullptr;  // the im2col block stages at most kIm2colMaxKernel taps
    const ScratchLayout sl = scratch_layout(p);
    if (!p.scratch || p.scratch_bytes < sl.total || !detail::aligned(p.scratch, kAlign)) return nullptr;
    const std::int64_t n = std::int64_t(p.batch) * p.out_length, kg = std::int64_t(p.in_channels) * p.kernel;
    if (n >= (std::int64_t(1) << 31) || kg >= (std::int64_t(1) << 31)) return nullptr;
    DeviceLt& lt = device_lt();
    std::lock_guard<std::mutex> lock(lt.mutex);
    if (!handle_outside_capture(lt, st)) return nullptr;
    GemmShape g;
    g.kind = kind;
    g.a_mk = a_mk;
    g.m = p.out_channels;
    g.n = int(n);
    g.k = int(kg);
    g.ldb = int(kg);
    g.ldd = p.out_channels;
    g.align_w = pointer_alignment(p.w.data);
    g.workspace = kLtWorkspaceBytes;
    Plan& pl = plan_for(lt, g);
    if (!pl.usable) return nullptr;
    auto* base = static_cast<unsigned char*>(p.scratch);
    void* panel = base;
    float* d = reinterpret_cast<float*>(base + sl.panel);
    void* ws = base + sl.panel + sl.out;
    launch_im2col(p, kind, panel, n, st);
    tune(lt, pl, p.w.data, panel, d, ws, kLtWorkspaceBytes, st);
    const float alpha = 1.f, beta = 0.f;
    lt_check(cublasLtMatmul(lt.handle, pl.op, &alpha, p.w.data, pl.a, panel, pl.b, &beta, d, pl.d, d, pl.d, &pl.algo, ws,
                            kLtWorkspaceBytes, st),
             "cublasLtMatmul");
    return d;
}

}  // namespace

bool conv1d_gemm(const Conv1dParams& p, Stream s) {
    const cudaStream_t st = detail::resolve(s);
    const float* d = im2col_gemm(p, false, st);
    if (!d) return false;
    const std::int64_t n = std::int64_t(p.batch) * p.out_length;
    const dim3 grid(unsigned((p.out_channels + 31) / 32), unsigned((n + 31) / 32));
    detail::launch_pdl(conv1d_gemm_out_kernel, grid, dim3(32, 8), 0, st, p, d, int(n));
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv1d_gemm_out");
    return true;
}

bool conv1d_gemm_group_norm(const Conv1dGroupNormParams& p, Stream s) {
    if (!detail::group_norm_gemm_layout_fits(p.norm)) return false;
    const cudaStream_t st = detail::resolve(s);
    const float* d = im2col_gemm(p.conv, false, st);
    if (!d) return false;
    detail::group_norm_gemm_layout(p.norm, d, p.conv.bias, st);
    return true;
}

std::size_t conv_transpose1d_scratch_bytes(const ConvTranspose1dParams& p) {
    if (p.batch <= 0 || p.in_length <= 0 || p.in_channels <= 0 || p.kernel <= 0 || p.out_channels <= 0) return 0;
    if (!device_available()) return 0;
    const Conv1dParams q = transpose_as_conv(p);
    return batched_enough(q) ? scratch_layout(q).total : 0;
}

bool conv_transpose1d_gemm(const ConvTranspose1dParams& p, Stream s) {
    const Conv1dParams q = transpose_as_conv(p);
    if (!batched_enough(q)) return false;
    const cudaStream_t st = detail::resolve(s);
    const float* d = im2col_gemm(q, true, st);
    if (!d) return false;
    const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
    detail::launch_pdl(conv_transpose1d_col2im_kernel, dim3(detail::blocks_for(total, 256)), dim3(256), 0, st, p, d);
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv_transpose1d_col2im");
    return true;
}

}  // namespace flowedge::cuda
