// fe_policy on ACT folders (include/flowedge/c_api.h): the act_cam2 fixture (two 96x96 cameras, state and
// environment state; weights rebuilt from the manifest) through the C API gives LeRobot's own select_action
// episodes, with the checkpoint's temporal ensembling and with an act_selection queue; the Diffusion Policy options,
// caller noise and device "cuda" are errors that say why; device "auto" runs on the CPU and says why.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../support/lerobot_fixture_folder.hpp"
#include "flowedge/c_api.h"
#include "flowedge/io/npy.hpp"
#include "flowedge/models/act/lerobot_act_folder.hpp"
#include "../support/cpu_models_act.hpp"

using namespace flowedge;
namespace fs = std::filesystem;

namespace {

constexpr double kBound = 1e-4;  // max abs, normalised action units (issue 23), as test/act checks ActPolicy<Cpu>
// BF16 operands (8 significant bits, relative rounding 2^-9) in every linear of a 4-layer transformer on these
// random-init weights: a few 1e-2 normalised.
constexpr double kBf16Bound = 5e-2;
constexpr int kPrefixSteps = 4;  // steps of the episode a mode or reset check replays (4 chunks under ensembling)

std::string folder() { return testsupport::rebuilt_fixture("act_cam2").string(); }
fs::path ref_dir() { return fs::path(FLOWEDGE_FIXTURES_DIR) / "act_cam2_ref"; }

bool mentions(const char* needle) { return std::string(fe_last_error()).find(needle) != std::string::npos; }

/// LeRobot's recorded episode: [T, 6] states, [T, 5] environment states, two cameras of uint8 [T, 96, 96, 3].
struct Episode {
    int T = 0;
    std::vector<float> state, env;
    std::vector<std::uint8_t> top, wrist;
    Episode() {
        const auto st = io::read_npy_f32(ref_dir() / "observation.state.npy");
        T = int(st.shape[0]);
        state = st.data;
        env = io::read_npy_f32(ref_dir() / "observation.environment_state.npy").data;
        top = io::read_npy_u8(ref_dir() / "observation.images.top.npy").data;
        wrist = io::read_npy_u8(ref_dir() / "observation.images.wrist.npy").data;
    }
    /// Step t as the C struct; `frames` must outlive the call.
    fe_observation at(int t, fe_frame (&frames)[2]) const {
        const std::size_t px = 96 * 96 * 3;
        frames[0] = fe_frame{top.data() + std::size_t(t) * px, FE_IMAGE_U8_HWC, 96, 96};
        frames[1] = fe_frame{wrist.data() + std::size_t(t) * px, FE_IMAGE_U8_HWC, 96, 96};
        return fe_observation{state.data() + std::size_t(t) * 6, 6, env.data() + std::size_t(t) * 5, 5, frames, 2};
    }
};

struct Loaded {
    fe_policy* p = nullptr;
    explicit Loaded(const fe_policy_options* o = nullptr, const char* device = "cpu") {
        REQUIRE(fe_policy_load_ex(folder().c_str(), device, o, &p) == FE_OK);
    }
    ~Loaded() { fe_policy_free(p); }
};

/// Max over the episode's first `steps` steps (all by default) of |fe_policy's action - LeRobot's| in normalised units;
/// `chunks` gets the chunk count.
double episode_error(fe_policy* p, const Episode& e, const std::string& ref_name, int& chunks, int steps = -1,
                     const uint64_t* seed = nullptr) {
    const std::vector<float> want = io::read_npy_f32(ref_dir() / ref_name).data;
    const std::vector<float> std_dev = io::open_lerobot_act_folder(folder()).action.hi;
    REQUIRE(want.size() == std::size_t(e.T) * 5);
    REQUIRE(fe_policy_reset(p, seed) == FE_OK);
    double worst = 0;
    fe_frame frames[2];
    float a[5];
    for (int t = 0; t < (steps < 0 ? e.T : steps); ++t) {
        const fe_observation o = e.at(t, frames);
        REQUIRE(fe_policy_select_action(p, &o, a, 5) == FE_OK);
        for (std::size_t d = 0; d < 5; ++d)
            worst = std::max(worst, std::fabs(double(a[d]) - double(want[std::size_t(t) * 5 + d])) / double(std_dev[d]));
    }
    chunks = fe_policy_chunks_generated(p);
    return worst;
}

}  // namespace

