// Reads a LeRobot ACT pretrained_model folder: config.json (ActConfig and the input features in file order),
// model.safetensors, and the normalisation statistics of the 0.4+ processor files (policy_preprocessor*.json's
// normalizer step for the inputs, policy_postprocessor*.json's unnormalizer step for the action) or, for older
// folders, the legacy normalize_inputs.* / unnormalize_outputs.* buffers of model.safetensors.
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flowedge/error.hpp"
#include "flowedge/io/safetensors.hpp"
#include "flowedge/models/act/config.hpp"
#include "flowedge/models/diffusion/lerobot_policy_folder.hpp"

namespace flowedge::io {

/// The action's un-normalisation (LeRobot's UnnormalizerProcessorStep), applied per element in float32:
/// MeanStd: x * hi + lo (hi = std, lo = mean); MinMax: (x + 1) / 2 * hi + lo (hi = max - min, or eps where that is
/// zero; lo = min); Identity: x.
struct ActionUnnorm {
    NormKind kind = NormKind::Identity;
    std::vector<float> lo, hi;
    float apply(float x, std::size_t d) const {
        if (kind == NormKind::MeanStd) return x * hi[d] + lo[d];
        if (kind == NormKind::MinMax) return (x + 1.f) / 2.f * hi[d] + lo[d];
        return x;
    }
};

/// A LeRobot ACT folder, opened and validated.
struct LeRobotActFolder {
    ActConfig config;
    std::shared_ptr<const SafeTensors> weights;  ///< model.safetensors
    std::string state_key;                       ///< empty when the policy has no robot state
    int state_dim = 0;
    FeatureNorm state_norm;
    std::string env_key;                         ///< empty when the policy has no environment state
    int env_dim = 0;
    FeatureNorm env_norm;
    std::vector<PolicyCamera> cameras;           ///< config.json input_features order (LeRobot's image_features order)
    int action_dim = 0;
    ActionUnnorm action;
};

namespace detail {

/// A (un)normalizer processor step: its opened state file (null when the folder has no such step), norm_map and eps.
struct ProcessorStep {
    std::shared_ptr<const SafeTensors> state;
    nlohmann::json norm_map;
    float eps = 1e-8f;
};
/// The first step named `registry` in the folder's `<prefix>*.json` files (in name order).
inline ProcessorStep find_processor_step(const std::filesystem::path& dir, const std::string& prefix, const std::string& registry) {
    namespace fs = std::filesystem;
    std::vector<fs::path> jsons;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (starts_with(n, prefix) && e.path().extension() == ".json") jsons.push_back(e.path());
    }
    std::sort(jsons.begin(), jsons.end());
    ProcessorStep out;
    for (const fs::path& jp : jsons) {
        const std::string text = read_text(jp);
        check_json_depth(text, jp.string());
        const nlohmann::json proc = parse_lerobot_json(text, jp.string());
        auto steps = proc.find("steps");
        if (steps == proc.end() || !steps->is_array()) continue;
        for (const auto& s : *steps) {
            if (!s.is_object() || s.value("registry_name", "") != registry) continue;
            const std::string where = jp.string() + ": " + registry;
            const auto& cfg = field(s, "config", where);
            out.norm_map = field(cfg, "norm_map", where + ".config");
            if (auto it = cfg.find("eps"); it != cfg.end() && it->is_number()) {
                const double e = it->get<double>();
                if (!(e >= 0.0 && e <= 1.0)) lerobot_fail(where + ".config: 'eps' out of range" + expected_got("0..1", it->dump()));
                out.eps = float(e);
            }
            const std::string sf = string_field(s, "state_file", where);
            if (!fs::exists(dir / sf)) lerobot_fail(where + ": state file '" + sf + "' is missing", ErrorKind::Io);
            out.state = SafeTensors::open(dir / sf);
            return out;
        }
    }
    return out;
}

/// The mode `norm_map` gives feature type `type` ("STATE", "VISUAL", ...); IDENTITY when it names none, as LeRobot.
inline ModeStats mode_in(const nlohmann::json& norm_map, const std::string& type, const std::string& where) {
    auto it = norm_map.find(type);
    return parse_norm_mode(it == norm_map.end() || !it->is_string() ? std::string("IDENTITY") : it->get<std::string>(),
                           where + ": normalization mode of " + type);
}

}  // namespace detail

