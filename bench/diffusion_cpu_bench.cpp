// diffusion_cpu_bench: PushT Diffusion Policy (batch 1, N-step DDIM) on the CPU with F32, BF16 or INT8 weights, exact (F32)
// and opt-in BF16 arithmetic (MathMode::BF16: vdpbf16ps where built for AVX512_BF16), at 1 and 2 threads, next to the
// memory floor (weight bytes x steps / this machine's measured read bandwidth) and, per row, the largest action
// difference from F32 weights with F32 math.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <flowedge/models/diffusion/head.hpp>

using namespace flowedge;

namespace {

std::string read_loadavg() {
    std::ifstream f("/proc/loadavg");
    std::string a, b, c;
    f >> a >> b >> c;
    return a + " " + b + " " + c;
}

void set_threads(int t) {
#ifdef _OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

/// Streaming-read bandwidth in GB/s with `threads` threads: best of `reps` vector sums over `mib` MiB (>> L3).
double read_bandwidth_gbs(int threads, std::size_t mib, int reps) {
    const std::size_t n = (mib << 20) / sizeof(float);
    std::vector<float> a(n);
    set_threads(threads);
#pragma omp parallel for schedule(static)
    for (std::size_t i = 0; i < n; ++i) a[i] = float(i & 7);  // first touch by the reading thread
    double best = 1e30;
    volatile float sink = 0;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        float total = 0;
        // Each thread reads its contiguous share once (cpu::stream_sum: full vector width, 4 chains).
#pragma omp parallel reduction(+ : total)
        {
            const int tid = cpu::thread_index(), nth = cpu::thread_count();
            const std::int64_t lo = std::int64_t(n) * tid / nth, hi = std::int64_t(n) * (tid + 1) / nth;
            total += cpu::stream_sum(a.data() + lo, hi - lo);
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        sink = total;
    }
    (void)sink;
    return double(n) * sizeof(float) / best / 1e9;
}

struct Stats {
    double min = 0, p50 = 0, p99 = 0, max = 0, mean = 0;
};

Stats summarize(std::vector<double> v) {
    Stats s;
    for (double x : v) s.mean += x;
    s.mean /= double(v.size());
    std::sort(v.begin(), v.end());
    s.min = v.front();
    s.p50 = v[v.size() / 2];
    s.p99 = v[std::min(v.size() - 1, std::size_t(std::ceil(double(v.size()) * 0.99)) - 1)];
    s.max = v.back();
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"PushT Diffusion Policy on the CPU: batch 1, N-step DDIM, F32/BF16 weights, 1 and 2 threads, vs the memory floor."};
    std::string model = "models/diffusion_pusht.flowedge.safetensors", json_path;
    std::vector<std::string> dtypes{"f32", "bf16"}, maths{"f32", "bf16"};
    std::vector<int> threads{1, 2};
    int runs = 20, warmup = 1, steps = 10, bw_reps = 7;
    std::size_t bw_mib = 512;
    app.add_option("MODEL", model, "compact .flowedge.safetensors (flowedge-make-demo-diffusion writes one) or a LeRobot folder");
    app.add_option("--runs", runs, "timed samples per (dtype, threads)")->check(CLI::Range(1, 100000));
    app.add_option("--warmup", warmup, "untimed samples first")->check(CLI::Range(0, 1000));
    app.add_option("--steps", steps, "DDIM steps")->check(CLI::Range(1, 1000));
    app.add_option("--dtype", dtypes,
                   "weight storage: f32 and/or bf16 (f16 allowed; int8: LoadOptions::quantize = Int8, AVX2 / AVX-512 sets; w8a8: "
                   "quantize = W8A8, AVX2 set or AVX-512 set on an AVX512_VNNI CPU)")
        ->check(CLI::IsMember({"f32", "bf16", "f16", "int8", "w8a8"}));
    app.add_option("--math", maths, "arithmetic (DiffusionHead::set_math): f32 (exact) and/or bf16 (tf32 allowed)")
        ->check(CLI::IsMember({"f32", "bf16", "tf32"}));
    app.add_option("--threads", threads, "OpenMP thread counts to measure")->check(CLI::Range(1, 1024));
    app.add_option("--bw-mib", bw_mib, "buffer for the read-bandwidth measurement (MiB, >> L3)")->check(CLI::Range(64, 8192));
    app.add_option("--bw-reps", bw_reps, "bandwidth repetitions (best taken)")->check(CLI::Range(1, 100));
    app.add_option("--json", json_path, "write the results as JSON to this file");
    CLI11_PARSE(app, argc, argv);

    try {
        nlohmann::json out = {{"bench", "diffusion_cpu"}, {"impl", "flowedge"}, {"model", model}, {"batch", 1},
                              {"scheduler", "ddim"}, {"steps", steps}, {"runs", runs}, {"simd", cpu::kernel_set_name()}};
        // Bandwidth per thread count, measured before any model is loaded (the page cache is then quieter).
        std::vector<double> bw;
        for (int t : threads) {
            bw.push_back(read_bandwidth_gbs(t, bw_mib, bw_reps));
            std::printf("read bandwidth, %d thread%s: %.2f GB/s (best of %d sums over %zu MiB)\n", t, t == 1 ? "" : "s",
                        bw.back(), bw_reps, bw_mib);
            out["read_bandwidth_gbs"][std::to_string(t)] = bw.back();
        }
        // Inputs shared by every row, and the reference action (F32 weights, F32 math, one thread) the rows are compared to.
        std::vector<float> cond, noise, ref;
        const SampleOptions so{.steps = steps, .scheduler = Scheduler::Ddim, .seed = 0};
        auto make_inputs = [&](const DiffusionConfig& c) {
            cond.resize(std::size_t(c.global_cond_dim));
            noise.resize(std::size_t(c.horizon) * c.action_dim);
            for (std::size_t i = 0; i < cond.size(); ++i) cond[i] = 0.5f * std::sin(0.11f * float(i + 1));
            for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = std::sin(0.37f * float(i + 1));
        };
        {
            auto head = DiffusionHead<Cpu>::load(model, LoadOptions{}, 1);
            make_inputs(head.config());
            ref.resize(noise.size());
            set_threads(1);
            head.sample(cond, noise, ref, so, 1);
        }
        for (const std::string& dt : dtypes) {
            LoadOptions opts;
            if (dt == "bf16") opts.weight_dtype = DType::BF16;
            if (dt == "f16") opts.weight_dtype = DType::F16;
            if (dt == "int8") opts.quantize = WeightQuant::Int8;
            if (dt == "w8a8") opts.quantize = WeightQuant::W8A8;
            auto head = DiffusionHead<Cpu>::load(model, opts, 1);
            std::size_t wbytes = 0;
            // Quantised weights: one byte per value (the F32 scales and W8A8 row sums, 0.2% more, not counted).
            head.visit_parameters([&](const std::string&, Parameter<Cpu>& p, const Shape&, Storage) {
                wbytes += p.quant() != WeightQuant::None ? std::size_t(p.numel()) : p.bytes();
            });
            std::vector<float> act(noise.size());
            for (const std::string& math : maths) {
                head.set_math(parse_math_mode(math));
                for (std::size_t ti = 0; ti < threads.size(); ++ti) {
                    const int t = threads[ti];
                    set_threads(t);
                    for (int i = 0; i < warmup; ++i) head.sample(cond, noise, act, so, 1);
                    const std::string load0 = read_loadavg();
                    std::vector<double> ms;
                    for (int r = 0; r < runs; ++r) {
                        const auto t0 = std::chrono::steady_clock::now();
                        head.sample(cond, noise, act, so, 1);
                        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
                    }
                    double max_diff = 0;  // action units (un-normalised), vs F32 weights + F32 math
                    for (std::size_t i = 0; i < act.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(act[i] - ref[i])));
                    const Stats s = summarize(ms);
                    const double floor_ms = double(wbytes) * steps / (bw[ti] * 1e9) * 1e3;
                    std::printf("%-4s weights (%.1f MiB), math %-4s, %d thread%s: min %8.1f  p50 %8.1f  p99 %8.1f  max %8.1f ms | floor %7.1f ms, "
                                "p50/floor %.2f, min/floor %.2f, weights streamed at %.1f GB/s (p50) | max |action - F32| %.3g | load %s\n",
                                dt.c_str(), double(wbytes) / (1 << 20), math.c_str(), t, t == 1 ? " " : "s", s.min, s.p50, s.p99, s.max,
                                floor_ms, s.p50 / floor_ms, s.min / floor_ms, double(wbytes) * steps / (s.p50 * 1e-3) / 1e9, max_diff,
                                load0.c_str());
                    out["results"].push_back({{"weights", dt}, {"math", math}, {"weight_bytes", wbytes}, {"threads", t},
                                              {"ms", {{"min", s.min}, {"p50", s.p50}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}}},
                                              {"all_ms", ms}, {"floor_ms", floor_ms}, {"p50_over_floor", s.p50 / floor_ms},
                                              {"min_over_floor", s.min / floor_ms},
                                              {"weight_gbs_p50", double(wbytes) * steps / (s.p50 * 1e-3) / 1e9},
                                              {"max_abs_action_diff_vs_f32", max_diff},
                                              {"loadavg_before", load0}, {"loadavg_after", read_loadavg()},
                                              {"action_0_2", {act[0], act[1], act[2]}}});
                }
            }
        }
        if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