TEST_CASE("fe_policy: an ACT folder is chosen by config.json's type; introspection of act_cam2") {
    Loaded l;
    CHECK(std::string(fe_policy_type(l.p)) == "act");
    CHECK(fe_policy_action_dim(l.p) == 5);
    CHECK(fe_policy_state_dim(l.p) == 6);
    CHECK(fe_policy_env_dim(l.p) == 5);
    CHECK(fe_policy_n_cameras(l.p) == 2);
    CHECK(fe_policy_horizon(l.p) == 12);  // chunk_size
    CHECK(fe_policy_n_obs_steps(l.p) == 1);
    CHECK(fe_policy_n_action_steps(l.p) == 1);  // temporal ensembling
    CHECK(fe_policy_steps(l.p) == 0);
    CHECK(std::string(fe_policy_state_key(l.p)) == "observation.state");
    CHECK(std::string(fe_policy_env_key(l.p)) == "observation.environment_state");
    const char* key = nullptr;
    int32_t ch = 0, h = 0, w = 0;
    REQUIRE(fe_policy_camera(l.p, 1, &key, &ch, &h, &w) == FE_OK);
    CHECK(std::string(key) == "observation.images.wrist");
    CHECK((ch == 3 && h == 96 && w == 96));
    CHECK(std::string(fe_policy_backend(l.p)) == "cpu");
    CHECK(fe_policy_cuda_resident(l.p) == 0);
    CHECK(std::string(fe_policy_fallback_reason(l.p)).empty());
    CHECK(fe_policy_device_bytes(l.p) > 0);
    CHECK(std::string(fe_policy_type(nullptr)).empty());
}

TEST_CASE("fe_policy: ACT episodes equal LeRobot's, temporal ensembling (the checkpoint's) and a queue of 5 (act_selection)") {
    const Episode e;
    int chunks = 0;
    {
        Loaded l;
        // The seed of reset() is ignored (ACT draws no noise): the episode's first steps again after a seeded reset.
        const uint64_t seed = 99;
        const double head = episode_error(l.p, e, "actions.npy", chunks, kPrefixSteps);
        CHECK(episode_error(l.p, e, "actions.npy", chunks, kPrefixSteps, &seed) == head);
        const double err = episode_error(l.p, e, "actions.npy", chunks);
        MESSAGE("act_cam2 via fe_policy, ensembling: max abs ", err, " (normalised units)");
        CHECK(err <= kBound);
        CHECK(chunks == e.T);  // a chunk every step
    }
    const fe_act_selection queue{0, 0.0, 5};
    fe_policy_options o{};
    o.act_selection = &queue;
    o.seed = 5;  // ignored for ACT
    Loaded l(&o);
    CHECK(fe_policy_n_action_steps(l.p) == 5);
    const double err = episode_error(l.p, e, "actions_alt.npy", chunks);
    MESSAGE("act_cam2 via fe_policy, queue of 5: max abs ", err, " (normalised units)");
    CHECK(err <= kBound);
    CHECK(chunks == (e.T + 4) / 5);
}

TEST_CASE("fe_policy_set_math on ACT (CPU): tf32 computes exactly, bf16 rounds linears where the CPU has AVX512_BF16") {
    // The episode's first steps only: the modes' numbers over whole episodes are act_policy's; this case checks that
    // the C API switches them (~35 s of the sanitized suite saved).
    const Episode e;
    int chunks = 0;
    Loaded l;
    const double exact = episode_error(l.p, e, "actions.npy", chunks, kPrefixSteps);
    REQUIRE(fe_policy_set_math(l.p, "tf32") == FE_OK);
    CHECK(episode_error(l.p, e, "actions.npy", chunks, kPrefixSteps) == exact);
    REQUIRE(fe_policy_set_math(l.p, "bf16") == FE_OK);
    const double bf16 = episode_error(l.p, e, "actions.npy", chunks, kPrefixSteps);
    MESSAGE("act_cam2 via fe_policy, bf16 math on the CPU: max abs ", bf16, " (normalised units; exact ", exact, ")");
    CHECK(bf16 <= kBf16Bound);
    CHECK(fe_policy_set_math(l.p, "fp8") == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("unknown math mode 'fp8'"));
    CHECK(fe_policy_set_math(l.p, nullptr) == FE_ERR_INVALID_ARGUMENT);
    REQUIRE(fe_policy_set_math(l.p, "F32") == FE_OK);
    CHECK(episode_error(l.p, e, "actions.npy", chunks, kPrefixSteps) == exact);
}

