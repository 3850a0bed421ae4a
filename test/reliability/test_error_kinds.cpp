// Error kinds: representative failures of each category carry the right flowedge::ErrorKind (what the C API and
// the Python module map to status codes and exception classes), and the message keeps its canonical form.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flowedge/cpu/memory.hpp"
#include "flowedge/io/npy.hpp"
#include "flowedge/io/safetensors.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/mamba_flow/policy.hpp"
#include "../support/cpu_models_diffusion_head.hpp"
#include "../support/cpu_models_mamba_flow.hpp"
#include "flowedge/residency.hpp"
#include "reliability_util.hpp"

using namespace flowedge;

namespace {

/// Runs `f`, which must throw a flowedge::Error of `kind` whose message contains `needle`.
void expect_kind(const std::function<void()>& f, ErrorKind kind, std::string_view needle, const char* what) {
    CAPTURE(what);
    bool threw = false;
    try {
        f();
    } catch (const Error& e) {
        threw = true;
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.rfind("flowedge: ", 0) == 0);
        CHECK(msg.find(needle) != std::string::npos);
        CHECK_MESSAGE(e.kind() == kind, "kind " << error_kind_name(e.kind()) << ", expected " << error_kind_name(kind));
    }
    CHECK_MESSAGE(threw, "expected a flowedge::Error for: " << what);
}

}  // namespace

TEST_CASE("fail() keeps the message form and defaults to BadInput") {
    expect_kind([] { fail("component", "what" + expected_got(1, 2)); }, ErrorKind::BadInput,
                "flowedge: component: what (expected 1, got 2)", "two-argument fail");
    expect_kind([] { fail(ErrorKind::Device, "cuda", "lost"); }, ErrorKind::Device, "flowedge: cuda: lost", "fail with a kind");
    expect_kind([] { check(false, ErrorKind::BadState, "mamba", "x"); }, ErrorKind::BadState, "flowedge: mamba: x", "check with a kind");
    CHECK(std::string(error_kind_name(ErrorKind::OutOfMemory)) == "out of memory");
}

TEST_CASE("file readers: missing is Io, malformed is BadFile, valid but unreadable is Unsupported") {
    reliability::TempDir tmp("kinds");
    expect_kind([&] { (void)io::SafeTensors::open(tmp.path / "missing.safetensors"); }, ErrorKind::Io, "cannot open file",
                "missing safetensors");
    expect_kind([&] { (void)io::SafeTensors::open(tmp.path); }, ErrorKind::Io, "is a directory", "directory as safetensors");
    expect_kind([&] { (void)io::read_npy_f32(tmp.path / "missing.npy"); }, ErrorKind::Io, "no such file", "missing npy");
    expect_kind([&] { (void)DiffusionHead<Cpu>::load(tmp.path / "nope"); }, ErrorKind::Io, "no such file or folder",
                "missing LeRobot folder");

    const auto garbage = tmp.path / "garbage.safetensors";
    { std::ofstream(garbage, std::ios::binary) << "this is not a safetensors file at all, just text"; }
    expect_kind([&] { (void)io::SafeTensors::open(garbage); }, ErrorKind::BadFile, "not a safetensors file", "garbage bytes");
    expect_kind([&] { (void)DiffusionHead<Cpu>::load(tmp.path); }, ErrorKind::BadFile, "no config.json",
                "folder without config.json");
    expect_kind([&] { (void)FlowHead<Cpu>::load(reliability::backbone_only_file()); }, ErrorKind::BadFile, "no flow head",
                "FlowHead from a backbone-only file");

    // A well-formed file whose tensor has a dtype flowedge does not read.
    io::SafeTensorsWriter w;
    const std::vector<std::int64_t> steps = {1, 2, 3};
    w.add_raw("steps", "I64", {3}, std::as_bytes(std::span(steps)));
    const auto file = io::SafeTensors::from_bytes(w.bytes());
    expect_kind([&] { (void)file->find("steps"); }, ErrorKind::Unsupported, "unsupported dtype", "I64 tensor");

    const auto f64 = tmp.path / "f64.npy";
    {
        std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }";
        header.append(64 - (10 + header.size() + 1) % 64, ' ').push_back('\n');
        std::ofstream out(f64, std::ios::binary);
        out << "\x93NUMPY" << char(1) << char(0) << char(header.size() & 0xff) << char(header.size() >> 8) << header;
        const double one = 1.0;
        out.write(reinterpret_cast<const char*>(&one), sizeof one);
    }
    expect_kind([&] { (void)io::read_npy_f32(f64); }, ErrorKind::Unsupported, "expected float32 .npy, got float64", "float64 npy");
}

