// Many-row linears (an ACT encoder's ~300 tokens, its decoder's 100 queries): a register-blocked GEMM on the packed
// F32 layout of kernels/packed_linear.hpp (a small-row weight called with many rows) or on its own group layout
// (PackedLayout::F32Groups, Storage::ManyRowsMatrix: packed at load in the order the tiles read it). Kernel-set body
// (AVX2 and AVX-512 sets), included by set.hpp right after packed_linear.hpp, whose packed::Call, bias_vec, finish
// and stored it uses.
#if FLOWEDGE_ISA_SIMD
namespace packed {

/// Many rows (an ACT encoder's ~300 tokens, its decoder's 100 queries) on the F32 layout with one chain per output:
/// a register-blocked GEMM. A tile holds kGemmRows rows x kGemmVecs output vectors of accumulators (AVX-512: 6 x 4 = 24
/// of 32 zmm; AVX2: 4 x 3 = 12 of 16 ymm), and each k step loads the tile's weight vectors once and multiplies them
/// by each row's broadcast x[r][k]. The weights of a group of kGemmVecs vectors over a k slice (its panel) must be
/// contiguous to stay in L1 across the row tiles: on the F32 layout a group's k steps are a block's width (1 KiB)
/// apart, so its lines fall in a quarter of L1's sets, and the panel is copied onto the stack once per slice; on the
/// F32Groups layout (blocks of one group) every panel already is one contiguous run and is read in place. The next
/// panel is prefetched into L2 while the row tiles run (a chunk's weights come from L3).
/// Partial sums of a k slice go through y (exact: the chain continues from the stored float). Each output is bias +
/// sum over k in k order in one chain, the arithmetic of tile<F32, 1, ...>: the same bits at any row count.
inline constexpr int kGemmRows = kRegisters >= 32 ? 6 : 4;
inline constexpr int kGemmVecs = kRegisters >= 32 ? 4 : 3;
/// k steps per slice of the in-place path (FLOWEDGE_CPU_GEMM_NO_PANEL=1): a panel of kGemmVecs vectors x 256 floats
/// (64 KiB on AVX-512) and the rows' x slices (~300 KiB at 300 rows) stay in L2.
inline constexpr int kGemmDepth = 256;
/// k steps per slice of the panel path: kGemmVecs vectors x 128 k steps (32 KiB on AVX-512) stay in a 48 KiB L1 with
/// the row tile's x slices (the best depth measured: bench/results/act_cpu.md).
inline constexpr int kGemmPanelDepth = 128;
/// k steps per slice on the F32Groups layout, where the panel is read in place (no stack copy bounds it): half the
/// partial-sum round trips through y, while a 64 KiB panel still comes from L2 to every row tile (measured:
/// bench/results/act_cpu.md).
inline constexpr int kGemmGroupsDepth = 256;

/// FLOWEDGE_CPU_GEMM_SHALLOW=1 slices the F32Groups layout at kGemmPanelDepth: the old path of an A/B run.
inline bool gemm_groups_shallow() {
    static const bool on = ::flowedge::cpu::env_is("FLOWEDGE_CPU_GEMM_SHALLOW", "1");
    return on;
}

/// FLOWEDGE_CPU_GEMM_NO_PANEL=1 reads the weights in place (kGemmDepth slices): the old path of an A/B run.
inline bool gemm_panel_enabled() {
    static const bool on = !::flowedge::cpu::env_is("FLOWEDGE_CPU_GEMM_NO_PANEL", "1");
    return on;
}

/// Most lines of the next panel prefetched in one burst before a row tile (about the core's line fill buffers);
/// larger shares are spread through the tile's k loop (gemm_group_slice).
inline constexpr int kGemmBurstLines = 16;

/// FLOWEDGE_CPU_GEMM_BURST_PREFETCH=1 prefetches every share in a burst before its row tile: the old path of an A/B run.
inline bool gemm_spread_prefetch() {
    static const bool on = !::flowedge::cpu::env_is("FLOWEDGE_CPU_GEMM_BURST_PREFETCH", "1");
    return on;
}

/// FLOWEDGE_CPU_GEMM_ROLLED_TILE=1 runs the tile's init and partial-sum stores as plain loops (the code before the
/// unrolled<> form below; same arithmetic and bits): the old path of an A/B run.
inline bool gemm_rolled_tile() {
    static const bool on = ::flowedge::cpu::env_is("FLOWEDGE_CPU_GEMM_ROLLED_TILE", "1");
    return on;
}

/// f(i) for the compile-time i = 0..N-1: the tile's per-accumulator loops written so that every acc[r][v] index is a
/// constant, which lets GCC keep the whole tile in registers (with runtime loop indices around the masked loads and
/// stores it kept acc on the stack and copied it in and out around the k loop: 96 extra vector moves per tile).
template <int N, class F>
[[gnu::always_inline]] inline void unrolled(F&& f) {
    [&]<int... i>(std::integer_sequence<int, i...>) __attribute__((always_inline)) {
        (f(std::integral_constant<int, i>{}), ...);
    }(std::make_integer_sequence<int, N>{});
}

/// Lines of the next panel a row tile prefetches inside its k loop, one every `every` k steps from p (none: lines 0).
struct GemmPrefetch {
    const char* p = nullptr;
    int lines = 0, every = 0;
};

/// R rows x V vectors of outputs from obase over k in [k0, k1): w is the tile's first weight vector at k = k0, k
/// steps ks floats apart. Starts from the bias (k0 == 0) or the partial sums in y, ends with the epilogue (k1 == in)
/// or stores the partial sums (exact, as the next slice reloads them). pf: lines to prefetch between k chunks.
template <int R, int V, bool Rolled = false>
inline void gemm_tile(const Call& c, int r0, int obase, const float* w, std::size_t ks, int k0, int k1, GemmPrefetch pf = {}) {
    const LinearParams& p = *c.p;
    VecF acc[R][V];
    if constexpr (Rolled) {
        for (int v = 0; v < V; ++v) {
            const int o = obase + v * kLanes, n = std::min(kLanes, p.out - o);
            const VecF init = bias_vec(p, obase, v);
            for (int r = 0; r < R; ++r) {
                const float* yr = p.y + std::size_t(r0 + r) * c.ldy + o;
                acc[r][v] = k0 == 0 ? init : n == kLanes ? vload(yr) : load_n(yr, n);
            }
        }
    } else {
        unrolled<V>([&](auto v) __attribute__((always_inline)) {
            const int o = obase + v * kLanes, n = std::min(kLanes, p.out - o);
            const VecF init = bias_vec(p, obase, v);
            unrolled<R>([&](auto r) __attribute__((always_inline)) {
                const float* yr = p.y + std::size_t(r0 + r) * c.ldy + o;
                acc[r][v] = k0 == 0 ? init : n == kLanes ? vload(yr) : load_n(yr, n);
            });
        });
    }
    const float* x = p.x + std::size_t(r0) * c.ldx;
    // k in chunks of pf.every steps with one prefetch after each (one chunk where there is nothing to prefetch), so
    // the k loop itself stays branch-free.
    const int chunk = pf.lines > 0 ? pf.every : k1 - k0;
    for (int k = k0; k < k1;) {
        for (const int kc = std::min(k1, k + chunk); k < kc; ++k) {
            const float* wk = w + std::size_t(k - k0) * ks;
            VecF wv[V];
            for (int v = 0; v < V; ++v) wv[v] = vload(wk + v * kLanes);
            for (int r = 0; r < R; ++r) {
                const VecF xr = vset1(x[std::size_t(r) * c.ldx + std::size_t(k)]);
                for (int v = 0; v < V; ++v) acc[r][v] = vfma(wv[v], xr, acc[r][v]);
            }
        }
        if (pf.lines > 0) {
            _mm_prefetch(pf.p, _MM_HINT_T1);
            pf.p += 64;
            --pf.lines;
        }
    }
    if constexpr (Rolled) {
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
        return;
    }
    if (k1 == p.in) {
        // finish takes the tile by reference: a copy, so that acc's own address never escapes.
        VecF out[R][V];
        unrolled<R>([&](auto r) __attribute__((always_inline)) {
            unrolled<V>([&](auto v) __attribute__((always_inline)) { out[r][v] = acc[r][v]; });
        });
        finish<R, V>(c, r0, obase, out);
        return;
    }
    unrolled<R>([&](auto r) __attribute__((always_inline)) {
        unrolled<V>([&](auto v) __attribute__((always_inline)) {
            const int o = obase + v * kLanes, n = std::min(kLanes, p.out - o);
            float* yr = p.y + std::size_t(r0 + r) * c.ldy + o;
            if (n == kLanes) vstore(yr, acc[r][v]);
            else store_n(yr, acc[r][v], n);
        });
    });
}

/// gemm_tile for a runtime (rows, vectors) in [1, kGemmRows] x [1, kGemmVecs].
template <int R = kGemmRows, int V = kGemmVecs>
inline void gemm_tile_n(int nr, int nv, const Call& c, int r0, int obase, const float* w, std::size_t ks, int k0, int k1, GemmPrefetch pf = {}) {
    if constexpr (R > 1) {
        if (nr < R) return gemm_tile_n<R - 1, V>(nr, nv, c, r0, obase, w, ks, k0, k1, pf);
    }
    if constexpr (V > 1) {
        if (nv < V) return gemm_tile_n<R, V - 1>(nr, nv, c, r0, obase, w, ks, k0, k1, pf);
    }
    if (gemm_rolled_tile()) gemm_tile<R, V, true>(c, r0, obase, w, ks, k0, k1, pf);
    else gemm_tile<R, V>(c, r0, obase, w, ks, k0, k1, pf);
}

/// One group of the call: nv (<= kGemmVecs) vectors from vector v0 of block b. The group's weights: first vector at
/// k = 0 and the stride between k steps.
struct GemmGroup {
    const float* w;
    std::size_t ks;
    int obase, nv;
};
/// bw: vectors per block of the layout (kPackBlockVecs on F32, kGemmVecs on F32Groups).
inline GemmGroup gemm_group(const Call& c, int bw, int b, int v0, int nv) {
    const int vb = std::min(bw, c.out_vecs - b * bw);  // vectors in this block
    return {static_cast<const float*>(c.w) + std::size_t(b) * bw * kLanes * std::size_t(c.ksteps) + std::size_t(v0) * kLanes,
            std::size_t(vb) * kLanes, (b * bw + v0) * kLanes, nv};
}

/// The groups of a call in order: block b (of bw vectors), first vector v0 within it, over output vectors
/// [c.vbeg, c.vend).
struct GemmGroupIt {
    const Call* c;
    int bw, b, v0;
    int lo() const { return std::max(0, c->vbeg - b * bw); }
    int hi() const { return std::min({bw, c->out_vecs - b * bw, c->vend - b * bw}); }
    bool valid() const { return b * bw < c->vend && v0 < hi(); }
    GemmGroup group() const { return gemm_group(*c, bw, b, v0, std::min(kGemmVecs, hi() - v0)); }
    static GemmGroupIt first(const Call& c, int bw) {
        GemmGroupIt it{&c, bw, c.vbeg / bw, 0};
        it.v0 = it.lo();
        return it;
    }
    GemmGroupIt next() const {
        GemmGroupIt it = *this;
        it.v0 += kGemmVecs;
        if (it.v0 >= hi()) {
            ++it.b;
            it.v0 = it.lo();
        }
        return it;
    }
};

/// A slice of a group the panel path copies next (k0 == k1: none): its lines are prefetched into L2 while the current
/// slice's row tiles run, so the copy does not wait on L3 (the weights of a chunk do not stay in L2).
struct GemmNext {
    GemmGroup g{};
    int k0 = 0, k1 = 0;
};

/// Every row tile of group g over k in [k0, k1), on its weights in place where a k step's nv vectors are the whole
/// stride (F32Groups: the panel is contiguous already), else copied first into `panel` (contiguous, nv vectors per k
/// step, L1-resident while the row tiles read it); next's weights prefetched, a share before (or spread through)
/// each row tile.
inline void gemm_group_slice(const Call& c, const GemmGroup& g, int k0, int k1, float* panel, const GemmNext& next) {
    const std::size_t pk = std::size_t(g.nv) * kLanes;
    const float* tiles_w = g.w + std::size_t(k0) * g.ks;
    if (g.ks != pk) {
        for (int k = k0; k < k1; ++k) {
            const float* src = g.w + std::size_t(k) * g.ks;
            float* dst = panel + std::size_t(k - k0) * pk;
            for (int v = 0; v < g.nv; ++v) vstore(dst + v * kLanes, vload(src + v * kLanes));
        }
        tiles_w = panel;
    }
    const LinearParams& p = *c.p;
    const int tiles = (p.rows + kGemmRows - 1) / kGemmRows, steps = next.k1 - next.k0;
    // Bytes of one k step of the next group: nv vectors, one or more 64-byte lines.
    const int step_bytes = next.g.nv * kLanes * int(sizeof(float));
    // A contiguous next panel (F32Groups) whose share per row tile exceeds kGemmBurstLines (few row tiles: the
    // decoder's 100 queries) is prefetched a line at a time inside the tiles' k loops instead of in a burst before
    // each tile, which would stall on the line fill buffers while the lines come from DRAM.
    const int lines = steps * step_bytes / 64;
    if (next.g.ks == std::size_t(next.g.nv) * kLanes && lines > kGemmBurstLines * tiles && gemm_spread_prefetch()) {
        const char* base = reinterpret_cast<const char*>(next.g.w + std::size_t(next.k0) * next.g.ks);
        const int per = (lines + tiles - 1) / tiles, every = std::max(1, (k1 - k0) / per);
        for (int t = 0; t < tiles; ++t) {
            const int l0 = int(std::int64_t(lines) * t / tiles), l1 = int(std::int64_t(lines) * (t + 1) / tiles);
            const int r0 = t * kGemmRows, nr = std::min(kGemmRows, p.rows - r0);
            gemm_tile_n(nr, g.nv, c, r0, g.obase, tiles_w, pk, k0, k1, GemmPrefetch{base + std::size_t(l0) * 64, l1 - l0, every});
        }
        return;
    }
    for (int t = 0; t < tiles; ++t) {
        for (int k = next.k0 + steps * t / tiles; k < next.k0 + steps * (t + 1) / tiles; ++k) {
            const char* src = reinterpret_cast<const char*>(next.g.w + std::size_t(k) * next.g.ks);
            for (int o = 0; o < step_bytes; o += 64) _mm_prefetch(src + o, _MM_HINT_T1);
        }
        const int r0 = t * kGemmRows, nr = std::min(kGemmRows, p.rows - r0);
        gemm_tile_n(nr, g.nv, c, r0, g.obase, tiles_w, pk, k0, k1);
    }
}

/// All rows of a call against output vectors [c.vbeg, c.vend) of a layout of bw-vector blocks, in groups of kGemmVecs
/// vectors. Panel path: k slices of kGemmPanelDepth (kGemmGroupsDepth on F32Groups), each group's slice read by every
/// row tile from one contiguous run (copied once where the layout's blocks are wider than a group: the F32 layout
/// only, as F32Groups calls give each thread whole groups); the slices are the outer loop where x is wider than y (in > out: x's slice is read from L2 by every group) and the groups where it is not
/// (a group's partial sums in y stay in L2 across the slices). An accumulate call is not sliced (y holds what it adds
/// to) and reads the weights in place, as does the old path (FLOWEDGE_CPU_GEMM_NO_PANEL=1: k slices of kGemmDepth).
inline void gemm_rows(const Call& c, int bw) {
    const LinearParams& p = *c.p;
    if (p.accumulate || !gemm_panel_enabled()) {
        const int depth = p.accumulate ? p.in : kGemmDepth;
        for (GemmGroupIt it = GemmGroupIt::first(c, bw); it.valid(); it = it.next()) {
            const GemmGroup g = it.group();
            for (int k0 = 0; k0 < p.in; k0 += depth) {
                const int k1 = std::min(p.in, k0 + depth);
                for (int r0 = 0; r0 < p.rows; r0 += kGemmRows)
                    gemm_tile_n(std::min(kGemmRows, p.rows - r0), g.nv, c, r0, g.obase, g.w + std::size_t(k0) * g.ks, g.ks, k0, k1);
            }
        }
        return;
    }
    alignas(64) float panel[std::size_t(kGemmPanelDepth) * kGemmVecs * kLanes];
    // The stack panel bounds the F32 layout's slices; F32Groups panels are read in place.
    const int depth = bw == kGemmVecs && !gemm_groups_shallow() ? kGemmGroupsDepth : kGemmPanelDepth;
    const auto slice_end = [&](int k0) { return std::min(p.in, k0 + depth); };
    if (p.in > p.out) {
        for (int k0 = 0; k0 < p.in; k0 += depth)
            for (GemmGroupIt it = GemmGroupIt::first(c, bw); it.valid(); it = it.next()) {
                GemmNext nx;
                if (const GemmGroupIt n = it.next(); n.valid()) nx = {n.group(), k0, slice_end(k0)};
                else if (slice_end(k0) < p.in) nx = {GemmGroupIt::first(c, bw).group(), slice_end(k0), slice_end(slice_end(k0))};
                gemm_group_slice(c, it.group(), k0, slice_end(k0), panel, nx);
            }
    } else {
        for (GemmGroupIt it = GemmGroupIt::first(c, bw); it.valid(); it = it.next())
            for (int k0 = 0; k0 < p.in; k0 += depth) {
                GemmNext nx;
                if (slice_end(k0) < p.in) nx = {it.group(), slice_end(k0), slice_end(slice_end(k0))};
                else if (const GemmGroupIt n = it.next(); n.valid()) nx = {n.group(), 0, slice_end(0)};
                gemm_group_slice(c, it.group(), k0, slice_end(k0), panel, nx);
            }
    }
}

/// The F32 layout's many-row calls (packed_linear_part): blocks of kPackBlockVecs vectors.
inline void gemm_all_rows(const Call& c) { gemm_rows(c, kPackBlockVecs); }

}  // namespace packed

