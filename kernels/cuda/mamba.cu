// Mamba-1 mixer kernels: the causal depthwise conv + SiLU with a rolling history, and the selective scan.
//
// causal_conv: one thread per channel (128-thread blocks), walking the new tokens in order; the
//   channel's K-1 history rows are updated in place afterwards (ascending, so nothing is read after it
//   is overwritten). Accumulation: bias, then taps in k order, float.
// selective_scan: one warp per channel (4 warps per block); lane l keeps the states n = l + 32 j
//   (d_state <= 128) in registers across the whole sequence; each token does the state update per lane
//   and a butterfly reduction for y = C.s, then lane 0 applies the D skip and the SiLU(z) gate.
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

template <class T>
__global__ void causal_conv_kernel(CausalConvParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= p.channels) return;
    const int C = p.channels, K = p.kernel, H = p.kernel - 1;
    const int ldx = p.ld_x ? p.ld_x : C;
    const T* w = static_cast<const T*>(p.w.data);
    auto xx = [&](int j) -> float {  // [state ; x] row j, channel c
        return j < H ? p.state[std::size_t(j) * C + c] : p.x[std::size_t(j - H) * ldx + c];
    };
    const float bias = p.bias ? p.bias[c] : 0.f;
    for (int t = 0; t < p.length; ++t) {
        float acc = bias;
        for (int k = 0; k < K; ++k) acc += detail::load_w<T>(w, std::size_t(c) * K + k) * xx(t + k);
        p.u[std::size_t(t) * C + c] = detail::silu(acc);
    }
    for (int j = 0; j < H; ++j) p.state[std::size_t(j) * C + c] = xx(p.length + j);
}

template <int NJ>
__global__ void __launch_bounds__(128) selective_scan_kernel(SelectiveScanParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const int lane = threadIdx.x & 31;
    const int c = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (c >= p.channels) return;  // whole warp leaves together
    const int C = p.channels, N = p.d_state;
    const int ld_bc = p.ld_bc ? p.ld_bc : N;
    const int ld_z = p.ld_z ? p.ld_z : C;
    float s[NJ], a[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int n = lane + 32 * j;
        s[j] = n < N ? p.state[std::size_t(c) * N + n] : 0.f;
        a[j] = n < N ? p.A[std::size_t(c) * N + n] : 0.f;
    }
    const float d = p.D ? p.D[c] : 0.f;
    for (int t = 0; t < p.length; ++t) {
        const float dt_in = p.dt[std::size_t(t) * C + c];
        const float dtv = p.dt_softplus ? detail::softplus(dt_in) : dt_in;
        const float uv = p.u[std::size_t(t) * C + c];
        const float* Bt = p.B + std::size_t(t) * ld_bc;
        const float* Ct = p.C + std::size_t(t) * ld_bc;
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int n = lane + 32 * j;
            if (n < N) {
                s[j] = expf(dtv * a[j]) * s[j] + dtv * Bt[n] * uv;
                part += s[j] * Ct[n];
            }
        }
        const float sum = detail::warp_sum(part);
        if (lane == 0) {
            float yv = sum + d * uv;
            if (p.z) yv *= detail::silu(p.z[std::size_t(t) * ld_z + c]);
            p.y[std::size_t(t) * C + c] = yv;
        }
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int n = lane + 32 * j;
        if (n < N) p.state[std::size_t(c) * N + n] = s[j];
    }
}

}  // namespace

void causal_conv(const CausalConvParams& p, Stream s) {
    constexpr std::string_view comp = "cuda causal_conv";
    check(p.length >= 0 && p.channels > 0 && p.kernel >= 1, comp, "sizes must be positive");
    if (!(p.ld_x == 0 || p.ld_x >= p.channels)) [[unlikely]]
        fail(comp, "x row stride smaller than channels" + expected_got(p.channels, p.ld_x));
    if (p.length == 0) return;
    check(p.x && p.w.data && p.u && (p.state || p.kernel == 1), comp, "null x, w, u or state pointer");
    const cudaStream_t st = detail::resolve(s);
    const unsigned grid = unsigned((p.channels + 127) / 128);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() { detail::launch_pdl(causal_conv_kernel<T>, dim3(grid), dim3(128), 0, st, p); });
    FLOWEDGE_CUDA_CHECK_LAUNCH("causal_conv_kernel");
}

void selective_scan(const SelectiveScanParams& p, Stream s) {
    constexpr std::string_view comp = "cuda selective_scan";
    check(p.length >= 0 && p.channels > 0 && p.d_state > 0, comp, "sizes must be positive");
    if (!(p.d_state <= 128)) [[unlikely]]
        fail(comp, "d_state too large for the CUDA scan" + expected_got("<= 128", p.d_state));
    if (!(p.ld_bc == 0 || p.ld_bc >= p.d_state)) [[unlikely]]
        fail(comp, "B/C row stride smaller than d_state" + expected_got(p.d_state, p.ld_bc));
    if (p.length == 0) return;
    check(p.u && p.dt && p.A && p.B && p.C && p.state && p.y, comp, "null u, dt, A, B, C, state or y pointer");
    const cudaStream_t st = detail::resolve(s);
    const unsigned grid = unsigned((p.channels + 3) / 4);
    if (p.d_state <= 32) detail::launch_pdl(selective_scan_kernel<1>, dim3(grid), dim3(128), 0, st, p);
    else if (p.d_state <= 64) detail::launch_pdl(selective_scan_kernel<2>, dim3(grid), dim3(128), 0, st, p);
    else detail::launch_pdl(selective_scan_kernel<4>, dim3(grid), dim3(128), 0, st, p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("selective_scan_kernel");
}

}  // namespace flowedge::cuda
