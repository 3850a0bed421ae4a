// The opt-in tensor-core conv1d (cuda::conv1d_mma, MathMode TF32/BF16) against a double-accumulating exact conv on
// odd and PushT-like shapes, batch 1..64, F32/BF16/F16 weights, every block tile (incl. the sm_90 cluster split-K
// tiles): per-output error bound derived from the unit roundoff and Kg, full coverage of the output (NaN-poisoned),
// no writes past it, bitwise reproducibility, the routing rule of Ops<Cuda>::conv1d, and Ops<Cpu> computing a TF32
// request exactly; plus the cuBLASLt path (cuda::conv1d_gemm) on the same footing with its own bound.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_test_util.hpp"
#include "flowedge/cuda/launchers.hpp"
#include "flowedge/ops.hpp"

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

/// Runs `launch(p)` on the device with y NaN-poisoned plus a guard tail; returns y (without the guard).
template <class F>
std::vector<float> run_device(const Case& c, MathMode m, F&& launch) {
    const std::size_t n_out = c.ref.size();
    std::vector<float> init(n_out + kGuard, std::numeric_limits<float>::quiet_NaN());
    for (int g = 0; g < kGuard; ++g) init[n_out + std::size_t(g)] = 1234.5f + float(g);
    DeviceArray<float> dx(c.x), dbias(c.bias), dy(init);
    Conv1dParams p = c.params(m);
    p.x = dx.get(); p.w = c.w.gpu(); p.bias = dbias.get(); p.y = dy.get();
    launch(p);
    std::vector<float> y = dy.download();
    for (int g = 0; g < kGuard; ++g) CHECK(y[n_out + std::size_t(g)] == 1234.5f + float(g));
    y.resize(n_out);
    return y;
}

/// Every output within rb * (|bias| + sum|w||x|) + 2^-23 |y| (NaN fails); returns the largest error / bound ratio seen.
double check_within(const Case& c, const std::vector<float>& y, double rb) {
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

TEST_CASE("conv1d routing: MathMode F32 never takes the MMA path; TF32/BF16 take it from batch*out_length >= 256") {
    Conv1dParams p;
    p.batch = 1; p.in_channels = 512; p.out_channels = 512; p.in_length = 16; p.out_length = 16; p.kernel = 5; p.pad = 2;
    CHECK_FALSE(cuda::conv1d_mma_selected(p));  // F32
    p.math = MathMode::TF32;
    CHECK_FALSE(cuda::conv1d_mma_selected(p));  // batch 1: N = 16 keeps the exact bandwidth kernels
    p.batch = 64;
    if (std::getenv("FLOWEDGE_CUDA_MMA_MIN_N") == nullptr) CHECK(cuda::conv1d_mma_selected(p));  // N = 1024 >= 256
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
}

}  // namespace

TEST_CASE("conv1d_gemm (cuBLASLt): odd and PushT-like shapes at batch*length >= 256, every dtype and math mode") {
    if (device_major() < 8) return;
    const Shape1d shapes[] = {
        {20, 37, 70, 13, 5, 1, 2},    // Kg 185 odd (unaligned rows: the library may decline), M 70, N 260
        {30, 70, 33, 10, 4, 1, 1},    // even kernel, Kg 280, M 33, N 270
        {64, 512, 256, 16, 5, 1, 2},  // PushT L 16: N 1024, Kg 2560
        {64, 1024, 128, 8, 3, 2, 1},  // the stride-2 downsample: N 256
        {64, 4096, 64, 4, 1, 1, 0},   // k 1 residual conv, Kg 4096
        {64, 4096, 96, 4, 5, 1, 2},   // the longest PushT reduction: Kg 20480, N 256
    };
    std::uint32_t seed = 700;
    for (const Shape1d& s : shapes)
        for (DType dt : kAllDtypes) run_gemm_case(s, dt, seed += 13);
}

TEST_CASE("conv1d_gemm declines what it does not handle: F32 math, no scratch, too-small batch*length") {
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
            if (m == MathMode::F32) { p.scratch = scratch.get(); p.scratch_bytes = need; }  // F32: never
            took = cuda::conv1d_gemm(p, {});                                                // TF32 without scratch
        });
        CHECK_FALSE(took);
        // Ops<Cuda>::conv1d without scratch still computes (exact for F32, conv_mma for TF32).
        const auto yo = run_device(c, m, [&](const Conv1dParams& p) { Ops<Cuda>::conv1d(p, {}); });
        (void)check_bound(c, yo, MathMode::TF32);
    }
}

