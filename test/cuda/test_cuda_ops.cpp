// Every Ops<Cuda> primitive against Ops<Cpu> (and, for the weight-streaming ops and norms, against a
// naive double-accumulating reference) on odd sizes and the PushT U-Net shapes, in every weight dtype.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_test_util.hpp"
#include "flowedge/noise.hpp"
#include "flowedge/ops.hpp"

using namespace flowedge;
using namespace flowedge::test;

namespace {

constexpr double kTolRef = 2e-6;   // SPEC 4: kernels vs a double-accumulating loop (conv/norm/FiLM)
constexpr double kTolCpu = 4e-6;   // CUDA vs CPU: both within kTolRef of the reference
constexpr Activation kActs[] = {Activation::None, Activation::Silu, Activation::Mish, Activation::Softplus};

double act_d(Activation a, double x) {
    switch (a) {
        case Activation::None: return x;
        case Activation::Silu: return x / (1.0 + std::exp(-x));
        case Activation::Mish: return x * std::tanh(x > 20 ? x : std::log1p(std::exp(x)));
        case Activation::Softplus: return x > 20 ? x : std::log1p(std::exp(x));
    }
    return x;
}

// ---- linear ------------------------------------------------------------------------------------------

void run_linear(int rows, int in, int out, DType dt, Activation act, bool accumulate, int ld_x_pad, int ld_y_pad) {
    CAPTURE(rows); CAPTURE(in); CAPTURE(out); CAPTURE(int(dt)); CAPTURE(int(act)); CAPTURE(accumulate);
    CAPTURE(ld_x_pad); CAPTURE(ld_y_pad);
    const int ld_x = in + ld_x_pad, ld_y = out + ld_y_pad;
    const auto x = random_vec(std::size_t(rows) * ld_x, 11u + rows);
    const float wscale = 1.f / std::sqrt(float(in));
    Weights w(random_vec(std::size_t(out) * in, 12u + in, -wscale, wscale), dt);
    const auto bias = random_vec(out, 13u + out);
    const auto y0 = random_vec(std::size_t(rows) * ld_y, 14u);

    DeviceArray<float> dx(x), dbias(bias), dy(y0);
    LinearParams p;
    p.rows = rows; p.in = in; p.out = out; p.ld_x = ld_x; p.ld_y = ld_y; p.act = act; p.accumulate = accumulate;
    p.x = dx.get(); p.w = w.gpu(); p.bias = dbias.get(); p.y = dy.get();
    Ops<Cuda>::linear(p, {});
    const auto gpu = dy.download();

    std::vector<float> cpu = y0;
    p.x = x.data(); p.w = w.cpu(); p.bias = bias.data(); p.y = cpu.data();
    Ops<Cpu>::linear(p, {});

    std::vector<double> ref(y0.begin(), y0.end());
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < out; ++o) {
            double s = bias[o];
            for (int i = 0; i < in; ++i) s += double(w.widened[std::size_t(o) * in + i]) * x[std::size_t(r) * ld_x + i];
            const double v = act_d(act, s);
            double& dst = ref[std::size_t(r) * ld_y + o];
            dst = accumulate ? dst + v : v;
        }
    CHECK(max_norm_rel(gpu, ref) <= kTolRef);
    CHECK(max_norm_rel(gpu, cpu) <= kTolCpu);
    // Padding columns of y are untouched.
    for (int r = 0; r < rows; ++r)
        for (int o = out; o < ld_y; ++o) CHECK(gpu[std::size_t(r) * ld_y + o] == y0[std::size_t(r) * ld_y + o]);
}

// ---- linear_batch ------------------------------------------------------------------------------------

struct BatchItem {
    int rows, in, out, ld_x_pad, ld_y_pad, x_shift;  // x_shift: x starts this many floats into its buffer (alignment)
    DType dt;
    Activation act;
    bool accumulate, bias;
};

