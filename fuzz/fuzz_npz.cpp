// libFuzzer target: the .npz reader (Npz::parse: end records, central and local headers, zip64 fields, data
// descriptors, inflate, CRC-32, member .npy headers) and every accessor on what it accepts, plus a writer round trip.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/io/npz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace flowedge;
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    std::optional<io::Npz> z;
    try {
        z = io::Npz::parse(bytes, "fuzz.npz");
    } catch (const Error&) {
        return 0;  // rejected cleanly
    }
    // Accepted: names are unique and non-empty, headers re-parse to the recorded info, typed reads agree with it.
    volatile std::size_t sink = 0;
    const auto& members = z->members();
    for (std::size_t i = 0; i < members.size(); ++i) {
        const io::NpzMember& m = members[i];
        if (m.name.empty()) __builtin_trap();
        for (std::size_t j = 0; j < i; ++j)
            if (members[j].name == m.name) __builtin_trap();
        const io::NpzArrayInfo& info = z->info(m.name);
        const io::detail::NpyLayout layout = io::detail::parse_npy_layout(m.npy, "again");  // accepted once: must again
        if (layout.header.descr != info.descr || layout.header.shape != info.shape) __builtin_trap();
        auto typed = [&](auto read, std::size_t elem, bool matches) {
            try {
                const auto a = read();
                if (!matches || a.data.size() * elem != m.npy.size() - layout.data_start) __builtin_trap();
                if (std::int64_t(a.data.size()) != a.numel()) __builtin_trap();
                sink = sink + a.data.size();
            } catch (const Error&) {
                // a matching dtype may still be refused for its data size or Fortran order, never for the dtype
            }
        };
        const std::string& d = info.descr;
        typed([&] { return z->f32(m.name); }, 4, d == "<f4" || d == "=f4");
        typed([&] { return z->i32(m.name); }, 4, d == "<i4" || d == "=i4");
        typed([&] { return z->u8(m.name); }, 1, d.size() == 3 && d.substr(1) == "u1" && std::string_view("|<>=").find(d[0]) != std::string_view::npos);
    }
    try {
        (void)z->info("no such array \x01");
        __builtin_trap();
    } catch (const Error&) {
    }
    // What was read writes back (stored) and reads again to the same members.
    io::NpzWriter w;
    for (const io::NpzMember& m : members) w.add(m);
    const io::Npz again = io::Npz::parse(w.bytes(), "rewritten");
    if (again.members().size() != members.size()) __builtin_trap();
    for (std::size_t i = 0; i < members.size(); ++i)
        if (again.members()[i].name != members[i].name || again.members()[i].npy != members[i].npy) __builtin_trap();
    return 0;
}
