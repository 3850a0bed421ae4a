// GroupNorm (with the fused act -> FiLM -> residual epilogue of the U-Net residual block) and Mamba's RMSNorm.
//
// group_norm: one block of 256 threads per (batch, group) running detail::group_norm_group (group_norm_block.cuh:
//   the group read once into registers, mean and biased variance in double with a fixed-order block reduction,
//   one pass for gamma/beta, activation, FiLM and residual; y may alias x). conv.cu's fused conv1d + GroupNorm
//   runs the same function, so fused and unfused results are bit-identical.
// rms_norm: one block of 256 threads per row; sum of squares in double, y = x * rsqrt(mean + eps) * w.
#include "common.cuh"
#include "group_norm_block.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = detail::kGroupNormThreads;

__global__ void __launch_bounds__(kThreads) group_norm_kernel(GroupNormParams p) {
    __shared__ double scratch[32];
    detail::pdl_wait();  // launched with launch_pdl: x is the previous kernel's output
    detail::pdl_allow_next();
    detail::group_norm_group(p, blockIdx.x / p.groups, blockIdx.x % p.groups, scratch,
                             [](const float* ptr) { return *ptr; });
}

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    __shared__ double scratch[32];
    const float* x = p.x + std::size_t(blockIdx.x) * p.dim;
    float* y = p.y + std::size_t(blockIdx.x) * p.dim;
    double s = 0.0;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) s += double(x[i]) * double(x[i]);
    const double ms = detail::block_sum(s, scratch) / double(p.dim);
    const float scale = float(1.0 / sqrt(ms + double(p.eps)));
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) y[i] = x[i] * scale * (p.weight ? p.weight[i] : 1.f);
}

}  // namespace

namespace detail {
void check_group_norm(const GroupNormParams& p, std::string_view comp) {
    check(p.batch > 0 && p.channels > 0 && p.length > 0 && p.groups > 0, comp, "sizes must be positive");
    check(p.channels % p.groups == 0, comp,
          "channels must be divisible by groups" + expected_got("a multiple of " + std::to_string(p.groups), p.channels));
    check(p.x && p.y, comp, "null x or y pointer");
    check(p.film_stride == 0 || p.film_stride >= 2 * p.channels, comp,
          "FiLM row stride too small" + expected_got(">= " + std::to_string(2 * p.channels), p.film_stride));
    check((long long)p.batch * p.groups <= 0x7fffffffLL, comp, "too many (batch, group) pairs");
}
}  // namespace detail

void group_norm(const GroupNormParams& p, Stream s) {
    detail::check_group_norm(p, "cuda group_norm");
    const long long n_blocks = (long long)p.batch * p.groups;
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
