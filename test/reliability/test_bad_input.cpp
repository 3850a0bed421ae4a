// Bad input at run time: non-finite / out-of-range / wrongly sized inputs, unknown names, moved-from models and
// weights that overflow must each give a clear flowedge::Error (never a crash); also times the finiteness checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/mamba_flow/policy.hpp"
#include "../support/cpu_models_diffusion_head.hpp"
#include "../support/cpu_models_mamba_flow.hpp"
#include "reliability_util.hpp"

using namespace flowedge;
using reliability::expect_error;

namespace {
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
}  // namespace

TEST_CASE("DiffusionHead: bad inputs are Errors") {
    auto h = DiffusionHead<Cpu>::load(reliability::dp_small(), {}, /*max_batch=*/2);
    const auto& c = h.config();
    const std::size_t nc = std::size_t(c.global_cond_dim), nx = std::size_t(c.horizon) * c.action_dim;
    std::vector<float> cond(nc, 0.1f), noise(nx, 0.2f), out(nx), cond2(2 * nc, 0.1f), noise2(2 * nx, 0.2f), out2(2 * nx);
    SampleOptions o;
    o.steps = 2;

    auto with = [](std::vector<float> v, std::size_t i, float x) { v[i] = x; return v; };
    expect_error([&] { h.sample(with(cond, 0, kNaN), noise, out, o); }, "non-finite condition value at index 0", "NaN in condition");
    expect_error([&] { h.sample(with(cond, nc - 1, kInf), noise, out, o); }, "non-finite condition", "Inf in condition");
    expect_error([&] { h.sample(cond, with(noise, 3, kNaN), out, o); }, "non-finite noise value at index 3", "NaN in noise");
    expect_error([&] { h.sample(cond, with(noise, 0, -kInf), out, o); }, "non-finite noise", "-Inf in noise");
    expect_error([&] { h.sample(std::span(cond).first(nc - 1), noise, out, o); }, "condition has the wrong size", "short condition");
    expect_error([&] { h.sample(cond2, noise, out, o); }, "condition has the wrong size", "long condition");
    expect_error([&] { h.sample(cond, std::span(noise).first(nx - 1), out, o); }, "noise has the wrong size", "short noise");
    expect_error([&] { h.sample(cond, noise, std::span(out).first(1), o); }, "output has the wrong size", "short output");
    expect_error([&] { h.sample(cond, noise, out, o, 0); }, "batch out of range", "batch 0");
    expect_error([&] { h.sample(cond, noise, out, o, -1); }, "batch out of range", "batch -1");
    expect_error([&] { h.sample(cond2, noise2, out2, o, 3); }, "batch out of range", "batch > max_batch");
    for (int steps : {0, -1, c.num_train_timesteps + 1, 1 << 30}) {
        SampleOptions bad = o;
        bad.steps = steps;
        expect_error([&] { h.sample(cond, noise, out, bad); }, "steps out of range", "steps 0 / negative / huge");
    }
    SampleOptions bad_sched = o;
    bad_sched.scheduler = Scheduler(7);
    expect_error([&] { h.sample(cond, noise, out, bad_sched); }, "unknown scheduler", "scheduler enum out of range");
    expect_error([] { (void)parse_scheduler("euler_ancestral"); }, "unknown scheduler 'euler_ancestral'", "unknown scheduler name");
    expect_error([] { (void)parse_scheduler(""); }, "unknown scheduler", "empty scheduler name");
    expect_error([&] { h.denoise(cond, noise, -1, out, 1); }, "timestep out of range", "timestep -1");
    expect_error([&] { h.denoise(cond, noise, c.num_train_timesteps, out, 1); }, "timestep out of range", "timestep T");
    expect_error([&] { h.denoise(cond, with(noise, 1, kNaN), 5, out, 1); }, "non-finite sample", "NaN sample in denoise");
    std::vector<float> exec(std::size_t(c.n_action_steps) * c.action_dim);
    expect_error([&] { h.executed_actions(std::span(out).first(nx - 2), exec); }, "horizon has the wrong size", "executed_actions short horizon");
    expect_error([&] { h.executed_actions(out, std::span(exec).first(1)); }, "executed actions have the wrong size", "executed_actions short out");
    expect_error([&] { h.executed_actions(out, exec, 0); }, "horizon has the wrong size", "executed_actions batch 0");
    const std::vector<float> mn(std::size_t(c.action_dim), 1.f), mx(std::size_t(c.action_dim), 0.f);
    expect_error([&] { h.set_action_range(mn, mx); }, "action min must be below max", "action min > max");
    expect_error([&] { h.set_action_range(with(mx, 0, kNaN), mn); }, "action min must be below max", "NaN action min");
    expect_error([&] { h.set_action_range(std::span(mn).first(1), mx); }, "action range has the wrong size", "short action range");
    expect_error([&] { (void)h.unnormalize(0.f, c.action_dim); }, "action dimension out of range", "unnormalize dim A");
    expect_error([&] { (void)h.unnormalize(0.f, -1); }, "action dimension out of range", "unnormalize dim -1");
    expect_error([] { (void)DiffusionHead<Cpu>::load(reliability::dp_small(), {}, 0); }, "max_batch must be positive", "max_batch 0");

    // After all of that the head still works and is deterministic.
    std::vector<float> a(nx), b(nx);
    h.sample(cond, noise, a, o);
    h.sample(cond, noise, b, o);
    CHECK(a == b);
    for (float v : a) CHECK(std::isfinite(v));

    // Moved-from: every public call is an Error; the moved-to head works.
    DiffusionHead<Cpu> moved = std::move(h);
    expect_error([&] { h.sample(cond, noise, out, o); }, "moved-from DiffusionHead", "sample on moved-from");
    expect_error([&] { h.sample_normalized(cond, noise, out, o); }, "moved-from DiffusionHead", "sample_normalized on moved-from");
    expect_error([&] { h.denoise(cond, noise, 1, out, 1); }, "moved-from DiffusionHead", "denoise on moved-from");
    expect_error([&] { h.set_action_range(mx, mn); }, "moved-from DiffusionHead", "set_action_range on moved-from");
    expect_error([&] { (void)h.unnormalize(0.f, 0); }, "action dimension out of range", "unnormalize on moved-from");
    moved.sample(cond, noise, b, o);
    CHECK(a == b);
}

