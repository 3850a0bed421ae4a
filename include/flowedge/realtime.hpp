// Real-time setup of the process and the inference threads (Linux): lock and pre-fault memory, pin the calling thread
// and the OpenMP workers to CPUs, give them a SCHED_FIFO priority, and read the page-fault / context-switch counters
// that prove it. Every refusal by the system is a flowedge::Error naming the limit and how a deployment raises it
// (docs/realtime.md). Models add their device-side options on top (DiffusionPolicy::set_realtime).
#pragma once
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "flowedge/error.hpp"

namespace flowedge {

/// Run-time choices for a real-time control loop; all off by default (nothing about the process changes).
struct RealtimeOptions {
    /// mlockall(MCL_CURRENT | MCL_FUTURE): every page mapped now is faulted in and pinned in RAM, and so is every page
    /// mapped later; malloc stops returning memory to the system. Needs RLIMIT_MEMLOCK >= the process's mapped size
    /// (VmSize) or CAP_IPC_LOCK.
    bool lock_memory = false;
    /// Touch every page the process maps now without locking it (implied by lock_memory): no limit needed, but the
    /// kernel may still reclaim file-backed pages under memory pressure.
    bool prefault = false;
    /// CPUs for the calling thread (OpenMP thread 0) and the OpenMP workers: thread i runs on cpus[i % size]. Empty:
    /// leave the affinity alone.
    std::vector<int> cpus;
    /// SCHED_FIFO priority (1..99) for the same threads; 0 leaves the scheduling policy alone. Needs RLIMIT_RTPRIO >=
    /// the priority or CAP_SYS_NICE.
    int rt_priority = 0;
    /// Move every other thread of this process (the CUDA driver's, a logger's, ...) onto the allowed CPUs that are
    /// not in `cpus`, so they cannot preempt the loop there when the rest of the machine is busy. Needs `cpus` and at
    /// least one allowed CPU outside it. Threads started later take the affinity of the thread that starts them.
    bool isolate_cpus = false;
    /// CUDA: run on a new stream of the device's highest priority. Ignored on the CPU.
    bool high_priority_stream = false;
    /// CUDA: stage uploads and downloads through page-locked host buffers (asynchronous DMA, no driver bounce
    /// buffer). Ignored on the CPU.
    bool pinned_staging = false;
};

/// What set_realtime / realtime::apply did.
struct RealtimeReport {
    bool memory_locked = false;
    bool prefaulted = false;
    std::size_t prefaulted_bytes = 0;   ///< bytes of the mappings populated (lock: VmLck after locking)
    int threads_placed = 0;             ///< threads pinned and/or given the priority (calling thread + OpenMP workers)
    int threads_moved = 0;              ///< other threads of the process moved off the loop's CPUs (isolate_cpus)
    bool high_priority_stream = false;  ///< a CUDA stream of the highest priority is in use
    bool pinned_staging = false;        ///< CUDA uploads/downloads go through page-locked buffers
};

namespace realtime {

/// Page faults and context switches of the whole process so far (getrusage RUSAGE_SELF); subtract two readings.
struct Counters {
    long minor_faults = 0, major_faults = 0, voluntary_switches = 0, involuntary_switches = 0;
    Counters operator-(const Counters& o) const {
        return {minor_faults - o.minor_faults, major_faults - o.major_faults, voluntary_switches - o.voluntary_switches,
                involuntary_switches - o.involuntary_switches};
    }
};
inline Counters counters() noexcept {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return {u.ru_minflt, u.ru_majflt, u.ru_nvcsw, u.ru_nivcsw};
}

/// Whether the calling thread holds capability `cap` (CAP_IPC_LOCK, CAP_SYS_NICE) in its effective set; capabilities
/// are per thread, so this asks the kernel about this thread rather than reading the process's status file.
inline bool has_capability(int cap) noexcept {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
    if (::syscall(SYS_capget, &header, data) != 0) return false;
    return (data[cap / 32].effective >> (cap % 32)) & 1u;
}

/// "unlimited" or the number of bytes.
inline std::string limit_text(rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v) + " bytes"; }

/// A "kB" field of /proc/self/status in bytes (VmSize, VmLck), 0 when absent.
inline std::size_t status_bytes(std::string_view field) {
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    std::size_t bytes = 0;
    while (std::fgets(line, sizeof line, f)) {
        const std::string_view l(line);
        if (l.substr(0, field.size()) == field && l.size() > field.size() && l[field.size()] == ':') {
            unsigned long long kb = 0;
            if (std::sscanf(line + field.size() + 1, "%llu", &kb) == 1) bytes = std::size_t(kb) * 1024;
            break;
        }
    }
    std::fclose(f);
    return bytes;
}

/// Faults in `bytes` of the calling thread's stack below this frame, so a deeper call later finds its pages present.
[[gnu::noinline]] inline void prefault_stack(std::size_t bytes = 512 * 1024) {
    volatile unsigned char* block = static_cast<volatile unsigned char*>(__builtin_alloca(bytes));
    const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
    for (std::size_t i = 0; i < bytes; i += page) block[i] = 0;
}

/// The message of a memory lock refused for the limit: the limit, the bytes the kernel compares it with and the fixes.
inline std::string memlock_limit_message(rlim_t limit, std::size_t needed) {
    return "cannot lock memory: RLIMIT_MEMLOCK is " + limit_text(limit) + " but locking all of this process needs " +
           std::to_string(needed) + " bytes (its mapped size, VmSize) and the thread lacks CAP_IPC_LOCK" +
           expected_got(">= " + std::to_string(needed) + " bytes", limit_text(limit)) +
           "; raise the limit where the program starts: `ulimit -l unlimited` in its shell, a '<user> - memlock "
           "unlimited' line in /etc/security/limits.conf, LimitMEMLOCK=infinity in its systemd unit, `--ulimit "
           "memlock=-1` for docker; or grant CAP_IPC_LOCK (setcap cap_ipc_lock+ep <program>)";
}

/// mlockall(MCL_CURRENT | MCL_FUTURE) after checking the limit the kernel applies (the mapped size against
/// RLIMIT_MEMLOCK unless CAP_IPC_LOCK), so the refusal names both numbers. Also keeps freed heap memory in the process
/// (no trimming, no mmap'd chunks: a later malloc would otherwise map and fault new pages) and faults in this
/// thread's stack. Returns the locked bytes (VmLck).
inline std::size_t lock_memory() {
    rlimit lim{};
    ::getrlimit(RLIMIT_MEMLOCK, &lim);
    const std::size_t needed = status_bytes("VmSize");
    if (!has_capability(CAP_IPC_LOCK) && lim.rlim_cur != RLIM_INFINITY && needed > lim.rlim_cur)
        fail(ErrorKind::Unsupported, "realtime", memlock_limit_message(lim.rlim_cur, needed));
    ::mallopt(M_TRIM_THRESHOLD, -1);
    ::mallopt(M_MMAP_MAX, 0);
    if (::mlockall(MCL_CURRENT | MCL_FUTURE) != 0) {
        const int err = errno;
        if (err == ENOMEM || err == EPERM || err == EAGAIN)
            fail(ErrorKind::Unsupported, "realtime", memlock_limit_message(lim.rlim_cur, status_bytes("VmSize")) +
                                                         " (mlockall: " + std::strerror(err) + ")");
        fail(ErrorKind::Unsupported, "realtime", std::string("mlockall failed: ") + std::strerror(err));
    }
    prefault_stack();
    const std::size_t locked = status_bytes("VmLck");
    if (locked == 0)  // an AddressSanitizer build turns mlockall into a no-op that reports success
        fail(ErrorKind::Unsupported, "realtime", "mlockall reported success but nothing is locked (VmLck is 0; a sanitizer build "
                                                 "ignores mlockall): memory cannot be locked in this build");
    return locked;
}

/// Faults in every page the process maps now without locking anything: writable private mappings for writing (so a
/// later first write does not fault either), the rest for reading (weights mapped from files included). Skipped:
/// mappings made with MAP_NORESERVE (address-space reservations such as a sanitizer's shadow memory or the unused
/// part of a malloc arena), device and I/O mappings, and any mapping larger than physical memory. Returns the bytes
/// populated.
inline std::size_t prefault_memory() {
#if defined(MADV_POPULATE_READ) && defined(MADV_POPULATE_WRITE)
    std::FILE* f = std::fopen("/proc/self/smaps", "r");
    if (!f) fail(ErrorKind::Unsupported, "realtime", "cannot pre-fault memory: /proc/self/smaps is not readable");
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const std::uintptr_t physical = pages > 0 && page > 0 ? std::uintptr_t(pages) * std::uintptr_t(page) : ~std::uintptr_t(0);
    struct Range {
        std::uintptr_t lo, hi;
        bool write;
    };
    std::vector<Range> ranges;  // collected first: populating changes the maps
    Range current{0, 0, false};
    bool candidate = false;
    char line[1024];
    while (std::fgets(line, sizeof line, f)) {
        unsigned long long lo = 0, hi = 0;
        char perms[5] = {};
        if (std::sscanf(line, "%llx-%llx %4s", &lo, &hi, perms) == 3) {  // a mapping's header line
            current = {std::uintptr_t(lo), std::uintptr_t(hi), perms[1] == 'w' && perms[3] == 'p'};
            candidate = perms[0] == 'r' && current.hi - current.lo <= physical && !std::strstr(line, "[vsyscall]") &&
                        !std::strstr(line, "[vvar") && !std::strstr(line, " /dev/");
        } else if (candidate && std::strncmp(line, "VmFlags:", 8) == 0) {  // its last field
            const auto flag = [&](const char* two) { return std::strstr(line + 8, two) != nullptr; };
            if (!flag(" nr") && !flag(" io") && !flag(" pf")) ranges.push_back(current);
            candidate = false;
        }
    }
    std::fclose(f);
    std::size_t bytes = 0;
    for (const Range& r : ranges)
        if (::madvise(reinterpret_cast<void*>(r.lo), r.hi - r.lo, r.write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
            bytes += r.hi - r.lo;
    prefault_stack();
    return bytes;
#else
    fail(ErrorKind::Unsupported, "realtime", "cannot pre-fault memory: this system has no MADV_POPULATE_READ/WRITE (Linux >= 5.14)");
#endif
}

/// Parses a CPU list as taskset and /sys write it: "2,3", "0-3,6".
inline std::vector<int> parse_cpu_list(const std::string_view whole) {
    std::vector<int> cpus;
    std::string_view text = whole;
    const auto number = [&](std::string_view s) {
        int v = -1;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc{} || end != s.data() + s.size() || v < 0)
            fail("realtime", "bad CPU list '" + std::string(whole) + "'" + expected_got("CPU numbers like 2,3 or 0-3", std::string(s)));
        return v;
    };
    while (!text.empty()) {
        const std::size_t comma = text.find(',');
        const std::string_view item = text.substr(0, comma);
        const std::size_t dash = item.find('-');
        if (dash == std::string_view::npos) {
            cpus.push_back(number(item));
        } else {
            const int lo = number(item.substr(0, dash)), hi = number(item.substr(dash + 1));
            if (hi < lo) fail("realtime", "bad CPU range '" + std::string(item) + "'" + expected_got("low-high", std::string(item)));
            for (int c = lo; c <= hi; ++c) cpus.push_back(c);
        }
        if (comma == std::string_view::npos) break;
        text.remove_prefix(comma + 1);
    }
    return cpus;
}

/// "0-3,6" for a sorted list.
inline std::string cpu_list_text(const std::vector<int>& cpus) {
    std::string s;
    for (std::size_t i = 0; i < cpus.size();) {
        std::size_t j = i;
        while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
        if (!s.empty()) s += ',';
        s += std::to_string(cpus[i]);
        if (j > i) {
            s += '-';
            s += std::to_string(cpus[j]);
        }
        i = j + 1;
    }
    return s;
}

/// The CPUs this process may be placed on: the control group's cpuset when readable (the hard limit; a taskset mask
/// of the starting thread can be widened again), otherwise the calling thread's affinity mask.
inline std::vector<int> allowed_cpus() {
    for (const char* file : {"/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"}) {
        if (std::FILE* f = std::fopen(file, "r")) {
            char buf[1024] = {};
            const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
            std::fclose(f);
            std::string_view s(buf);
            while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
            if (ok && !s.empty()) return parse_cpu_list(s);
        }
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> cpus;
    if (::sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(c, &set)) cpus.push_back(c);
    return cpus;
}

/// Every requested CPU must exist (below `configured`, the CPUs the system has) and be in `allowed`.
inline void check_cpus(std::span<const int> cpus, const std::vector<int>& allowed, int configured) {
    for (const int c : cpus) {
        if (c < 0 || c >= configured || c >= CPU_SETSIZE)
            fail("realtime", "CPU " + std::to_string(c) + " does not exist (this system has CPUs 0-" + std::to_string(configured - 1) +
                                 ")" + expected_got("a CPU in 0-" + std::to_string(configured - 1), c));
        if (std::find(allowed.begin(), allowed.end(), c) == allowed.end())
            fail("realtime", "CPU " + std::to_string(c) + " is not in the set this process may run on (its cpuset or affinity; "
                             "see taskset -p / cpuset.cpus)" + expected_got("one of " + cpu_list_text(allowed), c));
    }
}

/// The refusal of a SCHED_FIFO priority: the limit, the capability and the fixes.
inline std::string rtprio_limit_message(int priority, rlim_t limit) {
    const std::string lim = limit == RLIM_INFINITY ? std::string("unlimited") : std::to_string(limit);
    return "cannot use SCHED_FIFO priority " + std::to_string(priority) + ": RLIMIT_RTPRIO is " + lim +
           " and the thread lacks CAP_SYS_NICE" + expected_got("RLIMIT_RTPRIO >= " + std::to_string(priority), lim) +
           "; raise it where the program starts: `ulimit -r " + std::to_string(priority) + "` in its shell, a '<user> - "
           "rtprio " + std::to_string(priority) + "' line in /etc/security/limits.conf, LimitRTPRIO=" + std::to_string(priority) +
           " in its systemd unit, `--cap-add SYS_NICE` for docker; or grant CAP_SYS_NICE (setcap cap_sys_nice+ep <program>)";
}

/// Pins the calling thread and the OpenMP workers (thread i of an OpenMP team started from this thread runs on
/// cpus[i % size]; the runtime reuses the same workers for later regions) and/or gives them SCHED_FIFO `priority`.
/// Checks everything before changing anything. Returns the number of threads changed; `placed_tids`, when given,
/// receives their kernel thread ids.
inline int place_threads(std::span<const int> cpus, int priority, std::vector<pid_t>* placed_tids = nullptr) {
    if (cpus.empty() && priority == 0) return 0;
    if (!cpus.empty()) check_cpus(cpus, allowed_cpus(), int(::sysconf(_SC_NPROCESSORS_CONF)));
    if (priority != 0) {
        const int lo = ::sched_get_priority_min(SCHED_FIFO), hi = ::sched_get_priority_max(SCHED_FIFO);
        if (priority < lo || priority > hi)
            fail("realtime", "SCHED_FIFO priority out of range" + expected_got(std::to_string(lo) + ".." + std::to_string(hi), priority));
        rlimit lim{};
        ::getrlimit(RLIMIT_RTPRIO, &lim);
        if (!has_capability(CAP_SYS_NICE) && lim.rlim_cur != RLIM_INFINITY && rlim_t(priority) > lim.rlim_cur)
            fail(ErrorKind::Unsupported, "realtime", rtprio_limit_message(priority, lim.rlim_cur));
    }
    // One result slot per thread, sized before the region (the team cannot grow past omp_get_max_threads()).
#ifdef _OPENMP
    const int team = omp_get_max_threads();
#else
    const int team = 1;
#endif
    std::vector<int> affinity_errno(std::size_t(team), 0), priority_errno(std::size_t(team), 0);
    std::vector<pid_t> tids(std::size_t(team), 0);
    int placed = 0;
    const auto place_this_thread = [&](int index) {
        tids[std::size_t(index)] = pid_t(::syscall(SYS_gettid));
        if (!cpus.empty()) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpus[std::size_t(index) % cpus.size()], &set);
            affinity_errno[std::size_t(index)] = ::pthread_setaffinity_np(::pthread_self(), sizeof set, &set);
        }
        if (priority != 0) {
            sched_param sp{};
            sp.sched_priority = priority;
            priority_errno[std::size_t(index)] = ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &sp);
        }
    };
#ifdef _OPENMP
#pragma omp parallel num_threads(team) reduction(+ : placed)
    {
        place_this_thread(omp_get_thread_num());
        placed = 1;
    }
#else
    place_this_thread(0);
    placed = 1;
#endif
    for (int i = 0; i < team; ++i) {
        if (const int e = affinity_errno[std::size_t(i)])
            fail(ErrorKind::Unsupported, "realtime", "cannot pin thread " + std::to_string(i) + " to CPU " +
                                                         std::to_string(cpus[std::size_t(i) % cpus.size()]) + ": " + std::strerror(e));
        if (const int e = priority_errno[std::size_t(i)]) {
            rlimit lim{};
            ::getrlimit(RLIMIT_RTPRIO, &lim);
            fail(ErrorKind::Unsupported, "realtime",
                 e == EPERM ? rtprio_limit_message(priority, lim.rlim_cur) +
                                  " (or, with the capability, the control group has no real-time budget: cpu.rt_runtime_us)"
                            : "cannot set SCHED_FIFO priority " + std::to_string(priority) + ": " + std::strerror(e));
        }
    }
    if (placed_tids) *placed_tids = std::move(tids);
    return placed;
}

