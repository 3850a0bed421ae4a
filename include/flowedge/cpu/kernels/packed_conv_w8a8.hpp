// WeightQuant::W8A8 Conv1d: the block layout (made at load, shared with the AVX-512 set's vpdpbusd and AMX kernels in
// packed_conv_dot.hpp / amx_conv.hpp), the per-column activation quantisation, and the AVX2 set's kernel for CPUs
// without AVX512_VNNI.
//   Blocks of 32 outputs x steps in quads ([block][quad][output][4] signed bytes, R padded with zero steps to a
//   multiple of 4), then the block's 32 F32 weight scales and 32 int32 row sums sum_j q[o][j]. Per call each im2col
//   column c is quantised over its own range [m_c, M_c] to `levels` + 1 unsigned steps, u = round((x - m_c) / s_c)
//   with s_c = (M_c - m_c) / levels, so x ~ m_c + s_c u; the integer sums of u * q are exact, and the output is
//   s_w[o] * (s_c * sum + m_c * rowsum[o]).
//   AVX2 has no vpdpbusd: vpmaddubsw multiplies unsigned by signed bytes and adds each pair into a saturating int16,
//   then vpmaddwd by ones adds the two int16 of a quad into int32. Two products of 255 * 127 would saturate; with u
//   in [0, 127] (kAvx2Levels) a pair is at most 2 * 127 * 127 = 32258, so every sum stays exact, at half the
//   activation resolution of the VNNI kernels (levels 255).
#if FLOWEDGE_ISA_AVX2

