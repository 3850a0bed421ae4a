// MathMode on every backend. CPU: TF32 requests compute exactly (bit-identical to F32); BF16 requests take the
// vdpbf16ps kernels of conv1d and linear where the build targets AVX512_BF16 (within the bound documented at MathMode
// in op_params.hpp, against double-accumulating references), and compute exactly everywhere else. CUDA (builds with
// flowedge::cuda, skipped without a device): the tensor-core conv1d (cuda::conv1d_mma, TF32/BF16) on odd and
// PushT-like shapes, batch 1..64, F32/BF16/F16 weights, every block tile (incl. the sm_90 cluster split-K tiles):
// per-output error bound derived from the unit roundoff and Kg, full coverage of the output (NaN-poisoned), no writes
// past it, bitwise reproducibility, the routing rule of Ops<Cuda>::conv1d; the cuBLASLt paths (cuda::conv1d_gemm,
// cuda::linear_gemm) on the same footing with their own bounds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "flowedge/workspace.hpp"
#include "../support/conv_case.hpp"
#include "cpu_packed_util.hpp"
#include "ops_test_util.hpp"

#ifdef FLOWEDGE_WITH_CUDA
#include <cuda_runtime.h>

#include "../cuda/cuda_test_util.hpp"
#include "flowedge/cuda/launchers.hpp"
#endif

// The CPU and CUDA halves each use their own test helpers (optest, flowedge::test), so each lives in a namespace
// that brings in only its own.
namespace math_mode_cpu {

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
/// The packed BF16-block kernel's depth (kernels/packed_conv_dot.hpp): per slice of up to 128 steps one chain of two
/// roundings per vdpbf16ps pair, the slices added to a running total, then the bias: min(n, 128) + ceil(n / 128) + 2.
double gamma_packed(std::size_t n) {
    const double d = double(std::min<std::size_t>(n, 128) + (n + 127) / 128 + 2);
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
    /// The MathMode doc's bound on |got - exact| for a reduction of n terms plus bias b (g: gamma of the depth).
    double bound(std::size_t n, bool round_w, double b) const { return bound_g(gamma_acc(n), round_w, b); }
    double bound_g(double g, bool round_w, double b) const {
        const double cw = round_w ? (1 + kU) * (1 + kU) - 1 : kU;
        return (cw + g * (1 + cw)) * mag + g * std::fabs(b) + tiny + 16 * kTiny;
    }
    /// Bound on |got - rounded|: accumulation only (the operand rounding is reproduced exactly).
    double bound_rounded(std::size_t n, double b) const { return bound_rounded_g(gamma_acc(n), b); }
    double bound_rounded_g(double g, double b) const { return g * (mag_rounded + std::fabs(b)) + tiny + 16 * kTiny; }
};

using fe_test::ConvCase;

/// Which kernel a packed BF16 check_conv runs for its BF16 request: Ops<Cpu>::conv1d's choice, or one of the two
/// packed BF16-block kernels of the AVX-512 set called directly.
enum class BhKernel { Dispatch, Vector, Amx };

/// Runs conv1d with F32, TF32 and BF16 requests; TF32 must equal F32 bit for bit, BF16 must be within the bounds.
/// packed: on the weights as Ops<Cpu> prepares a Conv1d weight (packed blocks in the x86 sets): BF16 blocks run
/// MathMode::BF16 on vdpbf16ps (or AMX tiles) at the packed kernel's depth, F32 and F16 blocks stay exact.
/// kernel (packed BF16 blocks only): the BF16 request on that kernel; returns the BF16 outputs.
std::vector<float> check_conv(const ConvCase& k, DType dt, std::uint32_t seed, bool packed = false,
                              BhKernel kernel = BhKernel::Dispatch) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel); CAPTURE(k.stride); CAPTURE(int(dt));
    const int lout = k.conv_out();
    const auto x = random_vec(std::size_t(k.batch) * k.cin * k.lin, seed);
    const auto bias = random_vec(k.cout, seed + 1);
    const HostWeights w = make_weights(std::size_t(k.cout) * k.cin * k.kernel, dt, seed + 2, 0.3f);
    const std::size_t ny = std::size_t(k.batch) * k.cout * lout;
    std::vector<float> y_f32(ny, -7.f), y_tf32(ny, 7.f), y_bf16(ny, 7.f);
    Conv1dParams p = fe_test::conv1d_params(k, x.data(), WeightRef{w.bytes.data(), dt}, bias.data());
    const auto pw = packed ? Ops<Cpu>::prepare_weight(Storage::ConvWeight, p.w, Shape{k.cout, k.cin, k.kernel}, "test weight") : nullptr;
    if (pw) p.w = WeightRef{nullptr, dt, pw.get()};
    p.y = y_f32.data();
    Ops<Cpu>::conv1d(p);
    p.math = MathMode::TF32;
    p.y = y_tf32.data();
    Ops<Cpu>::conv1d(p);
    CHECK(std::memcmp(y_f32.data(), y_tf32.data(), ny * sizeof(float)) == 0);
    p.math = MathMode::BF16;
    p.y = y_bf16.data();
#if defined(FLOWEDGE_CPU_X86)
    if (kernel != BhKernel::Dispatch) {
        REQUIRE((pw && dt == DType::BF16 && cpu::active_isa() == cpu::Isa::Avx512));
        const auto* blocks = static_cast<const bf16*>(cpu::packed_weight(p.w)->data());
        if (kernel == BhKernel::Amx) cpu::avx512::packed_dot::amx::conv1d_bh_amx(p, blocks);
        else cpu::avx512::packed_dot::conv1d_bh(p, blocks);
    } else
#endif
        Ops<Cpu>::conv1d(p);
    // BF16 blocks at <= kExactBf16MaxCols columns run the exact 512-bit kernel where it is on (Intel AVX-512 CPUs).
    bool exact_blocks = false;
#if defined(FLOWEDGE_CPU_X86)
    exact_blocks = pw && dt == DType::BF16 && kernel == BhKernel::Dispatch && cpu::active_isa() == cpu::Isa::Avx512 &&
                   cpu::avx512::packed_bf16_zmm::enabled() && k.batch * lout <= cpu::avx512::packed_bf16_zmm::kExactBf16MaxCols;
