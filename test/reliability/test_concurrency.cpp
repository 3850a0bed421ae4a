// Concurrency: several model instances built from one opened checkpoint share its mapped weights, and many
// threads sampling at once (one instance per thread) give bit-identical results to single-threaded runs.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/mamba_flow/policy.hpp"
#include "../support/cpu_models_diffusion_head.hpp"
#include "../support/cpu_models_mamba_flow.hpp"
#include "reliability_util.hpp"

using namespace flowedge;

namespace {
constexpr int kThreads = 4;
constexpr int kIters = 6;

std::vector<float> noise_for(int thread, int iter, std::size_t n) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = float(int((i * 7 + std::size_t(thread) * 13 + std::size_t(iter) * 5) % 17) - 8) / 8.f;
    return v;
}

/// Data pointer of every parameter a model lists (by visit order) when it points into `file`'s mapping,
/// nullptr for parameters the model owns (converted or computed at load, e.g. A = -exp(A_log)).
template <class Model>
std::vector<const void*> mapped_pointers(Model& m, const io::SafeTensors& file) {
    const auto* lo = file.tensors().front().raw - file.tensors().front().offset;
    const auto* hi = lo + file.file_size();
    std::vector<const void*> ptrs;
    m.visit_parameters([&](const std::string&, Parameter<Cpu>& p, const Shape&, Storage) {
        const auto* d = static_cast<const std::byte*>(p.ref().data);
        ptrs.push_back(d >= lo && d < hi ? d : nullptr);
    });
    return ptrs;
}
int count_mapped(const std::vector<const void*>& v) {
    int n = 0;
    for (const void* p : v) n += p != nullptr;
    return n;
}
}  // namespace

TEST_CASE("one opened safetensors shared by many MambaFlowPolicy instances on many threads") {
    auto file = io::SafeTensors::open(reliability::mamba_flow_file());
    std::vector<MambaFlowPolicy<Cpu>> policies;
    for (int t = 0; t < kThreads; ++t) policies.push_back(MambaFlowPolicy<Cpu>::load(file, {}, 32, 2));

    // Zero-copy sharing: the F32 tensors of every instance point into the one mapping.
    const auto base = mapped_pointers(policies[0].backbone(), *file);
    const auto head = mapped_pointers(policies[0].head(), *file);
    CHECK(count_mapped(base) >= 10);
    CHECK(count_mapped(head) == 4 + policies[0].head().config().n_layers);
    for (int t = 1; t < kThreads; ++t) {
        CHECK(mapped_pointers(policies[std::size_t(t)].backbone(), *file) == base);
        CHECK(mapped_pointers(policies[std::size_t(t)].head(), *file) == head);
    }
    CHECK(file.use_count() > kThreads);  // the instances keep the mapping alive

    const int A = policies[0].action_dim();
    auto tokens_for = [](int t, int it) {
        std::vector<std::int32_t> tok;
        for (int i = 0; i < 3 + (t + it) % 5; ++i) tok.push_back(std::int32_t((t * 31 + it * 7 + i * 3) % 200));
        return tok;
    };
    const Solver solvers[3] = {Solver::Euler, Solver::Heun, Solver::Rk4};
    // Single-threaded reference on instance 0.
    std::vector<std::vector<float>> ref(std::size_t(kThreads * kIters));
    for (int t = 0; t < kThreads; ++t)
        for (int it = 0; it < kIters; ++it) {
            auto& r = ref[std::size_t(t * kIters + it)];
            r.resize(2 * std::size_t(A));
            policies[0].act(tokens_for(t, it), noise_for(t, it, r.size()), r, solvers[(t + it) % 3], 5 + it);
        }
    std::vector<std::vector<float>> got(ref.size());
    std::vector<std::thread> pool;
    std::vector<int> errors(kThreads, 0);
    for (int t = 0; t < kThreads; ++t)
        pool.emplace_back([&, t] {
            try {
                for (int it = 0; it < kIters; ++it) {
                    auto& g = got[std::size_t(t * kIters + it)];
                    g.resize(2 * std::size_t(A));
                    policies[std::size_t(t)].act(tokens_for(t, it), noise_for(t, it, g.size()), g, solvers[(t + it) % 3], 5 + it);
                }
            } catch (...) {
                errors[std::size_t(t)] = 1;
            }
        });
    for (auto& th : pool) th.join();
    for (int t = 0; t < kThreads; ++t) CHECK(errors[std::size_t(t)] == 0);
    for (std::size_t i = 0; i < ref.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i] == ref[i]);  // bit-identical
    }
}

