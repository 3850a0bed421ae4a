// Small-row linear kernels on a load-time packed, k-major weight copy (Storage::SmallRowsMatrix, cpu/weights.hpp).
// Kernel-set body (AVX2 and AVX-512 sets): included once per instruction set by cpu/kernels.hpp.
//
// Why: at 1 row (decode, flow solve) and 4 rows (Mamba prefill) a product's weights live in L2, and the dot-product
// kernels of gemm.hpp pay a horizontal reduction per output and get no reuse across rows. Here a product is an axpy
// sweep: broadcast x[r][k], FMA it with one vector of outputs' weights into output-vector accumulators, so every
// loaded weight vector serves all rows of the call. Each output is summed over k in S = 1, 2 or 4 chains fixed by the
// output count only (packed_chains_for), so a row's bits never depend on the row count or blocking; summation order
// and error bounds: docs/numerics.md#packed-linear-summation.
//
// Layouts (L = kLanes outputs per vector, out padded to whole vectors with zeros; output blocks of up to
// kPackBlockVecs vectors):
//   F32:   per block, for k in [0, in): the block's vectors of L floats (F32 as stored, F16 widened exactly).
//   Pairs: per block, for each k pair (k, k+1): the block's vectors of L 32-bit lanes, lane i = (bf16 w[o_i][k+1]
//          << 16) | bf16 w[o_i][k] (an odd `in` pads with a zero weight). Exact math widens the halves by a shift and
//          an and-mask; MathMode::BF16 (AVX-512 set on an AVX512_BF16 CPU) feeds the pair vector to vdpbf16ps. BF16
//          weights as stored; under MathMode::BF16, F32/F16 weights rounded to BF16 (RNE) at pack time.
//   PairTiles (MathMode::BF16 where amx_bf16_available(), AVX-512 set): the Pairs lanes in AMX tile order, for the
//          TDPBF16PS loop: output vectors of 16 lanes in groups of kAmxGroup, k pairs in chunks of 16 (zero past in);
//          per group, per chunk, per vector of the group one 1 KiB tile (16 pair rows x 16 lanes), so a tile loop
//          reads one contiguous stream. A layout of its own: tiles read from the Pairs order, or the vector loops from
//          this one, are slower (docs/performance/cpu.md#xeon-dev-vm-2026-12-05-branch-mamba-cpu3).
// cpu::PackedWeight holds one layout at a time in a buffer sized at load for the larger one and repacks in place on
// set_math (no allocation after load).
#if FLOWEDGE_ISA_SIMD
/// Output-vector accumulators a tile keeps in registers (rows x vectors): half the register file, leaving room for
/// the broadcast x values and the weight vector(s) of one k step (AVX-512: 16 of 32 zmm; AVX2: 8 of 16 ymm).
inline constexpr int kPackAcc = kRegisters / 2;
/// Vectors per output block: a 1-row tile covers a whole block (one contiguous weight stream), multi-row tiles
/// split it into kPackAcc / rows vectors (reading kPackAcc/rows of each k step's vectors).
inline constexpr int kPackBlockVecs = kPackAcc;
/// Rows one tile multiplies against each loaded weight vector (prefill's 4 tokens in one sweep).
inline constexpr int kPackMaxRows = 4;
/// Multiply-adds from which packed_linear splits the outputs over OpenMP threads (Ops<Cpu>'s kParallelMacs).
inline constexpr double kPackParallelMacs = double(1 << 22);

