// Micro-benchmarks of the weight-streaming CPU convs at the PushT U-Net shapes, reported in GB/s of weights
// next to this machine's measured read bandwidth (batch-1 convs are memory-bound: that ratio is the score).
#define CATCH_CONFIG_MAIN
#define CATCH_CONFIG_ENABLE_BENCHMARKING
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

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
            const std::int64_t blocks = std::int64_t(n) / (4 * cpu::kLanes);
#pragma omp parallel reduction(+ : total)
            {
                cpu::VecF acc[4] = {cpu::vzero(), cpu::vzero(), cpu::vzero(), cpu::vzero()};
#pragma omp for schedule(static)
                for (std::int64_t b = 0; b < blocks; ++b) {
                    const float* q = a.data() + std::size_t(b) * 4 * cpu::kLanes;
                    for (int u = 0; u < 4; ++u) acc[u] = cpu::vadd(acc[u], cpu::vload(q + u * cpu::kLanes));
                }
                total += cpu::vsum(cpu::vadd(cpu::vadd(acc[0], acc[1]), cpu::vadd(acc[2], acc[3])));
            }
            sink = total;
        }, 7).best;
        (void)sink;
        return double(n) * sizeof(float) / s / 1e9;
    }();
    return bw;
}

struct ConvShape { int channels, length; };

void bench_conv(const ConvShape& sh, DType dt) {
    const int C = sh.channels, L = sh.length, K = 5;
    const std::size_t nw = std::size_t(C) * C * K, wbytes = nw * dtype_size(dt);
    // Enough weight copies to exceed the L3 cache, as in a real denoising step (251M weights stream through).
    const int copies = int(std::max<std::size_t>(1, (std::size_t(160) << 20) / wbytes));
    std::vector<std::vector<std::uint8_t>> w(static_cast<std::size_t>(copies), std::vector<std::uint8_t>(wbytes));
    for (auto& c : w)
        for (std::size_t i = 0; i < wbytes; i += 2) c[i + 1] = 0x3c;  // small finite values in every dtype
    std::vector<float> x(std::size_t(C) * L, 0.5f), y(std::size_t(C) * L), bias(std::size_t(C), 0.f);
    Conv1dParams p;
    p.x = x.data(); p.bias = bias.data(); p.y = y.data();
    p.in_channels = C; p.out_channels = C; p.in_length = L; p.out_length = L; p.kernel = K; p.pad = 2;
    int next = 0;
    auto call = [&] {
        p.w = {w[std::size_t(next)].data(), dt};
        next = (next + 1) % copies;
        Ops<Cpu>::conv1d(p);
    };
    for (int i = 0; i < copies; ++i) call();
    const Timing tm = time_runs(call, 31);
    const double gbs = double(wbytes) / tm.median / 1e9, best = double(wbytes) / tm.best / 1e9, bw = read_bandwidth_gbs();
    std::printf("conv1d %4d->%4d k5 L%-2d %-4s: median %7.3f ms = %6.2f GB/s of weights (%3.0f%% of %.2f GB/s read bw); "
                "best %6.2f GB/s\n",
                C, C, L, std::string(dtype_name(dt)).c_str(), tm.median * 1e3, gbs, 100 * gbs / bw, bw, best);
    BENCHMARK(std::string("conv1d ") + std::to_string(C) + " L" + std::to_string(L) + " " + std::string(dtype_name(dt))) {
        call();
        return y[0];
    };
}

}  // namespace

TEST_CASE("machine read bandwidth") {
    std::printf("read bandwidth (best of 7 sums of 512 MiB, all threads): %.2f GB/s\n", read_bandwidth_gbs());
    CHECK(read_bandwidth_gbs() > 0);
}

TEST_CASE("conv1d weight streaming at the PushT U-Net shapes") {
    for (ConvShape sh : {ConvShape{2048, 4}, ConvShape{1024, 8}, ConvShape{512, 16}})
        for (DType dt : {DType::F32, DType::BF16, DType::F16}) bench_conv(sh, dt);
}
