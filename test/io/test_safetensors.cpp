// safetensors reader/writer: round trips for every supported dtype, a numpy/safetensors-written fixture, and one
// test per malformed-file case (each must raise a flowedge::Error naming the problem, never crash).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "flowedge/io/safetensors.hpp"
#include "io_test_util.hpp"

using namespace flowedge;
using flowedge::io::SafeTensors;
using flowedge::io::SafeTensorsWriter;
using iotest::contains_all;
using iotest::error_of;
namespace fs = std::filesystem;

namespace {

/// Hand-assembled safetensors image: raw header text (may be malformed on purpose) + data bytes.
struct StBuilder {
    std::string header;
    std::vector<std::byte> data;
    bool override_len = false;
    std::uint64_t len = 0;

    StBuilder& json(std::string h) { header = std::move(h); return *this; }
    StBuilder& zeros(std::size_t n) { data.assign(n, std::byte{0}); return *this; }
    StBuilder& length_field(std::uint64_t v) { override_len = true; len = v; return *this; }
    std::vector<std::byte> bytes() const {
        std::vector<std::byte> out;
        const std::uint64_t n = override_len ? len : header.size();
        for (int i = 0; i < 8; ++i) out.push_back(std::byte((n >> (8 * i)) & 0xffu));
        for (char c : header) out.push_back(static_cast<std::byte>(c));
        out.insert(out.end(), data.begin(), data.end());
        return out;
    }
};

/// One tensor entry as header JSON text.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

std::string load_error(const StBuilder& b) {
    return error_of([&] { SafeTensors::from_bytes(b.bytes(), "bad.safetensors"); });
}

fs::path tmp_dir() {
    fs::path d = fs::path(FLOWEDGE_BINARY_DIR) / "test_io_tmp" / "safetensors";
    fs::create_directories(d);
    return d;
}

template <class T>
std::span<const std::byte> as_bytes(const std::vector<T>& v) { return std::as_bytes(std::span<const T>(v)); }

}  // namespace

TEST_CASE("writer -> reader round trip for F32, BF16, F16 and metadata") {
    const std::vector<float> f32 = {1.f, -2.5f, 3.25f, 0.f, -0.f, 1e-30f};
    // Bit patterns chosen by hand: bf16 0x3fc0 = 1.5, 0xc020 = -2.5, 0x7f80 = +inf, 0x0001 = smallest subnormal.
    const std::vector<std::uint16_t> bf = {0x3fc0, 0xc020, 0x7f80, 0x0001};
    // f16 0x3c00 = 1, 0xc100 = -2.5, 0x7bff = 65504, 0x0001 = 2^-24.
    const std::vector<std::uint16_t> hf = {0x3c00, 0xc100, 0x7bff, 0x0001, 0x8000, 0x3555};
    SafeTensorsWriter w;
    w.add_f32("a.weight", Shape{2, 3}, f32);
    w.add("b.bf16", DType::BF16, Shape{4}, as_bytes(bf));
    w.add("c.f16", DType::F16, Shape{1, 2, 3}, hf.data());  // raw-pointer overload
    w.set_metadata("format", "pt");
    w.set_metadata("note", "hello \"quoted\"");

    auto check = [&](const SafeTensors& st) {
        REQUIRE(st.tensors().size() == 3);
        CHECK(st.metadata().size() == 2);
        CHECK(st.metadata().at("format") == "pt");
        CHECK(st.metadata().at("note") == "hello \"quoted\"");
        const auto& a = st.at("a.weight");
        CHECK(a.dtype == DType::F32);
        CHECK(a.dtype_name == "F32");
        CHECK(a.shape == Shape{2, 3});
        CHECK(a.bytes == 24);
        CHECK(std::memcmp(a.data, f32.data(), 24) == 0);
        CHECK(st.read_f32("a.weight") == f32);

        const auto& b = st.at("b.bf16");
        CHECK(b.dtype == DType::BF16);
        CHECK(b.shape == Shape{4});
        CHECK(std::memcmp(b.data, bf.data(), 8) == 0);
        const auto bv = st.read_f32("b.bf16");
        CHECK(bv[0] == 1.5f);
        CHECK(bv[1] == -2.5f);
        CHECK(std::isinf(bv[2]));
        CHECK(bv[3] == std::ldexp(1.0f, -133));

        const auto& c = st.at("c.f16");
        CHECK(c.dtype == DType::F16);
        CHECK(c.shape == Shape{1, 2, 3});
        const auto cv = st.read_f32("c.f16");
        REQUIRE(cv.size() == 6);
        CHECK(cv[0] == 1.f);
        CHECK(cv[1] == -2.5f);
        CHECK(cv[2] == 65504.f);
        CHECK(cv[3] == std::ldexp(1.0f, -24));
        CHECK(cv[4] == 0.f);
        CHECK(std::signbit(cv[4]));
        CHECK(cv[5] == doctest::Approx(1.0 / 3.0).epsilon(1e-3));

        // tensors() is sorted by data offset, ranges are contiguous
        std::size_t expect_offset = 0;
        for (const auto& t : st.tensors()) {
            CHECK(t.offset == expect_offset);
            CHECK(t.supported());
            expect_offset += t.bytes;
        }
        CHECK(st.contains("b.bf16"));
        CHECK_FALSE(st.contains("b"));
        CHECK(st.find("nope") == nullptr);
        CHECK(contains_all(error_of([&] { st.at("nope"); }), {"flowedge: safetensors:", "missing tensor 'nope'"}));
        CHECK(contains_all(error_of([&] { st.read_f32("nope"); }), {"missing tensor 'nope'"}));
    };

    SUBCASE("in memory") { check(*SafeTensors::from_bytes(w.bytes())); }
    SUBCASE("through a file (mmap)") {
        const fs::path p = tmp_dir() / "roundtrip.safetensors";
        w.write(p);
        auto st = SafeTensors::open(p);
        CHECK(st->path() == p);
        CHECK(st->file_size() == fs::file_size(p));
        check(*st);
        // The writer puts the widest dtype first and pads the header: F32 data is 4-byte aligned in the mapping.
        CHECK(reinterpret_cast<std::uintptr_t>(st->at("a.weight").data) % 4 == 0);
        CHECK(contains_all(error_of([&] { st->at("x"); }), {p.string(), "missing tensor 'x'"}));
    }
}

