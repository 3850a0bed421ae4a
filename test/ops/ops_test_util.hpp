// Shared helpers for the op tests: the backends a test body runs on, seeded data, weights in every storage dtype
// with their exact widened values, backend upload/download, and tolerance checks. References never call Ops.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <limits>
#include <vector>

#include "flowedge/cpu/memory.hpp"
#include "flowedge/ops.hpp"
#include "../support/compare.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/device.hpp"
#endif

/// Backends every TEST_CASE_TEMPLATE in test/ops runs on: Cpu always, Cuda in builds that link flowedge::cuda
/// (test/ops/CMakeLists.txt links it where the target exists). Each body starts with `if (!ready<B>()) return;`.
#ifdef FLOWEDGE_WITH_CUDA
#define FLOWEDGE_OPS_TEST_BACKENDS flowedge::Cpu, flowedge::Cuda
#else
#define FLOWEDGE_OPS_TEST_BACKENDS flowedge::Cpu
#endif

namespace optest {

using namespace flowedge;

template <class B>
inline constexpr bool kIsCpu = std::is_same_v<B, Cpu>;

/// Whether backend B can run here. Cpu always; Cuda when a device is usable, else the test logs why (a doctest
/// MESSAGE, so the run shows what was skipped) and returns without failing.
template <class B>
bool ready() {
    if constexpr (kIsCpu<B>) {
        return true;
    } else {
#ifdef FLOWEDGE_WITH_CUDA
        static const bool available = cuda::device_available();
        // std::string: doctest prints a bare char pointer as an address.
        if (!available) MESSAGE("skipped on " << std::string(backend_name<B>()) << ": " << std::string(cuda::device_description()));
        return available;
#else
        return false;
#endif
    }
}

inline std::vector<float> random_vec(std::size_t n, std::uint32_t seed, float lo = -1.f, float hi = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

/// A weight tensor in one storage dtype plus the exact float value of every stored element.
struct HostWeights {
    DType dtype = DType::F32;
    std::vector<std::uint8_t> bytes;
    std::vector<double> value;  // what the stored element means, widened independently
    WeightRef ref() const { return {bytes.data(), dtype}; }  // the host copy, for Ops<Cpu>
};

/// Random weights in [-scale, scale] stored as dt; step > 0 rounds them to multiples of step first (values every
/// dtype holds exactly when the step and range allow, e.g. multiples of 1/64 in [-1, 1]).
inline HostWeights make_weights(std::size_t n, DType dt, std::uint32_t seed, float scale = 1.f, float step = 0.f) {
    HostWeights w;
    w.dtype = dt;
    auto v = random_vec(n, seed, -scale, scale);
    if (step > 0.f)
        for (float& e : v) e = std::round(e / step) * step;
    w.bytes.resize(n * dtype_size(dt));
    w.value.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        if (dt == DType::F32) {
            std::memcpy(w.bytes.data() + 4 * i, &v[i], 4);
            w.value[i] = v[i];
        } else if (dt == DType::BF16) {
            const std::uint16_t b = to_bf16(v[i]).bits;
            std::memcpy(w.bytes.data() + 2 * i, &b, 2);
            std::uint32_t u = std::uint32_t(b) << 16;  // independent widening: bits into the high half
            float f;
            std::memcpy(&f, &u, 4);
            w.value[i] = f;
        } else {
            const std::uint16_t h = to_f16(v[i]).bits;
            std::memcpy(w.bytes.data() + 2 * i, &h, 2);
            // independent widening: sign * mantissa * 2^exp in double (inputs here are finite)
            const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
            const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25);
            w.value[i] = (h & 0x8000) ? -mag : mag;
        }
    }
    return w;
}

/// A device copy of host data on backend B.
template <class T, class B>
struct Dev {
    Buffer<T, B> buf;
    explicit Dev(const std::vector<T>& host) : buf(host.size() ? host.size() : 1) {
        if (!host.empty()) Memory<B>::copy_from_host(buf.data(), host.data(), host.size() * sizeof(T));
    }
    explicit Dev(std::size_t n) : buf(n ? n : 1) { Memory<B>::fill_zero(buf.data(), buf.bytes()); }
    T* ptr() { return buf.data(); }
    std::vector<T> host(std::size_t n) {
        std::vector<T> h(n);
        Memory<B>::synchronize();
        Memory<B>::copy_to_host(h.data(), buf.data(), n * sizeof(T));
        return h;
    }
};

