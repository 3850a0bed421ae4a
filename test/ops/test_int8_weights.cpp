// INT8 weight-only storage on the CPU (LoadOptions::quantize = WeightQuant::Int8: cpu/weights.hpp, the INT8 blocks of
// kernels/packed_conv.hpp): conv1d, conv_transpose1d, linear and linear_batch on INT8 blocks at odd sizes against
//   - a double loop on the dequantised weights s_r * q (q = round(w / s_r), s_r = max |w| of packed row r / 127,
//     computed here independently): the F32 accumulation bound of the other packed kernels, 2e-6 of sum |w_q||x|;
//   - a double loop on the original weights: the quantisation bound |dy| <= s_r / 2 * sum |x| over the row's terms
//     (each weight is off by at most half a step), plus the same accumulation term;
// bit-identical results for 1 and 2 threads, and the load-time errors (non-finite weights, INT8 asked where the
// process's kernel set has no INT8 kernel: the scalar and Eigen sets).
#include <limits>
#include <string>

#include "../support/conv_case.hpp"
#include "cpu_packed_util.hpp"
#include "ops_test_util.hpp"

using namespace optest;

namespace {

/// The quantisation the loader applies, computed independently: rows of R consecutive values of w (any row order
/// the caller maps), s = float(max |w|) / 127, deq = s * round(w / s) clamped to [-127, 127] steps.
struct Quantised {
    std::vector<double> deq;   ///< dequantised weight values, same indexing as the input
    std::vector<double> step;  ///< s of each row
};
template <class RowOf>
Quantised quantise(const std::vector<double>& w, std::size_t rows, std::size_t R, RowOf index) {
    Quantised q{std::vector<double>(w.size()), std::vector<double>(rows)};
    for (std::size_t r = 0; r < rows; ++r) {
        float amax = 0.f;
        for (std::size_t j = 0; j < R; ++j) amax = std::max(amax, float(std::fabs(w[index(r, j)])));
        const float s = amax / 127.f;
        q.step[r] = s;
        for (std::size_t j = 0; j < R; ++j)
            q.deq[index(r, j)] = s == 0.f ? 0.0 : double(s) * std::clamp(std::nearbyint(w[index(r, j)] / double(s)), -127.0, 127.0);
    }
    return q;
}

/// Per output of y: |y - ref_q| <= 2e-6 * mag_q (the dequantised weights) and |y - ref| <= bound + 2e-6 * mag (the
/// original ones), bound = sum over its terms of s_row / 2 * |x|. Reports the largest observed fraction of the bound.
struct Refs {
    std::vector<double> ref, mag, ref_q, mag_q, bound;
    explicit Refs(std::size_t n) : ref(n), mag(n), ref_q(n), mag_q(n), bound(n) {}
    void add(std::size_t i, double w, double wq, double step, double x) {
        ref[i] += w * x;
        mag[i] += std::fabs(w * x);
        ref_q[i] += wq * x;
        mag_q[i] += std::fabs(wq * x);
        bound[i] += 0.5 * step * std::fabs(x);
    }
    void start(std::size_t i, double bias) {
        ref[i] = ref_q[i] = bias;
        mag[i] = mag_q[i] = std::fabs(bias);
    }
    void check(const std::vector<float>& y, const char* what) const {
        check_all(y, ref_q, mag_q, kTolRef, (std::string(what) + " vs the dequantised weights").c_str());
        double worst = 0;
        for (std::size_t i = 0; i < y.size(); ++i) {
            const double d = std::fabs(double(y[i]) - ref[i]);
            REQUIRE_MESSAGE(d <= bound[i] + kTolRef * mag[i], std::string(what) << " vs F32 weights, output " << i << ": |dy| = " << d
                                                                 << " > bound " << bound[i] + kTolRef * mag[i]);
            if (bound[i] > 0) worst = std::max(worst, d / bound[i]);
        }
        MESSAGE(std::string(what) << ": largest |y - y_f32| / quantisation bound = " << worst);
    }
};

std::unique_ptr<PreparedWeight> int8_weight(Storage s, const HostWeights& w, const Shape& shape) {
    return Ops<Cpu>::prepare_weight(s, w.ref(), shape, "test weight", WeightQuant::Int8);
}

using fe_test::ConvCase;

/// The inputs of a Conv1d case on [cout, cin, kernel] weights of dtype dt: x, bias and the weights from seed, seed + 1,
/// seed + 2, and their quantisation per output row (R = cin * kernel values).
struct Conv1dInputs {
    std::vector<float> x, bias;
    HostWeights w;
    Quantised q;
    std::size_t R;
};
Conv1dInputs conv1d_inputs(const ConvCase& k, DType dt, std::uint32_t seed) {
    const std::size_t R = std::size_t(k.cin) * k.kernel;
    HostWeights w = make_weights(std::size_t(k.cout) * R, dt, seed + 2, 0.3f);
    Quantised q = quantise(w.value, std::size_t(k.cout), R, [&](std::size_t r, std::size_t j) { return r * R + j; });
    return {random_vec(std::size_t(k.batch) * k.cin * k.lin, seed), random_vec(std::size_t(k.cout), seed + 1), std::move(w),
            std::move(q), R};
}

/// y of `op(p)` at 1 thread, and CHECKs that 2 threads give the same bits (every packed kernel is deterministic for
/// any thread count). n outputs; p.y is set here.
template <class Params, class Op>
std::vector<float> run_one_and_two_threads(Params& p, std::size_t n, Op op) {
    std::vector<float> y1(n, -3.f), y2(n, -4.f);
    p.y = y1.data();
    with_threads(1, [&] { op(p); });
    p.y = y2.data();
    with_threads(2, [&] { op(p); });
    CHECK(bit_mismatches(y1, y2) == 0);
    return y1;
}

void run_conv1d_int8(const ConvCase& k, DType dt, std::uint32_t seed) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel); CAPTURE(dtype_name(dt));
    const int lout = k.conv_out();
    const auto [x, bias, w, q, R] = conv1d_inputs(k, dt, seed);
    Refs refs(std::size_t(k.batch) * k.cout * lout);
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int t = 0; t < lout; ++t) {
                const std::size_t i = (std::size_t(b) * k.cout + o) * lout + t;
                refs.start(i, bias[std::size_t(o)]);
                for (int c = 0; c < k.cin; ++c)
                    for (int kk = 0; kk < k.kernel; ++kk) {
                        const int src = t * k.stride + kk - k.pad;
                        if (src < 0 || src >= k.lin) continue;
                        const std::size_t wi = std::size_t(o) * R + std::size_t(c) * k.kernel + kk;
                        refs.add(i, w.value[wi], q.deq[wi], q.step[std::size_t(o)], x[(std::size_t(b) * k.cin + c) * k.lin + src]);
                    }
            }
    const auto pw = int8_weight(Storage::ConvWeight, w, Shape{k.cout, k.cin, k.kernel});
    Conv1dParams p = fe_test::conv1d_params(k, x.data(), {nullptr, dt, pw.get()}, bias.data());
    refs.check(run_one_and_two_threads(p, refs.ref.size(), [](const Conv1dParams& c) { Ops<Cpu>::conv1d(c); }), "conv1d on INT8 blocks");
}

