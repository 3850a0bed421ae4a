// fe_realtime_apply / fe_policy_set_realtime (include/flowedge/c_api.h): the statuses and fe_last_error messages of
// every refusal (a bad CPU or priority is FE_ERR_INVALID_ARGUMENT, a limit the system enforces FE_ERR_UNSUPPORTED
// naming it and its fix), and a policy that keeps giving the same actions after its loop thread is pinned and its
// memory pre-faulted. Refusals are provoked on a fresh thread without the capability (the test may run as root).
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../support/realtime_test_util.hpp"
#include "flowedge/c_api.h"
#include "flowedge/realtime.hpp"

namespace {

const std::string kFolder = std::string(FLOWEDGE_FIXTURES_DIR) + "/dp_small";

bool mentions(const char* needle) { return std::string(fe_last_error()).find(needle) != std::string::npos; }

/// Status and fe_last_error of fe_realtime_apply(o) on a new thread without `cap` (and with `resource`'s soft limit
/// lowered to `soft`).
std::pair<fe_status, std::string> refused_without(int cap, int resource, rlim_t soft, const fe_realtime_options& o) {
    fe_test::SoftLimit limit(resource, soft);
    REQUIRE(limit.ok());
    fe_status st = FE_OK;
    std::string msg;
    bool dropped = false;
    fe_test::on_new_thread([&] {
        dropped = fe_test::drop_capability(cap);
        st = fe_realtime_apply(&o);
        msg = fe_last_error();  // thread-local: read on the thread that failed
    });
    REQUIRE(dropped);
    return {st, msg};
}

/// Actions of 12 ticks of dp_small from reset(seed 5) (state [2] and env state [4] drift with t).
std::vector<float> episode(fe_policy* p) {
    std::vector<float> out;
    const uint64_t seed = 5;
    REQUIRE(fe_policy_reset(p, &seed) == FE_OK);
    for (int t = 0; t < 12; ++t) {
        const float state[2] = {100.f + 37.f * float(t), 111.f + 37.f * float(t)};
        const float env[4] = {0.1f * float(t), 0.1f * float(t) - 0.2f, 0.1f * float(t) - 0.4f, 0.1f * float(t) - 0.6f};
        const fe_observation obs{state, 2, env, 4, nullptr, 0};
        float a[8] = {};
        REQUIRE(fe_policy_select_action(p, &obs, a, 8) == FE_OK);
        out.insert(out.end(), a, a + fe_policy_action_dim(p));
    }
    return out;
}

}  // namespace

TEST_CASE("fe_realtime_apply: NULL options, a CPU list without CPUs, a CPU that does not exist, a bad priority and isolation without CPUs are FE_ERR_INVALID_ARGUMENT") {
    CHECK(fe_realtime_apply(nullptr) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'options' is NULL"));
    fe_realtime_options o{};
    CHECK(fe_realtime_apply(&o) == FE_OK);  // all zero: nothing to do
    o.n_cpus = 2;
    CHECK(fe_realtime_apply(&o) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'options->cpus' is NULL"));
    const int32_t missing[1] = {4096};
    o.cpus = missing;
    o.n_cpus = 1;
    CHECK(fe_realtime_apply(&o) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("flowedge: realtime: CPU 4096 does not exist"));
    o = fe_realtime_options{};
    o.rt_priority = 100;
    CHECK(fe_realtime_apply(&o) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("SCHED_FIFO priority out of range (expected 1..99, got 100)"));
    o = fe_realtime_options{};
    o.isolate_cpus = 1;  // no loop CPUs to keep the other threads off
    CHECK(fe_realtime_apply(&o) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("isolate_cpus needs loop CPUs that leave at least one allowed CPU for the other threads"));
}

TEST_CASE("fe_realtime_apply: a priority or a memory lock the limits forbid is FE_ERR_UNSUPPORTED naming the limit and the fix") {
    fe_realtime_options o{};
    o.rt_priority = 80;
    const auto [st_prio, msg_prio] = refused_without(CAP_SYS_NICE, RLIMIT_RTPRIO, 0, o);
    CHECK(st_prio == FE_ERR_UNSUPPORTED);
    CHECK(fe_test::contains(msg_prio, "RLIMIT_RTPRIO is 0 and the thread lacks CAP_SYS_NICE"));
    CHECK(fe_test::contains(msg_prio, "ulimit -r 80"));
    o = fe_realtime_options{};
    o.lock_memory = 1;
    const auto [st_lock, msg_lock] = refused_without(CAP_IPC_LOCK, RLIMIT_MEMLOCK, 64 * 1024, o);
    CHECK(st_lock == FE_ERR_UNSUPPORTED);
    CHECK(fe_test::contains(msg_lock, "RLIMIT_MEMLOCK is 65536 bytes but locking all of this process needs"));
    CHECK(fe_test::contains(msg_lock, "ulimit -l unlimited"));
}

TEST_CASE("fe_policy_set_realtime: pinned and pre-faulted, the policy gives the same actions; NULL policy or options are errors") {
    fe_policy* p = nullptr;
    REQUIRE(fe_policy_load_ex(kFolder.c_str(), "cpu", nullptr, &p) == FE_OK);
    const std::vector<float> before = episode(p);
    const std::vector<int> allowed = flowedge::realtime::allowed_cpus();
    REQUIRE(!allowed.empty());
    std::vector<float> after;
    fe_status st = FE_ERR_INTERNAL;
    fe_test::on_new_thread([&] {  // the pinning ends with this thread
        const std::vector<int32_t> cpus(allowed.begin(), allowed.end());
        fe_realtime_options o{};
        o.prefault = 1;
        o.cpus = cpus.data();
        o.n_cpus = cpus.size();
        o.high_priority_stream = o.pinned_staging = 1;  // CUDA-only: ignored by a CPU policy
        st = fe_policy_set_realtime(p, &o);
        if (st == FE_OK) after = episode(p);
    });
    CHECK(st == FE_OK);
    CHECK(after == before);
    fe_realtime_options o{};
    CHECK(fe_policy_set_realtime(nullptr, &o) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'policy' is NULL"));
    CHECK(fe_policy_set_realtime(p, nullptr) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'options' is NULL"));
    fe_policy_free(p);
}
