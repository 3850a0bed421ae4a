// Activations, axpby, concat_channels, unnormalize, sinusoid and embedding on every backend vs naive double loops
// written from the PyTorch/LeRobot definitions, a non-CPU backend also vs Ops<Cpu>; the CPU's vector exp/log and
// activations (cpu/math.hpp) to the ulp; and the shared argument checks.
#include "ops_test_util.hpp"

#include <algorithm>
#include <cfloat>
#include <cstddef>
#include <initializer_list>
#include <tuple>
#include <utility>

using namespace optest;

namespace {
constexpr Activation kActs[] = {Activation::None, Activation::Silu, Activation::Mish, Activation::Softplus, Activation::Relu};
}  // namespace

TEST_CASE_TEMPLATE("activation: ReLU keeps NaN and inf like torch.relu, zeroes negatives", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    // 19 values: a full vector on both SIMD widths plus a masked tail, with the special values in both parts.
    const std::vector<float> x = {NAN, -NAN, INFINITY, -INFINITY, -0.f, 0.f, -1e-40f, 1e-40f, -3.5f, 2.25f,
                                  -1.f, 1.f, NAN, -7.f, 7.f, -FLT_MAX, FLT_MAX, NAN, -2.f};
    Dev<float, B> dx(x), dy(x.size());
    Ops<B>::activation({dx.ptr(), dy.ptr(), std::int64_t(x.size()), Activation::Relu});
    const auto y = dy.host(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        CAPTURE(i);
        CAPTURE(x[i]);
        if (std::isnan(x[i])) CHECK(std::isnan(y[i]));
        else CHECK(y[i] == (x[i] > 0.f ? x[i] : 0.f));
    }
}

TEST_CASE_TEMPLATE("activation: SiLU, Mish, Softplus (threshold 20), ReLU over a wide range", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    std::vector<float> x;
    for (float v = -90.f; v <= 90.f; v += 0.37f) x.push_back(v);
    for (float v : {0.f, -0.f, 19.999f, 20.f, 20.0001f, 25.f, -20.f, 1e-6f, -1e-6f}) x.push_back(v);
    for (Activation a : kActs) {
        CAPTURE(int(a));
        std::vector<double> ref(x.size()), scale(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
            ref[i] = ref_act(a, x[i]);
            scale[i] = std::fabs(ref[i]) + 1e-30;
        }
        Dev<float, B> dx(x), dy(x.size());
        ActivationParams p;
        p.x = dx.ptr(); p.y = dy.ptr(); p.n = std::int64_t(x.size()); p.act = a;
        Ops<B>::activation(p);
        check_all(dy.host(x.size()), ref, scale, 2e-6, "activation");
        p.y = dx.ptr();  // in place
        Ops<B>::activation(p);
        check_all(dx.host(x.size()), ref, scale, 2e-6, "activation in place");
    }
    // PyTorch's threshold: softplus(x) == x exactly above 20.
    Dev<float, B> d(std::vector<float>{20.5f, 30.f});
    ActivationParams p;
    p.x = d.ptr(); p.y = d.ptr(); p.n = 2; p.act = Activation::Softplus;
    Ops<B>::activation(p);
    const auto h = d.host(2);
    CHECK(h[0] == 20.5f);
    CHECK(h[1] == 30.f);
}

