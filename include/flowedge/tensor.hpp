// Non-owning tensor views and owning per-backend buffers: the currency every layer and op trades in.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>

#include "flowedge/backend.hpp"
#include "flowedge/error.hpp"

namespace flowedge {

/// Up to 4 dimensions, row-major.
struct Shape {
    std::array<std::int64_t, 4> dims{0, 0, 0, 0};
    int rank = 0;

    constexpr Shape() = default;
    constexpr Shape(std::initializer_list<std::int64_t> d) {
        for (auto v : d) dims[static_cast<std::size_t>(rank++)] = v;
    }
    constexpr std::int64_t operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
    constexpr std::int64_t numel() const {
        std::int64_t n = 1;
        for (int i = 0; i < rank; ++i) n *= dims[static_cast<std::size_t>(i)];
        return n;
    }
    constexpr bool operator==(const Shape& o) const {
        if (rank != o.rank) return false;
        for (int i = 0; i < rank; ++i)
            if (dims[static_cast<std::size_t>(i)] != o.dims[static_cast<std::size_t>(i)]) return false;
        return true;
    }
    std::string str() const {
        std::string s = "[";
        for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[static_cast<std::size_t>(i)]);
        return s + "]";
    }
};

/// Non-owning view of contiguous row-major memory living on backend B.
template <class T, Backend B = Cpu>
struct View {
    T* data = nullptr;
    Shape shape{};

    constexpr std::int64_t numel() const { return shape.numel(); }
    constexpr std::int64_t dim(int i) const { return shape[i]; }
    /// Implicit view-of-const conversion.
    constexpr operator View<const T, B>() const { return {data, shape}; }
};

/// Throws a flowedge::Error naming `what` unless `v` has exactly shape `want`.
template <class T, Backend B>
void check_shape(const View<T, B>& v, const Shape& want, std::string_view component, std::string_view what) {
    if (!(v.shape == want)) [[unlikely]]
        fail(ErrorKind::BadShape, component, std::string(what) + ": wrong shape" + expected_got(want.str(), v.shape.str()));
}

/// Raw memory management per backend; specialised in cpu/memory.hpp and cuda/memory.hpp.
template <Backend B>
struct Memory;

/// Owning, move-only buffer of `n` elements of T on backend B (allocated once, at load).
template <class T, Backend B = Cpu>
class Buffer {
public:
    Buffer() = default;
    explicit Buffer(std::size_t n) : m_size(n) {
        if (n) m_data = static_cast<T*>(Memory<B>::allocate(n * sizeof(T)));
    }
    Buffer(Buffer&& o) noexcept : m_data(std::exchange(o.m_data, nullptr)), m_size(std::exchange(o.m_size, 0)) {}
    Buffer& operator=(Buffer&& o) noexcept {
        if (this != &o) {
            release();
            m_data = std::exchange(o.m_data, nullptr);
            m_size = std::exchange(o.m_size, 0);
        }
        return *this;
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() { release(); }

    T* data() { return m_data; }
    const T* data() const { return m_data; }
    std::size_t size() const { return m_size; }
    std::size_t bytes() const { return m_size * sizeof(T); }
    View<T, B> view(Shape s) { return {m_data, s}; }
    View<const T, B> view(Shape s) const { return {m_data, s}; }

private:
    void release() {
        if (m_data) Memory<B>::deallocate(m_data);
        m_data = nullptr;
        m_size = 0;
    }
    T* m_data = nullptr;
    std::size_t m_size = 0;
};

}  // namespace flowedge