namespace packed {

/// Which tile loop a call runs.
enum class Kind : std::uint8_t {
    F32,   ///< F32 layout, exact
    Pair,  ///< Pairs layout widened to F32, exact
    Bh,    ///< Pairs layout x BF16 x pairs, vdpbf16ps (MathMode::BF16)
};

/// The tiles below keep S independent sums per output (chain s takes the k pairs j with j % S == s, in k order) so
/// that few output vectors still give enough FMA chains in flight; S is fixed per packed shape (chains_for), never
/// by the row count, and combine() adds the chains in a fixed order.
/// acc[s][r][v] += w[k][v] * x[r][k], F32 layout: w points at the tile's first vector of k = 0, k steps ks floats apart.
template <int S, int R, int V>
inline void step_f32(const float* w, std::size_t ks, const float* x, std::size_t ldx, int k, VecF (&acc)[R][V]) {
    VecF xb[R];
    for (int r = 0; r < R; ++r) xb[r] = vset1(x[std::size_t(r) * ldx + std::size_t(k)]);
    const float* wk = w + std::size_t(k) * ks;
    for (int v = 0; v < V; ++v) {
        const VecF wv = vload(wk + v * kLanes);
        for (int r = 0; r < R; ++r) acc[r][v] = vfma(wv, xb[r], acc[r][v]);
    }
}

/// Pairs layout, exact: the k = 2kp term then the k+1 term into the same sum (w: the tile's first pair vector,
/// pairs ks lanes apart); `odd_too` false for an odd in's last pair (x[in] is never read).
template <int R, int V>
inline void step_pair(const std::uint32_t* w, std::size_t ks, const float* x, std::size_t ldx, int kp, bool odd_too,
                      VecF (&acc)[R][V]) {
    VecF xe[R], xo[R];
    for (int r = 0; r < R; ++r) {
        xe[r] = vset1(x[std::size_t(r) * ldx + std::size_t(2 * kp)]);
        xo[r] = odd_too ? vset1(x[std::size_t(r) * ldx + std::size_t(2 * kp + 1)]) : vzero();
    }
    const std::uint32_t* wk = w + std::size_t(kp) * ks;
    for (int v = 0; v < V; ++v) {
        const VecU u = load_u(wk + v * kLanes);
        const VecF we = even_half(u);
        for (int r = 0; r < R; ++r) acc[r][v] = vfma(we, xe[r], acc[r][v]);
        if (odd_too) {
            const VecF wo = odd_half(u);
            for (int r = 0; r < R; ++r) acc[r][v] = vfma(wo, xo[r], acc[r][v]);
        }
    }
}

#if FLOWEDGE_ISA_AVX512
/// MathMode::BF16 on the Pairs layout: xp holds each row's BF16 x pairs (low half x[2kp], high x[2kp+1], zero past
/// in), rows ldp pairs apart; one vdpbf16ps per pair vector and row.
template <int R, int V>
inline void step_bh(const std::uint32_t* w, std::size_t ks, const std::uint32_t* xp, std::size_t ldp, int kp, VecF (&acc)[R][V]) {
    VecBh xb[R];
    for (int r = 0; r < R; ++r) xb[r] = VecBh(_mm512_set1_epi32(int(xp[std::size_t(r) * ldp + std::size_t(kp)])));
    const std::uint32_t* wk = w + std::size_t(kp) * ks;
    for (int v = 0; v < V; ++v) {
        const VecBh wv = VecBh(load_u(wk + v * kLanes));
        for (int r = 0; r < R; ++r) acc[r][v] = vdot_bh(acc[r][v], wv, xb[r]);
    }
}
#endif

/// Runs step(j, acc[j % S]) for j in [0, n) in order (S steps per iteration, then the remainder). The chain index
/// is a compile-time constant in every call (parameter packs, not a loop over s): with a runtime s GCC keeps the
/// accumulators of S > 1 tiles in memory (FMAs with memory destinations through a pointer).
template <int S, int R, int V, class Step>
inline void chains(int n, VecF (&acc)[S][R][V], Step&& step) {
    int j = 0;
    for (; j + S <= n; j += S)
        [&]<int... s>(std::integer_sequence<int, s...>) { (step(j + s, acc[s]), ...); }(std::make_integer_sequence<int, S>{});
    [&]<int... s>(std::integer_sequence<int, s...>) {
        ((j + s < n ? step(j + s, acc[s]) : void()), ...);
    }(std::make_integer_sequence<int, S - 1>{});
}

/// Chains combined in a fixed order: S = 2: c0 + c1; S = 4: (c0 + c1) + (c2 + c3).
template <int S, int R, int V>
inline void combine(VecF (&acc)[S][R][V]) {
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < V; ++v) {
            if constexpr (S == 2) acc[0][r][v] = vadd(acc[0][r][v], acc[1][r][v]);
            if constexpr (S == 4) acc[0][r][v] = vadd(vadd(acc[0][r][v], acc[1][r][v]), vadd(acc[2][r][v], acc[3][r][v]));
        }
}

/// What one call needs, resolved once.
struct Call {
    const LinearParams* p;
    std::size_t ldx, ldy;
    const void* w;  ///< packed buffer
    int ksteps;     ///< k steps per block: in (F32) or ceil(in/2) (Pairs)
    int out_vecs;   ///< ceil(out / L)
    int vbeg = 0, vend = 0;  ///< output vectors [vbeg, vend) this call (thread) computes
};