TEST_CASE("Ops<Cpu>::conv1d computes a TF32 request exactly (the CPU has no TF32): the F32 result bit for bit") {
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

TEST_CASE("linear_gemm (cuBLASLt TF32): many-row linears within the TF32 bound, deterministic, declines the rest") {
    if (device_major() < 8) return;
    cuda::prepare_math(MathMode::TF32);
    struct L { int rows, in, out; bool bias; int ld_x, ld_y; };
    // The U-Net's FiLM linears at batch 64 (in 260, out 2*dims), odd sizes, and strided rows.
    const L cases[] = {{64, 260, 1024, true, 0, 0}, {64, 260, 4096, true, 0, 0}, {33, 37, 70, false, 0, 0},
                       {40, 128, 96, true, 132, 100}, {256, 512, 8, true, 0, 0}};
    std::uint32_t seed = 1300;
    for (const L& c : cases) {
        CAPTURE(c.rows); CAPTURE(c.in); CAPTURE(c.out); CAPTURE(c.ld_x); CAPTURE(c.ld_y);
        const int ldx = c.ld_x ? c.ld_x : c.in, ldy = c.ld_y ? c.ld_y : c.out;
        const auto x = random_vec(std::size_t(c.rows) * ldx, seed += 3);
        const auto w = random_vec(std::size_t(c.out) * c.in, seed + 1, -1.f / std::sqrt(float(c.in)), 1.f / std::sqrt(float(c.in)));
        const auto bias = random_vec(c.out, seed + 2);
        std::vector<double> ref(std::size_t(c.rows) * c.out), mag(ref.size());
        for (int r = 0; r < c.rows; ++r)
            for (int o = 0; o < c.out; ++o) {
                double acc = c.bias ? bias[o] : 0.0, m = std::fabs(acc);
                for (int i = 0; i < c.in; ++i) {
                    const double pr = double(w[std::size_t(o) * c.in + i]) * x[std::size_t(r) * ldx + i];
                    acc += pr;
                    m += std::fabs(pr);
                }
                ref[std::size_t(r) * c.out + o] = acc;
                mag[std::size_t(r) * c.out + o] = m;
            }
        DeviceArray<float> dx(x), dw(w), db(bias);
        const float poison = std::numeric_limits<float>::quiet_NaN();
        auto run = [&](MathMode m, auto&& launch) {
            DeviceArray<float> dy(std::vector<float>(std::size_t(c.rows) * ldy, poison));
            LinearParams p;
            p.x = dx.get(); p.w = WeightRef{dw.get(), DType::F32}; p.bias = c.bias ? db.get() : nullptr; p.y = dy.get();
            p.rows = c.rows; p.in = c.in; p.out = c.out; p.ld_x = c.ld_x; p.ld_y = c.ld_y; p.math = m;
            const bool took = launch(p);
            return std::make_pair(took, dy.download());
        };
        const auto [took, y] = run(MathMode::TF32, [](const LinearParams& p) { return cuda::linear_gemm(p, {}); });
        REQUIRE(took);
        const double rb = 2 * std::ldexp(1.0, -10) + double(c.in) * std::ldexp(1.0, -24);
        std::size_t n_bad = 0;
        double worst = 0;
        for (int r = 0; r < c.rows; ++r)
            for (int o = 0; o < c.out; ++o) {
                const std::size_t i = std::size_t(r) * c.out + o;
                const double err = std::fabs(double(y[std::size_t(r) * ldy + o]) - ref[i]);
                const double bound = rb * mag[i] + std::ldexp(std::fabs(ref[i]), -23) + 1e-30;
                if (!(err <= bound)) ++n_bad;
                if (std::isfinite(err)) worst = std::max(worst, err / bound);
            }
        CHECK(n_bad == 0);
        MESSAGE("linear_gemm " << c.rows << "x" << c.in << "->" << c.out << ": max error / bound " << worst);
        for (int r = 0; r < c.rows; ++r)  // the gaps between strided rows are not written
            for (int o = c.out; o < ldy; ++o) CHECK(std::isnan(y[std::size_t(r) * ldy + o]));
        const auto [took2, y2] = run(MathMode::TF32, [](const LinearParams& p) { return cuda::linear_gemm(p, {}); });
        CHECK(took2);
        CHECK(std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) == 0);
        // Ops<Cuda>::linear with TF32 routes here: same bits; as one item of linear_batch: same bits.
        const auto [t3, y3] = run(MathMode::TF32, [](const LinearParams& p) { Ops<Cuda>::linear(p, {}); return true; });
        CHECK(std::memcmp(y.data(), y3.data(), y.size() * sizeof(float)) == 0);
        const auto [t4, y4] = run(MathMode::TF32, [](const LinearParams& p) {
            LinearBatchParams lb;
            lb.n_items = 1;
            lb.items[0] = p;
            Ops<Cuda>::linear_batch(lb, {});
            return true;
        });
        CHECK(std::memcmp(y.data(), y4.data(), y.size() * sizeof(float)) == 0);
        // Declined: F32 math, an activation, accumulate, too few rows (nothing launched: y stays NaN).
        auto declined = [&](auto&& edit) {
            return run(MathMode::TF32, [&](const LinearParams& q) { LinearParams p = q; edit(p); return !cuda::linear_gemm(p, {}); });
        };
        CHECK(declined([](LinearParams& p) { p.math = MathMode::F32; }).first);
        CHECK(declined([](LinearParams& p) { p.act = Activation::Silu; }).first);
        CHECK(declined([](LinearParams& p) { p.accumulate = true; }).first);
        CHECK(declined([](LinearParams& p) { p.rows = 31; }).first);
    }
}
