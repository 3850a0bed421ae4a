// Backend tags: a model is a template over where it runs, never a macro that changes its layout.
#pragma once
#include <concepts>

namespace flowedge {

/// Host execution: header-only, Eigen-backed.
struct Cpu {};
/// NVIDIA GPU execution: kernels precompiled into the flowedge::cuda library.
struct Cuda {};

/// A backend tag usable as a template argument.
template <class B>
concept Backend = std::same_as<B, Cpu> || std::same_as<B, Cuda>;

/// Whether Ops<B> exists in this build. Cuda needs the flowedge::cuda target (FLOWEDGE_WITH_CUDA).
template <Backend B>
inline constexpr bool backend_available_v = true;
#ifndef FLOWEDGE_WITH_CUDA
template <>
inline constexpr bool backend_available_v<Cuda> = false;
#endif

/// Human-readable backend name ("cpu" / "cuda").
template <Backend B>
constexpr const char* backend_name() { return std::same_as<B, Cpu> ? "cpu" : "cuda"; }

/// Opaque execution stream: a cudaStream_t on Cuda (nullptr = default stream), unused on Cpu.
struct Stream {
    void* handle = nullptr;
};

}  // namespace flowedge
