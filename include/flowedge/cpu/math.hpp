// Activation functions for the CPU ops, written once with PyTorch's float32 semantics (scalar, and AVX-512 vector
// forms used by activate_inplace).
#pragma once
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
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.f)), _mm512_set1_ps(88.7f));
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
#endif

/// Applies `act` in place to n contiguous values (the switch hoisted out of the loop; vectorised with AVX-512,
/// masked tail).
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