TEST_CASE("FlowHead: bad inputs are Errors") {
    auto f = FlowHead<Cpu>::load(reliability::head_only_file(), {}, /*max_batch=*/2);
    const auto& c = f.config();
    const std::size_t nc = std::size_t(c.cond_dim), na = std::size_t(c.action_dim);
    std::vector<float> cond(nc, 0.05f), noise(na, 0.3f), out(na);
    auto with = [](std::vector<float> v, std::size_t i, float x) { v[i] = x; return v; };
    expect_error([&] { f.sample(with(cond, 2, kNaN), noise, out, Solver::Euler, 4); }, "condition is not finite at index 2", "NaN cond");
    expect_error([&] { f.sample(cond, with(noise, 0, kInf), out, Solver::Heun, 4); }, "noise is not finite at index 0", "Inf noise");
    expect_error([&] { f.sample(cond, with(noise, 1, -kInf), out, Solver::Rk4, 4); }, "noise is not finite", "-Inf noise");
    expect_error([&] { f.sample(std::span(cond).first(nc - 1), noise, out, Solver::Euler, 4); }, "condition has the wrong size", "short cond");
    expect_error([&] { f.sample(cond, std::span(noise).first(na - 1), out, Solver::Euler, 4); }, "noise has the wrong size", "short noise");
    expect_error([&] { f.sample(cond, noise, std::span(out).first(na - 1), Solver::Euler, 4); }, "output has the wrong size", "short out");
    expect_error([&] { f.sample(cond, noise, out, Solver::Euler, 0); }, "steps out of range", "steps 0");
    expect_error([&] { f.sample(cond, noise, out, Solver::Euler, -3); }, "steps out of range", "steps negative");
    expect_error([&] { f.sample(cond, noise, out, Solver::Euler, FlowHead<Cpu>::kMaxSteps + 1); }, "steps out of range", "steps huge");
    expect_error([&] { f.sample(cond, noise, out, Solver(3), 4); }, "unknown solver", "solver enum out of range");
    expect_error([] { (void)parse_solver("midpoint"); }, "unknown solver", "unknown solver name");
    expect_error([] { (void)parse_solver("EULER"); }, "unknown solver", "wrong-case solver name");
    std::vector<float> cond3(3 * nc, 0.f), noise3(3 * na, 0.f), out3(3 * na);
    expect_error([&] { f.sample(cond3, noise3, out3, Solver::Euler, 2, 3); }, "batch out of range", "batch > max_batch");
    expect_error([&] { f.sample(cond, noise, out, Solver::Euler, 2, 0); }, "batch out of range", "batch 0");
    f.cancel();  // the "short out" solve above stays active after result() refused the span (so it can be retried)
    expect_error([&] { f.advance(1); }, "without an active solve", "advance before begin");
    expect_error([&] { f.result(out); }, "without an active solve", "result before begin");
    f.begin(cond, noise, Solver::Euler, 4);
    expect_error([&] { f.advance(0); }, "at least one step", "advance(0)");
    expect_error([&] { f.result(out); }, "before the solve finished", "result before the end");
    f.advance(4);
    expect_error([&] { f.result(std::span(out).first(1)); }, "output has the wrong size", "result into short span");
    f.cancel();
    std::vector<float> v(na);
    expect_error([&] { f.velocity(cond, noise, 0.5f, std::span(v).first(1)); }, "velocity output has the wrong size", "short velocity");
    expect_error([&] { f.velocity(cond, with(noise, 0, kNaN), 0.5f, v); }, "x is not finite", "NaN x in velocity");

    std::vector<float> a(na), b(na);
    f.sample(cond, noise, a, Solver::Rk4, 5);
    FlowHead<Cpu> moved = std::move(f);
    expect_error([&] { f.sample(cond, noise, out, Solver::Euler, 4); }, "moved-from FlowHead", "sample on moved-from");
    expect_error([&] { f.advance(1); }, "moved-from FlowHead", "advance on moved-from");
    expect_error([&] { f.result(out); }, "moved-from FlowHead", "result on moved-from");
    expect_error([&] { f.velocity(cond, noise, 0.f, v); }, "moved-from FlowHead", "velocity on moved-from");
    moved.sample(cond, noise, b, Solver::Rk4, 5);
    CHECK(a == b);
}

