// torch.nn.Conv2d (no bias, F32 weights and math) followed by nn.GroupNorm on its output with the ResNet BasicBlock's
// epilogue (act, residual, post_act), as ONE launch: LeRobot's use_group_norm encoder runs every conv of layer1..layer4
// this way instead of a conv kernel and a GroupNorm kernel each (issue 19: the encoder's time is kernel count).
//
// One thread-block cluster of kS = 8 blocks per (image b, group g): the cluster computes the group's cpg output
// channels over all out_h * out_w pixels. Block `rank` takes the input channels [rank * Ci/8, (rank + 1) * Ci/8)
// (every tap): it copies their weights [cpg][its channels * kh * kw] and their input maps into shared memory (cp.async;
// the weights before the programmatic-dependent-launch wait) and computes the partial sums of all cpg * P outputs,
// each a float chain over (its channels, kh, kw) in that order. Block `rank` then finishes the outputs
// [rank * n/8, (rank + 1) * n/8) of the group (n = cpg * P): the 8 partials added in rank order through distributed
// shared memory, the group's sum and sum of squares in double (each block its share, the 8 shares added in rank
// order), mean and rstd as group_norm_kernel forms them (E[x^2] - mean^2 in double), and the epilogue as
// group_norm_epilogue computes it. Deterministic (fixed orders, no atomics); the sums are not in the order of the
// separate conv2d kernel, so the output differs from conv2d + group_norm in the last bits (op test: against a double
// reference at the same bound).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common.cuh"
#include "cluster_splitk.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kS = 8;                    // blocks per cluster (portable size)
constexpr int kMaxFinishPerThread = 4;   // outputs a thread finishes: cpg * P <= kS * kThreads * 4

/// Per-call sizes and the shared-memory layout (floats; regions 16-byte aligned).
struct Geom {
    int P = 0, cpg = 0, khw = 0, ci_per = 0, in_hw = 0, n = 0;
    int w_s = 0, x_s = 0, red = 0, total = 0;  // offsets: weights [cpg][ci_per * khw], inputs [ci_per][in_hw], partials [n]
};

__host__ __device__ constexpr int pad4(int v) { return (v + 3) & ~3; }

