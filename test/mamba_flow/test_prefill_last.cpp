// Mamba::prefill_last_device (MambaFlowPolicy::act's prefill: the last layer's out_proj and the final norm on the last
// row only) gives the last row of a full prefill bit for bit on the CPU (the packed projections do not depend on the
// row count), leaves the same decode state, and act() equals prefill + an explicit flow solve on that row.
#include <doctest/doctest.h>

#include <flowedge/models/mamba_flow/policy.hpp>
#include "../support/cpu_models_mamba_flow.hpp"

#include "support.hpp"

using namespace flowedge;

TEST_CASE("prefill_last_device == last row of prefill (bits), same state afterwards; act == prefill + sample") {
    fe_test::TinyShape s;  // odd-ish widths: every projection has a partial output vector
    s.n_layers = 3;
    s.d_model = 40;
    s.d_inner = 72;
    s.d_state = 8;
    s.d_conv = 4;
    s.dt_rank = 5;
    s.vocab = 33;
    s.hidden = 48;
    s.time_dim = 16;
    s.action_dim = 7;
    auto path = fe_test::temp_path("prefill_last.safetensors");
    fe_test::write_safetensors(path, fe_test::make_tiny(s, 71));
    auto policy = MambaFlowPolicy<Cpu>::load(path, {}, 16, 1);
    auto& m = policy.backbone();
    const std::size_t dm = std::size_t(s.d_model);
    const std::vector<std::int32_t> all{3, 1, 4, 1, 5, 9, 2, 6, 5};
    for (MathMode mode : {MathMode::F32, MathMode::BF16}) {
        policy.set_math(mode);
        for (std::size_t L : {std::size_t(1), std::size_t(2), std::size_t(4), std::size_t(9)}) {
            INFO("math " << int(mode) << " L " << L);
            const std::span<const std::int32_t> toks(all.data(), L);
            std::vector<float> full(L * dm), row(dm), step_full(dm), step_last(dm);
            m.prefill(toks, full);
            m.step(7, step_full);
            const float* last = m.prefill_last_device(toks);
            std::copy_n(last, dm, row.begin());
            CHECK(std::memcmp(row.data(), full.data() + (L - 1) * dm, dm * sizeof(float)) == 0);
            m.step(7, step_last);  // the state after prefill_last_device is the full prefill's
            CHECK(step_last == step_full);

            std::vector<float> noise(std::size_t(s.action_dim)), a_act(noise.size()), a_ref(noise.size());
            for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = 0.3f * float(i) - 0.8f;
            policy.act(toks, noise, a_act, Solver::Euler, 5);
            const std::vector<float> cond(full.end() - std::ptrdiff_t(dm), full.end());
            policy.head().sample(cond, noise, a_ref, Solver::Euler, 5);
            CHECK(a_act == a_ref);
        }
    }
}
