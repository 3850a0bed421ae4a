// libFuzzer target: compact *.flowedge.safetensors validation (dp.meta, dp.dims, action range) from memory,
// then a DiffusionHead<Cpu> load and a 2-step DDPM sample when the validated config is small.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace flowedge;
    try {
        auto st = io::SafeTensors::from_bytes(
            std::vector<std::byte>(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size),
            "fuzz.flowedge.safetensors");
        const io::DiffusionCheckpoint ck = io::open_diffusion_compact(st);
        ck.config.validate("fuzz");
        if (!fuzz::small_diffusion_config(ck.config)) return 0;
        auto head = DiffusionHead<Cpu>::load(ck);
        const auto& c = head.config();
        std::vector<float> cond(std::size_t(c.global_cond_dim), -0.5f);
        std::vector<float> noise(std::size_t(c.horizon) * c.action_dim, 0.125f);
        std::vector<float> actions(noise.size());
        SampleOptions o;
        o.steps = std::min(2, c.num_train_timesteps);
        o.scheduler = Scheduler::Ddpm;
        o.seed = 7;
        head.sample(cond, noise, actions, o);
    } catch (const Error&) {
    }
    return 0;
}
