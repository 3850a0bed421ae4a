// .npz (numpy's ZIP archive of .npy members) reader and stored-member writer: the --obs input of flowedge-policy,
// where each member is one LeRobot feature ("observation.state.npy" -> "observation.state").
// np.savez writes stored members, np.savez_compressed deflate members (inflated through zlib when the target is
// built with FLOWEDGE_WITH_ZLIB); numpy always puts a zip64 extra field in the local headers, and a write-only
// stream gets data descriptors, so both are read. Everything is validated before a byte is used: the end records,
// every central and local header, sizes, overlaps and each member's CRC-32. Multi-disk archives, encryption and
// other compression methods are Unsupported errors.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#ifdef FLOWEDGE_WITH_ZLIB
#include <zlib.h>
#endif

#include "flowedge/error.hpp"
#include "flowedge/io/npy.hpp"

namespace flowedge::io {

/// One array of a .npz: its name (the member's file name less ".npy") and its whole .npy image.
struct NpzMember {
    std::string name;
    std::vector<std::byte> npy;
};

/// What a member holds, from its .npy header: numpy's dtype descr ('<f4', '|u1', ...) and its shape.
struct NpzArrayInfo {
    std::string descr;
    std::vector<std::int64_t> shape;
    /// numpy's name of the dtype ("float32", "uint8", ...).
    std::string type_name() const { return detail::npy_type_name(descr); }
};

namespace detail {

/// A malformed archive (BadFile) unless `kind` says otherwise.
[[noreturn]] inline void npz_fail(const std::string& where, const std::string& what, ErrorKind kind = ErrorKind::BadFile) {
    fail(kind, "npz", where + ": " + what);
}

inline constexpr std::array<std::uint32_t, 256> crc32_table() {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
        std::uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[i] = c;
    }
    return t;
}

/// CRC-32 as ZIP stores it (IEEE 802.3, reflected polynomial 0xEDB88320, initial and final XOR 0xFFFFFFFF).
inline std::uint32_t crc32(std::span<const std::byte> data) {
    static constexpr std::array<std::uint32_t, 256> table = crc32_table();
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::byte b : data) c = table[(c ^ std::to_integer<std::uint32_t>(b)) & 0xFFu] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

inline std::string hex32(std::uint32_t v) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string s = "0x";
    for (int k = 7; k >= 0; --k) s += digits[(v >> (4 * k)) & 0xFu];
    return s;
}

/// Little-endian reads of the archive image (callers check the bounds first).
struct ZipBytes {
    std::span<const std::byte> b;
    const std::string& where;

    std::uint64_t le(std::uint64_t at, int n) const {
        std::uint64_t v = 0;
        for (int k = 0; k < n; ++k) v |= std::uint64_t(std::to_integer<unsigned>(b[at + std::uint64_t(k)])) << (8 * k);
        return v;
    }
    std::uint16_t u16(std::uint64_t at) const { return std::uint16_t(le(at, 2)); }
    std::uint32_t u32(std::uint64_t at) const { return std::uint32_t(le(at, 4)); }
    std::uint64_t u64(std::uint64_t at) const { return le(at, 8); }
};

inline constexpr std::uint32_t kLocalSig = 0x04034b50u, kCentralSig = 0x02014b50u, kEndSig = 0x06054b50u,
                               kZip64EndSig = 0x06064b50u, kZip64LocatorSig = 0x07064b50u, kDescriptorSig = 0x08074b50u;
inline constexpr std::uint16_t kStored = 0, kDeflate = 8;

/// One member as the central directory describes it (zip64 fields resolved).
struct ZipEntry {
    std::string file_name;
    std::uint16_t flags = 0, method = 0;
    std::uint32_t crc = 0;
    std::uint64_t csize = 0, usize = 0, local_offset = 0;
    std::uint64_t data_start = 0, region_end = 0;  // filled from the local header
};

