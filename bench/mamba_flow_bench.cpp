// mamba_flow_bench: latency of the Mamba + flow policy at the reference shape (prefix 4, 10 Euler steps,
// batch 1) on the CPU or (CUDA build, --device cuda) the GPU: p50/p99/max per whole action and per
// streaming decode step, as text and JSON.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <flowedge/models/mamba_flow/policy.hpp>
#include <flowedge/residency.hpp>

#include "mamba_flow_parts.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include <flowedge/cuda/device.hpp>
#include <flowedge/cuda/launchers.hpp>
#endif

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

/// Host wall clock (and thread CPU time) around f(i) for `iters` calls after `warmup` untimed ones;
/// before(i) runs untimed ahead of every call. On CUDA every timed call ends with the result on the host
/// (the public calls synchronize), so this is the latency a caller sees.
template <class Before, class F>
Stats time_us(int warmup, int iters, Before&& before, F&& f) {
    for (int i = 0; i < warmup; ++i) {
        before(i);
        f(i);
    }
    std::vector<double> us(static_cast<std::size_t>(iters)), cpu(static_cast<std::size_t>(iters));
    for (int i = 0; i < iters; ++i) {
        before(i);
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

template <class F>
Stats time_us(int warmup, int iters, F&& f) {
    return time_us(warmup, iters, [](int) {}, std::forward<F>(f));
}

nlohmann::json to_json(const Stats& s) {
    return {{"p50", s.p50}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}, {"min", s.min},
            {"thread_cpu_p50", s.cpu_p50}, {"thread_cpu_min", s.cpu_min}};
}

#ifdef FLOWEDGE_WITH_CUDA
/// Nodes of the graph captured last (kernels per function, copies, memsets).
nlohmann::json census_json(const cuda::GraphCensus& c) {
    nlohmann::json kernels = nlohmann::json::object();
    for (const auto& [name, n] : c.kernels) kernels[name] = n;
    return {{"kernel_nodes", c.kernel_nodes}, {"memcpy_nodes", c.memcpy_nodes}, {"memset_nodes", c.memset_nodes},
            {"other_nodes", c.other_nodes}, {"kernels", kernels}};
}
#endif

struct Options {
    std::string model = "models/mamba_flow.safetensors", json_path, dtype = "f32", device = "cpu", math = "f32";
    int iters = 5000, warmup = 500, threads = 1, steps = 10;
    bool parts = false;
    bool fused_solve = false;
    bool fused_act = false;
    bool phases = false;
};

#ifdef FLOWEDGE_WITH_CUDA
/// The fused kernel's phase clock of the last launch, summed per phase kind in order of first appearance: printed
/// as cycles and microseconds (scaled by the launch's global-timer span) and returned as JSON.
nlohmann::json print_phases(const char* what) {
    const cuda::FlowPhaseProfile prof = cuda::last_flow_phases();
    struct Kind {
        std::string name;
        long long cycles = 0;
        int count = 0;
    };
    std::vector<Kind> kinds;  // in order of first appearance
    long long total = 0;
    for (const auto& ph : prof.phases) {
        total += ph.cycles;
        auto it = std::find_if(kinds.begin(), kinds.end(), [&](const Kind& k) { return k.name == ph.name; });
        if (it == kinds.end()) it = kinds.insert(kinds.end(), Kind{ph.name});
        it->cycles += ph.cycles;
        it->count += 1;
    }
    nlohmann::json rows = nlohmann::json::array();
    if (total == 0) {
        std::printf("  phase clock (%s): nothing recorded (the fused kernel did not run)\n", what);
        return rows;
    }
    const double ns_per_cycle = prof.total_ns / double(total);
    std::printf("  phase clock of one %s launch (block 0; %.2f us between the first and last stamp, %lld cycles):\n", what,
                prof.total_ns / 1000.0, total);
    for (const Kind& k : kinds) {
        const double us = double(k.cycles) * ns_per_cycle / 1000.0;
        std::printf("    %-52s x%-3d %9lld cycles %8.2f us %5.1f%%  (%.2f us each)\n", k.name.c_str(), k.count, k.cycles, us,
                    100.0 * double(k.cycles) / double(total), us / k.count);
        rows.push_back({{"phase", k.name}, {"count", k.count}, {"cycles", k.cycles}, {"us", us}});
    }
    return {{"launch", what}, {"span_us", prof.total_ns / 1000.0}, {"cycles", total}, {"phases", rows}};
}
#endif

/// Times one resident policy (MambaFlowPolicy<Cpu> or MambaFlowPolicy<Cuda>) and prints/writes the results.
template <class Policy>
int run(Policy& policy, const Options& o, const std::string& gpu) {
    constexpr bool on_cuda = std::is_same_v<Policy, MambaFlowPolicy<Cuda>>;
    auto& mamba = policy.backbone();
    auto& head = policy.head();
    head.set_fused_solve(o.fused_solve);
    policy.set_fused_act(o.fused_act);
    const int A = policy.action_dim(), dm = mamba.config().d_model;
    const int steps = o.steps, iters = o.iters, warmup = o.warmup;
    const std::vector<std::int32_t> tokens{1, 2, 3, 4};
    std::vector<float> noise(static_cast<std::size_t>(A)), action(static_cast<std::size_t>(A));
    std::vector<float> hidden(tokens.size() * std::size_t(dm)), row(static_cast<std::size_t>(dm));
    for (int i = 0; i < A; ++i) noise[std::size_t(i)] = std::sin(0.3f * float(i));

    // CUDA: record what the graphs one action (prefill + whole solve) and one decode step replay. These calls
    // capture the graphs the timed loops then replay (same keys: prefill length 4; solver, batch, steps, whole solve).
    nlohmann::json census = nullptr;
#ifdef FLOWEDGE_WITH_CUDA
    if constexpr (on_cuda) {
        cuda::set_graph_census(true);
        mamba.prefill(tokens, hidden);
        census["prefill"] = census_json(cuda::last_graph_census());
        const std::vector<float> c0(hidden.end() - dm, hidden.end());
        head.sample(c0, noise, action, Solver::Euler, steps);
        census["flow_solve"] = census_json(cuda::last_graph_census());
        mamba.step(1, row);
        census["decode_step"] = census_json(cuda::last_graph_census());
        cuda::set_graph_census(false);
        mamba.reset();
        const int action_kernels = census["prefill"]["kernel_nodes"].get<int>() + census["flow_solve"]["kernel_nodes"].get<int>();
        census["per_action"] = {{"graph_replays", 2}, {"kernel_nodes", action_kernels},
                                {"memcpy_nodes", census["prefill"]["memcpy_nodes"].get<int>() + census["flow_solve"]["memcpy_nodes"].get<int>()},
                                {"memset_nodes", census["prefill"]["memset_nodes"].get<int>() + census["flow_solve"]["memset_nodes"].get<int>()}};
    }
#endif

    // Reference action under exact F32 math with the same weights (max abs difference reported for --math != f32).
    std::vector<float> action_f32(static_cast<std::size_t>(A));
    const MathMode math = o.math == "bf16" ? MathMode::BF16 : o.math == "tf32" ? MathMode::TF32 : MathMode::F32;
    policy.set_math(MathMode::F32);
    policy.act(tokens, noise, action_f32, Solver::Euler, steps);
    policy.set_math(math);

    const Stats act = time_us(warmup, iters, [&](int) { policy.act(tokens, noise, action, Solver::Euler, steps); });
    nlohmann::json parts = nullptr;
    if constexpr (!on_cuda)
        if (o.parts) parts = bench::mamba_flow_parts(policy, int(tokens.size()), steps, act.min, act.p50);
    const Stats prefill = time_us(warmup, iters, [&](int) { mamba.prefill(tokens, hidden); });
    std::vector<float> cond(hidden.end() - dm, hidden.end());
    const Stats solve = time_us(warmup, iters, [&](int) { head.sample(cond, noise, action, Solver::Euler, steps); });
    mamba.prefill(tokens, hidden);
    const Stats decode = time_us(
        warmup, iters,
        [&](int i) {
            if (i % 256 == 0) mamba.reset();  // keep the state in a realistic range (untimed)
        },
        [&](int i) { mamba.step(std::int32_t(i % mamba.config().vocab), row); });
    policy.act(tokens, noise, action, Solver::Euler, steps);
    const bool act_ran_fused = policy.last_act_fused();  // --fused-act where the op applied
    nlohmann::json phases = nullptr;
#ifdef FLOWEDGE_WITH_CUDA
    if constexpr (on_cuda) {
        if (o.phases && act_ran_fused) phases = print_phases("mamba_flow_act");
        if (o.phases && !o.fused_act && o.fused_solve) {
            head.sample(cond, noise, action, Solver::Euler, steps);
            phases = print_phases("flow_solve");
            policy.act(tokens, noise, action, Solver::Euler, steps);
        }
    }
#endif
    double diff_vs_f32 = 0;
    for (int i = 0; i < A; ++i) diff_vs_f32 = std::max(diff_vs_f32, double(std::abs(action[std::size_t(i)] - action_f32[std::size_t(i)])));

    const double target_action = on_cuda ? 20 : 40;  // issue 20 (GPU), issue 22 (one CPU core, BF16 math)
    // The kernel set, and whether BF16 math ran its products on AMX tiles (asked only under BF16 math: the first ask
    // requests the tile state from the OS).
    std::string kernels = on_cuda ? std::string() : cpu::kernel_set_name();
    if (!on_cuda && o.math == "bf16" && cpu::amx_bf16_available() && kernels.find("(+amx)") == std::string::npos) kernels += " (+amx)";
    if (on_cuda)
        std::printf("mamba_flow_bench (flowedge cuda on %s, %s weights, %d layers, d_model %d, prefix %zu, %d Euler steps, batch 1)\n",
                    gpu.c_str(), o.dtype.c_str(), mamba.config().n_layers, dm, tokens.size(), steps);
    else
        std::printf("mamba_flow_bench (flowedge cpu, %s kernels, %s weights, %s math, %d thread%s, %d layers, d_model %d, prefix %zu, %d Euler steps, batch 1)\n",
                    kernels.c_str(), o.dtype.c_str(), o.math.c_str(), o.threads, o.threads == 1 ? "" : "s", mamba.config().n_layers, dm, tokens.size(), steps);
    auto line = [](const char* name, const Stats& s) {
        std::printf("  %-22s min %7.2f  p50 %8.2f  p99 %8.2f  max %9.2f  mean %8.2f us | thread CPU min %7.2f p50 %7.2f us\n",
                    name, s.min, s.p50, s.p99, s.max, s.mean, s.cpu_min, s.cpu_p50);
    };
    line("action (prefill+solve)", act);
    line("prefill 4 tokens", prefill);
    line("flow solve", solve);
    line("decode step", decode);
    if (math != MathMode::F32) std::printf("  max |action - action with F32 math| = %.3g\n", diff_vs_f32);
    if (on_cuda) {
        std::printf("  host wall clock around each public call, H2D of inputs and D2H of the result included\n");
        if (o.fused_act)
            std::printf("  action: %s\n", act_ran_fused ? "one fused kernel launch (--fused-act), no graph"
                                                         : "--fused-act did not apply: per-op graphs");
        if (!census.is_null() && !act_ran_fused)
            std::printf("  graphs: one action = 2 replays, %d kernel nodes (prefill %d + solve %d); decode step = 1 replay, %d kernel nodes\n",
                        census["per_action"]["kernel_nodes"].get<int>(), census["prefill"]["kernel_nodes"].get<int>(),
                        census["flow_solve"]["kernel_nodes"].get<int>(), census["decode_step"]["kernel_nodes"].get<int>());
        std::printf("  target (issue 20): action p50 <= 20 us (%s)\n", act.p50 <= target_action ? "met" : "MISSED");
    } else {
        std::printf("  targets: action p50 <= 40 us (%s), decode step p50 <= 10 us (%s)\n", act.p50 <= 40 ? "met" : "MISSED",
                    decode.p50 <= 10 ? "met" : "MISSED");
    }

    if (!o.json_path.empty()) {
        nlohmann::json j = {
            {"bench", "mamba_flow"},
            {"impl", "flowedge"},
            {"device", on_cuda ? "cuda" : "cpu"},
            {"device_requested", o.device},
            {"cuda_resident", on_cuda},
            {"gpu", on_cuda ? nlohmann::json(gpu) : nlohmann::json(nullptr)},
            {"threads", o.threads},
            {"weights", o.dtype},
            {"math", o.math},
            {"fused_solve", o.fused_solve},
            {"fused_act", o.fused_act},
            {"act_ran_fused", act_ran_fused},
            {"max_abs_action_diff_vs_f32_math", diff_vs_f32},
            {"shape", {{"n_layers", mamba.config().n_layers}, {"d_model", dm}, {"d_inner", mamba.config().d_inner},
                       {"d_state", mamba.config().d_state}, {"prefix_tokens", tokens.size()}, {"action_dim", A},
                       {"solver", "euler"}, {"steps", steps}, {"batch", 1}}},
            {"iters", iters},
            {"timing", on_cuda ? "host wall clock around each public call (H2D inputs, graph replays, D2H result, sync)"
                               : "host wall clock around each public call"},
            {"action_us", to_json(act)},
            {"prefill_us", to_json(prefill)},
            {"flow_solve_us", to_json(solve)},
            {"decode_step_us", to_json(decode)},
            {"action_0_2", {action[0], action[1], action[2]}},
            {"targets", on_cuda ? nlohmann::json{{"action_p50_us", 50}, {"source", "issue 6"}}
                                : nlohmann::json{{"action_p50_us", 40}, {"decode_step_p50_us", 10}}},
        };
        if (!census.is_null()) j["graph_census"] = census;
        if (!phases.is_null()) j["phase_clock"] = phases;
        if (!parts.is_null()) j["parts"] = parts;
        if (!on_cuda) j["kernel_set"] = kernels;
        std::ofstream(o.json_path) << j.dump(2) << "\n";
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Mamba + flow policy latency at the reference shape (prefix 4 tokens, 10 Euler steps, batch 1).\n"
                 "--device cuda (CUDA build only) fails closed with exit 2 unless the model is resident on the GPU."};
    Options o;
    app.add_option("MODEL", o.model, "checkpoint (flowedge-make-demo-mamba-flow writes one)");
    app.add_option("--iters", o.iters, "timed iterations per measurement")->check(CLI::Range(10, 100000000));
    app.add_option("--warmup", o.warmup, "untimed iterations first")->check(CLI::Range(0, 100000000));
    app.add_option("--threads", o.threads, "OpenMP threads (1 = single thread, the reference setting)")->check(CLI::Range(1, 1024));
    app.add_option("--steps", o.steps, "Euler steps")->check(CLI::Range(1, 65535));
    app.add_option("--json", o.json_path, "write the results as JSON to this file");
    app.add_flag("--fused-solve", o.fused_solve, "run the flow solve as the backend's fused op where it has one (CUDA: one cluster kernel; FlowHead::set_fused_solve)");
    app.add_flag("--fused-act", o.fused_act, "run act() as the backend's fused op where it has one (CUDA: the whole action in one cluster kernel; MambaFlowPolicy::set_fused_act)");
    app.add_flag("--phases", o.phases, "CUDA, with --fused-act or --fused-solve: record the fused kernel's phase clock "
                                       "(FLOWEDGE_CUDA_FLOW_PHASES=1) and print one launch's cycles per phase");
    app.add_flag("--parts", o.parts, "CPU: also replay each op of one action alone and print it against the FMA and L2 floors");
    app.add_option("--dtype", o.dtype, "storage of the projection weights: f32 | bf16 | f16")->check(CLI::IsMember({"f32", "bf16", "f16"}));
    app.add_option("--math", o.math, "arithmetic of the projections: f32 (exact) | bf16 (opt-in, set_math) | tf32")
        ->check(CLI::IsMember({"f32", "bf16", "tf32"}));
    app.add_option("--device", o.device, "cpu | cuda (cuda needs a -DFLOWEDGE_BACKEND=cuda build and a GPU)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    CLI11_PARSE(app, argc, argv);
    if (o.phases) setenv("FLOWEDGE_CUDA_FLOW_PHASES", "1", 1);  // read once, at the first fused launch

    try {
        const Device device = parse_device(o.device);
        if (device == Device::Cuda && !backend_available_v<Cuda>) {
            std::cerr << "mamba_flow_bench: --device cuda needs a CUDA build (configure with -DFLOWEDGE_BACKEND=cuda)\n";
            return 2;
        }
#ifdef _OPENMP
        omp_set_num_threads(o.threads);
#endif
        LoadOptions opts;
        if (o.dtype == "bf16") opts.weight_dtype = DType::BF16;
        if (o.dtype == "f16") opts.weight_dtype = DType::F16;
        // A failed upload always falls back here (FLOWEDGE_CUDA_REQUIRED would make it a load error, exit 1) so that
        // require() below reports it as exit 2; FLOWEDGE_CUDA_FORCE_HOST=1 still skips the upload.
        ResidencyFlags flags = ResidencyFlags::from_env();
        flags.cuda_required = false;
        auto resident = Resident<MambaFlowPolicy>::load(device, flags, [&](auto tag) {
            return MambaFlowPolicy<decltype(tag)>::load(o.model, opts);
        });
        try {
            resident.require(device, "mamba_flow_bench");
        } catch (const Error& e) {
            std::cerr << e.what() << "\n";
            return 2;
        }
        std::string gpu;
#ifdef FLOWEDGE_WITH_CUDA
        if (resident.cuda_resident()) gpu = cuda::device_description();
#endif
        return resident.visit([&](auto& policy) { return run(policy, o, gpu); });
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
