// libFuzzer target: the whole-policy view of a LeRobot Diffusion Policy folder from memory (config.json in file
// order, the preprocessor's normalizer step and its statistics, or legacy normalize_inputs.* buffers), then the
// RGB encoder settings of every camera. Any flowedge::Error is an accepted rejection; anything else is a finding.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/models/diffusion/lerobot_policy_folder.hpp"
#include "flowedge/models/diffusion/rgb_encoder.hpp"
#include "fuzz_common.hpp"

namespace {
/// An accepted feature's normalisation must be usable as NormalizeParams: `n` finite offsets and finite, non-zero
/// denominators.
void check_norm(const flowedge::io::FeatureNorm& fn, std::size_t n) {
    if (fn.kind == flowedge::NormKind::Identity) return;
    if (fn.offset.size() != n || fn.denom.size() != n) __builtin_trap();
    for (std::size_t i = 0; i < n; ++i)
        if (!std::isfinite(fn.offset[i]) || !std::isfinite(fn.denom[i]) || !(fn.denom[i] != 0.f)) __builtin_trap();
}
}  // namespace

// Input: config.json text | policy_preprocessor.json text (empty: none, the legacy form) | normalizer state
// safetensors (empty: the named state file is missing) | model.safetensors, separated by fuzz::kPartSeparator.
// The state blob stands for every file the preprocessor names and for the postprocessor state (LeRobot writes the
// same action statistics to both).
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace flowedge;
    const auto parts = fuzz::split_parts(data, size, 4);
    if (parts.size() < 4) return 0;
    try {
        std::shared_ptr<const io::SafeTensors> stats;
        if (!parts[2].empty()) stats = io::SafeTensors::from_bytes(fuzz::to_bytes(parts[2]), "fuzz/normalizer.safetensors");
        auto model = io::SafeTensors::from_bytes(fuzz::to_bytes(parts[3]), "fuzz/model.safetensors");
        const nlohmann::json config = io::parse_lerobot_json(parts[0], "fuzz/config.json");
        std::vector<std::shared_ptr<const io::SafeTensors>> post;
        if (stats) post.push_back(stats);
        io::DiffusionCheckpoint head = io::lerobot_diffusion_from_parts(config, model, post, "fuzz");
        std::vector<io::LeRobotProcessorText> pre;
        if (!parts[1].empty()) pre.push_back({std::string(parts[1]), "fuzz/policy_preprocessor.json"});
        const io::LeRobotStateOpener open_state = [&](const std::string&) { return stats; };
        const io::LeRobotDiffusionPolicy pol = io::lerobot_diffusion_policy_from_parts(std::move(head), parts[0], pre, open_state, "fuzz");
        // Accepted: every feature's normalisation fits its width, and the condition the features imply is the
        // U-Net's (LeRobot's global_cond_dim = n_obs_steps x per-step features).
        if (pol.state_dim < 1) __builtin_trap();
        check_norm(pol.state_norm, std::size_t(pol.state_dim));
        check_norm(pol.env_norm, std::size_t(pol.env_dim));
        int image_feature_dim = 0;
        for (const io::PolicyCamera& cam : pol.cameras) {
            check_norm(cam.norm, std::size_t(cam.channels));
            const DiffusionRgbEncoderConfig enc = rgb_encoder_config_from_lerobot(pol.config, cam.height, cam.width, cam.channels);
            if (enc.input_h() < 1 || enc.input_w() < 1) __builtin_trap();
            image_feature_dim = 2 * enc.keypoints;
        }
        if (std::int64_t(pol.per_step_dim(image_feature_dim)) * pol.head.config.n_obs_steps != pol.head.config.global_cond_dim)
            __builtin_trap();
    } catch (const Error&) {
    }
    return 0;
}