/// Resolves the zip64 extra field (id 0x0001) of a header: it holds, in this order, the 64-bit values of exactly
/// those fields whose 32-bit slot is saturated (the local header always carries both sizes when present).
inline void read_zip64_extra(const ZipBytes& z, std::uint64_t at, std::uint64_t len, const std::string& member,
                             std::uint64_t* usize, std::uint64_t* csize, std::uint64_t* offset, bool* present = nullptr) {
    std::uint64_t q = at;
    const std::uint64_t end = at + len;
    while (q < end) {
        if (end - q < 4) npz_fail(z.where, "member '" + member + "': malformed extra field (a record header is cut off)");
        const std::uint16_t id = z.u16(q), size = z.u16(q + 2);
        if (size > end - q - 4)
            npz_fail(z.where, "member '" + member + "': malformed extra field" +
                                  expected_got("<= " + std::to_string(end - q - 4) + " bytes", std::to_string(size) + " bytes"));
        if (id == 0x0001) {
            if (present) *present = true;
            std::uint64_t r = q + 4;
            const std::uint64_t r_end = r + size;
            for (std::uint64_t* field : {usize, csize, offset}) {
                if (!field || *field != 0xFFFFFFFFu) continue;
                if (r_end - r < 8) npz_fail(z.where, "member '" + member + "': zip64 extra field is too short for its saturated sizes");
                *field = z.u64(r);
                r += 8;
            }
        }
        q += 4 + std::uint64_t(size);
    }
}