TEST_CASE("one opened DiffusionCheckpoint shared by several DiffusionHead instances on many threads") {
    const io::DiffusionCheckpoint ck = io::open_diffusion_checkpoint(reliability::dp_small());
    std::vector<DiffusionHead<Cpu>> heads;
    for (int t = 0; t < kThreads; ++t) heads.push_back(DiffusionHead<Cpu>::load(ck, {}, 2));
    const auto base = mapped_pointers(heads[0], *ck.weights);
    CHECK(count_mapped(base) >= 20);
    for (int t = 1; t < kThreads; ++t) CHECK(mapped_pointers(heads[std::size_t(t)], *ck.weights) == base);
    // The matrices are referenced in place in the mapped model.safetensors.
    CHECK(base.front() == static_cast<const void*>(ck.tensor("diffusion_step_encoder.1.weight").data));

    const auto& c = heads[0].config();
    const std::size_t nc = std::size_t(c.global_cond_dim), nx = std::size_t(c.horizon) * c.action_dim;
    auto opts_for = [](int t, int it) {
        SampleOptions o;
        o.steps = 2 + (t + it) % 4;
        o.scheduler = (t + it) % 2 ? Scheduler::Ddpm : Scheduler::Ddim;
        o.seed = std::uint64_t(t * 100 + it);
        return o;
    };
    auto cond_for = [&](int t, int it) {
        std::vector<float> v(2 * nc);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(int((i + std::size_t(t * 3 + it)) % 11) - 5) / 5.f;
        return v;
    };
    std::vector<std::vector<float>> ref(std::size_t(kThreads * kIters)), got(ref.size());
    for (int t = 0; t < kThreads; ++t)
        for (int it = 0; it < kIters; ++it) {
            auto& r = ref[std::size_t(t * kIters + it)];
            r.resize(2 * nx);
            heads[0].sample(cond_for(t, it), noise_for(t, it, 2 * nx), r, opts_for(t, it), 2);
        }
    std::vector<std::thread> pool;
    std::vector<int> errors(kThreads, 0);
    for (int t = 0; t < kThreads; ++t)
        pool.emplace_back([&, t] {
            try {
                for (int it = 0; it < kIters; ++it) {
                    auto& g = got[std::size_t(t * kIters + it)];
                    g.resize(2 * nx);
                    heads[std::size_t(t)].sample(cond_for(t, it), noise_for(t, it, 2 * nx), g, opts_for(t, it), 2);
                }
            } catch (...) {
                errors[std::size_t(t)] = 1;
            }
        });
    for (auto& th : pool) th.join();
    for (int t = 0; t < kThreads; ++t) CHECK(errors[std::size_t(t)] == 0);
    for (std::size_t i = 0; i < ref.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i] == ref[i]);
    }
}

TEST_CASE("a shared SafeTensors is safe to read from many threads, and opening/closing races are clean") {
    auto file = io::SafeTensors::open(reliability::mamba_flow_file());
    std::vector<std::vector<float>> ref;
    for (const auto& t : file->tensors()) ref.push_back(file->read_f32(t.name));
    std::vector<int> mismatches(kThreads, 0);
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t)
        pool.emplace_back([&, t] {
            for (int rep = 0; rep < 3; ++rep) {
                std::size_t i = 0;
                for (const auto& ti : file->tensors()) mismatches[std::size_t(t)] += file->read_f32(ti.name) != ref[i++];
                // Each thread also opens and drops its own mapping of the same file.
                auto own = io::SafeTensors::open(reliability::mamba_flow_file());
                mismatches[std::size_t(t)] += own->tensors().size() != file->tensors().size();
            }
        });
    for (auto& th : pool) th.join();
    for (int m : mismatches) CHECK(m == 0);
}
