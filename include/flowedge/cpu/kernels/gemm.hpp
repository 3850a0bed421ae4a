// Row-major weight-streaming kernels (the default Linear/Conv1d path): every weight element is read once per call,
// widened in registers and multiplied against a handful of activation columns held in L1 (conv/linear at batch 1
// are memory-bound, so this is the whole game). Kernel-set body: included once per instruction set by cpu/kernels.hpp.

/// Largest number of activation columns one micro-kernel call multiplies against a weight row block.
inline constexpr int kMaxCols = 8;

/// Software prefetch distance for weight rows in the dot kernels (bytes ahead of the current load; 0 disables).
/// Only the 8-column (L8/L16) kernels need it: the 4-column L4 kernel and the 1-column linear kernel already run at
/// the read bandwidth on file-mapped weights (see kPrefetchMinCols; distances tried: docs/performance/cpu.md).
#ifndef FLOWEDGE_PREFETCH_BYTES
#define FLOWEDGE_PREFETCH_BYTES 512
#endif
inline constexpr int kPrefetchBytes = FLOWEDGE_PREFETCH_BYTES;
/// dot_block prefetches only with at least this many columns (many FMAs per weight line fill the
/// out-of-order window, so the hardware prefetcher alone no longer keeps enough lines in flight).
inline constexpr int kPrefetchMinCols = 5;

/// Software prefetch of element j + kPrefetchBytes of a weight row of `len` elements; past the row end, the same
/// offset in the row `next` elements further on (the same row of the following row block), so the first lines
/// of the next block are already on their way when it starts.
template <class WT>
inline void prefetch_ahead(const WT* row, int j, int len, std::size_t next) {
    if constexpr (kPrefetchBytes > 0) {
        constexpr int kAhead = kPrefetchBytes / int(sizeof(WT));
        const int jj = j + kAhead;
        const WT* p = jj < len ? row + jj : row + next + std::size_t(jj - len);
        __builtin_prefetch(p, 0, 3);  // prefetcht0
    }
}

/// Whether an epilogue also takes whole vectors: f.vec(o, c, v, n) gets the dots of rows o..o+n-1 (n <= 16)
/// with column c in lanes 0..n-1 (one masked store instead of n scalar calls).
template <class F>
concept VectorEpilogue = requires(F& f, VecF v) { f.vec(0, 0, v, 0); };

/// An epilogue seen through a column offset (column blocks of gemm_rows), vector form forwarded when present.
template <class F>
struct ColumnOffset {
    F& f;
    int cb;
    void operator()(int o, int c, float v) const { f(o, cb + c, v); }
    void vec(int o, int c, VecF v, int n) const requires VectorEpilogue<F> { f.vec(o, cb + c, v, n); }
};

/// Output rows per micro-kernel for `nc` columns: as many as fit the register file
/// (rows*nc accumulators + rows weight vectors + one activation vector), at most 8.
/// Exception, 4 columns (the U-Net's L4 convs, 80% of its weights): 7 rows, 28 accumulators. GCC keeps the weights
/// as memory operands of the FMAs there, so the accumulators plus one activation vector still fit, and one more
/// weight row in flight streams a few percent faster on these memory-bound convs (docs/performance/cpu.md).
constexpr int rows_for_cols(int nc) {
    if (nc == 4 && kRegisters >= 32) return 7;
    const int r = (kRegisters - 2) / (nc + 1);
    return r < 1 ? 1 : (r > 8 ? 8 : r);
}

/// Runtime-column-count front end: f(std::integral_constant<int, nc>) for 1 <= nc <= kMaxCols.
template <class F>
inline void with_cols(int nc, F&& f) {
    switch (nc) {
        case 1: f(std::integral_constant<int, 1>{}); return;
        case 2: f(std::integral_constant<int, 2>{}); return;
        case 3: f(std::integral_constant<int, 3>{}); return;
        case 4: f(std::integral_constant<int, 4>{}); return;
        case 5: f(std::integral_constant<int, 5>{}); return;
        case 6: f(std::integral_constant<int, 6>{}); return;
        case 7: f(std::integral_constant<int, 7>{}); return;
        case 8: f(std::integral_constant<int, 8>{}); return;
        default: break;
    }
    __builtin_unreachable();
}

