// Conv1d on a load-time packed weight layout ("outputs in lanes"): the CPU path of the U-Net convolutions on
// machines with 16 vector registers (AVX2).
//
// Why: the row-major kernels of gemm.hpp take dot products along the reduction index, so each step loads one vector
// per weight row *and* one per activation column. With AVX2's 16 registers only 2 weight rows x 4 columns fit, and
// the im2col panel (4-16 columns x up to 10240 elements, 160 KiB) does not fit a 32 KiB L1, so that kernel is bound
// by panel traffic from L2 and by too few weight streams in flight, far below the FMA peak (docs/performance/cpu.md).
// Here the weights are stored in blocks of kConvBlockWidth<T> outputs (zero-padded past `out`), step by step along
// j = i*K + k (the im2col index), so one block is a single contiguous stream and one step multiplies the block's
// weight vectors by one broadcast activation per column: no horizontal reductions, and the panel is read as one
// scalar per column per step (it is laid out [j][column]).
//
// Layouts (L = kLanes):
//   F32 / F16: blocks of 2 vectors (2L outputs), [block][j][2L], output l at position l.
//   BF16:      blocks of 3 vectors (3L outputs), steps in pairs (an odd R gets a zero step): per pair (j, j+1)
//              3L 32-bit slots: [0, L) step j, low half output l, high half output L + l; [L, 2L) the same for
//              step j+1; [2L, 3L) output 2L + l, low half step j, high half step j+1. One full-width load widens
//              to two vectors with a shift (low halves) and a mask (high halves), no shuffles.
//   INT8 (LoadOptions::quantize = Int8, weight-only): blocks of 2 vectors like F32, one signed byte per weight,
//              [block][j][2L] for j < R, then the block's 2L F32 scales (one per output, zero past `out`) in the
//              bytes of 4 more steps. A step widens in registers (int8 -> int32 -> f32, exact) before the same FMAs;
//              the sums are multiplied by their output's scale once, after the chunk loop (scale_block_sums).
// Why three vectors for BF16: a BF16 step costs a load and two widening ops besides the FMAs, and with 4-cycle FMA
// latency at 2 FMAs per cycle a core needs ~12 independent chains: three vectors x 4 columns keep 12 in flight and
// share each broadcast over 3 FMAs, where two vectors x 4 columns (8 chains) stay well below the FMA peak.
#if FLOWEDGE_ISA_AVX2  // the AVX2 set's layout and kernels; the AVX-512 set calls them (conv1d.hpp, conv_transpose1d.hpp)

/// Output vectors per packed block (see the layouts above) and outputs per block.
template <class T>
inline constexpr int kConvBlockVecs = std::is_same_v<T, bf16> ? 3 : 2;
template <class T>
inline constexpr int kConvBlockWidth = kConvBlockVecs<T> * kLanes;

/// INT8 blocks: the steps' worth of bytes that hold a block's F32 scales after its R weight steps.
inline constexpr std::size_t kInt8ScaleSteps = sizeof(float);

/// Reduction steps one packed block stores for R = in_channels * kernel: R, R rounded up to a whole pair (BF16), or
/// R and the scales (INT8).
template <class T>
constexpr std::size_t packed_conv_steps(std::size_t R) {
    if constexpr (std::is_same_v<T, bf16>) return (R + 1) / 2 * 2;
    else if constexpr (std::is_same_v<T, std::int8_t>) return R + kInt8ScaleSteps;
    else return R;
}

/// Elements of the packed copy of a [out, R] weight matrix: whole blocks.
template <class T>
constexpr std::size_t packed_conv_elements(int out, std::size_t R) {
    constexpr int W = kConvBlockWidth<T>;
    return std::size_t((out + W - 1) / W) * std::size_t(W) * packed_conv_steps<T>(R);
}
inline std::size_t packed_conv_elements(DType dt, int out, std::size_t R) {
    switch (dt) {
        case DType::BF16: return packed_conv_elements<bf16>(out, R);
        case DType::F16: return packed_conv_elements<f16>(out, R);
        default: return packed_conv_elements<float>(out, R);
    }
}

