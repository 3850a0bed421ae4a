// fe_policy (include/flowedge/c_api.h) against DiffusionPolicy<Cpu> itself on the committed no-camera LeRobot folder
// dp_small (state + environment state): the same actions call for call, with seeded and with caller noise, and every
// bad-input path returning its status with a message that names the feature key and the expected size.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "flowedge/c_api.h"
#include "flowedge/models/diffusion/policy.hpp"
#include "../support/cpu_models_diffusion_policy.hpp"

using namespace flowedge;

namespace {

const std::string kFolder = std::string(FLOWEDGE_FIXTURES_DIR) + "/dp_small";

/// A deterministic observation of tick t: state [2] inside dp_small's MIN_MAX range, env state [4].
struct Obs {
    std::vector<float> state, env;
    explicit Obs(int t) {
        for (int i = 0; i < 2; ++i) state.push_back(100.f + 37.f * float(t) + 11.f * float(i));
        for (int i = 0; i < 4; ++i) env.push_back(0.1f * float(t) - 0.2f * float(i));
    }
    fe_observation c() const { return fe_observation{state.data(), state.size(), env.data(), env.size(), nullptr, 0}; }
    PolicyObservation cpp() const { return PolicyObservation{state, env, {}}; }
};

/// fe_policy_options with the sampler fields set and the rest zero (C callers zero-initialise it the same way).
fe_policy_options sampler_options(int32_t steps, const char* scheduler, std::uint64_t seed) {
    fe_policy_options o{};
    o.steps = steps;
    o.scheduler = scheduler;
    o.seed = seed;
    return o;
}

bool mentions(const char* needle) { return std::string(fe_last_error()).find(needle) != std::string::npos; }

struct Loaded {
    fe_policy* p = nullptr;
    explicit Loaded(const fe_policy_options* o = nullptr) { REQUIRE(fe_policy_load_ex(kFolder.c_str(), "cpu", o, &p) == FE_OK); }
    ~Loaded() { fe_policy_free(p); }
};

}  // namespace

TEST_CASE("fe_policy: introspection of dp_small") {
    Loaded l;
    CHECK(fe_policy_action_dim(l.p) == 2);
    CHECK(fe_policy_state_dim(l.p) == 2);
    CHECK(fe_policy_env_dim(l.p) == 4);
    CHECK(fe_policy_n_cameras(l.p) == 0);
    CHECK(fe_policy_horizon(l.p) == 16);
    CHECK(fe_policy_n_obs_steps(l.p) == 2);
    CHECK(fe_policy_n_action_steps(l.p) == 8);
    CHECK(fe_policy_steps(l.p) == 100);  // num_inference_steps null -> num_train_timesteps (LeRobot's rule)
    CHECK(std::string(fe_policy_state_key(l.p)) == "observation.state");
    CHECK(std::string(fe_policy_env_key(l.p)) == "observation.environment_state");
    CHECK(std::string(fe_policy_backend(l.p)) == "cpu");
    CHECK(fe_policy_cuda_resident(l.p) == 0);
    CHECK(std::string(fe_policy_fallback_reason(l.p)).empty());
    CHECK(fe_policy_device_bytes(l.p) > 0);
    CHECK(fe_policy_chunks_generated(l.p) == 0);
    CHECK(fe_policy_camera(l.p, 0, nullptr, nullptr, nullptr, nullptr) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("camera index out of range"));
    // NULL policy: -1 / "" / 0 and a message.
    CHECK(fe_policy_action_dim(nullptr) == -1);
    CHECK(mentions("argument 'policy' is NULL"));
    CHECK(std::string(fe_policy_backend(nullptr)).empty());
    CHECK(fe_policy_device_bytes(nullptr) == 0);
}