/// linear_batch of `items` on the GPU vs the same items through the single GPU linear (bit-identical: same
/// per-output math), vs Ops<Cpu>::linear_batch and vs a double reference.
void run_linear_batch(const std::vector<BatchItem>& items, bool shared_x) {
    const int n = int(items.size());
    REQUIRE(n <= kMaxLinearBatch);
    struct Host {
        std::vector<float> x, bias, y0;
        Weights w;
    };
    std::vector<Host> h;
    std::vector<DeviceArray<float>> dx, db, dy_batch, dy_single;
    std::vector<std::vector<float>> cpu_y;
    const int shared_in = items[0].in;
    for (int i = 0; i < n; ++i) {
        const BatchItem& k = items[std::size_t(i)];
        if (shared_x) REQUIRE(k.in == shared_in);
        const int ld_x = k.in + k.ld_x_pad, ld_y = k.out + k.ld_y_pad, rows = std::max(k.rows, 1);
        const float wscale = 1.f / std::sqrt(float(k.in));
        h.push_back({random_vec(std::size_t(k.x_shift) + std::size_t(rows) * ld_x, 300u + i), random_vec(k.out, 400u + i),
                     random_vec(std::size_t(rows) * ld_y, 500u + i),
                     Weights(random_vec(std::size_t(k.out) * k.in, 600u + i, -wscale, wscale), k.dt)});
        dx.emplace_back(shared_x && i > 0 ? std::vector<float>(1) : h.back().x);
        db.emplace_back(h.back().bias);
        dy_batch.emplace_back(h.back().y0);
        dy_single.emplace_back(h.back().y0);
        cpu_y.push_back(h.back().y0);
    }
    auto params = [&](int i, bool gpu, float* y) {
        const BatchItem& k = items[std::size_t(i)];
        const int xi = shared_x ? 0 : i;
        LinearParams p;
        p.rows = k.rows; p.in = k.in; p.out = k.out; p.act = k.act; p.accumulate = k.accumulate;
        p.ld_x = k.ld_x_pad ? k.in + k.ld_x_pad : 0;
        p.ld_y = k.ld_y_pad ? k.out + k.ld_y_pad : 0;
        p.x = (gpu ? dx[std::size_t(xi)].get() : h[std::size_t(xi)].x.data()) + items[std::size_t(xi)].x_shift;
        p.w = gpu ? h[std::size_t(i)].w.gpu() : h[std::size_t(i)].w.cpu();
        p.bias = k.bias ? (gpu ? db[std::size_t(i)].get() : h[std::size_t(i)].bias.data()) : nullptr;
        p.y = y;
        return p;
    };
    LinearBatchParams gb, cb;
    gb.n_items = cb.n_items = n;
    for (int i = 0; i < n; ++i) {
        gb.items[i] = params(i, true, dy_batch[std::size_t(i)].get());
        cb.items[i] = params(i, false, cpu_y[std::size_t(i)].data());
        Ops<Cuda>::linear(params(i, true, dy_single[std::size_t(i)].get()), {});
    }
    Ops<Cuda>::linear_batch(gb, {});
    Ops<Cpu>::linear_batch(cb, {});
    for (int i = 0; i < n; ++i) {
        const BatchItem& k = items[std::size_t(i)];
        CAPTURE(i); CAPTURE(k.rows); CAPTURE(k.in); CAPTURE(k.out); CAPTURE(int(k.dt)); CAPTURE(k.x_shift);
        const auto got = dy_batch[std::size_t(i)].download(), single = dy_single[std::size_t(i)].download();
        REQUIRE(got.size() == single.size());
        std::size_t differ = 0;
        for (std::size_t j = 0; j < got.size(); ++j) differ += std::memcmp(&got[j], &single[j], sizeof(float)) != 0;
        CHECK(differ == 0);  // bit-identical to the single op
        const Host& hx = h[std::size_t(shared_x ? 0 : i)];
        const int ld_x = k.in + k.ld_x_pad, ld_y = k.out + k.ld_y_pad;
        std::vector<double> ref(h[std::size_t(i)].y0.begin(), h[std::size_t(i)].y0.end());
        for (int r = 0; r < k.rows; ++r)
            for (int o = 0; o < k.out; ++o) {
                double s = k.bias ? h[std::size_t(i)].bias[std::size_t(o)] : 0.0;
                for (int c = 0; c < k.in; ++c)
                    s += double(h[std::size_t(i)].w.widened[std::size_t(o) * k.in + c]) *
                         hx.x[std::size_t(items[std::size_t(shared_x ? 0 : i)].x_shift) + std::size_t(r) * ld_x + c];
                const double v = act_d(k.act, s);
                double& dst = ref[std::size_t(r) * ld_y + o];
                dst = k.accumulate ? dst + v : v;
            }
        CHECK(max_norm_rel(got, ref) <= kTolRef);
        CHECK(max_norm_rel(got, cpu_y[std::size_t(i)]) <= kTolCpu);
        if (k.rows == 0) CHECK(got == h[std::size_t(i)].y0);
    }
}

}  // namespace

TEST_CASE("cuda linear_batch equals the single linear bit for bit and matches the CPU (odd sizes, mixed dtypes)") {
    // Odd shapes, strides, several row passes, accumulate, activations, a misaligned x (scalar path next to vector
    // items), a zero-row item and one output feature; F32/BF16/F16 mixed in one launch.
    run_linear_batch({{1, 1, 1, 0, 0, 0, DType::BF16, Activation::None, false, true},
                      {3, 7, 37, 0, 0, 0, DType::F32, Activation::Silu, false, true},
                      {7, 129, 3, 0, 0, 0, DType::F16, Activation::Mish, true, true},
                      {5, 37, 129, 3, 2, 0, DType::BF16, Activation::Softplus, false, false},
                      {9, 256, 65, 4, 1, 0, DType::F32, Activation::None, true, true},
                      {2, 256, 33, 0, 0, 1, DType::F16, Activation::None, false, true},  // x misaligned: scalar path
                      {0, 5, 3, 0, 0, 0, DType::F32, Activation::None, false, true},     // no rows: untouched
                      {4, 1024, 130, 0, 0, 0, DType::BF16, Activation::Mish, false, true}},
                     false);
    // The U-Net FiLM batch: 15 cond_encoder linears reading one g (260 = 128 + 132), PushT widths and odd ones.
    const int outs[] = {512, 512, 1024, 1024, 2048, 2048, 4096, 4096, 4096, 4096, 2048, 2048, 1024, 1024, 74};
    for (int v = 0; v < 2; ++v) {
        std::vector<BatchItem> film;
        for (int i = 0; i < 15; ++i) {
            const DType dt = v == 0 ? DType(i % 3 == 0 ? DType::F32 : i % 3 == 1 ? DType::BF16 : DType::F16) : DType::F32;
            film.push_back({1, 260, outs[i] - (v == 1 ? 2 * i + 1 : 0), 0, 0, 0, dt, Activation::None, false, true});
        }
        CAPTURE(v);
        run_linear_batch(film, true);
    }
}

