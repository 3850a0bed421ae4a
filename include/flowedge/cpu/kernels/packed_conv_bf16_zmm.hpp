// Exact Conv1d on the AVX2 set's BF16 blocks (packed_conv.hpp) with 512-bit vectors (AVX-512 set).
//
// Why: the AVX2 kernel widens and multiplies 256-bit vectors, half of what a core with two 512-bit FMA ports
// (Sapphire/Emerald Rapids) retires per instruction, so the FMA-bound L = 8/16 convs of the U-Net ran at about half
// the machine's multiply-add rate. The blocks are the same bytes (the BF16-math and AMX kernels read them too); two
// 24-output blocks (A, B) are streamed side by side so that their 48 outputs per step fill three 512-bit vectors:
// v0 = A outputs 0..15, v1 = B outputs 0..15, v2 = A outputs 16..23 | B outputs 16..23. Per step pair (j, j+1):
// v0 and v1 come from each block's first 64 bytes by one zero-masked vpermw per step (BF16 value -> high half of its
// float, exact), v2 from the two blocks' last 32 bytes joined in one register, then a shift (step j) or an and-mask
// (step j+1), as in the AVX2 kernel. Each output lane sums the same products in the same order as the AVX2 kernel
// (fresh accumulators per kPackChunk slice, FMA per step in j, slice added to the running total, same epilogue), so
// the results are bit-identical to it for any thread count. An odd block left over for a thread runs alone (v1 idle).
// Batch-1 passes at stride 1 also build the im2col panel with one masked vector load per row (im2col_rows) instead of
// one scalar gather per value, which every thread repeats. Timings: bench/results/diffusion_cpu_bf16_zmm.md.
#if FLOWEDGE_ISA_AVX512

namespace packed_bf16_zmm {
namespace avx2 = ::flowedge::cpu::avx2;

inline constexpr int kWidth = avx2::kConvBlockWidth<bf16>;  // 24 outputs per block
/// Columns per micro-kernel call: 3 accumulators each (24 at 8) beside the widened weights, the broadcast and the
/// permutation indices. 8 rather than 6: L = 8 then streams its weights in one column group instead of two, and
/// L = 16 in two instead of three (each group re-widens the slice).
inline constexpr int kMaxCols = 8;

/// vpermw indices that put step j's (lo) or step j+1's (hi) 16 outputs of a block's first 64 bytes into the high
/// halves of 16 floats: slot l (l < 8) of a step holds output l in its low half and output 8 + l in its high half;
/// slots [0, 8) are step j, [8, 16) step j+1. Only odd words are kept (zero-masked with 0xAAAAAAAA).
alignas(64) inline constexpr std::uint16_t kStepWords[2][32] = {
    {0, 0,  0, 2,  0, 4,  0, 6,  0, 8,  0, 10, 0, 12, 0, 14, 0, 1,  0, 3,  0, 5,  0, 7,  0, 9,  0, 11, 0, 13, 0, 15},
    {0, 16, 0, 18, 0, 20, 0, 22, 0, 24, 0, 26, 0, 28, 0, 30, 0, 17, 0, 19, 0, 21, 0, 23, 0, 25, 0, 27, 0, 29, 0, 31}};

/// acc[v][c] += w_v[j] * x[j*ldx + c] for j in [0, n), sequentially in j (n even, or odd: the last pair half-used).
/// wa, wb: blocks A and B at the same (even) step; kTwo false: A alone (acc[1] untouched, v2's high lanes zero).
/// pf: bytes ahead of wa / wb that each step pair prefetches (its two lines per block).
template <int NC, bool kTwo>
inline void pair_steps(const bf16* wa, const bf16* wb, const float* x, std::size_t ldx, int n, std::ptrdiff_t pf,
                       __m512 (&acc)[3][NC]) {
    const __m512i idx_j = _mm512_load_si512(kStepWords[0]);
    const __m512i idx_j1 = _mm512_load_si512(kStepWords[1]);
    const __m512i high = _mm512_set1_epi32(std::int32_t(0xFFFF0000u));
    constexpr __mmask32 kOdd = 0xAAAAAAAAu;
    auto step = [&acc](__m512 v0, __m512 v1, __m512 v2, const float* xj) {
        for (int c = 0; c < NC; ++c) {
            const __m512 b = _mm512_set1_ps(xj[c]);
            acc[0][c] = _mm512_fmadd_ps(v0, b, acc[0][c]);
            if constexpr (kTwo) acc[1][c] = _mm512_fmadd_ps(v1, b, acc[1][c]);
            acc[2][c] = _mm512_fmadd_ps(v2, b, acc[2][c]);
        }
    };
    auto tail_slots = [&](const bf16* a, const bf16* b) {
        __m512i r = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32)));
        if constexpr (kTwo) r = _mm512_inserti64x4(r, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)), 1);
        return r;
    };
    // Step j of the pair at wa / wb, and step j + 1 unless the pair is the last, half-used one.
    auto pair = [&](bool second) __attribute__((always_inline)) {
        const __m512i ra = _mm512_loadu_si512(wa);
        const __m512i rb = kTwo ? _mm512_loadu_si512(wb) : ra;
        const __m512i rc = tail_slots(wa, wb);
        step(_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(kOdd, idx_j, ra)),
             _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(kOdd, idx_j, rb)),
             _mm512_castsi512_ps(_mm512_slli_epi32(rc, 16)), x);
        if (second)
            step(_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(kOdd, idx_j1, ra)),
                 _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(kOdd, idx_j1, rb)),
                 _mm512_castsi512_ps(_mm512_and_si512(rc, high)), x + ldx);
    };
    int j = 0;
    for (; j + 2 <= n; j += 2, wa += 2 * kWidth, wb += 2 * kWidth, x += 2 * ldx) {
        __builtin_prefetch(reinterpret_cast<const char*>(wa) + pf, 0, 3);
        __builtin_prefetch(reinterpret_cast<const char*>(wa) + pf + 64, 0, 3);
        if constexpr (kTwo) {
            __builtin_prefetch(reinterpret_cast<const char*>(wb) + pf, 0, 3);
            __builtin_prefetch(reinterpret_cast<const char*>(wb) + pf + 64, 0, 3);
        }
        pair(true);
    }
    if (j < n) pair(false);
}

