// Conv1d on packed blocks with dot-product instructions (AVX-512 set): two opt-in arithmetic modes that round the
// activations, for twice (BF16) or four times (INT8) the multiply-adds per instruction of the exact packed kernels
// (packed_conv.hpp), which widen every weight to F32 and use F32 FMAs.
//   MathMode::BF16 on BF16 blocks (AVX512_BF16): the AVX2 set's BF16 blocks as stored (24 outputs, steps in pairs);
//     per step pair one vpermw turns their first 64 bytes into 16 (step j, step j+1) weight pairs, one per output, and
//     the last 32 bytes already are pairs for outputs 16..23; vdpbf16ps multiplies them by the column's BF16-rounded
//     activation pair (x[j], x[j+1]), F32 accumulation.
//   WeightQuant::W8A8 (AVX512_VNNI; the layout and an AVX2 kernel are in packed_conv_w8a8.hpp): blocks of 32 outputs
//     x steps in quads, made at load ([block][quad][output][4]
//     signed bytes, R padded with zero steps to a multiple of 4), then the block's 32 F32 weight scales and 32 int32
//     row sums sum_j q[o][j]. Per call each im2col column c is quantised over its own range [m_c, M_c] to unsigned
//     bytes (what vpdpbusd takes), u = round((x - m_c) / s_c) with s_c = (M_c - m_c) / 255, so x ~ m_c + s_c u;
//     vpdpbusd sums u * q in int32 (exact), and the output is s_w[o] * (s_c * sum + m_c * rowsum[o]). The full 8 bits
//     over the column's range: twice the resolution of a symmetric scale for one-signed columns (after Mish), the
//     same for symmetric ones, and a constant column is exact.
// Both keep whole im2col columns of the reduction (in_channels * kernel) on the calling thread's stack per pass, so
// every output is one sum over its whole row: the column scale of W8A8 spans the row, and the BF16 sums are added to
// a running total in pieces of kPackChunk steps like the exact kernels. The threads build that panel together
// (columns split, one barrier), since rounding or quantising it costs about a fifth of a batch-1 sample at one
// thread, then each streams its own output blocks. Deterministic for any thread count.
#if FLOWEDGE_ISA_AVX512

namespace packed_dot {
namespace avx2 = ::flowedge::cpu::avx2;

/// Panel bytes per pass (the same 256 KiB of stack as the exact kernels' F32 panel).
inline constexpr std::size_t kPanelWords = kScratchFloats;
/// Columns per micro-kernel call: 2 accumulators each, plus weights and the broadcast, within 32 registers.
inline constexpr int kMaxCols = 8;

/// Calls chunk(c0, nc) for column groups of at most kMaxCols covering [0, nn), as even as possible.
template <class F>
inline void column_groups(int nn, F&& chunk) {
    const int groups = (nn + kMaxCols - 1) / kMaxCols;
    for (int g = 0, c0 = 0; g < groups; ++g) {
        const int c1 = nn * (g + 1) / groups;
        chunk(c0, c1 - c0);
        c0 = c1;
    }
}

// ---- MathMode::BF16 on the AVX2 set's BF16 blocks ----------------------------------------------------------------

inline constexpr int kBhWidth = avx2::kConvBlockWidth<bf16>;  // 24 outputs per block
static_assert(kBhWidth == 24, "the vpermw pairing below reads the AVX2 set's 3 x 8-lane BF16 blocks");

/// Word t of the vpermw result (lane t / 2, step t % 2) from the block's first 64 bytes: output m < 8 is the low
/// half of slot m (step j) and of slot 8 + m (step j + 1); output 8 + l the high halves of slots l and 8 + l.
inline __m512i bh_pair_index() {
    alignas(64) std::uint16_t idx[32];
    for (int t = 0; t < 32; ++t) {
        const int m = t / 2, step = t % 2;
        idx[t] = std::uint16_t(m < 8 ? 16 * step + 2 * m : 16 * step + 2 * (m - 8) + 1);
    }
    return _mm512_load_si512(idx);
}

/// out0[c] (outputs 0..15) and out1[c] (outputs 16..23) = the block's weights x column c's activation pairs over
/// `pairs` step pairs. wp: the block at an even step; x: the pair panel at that pair, [pair][column], nn columns.
/// (Sums start at zero: out0 / out1 are written, not added to.)
template <int NC>
inline void bh_pairs(const bf16* wp, const std::uint32_t* x, int nn, int pairs, __m512i idx, __m512 (&out0)[NC],
                     __m256 (&out1)[NC]) {
    __m512 acc0[NC];  // local, so that the accumulators stay in registers across the loads
    __m256 acc1[NC];
    for (int c = 0; c < NC; ++c) acc0[c] = _mm512_setzero_ps(), acc1[c] = _mm256_setzero_ps();
    for (int q = 0; q < pairs; ++q, wp += 2 * kBhWidth, x += nn) {
        __builtin_prefetch(reinterpret_cast<const char*>(wp) + avx2::kPackPrefetchBytes, 0, 3);
        __builtin_prefetch(reinterpret_cast<const char*>(wp) + avx2::kPackPrefetchBytes + 64, 0, 3);
        const __m512bh w01 = __m512bh(_mm512_permutexvar_epi16(idx, _mm512_loadu_si512(wp)));
        const __m256bh w2 = __m256bh(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 32)));
        for (int c = 0; c < NC; ++c) {
            const __m512i b = _mm512_set1_epi32(int(x[c]));
            acc0[c] = _mm512_dpbf16_ps(acc0[c], w01, __m512bh(b));
            acc1[c] = _mm256_dpbf16_ps(acc1[c], w2, __m256bh(_mm512_castsi512_si256(b)));
        }
    }
    for (int c = 0; c < NC; ++c) out0[c] = acc0[c], out1[c] = acc1[c];
}

