// .npy reader/writer: files written by numpy (v1/v2/v3, 0-d, empty) load exactly, round trips, and every
// malformed or unsupported file (fortran order, big-endian, other dtypes, bad headers) is a named Error.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "flowedge/io/npy.hpp"
#include "../support/test_paths.hpp"
#include "io_test_util.hpp"

using namespace flowedge;
using namespace flowedge::io;
using iotest::contains_all;
using iotest::error_of;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const std::string& name) { return fe_test::fixtures_dir() / "io" / name; }
fs::path tmp_dir() { return fe_test::scratch_dir("test_io_tmp/npy"); }

/// Hand-assembled .npy image: version, header text (padded as given) and data bytes.
std::vector<std::byte> npy_image(const std::string& header, std::size_t n_data, int major = 1, std::uint32_t len_override = 0) {
    std::vector<std::byte> out;
    for (unsigned char c : {0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59}) out.push_back(std::byte(c));
    out.push_back(std::byte(major));
    out.push_back(std::byte(0));
    const std::uint32_t len = len_override ? len_override : std::uint32_t(header.size());
    const int n_len = major == 1 ? 2 : 4;
    for (int k = 0; k < n_len; ++k) out.push_back(std::byte((len >> (8 * k)) & 0xffu));
    for (char c : header) out.push_back(static_cast<std::byte>(c));
    out.insert(out.end(), n_data, std::byte{0});
    return out;
}

std::string parse_error(const std::vector<std::byte>& b) {
    return error_of([&] { parse_npy_f32(b, "bad.npy"); });
}

void check_2x3(const NpyArray<float>& a) {
    CHECK(a.shape == std::vector<std::int64_t>{2, 3});
    REQUIRE(a.data.size() == 6);
    for (int i = 0; i < 6; ++i) CHECK(a.data[std::size_t(i)] == float(i) / 4.f - 0.5f);
}

}  // namespace

TEST_CASE("numpy-written float32 files load (format v1, v2, v3)") {
    check_2x3(read_npy_f32(fixture("f32_2x3.npy")));
    check_2x3(read_npy_f32(fixture("f32_2x3_v2.npy")));
    check_2x3(read_npy_f32(fixture("f32_2x3_v3.npy")));
}

TEST_CASE("numpy-written 0-d, empty and int32 files load") {
    const auto s = read_npy_f32(fixture("f32_scalar.npy"));
    CHECK(s.shape.empty());
    CHECK(s.numel() == 1);
    CHECK(s.data == std::vector<float>{1.5f});
    const auto e = read_npy_f32(fixture("f32_empty_0x3.npy"));
    CHECK(e.shape == std::vector<std::int64_t>{0, 3});
    CHECK(e.data.empty());
    const auto i = read_npy_i32(fixture("i32_4.npy"));
    CHECK(i.shape == std::vector<std::int64_t>{4});
    CHECK(i.data == std::vector<std::int32_t>{-3, 0, 7, 2147483647});
}

TEST_CASE("unsupported numpy files are refused by name") {
    CHECK(contains_all(error_of([] { read_npy_f32(fixture("f32_fortran.npy")); }), {"f32_fortran.npy", "fortran_order"}));
    CHECK(contains_all(error_of([] { read_npy_f32(fixture("f32_bigendian.npy")); }), {"f32_bigendian.npy", "big-endian", "'>f4'"}));
    CHECK(contains_all(error_of([] { read_npy_f32(fixture("f64_2x3.npy")); }), {"f64_2x3.npy", "expected float32 .npy, got float64 ('<f8'): convert with arr.astype(np.float32)"}));
    CHECK(contains_all(error_of([] { read_npy_i32(fixture("f32_2x3.npy")); }), {"expected int32 .npy, got float32 ('<f4'): convert with arr.astype(np.int32)"}));
    CHECK(contains_all(error_of([] { read_npy_f32(fixture("i32_4.npy")); }), {"expected float32 .npy, got int32 ('<i4')"}));
}

