// Pointwise and data-movement ops: activation, axpby, channel concat, sinusoidal features, embedding
// lookup and MIN_MAX un-normalisation. All are grid-stride loops of 256-thread blocks (at most 8 blocks
// per SM worth of work per launch); precise math as in common.cuh.
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(std::int64_t n) { return detail::blocks_for(n, kThreads, 8LL * detail::sm_count()); }

#define FLOWEDGE_GRID_STRIDE(i, n) \
    for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < (n); i += std::int64_t(gridDim.x) * blockDim.x)

__global__ void activation_kernel(ActivationParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    FLOWEDGE_GRID_STRIDE(i, p.n) p.y[i] = detail::apply_act(p.act, p.x[i]);
}

__global__ void axpby_kernel(AxpbyParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    // fma(b, y, a * x) spelled out: left to contraction, nvcc may fuse either product, and the fused flow solve
    // (flow_solve.cu) must round exactly as this kernel does.
    FLOWEDGE_GRID_STRIDE(i, p.n) {
        const float ax = p.a * p.x[i];
        p.out[i] = p.y ? __fmaf_rn(p.b, p.y[i], ax) : ax;
    }
}

__global__ void concat_kernel(ConcatParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const int c = p.ca + p.cb;
    const std::int64_t n = std::int64_t(p.batch) * c * p.length;
    FLOWEDGE_GRID_STRIDE(i, n) {
        const std::int64_t t = i % p.length;
        const int ch = int((i / p.length) % c);
        const std::int64_t b = i / (std::int64_t(p.length) * c);
        p.y[i] = ch < p.ca ? p.a[(b * p.ca + ch) * p.length + t] : p.b[(b * p.cb + (ch - p.ca)) * p.length + t];
    }
}

__global__ void sinusoid_kernel(SinusoidParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const std::int64_t n = std::int64_t(p.rows) * p.half;
    FLOWEDGE_GRID_STRIDE(idx, n) {
        const int i = int(idx % p.half);
        const std::int64_t r = idx / p.half;
        const float step = p.log_base / p.denom;  // same float evaluation order as Ops<Cpu>
        // exp/sin/cos in double, rounded once to float: the correctly rounded float result, as glibc's expf/sinf/
        // cosf give on the CPU (CUDA's expf/sinf are 2-ulp and a 2-ulp frequency error grows with t: 6e-6 at t=99).
        const float f = float(exp(double(float(i) * -step)));
        const float arg = (p.t + float(r) * p.t_step) * f;
        p.out[r * 2 * p.half + i] = float(sin(double(arg)));
        p.out[r * 2 * p.half + p.half + i] = float(cos(double(arg)));
    }
}

template <class T>
__global__ void embedding_kernel(EmbeddingParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const std::int64_t n = std::int64_t(p.rows) * p.dim;
    const T* table = static_cast<const T*>(p.table.data);
    FLOWEDGE_GRID_STRIDE(i, n) {
        const std::int64_t r = i / p.dim;
        const int d = int(i % p.dim);
        p.y[i] = detail::load_w<T>(table, std::size_t(p.ids[r]) * p.dim + d);
    }
}

__global__ void unnormalize_kernel(UnnormalizeParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const std::int64_t n = std::int64_t(p.rows) * p.dim;
    FLOWEDGE_GRID_STRIDE(i, n) {
        const int d = int(i % p.dim);
        const float lo = p.min[d], hi = p.max[d];
        p.y[i] = (p.x[i] + 1.f) / 2.f * (hi - lo) + lo;
    }
}

#undef FLOWEDGE_GRID_STRIDE

}  // namespace

void activation(const ActivationParams& p, Stream s) {
    if (!(p.n >= 0)) [[unlikely]]
        fail("cuda activation", "negative element count" + expected_got(">= 0", p.n));
    if (p.n == 0) return;
    check(p.x && p.y, "cuda activation", "null x or y pointer");
    detail::launch_pdl(activation_kernel, dim3(grid_for(p.n)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("activation_kernel");
}

void axpby(const AxpbyParams& p, Stream s) {
    if (!(p.n >= 0)) [[unlikely]]
        fail("cuda axpby", "negative element count" + expected_got(">= 0", p.n));
    if (p.n == 0) return;
    check(p.x && p.out, "cuda axpby", "null x or out pointer");
    check(p.y || p.b == 0.f, "cuda axpby", "y is null but b is not zero");
    detail::launch_pdl(axpby_kernel, dim3(grid_for(p.n)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("axpby_kernel");
}

void concat_channels(const ConcatParams& p, Stream s) {
    check(p.batch > 0 && p.ca >= 0 && p.cb >= 0 && p.length > 0, "cuda concat_channels", "sizes must be positive");
    check(p.y && (p.a || p.ca == 0) && (p.b || p.cb == 0), "cuda concat_channels", "null input or output pointer");
    const std::int64_t n = std::int64_t(p.batch) * (p.ca + p.cb) * p.length;
    if (n == 0) return;
    detail::launch_pdl(concat_kernel, dim3(grid_for(n)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("concat_kernel");
}

void sinusoid(const SinusoidParams& p, Stream s) {
    if (!(p.rows >= 0 && p.half > 0)) [[unlikely]]
        fail("cuda sinusoid", "sizes must be positive" + expected_got("half > 0", p.half));
    check(p.out != nullptr, "cuda sinusoid", "null output pointer");
    const std::int64_t n = std::int64_t(p.rows) * p.half;
    if (n == 0) return;
    detail::launch_pdl(sinusoid_kernel, dim3(grid_for(n)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("sinusoid_kernel");
}

void embedding(const EmbeddingParams& p, Stream s) {
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail("cuda embedding", "sizes must be positive" + expected_got("dim > 0", p.dim));
    if (p.rows == 0) return;
    check(p.ids && p.table.data && p.y, "cuda embedding", "null ids, table or y pointer");
    const std::int64_t n = std::int64_t(p.rows) * p.dim;
    const cudaStream_t st = detail::resolve(s);
    detail::dispatch_dtype(p.table.dtype, [&]<class T>() { detail::launch_pdl(embedding_kernel<T>, dim3(grid_for(n)), dim3(kThreads), 0, st, p); });
    FLOWEDGE_CUDA_CHECK_LAUNCH("embedding_kernel");
}

void unnormalize(const UnnormalizeParams& p, Stream s) {
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail("cuda unnormalize", "sizes must be positive" + expected_got("dim > 0", p.dim));
    if (p.rows == 0) return;
    check(p.x && p.y && p.min && p.max, "cuda unnormalize", "null x, y, min or max pointer");
    const std::int64_t n = std::int64_t(p.rows) * p.dim;
    detail::launch_pdl(unnormalize_kernel, dim3(grid_for(n)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("unnormalize_kernel");
}

}  // namespace flowedge::cuda
