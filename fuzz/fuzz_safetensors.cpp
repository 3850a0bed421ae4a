// libFuzzer target: the safetensors header validator (SafeTensors::from_bytes) and every accessor on what it accepts.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace flowedge;
    std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size);
    std::shared_ptr<const io::SafeTensors> st;
    try {
        st = io::SafeTensors::from_bytes(std::move(bytes), "fuzz.safetensors");
    } catch (const Error&) {
        return 0;  // rejected cleanly
    }
    // Accepted: every entry must be in range and every accessor must behave.
    volatile float sink = 0.f;
    for (const auto& [k, v] : st->metadata()) sink = sink + float(k.size() + v.size());
    for (const io::TensorInfo& t : st->tensors()) {
        if (t.offset + t.bytes > st->file_size()) __builtin_trap();
        if (!st->contains(t.name) || st->info(t.name) != &t) __builtin_trap();
        // Touch the first and last byte of every entry whatever its dtype (ASan checks the range).
        if (t.bytes) sink = sink + float(std::to_integer<int>(t.raw[0]) + std::to_integer<int>(t.raw[t.bytes - 1]));
        try {
            const io::TensorInfo& r = st->at(t.name);
            if (!r.supported() || (r.data == nullptr && r.bytes != 0)) __builtin_trap();
            if (std::size_t(r.shape.numel()) * dtype_size(r.dtype) != r.bytes) __builtin_trap();
            if (r.bytes <= (std::size_t(1) << 20)) {
                const std::vector<float> v = st->read_f32(t.name);
                if (!v.empty()) sink = sink + v.front() + v.back();
            }
        } catch (const Error&) {
            if (t.supported()) __builtin_trap();  // a supported entry must not be refused
        }
    }
    try {
        (void)st->at("no such tensor \x01");
        __builtin_trap();
    } catch (const Error&) {
    }
    return 0;
}