/// Locates the end records and reads every central directory entry, then checks each local header against it.
inline std::vector<ZipEntry> read_zip_directory(const ZipBytes& z) {
    const std::string& where = z.where;
    const std::uint64_t size = z.b.size();
    if (size >= 6 && z.u32(0) == 0x4d554e93u && z.u16(4) == 0x5950u)  // "\x93NUMPY"
        npz_fail(where, "this is a .npy file, not a .npz archive (read it as .npy, or save with np.savez)");
    if (size < 22) npz_fail(where, "not a .npz (zip) file: too short for an end-of-central-directory record" +
                                       expected_got("at least 22 bytes", std::to_string(size) + " bytes"));
    // The end record is the last 22 bytes plus a comment of up to 65535 bytes; its comment length must reach the end.
    std::uint64_t eocd = std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t lowest = size - 22 > 65535 ? size - 22 - 65535 : 0;
    for (std::uint64_t p = size - 22 + 1; p-- > lowest;)
        if (z.u32(p) == kEndSig && p + 22 + z.u16(p + 20) == size) {
            eocd = p;
            break;
        }
    if (eocd == std::numeric_limits<std::uint64_t>::max())
        npz_fail(where, std::string(size >= 4 && z.u32(0) == kLocalSig ? "truncated zip archive" : "not a .npz (zip) file") +
                            ": no end-of-central-directory record");
    std::uint64_t disk = z.u16(eocd + 4), cd_disk = z.u16(eocd + 6), n_disk = z.u16(eocd + 8), n_total = z.u16(eocd + 10);
    std::uint64_t cd_size = z.u32(eocd + 12), cd_off = z.u32(eocd + 16);
    std::uint64_t cd_limit = eocd;  // the central directory must end exactly here
    const bool has_locator = eocd >= 20 && z.u32(eocd - 20) == kZip64LocatorSig;
    if (has_locator) {
        const std::uint64_t loc = eocd - 20;
        const std::uint64_t rec = z.u64(loc + 8);
        if (z.u32(loc + 4) != 0 || z.u32(loc + 16) != 1) npz_fail(where, "multi-disk zip archives are not supported", ErrorKind::Unsupported);
        if (rec > loc || loc - rec < 56) npz_fail(where, "zip64 end record offset " + std::to_string(rec) + " is out of range");
        if (z.u32(rec) != kZip64EndSig) npz_fail(where, "zip64 end record has a bad signature");
        if (z.u64(rec + 4) != loc - rec - 12)
            npz_fail(where, "zip64 end record size does not reach its locator" +
                                expected_got(std::to_string(loc - rec - 12), std::to_string(z.u64(rec + 4))));
        disk = z.u32(rec + 16);
        cd_disk = z.u32(rec + 20);
        n_disk = z.u64(rec + 24);
        n_total = z.u64(rec + 32);
        cd_size = z.u64(rec + 40);
        cd_off = z.u64(rec + 48);
        cd_limit = rec;
    } else if (n_total == 0xFFFFu || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
        npz_fail(where, "end record says zip64 but the zip64 end locator is missing");
    }
    if (disk != 0 || cd_disk != 0 || n_disk != n_total) npz_fail(where, "multi-disk zip archives are not supported", ErrorKind::Unsupported);
    if (cd_off > cd_limit || cd_size != cd_limit - cd_off)
        npz_fail(where, "central directory does not end where the end record starts (corrupt, or data prepended)" +
                            expected_got("offset + size = " + std::to_string(cd_limit),
                                         std::to_string(cd_off) + " + " + std::to_string(cd_size)));
    if (n_total > cd_size / 46)
        npz_fail(where, "central directory is too small for its entry count" +
                            expected_got(">= " + std::to_string(n_total * 46) + " bytes", std::to_string(cd_size) + " bytes"));

    std::vector<ZipEntry> entries;
    entries.reserve(std::size_t(n_total));
    std::uint64_t p = cd_off;
    for (std::uint64_t i = 0; i < n_total; ++i) {
        if (cd_limit - p < 46) npz_fail(where, "central directory entry " + std::to_string(i) + " is cut off");
        if (z.u32(p) != kCentralSig) npz_fail(where, "central directory entry " + std::to_string(i) + " has a bad signature");
        ZipEntry e;
        e.flags = z.u16(p + 8);
        e.method = z.u16(p + 10);
        e.crc = z.u32(p + 16);
        e.csize = z.u32(p + 20);
        e.usize = z.u32(p + 24);
        const std::uint64_t n_len = z.u16(p + 28), e_len = z.u16(p + 30), c_len = z.u16(p + 32);
        std::uint64_t start_disk = z.u16(p + 34);
        e.local_offset = z.u32(p + 42);
        if (n_len + e_len + c_len > cd_limit - p - 46)
            npz_fail(where, "central directory entry " + std::to_string(i) + ": name/extra/comment run past the directory");
        e.file_name.assign(reinterpret_cast<const char*>(z.b.data() + p + 46), std::size_t(n_len));
        read_zip64_extra(z, p + 46 + n_len, e_len, e.file_name, &e.usize, &e.csize, &e.local_offset);
        if (start_disk != 0) npz_fail(where, "multi-disk zip archives are not supported", ErrorKind::Unsupported);
        if (e.flags & (0x0001u | 0x0040u | 0x2000u))
            npz_fail(where, "member '" + e.file_name + "' is encrypted (not supported)", ErrorKind::Unsupported);
        if (e.method != kStored && e.method != kDeflate)
            npz_fail(where, "member '" + e.file_name + "' uses compression method " + std::to_string(e.method) +
                                " (expected 0 = stored, as np.savez writes, or 8 = deflate, as np.savez_compressed writes)",
                     ErrorKind::Unsupported);
        if (e.method == kStored && e.csize != e.usize)
            npz_fail(where, "member '" + e.file_name + "' is stored but its sizes differ" +
                                expected_got(std::to_string(e.usize) + " bytes", std::to_string(e.csize) + " bytes"));
        // Deflate cannot expand beyond ~1032:1; a larger declared size is corrupt (and would be a huge allocation).
        if (e.method == kDeflate && e.usize / 1032 > e.csize + 64)
            npz_fail(where, "member '" + e.file_name + "' declares " + std::to_string(e.usize) + " bytes from " +
                                std::to_string(e.csize) + " compressed bytes, more than deflate can produce");
        entries.push_back(std::move(e));
        p += 46 + n_len + e_len + c_len;
    }
    if (p != cd_limit)
        npz_fail(where, "central directory has bytes after its last entry" +
                            expected_got(std::to_string(cd_size) + " bytes of entries", std::to_string(p - cd_off) + " bytes"));

    for (ZipEntry& e : entries) {
        const std::string& m = e.file_name;
        if (e.local_offset > cd_off || cd_off - e.local_offset < 30)
            npz_fail(where, "member '" + m + "': local header offset " + std::to_string(e.local_offset) + " is out of range");
        const std::uint64_t q = e.local_offset;
        if (z.u32(q) != kLocalSig) npz_fail(where, "member '" + m + "': local header has a bad signature");
        const std::uint16_t flags = z.u16(q + 6), method = z.u16(q + 8);
        const std::uint32_t crc = z.u32(q + 14);
        std::uint64_t csize = z.u32(q + 18), usize = z.u32(q + 22);
        const std::uint64_t n_len = z.u16(q + 26), e_len = z.u16(q + 28);
        if (n_len + e_len > cd_off - q - 30) npz_fail(where, "member '" + m + "': local header runs into the central directory");
        const std::string_view local_name(reinterpret_cast<const char*>(z.b.data() + q + 30), std::size_t(n_len));
        if (local_name != m)
            npz_fail(where, "local header names '" + std::string(local_name) + "' where the central directory names '" + m + "'");
        if (method != e.method || (flags & 0x0008u) != (e.flags & 0x0008u))
            npz_fail(where, "member '" + m + "': local header disagrees with the central directory on method or flags");
        bool local_zip64 = false;
        read_zip64_extra(z, q + 30 + n_len, e_len, m, &usize, &csize, nullptr, &local_zip64);
        e.data_start = q + 30 + n_len + e_len;
        if (e.csize > cd_off - e.data_start)
            npz_fail(where, "member '" + m + "': data runs into the central directory (truncated or corrupt)" +
                                expected_got("<= " + std::to_string(cd_off - e.data_start) + " bytes", std::to_string(e.csize) + " bytes"));
        e.region_end = e.data_start + e.csize;
        if (!(e.flags & 0x0008u)) {
            if (crc != e.crc || csize != e.csize || usize != e.usize)
                npz_fail(where, "member '" + m + "': local header CRC/sizes disagree with the central directory" +
                                    expected_got(hex32(e.crc) + " " + std::to_string(e.csize) + "/" + std::to_string(e.usize),
                                                 hex32(crc) + " " + std::to_string(csize) + "/" + std::to_string(usize)));
        } else {
            // Data descriptor after the data: [signature] crc, compressed size, uncompressed size (8-byte sizes with zip64).
            std::uint64_t d = e.region_end;
            if (cd_off - d >= 4 && z.u32(d) == kDescriptorSig) d += 4;
            const std::uint64_t w = local_zip64 ? 8 : 4;
            if (cd_off - d < 4 + 2 * w) npz_fail(where, "member '" + m + "': data descriptor is cut off");
            const std::uint64_t dc = z.le(d + 4, int(w)), du = z.le(d + 4 + w, int(w));
            if (z.u32(d) != e.crc || dc != e.csize || du != e.usize)
                npz_fail(where, "member '" + m + "': data descriptor disagrees with the central directory");
            e.region_end = d + 4 + 2 * w;
        }
    }
    // Members may not share bytes (a crafted archive could otherwise inflate one region many times).
    std::vector<const ZipEntry*> by_offset;
    for (const ZipEntry& e : entries) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->local_offset < b->local_offset; });
    for (std::size_t k = 1; k < by_offset.size(); ++k)
        if (by_offset[k - 1]->region_end > by_offset[k]->local_offset)
            npz_fail(where, "members '" + by_offset[k - 1]->file_name + "' and '" + by_offset[k]->file_name + "' overlap");
    return entries;
}