template <class B>
struct DevWeights {
    Dev<std::uint8_t, B> d;
    DType dtype;
    explicit DevWeights(const HostWeights& w) : d(w.bytes), dtype(w.dtype) {}
    WeightRef ref() { return {d.ptr(), dtype}; }
};

/// |got - ref| <= tol * scale, scale the magnitude that makes the error relative (e.g. sum |terms|).
inline bool close(double got, double ref, double scale, double tol) {
    return std::fabs(got - ref) <= tol * std::max(scale, 1e-30);
}

/// Checks every element; reports the first failure with its index.
inline void check_all(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& scale,
                      double tol, const char* what) {
    REQUIRE(got.size() == ref.size());
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (!close(got[i], ref[i], scale[i], tol) || std::isnan(got[i]) != std::isnan(ref[i])) {
            if (!bad) first = i;
            ++bad;
        }
    }
    INFO(what << ": " << bad << " of " << got.size() << " elements out of tolerance; first at " << first
              << " got " << (got.empty() ? 0.f : got[first]) << " want " << (ref.empty() ? 0. : ref[first])
              << " scale " << (scale.empty() ? 0. : scale[first]));
    CHECK(bad == 0);
}

/// Row-strided operands of a linear call for the packed-weight tests: x [rows, ldx] with NaN in the columns past `in`
/// (a kernel reading them poisons its output), bias [out], y0 [rows, ldy] with `sentinel` past `out` (a kernel
/// writing there shows).
struct StridedLinearOperands {
    std::vector<float> x, b, y0;
};
inline StridedLinearOperands strided_linear_operands(int rows, int in, int out, int ldx, int ldy, std::uint32_t seed,
                                                     float sentinel) {
    StridedLinearOperands o;
    o.x = random_vec(std::size_t(rows) * ldx, seed + 1);
    for (int r = 0; r < rows; ++r)
        for (int i = in; i < ldx; ++i) o.x[std::size_t(r) * ldx + i] = std::numeric_limits<float>::quiet_NaN();
    o.b = random_vec(std::size_t(out), seed + 2);
    o.y0 = random_vec(std::size_t(rows) * ldy, seed + 3);
    for (int r = 0; r < rows; ++r)
        for (int c = out; c < ldy; ++c) o.y0[std::size_t(r) * ldy + c] = sentinel;
    return o;
}

inline const DType kAllDtypes[] = {DType::F32, DType::BF16, DType::F16};

/// Max-norm tolerances: every backend vs a double-accumulating loop (docs/numerics.md#parity-tolerances), and a non-CPU backend vs Ops<Cpu> on
/// the same inputs (both within kTolRef of the reference).
inline constexpr double kTolRef = 2e-6;
inline constexpr double kTolCpu = 4e-6;

using fe_test::check_elementwise;
using fe_test::max_norm_rel;

/// Elements whose bits differ between a and b (same size).
inline int bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    int n = 0;
    for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
    return n;
}

// Independent double-precision activations (PyTorch definitions).
inline double ref_softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
inline double ref_act(Activation a, double x) {
    switch (a) {
        case Activation::None: return x;
        case Activation::Silu: return x / (1 + std::exp(-x));
        case Activation::Mish: return x * std::tanh(ref_softplus(x));
        case Activation::Softplus: return ref_softplus(x);
        case Activation::Relu: return std::isnan(x) ? x : (x > 0 ? x : 0.0);
    }
    return x;
}
/// Bound on |d act/dx| near x, used to carry a pre-activation error bound through the activation.
inline double act_slope(Activation a) { return a == Activation::None ? 1.0 : 1.2; }

/// Independent round-to-nearest-even of a finite float to BF16, zero and denormals read as zero (DAZ, as
/// vcvtne2ps2bf16), as a double: the operand rounding the MathMode::BF16 kernels apply.
inline double rne_bf16(double v) {
    const float f = float(v);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return 0.0;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
}

/// Whether this process runs MathMode::BF16 on vdpbf16ps kernels (else BF16 requests compute exactly).
inline const bool kBf16Kernels = cpu::bf16_math_available();

}  // namespace optest
