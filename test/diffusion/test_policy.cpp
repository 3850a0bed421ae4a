// DiffusionPolicy<B> against LeRobot itself: the dp_image_* fixtures hold episodes run by pip LeRobot's own
// DiffusionPolicy + pre/post-processors (tools/make_reference_dp_image.py) on generated weights, which
// test/support/lerobot_fixture_folder.hpp rebuilds. Whole select_action episodes (3 chunks, caller noise per chunk) must
// match within 6e-4 in normalised action units, the per-camera encoder features within 1e-5 relative; bad input is
// rejected with errors naming the key and the expected shape; nothing is allocated after load.
#include <doctest/doctest.h>
#include "../support/counting_new.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../ops/ops_test_util.hpp"
#include "../support/lerobot_fixture_folder.hpp"
#include "../support/policy_episode.hpp"
#include "flowedge/io/npy.hpp"
#include "flowedge/models/diffusion/policy.hpp"
#include "../support/cpu_models_diffusion_policy.hpp"

using namespace flowedge;

namespace {

namespace fs = std::filesystem;

/// The rebuilt folder of fixture `name` (once per process).
fs::path fixture(const std::string& name) { return testsupport::rebuilt_fixture(name); }

/// One reference episode: the observations, per-chunk noise and LeRobot's actions.
struct Episode : testsupport::PolicyEpisode {
    std::vector<float> noise, actions;
};
using ObservationAt = testsupport::EpisodeObservation;
using testsupport::observation_at;

template <Backend B>
Episode read_episode(const DiffusionPolicy<B>& p, const std::string& name) {
    Episode e{testsupport::read_policy_episode(p, name), {}, {}};
    e.noise = io::read_npy_f32(testsupport::fixture_ref_dir(name) / "noise.npy").data;
    e.actions = io::read_npy_f32(testsupport::fixture_ref_dir(name) / "actions.npy").data;
    return e;
}

/// Runs the episode (reset, select_action per step with chunk k's noise) and returns the worst difference to LeRobot
/// in normalised action units ((got - want) / ((max - min) / 2) per dimension).
template <Backend B>
double episode_error(DiffusionPolicy<B>& p, const Episode& e, bool as_float) {
    const int A = p.action_dim();
    const std::size_t per_chunk = std::size_t(p.config().horizon) * A;
    const auto& mn = p.head().action_min();
    const auto& mx = p.head().action_max();
    p.reset();
    ObservationAt o;
    std::vector<float> a(std::size_t(A), 0.f);
    double worst = 0;
    for (int t = 0; t < e.T; ++t) {
        observation_at(p, e, t, as_float, o);
        const std::size_t k = std::min<std::size_t>(std::size_t(p.chunks_generated()), e.noise.size() / per_chunk - 1);
        p.select_action(o.obs, a, std::span<const float>(e.noise.data() + k * per_chunk, per_chunk));
        for (int i = 0; i < A; ++i) {
            const double half_range = (double(mx[std::size_t(i)]) - mn[std::size_t(i)]) / 2;
            worst = std::max(worst, std::fabs(double(a[std::size_t(i)]) - e.actions[std::size_t(t) * A + i]) / half_range);
        }
    }
    CHECK(p.chunks_generated() == (e.T + p.config().n_action_steps - 1) / p.config().n_action_steps);
    return worst;
}

constexpr double kEpisodeTol = 6e-4;  // issue 19 / docs/numerics.md: whole-episode bound, normalised units

}  // namespace

TEST_CASE_TEMPLATE("whole select_action episodes match LeRobot's DiffusionPolicy (GroupNorm, one camera, center crop)", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    auto p = DiffusionPolicy<B>::load(fixture("dp_image_gn"));
    REQUIRE(p.cameras().size() == 1);
    CHECK(p.steps() == 10);
    CHECK(p.scheduler() == Scheduler::Ddim);
    const Episode e = read_episode(p, "dp_image_gn");
    const double err = episode_error(p, e, false);
    MESSAGE("dp_image_gn uint8 frames: max |diff| vs LeRobot " << err << " (normalised)");
    CHECK(err <= kEpisodeTol);
    // The same frames as float CHW in [0, 1] give the same actions (LeRobot's env preprocessing divides by 255 first).
    const double err_f = episode_error(p, e, true);
    MESSAGE("dp_image_gn float frames: max |diff| vs LeRobot " << err_f);
    CHECK(err_f <= kEpisodeTol);
}