#endif
    if (!kBf16Kernels || (pw && dt != DType::BF16) || exact_blocks) {
        CHECK(std::memcmp(y_f32.data(), y_bf16.data(), ny * sizeof(float)) == 0);
        return y_bf16;
    }
    const bool round_w = dt != DType::BF16;
    const std::size_t n = std::size_t(k.cin) * k.kernel;
    const double g = pw ? gamma_packed(n) : gamma_acc(n);
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
                const double err = std::fabs(got - (r.exact + bo)), bnd = r.bound_g(g, round_w, bo);
                worst = std::max(worst, err / bnd);
                bad += !(err <= bnd);
                bad_rounded += !(std::fabs(got - (r.rounded + bo)) <= r.bound_rounded_g(g, bo));
                differ += y_bf16[idx] != y_f32[idx];
            }
    INFO("worst |err| / bound " << worst << ", " << differ << " of " << ny << " outputs differ from F32");
    CHECK(bad == 0);
    CHECK(bad_rounded == 0);
    CHECK(differ > 0);  // the BF16 kernels really ran (random data: rounding moves nearly every output)
    return y_bf16;
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
    // The same on the weights as the process's kernel set prepares them (packed blocks on x86: BF16 blocks on the
    // vdpbf16ps kernel of kernels/packed_conv_dot.hpp, whole-row panels of up to 64 columns, 24-output blocks).
    for (const ConvCase& k : cases)
        for (DType dt : kAllDtypes) check_conv(k, dt, seed += 3, /*packed=*/true);
}

TEST_CASE("conv1d on AMX tiles (MathMode::BF16, BF16 blocks): within the packed bound at odd sizes, any thread count") {
    if (!cpu::amx_bf16_available()) {
        MESSAGE("kernel set " << cpu::kernel_set_name() << ": no AMX-BF16 (or FLOWEDGE_CPU_AMX=0), AMX kernel not run");
        return;
    }
#if defined(FLOWEDGE_CPU_X86)
    // Columns (batch * out_length) 1, 5, 16, 17, 31, 32, 33, 40 and 75 (one or two 16-row column tiles, passes of 32,
    // a last pass of fewer); reductions that are not a multiple of 32 steps (a partial last tile), odd (a half pair),
    // longer than one 128-step slice, and 2600 / 10240 steps (fewer columns per pass: the 2048-channel PushT conv);
    // outputs that are not a multiple of the 24-output block (and of 16).
    const ConvCase cases[] = {{1, 3, 5, 1, 1, 1, 0},      {1, 7, 9, 5, 3, 1, 1},    {1, 13, 19, 16, 5, 1, 2},
                              {1, 33, 37, 17, 5, 1, 2},   {1, 40, 24, 31, 3, 1, 1}, {2, 25, 50, 16, 5, 1, 2},
                              {3, 64, 23, 11, 5, 1, 2},   {5, 9, 17, 15, 1, 1, 0},  {3, 100, 70, 50, 3, 2, 1},
                              {4, 520, 24, 16, 5, 1, 2},  {1, 2048, 29, 4, 5, 1, 2}};
    std::uint32_t seed = 700;
    for (const ConvCase& k : cases) {
        const std::vector<float> y1 = check_conv(k, DType::BF16, seed += 3, /*packed=*/true, BhKernel::Amx);
        std::vector<float> y2;
        with_threads(2, [&] { y2 = check_conv(k, DType::BF16, seed, /*packed=*/true, BhKernel::Amx); });
        CHECK(y1 == y2);  // each output's order does not depend on the thread split
        const std::vector<float> yv = check_conv(k, DType::BF16, seed, /*packed=*/true, BhKernel::Vector);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < yv.size(); ++i) differ += yv[i] != y1[i];
        MESSAGE("AMX vs vdpbf16ps kernel: " << differ << " of " << yv.size() << " outputs differ");
    }
#endif
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

}  // namespace math_mode_cpu

#ifdef FLOWEDGE_WITH_CUDA
namespace math_mode_cuda {

using namespace flowedge;
using namespace flowedge::test;


namespace {

int device_major() {
    int dev = 0, major = 0;
    REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
    REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess);
    return major;
}

struct Shape1d {
    int batch, in, out, len, k, stride, pad;
};

/// Per-output bound of kernels/cuda/conv_mma.cu: ((2u + u^2) + (ceil(Kg/kK) + kK + 1) * 2^-23) * (|bias| + sum|w||x|)
/// + 2^-23 * |y|. u = 2^-11 (TF32: 10 stored mantissa bits, round to nearest) or 2^-8 (BF16: 7 bits); kK = 8 / 16
/// (the K of one MMA step). TF32 at Kg = 20480: 1.3e-3 of sum|w||x|; BF16: 8.0e-3.
double rel_bound(MathMode m, int kg) {
    const double u = m == MathMode::TF32 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    const int kk = m == MathMode::TF32 ? 8 : 16;
    return 2 * u + u * u + double((kg + kk - 1) / kk + kk + 1) * std::ldexp(1.0, -23);
}

struct Case {
    Shape1d s;
    int out_len = 0;
    std::vector<float> x, bias;
    Weights w;
    std::vector<double> ref, mag;  // exact result and |bias| + sum|w||x| per output

    Case(const Shape1d& sh, DType dt, std::uint32_t seed)
        : s(sh),
          out_len((sh.len + 2 * sh.pad - sh.k) / sh.stride + 1),
          x(random_vec(std::size_t(sh.batch) * sh.in * sh.len, seed)),
          bias(random_vec(sh.out, seed + 2)),
          w(random_vec(std::size_t(sh.out) * sh.in * sh.k, seed + 1, -1.f / std::sqrt(float(sh.in * sh.k)),
                       1.f / std::sqrt(float(sh.in * sh.k))),
            dt) {
        ref.assign(std::size_t(s.batch) * s.out * out_len, 0.0);
        mag.assign(ref.size(), 0.0);
        for (int b = 0; b < s.batch; ++b)
            for (int o = 0; o < s.out; ++o) {
                const float* wo = w.widened.data() + std::size_t(o) * s.in * s.k;
                for (int t = 0; t < out_len; ++t) {
                    double acc = bias[o], m = std::fabs(double(bias[o]));
                    for (int i = 0; i < s.in; ++i) {
                        const float* xr = x.data() + (std::size_t(b) * s.in + i) * s.len;
                        for (int kk = 0; kk < s.k; ++kk) {
                            const int pos = t * s.stride + kk - s.pad;
                            if (pos < 0 || pos >= s.len) continue;
                            const double p = double(wo[i * s.k + kk]) * xr[pos];
                            acc += p;
                            m += std::fabs(p);
                        }
                    }
                    ref[(std::size_t(b) * s.out + o) * out_len + t] = acc;
                    mag[(std::size_t(b) * s.out + o) * out_len + t] = m;
                }
            }
    }

