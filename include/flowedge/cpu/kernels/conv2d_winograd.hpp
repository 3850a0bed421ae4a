// torch.nn.Conv2d 3x3, stride 1, by Winograd's F(2x2, 3x3) (Lavin & Gray 2016), AVX-512 and AVX2 sets: every 2x2 block
// ("tile") of outputs comes from the 4x4 input patch d under it (rows 2ty - pad_h .., columns 2tx - pad_w ..):
//   V = B^T d B (per input channel),  U = G g G^T (per weight [o][i], made at load),
//   M[xi][tile][o] = sum_i V[xi][tile][i] U[xi][i][o]   (16 independent products, xi = 4 * row + column),
//   y[2x2] = A^T M A,
// with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],
// A^T = [1 1 1 0; 0 1 -1 -1]: 16 multiplies per tile and input channel where the direct conv does 36. The products
// run on conv2d_packed.hpp's micro-kernel ("outputs in lanes": U_xi packed like a Conv2d weight's output blocks with
// the input channel as the reduction step, V_xi as its panel with tiles as positions). The output transform runs
// on the accumulators, then the packed path's epilogue (bias, residual, activation) after a transpose to rows.
// Error bound: docs/numerics.md. Kernel-set body: included once per instruction set by cpu/kernels.hpp; the two
// sets differ only in the input transform's masked loads and even/odd deinterleave (wino_* below).
#if FLOWEDGE_ISA_SIMD

/// FLOWEDGE_CPU_CONV2D_NO_WINOGRAD=1 keeps every conv on the direct paths (and makes no transformed copy at load):
/// the old path of an A/B run in one binary.
inline bool conv2d_winograd_enabled() {
    static const bool on = !::flowedge::cpu::env_is("FLOWEDGE_CPU_CONV2D_NO_WINOGRAD", "1");
    return on;
}

/// Whether a Conv2d weight of this shape and dtype gets the transformed copy at load: 3x3, F32.
inline bool conv2d_winograd_weight(int kh, int kw, DType dt) { return kh == 3 && kw == 3 && dt == DType::F32 && conv2d_winograd_enabled(); }

/// Floats of the transformed copy: [16][out vectors][in][kLanes].
inline std::size_t conv2d_winograd_elements(int out, int in) {
    return std::size_t(16) * std::size_t((out + kLanes - 1) / kLanes) * std::size_t(in) * kLanes;
}

/// dst[xi][o / kLanes][i][o % kLanes] = (G g[o][i] G^T)[xi] (zero past `out`) for a stored F32 [out, in, 3, 3]
/// weight, in double then rounded once. Load time only.
inline void pack_conv2d_winograd(const float* w, int out, int in, float* dst) {
    static constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    const std::size_t vecs = std::size_t((out + kLanes - 1) / kLanes);
    std::fill(dst, dst + conv2d_winograd_elements(out, in), 0.f);
    for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) {
            const float* g = w + (std::size_t(o) * in + std::size_t(i)) * 9;
            double t[4][3];  // G g
            for (int a = 0; a < 4; ++a)
                for (int v = 0; v < 3; ++v) t[a][v] = G[a][0] * g[v] + G[a][1] * g[3 + v] + G[a][2] * g[6 + v];
            for (int a = 0; a < 4; ++a)
                for (int c = 0; c < 4; ++c) {
                    const double s = t[a][0] * G[c][0] + t[a][1] * G[c][1] + t[a][2] * G[c][2];
                    const std::size_t xi = std::size_t(a * 4 + c);
                    dst[((xi * vecs + std::size_t(o / kLanes)) * std::size_t(in) + std::size_t(i)) * kLanes + std::size_t(o % kLanes)] =
                        float(s);
                }
        }
}

/// Accumulator floats per thread ([xi][output vector of the slab][tile][kLanes]).
inline constexpr int kConv2dWinogradAccFloats = 64 * 1024;
/// Output vectors per accumulator slab: the input transform is redone per slab, so the more the better while the
/// accumulators of a tile block stay in L2.
inline constexpr int kConv2dWinogradSlab = 8;
/// Largest share of a tile's 16 products the direct conv's 9 per output would beat: tiles * 16 / (positions * 9)
/// above this keeps the direct paths (partial tiles at small odd maps: PushT's 3x3 layer4, 0.79, where the 16/9
/// weight bytes also make it slower).
inline constexpr double kConv2dWinogradMaxMulRatio = 0.6;

