// The exception-to-status boundary of the C API, shared by its translation units (c_api.cpp: fe_engine,
// policy_api.cpp: fe_policy): the thread-local last error, guarded(), argument checks and the device request.
#pragma once
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "error_map.hpp"
#include "flowedge/c_api.h"
#include "flowedge/error.hpp"
#include "flowedge/residency.hpp"

namespace flowedge::capi {

/// Message of the last failed call on this thread (fe_last_error).
inline thread_local std::string t_last_error;

/// A failure detected by the C layer itself, with its status already decided.
struct CapiError {
    fe_status status;
    std::string message;
};

[[noreturn]] inline void raise(fe_status status, const std::string& what) { throw CapiError{status, "flowedge: capi: " + what}; }

/// Runs `body`, turning every exception into a status and a thread-local message.
template <class F>
fe_status guarded(Phase phase, F&& body) noexcept {
    try {
        body();
        return FE_OK;
    } catch (const CapiError& e) {
        t_last_error = e.message;
        return e.status;
    } catch (const Error& e) {
        t_last_error = e.what();
        return status_of(e, phase);
    } catch (const std::bad_alloc&) {
        t_last_error = "flowedge: capi: out of host memory";
        return FE_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
        try {
            t_last_error = std::string("flowedge: capi: internal error: ") + e.what();
        } catch (...) {
        }
        return FE_ERR_INTERNAL;
    } catch (...) {
        t_last_error = "flowedge: capi: internal error: unknown exception";
        return FE_ERR_INTERNAL;
    }
}

inline void need_ptr(const void* p, const char* name) {
    if (p == nullptr) raise(FE_ERR_INVALID_ARGUMENT, std::string("argument '") + name + "' is NULL");
}

/// An input buffer must hold exactly `need` elements.
inline void check_input(const void* p, std::size_t len, std::size_t need, const char* name, const char* unit = "floats") {
    need_ptr(p, name);
    if (len < need)
        raise(FE_ERR_INVALID_ARGUMENT, std::string("argument '") + name + "' is too small: needs " + std::to_string(need) +
                                           " " + unit + expected_got(need, len));
    if (len > need)
        raise(FE_ERR_SHAPE, std::string("argument '") + name + "' has more elements than the call uses" +
                                expected_got(need, len));
}

/// An output buffer must hold at least `need` elements.
inline void check_output(const void* p, std::size_t len, std::size_t need, const char* name, const char* unit = "floats") {
    need_ptr(p, name);
    if (len < need)
        raise(FE_ERR_INVALID_ARGUMENT, std::string("argument '") + name + "' is too small: needs " + std::to_string(need) +
                                           " " + unit + expected_got(need, len));
}


/// A device request (docs/contracts.md): "cpu" (also NULL); "cuda", which fails with FE_ERR_DEVICE unless the model ends up
/// resident on the GPU; "auto", which uploads when it can and otherwise runs on the CPU (fe_engine_fallback_reason).
struct DeviceRequest {
    Device want;
    bool fallback_allowed;
};

inline DeviceRequest device_arg(const char* device) {
    const std::string_view d = device == nullptr ? "cpu" : device;
    if (d == "cpu") return {Device::Cpu, false};
    if (d == "cuda") return {Device::Cuda, false};
    if (d == "auto") return {Device::Cuda, true};
    raise(FE_ERR_INVALID_ARGUMENT, "unknown device '" + std::string(d) + "' (expected cpu, cuda or auto)");
}

inline constexpr const char* kUseAuto = "; pass device \"auto\" to allow the CPU fallback";

}  // namespace flowedge::capi
