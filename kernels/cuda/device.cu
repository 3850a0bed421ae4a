// The CUDA runtime wrapper of flowedge::cuda: errors with file:line, counted device allocations with a
// failure-injection hook, stream-ordered copies, device queries and the Graph<Cuda> capture machinery.
#include <cxxabi.h>
#include <cuda_profiler_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "common.cuh"
#include "gemm_lt.cuh"
#include "flowedge/cuda/device.hpp"

namespace flowedge::cuda {
namespace detail {

namespace {
/// Stream that replaces the default stream while a Graph<Cuda> captures on its behalf (this thread only).
thread_local cudaStream_t t_capture_override = nullptr;
std::atomic<int> g_inject_failures{0};
}  // namespace

namespace {
/// True when `err` means there is no GPU to use at all. Without any NVIDIA driver the runtime reports
/// cudaErrorInsufficientDriver, which reads like "upgrade your driver"; cudaDriverGetVersion gives 0 then.
bool no_gpu_or_driver(cudaError_t err) {
    if (err == cudaErrorNoDevice) return true;
    if (err != cudaErrorInsufficientDriver) return false;
    int version = 0;
    return cudaDriverGetVersion(&version) == cudaSuccess && version == 0;
}

/// The runtime's text and name for `err`, led by "no NVIDIA GPU/driver found" when that is what it means.
std::string error_text(cudaError_t err) {
    std::string text = std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) + ")";
    if (no_gpu_or_driver(err)) text = "no NVIDIA GPU/driver found (" + text + ")";
    return text;
}

/// What to do about it, appended after the file:line.
const char* error_advice(cudaError_t err) { return no_gpu_or_driver(err) ? "; use --device cpu" : ""; }
}  // namespace

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
    throw Error(std::string("flowedge: cuda: ") + what + " failed: " + error_text(err) + " [" + file + ":" +
                std::to_string(line) + "]" + error_advice(err),
                err == cudaErrorMemoryAllocation ? ErrorKind::DeviceOutOfMemory : ErrorKind::Device);
}

cudaStream_t resolve(Stream s) noexcept {
    if (s.handle) return static_cast<cudaStream_t>(s.handle);
    return t_capture_override;
}

namespace {
/// Attribute A of the current device, cached for the last device asked. Device id and value share one atomic, so a
/// reader on another thread never pairs one device's id with another device's value.
template <cudaDeviceAttr A>
int cached_attribute() {
    static std::atomic<std::uint64_t> cache{~std::uint64_t(0)};
    int dev = 0;
    FLOWEDGE_CUDA_CHECK(cudaGetDevice(&dev));
    const std::uint64_t c = cache.load(std::memory_order_acquire);
    if (c != ~std::uint64_t(0) && int(c >> 32) == dev) return int(std::uint32_t(c));
    int v = 0;
    FLOWEDGE_CUDA_CHECK(cudaDeviceGetAttribute(&v, A, dev));
    cache.store((std::uint64_t(std::uint32_t(dev)) << 32) | std::uint32_t(v), std::memory_order_release);
    return v;
}
}  // namespace

int sm_count() { return cached_attribute<cudaDevAttrMultiProcessorCount>(); }
int compute_major() { return cached_attribute<cudaDevAttrComputeCapabilityMajor>(); }
int smem_per_sm() { return cached_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(); }
int smem_per_block_optin() { return cached_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(); }

bool env_flag(const char* name) {
    const char* v = std::getenv(name);
    return v && *v && std::string_view(v) != "0";
}

bool pdl_enabled() {
    static const bool disabled = env_flag("FLOWEDGE_CUDA_NO_PDL");
    return !disabled && compute_major() >= 9;
}

std::atomic<int>& inject_failures() noexcept { return g_inject_failures; }
cudaStream_t& capture_override() noexcept { return t_capture_override; }

}  // namespace detail

bool device_available() noexcept {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();  // clear the non-sticky error so later checks are not confused
        return false;
    }
    return n > 0;
}