/// The row loop of the RO x NC kernels: block(o, res) fills res[R][NC] (R = RO for whole blocks, then 1 for each
/// remaining row) with the dots of rows o .. o + R - 1; f(o, c, dot) per output.
template <int RO, int NC, class Block, class F>
inline void for_row_blocks(int o0, int o1, F& f, Block&& block) {
    int o = o0;
    for (; o + RO <= o1; o += RO) {
        float res[RO][NC];
        block(o, res);
        for (int r = 0; r < RO; ++r)
            for (int c = 0; c < NC; ++c) f(o + r, c, res[r][c]);
    }
    for (; o < o1; ++o) {
        float res[1][NC];
        block(o, res);
        for (int c = 0; c < NC; ++c) f(o, c, res[0][c]);
    }
}

/// res[r][c] = sum_{j < len} w[r*ldw + j] * x[c*ldx + j] for RO weight rows and NC columns.
/// Vectorised along j; each weight vector is widened once and used for all NC columns.
template <int RO, int NC, class WT>
inline void dot_block(const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, float (&res)[RO][NC]) {
    VecF acc[RO][NC];
    for (int r = 0; r < RO; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = vzero();
    int j = 0;
    for (; j + kLanes <= len; j += kLanes) {
        VecF wv[RO];
        for (int r = 0; r < RO; ++r) {
            // One prefetch per 64-byte line: every step for F32, every other step for 16-bit weights.
            if (NC >= kPrefetchMinCols && (sizeof(WT) == 4 || (j & 31) == 0))
                prefetch_ahead(w + std::size_t(r) * ldw, j, len, std::size_t(RO) * ldw);
            wv[r] = vload(w + std::size_t(r) * ldw + j);
        }
        for (int c = 0; c < NC; ++c) {
            const VecF xv = vload(x + std::size_t(c) * ldx + j);
            for (int r = 0; r < RO; ++r) acc[r][c] = vfma(wv[r], xv, acc[r][c]);
        }
    }
    for (int r = 0; r < RO; ++r)
        for (int c = 0; c < NC; ++c) res[r][c] = vsum(acc[r][c]);
    for (; j < len; ++j) {
        for (int r = 0; r < RO; ++r) {
            const float wf = widen(w[std::size_t(r) * ldw + j]);
            for (int c = 0; c < NC; ++c) res[r][c] += wf * x[std::size_t(c) * ldx + j];
        }
    }
}

/// For weight rows o in [o0, o1) and NC columns: f(o, c, dot(w row o, x column c)).
template <int NC, class WT, class F>
inline void dot_rows_fixed(const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, int o0, int o1, F& f) {
    for_row_blocks<rows_for_cols(NC), NC>(o0, o1, f, [&]<int R>(int o, float (&res)[R][NC]) {
        dot_block<R, NC>(w + std::size_t(o) * ldw, ldw, x, ldx, len, res);
    });
}

#if FLOWEDGE_ISA_AVX512
/// Short-row kernel (AVX-512): RO weight rows x NC columns (RO * NC <= 16) accumulated in 16 vectors and
/// reduced together by vsum16, so lane r*NC + c of the result is dot(w row r, x column c). Rows at or past
/// `nrows` re-read the last valid row (their lanes are ignored by the caller); a len % 16 tail is loaded
/// masked. The j sweep covers at most 8 rows at a time to keep the row pointers in registers.
template <int RO, int NC, class WT>
inline VecF dot_block16(const WT* w, std::size_t ldw, int nrows, const float* x, std::size_t ldx, int len) {
    static_assert(RO * NC <= 16, "dot_block16: at most 16 accumulators");
    constexpr int kSweep = RO < 8 ? RO : 8;
    VecF acc[16];
    for (auto& a : acc) a = vzero();
    const int full = len / kLanes * kLanes, tail = len - full;
    for (int r0 = 0; r0 < RO; r0 += kSweep) {
        const WT* wr[kSweep];
        for (int r = 0; r < kSweep; ++r) wr[r] = w + std::size_t(std::min(r0 + r, nrows - 1)) * ldw;
        for (int j = 0; j < full; j += kLanes) {
            VecF xv[NC];
            for (int c = 0; c < NC; ++c) xv[c] = vload(x + std::size_t(c) * ldx + j);
            for (int r = 0; r < kSweep; ++r) {
                if (NC >= kPrefetchMinCols && (sizeof(WT) == 4 || (j & 31) == 0))
                    prefetch_ahead(wr[r], j, len, std::size_t(RO) * ldw);
                const VecF wv = vload(wr[r] + j);
                for (int c = 0; c < NC; ++c) acc[(r0 + r) * NC + c] = vfma(wv, xv[c], acc[(r0 + r) * NC + c]);
            }
        }
        if (tail) {
            VecF xv[NC];
            for (int c = 0; c < NC; ++c) xv[c] = vload_n(x + std::size_t(c) * ldx + full, tail);
            for (int r = 0; r < kSweep; ++r) {
                const VecF wv = vload_n(wr[r] + full, tail);
                for (int c = 0; c < NC; ++c) acc[(r0 + r) * NC + c] = vfma(wv, xv[c], acc[(r0 + r) * NC + c]);
            }
        }
    }
    return vsum16(acc);
}

/// Lane permutation that gathers column c of a dot_block16<RO, NC> result into lanes 0..RO-1.
template <int RO, int NC>
inline __m512i column_lanes(int c) {
    alignas(64) std::int32_t idx[16];
    for (int i = 0; i < 16; ++i) idx[i] = std::min(i * NC + c, 15);
    return _mm512_load_si512(idx);
}

/// One column, rows of at most 8 elements (Mamba dt_proj, flow in_proj): two rows per vector (lanes 0..7 and
/// 8..15) times x duplicated into both halves, 32 rows reduced together by the first three levels of the
/// vsum16 tree (sums over 8 lanes), then put back in row order. f.vec / f as in dot_rows16.
template <class WT, class F>
inline void dot_rows_len8(const WT* w, std::size_t ldw, const float* x, int len, int o0, int o1, F& f) {
    const __m512 xv = vload_n(x, len);
    const __m512 xx = _mm512_shuffle_f32x4(xv, xv, 0x44);
    const bool dense = len == 8 && ldw == 8;
    // Lane i of the result <- lane perm[i] of the tree output (see vsum16: block 0 holds the low-half sums
    // of vectors 0..3, block 1 their high-half sums, blocks 2/3 the same for vectors 4..7).
    const __m512i perm = _mm512_set_epi32(15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0);
    alignas(64) float res[32];
    for (int o = o0; o < o1; o += 32) {
        const int nv = std::min(32, o1 - o);
        __m512 v[16];
        for (int k = 0; k < 16; ++k) {
            const int r0 = std::min(2 * k, nv - 1), r1 = std::min(2 * k + 1, nv - 1);
            const WT* p0 = w + std::size_t(o + r0) * ldw;
            const __m512 rows = dense && r1 == r0 + 1 ? vload(p0)
                                                     : _mm512_shuffle_f32x4(vload_n(p0, len), vload_n(w + std::size_t(o + r1) * ldw, len), 0x44);
            v[k] = _mm512_mul_ps(rows, xx);
        }
        __m512 out[2];
        for (int h = 0; h < 2; ++h) {
            __m512 s2[4], u[2];
            for (int k = 0; k < 4; ++k) {
                const __m512 a = v[8 * h + 2 * k], b = v[8 * h + 2 * k + 1];
                s2[k] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
            }
            for (int m = 0; m < 2; ++m)
                u[m] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * m], s2[2 * m + 1], 0x44), _mm512_shuffle_ps(s2[2 * m], s2[2 * m + 1], 0xEE));
            const __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
            out[h] = _mm512_permutexvar_ps(perm, t);
        }
        if constexpr (VectorEpilogue<F>) {
            f.vec(o, 0, out[0], std::min(16, nv));
            if (nv > 16) f.vec(o + 16, 0, out[1], nv - 16);
        } else {
            _mm512_store_ps(res, out[0]);
            _mm512_store_ps(res + 16, out[1]);
            for (int r = 0; r < nv; ++r) f(o + r, 0, res[r]);
        }
    }
}