/// A tile's epilogue with the activation f applied in registers (identity where it comes after the stores), then
/// store or accumulate R rows x V vectors of outputs starting at output obase.
template <int R, int V, class F>
inline void finish_with(const Call& c, int r0, int obase, VecF (&acc)[R][V], F f) {
    const LinearParams& p = *c.p;
    for (int r = 0; r < R; ++r) {
        float* yr = p.y + std::size_t(r0 + r) * c.ldy;
        for (int v = 0; v < V; ++v) {
            const int o = obase + v * kLanes, n = std::min(kLanes, p.out - o);
            VecF val = f(acc[r][v]);
            if (n == kLanes) {
                if (p.accumulate) val = vadd(vload(yr + o), val);
                vstore(yr + o, val);
            } else {
                if (p.accumulate) val = vadd(load_n(yr + o, n), val);
                store_n(yr + o, val, n);
            }
        }
    }
}

/// A tile's epilogue: activation (in registers where it may come before an accumulate), then store or accumulate.
/// The activation is chosen once per tile, outside the loops, so SiLU (the flow head's layers) is inlined into them
/// instead of an out-of-line activate_vec call per vector with the tile's accumulators live across it.
template <int R, int V>
inline void finish(const Call& c, int r0, int obase, VecF (&acc)[R][V]) {
    const LinearParams& p = *c.p;
    if (p.act == Activation::None || !act_in_registers(p)) {
        finish_with(c, r0, obase, acc, [](VecF v) { return v; });
        if (p.act != Activation::None)
            for (int r = 0; r < R; ++r) activate_inplace(p.act, p.y + std::size_t(r0 + r) * c.ldy + obase, std::min(V * kLanes, p.out - obase));
        return;
    }
    if (p.act == Activation::Silu) finish_with(c, r0, obase, acc, [](VecF v) { return vsilu(v); });
    else finish_with(c, r0, obase, acc, [&p](VecF v) { return activate_vec(p.act, v); });
}

/// Vector v of a tile's outputs from obase: the bias (zero where out ends or there is none), the start of chain 0.
inline VecF bias_vec(const LinearParams& p, int obase, int v) {
    const int o = obase + v * kLanes, n = std::min(kLanes, p.out - o);
    return p.bias ? (n == kLanes ? vload(p.bias + o) : load_n(p.bias + o, n)) : vzero();
}

/// R rows (r0..r0+R-1) x V vectors starting at vector v0 of block b, S chains per output: accumulate over k, then
/// the epilogue. xb: the BF16 pair rows of these R rows (Kind::Bh only), ldp pairs apart.
template <Kind K, int S, int R, int V>
inline void tile(const Call& c, int r0, int b, int v0, const std::uint32_t* xb, std::size_t ldp) {
    const LinearParams& p = *c.p;
    const int vb = std::min(kPackBlockVecs, c.out_vecs - b * kPackBlockVecs);  // vectors in this block
    const std::size_t ks = std::size_t(vb) * kLanes;                            // elements per k step
    const std::size_t boff = std::size_t(b) * kPackBlockVecs * kLanes * std::size_t(c.ksteps) + std::size_t(v0) * kLanes;
    const int obase = (b * kPackBlockVecs + v0) * kLanes;
    VecF acc[S][R][V];
    for (int v = 0; v < V; ++v) {
        const VecF init = bias_vec(p, obase, v);
        for (int r = 0; r < R; ++r) {
            acc[0][r][v] = init;  // the bias starts chain 0
            for (int s = 1; s < S; ++s) acc[s][r][v] = vzero();
        }
    }
    const float* x = p.x + std::size_t(r0) * c.ldx;
    if constexpr (K == Kind::F32) {
        // Chains over k pairs as on the Pairs layout (k = 2j then 2j + 1 into chain j % S), so BF16/F16 weights
        // and F32 weights of the same values give the same bits.
        const float* w = static_cast<const float*>(c.w) + boff;
        chains<S>((p.in + 1) / 2, acc, [&](int j, VecF(&a)[R][V]) {
            step_f32<S, R, V>(w, ks, x, c.ldx, 2 * j, a);
            if (2 * j + 1 < p.in) step_f32<S, R, V>(w, ks, x, c.ldx, 2 * j + 1, a);
        });
    } else if constexpr (K == Kind::Pair) {
        const std::uint32_t* w = static_cast<const std::uint32_t*>(c.w) + boff;
        const int pairs = c.ksteps, full = p.in / 2;
        chains<S>(pairs, acc, [&](int kp, VecF(&a)[R][V]) { step_pair<R, V>(w, ks, x, c.ldx, kp, kp < full, a); });
    } else {
#if FLOWEDGE_ISA_AVX512
        const std::uint32_t* w = static_cast<const std::uint32_t*>(c.w) + boff;
        chains<S>(c.ksteps, acc, [&](int kp, VecF(&a)[R][V]) { step_bh<R, V>(w, ks, xb, ldp, kp, a); });
#else
        (void)xb;
        (void)ldp;
#endif
    }
    combine<S>(acc);
    finish<R, V>(c, r0, obase, acc[0]);
}

