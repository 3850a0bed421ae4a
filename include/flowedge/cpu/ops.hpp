// Ops<Cpu>: every primitive of op_params.hpp on the host, header-only, synchronous and allocation-free.
//
// Large matrix ops (linear, conv1d, conv_transpose1d) stream each weight exactly once per call, widening
// BF16/F16 in registers (cpu/kernels_gemm.hpp), and split output channels over OpenMP threads when the
// problem is big enough to pay for the fork (FLOWEDGE_OPENMP). Scratch (im2col panels, transposed-conv
// partial sums) lives in a fixed array on the calling thread's stack; nothing touches the heap.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "flowedge/cpu/kernels_gemm.hpp"
#include "flowedge/cpu/kernels_packed_conv.hpp"
#include "flowedge/cpu/math.hpp"
#include "flowedge/cpu/memory.hpp"
#include "flowedge/cpu/simd.hpp"
#include "flowedge/error.hpp"
#include "flowedge/linear_batch_check.hpp"
#include "flowedge/noise.hpp"
#include "flowedge/op_params.hpp"
#include "flowedge/ops.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

/// Throws flowedge::Error("flowedge: cpu <op>: <msg>") unless cond; the message is only built on failure.
#define FLOWEDGE_CPU_REQUIRE(cond, op, msg)                                     \
    do {                                                                        \
        if (!(cond)) [[unlikely]] ::flowedge::fail(std::string("cpu ") + (op), (msg)); \
    } while (0)

