// flow_sample: one action from a Mamba + flow checkpoint (prefix tokens 1 2 3 4, noise sin(0.3*i)),
// the quickest way to check a checkpoint and compare CPU and CUDA output at printed precision.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>

#include <flowedge/models/mamba_flow/policy.hpp>
#include <flowedge/residency.hpp>

using namespace flowedge;

int main(int argc, char** argv) {
    CLI::App app{"Sample one action from a Mamba + flow-matching checkpoint: prefix tokens 1 2 3 4, noise[i] = sin(0.3*i).\n"
                 "Prints action_dim, solver, NFE (= steps x 1/2/4 for euler/heun/rk4), action[0..2] and a latency line."};
    app.option_defaults()->always_capture_default();
    std::string model, solver_arg = "euler", device_arg = "cpu";
    int steps = 10, repeats = 200;
    app.add_option("MODEL", model, "mamba_flow.safetensors (backbone.* + flow.*)")->required();
    app.add_option("SOLVER", solver_arg, "euler | heun | rk4")
        ->transform(CLI::IsMember({"euler", "heun", "rk4"}, CLI::ignore_case));
    app.add_option("STEPS", steps, "ODE steps from t=0 to t=1")->check(CLI::Range(1, 65535));
    app.add_option("--device", device_arg, "cpu | cuda (cuda fails unless the model is resident on the GPU)")
        ->transform(CLI::IsMember({"cpu", "cuda"}, CLI::ignore_case));
    app.add_option("--repeats", repeats, "timed repetitions for the latency line")->check(CLI::Range(1, 1000000));
    CLI11_PARSE(app, argc, argv);

    try {
        const Device device = parse_device(device_arg);
        if (device == Device::Cuda && !backend_available_v<Cuda>) {
            std::cerr << "flowedge: flow_sample: this build has no CUDA backend (configure with -DFLOWEDGE_BACKEND=cuda); "
                         "use --device cpu\n";
            return 2;
        }
        const Solver solver = parse_solver(solver_arg);
        auto resident = Resident<MambaFlowPolicy>::load(device, ResidencyFlags::from_env(), [&](auto tag) {
            return MambaFlowPolicy<decltype(tag)>::load(model);
        });
        try {
            resident.require(device, "flow_sample");
        } catch (const Error& e) {
            std::cerr << e.what() << "\n";
            return 2;
        }
        return resident.visit([&](auto& policy) {
            const int A = policy.action_dim();
            const std::vector<std::int32_t> tokens{1, 2, 3, 4};
            std::vector<float> noise(static_cast<std::size_t>(A)), action(static_cast<std::size_t>(A));
            for (int i = 0; i < A; ++i) noise[std::size_t(i)] = std::sin(0.3f * float(i));
            policy.act(tokens, noise, action, solver, steps);

            std::vector<double> us;
            us.reserve(std::size_t(repeats));
            for (int r = 0; r < repeats; ++r) {
                const auto t0 = std::chrono::steady_clock::now();
                policy.act(tokens, noise, action, solver, steps);
                us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            }
            std::sort(us.begin(), us.end());
            std::cout << "action_dim=" << A << "  solver=" << solver_name(solver) << "  NFE=" << steps * solver_evals(solver)
                      << "  action[0..2]=";
            for (int i = 0; i < std::min(A, 3); ++i) std::cout << (i ? ", " : "") << action[std::size_t(i)];
            std::cout << "\n";
            std::printf("latency (prefill %zu tokens + solve, %s): p50=%.1f us  p99=%.1f us  min=%.1f us  (%d runs)\n",
                        tokens.size(), resident.backend(), us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)],
                        us.front(), repeats);
            return 0;
        });
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
