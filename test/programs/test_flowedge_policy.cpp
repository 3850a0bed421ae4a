// flowedge-policy end to end. On test/fixtures/dp_small (state + environment state, no camera): an episode written
// as OBS.npz goes through the program; the chunk generated at step n_action_steps matches LeRobot's own
// observation path (dp_small_ref/obs_*, docs/numerics.md#whole-head-tolerances), the defaults (checkpoint
// scheduler and steps, seeded noise) give exactly what DiffusionPolicy<Cpu> gives in process, and every bad input
// is an error naming the key and the expected shape. LeRobot's own image episode on dp_image_gn (one camera,
// GroupNorm, crop) goes through the program from its recorded arrays and chunk noise within the whole-episode bound.
// On dp_image_bn's two cameras (BatchNorm, resize, environment state), uint8 HWC and float CHW frames give exactly the
// in-process actions. ACT folders (act_cam2: two cameras, state, environment state) give LeRobot's
// own episodes with the checkpoint's temporal ensembling and with --n-action-steps; the Diffusion Policy flags and
// --device cuda are errors that say why. pusht_policy (the copyable example) runs on dp_small and dp_image_bn.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "flowedge/io/npy.hpp"
#include "flowedge/io/npz.hpp"
#include "flowedge/models/act/lerobot_act_folder.hpp"
#include "flowedge/models/diffusion/policy.hpp"
#include "../support/cpu_models_diffusion_policy.hpp"
#include "../support/cpu_models_act.hpp"
#include "../support/lerobot_fixture_folder.hpp"
#include "../support/test_paths.hpp"

using namespace flowedge;
namespace fs = std::filesystem;

namespace {

const fs::path kFolder = fs::path(FLOWEDGE_FIXTURES_DIR) / "dp_small";
const fs::path kRef = fs::path(FLOWEDGE_FIXTURES_DIR) / "dp_small_ref";
constexpr int kState = 2, kEnv = 4, kHorizon = 16, kActions = 2, kActionSteps = 8;
constexpr double kDdimBound = 6e-4;  // whole-head bound, normalised units (docs/numerics.md#whole-head-tolerances)

fs::path tmp(const std::string& name) { return fe_test::scratch_dir("test_programs_tmp/flowedge_policy") / name; }

/// The committed LeRobot fixture `name` (test/fixtures/<name>) with its generated model.safetensors rebuilt.
fs::path lerobot_folder(const std::string& name) {
    return testsupport::rebuild_lerobot_fixture(fs::path(FLOWEDGE_FIXTURES_DIR) / name, tmp(name));
}

struct RunResult {
    int rc = -1;
    std::string output;  // stdout and stderr
};

RunResult run(const std::string& exe, const std::string& args) {
    const fs::path log = tmp("run.log");
    const std::string cmd = "\"" + exe + "\" " + args + " > \"" + log.string() + "\" 2>&1";
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(log);
    r.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return r;
}

RunResult policy_run(const std::string& args) { return run(FLOWEDGE_POLICY_EXE, "\"" + kFolder.string() + "\" " + args); }

bool has(const RunResult& r, const std::string& text) {
    if (r.output.find(text) != std::string::npos) return true;
    MESSAGE("output lacks '" << text << "':\n" << r.output);
    return false;
}

/// An episode of T steps: raw PushT-range states and environment states, step `at` and `at + 1` replaced when given.
struct Episode {
    int steps = 0;
    std::vector<float> state, env;
};

Episode episode(int steps) {
    Episode e{steps, std::vector<float>(std::size_t(steps) * kState), std::vector<float>(std::size_t(steps) * kEnv)};
    for (int t = 0; t < steps; ++t) {
        for (int i = 0; i < kState; ++i) e.state[std::size_t(t * kState + i)] = 100.f + 17.f * float(t) + 40.f * float(i);
        for (int i = 0; i < kEnv; ++i) e.env[std::size_t(t * kEnv + i)] = std::sin(0.3f * float(t) + float(i));
    }
    return e;
}

void write_obs(const fs::path& p, const Episode& e) {
    io::NpzWriter w;
    w.add_f32("observation.state", std::vector<std::int64_t>{e.steps, kState}, e.state);
    w.add_f32("observation.environment_state", std::vector<std::int64_t>{e.steps, kEnv}, e.env);
    w.write(p);
}

std::vector<float> ref(const std::string& name) { return io::read_npy_f32(kRef / (name + ".npy")).data; }

}  // namespace