/// Whether an [out, in] weight takes the F32Groups layout for exact math: where the small-row kernels would sum each
/// output in one chain (packed_chains_for == 1), the arithmetic of the GEMM tile, so both layouts give the same bits.
inline bool gemm_groups_fit(int out) { return packed_chains_for(packed_out_vecs(out)) == 1; }

/// Bytes of the F32Groups layout of an [out, in] weight: the F32 layout's (out padded to whole vectors).
inline std::size_t gemm_groups_bytes(int in, int out) { return std::size_t(packed_out_vecs(out)) * kLanes * std::size_t(in) * 4; }

/// Writes the [out, in] weight src (F32 or F16, widened exactly) into dst in the F32Groups layout: per group of
/// kGemmVecs output vectors (the last may hold fewer), for k in [0, in): the group's vectors of kLanes floats, zero past
/// out. A group's 128-k panel is then 32 KiB of consecutive memory (AVX-512), read in place by the tiles.
inline void gemm_groups_pack(const WeightRef& src_ref, int n_in, int n_out, void* buf) {
    const int out_vecs = packed_out_vecs(n_out);
    float* dst = static_cast<float*>(buf);
    for (int g = 0; g * packed::kGemmVecs < out_vecs; ++g) {
        const int gv = std::min(packed::kGemmVecs, out_vecs - g * packed::kGemmVecs);
        for (int k = 0; k < n_in; ++k)
            for (int v = 0; v < gv; ++v)
                for (int i = 0; i < kLanes; ++i) {
                    const int o = (g * packed::kGemmVecs + v) * kLanes + i;
                    *dst++ = o < n_out ? packed::stored(src_ref.data, src_ref.dtype, std::size_t(o) * std::size_t(n_in) + std::size_t(k)) : 0.f;
                }
    }
}

