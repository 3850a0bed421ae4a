// Graph<Cpu>: the CPU has no launch overhead worth recording, so a "replay" is calling enqueue() again.
#pragma once
#include <cstdint>
#include <utility>

#include "flowedge/backend.hpp"

namespace flowedge {

template <Backend B>
class Graph;

/// Runs `enqueue()` on every run(); the key and the stream are ignored.
template <>
class Graph<Cpu> {
public:
    template <class F>
    void run(Stream, std::uint64_t, F&& enqueue) { std::forward<F>(enqueue)(); }
    void reset() {}
};

}  // namespace flowedge
