// Conv1d on AMX tiles (AVX-512 set, on CPUs with AMX whose tile state Linux granted: cpu::amx_bf16_available(),
// cpu::amx_int8_available()): the two dot-product modes of packed_conv_dot.hpp, and MathMode::BF16 on INT8 weight-only
// blocks (no vector kernel: widening int8 to BF16 costs about what vdpbf16ps would save over the F32 FMAs), on the
// same packed blocks and panels of rounded / quantised activations, with one tile instruction doing 16 columns x 16
// outputs x 32 (BF16) or 64 (INT8) reduction steps where vdpbf16ps / vpdpbusd do 16 outputs x 2 or 4 steps. At batch
// 1 the U-Net's convs are bound by the FMA ports on the vector kernels; on tiles they are bound by the weight stream.
//   Tiles (palette 1): C accumulators 0-3 (column tile 0: outputs [0, 16) and [16, W); column tile 1 the same), A
//   (activations: up to 16 columns x 64 bytes of one reduction tile) 4 and 7 for column tiles 0 and 1, B (weights:
//   16 rows of 64 / 32 bytes) 5 and 6 for the two output groups. Up to 32 columns per pass; each thread configures
//   its tiles (ldtilecfg) per pass and releases them (tilerelease) at the end of the call.
//   MathMode::BF16 on BF16 blocks (24 outputs, steps in pairs): the A tile is a row of the column-major panel of BF16
//     activation pairs (16 pairs = 32 steps per tile); per step pair the block's first 64 bytes go through the same
//     vpermw as the vector kernel into one 64-byte B row (outputs 0..15) and its last 32 bytes already are the B row
//     of outputs 16..23, both into a small L1 buffer that is tile-loaded (double-buffered). Each output is summed in
//     tdpbf16ps chains of 128 steps (4 tiles), stored and added to a running total: the same order and depth as the
//     vector kernel (docs/numerics.md, CPU BF16 bound).
//   MathMode::BF16 on INT8 weight-only blocks (16 outputs, one signed byte per step): the BF16 pair panel above; per
//     step pair the block's two 16-byte steps are widened (int8 -> int32 -> float, whose high half is the exact BF16)
//     into one 64-byte B row in the L1 buffer, so the stream stays 1 byte per weight. Two blocks per pass share each A
//     tile (B tiles 5 and 6). Sums as for BF16 blocks, then each output's total times its row scale (the INT8 kernel's
//     epilogue).
//   W8A8 (blocks of 32 outputs, steps in quads): a W8A8 block row of one quad is 128 bytes (outputs 0..15, 16..31),
//     so the two B tiles load in place with a 128-byte stride (16 quads = 64 steps per tile; the last, partial tile
//     through a zero-padded buffer); the activation panel holds each column's unsigned bytes contiguously. tdpbusd
//     sums u * q in int32, exactly, so results are bit-identical to the vpdpbusd kernel.
// The compiler does not see tile registers: every tile instruction below is volatile assembly with a memory clobber
// where it reads or writes memory, so the buffers it uses are written before and read after it. No target attribute
// is needed (the assembler knows the instructions), and the code runs only where isa.hpp found AMX.
#if FLOWEDGE_ISA_AVX512

namespace packed_dot::amx {

/// The 64 bytes ldtilecfg reads: palette 1, then bytes per row and rows of each tile (unused tiles 0 x 0).
struct alignas(64) TileConfig {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

#define FLOWEDGE_TILE_LOAD(t, base, stride) \
    asm volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base), "r"(long(stride)) : "memory")
#define FLOWEDGE_TILE_STORE(t, base, stride) \
    asm volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base), "r"(long(stride)) : "memory")
#define FLOWEDGE_TILE_ZERO(t) asm volatile("tilezero %%tmm" #t ::)
#define FLOWEDGE_TILE_DPBF16PS(c, a, b) asm volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define FLOWEDGE_TILE_DPBUSD(c, a, b) asm volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

inline void load_config(const TileConfig& c) { asm volatile("ldtilecfg %0" ::"m"(c) : "memory"); }
inline void release_tiles() { asm volatile("tilerelease" ::: "memory"); }