TEST_CASE_TEMPLATE("whole select_action episodes match LeRobot's DiffusionPolicy (BatchNorm, two cameras, resize, env state)", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    auto p = DiffusionPolicy<B>::load(fixture("dp_image_bn"));
    REQUIRE(p.cameras().size() == 2);
    CHECK(p.cameras()[0].key == "observation.images.top");
    CHECK(p.cameras()[1].key == "observation.images.wrist");
    CHECK(p.env_dim() == 5);
    const Episode e = read_episode(p, "dp_image_bn");
    const double err = episode_error(p, e, false);
    MESSAGE("dp_image_bn: max |diff| vs LeRobot " << err << " (normalised)");
    CHECK(err <= kEpisodeTol);
}

TEST_CASE_TEMPLATE("each camera's encoder features match LeRobot's rgb_encoder on the normalised first frame", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    for (const std::string name : {"dp_image_gn", "dp_image_bn"}) {
        CAPTURE(name);
        const io::LeRobotDiffusionPolicy folder = io::open_lerobot_diffusion_policy(fixture(name));
        for (std::size_t c = 0; c < folder.cameras.size(); ++c) {
            const io::PolicyCamera& cam = folder.cameras[c];
            CAPTURE(cam.key);
            DiffusionRgbEncoder<B> enc(rgb_encoder_config_from_lerobot(folder.config, cam.height, cam.width));
            enc.load(folder.head.weights, folder.separate_encoders ? "diffusion.rgb_encoder." + std::to_string(c) + "." : "diffusion.rgb_encoder.", {});
            enc.set_normalization(cam.norm.kind, cam.norm.offset.data(), cam.norm.denom.data());
            const fs::path ref = testsupport::fixture_ref_dir(name);
            const std::vector<std::uint8_t> frames = io::read_npy_u8(ref / (cam.key + ".npy")).data;
            const std::size_t frame_bytes = std::size_t(cam.height) * cam.width * 3;
            optest::Dev<std::uint8_t, B> dframe(std::vector<std::uint8_t>(frames.begin(), frames.begin() + std::ptrdiff_t(frame_bytes)));
            optest::Dev<float, B> dfeat(std::size_t(enc.feature_dim()));
            Workspace<B> ws(enc.workspace_bytes(1));
            Context<B> ctx{{}, &ws, MathMode::F32};
            enc.forward(ctx, dframe.ptr(), ImageLayout::U8Hwc, 1, View<float, B>{dfeat.ptr(), Shape{1, enc.feature_dim()}});
            const std::vector<float> got = dfeat.host(std::size_t(enc.feature_dim()));
            const std::vector<float> want = io::read_npy_f32(ref / ("features." + cam.key + ".npy")).data;
            REQUIRE(got.size() == want.size());
            double worst = 0, scale = 0;
            for (std::size_t i = 0; i < got.size(); ++i) {
                worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
                scale = std::max(scale, std::fabs(double(want[i])));
            }
            MESSAGE(name << " " << cam.key << ": max |diff| " << worst << " (max |feature| " << scale << ")");
            CHECK(worst <= 1e-5 * std::max(scale, 1.0));
        }
    }
}

TEST_CASE_TEMPLATE("select_action allocates nothing from the first tick after load and repeats the episode exactly after reset",
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    // load() warmed up every kind of tick (on CUDA: recorded each tick kind's graph), so even the first episode
    // allocates nothing.
    auto p = DiffusionPolicy<B>::load(fixture("dp_image_bn"));
    const Episode e = read_episode(p, "dp_image_bn");
    ObservationAt o;
    std::vector<float> a(std::size_t(p.action_dim())), first, second;
    first.reserve(std::size_t(e.T) * a.size());
    second.reserve(first.capacity());
    observation_at(p, e, 0, false, o);  // sizes o's buffers
    auto run = [&](std::vector<float>& out) {
        p.reset(7);
        for (int t = 0; t < e.T; ++t) {
            observation_at(p, e, t, false, o);
            p.select_action(o.obs, a);
            out.insert(out.end(), a.begin(), a.end());
        }
    };
    const auto before = fe_test::g_operator_new_calls.load();
    run(first);
    run(second);
    CHECK(fe_test::g_operator_new_calls.load() == before);
    CHECK(second == first);  // seeded noise: reset(seed) replays the same actions
}

