// mamba_flow_bench: latency of the Mamba + flow policy at the reference shape (prefix 4, 10 Euler steps,
// batch 1): p50/p99/max per whole action and per streaming decode step, as text and JSON.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <flowedge/models/mamba_flow_policy.hpp>

using namespace flowedge;

namespace {

struct Stats {
    double p50 = 0, p99 = 0, max = 0, mean = 0, min = 0;
    double cpu_p50 = 0, cpu_min = 0;  ///< this thread's CPU time per call (excludes time the core was taken away)
};

double thread_cpu_us() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) * 1e-3;
}

template <class F>
Stats time_us(int warmup, int iters, F&& f) {
    for (int i = 0; i < warmup; ++i) f(i);
    std::vector<double> us(static_cast<std::size_t>(iters)), cpu(static_cast<std::size_t>(iters));
    for (int i = 0; i < iters; ++i) {
        const double c0 = thread_cpu_us();
        const auto t0 = std::chrono::steady_clock::now();
        f(i);
        us[std::size_t(i)] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        cpu[std::size_t(i)] = thread_cpu_us() - c0;
    }
    Stats s;
    for (double v : us) s.mean += v;
    s.mean /= double(iters);
    std::sort(us.begin(), us.end());
    std::sort(cpu.begin(), cpu.end());
    s.min = us.front();
    s.p50 = us[us.size() / 2];
    s.p99 = us[std::min(us.size() - 1, std::size_t(double(us.size()) * 0.99))];
    s.max = us.back();
    s.cpu_min = cpu.front();
    s.cpu_p50 = cpu[cpu.size() / 2];
    return s;
}

nlohmann::json to_json(const Stats& s) {
    return {{"p50", s.p50}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}, {"min", s.min},
            {"thread_cpu_p50", s.cpu_p50}, {"thread_cpu_min", s.cpu_min}};
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Mamba + flow policy latency at the reference shape (prefix 4 tokens, 10 Euler steps, batch 1)."};
    std::string model = "models/mamba_flow.safetensors", json_path, dtype = "f32";
    int iters = 5000, warmup = 500, threads = 1, steps = 10;
    app.add_option("MODEL", model, "checkpoint (flowedge-make-demo-mamba-flow writes one)");
    app.add_option("--iters", iters, "timed iterations per measurement")->check(CLI::Range(10, 100000000));
    app.add_option("--warmup", warmup, "untimed iterations first")->check(CLI::Range(0, 100000000));
    app.add_option("--threads", threads, "OpenMP threads (1 = single thread, the reference setting)")->check(CLI::Range(1, 1024));
    app.add_option("--steps", steps, "Euler steps")->check(CLI::Range(1, 65535));
    app.add_option("--json", json_path, "write the results as JSON to this file");
    app.add_option("--dtype", dtype, "storage of the projection weights: f32 | bf16 | f16")->check(CLI::IsMember({"f32", "bf16", "f16"}));
    CLI11_PARSE(app, argc, argv);

    try {
#ifdef _OPENMP
        omp_set_num_threads(threads);
#endif
        LoadOptions opts;
        if (dtype == "bf16") opts.weight_dtype = DType::BF16;
        if (dtype == "f16") opts.weight_dtype = DType::F16;
        auto policy = MambaFlowPolicy<Cpu>::load(model, opts);
        auto& mamba = policy.backbone();
        const int A = policy.action_dim(), dm = mamba.config().d_model;
        const std::vector<std::int32_t> tokens{1, 2, 3, 4};
        std::vector<float> noise(static_cast<std::size_t>(A)), action(static_cast<std::size_t>(A));
        std::vector<float> hidden(tokens.size() * std::size_t(dm)), row(static_cast<std::size_t>(dm));
        for (int i = 0; i < A; ++i) noise[std::size_t(i)] = std::sin(0.3f * float(i));

        const Stats act = time_us(warmup, iters, [&](int) { policy.act(tokens, noise, action, Solver::Euler, steps); });
        const Stats prefill = time_us(warmup, iters, [&](int) { mamba.prefill(tokens, hidden); });
        std::vector<float> cond(hidden.end() - dm, hidden.end());
        auto& head = policy.head();
        const Stats solve = time_us(warmup, iters, [&](int) { head.sample(cond, noise, action, Solver::Euler, steps); });
        mamba.prefill(tokens, hidden);
        const Stats decode = time_us(warmup, iters, [&](int i) {
            if (i % 256 == 0) mamba.reset();  // keep the state in a realistic range
            mamba.step(std::int32_t(i % mamba.config().vocab), row);
        });
        policy.act(tokens, noise, action, Solver::Euler, steps);

        std::printf("mamba_flow_bench (flowedge cpu, %s weights, %d thread%s, %d layers, d_model %d, prefix %zu, %d Euler steps, batch 1)\n",
                    dtype.c_str(), threads, threads == 1 ? "" : "s", mamba.config().n_layers, dm, tokens.size(), steps);
        auto line = [](const char* name, const Stats& s) {
            std::printf("  %-22s min %7.2f  p50 %8.2f  p99 %8.2f  max %9.2f  mean %8.2f us | thread CPU min %7.2f p50 %7.2f us\n",
                        name, s.min, s.p50, s.p99, s.max, s.mean, s.cpu_min, s.cpu_p50);
        };
        line("action (prefill+solve)", act);
        line("prefill 4 tokens", prefill);
        line("flow solve", solve);
        line("decode step", decode);
        std::printf("  targets: action p50 <= 40 us (%s), decode step p50 <= 10 us (%s)\n", act.p50 <= 40 ? "met" : "MISSED",
                    decode.p50 <= 10 ? "met" : "MISSED");

        if (!json_path.empty()) {
            nlohmann::json j = {
                {"bench", "mamba_flow"},
                {"impl", "flowedge"},
                {"device", "cpu"},
                {"threads", threads},
                {"weights", dtype},
                {"shape", {{"n_layers", mamba.config().n_layers}, {"d_model", dm}, {"d_inner", mamba.config().d_inner},
                           {"d_state", mamba.config().d_state}, {"prefix_tokens", tokens.size()}, {"action_dim", A},
                           {"solver", "euler"}, {"steps", steps}, {"batch", 1}}},
                {"iters", iters},
                {"action_us", to_json(act)},
                {"prefill_us", to_json(prefill)},
                {"flow_solve_us", to_json(solve)},
                {"decode_step_us", to_json(decode)},
                {"action_0_2", {action[0], action[1], action[2]}},
                {"targets", {{"action_p50_us", 40}, {"decode_step_p50_us", 10}}},
            };
            std::ofstream(json_path) << j.dump(2) << "\n";
        }
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