/// tot_a / tot_b[c*24 + o] += blocks A / B x panel columns [c0, c0 + NC) over n steps (fresh accumulators, then
/// added, as avx2::packed_chunk does per block); pf as in pair_steps.
template <int NC, bool kTwo>
inline void chunk(const bf16* wa, const bf16* wb, const float* x, std::size_t ldx, int n, std::ptrdiff_t pf, int c0,
                  float* tot_a, float* tot_b) {
    __m512 acc[3][NC];
    for (int v = 0; v < 3; ++v)
        for (int c = 0; c < NC; ++c) acc[v][c] = _mm512_setzero_ps();
    pair_steps<NC, kTwo>(wa, wb, x + c0, ldx, n, pf, acc);
    for (int c = 0; c < NC; ++c) {
        float* ta = tot_a + std::size_t(c0 + c) * kWidth;
        _mm512_storeu_ps(ta, _mm512_add_ps(_mm512_loadu_ps(ta), acc[0][c]));
        const __m256 a_hi = _mm256_add_ps(_mm256_loadu_ps(ta + 16), _mm512_castps512_ps256(acc[2][c]));
        _mm256_storeu_ps(ta + 16, a_hi);
        if constexpr (kTwo) {
            float* tb = tot_b + std::size_t(c0 + c) * kWidth;
            _mm512_storeu_ps(tb, _mm512_add_ps(_mm512_loadu_ps(tb), acc[1][c]));
            const __m256 b_hi = _mm256_add_ps(_mm256_loadu_ps(tb + 16), _mm512_extractf32x8_ps(acc[2][c], 1));
            _mm256_storeu_ps(tb + 16, b_hi);
        }
    }
}