/// Zeroes the accumulator tiles: 0 and 1 (columns 0..15 of the pass), with `lower` also 2 and 3 (columns 16..31).
inline void zero_accumulators(bool lower) {
    FLOWEDGE_TILE_ZERO(0);
    FLOWEDGE_TILE_ZERO(1);
    if (lower) {
        FLOWEDGE_TILE_ZERO(2);
        FLOWEDGE_TILE_ZERO(3);
    }
}
/// Stores the accumulator tiles into c, [column][w] 4-byte sums (tiles 1 / 3 at output 16, tiles 2 / 3 at column 16).
template <class T>
inline void store_accumulators(T* c, int w, bool lower) {
    static_assert(sizeof(T) == 4, "tdpbf16ps / tdpbusd accumulate 4-byte sums");
    FLOWEDGE_TILE_STORE(0, c, w * 4);
    FLOWEDGE_TILE_STORE(1, c + 16, w * 4);
    if (lower) {
        FLOWEDGE_TILE_STORE(2, c + 16 * w, w * 4);
        FLOWEDGE_TILE_STORE(3, c + 16 * w + 16, w * 4);
    }
}

/// Columns per pass: two column tiles of 16.
inline constexpr int kMaxCols = 32;

/// The tiles of one pass over nn <= kMaxCols columns; c1_bytes: bytes per row of the second output group (BF16:
/// 8 outputs x 4 = 32; W8A8: 16 x 4 = 64).
inline TileConfig pass_config(int nn, int c1_bytes) {
    TileConfig t;
    auto set = [&t](int i, int rows, int colsb) {
        t.rows[i] = std::uint8_t(rows);
        t.colsb[i] = std::uint16_t(colsb);
    };
    const int m0 = std::min(nn, 16), m1 = nn - m0;
    set(0, m0, 64), set(1, m0, c1_bytes), set(4, m0, 64), set(5, 16, 64), set(6, 16, c1_bytes);
    if (m1 > 0) set(2, m1, 64), set(3, m1, c1_bytes), set(7, m1, 64);
    return t;
}

/// Rows of 4-byte pairs / quads per reduction tile, and reduction tiles per 128-step slice of the BF16 sums
/// (avx2::kPackChunk, the vector kernel's slice).
inline constexpr int kTileRows = 16;
inline constexpr int kSliceTiles = avx2::kPackChunk / (2 * kTileRows);

// ---- MathMode::BF16 on BF16 blocks -------------------------------------------------------------------------------

/// Columns per pass and panel row length (pairs, whole reduction tiles) of conv1d_bh_amx.
struct BhPlan {
    int ns;
    std::size_t pairs, ld;
};
/// The plan for p, or ns = 0 where one panel row does not fit (then the vector kernel runs).
inline BhPlan bh_plan(const Conv1dParams& p) {
    const std::size_t pairs = (std::size_t(p.in_channels) * std::size_t(p.kernel) + 1) / 2;
    const std::size_t ld = (pairs + kTileRows - 1) / kTileRows * kTileRows;
    const std::size_t fit = ld <= kPanelWords ? kPanelWords / ld : 0;
    return {int(std::min<std::size_t>({std::size_t(p.batch) * std::size_t(p.out_length), std::size_t(kMaxCols), fit})), pairs, ld};
}

/// The driver of the BF16-panel kernels (conv1d_bh_amx, conv1d_int8_bh_amx): the plan, one panel on this stack
/// shared by the team, and each thread's part (its panel columns, then its output blocks).
template <class T>
inline void bh_parallel(const Conv1dParams& p, const T* wp,
                        void (*part)(const Conv1dParams&, const T*, std::uint32_t*, const BhPlan&)) {
    const BhPlan pl = bh_plan(p);
    [[maybe_unused]] const bool par = double(p.batch) * p.out_length * double(p.in_channels) * p.kernel * p.out_channels >= kParallelMacs;
    alignas(64) std::uint32_t panel[kPanelWords];  // shared: [column][pair], BF16(x[2i]) | BF16(x[2i + 1]) << 16
#pragma omp parallel if (par)
    part(p, wp, panel, pl);
}

