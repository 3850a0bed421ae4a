// torch.nn.Conv2d on weights packed at load (Storage::Conv2dWeight, cpu/weights.hpp), "outputs in lanes": the
// weights of kLanes consecutive output channels are one vector per reduction step j = (i * kh + u) * kw + v
// ([out / kLanes][j][kLanes], zero past `out`), and a micro-kernel keeps NB such output vectors x P output positions
// of accumulators in registers, multiplying the NB weight vectors of a step by each position's activation broadcast
// from conv2d.hpp's im2col panel ([j][position] of a block of tiles). No horizontal reductions, every lane busy
// whatever the position count (the ResNet's late layers have 36 or 9), each weight vector loaded once per P FMAs.
// BF16/F16 weights stay 16-bit in the packed copy and widen in registers. Kernel-set body, SIMD sets only: included
// once per instruction set by cpu/kernels.hpp; the checks are in Ops<Cpu>.
#if FLOWEDGE_ISA_SIMD

/// Elements of the packed copy of a [out, R] weight: whole blocks of kLanes outputs.
inline std::size_t packed_conv2d_elements(int out, std::size_t R) {
    return std::size_t((out + kLanes - 1) / kLanes) * std::size_t(kLanes) * R;
}

/// dst[b][j][l] = w[b * kLanes + l][j] for a stored [out, R] weight, in its own dtype. dst: packed_conv2d_elements.
inline void pack_conv2d_weights(const WeightRef& w, int out, std::size_t R, void* dst) {
    with_weights(w, [&](auto src) {
        using T = std::remove_cvref_t<decltype(*src)>;
        pack_output_blocks(src, out, R, kLanes, static_cast<T*>(dst));
    });
}

/// Registers a step's activation broadcast takes: none on AVX-512 (an FMA memory operand, {1to16}), one on AVX2.
inline constexpr int kConv2dBroadcastRegs = FLOWEDGE_ISA_AVX512 ? 0 : 1;
/// Most positions per micro-kernel for NB output vectors: NB * P accumulators + NB weight vectors (+ the broadcast)
/// fill the register file; at most 14 (AVX-512: 2 x 14 or 3 x 9; AVX2: 2 x 6 or 3 x 4).
constexpr int conv2d_packed_positions(int nb) {
    const int p = (kRegisters - kConv2dBroadcastRegs - nb) / nb;
    return p > 14 ? 14 : p;
}
/// Most output vectors per micro-kernel.
inline constexpr int kConv2dPackedMaxVecs = 3;
/// Tiles of positions per block: the panel of a block is built once per reduction chunk and every output vector
/// group runs over all its tiles. Up to 16 (224 positions at 2 x 14): the panel costs per row segment, and short
/// blocks left ACT's 64-channel 480x640 convs (~128 FLOP per panel float) a quarter of their time in im2col.
inline constexpr int kConv2dPackedBlockTiles = 16;
/// Reduction steps the weight prefetch runs ahead (1 KiB per F32 stream).
inline constexpr int kConv2dPrefetchSteps = 16;
/// Convs with at most this many output positions per image stream their weights from memory (each weight serves few
/// FMAs: ResNet layer4 on an 84x84 crop has 9 positions), and on the AVX2 set the near prefetch alone runs too short
/// of a DRAM miss, so they also prefetch into L2 this many steps ahead. Compute-bound convs skip it (the extra
/// prefetches only cost them). Measured: bench/results/rgb_encoder_cpu.md, session 24.
inline constexpr int kConv2dFarPrefetchPositions = FLOWEDGE_ISA_AVX512 ? 0 : 16;
inline constexpr int kConv2dFarPrefetchSteps = 128;
/// Accumulator floats per thread ([output vector][position][kLanes] of one position block, across reduction chunks).
inline constexpr int kConv2dPackedAccFloats = 32 * 1024;

