// The CPU's many-row linear weights (Storage::ManyRowsMatrix; kernels/packed_gemm.hpp's F32Groups layout) through
// Ops<Cpu>::linear: the same bits as the small-row F32 layout (Storage::SmallRowsMatrix) on the same call, for every
// row count (the GEMM tile's edge rows and groups, 1-row calls included), epilogue, stride, k-slice split and thread
// count; the layout taken only where the exact tile applies; set_math repacks it in place; no heap allocation after
// load.
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../support/counting_new.hpp"
#include "ops_test_util.hpp"

using namespace optest;
using flowedge::cpu::PackedLayout;

namespace {

bool simd_set() { return cpu::active_isa() == cpu::Isa::Avx2 || cpu::active_isa() == cpu::Isa::Avx512; }

/// A weight as a Linear of storage kind s holds it: the stored [out, in] tensor plus the CPU's prepared copy.
struct Prepared {
    HostWeights w;
    std::unique_ptr<PreparedWeight> pw;
    Prepared(Storage s, DType dt, int in, int out, std::uint32_t seed) : w(make_weights(std::size_t(out) * in, dt, seed)) {
        pw = Ops<Cpu>::prepare_weight(s, w.ref(), Shape{out, in}, "test weight");
    }
    const cpu::PackedWeight& packed() const { return *static_cast<const cpu::PackedWeight*>(pw.get()); }
    WeightRef ref() const { return {w.bytes.data(), w.dtype, pw.get()}; }
};

/// One call's inputs; x's row gaps hold NaN (a read past in turns the output NaN), y's a sentinel that must survive.
struct Call {
    int rows, in, out, ldx, ldy;
    bool bias, accumulate;
    Activation act;
    std::vector<float> x, b, y0;
    Call(int rows_, int in_, int out_, std::uint32_t seed) : rows(rows_), in(in_), out(out_) {
        act = seed % 3 == 0 ? Activation::None : seed % 3 == 1 ? Activation::Relu : Activation::Silu;
        bias = (seed / 3) % 2 == 0;
        accumulate = (seed / 6) % 2 == 1;
        const bool strided = (seed / 12) % 2 == 1;
        ldx = strided ? in + 3 : in;
        ldy = strided ? out + 5 : out;
        auto ops = strided_linear_operands(rows, in, out, ldx, ldy, seed, -12345.f);
        x = std::move(ops.x);
        b = std::move(ops.b);
        y0 = std::move(ops.y0);
    }
    std::vector<float> run(const WeightRef& w, MathMode m = MathMode::F32) const {
        std::vector<float> y = y0;
        LinearParams p;
        p.x = x.data();
        p.w = w;
        p.bias = bias ? b.data() : nullptr;
        p.y = y.data();
        p.rows = rows;
        p.in = in;
        p.out = out;
        p.ld_x = ldx == in ? 0 : ldx;
        p.ld_y = ldy == out ? 0 : ldy;
        p.act = act;
        p.accumulate = accumulate;
        p.math = m;
        Ops<Cpu>::linear(p);
        return y;
    }
};

/// Whether the kernel set sums an output of this weight in one chain on the small-row layout (packed_chains_for == 1),
/// where the group layout applies: at least half of kPackAcc output vectors.
bool groups_fit(int out) {
    const int lanes = cpu::active_isa() == cpu::Isa::Avx512 ? 16 : 8, acc = cpu::active_isa() == cpu::Isa::Avx512 ? 16 : 8;
    return (out + lanes - 1) / lanes * 2 >= acc;
}

}  // namespace