FLOWEDGE_SIMD_WARNINGS_OFF
namespace flowedge {
namespace cpu {

/// Floats of stack scratch one conv call may use (256 KiB).
inline constexpr std::size_t kScratchFloats = 64 * 1024;
/// Multiply-adds below which a call stays on the calling thread and never enters an OpenMP region (a fork
/// and join costs microseconds; 2^22 MACs is about 0.1 ms of one core, so every Mamba/flow-head op stays serial).
inline constexpr double kParallelMacs = double(1 << 22);

/// This thread's index and the team size inside an (optional) OpenMP parallel region.
inline int thread_index() {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
inline int thread_count() {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

constexpr std::size_t round_up16(std::size_t n) { return (n + 15) / 16 * 16; }

/// Calls f(typed pointer) with the weight pointer cast to its storage type.
template <class F>
inline void with_weights(const WeightRef& w, F&& f) {
    switch (w.dtype) {
        case DType::F32: f(static_cast<const float*>(w.data)); return;
        case DType::BF16: f(static_cast<const bf16*>(w.data)); return;
        case DType::F16: f(static_cast<const f16*>(w.data)); return;
    }
    fail("cpu ops", "unknown weight dtype " + std::to_string(int(w.dtype)));
}


/// Scalar linear epilogue: bias, then the activation when it must precede an accumulate, then store/accumulate.
struct LinearEpilogue {
    const LinearParams& p;
    std::size_t ldy;
    bool act_after;
    void operator()(int o, int r, float v) const {
        if (p.bias) v += p.bias[o];
        if (!act_after) v = activate(p.act, v);
        float& dst = p.y[std::size_t(r) * ldy + std::size_t(o)];
        dst = p.accumulate ? dst + v : v;
    }
};

#if defined(__AVX512F__)
/// Vector linear epilogue for n (<= 16) consecutive outputs: bias, then store or accumulate, with one masked
/// load/store (lane-wise the same arithmetic as the scalar epilogue). Only used when the activation is not
/// needed before an accumulate (it then runs afterwards over the finished rows, as on the scalar path).
struct LinearEpilogueVec : LinearEpilogue {
    void vec(int o, int r, VecF v, int n) const {
        const __mmask16 m = lane_mask(n);
        if (p.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, p.bias + o));
        float* dst = p.y + std::size_t(r) * ldy + std::size_t(o);
        if (p.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), v);
        _mm512_mask_storeu_ps(dst, m, v);
    }
};
#endif

template <class WT>
inline void linear_impl(const LinearParams& p, const WT* w) {
    const std::size_t ldx = p.ld_x ? std::size_t(p.ld_x) : std::size_t(p.in);
    const std::size_t ldy = p.ld_y ? std::size_t(p.ld_y) : std::size_t(p.out);
    // The activation runs vectorised over each finished output row segment unless it must precede an
    // accumulate (then it stays in the scalar epilogue).
    const bool act_after = p.act != Activation::None && !p.accumulate;
    auto run = [&](int o0, int o1) {
#if defined(__AVX512F__)
        // Kernels that yield whole vectors of outputs finish them in registers (bias, activation, store).
        if (p.act == Activation::None || act_after) {
            LinearEpilogueVec ev{{p, ldy, act_after}};
            gemm_rows(w, std::size_t(p.in), p.x, ldx, p.in, o0, o1, p.rows, ev);
        } else
#endif
        {
            LinearEpilogue epilogue{p, ldy, act_after};
            gemm_rows(w, std::size_t(p.in), p.x, ldx, p.in, o0, o1, p.rows, epilogue);
        }
        if (act_after)
            for (int r = 0; r < p.rows; ++r) activate_inplace(p.act, p.y + std::size_t(r) * ldy + std::size_t(o0), o1 - o0);
    };
    // Small calls (every Mamba/flow-head shape) never enter an OpenMP region, so no pool is woken.
    if (double(p.rows) * p.in * p.out < kParallelMacs) {
        run(0, p.out);
        return;
    }
#pragma omp parallel
    {
        const int tid = thread_index(), nth = thread_count();
        // Thread boundaries on multiples of 16 rows (whole short-row blocks).
        const int units = (p.out + 15) / 16;
        const int o0 = std::min(p.out, 16 * int(std::int64_t(units) * tid / nth));
        const int o1 = std::min(p.out, 16 * int(std::int64_t(units) * (tid + 1) / nth));
        if (o0 < o1) run(o0, o1);
    }
}

/// Implicit im2col, shared by the Conv1d kernels: panel column n (b = n / out_length, t = n % out_length) over input
/// channels [i0, i0 + ni) is put(j, x[b, i0 + i, t*stride + k - pad]) for j = i*K + k in increasing j (zero where
/// the window leaves the input: PyTorch's zero padding). Each kernel's `put` lays the column out its own way.
template <class Put>
inline void im2col_column(const Conv1dParams& p, int n, int i0, int ni, Put&& put) {
    const int K = p.kernel, Lin = p.in_length, b = n / p.out_length, t = n % p.out_length;
    const float* xb = p.x + (std::size_t(b) * std::size_t(p.in_channels) + std::size_t(i0)) * std::size_t(Lin);
    const int start = t * p.stride - p.pad;
    for (int i = 0; i < ni; ++i) {
        const float* xr = xb + std::size_t(i) * Lin;
        for (int k = 0; k < K; ++k) {
            const int s = start + k;
            put(i * K + k, (s >= 0 && s < Lin) ? xr[s] : 0.f);
        }
    }
}

/// Conv1d output y[b, o, t] of panel column n: the first input-channel chunk stores bias + v, later chunks add v
/// (the same order in every kernel, so a thread count or layout change keeps the bits of each sum's epilogue).
inline void conv_out(const Conv1dParams& p, int n, int o, float v, bool first) {
    const int b = n / p.out_length, t = n % p.out_length;
    float& dst = p.y[(std::size_t(b) * std::size_t(p.out_channels) + std::size_t(o)) * std::size_t(p.out_length) + std::size_t(t)];
    if (first) dst = v + (p.bias ? p.bias[o] : 0.f);
    else dst += v;
}

template <class WT>
inline void conv1d_impl(const Conv1dParams& p, const WT* w) {
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lout = p.out_length;
    const int N = p.batch * Lout;
    const std::size_t R = std::size_t(Cin) * std::size_t(K);
    // Columns per pass (weights are streamed once per pass) and input channels per im2col panel.
    const int ns = std::min(N, 64);
    const std::size_t per_col = (kScratchFloats / std::size_t(ns)) / 16 * 16;
    const int chunk_in = int(std::min<std::size_t>(std::size_t(Cin), per_col / std::size_t(K)));
    [[maybe_unused]] const bool par = double(N) * double(R) * Cout >= kParallelMacs;
    // One parallel region per call and no barrier inside it: every thread builds its own copy of each im2col
    // panel (a few hundred KiB at most, cheap next to its share of the weights) and streams only its own output
    // rows. A thread that loses its core therefore delays only its half instead of stalling the others at every
    // chunk (2-thread medians used to land on scheduler-quantum multiples on a shared machine).
#pragma omp parallel if (par)
    {
        alignas(64) float panel[kScratchFloats];
        const int tid = thread_index(), nth = thread_count();
        const int o0 = int(std::int64_t(Cout) * tid / nth), o1 = int(std::int64_t(Cout) * (tid + 1) / nth);
        for (int n0 = 0; n0 < N; n0 += ns) {
            const int nn = std::min(ns, N - n0);
            for (int i0 = 0; i0 < Cin; i0 += chunk_in) {
                const int ni = std::min(chunk_in, Cin - i0);
                const int len = ni * K;
                const std::size_t ldp = round_up16(std::size_t(len));
                // Panel column c: the reduction index i*K + k contiguous (the weight row's order).
                for (int c = 0; c < nn; ++c) {
                    float* dst = panel + std::size_t(c) * ldp;
                    im2col_column(p, n0 + c, i0, ni, [dst](int j, float v) { dst[j] = v; });
                }
                const bool first = i0 == 0;
                auto epilogue = [&](int o, int c, float v) { conv_out(p, n0 + c, o, v, first); };
                if (o0 < o1) gemm_rows(w + std::size_t(i0) * K, R, panel, ldp, len, o0, o1, nn, epilogue);
            }
        }
    }
}

#if defined(__AVX2__) || defined(__AVX512F__)
/// Reduction steps per micro-kernel pass over one packed block (kernels_packed_conv.hpp): that slice of the block
/// (kPackChunk * kConvBlockWidth weights, 8 KiB at F32 on AVX2) and of the panel stay in L1 while every column group
/// uses them, and each output is summed in chunks of this length whose partial sums are then added to a running total
/// (shorter float chains than one sequential sum over in*kernel elements). Even: BF16 blocks store steps in pairs.
inline constexpr int kPackChunk = 128;

/// This thread's share (output blocks [blocks*tid/nth, blocks*(tid+1)/nth)) of conv1d_packed_impl, so that several
/// convolutions can share one parallel region (linear_batch, conv_transpose1d on packed weights).
template <class WT>
inline void conv1d_packed_part(const Conv1dParams& p, const WT* wp, int tid, int nth) {
    constexpr int W = kConvBlockWidth<WT>, kMaxCols = kConvMaxCols<WT>;
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lout = p.out_length;
    const int N = p.batch * Lout;
    const std::size_t R = std::size_t(Cin) * std::size_t(K), block_steps = packed_conv_steps<WT>(R);
    const int blocks = (Cout + W - 1) / W;
    constexpr int kCols = 64;  // columns per pass (the packed weights are streamed once per pass)
    // BF16 blocks pair steps (j, j+1) from j = 0, so every input-channel chunk must start at an even step: an even
    // channel count per chunk (at least 2, hence at most kScratchFloats / (2K) columns per pass).
    constexpr bool kPairs = packed_conv_steps<WT>(1) == 2;
    const int ns = std::min({N, kCols, kPairs ? int(kScratchFloats / (2 * std::size_t(K))) : kCols});
    int chunk_in = int(std::min<std::size_t>(std::size_t(Cin), kScratchFloats / (std::size_t(ns) * std::size_t(K))));
    if (kPairs && chunk_in < Cin) chunk_in &= ~1;
    {
        alignas(64) float panel[kScratchFloats];
        alignas(64) float tot[kCols * W];
        const int b0 = int(std::int64_t(blocks) * tid / nth), b1 = int(std::int64_t(blocks) * (tid + 1) / nth);
        if (b0 == b1) return;
        for (int n0 = 0; n0 < N; n0 += ns) {
            const int nn = std::min(ns, N - n0);
            const int groups = (nn + kMaxCols - 1) / kMaxCols;
            for (int i0 = 0; i0 < Cin; i0 += chunk_in) {
                const int ni = std::min(chunk_in, Cin - i0);
                const int len = ni * K;
                // The panel transposed ([j][column]): one row of nn columns per reduction index j.
                for (int c = 0; c < nn; ++c)
                    im2col_column(p, n0 + c, i0, ni, [&](int j, float v) { panel[std::size_t(j) * nn + c] = v; });
                const bool first = i0 == 0;
                for (int ob = b0; ob < b1; ++ob) {
                    std::fill(tot, tot + std::size_t(nn) * W, 0.f);
                    const WT* wb = wp + (std::size_t(ob) * block_steps + std::size_t(i0) * K) * W;
                    for (int j0 = 0; j0 < len; j0 += kPackChunk) {
                        const int n = std::min(kPackChunk, len - j0);
                        // Column groups of <= kMaxCols, as even as possible (8 -> 4 + 4: 8 or 12 accumulators each).
                        for (int g = 0, c0 = 0; g < groups; ++g) {
                            const int c1 = nn * (g + 1) / groups;
                            packed_chunk_n(c1 - c0, wb + std::size_t(j0) * W, panel + std::size_t(j0) * nn, std::size_t(nn), n, c0, tot);
                            c0 = c1;
                        }
                    }
                    const int o0 = ob * W, o1 = std::min(Cout, o0 + W);
                    for (int c = 0; c < nn; ++c)
                        for (int o = o0; o < o1; ++o) conv_out(p, n0 + c, o, tot[std::size_t(c) * W + std::size_t(o - o0)], first);
                }
            }
        }
    }
}

/// conv1d_impl on packed weights (WeightRef::packed): the same column passes, input-channel chunks, thread split
/// (by output blocks) and epilogue order (bias + first chunk, then += later chunks), but the im2col panel is laid
/// out [j][column] and each packed block of kConvBlockWidth<WT> outputs is streamed once per pass (one contiguous
/// stream per thread). Per output: sum over j in kPackChunk pieces, each piece sequential in j; deterministic for any
/// thread count and column grouping.
template <class WT>
inline void conv1d_packed_impl(const Conv1dParams& p, const WT* wp) {
    [[maybe_unused]] const bool par =
        double(p.batch) * p.out_length * double(p.in_channels) * p.kernel * p.out_channels >= kParallelMacs;
#pragma omp parallel if (par)
    conv1d_packed_part(p, wp, thread_index(), thread_count());
}

/// torch.nn.ConvTranspose1d on packed weights (Storage::ConvTransposeWeight: [out*K, in] rows o*K + k, see
/// cpu::pack_conv_transpose_weights). Per group of batch rows and chunk of whole packed blocks of rows:
///   Z[b, r, s] = sum_i wt[r, i] x[b, i, s]             (the packed kernel-1 Conv1d, any number of threads)
///   y[b, o, s*stride - pad + k] += Z[b, o*K + k, s]    (col2im, threads split by output channel)
/// after y = bias. Each y element gets bias, then its (k, s) terms in increasing k: the same order for any chunking
/// or thread count. Why: the axpy form (conv_transpose1d_impl) re-reads its partial sums from L2 for every 4 input
/// channels and streamed the PushT Upsample1d weights at ~6-8 GB/s; this form streams them like a Conv1d.
/// Needs in_length * kConvBlockWidth<WT> <= kScratchFloats (the caller checks).
template <class WT>
inline void conv_transpose1d_packed_impl(const ConvTranspose1dParams& p, const WT* wp) {
    constexpr int W = kConvBlockWidth<WT>;
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lin = p.in_length, Lout = p.out_length;
    const int J = Cout * K;
    const int group = std::max(1, std::min(p.batch, int(kScratchFloats / (std::size_t(W) * std::size_t(Lin)))));
    const int chunk_rows = int(kScratchFloats / (std::size_t(group) * std::size_t(Lin))) / W * W;  // >= W
    const std::size_t block_elems = std::size_t(W) * packed_conv_steps<WT>(std::size_t(Cin));
    alignas(64) float z[kScratchFloats];
    [[maybe_unused]] const bool par = double(p.batch) * Lin * double(J) * Cin >= kParallelMacs;
#pragma omp parallel if (par)
    {
        const int tid = thread_index(), nth = thread_count();
        auto share = [&](int lo, int hi, int& a, int& b) {  // this thread's part of [lo, hi)
            a = lo + int(std::int64_t(hi - lo) * tid / nth);
            b = lo + int(std::int64_t(hi - lo) * (tid + 1) / nth);
        };
        int oa, ob;
        share(0, Cout, oa, ob);
        for (int b = 0; b < p.batch; ++b)
            for (int o = oa; o < ob; ++o)
                std::fill_n(p.y + (std::size_t(b) * Cout + std::size_t(o)) * std::size_t(Lout), Lout, p.bias ? p.bias[o] : 0.f);
        for (int b0 = 0; b0 < p.batch; b0 += group) {
            const int nb = std::min(group, p.batch - b0);
            for (int r0 = 0; r0 < J; r0 += chunk_rows) {
                const int r1 = std::min(J, r0 + chunk_rows), rows = r1 - r0;
                Conv1dParams c;
                c.x = p.x + std::size_t(b0) * std::size_t(Cin) * std::size_t(Lin);
                c.w = p.w;
                c.y = z;
                c.batch = nb;
                c.in_channels = Cin;
                c.out_channels = rows;
                c.in_length = c.out_length = Lin;
                c.kernel = 1;
                conv1d_packed_part(c, wp + std::size_t(r0 / W) * block_elems, tid, nth);
#pragma omp barrier
                share(r0 / K, (r1 + K - 1) / K, oa, ob);
                for (int bb = 0; bb < nb; ++bb)
                    for (int o = oa; o < ob; ++o) {
                        float* yo = p.y + (std::size_t(b0 + bb) * Cout + std::size_t(o)) * std::size_t(Lout);
                        for (int k = std::max(0, r0 - o * K); k < K && o * K + k < r1; ++k) {
                            const float* zr = z + (std::size_t(bb) * rows + std::size_t(o * K + k - r0)) * std::size_t(Lin);
                            for (int s = 0; s < Lin; ++s) {
                                const int t = s * p.stride - p.pad + k;
                                if (t >= 0 && t < Lout) yo[t] += zr[s];
                            }
                        }
                    }
#pragma omp barrier
            }
        }
    }
}

/// A Linear on weights packed like a kernel-1 Conv1d (Storage::StreamedMatrix): x [rows, in] is the conv input
/// [batch = rows, in, length 1] and y [rows, out] its output, so rows must be contiguous (ld_x = in, ld_y = out).
inline Conv1dParams linear_as_packed_conv(const LinearParams& p) {
    Conv1dParams c;
    c.x = p.x;
    c.w = p.w;
    c.bias = p.bias;
    c.y = p.y;
    c.batch = p.rows;
    c.in_channels = p.in;
    c.out_channels = p.out;
    c.in_length = c.out_length = 1;
    c.kernel = 1;
    return c;
}
#endif

#if defined(FLOWEDGE_CPU_BF16_MATH)
constexpr std::size_t round_up32(std::size_t n) { return (n + 31) / 32 * 32; }
/// BF16 elements of stack scratch for linear's BF16-rounded x rows (64 KiB).
inline constexpr std::size_t kLinearBhScratch = 32 * 1024;

/// Whether Ops<Cpu>::linear runs p on the vdpbf16ps kernels: MathMode::BF16 requested, rows longer than 8 (the
/// in <= 8 kernel is not multiply-bound, so it stays exact) and one BF16 x row fitting the stack scratch.
inline bool linear_uses_bf16(const LinearParams& p) {
    return p.math == MathMode::BF16 && p.in > 8 && round_up32(std::size_t(p.in)) <= kLinearBhScratch;
}

/// linear_impl under MathMode::BF16: x rows rounded to BF16 (RNE) into stack scratch, as many rows per pass as fit,
/// then the vdpbf16ps kernels with the same epilogues and the same OpenMP split over output rows.
template <class WT>
inline void linear_bf16_impl(const LinearParams& p, const WT* w) {
    const std::size_t ldx = p.ld_x ? std::size_t(p.ld_x) : std::size_t(p.in);
    const std::size_t ldy = p.ld_y ? std::size_t(p.ld_y) : std::size_t(p.out);
    const std::size_t ldb = round_up32(std::size_t(p.in));
    const bool act_after = p.act != Activation::None && !p.accumulate;
    const int rows_per = int(std::min<std::size_t>(std::size_t(p.rows), kLinearBhScratch / ldb));
    const bool par = double(p.rows) * p.in * p.out >= kParallelMacs;
    alignas(64) bf16 xb[kLinearBhScratch];
    for (int r0 = 0; r0 < p.rows; r0 += rows_per) {
        const int nr = std::min(rows_per, p.rows - r0);
        for (int r = 0; r < nr; ++r) round_to_bh(p.x + std::size_t(r0 + r) * ldx, p.in, xb + std::size_t(r) * ldb);
        LinearParams q = p;  // this pass's rows
        q.y = p.y + std::size_t(r0) * ldy;
        q.rows = nr;
        auto run = [&](int o0, int o1) {
            if (q.act == Activation::None || act_after) {
                LinearEpilogueVec ev{{q, ldy, act_after}};
                gemm_rows(w, std::size_t(q.in), xb, ldb, q.in, o0, o1, nr, ev);
            } else {
                LinearEpilogue epilogue{q, ldy, act_after};
                gemm_rows(w, std::size_t(q.in), xb, ldb, q.in, o0, o1, nr, epilogue);
            }
            if (act_after)
                for (int r = 0; r < nr; ++r) activate_inplace(q.act, q.y + std::size_t(r) * ldy + std::size_t(o0), o1 - o0);
        };
        if (!par) {
            run(0, q.out);
            continue;
        }
#pragma omp parallel
        {
            const int tid = thread_index(), nth = thread_count();
            const int units = (q.out + 15) / 16;
            const int o0 = std::min(q.out, 16 * int(std::int64_t(units) * tid / nth));
            const int o1 = std::min(q.out, 16 * int(std::int64_t(units) * (tid + 1) / nth));
            if (o0 < o1) run(o0, o1);
        }
    }
}

/// conv1d_impl under MathMode::BF16: the same passes, thread split and epilogue, but each im2col panel column is
/// rounded to BF16 (RNE) as it is built, with the reduction index i*K + k contiguous (the weight row's order, which
/// vdpbf16ps pairs along) and zeros up to a multiple of 32; BF16 halves the panel, so a pass takes twice the
/// input channels.
template <class WT>
inline void conv1d_bf16_impl(const Conv1dParams& p, const WT* w) {
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lout = p.out_length;
    const int N = p.batch * Lout;
    const std::size_t R = std::size_t(Cin) * std::size_t(K);
    constexpr std::size_t kPanelBh = 2 * kScratchFloats;  // BF16 elements in the same 256 KiB
    const int ns = std::min(N, 64);
    const std::size_t per_col = (kPanelBh / std::size_t(ns)) / 32 * 32;
    const int chunk_in = int(std::min<std::size_t>(std::size_t(Cin), per_col / std::size_t(K)));
    const bool par = double(N) * double(R) * Cout >= kParallelMacs;
#pragma omp parallel if (par)
    {
        alignas(64) bf16 panel[kPanelBh];
        const int tid = thread_index(), nth = thread_count();
        const int o0 = int(std::int64_t(Cout) * tid / nth), o1 = int(std::int64_t(Cout) * (tid + 1) / nth);
        for (int n0 = 0; n0 < N; n0 += ns) {
            const int nn = std::min(ns, N - n0);
            for (int i0 = 0; i0 < Cin; i0 += chunk_in) {
                const int ni = std::min(chunk_in, Cin - i0);
                const int len = ni * K;
                const std::size_t ldp = round_up32(std::size_t(len));
                for (int c = 0; c < nn; ++c) {
                    bf16* dst = panel + std::size_t(c) * ldp;
                    // Gathered 32 floats at a time, then rounded together (vcvtne2ps2bf16).
                    alignas(64) float tmp[32];
                    int fill = 0;
                    std::size_t at = 0;
                    im2col_column(p, n0 + c, i0, ni, [&](int, float v) {
                        tmp[fill++] = v;
                        if (fill == 32) {
                            _mm512_store_si512(dst + at, __m512i(vload_bh(tmp)));
                            at += 32;
                            fill = 0;
                        }
                    });
                    if (fill) _mm512_store_si512(dst + at, __m512i(vload_bh_n(tmp, fill)));
                }
                const bool first = i0 == 0;
                auto epilogue = [&](int o, int c, float v) { conv_out(p, n0 + c, o, v, first); };
                if (o0 < o1) gemm_rows(w + std::size_t(i0) * K, R, panel, ldp, len, o0, o1, nn, epilogue);
            }
        }
    }
}
#endif

template <class WT>
inline void conv_transpose1d_impl(const ConvTranspose1dParams& p, const WT* w) {
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lin = p.in_length, Lout = p.out_length;
    const std::size_t J = std::size_t(Cout) * std::size_t(K);
    // Passes cover whole batch elements (so every output is written in exactly one pass); the partial sums
    // Z[(b, s), (o, k)] = sum_i w[i, o, k] x[b, i, s] of an output-channel chunk live in the stack scratch.
    const int nb = std::max(1, std::min(p.batch, 64 / std::max(1, Lin)));
    const int ns = nb * Lin;
    const std::size_t per_col = (kScratchFloats / std::size_t(ns)) / 16 * 16;
    const int chunk_o = int(std::min<std::size_t>(std::size_t(Cout), per_col / std::size_t(K)));
    alignas(64) float z[kScratchFloats];
    [[maybe_unused]] const bool par = double(p.batch) * Lin * double(J) * Cin >= kParallelMacs;
#pragma omp parallel if (par)
    {
        const int tid = thread_index(), nth = thread_count();
        float xs[64 * 4];
        for (int b0 = 0; b0 < p.batch; b0 += nb) {
            const int nbb = std::min(nb, p.batch - b0);
            const int nn = nbb * Lin;
            for (int oA = 0; oA < Cout; oA += chunk_o) {
                const int no = std::min(chunk_o, Cout - oA);
                const int jlen = no * K;
                const std::size_t ldz = round_up16(std::size_t(jlen));
                const int units = (jlen + 15) / 16;
                const int j0 = std::min(jlen, 16 * int(std::int64_t(units) * tid / nth));
                const int j1 = std::min(jlen, 16 * int(std::int64_t(units) * (tid + 1) / nth));
                for (int c = 0; c < nn; ++c) std::fill(z + std::size_t(c) * ldz + j0, z + std::size_t(c) * ldz + j1, 0.f);
                if (j0 < j1) {
                    for (int i = 0; i < Cin; i += 4) {
                        const int g = std::min(4, Cin - i);
                        for (int c = 0; c < nn; ++c) {
                            const int b = b0 + c / Lin, s = c % Lin;
                            for (int gg = 0; gg < 4; ++gg)
                                xs[c * 4 + gg] = gg < g ? p.x[(std::size_t(b) * Cin + std::size_t(i + gg)) * Lin + s] : 0.f;
                        }
                        const WT* wr = w + std::size_t(i) * J + std::size_t(oA) * K;
                        switch (g) {
                            case 4: axpy_rows<4>(wr, J, xs, nn, z, ldz, j0, j1); break;
                            case 3: axpy_rows<3>(wr, J, xs, nn, z, ldz, j0, j1); break;
                            case 2: axpy_rows<2>(wr, J, xs, nn, z, ldz, j0, j1); break;
                            default: axpy_rows<1>(wr, J, xs, nn, z, ldz, j0, j1); break;
                        }
                    }
                }
#pragma omp barrier
                // col2im: y[b, o, t] = bias[o] + sum over k with t + pad - k = s*stride, 0 <= s < Lin.
#pragma omp for schedule(static)
                for (int o = oA; o < oA + no; ++o) {
                    const float bias = p.bias ? p.bias[o] : 0.f;
                    for (int bb = 0; bb < nbb; ++bb) {
                        float* yr = p.y + (std::size_t(b0 + bb) * Cout + std::size_t(o)) * Lout;
                        for (int t = 0; t < Lout; ++t) {
                            float acc = bias;
                            for (int k = 0; k < K; ++k) {
                                const int num = t + p.pad - k;
                                if (num < 0 || num % p.stride != 0) continue;
                                const int s = num / p.stride;
                                if (s >= Lin) continue;
                                acc += z[std::size_t(bb * Lin + s) * ldz + std::size_t(o - oA) * K + k];
                            }
                            yr[t] = acc;
                        }
                    }
                }
            }
        }
    }
}

}  // namespace cpu

/// Host backend: header-only, runs synchronously on the calling thread (plus OpenMP workers for the
/// large weight-streaming ops), never allocates. Stream arguments are ignored.
template <>
struct Ops<Cpu> {
    /// torch.nn.Linear with fused bias, activation and optional accumulate (see LinearParams).
    static void linear(const LinearParams& p, Stream = {}) {
        linear_checks(p);
        if (p.rows == 0) return;
        if (p.w.packed) {
            check_packed_linear(p);
#if defined(__AVX2__) || defined(__AVX512F__)
            if constexpr (cpu::kPackConvWeights) {
                cpu::with_weights(p.w, [&](auto w) { cpu::conv1d_packed_impl(cpu::linear_as_packed_conv(p), w); });
                if (p.act != Activation::None) cpu::activate_inplace(p.act, p.y, std::size_t(p.rows) * std::size_t(p.out));
                return;
            }
#endif
        }
#if defined(FLOWEDGE_CPU_BF16_MATH)
        if (cpu::linear_uses_bf16(p)) {
            cpu::with_weights(p.w, [&](auto w) { cpu::linear_bf16_impl(p, w); });
            return;
        }
#endif
        cpu::with_weights(p.w, [&](auto w) { cpu::linear_impl(p, w); });
    }

