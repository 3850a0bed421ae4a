// The AVX-512 kernel set's vocabulary: 16-lane float vectors, loads that widen BF16/F16 weights in registers,
// the vector exp/log/activations, and the BF16 dot product (vdpbf16ps) used only where the CPU has AVX512_BF16.
// Included once, inside the AVX-512 region of cpu/kernels.hpp.
#pragma once

/// Float lanes per vector and vector registers available to a micro-kernel.
inline constexpr int kLanes = 16;
inline constexpr int kRegisters = 32;
using VecF = __m512;
inline VecF vzero() { return _mm512_setzero_ps(); }
inline VecF vset1(float v) { return _mm512_set1_ps(v); }
inline VecF vload(const float* p) { return _mm512_loadu_ps(p); }
inline VecF vload(const bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline VecF vload(const f16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void vstore(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF vadd(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline float vsum(VecF v) { return _mm512_reduce_add_ps(v); }
/// Loads the first n (0..16) elements, zero in the other lanes (masked: never touches memory past n).
inline __mmask16 lane_mask(int n) { return __mmask16((1u << n) - 1u); }
inline VecF vload_n(const float* p, int n) { return _mm512_maskz_loadu_ps(lane_mask(n), p); }
inline VecF vload_n(const bf16* p, int n) {
    const __m256i h = _mm256_maskz_loadu_epi16(lane_mask(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline VecF vload_n(const f16* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lane_mask(n), p)); }
/// dst[0, n) = src[0, n) for a short run (an im2col row segment): whole vectors and one masked tail, no library call
/// and no access past either end.
inline void copy_floats(float* dst, const float* src, int n) {
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) vstore(dst + i, vload(src + i));
    if (i < n) _mm512_mask_storeu_ps(dst + i, lane_mask(n - i), _mm512_maskz_loadu_ps(lane_mask(n - i), src + i));
}

/// dst[s] = src[2 s] for s < n (a stride-2 im2col row segment): even lanes of two vectors per 16 outputs, masked
/// at the tail; reads nothing past src[2 n - 2].
inline void copy_floats_even(float* dst, const float* src, int n) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (int i = 0; i < n; i += kLanes) {
        const int m = std::min(kLanes, n - i), have = 2 * m - 1;  // source floats this step may read
        const __m512 lo = _mm512_maskz_loadu_ps(lane_mask(std::min(kLanes, have)), src + 2 * i);
        const __m512 hi = _mm512_maskz_loadu_ps(lane_mask(std::max(0, have - kLanes)), src + 2 * i + kLanes);
        _mm512_mask_storeu_ps(dst + i, lane_mask(m), _mm512_permutex2var_ps(lo, even, hi));
    }
}

/// r[i] = sum of the 16 lanes of v[i] for 16 vectors (a transpose-and-add tree: 30 shuffles, 15 adds,
/// instead of 16 separate horizontal reductions).
inline VecF vsum16(const VecF (&v)[16]) {
    __m512 s[8], u[4];
    for (int k = 0; k < 8; ++k)
        s[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int m = 0; m < 4; ++m)
        u[m] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * m], s[2 * m + 1], 0x44), _mm512_shuffle_ps(s[2 * m], s[2 * m + 1], 0xEE));
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    // Lane 4m + q of the result: sum of v[4m + q] (w01 lanes [u0 half sums, u1 half sums], likewise w23).
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

/// BF16 dot-product vocabulary (AVX512_BF16): compiled with the set, run only when bf16_math_available().
/// MathMode::BF16 kernels exist in this build (AVX-512 BF16: vcvtne2ps2bf16 and vdpbf16ps).
#define FLOWEDGE_CPU_BF16_MATH 1
/// BF16 elements per BF16 vector (one vdpbf16ps step along the reduction).
inline constexpr int kLanesBh = 32;
using VecBh = __m512bh;
/// 32 F32 values rounded to BF16 (round to nearest even, input denormals read as zero: vcvtne2ps2bf16);
/// lo are elements 0..15, hi elements 16..31.
inline VecBh to_bh(__m512 lo, __m512 hi) { return _mm512_cvtne2ps_pbh(hi, lo); }
inline __mmask32 lane_mask_bh(int n) { return n >= 32 ? ~__mmask32(0) : __mmask32((1u << n) - 1u); }
/// 32 consecutive elements as BF16: stored BF16 as is, F32/F16 rounded once to BF16 (F16 widening is exact).
inline VecBh vload_bh(const bf16* p) { return VecBh(_mm512_loadu_si512(p)); }
inline VecBh vload_bh(const float* p) { return to_bh(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)); }
inline VecBh vload_bh(const f16* p) {
    return to_bh(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
                 _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16))));
}
/// The first n (0..32) elements as BF16, zero in the other lanes (masked: never touches memory past n).
inline VecBh vload_bh_n(const bf16* p, int n) { return VecBh(_mm512_maskz_loadu_epi16(lane_mask_bh(n), p)); }
inline VecBh vload_bh_n(const float* p, int n) {
    return to_bh(_mm512_maskz_loadu_ps(lane_mask(n < 16 ? n : 16), p), _mm512_maskz_loadu_ps(lane_mask(n > 16 ? n - 16 : 0), p + 16));
}
inline VecBh vload_bh_n(const f16* p, int n) {
    return to_bh(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lane_mask(n < 16 ? n : 16), p)),
                 _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lane_mask(n > 16 ? n - 16 : 0), p + 16)));
}
/// acc[i] += a[2i] * b[2i] + a[2i+1] * b[2i+1] (vdpbf16ps: exact products, F32 accumulation, DAZ/FTZ, RNE).
inline VecF vdot_bh(VecF acc, VecBh a, VecBh b) { return _mm512_dpbf16_ps(acc, a, b); }
/// dst[0, 32) = BF16(src[0, n)) then zeros (n <= 32; an aligned 64-byte store). A function, not an expression at the
/// call site, so OpenMP regions (outlined without the set's target by clang) pass it only pointers.
inline void store_bh_n(bf16* dst, const float* src, int n) {
    _mm512_store_si512(dst, __m512i(n == 32 ? vload_bh(src) : vload_bh_n(src, n)));
}
/// dst[0, round_up(n, 32)) = BF16(src[0, n)) followed by zeros up to the next multiple of 32.
inline void round_to_bh(const float* src, int n, bf16* dst) {
    int j = 0;
    for (; j + 32 <= n; j += 32) _mm512_storeu_si512(dst + j, __m512i(vload_bh(src + j)));
    if (j < n) _mm512_storeu_si512(dst + j, __m512i(vload_bh_n(src + j, n - j)));
}


