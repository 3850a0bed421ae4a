// Reads LeRobot Diffusion Policy checkpoints (pretrained_model folders and the compact *.flowedge.safetensors
// form) into a validated DiffusionConfig plus U-Net tensors addressed by their PyTorch names; also defines the compact
// form's tensor names and metadata, which export.hpp writes.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "flowedge/dtype.hpp"
#include "flowedge/error.hpp"
#include "flowedge/io/safetensors.hpp"
#include "flowedge/models/diffusion/config.hpp"
#include "flowedge/parameter.hpp"

// GCC 13 flags every `const T& x = f(..., "literal")` where f returns a reference into its first argument as a
// possibly dangling reference (a known false positive, narrowed in GCC 14); the references here point into the
// SafeTensors file / parsed JSON, which outlive them.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-reference"
#endif

namespace flowedge::io {

/// Schema version written to dp.meta[0].
inline constexpr int kDiffusionCompactSchema = 1;
/// Number of entries of dp.meta.
inline constexpr int kDiffusionMetaSize = 16;

namespace detail {
/// A LeRobot checkpoint that is malformed (BadFile) unless `kind` says otherwise (Unsupported: valid, but a
/// configuration flowedge does not implement).
[[noreturn]] inline void lerobot_fail(const std::string& what, ErrorKind kind = ErrorKind::BadFile) { fail(kind, "lerobot", what); }

inline bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

/// Splits "a.b.c" into parts.
inline std::vector<std::string> split_dots(std::string_view s) {
    std::vector<std::string> parts;
    std::size_t at = 0;
    while (true) {
        const std::size_t dot = s.find('.', at);
        parts.emplace_back(s.substr(at, dot == std::string_view::npos ? std::string_view::npos : dot - at));
        if (dot == std::string_view::npos) break;
        at = dot + 1;
    }
    return parts;
}

/// Short name of a residual-block member: conv1.block.0 -> c1, conv1.block.1 -> n1, cond_encoder.1 -> film, ...
inline std::string resblock_member(const std::vector<std::string>& p, std::size_t i, std::string_view full) {
    auto rest = [&](std::size_t n) { return p.size() == i + n + 2; };
    if (p.size() > i + 2 && p[i] == "conv1" && p[i + 1] == "block" && rest(2)) return p[i + 2] == "0" ? "c1" : "n1";
    if (p.size() > i + 2 && p[i] == "conv2" && p[i + 1] == "block" && rest(2)) return p[i + 2] == "0" ? "c2" : "n2";
    if (p.size() > i + 1 && p[i] == "cond_encoder" && p[i + 1] == "1" && rest(1)) return "film";
    if (p[i] == "residual_conv" && rest(0)) return "res";
    lerobot_fail("no compact name for U-Net parameter '" + std::string(full) + "'", ErrorKind::BadInput);
}
}  // namespace detail

/// Compact (docs/formats.md#compact-form) name of a U-Net parameter given its name under `diffusion.unet.`:
/// "down_modules.0.1.conv1.block.0.weight" -> "dp.d0.r1.c1.w", "up_modules.1.2.bias" -> "dp.u1.us.b", ...
inline std::string diffusion_compact_name(std::string_view unet_name) {
    const auto p = detail::split_dots(unet_name);
    if (p.size() < 2) detail::lerobot_fail("no compact name for U-Net parameter '" + std::string(unet_name) + "'", ErrorKind::BadInput);
    const std::string& leaf = p.back();
    std::string suffix;
    if (leaf == "weight") suffix = ".w";
    else if (leaf == "bias") suffix = ".b";
    else detail::lerobot_fail("no compact name for U-Net parameter '" + std::string(unet_name) + "'", ErrorKind::BadInput);
    auto is_digit = [](const std::string& s) { return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }); };
    const std::string& head = p[0];
    if (head == "diffusion_step_encoder" && p.size() == 3 && (p[1] == "1" || p[1] == "3"))
        return std::string(p[1] == "1" ? "dp.te1" : "dp.te2") + suffix;
    if ((head == "down_modules" || head == "up_modules") && p.size() >= 4 && is_digit(p[1])) {
        const std::string stage = std::string(head == "down_modules" ? "dp.d" : "dp.u") + p[1];
        if (p[2] == "2" && p.size() == 4) return stage + (head == "down_modules" ? ".ds" : ".us") + suffix;
        if ((p[2] == "0" || p[2] == "1") && p.size() >= 5)
            return stage + ".r" + p[2] + "." + detail::resblock_member(p, 3, unet_name) + suffix;
    }
    if (head == "mid_modules" && p.size() >= 4 && (p[1] == "0" || p[1] == "1"))
        return "dp.m" + p[1] + "." + detail::resblock_member(p, 2, unet_name) + suffix;
    if (head == "final_conv") {
        if (p.size() == 5 && p[1] == "0" && p[2] == "block" && (p[3] == "0" || p[3] == "1"))
            return std::string(p[3] == "0" ? "dp.f.c" : "dp.f.n") + suffix;
        if (p.size() == 3 && p[1] == "1") return "dp.f.o" + suffix;
    }
    detail::lerobot_fail("no compact name for U-Net parameter '" + std::string(unet_name) + "'", ErrorKind::BadInput);
}

