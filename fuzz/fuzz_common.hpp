// Helpers shared by the libFuzzer targets: splitting one input into parts, and the tiny-model size caps.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "flowedge/models/diffusion/config.hpp"

namespace flowedge::fuzz {

/// Separator between the parts of a multi-part input (a line no JSON or safetensors header needs).
inline constexpr std::string_view kPartSeparator = "\n--flowedge-part--\n";

/// Splits data at kPartSeparator into at most `max_parts` parts (the last part keeps any further separators).
inline std::vector<std::string_view> split_parts(const std::uint8_t* data, std::size_t size, std::size_t max_parts) {
    std::vector<std::string_view> parts;
    std::string_view rest(reinterpret_cast<const char*>(data), size);
    while (parts.size() + 1 < max_parts) {
        const std::size_t at = rest.find(kPartSeparator);
        if (at == std::string_view::npos) break;
        parts.push_back(rest.substr(0, at));
        rest.remove_prefix(at + kPartSeparator.size());
    }
    parts.push_back(rest);
    return parts;
}

inline std::vector<std::byte> to_bytes(std::string_view s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    return std::vector<std::byte>(p, p + s.size());
}

/// True when a validated Diffusion Policy config is small enough to build and run within a fuzz execution
/// (keeps each exec in the millisecond range and memory bounded).
inline bool small_diffusion_config(const DiffusionConfig& c) {
    if (c.action_dim > 8 || c.horizon > 32 || c.global_cond_dim > 64 || c.kernel_size > 9 || c.step_embed_dim > 64 ||
        c.stages() > 4 || c.num_train_timesteps > 1000)
        return false;
    for (int d : c.down_dims)
        if (d > 64) return false;
    return true;
}

}  // namespace flowedge::fuzz
