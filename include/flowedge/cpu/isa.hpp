// Which CPU kernel set runs: every SIMD kernel is compiled for each supported instruction set whatever the
// consumer's -march (cpu/kernels.hpp), beside the portable sets (plain C++, and Eigen's products), and one set is
// picked once per process by CPUID.
#pragma once
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "flowedge/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
/// The x86-64 kernel sets (AVX2, AVX-512) exist in this build (GCC and Clang compile them with target pragmas).
#define FLOWEDGE_CPU_X86 1
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace flowedge::cpu {

/// A CPU kernel set.
enum class Isa : int {
    Scalar = 0,  ///< plain C++ loops (every machine): the reference the other sets are checked against
    Avx2 = 1,    ///< AVX2 + FMA + F16C (Haswell, Zen 1-3 and later)
    Avx512 = 2,  ///< AVX-512 F/BW/DQ/VL (Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4 and later)
    Eigen = 3,   ///< the portable fast set (every machine): GEMM-shaped ops on Eigen's products, vectorised for the
                 ///< consumer's target (NEON on aarch64, SSE/AVX on x86 by -march); the best set where no x86 set runs
};

/// Every set, in the order FLOWEDGE_CPU_ISA's error message lists them.
inline constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Eigen, Isa::Avx2, Isa::Avx512};

inline constexpr std::string_view isa_name(Isa i) {
    switch (i) {
        case Isa::Scalar: return "scalar";
        case Isa::Avx2: return "avx2";
        case Isa::Avx512: return "avx512";
        case Isa::Eigen: return "eigen";
    }
    return "?";
}

/// What this machine's CPU supports (CPUID and the OS's register-state support, via the compiler's builtins).
struct CpuFeatures {
    bool avx2 = false;
    bool avx512 = false;
    bool avx512_bf16 = false;  ///< vdpbf16ps / vcvtne2ps2bf16: the opt-in MathMode::BF16 kernels
    bool avx512_vnni = false;  ///< vpdpbusd: the opt-in WeightQuant::W8A8 kernels
    bool amx_bf16 = false;     ///< AMX-TILE + AMX-BF16 (tdpbf16ps) with the OS's tile state: MathMode::BF16 conv kernels
    bool amx_int8 = false;     ///< AMX-TILE + AMX-INT8 (tdpbusd) with the OS's tile state: WeightQuant::W8A8 conv kernels
};

/// Whether the CPU has AMX tiles with BF16 / INT8 multiplies and the OS saves their state (CPUID leaf 7 EDX bits
/// 24, 22, 25; XCR0 bits 17-18). Linux still refuses the instructions until the process asks (request_amx_permission).
inline void detect_amx(CpuFeatures& f) {
#if defined(FLOWEDGE_CPU_X86)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u, int8 = (d >> 25) & 1u;
    __cpuid(1, a, b, c, d);
    if (!tile || !((c >> 27) & 1u)) return;  // no tiles, or no OSXSAVE (xgetbv would fault)
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return;  // XTILECFG and XTILEDATA not enabled by the OS
    f.amx_bf16 = f.avx512_bf16 && bf16;
    f.amx_int8 = f.avx512_vnni && int8;
#else
    (void)f;
#endif
}

/// Asks Linux once per process for the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); a
/// refusal (old kernel, seccomp) means no AMX, since the first tile instruction would then fault.
inline bool request_amx_permission() {
#if defined(FLOWEDGE_CPU_X86) && defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
}

inline CpuFeatures detect_cpu_features() {
    CpuFeatures f;
#if defined(FLOWEDGE_CPU_X86)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#if defined(__clang__) || __GNUC__ >= 12
    f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
    f.avx512_vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
    detect_amx(f);
#endif
    return f;
}

/// Whether this machine runs kernel set i (the portable sets run everywhere).
inline bool isa_supported(Isa i, const CpuFeatures& f) {
    switch (i) {
        case Isa::Scalar:
        case Isa::Eigen: return true;
        case Isa::Avx2: return f.avx2;
        case Isa::Avx512: return f.avx512;
    }
    return false;
}

/// The best kernel set this machine runs: the hand-written x86 sets where the CPU has them, else Eigen's.
inline Isa best_isa(const CpuFeatures& f) {
    if (f.avx512) return Isa::Avx512;
    if (f.avx2) return Isa::Avx2;
    return Isa::Eigen;
}

/// True when environment variable `name` is set to exactly `value` (the A/B and escape-hatch switches).
inline bool env_is(const char* name, std::string_view value) {
    const char* v = std::getenv(name);
    return v && std::string_view(v) == value;
}