namespace detail {
inline const nlohmann::json& field(const nlohmann::json& j, const std::string& name, const std::string& where) {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) lerobot_fail(where + ": missing field '" + name + "'");
    return *it;
}
/// An integer JSON value that must fit in int (a larger one is an error, never silently truncated).
inline int json_int(const nlohmann::json& v, const std::string& name, const std::string& where) {
    if (!v.is_number_integer()) lerobot_fail(where + ": field '" + name + "' must be an integer" + expected_got("integer", std::string(v.type_name())));
    const bool fits = v.is_number_unsigned() ? v.get<std::uint64_t>() <= std::uint64_t(std::numeric_limits<int>::max())
                                             : v.get<std::int64_t>() >= std::numeric_limits<int>::min() &&
                                                   v.get<std::int64_t>() <= std::numeric_limits<int>::max();
    if (!fits) lerobot_fail(where + ": field '" + name + "' is out of range" + expected_got("a 32-bit integer", v.dump()));
    return v.get<int>();
}
inline int int_field(const nlohmann::json& j, const std::string& name, const std::string& where) {
    return json_int(field(j, name, where), name, where);
}
inline bool bool_field(const nlohmann::json& j, const std::string& name, const std::string& where) {
    const auto& v = field(j, name, where);
    if (!v.is_boolean()) lerobot_fail(where + ": field '" + name + "' must be a boolean" + expected_got("boolean", std::string(v.type_name())));
    return v.get<bool>();
}
inline double number_field(const nlohmann::json& j, const std::string& name, const std::string& where) {
    const auto& v = field(j, name, where);
    if (!v.is_number()) lerobot_fail(where + ": field '" + name + "' must be a number" + expected_got("number", std::string(v.type_name())));
    return v.get<double>();
}
inline std::string string_field(const nlohmann::json& j, const std::string& name, const std::string& where) {
    const auto& v = field(j, name, where);
    if (!v.is_string()) lerobot_fail(where + ": field '" + name + "' must be a string" + expected_got("string", std::string(v.type_name())));
    return v.get<std::string>();
}
/// First dimension of a feature's "shape" list.
inline int feature_dim0(const nlohmann::json& feature, const std::string& where) {
    const auto& shape = field(feature, "shape", where);
    if (!shape.is_array() || shape.empty() || !shape[0].is_number_integer())
        lerobot_fail(where + ": 'shape' must be a non-empty integer list");
    const int d = json_int(shape[0], "shape[0]", where);
    if (d < 1 || d > (1 << 24)) lerobot_fail(where + ": 'shape[0]' out of range" + expected_got("1..16777216", d));
    return d;
}
/// A feature's "type" string ("" when absent or not a string).
inline std::string feature_type(const nlohmann::json& feature) {
    auto it = feature.find("type");
    return it != feature.end() && it->is_string() ? it->get<std::string>() : std::string();
}
}  // namespace detail