TEST_CASE("fe_policy: select_action equals DiffusionPolicy<Cpu>, seeded and with caller noise") {
    const fe_policy_options opts = sampler_options(10, "ddim", 7);
    Loaded l(&opts);
    PolicyOptions po;
    po.steps = 10;
    po.scheduler = Scheduler::Ddim;
    po.seed = 7;
    auto ref = DiffusionPolicy<Cpu>::load(kFolder, po);
    const std::size_t HA = 16 * 2;
    for (int with_noise = 0; with_noise < 2; ++with_noise) {
        CAPTURE(with_noise);
        REQUIRE(fe_policy_reset(l.p, nullptr) == FE_OK);
        ref.reset();
        for (int t = 0; t < 20; ++t) {  // 3 chunks
            CAPTURE(t);
            const Obs o(t);
            std::vector<float> noise(HA);
            for (std::size_t i = 0; i < HA; ++i) noise[i] = std::sin(0.37f * float(i) + float(fe_policy_chunks_generated(l.p)));
            float got[2] = {NAN, NAN}, want[2] = {NAN, NAN};
            const fe_observation c = o.c();
            if (with_noise) {
                REQUIRE(fe_policy_select_action_noise(l.p, &c, noise.data(), noise.size(), got, 2) == FE_OK);
                ref.select_action(o.cpp(), want, noise);
            } else {
                REQUIRE(fe_policy_select_action(l.p, &c, got, 2) == FE_OK);
                ref.select_action(o.cpp(), want);
            }
            CHECK(got[0] == want[0]);
            CHECK(got[1] == want[1]);
            CHECK(std::isfinite(got[0]));
            CHECK(fe_policy_chunks_generated(l.p) == ref.chunks_generated());
        }
        CHECK(fe_policy_chunks_generated(l.p) == 3);
    }
    // reset(seed) replaces the seed: the same episode under another seed gives other actions, under the same the same.
    const std::uint64_t seed = 8;
    float a7[2], a8[2], again[2];
    const Obs o(0);
    const fe_observation c = o.c();
    REQUIRE(fe_policy_reset(l.p, nullptr) == FE_OK);
    REQUIRE(fe_policy_select_action(l.p, &c, a7, 2) == FE_OK);
    REQUIRE(fe_policy_reset(l.p, &seed) == FE_OK);
    REQUIRE(fe_policy_select_action(l.p, &c, a8, 2) == FE_OK);
    REQUIRE(fe_policy_reset(l.p, &seed) == FE_OK);
    REQUIRE(fe_policy_select_action(l.p, &c, again, 2) == FE_OK);
    CHECK(a8[0] == again[0]);
    CHECK((a7[0] != a8[0] || a7[1] != a8[1]));
}