TEST_CASE("the chunk generated at step n_action_steps matches LeRobot's observation path (DDIM 10, --noise)") {
    // LeRobot built obs_ddim10_executed_* from the two observations obs_state/obs_env[b] (oldest first) and noise[b].
    // In an episode the queue holds steps 7 and 8 when the second chunk is generated at step 8.
    const std::vector<float> st = ref("obs_state"), en = ref("obs_env"), nz = ref("noise"), want = ref("obs_ddim10_executed_action");
    const std::vector<float> mn = {12.f, 25.f}, mx = {511.f, 497.f};  // dp_small_ref/refs.json action_min / action_max
    for (int b = 0; b < 2; ++b) {
        CAPTURE(b);
        Episode e = episode(16);
        for (int k = 0; k < 2; ++k) {
            for (int i = 0; i < kState; ++i) e.state[std::size_t((7 + k) * kState + i)] = st[std::size_t((b * 2 + k) * kState + i)];
            for (int i = 0; i < kEnv; ++i) e.env[std::size_t((7 + k) * kEnv + i)] = en[std::size_t((b * 2 + k) * kEnv + i)];
        }
        std::vector<float> noise(2 * kHorizon * kActions);
        for (std::size_t i = 0; i < noise.size() / 2; ++i) {
            noise[i] = std::sin(0.37f * float(i + 1));                              // chunk 0: any noise
            noise[noise.size() / 2 + i] = nz[std::size_t(b) * kHorizon * kActions + i];  // chunk 1: LeRobot's
        }
        write_obs(tmp("parity.npz"), e);
        io::write_npy_f32(tmp("parity_noise.npy"), std::vector<std::int64_t>{2, kHorizon, kActions}, noise);
        const RunResult r = policy_run("--obs " + tmp("parity.npz").string() + " --out " + tmp("parity_actions.npy").string() +
                                       " --noise " + tmp("parity_noise.npy").string() + " --scheduler DDIM --steps 10");
        REQUIRE_MESSAGE(r.rc == 0, r.output);
        CHECK(has(r, "ddim 10 steps, T=16 observations"));
        CHECK(has(r, "chunks generated: 2 (--noise noise)"));
        CHECK(has(r, "select_action latency: p50="));
        const io::NpyArrayF32 got = io::read_npy_f32(tmp("parity_actions.npy"));
        REQUIRE(got.shape == std::vector<std::int64_t>{16, kActions});
        double err = 0;
        for (int t = 0; t < kActionSteps; ++t)
            for (int a = 0; a < kActions; ++a) {
                const double half = (double(mx[std::size_t(a)]) - double(mn[std::size_t(a)])) / 2.0;
                const double d = got.data[std::size_t((8 + t) * kActions + a)] - want[std::size_t((b * kActionSteps + t) * kActions + a)];
                err = std::max(err, std::fabs(d) / half);
            }
        MESSAGE("batch element " << b << ": steps 8..15 vs LeRobot, max abs " << err << " (normalised units)");
        CHECK(err < kDdimBound);
    }
}