/// Per-frame condition width and action width implied by a LeRobot config's features (0 when not derivable).
struct LeRobotFeatureDims {
    int global_cond_dim = 0;
    int action_dim = 0;
};

/// Reads and validates the Diffusion Policy fields of a LeRobot config.json. Unsupported settings
/// (beta_schedule, prediction_type, FiLM scale modulation off, ACTION normalisation other than MIN_MAX, ...)
/// are errors naming the field. global_cond_dim/action_dim are derived from the features when present
/// (`dims` receives them) and later cross-checked against the tensor shapes.
inline DiffusionConfig parse_lerobot_diffusion_config(const nlohmann::json& j, const std::string& where,
                                                     LeRobotFeatureDims* dims = nullptr) {
    using namespace detail;
    DiffusionConfig c;
    const std::string type = string_field(j, "type", where);
    if (type != "diffusion") lerobot_fail(where + ": unsupported policy type" + expected_got("diffusion", type), ErrorKind::Unsupported);
    c.horizon = int_field(j, "horizon", where);
    c.n_action_steps = int_field(j, "n_action_steps", where);
    c.n_obs_steps = int_field(j, "n_obs_steps", where);
    const auto& dd = field(j, "down_dims", where);
    if (!dd.is_array() || dd.empty()) lerobot_fail(where + ": field 'down_dims' must be a non-empty integer list");
    c.down_dims.clear();
    if (dd.size() > 8) lerobot_fail(where + ": field 'down_dims' has too many stages" + expected_got("1..8 entries", dd.size()));
    for (const auto& v : dd) {
        if (!v.is_number_integer()) lerobot_fail(where + ": field 'down_dims' must be a non-empty integer list");
        c.down_dims.push_back(json_int(v, "down_dims", where));
    }
    c.kernel_size = int_field(j, "kernel_size", where);
    c.n_groups = int_field(j, "n_groups", where);
    c.step_embed_dim = int_field(j, "diffusion_step_embed_dim", where);
    if (!bool_field(j, "use_film_scale_modulation", where))
        lerobot_fail(where + ": unsupported use_film_scale_modulation" + expected_got("true", "false"), ErrorKind::Unsupported);
    const std::string sched = string_field(j, "noise_scheduler_type", where);
    try {
        c.scheduler = parse_scheduler(sched);
    } catch (const Error&) {
        lerobot_fail(where + ": unsupported noise_scheduler_type" + expected_got("DDPM or DDIM", sched), ErrorKind::Unsupported);
    }
    c.num_train_timesteps = int_field(j, "num_train_timesteps", where);
    const std::string beta = string_field(j, "beta_schedule", where);
    if (beta != "squaredcos_cap_v2") lerobot_fail(where + ": unsupported beta_schedule" + expected_got("squaredcos_cap_v2", beta), ErrorKind::Unsupported);
    const std::string pred = string_field(j, "prediction_type", where);
    if (pred != "epsilon") lerobot_fail(where + ": unsupported prediction_type" + expected_got("epsilon", pred), ErrorKind::Unsupported);
    c.clip_sample = bool_field(j, "clip_sample", where);
    c.clip_sample_range = float(number_field(j, "clip_sample_range", where));
    if (auto it = j.find("num_inference_steps"); it != j.end() && !it->is_null()) {
        if (!it->is_number_integer()) lerobot_fail(where + ": field 'num_inference_steps' must be an integer or null");
        c.num_inference_steps = json_int(*it, "num_inference_steps", where);
    }
    if (auto it = j.find("normalization_mapping"); it != j.end()) {
        const std::string action_norm = string_field(*it, "ACTION", where + ": normalization_mapping");
        if (action_norm != "MIN_MAX")
            lerobot_fail(where + ": unsupported normalization_mapping.ACTION" + expected_got("MIN_MAX", action_norm), ErrorKind::Unsupported);
    } else {
        lerobot_fail(where + ": missing field 'normalization_mapping'");
    }
    // Features: the condition is n_obs_steps x (state + env state + cameras * 2 * keypoints).
    LeRobotFeatureDims d;
    if (auto it = j.find("output_features"); it != j.end() && it->is_object()) {
        for (const auto& [name, f] : it->items())
            if (f.is_object() && feature_type(f) == "ACTION") d.action_dim = feature_dim0(f, where + ": output_features." + name);
    }
    if (auto it = j.find("input_features"); it != j.end() && it->is_object()) {
        // 64-bit sums: each term is bounded (dims <= 2^24, keypoints checked below), so nothing can overflow.
        std::int64_t state = 0, env = 0, images = 0;
        for (const auto& [name, f] : it->items()) {
            if (!f.is_object()) continue;
            const std::string ft = feature_type(f);
            if (ft == "STATE") state += feature_dim0(f, where + ": input_features." + name);
            else if (ft == "ENV") env += feature_dim0(f, where + ": input_features." + name);
            else if (ft == "VISUAL") ++images;
        }
        std::int64_t per_frame = state + env;
        if (images > 0) {
            const int kp = int_field(j, "spatial_softmax_num_keypoints", where);
            if (kp < 1 || kp > (1 << 20))
                lerobot_fail(where + ": field 'spatial_softmax_num_keypoints' out of range" + expected_got("1..1048576", kp));
            per_frame += images * 2 * std::int64_t(kp);
        }
        const std::int64_t gcd = per_frame * std::int64_t(std::max(c.n_obs_steps, 0));
        if (gcd > std::int64_t(std::numeric_limits<int>::max()))
            lerobot_fail(where + ": the condition width implied by input_features is too large" + expected_got("< 2^31", std::to_string(gcd)));
        d.global_cond_dim = int(gcd);
    }
    c.action_dim = d.action_dim;
    c.global_cond_dim = d.global_cond_dim;
    if (dims) *dims = d;
    return c;
}

