// A batch-1 flow-matching solve (FlowHead: Euler / Heun / RK4 over the velocity MLP) as one thread-block cluster,
// instead of ~6 dependent kernel launches per velocity evaluation (axpby, in_proj, each hidden layer, out_proj, axpby);
// and the whole Mamba-flow action (state reset, prefill, condition, solve: ~97 launches per-op) as one cluster launch.
//
// Launch geometry: one cluster of kCluster = 8 blocks of Threads = 256, 512 or 1024 threads on sm_90 (the block size
// changes which warp computes an output, never how: FLOWEDGE_CUDA_FLOW_THREADS picks it). Block `rank` owns the rows
// [rank * R, rank * R + R) of every hidden layer (R = H / 8); they are copied to its shared memory once (cp.async,
// before the programmatic-dependent-launch wait: weights never depend on an earlier kernel), with the whole in_proj
// ([H, A]: small), out_proj, c and time table. A velocity evaluation: every block computes all H outputs of in_proj
// on its own copy (one thread per output, replaying the warp's per-lane sums and butterfly: no barrier), then for
// each hidden layer each block computes its R outputs (a warp takes up to four outputs at once so their memory and
// shuffle latencies overlap) and stores them into every block's copy of the layer's output (distributed shared
// memory: lanes 0-7 store one rank's copy each), then the cluster barrier; out_proj's A outputs and the solver's
// combinations are computed by every block on its own copy (the same operations in the same order, so every block
// holds the same state). Layer outputs rotate through three buffers: a remote store into layer g's buffer comes after
// the barrier that ended the last remote layer, when every block has finished reading layer g - 3, the buffer's
// previous content.
//
// Numerics: each output is the single linear op's per-output routine (linear.cu: per-lane float sums in index
// order, 16-byte vector or scalar steps as that op would choose for the same pointers, butterfly warp sum, lane 0's
// value + bias, activation), the in_proj bias is tproj + c as axpby forms it, and the combinations are axpby's
// `a * x + b * y`: the solve equals FlowHead's per-op solve bit for bit (test/cuda/test_cuda_models.cpp: fused vs
// per-op). The action kernel adds the backbone the same way (RMSNorm as rms_norm_kernel's block, the causal conv and
// the scan as mamba.cu computes them, each projection as the linear op) before the same solve.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "cluster_splitk.cuh"
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kCluster = 8;
constexpr int kMaxAction = 64;  // the state and the solver's k buffers live in shared memory
constexpr int kMaxXProj = 64;   // x_proj outputs (dt_rank + 2 d_state) of the fused action

/// The phase clock (FLOWEDGE_CUDA_FLOW_PHASES=1, a diagnostic): block 0's thread 0 stamps clock64() at the end of every
/// phase of a fused launch (after the barrier or exchange that ends it; the first kMaxStamps), and the global timer
/// at the first and the last stamp. One record for the process: the last fused launch's.
enum Phase : unsigned char {
    kStart, kSetup, kNorm, kInProj, kConv, kXProj, kDtProj, kScan, kOutProj, kCond, kVelIn, kVelHidden, kVelOut, kCombine, kPhases
};
constexpr const char* kPhaseName[kPhases] = {"start", "setup (weights issued, embedding, first barrier)",
                                             "backbone rms_norm", "backbone in_proj", "backbone conv + exchange",
                                             "backbone x_proj + exchange", "backbone dt_proj", "backbone scan + exchange",
                                             "backbone out_proj + exchange", "final norm + cond_proj + exchange",
                                             "velocity in_proj", "velocity hidden layer + exchange", "velocity out_proj",
                                             "solver combination"};
constexpr int kMaxStamps = 512;
__device__ long long g_phase_clock[kMaxStamps];
__device__ unsigned char g_phase_kind[kMaxStamps];
__device__ int g_phase_count;
__device__ unsigned long long g_phase_ns[2];  // global timer at the first and the last stamp

/// Bits of the fused kernels' `flags` argument.
constexpr int kFlagMbarrier = 1, kFlagPhases = 2;

__host__ __device__ constexpr int pad4(int n) { return (n + 3) & ~3; }