/// acc_b[q] (the kLanes outputs of vector b at position q, at acc + b * ld_acc + q * kLanes) = (first ? 0 : acc_b[q])
/// + sum_{j < len} w_b[j] * panel[j * ldp + q] for NB output vectors (w_b = w + b * ldb, kLanes elements per step)
/// and P positions; the sum runs in j order. far > 0: also prefetch each stream into L2 `far` steps ahead.
template <int NB, int P, class WT>
inline void conv2d_packed_tile(const WT* w, std::size_t ldb, const float* panel, std::size_t ldp, int len, float* acc,
                               std::size_t ld_acc, bool first, int far) {
    VecF a[NB][P];
    for (int b = 0; b < NB; ++b)
        for (int q = 0; q < P; ++q) a[b][q] = first ? vzero() : vload(acc + b * ld_acc + q * kLanes);
    for (int j = 0; j < len; ++j, panel += ldp) {
        VecF wv[NB];
        for (int b = 0; b < NB; ++b) {
            // The first tile of a block streams the weights from memory (layer4: 9.4 MB of F32 per conv, each step
            // used by only 9 positions): the hardware prefetcher alone leaves the NB streams short of the bandwidth.
            __builtin_prefetch(w + b * ldb + std::size_t(j + kConv2dPrefetchSteps) * kLanes, 0, 3);
            if (far) __builtin_prefetch(w + b * ldb + std::size_t(j + far) * kLanes, 0, 2);
            wv[b] = vload(w + b * ldb + std::size_t(j) * kLanes);
        }
        for (int q = 0; q < P; ++q) {
            const VecF x = vset1(panel[q]);
            for (int b = 0; b < NB; ++b) a[b][q] = vfma(wv[b], x, a[b][q]);
        }
    }
    for (int b = 0; b < NB; ++b)
        for (int q = 0; q < P; ++q) vstore(acc + b * ld_acc + q * kLanes, a[b][q]);
}

/// conv2d_packed_tile for a run-time P in [1, conv2d_packed_positions(NB)].
template <int NB, class WT, int... Ps>
inline void conv2d_packed_tile_p(std::integer_sequence<int, Ps...>, int P, const WT* w, std::size_t ldb, const float* panel,
                                 std::size_t ldp, int len, float* acc, std::size_t ld_acc, bool first, int far) {
    (void)((P == Ps + 1 ? (conv2d_packed_tile<NB, Ps + 1>(w, ldb, panel, ldp, len, acc, ld_acc, first, far), true) : false) || ...);
}
/// conv2d_packed_tile for run-time NB in [1, kConv2dPackedMaxVecs] and P.
template <class WT>
inline void conv2d_packed_tile_any(int NB, int P, const WT* w, std::size_t ldb, const float* panel, std::size_t ldp, int len,
                                   float* acc, std::size_t ld_acc, bool first, int far = 0) {
    static_assert(kConv2dPackedMaxVecs == 3, "conv2d: the NB switch below covers 1..3");
    auto run = [&](auto nb) {
        constexpr int kNb = decltype(nb)::value;
        conv2d_packed_tile_p<kNb>(std::make_integer_sequence<int, conv2d_packed_positions(kNb)>{}, P, w, ldb, panel, ldp, len,
                                  acc, ld_acc, first, far);
    };
    switch (NB) {
        case 1: run(std::integral_constant<int, 1>{}); return;
        case 2: run(std::integral_constant<int, 2>{}); return;
        default: run(std::integral_constant<int, 3>{}); return;
    }
}

/// How a conv2d on packed weights is cut: output vectors per micro-kernel (nb), positions per tile (P, the image's
/// positions spread evenly over the fewest tiles; the last may be shorter), tiles per position block, output vectors
/// per accumulator slab and the reduction chunk that fits the panel scratch.
struct Conv2dPackedPlan {
    int N = 0, R = 0, vecs = 0, nb = 0, P = 0, tiles = 0, block_tiles = 0, blocks_per_image = 0, slab = 0, len = 0;
    int far = 0;  ///< the first tile's L2 prefetch distance (kConv2dFarPrefetchSteps for weight-streaming convs, else 0)
    explicit Conv2dPackedPlan(const Conv2dParams& p) {
        N = p.out_h * p.out_w;
        far = N <= kConv2dFarPrefetchPositions ? kConv2dFarPrefetchSteps : 0;
        R = p.in_channels * p.kernel_h * p.kernel_w;
        vecs = (p.out_channels + kLanes - 1) / kLanes;
        // Three output vectors when one tile holds the whole image (ResNet layer4's 3x3 output: 3 x 9 on AVX-512),
        // else two (more positions per weight load).
        nb = std::min(vecs, N <= conv2d_packed_positions(3) ? 3 : 2);
        const int pmax = conv2d_packed_positions(nb);
        tiles = (N + pmax - 1) / pmax;
        P = (N + tiles - 1) / tiles;
        block_tiles = std::clamp(kConv2dPackedAccFloats / (vecs * kLanes * P), 1, kConv2dPackedBlockTiles);
        block_tiles = std::min(block_tiles, tiles);
        blocks_per_image = (tiles + block_tiles - 1) / block_tiles;
        const int pb = block_tiles * P;
        slab = std::min(vecs, kConv2dPackedAccFloats / (pb * kLanes));
        if (slab > nb) slab = slab / nb * nb;
        len = std::min(R, int(kScratchFloats / std::size_t(pb)));
    }
};

