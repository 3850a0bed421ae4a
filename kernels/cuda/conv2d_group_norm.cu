// torch.nn.Conv2d (no bias, F32 weights and math) followed by nn.GroupNorm on its output with the ResNet BasicBlock's
// epilogue (act, residual, post_act), as ONE launch: LeRobot's use_group_norm encoder runs every conv of layer1..layer4
// this way instead of a conv kernel and a GroupNorm kernel each (issue 19: at batch 1 the encoder's time is its
// kernel count).
//
// One thread-block cluster of S = 16 blocks (8 where the device cannot hold 16) per (image b, group g): the cluster
// computes the group's cpg output channels over all out_h * out_w positions. Block `rank` takes the input channels
// [rank * Ci/S, (rank + 1) * Ci/S) (every tap): their weights go to shared memory transposed to [k][channel] (before
// the programmatic-dependent-launch wait), their input maps zero-padded (so the gather needs no bounds tests).
// A thread owns a register tile of 4 channels x 4 positions: per k one float4 of weights and 4 input values feed 16
// multiply-adds. Where the group has few tiles (small maps), the block's k range is also split into up to 16 slices
// so that every thread has a tile; the slices are added in order into the block's partial sums. Block `rank` then
// finishes the outputs [rank * n/S, (rank + 1) * n/S) of the group (n = cpg * P): the S partials added in rank order
// through distributed shared memory, the group's sum and sum of squares in double (each block its share, the S
// shares added in rank order), mean and rstd as group_norm_kernel forms them (E[x^2] - mean^2 in double), and the
// epilogue as group_norm_epilogue computes it. Deterministic (fixed orders, no atomics; S depends on the device, the
// slices on the per-image geometry only); the sums are not in the order of the separate conv2d kernel, so the output
// differs from conv2d + group_norm in the last bits (op test: against a double reference at the same bound).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common.cuh"
#include "cluster_splitk.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kCT = 4;                  // output channels of a thread's tile (one float4 of transposed weights)
constexpr int kPT = 4;                  // output positions of a thread's tile
constexpr int kMaxSlices = 16;          // k slices per block at most
constexpr int kMaxFinishPerThread = 4;  // outputs a thread finishes: cpg * P <= S * kThreads * 4

/// Per-call sizes and the shared-memory layout (floats; regions 16-byte aligned).
struct Geom {
    int cluster = 8;  // S, blocks per cluster
    int P = 0, cpg = 0, cpg4 = 0, khw = 0, ci_per = 0, kr_max = 0, pw = 0, phw = 0, n = 0;
    int npg = 0, tiles = 0, slices = 1;  // position groups, tiles (channel quads x position groups), k slices
    int w_s = 0, x_s = 0, koff = 0, part = 0, total = 0;  // weights [kr][cpg4], padded inputs [ci_per][phw],
                                                          // tap offsets [kr] (int), partials [slices][n]
};

__host__ __device__ constexpr int pad4(int v) { return (v + 3) & ~3; }

Geom make_geom(const Conv2dGroupNormParams& p, int cluster) {
    const Conv2dParams& c = p.conv;
    Geom g;
    g.cluster = cluster;
    g.P = c.out_h * c.out_w;
    g.cpg = c.out_channels / p.norm.groups;
    g.cpg4 = pad4(g.cpg);
    g.khw = c.kernel_h * c.kernel_w;
    g.ci_per = (c.in_channels + cluster - 1) / cluster;
    g.kr_max = g.ci_per * g.khw;
    g.pw = c.in_w + 2 * c.pad_w;
    g.phw = (c.in_h + 2 * c.pad_h) * g.pw;
    g.n = g.cpg * g.P;
    g.npg = (g.P + kPT - 1) / kPT;
    g.tiles = g.cpg4 / kCT * g.npg;
    // Enough slices that the block's threads all have a tile (a function of the per-image geometry only).
    while (g.slices < kMaxSlices && 2LL * g.tiles * g.slices <= kThreads) g.slices *= 2;
    g.w_s = 0;
    g.x_s = g.w_s + g.kr_max * g.cpg4;
    g.koff = g.x_s + pad4(g.ci_per * g.phw);
    g.part = g.koff + pad4(g.kr_max);
    g.total = g.part + g.slices * pad4(g.n);
    return g;
}

