// MathMode on the CPU: TF32 requests compute exactly (bit-identical to F32); BF16 requests take the vdpbf16ps kernels
// of conv1d and linear where the build targets AVX512_BF16 (within the bound documented at MathMode in
// op_params.hpp, against double-accumulating references), and compute exactly everywhere else.
#include <algorithm>
#include <cmath>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "flowedge/workspace.hpp"
#include "ops_test_util.hpp"

using namespace optest;

namespace {

constexpr double kU = 1.0 / 256;               // BF16 unit roundoff, 2^-8
constexpr double kU32 = 1.0 / 16777216;        // F32 unit roundoff, 2^-24
constexpr double kTiny = 2.3509887016445750e-38;  // 2^-125: DAZ/FTZ term per element (see the MathMode doc)

/// gamma_d = d u / (1 - d u) for d = 3 ceil(n / 32) + 6 F32 additions (the doc's accumulation depth).
double gamma_acc(std::size_t n) {
    const double d = 3.0 * double((n + 31) / 32) + 6.0;
    return d * kU32 / (1 - d * kU32);
}

/// One output's references: exact value, value with the operands rounded as the kernel rounds them (BF16
/// activations; BF16 weights for F32/F16 storage), and the magnitudes the bound scales with.
struct Ref {
    double exact = 0, rounded = 0, mag = 0, mag_rounded = 0, tiny = 0;
    void add(double w, double x, bool round_w) {
        const double wr = round_w ? rne_bf16(w) : w, xr = rne_bf16(x);
        exact += w * x;
        rounded += wr * xr;
        mag += std::fabs(w * x);
        mag_rounded += std::fabs(wr * xr);
        tiny += kTiny * (std::fabs(w) + std::fabs(x) + 1);
    }
    /// The MathMode doc's bound on |got - exact| for a reduction of n terms plus bias b.
    double bound(std::size_t n, bool round_w, double b) const {
        const double cw = round_w ? (1 + kU) * (1 + kU) - 1 : kU;
        const double g = gamma_acc(n);
        return (cw + g * (1 + cw)) * mag + g * std::fabs(b) + tiny + 16 * kTiny;
    }
    /// Bound on |got - rounded|: accumulation only (the operand rounding is reproduced exactly).
    double bound_rounded(std::size_t n, double b) const { return gamma_acc(n) * (mag_rounded + std::fabs(b)) + tiny + 16 * kTiny; }
};

struct ConvCase { int batch, cin, cout, lin, kernel, stride, pad; };

/// Runs conv1d with F32, TF32 and BF16 requests; TF32 must equal F32 bit for bit, BF16 must be within the bounds.
void check_conv(const ConvCase& k, DType dt, std::uint32_t seed) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel); CAPTURE(k.stride); CAPTURE(int(dt));
    const int lout = (k.lin + 2 * k.pad - k.kernel) / k.stride + 1;
    const auto x = random_vec(std::size_t(k.batch) * k.cin * k.lin, seed);
    const auto bias = random_vec(k.cout, seed + 1);
    const HostWeights w = make_weights(std::size_t(k.cout) * k.cin * k.kernel, dt, seed + 2, 0.3f);
    const std::size_t ny = std::size_t(k.batch) * k.cout * lout;
    std::vector<float> y_f32(ny, -7.f), y_tf32(ny, 7.f), y_bf16(ny, 7.f);
    Conv1dParams p;
    p.x = x.data();
    p.w = WeightRef{w.bytes.data(), dt};
    p.bias = bias.data();
    p.batch = k.batch; p.in_channels = k.cin; p.out_channels = k.cout; p.in_length = k.lin; p.out_length = lout;
    p.kernel = k.kernel; p.stride = k.stride; p.pad = k.pad;
    p.y = y_f32.data();
    Ops<Cpu>::conv1d(p);
    p.math = MathMode::TF32;
    p.y = y_tf32.data();
    Ops<Cpu>::conv1d(p);
    CHECK(std::memcmp(y_f32.data(), y_tf32.data(), ny * sizeof(float)) == 0);
    p.math = MathMode::BF16;
    p.y = y_bf16.data();
    Ops<Cpu>::conv1d(p);
    if (!kBf16Kernels) {
        CHECK(std::memcmp(y_f32.data(), y_bf16.data(), ny * sizeof(float)) == 0);
        return;
    }
    const bool round_w = dt != DType::BF16;
    const std::size_t n = std::size_t(k.cin) * k.kernel;
    std::size_t bad = 0, bad_rounded = 0, differ = 0;
    double worst = 0;  // largest |err| / bound seen
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int t = 0; t < lout; ++t) {
                Ref r;
                for (int i = 0; i < k.cin; ++i)
                    for (int kk = 0; kk < k.kernel; ++kk) {
                        const int s = t * k.stride + kk - k.pad;
                        if (s < 0 || s >= k.lin) continue;
                        r.add(w.value[(std::size_t(o) * k.cin + i) * k.kernel + kk], x[(std::size_t(b) * k.cin + i) * k.lin + s], round_w);
                    }
                const std::size_t idx = (std::size_t(b) * k.cout + o) * lout + t;
                const double got = y_bf16[idx], bo = bias[std::size_t(o)];
                const double err = std::fabs(got - (r.exact + bo)), bnd = r.bound(n, round_w, bo);
                worst = std::max(worst, err / bnd);
                bad += !(err <= bnd);
                bad_rounded += !(std::fabs(got - (r.rounded + bo)) <= r.bound_rounded(n, bo));
                differ += y_bf16[idx] != y_f32[idx];
            }
    INFO("worst |err| / bound " << worst << ", " << differ << " of " << ny << " outputs differ from F32");
    CHECK(bad == 0);
    CHECK(bad_rounded == 0);
    CHECK(differ > 0);  // the BF16 kernels really ran (random data: rounding moves nearly every output)
}

