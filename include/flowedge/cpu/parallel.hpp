// How the CPU kernels share work and scratch: the OpenMP thread helpers, the fork threshold, the per-call stack
// scratch size, shared by every kernel set.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

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

/// The pass loop of the packed conv kernels that share one im2col panel per pass, run by every thread of their
/// parallel region: passes of up to `ns` of the N columns; per pass each thread fills its columns [c0, c1) of the
/// panel (an even split of nn: fill(n0, nn, c0, c1)), one barrier, then runs its output units [u0, u1) (an even split
/// of `units`: run(n0, nn, u0, u1)). The barrier before the next fill keeps the panel until every thread is done.
template <class Fill, class Run>
inline void panel_passes(int N, int ns, int units, Fill&& fill, Run&& run) {
    const int tid = thread_index(), nth = thread_count();
    const int u0 = int(std::int64_t(units) * tid / nth), u1 = int(std::int64_t(units) * (tid + 1) / nth);
    for (int n0 = 0; n0 < N; n0 += ns) {
        const int nn = std::min(ns, N - n0);
        if (n0 > 0) {
#pragma omp barrier
        }
        fill(n0, nn, nn * tid / nth, nn * (tid + 1) / nth);
#pragma omp barrier
        run(n0, nn, u0, u1);
    }
}

constexpr std::size_t round_up16(std::size_t n) { return (n + 15) / 16 * 16; }
constexpr std::size_t round_up32(std::size_t n) { return (n + 31) / 32 * 32; }

}  // namespace flowedge::cpu
