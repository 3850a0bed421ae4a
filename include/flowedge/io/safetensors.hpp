// safetensors reader (mmap, fully validated before use) and writer: the one weight format flowedge loads.
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "flowedge/dtype.hpp"
#include "flowedge/error.hpp"
#include "flowedge/tensor.hpp"

static_assert(std::endian::native == std::endian::little, "flowedge: safetensors data is little-endian; big-endian hosts are not supported");

namespace flowedge::io {

namespace detail {

/// One dtype string a safetensors header may carry; `bits` per element.
struct SafetensorsDtype {
    std::string_view name;
    unsigned bits;
    bool supported;  ///< F32/BF16/F16: flowedge can read it
    DType dtype;     ///< meaningful only when supported
};

/// Every dtype of the safetensors format (as of 0.5); only F32/BF16/F16 are supported by flowedge.
inline const SafetensorsDtype* find_safetensors_dtype(std::string_view name) {
    static constexpr std::array<SafetensorsDtype, 20> table{{
        {"F32", 32, true, DType::F32},     {"BF16", 16, true, DType::BF16},   {"F16", 16, true, DType::F16},
        {"F64", 64, false, DType::F32},    {"I64", 64, false, DType::F32},    {"U64", 64, false, DType::F32},
        {"I32", 32, false, DType::F32},    {"U32", 32, false, DType::F32},    {"I16", 16, false, DType::F32},
        {"U16", 16, false, DType::F32},    {"I8", 8, false, DType::F32},      {"U8", 8, false, DType::F32},
        {"BOOL", 8, false, DType::F32},    {"F8_E4M3", 8, false, DType::F32}, {"F8_E5M2", 8, false, DType::F32},
        {"F8_E8M0", 8, false, DType::F32}, {"F6_E2M3", 6, false, DType::F32}, {"F6_E3M2", 6, false, DType::F32},
        {"F4", 4, false, DType::F32},      {"C64", 64, false, DType::F32},
    }};
    for (const auto& d : table)
        if (d.name == name) return &d;
    return nullptr;
}

inline std::string json_kind(const nlohmann::json& j) {
    if (j.is_number_float()) return "non-integer number";
    if (j.is_number_integer() || j.is_number_unsigned()) return "integer";
    return j.type_name();
}

/// Reads a JSON value that must be a non-negative integer fitting in int64 (shape dims, offsets).
/// Returns an empty string on success, else what is wrong with it.
inline std::string read_index(const nlohmann::json& j, std::uint64_t& out) {
    if (j.is_number_unsigned()) {
        out = j.get<std::uint64_t>();
        if (out > std::uint64_t(std::numeric_limits<std::int64_t>::max())) return "value " + std::to_string(out) + " is too large";
        return {};
    }
    if (j.is_number_integer()) return "negative value " + std::to_string(j.get<std::int64_t>());
    if (j.is_number_float()) return "non-integer value " + j.dump();
    return std::string("value of type ") + j.type_name() + " (expected a non-negative integer)";
}

inline std::string errno_text(int err) { return std::generic_category().message(err); }

}  // namespace detail

/// One tensor entry of a safetensors file. Entries with a dtype flowedge cannot read (I64, U8, F64, ...)
/// or a rank above 4 are kept (listed by SafeTensors::tensors()) but are not `supported()`: their `data`
/// is nullptr and `dtype`/`shape` carry no meaning; SafeTensors::find/at/read_f32 refuse them by dtype name.
struct TensorInfo {
    std::string name;
    DType dtype = DType::F32;          ///< storage type; meaningful only when supported()
    Shape shape{};                     ///< row-major shape; meaningful only when supported()
    const std::byte* data = nullptr;   ///< first byte (possibly unaligned); nullptr unless supported()
    std::size_t bytes = 0;             ///< data size in bytes (== numel * element size)
    std::string dtype_name;            ///< dtype exactly as in the header ("F32", "I64", ...)
    std::vector<std::int64_t> dims;    ///< full shape as in the header (any rank)
    std::size_t offset = 0;            ///< begin offset inside the data section
    const std::byte* raw = nullptr;    ///< first byte for any dtype (use with dtype_name/dims only)
    std::string unsupported_reason;    ///< empty when supported()