/// Rows per pass with S chains: at most kPackMaxRows, and S * rows <= kPackAcc (one vector per row and chain).
template <int S>
inline constexpr int rows_for_chains = std::min(kPackMaxRows, std::max(1, kPackAcc / S));

/// Calls tile<K, S, R, V> for a runtime v in [1, max(1, kPackAcc / (S R))].
template <Kind K, int S, int R, int V = 1>
inline void tile_v(int v, const Call& c, int r0, int b, int v0, const std::uint32_t* xb, std::size_t ldp) {
    if constexpr (V < kPackAcc / (S * R)) {
        if (v > V) {
            tile_v<K, S, R, V + 1>(v, c, r0, b, v0, xb, ldp);
            return;
        }
    }
    tile<K, S, R, V>(c, r0, b, v0, xb, ldp);
}

/// R rows starting at r0 against every output: block by block, each block in chunks of kPackAcc / (S R) vectors.
template <Kind K, int S, int R>
inline void rows_pass(const Call& c, int r0, const std::uint32_t* xb, std::size_t ldp) {
    constexpr int vmax = std::max(1, kPackAcc / (S * R));
    for (int b = c.vbeg / kPackBlockVecs; b * kPackBlockVecs < c.vend; ++b) {
        // This block's vectors within [vbeg, vend), block-relative.
        const int lo = std::max(0, c.vbeg - b * kPackBlockVecs);
        const int hi = std::min({kPackBlockVecs, c.out_vecs - b * kPackBlockVecs, c.vend - b * kPackBlockVecs});
        for (int v0 = lo; v0 < hi; v0 += vmax) tile_v<K, S, R>(std::min(vmax, hi - v0), c, r0, b, v0, xb, ldp);
    }
}

template <Kind K, int S>
inline void rows_dispatch(int nr, const Call& c, int r0, const std::uint32_t* xb, std::size_t ldp) {
    constexpr int maxr = rows_for_chains<S>;
    if (nr == 1) rows_pass<K, S, 1>(c, r0, xb, ldp);
    else if (nr == 2 || maxr == 2) rows_pass<K, S, std::min(2, maxr)>(c, r0, xb, ldp);
    else if (nr == 3) rows_pass<K, S, std::min(3, maxr)>(c, r0, xb, ldp);
    else rows_pass<K, S, maxr>(c, r0, xb, ldp);
}

/// All rows of a call, rows_for_chains<S> at a time (BF16: each group's x rows rounded into xb first).
template <Kind K, int S>
inline void all_rows(const Call& c, std::uint32_t* xb, std::size_t ldp) {
    const LinearParams& p = *c.p;
    constexpr int step = rows_for_chains<S>;
    for (int r0 = 0; r0 < p.rows; r0 += step) {
        const int nr = std::min(step, p.rows - r0);
#if FLOWEDGE_ISA_AVX512
        if constexpr (K == Kind::Bh)
            for (int r = 0; r < nr; ++r) round_to_bh(p.x + std::size_t(r0 + r) * c.ldx, p.in, reinterpret_cast<bf16*>(xb + std::size_t(r) * ldp));
#endif
        rows_dispatch<K, S>(nr, c, r0, xb, ldp);
    }
}

template <Kind K>
inline void run_chains(int chains, const Call& c, std::uint32_t* xb, std::size_t ldp) {
    switch (chains) {
        case 1: all_rows<K, 1>(c, xb, ldp); return;
        case 2: all_rows<K, 2>(c, xb, ldp); return;
        default: all_rows<K, 4>(c, xb, ldp); return;
    }
}