/// Issues (does not commit) cp.async copies of `rows` rows of `len` floats to dst (row stride ld): row r from src(r).
/// v16: every src(r) and dst row is 16-byte aligned and len % 4 == 0 (16-byte steps), else 4-byte steps. Called by
/// all of a block's Threads threads.
template <int Threads, class Src>
__device__ __forceinline__ void copy_rows(float* dst, int ld, int rows, int len, Src src, bool v16, int tid) {
    if (v16) {
        const int q = len / 4;
        for (int e = tid; e < rows * q; e += Threads) {
            const int r = e / q, c = e - r * q;
            detail::cp_async16(dst + std::size_t(r) * ld + 4 * c, src(r) + 4 * c, 16);
        }
    } else {
        for (int e = tid; e < rows * len; e += Threads) {
            const int r = e / len, c = e - r * len;
            detail::cp_async4(dst + std::size_t(r) * ld + c, src(r) + c, 4);
        }
    }
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// Whether rows of `len` floats at `base` + k * `len` (and shared-memory rows of stride pad4) take 16-byte steps.
__device__ __forceinline__ bool rows16(const float* base, int len) {
    return len % 4 == 0 && (reinterpret_cast<std::uintptr_t>(base) & 15u) == 0;
}
#endif

/// Half steps j of the time table the solver reads: Euler and Heun only even ones (j = 2k, 2k + 2), RK4 all; row j
/// of the table is kept at j / time_stride.
__host__ __device__ constexpr int time_stride(const FlowSolveParams& p) { return p.solver == 2 ? 1 : 2; }
__host__ __device__ constexpr int time_rows(const FlowSolveParams& p) { return 2 * p.steps / time_stride(p) + 1; }

/// Offsets (floats) of the shared-memory regions; every region starts 16-byte aligned.
struct FlowSmem {
    int w_in = 0, w_layers = 0, w_out = 0, c = 0, tproj = 0, h = 0, state = 0, bars = 0, total = 0;
    __host__ __device__ static FlowSmem of(const FlowSolveParams& p) {
        const int H = p.hidden, A = p.action_dim, R = H / kCluster, J = time_rows(p);
        FlowSmem s;
        s.w_in = 0;
        s.w_layers = s.w_in + pad4(H * A);
        s.w_out = s.w_layers + pad4(p.n_layers * R * H);
        s.c = s.w_out + pad4(A * H);
        s.tproj = s.c + pad4(H);
        s.h = s.tproj + pad4(J * H);
        s.state = s.h + 3 * pad4(H);
        s.bars = s.state + 6 * pad4(A);  // x, xt, k0..k3
        s.total = s.bars + 4;            // the exchange's two mbarriers (8 bytes each, 16-byte aligned region)
        return s;
    }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // thread-block clusters: the device code of sm_90 only
/// N outputs of the single linear op (linear.cu, linear_outputs at rows = 1): out[q] = w[q] . x[q], each with per-lane
/// sums in index order, then the butterfly warp sum; lane 0's values are the op's. Taking N at once overlaps their
/// loads and shuffles; each output's chain is unchanged.
template <int N>
__device__ __forceinline__ void warp_dots(const float* const (&w)[N], const float* const (&x)[N], int n, bool vec, int lane,
                                          float (&out)[N]) {
    float acc[N];
#pragma unroll
    for (int q = 0; q < N; ++q) acc[q] = 0.f;
    if (vec) {
        for (int i = lane * 4; i < n; i += 32 * 4) {
#pragma unroll
            for (int q = 0; q < N; ++q) {
                const float4 wv = *reinterpret_cast<const float4*>(w[q] + i);
                const float4 xv = *reinterpret_cast<const float4*>(x[q] + i);
                acc[q] += wv.x * xv.x;
                acc[q] += wv.y * xv.y;
                acc[q] += wv.z * xv.z;
                acc[q] += wv.w * xv.w;
            }
        }
    } else {
        for (int i = lane; i < n; i += 32)
#pragma unroll
            for (int q = 0; q < N; ++q) acc[q] += w[q][i] * x[q][i];
    }
#pragma unroll
    for (int q = 0; q < N; ++q) out[q] = detail::warp_sum(acc[q]);
}

/// Outputs a warp computes at once: enough to overlap their latencies when the block has few warps, fewer (less
/// repeated work past the end of short layers) when many warps do that.
template <int Warps>
constexpr int kDotsPerWarp = Warps >= 32 ? 1 : Warps >= 16 ? 2 : 4;

/// Items i = warp, warp + Warps, ... of [0, count), N at a time (default kDotsPerWarp; more where a warp has many): operands(i, w, x) names item i's weight
/// row and input (length n); store(i, value) runs on every lane with the op's value (warp_sum's xor butterfly leaves
/// the same bits in all 32 lanes, a + b == b + a), so a store to every block's copy can use one lane per rank.
template <int Warps, int N = kDotsPerWarp<Warps>, class Operands, class Store>
__device__ __forceinline__ void warp_dot_items(int count, int n, bool vec, int warp, int lane, Operands operands, Store store) {
    for (int i0 = warp; i0 < count; i0 += N * Warps) {
        const float* w[N];
        const float* x[N];
#pragma unroll
        for (int q = 0; q < N; ++q) {
            const int i = i0 + q * Warps;
            operands(i < count ? i : i0, w[q], x[q]);  // past the end: a repeat of item i0, not stored
        }
        float s[N];
        warp_dots<N>(w, x, n, vec, lane, s);
#pragma unroll
        for (int q = 0; q < N; ++q)
            if (i0 + q * Warps < count) store(i0 + q * Warps, s[q]);
    }
}

namespace cg = cooperative_groups;

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned map_rank(unsigned addr, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}

/// One layer-to-layer exchange after another: every block stores values into every block's shared memory (each
/// exchange is all-to-all, so no block can be more than one exchange ahead of another), then waits for the values
/// addressed to it. Barrier mode: plain remote stores, then the cluster barrier. Mbarrier mode (default): st.async remote
/// stores that count their bytes on the receiver's mbarrier (complete_tx), and each block waits only until its own
/// bytes have arrived; two mbarriers alternate (exchange k on bar k % 2, parity (k / 2) % 2). Every thread runs the
/// same sequence: begin(bytes received), put()s, end().
struct Exchange {
    cg::cluster_group cl;
    unsigned bars;       // shared::cta address of the two mbarriers
    unsigned count = 0;  // exchanges ended so far
    bool async;
    int tid, lane;

    bool record;         // the phase clock (block 0, thread 0)

    __device__ Exchange(float* bar_region, int flags)
        : cl(cg::this_cluster()), bars(detail::smem_addr(bar_region)), async(flags & kFlagMbarrier), tid(int(threadIdx.x)),
          lane(tid & 31), record((flags & kFlagPhases) && tid == 0 && cl.block_rank() == 0) {}
    /// The phase clock: the end of a phase of kind k (kStart also resets the record and stamps the global timer).
    __device__ void stamp(Phase k) const {
        if (!record) return;
        const unsigned long long ns = global_ns();
        if (k == kStart) {
            g_phase_count = 0;
            g_phase_ns[0] = ns;
        }
        g_phase_ns[1] = ns;
        const int n = g_phase_count;
        if (n >= kMaxStamps) return;
        g_phase_clock[n] = clock64();
        g_phase_kind[n] = k;
        g_phase_count = n + 1;
    }
    /// Before the first cluster barrier of the kernel (which publishes the mbarriers to the other blocks).
    __device__ void init() const {
        if (!async || tid != 0) return;
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bars + 8u) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __device__ unsigned bar() const { return bars + 8u * (count & 1u); }
    /// This block will receive `bytes` in this exchange (thread 0 arms the mbarrier; its phase cannot complete before).
    __device__ void begin(unsigned bytes) const {
        if (async && tid == 0)
            asm volatile(
                "{ .reg .b64 st;\n"
                "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 st, [%0], %1; }" ::"r"(bar()),
                "r"(bytes)
                : "memory");
    }
    /// buf[i] = v in block `rank` (the caller's thread only).
    __device__ void put_to(int rank, float* buf, int i, float v) const {
        if (async)
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];" ::"r"(
                             map_rank(detail::smem_addr(buf + i), unsigned(rank))),
                         "r"(__float_as_uint(v)), "r"(map_rank(bar(), unsigned(rank)))
                         : "memory");
        else
            cl.map_shared_rank(buf, rank)[i] = v;
    }
    /// buf[i] = v in every block, one rank per lane (lanes 0-7; every lane holds the same v): one store instruction
    /// instead of eight on one lane.
    __device__ void put(float* buf, int i, float v) const {
        if (lane < kCluster) put_to(lane, buf, i, v);
    }
    __device__ void end() {
        if (async) {
            const unsigned b = bar(), parity = (count >> 1) & 1u;
            unsigned done = 0, spins = 0;
            unsigned long long t0 = 0;
            for (;;) {
                asm volatile(
                    "{ .reg .pred p;\n"
                    "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                    "selp.u32 %0, 1, 0, p; }"
                    : "=r"(done)
                    : "r"(b), "r"(parity)
                    : "memory");
                if (done) break;
                if ((++spins & 4095u) == 0) {  // a lost byte count is a bug: fail the launch, never hang
                    const unsigned long long t = global_ns();
                    if (t0 == 0) t0 = t;
                    else if (t - t0 > 200000000ull) __trap();
                }
            }
            // No warp starts the next exchange while another still waits on this one: the mbarrier's next phase but
            // one must not complete under a lagging waiter (it would see its parity again and wait forever).
            __syncthreads();
        } else {
            cl.sync();
        }
        ++count;
    }
    /// The end of the kernel: no block leaves while another may still store into its shared memory.
    __device__ void finish() const {
        if (async) cl.sync();
    }
};