TEST_CASE("write -> read round trips (f32 and i32, ranks 0..4)") {
    const fs::path d = tmp_dir();
    const std::vector<std::vector<std::int64_t>> shapes = {{}, {5}, {2, 3}, {1, 2, 3}, {2, 1, 2, 2}, {0}, {3, 0}};
    int k = 0;
    for (const auto& shape : shapes) {
        std::int64_t n = 1;
        for (auto v : shape) n *= v;
        std::vector<float> f(static_cast<std::size_t>(n));
        std::vector<std::int32_t> ii(static_cast<std::size_t>(n));
        for (std::size_t j = 0; j < f.size(); ++j) {
            f[j] = float(j) * 1.25f - 3.f;
            ii[j] = std::int32_t(j * 1000003u) - 7;
        }
        const std::string stem = std::to_string(k) + ".npy";
        const fs::path pf = d / ("f_" + stem);
        const fs::path pi = d / ("i_" + stem);
        ++k;
        write_npy_f32(pf, shape, f);
        write_npy_i32(pi, shape, ii);
        const auto rf = read_npy_f32(pf);
        const auto ri = read_npy_i32(pi);
        CHECK(rf.shape == shape);
        CHECK(rf.data == f);
        CHECK(ri.shape == shape);
        CHECK(ri.data == ii);
        // numpy's layout: magic, v1.0, header padded with spaces to a 64-byte boundary and ended by '\n'
        const auto b = npy_bytes_f32(shape, f);
        CHECK(b.size() == fs::file_size(pf));
        const std::size_t hl = std::to_integer<std::size_t>(b[8]) | (std::to_integer<std::size_t>(b[9]) << 8);
        CHECK((10 + hl) % 64 == 0);
        CHECK(std::to_integer<int>(b[6]) == 1);
        CHECK(static_cast<char>(b[10 + hl - 1]) == '\n');
    }
}

TEST_CASE("writer refuses a shape that does not match the values") {
    const fs::path p = tmp_dir() / "bad_shape.npy";
    const std::vector<float> v(5);
    CHECK(contains_all(error_of([&] { write_npy_f32(p, std::vector<std::int64_t>{2, 3}, v); }), {p.string(), "expected 6, got 5"}));
    CHECK(contains_all(error_of([&] { write_npy_f32(p, std::vector<std::int64_t>{-5}, v); }), {"negative dimension"}));
    CHECK(contains_all(error_of([&] { write_npy_f32(tmp_dir() / "no" / "x.npy", std::vector<std::int64_t>{5}, v); }),
                       {"cannot write", "x.npy"}));
}

TEST_CASE("header variants numpy may write are accepted") {
    // keys in another order, double quotes, no trailing comma, Python 2 long suffix, '=' (native) byte order
    auto ok = [](const std::string& h, std::size_t n_bytes) { return parse_npy_f32(npy_image(h, n_bytes)); };
    CHECK(ok("{'shape': (2,), 'fortran_order': False, 'descr': '<f4'}\n", 8).shape == std::vector<std::int64_t>{2});
    CHECK(ok("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3L, 1L)}   \n", 12).shape == std::vector<std::int64_t>{3, 1});
    CHECK(ok("{'descr': '=f4', 'fortran_order': False, 'shape': (), }", 4).shape.empty());
}