void run_conv_transpose1d_int8(const ConvCase& k, std::uint32_t seed) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel);
    const int K = k.kernel, lout = k.transpose_out();
    const auto x = random_vec(std::size_t(k.batch) * k.cin * k.lin, seed);
    const auto bias = random_vec(std::size_t(k.cout), seed + 1);
    const HostWeights w = make_weights(std::size_t(k.cin) * k.cout * K, DType::F32, seed + 2, 0.3f);
    // Packed rows are (output channel o, tap k) of the [out*K, in] kernel-1 conv: row o*K + k holds w[:, o, k].
    const std::size_t J = std::size_t(k.cout) * K;
    const Quantised q = quantise(w.value, J, std::size_t(k.cin), [&](std::size_t r, std::size_t i) { return i * J + r; });
    Refs refs(std::size_t(k.batch) * k.cout * lout);
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int t = 0; t < lout; ++t) {
                const std::size_t idx = (std::size_t(b) * k.cout + o) * lout + t;
                refs.start(idx, bias[std::size_t(o)]);
                for (int kk = 0; kk < K; ++kk) {
                    const int num = t + k.pad - kk;
                    if (num < 0 || num % k.stride != 0 || num / k.stride >= k.lin) continue;
                    for (int c = 0; c < k.cin; ++c) {
                        const std::size_t wi = std::size_t(c) * J + std::size_t(o) * K + kk;
                        refs.add(idx, w.value[wi], q.deq[wi], q.step[std::size_t(o) * K + kk],
                                 x[(std::size_t(b) * k.cin + c) * k.lin + num / k.stride]);
                    }
                }
            }
    const auto pw = int8_weight(Storage::ConvTransposeWeight, w, Shape{k.cin, k.cout, K});
    ConvTranspose1dParams p = fe_test::conv_transpose1d_params(k, x.data(), {nullptr, DType::F32, pw.get()}, bias.data());
    refs.check(run_one_and_two_threads(p, refs.ref.size(), [](const ConvTranspose1dParams& c) { Ops<Cpu>::conv_transpose1d(c); }), "conv_transpose1d on INT8 blocks");
}

}  // namespace