TEST_CASE("defaults (checkpoint scheduler and steps, seeded noise) give what DiffusionPolicy<Cpu> gives in process") {
    const Episode e = episode(20);  // 3 chunks: steps 0, 8, 16
    write_obs(tmp("defaults.npz"), e);
    const RunResult r = policy_run("--obs " + tmp("defaults.npz").string() + " --out " + tmp("defaults_actions.npy").string() + " --seed 5");
    REQUIRE_MESSAGE(r.rc == 0, r.output);
    // dp_small's config: noise_scheduler_type DDPM, num_inference_steps null -> num_train_timesteps (100).
    CHECK(has(r, "flowedge-policy: cpu, weights F32, ddpm 100 steps, T=20 observations"));
    CHECK(has(r, "chunks generated: 3 (seeded noise)"));
    const io::NpyArrayF32 got = io::read_npy_f32(tmp("defaults_actions.npy"));
    REQUIRE(got.shape == std::vector<std::int64_t>{20, kActions});

    auto policy = DiffusionPolicy<Cpu>::load(kFolder, PolicyOptions{.seed = 5});
    policy.reset();
    std::vector<float> want(got.data.size());
    for (int t = 0; t < e.steps; ++t) {
        const PolicyObservation obs{std::span<const float>(e.state).subspan(std::size_t(t) * kState, kState),
                                    std::span<const float>(e.env).subspan(std::size_t(t) * kEnv, kEnv),
                                    {}};
        policy.select_action(obs, std::span<float>(want).subspan(std::size_t(t) * kActions, kActions));
    }
    CHECK(policy.chunks_generated() == 3);
    CHECK(got.data == want);
    // Another seed gives other actions (the flag reaches the policy).
    const RunResult r2 = policy_run("--obs " + tmp("defaults.npz").string() + " --out " + tmp("defaults_actions6.npy").string() + " --seed 6");
    REQUIRE_MESSAGE(r2.rc == 0, r2.output);
    CHECK(io::read_npy_f32(tmp("defaults_actions6.npy")).data != got.data);
}

TEST_CASE("bad inputs are errors naming the key and the expected shape") {
    const Episode e = episode(16);
    const std::string out = " --out " + tmp("bad_actions.npy").string();
    auto obs_with = [&](const std::string& name, auto&& add) {
        io::NpzWriter w;
        add(w);
        w.write(tmp(name));
        return "--obs " + tmp(name).string() + out;
    };
    SUBCASE("missing environment state") {
        const RunResult r = policy_run(obs_with("no_env.npz", [&](io::NpzWriter& w) {
            w.add_f32("observation.state", std::vector<std::int64_t>{16, kState}, e.state);
        }));
        CHECK(r.rc == 1);
        CHECK(has(r, "missing array 'observation.environment_state' (expected float32 [T, 4]; the file has 'observation.state')"));
    }
    SUBCASE("state of the wrong width, dtype, or step count") {
        const std::vector<float> wide(16 * 3, 1.f);
        RunResult r = policy_run(obs_with("wide.npz", [&](io::NpzWriter& w) {
            w.add_f32("observation.state", std::vector<std::int64_t>{16, 3}, wide);
            w.add_f32("observation.environment_state", std::vector<std::int64_t>{16, kEnv}, e.env);
        }));
        CHECK(r.rc == 1);
        CHECK(has(r, "'observation.state' has the wrong shape (expected float32 [T, 2], got [16, 3])"));
        const std::vector<std::int32_t> ints(16 * kState, 3);
        r = policy_run(obs_with("ints.npz", [&](io::NpzWriter& w) {
            w.add_i32("observation.state", std::vector<std::int64_t>{16, kState}, ints);
            w.add_f32("observation.environment_state", std::vector<std::int64_t>{16, kEnv}, e.env);
        }));
        CHECK(r.rc == 1);
        CHECK(has(r, "'observation.state' has the wrong dtype (expected float32 [T, 2], got int32 [16, 2])"));
        r = policy_run(obs_with("short_env.npz", [&](io::NpzWriter& w) {
            w.add_f32("observation.state", std::vector<std::int64_t>{16, kState}, e.state);
            w.add_f32("observation.environment_state", std::vector<std::int64_t>{15, kEnv},
                      std::span<const float>(e.env).first(15 * kEnv));
        }));
        CHECK(r.rc == 1);
        CHECK(has(r, "'observation.environment_state' has 15 steps but 'observation.state' has 16 (expected T = 16, got 15)"));
    }
    SUBCASE("noise for too few chunks, or of the wrong shape") {
        write_obs(tmp("ok.npz"), e);
        const std::vector<float> one(kHorizon * kActions, 0.5f);
        io::write_npy_f32(tmp("one_chunk.npy"), std::vector<std::int64_t>{1, kHorizon, kActions}, one);
        RunResult r = policy_run("--obs " + tmp("ok.npz").string() + out + " --noise " + tmp("one_chunk.npy").string());
        CHECK(r.rc == 1);
        CHECK(has(r, "holds noise for 1 chunks but the episode of 16 steps generates 2 (one every n_action_steps = 8 steps) "
                     "(expected K >= 2, got 1)"));
        io::write_npy_f32(tmp("flat.npy"), std::vector<std::int64_t>{2, kHorizon / 2, kActions}, one);
        r = policy_run("--obs " + tmp("ok.npz").string() + out + " --noise " + tmp("flat.npy").string());
        CHECK(r.rc == 1);
        CHECK(has(r, "has the wrong shape (expected [K, 16, 2], got [2, 8, 2])"));
    }
    SUBCASE("non-finite state names the step; unused arrays are reported") {
        Episode bad = e;
        bad.state[std::size_t(3 * kState + 1)] = std::numeric_limits<float>::quiet_NaN();
        RunResult r = policy_run(obs_with("nan.npz", [&](io::NpzWriter& w) {
            w.add_f32("observation.state", std::vector<std::int64_t>{16, kState}, bad.state);
            w.add_f32("observation.environment_state", std::vector<std::int64_t>{16, kEnv}, bad.env);
            w.add_f32("observation.images.top", std::vector<std::int64_t>{1}, std::vector<float>{0.f});
        }));
        CHECK(r.rc == 1);
        CHECK(has(r, "note: "));
        CHECK(has(r, "array 'observation.images.top' is not an input of this policy (ignored)"));
        CHECK(has(r, "at step 3 of 16"));
        CHECK(has(r, "'observation.state' element 1 is not finite"));
    }
    SUBCASE("an empty episode, a .npy given as --obs, a missing file") {
        RunResult r = policy_run(obs_with("empty.npz", [&](io::NpzWriter& w) {
            w.add_f32("observation.state", std::vector<std::int64_t>{0, kState}, std::vector<float>{});
            w.add_f32("observation.environment_state", std::vector<std::int64_t>{0, kEnv}, std::vector<float>{});
        }));
        CHECK(r.rc == 1);
        CHECK(has(r, "the episode has no steps (expected T >= 1, got 0)"));
        r = policy_run("--obs " + (kRef / "obs_state.npy").string() + out);
        CHECK(r.rc == 1);
        CHECK(has(r, "this is a .npy file, not a .npz archive"));
        r = policy_run("--obs " + tmp("nowhere.npz").string() + out);
        CHECK(r.rc == 1);
        CHECK(has(r, "nowhere.npz: no such file"));
        r = run(FLOWEDGE_POLICY_EXE, "\"" + tmp("no_such_folder").string() + "\" --obs " + tmp("ok.npz").string() + out);
        CHECK(r.rc == 1);
        CHECK(has(r, "flowedge: flowedge-policy: " + tmp("no_such_folder").string() + ": no such folder"));
    }
}