template <bool kTwo>
inline void chunk_n(int nc, const bf16* wa, const bf16* wb, const float* x, std::size_t ldx, int n, std::ptrdiff_t pf, int c0,
                    float* tot_a, float* tot_b) {
    switch (nc) {
        case 1: chunk<1, kTwo>(wa, wb, x, ldx, n, pf, c0, tot_a, tot_b); return;
        case 2: chunk<2, kTwo>(wa, wb, x, ldx, n, pf, c0, tot_a, tot_b); return;
        case 3: chunk<3, kTwo>(wa, wb, x, ldx, n, pf, c0, tot_a, tot_b); return;
        case 4: chunk<4, kTwo>(wa, wb, x, ldx, n, pf, c0, tot_a, tot_b); return;
        case 5: chunk<5, kTwo>(wa, wb, x, ldx, n, pf, c0, tot_a, tot_b); return;
        case 6: chunk<6, kTwo>(wa, wb, x, ldx, n, pf, c0, tot_a, tot_b); return;
        case 7: chunk<7, kTwo>(wa, wb, x, ldx, n, pf, c0, tot_a, tot_b); return;
        case 8: chunk<8, kTwo>(wa, wb, x, ldx, n, pf, c0, tot_a, tot_b); return;
        default: break;
    }
    __builtin_unreachable();
}

/// Whether a pass's panel columns [n0, n0 + nn) are one batch element's whole output row at stride 1 with at most 16
/// columns (the U-Net's stride-1 convs at batch 1): then panel row j = i*K + k is input row i0 + i shifted by k - pad
/// with zeros past its ends, one masked vector load (im2col_rows), instead of nn scalar gathers.
inline bool whole_row_panel(const Conv1dParams& p, int n0, int nn) {
    return p.stride == 1 && n0 % p.out_length == 0 && nn == p.out_length && nn <= 16;
}

/// The [j][column] panel of im2col_column for a whole_row_panel pass (the same values): panel[(i*K + k)*nn + t] =
/// x[b, i0 + i, t + k - pad], zero where that leaves the row. Masked-off lanes are neither read nor written.
inline void im2col_rows(const Conv1dParams& p, int b, int i0, int ni, int nn, float* panel) {
    const int K = p.kernel, Lin = p.in_length;
    const __mmask16 cols = __mmask16((1u << nn) - 1u);
    for (int i = 0; i < ni; ++i) {
        const float* xr = p.x + (std::size_t(b) * std::size_t(p.in_channels) + std::size_t(i0 + i)) * std::size_t(Lin);
        for (int k = 0; k < K; ++k) {
            const int shift = k - p.pad;  // t + shift must lie in [0, Lin)
            const int lo = std::max(0, -shift), hi = std::min(nn, Lin - shift);
            const __mmask16 valid = hi > lo ? __mmask16(((1u << hi) - 1u) & ~((1u << lo) - 1u)) : __mmask16(0);
            const __m512 v = _mm512_maskz_loadu_ps(valid, xr + shift);
            _mm512_mask_storeu_ps(panel + std::size_t(i * K + k) * std::size_t(nn), cols, v);
        }
    }
}

/// Prefetch distances of the step loop: the first column group of a slice runs kPackPrefetchBytes ahead (as the AVX2
/// kernel); later groups (L = 8/16 at batch 1) one whole slice ahead (kPackChunk steps of a block).
inline constexpr std::ptrdiff_t kFirstGroupPrefetch = avx2::kPackPrefetchBytes;
inline constexpr std::ptrdiff_t kLaterGroupPrefetch = std::ptrdiff_t(avx2::kPackChunk) * kWidth * std::ptrdiff_t(sizeof(bf16));

