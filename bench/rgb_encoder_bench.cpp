// rgb_encoder_bench: LeRobot's DiffusionRgbEncoder (ResNet18 + SpatialSoftmax) on one camera frame on the CPU, for
// the PushT crop (96x96 frame, 84x84 center crop) and a whole 96x96 frame, GroupNorm and BatchNorm backbones, at 1 and
// 2 threads, next to the compute floor (the encoder's FLOPs / this machine's measured FMA peak per core x threads).
// Weights are random (latency does not depend on their values).
// --layers adds the backbone's convolutions one by one (PushT 84x84 crop, BatchNorm folded, each with the bias,
// residual and ReLU the encoder gives it, run in the encoder's order so each sees the cache state it sees there), next
// to two floors per conv: FLOPs over the FMA peak, and bytes (weights + input + output + residual) over this core's
// measured read bandwidth on a buffer the size of the encoder's weights (what one frame streams).
// --layers-size HxW runs them at another input (e.g. 480x640: ACT's backbone, act_bench's case); --layers-only skips
// the encoder rows.
// Usage: rgb_encoder_bench [--iters N] [--threads 1|2|1,2] [--layers] [--layers-size HxW] [--layers-only] [--json FILE]
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

#include <flowedge/models/diffusion/rgb_encoder.hpp>

#include "cpu_floor.hpp"

using namespace flowedge;
using bench::fma_peak_gflops_per_core;
using bench::read_bandwidth_gbs;
using bench::read_loadavg;
using bench::set_threads;
using bench::thread_cpu_ms;

