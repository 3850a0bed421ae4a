// Maps flowedge::Error kinds to fe_status codes; shared by the C API and the Python module so both classify a
// failure the same way.
#pragma once
#include "flowedge/c_api.h"
#include "flowedge/error.hpp"

namespace flowedge::capi {

/// What the failing call was doing: a caller's bad value while a checkpoint loads came from the file (a layer
/// rejecting the shapes it was built with), so it is a format error there.
enum class Phase { Load, Call };

/// The status code of an Error of kind `kind` raised during `phase`.
constexpr fe_status status_of(ErrorKind kind, Phase phase) noexcept {
    switch (kind) {
        case ErrorKind::BadInput: return phase == Phase::Load ? FE_ERR_FORMAT : FE_ERR_INVALID_ARGUMENT;
        case ErrorKind::BadShape: return phase == Phase::Load ? FE_ERR_FORMAT : FE_ERR_SHAPE;
        case ErrorKind::Io: return FE_ERR_IO;
        case ErrorKind::BadFile: return FE_ERR_FORMAT;
        case ErrorKind::Unsupported: return FE_ERR_UNSUPPORTED;
        case ErrorKind::OutOfMemory: return FE_ERR_OUT_OF_MEMORY;
        case ErrorKind::DeviceOutOfMemory:  // fe_status keeps FE_ERR_OUT_OF_MEMORY for the host (c_api.h)
        case ErrorKind::Device: return FE_ERR_DEVICE;
        case ErrorKind::NonFinite: return FE_ERR_NON_FINITE;
        case ErrorKind::BadState: return FE_ERR_STATE;
        case ErrorKind::Internal: return FE_ERR_INTERNAL;
    }
    return FE_ERR_INTERNAL;
}

inline fe_status status_of(const Error& e, Phase phase) noexcept { return status_of(e.kind(), phase); }

}  // namespace flowedge::capi