    /// True when flowedge can read the data (dtype F32/BF16/F16 and rank <= 4).
    bool supported() const { return unsupported_reason.empty(); }
    /// Returns *this, or throws a flowedge::Error "flowedge: <component>: <file>: tensor '<name>' has
    /// unsupported dtype <dtype> (expected F32, BF16 or F16)".
    const TensorInfo& require_float(std::string_view component, std::string_view file) const {
        if (!supported()) fail(ErrorKind::Unsupported, component, std::string(file) + ": tensor '" + name + "' " + unsupported_reason);
        return *this;
    }
    /// require_float with component "safetensors".
    const TensorInfo& require_float(std::string_view file) const { return require_float("safetensors", file); }
};

/// A validated safetensors file, mapped read-only (or an in-memory copy). Immutable after construction,
/// so any number of threads may read it at once. Held by shared_ptr: Parameters keep it alive when they
/// reference mapped data in place.
class SafeTensors {
public:
    /// Largest header accepted (same limit as the reference implementation).
    static constexpr std::uint64_t max_header_bytes = 100'000'000;

    /// mmap the file read-only (POSIX mmap; header parsed with nlohmann::json); validate everything first.
    static std::shared_ptr<const SafeTensors> open(const std::filesystem::path& path) {
        std::shared_ptr<SafeTensors> st(new SafeTensors());
        st->m_path = path;
        st->m_label = path.string();
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) st->error("cannot open file: " + detail::errno_text(errno), ErrorKind::Io);
        struct stat sb {};
        if (::fstat(fd, &sb) != 0) {
            const int err = errno;
            ::close(fd);
            st->error("cannot stat file: " + detail::errno_text(err), ErrorKind::Io);
        }
        if (S_ISDIR(sb.st_mode)) {
            ::close(fd);
            st->error("is a directory (expected a safetensors file)", ErrorKind::Io);
        }
        if (!S_ISREG(sb.st_mode)) {
            ::close(fd);
            st->error("not a regular file", ErrorKind::Io);
        }
        const std::size_t size = static_cast<std::size_t>(sb.st_size);
        if (size < 8) {
            ::close(fd);
            st->error(std::string(size == 0 ? "file is empty" : "file is truncated") +
                      expected_got("at least 8 bytes", std::to_string(size) + " bytes"));
        }
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        const int err = errno;
        ::close(fd);
        if (p == MAP_FAILED) st->error("cannot mmap file: " + detail::errno_text(err), ErrorKind::Io);
        st->m_map = p;
        st->m_map_bytes = size;
        st->m_base = static_cast<const std::byte*>(p);
        st->m_size = size;
        st->parse();
        return st;
    }

    /// Same validation over an in-memory copy (tests, fuzzing).
    static std::shared_ptr<const SafeTensors> from_bytes(std::vector<std::byte> bytes, std::string name = "<memory>") {
        std::shared_ptr<SafeTensors> st(new SafeTensors());
        st->m_path = name;
        st->m_label = std::move(name);
        st->m_owned = std::move(bytes);
        st->m_base = st->m_owned.data();
        st->m_size = st->m_owned.size();
        if (st->m_size < 8)
            st->error(std::string(st->m_size == 0 ? "file is empty" : "file is truncated") +
                      expected_got("at least 8 bytes", std::to_string(st->m_size) + " bytes"));
        st->parse();
        return st;
    }

    SafeTensors(const SafeTensors&) = delete;
    SafeTensors& operator=(const SafeTensors&) = delete;
    SafeTensors(SafeTensors&&) = delete;
    SafeTensors& operator=(SafeTensors&&) = delete;
    ~SafeTensors() {
        if (m_map) ::munmap(m_map, m_map_bytes);
    }

    const std::filesystem::path& path() const { return m_path; }
    /// Total file size in bytes.
    std::size_t file_size() const { return m_size; }
    /// True when the header lists `name` (whatever its dtype).
    bool contains(std::string_view name) const { return m_index.find(name) != m_index.end(); }
    /// Entry for `name` whatever its dtype (nullptr when absent); never throws.
    const TensorInfo* info(std::string_view name) const {
        auto it = m_index.find(name);
        return it == m_index.end() ? nullptr : &m_tensors[it->second];
    }
    /// Supported entry for `name`; nullptr when absent; Error naming the dtype when it is not F32/BF16/F16.
    const TensorInfo* find(std::string_view name) const {
        const TensorInfo* t = info(name);
        if (t) t->require_float(m_label);
        return t;
    }
    /// Like find(), but a missing tensor is an Error "flowedge: safetensors: <file>: missing tensor '<name>'".
    const TensorInfo& at(std::string_view name) const {
        const TensorInfo* t = find(name);
        if (!t) error("missing tensor '" + std::string(name) + "'");
        return *t;
    }
    /// Every entry (supported or not), sorted by data offset.
    const std::vector<TensorInfo>& tensors() const { return m_tensors; }
    /// __metadata__ (string->string only); empty when the header has none.
    const std::map<std::string, std::string>& metadata() const { return m_metadata; }

