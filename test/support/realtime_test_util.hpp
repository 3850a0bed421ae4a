// Helpers for the real-time tests: run a body on a fresh thread (whose OpenMP team, affinity, priority and
// capabilities die with it), drop a capability from that thread, and lower a soft resource limit for a scope. Dropping
// the capability is how a test running as root sees what an unprivileged deployment sees.
#pragma once
#include <exception>
#include <string>
#include <thread>
#include <utility>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>

namespace fe_test {

/// Runs `body` on a new thread and waits for it; an exception it throws is rethrown here.
template <class F>
void on_new_thread(F&& body) {
    std::exception_ptr thrown;
    std::thread t([&] {
        try {
            body();
        } catch (...) {
            thrown = std::current_exception();
        }
    });
    t.join();
    if (thrown) std::rethrow_exception(thrown);
}

/// Clears capability `cap` (CAP_IPC_LOCK, CAP_SYS_NICE) from the calling thread's effective set; false if refused.
inline bool drop_capability(int cap) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
    if (::syscall(SYS_capget, &header, data) != 0) return false;
    data[cap / 32].effective &= ~(1u << (cap % 32));
    return ::syscall(SYS_capset, &header, data) == 0;
}

/// Sets the soft limit of `resource` (process-wide) for the lifetime of the object, then restores it.
class SoftLimit {
public:
    SoftLimit(int resource, rlim_t soft) : m_resource(resource) {
        ::getrlimit(resource, &m_saved);
        rlimit l = m_saved;
        l.rlim_cur = soft;
        m_ok = ::setrlimit(resource, &l) == 0;
    }
    ~SoftLimit() { ::setrlimit(m_resource, &m_saved); }
    SoftLimit(const SoftLimit&) = delete;
    SoftLimit& operator=(const SoftLimit&) = delete;
    bool ok() const { return m_ok; }

private:
    int m_resource;
    rlimit m_saved{};
    bool m_ok = false;
};

/// Raises the soft limit of `resource` to its hard limit (allowed without privilege); false if refused.
inline bool raise_soft_to_hard(int resource) {
    rlimit l{};
    if (::getrlimit(resource, &l) != 0) return false;
    l.rlim_cur = l.rlim_max;
    return ::setrlimit(resource, &l) == 0;
}

inline bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

/// Whether a refused memory lock says why: the limit and its fix, or a sanitizer build that cannot lock at all.
inline bool lock_refusal_explained(const std::string& message) {
    return (contains(message, "RLIMIT_MEMLOCK") && contains(message, "ulimit -l")) || contains(message, "nothing is locked");
}

}  // namespace fe_test