/// Rows per short-row block for NC columns (RO * NC <= 16 lanes).
template <int NC>
inline constexpr int kShortRows = NC == 1 ? 16 : NC == 2 ? 8 : NC == 3 ? 5 : NC == 4 ? 4 : 2;

/// The row loop and epilogue of the short-row kernels: block(o, nv) returns the dots of rows o .. o + nv - 1
/// (nv <= kShortRows<NC>) in lanes r * NC + c; f(o, c, dot), or f.vec per column.
template <int NC, class Block, class F>
inline void for_short_row_blocks(int o0, int o1, F& f, Block&& block) {
    constexpr int RO = kShortRows<NC>;
    alignas(64) float res[16];
    for (int o = o0; o < o1; o += RO) {
        const int nv = std::min(RO, o1 - o);
        const VecF v = block(o, nv);
        if constexpr (VectorEpilogue<F>) {
            if constexpr (NC == 1) {
                f.vec(o, 0, v, nv);
            } else {
                for (int c = 0; c < NC; ++c) f.vec(o, c, _mm512_permutexvar_ps(column_lanes<RO, NC>(c), v), nv);
            }
        } else {
            _mm512_store_ps(res, v);
            for (int r = 0; r < nv; ++r)
                for (int c = 0; c < NC; ++c) f(o + r, c, res[r * NC + c]);
        }
    }
}

