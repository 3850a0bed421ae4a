// Replayable launch sequences: a whole sample is recorded once and replayed (a CUDA graph on Cuda,
// a plain call on Cpu), so steady-state inference costs one launch and no host round trips.
#pragma once
#include <cstdint>
#include <utility>

#include "flowedge/backend.hpp"

namespace flowedge {

/// A cached, replayable sequence of op launches on one stream, keyed by a caller-chosen 64-bit key
/// (e.g. steps/scheduler/batch). `run(stream, key, enqueue)` calls `enqueue()` to record the sequence
/// the first time a key is seen (or whenever the key changes) and replays the recording afterwards.
/// Everything `enqueue` reads must live at fixed addresses (weights, the model's own input buffers).
/// Specialised per backend: cpu/graph.hpp runs `enqueue()` every time; cuda/graph.hpp captures a CUDA graph.
template <Backend B>
class Graph;

template <>
class Graph<Cpu> {
public:
    template <class F>
    void run(Stream, std::uint64_t, F&& enqueue) { std::forward<F>(enqueue)(); }
    void reset() {}
};

}  // namespace flowedge

#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/graph.hpp"
#endif
