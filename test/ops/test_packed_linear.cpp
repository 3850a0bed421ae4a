// The CPU's small-row packed linear (cpu::PackedWeight, Storage::SmallRowsMatrix; kernels/packed_linear.hpp) through
// Ops<Cpu>::linear: the packed axpy kernels against
// double references with the bound of their sequential sum, next to Ops<Cpu>::linear on the same inputs; row
// independence (a row of an R-row call equals the same row alone, bit for bit); exact modes equal across weight
// dtypes; MathMode::BF16 against a double emulation of BF16-rounded operands with the packed chain's bound; repacking
// in set_math; no heap allocation after pack().
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../support/counting_new.hpp"
#include "ops_test_util.hpp"

using namespace optest;
using flowedge::cpu::PackedLayout;

namespace {

/// A small-row weight as a Linear holds it: the stored [out, in] tensor plus the CPU's packed copy, run through
/// Ops<Cpu>::linear (which takes the packed kernels whenever the copy serves the call's math mode).
class PackedLinear {
public:
    /// Whether this process's kernel set has the packed kernels (AVX2 or AVX-512).
    static bool available() {
        const cpu::Isa i = cpu::active_isa();
        return i == cpu::Isa::Avx2 || i == cpu::Isa::Avx512;
    }
    void pack(WeightRef w, int in, int out, MathMode m) {
        m_src = w;
        m_pw = cpu::PackedWeight::small_rows(w, in, out, cpu::active_isa(), m);
    }
    void set_math(MathMode m) {
        if (m_pw) m_pw->set_math(m);
    }
    bool serves(MathMode m) const { return m_pw && m_pw->serves(m); }
    bool packed() const { return m_pw && m_pw->layout() != PackedLayout::None; }
    PackedLayout layout() const { return m_pw ? m_pw->layout() : PackedLayout::None; }
    std::size_t bytes() const { return m_pw ? m_pw->bytes() : 0; }
    /// Ops<Cpu>::linear with p's weight replaced by this one; the packed copy must serve p.math.
    void linear(LinearParams p) const {
        REQUIRE(serves(p.math));
        p.w = {m_src.data, m_src.dtype, m_pw.get()};
        Ops<Cpu>::linear(p);
    }

private:
    WeightRef m_src{};
    std::unique_ptr<cpu::PackedWeight> m_pw;
};

constexpr double kU32 = 1.0 / 16777216;  // 2^-24, F32 unit roundoff
constexpr double kU = 1.0 / 256;         // 2^-8, BF16 unit roundoff
constexpr double kTiny = 2.3509887016445750e-38;  // 2^-125: DAZ/FTZ term per element (MathMode doc)

double gamma_seq(double d) { return d * kU32 / (1 - d * kU32); }

const int kIns[] = {1, 7, 8, 9, 33, 128, 256, 300};  // 300: the many-row GEMM tiles run two k slices
const int kOuts[] = {1, 15, 16, 17, 40, 256, 512};
const Activation kActs[] = {Activation::None, Activation::Silu, Activation::Softplus, Activation::Mish};

/// One linear call's inputs, with strides and the gaps between rows poisoned: x gaps hold NaN (a kernel that reads
/// x[in] or past it turns the output NaN), y gaps a sentinel that must survive.
struct Case {
    int rows, in, out, ldx, ldy;
    bool bias, accumulate;
    Activation act;
    HostWeights w;
    std::vector<float> x, b, y0;
    static constexpr float kSentinel = -12345.f;

    Case(DType dt, int rows_, int in_, int out_, std::uint32_t seed)
        : rows(rows_), in(in_), out(out_), w(make_weights(std::size_t(out_) * in_, dt, seed)) {
        // Cycle through the epilogue options with the seed so every combination occurs across the shape sweep.
        act = kActs[seed % 4];
        bias = (seed / 4) % 2 == 0;
        accumulate = (seed / 8) % 2 == 1;
        const bool strided = (seed / 16) % 2 == 1 || rows == 9;
        ldx = strided ? in + 3 : in;
        ldy = strided ? out + 5 : out;
        auto ops = strided_linear_operands(rows, in, out, ldx, ldy, seed, kSentinel);
        x = std::move(ops.x);
        b = std::move(ops.b);
        y0 = std::move(ops.y0);
    }