const char* device_description() noexcept {
    static thread_local char buf[384];  // prop.name is up to 256 chars
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        if (detail::no_gpu_or_driver(err))
            std::snprintf(buf, sizeof buf, "no NVIDIA GPU/driver found (%s, %s)", cudaGetErrorString(err), cudaGetErrorName(err));
        else
            std::snprintf(buf, sizeof buf, "no usable CUDA device: %s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
        return buf;
    }
    if (n == 0) {
        std::snprintf(buf, sizeof buf, "no CUDA device present");
        return buf;
    }
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        std::snprintf(buf, sizeof buf, "CUDA device %d (properties unavailable)", dev);
        return buf;
    }
    std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %.1f GiB)", prop.name, prop.major, prop.minor,
                  prop.multiProcessorCount, double(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

MemoryInfo device_memory_info() {
    MemoryInfo m;
    FLOWEDGE_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
    return m;
}

std::atomic<std::size_t>& allocation_counter() noexcept {
    static std::atomic<std::size_t> n{0};
    return n;
}
std::atomic<std::size_t>& free_counter() noexcept {
    static std::atomic<std::size_t> n{0};
    return n;
}

void inject_allocation_failure(int n_next) noexcept { detail::inject_failures().store(n_next < 0 ? 0 : n_next); }

void* device_allocate(std::size_t bytes) {
    auto& inj = detail::inject_failures();
    int pending = inj.load();
    while (pending > 0) {
        if (inj.compare_exchange_weak(pending, pending - 1))
            fail(ErrorKind::DeviceOutOfMemory, "cuda", "cudaMalloc of " + std::to_string(bytes) +
                             " bytes failed: out of memory (cudaErrorMemoryAllocation, injected by "
                             "flowedge::cuda::inject_allocation_failure)");
    }
    void* p = nullptr;
    allocation_counter().fetch_add(1, std::memory_order_relaxed);
    const cudaError_t err = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        fail(err == cudaErrorMemoryAllocation ? ErrorKind::DeviceOutOfMemory : ErrorKind::Device, "cuda",
             "cudaMalloc of " + std::to_string(bytes) + " bytes failed: " + detail::error_text(err) + " [" + __FILE__ +
                         ":" + std::to_string(__LINE__) + "]" + detail::error_advice(err));
    }
    return p;
}

void device_free(void* p) noexcept {
    if (!p) return;
    free_counter().fetch_add(1, std::memory_order_relaxed);
    (void)cudaFree(p);
}

void* pinned_allocate(std::size_t bytes) {
    void* p = nullptr;
    FLOWEDGE_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 1 : bytes));
    return p;
}

void pinned_free(void* p) noexcept {
    if (p) (void)cudaFreeHost(p);
}

void copy_from_host(void* dst, const void* src, std::size_t bytes, Stream s) {
    if (bytes == 0) return;
    FLOWEDGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, detail::resolve(s)));
}

void copy_to_host(void* dst, const void* src, std::size_t bytes, Stream s) {
    if (bytes == 0) return;
    const cudaStream_t st = detail::resolve(s);
    FLOWEDGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st));
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    FLOWEDGE_CUDA_CHECK(cudaStreamIsCapturing(st, &status));
    if (status == cudaStreamCaptureStatusNone) FLOWEDGE_CUDA_CHECK(cudaStreamSynchronize(st));
}

void copy_device(void* dst, const void* src, std::size_t bytes, Stream s) {
    if (bytes == 0 || dst == src) return;
    FLOWEDGE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, detail::resolve(s)));
}

void fill_zero(void* dst, std::size_t bytes, Stream s) {
    if (bytes == 0) return;
    FLOWEDGE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, detail::resolve(s)));
}

void synchronize(Stream s) { FLOWEDGE_CUDA_CHECK(cudaStreamSynchronize(detail::resolve(s))); }

void set_blocking_sync() { FLOWEDGE_CUDA_CHECK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)); }

void profiler_start() { FLOWEDGE_CUDA_CHECK(cudaProfilerStart()); }
void profiler_stop() { FLOWEDGE_CUDA_CHECK(cudaProfilerStop()); }

void* stream_create_high_priority() {
    int least = 0, greatest = 0;  // numerically lower is more urgent: greatest is the smallest number
    FLOWEDGE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    FLOWEDGE_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    return s;
}