/// Opens a LeRobot ACTPolicy pretrained_model folder (config.json, model.safetensors, processors). Unsupported or
/// inconsistent settings are errors naming the field or key and the expected value.
inline LeRobotActFolder open_lerobot_act_folder(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    using namespace detail;
    if (!fs::exists(path)) lerobot_fail(path.string() + ": no such folder (expected a LeRobot pretrained_model folder)", ErrorKind::Io);
    const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
    const std::string cfg_where = (dir / "config.json").string();
    const std::string text = read_text(dir / "config.json");
    check_json_depth(text, cfg_where);
    // ordered_json keeps input_features in file order: LeRobot stacks cameras in that order.
    const nlohmann::ordered_json oj = [&] {
        try {
            return nlohmann::ordered_json::parse(text);
        } catch (const nlohmann::json::exception& ex) {
            lerobot_fail(cfg_where + ": not valid JSON (" + ex.what() + ")");
        }
    }();
    const nlohmann::json j = nlohmann::json::parse(oj.dump());
    LeRobotActFolder f;
    f.config = parse_lerobot_act_config(j, cfg_where);
    if (!fs::exists(dir / "model.safetensors")) lerobot_fail((dir / "model.safetensors").string() + ": missing", ErrorKind::Io);
    f.weights = SafeTensors::open(dir / "model.safetensors");

    // Input statistics: the preprocessor's normalizer step, else the legacy buffers with config.json's mapping.
    StatsSource stats;
    ProcessorStep pre = find_processor_step(dir, "policy_preprocessor", "normalizer_processor");
    nlohmann::json norm_map = pre.norm_map;
    const float eps = pre.eps;
    if (pre.state) {
        stats.file = pre.state;
    } else {
        norm_map = field(j, "normalization_mapping", cfg_where);
        stats.file = f.weights;
        stats.legacy = true;
    }
    if (!norm_map.is_object()) lerobot_fail(cfg_where + ": normalization map must be an object");
    const auto mode_of = [&](const std::string& type) { return mode_in(norm_map, type, cfg_where); };

    const auto inputs_it = oj.find("input_features");
    if (inputs_it == oj.end() || !inputs_it->is_object()) lerobot_fail(cfg_where + ": 'input_features' must be an object");
    for (const auto& [key, feat] : inputs_it->items())
        add_input_feature(f, key, nlohmann::json::parse(feat.dump()), cfg_where + ": input_features." + key, stats, mode_of, eps);
    if (f.cameras.empty() && f.env_key.empty())
        lerobot_fail(cfg_where + ": no VISUAL and no ENV input feature (ACT needs an image or the environment state)");
    check_same_camera_shapes(f.cameras, cfg_where);

    // The action: output_features.action, un-normalised with the postprocessor's statistics (then the
    // preprocessor's, which hold the same dataset stats, then the legacy unnormalize_outputs buffers).
    const auto& outputs = field(j, "output_features", cfg_where);
    f.action_dim = feature_shape(field(outputs, "action", cfg_where + ": output_features"), cfg_where + ": output_features.action")[0];
    ProcessorStep post = find_processor_step(dir, "policy_postprocessor", "unnormalizer_processor");
    const ProcessorStep& src = post.state ? post : pre;
    StatsSource action_stats;
    nlohmann::json action_map = src.norm_map;
    float action_eps = src.eps;
    if (src.state) {
        action_stats.file = src.state;
    } else {
        action_map = field(j, "normalization_mapping", cfg_where);
        action_stats.file = f.weights;
        action_eps = 1e-8f;
    }
    const ModeStats action_mode = mode_in(action_map, "ACTION", cfg_where);
    f.action.kind = action_mode.kind;
    if (f.action.kind != NormKind::Identity) {
        const bool mean_std = f.action.kind == NormKind::MeanStd;
        const char* lo_name = action_mode.lo;
        const char* hi_name = action_mode.hi;
        const auto key = [&](const char* stat) {
            return src.state ? std::string("action.") + stat : std::string("unnormalize_outputs.buffer_action.") + stat;
        };
        const TensorInfo* lo = action_stats.file->find(key(lo_name));
        const TensorInfo* hi = action_stats.file->find(key(hi_name));
        const std::string where = action_stats.file->path().string();
        if (!lo || !hi) lerobot_fail(where + ": missing action statistics" + expected_got("tensors '" + key(lo_name) + "' and '" + key(hi_name) + "'", "none"));
        for (const TensorInfo* t : {lo, hi}) {
            t->require_float("lerobot", where);
            if (t->shape.numel() != f.action_dim)
                lerobot_fail(where + ": tensor '" + t->name + "' has the wrong size" + expected_got(f.action_dim, t->shape.numel()));
        }
        f.action.lo = read_floats(*lo);
        f.action.hi = read_floats(*hi);
        for (std::size_t d = 0; d < f.action.lo.size(); ++d) {
            if (!mean_std) f.action.hi[d] = (f.action.hi[d] - f.action.lo[d]) == 0.f ? action_eps : f.action.hi[d] - f.action.lo[d];
            if (!std::isfinite(f.action.lo[d]) || !std::isfinite(f.action.hi[d]))
                lerobot_fail(where + ": non-finite action statistic, element " + std::to_string(d));
        }
    }
    return f;
}

}  // namespace flowedge::io