struct LinearCase { int rows, in, out, ld_x_pad, ld_y_pad; bool bias, accumulate; Activation act; };

void check_linear(const LinearCase& k, DType dt, std::uint32_t seed) {
    CAPTURE(k.rows); CAPTURE(k.in); CAPTURE(k.out); CAPTURE(k.accumulate); CAPTURE(int(k.act)); CAPTURE(int(dt));
    const int ldx = k.in + k.ld_x_pad, ldy = k.out + k.ld_y_pad;
    const auto x = random_vec(std::size_t(k.rows) * ldx + 1, seed);
    const auto bias = random_vec(k.out, seed + 1);
    const auto y0 = random_vec(std::size_t(k.rows) * ldy + 1, seed + 2);
    const HostWeights w = make_weights(std::size_t(k.in) * k.out, dt, seed + 3, 0.5f);
    LinearParams p;
    p.x = x.data();
    p.w = WeightRef{w.bytes.data(), dt};
    p.bias = k.bias ? bias.data() : nullptr;
    p.rows = k.rows; p.in = k.in; p.out = k.out;
    p.ld_x = k.ld_x_pad ? ldx : 0;
    p.ld_y = k.ld_y_pad ? ldy : 0;
    p.act = k.act;
    p.accumulate = k.accumulate;
    std::vector<float> y_f32 = y0, y_tf32 = y0, y_bf16 = y0;
    p.y = y_f32.data();
    Ops<Cpu>::linear(p);
    p.math = MathMode::TF32;
    p.y = y_tf32.data();
    Ops<Cpu>::linear(p);
    CHECK(std::memcmp(y_f32.data(), y_tf32.data(), y0.size() * sizeof(float)) == 0);
    p.math = MathMode::BF16;
    p.y = y_bf16.data();
    Ops<Cpu>::linear(p);
    // Rows of at most 8 elements always take the exact kernel (see LinearParams::math).
    if (!kBf16Kernels || k.in <= 8) {
        CHECK(std::memcmp(y_f32.data(), y_bf16.data(), y0.size() * sizeof(float)) == 0);
        return;
    }
    const bool round_w = dt != DType::BF16;
    std::size_t bad = 0, bad_rounded = 0, differ = 0, touched_pad = 0;
    double worst = 0;
    for (int r = 0; r < k.rows; ++r) {
        for (int o = 0; o < k.out; ++o) {
            Ref ref;
            for (int i = 0; i < k.in; ++i) ref.add(w.value[std::size_t(o) * k.in + i], x[std::size_t(r) * ldx + i], round_w);
            const double bo = k.bias ? bias[std::size_t(o)] : 0.0;
            const std::size_t idx = std::size_t(r) * ldy + o;
            const double old = k.accumulate ? y0[idx] : 0.0;
            const double a = ref_act(k.act, ref.exact + bo), a_r = ref_act(k.act, ref.rounded + bo);
            // Through the activation (slope <= act_slope), then the activation's own and the accumulate's rounding.
            const double tail = 8 * kU32 * (std::fabs(a) + std::fabs(old)) + 1e-30;
            const double bnd = act_slope(k.act) * ref.bound(std::size_t(k.in), round_w, bo) + tail;
            const double bnd_r = act_slope(k.act) * ref.bound_rounded(std::size_t(k.in), bo) + tail;
            const double got = y_bf16[idx];
            const double err = std::fabs(got - (old + a));
            worst = std::max(worst, err / bnd);
            bad += !(err <= bnd);
            bad_rounded += !(std::fabs(got - (old + a_r)) <= bnd_r);
            differ += y_bf16[idx] != y_f32[idx];
        }
        for (int o = k.out; o < ldy; ++o) touched_pad += y_bf16[std::size_t(r) * ldy + o] != y0[std::size_t(r) * ldy + o];
    }
    touched_pad += y_bf16.back() != y0.back();
    INFO("worst |err| / bound " << worst << ", " << differ << " outputs differ from F32");
    CHECK(bad == 0);
    CHECK(bad_rounded == 0);
    CHECK(differ > 0);
    CHECK(touched_pad == 0);
}

}  // namespace