void stream_destroy(void* stream) noexcept {
    if (!stream) return;
    (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

// ---- Graph<Cuda> ------------------------------------------------------------------------------------

namespace {
struct GraphState {
    cudaStream_t own = nullptr;  // created on first capture for the default stream
    cudaEvent_t before = nullptr;
    cudaEvent_t after = nullptr;
    cudaStream_t saved_override = nullptr;
};

void ensure_own_stream(GraphState& g) {
    if (g.own) return;
    FLOWEDGE_CUDA_CHECK(cudaStreamCreateWithFlags(&g.own, cudaStreamNonBlocking));
    FLOWEDGE_CUDA_CHECK(cudaEventCreateWithFlags(&g.before, cudaEventDisableTiming));
    FLOWEDGE_CUDA_CHECK(cudaEventCreateWithFlags(&g.after, cudaEventDisableTiming));
}
}  // namespace

void* graph_state_create() { return new GraphState{}; }

void graph_state_destroy(void* state) noexcept {
    auto* g = static_cast<GraphState*>(state);
    if (!g) return;
    if (g->own) {
        (void)cudaStreamSynchronize(g->own);
        (void)cudaEventDestroy(g->before);
        (void)cudaEventDestroy(g->after);
        (void)cudaStreamDestroy(g->own);
    }
    delete g;
}

void* graph_begin_capture(void* state, Stream s) {
    auto& g = *static_cast<GraphState*>(state);
    cudaStream_t cs = static_cast<cudaStream_t>(s.handle);
    if (!cs) {
        if (detail::capture_override())
            fail("cuda", "nested Graph<Cuda>::run on the default stream (expected no capture in progress, got one)");
        ensure_own_stream(g);
        cs = g.own;
    }
    // Autotuning times a plan's first call beside the capture, on the operands' memory: nothing may still use it.
    if (lt::autotune_enabled()) FLOWEDGE_CUDA_CHECK(cudaDeviceSynchronize());
    FLOWEDGE_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    if (!s.handle) {
        g.saved_override = detail::capture_override();
        detail::capture_override() = cs;
    }
    return cs;
}

namespace {
std::atomic<bool> g_census_on{false};
std::mutex g_census_mutex;
GraphCensus g_last_census;

/// "void ns::kernel<float, 4>(ns::Params)" -> "ns::kernel<float, 4>".
std::string kernel_display_name(const void* func) {
    const char* mangled = nullptr;
    if (cudaFuncGetName(&mangled, func) != cudaSuccess || !mangled) {
        (void)cudaGetLastError();
        return "<unnamed kernel>";
    }
    int status = 0;
    char* dem = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string name = status == 0 && dem ? std::string(dem) : std::string(mangled);
    std::free(dem);
    if (name.rfind("void ", 0) == 0) name.erase(0, 5);
    if (!name.empty() && name.back() == ')') {  // drop the parameter list (the last balanced parenthesis group)
        int depth = 0;
        for (std::size_t i = name.size(); i-- > 0;) {
            if (name[i] == ')') ++depth;
            else if (name[i] == '(' && --depth == 0) {
                name.erase(i);
                break;
            }
        }
    }
    return name;
}

void record_census(cudaGraph_t graph) {
    std::size_t n = 0;
    FLOWEDGE_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    if (n) FLOWEDGE_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
    GraphCensus c;
    std::map<std::string, int> per;
    for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type{};
        FLOWEDGE_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
        switch (type) {
            case cudaGraphNodeTypeKernel: {
                cudaKernelNodeParams kp{};
                ++c.kernel_nodes;
                if (cudaGraphKernelNodeGetParams(node, &kp) == cudaSuccess) ++per[kernel_display_name(kp.func)];
                else {
                    (void)cudaGetLastError();
                    ++per["<kernel params unavailable>"];
                }
                break;
            }
            case cudaGraphNodeTypeMemcpy: ++c.memcpy_nodes; break;
            case cudaGraphNodeTypeMemset: ++c.memset_nodes; break;
            default: ++c.other_nodes; break;
        }
    }
    c.kernels.assign(per.begin(), per.end());
    std::stable_sort(c.kernels.begin(), c.kernels.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    std::lock_guard<std::mutex> lock(g_census_mutex);
    g_last_census = std::move(c);
}
}  // namespace

void set_graph_census(bool on) noexcept { g_census_on.store(on); }

GraphCensus last_graph_census() {
    std::lock_guard<std::mutex> lock(g_census_mutex);
    return g_last_census;
}

void* graph_end_capture(void* state, void* capture_stream) {
    auto& g = *static_cast<GraphState*>(state);
    auto cs = static_cast<cudaStream_t>(capture_stream);
    if (cs == g.own) detail::capture_override() = g.saved_override;
    cudaGraph_t graph = nullptr;
    const cudaError_t err = cudaStreamEndCapture(cs, &graph);
    if (err != cudaSuccess) {
        if (graph) (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        detail::throw_cuda_error(err, "cudaStreamEndCapture (something in enqueue() synchronized, allocated, "
                                      "or used another stream)", __FILE__, __LINE__);
    }
    if (g_census_on.load()) {
        try {
            record_census(graph);
        } catch (...) {
            (void)cudaGraphDestroy(graph);
            throw;
        }
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ierr = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    if (ierr != cudaSuccess) detail::throw_cuda_error(ierr, "cudaGraphInstantiate", __FILE__, __LINE__);
    return exec;
}

void graph_abort_capture(void* state, void* capture_stream) noexcept {
    auto& g = *static_cast<GraphState*>(state);
    auto cs = static_cast<cudaStream_t>(capture_stream);
    if (cs == g.own) detail::capture_override() = g.saved_override;
    cudaGraph_t graph = nullptr;
    (void)cudaStreamEndCapture(cs, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
}

void graph_launch(void* state, void* exec, Stream s) {
    auto& g = *static_cast<GraphState*>(state);
    auto ge = static_cast<cudaGraphExec_t>(exec);
    if (s.handle) {
        FLOWEDGE_CUDA_CHECK(cudaGraphLaunch(ge, static_cast<cudaStream_t>(s.handle)));
        return;
    }
    // Default stream: run on the owned stream, fenced on both sides against the default stream.
    ensure_own_stream(g);
    FLOWEDGE_CUDA_CHECK(cudaEventRecord(g.before, nullptr));
    FLOWEDGE_CUDA_CHECK(cudaStreamWaitEvent(g.own, g.before, 0));
    FLOWEDGE_CUDA_CHECK(cudaGraphLaunch(ge, g.own));
    FLOWEDGE_CUDA_CHECK(cudaEventRecord(g.after, g.own));
    FLOWEDGE_CUDA_CHECK(cudaStreamWaitEvent(nullptr, g.after, 0));
}

void graph_exec_destroy(void* exec) noexcept {
    if (exec) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

}  // namespace flowedge::cuda
