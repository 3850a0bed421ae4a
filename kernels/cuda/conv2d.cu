// torch.nn.Conv2d (groups 1, dilation 1, zero padding) with the fused bias + residual + activation epilogue of a
// ResNet BasicBlock (BatchNorm folded into w and bias at load), exact float arithmetic.
//
// GEMM view: y[b, o, pix] = act(sum_k W[o, k] * X[k, n] + bias[o] + residual[b, o, pix]) with M = out_channels,
// N = batch * out_h * out_w (n = b * P + pix), K = in_channels * kernel_h * kernel_w (k = (i * kh + r) * kw + c, the
// stored weight layout [out, in, kh, kw] read as a row-major M x K matrix), X[k, n] the im2col gather of x.
//
// Block: 256 threads = 4 K-groups x 64 threads; the 64 threads of a K-group form an 8 x 8 grid over the block tile
// BM x BN = 8TM x 8TN (32x32, 16x32 or 16x16), each thread a TM x TN register tile of float accumulators.
// The K dimension is walked in chunks of kBK = 32; K-group g always owns k = chunk * 32 + [8g, 8g + 8), in
// ascending order, and kStageChunks chunks are staged in shared memory per step (weights transposed to [k][m],
// the gathered x as [k][n]) with the next step's loads held in registers while the current step is multiplied.
// Epilogue: the 4 K-group partial tiles are added in group order; on sm_90 the chunks may additionally be split
// over a thread-block cluster of S = 2, 4 or 8 blocks along grid z (contiguous chunk ranges), whose partial tiles
// are added in rank order through distributed shared memory (each block finishes 1/S of the tile); then bias,
// residual and activation, in that order, and y is written.
//
// Determinism: every output is a fixed chain of float FMAs and adds. The chain depends only on K, the 32-wide chunk
// and 4-group split (constants) and S, which the host derives from the per-image geometry (out_channels, out_h *
// out_w, K) and the device's SM count, never from the batch or the tile size: the same image gives the same bits
// at any batch size, run to run. The late ResNet layers (512 x 3 x 3 outputs per image, 9 MB of weights) are weight
// streams, so S spreads one tile's K over up to 8 SMs; each block also prefetches its weight slice into L2 and loads
// its first weights before the programmatic-dependent-launch wait (weights never depend on an earlier kernel).
#include <string>
#include <string_view>

#include "cluster_splitk.cuh"
#include "common.cuh"
#include "conv2d_paths.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBK = 32;                 // k per chunk
constexpr int kGroups = 4;              // K-groups per block
constexpr int kGroupK = kBK / kGroups;  // k per group per chunk
constexpr int kStageChunks = 2;         // chunks staged in shared memory per pipeline step
constexpr int kMaxCluster = 8;          // portable cluster size limit

/// Sizes the host derives once per call.
struct Conv2dGeom {
    int m = 0;         // out_channels
    int k = 0;         // in_channels * kernel_h * kernel_w
    int n = 0;         // batch * out_h * out_w
    int pix = 0;       // out_h * out_w
    int khw = 0;       // kernel_h * kernel_w
    int n_chunks = 0;  // ceil(k / kBK)
};

/// Loads N consecutive floats from shared memory (N = 1, 2, 4; the address is N*4-byte aligned).
template <int N>
__device__ __forceinline__ void lds(const float* p, float (&out)[N]) {
    if constexpr (N == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    } else if constexpr (N == 2) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        out[0] = v.x, out[1] = v.y;
    } else {
        out[0] = *p;
    }
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