TEST_CASE("many-row packed linear: the GEMM group layout gives the small-row layout's bits at every row count") {
    if (!simd_set()) return;
    struct Shape {
        int in, out;
    };
    // in: one k step, under / over / across the 128-step slices; out: a single vector, groups ending inside a group
    // and inside a vector, both loop orders (in > out: k slices outer).
    std::uint32_t seed = 1;
    for (const Shape sh : {Shape{1, 200}, Shape{7, 129}, Shape{300, 200}, Shape{257, 257}, Shape{700, 130}, Shape{130, 1100},
                           Shape{64, 40}, Shape{33, 16}})
        for (DType dt : kAllDtypes) {
            const Prepared many(Storage::ManyRowsMatrix, dt, sh.in, sh.out, seed), small(Storage::SmallRowsMatrix, dt, sh.in, sh.out, seed);
            const bool groups = dt != DType::BF16 && groups_fit(sh.out);
            INFO("in " << sh.in << " out " << sh.out << " dtype " << dtype_name(dt));
            CHECK((many.packed().layout() == PackedLayout::F32Groups) == groups);
            if (!groups) CHECK(many.packed().layout() == small.packed().layout());
            CHECK(many.packed().bytes() == small.packed().bytes());
            for (int rows : {1, 2, 4, 5, 6, 7, 13, 41}) {
                const Call c(rows, sh.in, sh.out, seed++);
                INFO("rows " << rows << " act " << int(c.act) << " bias " << c.bias << " acc " << c.accumulate << " ldx " << c.ldx);
                const auto y = c.run(many.ref());
                CHECK(bit_mismatches(y, c.run(small.ref())) == 0);
                for (int r = 0; r < rows; ++r)
                    for (int o = sh.out; o < c.ldy; ++o) CHECK(y[std::size_t(r) * c.ldy + o] == -12345.f);
            }
        }
}

TEST_CASE("many-row packed linear: calls above 2^22 multiply-adds split over threads with the same bits") {
    if (!simd_set()) return;
    // 100 x 300 -> 1100 = 33 M multiply-adds; 69 (AVX-512) or 138 (AVX2) output vectors split unevenly, inside groups.
    const Prepared many(Storage::ManyRowsMatrix, DType::F32, 300, 1100, 7), small(Storage::SmallRowsMatrix, DType::F32, 300, 1100, 7);
    REQUIRE(many.packed().layout() == PackedLayout::F32Groups);
    const Call c(100, 300, 1100, 5);
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
    const auto y1 = c.run(many.ref());
    CHECK(bit_mismatches(y1, c.run(small.ref())) == 0);
#ifdef _OPENMP
    for (int nt : {2, 3}) {
        omp_set_num_threads(nt);
        INFO("threads " << nt);
        CHECK(bit_mismatches(c.run(many.ref()), y1) == 0);
    }
    omp_set_num_threads(saved);
#endif
}

TEST_CASE("many-row packed linear: set_math repacks in place, no heap allocation after load; FLOWEDGE_CPU_GEMM_GROUPS=0") {
    if (!simd_set()) return;
    Prepared many(Storage::ManyRowsMatrix, DType::F32, 256, 512, 11), small(Storage::SmallRowsMatrix, DType::F32, 256, 512, 11);
    REQUIRE(many.packed().layout() == PackedLayout::F32Groups);
    const Call c(30, 256, 512, 2);
    const auto want = c.run(small.ref());
    std::vector<float> y = c.y0;
    LinearParams p;
    p.x = c.x.data();
    p.w = many.ref();
    p.bias = c.b.data();
    p.y = y.data();
    p.rows = c.rows;
    p.in = c.in;
    p.out = c.out;
    p.act = c.act;
    const std::size_t news0 = fe_test::g_operator_new_calls.load(), mem0 = Memory<Cpu>::allocation_count().load();
    for (MathMode m : {MathMode::F32, MathMode::BF16, MathMode::TF32, MathMode::F32}) {
        many.pw->set_math(m);
        if (!many.packed().serves(m)) continue;  // BF16 math without the BF16 layout's conditions: the row-major kernels
        p.math = m;
        Ops<Cpu>::linear(p);
    }
    CHECK(fe_test::g_operator_new_calls.load() == news0);
    CHECK(Memory<Cpu>::allocation_count().load() == mem0);
    CHECK(many.packed().layout() == PackedLayout::F32Groups);
    many.pw->set_math(MathMode::BF16);
    if (cpu::bf16_math_available()) CHECK(many.packed().layout() != PackedLayout::F32Groups);
    many.pw->set_math(MathMode::F32);
    CHECK(bit_mismatches(c.run(many.ref()), want) == 0);

    setenv("FLOWEDGE_CPU_GEMM_GROUPS", "0", 1);
    const Prepared old(Storage::ManyRowsMatrix, DType::F32, 256, 512, 11);
    unsetenv("FLOWEDGE_CPU_GEMM_GROUPS");
    CHECK(old.packed().layout() == PackedLayout::F32);
    CHECK(bit_mismatches(c.run(old.ref()), want) == 0);
}