/// F32 / F16: dst[b][j][l] = w[b*2L + l][j] (zero for outputs >= out). w: [out, R] row-major;
/// dst: packed_conv_elements<T>(out, R) elements.
template <class T>
inline void pack_conv_weights(const T* w, int out, std::size_t R, T* dst) {
    pack_output_blocks(w, out, R, kConvBlockWidth<T>, dst);
}
/// INT8 quantisation of one weight row (R values of any stored dtype; `index` names it in errors): symmetric, scale
/// s = max_j |row[j]| / 127, q[j] = round(row[j] / s) in [-127, 127] (an all-zero row gets s = 0, q = 0). Returns s.
/// Non-finite weights are an Error (no finite scale represents them). Load time only.
template <class T>
inline float quantise_row(const T* row, std::size_t R, int index, std::int8_t* q) {
    float amax = 0.f;
    bool finite = true;
    for (std::size_t j = 0; j < R; ++j) {
        const float a = std::fabs(widen(row[j]));
        finite = finite && std::isfinite(a);
        amax = std::max(amax, a);
    }
    if (!finite) [[unlikely]]
        fail(ErrorKind::NonFinite, "cpu int8 weights",
             "LoadOptions::quantize = Int8 needs finite weights" + expected_got("finite values", "a non-finite value in output row " + std::to_string(index)));
    std::fill(q, q + R, std::int8_t(0));
    if (amax == 0.f) return 0.f;
    const float s = amax / 127.f;
    const double inv = 1.0 / double(s);
    for (std::size_t j = 0; j < R; ++j) q[j] = std::int8_t(std::clamp(std::nearbyint(double(widen(row[j])) * inv), -127.0, 127.0));
    return s;
}

/// INT8: each row o of w ([out, R] row-major, any stored dtype) quantised by quantise_row, then laid out as F32 blocks
/// are, followed by the block's scales (the INT8 layout above). dst: packed_conv_elements<std::int8_t>(out, R) bytes.
/// Load time only.
template <class T>
inline void pack_conv_weights(const T* w, int out, std::size_t R, std::int8_t* dst) {
    constexpr int W = kConvBlockWidth<std::int8_t>;
    const int blocks = (out + W - 1) / W;
    const std::size_t stride = std::size_t(W) * packed_conv_steps<std::int8_t>(R);
    std::vector<std::int8_t> rows(std::size_t(W) * R);  // one block's rows quantised, row-major, then transposed
    for (int b = 0; b < blocks; ++b) {
        std::int8_t* db = dst + std::size_t(b) * stride;
        float scales[W] = {};
        std::fill(rows.begin(), rows.end(), std::int8_t(0));
        for (int l = 0; l < W && b * W + l < out; ++l)
            scales[l] = quantise_row(w + std::size_t(b * W + l) * R, R, b * W + l, rows.data() + std::size_t(l) * R);
        for (std::size_t j = 0; j < R; ++j)
            for (int l = 0; l < W; ++l) db[j * W + std::size_t(l)] = rows[std::size_t(l) * R + j];
        std::memcpy(db + R * W, scales, sizeof(scales));
    }
}

/// The F32 scales of the INT8 block at wb (its first step), R its weight steps.
inline const float* int8_block_scales(const std::int8_t* wb, std::size_t R) {
    return reinterpret_cast<const float*>(wb + R * std::size_t(kConvBlockWidth<std::int8_t>));
}

/// tot[c*W + l] *= scale[l] for the nn columns of one INT8 block's sums (W = kConvBlockWidth<std::int8_t>).
inline void scale_block_sums(const float* scale, int nn, float* tot) {
    constexpr int W = kConvBlockWidth<std::int8_t>;
    for (int c = 0; c < nn; ++c)
        for (int v = 0; v < W; v += kLanes) vstore(tot + std::size_t(c) * W + v, vmul(vload(tot + std::size_t(c) * W + v), vload(scale + v)));
}

/// BF16: the paired three-vector layout above. dst: packed_conv_elements<bf16>(out, R) elements.
inline void pack_conv_weights(const bf16* w, int out, std::size_t R, bf16* dst) {
    constexpr int L = kLanes, W = kConvBlockWidth<bf16>;
    const int blocks = (out + W - 1) / W;
    for (int b = 0; b < blocks; ++b) {
        const bf16* rows[W];
        for (int l = 0; l < W; ++l) rows[l] = b * W + l < out ? w + std::size_t(b * W + l) * R : nullptr;
        auto at = [&](int l, std::size_t j) { return rows[l] && j < R ? rows[l][j] : bf16{}; };
        bf16* db = dst + std::size_t(b) * W * packed_conv_steps<bf16>(R);
        for (std::size_t j = 0; j < R; j += 2, db += 2 * W)
            for (int l = 0; l < L; ++l)
                for (int s = 0; s < 2; ++s) {
                    db[s * 2 * L + 2 * l] = at(l, j + s);
                    db[s * 2 * L + 2 * l + 1] = at(L + l, j + s);
                    db[4 * L + 2 * l + s] = at(2 * L + l, j + s);
                }
    }
}