/// dot_rows_fixed on the short-row kernel: f(o, c, dot) for rows [o0, o1), NC columns.
template <int NC, class WT, class F>
inline void dot_rows16(const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, int o0, int o1, F& f) {
    for_short_row_blocks<NC>(o0, o1, f, [&](int o, int nv) {
        return dot_block16<kShortRows<NC>, NC>(w + std::size_t(o) * ldw, ldw, nv, x, ldx, len);
    });
}

/// Several columns use the short-row kernel only for rows shorter than this (masked tails instead of scalar
/// ones); on longer rows RO x NC register blocking with per-accumulator reductions is faster (4 x 128 -> 512),
/// while one column always takes the short-row kernel (measurements: docs/performance/cpu.md).
inline constexpr int kShortRow = 64;
#endif

/// Runtime-nc front end of dot_rows_fixed (1 <= nc <= kMaxCols).
template <class WT, class F>
inline void dot_rows(int nc, const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, int o0, int o1, F& f) {
#if FLOWEDGE_ISA_AVX512
    if (len < kShortRow || nc == 1) {
        if (nc == 1 && len <= 8) return dot_rows_len8(w, ldw, x, len, o0, o1, f);
        return with_cols(nc, [&](auto cols) { dot_rows16<decltype(cols)::value>(w, ldw, x, ldx, len, o0, o1, f); });
    }
#endif
    with_cols(nc, [&](auto cols) { dot_rows_fixed<decltype(cols)::value>(w, ldw, x, ldx, len, o0, o1, f); });
}

/// Walks rows [o0, o1) in blocks small enough (rows of `row_bytes`) to stay in L2 while every column block of
/// `block_cols` columns in [0, ncols) uses them, calling kernel(ob, oe, cb, n) per (row block, column block), so a
/// weight row comes from memory once however many column blocks read it.
template <class K>
inline void for_l2_row_blocks(std::size_t row_bytes, int o0, int o1, int ncols, int block_cols, K&& kernel) {
    const int block = int(std::clamp<std::size_t>((256u << 10) / (row_bytes ? row_bytes : 1), 8, 256));
    for (int ob = o0; ob < o1; ob += block) {
        const int oe = std::min(o1, ob + block);
        for (int cb = 0; cb < ncols; cb += block_cols) kernel(ob, oe, cb, std::min(block_cols, ncols - cb));
    }
}

