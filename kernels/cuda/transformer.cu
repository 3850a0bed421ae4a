// The transformer ops (op_params_transformer.hpp) on CUDA, ACT's encoder and decoder at batch 1:
// layer_norm: one block of 256 threads per row; x + residual formed in float32, mean and variance in double (as the
//   CPU), y = float((t - mean) * rstd * gamma + beta) in double.
// attention: one fused kernel, one block per (query tile of 8, head): the query tile and 64-key tiles of K, then of
//   V, pass through shared memory; the tile's scores [16, n_kv] stay in shared memory between the passes. Scores are
//   float32 dots (fmaf over head_dim), softmax is exact: max-subtracted expf, the row sum in double, its reciprocal
//   rounded to float; the output accumulates p_j v_j with fmaf in key order (the CPU's order), then scales by the
//   reciprocal. Against the CPU only the dot products' summation order differs: each score differs by at most
//   head_dim * 2^-24 * sum_t |q_t k_t| * scale, which moves a softmax weight by that amount relatively (<= 1e-6 for
//   ACT's unit-scale activations), so the outputs agree to the op tests' 2e-6 relative to the double reference.
// gelu: erf in double, as the CPU. transpose: 32 x 32 shared-memory tiles. position_embedding_2d: the float32
//   operations torch performs (the CPU's sequence), with CUDA's precise powf / sinf / cosf.
#include <algorithm>
#include <string>

#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

// ---- layer_norm ----

constexpr int kNormThreads = 256;

using detail::block_sum;

__global__ void __launch_bounds__(kNormThreads) layer_norm_kernel(LayerNormParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    __shared__ double scratch[kNormThreads / 32];
    const std::size_t row = std::size_t(blockIdx.x) * std::size_t(p.dim);
    const float* x = p.x + row;
    const float* res = p.residual ? p.residual + row : nullptr;
    float* y = p.y + row;
    const auto at = [&](int i) { return res ? x[i] + res[i] : x[i]; };  // the float32 add torch performs
    double s = 0.0;
    for (int i = threadIdx.x; i < p.dim; i += kNormThreads) s += double(at(i));
    const double mean = block_sum(s, scratch) / double(p.dim);
    double ss = 0.0;
    for (int i = threadIdx.x; i < p.dim; i += kNormThreads) {
        const double d = double(at(i)) - mean;
        ss += d * d;
    }
    const double rstd = 1.0 / sqrt(block_sum(ss, scratch) / double(p.dim) + double(p.eps));
    // Every read of the row precedes block_sum's barrier; each y[i] is then written by the thread that reads its
    // inputs, so y may alias x or the residual.
    for (int i = threadIdx.x; i < p.dim; i += kNormThreads) {
        const double n = (double(at(i)) - mean) * rstd;
        y[i] = float(n * (p.gamma ? double(p.gamma[i]) : 1.0) + (p.beta ? double(p.beta[i]) : 0.0));
    }
}

// ---- attention ----

constexpr int kAttnThreads = 128;
constexpr int kAttnMaxHeadDim = 256;  ///< bounds the per-thread output accumulators

/// A block's tile: Q queries of one head, K keys (and values) per shared-memory tile. The default (8, 64) gives ACT's
/// 302-token encoder 304 blocks of 128 threads, and each thread four independent score chains and four output
/// chains; (16, 32), the previous tiling (152 blocks, one chain per thread), stays for the A/B under
/// FLOWEDGE_CUDA_ATTN_TILE16=1. Either way every score and every output is the same float sequence.
template <int Q, int K>
struct AttnTile {
    static constexpr int queries = Q, keys = K;
    static constexpr int groups = kAttnThreads / K;        ///< query groups: thread tid scores key tid % K
    static constexpr int per_thread = Q / groups;          ///< queries a thread scores against its key
    static_assert(kAttnThreads % K == 0 && K % 32 == 0 && Q % groups == 0);
};
using AttnTileDefault = AttnTile<8, 64>;
using AttnTile16 = AttnTile<16, 32>;