    Conv1dParams params(MathMode m) const {
        Conv1dParams p;
        p.batch = s.batch; p.in_channels = s.in; p.out_channels = s.out; p.in_length = s.len; p.out_length = out_len;
        p.kernel = s.k; p.stride = s.stride; p.pad = s.pad; p.math = m;
        return p;
    }
    int kg() const { return s.in * s.k; }
};

constexpr int kGuard = 64;  // floats past the output that must stay untouched

/// Runs `launch(p)` on the device for case c (x, bias, w, ref) with p's pointers set and y NaN-poisoned plus a guard
/// tail; returns y (without the guard).
template <class C, class P, class F>
std::vector<float> run_poisoned(const C& c, P p, F&& launch) {
    const std::size_t n_out = c.ref.size();
    std::vector<float> init(n_out + kGuard, std::numeric_limits<float>::quiet_NaN());
    for (int g = 0; g < kGuard; ++g) init[n_out + std::size_t(g)] = 1234.5f + float(g);
    DeviceArray<float> dx(c.x), dbias(c.bias), dy(init);
    p.x = dx.get(); p.w = c.w.gpu(); p.bias = dbias.get(); p.y = dy.get();
    launch(p);
    std::vector<float> y = dy.download();
    for (int g = 0; g < kGuard; ++g) CHECK(y[n_out + std::size_t(g)] == 1234.5f + float(g));
    y.resize(n_out);
    return y;
}

template <class F>
std::vector<float> run_device(const Case& c, MathMode m, F&& launch) { return run_poisoned(c, c.params(m), launch); }

/// Every output within rb * (|bias| + sum|w||x|) + 2^-23 |y| (NaN fails); returns the largest error / bound ratio seen.
/// C: a case with ref and mag (|bias| + sum|w||x|) per output.
template <class C>
double check_within(const C& c, const std::vector<float>& y, double rb) {
    double worst = 0;
    std::size_t n_bad = 0, first_bad = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
        const double err = std::fabs(double(y[i]) - c.ref[i]);
        const double bound = rb * c.mag[i] + std::ldexp(std::fabs(c.ref[i]), -23) + 1e-30;
        if (!(err <= bound)) {
            if (n_bad++ == 0) first_bad = i;
        }
        if (std::isfinite(err)) worst = std::max(worst, err / bound);
    }
    CAPTURE(first_bad);
    CHECK(n_bad == 0);
    return worst;
}

/// check_within at conv_mma.cu's bound for math mode m.
double check_bound(const Case& c, const std::vector<float>& y, MathMode m) { return check_within(c, y, rel_bound(m, c.kg())); }

void run_case(const Shape1d& sh, DType dt, std::uint32_t seed) {
    CAPTURE(sh.batch); CAPTURE(sh.in); CAPTURE(sh.out); CAPTURE(sh.len); CAPTURE(sh.k); CAPTURE(sh.stride); CAPTURE(sh.pad);
    CAPTURE(int(dt));
    const Case c(sh, dt, seed);
    for (MathMode m : {MathMode::TF32, MathMode::BF16}) {
        CAPTURE(int(m));
        for (int tile = 0; tile <= 5; ++tile) {
            if (tile >= 4 && device_major() < 9) continue;  // 4, 5: 128x128 cluster split-K (S = 2, 4), sm_90 only
            CAPTURE(tile);
            const auto y = run_device(c, m, [&](const Conv1dParams& p) { cuda::conv1d_mma(p, {}, tile); });
            const double worst = check_bound(c, y, m);
            if (tile == 0) MESSAGE("math " << int(m) << " tile " << tile << " dtype " << int(dt) << " Kg " << c.kg()
                            << ": max error / bound " << worst << " (bound " << rel_bound(m, c.kg()) << " x sum|w||x|)");
            if (tile == 0) {  // bitwise reproducible: one fixed-order accumulation chain per output
                const auto y2 = run_device(c, m, [&](const Conv1dParams& p) { cuda::conv1d_mma(p, {}, 0); });
                CHECK(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0);
            }
        }
        // Through Ops<Cuda> (no scratch, so never the GEMM): conv_mma for F32 weights when selected, else exact; either
        // way within the MMA bound.
        const auto yo = run_device(c, m, [&](const Conv1dParams& p) { Ops<Cuda>::conv1d(p, {}); });
        (void)check_bound(c, yo, m);
    }
}

}  // namespace

TEST_CASE("conv1d_mma: odd sizes (tails in M, N, Kg; unaligned Kg; stride 2; k 1/3/5), every dtype, tile and math mode") {
    if (!optest::ready<Cuda>()) return;
    const Shape1d shapes[] = {
        {1, 3, 5, 7, 3, 1, 1},      // Kg 9: scalar A path, one partial tile everywhere
        {3, 37, 70, 13, 5, 1, 2},   // Kg 185 odd, M 70 (tail), N 39
        {5, 64, 96, 9, 3, 2, 1},    // stride 2: N 25
        {2, 130, 33, 16, 1, 1, 0},  // k 1, Kg 130 (16-bit: not a multiple of 8)
        {7, 24, 65, 11, 5, 1, 2},   // Kg 120: 16-byte path for every dtype, M 65
        {4, 2, 40, 16, 5, 1, 2},    // in 2 (the U-Net's first conv), Kg 10
        {9, 48, 130, 10, 4, 3, 0},  // even kernel, stride 3, no padding
    };
    std::uint32_t seed = 100;
    for (const Shape1d& s : shapes)
        for (DType dt : kAllDtypes) run_case(s, dt, seed += 7);
}

TEST_CASE("conv1d_mma: PushT-like shapes (batch 4..64, Kg up to 20480)") {
    if (!optest::ready<Cuda>()) return;
    const Shape1d shapes[] = {
        {64, 512, 256, 16, 5, 1, 2},   // N 1024 (L 16), Kg 2560
        {64, 1024, 128, 8, 3, 2, 1},   // the stride-2 downsample, N 256
        {64, 4096, 64, 4, 1, 1, 0},    // k 1 residual conv, Kg 4096
        {8, 2048, 256, 4, 5, 1, 2},    // batch 8 at L 4: N 32, Kg 10240
        {4, 4096, 64, 4, 5, 1, 2},     // the longest reduction: Kg 20480
        {12, 2048, 2048, 4, 5, 1, 2},  // full 2048 channels, N 48 (tail)
    };
    std::uint32_t seed = 500;
    for (const Shape1d& s : shapes)
        for (DType dt : kAllDtypes) run_case(s, dt, seed += 11);
}

