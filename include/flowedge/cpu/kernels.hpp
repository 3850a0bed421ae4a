// Every CPU kernel, compiled once per kernel set into its own namespace (cpu::scalar, cpu::eigen, cpu::avx2,
// cpu::avx512). The portable sets (plain C++; Eigen's products for the GEMM-shaped ops) follow the consumer's flags;
// the x86 sets do not, whatever the consumer's -march: each one's region enables its instructions for the functions
// in it (#pragma GCC target / clang attribute), so their code, the data layouts and the kernel choice are the same in
// every translation unit, and Ops<Cpu> picks one set per process at run time (cpu/isa.hpp). The op bodies in
// kernels/ are written once against the set's vocabulary (arch/<set>.hpp: VecF, vload, vfma, vexp, ...); where a set
// needs its own algorithm the body says so with FLOWEDGE_ISA_AVX512 / FLOWEDGE_ISA_AVX2 / FLOWEDGE_ISA_EIGEN (0 or 1
// in each region).
#pragma once
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "flowedge/cpu/isa.hpp"
#include "flowedge/cpu/math.hpp"
#include "flowedge/cpu/parallel.hpp"
#include "flowedge/dtype.hpp"
#include "flowedge/error.hpp"
#include "flowedge/noise.hpp"
#include "flowedge/op_params.hpp"
#include "flowedge/op_params_transformer.hpp"

#if defined(FLOWEDGE_CPU_X86)
#include <immintrin.h>
#endif

// Warnings that do not apply inside a kernel region: GCC 12's own AVX-512 headers trip -Wmaybe-uninitialized /
// -Wuninitialized (`__m512 __Y = __Y;` in _mm512_undefined_ps, GCC bug 105593, fixed in GCC 13), and -Wpsabi notes
// that vector arguments would change the ABI of a function compiled without AVX (a consumer's default flags): every
// function taking vectors is an inline member of the same target region, so no such call crosses the boundary.
#if defined(__GNUC__) && !defined(__clang__)
#define FLOWEDGE_SIMD_WARNINGS_OFF                                     \
    _Pragma("GCC diagnostic push")                                     \
    _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")       \
    _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")             \
    _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#define FLOWEDGE_SIMD_WARNINGS_ON _Pragma("GCC diagnostic pop")
#else
#define FLOWEDGE_SIMD_WARNINGS_OFF
#define FLOWEDGE_SIMD_WARNINGS_ON
#endif

// Every function defined between a FLOWEDGE_TARGET_*_PUSH and FLOWEDGE_TARGET_POP is compiled for that instruction
// set (the kernel sets below; a test's code that measures one set's kernels directly).
#if defined(__clang__)
#define FLOWEDGE_TARGET_AVX2_PUSH \
    _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c\"))), apply_to = function)")
#define FLOWEDGE_TARGET_AVX512_PUSH \
    _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c\"))), apply_to = function)")
#define FLOWEDGE_TARGET_POP _Pragma("clang attribute pop")
#else
#define FLOWEDGE_TARGET_AVX2_PUSH _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")")
#define FLOWEDGE_TARGET_AVX512_PUSH \
    _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c\")")
#define FLOWEDGE_TARGET_POP _Pragma("GCC pop_options")
#endif

// Eigen's products (the Eigen set), with the same warnings off: where the consumer's flags enable AVX-512, Eigen's
// packing code reaches GCC 12's _mm512_undefined_ps as above.
FLOWEDGE_SIMD_WARNINGS_OFF
#include <Eigen/Core>
FLOWEDGE_SIMD_WARNINGS_ON

namespace flowedge::cpu {
/// Storage of a small-row packed linear (kernels/packed_linear.hpp): none, F32 vectors, BF16 pairs, or BF16 pairs in
/// AMX tile order (MathMode::BF16 where amx_bf16_available()); or of a many-row one (Storage::ManyRowsMatrix), F32
/// vectors in blocks of one GEMM tile's width (F32Groups, kernels/packed_gemm.hpp).
enum class PackedLayout : std::uint8_t { None = 0, F32, Pairs, PairTiles, F32Groups };
/// BF16 x-pair scratch (32-bit pairs) for MathMode::BF16: up to 4 rows of this many pairs sit on the stack (32 KiB);
/// longer rows are not packed for BF16 math (the row-major kernels keep them).
inline constexpr int kPackBhPairs = 2048;
}  // namespace flowedge::cpu

// ---- the plain C++ set (every machine) ----
#define FLOWEDGE_ISA_AVX512 0
#define FLOWEDGE_ISA_AVX2 0
#define FLOWEDGE_ISA_SIMD 0
#define FLOWEDGE_ISA_EIGEN 0
FLOWEDGE_SIMD_WARNINGS_OFF
namespace flowedge::cpu::scalar {
#include "flowedge/cpu/arch/scalar.hpp"
#include "flowedge/cpu/kernels/set.hpp"
}  // namespace flowedge::cpu::scalar
FLOWEDGE_SIMD_WARNINGS_ON
#undef FLOWEDGE_ISA_AVX512
#undef FLOWEDGE_ISA_AVX2
#undef FLOWEDGE_ISA_SIMD
#undef FLOWEDGE_ISA_EIGEN

