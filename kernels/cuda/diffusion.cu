// One DDIM/DDPM scheduler update over the whole sample, with the seeded DDPM noise generated on the
// device by global draw index so the sequence is identical to the CPU's (docs/models.md#seeded-noise).
//
// Noise: for batch element b the SplitMix64 stream is seeded with s = seed + b (seed read from seed_ptr
// when set, so a captured graph can be replayed with a new seed; seed_ptr[b] itself with seed_per_row); raw output n is
// mix(s + (n + 1) * 0x9e3779b97f4a7c15); uniform = ((u >> 40) + 1) / 16777217 in double; normal j uses raw
// outputs 2*(j/2) and 2*(j/2)+1: r = sqrt(-2 ln u1), th = 2 pi u2, r*cos(th) for even j, r*sin(th) for odd
// j, all in double, rounded once to float. Global draw index of element i is draw_offset + i.
// Update arithmetic is float with explicit round-to-nearest intrinsics (no FMA contraction), evaluated
// exactly in the order written in op_params.hpp. Launch: grid-stride, 256 threads per block.
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

__device__ __forceinline__ std::uint64_t splitmix_mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ double splitmix_uniform(std::uint64_t seed, std::uint64_t n) {
    const std::uint64_t u = splitmix_mix(seed + (n + 1) * 0x9e3779b97f4a7c15ULL);
    return double((u >> 40) + 1) / 16777217.0;
}

/// Standard normal number j of the stream seeded with `seed`.
__device__ __forceinline__ float seeded_normal(std::uint64_t seed, std::uint64_t j) {
    const std::uint64_t pair = j / 2;
    const double u1 = splitmix_uniform(seed, 2 * pair);
    const double u2 = splitmix_uniform(seed, 2 * pair + 1);
    const double r = sqrt(-2.0 * log(u1));
    const double th = 6.283185307179586 * u2;
    return float((j & 1) ? r * sin(th) : r * cos(th));
}

__global__ void diffusion_step_kernel(DiffusionStepParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const std::int64_t n = std::int64_t(p.batch) * p.per_sample;
    const std::uint64_t seed = p.seed_ptr && !p.seed_per_row ? *p.seed_ptr : p.seed;
    for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < n;
         idx += std::int64_t(gridDim.x) * blockDim.x) {
        const float x = p.x[idx];
        const float e = p.eps[idx];
        float x0 = __fdiv_rn(__fsub_rn(x, __fmul_rn(p.sqrt_one_minus_abar, e)), p.sqrt_abar);
        if (p.clip) x0 = fminf(fmaxf(x0, -p.clip_range), p.clip_range);
        float out;
        if (p.kind == StepKind::Ddim) {
            out = __fadd_rn(__fmul_rn(p.c_x0, x0), __fmul_rn(p.c_other, e));
        } else {
            out = __fadd_rn(__fmul_rn(p.c_x0, x0), __fmul_rn(p.c_other, x));
            if (p.noise_std != 0.f) {
                const std::int64_t b = idx / p.per_sample;
                const std::int64_t i = idx - b * p.per_sample;
                const std::int64_t L = p.channel_major_length;  // > 0: [A, L] per sample; draw by the [L, A] index
                const std::int64_t j = L > 0 ? (i % L) * (p.per_sample / L) + i / L : i;
                const std::uint64_t row_seed = p.seed_ptr && p.seed_per_row ? p.seed_ptr[b] : seed + std::uint64_t(b);
                const float z = seeded_normal(row_seed, p.draw_offset + std::uint64_t(j));
                out = __fadd_rn(out, __fmul_rn(p.noise_std, z));
            }
        }
        p.x[idx] = out;
    }
}

}  // namespace

void diffusion_step(const DiffusionStepParams& p, Stream s) {
    constexpr std::string_view comp = "cuda diffusion_step";
    check(p.batch > 0 && p.per_sample >= 0, comp, "sizes must be positive");
    check(p.kind == StepKind::Ddim || p.kind == StepKind::Ddpm, comp, "unknown scheduler kind");
    const std::int64_t n = std::int64_t(p.batch) * p.per_sample;
    if (n == 0) return;
    check(p.x && p.eps, comp, "null x or eps pointer");
    check(p.sqrt_abar != 0.f, comp, "sqrt_abar must be non-zero");
    detail::launch_pdl(diffusion_step_kernel, dim3(detail::blocks_for(n, 256, 8LL * detail::sm_count())), dim3(256), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("diffusion_step_kernel");
}

}  // namespace flowedge::cuda
