// GroupNorm (with the fused act -> FiLM -> residual epilogue of the U-Net residual block) and Mamba's RMSNorm.
//
// group_norm: the group's (channels/groups) x length elements are contiguous. Epilogue order: act, FiLM, residual,
//   post_act (GroupNormParams), in float, after normalising and applying gamma/beta; y may alias x (each element is
//   read and written by the same thread).
//   - Groups of up to 1024 elements (every U-Net group): one block of 256 threads per (batch, group). The group's
//     elements and the epilogue's operands are read in one round of loads into registers, and sum and sum of squares
//     are reduced in double in one fixed-order block reduction (deterministic). At batch 1 such a GroupNorm is
//     latency-bound (8 blocks, ~1024 elements each), so one round of loads and one reduction matter more than
//     bandwidth (docs/performance/cuda.md).
//   - Larger groups (the ResNet's GroupNorm(C/16, C) on 16 x 42 x 42 or 16 x 21 x 21 elements: 4 groups at batch 1)
//     on sm_90: a thread-block cluster of S = 2, 4 or 8 blocks of 512 threads per (batch, group), each block a
//     contiguous 1/S of the group held in registers (up to 4096 elements). Each block reduces its sum and sum of
//     squares in double (fixed order), the cluster adds the S partials in rank order through distributed shared
//     memory, and every block normalises its share: S times the blocks, one read of x. S depends only on the group's
//     size, the number of groups and the device, never on the batch, so an image gives the same bits at any batch.
//   - Otherwise (no clusters, or FLOWEDGE_CUDA_GN_NO_CLUSTER=1): one block per group; groups over 2048 elements take
//     two passes over x (mean, then the variance around it).
//   The variance E[x^2] - mean^2 is formed in double from float inputs: the cancellation costs ~1e-13 relative for
//   the groups here, far below the float rounding of rstd, so the CPU's two-pass form gives the same float rstd.
// rms_norm: one block of 256 threads per row; sum of squares in double, y = x * rsqrt(mean + eps) * w.
#include <string>
#include <string_view>

#include "cluster_splitk.cuh"
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"
#include "group_norm_common.cuh"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;

using detail::block_sum;

/// Sums two values over the block at once (same fixed order as block_sum); every thread receives both.
__device__ void block_sum2(double& a, double& b, double (*scratch)[32]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    a = detail::warp_sum(a);
    b = detail::warp_sum(b);
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 0) {
        scratch[0][warp] = a;
        scratch[1][warp] = b;
    }
    __syncthreads();
    a = 0.0;
    b = 0.0;
    const int n_warps = (blockDim.x + 31) >> 5;
    for (int w = 0; w < n_warps; ++w) {
        a += scratch[0][w];
        b += scratch[1][w];
    }
}

/// Elements per thread kept in registers; larger groups (> kThreads * kRegs elements) re-read x from L1/L2.
constexpr int kRegs = 8;

/// The cluster path: threads per block, elements per thread in registers, the largest cluster (portable size).
constexpr int kClusterThreads = 512;
constexpr int kClusterRegs = 8;
constexpr int kMaxGroupCluster = 8;

using detail::film_term;
using detail::group_film;
using detail::group_norm_epilogue;
using detail::group_stats;

