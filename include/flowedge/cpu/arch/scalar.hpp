// The portable kernel sets' vocabulary: an 8-lane 'vector' in plain C++, so the kernels written against the
// vocabulary also run where no SIMD set is compiled (non-x86 machines, or a CPU without AVX2). Included once inside
// each portable region of cpu/kernels.hpp (the scalar and the Eigen sets), so no include guard.

/// Eight lanes in plain C++ (the compiler maps them to whatever vector unit the target has, e.g. NEON or SSE): sums
/// run in 8 interleaved chains as on AVX2, so long reductions keep the same accuracy as the SIMD sets.
inline constexpr int kLanes = 8;
inline constexpr int kRegisters = 16;
struct VecF {
    float v[kLanes];
};
inline VecF vzero() { return {}; }
inline VecF vset1(float x) {
    VecF r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = x;
    return r;
}
template <class T>
inline VecF vload(const T* p) {
    VecF r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = widen(p[i]);
    return r;
}
inline void vstore(float* p, VecF a) {
    for (int i = 0; i < kLanes; ++i) p[i] = a.v[i];
}
/// dst[0, n) = src[0, n) for a short run (an im2col row segment).
inline void copy_floats(float* dst, const float* src, int n) {
    for (int i = 0; i < n; ++i) dst[i] = src[i];
}
/// dst[s] = src[2 s] for s < n (a stride-2 im2col row segment).
inline void copy_floats_even(float* dst, const float* src, int n) {
    for (int i = 0; i < n; ++i) dst[i] = src[2 * i];
}
inline VecF vfma(VecF a, VecF b, VecF c) {
    for (int i = 0; i < kLanes; ++i) c.v[i] = a.v[i] * b.v[i] + c.v[i];
    return c;
}
inline VecF vadd(VecF a, VecF b) {
    for (int i = 0; i < kLanes; ++i) a.v[i] += b.v[i];
    return a;
}
inline VecF vmul(VecF a, VecF b) {
    for (int i = 0; i < kLanes; ++i) a.v[i] *= b.v[i];
    return a;
}
/// Lanes l + l+4, then pairs (the AVX2 reduction's order).
inline float vsum(VecF a) {
    const float s0 = a.v[0] + a.v[4], s1 = a.v[1] + a.v[5], s2 = a.v[2] + a.v[6], s3 = a.v[3] + a.v[7];
    return (s0 + s2) + (s1 + s3);
}


/// Applies `act` in place to n contiguous values.
inline void activate_inplace(Activation act, float* v, long long n) {
    activate_scalar(act, v, n);
}
