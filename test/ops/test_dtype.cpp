// Weight storage conversions (dtype.hpp) and the in-register widening of the CPU kernels: exact round trips,
// round-to-nearest-even including ties, subnormals, infinities and NaN, checked against independent references.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "flowedge/cpu/kernels.hpp"
#include "flowedge/dtype.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

using namespace flowedge;

namespace {
// Independent value of an f16 bit pattern, in double.
double f16_value(std::uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0x1f) return m ? std::nan("") : s * INFINITY;
    return s * (e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25));
}
// Nearest f16 by brute force over the two candidates around |f|, ties to even (finite f only).
std::uint16_t f16_nearest(float f) {
    const double a = std::fabs(double(f));
    const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    if (a >= 65520.0) return sign | 0x7c00;
    // largest pattern with value <= a
    std::uint16_t lo = 0;
    for (int step = 1 << 14; step; step >>= 1)
        if (lo + step <= 0x7bff && f16_value(std::uint16_t(lo + step)) <= a) lo = std::uint16_t(lo + step);
    const std::uint16_t hi = std::uint16_t(lo + 1);
    const double dlo = a - f16_value(lo), dhi = (hi == 0x7c00 ? 65536.0 : f16_value(hi)) - a;
    const std::uint16_t pick = dlo < dhi ? lo : (dhi < dlo ? hi : ((lo & 1) ? hi : lo));
    return sign | pick;
}
// Nearest bf16: candidates are the truncated pattern and the next one, ties to even (finite f only).
std::uint16_t bf16_nearest(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    const std::uint16_t t = std::uint16_t(u >> 16);
    const double a = std::fabs(double(f));
    const double vlo = std::fabs(double(std::bit_cast<float>(std::uint32_t(t) << 16)));
    const std::uint16_t up = std::uint16_t(t + 1);
    const double vhi = (up & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128) : std::fabs(double(std::bit_cast<float>(std::uint32_t(up) << 16)));
    const double dlo = a - vlo, dhi = vhi - a;
    return dlo < dhi ? t : (dhi < dlo ? up : ((t & 1) ? up : t));
}
}  // namespace

TEST_CASE("every f16 bit pattern widens exactly and round-trips") {
    for (std::uint32_t b = 0; b < 65536; ++b) {
        const f16 h{std::uint16_t(b)};
        const float f = to_float(h);
        const double v = f16_value(std::uint16_t(b));
        if (std::isnan(v)) {
            REQUIRE(std::isnan(f));
            REQUIRE(std::isnan(to_float(to_f16(f))));
        } else {
            REQUIRE(double(f) == v);
            REQUIRE(std::signbit(f) == bool(b & 0x8000));
            REQUIRE(to_f16(f).bits == b);
        }
    }
}

TEST_CASE("every bf16 bit pattern round-trips") {
    for (std::uint32_t b = 0; b < 65536; ++b) {
        const float f = to_float(bf16{std::uint16_t(b)});
        REQUIRE(std::bit_cast<std::uint32_t>(f) == b << 16);
        if (std::isnan(f)) REQUIRE(std::isnan(to_float(to_bf16(f))));
        else REQUIRE(to_bf16(f).bits == b);
    }
}