#if !FLOWEDGE_ISA_EIGEN
/// f(o, c, dot(w row o, x column c)) for rows [o0, o1) and columns [0, ncols): with more than kMaxCols
/// columns the rows are walked in blocks small enough to stay in L2 while every column block uses them,
/// so the weights still come from memory once. XT = float, or bf16 (MathMode::BF16: x holds ncols BF16 columns of
/// ldx elements, a multiple of 32, zero past len; the dot_rows overload for bf16 x runs the vdpbf16ps kernels).
/// The Eigen set has its own gemm_rows (eigen_gemm.hpp).
template <class WT, class XT, class F>
inline void gemm_rows(const WT* w, std::size_t ldw, const XT* x, std::size_t ldx, int len, int o0, int o1,
                      int ncols, F& f) {
    if (ncols <= 0) return;
    if (ncols <= kMaxCols) {
        dot_rows(ncols, w, ldw, x, ldx, len, o0, o1, f);
        return;
    }
    for_l2_row_blocks(std::size_t(len) * sizeof(WT), o0, o1, ncols, kMaxCols, [&](int ob, int oe, int cb, int n) {
        ColumnOffset<F> g{f, cb};
        dot_rows(n, w, ldw, x + std::size_t(cb) * ldx, ldx, len, ob, oe, g);
    });
}
#endif

#if FLOWEDGE_ISA_AVX512
// ---- MathMode::BF16 kernels (vdpbf16ps) -------------------------------------------------------------------------
// Same blocking as the F32 kernels above, but one step covers 32 reduction elements: each weight vector holds 32
// BF16 values (stored BF16 as is; F32/F16 rounded once to BF16 in a register, vload_bh) and vdpbf16ps multiplies
// them pairwise against 32 BF16 activations into 16 F32 accumulators (lane i takes elements 2i and 2i+1, so the
// weight row and the activation column both run along the reduction index, as stored). Activations come from a
// BF16 copy (conv1d's im2col panel, linear's rows) whose columns are zero-padded to a multiple of 32 elements, so
// they are always loaded whole; a len % 32 weight tail is loaded masked (zeros past the row end).

/// Output rows per BF16 RO x NC block: as many as fit the register file (rows*nc accumulators + one vector per
/// row + one activation vector), at most 8. Unlike the F32 kernel's 7 x 4 exception, 4 columns get 6 rows: the
/// weight vector is the register operand of vdpbf16ps (GCC reloads it per column), so 7 x 4 runs slower from cache
/// and no faster from DRAM (docs/performance/cpu.md).
template <class WT>
constexpr int rows_for_cols_bh(int nc) {
    const int r = (kRegisters - 2) / (nc + 1);
    return r < 1 ? 1 : (r > 8 ? 8 : r);
}