TEST_CASE("malformed npy files") {
    const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
    SUBCASE("missing file / directory") {
        const fs::path p = tmp_dir() / "missing.npy";
        CHECK(contains_all(error_of([&] { read_npy_f32(p); }), {"flowedge: npy:", p.string(), "no such file"}));
        CHECK(contains_all(error_of([&] { read_npy_f32(tmp_dir()); }), {"is a directory"}));
    }
    SUBCASE("empty and truncated") {
        CHECK(contains_all(parse_error({}), {"bad.npy", "truncated", "got 0 bytes"}));
        auto b = npy_image(good, 8);
        b.resize(9);
        CHECK(contains_all(parse_error(b), {"truncated"}));
        const fs::path p = tmp_dir() / "empty.npy";
        std::ofstream(p, std::ios::binary).close();
        CHECK(contains_all(error_of([&] { read_npy_f32(p); }), {p.string(), "truncated"}));
    }
    SUBCASE("bad magic") {
        auto b = npy_image(good, 8);
        b[1] = std::byte('X');
        CHECK(contains_all(parse_error(b), {"not a .npy file"}));
    }
    SUBCASE("unsupported version") {
        CHECK(contains_all(parse_error(npy_image(good, 8, 4)), {"unsupported .npy format version 4.0"}));
        auto b = npy_image(good, 8);
        b[7] = std::byte(1);
        CHECK(contains_all(parse_error(b), {"version 1.1"}));
    }
    SUBCASE("header length past end of file") {
        CHECK(contains_all(parse_error(npy_image(good, 0, 1, 60000)), {"header runs past the end of the file"}));
        CHECK(contains_all(parse_error(npy_image(good, 0, 2, 0xffffffffu)), {"header runs past the end of the file"}));
    }
    SUBCASE("data truncated or with trailing bytes") {
        CHECK(contains_all(parse_error(npy_image(good, 7)), {"data is truncated", "expected 8 bytes, got 7 bytes"}));
        CHECK(contains_all(parse_error(npy_image(good, 9)), {"trailing bytes", "expected 8 bytes, got 9 bytes"}));
    }
    SUBCASE("missing, repeated and unexpected keys") {
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'shape': (2,), }", 8)), {"no 'fortran_order'"}));
        CHECK(contains_all(parse_error(npy_image("{'fortran_order': False, 'shape': (2,), }", 8)), {"no 'descr'"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': False}", 8)), {"no 'shape'"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8)),
                           {"repeats key 'descr'"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8)),
                           {"unexpected key 'x'"}));
    }
    SUBCASE("bad shapes") {
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8)), {"negative dimension"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }", 8)), {"malformed header"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4), }", 8)),
                           {"overflows"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8)),
                           {"too large"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': [2], }", 8)), {"malformed header"}));
    }
    SUBCASE("bad syntax") {
        CHECK(contains_all(parse_error(npy_image("'descr': '<f4'", 8)), {"malformed header", "expected '{'"}));
        CHECK(contains_all(parse_error(npy_image("{'descr: '<f4', 'fortran_order': False, 'shape': (2,)}", 8)), {"malformed header"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': maybe, 'shape': (2,)}", 8)), {"True or False"}));
        CHECK(contains_all(parse_error(npy_image(good + "x", 8)), {"trailing characters"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", 8)),
                           {"structured dtypes"}));
    }
    SUBCASE("unsupported dtypes") {
        CHECK(contains_all(parse_error(npy_image("{'descr': '|u1', 'fortran_order': False, 'shape': (8,), }", 8)), {"got uint8 ('|u1')"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }", 8)),
                           {"expected float32 .npy, got float16 ('<f2'): convert with arr.astype(np.float32)"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8)),
                           {"expected float32 .npy, got dtype '<c8'"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8)),
                           {"big-endian", "convert with arr.astype('<f4')"}));
        CHECK(contains_all(parse_error(npy_image("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", 8)), {"fortran_order"}));
    }
}

TEST_CASE("fuzz: truncations and byte mutations of a valid .npy never crash") {
    const std::vector<float> v = {1, 2, 3, 4, 5, 6};
    const auto good = npy_bytes_f32(std::vector<std::int64_t>{2, 3}, v);
    int n_ok = 0, n_err = 0;
    auto attempt = [&](const std::vector<std::byte>& b) {
        try {
            (void)parse_npy_f32(b, "fuzz");
            ++n_ok;
        } catch (const Error&) {
            ++n_err;
        }
    };
    for (std::size_t n = 0; n < good.size(); ++n) attempt(std::vector<std::byte>(good.begin(), good.begin() + std::ptrdiff_t(n)));
    for (std::size_t i = 0; i < good.size(); ++i)
        for (unsigned c : {0x00u, 0x20u, 0x27u, 0x28u, 0x29u, 0x2cu, 0x39u, 0xffu}) {
            auto m = good;
            m[i] = std::byte(c);
            attempt(m);
        }
    attempt(good);
    CHECK(n_ok > 0);
    CHECK(n_err > 0);
    MESSAGE("fuzz: " << n_ok << " accepted, " << n_err << " rejected");
}