/// exp(x) for 16 floats: Cody-Waite reduction by ln 2 and a degree-6 polynomial on [-ln2/2, ln2/2]
/// (Cephes expf coefficients), scaled by 2^n with vscalefps. About 1 ulp (r + r^2 P(r) first, then + 1; measured
/// bound: docs/numerics.md#vector-math-functions); underflows to 0 below -104.
inline __m512 vexp(__m512 x) {
    // Constant first: vmaxps/vminps return their second operand when one is NaN, so a NaN stays NaN (a NaN
    // activation must not turn into a finite softplus/exp and hide upstream corruption).
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-104.f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 r2 = _mm512_mul_ps(r, r);
    p = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.f));  // one rounding at the final + 1
    return _mm512_scalef_ps(p, n);
}

/// log(x) for 16 positive finite floats: x = m 2^k with m in [sqrt(1/2), sqrt(2)) (vgetmant/vgetexp), then the
/// Cephes logf polynomial in m - 1. About 1 ulp.
inline __m512 vlog(__m512 x) {
    __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
    __m512 k = _mm512_getexp_ps(x);
    const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356237f), _CMP_GT_OQ);
    m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
    k = _mm512_mask_add_ps(k, big, k, _mm512_set1_ps(1.f));
    const __m512 f = _mm512_sub_ps(m, _mm512_set1_ps(1.f));
    const __m512 z = _mm512_mul_ps(f, f);
    __m512 y = _mm512_set1_ps(7.0376836292e-2f);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.1514610310e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.1676998740e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.2420140846e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.4249322787e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.6668057665e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.0000714765e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-2.4999993993e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(3.3333331174e-1f));
    y = _mm512_mul_ps(_mm512_mul_ps(y, f), z);
    y = _mm512_fmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), y);
    y = _mm512_fnmadd_ps(z, _mm512_set1_ps(0.5f), y);
    return _mm512_fmadd_ps(k, _mm512_set1_ps(0.693359375f), _mm512_add_ps(f, y));
}