/// res[r][c] = sum_{j < len} bf16(w[r*ldw + j]) * x[c*ldx + j] for RO weight rows and NC BF16 columns (ldx a
/// multiple of 32, columns zero past len); F32 accumulation, accumulators reduced 16 at a time by vsum16.
template <int RO, int NC, class WT>
inline void dot_block_bh(const WT* w, std::size_t ldw, const bf16* x, std::size_t ldx, int len, float (&res)[RO][NC]) {
    VecF acc[RO][NC];
    for (int r = 0; r < RO; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = vzero();
    const int full = len / kLanesBh * kLanesBh;
    for (int j = 0; j < full; j += kLanesBh) {
        VecBh wv[RO];
        for (int r = 0; r < RO; ++r) {
            // One prefetch per 64-byte weight line: one per step for BF16 weights, two for F32.
            if constexpr (NC >= kPrefetchMinCols) {
                const WT* row = w + std::size_t(r) * ldw;
                if constexpr (sizeof(WT) == 4) {
                    prefetch_ahead(row, j, len, std::size_t(RO) * ldw);
                    prefetch_ahead(row, j + 16, len, std::size_t(RO) * ldw);
                } else {
                    prefetch_ahead(row, j, len, std::size_t(RO) * ldw);
                }
            }
            wv[r] = vload_bh(w + std::size_t(r) * ldw + j);
        }
        for (int c = 0; c < NC; ++c) {
            const VecBh xv = vload_bh(x + std::size_t(c) * ldx + j);
            for (int r = 0; r < RO; ++r) acc[r][c] = vdot_bh(acc[r][c], wv[r], xv);
        }
    }
    if (full < len) {
        VecBh wv[RO];
        for (int r = 0; r < RO; ++r) wv[r] = vload_bh_n(w + std::size_t(r) * ldw + full, len - full);
        for (int c = 0; c < NC; ++c) {
            const VecBh xv = vload_bh(x + std::size_t(c) * ldx + full);
            for (int r = 0; r < RO; ++r) acc[r][c] = vdot_bh(acc[r][c], wv[r], xv);
        }
    }
    // 16 accumulators at a time through the vsum16 tree (45 ops per 16 sums instead of ~9 each: at the short rows
    // of the policy linears the reductions would otherwise cost as much as the vdpbf16ps work).
    constexpr int NA = RO * NC;
    alignas(64) float out[(NA + 15) / 16 * 16];
    for (int g = 0; g < NA; g += 16) {
        VecF v[16];
        for (int q = 0; q < 16; ++q) v[q] = g + q < NA ? acc[(g + q) / NC][(g + q) % NC] : vzero();
        _mm512_store_ps(out + g, vsum16(v));
    }
    for (int r = 0; r < RO; ++r)
        for (int c = 0; c < NC; ++c) res[r][c] = out[r * NC + c];
}

/// dot_rows_fixed on the BF16 kernel: f(o, c, dot) for rows [o0, o1), NC columns.
template <int NC, class WT, class F>
inline void dot_rows_fixed_bh(const WT* w, std::size_t ldw, const bf16* x, std::size_t ldx, int len, int o0, int o1, F& f) {
    for_row_blocks<rows_for_cols_bh<WT>(NC), NC>(o0, o1, f, [&]<int R>(int o, float (&res)[R][NC]) {
        dot_block_bh<R, NC>(w + std::size_t(o) * ldw, ldw, x, ldx, len, res);
    });
}

/// Short-row BF16 kernel (the vdpbf16ps twin of dot_block16): RO weight rows x NC columns (RO * NC <= 16) in
/// 16 accumulators reduced together by vsum16, lane r*NC + c = dot(w row r, x column c); rows at or past `nrows`
/// re-read the last valid row. The 1-column linear (batch-1 GEMV) runs here.
template <int RO, int NC, class WT>
inline VecF dot_block16_bh(const WT* w, std::size_t ldw, int nrows, const bf16* x, std::size_t ldx, int len) {
    static_assert(RO * NC <= 16, "dot_block16_bh: at most 16 accumulators");
    constexpr int kSweep = RO < 8 ? RO : 8;
    VecF acc[16];
    for (auto& a : acc) a = vzero();
    const int full = len / kLanesBh * kLanesBh, tail = len - full;
    for (int r0 = 0; r0 < RO; r0 += kSweep) {
        const WT* wr[kSweep];
        for (int r = 0; r < kSweep; ++r) wr[r] = w + std::size_t(std::min(r0 + r, nrows - 1)) * ldw;
        for (int j = 0; j < full; j += kLanesBh) {
            VecBh xv[NC];
            for (int c = 0; c < NC; ++c) xv[c] = vload_bh(x + std::size_t(c) * ldx + j);
            for (int r = 0; r < kSweep; ++r) {
                if constexpr (NC >= kPrefetchMinCols) {
                    prefetch_ahead(wr[r], j, len, std::size_t(RO) * ldw);
                    if constexpr (sizeof(WT) == 4) prefetch_ahead(wr[r], j + 16, len, std::size_t(RO) * ldw);
                }
                const VecBh wv = vload_bh(wr[r] + j);
                for (int c = 0; c < NC; ++c) acc[(r0 + r) * NC + c] = vdot_bh(acc[(r0 + r) * NC + c], wv, xv[c]);
            }
        }
        if (tail) {
            VecBh xv[NC];
            for (int c = 0; c < NC; ++c) xv[c] = vload_bh(x + std::size_t(c) * ldx + full);
            for (int r = 0; r < kSweep; ++r) {
                const VecBh wv = vload_bh_n(wr[r] + full, tail);
                for (int c = 0; c < NC; ++c) acc[(r0 + r) * NC + c] = vdot_bh(acc[(r0 + r) * NC + c], wv, xv[c]);
            }
        }
    }
    return vsum16(acc);
}

/// dot_rows16 on the BF16 short-row kernel: f(o, c, dot) (or f.vec) for rows [o0, o1), NC columns.
template <int NC, class WT, class F>
inline void dot_rows16_bh(const WT* w, std::size_t ldw, const bf16* x, std::size_t ldx, int len, int o0, int o1, F& f) {
    for_short_row_blocks<NC>(o0, o1, f, [&](int o, int nv) {
        return dot_block16_bh<kShortRows<NC>, NC>(w + std::size_t(o) * ldw, ldw, nv, x, ldx, len);
    });
}

/// Runtime-nc front end of the BF16 kernels (1 <= nc <= kMaxCols). Split as in dot_rows, except that up to 3
/// columns always take the short-row kernel, which is faster there at any length; from 4 columns RO x NC is as fast
/// or faster (measurements: docs/performance/cpu.md).
template <class WT, class F>
inline void dot_rows(int nc, const WT* w, std::size_t ldw, const bf16* x, std::size_t ldx, int len, int o0, int o1, F& f) {
    if (len < kShortRow || nc <= 3) return with_cols(nc, [&](auto cols) { dot_rows16_bh<decltype(cols)::value>(w, ldw, x, ldx, len, o0, o1, f); });
    with_cols(nc, [&](auto cols) {
        if constexpr (decltype(cols)::value >= 4) dot_rows_fixed_bh<decltype(cols)::value>(w, ldw, x, ldx, len, o0, o1, f);
    });
}

#endif

/// Transposed-conv accumulation for G (1..4) consecutive weight rows:
/// Z[c*ldz + j] += sum_g w[g*ldw + j] * xs[c*4 + g] for j in [j0, j1) and columns c < nc.
/// Each weight vector is widened once and applied to every column.
template <int G, class WT>
inline void axpy_rows(const WT* w, std::size_t ldw, const float* xs, int nc, float* z, std::size_t ldz, int j0, int j1) {
    int j = j0;
    for (; j + kLanes <= j1; j += kLanes) {
        VecF wv[G];
        for (int g = 0; g < G; ++g) wv[g] = vload(w + std::size_t(g) * ldw + j);
        for (int c = 0; c < nc; ++c) {
            float* zp = z + std::size_t(c) * ldz + j;
            VecF acc = vload(zp);
            for (int g = 0; g < G; ++g) acc = vfma(wv[g], vset1(xs[c * 4 + g]), acc);
            vstore(zp, acc);
        }
    }
    for (; j < j1; ++j) {
        float wf[G];
        for (int g = 0; g < G; ++g) wf[g] = widen(w[std::size_t(g) * ldw + j]);
        for (int c = 0; c < nc; ++c) {
            float acc = z[std::size_t(c) * ldz + j];
            for (int g = 0; g < G; ++g) acc += wf[g] * xs[c * 4 + g];
            z[std::size_t(c) * ldz + j] = acc;
        }
    }
}