/// kS: blocks per cluster (g.cluster).
template <int kS>
__global__ void __launch_bounds__(kThreads, 4) conv2d_group_norm_kernel(const __grid_constant__ Conv2dGroupNormParams p, const Geom g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) float sm[];
    __shared__ double stats[2];
    __shared__ double scratch[2][kThreads / 32];
    const cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const Conv2dParams& c = p.conv;
    const GroupNormParams& nrm = p.norm;
    const int rank = int(cl.block_rank()), cluster = int(blockIdx.z) / kS;
    const int b = cluster / nrm.groups, grp = cluster % nrm.groups, o0 = grp * g.cpg, tid = int(threadIdx.x);
    const int i0 = min(c.in_channels, rank * g.ci_per), ni = min(c.in_channels, i0 + g.ci_per) - i0;
    const int K = c.in_channels * g.khw, kr = ni * g.khw;  // this block's reduction length per output
    float* const w_s = sm + g.w_s;
    float* const x_s = sm + g.x_s;
    int* const koff = reinterpret_cast<int*>(sm + g.koff);
    float* const part = sm + g.part;

    // Weights (constants) before the PDL wait: rows o0 .. o0 + cpg, columns [i0 * khw, i0 * khw + kr), stored
    // transposed (zero rows up to cpg4); the gather offset of every tap into the padded input maps. Every copy is a
    // 4-byte cp.async (zero-filling where src-size is 0), so all of a thread's loads are in flight at once.
    const float* const w = static_cast<const float*>(c.w.data) + std::size_t(o0) * K + std::size_t(i0) * g.khw;
    for (int e = tid; e < g.cpg4 * kr; e += kThreads) {
        const int ch = e / kr, kk = e - ch * kr;
        const bool ok = ch < g.cpg;
        detail::cp_async4(w_s + kk * g.cpg4 + ch, w + std::size_t(ok ? ch : 0) * K + kk, ok ? 4 : 0);
    }
    detail::cp_async_commit();
    for (int kk = tid; kk < kr; kk += kThreads) {
        const int i = kk / g.khw, r = kk - i * g.khw, u = r / c.kernel_w;
        koff[kk] = i * g.phw + u * g.pw + (r - u * c.kernel_w);
    }
    detail::pdl_wait();  // x and the residual are earlier kernels' outputs
    const float* const xb = c.x + (std::size_t(b) * c.in_channels + i0) * c.in_h * c.in_w;
    for (int e = tid; e < ni * g.phw; e += kThreads) {
        const int i = e / g.phw, r = e - i * g.phw, row = r / g.pw;
        const int ih = row - c.pad_h, iw = r - row * g.pw - c.pad_w;
        const bool ok = ih >= 0 && ih < c.in_h && iw >= 0 && iw < c.in_w;
        detail::cp_async4(x_s + e, ok ? xb + (std::size_t(i) * c.in_h + ih) * c.in_w + iw : xb, ok ? 4 : 0);
    }
    detail::cp_async_commit();
    // This thread's outputs of the finish (below) and their epilogue operands, loaded while the conv runs.
    const int e0 = int((long long)g.n * rank / kS), e1 = int((long long)g.n * (rank + 1) / kS);
    const std::size_t base = (std::size_t(b) * c.out_channels + o0) * g.P;  // the group's first output
    float res[kMaxFinishPerThread], gam[kMaxFinishPerThread], bet[kMaxFinishPerThread];
