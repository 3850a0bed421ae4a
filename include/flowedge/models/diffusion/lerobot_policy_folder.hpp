// Reads everything a LeRobot Diffusion Policy pretrained_model folder holds beyond the U-Net: the observation
// features (state, environment state, cameras, in config.json order), the RGB encoder settings and the
// normalisation statistics of the preprocessor (0.4+ policy_preprocessor*.json + state files) or, for older
// folders, the legacy normalize_inputs.* buffers of model.safetensors. docs/formats.md#lerobot-image-policies.
#pragma once
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "flowedge/error.hpp"
#include "flowedge/io/safetensors.hpp"
#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"
#include "flowedge/op_params.hpp"

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-reference"
#endif

namespace flowedge::io {

/// One feature's normalisation as NormalizeParams wants it: kind and the per-element offset / denominator
/// (per channel for images), already combined with the processor's eps exactly as LeRobot does in float32.
struct FeatureNorm {
    NormKind kind = NormKind::Identity;
    std::vector<float> offset, denom;
};

/// A camera of the policy (a VISUAL input feature): its key and the frame shape the checkpoint was trained on.
struct PolicyCamera {
    std::string key;  ///< e.g. "observation.image" or "observation.images.top"
    int channels = 3, height = 0, width = 0;
    FeatureNorm norm;
};

/// A LeRobot Diffusion Policy folder, opened and validated: the head checkpoint plus what the policy wraps around it.
struct LeRobotDiffusionPolicy {
    DiffusionCheckpoint head;   ///< U-Net tensors, DiffusionConfig, action range (lerobot_checkpoint.hpp)
    nlohmann::json config;      ///< config.json as parsed (the encoder reads its fields)
    std::string state_key = "observation.state";
    int state_dim = 0;
    FeatureNorm state_norm;
    std::string env_key;        ///< empty when the policy has no environment state
    int env_dim = 0;
    FeatureNorm env_norm;
    std::vector<PolicyCamera> cameras;  ///< in config.json input_features order (LeRobot's image_features order)
    bool separate_encoders = false;     ///< use_separate_rgb_encoder_per_camera with cameras: keys rgb_encoder.N.*
    /// Floats one observation step contributes to the condition: state + cameras * image_feature_dim + env state.
    int per_step_dim(int image_feature_dim) const { return state_dim + int(cameras.size()) * image_feature_dim + env_dim; }
};

namespace detail {

inline std::string read_text(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) lerobot_fail(p.string() + ": cannot be read", ErrorKind::Io);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Refuses JSON text nested deeper than `max_depth` before it is parsed: nlohmann::ordered_json copies values
/// recursively while parsing (and dump / copies recurse too), so a deep nest would overflow the stack. LeRobot's
/// config.json and processor files nest fewer than 10 levels.
inline void check_json_depth(std::string_view text, const std::string& where, int max_depth = 64) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (const char ch : text) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (ch == '\\') escaped = true;
            else if (ch == '"') in_string = false;
        } else if (ch == '"') {
            in_string = true;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max_depth)
                lerobot_fail(where + ": JSON nested too deeply" + expected_got("at most " + std::to_string(max_depth) + " levels", "more"));
        } else if (ch == ']' || ch == '}') {
            --depth;
        }
    }
}

/// LeRobot NormalizationMode name -> NormKind; QUANTILES / QUANTILE10 are MIN_MAX over their quantile pair.
struct ModeStats {
    NormKind kind;
    const char* lo;  ///< stats key of the offset (mean / min / q01 / q10)
    const char* hi;  ///< stats key of the scale (std / max / q99 / q90)
};
inline ModeStats parse_norm_mode(const std::string& mode, const std::string& where) {
    if (mode == "IDENTITY") return {NormKind::Identity, "", ""};
    if (mode == "MEAN_STD") return {NormKind::MeanStd, "mean", "std"};
    if (mode == "MIN_MAX") return {NormKind::MinMax, "min", "max"};
    if (mode == "QUANTILES") return {NormKind::MinMax, "q01", "q99"};
    if (mode == "QUANTILE10") return {NormKind::MinMax, "q10", "q90"};
    lerobot_fail(where + ": unsupported normalisation mode" + expected_got("IDENTITY, MEAN_STD, MIN_MAX, QUANTILES or QUANTILE10", mode),
                 ErrorKind::Unsupported);
}