TEST_CASE("conv1d on INT8 blocks: within accumulation rounding of the dequantised weights and the quantisation bound of F32") {
    if (!packs_conv()) {
        MESSAGE("kernel set " << cpu::isa_name(cpu::active_isa()) << " has no INT8 kernels (the error is checked below)");
        return;
    }
    // Outputs not a multiple of the 16-wide block, column counts 1..64 (every micro-kernel width), reductions longer
    // than one 128-step chunk and input channels split over several passes (2048 x 5), the PushT deep-level shape.
    const ConvCase cases[] = {
        {1, 1, 1, 1, 1, 1, 0},    {2, 3, 7, 5, 3, 1, 1},    {1, 37, 129, 16, 5, 1, 2}, {3, 7, 37, 7, 3, 2, 1},
        {1, 129, 3, 4, 1, 1, 0},  {1, 2048, 40, 4, 5, 1, 2}, {4, 61, 30, 16, 3, 1, 1}, {1, 300, 33, 8, 5, 1, 2},
    };
    std::uint32_t seed = 7100;
    for (const auto& k : cases)
        for (DType dt : kAllDtypes) run_conv1d_int8(k, dt, seed += 10);
}

TEST_CASE("conv_transpose1d on INT8 blocks: within accumulation rounding of the dequantised weights and the quantisation bound") {
    if (!packs_conv()) return;
    run_conv_transpose1d_int8({2, 37, 23, 5, 4, 2, 1}, 7300);
    run_conv_transpose1d_int8({3, 96, 300, 16, 5, 2, 2}, 7310);  // K = 5 rows straddle the 96-row chunks
    run_conv_transpose1d_int8({1, 1024, 17, 4, 4, 2, 1}, 7320);   // the PushT Upsample1d reduction length
}

TEST_CASE("linear and linear_batch on INT8 blocks (streamed weights), mixed with F32 blocks in one batch") {
    if (!packs_conv()) return;
    struct Shape3 { int rows, in, out; };
    std::uint32_t seed = 7500;
    for (Shape3 sh : {Shape3{1, 260, 1024}, Shape3{2, 7, 33}, Shape3{3, 129, 50}, Shape3{1, 1, 1}}) {
        CAPTURE(sh.rows); CAPTURE(sh.in); CAPTURE(sh.out);
        const auto x = random_vec(std::size_t(sh.rows) * sh.in, seed += 10);
        const auto bias = random_vec(std::size_t(sh.out), seed + 1);
        const HostWeights w = make_weights(std::size_t(sh.out) * sh.in, DType::F32, seed + 2, 0.3f);
        const std::size_t in = std::size_t(sh.in);
        const Quantised q = quantise(w.value, std::size_t(sh.out), in, [&](std::size_t r, std::size_t j) { return r * in + j; });
        Refs refs(std::size_t(sh.rows) * sh.out);
        for (int r = 0; r < sh.rows; ++r)
            for (int o = 0; o < sh.out; ++o) {
                const std::size_t i = std::size_t(r) * sh.out + o;
                refs.start(i, bias[std::size_t(o)]);
                for (std::size_t j = 0; j < in; ++j)
                    refs.add(i, w.value[std::size_t(o) * in + j], q.deq[std::size_t(o) * in + j], q.step[std::size_t(o)], x[r * in + j]);
            }
        const auto pw = int8_weight(Storage::StreamedMatrix, w, Shape{sh.out, sh.in});
        const auto pf = packed_conv_bytes(w, sh.out);  // the same weights as F32 blocks
        std::vector<float> y(refs.ref.size(), -7.f), yb(y.size(), -8.f), yf(y.size(), -9.f), yfb(y.size(), -6.f);
        LinearParams p;
        p.x = x.data();
        p.w = {nullptr, DType::F32, pw.get()};
        p.bias = bias.data();
        p.y = y.data();
        p.rows = sh.rows;
        p.in = sh.in;
        p.out = sh.out;
        LinearParams pf32 = p;
        pf32.w = {nullptr, DType::F32, pf.get()};
        pf32.y = yf.data();
        Ops<Cpu>::linear(p);
        Ops<Cpu>::linear(pf32);
        refs.check(y, "linear on INT8 blocks");
        // One batch holding the INT8 item and the F32 item: each equals its own single call bit for bit.
        LinearBatchParams bp;
        bp.n_items = 2;
        bp.items[0] = p;
        bp.items[0].y = yb.data();
        bp.items[1] = pf32;
        bp.items[1].y = yfb.data();
        Ops<Cpu>::linear_batch(bp);
        CHECK(bit_mismatches(yb, y) == 0);
        CHECK(bit_mismatches(yfb, yf) == 0);
    }
}