__global__ void __launch_bounds__(kThreads) group_norm_kernel(GroupNormParams p) {
    __shared__ double scratch[2][32];
    detail::pdl_wait();  // launched with launch_pdl: x is the previous kernel's output
    detail::pdl_allow_next();
    const int cpg = p.channels / p.groups;
    const int b = blockIdx.x / p.groups, g = blockIdx.x % p.groups;
    const std::int64_t n = std::int64_t(cpg) * p.length;
    const std::size_t base = (std::size_t(b) * p.channels + std::size_t(g) * cpg) * p.length;
    const float* x = p.x + base;
    const float* film = group_film(p, b);
    auto finish = [&](std::int64_t i, float xi, float mean_f, float rstd_f, float gamma, float beta, float f_scale,
                      float f_bias, float res) {
        p.y[base + i] = group_norm_epilogue(p, film != nullptr, xi, mean_f, rstd_f, gamma, beta, f_scale, f_bias, res);
    };
    if (n <= std::int64_t(kThreads) * kRegs) {  // every PushT group (<= 1024 elements)
        // One batch of loads: the group's elements and everything the epilogue needs (gamma, beta, FiLM, residual),
        // so their latencies overlap; then sum and sum of squares in double in one block reduction. (The variance
        // E[x^2] - mean^2 in double: float inputs, <= 2048 of them, so the cancellation costs ~1e-13 relative at
        // worst, far below the float rounding of rstd; the CPU's two-pass form gives the same float rstd.)
        float v[kRegs], ga[kRegs], be[kRegs], fsc[kRegs], fbi[kRegs], res[kRegs];
        double s = 0.0, q = 0.0;
#pragma unroll
        for (int r = 0; r < kRegs; ++r) {
            const std::int64_t i = threadIdx.x + std::int64_t(r) * kThreads;
            const bool in = i < n;
            const int c = g * cpg + int(in ? i / p.length : 0);
            v[r] = in ? x[i] : 0.f;
            ga[r] = p.gamma ? p.gamma[c] : 1.f;
            be[r] = p.beta ? p.beta[c] : 0.f;
            fsc[r] = film ? film_term(p, film, c) : 1.f;
            fbi[r] = film ? film_term(p, film, p.channels + c) : 0.f;
            res[r] = (p.residual && in) ? p.residual[base + i] : 0.f;
        }
#pragma unroll
        for (int r = 0; r < kRegs; ++r) {
            s += double(v[r]);
            q += double(v[r]) * double(v[r]);
        }
        block_sum2(s, q, scratch);
        const float2 st = group_stats(s, q, double(n), p.eps);
        const float mean_f = st.x, rstd_f = st.y;
#pragma unroll
        for (int r = 0; r < kRegs; ++r) {
            const std::int64_t i = threadIdx.x + std::int64_t(r) * kThreads;
            if (i < n) finish(i, v[r], mean_f, rstd_f, ga[r], be[r], fsc[r], fbi[r], res[r]);
        }
        return;
    }
    // Larger groups: two passes over x (L1/L2-resident) for mean and the variance around it, then the epilogue.
    double s = 0.0;
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += double(x[i]);
    const double mean = block_sum(s, scratch[0]) / double(n);
    double q = 0.0;
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const double d = double(x[i]) - mean;
        q += d * d;
    }
    const double var = block_sum(q, scratch[0]) / double(n);
    const float mean_f = float(mean);
    const float rstd_f = float(1.0 / sqrt(var + double(p.eps)));
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int c = g * cpg + int(i / p.length);
        finish(i, x[i], mean_f, rstd_f, p.gamma ? p.gamma[c] : 1.f, p.beta ? p.beta[c] : 0.f, film ? film_term(p, film, c) : 1.f,
               film ? film_term(p, film, p.channels + c) : 0.f, p.residual ? p.residual[base + i] : 0.f);
    }
}