/// The normaliser's statistics source: the 0.4+ preprocessor state file (keys "<feature>.<stat>") or the legacy
/// buffers of model.safetensors (keys "normalize_inputs.buffer_<feature with '.' -> '_'>.<stat>").
struct StatsSource {
    std::shared_ptr<const SafeTensors> file;
    bool legacy = false;
    std::string key(const std::string& feature, const std::string& stat) const {
        if (!legacy) return feature + "." + stat;
        std::string f = feature;
        for (char& c : f)
            if (c == '.') c = '_';
        return "normalize_inputs.buffer_" + f + "." + stat;
    }
};

/// offset/denom of one feature with `n` elements (per channel for images: the stats are [C, 1, 1]).
inline FeatureNorm feature_norm(const StatsSource& src, const std::string& feature, const ModeStats& mode, float eps, std::size_t n) {
    FeatureNorm fn;
    fn.kind = mode.kind;
    if (mode.kind == NormKind::Identity) return fn;
    const std::string klo = src.key(feature, mode.lo), khi = src.key(feature, mode.hi);
    const TensorInfo* lo = src.file->find(klo);
    const TensorInfo* hi = src.file->find(khi);
    const std::string where = src.file->path().string();
    if (!lo || !hi)
        lerobot_fail(where + ": missing normalisation statistics for '" + feature + "'" +
                     expected_got("tensors '" + klo + "' and '" + khi + "'", !lo ? "no '" + klo + "'" : "no '" + khi + "'"));
    for (const TensorInfo* t : {lo, hi}) {
        t->require_float("lerobot", where);
        if (std::size_t(t->shape.numel()) != n)
            lerobot_fail(where + ": tensor '" + t->name + "' has the wrong size" + expected_got(n, t->shape.numel()));
    }
    fn.offset = read_floats(*lo);
    const std::vector<float> h = read_floats(*hi);
    fn.denom.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        if (!std::isfinite(fn.offset[i]) || !std::isfinite(h[i]))
            lerobot_fail(where + ": non-finite normalisation statistic for '" + feature + "' element " + std::to_string(i));
        // LeRobot (processor/normalize_processor.py), in float32: MEAN_STD divides by std + eps; MIN_MAX by
        // max - min, replaced by eps where that difference is exactly zero.
        if (mode.kind == NormKind::MeanStd) fn.denom[i] = h[i] + eps;
        else fn.denom[i] = (h[i] - fn.offset[i]) == 0.f ? eps : h[i] - fn.offset[i];
        if (!(fn.denom[i] != 0.f))
            lerobot_fail(where + ": normalisation of '" + feature + "' element " + std::to_string(i) + " divides by zero");
        // Finite statistics can still overflow max - min (or std + eps) to inf, which would map every value to 0.
        if (!std::isfinite(fn.denom[i]))
            lerobot_fail(where + ": normalisation of '" + feature + "' element " + std::to_string(i) + " has a non-finite scale" +
                         expected_got("finite", std::to_string(fn.denom[i])));
    }
    return fn;
}

/// Shape list of a feature as ints.
inline std::vector<int> feature_shape(const nlohmann::json& f, const std::string& where) {
    const auto& s = field(f, "shape", where);
    if (!s.is_array() || s.empty()) lerobot_fail(where + ": 'shape' must be a non-empty integer list");
    std::vector<int> out;
    for (const auto& v : s) out.push_back(json_int(v, "shape", where));
    for (int d : out)
        if (d < 1 || d > (1 << 16)) lerobot_fail(where + ": 'shape' entries must be in 1..65536" + expected_got("1..65536", d));
    return out;
}

