// Minimal .npy (NumPy array file, format v1/v2/v3) reader/writer for float32, int32 and uint8 (camera frames),
// little-endian C order: the interchange format of the programs' --cond/--noise/--obs/--out flags and of the
// reference fixtures.
// (No maintained .npy C++ library is packaged for Debian; the format is small and fully tested in test/io.)
#pragma once
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "flowedge/error.hpp"

static_assert(std::endian::native == std::endian::little, "flowedge: .npy I/O assumes a little-endian host");

namespace flowedge::io {

/// A loaded array: shape (any rank; empty for a 0-d scalar) and its row-major (C order) elements.
template <class T>
struct NpyArray {
    std::vector<std::int64_t> shape;
    std::vector<T> data;
    /// Product of the shape (1 for a 0-d array).
    std::int64_t numel() const {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        return n;
    }
};
using NpyArrayF32 = NpyArray<float>;
using NpyArrayI32 = NpyArray<std::int32_t>;
using NpyArrayU8 = NpyArray<std::uint8_t>;

namespace detail {

template <class T> constexpr std::string_view npy_descr();
template <> constexpr std::string_view npy_descr<float>() { return "<f4"; }
template <> constexpr std::string_view npy_descr<std::int32_t>() { return "<i4"; }
template <> constexpr std::string_view npy_descr<std::uint8_t>() { return "|u1"; }

/// numpy's name for a dtype descr ("<f8" -> "float64", "|u1" -> "uint8"); the descr itself when it has none here.
inline std::string npy_type_name(std::string_view descr) {
    const std::string_view d = (!descr.empty() && std::string_view("<>=|").find(descr[0]) != std::string_view::npos)
                                   ? descr.substr(1)
                                   : descr;
    if (d == "b1") return "bool";
    if (d.size() == 2 && (d[0] == 'f' || d[0] == 'i' || d[0] == 'u') && std::string_view("1248").find(d[1]) != std::string_view::npos) {
        const int bits = (d[1] - '0') * 8;
        return std::string(d[0] == 'f' ? "float" : d[0] == 'i' ? "int" : "uint") + std::to_string(bits);
    }
    return "dtype '" + std::string(descr) + "'";
}

/// A malformed .npy file (BadFile) unless `kind` says otherwise (Unsupported for valid numpy files flowedge does not read).
[[noreturn]] inline void npy_fail(const std::string& where, const std::string& what, ErrorKind kind = ErrorKind::BadFile) {
    fail(kind, "npy", where + ": " + what);
}

/// The header dict of a .npy file: {'descr': <str>, 'fortran_order': <bool>, 'shape': <tuple of ints>}.
struct NpyHeader {
    std::string descr;
    bool fortran_order = false;
    std::vector<std::int64_t> shape;
};

/// Parses the Python-literal header dict exactly as numpy writes it (keys in any order, optional trailing
/// comma, trailing spaces/newline); every other key, value form or syntax error is an Error.
inline NpyHeader parse_npy_header(std::string_view h, const std::string& where) {
    std::size_t i = 0;
    auto ws = [&] { while (i < h.size() && (h[i] == ' ' || h[i] == '\t' || h[i] == '\n' || h[i] == '\r')) ++i; };
    auto bad = [&](const std::string& what) -> void {
        npy_fail(where, "malformed header (" + what + " at offset " + std::to_string(i) + ")");
    };
    auto expect = [&](char c) {
        ws();
        if (i >= h.size() || h[i] != c) bad(std::string("expected '") + c + "'");
        ++i;
    };
    auto string_lit = [&]() {
        ws();
        if (i >= h.size() || (h[i] != '\'' && h[i] != '"')) bad("expected a quoted string");
        const char q = h[i++];
        const std::size_t b = i;
        while (i < h.size() && h[i] != q) {
            if (h[i] == '\\') bad("escape sequences are not supported");
            ++i;
        }
        if (i >= h.size()) bad("unterminated string");
        return std::string(h.substr(b, i++ - b));
    };
    NpyHeader out;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{');
    for (;;) {
        ws();
        if (i < h.size() && h[i] == '}') { ++i; break; }
        const std::string key = string_lit();
        expect(':');
        ws();
        if (key == "descr") {
            if (seen_descr) npy_fail(where, "header repeats key 'descr'");
            seen_descr = true;
            if (i < h.size() && h[i] == '[') npy_fail(where, "structured dtypes are not supported (expected '<f4', '<i4' or '|u1')", ErrorKind::Unsupported);
            out.descr = string_lit();
        } else if (key == "fortran_order") {
            if (seen_fortran) npy_fail(where, "header repeats key 'fortran_order'");
            seen_fortran = true;
            if (h.substr(i, 4) == "True") { out.fortran_order = true; i += 4; }
            else if (h.substr(i, 5) == "False") { out.fortran_order = false; i += 5; }
            else bad("fortran_order must be True or False");
        } else if (key == "shape") {
            if (seen_shape) npy_fail(where, "header repeats key 'shape'");
            seen_shape = true;
            expect('(');
            for (;;) {
                ws();
                if (i < h.size() && h[i] == ')') { ++i; break; }
                if (i < h.size() && h[i] == '-') npy_fail(where, "shape has a negative dimension");
                if (i >= h.size() || h[i] < '0' || h[i] > '9') bad("shape entries must be non-negative integers");
                std::uint64_t v = 0;
                while (i < h.size() && h[i] >= '0' && h[i] <= '9') {
                    const std::uint64_t digit = std::uint64_t(h[i] - '0');
                    if (v > (std::uint64_t(std::numeric_limits<std::int64_t>::max()) - digit) / 10)
                        npy_fail(where, "shape dimension is too large");
                    v = v * 10 + digit;
                    ++i;
                }
                if (i < h.size() && h[i] == 'L') ++i;  // Python 2 long suffix
                out.shape.push_back(static_cast<std::int64_t>(v));
                ws();
                if (i < h.size() && h[i] == ',') { ++i; continue; }
                if (i < h.size() && h[i] == ')') { ++i; break; }
                bad("expected ',' or ')' in shape");
            }
        } else {
            npy_fail(where, "header has unexpected key '" + key + "' (expected descr, fortran_order, shape)");
        }
        ws();
        if (i < h.size() && h[i] == ',') { ++i; continue; }
        if (i < h.size() && h[i] == '}') { ++i; break; }
        bad("expected ',' or '}'");
    }
    ws();
    if (i != h.size()) bad("trailing characters after the header dict");
    if (!seen_descr) npy_fail(where, "header has no 'descr'");
    if (!seen_fortran) npy_fail(where, "header has no 'fortran_order'");
    if (!seen_shape) npy_fail(where, "header has no 'shape'");
    return out;
}

/// A .npy image's validated preamble: its header dict and where the element bytes start.
struct NpyLayout {
    NpyHeader header;
    std::size_t data_start = 0;
};

/// Validates magic, version and header of a .npy image (not the dtype or the data size).
inline NpyLayout parse_npy_layout(std::span<const std::byte> b, const std::string& where) {
    auto u8 = [&](std::size_t k) { return std::to_integer<unsigned>(b[k]); };
    static constexpr unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    if (b.size() < 10) npy_fail(where, "file is truncated" + expected_got("at least 10 bytes", std::to_string(b.size()) + " bytes"));
    for (std::size_t k = 0; k < 6; ++k)
        if (u8(k) != magic[k]) npy_fail(where, "not a .npy file (bad magic)");
    const unsigned major = u8(6), minor = u8(7);
    std::size_t header_len = 0, start = 0;
    if (major == 1) {
        header_len = u8(8) | (std::size_t(u8(9)) << 8);
        start = 10;
    } else if (major == 2 || major == 3) {
        if (b.size() < 12) npy_fail(where, "file is truncated" + expected_got("at least 12 bytes", std::to_string(b.size()) + " bytes"));
        for (std::size_t k = 0; k < 4; ++k) header_len |= std::size_t(u8(8 + k)) << (8 * k);
        start = 12;
    } else {
        npy_fail(where, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                            " (expected 1.0, 2.0 or 3.0)", ErrorKind::Unsupported);
    }
    if (minor != 0)
        npy_fail(where, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                            " (expected 1.0, 2.0 or 3.0)", ErrorKind::Unsupported);
    if (header_len > b.size() - start)
        npy_fail(where, "header runs past the end of the file" +
                            expected_got("<= " + std::to_string(b.size() - start) + " bytes", std::to_string(header_len) + " bytes"));
    return {parse_npy_header(std::string_view(reinterpret_cast<const char*>(b.data() + start), header_len), where),
            start + header_len};
}

/// Validates a whole .npy image and copies its elements as T.
template <class T>
NpyArray<T> parse_npy(std::span<const std::byte> b, const std::string& where) {
    const NpyLayout layout = parse_npy_layout(b, where);
    const NpyHeader& hdr = layout.header;
    const std::string_view want = npy_descr<T>();
    if (hdr.descr != want) {
        const bool same_kind = hdr.descr.size() == 3 && hdr.descr.substr(1) == want.substr(1);
        // One-byte elements have no byte order: numpy writes '|u1', but '<u1', '>u1' and '=u1' are the same array.
        const bool one_byte_any_order = same_kind && sizeof(T) == 1 && std::string_view("<>=").find(hdr.descr[0]) != std::string_view::npos;
        // The fix is one numpy call; name it with numpy's dtype names, as the caller would type it.
        const std::string want_name = npy_type_name(want);
        if (same_kind && hdr.descr[0] == '>' && !one_byte_any_order)
            npy_fail(where, "big-endian dtype '" + hdr.descr + "' is not supported" + expected_got(std::string(want), hdr.descr) +
                                ": convert with arr.astype('" + std::string(want) + "')", ErrorKind::Unsupported);
        if (!(same_kind && hdr.descr[0] == '=') && !one_byte_any_order)  // '=' is native order, i.e. little-endian here
            npy_fail(where, "expected " + want_name + " .npy, got " + npy_type_name(hdr.descr) + " ('" + hdr.descr +
                                "'): convert with arr.astype(np." + want_name + ")", ErrorKind::Unsupported);
    }
    if (hdr.fortran_order) npy_fail(where, "fortran_order arrays are not supported (save with C order)", ErrorKind::Unsupported);
    std::uint64_t n = 1;
    for (auto d : hdr.shape)
        if (__builtin_mul_overflow(n, std::uint64_t(d), &n)) npy_fail(where, "shape element count overflows");
    std::uint64_t want_bytes = 0;
    if (__builtin_mul_overflow(n, std::uint64_t(sizeof(T)), &want_bytes)) npy_fail(where, "shape byte size overflows");
    const std::size_t data_start = layout.data_start;
    const std::size_t have = b.size() - data_start;
    if (have != want_bytes)
        npy_fail(where, std::string(have < want_bytes ? "data is truncated" : "file has trailing bytes") +
                            ": data size does not match shape" +
                            expected_got(std::to_string(want_bytes) + " bytes", std::to_string(have) + " bytes"));
    NpyArray<T> out;
    out.shape = hdr.shape;
    out.data.resize(static_cast<std::size_t>(n));
    if (n) std::memcpy(out.data.data(), b.data() + data_start, static_cast<std::size_t>(want_bytes));
    return out;
}

/// The complete .npy image (v1.0, or v2.0 when the header exceeds 65535 bytes), header padded to 64 bytes.
template <class T>
std::vector<std::byte> npy_bytes(std::span<const std::int64_t> shape, std::span<const T> values, const std::string& where) {
    std::uint64_t n = 1;
    for (auto d : shape) {
        if (d < 0) npy_fail(where, "shape has a negative dimension " + std::to_string(d), ErrorKind::BadInput);
        if (__builtin_mul_overflow(n, std::uint64_t(d), &n)) npy_fail(where, "shape element count overflows", ErrorKind::BadInput);
    }
    if (n != values.size())
        npy_fail(where, "shape does not match the number of values" + expected_got(std::to_string(n), std::to_string(values.size())),
                 ErrorKind::BadShape);
    std::string dims;
    for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
    if (shape.size() == 1) dims += ",";
    std::string header = "{'descr': '" + std::string(npy_descr<T>()) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
    const bool v2 = header.size() + 1 + 10 > 65535;
    const std::size_t pre = v2 ? 12 : 10;
    header.append((64 - (pre + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::vector<std::byte> out;
    out.reserve(pre + header.size() + values.size_bytes());
    for (unsigned char c : {0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59}) out.push_back(std::byte(c));
    out.push_back(std::byte(v2 ? 2 : 1));
    out.push_back(std::byte(0));
    const std::uint64_t hl = header.size();
    for (std::size_t k = 0; k < pre - 8; ++k) out.push_back(std::byte((hl >> (8 * k)) & 0xffu));
    for (char c : header) out.push_back(static_cast<std::byte>(c));
    const auto* p = reinterpret_cast<const std::byte*>(values.data());
    out.insert(out.end(), p, p + values.size_bytes());
    return out;
}

inline std::vector<std::byte> read_file_bytes(const std::filesystem::path& path, std::string_view component) {
    const std::string where = path.string();
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (st.type() == std::filesystem::file_type::not_found) fail(ErrorKind::Io, component, where + ": no such file");
    if (st.type() == std::filesystem::file_type::directory) fail(ErrorKind::Io, component, where + ": is a directory (expected a file)");
    std::ifstream f(path, std::ios::binary);
    if (!f) fail(ErrorKind::Io, component, where + ": cannot open file");
    std::vector<std::byte> bytes;
    char buf[65536];
    while (f) {
        f.read(buf, sizeof buf);
        const auto got = static_cast<std::size_t>(f.gcount());
        const auto* p = reinterpret_cast<const std::byte*>(buf);
        bytes.insert(bytes.end(), p, p + got);
    }
    if (f.bad()) fail(ErrorKind::Io, component, where + ": read error");
    return bytes;
}

inline void write_file_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes, std::string_view component) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) fail(ErrorKind::Io, component, "cannot write '" + path.string() + "': cannot open for writing");
    errno = 0;
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
        const int err = errno;  // the stream keeps no cause; the failed write() or close() left it here
        fail(ErrorKind::Io, component, "cannot write '" + path.string() + "': " + (err ? std::generic_category().message(err) : "write failed"));
    }
}

template <class T>
NpyArray<T> read_npy(const std::filesystem::path& path) {
    const std::vector<std::byte> bytes = read_file_bytes(path, "npy");
    return parse_npy<T>(bytes, path.string());
}

template <class T>
void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::span<const T> values) {
    write_file_bytes(path, npy_bytes<T>(shape, values, path.string()), "npy");
}

}  // namespace detail