TEST_CASE("writer output layout: LE header length, space padding to 8 bytes, exact data size") {
    SafeTensorsWriter w;
    w.add_f32("x", Shape{3}, std::vector<float>{1, 2, 3});
    w.add("y", DType::BF16, Shape{1}, std::vector<std::uint16_t>{0x3f80}.data());
    const auto b = w.bytes();
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(b[std::size_t(i)]);
    CHECK((8 + n) % 8 == 0);
    CHECK(b.size() == 8 + n + 12 + 2);
    const std::string header(reinterpret_cast<const char*>(b.data() + 8), n);
    CHECK(header.front() == '{');
    const auto close = header.find_last_of('}');
    CHECK(header.find_first_not_of(' ', close + 1) == std::string::npos);
    CHECK(nlohmann::json::parse(header)["x"]["data_offsets"] == nlohmann::json::array({0, 12}));
    CHECK(nlohmann::json::parse(header)["y"]["data_offsets"] == nlohmann::json::array({12, 14}));
}

TEST_CASE("scalars and empty tensors") {
    SafeTensorsWriter w;
    w.add_f32("scalar", Shape{}, std::vector<float>{7.f});
    w.add_f32("empty", Shape{0, 5}, std::vector<float>{});
    w.add_f32("after", Shape{2}, std::vector<float>{1.f, 2.f});
    auto st = SafeTensors::from_bytes(w.bytes());
    CHECK(st->at("scalar").shape.rank == 0);
    CHECK(st->read_f32("scalar") == std::vector<float>{7.f});
    CHECK(st->at("empty").bytes == 0);
    CHECK(st->read_f32("empty").empty());
    CHECK(st->read_f32("after") == std::vector<float>{1.f, 2.f});
    // An empty tensor sitting at an offset inside another one occupies no bytes: not an overlap.
    StBuilder b;
    b.json("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("e", "F32", "[0]", "[4,4]") + "}").zeros(8);
    CHECK(SafeTensors::from_bytes(b.bytes())->tensors().size() == 2);
}