TEST_CASE("INT8 weights: non-finite weights and unsupported kernel sets are load errors naming the option") {
    const HostWeights w = make_weights(3 * 4, DType::F32, 7700, 0.3f);
    // A weight kind the packed conv kernels do not stream is never quantised (Parameter only asks for quantizable()).
    CHECK_THROWS_WITH_AS(Ops<Cpu>::prepare_weight(Storage::SmallRowsMatrix, w.ref(), Shape{3, 4}, "test weight", WeightQuant::Int8),
                         "flowedge: cpu: test weight: INT8 requested for a weight kind the packed conv kernels do not stream", Error);
    if (!packs_conv()) {
        const std::string set(cpu::isa_name(cpu::active_isa()));
        CHECK_THROWS_WITH_AS(int8_weight(Storage::ConvWeight, w, Shape{3, 4, 1}),
                             ("flowedge: cpu: test weight: LoadOptions::quantize = Int8 needs the AVX2 or AVX-512 kernel set (the only ones with "
                              "INT8 kernels) (expected an x86-64 CPU with AVX2 and FLOWEDGE_CPU_ISA unset, avx2 or avx512, or quantize = None, "
                              "got kernel set " + set + ")")
                                 .c_str(),
                             Error);
        return;
    }
    HostWeights bad = w;
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(bad.bytes.data() + 4 * 5, &inf, 4);  // row 1 of [3, 4]
    CHECK_THROWS_WITH_AS(int8_weight(Storage::ConvWeight, bad, Shape{3, 4, 1}),
                         "flowedge: cpu int8 weights: LoadOptions::quantize = Int8 needs finite weights (expected finite values, got a "
                         "non-finite value in output row 1)",
                         Error);
    // An all-zero row quantises to zero with scale 0 (no division by zero): its outputs are the bias.
    HostWeights zero = w;
    std::fill(zero.bytes.begin(), zero.bytes.end(), std::uint8_t(0));
    const auto pz = int8_weight(Storage::StreamedMatrix, zero, Shape{3, 4});
    const auto x = random_vec(4, 7701);
    const std::vector<float> bias{0.5f, -1.f, 2.f};
    std::vector<float> y(3);
    LinearParams p;
    p.x = x.data();
    p.w = {nullptr, DType::F32, pz.get()};
    p.bias = bias.data();
    p.y = y.data();
    p.rows = 1;
    p.in = 4;
    p.out = 3;
    Ops<Cpu>::linear(p);
    CHECK(y == bias);
}

