// The one exception type flowedge throws, so callers can catch load/setup problems in one place, and its kind,
// so they can react to the category of a failure without reading the message.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace flowedge {

/// What went wrong, in the categories a caller can act on. The C API's fe_status codes are these kinds
/// (capi/error_map.hpp), so a new kind needs a status there too.
enum class ErrorKind : std::uint8_t {
    BadInput,           ///< a caller's value: out of range, unknown name, too-small buffer, misuse of a call sequence
    BadShape,           ///< a caller's buffer has the wrong number of elements or is not a whole number of rows
    Io,                 ///< a file cannot be opened, mapped or read
    BadFile,            ///< a file is malformed: bad header, missing or ill-shaped tensor, inconsistent config
    Unsupported,        ///< valid, but flowedge or this build cannot do it (dtype, scheduler config, kernel set, ...)
    OutOfMemory,        ///< a host allocation failed or would not fit in memory
    DeviceOutOfMemory,  ///< a GPU allocation failed
    Device,             ///< a GPU or CUDA failure, or a GPU that was required is not used
    NonFinite,          ///< a NaN/Inf input, or inference produced a non-finite value
    BadState,           ///< a saved decode state was rejected (truncated, other version, other model, corrupted)
    Internal,           ///< an invariant of flowedge itself broke (a bug)
};

/// Lower-case name of a kind ("bad input", "bad file", ...), for logs and test output.
constexpr const char* error_kind_name(ErrorKind k) noexcept {
    switch (k) {
        case ErrorKind::BadInput: return "bad input";
        case ErrorKind::BadShape: return "bad shape";
        case ErrorKind::Io: return "io";
        case ErrorKind::BadFile: return "bad file";
        case ErrorKind::Unsupported: return "unsupported";
        case ErrorKind::OutOfMemory: return "out of memory";
        case ErrorKind::DeviceOutOfMemory: return "device out of memory";
        case ErrorKind::Device: return "device";
        case ErrorKind::NonFinite: return "non-finite";
        case ErrorKind::BadState: return "bad state";
        case ErrorKind::Internal: return "internal";
    }
    return "unknown";
}

/// Error raised by every load, setup and shape check; message is
/// "flowedge: <component>: <what> (expected X, got Y)", kind() its category.
class Error : public std::runtime_error {
public:
    explicit Error(const std::string& msg, ErrorKind kind = ErrorKind::BadInput) : std::runtime_error(msg), m_kind(kind) {}
    explicit Error(const char* msg, ErrorKind kind = ErrorKind::BadInput) : std::runtime_error(msg), m_kind(kind) {}

    ErrorKind kind() const noexcept { return m_kind; }

private:
    ErrorKind m_kind;
};

/// Throws flowedge::Error of `kind` with the canonical "flowedge: <component>: <what>" message.
[[noreturn]] inline void fail(ErrorKind kind, std::string_view component, std::string_view what) {
    std::string msg = "flowedge: ";
    msg.append(component).append(": ").append(what);
    throw Error(msg, kind);
}

/// Throws a BadInput flowedge::Error: the caller passed something wrong (the common case of a failed check).
[[noreturn]] inline void fail(std::string_view component, std::string_view what) {
    fail(ErrorKind::BadInput, component, what);
}

/// Throws unless `cond` holds; cheap enough for hot paths (message built only on failure).
inline void check(bool cond, std::string_view component, std::string_view what) {
    if (!cond) [[unlikely]] fail(component, what);
}

/// Same, with the kind of the failure.
inline void check(bool cond, ErrorKind kind, std::string_view component, std::string_view what) {
    if (!cond) [[unlikely]] fail(kind, component, what);
}

/// "(expected X, got Y)" suffix used throughout error messages.
template <class A, class B>
std::string expected_got(const A& expected, const B& got) {
    using std::to_string;
    auto str = [](const auto& v) {
        if constexpr (std::is_convertible_v<decltype(v), std::string_view>) return std::string(v);
        else return std::to_string(v);
    };
    return " (expected " + str(expected) + ", got " + str(got) + ")";
}

}  // namespace flowedge