/// Columns [c0, c1) of the BF16 pair panel of the pass at column n0: row c is column n0 + c in reduction order (pair
/// q = elements 2q, 2q + 1), rounded 32 at a time (vcvtne2ps2bf16), zeros after it up to ld pairs. The A tiles of
/// conv1d_bh_amx and conv1d_int8_bh_amx.
inline void bh_panel_columns(const Conv1dParams& p, int n0, std::uint32_t* panel, std::size_t ld, int c0, int c1) {
    for (int c = c0; c < c1; ++c) {
        bf16* row = reinterpret_cast<bf16*>(panel + std::size_t(c) * ld);
        alignas(64) float tmp[32];
        int fill = 0;
        std::size_t at = 0;
        im2col_column(p, n0 + c, 0, p.in_channels, [&](int, float v) {
            tmp[fill++] = v;
            if (fill == 32) {
                store_bh_n(row + at, tmp, 32);
                at += 32;
                fill = 0;
            }
        });
        if (fill) store_bh_n(row + at, tmp, fill), at += 32;
        std::fill(row + at, row + 2 * ld, bf16{});
    }
}

/// This thread's share of conv1d_bh_amx: its panel columns, then its output blocks. panel: shared, [column][ld pairs].
inline void bh_part(const Conv1dParams& p, const bf16* wp, std::uint32_t* panel, const BhPlan& pl) {
    constexpr int W = kBhWidth;
    const int Cout = p.out_channels, N = p.batch * p.out_length;
    const std::size_t P = pl.pairs, ld = pl.ld, tiles = ld / kTileRows;
    const std::size_t block_elems = std::size_t(W) * 2 * P;
    const int blocks = (Cout + W - 1) / W;
    alignas(64) std::uint32_t blo[2][kTileRows * 16], bhi[2][kTileRows * 8];  // B rows: outputs 0..15, 16..23
    alignas(64) float slice[kMaxCols * W], tot[kMaxCols * W];
    const __m512i idx = bh_pair_index();
    auto columns = [&](int n0, int, int c0, int c1) { bh_panel_columns(p, n0, panel, ld, c0, c1); };
    panel_passes(N, pl.ns, blocks, columns, [&](int n0, int nn, int b0, int b1) {
        if (b0 == b1) return;
        const int m1 = nn - 16;
        const long lda = long(ld * sizeof(std::uint32_t));
        const TileConfig cfg = pass_config(nn, 8 * 4);
        load_config(cfg);
        // Tile t's B rows into buffer t % 2: per step pair, the vpermw of the vector kernel gives the 64-byte row of
        // outputs 0..15; the last 32 bytes are the row of outputs 16..23. Past the reduction: zero rows.
        auto convert = [&](const bf16* wb, std::size_t t) {
            const std::size_t q0 = t * kTileRows;
            const int nq = int(std::min<std::size_t>(kTileRows, P - q0));
            std::uint32_t* lo = blo[t % 2];
            std::uint32_t* hi = bhi[t % 2];
            const bf16* w = wb + q0 * 2 * W;
            for (int q = 0; q < nq; ++q, w += 2 * W) {
                __builtin_prefetch(reinterpret_cast<const char*>(w) + avx2::kPackPrefetchBytes, 0, 3);
                __builtin_prefetch(reinterpret_cast<const char*>(w) + avx2::kPackPrefetchBytes + 64, 0, 3);
                _mm512_store_si512(lo + 16 * q, _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(w)));
                _mm256_store_si256(reinterpret_cast<__m256i*>(hi + 8 * q), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32)));
            }
            for (int q = nq; q < kTileRows; ++q) {
                _mm512_store_si512(lo + 16 * q, _mm512_setzero_si512());
                _mm256_store_si256(reinterpret_cast<__m256i*>(hi + 8 * q), _mm256_setzero_si256());
            }
        };
        for (int ob = b0; ob < b1; ++ob) {
            std::fill(tot, tot + std::size_t(nn) * W, 0.f);
            const bf16* wb = wp + std::size_t(ob) * block_elems;
            // Tile t + 1's B rows are written while tile t's tdpbf16ps run, so the stores have committed before the
            // tile loads read them.
            convert(wb, 0);
            for (std::size_t t = 0; t < tiles; ++t) {
                if (t % kSliceTiles == 0) zero_accumulators(m1 > 0);
                if (t + 1 < tiles) convert(wb, t + 1);
                const std::size_t q0 = t * kTileRows;
                FLOWEDGE_TILE_LOAD(5, blo[t % 2], 64);
                FLOWEDGE_TILE_LOAD(6, bhi[t % 2], 32);
                FLOWEDGE_TILE_LOAD(4, panel + q0, lda);
                FLOWEDGE_TILE_DPBF16PS(0, 4, 5);
                FLOWEDGE_TILE_DPBF16PS(1, 4, 6);
                if (m1 > 0) {
                    FLOWEDGE_TILE_LOAD(7, panel + 16 * ld + q0, lda);
                    FLOWEDGE_TILE_DPBF16PS(2, 7, 5);
                    FLOWEDGE_TILE_DPBF16PS(3, 7, 6);
                }
                if ((t + 1) % kSliceTiles == 0 || t + 1 == tiles) {  // the end of a 128-step slice: into the total
                    store_accumulators(slice, W, m1 > 0);
                    for (std::size_t i = 0; i < std::size_t(nn) * W; ++i) tot[i] += slice[i];
                }
            }
            const int o0 = ob * W, o1 = std::min(Cout, o0 + W);
            for (int c = 0; c < nn; ++c)
                for (int o = o0; o < o1; ++o) conv_out(p, n0 + c, o, tot[std::size_t(c) * W + std::size_t(o - o0)], true);
        }
        release_tiles();
    });
}

