// Shape and scheduler settings of a Diffusion Policy head, shared by the model and the checkpoint readers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/models/diffusion/schedulers.hpp"

namespace flowedge {

/// LeRobot DiffusionConfig fields that define the U-Net and the sampler (defaults: the PushT policy).
struct DiffusionConfig {
    int action_dim = 2;            ///< A: output_features["action"].shape[0]
    int horizon = 16;              ///< H: rows of the sampled trajectory
    int n_action_steps = 8;        ///< rows LeRobot executes per inference
    int n_obs_steps = 2;           ///< observation frames in the condition
    int global_cond_dim = 132;     ///< width of the flattened observation condition (n_obs_steps * per-frame features)
    std::vector<int> down_dims{512, 1024, 2048};
    int kernel_size = 5;
    int n_groups = 8;
    int step_embed_dim = 128;      ///< Td (diffusion_step_embed_dim)
    int num_train_timesteps = 100; ///< T
    bool clip_sample = true;
    float clip_sample_range = 1.f;
    Scheduler scheduler = Scheduler::Ddpm;  ///< noise_scheduler_type (the checkpoint's default sampler)
    int num_inference_steps = 0;             ///< 0 = unset (LeRobot then uses num_train_timesteps)

    int stages() const { return int(down_dims.size()); }
    /// Width of the FiLM input g = [step embedding | global condition].
    int cond_dim() const { return step_embed_dim + global_cond_dim; }

    /// Throws flowedge::Error naming the first invalid field.
    void validate(std::string_view component = "diffusion") const {
        auto need = [&](bool ok, const std::string& field, const std::string& expected, const std::string& got) {
            if (!ok) fail(ErrorKind::BadFile, component, "invalid " + field + expected_got(expected, got));
        };
        // Upper bounds far above any real policy (PushT: dims 2048, Td 128) keep every derived size
        // (4*Td, 2*dims, Td + global_cond_dim, batch * channels * length) inside int / size_t arithmetic.
        constexpr int kMaxWidth = 1 << 16, kMaxCond = 1 << 24;
        need(action_dim >= 1 && action_dim <= kMaxWidth, "action_dim", "1.." + std::to_string(kMaxWidth), std::to_string(action_dim));
        need(horizon >= 1 && horizon <= kMaxWidth, "horizon", "1.." + std::to_string(kMaxWidth), std::to_string(horizon));
        need(n_obs_steps >= 1 && n_obs_steps <= horizon, "n_obs_steps", "1.." + std::to_string(horizon), std::to_string(n_obs_steps));
        need(n_action_steps >= 1 && n_action_steps <= horizon - n_obs_steps + 1, "n_action_steps",
             "1.." + std::to_string(horizon - n_obs_steps + 1), std::to_string(n_action_steps));
        need(global_cond_dim >= 1 && global_cond_dim <= kMaxCond, "global_cond_dim", "1.." + std::to_string(kMaxCond),
             std::to_string(global_cond_dim));
        need(!down_dims.empty() && down_dims.size() <= 8, "down_dims", "1..8 entries", std::to_string(down_dims.size()));
        need(n_groups >= 1, "n_groups", ">= 1", std::to_string(n_groups));
        for (std::size_t s = 0; s < down_dims.size(); ++s)
            need(down_dims[s] >= 1 && down_dims[s] <= kMaxWidth && down_dims[s] % n_groups == 0, "down_dims[" + std::to_string(s) + "]",
                 "a positive multiple of n_groups " + std::to_string(n_groups) + " up to " + std::to_string(kMaxWidth),
                 std::to_string(down_dims[s]));
        need(down_dims[0] % 8 == 0, "down_dims[0]", "a multiple of 8 (final conv block uses 8 groups)",
             std::to_string(down_dims[0]));
        const int div = 1 << (stages() - 1);
        need(horizon % div == 0, "horizon", "divisible by 2^(stages-1) = " + std::to_string(div), std::to_string(horizon));
        need(kernel_size >= 1 && kernel_size % 2 == 1 && kernel_size <= 1023, "kernel_size", "odd, 1..1023", std::to_string(kernel_size));
        need(step_embed_dim >= 4 && step_embed_dim % 2 == 0 && step_embed_dim <= kMaxWidth, "diffusion_step_embed_dim",
             "even, 4.." + std::to_string(kMaxWidth), std::to_string(step_embed_dim));
        need(num_train_timesteps >= 1 && num_train_timesteps <= (1 << 20), "num_train_timesteps", "1..1048576",
             std::to_string(num_train_timesteps));
        need(clip_sample_range > 0.f, "clip_sample_range", "> 0", std::to_string(clip_sample_range));
        need(num_inference_steps >= 0 && num_inference_steps <= num_train_timesteps, "num_inference_steps",
             "0.." + std::to_string(num_train_timesteps), std::to_string(num_inference_steps));
    }
};

}  // namespace flowedge