/// How a Winograd conv2d is cut: tiles per image (th x tw), output vectors and their groups (nb) and slabs, tiles
/// per micro-kernel call (P) and per block (T), input channels per transform chunk (ci). `ok` false: take the
/// direct paths. any_size: skip the size rule (the op tests run the kernel at maps the rule leaves direct).
struct Conv2dWinogradPlan {
    bool ok = false;
    int th = 0, tw = 0, tiles = 0, vecs = 0, nb = 0, P = 0, slab = 0, T = 0, ci = 0, blocks_per_image = 0;
    explicit Conv2dWinogradPlan(const Conv2dParams& p, bool any_size = false) {
        if (p.kernel_h != 3 || p.kernel_w != 3 || p.stride_h != 1 || p.stride_w != 1 || !conv2d_winograd_enabled()) return;
        th = (p.out_h + 1) / 2, tw = (p.out_w + 1) / 2, tiles = th * tw;
        if (!any_size && double(tiles) * 16 > kConv2dWinogradMaxMulRatio * 9 * double(p.out_h) * p.out_w) return;
        vecs = (p.out_channels + kLanes - 1) / kLanes;
        nb = std::min(vecs, 2);
        P = conv2d_packed_positions(nb);
        slab = std::min(vecs, kConv2dWinogradSlab);
        T = std::max(P, kConv2dWinogradAccFloats / (16 * kLanes * slab) / P * P);
        T = std::min(T, tiles);
        ci = std::min<int>(p.in_channels, int(kScratchFloats / (16 * std::size_t(T))));
        blocks_per_image = (tiles + T - 1) / T;
        ok = ci >= 1;
    }
};

#if FLOWEDGE_ISA_AVX512
/// Lanes j of a load at input column c + j that fall inside a row of w columns.
using WinoMask = __mmask16;
inline WinoMask wino_inside(int c, int w) {
    const int lo = std::clamp(-c, 0, kLanes), hi = std::clamp(w - c, lo, kLanes);
    return WinoMask(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}
/// The lanes of m from p (the others 0; lanes outside m are never read, so p may point outside the row).
inline VecF wino_load(WinoMask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
/// even[j] = (lo, hi)[2j], odd[j] = (lo, hi)[2j + 1] over the 2 kLanes floats of lo then hi.
inline void wino_deinterleave(VecF lo, VecF hi, VecF& even, VecF& odd) {
    const __m512i e = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    even = _mm512_permutex2var_ps(lo, e, hi);
    odd = _mm512_permutex2var_ps(lo, _mm512_add_epi32(e, _mm512_set1_epi32(1)), hi);
}
inline VecF wsub(VecF a, VecF b) { return _mm512_sub_ps(a, b); }
#else
using WinoMask = __m256i;
inline WinoMask wino_inside(int c, int w) {
    const int lo = std::clamp(-c, 0, kLanes), hi = std::clamp(w - c, lo, kLanes);
    const __m256i j = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(hi), j), _mm256_cmpgt_epi32(j, _mm256_set1_epi32(lo - 1)));
}
inline VecF wino_load(WinoMask m, const float* p) { return _mm256_maskload_ps(p, m); }
inline void wino_deinterleave(VecF lo, VecF hi, VecF& even, VecF& odd) {
    // per 128-bit half: lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6, then the 64-bit pairs reordered
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
}
inline VecF wsub(VecF a, VecF b) { return _mm256_sub_ps(a, b); }
#endif

