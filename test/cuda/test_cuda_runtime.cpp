// Memory<Cuda> (counted allocations, failure injection, copies) and Graph<Cuda> (capture + replay equals
// direct launches, on a user stream and on the default stream; no allocation during replay).
#include <doctest/doctest.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "cuda_test_util.hpp"
#include "flowedge/graph.hpp"
#include "flowedge/noise.hpp"
#include "flowedge/ops.hpp"

using namespace flowedge;
using namespace flowedge::test;

TEST_CASE("Memory<Cuda> counts every cudaMalloc and cudaFree") {
    static_assert(!Memory<Cuda>::host_accessible);
    const std::size_t a0 = Memory<Cuda>::allocation_count(), f0 = Memory<Cuda>::free_count();
    {
        Buffer<float, Cuda> b1(1000), b2(1);
        CHECK(Memory<Cuda>::allocation_count() == a0 + 2);
        CHECK(Memory<Cuda>::free_count() == f0);
        Buffer<float, Cuda> moved(std::move(b1));
        CHECK(Memory<Cuda>::allocation_count() == a0 + 2);
    }
    CHECK(Memory<Cuda>::free_count() == f0 + 2);
}

TEST_CASE("injected allocation failures throw like a failed cudaMalloc, then allocation works again") {
    const std::size_t a0 = Memory<Cuda>::allocation_count();
    cuda::inject_allocation_failure(2);
    auto make_buffer = [] { Buffer<float, Cuda> b(16); };
    CHECK_THROWS_WITH_AS(make_buffer(), doctest::Contains("out of memory"), Error);
    CHECK_THROWS_AS(Memory<Cuda>::allocate(4), Error);
    CHECK(Memory<Cuda>::allocation_count() == a0);  // no cudaMalloc was attempted
    Buffer<float, Cuda> ok(16);
    CHECK(ok.data() != nullptr);
    CHECK(Memory<Cuda>::allocation_count() == a0 + 1);
    cuda::inject_allocation_failure(5);
    cuda::inject_allocation_failure(0);  // disarm
    Buffer<float, Cuda> ok2(16);
    CHECK(ok2.data() != nullptr);
}

TEST_CASE("a real cudaMalloc failure is a flowedge::Error naming the size and the CUDA error") {
    CHECK_THROWS_WITH_AS(Memory<Cuda>::allocate(std::size_t(1) << 50), doctest::Contains("cudaMalloc of"), Error);
    Buffer<float, Cuda> still_ok(8);  // the failure is not sticky
    CHECK(still_ok.data() != nullptr);
}

TEST_CASE("Memory<Cuda> copies: host round trip, device copy, fill_zero, pinned staging, explicit stream") {
    const auto h = random_vec(1001, 1u);
    Buffer<float, Cuda> a(h.size()), b(h.size());
    Memory<Cuda>::copy_from_host(a.data(), h.data(), a.bytes());
    Memory<Cuda>::copy(b.data(), a.data(), a.bytes());
    std::vector<float> back(h.size());
    Memory<Cuda>::copy_to_host(back.data(), b.data(), b.bytes());
    CHECK(bitwise_equal(back, h));
    Memory<Cuda>::fill_zero(b.data(), b.bytes());
    Memory<Cuda>::copy_to_host(back.data(), b.data(), b.bytes());
    CHECK(max_abs(back) == 0.0);

    cudaStream_t st = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    Memory<Cuda>::copy_from_host(a.data(), h.data(), a.bytes());
    Memory<Cuda>::synchronize();  // `st` does not wait for the default stream
    auto* pinned = static_cast<float*>(Memory<Cuda>::allocate_pinned(h.size() * sizeof(float)));
    Memory<Cuda>::copy_to_host(pinned, a.data(), a.bytes(), Stream{st});
    CHECK(std::vector<float>(pinned, pinned + h.size()) == h);
    Memory<Cuda>::deallocate_pinned(pinned);
    Memory<Cuda>::synchronize(Stream{st});
    cudaStreamDestroy(st);
}

namespace {

/// A small fixed pipeline touching several kernel families: linear -> conv1d -> group_norm(+FiLM, residual)
/// -> conv_transpose1d -> DDPM step with a device seed. All buffers live at fixed addresses.
struct Pipeline {
    static constexpr int kIn = 132, kC = 64, kL = 8, kOut = 32;
    Weights w_lin{random_vec(std::size_t(2 * kC) * kIn, 201u, -0.1f, 0.1f), DType::BF16};
    Weights w_conv{random_vec(std::size_t(kC) * kC * 5, 202u, -0.05f, 0.05f), DType::F32};
    Weights w_up{random_vec(std::size_t(kC) * kOut * 4, 203u, -0.1f, 0.1f), DType::F16};
    DeviceArray<float> cond{random_vec(kIn, 204u)};
    DeviceArray<float> x{random_vec(std::size_t(kC) * kL, 205u)};
    DeviceArray<float> gamma{random_vec(kC, 206u, 0.5f, 1.5f)}, beta{random_vec(kC, 207u)};
    DeviceArray<float> film{std::size_t(2 * kC)}, h{std::size_t(kC) * kL}, up{std::size_t(kOut) * 2 * kL};
    DeviceArray<float> eps{random_vec(std::size_t(kOut) * 2 * kL, 208u)};
    DeviceArray<std::uint64_t> seed{std::vector<std::uint64_t>{42}};
    DeviceArray<float> sample{std::size_t(kOut) * 2 * kL};