TEST_CASE_TEMPLATE("activation on lengths around the vector widths and launch grids, out of place and in place", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    for (std::int64_t n : {std::int64_t(1), std::int64_t(37), std::int64_t(1029), std::int64_t(70001)}) {
        CAPTURE(n);
        const auto x = random_vec(std::size_t(n), 41u, -30.f, 30.f);
        for (Activation a : kActs) {
            CAPTURE(int(a));
            std::vector<double> ref(x.size()), scale(x.size());
            for (std::size_t i = 0; i < x.size(); ++i) {
                ref[i] = ref_act(a, x[i]);
                scale[i] = std::fabs(ref[i]) + 1e-30;
            }
            Dev<float, B> dx(x), dy(x.size());
            Ops<B>::activation({dx.ptr(), dy.ptr(), n, a});
            Ops<B>::activation({dx.ptr(), dx.ptr(), n, a});  // in place
            const auto got = dy.host(x.size()), got_in_place = dx.host(x.size());
            check_all(got, ref, scale, 2e-6, "activation");
            check_all(got_in_place, ref, scale, 2e-6, "activation in place");
            if constexpr (!kIsCpu<B>) {
                std::vector<float> cpu(x.size());
                Ops<Cpu>::activation({x.data(), cpu.data(), n, a});
                check_elementwise(got, cpu, 4e-6, 1e-30, "activation vs cpu");
                check_elementwise(got_in_place, cpu, 4e-6, 1e-30, "activation in place vs cpu");
            }
        }
    }
}

