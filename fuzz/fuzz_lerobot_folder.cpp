// libFuzzer target: LeRobot folder import from memory (config.json, postprocessor json, model and postprocessor
// safetensors), then a DiffusionHead<Cpu> load and a 2-step DDIM sample when the validated config is small.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "fuzz_common.hpp"

// Input: config.json text | policy_postprocessor.json text | model.safetensors | postprocessor state safetensors,
// separated by flowedge::fuzz::kPartSeparator. The postprocessor state is used when the processor json names a
// state_file (any name: the folder loader maps names to files; here the one blob stands for every named file).
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace flowedge;
    const auto parts = fuzz::split_parts(data, size, 4);
    if (parts.size() < 3) return 0;
    try {
        const nlohmann::json config = io::parse_lerobot_json(parts[0], "fuzz/config.json");
        std::vector<std::shared_ptr<const io::SafeTensors>> states;
        if (parts.size() == 4) {
            const nlohmann::json proc = io::parse_lerobot_json(parts[1], "fuzz/policy_postprocessor.json");
            const auto names = io::lerobot_processor_state_files(proc);
            auto st = io::SafeTensors::from_bytes(fuzz::to_bytes(parts[3]), "fuzz/postprocessor.safetensors");
            for (std::size_t i = 0; i < names.size() && i < 4; ++i) states.push_back(st);
            if (names.empty()) states.push_back(st);  // the glob fallback finds it anyway
        }
        auto model = io::SafeTensors::from_bytes(fuzz::to_bytes(parts[2]), "fuzz/model.safetensors");
        const io::DiffusionCheckpoint ck = io::lerobot_diffusion_from_parts(config, model, states, "fuzz");
        // Accepted: the config must be valid and the action range sane.
        ck.config.validate("fuzz");
        if (int(ck.action_min.size()) != ck.config.action_dim) __builtin_trap();
        if (!fuzz::small_diffusion_config(ck.config)) return 0;
        auto head = DiffusionHead<Cpu>::load(ck);
        const auto& c = head.config();
        std::vector<float> cond(std::size_t(c.global_cond_dim), 0.25f);
        std::vector<float> noise(std::size_t(c.horizon) * c.action_dim, 0.5f);
        std::vector<float> actions(noise.size());
        SampleOptions o;
        o.steps = std::min(2, c.num_train_timesteps);
        head.sample(cond, noise, actions, o);
    } catch (const Error&) {
    }
    return 0;
}