    /// Copies a tensor widened to float32 (any of F32/BF16/F16); checks the element count.
    std::vector<float> read_f32(std::string_view name) const {
        const TensorInfo& t = at(name);
        const std::size_t n = static_cast<std::size_t>(t.shape.numel());
        if (n * dtype_size(t.dtype) != t.bytes)
            error("tensor '" + t.name + "': element count does not match its byte size" +
                  expected_got(std::to_string(t.bytes / dtype_size(t.dtype)), std::to_string(n)));
        std::vector<float> out(n);
        if (t.dtype == DType::F32) {
            if (n) std::memcpy(out.data(), t.data, n * sizeof(float));
            return out;
        }
        for (std::size_t i = 0; i < n; ++i) {
            std::uint16_t h;
            std::memcpy(&h, t.data + 2 * i, 2);
            out[i] = t.dtype == DType::BF16 ? to_float(bf16{h}) : to_float(f16{h});
        }
        return out;
    }

private:
    SafeTensors() = default;

    /// A problem with the file's content (BadFile) unless `kind` says otherwise (Io for open/stat/mmap).
    [[noreturn]] void error(const std::string& what, ErrorKind kind = ErrorKind::BadFile) const {
        fail(kind, "safetensors", m_label + ": " + what);
    }
    [[noreturn]] void tensor_error(const std::string& name, const std::string& what) const {
        error("tensor '" + name + "': " + what);
    }

    /// Validates the whole header against the bytes at m_base/m_size and fills the index.
    void parse() {
        std::uint64_t n_header = 0;
        for (int i = 7; i >= 0; --i) n_header = (n_header << 8) | std::to_integer<std::uint64_t>(m_base[i]);
        // A safetensors file opens with a little-endian header length and then '{'. Any other file read that way
        // (text, .npy, a torch .pt zip) gives an absurd length or no '{': say what the file is not.
        if (n_header > max_header_bytes || (m_size > 8 && std::to_integer<char>(m_base[8]) != '{' && n_header > m_size - 8))
            error("not a safetensors file (its first 8 bytes give a header length of " + std::to_string(n_header) +
                  (n_header > max_header_bytes ? ", above the " + std::to_string(max_header_bytes) + "-byte limit)"
                                               : " with no JSON header after it)"));
        if (n_header > m_size - 8)
            error("file truncated: " + std::to_string(m_size) + " of at least " + std::to_string(8 + n_header) +
                  " bytes (header length runs past the end of the file" +
                  expected_got("<= " + std::to_string(m_size - 8), std::to_string(n_header)) + ")");
        const std::size_t data_begin = 8 + static_cast<std::size_t>(n_header);
        const std::size_t data_size = m_size - data_begin;
        const char* text = reinterpret_cast<const char*>(m_base + 8);

        // nlohmann keeps the last of duplicate keys silently: track the keys of every open object.
        std::vector<std::set<std::string>> open_objects;
        std::string duplicate;
        std::size_t duplicate_depth = 0;
        nlohmann::json::parser_callback_t cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
            using E = nlohmann::json::parse_event_t;
            if (ev == E::object_start) open_objects.emplace_back();
            else if (ev == E::object_end) {
                if (!open_objects.empty()) open_objects.pop_back();
            } else if (ev == E::key && !open_objects.empty() && duplicate.empty()) {
                const std::string& k = parsed.get_ref<const std::string&>();
                if (!open_objects.back().insert(k).second) {
                    duplicate = k;
                    duplicate_depth = open_objects.size();
                }
            }
            return true;
        };
        nlohmann::json header;
        try {
            header = nlohmann::json::parse(text, text + n_header, cb);
        } catch (const nlohmann::json::exception& e) {
            error(std::string("header is not valid JSON: ") + e.what());
        }
        if (!duplicate.empty()) {
            if (duplicate_depth == 1) error("duplicate tensor name '" + duplicate + "' in header");
            error("duplicate key '" + duplicate + "' in header");
        }
        if (!header.is_object()) error(std::string("header is not a JSON object (got ") + header.type_name() + ")");

