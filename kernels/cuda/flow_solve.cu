// A batch-1 flow-matching solve (FlowHead: Euler / Heun / RK4 over the velocity MLP) as one thread-block cluster,
// instead of ~6 dependent kernel launches per velocity evaluation (axpby, in_proj, each hidden layer, out_proj, axpby);
// and the whole Mamba-flow action (state reset, prefill, condition, solve: ~97 launches per-op) as one cluster launch.
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
// `a * x + b * y`: the solve equals FlowHead's per-op solve bit for bit (test/cuda/test_cuda_models.cpp: fused vs
// per-op). The action kernel adds the backbone the same way (RMSNorm as rms_norm_kernel's block, the causal conv and
// the scan as mamba.cu computes them, each projection as the linear op) before the same solve.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <string>

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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // thread-block clusters: the device code of sm_90 only
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

namespace cg = cooperative_groups;

/// One block's part of a fused flow solve: its shared-memory regions (FlowSmem at `sm`) and the cluster it shares
/// layer outputs with. copy_weights() issues the weight copies (not committed); copy_inputs() those of c (unless the
/// caller computes it), the time table and x; run() does steps [first, first + count) on the state in xs.
struct FlowBlock {
    const FlowSolveParams& p;
    cg::cluster_group cl;
    float *w_in, *w_layers, *w_out, *c_s, *t_s, *hbuf, *xs, *xt, *ks;
    int H, A, R, rank, row0, ldh, lda, tid, warp, lane;
    int g = 0;  // layer outputs produced so far; output g lives in hbuf[g % 3]

    __device__ FlowBlock(const FlowSolveParams& prm, float* sm) : p(prm), cl(cg::this_cluster()) {
        const FlowSmem L = FlowSmem::of(p);
        H = p.hidden, A = p.action_dim, R = H / kCluster;
        rank = int(cl.block_rank()), row0 = rank * R;
        tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
        ldh = pad4(H), lda = pad4(A);
        w_in = sm + L.w_in, w_layers = sm + L.w_layers, w_out = sm + L.w_out, c_s = sm + L.c, t_s = sm + L.tproj;
        hbuf = sm + L.h, xs = sm + L.state, xt = xs + lda, ks = xs + 2 * lda;
    }

    __device__ void copy_weights() const {
        for (int e = tid; e < R * A; e += kThreads) detail::cp_async4(w_in + e, p.in_proj + std::size_t(row0) * A + e, 4);
        for (int l = 0; l < p.n_layers; ++l)
            for (int e = tid; e < R * H; e += kThreads)
                detail::cp_async4(w_layers + std::size_t(l) * R * H + e, p.layers[l] + std::size_t(row0) * H + e, 4);
        for (int e = tid; e < A * H; e += kThreads) detail::cp_async4(w_out + e, p.out_proj + e, 4);
    }
    /// After the PDL wait: the time table's rows of this block, and (with_c_x) c's rows and x from global memory.
    __device__ void copy_inputs(bool with_c_x) const {
        const int J = 2 * p.steps + 1;
        for (int e = tid; e < J * R; e += kThreads) {
            const int j = e / R, r = e - j * R;
            detail::cp_async4(t_s + e, p.tproj + std::size_t(j) * H + row0 + r, 4);
        }
        if (!with_c_x) return;
        for (int e = tid; e < R; e += kThreads) detail::cp_async4(c_s + e, p.c + row0 + e, 4);
        for (int e = tid; e < A; e += kThreads) detail::cp_async4(xs + e, p.x + e, 4);
    }

    __device__ float* hb(int k) const { return hbuf + (k % 3) * ldh; }

    /// This block's rows of one layer: out[o] = silu(w_row(o) . in + bias(o)), stored into every block's buffer.
    __device__ void layer_rows(const float* w, int n_in, const float* in, bool vec, int j) {
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
    }
    /// v_out = velocity(x_in, half step j) (this block's copy).
    __device__ void velocity(const float* x_in, int j, float* v_out) {
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
    }
    /// dst[i] = a * xv[i] + b * yv[i] over the state (this block's copy).
    __device__ void combine(float* dst, const float* xv, const float* yv, float a, float b) const {
        if (tid < A) dst[tid] = axpby(xv[tid], yv[tid], a, b);
        __syncthreads();
    }

    __device__ void run() {
        float* const k0 = ks;
        float* const k1 = ks + lda;
        float* const k2 = ks + 2 * lda;
        float* const k3 = ks + 3 * lda;
        for (int k = p.first; k < p.first + p.count; ++k) {
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
    }
};

#endif

__global__ void __launch_bounds__(kThreads) flow_solve_kernel(const __grid_constant__ FlowSolveParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) float sm[];
    FlowBlock f(p, sm);
    f.copy_weights();  // constants: before the PDL wait
    detail::cp_async_commit();
    detail::pdl_wait();  // x, c (and the time table) come from earlier kernels
    f.copy_inputs(true);
    detail::cp_async_commit();
    detail::cp_async_wait<0>();
    f.cl.sync();  // every block of the cluster runs (and its copies landed) before any remote store
    f.run();
    if (f.rank == 0 && f.tid < f.A) p.x[f.tid] = f.xs[f.tid];
#else
    __trap();  // clusters need sm_90; the host launches this kernel only there
#endif
}