TEST_CASE("Mamba and MambaFlowPolicy: bad inputs are Errors") {
    auto p = MambaFlowPolicy<Cpu>::load(reliability::mamba_flow_file(), {}, /*max_tokens=*/16, /*max_batch=*/2);
    Mamba<Cpu>& m = p.backbone();
    const int V = m.config().vocab, dm = m.config().d_model, A = p.action_dim();
    std::vector<float> hid(std::size_t(16) * dm), h1(static_cast<std::size_t>(dm));
    for (std::int32_t bad : {-1, V, V + 1000, std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min()}) {
        const std::vector<std::int32_t> toks = {1, bad, 2};
        expect_error([&] { m.prefill(toks, hid); }, "token id out of range at position 1", "token out of range in prefill");
        expect_error([&] { m.step(bad, h1); }, "token id out of range at position 0", "token out of range in step");
    }
    const std::vector<std::int32_t> ok = {1, 2, 3};
    expect_error([&] { m.prefill(std::span<const std::int32_t>(), hid); }, "prefill length out of range", "empty prefill");
    const std::vector<std::int32_t> long_seq(17, 1);
    expect_error([&] { m.prefill(long_seq, hid); }, "prefill length out of range", "prefill > max_tokens");
    expect_error([&] { m.prefill(ok, std::span(hid).first(3 * std::size_t(dm) - 1)); }, "prefill output too small", "short prefill output");
    expect_error([&] { m.step(1, std::span(h1).first(std::size_t(dm) - 1)); }, "step output too small", "short step output");
    std::vector<std::byte> small(10);
    expect_error([&] { (void)m.export_state(small); }, "export_state buffer too small", "short export buffer");
    expect_error([&] { m.import_state(small); }, "truncated state", "truncated state");

    std::vector<float> noise(std::size_t(A), 0.1f), out(static_cast<std::size_t>(A)), noise3(3 * std::size_t(A), 0.1f), out3(noise3.size());
    expect_error([&] { p.act(ok, std::span<const float>(), out, Solver::Euler, 4); }, "noise must be [batch, action_dim]", "empty noise");
    expect_error([&] { p.act(ok, std::span(noise).first(std::size_t(A) - 1), out, Solver::Euler, 4); }, "noise must be", "noise not a multiple of A");
    expect_error([&] { p.act(ok, noise3, out3, Solver::Euler, 4); }, "batch out of range", "act batch > max_batch");
    expect_error([&] { p.act(ok, noise, out, Solver::Euler, 0); }, "steps out of range", "act steps 0");
    expect_error([&] { p.act(ok, noise, out, Solver(9), 3); }, "unknown solver", "act bad solver");
    const std::vector<std::int32_t> bad_toks = {1, -5};
    expect_error([&] { p.act(bad_toks, noise, out, Solver::Euler, 3); }, "token id out of range", "act bad token");
    expect_error([&] { p.act(ok, std::vector<float>(std::size_t(A), kNaN), out, Solver::Euler, 3); }, "noise is not finite", "act NaN noise");

    auto backbone_only = MambaFlowPolicy<Cpu>::load(reliability::backbone_only_file());
    expect_error([&] { backbone_only.act(ok, noise, out, Solver::Euler, 3); }, "no flow head", "act on backbone-only");
    auto head_only = MambaFlowPolicy<Cpu>::load(reliability::head_only_file());
    expect_error([&] { (void)head_only.backbone(); }, "no backbone", "backbone() on head-only");

    std::vector<float> a(static_cast<std::size_t>(A)), b(static_cast<std::size_t>(A));
    p.act(ok, noise, a, Solver::Heun, 4);
    MambaFlowPolicy<Cpu> moved = std::move(p);
    expect_error([&] { p.act(ok, noise, out, Solver::Heun, 4); }, "moved-from", "act on moved-from policy");
    Mamba<Cpu> mm = std::move(moved.backbone());
    expect_error([&] { moved.backbone().prefill(ok, hid); }, "moved-from Mamba", "prefill on moved-from");
    expect_error([&] { moved.backbone().step(1, h1); }, "moved-from Mamba", "step on moved-from");
    expect_error([&] { moved.backbone().reset(); }, "moved-from Mamba", "reset on moved-from");
    expect_error([&] { (void)moved.backbone().export_state(); }, "moved-from Mamba", "export_state on moved-from");
    const std::vector<std::byte> st = mm.export_state();
    expect_error([&] { moved.backbone().import_state(st); }, "moved-from Mamba", "import_state on moved-from");
    moved.backbone() = std::move(mm);  // move back: the policy works again
    moved.act(ok, noise, b, Solver::Heun, 4);
    CHECK(a == b);
}