/// SiLU of 16 floats: x / (1 + exp(-x)).
inline __m512 vsilu(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), vexp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

/// Softplus (beta 1, threshold 20) of 16 floats: log1p(exp(x)) with log1p(e) = log(u) * e / (u - 1), u = 1 + e
/// (exact-correction form; e itself when u rounds to 1), x where x > 20.
inline __m512 vsoftplus(__m512 x) {
    const __m512 e = vexp(x);
    const __m512 u = _mm512_add_ps(_mm512_set1_ps(1.f), e);
    const __m512 d = _mm512_sub_ps(u, _mm512_set1_ps(1.f));
    const __mmask16 exact = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ);
    const __m512 l = _mm512_mask_div_ps(e, exact, _mm512_mul_ps(vlog(u), e), d);
    return _mm512_mask_mov_ps(l, _mm512_cmp_ps_mask(x, _mm512_set1_ps(20.f), _CMP_GT_OQ), x);
}

/// Mish of 16 floats: x * tanh(softplus(x)) = x * m / (m + 2) with m = e (e + 2), e = exp(x), since
/// tanh(log(1 + e)) = ((1 + e)^2 - 1) / ((1 + e)^2 + 1); no cancellation for negative x (m ~ 2e), and x itself
/// above 20 (torch's softplus threshold; the ratio is already 1.0f from x ~ 9). A few ulp from the scalar form.
/// (The U-Net applies Mish to every GroupNorm output, so scalar tanh/log1p/exp there cost a visible share of a sample.)
inline __m512 vmish(__m512 x) {
    const __m512 e = vexp(_mm512_min_ps(x, _mm512_set1_ps(20.f)));
    const __m512 m = _mm512_mul_ps(e, _mm512_add_ps(e, _mm512_set1_ps(2.f)));
    const __m512 y = _mm512_mul_ps(x, _mm512_div_ps(m, _mm512_add_ps(m, _mm512_set1_ps(2.f))));
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(20.f), _CMP_GT_OQ), x);
}

/// ReLU of 16 floats: vmaxps returns its second operand when either is NaN, so max(0, x) keeps a NaN x (torch.relu).
inline __m512 vrelu(__m512 x) { return _mm512_max_ps(_mm512_setzero_ps(), x); }

/// Applies `act` in place to n contiguous values (the switch hoisted out of the loop; vectorised, masked tail).
inline void activate_inplace(Activation act, float* v, long long n) {
    if (act != Activation::None) {
        auto run = [&](auto f) {
            long long i = 0;
            for (; i + 16 <= n; i += 16) _mm512_storeu_ps(v + i, f(_mm512_loadu_ps(v + i)));
            if (i < n) {
                const __mmask16 m = __mmask16((1u << (n - i)) - 1u);
                _mm512_mask_storeu_ps(v + i, m, f(_mm512_maskz_loadu_ps(m, v + i)));
            }
        };
        if (act == Activation::Silu) run([](__m512 x) { return vsilu(x); });
        else if (act == Activation::Relu) run([](__m512 x) { return vrelu(x); });
        else if (act == Activation::Softplus) run([](__m512 x) { return vsoftplus(x); });
        else run([](__m512 x) { return vmish(x); });
        return;
    }
    activate_scalar(act, v, n);
}

/// Packed small-row linear vocabulary (kernels/packed_linear.hpp): 32-bit pair lanes and masked row tails.
namespace packed {
using VecU = __m512i;
inline VecU load_u(const std::uint32_t* p) { return _mm512_loadu_si512(p); }
inline void store_u(std::uint32_t* p, VecU v) { _mm512_storeu_si512(p, v); }
/// Weight k (low half of each 32-bit lane) as floats: the BF16 bits moved to the top.
inline VecF even_half(VecU v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
/// Weight k+1 (high half) as floats: the low half cleared.
inline VecF odd_half(VecU v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xFFFF0000u)))); }
inline VecF load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(lane_mask(n), p); }
inline void store_n(float* p, VecF v, int n) { _mm512_mask_storeu_ps(p, lane_mask(n), v); }
inline VecF activate_vec(Activation act, VecF v) {
    switch (act) {
        case Activation::None: return v;
        case Activation::Silu: return vsilu(v);
        case Activation::Softplus: return vsoftplus(v);
        case Activation::Mish: return vmish(v);
        case Activation::Relu: return vrelu(v);
    }
    return v;
}
/// Whether the tile epilogue applies the activation in registers (else activate_inplace over the stored segment).
inline bool act_in_registers(const LinearParams&) { return true; }
}  // namespace packed