/// Inflates a raw deflate stream (no zlib/gzip wrapper) into exactly `usize` bytes.
inline std::vector<std::byte> inflate_member(std::span<const std::byte> in, std::uint64_t usize, const std::string& where,
                                             const std::string& member) {
#ifdef FLOWEDGE_WITH_ZLIB
    std::vector<std::byte> out(std::size_t(usize) + 1);  // one spare byte: a stream that inflates past usize is caught
    z_stream zs{};
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) npz_fail(where, "zlib inflateInit2 failed", ErrorKind::Internal);
    std::size_t in_done = 0, out_done = 0;
    int rc = Z_OK;
    constexpr std::size_t chunk = std::size_t(1) << 30;  // zlib counts in 32-bit uInt
    while (rc == Z_OK) {
        if (zs.avail_in == 0 && in_done < in.size()) {
            const std::size_t n = std::min(chunk, in.size() - in_done);
            zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data() + in_done));
            zs.avail_in = uInt(n);
            in_done += n;
        }
        if (zs.avail_out == 0 && out_done < out.size()) {
            const std::size_t n = std::min(chunk, out.size() - out_done);
            zs.next_out = reinterpret_cast<Bytef*>(out.data() + out_done);
            zs.avail_out = uInt(n);
            out_done += n;
        }
        rc = inflate(&zs, Z_NO_FLUSH);
    }
    const std::uint64_t produced = zs.total_out, consumed = zs.total_in;
    const std::string msg = zs.msg ? zs.msg : "";
    inflateEnd(&zs);
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) npz_fail(where, "member '" + member + "': corrupt deflate data (" + msg + ")");
    if (rc == Z_MEM_ERROR) npz_fail(where, "member '" + member + "': zlib ran out of memory", ErrorKind::OutOfMemory);
    if (rc != Z_STREAM_END)
        npz_fail(where, "member '" + member + "': deflate stream " +
                            (produced > usize ? "inflates to more than its declared size" : "ends early (truncated or corrupt)") +
                            expected_got(std::to_string(usize) + " bytes", std::to_string(produced) + " bytes"));
    if (produced != usize)
        npz_fail(where, "member '" + member + "': inflated size does not match the directory" +
                            expected_got(std::to_string(usize) + " bytes", std::to_string(produced) + " bytes"));
    if (consumed != in.size())
        npz_fail(where, "member '" + member + "': deflate stream ends before its compressed size" +
                            expected_got(std::to_string(in.size()) + " bytes", std::to_string(consumed) + " bytes"));
    out.resize(std::size_t(usize));
    return out;
