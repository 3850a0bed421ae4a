// Internal helpers shared by the kernels of flowedge::cuda: error checks with file:line, stream
// resolution, weight widening (F32/BF16/F16), activations with precise math, warp reductions.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "flowedge/backend.hpp"
#include "flowedge/dtype.hpp"
#include "flowedge/error.hpp"
#include "flowedge/op_params.hpp"

namespace flowedge::cuda::detail {

/// Throws flowedge::Error "flowedge: cuda: <what> failed: <cuda error string> (<name>) [file:line]"; with no GPU or
/// driver at all: "...failed: no NVIDIA GPU/driver found (<string> (<name>)) [file:line]; use --device cpu".
/// Kind Device, or DeviceOutOfMemory for cudaErrorMemoryAllocation.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

/// The stream a launch should use: `s` itself, or, for the default stream while a Graph<Cuda> captures
/// on its behalf in this thread, that graph's stream.
cudaStream_t resolve(Stream s) noexcept;

/// Number of multiprocessors of the current device (cached per device).
int sm_count();

/// Compute capability major of the current device (cached per device).
int compute_major();

/// Shared memory per multiprocessor / the per-block opt-in maximum of the current device, bytes (cached per device).
int smem_per_sm();
int smem_per_block_optin();

/// True when environment variable `name` is set to anything but "" or "0" (the A/B and escape-hatch switches).
bool env_flag(const char* name);

/// True when the current device supports programmatic dependent launch (compute capability >= 9.0; cached per
/// device). FLOWEDGE_CUDA_NO_PDL=1 turns it off (for A/B timing and as an escape hatch).
bool pdl_enabled();

/// The checks every conv1d launcher (exact and tensor-core) makes before launching: positive sizes, non-null
/// pointers, out_length consistent with in_length / kernel / stride / pad. Errors name `comp`.
inline void check_conv1d(const Conv1dParams& p, std::string_view comp) {
    check(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_length > 0 && p.kernel > 0 &&
              p.stride > 0 && p.pad >= 0,
          comp, "sizes must be positive (pad non-negative)");
    check(p.x && p.w.data && p.y, comp, "null x, w or y pointer");
    const int want = (p.in_length + 2 * p.pad - p.kernel) / p.stride + 1;
    if (!(p.in_length + 2 * p.pad >= p.kernel && p.out_length == want)) [[unlikely]]
        fail(comp, "out_length inconsistent with in_length/kernel/stride/pad" + expected_got(want, p.out_length));
}

}  // namespace flowedge::cuda::detail

#define FLOWEDGE_CUDA_CHECK(expr)                                                                  \
    do {                                                                                           \
        const cudaError_t flowedge_err_ = (expr);                                                  \
        if (flowedge_err_ != cudaSuccess) [[unlikely]]                                             \
            ::flowedge::cuda::detail::throw_cuda_error(flowedge_err_, #expr, __FILE__, __LINE__);  \
    } while (0)

/// Checks the launch just issued (configuration errors, not asynchronous faults).
#define FLOWEDGE_CUDA_CHECK_LAUNCH(name)                                                           \
    do {                                                                                           \
        const cudaError_t flowedge_err_ = cudaGetLastError();                                      \
        if (flowedge_err_ != cudaSuccess) [[unlikely]]                                             \
            ::flowedge::cuda::detail::throw_cuda_error(flowedge_err_, "launch of " name, __FILE__, __LINE__); \
    } while (0)

namespace flowedge::cuda::detail {

// ---- Programmatic dependent launch (Hopper): a U-Net call is ~80 short dependent kernels, so each launch gap
// and each kernel's ramp-up is paid ~800 times per sample. A kernel launched with launch_pdl() may start while
// its predecessor drains: it first does what depends on no earlier kernel (streaming constant weights), then
// calls pdl_wait() before it reads any activation or writes any output. pdl_wait() returns once every earlier
// kernel on the stream has completed and its writes are visible, so the ordering of the plain launch is kept.
// Every kernel launched with launch_pdl() MUST call pdl_wait() before touching activations.

/// Lets the next kernel on the stream be scheduled once all blocks of this one are running.
__device__ __forceinline__ void pdl_allow_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
/// Waits for the completion (and memory flush) of the kernels this one depends on; no-op without PDL.
/// It first lets the next kernel launch ("early trigger"): the next kernel's blocks become resident while this one
/// waits and runs, issue their weight prefetch, and sit at their own wait. Progress is guaranteed: a kernel's
/// successor launches only once all of its blocks are resident, and a block only ever waits on its predecessors.
/// What it gained: docs/performance/cuda.md. Build with -DFLOWEDGE_CUDA_PDL_EARLY_TRIGGER=0 to trigger after the
/// wait instead (each kernel's pdl_allow_next()).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#if !defined(FLOWEDGE_CUDA_PDL_EARLY_TRIGGER) || FLOWEDGE_CUDA_PDL_EARLY_TRIGGER
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---- Asynchronous copies global -> shared (sm_80+): a block issues all of its loads, then waits once.
__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
/// 16-byte async copy global -> shared; src_bytes 0 fills the destination with zeros (src must still be valid).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes) : "memory");
}
/// 4-byte async copy global -> shared with zero fill (src_bytes 0 or 4).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

/// Launches `kernel` on `st`, with programmatic stream serialisation where the device supports it.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t st, Args&&... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = pdl_enabled() ? 1 : 0;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    if (err != cudaSuccess) throw_cuda_error(err, "cudaLaunchKernelEx", __FILE__, __LINE__);
}