Geom make_geom(const Conv2dGroupNormParams& p) {
    const Conv2dParams& c = p.conv;
    Geom g;
    g.P = c.out_h * c.out_w;
    g.cpg = c.out_channels / p.norm.groups;
    g.khw = c.kernel_h * c.kernel_w;
    g.ci_per = (c.in_channels + kS - 1) / kS;
    g.in_hw = c.in_h * c.in_w;
    g.n = g.cpg * g.P;
    g.w_s = 0;
    g.x_s = g.w_s + pad4(g.cpg * g.ci_per * g.khw);
    g.red = g.x_s + pad4(g.ci_per * g.in_hw);
    g.total = g.red + pad4(g.n);
    return g;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void copy_floats(float* dst, const float* src, int n) {
    const bool v16 = (reinterpret_cast<std::uintptr_t>(dst) & 15u) == 0 && (reinterpret_cast<std::uintptr_t>(src) & 15u) == 0;
    const int n16 = v16 ? n / 4 : 0;
    for (int e = int(threadIdx.x); e < n16; e += kThreads) detail::cp_async16(dst + 4 * e, src + 4 * e, 16);
    for (int e = 4 * n16 + int(threadIdx.x); e < n; e += kThreads) detail::cp_async4(dst + e, src + e, 4);
}
#endif

__global__ void __launch_bounds__(kThreads) conv2d_group_norm_kernel(const __grid_constant__ Conv2dGroupNormParams p, Geom g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) float sm[];
    __shared__ double stats[2];
    __shared__ double scratch[2][32];
    const cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const Conv2dParams& c = p.conv;
    const int rank = int(cl.block_rank()), cluster = int(blockIdx.z) / kS;
    const GroupNormParams& nrm = p.norm;
    const int b = cluster / nrm.groups, grp = cluster % nrm.groups, o0 = grp * g.cpg, tid = int(threadIdx.x);
    const int i0 = min(c.in_channels, rank * g.ci_per), ni = min(c.in_channels, i0 + g.ci_per) - i0;
    const int K = c.in_channels * g.khw, kr = ni * g.khw;  // this block's reduction length per output
    float* const w_s = sm + g.w_s;
    float* const x_s = sm + g.x_s;
    float* const red = sm + g.red;

    // Weights (constants) before the PDL wait: rows o0 .. o0 + cpg, columns [i0 * khw, i0 * khw + kr).
    const float* const w = static_cast<const float*>(c.w.data);
    for (int r = 0; r < g.cpg; ++r) copy_floats(w_s + r * kr, w + std::size_t(o0 + r) * K + std::size_t(i0) * g.khw, kr);
    detail::cp_async_commit();
    detail::pdl_wait();  // x and the residual are earlier kernels' outputs
    copy_floats(x_s, c.x + (std::size_t(b) * c.in_channels + i0) * g.in_hw, ni * g.in_hw);
    detail::cp_async_commit();
    detail::cp_async_wait<0>();
    __syncthreads();

    // Partial sums of every output of the group over this block's input channels.
    for (int o = tid; o < g.n; o += kThreads) {
        const int ch = o / g.P, q = o - ch * g.P, oh = q / c.out_w, ow = q - oh * c.out_w;
        const int ih0 = oh * c.stride_h - c.pad_h, iw0 = ow * c.stride_w - c.pad_w;
        const float* wr = w_s + ch * kr;
        float acc = 0.f;
        for (int i = 0; i < ni; ++i)
            for (int u = 0; u < c.kernel_h; ++u) {
                const int ih = ih0 + u;
                if (ih < 0 || ih >= c.in_h) continue;
                const float* xrow = x_s + i * g.in_hw + ih * c.in_w;
                const float* wk = wr + (i * c.kernel_h + u) * c.kernel_w;
                for (int v = 0; v < c.kernel_w; ++v) {
                    const int iw = iw0 + v;
                    if (iw >= 0 && iw < c.in_w) acc += wk[v] * xrow[iw];
                }
            }
        red[o] = acc;
    }
    cl.sync();  // every block's partials visible

    // This block's share of the outputs: the 8 partials in rank order, then its part of the group's sums.
    const int e0 = int((long long)g.n * rank / kS), e1 = int((long long)g.n * (rank + 1) / kS);
    float v[kMaxFinishPerThread];
    double s = 0.0, sq = 0.0;
#pragma unroll
    for (int k = 0; k < kMaxFinishPerThread; ++k) {
        const int e = e0 + tid + k * kThreads;
        v[k] = 0.f;
        if (e < e1) {
            float t = cl.map_shared_rank(red, 0)[e];
            for (int r = 1; r < kS; ++r) t += cl.map_shared_rank(red, r)[e];
            v[k] = t;
            s += double(t);
            sq += double(t) * double(t);
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
    for (int r = 0; r < kS; ++r) {
        const double* st = cl.map_shared_rank(stats, r);
        tot += st[0];
        tot_sq += st[1];
    }
    const double mean = tot / double(g.n);
    const double var = fmax(tot_sq / double(g.n) - mean * mean, 0.0);
    const float mean_f = float(mean), rstd_f = float(1.0 / sqrt(var + double(nrm.eps)));
    const std::size_t base = (std::size_t(b) * c.out_channels + o0) * g.P;  // the group's first output
#pragma unroll
    for (int k = 0; k < kMaxFinishPerThread; ++k) {
        const int e = e0 + tid + k * kThreads;
        if (e >= e1) continue;
        const int ch = o0 + e / g.P;
        // group_norm_epilogue (norm.cu): the same float evaluation order.
        const float scale = nrm.gamma ? nrm.gamma[ch] * rstd_f : rstd_f;
        float a = (v[k] - mean_f) * scale + (nrm.beta ? nrm.beta[ch] : 0.f);
        a = detail::apply_act(nrm.act, a);
        if (nrm.residual) a += nrm.residual[base + e];
        c.y[base + e] = detail::apply_act(nrm.post_act, a);
    }
    cl.sync();  // no block leaves while another may still read its statistics
#else
    __trap();  // clusters need sm_90; the host launches this kernel only there
#endif
}

}  // namespace

bool conv2d_group_norm(const Conv2dGroupNormParams& p, Stream s) {
    const Conv2dParams& c = p.conv;
    const GroupNormParams& n = p.norm;
    if (detail::compute_major() < 9) return false;
    if (c.w.dtype != DType::F32 || !c.w.data || c.math != MathMode::F32 || c.f32_gemm || c.bias || c.residual ||
        c.act != Activation::None || n.film)
        return false;
    if (n.groups <= 0 || c.out_channels % n.groups != 0) return false;
    const Geom g = make_geom(p);
    if (g.n > kS * kThreads * kMaxFinishPerThread) return false;
    const std::size_t bytes = sizeof(float) * std::size_t(g.total);
    const std::size_t limit = std::size_t(detail::smem_per_block_optin()) - 2048;  // static stats + scratch, reserve
    if (bytes > limit) return false;
    if ((long long)c.batch * n.groups * kS > 65535) return false;  // grid z
    static std::atomic<int> opted_device{-1};
    detail::opt_in_smem_once(conv2d_group_norm_kernel, bytes, int(limit), opted_device);
    detail::launch_pdl_cluster(conv2d_group_norm_kernel, dim3(1, 1, unsigned(c.batch * n.groups * kS)), dim3(kThreads), bytes,
                               detail::resolve(s), unsigned(kS), p, g);
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv2d_group_norm_kernel");
    return true;
}

}  // namespace flowedge::cuda