/// Conv1d under MathMode::BF16 on BF16 blocks, on tdpbf16ps (see the file comment). Needs bh_plan(p).ns > 0.
inline void conv1d_bh_amx(const Conv1dParams& p, const bf16* wp) { bh_parallel(p, wp, bh_part); }

// ---- MathMode::BF16 on INT8 weight-only blocks ------------------------------------------------------------------

inline constexpr int kI8Width = avx2::kConvBlockWidth<std::int8_t>;  // 16 outputs per block
static_assert(kI8Width == 16, "one INT8 block is one 16-column B tile");

/// The B row of one step pair of an INT8 block: dword o = BF16(q[j][o]) | BF16(q[j + 1][o]) << 16 from the block's
/// steps j (w, 16 signed bytes) and j + 1 (w + 16). |q| <= 127 widens to a float whose low 16 bits are zero, so its
/// BF16 is its high half, exactly: step j + 1 is the float itself, step j the float shifted down.
inline __m512i int8_pair_row(const std::int8_t* w) {
    const __m512i lo = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)))));
    const __m512i hi = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)))));
    return _mm512_or_si512(hi, _mm512_srli_epi32(lo, 16));
}
/// The same for a last, half-used pair (step j only; j + 1 would read the block's scales).
inline __m512i int8_half_row(const std::int8_t* w) {
    const __m512i lo = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)))));
    return _mm512_srli_epi32(lo, 16);
}

