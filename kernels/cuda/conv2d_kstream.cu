// torch.nn.Conv2d on output maps of <= 9 pixels with a long reduction (K >= 2048: ResNet18 layer4's 3x3 convs on an
// 84 x 84 input, 3x3 outputs, 512 channels, K 2304 / 4608, 2.4-9.4 MB of F32 weights each), where conv2d.cu's
// output-tile GEMM streams the weights a few scalars per thread per step: a weight stream in which the lanes of a warp
// split K. Elsewhere the output-tile kernel is the faster one (docs/kernels/cuda.md has the numbers).
//
// GEMM view as in conv2d.cu: y[b, o, pix] = act(sum_k W[o, k] * X[k, pix] + bias[o] + residual[b, o, pix]),
// K = in_channels * kernel_h * kernel_w, W the stored [out, in, kh, kw] weights read as a row-major M x K matrix.
//
// Launch geometry: 256 threads = 8 warps. A block owns 32 output channels (warp w: channels o0 + 4w .. o0 + 4w + 3),
// the (up to 9) output pixels of one image (grid y = batch) and a K range: on sm_90 the 4-wide K units are split into contiguous ranges over a thread-block cluster of S blocks
// along grid z (rank order). Before the programmatic-dependent-launch wait each warp prefetches its weight rows' slab
// to L2 and loads its first two steps (weights never depend on an earlier kernel); after it the block gathers the
// im2col columns of its pixels over its K range into shared memory as Xs[pixel][k] (zero outside the image and past
// the last pixel). Lane l then takes the units u = l, l + 32, ...: per unit one 16-byte (F32) or 8-byte (BF16/F16)
// load per weight row and one 16-byte shared load per pixel, 4 x 4 x 9 FMAs.
//
// Numerics (float, deterministic): per lane acc[o][pixel] is one FMA chain over its units in ascending order (k
// ascending within a unit); the lanes are added by a warp butterfly; with S > 1 the S partial tiles are added in rank
// order through distributed shared memory (cluster_splitk.cuh); then bias, residual and activation, in that order.
// The chain depends on K and S only, and S on the per-image geometry (out_channels, pixels, K) and the device, never
// on the batch: an image gives the same bits at any batch size, run to run.
#include <string>

#include "cluster_splitk.cuh"
#include "common.cuh"
#include "conv2d_paths.cuh"
#include "conv_common.cuh"

namespace flowedge::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kOW = 4;              // output channels per warp
constexpr int kBO = kWarps * kOW;   // output channels per block
constexpr int kDepth = 2;           // weight steps (32 units each) held in registers ahead of the one multiplied
constexpr int kMaxSplit = 8;        // portable cluster size limit
constexpr int kPixels = 9;          // output pixels per image at most (the accumulators are [kOW][kPixels])
constexpr int kMinK = 2048;         // shorter reductions: conv2d.cu's output tiles are as fast or faster
constexpr int kMaxSmem = 44 * 1024; // the im2col stage: with the static tile, under the 48 KiB default

/// Sizes the host derives once per call.
struct KGeom {
    int m = 0;          // out_channels
    int k = 0;          // in_channels * kernel_h * kernel_w
    int units = 0;      // k / 4
    int pix = 0;        // out_h * out_w
    int khw = 0;        // kernel_h * kernel_w
    int ldx = 0;        // row stride of Xs: 4 * (the largest unit range of a rank), floats
};

template <class T, bool kCluster>
__global__ void __launch_bounds__(kThreads) conv2d_kstream_kernel(Conv2dParams p, KGeom g) {
    constexpr int PT = kPixels;
    extern __shared__ __align__(16) float xs[];  // [PT][ldx]: the im2col columns of the image's pixels
    __shared__ float red[kBO * PT];              // the block's partial tile [kBO][PT]
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int o0 = int(blockIdx.x) * kBO;
    const int b = int(blockIdx.y), pix0 = 0, n_pix = g.pix;
    int u_begin = 0, u_end = g.units;
    if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        cluster_k_range(g.units, u_begin, u_end);
#else
        __trap();  // clusters need sm_90; the host selects this kernel only there
#endif
    }
    const int n_units = u_end - u_begin, k_lo = 4 * u_begin;
    const T* const w = static_cast<const T*>(p.w.data);
    const T* rows[kOW];
    bool row_ok[kOW];