/// An opened Diffusion Policy checkpoint: validated config, MIN_MAX action range, and the U-Net tensors.
struct DiffusionCheckpoint {
    DiffusionConfig config;
    std::vector<float> action_min, action_max;  ///< [action_dim] each
    std::shared_ptr<const SafeTensors> weights; ///< model.safetensors or the compact file
    bool compact = false;
    std::filesystem::path source;

    /// File key holding the U-Net parameter `unet_name` (name relative to diffusion.unet.).
    std::string key(const std::string& unet_name) const {
        return compact ? diffusion_compact_name(unet_name) : "diffusion.unet." + unet_name;
    }
    /// The tensor for `unet_name`; a missing one is an error naming the key.
    const TensorInfo& tensor(const std::string& unet_name) const {
        const std::string k = key(unet_name);
        const TensorInfo* t = weights->find(k);
        if (!t) fail(ErrorKind::BadFile, "lerobot", source.string() + ": missing tensor '" + k + "'");
        return *t;
    }
};

namespace detail {
/// Reads a small tensor as float32 on the host.
inline std::vector<float> read_floats(const TensorInfo& t) {
    std::vector<float> v(static_cast<std::size_t>(t.shape.numel()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(t.data, t.dtype, i);
    return v;
}

inline void check_action_range(const std::vector<float>& mn, const std::vector<float>& mx, int action_dim,
                               const std::string& where, const std::string& min_key, const std::string& max_key) {
    if (int(mn.size()) != action_dim)
        lerobot_fail(where + ": tensor '" + min_key + "' has the wrong size" + expected_got(action_dim, mn.size()));
    if (int(mx.size()) != action_dim)
        lerobot_fail(where + ": tensor '" + max_key + "' has the wrong size" + expected_got(action_dim, mx.size()));
    for (int a = 0; a < action_dim; ++a) {
        if (!std::isfinite(mn[std::size_t(a)]) || !std::isfinite(mx[std::size_t(a)]) || !(mn[std::size_t(a)] < mx[std::size_t(a)]))
            lerobot_fail(where + ": action min must be below max for dimension " + std::to_string(a) + " ('" + min_key +
                         "' < '" + max_key + "')" +
                         expected_got("min < max", std::to_string(mn[std::size_t(a)]) + " >= " + std::to_string(mx[std::size_t(a)])));
    }
}

/// Action min/max from postprocessor state files (in search order), then legacy buffers in model.safetensors.
inline bool find_lerobot_action_range(std::span<const std::shared_ptr<const SafeTensors>> states, const SafeTensors& model,
                                      DiffusionCheckpoint& ck) {
    for (const auto& st : states) {
        if (!st) continue;
        const TensorInfo* mn = st->find("action.min");
        const TensorInfo* mx = st->find("action.max");
        if (mn && mx) {
            ck.action_min = read_floats(*mn);
            ck.action_max = read_floats(*mx);
            check_action_range(ck.action_min, ck.action_max, ck.config.action_dim, st->path().string(), "action.min", "action.max");
            return true;
        }
    }
    const TensorInfo* mn = model.find("unnormalize_outputs.buffer_action.min");
    const TensorInfo* mx = model.find("unnormalize_outputs.buffer_action.max");
    if (mn && mx) {
        ck.action_min = read_floats(*mn);
        ck.action_max = read_floats(*mx);
        check_action_range(ck.action_min, ck.action_max, ck.config.action_dim, model.path().string(),
                           "unnormalize_outputs.buffer_action.min", "unnormalize_outputs.buffer_action.max");
        return true;
    }
    return false;
}

/// Postprocessor state files of a LeRobot folder in search order: those named by policy_postprocessor*.json
/// (sorted by json name), then any other policy_postprocessor*.safetensors (sorted).
inline std::vector<std::filesystem::path> lerobot_postprocessor_state_paths(const std::filesystem::path& dir);

/// Shape of a tensor as a vector of dims (for derivations with clear errors).
inline const TensorInfo& require(const SafeTensors& f, const std::string& key, int rank) {
    const TensorInfo* t = f.find(key);
    if (!t) lerobot_fail(f.path().string() + ": missing tensor '" + key + "'");
    if (t->shape.rank != rank)
        lerobot_fail(f.path().string() + ": tensor '" + key + "' has the wrong rank" + expected_got(rank, t->shape.rank));
    return *t;
}
}  // namespace detail

/// Parses JSON text (the contents of config.json or a policy_postprocessor*.json); an Error naming `where` if invalid.
inline nlohmann::json parse_lerobot_json(std::string_view text, const std::string& where) {
    try {
        return nlohmann::json::parse(text.begin(), text.end());
    } catch (const std::exception& ex) {
        detail::lerobot_fail(where + ": not valid JSON (" + ex.what() + ")");
    }
}

/// The `state_file` names a policy_postprocessor*.json lists under "steps", in order (other content is ignored).
inline std::vector<std::string> lerobot_processor_state_files(const nlohmann::json& processor) {
    std::vector<std::string> names;
    if (!processor.is_object()) return names;
    if (auto steps = processor.find("steps"); steps != processor.end() && steps->is_array())
        for (const auto& s : *steps)
            if (s.is_object())
                if (auto sf = s.find("state_file"); sf != s.end() && sf->is_string()) names.push_back(sf->get<std::string>());
    return names;
}

/// Builds a checkpoint from the parts of a LeRobot pretrained_model folder already in memory (the folder
/// loader and the fuzzers use it): parsed config.json, model.safetensors, and the postprocessor state files
/// in search order (see open_lerobot_diffusion_folder). `dir` labels messages and becomes ck.source.
inline DiffusionCheckpoint lerobot_diffusion_from_parts(const nlohmann::json& config, std::shared_ptr<const SafeTensors> model,
                                                        std::span<const std::shared_ptr<const SafeTensors>> postprocessor_states,
                                                        const std::filesystem::path& dir) {
    using namespace detail;
    if (!model) lerobot_fail(dir.string() + ": no model.safetensors");
    const std::string cfg_where = (dir / "config.json").string();
    if (!config.is_object()) lerobot_fail(cfg_where + ": not a JSON object" + expected_got("object", std::string(config.type_name())));
    DiffusionCheckpoint ck;
    ck.source = dir;
    LeRobotFeatureDims feat;
    ck.config = parse_lerobot_diffusion_config(config, cfg_where, &feat);
    ck.weights = std::move(model);
    const SafeTensors& m = *ck.weights;
    // Cross-check the config against the tensor shapes (which define the network).
    const TensorInfo& te1 = require(m, "diffusion.unet.diffusion_step_encoder.1.weight", 2);
    if (te1.shape[1] != ck.config.step_embed_dim)
        lerobot_fail(m.path().string() + ": 'diffusion.unet.diffusion_step_encoder.1.weight' disagrees with "
                     "diffusion_step_embed_dim" + expected_got(ck.config.step_embed_dim, te1.shape[1]));
    const TensorInfo& film = require(m, "diffusion.unet.down_modules.0.0.cond_encoder.1.weight", 2);
    const std::int64_t gcd64 = film.shape[1] - std::int64_t(ck.config.step_embed_dim);
    if (gcd64 < 1 || gcd64 > std::numeric_limits<int>::max())
        lerobot_fail(m.path().string() + ": 'diffusion.unet.down_modules.0.0.cond_encoder.1.weight' has a bad width for "
                     "diffusion_step_embed_dim" + expected_got(std::to_string(ck.config.step_embed_dim) + " + global_cond_dim columns",
                                                               std::to_string(film.shape[1])));
    const int gcd = int(gcd64);
    if (feat.global_cond_dim != 0 && feat.global_cond_dim != gcd)
        lerobot_fail(cfg_where + ": global_cond_dim from input_features disagrees with "
                     "'diffusion.unet.down_modules.0.0.cond_encoder.1.weight'" + expected_got(gcd, feat.global_cond_dim));
    ck.config.global_cond_dim = gcd;
    const TensorInfo& fo = require(m, "diffusion.unet.final_conv.1.weight", 3);
    if (fo.shape[0] < 1 || fo.shape[0] > std::numeric_limits<int>::max())
        lerobot_fail(m.path().string() + ": 'diffusion.unet.final_conv.1.weight' has a bad action width" +
                     expected_got(">= 1", std::to_string(fo.shape[0])));
    const int a = int(fo.shape[0]);
    if (feat.action_dim != 0 && feat.action_dim != a)
        lerobot_fail(cfg_where + ": output_features action shape disagrees with 'diffusion.unet.final_conv.1.weight'" +
                     expected_got(a, feat.action_dim));
    ck.config.action_dim = a;
    ck.config.validate("lerobot");
    if (!find_lerobot_action_range(postprocessor_states, m, ck))
        lerobot_fail(dir.string() + ": no action min/max found (expected 'action.min'/'action.max' in a "
                     "policy_postprocessor*.safetensors or 'unnormalize_outputs.buffer_action.{min,max}' in model.safetensors)");
    return ck;
}

inline std::vector<std::filesystem::path> detail::lerobot_postprocessor_state_paths(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    std::vector<fs::path> candidates;
    std::vector<fs::path> jsons;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (starts_with(n, "policy_postprocessor") && e.path().extension() == ".json") jsons.push_back(e.path());
    }
    std::sort(jsons.begin(), jsons.end());
    for (const auto& jp : jsons) {
        std::ifstream in(jp, std::ios::binary);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        for (const auto& name : lerobot_processor_state_files(parse_lerobot_json(text, jp.string())))
            candidates.push_back(dir / name);
    }
    std::vector<fs::path> globbed;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string n = e.path().filename().string();
        if (starts_with(n, "policy_postprocessor") && e.path().extension() == ".safetensors") globbed.push_back(e.path());
    }
    std::sort(globbed.begin(), globbed.end());
    for (const auto& g : globbed)
        if (std::find(candidates.begin(), candidates.end(), g) == candidates.end()) candidates.push_back(g);
    return candidates;
}

