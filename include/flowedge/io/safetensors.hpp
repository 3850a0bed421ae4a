// safetensors reader (mmap, zero-copy, validated before use) and writer: the checkpoint format of SPEC §2.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "flowedge/dtype.hpp"
#include "flowedge/error.hpp"
#include "flowedge/tensor.hpp"

namespace flowedge::io {

/// One tensor of a safetensors file. `data` points into the mapping and stays valid while the file lives.
/// Only F32/BF16/F16 tensors are readable (`readable()`); others are listed by name and dtype string.
struct TensorInfo {
    std::string name;
    std::string dtype_name;  ///< as written in the header, e.g. "F32", "I64"
    DType dtype = DType::F32;  ///< meaningful only when readable()
    Shape shape{};             ///< meaningful only when readable() (rank <= 4)
    std::vector<std::int64_t> dims;  ///< full shape, any rank
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
    bool supported = false;

    bool readable() const { return supported; }
    /// Throws naming the tensor unless it is F32/BF16/F16 with rank <= 4.
    void require_float(std::string_view component, const std::string& file) const {
        if (!supported)
            fail(component, file + ": tensor '" + name + "' has unsupported dtype " + dtype_name +
                                (dims.size() > 4 ? " or rank " + std::to_string(dims.size()) : std::string()) +
                                " (expected F32, BF16 or F16, rank <= 4)");
    }
};

/// A validated, read-only safetensors file (memory-mapped, or an in-memory copy).
/// Immutable after open: safe to share between threads.
class SafeTensors {
public:
    static constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

    SafeTensors(const SafeTensors&) = delete;
    SafeTensors& operator=(const SafeTensors&) = delete;
    ~SafeTensors() {
        if (m_map) ::munmap(m_map, m_map_size);
    }

    /// Maps `path` read-only and validates the whole header before anything is used.
    static std::shared_ptr<const SafeTensors> open(const std::filesystem::path& path) {
        std::shared_ptr<SafeTensors> st(new SafeTensors());
        st->m_path = path;
        const std::string where = path.string();
        std::error_code ec;
        if (!std::filesystem::exists(path, ec)) fail("safetensors", where + ": no such file");
        if (std::filesystem::is_directory(path, ec)) fail("safetensors", where + ": is a directory, not a .safetensors file");
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) fail("safetensors", where + ": cannot open (" + std::strerror(errno) + ")");
        struct stat sb {};
        if (::fstat(fd, &sb) != 0) {
            ::close(fd);
            fail("safetensors", where + ": cannot stat");
        }
        const std::size_t size = static_cast<std::size_t>(sb.st_size);
        if (size < 8) {
            ::close(fd);
            fail("safetensors", where + ": file too small for a header" + expected_got(">= 8 bytes", std::to_string(size) + " bytes"));
        }
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        ::close(fd);
        if (p == MAP_FAILED) fail("safetensors", where + ": mmap failed (" + std::strerror(errno) + ")");
        st->m_map = p;
        st->m_map_size = size;
        st->parse(static_cast<const std::byte*>(p), size);
        return st;
    }

    /// Validates and serves an in-memory file (tests, fuzzing, embedded checkpoints).
    static std::shared_ptr<const SafeTensors> from_bytes(std::vector<std::byte> bytes, std::string name = "<memory>") {
        std::shared_ptr<SafeTensors> st(new SafeTensors());
        st->m_path = name;
        st->m_owned = std::move(bytes);
        if (st->m_owned.size() < 8)
            fail("safetensors", name + ": file too small for a header" +
                                    expected_got(">= 8 bytes", std::to_string(st->m_owned.size()) + " bytes"));
        st->parse(st->m_owned.data(), st->m_owned.size());
        return st;
    }

    const std::filesystem::path& path() const { return m_path; }
    bool contains(std::string_view name) const { return find(name) != nullptr; }
    const TensorInfo* find(std::string_view name) const {
        auto it = m_index.find(std::string(name));
        return it == m_index.end() ? nullptr : &m_tensors[it->second];
    }
    const TensorInfo& at(std::string_view name) const {
        const TensorInfo* t = find(name);
        if (!t) fail("safetensors", m_path.string() + ": missing tensor '" + std::string(name) + "'");
        return *t;
    }
    /// All tensors, sorted by data offset.
    const std::vector<TensorInfo>& tensors() const { return m_tensors; }
    const std::map<std::string, std::string>& metadata() const { return m_metadata; }

    /// Copies tensor `name` widened to float32.
    std::vector<float> read_f32(std::string_view name) const {
        const TensorInfo& t = at(name);
        t.require_float("safetensors", m_path.string());
        const std::size_t n = static_cast<std::size_t>(t.shape.numel());
        std::vector<float> out(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (t.dtype == DType::F32) std::memcpy(&out[i], t.data + 4 * i, 4);
            else {
                std::uint16_t h;
                std::memcpy(&h, t.data + 2 * i, 2);
                out[i] = t.dtype == DType::BF16 ? to_float(bf16{h}) : to_float(f16{h});
            }
        }
        return out;
    }

private:
    SafeTensors() = default;