TEST_CASE("bad observations are rejected with errors naming the key and the expected shape") {
    auto p = DiffusionPolicy<Cpu>::load(fixture("dp_image_bn"));
    const Episode e = read_episode(p, "dp_image_bn");
    ObservationAt o;
    observation_at(p, e, 0, false, o);
    std::vector<float> a(std::size_t(p.action_dim()));
    CHECK_THROWS_WITH_AS(p.select_action(o.obs, a), doctest::Contains("select_action() before reset()"), Error);
    p.reset();
    {
        std::vector<float> s(2, 0.f);
        PolicyObservation bad = o.obs;
        bad.state = s;
        CHECK_THROWS_WITH_AS(p.select_action(bad, a), doctest::Contains("'observation.state' has the wrong length (expected 3, got 2)"), Error);
    }
    {
        std::vector<float> s(o.obs.state.begin(), o.obs.state.end());
        s[1] = NAN;
        PolicyObservation bad = o.obs;
        bad.state = s;
        CHECK_THROWS_WITH_AS(p.select_action(bad, a), doctest::Contains("'observation.state' element 1 is not finite"), Error);
    }
    {
        PolicyObservation bad = o.obs;
        bad.images = std::span<const PolicyFrame>(o.frames.data(), 1);
        CHECK_THROWS_WITH_AS(p.select_action(bad, a), doctest::Contains("wrong number of camera frames (expected 2, got 1)"), Error);
    }
    {
        std::vector<PolicyFrame> f = o.frames;
        f[1].height = 35;
        PolicyObservation bad = o.obs;
        bad.images = f;
        CHECK_THROWS_WITH_AS(p.select_action(bad, a), doctest::Contains("'observation.images.wrist': frame has the wrong size (expected 36x44, got 35x44)"), Error);
    }
    {
        std::vector<float> img(3 * 36 * 44, 0.5f);
        img[17] = INFINITY;
        std::vector<PolicyFrame> f = o.frames;
        f[0] = {img.data(), ImageLayout::F32Chw, 36, 44};
        PolicyObservation bad = o.obs;
        bad.images = f;
        CHECK_THROWS_WITH_AS(p.select_action(bad, a), doctest::Contains("'observation.images.top': pixel value 17 is not finite"), Error);
    }
    {
        PolicyObservation bad = o.obs;
        bad.env_state = {};
        CHECK_THROWS_WITH_AS(p.select_action(bad, a), doctest::Contains("'observation.environment_state' has the wrong length (expected 5, got 0)"), Error);
    }
    {
        std::vector<float> noise(3, 0.f);
        CHECK_THROWS_WITH_AS(p.select_action(o.obs, a, noise), doctest::Contains("noise has the wrong size"), Error);
    }
    // A rejected call leaves the policy usable.
    p.select_action(o.obs, a);
    CHECK(std::isfinite(a[0]));
}

TEST_CASE("a folder whose encoder weights are missing or mis-shaped fails to load, naming the key and the shape") {
    const fs::path good = fixture("dp_image_gn");
    const fs::path bad = fs::path(FLOWEDGE_BINARY_DIR) / "test_fixtures" / "dp_image_gn_broken";
    fs::create_directories(bad);
    for (const auto& e : fs::directory_iterator(good)) fs::copy_file(e.path(), bad / e.path().filename(), fs::copy_options::overwrite_existing);
    const auto src = io::SafeTensors::open(good / "model.safetensors");
    auto rewrite = [&](const std::string& drop, const std::string& reshape) {
        io::SafeTensorsWriter w;
        for (const io::TensorInfo& t : src->tensors()) {
            if (t.name == drop) continue;
            std::vector<std::int64_t> dims = t.dims;
            std::span<const std::byte> data(t.raw, t.bytes);
            if (t.name == reshape) {  // drop the last output channel
                const std::size_t per = t.bytes / std::size_t(dims[0]);
                dims[0] -= 1;
                data = data.first(t.bytes - per);
            }
            w.add_raw(t.name, t.dtype_name, dims, data);
        }
        w.write(bad / "model.safetensors");
    };
    rewrite("diffusion.rgb_encoder.backbone.4.0.conv1.weight", "");
    CHECK_THROWS_WITH_AS(DiffusionPolicy<Cpu>::load(bad), doctest::Contains("diffusion.rgb_encoder.backbone.4.0.conv1.weight"), Error);
    rewrite("", "diffusion.rgb_encoder.pool.nets.weight");
    CHECK_THROWS_WITH_AS(DiffusionPolicy<Cpu>::load(bad), doctest::Contains("diffusion.rgb_encoder.pool.nets.weight"), Error);
    CHECK_THROWS_WITH_AS(DiffusionPolicy<Cpu>::load(bad), doctest::Contains("[32, 512, 1, 1]"), Error);
}