    LinearParams params(const float* xp, float* yp, int nrows, MathMode m) const {
        LinearParams p;
        p.x = xp;
        p.w = {w.bytes.data(), w.dtype};
        p.bias = bias ? b.data() : nullptr;
        p.y = yp;
        p.rows = nrows;
        p.in = in;
        p.out = out;
        p.ld_x = ldx == in ? 0 : ldx;
        p.ld_y = ldy == out ? 0 : ldy;
        p.act = act;
        p.accumulate = accumulate;
        p.math = m;
        return p;
    }
};

/// Reference of one output and the bound of a computation whose pre-activation error is at most
/// gpre * (sum |w'||x'| + |bias|) (+ tiny) around `pre` (w', x' the operands that computation multiplies):
/// then the activation (|act'| <= act_slope, plus its own few-ulp error, allowed as 16 ulp of the result) and
/// the accumulate add (one rounding).
struct OutRef {
    double want, bound;
};
OutRef finish(const Case& c, double pre, double mag, double gpre, double tiny, double y_old) {
    const double a = ref_act(c.act, pre);
    const double e_pre = gpre * mag + tiny;
    double bound = act_slope(c.act) * e_pre + (c.act == Activation::None ? 0.0 : 16 * kU32 * std::fabs(a));
    double want = a;
    if (c.accumulate) {
        want = y_old + a;
        bound += kU32 * (std::fabs(y_old) + std::fabs(a) + bound);
    }
    return {want, bound + 1e-37};
}

/// Checks y (rows x ldy) against per-output references; gaps must hold the sentinel.
template <class RefFn>
void check_outputs(const Case& c, const std::vector<float>& y, RefFn ref, const char* what) {
    std::size_t bad = 0, bad_gap = 0;
    double worst = 0;
    std::string first;
    for (int r = 0; r < c.rows; ++r) {
        for (int o = 0; o < c.out; ++o) {
            const std::size_t k = std::size_t(r) * c.ldy + o;
            const OutRef e = ref(r, o);
            const double d = std::fabs(double(y[k]) - e.want);
            worst = std::max(worst, d / e.bound);
            if (!(d <= e.bound)) {
                if (!bad)
                    first = "first at row " + std::to_string(r) + " output " + std::to_string(o) + ": got " + std::to_string(y[k]) +
                            " want " + std::to_string(e.want) + " bound " + std::to_string(e.bound);
                ++bad;
            }
        }
        for (int o = c.out; o < c.ldy; ++o) bad_gap += y[std::size_t(r) * c.ldy + o] != Case::kSentinel;
    }
    INFO(what << ": dtype " << dtype_name(c.w.dtype) << " rows " << c.rows << " in " << c.in << " out " << c.out << " act "
              << int(c.act) << " bias " << c.bias << " acc " << c.accumulate << " ldx " << c.ldx << " ldy " << c.ldy
              << ": " << bad << " outputs out of bound (worst " << worst << " of the bound) " << first);
    CHECK(bad == 0);
    CHECK(bad_gap == 0);
}

/// Exact reference: pre = bias + sum w x (double), sequential-sum bound gamma_in: in FMAs, one rounding each, on a
/// chain that starts at the bias. Ops<Cpu>::linear sums in another order (vector lanes, reduction tree, bias
/// last): any order of in products (each rounded once where not fused) plus a bias is within gamma_{in+1}.
OutRef exact_ref(const Case& c, int r, int o, double gpre) {
    double s = c.bias ? c.b[std::size_t(o)] : 0.0, mag = std::fabs(s);
    for (int i = 0; i < c.in; ++i) {
        const double t = c.w.value[std::size_t(o) * c.in + i] * double(c.x[std::size_t(r) * c.ldx + i]);
        s += t;
        mag += std::fabs(t);
    }
    return finish(c, s, mag, gpre, 0.0, c.y0[std::size_t(r) * c.ldy + o]);
}

/// BF16-math reference: operands rounded as the kernel rounds them (x always; F32/F16 weights at pack time), exact
/// products summed in double; the packed chain adds 2 products per vdpbf16ps to a lane sum started at the bias, so
/// d = 2*ceil(in/2) roundings (gamma_d), plus the DAZ/FTZ term of the MathMode doc.
OutRef bf16_ref(const Case& c, int r, int o) {
    double s = c.bias ? c.b[std::size_t(o)] : 0.0, mag = std::fabs(s), tiny = 16 * kTiny;
    const bool round_w = c.w.dtype != DType::BF16;
    for (int i = 0; i < c.in; ++i) {
        const double wv = c.w.value[std::size_t(o) * c.in + i], xv = c.x[std::size_t(r) * c.ldx + i];
        const double t = (round_w ? rne_bf16(wv) : wv) * rne_bf16(xv);
        s += t;
        mag += std::fabs(t);
        tiny += kTiny * (std::fabs(wv) + std::fabs(xv) + 1);
    }
    return finish(c, s, mag, gamma_seq(2.0 * ((c.in + 1) / 2)), tiny, c.y0[std::size_t(r) * c.ldy + o]);
}

/// Runs pk on the case's rows (all at once), returns y.
std::vector<float> run_packed(const PackedLinear& pk, const Case& c, MathMode m) {
    std::vector<float> y = c.y0;
    pk.linear(c.params(c.x.data(), y.data(), c.rows, m));
    return y;
}

/// Each row alone (1-row calls) must give the same bits as in the R-row call.
void check_rows_independent(const PackedLinear& pk, const Case& c, const std::vector<float>& y_all, MathMode m) {
    std::size_t diff = 0;
    std::vector<float> y1(std::size_t(c.ldy));
    for (int r = 0; r < c.rows; ++r) {
        std::copy_n(c.y0.begin() + std::ptrdiff_t(r) * c.ldy, c.ldy, y1.begin());
        pk.linear(c.params(c.x.data() + std::size_t(r) * c.ldx, y1.data(), 1, m));
        diff += std::memcmp(y1.data(), y_all.data() + std::size_t(r) * c.ldy, std::size_t(c.out) * sizeof(float)) != 0;
    }
    INFO("rows " << c.rows << " in " << c.in << " out " << c.out << " dtype " << dtype_name(c.w.dtype));
    CHECK(diff == 0);
}

}  // namespace