namespace {

/// conv1d on W8A8 blocks (WeightQuant::W8A8) against
///   - a double loop on the dequantised weights and the activations quantised here as the kernel does (per output
///     position t of batch row b, over the im2col column's range [lo, hi], with the kernel set's levels L = 255 for
///     vpdpbusd or 127 for AVX2: s_x = (hi - lo) / L in float, u = round((x - lo) * (L / (hi - lo))) in [0, L],
///     x_q = lo + s_x u): the int32 sum is exact, then four
///     float roundings of values up to sum |w_q| (|s_x u| + |lo|), 2e-6 of that;
///   - a double loop on the original weights and activations: |dy| <= sum (s_w / 2 |x| + s_x / 2 |w_q|) plus the same
///     rounding term;
/// and bit-identical results for 1 and 2 threads.
void run_conv1d_w8a8(const ConvCase& k, DType dt, std::uint32_t seed) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel); CAPTURE(dtype_name(dt));
    const int lout = k.conv_out();
    const auto [x, bias, w, q, R] = conv1d_inputs(k, dt, seed);
    const std::size_t n = std::size_t(k.batch) * k.cout * lout;
    const float levels = float(cpu::w8a8_activation_levels());
    std::vector<double> ref(n), mag(n), ref_q(n), mag_q(n), bound(n);
    std::vector<float> col(R), col_q(R);
    for (int b = 0; b < k.batch; ++b)
        for (int t = 0; t < lout; ++t) {
            float lo = INFINITY, hi = -INFINITY;
            for (int c = 0; c < k.cin; ++c)
                for (int kk = 0; kk < k.kernel; ++kk) {
                    const int src = t * k.stride + kk - k.pad;
                    const float v = src < 0 || src >= k.lin ? 0.f : x[(std::size_t(b) * k.cin + c) * k.lin + src];
                    col[std::size_t(c) * k.kernel + kk] = v;
                    lo = std::min(lo, v);
                    hi = std::max(hi, v);
                }
            const float sx = (hi - lo) / levels, inv = hi > lo ? levels / (hi - lo) : 0.f;
            for (std::size_t j = 0; j < R; ++j)
                col_q[j] = float(double(lo) + double(sx) * std::clamp(std::nearbyint((col[j] - lo) * inv), 0.f, levels));
            for (int o = 0; o < k.cout; ++o) {
                const std::size_t i = (std::size_t(b) * k.cout + o) * lout + t;
                ref[i] = ref_q[i] = bias[std::size_t(o)];
                mag[i] = mag_q[i] = std::fabs(bias[std::size_t(o)]);
                for (std::size_t j = 0; j < R; ++j) {
                    const std::size_t wi = std::size_t(o) * R + j;
                    ref[i] += w.value[wi] * col[j];
                    mag[i] += std::fabs(w.value[wi] * col[j]);
                    ref_q[i] += q.deq[wi] * double(col_q[j]);
                    mag_q[i] += std::fabs(q.deq[wi]) * (std::fabs(double(col_q[j]) - double(lo)) + std::fabs(double(lo)));
                    bound[i] += 0.5 * q.step[std::size_t(o)] * std::fabs(col[j]) + 0.5 * double(sx) * std::fabs(q.deq[wi]);
                }
            }
        }
    const auto pw = Ops<Cpu>::prepare_weight(Storage::ConvWeight, w.ref(), Shape{k.cout, k.cin, k.kernel}, "test weight", WeightQuant::W8A8);
    Conv1dParams p = fe_test::conv1d_params(k, x.data(), {nullptr, dt, pw.get()}, bias.data());
    const std::vector<float> y1 = run_one_and_two_threads(p, n, [](const Conv1dParams& c) { Ops<Cpu>::conv1d(c); });
    check_all(y1, ref_q, mag_q, kTolRef, "conv1d on W8A8 blocks vs the quantised weights and activations");
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double d = std::fabs(double(y1[i]) - ref[i]);
        REQUIRE_MESSAGE(d <= bound[i] + kTolRef * mag[i], "output " << i << ": |dy| = " << d << " > bound " << bound[i] + kTolRef * mag[i]);
        if (bound[i] > 0) worst = std::max(worst, d / bound[i]);
    }
    MESSAGE("conv1d on W8A8 blocks: largest |y - y_f32| / quantisation bound = " << worst);
}

}  // namespace

