// The portable kernel set's vocabulary: a one-lane 'vector', so the kernels written against the vocabulary also
// run where no SIMD set is compiled (non-x86 machines, or a CPU without AVX2). Included once, inside the scalar
// region of cpu/kernels.hpp.
#pragma once

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


/// Applies `act` in place to n contiguous values.
inline void activate_inplace(Activation act, float* v, long long n) {
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
