// .npz reader/writer: archives written by numpy (np.savez stored with zip64 local extras, np.savez_compressed
// deflate, a write-only stream with data descriptors) load exactly; writer round trips; a zip64 end record is
// read; every truncation, corrupt header, overlap, CRC mismatch and unsupported feature is a named Error.
// Fixtures: test/fixtures/io/make_fixtures.py (`python3 make_fixtures.py --numpy-only`).
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "flowedge/io/npz.hpp"
#include "../support/test_paths.hpp"
#include "io_test_util.hpp"

using namespace flowedge;
using namespace flowedge::io;
using iotest::contains_all;
using iotest::error_of;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const std::string& name) { return fe_test::fixtures_dir() / "io" / name; }
fs::path tmp_dir() { return fe_test::scratch_dir("test_io_tmp/npz"); }

std::uint64_t get_le(const std::vector<std::byte>& b, std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= std::uint64_t(std::to_integer<unsigned>(b[at + std::size_t(k)])) << (8 * k);
    return v;
}
void set_le(std::vector<std::byte>& b, std::size_t at, std::uint64_t v, int n) {
    for (int k = 0; k < n; ++k) b[at + std::size_t(k)] = std::byte((v >> (8 * k)) & 0xFFu);
}
void put_le(std::vector<std::byte>& b, std::uint64_t v, int n) {
    for (int k = 0; k < n; ++k) b.push_back(std::byte((v >> (8 * k)) & 0xFFu));
}

/// Where the writer's fixed-layout records are: end record last, central directory just before it.
struct Layout {
    std::size_t eocd, cd_off, cd_size;
};
Layout layout_of(const std::vector<std::byte>& b) {
    const std::size_t eocd = b.size() - 22;
    return {eocd, std::size_t(get_le(b, eocd + 16, 4)), std::size_t(get_le(b, eocd + 12, 4))};
}

/// Two small arrays: "a" float32 [2, 3] and "b" uint8 [4].
std::vector<std::byte> two_arrays() {
    NpzWriter w;
    const std::vector<float> a = {1, 2, 3, 4, 5, 6};
    const std::vector<std::uint8_t> b = {0, 1, 254, 255};
    w.add_f32("a", std::vector<std::int64_t>{2, 3}, a);
    w.add_u8("b", std::vector<std::int64_t>{4}, b);
    return w.bytes();
}

std::string parse_error(const std::vector<std::byte>& b) {
    return error_of([&] { (void)Npz::parse(b, "bad.npz"); });
}

/// The arrays make_fixtures.py saves: observation.image uint8 [2, 4, 5, 3], observation.state float32 [2, 2], count int32 [3].
void check_numpy_obs(const Npz& z) {
    CHECK(z.names() == std::vector<std::string>{"observation.image", "observation.state", "count"});
    CHECK(z.info("observation.image").descr == "|u1");
    CHECK(z.info("observation.image").type_name() == "uint8");
    CHECK(z.info("observation.image").shape == std::vector<std::int64_t>{2, 4, 5, 3});
    const NpyArrayU8 img = z.u8("observation.image");
    const NpyArrayU8 want = read_npy_u8(fixture("u8_2x4x5x3.npy"));
    CHECK(img.shape == want.shape);
    CHECK(img.data == want.data);
    REQUIRE(img.data.size() == 120);
    for (std::size_t i = 0; i < img.data.size(); ++i) CHECK(img.data[i] == std::uint8_t(i * 7 % 256));
    const NpyArrayF32 st = z.f32("observation.state");
    CHECK(st.shape == std::vector<std::int64_t>{2, 2});
    CHECK(st.data == std::vector<float>{-1.f, -0.5f, 0.f, 0.5f});
    CHECK(z.i32("count").data == std::vector<std::int32_t>{1, -2, 3});
}

}  // namespace