    /// linear()'s argument checks (sizes, strides, pointers when rows > 0).
    static void linear_checks(const LinearParams& p) {
        FLOWEDGE_CPU_REQUIRE(p.rows >= 0 && p.in > 0 && p.out > 0, "linear",
                             "bad sizes (expected rows >= 0, in > 0, out > 0, got rows " + std::to_string(p.rows) +
                                 ", in " + std::to_string(p.in) + ", out " + std::to_string(p.out) + ")");
        FLOWEDGE_CPU_REQUIRE((p.ld_x == 0 || p.ld_x >= p.in) && (p.ld_y == 0 || p.ld_y >= p.out), "linear",
                             "row stride shorter than the row" + expected_got("ld_x >= in and ld_y >= out",
                                                                              std::to_string(p.ld_x) + "/" + std::to_string(p.ld_y)));
        if (p.rows > 0) FLOWEDGE_CPU_REQUIRE(p.x && p.w.data && p.y, "linear", "null tensor pointer");
    }
    /// What a linear on packed weights (Storage::StreamedMatrix) supports: the kernel-1 Conv1d path, contiguous
    /// rows, no accumulate; every MathMode computes exactly there (as conv1d on packed weights).
    static void check_packed_linear(const LinearParams& p) {
        FLOWEDGE_CPU_REQUIRE(cpu::kPackConvWeights, "linear", "packed weights on a build without the packed kernels");
        FLOWEDGE_CPU_REQUIRE((p.ld_x == 0 || p.ld_x == p.in) && (p.ld_y == 0 || p.ld_y == p.out) && !p.accumulate, "linear",
                             "packed (streamed) weights need contiguous rows and no accumulate" +
                                 expected_got("ld_x = in, ld_y = out, accumulate off",
                                              std::to_string(p.ld_x) + "/" + std::to_string(p.ld_y) + "/" +
                                                  (p.accumulate ? "on" : "off")));
    }