TEST_CASE_TEMPLATE("axpby, concat_channels, unnormalize, embedding", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    SUBCASE("axpby with aliasing and a null y") {
        for (std::size_t n : {std::size_t(1), std::size_t(37), std::size_t(1029), std::size_t(70001)}) {
            CAPTURE(n);
            const auto x = random_vec(n, 5), y = random_vec(n, 6);
            Dev<float, B> dx(x), dy(y), dout(n);
            AxpbyParams p;
            p.x = dx.ptr(); p.y = dy.ptr(); p.out = dout.ptr(); p.n = std::int64_t(n); p.a = 0.75f; p.b = -1.5f;
            Ops<B>::axpby(p);
            std::vector<double> ref(n), sc(n);
            for (std::size_t i = 0; i < n; ++i) {
                ref[i] = 0.75 * x[i] - 1.5 * y[i];
                sc[i] = std::fabs(0.75 * x[i]) + std::fabs(1.5 * y[i]);
            }
            const auto got = dout.host(n);
            check_all(got, ref, sc, 2e-7, "axpby");
            if constexpr (!kIsCpu<B>) {
                std::vector<float> cpu(n);
                Ops<Cpu>::axpby({x.data(), y.data(), cpu.data(), std::int64_t(n), 0.75f, -1.5f});
                check_elementwise(got, cpu, 1e-6, 1e-6, "axpby vs cpu");
            }
            p.out = dy.ptr();  // out aliases y
            Ops<B>::axpby(p);
            check_all(dy.host(n), ref, sc, 2e-7, "axpby out=y");
            p.y = nullptr; p.b = 0.f; p.out = dx.ptr();  // scale in place
            Ops<B>::axpby(p);
            for (std::size_t i = 0; i < n; ++i) ref[i] = 0.75 * x[i], sc[i] = std::fabs(ref[i]);
            check_all(dx.host(n), ref, sc, 2e-7, "axpby null y");
            // y null, in place, a = 2: exact, so bit for bit.
            Dev<float, B> dx2(x);
            Ops<B>::axpby({dx2.ptr(), nullptr, dx2.ptr(), std::int64_t(n), 2.f, 0.f});
            std::vector<float> twice(n);
            for (std::size_t i = 0; i < n; ++i) twice[i] = 2.f * x[i];
            CHECK(bit_mismatches(dx2.host(n), twice) == 0);
        }
    }
    SUBCASE("concat_channels") {
        for (auto [batch, ca, cb, L] : {std::tuple{3, 5, 7, 4}, std::tuple{2, 3, 5, 7}, std::tuple{1, 2048, 2048, 4}, std::tuple{3, 1, 0, 9}}) {
            CAPTURE(batch); CAPTURE(ca); CAPTURE(cb); CAPTURE(L);
            const auto a = random_vec(std::size_t(batch) * ca * L, 7), b = random_vec(std::size_t(batch) * cb * L + 1, 8);
            Dev<float, B> da(a), db(b), dy(std::size_t(batch) * (ca + cb) * L);
            ConcatParams p;
            p.a = da.ptr(); p.b = db.ptr(); p.y = dy.ptr(); p.batch = batch; p.ca = ca; p.cb = cb; p.length = L;
            Ops<B>::concat_channels(p);
            const auto y = dy.host(std::size_t(batch) * (ca + cb) * L);
            std::size_t wrong = 0;
            for (int bb = 0; bb < batch; ++bb)
                for (int c = 0; c < ca + cb; ++c)
                    for (int t = 0; t < L; ++t) {
                        const float want = c < ca ? a[(std::size_t(bb) * ca + c) * L + t] : b[(std::size_t(bb) * cb + c - ca) * L + t];
                        wrong += std::memcmp(&y[(std::size_t(bb) * (ca + cb) + c) * L + t], &want, sizeof(float)) != 0;
                    }
            CHECK(wrong == 0);  // a copy: bit for bit
        }
    }
    SUBCASE("unnormalize") {
        struct Case { int rows; std::vector<float> mn, mx; };
        for (const Case& k : {Case{7, {-1.f, 10.f, 0.5f}, {3.f, 510.f, 0.75f}}, Case{16, {13.456f, -2.5f}, {496.14f, 7.25f}}}) {
            const int rows = k.rows, dim = int(k.mn.size());
            CAPTURE(rows); CAPTURE(dim);
            const auto x = random_vec(std::size_t(rows) * dim, 9);
            Dev<float, B> dx(x), dmn(k.mn), dmx(k.mx), dy(std::size_t(rows) * dim);
            UnnormalizeParams p;
            p.x = dx.ptr(); p.y = dy.ptr(); p.min = dmn.ptr(); p.max = dmx.ptr(); p.rows = rows; p.dim = dim;
            Ops<B>::unnormalize(p);
            std::vector<double> ref(std::size_t(rows) * dim), sc(ref.size());
            for (int r = 0; r < rows; ++r)
                for (int d = 0; d < dim; ++d) {
                    ref[r * dim + d] = (x[r * dim + d] + 1.0) / 2.0 * (k.mx[d] - k.mn[d]) + k.mn[d];
                    sc[r * dim + d] = std::fabs(k.mx[d]) + std::fabs(k.mn[d]);
                }
            const auto got = dy.host(ref.size());
            check_all(got, ref, sc, 4e-7, "unnormalize");
            if constexpr (!kIsCpu<B>) {
                std::vector<float> cpu(ref.size());
                Ops<Cpu>::unnormalize({x.data(), cpu.data(), k.mn.data(), k.mx.data(), rows, dim});
                check_elementwise(got, cpu, 1e-6, 1e-6, "unnormalize vs cpu");
            }
        }
    }
    SUBCASE("embedding in every dtype") {
        struct Case { int vocab, dim; std::vector<std::int32_t> ids; };
        for (const Case& k : {Case{11, 37, {3, 0, 10, 3, 7}}, Case{37, 129, {0, 36, 5, 5, 17, 1, 36}}})
            for (DType dt : kAllDtypes) {
                CAPTURE(k.vocab); CAPTURE(k.dim); CAPTURE(dtype_name(dt));
                const int dim = k.dim;
                const HostWeights t = make_weights(std::size_t(k.vocab) * dim, dt, 77);
                Dev<std::int32_t, B> di(k.ids);
                DevWeights<B> dtab(t);
                Dev<float, B> dy(k.ids.size() * dim);
                EmbeddingParams p;
                p.ids = di.ptr(); p.table = dtab.ref(); p.y = dy.ptr(); p.rows = int(k.ids.size()); p.dim = dim;
                Ops<B>::embedding(p);
                const auto y = dy.host(k.ids.size() * dim);
                std::size_t wrong = 0;  // the widened stored value, exactly
                for (std::size_t r = 0; r < k.ids.size(); ++r)
                    for (int i = 0; i < dim; ++i) wrong += double(y[r * dim + i]) != t.value[std::size_t(k.ids[r]) * dim + i];
                CHECK(wrong == 0);
            }
    }
}

