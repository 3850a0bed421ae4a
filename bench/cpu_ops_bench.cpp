// Micro-benchmarks of the weight-streaming CPU convs at the PushT U-Net shapes, reported in GB/s of weights
// next to this machine's measured read bandwidth (batch-1 convs are memory-bound: that ratio is the score), with the
// exact (F32) and the opt-in BF16 arithmetic (MathMode::BF16, vdpbf16ps), plus the Mamba/flow batch-1 linears and the
// ResNet18 image encoder's conv2d sequence at an 84x84 crop (compute-bound: reported in GFLOP/s).
#define CATCH_CONFIG_MAIN
#define CATCH_CONFIG_ENABLE_BENCHMARKING
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "flowedge/cpu/memory.hpp"
#include "flowedge/ops.hpp"

using namespace flowedge;

namespace {

struct Timing { double median, best; };

template <class F>
Timing time_runs(F&& f, int reps) {
    std::vector<double> t(static_cast<std::size_t>(reps));
    for (auto& s : t) {
        const auto a = std::chrono::steady_clock::now();
        f();
        s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    }
    std::sort(t.begin(), t.end());
    return {t[t.size() / 2], t[0]};
}

/// Read bandwidth of this machine: sum of a 512 MiB array with every core (what streaming weights can reach).
double read_bandwidth_gbs() {
    static double bw = [] {
        const std::size_t n = std::size_t(128) << 20;
        std::vector<float> a(n, 1.f);
        volatile float sink = 0;
        const double s = time_runs([&] {
            float total = 0;
            // Each thread reads its contiguous share once (cpu::stream_sum: full vector width, 4 chains).
#pragma omp parallel reduction(+ : total)
            {
                const int tid = cpu::thread_index(), nth = cpu::thread_count();
                const std::int64_t lo = std::int64_t(n) * tid / nth, hi = std::int64_t(n) * (tid + 1) / nth;
                total += cpu::stream_sum(a.data() + lo, hi - lo);
            }
            sink = total;
        }, 7).best;
        (void)sink;
        return double(n) * sizeof(float) / s / 1e9;
    }();
    return bw;
}

struct ConvShape { int channels, length; };

const char* math_name(MathMode m) { return m == MathMode::BF16 ? "bf16" : m == MathMode::TF32 ? "tf32" : "f32"; }

void bench_conv(const ConvShape& sh, DType dt, MathMode math) {
    const int C = sh.channels, L = sh.length, K = 5;
    const std::size_t nw = std::size_t(C) * C * K, wbytes = nw * dtype_size(dt);
    // Enough weight copies to exceed the L3 cache, as in a real denoising step (251M weights stream through).
    const int copies = int(std::max<std::size_t>(1, (std::size_t(160) << 20) / wbytes));
    std::vector<std::vector<std::uint8_t>> w(static_cast<std::size_t>(copies), std::vector<std::uint8_t>(wbytes));
    for (auto& c : w)
        for (std::size_t i = 0; i < wbytes; i += 2) c[i + 1] = 0x3c;  // small finite values in every dtype
    // The layout the models give Conv1d weights in this process's kernel set (Ops<Cpu>::prepare_weight: packed
    // blocks on the AVX2 set, row-major elsewhere).
    std::vector<std::unique_ptr<PreparedWeight>> prepared;
    for (auto& c : w)
        prepared.push_back(Ops<Cpu>::prepare_weight(Storage::ConvWeight, {c.data(), dt, nullptr}, Shape{C, C, K}, "bench conv1d weight"));
    const bool packed = prepared.front() != nullptr;
    std::vector<float> x(std::size_t(C) * L, 0.5f), y(std::size_t(C) * L), bias(std::size_t(C), 0.f);
    Conv1dParams p;
    p.x = x.data(); p.bias = bias.data(); p.y = y.data();
    p.in_channels = C; p.out_channels = C; p.in_length = L; p.out_length = L; p.kernel = K; p.pad = 2;
    p.math = math;
    int next = 0;
    auto call = [&] {
        p.w = {w[std::size_t(next)].data(), dt, prepared[std::size_t(next)].get()};
        next = (next + 1) % copies;
        Ops<Cpu>::conv1d(p);
    };
    for (int i = 0; i < copies; ++i) call();
    const Timing tm = time_runs(call, 31);
    const double gbs = double(wbytes) / tm.median / 1e9, best = double(wbytes) / tm.best / 1e9, bw = read_bandwidth_gbs();
    const double macs = double(nw) * L;
    std::printf("conv1d %4d->%4d k5 L%-2d %-4s math %-4s%s: median %7.3f ms = %6.2f GB/s of weights (%3.0f%% of %.2f GB/s read bw), "
                "%5.1f G MAC/s; best %7.3f ms = %6.2f GB/s\n",
                C, C, L, std::string(dtype_name(dt)).c_str(), math_name(math), packed ? " packed" : "", tm.median * 1e3, gbs, 100 * gbs / bw, bw,
                macs / tm.median / 1e9, tm.best * 1e3, best);
    BENCHMARK(std::string("conv1d ") + std::to_string(C) + " L" + std::to_string(L) + " " + std::string(dtype_name(dt)) +
              " math " + math_name(math)) {
        call();
        return y[0];
    };
}

/// One linear (weights in L2, as in the policy's decode loop): best and median of 2001 calls, in microseconds.
void bench_linear(int rows, int in, int out, DType dt, MathMode math) {
    const std::size_t nw = std::size_t(in) * out;
    std::vector<std::uint8_t> w(nw * dtype_size(dt));
    for (std::size_t i = 0; i < w.size(); i += 2) w[i + 1] = 0x3c;
    std::vector<float> x(std::size_t(rows) * in, 0.5f), y(std::size_t(rows) * out), bias(std::size_t(out), 0.f);
    LinearParams p;
    p.x = x.data(); p.w = {w.data(), dt}; p.bias = bias.data(); p.y = y.data();
    p.rows = rows; p.in = in; p.out = out; p.math = math;
    for (int i = 0; i < 200; ++i) Ops<Cpu>::linear(p);
    const Timing tm = time_runs([&] { Ops<Cpu>::linear(p); }, 2001);
    std::printf("linear %d x %4d -> %4d %-4s math %-4s: best %6.2f us, median %6.2f us\n", rows, in, out,
                std::string(dtype_name(dt)).c_str(), math_name(math), tm.best * 1e6, tm.median * 1e6);
}

/// One conv of the ResNet18 encoder: in -> out channels, kernel, stride, input side (square), residual + ReLU or not.
struct ResNetConv { const char* name; int cin, cout, k, stride, side; bool residual; bool relu; };

/// The conv2d sequence of LeRobot's ResNet18 backbone (BatchNorm folded into the conv bias) at an 84x84 crop, batch 1,
/// plus the SpatialSoftmax keypoint conv; each layer with its own weights (44 MB at F32: more than the L3 cache,
/// as in a real forward pass). Prints each layer's median ms and GFLOP/s over `reps` forward passes and the total.
void bench_resnet18(DType dt, int reps) {
    const ResNetConv layers[] = {
        {"conv1 7x7/2", 3, 64, 7, 2, 84, false, true},
        {"l1.0a", 64, 64, 3, 1, 21, false, true},  {"l1.0b", 64, 64, 3, 1, 21, true, true},
        {"l1.1a", 64, 64, 3, 1, 21, false, true},  {"l1.1b", 64, 64, 3, 1, 21, true, true},
        {"l2.0a /2", 64, 128, 3, 2, 21, false, true}, {"l2.0 ds 1x1/2", 64, 128, 1, 2, 21, false, false},
        {"l2.0b", 128, 128, 3, 1, 11, true, true}, {"l2.1a", 128, 128, 3, 1, 11, false, true}, {"l2.1b", 128, 128, 3, 1, 11, true, true},
        {"l3.0a /2", 128, 256, 3, 2, 11, false, true}, {"l3.0 ds 1x1/2", 128, 256, 1, 2, 11, false, false},
        {"l3.0b", 256, 256, 3, 1, 6, true, true}, {"l3.1a", 256, 256, 3, 1, 6, false, true}, {"l3.1b", 256, 256, 3, 1, 6, true, true},
        {"l4.0a /2", 256, 512, 3, 2, 6, false, true}, {"l4.0 ds 1x1/2", 256, 512, 1, 2, 6, false, false},
        {"l4.0b", 512, 512, 3, 1, 3, true, true}, {"l4.1a", 512, 512, 3, 1, 3, false, true}, {"l4.1b", 512, 512, 3, 1, 3, true, true},
        {"keypoints 1x1", 512, 32, 1, 1, 3, false, false},
    };
    constexpr int kLayers = int(std::size(layers));
    std::vector<std::vector<std::uint8_t>> w;
    std::vector<Conv2dParams> ps;
    std::vector<std::vector<float>> bufs;
    std::vector<float> bias(512, 0.01f);
    double total_flops = 0;
    for (const auto& l : layers) {
        const std::size_t nw = std::size_t(l.cout) * l.cin * l.k * l.k;
        w.emplace_back(nw * dtype_size(dt));
        for (std::size_t i = 0; i < w.back().size(); i += 2) w.back()[i + 1] = 0x3c;
        const int pad = l.k / 2, out = (l.side + 2 * pad - l.k) / l.stride + 1;
        bufs.emplace_back(std::size_t(l.cin) * l.side * l.side, 0.5f);    // x
        bufs.emplace_back(std::size_t(l.cout) * out * out, 0.f);           // y
        bufs.emplace_back(l.residual ? std::size_t(l.cout) * out * out : 1, 0.25f);
        Conv2dParams p;
        p.batch = 1; p.in_channels = l.cin; p.out_channels = l.cout; p.in_h = p.in_w = l.side; p.out_h = p.out_w = out;
        p.kernel_h = p.kernel_w = l.k; p.stride_h = p.stride_w = l.stride; p.pad_h = p.pad_w = pad;
        p.act = l.relu ? Activation::Relu : Activation::None;
        ps.push_back(p);
        total_flops += 2.0 * nw * out * out;
    }
    for (int i = 0; i < kLayers; ++i) {
        ps[std::size_t(i)].x = bufs[std::size_t(3 * i)].data();
        ps[std::size_t(i)].y = bufs[std::size_t(3 * i + 1)].data();
        ps[std::size_t(i)].residual = layers[i].residual ? bufs[std::size_t(3 * i + 2)].data() : nullptr;
        ps[std::size_t(i)].bias = bias.data();
        ps[std::size_t(i)].w = {w[std::size_t(i)].data(), dt};
    }
    std::vector<std::vector<double>> t(static_cast<std::size_t>(kLayers), std::vector<double>(static_cast<std::size_t>(reps)));
    std::vector<double> tot(static_cast<std::size_t>(reps));
    for (int r = -3; r < reps; ++r) {
        const auto a = std::chrono::steady_clock::now();
        for (int i = 0; i < kLayers; ++i) {
            const auto s = std::chrono::steady_clock::now();
            Ops<Cpu>::conv2d(ps[std::size_t(i)]);
            if (r >= 0) t[std::size_t(i)][std::size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
        }
        if (r >= 0) tot[std::size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    auto best = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    std::printf("ResNet18 conv2d sequence, 84x84 crop, batch 1, %s weights, %d thread(s), %d passes:\n",
                std::string(dtype_name(dt)).c_str(), threads, reps);
    double sum_medians = 0;
    for (int i = 0; i < kLayers; ++i) {
        const auto& l = layers[i];
        const int pad = l.k / 2, out = (l.side + 2 * pad - l.k) / l.stride + 1;
        const double flops = 2.0 * l.cout * l.cin * l.k * l.k * out * out, m = median(t[std::size_t(i)]);
        sum_medians += m;
        std::printf("  %-14s %3d->%3d %dx%d %2dx%-2d -> %2dx%-2d %7.1f MFLOP: median %7.3f ms  %6.1f GFLOP/s\n", l.name, l.cin,
                    l.cout, l.k, l.k, l.side, l.side, out, out, flops / 1e6, m * 1e3, flops / m / 1e9);
    }
    const double m = median(tot), b = best(tot);
    // On a shared machine a pass that loses its core inflates the whole-pass median; the sum of the per-layer
    // medians is the steadier figure.
    std::printf("  total %.1f MFLOP: sum of layer medians %.3f ms = %.1f GFLOP/s; whole pass median %.3f ms, best %.3f ms\n",
                total_flops / 1e6, sum_medians * 1e3, total_flops / sum_medians / 1e9, m * 1e3, b * 1e3);
}

}  // namespace

TEST_CASE("ResNet18 encoder conv2d sequence at an 84x84 crop (OMP_NUM_THREADS picks the threads)") {
    bench_resnet18(DType::F32, 30);
    bench_resnet18(DType::BF16, 30);
}

TEST_CASE("machine read bandwidth") {
    std::printf("read bandwidth (best of 7 sums of 512 MiB, all threads): %.2f GB/s\n", read_bandwidth_gbs());
    CHECK(read_bandwidth_gbs() > 0);
}

TEST_CASE("conv1d weight streaming at the PushT U-Net shapes") {
    for (ConvShape sh : {ConvShape{2048, 4}, ConvShape{1024, 8}, ConvShape{512, 16}})
        for (DType dt : {DType::F32, DType::BF16, DType::F16}) bench_conv(sh, dt, MathMode::F32);
}

TEST_CASE("conv1d at the PushT U-Net shapes with MathMode::BF16 (vdpbf16ps where built for AVX512_BF16)") {
    for (ConvShape sh : {ConvShape{2048, 4}, ConvShape{1024, 8}, ConvShape{512, 16}})
        for (DType dt : {DType::F32, DType::BF16}) bench_conv(sh, dt, MathMode::BF16);
}

TEST_CASE("batch-1 linears of the Mamba/flow policy, exact and BF16 math") {
    struct Shape { int rows, in, out; };
    for (Shape sh : {Shape{1, 256, 256}, Shape{1, 128, 512}, Shape{1, 256, 128}, Shape{1, 256, 40}, Shape{4, 128, 512}})
        for (DType dt : {DType::F32, DType::BF16})
            for (MathMode m : {MathMode::F32, MathMode::BF16}) bench_linear(sh.rows, sh.in, sh.out, dt, m);
}
