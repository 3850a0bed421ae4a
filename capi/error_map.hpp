// Maps flowedge::Error messages to fe_status codes; shared by the C API and the Python module so both
// classify a failure the same way.
#pragma once
#include <string_view>

#include "flowedge/c_api.h"

namespace flowedge::capi {

/// The status code for an Error message "flowedge: <component>: <what>". `fallback` is returned when nothing
/// more specific matches (FE_ERR_FORMAT while loading, FE_ERR_INVALID_ARGUMENT for calls).
inline fe_status classify_error(std::string_view msg, fe_status fallback) {
    auto has = [&](std::string_view s) { return msg.find(s) != std::string_view::npos; };
    // Order matters: the most specific signals first.
    if (has("FLOWEDGE_CUDA_REQUIRED") || has("flowedge: cuda") || has("CUDA error") || has("cuda error") ||
        has("not resident on the GPU"))
        return FE_ERR_DEVICE;
    if (has("import_state")) return FE_ERR_STATE;
    if (has("non-finite") || has("not finite")) return FE_ERR_NON_FINITE;
    if (has("no such file") || has("No such file") || has("cannot open") || has("could not open") ||
        has("failed to open") || has("cannot read") || has("could not read") || has("cannot map") || has("mmap"))
        return FE_ERR_IO;
    // Checkpoint readers: a bad file is a format problem whatever the wording ("out of range" offsets etc.).
    if (has("flowedge: safetensors") || has("flowedge: lerobot")) return FE_ERR_FORMAT;
    if (has("has no backbone") || has("has no flow head") || has("no backbone (") || has("no flow head (") ||
        has("unsupported") || has("not supported") || has("only squaredcos") || has("is required"))
        return fallback == FE_ERR_FORMAT ? FE_ERR_FORMAT : FE_ERR_UNSUPPORTED;
    if (has("unknown solver") || has("unknown scheduler") || has("unknown device") || has("out of range") ||
        has("must be positive") || has("too small") || has("needs at least"))
        return FE_ERR_INVALID_ARGUMENT;
    if (has("wrong size") || has("must be [") || has("a multiple of")) return FE_ERR_SHAPE;
    if (has("wrong shape") || has("wrong rank") || has("missing tensor"))
        return FE_ERR_FORMAT;
    return fallback;
}

}  // namespace flowedge::capi