/// ConvTranspose1d weights [in, out, K] packed as the kernel-1 Conv1d they are per input column (Ops<Cpu>::
/// conv_transpose1d computes Z[b, o*K + k, s] = sum_i w[i, o, k] x[b, i, s] with the packed kernels, then scatters Z):
/// row o*K + k of the [out*K, in] matrix is w[:, o, k]. dst: packed_conv_elements<D>(out*K, in) elements (D = T, or
/// std::int8_t for INT8 blocks). Load time only (transposes through a temporary copy).
template <class T, class D>
inline void pack_conv_transpose_weights(const T* w, int in, int out, int K, D* dst) {
    const std::size_t J = std::size_t(out) * std::size_t(K), I = std::size_t(in);
    std::vector<T> rows(J * I);
    constexpr std::size_t kTile = 64;  // cache-sized tiles: a plain strided transpose is slow at the Upsample1d sizes
    for (std::size_t i0 = 0; i0 < I; i0 += kTile)
        for (std::size_t r0 = 0; r0 < J; r0 += kTile)
            for (std::size_t i = i0; i < std::min(I, i0 + kTile); ++i)
                for (std::size_t r = r0; r < std::min(J, r0 + kTile); ++r) rows[r * I + i] = w[i * J + r];
    pack_conv_weights(rows.data(), int(J), I, dst);
}

/// Columns one micro-kernel call takes: vecs*NC accumulators + vecs weight vectors + one broadcast must fit the
/// register file (AVX2: F32 2*6 + 2 + 1 = 15 of 16; BF16 3*4 + 3 + 1 = 16, the widening mask taken from memory).
template <class T>
inline constexpr int kConvMaxCols = std::min(8, (kRegisters - kConvBlockVecs<T> - 1) / kConvBlockVecs<T>);

/// Two output vectors from kLanes elements each at p (F32, F16 widened exactly).
inline void load_pair(const float* p, VecF& w0, VecF& w1) {
    w0 = vload(p);
    w1 = vload(p + kLanes);
}
inline void load_pair(const f16* p, VecF& w0, VecF& w1) {
    w0 = vload(p);
    w1 = vload(p + kLanes);
}
/// INT8: 2 * kLanes signed bytes at p, widened exactly (int8 -> int32 -> f32); the scale comes after the sum.
inline void load_pair(const std::int8_t* p, VecF& w0, VecF& w1) {
    w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kLanes))));
}
/// BF16: kLanes 32-bit slots at p, low halves to w0 (shift), high halves to w1 (mask). A BF16 value is the high
/// half of its float, so both are exact.
inline void load_pair(const bf16* p, VecF& w0, VecF& w1) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    w0 = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    w1 = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(std::int32_t(0xFFFF0000u))));
}

/// Bytes a software prefetch runs ahead of the weight loads (one prefetcht0 per 64-byte line): the ~13 instructions
/// per line limit how far the out-of-order window runs ahead, so the hardware prefetcher alone keeps one packed stream
/// well below the read bandwidth. 2 KiB = 32 F32 steps (distances tried: docs/performance/cpu.md).
#ifndef FLOWEDGE_PACK_PREFETCH_BYTES
#define FLOWEDGE_PACK_PREFETCH_BYTES 2048
#endif
inline constexpr int kPackPrefetchBytes = FLOWEDGE_PACK_PREFETCH_BYTES;

