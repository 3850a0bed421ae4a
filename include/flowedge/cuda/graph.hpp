// Graph<Cuda>: records a launch sequence once per key with CUDA stream capture and replays it with
// one cudaGraphLaunch; the CUDA calls live in kernels/cuda/device.cu behind opaque handles.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "flowedge/backend.hpp"
#include "flowedge/cuda/device.hpp"

namespace flowedge {

template <Backend B>
class Graph;

/// A cache of instantiated CUDA graphs keyed by a caller-chosen 64-bit key (at most kMaxKeys, oldest
/// evicted). `run(stream, key, enqueue)`: the first time `key` is seen, `enqueue()` is captured
/// (cudaStreamCaptureModeThreadLocal), instantiated and launched; afterwards the graph is replayed.
/// The default stream (Stream{}) cannot be captured: then the launches and copies that `enqueue` issues
/// on the default stream are redirected to a non-blocking stream owned by this Graph, and every replay
/// is ordered after prior default-stream work and before later default-stream work, so callers may keep
/// using Stream{}. Nothing inside `enqueue` may allocate, synchronize or copy from pageable host memory.
/// Move-only; destroying it destroys the graph executables and the owned stream.
template <>
class Graph<Cuda> {
public:
    static constexpr std::size_t kMaxKeys = 16;

    Graph() = default;
    Graph(Graph&& o) noexcept : m_state(std::exchange(o.m_state, nullptr)), m_entries(std::move(o.m_entries)) {
        o.m_entries.clear();
    }
    Graph& operator=(Graph&& o) noexcept {
        if (this != &o) {
            release();
            m_state = std::exchange(o.m_state, nullptr);
            m_entries = std::move(o.m_entries);
            o.m_entries.clear();
        }
        return *this;
    }
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;
    ~Graph() { release(); }

    template <class F>
    void run(Stream s, std::uint64_t key, F&& enqueue) {
        if (!m_state) {
            m_state = cuda::graph_state_create();
            m_entries.reserve(kMaxKeys);  // capturing a new key later must not allocate host memory
        }
        for (const Entry& e : m_entries)
            if (e.key == key) {
                cuda::graph_launch(m_state, e.exec, s);
                return;
            }
        void* capture_stream = cuda::graph_begin_capture(m_state, s);
        try {
            std::forward<F>(enqueue)();
        } catch (...) {
            cuda::graph_abort_capture(m_state, capture_stream);
            throw;
        }
        void* exec = cuda::graph_end_capture(m_state, capture_stream);
        if (m_entries.size() >= kMaxKeys) {
            cuda::graph_exec_destroy(m_entries.front().exec);
            m_entries.erase(m_entries.begin());
        }
        m_entries.push_back({key, exec});
        cuda::graph_launch(m_state, exec, s);
    }

    /// Drops every recorded graph (e.g. after buffers moved); the next run() captures again.
    void reset() noexcept {
        for (const Entry& e : m_entries) cuda::graph_exec_destroy(e.exec);
        m_entries.clear();
    }

    /// Number of recorded graphs currently cached.
    std::size_t n_recorded() const noexcept { return m_entries.size(); }

private:
    struct Entry {
        std::uint64_t key;
        void* exec;
    };
    void release() noexcept {
        reset();
        if (m_state) cuda::graph_state_destroy(m_state);
        m_state = nullptr;
    }
    void* m_state = nullptr;
    std::vector<Entry> m_entries;
};

}  // namespace flowedge