/// Pairs of the reduction one pass keeps for a Conv1d of p's shape, or 0 where one column does not fit the panel.
inline std::size_t bh_pairs_per_column(const Conv1dParams& p) {
    const std::size_t pairs = (std::size_t(p.in_channels) * std::size_t(p.kernel) + 1) / 2;
    return pairs <= kPanelWords ? pairs : 0;
}

/// Conv1d under MathMode::BF16 on BF16 blocks (see the file comment). Needs bh_pairs_per_column(p) > 0.
inline void conv1d_bh(const Conv1dParams& p, const bf16* wp) {
    constexpr int W = kBhWidth;
    const int Cout = p.out_channels, N = p.batch * p.out_length;
    const std::size_t R = std::size_t(p.in_channels) * std::size_t(p.kernel), P = bh_pairs_per_column(p);
    const std::size_t block_elems = std::size_t(W) * avx2::packed_conv_steps<bf16>(R);
    const int blocks = (Cout + W - 1) / W;
    const int ns = int(std::min<std::size_t>({std::size_t(N), 64, kPanelWords / P}));
    constexpr int kSlicePairs = avx2::kPackChunk / 2;
    [[maybe_unused]] const bool par = double(N) * double(R) * Cout >= kParallelMacs;
    alignas(64) std::uint32_t panel[kPanelWords];  // shared: [pair][column], BF16(x[2i]) | BF16(x[2i + 1]) << 16
#pragma omp parallel if (par)
    {
        alignas(64) float tot[64 * W];
        const __m512i idx = bh_pair_index();
        panel_passes(
            N, ns, blocks,
            [&](int n0, int nn, int c0, int c1) {
                for (int c = c0; c < c1; ++c) {
                    // An even step sets its slot (an odd R's last pair keeps a zero second half), an odd one adds its half.
                    im2col_column(p, n0 + c, 0, p.in_channels, [&](int j, float v) {
                        std::uint32_t& slot = panel[std::size_t(j / 2) * nn + std::size_t(c)];
                        const std::uint32_t h = to_bf16(v).bits;
                        slot = j % 2 ? (slot & 0xFFFFu) | (h << 16) : h;
                    });
                }
            },
            [&](int n0, int nn, int b0, int b1) {
                for (int ob = b0; ob < b1; ++ob) {
                    std::fill(tot, tot + std::size_t(nn) * W, 0.f);
                    const bf16* wb = wp + std::size_t(ob) * block_elems;
                    for (std::size_t q0 = 0; q0 < P; q0 += kSlicePairs) {
                        const int n = int(std::min<std::size_t>(kSlicePairs, P - q0));
                        column_groups(nn, [&](int c0, int nc) {
                            with_cols(nc, [&](auto cols) {
                                constexpr int NC = decltype(cols)::value;
                                __m512 acc0[NC];
                                __m256 acc1[NC];
                                bh_pairs<NC>(wb + q0 * 2 * W, panel + q0 * std::size_t(nn) + std::size_t(c0), nn, n, idx, acc0, acc1);
                                for (int c = 0; c < NC; ++c) {
                                    float* t = tot + std::size_t(c0 + c) * W;
                                    _mm512_storeu_ps(t, _mm512_add_ps(_mm512_loadu_ps(t), acc0[c]));
                                    _mm256_storeu_ps(t + 16, _mm256_add_ps(_mm256_loadu_ps(t + 16), acc1[c]));
                                }
                            });
                        });
                    }
                    const int o0 = ob * W, o1 = std::min(Cout, o0 + W);
                    for (int c = 0; c < nn; ++c)
                        for (int o = o0; o < o1; ++o) conv_out(p, n0 + c, o, tot[std::size_t(c) * W + std::size_t(o - o0)], true);
                }
            });
    }
}