#pragma unroll
    for (int k = 0; k < kMaxFinishPerThread; ++k) {
        const int e = e0 + tid + k * kThreads, ch = o0 + e / g.P;
        const bool ok = e < e1;
        res[k] = ok && nrm.residual ? nrm.residual[base + e] : 0.f;
        gam[k] = ok && nrm.gamma ? nrm.gamma[ch] : 1.f;
        bet[k] = ok && nrm.beta ? nrm.beta[ch] : 0.f;
    }
    detail::cp_async_wait<0>();
    __syncthreads();

    // Register tiles: item = (slice, channel quad, position group); position j of group pg is q = pg + j * npg, so
    // neighbouring threads gather neighbouring positions and a warp mostly shares one channel quad's weights.
    const int ncq = g.cpg4 / kCT;
    const float4* const w4 = reinterpret_cast<const float4*>(w_s);
    for (int item = tid; item < g.tiles * g.slices; item += kThreads) {
        const int s = item / g.tiles, t = item - s * g.tiles, cq = t / g.npg, pg = t - cq * g.npg;
        int xo[kPT];
#pragma unroll
        for (int j = 0; j < kPT; ++j) {
            const int q = min(pg + j * g.npg, g.P - 1), oh = q / c.out_w, ow = q - oh * c.out_w;
            xo[j] = oh * c.stride_h * g.pw + ow * c.stride_w;
        }
        const int k0 = int((long long)kr * s / g.slices), k1 = int((long long)kr * (s + 1) / g.slices);
        float acc[kCT][kPT];
#pragma unroll
        for (int a = 0; a < kCT; ++a)
#pragma unroll
            for (int j = 0; j < kPT; ++j) acc[a][j] = 0.f;
#pragma unroll 4
        for (int kk = k0; kk < k1; ++kk) {
            const int off = koff[kk];
            const float4 wv = w4[kk * ncq + cq];
            const float wa[kCT] = {wv.x, wv.y, wv.z, wv.w};
            float xv[kPT];
#pragma unroll
            for (int j = 0; j < kPT; ++j) xv[j] = x_s[xo[j] + off];
#pragma unroll
            for (int a = 0; a < kCT; ++a)
#pragma unroll
                for (int j = 0; j < kPT; ++j) acc[a][j] = fmaf(wa[a], xv[j], acc[a][j]);
        }
        float* const ps = part + s * pad4(g.n);
#pragma unroll
        for (int a = 0; a < kCT; ++a) {
            const int ch = cq * kCT + a;
            if (ch >= g.cpg) continue;
#pragma unroll
            for (int j = 0; j < kPT; ++j) {
                const int q = pg + j * g.npg;
                if (q < g.P) ps[ch * g.P + q] = acc[a][j];
            }
        }
    }
    __syncthreads();
    if (g.slices > 1)  // the slices in order into slice 0 (each element read and written by one thread)
        for (int e = tid; e < g.n; e += kThreads) {
            float v = part[e];
            for (int s = 1; s < g.slices; ++s) v += part[s * pad4(g.n) + e];
            part[e] = v;
        }
    cl.sync();  // every block's partials visible

    // This block's share of the outputs: the S partials in rank order (all S loads issued first), then its part of
    // the group's sums.
    float v[kMaxFinishPerThread];
    double s = 0.0, sq = 0.0;
#pragma unroll
    for (int k = 0; k < kMaxFinishPerThread; ++k) {
        const int e = e0 + tid + k * kThreads;
        v[k] = 0.f;
        if (e < e1) {
            float t[kS];
#pragma unroll
            for (int r = 0; r < kS; ++r) t[r] = cl.map_shared_rank(part, r)[e];
#pragma unroll
            for (int r = 1; r < kS; ++r) t[0] += t[r];
            v[k] = t[0];
            s += double(v[k]);
            sq += double(v[k]) * double(v[k]);
        }
    }
    // Block totals (fixed order: lanes, then warps), then the cluster's in rank order.
    {
        const int lane = tid & 31, warp = tid >> 5;
        s = detail::warp_sum(s);
        sq = detail::warp_sum(sq);
        if (lane == 0) scratch[0][warp] = s, scratch[1][warp] = sq;
        __syncthreads();
        if (tid == 0) {
            double a = 0.0, q = 0.0;
            for (int w8 = 0; w8 < kThreads / 32; ++w8) a += scratch[0][w8], q += scratch[1][w8];
            stats[0] = a, stats[1] = q;
        }
    }
    cl.sync();  // every block's share of the sums visible (and every remote read of the partials done)
    double tot = 0.0, tot_sq = 0.0;
#pragma unroll
    for (int r = 0; r < kS; ++r) {
        const double* st = cl.map_shared_rank(stats, r);
        tot += st[0];
        tot_sq += st[1];
    }
    const double mean = tot / double(g.n);
    const double var = fmax(tot_sq / double(g.n) - mean * mean, 0.0);
    const float mean_f = float(mean), rstd_f = float(1.0 / sqrt(var + double(nrm.eps)));
#pragma unroll
    for (int k = 0; k < kMaxFinishPerThread; ++k) {
        const int e = e0 + tid + k * kThreads;
        if (e >= e1) continue;
        // group_norm_epilogue (norm.cu): the same float evaluation order.
        const float scale = nrm.gamma ? gam[k] * rstd_f : rstd_f;
        float a = (v[k] - mean_f) * scale + bet[k];
        a = detail::apply_act(nrm.act, a);
        if (nrm.residual) a += res[k];
        c.y[base + e] = detail::apply_act(nrm.post_act, a);
    }
    cl.sync();  // no block leaves while another may still read its statistics