#pragma unroll
    for (int o = 0; o < kOW; ++o) {
        const int oc = o0 + warp * kOW + o;
        row_ok[o] = oc < g.m;
        rows[o] = w + std::size_t(row_ok[o] ? oc : 0) * g.k + k_lo;
    }

    // Before the PDL wait: the warp's weight slab into L2, then its first kDepth steps into registers.
    {
        const std::size_t row_bytes = std::size_t(n_units) * 4 * sizeof(T);
        const int lines = int((row_bytes + 127) / 128);
#pragma unroll
        for (int o = 0; o < kOW; ++o)
            for (int l = lane; row_ok[o] && l < lines; l += 32)
                asm volatile("prefetch.global.L2 [%0];\n" ::"l"(reinterpret_cast<const char*>(rows[o]) + std::size_t(l) * 128));
    }
    const int n_steps = (n_units + 31) / 32;
    auto load_step = [&](int j, float (&r)[kOW][4]) {
        const int u = lane + 32 * j;
#pragma unroll
        for (int o = 0; o < kOW; ++o) {
            if (u < n_units && row_ok[o]) load4<T>(rows[o] + 4 * u, r[o]);
            else r[o][0] = r[o][1] = r[o][2] = r[o][3] = 0.f;
        }
    };
    float wr[kDepth][kOW][4];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) load_step(d, wr[d]);
    pdl_wait();  // launched with PDL: x and residual are earlier kernels' outputs

    // im2col stage: Xs[pixel][k - k_lo].
    {
        const float* xb = p.x + std::size_t(b) * p.in_channels * p.in_h * p.in_w;
        const int kr = 4 * n_units;
        for (int e = tid; e < PT * kr; e += kThreads) {
            const int pp = e / kr, kk = e - pp * kr;
            float v = 0.f;
            if (pp < n_pix) {
                const int q = pix0 + pp, oh = q / p.out_w, ow = q - oh * p.out_w;
                const int k = k_lo + kk, i = k / g.khw, r2 = k - i * g.khw, kh = r2 / p.kernel_w, kw = r2 - kh * p.kernel_w;
                const int ih = oh * p.stride_h - p.pad_h + kh, iw = ow * p.stride_w - p.pad_w + kw;
                if (ih >= 0 && ih < p.in_h && iw >= 0 && iw < p.in_w) v = __ldg(xb + (std::size_t(i) * p.in_h + ih) * p.in_w + iw);
            }
            xs[pp * g.ldx + kk] = v;
        }
    }
    __syncthreads();

    float acc[kOW][PT];
#pragma unroll
    for (int o = 0; o < kOW; ++o)
#pragma unroll
        for (int pp = 0; pp < PT; ++pp) acc[o][pp] = 0.f;
    for (int j0 = 0; j0 < n_steps; j0 += kDepth) {
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
            const int j = j0 + d, u = lane + 32 * j;
            if (j >= n_steps) break;  // uniform over the block
            if (u < n_units) {
#pragma unroll
                for (int pp = 0; pp < PT; ++pp) {
                    const float4 xv = *reinterpret_cast<const float4*>(xs + pp * g.ldx + 4 * u);
#pragma unroll
                    for (int o = 0; o < kOW; ++o) {
                        float a = acc[o][pp];
                        a = fmaf(wr[d][o][0], xv.x, a);
                        a = fmaf(wr[d][o][1], xv.y, a);
                        a = fmaf(wr[d][o][2], xv.z, a);
                        acc[o][pp] = fmaf(wr[d][o][3], xv.w, a);
                    }
                }
            }
            load_step(j + kDepth, wr[d]);
        }
    }

    // Lanes -> the warp's 4 x PT tile (a butterfly: every lane holds the sum; lane idx % 32 stores value idx).
