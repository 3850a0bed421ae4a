// Minimal .npy (NumPy array file) reader/writer for float32 and int32, C order, little-endian: the
// interchange format of the programs' --cond/--noise/--out flags and of the reference fixtures.
// (No maintained .npy C++ library is packaged for Debian; the format is small and fully tested here.)
#pragma once
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "flowedge/error.hpp"

namespace flowedge::io {

/// A loaded array: shape and row-major elements.
template <class T>
struct NpyArray {
    std::vector<std::int64_t> shape;
    std::vector<T> data;
    std::int64_t numel() const {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        return n;
    }
};

namespace detail {

template <class T> constexpr const char* npy_descr();
template <> constexpr const char* npy_descr<float>() { return "<f4"; }
template <> constexpr const char* npy_descr<std::int32_t>() { return "<i4"; }

/// Value of `key` in the header dict text, e.g. "'descr': '<f4'" -> "'<f4'" (up to the next top-level comma).
inline std::string npy_field(const std::string& header, const std::string& key, const std::string& where) {
    const std::string pat = "'" + key + "'";
    auto k = header.find(pat);
    if (k == std::string::npos) fail("npy", where + ": header has no '" + key + "'");
    auto colon = header.find(':', k + pat.size());
    if (colon == std::string::npos) fail("npy", where + ": malformed header near '" + key + "'");
    std::size_t i = colon + 1, depth = 0;
    std::string out;
    for (; i < header.size(); ++i) {
        const char c = header[i];
        if (c == '(') ++depth;
        if (c == ')') {
            if (depth == 0) break;
            --depth;
        }
        if ((c == ',' || c == '}') && depth == 0) break;
        out += c;
    }
    // trim
    const auto b = out.find_first_not_of(" \t");
    const auto e = out.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : out.substr(b, e - b + 1);
}

template <class T>
NpyArray<T> read_npy(const std::filesystem::path& path) {
    const std::string where = path.string();
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("npy", where + ": cannot open");
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) fail("npy", where + ": not a .npy file (bad magic)");
    const int major = static_cast<unsigned char>(bytes[6]);
    std::size_t header_len = 0, start = 0;
    if (major == 1) {
        header_len = static_cast<unsigned char>(bytes[8]) | (std::size_t(static_cast<unsigned char>(bytes[9])) << 8);
        start = 10;
    } else if (major == 2 || major == 3) {
        if (bytes.size() < 12) fail("npy", where + ": truncated header");
        for (int i = 0; i < 4; ++i) header_len |= std::size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
        start = 12;
    } else {
        fail("npy", where + ": unsupported .npy version " + std::to_string(major));
    }
    if (start + header_len > bytes.size()) fail("npy", where + ": header runs past the end of the file");
    const std::string header(bytes.data() + start, header_len);
    const std::string descr = npy_field(header, "descr", where);
    if (descr != std::string("'") + npy_descr<T>() + "'")
        fail("npy", where + ": unsupported dtype " + descr + expected_got(npy_descr<T>(), descr));
    const std::string fortran = npy_field(header, "fortran_order", where);
    if (fortran != "False") fail("npy", where + ": fortran_order arrays are not supported (save with C order)");
    std::string shape_text = npy_field(header, "shape", where);
    NpyArray<T> out;
    {
        std::string num;
        for (char c : shape_text + ",") {
            if (c >= '0' && c <= '9') num += c;
            else if (c == ',' || c == ')') {
                if (!num.empty()) {
                    out.shape.push_back(std::stoll(num));
                    num.clear();
                }
            } else if (c != '(' && c != ' ' && c != 'L') {
                fail("npy", where + ": malformed shape " + shape_text);
            }
        }
    }
    const std::int64_t n = out.numel();
    const std::size_t data_start = start + header_len;
    if (n < 0 || bytes.size() - data_start != static_cast<std::size_t>(n) * sizeof(T))
        fail("npy", where + ": data size does not match shape" +
                        expected_got(std::to_string(n * std::int64_t(sizeof(T))) + " bytes",
                                     std::to_string(bytes.size() - data_start) + " bytes"));
    out.data.resize(static_cast<std::size_t>(n));
    if (n) std::memcpy(out.data.data(), bytes.data() + data_start, static_cast<std::size_t>(n) * sizeof(T));
    return out;
}

template <class T>
void write_npy(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::span<const T> values) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    if (n != static_cast<std::int64_t>(values.size()))
        fail("npy", path.string() + ": shape does not match the number of values" +
                        expected_got(std::to_string(n), std::to_string(values.size())));
    std::string dims;
    for (std::size_t i = 0; i < shape.size(); ++i) dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    std::string header = std::string("{'descr': '") + npy_descr<T>() + "', 'fortran_order': False, 'shape': (" + dims + "), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) fail("npy", path.string() + ": cannot open for writing");
    const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header.size() & 0xff),
                                   static_cast<unsigned char>(header.size() >> 8)};
    f.write(reinterpret_cast<const char*>(pre), 10);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
    if (!f) fail("npy", path.string() + ": write failed");
}

}  // namespace detail

inline NpyArray<float> read_npy_f32(const std::filesystem::path& p) { return detail::read_npy<float>(p); }
inline NpyArray<std::int32_t> read_npy_i32(const std::filesystem::path& p) { return detail::read_npy<std::int32_t>(p); }
inline void write_npy_f32(const std::filesystem::path& p, std::span<const std::int64_t> shape, std::span<const float> v) {
    detail::write_npy<float>(p, shape, v);
}
inline void write_npy_i32(const std::filesystem::path& p, std::span<const std::int64_t> shape, std::span<const std::int32_t> v) {
    detail::write_npy<std::int32_t>(p, shape, v);
}

}  // namespace flowedge::io