TEST_CASE("conv1d on W8A8 blocks on AMX tiles (tdpbusd): bit-identical to the vpdpbusd kernel at odd sizes") {
    if (!cpu::amx_int8_available()) {
        MESSAGE("kernel set " << cpu::kernel_set_name() << ": no AMX-INT8 (or FLOWEDGE_CPU_AMX=0), AMX kernel not run");
        return;
    }
#if defined(FLOWEDGE_CPU_X86)
    // Both kernels sum u * q exactly in int32 and share the epilogue, so every output must match bit for bit.
    // Columns 1..75 (one or two 16-row column tiles, passes of 32, fewer columns for long rows), reductions that are
    // not a multiple of 64 steps (the partial last tile) or of 4 (a zero-padded quad), outputs not a multiple of 32
    // (or 16), and the longest PushT row (2048 channels x 5 = 10240 steps).
    const ConvCase cases[] = {{1, 1, 1, 1, 1, 1, 0},    {2, 3, 7, 5, 3, 1, 1},    {1, 37, 129, 16, 5, 1, 2},
                              {1, 13, 33, 17, 5, 1, 2}, {3, 7, 37, 7, 3, 2, 1},   {1, 40, 17, 31, 3, 1, 1},
                              {5, 6, 9, 16, 5, 1, 2},   {3, 50, 45, 25, 5, 1, 2}, {1, 2048, 40, 4, 5, 1, 2},
                              {2, 4096, 33, 8, 5, 1, 2}, {1, 512, 2, 16, 1, 1, 0}};
    std::uint32_t seed = 8300;
    for (const auto& k : cases) {
        CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel);
        const int lout = k.conv_out();
        const auto x = random_vec(std::size_t(k.batch) * k.cin * k.lin, seed += 10);
        const auto bias = random_vec(std::size_t(k.cout), seed + 1);
        const HostWeights w = make_weights(std::size_t(k.cout) * k.cin * k.kernel, DType::F32, seed + 2, 0.3f);
        const auto pw = Ops<Cpu>::prepare_weight(Storage::ConvWeight, w.ref(), Shape{k.cout, k.cin, k.kernel}, "test weight", WeightQuant::W8A8);
        const auto* blocks = static_cast<const cpu::avx2::Int8Blocks*>(cpu::packed_weight({nullptr, DType::F32, pw.get()})->data());
        REQUIRE(blocks->w8a8);
        Conv1dParams p = fe_test::conv1d_params(k, x.data(), {nullptr, DType::F32, pw.get()}, bias.data());
        const std::size_t n = std::size_t(k.batch) * k.cout * lout;
        std::vector<float> y_vnni(n, -3.f), y_amx(n, -4.f), y_amx2(n, -5.f);
        p.y = y_vnni.data();
        cpu::avx512::packed_dot::conv1d_w8a8(p, blocks->data);
        p.y = y_amx.data();
        with_threads(1, [&] { cpu::avx512::packed_dot::amx::conv1d_w8a8_amx(p, blocks->data); });
        p.y = y_amx2.data();
        with_threads(2, [&] { cpu::avx512::packed_dot::amx::conv1d_w8a8_amx(p, blocks->data); });
        CHECK(bit_mismatches(y_vnni, y_amx) == 0);
        CHECK(bit_mismatches(y_vnni, y_amx2) == 0);
    }
#endif
}

TEST_CASE("conv1d on W8A8 blocks (AVX512_VNNI or AVX2): within rounding of the quantised operands and the quantisation bound") {
    if (!cpu::w8a8_available()) {
        const HostWeights w = make_weights(3 * 4, DType::F32, 7800, 0.3f);
        CHECK_THROWS_WITH_AS(Ops<Cpu>::prepare_weight(Storage::ConvWeight, w.ref(), Shape{3, 4, 1}, "test weight", WeightQuant::W8A8),
                             ("flowedge: cpu: test weight: LoadOptions::quantize = W8A8 needs the AVX2 kernel set, or the AVX-512 set on "
                              "a CPU with AVX512_VNNI (expected an x86-64 CPU with AVX2 and FLOWEDGE_CPU_ISA unset, avx2 or (AVX512_VNNI "
                              "CPUs) avx512, or quantize = Int8 / None, got kernel set " + cpu::kernel_set_name() + ")").c_str(),
                             Error);
        MESSAGE("kernel set " << cpu::kernel_set_name() << ": W8A8 refused at load, as it must be");
        return;
    }
    // Column counts 1..80 (every micro-kernel width, passes of 64 columns and of fewer for long rows), output counts
    // that are not a multiple of 32, reductions that are not a multiple of 4, the PushT shapes.
    const ConvCase cases[] = {
        {1, 1, 1, 1, 1, 1, 0}, {2, 3, 7, 5, 3, 1, 1}, {1, 37, 129, 16, 5, 1, 2}, {3, 7, 37, 7, 3, 2, 1},
        {5, 6, 9, 16, 5, 1, 2}, {1, 2048, 40, 4, 5, 1, 2}, {2, 4096, 33, 8, 5, 1, 2}, {1, 512, 2, 16, 1, 1, 0},
    };
    std::uint32_t seed = 7900;
    for (const auto& k : cases)
        for (DType dt : {DType::F32, DType::BF16}) run_conv1d_w8a8(k, dt, seed += 10);
    // A non-finite input column (inf, then NaN) gives NaN outputs at its position (the exact kernels give non-finite
    // ones there).
    const HostWeights w = make_weights(4 * 3, DType::F32, 7990, 0.3f);
    const auto pw = Ops<Cpu>::prepare_weight(Storage::ConvWeight, w.ref(), Shape{4, 3, 1}, "test weight", WeightQuant::W8A8);
    std::vector<float> x{1.f, 2.f, 3.f, std::numeric_limits<float>::infinity(), 5.f, 6.f}, y(8);  // [1, 3, 2]
    Conv1dParams p;
    p.x = x.data();
    p.w = {nullptr, DType::F32, pw.get()};
    p.y = y.data();
    p.batch = 1;
    p.in_channels = 3;
    p.out_channels = 4;
    p.in_length = p.out_length = 2;
    p.kernel = 1;
    Ops<Cpu>::conv1d(p);
    for (int o = 0; o < 4; ++o) {
        CHECK(std::isfinite(y[std::size_t(o) * 2]));
        CHECK(std::isnan(y[std::size_t(o) * 2 + 1]));
    }
    x[3] = 4.f;
    x[0] = std::numeric_limits<float>::quiet_NaN();  // now column 0 holds a NaN
    Ops<Cpu>::conv1d(p);
    for (int o = 0; o < 4; ++o) {
        CHECK(std::isnan(y[std::size_t(o) * 2]));
        CHECK(std::isfinite(y[std::size_t(o) * 2 + 1]));
    }
    // A constant column is exact in the weights' quantisation: x = 2 everywhere gives 2 * sum_j w_q.
    std::fill(x.begin(), x.end(), 2.f);
    Ops<Cpu>::conv1d(p);
    const Quantised q = quantise(w.value, 4, 3, [](std::size_t r, std::size_t j) { return r * 3 + j; });
    for (int o = 0; o < 4; ++o) {
        const double want = 2.0 * (q.deq[std::size_t(o) * 3] + q.deq[std::size_t(o) * 3 + 1] + q.deq[std::size_t(o) * 3 + 2]);
        CHECK(std::fabs(y[std::size_t(o) * 2] - want) <= 1e-6 * std::fabs(want) + 1e-7);
    }
}