/// Widening of one stored weight element; exact for every dtype.
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(bf16 v) { return __uint_as_float(std::uint32_t(v.bits) << 16); }
__device__ __forceinline__ float widen(f16 v) { return __half2float(__ushort_as_half(v.bits)); }

template <class T>
__device__ __forceinline__ float load_w(const T* p, std::size_t i) {
    if constexpr (sizeof(T) == 4) return __ldg(reinterpret_cast<const float*>(p) + i);
    else return widen(T{__ldg(reinterpret_cast<const unsigned short*>(p) + i)});
}

/// Widens one 32-bit word of stored 16-bit weights into its two elements (lo = the element at the lower address).
/// BF16 is the top half of an F32, so both are one integer op; F16 converts the pair at once.
template <class T>
__device__ __forceinline__ void widen_word(std::uint32_t w, float& lo, float& hi) {
    static_assert(sizeof(T) == 2, "widen_word: 16-bit weight types only");
    if constexpr (std::is_same_v<T, bf16>) {
        lo = __uint_as_float(w << 16);
        hi = __uint_as_float(w & 0xffff0000u);
    } else {
        __half2 h;
        static_assert(sizeof(h) == sizeof(w));
        memcpy(&h, &w, sizeof(w));
        const float2 f = __half22float2(h);
        lo = f.x;
        hi = f.y;
    }
}

/// Widens a raw 16-byte (uint4) or 8-byte (uint2) load of stored weights to float, in address order:
/// 16 / sizeof(T) or 8 / sizeof(T) elements into out[0..]. Exact for every dtype.
template <class T, class Raw>
__device__ __forceinline__ void widen_raw(const Raw& r, float* out) {
    static_assert(std::is_same_v<Raw, uint4> || std::is_same_v<Raw, uint2>, "widen_raw: uint4 or uint2");
    constexpr int n_words = int(sizeof(Raw) / 4);
    std::uint32_t w[n_words];
    memcpy(w, &r, sizeof(Raw));
#pragma unroll
    for (int j = 0; j < n_words; ++j) {
        if constexpr (sizeof(T) == 4) out[j] = __uint_as_float(w[j]);
        else widen_word<T>(w[j], out[2 * j], out[2 * j + 1]);
    }
}

/// 16 bytes of weights widened to float: 4 (F32) or 8 (BF16/F16) elements. `p` must be 16-byte aligned.
template <class T>
struct Vec16 {
    static constexpr int n = 16 / int(sizeof(T));
};
template <class T>
__device__ __forceinline__ void load_w16(const T* p, float (&out)[Vec16<T>::n]) {
    widen_raw<T>(__ldg(reinterpret_cast<const uint4*>(p)), out);
}

/// 8 bytes of weights widened to float: 2 (F32) or 4 (BF16/F16) elements. `p` must be 8-byte aligned.
template <class T>
struct Vec8 {
    static constexpr int n = 8 / int(sizeof(T));
};
template <class T>
__device__ __forceinline__ void load_w8(const T* p, float (&out)[Vec8<T>::n]) {
    widen_raw<T>(__ldg(reinterpret_cast<const uint2*>(p)), out);
}

/// Stable softplus with PyTorch's threshold 20 (beta 1): x > 20 ? x : log1p(exp(x)).
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float mish(float x) { return x * tanhf(softplus(x)); }
/// max(x, 0) with NaN passed through (torch.relu keeps NaN; fmaxf would turn it into 0).
__device__ __forceinline__ float relu(float x) { return x > 0.f ? x : (x != x ? x : 0.f); }

/// Pointwise activation with precise (non-intrinsic) math, so results track the CPU within 2e-6.
__device__ __forceinline__ float apply_act(Activation a, float x) {
    switch (a) {
        case Activation::None: return x;
        case Activation::Silu: return silu(x);
        case Activation::Mish: return mish(x);
        case Activation::Softplus: return softplus(x);
        case Activation::Relu: return relu(x);
    }
    return x;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/// Sum over the block in a fixed order (lanes, then warps), so results repeat run to run; every thread receives
/// the result. scratch: one double per warp in shared memory.
__device__ __forceinline__ double block_sum(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double total = 0.0;
    const int n_warps = (blockDim.x + 31) >> 5;
    for (int w = 0; w < n_warps; ++w) total += scratch[w];
    return total;
}

/// Calls f.template operator()<T>() with T the C++ storage type of `d` (float, bf16 or f16).
template <class F>
void dispatch_dtype(DType d, F&& f) {
    switch (d) {
        case DType::F32: f.template operator()<float>(); return;
        case DType::BF16: f.template operator()<bf16>(); return;
        case DType::F16: f.template operator()<f16>(); return;
    }
    fail(ErrorKind::Internal, "cuda", "unknown weight dtype " + std::to_string(int(d)));
}

inline bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

/// Opts `kernel` in to `bytes` of dynamic shared memory when above the 48 KiB default, with one driver call per device
/// rather than per launch (a plain attribute, legal while a graph captures): `opted` is the call site's static record
/// of the device last set, and the value set must be the same at every call (e.g. the device's whole opt-in limit).
template <class Kernel>
void opt_in_smem_once(Kernel kernel, std::size_t bytes, int value, std::atomic<int>& opted) {
    if (bytes <= 48 * 1024) return;
    int dev = 0;
    FLOWEDGE_CUDA_CHECK(cudaGetDevice(&dev));
    if (opted.load(std::memory_order_acquire) == dev) return;
    FLOWEDGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, value));
    opted.store(dev, std::memory_order_release);
}

inline unsigned blocks_for(std::int64_t n, int threads, std::int64_t cap = 65535LL * 32) {
    std::int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > cap) b = cap;
    return static_cast<unsigned>(b);
}

}  // namespace flowedge::cuda::detail
