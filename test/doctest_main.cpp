// The doctest entry point shared by every flowedge test executable. A run with FLOWEDGE_CPU_ISA naming a CPU kernel
// set this machine cannot execute (the ops_*_avx2 / _scalar ctest entries on another CPU) is skipped (exit 77), and
// so is a kernel-set variant entry (FLOWEDGE_TEST_ISA_VARIANT=1) of the set the default entry of the same binary
// already runs here (the _avx2 entries on a CPU without AVX-512): same cases, same kernels, twice the time.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "flowedge/cpu/isa.hpp"

int main(int argc, char** argv) {
    if (const char* isa = std::getenv("FLOWEDGE_CPU_ISA")) {
        namespace cpu = flowedge::cpu;
        try {
            const cpu::CpuFeatures features = cpu::detect_cpu_features();
            const cpu::Isa chosen = cpu::choose_isa(isa, features);
            if (cpu::env_is("FLOWEDGE_TEST_ISA_VARIANT", "1") && chosen == cpu::best_isa(features)) {
                std::fprintf(stderr, "FLOWEDGE_CPU_ISA=%s is this CPU's default kernel set, which the default run of this "
                             "test covers: skipped\n", std::string(cpu::isa_name(chosen)).c_str());
                return 77;
            }
        } catch (const flowedge::Error& e) {
            std::fprintf(stderr, "%s: skipped\n", e.what());
            return 77;
        }
    }
    return doctest::Context(argc, argv).run();
}
