// Proves the allocation discipline: after load, prefill/step/act/sample/begin/advance/result and
// state export (into a caller buffer) / import allocate nothing, neither via operator new nor via Memory<Cpu>,
// in F32 and in BF16 math (set_math included).
#include <doctest/doctest.h>

#include "../support/counting_new.hpp"

#include <flowedge/models/mamba_flow/policy.hpp>
#include "../support/cpu_models_mamba_flow.hpp"

#include "support.hpp"

using namespace flowedge;

TEST_CASE("no allocation after load (operator new and Memory<Cpu>)") {
    fe_test::TinyShape s;
    s.d_model = 32;
    s.d_inner = 64;
    s.d_state = 8;
    s.d_conv = 4;
    s.dt_rank = 4;
    s.vocab = 64;
    s.hidden = 64;
    s.time_dim = 16;
    s.action_dim = 8;
    auto path = fe_test::temp_path("noalloc.safetensors");
    fe_test::write_safetensors(path, fe_test::make_tiny(s, 50));
    auto policy = MambaFlowPolicy<Cpu>::load(path, {}, 64, 4);
    auto head = FlowHead<Cpu>::load(path, {}, 4);

    const std::vector<std::int32_t> toks{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37};
    std::vector<float> hidden(toks.size() * 32), row(32), noise(32, 0.25f), out(32), cond(4 * 32, 0.1f);
    std::vector<std::byte> state(policy.backbone().state_bytes());
    // Warm-up (first use of each path).
    policy.act(toks, std::span(noise).first(8), std::span(out).first(8), Solver::Euler, 10);

    const std::size_t news0 = fe_test::g_operator_new_calls.load(), mem0 = Memory<Cpu>::allocation_count().load();
    for (int rep = 0; rep < 4; ++rep) {
        // Reps 2 and 3 run under MathMode::BF16 (switching modes allocates nothing either).
        policy.set_math(rep >= 2 ? MathMode::BF16 : MathMode::F32);
        head.set_math(rep >= 2 ? MathMode::BF16 : MathMode::F32);
        policy.backbone().prefill(toks, hidden);
        policy.backbone().step(5, row);
        policy.backbone().export_state(std::span<std::byte>(state));
        policy.backbone().import_state(state);
        policy.backbone().reset();
        for (Solver solver : {Solver::Euler, Solver::Heun, Solver::Rk4}) {
            policy.act(std::span(toks).first(4), std::span(noise).first(8), std::span(out).first(8), solver, 10);
            policy.act(toks, std::span(noise).first(16), std::span(out).first(16), solver, 3);
            head.sample(cond, noise, out, solver, 7, 4);
            head.begin(std::span(cond).first(64), std::span(noise).first(16), solver, 5, 2);
            while (!head.advance(2)) {
            }
            head.result(std::span(out).first(16));
        }
    }
    const std::size_t news = fe_test::g_operator_new_calls.load() - news0, mems = Memory<Cpu>::allocation_count().load() - mem0;
    CHECK(news == 0);
    CHECK(mems == 0);
    // Sanity: the counter does see allocations.
    auto v = policy.backbone().export_state();
    CHECK(fe_test::g_operator_new_calls.load() > news0);
    CHECK(v.size() == state.size());
}