#else
    (void)in;
    (void)usize;
    npz_fail(where, "member '" + member + "' is deflate-compressed (np.savez_compressed) and this build has no zlib: "
                    "save with np.savez, or rebuild flowedge with zlib installed (zlib1g-dev)", ErrorKind::Unsupported);
#endif
}

}  // namespace detail

/// A validated .npz archive held in memory: every member's .npy image, its name and header.
class Npz {
public:
    /// Validates a whole archive image (see the file comment); `where` names it in errors.
    static Npz parse(std::span<const std::byte> bytes, const std::string& where = "<memory>") {
        const detail::ZipBytes z{bytes, where};
        Npz out;
        out.m_where = where;
        for (const detail::ZipEntry& e : detail::read_zip_directory(z)) {
            const std::string& f = e.file_name;
            if (f.size() <= 4 || f.compare(f.size() - 4, 4, ".npy") != 0)
                detail::npz_fail(where, "member '" + f + "' is not a .npy array (every member of a .npz is <name>.npy)");
            const std::span<const std::byte> data = bytes.subspan(std::size_t(e.data_start), std::size_t(e.csize));
            NpzMember m;
            m.name = f.substr(0, f.size() - 4);
            if (out.find(m.name)) detail::npz_fail(where, "member '" + f + "' appears twice");
            m.npy = e.method == detail::kStored ? std::vector<std::byte>(data.begin(), data.end())
                                                : detail::inflate_member(data, e.usize, where, f);
            const std::uint32_t crc = detail::crc32(m.npy);
            if (crc != e.crc)
                detail::npz_fail(where, "member '" + f + "': CRC-32 mismatch (corrupt data)" +
                                            expected_got(detail::hex32(e.crc), detail::hex32(crc)));
            const detail::NpyLayout layout = detail::parse_npy_layout(m.npy, out.where_of(m.name));
            out.m_info.push_back({layout.header.descr, layout.header.shape});
            out.m_members.push_back(std::move(m));
        }
        return out;
    }

    /// Reads and validates a .npz file.
    static Npz read(const std::filesystem::path& path) {
        const std::vector<std::byte> bytes = detail::read_file_bytes(path, "npz");
        return parse(bytes, path.string());
    }

    const std::string& where() const { return m_where; }
    const std::vector<NpzMember>& members() const { return m_members; }
    /// Array names in archive order.
    std::vector<std::string> names() const {
        std::vector<std::string> n;
        for (const NpzMember& m : m_members) n.push_back(m.name);
        return n;
    }
    bool contains(std::string_view name) const { return find(name) != nullptr; }
    /// dtype and shape of an array; an Error naming the key and the arrays present when it is missing.
    const NpzArrayInfo& info(std::string_view name) const { return m_info[index(name)]; }

    /// The array as float32 / int32 / uint8; any other dtype is an Error naming the key and numpy's fix.
    NpyArrayF32 f32(std::string_view name) const { return detail::parse_npy<float>(m_members[index(name)].npy, where_of(name)); }
    NpyArrayI32 i32(std::string_view name) const {
        return detail::parse_npy<std::int32_t>(m_members[index(name)].npy, where_of(name));
    }
    NpyArrayU8 u8(std::string_view name) const {
        return detail::parse_npy<std::uint8_t>(m_members[index(name)].npy, where_of(name));
    }

    /// "obs.npz[observation.state]": how errors about one array name it.
    std::string where_of(std::string_view name) const { return m_where + "[" + std::string(name) + "]"; }

private:
    const NpzMember* find(std::string_view name) const {
        for (const NpzMember& m : m_members)
            if (m.name == name) return &m;
        return nullptr;
    }
    std::size_t index(std::string_view name) const {
        for (std::size_t i = 0; i < m_members.size(); ++i)
            if (m_members[i].name == name) return i;
        std::string have;
        for (const NpzMember& m : m_members) have += (have.empty() ? "'" : ", '") + m.name + "'";
        fail(ErrorKind::BadInput, "npz", m_where + ": no array '" + std::string(name) + "'" +
                                             expected_got("a member '" + std::string(name) + ".npy'", have.empty() ? "no arrays" : have));
    }

    std::string m_where;
    std::vector<NpzMember> m_members;
    std::vector<NpzArrayInfo> m_info;
};

