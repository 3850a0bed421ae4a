// A batch-1 flow-matching solve (FlowHead: Euler / Heun / RK4 over the velocity MLP) as one thread-block cluster,
// instead of ~6 dependent kernel launches per velocity evaluation (axpby, in_proj, each hidden layer, out_proj, axpby).
//
// Launch geometry: one cluster of kCluster = 8 blocks x 256 threads (8 warps) on sm_90. Block `rank` owns the rows
// [rank * R, rank * R + R) of in_proj and of every hidden layer (R = H / 8); they are copied to its shared memory once
// (cp.async, before the programmatic-dependent-launch wait: weights never depend on an earlier kernel), with the
// whole out_proj, its rows of c and of the time table. A velocity evaluation: each block computes its R outputs of a
// layer (one warp per output) and stores them into every block's copy of the layer's output (distributed shared
// memory), then the cluster barrier; out_proj's A outputs and the solver's combinations are computed by every block
// on its own copy (the same operations in the same order, so every block holds the same state). Layer outputs rotate
// through three buffers: the output of layer g is written only after the barrier that ends layer g - 1, when every
// block has finished reading layer g - 2's buffer.
//
// Numerics: each output is the single linear op's per-output routine (linear.cu: per-lane float sums in index
// order, 16-byte vector or scalar steps as that op would choose for the same pointers, butterfly warp sum, lane 0's
// value + bias, activation), the in_proj bias is tproj + c as axpby forms it, and the combinations are axpby's
// `a * x + b * y`: the solve equals FlowHead's per-op solve bit for bit (test/mamba_flow: fused vs per-op).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "cluster_splitk.cuh"
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kCluster = 8;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxAction = 64;  // the state and the solver's k buffers live in shared memory

__host__ __device__ constexpr int pad4(int n) { return (n + 3) & ~3; }

/// Offsets (floats) of the shared-memory regions; every region starts 16-byte aligned.
struct FlowSmem {
    int w_in = 0, w_layers = 0, w_out = 0, c = 0, tproj = 0, h = 0, state = 0, total = 0;
    __host__ __device__ static FlowSmem of(const FlowSolveParams& p) {
        const int H = p.hidden, A = p.action_dim, R = H / kCluster, J = 2 * p.steps + 1;
        FlowSmem s;
        s.w_in = 0;
        s.w_layers = s.w_in + pad4(R * A);
        s.w_out = s.w_layers + pad4(p.n_layers * R * H);
        s.c = s.w_out + pad4(A * H);
        s.tproj = s.c + pad4(R);
        s.h = s.tproj + pad4(J * R);
        s.state = s.h + 3 * pad4(H);
        s.total = s.state + 6 * pad4(A);  // x, xt, k0..k3
        return s;
    }
};

/// One output of the single linear op (linear.cu, linear_outputs at rows = 1): per-lane sums in index order, then the
/// butterfly warp sum; lane 0's value is the op's.
__device__ __forceinline__ float warp_dot(const float* w, const float* x, int n, bool vec, int lane) {
    float acc = 0.f;
    if (vec) {
        for (int i = lane * 4; i < n; i += 32 * 4) {
            const float4 wv = *reinterpret_cast<const float4*>(w + i);
            const float4 xv = *reinterpret_cast<const float4*>(x + i);
            acc += wv.x * xv.x;
            acc += wv.y * xv.y;
            acc += wv.z * xv.z;
            acc += wv.w * xv.w;
        }
    } else {
        for (int i = lane; i < n; i += 32) acc += w[i] * x[i];
    }
    return detail::warp_sum(acc);
}

/// axpby's element: a * x + b * y (elementwise.cu).
__device__ __forceinline__ float axpby(float x, float y, float a, float b) {
    const float ax = a * x;
    return ax + b * y;
}

