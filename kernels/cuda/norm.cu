// GroupNorm (with the fused act -> FiLM -> residual epilogue of the U-Net residual block) and Mamba's RMSNorm.
//
// group_norm: one block of 256 threads per (batch, group); the group's (channels/groups) x length
//   elements are contiguous. Epilogue order: act, FiLM, residual, post_act (GroupNormParams). Groups of up to 2048 elements are read once into registers together with the
//   epilogue's operands (one round of loads), and sum and sum of squares are reduced in double in one fixed-order
//   block reduction (deterministic); larger groups take two passes (mean, then the variance around it). At
//   batch 1 a GroupNorm is latency-bound (8 blocks, ~1024 elements each), so one round of loads and one reduction
//   matter more than bandwidth (docs/performance/cuda.md). Then one pass normalises, applies
//   gamma/beta, the activation, FiLM (scale*a + bias) and the residual, in float, and writes y
//   (y may alias x: each element is read and written by the same thread).
// rms_norm: one block of 256 threads per row; sum of squares in double, y = x * rsqrt(mean + eps) * w.
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;

/// Sum over the block in a fixed order (lanes, then warps); every thread receives the result.
__device__ double block_sum(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = detail::warp_sum(v);
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double total = 0.0;
    const int n_warps = (blockDim.x + 31) >> 5;
    for (int w = 0; w < n_warps; ++w) total += scratch[w];
    return total;
}

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

__global__ void __launch_bounds__(kThreads) group_norm_kernel(GroupNormParams p) {
    __shared__ double scratch[2][32];
    detail::pdl_wait();  // launched with launch_pdl: x is the previous kernel's output
    detail::pdl_allow_next();
    const int cpg = p.channels / p.groups;
    const int b = blockIdx.x / p.groups, g = blockIdx.x % p.groups;
    const std::int64_t n = std::int64_t(cpg) * p.length;
    const std::size_t base = (std::size_t(b) * p.channels + std::size_t(g) * cpg) * p.length;
    const float* x = p.x + base;
    const int fs = p.film_stride ? p.film_stride : 2 * p.channels;
    const float* film = p.film ? p.film + std::size_t(b) * fs : nullptr;
    auto finish = [&](std::int64_t i, float xi, float mean_f, float rstd_f, float gamma, float beta, float f_scale,
                      float f_bias, float res) {
        const float scale = p.gamma ? gamma * rstd_f : rstd_f;  // same float evaluation order as Ops<Cpu>
        float a = (xi - mean_f) * scale + beta;
        a = detail::apply_act(p.act, a);
        if (film) a = f_scale * a + f_bias;
        if (p.residual) a += res;
        p.y[base + i] = detail::apply_act(p.post_act, a);  // after the residual (ResNet BasicBlock: ReLU)
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
            fsc[r] = film ? film[c] : 1.f;
            fbi[r] = film ? film[p.channels + c] : 0.f;
            res[r] = (p.residual && in) ? p.residual[base + i] : 0.f;
        }
#pragma unroll
        for (int r = 0; r < kRegs; ++r) {
            s += double(v[r]);
            q += double(v[r]) * double(v[r]);
        }
        block_sum2(s, q, scratch);
        const double mean = s / double(n);
        const double var = fmax(q / double(n) - mean * mean, 0.0);
        const float mean_f = float(mean);
        const float rstd_f = float(1.0 / sqrt(var + double(p.eps)));
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
        finish(i, x[i], mean_f, rstd_f, p.gamma ? p.gamma[c] : 1.f, p.beta ? p.beta[c] : 0.f, film ? film[c] : 1.f,
               film ? film[p.channels + c] : 0.f, p.residual ? p.residual[base + i] : 0.f);
    }
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

}  // namespace

void group_norm(const GroupNormParams& p, Stream s) {
    constexpr std::string_view comp = "cuda group_norm";
    check(p.batch > 0 && p.channels > 0 && p.length > 0 && p.groups > 0, comp, "sizes must be positive");
    check(p.channels % p.groups == 0, comp,
          "channels must be divisible by groups" + expected_got("a multiple of " + std::to_string(p.groups), p.channels));
    check(p.x && p.y, comp, "null x or y pointer");
    check(p.film_stride == 0 || p.film_stride >= 2 * p.channels, comp,
          "FiLM row stride too small" + expected_got(">= " + std::to_string(2 * p.channels), p.film_stride));
    const long long n_blocks = (long long)p.batch * p.groups;
    check(n_blocks <= 0x7fffffffLL, comp, "too many (batch, group) pairs");
    detail::launch_pdl(group_norm_kernel, dim3(unsigned(n_blocks)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("group_norm_kernel");
}

void rms_norm(const RmsNormParams& p, Stream s) {
    constexpr std::string_view comp = "cuda rms_norm";
    check(p.rows >= 0 && p.dim > 0, comp, "sizes must be positive" + expected_got("dim > 0", p.dim));
    check(p.x && p.y, comp, "null x or y pointer");
    if (p.rows == 0) return;
    detail::launch_pdl(rms_norm_kernel, dim3(unsigned(p.rows)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

}  // namespace flowedge::cuda
