// CPU-only helpers for the tests of the packed weight layouts (cpu/kernels_packed_conv.hpp) and of results that must
// not depend on the OpenMP thread count.
#pragma once
#include <cstdint>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ops_test_util.hpp"

namespace optest {

/// The weight bytes of w in the CPU's packed Conv1d layout (cpu/kernels_packed_conv.hpp) for `out` outputs.
inline std::vector<std::uint8_t> packed_conv_bytes(const HostWeights& w, int out) {
    const std::size_t elem = dtype_size(w.dtype), R = w.bytes.size() / elem / std::size_t(out);
    std::vector<std::uint8_t> dst(cpu::packed_conv_elements(w.dtype, out, R) * elem, 0xAB);  // not zero: padding is written
    auto pack = [&](auto tag) {
        using T = decltype(tag);
        cpu::pack_conv_weights(reinterpret_cast<const T*>(w.bytes.data()), out, R, reinterpret_cast<T*>(dst.data()));
    };
    if (w.dtype == DType::F32) pack(float{});
    else if (w.dtype == DType::BF16) pack(bf16{});
    else pack(f16{});
    return dst;
}

/// The bytes of ConvTranspose1d weights w [in, out, kernel] packed as the kernel-1 Conv1d [out*kernel, in].
inline std::vector<std::uint8_t> packed_conv_transpose_bytes(const HostWeights& w, int in, int out, int kernel) {
    std::vector<std::uint8_t> dst(cpu::packed_conv_elements(w.dtype, out * kernel, std::size_t(in)) * dtype_size(w.dtype), 0xAB);
    auto pack = [&](auto tag) {
        using T = decltype(tag);
        cpu::pack_conv_transpose_weights(reinterpret_cast<const T*>(w.bytes.data()), in, out, kernel, reinterpret_cast<T*>(dst.data()));
    };
    if (w.dtype == DType::F32) pack(float{});
    else if (w.dtype == DType::BF16) pack(bf16{});
    else pack(f16{});
    return dst;
}

/// Runs f() with the OpenMP team size set to `threads` (restored afterwards; a no-op without OpenMP).
template <class F>
void with_threads(int threads, F&& f) {
#ifdef _OPENMP
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
#endif
    f();
#ifdef _OPENMP
    omp_set_num_threads(before);
#endif
    (void)threads;
}

}  // namespace optest