/// y = act(x w^T + bias) (+ y) on the F32Groups copy `buf` of an [p.out, p.in] weight (any row count; the same bits as
/// the F32 layout's kernels). Calls above kPackParallelMacs split the output groups over the OpenMP threads (the
/// bits do not depend on the split).
inline void packed_gemm_linear(const LinearParams& p, const void* buf) {
    const int out_vecs = packed_out_vecs(p.out);
    const packed::Call c{&p,  p.ld_x ? std::size_t(p.ld_x) : std::size_t(p.in), p.ld_y ? std::size_t(p.ld_y) : std::size_t(p.out),
                         buf, p.in, out_vecs, 0, out_vecs};
    if (double(p.rows) * p.in * p.out < kPackParallelMacs) {
        packed::gemm_rows(c, packed::kGemmVecs);
        return;
    }
#pragma omp parallel
    {
        // Whole groups per thread, so every panel stays contiguous and is read in place (the stack copy of a split
        // group holds kGemmPanelDepth k steps only, fewer than kGemmGroupsDepth).
        const int tid = thread_index(), nth = thread_count(), groups = (out_vecs + packed::kGemmVecs - 1) / packed::kGemmVecs;
        packed::Call t = c;
        t.vbeg = std::min(out_vecs, int(std::int64_t(groups) * tid / nth) * packed::kGemmVecs);
        t.vend = std::min(out_vecs, int(std::int64_t(groups) * (tid + 1) / nth) * packed::kGemmVecs);
        if (t.vbeg < t.vend) packed::gemm_rows(t, packed::kGemmVecs);
    }
}
#endif  // FLOWEDGE_ISA_SIMD