TEST_CASE("cuda linear_batch rejects bad counts and bad items, naming the item") {
    DeviceArray<float> buf(256);
    Weights w(random_vec(64, 92u), DType::F32);
    LinearParams l;
    l.x = buf.get(); l.w = w.gpu(); l.y = buf.get() + 128; l.rows = 1; l.in = 4; l.out = 2;
    LinearBatchParams lb;
    CHECK_THROWS_WITH_AS(Ops<Cuda>::linear_batch(lb, {}), doctest::Contains("cuda linear_batch: item count out of range (expected 1..16, got 0)"), Error);
    lb.n_items = kMaxLinearBatch + 1;
    CHECK_THROWS_WITH_AS(Ops<Cuda>::linear_batch(lb, {}), doctest::Contains("got 17"), Error);
    lb.n_items = 3;
    for (int i = 0; i < 3; ++i) {
        lb.items[i] = l;
        lb.items[i].y = buf.get() + 128 + 8 * i;
    }
    CHECK_NOTHROW(Ops<Cuda>::linear_batch(lb, {}));
    lb.items[2].out = 0;
    CHECK_THROWS_WITH_AS(Ops<Cuda>::linear_batch(lb, {}), doctest::Contains("cuda linear_batch: item 2: sizes must be positive"), Error);
    lb.items[2].out = 2;
    lb.items[1].ld_y = 1;
    CHECK_THROWS_WITH_AS(Ops<Cuda>::linear_batch(lb, {}), doctest::Contains("item 1: row stride shorter than the row"), Error);
    lb.items[1].ld_y = 0;
    lb.items[1].x = nullptr;
    CHECK_THROWS_WITH_AS(Ops<Cuda>::linear_batch(lb, {}), doctest::Contains("item 1: null x, w or y pointer"), Error);
    lb.items[1].x = buf.get();
    lb.items[0].w.dtype = static_cast<DType>(77);
    CHECK_THROWS_WITH_AS(Ops<Cuda>::linear_batch(lb, {}), doctest::Contains("item 0: unknown weight dtype"), Error);
    lb.items[0].w.dtype = DType::F32;
    lb.items[2].y = buf.get() + 1;  // writes into the shared input x
    CHECK_THROWS_WITH_AS(Ops<Cuda>::linear_batch(lb, {}), doctest::Contains("item 2: output overlaps the input of item 0"), Error);
    Memory<Cuda>::synchronize();
}

namespace {

// ---- conv1d ------------------------------------------------------------------------------------------

/// `w_skip` > 0 stores the weights `w_skip` elements past the start of their allocation (a misaligned weight
/// pointer: 16-bit weights at w_skip = 4 are 8- but not 16-byte aligned).
void run_conv1d(int batch, int in, int out, int len, int k, int stride, int pad, DType dt, std::uint32_t seed,
                int w_skip = 0) {
    CAPTURE(batch); CAPTURE(in); CAPTURE(out); CAPTURE(len); CAPTURE(k); CAPTURE(stride); CAPTURE(pad); CAPTURE(int(dt));
    CAPTURE(w_skip);
    const int out_len = (len + 2 * pad - k) / stride + 1;
    const auto x = random_vec(std::size_t(batch) * in * len, seed);
    const float wscale = 1.f / std::sqrt(float(in * k));
    auto wvals = random_vec(std::size_t(out) * in * k, seed + 1, -wscale, wscale);
    wvals.insert(wvals.begin(), std::size_t(w_skip), 0.f);
    Weights w(wvals, dt);
    const std::size_t w_off = std::size_t(w_skip) * dtype_size(dt);
    const auto bias = random_vec(out, seed + 2);
    DeviceArray<float> dx(x), dbias(bias), dy(std::size_t(batch) * out * out_len);

    Conv1dParams p;
    p.batch = batch; p.in_channels = in; p.out_channels = out; p.in_length = len; p.out_length = out_len;
    p.kernel = k; p.stride = stride; p.pad = pad;
    p.x = dx.get(); p.w = {w.device.get() + w_off, dt}; p.bias = dbias.get(); p.y = dy.get();
    Ops<Cuda>::conv1d(p, {});
    const auto gpu = dy.download();

    std::vector<float> cpu(gpu.size());
    p.x = x.data(); p.w = {w.host.data() + w_off, dt}; p.bias = bias.data(); p.y = cpu.data();
    Ops<Cpu>::conv1d(p, {});

    std::vector<double> ref(gpu.size());
    for (int b = 0; b < batch; ++b)
        for (int o = 0; o < out; ++o)
            for (int t = 0; t < out_len; ++t) {
                double s = bias[o];
                for (int i = 0; i < in; ++i)
                    for (int kk = 0; kk < k; ++kk) {
                        const int pos = t * stride + kk - pad;
                        if (pos >= 0 && pos < len)
                            s += double(w.widened[std::size_t(w_skip) + (std::size_t(o) * in + i) * k + kk]) *
                                 x[(std::size_t(b) * in + i) * len + pos];
                    }
                ref[(std::size_t(b) * out + o) * out_len + t] = s;
            }
    CHECK(max_norm_rel(gpu, ref) <= kTolRef);
    CHECK(max_norm_rel(gpu, cpu) <= kTolCpu);
}

// ---- conv_transpose1d --------------------------------------------------------------------------------

void run_convt(int batch, int in, int out, int len, int k, int stride, int pad, int out_pad, DType dt, std::uint32_t seed) {
    CAPTURE(batch); CAPTURE(in); CAPTURE(out); CAPTURE(len); CAPTURE(k); CAPTURE(stride); CAPTURE(pad); CAPTURE(int(dt));
    const int out_len = (len - 1) * stride - 2 * pad + k + out_pad;
    const auto x = random_vec(std::size_t(batch) * in * len, seed);
    const float wscale = 1.f / std::sqrt(float(in * k));
    Weights w(random_vec(std::size_t(in) * out * k, seed + 1, -wscale, wscale), dt);
    const auto bias = random_vec(out, seed + 2);
    DeviceArray<float> dx(x), dbias(bias), dy(std::size_t(batch) * out * out_len);

    ConvTranspose1dParams p;
    p.batch = batch; p.in_channels = in; p.out_channels = out; p.in_length = len; p.out_length = out_len;
    p.kernel = k; p.stride = stride; p.pad = pad;
    p.x = dx.get(); p.w = w.gpu(); p.bias = dbias.get(); p.y = dy.get();
    Ops<Cuda>::conv_transpose1d(p, {});
    const auto gpu = dy.download();

    std::vector<float> cpu(gpu.size());
    p.x = x.data(); p.w = w.cpu(); p.bias = bias.data(); p.y = cpu.data();
    Ops<Cpu>::conv_transpose1d(p, {});

    std::vector<double> ref(gpu.size());
    for (int b = 0; b < batch; ++b)
        for (int o = 0; o < out; ++o)
            for (int t = 0; t < out_len; ++t) ref[(std::size_t(b) * out + o) * out_len + t] = bias[o];
    for (int b = 0; b < batch; ++b)
        for (int i = 0; i < in; ++i)
            for (int s = 0; s < len; ++s)
                for (int o = 0; o < out; ++o)
                    for (int kk = 0; kk < k; ++kk) {
                        const int t = s * stride - pad + kk;
                        if (t >= 0 && t < out_len)
                            ref[(std::size_t(b) * out + o) * out_len + t] +=
                                double(w.widened[(std::size_t(i) * out + o) * k + kk]) * x[(std::size_t(b) * in + i) * len + s];
                    }
    CHECK(max_norm_rel(gpu, ref) <= kTolRef);
    CHECK(max_norm_rel(gpu, cpu) <= kTolCpu);
}

// ---- group_norm --------------------------------------------------------------------------------------

void run_group_norm(int batch, int channels, int length, int groups, Activation act, bool film, int film_pad, bool residual,
                    bool in_place) {
    CAPTURE(batch); CAPTURE(channels); CAPTURE(length); CAPTURE(groups); CAPTURE(int(act)); CAPTURE(film);
    CAPTURE(residual); CAPTURE(in_place);
    const std::size_t n = std::size_t(batch) * channels * length;
    const int fs = 2 * channels + film_pad;
    auto x = random_vec(n, 21u + channels, -2.f, 3.f);
    const auto gamma = random_vec(channels, 22u, 0.5f, 1.5f);
    const auto beta = random_vec(channels, 23u);
    const auto filmv = random_vec(std::size_t(batch) * fs, 24u);
    const auto res = random_vec(n, 25u);
    DeviceArray<float> dx(x), dg(gamma), db(beta), df(filmv), dr(res), dy(n);

    GroupNormParams p;
    p.batch = batch; p.channels = channels; p.length = length; p.groups = groups; p.act = act;
    p.film_stride = film ? fs : 0;
    p.x = dx.get(); p.gamma = dg.get(); p.beta = db.get(); p.film = film ? df.get() : nullptr;
    p.residual = residual ? dr.get() : nullptr; p.y = in_place ? dx.get() : dy.get();
    Ops<Cuda>::group_norm(p, {});
    const auto gpu = in_place ? dx.download() : dy.download();

    std::vector<float> cpu(n);
    p.x = x.data(); p.gamma = gamma.data(); p.beta = beta.data(); p.film = film ? filmv.data() : nullptr;
    p.residual = residual ? res.data() : nullptr; p.y = cpu.data();
    Ops<Cpu>::group_norm(p, {});

    std::vector<double> ref(n);
    const int cpg = channels / groups;
    for (int b = 0; b < batch; ++b)
        for (int g = 0; g < groups; ++g) {
            const std::size_t base = (std::size_t(b) * channels + std::size_t(g) * cpg) * length;
            const std::size_t m = std::size_t(cpg) * length;
            double s = 0, q = 0;
            for (std::size_t i = 0; i < m; ++i) s += x[base + i];
            const double mean = s / double(m);
            for (std::size_t i = 0; i < m; ++i) q += (x[base + i] - mean) * (x[base + i] - mean);
            const double rstd = 1.0 / std::sqrt(q / double(m) + 1e-5);
            for (std::size_t i = 0; i < m; ++i) {
                const int c = g * cpg + int(i / length);
                double a = act_d(act, (x[base + i] - mean) * rstd * gamma[c] + beta[c]);
                if (film) a = filmv[std::size_t(b) * fs + c] * a + filmv[std::size_t(b) * fs + channels + c];
                if (residual) a += res[base + i];
                ref[base + i] = a;
            }
        }
    CHECK(max_norm_rel(gpu, ref) <= kTolRef);
    CHECK(max_norm_rel(gpu, cpu) <= kTolCpu);
}

}  // namespace

