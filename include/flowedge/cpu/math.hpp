// Activation functions for the CPU ops, written once with PyTorch's float32 semantics (scalar, and AVX-512 or
// AVX2 + FMA vector forms used by activate_inplace).
#pragma once
#include <climits>
#include <cmath>

#include "flowedge/cpu/simd.hpp"
#include "flowedge/op_params.hpp"

FLOWEDGE_SIMD_WARNINGS_OFF
namespace flowedge::cpu {

/// torch.nn.SiLU: x * sigmoid(x), as x / (1 + exp(-x)) (exp overflow gives -0 for very negative x).
inline float silu(float x) { return x / (1.f + std::exp(-x)); }

/// torch.nn.functional.softplus with beta 1, threshold 20: x when x > 20, else log1p(exp(x)).
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

/// torch.nn.Mish: x * tanh(softplus(x)).
inline float mish(float x) { return x * std::tanh(softplus(x)); }

/// Applies `act` to one value.
inline float activate(Activation act, float x) {
    switch (act) {
        case Activation::None: return x;
        case Activation::Silu: return silu(x);
        case Activation::Mish: return mish(x);
        case Activation::Softplus: return softplus(x);
    }
    return x;
}

#if defined(__AVX512F__)
/// exp(x) for 16 floats: Cody-Waite reduction by ln 2 and a degree-6 polynomial on [-ln2/2, ln2/2]
/// (Cephes expf coefficients), scaled by 2^n with vscalefps. Under 1 ulp (r + r^2 P(r) first, then + 1); underflows to 0 below -104.
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
/// (The U-Net applies Mish to every GroupNorm output: scalar tanh/log1p/exp took ~10% of a PushT sample.)
inline __m512 vmish(__m512 x) {
    const __m512 e = vexp(_mm512_min_ps(x, _mm512_set1_ps(20.f)));
    const __m512 m = _mm512_mul_ps(e, _mm512_add_ps(e, _mm512_set1_ps(2.f)));
    const __m512 y = _mm512_mul_ps(x, _mm512_div_ps(m, _mm512_add_ps(m, _mm512_set1_ps(2.f))));
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(20.f), _CMP_GT_OQ), x);
}
#elif defined(__AVX2__) && defined(__FMA__)
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
// register is caller-saved, so live vectors spill around each call (decode step 20.4 -> 19.7 us min, 3 runs).
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
    // is exact and is p's bits + (n << 23). (One data-dependent branch; measured 8-10% off selective_scan.)
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
#endif

/// Applies `act` in place to n contiguous values (the switch hoisted out of the loop; vectorised with AVX-512,
/// masked tail, or AVX2 + FMA, masked tail).
inline void activate_inplace(Activation act, float* v, long long n) {
#if defined(__AVX512F__)
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
        else if (act == Activation::Softplus) run([](__m512 x) { return vsoftplus(x); });
        else run([](__m512 x) { return vmish(x); });
        return;
    }
#elif defined(__AVX2__) && defined(__FMA__)
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
        else if (act == Activation::Softplus) run([](__m256 x) { return vsoftplus(x); });
        else run([](__m256 x) { return vmish(x); });
        return;
    }
#endif
    switch (act) {
        case Activation::None: return;
        case Activation::Silu:
            for (long long i = 0; i < n; ++i) v[i] = silu(v[i]);
            return;
        case Activation::Mish:
            for (long long i = 0; i < n; ++i) v[i] = mish(v[i]);
            return;
        case Activation::Softplus:
            for (long long i = 0; i < n; ++i) v[i] = softplus(v[i]);
            return;
    }
}

}  // namespace flowedge::cpu
FLOWEDGE_SIMD_WARNINGS_ON