/// This thread's share of conv1d_int8_bh_amx: its panel columns, then its pairs of output blocks (B tiles 5 and 6).
/// panel: shared, [column][ld pairs].
inline void int8_bh_part(const Conv1dParams& p, const std::int8_t* wp, std::uint32_t* panel, const BhPlan& pl) {
    constexpr int W = 2 * kI8Width;  // outputs per unit: two blocks
    const int Cout = p.out_channels, N = p.batch * p.out_length;
    const std::size_t R = std::size_t(p.in_channels) * std::size_t(p.kernel), P = pl.pairs, ld = pl.ld, tiles = ld / kTileRows;
    const std::size_t block_bytes = std::size_t(kI8Width) * avx2::packed_conv_steps<std::int8_t>(R);
    const int blocks = (Cout + kI8Width - 1) / kI8Width, units = (blocks + 1) / 2;
    alignas(64) std::uint32_t bbuf[2][2][kTileRows * 16];  // B rows of the two blocks, double-buffered
    alignas(64) float slice[kMaxCols * W], tot[kMaxCols * W];
    auto columns = [&](int n0, int, int c0, int c1) { bh_panel_columns(p, n0, panel, ld, c0, c1); };
    panel_passes(N, pl.ns, units, columns, [&](int n0, int nn, int u0, int u1) {
        if (u0 == u1) return;
        const int m1 = nn - 16;
        const long lda = long(ld * sizeof(std::uint32_t));
        const TileConfig cfg = pass_config(nn, 64);
        load_config(cfg);
        // Tile t's B rows of block v into bbuf[t % 2][v], widened from 32 bytes per row (2 KiB ahead prefetched in
        // each block's stream); zero rows past the reduction.
        auto convert = [&](const std::int8_t* wb, int v, std::size_t t) {
            const std::size_t q0 = t * kTileRows;
            const int nq = int(std::min<std::size_t>(kTileRows, P - q0));
            std::uint32_t* dst = bbuf[t % 2][v];
            const std::int8_t* w = wb + q0 * 2 * kI8Width;
            int q = 0;
            for (; q < nq && 2 * (q0 + std::size_t(q)) + 1 < R; ++q, w += 2 * kI8Width) {
                if (q % 2 == 0) __builtin_prefetch(w + avx2::kPackPrefetchBytes, 0, 3);
                _mm512_store_si512(dst + 16 * q, int8_pair_row(w));
            }
            if (q < nq) _mm512_store_si512(dst + 16 * q, int8_half_row(w)), ++q;  // odd R: the last step alone
            for (; q < kTileRows; ++q) _mm512_store_si512(dst + 16 * q, _mm512_setzero_si512());
        };
        for (int u = u0; u < u1; ++u) {
            const int ob = 2 * u;
            const bool two = ob + 1 < blocks;
            const std::int8_t* wb0 = wp + std::size_t(ob) * block_bytes;
            const std::int8_t* wb1 = wb0 + block_bytes;
            std::fill(tot, tot + std::size_t(nn) * W, 0.f);
            // Tile t + 1's B rows are written while tile t's tdpbf16ps run (as in bh_part).
            convert(wb0, 0, 0);
            if (two) convert(wb1, 1, 0);
            for (std::size_t t = 0; t < tiles; ++t) {
                if (t % kSliceTiles == 0) zero_accumulators(m1 > 0);
                if (t + 1 < tiles) {
                    convert(wb0, 0, t + 1);
                    if (two) convert(wb1, 1, t + 1);
                }
                const std::size_t q0 = t * kTileRows;
                FLOWEDGE_TILE_LOAD(5, bbuf[t % 2][0], 64);
                FLOWEDGE_TILE_LOAD(4, panel + q0, lda);
                FLOWEDGE_TILE_DPBF16PS(0, 4, 5);
                if (two) {
                    FLOWEDGE_TILE_LOAD(6, bbuf[t % 2][1], 64);
                    FLOWEDGE_TILE_DPBF16PS(1, 4, 6);
                }
                if (m1 > 0) {
                    FLOWEDGE_TILE_LOAD(7, panel + 16 * ld + q0, lda);
                    FLOWEDGE_TILE_DPBF16PS(2, 7, 5);
                    if (two) FLOWEDGE_TILE_DPBF16PS(3, 7, 6);
                }
                if ((t + 1) % kSliceTiles == 0 || t + 1 == tiles) {  // the end of a 128-step slice: into the total
                    store_accumulators(slice, W, m1 > 0);
                    for (std::size_t i = 0; i < std::size_t(nn) * W; ++i) tot[i] += slice[i];
                }
            }
            // The exact INT8 kernel's epilogue: each output's total times its row scale, then the bias.
            const int o0 = ob * kI8Width, o1 = std::min(Cout, o0 + W);
            const float* s0 = avx2::int8_block_scales(wb0, R);
            const float* s1 = two ? avx2::int8_block_scales(wb1, R) : s0;
            for (int c = 0; c < nn; ++c)
                for (int o = o0; o < o1; ++o) {
                    const int l = o - o0;
                    conv_out(p, n0 + c, o, tot[std::size_t(c) * W + std::size_t(l)] * (l < kI8Width ? s0[l] : s1[l - kI8Width]), true);
                }
        }
        release_tiles();
    });
}

