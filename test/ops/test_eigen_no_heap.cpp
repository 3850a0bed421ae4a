// Proves the Eigen kernel set never touches the heap after load, through any allocator: Eigen's products allocate
// their GEMM panels with std::malloc (not operator new) once they outgrow EIGEN_STACK_ALLOCATION_LIMIT, so the C
// allocation functions are counted here (support/counting_malloc.hpp) while every op that runs on Eigen's products
// runs at shapes whose panels would outgrow it. Registered with FLOWEDGE_CPU_ISA=eigen (test/ops/CMakeLists.txt).
#include <doctest/doctest.h>

#include "../support/counting_malloc.hpp"

#include <cstdint>
#include <vector>

#include "flowedge/cpu/memory.hpp"
#include "flowedge/ops.hpp"  // first: it includes Eigen with GCC 12's AVX-512 header warnings off (cpu/kernels.hpp)

#include <Eigen/Core>

using namespace flowedge;

namespace {

/// Every GEMM-shaped Ops<Cpu> call of the Eigen set, on F32 and 16-bit weights, serial and parallel shapes.
void run_gemm_shaped_ops(std::vector<float>& x, std::vector<float>& y, const std::vector<float>& w,
                         const std::vector<std::uint16_t>& w16, const std::vector<float>& small) {
    LinearParams l;
    l.x = x.data(); l.w = {w.data(), DType::F32}; l.bias = small.data(); l.y = y.data();
    l.rows = 64; l.in = 1024; l.out = 512; l.act = Activation::Mish;
    Ops<Cpu>::linear(l);  // 64 columns x 1024 deep: dynamic panels of ~256 KiB
    l.rows = 1; l.in = 2048; l.out = 1024; l.act = Activation::Silu;
    Ops<Cpu>::linear(l);  // batch-1 GEMV
    l.rows = 3; l.w = {w16.data(), DType::BF16}; l.accumulate = true;
    Ops<Cpu>::linear(l);  // widened weight tiles, accumulate epilogue
    Conv1dParams c;
    c.x = x.data(); c.w = {w.data(), DType::F32}; c.bias = small.data(); c.y = y.data();
    c.in_channels = 512; c.out_channels = 512; c.in_length = 16; c.out_length = 16; c.kernel = 5; c.pad = 2;
    Ops<Cpu>::conv1d(c);
    c.w = {w16.data(), DType::F16}; c.in_channels = 2048; c.out_channels = 64; c.batch = 2;
    Ops<Cpu>::conv1d(c);  // im2col panel split over input channels
    ConvTranspose1dParams t;
    t.x = x.data(); t.w = {w.data(), DType::F32}; t.bias = small.data(); t.y = y.data();
    t.in_channels = 1024; t.out_channels = 512; t.in_length = 8; t.out_length = 16; t.kernel = 4; t.stride = 2; t.pad = 1;
    Ops<Cpu>::conv_transpose1d(t);
    t.w = {w16.data(), DType::BF16};
    Ops<Cpu>::conv_transpose1d(t);
    Conv2dParams c2;
    c2.x = x.data(); c2.w = {w.data(), DType::F32}; c2.bias = small.data(); c2.y = y.data();
    c2.in_channels = 3; c2.out_channels = 64; c2.in_h = 84; c2.in_w = 84; c2.out_h = 42; c2.out_w = 42;
    c2.kernel_h = 7; c2.kernel_w = 7; c2.stride_h = 2; c2.stride_w = 2; c2.pad_h = 3; c2.pad_w = 3; c2.act = Activation::Relu;
    Ops<Cpu>::conv2d(c2);  // the ResNet stem
    c2.in_channels = 256; c2.out_channels = 256; c2.in_h = 11; c2.in_w = 11; c2.out_h = 11; c2.out_w = 11;
    c2.kernel_h = 3; c2.kernel_w = 3; c2.stride_h = 1; c2.stride_w = 1; c2.pad_h = 1; c2.pad_w = 1; c2.residual = x.data();
    Ops<Cpu>::conv2d(c2);
    c2.w = {w16.data(), DType::BF16};
    Ops<Cpu>::conv2d(c2);
    AttentionParams a;
    a.q = x.data(); a.k = x.data() + 1; a.v = x.data() + 2; a.out = y.data();
    a.n_q = 300; a.n_kv = 300; a.n_heads = 4; a.head_dim = 64; a.scale = 0.125f;
    Ops<Cpu>::attention(a);  // ACT's encoder self-attention shape
    a.n_q = 100; a.n_kv = 1;
    Ops<Cpu>::attention(a);
}

}  // namespace

TEST_CASE("the heap counter sees Eigen's own allocations (the check below can fail)") {
    if (!fe_test::kCountsMalloc) {
        MESSAGE("not counted: the C allocation functions are counted with glibc and without AddressSanitizer only");
        return;
    }
    // A dynamic-size product whose panels outgrow EIGEN_STACK_ALLOCATION_LIMIT: Eigen takes them from the heap, which
    // the Eigen kernel set's compile-time blocking avoids.
    Eigen::MatrixXf a = Eigen::MatrixXf::Constant(512, 512, 0.25f), c(512, 512);
    const std::size_t before = fe_test::g_malloc_calls.load();
    c.noalias() = a * a;
    CHECK(fe_test::g_malloc_calls.load() > before);
    CHECK(c(0, 0) == doctest::Approx(32.f));
}

TEST_CASE("the Eigen set's GEMM-shaped ops perform zero heap allocations (malloc counted)") {
    REQUIRE_MESSAGE(cpu::active_isa() == cpu::Isa::Eigen, "run with FLOWEDGE_CPU_ISA=eigen (the ctest entry sets it)");
    if (!fe_test::kCountsMalloc) {
        MESSAGE("not counted: the C allocation functions are counted with glibc and without AddressSanitizer only");
        return;
    }
    // All buffers are allocated up front (the 'load'); the first batch also starts the OpenMP pool.
    std::vector<float> x(1 << 20, 0.25f), y(1 << 20), w(1 << 22, 0.01f), small(4096, 0.5f);
    std::vector<std::uint16_t> w16(1 << 22, 0x3c00);
    run_gemm_shaped_ops(x, y, w, w16, small);
    const std::size_t before_malloc = fe_test::g_malloc_calls.load();
    const std::size_t before_mem = Memory<Cpu>::allocation_count().load();
    run_gemm_shaped_ops(x, y, w, w16, small);
    CHECK(fe_test::g_malloc_calls.load() == before_malloc);
    CHECK(Memory<Cpu>::allocation_count().load() == before_mem);
}
