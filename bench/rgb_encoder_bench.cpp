// rgb_encoder_bench: LeRobot's DiffusionRgbEncoder (ResNet18 + SpatialSoftmax) on one camera frame on the CPU, for
// the PushT crop (96x96 frame, 84x84 center crop) and a whole 96x96 frame, GroupNorm and BatchNorm backbones, at 1 and
// 2 threads, next to the compute floor (the encoder's FLOPs / this machine's measured FMA peak per core x threads).
// Weights are random (latency does not depend on their values). Usage: rgb_encoder_bench [--iters N] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <flowedge/models/diffusion/rgb_encoder.hpp>

using namespace flowedge;

namespace {

void set_threads(int t) {
#ifdef _OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

std::string read_loadavg() {
    std::ifstream f("/proc/loadavg");
    std::string a, b, c;
    f >> a >> b >> c;
    return a + " " + b + " " + c;
}

/// FP32 FMA throughput of one core in GFLOP/s: 12 independent 16-lane accumulators (the compiler's widest vectors
/// under -march=native), best of a few runs.
double fma_peak_gflops_per_core() {
    typedef float v16 __attribute__((vector_size(64)));
    constexpr int kAcc = 12;
    constexpr long kIters = 20'000'000;
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        v16 acc[kAcc];
        for (int i = 0; i < kAcc; ++i) acc[i] = v16{} + float(i) * 1e-3f;
        v16 a = v16{} + 0.999999f, b = v16{} + 1e-7f;
        const auto t0 = std::chrono::steady_clock::now();
        for (long it = 0; it < kIters; ++it) {
            for (int i = 0; i < kAcc; ++i) acc[i] = acc[i] * a + b;
            asm volatile("" : "+x"(a));
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        float sink = 0;
        for (int i = 0; i < kAcc; ++i) sink += acc[i][0];
        asm volatile("" ::"x"(sink));
        best = std::max(best, double(kIters) * kAcc * 16 * 2 / s / 1e9);
    }
    return best;
}

/// An in-memory checkpoint with random values under the encoder's own names (BatchNorm variances positive).
std::shared_ptr<const io::SafeTensors> random_weights(DiffusionRgbEncoder<Cpu>& enc) {
    io::SafeTensorsWriter w;
    std::mt19937 rng(1);
    enc.visit_parameters([&](const std::string& name, Parameter<Cpu>&, const Shape& shape, Storage) {
        std::vector<float> v(std::size_t(shape.numel()));
        const bool var = name.find("running_var") != std::string::npos;
        const double a = shape.rank == 4 ? std::sqrt(6.0 / double(shape[1] * shape[2] * shape[3])) : 0.3;
        std::uniform_real_distribution<double> d(var ? 0.5 : -a, var ? 2.0 : a);
        for (float& x : v) x = float(d(rng));
        w.add_f32(name, shape, v);
    });
    return io::SafeTensors::from_bytes(w.bytes(), "random");
}

struct Stats {
    double min = 0, p50 = 0, p99 = 0, max = 0, mean = 0;
};
Stats stats(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    Stats s;
    s.min = v.front();
    s.max = v.back();
    s.p50 = v[v.size() / 2];
    s.p99 = v[std::min(v.size() - 1, std::size_t(std::ceil(double(v.size()) * 0.99)) - 1)];
    for (double x : v) s.mean += x / double(v.size());
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    int iters = 50;
    std::string json_path;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else {
            std::fprintf(stderr, "usage: %s [--iters N] [--json FILE]\n", argv[0]);
            return 2;
        }
    }
    set_threads(1);
    const double peak = fma_peak_gflops_per_core();
    std::printf("CPU kernel set %s, FP32 FMA peak %.1f GFLOP/s per core, load average %s\n",
                std::string(cpu::isa_name(cpu::active_isa())).c_str(), peak, read_loadavg().c_str());
    nlohmann::json out = {{"bench", "rgb_encoder_cpu"}, {"frames", 1}, {"iters", iters}, {"isa", std::string(cpu::isa_name(cpu::active_isa()))},
                          {"fma_peak_gflops_per_core", peak}, {"loadavg_before", read_loadavg()}, {"rows", nlohmann::json::array()}};

    struct Case {
        const char* name;
        int crop;
    };
    for (const Case cs : {Case{"96x96 frame, 84x84 crop (PushT)", 84}, Case{"96x96 frame, no crop", 0}}) {
        for (bool gn : {true, false}) {
            const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 96, .image_w = 96, .crop_h = cs.crop, .crop_w = cs.crop,
                                              .group_norm = gn, .keypoints = 32};
            DiffusionRgbEncoder<Cpu> enc(c);
            enc.load(random_weights(enc), "", {});
            Workspace<Cpu> ws(enc.workspace_bytes(1));
            Context<Cpu> ctx;
            ctx.workspace = &ws;
            std::vector<std::uint8_t> frame(96 * 96 * 3);
            for (std::size_t i = 0; i < frame.size(); ++i) frame[i] = std::uint8_t((i * 37) % 251);
            std::vector<float> features(std::size_t(enc.feature_dim()));
            const View<float, Cpu> fv{features.data(), Shape{1, enc.feature_dim()}};
            const double flops = 2.0 * double(enc.macs(1));
            for (int t : {1, 2}) {
                set_threads(t);
                for (int w = 0; w < 3; ++w) enc.forward(ctx, frame.data(), ImageLayout::U8Hwc, 1, fv);
                std::vector<double> ms;
                for (int i = 0; i < iters; ++i) {
                    const auto t0 = std::chrono::steady_clock::now();
                    enc.forward(ctx, frame.data(), ImageLayout::U8Hwc, 1, fv);
                    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
                }
                const Stats s = stats(ms);
                const double floor_ms = flops / (peak * 1e9 * t) * 1e3;
                std::printf("%-32s %s, %d thread%s: p50 %7.2f  p99 %7.2f  max %7.2f ms | %.3f GFLOP, floor %.2f ms, p50 at %.0f%% of peak\n",
                            cs.name, gn ? "GroupNorm" : "BatchNorm", t, t == 1 ? " " : "s", s.p50, s.p99, s.max, flops / 1e9, floor_ms,
                            100.0 * floor_ms / s.p50);
                out["rows"].push_back({{"case", cs.name}, {"input", std::to_string(c.input_h()) + "x" + std::to_string(c.input_w())},
                                       {"norm", gn ? "group_norm" : "batch_norm"}, {"threads", t}, {"gflop", flops / 1e9},
                                       {"floor_ms", floor_ms}, {"workspace_bytes", enc.workspace_bytes(1)},
                                       {"ms", {{"min", s.min}, {"p50", s.p50}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}}}});
            }
        }
    }
    out["loadavg_after"] = read_loadavg();
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    return 0;
}
