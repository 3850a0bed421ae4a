// Which whole-policy class runs a LeRobot pretrained_model folder, chosen by config.json's "type", so that one entry
// point (fe_policy_load, flowedge.load_policy, flowedge-policy) serves DiffusionPolicy and ActPolicy alike.
#pragma once
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

namespace flowedge {

/// The policy classes a pretrained_model folder can hold.
enum class PolicyType { Diffusion, Act };

inline const char* policy_type_name(PolicyType t) { return t == PolicyType::Act ? "act" : "diffusion"; }

/// Act when `path` (a folder, or a file inside it) has a config.json whose "type" is "act"; Diffusion otherwise,
/// including compact *.flowedge.safetensors files and unreadable or other configs, so that the Diffusion Policy
/// loader reports what is wrong with them.
inline PolicyType lerobot_policy_type(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::is_directory(path, ec) ? path : path.parent_path();
    std::ifstream in(dir / "config.json", std::ios::binary);
    if (!in) return PolicyType::Diffusion;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return PolicyType::Diffusion;
    const auto it = j.find("type");
    return it != j.end() && it->is_string() && it->get<std::string>() == "act" ? PolicyType::Act : PolicyType::Diffusion;
}

}  // namespace flowedge