TEST_CASE("file written by Python safetensors (numpy) loads; its I64 tensor is listed but refused by name") {
    const fs::path p = fs::path(FLOWEDGE_FIXTURES_DIR) / "io" / "numpy_written.safetensors";
    auto st = SafeTensors::open(p);
    CHECK(st->metadata().at("format") == "np");
    CHECK(st->metadata().at("note") == "fixture");
    CHECK(st->tensors().size() == 3);
    const auto w = st->read_f32("w");
    REQUIRE(w.size() == 6);
    for (int i = 0; i < 6; ++i) CHECK(w[std::size_t(i)] == float(i) / 4.f - 0.5f);
    CHECK(st->at("w").shape == Shape{2, 3});
    CHECK(st->read_f32("h") == std::vector<float>{1.f, -2.5f, 65504.f});
    CHECK(st->contains("steps"));
    const auto* info = st->info("steps");
    REQUIRE(info != nullptr);
    CHECK(info->dtype_name == "I64");
    CHECK_FALSE(info->supported());
    CHECK(info->data == nullptr);
    CHECK(info->bytes == 24);
    CHECK(info->dims == std::vector<std::int64_t>{3});
    std::int64_t steps[3];
    std::memcpy(steps, info->raw, sizeof steps);
    CHECK(steps[0] == 1);
    CHECK(steps[2] == 3);
    for (auto msg : {error_of([&] { st->find("steps"); }), error_of([&] { st->at("steps"); }),
                     error_of([&] { st->read_f32("steps"); }), error_of([&] { info->require_float("loader", p.string()); })})
        CHECK(contains_all(msg, {p.string(), "tensor 'steps'", "unsupported dtype I64"}));
    CHECK(contains_all(error_of([&] { info->require_float("loader", "f"); }), {"flowedge: loader: f: tensor 'steps'"}));
}

TEST_CASE("concurrent readers share one mapping") {
    SafeTensorsWriter w;
    std::vector<float> v(4096);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f;
    w.add_f32("v", Shape{64, 64}, v);
    w.add("h", DType::BF16, Shape{3}, std::vector<std::uint16_t>{0x3f80, 0x4000, 0x4040}.data());
    const fs::path p = tmp_dir() / "concurrent.safetensors";
    w.write(p);
    auto st = SafeTensors::open(p);
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&] {
            for (int r = 0; r < 50; ++r) {
                if (st->read_f32("v") != v) ++bad;
                if (st->read_f32("h") != std::vector<float>{1.f, 2.f, 3.f}) ++bad;
                if (!st->find("v") || st->find("zz")) ++bad;
            }
        });
    for (auto& t : threads) t.join();
    CHECK(bad.load() == 0);
}

TEST_CASE("rewriting a file that is mapped leaves the open mapping intact (write goes through rename)") {
    const fs::path p = tmp_dir() / "rewrite.safetensors";
    SafeTensorsWriter w1;
    w1.add_f32("x", Shape{2}, std::vector<float>{1.f, 2.f});
    w1.write(p);
    auto old = SafeTensors::open(p);
    SafeTensorsWriter w2;
    w2.add_f32("y", Shape{1}, std::vector<float>{9.f});
    w2.write(p);
    CHECK(old->read_f32("x") == std::vector<float>{1.f, 2.f});
    CHECK(SafeTensors::open(p)->read_f32("y") == std::vector<float>{9.f});
    // No temporary left behind.
    int n = 0;
    for (const auto& e : fs::directory_iterator(tmp_dir()))
        if (e.path().filename().string().rfind("rewrite.safetensors", 0) == 0) ++n;
    CHECK(n == 1);
}

