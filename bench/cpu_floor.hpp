// The CPU floors the benches print next to their latencies: this machine's FP32 FMA peak per core and one core's read
// bandwidth, both measured, plus the thread count and load average the numbers were taken under.
#pragma once
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace flowedge::bench {

/// CPU time of the calling thread in milliseconds. On a shared machine a single-threaded run's CPU time leaves out
/// the slices the OS gave other processes (the wall time is the latency a user sees; this is what the code costs).
inline double thread_cpu_ms() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) * 1e3 + double(t.tv_nsec) * 1e-6;
}

/// OpenMP threads of the kernels from now on (no-op without OpenMP).
inline void set_threads(int t) {
#ifdef _OPENMP
    omp_set_num_threads(t);
#else
    (void)t;
#endif
}

/// /proc/loadavg's 1, 5 and 15 minute averages ("" off Linux): how busy the machine was around a measurement.
inline std::string read_loadavg() {
    std::ifstream f("/proc/loadavg");
    std::string a, b, c;
    f >> a >> b >> c;
    return a + " " + b + " " + c;
}

/// The probe off x86: 12 independent 16-lane accumulators, best of many short runs.
inline double portable_fma_peak_gflops() {
    typedef float v16 __attribute__((vector_size(64)));
    constexpr int kAcc = 12;
    constexpr long kIters = 200'000;
    double best = 0;
    for (int rep = 0; rep < 300; ++rep) {
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

/// FP32 FMA throughput of one core in GFLOP/s (2 per multiply-add). On x86: 12 independent vfmadd231ps chains written
/// in assembly (ymm and zmm, the better of the two), best of many short runs; assembly because the compiler's version
/// of the same loop kept the chains in memory on a Zen 4 VM and read a quarter of the peak. Elsewhere: 12 independent
/// 16-lane vector-extension accumulators.
inline double fma_peak_gflops_per_core() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    auto run = [](auto body, int lanes) {
        double best = 0;
        for (int rep = 0; rep < 60; ++rep) {
            constexpr long kIters = 400'000;
            const auto t0 = std::chrono::steady_clock::now();
            for (long i = 0; i < kIters; ++i) body();
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            best = std::max(best, double(kIters) * 12 * lanes * 2 / s / 1e9);
        }
        return best;
    };
#define FE_FMA12(R)                                                                                                   \
    asm volatile("vfmadd231ps %%" R "14, %%" R "15, %%" R "0\n\tvfmadd231ps %%" R "14, %%" R "15, %%" R "1\n\t"       \
                 "vfmadd231ps %%" R "14, %%" R "15, %%" R "2\n\tvfmadd231ps %%" R "14, %%" R "15, %%" R "3\n\t"       \
                 "vfmadd231ps %%" R "14, %%" R "15, %%" R "4\n\tvfmadd231ps %%" R "14, %%" R "15, %%" R "5\n\t"       \
                 "vfmadd231ps %%" R "14, %%" R "15, %%" R "6\n\tvfmadd231ps %%" R "14, %%" R "15, %%" R "7\n\t"       \
                 "vfmadd231ps %%" R "14, %%" R "15, %%" R "8\n\tvfmadd231ps %%" R "14, %%" R "15, %%" R "9\n\t"       \
                 "vfmadd231ps %%" R "14, %%" R "15, %%" R "10\n\tvfmadd231ps %%" R "14, %%" R "15, %%" R "11\n\t" ::: \
                     "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11")
    double best = run([] { FE_FMA12("ymm"); }, 8);
    if (__builtin_cpu_supports("avx512f")) best = std::max(best, run([] { FE_FMA12("zmm"); }, 16));
#undef FE_FMA12
    return best;
#else
    return portable_fma_peak_gflops();
#endif
}

/// Read bandwidth of one core in GB/s over `bytes` (re-read whole, 256 bytes of loads in flight per step), best of a
/// few passes after a warm one. The vectors are the widest the build has: wider ones would be lowered through the
/// stack, and the probe would time those spills instead of the reads.
inline double read_bandwidth_gbs(std::size_t bytes) {
#if defined(__AVX512F__)
    constexpr std::size_t kVecBytes = 64;
#elif defined(__AVX__)
    constexpr std::size_t kVecBytes = 32;
#else
    constexpr std::size_t kVecBytes = 16;
#endif
    typedef float vec __attribute__((vector_size(kVecBytes)));
    constexpr std::size_t kAcc = 256 / kVecBytes;
    const std::size_t n = bytes / sizeof(vec) / kAcc * kAcc;
    std::vector<vec> buf(n);
    for (std::size_t i = 0; i < n; ++i) buf[i] = vec{} + float(i & 7);
    double best = 0;
    for (int rep = 0; rep < 6; ++rep) {
        vec acc[kAcc] = {};
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < n; i += kAcc)
            for (std::size_t k = 0; k < kAcc; ++k) acc[k] += buf[i + k];
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        vec t{};
        for (std::size_t k = 0; k < kAcc; ++k) t += acc[k];
        asm volatile("" ::"m"(t));  // keeps the sums
        if (rep > 0) best = std::max(best, double(n * sizeof(vec)) / s / 1e9);
    }
    return best;
}

}  // namespace flowedge::bench