namespace {

/// conv1d on INT8 weight-only blocks under MathMode::BF16 (Ops<Cpu>::conv1d's choice). Where AMX-BF16 runs it
/// (cpu::amx_bf16_available(): the int8 weights widened exactly to BF16 tiles, the activations rounded to BF16, sums
/// in 128-step slices, then the row scale and the bias) it is held to the packed BF16 bound of docs/numerics.md with
/// BF16-exact weights (operand error u = 2^-8 on the activations only), depth min(n, 128) + ceil(n / 128) + 3 (one
/// more rounding: the scale), against
///   - a double loop on the dequantised weights and the BF16-rounded activations: accumulation only;
///   - a double loop on the dequantised weights and the F32 activations: the BF16 operand term as well;
///   - a double loop on the original weights: the quantisation bound on top;
/// it must differ from the F32-math INT8 kernel and give the same bits for 1 and 2 threads. Everywhere else the
/// request computes exactly: bit-identical to MathMode::F32 on the same blocks.
void run_conv1d_int8_bf16(const ConvCase& k, DType dt, std::uint32_t seed) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel); CAPTURE(dtype_name(dt));
    constexpr double kU = 1.0 / 256, kU32 = 1.0 / 16777216, kTiny = 2.3509887016445750e-38;
    const int lout = k.conv_out();
    const auto [x, bias, w, q, R] = conv1d_inputs(k, dt, seed);
    const auto pw = int8_weight(Storage::ConvWeight, w, Shape{k.cout, k.cin, k.kernel});
    Conv1dParams p = fe_test::conv1d_params(k, x.data(), {nullptr, dt, pw.get()}, bias.data());
    const std::size_t n = std::size_t(k.batch) * k.cout * lout;
    std::vector<float> y32(n, -2.f);
    p.y = y32.data();
    Ops<Cpu>::conv1d(p);
    p.math = MathMode::BF16;
    const std::vector<float> y1 = run_one_and_two_threads(p, n, [](const Conv1dParams& c) { Ops<Cpu>::conv1d(c); });
    if (!cpu::amx_bf16_available()) {
        CHECK(bit_mismatches(y1, y32) == 0);  // no BF16 kernel for INT8 blocks here: the request computes exactly
        return;
    }
    const double d = double(std::min<std::size_t>(R, 128) + (R + 127) / 128 + 3), g = d * kU32 / (1 - d * kU32);
    std::size_t bad = 0, bad_rounded = 0, bad_f32 = 0, differ = 0;
    double worst = 0;
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int t = 0; t < lout; ++t) {
                double ref = 0, ref_q = 0, ref_qr = 0, mag = 0, mag_q = 0, mag_qr = 0, quant = 0, tiny = 0;
                for (int c = 0; c < k.cin; ++c)
                    for (int kk = 0; kk < k.kernel; ++kk) {
                        const int src = t * k.stride + kk - k.pad;
                        if (src < 0 || src >= k.lin) continue;
                        const std::size_t wi = std::size_t(o) * R + std::size_t(c) * k.kernel + kk;
                        const double xv = x[(std::size_t(b) * k.cin + c) * k.lin + src], xr = rne_bf16(xv);
                        ref += w.value[wi] * xv;
                        mag += std::fabs(w.value[wi] * xv);
                        ref_q += q.deq[wi] * xv;
                        mag_q += std::fabs(q.deq[wi] * xv);
                        ref_qr += q.deq[wi] * xr;
                        mag_qr += std::fabs(q.deq[wi] * xr);
                        quant += 0.5 * q.step[std::size_t(o)] * std::fabs(xv);
                        tiny += kTiny * (std::fabs(q.deq[wi]) + std::fabs(xv) + 1);
                    }
                const std::size_t i = (std::size_t(b) * k.cout + o) * lout + t;
                const double bo = bias[std::size_t(o)], got = y1[i];
                const double acc = g * (mag_qr + std::fabs(bo)) + tiny + 16 * kTiny;
                const double bnd_q = (kU + g * (1 + kU)) * mag_q + g * std::fabs(bo) + tiny + 16 * kTiny;
                bad_rounded += !(std::fabs(got - (ref_qr + bo)) <= acc);
                bad += !(std::fabs(got - (ref_q + bo)) <= bnd_q);
                const double err = std::fabs(got - (ref + bo)), bnd = quant + bnd_q + kTolRef * mag;
                bad_f32 += !(err <= bnd);
                if (bnd > 0) worst = std::max(worst, err / bnd);
                differ += y1[i] != y32[i];
            }
    INFO("worst |y - y_f32 weights| / bound " << worst << ", " << differ << " of " << n << " outputs differ from F32 math");
    CHECK(bad_rounded == 0);
    CHECK(bad == 0);
    CHECK(bad_f32 == 0);
    if (R > 1) CHECK(differ > 0);  // the BF16 kernel really ran (random data: rounding the activations moves outputs)
    MESSAGE("conv1d on INT8 blocks, BF16 math (AMX): largest |y - y_f32| / (quantisation + BF16 bound) = " << worst);
}

}  // namespace