TEST_CASE("unsupported dtypes and ranks are per-tensor: the rest of the file stays usable") {
    StBuilder b;
    b.json("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "U8", "[3]", "[4,7]") + "," +
           entry("c", "F64", "[1]", "[7,15]") + "," + entry("d", "F32", "[1,1,1,1,1]", "[15,19]") + "," +
           entry("e", "BOOL", "[1]", "[19,20]") + "," + entry("f", "F8_E4M3", "[2]", "[20,22]") + "," +
           entry("g", "F4", "[2]", "[22,23]") + "}")
        .zeros(23);
    auto st = SafeTensors::from_bytes(b.bytes(), "mixed.safetensors");
    CHECK(st->tensors().size() == 7);
    CHECK(st->read_f32("a") == std::vector<float>{0.f});
    CHECK(contains_all(error_of([&] { st->find("b"); }), {"mixed.safetensors", "tensor 'b'", "unsupported dtype U8"}));
    CHECK(contains_all(error_of([&] { st->read_f32("c"); }), {"tensor 'c'", "unsupported dtype F64"}));
    CHECK(contains_all(error_of([&] { st->at("d"); }), {"tensor 'd'", "rank 5"}));
    CHECK(contains_all(error_of([&] { st->at("e"); }), {"tensor 'e'", "BOOL"}));
    CHECK(contains_all(error_of([&] { st->at("f"); }), {"tensor 'f'", "F8_E4M3"}));
    CHECK(contains_all(error_of([&] { st->at("g"); }), {"tensor 'g'", "F4"}));
    CHECK(st->info("d")->dims.size() == 5);
}

// ---- malformed files: one case each --------------------------------------------------------------------------

TEST_CASE("malformed: empty file") {
    CHECK(contains_all(error_of([] { SafeTensors::from_bytes({}, "e.safetensors"); }), {"e.safetensors", "file is empty"}));
    const fs::path p = tmp_dir() / "empty.safetensors";
    std::ofstream(p, std::ios::binary).close();
    CHECK(contains_all(error_of([&] { SafeTensors::open(p); }), {p.string(), "file is empty", "at least 8 bytes"}));
}

TEST_CASE("malformed: truncated below 8 bytes") {
    std::vector<std::byte> five(5, std::byte{1});
    CHECK(contains_all(error_of([&] { SafeTensors::from_bytes(five, "t.safetensors"); }),
                       {"t.safetensors", "truncated", "got 5 bytes"}));
    const fs::path p = tmp_dir() / "short.safetensors";
    std::ofstream(p, std::ios::binary) << "abc";
    CHECK(contains_all(error_of([&] { SafeTensors::open(p); }), {p.string(), "truncated", "got 3 bytes"}));
}

TEST_CASE("malformed: header length past end of file") {
    StBuilder b;
    b.json("{}").length_field(100);
    CHECK(contains_all(load_error(b), {"bad.safetensors", "header length runs past the end of the file", "got 100"}));
}

TEST_CASE("malformed: huge header length (2^63) is not a safetensors file") {
    StBuilder b;
    b.json("{}").length_field(std::uint64_t(1) << 63);
    CHECK(contains_all(load_error(b), {"bad.safetensors: not a safetensors file", "9223372036854775808", "100000000-byte limit"}));
    b.length_field(~std::uint64_t(0));
    CHECK(contains_all(load_error(b), {"not a safetensors file"}));
}

TEST_CASE("a file of another kind is 'not a safetensors file', whatever its first 8 bytes say") {
    const std::string text = "hello, this is a text file and not a model\n";
    std::vector<std::byte> bytes;
    for (char c : text) bytes.push_back(static_cast<std::byte>(c));
    CHECK(contains_all(error_of([&] { SafeTensors::from_bytes(bytes, "notes.safetensors"); }),
                       {"flowedge: safetensors: notes.safetensors: not a safetensors file", "above the 100000000-byte limit"}));
    // A small length (here 40) followed by something other than '{' that also runs past the end: not a truncation.
    StBuilder b;
    b.json("PK\x03\x04 zip").length_field(40);
    CHECK(contains_all(load_error(b), {"not a safetensors file", "header length of 40 with no JSON header after it"}));
}

TEST_CASE("a partly written or downloaded file is 'file truncated: N of M bytes'") {
    // Header promises 16 data bytes, 6 arrived: the file has 8 + header + 6 of 8 + header + 16 bytes.
    StBuilder b;
    b.json("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[8,16]") + "}").zeros(6);
    const std::size_t head = 8 + b.header.size();
    CHECK(contains_all(load_error(b), {"bad.safetensors: file truncated: " + std::to_string(head + 6) + " of " +
                                           std::to_string(head + 16) + " bytes",
                                       "tensor 'b'"}));
    // The header itself cut short.
    StBuilder h;
    h.json("{\"a\":").length_field(200);
    CHECK(contains_all(load_error(h), {"file truncated: " + std::to_string(8 + h.header.size()) + " of at least 208 bytes"}));
    // The same on disk, through open().
    const std::vector<std::byte> full = [] {
        SafeTensorsWriter w;
        const std::vector<float> v(64, 1.f);
        w.add_f32("w", Shape{64}, v);
        return w.bytes();
    }();
    const fs::path p = tmp_dir() / "cut.safetensors";
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(full.data()), std::streamsize(full.size() - 100));
    CHECK(contains_all(error_of([&] { SafeTensors::open(p); }),
                       {p.string(), "file truncated: " + std::to_string(full.size() - 100) + " of " + std::to_string(full.size()) + " bytes"}));
}

