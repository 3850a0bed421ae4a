// DiffusionPolicy<B> serving a batch of environments (PolicyOptions::batch): a batch-3 policy fed three different
// observation streams, with environments reset at different ticks so their queues are out of phase and only some
// sample at a tick, gives each environment the actions of its own batch-1 policy (seeded DDIM and DDPM noise, and
// caller noise), up to the last bits of batched linears and convolutions (docs/status.md "Batch rows"); bad batched
// input is rejected naming what is wrong; the batched tick allocates nothing after load.
#include <doctest/doctest.h>
#include "../support/counting_new.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "../ops/ops_test_util.hpp"
#include "../support/lerobot_fixture_folder.hpp"
#include "../support/policy_episode.hpp"
#include "flowedge/models/diffusion/policy.hpp"
#include "../support/cpu_models_diffusion_policy.hpp"

using namespace flowedge;

namespace {

constexpr int kEnvs = 3;
/// Batched vs batch-1 rows, normalised action units: a batch row differs from the batch-1 result only in the last
/// bits of each linear/conv (1.4e-6 per U-Net call on dp_small), carried through the sampler steps and the chunks.
constexpr double kBatchTol = 5e-5;

/// Tick at which environment e is reset again mid-run (environment 0 never is): the queues go out of phase, so some
/// ticks sample a subset of the environments and some encode a subset.
constexpr int kResetTick[kEnvs] = {-1, 3, 6};

/// Observation index of environment e at tick t: each environment walks the episode from its own offset.
int frame_of(const testsupport::PolicyEpisode& ep, int e, int t) { return (t + 5 * e) % ep.T; }

template <Backend B>
PolicyOptions options(int batch, Scheduler s) {
    PolicyOptions o;
    o.batch = batch;
    o.scheduler = s;
    o.steps = 10;
    o.seed = 11;
    return o;
}

/// Runs `ticks` ticks of the batch-3 policy and of three batch-1 policies on the same per-environment observations
/// (and, with caller_noise, the same noise rows) and returns the worst difference in normalised action units.
template <Backend B>
double batch_vs_single(Scheduler s, bool caller_noise, int ticks) {
    const auto folder = testsupport::rebuilt_fixture("dp_image_bn");
    auto batched = DiffusionPolicy<B>::load(folder, options<B>(kEnvs, s));
    std::vector<DiffusionPolicy<B>> single;
    for (int e = 0; e < kEnvs; ++e) single.push_back(DiffusionPolicy<B>::load(folder, options<B>(1, s)));
    CHECK(batched.batch() == kEnvs);
    const testsupport::PolicyEpisode ep = testsupport::read_policy_episode(batched, "dp_image_bn");
    const int A = batched.action_dim();
    const std::size_t ha = std::size_t(batched.config().horizon) * A;
    const auto& mn = batched.head().action_min();
    const auto& mx = batched.head().action_max();

    batched.reset(11);
    for (int e = 0; e < kEnvs; ++e) single[std::size_t(e)].reset(11 + (std::uint64_t(e) << 32));
    std::vector<testsupport::EpisodeObservation> at(kEnvs);
    std::vector<PolicyObservation> obs(kEnvs);
    std::vector<float> actions(std::size_t(kEnvs) * A), one(static_cast<std::size_t>(A)), noise(kEnvs * ha);
    double worst = 0;
    int subset_ticks = 0;
    for (int t = 0; t < ticks; ++t) {
        for (int e = 0; e < kEnvs; ++e) {
            if (t == kResetTick[e]) {
                batched.reset_env(e);
                single[std::size_t(e)].reset();
            }
            testsupport::observation_at(batched, ep, frame_of(ep, e, t), false, at[std::size_t(e)]);
            obs[std::size_t(e)] = at[std::size_t(e)].obs;
        }
        for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = float(std::sin(0.37 * double(i) + 1.3 * t));
        const std::vector<int> chunks_before = {batched.chunks_generated(0), batched.chunks_generated(1), batched.chunks_generated(2)};
        batched.select_action(obs, actions, caller_noise ? std::span<const float>(noise) : std::span<const float>{});
        int sampled = 0;
        for (int e = 0; e < kEnvs; ++e) {
            auto& p = single[std::size_t(e)];
            p.select_action(obs[std::size_t(e)], one,
                            caller_noise ? std::span<const float>(noise.data() + std::size_t(e) * ha, ha) : std::span<const float>{});
            CHECK(batched.chunks_generated(e) == p.chunks_generated());
            sampled += batched.chunks_generated(e) != chunks_before[std::size_t(e)];
            for (int i = 0; i < A; ++i) {
                const double half_range = (double(mx[std::size_t(i)]) - mn[std::size_t(i)]) / 2;
                worst = std::max(worst, std::fabs(double(actions[std::size_t(e * A + i)]) - one[std::size_t(i)]) / half_range);
            }
        }
        subset_ticks += sampled > 0 && sampled < kEnvs;
    }
    CHECK(subset_ticks >= 2);  // the out-of-phase resets made some ticks sample only part of the batch
    return worst;
}

}  // namespace