/// v[l][q] = v[q][l]: a kLanes x kLanes transpose in registers.
inline void transpose_lanes(VecF (&v)[kLanes]) {
#if FLOWEDGE_ISA_AVX512
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    // u[4i + k], 128-bit lane m: rows 4i .. 4i+3 of column 4m + k.
    for (int i = 0; i < 4; ++i) {
        u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
        const __m512 a = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88), b = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
        const __m512 c = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88), d = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
        v[k] = _mm512_shuffle_f32x4(a, c, 0x88);
        v[k + 8] = _mm512_shuffle_f32x4(a, c, 0xDD);
        v[k + 4] = _mm512_shuffle_f32x4(b, d, 0x88);
        v[k + 12] = _mm512_shuffle_f32x4(b, d, 0xDD);
    }
#else
    __m256 t[8], s4[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
    }
    // s4[4h + k], 128-bit half m: rows 4h .. 4h+3 of column 4m + k.
    for (int h = 0; h < 2; ++h) {
        s4[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
        s4[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
        s4[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
        s4[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
    }
    for (int k = 0; k < 4; ++k) {
        v[k] = _mm256_permute2f128_ps(s4[k], s4[4 + k], 0x20);
        v[k + 4] = _mm256_permute2f128_ps(s4[k], s4[4 + k], 0x31);
    }
#endif
}

/// y[b, o, n0 + q] = act((acc + bias[o]) (+ residual[b, o, n0 + q])) for output vectors [v0, v1) (o < out_channels)
/// and positions q < cnt, acc[vector - v0][q][o % kLanes] (pb positions per vector): kLanes positions of a vector at
/// a time, transposed in registers so each output channel's run of positions is one vector store.
inline void conv2d_packed_epilogue(const Conv2dParams& p, int b, int n0, int cnt, int v0, int v1, const float* acc, int pb) {
    const std::size_t N = std::size_t(p.out_h) * std::size_t(p.out_w);
    for (int v = v0; v < v1; ++v) {
        const int lanes = std::min(kLanes, p.out_channels - v * kLanes);
        const float* av = acc + std::size_t(v - v0) * std::size_t(pb) * kLanes;
        for (int q0 = 0; q0 < cnt; q0 += kLanes) {
            const int n = std::min(kLanes, cnt - q0);
            VecF r[kLanes];
            for (int q = 0; q < kLanes; ++q) r[q] = q < n ? vload(av + std::size_t(q0 + q) * kLanes) : vzero();
            transpose_lanes(r);
            for (int l = 0; l < lanes; ++l) {
                const int o = v * kLanes + l;
                const std::size_t base = (std::size_t(b) * p.out_channels + std::size_t(o)) * N + std::size_t(n0 + q0);
                VecF y = p.bias ? vadd(r[l], vset1(p.bias[o])) : r[l];
                if (p.residual) y = vadd(y, packed::load_n(p.residual + base, n));
                packed::store_n(p.y + base, activate_vector(p.act, y), n);
            }
        }
    }
}

/// This thread's share: position blocks [pb0, pb1) of the flattened (image, block) index and output vectors
/// [v0, v1). Per block and slab of output vectors: per reduction chunk the block's panel, then every group of nb
/// output vectors over every tile (accumulating in the slab's scratch), then the epilogue.
template <class WT>
inline void conv2d_packed_part(const Conv2dParams& p, const Conv2dPackedPlan& k, const WT* w, int pb0, int pb1, int v0, int v1) {
    alignas(64) float panel[kScratchFloats];
    alignas(64) float acc[kConv2dPackedAccFloats];
    const std::size_t ldb = std::size_t(k.R) * kLanes;
    for (int blk = pb0; blk < pb1; ++blk) {
        const int b = blk / k.blocks_per_image, t0 = (blk % k.blocks_per_image) * k.block_tiles;
        const int t1 = std::min(k.tiles, t0 + k.block_tiles), n0 = t0 * k.P, cnt = std::min(k.N, t1 * k.P) - n0;
        const int pb = (t1 - t0) * k.P;
        for (int s0 = v0; s0 < v1; s0 += k.slab) {
            const int s1 = std::min(v1, s0 + k.slab);
            for (int j0 = 0; j0 < k.R; j0 += k.len) {
                const int len = std::min(k.len, k.R - j0);
                conv2d_im2col(p, b, n0, cnt, cnt, j0, len, panel);
                for (int g = s0; g < s1; g += k.nb) {
                    const int nbg = std::min(k.nb, s1 - g);
                    const WT* wg = w + std::size_t(g) * ldb + std::size_t(j0) * kLanes;
                    for (int q0 = 0; q0 < cnt; q0 += k.P)
                        conv2d_packed_tile_any(nbg, std::min(k.P, cnt - q0), wg, ldb, panel + q0, std::size_t(cnt), len,
                                               acc + (std::size_t(g - s0) * pb + std::size_t(q0)) * kLanes,
                                               std::size_t(pb) * kLanes, j0 == 0, q0 == 0 ? k.far : 0);
                }
            }
            conv2d_packed_epilogue(p, b, n0, cnt, s0, s1, acc, pb);
        }
    }
}

#if FLOWEDGE_ISA_AVX512
// Implicit panel ("row bands", AVX-512): no im2col. A block of whole output rows [oy0, oy0 + rows) reads a band of the
// input copied once per block and reduction chunk: per input channel i and stride phase (a, b) (a < min(s, kh),
// b < min(s, kw)), band rows r < Hb = rows + (kh - 1) / s of Wb = out_w + (kw - 1) / s floats,
//   band[i][a][b][r][c] = x[i, s * (oy0 + r) + a - pad_h, s * c + b - pad_w]   (zero outside the image).
// Output (oy0 + y, ox) is position q = y * Wb + ox of the block, and step j = (i, u, v) reads band position
// q + tap(u, v) with tap(u, v) = ((u % s) * npw + v % s) * Hb * Wb + (u / s) * Wb + v / s: one offset per step, then
// the micro-kernel's P positions are consecutive floats, as in an im2col panel row. The (kw - 1) / s positions past
// each row's out_w are computed and dropped (the epilogue compresses them out). The band holds ~(rows + halo) / rows
// input floats per output position where the im2col panel held kh * kw / s^2 copies, so 1x1 convs (no copies to
// save) keep the panel. The sums run in the same j order as the im2col path (bit-identical results).

/// Most kernel taps the band path takes (7x7: the ResNet stem).
inline constexpr int kConv2dBandMaxTaps = 49;
/// Most reduction steps per band chunk (the per-step offset table on the stack: 16 KiB).
inline constexpr int kConv2dBandMaxSteps = 4096;
/// Largest share of computed-and-dropped positions the band path accepts ((kw - 1) / s of every Wb). 0.45 admits every
/// 3x3 conv of ResNet18 at the 84x84 crop down to layer4's 3x3 map (40% dropped), which still ran faster than on the
/// panel (bench/results/rgb_encoder_cpu.md, 2026-12-05 band section); a 1-wide map (67%) does not.
inline constexpr double kConv2dBandMaxWaste = 0.45;

/// FLOWEDGE_CPU_CONV2D_NO_BAND=1 keeps every conv on the im2col panel: the old path of an A/B run in one binary.
inline bool conv2d_band_enabled() {
    static const bool on = !::flowedge::cpu::env_is("FLOWEDGE_CPU_CONV2D_NO_BAND", "1");
    return on;
}

/// How a conv2d on packed weights is cut on the band path (see above). `ok` false: take the im2col path.
struct Conv2dBandPlan {
    bool ok = false;
    int vecs = 0, nb = 0, s = 1, nph = 1, npw = 1, Wb = 0, rows = 0, Hb = 0, blocks_per_image = 0, chunk = 0, taps = 0;
    std::size_t cs = 0;  // band floats per input channel
    int tap[kConv2dBandMaxTaps] = {};
    explicit Conv2dBandPlan(const Conv2dParams& p) {
        s = p.stride_h;
        const int kk = p.kernel_h * p.kernel_w;
        if (p.stride_w != s || s < 1 || s > 2 || kk < 2 || kk > kConv2dBandMaxTaps) return;
        if (!conv2d_band_enabled()) return;
        vecs = (p.out_channels + kLanes - 1) / kLanes;
        nb = std::min(vecs, 2);
        const int pmax = conv2d_packed_positions(nb);
        nph = std::min(s, p.kernel_h), npw = std::min(s, p.kernel_w);
        Wb = p.out_w + (p.kernel_w - 1) / s;
        if (double(Wb - p.out_w) > kConv2dBandMaxWaste * Wb) return;
        // Rows per block: up to kConv2dPackedBlockTiles tiles of positions, and all output vectors' accumulators in
        // the scratch where one row allows it (else slabs of output vectors, as the im2col path does).
        const int cap = std::min(kConv2dPackedBlockTiles * pmax, kConv2dPackedAccFloats / (vecs * kLanes));
        rows = std::clamp(cap >= p.out_w ? (cap - p.out_w) / Wb + 1 : 1, 1, p.out_h);
        const int cnt = (rows - 1) * Wb + p.out_w;
        if (cnt * kLanes * nb > kConv2dPackedAccFloats) return;
        Hb = rows + (p.kernel_h - 1) / s;
        cs = std::size_t(nph) * npw * Hb * Wb;
        // A tile reads position q < cnt plus a tap: at most band row Hb - 1, column Wb - 1 of the last phase plane, so
        // every read stays inside the chunk's band (the dropped positions read the next row's first floats).
        if (cs > kScratchFloats) return;
        chunk = int(std::min<std::size_t>({std::size_t(p.in_channels), kScratchFloats / cs,
                                           std::size_t(kConv2dBandMaxSteps / kk)}));
        blocks_per_image = (p.out_h + rows - 1) / rows;
        taps = kk;
        for (int u = 0; u < p.kernel_h; ++u)
            for (int v = 0; v < p.kernel_w; ++v)
                tap[u * p.kernel_w + v] = int(((u % s) * npw + v % s) * std::size_t(Hb) * Wb + std::size_t(u / s) * Wb + v / s);
        ok = true;
    }
};

/// band (see above) for image b, output rows from oy0, input channels [i0, i0 + ci).
inline void conv2d_band_build(const Conv2dParams& p, const Conv2dBandPlan& k, int b, int oy0, int i0, int ci, float* band) {
    const std::size_t plane = std::size_t(p.in_h) * p.in_w;
    const int s = k.s;
    for (int i = 0; i < ci; ++i) {
        const float* xi = p.x + (std::size_t(b) * p.in_channels + std::size_t(i0 + i)) * plane;
        for (int a = 0; a < k.nph; ++a)
            for (int bb = 0; bb < k.npw; ++bb) {
                // Columns c in [c_lo, c_hi) read iw = s * c + bb - pad_w inside the row; the rest are padding.
                const int off = bb - p.pad_w;
                const int c_lo = std::min(k.Wb, off >= 0 ? 0 : (-off + s - 1) / s);
                const int c_hi = std::max(c_lo, std::min(k.Wb, p.in_w - 1 - off >= 0 ? (p.in_w - 1 - off) / s + 1 : 0));
                float* dst = band + std::size_t(i) * k.cs + std::size_t(a * k.npw + bb) * k.Hb * k.Wb;
                for (int r = 0; r < k.Hb; ++r, dst += k.Wb) {
                    const int ih = s * (oy0 + r) + a - p.pad_h;
                    if (ih < 0 || ih >= p.in_h) {
                        std::fill(dst, dst + k.Wb, 0.f);
                        continue;
                    }
                    std::fill(dst, dst + c_lo, 0.f);
                    const float* xr = xi + std::size_t(ih) * p.in_w + s * c_lo + off;
                    if (s == 1) copy_floats(dst + c_lo, xr, c_hi - c_lo);
                    else copy_floats_even(dst + c_lo, xr, c_hi - c_lo);
                    std::fill(dst + c_hi, dst + k.Wb, 0.f);
                }
            }
    }
}

/// conv2d_packed_tile with band addressing: step j reads the P floats at band + off[j]; sums in j order.
template <int NB, int P, class WT>
inline void conv2d_band_tile(const WT* w, std::size_t ldb, const float* band, const int* off, int len, float* acc,
                             std::size_t ld_acc, bool first) {
    VecF a[NB][P];
    for (int b = 0; b < NB; ++b)
        for (int q = 0; q < P; ++q) a[b][q] = first ? vzero() : vload(acc + b * ld_acc + q * kLanes);
    for (int j = 0; j < len; ++j) {
        const float* x = band + off[j];
        VecF wv[NB];
        for (int b = 0; b < NB; ++b) {
            __builtin_prefetch(w + b * ldb + std::size_t(j + kConv2dPrefetchSteps) * kLanes, 0, 3);
            wv[b] = vload(w + b * ldb + std::size_t(j) * kLanes);
        }
        for (int q = 0; q < P; ++q) {
            const VecF xv = vset1(x[q]);
            for (int b = 0; b < NB; ++b) a[b][q] = vfma(wv[b], xv, a[b][q]);
        }
    }
    for (int b = 0; b < NB; ++b)
        for (int q = 0; q < P; ++q) vstore(acc + b * ld_acc + q * kLanes, a[b][q]);
}

template <int NB, class WT, int... Ps>
inline void conv2d_band_tile_p(std::integer_sequence<int, Ps...>, int P, const WT* w, std::size_t ldb, const float* band,
                               const int* off, int len, float* acc, std::size_t ld_acc, bool first) {
    (void)((P == Ps + 1 ? (conv2d_band_tile<NB, Ps + 1>(w, ldb, band, off, len, acc, ld_acc, first), true) : false) || ...);
}

/// y for output vectors [v0, v1) of the block at output rows from oy0, cnt band positions (acc[vector - v0][q][lane],
/// pb positions per vector): as conv2d_packed_epilogue (output vector outer, so each channel's output and residual
/// runs are visited in order), with the positions past each row's out_w compressed out of every 16-position vector
/// before its (contiguous) store.
inline void conv2d_band_epilogue(const Conv2dParams& p, const Conv2dBandPlan& k, int b, int oy0, int cnt, int v0, int v1,
                                 const float* acc, int pb) {
    const std::size_t N = std::size_t(p.out_h) * std::size_t(p.out_w);
    for (int v = v0; v < v1; ++v) {
        const int lanes = std::min(kLanes, p.out_channels - v * kLanes);
        const float* av = acc + std::size_t(v - v0) * std::size_t(pb) * kLanes;
        for (int q0 = 0, c0 = 0; q0 < cnt; q0 += kLanes, c0 = (c0 + kLanes) % k.Wb) {
            const int n = std::min(kLanes, cnt - q0);
            // Lanes of positions inside a row (column c < out_w), and the output index of the first of them.
            __mmask16 keep = 0;
            int first = -1;
            for (int l = 0, c = c0; l < n; ++l, c = c + 1 == k.Wb ? 0 : c + 1)
                if (c < p.out_w) {
                    keep |= __mmask16(1u << l);
                    if (first < 0) first = q0 + l;
                }
            if (first < 0) continue;
            const int kept = __builtin_popcount(keep);
            const std::size_t out0 = std::size_t(oy0 + first / k.Wb) * p.out_w + std::size_t(first % k.Wb);
            VecF r[kLanes];
            for (int q = 0; q < kLanes; ++q) r[q] = q < n ? vload(av + std::size_t(q0 + q) * kLanes) : vzero();
            transpose_lanes(r);
            for (int l = 0; l < lanes; ++l) {
                const int o = v * kLanes + l;
                const std::size_t base = (std::size_t(b) * p.out_channels + std::size_t(o)) * N + out0;
                VecF y = _mm512_maskz_compress_ps(keep, r[l]);
                if (p.bias) y = vadd(y, vset1(p.bias[o]));
                if (p.residual) y = vadd(y, packed::load_n(p.residual + base, kept));
                packed::store_n(p.y + base, activate_vector(p.act, y), kept);
            }
        }
    }
}

/// conv2d_packed_part on the band path: per block of output rows and slab of output vectors, per chunk of input
/// channels the band, then every group of nb output vectors over every tile, then the epilogue.
template <class WT>
inline void conv2d_band_part(const Conv2dParams& p, const Conv2dBandPlan& k, const WT* w, int pb0, int pb1, int v0, int v1) {
    alignas(64) float band[kScratchFloats];
    alignas(64) float acc[kConv2dPackedAccFloats];
    int off[kConv2dBandMaxSteps];
    const int R = p.in_channels * k.taps, pmax = conv2d_packed_positions(k.nb);
    const std::size_t ldb = std::size_t(R) * kLanes;
    for (int blk = pb0; blk < pb1; ++blk) {
        const int b = blk / k.blocks_per_image, oy0 = (blk % k.blocks_per_image) * k.rows;
        const int rows = std::min(k.rows, p.out_h - oy0), cnt = (rows - 1) * k.Wb + p.out_w;
        const int tiles = (cnt + pmax - 1) / pmax, P = (cnt + tiles - 1) / tiles;
        const int slab = std::max(k.nb, std::min(v1 - v0, kConv2dPackedAccFloats / (cnt * kLanes)) / k.nb * k.nb);
        for (int s0 = v0; s0 < v1; s0 += slab) {
            const int s1 = std::min(v1, s0 + slab);
            for (int i0 = 0; i0 < p.in_channels; i0 += k.chunk) {
                const int ci = std::min(k.chunk, p.in_channels - i0), len = ci * k.taps;
                conv2d_band_build(p, k, b, oy0, i0, ci, band);
                for (int c = 0; c < ci; ++c)
                    for (int t = 0; t < k.taps; ++t) off[c * k.taps + t] = int(std::size_t(c) * k.cs) + k.tap[t];
                for (int g = s0; g < s1; g += k.nb) {
                    const int nbg = std::min(k.nb, s1 - g);
                    const WT* wg = w + std::size_t(g) * ldb + std::size_t(i0) * k.taps * kLanes;
                    for (int q0 = 0; q0 < cnt; q0 += P) {
                        const int pq = std::min(P, cnt - q0);
                        float* aq = acc + (std::size_t(g - s0) * cnt + std::size_t(q0)) * kLanes;
                        auto run = [&](auto nbc) {
                            constexpr int kNb = decltype(nbc)::value;
                            conv2d_band_tile_p<kNb>(std::make_integer_sequence<int, conv2d_packed_positions(kNb)>{}, pq, wg, ldb,
                                                    band + q0, off, len, aq, std::size_t(cnt) * kLanes, i0 == 0);
                        };
                        if (nbg == 2) run(std::integral_constant<int, 2>{});
                        else run(std::integral_constant<int, 1>{});
                    }
                }
            }
            conv2d_band_epilogue(p, k, b, oy0, cnt, s0, s1, acc, cnt);
        }
    }
}
#endif  // FLOWEDGE_ISA_AVX512

/// Ops<Cpu>::conv2d on packed weights (dtype dt) after its checks: OpenMP over position blocks when there are enough
/// of them (no panel built twice), else over output vectors in groups of nb (each thread builds the same panels).
inline void conv2d_packed(const Conv2dParams& p, const void* packed, DType dt) {
    const Conv2dPackedPlan k(p);
    const double macs = double(p.batch) * k.N * double(k.R) * p.out_channels;
    [[maybe_unused]] const bool par = macs >= kParallelMacs;
    // part(pb0, pb1, v0, v1) runs position blocks [pb0, pb1) x output vectors [v0, v1) on one path.
    auto split = [&](int blocks, int nb, auto part) {
#pragma omp parallel if (par)
        {
            const int tid = thread_index(), nth = thread_count();
            if (nth == 1) {
                part(0, blocks, 0, k.vecs);
            } else if (blocks >= 2 * nth) {
                part(int(std::int64_t(blocks) * tid / nth), int(std::int64_t(blocks) * (tid + 1) / nth), 0, k.vecs);
            } else {
                const int units = (k.vecs + nb - 1) / nb;
                const int v0 = std::min(k.vecs, int(std::int64_t(units) * tid / nth) * nb);
                const int v1 = std::min(k.vecs, int(std::int64_t(units) * (tid + 1) / nth) * nb);
                if (v0 < v1) part(0, blocks, v0, v1);
            }
        }
    };
    with_weights(packed, dt, [&](auto w) {
#if FLOWEDGE_ISA_AVX512
        if (const Conv2dBandPlan band(p); band.ok)
            return split(p.batch * band.blocks_per_image, band.nb,
                         [&](int pb0, int pb1, int v0, int v1) { conv2d_band_part(p, band, w, pb0, pb1, v0, v1); });
#endif
        split(p.batch * k.blocks_per_image, k.nb, [&](int pb0, int pb1, int v0, int v1) { conv2d_packed_part(p, k, w, pb0, pb1, v0, v1); });
    });
}

#endif  // FLOWEDGE_ISA_SIMD
