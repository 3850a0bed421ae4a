// CPU-only helpers for the tests of the packed weight layouts (cpu/weights.hpp, cpu/kernels/packed_conv.hpp) and of results that must
// not depend on the OpenMP thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ops_test_util.hpp"

namespace optest {

/// Whether this process's kernel set packs Conv1d / ConvTranspose1d / streamed Linear weights (the AVX2 and AVX-512
/// sets, both on the AVX2 set's layout and kernels).
inline bool packs_conv() { return cpu::active_isa() == cpu::Isa::Avx2 || cpu::active_isa() == cpu::Isa::Avx512; }

/// w ([out, R] row-major, any dtype) prepared by Ops<Cpu> as a Conv1d / streamed Linear weight.
inline std::unique_ptr<PreparedWeight> packed_conv_bytes(const HostWeights& w, int out) {
    const std::size_t R = w.bytes.size() / dtype_size(w.dtype) / std::size_t(out);
    return Ops<Cpu>::prepare_weight(Storage::ConvWeight, {w.bytes.data(), w.dtype, nullptr}, Shape{out, std::int64_t(R)}, "test weight");
}

/// ConvTranspose1d weights w [in, out, kernel] prepared by Ops<Cpu> (packed as the kernel-1 Conv1d [out*kernel, in]).
inline std::unique_ptr<PreparedWeight> packed_conv_transpose_bytes(const HostWeights& w, int in, int out, int kernel) {
    return Ops<Cpu>::prepare_weight(Storage::ConvTransposeWeight, {w.bytes.data(), w.dtype, nullptr}, Shape{in, out, kernel},
                                    "test weight");
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