    /// Several independent linears in one op (see LinearBatchParams): every item is validated first, then each runs
    /// through linear() in item order, so results equal the single op bit for bit.
    static void linear_batch(const LinearBatchParams& p, Stream s = {}) {
        check_linear_batch(p, "cpu linear_batch");
#if defined(__AVX2__) || defined(__AVX512F__)
        // Items on packed weights (the U-Net's FiLM projections at batch 1: each far below kParallelMacs, together
        // ~7.5 M multiply-adds of streamed weights) share one parallel region, every thread taking its blocks of
        // each item, instead of running one after another on one thread. Same kernel per output, same bits.
        if constexpr (cpu::kPackConvWeights) {
            double macs = 0;
            bool all_packed = p.n_items > 0;
            for (int i = 0; i < p.n_items; ++i) {
                const LinearParams& it = p.items[i];
                all_packed = all_packed && it.w.packed && it.rows > 0;
                macs += double(it.rows) * it.in * it.out;
            }
            if (all_packed && macs >= cpu::kParallelMacs) {
                for (int i = 0; i < p.n_items; ++i) {
                    linear_checks(p.items[i]);
                    check_packed_linear(p.items[i]);
                }
#pragma omp parallel
                {
                    const int tid = cpu::thread_index(), nth = cpu::thread_count();
                    for (int i = 0; i < p.n_items; ++i)
                        cpu::with_weights(p.items[i].w, [&](auto w) { cpu::conv1d_packed_part(cpu::linear_as_packed_conv(p.items[i]), w, tid, nth); });
                }
                for (int i = 0; i < p.n_items; ++i)
                    if (p.items[i].act != Activation::None)
                        cpu::activate_inplace(p.items[i].act, p.items[i].y, std::size_t(p.items[i].rows) * std::size_t(p.items[i].out));
                return;
            }
        }
#endif
        for (int i = 0; i < p.n_items; ++i) linear(p.items[i], s);
    }