/// Many rows on the F32 layout (ACT): the register-blocked GEMM of kernels/packed_gemm.hpp, included after this file.
inline void gemm_all_rows(const Call& c);

/// Output vectors per group of the PairTiles layout: the C tiles (tmm0-3) one pass of the AMX loop accumulates.
inline constexpr int kAmxGroup = 4;
/// Lanes (outputs) per AMX tile row and k pairs per tile: 64 bytes either way.
inline constexpr int kAmxLanes = 16;

#if FLOWEDGE_ISA_AVX512
/// FLOWEDGE_CPU_AMX_PLAIN_LOADS=1 loads the weight (B) tiles with plain tileloadd (the path before the T1 hint below;
/// same bits): the old path of an A/B run.
inline bool amx_plain_loads() {
    static const bool on = ::flowedge::cpu::env_is("FLOWEDGE_CPU_AMX_PLAIN_LOADS", "1");
    return on;
}

/// FLOWEDGE_CPU_AMX_NO_PING=1 turns amx_ping() off (the vector kernels between products issue none): the old path of an
/// A/B run.
inline bool amx_ping_enabled() {
    static const bool on = !::flowedge::cpu::env_is("FLOWEDGE_CPU_AMX_NO_PING", "1");
    return on;
}

/// Whether amx_ping() may run on this thread now: AMX in use and the tile state holding amx::configure's layout (A
/// tmm4 and C tmm0 of the same rows, B tmm5 16 x 64 bytes). Read once per call of a kernel that pings.
inline bool amx_ping_ready() {
    if (!amx_bf16_available() || !amx_ping_enabled()) return false;
    amx::TileConfig have;
    asm volatile("sttilecfg %0" : "=m"(have));
    return have.palette == 1 && have.rows[4] != 0 && have.rows[0] == have.rows[4] && have.colsb[0] == 64 &&
           have.colsb[4] == 64 && have.rows[5] == 16 && have.colsb[5] == 64;
}

/// One TDPBF16PS into tmm0 (no op keeps tile data between calls), to keep the tile unit awake through the vector
/// kernels that run between two products (causal_conv, the selective scan): after a pause without a tile multiply
/// the next product starts late (bench/results/mamba_flow_cpu.md, session 18). Only where amx_ping_ready().
inline void amx_ping() { asm volatile("tdpbf16ps %%tmm5, %%tmm4, %%tmm0" ::: "memory"); }
/// Channels between two pings of the conv and the scan (8 of their 16-channel blocks: well inside that pause).
inline constexpr int kAmxPingChannels = 128;

/// Weight bytes from which a product's B tiles are streamed (amx::dot<J, true>): more than L1 keeps beside the activations.
/// Smaller ones (x_proj, the flow head's out_proj) keep plain loads, which measured faster for them
/// (bench/results/mamba_flow_cpu.md, session 18).
inline constexpr std::size_t kAmxStreamedBytes = 32 * 1024;