namespace w8a8 {

inline constexpr int kWidth = 32;  // outputs per block
/// Activation levels of this set's kernel (see the file comment) and of the AVX-512 set's vpdpbusd / tdpbusd kernels.
inline constexpr float kAvx2Levels = 127.f;
inline constexpr float kVnniLevels = 255.f;

/// Steps per block row: R padded to whole quads.
constexpr std::size_t steps(std::size_t R) { return (R + 3) / 4 * 4; }
/// Bytes of one block: the quads, then 32 F32 scales and 32 int32 row sums.
constexpr std::size_t block_bytes(std::size_t R) { return std::size_t(kWidth) * steps(R) + kWidth * (sizeof(float) + sizeof(std::int32_t)); }
constexpr std::size_t bytes(int out, std::size_t R) { return std::size_t((out + kWidth - 1) / kWidth) * block_bytes(R); }
/// The longest reduction W8A8 blocks take: no int32 overflow of a sum of steps(R) products |q| <= 127 times u <= 255
/// (127 * 255 * 65536 < 2^31).
inline constexpr std::size_t kMaxSteps = 65536;

/// W8A8 blocks of w ([out, R] row-major, any stored dtype), each row quantised as the INT8 blocks are (quantise_row).
/// dst: bytes(out, R) bytes. Load time only.
template <class T>
inline void pack(const T* w, int out, std::size_t R, std::int8_t* dst) {
    constexpr int W = kWidth;
    const std::size_t R4 = steps(R);
    std::vector<std::int8_t> row(R);
    for (int b = 0; b * W < out; ++b) {
        std::int8_t* db = dst + std::size_t(b) * block_bytes(R);
        std::fill(db, db + block_bytes(R), std::int8_t(0));
        float scales[W] = {};
        std::int32_t sums[W] = {};
        for (int l = 0; l < W && b * W + l < out; ++l) {
            scales[l] = quantise_row(w + std::size_t(b * W + l) * R, R, b * W + l, row.data());
            for (std::size_t j = 0; j < R; ++j) {
                db[(j / 4) * 4 * W + std::size_t(l) * 4 + j % 4] = row[j];
                sums[l] += row[j];
            }
        }
        std::memcpy(db + R4 * W, scales, sizeof(scales));
        std::memcpy(db + R4 * W + sizeof(scales), sums, sizeof(sums));
    }
}

/// The quantisation of one im2col column to `levels` + 1 steps: its range [lo, hi] gives scale = (hi - lo) / levels
/// and offset min = lo, and a value v becomes round((v - lo) * inv) clamped to [0, levels]. A non-finite column gets
/// NaN scale and offset (its outputs are NaN, as the exact kernels would give non-finite ones).
struct ColumnQuant {
    float scale, min, inv, lo;
};
inline ColumnQuant column_quant(const Conv1dParams& p, int col, float levels) {
    float lo = INFINITY, hi = -INFINITY;
    bool finite = true;
    im2col_column(p, col, 0, p.in_channels, [&](int, float v) {
        finite = finite && std::isfinite(v);
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    });
    return {finite ? (hi - lo) / levels : __builtin_nanf(""), finite ? lo : __builtin_nanf(""),
            finite && hi > lo ? levels / (hi - lo) : 0.f, lo};
}

/// Columns [c0, c1) of one pass of the quad panel ([quad][column], 4 unsigned bytes each; nn columns from n0):
/// quantised to `levels` + 1 steps, with their scales and offsets in xscale / xmin. R padded to whole quads with zeros
/// (their weights are zero too).
inline void quantise_columns(const Conv1dParams& p, int n0, int nn, int c0, int c1, float levels, std::uint32_t* panel,
                             float* xscale, float* xmin) {
    const std::size_t R = std::size_t(p.in_channels) * std::size_t(p.kernel), R4 = steps(R);
    auto* ub = reinterpret_cast<std::uint8_t*>(panel);
    for (int c = c0; c < c1; ++c) {
        const ColumnQuant cq = column_quant(p, n0 + c, levels);
        xscale[c] = cq.scale;
        xmin[c] = cq.min;
        auto put = [&](std::size_t j, std::uint8_t u) { ub[((j / 4) * std::size_t(nn) + std::size_t(c)) * 4 + j % 4] = u; };
        im2col_column(p, n0 + c, 0, p.in_channels, [&](int j, float v) {
            put(std::size_t(j), std::uint8_t(std::clamp(std::nearbyint((v - cq.lo) * cq.inv), 0.f, levels)));
        });
        for (std::size_t j = R; j < R4; ++j) put(j, 0);
    }
}

/// A block's dequantisation operands: its per-output weight scales and row sums, the pass's column scales and
/// offsets (output = wscale[o] * (xscale[c] * dot + xmin[c] * rowsum[o])).
struct BlockScales {
    const float* wscale;
    const std::int32_t* rowsum;
    const float* xscale;
    const float* xmin;
};

/// The operands of block wb (R4 padded steps: its scales and row sums follow the quads) with a pass's column scales.
inline BlockScales block_scales(const std::int8_t* wb, std::size_t R4, const float* xscale, const float* xmin) {
    const std::int8_t* tail = wb + R4 * kWidth;
    return {reinterpret_cast<const float*>(tail), reinterpret_cast<const std::int32_t*>(tail + kWidth * sizeof(float)), xscale, xmin};
}

/// Column c's kWidth block outputs from its int32 sums: wscale[o] * (xscale[c] * dot[o] + xmin[c] * rowsum[o]), one
/// fused multiply-add and two products in this order, so that every W8A8 kernel (vpmaddubsw, vpdpbusd, tdpbusd) turns
/// the same sums into the same bits.
inline void dequantise(const std::int32_t* dot, const BlockScales& s, int c, float* out) {
    for (int o = 0; o < kWidth; ++o)
        out[o] = std::fma(float(dot[o]), s.xscale[c], float(s.rowsum[o]) * s.xmin[c]) * s.wscale[o];
}

/// The pass and block loops of the W8A8 kernels on the [quad][column] panel (this set's and the AVX-512 set's
/// vpdpbusd kernel): the threads quantise a pass of up to 64 whole columns to `levels` + 1 steps into a shared panel
/// (one barrier), then each streams its own output blocks, whole. block(wb, panel, nn, quads, scales, emit) computes
/// block wb's kWidth outputs for the pass's nn columns and calls emit(c, out) with column c's (out[l]: output
/// o0 + l). R = in_channels * kernel <= kMaxSteps (checked at load). Deterministic for any thread count (integer
/// sums, one epilogue per output).
template <class Block>
inline void conv1d_passes(const Conv1dParams& p, const std::int8_t* wp, float levels, Block&& block) {
    constexpr int W = kWidth;
    const int Cout = p.out_channels, N = p.batch * p.out_length;
    const std::size_t R = std::size_t(p.in_channels) * std::size_t(p.kernel), R4 = steps(R), Q = R4 / 4;
    const int blocks = (Cout + W - 1) / W;
    const int ns = int(std::min<std::size_t>({std::size_t(N), 64, kScratchFloats / Q}));
    [[maybe_unused]] const bool par = double(N) * double(R) * Cout >= kParallelMacs;
    alignas(64) std::uint32_t panel[kScratchFloats];  // shared: [quad][column], 4 unsigned bytes round((x - m_c) / s_c)
    alignas(64) float xscale[64], xmin[64];
#pragma omp parallel if (par)
    panel_passes(
        N, ns, blocks,
        [&](int n0, int nn, int c0, int c1) { quantise_columns(p, n0, nn, c0, c1, levels, panel, xscale, xmin); },
        [&](int n0, int nn, int b0, int b1) {
            for (int ob = b0; ob < b1; ++ob) {
                const std::int8_t* wb = wp + std::size_t(ob) * block_bytes(R);
                const BlockScales scales = block_scales(wb, R4, xscale, xmin);
                const int o0 = ob * W, o1 = std::min(Cout, o0 + W);
                block(wb, panel, nn, Q, scales, [&](int c, const float* out) {
                    for (int o = o0; o < o1; ++o) conv_out(p, n0 + c, o, out[o - o0], true);
                });
            }
        });
}

/// Columns per micro-kernel call: 4 x NC int32 accumulators, the broadcast, the ones and a product within the 16 ymm
/// registers (the weight loads fold into vpmaddubsw).
inline constexpr int kMaxCols = 3;

/// acc[v][c] = sum over `quads` step quads of the block's weights (vector v: outputs 8v .. 8v + 7) x column c's
/// activation quad. wq: the block's quads (rows of 128 bytes, streamed whole); x: the quad panel, [quad][column].
template <int NC>
inline void quads(const std::int8_t* wq, const std::uint32_t* x, int nn, std::size_t n_quads, __m256i (&out)[4][NC]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4][NC];  // local, so that the accumulators stay in registers across the loads
    for (int v = 0; v < 4; ++v)
        for (int c = 0; c < NC; ++c) acc[v][c] = _mm256_setzero_si256();
    for (std::size_t q = 0; q < n_quads; ++q, wq += 4 * kWidth, x += nn) {
        __builtin_prefetch(wq + kPackPrefetchBytes, 0, 3);
        __builtin_prefetch(wq + kPackPrefetchBytes + 64, 0, 3);
        for (int c = 0; c < NC; ++c) {
            const __m256i a = _mm256_set1_epi32(int(x[c]));
            for (int v = 0; v < 4; ++v) {
                const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 32 * v));
                acc[v][c] = _mm256_add_epi32(acc[v][c], _mm256_madd_epi16(_mm256_maddubs_epi16(a, w), ones));
            }
        }
    }
    for (int v = 0; v < 4; ++v)
        for (int c = 0; c < NC; ++c) out[v][c] = acc[v][c];
}