/// KS: the square kernel size when it is 1, 3 or 7 (the k -> (i, kh, kw) split by constants), 0 = any kernel.
/// kCluster: the block is one of gridDim.z blocks of a cluster splitting the chunks of one output tile (sm_90).
template <class T, int KS, int TM, int TN, bool kCluster>
__global__ void __launch_bounds__(kThreads) conv2d_kernel(Conv2dParams p, Conv2dGeom g) {
    constexpr int BM = 8 * TM, BN = 8 * TN;
    constexpr int kLdW = BM + 4;  // row stride of the transposed weight stage: conflict-free stores, 16-byte rows
    constexpr int kStageW = kStageChunks * kBK * kLdW;
    constexpr int kStageX = kStageChunks * kBK * BN;
    constexpr int kStaging = 2 * (kStageW + kStageX);  // double-buffered
    constexpr int kRed = kGroups * BM * BN;             // the K-group partial tiles (reuses the staging memory)
    __shared__ __align__(16) float smem[kStaging > kRed ? kStaging : kRed];
    float* const ws = smem;                // [2][kStageChunks * kBK][kLdW]
    float* const xs = smem + 2 * kStageW;  // [2][kStageChunks * kBK][BN]

    const int tid = int(threadIdx.x);
    const int n0 = int(blockIdx.x) * BN, m0 = int(blockIdx.y) * BM;
    int c_begin = 0, c_end = g.n_chunks;  // this block's chunks
    if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        detail::cluster_k_range(g.n_chunks, c_begin, c_end);
#else
        __trap();  // clusters need sm_90; the host selects this kernel only there
#endif
    }
    const T* const w = static_cast<const T*>(p.w.data);

    // Weight staging: thread loads TM elements per chunk at k = kk_w, rows m_w[j] (a warp covers 4 rows x 8 k:
    // 32-byte segments in global memory, distinct banks in the transposed store).
    const int kk_w = 8 * ((tid >> 5) & 3) + (tid & 7);
    int m_w[TM];
#pragma unroll
    for (int j = 0; j < TM; ++j) m_w[j] = 4 * ((tid >> 7) + 2 * j) + ((tid >> 3) & 3);
    // x staging: thread gathers TN elements per chunk for its column n_x at k = kk_x + j * (256 / BN).
    const int n_x = tid % BN, kk_x = tid / BN;
    constexpr int kXRowStep = kThreads / BN;
    const int nn_x = n0 + n_x;
    const bool col_ok = nn_x < g.n;
    int ih0 = 0, iw0 = 0;
    const float* xb = p.x;
    if (col_ok) {
        const int b = nn_x / g.pix, q = nn_x - b * g.pix;
        const int oh = q / p.out_w, ow = q - oh * p.out_w;
        ih0 = oh * p.stride_h - p.pad_h;
        iw0 = ow * p.stride_w - p.pad_w;
        xb = p.x + std::size_t(b) * p.in_channels * p.in_h * p.in_w;
    }

    auto load_w = [&](int c, float (&r)[kStageChunks][TM]) {
#pragma unroll
        for (int s = 0; s < kStageChunks; ++s) {
            const int k = (c + s) * kBK + kk_w;
            const bool k_ok = c + s < c_end && k < g.k;
#pragma unroll
            for (int j = 0; j < TM; ++j) {
                const int o = m0 + m_w[j];
                r[s][j] = (k_ok && o < g.m) ? detail::load_w<T>(w, std::size_t(o) * g.k + k) : 0.f;
            }
        }
    };
    auto load_x = [&](int c, float (&r)[kStageChunks][TN]) {
#pragma unroll
        for (int s = 0; s < kStageChunks; ++s) {
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int k = (c + s) * kBK + kk_x + j * kXRowStep;
                float v = 0.f;
                if (col_ok && c + s < c_end && k < g.k) {
                    int i, kh, kw;
                    if constexpr (KS == 1) {
                        i = k, kh = 0, kw = 0;
                    } else if constexpr (KS > 1) {
                        i = k / (KS * KS);
                        const int r2 = k - i * (KS * KS);
                        kh = r2 / KS;
                        kw = r2 - kh * KS;
                    } else {
                        i = k / g.khw;
                        const int r2 = k - i * g.khw;
                        kh = r2 / p.kernel_w;
                        kw = r2 - kh * p.kernel_w;
                    }
                    const int ih = ih0 + kh, iw = iw0 + kw;
                    if (ih >= 0 && ih < p.in_h && iw >= 0 && iw < p.in_w)
                        v = __ldg(xb + (std::size_t(i) * p.in_h + ih) * p.in_w + iw);
                }
                r[s][j] = v;
            }
        }
    };
    auto store = [&](int buf, const float (&rw)[kStageChunks][TM], const float (&rx)[kStageChunks][TN]) {
        float* wsb = ws + buf * kStageW;
        float* xsb = xs + buf * kStageX;
#pragma unroll
        for (int s = 0; s < kStageChunks; ++s) {
#pragma unroll
            for (int j = 0; j < TM; ++j) wsb[(s * kBK + kk_w) * kLdW + m_w[j]] = rw[s][j];
#pragma unroll
            for (int j = 0; j < TN; ++j) xsb[(s * kBK + kk_x + j * kXRowStep) * BN + n_x] = rx[s][j];
        }
    };

    // Before the PDL wait: only weights (constants). Prefetch this block's weight slice into L2, load the first step.
    {
        const int k_lo = c_begin * kBK, k_hi = min(g.k, c_end * kBK);
        if (k_hi > k_lo) {
            const std::size_t row_bytes = std::size_t(k_hi - k_lo) * sizeof(T);
            const int lines = int((row_bytes + 127) / 128) + 1;
            const int rows = min(BM, g.m - m0);
            for (int e = tid; e < rows * lines; e += kThreads) {
                const int r = e / lines, l = e - r * lines;
                const char* row = reinterpret_cast<const char*>(w + std::size_t(m0 + r) * g.k + k_lo);
                prefetch_l2(row + min(std::size_t(l) * 128, row_bytes - 1));
            }
        }
    }
    float rw[kStageChunks][TM], rx[kStageChunks][TN];
    load_w(c_begin, rw);
    detail::pdl_wait();  // launched with PDL: x and residual are earlier kernels' outputs
    load_x(c_begin, rx);
    store(0, rw, rx);
    __syncthreads();

    const int grp = tid >> 6, t64 = tid & 63;
    const int mi = (t64 & 7) * TM, ni = (t64 >> 3) * TN;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    int buf = 0;
    for (int c = c_begin; c < c_end; c += kStageChunks) {
        const bool more = c + kStageChunks < c_end;
        if (more) {
            load_w(c + kStageChunks, rw);
            load_x(c + kStageChunks, rx);
        }
        const float* wsb = ws + buf * kStageW;
        const float* xsb = xs + buf * kStageX;
#pragma unroll
        for (int s = 0; s < kStageChunks; ++s) {
            if (c + s >= c_end) break;  // uniform over the block
#pragma unroll
            for (int kk = 0; kk < kGroupK; ++kk) {
                const int row = s * kBK + grp * kGroupK + kk;
                float a[TM], bv[TN];
                lds<TM>(wsb + row * kLdW + mi, a);
                lds<TN>(xsb + row * BN + ni, bv);
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], bv[j], acc[i][j]);
            }
        }
        if (more) store(buf ^ 1, rw, rx);
        __syncthreads();
        buf ^= 1;
    }

    // K-group partial tiles -> shared memory (the staging buffers are free after the last barrier).
    float* const red = smem;  // [kGroups][BM][BN]
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) red[(grp * BM + mi + i) * BN + ni + j] = acc[i][j];
    __syncthreads();

    auto finish = [&](int e, float v) {
        const int m = e / BN, nn = n0 + (e - m * BN), o = m0 + m;
        if (o >= g.m || nn >= g.n) return;
        const int b = nn / g.pix, q = nn - b * g.pix;
        const std::size_t idx = (std::size_t(b) * g.m + o) * g.pix + q;
        if (p.bias) v += p.bias[o];
        if (p.residual) v += p.residual[idx];
        p.y[idx] = detail::apply_act(p.act, v);
    };
    if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        for (int e = tid; e < BM * BN; e += kThreads) {
            float v = red[e];
#pragma unroll
            for (int q = 1; q < kGroups; ++q) v += red[q * BM * BN + e];
            red[e] = v;  // this block's partial tile (each element read and written by the same thread)
        }
        // The tile as BM * BN rows of one element: each rank finishes 1/S of its elements (finish checks bounds).
        detail::cluster_reduce_tile<kThreads>(
            red, BM * BN, 1, 1, [](int, int) { return true; }, [&](int e, int, float v) { finish(e, v); });