/// One (batch, group) per cluster of gridDim.z blocks (sm_90); block `rank` owns elements [n*rank/S, n*(rank+1)/S)
/// of the group. kInRegs: the share fits kClusterThreads * kClusterRegs elements and is read once into registers;
/// otherwise x is read twice (sums, then the epilogue).
template <bool kInRegs>
__global__ void __launch_bounds__(kClusterThreads) group_norm_cluster_kernel(GroupNormParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ double scratch[2][32];
    __shared__ double partial[2];  // this block's (sum, sum of squares), read by the whole cluster
    __shared__ float stats[2];     // the group's (mean, rstd)
    detail::pdl_wait();            // launched with PDL: x and the residual are earlier kernels' outputs
    const cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int rank = int(cl.block_rank()), n_rank = int(cl.num_blocks());
    const int cpg = p.channels / p.groups;
    const int b = int(blockIdx.x) / p.groups, g = int(blockIdx.x) % p.groups;
    const std::int64_t n = std::int64_t(cpg) * p.length;
    const std::int64_t lo = n * rank / n_rank, hi = n * (rank + 1) / n_rank;
    const std::size_t base = (std::size_t(b) * p.channels + std::size_t(g) * cpg) * p.length;
    const float* x = p.x + base;
    const float* film = group_film(p, b);
    // Per-element epilogue operands of element i of the group.
    auto operands = [&](std::int64_t i, float& ga, float& be, float& fsc, float& fbi, float& res) {
        const int c = g * cpg + int(i / p.length);
        ga = p.gamma ? p.gamma[c] : 1.f;
        be = p.beta ? p.beta[c] : 0.f;
        fsc = film ? film_term(p, film, c) : 1.f;
        fbi = film ? film_term(p, film, p.channels + c) : 0.f;
        res = p.residual ? p.residual[base + i] : 0.f;
    };
    // The cluster's (mean, rstd) from each block's partial sums, added in rank order (the same in every block).
    auto cluster_stats = [&](double s, double q) {
        block_sum2(s, q, scratch);
        if (threadIdx.x == 0) {
            partial[0] = s;
            partial[1] = q;
        }
        cl.sync();  // every block's partial is visible
        if (threadIdx.x == 0) {
            double ts = 0.0, tq = 0.0;
            for (int r = 0; r < n_rank; ++r) {
                const double* rp = cl.map_shared_rank(partial, r);
                ts += rp[0];
                tq += rp[1];
            }
            const float2 st = group_stats(ts, tq, double(n), p.eps);
            stats[0] = st.x;
            stats[1] = st.y;
        }
        cl.sync();  // stats written; no block leaves while another still reads its partial
    };
    if constexpr (kInRegs) {
        float v[kClusterRegs], ga[kClusterRegs], be[kClusterRegs], fsc[kClusterRegs], fbi[kClusterRegs], res[kClusterRegs];
        double s = 0.0, q = 0.0;
#pragma unroll
        for (int r = 0; r < kClusterRegs; ++r) {
            const std::int64_t i = lo + threadIdx.x + std::int64_t(r) * kClusterThreads;
            const bool in = i < hi;
            v[r] = in ? x[i] : 0.f;
            operands(in ? i : lo, ga[r], be[r], fsc[r], fbi[r], res[r]);
        }
#pragma unroll
        for (int r = 0; r < kClusterRegs; ++r) {
            s += double(v[r]);
            q += double(v[r]) * double(v[r]);
        }
        cluster_stats(s, q);
        const float mean_f = stats[0], rstd_f = stats[1];
#pragma unroll
        for (int r = 0; r < kClusterRegs; ++r) {
            const std::int64_t i = lo + threadIdx.x + std::int64_t(r) * kClusterThreads;
            if (i < hi)
                p.y[base + i] = group_norm_epilogue(p, film != nullptr, v[r], mean_f, rstd_f, ga[r], be[r], fsc[r], fbi[r], res[r]);
        }
    } else {
        double s = 0.0, q = 0.0;
        for (std::int64_t i = lo + threadIdx.x; i < hi; i += kClusterThreads) {
            const double xi = double(x[i]);
            s += xi;
            q += xi * xi;
        }
        cluster_stats(s, q);
        const float mean_f = stats[0], rstd_f = stats[1];
        for (std::int64_t i = lo + threadIdx.x; i < hi; i += kClusterThreads) {
            float ga, be, fsc, fbi, res;
            operands(i, ga, be, fsc, fbi, res);
            p.y[base + i] = group_norm_epilogue(p, film != nullptr, x[i], mean_f, rstd_f, ga, be, fsc, fbi, res);
        }
    }
#else
    __trap();  // clusters need sm_90; the host selects this kernel only there
#endif
}

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    __shared__ double scratch[32];
    const float* x = p.x + std::size_t(blockIdx.x) * p.dim;
    float* y = p.y + std::size_t(blockIdx.x) * p.dim;
    double s = 0.0;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) s += double(x[i]) * double(x[i]);
    const double ms = block_sum(s, scratch) / double(p.dim);
    const float scale = float(1.0 / sqrt(ms + double(p.eps)));
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) y[i] = x[i] * scale * (p.weight ? p.weight[i] : 1.f);
}