TEST_CASE("cuda linear matches the CPU and a double reference (odd sizes, every dtype and activation)") {
    for (DType dt : kAllDtypes) {
        run_linear(1, 1, 1, dt, Activation::None, false, 0, 0);
        run_linear(3, 7, 37, dt, Activation::Silu, false, 0, 0);
        run_linear(7, 129, 3, dt, Activation::Mish, true, 0, 0);
        run_linear(5, 37, 129, dt, Activation::Softplus, false, 3, 2);  // strided rows, scalar path
        run_linear(9, 256, 65, dt, Activation::None, true, 4, 1);       // > 4 rows: several row passes, vector path
        run_linear(1, 260, 4096, dt, Activation::None, false, 0, 0);    // PushT FiLM (cond_encoder of 2048 channels)
        run_linear(2, 128, 512, dt, Activation::Mish, false, 0, 0);     // PushT step encoder
        run_linear(4, 1024, 128, dt, Activation::None, false, 0, 0);
    }
}

TEST_CASE("cuda conv1d matches the CPU and a double reference: odd sizes and generic fallbacks") {
    std::uint32_t seed = 100;
    for (DType dt : kAllDtypes) {
        run_conv1d(1, 3, 7, 37, 5, 1, 2, dt, seed++);    // in % 4 != 0: generic
        run_conv1d(2, 8, 37, 7, 5, 1, 2, dt, seed++);    // fast, LT 8 with tail
        run_conv1d(1, 4, 3, 1, 3, 2, 1, dt, seed++);     // length 1, stride 2
        run_conv1d(3, 12, 5, 33, 3, 2, 1, dt, seed++);   // several time tiles and batches
        run_conv1d(2, 36, 9, 40, 3, 1, 1, dt, seed++);   // k3 s1, 3 tiles
        run_conv1d(1, 20, 129, 9, 7, 1, 3, dt, seed++);  // kernel 7: generic
        run_conv1d(1, 16, 11, 10, 4, 3, 0, dt, seed++);  // stride 3: generic
        run_conv1d(2, 132, 37, 5, 1, 1, 0, dt, seed++);  // 1x1
        run_conv1d(1, 1028, 7, 3, 5, 1, 2, dt, seed++);  // several channel chunks with a tail
        // Row path (pad = K/2, whole rows of 1/2/4/8/16): odd output counts, channel-step tails, batches.
        run_conv1d(3, 36, 37, 4, 5, 1, 2, dt, seed++);    // k5, 3 batches, 37 outputs
        run_conv1d(2, 1028, 9, 8, 3, 2, 1, dt, seed++);   // k3 s2, a tail of 4 channels past the steps
        run_conv1d(1, 260, 129, 16, 3, 1, 1, dt, seed++); // k3 s1, L 16
        run_conv1d(2, 4, 5, 2, 5, 1, 2, dt, seed++);      // k5 over a row of 2 (most taps in the padding)
        run_conv1d(1, 516, 33, 1, 1, 1, 0, dt, seed++);   // 1x1 on a row of 1
        run_conv1d(1, 4100, 3, 4, 5, 1, 2, dt, seed++);   // many steps per warp, 3 outputs
    }
}