/// The kernel set a FLOWEDGE_CPU_ISA value asks for ("scalar", "eigen", "avx2", "avx512"; empty or unset = the best
/// one). A set the machine cannot run, or an unknown name, is an Error naming the choices.
inline Isa choose_isa(std::string_view requested, const CpuFeatures& f) {
    if (requested.empty()) return best_isa(f);
    for (Isa i : kAllIsas) {
        if (requested != isa_name(i)) continue;
        if (isa_supported(i, f)) return i;
        std::string runnable;
        for (Isa r : kAllIsas)
            if (isa_supported(r, f)) runnable += (runnable.empty() ? "" : ", ") + std::string(isa_name(r));
        fail(ErrorKind::Unsupported, "cpu", "FLOWEDGE_CPU_ISA=" + std::string(requested) + " is not supported by this CPU" +
                        expected_got("one of " + runnable, requested));
    }
    fail("cpu", "unknown FLOWEDGE_CPU_ISA" + expected_got("scalar, eigen, avx2 or avx512", requested));
}

namespace detail {
struct IsaState {
    CpuFeatures features;
    Isa isa;
    bool amx = false;  ///< the AMX conv kernels run (AVX-512 set chosen, not disabled, permission granted)
};
inline const IsaState& isa_state() {
    static const IsaState s = [] {
        IsaState st{detect_cpu_features(), Isa::Scalar};
        const char* env = std::getenv("FLOWEDGE_CPU_ISA");
        st.isa = choose_isa(env ? std::string_view(env) : std::string_view{}, st.features);
        // AMX extends the AVX-512 set only (FLOWEDGE_CPU_ISA=avx512 keeps it; FLOWEDGE_CPU_AMX=0 turns it off for
        // A/B runs); the permission is asked only where it would be used.
        const bool amx_off = env_is("FLOWEDGE_CPU_AMX", "0");
        st.amx = st.isa == Isa::Avx512 && (st.features.amx_bf16 || st.features.amx_int8) && !amx_off &&
                 request_amx_permission();
        return st;
    }();
    return s;
}
}  // namespace detail

/// The kernel set every Ops<Cpu> call of this process runs: the best the CPU supports, or FLOWEDGE_CPU_ISA's
/// choice (for A/B runs and tests). Fixed at the first call; weights packed at load follow it.
inline Isa active_isa() { return detail::isa_state().isa; }
/// Whether MathMode::BF16 has its vdpbf16ps kernels here (the AVX-512 set on a CPU with AVX512_BF16).
inline bool bf16_math_available() {
    return active_isa() == Isa::Avx512 && detail::isa_state().features.avx512_bf16;
}
/// Whether WeightQuant::W8A8 has kernels here: the AVX-512 set on a CPU with AVX512_VNNI (vpdpbusd), or the AVX2 set
/// (vpmaddubsw, with activations of 7 bits instead of 8: w8a8_activation_levels()).
inline bool w8a8_available() {
    return (active_isa() == Isa::Avx512 && detail::isa_state().features.avx512_vnni) || active_isa() == Isa::Avx2;
}
/// The steps - 1 each W8A8 activation column is quantised to here: 255 (vpdpbusd) or 127 (AVX2's vpmaddubsw, whose
/// int16 pair sums would saturate at 8 bits).
inline int w8a8_activation_levels() { return active_isa() == Isa::Avx512 ? 255 : 127; }
/// Whether MathMode::BF16 runs on AMX tiles (tdpbf16ps) here: the Conv1d on packed BF16 blocks and the small-row
/// products of packed_linear.hpp. bf16_math_available() and a CPU with AMX-BF16 whose tile state Linux granted, unless
/// FLOWEDGE_CPU_AMX=0.
inline bool amx_bf16_available() {
    return bf16_math_available() && detail::isa_state().amx && detail::isa_state().features.amx_bf16;
}
/// Whether W8A8 Conv1d runs on AMX tiles (tdpbusd) here: w8a8_available() and AMX-INT8, as amx_bf16_available().
inline bool amx_int8_available() {
    return active_isa() == Isa::Avx512 && w8a8_available() && detail::isa_state().amx && detail::isa_state().features.amx_int8;
}
/// One line for logs and benchmark records, e.g. "avx512 (+bf16) (+vnni) (+amx)".
inline std::string kernel_set_name() {
    std::string s(isa_name(active_isa()));
    if (bf16_math_available()) s += " (+bf16)";
    if (w8a8_available() && active_isa() == Isa::Avx512) s += " (+vnni)";
    if (amx_bf16_available() || amx_int8_available()) s += " (+amx)";
    return s;
}

}  // namespace flowedge::cpu