/// acc[v][c] += sum_{j in [0, n)} w_v[j][lane] * x[j*ldx + c], sequentially in j, where w_v[j] is output vector v
/// of packed step j. wp: the block at step j0 (even for BF16); x: panel rows from j0 ([j][column], ldx floats each).
template <int NC, class WT>
inline void packed_steps(const WT* wp, const float* x, std::size_t ldx, int n, VecF (&acc)[2][NC]) {
    // F32 steps are a 64-byte line each (AVX2), F16 steps half a line, INT8 steps a quarter: the loop body covers a
    // whole line, so the prefetch needs no per-step test.
    constexpr int W = kConvBlockWidth<WT>;
    constexpr int kStepsPerLine = int(64 / (W * sizeof(WT))) > 0 ? int(64 / (W * sizeof(WT))) : 1;
    auto step = [&acc](const WT* w, const float* xj) {
        VecF w0, w1;
        load_pair(w, w0, w1);
        // Up to 4 columns, keep the weight vectors in registers: GCC otherwise folds the load into every FMA
        // (12 loads instead of 6 per step at 4 columns). At 5-6 columns there are no spare registers (the asm would
        // force spills), so GCC's choice stays.
        if constexpr (NC <= 4) asm("" : "+x"(w0), "+x"(w1));
        for (int c = 0; c < NC; ++c) {
            const VecF b = vset1(xj[c]);
            acc[0][c] = vfma(w0, b, acc[0][c]);
            acc[1][c] = vfma(w1, b, acc[1][c]);
        }
    };
    int j = 0;
    for (; j + kStepsPerLine <= n; j += kStepsPerLine, wp += kStepsPerLine * W, x += kStepsPerLine * ldx) {
        __builtin_prefetch(reinterpret_cast<const char*>(wp) + kPackPrefetchBytes, 0, 3);
        for (int u = 0; u < kStepsPerLine; ++u) step(wp + u * W, x + std::size_t(u) * ldx);
    }
    for (; j < n; ++j, wp += W, x += ldx) step(wp, x);
}

/// The BF16 form: three vectors per step, steps in pairs (see the layout at the top).
template <int NC>
inline void packed_steps(const bf16* wp, const float* x, std::size_t ldx, int n, VecF (&acc)[3][NC]) {
    constexpr int L = kLanes;
    constexpr int kPairBytes = 6 * L * int(sizeof(bf16));
    auto step = [&acc](VecF w0, VecF w1, VecF w2, const float* xj) {
        for (int c = 0; c < NC; ++c) {
            const VecF b = vset1(xj[c]);
            acc[0][c] = vfma(w0, b, acc[0][c]);
            acc[1][c] = vfma(w1, b, acc[1][c]);
            acc[2][c] = vfma(w2, b, acc[2][c]);
        }
    };
    int j = 0;
    for (; j + 2 <= n; j += 2, wp += 6 * L, x += 2 * ldx) {
        for (int b = 0; b < kPairBytes; b += 64) __builtin_prefetch(reinterpret_cast<const char*>(wp) + kPackPrefetchBytes + b, 0, 3);
        VecF a0, a1, b0, b1, c0, c1;
        load_pair(wp, a0, a1);
        load_pair(wp + 2 * L, b0, b1);
        load_pair(wp + 4 * L, c0, c1);
        step(a0, a1, c0, x);
        step(b0, b1, c1, x + ldx);
    }
    if (j < n) {  // the first step of a last, half-used pair
        VecF a0, a1, c0, c1;
        load_pair(wp, a0, a1);
        load_pair(wp + 4 * L, c0, c1);
        step(a0, a1, c0, x);
    }
}

alignas(32) inline constexpr std::uint32_t kBf16HighMask[8] = {0xFFFF0000u, 0xFFFF0000u, 0xFFFF0000u, 0xFFFF0000u,
                                                                0xFFFF0000u, 0xFFFF0000u, 0xFFFF0000u, 0xFFFF0000u};
