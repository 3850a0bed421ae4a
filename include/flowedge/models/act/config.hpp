// LeRobot's ACTConfig as flowedge runs it: the fields of a pretrained_model's config.json that shape the network and
// the action selection, read and validated (anything this implementation does not run is a load error naming the
// field). The feature list and normalisation live in lerobot_act_folder.hpp.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "flowedge/error.hpp"
#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"

namespace flowedge {

/// The activation of the transformer's feed-forward blocks (ACTConfig.feedforward_activation).
enum class ActFeedForward { Relu, Gelu };

/// ACTConfig fields the inference network and select_action depend on (LeRobot names and defaults).
struct ActConfig {
    int chunk_size = 100;
    int n_action_steps = 100;
    int dim_model = 512;
    int n_heads = 8;
    int dim_feedforward = 3200;
    ActFeedForward feedforward = ActFeedForward::Relu;
    int n_encoder_layers = 4;
    int n_decoder_layers = 1;
    bool pre_norm = false;
    int latent_dim = 32;
    /// Exponential weighting of overlapping chunks (ACTTemporalEnsembler); none = the n_action_steps queue.
    std::optional<double> temporal_ensemble_coeff{};

    int head_dim() const { return dim_model / n_heads; }

    /// LeRobot's ACTConfig.__post_init__ rules for the action selection, plus what this implementation needs;
    /// `where` labels the message (e.g. "<folder>/config.json").
    void validate(const std::string& where) const {
        const auto bad = [&](const std::string& name, const std::string& expected, const std::string& got) {
            fail(ErrorKind::Unsupported, "lerobot", where + ": unsupported '" + name + "'" + expected_got(expected, got));
        };
        for (const auto& [name, v] : {std::pair{"chunk_size", chunk_size}, {"n_action_steps", n_action_steps}, {"dim_model", dim_model},
                                      {"n_heads", n_heads}, {"dim_feedforward", dim_feedforward},
                                      {"n_encoder_layers", n_encoder_layers}, {"n_decoder_layers", n_decoder_layers},
                                      {"latent_dim", latent_dim}})
            if (v < 1) bad(name, ">= 1", std::to_string(v));
        if (dim_model % n_heads != 0) bad("n_heads", "a divisor of dim_model " + std::to_string(dim_model), std::to_string(n_heads));
        if (dim_model % 4 != 0) bad("dim_model", "a multiple of 4 (the 2-D position embedding interleaves sin/cos pairs per half)",
                                    std::to_string(dim_model));
        if (n_action_steps > chunk_size)
            bad("n_action_steps", "<= chunk_size " + std::to_string(chunk_size), std::to_string(n_action_steps));
        if (temporal_ensemble_coeff && n_action_steps != 1)
            bad("n_action_steps", "1 with temporal_ensemble_coeff set (LeRobot's rule)", std::to_string(n_action_steps));
        if (temporal_ensemble_coeff && !(*temporal_ensemble_coeff == *temporal_ensemble_coeff && *temporal_ensemble_coeff - *temporal_ensemble_coeff == 0))
            bad("temporal_ensemble_coeff", "a finite number", std::to_string(*temporal_ensemble_coeff));
    }
};

/// Reads an ACTConfig from config.json (`j`, labelled `where`). Fields outside ActConfig that change the network are
/// checked: type "act", n_obs_steps 1, vision_backbone resnet18, replace_final_stride_with_dilation false,
/// feedforward_activation relu or gelu.
inline ActConfig parse_lerobot_act_config(const nlohmann::json& j, const std::string& where) {
    using namespace io::detail;
    const auto unsupported = [&](const std::string& name, const std::string& expected, const std::string& got) {
        fail(ErrorKind::Unsupported, "lerobot", where + ": unsupported '" + name + "'" + expected_got(expected, got));
    };
    if (const std::string type = string_field(j, "type", where); type != "act") unsupported("type", "act", type);
    if (auto it = j.find("n_obs_steps"); it != j.end() && !it->is_null())
        if (const int n = json_int(*it, "n_obs_steps", where); n != 1) unsupported("n_obs_steps", "1", std::to_string(n));
    if (const std::string bb = string_field(j, "vision_backbone", where); bb != "resnet18") unsupported("vision_backbone", "resnet18", bb);
    if (auto it = j.find("replace_final_stride_with_dilation"); it != j.end() && !it->is_null()) {
        // LeRobot types it int but writes false; either false or 0 keeps layer4's stride.
        const bool dilated = it->is_boolean() ? it->get<bool>() : it->is_number_integer() ? it->get<long long>() != 0 : true;
        if (dilated) unsupported("replace_final_stride_with_dilation", "false", it->dump());
    }
    ActConfig c;
    c.chunk_size = int_field(j, "chunk_size", where);
    c.n_action_steps = int_field(j, "n_action_steps", where);
    c.dim_model = int_field(j, "dim_model", where);
    c.n_heads = int_field(j, "n_heads", where);
    c.dim_feedforward = int_field(j, "dim_feedforward", where);
    c.n_encoder_layers = int_field(j, "n_encoder_layers", where);
    c.n_decoder_layers = int_field(j, "n_decoder_layers", where);
    c.pre_norm = bool_field(j, "pre_norm", where);
    c.latent_dim = int_field(j, "latent_dim", where);
    const std::string act = string_field(j, "feedforward_activation", where);
    if (act == "relu") c.feedforward = ActFeedForward::Relu;
    else if (act == "gelu") c.feedforward = ActFeedForward::Gelu;
    else unsupported("feedforward_activation", "relu or gelu", act);
    if (auto it = j.find("temporal_ensemble_coeff"); it != j.end() && !it->is_null()) {
        if (!it->is_number()) unsupported("temporal_ensemble_coeff", "a number or null", it->dump());
        c.temporal_ensemble_coeff = it->get<double>();
    }
    c.validate(where);
    return c;
}

}  // namespace flowedge
