// A downstream program built with the consumer's default compiler flags (no -march): loads a Diffusion Policy
// checkpoint, prints the CPU kernel set the process chose and the 10-step DDIM latency, so a consumer build can be
// compared with the project's own -march=native build on the same machine (tools/consumer_speed.sh).
// Usage: consumer_sample MODEL [runs] [--expect-best]  (--expect-best: fail unless the best set for this CPU runs)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <flowedge/models/diffusion/head.hpp>

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: consumer_sample MODEL [runs] [--expect-best]\n");
        return 2;
    }
    using namespace flowedge;
    const int runs = argc > 2 && std::strcmp(argv[2], "--expect-best") != 0 ? std::max(1, std::atoi(argv[2])) : 3;
    const bool expect_best = std::strcmp(argv[argc - 1], "--expect-best") == 0;
    try {
        auto head = DiffusionHead<Cpu>::load(argv[1]);
        const DiffusionConfig& c = head.config();
        const std::string set = cpu::kernel_set_name();
        std::printf("consumer_sample: cpu kernel set %s\n", set.c_str());
        if (expect_best && cpu::active_isa() != cpu::best_isa(cpu::detect_cpu_features())) {
            std::fprintf(stderr, "consumer_sample: kernel set %s is not this CPU's best (%s)\n", set.c_str(),
                         std::string(cpu::isa_name(cpu::best_isa(cpu::detect_cpu_features()))).c_str());
            return 1;
        }
        std::vector<float> cond(std::size_t(c.global_cond_dim)), noise(std::size_t(c.horizon) * c.action_dim), actions(noise.size());
        for (std::size_t i = 0; i < cond.size(); ++i) cond[i] = float(int(i % 7) - 3) * 0.1f;
        for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = float(int(i % 5) - 2) * 0.5f;
        std::vector<double> ms;
        for (int r = 0; r < runs; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            head.sample(cond, noise, actions, {.steps = 10, .scheduler = Scheduler::Ddim});
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ms.begin(), ms.end());
        double checksum = 0;
        for (float a : actions) checksum += a;
        std::printf("consumer_sample: ddim 10 steps p50 %.1f ms min %.1f ms (%d runs), action sum %.9g\n", ms[ms.size() / 2],
                    ms.front(), runs, checksum);
    } catch (const Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