/// V[xi][i][t - t0] (V + (xi * ci_stride + i) * ldv + t - t0) = (B^T d B)[xi] for input channels [i0, i0 + ci) of
/// image b and tiles [t0, t1), kLanes tiles of a tile row at a time: each of the patch's 4 input rows is read by four
/// masked loads (lanes outside the image read as the zero padding, and never fault), and column c of the kLanes tiles
/// is the even or odd lanes of two of them (deinterleaved by permutes).
inline void conv2d_winograd_input(const Conv2dParams& p, const Conv2dWinogradPlan& k, int b, int t0, int t1, int i0, int ci,
                                  float* V, std::size_t ci_stride, std::size_t ldv) {
    const std::size_t plane = std::size_t(p.in_h) * p.in_w;
    const std::size_t step = ci_stride * ldv;
    for (int ts = t0; ts < t1;) {
        const int ty = ts / k.tw, tx0 = ts % k.tw, n = std::min(k.tw - tx0, t1 - ts);
        for (int k0 = 0; k0 < n; k0 += kLanes) {
            const int m = std::min(kLanes, n - k0), c = 2 * (tx0 + k0) - p.pad_w;
            // A short chunk still stores whole vectors where they stay inside the V row: the extra lanes land on tiles
            // of a later segment (rewritten when it comes) or past the block's tiles (never read), and a whole store
            // avoids the masked one (microcoded on AMD Zen 2/3, see store_n).
            const int sm = ts - t0 + k0 + kLanes <= int(ldv) ? kLanes : m;
            const WinoMask m0 = wino_inside(c, p.in_w), m1 = wino_inside(c + kLanes, p.in_w);
            const WinoMask m2 = wino_inside(c + 2, p.in_w), m3 = wino_inside(c + 2 + kLanes, p.in_w);
            for (int i = 0; i < ci; ++i) {
                const float* xi = p.x + (std::size_t(b) * p.in_channels + std::size_t(i0 + i)) * plane;
                VecF d[4][4];
                for (int r = 0; r < 4; ++r) {
                    const int ih = 2 * ty - p.pad_h + r;
                    if (ih < 0 || ih >= p.in_h) {
                        d[r][0] = d[r][1] = d[r][2] = d[r][3] = vzero();
                        continue;
                    }
                    // The row pointer offset by c may point before the row: only in-row lanes are read.
                    const float* base = xi + std::size_t(ih) * p.in_w;
                    wino_deinterleave(wino_load(m0, base + c), wino_load(m1, base + c + kLanes), d[r][0], d[r][1]);
                    wino_deinterleave(wino_load(m2, base + c + 2), wino_load(m3, base + c + 2 + kLanes), d[r][2], d[r][3]);
                }
                VecF t[4][4];
                for (int cc = 0; cc < 4; ++cc) {
                    t[0][cc] = wsub(d[0][cc], d[2][cc]);
                    t[1][cc] = vadd(d[1][cc], d[2][cc]);
                    t[2][cc] = wsub(d[2][cc], d[1][cc]);
                    t[3][cc] = wsub(d[1][cc], d[3][cc]);
                }
                float* dst = V + std::size_t(i) * ldv + std::size_t(ts - t0 + k0);
                for (int r = 0; r < 4; ++r) {
                    float* dr = dst + std::size_t(4 * r) * step;
                    packed::store_n(dr, wsub(t[r][0], t[r][2]), sm);
                    packed::store_n(dr + step, vadd(t[r][1], t[r][2]), sm);
                    packed::store_n(dr + 2 * step, wsub(t[r][2], t[r][1]), sm);
                    packed::store_n(dr + 3 * step, wsub(t[r][1], t[r][3]), sm);
                }
            }
        }
        ts += n;
    }
}

/// y for output vectors [s0, s1) of image b's tiles [t0, t1) from the accumulators (acc + ((xi * slab + v - s0) * T
/// + t - t0) * kLanes): per tile row segment and output vector, Y = A^T M A per tile into stage[row][column][lane],
/// then 16 columns at a time transposed to channel rows and stored as conv2d_packed_epilogue does (acc + bias
/// (+ residual), activation).
inline void conv2d_winograd_output(const Conv2dParams& p, const Conv2dWinogradPlan& k, int b, int t0, int t1, int s0, int s1,
                                   const float* acc, float* stage) {
    const std::size_t N = std::size_t(p.out_h) * p.out_w, ldx = std::size_t(k.slab) * k.T * kLanes;
    const std::size_t lds = std::size_t(2 * k.T + kLanes) * kLanes;  // one staged row: 2 columns per tile + slack
    for (int ts = t0; ts < t1;) {
        const int ty = ts / k.tw, tx0 = ts % k.tw, n = std::min(k.tw - tx0, t1 - ts);
        const int cols = std::min(2 * n, p.out_w - 2 * tx0);
        for (int v = s0; v < s1; ++v) {
            const float* av = acc + (std::size_t(v - s0) * k.T + std::size_t(ts - t0)) * kLanes;
            for (int q = 0; q < n; ++q) {
                VecF m[16];
                for (int x = 0; x < 16; ++x) m[x] = vload(av + std::size_t(x) * ldx + std::size_t(q) * kLanes);
                VecF s[2][4];
                for (int c = 0; c < 4; ++c) {
                    s[0][c] = vadd(vadd(m[c], m[4 + c]), m[8 + c]);
                    s[1][c] = wsub(wsub(m[4 + c], m[8 + c]), m[12 + c]);
                }
                for (int r = 0; r < 2; ++r) {
                    vstore(stage + std::size_t(r) * lds + std::size_t(2 * q) * kLanes, vadd(vadd(s[r][0], s[r][1]), s[r][2]));
                    vstore(stage + std::size_t(r) * lds + std::size_t(2 * q + 1) * kLanes,
                           wsub(wsub(s[r][1], s[r][2]), s[r][3]));
                }
            }
            const int lanes = std::min(kLanes, p.out_channels - v * kLanes);
            for (int r = 0; r < 2 && 2 * ty + r < p.out_h; ++r)
                for (int q0 = 0; q0 < cols; q0 += kLanes) {
                    const int cnt = std::min(kLanes, cols - q0);
                    VecF z[kLanes];
                    for (int q = 0; q < kLanes; ++q) z[q] = q < cnt ? vload(stage + std::size_t(r) * lds + std::size_t(q0 + q) * kLanes) : vzero();
                    transpose_lanes(z);
                    for (int l = 0; l < lanes; ++l) {
                        const int o = v * kLanes + l;
                        const std::size_t base = (std::size_t(b) * p.out_channels + std::size_t(o)) * N +
                                                 std::size_t(2 * ty + r) * p.out_w + std::size_t(2 * tx0 + q0);
                        VecF y = p.bias ? vadd(z[l], vset1(p.bias[o])) : z[l];
                        if (p.residual) y = vadd(y, packed::load_n(p.residual + base, cnt));
                        packed::store_n(p.y + base, activate_vector(p.act, y), cnt);
                    }
                }
        }
        ts += n;
    }
}