        check_data_present(header, data_begin);
        m_tensors.reserve(header.size());
        for (const auto& [name, entry] : header.items()) {
            if (name == "__metadata__") {
                if (!entry.is_object()) error(std::string("__metadata__ is not a JSON object (got ") + entry.type_name() + ")");
                for (const auto& [k, v] : entry.items()) {
                    if (!v.is_string())
                        error("__metadata__ value for '" + k + "' is not a string (got " + detail::json_kind(v) + ")");
                    m_metadata.emplace(k, v.get<std::string>());
                }
                continue;
            }
            m_tensors.push_back(parse_entry(name, entry, data_begin, data_size));
        }

        std::sort(m_tensors.begin(), m_tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
            if (a.offset != b.offset) return a.offset < b.offset;
            if (a.bytes != b.bytes) return a.bytes < b.bytes;
            return a.name < b.name;
        });
        // Non-empty ranges must not overlap (empty tensors occupy no bytes).
        const TensorInfo* prev = nullptr;
        for (const TensorInfo& t : m_tensors) {
            if (t.bytes == 0) continue;
            if (prev && t.offset < prev->offset + prev->bytes)
                error("tensors '" + prev->name + "' and '" + t.name + "' have overlapping data ranges ('" + prev->name +
                      "' is [" + std::to_string(prev->offset) + ", " + std::to_string(prev->offset + prev->bytes) + "), '" +
                      t.name + "' begins at " + std::to_string(t.offset) + ")");
            prev = &t;
        }
        for (std::size_t i = 0; i < m_tensors.size(); ++i) m_index.emplace(m_tensors[i].name, i);
    }

    /// A header whose tensors end past the end of the file almost always belongs to a partly copied or downloaded
    /// file: say "file truncated: N of M bytes" (the reading a user can act on: copy it again), then name the
    /// tensor that runs furthest past the end.
    void check_data_present(const nlohmann::json& header, std::size_t data_begin) const {
        const std::size_t data_size = m_size - data_begin;
        std::uint64_t max_end = 0;
        std::string furthest;
        for (const auto& [name, entry] : header.items()) {
            if (name == "__metadata__" || !entry.is_object()) continue;
            auto jo = entry.find("data_offsets");
            if (jo == entry.end() || !jo->is_array() || jo->size() != 2) continue;
            std::uint64_t end = 0;
            if (!detail::read_index((*jo)[1], end).empty() || end <= max_end) continue;
            max_end = end;
            furthest = name;
        }
        if (max_end > data_size)
            error("file truncated: " + std::to_string(m_size) + " of " + std::to_string(data_begin + max_end) + " bytes (tensor '" + furthest + "': 'data_offsets' out of range" +
                  expected_got("end <= " + std::to_string(data_size), std::to_string(max_end)) + ")");
    }

    TensorInfo parse_entry(const std::string& name, const nlohmann::json& entry, std::size_t data_begin, std::size_t data_size) const {
        if (!entry.is_object()) tensor_error(name, std::string("entry is not a JSON object (got ") + entry.type_name() + ")");
        TensorInfo t;
        t.name = name;
        // dtype
        auto jd = entry.find("dtype");
        if (jd == entry.end()) tensor_error(name, "missing 'dtype'");
        if (!jd->is_string()) tensor_error(name, std::string("'dtype' is not a string (got ") + jd->type_name() + ")");
        t.dtype_name = jd->get<std::string>();
        const detail::SafetensorsDtype* dt = detail::find_safetensors_dtype(t.dtype_name);
        if (!dt) tensor_error(name, "unknown dtype '" + t.dtype_name + "'");
        // shape
        auto js = entry.find("shape");
        if (js == entry.end()) tensor_error(name, "missing 'shape'");
        if (!js->is_array()) tensor_error(name, std::string("'shape' is not an array (got ") + js->type_name() + ")");
        std::uint64_t numel = 1;
        bool overflow = false;
        for (std::size_t i = 0; i < js->size(); ++i) {
            std::uint64_t d = 0;
            const std::string bad = detail::read_index((*js)[i], d);
            if (!bad.empty()) tensor_error(name, "'shape' dimension " + std::to_string(i) + ": " + bad);
            t.dims.push_back(static_cast<std::int64_t>(d));
            if (__builtin_mul_overflow(numel, d, &numel)) overflow = true;
        }
        std::uint64_t bits = 0;
        if (overflow || __builtin_mul_overflow(numel, std::uint64_t(dt->bits), &bits) ||
            numel > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
            tensor_error(name, "element count overflows (shape " + js->dump() + ")");
        if (bits % 8 != 0)
            tensor_error(name, "shape " + js->dump() + " of " + t.dtype_name + " does not fill whole bytes");
        const std::uint64_t want_bytes = bits / 8;
        // data_offsets
        auto jo = entry.find("data_offsets");
        if (jo == entry.end()) tensor_error(name, "missing 'data_offsets'");
        if (!jo->is_array() || jo->size() != 2)
            tensor_error(name, "'data_offsets' is not an array [begin, end] (got " + jo->dump() + ")");
        std::uint64_t begin = 0, end = 0;
        std::string bad = detail::read_index((*jo)[0], begin);
        if (!bad.empty()) tensor_error(name, "'data_offsets' begin: " + bad);
        bad = detail::read_index((*jo)[1], end);
        if (!bad.empty()) tensor_error(name, "'data_offsets' end: " + bad);
        if (begin > end)
            tensor_error(name, "'data_offsets' begin is after end" + expected_got("begin <= " + std::to_string(end), std::to_string(begin)));
        if (end > data_size)
            tensor_error(name, "'data_offsets' out of range" + expected_got("end <= " + std::to_string(data_size), std::to_string(end)));
        if (end - begin != want_bytes)
            tensor_error(name, "data size does not match dtype and shape (" + t.dtype_name + " " + js->dump() + ")" +
                               expected_got(std::to_string(want_bytes) + " bytes", std::to_string(end - begin) + " bytes"));
        t.offset = static_cast<std::size_t>(begin);
        t.bytes = static_cast<std::size_t>(want_bytes);
        t.raw = m_base + data_begin + t.offset;
        if (!dt->supported)
            t.unsupported_reason = "has unsupported dtype " + t.dtype_name + " (expected F32, BF16 or F16)";
        else if (t.dims.size() > 4)
            t.unsupported_reason = "has rank " + std::to_string(t.dims.size()) + " (expected at most 4)";
        if (t.supported()) {
            t.dtype = dt->dtype;
            for (auto d : t.dims) t.shape.dims[static_cast<std::size_t>(t.shape.rank++)] = d;
            t.data = t.raw;
        }
        return t;
    }

    std::filesystem::path m_path;
    std::string m_label;               // file name used in every error message
    const std::byte* m_base = nullptr;
    std::size_t m_size = 0;
    void* m_map = nullptr;
    std::size_t m_map_bytes = 0;
    std::vector<std::byte> m_owned;    // from_bytes storage
    std::vector<TensorInfo> m_tensors;
    std::map<std::string, std::size_t, std::less<>> m_index;
    std::map<std::string, std::string> m_metadata;
};