/// Offsets (floats, after the flow regions) of the backbone's shared-memory regions of the fused action.
struct MambaSmem {
    int h = 0, n = 0, u = 0, dbl = 0, y = 0, xo = 0, zo = 0, hid = 0, total = 0;
    int ld_d = 0, ld_i = 0, ld_b = 0, cb = 0;
    __host__ __device__ static MambaSmem of(const MambaFlowActParams& p, int base) {
        MambaSmem m;
        const int L = p.n_tokens;
        m.ld_d = pad4(p.d_model), m.ld_i = pad4(p.d_inner), m.ld_b = pad4(p.dt_rank + 2 * p.d_state);
        m.cb = p.d_inner / kCluster;
        m.h = base;                      // [L][ld_d] residual stream (every block's copy)
        m.n = m.h + L * m.ld_d;          // [L][ld_d] RMSNorm output
        m.u = m.n + L * m.ld_d;          // [L][ld_i] conv + SiLU output (all channels)
        m.dbl = m.u + L * m.ld_i;        // [L][ld_b] x_proj output: dt_low | B | C
        m.y = m.dbl + L * m.ld_b;        // [L][ld_i] scan output (all channels)
        m.xo = m.y + L * m.ld_i;         // [L][cb] in_proj x part, this block's channels
        m.zo = m.xo + pad4(L * m.cb);    // [L][cb] in_proj z part, this block's channels
        m.hid = m.zo + pad4(L * m.cb);   // [ld_d] the final norm of the last row
        m.total = m.hid + m.ld_d;
        return m;
    }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// One row of rms_norm_kernel (norm.cu; 256 threads): y = x * float(1 / sqrt(mean(x^2) + eps)) * w, the sum of squares
/// in double in the block's fixed order.
__device__ __forceinline__ void rms_row(const float* x, const float* w, float* y, int d, float eps, double* scratch) {
    double s = 0.0;
    for (int i = int(threadIdx.x); i < d; i += kThreads) s += double(x[i]) * double(x[i]);
    const double ms = detail::block_sum(s, scratch) / double(d);
    const float scale = float(1.0 / sqrt(ms + double(eps)));
    for (int i = int(threadIdx.x); i < d; i += kThreads) y[i] = x[i] * scale * w[i];
}

#endif

/// The whole action (MambaFlowActParams). Work split over the cluster: block `rank` owns the mixer channels
/// [rank * di/8, (rank + 1) * di/8) (in_proj's x and z rows, the conv, dt_proj and the scan of those channels, and
/// their state), x_proj outputs rank, rank + 8, ..., out_proj outputs [rank * D/8, (rank + 1) * D/8) and the flow rows
/// of FlowBlock; every output is stored into every block's copy (distributed shared memory), 4 cluster barriers per
/// layer; the norms are computed by every block on its own copy.
__global__ void __launch_bounds__(kThreads) mamba_flow_act_kernel(const __grid_constant__ MambaFlowActParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) float sm[];
    __shared__ double scratch[32];
    FlowBlock f(p.flow, sm);
    const MambaSmem M = MambaSmem::of(p, FlowSmem::of(p.flow).total);
    const int D = p.d_model, di = p.d_inner, S = p.d_state, R = p.dt_rank, K = p.d_conv, Lt = p.n_tokens;
    const int nb = R + 2 * S, cb = M.cb, c0 = f.rank * cb, tid = f.tid, warp = f.warp, lane = f.lane;
    float* const h = sm + M.h;
    float* const n = sm + M.n;
    float* const u = sm + M.u;
    float* const dbl = sm + M.dbl;
    float* const y = sm + M.y;
    float* const xo = sm + M.xo;
    float* const zo = sm + M.zo;
    float* const hid = sm + M.hid;
    auto to_all = [&](float* buf, int i, float v) {
        for (int q = 0; q < kCluster; ++q) f.cl.map_shared_rank(buf, q)[i] = v;
    };

    f.copy_weights();  // the flow weights (constants) before the PDL wait; they land while the backbone runs
    detail::cp_async_commit();
    detail::pdl_wait();  // the time table and the state buffers belong to earlier kernels
    f.copy_inputs(false);
    detail::cp_async_commit();
    for (int e = tid; e < Lt * D; e += kThreads) {  // embedding rows
        const int t = e / D, d = e - t * D;
        h[t * M.ld_d + d] = p.embedding[std::size_t(p.tokens[t]) * D + d];
    }
    if (tid < f.A) f.xs[tid] = p.noise[tid];  // x = noise
    f.cl.sync();  // every block runs before any remote store; the copies above are visible in the block