TEST_CASE("malformed: invalid JSON header") {
    StBuilder b;
    b.json("{\"a\": {\"dtype\": ");
    CHECK(contains_all(load_error(b), {"bad.safetensors", "header is not valid JSON"}));
    b.json("");
    CHECK(contains_all(load_error(b), {"header is not valid JSON"}));
    b.json("{} trailing");
    CHECK(contains_all(load_error(b), {"header is not valid JSON"}));
}

TEST_CASE("malformed: header is not an object") {
    StBuilder b;
    b.json("[1, 2]");
    CHECK(contains_all(load_error(b), {"header is not a JSON object", "array"}));
    b.json("\"x\"");
    CHECK(contains_all(load_error(b), {"header is not a JSON object", "string"}));
}

TEST_CASE("malformed: entry is not an object") {
    StBuilder b;
    b.json("{\"w\": [1, 2]}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "entry is not a JSON object"}));
}

TEST_CASE("malformed: missing dtype / shape / data_offsets") {
    StBuilder b;
    b.json("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}").zeros(4);
    CHECK(contains_all(load_error(b), {"tensor 'w'", "missing 'dtype'"}));
    b.json("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "missing 'shape'"}));
    b.json("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "missing 'data_offsets'"}));
}

TEST_CASE("malformed: wrongly typed dtype / shape / data_offsets") {
    StBuilder b;
    b.zeros(4);
    b.json("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "'dtype' is not a string"}));
    b.json("{\"w\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "'shape' is not an array"}));
    b.json("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "'data_offsets' is not an array [begin, end]"}));
    b.json("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"begin\":0}}}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "'data_offsets' is not an array [begin, end]"}));
    b.json("{" + entry("w", "F32", "[1]", "[0.5,4]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "'data_offsets' begin", "non-integer"}));
    b.json("{" + entry("w", "F32", "[1]", "[-4,4]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "'data_offsets' begin", "negative"}));
    b.json("{" + entry("w", "F32", "[1]", "[0,\"4\"]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "'data_offsets' end"}));
}

TEST_CASE("malformed: negative shape") {
    StBuilder b;
    b.json("{" + entry("w", "F32", "[2,-1]", "[0,4]") + "}").zeros(4);
    CHECK(contains_all(load_error(b), {"tensor 'w'", "dimension 1", "negative value -1"}));
}

TEST_CASE("malformed: non-integer shape") {
    StBuilder b;
    b.json("{" + entry("w", "F32", "[2.5]", "[0,10]") + "}").zeros(10);
    CHECK(contains_all(load_error(b), {"tensor 'w'", "dimension 0", "non-integer"}));
    b.json("{" + entry("w", "F32", "[2.0]", "[0,8]") + "}").zeros(8);
    CHECK(contains_all(load_error(b), {"tensor 'w'", "non-integer"}));
    b.json("{" + entry("w", "F32", "[\"2\"]", "[0,8]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "dimension 0"}));
    b.json("{" + entry("w", "F32", "[1e30]", "[0,8]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "non-integer"}));
}

TEST_CASE("malformed: numel overflow") {
    StBuilder b;
    b.zeros(8);
    b.json("{" + entry("w", "F32", "[4294967296,4294967296,2]", "[0,8]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "element count overflows"}));
    // numel fits, numel * 4 bytes does not
    b.json("{" + entry("w", "F32", "[4611686018427387904]", "[0,8]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "overflows"}));
    // a zero dimension makes the product 0, however large the others: valid
    b.json("{" + entry("w", "F32", "[0,9223372036854775807]", "[0,0]") + "}");
    CHECK(SafeTensors::from_bytes(b.bytes())->at("w").bytes == 0);
    // dimension beyond int64
    b.json("{" + entry("w", "F32", "[9223372036854775808]", "[0,8]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "too large"}));
}

TEST_CASE("malformed: offsets out of range") {
    StBuilder b;
    b.json("{" + entry("w", "F32", "[2]", "[0,8]") + "}").zeros(6);
    CHECK(contains_all(load_error(b), {"tensor 'w'", "'data_offsets' out of range", "expected end <= 6, got 8"}));
    b.json("{" + entry("w", "F32", "[0]", "[18446744073709551615,18446744073709551615]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "too large"}));
}

TEST_CASE("malformed: begin > end") {
    StBuilder b;
    b.json("{" + entry("w", "F32", "[1]", "[8,4]") + "}").zeros(8);
    CHECK(contains_all(load_error(b), {"tensor 'w'", "begin is after end"}));
}

TEST_CASE("malformed: overlapping ranges") {
    StBuilder b;
    b.json("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}").zeros(12);
    CHECK(contains_all(load_error(b), {"tensors 'a' and 'b'", "overlapping"}));
    b.json("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[0,8]") + "}");
    CHECK(contains_all(load_error(b), {"overlapping"}));
}

TEST_CASE("malformed: size does not match dtype*shape") {
    StBuilder b;
    b.json("{" + entry("w", "BF16", "[3]", "[0,8]") + "}").zeros(8);
    CHECK(contains_all(load_error(b), {"tensor 'w'", "data size does not match dtype and shape", "expected 6 bytes, got 8 bytes"}));
    b.json("{" + entry("w", "F4", "[3]", "[0,2]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "whole bytes"}));
}

TEST_CASE("malformed: duplicate names") {
    StBuilder b;
    b.json("{" + entry("w", "F32", "[1]", "[0,4]") + "," + entry("w", "F32", "[1]", "[4,8]") + "}").zeros(8);
    CHECK(contains_all(load_error(b), {"bad.safetensors", "duplicate tensor name 'w'"}));
    // duplicate keys inside an entry or in __metadata__ are caught too
    b.json("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}}");
    CHECK(contains_all(load_error(b), {"duplicate key 'dtype'"}));
    b.json("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}");
    CHECK(contains_all(load_error(b), {"duplicate key 'k'"}));
    // the same key in two different objects is fine
    b.json("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[4,8]") + "}");
    CHECK(SafeTensors::from_bytes(b.bytes())->tensors().size() == 2);
}

TEST_CASE("malformed: unknown dtype") {
    StBuilder b;
    b.json("{" + entry("w", "F31", "[1]", "[0,4]") + "}").zeros(4);
    CHECK(contains_all(load_error(b), {"tensor 'w'", "unknown dtype 'F31'"}));
    b.json("{" + entry("w", "f32", "[1]", "[0,4]") + "}");
    CHECK(contains_all(load_error(b), {"tensor 'w'", "unknown dtype 'f32'"}));
}

TEST_CASE("malformed: unsupported dtype read by name") {
    StBuilder b;
    b.json("{" + entry("ids", "I64", "[2]", "[0,16]") + "," + entry("ok", "F16", "[1]", "[16,18]") + "}").zeros(18);
    auto st = SafeTensors::from_bytes(b.bytes(), "lerobot.safetensors");
    CHECK(st->read_f32("ok") == std::vector<float>{0.f});
    CHECK(contains_all(error_of([&] { st->read_f32("ids"); }),
                       {"flowedge: safetensors: lerobot.safetensors: tensor 'ids' has unsupported dtype I64"}));
}

TEST_CASE("malformed: non-string metadata") {
    StBuilder b;
    b.json("{\"__metadata__\":{\"format\":\"pt\",\"n\":3}}");
    CHECK(contains_all(load_error(b), {"__metadata__ value for 'n' is not a string", "integer"}));
    b.json("{\"__metadata__\":{\"nested\":{\"a\":\"b\"}}}");
    CHECK(contains_all(load_error(b), {"'nested' is not a string", "object"}));
    b.json("{\"__metadata__\":[\"a\"]}");
    CHECK(contains_all(load_error(b), {"__metadata__ is not a JSON object"}));
    b.json("{\"__metadata__\":null}");
    CHECK(contains_all(load_error(b), {"__metadata__ is not a JSON object"}));
}

TEST_CASE("malformed: missing file") {
    const fs::path p = tmp_dir() / "does_not_exist.safetensors";
    CHECK(contains_all(error_of([&] { SafeTensors::open(p); }), {"flowedge: safetensors:", p.string(), "cannot open file"}));
}

TEST_CASE("malformed: a directory path") {
    const fs::path p = tmp_dir();
    CHECK(contains_all(error_of([&] { SafeTensors::open(p); }), {p.string(), "is a directory"}));
}

TEST_CASE("writer rejects bad input, naming the tensor or path") {
    SafeTensorsWriter w;
    w.add_f32("a", Shape{1}, std::vector<float>{1.f});
    CHECK(contains_all(error_of([&] { w.add_f32("a", Shape{1}, std::vector<float>{1.f}); }), {"duplicate tensor name 'a'"}));
    CHECK(contains_all(error_of([&] { w.add_f32("b", Shape{2}, std::vector<float>{1.f}); }), {"tensor 'b'", "expected 2, got 1"}));
    const std::vector<std::byte> three(3);
    CHECK(contains_all(error_of([&] { w.add("c", DType::F16, Shape{2}, three); }), {"tensor 'c'", "expected 4 bytes, got 3 bytes"}));
    CHECK(contains_all(error_of([&] { w.add("d", DType::F32, Shape{-1}, nullptr); }), {"tensor 'd'", "negative dimension"}));
    CHECK(contains_all(error_of([&] { w.add_raw("e", "Q8", {1}, three); }), {"tensor 'e'", "unknown dtype 'Q8'"}));
    CHECK(contains_all(error_of([&] { w.add_f32("__metadata__", Shape{1}, std::vector<float>{1.f}); }), {"reserved"}));
    const fs::path bad = tmp_dir() / "no_such_dir" / "x.safetensors";
    CHECK(contains_all(error_of([&] { w.write(bad); }), {"cannot write", bad.string()}));
    CHECK(w.size() == 1);
}

TEST_CASE("writer add_raw keeps unsupported dtypes byte-exact") {
    SafeTensorsWriter w;
    const std::vector<std::int64_t> ids = {5, -6, 1ll << 40};
    w.add_raw("ids", "I64", {3}, as_bytes(ids));
    w.add_f32("f", Shape{1}, std::vector<float>{2.f});
    auto st = SafeTensors::from_bytes(w.bytes());
    const auto* t = st->info("ids");
    REQUIRE(t != nullptr);
    CHECK(t->dtype_name == "I64");
    CHECK(std::memcmp(t->raw, ids.data(), 24) == 0);
    CHECK(st->read_f32("f") == std::vector<float>{2.f});
}

TEST_CASE("fuzz: truncations and byte mutations of a valid file never crash") {
    SafeTensorsWriter w;
    w.add_f32("a", Shape{2, 2}, std::vector<float>{1, 2, 3, 4});
    w.add("b", DType::BF16, Shape{3}, std::vector<std::uint16_t>{1, 2, 3}.data());
    w.set_metadata("k", "v");
    const auto good = w.bytes();
    int n_ok = 0, n_err = 0;
    auto attempt = [&](std::vector<std::byte> bytes) {
        try {
            auto st = SafeTensors::from_bytes(std::move(bytes), "fuzz");
            for (const auto& t : st->tensors())
                if (t.supported()) (void)st->read_f32(t.name);
            ++n_ok;
        } catch (const Error&) {
            ++n_err;
        }
    };
    for (std::size_t n = 0; n < good.size(); ++n) attempt(std::vector<std::byte>(good.begin(), good.begin() + std::ptrdiff_t(n)));
    for (std::size_t i = 0; i < good.size(); ++i)
        for (unsigned v : {0x00u, 0x22u, 0x2cu, 0x30u, 0x39u, 0x5bu, 0x7du, 0xffu}) {
            auto m = good;
            m[i] = std::byte(v);
            attempt(std::move(m));
        }
    attempt(good);
    CHECK(n_ok > 0);
    CHECK(n_err > 0);
    MESSAGE("fuzz: " << n_ok << " accepted, " << n_err << " rejected");
}
