// FlowHead<Cpu> against a double-precision reference (Euler/Heun/RK4, batch > 1, 0..8 hidden layers), the
// resumable begin/advance/cancel contract, input/output finiteness checks, and MambaFlowPolicy file variants.
#include <doctest/doctest.h>

#include <flowedge/models/mamba_flow/policy.hpp>
#include "../support/cpu_models_mamba_flow.hpp"

#include "support.hpp"

using namespace flowedge;
using fe_test::TinyShape;

namespace {

std::vector<float> randn(std::size_t n, std::uint32_t seed, float scale = 1.f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

std::filesystem::path write_tiny(const std::string& name, const TinyShape& s, std::uint32_t seed, bool backbone, bool flow,
                                 fe_test::TensorMap* out = nullptr, float flow_scale = 1.f) {
    auto t = fe_test::make_tiny(s, seed, backbone, flow, flow_scale);
    auto p = fe_test::temp_path(name);
    fe_test::write_safetensors(p, t);
    if (out) *out = t;
    return p;
}

}  // namespace

TEST_CASE("flow: samples match the double reference for every solver, batch and layer count") {
    for (int layers : {0, 1, 2, 8}) {
        TinyShape s;
        s.flow_layers = layers;
        fe_test::TensorMap t;
        auto path = write_tiny("flow_ref.safetensors", s, 10 + std::uint32_t(layers), false, true, &t);
        auto head = FlowHead<Cpu>::load(path, {}, 4);
        CHECK(head.config().n_layers == layers);
        CHECK(head.config().action_dim == 3);
        CHECK(head.config().hidden == 7);
        CHECK(head.config().time_dim == 6);
        CHECK(head.config().cond_dim == 5);
        fe_test::RefFlow ref(s, t, s.d_model);
        const int batch = 3;
        auto cond = randn(std::size_t(batch) * 5, 1);
        auto noise = randn(std::size_t(batch) * 3, 2);
        for (Solver solver : {Solver::Euler, Solver::Heun, Solver::Rk4}) {
            for (int steps : {1, 3, 10, 64, 65}) {  // 65 > kTimeCacheSteps: time features computed per evaluation
                std::vector<float> out(noise.size());
                head.sample(cond, noise, out, solver, steps, batch);
                double worst = 0;
                for (int b = 0; b < batch; ++b) {
                    std::vector<double> c(cond.begin() + b * 5, cond.begin() + (b + 1) * 5);
                    std::vector<double> x(noise.begin() + b * 3, noise.begin() + (b + 1) * 3);
                    auto want = ref.sample(c, x, int(solver), steps);
                    worst = std::max(worst, fe_test::rel_err(std::span(out).subspan(std::size_t(b) * 3, 3), want));
                }
                INFO("layers " << layers << " solver " << solver_name(solver) << " steps " << steps << " rel err " << worst);
                CHECK(worst < 1e-5);
            }
        }
        // A single velocity evaluation.
        std::vector<float> v(3);
        head.velocity(std::span(cond).first(5), std::span(noise).first(3), 0.37f, v);
        auto vw = ref.velocity(ref.cproj({cond.begin(), cond.begin() + 5}), {noise.begin(), noise.begin() + 3}, double(0.37f));
        CHECK(fe_test::rel_err(v, vw) < 2e-6);
    }
}

TEST_CASE("flow: batch rows are independent of each other") {
    TinyShape s;
    auto path = write_tiny("flow_batch.safetensors", s, 20, false, true);
    auto head = FlowHead<Cpu>::load(path, {}, 5);
    auto cond = randn(25, 3);
    auto noise = randn(15, 4);
    std::vector<float> all(15), one(3);
    head.sample(cond, noise, all, Solver::Heun, 7, 5);
    for (int b = 0; b < 5; ++b) {
        head.sample(std::span(cond).subspan(std::size_t(b) * 5, 5), std::span(noise).subspan(std::size_t(b) * 3, 3), one,
                    Solver::Heun, 7, 1);
        CHECK(fe_test::rel_err(one, std::span(all).subspan(std::size_t(b) * 3, 3)) < 1e-6);
    }
}

TEST_CASE("flow: begin/advance in any split is bit-identical to one sample; cancel") {
    TinyShape s;
    auto path = write_tiny("flow_adv.safetensors", s, 21, false, true);
    auto head = FlowHead<Cpu>::load(path, {}, 2);
    auto cond = randn(10, 5);
    auto noise = randn(6, 6);
    for (Solver solver : {Solver::Euler, Solver::Heun, Solver::Rk4}) {
        std::vector<float> whole(6), part(6);
        head.sample(cond, noise, whole, solver, 10, 2);
        for (int chunk : {1, 3, 4, 10, 50}) {
            head.begin(cond, noise, solver, 10, 2);
            int calls = 0;
            while (!head.advance(chunk)) ++calls;
            CHECK(calls == (10 + chunk - 1) / chunk - 1);
            CHECK(head.steps_done() == 10);
            head.result(part);
            CHECK(part == whole);
        }
    }
    // result() too early, advance after cancel, result after cancel.
    std::vector<float> out(6);
    head.begin(cond, noise, Solver::Rk4, 10, 2);
    CHECK_FALSE(head.advance(4));
    CHECK_THROWS_WITH_AS(head.result(out), doctest::Contains("before the solve finished"), Error);
    head.cancel();
    CHECK_FALSE(head.active());
    CHECK_THROWS_AS(head.advance(1), Error);
    CHECK_THROWS_AS(head.result(out), Error);
    // A cancelled solve leaves nothing behind: the next one equals a fresh sample.
    std::vector<float> whole(6);
    head.sample(cond, noise, whole, Solver::Euler, 5, 2);
    head.begin(cond, noise, Solver::Euler, 5, 2);
    head.advance(2);
    head.cancel();
    head.begin(cond, noise, Solver::Euler, 5, 2);
    CHECK(head.advance(5));
    head.result(out);
    CHECK(out == whole);
}

TEST_CASE("flow: bad inputs and non-finite results are reported") {
    TinyShape s;
    auto path = write_tiny("flow_bad.safetensors", s, 22, false, true);
    auto head = FlowHead<Cpu>::load(path, {}, 2);
    auto cond = randn(5, 7);
    auto noise = randn(3, 8);
    std::vector<float> out(3);
    auto bad = noise;
    bad[1] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(head.sample(cond, bad, out, Solver::Euler, 4), doctest::Contains("noise is not finite at index 1"), Error);
    auto badc = cond;
    badc[4] = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH_AS(head.sample(badc, noise, out, Solver::Euler, 4), doctest::Contains("condition is not finite"), Error);
    CHECK_THROWS_WITH_AS(head.sample(cond, noise, out, Solver::Euler, 0), doctest::Contains("steps out of range"), Error);
    CHECK_THROWS_WITH_AS(head.sample(cond, noise, out, Solver::Euler, 4, 3), doctest::Contains("batch out of range"), Error);
    CHECK_THROWS_AS(head.sample(std::span(cond).first(4), noise, out, Solver::Euler, 4), Error);
    CHECK_THROWS_AS(parse_solver("midpoint"), Error);
    CHECK(parse_solver("rk4") == Solver::Rk4);

    // Weights so large that the state overflows to inf after a few steps: the error names the step.
    fe_test::TensorMap t = fe_test::make_tiny(s, 23, false, true);
    for (auto& v : t["flow.out_proj.weight"].values) v *= 3e37f;
    auto p2 = fe_test::temp_path("flow_overflow.safetensors");
    fe_test::write_safetensors(p2, t);
    auto h2 = FlowHead<Cpu>::load(p2, {}, 1);
    std::vector<float> big_noise(3, 1.f);
    CHECK_THROWS_WITH_AS(h2.sample(cond, big_noise, out, Solver::Euler, 10), doctest::Contains("non-finite action at step"), Error);
}

TEST_CASE("flow: hidden layers must be numbered contiguously and at most 8") {
    TinyShape s;
    s.flow_layers = 3;
    auto t = fe_test::make_tiny(s, 24, false, true);
    t.erase("flow.layers.1.weight");
    auto p = fe_test::temp_path("flow_gap.safetensors");
    fe_test::write_safetensors(p, t);
    CHECK_THROWS_WITH_AS(FlowHead<Cpu>::load(p), doctest::Contains("contiguously"), Error);
    s.flow_layers = 9;
    fe_test::write_safetensors(p, fe_test::make_tiny(s, 24, false, true));
    CHECK_THROWS_WITH_AS(FlowHead<Cpu>::load(p), doctest::Contains("too many hidden layers"), Error);
}

TEST_CASE("policy: act = prefill -> last hidden row -> flow solve; head-only and backbone-only files") {
    TinyShape s;
    fe_test::TensorMap t;
    auto both = write_tiny("policy_both.safetensors", s, 30, true, true, &t);
    auto policy = MambaFlowPolicy<Cpu>::load(both, {}, 16, 4);
    CHECK(policy.has_backbone());
    CHECK(policy.has_head());
    const std::vector<std::int32_t> toks{1, 2, 3, 4, 9};
    auto noise = randn(3, 31);
    std::vector<float> act(3);
    policy.act(toks, noise, act, Solver::Rk4, 6);

    // Reference: double Mamba + double flow.
    fe_test::RefMamba rm(s, t);
    auto hidden = rm.run({1, 2, 3, 4, 9});
    std::vector<double> last(hidden.end() - s.d_model, hidden.end());
    fe_test::RefFlow rf(s, t, s.d_model);
    auto want = rf.sample(last, {noise.begin(), noise.end()}, 2, 6);
    CHECK(fe_test::rel_err(act, want) < 1e-5);

    // Batch rows share the condition.
    auto noise2 = randn(6, 32);
    std::vector<float> act2(6), one(3);
    policy.act(toks, noise2, act2, Solver::Euler, 5);
    policy.act(toks, std::span(noise2).subspan(3, 3), one, Solver::Euler, 5);
    CHECK(std::vector<float>(act2.begin() + 3, act2.end()) == one);

    // Head-only: samples from an external condition, no backbone.
    auto only = [&](const std::string& prefix, const std::string& name) {
        fe_test::TensorMap part;
        for (const auto& [k, v] : t)
            if (k.rfind(prefix, 0) == 0) part[k] = v;
        auto p = fe_test::temp_path(name);
        fe_test::write_safetensors(p, part);
        return p;
    };
    auto head_only = only("flow.", "policy_head.safetensors");
    auto ph = MambaFlowPolicy<Cpu>::load(head_only);
    CHECK_FALSE(ph.has_backbone());
    CHECK(ph.has_head());
    std::vector<float> cond(last.begin(), last.end()), out(3);
    ph.head().sample(cond, noise, out, Solver::Rk4, 6);
    CHECK(out == act);  // same ops on the same condition
    CHECK_THROWS_WITH_AS(ph.act(toks, noise, out, Solver::Euler, 5), doctest::Contains("no backbone"), Error);

    // Backbone-only: hidden states, no head.
    auto backbone_only = only("backbone.", "policy_backbone.safetensors");
    auto pb = MambaFlowPolicy<Cpu>::load(backbone_only);
    CHECK(pb.has_backbone());
    CHECK_FALSE(pb.has_head());
    std::vector<float> h(toks.size() * std::size_t(s.d_model));
    pb.backbone().prefill(toks, h);
    CHECK(fe_test::rel_err(h, hidden) < 2e-6);
    CHECK_THROWS_WITH_AS(pb.act(toks, noise, out, Solver::Euler, 5), doctest::Contains("no flow head"), Error);

    // Cd != d_model is rejected at load.
    auto tb = fe_test::make_tiny(s, 33, true, false);
    TinyShape wide = s;
    wide.d_model = 6;
    auto tf = fe_test::make_tiny(wide, 34, false, true);
    tb.insert(tf.begin(), tf.end());
    auto mism = fe_test::temp_path("policy_mismatch.safetensors");
    fe_test::write_safetensors(mism, tb);
    CHECK_THROWS_WITH_AS(MambaFlowPolicy<Cpu>::load(mism), doctest::Contains("expected 5, got 6"), Error);
    // A file with neither part.
    fe_test::write_safetensors(mism, {{"other.weight", {{2}, {1.f, 2.f}}}});
    CHECK_THROWS_WITH_AS(MambaFlowPolicy<Cpu>::load(mism), doctest::Contains("neither a backbone nor a flow head"), Error);
}

TEST_CASE("flow: BF16/F16 weights stay within their stated bound of F32") {
    TinyShape s;
    s.d_model = 64;
    s.hidden = 128;
    s.time_dim = 32;
    s.action_dim = 8;
    auto path = write_tiny("flow_bf16.safetensors", s, 40, false, true);
    auto cond = randn(64, 41);
    auto noise = randn(8, 42);
    std::vector<float> ref(8), got(8);
    FlowHead<Cpu>::load(path).sample(cond, noise, ref, Solver::Euler, 10);
    FlowHead<Cpu>::load(path, {.weight_dtype = DType::BF16}).sample(cond, noise, got, Solver::Euler, 10);
    const double e_bf16 = fe_test::rel_err(got, ref);
    FlowHead<Cpu>::load(path, {.weight_dtype = DType::F16}).sample(cond, noise, got, Solver::Euler, 10);
    const double e_f16 = fe_test::rel_err(got, ref);
    MESSAGE("action rel err vs F32: bf16 " << e_bf16 << ", f16 " << e_f16);
    CHECK(e_bf16 > 0);
    CHECK(e_bf16 < 5e-3);  // measured 1.4e-4
    CHECK(e_f16 < 5e-4);  // measured 1.3e-5
}
