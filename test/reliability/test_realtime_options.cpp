// realtime.hpp on its own: each option does what it says (threads pinned and prioritised, pages present after a
// lock or a pre-fault) and each refusal is an Error naming the limit, the numbers and the fix. The refusals are
// provoked as an unprivileged deployment meets them: the capability dropped from the calling thread and the soft
// limit lowered, so the tests mean the same as root here and as a user in CI.
#include <doctest/doctest.h>

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../support/realtime_test_util.hpp"
#include "flowedge/realtime.hpp"

using namespace flowedge;
using fe_test::contains;

namespace {

/// The message and kind of the Error `f` throws ("" when it throws none).
template <class F>
std::pair<std::string, ErrorKind> error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return {e.what(), e.kind()};
    }
    return {"", ErrorKind::Internal};
}

/// CPUs of the calling thread's affinity mask.
std::vector<int> thread_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    ::pthread_getaffinity_np(::pthread_self(), sizeof set, &set);
    std::vector<int> out;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
}

int team_size() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/// Minor faults taken by writing one byte per 4 KiB page of [p, p + bytes). Not instrumented: under ASan each write
/// would also touch the page's shadow, which the sanitizer maps lazily, and those faults are not the program's.
#if defined(__GNUC__)
__attribute__((no_sanitize("address")))
#endif
long faults_writing_pages(unsigned char* p, std::size_t bytes) {
    const realtime::Counters c0 = realtime::counters();
    for (std::size_t i = 0; i < bytes; i += 4096) p[i] = 1;
    return long((realtime::counters() - c0).minor_faults);
}

/// Options that pin the loop to `cpus` and move every other thread off them.
RealtimeOptions isolating(std::vector<int> cpus) {
    RealtimeOptions o;
    o.cpus = std::move(cpus);
    o.isolate_cpus = true;
    return o;
}

}  // namespace

