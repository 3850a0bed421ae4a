// A minimal SIMD vocabulary for the CPU kernels: one float vector type per instruction set, with loads that
// widen BF16/F16 weights in registers (AVX-512, AVX2+FMA+F16C, or a portable scalar fallback).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "flowedge/dtype.hpp"

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#endif

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
