// GroupNorm of one (batch, group) by one block of threads, shared by the group_norm kernel (norm.cu) and the fused
// conv1d + GroupNorm row convolution (conv.cu), so that both produce the same bits.
#pragma once
#include "common.cuh"

namespace flowedge::cuda::detail {

/// Threads per block that group_norm_group expects (its register budget is sized for it).
constexpr int kGroupNormThreads = 256;
/// Elements per thread kept in registers; larger groups (> kGroupNormThreads * kGroupNormRegs) re-read x.
constexpr int kGroupNormRegs = 8;

/// Sum over the block in a fixed order (lanes, then warps); every thread receives the result.
__device__ __forceinline__ double block_sum(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double total = 0.0;
    const int n_warps = (blockDim.x + 31) >> 5;
    for (int w = 0; w < n_warps; ++w) total += scratch[w];
    return total;
}

/// y[b, group g] = epilogue(groupnorm(x[b, group g])) with GroupNormParams' epilogue (act, FiLM, residual).
/// The group's (channels/groups) x length elements are contiguous; they are read once into registers (when they
/// fit), mean then the biased variance around it are summed in double (fixed order: deterministic), and one pass
/// normalises and applies the epilogue in float, in the same evaluation order as Ops<Cpu>. `load(ptr)` reads one
/// element of x (plain, or L2-only when other blocks of the same kernel wrote it). y may alias x. `scratch`: 32
/// doubles of shared memory. Every thread of the block must call it (it synchronises).
template <class Load>
__device__ __forceinline__ void group_norm_group(const GroupNormParams& p, int b, int g, double* scratch, Load load) {
    const int cpg = p.channels / p.groups;
    const std::int64_t n = std::int64_t(cpg) * p.length;
    const std::size_t base = (std::size_t(b) * p.channels + std::size_t(g) * cpg) * p.length;
    const float* x = p.x + base;
    const bool in_regs = n <= std::int64_t(blockDim.x) * kGroupNormRegs;  // every PushT group: 1024 elements

    float v[kGroupNormRegs];
    double s = 0.0;
    if (in_regs) {
#pragma unroll
        for (int r = 0; r < kGroupNormRegs; ++r) {
            const std::int64_t i = threadIdx.x + std::int64_t(r) * blockDim.x;
            v[r] = i < n ? load(x + i) : 0.f;
            s += double(v[r]);
        }
    } else {
        for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += double(load(x + i));
    }
    const double mean = block_sum(s, scratch) / double(n);
    double q = 0.0;
    if (in_regs) {
#pragma unroll
        for (int r = 0; r < kGroupNormRegs; ++r) {
            const std::int64_t i = threadIdx.x + std::int64_t(r) * blockDim.x;
            const double d = double(v[r]) - mean;
            q += i < n ? d * d : 0.0;
        }
    } else {
        for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            const double d = double(load(x + i)) - mean;
            q += d * d;
        }
    }
    const double var = block_sum(q, scratch) / double(n);
    const float mean_f = float(mean);
    const float rstd_f = float(1.0 / sqrt(var + double(p.eps)));

    const int fs = p.film_stride ? p.film_stride : 2 * p.channels;
    auto finish = [&](std::int64_t i, float xi) {
        const int c = g * cpg + int(i / p.length);
        const float scale = p.gamma ? p.gamma[c] * rstd_f : rstd_f;  // same float evaluation order as Ops<Cpu>
        float a = (xi - mean_f) * scale + (p.beta ? p.beta[c] : 0.f);
        a = apply_act(p.act, a);
        if (p.film) {
            const float* f = p.film + std::size_t(b) * fs;
            a = f[c] * a + f[p.channels + c];
        }
        if (p.residual) a += p.residual[base + i];
        p.y[base + i] = a;
    };
    if (in_regs) {
#pragma unroll
        for (int r = 0; r < kGroupNormRegs; ++r) {
            const std::int64_t i = threadIdx.x + std::int64_t(r) * blockDim.x;
            if (i < n) finish(i, v[r]);
        }
    } else {
        for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) finish(i, load(x + i));
    }
}

/// Validates GroupNormParams (sizes, divisibility, pointers, FiLM stride); throws flowedge::Error naming `comp`.
void check_group_norm(const GroupNormParams& p, std::string_view comp);

}  // namespace flowedge::cuda::detail
