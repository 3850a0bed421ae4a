// The AVX2 + FMA + F16C kernel set's vocabulary: 8-lane float vectors, loads that widen BF16/F16 weights in
// registers, the vector exp/log/activations. Included once, inside the AVX2 region of cpu/kernels.hpp.
#pragma once

inline constexpr int kLanes = 8;
inline constexpr int kRegisters = 16;
using VecF = __m256;
inline VecF vzero() { return _mm256_setzero_ps(); }
inline VecF vset1(float v) { return _mm256_set1_ps(v); }
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline VecF vload(const bf16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline VecF vload(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline void vstore(float* p, VecF v) { _mm256_storeu_ps(p, v); }
/// dst[0, n) = src[0, n) for a short run (an im2col row segment): whole vectors and one masked tail, no library call
/// and no access past either end.
inline void copy_floats(float* dst, const float* src, int n) {
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) vstore(dst + i, vload(src + i));
    if (i < n) {
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(dst + i, m, _mm256_maskload_ps(src + i, m));
    }
}
/// dst[s] = src[2 s] for s < n (a stride-2 im2col row segment): even lanes of two vectors per 8 outputs, the tail
/// element by element; reads nothing past src[2 n - 2].
inline void copy_floats_even(float* dst, const float* src, int n) {
    int i = 0;
    for (; i + kLanes < n; i += kLanes) {  // reads src[2i .. 2i + 15]: inside while i + 8 < n
        const __m256 lo = _mm256_loadu_ps(src + 2 * i), hi = _mm256_loadu_ps(src + 2 * i + kLanes);
        // per 128-bit half: lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6, then the 64-bit pairs reordered
        const __m256 e = _mm256_shuffle_ps(lo, hi, 0x88);
        _mm256_storeu_ps(dst + i, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8)));
    }
    for (; i < n; ++i) dst[i] = src[2 * i];
}
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline float vsum(VecF v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}


// AVX2 + FMA twins of the AVX-512 forms above, 8 floats per vector: the same clamp, reduction, polynomials and
// operation order, so each lane gives the bits the AVX-512 code gives (the differences are only the instructions
// that AVX2 lacks: vscalefps, vgetmant/vgetexp and mask registers). NaN/inf behave as in the AVX-512 code:
// vexp(NaN) = NaN (the clamp passes a NaN through), vexp(-inf) = 0, vexp(+inf) = exp(88.7) = 3.3e38;
// hence vsilu(NaN) = NaN, vsilu(+-inf) = +-inf, vsoftplus(NaN) = NaN (as the scalar form), vsoftplus(+inf) = inf,
// vsoftplus(-inf) = 0, vmish(NaN) = NaN, vmish(+inf) = inf, vmish(-inf) = NaN (as the scalar form).

/// exp(x) for 8 floats: as the AVX-512 vexp. vscalefps is replaced by an integer add of n into p's exponent field
/// where every lane's result is normal, else by two multiplies by 2^n1 and 2^n2 (n1 = n >> 1, n2 = n - n1), each
/// built by an integer add into the exponent field: n is in [-150, 128] after the clamp, so both halves lie in
/// [-75, 64] (normal floats), p 2^n1 is exact and the one rounding is at the second multiply, exactly where
/// vscalefps rounds (denormal results included). Same bits as the AVX-512 form either way.
// always_inline: GCC otherwise calls vexp out of line from the scan and the packed linear epilogues, and every ymm
// register is caller-saved, so live vectors spill around each call.
[[gnu::always_inline]] inline __m256 vexp(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.7f), _mm256_max_ps(_mm256_set1_ps(-104.f), x));  // NaN stays NaN (see AVX-512)
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 r2 = _mm256_mul_ps(r, r);
    p = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.f));  // one rounding at the final + 1
    const __m256i ni = _mm256_cvtps_epi32(n);  // exact: n is integral
    // Every lane with n in [-125, 127] (the usual case): p in [0.7, 1.42] times 2^n is a normal float, so the scaling
    // is exact and is p's bits + (n << 23): one data-dependent branch that spares the scan the two multiplies.
    const __m256i out = _mm256_cmpgt_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(125 + INT32_MIN)),
                                           _mm256_set1_epi32(252 + INT32_MIN));  // unsigned n + 125 > 252
    if (_mm256_testz_si256(out, out))
        return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(ni, 23)));
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/// log(x) for 8 positive finite normal floats (softplus calls it on 1 + e in [1, 3.4e38]): as the AVX-512 vlog,
/// with x = m 2^k split by bit manipulation (m from the mantissa bits with the exponent field of 1.0, k from the
/// exponent field) instead of vgetmant/vgetexp; same m and k for these inputs, so the same bits.
[[gnu::always_inline]] inline __m256 vlog(__m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)),
                                                   _mm256_set1_epi32(0x3f800000)));  // [1, 2)
    __m256 k = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127)));
    const __m256 big = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356237f), _CMP_GT_OQ);
    m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), big);
    k = _mm256_add_ps(k, _mm256_and_ps(big, _mm256_set1_ps(1.f)));  // k + 1 where big (exact either way)
    const __m256 f = _mm256_sub_ps(m, _mm256_set1_ps(1.f));
    const __m256 z = _mm256_mul_ps(f, f);
    __m256 y = _mm256_set1_ps(7.0376836292e-2f);
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.1514610310e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.1676998740e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.2420140846e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.4249322787e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.6668057665e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.0000714765e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-2.4999993993e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(3.3333331174e-1f));
    y = _mm256_mul_ps(_mm256_mul_ps(y, f), z);
    y = _mm256_fmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), y);
    y = _mm256_fnmadd_ps(z, _mm256_set1_ps(0.5f), y);
    return _mm256_fmadd_ps(k, _mm256_set1_ps(0.693359375f), _mm256_add_ps(f, y));
}