TEST_CASE("calls: bad values, wrong sizes, non-finite inputs, missing parts, bad states") {
    auto h = DiffusionHead<Cpu>::load(reliability::dp_small(), {}, /*max_batch=*/1);
    const auto& c = h.config();
    const std::size_t nc = std::size_t(c.global_cond_dim), nx = std::size_t(c.horizon) * c.action_dim;
    std::vector<float> cond(nc, 0.1f), noise(nx, 0.2f), out(nx);
    SampleOptions o;
    o.steps = 2;
    expect_kind([&] { h.sample(std::span(cond).first(nc - 1), noise, out, o); }, ErrorKind::BadShape,
                "condition has the wrong size", "short condition");
    expect_kind([&] { h.sample(cond, noise, out, o, 2); }, ErrorKind::BadInput, "batch out of range", "batch > max_batch");
    expect_kind([] { (void)parse_scheduler("euler"); }, ErrorKind::BadInput, "unknown scheduler", "unknown scheduler name");
    cond[0] = std::numeric_limits<float>::quiet_NaN();
    expect_kind([&] { h.sample(cond, noise, out, o); }, ErrorKind::NonFinite, "non-finite condition", "NaN condition");

    auto head_only = MambaFlowPolicy<Cpu>::load(reliability::head_only_file());
    expect_kind([&] { (void)head_only.backbone(); }, ErrorKind::Unsupported, "no backbone", "backbone() on a head-only file");

    auto m = Mamba<Cpu>::load(reliability::mamba_flow_file(), {}, /*max_tokens=*/8);
    std::vector<std::byte> state = m.export_state();
    state[0] = std::byte{0};  // the first byte of the magic
    expect_kind([&] { m.import_state(state); }, ErrorKind::BadState, "bad magic", "state with a bad magic");
}

TEST_CASE("resources and devices: OutOfMemory, Device") {
    REQUIRE(Memory<Cpu>::physical_bytes() > 0);  // Linux reports it; check_fits is a no-op without it
    expect_kind([] { Memory<Cpu>::check_fits(std::numeric_limits<std::size_t>::max() / 2, "a test buffer"); },
                ErrorKind::OutOfMemory, "out of host memory", "more than physical memory");

    // FLOWEDGE_CUDA_REQUIRED with an upload that cannot happen (skipped here) is a device failure at load.
    const ResidencyFlags required{/*cuda_required=*/true, /*cuda_force_host=*/true};
    expect_kind(
        [&] {
            (void)Resident<FlowHead>::load(Device::Cuda, required,
                                           [](auto b) { return FlowHead<decltype(b)>::load(reliability::head_only_file()); });
        },
        ErrorKind::Device, "FLOWEDGE_CUDA_REQUIRED=1", "REQUIRED without an upload");
    auto cpu = Resident<FlowHead>::load(Device::Cpu, {}, [](auto b) { return FlowHead<decltype(b)>::load(reliability::head_only_file()); });
    expect_kind([&] { cpu.require(Device::Cuda, "test"); }, ErrorKind::Device, "not resident on the GPU", "require(cuda) on a CPU model");
}