TEST_CASE_TEMPLATE("a batch of 3 environments with out-of-phase queues acts as 3 batch-1 policies", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    // 9 ticks with 8-action queues and resets at ticks 3 and 6: chunks at 0/8, 0/3, 0/6 (environment 0's second chunk
    // from a full queue cycle), three subset ticks.
    const double ddim = batch_vs_single<B>(Scheduler::Ddim, false, 9);
    MESSAGE("seeded DDIM: max |batched - batch-1| " << ddim << " (normalised)");
    CHECK(ddim <= kBatchTol);
    // The other noise sources over 7 ticks: chunks at 0, 0/3, 0/6, two subset ticks.
    const double given = batch_vs_single<B>(Scheduler::Ddim, true, 7);
    MESSAGE("caller noise: max |batched - batch-1| " << given << " (normalised)");
    CHECK(given <= kBatchTol);
    // DDPM: each environment's step noise comes from its own stream (seed_e + 2k + 1) although they share one call.
    const double ddpm = batch_vs_single<B>(Scheduler::Ddpm, false, 7);
    MESSAGE("seeded DDPM: max |batched - batch-1| " << ddpm << " (normalised)");
    CHECK(ddpm <= kBatchTol);
}

TEST_CASE("environment 0 of a batch draws the seeded noise of a batch-1 policy with the same seed, the others their own") {
    const auto folder = testsupport::rebuilt_fixture("dp_image_bn");
    auto batched = DiffusionPolicy<Cpu>::load(folder, options<Cpu>(kEnvs, Scheduler::Ddim));
    auto single = DiffusionPolicy<Cpu>::load(folder, options<Cpu>(1, Scheduler::Ddim));
    const testsupport::PolicyEpisode ep = testsupport::read_policy_episode(batched, "dp_image_bn");
    testsupport::EpisodeObservation at;
    testsupport::observation_at(batched, ep, 0, false, at);
    const std::vector<PolicyObservation> obs(kEnvs, at.obs);
    const int A = batched.action_dim();
    std::vector<float> actions(std::size_t(kEnvs) * A), one(static_cast<std::size_t>(A));
    batched.reset(5);
    single.reset(5);
    batched.select_action(obs, actions);
    single.select_action(at.obs, one);
    for (int i = 0; i < A; ++i) CHECK(actions[std::size_t(i)] == doctest::Approx(one[std::size_t(i)]).epsilon(1e-4));
    // Same observation, different streams: environments 1 and 2 act differently from environment 0.
    CHECK(!std::equal(actions.begin(), actions.begin() + A, actions.begin() + A));
    CHECK(!std::equal(actions.begin() + A, actions.begin() + 2 * A, actions.begin() + 2 * A));
}

TEST_CASE("bad batched input is rejected naming the environment, the count or the size") {
    const auto folder = testsupport::rebuilt_fixture("dp_image_bn");
    for (int bad : {0, -2}) {
        PolicyOptions o;
        o.batch = bad;
        const std::string want = "batch must be positive (expected >= 1, got " + std::to_string(bad) + ")";
        CHECK_THROWS_WITH_AS(DiffusionPolicy<Cpu>::load(folder, o), doctest::Contains(want.c_str()), Error);
    }
    auto p = DiffusionPolicy<Cpu>::load(folder, options<Cpu>(kEnvs, Scheduler::Ddim));
    const testsupport::PolicyEpisode ep = testsupport::read_policy_episode(p, "dp_image_bn");
    testsupport::EpisodeObservation at;
    testsupport::observation_at(p, ep, 0, false, at);
    std::vector<PolicyObservation> obs(kEnvs, at.obs);
    const std::size_t A = std::size_t(p.action_dim());
    std::vector<float> actions(kEnvs * A), one(A);
    p.reset();
    CHECK_THROWS_WITH_AS(p.select_action(at.obs, one), doctest::Contains("serves a batch (pass one observation per environment) (expected batch 1, got 3)"), Error);
    CHECK_THROWS_WITH_AS(p.select_action(std::span<const PolicyObservation>(obs.data(), 2), actions),
                         doctest::Contains("wrong number of observations (one per environment) (expected 3, got 2)"), Error);
    const std::string want_actions = "action output has the wrong size (expected [batch, action_dim] = " + std::to_string(3 * A);
    CHECK_THROWS_WITH_AS(p.select_action(obs, std::span<float>(actions.data(), A)), doctest::Contains(want_actions.c_str()), Error);
    {
        std::vector<float> noise(7, 0.f);
        CHECK_THROWS_WITH_AS(p.select_action(obs, actions, noise), doctest::Contains("noise has the wrong size (expected [batch, horizon, action_dim]"), Error);
    }
    {
        std::vector<float> s(at.obs.state.begin(), at.obs.state.end());
        s[0] = NAN;
        obs[2].state = s;
        CHECK_THROWS_WITH_AS(p.select_action(obs, actions), doctest::Contains("policy env 2: 'observation.state' element 0 is not finite"), Error);
        obs[2] = at.obs;
    }
    {
        testsupport::EpisodeObservation as_float;
        testsupport::observation_at(p, ep, 0, true, as_float);
        obs[1] = as_float.obs;
        CHECK_THROWS_WITH_AS(p.select_action(obs, actions),
                             doctest::Contains("policy env 1: 'observation.images.top': frames of one camera must share a layout across environments"), Error);
        obs[1] = at.obs;
    }
    CHECK_THROWS_WITH_AS(p.reset_env(3), doctest::Contains("environment index out of range (expected 0..2, got 3)"), Error);
    CHECK_THROWS_WITH_AS(p.reset_env(-1, 4), doctest::Contains("environment index out of range (expected 0..2, got -1)"), Error);
    CHECK_THROWS_WITH_AS((void)p.chunks_generated(5), doctest::Contains("environment index out of range"), Error);
    // A rejected call leaves the policy usable.
    p.select_action(obs, actions);
    CHECK(p.chunks_generated(2) == 1);
    CHECK(std::isfinite(actions[2 * A]));
}