namespace {

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

/// One convolution of the backbone as the BatchNorm encoder runs it: Conv2d with BatchNorm folded, act ReLU or none,
/// with or without the block's residual.
struct ConvCase {
    std::string name;
    int in, out, kernel, stride, pad, h, w;  // input height and width
    bool relu, residual;
};

/// The backbone's convolutions for an input_h x input_w image, in forward() order (downsample before conv1 as there).
std::vector<ConvCase> backbone_convs(int input_h, int input_w) {
    std::vector<ConvCase> v;
    auto out_size = [](int h, int k, int s, int p) { return (h + 2 * p - k) / s + 1; };
    v.push_back({"stem 7x7/2", 3, 64, 7, 2, 3, input_h, input_w, true, false});
    int h = out_size(out_size(input_h, 7, 2, 3), 3, 2, 1), w = out_size(out_size(input_w, 7, 2, 3), 3, 2, 1), in = 64;
    const int widths[4] = {64, 128, 256, 512};
    for (int l = 0; l < 4; ++l) {
        const int out = widths[l];
        for (int j = 0; j < 2; ++j) {
            const int s = (l > 0 && j == 0) ? 2 : 1, cin = j == 0 ? in : out;
            const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(j) + ".";
            if (s != 1 || cin != out) v.push_back({p + "downsample 1x1/2", cin, out, 1, s, 0, h, w, false, false});
            v.push_back({p + "conv1 3x3" + (s == 2 ? "/2" : ""), cin, out, 3, s, 1, h, w, true, false});
            const int ho = out_size(h, 3, s, 1), wo = out_size(w, 3, s, 1);
            v.push_back({p + "conv2 3x3 +res", out, out, 3, 1, 1, ho, wo, true, true});
            h = ho, w = wo;
        }
        in = out;
    }
    return v;
}

/// Per-conv times of the backbone (see the file comment); prints the table and returns its JSON rows.
nlohmann::json run_layers(int iters, double peak, double bw, int input_h, int input_w) {
    const std::vector<ConvCase> cases = backbone_convs(input_h, input_w);
    struct Item {
        Conv2d<Cpu> conv;
        std::vector<float> x, y, res;
        int oh, ow;
        std::vector<double> ms;
    };
    std::vector<Item> items(cases.size());
    io::SafeTensorsWriter wr;
    std::mt19937 rng(2);
    auto fill = [&](std::vector<float>& v, double lo, double hi) {
        std::uniform_real_distribution<double> d(lo, hi);
        for (float& x : v) x = float(d(rng));
    };
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const ConvCase& c = cases[i];
        const std::string k = std::to_string(i) + ".";
        std::vector<float> w(std::size_t(c.out) * c.in * c.kernel * c.kernel), g(std::size_t(c.out)), b(g.size()), m(g.size()), var(g.size());
        const double a = std::sqrt(6.0 / double(c.in * c.kernel * c.kernel));
        fill(w, -a, a), fill(g, 0.5, 1.5), fill(b, -0.1, 0.1), fill(m, -0.1, 0.1), fill(var, 0.5, 2.0);
        wr.add_f32(k + "conv.weight", Shape{c.out, c.in, c.kernel, c.kernel}, w);
        wr.add_f32(k + "bn.weight", Shape{c.out}, g);
        wr.add_f32(k + "bn.bias", Shape{c.out}, b);
        wr.add_f32(k + "bn.running_mean", Shape{c.out}, m);
        wr.add_f32(k + "bn.running_var", Shape{c.out}, var);
    }
    const auto file = io::SafeTensors::from_bytes(wr.bytes(), "random");
    Context<Cpu> ctx;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const ConvCase& c = cases[i];
        Item& it = items[i];
        it.conv = Conv2d<Cpu>({.in = c.in, .out = c.out, .kernel = c.kernel, .stride = c.stride, .pad = c.pad, .bias = false, .batch_norm = true});
        it.conv.load(file, std::to_string(i) + ".conv.", std::to_string(i) + ".bn.", {}, "bench");
        it.oh = it.conv.out_size(c.h), it.ow = it.conv.out_size(c.w);
        it.x.resize(std::size_t(c.in) * c.h * c.w);
        it.y.resize(std::size_t(c.out) * it.oh * it.ow);
        fill(it.x, 0.0, 1.0);
        if (c.residual) it.res.resize(it.y.size()), fill(it.res, 0.0, 1.0);
    }
    auto run_all = [&](bool record) {
        for (std::size_t i = 0; i < cases.size(); ++i) {
            const ConvCase& c = cases[i];
            Item& it = items[i];
            const View<const float, Cpu> xv{it.x.data(), Shape{1, c.in, c.h, c.w}};
            const View<float, Cpu> yv{it.y.data(), Shape{1, c.out, it.oh, it.ow}};
            // Thread CPU time (bench::thread_cpu_ms): 1 thread, so it leaves out other processes' slices on a shared VM.
            const double t0 = thread_cpu_ms();
            it.conv.forward(ctx, xv, yv, c.relu ? Activation::Relu : Activation::None, c.residual ? it.res.data() : nullptr);
            if (record) it.ms.push_back(thread_cpu_ms() - t0);
        }
    };
    set_threads(1);
    for (int w = 0; w < 3; ++w) run_all(false);
    for (int i = 0; i < iters; ++i) run_all(true);
    nlohmann::json rows = nlohmann::json::array();
    double sum_best = 0, sum_p50 = 0, sum_flop = 0, sum_byte = 0, sum_bound = 0;
    std::printf("\nBackbone convs, %dx%d input, BatchNorm folded, 1 thread, thread CPU ms (read bandwidth %.1f GB/s):\n", input_h, input_w, bw);
    std::printf("%-28s %9s %7s %7s %7s %8s %8s %6s %6s\n", "conv", "MFLOP", "MB", "best", "p50", "floorF", "floorB",
                "GF/s", "x bnd");
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const ConvCase& c = cases[i];
        Item& it = items[i];
        const Stats s = stats(it.ms);
        const double flop = 2.0 * double(it.conv.macs(1, c.h, c.w));
        const double bytes = 4.0 * (double(c.out) * c.in * c.kernel * c.kernel + double(it.x.size()) + double(it.y.size()) +
                                    double(it.res.size()));
        const double floor_f = flop / (peak * 1e9) * 1e3, floor_b = bytes / (bw * 1e9) * 1e3, bound = std::max(floor_f, floor_b);
        sum_best += s.min, sum_p50 += s.p50, sum_flop += floor_f, sum_byte += floor_b, sum_bound += bound;
        std::printf("%-28s %9.2f %7.2f %7.3f %7.3f %8.3f %8.3f %6.1f %6.2f\n", c.name.c_str(), flop / 1e6, bytes / 1e6, s.min,
                    s.p50, floor_f, floor_b, flop / (s.min * 1e6), s.min / bound);
        rows.push_back({{"conv", c.name}, {"mflop", flop / 1e6}, {"mbytes", bytes / 1e6}, {"ms_best", s.min}, {"ms_p50", s.p50},
                        {"floor_flop_ms", floor_f}, {"floor_bytes_ms", floor_b}, {"gflops_best", flop / (s.min * 1e6)}});
    }
    std::printf("%-28s %9s %7s %7.3f %7.3f %8.3f %8.3f %6s %6.2f\n", "sum", "", "", sum_best, sum_p50, sum_flop, sum_byte, "",
                sum_best / sum_bound);
    return rows;
}

}  // namespace

