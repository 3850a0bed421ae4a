// Replaces the global operator new/delete with counting versions, so a test can prove that a code path performs no
// heap allocation. Include in exactly ONE source file of a test executable (it defines the global operators).
//
// The operators are noinline: once inlined, GCC 13 pairs the std::free inside operator delete with the call site's
// operator new and reports a (false) -Wmismatched-new-delete.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace fe_test {
/// Number of global operator new / new[] calls since program start.
inline std::atomic<std::size_t> g_operator_new_calls{0};

[[gnu::noinline]] inline void* counted_malloc(std::size_t n) {
    g_operator_new_calls.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
}  // namespace fe_test

[[gnu::noinline]] void* operator new(std::size_t n) { return fe_test::counted_malloc(n); }
[[gnu::noinline]] void* operator new[](std::size_t n) { return fe_test::counted_malloc(n); }
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