/// GroupNorm of a conv output given as a library GEMM's d[n][c] (n = b * length + t) plus the conv bias[c]: one block
/// per (batch, group) of <= Threads * kRegs elements. The group is read channel-fastest (runs of D's rows), staged
/// in shared memory in [channel][position] order, and the epilogue runs position-fastest, so y and the residual are
/// accessed as contiguous [batch, channels, length] runs. Sums as group_norm_kernel's (double, one block reduction).
/// Threads = 128 (groups of <= 1024 elements, grids beyond one wave of 256-thread blocks): each thread still holds 8
/// elements and twice as many blocks fit an SM.
template <int Threads>
__global__ void __launch_bounds__(Threads) group_norm_gemm_layout_kernel(GroupNormParams p, const float* __restrict__ d,
                                                                         const float* __restrict__ bias) {
    constexpr int kThreads = Threads;
    __shared__ double scratch[2][32];
    __shared__ float xs[kThreads * kRegs];
    detail::pdl_wait();  // launched with launch_pdl: d is the GEMM's output
    detail::pdl_allow_next();
    const int cpg = p.channels / p.groups, L = p.length;
    const int b = blockIdx.x / p.groups, g = blockIdx.x % p.groups;
    const int n = cpg * L;
    const std::size_t base = (std::size_t(b) * p.channels + std::size_t(g) * cpg) * L;
    const float* film = group_film(p, b);
    float ga[kRegs], be[kRegs], fsc[kRegs], fbi[kRegs], res[kRegs];
#pragma unroll
    for (int r = 0; r < kRegs; ++r) {  // the epilogue's operands, element i = (channel i / L, position i % L)
        const int i = threadIdx.x + r * kThreads;
        const bool in = i < n;
        const int c = g * cpg + (in ? i / L : 0);
        ga[r] = p.gamma ? p.gamma[c] : 1.f;
        be[r] = p.beta ? p.beta[c] : 0.f;
        fsc[r] = film ? film_term(p, film, c) : 1.f;
        fbi[r] = film ? film_term(p, film, p.channels + c) : 0.f;
        res[r] = (p.residual && in) ? p.residual[base + i] : 0.f;
    }
    double s = 0.0, q = 0.0;
#pragma unroll
    for (int r = 0; r < kRegs; ++r) {  // element j = (position j / cpg, channel j % cpg): D's rows, contiguous in c
        const int j = threadIdx.x + r * kThreads;
        if (j < n) {
            const int t = j / cpg, cl = j - t * cpg, c = g * cpg + cl;
            float v = d[(std::size_t(b) * L + t) * p.channels + c];
            if (bias) v += bias[c];  // the float the transpose kernel would have stored
            xs[cl * L + t] = v;
            s += double(v);
            q += double(v) * double(v);
        }
    }
    block_sum2(s, q, scratch);  // its barriers also publish xs
    const float2 st = group_stats(s, q, double(n), p.eps);
#pragma unroll
    for (int r = 0; r < kRegs; ++r) {
        const int i = threadIdx.x + r * kThreads;
        if (i < n) p.y[base + i] = group_norm_epilogue(p, film != nullptr, xs[i], st.x, st.y, ga[r], be[r], fsc[r], fbi[r], res[r]);
    }
}
static_assert(kThreads * kRegs == detail::kGroupNormBlockElements, "group_norm_gemm_layout_fits() assumes this block size");

/// Cluster size S for groups of `n` elements (1 = one block per group): 1 for groups of up to 1024 elements or
/// without clusters (below sm_90, or FLOWEDGE_CUDA_GN_NO_CLUSTER=1); else the smallest power of two (<= 8) whose
/// share fits a block's registers, doubled while one sample's groups * S stay below the SM count and every thread
/// keeps at least one element. A function of the per-sample geometry and the device only, never the batch.
int group_cluster_split(long long n, int groups) {
    static const bool disabled = detail::env_flag("FLOWEDGE_CUDA_GN_NO_CLUSTER");
    if (disabled || detail::compute_major() < 9 || n <= 4LL * kThreads) return 1;
    const long long per_block = (long long)kClusterThreads * kClusterRegs;
    int s = 2;
    while (s < kMaxGroupCluster && (n + s - 1) / s > per_block) s *= 2;
    while (s < kMaxGroupCluster && (long long)groups * s < detail::sm_count() && n / (2LL * s) >= kClusterThreads) s *= 2;
    return s;
}

}  // namespace