template <int O, int M>
__device__ __forceinline__ void butterfly_step(float (&part)[M]) {
#pragma unroll
    for (int i = 0; i < O; ++i) part[i] += part[i + O];
}

/// One thread's replay of warp_dots' value for one output of a short row (in_proj: n = A <= kMaxAction = 64, so a
/// lane holds at most one 4-element step of the vector path, or two elements): the 32 lanes' sums in their order,
/// then the butterfly's additions as lane 0 sees them (lane i + lane i + o for o = 16, 8, 4, 2, 1). M (a power of two)
/// covers every lane that holds an element (thread_lanes()): the other lanes' sums are +0, so the butterfly's levels
/// o >= M only turn a -0 into +0 in lanes below M, which one x + 0.f does (it is idempotent), and the levels below M
/// run as the warp's.
template <int M>
__device__ __forceinline__ float thread_dot(const float* w, const float* x, int n, bool vec) {
    float part[M];
#pragma unroll
    for (int l = 0; l < M; ++l) {
        float acc = 0.f;
        if (vec) {
            if (const int i = 4 * l; i < n) {
                acc += w[i] * x[i];
                acc += w[i + 1] * x[i + 1];
                acc += w[i + 2] * x[i + 2];
                acc += w[i + 3] * x[i + 3];
            }
        } else {
            if (l < n) acc += w[l] * x[l];
            if (l + 32 < n) acc += w[l + 32] * x[l + 32];
        }
        part[l] = acc;
    }
    if constexpr (M < 32) {
#pragma unroll
        for (int l = 0; l < M; ++l) part[l] = part[l] + 0.f;
    }
    if constexpr (M >= 32) butterfly_step<16>(part);
    if constexpr (M >= 16) butterfly_step<8>(part);
    if constexpr (M >= 8) butterfly_step<4>(part);
    if constexpr (M >= 4) butterfly_step<2>(part);
    if constexpr (M >= 2) butterfly_step<1>(part);
    return part[0];
}

/// Lanes of the warp routine that hold elements of a row of n: the vector path's 4-element steps, or the scalar path's
/// elements l and l + 32.
__host__ __device__ constexpr int thread_lanes(int n, bool vec) { return vec ? (n + 3) / 4 : (n < 32 ? n : 32); }

/// axpby's element, rounded as elementwise.cu's kernel: fma(b, y, a * x). Left to contraction as `a * x + b * y`,
/// the two places may fuse different products; the first GPU run (2026-12-06) showed the fused solve differing from
/// the per-op one exactly where a coefficient (dt, dt/6) is not a power of two.
__device__ __forceinline__ float axpby(float x, float y, float a, float b) {
    return __fmaf_rn(b, y, a * x);
}

/// One block's part of a fused flow solve: its shared-memory regions (FlowSmem at `sm`) and the cluster it shares
/// layer outputs with. copy_weights() issues the weight copies (not committed); copy_inputs() those of c (unless the
/// caller computes it), the time table and x; run() does steps [first, first + count) on the state in xs.
template <int Threads>
struct FlowBlock {
    static constexpr int Warps = Threads / 32;
    const FlowSolveParams& p;
    cg::cluster_group cl;
    Exchange& ex;
    float *w_in, *w_layers, *w_out, *c_s, *t_s, *hbuf, *xs, *xt, *ks;
    int H, A, R, rank, row0, ldh, lda, tid, warp, lane;
    int g = 0;  // layer outputs produced so far; output g lives in hbuf[g % 3]

    __device__ FlowBlock(const FlowSolveParams& prm, float* sm, Exchange& exchange) : p(prm), cl(cg::this_cluster()), ex(exchange) {
        const FlowSmem L = FlowSmem::of(p);
        H = p.hidden, A = p.action_dim, R = H / kCluster;
        rank = int(cl.block_rank()), row0 = rank * R;
        tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
        ldh = pad4(H), lda = pad4(A);
        w_in = sm + L.w_in, w_layers = sm + L.w_layers, w_out = sm + L.w_out, c_s = sm + L.c, t_s = sm + L.tproj;
        hbuf = sm + L.h, xs = sm + L.state, xt = xs + lda, ks = xs + 2 * lda;
    }