TEST_CASE("cuda conv1d row path: 8 channels per lane (16-bit), 4 outputs per warp (k = 1), their fallbacks") {
    // Which layout runs depends on the card's resident-block count (conv1d_row.cu launch_conv1d_row_layout); the
    // comments name the layout on an H100/H200. Every case is checked against the CPU and a double loop anyway.
    std::uint32_t seed = 200;
    for (DType dt : kAllDtypes) {
        // in % 8 == 0 and in < 256: 16-bit weights take 8 channels per lane (16-byte loads) on any card.
        run_conv1d(1, 8, 5, 4, 5, 1, 2, dt, seed++);       // one lane's worth of channels, 5 outputs
        run_conv1d(2, 24, 19, 8, 5, 1, 2, dt, seed++);     // 3 lanes, 2 batches
        run_conv1d(1, 248, 37, 16, 5, 1, 2, dt, seed++);   // L 16, 31 of 32 lanes
        run_conv1d(1, 16, 3, 2, 5, 1, 2, dt, seed++);      // row of 2
        run_conv1d(1, 40, 9, 1, 3, 2, 1, dt, seed++);      // row of 1, stride 2
        run_conv1d(1, 120, 9, 8, 3, 1, 1, dt, seed++);     // k3 s1
        // 2048 outputs keep the grid at one wave, so 8 channels per lane (several steps, a tail of 8 channels).
        run_conv1d(1, 1032, 2048, 8, 3, 2, 1, dt, seed++);
        run_conv1d(1, 1032, 2050, 8, 1, 1, 0, dt, seed++);  // and 4 outputs per warp, 2 outputs past a warp's 4
        // Few outputs: 8 channels per lane would halve the blocks, so 4 channels per lane (8-byte loads).
        run_conv1d(1, 264, 37, 16, 5, 1, 2, dt, seed++);   // step tail (264 = 256 + 8)
        // in % 8 == 4: 16-bit weights always take 4 channels per lane.
        run_conv1d(1, 20, 13, 4, 5, 1, 2, dt, seed++);
        run_conv1d(2, 1036, 6, 8, 5, 1, 2, dt, seed++);
        // in % 8 == 0 but the input too long to stage in shared memory (16-bit: 4 channels per lane).
        run_conv1d(1, 3080, 2048, 8, 3, 2, 1, dt, seed++);
        // in % 8 == 0 but the weights only 8-byte aligned (16-bit) / 16-byte aligned (F32): 4 channels per lane.
        run_conv1d(1, 32, 9, 4, 5, 1, 2, dt, seed++, 4);
        run_conv1d(1, 264, 5, 8, 1, 1, 0, dt, seed++, 4);
        // k = 1 on rows of <= 8: 4 outputs per warp; output counts not a multiple of 4, channel tails.
        run_conv1d(1, 12, 37, 8, 1, 1, 0, dt, seed++);     // in % 8 == 4
        run_conv1d(1, 2056, 6, 8, 1, 1, 0, dt, seed++);    // 2 outputs past the last full warp of 4
        run_conv1d(2, 264, 513, 4, 1, 1, 0, dt, seed++);   // many blocks, 2 batches
        run_conv1d(3, 40, 5, 2, 1, 1, 0, dt, seed++);
        run_conv1d(1, 1028, 3, 1, 1, 1, 0, dt, seed++);    // fewer outputs than one warp's 4
        run_conv1d(1, 4104, 130, 8, 1, 1, 0, dt, seed++);  // several steps per lane
        run_conv1d(1, 2048, 512, 8, 1, 1, 0, dt, seed++);  // up1 residual 1x1 (PushT)
        run_conv1d(1, 1024, 2048, 4, 1, 1, 0, dt, seed++); // down2 residual 1x1 (PushT)
        run_conv1d(1, 12, 7, 16, 1, 1, 0, dt, seed++);     // k = 1 at L 16 keeps one output per warp
        // Input staged in shared memory only up to 96 KiB per block: 1544 x 16 floats (98.8 KB) reads global rows.
        run_conv1d(1, 1544, 9, 16, 5, 1, 2, dt, seed++);
        run_conv1d(2, 3080, 5, 8, 3, 2, 1, dt, seed++);    // 98.6 KB per batch element, k3 s2
    }
}

