// Weight storage types (F32, BF16, F16) and their exact round-to-nearest-even conversions.
#pragma once
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace flowedge {

/// Storage type of a weight tensor. Activations are always float32.
enum class DType : std::uint8_t { F32 = 0, BF16 = 1, F16 = 2 };

/// Bytes per element of a stored weight.
constexpr std::size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

/// Name as written in safetensors headers ("F32", "BF16", "F16").
constexpr std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "F32";
        case DType::BF16: return "BF16";
        case DType::F16: return "F16";
    }
    return "?";
}

/// A weight dtype as users name it in options and flags: "f32"/"float32", "bf16"/"bfloat16", "f16"/"float16";
/// nullopt for anything else (the caller's error then lists kWeightDTypeNames).
constexpr std::optional<DType> weight_dtype_from_name(std::string_view s) {
    if (s == "f32" || s == "float32") return DType::F32;
    if (s == "bf16" || s == "bfloat16") return DType::BF16;
    if (s == "f16" || s == "float16") return DType::F16;
    return std::nullopt;
}
inline constexpr const char* kWeightDTypeNames = "f32, bf16 or f16";

/// bfloat16 bit pattern (upper half of an IEEE float32).
struct bf16 { std::uint16_t bits; };
/// IEEE 754 binary16 bit pattern.
struct f16 { std::uint16_t bits; };

/// bf16 -> float: exact (zero-extend the mantissa).
constexpr float to_float(bf16 v) { return std::bit_cast<float>(std::uint32_t(v.bits) << 16); }

/// float -> bf16 with round-to-nearest-even; NaN stays a quiet NaN.
constexpr bf16 to_bf16(float f) {
    std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{std::uint16_t((u >> 16) | 0x40u)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{std::uint16_t(u >> 16)};
}

/// f16 -> float: exact, including subnormals, infinities and NaN.
constexpr float to_float(f16 v) {
    const std::uint32_t sign = std::uint32_t(v.bits & 0x8000u) << 16;
    std::uint32_t exp = (v.bits >> 10) & 0x1fu;
    std::uint32_t man = v.bits & 0x3ffu;
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return std::bit_cast<float>(sign);
        // Subnormal: normalise the mantissa.
        int e = -1;
        do { man <<= 1; ++e; } while ((man & 0x400u) == 0);
        man &= 0x3ffu;
        return std::bit_cast<float>(sign | (std::uint32_t(127 - 15 - e) << 23) | (man << 13));
    }
    return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/// float -> f16 with round-to-nearest-even, overflow to infinity, gradual underflow.
constexpr f16 to_f16(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
    const std::uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return f16{std::uint16_t(sign | 0x7e00u)};  // NaN
    if (abs >= 0x477ff000u) return f16{std::uint16_t(sign | 0x7c00u)}; // rounds to >= 65520: inf
    if (abs < 0x38800000u) {                                           // below 2^-14: subnormal or zero
        if (abs < 0x33000000u) return f16{sign};                       // < 2^-25 rounds to zero
        const std::uint32_t e = abs >> 23;
        const std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
        const std::uint32_t shift = 126 - e;  // 14 - (e - 127) + 13 - 1 ... maps to subnormal
        const std::uint32_t halfway = 1u << (shift - 1);
        std::uint32_t r = m >> shift;
        const std::uint32_t rem = m & ((1u << shift) - 1);
        if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
        return f16{std::uint16_t(sign | r)};
    }
    std::uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return f16{std::uint16_t(sign | (r >> 13))};
}

/// Storage traits: maps a storage type to its DType tag.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::F16; };

/// Widen one stored weight element to float.
inline float load_as_float(const void* base, DType t, std::size_t i) {
    switch (t) {
        case DType::F32: return static_cast<const float*>(base)[i];
        case DType::BF16: return to_float(static_cast<const bf16*>(base)[i]);
        case DType::F16: return to_float(static_cast<const f16*>(base)[i]);
    }
    return NAN;
}

}  // namespace flowedge