// ---- the Eigen set (every machine): the plain C++ vocabulary, with Eigen's products for the GEMM-shaped ops ----
#define FLOWEDGE_ISA_AVX512 0
#define FLOWEDGE_ISA_AVX2 0
#define FLOWEDGE_ISA_SIMD 0
#define FLOWEDGE_ISA_EIGEN 1
FLOWEDGE_SIMD_WARNINGS_OFF
namespace flowedge::cpu::eigen {
#include "flowedge/cpu/arch/scalar.hpp"
#include "flowedge/cpu/kernels/set.hpp"
}  // namespace flowedge::cpu::eigen
FLOWEDGE_SIMD_WARNINGS_ON
#undef FLOWEDGE_ISA_AVX512
#undef FLOWEDGE_ISA_AVX2
#undef FLOWEDGE_ISA_SIMD
#undef FLOWEDGE_ISA_EIGEN

#if defined(FLOWEDGE_CPU_X86)
// ---- AVX2 + FMA + F16C ----
#define FLOWEDGE_ISA_AVX512 0
#define FLOWEDGE_ISA_AVX2 1
#define FLOWEDGE_ISA_SIMD 1
#define FLOWEDGE_ISA_EIGEN 0
FLOWEDGE_TARGET_AVX2_PUSH
FLOWEDGE_SIMD_WARNINGS_OFF
namespace flowedge::cpu::avx2 {
#include "flowedge/cpu/arch/avx2.hpp"
#include "flowedge/cpu/kernels/set.hpp"
}  // namespace flowedge::cpu::avx2
FLOWEDGE_SIMD_WARNINGS_ON
FLOWEDGE_TARGET_POP
#undef FLOWEDGE_ISA_AVX512
#undef FLOWEDGE_ISA_AVX2
#undef FLOWEDGE_ISA_SIMD
#undef FLOWEDGE_ISA_EIGEN

// ---- AVX-512 F/BW/DQ/VL (+ BF16 instructions, run only where the CPU has them) ----
#define FLOWEDGE_ISA_AVX512 1
#define FLOWEDGE_ISA_AVX2 0
#define FLOWEDGE_ISA_SIMD 1
#define FLOWEDGE_ISA_EIGEN 0
FLOWEDGE_TARGET_AVX512_PUSH
FLOWEDGE_SIMD_WARNINGS_OFF
namespace flowedge::cpu::avx512 {
#include "flowedge/cpu/arch/avx512.hpp"
#include "flowedge/cpu/kernels/set.hpp"
}  // namespace flowedge::cpu::avx512
FLOWEDGE_SIMD_WARNINGS_ON
FLOWEDGE_TARGET_POP
#undef FLOWEDGE_ISA_AVX512
#undef FLOWEDGE_ISA_AVX2
#undef FLOWEDGE_ISA_SIMD
#undef FLOWEDGE_ISA_EIGEN
#endif  // FLOWEDGE_CPU_X86

/// Runs `call` (an unqualified kernel call, e.g. conv1d(p, nullptr, false, false)) in the process's kernel set.
#if defined(FLOWEDGE_CPU_X86)
#define FLOWEDGE_CPU_KERNEL(call)                                      \
    do {                                                               \
        switch (::flowedge::cpu::active_isa()) {                       \
            case ::flowedge::cpu::Isa::Avx512: ::flowedge::cpu::avx512::call; break; \
            case ::flowedge::cpu::Isa::Avx2: ::flowedge::cpu::avx2::call; break;     \
            case ::flowedge::cpu::Isa::Eigen: ::flowedge::cpu::eigen::call; break;   \
            default: ::flowedge::cpu::scalar::call; break;             \
        }                                                              \
    } while (0)
#else
#define FLOWEDGE_CPU_KERNEL(call)                                      \
    do {                                                               \
        if (::flowedge::cpu::active_isa() == ::flowedge::cpu::Isa::Eigen) ::flowedge::cpu::eigen::call; \
        else ::flowedge::cpu::scalar::call;                            \
    } while (0)
#endif

namespace flowedge::cpu {
/// kernels/elementwise.hpp's stream_sum in the process's kernel set (benchmarks' read-bandwidth probe).
inline float stream_sum(const float* a, std::int64_t n) {
#if defined(FLOWEDGE_CPU_X86)
    switch (active_isa()) {
        case Isa::Avx512: return avx512::stream_sum(a, n);
        case Isa::Avx2: return avx2::stream_sum(a, n);
        default: break;
    }
#endif
    if (active_isa() == Isa::Eigen) return eigen::stream_sum(a, n);
    return scalar::stream_sum(a, n);
}
}  // namespace flowedge::cpu