/// SiLU of 8 floats: x / (1 + exp(-x)).
inline __m256 vsilu(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.f), vexp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

/// Softplus (beta 1, threshold 20) of 8 floats, as the AVX-512 vsoftplus (blends for the masked divide and move;
/// the divide's result in lanes where u rounds to 1 is discarded).
inline __m256 vsoftplus(__m256 x) {
    const __m256 e = vexp(x);
    const __m256 u = _mm256_add_ps(_mm256_set1_ps(1.f), e);
    const __m256 d = _mm256_sub_ps(u, _mm256_set1_ps(1.f));
    const __m256 exact = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    const __m256 l = _mm256_blendv_ps(e, _mm256_div_ps(_mm256_mul_ps(vlog(u), e), d), exact);
    return _mm256_blendv_ps(l, x, _mm256_cmp_ps(x, _mm256_set1_ps(20.f), _CMP_GT_OQ));
}

/// Mish of 8 floats, as the AVX-512 vmish: x * m / (m + 2), m = e (e + 2), e = exp(min(x, 20)); x above 20.
inline __m256 vmish(__m256 x) {
    const __m256 e = vexp(_mm256_min_ps(x, _mm256_set1_ps(20.f)));
    const __m256 m = _mm256_mul_ps(e, _mm256_add_ps(e, _mm256_set1_ps(2.f)));
    const __m256 y = _mm256_mul_ps(x, _mm256_div_ps(m, _mm256_add_ps(m, _mm256_set1_ps(2.f))));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, _mm256_set1_ps(20.f), _CMP_GT_OQ));
}

/// ReLU of 8 floats: vmaxps returns its second operand when either is NaN, so max(0, x) keeps a NaN x (torch.relu).
inline __m256 vrelu(__m256 x) { return _mm256_max_ps(_mm256_setzero_ps(), x); }

/// Applies `act` in place to n contiguous values (the switch hoisted out of the loop; vectorised, masked tail).
inline void activate_inplace(Activation act, float* v, long long n) {
    if (act != Activation::None) {
        // 8 at a time; the tail (1..7) masked (vmaskmovps: masked-off lanes read as 0, never touch memory).
        auto run = [&](auto f) {
            long long i = 0;
            for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, f(_mm256_loadu_ps(v + i)));
            if (i < n) {
                static constexpr int kOnes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
                const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kOnes + 8 - (n - i)));
                _mm256_maskstore_ps(v + i, m, f(_mm256_maskload_ps(v + i, m)));
            }
        };
        if (act == Activation::Silu) run([](__m256 x) { return vsilu(x); });
        else if (act == Activation::Relu) run([](__m256 x) { return vrelu(x); });
        else if (act == Activation::Softplus) run([](__m256 x) { return vsoftplus(x); });
        else run([](__m256 x) { return vmish(x); });
        return;
    }
    activate_scalar(act, v, n);
}

/// Packed small-row linear vocabulary (kernels/packed_linear.hpp): 32-bit pair lanes and masked row tails.
namespace packed {
using VecU = __m256i;
inline VecU load_u(const std::uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline void store_u(std::uint32_t* p, VecU v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
inline VecF even_half(VecU v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
inline VecF odd_half(VecU v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xFFFF0000u)))); }
/// Lanes [0, n) set (AVX2 masked loads/stores never touch memory in the other lanes).
inline __m256i lanes_below(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
/// The first n (<= kLanes) floats at p. Stores never use vmaskmovps, which AMD Zen 2/3 run as slow microcode: a
/// short store is at most three plain ones (4, 2, 1 floats); docs/kernels/cpu.md has the measured cost.
inline VecF load_n(const float* p, int n) { return n >= kLanes ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(n)); }
inline void store_n(float* p, VecF v, int n) {
    if (n >= kLanes) {
        _mm256_storeu_ps(p, v);
        return;
    }
    if (n <= 0) return;
    __m128 h = _mm256_castps256_ps128(v);
    if (n & 4) {
        _mm_storeu_ps(p, h);
        p += 4;
        h = _mm256_extractf128_ps(v, 1);
    }
    if (n & 2) {
        _mm_storel_pi(reinterpret_cast<__m64*>(p), h);
        p += 2;
        h = _mm_movehl_ps(h, h);
    }
    if (n & 1) _mm_store_ss(p, h);
}
/// Lane by lane with the scalar forms (cpu/math.hpp). Only used when the activation must precede an accumulate;
/// otherwise the tile stores and activate_inplace runs over the stored row segment (as Ops<Cpu>::linear does), which
/// is faster than the scalar forms per vector (docs/performance/cpu.md).
inline VecF activate_vec(Activation act, VecF v) {
    if (act == Activation::None) return v;
    alignas(32) float t[kLanes];
    _mm256_store_ps(t, v);
    for (float& e : t) e = activate(act, e);
    return _mm256_load_ps(t);
}
/// Whether the tile epilogue applies the activation in registers (else activate_inplace over the stored segment).
inline bool act_in_registers(const LinearParams& p) { return p.act == Activation::None || p.accumulate; }
}  // namespace packed