/// MathMode::BF16 on AMX: R rows (r0..) x N output vectors from vector v (N within v's group) over every k chunk:
/// per chunk one A tile of the rows' BF16 x pairs and one TDPBF16PS per vector into its C tile, so each output is one
/// sum over the chunks in k order; then the C tiles go through a stack buffer into the epilogue, bias added after the
/// sum (C starts at zero). One C tile per vector also for groups of 1 or 2 vectors: splitting their chunks over 4 or 2
/// C tiles (shorter TDPBF16PS chains) cost more in stores and adds than it saved (bench/results/mamba_flow_cpu.md).
/// Each row of C depends only on that row of A, so a row's bits do not depend on the row count.
template <int R, int N>
inline void amx_tile(const Call& c, int r0, int v, const std::uint32_t* xb, std::size_t ldp) {
    static_assert(N >= 1 && N <= kAmxGroup);
    const LinearParams& p = *c.p;
    const int chunks = (c.ksteps + kAmxLanes - 1) / kAmxLanes;
    const int g = v / kAmxGroup, gn = std::min(kAmxGroup, c.out_vecs - g * kAmxGroup);
    constexpr std::size_t tile = std::size_t(kAmxLanes) * kAmxLanes;  // 32-bit lanes per tile
    const std::uint32_t* w = static_cast<const std::uint32_t*>(c.w) + (std::size_t(g) * kAmxGroup * chunks + std::size_t(v - g * kAmxGroup)) * tile;
    amx::zero_c();
    const std::size_t wbytes = std::size_t(c.out_vecs) * std::size_t(chunks) * tile * sizeof(std::uint32_t);
    const bool plain = amx_plain_loads() || wbytes < kAmxStreamedBytes;
    auto dot = [plain]<int J>(const std::uint32_t* wt, std::integral_constant<int, J>) {
        if (plain) amx::dot<J>(wt);
        else amx::dot<J, true>(wt);
    };
    // Chunk ch: A, then vector j's tile into C tile j.
    for (int ch = 0; ch < chunks; ++ch) {
        amx::load_a(xb + std::size_t(ch) * kAmxLanes, ldp * sizeof(std::uint32_t));
        const std::uint32_t* wt = w + std::size_t(ch) * std::size_t(gn) * tile;
        dot(wt, std::integral_constant<int, 0>{});
        if constexpr (N > 1) dot(wt + tile, std::integral_constant<int, 1>{});
        if constexpr (N > 2) dot(wt + 2 * tile, std::integral_constant<int, 2>{});
        if constexpr (N > 3) dot(wt + 3 * tile, std::integral_constant<int, 3>{});
    }
    alignas(64) float cb[kAmxGroup][kPackMaxRows][kAmxLanes];
    amx::store_c<0>(&cb[0][0][0]);
    if constexpr (N > 1) amx::store_c<1>(&cb[1][0][0]);
    if constexpr (N > 2) amx::store_c<2>(&cb[2][0][0]);
    if constexpr (N > 3) amx::store_c<3>(&cb[3][0][0]);
    const int obase = v * kLanes;
    VecF acc[R][N];
    for (int j = 0; j < N; ++j) {
        const VecF b = bias_vec(p, obase, j);
        for (int r = 0; r < R; ++r) acc[r][j] = vadd(b, vload(cb[j][r]));
    }
    finish<R, N>(c, r0, obase, acc);
}

/// amx_tile for a runtime run length n (1..4).
template <int R>
inline void amx_tile_n(int n, const Call& c, int r0, int v, const std::uint32_t* xb, std::size_t ldp) {
    switch (n) {
        case 1: return amx_tile<R, 1>(c, r0, v, xb, ldp);
        case 2: return amx_tile<R, 2>(c, r0, v, xb, ldp);
        case 3: return amx_tile<R, 3>(c, r0, v, xb, ldp);
        default: return amx_tile<R, 4>(c, r0, v, xb, ldp);
    }
}

/// R rows against output vectors [vbeg, vend), in runs that stay inside one group.
template <int R>
inline void amx_rows(const Call& c, int r0, const std::uint32_t* xb, std::size_t ldp) {
    amx::configure(R);
    for (int v = c.vbeg; v < c.vend;) {
        const int n = std::min(c.vend - v, kAmxGroup - v % kAmxGroup);
        amx_tile_n<R>(n, c, r0, v, xb, ldp);
        v += n;
    }
}

/// All rows of a call on the PairTiles layout, kPackMaxRows at a time (each group's x rounded into xb first, as the
/// vdpbf16ps loop does); the tile state is configured per row group (amx::configure) and left configured.
inline void amx_all_rows(const Call& c, std::uint32_t* xb, std::size_t ldp) {
    const LinearParams& p = *c.p;
    for (int r0 = 0; r0 < p.rows; r0 += kPackMaxRows) {
        const int nr = std::min(kPackMaxRows, p.rows - r0);
        for (int r = 0; r < nr; ++r) round_to_bh(p.x + std::size_t(r0 + r) * c.ldx, p.in, reinterpret_cast<bf16*>(xb + std::size_t(r) * ldp));
        switch (nr) {
            case 1: amx_rows<1>(c, r0, xb, ldp); break;
            case 2: amx_rows<2>(c, r0, xb, ldp); break;
            case 3: amx_rows<3>(c, r0, xb, ldp); break;
            default: amx_rows<4>(c, r0, xb, ldp); break;
        }
    }
}
#endif

inline float stored(const void* w, DType dt, std::size_t i) {
    switch (dt) {
        case DType::F32: return static_cast<const float*>(w)[i];
        case DType::BF16: return to_float(static_cast<const bf16*>(w)[i]);
        case DType::F16: return to_float(static_cast<const f16*>(w)[i]);
    }
    return 0.f;
}

}  // namespace packed

/// Output vectors of a packed [out, in] weight (whole vectors of kLanes outputs, zero-padded).
inline int packed_out_vecs(int out) { return (out + kLanes - 1) / kLanes; }