TEST_CASE("bad files and paths at load are Errors") {
    reliability::TempDir tmp("badload");
    const auto empty = tmp.path / "empty.safetensors";
    { std::ofstream(empty, std::ios::binary); }
    expect_error([&] { (void)MambaFlowPolicy<Cpu>::load(tmp.path / "missing.safetensors"); }, "cannot open file", "missing file");
    expect_error([&] { (void)MambaFlowPolicy<Cpu>::load(tmp.path); }, "is a directory", "directory as checkpoint");
    expect_error([&] { (void)MambaFlowPolicy<Cpu>::load(empty); }, "file is empty", "empty file");
    expect_error([&] { (void)DiffusionHead<Cpu>::load(tmp.path); }, "no config.json", "folder without config.json");
    expect_error([&] { (void)DiffusionHead<Cpu>::load(tmp.path / "nope"); }, "no such file or folder", "missing folder");
    expect_error([&] { (void)FlowHead<Cpu>::load(reliability::backbone_only_file()); }, "no flow head", "FlowHead from backbone-only");
    expect_error([&] { (void)Mamba<Cpu>::load(reliability::head_only_file()); }, "no backbone", "Mamba from head-only");
    expect_error([&] { (void)Mamba<Cpu>::load(reliability::backbone_only_file(), {}, 0); }, "max_tokens must be positive", "max_tokens 0");
}

