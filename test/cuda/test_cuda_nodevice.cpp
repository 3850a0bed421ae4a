// flowedge::cuda on any machine, GPU or not: the device query never throws, injected and real allocation
// failures are flowedge::Errors with a clear message, and Graph<Cuda> costs nothing until used.
#include <doctest/doctest.h>

#include <string>

#include "flowedge/cuda/graph.hpp"
#include "flowedge/ops.hpp"

using namespace flowedge;

TEST_CASE("device_available never throws and agrees with the description") {
    bool avail = false;
    CHECK_NOTHROW(avail = cuda::device_available());
    const std::string desc = cuda::device_description();
    MESSAGE("device: " << desc);
    CHECK(!desc.empty());
    if (!avail) CHECK(desc.find("no ") == 0);
}

TEST_CASE("injected allocation failure throws before touching CUDA and is not counted") {
    const std::size_t a0 = Memory<Cuda>::allocation_count();
    cuda::inject_allocation_failure(1);
    try {
        (void)Memory<Cuda>::allocate(256);
        FAIL("allocate must throw");
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.rfind("flowedge: cuda: cudaMalloc of 256 bytes failed: out of memory", 0) == 0);
    }
    CHECK(Memory<Cuda>::allocation_count() == a0);
}

TEST_CASE("without a device, allocate throws a flowedge::Error with the CUDA error and file:line") {
    if (cuda::device_available()) {
        void* p = Memory<Cuda>::allocate(64);
        CHECK(p != nullptr);
        Memory<Cuda>::deallocate(p);
        return;
    }
    const std::size_t a0 = Memory<Cuda>::allocation_count();
    try {
        (void)Memory<Cuda>::allocate(64);
        FAIL("allocate must throw without a device");
    } catch (const Error& e) {
        const std::string msg = e.what();
        MESSAGE(msg);
        CHECK(msg.rfind("flowedge: cuda: cudaMalloc of 64 bytes failed: ", 0) == 0);
        CHECK(msg.find("device.cu:") != std::string::npos);
        // No GPU or no driver at all reads as such, with what to do, not as a driver-version problem.
        if (std::string(cuda::device_description()).rfind("no NVIDIA GPU/driver found", 0) == 0) {
            CHECK(msg.find("failed: no NVIDIA GPU/driver found (") != std::string::npos);
            CHECK(msg.size() >= 18);
            CHECK(msg.substr(msg.size() - 18) == "; use --device cpu");
        }
    }
    CHECK(Memory<Cuda>::allocation_count() == a0 + 1);
}

TEST_CASE("Graph<Cuda> construction, move and destruction make no CUDA calls") {
    Graph<Cuda> g;
    CHECK(g.n_recorded() == 0);
    Graph<Cuda> h(std::move(g));
    g = std::move(h);
    g.reset();
    CHECK(g.n_recorded() == 0);
}