TEST_CASE("uint8 .npy: numpy-written file, round trip, other dtypes refused") {
    const NpyArrayU8 a = read_npy_u8(fixture("u8_2x4x5x3.npy"));
    CHECK(a.shape == std::vector<std::int64_t>{2, 4, 5, 3});
    REQUIRE(a.data.size() == 120);
    CHECK(a.data[1] == 7);
    CHECK(a.data[37] == std::uint8_t(37 * 7 % 256));
    const fs::path p = tmp_dir() / "u8.npy";
    write_npy_u8(p, a.shape, a.data);
    const NpyArrayU8 r = read_npy_u8(p);
    CHECK(r.shape == a.shape);
    CHECK(r.data == a.data);
    CHECK(npy_bytes_u8(a.shape, a.data).size() == fs::file_size(fixture("u8_2x4x5x3.npy")));  // same header as numpy's
    CHECK(contains_all(error_of([] { read_npy_u8(fixture("f32_2x3.npy")); }),
                       {"f32_2x3.npy", "expected uint8 .npy, got float32 ('<f4'): convert with arr.astype(np.uint8)"}));
    CHECK(contains_all(error_of([] { read_npy_f32(fixture("u8_2x4x5x3.npy")); }), {"expected float32 .npy, got uint8 ('|u1')"}));
    // One-byte elements have no byte order: '<u1' and '>u1' are the same array.
    for (const char* d : {"<u1", ">u1", "=u1"}) {
        std::vector<std::byte> b = npy_bytes_u8(std::vector<std::int64_t>{2}, std::vector<std::uint8_t>{9, 200});
        b[21] = std::byte(d[0]);  // the descr's byte-order character: "{'descr': '|u1'" puts it at offset 10 + 11
        REQUIRE(static_cast<char>(b[22]) == 'u');
        CHECK(parse_npy_u8(b).data == std::vector<std::uint8_t>{9, 200});
    }
    CHECK(contains_all(error_of([] { (void)parse_npy_u8(npy_bytes_u8(std::vector<std::int64_t>{3}, std::vector<std::uint8_t>{1, 2})); }),
                       {"expected 3, got 2"}));
}

TEST_CASE("numpy-written .npz archives load: np.savez, np.savez_compressed, write-only stream") {
    check_numpy_obs(read_npz(fixture("obs_stored.npz")));
    check_numpy_obs(read_npz(fixture("obs_stream.npz")));
#ifdef FLOWEDGE_WITH_ZLIB
    check_numpy_obs(read_npz(fixture("obs_deflate.npz")));
#else
    CHECK(contains_all(error_of([] { (void)read_npz(fixture("obs_deflate.npz")); }),
                       {"obs_deflate.npz", "observation.image.npy", "deflate-compressed", "no zlib", "save with np.savez"}));
#endif
}

TEST_CASE("array lookups name the key, the arrays present and numpy's fix") {
    const Npz z = read_npz(fixture("obs_stored.npz"));
    CHECK(z.contains("observation.state"));
    CHECK(!z.contains("observation.state.npy"));
    CHECK(contains_all(error_of([&] { (void)z.f32("observation.images.top"); }),
                       {"flowedge: npz:", "obs_stored.npz", "no array 'observation.images.top'",
                        "'observation.image', 'observation.state', 'count'"}));
    CHECK(contains_all(error_of([&] { (void)z.f32("observation.image"); }),
                       {"obs_stored.npz[observation.image]", "expected float32 .npy, got uint8 ('|u1')"}));
    CHECK(contains_all(error_of([&] { (void)z.u8("observation.state"); }), {"[observation.state]", "got float32"}));
}