TEST_CASE("non-finite actions are reported with the step where they appeared") {
    reliability::TempDir tmp("nonfinite");
    // Flow head whose hidden layer weights are large: the velocity grows each step until the state overflows.
    const auto flow_path = tmp.path / "flow_overflow.safetensors";
    reliability::rewrite_f32(reliability::head_only_file(), flow_path, [](const std::string& name, std::vector<float>& v) {
        const float s = name.find("out_proj") != std::string::npos ? 1e36f : 1.f;
        for (auto& x : v) x *= s;
    });
    auto f = FlowHead<Cpu>::load(flow_path);
    std::vector<float> cond(std::size_t(f.config().cond_dim), 0.5f), noise(std::size_t(f.config().action_dim), 1.f),
        out(noise.size());
    bool threw = false;
    ++reliability::bad_inputs();
    try {
        f.sample(cond, noise, out, Solver::Euler, 8);
    } catch (const Error& e) {
        threw = true;
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.find("non-finite action at step ") != std::string::npos);
        CHECK(msg.find(" of 8 (solver euler") != std::string::npos);
    }
    CHECK(threw);

    // Diffusion U-Net whose weights are scaled so activations overflow: the first step's sample is non-finite.
    const auto dir = tmp.path / "dp_overflow";
    std::filesystem::create_directories(dir);
    for (const auto& e : std::filesystem::directory_iterator(reliability::dp_small()))
        if (e.path().filename() != "model.safetensors") std::filesystem::copy_file(e.path(), dir / e.path().filename());
    reliability::rewrite_f32(reliability::dp_small() / "model.safetensors", dir / "model.safetensors",
                             [](const std::string& name, std::vector<float>& v) {
                                 if (name.find("final_conv.1.weight") != std::string::npos)
                                     for (auto& x : v) x *= 1e38f;
                                 if (name.find("final_conv.1.bias") != std::string::npos)
                                     for (auto& x : v) x = 3e38f;
                             });
    auto h = DiffusionHead<Cpu>::load(dir);
    const auto& c = h.config();
    std::vector<float> dcond(std::size_t(c.global_cond_dim), 0.1f), dnoise(std::size_t(c.horizon) * c.action_dim, 0.5f),
        dout(dnoise.size());
    SampleOptions o;
    o.steps = 4;
    threw = false;
    ++reliability::bad_inputs();
    try {
        h.sample(dcond, dnoise, dout, o);
    } catch (const Error& e) {
        threw = true;
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.find("non-finite sample after step 0 of 4") != std::string::npos);
    }
    CHECK(threw);
    threw = false;
    ++reliability::bad_inputs();
    try {
        h.denoise(dcond, dnoise, 50, dout, 1);
    } catch (const Error& e) {
        threw = true;
        CHECK(std::string(e.what()).find("non-finite epsilon at timestep 50") != std::string::npos);
    }
    CHECK(threw);
}

TEST_CASE("cost of the finiteness checks on the Mamba-flow hot path") {
    auto p = MambaFlowPolicy<Cpu>::load(reliability::mamba_flow_file(), {}, 16, 1);
    const int A = p.action_dim();
    const std::vector<std::int32_t> toks = {5, 17, 42, 99};
    std::vector<float> noise(std::size_t(A), 0.25f), out(static_cast<std::size_t>(A));
    using clk = std::chrono::steady_clock;
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    // act(): prefill 4 tokens + 10 Euler steps; includes the noise check (A floats) and the output check (A floats).
    for (int i = 0; i < 20; ++i) p.act(toks, noise, out, Solver::Euler, 10);
    std::vector<double> act_us;
    for (int i = 0; i < 200; ++i) {
        const auto t0 = clk::now();
        p.act(toks, noise, out, Solver::Euler, 10);
        act_us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count());
    }
    // The same two loops the head runs (input noise + output action), timed alone over many repetitions.
    volatile int sink = 0;
    const int reps = 200000;
    const auto t0 = clk::now();
    for (int r = 0; r < reps; ++r) {
        int bad = 0;
        for (float x : noise) bad += !std::isfinite(x);
        for (float x : out) bad += !std::isfinite(x);
        sink = sink + bad;
        asm volatile("" ::: "memory");
    }
    const double check_us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / reps;
    const double act = median(act_us);
    const double share = check_us / act;
    std::printf("[reliability] act() p50 %.1f us; finiteness checks (2 x %d floats) %.4f us = %.4f%% of act()\n", act, A,
                check_us, 100.0 * share);
    CHECK(share < 0.01);  // far below 1 % (a few ns against ~100 us)
}

TEST_CASE("bad input count") {
    std::printf("[reliability] bad inputs tried: %d\n", reliability::bad_inputs().load());
    CHECK(reliability::bad_inputs().load() >= 100);
}
