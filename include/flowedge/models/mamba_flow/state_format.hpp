// The portable binary form of a Mamba decode state (Mamba::export_state / import_state): a versioned 80-byte header
// (shape fingerprint, model id, FNV-1a checksum of the payload) followed by the raw float conv and ssm states.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "flowedge/error.hpp"

namespace flowedge {

namespace detail {
/// 64-bit FNV-1a, continuing from `h` (start with kFnvOffset).
inline constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = kFnvOffset) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
}  // namespace detail

/// Header fields of a serialised Mamba state. Byte layout (little-endian host): magic[8], then version,
/// header_bytes, n_layers, d_model, d_inner, d_state, d_conv, dt_rank (u32 each), then model_id, payload_bytes,
/// checksum (u64 each), zero padding up to MambaStateFormat::kHeaderBytes.
struct MambaStateHeader {
    char magic[8] = {'F', 'E', 'M', 'A', 'M', 'B', 'A', '1'};
    std::uint32_t version = 1;
    std::uint32_t header_bytes = 80;
    std::uint32_t n_layers = 0, d_model = 0, d_inner = 0, d_state = 0, d_conv = 0, dt_rank = 0;
    std::uint64_t model_id = 0;
    std::uint64_t payload_bytes = 0;
    std::uint64_t checksum = 0;
};

/// Writing, reading and validating the header of a serialised Mamba state.
struct MambaStateFormat {
    /// Version written into headers; check() accepts only this one.
    static constexpr std::uint32_t kVersion = 1;
    /// Bytes of the header that precedes the float payload.
    static constexpr std::size_t kHeaderBytes = 80;
    /// Header bytes carrying fields (magic, 8 x u32, 3 x u64); the rest up to kHeaderBytes is reserved (zero).
    static constexpr std::size_t kHeaderUsedBytes = 8 + 8 * 4 + 3 * 8;
    static_assert(MambaStateHeader{}.version == kVersion && MambaStateHeader{}.header_bytes == kHeaderBytes);

    static void write(const MambaStateHeader& h, std::byte* dst) {
        std::memset(dst, 0, kHeaderBytes);
        std::size_t o = 0;
        auto put = [&](const void* v, std::size_t n) { std::memcpy(dst + o, v, n); o += n; };
        put(h.magic, 8);
        for (std::uint32_t v : {h.version, h.header_bytes, h.n_layers, h.d_model, h.d_inner, h.d_state, h.d_conv, h.dt_rank})
            put(&v, 4);
        for (std::uint64_t v : {h.model_id, h.payload_bytes, h.checksum}) put(&v, 8);
    }

    static MambaStateHeader read(const std::byte* src) {
        MambaStateHeader h;
        std::size_t o = 0;
        auto get = [&](void* v, std::size_t n) { std::memcpy(v, src + o, n); o += n; };
        get(h.magic, 8);
        for (std::uint32_t* v : {&h.version, &h.header_bytes, &h.n_layers, &h.d_model, &h.d_inner, &h.d_state, &h.d_conv, &h.dt_rank})
            get(v, 4);
        for (std::uint64_t* v : {&h.model_id, &h.payload_bytes, &h.checksum}) get(v, 8);
        return h;
    }

    /// Throws (component "mamba") unless `in` is a whole state of the model `want` describes (want.checksum is
    /// ignored): magic, version, header size, zero reserved bytes, shape, model id, total size and payload checksum.
    static void check(std::span<const std::byte> in, const MambaStateHeader& want) {
        const std::size_t total = kHeaderBytes + want.payload_bytes;
        if (in.size() < kHeaderBytes)
            fail(ErrorKind::BadState, "mamba", "import_state: truncated state" + expected_got(total, in.size()));
        const MambaStateHeader got = read(in.data());
        if (std::memcmp(got.magic, want.magic, sizeof got.magic) != 0)
            fail(ErrorKind::BadState, "mamba", "import_state: not a flowedge Mamba state (bad magic)");
        if (got.version != kVersion)
            fail(ErrorKind::BadState, "mamba", "import_state: unsupported state version" + expected_got(kVersion, got.version));
        if (got.header_bytes != kHeaderBytes)
            fail(ErrorKind::BadState, "mamba", "import_state: bad header size field" + expected_got(kHeaderBytes, got.header_bytes));
        for (std::size_t i = kHeaderUsedBytes; i < kHeaderBytes; ++i)
            if (in[i] != std::byte{0})
                fail(ErrorKind::BadState, "mamba", "import_state: reserved header byte " + std::to_string(i) + " is not zero" +
                                  expected_got(0, std::to_integer<int>(in[i])));
        auto shape_str = [](const MambaStateHeader& h) {
            return "n_layers " + std::to_string(h.n_layers) + ", d_model " + std::to_string(h.d_model) + ", d_inner " +
                   std::to_string(h.d_inner) + ", d_state " + std::to_string(h.d_state) + ", d_conv " +
                   std::to_string(h.d_conv) + ", dt_rank " + std::to_string(h.dt_rank);
        };
        if (got.n_layers != want.n_layers || got.d_model != want.d_model || got.d_inner != want.d_inner ||
            got.d_state != want.d_state || got.d_conv != want.d_conv || got.dt_rank != want.dt_rank)
            fail(ErrorKind::BadState, "mamba", "import_state: state of a model with another shape" + expected_got(shape_str(want), shape_str(got)));
        if (got.model_id != want.model_id)
            fail(ErrorKind::BadState, "mamba", "import_state: state of another model (same shape, other weights)" +
                              expected_got(std::to_string(want.model_id), std::to_string(got.model_id)));
        if (got.payload_bytes != want.payload_bytes || in.size() != total)
            fail(ErrorKind::BadState, "mamba", "import_state: wrong state size" + expected_got(total, in.size()));
        const std::uint64_t sum = detail::fnv1a(in.data() + kHeaderBytes, std::size_t(want.payload_bytes));
        if (sum != got.checksum)
            fail(ErrorKind::BadState, "mamba", "import_state: checksum mismatch, the state is corrupted" +
                              expected_got(std::to_string(got.checksum), std::to_string(sum)));
    }
};

}  // namespace flowedge