TEST_CASE("Ops<Cpu>::conv1d: TF32 is exact (bit-identical to F32); BF16 is within the MathMode bound") {
    // Odd reduction lengths (7*3, 13*5, 33*5: the last BF16 pair is zero-padded), batch > 1, stride 2, one column,
    // short rows with several columns, column blocks beyond 64, and 520*5 = 2600 reduction elements at 64 columns
    // (two im2col passes of the BF16 panel).
    const ConvCase cases[] = {{1, 8, 12, 16, 5, 1, 2},  {16, 40, 24, 16, 5, 1, 2}, {64, 32, 16, 8, 3, 2, 1},
                              {3, 7, 5, 9, 1, 1, 0},    {2, 7, 9, 11, 3, 2, 1},    {1, 13, 19, 4, 5, 1, 2},
                              {1, 33, 21, 1, 5, 1, 2},  {3, 33, 40, 8, 5, 1, 2},   {2, 100, 37, 15, 3, 2, 1},
                              {8, 64, 29, 16, 5, 1, 2}, {4, 520, 24, 16, 5, 1, 2}, {1, 300, 70, 4, 5, 1, 2}};
    std::uint32_t seed = 40;
    for (const ConvCase& k : cases)
        for (DType dt : kAllDtypes) check_conv(k, dt, seed += 3);
}

TEST_CASE("Ops<Cpu>::linear: TF32 is exact (bit-identical to F32); BF16 is within the MathMode bound") {
    using A = Activation;
    // The Mamba/flow GEMV shapes (1 row: 256->256, 128->512, 256->128, 256->40, 8->256 on the exact kernel), 2-4
    // rows, odd lengths, strides, accumulate, every activation, more than 8 rows (column blocks), more rows than
    // one scratch pass holds (3000-element rows: 10 per pass) and a call large enough for the OpenMP split.
    const LinearCase cases[] = {
        {1, 256, 256, 0, 0, true, false, A::Silu},   {1, 128, 512, 0, 0, false, false, A::None},
        {1, 256, 128, 0, 0, false, true, A::None},   {1, 256, 40, 0, 0, true, false, A::None},
        {1, 8, 256, 0, 0, true, false, A::Softplus}, {4, 128, 512, 3, 5, true, false, A::None},
        {2, 33, 17, 1, 2, true, true, A::Mish},      {3, 9, 70, 0, 0, true, false, A::Silu},
        {4, 65, 31, 0, 0, false, true, A::Softplus}, {5, 300, 45, 7, 0, true, false, A::None},
        {7, 1000, 23, 0, 1, true, true, A::Silu},    {20, 70, 50, 2, 3, true, false, A::Mish},
        {1, 4001, 33, 0, 0, true, false, A::None},   {12, 3000, 200, 0, 0, true, false, A::None},
    };
    std::uint32_t seed = 90;
    for (const LinearCase& k : cases)
        for (DType dt : kAllDtypes) check_linear(k, dt, seed += 5);
}

#ifdef _OPENMP
TEST_CASE("Ops<Cpu> BF16 math gives the same bits with 1 and 2 OpenMP threads") {
    // Threads split output rows; every output keeps its summation order, so the result may not depend on the split.
    const int saved = omp_get_max_threads();
    for (DType dt : kAllDtypes) {
        CAPTURE(int(dt));
        const int C = 512, L = 16, K = 5;  // 21 M multiply-adds: the parallel path
        const auto x = random_vec(std::size_t(C) * L, 7), bias = random_vec(C, 8);
        const HostWeights w = make_weights(std::size_t(C) * C * K, dt, 9, 0.1f);
        Conv1dParams p;
        p.x = x.data(); p.w = WeightRef{w.bytes.data(), dt}; p.bias = bias.data();
        p.in_channels = C; p.out_channels = C; p.in_length = L; p.out_length = L; p.kernel = K; p.pad = 2;
        p.math = MathMode::BF16;
        const auto xl = random_vec(12 * 3000, 10);
        const HostWeights wl = make_weights(std::size_t(200) * 3000, dt, 11, 0.1f);
        LinearParams q;
        q.x = xl.data(); q.w = WeightRef{wl.bytes.data(), dt}; q.bias = bias.data();
        q.rows = 12; q.in = 3000; q.out = 200; q.act = Activation::Silu; q.math = MathMode::BF16;
        std::vector<float> y1(std::size_t(C) * L), y2(y1.size()), z1(12 * 200), z2(z1.size());
        omp_set_num_threads(1);
        p.y = y1.data(); Ops<Cpu>::conv1d(p);
        q.y = z1.data(); Ops<Cpu>::linear(q);
        omp_set_num_threads(2);
        p.y = y2.data(); Ops<Cpu>::conv1d(p);
        q.y = z2.data(); Ops<Cpu>::linear(q);
        CHECK(y1 == y2);
        CHECK(z1 == z2);
    }
    omp_set_num_threads(saved);
}
#endif

TEST_CASE("Context carries MathMode::F32 by default") {
    const Context<Cpu> ctx{};
    CHECK(ctx.math == MathMode::F32);
    const Conv1dParams p{};
    CHECK(p.math == MathMode::F32);
    const LinearParams q{};
    CHECK(q.math == MathMode::F32);
}