    /// Device scratch a conv1d of p's shape may use under a non-F32 MathMode (Conv1dParams::scratch): none here,
    /// the CPU kernels build their panels in thread-local buffers.
    static std::size_t conv1d_scratch_bytes(const Conv1dParams&) { return 0; }
    /// Readies what MathMode m needs before graphs are recorded (the CUDA tensor-core GEMM library); nothing here.
    static void prepare_math(MathMode) {}

    /// torch.nn.Conv1d (groups 1, dilation 1, zero padding). x: [batch, in, in_length] -> y: [batch, out, out_length].
    static void conv1d(const Conv1dParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_length > 0 &&
                                 p.kernel > 0 && p.stride > 0 && p.pad >= 0,
                             "conv1d", "bad sizes (expected all positive, pad >= 0)");
        FLOWEDGE_CPU_REQUIRE(p.kernel <= 1024, "conv1d", "kernel too long" + expected_got("<= 1024", p.kernel));
        const int want = (p.in_length + 2 * p.pad - p.kernel) / p.stride + 1;
        FLOWEDGE_CPU_REQUIRE(p.in_length + 2 * p.pad >= p.kernel && p.out_length == want, "conv1d",
                             "out_length" + expected_got(want, p.out_length));
        FLOWEDGE_CPU_REQUIRE(p.x && p.w.data && p.y, "conv1d", "null tensor pointer");
        if (p.w.packed) {
            // Packed weights (Parameter<Cpu>, Storage::ConvWeight) exist only where this build streams them; every
            // MathMode runs the exact packed kernel (no BF16 arithmetic kernel exists on such builds).
#if defined(__AVX2__) || defined(__AVX512F__)
            if constexpr (cpu::kPackConvWeights) {
                cpu::with_weights(p.w, [&](auto w) { cpu::conv1d_packed_impl(p, w); });
                return;
            }
#endif
            fail("cpu conv1d", "packed weights on a build without the packed kernels");
        }
#if defined(FLOWEDGE_CPU_BF16_MATH)
        if (p.math == MathMode::BF16) {
            cpu::with_weights(p.w, [&](auto w) { cpu::conv1d_bf16_impl(p, w); });
            return;
        }
#endif
        cpu::with_weights(p.w, [&](auto w) { cpu::conv1d_impl(p, w); });
    }

    /// torch.nn.ConvTranspose1d (groups 1, dilation 1), weight [in, out, k]; output_padding = out_length - minimum.
    static void conv_transpose1d(const ConvTranspose1dParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_length > 0 &&
                                 p.kernel > 0 && p.stride > 0 && p.pad >= 0,
                             "conv_transpose1d", "bad sizes (expected all positive, pad >= 0)");
        const int lo = (p.in_length - 1) * p.stride - 2 * p.pad + p.kernel;
        FLOWEDGE_CPU_REQUIRE(lo > 0 && p.out_length >= lo && p.out_length < lo + p.stride, "conv_transpose1d",
                             "out_length" + expected_got("in [" + std::to_string(lo) + ", " + std::to_string(lo + p.stride - 1) + "]",
                                                         p.out_length));
        FLOWEDGE_CPU_REQUIRE(p.in_length * cpu::round_up16(std::size_t(p.kernel)) <= cpu::kScratchFloats,
                             "conv_transpose1d", "in_length * kernel too large for the stack scratch" +
                                                     expected_got("<= 65536 floats", p.in_length * p.kernel));
        FLOWEDGE_CPU_REQUIRE(p.x && p.w.data && p.y, "conv_transpose1d", "null tensor pointer");
        if (p.w.packed) {
            // Packed weights (Parameter<Cpu>, Storage::ConvTransposeWeight) exist only where this build streams them.
#if defined(__AVX2__) || defined(__AVX512F__)
            if constexpr (cpu::kPackConvWeights) {
                cpu::with_weights(p.w, [&](auto w) {
                    constexpr int W = cpu::kConvBlockWidth<std::remove_cvref_t<decltype(*w)>>;
                    FLOWEDGE_CPU_REQUIRE(std::size_t(p.in_length) * W <= cpu::kScratchFloats, "conv_transpose1d",
                                         "in_length too long for packed weights" +
                                             expected_got("<= " + std::to_string(cpu::kScratchFloats / W), p.in_length));
                    cpu::conv_transpose1d_packed_impl(p, w);
                });
                return;
            }
#endif
            fail("cpu conv_transpose1d", "packed weights on a build without the packed kernels");
        }
        cpu::with_weights(p.w, [&](auto w) { cpu::conv_transpose1d_impl(p, w); });
    }

    /// torch.nn.GroupNorm + fused act -> FiLM (scale * a + bias) -> residual epilogue. Statistics in double.
    static void group_norm(const GroupNormParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.batch > 0 && p.channels > 0 && p.length > 0 && p.groups > 0, "group_norm",
                             "bad sizes (expected all positive)");
        FLOWEDGE_CPU_REQUIRE(p.channels % p.groups == 0, "group_norm",
                             "channels not divisible by groups" + expected_got("multiple of " + std::to_string(p.groups), p.channels));
        FLOWEDGE_CPU_REQUIRE(p.x && p.y, "group_norm", "null tensor pointer");
        const int cpg = p.channels / p.groups, L = p.length;
        const std::size_t fstride = p.film_stride ? std::size_t(p.film_stride) : 2 * std::size_t(p.channels);
        const double count = double(cpg) * L;
        for (int b = 0; b < p.batch; ++b) {
            for (int g = 0; g < p.groups; ++g) {
                const std::size_t base = (std::size_t(b) * p.channels + std::size_t(g) * cpg) * L;
                const float* xg = p.x + base;
                const std::size_t n = std::size_t(cpg) * L;
                double sum = 0;
                for (std::size_t i = 0; i < n; ++i) sum += xg[i];
                const double mean = sum / count;
                double ss = 0;
                for (std::size_t i = 0; i < n; ++i) {
                    const double d = xg[i] - mean;
                    ss += d * d;
                }
                const float rstd = float(1.0 / std::sqrt(ss / count + double(p.eps)));
                const float meanf = float(mean);
                // Three passes over the group (contiguous in y): affine, activation over the whole group at once
                // (vectorised Mish: the U-Net's every GroupNorm), then FiLM and residual. y may alias x.
                for (int cc = 0; cc < cpg; ++cc) {
                    const int c = g * cpg + cc;
                    const float scale = p.gamma ? p.gamma[c] * rstd : rstd;
                    const float shift = p.beta ? p.beta[c] : 0.f;
                    const std::size_t off = base + std::size_t(cc) * L;
                    for (int t = 0; t < L; ++t) p.y[off + t] = (p.x[off + t] - meanf) * scale + shift;
                }
                cpu::activate_inplace(p.act, p.y + base, static_cast<long long>(n));
                if (p.film || p.residual) {
                    for (int cc = 0; cc < cpg; ++cc) {
                        const int c = g * cpg + cc;
                        float fs = 1.f, fb = 0.f;
                        if (p.film) {
                            fs = p.film[std::size_t(b) * fstride + std::size_t(c)];
                            fb = p.film[std::size_t(b) * fstride + std::size_t(p.channels) + std::size_t(c)];
                        }
                        const std::size_t off = base + std::size_t(cc) * L;
                        for (int t = 0; t < L; ++t) {
                            float a = p.y[off + t];
                            if (p.film) a = fs * a + fb;
                            if (p.residual) a += p.residual[off + t];
                            p.y[off + t] = a;
                        }
                    }
                }
            }
        }
    }

    /// Mamba RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, per row. x, y: [rows, dim].
    static void rms_norm(const RmsNormParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.rows >= 0 && p.dim > 0, "rms_norm", "bad sizes" + expected_got("dim > 0", p.dim));
        if (p.rows == 0) return;
        FLOWEDGE_CPU_REQUIRE(p.x && p.y, "rms_norm", "null tensor pointer");
        for (int r = 0; r < p.rows; ++r) {
            const float* x = p.x + std::size_t(r) * p.dim;
            float* y = p.y + std::size_t(r) * p.dim;
            double ss = 0;
            int i = 0;
#if defined(__AVX512F__)
            // Sum of squares in double, 8 lanes at a time (two chains); the scale pass 16 floats at a time.
            __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
            for (; i + 16 <= p.dim; i += 16) {
                const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
                s0 = _mm512_fmadd_pd(a, a, s0);
                s1 = _mm512_fmadd_pd(b, b, s1);
            }
            ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
#elif defined(__AVX2__) && defined(__FMA__)
            // Sum of squares in double, 4 lanes per chain, 4 chains (16 floats per step; the products are exact in
            // double, so only the order of the additions differs from the scalar loop).
            __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
            for (; i + 16 <= p.dim; i += 16) {
                const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
                const __m256d c = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
                s0 = _mm256_fmadd_pd(a, a, s0);
                s1 = _mm256_fmadd_pd(b, b, s1);
                s2 = _mm256_fmadd_pd(c, c, s2);
                s3 = _mm256_fmadd_pd(d, d, s3);
            }
            const __m256d s = _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3));
            const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
            ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