/// Builds a .npz of stored members (what np.savez writes, without zip64: members and archive below 4 GiB).
class NpzWriter {
public:
    void add(NpzMember m) {
        if (m.name.empty()) detail::npz_fail("<writer>", "array name is empty", ErrorKind::BadInput);
        for (const NpzMember& o : m_members)
            if (o.name == m.name) detail::npz_fail("<writer>", "array '" + m.name + "' is added twice", ErrorKind::BadInput);
        m_members.push_back(std::move(m));
    }
    void add_f32(std::string name, std::span<const std::int64_t> shape, std::span<const float> v) {
        add({std::move(name), npy_bytes_f32(shape, v)});
    }
    void add_i32(std::string name, std::span<const std::int64_t> shape, std::span<const std::int32_t> v) {
        add({std::move(name), npy_bytes_i32(shape, v)});
    }
    void add_u8(std::string name, std::span<const std::int64_t> shape, std::span<const std::uint8_t> v) {
        add({std::move(name), npy_bytes_u8(shape, v)});
    }

    /// The archive image: local header + data per member, central directory, end record.
    std::vector<std::byte> bytes() const {
        std::vector<std::byte> out, central;
        auto put = [](std::vector<std::byte>& v, std::uint64_t x, int n) {
            for (int k = 0; k < n; ++k) v.push_back(std::byte((x >> (8 * k)) & 0xFFu));
        };
        if (m_members.size() >= 0xFFFFu) detail::npz_fail("<writer>", "too many arrays for a zip without zip64", ErrorKind::Unsupported);
        for (const NpzMember& m : m_members) {
            const std::string file = m.name + ".npy";
            const std::uint64_t offset = out.size();
            if (file.size() > 0xFFFFu || m.npy.size() >= 0xFFFFFFFFu || offset >= 0xFFFFFFFFu)
                detail::npz_fail("<writer>", "array '" + m.name + "' does not fit a zip without zip64", ErrorKind::Unsupported);
            const std::uint32_t crc = detail::crc32(m.npy);
            const bool utf8 = std::any_of(file.begin(), file.end(), [](char c) { return (unsigned char)c >= 0x80; });
            const std::uint16_t flags = utf8 ? 0x0800u : 0;
            auto common = [&](std::vector<std::byte>& v) {  // version needed .. extra length, shared by both headers
                put(v, 20, 2);                               // version needed: 2.0
                put(v, flags, 2);
                put(v, detail::kStored, 2);
                put(v, 0, 2);                                // time 00:00:00
                put(v, (0u << 9) | (1u << 5) | 1u, 2);       // date 1980-01-01 (fixed: the same arrays give the same bytes)
                put(v, crc, 4);
                put(v, m.npy.size(), 4);
                put(v, m.npy.size(), 4);
                put(v, file.size(), 2);
                put(v, 0, 2);
            };
            put(out, detail::kLocalSig, 4);
            common(out);
            for (char c : file) out.push_back(std::byte(c));
            out.insert(out.end(), m.npy.begin(), m.npy.end());

            put(central, detail::kCentralSig, 4);
            put(central, (3u << 8) | 20u, 2);  // made by: Unix, 2.0 (so the mode bits below are read)
            common(central);
            put(central, 0, 2);                // comment length
            put(central, 0, 2);                // disk
            put(central, 0, 2);                // internal attributes
            put(central, std::uint64_t(0100644) << 16, 4);  // regular file, rw-r--r--
            put(central, offset, 4);
            for (char c : file) central.push_back(std::byte(c));
        }
        const std::uint64_t cd_off = out.size();
        if (cd_off + central.size() >= 0xFFFFFFFFu) detail::npz_fail("<writer>", "archive does not fit a zip without zip64", ErrorKind::Unsupported);
        out.insert(out.end(), central.begin(), central.end());
        put(out, detail::kEndSig, 4);
        put(out, 0, 2);
        put(out, 0, 2);
        put(out, m_members.size(), 2);
        put(out, m_members.size(), 2);
        put(out, central.size(), 4);
        put(out, cd_off, 4);
        put(out, 0, 2);
        return out;
    }

    void write(const std::filesystem::path& path) const { detail::write_file_bytes(path, bytes(), "npz"); }

private:
    std::vector<NpzMember> m_members;
};

/// Reads and validates a .npz file (Npz::read).
inline Npz read_npz(const std::filesystem::path& path) { return Npz::read(path); }

}  // namespace flowedge::io
