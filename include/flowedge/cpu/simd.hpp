// A minimal SIMD vocabulary for the CPU kernels: one float vector type per instruction set, with loads that
// widen BF16/F16 weights in registers (AVX-512, AVX2+FMA+F16C, or a portable scalar fallback), plus the BF16
// dot-product vocabulary (vdpbf16ps) of the opt-in MathMode::BF16 kernels where the build targets AVX512_BF16.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "flowedge/dtype.hpp"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#endif

// GCC 12's own AVX-512 headers trip -Wmaybe-uninitialized / -Wuninitialized (`__m512 __Y = __Y;` in
// _mm512_undefined_ps, GCC bug 105593, fixed in GCC 13) wherever their intrinsics are inlined into a kernel: ~800
// false warnings per build. The CPU kernel headers switch those two warnings off around their own code only.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#define FLOWEDGE_SIMD_WARNINGS_OFF                                     \
    _Pragma("GCC diagnostic push")                                     \
    _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")       \
    _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define FLOWEDGE_SIMD_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define FLOWEDGE_SIMD_WARNINGS_OFF
#define FLOWEDGE_SIMD_WARNINGS_ON
#endif

FLOWEDGE_SIMD_WARNINGS_OFF
namespace flowedge::cpu {

#if defined(__AVX512F__)
/// Float lanes per vector and vector registers available to a micro-kernel.
inline constexpr int kLanes = 16;
inline constexpr int kRegisters = 32;
inline constexpr const char* kSimdName = "avx512";
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

#if defined(__AVX512BF16__)
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
/// dst[0, round_up(n, 32)) = BF16(src[0, n)) followed by zeros up to the next multiple of 32.
inline void round_to_bh(const float* src, int n, bf16* dst) {
    int j = 0;
    for (; j + 32 <= n; j += 32) _mm512_storeu_si512(dst + j, __m512i(vload_bh(src + j)));
    if (j < n) _mm512_storeu_si512(dst + j, __m512i(vload_bh_n(src + j, n - j)));
}
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
inline constexpr int kLanes = 8;
inline constexpr int kRegisters = 16;
inline constexpr const char* kSimdName = "avx2";
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
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline float vsum(VecF v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else
inline constexpr int kLanes = 1;
inline constexpr int kRegisters = 16;
inline constexpr const char* kSimdName = "scalar";
struct VecF {
    float v;
};
inline VecF vzero() { return {0.f}; }
inline VecF vset1(float v) { return {v}; }
inline VecF vload(const float* p) { return {*p}; }
inline VecF vload(const bf16* p) { return {to_float(*p)}; }
inline VecF vload(const f16* p) { return {to_float(*p)}; }
inline void vstore(float* p, VecF v) { *p = v.v; }
inline VecF vfma(VecF a, VecF b, VecF c) { return {a.v * b.v + c.v}; }
inline VecF vadd(VecF a, VecF b) { return {a.v + b.v}; }
inline VecF vmul(VecF a, VecF b) { return {a.v * b.v}; }
inline float vsum(VecF v) { return v.v; }
#endif

/// Scalar widening of one stored element (tails and small ops).
inline float widen(float v) { return v; }
inline float widen(bf16 v) { return to_float(v); }
inline float widen(f16 v) { return to_float(v); }

}  // namespace flowedge::cpu
FLOWEDGE_SIMD_WARNINGS_ON
