// Seeded Gaussian noise shared by every backend's DDPM step: SplitMix64 + Box-Muller, addressed by draw index.
//
// Host code only (no CUDA constructs): the CPU ops, the schedulers and the tests all call these, and the CUDA
// kernels re-implement the same integer/double arithmetic so that one seed gives the same actions everywhere.
#pragma once
#include <cmath>
#include <cstdint>

namespace flowedge {

/// SplitMix64 increment (the 64-bit golden ratio).
inline constexpr std::uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;

/// The SplitMix64 output finaliser applied to one state value.
constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/// Raw output number n (0-based) of the SplitMix64 stream seeded with `seed`:
/// the generator adds the gamma before each output, so output n mixes seed + (n + 1) * gamma.
constexpr std::uint64_t splitmix64_at(std::uint64_t seed, std::uint64_t n) {
    return splitmix64_mix(seed + (n + 1) * kSplitMixGamma);
}

/// Uniform in (0, 1] from a raw output: ((u >> 40) + 1) / 16777217, in double.
constexpr double splitmix64_uniform(std::uint64_t u) {
    return double((u >> 40) + 1) / 16777217.0;
}

/// Standard normal number j (0-based) of the stream seeded with `seed` (docs/models.md#box-muller).
/// Draws come in Box-Muller pairs: pair p = j / 2 uses raw outputs 2p (u1) and 2p + 1 (u2),
/// r = sqrt(-2 ln u1), theta = 2 pi u2; even j gives r cos(theta), odd j gives r sin(theta). Computed in
/// double, rounded to float once.
inline float normal_at(std::uint64_t seed, std::uint64_t j) {
    const std::uint64_t pair = j / 2;
    const double u1 = splitmix64_uniform(splitmix64_at(seed, 2 * pair));
    const double u2 = splitmix64_uniform(splitmix64_at(seed, 2 * pair + 1));
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * 3.14159265358979323846 * u2;
    return static_cast<float>((j & 1) ? r * std::sin(theta) : r * std::cos(theta));
}

/// Fills out[0, n) with normals draw_offset .. draw_offset + n - 1 of the stream seeded with `seed`,
/// computing each Box-Muller pair once.
inline void fill_normal(std::uint64_t seed, std::uint64_t draw_offset, float* out, std::uint64_t n) {
    std::uint64_t i = 0;
    while (i < n) {
        const std::uint64_t j = draw_offset + i;
        const std::uint64_t pair = j / 2;
        const double u1 = splitmix64_uniform(splitmix64_at(seed, 2 * pair));
        const double u2 = splitmix64_uniform(splitmix64_at(seed, 2 * pair + 1));
        const double r = std::sqrt(-2.0 * std::log(u1));
        const double theta = 2.0 * 3.14159265358979323846 * u2;
        if ((j & 1) == 0) {
            out[i++] = static_cast<float>(r * std::cos(theta));
            if (i < n) out[i++] = static_cast<float>(r * std::sin(theta));
        } else {
            out[i++] = static_cast<float>(r * std::sin(theta));
        }
    }
}

}  // namespace flowedge