TEST_CASE_TEMPLATE("sinusoid follows the float32 recipe of LeRobot's SinusoidalPosEmb", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    // One time in every row, and a falling run of times (a sampler's timesteps: t, t - 10, ...).
    for (const auto& [t0, dt] : {std::pair{0.f, 0.f}, {1.f, 0.f}, {37.f, 0.f}, {99.f, 0.f}, {99.f, -10.f}, {0.f, 3.f}}) {
        CAPTURE(t0); CAPTURE(dt);
        const int half = 64, rows = 3;
        Dev<float, B> d(std::size_t(rows) * 2 * half);
        SinusoidParams p;
        p.t = t0; p.t_step = dt; p.out = d.ptr(); p.rows = rows; p.half = half; p.denom = float(half - 1);
        Ops<B>::sinusoid(p);
        const auto y = d.host(std::size_t(rows) * 2 * half);
        for (int r = 0; r < rows; ++r)
            for (int i = 0; i < half; ++i) {
                // exact f_i = 10000^(-i/63); the float32 recipe rounds t*f_i, so allow |t*f| * 1e-6 + 1e-6 absolute
                const double t = double(t0) + r * double(dt);
                const double f = std::pow(10000.0, -double(i) / (half - 1));
                const double tol = std::fabs(t * f) * 1e-6 + 1e-6;
                CHECK(std::fabs(y[std::size_t(r) * 2 * half + i] - std::sin(t * f)) <= tol);
                CHECK(std::fabs(y[std::size_t(r) * 2 * half + half + i] - std::cos(t * f)) <= tol);
            }
        if constexpr (!kIsCpu<B>) {
            std::vector<float> cpu(y.size());
            p.out = cpu.data();
            Ops<Cpu>::sinusoid(p);
            check_elementwise(y, cpu, 0.0, 4e-6, "sinusoid vs cpu");
        }
    }
}

TEST_CASE_TEMPLATE("elementwise ops reject bad counts, sizes and null pointers with the shared message" * doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(64);
    float* d = buf.ptr();
    CHECK_THROWS_WITH_AS(Ops<B>::activation({d, d, -1, Activation::Silu}),
                         "flowedge: activation: negative element count (expected >= 0, got -1)", Error);
    CHECK_THROWS_WITH_AS(Ops<B>::activation({d, nullptr, 4, Activation::Silu}), "flowedge: activation: null x or y pointer", Error);
    CHECK_THROWS_WITH_AS(Ops<B>::axpby({d, d, d, -2, 1.f, 1.f}), "flowedge: axpby: negative element count (expected >= 0, got -2)", Error);
    CHECK_THROWS_WITH_AS(Ops<B>::axpby({d, d, nullptr, 4, 1.f, 1.f}), "flowedge: axpby: null x or out pointer", Error);
    CHECK_THROWS_WITH_AS(Ops<B>::axpby({d, nullptr, d, 4, 1.f, 0.5f}), "flowedge: axpby: y is null but b is not zero", Error);
    CHECK_THROWS_WITH_AS(Ops<B>::concat_channels({d, d, d, 1, -1, 2, 4}),
                         "flowedge: concat_channels: sizes must be positive (expected batch > 0, ca >= 0, cb >= 0, length > 0, got batch 1, "
                         "ca -1, cb 2, length 4)",
                         Error);
    CHECK_THROWS_WITH_AS(Ops<B>::concat_channels({d, nullptr, d, 1, 2, 2, 4}), "flowedge: concat_channels: null a, b or y pointer", Error);
    SinusoidParams s;
    s.out = d; s.rows = 2; s.half = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::sinusoid(s), "flowedge: sinusoid: sizes must be positive (expected rows >= 0, half > 0, got rows 2, half 0)",
                         Error);
    s.half = 4; s.out = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::sinusoid(s), "flowedge: sinusoid: null out pointer", Error);
    Dev<std::int32_t, B> ids(std::vector<std::int32_t>{0, 1});
    EmbeddingParams e;
    e.ids = ids.ptr(); e.table = {d, DType::F32}; e.y = d + 32; e.rows = 2; e.dim = -3;
    CHECK_THROWS_WITH_AS(Ops<B>::embedding(e), "flowedge: embedding: sizes must be positive (expected rows >= 0, dim > 0, got rows 2, dim -3)",
                         Error);
    e.dim = 4;
    e.table.dtype = static_cast<DType>(3);
    CHECK_THROWS_WITH_AS(Ops<B>::embedding(e), "flowedge: embedding: unknown table dtype (expected F32, BF16 or F16, got 3)", Error);
    e.table.dtype = DType::F32;
    e.ids = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::embedding(e), "flowedge: embedding: null ids, table or y pointer", Error);
    UnnormalizeParams u{d, d, d, nullptr, 2, 2};
    CHECK_THROWS_WITH_AS(Ops<B>::unnormalize(u), "flowedge: unnormalize: null x, y, min or max pointer", Error);
    u.max = d; u.dim = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::unnormalize(u), "flowedge: unnormalize: sizes must be positive (expected rows >= 0, dim > 0, got rows 2, dim 0)",
                         Error);
    Memory<B>::synchronize();
}