/// packed_steps<4> on BF16 blocks for `pairs` >= 1 whole step pairs, AVX2, in inline assembly: 12 accumulators
/// (ymm0-11), the three weight vectors (ymm12-14) and the broadcast (ymm15) use all 16 registers, so the widening
/// mask is a memory operand; GCC's register allocation of the intrinsics form spilled two accumulators per step
/// pair. Same operations in the same order as the intrinsics form (bit-identical results).
inline void packed_pairs_bf16_nc4(const bf16* wp, const float* x, std::size_t ldx, long pairs, VecF (&acc)[3][4]) {
    const long ldx_bytes = long(ldx * sizeof(float));
    // ymm(3c + v) holds acc[v][c], stored at byte (4v + c) * 32 of acc.
    asm volatile(
        "vmovups 0(%[acc]), %%ymm0\n\t"  "vmovups 128(%[acc]), %%ymm1\n\t"  "vmovups 256(%[acc]), %%ymm2\n\t"
        "vmovups 32(%[acc]), %%ymm3\n\t" "vmovups 160(%[acc]), %%ymm4\n\t"  "vmovups 288(%[acc]), %%ymm5\n\t"
        "vmovups 64(%[acc]), %%ymm6\n\t" "vmovups 192(%[acc]), %%ymm7\n\t"  "vmovups 320(%[acc]), %%ymm8\n\t"
        "vmovups 96(%[acc]), %%ymm9\n\t" "vmovups 224(%[acc]), %%ymm10\n\t" "vmovups 352(%[acc]), %%ymm11\n\t"
        "1:\n\t"
        "prefetcht0 %c[pf](%[w])\n\t"
        "prefetcht0 %c[pf]+64(%[w])\n\t"
        // step j: vectors 0, 1 from the first 8 slots, vector 2 from the low halves of the last 8
        "vmovdqu (%[w]), %%ymm12\n\t"
        "vpand %[mask], %%ymm12, %%ymm13\n\t"
        "vpslld $16, %%ymm12, %%ymm12\n\t"
        "vmovdqu 64(%[w]), %%ymm14\n\t"
        "vpslld $16, %%ymm14, %%ymm14\n\t"
        "vbroadcastss (%[x]), %%ymm15\n\t"
        "vfmadd231ps %%ymm12, %%ymm15, %%ymm0\n\t" "vfmadd231ps %%ymm13, %%ymm15, %%ymm1\n\t" "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t"
        "vbroadcastss 4(%[x]), %%ymm15\n\t"
        "vfmadd231ps %%ymm12, %%ymm15, %%ymm3\n\t" "vfmadd231ps %%ymm13, %%ymm15, %%ymm4\n\t" "vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"
        "vbroadcastss 8(%[x]), %%ymm15\n\t"
        "vfmadd231ps %%ymm12, %%ymm15, %%ymm6\n\t" "vfmadd231ps %%ymm13, %%ymm15, %%ymm7\n\t" "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t"
        "vbroadcastss 12(%[x]), %%ymm15\n\t"
        "vfmadd231ps %%ymm12, %%ymm15, %%ymm9\n\t" "vfmadd231ps %%ymm13, %%ymm15, %%ymm10\n\t" "vfmadd231ps %%ymm14, %%ymm15, %%ymm11\n\t"
        // step j + 1: vectors 0, 1 from the middle 8 slots, vector 2 from the high halves of the last 8
        "vmovdqu 32(%[w]), %%ymm12\n\t"
        "vpand %[mask], %%ymm12, %%ymm13\n\t"
        "vpslld $16, %%ymm12, %%ymm12\n\t"
        "vmovdqu 64(%[w]), %%ymm14\n\t"
        "vpand %[mask], %%ymm14, %%ymm14\n\t"
        "vbroadcastss (%[x],%[ld]), %%ymm15\n\t"
        "vfmadd231ps %%ymm12, %%ymm15, %%ymm0\n\t" "vfmadd231ps %%ymm13, %%ymm15, %%ymm1\n\t" "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t"
        "vbroadcastss 4(%[x],%[ld]), %%ymm15\n\t"
        "vfmadd231ps %%ymm12, %%ymm15, %%ymm3\n\t" "vfmadd231ps %%ymm13, %%ymm15, %%ymm4\n\t" "vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"
        "vbroadcastss 8(%[x],%[ld]), %%ymm15\n\t"
        "vfmadd231ps %%ymm12, %%ymm15, %%ymm6\n\t" "vfmadd231ps %%ymm13, %%ymm15, %%ymm7\n\t" "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t"
        "vbroadcastss 12(%[x],%[ld]), %%ymm15\n\t"
        "vfmadd231ps %%ymm12, %%ymm15, %%ymm9\n\t" "vfmadd231ps %%ymm13, %%ymm15, %%ymm10\n\t" "vfmadd231ps %%ymm14, %%ymm15, %%ymm11\n\t"
        "add $96, %[w]\n\t"
        "lea (%[x],%[ld],2), %[x]\n\t"
        "dec %[n]\n\t"
        "jnz 1b\n\t"
        "vmovups %%ymm0, 0(%[acc])\n\t"  "vmovups %%ymm1, 128(%[acc])\n\t"  "vmovups %%ymm2, 256(%[acc])\n\t"
        "vmovups %%ymm3, 32(%[acc])\n\t" "vmovups %%ymm4, 160(%[acc])\n\t"  "vmovups %%ymm5, 288(%[acc])\n\t"
        "vmovups %%ymm6, 64(%[acc])\n\t" "vmovups %%ymm7, 192(%[acc])\n\t"  "vmovups %%ymm8, 320(%[acc])\n\t"
        "vmovups %%ymm9, 96(%[acc])\n\t" "vmovups %%ymm10, 224(%[acc])\n\t" "vmovups %%ymm11, 352(%[acc])\n\t"
        : [w] "+r"(wp), [x] "+r"(x), [n] "+r"(pairs)
        : [ld] "r"(ldx_bytes), [mask] "m"(*reinterpret_cast<const __m256i*>(kBf16HighMask)), [acc] "r"(&acc[0][0]),
          [pf] "i"(kPackPrefetchBytes)
        : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

/// tot[c*W + l] += block x panel columns [c0, c0 + NC) over n steps (fresh accumulators, then added), W the
/// block width of WT.
template <int NC, class WT>
inline void packed_chunk(const WT* wp, const float* x, std::size_t ldx, int n, int c0, float* tot) {
    constexpr int V = kConvBlockVecs<WT>;
    VecF acc[V][NC];
    for (int v = 0; v < V; ++v)
        for (int c = 0; c < NC; ++c) acc[v][c] = vzero();
    if constexpr (std::is_same_v<WT, bf16> && NC == 4) {
        if (n >= 2) packed_pairs_bf16_nc4(wp, x + c0, ldx, n / 2, acc);
        if (n % 2) packed_steps<NC>(wp + std::size_t(n / 2) * 6 * kLanes, x + c0 + std::size_t(n - 1) * ldx, ldx, 1, acc);
    } else {
        packed_steps<NC>(wp, x + c0, ldx, n, acc);
    }
    for (int c = 0; c < NC; ++c)
        for (int v = 0; v < V; ++v) {
            float* t = tot + std::size_t(c0 + c) * kConvBlockWidth<WT> + std::size_t(v) * kLanes;
            vstore(t, vadd(vload(t), acc[v][c]));
        }
}

/// An INT8 weight as Ops<Cpu> hands it to the kernels (PackedWeight::data() when int8()): the blocks, and whether they
/// are the weight-only INT8 blocks above (LoadOptions::quantize = Int8) or W8A8 blocks (WeightQuant::W8A8:
/// kernels/packed_conv_w8a8.hpp), which only the conv1d of the AVX2 and AVX-512 sets runs.
struct Int8Blocks {
    const std::int8_t* data;
    bool w8a8;
};

/// Calls f(typed pointer) with packed conv blocks: the weight-only INT8 blocks (int8: `blocks` is an Int8Blocks) or
/// blocks of the stored dtype.
template <class F>
inline void with_blocks(const void* blocks, DType dtype, bool int8, F&& f) {
    if (!int8) return with_weights(blocks, dtype, static_cast<F&&>(f));
    const auto* q = static_cast<const Int8Blocks*>(blocks);
    if (q->w8a8) [[unlikely]]
        fail(ErrorKind::Internal, "cpu", "W8A8 blocks reached a weight-only INT8 kernel (only Conv1d weights are W8A8)");
    f(q->data);
}

/// Runtime-NC front end of packed_chunk (1 <= nc <= kConvMaxCols<WT>).
template <class WT>
inline void packed_chunk_n(int nc, const WT* wp, const float* x, std::size_t ldx, int n, int c0, float* tot) {
    constexpr int M = kConvMaxCols<WT>;
    switch (nc) {
        case 1: packed_chunk<1>(wp, x, ldx, n, c0, tot); return;
        case 2: packed_chunk<2>(wp, x, ldx, n, c0, tot); return;
        case 3: packed_chunk<3>(wp, x, ldx, n, c0, tot); return;
        case 4: packed_chunk<4>(wp, x, ldx, n, c0, tot); return;
        case 5: if constexpr (M >= 5) { packed_chunk<5>(wp, x, ldx, n, c0, tot); return; } break;
        case 6: if constexpr (M >= 6) { packed_chunk<6>(wp, x, ldx, n, c0, tot); return; } break;
        case 7: if constexpr (M >= 7) { packed_chunk<7>(wp, x, ldx, n, c0, tot); return; } break;
        case 8: if constexpr (M >= 8) { packed_chunk<8>(wp, x, ldx, n, c0, tot); return; } break;
        default: break;
    }
    __builtin_unreachable();
}
#endif  // FLOWEDGE_ISA_AVX2