/// Independent sums per output (see packed::chains): enough FMA chains in flight for a 1-row call when the
/// output has few vectors (latency 4, 2 pipes: >= 8 chains); depends only on the output count, so every row
/// count sums an output the same way.
inline int packed_chains_for(int out_vecs) { return out_vecs * 2 >= kPackAcc ? 1 : out_vecs * 4 >= kPackAcc ? 2 : 4; }

/// Bytes of layout l for an [out, in] weight.
inline std::size_t packed_linear_bytes(PackedLayout l, int in, int out) {
    if (l == PackedLayout::PairTiles) {
        const std::size_t vecs = std::size_t((out + packed::kAmxLanes - 1) / packed::kAmxLanes);
        const std::size_t chunks = std::size_t(((in + 1) / 2 + packed::kAmxLanes - 1) / packed::kAmxLanes);
        return vecs * chunks * packed::kAmxLanes * packed::kAmxLanes * 4;
    }
    const std::size_t out_pad = std::size_t(packed_out_vecs(out)) * kLanes;
    const std::size_t ksteps = l == PackedLayout::F32 ? std::size_t(in) : std::size_t((in + 1) / 2);
    return ksteps * out_pad * 4;
}

/// Writes the [out, in] weight src (any storage dtype) into dst in layout l; round: F32/F16 weights rounded to BF16
/// pairs (MathMode::BF16, AVX-512 set only).
inline void packed_linear_pack(PackedLayout l, bool round, const WeightRef& src_ref, int n_in, int n_out, void* buf) {
    const int out_vecs = packed_out_vecs(n_out);
    const int nblk = (out_vecs + kPackBlockVecs - 1) / kPackBlockVecs;
    const std::size_t in = std::size_t(n_in);
    const void* src = src_ref.data;
    const DType dt = src_ref.dtype;
    if (l == PackedLayout::F32) {
        float* dst = static_cast<float*>(buf);
        for (int b = 0; b < nblk; ++b) {
            const int vb = std::min(kPackBlockVecs, out_vecs - b * kPackBlockVecs);
            for (int k = 0; k < n_in; ++k)
                for (int v = 0; v < vb; ++v)
                    for (int i = 0; i < kLanes; ++i) {
                        const int o = (b * kPackBlockVecs + v) * kLanes + i;
                        *dst++ = o < n_out ? packed::stored(src, dt, std::size_t(o) * in + std::size_t(k)) : 0.f;
                    }
        }
        return;
    }
    // Writes the kLanes pair lanes of output vector vg at k pair kp: (w[o_i][2kp], w[o_i][2kp+1]) as BF16 halves,
    // zeros past out / in.
    auto pair_vector = [&](int vg, int kp, std::uint32_t* out_lanes) {
        [[maybe_unused]] alignas(64) float f[2 * kLanes];
        alignas(64) std::uint16_t h[2 * kLanes];
        for (int i = 0; i < kLanes; ++i) {
            const int o = vg * kLanes + i;
            for (int j = 0; j < 2; ++j) {
                const int k = 2 * kp + j;
                const bool live = o < n_out && k < n_in;
                const std::size_t idx = std::size_t(o) * in + std::size_t(k);
                f[2 * i + j] = live ? packed::stored(src, dt, idx) : 0.f;
                h[2 * i + j] = live && dt == DType::BF16 ? static_cast<const bf16*>(src)[idx].bits : std::uint16_t(0);
            }
        }
        if (round) {
#if FLOWEDGE_ISA_AVX512
            // Rounded by the instruction Ops<Cpu>::linear's vload_bh uses (RNE, denormals to zero).
            _mm512_store_si512(h, __m512i(to_bh(_mm512_load_ps(f), _mm512_load_ps(f + 16))));
#else
            fail(ErrorKind::Unsupported, "cpu packed linear", "BF16-rounded pairs need the AVX-512 kernel set");
#endif
        }
        for (int i = 0; i < kLanes; ++i) out_lanes[i] = std::uint32_t(h[2 * i]) | std::uint32_t(h[2 * i + 1]) << 16;
    };
    std::uint32_t* dst = static_cast<std::uint32_t*>(buf);
    const int pairs = (n_in + 1) / 2;
    if (l == PackedLayout::PairTiles) {
        if (kLanes != packed::kAmxLanes) fail(ErrorKind::Internal, "cpu packed linear", "AMX tile order needs the AVX-512 kernel set");
        const int chunks = (pairs + packed::kAmxLanes - 1) / packed::kAmxLanes;
        for (int g = 0; g * packed::kAmxGroup < out_vecs; ++g) {
            const int gn = std::min(packed::kAmxGroup, out_vecs - g * packed::kAmxGroup);
            for (int ch = 0; ch < chunks; ++ch)
                for (int j = 0; j < gn; ++j)
                    for (int r = 0; r < packed::kAmxLanes; ++r) {
                        const int kp = ch * packed::kAmxLanes + r;
                        if (kp < pairs) pair_vector(g * packed::kAmxGroup + j, kp, dst);
                        else std::fill_n(dst, kLanes, 0u);
                        dst += kLanes;
                    }
        }
        return;
    }
    for (int b = 0; b < nblk; ++b) {
        const int vb = std::min(kPackBlockVecs, out_vecs - b * kPackBlockVecs);
        for (int kp = 0; kp < pairs; ++kp)
            for (int v = 0; v < vb; ++v) {
                pair_vector(b * kPackBlockVecs + v, kp, dst);
                dst += kLanes;
            }
    }
}