// ---- WeightQuant::W8A8 --------------------------------------------------------------------------------------------

// The block layout is the AVX2 set's (packed_conv_w8a8.hpp), which also runs W8A8 where there is no VNNI.
inline constexpr int kW8Width = avx2::w8a8::kWidth;
constexpr std::size_t w8a8_steps(std::size_t R) { return avx2::w8a8::steps(R); }
constexpr std::size_t w8a8_block_bytes(std::size_t R) { return avx2::w8a8::block_bytes(R); }

/// out[v][c] = sum over `quads` step quads of the block's weights (vector v: outputs 16v..16v+15) x column c's
/// activation quad (4 unsigned bytes). wq: the block's quads; x: the quad panel, [quad][column], nn columns.
template <int NC>
__attribute__((target("avx512vnni"))) inline void w8a8_quads(const std::int8_t* wq, const std::uint32_t* x, int nn,
                                                              std::size_t quads, __m512i (&out)[2][NC]) {
    __m512i acc[2][NC];  // local, so that the accumulators stay in registers across the loads
    for (int v = 0; v < 2; ++v)
        for (int c = 0; c < NC; ++c) acc[v][c] = _mm512_setzero_si512();
    for (std::size_t q = 0; q < quads; ++q, wq += 4 * kW8Width, x += nn) {
        __builtin_prefetch(wq + avx2::kPackPrefetchBytes, 0, 3);
        __builtin_prefetch(wq + avx2::kPackPrefetchBytes + 64, 0, 3);
        const __m512i w0 = _mm512_loadu_si512(wq), w1 = _mm512_loadu_si512(wq + 64);
        for (int c = 0; c < NC; ++c) {
            const __m512i a = _mm512_set1_epi32(int(x[c]));
            acc[0][c] = _mm512_dpbusd_epi32(acc[0][c], a, w0);
            acc[1][c] = _mm512_dpbusd_epi32(acc[1][c], a, w1);
        }
    }
    for (int v = 0; v < 2; ++v)
        for (int c = 0; c < NC; ++c) out[v][c] = acc[v][c];
}

/// W8A8's quantisation of one im2col column for vpdpbusd: 256 steps (u in [0, 255]) over its range.
using ColumnQuant = avx2::w8a8::ColumnQuant;
inline ColumnQuant column_quant(const Conv1dParams& p, int col) {
    return avx2::w8a8::column_quant(p, col, avx2::w8a8::kVnniLevels);
}

/// Conv1d on W8A8 blocks (see the file comment; avx2::w8a8::conv1d_passes at kVnniLevels), up to
/// kMaxCols columns per stream of a block's quads.
inline void conv1d_w8a8(const Conv1dParams& p, const std::int8_t* wp) {
    auto block = [](const std::int8_t* wb, const std::uint32_t* panel, int nn, std::size_t Q,
                    const avx2::w8a8::BlockScales& s, auto&& emit) {
        column_groups(nn, [&](int c0, int nc) {
            with_cols(nc, [&](auto cols) {
                constexpr int NC = decltype(cols)::value;
                __m512i acc[2][NC];
                w8a8_quads<NC>(wb, panel + c0, nn, Q, acc);
                for (int c = 0; c < NC; ++c) {
                    alignas(64) std::int32_t dot[kW8Width];
                    alignas(64) float out[kW8Width];
                    for (int v = 0; v < 2; ++v) _mm512_store_si512(dot + 16 * v, acc[v][c]);
                    avx2::w8a8::dequantise(dot, s, c0 + c, out);
                    emit(c0 + c, out);
                }
            });
        });
    };
    avx2::w8a8::conv1d_passes(p, wp, avx2::w8a8::kVnniLevels, block);
}

}  // namespace packed_dot

#endif  // FLOWEDGE_ISA_AVX512
