// The doctest entry point shared by every flowedge test executable. A run with FLOWEDGE_CPU_ISA naming a CPU kernel
// set this machine cannot execute (the ops_*_avx2 / _scalar ctest entries on another CPU) is skipped (exit 77).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "flowedge/cpu/isa.hpp"

int main(int argc, char** argv) {
    if (const char* isa = std::getenv("FLOWEDGE_CPU_ISA")) {
        try {
            (void)flowedge::cpu::choose_isa(isa, flowedge::cpu::detect_cpu_features());
        } catch (const flowedge::Error& e) {
            std::fprintf(stderr, "%s: skipped\n", e.what());
            return 77;
        }
    }
    return doctest::Context(argc, argv).run();
}