    for (int l = 0; l < p.n_layers; ++l) {
        const MambaLayerTensors& T = p.layers[l];
        const unsigned vm = p.vec_mask >> (4 * l);
        for (int t = 0; t < Lt; ++t) rms_row(h + t * M.ld_d, T.norm, n + t * M.ld_d, D, p.eps, scratch);
        __syncthreads();
        // in_proj: this block's x rows c0 + q and z rows di + c0 + q (the linear op's per-output routine, no bias).
        for (int q = warp; q < 2 * cb; q += kWarps) {
            const int row = q < cb ? c0 + q : di + c0 + (q - cb);
            for (int t = 0; t < Lt; ++t) {
                const float s = warp_dot(T.in_proj + std::size_t(row) * D, n + t * M.ld_d, D, vm & 1u, lane);
                if (lane == 0) (q < cb ? xo[t * cb + q] : zo[t * cb + q - cb]) = s + 0.f;
            }
        }
        __syncthreads();
        // Causal conv + SiLU (causal_conv_kernel; the history is zero: a prefill starts from a reset), then the
        // channel's conv state rows.
        if (tid < cb) {
            const int c = c0 + tid, hist = K - 1;
            auto xx = [&](int j) { return j < hist ? 0.f : xo[(j - hist) * cb + tid]; };
            const float bias = T.conv_b ? T.conv_b[c] : 0.f;
            for (int t = 0; t < Lt; ++t) {
                float acc = bias;
                for (int k = 0; k < K; ++k) acc += T.conv_w[std::size_t(c) * K + k] * xx(t + k);
                to_all(u, t * M.ld_i + c, detail::silu(acc));
            }
            for (int j = 0; j < hist; ++j) T.conv_state[std::size_t(j) * di + c] = xx(Lt + j);
        }
        f.cl.sync();
        // x_proj: outputs rank + 8 * warp.
        if (const int o = f.rank + kCluster * warp; o < nb)
            for (int t = 0; t < Lt; ++t) {
                const float s = warp_dot(T.x_proj + std::size_t(o) * di, u + t * M.ld_i, di, (vm >> 1) & 1u, lane);
                if (lane == 0) to_all(dbl, t * M.ld_b + o, s + 0.f);
            }
        f.cl.sync();
        // dt = softplus(dt_proj @ dt_low + b) and the selective scan (selective_scan_kernel, d_state <= 32: lane n
        // holds state n, zero at a reset), this block's channels, one warp per channel.
        for (int k = warp; k < cb; k += kWarps) {
            const int c = c0 + k;
            float st = 0.f;
            const float a = lane < S ? T.A[std::size_t(c) * S + lane] : 0.f;
            const float dd = T.D ? T.D[c] : 0.f;
            for (int t = 0; t < Lt; ++t) {
                const float sdt = warp_dot(T.dt_proj + std::size_t(c) * R, dbl + t * M.ld_b, R, (vm >> 2) & 1u, lane);
                const float dtv = detail::softplus(__shfl_sync(0xffffffffu, sdt, 0) + T.dt_bias[c]);
                const float uv = u[t * M.ld_i + c];
                const float* Bt = dbl + t * M.ld_b + R;
                const float* Ct = Bt + S;
                float part = 0.f;
                if (lane < S) {
                    st = expf(dtv * a) * st + dtv * Bt[lane] * uv;
                    part += st * Ct[lane];
                }
                const float sum = detail::warp_sum(part);
                if (lane == 0) {
                    float yv = sum + dd * uv;
                    yv *= detail::silu(zo[t * cb + k]);
                    to_all(y, t * M.ld_i + c, yv);
                }
            }
            if (lane < S) T.ssm_state[std::size_t(c) * S + lane] = st;
        }
        f.cl.sync();
        // out_proj + residual: this block's outputs; the last layer only for the last row (prefill_last).
        const int db = D / kCluster, t_from = l == p.n_layers - 1 ? Lt - 1 : 0;
        for (int q = warp; q < db; q += kWarps) {
            const int o = f.rank * db + q;
            for (int t = t_from; t < Lt; ++t) {
                const float s = warp_dot(T.out_proj + std::size_t(o) * di, y + t * M.ld_i, di, (vm >> 3) & 1u, lane);
                if (lane == 0) to_all(h, t * M.ld_d + o, h[t * M.ld_d + o] + (s + 0.f));
            }
        }
        f.cl.sync();
    }
    // Final norm of the last row; c = cond_proj @ it for this block's flow rows.
    rms_row(h + (Lt - 1) * M.ld_d, p.norm_f, hid, D, p.eps, scratch);
    __syncthreads();
    if (f.rank == 0)
        for (int i = tid; i < D; i += kThreads) p.hidden[i] = hid[i];
    for (int r = warp; r < f.R; r += kWarps) {
        const float s = warp_dot(p.cond_proj + std::size_t(f.row0 + r) * D, hid, D, (p.vec_mask >> 16) & 1u, lane);
        if (lane == 0) f.c_s[r] = s + 0.f;
    }
    detail::cp_async_wait<0>();
    __syncthreads();  // flow weights, time table and c visible in the block
    f.run();
    if (f.rank == 0 && tid < f.A) p.flow.x[tid] = f.xs[tid];
#else
    __trap();  // clusters need sm_90; the host launches this kernel only there
#endif
}

}  // namespace