TEST_CASE("CPU lists parse as taskset writes them and bad ones are errors") {
    CHECK(realtime::parse_cpu_list("2,3") == std::vector<int>{2, 3});
    CHECK(realtime::parse_cpu_list("0-2,5") == std::vector<int>{0, 1, 2, 5});
    CHECK(realtime::cpu_list_text({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8");
    CHECK(contains(error_of([] { realtime::parse_cpu_list("2,x"); }).first, "bad CPU list '2,x'"));
    CHECK(contains(error_of([] { realtime::parse_cpu_list("3-1"); }).first, "bad CPU range '3-1'"));
    CHECK(contains(error_of([] { realtime::parse_cpu_list("1,,2"); }).first, "bad CPU list"));
}

TEST_CASE("a CPU that does not exist or is outside the allowed set is an error naming it, and nothing is changed") {
    const std::vector<int> before = thread_cpus();
    const auto [missing, kind] = error_of([] { realtime::place_threads(std::vector<int>{4096}, 0); });
    CHECK(contains(missing, "flowedge: realtime: CPU 4096 does not exist"));
    CHECK(kind == ErrorKind::BadInput);
    CHECK(contains(error_of([] { realtime::place_threads(std::vector<int>{-1}, 0); }).first, "CPU -1 does not exist"));
    // The allowed set of this machine cannot be narrowed from a test, so the check is called with one.
    const std::string outside = error_of([] { realtime::check_cpus(std::vector<int>{1}, {0, 2, 3}, 4); }).first;
    CHECK(contains(outside, "CPU 1 is not in the set this process may run on"));
    CHECK(contains(outside, "expected one of 0,2-3, got 1"));
    CHECK(thread_cpus() == before);
}

TEST_CASE("pinning puts the calling thread and every OpenMP worker on the given CPUs") {
    const std::vector<int> allowed = realtime::allowed_cpus();
    REQUIRE(!allowed.empty());
    const int cpu = allowed.back();
    std::vector<int> seen;  // per OpenMP thread: the only CPU of its mask, -1 when the mask is not that one CPU
    int placed = 0;
    std::vector<int> caller;
    fe_test::on_new_thread([&] {
        placed = realtime::place_threads(std::vector<int>{cpu}, 0);
        caller = thread_cpus();
        seen.assign(std::size_t(team_size()), -2);
#ifdef _OPENMP
#pragma omp parallel num_threads(team_size())
        {
            const std::vector<int> mine = thread_cpus();
            seen[std::size_t(omp_get_thread_num())] = mine.size() == 1 ? mine[0] : -1;
        }
#else
        seen[0] = thread_cpus().size() == 1 ? thread_cpus()[0] : -1;
#endif
    });
    CHECK(placed == team_size());
    CHECK(caller == std::vector<int>{cpu});
    for (const int s : seen) CHECK(s == cpu);
}

TEST_CASE("isolate_cpus moves the process's other threads off the loop's CPUs, and needs a CPU left for them") {
    const std::vector<int> allowed = realtime::allowed_cpus();
    REQUIRE(!allowed.empty());
    const int cpu = allowed.back();
    CHECK(contains(error_of([] { realtime::apply(isolating({})); }).first,
                   "isolate_cpus needs loop CPUs that leave at least one allowed CPU for the other threads (expected a non-empty "
                   "strict subset of"));
    if (allowed.size() < 2) {
        const std::string all = error_of([&] { realtime::apply(isolating(allowed)); }).first;
        CHECK(contains(all, ("got " + realtime::cpu_list_text(allowed)).c_str()));
        return;
    }
    // A bystander thread (a CUDA driver or logging thread in a real process) and this test's own thread must both
    // leave `cpu`; their masks are restored afterwards.
    const std::vector<int> main_before = thread_cpus();
    std::vector<int> bystander_after, loop_after;
    RealtimeReport report;
    {
        std::atomic<bool> done{false};
        std::vector<int> seen;
        std::thread bystander([&] {
            while (!done.load()) std::this_thread::yield();
            seen = thread_cpus();
        });
        fe_test::on_new_thread([&] {
            report = realtime::apply(isolating({cpu}));
            loop_after = thread_cpus();
        });
        done = true;
        bystander.join();
        bystander_after = seen;
    }
    const std::vector<int> main_after = thread_cpus();
    cpu_set_t set;
    CPU_ZERO(&set);
    for (const int c : main_before) CPU_SET(c, &set);
    ::sched_setaffinity(0, sizeof set, &set);
    CHECK(report.threads_moved >= 2);  // this thread and the bystander at least
    CHECK(loop_after == std::vector<int>{cpu});
    CHECK(std::find(bystander_after.begin(), bystander_after.end(), cpu) == bystander_after.end());
    CHECK(std::find(main_after.begin(), main_after.end(), cpu) == main_after.end());
    CHECK(!bystander_after.empty());
}

TEST_CASE("a SCHED_FIFO priority is given to the calling thread and the workers, or refused naming RLIMIT_RTPRIO and the fix") {
    CHECK(contains(error_of([] { realtime::place_threads({}, 100); }).first, "SCHED_FIFO priority out of range (expected 1..99, got 100)"));
    // Refused: the thread without CAP_SYS_NICE and RLIMIT_RTPRIO 0, what an unprivileged user has by default.
    std::string refused;
    ErrorKind refused_kind = ErrorKind::Internal;
    int policy_after = -1;
    bool dropped = false;
    {
        fe_test::SoftLimit rtprio(RLIMIT_RTPRIO, 0);
        REQUIRE(rtprio.ok());
        fe_test::on_new_thread([&] {
            dropped = fe_test::drop_capability(CAP_SYS_NICE);
            std::tie(refused, refused_kind) = error_of([] { realtime::place_threads({}, 80); });
            policy_after = ::sched_getscheduler(0);
        });
    }
    REQUIRE(dropped);
    CHECK(refused_kind == ErrorKind::Unsupported);
    CHECK(contains(refused, "flowedge: realtime: cannot use SCHED_FIFO priority 80: RLIMIT_RTPRIO is 0 and the thread lacks CAP_SYS_NICE"));
    CHECK(contains(refused, "ulimit -r 80"));
    CHECK(contains(refused, "rtprio 80' line in /etc/security/limits.conf"));
    CHECK(contains(refused, "CAP_SYS_NICE"));
    CHECK(policy_after == SCHED_OTHER);
    // Granted (root, CAP_SYS_NICE or a raised RLIMIT_RTPRIO): every thread of the team runs SCHED_FIFO 1.
    const bool may = realtime::has_capability(CAP_SYS_NICE) || fe_test::raise_soft_to_hard(RLIMIT_RTPRIO);
    rlimit lim{};
    ::getrlimit(RLIMIT_RTPRIO, &lim);
    if (!realtime::has_capability(CAP_SYS_NICE) && (!may || lim.rlim_cur < 1)) {
        MESSAGE("SCHED_FIFO cannot be granted here (no CAP_SYS_NICE, RLIMIT_RTPRIO hard limit 0): only the refusal was tested");
        return;
    }
    std::vector<int> policies, priorities;
    std::string error;
    fe_test::on_new_thread([&] {
        error = error_of([] { realtime::place_threads({}, 1); }).first;
        policies.assign(std::size_t(team_size()), -1);
        priorities.assign(std::size_t(team_size()), -1);
#ifdef _OPENMP
#pragma omp parallel num_threads(team_size())
#endif
        {
            int pol = -1;
            sched_param sp{};
            ::pthread_getschedparam(::pthread_self(), &pol, &sp);
#ifdef _OPENMP
            const std::size_t i = std::size_t(omp_get_thread_num());
#else
            const std::size_t i = 0;
#endif
            policies[i] = pol;
            priorities[i] = sp.sched_priority;
        }
    });
    if (contains(error, "cpu.rt_runtime_us")) {
        MESSAGE("the control group gives no real-time budget: " << error);
        return;
    }
    CHECK(error.empty());
    for (std::size_t i = 0; i < policies.size(); ++i) {
        CHECK(policies[i] == SCHED_FIFO);
        CHECK(priorities[i] == 1);
    }
}

TEST_CASE("locking memory is refused naming RLIMIT_MEMLOCK, the bytes needed and the fix") {
    std::string refused;
    ErrorKind kind = ErrorKind::Internal;
    bool dropped = false;
    const std::size_t locked_before = realtime::status_bytes("VmLck");
    {
        fe_test::SoftLimit memlock(RLIMIT_MEMLOCK, 64 * 1024);
        REQUIRE(memlock.ok());
        fe_test::on_new_thread([&] {
            dropped = fe_test::drop_capability(CAP_IPC_LOCK);
            std::tie(refused, kind) = error_of([] { realtime::lock_memory(); });
        });
    }
    REQUIRE(dropped);
    CHECK(kind == ErrorKind::Unsupported);
    CHECK(contains(refused, "flowedge: realtime: cannot lock memory: RLIMIT_MEMLOCK is 65536 bytes but locking all of this process needs "));
    CHECK(contains(refused, "bytes (its mapped size, VmSize) and the thread lacks CAP_IPC_LOCK"));
    CHECK(contains(refused, "ulimit -l unlimited"));
    CHECK(contains(refused, "memlock unlimited' line in /etc/security/limits.conf"));
    CHECK(contains(refused, "CAP_IPC_LOCK"));
    CHECK(realtime::status_bytes("VmLck") == locked_before);
}

TEST_CASE("after a pre-fault, or a lock, the pages mapped before it are present: touching them faults nothing") {
    const std::size_t bytes = std::size_t(16) << 20;
    const auto fresh_mapping = [&] {
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(p != MAP_FAILED);
        return static_cast<unsigned char*>(p);
    };
    const auto faults_touching = [&](unsigned char* p) { return faults_writing_pages(p, bytes); };
    unsigned char* untouched = fresh_mapping();
    CHECK(faults_touching(untouched) > 0);  // the counter sees first touches: the zeros below mean something
    unsigned char* a = fresh_mapping();
    CHECK(realtime::prefault_memory() >= bytes);
    CHECK(faults_touching(a) == 0);
    // The lock: pages mapped before and after it (MCL_FUTURE) are present. Refused for the limit (an unprivileged
    // user): the soft limit is raised to the hard one first; if that is still too low, the refusal is what is tested.
    unsigned char* b = fresh_mapping();
    std::string refused = error_of([] { realtime::lock_memory(); }).first;
    if (!refused.empty() && fe_test::raise_soft_to_hard(RLIMIT_MEMLOCK)) refused = error_of([] { realtime::lock_memory(); }).first;
    if (refused.empty()) {
        unsigned char* c = fresh_mapping();
        CHECK(realtime::status_bytes("VmLck") >= 2 * bytes);
        CHECK(faults_touching(b) == 0);
        CHECK(faults_touching(c) == 0);
        ::munlockall();
        ::munmap(c, bytes);
    } else {
        CHECK(fe_test::lock_refusal_explained(refused));
        MESSAGE("memory cannot be locked here (" << refused << "): the pre-fault above is what this machine proves");
    }
    for (unsigned char* p : {untouched, a, b}) ::munmap(p, bytes);
}