TEST_CASE("LeRobot's image episode through the program (checkpoint scheduler and steps, recorded chunk noise)") {
    // The reference folder holds the episode as flowedge-policy reads it: one .npy per feature key, noise.npy
    // [chunks, horizon, action_dim], actions.npy [T, action_dim] from LeRobot's select_action (tools/make_reference_dp_image.py).
    // dp_image_bn's two-camera episode (uint8 top, float CHW wrist) is not run here: the next case gives the program
    // those frames and checks its actions bit for bit against DiffusionPolicy<Cpu>, whose LeRobot parity on that folder
    // test/diffusion checks (~13 s of the sanitized suite).
    const std::string name = "dp_image_gn";
    const fs::path folder = lerobot_folder(name);
    const fs::path ref = fs::path(FLOWEDGE_FIXTURES_DIR) / (name + "_ref");
    auto policy = DiffusionPolicy<Cpu>::load(folder);
    io::NpzWriter w;
    for (const auto& cam : policy.cameras()) {
        const io::NpyArrayU8 f = io::read_npy_u8(ref / (cam.key + ".npy"));
        w.add_u8(cam.key, f.shape, f.data);
    }
    for (const std::string& key : {policy.state_key(), policy.env_key()})
        if (!key.empty()) {
            const io::NpyArrayF32 a = io::read_npy_f32(ref / (key + ".npy"));
            w.add_f32(key, a.shape, a.data);
        }
    w.write(tmp(name + "_obs.npz"));
    const RunResult r = run(FLOWEDGE_POLICY_EXE, "\"" + folder.string() + "\" --obs " + tmp(name + "_obs.npz").string() + " --out " +
                                                     tmp(name + "_actions.npy").string() + " --noise " + (ref / "noise.npy").string());
    REQUIRE_MESSAGE(r.rc == 0, r.output);
    CHECK(has(r, "ddim 10 steps, T=20 observations"));  // the checkpoints' noise_scheduler_type / num_inference_steps
    CHECK(has(r, "chunks generated: 3 (--noise noise)"));
    const io::NpyArrayF32 got = io::read_npy_f32(tmp(name + "_actions.npy"));
    const io::NpyArrayF32 want = io::read_npy_f32(ref / "actions.npy");
    REQUIRE(got.shape == want.shape);
    const auto& mn = policy.head().action_min();
    const auto& mx = policy.head().action_max();
    const std::size_t A = std::size_t(policy.action_dim());
    double worst = 0;
    for (std::size_t i = 0; i < got.data.size(); ++i)
        worst = std::max(worst, std::fabs(double(got.data[i]) - want.data[i]) / ((double(mx[i % A]) - mn[i % A]) / 2));
    MESSAGE(name << ": flowedge-policy vs LeRobot select_action episode, max abs " << worst << " (normalised units)");
    CHECK(worst < 6e-4);  // issue 19 / docs/numerics.md whole-episode bound
}