/// Dynamic shared memory of one attention block: q tile, k/v tile (rows padded to head_dim + 1 floats so that a
/// warp reading one column of consecutive rows hits distinct banks), the scores and the reciprocal row sums.
template <class T>
std::size_t attention_smem_bytes(int n_kv, int head_dim) {
    const std::size_t row = std::size_t(head_dim) + 1;
    return sizeof(float) * (T::queries * row + T::keys * row + std::size_t(T::queries) * n_kv + T::queries);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/// MaxDh: the largest head_dim the instance serves (64, ACT's, or kAttnMaxHeadDim): it sizes the output accumulators.
template <class T, int MaxDh>
__global__ void __launch_bounds__(kAttnThreads) attention_kernel(AttentionParams p) {
    constexpr int kOut = T::queries * MaxDh / kAttnThreads;  // outputs per thread
    static_assert(kOut >= 1 && T::queries * MaxDh % kAttnThreads == 0);
    detail::pdl_wait();
    extern __shared__ float smem[];
    constexpr int QB = T::queries, KB = T::keys;
    const int dh = p.head_dim, row = dh + 1, width = p.n_heads * dh;
    const int ldq = p.ld_q ? p.ld_q : width, ldk = p.ld_k ? p.ld_k : width;
    const int ldv = p.ld_v ? p.ld_v : width, ldo = p.ld_out ? p.ld_out : width;
    const int i0 = blockIdx.x * QB, nq = min(QB, p.n_q - i0);
    const std::size_t col = std::size_t(blockIdx.y) * std::size_t(dh);
    float* q_s = smem;                              // [QB][row]
    float* kv_s = q_s + QB * row;                   // [KB][row]
    float* score = kv_s + KB * row;                 // [QB][n_kv]
    float* inv_sum = score + QB * p.n_kv;           // [QB]
    const int tid = threadIdx.x;

    // Rows past nq are zeros: the score loop reads them (and discards their dots).
    for (int e = tid; e < QB * dh; e += kAttnThreads) {
        const int r = e / dh, t = e - r * dh;
        q_s[r * row + t] = r < nq ? p.q[std::size_t(i0 + r) * ldq + col + t] : 0.f;
    }
    // Scores: scale * (q . k) for every (query, key) of the tile, one K tile at a time. Thread tid takes key
    // jj = tid % KB against queries g, g + groups, ... (g = tid / KB): one load of k[jj][t] feeds per_thread
    // independent fmaf chains, each over t in order.
    const int jj = tid % KB, g = tid / KB;
    for (int j0 = 0; j0 < p.n_kv; j0 += KB) {
        const int kt = min(KB, p.n_kv - j0);
        __syncthreads();  // the previous tile has been read (and, the first time, q_s written)
        for (int e = tid; e < kt * dh; e += kAttnThreads) {
            const int r = e / dh, t = e - r * dh;
            kv_s[r * row + t] = p.k[std::size_t(j0 + r) * ldk + col + t];
        }
        __syncthreads();
        if (jj < kt) {
            float dot[T::per_thread];
#pragma unroll
            for (int m = 0; m < T::per_thread; ++m) dot[m] = 0.f;
            const float* b = kv_s + jj * row;
            for (int t = 0; t < dh; ++t) {
                const float bt = b[t];
#pragma unroll
                for (int m = 0; m < T::per_thread; ++m) dot[m] = fmaf(q_s[(g + m * T::groups) * row + t], bt, dot[m]);
            }
#pragma unroll
            for (int m = 0; m < T::per_thread; ++m) {
                const int qi = g + m * T::groups;
                if (qi < nq) score[qi * p.n_kv + j0 + jj] = p.scale * dot[m];
            }
        }
    }
    __syncthreads();
    // Softmax numerators in place, one warp per query row: exp(s - max) in float32, the sum in double.
    const int lane = tid & 31, warp = tid >> 5;
    for (int qi = warp; qi < nq; qi += kAttnThreads / 32) {
        float* s = score + qi * p.n_kv;
        float mx = -INFINITY;
        for (int j = lane; j < p.n_kv; j += 32) mx = fmaxf(mx, s[j]);
        mx = warp_max(mx);
        double sum = 0.0;
        for (int j = lane; j < p.n_kv; j += 32) {
            const float e = expf(s[j] - mx);
            s[j] = e;
            sum += double(e);
        }
        sum = detail::warp_sum(sum);
        if (lane == 0) inv_sum[qi] = float(1.0 / sum);
    }
    // Weighted sum of the values, one V tile at a time; thread tid owns outputs tid + k * kAttnThreads of the
    // [nq, head_dim] tile, each an fmaf chain in key order; the key loop is outside the output loop so that a
    // thread's chains advance together.
    float acc[kOut];
    int s_row[kOut], v_col[kOut];  // output k's score row offset and head column; s_row < 0: no such output
#pragma unroll
    for (int k = 0; k < kOut; ++k) {
        const int o = tid + k * kAttnThreads, qi = o / dh;
        acc[k] = 0.f;
        s_row[k] = o < nq * dh ? qi * p.n_kv : -1;
        v_col[k] = o - qi * dh;
    }
    for (int j0 = 0; j0 < p.n_kv; j0 += KB) {
        const int kt = min(KB, p.n_kv - j0);
        __syncthreads();  // the previous tile has been read (the first time: the softmax pass is done)
        for (int e = tid; e < kt * dh; e += kAttnThreads) {
            const int r = e / dh, t = e - r * dh;
            kv_s[r * row + t] = p.v[std::size_t(j0 + r) * ldv + col + t];
        }
        __syncthreads();
        for (int j = 0; j < kt; ++j) {
#pragma unroll
            for (int k = 0; k < kOut; ++k)
                if (s_row[k] >= 0) acc[k] = fmaf(score[s_row[k] + j0 + j], kv_s[j * row + v_col[k]], acc[k]);
        }
    }
#pragma unroll
    for (int k = 0; k < kOut; ++k) {
        if (s_row[k] < 0) continue;
        const int qi = (tid + k * kAttnThreads) / dh;
        p.out[std::size_t(i0 + qi) * ldo + col + v_col[k]] = acc[k] * inv_sum[qi];
    }
}

/// Checks the tile's shared memory against the device, opts in above 48 KiB and launches.
template <class T, int MaxDh>
void launch_attention(const AttentionParams& p, cudaStream_t st) {
    constexpr std::string_view comp = "cuda attention";
    const std::size_t smem = attention_smem_bytes<T>(p.n_kv, p.head_dim);
    const int limit = detail::smem_per_block_optin();
    if (smem > std::size_t(limit)) [[unlikely]] {
        const std::size_t fixed = attention_smem_bytes<T>(0, p.head_dim);
        const long long max_keys = (limit - (long long)fixed) / (long long)(sizeof(float) * T::queries);
        fail(comp, "too many keys for one block's score tile in shared memory" +
                       expected_got("n_kv <= " + std::to_string(max_keys) + " at head_dim " + std::to_string(p.head_dim), p.n_kv));
    }
    // Above the 48 KiB default a kernel must opt in to its dynamic shared memory (a plain attribute, legal while a
    // graph captures).
    if (smem > 48 * 1024)
        FLOWEDGE_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<T, MaxDh>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const dim3 grid(unsigned((p.n_q + T::queries - 1) / T::queries), unsigned(p.n_heads));
    detail::launch_pdl(attention_kernel<T, MaxDh>, grid, dim3(kAttnThreads), smem, st, p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("attention_kernel");
}

// ---- gelu, transpose, position_embedding_2d ----

constexpr int kPointwiseThreads = 256;

__global__ void __launch_bounds__(kPointwiseThreads) gelu_kernel(GeluParams p) {
    detail::pdl_wait();
    const std::int64_t stride = std::int64_t(gridDim.x) * kPointwiseThreads;
    for (std::int64_t i = std::int64_t(blockIdx.x) * kPointwiseThreads + threadIdx.x; i < p.n; i += stride) {
        const double x = p.x[i];
        p.y[i] = float(0.5 * x * (1.0 + erf(x * 0.70710678118654752440)));
    }
}

constexpr int kTile = 32;
constexpr int kTileRows = 8;  ///< threads per tile column: each thread moves kTile / kTileRows elements

__global__ void __launch_bounds__(kTile * kTileRows) transpose_kernel(TransposeParams p) {
    detail::pdl_wait();
    __shared__ float tile[kTile][kTile + 1];
    const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
    for (int dr = threadIdx.y; dr < kTile; dr += kTileRows) {
        const int r = r0 + dr, c = c0 + threadIdx.x;
        if (r < p.rows && c < p.cols) tile[dr][threadIdx.x] = p.x[std::size_t(r) * p.cols + c];
    }
    __syncthreads();
    for (int dc = threadIdx.y; dc < kTile; dc += kTileRows) {
        const int c = c0 + dc, r = r0 + threadIdx.x;
        if (r < p.rows && c < p.cols) p.y[std::size_t(c) * p.rows + r] = tile[threadIdx.x][dc];
    }
}

__global__ void __launch_bounds__(kPointwiseThreads) position_embedding_2d_kernel(PositionEmbedding2dParams p) {
    detail::pdl_wait();
    const int half = p.dim / 2;
    const std::int64_t n = std::int64_t(p.h) * p.w * p.dim;
    const std::int64_t stride = std::int64_t(gridDim.x) * kPointwiseThreads;
    for (std::int64_t e = std::int64_t(blockIdx.x) * kPointwiseThreads + threadIdx.x; e < n; e += stride) {
        const int k = int(e % p.dim);
        const std::int64_t token = e / p.dim;
        const bool is_y = k < half;
        const int i = is_y ? k : k - half;
        const int pos = is_y ? int(token / p.w) + 1 : int(token % p.w) + 1;
        const int extent = is_y ? p.h : p.w;
        const float angle = __fmul_rn(__fdiv_rn(float(pos), __fadd_rn(float(extent), 1e-6f)), float(6.283185307179586));
        const float inv_freq = powf(10000.f, __fdiv_rn(float(2 * (i / 2)), float(half)));
        const float a = __fdiv_rn(angle, inv_freq);
        p.y[e] = (i % 2 == 0) ? sinf(a) : cosf(a);
    }
}

/// Blocks for a grid-stride loop over n elements: enough to fill the device, no more than the work needs.
unsigned pointwise_blocks(std::int64_t n) {
    const std::int64_t need = (n + kPointwiseThreads - 1) / kPointwiseThreads;
    return unsigned(std::max<std::int64_t>(1, std::min<std::int64_t>(need, std::int64_t(detail::sm_count()) * 8)));
}

}  // namespace

void layer_norm(const LayerNormParams& p, Stream s) {
    constexpr std::string_view comp = "cuda layer_norm";
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail(comp, "sizes must be positive" + expected_got("rows >= 0, dim > 0", p.dim));
    check(p.rows == 0 || (p.x && p.y), comp, "null x or y pointer");
    if (p.rows == 0) return;
    detail::launch_pdl(layer_norm_kernel, dim3(unsigned(p.rows)), dim3(kNormThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("layer_norm_kernel");
}

void attention(const AttentionParams& p, Stream s) {
    constexpr std::string_view comp = "cuda attention";
    check(p.n_q >= 0 && p.n_kv > 0 && p.n_heads > 0 && p.head_dim > 0, comp, "sizes must be positive");
    if (!(p.head_dim <= kAttnMaxHeadDim)) [[unlikely]]
        fail(comp,
             "head_dim too large for the per-thread accumulators" + expected_got("<= " + std::to_string(kAttnMaxHeadDim), p.head_dim));
    if (p.n_q == 0) return;
    check(p.q && p.k && p.v && p.out, comp, "null q, k, v or out pointer");
    const cudaStream_t st = detail::resolve(s);
    if (detail::env_flag("FLOWEDGE_CUDA_ATTN_TILE16")) launch_attention<AttnTile16, kAttnMaxHeadDim>(p, st);
    else if (p.head_dim <= 64) launch_attention<AttnTileDefault, 64>(p, st);
    else launch_attention<AttnTileDefault, kAttnMaxHeadDim>(p, st);
}

void gelu(const GeluParams& p, Stream s) {
    constexpr std::string_view comp = "cuda gelu";
    if (!(p.n >= 0)) [[unlikely]]
        fail(comp, "negative size" + expected_got(">= 0", p.n));
    if (p.n == 0) return;
    check(p.x && p.y, comp, "null x or y pointer");
    detail::launch_pdl(gelu_kernel, dim3(pointwise_blocks(p.n)), dim3(kPointwiseThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("gelu_kernel");
}

void transpose(const TransposeParams& p, Stream s) {
    constexpr std::string_view comp = "cuda transpose";
    check(p.rows > 0 && p.cols > 0, comp, "sizes must be positive");
    check(p.x && p.y, comp, "null x or y pointer");
    const long long row_tiles = (p.rows + kTile - 1) / kTile;
    if (!(row_tiles <= 65535)) [[unlikely]]
        fail(comp, "too many rows for the grid" + expected_got("<= " + std::to_string(65535 * kTile), p.rows));
    const dim3 grid(unsigned((p.cols + kTile - 1) / kTile), unsigned(row_tiles));
    detail::launch_pdl(transpose_kernel, grid, dim3(kTile, kTileRows), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("transpose_kernel");
}

void position_embedding_2d(const PositionEmbedding2dParams& p, Stream s) {
    constexpr std::string_view comp = "cuda position_embedding_2d";
    check(p.h > 0 && p.w > 0 && p.dim > 0 && p.dim % 2 == 0, comp, "sizes must be positive and dim even");
    check(p.y != nullptr, comp, "null y pointer");
    const std::int64_t n = std::int64_t(p.h) * p.w * p.dim;
    detail::launch_pdl(position_embedding_2d_kernel, dim3(pointwise_blocks(n)), dim3(kPointwiseThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("position_embedding_2d_kernel");
}

}  // namespace flowedge::cuda