__global__ void __launch_bounds__(kThreads) flow_solve_kernel(const __grid_constant__ FlowSolveParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    const cg::cluster_group cl = cg::this_cluster();
    extern __shared__ __align__(16) float sm[];
    const FlowSmem L = FlowSmem::of(p);
    const int H = p.hidden, A = p.action_dim, R = H / kCluster, J = 2 * p.steps + 1;
    const int rank = int(cl.block_rank()), tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    const int row0 = rank * R;
    float* const w_in = sm + L.w_in;
    float* const w_layers = sm + L.w_layers;
    float* const w_out = sm + L.w_out;
    float* const c_s = sm + L.c;
    float* const t_s = sm + L.tproj;  // [J][R]
    float* const hbuf = sm + L.h;     // [3][pad4(H)]
    float* const st = sm + L.state;   // x, xt, k0..k3, each pad4(A)
    const int ldh = pad4(H), lda = pad4(A);
    float* const xs = st;
    float* const xt = st + lda;
    float* const ks = st + 2 * lda;

    // Weights (constants) before the PDL wait.
    for (int e = tid; e < R * A; e += kThreads) detail::cp_async4(w_in + e, p.in_proj + std::size_t(row0) * A + e, 4);
    for (int l = 0; l < p.n_layers; ++l)
        for (int e = tid; e < R * H; e += kThreads)
            detail::cp_async4(w_layers + std::size_t(l) * R * H + e, p.layers[l] + std::size_t(row0) * H + e, 4);
    for (int e = tid; e < A * H; e += kThreads) detail::cp_async4(w_out + e, p.out_proj + e, 4);
    detail::cp_async_commit();
    detail::pdl_wait();  // x, c (and the time table) come from earlier kernels
    for (int e = tid; e < R; e += kThreads) detail::cp_async4(c_s + e, p.c + row0 + e, 4);
    for (int e = tid; e < J * R; e += kThreads) {
        const int j = e / R, r = e - j * R;
        detail::cp_async4(t_s + e, p.tproj + std::size_t(j) * H + row0 + r, 4);
    }
    for (int e = tid; e < A; e += kThreads) detail::cp_async4(xs + e, p.x + e, 4);
    detail::cp_async_commit();
    detail::cp_async_wait<0>();
    cl.sync();  // every block of the cluster runs (and its copies landed) before any remote store

    int g = 0;  // layer outputs produced so far; output g lives in hbuf[g % 3]
    auto hb = [&](int k) { return hbuf + (k % 3) * ldh; };
    // This block's rows of one layer: out[o] = act(w_row(o) . in + bias(o)), stored into every block's buffer.
    auto layer_rows = [&](const float* w, int n_in, const float* in, bool vec, int j) {
        float* out = hb(g);
        for (int r = warp; r < R; r += kWarps) {
            const float s = warp_dot(w + std::size_t(r) * n_in, in, n_in, vec, lane);
            if (lane == 0) {
                // in_proj (j >= 0): bias tproj[j] + c (axpby, a = b = 1); hidden layers: no bias (the op adds 0.f).
                const float bias = j >= 0 ? axpby(t_s[j * R + r], c_s[r], 1.f, 1.f) : 0.f;
                const float v = detail::silu(s + bias);
                for (int q = 0; q < kCluster; ++q) cl.map_shared_rank(out, q)[row0 + r] = v;
            }
        }
        cl.sync();
        ++g;
    };
    // v = velocity(x_in, half step j) into v_out (this block's copy).
    auto velocity = [&](const float* x_in, int j, float* v_out) {
        layer_rows(w_in, A, x_in, p.vec_mask & 1u, j);
        for (int l = 0; l < p.n_layers; ++l)
            layer_rows(w_layers + std::size_t(l) * R * H, H, hb(g - 1), (p.vec_mask >> (1 + l)) & 1u, -1);
        const float* h = hb(g - 1);
        const bool vec_out = (p.vec_mask >> (1 + p.n_layers)) & 1u;
        for (int o = warp; o < A; o += kWarps) {
            const float s = warp_dot(w_out + std::size_t(o) * H, h, H, vec_out, lane);
            if (lane == 0) v_out[o] = s + 0.f;
        }
        __syncthreads();
    };
    // x_dst[i] = a * x_src[i] + b * y[i] over the state (every block, its own copy).
    auto combine = [&](float* dst, const float* xv, const float* yv, float a, float b) {
        if (tid < A) dst[tid] = axpby(xv[tid], yv[tid], a, b);
        __syncthreads();
    };

    for (int k = p.first; k < p.first + p.count; ++k) {
        float* const k0 = ks;
        float* const k1 = ks + lda;
        float* const k2 = ks + 2 * lda;
        float* const k3 = ks + 3 * lda;
        switch (p.solver) {
            case 0:  // Euler
                velocity(xs, 2 * k, k0);
                combine(xs, xs, k0, 1.f, p.dt);
                break;
            case 1:  // Heun
                velocity(xs, 2 * k, k0);
                combine(xt, xs, k0, 1.f, p.dt);
                velocity(xt, 2 * k + 2, k1);
                combine(k0, k0, k1, 1.f, 1.f);
                combine(xs, xs, k0, 1.f, p.half_dt);
                break;
            default:  // RK4
                velocity(xs, 2 * k, k0);
                combine(xt, xs, k0, 1.f, p.half_dt);
                velocity(xt, 2 * k + 1, k1);
                combine(xt, xs, k1, 1.f, p.half_dt);
                velocity(xt, 2 * k + 1, k2);
                combine(xt, xs, k2, 1.f, p.dt);
                velocity(xt, 2 * k + 2, k3);
                combine(k0, k0, k1, 1.f, 2.f);
                combine(k0, k0, k2, 1.f, 2.f);
                combine(k0, k0, k3, 1.f, 1.f);
                combine(xs, xs, k0, 1.f, p.sixth_dt);
                break;
        }
    }
    if (rank == 0 && tid < A) p.x[tid] = xs[tid];
#else
    __trap();  // clusters need sm_90; the host launches this kernel only there
#endif
}

}  // namespace

bool flow_solve(const FlowSolveParams& p, Stream s) {
    if (detail::compute_major() < 9) return false;
    if (!(p.hidden > 0 && p.hidden % kCluster == 0 && p.action_dim > 0 && p.action_dim <= kMaxAction &&
          p.n_layers >= 0 && p.n_layers <= kFlowSolveMaxLayers && p.steps >= 1 && p.first >= 0 && p.count >= 1 &&
          p.first + p.count <= p.steps && p.solver >= 0 && p.solver <= 2))
        return false;
    check(p.x && p.c && p.tproj && p.in_proj && p.out_proj, "cuda flow_solve", "null state, condition, time table or weight pointer");
    for (int l = 0; l < p.n_layers; ++l) check(p.layers[l] != nullptr, "cuda flow_solve", "null hidden-layer weight pointer");
    const std::size_t bytes = sizeof(float) * std::size_t(FlowSmem::of(p).total);
    if (bytes > std::size_t(detail::smem_per_block_optin())) return false;
    if (bytes > 48 * 1024)  // above the default a kernel opts in (a plain attribute, legal while a graph captures)
        FLOWEDGE_CUDA_CHECK(cudaFuncSetAttribute(flow_solve_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    detail::launch_pdl_cluster(flow_solve_kernel, dim3(1, 1, kCluster), dim3(kThreads), bytes, detail::resolve(s),
                               unsigned(kCluster), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("flow_solve_kernel");
    return true;
}

}  // namespace flowedge::cuda
