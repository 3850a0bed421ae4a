// How the CPU kernels share work and scratch: the OpenMP thread helpers, the fork threshold, the per-call stack
// scratch size, shared by every kernel set.
#pragma once
#include <cstddef>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace flowedge::cpu {

/// Floats of stack scratch one conv call may use (256 KiB).
inline constexpr std::size_t kScratchFloats = 64 * 1024;
/// Multiply-adds below which a call stays on the calling thread and never enters an OpenMP region (a fork
/// and join costs microseconds; 2^22 MACs is about 0.1 ms of one core, so every Mamba/flow-head op stays serial).
inline constexpr double kParallelMacs = double(1 << 22);

/// This thread's index and the team size inside an (optional) OpenMP parallel region.
inline int thread_index() {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
inline int thread_count() {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

constexpr std::size_t round_up16(std::size_t n) { return (n + 15) / 16 * 16; }
constexpr std::size_t round_up32(std::size_t n) { return (n + 31) / 32 * 32; }

}  // namespace flowedge::cpu