TEST_CASE("packed linear, exact math: within the sequential-sum bound; Ops<Cpu>::linear within its bound; rows independent") {
    if (!PackedLinear::available()) {
        MESSAGE("no AVX2/AVX-512 in this build: PackedLinear keeps nothing");
        return;
    }
    std::uint32_t seed = 1;
    for (DType dt : kAllDtypes)
        for (int rows = 1; rows <= 9; ++rows)
            for (int in : kIns)
                for (int out : kOuts) {
                    const Case c(dt, rows, in, out, seed++);
                    PackedLinear pk;
                    pk.pack({c.w.bytes.data(), dt}, in, out, MathMode::F32);
                    REQUIRE(pk.serves(MathMode::F32));
                    CHECK(pk.layout() == (dt == DType::BF16 ? PackedLayout::Pairs : PackedLayout::F32));
                    const auto y = run_packed(pk, c, MathMode::F32);
                    check_outputs(c, y, [&](int r, int o) { return exact_ref(c, r, o, gamma_seq(in)); }, "packed");
                    std::vector<float> y_ops = c.y0;
                    Ops<Cpu>::linear(c.params(c.x.data(), y_ops.data(), rows, MathMode::F32));
                    check_outputs(c, y_ops, [&](int r, int o) { return exact_ref(c, r, o, gamma_seq(in + 1)); }, "Ops<Cpu>::linear");
                    if (rows > 1) check_rows_independent(pk, c, y, MathMode::F32);
                    // TF32 is exact on the CPU: same layout, same bits.
                    REQUIRE(pk.serves(MathMode::TF32));
                    CHECK(run_packed(pk, c, MathMode::TF32) == y);
                }
}

TEST_CASE("packed linear, exact math: BF16 pairs and widened F16 give the bits of F32 weights with the same values") {
    if (!PackedLinear::available()) return;
    std::uint32_t seed = 500;
    for (DType dt : {DType::BF16, DType::F16})
        for (int in : kIns)
            for (int out : {1, 17, 40, 256}) {
                const int rows = 1 + int(seed % 5);
                const Case c(dt, rows, in, out, seed++);
                // The same weights stored as F32 (exactly representable).
                std::vector<float> wf(c.w.value.begin(), c.w.value.end());
                PackedLinear pk16, pk32;
                pk16.pack({c.w.bytes.data(), dt}, in, out, MathMode::F32);
                pk32.pack({wf.data(), DType::F32}, in, out, MathMode::F32);
                INFO("dtype " << dtype_name(dt) << " in " << in << " out " << out);
                CHECK(run_packed(pk16, c, MathMode::F32) == run_packed(pk32, c, MathMode::F32));
            }
}

