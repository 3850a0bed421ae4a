// Device memory for the Cuda backend: counted cudaMalloc/cudaFree and stream-ordered copies,
// forwarding to flowedge::cuda (kernels/cuda/device.cu) so this header needs no CUDA include.
#pragma once
#include <atomic>
#include <cstddef>

#include "flowedge/cuda/device.hpp"
#include "flowedge/error.hpp"
#include "flowedge/tensor.hpp"

namespace flowedge {

template <>
struct Memory<Cuda> {
    /// Device memory is not addressable from the host: weights are always uploaded.
    static constexpr bool host_accessible = false;
    /// Number of cudaMalloc calls made by flowedge in this process (same type as Memory<Cpu>'s counter).
    static std::atomic<std::size_t>& allocation_count() noexcept { return cuda::allocation_counter(); }
    /// Number of cudaFree calls made by flowedge in this process.
    static std::atomic<std::size_t>& free_count() noexcept { return cuda::free_counter(); }
    /// cudaMalloc; throws flowedge::Error ("flowedge: cuda: cudaMalloc of N bytes failed: ...", kind DeviceOutOfMemory
    /// when the device is out of memory, Device otherwise) on failure.
    static void* allocate(std::size_t bytes) { return cuda::device_allocate(bytes); }
    static void deallocate(void* p) noexcept { cuda::device_free(p); }
    /// Bytes a new allocation can take now: the device's free memory (cudaMemGetInfo).
    static std::size_t available_bytes() { return cuda::device_memory_info().free_bytes; }
    static constexpr const char* memory_name = "device memory";
    static constexpr ErrorKind out_of_memory = ErrorKind::DeviceOutOfMemory;
    /// Host -> device, stream-ordered; the host buffer may be reused as soon as this returns.
    static void copy_from_host(void* dst, const void* src, std::size_t bytes, Stream s = {}) {
        cuda::copy_from_host(dst, src, bytes, s);
    }
    /// Device -> host; returns when the data is on the host (pageable `dst` is fine).
    static void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream s = {}) {
        cuda::copy_to_host(dst, src, bytes, s);
    }
    /// Device -> device, stream-ordered (regions must not overlap).
    static void copy(void* dst, const void* src, std::size_t bytes, Stream s = {}) { cuda::copy_device(dst, src, bytes, s); }
    static void fill_zero(void* dst, std::size_t bytes, Stream s = {}) { cuda::fill_zero(dst, bytes, s); }
    /// Waits for everything enqueued on `s`.
    static void synchronize(Stream s = {}) { cuda::synchronize(s); }
    /// Page-locked host staging memory (not counted as device allocations).
    static void* allocate_pinned(std::size_t bytes) { return cuda::pinned_allocate(bytes); }
    static void deallocate_pinned(void* p) noexcept { cuda::pinned_free(p); }
    /// A stream of the device's highest priority, owned by the caller until destroy_stream.
    static Stream create_priority_stream() { return {cuda::stream_create_high_priority()}; }
    static void destroy_stream(Stream s) noexcept { cuda::stream_destroy(s.handle); }
};

}  // namespace flowedge
