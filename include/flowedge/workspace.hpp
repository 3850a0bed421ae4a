// Bump arena for scratch activations: sized once at load so forward passes never allocate.
#pragma once
#include <cstddef>
#include <string>

#include "flowedge/op_params.hpp"
#include "flowedge/tensor.hpp"

namespace flowedge {

/// Fixed-capacity scratch arena on backend B. `take` hands out 256-byte aligned slices;
/// `reset` (or a Mark) returns them. Exceeding the capacity is an error, never a reallocation.
template <Backend B>
class Workspace {
public:
    static constexpr std::size_t kAlign = 256;

    Workspace() = default;
    explicit Workspace(std::size_t bytes) : m_storage(bytes) {}

    /// Bytes a request of n elements of T occupies, including alignment padding.
    template <class T>
    static constexpr std::size_t bytes_for(std::size_t n) { return (n * sizeof(T) + kAlign - 1) / kAlign * kAlign; }

    /// Next n elements of T as a view with the given shape.
    template <class T>
    View<T, B> take(Shape s) {
        const std::size_t n = static_cast<std::size_t>(s.numel());
        const std::size_t need = bytes_for<T>(n);
        if (m_used + need > m_storage.size()) [[unlikely]]
            fail(ErrorKind::Internal, "workspace", "scratch exhausted" + expected_got(std::to_string(m_used + need) + " bytes",
                                                                  std::to_string(m_storage.size()) + " bytes capacity"));
        T* p = reinterpret_cast<T*>(m_storage.data() + m_used);
        m_used += need;
        return {p, s};
    }

    std::size_t used() const { return m_used; }
    /// Bytes still free (a take of up to this many bytes, alignment included, succeeds).
    std::size_t available() const { return m_storage.size() - m_used; }
    std::size_t capacity() const { return m_storage.size(); }
    void reset() { m_used = 0; }

    /// Scoped mark: everything taken after construction is returned on destruction.
    class Mark {
    public:
        explicit Mark(Workspace& ws) : m_ws(ws), m_at(ws.m_used) {}
        ~Mark() { m_ws.m_used = m_at; }
        Mark(const Mark&) = delete;
        Mark& operator=(const Mark&) = delete;
    private:
        Workspace& m_ws;
        std::size_t m_at;
    };

private:
    Buffer<std::byte, B> m_storage;
    std::size_t m_used = 0;
};

/// Stands in for a Workspace<B> in a measuring pass of a model's forward (run at load, no ops executed): `take`
/// hands out null views of the requested shape and only counts their bytes, and `reserve` accounts for the scratch a
/// layer call would take on top of what is held. peak() is then the capacity the running pass needs, so a model's
/// workspace size comes from the same code that takes it.
template <Backend B>
class WorkspaceMeter {
public:
    /// Next n elements of T, as a view with no memory.
    template <class T>
    View<T, B> take(Shape s) {
        m_used += Workspace<B>::template bytes_for<T>(static_cast<std::size_t>(s.numel()));
        m_peak = m_used > m_peak ? m_used : m_peak;
        return {nullptr, s};
    }
    /// A call that takes up to `bytes` more and returns them before it ends.
    void reserve(std::size_t bytes) { m_peak = m_used + bytes > m_peak ? m_used + bytes : m_peak; }
    std::size_t peak() const { return m_peak; }

    /// Scoped mark, like Workspace<B>::Mark.
    class Mark {
    public:
        explicit Mark(WorkspaceMeter& m) : m_meter(m), m_at(m.m_used) {}
        ~Mark() { m_meter.m_used = m_at; }
        Mark(const Mark&) = delete;
        Mark& operator=(const Mark&) = delete;
    private:
        WorkspaceMeter& m_meter;
        std::size_t m_at;
    };

private:
    std::size_t m_used = 0, m_peak = 0;
};

/// Everything an op needs besides its tensors: the stream, the scratch arena and the requested math mode
/// (layers copy it into the params of the ops that honour it, e.g. Conv1dParams::math).
template <Backend B>
struct Context {
    Stream stream{};
    Workspace<B>* workspace = nullptr;
    MathMode math = MathMode::F32;
    /// GEMM-shaped ops may run on the backend library's F32 GEMM under F32 math (LinearParams::f32_gemm,
    /// Conv2dParams::f32_gemm); set by models whose workspace holds every convolution's backend scratch.
    bool f32_gemm = false;

    /// Runs op(p) with `need()` bytes of backend scratch in p.scratch / p.scratch_bytes when the context asks for a
    /// GEMM path (non-F32 math, or f32_gemm) and the arena was sized for it (models add their layers' scratch_bytes
    /// at load); otherwise op(p) as given, and the backend takes a path that needs none.
    template <class P, class Need, class Op>
    void with_gemm_scratch(P p, Need&& need, Op&& op) const {
        if ((math != MathMode::F32 || f32_gemm) && workspace) {
            const std::size_t bytes = need();
            if (bytes > 0 && workspace->available() >= bytes) {
                typename Workspace<B>::Mark mark(*workspace);
                p.scratch = workspace->template take<std::byte>(Shape{std::int64_t(bytes)}).data;
                p.scratch_bytes = bytes;
                op(p);
                return;
            }
        }
        op(p);
    }
};

}  // namespace flowedge