    void enqueue(Stream s) {
        LinearParams lp;
        lp.x = cond.get(); lp.w = w_lin.gpu(); lp.y = film.get(); lp.rows = 1; lp.in = kIn; lp.out = 2 * kC;
        lp.act = Activation::Mish;
        Ops<Cuda>::linear(lp, s);
        Conv1dParams cp;
        cp.x = x.get(); cp.w = w_conv.gpu(); cp.y = h.get(); cp.in_channels = kC; cp.out_channels = kC;
        cp.in_length = kL; cp.out_length = kL; cp.kernel = 5; cp.pad = 2;
        Ops<Cuda>::conv1d(cp, s);
        GroupNormParams gp;
        gp.x = h.get(); gp.y = h.get(); gp.gamma = gamma.get(); gp.beta = beta.get(); gp.channels = kC; gp.length = kL;
        gp.groups = 8; gp.act = Activation::Mish; gp.film = film.get(); gp.residual = x.get();
        Ops<Cuda>::group_norm(gp, s);
        ConvTranspose1dParams tp;
        tp.x = h.get(); tp.w = w_up.gpu(); tp.y = up.get(); tp.in_channels = kC; tp.out_channels = kOut;
        tp.in_length = kL; tp.out_length = 2 * kL;
        Ops<Cuda>::conv_transpose1d(tp, s);
        Ops<Cuda>::copy(sample.get(), up.get(), up.size() * sizeof(float), s);
        DiffusionStepParams dp;
        dp.x = sample.get(); dp.eps = eps.get(); dp.per_sample = int(sample.size()); dp.kind = StepKind::Ddpm;
        dp.sqrt_abar = 0.5f; dp.sqrt_one_minus_abar = 0.8660254f; dp.clip = true; dp.c_x0 = 0.3f; dp.c_other = 0.6f;
        dp.noise_std = 0.1f; dp.seed_ptr = seed.get();
        Ops<Cuda>::diffusion_step(dp, s);
    }
};

void graph_matches_direct(Stream s) {
    Pipeline direct, graphed;
    Memory<Cuda>::synchronize();  // uploads ran on the default stream; `s` may be a non-blocking stream
    direct.enqueue(s);
    const auto want = direct.sample.download(s);

    Graph<Cuda> graph;
    const std::size_t a0 = Memory<Cuda>::allocation_count();
    graph.run(s, 1, [&] { graphed.enqueue(s); });
    CHECK(graph.n_recorded() == 1);
    CHECK(bitwise_equal(graphed.sample.download(s), want));

    // Replay with new inputs and a new seed: still equal to direct launches on the same data.
    const auto x2 = random_vec(graphed.x.size(), 301u);
    graphed.x.upload(x2, s);
    direct.x.upload(x2, s);
    graphed.seed.upload({7}, s);
    direct.seed.upload({7}, s);
    for (int rep = 0; rep < 3; ++rep) graph.run(s, 1, [&] { FAIL("enqueue must not run on replay"); });
    direct.enqueue(s);
    CHECK(bitwise_equal(graphed.sample.download(s), direct.sample.download(s)));
    CHECK(Memory<Cuda>::allocation_count() == a0);  // capture and replay allocate nothing through flowedge

    // A different key records a second graph; moving the Graph keeps the recordings.
    graph.run(s, 2, [&] { graphed.enqueue(s); });
    CHECK(graph.n_recorded() == 2);
    Graph<Cuda> moved(std::move(graph));
    moved.run(s, 1, [&] { FAIL("key 1 must replay"); });
    CHECK(bitwise_equal(graphed.sample.download(s), direct.sample.download(s)));
    moved.reset();
    CHECK(moved.n_recorded() == 0);
}

}  // namespace

TEST_CASE("Graph<Cuda> replay equals direct launches on a user stream") {
    cudaStream_t st = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    graph_matches_direct(Stream{st});
    REQUIRE(cudaStreamSynchronize(st) == cudaSuccess);
    cudaStreamDestroy(st);
}

TEST_CASE("Graph<Cuda> replay equals direct launches on the default stream (internal capture stream)") {
    graph_matches_direct(Stream{});
}

TEST_CASE("Graph<Cuda> abandons a capture whose enqueue throws, and records cleanly afterwards") {
    Pipeline pipe, direct;
    Graph<Cuda> graph;
    CHECK_THROWS_AS(graph.run(Stream{}, 9, [&] {
        pipe.enqueue(Stream{});
        throw std::runtime_error("enqueue failed");
    }), std::runtime_error);
    CHECK(graph.n_recorded() == 0);
    // Launches outside a capture work again (the thread is not stuck in capture mode).
    direct.enqueue(Stream{});
    graph.run(Stream{}, 9, [&] { pipe.enqueue(Stream{}); });
    CHECK(bitwise_equal(pipe.sample.download(), direct.sample.download()));
}