/// Opens a LeRobot pretrained_model folder (config.json + model.safetensors [+ policy_postprocessor*]).
/// `path` may be the folder or its model.safetensors. Every postprocessor state file is opened and validated.
inline DiffusionCheckpoint open_lerobot_diffusion_folder(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    using namespace detail;
    const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
    const fs::path cfg_path = dir / "config.json";
    const fs::path model_path = dir / "model.safetensors";
    if (!fs::exists(cfg_path)) lerobot_fail(dir.string() + ": no config.json (expected a LeRobot pretrained_model folder)");
    if (!fs::exists(model_path)) lerobot_fail(dir.string() + ": no model.safetensors (expected a LeRobot pretrained_model folder)");
    nlohmann::json j;
    {
        std::ifstream in(cfg_path, std::ios::binary);
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        j = parse_lerobot_json(text, cfg_path.string());
    }
    // Parse the config before touching the weights (config errors come first, as before).
    (void)parse_lerobot_diffusion_config(j, cfg_path.string());
    auto model = SafeTensors::open(model_path);
    std::vector<std::shared_ptr<const SafeTensors>> states;
    for (const auto& c : lerobot_postprocessor_state_paths(dir)) {
        if (!fs::exists(c)) lerobot_fail(c.string() + ": postprocessor state file named in the processor json is missing");
        states.push_back(SafeTensors::open(c));
    }
    return lerobot_diffusion_from_parts(j, std::move(model), states, dir);
}