TEST_CASE("two cameras: uint8 HWC and float CHW frames give exactly the in-process actions") {
    // dp_image_bn's two cameras (observation.images.top / .wrist, [3, 36, 44]) over the first T steps of its recorded
    // episode: the top camera as uint8 HWC, the wrist camera as float CHW in [0, 1], as a LeRobot dataset holds frames.
    constexpr int kImageH = 36, kImageW = 44;
    const fs::path folder = lerobot_folder("dp_image_bn");
    const fs::path ref = fs::path(FLOWEDGE_FIXTURES_DIR) / "dp_image_bn_ref";
    const int T = 10;  // chunks at steps 0 and 8
    const std::size_t pixels = std::size_t(3) * kImageH * kImageW;
    auto frames_of = [&](const std::string& key) {
        io::NpyArrayU8 a = io::read_npy_u8(ref / (key + ".npy"));
        REQUIRE(a.shape == std::vector<std::int64_t>{20, kImageH, kImageW, 3});
        a.data.resize(std::size_t(T) * pixels);
        return a.data;
    };
    auto rows_of = [&](const std::string& key) {
        io::NpyArrayF32 a = io::read_npy_f32(ref / (key + ".npy"));
        REQUIRE(a.shape.size() == 2);
        a.shape[0] = T;
        a.data.resize(std::size_t(T * a.shape[1]));
        return a;
    };
    const std::vector<std::uint8_t> top = frames_of("observation.images.top"), wrist = frames_of("observation.images.wrist");
    const io::NpyArrayF32 state = rows_of("observation.state"), env = rows_of("observation.environment_state");
    std::vector<float> wrist_chw(wrist.size());
    for (int t = 0; t < T; ++t)
        for (int y = 0; y < kImageH; ++y)
            for (int x = 0; x < kImageW; ++x)
                for (int c = 0; c < 3; ++c)
                    wrist_chw[std::size_t(t) * pixels + (std::size_t(c) * kImageH + y) * kImageW + x] =
                        float(wrist[std::size_t(t) * pixels + (std::size_t(y) * kImageW + x) * 3 + c]) / 255.f;
    const std::vector<std::int64_t> hwc = {T, kImageH, kImageW, 3}, chw = {T, 3, kImageH, kImageW};
    auto write = [&](const std::string& name, auto&& cameras) {
        io::NpzWriter w;
        cameras(w);
        w.add_f32("observation.state", state.shape, state.data);
        w.add_f32("observation.environment_state", env.shape, env.data);
        w.write(tmp(name));
        return "\"" + folder.string() + "\" --obs " + tmp(name).string() + " --out " + tmp("cam_actions.npy").string();
    };
    const std::string args = write("cams.npz", [&](io::NpzWriter& w) {
        w.add_u8("observation.images.top", hwc, top);
        w.add_f32("observation.images.wrist", chw, wrist_chw);
    });
    const RunResult r = run(FLOWEDGE_POLICY_EXE, args + " --scheduler ddim --steps 10 --seed 3");
    REQUIRE_MESSAGE(r.rc == 0, r.output);
    CHECK(has(r, "ddim 10 steps, T=10 observations"));
    CHECK(has(r, "chunks generated: 2 (seeded noise)"));
    const io::NpyArrayF32 got = io::read_npy_f32(tmp("cam_actions.npy"));

    auto policy = DiffusionPolicy<Cpu>::load(folder, PolicyOptions{.steps = 10, .scheduler = Scheduler::Ddim, .seed = 3});
    const std::size_t A = std::size_t(policy.action_dim()), S = std::size_t(state.shape[1]), E = std::size_t(env.shape[1]);
    REQUIRE(got.shape == std::vector<std::int64_t>{T, std::int64_t(A)});
    REQUIRE(policy.cameras().size() == 2);
    CHECK(policy.cameras()[0].key == "observation.images.top");
    policy.reset();
    std::vector<float> want(got.data.size());
    for (int t = 0; t < T; ++t) {
        const PolicyFrame frames[2] = {{top.data() + std::size_t(t) * pixels, ImageLayout::U8Hwc, kImageH, kImageW},
                                       {wrist_chw.data() + std::size_t(t) * pixels, ImageLayout::F32Chw, kImageH, kImageW}};
        const PolicyObservation obs{std::span<const float>(state.data).subspan(std::size_t(t) * S, S),
                                    std::span<const float>(env.data).subspan(std::size_t(t) * E, E), frames};
        policy.select_action(obs, std::span<float>(want).subspan(std::size_t(t) * A, A));
    }
    CHECK(got.data == want);

    // A frame of the wrong size, a camera missing, frames of another dtype: named with the expected shapes.
    const std::string expected = "(expected uint8 [T, 36, 44, 3] or float32 [T, 3, 36, 44] in [0, 1]";
    RunResult bad = run(FLOWEDGE_POLICY_EXE, write("narrow.npz", [&](io::NpzWriter& w) {
        w.add_u8("observation.images.top", std::vector<std::int64_t>{T, kImageH, kImageW - 1, 3},
                 std::span<const std::uint8_t>(top).first(std::size_t(T) * kImageH * (kImageW - 1) * 3));
        w.add_f32("observation.images.wrist", chw, wrist_chw);
    }));
    CHECK(bad.rc == 1);
    CHECK(has(bad, "'observation.images.top' has the wrong shape " + expected + ", got [10, 36, 43, 3])"));
    bad = run(FLOWEDGE_POLICY_EXE, write("one_cam.npz", [&](io::NpzWriter& w) { w.add_u8("observation.images.top", hwc, top); }));
    CHECK(bad.rc == 1);
    CHECK(has(bad, "missing array 'observation.images.wrist' " + expected));
    const std::vector<std::int32_t> ints(top.begin(), top.end());
    bad = run(FLOWEDGE_POLICY_EXE, write("int_cam.npz", [&](io::NpzWriter& w) {
        w.add_i32("observation.images.top", hwc, ints);
        w.add_f32("observation.images.wrist", chw, wrist_chw);
    }));
    CHECK(bad.rc == 1);
    CHECK(has(bad, "'observation.images.top' has the wrong dtype " + expected + ", got int32 [10, 36, 44, 3])"));
    // The copyable example drives the cameras too.
    const RunResult ex = run(PUSHT_POLICY_EXE, "\"" + folder.string() + "\" 3");
    REQUIRE_MESSAGE(ex.rc == 0, ex.output);
    CHECK(has(ex, "camera 'observation.images.wrist': 36x44"));
    CHECK(has(ex, "tick   2  action"));
}