// ---- The vector exp/log/activations of each SIMD kernel set (cpu/arch/avx2.hpp, cpu/arch/avx512.hpp) ----
#if defined(FLOWEDGE_CPU_X86)
namespace {
/// The SIMD kernel sets this CPU runs (each is tested, whichever the process uses).
std::vector<cpu::Isa> simd_sets() {
    const cpu::CpuFeatures f = cpu::detect_cpu_features();
    std::vector<cpu::Isa> sets;
    if (f.avx2) sets.push_back(cpu::Isa::Avx2);
    if (f.avx512) sets.push_back(cpu::Isa::Avx512);
    return sets;
}
int lanes(cpu::Isa set) { return set == cpu::Isa::Avx512 ? 16 : 8; }

enum class VecFn { Exp, Log };
/// fn applied to every element of x by `set`'s vector form (x padded with 1 to a multiple of 16).
std::vector<float> apply_vec(cpu::Isa set, VecFn fn, std::vector<float> x) {
    const std::size_t n = x.size();
    x.resize((n + 15) / 16 * 16, 1.f);
    if (set == cpu::Isa::Avx512) (fn == VecFn::Exp ? cpu::avx512::vexp_inplace : cpu::avx512::vlog_inplace)(x.data(), x.size());
    else (fn == VecFn::Exp ? cpu::avx2::vexp_inplace : cpu::avx2::vlog_inplace)(x.data(), x.size());
    x.resize(n);
    return x;
}
/// `set`'s activate_inplace.
void activate_in(cpu::Isa set, Activation a, float* v, long long n) {
    if (set == cpu::Isa::Avx512) cpu::avx512::activate_inplace(a, v, n);
    else cpu::avx2::activate_inplace(a, v, n);
}

/// Spacing of floats in the binade of |r| (2^-149, the denormal step, below FLT_MIN).
double ulp_at(double r) {
    r = std::fabs(r);
    if (r < double(FLT_MIN)) return std::ldexp(1.0, -149);
    int e;
    std::frexp(r, &e);
    return std::ldexp(1.0, e - 24);
}

/// Every kSweepStride-th float (by bit pattern) with |x| <= lim, both signs, then `extra`: ~21,000 points per binade,
/// every binade from the denormals up: dense enough for the ulp bounds, and a finer stride costs minutes under the
/// sanitizers.
constexpr std::uint32_t kSweepStride = 389;
std::vector<float> float_sweep(float lim, std::initializer_list<float> extra) {
    std::vector<float> x;
    for (std::uint32_t b = 0; b < 0x7f800000u; b += kSweepStride) {
        float f;
        std::memcpy(&f, &b, sizeof f);
        if (f > lim) break;
        x.push_back(f);
        x.push_back(-f);
    }
    x.insert(x.end(), extra.begin(), extra.end());
    return x;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
}  // namespace

TEST_CASE("vexp: <= 1.02 ulp for normal results, <= 1 denormal step below FLT_MIN, clamped to [-104, 88.7] like the AVX-512 form") {
    for (cpu::Isa set : simd_sets()) {
        CAPTURE(cpu::isa_name(set));
        const float lo = -104.f, hi = 88.7f;
        const auto x = float_sweep(120.f, {lo, std::nextafter(lo, -200.f), std::nextafter(lo, 0.f), -103.97208f, -87.336548f,
                                          -87.33655f, hi, std::nextafter(hi, 0.f), std::nextafter(hi, 200.f), 88.72284f, 1e30f,
                                          -1e30f, FLT_MAX, -FLT_MAX, FLT_MIN, 0.f, -0.f});
        const auto y = apply_vec(set, VecFn::Exp, x);
        const float top = apply_vec(set, VecFn::Exp, {hi})[0];
        CHECK(std::isfinite(top));
        CHECK(std::fabs(double(top) - std::exp(double(hi))) <= 1.02 * ulp_at(std::exp(double(hi))));
        std::size_t bad = 0;
        double worst = 0, worst_den = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
            if (x[i] > hi) { bad += !same_bits(y[i], top); continue; }     // clamp: exp(88.7), finite
            if (x[i] < lo) { bad += !same_bits(y[i], 0.f); continue; }     // clamp: exp(-104) rounds to +0
            const double r = std::exp(double(x[i])), err = std::fabs(double(y[i]) - r);
            if (r >= double(FLT_MIN)) worst = std::max(worst, err / ulp_at(r));
            else worst_den = std::max(worst_den, err / std::ldexp(1.0, -149));
        }
        INFO("max " << worst << " ulp (normal results), " << worst_den << " denormal steps");
        CHECK(bad == 0);
        CHECK(worst <= 1.02);  // exhaustive over all floats in range (17:59 UTC 2026-12-03, AVX2): 1.0103
        CHECK(worst_den <= 1.0);  // exhaustive: 0.75
        // NaN and infinities, as the AVX-512 form: NaN propagates (the clamp passes it through), +inf saturates at the
        // clamp's exp(88.7), -inf gives 0.
        const auto s = apply_vec(set, VecFn::Exp, {NAN, -NAN, INFINITY, -INFINITY});
        CHECK(std::isnan(s[0]));
        CHECK(std::isnan(s[1]));
        CHECK(same_bits(s[2], top));
        CHECK(same_bits(s[3], 0.f));
    }
}