void group_norm(const GroupNormParams& p, Stream s) {
    constexpr std::string_view comp = "cuda group_norm";
    check(p.batch > 0 && p.channels > 0 && p.length > 0 && p.groups > 0, comp, "sizes must be positive");
    if (!(p.channels % p.groups == 0)) [[unlikely]]
        fail(comp,
             "channels must be divisible by groups" + expected_got("a multiple of " + std::to_string(p.groups), p.channels));
    check(p.x && p.y, comp, "null x or y pointer");
    if (!(p.film_stride == 0 || p.film_stride >= 2 * p.channels)) [[unlikely]]
        fail(comp, "FiLM row stride too small" + expected_got(">= " + std::to_string(2 * p.channels), p.film_stride));
    const long long n_blocks = (long long)p.batch * p.groups;
    check(n_blocks <= 0x7fffffffLL, comp, "too many (batch, group) pairs");
    const cudaStream_t st = detail::resolve(s);
    const long long n = (long long)(p.channels / p.groups) * p.length;
    const int split = group_cluster_split(n, p.groups);
    if (split == 1) {
        detail::launch_pdl(group_norm_kernel, dim3(unsigned(n_blocks)), dim3(kThreads), 0, st, p);
        FLOWEDGE_CUDA_CHECK_LAUNCH("group_norm_kernel");
        return;
    }
    const dim3 grid(unsigned(n_blocks), 1, unsigned(split));
    if ((n + split - 1) / split <= (long long)kClusterThreads * kClusterRegs)
        detail::launch_pdl_cluster(group_norm_cluster_kernel<true>, grid, dim3(kClusterThreads), 0, st, unsigned(split), p);
    else
        detail::launch_pdl_cluster(group_norm_cluster_kernel<false>, grid, dim3(kClusterThreads), 0, st, unsigned(split), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("group_norm_cluster_kernel");
}

namespace detail {

/// FLOWEDGE_CUDA_GN_LAYOUT_THREADS = 128 or 256 forces the block size of group_norm_gemm_layout (A/B timing); unset,
/// 0: the automatic rule. Read once.
int forced_gemm_layout_threads() {
    static const int v = [] {
        const char* e = std::getenv("FLOWEDGE_CUDA_GN_LAYOUT_THREADS");
        const std::string_view s = e ? e : "";
        if (s.empty() || s == "0") return 0;
        if (s == "128" || s == "256") return s == "128" ? 128 : 256;
        fail("cuda group_norm", "FLOWEDGE_CUDA_GN_LAYOUT_THREADS" + expected_got("128, 256 or unset", std::string(s)));
    }();
    return v;
}

void group_norm_gemm_layout(const GroupNormParams& p, const float* d, const float* bias, cudaStream_t st) {
    constexpr auto kWide = group_norm_gemm_layout_kernel<kThreads>;
    constexpr auto kNarrow = group_norm_gemm_layout_kernel<kThreads / 2>;
    static const int forced = forced_gemm_layout_threads();
    static const int wide_per_sm = [] {
        int n = 0;
        FLOWEDGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kWide, kThreads, 0));
        return n > 0 ? n : 1;
    }();
    const long long blocks = (long long)p.batch * p.groups;
    const bool fits_narrow = (p.channels / p.groups) * p.length <= kGroupNormBlockElements / 2;
    // 128-thread blocks when the 256-thread grid would take more than one wave (PushT batch 64: 512 blocks); with
    // fewer blocks the 256-thread block finishes its group sooner (docs/kernels/cuda.md).
    const bool narrow = fits_narrow && (forced == kThreads / 2 || (forced != kThreads && blocks > (long long)wide_per_sm * sm_count()));
    if (narrow) launch_pdl(kNarrow, dim3(unsigned(blocks)), dim3(kThreads / 2), 0, st, p, d, bias);
    else launch_pdl(kWide, dim3(unsigned(blocks)), dim3(kThreads), 0, st, p, d, bias);
    FLOWEDGE_CUDA_CHECK_LAUNCH("group_norm_gemm_layout_kernel");
}

}  // namespace detail

void rms_norm(const RmsNormParams& p, Stream s) {
    constexpr std::string_view comp = "cuda rms_norm";
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail(comp, "sizes must be positive" + expected_got("dim > 0", p.dim));
    check(p.x && p.y, comp, "null x or y pointer");
    if (p.rows == 0) return;
    detail::launch_pdl(rms_norm_kernel, dim3(unsigned(p.rows)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

}  // namespace flowedge::cuda