/// This thread's share: tile blocks [pb0, pb1) of the flattened (image, block) index and output vectors [v0, v1).
/// Per block and slab: per input channel chunk the input transform, then the 16 products over every group of nb
/// output vectors and micro-tile of P tiles (accumulating across chunks in the chunk order: the same sums whatever
/// the thread split), then the output transform and epilogue.
inline void conv2d_winograd_part(const Conv2dParams& p, const Conv2dWinogradPlan& k, const float* U, int pb0, int pb1, int v0, int v1) {
    alignas(64) float V[kScratchFloats];
    alignas(64) float acc[kConv2dWinogradAccFloats];
    // Two staged output rows of a block's widest segment (2 columns per tile) and a transpose's slack.
    alignas(64) float stage[2 * (2 * kConv2dWinogradAccFloats / (16 * kLanes) + kLanes) * kLanes];
    const std::size_t ldb = std::size_t(p.in_channels) * kLanes, ldv = std::size_t(k.T);
    for (int blk = pb0; blk < pb1; ++blk) {
        const int b = blk / k.blocks_per_image, t0 = (blk % k.blocks_per_image) * k.T, t1 = std::min(k.tiles, t0 + k.T);
        const int cnt = t1 - t0;
        for (int s0 = v0; s0 < v1; s0 += k.slab) {
            const int s1 = std::min(v1, s0 + k.slab);
            for (int i0 = 0; i0 < p.in_channels; i0 += k.ci) {
                const int ci = std::min(k.ci, p.in_channels - i0);
                conv2d_winograd_input(p, k, b, t0, t1, i0, ci, V, std::size_t(k.ci), ldv);
                for (int x = 0; x < 16; ++x) {
                    const float* panel = V + std::size_t(x) * k.ci * ldv;
                    for (int g = s0; g < s1; g += k.nb) {
                        const int nbg = std::min(k.nb, s1 - g);
                        const float* wg = U + (std::size_t(x) * k.vecs + std::size_t(g)) * ldb + std::size_t(i0) * kLanes;
                        float* ag = acc + (std::size_t(x) * k.slab + std::size_t(g - s0)) * ldv * kLanes;
                        for (int q0 = 0; q0 < cnt; q0 += k.P)
                            conv2d_packed_tile_any(nbg, std::min(k.P, cnt - q0), wg, ldb, panel + q0, ldv, ci,
                                                   ag + std::size_t(q0) * kLanes, ldv * kLanes, i0 == 0);
                    }
                }
            }
            conv2d_winograd_output(p, k, b, t0, t1, s0, s1, acc, stage);
        }
    }
}

/// Ops<Cpu>::conv2d by Winograd (plan k.ok) on the transformed weights U (pack_conv2d_winograd): OpenMP over tile
/// blocks when there are enough of them, else over output vectors in groups of nb, as conv2d_packed splits.
inline void conv2d_winograd(const Conv2dParams& p, const Conv2dWinogradPlan& k, const float* U) {
    const double macs = double(p.batch) * double(k.tiles) * 16.0 * p.in_channels * p.out_channels;
    [[maybe_unused]] const bool par = macs >= kParallelMacs;
    const int blocks = p.batch * k.blocks_per_image;
#pragma omp parallel if (par)
    {
        const int tid = thread_index(), nth = thread_count();
        if (nth == 1) {
            conv2d_winograd_part(p, k, U, 0, blocks, 0, k.vecs);
        } else if (blocks >= 2 * nth) {
            conv2d_winograd_part(p, k, U, int(std::int64_t(blocks) * tid / nth), int(std::int64_t(blocks) * (tid + 1) / nth), 0, k.vecs);
        } else {
            const int units = (k.vecs + k.nb - 1) / k.nb;
            const int v0 = std::min(k.vecs, int(std::int64_t(units) * tid / nth) * k.nb);
            const int v1 = std::min(k.vecs, int(std::int64_t(units) * (tid + 1) / nth) * k.nb);
            if (v0 < v1) conv2d_winograd_part(p, k, U, 0, blocks, v0, v1);
        }
    }
}

#endif  // FLOWEDGE_ISA_SIMD
