// The load-time check that a model's batch fits in its backend's memory: the batch-sized buffers are counted before
// any of them is allocated, so a batch too large for the card is a clear error naming the batch that would fit,
// not a cudaMalloc failure in the middle of a load (or, on the CPU, the OOM killer later).
#pragma once
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

#include "flowedge/error.hpp"
#include "flowedge/tensor.hpp"

namespace flowedge {

namespace detail {
inline std::string mib(std::size_t bytes) {
    const double m = double(bytes) / 1048576.0;
    char buf[32];
    std::snprintf(buf, sizeof buf, m < 10 ? "%.2f MiB" : "%.0f MiB", m);
    return buf;
}
}  // namespace detail

/// Throws (ErrorKind OutOfMemory on the CPU, DeviceOutOfMemory on CUDA) when `bytes_for(batch)`, the bytes
/// `component` is about to allocate for `batch` (a non-decreasing function of the batch), exceeds what Memory<B>
/// can take now (the device's free memory; the host's physical memory or cgroup limit). The message gives the need,
/// what is available and the largest batch that fits. Unknown available memory (a host without sysconf) passes.
template <Backend B, class BytesFor>
void check_batch_fits(std::string_view component, int batch, BytesFor&& bytes_for) {
    const std::size_t need = bytes_for(batch);
    const std::size_t free = Memory<B>::available_bytes();
    if (free == 0 || need <= free) return;
    int lo = 0, hi = batch;  // largest b in [0, batch) with bytes_for(b) <= free; bytes_for(0) may already exceed it
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (bytes_for(mid) <= free ? lo : hi) = mid;
    }
    const bool one_fits = lo >= 1;
    fail(Memory<B>::out_of_memory, component,
         std::string("out of ") + Memory<B>::memory_name + ": batch " + std::to_string(batch) + " needs " + detail::mib(need) +
             " at load but only " + detail::mib(free) + " is available (" +
             (one_fits ? "the largest batch that fits now is " + std::to_string(lo) : std::string("not even batch 1 fits")) + ")" +
             expected_got("<= " + std::to_string(free) + " bytes", std::to_string(need) + " bytes"));
}

}  // namespace flowedge