/// AMX-BF16 vocabulary for kernels/packed_linear.hpp's MathMode::BF16 tiles, run only where amx_bf16_available().
/// Inline assembly with fixed tile registers (an AMX instruction names its tiles as immediates anyway), so the set's
/// target needs no AMX flags: tmm0-3 accumulate C (rows x 16 floats), tmm4 holds A (rows x 16 BF16 x pairs), tmm5-7
/// take B (16 pairs x 16 outputs, the VNNI order of the Pairs layout) in turn.
namespace amx {
/// ldtilecfg's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
};
/// Configures C (tmm0-3) and A (tmm4) as `rows` x 64 bytes and B (tmm5-7) as 16 x 64 bytes, unless the thread's
/// tile state already holds exactly that: reading the state back and comparing is far cheaper than ldtilecfg on
/// microsecond products (docs/performance/cpu.md#mamba-flow-per-core-issue-22). Reading the configuration back rather
/// than remembering it stays right when other code on the thread uses AMX in between.
inline void configure(int rows) {
    TileConfig want, have;
    for (int t = 0; t < 8; ++t) {
        want.colsb[t] = 64;
        want.rows[t] = std::uint8_t(t < 5 ? rows : 16);
    }
    asm volatile("sttilecfg %0" : "=m"(have));
    if (std::memcmp(&want, &have, sizeof want) != 0) asm volatile("ldtilecfg %0" ::"m"(want));
}
inline void zero_c() { asm volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::: "memory"); }
/// A (tmm4) from p, rows `stride` bytes apart.
inline void load_a(const void* p, std::size_t stride) { asm volatile("tileloadd (%0,%1,1), %%tmm4" ::"r"(p), "r"(stride) : "memory"); }
/// C[j] += A x B for one contiguous 1 KiB B tile at p (16 rows of 64 bytes); B goes through tmm5 + j % 3. kStream loads
/// B with tileloaddt1 (the non-temporal hint: weights read once per call, which would only evict what the
/// neighbouring ops keep in L1); same tile registers either way.
template <int J, bool kStream = false>
inline void dot(const void* p) {
    static_assert(J >= 0 && J < 4);
    constexpr std::size_t stride = 64;
#define FLOWEDGE_AMX_DOT(LOAD)                                                                                                     \
    if constexpr (J == 0) asm volatile(LOAD " (%0,%1,1), %%tmm5\n\ttdpbf16ps %%tmm5, %%tmm4, %%tmm0" ::"r"(p), "r"(stride) : "memory"); \
    if constexpr (J == 1) asm volatile(LOAD " (%0,%1,1), %%tmm6\n\ttdpbf16ps %%tmm6, %%tmm4, %%tmm1" ::"r"(p), "r"(stride) : "memory"); \
    if constexpr (J == 2) asm volatile(LOAD " (%0,%1,1), %%tmm7\n\ttdpbf16ps %%tmm7, %%tmm4, %%tmm2" ::"r"(p), "r"(stride) : "memory"); \
    if constexpr (J == 3) asm volatile(LOAD " (%0,%1,1), %%tmm5\n\ttdpbf16ps %%tmm5, %%tmm4, %%tmm3" ::"r"(p), "r"(stride) : "memory");
    if constexpr (kStream) {
        FLOWEDGE_AMX_DOT("tileloaddt1")
    } else {
        FLOWEDGE_AMX_DOT("tileloadd")
    }
#undef FLOWEDGE_AMX_DOT
}
/// Stores C[j] (rows x 16 floats) to p, rows 64 bytes apart.
template <int J>
inline void store_c(float* p) {
    constexpr std::size_t stride = 64;
    if constexpr (J == 0) asm volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
    if constexpr (J == 1) asm volatile("tilestored %%tmm1, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
    if constexpr (J == 2) asm volatile("tilestored %%tmm2, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
    if constexpr (J == 3) asm volatile("tilestored %%tmm3, (%0,%1,1)" ::"r"(p), "r"(stride) : "memory");
}
}  // namespace amx