#endif
            for (; i < p.dim; ++i) ss += double(x[i]) * x[i];
            const float inv = float(1.0 / std::sqrt(ss / p.dim + double(p.eps)));
            i = 0;
#if defined(__AVX512F__)
            const __m512 vinv = _mm512_set1_ps(inv);
            for (; i + 16 <= p.dim; i += 16) {
                const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
                _mm512_storeu_ps(y + i, p.weight ? _mm512_mul_ps(v, _mm512_loadu_ps(p.weight + i)) : v);
            }
#elif defined(__AVX2__) && defined(__FMA__)
            // (x * inv) * weight, 8 floats at a time: the scalar loop's order.
            const __m256 vinv = _mm256_set1_ps(inv);
            for (; i + 8 <= p.dim; i += 8) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
                _mm256_storeu_ps(y + i, p.weight ? _mm256_mul_ps(v, _mm256_loadu_ps(p.weight + i)) : v);
            }
#endif
            for (; i < p.dim; ++i) y[i] = x[i] * inv * (p.weight ? p.weight[i] : 1.f);
        }
    }

    /// Elementwise y = act(x) (x may equal y).
    static void activation(const ActivationParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.n >= 0, "activation", "negative count" + expected_got(">= 0", p.n));
        if (p.n == 0) return;
        FLOWEDGE_CPU_REQUIRE(p.x && p.y, "activation", "null tensor pointer");
        if (p.x != p.y) std::memmove(p.y, p.x, std::size_t(p.n) * sizeof(float));
        cpu::activate_inplace(p.act, p.y, p.n);
    }

    /// Elementwise out = a*x + b*y (out may alias x or y; y may be null when b == 0).
    static void axpby(const AxpbyParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.n >= 0, "axpby", "negative count" + expected_got(">= 0", p.n));
        if (p.n == 0) return;
        FLOWEDGE_CPU_REQUIRE(p.x && p.out && (p.y || p.b == 0.f), "axpby", "null tensor pointer");
        if (p.b == 0.f || !p.y) {
            for (std::int64_t i = 0; i < p.n; ++i) p.out[i] = p.a * p.x[i];
        } else {
            for (std::int64_t i = 0; i < p.n; ++i) p.out[i] = p.a * p.x[i] + p.b * p.y[i];
        }
    }

    /// torch.cat([a, b], dim=1) for [batch, c, length] tensors.
    static void concat_channels(const ConcatParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.batch > 0 && p.ca >= 0 && p.cb >= 0 && p.length > 0, "concat_channels", "bad sizes");
        FLOWEDGE_CPU_REQUIRE(p.y && (p.a || p.ca == 0) && (p.b || p.cb == 0), "concat_channels", "null tensor pointer");
        const std::size_t na = std::size_t(p.ca) * p.length, nb = std::size_t(p.cb) * p.length;
        for (int b = 0; b < p.batch; ++b) {
            float* y = p.y + std::size_t(b) * (na + nb);
            if (na) std::memmove(y, p.a + std::size_t(b) * na, na * sizeof(float));
            if (nb) std::memmove(y + na, p.b + std::size_t(b) * nb, nb * sizeof(float));
        }
    }

    /// Sinusoidal time features: out[r] = [sin(t*f_i) | cos(t*f_i)], f_i = exp(-(i * (log_base / denom))) in float32.
    static void sinusoid(const SinusoidParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.rows >= 0 && p.half > 0, "sinusoid", "bad sizes" + expected_got("half > 0", p.half));
        if (p.rows == 0) return;
        FLOWEDGE_CPU_REQUIRE(p.out != nullptr, "sinusoid", "null tensor pointer");
        const float step = p.log_base / p.denom;
        for (int i = 0; i < p.half; ++i) {
            const float f = std::exp(float(i) * -step);
            const float arg = p.t * f;
            p.out[i] = std::sin(arg);
            p.out[p.half + i] = std::cos(arg);
        }
        for (int r = 1; r < p.rows; ++r)
            std::memcpy(p.out + std::size_t(r) * 2 * p.half, p.out, std::size_t(2 * p.half) * sizeof(float));
    }

    /// torch.nn.Embedding: y[r, :] = table[ids[r], :] widened to float (ids validated by the caller).
    static void embedding(const EmbeddingParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.rows >= 0 && p.dim > 0, "embedding", "bad sizes" + expected_got("dim > 0", p.dim));
        if (p.rows == 0) return;
        FLOWEDGE_CPU_REQUIRE(p.ids && p.table.data && p.y, "embedding", "null tensor pointer");
        cpu::with_weights(p.table, [&](auto table) {
            for (int r = 0; r < p.rows; ++r) {
                const auto* row = table + std::size_t(p.ids[r]) * p.dim;
                float* y = p.y + std::size_t(r) * p.dim;
                for (int i = 0; i < p.dim; ++i) y[i] = cpu::widen(row[i]);
            }
        });
    }

    /// Mamba causal depthwise conv + SiLU with a rolling (kernel-1)-row history in `state`.
    static void causal_conv(const CausalConvParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.length >= 0 && p.channels > 0 && p.kernel > 0, "causal_conv", "bad sizes");
        FLOWEDGE_CPU_REQUIRE(p.ld_x == 0 || p.ld_x >= p.channels, "causal_conv",
                             "row stride" + expected_got(">= channels", p.ld_x));
        if (p.length == 0) return;
        FLOWEDGE_CPU_REQUIRE(p.x && p.w.data && p.u && (p.state || p.kernel == 1), "causal_conv", "null tensor pointer");
        const int K = p.kernel, C = p.channels, L = p.length, H = K - 1;
        const std::size_t ldx = p.ld_x ? std::size_t(p.ld_x) : std::size_t(C);
        cpu::with_weights(p.w, [&](auto w) {
            for (int t = 0; t < L; ++t) {
                float* u = p.u + std::size_t(t) * C;
                int c0 = 0;
#if defined(__AVX512F__)
                // 16 channels at a time: tap k of channels c..c+15 gathered from the [C, K] weight, the
                // history/input rows read as vectors (same multiply-add order as the scalar loop below).
                if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(w)>>, float>) {
                    const __m512i lane_k = _mm512_mullo_epi32(
                        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(K));
                    for (; c0 + 16 <= C; c0 += 16) {
                        __m512 acc = p.bias ? _mm512_loadu_ps(p.bias + c0) : _mm512_setzero_ps();
                        if (K == 4) {
                            // The 16 x 4 weight block is 4 vectors; tap k of channels 0..7 comes from the first
                            // two, of channels 8..15 from the last two (two lane permutes and a 256-bit merge
                            // instead of a 16-element gather).
                            const float* wb = w + std::size_t(c0) * 4;
                            const __m512 a0 = _mm512_loadu_ps(wb), a1 = _mm512_loadu_ps(wb + 16);
                            const __m512 a2 = _mm512_loadu_ps(wb + 32), a3 = _mm512_loadu_ps(wb + 48);
                            for (int k = 0; k < 4; ++k) {
                                const int row = t + k;
                                const float* src = row < H ? p.state + std::size_t(row) * C + c0 : p.x + std::size_t(row - H) * ldx + c0;
                                const __m512i idx = _mm512_add_epi32(
                                    _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0), _mm512_set1_epi32(k));
                                const __m512 lo = _mm512_permutex2var_ps(a0, idx, a1), hi = _mm512_permutex2var_ps(a2, idx, a3);
                                const __m512 wk = _mm512_shuffle_f32x4(lo, hi, 0x44);
                                acc = _mm512_fmadd_ps(wk, _mm512_loadu_ps(src), acc);
                            }
                            _mm512_storeu_ps(u + c0, acc);
                            continue;
                        }
                        for (int k = 0; k < K; ++k) {
                            const int row = t + k;  // row of xx = [state ; x]
                            const float* src = row < H ? p.state + std::size_t(row) * C + c0 : p.x + std::size_t(row - H) * ldx + c0;
                            const __m512 wk = _mm512_i32gather_ps(lane_k, w + std::size_t(c0) * K + k, 4);
                            acc = _mm512_fmadd_ps(wk, _mm512_loadu_ps(src), acc);
                        }
                        _mm512_storeu_ps(u + c0, acc);
                    }
                }
#elif defined(__AVX2__) && defined(__FMA__)
                // 8 channels at a time (same multiply-add order as the scalar loop below).
                if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(w)>>, float>) {
                    const __m256i lane_k = _mm256_mullo_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_epi32(K));
                    for (; c0 + 8 <= C; c0 += 8) {
                        __m256 acc = p.bias ? _mm256_loadu_ps(p.bias + c0) : _mm256_setzero_ps();
                        if (K == 4) {
                            // The 8 x 4 weight block [c][k] as rows [c | c + 4] (128-bit halves), then a 4 x 4
                            // transpose in each half: wk[k] = tap k of channels 0..3 | 4..7 (12 shuffles, no gather).
                            const float* wb = w + std::size_t(c0) * 4;
                            __m256 r[4], wk[4];
                            for (int j = 0; j < 4; ++j)
                                r[j] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(wb + 4 * j)), _mm_loadu_ps(wb + 16 + 4 * j), 1);
                            const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
                            const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
                            wk[0] = _mm256_shuffle_ps(t0, t2, 0x44);
                            wk[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
                            wk[2] = _mm256_shuffle_ps(t1, t3, 0x44);
                            wk[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
                            for (int k = 0; k < 4; ++k) {
                                const int row = t + k;
                                const float* src = row < H ? p.state + std::size_t(row) * C + c0 : p.x + std::size_t(row - H) * ldx + c0;
                                acc = _mm256_fmadd_ps(wk[k], _mm256_loadu_ps(src), acc);
                            }
                            _mm256_storeu_ps(u + c0, acc);
                            continue;
                        }
                        for (int k = 0; k < K; ++k) {
                            const int row = t + k;  // row of xx = [state ; x]
                            const float* src = row < H ? p.state + std::size_t(row) * C + c0 : p.x + std::size_t(row - H) * ldx + c0;
                            const __m256 wk = _mm256_i32gather_ps(w + std::size_t(c0) * K + k, lane_k, 4);
                            acc = _mm256_fmadd_ps(wk, _mm256_loadu_ps(src), acc);
                        }
                        _mm256_storeu_ps(u + c0, acc);
                    }
                }