TEST_CASE("vlog: <= 0.9 ulp over positive normal floats, log(1) = 0") {
    for (cpu::Isa set : simd_sets()) {
        CAPTURE(cpu::isa_name(set));
        std::vector<float> x;
        for (std::uint32_t b = 0x00800000u; b < 0x7f800000u; b += kSweepStride) {
            float f;
            std::memcpy(&f, &b, sizeof f);
            x.push_back(f);
        }
        for (float v : {1.f, std::nextafter(1.f, 2.f), std::nextafter(1.f, 0.f), 1.41421356f, 1.41421366f, 0.70710677f, 2.f,
                        FLT_MIN, FLT_MAX, 3.4e38f})
            x.push_back(v);
        const auto y = apply_vec(set, VecFn::Log, x);
        double worst = 0;
        std::size_t bad = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
            const double r = std::log(double(x[i]));
            if (r == 0) bad += !same_bits(y[i], 0.f);
            else worst = std::max(worst, std::fabs(double(y[i]) - r) / ulp_at(r));
        }
        INFO("max " << worst << " ulp");
        CHECK(bad == 0);
        CHECK(worst <= 0.9);  // exhaustive over positive normal floats (AVX2): 0.8265
    }
}

TEST_CASE("vector SiLU / Softplus / Mish: close to the definitions over +-130, NaN and inf as documented, exact tails") {
    for (cpu::Isa set : simd_sets()) {
        CAPTURE(cpu::isa_name(set));
        std::vector<float> x = float_sweep(130.f, {-104.f, -103.9f, -88.7f, -88.8f, -87.3f, 88.7f, 88.8f, 19.999f, 20.f, 20.0001f,
                                                   -20.f, 9.f, -9.f, 1e-30f, -1e-30f, 1e-40f, -1e-40f});
        if (x.size() % lanes(set) == 0) x.push_back(0.5f);  // one masked tail in the sweep itself
        for (Activation a : {Activation::Silu, Activation::Softplus, Activation::Mish}) {
            CAPTURE(int(a));
            std::vector<float> y = x;
            activate_in(set, a, y.data(), static_cast<long long>(y.size()));
            std::size_t bad = 0, first = 0;
            double worst = 0;
            for (std::size_t i = 0; i < x.size(); ++i) {
                const double r = ref_act(a, x[i]), err = std::fabs(double(y[i]) - r);
                bool ok;
                if (a == Activation::Silu && x[i] < -88.7f) {
                    // exp(-x) is clamped at exp(88.7) = 3.3e38, so the result is x / 3.3e38 (|.| < 4e-37; exact < 1e-36).
                    ok = y[i] <= 0.f && y[i] >= -4e-37f;
                } else if (a == Activation::Mish) {
                    // Below FLT_MIN e = exp(x) is a denormal with few bits; x e carries up to |x| / 2 steps of 2^-149.
                    ok = err <= 6 * ulp_at(r) + 64 * std::ldexp(1.0, -149);
                    if (std::fabs(r) >= double(FLT_MIN)) worst = std::max(worst, err / ulp_at(r));
                } else {
                    ok = err <= 4 * ulp_at(r);
                    worst = std::max(worst, err / ulp_at(r));
                }
                if (!ok && bad++ == 0) first = i;
            }
            INFO(bad << " out of bound, first x = " << x[first] << " got " << y[first] << " want " << ref_act(a, x[first])
                     << "; max " << worst << " ulp (normal results)");
            CHECK(bad == 0);  // measured (AVX2): SiLU 2.25 ulp, Softplus 2.98, Mish 4.23 (normal results)
            // Tails: every length 1 .. 2 lanes(set) + 1 gives the lanes' bits of the full-vector run and writes nothing past n.
            for (int n = 1; n <= 2 * lanes(set) + 1; ++n) {
                std::vector<float> buf(std::size_t(n + lanes(set)), -7.f);
                std::copy(x.begin(), x.begin() + n, buf.begin());
                activate_in(set, a, buf.data(), n);
                for (int i = 0; i < n; ++i) CHECK(same_bits(buf[std::size_t(i)], y[std::size_t(i)]));
                for (int i = n; i < n + lanes(set); ++i) CHECK(buf[std::size_t(i)] == -7.f);
            }
        }
        // NaN / inf (the same in the AVX-512 and AVX2 forms): SiLU, Softplus and Mish propagate NaN like the scalar forms;
        // SiLU(-inf) = -inf (scalar: NaN), Mish(-inf) = NaN.
        auto act = [&](Activation a, float v) {
            activate_in(set, a, &v, 1);
            return v;
        };
        CHECK(std::isnan(act(Activation::Silu, NAN)));
        CHECK(act(Activation::Silu, INFINITY) == INFINITY);
        CHECK(act(Activation::Silu, -INFINITY) == -INFINITY);
        CHECK(std::isnan(act(Activation::Softplus, NAN)));
        CHECK(act(Activation::Softplus, INFINITY) == INFINITY);
        CHECK(same_bits(act(Activation::Softplus, -INFINITY), 0.f));
        CHECK(std::isnan(act(Activation::Mish, NAN)));
        CHECK(act(Activation::Mish, INFINITY) == INFINITY);
        CHECK(std::isnan(act(Activation::Mish, -INFINITY)));
        // ReLU: NaN stays NaN (torch.relu), infinities and signed zeros as max(0, x).
        CHECK(std::isnan(act(Activation::Relu, NAN)));
        CHECK(act(Activation::Relu, INFINITY) == INFINITY);
        CHECK(same_bits(act(Activation::Relu, -INFINITY), 0.f));
        CHECK(same_bits(act(Activation::Relu, -5.f), 0.f));
        CHECK(act(Activation::Relu, 3.f) == 3.f);
    }
}
#endif
