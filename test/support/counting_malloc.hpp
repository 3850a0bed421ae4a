// Replaces the C allocation functions (malloc, calloc, realloc, aligned_alloc, posix_memalign, memalign) with counting
// versions that forward to glibc's own, so a test can prove that a code path performs no heap allocation even where
// the allocation does not go through operator new (Eigen's aligned_malloc calls std::malloc). glibc only (it exports
// the __libc_* entry points the replacements forward to) and not under AddressSanitizer (whose own malloc must see
// every allocation). Include in exactly ONE source file of a test executable.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__)
#define FE_TEST_COUNT_MALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FE_TEST_COUNT_MALLOC 0
#endif
#endif
#if !defined(FE_TEST_COUNT_MALLOC) && defined(__GLIBC__)
#define FE_TEST_COUNT_MALLOC 1
#elif !defined(FE_TEST_COUNT_MALLOC)
#define FE_TEST_COUNT_MALLOC 0
#endif

#if FE_TEST_COUNT_MALLOC
extern "C" {
void* __libc_malloc(std::size_t n);
void* __libc_calloc(std::size_t count, std::size_t n);
void* __libc_realloc(void* p, std::size_t n);
void* __libc_memalign(std::size_t align, std::size_t n);
}

namespace fe_test {
/// Whether this build counts the C allocation functions.
inline constexpr bool kCountsMalloc = true;
/// Number of C allocation calls (malloc and friends) since program start.
inline std::atomic<std::size_t> g_malloc_calls{0};
inline void count_malloc() { g_malloc_calls.fetch_add(1, std::memory_order_relaxed); }
}  // namespace fe_test

extern "C" {
void* malloc(std::size_t n) noexcept {
    fe_test::count_malloc();
    return __libc_malloc(n);
}
void* calloc(std::size_t count, std::size_t n) noexcept {
    fe_test::count_malloc();
    return __libc_calloc(count, n);
}
void* realloc(void* p, std::size_t n) noexcept {
    fe_test::count_malloc();
    return __libc_realloc(p, n);
}
void* memalign(std::size_t align, std::size_t n) noexcept {
    fe_test::count_malloc();
    return __libc_memalign(align, n);
}
void* aligned_alloc(std::size_t align, std::size_t n) noexcept {
    fe_test::count_malloc();
    return __libc_memalign(align, n);
}
int posix_memalign(void** out, std::size_t align, std::size_t n) noexcept {
    fe_test::count_malloc();
    if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
    void* p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
}
#else
namespace fe_test {
inline constexpr bool kCountsMalloc = false;
inline std::atomic<std::size_t> g_malloc_calls{0};
}  // namespace fe_test
#endif