/// The allowed CPUs outside the loop's `cpus`, where isolate_cpus puts the process's other threads; an error when
/// that leaves none.
inline std::vector<int> cpus_outside(std::span<const int> cpus) {
    const std::vector<int> allowed = allowed_cpus(), loop(cpus.begin(), cpus.end());
    std::vector<int> rest;
    for (const int c : allowed)
        if (std::find(loop.begin(), loop.end(), c) == loop.end()) rest.push_back(c);
    if (loop.empty() || rest.empty())
        fail(ErrorKind::BadInput, "realtime",
             "isolate_cpus needs loop CPUs that leave at least one allowed CPU for the other threads" +
                 expected_got("a non-empty strict subset of " + cpu_list_text(allowed), loop.empty() ? "no CPUs" : cpu_list_text(loop)));
    return rest;
}

/// Moves every thread of this process except `keep` (kernel thread ids) onto CPUs `rest`. Returns the number of
/// threads moved; a thread that exits meanwhile is skipped.
inline int move_other_threads(const std::vector<int>& rest, std::span<const pid_t> keep) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const int c : rest) CPU_SET(c, &set);
    DIR* dir = ::opendir("/proc/self/task");
    if (!dir) fail(ErrorKind::Unsupported, "realtime", std::string("cannot list the process's threads in /proc/self/task: ") + std::strerror(errno));
    int moved = 0, error = 0;
    pid_t failed = 0;
    while (const dirent* e = ::readdir(dir)) {
        pid_t tid = 0;
        const std::string_view name(e->d_name);
        if (std::from_chars(name.data(), name.data() + name.size(), tid).ec != std::errc{} || tid <= 0) continue;
        if (std::find(keep.begin(), keep.end(), tid) != keep.end()) continue;
        if (::sched_setaffinity(tid, sizeof set, &set) == 0) ++moved;
        else if (errno != ESRCH && error == 0) error = errno, failed = tid;
    }
    ::closedir(dir);
    if (error)
        fail(ErrorKind::Unsupported, "realtime", "cannot move thread " + std::to_string(failed) + " to CPUs " + cpu_list_text(rest) + ": " + std::strerror(error));
    return moved;
}

/// The process and thread parts of `o`, in the order that leaves everything resident: threads first (an OpenMP
/// team started now has its stacks mapped before the lock), then the lock or the pre-fault. Call it from the thread
/// that will run the control loop, after the model is loaded. The CUDA options are the model's (set_realtime).
inline RealtimeReport apply(const RealtimeOptions& o) {
    RealtimeReport r;
    const std::vector<int> rest = o.isolate_cpus ? cpus_outside(o.cpus) : std::vector<int>{};  // checked first
    std::vector<pid_t> loop_tids;
    r.threads_placed = place_threads(o.cpus, o.rt_priority, &loop_tids);
    if (o.isolate_cpus) r.threads_moved = move_other_threads(rest, loop_tids);
    if (o.lock_memory) {
        r.prefaulted_bytes = lock_memory();
        r.memory_locked = r.prefaulted = true;
    } else if (o.prefault) {
        r.prefaulted_bytes = prefault_memory();
        r.prefaulted = true;
    }
    return r;
}

}  // namespace realtime
}  // namespace flowedge
