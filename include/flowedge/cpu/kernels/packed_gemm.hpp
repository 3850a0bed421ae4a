// Many-row linears (an ACT encoder's ~300 tokens, its decoder's 100 queries) on the packed F32 layout of
// kernels/packed_linear.hpp: a register-blocked GEMM. Kernel-set body (AVX2 and AVX-512 sets), included by set.hpp
// right after packed_linear.hpp, whose packed::Call, bias_vec and finish it uses.
#if FLOWEDGE_ISA_SIMD
namespace packed {

/// Many rows (an ACT encoder's ~300 tokens, its decoder's 100 queries) on the F32 layout with one chain per output:
/// a register-blocked GEMM. A tile holds kGemmRows rows x kGemmVecs output vectors of accumulators (AVX-512: 6 x 4 = 24
/// of 32 zmm; AVX2: 4 x 3 = 12 of 16 ymm), and each k step loads the tile's weight vectors once and multiplies them
/// by each row's broadcast x[r][k]. Output groups are the outer loop and row tiles the inner one, so a group's
/// weight panel (kGemmVecs vectors x kGemmDepth k steps) is read from L2 by every row tile while x streams through;
/// longer reductions (the FFN's second linear, in = 3200) run in k slices of kGemmDepth whose partial sums go through
/// y (exact: the chain continues from the stored float). Each output is bias + sum over k in k order in one chain,
/// the arithmetic of tile<F32, 1, ...>: the same bits at any row count.
inline constexpr int kGemmRows = kRegisters >= 32 ? 6 : 4;
inline constexpr int kGemmVecs = kRegisters >= 32 ? 4 : 3;
/// k steps per slice: a panel of kGemmVecs vectors x 256 floats (64 KiB on AVX-512) and the rows' x slices (~300 KiB
/// at 300 rows) stay in a 1 MiB L2.
inline constexpr int kGemmDepth = 256;

/// R rows x V vectors from vector v0 of block b over k in [k0, k1): starts from the bias (k0 == 0) or the partial
/// sums in y, ends with the epilogue (k1 == in) or stores the partial sums (exact, as the next slice reloads them).
template <int R, int V>
inline void gemm_tile(const Call& c, int r0, int b, int v0, int k0, int k1) {
    const LinearParams& p = *c.p;
    const int vb = std::min(kPackBlockVecs, c.out_vecs - b * kPackBlockVecs);  // vectors in this block
    const std::size_t ks = std::size_t(vb) * kLanes;                            // floats per k step
    const float* w = static_cast<const float*>(c.w) + std::size_t(b) * kPackBlockVecs * kLanes * std::size_t(c.ksteps) +
                     std::size_t(v0) * kLanes;
    const int obase = (b * kPackBlockVecs + v0) * kLanes;
    VecF acc[R][V];
    for (int v = 0; v < V; ++v) {
        const int o = obase + v * kLanes, n = std::min(kLanes, p.out - o);
        const VecF init = bias_vec(p, obase, v);
        for (int r = 0; r < R; ++r) {
            const float* yr = p.y + std::size_t(r0 + r) * c.ldy + o;
            acc[r][v] = k0 == 0 ? init : n == kLanes ? vload(yr) : load_n(yr, n);
        }
    }
    const float* x = p.x + std::size_t(r0) * c.ldx;
    for (int k = k0; k < k1; ++k) {
        const float* wk = w + std::size_t(k) * ks;
        VecF wv[V];
        for (int v = 0; v < V; ++v) wv[v] = vload(wk + v * kLanes);
        for (int r = 0; r < R; ++r) {
            const VecF xr = vset1(x[std::size_t(r) * c.ldx + std::size_t(k)]);
            for (int v = 0; v < V; ++v) acc[r][v] = vfma(wv[v], xr, acc[r][v]);
        }
    }
    if (k1 == p.in) {
        finish<R, V>(c, r0, obase, acc);
        return;
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) {
            const int o = obase + v * kLanes, n = std::min(kLanes, p.out - o);
            float* yr = p.y + std::size_t(r0 + r) * c.ldy + o;
            if (n == kLanes) vstore(yr, acc[r][v]);
            else store_n(yr, acc[r][v], n);
        }
}

/// gemm_tile for a runtime (rows, vectors) in [1, kGemmRows] x [1, kGemmVecs].
template <int R = kGemmRows, int V = kGemmVecs>
inline void gemm_tile_n(int nr, int nv, const Call& c, int r0, int b, int v0, int k0, int k1) {
    if constexpr (R > 1) {
        if (nr < R) return gemm_tile_n<R - 1, V>(nr, nv, c, r0, b, v0, k0, k1);
    }
    if constexpr (V > 1) {
        if (nv < V) return gemm_tile_n<R, V - 1>(nr, nv, c, r0, b, v0, k0, k1);
    }
    gemm_tile<R, V>(c, r0, b, v0, k0, k1);
}

/// All rows of a call against output vectors [c.vbeg, c.vend): groups of kGemmVecs vectors, each k slice over every
/// row tile. An accumulate call is not sliced (y holds what it adds to).
inline void gemm_all_rows(const Call& c) {
    const LinearParams& p = *c.p;
    const int depth = p.accumulate ? p.in : kGemmDepth;
    for (int b = c.vbeg / kPackBlockVecs; b * kPackBlockVecs < c.vend; ++b) {
        const int lo = std::max(0, c.vbeg - b * kPackBlockVecs);
        const int hi = std::min({kPackBlockVecs, c.out_vecs - b * kPackBlockVecs, c.vend - b * kPackBlockVecs});
        for (int v0 = lo; v0 < hi; v0 += kGemmVecs)
            for (int k0 = 0; k0 < p.in; k0 += depth)
                for (int r0 = 0; r0 < p.rows; r0 += kGemmRows)
                    gemm_tile_n(std::min(kGemmRows, p.rows - r0), std::min(kGemmVecs, hi - v0), c, r0, b, v0, k0, std::min(p.in, k0 + depth));
    }
}

}  // namespace packed
#endif  // FLOWEDGE_ISA_SIMD