TEST_CASE("conv1d on INT8 blocks under MathMode::BF16: AMX tiles within the BF16 bound of the dequantised weights, else exact") {
    if (!packs_conv()) return;  // INT8 blocks are refused at load there (checked above)
    MESSAGE("kernel set " << cpu::kernel_set_name() << std::string(cpu::amx_bf16_available() ? ": INT8 x BF16 on AMX tiles" : ": INT8 x BF16 computes exactly"));
    // Columns 1..75 (one or two 16-row column tiles, passes of 32, fewer columns for long rows), odd reductions (a
    // half pair), reductions that are not a multiple of 32 steps (a partial last tile) or longer than a 128-step slice,
    // an odd number of 16-output blocks (a unit of one block), outputs not a multiple of 16, the longest PushT row,
    // and a call large enough for the OpenMP split (4 x 16 columns x 2560 steps x 70 outputs: two threads, two passes).
    const ConvCase cases[] = {{1, 1, 1, 1, 1, 1, 0},    {2, 3, 7, 5, 3, 1, 1},     {1, 37, 129, 16, 5, 1, 2},
                              {1, 13, 33, 17, 5, 1, 2}, {3, 7, 37, 7, 3, 2, 1},    {1, 40, 17, 31, 3, 1, 1},
                              {5, 6, 9, 16, 5, 1, 2},   {3, 50, 45, 25, 5, 1, 2},  {1, 2048, 40, 4, 5, 1, 2},
                              {2, 520, 48, 8, 5, 1, 2}, {1, 512, 2, 16, 1, 1, 0},  {4, 512, 70, 16, 5, 1, 2}};
    std::uint32_t seed = 8500;
    for (const auto& k : cases)
        for (DType dt : {DType::F32, DType::BF16}) run_conv1d_int8_bf16(k, dt, seed += 10);
}