TEST_CASE("cuda conv1d matches the CPU and a double reference on the PushT U-Net shapes") {
    std::uint32_t seed = 300;
    for (DType dt : kAllDtypes) {
        run_conv1d(1, 2, 512, 16, 5, 1, 2, dt, seed++);     // down0 r0 conv1 (generic: in 2)
        run_conv1d(1, 512, 512, 16, 5, 1, 2, dt, seed++);   // down0 / final conv block
        run_conv1d(1, 512, 512, 16, 3, 2, 1, dt, seed++);   // down0 downsample
        run_conv1d(1, 512, 1024, 8, 5, 1, 2, dt, seed++);   // down1 r0 conv1
        run_conv1d(1, 1024, 1024, 8, 3, 2, 1, dt, seed++);  // down1 downsample
        run_conv1d(1, 2048, 2048, 4, 5, 1, 2, dt, seed++);  // down2 / mid
        run_conv1d(1, 4096, 1024, 4, 5, 1, 2, dt, seed++);  // up0 r0 conv1
        run_conv1d(1, 4096, 1024, 4, 1, 1, 0, dt, seed++);  // up0 residual 1x1
        run_conv1d(1, 2048, 512, 8, 5, 1, 2, dt, seed++);   // up1 r0 conv1
        run_conv1d(1, 512, 2, 16, 1, 1, 0, dt, seed++);     // final 1x1
        run_conv1d(2, 1024, 1024, 8, 5, 1, 2, dt, seed++);  // batch 2
    }
}

TEST_CASE("cuda conv_transpose1d matches the CPU and a double reference") {
    std::uint32_t seed = 500;
    for (DType dt : kAllDtypes) {
        run_convt(1, 1024, 1024, 4, 4, 2, 1, 0, dt, seed++);  // PushT up0 upsample
        run_convt(1, 512, 512, 8, 4, 2, 1, 0, dt, seed++);    // PushT up1 upsample
        run_convt(3, 7, 37, 4, 4, 2, 1, 0, dt, seed++);       // fast path, odd channels, batch 3
        run_convt(2, 37, 129, 1, 4, 2, 1, 0, dt, seed++);     // fast path, length 1
        run_convt(2, 3, 7, 5, 4, 2, 1, 0, dt, seed++);        // length 5: generic
        run_convt(1, 37, 129, 3, 3, 2, 0, 1, dt, seed++);     // output padding: generic
        run_convt(1, 5, 9, 7, 5, 3, 2, 2, dt, seed++);        // stride 3: generic
    }
}

TEST_CASE("cuda group_norm with the fused act/FiLM/residual epilogue matches the CPU and a double reference") {
    run_group_norm(1, 512, 16, 8, Activation::Mish, false, 0, false, false);
    run_group_norm(1, 512, 16, 8, Activation::Mish, true, 0, false, false);
    run_group_norm(1, 2048, 4, 8, Activation::Mish, true, 0, true, false);
    run_group_norm(2, 1024, 8, 8, Activation::Mish, false, 0, true, false);
    run_group_norm(3, 21, 7, 3, Activation::Silu, true, 5, true, false);
    run_group_norm(1, 37, 1, 37, Activation::None, false, 0, false, false);
    run_group_norm(2, 64, 129, 4, Activation::Softplus, true, 0, false, true);  // in place
}

TEST_CASE("cuda rms_norm matches the CPU") {
    for (auto [rows, dim] : {std::pair{1, 128}, std::pair{4, 37}, std::pair{7, 129}, std::pair{3, 1025}}) {
        CAPTURE(rows); CAPTURE(dim);
        const auto x = random_vec(std::size_t(rows) * dim, 31u + dim, -3.f, 3.f);
        const auto w = random_vec(dim, 32u);
        for (bool with_w : {true, false}) {
            DeviceArray<float> dx(x), dw(w), dy(x.size());
            RmsNormParams p;
            p.rows = rows; p.dim = dim; p.x = dx.get(); p.weight = with_w ? dw.get() : nullptr; p.y = dy.get();
            Ops<Cuda>::rms_norm(p, {});
            std::vector<float> cpu(x.size());
            p.x = x.data(); p.weight = with_w ? w.data() : nullptr; p.y = cpu.data();
            Ops<Cpu>::rms_norm(p, {});
            check_elementwise(dy.download(), cpu, 2e-6, 1e-7, "rms_norm");
        }
    }
}

TEST_CASE("cuda activation, axpby, concat_channels, unnormalize match the CPU") {
    for (std::int64_t n : {std::int64_t(1), std::int64_t(37), std::int64_t(1029), std::int64_t(70001)}) {
        CAPTURE(n);
        const auto x = random_vec(std::size_t(n), 41u, -30.f, 30.f);
        for (Activation a : kActs) {
            CAPTURE(int(a));
            DeviceArray<float> dx(x), dy(x.size());
            ActivationParams p{dx.get(), dy.get(), n, a};
            Ops<Cuda>::activation(p, {});
            ActivationParams q{dx.get(), dx.get(), n, a};  // in place
            Ops<Cuda>::activation(q, {});
            std::vector<float> cpu(x.size());
            ActivationParams pc{x.data(), cpu.data(), n, a};
            Ops<Cpu>::activation(pc, {});
            check_elementwise(dy.download(), cpu, 4e-6, 1e-30, "activation");
            check_elementwise(dx.download(), cpu, 4e-6, 1e-30, "activation in place");
        }
        const auto y = random_vec(std::size_t(n), 42u);
        DeviceArray<float> dx(x), dy(y), dout(x.size());
        AxpbyParams p{dx.get(), dy.get(), dout.get(), n, 0.75f, -1.25f};
        Ops<Cuda>::axpby(p, {});
        std::vector<float> cpu(x.size());
        AxpbyParams pc{x.data(), y.data(), cpu.data(), n, 0.75f, -1.25f};
        Ops<Cpu>::axpby(pc, {});
        check_elementwise(dout.download(), cpu, 1e-6, 1e-6, "axpby");
        AxpbyParams p0{dx.get(), nullptr, dx.get(), n, 2.f, 0.f};  // y null, in place
        Ops<Cuda>::axpby(p0, {});
        std::vector<float> twice(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) twice[i] = 2.f * x[i];
        CHECK(bitwise_equal(dx.download(), twice));
    }
    for (auto [batch, ca, cb, len] : {std::tuple{2, 3, 5, 7}, std::tuple{1, 2048, 2048, 4}, std::tuple{3, 1, 0, 9}}) {
        const auto a = random_vec(std::size_t(batch) * ca * len, 43u), b = random_vec(std::size_t(batch) * cb * len + 1, 44u);
        DeviceArray<float> da(a), db(b), dy(std::size_t(batch) * (ca + cb) * len);
        ConcatParams p{da.get(), db.get(), dy.get(), batch, ca, cb, len};
        Ops<Cuda>::concat_channels(p, {});
        std::vector<float> cpu(dy.size());
        ConcatParams pc{a.data(), b.data(), cpu.data(), batch, ca, cb, len};
        Ops<Cpu>::concat_channels(pc, {});
        CHECK(bitwise_equal(dy.download(), cpu));
    }
    {
        const int rows = 16, dim = 2;
        const auto x = random_vec(rows * dim, 45u);
        const std::vector<float> lo{13.456f, -2.5f}, hi{496.14f, 7.25f};
        DeviceArray<float> dx(x), dlo(lo), dhi(hi), dy(x.size());
        UnnormalizeParams p{dx.get(), dy.get(), dlo.get(), dhi.get(), rows, dim};
        Ops<Cuda>::unnormalize(p, {});
        std::vector<float> cpu(x.size());
        UnnormalizeParams pc{x.data(), cpu.data(), lo.data(), hi.data(), rows, dim};
        Ops<Cpu>::unnormalize(pc, {});
        check_elementwise(dy.download(), cpu, 1e-6, 1e-6, "unnormalize");
    }
}

