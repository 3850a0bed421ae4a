// libFuzzer target: Mamba decode-state import (versioned, checksummed header) on the fixture backbone; an
// accepted state is then stepped once. Mode byte 0: the input is the whole state; mode 1: the input is the
// payload and the harness writes a valid header + checksum, so arbitrary state values reach step().
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/models/mamba_flow/mamba.hpp"

namespace {
flowedge::Mamba<flowedge::Cpu>& model() {
    static auto m = std::make_unique<flowedge::Mamba<flowedge::Cpu>>(
        flowedge::Mamba<flowedge::Cpu>::load(FLOWEDGE_FIXTURES_DIR "/mamba_flow/mamba_flow_backbone_only.safetensors", {}, 8));
    return *m;
}
/// A valid exported state (header of this model), used to frame mode-1 payloads.
const std::vector<std::byte>& reference_state() {
    static const std::vector<std::byte> s = [] {
        auto& m = model();
        m.reset();
        std::vector<float> h(std::size_t(m.config().d_model));
        m.step(3, h);
        return m.export_state();
    }();
    return s;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace flowedge;
    if (size < 1) return 0;
    auto& m = model();
    const std::vector<std::byte>& ref = reference_state();
    std::vector<std::byte> in;
    const auto* p = reinterpret_cast<const std::byte*>(data + 1);
    if (data[0] & 1) {
        // Mode 1: payload from the input (padded/truncated to the right size), header + checksum made valid.
        in = ref;
        const std::size_t payload = in.size() - Mamba<Cpu>::kStateHeaderBytes;
        const std::size_t n = std::min(payload, size - 1);
        std::memset(in.data() + Mamba<Cpu>::kStateHeaderBytes, 0, payload);
        std::memcpy(in.data() + Mamba<Cpu>::kStateHeaderBytes, p, n);
        const std::uint64_t sum = detail::fnv1a(in.data() + Mamba<Cpu>::kStateHeaderBytes, payload);
        std::memcpy(in.data() + 8 + 8 * 4 + 8 + 8, &sum, 8);  // checksum: after magic, 8 u32, model_id, payload_bytes
    } else {
        in.assign(p, p + (size - 1));
    }
    const std::vector<std::byte> before = m.export_state();
    bool accepted = false;
    try {
        m.import_state(in);
        accepted = true;
    } catch (const Error&) {
        // A rejected state must leave the model's state untouched.
        if (m.export_state() != before) __builtin_trap();
    }
    if (accepted) {
        if ((data[0] & 1) == 0 && m.export_state() != in) __builtin_trap();
        std::vector<float> h(std::size_t(m.config().d_model));
        try {
            m.step(std::int32_t(size % std::size_t(m.config().vocab)), h);
        } catch (const Error&) {
        }
    }
    return 0;
}