#endif
                for (int c = c0; c < C; ++c) {
                    float acc = p.bias ? p.bias[c] : 0.f;
                    for (int k = 0; k < K; ++k) {
                        const int row = t + k;  // row of xx = [state ; x]
                        const float v = row < H ? p.state[std::size_t(row) * C + c] : p.x[std::size_t(row - H) * ldx + c];
                        acc += cpu::widen(w[std::size_t(c) * K + k]) * v;
                    }
                    u[c] = acc;
                }
                cpu::activate_inplace(Activation::Silu, u, C);
            }
        });
        // New history: the last H rows of xx (shift the old state forward when fewer than H new rows came in).
        for (int j = 0; j < H; ++j) {
            const int row = L + j;  // row of xx
            float* dst = p.state + std::size_t(j) * C;
            if (row < H) std::memmove(dst, p.state + std::size_t(row) * C, std::size_t(C) * sizeof(float));
            else std::memcpy(dst, p.x + std::size_t(row - H) * ldx, std::size_t(C) * sizeof(float));
        }
    }

    /// Mamba-1 selective scan with D skip and SiLU(z) gate (see SelectiveScanParams), continuing from state.
    static void selective_scan(const SelectiveScanParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.length >= 0 && p.channels > 0 && p.d_state > 0, "selective_scan", "bad sizes");
        if (p.length == 0) return;
        FLOWEDGE_CPU_REQUIRE(p.u && p.dt && p.A && p.B && p.C && p.z && p.state && p.y, "selective_scan",
                             "null tensor pointer");
        const int C = p.channels, S = p.d_state;
        const std::size_t ldbc = p.ld_bc ? std::size_t(p.ld_bc) : std::size_t(S);
        const std::size_t ldz = p.ld_z ? std::size_t(p.ld_z) : std::size_t(C);
        for (int t = 0; t < p.length; ++t) {
            const float* Bt = p.B + std::size_t(t) * ldbc;
            const float* Ct = p.C + std::size_t(t) * ldbc;
            int c = 0;
#if defined(__AVX512F__)
            if (S == 16) {
                // 16 channels at a time: one vector of states per channel, the 16 C-weighted state vectors
                // reduced together (vsum16), then D skip and SiLU(z) gate as vectors.
                const __m512 vB = _mm512_loadu_ps(Bt), vC = _mm512_loadu_ps(Ct);
                for (; c + 16 <= C; c += 16) {
                    const std::size_t tc0 = std::size_t(t) * C + c;
                    __m512 prod[16];
                    for (int k = 0; k < 16; ++k) {
                        const float dtv = p.dt[tc0 + k];
                        float* st = p.state + std::size_t(c + k) * 16;
                        const __m512 decay = cpu::vexp(_mm512_mul_ps(_mm512_set1_ps(dtv), _mm512_loadu_ps(p.A + std::size_t(c + k) * 16)));
                        const __m512 sn = _mm512_fmadd_ps(decay, _mm512_loadu_ps(st), _mm512_mul_ps(_mm512_set1_ps(dtv * p.u[tc0 + k]), vB));
                        _mm512_storeu_ps(st, sn);
                        prod[k] = _mm512_mul_ps(sn, vC);
                    }
                    const __m512 uv = _mm512_loadu_ps(p.u + tc0);
                    const __m512 dv = p.D ? _mm512_loadu_ps(p.D + c) : _mm512_setzero_ps();
                    const __m512 yv = _mm512_fmadd_ps(dv, uv, cpu::vsum16(prod));
                    const __m512 g = cpu::vsilu(_mm512_loadu_ps(p.z + std::size_t(t) * ldz + c));
                    _mm512_storeu_ps(p.y + tc0, _mm512_mul_ps(yv, g));
                }
            }
#elif defined(__AVX2__) && defined(__FMA__)
            if (S == 16) {
                // 8 channels at a time, two vectors of states per channel: prod[k] = s_lo C_lo + s_hi C_hi (one
                // fma), then the 8 prod vectors summed lane-wise by a transpose-add tree whose additions are the
                // ones vsum makes for one vector ((l + l+4), then pairs), so each channel gets the bits of the
                // per-channel loop below; then D skip and SiLU(z) gate as vectors.
                const __m256 vB0 = _mm256_loadu_ps(Bt), vB1 = _mm256_loadu_ps(Bt + 8);
                const __m256 vC0 = _mm256_loadu_ps(Ct), vC1 = _mm256_loadu_ps(Ct + 8);
                for (; c + 8 <= C; c += 8) {
                    const std::size_t tc0 = std::size_t(t) * C + c;
                    __m256 prod[8];
                    for (int k = 0; k < 8; ++k) {
                        const float dtv = p.dt[tc0 + k];
                        const __m256 vdt = _mm256_set1_ps(dtv), vdu = _mm256_set1_ps(dtv * p.u[tc0 + k]);
                        float* st = p.state + std::size_t(c + k) * 16;
                        const float* a = p.A + std::size_t(c + k) * 16;
                        const __m256 d0 = cpu::vexp(_mm256_mul_ps(vdt, _mm256_loadu_ps(a)));
                        const __m256 d1 = cpu::vexp(_mm256_mul_ps(vdt, _mm256_loadu_ps(a + 8)));
                        const __m256 s0 = _mm256_fmadd_ps(d0, _mm256_loadu_ps(st), _mm256_mul_ps(vdu, vB0));
                        const __m256 s1 = _mm256_fmadd_ps(d1, _mm256_loadu_ps(st + 8), _mm256_mul_ps(vdu, vB1));
                        _mm256_storeu_ps(st, s0);
                        _mm256_storeu_ps(st + 8, s1);
                        prod[k] = _mm256_fmadd_ps(s1, vC1, _mm256_mul_ps(s0, vC0));
                    }
                    // h[k] = [lanes l + l+4 of prod[k] | of prod[k+4]] (l = 0..3), then pairs within 128-bit halves.
                    __m256 h[4];
                    for (int k = 0; k < 4; ++k)
                        h[k] = _mm256_add_ps(_mm256_permute2f128_ps(prod[k], prod[k + 4], 0x20),
                                             _mm256_permute2f128_ps(prod[k], prod[k + 4], 0x31));
                    const __m256 q01 = _mm256_add_ps(_mm256_unpacklo_ps(h[0], h[1]), _mm256_unpackhi_ps(h[0], h[1]));
                    const __m256 q23 = _mm256_add_ps(_mm256_unpacklo_ps(h[2], h[3]), _mm256_unpackhi_ps(h[2], h[3]));
                    const __m256 sum = _mm256_add_ps(_mm256_shuffle_ps(q01, q23, 0x44), _mm256_shuffle_ps(q01, q23, 0xEE));
                    const __m256 uv = _mm256_loadu_ps(p.u + tc0);
                    const __m256 dv = p.D ? _mm256_loadu_ps(p.D + c) : _mm256_setzero_ps();
                    const __m256 yv = _mm256_fmadd_ps(dv, uv, sum);
                    const __m256 g = cpu::vsilu(_mm256_loadu_ps(p.z + std::size_t(t) * ldz + c));
                    _mm256_storeu_ps(p.y + tc0, _mm256_mul_ps(yv, g));
                }
            }
#endif
            for (; c < C; ++c) {
                const std::size_t tc = std::size_t(t) * C + c;
                const float dtv = p.dt[tc], uv = p.u[tc];
                const float du = dtv * uv;
                float* s = p.state + std::size_t(c) * S;
                const float* a = p.A + std::size_t(c) * S;
                float acc = 0.f;
                int n = 0;
#if defined(__AVX512F__)
                __m512 vacc = _mm512_setzero_ps();
                const __m512 vdt = _mm512_set1_ps(dtv), vdu = _mm512_set1_ps(du);
                for (; n + 16 <= S; n += 16) {
                    const __m512 decay = cpu::vexp(_mm512_mul_ps(vdt, _mm512_loadu_ps(a + n)));
                    const __m512 sn = _mm512_fmadd_ps(decay, _mm512_loadu_ps(s + n), _mm512_mul_ps(vdu, _mm512_loadu_ps(Bt + n)));
                    _mm512_storeu_ps(s + n, sn);
                    vacc = _mm512_fmadd_ps(sn, _mm512_loadu_ps(Ct + n), vacc);
                }
                acc = _mm512_reduce_add_ps(vacc);
#elif defined(__AVX2__) && defined(__FMA__)
                if (S >= 8) {
                    __m256 vacc = _mm256_setzero_ps();
                    const __m256 vdt = _mm256_set1_ps(dtv), vdu = _mm256_set1_ps(du);
                    for (; n + 8 <= S; n += 8) {
                        const __m256 decay = cpu::vexp(_mm256_mul_ps(vdt, _mm256_loadu_ps(a + n)));
                        const __m256 sn = _mm256_fmadd_ps(decay, _mm256_loadu_ps(s + n), _mm256_mul_ps(vdu, _mm256_loadu_ps(Bt + n)));
                        _mm256_storeu_ps(s + n, sn);
                        vacc = _mm256_fmadd_ps(sn, _mm256_loadu_ps(Ct + n), vacc);
                    }
                    acc = cpu::vsum(vacc);
                }
#endif
                for (; n < S; ++n) {
                    const float sn = std::exp(dtv * a[n]) * s[n] + du * Bt[n];
                    s[n] = sn;
                    acc += sn * Ct[n];
                }
                const float d = p.D ? p.D[c] : 0.f;
                p.y[tc] = (acc + d * uv) * cpu::silu(p.z[std::size_t(t) * ldz + c]);
            }
        }
    }

    /// One DDIM/DDPM update of x: [batch, per_sample] given eps (SPEC 1.4); DDPM noise by global draw index.
    static void diffusion_step(const DiffusionStepParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.batch > 0 && p.per_sample >= 0, "diffusion_step", "bad sizes");
        FLOWEDGE_CPU_REQUIRE(p.x && p.eps, "diffusion_step", "null tensor pointer");
        const std::uint64_t seed0 = p.seed_ptr ? *p.seed_ptr : p.seed;
        const bool noise = p.kind == StepKind::Ddpm && p.noise_std != 0.f;
        for (int b = 0; b < p.batch; ++b) {
            float* x = p.x + std::size_t(b) * p.per_sample;
            const float* e = p.eps + std::size_t(b) * p.per_sample;
            for (int i = 0; i < p.per_sample; ++i) {
                float x0 = (x[i] - p.sqrt_one_minus_abar * e[i]) / p.sqrt_abar;
                if (p.clip) x0 = std::min(std::max(x0, -p.clip_range), p.clip_range);
                if (p.kind == StepKind::Ddim) {
                    x[i] = p.c_x0 * x0 + p.c_other * e[i];
                } else {
                    float v = p.c_x0 * x0 + p.c_other * x[i];
                    if (noise) v += p.noise_std * normal_at(seed0 + std::uint64_t(b), p.draw_offset + std::uint64_t(i));
                    x[i] = v;
                }
            }
        }
    }

    /// MIN_MAX un-normalisation y = (x + 1) / 2 * (max - min) + min per column. x, y: [rows, dim].
    static void unnormalize(const UnnormalizeParams& p, Stream = {}) {
        FLOWEDGE_CPU_REQUIRE(p.rows >= 0 && p.dim > 0, "unnormalize", "bad sizes");
        if (p.rows == 0) return;
        FLOWEDGE_CPU_REQUIRE(p.x && p.y && p.min && p.max, "unnormalize", "null tensor pointer");
        for (int r = 0; r < p.rows; ++r)
            for (int d = 0; d < p.dim; ++d) {
                const std::size_t i = std::size_t(r) * p.dim + d;
                p.y[i] = (p.x[i] + 1.f) / 2.f * (p.max[d] - p.min[d]) + p.min[d];
            }
    }
};

}  // namespace flowedge
FLOWEDGE_SIMD_WARNINGS_ON