    __device__ void copy_weights() const {
        copy_rows<Threads>(w_in, A, H, A, [&](int r) { return p.in_proj + std::size_t(r) * A; }, rows16(p.in_proj, A), tid);
        for (int l = 0; l < p.n_layers; ++l)
            copy_rows<Threads>(w_layers + std::size_t(l) * R * H, H, R, H, [&](int r) { return p.layers[l] + std::size_t(row0 + r) * H; },
                      rows16(p.layers[l], H), tid);
        copy_rows<Threads>(w_out, H, A, H, [&](int r) { return p.out_proj + std::size_t(r) * H; }, rows16(p.out_proj, H), tid);
    }
    /// After the PDL wait: the time table's rows the solver reads, and (with_c_x) c and x from global memory.
    __device__ void copy_inputs(bool with_c_x) const {
        const int ts = time_stride(p);
        copy_rows<Threads>(t_s, H, time_rows(p), H, [&](int r) { return p.tproj + std::size_t(r) * ts * H; }, rows16(p.tproj, H), tid);
        if (!with_c_x) return;
        for (int e = tid; e < H; e += Threads) detail::cp_async4(c_s + e, p.c + e, 4);
        for (int e = tid; e < A; e += Threads) detail::cp_async4(xs + e, p.x + e, 4);
    }

    __device__ float* hb(int k) const { return hbuf + (k % 3) * ldh; }