/// Opens a compact *.flowedge.safetensors Diffusion Policy file (docs/formats.md#compact-form), validating dp.meta / dp.dims / the action range.
/// The file-based overload opens `path`; this one validates an already opened (e.g. in-memory) file.
inline DiffusionCheckpoint open_diffusion_compact(std::shared_ptr<const SafeTensors> file) {
    using namespace detail;
    if (!file) lerobot_fail("open_diffusion_compact: null file", ErrorKind::BadInput);
    DiffusionCheckpoint ck;
    ck.source = file->path();
    ck.compact = true;
    ck.weights = std::move(file);
    const SafeTensors& f = *ck.weights;
    const std::string where = ck.source.string();
    if (!f.contains("dp.meta") && (f.contains("backbone.embeddings.weight") || f.contains("flow.in_proj.weight")))
        lerobot_fail(where + ": this is a Mamba-flow checkpoint; use flow_sample (expected a Diffusion Policy file with 'dp.meta')");
    const TensorInfo& meta_t = require(f, "dp.meta", 1);
    if (meta_t.shape[0] != kDiffusionMetaSize)
        lerobot_fail(where + ": tensor 'dp.meta' has the wrong size" + expected_got(kDiffusionMetaSize, meta_t.shape[0]));
    const std::vector<float> meta = read_floats(meta_t);
    auto as_int = [&](int i, const char* name) {
        const float v = meta[std::size_t(i)];
        if (!std::isfinite(v) || v != std::floor(v) || std::fabs(v) > 1e8f)
            lerobot_fail(where + ": dp.meta[" + std::to_string(i) + "] (" + name + ") must be an integer" +
                         expected_got("integer", std::to_string(v)));
        return int(v);
    };
    if (as_int(0, "schema") != kDiffusionCompactSchema)
        lerobot_fail(where + ": unsupported dp.meta schema" + expected_got(kDiffusionCompactSchema, as_int(0, "schema")), ErrorKind::Unsupported);
    DiffusionConfig& c = ck.config;
    c.action_dim = as_int(1, "action_dim");
    c.horizon = as_int(2, "horizon");
    c.n_action_steps = as_int(3, "n_action_steps");
    c.n_obs_steps = as_int(4, "n_obs_steps");
    c.global_cond_dim = as_int(5, "global_cond_dim");
    const int stages = as_int(6, "stages");
    c.kernel_size = as_int(7, "kernel_size");
    c.n_groups = as_int(8, "n_groups");
    c.step_embed_dim = as_int(9, "diffusion_step_embed_dim");
    c.num_train_timesteps = as_int(10, "num_train_timesteps");
    if (as_int(11, "beta_schedule") != 0)
        lerobot_fail(where + ": unsupported beta_schedule code in dp.meta[11]" + expected_got("0 (squaredcos_cap_v2)", as_int(11, "beta_schedule")), ErrorKind::Unsupported);
    if (as_int(12, "prediction_type") != 0)
        lerobot_fail(where + ": unsupported prediction_type code in dp.meta[12]" + expected_got("0 (epsilon)", as_int(12, "prediction_type")), ErrorKind::Unsupported);
    const int clip = as_int(13, "clip_sample");
    if (clip != 0 && clip != 1) lerobot_fail(where + ": dp.meta[13] (clip_sample) must be 0 or 1" + expected_got("0 or 1", clip));
    c.clip_sample = clip == 1;
    c.clip_sample_range = meta[14];
    if (as_int(15, "action normalisation") != 0)
        lerobot_fail(where + ": unsupported action normalisation code in dp.meta[15]" + expected_got("0 (MIN_MAX)", as_int(15, "action normalisation")), ErrorKind::Unsupported);
    c.scheduler = Scheduler::Ddim;
    c.num_inference_steps = 0;
    const TensorInfo& dims_t = require(f, "dp.dims", 1);
    if (dims_t.shape[0] != stages)
        lerobot_fail(where + ": tensor 'dp.dims' disagrees with dp.meta[6] (stages)" + expected_got(stages, dims_t.shape[0]));
    c.down_dims.clear();
    const std::vector<float> dims = read_floats(dims_t);
    for (float d : dims) {
        if (!(d >= 1.f && d == std::floor(d) && d < 1e8f))
            lerobot_fail(where + ": tensor 'dp.dims' must hold positive integers" + expected_got("integer", std::to_string(d)));
        c.down_dims.push_back(int(d));
    }
    c.validate("lerobot");
    ck.action_min = read_floats(require(f, "dp.action_min", 1));
    ck.action_max = read_floats(require(f, "dp.action_max", 1));
    check_action_range(ck.action_min, ck.action_max, c.action_dim, where, "dp.action_min", "dp.action_max");
    return ck;
}

