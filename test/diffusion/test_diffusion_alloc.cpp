// Proves that DiffusionHead<Cpu> allocates nothing after load: counts global operator new and Memory<Cpu> allocations
// around denoise/sample calls (DDIM, DDPM, every batch size, normalised and un-normalised output, F32 and BF16 math).
#include <doctest/doctest.h>

#include "../support/counting_new.hpp"

#include <filesystem>
#include <vector>

#include "diffusion_reference.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "../support/cpu_models_diffusion_head.hpp"

using namespace flowedge;
namespace fs = std::filesystem;

TEST_CASE("no allocation after load") {
    const DiffusionConfig c = dref::tiny_config();
    const dref::Weights w = dref::random_weights(c, 4);
    const fs::path dir = fs::temp_directory_path() / ("flowedge_diffusion_alloc_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    dref::write_lerobot_folder(dir, c, w, {-1.f, 0.f}, {1.f, 5.f}, [](nlohmann::json&) {});
    auto head = DiffusionHead<Cpu>::load(dir, {}, 4);
    const std::size_t per = std::size_t(c.horizon) * c.action_dim;
    std::vector<float> cond(4 * std::size_t(c.global_cond_dim), 0.25f), noise(4 * per, 0.5f), out(4 * per);
    // Exact math, then MathMode::BF16 (the vdpbf16ps kernels where built for AVX512_BF16: stack scratch only).
    for (MathMode m : {MathMode::F32, MathMode::BF16}) {
        head.set_math(m);
        CAPTURE(int(m));
        const std::size_t news0 = fe_test::g_operator_new_calls.load(), mem0 = Memory<Cpu>::allocation_count().load();
        for (int b = 1; b <= 4; ++b) {
            const std::size_t nc = std::size_t(b) * c.global_cond_dim, nx = std::size_t(b) * per;
            std::span<const float> cs(cond.data(), nc), xs(noise.data(), nx);
            std::span<float> ys(out.data(), nx);
            head.denoise(cs, xs, 50, ys, b);
            head.sample(cs, xs, ys, {.steps = 10, .scheduler = Scheduler::Ddim}, b);
            head.sample(cs, xs, ys, {.steps = 100, .scheduler = Scheduler::Ddpm, .seed = 7}, b);
            head.sample_normalized(cs, xs, ys, {.steps = 3, .scheduler = Scheduler::Ddpm, .seed = 1}, b);
        }
        const std::size_t news1 = fe_test::g_operator_new_calls.load(), mem1 = Memory<Cpu>::allocation_count().load();
        CHECK(news1 - news0 == 0);
        CHECK(mem1 - mem0 == 0);
        CHECK(news0 > 0);  // the counter does see allocations (load made some)
    }
    fs::remove_all(dir);
}
