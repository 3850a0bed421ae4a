// The one exception type flowedge throws, so callers can catch load/setup problems in one place.
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

namespace flowedge {

/// Error raised by every load, setup and shape check; message is
/// "flowedge: <component>: <what> (expected X, got Y)".
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Throws flowedge::Error with the canonical "flowedge: <component>: <what>" message.
[[noreturn]] inline void fail(std::string_view component, std::string_view what) {
    std::string msg = "flowedge: ";
    msg.append(component).append(": ").append(what);
    throw Error(msg);
}

/// Throws unless `cond` holds; cheap enough for hot paths (message built only on failure).
inline void check(bool cond, std::string_view component, std::string_view what) {
    if (!cond) [[unlikely]] fail(component, what);
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