namespace {

/// Whether the fused solve applies to `p` (shapes within the kernel's layout; sm_90 for clusters).
bool flow_solve_applies(const FlowSolveParams& p) {
    return detail::compute_major() >= 9 && p.hidden > 0 && p.hidden % kCluster == 0 && p.action_dim > 0 &&
           p.action_dim <= kMaxAction && p.n_layers >= 0 && p.n_layers <= kFlowSolveMaxLayers && p.steps >= 1 &&
           p.first >= 0 && p.count >= 1 && p.first + p.count <= p.steps && p.solver >= 0 && p.solver <= 2;
}

/// c_in: the solve reads c from p.c (the fused action computes it).
void check_flow_pointers(const FlowSolveParams& p, bool c_in) {
    check(p.x && (p.c || !c_in) && p.tproj && p.in_proj && p.out_proj, "cuda flow_solve",
          "null state, condition, time table or weight pointer");
    for (int l = 0; l < p.n_layers; ++l) check(p.layers[l] != nullptr, "cuda flow_solve", "null hidden-layer weight pointer");
}

/// Opts `kernel` in to `bytes` of dynamic shared memory when above the default (a plain attribute, legal while a
/// graph captures) and launches it as one cluster of kCluster blocks with PDL.
template <class Params>
void launch_cluster(void (*kernel)(Params), std::size_t bytes, const Params& p, Stream s) {
    if (bytes > 48 * 1024)
        FLOWEDGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    detail::launch_pdl_cluster(kernel, dim3(1, 1, kCluster), dim3(kThreads), bytes, detail::resolve(s), unsigned(kCluster), p);
}

}  // namespace

bool flow_solve(const FlowSolveParams& p, Stream s) {
    if (!flow_solve_applies(p)) return false;
    check_flow_pointers(p, true);
    const std::size_t bytes = sizeof(float) * std::size_t(FlowSmem::of(p).total);
    if (bytes > std::size_t(detail::smem_per_block_optin())) return false;
    launch_cluster(flow_solve_kernel, bytes, p, s);
    FLOWEDGE_CUDA_CHECK_LAUNCH("flow_solve_kernel");
    return true;
}

bool mamba_flow_act(const MambaFlowActParams& p, Stream s) {
    const FlowSolveParams& f = p.flow;
    if (!flow_solve_applies(f) || f.first != 0 || f.count != f.steps) return false;
    if (!(p.n_layers >= 1 && p.n_layers <= kMambaActMaxLayers && p.n_tokens >= 1 && p.n_tokens <= kMambaActMaxTokens &&
          p.d_model > 0 && p.d_model % kCluster == 0 && p.d_inner > 0 && p.d_inner % kCluster == 0 && p.d_state >= 1 &&
          p.d_state <= 32 && p.dt_rank >= 1 && p.dt_rank + 2 * p.d_state <= kCluster * kWarps && p.d_conv >= 1 &&
          f.action_dim <= kMambaActMaxAction))
        return false;
    check_flow_pointers(f, false);
    check(p.cond_proj && p.embedding && p.norm_f && p.hidden, "cuda mamba_flow_act", "null cond_proj, embedding, norm_f or hidden pointer");
    for (int l = 0; l < p.n_layers; ++l) {
        const MambaLayerTensors& t = p.layers[l];
        if (!(t.norm && t.in_proj && t.conv_w && t.x_proj && t.dt_proj && t.dt_bias && t.A && t.out_proj && t.conv_state &&
              t.ssm_state)) [[unlikely]]
            fail("cuda mamba_flow_act", "null tensor or state pointer in layer " + std::to_string(l));
    }
    const std::size_t bytes = sizeof(float) * std::size_t(MambaSmem::of(p, FlowSmem::of(f).total).total);
    if (bytes > std::size_t(detail::smem_per_block_optin())) return false;
    launch_cluster(mamba_flow_act_kernel, bytes, p, s);
    FLOWEDGE_CUDA_CHECK_LAUNCH("mamba_flow_act_kernel");
    return true;
}

}  // namespace flowedge::cuda