#pragma unroll
    for (int o = 0; o < kOW; ++o)
#pragma unroll
        for (int pp = 0; pp < PT; ++pp) {
            const float v = warp_sum(acc[o][pp]);
            if (lane == ((o * PT + pp) & 31)) red[(warp * kOW + o) * PT + pp] = v;
        }

    auto keep = [&](int r, int c) { return o0 + r < g.m && c < n_pix; };
    auto finish = [&](int r, int c, float v) {
        const int o = o0 + r;
        const std::size_t idx = (std::size_t(b) * g.m + o) * g.pix + pix0 + c;
        if (p.bias) v += p.bias[o];
        if (p.residual) v += p.residual[idx];
        p.y[idx] = apply_act(p.act, v);
    };
    if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        cluster_reduce_tile<kThreads>(red, kBO, PT, PT, keep, finish);  // its first cluster barrier publishes red
#endif
    } else {
        __syncthreads();
        for (int e = tid; e < kBO * PT; e += kThreads) {
            const int r = e / PT, c = e - r * PT;
            if (keep(r, c)) finish(r, c, red[e]);
        }
    }
}

template <class T>
void launch(const Conv2dParams& p, const KGeom& g, int split, std::size_t smem, cudaStream_t st) {
    const dim3 grid(unsigned((g.m + kBO - 1) / kBO), unsigned(p.batch), unsigned(split));
    if (split == 1) launch_pdl(conv2d_kstream_kernel<T, false>, grid, dim3(kThreads), smem, st, p, g);
    else launch_pdl_cluster(conv2d_kstream_kernel<T, true>, grid, dim3(kThreads), smem, st, unsigned(split), p, g);
}

}  // namespace

bool try_conv2d_kstream(const Conv2dParams& p, cudaStream_t st) {
    static const bool disabled = env_flag("FLOWEDGE_CUDA_CONV2D_NO_KSTREAM");
    const long long k = (long long)p.in_channels * p.kernel_h * p.kernel_w, pix = (long long)p.out_h * p.out_w;
    const std::size_t w_align = 4 * (p.w.dtype == DType::F32 ? 4 : 2);
    if (disabled || k % 4 != 0 || k < kMinK || pix > kPixels || p.batch > 65535 || !aligned(p.w.data, w_align)) return false;
    KGeom g;
    g.m = p.out_channels;
    g.k = int(k);
    g.units = int(k / 4);
    g.pix = int(pix);
    g.khw = p.kernel_h * p.kernel_w;
    // Cluster split: a function of one image's geometry and the device (never the batch). The smallest power of two
    // (<= 8) that gives one image at least one block per SM while every lane keeps a whole unit per step, raised
    // while the block's im2col stage would not fit.
    const long long blocks = (g.m + kBO - 1) / kBO;
    const int max_split = compute_major() >= 9 ? kMaxSplit : 1;
    auto stage_bytes = [&](int s) { return std::size_t(kPixels) * 4 * ((g.units + s - 1) / s) * sizeof(float); };
    int split = 1;
    while (split < max_split && blocks * split < sm_count() && g.units / (2 * split) >= 32) split *= 2;
    while (split < max_split && stage_bytes(split) > std::size_t(kMaxSmem)) split *= 2;
    if (stage_bytes(split) > std::size_t(kMaxSmem)) return false;
    g.ldx = 4 * ((g.units + split - 1) / split);
    const std::size_t smem = stage_bytes(split);
    dispatch_dtype(p.w.dtype, [&]<class T>() { launch<T>(p, g, split, smem, st); });
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv2d_kstream_kernel");
    return true;
}

}  // namespace flowedge::cuda::detail