TEST_CASE("cuda sinusoid and embedding match the CPU") {
    for (float t : {0.f, 1.f, 37.f, 99.f}) {
        CAPTURE(t);
        const int rows = 3, half = 64;
        DeviceArray<float> dy(std::size_t(rows) * 2 * half);
        SinusoidParams p;
        p.t = t; p.rows = rows; p.half = half; p.denom = float(half - 1); p.out = dy.get();
        Ops<Cuda>::sinusoid(p, {});
        std::vector<float> cpu(dy.size());
        p.out = cpu.data();
        Ops<Cpu>::sinusoid(p, {});
        check_elementwise(dy.download(), cpu, 0.0, 4e-6, "sinusoid");
    }
    for (DType dt : kAllDtypes) {
        const int vocab = 37, dim = 129;
        Weights table(random_vec(std::size_t(vocab) * dim, 51u), dt);
        const std::vector<std::int32_t> ids{0, 36, 5, 5, 17, 1, 36};
        DeviceArray<std::int32_t> dids(ids);
        DeviceArray<float> dy(ids.size() * dim);
        EmbeddingParams p{dids.get(), table.gpu(), dy.get(), int(ids.size()), dim};
        Ops<Cuda>::embedding(p, {});
        std::vector<float> cpu(dy.size());
        EmbeddingParams pc{ids.data(), table.cpu(), cpu.data(), int(ids.size()), dim};
        Ops<Cpu>::embedding(pc, {});
        CHECK(bitwise_equal(dy.download(), cpu));
    }
}

TEST_CASE("cuda causal_conv matches the CPU over prefill and streaming steps") {
    for (DType dt : kAllDtypes) {
        CAPTURE(int(dt));
        const int C = 37, K = 4;
        const int ld_x = 2 * C + 3;  // x is the first half of a wider in_proj row
        Weights w(random_vec(std::size_t(C) * K, 61u, -0.5f, 0.5f), dt);
        const auto bias = random_vec(C, 62u);
        DeviceArray<float> dbias(bias), dstate(std::size_t(K - 1) * C);
        std::vector<float> cstate(std::size_t(K - 1) * C, 0.f);
        std::uint32_t seed = 63;
        for (int L : {7, 1, 2, 1, 5}) {  // prefill, then steps (2 < K-1 exercises the history shift)
            CAPTURE(L);
            const auto x = random_vec(std::size_t(L) * ld_x, seed++);
            DeviceArray<float> dx(x), du(std::size_t(L) * C);
            CausalConvParams p;
            p.x = dx.get(); p.ld_x = ld_x; p.w = w.gpu(); p.bias = dbias.get(); p.state = dstate.get(); p.u = du.get();
            p.length = L; p.channels = C; p.kernel = K;
            Ops<Cuda>::causal_conv(p, {});
            std::vector<float> cu(std::size_t(L) * C);
            p.x = x.data(); p.w = w.cpu(); p.bias = bias.data(); p.state = cstate.data(); p.u = cu.data();
            Ops<Cpu>::causal_conv(p, {});
            check_elementwise(du.download(), cu, 4e-6, 1e-6, "causal_conv u");
            CHECK(bitwise_equal(dstate.download(), cstate));
        }
    }
}