TEST_CASE_TEMPLATE("the batched tick allocates nothing after load, with queues out of phase, and repeats exactly after reset", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    auto p = DiffusionPolicy<B>::load(testsupport::rebuilt_fixture("dp_image_bn"), options<B>(kEnvs, Scheduler::Ddim));
    const testsupport::PolicyEpisode ep = testsupport::read_policy_episode(p, "dp_image_bn");
    std::vector<testsupport::EpisodeObservation> at(kEnvs);
    std::vector<PolicyObservation> obs(kEnvs);
    std::vector<float> actions(std::size_t(kEnvs) * p.action_dim()), first, second;
    first.reserve(std::size_t(ep.T) * actions.size());
    second.reserve(first.capacity());
    for (int e = 0; e < kEnvs; ++e) testsupport::observation_at(p, ep, 0, false, at[std::size_t(e)]);  // sizes the buffers
    auto run = [&](std::vector<float>& out) {
        p.reset(3);
        for (int t = 0; t < ep.T; ++t) {
            for (int e = 0; e < kEnvs; ++e) {
                if (t == kResetTick[e]) p.reset_env(e);
                testsupport::observation_at(p, ep, frame_of(ep, e, t), false, at[std::size_t(e)]);
                obs[std::size_t(e)] = at[std::size_t(e)].obs;
            }
            p.select_action(obs, actions);
            out.insert(out.end(), actions.begin(), actions.end());
        }
    };
    // On CUDA the out-of-phase ticks' encoder and sampler graphs are recorded the first time their row count is seen,
    // so there the counted runs come after one uncounted run; the CPU allocates nothing from the first tick on.
    std::vector<float> warm;
    warm.reserve(first.capacity());
    if constexpr (!std::is_same_v<B, Cpu>) run(warm);
    const auto before = fe_test::g_operator_new_calls.load();
    run(first);
    run(second);
    CHECK(fe_test::g_operator_new_calls.load() == before);
    CHECK(second == first);
    if (!warm.empty()) CHECK(warm == first);
}

TEST_CASE_TEMPLATE("a batch the memory cannot hold is a load error naming the largest batch that fits, before allocating it", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    const std::size_t avail = Memory<B>::available_bytes();
    // Every environment needs more than 1 KiB (its U-Net activations alone are [channels, horizon] floats), so this
    // batch needs more than all of it; a host with over a TiB free is not tested.
    if (avail == 0 || avail / 1024 >= std::size_t(INT32_MAX / 2)) return;
    const int batch = int(avail / 1024 + 1);
    const auto folder = testsupport::rebuilt_fixture("dp_image_bn");
    const ErrorKind kind = std::is_same_v<B, Cpu> ? ErrorKind::OutOfMemory : ErrorKind::DeviceOutOfMemory;
    try {
        (void)DiffusionPolicy<B>::load(folder, options<B>(batch, Scheduler::Ddim));
        FAIL("a batch of " << batch << " loaded with " << avail << " bytes available");
    } catch (const Error& e) {
        const std::string what = e.what();
        CHECK(e.kind() == kind);
        CHECK(what.find("batch " + std::to_string(batch) + " needs ") != std::string::npos);
        CHECK(what.find("the largest batch that fits now is ") != std::string::npos);
        MESSAGE(what);  // the fit check's message, not a failed allocation's ("cudaMalloc of N bytes failed" / "an allocation needs")
    }
}