    static bool dtype_info(const std::string& s, std::size_t& size, DType& dt, bool& supported) {
        static const std::map<std::string, std::size_t> others = {
            {"F64", 8}, {"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4}, {"I16", 2}, {"U16", 2},
            {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"E8M0", 1}};
        supported = true;
        if (s == "F32") { size = 4; dt = DType::F32; return true; }
        if (s == "BF16") { size = 2; dt = DType::BF16; return true; }
        if (s == "F16") { size = 2; dt = DType::F16; return true; }
        supported = false;
        auto it = others.find(s);
        if (it == others.end()) return false;
        size = it->second;
        return true;
    }

    void parse(const std::byte* base, std::size_t size) {
        const std::string where = m_path.string();
        auto bad = [&](const std::string& what) { fail("safetensors", where + ": " + what); };
        std::uint64_t header_len = 0;
        for (int i = 0; i < 8; ++i) header_len |= std::uint64_t(std::to_integer<std::uint8_t>(base[i])) << (8 * i);
        if (header_len > kMaxHeaderBytes)
            bad("header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
        if (header_len > size - 8)
            bad("header length runs past the end of the file" +
                expected_got("<= " + std::to_string(size - 8), std::to_string(header_len)));
        const std::string_view text(reinterpret_cast<const char*>(base + 8), static_cast<std::size_t>(header_len));
        const std::byte* data = base + 8 + header_len;
        const std::size_t data_size = size - 8 - static_cast<std::size_t>(header_len);

        // nlohmann keeps the last of duplicate keys silently: record top-level keys while parsing.
        std::set<std::string> seen;
        std::string duplicate;
        nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
            if (ev == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
                const auto& k = parsed.get_ref<const std::string&>();
                if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
            }
            return true;
        };
        nlohmann::json header;
        try {
            header = nlohmann::json::parse(text.begin(), text.end(), cb);
        } catch (const nlohmann::json::exception& e) {
            bad(std::string("header is not valid JSON: ") + e.what());
        }
        if (!duplicate.empty()) bad("duplicate tensor name '" + duplicate + "' in header");
        if (!header.is_object()) bad("header is not a JSON object");

        for (auto it = header.begin(); it != header.end(); ++it) {
            const std::string& name = it.key();
            const nlohmann::json& v = it.value();
            if (name == "__metadata__") {
                if (!v.is_object()) bad("__metadata__ is not an object of strings");
                for (auto m = v.begin(); m != v.end(); ++m) {
                    if (!m.value().is_string()) bad("__metadata__ value '" + m.key() + "' is not a string");
                    m_metadata[m.key()] = m.value().get<std::string>();
                }
                continue;
            }
            auto tbad = [&](const std::string& what) { bad("tensor '" + name + "': " + what); };
            if (!v.is_object()) tbad("entry is not an object");
            if (!v.contains("dtype") || !v["dtype"].is_string()) tbad("missing or non-string 'dtype'");
            if (!v.contains("shape") || !v["shape"].is_array()) tbad("missing or non-array 'shape'");
            if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
                tbad("missing 'data_offsets' [begin, end]");
            TensorInfo t;
            t.name = name;
            t.dtype_name = v["dtype"].get<std::string>();
            std::size_t elem = 0;
            if (!dtype_info(t.dtype_name, elem, t.dtype, t.supported)) tbad("unknown dtype '" + t.dtype_name + "'");
            std::uint64_t numel = 1;
            for (const auto& d : v["shape"]) {
                if (!d.is_number_integer() || (d.is_number_integer() && !d.is_number_unsigned() && d.get<std::int64_t>() < 0))
                    tbad("shape entries must be non-negative integers");
                const std::uint64_t dv = d.get<std::uint64_t>();
                if (dv != 0 && numel > (std::uint64_t(1) << 62) / dv) tbad("shape element count overflows");
                numel *= dv;
                t.dims.push_back(static_cast<std::int64_t>(dv));
            }
            const auto& off = v["data_offsets"];
            if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
                if (!(off[0].is_number_integer() && off[1].is_number_integer() && off[0].get<std::int64_t>() >= 0 &&
                      off[1].get<std::int64_t>() >= 0))
                    tbad("data_offsets must be non-negative integers");
            const std::uint64_t begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
            if (begin > end) tbad("data_offsets begin > end (" + std::to_string(begin) + " > " + std::to_string(end) + ")");
            if (end > data_size)
                tbad("data_offsets out of range" + expected_got("end <= " + std::to_string(data_size), std::to_string(end)));
            if (numel > (std::uint64_t(1) << 62) / elem) tbad("byte size overflows");
            if (end - begin != numel * elem)
                tbad("byte size does not match dtype x shape" +
                     expected_got(std::to_string(numel * elem), std::to_string(end - begin)));
            t.data = data + begin;
            t.bytes = static_cast<std::size_t>(end - begin);
            if (t.dims.size() <= 4) {
                for (auto d : t.dims) t.shape.dims[static_cast<std::size_t>(t.shape.rank++)] = d;
            } else {
                t.supported = false;
            }
            m_tensors.push_back(std::move(t));
        }
        std::sort(m_tensors.begin(), m_tensors.end(),
                  [](const TensorInfo& a, const TensorInfo& b) { return a.data < b.data || (a.data == b.data && a.bytes < b.bytes); });
        for (std::size_t i = 1; i < m_tensors.size(); ++i) {
            const TensorInfo& a = m_tensors[i - 1];
            const TensorInfo& b = m_tensors[i];
            if (a.data + a.bytes > b.data && a.bytes > 0 && b.bytes > 0)
                bad("tensors '" + a.name + "' and '" + b.name + "' have overlapping data ranges");
        }
        for (std::size_t i = 0; i < m_tensors.size(); ++i) m_index.emplace(m_tensors[i].name, i);
    }

    std::filesystem::path m_path;
    void* m_map = nullptr;
    std::size_t m_map_size = 0;
    std::vector<std::byte> m_owned;
    std::vector<TensorInfo> m_tensors;
    std::map<std::string, std::size_t> m_index;
    std::map<std::string, std::string> m_metadata;
};

/// Builds a safetensors file: 8-byte little-endian header length, JSON header padded with spaces to a
/// multiple of 8, then the tensors' bytes in insertion order.
class SafeTensorsWriter {
public:
    void add(std::string name, DType dtype, Shape shape, std::span<const std::byte> data) {
        const std::size_t want = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
        if (data.size() != want)
            fail("safetensors writer", "tensor '" + name + "': byte size does not match dtype x shape" +
                                           expected_got(std::to_string(want), std::to_string(data.size())));
        for (const auto& e : m_entries)
            if (e.name == name) fail("safetensors writer", "duplicate tensor name '" + name + "'");
        m_entries.push_back({std::move(name), dtype, shape, std::vector<std::byte>(data.begin(), data.end())});
    }
    /// Same, from a raw pointer holding shape.numel() elements of `dtype`.
    void add(std::string name, DType dtype, Shape shape, const void* data) {
        const std::size_t n = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
        add(std::move(name), dtype, shape, std::span<const std::byte>(static_cast<const std::byte*>(data), n));
    }
    void add_f32(std::string name, Shape shape, std::span<const float> values) {
        add(std::move(name), DType::F32, shape, std::as_bytes(values));
    }
    void set_metadata(std::string key, std::string value) { m_metadata[std::move(key)] = std::move(value); }