/// Conv1d under MathMode::BF16 on INT8 weight-only blocks (LoadOptions::quantize = Int8), on tdpbf16ps: the BF16
/// pair panel of conv1d_bh_amx against the int8 weights widened to BF16 B rows per tile as they are streamed (exact:
/// the blocks stay 1 byte per weight in memory), sums in 128-step slices added to a running total, then each output's
/// total times its row scale and the bias. Needs bh_plan(p).ns > 0.
inline void conv1d_int8_bh_amx(const Conv1dParams& p, const std::int8_t* wp) { bh_parallel(p, wp, int8_bh_part); }

// ---- WeightQuant::W8A8 ------------------------------------------------------------------------------------------

/// This thread's share of conv1d_w8a8_amx. panel: shared, [column][ld quads] of unsigned bytes; xscale, xmin:
/// shared, one per column of the pass.
inline void w8a8_part(const Conv1dParams& p, const std::int8_t* wp, std::uint32_t* panel, int ns, std::size_t ld,
                      float* xscale, float* xmin) {
    constexpr int W = kW8Width;
    const int Cout = p.out_channels, N = p.batch * p.out_length;
    const std::size_t R = std::size_t(p.in_channels) * std::size_t(p.kernel), R4 = w8a8_steps(R), Q = R4 / 4;
    const std::size_t tiles = ld / kTileRows;
    const int blocks = (Cout + W - 1) / W;
    constexpr long kRowBytes = 4 * W;  // one quad of the block: 32 outputs x 4 bytes
    alignas(64) std::int8_t bbuf[2][2][kTileRows * 64];  // B rows: outputs 0..15, 16..31
    alignas(64) std::int32_t acc[kMaxCols * W];
    auto* bytes = reinterpret_cast<std::uint8_t*>(panel);
    auto columns = [&](int n0, int, int c0, int c1) {
        for (int c = c0; c < c1; ++c) {
            const ColumnQuant q = column_quant(p, n0 + c);  // conv1d_w8a8's quantisation, value for value
            xscale[c] = q.scale;
            xmin[c] = q.min;
            const float lo = q.lo, inv = q.inv;
            // 16 values at a time: (x - lo) * inv rounded to nearest even (vcvtps2dq, as nearbyint), clamped to
            // [0, 255]: the same bytes as the scalar expression for finite columns (a non-finite column's outputs are
            // NaN whatever its bytes).
            std::uint8_t* row = bytes + std::size_t(c) * ld * 4;
            const __m512 vlo = _mm512_set1_ps(lo), vinv = _mm512_set1_ps(inv);
            auto quantise16 = [&](const float* src, std::uint8_t* dst) {
                const __m512i u = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(src), vlo), vinv));
                const __m512i cl = _mm512_min_epi32(_mm512_max_epi32(u, _mm512_setzero_si512()), _mm512_set1_epi32(255));
                _mm_store_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(cl));
            };
            alignas(64) float tmp[16];
            int fill = 0;
            std::size_t at = 0;
            im2col_column(p, n0 + c, 0, p.in_channels, [&](int, float v) {
                tmp[fill++] = v;
                if (fill == 16) {
                    quantise16(tmp, row + at);
                    at += 16;
                    fill = 0;
                }
            });
            if (fill) {
                for (int i = fill; i < 16; ++i) tmp[i] = lo;  // quantises to 0, and the rest of the row is zeroed below
                quantise16(tmp, row + at);
                std::fill(row + at + std::size_t(fill), row + at + 16, std::uint8_t(0));
                at += 16;
            }
            std::fill(row + at, row + ld * 4, std::uint8_t(0));
        }
    };
    panel_passes(N, ns, blocks, columns, [&](int n0, int nn, int b0, int b1) {
        if (b0 == b1) return;
        const int m1 = nn - 16;
        const long lda = long(ld * 4);
        const TileConfig cfg = pass_config(nn, 64);
        load_config(cfg);
        // Tile t's B rows (outputs 0..15 and 16..31 of 16 quads) into buffer t % 2, zero rows past the reduction: a
        // contiguous L1 copy keeps the tile loads off the streamed blocks' 128-byte stride (bench/results/diffusion_cpu_amx.md).
        auto convert = [&](const std::int8_t* wb, std::size_t t) {
            const std::size_t q0 = t * kTileRows;
            const int nq = int(std::min<std::size_t>(kTileRows, Q - q0));
            std::int8_t* lo = bbuf[t % 2][0];
            std::int8_t* hi = bbuf[t % 2][1];
            const std::int8_t* w = wb + q0 * kRowBytes;
            for (int q = 0; q < nq; ++q) {
                __builtin_prefetch(w + q * kRowBytes + avx2::kPackPrefetchBytes, 0, 3);
                __builtin_prefetch(w + q * kRowBytes + avx2::kPackPrefetchBytes + 64, 0, 3);
                _mm512_store_si512(lo + 64 * q, _mm512_loadu_si512(w + q * kRowBytes));
                _mm512_store_si512(hi + 64 * q, _mm512_loadu_si512(w + q * kRowBytes + 64));
            }
            for (int q = nq; q < kTileRows; ++q) {
                _mm512_store_si512(lo + 64 * q, _mm512_setzero_si512());
                _mm512_store_si512(hi + 64 * q, _mm512_setzero_si512());
            }
        };
        for (int ob = b0; ob < b1; ++ob) {
            const std::int8_t* wb = wp + std::size_t(ob) * w8a8_block_bytes(R);
            zero_accumulators(m1 > 0);
            convert(wb, 0);
            for (std::size_t t = 0; t < tiles; ++t) {
                const std::size_t q0 = t * kTileRows;
                if (t + 1 < tiles) convert(wb, t + 1);  // written while tile t's tdpbusd run
                FLOWEDGE_TILE_LOAD(5, bbuf[t % 2][0], 64);
                FLOWEDGE_TILE_LOAD(6, bbuf[t % 2][1], 64);
                FLOWEDGE_TILE_LOAD(4, bytes + q0 * 4, lda);
                FLOWEDGE_TILE_DPBUSD(0, 4, 5);
                FLOWEDGE_TILE_DPBUSD(1, 4, 6);
                if (m1 > 0) {
                    FLOWEDGE_TILE_LOAD(7, bytes + 16 * ld * 4 + q0 * 4, lda);
                    FLOWEDGE_TILE_DPBUSD(2, 7, 5);
                    FLOWEDGE_TILE_DPBUSD(3, 7, 6);
                }
            }
            store_accumulators(acc, W, m1 > 0);
            const int o0 = ob * W, o1 = std::min(Cout, o0 + W);
            const avx2::w8a8::BlockScales scales = avx2::w8a8::block_scales(wb, R4, xscale, xmin);
            for (int c = 0; c < nn; ++c) {
                alignas(64) float out[W];
                avx2::w8a8::dequantise(acc + c * W, scales, c, out);
                for (int o = o0; o < o1; ++o) conv_out(p, n0 + c, o, out[o - o0], true);
            }
        }
        release_tiles();
    });
}