/// Adds config.json's input feature `key` (STATE, ENV or VISUAL) to `to`, a policy folder's feature fields (state_key /
/// state_dim / state_norm, env_*, cameras), normalised from `stats` in the mode `mode_of(type)` gives. Another type, a
/// second STATE or ENV feature, or a camera that is not [3, H, W] is a load error naming `where`.
template <class Features, class ModeOf>
void add_input_feature(Features& to, const std::string& key, const nlohmann::json& fj, const std::string& where,
                       const StatsSource& stats, const ModeOf& mode_of, float eps) {
    const std::string type = string_field(fj, "type", where);
    const std::vector<int> shape = feature_shape(fj, where);
    if (type == "STATE") {
        if (!to.state_key.empty()) lerobot_fail(where + ": a second STATE feature" + expected_got("at most one", key), ErrorKind::Unsupported);
        to.state_key = key;
        to.state_dim = shape[0];
        to.state_norm = feature_norm(stats, key, mode_of("STATE"), eps, std::size_t(shape[0]));
    } else if (type == "ENV") {
        if (!to.env_key.empty()) lerobot_fail(where + ": a second ENV feature" + expected_got("at most one", key), ErrorKind::Unsupported);
        to.env_key = key;
        to.env_dim = shape[0];
        to.env_norm = feature_norm(stats, key, mode_of("ENV"), eps, std::size_t(shape[0]));
    } else if (type == "VISUAL") {
        if (shape.size() != 3 || shape[0] != 3)
            lerobot_fail(where + ": camera shape must be [3, H, W]" +
                             expected_got("[3, H, W]", "rank " + std::to_string(shape.size()) + ", channels " + std::to_string(shape[0])),
                         ErrorKind::Unsupported);
        PolicyCamera cam;
        cam.key = key;
        cam.channels = shape[0];
        cam.height = shape[1];
        cam.width = shape[2];
        cam.norm = feature_norm(stats, key, mode_of("VISUAL"), eps, std::size_t(shape[0]));
        to.cameras.push_back(std::move(cam));
    } else {
        lerobot_fail(where + ": unsupported input feature type" + expected_got("STATE, ENV or VISUAL", type), ErrorKind::Unsupported);
    }
}

/// LeRobot's rule that every camera of a policy has the same [H, W].
inline void check_same_camera_shapes(const std::vector<PolicyCamera>& cameras, const std::string& where) {
    for (std::size_t c = 1; c < cameras.size(); ++c)
        if (cameras[c].height != cameras[0].height || cameras[c].width != cameras[0].width)
            lerobot_fail(where + ": every camera must have the same shape (as LeRobot requires)" +
                         expected_got(std::to_string(cameras[0].height) + "x" + std::to_string(cameras[0].width),
                                      cameras[c].key + " " + std::to_string(cameras[c].height) + "x" + std::to_string(cameras[c].width)));
}

}  // namespace detail

/// A policy_preprocessor*.json already in memory: its text and the name that labels its messages (its path).
struct LeRobotProcessorText {
    std::string text;
    std::string where;
};
/// Opens the state file a processor step names ("policy_preprocessor_step_3_normalizer_processor.safetensors");
/// null when there is no such file.
using LeRobotStateOpener = std::function<std::shared_ptr<const SafeTensors>(const std::string& state_file)>;