TEST_CASE("conv1d routing: MathMode F32 never takes the MMA path; TF32/BF16 take it from batch*out_length >= 32") {
    if (!optest::ready<Cuda>()) return;
    Conv1dParams p;
    p.batch = 1; p.in_channels = 512; p.out_channels = 512; p.in_length = 16; p.out_length = 16; p.kernel = 5; p.pad = 2;
    CHECK_FALSE(cuda::conv1d_mma_selected(p));  // F32
    p.math = MathMode::TF32;
    CHECK_FALSE(cuda::conv1d_mma_selected(p));  // batch 1: N = 16 keeps the exact bandwidth kernels
    p.batch = 64;
    if (std::getenv("FLOWEDGE_CUDA_MMA_MIN_N") == nullptr) CHECK(cuda::conv1d_mma_selected(p));  // N = 1024 >= 32
    p.math = MathMode::F32;
    CHECK_FALSE(cuda::conv1d_mma_selected(p));
    DeviceArray<float> dummy(std::size_t(1));  // never read: the math check throws before any launch
    p.x = dummy.get(); p.w = WeightRef{dummy.get(), DType::F32}; p.y = dummy.get();
    CHECK_THROWS_WITH_AS(cuda::conv1d_mma(p, {}), doctest::Contains("math mode must be TF32 or BF16"), Error);
}