TEST_CASE("ACT folders: LeRobot's episodes through the program; Diffusion Policy flags are errors, --device cuda without the backend too") {
    // act_cam2's recorded episode (uint8 [T, 96, 96, 3] frames of two cameras, state [T, 6], environment state
    // [T, 5]) as OBS.npz; actions within 1e-4 of LeRobot's in normalised units, as test/act bounds ActPolicy<Cpu>.
    const fs::path folder = lerobot_folder("act_cam2");
    const fs::path ref = fs::path(FLOWEDGE_FIXTURES_DIR) / "act_cam2_ref";
    const fs::path obs = tmp("act_obs.npz"), out = tmp("act_actions.npy");
    {
        io::NpzWriter w;
        for (const char* cam : {"observation.images.top", "observation.images.wrist"}) {
            const io::NpyArrayU8 a = io::read_npy_u8(ref / (std::string(cam) + ".npy"));
            w.add_u8(cam, a.shape, a.data);
        }
        for (const char* key : {"observation.state", "observation.environment_state"}) {
            const io::NpyArrayF32 a = io::read_npy_f32(ref / (std::string(key) + ".npy"));
            w.add_f32(key, a.shape, a.data);
        }
        w.write(obs);
    }
    const std::vector<float> std_dev = io::open_lerobot_act_folder(folder).action.hi;
    auto error_vs = [&](const std::string& ref_name) {
        const io::NpyArrayF32 got = io::read_npy_f32(out), want = io::read_npy_f32(ref / ref_name);
        REQUIRE(got.shape == want.shape);
        double worst = 0;
        for (std::size_t i = 0; i < got.data.size(); ++i)
            worst = std::max(worst, std::fabs(double(got.data[i]) - double(want.data[i])) / double(std_dev[i % std_dev.size()]));
        return worst;
    };
    const std::string args = "--obs \"" + obs.string() + "\" --out \"" + out.string() + "\"";
    const std::string dir = "\"" + folder.string() + "\" ";
    RunResult r = run(FLOWEDGE_POLICY_EXE, dir + args + " --seed 3");
    REQUIRE(r.rc == 0);
    CHECK(has(r, "ACT chunk 12, temporal ensembling 0.01, T=12 observations"));
    CHECK(has(r, "chunks generated: 12"));  // T = 12: a chunk every step
    CHECK(has(r, "note: --seed is ignored (an ACT policy draws no noise)"));
    const double ens_err = error_vs("actions.npy");
    r = run(FLOWEDGE_POLICY_EXE, dir + args + " --n-action-steps 5");
    REQUIRE(r.rc == 0);
    CHECK(has(r, "n_action_steps 5"));
    CHECK(has(r, "chunks generated: 3"));
    const double queue_err = error_vs("actions_alt.npy");
    MESSAGE("act_cam2 through flowedge-policy: ensembling ", ens_err, ", queue of 5 ", queue_err, " (normalised units)");
    CHECK(ens_err <= 1e-4);
    CHECK(queue_err <= 1e-4);

    r = run(FLOWEDGE_POLICY_EXE, dir + args + " --steps 10 --scheduler ddim");
    CHECK(r.rc == 1);
    CHECK(has(r, "--steps, --scheduler: Diffusion Policy option(s), but"));
    CHECK(has(r, "holds an ACT policy (expected them unset)"));
    r = run(FLOWEDGE_POLICY_EXE, dir + args + " --noise \"" + out.string() + "\"");
    CHECK(r.rc == 1);
    CHECK(has(r, "--noise: Diffusion Policy option(s)"));
    r = run(FLOWEDGE_POLICY_EXE, dir + args + " --temporal-ensemble-coeff 0.01 --n-action-steps 5");
    CHECK(r.rc == 1);
    CHECK(has(r, "1 with temporal_ensemble_coeff set"));
#ifndef FLOWEDGE_WITH_CUDA
    r = run(FLOWEDGE_POLICY_EXE, dir + args + " --device cuda");
    CHECK(r.rc == 2);
    CHECK(has(r, "this build has no CUDA backend"));
#endif
    r = policy_run("--obs \"" + obs.string() + "\" --out \"" + out.string() + "\" --n-action-steps 2");
    CHECK(r.rc == 1);
    CHECK(has(r, "--n-action-steps: ACT option(s), but"));
    CHECK(has(r, "holds a Diffusion Policy"));
}

TEST_CASE("pusht_policy (the copyable example) runs its loop on a policy folder") {
    const RunResult r = run(PUSHT_POLICY_EXE, "\"" + kFolder.string() + "\" 10");
    REQUIRE_MESSAGE(r.rc == 0, r.output);
    CHECK(has(r, "tick   0  action"));
    CHECK(has(r, "tick   9  action"));
    CHECK(run(PUSHT_POLICY_EXE, "").rc == 2);
    CHECK(has(run(PUSHT_POLICY_EXE, "\"" + tmp("no_such_folder").string() + "\""), ": no such folder"));
}