/// Builds the whole-policy view from the parts of a pretrained_model folder already in memory (the folder loader
/// and the fuzzers use it): the opened head (lerobot_diffusion_from_parts), config.json's text, the
/// policy_preprocessor*.json texts (a later normalizer step wins) and the opener of the state files they name.
/// `dir` labels messages. Unsupported or inconsistent settings are errors naming the field or key.
inline LeRobotDiffusionPolicy lerobot_diffusion_policy_from_parts(DiffusionCheckpoint head, std::string_view config_text,
                                                                  std::span<const LeRobotProcessorText> preprocessors,
                                                                  const LeRobotStateOpener& open_state,
                                                                  const std::filesystem::path& dir) {
    using namespace detail;
    LeRobotDiffusionPolicy pol;
    pol.head = std::move(head);
    const std::string cfg_where = (dir / "config.json").string();
    // ordered_json keeps input_features in file order: LeRobot stacks cameras in that order.
    check_json_depth(config_text, cfg_where);
    const nlohmann::ordered_json oj = [&] {
        try {
            return nlohmann::ordered_json::parse(config_text.begin(), config_text.end());
        } catch (const nlohmann::json::exception& ex) {
            lerobot_fail(cfg_where + ": not valid JSON (" + ex.what() + ")");
        }
    }();
    pol.config = nlohmann::json::parse(oj.dump());
    const nlohmann::json& j = pol.config;

    // Normalisation modes and eps: the preprocessor's normalizer step when there is one, else config.json.
    StatsSource stats;
    nlohmann::json norm_map;
    float eps = 1e-8f;
    for (const LeRobotProcessorText& pre : preprocessors) {
        check_json_depth(pre.text, pre.where);
        const nlohmann::json proc = parse_lerobot_json(pre.text, pre.where);
        if (auto steps = proc.find("steps"); steps != proc.end() && steps->is_array())
            for (const auto& s : *steps) {
                if (!s.is_object() || s.value("registry_name", "") != "normalizer_processor") continue;
                const std::string where = pre.where + ": normalizer_processor";
                const auto& cfg = field(s, "config", where);
                norm_map = field(cfg, "norm_map", where + ".config");
                if (auto it = cfg.find("eps"); it != cfg.end() && it->is_number()) {
                    // Range-checked as a double first: converting one beyond float's range to float is undefined.
                    const double e = it->get<double>();
                    if (!(e >= 0.0 && e <= double(std::numeric_limits<float>::max())))
                        lerobot_fail(where + ".config: 'eps' out of range" + expected_got("a non-negative float", it->dump()));
                    eps = float(e);
                }
                const std::string sf = string_field(s, "state_file", where);
                stats.file = open_state(sf);
                if (!stats.file) lerobot_fail(where + ": state file '" + sf + "' is missing");
            }
    }
    if (!stats.file) {
        norm_map = field(j, "normalization_mapping", cfg_where);
        stats.file = pol.head.weights;
        stats.legacy = true;
    }
    if (!norm_map.is_object()) lerobot_fail(cfg_where + ": normalization map must be an object");
    const auto mode_of = [&](const std::string& type) {
        auto it = norm_map.find(type);
        return parse_norm_mode(it == norm_map.end() || !it->is_string() ? std::string("IDENTITY") : it->get<std::string>(),
                               cfg_where + ": normalization mode of " + type);
    };

    const auto inputs_it = oj.find("input_features");
    if (inputs_it == oj.end() || !inputs_it->is_object()) lerobot_fail(cfg_where + ": 'input_features' must be an object");
    const nlohmann::ordered_json& inputs = *inputs_it;
    pol.state_key.clear();  // set by the STATE feature, which LeRobot's DiffusionPolicy requires (checked below)
    for (const auto& [key, f] : inputs.items())
        add_input_feature(pol, key, nlohmann::json::parse(f.dump()), cfg_where + ": input_features." + key, stats, mode_of, eps);
    if (pol.state_key.empty()) lerobot_fail(cfg_where + ": no STATE input feature (LeRobot's DiffusionPolicy requires observation.state)");
    check_same_camera_shapes(pol.cameras, cfg_where);
    if (!pol.cameras.empty()) pol.separate_encoders = bool_field(j, "use_separate_rgb_encoder_per_camera", cfg_where);
    return pol;
}

/// Opens a LeRobot DiffusionPolicy pretrained_model folder for whole-policy inference (cameras, state, processors).
/// Unsupported or inconsistent settings are errors naming the field or key and the expected value.
inline LeRobotDiffusionPolicy open_lerobot_diffusion_policy(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    using namespace detail;
    if (!fs::exists(path)) lerobot_fail(path.string() + ": no such folder (expected a LeRobot pretrained_model folder)", ErrorKind::Io);
    const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
    DiffusionCheckpoint head = open_lerobot_diffusion_folder(dir);
    const std::string config_text = read_text(dir / "config.json");
    std::vector<LeRobotProcessorText> preprocessors;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (starts_with(n, "policy_preprocessor") && e.path().extension() == ".json")
            preprocessors.push_back({read_text(e.path()), e.path().string()});
    }
    const LeRobotStateOpener open_state = [&](const std::string& sf) -> std::shared_ptr<const SafeTensors> {
        if (!fs::exists(dir / sf)) return nullptr;
        return SafeTensors::open(dir / sf);
    };
    return lerobot_diffusion_policy_from_parts(std::move(head), config_text, preprocessors, open_state, dir);
}

}  // namespace flowedge::io

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic pop
#endif