/// Builds a valid safetensors file: 8-byte LE header length, JSON header padded with spaces to 8 bytes,
/// then the tensors back to back (widest dtype first, then by name, so F32 data stays 4-byte aligned).
class SafeTensorsWriter {
public:
    /// Adds a tensor; `data` must hold exactly numel(shape) * dtype_size(dtype) bytes.
    void add(std::string name, DType dtype, Shape shape, std::span<const std::byte> data) {
        std::vector<std::int64_t> dims(shape.dims.begin(), shape.dims.begin() + shape.rank);
        add_raw(std::move(name), std::string(dtype_name(dtype)), std::move(dims), data);
    }
    /// Adds a tensor copying numel(shape) * dtype_size(dtype) bytes from `data`.
    void add(std::string name, DType dtype, Shape shape, const void* data) {
        check_shape(name, shape);
        const std::size_t n = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
        if (n && !data) fail("safetensors", "writer: tensor '" + name + "': null data for " + std::to_string(n) + " bytes");
        add(std::move(name), dtype, shape, std::span<const std::byte>(static_cast<const std::byte*>(data), n));
    }
    /// Adds an F32 tensor; `values` must hold numel(shape) floats.
    void add_f32(std::string name, Shape shape, std::span<const float> values) {
        check_shape(name, shape);
        if (values.size() != static_cast<std::size_t>(shape.numel()))
            fail("safetensors", "writer: tensor '" + name + "': value count does not match shape " + shape.str() +
                                    expected_got(shape.numel(), values.size()));
        add(std::move(name), DType::F32, shape, std::as_bytes(values));
    }
    /// Adds a tensor of any safetensors dtype (e.g. "I64"), any rank, copying `data`.
    void add_raw(std::string name, std::string dtype, std::vector<std::int64_t> dims, std::span<const std::byte> data) {
        const detail::SafetensorsDtype* dt = detail::find_safetensors_dtype(dtype);
        if (!dt) fail("safetensors", "writer: tensor '" + name + "': unknown dtype '" + dtype + "'");
        if (name == "__metadata__") fail("safetensors", "writer: '__metadata__' is reserved and cannot name a tensor");
        for (const Entry& e : m_entries)
            if (e.name == name) fail("safetensors", "writer: duplicate tensor name '" + name + "'");
        std::uint64_t numel = 1;
        for (auto d : dims) {
            if (d < 0) fail("safetensors", "writer: tensor '" + name + "': negative dimension " + std::to_string(d));
            if (__builtin_mul_overflow(numel, std::uint64_t(d), &numel))
                fail("safetensors", "writer: tensor '" + name + "': element count overflows");
        }
        const std::uint64_t bits = numel * dt->bits;
        if (bits % 8 != 0 || bits / 8 != data.size())
            fail("safetensors", "writer: tensor '" + name + "': data size does not match dtype and shape" +
                                    expected_got(std::to_string(bits / 8) + " bytes", std::to_string(data.size()) + " bytes"));
        m_entries.push_back(Entry{std::move(name), std::move(dtype), std::move(dims),
                                  std::vector<std::byte>(data.begin(), data.end()), dt->bits});
    }
    void set_metadata(std::string key, std::string value) { m_metadata[std::move(key)] = std::move(value); }
    /// Number of tensors added so far.
    std::size_t size() const { return m_entries.size(); }