/// Conv1d on W8A8 blocks on tdpbusd (see the file comment): bit-identical to conv1d_w8a8. R = in_channels * kernel
/// <= avx2::w8a8::kMaxSteps (checked at load), so a panel row of ld <= 16384 quads leaves room for at least 4 columns.
inline void conv1d_w8a8_amx(const Conv1dParams& p, const std::int8_t* wp) {
    const std::size_t R = std::size_t(p.in_channels) * std::size_t(p.kernel), Q = w8a8_steps(R) / 4;
    const std::size_t ld = (Q + kTileRows - 1) / kTileRows * kTileRows;
    const int ns = int(std::min<std::size_t>({std::size_t(p.batch) * std::size_t(p.out_length), std::size_t(kMaxCols), kPanelWords / ld}));
    [[maybe_unused]] const bool par = double(p.batch) * p.out_length * double(R) * p.out_channels >= kParallelMacs;
    alignas(64) std::uint32_t panel[kPanelWords];  // shared: [column][quad], 4 unsigned bytes round((x - m_c) / s_c)
    alignas(64) float xscale[kMaxCols], xmin[kMaxCols];
#pragma omp parallel if (par)
    w8a8_part(p, wp, panel, ns, ld, xscale, xmin);
}

#undef FLOWEDGE_TILE_LOAD
#undef FLOWEDGE_TILE_STORE
#undef FLOWEDGE_TILE_ZERO
#undef FLOWEDGE_TILE_DPBF16PS
#undef FLOWEDGE_TILE_DPBUSD

}  // namespace packed_dot::amx

#endif  // FLOWEDGE_ISA_AVX512