TEST_CASE("fe_policy: bad input returns its status and names the key and the expected size") {
    Loaded l;
    const Obs o(0);
    float act[2];
    fe_observation c = o.c();

    CHECK(fe_policy_select_action(l.p, &c, act, 2) == FE_ERR_INVALID_ARGUMENT);  // before reset
    CHECK(mentions("before reset()"));
    REQUIRE(fe_policy_reset(l.p, nullptr) == FE_OK);

    CHECK(fe_policy_select_action(nullptr, &c, act, 2) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'policy' is NULL"));
    CHECK(fe_policy_select_action(l.p, nullptr, act, 2) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'obs' is NULL"));
    CHECK(fe_policy_select_action(l.p, &c, nullptr, 2) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'action' is NULL"));
    CHECK(fe_policy_select_action(l.p, &c, act, 1) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("needs 2 floats"));

    fe_observation bad = c;
    bad.state = nullptr;
    CHECK(fe_policy_select_action(l.p, &bad, act, 2) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("'observation.state') is NULL"));
    bad = c;
    bad.state_len = 1;
    CHECK(fe_policy_select_action(l.p, &bad, act, 2) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("obs->state ('observation.state') is too small: needs 2 floats"));
    std::vector<float> long_state{1.f, 2.f, 3.f};
    bad = c;
    bad.state = long_state.data();
    bad.state_len = 3;
    CHECK(fe_policy_select_action(l.p, &bad, act, 2) == FE_ERR_SHAPE);
    CHECK(mentions("(expected 2, got 3)"));
    bad = c;
    bad.env_state_len = 3;
    CHECK(fe_policy_select_action(l.p, &bad, act, 2) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("'observation.environment_state'"));

    Obs nan_obs(0);
    nan_obs.state[1] = std::numeric_limits<float>::quiet_NaN();
    bad = nan_obs.c();
    CHECK(fe_policy_select_action(l.p, &bad, act, 2) == FE_ERR_NON_FINITE);
    CHECK(mentions("'observation.state' element 1 is not finite"));
    Obs inf_obs(0);
    inf_obs.env[3] = std::numeric_limits<float>::infinity();
    bad = inf_obs.c();
    CHECK(fe_policy_select_action(l.p, &bad, act, 2) == FE_ERR_NON_FINITE);
    CHECK(mentions("'observation.environment_state' element 3"));

    // A frame for a policy without cameras.
    std::vector<std::uint8_t> pixels(4 * 4 * 3);
    const fe_frame frame{pixels.data(), FE_IMAGE_U8_HWC, 4, 4};
    bad = c;
    bad.frames = &frame;
    bad.n_frames = 1;
    CHECK(fe_policy_select_action(l.p, &bad, act, 2) == FE_ERR_SHAPE);
    CHECK(mentions("more frames than the policy has cameras (expected 0, got 1)"));

    std::vector<float> noise(16 * 2, 0.f);
    CHECK(fe_policy_select_action_noise(l.p, &c, noise.data(), 31, act, 2) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'noise' is too small: needs 32 floats"));
    noise[5] = std::numeric_limits<float>::quiet_NaN();
    CHECK(fe_policy_select_action_noise(l.p, &c, noise.data(), 32, act, 2) == FE_ERR_NON_FINITE);
    CHECK(mentions("noise element 5"));

    // Nothing above reached the queues: the first good call still fills them (chunk 1 of the episode).
    CHECK(fe_policy_chunks_generated(l.p) == 0);
    CHECK(fe_policy_select_action(l.p, &c, act, 2) == FE_OK);
    CHECK(fe_policy_chunks_generated(l.p) == 1);
}

TEST_CASE("fe_policy_set_math: the engine's names and errors; a CPU Diffusion Policy computes TF32 exactly, BF16 near F32") {
    Loaded l;
    const Obs o(0);
    const fe_observation c = o.c();
    const std::uint64_t seed = 3;
    auto first_action = [&](float (&a)[2]) {
        REQUIRE(fe_policy_reset(l.p, &seed) == FE_OK);
        REQUIRE(fe_policy_select_action(l.p, &c, a, 2) == FE_OK);
    };
    float exact[2], got[2];
    first_action(exact);
    REQUIRE(fe_policy_set_math(l.p, "tf32") == FE_OK);
    first_action(got);
    CHECK(got[0] == exact[0]);  // no TF32 path on the CPU
    CHECK(got[1] == exact[1]);
    for (const char* mode : {"bf16", "BF16"}) {
        CAPTURE(mode);
        REQUIRE(fe_policy_set_math(l.p, mode) == FE_OK);
        first_action(got);
        // The U-Net's Conv1d on the vdpbf16ps kernels where the CPU has AVX512_BF16 (exact elsewhere): as the
        // engine's test, within 2e-2 relative of F32 after 10 DDIM steps.
        for (int d = 0; d < 2; ++d) CHECK(std::fabs(got[d] - exact[d]) <= 2e-2f * (1.f + std::fabs(exact[d])));
    }
    REQUIRE(fe_policy_set_math(l.p, "f32") == FE_OK);
    first_action(got);
    CHECK(got[0] == exact[0]);
    CHECK(got[1] == exact[1]);
    CHECK(fe_policy_set_math(l.p, "fp8") == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("unknown math mode 'fp8'"));
    CHECK(fe_policy_set_math(l.p, nullptr) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("fe_policy_set_math: math is NULL"));
    CHECK(fe_policy_set_math(nullptr, "f32") == FE_ERR_INVALID_ARGUMENT);
}

TEST_CASE("fe_policy options->quantize: the same actions as DiffusionPolicy<Cpu> with LoadOptions::quantize, or the refusal") {
    const Obs o(0);
    const fe_observation c = o.c();
    PolicyOptions po;
    po.steps = 10;
    po.seed = 5;
    auto f32 = DiffusionPolicy<Cpu>::load(kFolder, po);
    f32.reset();
    float exact[2];
    f32.select_action(o.cpp(), exact);
    const cpu::Isa isa = cpu::active_isa();
    const bool int8_kernels = isa == cpu::Isa::Avx2 || isa == cpu::Isa::Avx512;
    for (const char* name : {"none", "int8", "w8a8"}) {
        CAPTURE(name);
        const WeightQuant q = *weight_quant_from_name(name);
        const bool available = q == WeightQuant::None || (q == WeightQuant::Int8 ? int8_kernels : cpu::w8a8_available());
        fe_policy_options opts = sampler_options(10, nullptr, 5);
        opts.quantize = name;
        fe_policy* p = nullptr;
        const fe_status st = fe_policy_load_ex(kFolder.c_str(), "cpu", &opts, &p);
        if (!available) {
            CHECK(st == FE_ERR_UNSUPPORTED);
            CHECK(mentions((std::string("LoadOptions::quantize = ") + (q == WeightQuant::Int8 ? "Int8" : "W8A8") + " needs").c_str()));
            CHECK(p == nullptr);
            continue;
        }
        REQUIRE(st == FE_OK);
        po.load.quantize = q;
        auto ref = DiffusionPolicy<Cpu>::load(kFolder, po);
        ref.reset();
        float got[2], want[2];
        REQUIRE(fe_policy_reset(p, nullptr) == FE_OK);
        REQUIRE(fe_policy_select_action(p, &c, got, 2) == FE_OK);
        ref.select_action(o.cpp(), want);
        CHECK(got[0] == want[0]);
        CHECK(got[1] == want[1]);
        // The option reached the weights: INT8 changes the action (within docs/numerics.md's bounds), "none" does not.
        if (q == WeightQuant::None) {
            CHECK(got[0] == exact[0]);
        } else {
            CHECK((got[0] != exact[0] || got[1] != exact[1]));
        }
        fe_policy_free(p);
    }
    fe_policy* p = reinterpret_cast<fe_policy*>(1);
    fe_policy_options bad{};
    bad.quantize = "int4";
    CHECK(fe_policy_load_ex(kFolder.c_str(), "cpu", &bad, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("unknown options->quantize 'int4' (expected NULL, none, int8 or w8a8)"));
    CHECK(p == nullptr);
}

TEST_CASE("fe_policy: load errors") {
    fe_policy* p = reinterpret_cast<fe_policy*>(1);
    CHECK(fe_policy_load("/no/such/folder", "cpu", &p) == FE_ERR_IO);
    CHECK(p == nullptr);
    CHECK(mentions("/no/such/folder"));
    CHECK(fe_policy_load(nullptr, "cpu", &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("argument 'folder' is NULL"));
    CHECK(fe_policy_load(kFolder.c_str(), "cpu", nullptr) == FE_ERR_INVALID_ARGUMENT);
    CHECK(fe_policy_load(kFolder.c_str(), "tpu", &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("unknown device 'tpu'"));
    fe_policy_options o{};
    o.dtype = "f8";
    CHECK(fe_policy_load_ex(kFolder.c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("unknown weight dtype 'f8'"));
    o = sampler_options(0, "euler", 0);
    CHECK(fe_policy_load_ex(kFolder.c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("options->scheduler"));
    o = sampler_options(1000, nullptr, 0);
    CHECK(fe_policy_load_ex(kFolder.c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("steps out of range (expected 1..100, got 1000)"));
    if (!fe_built_with_cuda()) {
        CHECK(fe_policy_load(kFolder.c_str(), "cuda", &p) == FE_ERR_DEVICE);
        CHECK(mentions("no CUDA backend"));
        REQUIRE(fe_policy_load(kFolder.c_str(), "auto", &p) == FE_OK);
        CHECK(fe_policy_cuda_resident(p) == 0);
        CHECK(std::string(fe_policy_fallback_reason(p)).find("no CUDA backend") != std::string::npos);
        fe_policy_free(p);
    }
    // A folder that is a head-only file's parent without config.json is a format/IO error, never a crash.
    CHECK(fe_policy_load((std::string(FLOWEDGE_FIXTURES_DIR) + "/io").c_str(), "cpu", &p) != FE_OK);
    CHECK(p == nullptr);
    fe_policy_free(nullptr);
}

TEST_CASE("fe_policy: a batch of environments equals DiffusionPolicy<Cpu> with the same batch, reset per environment") {
    fe_policy_options opts = sampler_options(10, "ddpm", 7);
    opts.batch = 3;
    Loaded l(&opts);
    CHECK(fe_policy_batch(l.p) == 3);
    PolicyOptions po;
    po.steps = 10;
    po.scheduler = Scheduler::Ddpm;
    po.seed = 7;
    po.batch = 3;
    auto ref = DiffusionPolicy<Cpu>::load(kFolder, po);
    REQUIRE(fe_policy_reset(l.p, nullptr) == FE_OK);
    ref.reset();
    for (int t = 0; t < 20; ++t) {
        CAPTURE(t);
        if (t == 5) {
            const std::uint64_t seed = 9;
            REQUIRE(fe_policy_reset_env(l.p, 1, &seed) == FE_OK);
            ref.reset_env(1, 9);
        }
        const std::vector<Obs> o = {Obs(t), Obs(t + 7), Obs(2 * t)};
        const fe_observation c[3] = {o[0].c(), o[1].c(), o[2].c()};
        const PolicyObservation cpp[3] = {o[0].cpp(), o[1].cpp(), o[2].cpp()};
        float got[6], want[6];
        REQUIRE(fe_policy_select_action_batch(l.p, c, 3, nullptr, 0, got, 6) == FE_OK);
        ref.select_action(cpp, want);
        for (int i = 0; i < 6; ++i) CHECK(got[i] == want[i]);
        for (int e = 0; e < 3; ++e) CHECK(fe_policy_env_chunks_generated(l.p, e) == ref.chunks_generated(e));
    }
    CHECK(fe_policy_env_chunks_generated(l.p, 1) == 2);  // reset at tick 5: chunks at ticks 5 and 13
    const Obs o(0);
    const fe_observation c[3] = {o.c(), o.c(), o.c()};
    float a[6];
    CHECK(fe_policy_select_action_batch(l.p, c, 2, nullptr, 0, a, 6) == FE_ERR_SHAPE);
    CHECK(mentions("one observation per environment (expected 3, got 2)"));
    CHECK(fe_policy_select_action_batch(l.p, c, 3, nullptr, 0, a, 5) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("actions"));
    std::vector<float> noise(3 * 16 * 2, 0.f);
    CHECK(fe_policy_select_action_batch(l.p, c, 3, noise.data(), noise.size() - 1, a, 6) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("noise"));
    fe_observation bad[3] = {o.c(), o.c(), o.c()};
    bad[2].state_len = 1;
    CHECK(fe_policy_select_action_batch(l.p, bad, 3, nullptr, 0, a, 6) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("environment 2: obs->state"));
    CHECK(fe_policy_reset_env(l.p, 3, nullptr) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("environment index out of range (expected 0..2, got 3)"));
    CHECK(fe_policy_env_chunks_generated(l.p, -1) == -1);
    float one[2];
    CHECK(fe_policy_select_action(l.p, &c[0], one, 2) != FE_OK);
    CHECK(mentions("serves a batch"));
    fe_policy* p = nullptr;
    opts.batch = -1;
    CHECK(fe_policy_load_ex(kFolder.c_str(), "cpu", &opts, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("options->batch must be >= 0"));
    CHECK(p == nullptr);
}
