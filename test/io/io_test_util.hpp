// Shared helpers of the io tests: capture a flowedge::Error message and check it names every expected part.
#pragma once
#include <initializer_list>
#include <string>
#include <string_view>

#include <doctest/doctest.h>

#include "flowedge/error.hpp"

namespace iotest {

/// Runs f; returns the flowedge::Error message it threw, or "<no error>" when it returned normally.
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const flowedge::Error& e) {
        return e.what();
    }
    return "<no error>";
}

/// True when `msg` contains every one of `parts` (prints the message when it does not).
inline bool contains_all(const std::string& msg, std::initializer_list<std::string_view> parts) {
    for (auto p : parts)
        if (msg.find(p) == std::string::npos) {
            MESSAGE("message '" << msg << "' lacks '" << std::string(p) << "'");
            return false;
        }
    return true;
}

}  // namespace iotest