TEST_CASE("packed linear, MathMode::BF16: emulated BF16 operands within the packed chain bound; in <= 8 stays exact") {
    if (!PackedLinear::available()) return;
    std::uint32_t seed = 900;
    for (DType dt : kAllDtypes)
        for (int rows : {1, 2, 3, 4, 5, 9})
            for (int in : kIns)
                for (int out : kOuts) {
                    const Case c(dt, rows, in, out, seed++);
                    PackedLinear pk;
                    pk.pack({c.w.bytes.data(), dt}, in, out, MathMode::BF16);
                    REQUIRE(pk.serves(MathMode::BF16));
                    const auto y = run_packed(pk, c, MathMode::BF16);
                    if (kBf16Kernels && in > 8) {
                        // vdpbf16ps on the Pairs layout, or AMX tiles where the CPU and OS have them.
                        CHECK(pk.layout() == (cpu::amx_bf16_available() ? PackedLayout::PairTiles : PackedLayout::Pairs));
                        check_outputs(c, y, [&](int r, int o) { return bf16_ref(c, r, o); }, "packed bf16");
                        // And the MathMode doc's form against the exact value: (c + g(1 + c)) S + g|b| + tiny, with the
                        // packed chain d = 2 ceil(in/2) (+1 for accumulate, covered by finish's extra rounding).
                        const double cw = dt == DType::BF16 ? kU : 2 * kU + kU * kU, g = gamma_seq(2.0 * ((in + 1) / 2));
                        check_outputs(c, y, [&](int r, int o) {
                            double s = c.bias ? c.b[std::size_t(o)] : 0.0, S = 0, tiny = 16 * kTiny;
                            for (int i = 0; i < in; ++i) {
                                const double wv = c.w.value[std::size_t(o) * in + i], xv = c.x[std::size_t(r) * c.ldx + i];
                                s += wv * xv;
                                S += std::fabs(wv * xv);
                                tiny += kTiny * (std::fabs(wv) + std::fabs(xv) + 1);
                            }
                            const double gb = (cw + g * (1 + cw)) * S + g * (c.bias ? std::fabs(c.b[std::size_t(o)]) : 0.0) + tiny;
                            // finish() scales its first argument by gpre * mag: pass the whole bound as mag, gpre = 1.
                            return finish(c, s, gb, 1.0, 0.0, c.y0[std::size_t(r) * c.ldy + o]);
                        }, "packed bf16 vs exact");
                    } else {
                        // No vdpbf16ps path (in <= 8 or no AVX512_BF16): BF16 requests compute exactly, F32 bits.
                        PackedLinear pk32;
                        pk32.pack({c.w.bytes.data(), dt}, in, out, MathMode::F32);
                        CHECK(y == run_packed(pk32, c, MathMode::F32));
                    }
                    if (rows > 1) check_rows_independent(pk, c, y, MathMode::BF16);
                }
}

TEST_CASE("packed linear: set_math repacks in place; the layout serves only its own mode; bad calls are errors") {
    if (!PackedLinear::available()) return;
    for (DType dt : kAllDtypes) {
        const Case c(dt, 4, 33, 40, 77);
        PackedLinear pk;
        pk.pack({c.w.bytes.data(), dt}, 33, 40, MathMode::F32);
        const auto y32 = run_packed(pk, c, MathMode::F32);
        const std::size_t bytes = pk.bytes();
        pk.set_math(MathMode::BF16);
        CHECK(pk.bytes() == bytes);  // same buffer
        CHECK(pk.serves(MathMode::BF16));
        const auto ybf = run_packed(pk, c, MathMode::BF16);
        if (kBf16Kernels) {
            CHECK(ybf != y32);
            // F32/F16 weights now hold rounded pairs: exact math is no longer served (the Linear falls back); BF16
            // weights serve it from the Pairs layout, not from AMX's tile order.
            CHECK(pk.serves(MathMode::F32) == (dt == DType::BF16 && pk.layout() == PackedLayout::Pairs));
        }
        pk.set_math(MathMode::F32);
        CHECK(run_packed(pk, c, MathMode::F32) == y32);  // repacked to the very same copy
        PackedLinear fresh;
        fresh.pack({c.w.bytes.data(), dt}, 33, 40, MathMode::BF16);
        CHECK(run_packed(fresh, c, MathMode::BF16) == ybf);

        std::vector<float> y = c.y0;
        LinearParams p = c.params(c.x.data(), y.data(), 4, MathMode::F32);
        p.in = 32;
        CHECK_THROWS_WITH_AS(pk.linear(p), doctest::Contains("shape differs from the packed weights"), Error);
        p = c.params(c.x.data(), y.data(), 4, MathMode::F32);
        p.ld_x = 20;
        CHECK_THROWS_WITH_AS(pk.linear(p), doctest::Contains("row stride"), Error);
        p = c.params(nullptr, y.data(), 4, MathMode::F32);
        CHECK_THROWS_WITH_AS(pk.linear(p), doctest::Contains("null x, w or y pointer"), Error);
        p = c.params(nullptr, nullptr, 0, MathMode::F32);
        CHECK_NOTHROW(pk.linear(p));  // zero rows: nothing to do
    }
    PackedLinear none;
    CHECK_FALSE(none.serves(MathMode::F32));
    CHECK(none.bytes() == 0);
    none.set_math(MathMode::BF16);  // before pack(): nothing
    CHECK_FALSE(none.packed());
}