    std::vector<std::byte> bytes() const {
        const std::string h = header();
        std::vector<std::byte> out(8 + h.size());
        const std::uint64_t len = h.size();
        for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = std::byte((len >> (8 * i)) & 0xff);
        std::memcpy(out.data() + 8, h.data(), h.size());
        for (const auto& e : m_entries) out.insert(out.end(), e.data.begin(), e.data.end());
        return out;
    }
    void write(const std::filesystem::path& path) const {
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        if (!f) fail("safetensors writer", path.string() + ": cannot open for writing");
        const std::string h = header();
        const std::uint64_t len = h.size();
        char lenbytes[8];
        for (int i = 0; i < 8; ++i) lenbytes[i] = static_cast<char>((len >> (8 * i)) & 0xff);
        f.write(lenbytes, 8);
        f.write(h.data(), static_cast<std::streamsize>(h.size()));
        for (const auto& e : m_entries) f.write(reinterpret_cast<const char*>(e.data.data()), static_cast<std::streamsize>(e.data.size()));
        if (!f) fail("safetensors writer", path.string() + ": write failed");
    }

private:
    struct Entry {
        std::string name;
        DType dtype;
        Shape shape;
        std::vector<std::byte> data;
    };
    std::string header() const {
        nlohmann::ordered_json j = nlohmann::ordered_json::object();
        if (!m_metadata.empty()) j["__metadata__"] = m_metadata;
        std::uint64_t off = 0;
        for (const auto& e : m_entries) {
            std::vector<std::int64_t> dims(e.shape.dims.begin(), e.shape.dims.begin() + e.shape.rank);
            j[e.name] = {{"dtype", std::string(dtype_name(e.dtype))}, {"shape", dims}, {"data_offsets", {off, off + e.data.size()}}};
            off += e.data.size();
        }
        std::string h = j.dump();
        while (h.size() % 8) h += ' ';
        return h;
    }
    std::vector<Entry> m_entries;
    std::map<std::string, std::string> m_metadata;
};

}  // namespace flowedge::io