/// One thread's share of packed_linear(): output vectors [c.vbeg, c.vend), all rows, on layout `layout`;
/// bh: MathMode::BF16 on the Pairs layout (vdpbf16ps).
inline void packed_linear_part(const packed::Call& c, PackedLayout layout, bool bh) {
    const int S = packed_chains_for(c.out_vecs);
    if (layout == PackedLayout::F32) {
        if (S == 1 && c.p->rows > kPackMaxRows) packed::gemm_all_rows(c);
        else packed::run_chains<packed::Kind::F32>(S, c, nullptr, 0);
        return;
    }
#if FLOWEDGE_ISA_AVX512
    if (bh || layout == PackedLayout::PairTiles) {
        // x rows rounded once to BF16 (RNE, as Ops<Cpu>::linear does) into this thread's stack; round_to_bh
        // zero-fills to a multiple of 32 elements, so a row takes round_up32(in)/2 pairs (whole 16-pair AMX chunks)
        // and an odd in's last pair reads x[in] = 0.
        const std::size_t ldp = std::size_t((c.p->in + 31) / 32 * 16);
        alignas(64) std::uint32_t xb[kPackMaxRows * std::size_t(kPackBhPairs)];
        if (layout == PackedLayout::PairTiles) packed::amx_all_rows(c, xb, ldp);
        else packed::run_chains<packed::Kind::Bh>(S, c, xb, ldp);
        return;
    }
#else
    (void)bh;
    if (layout == PackedLayout::PairTiles) fail(ErrorKind::Internal, "cpu packed linear", "AMX tile order needs the AVX-512 kernel set");
#endif
    packed::run_chains<packed::Kind::Pair>(S, c, nullptr, 0);
}

/// y = act(x w^T + bias) (+ y) exactly as LinearParams defines it, on a packed copy `buf` of layout `layout` (p.w is
/// not read; p.in and p.out are the packed shape, checked by the caller).
inline void packed_linear(const LinearParams& p, const void* buf, PackedLayout layout, bool bh) {
    const int out_vecs = packed_out_vecs(p.out);
    const packed::Call c{&p,  p.ld_x ? std::size_t(p.ld_x) : std::size_t(p.in), p.ld_y ? std::size_t(p.ld_y) : std::size_t(p.out),
                         buf, layout == PackedLayout::F32 ? p.in : (p.in + 1) / 2, out_vecs, 0, out_vecs};
    // Every Mamba/flow-head call stays on the calling thread (below 2^22 multiply-adds no OpenMP region is entered).
    // Larger calls (long prefills, big flow batches) split the output vectors over the threads; outputs do not
    // depend on the blocking, so the bits do not depend on the thread count.
    if (double(p.rows) * p.in * p.out < kPackParallelMacs) {
        packed_linear_part(c, layout, bh);
        return;
    }
#pragma omp parallel
    {
        const int tid = thread_index(), nth = thread_count();
        packed::Call t = c;
        t.vbeg = int(std::int64_t(out_vecs) * tid / nth);
        t.vend = int(std::int64_t(out_vecs) * (tid + 1) / nth);
        if (t.vbeg < t.vend) packed_linear_part(t, layout, bh);
    }
}
#endif  // FLOWEDGE_ISA_SIMD