/// Opens a compact *.flowedge.safetensors file from disk (mmap) and validates it.
inline DiffusionCheckpoint open_diffusion_compact(const std::filesystem::path& path) {
    return open_diffusion_compact(SafeTensors::open(path));
}

/// Whether `path` is a compact file (a regular file whose header holds dp.meta) rather than a LeRobot folder.
inline bool is_diffusion_compact(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    if (fs::is_directory(path)) return false;
    if (path.filename() == "model.safetensors" && fs::exists(path.parent_path() / "config.json")) return false;
    return true;
}

/// Opens either form: a LeRobot folder (or its model.safetensors) or a compact file.
inline DiffusionCheckpoint open_diffusion_checkpoint(const std::filesystem::path& path) {
    if (!std::filesystem::exists(path)) fail(ErrorKind::Io, "lerobot", path.string() + ": no such file or folder");
    return is_diffusion_compact(path) ? open_diffusion_compact(path) : open_lerobot_diffusion_folder(path);
}

/// dp.meta for a config (docs/formats.md#compact-form order).
inline std::array<float, kDiffusionMetaSize> diffusion_meta(const DiffusionConfig& c) {
    return {float(kDiffusionCompactSchema), float(c.action_dim), float(c.horizon), float(c.n_action_steps),
            float(c.n_obs_steps), float(c.global_cond_dim), float(c.stages()), float(c.kernel_size), float(c.n_groups),
            float(c.step_embed_dim), float(c.num_train_timesteps), 0.f, 0.f, c.clip_sample ? 1.f : 0.f,
            c.clip_sample_range, 0.f};
}

}  // namespace flowedge::io

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 13
#pragma GCC diagnostic pop
#endif