#endif
    } else {
        for (int e = tid; e < BM * BN; e += kThreads) {
            float v = red[e];
#pragma unroll
            for (int q = 1; q < kGroups; ++q) v += red[q * BM * BN + e];
            finish(e, v);
        }
    }
}

/// Cluster split S of the chunks: a function of the per-image geometry and the device only (never the batch), so
/// the summation order of an image does not change with the batch. The smallest power of two (<= 8) that gives one
/// image's 16x16 tiles at least one block per SM, while each block keeps >= 2 pipeline steps; 1 below sm_90.
int cluster_split(const Conv2dGeom& g) {
    if (detail::compute_major() < 9) return 1;
    const long long tiles = (long long)((g.m + 15) / 16) * ((g.pix + 15) / 16);
    const int sms = detail::sm_count();
    int s = 1;
    while (s < kMaxCluster && tiles * s < sms && g.n_chunks >= 2 * kStageChunks * (2 * s)) s *= 2;
    return s;
}

template <class T, int KS, int TM, int TN>
void launch_tile(const Conv2dParams& p, const Conv2dGeom& g, int split, cudaStream_t st) {
    constexpr int BM = 8 * TM, BN = 8 * TN;
    const dim3 grid(unsigned((g.n + BN - 1) / BN), unsigned((g.m + BM - 1) / BM), unsigned(split));
    if (split == 1) {
        detail::launch_pdl(conv2d_kernel<T, KS, TM, TN, false>, grid, dim3(kThreads), 0, st, p, g);
        return;
    }
    detail::launch_pdl_cluster(conv2d_kernel<T, KS, TM, TN, true>, grid, dim3(kThreads), 0, st, unsigned(split), p, g);
}