#else
    __trap();  // clusters need sm_90; the host launches this kernel only there
#endif
}

/// Shared memory a cluster-16 launch may use: 16 blocks of this size must fit on one GPC.
constexpr std::size_t kCluster16SmemCap = 96 * 1024;

/// Dynamic shared memory a block may take: the device's opt-in limit less the static stats, scratch and a reserve.
/// Also the one value every call sets as the kernels' MaxDynamicSharedMemorySize (opt_in_smem_once's contract).
std::size_t smem_limit() { return std::size_t(detail::smem_per_block_optin()) - 2048; }

/// 16 blocks per cluster where the device can run such a cluster with kCluster16SmemCap bytes per block (a
/// non-portable size; Hopper can), else 8; FLOWEDGE_CUDA_CONV_GN_CLUSTER=8 forces 8 (A/B). Cached per device.
int cluster_for_device() {
    static const bool force8 = [] {
        const char* v = std::getenv("FLOWEDGE_CUDA_CONV_GN_CLUSTER");
        return v && std::string_view(v) == "8";
    }();
    if (force8) return 8;
    int dev = 0;
    FLOWEDGE_CUDA_CHECK(cudaGetDevice(&dev));
    static std::atomic<int> cached[16] = {};  // 0 unknown, else the cluster size, per device ordinal < 16
    if (dev < 16 && cached[dev].load(std::memory_order_acquire)) return cached[dev].load(std::memory_order_relaxed);
    int size = 8;
    if (cudaFuncSetAttribute(conv2d_group_norm_kernel<16>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
        cudaFuncSetAttribute(conv2d_group_norm_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_limit())) ==
            cudaSuccess) {
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeClusterDimension;
        attr.val.clusterDim.x = 1;
        attr.val.clusterDim.y = 1;
        attr.val.clusterDim.z = 16;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(1, 1, 16);
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = std::min(kCluster16SmemCap, smem_limit());
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        int clusters = 0;
        if (cudaOccupancyMaxActiveClusters(&clusters, conv2d_group_norm_kernel<16>, &cfg) == cudaSuccess && clusters >= 1) size = 16;
    }
    (void)cudaGetLastError();  // a refused query leaves no sticky error: the launch path below checks its own
    if (dev < 16) cached[dev].store(size, std::memory_order_release);
    return size;
}

}  // namespace

bool conv2d_group_norm(const Conv2dGroupNormParams& p, Stream s) {
    const Conv2dParams& c = p.conv;
    const GroupNormParams& n = p.norm;
    if (detail::compute_major() < 9) return false;
    if (c.w.dtype != DType::F32 || !c.w.data || c.math != MathMode::F32 || c.f32_gemm || c.bias || c.residual ||
        c.act != Activation::None || n.film || n.film_shared)
        return false;
    if (n.groups <= 0 || c.out_channels % n.groups != 0) return false;
    int cluster = cluster_for_device();
    Geom g = make_geom(p, cluster);
    const std::size_t limit = smem_limit();
    if (cluster == 16 && sizeof(float) * std::size_t(g.total) > std::min(limit, kCluster16SmemCap)) g = make_geom(p, cluster = 8);
    if (g.n > g.cluster * kThreads * kMaxFinishPerThread) return false;
    const std::size_t bytes = sizeof(float) * std::size_t(g.total);
    if (bytes > limit) return false;
    if ((long long)c.batch * n.groups * g.cluster > 65535) return false;  // grid z
    const auto launch = [&](auto kernel, std::atomic<int>& opted_device) {
        detail::opt_in_smem_once(kernel, bytes, int(limit), opted_device);
        detail::launch_pdl_cluster(kernel, dim3(1, 1, unsigned(c.batch * n.groups * g.cluster)), dim3(kThreads), bytes,
                                   detail::resolve(s), unsigned(g.cluster), p, g);
    };
    static std::atomic<int> opted8{-1}, opted16{-1};
    if (g.cluster == 16) launch(conv2d_group_norm_kernel<16>, opted16);
    else launch(conv2d_group_norm_kernel<8>, opted8);
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv2d_group_norm_kernel");
    return true;
}

}  // namespace flowedge::cuda