TEST_CASE("cuda selective_scan matches the CPU, continuing from state") {
    for (int N : {16, 40}) {
        CAPTURE(N);
        const int C = 37, R = 5;
        const int ld_bc = R + 2 * N;  // [dt_low | B | C] rows of x_proj's output
        const int ld_z = 2 * C;       // z is the second half of in_proj's output
        auto A = random_vec(std::size_t(C) * N, 71u, -2.f, -0.1f);
        const auto D = random_vec(C, 72u);
        DeviceArray<float> dA(A), dD(D), dstate(std::size_t(C) * N);
        std::vector<float> cstate(std::size_t(C) * N, 0.f);
        std::uint32_t seed = 73;
        for (int L : {6, 1, 3}) {
            CAPTURE(L);
            const auto u = random_vec(std::size_t(L) * C, seed++);
            const auto dt = random_vec(std::size_t(L) * C, seed++, 0.01f, 0.5f);
            const auto dbl = random_vec(std::size_t(L) * ld_bc, seed++);
            const auto xz = random_vec(std::size_t(L) * ld_z, seed++, -3.f, 3.f);
            DeviceArray<float> du(u), ddt(dt), ddbl(dbl), dxz(xz), dy(std::size_t(L) * C);
            SelectiveScanParams p;
            p.u = du.get(); p.dt = ddt.get(); p.A = dA.get(); p.B = ddbl.get() + R; p.C = ddbl.get() + R + N; p.ld_bc = ld_bc;
            p.D = dD.get(); p.z = dxz.get() + C; p.ld_z = ld_z; p.state = dstate.get(); p.y = dy.get();
            p.length = L; p.channels = C; p.d_state = N;
            Ops<Cuda>::selective_scan(p, {});
            std::vector<float> cy(std::size_t(L) * C);
            p.u = u.data(); p.dt = dt.data(); p.A = A.data(); p.B = dbl.data() + R; p.C = dbl.data() + R + N;
            p.D = D.data(); p.z = xz.data() + C; p.state = cstate.data(); p.y = cy.data();
            Ops<Cpu>::selective_scan(p, {});
            CHECK(max_norm_rel(dy.download(), cy) <= 1e-5);
            CHECK(max_norm_rel(dstate.download(), cstate) <= 1e-5);
        }
    }
}

TEST_CASE("cuda diffusion_step: DDPM noise is bit-identical to the CPU sequence; DDIM/DDPM updates match") {
    const int batch = 3, per = 32;
    const std::uint64_t seed = 0x5eedULL;
    // Noise only: x = 0*x0 + 0*x + 1*z, so the result is exactly z.
    for (std::uint64_t offset : {std::uint64_t(0), std::uint64_t(37), std::uint64_t(1) << 33}) {
        CAPTURE(offset);
        DeviceArray<float> dx(std::size_t(batch) * per), de(std::size_t(batch) * per);
        DiffusionStepParams p;
        p.x = dx.get(); p.eps = de.get(); p.batch = batch; p.per_sample = per; p.kind = StepKind::Ddpm;
        p.sqrt_abar = 1.f; p.sqrt_one_minus_abar = 0.f; p.c_x0 = 0.f; p.c_other = 0.f; p.noise_std = 1.f;
        p.seed = seed; p.draw_offset = offset;
        Ops<Cuda>::diffusion_step(p, {});
        const auto gpu = dx.download();
        std::vector<float> want(gpu.size());
        for (int b = 0; b < batch; ++b) fill_normal(seed + b, offset, want.data() + std::size_t(b) * per, per);
        CHECK(bitwise_equal(gpu, want));
        std::vector<float> cx(gpu.size(), 0.f), ce(gpu.size(), 0.f);
        p.x = cx.data(); p.eps = ce.data();
        Ops<Cpu>::diffusion_step(p, {});
        CHECK(bitwise_equal(gpu, cx));
    }
    // seed_ptr on the device overrides seed.
    {
        DeviceArray<std::uint64_t> dseed(std::vector<std::uint64_t>{seed + 100});
        DeviceArray<float> dx(std::size_t(batch) * per), de(std::size_t(batch) * per);
        DiffusionStepParams p;
        p.x = dx.get(); p.eps = de.get(); p.batch = batch; p.per_sample = per; p.kind = StepKind::Ddpm;
        p.c_x0 = 0.f; p.c_other = 0.f; p.noise_std = 1.f; p.seed = 1; p.seed_ptr = dseed.get();
        Ops<Cuda>::diffusion_step(p, {});
        std::vector<float> want(std::size_t(batch) * per);
        for (int b = 0; b < batch; ++b) fill_normal(seed + 100 + b, 0, want.data() + std::size_t(b) * per, per);
        CHECK(bitwise_equal(dx.download(), want));
    }
    // Real updates (clip on/off, both kinds) within float rounding of the CPU.
    for (StepKind kind : {StepKind::Ddim, StepKind::Ddpm})
        for (bool clip : {false, true}) {
            CAPTURE(int(kind)); CAPTURE(clip);
            const auto x = random_vec(std::size_t(batch) * per, 81u, -2.f, 2.f);
            const auto e = random_vec(std::size_t(batch) * per, 82u);
            DeviceArray<float> dx(x), de(e);
            DiffusionStepParams p;
            p.x = dx.get(); p.eps = de.get(); p.batch = batch; p.per_sample = per; p.kind = kind;
            p.sqrt_abar = 0.3f; p.sqrt_one_minus_abar = 0.953939f; p.clip = clip; p.clip_range = 1.f;
            p.c_x0 = 0.42f; p.c_other = 0.77f; p.noise_std = kind == StepKind::Ddpm ? 0.2f : 0.f;
            p.seed = seed; p.draw_offset = 64;
            Ops<Cuda>::diffusion_step(p, {});
            std::vector<float> cx = x;
            p.x = cx.data(); p.eps = e.data();
            Ops<Cpu>::diffusion_step(p, {});
            check_elementwise(dx.download(), cx, 2e-6, 2e-6, "diffusion_step");
        }
}

TEST_CASE("cuda launchers reject inconsistent shapes with a flowedge::Error") {
    DeviceArray<float> buf(64);
    Weights w(random_vec(64, 91u), DType::F32);
    Conv1dParams p;
    p.x = buf.get(); p.w = w.gpu(); p.y = buf.get();
    p.in_channels = 4; p.out_channels = 2; p.in_length = 8; p.out_length = 7; p.kernel = 3; p.pad = 1;
    CHECK_THROWS_WITH_AS(Ops<Cuda>::conv1d(p, {}), doctest::Contains("expected 8, got 7"), Error);
    GroupNormParams g;
    g.x = buf.get(); g.y = buf.get(); g.channels = 6; g.groups = 4; g.length = 2;
    CHECK_THROWS_AS(Ops<Cuda>::group_norm(g, {}), Error);
}
