// Micro-benchmarks of the weight-streaming CPU convs at the PushT U-Net shapes, reported in GB/s of weights
// next to this machine's measured read bandwidth (batch-1 convs are memory-bound: that ratio is the score), with the
// exact (F32) and the opt-in BF16 arithmetic (MathMode::BF16, vdpbf16ps), plus the Mamba/flow batch-1 linears.
#define CATCH_CONFIG_MAIN
#define CATCH_CONFIG_ENABLE_BENCHMARKING
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
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

}  // namespace

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