    /// in_proj on this block's own copy: out[o] = silu(w_in[o] . x + (tproj[j][o] + c[o])) for all H outputs, one
    /// thread each (the bias as axpby forms it, a = b = 1).
    __device__ void in_rows(const float* x_in, int j) {
        float* out = hb(g);
        const bool vec = p.vec_mask & 1u;
        const int lanes = thread_lanes(A, vec);
        const float* const tj = t_s + (j / time_stride(p)) * H;
        auto rows = [&](auto m) {
            for (int o = tid; o < H; o += Threads) {
                const float s = thread_dot<decltype(m)::value>(w_in + std::size_t(o) * A, x_in, A, vec);
                out[o] = detail::silu(s + axpby(tj[o], c_s[o], 1.f, 1.f));
            }
        };
        if (lanes <= 2) rows(std::integral_constant<int, 2>{});
        else if (lanes <= 8) rows(std::integral_constant<int, 8>{});
        else rows(std::integral_constant<int, 32>{});
        __syncthreads();
        ex.stamp(kVelIn);
        ++g;
    }
    /// This block's rows of one hidden layer: out[o] = silu(w_row(o) . in + 0.f) (the op's absent bias), stored into
    /// every block's buffer.
    __device__ void layer_rows(const float* w, const float* in, bool vec) {
        float* out = hb(g);
        ex.begin(unsigned(sizeof(float) * H));
        warp_dot_items<Warps>(
            R, H, vec, warp, lane,
            [&](int r, const float*& wr, const float*& xr) {
                wr = w + std::size_t(r) * H;
                xr = in;
            },
            [&](int r, float s) { ex.put(out, row0 + r, detail::silu(s + 0.f)); });
        ex.end();
        ex.stamp(kVelHidden);
        ++g;
    }
    /// v_out = velocity(x_in, half step j) (this block's copy).
    __device__ void velocity(const float* x_in, int j, float* v_out) {
        in_rows(x_in, j);
        for (int l = 0; l < p.n_layers; ++l)
            layer_rows(w_layers + std::size_t(l) * R * H, hb(g - 1), (p.vec_mask >> (1 + l)) & 1u);
        const float* h = hb(g - 1);
        const bool vec_out = (p.vec_mask >> (1 + p.n_layers)) & 1u;
        warp_dot_items<Warps>(
            A, H, vec_out, warp, lane,
            [&](int o, const float*& wr, const float*& xr) {
                wr = w_out + std::size_t(o) * H;
                xr = h;
            },
            [&](int o, float s) {
                if (lane == 0) v_out[o] = s + 0.f;
            });
        __syncthreads();
        ex.stamp(kVelOut);
    }
    /// dst[i] = a * xv[i] + b * yv[i] over the state (this block's copy).
    __device__ void combine(float* dst, const float* xv, const float* yv, float a, float b) const {
        if (tid < A) dst[tid] = axpby(xv[tid], yv[tid], a, b);
        __syncthreads();
        ex.stamp(kCombine);
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

template <int Threads>
__global__ void __launch_bounds__(Threads, 1) flow_solve_kernel(const __grid_constant__ FlowSolveParams p, int flags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) float sm[];
    Exchange ex(sm + FlowSmem::of(p).bars, flags);
    ex.stamp(kStart);
    ex.init();
    FlowBlock<Threads> f(p, sm, ex);
    f.copy_weights();  // constants: before the PDL wait
    detail::cp_async_commit();
    detail::pdl_wait();  // x, c (and the time table) come from earlier kernels
    f.copy_inputs(true);
    detail::cp_async_commit();
    detail::cp_async_wait<0>();
    f.cl.sync();  // every block of the cluster runs (and its copies landed) before any remote store
    ex.stamp(kSetup);
    f.run();
    if (f.rank == 0 && f.tid < f.A) p.x[f.tid] = f.xs[f.tid];
    ex.finish();
#else
    __trap();  // clusters need sm_90; the host launches this kernel only there
#endif
}

/// Offsets (floats, after the flow regions) of the backbone's shared-memory regions of the fused action.
struct MambaSmem {
    int h = 0, n = 0, u = 0, dbl = 0, y = 0, xo = 0, zo = 0, dt = 0, hid = 0, total = 0;
    int ld_d = 0, ld_i = 0, ld_b = 0, ld_r = 0, cb = 0, db = 0, nx = 0;
    /// Layer l < p.staged_layers: the weight rows this block reads, copied to shared memory at kernel start, at
    /// w0 + l * w_layer: in_proj's x and z rows of the block's channels [2 cb][ld_d], then x_proj's rows rank + 8 j
    /// [nx][ld_i] at +o_x, dt_proj's rows of the channels [cb][ld_r] at +o_dt, out_proj's rows of the block's
    /// outputs [db][ld_i] at +o_out.
    int w0 = 0, w_layer = 0, o_x = 0, o_dt = 0, o_out = 0;
    __host__ __device__ static MambaSmem of(const MambaFlowActParams& p, int base) {
        MambaSmem m;
        const int L = p.n_tokens;
        m.ld_d = pad4(p.d_model), m.ld_i = pad4(p.d_inner), m.ld_b = pad4(p.dt_rank + 2 * p.d_state), m.ld_r = pad4(p.dt_rank);
        m.cb = p.d_inner / kCluster, m.db = p.d_model / kCluster;
        m.nx = (p.dt_rank + 2 * p.d_state + kCluster - 1) / kCluster;
        m.h = base;                      // [L][ld_d] residual stream (every block's copy)
        m.n = m.h + L * m.ld_d;          // [L][ld_d] RMSNorm output
        m.u = m.n + L * m.ld_d;          // [L][ld_i] conv + SiLU output (all channels)
        m.dbl = m.u + L * m.ld_i;        // [L][ld_b] x_proj output: dt_low | B | C
        m.y = m.dbl + L * m.ld_b;        // [L][ld_i] scan output (all channels)
        m.xo = m.y + L * m.ld_i;         // [L][cb] in_proj x part, this block's channels
        m.zo = m.xo + pad4(L * m.cb);    // [L][cb] in_proj z part, this block's channels
        m.dt = m.zo + pad4(L * m.cb);    // [cb][L] dt_proj @ dt_low (before the bias and softplus), this block's channels
        m.hid = m.dt + pad4(m.cb * L);   // [ld_d] the final norm of the last row
        m.w0 = m.hid + m.ld_d;
        m.o_x = 2 * m.cb * m.ld_d;
        m.o_dt = m.o_x + m.nx * m.ld_i;
        m.o_out = m.o_dt + m.cb * m.ld_r;
        m.w_layer = m.o_out + m.db * m.ld_i;
        m.total = m.w0 + p.staged_layers * m.w_layer;
        return m;
    }
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// Rows [0, L) of rms_norm_kernel (norm.cu, one 256-thread block per row: y = x * float(1 / sqrt(mean(x^2) + eps)) *
/// w, the sum of squares in double): one warp per row here (rows warp, warp + Warps, ...), replaying the norm block's
/// 8 warps' per-thread sums and butterflies and the in-order sum of the warp totals, so the rows equal the kernel's.
template <int Warps>
__device__ __forceinline__ void rms_rows(const float* x, const float* w, float* y, int L, int ld, int d, float eps, int warp,
                                         int lane) {
    constexpr int kNormThreads = 256, kNormWarps = kNormThreads / 32;  // rms_norm_kernel's block (norm.cu)
    for (int t = warp; t < L; t += Warps) {
        const float* xr = x + t * ld;
        float* yr = y + t * ld;
        double part[kNormWarps];
#pragma unroll
        for (int v = 0; v < kNormWarps; ++v) {
            double s = 0.0;
            for (int i = v * 32 + lane; i < d; i += kNormThreads) s += double(xr[i]) * double(xr[i]);
            part[v] = detail::warp_sum(s);
        }
        double total = 0.0;
#pragma unroll
        for (int v = 0; v < kNormWarps; ++v) total += __shfl_sync(0xffffffffu, part[v], 0);
        const float scale = float(1.0 / sqrt(total / double(d) + double(eps)));
        for (int i = lane; i < d; i += 32) yr[i] = xr[i] * scale * w[i];
    }
}

/// cp.async.wait_group with a run-time count (at most n groups left pending; 0 past the table).
__device__ __forceinline__ void cp_async_wait_pending(int n) {
    switch (n) {
        case 5: detail::cp_async_wait<5>(); break;
        case 4: detail::cp_async_wait<4>(); break;
        case 3: detail::cp_async_wait<3>(); break;
        case 2: detail::cp_async_wait<2>(); break;
        case 1: detail::cp_async_wait<1>(); break;
        default: detail::cp_async_wait<0>(); break;
    }
}

#endif

/// The whole action (MambaFlowActParams). Work split over the cluster: block `rank` owns the mixer channels
/// [rank * di/8, (rank + 1) * di/8) (in_proj's x and z rows, the conv, dt_proj and the scan of those channels, and
/// their state), x_proj outputs rank, rank + 8, ..., out_proj outputs [rank * D/8, (rank + 1) * D/8), its rows of c
/// and the flow rows of FlowBlock; every output is stored into every block's copy (distributed shared memory), 4
/// cluster barriers per layer; the norms are computed by every block on its own copy. The weight rows a block reads
/// are copied to its shared memory at kernel start (all the flow's; the backbone's for the first staged_layers
/// layers, as many as fit), each layer's in its own cp.async group, waited for just before the layer.
template <int Threads>
__global__ void __launch_bounds__(Threads, 1) mamba_flow_act_kernel(const __grid_constant__ MambaFlowActParams p, int flags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int Warps = Threads / 32;
    extern __shared__ __align__(16) float sm[];
    Exchange ex(sm + FlowSmem::of(p.flow).bars, flags);
    ex.stamp(kStart);
    ex.init();
    FlowBlock<Threads> f(p.flow, sm, ex);
    const MambaSmem M = MambaSmem::of(p, FlowSmem::of(p.flow).total);
    const int D = p.d_model, di = p.d_inner, S = p.d_state, R = p.dt_rank, K = p.d_conv, Lt = p.n_tokens;
    const int nb = R + 2 * S, cb = M.cb, db = M.db, c0 = f.rank * cb, tid = f.tid, warp = f.warp, lane = f.lane;
    const int nx = (nb - f.rank + kCluster - 1) / kCluster;  // x_proj outputs rank + 8 j, j < nx
    const int staged = p.staged_layers;
    float* const h = sm + M.h;
    float* const n = sm + M.n;
    float* const u = sm + M.u;
    float* const dbl = sm + M.dbl;
    float* const y = sm + M.y;
    float* const xo = sm + M.xo;
    float* const zo = sm + M.zo;
    float* const dts = sm + M.dt;
    float* const hid = sm + M.hid;
    auto in_row = [&](int q) { return q < cb ? c0 + q : di + c0 + (q - cb); };  // in_proj row of local row q

    // Constants before the PDL wait, in the order they are used: each staged layer's rows, then the flow weights.
    for (int l = 0; l < staged; ++l) {
        const MambaLayerTensors& T = p.layers[l];
        float* const w = sm + M.w0 + l * M.w_layer;
        copy_rows<Threads>(w, M.ld_d, 2 * cb, D, [&](int q) { return T.in_proj + std::size_t(in_row(q)) * D; },
                           rows16(T.in_proj, D), tid);
        copy_rows<Threads>(w + M.o_x, M.ld_i, nx, di, [&](int j) { return T.x_proj + std::size_t(f.rank + kCluster * j) * di; },
                           rows16(T.x_proj, di), tid);
        copy_rows<Threads>(w + M.o_dt, M.ld_r, cb, R, [&](int k) { return T.dt_proj + std::size_t(c0 + k) * R; },
                           rows16(T.dt_proj, R), tid);
        copy_rows<Threads>(w + M.o_out, M.ld_i, db, di, [&](int q) { return T.out_proj + std::size_t(f.rank * db + q) * di; },
                           rows16(T.out_proj, di), tid);
        detail::cp_async_commit();
    }
    f.copy_weights();
    detail::cp_async_commit();
    detail::pdl_wait();  // the time table and the state buffers belong to earlier kernels
    f.copy_inputs(false);
    detail::cp_async_commit();
    for (int e = tid; e < Lt * D; e += Threads) {  // embedding rows
        const int t = e / D, d = e - t * D;
        h[t * M.ld_d + d] = p.embedding[std::size_t(p.tokens[t]) * D + d];
    }
    if (tid < f.A) f.xs[tid] = p.noise[tid];  // x = noise
    f.cl.sync();  // every block runs before any remote store; the stores above are visible in the block
    ex.stamp(kSetup);

    for (int l = 0; l < p.n_layers; ++l) {
        const MambaLayerTensors& T = p.layers[l];
        const unsigned vm = p.vec_mask >> (4 * l);
        const bool st = l < staged;
        const float* const w = sm + M.w0 + l * M.w_layer;  // the staged rows (st)
        if (st) cp_async_wait_pending(staged - l + 1);  // this layer's group done (later layers, flow, inputs pending)
        rms_rows<Warps>(h, T.norm, n, Lt, M.ld_d, D, p.eps, warp, lane);
        __syncthreads();  // n, and the staged rows copied by every thread
        ex.stamp(kNorm);
        // in_proj: this block's x rows c0 + q and z rows di + c0 + q (the linear op's per-output routine, no bias),
        // for every token: item i = q * Lt + t; 2 cb Lt items (256 here) per block, 4 in flight per warp.
        warp_dot_items<Warps, 4>(
            2 * cb * Lt, D, vm & 1u, warp, lane,
            [&](int i, const float*& wr, const float*& xr) {
                const int q = i / Lt, t = i - q * Lt;
                wr = st ? w + q * M.ld_d : T.in_proj + std::size_t(in_row(q)) * D;
                xr = n + t * M.ld_d;
            },
            [&](int i, float s) {
                const int q = i / Lt, t = i - q * Lt;
                if (lane == 0) (q < cb ? xo[t * cb + q] : zo[t * cb + q - cb]) = s + 0.f;
            });
        __syncthreads();
        ex.stamp(kInProj);
        // Causal conv + SiLU (causal_conv_kernel; the history is zero: a prefill starts from a reset): thread e
        // computes channel c0 + e % cb and stores rank e / cb's copy; rank 0's thread also writes the channel's conv
        // state rows.
        ex.begin(unsigned(sizeof(float) * Lt * di));
        for (int e = tid; e < cb * kCluster; e += Threads) {
            const int k = e % cb, rank = e / cb, c = c0 + k, hist = K - 1;
            auto xx = [&](int j) { return j < hist ? 0.f : xo[(j - hist) * cb + k]; };
            const float bias = T.conv_b ? T.conv_b[c] : 0.f;
            for (int t = 0; t < Lt; ++t) {
                float acc = bias;
                for (int j = 0; j < K; ++j) acc += T.conv_w[std::size_t(c) * K + j] * xx(t + j);
                ex.put_to(rank, u, t * M.ld_i + c, detail::silu(acc));
            }
            if (rank == 0)
                for (int j = 0; j < hist; ++j) T.conv_state[std::size_t(j) * di + c] = xx(Lt + j);
        }
        ex.end();
        ex.stamp(kConv);
        // x_proj: outputs o = rank + 8 j of every token (item i = j * Lt + t).
        ex.begin(unsigned(sizeof(float) * Lt * nb));
        warp_dot_items<Warps>(
            nx * Lt, di, (vm >> 1) & 1u, warp, lane,
            [&](int i, const float*& wr, const float*& xr) {
                const int j = i / Lt, t = i - j * Lt;
                wr = st ? w + M.o_x + j * M.ld_i : T.x_proj + std::size_t(f.rank + kCluster * j) * di;
                xr = u + t * M.ld_i;
            },
            [&](int i, float s) {
                const int j = i / Lt, t = i - j * Lt;
                ex.put(dbl, t * M.ld_b + f.rank + kCluster * j, s + 0.f);
            });
        ex.end();
        ex.stamp(kXProj);
        // dt_proj @ dt_low for this block's channels and every token (item i = k * Lt + t), before the scan.
        warp_dot_items<Warps, 4>(
            cb * Lt, R, (vm >> 2) & 1u, warp, lane,
            [&](int i, const float*& wr, const float*& xr) {
                const int k = i / Lt, t = i - k * Lt;
                wr = st ? w + M.o_dt + k * M.ld_r : T.dt_proj + std::size_t(c0 + k) * R;
                xr = dbl + t * M.ld_b;
            },
            [&](int i, float s) {
                if (lane == 0) dts[i] = s;
            });
        __syncthreads();
        ex.stamp(kDtProj);
        // dt = softplus(dt_proj @ dt_low + b) and the selective scan (selective_scan_kernel, d_state <= 32: lane n
        // holds state n, zero at a reset), this block's channels. With d_state <= 16 a warp scans two channels, one
        // per half: the op's full-warp butterfly would first add the 16 zero lanes, which only turns a -0 into +0
        // (x + 0.f), then run the levels 8..1 inside the half, so the sums keep the op's bits. Every lane of a half ends
        // with its channel's output; lanes 0-7 of the half store it into the eight blocks' copies.
        ex.begin(unsigned(sizeof(float) * Lt * di));
        auto scan = [&](auto channels_per_warp) {
            constexpr int G = decltype(channels_per_warp)::value, W = 32 / G;
            const int sub = lane / W, sl = lane % W;
            for (int k0 = warp * G; k0 < cb; k0 += Warps * G) {
                const bool live = k0 + sub < cb;  // an odd last channel: the other half repeats k0 and stores nothing
                const int k = live ? k0 + sub : k0, c = c0 + k;
                float state = 0.f;
                const float a = sl < S ? T.A[std::size_t(c) * S + sl] : 0.f;
                const float dd = T.D ? T.D[c] : 0.f, dtb = T.dt_bias[c];
                for (int t = 0; t < Lt; ++t) {
                    const float dtv = detail::softplus(dts[k * Lt + t] + dtb);
                    const float uv = u[t * M.ld_i + c];
                    const float* Bt = dbl + t * M.ld_b + R;
                    const float* Ct = Bt + S;
                    float part = 0.f;
                    if (sl < S) {
                        state = expf(dtv * a) * state + dtv * Bt[sl] * uv;
                        part += state * Ct[sl];
                    }
                    float sum;
                    if constexpr (G == 1) {
                        sum = detail::warp_sum(part);
                    } else {
                        sum = part + 0.f;
#pragma unroll
                        for (int o = W / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                    }
                    float yv = sum + dd * uv;
                    yv *= detail::silu(zo[t * cb + k]);
                    if (live && sl < kCluster) ex.put_to(sl, y, t * M.ld_i + c, yv);
                }
                if (live && sl < S) T.ssm_state[std::size_t(c) * S + sl] = state;
            }
        };
        if (S <= 16)
            scan(std::integral_constant<int, 2>{});
        else
            scan(std::integral_constant<int, 1>{});
        ex.end();
        ex.stamp(kScan);
        // out_proj + residual: this block's outputs; the last layer only for the last row (prefill_last).
        const int t_from = l == p.n_layers - 1 ? Lt - 1 : 0, nt = Lt - t_from;
        ex.begin(unsigned(sizeof(float) * nt * D));
        warp_dot_items<Warps>(
            db * nt, di, (vm >> 3) & 1u, warp, lane,
            [&](int i, const float*& wr, const float*& xr) {
                const int q = i / nt, t = t_from + (i - q * nt);
                wr = st ? w + M.o_out + q * M.ld_i : T.out_proj + std::size_t(f.rank * db + q) * di;
                xr = y + t * M.ld_i;
            },
            [&](int i, float s) {
                const int q = i / nt, t = t_from + (i - q * nt), o = f.rank * db + q;
                const float v = h[t * M.ld_d + o] + (s + 0.f);
                __syncwarp();  // every lane has read this block's old value before lane rank stores the new one
                ex.put(h, t * M.ld_d + o, v);
            });
        ex.end();
        ex.stamp(kOutProj);
    }
    // Final norm of the last row (warp 0); c = cond_proj @ it for this block's flow rows, into every block's copy.
    rms_rows<Warps>(h + (Lt - 1) * M.ld_d, p.norm_f, hid, 1, M.ld_d, D, p.eps, warp, lane);
    __syncthreads();
    if (f.rank == 0)
        for (int i = tid; i < D; i += Threads) p.hidden[i] = hid[i];
    ex.begin(unsigned(sizeof(float) * f.H));
    warp_dot_items<Warps>(
        f.R, D, (p.vec_mask >> 16) & 1u, warp, lane,
        [&](int r, const float*& wr, const float*& xr) {
            wr = p.cond_proj + std::size_t(f.row0 + r) * D;
            xr = hid;
        },
        [&](int r, float s) { ex.put(f.c_s, f.row0 + r, s + 0.f); });
    detail::cp_async_wait<0>();
    ex.end();  // c complete in every block
    __syncthreads();  // the flow weights and time table every thread copied landed
    ex.stamp(kCond);
    f.run();
    if (f.rank == 0 && tid < f.A) p.flow.x[tid] = f.xs[tid];
    ex.finish();
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

// The block sizes this build carries (CMake's FLOWEDGE_CUDA_FLOW_BLOCK_SIZES; 512 always).
#ifndef FLOWEDGE_CUDA_FLOW_BLOCKS_256
#define FLOWEDGE_CUDA_FLOW_BLOCKS_256 0
#endif
#ifndef FLOWEDGE_CUDA_FLOW_BLOCKS_1024
#define FLOWEDGE_CUDA_FLOW_BLOCKS_1024 0
#endif

/// Threads per block of the fused kernels: FLOWEDGE_CUDA_FLOW_THREADS = 256, 512 or 1024 (read once; for A/B timing,
/// the bits do not depend on it), else 512. A size the build does not carry is an error saying how to add it.
int flow_threads() {
    static const int threads = [] {
        const char* e = std::getenv("FLOWEDGE_CUDA_FLOW_THREADS");
        if (!e || !*e) return 512;
        const std::string v(e);
        if (v != "256" && v != "512" && v != "1024")
            fail("cuda flow kernels", "FLOWEDGE_CUDA_FLOW_THREADS" + expected_got("256, 512 or 1024", v));
        const int n = std::stoi(v);
        if ((n == 256 && !FLOWEDGE_CUDA_FLOW_BLOCKS_256) || (n == 1024 && !FLOWEDGE_CUDA_FLOW_BLOCKS_1024))
            fail("cuda flow kernels", "FLOWEDGE_CUDA_FLOW_THREADS=" + v + " is not compiled into this build: configure with "
                 "-DFLOWEDGE_CUDA_FLOW_BLOCK_SIZES=\"256;512;1024\" (default: 512 only)");
        return n;
    }();
    return threads;
}

/// How the fused kernels' blocks exchange layer outputs (Exchange): FLOWEDGE_CUDA_FLOW_EXCHANGE = mbarrier (st.async +
/// mbarrier transaction counts, the default: faster at every block size) or barrier (remote stores + cluster barrier);
/// read once.
bool mbarrier_exchange() {
    static const bool on = [] {
        const char* e = std::getenv("FLOWEDGE_CUDA_FLOW_EXCHANGE");
        const std::string v = e ? e : "";
        if (v.empty() || v == "mbarrier") return true;
        if (v == "barrier") return false;
        fail("cuda flow kernels", "FLOWEDGE_CUDA_FLOW_EXCHANGE" + expected_got("barrier or mbarrier", v));
    }();
    return on;
}

/// FLOWEDGE_CUDA_FLOW_PHASES (read once): the fused kernels record the phase clock.
bool phases_on() {
    static const bool on = detail::env_flag("FLOWEDGE_CUDA_FLOW_PHASES");
    return on;
}

/// Opts `kernel` (the instance for Threads per block) in to the device's whole per-block shared memory, once per
/// kernel and device because it is a driver call, and launches it as one cluster of kCluster blocks with PDL.
template <int Threads, class Params>
void launch_cluster(void (*kernel)(Params, int), std::size_t bytes, const Params& p, bool mbarrier, Stream s) {
    static std::atomic<int> opted_device{-1};
    detail::opt_in_smem_once(kernel, bytes, detail::smem_per_block_optin(), opted_device);
    const int flags = (mbarrier ? kFlagMbarrier : 0) | (phases_on() ? kFlagPhases : 0);
    detail::launch_pdl_cluster(kernel, dim3(1, 1, kCluster), dim3(Threads), bytes, detail::resolve(s), unsigned(kCluster), p,
                               flags);
}

/// Launches kernel<flow_threads()> (Kernel: a generic lambda returning the instance for its integral_constant).
template <class Params, class Kernel>
void launch_flow_kernel(Kernel kernel, std::size_t bytes, const Params& p, bool mbarrier, Stream s) {
    switch (flow_threads()) {
#if FLOWEDGE_CUDA_FLOW_BLOCKS_256
        case 256: launch_cluster<256>(kernel(std::integral_constant<int, 256>{}), bytes, p, mbarrier, s); break;
#endif
#if FLOWEDGE_CUDA_FLOW_BLOCKS_1024
        case 1024: launch_cluster<1024>(kernel(std::integral_constant<int, 1024>{}), bytes, p, mbarrier, s); break;
#endif
        default: launch_cluster<512>(kernel(std::integral_constant<int, 512>{}), bytes, p, mbarrier, s); break;
    }
}

}  // namespace

bool flow_solve(const FlowSolveParams& p, Stream s) {
    if (!flow_solve_applies(p)) return false;
    check_flow_pointers(p, true);
    const std::size_t bytes = sizeof(float) * std::size_t(FlowSmem::of(p).total);
    if (bytes > std::size_t(detail::smem_per_block_optin())) return false;
    launch_flow_kernel([](auto t) { return &flow_solve_kernel<decltype(t)::value>; }, bytes, p, mbarrier_exchange(), s);
    FLOWEDGE_CUDA_CHECK_LAUNCH("flow_solve_kernel");
    return true;
}

bool mamba_flow_act(const MambaFlowActParams& p, Stream s) {
    const FlowSolveParams& f = p.flow;
    if (!flow_solve_applies(f) || f.first != 0 || f.count != f.steps) return false;
    if (!(p.n_layers >= 1 && p.n_layers <= kMambaActMaxLayers && p.n_tokens >= 1 && p.n_tokens <= kMambaActMaxTokens &&
          p.d_model > 0 && p.d_model % kCluster == 0 && p.d_inner > 0 && p.d_inner % kCluster == 0 && p.d_state >= 1 &&
          p.d_state <= 32 && p.dt_rank >= 1 && p.dt_rank + 2 * p.d_state <= kMaxXProj && p.d_conv >= 1 &&
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
    // Stage as many leading layers' weight rows in shared memory as fit (the rest are read from global memory).
    MambaFlowActParams q = p;
    const std::size_t limit = std::size_t(detail::smem_per_block_optin());
    auto bytes_with = [&](int staged) {
        q.staged_layers = staged;
        return sizeof(float) * std::size_t(MambaSmem::of(q, FlowSmem::of(f).total).total);
    };
    int staged = p.n_layers;
    while (staged > 0 && bytes_with(staged) > limit) --staged;
    const std::size_t bytes = bytes_with(staged);
    if (bytes > limit) return false;
    // The mbarrier exchange needs every block to send to every block in each exchange (x_proj: >= 8 outputs).
    const bool mbarrier = mbarrier_exchange() && p.dt_rank + 2 * p.d_state >= kCluster;
    launch_flow_kernel([](auto t) { return &mamba_flow_act_kernel<decltype(t)::value>; }, bytes, q, mbarrier, s);
    FLOWEDGE_CUDA_CHECK_LAUNCH("mamba_flow_act_kernel");
    return true;
}

FlowPhaseProfile last_flow_phases() {
    FlowPhaseProfile r;
    if (!phases_on()) return r;
    FLOWEDGE_CUDA_CHECK(cudaDeviceSynchronize());
    int n = 0;
    FLOWEDGE_CUDA_CHECK(cudaMemcpyFromSymbol(&n, g_phase_count, sizeof n));
    n = std::min(n, kMaxStamps);
    if (n == 0) return r;
    std::vector<long long> clock(static_cast<std::size_t>(n));
    std::vector<unsigned char> kind(static_cast<std::size_t>(n));
    unsigned long long ns[2] = {0, 0};
    FLOWEDGE_CUDA_CHECK(cudaMemcpyFromSymbol(clock.data(), g_phase_clock, sizeof(long long) * std::size_t(n)));
    FLOWEDGE_CUDA_CHECK(cudaMemcpyFromSymbol(kind.data(), g_phase_kind, std::size_t(n)));
    FLOWEDGE_CUDA_CHECK(cudaMemcpyFromSymbol(ns, g_phase_ns, sizeof ns));
    r.total_ns = double(ns[1] - ns[0]);
    for (int i = 1; i < n; ++i) r.phases.push_back({kPhaseName[kind[std::size_t(i)]], clock[std::size_t(i)] - clock[std::size_t(i) - 1]});
    return r;
}

}  // namespace flowedge::cuda
