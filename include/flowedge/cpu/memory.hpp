// Host memory for the Cpu backend: 64-byte aligned allocations, counted so tests can prove
// that nothing is allocated after load.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>

#include <sys/mman.h>
#include <unistd.h>

#include "flowedge/tensor.hpp"

namespace flowedge {

template <>
struct Memory<Cpu> {
    /// Host memory is directly addressable: mapped file data can be used in place.
    static constexpr bool host_accessible = true;
    /// Number of allocate() calls so far in this process (for allocation-discipline tests).
    static std::atomic<std::size_t>& allocation_count() {
        static std::atomic<std::size_t> n{0};
        return n;
    }
    /// Memory this process may use in bytes (0 when unknown): the host's physical memory, or the control group's
    /// limit when lower (a container sees the host's RAM through sysconf, but its limit is what the OOM killer
    /// enforces). No single allocation may exceed it.
    static std::size_t physical_bytes() {
        static const std::size_t n = [] {
            const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
            std::size_t bytes = pages > 0 && page > 0 ? std::size_t(pages) * std::size_t(page) : std::size_t(0);
            // cgroup v2 ("max" = no limit), then v1 (an unlimited v1 group reports a huge page-rounded number).
            for (const char* file : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
                if (std::FILE* f = std::fopen(file, "r")) {
                    unsigned long long limit = 0;
                    const bool number = std::fscanf(f, "%llu", &limit) == 1;
                    std::fclose(f);
                    if (number && limit > 0 && (bytes == 0 || limit < bytes)) bytes = std::size_t(limit);
                    break;
                }
            }
            return bytes;
        }();
        return n;
    }
    /// Error (not an overcommitted mapping that the OOM killer reaps later) when `bytes` cannot fit in RAM.
    static void check_fits(std::size_t bytes, std::string_view what) {
        const std::size_t phys = physical_bytes();
        if (phys != 0 && bytes > phys) [[unlikely]]
            fail(ErrorKind::OutOfMemory, "cpu", "out of host memory: " + std::string(what) + " needs " + std::to_string(bytes) +
                            " bytes, more than this host's physical memory" + expected_got("<= " + std::to_string(phys), std::to_string(bytes)));
    }
    static constexpr std::size_t kHugePageBytes = std::size_t(2) << 20;
    static constexpr std::size_t kHugePageMinBytes = std::size_t(4) << 20;
    static void* allocate(std::size_t bytes) {
        allocation_count().fetch_add(1, std::memory_order_relaxed);
        check_fits(bytes, "an allocation");
        // Large buffers (the packed Conv1d weights, up to 84 MB each for PushT, streamed once per step) are 2 MiB
        // aligned and marked for transparent huge pages: on hosts where THP is "madvise" (the default on many
        // distributions) they would otherwise sit in 4 KiB pages, one TLB miss per 4 KiB of a weight stream.
        const bool huge = bytes >= kHugePageMinBytes;
        const std::size_t align = huge ? kHugePageBytes : 64;
        const std::size_t size = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple of align
        void* p = std::aligned_alloc(align, size);
        if (!p) fail(ErrorKind::OutOfMemory, "cpu", "out of host memory allocating " + std::to_string(bytes) + " bytes");
#ifdef MADV_HUGEPAGE
        if (huge) ::madvise(p, size, MADV_HUGEPAGE);  // advice only: failure is harmless
#endif
        return p;
    }
    static void deallocate(void* p) noexcept { std::free(p); }
    /// Bytes a new allocation can take (0 = unknown): physical_bytes(), since host memory is not reserved ahead.
    static std::size_t available_bytes() { return physical_bytes(); }
    static constexpr const char* memory_name = "host memory";
    static constexpr ErrorKind out_of_memory = ErrorKind::OutOfMemory;
    static void copy_from_host(void* dst, const void* src, std::size_t bytes, Stream = {}) { std::memcpy(dst, src, bytes); }
    static void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream = {}) { std::memcpy(dst, src, bytes); }
    static void copy(void* dst, const void* src, std::size_t bytes, Stream = {}) { std::memmove(dst, src, bytes); }
    static void fill_zero(void* dst, std::size_t bytes, Stream = {}) { std::memset(dst, 0, bytes); }
    static void synchronize(Stream = {}) {}
    /// No staging and no streams on the CPU (ops read host memory on the calling thread): null, and no-op releases,
    /// so a model asks for them the same way on every backend.
    static void* allocate_pinned(std::size_t) { return nullptr; }
    static void deallocate_pinned(void*) noexcept {}
    static Stream create_priority_stream() { return {}; }
    static void destroy_stream(Stream) noexcept {}
};

}  // namespace flowedge