TEST_CASE("packed linear: no heap allocation after pack (calls in every mode, set_math repacks)") {
    if (!PackedLinear::available()) return;
    const Case c(DType::F32, 9, 256, 512, 3), cb(DType::BF16, 4, 128, 40, 4);
    PackedLinear pk, pkb;
    pk.pack({c.w.bytes.data(), DType::F32}, 256, 512, MathMode::F32);
    pkb.pack({cb.w.bytes.data(), DType::BF16}, 128, 40, MathMode::F32);
    std::vector<float> y = c.y0, yb = cb.y0;
    const std::size_t news0 = fe_test::g_operator_new_calls.load(), mem0 = Memory<Cpu>::allocation_count().load();
    for (MathMode m : {MathMode::F32, MathMode::BF16, MathMode::TF32, MathMode::F32}) {
        pk.set_math(m);
        pkb.set_math(m);
        pk.linear(c.params(c.x.data(), y.data(), 9, m));
        pkb.linear(cb.params(cb.x.data(), yb.data(), 4, m));
    }
    CHECK(fe_test::g_operator_new_calls.load() == news0);
    CHECK(Memory<Cpu>::allocation_count().load() == mem0);
}

TEST_CASE("packed linear: calls above 2^22 multiply-adds split outputs over threads with the same bits") {
    if (!PackedLinear::available()) return;
    for (DType dt : kAllDtypes)
        for (MathMode m : {MathMode::F32, MathMode::BF16}) {
            // 37 x 256 -> 500 = 4.7 M multiply-adds: above the threshold; 500 outputs split unevenly over 3 threads.
            const Case c(dt, 37, 256, 500, 11 + int(dt));
            PackedLinear pk;
            pk.pack({c.w.bytes.data(), dt}, 256, 500, m);
#ifdef _OPENMP
            const int saved = omp_get_max_threads();
            omp_set_num_threads(1);
#endif
            const auto y1 = run_packed(pk, c, m);
#ifdef _OPENMP
            for (int nt : {2, 3}) {
                omp_set_num_threads(nt);
                INFO("dtype " << dtype_name(dt) << " math " << int(m) << " threads " << nt);
                CHECK(run_packed(pk, c, m) == y1);
            }
            omp_set_num_threads(saved);
#endif
            check_rows_independent(pk, c, y1, m);  // 1-row calls stay on one thread: same bits again
        }
}

TEST_CASE("packed linear, exact math: many-row GEMM (panel copies, both loop orders, k slices, edge tiles) keeps each row's bits") {
    if (!PackedLinear::available()) return;
    // in > out (k slices outer) and in <= out (output groups outer); in not a multiple of the 128-step slices; out
    // ending inside a block and a group; row counts leaving partial row tiles; strided rows (seed / 16 odd).
    struct Shape {
        int rows, in, out;
    };
    std::uint32_t seed = 900;
    for (const Shape sh : {Shape{41, 700, 200}, Shape{23, 300, 1100}, Shape{100, 257, 257}})
        for (int k = 0; k < 2; ++k) {
            const Case c(DType::F32, sh.rows, sh.in, sh.out, seed);
            seed += 17;
            PackedLinear pk;
            pk.pack({c.w.bytes.data(), DType::F32}, sh.in, sh.out, MathMode::F32);
            const auto y = run_packed(pk, c, MathMode::F32);
            check_outputs(c, y, [&](int r, int o) { return exact_ref(c, r, o, gamma_seq(sh.in)); }, "packed GEMM");
            check_rows_independent(pk, c, y, MathMode::F32);
        }
}
