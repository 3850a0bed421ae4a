// Plain-C++ entry points into the CUDA runtime wrapper of flowedge::cuda (device query, counted
// allocations, failure injection, graph capture); defined in kernels/cuda/device.cu.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "flowedge/backend.hpp"

namespace flowedge::cuda {

/// True when the CUDA runtime reports at least one usable device. Never throws: a missing driver,
/// no device, or a broken installation all answer false.
bool device_available() noexcept;

/// Name and compute capability of the current device ("NVIDIA H200 (sm_90)"), or why none is usable.
const char* device_description() noexcept;

/// Free and total memory of the current device in bytes (cudaMemGetInfo); throws flowedge::Error on failure.
struct MemoryInfo {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
};
MemoryInfo device_memory_info();

/// Every device allocation flowedge performs goes through these two; they count each cudaMalloc
/// attempted and each cudaFree, so tests can prove that nothing is allocated after load.
void* device_allocate(std::size_t bytes);
void device_free(void* p) noexcept;
/// Number of cudaMalloc calls flowedge has made in this process (successful or not, injected failures excluded).
std::atomic<std::size_t>& allocation_counter() noexcept;
/// Number of cudaFree calls flowedge has made in this process.
std::atomic<std::size_t>& free_counter() noexcept;

/// Test hook: the next `n_next` device_allocate() calls throw flowedge::Error exactly as a failed
/// cudaMalloc would (message contains "out of memory", kind DeviceOutOfMemory), without calling cudaMalloc. 0 disarms it.
void inject_allocation_failure(int n_next) noexcept;

/// Page-locked host memory (cudaMallocHost) for staging copies that may be captured in a graph.
void* pinned_allocate(std::size_t bytes);
void pinned_free(void* p) noexcept;

/// Stream operations on the resolved stream (Stream{} = the default stream, or the internal stream
/// of a Graph<Cuda> while it captures on behalf of the default stream).
void copy_from_host(void* dst, const void* src, std::size_t bytes, Stream s);
/// Blocks until the data is on the host, so pageable `dst` is fine. Inside a graph capture it is
/// only enqueued (then `dst` must be pinned memory and must be read after the replay synchronizes).
void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream s);
void copy_device(void* dst, const void* src, std::size_t bytes, Stream s);
void fill_zero(void* dst, std::size_t bytes, Stream s);
void synchronize(Stream s);

/// Makes every later wait on this process's device sleep until the GPU signals instead of spinning
/// (cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)); call it before the first model is loaded. A spinning
/// wait keeps the thread runnable for the whole GPU time, so under CPU contention the scheduler time-slices it;
/// a sleeping one is woken with priority. Throws flowedge::Error on failure.
void set_blocking_sync();

/// Start / stop the profiler's collection (cudaProfilerStart / Stop): a bench brackets the one call it wants profiled,
/// run under `ncu --profile-from-start off`. Throws flowedge::Error on failure.
void profiler_start();
void profiler_stop();

/// A new non-blocking stream at the device's most urgent priority (the real-time option of a model: its kernels are
/// scheduled ahead of other streams' pending work). Throws flowedge::Error on failure.
void* stream_create_high_priority();
/// Waits for the stream's work, then destroys it. Null is a no-op.
void stream_destroy(void* stream) noexcept;

/// Graph<Cuda> internals (opaque handles so include/ needs no CUDA header).
/// Per-graph state: a lazily created non-blocking stream used when run() is given the default
/// stream (which cannot be captured) plus two ordering events.
void* graph_state_create();
void graph_state_destroy(void* state) noexcept;
/// Starts capturing; returns the stream being captured. With a null `s`, launches and copies that name
/// the default stream are redirected to the state's own stream until end/abort.
void* graph_begin_capture(void* state, Stream s);
/// Ends the capture begun on `capture_stream` and returns an instantiated cudaGraphExec_t.
void* graph_end_capture(void* state, void* capture_stream);
/// Ends a capture abandoned because enqueue() threw; discards what was recorded. Never throws.
void graph_abort_capture(void* state, void* capture_stream) noexcept;
/// Replays `exec` ordered after prior work on `s` (and before later work on `s`).
void graph_launch(void* state, void* exec, Stream s);
void graph_exec_destroy(void* exec) noexcept;

/// Nodes of one captured graph: kernel launches counted per kernel function (demangled name with its
/// template arguments, parameter list dropped), plus copy/memset/other node counts.
struct GraphCensus {
    std::vector<std::pair<std::string, int>> kernels;  ///< (kernel, launches), most launches first
    int kernel_nodes = 0, memcpy_nodes = 0, memset_nodes = 0, other_nodes = 0;
};
/// Diagnostics hook (benchmarks, tests): while on, every Graph<Cuda> capture records the census of the
/// captured graph before instantiating it; last_graph_census() returns the latest (empty if none).
/// Off by default; when off, capture does no extra work.
void set_graph_census(bool on) noexcept;
GraphCensus last_graph_census();

}  // namespace flowedge::cuda