/// Conv1d on W8A8 blocks with activations of kAvx2Levels + 1 steps (conv1d_passes), up to kMaxCols columns per
/// stream of a block's quads.
inline void conv1d(const Conv1dParams& p, const std::int8_t* wp) {
    auto block = [](const std::int8_t* wb, const std::uint32_t* panel, int nn, std::size_t Q, const BlockScales& s,
                    auto&& emit) {
        for (int c0 = 0, groups = (nn + kMaxCols - 1) / kMaxCols, g = 0; g < groups; ++g) {
            const int c1 = nn * (g + 1) / groups;  // column groups of at most kMaxCols, as even as possible
            auto run = [&](auto cols) {
                constexpr int NC = decltype(cols)::value;
                __m256i acc[4][NC];
                quads<NC>(wb, panel + c0, nn, Q, acc);
                for (int c = 0; c < NC; ++c) {
                    alignas(32) std::int32_t dot[kWidth];
                    alignas(32) float out[kWidth];
                    for (int v = 0; v < 4; ++v) _mm256_store_si256(reinterpret_cast<__m256i*>(dot + 8 * v), acc[v][c]);
                    dequantise(dot, s, c0 + c, out);
                    emit(c0 + c, out);
                }
            };
            switch (c1 - c0) {
                case 1: run(std::integral_constant<int, 1>{}); break;
                case 2: run(std::integral_constant<int, 2>{}); break;
                default: run(std::integral_constant<int, 3>{}); break;
            }
            c0 = c1;
        }
    };
    conv1d_passes(p, wp, kAvx2Levels, block);
}

}  // namespace w8a8

#endif  // FLOWEDGE_ISA_AVX2