namespace {

/// Per-output bound of kernels/cuda/gemm_lt.cu (cuBLASLt): TF32 (F32 weights): (2^-10 + 2^-11 + Kg 2^-24); BF16
/// (BF16 weights, exact; panel rounded to BF16): (2^-8 + Kg 2^-24), times |bias| + sum|w||x|, plus 2^-23 |y|.
double gemm_rel_bound(DType dt, int kg) {
    const double acc = double(kg) * std::ldexp(1.0, -24);
    return dt == DType::F32 ? std::ldexp(1.0, -10) + std::ldexp(1.0, -11) + acc : std::ldexp(1.0, -8) + acc;
}

double check_gemm_bound(const Case& c, const std::vector<float>& y, DType dt) {
    return check_within(c, y, gemm_rel_bound(dt, c.kg()));
}

void run_gemm_case(const Shape1d& sh, DType dt, std::uint32_t seed) {
    CAPTURE(sh.batch); CAPTURE(sh.in); CAPTURE(sh.out); CAPTURE(sh.len); CAPTURE(sh.k); CAPTURE(sh.stride); CAPTURE(sh.pad);
    CAPTURE(int(dt));
    const Case c(sh, dt, seed);
    for (MathMode m : {MathMode::TF32, MathMode::BF16}) {
        CAPTURE(int(m));
        cuda::prepare_math(m);
        const std::size_t need = cuda::conv1d_scratch_bytes(c.params(m));
        REQUIRE(need > 0);  // every shape here has batch*out_length >= 256
        DeviceArray<std::byte> scratch(need);
        bool took = false;
        auto gemm = [&](const Conv1dParams& q) {
            Conv1dParams p = q;
            p.scratch = scratch.get();
            p.scratch_bytes = need;
            took = cuda::conv1d_gemm(p, {});
        };
        const auto y = run_device(c, m, gemm);
        // Applies to F32 weights (TF32 GEMM under either mode) and BF16 weights under BF16 math; F16 never.
        const bool applies = dt == DType::F32 || (dt == DType::BF16 && m == MathMode::BF16);
        // 16-byte aligned operand rows (Kg a multiple of 8 elements) always find an algorithm.
        if (!applies || c.kg() % 8 == 0) CHECK(took == applies);
        if (!took) continue;
        const double worst = check_gemm_bound(c, y, dt);
        MESSAGE("gemm math " << int(m) << " dtype " << int(dt) << " Kg " << c.kg() << " N " << sh.batch * c.out_len
                             << ": max error / bound " << worst << " (bound " << gemm_rel_bound(dt, c.kg()) << " x sum|w||x|)");
        const auto y2 = run_device(c, m, gemm);  // same algorithm, same bits
        CHECK(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0);
        // Too little scratch: nothing launched, the caller falls back (y stays NaN-poisoned).
        bool small_took = true;
        (void)run_device(c, m, [&](const Conv1dParams& q) {
            Conv1dParams p = q;
            p.scratch = scratch.get();
            p.scratch_bytes = need - 256;
            small_took = cuda::conv1d_gemm(p, {});
        });
        CHECK_FALSE(small_took);
        // Through Ops<Cuda>::conv1d with the scratch: the same GEMM result bit for bit.
        const auto yo = run_device(c, m, [&](const Conv1dParams& q) {
            Conv1dParams p = q;
            p.scratch = scratch.get();
            p.scratch_bytes = need;
            Ops<Cuda>::conv1d(p, {});
        });
        CHECK(std::memcmp(y.data(), yo.data(), y.size() * sizeof(float)) == 0);
    }
    // F32 math with f32_gemm (the batched U-Net's default path): F32 weights on the library's F32 GEMM, within an F32
    // GEMM's bound; through Ops<Cuda>::conv1d too (same bits); every other dtype declines.
    const std::size_t need = cuda::conv1d_scratch_bytes(c.params(MathMode::F32));
    REQUIRE(need > 0);
    DeviceArray<std::byte> scratch(need);
    bool took = false;
    auto f32_gemm = [&](const Conv1dParams& q, bool through_ops) {
        Conv1dParams p = q;
        p.f32_gemm = true;
        p.scratch = scratch.get();
        p.scratch_bytes = need;
        if (through_ops) Ops<Cuda>::conv1d(p, {});
        else took = cuda::conv1d_gemm(p, {});
    };
    const auto y = run_device(c, MathMode::F32, [&](const Conv1dParams& q) { f32_gemm(q, false); });
    if (dt != DType::F32 || c.kg() % 8 == 0) CHECK(took == (dt == DType::F32));
    if (!took) return;
    const double rb = std::ldexp(1.0, -23) + double(c.kg()) * std::ldexp(1.0, -24);
    MESSAGE("f32 gemm Kg " << c.kg() << " N " << sh.batch * c.out_len << ": max error / bound " << check_within(c, y, rb));
    const auto yo = run_device(c, MathMode::F32, [&](const Conv1dParams& q) { f32_gemm(q, true); });
    CHECK(std::memcmp(y.data(), yo.data(), y.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("conv1d_gemm (cuBLASLt): odd, long and PushT-like shapes at batch*length >= 256, every dtype and math mode") {
    if (!optest::ready<Cuda>()) return;
    if (device_major() < 8) return;
    const Shape1d shapes[] = {
        {20, 37, 70, 13, 5, 1, 2},    // Kg 185 odd (unaligned rows: the library may decline), M 70, N 260
        {30, 70, 33, 10, 4, 1, 1},    // even kernel, Kg 280, M 33, N 270
        {64, 512, 256, 16, 5, 1, 2},  // PushT L 16: N 1024, Kg 2560
        {64, 1024, 128, 8, 3, 2, 1},  // the stride-2 downsample: N 256
        {64, 4096, 64, 4, 1, 1, 0},   // k 1 residual conv, Kg 4096
        {64, 4096, 96, 4, 5, 1, 2},   // the longest PushT reduction: Kg 20480, N 256
        {2, 72, 40, 300, 5, 1, 2},    // long rows: N 600, 72 channels (one partial im2col block)
        {4, 296, 36, 100, 1, 1, 0},   // k 1 over long rows, Kg 296
    };
    std::uint32_t seed = 700;
    for (const Shape1d& s : shapes)
        for (DType dt : kAllDtypes) run_gemm_case(s, dt, seed += 13);
}

TEST_CASE("conv1d_gemm declines what it does not handle: F32 math without f32_gemm, no scratch, too-small batch*length") {
    if (!optest::ready<Cuda>()) return;
    const Case c({64, 64, 32, 8, 5, 1, 2}, DType::F32, 990);
    cuda::prepare_math(MathMode::TF32);
    Conv1dParams probe = c.params(MathMode::TF32);
    const std::size_t need = cuda::conv1d_scratch_bytes(probe);
    CHECK(need > 0);
    probe.batch = 1;  // N = 8: the exact kernels serve it, no scratch
    CHECK(cuda::conv1d_scratch_bytes(probe) == 0);
    DeviceArray<std::byte> scratch(need);
    for (MathMode m : {MathMode::F32, MathMode::TF32}) {
        bool took = true;
        (void)run_device(c, m, [&](const Conv1dParams& q) {
            Conv1dParams p = q;
            if (m == MathMode::F32) { p.scratch = scratch.get(); p.scratch_bytes = need; }  // F32 without f32_gemm: never
            took = cuda::conv1d_gemm(p, {});                                                // TF32 without scratch
        });
        CHECK_FALSE(took);
        // Ops<Cuda>::conv1d without scratch still computes (exact for F32, conv_mma for TF32).
        const auto yo = run_device(c, m, [&](const Conv1dParams& p) { Ops<Cuda>::conv1d(p, {}); });
        (void)check_bound(c, yo, MathMode::TF32);
    }
}

namespace {

/// A batched ConvTranspose1d for cuda::conv_transpose1d_gemm: inputs, weights [in][out][kernel], the exact result
/// in double (scatter form: input s feeds output s*stride - pad + k) and |bias| + sum|w||x| per output.
struct TransposeCase {
    Shape1d s;  // len = in_length
    int out_len = 0;
    std::vector<float> x, bias;
    Weights w;
    std::vector<double> ref, mag;

    TransposeCase(const Shape1d& sh, DType dt, std::uint32_t seed)
        : s(sh),
          out_len((sh.len - 1) * sh.stride - 2 * sh.pad + sh.k),
          x(random_vec(std::size_t(sh.batch) * sh.in * sh.len, seed)),
          bias(random_vec(sh.out, seed + 2)),
          w(random_vec(std::size_t(sh.in) * sh.out * sh.k, seed + 1, -1.f / std::sqrt(float(sh.in)), 1.f / std::sqrt(float(sh.in))), dt) {
        ref.assign(std::size_t(s.batch) * s.out * out_len, 0.0);
        mag.assign(ref.size(), 0.0);
        for (int b = 0; b < s.batch; ++b)
            for (int o = 0; o < s.out; ++o)
                for (int t = 0; t < out_len; ++t) {
                    ref[(std::size_t(b) * s.out + o) * out_len + t] = bias[o];
                    mag[(std::size_t(b) * s.out + o) * out_len + t] = std::fabs(double(bias[o]));
                }
        for (int b = 0; b < s.batch; ++b)
            for (int i = 0; i < s.in; ++i)
                for (int j = 0; j < s.len; ++j)
                    for (int o = 0; o < s.out; ++o)
                        for (int kk = 0; kk < s.k; ++kk) {
                            const int t = j * s.stride - s.pad + kk;
                            if (t < 0 || t >= out_len) continue;
                            const double v = double(w.widened[(std::size_t(i) * s.out + o) * s.k + kk]) *
                                             x[(std::size_t(b) * s.in + i) * s.len + j];
                            ref[(std::size_t(b) * s.out + o) * out_len + t] += v;
                            mag[(std::size_t(b) * s.out + o) * out_len + t] += std::fabs(v);
                        }
    }

    ConvTranspose1dParams params(MathMode m, bool f32_gemm = false) const {
        ConvTranspose1dParams p;
        p.batch = s.batch; p.in_channels = s.in; p.out_channels = s.out; p.in_length = s.len; p.out_length = out_len;
        p.kernel = s.k; p.stride = s.stride; p.pad = s.pad; p.math = m; p.f32_gemm = f32_gemm;
        return p;
    }
};

void run_transpose_gemm_case(const Shape1d& sh, DType dt, std::uint32_t seed) {
    CAPTURE(sh.batch); CAPTURE(sh.in); CAPTURE(sh.out); CAPTURE(sh.len); CAPTURE(sh.k); CAPTURE(sh.stride); CAPTURE(sh.pad);
    CAPTURE(int(dt));
    const TransposeCase c(sh, dt, seed);
    const int kg = sh.in * sh.k;  // products per output, counted generously (only ceil(k / stride) taps reach one)
    struct Mode {
        MathMode math;
        bool f32_gemm;
    };
    for (const Mode md : {Mode{MathMode::TF32, false}, Mode{MathMode::BF16, false}, Mode{MathMode::F32, true}}) {
        CAPTURE(int(md.math));
        cuda::prepare_math(md.math);
        const ConvTranspose1dParams p0 = c.params(md.math, md.f32_gemm);
        const std::size_t need = cuda::conv_transpose1d_scratch_bytes(p0);
        REQUIRE(need > 0);  // every shape here has batch * in_length >= 32
        DeviceArray<std::byte> scratch(need);
        auto with_scratch = [&](std::size_t bytes, auto&& op) {
            return [&, bytes](const ConvTranspose1dParams& q) {
                ConvTranspose1dParams p = q;
                p.scratch = scratch.get();
                p.scratch_bytes = bytes;
                op(p);
            };
        };
        bool took = false;
        const auto y = run_poisoned(c, p0, with_scratch(need, [&](const ConvTranspose1dParams& p) { took = cuda::conv_transpose1d_gemm(p, {}); }));
        // F32 weights under every mode here; BF16 weights under BF16 math; F16 weights never.
        const bool applies = dt == DType::F32 || (dt == DType::BF16 && md.math == MathMode::BF16);
        // 16-byte aligned operand rows (in and out * kernel multiples of 8) always find an algorithm.
        if (!applies || (sh.in % 8 == 0 && sh.out * sh.k % 8 == 0)) CHECK(took == applies);
        if (!took) {
            // Declined: Ops<Cuda> runs the exact kernels, within the op test's F32 bound.
            const auto ye = run_poisoned(c, p0, with_scratch(need, [](const ConvTranspose1dParams& p) { Ops<Cuda>::conv_transpose1d(p, {}); }));
            (void)check_within(c, ye, double(kg) * std::ldexp(1.0, -23));
            continue;
        }
        const double rb = md.math == MathMode::F32 ? std::ldexp(1.0, -23) + double(kg) * std::ldexp(1.0, -24) : gemm_rel_bound(dt, kg);
        const double worst = check_within(c, y, rb);
        MESSAGE("conv_transpose1d gemm math " << int(md.math) << " dtype " << int(dt) << " in " << sh.in << " N "
                                              << sh.batch * sh.len << ": max error / bound " << worst);
        // Same algorithm, same bits; and through Ops<Cuda>::conv_transpose1d with the scratch.
        const auto y2 = run_poisoned(c, p0, with_scratch(need, [](const ConvTranspose1dParams& p) { (void)cuda::conv_transpose1d_gemm(p, {}); }));
        CHECK(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0);
        const auto yo = run_poisoned(c, p0, with_scratch(need, [](const ConvTranspose1dParams& p) { Ops<Cuda>::conv_transpose1d(p, {}); }));
        CHECK(std::memcmp(y.data(), yo.data(), y.size() * sizeof(float)) == 0);
        // Too little scratch: nothing launched (y stays NaN-poisoned), and Ops<Cuda> falls back to the exact kernels.
        bool small_took = true;
        (void)run_poisoned(c, p0, with_scratch(need - 256, [&](const ConvTranspose1dParams& p) { small_took = cuda::conv_transpose1d_gemm(p, {}); }));
        CHECK_FALSE(small_took);
    }
    // F32 math without f32_gemm never takes it, scratch or not.
    const ConvTranspose1dParams pf = c.params(MathMode::F32);
    const std::size_t need = cuda::conv_transpose1d_scratch_bytes(pf);
    DeviceArray<std::byte> scratch(need);
    bool took = true;
    (void)run_poisoned(c, pf, [&](const ConvTranspose1dParams& q) {
        ConvTranspose1dParams p = q;
        p.scratch = scratch.get();
        p.scratch_bytes = need;
        took = cuda::conv_transpose1d_gemm(p, {});
    });
    CHECK_FALSE(took);
}

}  // namespace

TEST_CASE("conv_transpose1d_gemm (cuBLASLt): odd and PushT upsampler shapes, every dtype and GEMM request; declines "
          "unbatched calls") {
    if (!optest::ready<Cuda>()) return;
    if (device_major() < 8) return;
    const Shape1d shapes[] = {
        {5, 37, 29, 7, 4, 2, 1},       // odd channels, N 35: unaligned rows (the library may still serve them)
        {3, 40, 24, 11, 3, 1, 0},      // stride 1, kernel 3, N 33
        {6, 16, 8, 6, 5, 3, 2},        // stride 3: outputs with one tap and with two
        {64, 1024, 1024, 4, 4, 2, 1},  // PushT up0 upsample at batch 64 (N 256)
        {8, 512, 512, 8, 4, 2, 1},     // PushT up1 upsample at batch 8 (N 64)
    };
    std::uint32_t seed = 1300;
    for (const Shape1d& s : shapes)
        for (DType dt : kAllDtypes) run_transpose_gemm_case(s, dt, seed += 17);
    // Unbatched (batch * in_length below the routing minimum): no scratch asked, never taken.
    const TransposeCase one({1, 64, 64, 8, 4, 2, 1}, DType::F32, 1);
    CHECK(cuda::conv_transpose1d_scratch_bytes(one.params(MathMode::TF32)) == 0);
}

TEST_CASE("Ops<Cpu>::conv1d computes a TF32 request exactly (the CPU has no TF32): the F32 result bit for bit") {
    if (!optest::ready<Cuda>()) return;
    const Case c({8, 40, 24, 16, 5, 1, 2}, DType::F32, 900);
    std::vector<float> y_f32(c.ref.size()), y_m(c.ref.size());
    Conv1dParams p = c.params(MathMode::F32);
    p.x = c.x.data(); p.w = c.w.cpu(); p.bias = c.bias.data(); p.y = y_f32.data();
    Ops<Cpu>::conv1d(p, {});
    p.math = MathMode::TF32;
    p.y = y_m.data();
    Ops<Cpu>::conv1d(p, {});
    CHECK(std::memcmp(y_f32.data(), y_m.data(), y_m.size() * sizeof(float)) == 0);
}

TEST_CASE("linear_gemm (cuBLASLt TF32, and F32 with f32_gemm): many-row linears within their bound, with ReLU and "
          "accumulate, deterministic, declines the rest") {
    if (!optest::ready<Cuda>()) return;
    if (device_major() < 8) return;
    cuda::prepare_math(MathMode::TF32);
    struct L { int rows, in, out; bool bias; int ld_x, ld_y; };
    // The U-Net's FiLM linears at batch 64 (in 260, out 2*dims), ACT's 302-token encoder linears (512 -> 512,
    // 512 -> 3200 -> 512), odd sizes, and strided rows.
    const L cases[] = {{64, 260, 1024, true, 0, 0}, {64, 260, 4096, true, 0, 0}, {33, 37, 70, false, 0, 0},
                       {40, 128, 96, true, 132, 100}, {256, 512, 8, true, 0, 0}, {302, 512, 3200, true, 0, 0},
                       {302, 3200, 512, true, 0, 0}};
    struct Mode { MathMode math; bool f32_gemm; double product_rel; };  // per-product rounding of the GEMM's operands
    const Mode modes[] = {{MathMode::TF32, false, 2 * std::ldexp(1.0, -10)}, {MathMode::F32, true, std::ldexp(1.0, -23)}};
    std::uint32_t seed = 1300;
    for (const L& c : cases)
        for (const Mode& mode : modes)
            for (int variant = 0; variant < 3; ++variant) {  // plain, ReLU, accumulate into y
                const Activation act = variant == 1 ? Activation::Relu : Activation::None;
                const bool accumulate = variant == 2;
                CAPTURE(c.rows); CAPTURE(c.in); CAPTURE(c.out); CAPTURE(c.ld_x); CAPTURE(c.ld_y); CAPTURE(int(mode.math));
                CAPTURE(variant);
                const int ldx = c.ld_x ? c.ld_x : c.in, ldy = c.ld_y ? c.ld_y : c.out;
                const auto x = random_vec(std::size_t(c.rows) * ldx, seed += 3);
                const auto w = random_vec(std::size_t(c.out) * c.in, seed + 1, -1.f / std::sqrt(float(c.in)), 1.f / std::sqrt(float(c.in)));
                const auto bias = random_vec(c.out, seed + 2);
                const float poison = std::numeric_limits<float>::quiet_NaN();
                std::vector<float> y0(std::size_t(c.rows) * ldy, poison);
                if (accumulate) y0 = random_vec(y0.size(), seed + 4);
                std::vector<double> ref(std::size_t(c.rows) * c.out), mag(ref.size()), old(ref.size());
                for (int r = 0; r < c.rows; ++r)
                    for (int o = 0; o < c.out; ++o) {
                        double acc = c.bias ? bias[o] : 0.0, m = std::fabs(acc);
                        for (int i = 0; i < c.in; ++i) {
                            const double pr = double(w[std::size_t(o) * c.in + i]) * x[std::size_t(r) * ldx + i];
                            acc += pr;
                            m += std::fabs(pr);
                        }
                        const std::size_t k = std::size_t(r) * c.out + o;
                        if (act == Activation::Relu) acc = std::max(acc, 0.0);
                        old[k] = accumulate ? y0[std::size_t(r) * ldy + o] : 0.0;
                        ref[k] = acc + old[k];
                        mag[k] = m;
                    }
                DeviceArray<float> dx(x), dw(w), db(bias);
                auto run = [&](auto&& launch) {
                    DeviceArray<float> dy(y0);
                    LinearParams p;
                    p.x = dx.get(); p.w = WeightRef{dw.get(), DType::F32}; p.bias = c.bias ? db.get() : nullptr; p.y = dy.get();
                    p.rows = c.rows; p.in = c.in; p.out = c.out; p.ld_x = c.ld_x; p.ld_y = c.ld_y; p.math = mode.math;
                    p.f32_gemm = mode.f32_gemm; p.act = act; p.accumulate = accumulate;
                    const bool took = launch(p);
                    return std::make_pair(took, dy.download());
                };
                const auto [took, y] = run([](const LinearParams& p) { return cuda::linear_gemm(p, {}); });
                REQUIRE(took);
                const double rb = mode.product_rel + double(c.in) * std::ldexp(1.0, -24);
                std::size_t n_bad = 0;
                double worst = 0;
                for (int r = 0; r < c.rows; ++r)
                    for (int o = 0; o < c.out; ++o) {
                        const std::size_t i = std::size_t(r) * c.out + o;
                        const double err = std::fabs(double(y[std::size_t(r) * ldy + o]) - ref[i]);
                        const double bound = rb * mag[i] + std::ldexp(std::fabs(ref[i]) + std::fabs(old[i]), -23) + 1e-30;
                        if (!(err <= bound)) ++n_bad;
                        if (std::isfinite(err)) worst = std::max(worst, err / bound);
                    }
                CHECK(n_bad == 0);
                MESSAGE("linear_gemm " << c.rows << "x" << c.in << "->" << c.out << " math " << int(mode.math) << " variant " << variant
                                       << ": max error / bound " << worst);
                if (!accumulate)
                    for (int r = 0; r < c.rows; ++r)  // the gaps between strided rows are not written
                        for (int o = c.out; o < ldy; ++o) CHECK(std::isnan(y[std::size_t(r) * ldy + o]));
                const auto [took2, y2] = run([](const LinearParams& p) { return cuda::linear_gemm(p, {}); });
                CHECK(took2);
                CHECK(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0);
                // Ops<Cuda>::linear routes here: same bits; as one item of linear_batch: same bits.
                const auto [t3, y3] = run([](const LinearParams& p) { Ops<Cuda>::linear(p, {}); return true; });
                CHECK(std::memcmp(y.data(), y3.data(), y.size() * sizeof(float)) == 0);
                const auto [t4, y4] = run([](const LinearParams& p) {
                    LinearBatchParams lb;
                    lb.n_items = 1;
                    lb.items[0] = p;
                    Ops<Cuda>::linear_batch(lb, {});
                    return true;
                });
                CHECK(std::memcmp(y.data(), y4.data(), y.size() * sizeof(float)) == 0);
                if (variant != 0) continue;
                // Declined: F32 math without f32_gemm, other activations, ReLU with accumulate, too few rows.
                auto declined = [&](auto&& edit) {
                    return run([&](const LinearParams& q) { LinearParams p = q; edit(p); return !cuda::linear_gemm(p, {}); });
                };
                CHECK(declined([](LinearParams& p) { p.math = MathMode::F32; p.f32_gemm = false; }).first);
                CHECK(declined([](LinearParams& p) { p.act = Activation::Silu; }).first);
                CHECK(declined([](LinearParams& p) { p.act = Activation::Relu; p.accumulate = true; }).first);
                CHECK(declined([](LinearParams& p) { p.rows = 31; }).first);
            }
}

TEST_CASE("linear tiles (many rows the library GEMM declines: 16-bit weights, SiLU/Mish, ReLU with accumulate): "
          "float-exact operands within the F32 summation bound, deterministic, the same bits as a linear_batch item") {
    if (!optest::ready<Cuda>()) return;
    struct L { int rows, in, out; int ld_x, ld_y; };
    // The U-Net's FiLM linears on 16-bit weights at batch 64 (in 260, out 2*dims), tails in every tile dimension,
    // strided rows, and rows just at the threshold.
    const L cases[] = {{64, 260, 1024, 0, 0}, {64, 260, 4096, 0, 0}, {33, 37, 70, 0, 0}, {40, 129, 96, 132, 100}, {32, 8, 65, 0, 0}};
    struct Variant { DType dt; MathMode math; bool f32_gemm; Activation act; bool accumulate; };
    const Variant variants[] = {{DType::BF16, MathMode::BF16, false, Activation::None, false},
                                {DType::F16, MathMode::TF32, false, Activation::None, true},
                                {DType::BF16, MathMode::F32, true, Activation::Mish, false},
                                {DType::F32, MathMode::TF32, false, Activation::Silu, false},
                                {DType::F32, MathMode::BF16, false, Activation::Relu, true}};
    auto act_ref = [](Activation a, double v) {
        const double sp = v > 20 ? v : std::log1p(std::exp(v));
        switch (a) {
            case Activation::Mish: return v * std::tanh(sp);
            case Activation::Silu: return v / (1 + std::exp(-v));
            case Activation::Relu: return std::max(v, 0.0);
            default: return v;
        }
    };
    std::uint32_t seed = 1700;
    for (const L& c : cases)
        for (const Variant& v : variants) {
            CAPTURE(c.rows); CAPTURE(c.in); CAPTURE(c.out); CAPTURE(c.ld_x); CAPTURE(c.ld_y);
            CAPTURE(int(v.dt)); CAPTURE(int(v.math)); CAPTURE(int(v.act)); CAPTURE(v.accumulate);
            const int ldx = c.ld_x ? c.ld_x : c.in, ldy = c.ld_y ? c.ld_y : c.out;
            const auto x = random_vec(std::size_t(c.rows) * ldx, seed += 3);
            const Weights w(random_vec(std::size_t(c.out) * c.in, seed + 1, -1.f / std::sqrt(float(c.in)), 1.f / std::sqrt(float(c.in))), v.dt);
            const auto bias = random_vec(c.out, seed + 2);
            std::vector<float> y0(std::size_t(c.rows) * ldy, std::numeric_limits<float>::quiet_NaN());
            if (v.accumulate) y0 = random_vec(y0.size(), seed + 4);
            DeviceArray<float> dx(x), db(bias);
            auto run = [&](auto&& launch) {
                DeviceArray<float> dy(y0);
                LinearParams p;
                p.x = dx.get(); p.w = w.gpu(); p.bias = db.get(); p.y = dy.get();
                p.rows = c.rows; p.in = c.in; p.out = c.out; p.ld_x = c.ld_x; p.ld_y = c.ld_y;
                p.math = v.math; p.f32_gemm = v.f32_gemm; p.act = v.act; p.accumulate = v.accumulate;
                REQUIRE_FALSE(cuda::linear_gemm(p, {}));  // the library declines: this is the tiled path's case
                launch(p);
                return dy.download();
            };
            const auto y = run([](const LinearParams& p) { Ops<Cuda>::linear(p, {}); });
            // Bound: float products of exact operands (one rounding) and a float sum of in + 1 terms in some order,
            // then the activation (float, within 2^-21 relative) and the accumulate addition.
            const double rb = double(c.in + 2) * std::ldexp(1.0, -24);
            std::size_t n_bad = 0;
            for (int r = 0; r < c.rows; ++r)
                for (int o = 0; o < c.out; ++o) {
                    double acc = bias[o], m = std::fabs(double(bias[o]));
                    for (int i = 0; i < c.in; ++i) {
                        const double pr = double(w.widened[std::size_t(o) * c.in + i]) * x[std::size_t(r) * ldx + i];
                        acc += pr;
                        m += std::fabs(pr);
                    }
                    const double a = act_ref(v.act, acc);
                    const double old = v.accumulate ? y0[std::size_t(r) * ldy + o] : 0.0;
                    const double ref = a + old;
                    const double err = std::fabs(double(y[std::size_t(r) * ldy + o]) - ref);
                    // The activations' slopes are at most 1.1: the sum's error passes through scaled by <= 1.1.
                    const double bound = 1.1 * rb * m + std::ldexp(std::fabs(a), -21) + std::ldexp(std::fabs(ref) + std::fabs(old), -23) + 1e-30;
                    if (!(err <= bound)) ++n_bad;
                }
            CHECK(n_bad == 0);
            if (!v.accumulate)
                for (int r = 0; r < c.rows; ++r)  // the gaps between strided rows are not written
                    for (int o = c.out; o < ldy; ++o) CHECK(std::isnan(y[std::size_t(r) * ldy + o]));
            CHECK(std::memcmp(y.data(), run([](const LinearParams& p) { Ops<Cuda>::linear(p, {}); }).data(), y.size() * 4) == 0);
            DeviceArray<float> other(std::vector<float>(std::size_t(3) * c.out, 0.f));
            const auto yb = run([&](const LinearParams& p) {
                LinearBatchParams lb;  // next to an item on the per-warp path (3 rows), which must not disturb it
                lb.n_items = 2;
                lb.items[0] = p;
                lb.items[1] = p;
                lb.items[1].rows = 3;
                lb.items[1].ld_y = 0;
                lb.items[1].accumulate = false;
                lb.items[1].y = other.get();
                Ops<Cuda>::linear_batch(lb, {});
            });
            CHECK(std::memcmp(y.data(), yb.data(), y.size() * 4) == 0);
            const auto y3 = other.download();
            for (int r = 0; r < 3; ++r)
                for (int o = 0; o < c.out; ++o) {
                    const double want = double(y[std::size_t(r) * ldy + o]) - (v.accumulate ? y0[std::size_t(r) * ldy + o] : 0.f);
                    CHECK(std::fabs(double(y3[std::size_t(r) * c.out + o]) - want) <= 1e-4 * (1 + std::fabs(want)));
                }
        }
}

}  // namespace math_mode_cuda
#endif  // FLOWEDGE_WITH_CUDA
