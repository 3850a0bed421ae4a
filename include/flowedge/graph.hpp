// Replayable launch sequences: a whole sample is recorded once and replayed (a CUDA graph on Cuda,
// a plain call on Cpu), so steady-state inference costs one launch and no host round trips.
#pragma once
#include "flowedge/backend.hpp"

namespace flowedge {

/// A cached, replayable sequence of op launches on one stream, keyed by a caller-chosen 64-bit key
/// (e.g. steps/scheduler/batch). `run(stream, key, enqueue)` calls `enqueue()` to record the sequence
/// the first time a key is seen (or whenever the key changes) and replays the recording afterwards.
/// Everything `enqueue` reads must live at fixed addresses (weights, the model's own input buffers).
/// Specialised per backend: cpu/graph.hpp runs `enqueue()` every time; cuda/graph.hpp captures a CUDA graph.
template <Backend B>
class Graph;

}  // namespace flowedge

#include "flowedge/cpu/graph.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/graph.hpp"
#endif