TEST_CASE("fe_policy: on ACT, Diffusion Policy options, caller noise and bad selections are errors naming the cause") {
    fe_policy* p = reinterpret_cast<fe_policy*>(1);
    fe_policy_options o{};
    o.steps = 10;
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(p == nullptr);
    CHECK(mentions("options->steps is a Diffusion Policy option and this is an ACT policy (expected 0, got 10)"));
    o = fe_policy_options{};
    o.scheduler = "ddim";
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("options->scheduler is a Diffusion Policy option"));
    o = fe_policy_options{};
    o.dtype = "f8";
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("unknown weight dtype 'f8'"));
    o = fe_policy_options{};
    o.quantize = "int8";
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("options->quantize is a Diffusion Policy option and this is an ACT policy (expected NULL or \"none\", got 'int8')"));
    o.quantize = "none";
    REQUIRE(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_OK);
    fe_policy_free(p);
    o = fe_policy_options{};
    o.batch = 4;
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("options->batch: an ACT policy serves one environment (expected 0 or 1, got 4)"));

    fe_act_selection sel{0, 0.0, 13};  // chunk_size is 12
    o = fe_policy_options{};
    o.act_selection = &sel;
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("n_action_steps' (expected <= chunk_size 12, got 13)"));
    sel = fe_act_selection{1, 0.01, 5};
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("1 with temporal_ensemble_coeff set"));
    sel = fe_act_selection{1, std::nan(""), 1};
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("temporal_ensemble_coeff"));
    sel = fe_act_selection{0, 0.0, 0};
    CHECK(fe_policy_load_ex(folder().c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("ActPolicyOptions::selection: unsupported 'n_action_steps' (expected >= 1, got 0)"));
    sel = fe_act_selection{0, 0.0, 2};
    const std::string dp = std::string(FLOWEDGE_FIXTURES_DIR) + "/dp_small";
    CHECK(fe_policy_load_ex(dp.c_str(), "cpu", &o, &p) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("options->act_selection applies to ACT policies only"));

    Loaded l;
    const Episode e;
    fe_frame frames[2];
    fe_observation c = e.at(0, frames);
    float a[5];
    REQUIRE(fe_policy_reset(l.p, nullptr) == FE_OK);
    std::vector<float> noise(12 * 5, 0.f);
    CHECK(fe_policy_select_action_noise(l.p, &c, noise.data(), noise.size(), a, 5) == FE_ERR_UNSUPPORTED);
    CHECK(mentions("an ACT policy draws no noise"));
    // Bad observations name the key, as for a Diffusion Policy.
    c.n_frames = 1;
    CHECK(fe_policy_select_action(l.p, &c, a, 5) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("no frame for camera 1 ('observation.images.wrist')"));
    c = e.at(0, frames);
    frames[0].height = 95;
    CHECK(fe_policy_select_action(l.p, &c, a, 5) == FE_ERR_SHAPE);
    CHECK(mentions("observation.images.top"));
    c = e.at(0, frames);
    c.env_state_len = 4;
    CHECK(fe_policy_select_action(l.p, &c, a, 5) == FE_ERR_INVALID_ARGUMENT);
    CHECK(mentions("obs->env_state ('observation.environment_state') is too small: needs 5 floats"));
    CHECK(fe_policy_chunks_generated(l.p) == 0);  // nothing above ran the network
    c = e.at(0, frames);
    CHECK(fe_policy_select_action(l.p, &c, a, 5) == FE_OK);
    CHECK(fe_policy_chunks_generated(l.p) == 1);

    const fe_realtime_options none{};
    CHECK(fe_policy_set_realtime(l.p, &none) == FE_OK);  // nothing asked, nothing done
}

TEST_CASE("fe_policy: an ACT folder follows the residency contract (\"cuda\" fails closed off the GPU, \"auto\" says why)") {
    Loaded l(nullptr, "auto");
    if (fe_policy_cuda_resident(l.p)) {
        CHECK(std::string(fe_policy_backend(l.p)) == "cuda");
        CHECK(std::string(fe_policy_fallback_reason(l.p)).empty());
        return;
    }
    CHECK(std::string(fe_policy_backend(l.p)) == "cpu");
    CHECK_FALSE(std::string(fe_policy_fallback_reason(l.p)).empty());
    fe_policy* p = reinterpret_cast<fe_policy*>(1);
    CHECK(fe_policy_load(folder().c_str(), "cuda", &p) == FE_ERR_DEVICE);
    CHECK(p == nullptr);
    CHECK(mentions(fe_built_with_cuda() ? "not resident on the GPU" : "no CUDA backend"));
    CHECK(mentions("pass device \"auto\""));
}
