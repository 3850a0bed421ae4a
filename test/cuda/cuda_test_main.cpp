// doctest entry point for the GPU tests: exits 77 (reported by ctest as skipped) when no CUDA device is usable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "flowedge/cuda/device.hpp"

int main(int argc, char** argv) {
    if (!flowedge::cuda::device_available()) {
        std::printf("SKIP: %s\n", flowedge::cuda::device_description());
        return 77;
    }
    std::printf("flowedge cuda tests on %s\n", flowedge::cuda::device_description());
    doctest::Context ctx(argc, argv);
    return ctx.run();
}