/// avx2::conv1d_packed_part on BF16 blocks: the same passes, input-channel chunks, thread split (output blocks
/// [blocks*tid/nth, blocks*(tid+1)/nth)), slices and epilogue order; this thread's blocks are streamed two at a time.
inline void conv1d_part(const Conv1dParams& p, const bf16* wp, int tid, int nth) {
    constexpr int W = kWidth;
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lout = p.out_length;
    const int N = p.batch * Lout;
    const std::size_t R = std::size_t(Cin) * std::size_t(K), block_steps = avx2::packed_conv_steps<bf16>(R);
    const int blocks = (Cout + W - 1) / W;
    constexpr int kCols = avx2::kPackedPassCols;
    const auto [ns, chunk_in] = avx2::packed_conv_passes<bf16>(p);
    alignas(64) float panel[kScratchFloats];
    alignas(64) float tot[2][kCols * W];
    const int b0 = int(std::int64_t(blocks) * tid / nth), b1 = int(std::int64_t(blocks) * (tid + 1) / nth);
    if (b0 == b1) return;
    for (int n0 = 0; n0 < N; n0 += ns) {
        const int nn = std::min(ns, N - n0);
        const int groups = (nn + kMaxCols - 1) / kMaxCols;
        for (int i0 = 0; i0 < Cin; i0 += chunk_in) {
            const int ni = std::min(chunk_in, Cin - i0);
            const int len = ni * K;
            if (whole_row_panel(p, n0, nn)) im2col_rows(p, n0 / Lout, i0, ni, nn, panel);
            else
                for (int c = 0; c < nn; ++c)
                    im2col_column(p, n0 + c, i0, ni, [&](int j, float v) { panel[std::size_t(j) * nn + c] = v; });
            const bool first = i0 == 0;
            for (int ob = b0; ob < b1; ob += 2) {
                const bool two = ob + 1 < b1;
                std::fill(tot[0], tot[0] + std::size_t(nn) * W, 0.f);
                if (two) std::fill(tot[1], tot[1] + std::size_t(nn) * W, 0.f);
                const bf16* wa = wp + (std::size_t(ob) * block_steps + std::size_t(i0) * K) * W;
                const bf16* wb = wa + block_steps * W;
                for (int j0 = 0; j0 < len; j0 += avx2::kPackChunk) {
                    const int n = std::min(avx2::kPackChunk, len - j0);
                    for (int g = 0, c0 = 0; g < groups; ++g) {
                        const int c1 = nn * (g + 1) / groups;
                        const std::size_t at = std::size_t(j0) * W;
                        // The first column group streams the slice from memory, the others re-read it from L1: they
                        // prefetch the next slice (one slice ahead), so the stream continues while they compute.
                        const std::ptrdiff_t pf = g == 0 ? kFirstGroupPrefetch : kLaterGroupPrefetch;
                        if (two) chunk_n<true>(c1 - c0, wa + at, wb + at, panel + std::size_t(j0) * nn, std::size_t(nn), n, pf, c0, tot[0], tot[1]);
                        // One block: B is never read, but its pointer still steps with A's (null + offset is UB).
                        else chunk_n<false>(c1 - c0, wa + at, wa + at, panel + std::size_t(j0) * nn, std::size_t(nn), n, pf, c0, tot[0], tot[1]);
                        c0 = c1;
                    }
                }
                for (int h = 0; h < (two ? 2 : 1); ++h) {
                    const int o0 = (ob + h) * W, o1 = std::min(Cout, o0 + W);
                    for (int c = 0; c < nn; ++c)
                        for (int o = o0; o < o1; ++o) conv_out(p, n0 + c, o, tot[h][std::size_t(c) * W + std::size_t(o - o0)], first);
                }
            }
        }
    }
}

/// Whether exact BF16 blocks run here: on Intel cores, whose two 512-bit FMA ports are what this kernel feeds; other
/// AVX-512 cores (Zen 4 splits 512-bit operations in halves) keep the AVX2 set's 256-bit kernel. FLOWEDGE_CPU_BF16_YMM=1
/// keeps the 256-bit kernel everywhere (A/B runs), FLOWEDGE_CPU_BF16_ZMM=1 takes this one on any AVX-512 CPU.
inline bool enabled() {
    static const bool on = !::flowedge::cpu::env_is("FLOWEDGE_CPU_BF16_YMM", "1") &&
                           (__builtin_cpu_is("intel") || ::flowedge::cpu::env_is("FLOWEDGE_CPU_BF16_ZMM", "1"));
    return on;
}

/// Columns (batch x out_length) up to which Conv1d runs this exact kernel on BF16 blocks under MathMode::BF16 too
/// (conv1d.hpp): there the weights stream faster through it than through the AMX / vdpbf16ps kernels.
inline constexpr int kExactBf16MaxCols = 4;

/// Conv1d on exact BF16 blocks, split by output blocks over the threads as avx2::conv1d_packed_impl does.
inline void conv1d(const Conv1dParams& p, const bf16* wp) {
    [[maybe_unused]] const bool par =
        double(p.batch) * p.out_length * double(p.in_channels) * p.kernel * p.out_channels >= kParallelMacs;
#pragma omp parallel if (par)
    conv1d_part(p, wp, thread_index(), thread_count());
}

}  // namespace packed_bf16_zmm

#endif