TEST_CASE("writer round trips (memory and file), empty archive, refused additions") {
    const std::vector<std::byte> b = two_arrays();
    const Npz z = Npz::parse(b);
    CHECK(z.names() == std::vector<std::string>{"a", "b"});
    CHECK(z.f32("a").shape == std::vector<std::int64_t>{2, 3});
    CHECK(z.f32("a").data == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(z.u8("b").data == std::vector<std::uint8_t>{0, 1, 254, 255});

    NpzWriter w;
    const std::vector<std::int32_t> ints = {7, -8};
    const std::vector<float> none;
    w.add_i32("observation.images.top", std::vector<std::int64_t>{2}, ints);
    w.add_f32("empty", std::vector<std::int64_t>{0, 3}, none);
    const fs::path p = tmp_dir() / "round.npz";
    w.write(p);
    const Npz r = read_npz(p);
    CHECK(r.i32("observation.images.top").data == ints);
    CHECK(r.f32("empty").shape == std::vector<std::int64_t>{0, 3});
    CHECK(w.bytes() == w.bytes());  // fixed timestamps: same arrays, same bytes

    CHECK(Npz::parse(NpzWriter{}.bytes()).members().empty());
    CHECK(contains_all(error_of([&] { w.add_i32("empty", std::vector<std::int64_t>{2}, ints); }), {"'empty' is added twice"}));
    CHECK(contains_all(error_of([&] { w.add_i32("", std::vector<std::int64_t>{2}, ints); }), {"name is empty"}));
}

TEST_CASE("a zip64 end record and locator are read") {
    // Rebuild the writer's archive with the end record's counts/offsets saturated and the real ones in zip64 records.
    std::vector<std::byte> b = two_arrays();
    const Layout l = layout_of(b);
    b.resize(l.eocd);
    const std::size_t rec = b.size();
    put_le(b, 0x06064b50u, 4);
    put_le(b, 44, 8);  // record size after this field
    put_le(b, 45, 2);
    put_le(b, 45, 2);
    put_le(b, 0, 4);
    put_le(b, 0, 4);
    put_le(b, 2, 8);
    put_le(b, 2, 8);
    put_le(b, l.cd_size, 8);
    put_le(b, l.cd_off, 8);
    put_le(b, 0x07064b50u, 4);
    put_le(b, 0, 4);
    put_le(b, rec, 8);
    put_le(b, 1, 4);
    put_le(b, 0x06054b50u, 4);
    put_le(b, 0, 4);
    put_le(b, 0xFFFFu, 2);
    put_le(b, 0xFFFFu, 2);
    put_le(b, 0xFFFFFFFFu, 4);
    put_le(b, 0xFFFFFFFFu, 4);
    put_le(b, 0, 2);
    const Npz z = Npz::parse(b);
    CHECK(z.f32("a").data == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(z.u8("b").data.size() == 4);

    auto bad_rec = b;
    set_le(bad_rec, rec, 0x12345678u, 4);
    CHECK(contains_all(parse_error(bad_rec), {"zip64 end record has a bad signature"}));
    auto no_locator = b;
    set_le(no_locator, rec + 56, 0, 4);
    CHECK(contains_all(parse_error(no_locator), {"zip64 end locator is missing"}));
    auto multi = b;
    set_le(multi, rec + 56 + 16, 2, 4);
    CHECK(contains_all(parse_error(multi), {"multi-disk"}));
}

TEST_CASE("CRC-32 mismatch is named with both values") {
    std::vector<std::byte> b = two_arrays();
    const std::size_t data = 30 + 5;  // first local header + "a.npy"
    b[data + 128 + 2] ^= std::byte{0x40};  // a value byte of "a", after its 128-byte .npy header
    CHECK(contains_all(parse_error(b), {"flowedge: npz: bad.npz: member 'a.npy': CRC-32 mismatch", "(expected 0x"}));
    // CRC-32 itself: the standard check value of "123456789".
    const std::string nine = "123456789";
    CHECK(detail::crc32(std::as_bytes(std::span(nine.data(), nine.size()))) == 0xCBF43926u);
}

TEST_CASE("truncated and non-zip input") {
    const std::vector<std::byte> good = two_arrays();
    CHECK(contains_all(parse_error({}), {"bad.npz", "not a .npz (zip) file", "got 0 bytes"}));
    CHECK(contains_all(parse_error(std::vector<std::byte>(good.begin(), good.begin() + std::ptrdiff_t(good.size() / 2))),
                       {"truncated zip archive", "no end-of-central-directory record"}));
    CHECK(contains_all(parse_error(std::vector<std::byte>(100, std::byte{'x'})), {"not a .npz (zip) file"}));
    CHECK(contains_all(parse_error(npy_bytes_f32(std::vector<std::int64_t>{2}, std::vector<float>{1, 2})), {"this is a .npy file"}));
    const fs::path missing = tmp_dir() / "missing.npz";
    CHECK(contains_all(error_of([&] { (void)read_npz(missing); }), {"flowedge: npz:", "missing.npz", "no such file"}));
    // Every prefix is refused cleanly (the end record moves with the cut, so nothing short of the whole file parses).
    for (std::size_t n = 0; n < good.size(); ++n)
        CHECK(parse_error(std::vector<std::byte>(good.begin(), good.begin() + std::ptrdiff_t(n))) != "<no error>");
}

TEST_CASE("corrupt headers and unsupported features") {
    const std::vector<std::byte> good = two_arrays();
    const Layout l = layout_of(good);
    const std::size_t c0 = l.cd_off;  // first central entry ("a.npy")
    SUBCASE("end record") {
        auto b = good;
        set_le(b, l.eocd + 16, l.cd_off + 1, 4);
        CHECK(contains_all(parse_error(b), {"central directory does not end where the end record starts"}));
        b = good;
        set_le(b, l.eocd + 10, 50, 2);
        set_le(b, l.eocd + 8, 50, 2);
        CHECK(contains_all(parse_error(b), {"too small for its entry count"}));
        b = good;
        set_le(b, l.eocd + 8, 1, 2);
        CHECK(contains_all(parse_error(b), {"multi-disk"}));
        b = good;
        set_le(b, l.eocd + 20, 5, 2);  // comment length past the end
        CHECK(contains_all(parse_error(b), {"no end-of-central-directory record"}));
    }
    SUBCASE("central entries") {
        auto b = good;
        set_le(b, c0, 0x02014b51u, 4);
        CHECK(contains_all(parse_error(b), {"central directory entry 0 has a bad signature"}));
        b = good;
        set_le(b, c0 + 10, 12, 2);
        CHECK(contains_all(parse_error(b), {"member 'a.npy' uses compression method 12", "np.savez"}));
        b = good;
        set_le(b, c0 + 8, 1, 2);
        CHECK(contains_all(parse_error(b), {"member 'a.npy' is encrypted"}));
        b = good;
        set_le(b, c0 + 20, get_le(b, c0 + 20, 4) + 1, 4);
        CHECK(contains_all(parse_error(b), {"stored but its sizes differ"}));
        b = good;
        set_le(b, c0 + 30, 9, 2);  // extra length pointing into the next entry: a malformed record
        CHECK(contains_all(parse_error(b), {"member 'a.npy'"}));
        b = good;
        set_le(b, c0 + 42, l.cd_off - 10, 4);
        CHECK(contains_all(parse_error(b), {"local header offset", "out of range"}));
    }
    SUBCASE("local headers") {
        auto b = good;
        set_le(b, 0, 0x04034b51u, 4);
        CHECK(contains_all(parse_error(b), {"member 'a.npy': local header has a bad signature"}));
        b = good;
        b[30] = std::byte{'z'};
        CHECK(contains_all(parse_error(b), {"local header names 'z.npy' where the central directory names 'a.npy'"}));
        b = good;
        set_le(b, 14, 0xdeadbeefu, 4);
        CHECK(contains_all(parse_error(b), {"local header CRC/sizes disagree with the central directory"}));
        b = good;
        set_le(b, 8, 8, 2);
        CHECK(contains_all(parse_error(b), {"disagrees with the central directory on method"}));
    }
    SUBCASE("overlapping members") {
        // Grow "a" by 10 bytes in both headers: its data then runs over the local header of "b".
        auto b = good;
        const std::uint64_t n = get_le(b, 18, 4) + 10;
        for (std::size_t at : {std::size_t(18), std::size_t(22), c0 + 20, c0 + 24}) set_le(b, at, n, 4);
        CHECK(contains_all(parse_error(b), {"members 'a.npy' and 'b.npy' overlap"}));
    }
    SUBCASE("member names") {
        NpzWriter w;
        w.add({"x", npy_bytes_f32(std::vector<std::int64_t>{1}, std::vector<float>{1})});
        auto b = w.bytes();
        const Layout lw = layout_of(b);
        b[30 + 3] = std::byte{'t'};  // "x.npy" -> "x.nty" in both headers
        b[lw.cd_off + 46 + 3] = std::byte{'t'};
        CHECK(contains_all(parse_error(b), {"member 'x.nty' is not a .npy array"}));
        // Two members with the same name.
        NpzWriter w2;
        w2.add({"x", npy_bytes_f32(std::vector<std::int64_t>{1}, std::vector<float>{1})});
        w2.add({"y", npy_bytes_f32(std::vector<std::int64_t>{1}, std::vector<float>{2})});
        auto d = w2.bytes();
        const Layout l2 = layout_of(d);
        const std::size_t second_local = std::size_t(get_le(d, l2.cd_off + 46 + 5 + 42, 4));
        d[second_local + 30] = std::byte{'x'};
        d[l2.cd_off + 46 + 5 + 46] = std::byte{'x'};
        CHECK(contains_all(parse_error(d), {"member 'x.npy' appears twice"}));
    }
    SUBCASE("member that is not a valid .npy") {
        NpzWriter w;
        const std::string text = "hello";
        w.add({"t", std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                           reinterpret_cast<const std::byte*>(text.data()) + text.size())});
        CHECK(contains_all(parse_error(w.bytes()), {"flowedge: npy: bad.npz[t]", "truncated"}));
    }
}

#ifdef FLOWEDGE_WITH_ZLIB
TEST_CASE("deflate members: corrupt stream, wrong declared size") {
    const std::vector<std::byte> good = detail::read_file_bytes(fixture("obs_deflate.npz"), "test");
    const Layout l = layout_of(good);
    const std::size_t data = 30 + std::size_t(get_le(good, 26, 2)) + std::size_t(get_le(good, 28, 2));
    auto b = good;
    for (std::size_t k = 0; k < 8; ++k) b[data + k] = std::byte{0xFF};
    CHECK(contains_all(parse_error(b), {"member 'observation.image.npy'"}));
    // The declared uncompressed size (zip64 local extra and central entry) too small: inflate runs past it.
    const std::uint64_t usize = get_le(good, l.cd_off + 24, 4);
    auto declare = [&](std::uint64_t n) {
        auto d = good;
        set_le(d, l.cd_off + 24, n, 4);
        set_le(d, 30 + std::size_t(get_le(good, 26, 2)) + 4, n, 8);
        return d;
    };
    CHECK(contains_all(parse_error(declare(usize - 1)), {"inflated size does not match the directory", "expected 247 bytes, got 248 bytes"}));
    CHECK(contains_all(parse_error(declare(usize - 2)), {"inflates to more than its declared size"}));
    CHECK(contains_all(parse_error(declare(usize + 1)), {"inflated size does not match the directory", "expected 249 bytes, got 248 bytes"}));
}
#endif

TEST_CASE("fuzz: truncations and byte mutations of archives never crash") {
    std::vector<std::vector<std::byte>> seeds = {two_arrays(), detail::read_file_bytes(fixture("obs_stream.npz"), "test")};
#ifdef FLOWEDGE_WITH_ZLIB
    seeds.push_back(detail::read_file_bytes(fixture("obs_deflate.npz"), "test"));
#endif
    int n_ok = 0, n_err = 0;
    auto attempt = [&](const std::vector<std::byte>& b) {
        try {
            const Npz z = Npz::parse(b, "fuzz");
            for (const NpzMember& m : z.members()) (void)z.info(m.name);
            ++n_ok;
        } catch (const Error&) {
            ++n_err;
        }
    };
    for (const auto& good : seeds)
        for (std::size_t i = 0; i < good.size(); ++i)
            for (unsigned c : {0x00u, 0x01u, 0x08u, 0x7fu, 0xffu}) {
                auto m = good;
                m[i] = std::byte(c);
                attempt(m);
            }
    CHECK(n_ok > 0);
    CHECK(n_err > 0);
    MESSAGE("fuzz: " << n_ok << " accepted, " << n_err << " rejected");
}