/// Reads a float32 ('<f4', C order) .npy file; any other dtype, big-endian or Fortran order is an Error.
inline NpyArray<float> read_npy_f32(const std::filesystem::path& p) { return detail::read_npy<float>(p); }
/// Reads an int32 ('<i4', C order) .npy file; any other dtype, big-endian or Fortran order is an Error.
inline NpyArray<std::int32_t> read_npy_i32(const std::filesystem::path& p) { return detail::read_npy<std::int32_t>(p); }
/// Reads a uint8 ('|u1', C order) .npy file (camera frames); any other dtype or Fortran order is an Error.
inline NpyArray<std::uint8_t> read_npy_u8(const std::filesystem::path& p) { return detail::read_npy<std::uint8_t>(p); }
/// Parses an in-memory .npy image (tests, embedded data); `name` is used in error messages.
inline NpyArray<float> parse_npy_f32(std::span<const std::byte> bytes, const std::string& name = "<memory>") {
    return detail::parse_npy<float>(bytes, name);
}
inline NpyArray<std::int32_t> parse_npy_i32(std::span<const std::byte> bytes, const std::string& name = "<memory>") {
    return detail::parse_npy<std::int32_t>(bytes, name);
}
inline NpyArray<std::uint8_t> parse_npy_u8(std::span<const std::byte> bytes, const std::string& name = "<memory>") {
    return detail::parse_npy<std::uint8_t>(bytes, name);
}
/// Writes `values` (row-major, numel(shape) of them) as a '<f4' .npy v1.0 file.
inline void write_npy_f32(const std::filesystem::path& p, std::span<const std::int64_t> shape, std::span<const float> v) {
    detail::write_npy<float>(p, shape, v);
}
/// Writes `values` (row-major, numel(shape) of them) as a '<i4' .npy v1.0 file.
inline void write_npy_i32(const std::filesystem::path& p, std::span<const std::int64_t> shape, std::span<const std::int32_t> v) {
    detail::write_npy<std::int32_t>(p, shape, v);
}
/// Writes `values` (row-major, numel(shape) of them) as a '|u1' .npy v1.0 file.
inline void write_npy_u8(const std::filesystem::path& p, std::span<const std::int64_t> shape, std::span<const std::uint8_t> v) {
    detail::write_npy<std::uint8_t>(p, shape, v);
}
/// In-memory .npy images (same bytes the writers put in a file).
inline std::vector<std::byte> npy_bytes_f32(std::span<const std::int64_t> shape, std::span<const float> v) {
    return detail::npy_bytes<float>(shape, v, "<memory>");
}
inline std::vector<std::byte> npy_bytes_i32(std::span<const std::int64_t> shape, std::span<const std::int32_t> v) {
    return detail::npy_bytes<std::int32_t>(shape, v, "<memory>");
}
inline std::vector<std::byte> npy_bytes_u8(std::span<const std::int64_t> shape, std::span<const std::uint8_t> v) {
    return detail::npy_bytes<std::uint8_t>(shape, v, "<memory>");
}

}  // namespace flowedge::io