TEST_CASE("float -> f16 / bf16 round to nearest, ties to even, saturate to inf, underflow gradually") {
    // Exact ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 (f16); 1 + 2^-8 between 1 and 1 + 2^-7 (bf16).
    CHECK(to_f16(1.f + std::ldexp(1.f, -11)).bits == 0x3c00);                            // tie -> even (1.0)
    CHECK(to_f16(1.f + 3 * std::ldexp(1.f, -11)).bits == 0x3c02);                        // tie -> even (up)
    CHECK(to_bf16(1.f + std::ldexp(1.f, -8)).bits == 0x3f80);
    CHECK(to_bf16(1.f + 3 * std::ldexp(1.f, -8)).bits == 0x3f82);
    CHECK(to_f16(65504.f).bits == 0x7bff);
    CHECK(to_f16(65519.f).bits == 0x7bff);
    CHECK(to_f16(65520.f).bits == 0x7c00);  // halfway to 2^16 rounds to infinity
    CHECK(to_f16(-INFINITY).bits == 0xfc00);
    CHECK(to_f16(std::ldexp(1.f, -24)).bits == 0x0001);   // smallest subnormal
    CHECK(to_f16(std::ldexp(1.f, -25)).bits == 0x0000);   // tie between 0 and 2^-24 -> even (0)
    CHECK(to_f16(std::ldexp(3.f, -25)).bits == 0x0002);   // tie between 1 and 2 ulps -> even (2)
    CHECK(to_f16(-std::ldexp(1.f, -26)).bits == 0x8000);  // signed zero
    CHECK(to_bf16(INFINITY).bits == 0x7f80);
    CHECK(to_bf16(3.4e38f).bits == 0x7f80);                   // above the largest bf16 + half ulp
    CHECK(to_bf16(std::ldexp(1.f, -130)).bits == 0x0001 << 3);  // float subnormal: exact in bf16
    CHECK(std::isnan(to_float(to_bf16(NAN))));
    CHECK(std::isnan(to_float(to_f16(NAN))));

    std::mt19937 rng(42);
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int i = 0; i < 200000; ++i) {
        // Random bit patterns cover every exponent; restrict f16 checks to its range plus margins.
        const float f = std::bit_cast<float>(bits(rng));
        if (!std::isfinite(f)) continue;
        REQUIRE(to_bf16(f).bits == bf16_nearest(f));
        const float g = std::ldexp(std::fabs(f) / std::ldexp(1.f, std::ilogb(f)), int(bits(rng) % 50) - 30) *
                        (std::signbit(f) ? -1.f : 1.f);
        REQUIRE(to_f16(g).bits == f16_nearest(g));
#if defined(__F16C__)
        REQUIRE(to_f16(g).bits == std::uint16_t(_cvtss_sh(g, _MM_FROUND_TO_NEAREST_INT)));  // hardware reference
#endif
    }
}

TEST_CASE("SIMD loads widen bf16/f16 exactly like the scalar conversions (every kernel set this CPU runs)") {
    bf16 b[64];
    f16 h[64];
    std::mt19937 rng(3);
    for (int i = 0; i < 64; ++i) {
        b[i] = bf16{std::uint16_t(rng())};
        h[i] = f16{std::uint16_t(rng() & 0x7bff)};  // finite
        if (std::isnan(to_float(b[i]))) b[i].bits = 0x3f80;
    }
    const cpu::CpuFeatures f = cpu::detect_cpu_features();
    for (cpu::Isa set : {cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::Avx512}) {
        if (!cpu::isa_supported(set, f)) continue;
        CAPTURE(cpu::isa_name(set));
        const int n = set == cpu::Isa::Avx512 ? 16 : 8;  // kLanes of the set (the portable set has 8 plain lanes)
        for (int off = 0; off + n <= 64; off += n) {
            float wb[64], wh[64];
            switch (set) {
#if defined(FLOWEDGE_CPU_X86)
                case cpu::Isa::Avx512: cpu::avx512::widen_lanes(b + off, wb); cpu::avx512::widen_lanes(h + off, wh); break;
                case cpu::Isa::Avx2: cpu::avx2::widen_lanes(b + off, wb); cpu::avx2::widen_lanes(h + off, wh); break;
#endif
                default: cpu::scalar::widen_lanes(b + off, wb); cpu::scalar::widen_lanes(h + off, wh); break;
            }
            for (int i = 0; i < n; ++i) {
                CHECK(std::bit_cast<std::uint32_t>(wb[i]) == std::bit_cast<std::uint32_t>(to_float(b[off + i])));
                CHECK(std::bit_cast<std::uint32_t>(wh[i]) == std::bit_cast<std::uint32_t>(to_float(h[off + i])));
            }
        }
    }
}