int main(int argc, char** argv) {
    int iters = 50;
    std::string json_path;
    std::vector<int> thread_counts{1, 2};
    bool layers = false, layers_only = false;
    int layers_h = 84, layers_w = 84;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
        else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!std::strcmp(argv[i], "--layers")) layers = true;
        else if (!std::strcmp(argv[i], "--layers-only")) layers = layers_only = true;
        else if (!std::strcmp(argv[i], "--layers-size") && i + 1 < argc && std::sscanf(argv[i + 1], "%dx%d", &layers_h, &layers_w) == 2) layers = true, ++i;
        else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
            const std::string t = argv[++i];
            thread_counts.clear();
            for (std::size_t a = 0; a < t.size();) {
                const std::size_t b = std::min(t.find(',', a), t.size());
                thread_counts.push_back(std::max(1, std::atoi(t.substr(a, b - a).c_str())));
                a = b + 1;
            }
        } else {
            std::fprintf(stderr, "usage: %s [--iters N] [--threads 1|2|1,2] [--layers] [--layers-size HxW] [--layers-only] [--json FILE]\n", argv[0]);
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
        if (layers_only) break;
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
            for (int t : thread_counts) {
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
                std::printf("%-32s %s, %d thread%s: min %7.2f  p50 %7.2f  p99 %7.2f  max %7.2f ms | %.3f GFLOP, floor %.2f ms, "
                            "p50 at %.0f%% of peak\n",
                            cs.name, gn ? "GroupNorm" : "BatchNorm", t, t == 1 ? " " : "s", s.min, s.p50, s.p99, s.max, flops / 1e9,
                            floor_ms, 100.0 * floor_ms / s.p50);
                out["rows"].push_back({{"case", cs.name}, {"input", std::to_string(c.input_h()) + "x" + std::to_string(c.input_w())},
                                       {"norm", gn ? "group_norm" : "batch_norm"}, {"threads", t}, {"gflop", flops / 1e9},
                                       {"floor_ms", floor_ms}, {"workspace_bytes", enc.workspace_bytes(1)},
                                       {"ms", {{"min", s.min}, {"p50", s.p50}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}}}});
            }
        }
    }
    if (layers) {
        // A buffer the size of the encoder's F32 weights (44.7 MB): what one frame reads.
        const double bw = read_bandwidth_gbs(std::size_t(45) << 20);
        out["read_bandwidth_gbs"] = bw;
        out["layers_input"] = std::to_string(layers_h) + "x" + std::to_string(layers_w);
        out["layers"] = run_layers(iters, peak, bw, layers_h, layers_w);
    }
    out["loadavg_after"] = read_loadavg();
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    return 0;
}