    /// The complete file contents.
    std::vector<std::byte> bytes() const {
        std::vector<const Entry*> order;
        for (const Entry& e : m_entries) order.push_back(&e);
        std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
            if (a->bits != b->bits) return a->bits > b->bits;
            return a->name < b->name;
        });
        nlohmann::json header = nlohmann::json::object();
        if (!m_metadata.empty()) header["__metadata__"] = m_metadata;
        std::size_t offset = 0;
        for (const Entry* e : order) {
            header[e->name] = {{"dtype", e->dtype}, {"shape", e->dims}, {"data_offsets", {offset, offset + e->data.size()}}};
            offset += e->data.size();
        }
        std::string text = header.dump();
        text.append((8 - text.size() % 8) % 8, ' ');
        std::vector<std::byte> out;
        out.reserve(8 + text.size() + offset);
        const std::uint64_t n = text.size();
        for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((n >> (8 * i)) & 0xffu));
        for (char c : text) out.push_back(static_cast<std::byte>(c));
        for (const Entry* e : order) out.insert(out.end(), e->data.begin(), e->data.end());
        return out;
    }

    /// Writes the file (to a temporary beside it, then renamed, so a mapped old file is never truncated);
    /// Error naming the path on failure.
    void write(const std::filesystem::path& path) const {
        const std::vector<std::byte> data = bytes();
        std::filesystem::path tmp = path;
        tmp += ".tmp" + std::to_string(::getpid());
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) fail(ErrorKind::Io, "safetensors", "cannot write '" + path.string() + "': " + detail::errno_text(errno));
        std::size_t done = 0;
        while (done < data.size()) {
            const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                const int err = w < 0 ? errno : EIO;
                ::close(fd);
                ::unlink(tmp.c_str());
                fail(ErrorKind::Io, "safetensors", "cannot write '" + path.string() + "': " + detail::errno_text(err));
            }
            done += static_cast<std::size_t>(w);
        }
        if (::close(fd) != 0) {
            const int err = errno;
            ::unlink(tmp.c_str());
            fail(ErrorKind::Io, "safetensors", "cannot write '" + path.string() + "': " + detail::errno_text(err));
        }
        if (::rename(tmp.c_str(), path.c_str()) != 0) {
            const int err = errno;
            ::unlink(tmp.c_str());
            fail(ErrorKind::Io, "safetensors", "cannot write '" + path.string() + "': " + detail::errno_text(err));
        }
    }

private:
    static void check_shape(const std::string& name, const Shape& shape) {
        if (shape.rank < 0 || shape.rank > 4) fail("safetensors", "writer: tensor '" + name + "': bad rank " + std::to_string(shape.rank));
        for (int i = 0; i < shape.rank; ++i)
            if (shape[i] < 0) fail("safetensors", "writer: tensor '" + name + "': negative dimension " + std::to_string(shape[i]));
    }
    struct Entry {
        std::string name;
        std::string dtype;
        std::vector<std::int64_t> dims;
        std::vector<std::byte> data;
        unsigned bits;
    };
    std::vector<Entry> m_entries;
    std::map<std::string, std::string> m_metadata;
};

}  // namespace flowedge::io