/// Tile: the largest of 32x32, 16x32, 16x16 whose grid has at least one block per SM, else 16x16. The tile does not
/// change any result (each output's chain is the same for every tile).
template <class T, int KS>
void launch_ks(const Conv2dParams& p, const Conv2dGeom& g, int split, cudaStream_t st) {
    const long long sms = detail::sm_count();
    auto blocks = [&](int bm, int bn) { return (long long)((g.m + bm - 1) / bm) * ((g.n + bn - 1) / bn) * split; };
    if (blocks(32, 32) >= sms) launch_tile<T, KS, 4, 4>(p, g, split, st);
    else if (blocks(16, 32) >= sms) launch_tile<T, KS, 2, 4>(p, g, split, st);
    else launch_tile<T, KS, 2, 2>(p, g, split, st);
}

}  // namespace

void conv2d(const Conv2dParams& p, Stream s) {
    constexpr std::string_view comp = "cuda conv2d";
    check(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_h > 0 && p.in_w > 0 && p.kernel_h > 0 &&
              p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 && p.pad_w >= 0,
          comp, "sizes must be positive (pad non-negative)");
    check(p.x && p.w.data && p.y, comp, "null x, w or y pointer (a prepared-only weight is not supported here)");
    const long long want_h = ((long long)p.in_h + 2LL * p.pad_h - p.kernel_h) / p.stride_h + 1;
    const long long want_w = ((long long)p.in_w + 2LL * p.pad_w - p.kernel_w) / p.stride_w + 1;
    if (!((long long)p.in_h + 2LL * p.pad_h >= p.kernel_h && (long long)p.in_w + 2LL * p.pad_w >= p.kernel_w &&
              p.out_h == want_h && p.out_w == want_w)) [[unlikely]]
        fail(comp, "output size inconsistent with input, kernel, stride and pad" +
             expected_got(std::to_string(want_h) + " x " + std::to_string(want_w),
             std::to_string(p.out_h) + " x " + std::to_string(p.out_w)));
    const long long khw = (long long)p.kernel_h * p.kernel_w, k = khw * p.in_channels;
    const long long pix = (long long)p.out_h * p.out_w, n = pix * p.batch;
    const long long x_elems = (long long)p.batch * p.in_channels * p.in_h * p.in_w;
    if (!(k + 2LL * kStageChunks * kBK < 0x7fffffffLL && n + 64 < 0x7fffffffLL && x_elems < (1LL << 62))) [[unlikely]]
        fail(comp, "tensor too large for 32-bit indexing" + expected_got("K and batch * out_h * out_w < 2^31",
             "K " + std::to_string(k) + ", N " + std::to_string(n)));
    if (!(p.out_channels <= 65535LL * 16)) [[unlikely]]
        fail(comp, "too many output channels" + expected_got("<= 1048560", p.out_channels));
    const cudaStream_t st = detail::resolve(s);
    if (detail::try_conv2d_kstream(p, st)) return;  // small output maps: conv2d_kstream.cu
    Conv2dGeom g;
    g.m = p.out_channels;
    g.k = int(k);
    g.n = int(n);
    g.pix = int(pix);
    g.khw = int(khw);
    g.n_chunks = int((k + kBK - 1) / kBK);
    const int split = cluster_split(g);
    const int ks = (p.kernel_h == p.kernel_w && (p.kernel_h == 1 || p.kernel_h == 3 || p.kernel_h == 7)) ? p.kernel_h : 0;
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        switch (ks) {
            case 1: launch_ks<T, 1>(p, g, split, st); break;
            case 3: launch_ks<T, 3>(p, g, split, st); break;
            case 7: launch_ks<T, 7>(p, g, split, st); break;
            default: launch_ks<T, 0>(p, g, split, st); break;
        }
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv2d_kernel");
}

}  // namespace flowedge::cuda
