// linear and linear_batch on every backend vs naive double-accumulating loops (odd sizes, strides, every weight dtype,
// fused epilogues, the sizes of the parallel/vector paths and of the U-Net's FiLM batch), a non-CPU backend also vs
// Ops<Cpu>; the CPU's streamed (conv-packed) weights; and the shared argument checks of both ops.
#include "cpu_packed_util.hpp"
#include "ops_test_util.hpp"

using namespace optest;

namespace {

struct LinearCase { int rows, in, out, ld_x_pad, ld_y_pad; bool bias, accumulate; Activation act; };

template <class B>
void run_linear(const LinearCase& k, DType dt, std::uint32_t seed) {
    CAPTURE(k.rows); CAPTURE(k.in); CAPTURE(k.out); CAPTURE(k.ld_x_pad); CAPTURE(k.ld_y_pad); CAPTURE(k.accumulate);
    CAPTURE(int(k.act)); CAPTURE(dtype_name(dt));
    const int ldx = k.in + k.ld_x_pad, ldy = k.out + k.ld_y_pad;
    const auto x = random_vec(std::size_t(k.rows) * ldx + 1, seed);
    const auto bias = random_vec(k.out, seed + 1);
    const auto y0 = random_vec(std::size_t(k.rows) * ldy + 1, seed + 2);
    const HostWeights w = make_weights(std::size_t(k.in) * k.out, dt, seed + 3, 0.5f);

    std::vector<double> ref(y0.begin(), y0.end()), scale(y0.size(), 0.0);
    for (int r = 0; r < k.rows; ++r)
        for (int o = 0; o < k.out; ++o) {
            double s = k.bias ? bias[o] : 0.0, mag = k.bias ? std::fabs(bias[o]) : 0.0;
            for (int i = 0; i < k.in; ++i) {
                const double t = w.value[std::size_t(o) * k.in + i] * x[std::size_t(r) * ldx + i];
                s += t;
                mag += std::fabs(t);
            }
            const double a = ref_act(k.act, s);
            const std::size_t idx = std::size_t(r) * ldy + o;
            ref[idx] = (k.accumulate ? y0[idx] : 0.0) + a;
            scale[idx] = act_slope(k.act) * mag + std::fabs(a) + (k.accumulate ? std::fabs(y0[idx]) : 0.0);
        }
    // Padding columns of y must be untouched: reference keeps y0 there with zero tolerance.
    for (std::size_t i = 0; i < scale.size(); ++i)
        if (scale[i] == 0.0) scale[i] = 1e-30;

    Dev<float, B> dx(x), db(bias), dy(y0);
    DevWeights<B> dw(w);
    LinearParams p;
    p.x = dx.ptr();
    p.w = dw.ref();
    p.bias = k.bias ? db.ptr() : nullptr;
    p.y = dy.ptr();
    p.rows = k.rows;
    p.in = k.in;
    p.out = k.out;
    p.ld_x = k.ld_x_pad ? ldx : 0;
    p.ld_y = k.ld_y_pad ? ldy : 0;
    p.act = k.act;
    p.accumulate = k.accumulate;
    Ops<B>::linear(p);
    const auto got = dy.host(y0.size());
    check_all(got, ref, scale, 2e-6, "linear");
    CHECK(max_norm_rel(got, ref) <= kTolRef);
    if constexpr (!kIsCpu<B>) {
        std::vector<float> cpu = y0;
        p.x = x.data(); p.w = w.ref(); p.bias = k.bias ? bias.data() : nullptr; p.y = cpu.data();
        Ops<Cpu>::linear(p);
        CHECK(max_norm_rel(got, cpu) <= kTolCpu);
    }
}

struct BatchItem {
    int rows, in, out, ld_x_pad, ld_y_pad, x_shift;  // x_shift: x starts this many floats into its buffer (alignment)
    DType dt;
    Activation act;
    bool accumulate, bias;
};

/// linear_batch of `items` vs the same items through the single linear op (bit-identical: same per-output math),
/// vs a double reference per item (and, off the CPU, vs Ops<Cpu>::linear_batch). shared_x: every item reads item 0's x.
template <class B>
void run_linear_batch(const std::vector<BatchItem>& items, bool shared_x, std::uint32_t seed) {
    const int n = int(items.size());
    REQUIRE(n <= kMaxLinearBatch);
    struct Host {
        std::vector<float> x, bias, y0;
        HostWeights w;
    };
    std::vector<Host> h;
    std::vector<Dev<float, B>> dx, db, dy_batch, dy_single;
    std::vector<DevWeights<B>> dw;
    std::vector<std::vector<float>> cpu_y;
    for (int i = 0; i < n; ++i) {
        const BatchItem& k = items[std::size_t(i)];
        if (shared_x) REQUIRE(k.in == items[0].in);
        const int ld_x = k.in + k.ld_x_pad, ld_y = k.out + k.ld_y_pad, rows = std::max(k.rows, 1);
        h.push_back({random_vec(std::size_t(k.x_shift) + std::size_t(rows) * ld_x, seed + 10 * i),
                     random_vec(k.out, seed + 10 * i + 1), random_vec(std::size_t(rows) * ld_y, seed + 10 * i + 2),
                     make_weights(std::size_t(k.out) * k.in, k.dt, seed + 10 * i + 3, 0.5f)});
        dx.emplace_back(shared_x && i > 0 ? std::vector<float>(1) : h.back().x);
        db.emplace_back(h.back().bias);
        dy_batch.emplace_back(h.back().y0);
        dy_single.emplace_back(h.back().y0);
        dw.emplace_back(h.back().w);
        cpu_y.push_back(h.back().y0);
    }
    auto params = [&](int i, bool on_b, float* y) {
        const BatchItem& k = items[std::size_t(i)];
        const int xi = shared_x ? 0 : i;
        LinearParams p;
        p.rows = k.rows; p.in = k.in; p.out = k.out; p.act = k.act; p.accumulate = k.accumulate;
        p.ld_x = k.ld_x_pad ? k.in + k.ld_x_pad : 0;
        p.ld_y = k.ld_y_pad ? k.out + k.ld_y_pad : 0;
        p.x = (on_b ? dx[std::size_t(xi)].ptr() : h[std::size_t(xi)].x.data()) + items[std::size_t(xi)].x_shift;
        p.w = on_b ? dw[std::size_t(i)].ref() : h[std::size_t(i)].w.ref();
        p.bias = k.bias ? (on_b ? db[std::size_t(i)].ptr() : h[std::size_t(i)].bias.data()) : nullptr;
        p.y = y;
        return p;
    };
    LinearBatchParams lb, cb;
    lb.n_items = cb.n_items = n;
    for (int i = 0; i < n; ++i) {
        lb.items[i] = params(i, true, dy_batch[std::size_t(i)].ptr());
        cb.items[i] = params(i, false, cpu_y[std::size_t(i)].data());
        Ops<B>::linear(params(i, true, dy_single[std::size_t(i)].ptr()));
    }
    Ops<B>::linear_batch(lb);
    if constexpr (!kIsCpu<B>) Ops<Cpu>::linear_batch(cb);
    for (int i = 0; i < n; ++i) {
        const BatchItem& k = items[std::size_t(i)];
        CAPTURE(i); CAPTURE(k.rows); CAPTURE(k.in); CAPTURE(k.out); CAPTURE(dtype_name(k.dt)); CAPTURE(k.x_shift);
        const std::size_t len = h[std::size_t(i)].y0.size();
        const auto got = dy_batch[std::size_t(i)].host(len), single = dy_single[std::size_t(i)].host(len);
        CHECK(bit_mismatches(got, single) == 0);  // bit-identical to the single op
        const Host& hx = h[std::size_t(shared_x ? 0 : i)];
        const int x_shift = items[std::size_t(shared_x ? 0 : i)].x_shift;
        const int ld_x = k.in + k.ld_x_pad, ld_y = k.out + k.ld_y_pad;
        std::vector<double> ref(h[std::size_t(i)].y0.begin(), h[std::size_t(i)].y0.end()), scale(len, 1e-30);
        for (int r = 0; r < k.rows; ++r)
            for (int o = 0; o < k.out; ++o) {
                double s = k.bias ? h[std::size_t(i)].bias[std::size_t(o)] : 0.0, mag = std::fabs(s);
                for (int c = 0; c < k.in; ++c) {
                    const double t = h[std::size_t(i)].w.value[std::size_t(o) * k.in + c] *
                                     hx.x[std::size_t(x_shift) + std::size_t(r) * ld_x + c];
                    s += t;
                    mag += std::fabs(t);
                }
                const double v = ref_act(k.act, s);
                const std::size_t idx = std::size_t(r) * ld_y + o;
                ref[idx] = k.accumulate ? ref[idx] + v : v;
                scale[idx] = act_slope(k.act) * mag + std::fabs(v) + (k.accumulate ? std::fabs(h[std::size_t(i)].y0[idx]) : 0.0);
            }
        // A batch that silently skipped its work (both outputs left at y0) fails here.
        check_all(got, ref, scale, 2e-6, "linear_batch item");
        CHECK(max_norm_rel(got, ref) <= kTolRef);
        if constexpr (!kIsCpu<B>) CHECK(max_norm_rel(got, cpu_y[std::size_t(i)]) <= kTolCpu);
        if (k.rows == 0) CHECK(got == h[std::size_t(i)].y0);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("linear matches a naive loop (sizes, strides, dtypes, act, accumulate)", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    const LinearCase cases[] = {
        {1, 1, 1, 0, 0, true, false, Activation::None},
        {3, 7, 5, 0, 0, false, false, Activation::Silu},
        {7, 37, 129, 3, 0, true, true, Activation::Mish},
        {37, 129, 3, 0, 5, true, false, Activation::Softplus},
        {9, 33, 17, 1, 2, true, true, Activation::None},    // > 8 rows: column blocks
        {20, 300, 70, 0, 0, true, false, Activation::Silu},
        {4, 1024, 600, 0, 0, true, false, Activation::None},  // parallel path
        {1, 260, 2048, 0, 0, true, false, Activation::None},  // PushT FiLM shape
        {0, 5, 3, 0, 0, true, false, Activation::None},       // no rows: no-op
        // CUDA kernel paths: strided rows (scalar path), > 4 rows (several row passes, vector path).
        {3, 7, 37, 0, 0, true, false, Activation::Silu},
        {7, 129, 3, 0, 0, true, true, Activation::Mish},
        {5, 37, 129, 3, 2, true, false, Activation::Softplus},
        {9, 256, 65, 4, 1, true, true, Activation::None},
        {1, 260, 4096, 0, 0, true, false, Activation::None},  // PushT FiLM (cond_encoder of 2048 channels)
        {2, 128, 512, 0, 0, true, false, Activation::Mish},   // PushT step encoder
        {4, 1024, 128, 0, 0, true, false, Activation::None},
    };
    std::uint32_t seed = 100;
    for (const auto& k : cases)
        for (DType dt : kAllDtypes) run_linear<B>(k, dt, seed += 10);
}

TEST_CASE_TEMPLATE("linear_batch equals the single linear on every item (odd sizes, mixed dtypes, strides, epilogues)", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    using A = Activation;
    // Items as the U-Net FiLM batch uses them (1 row, F32/BF16/F16 weights mixed) plus odd shapes, strides, several
    // rows, accumulate, activations and a zero-row item; each item its own x.
    run_linear_batch<B>({{1, 260, 2 * 37, 0, 0, 0, DType::F32, A::None, false, true},
                         {1, 260, 2 * 129, 0, 0, 0, DType::BF16, A::None, false, true},
                         {1, 260, 2 * 65, 0, 0, 0, DType::F16, A::None, false, true},
                         {3, 7, 5, 0, 0, 0, DType::F16, A::Silu, false, false},
                         {7, 37, 129, 3, 0, 0, DType::BF16, A::Mish, true, true},
                         {5, 33, 17, 1, 2, 0, DType::F32, A::None, true, true},
                         {0, 5, 3, 0, 0, 0, DType::F32, A::None, false, true},  // no rows: no-op inside the batch
                         {9, 129, 3, 0, 5, 0, DType::F32, A::Softplus, false, true},
                         {1, 1, 1, 0, 0, 0, DType::BF16, A::None, false, true}},
                        false, 7000);
    // Several row passes, a misaligned x (the CUDA scalar path next to vector items), one output feature.
    run_linear_batch<B>({{1, 1, 1, 0, 0, 0, DType::BF16, A::None, false, true},
                         {3, 7, 37, 0, 0, 0, DType::F32, A::Silu, false, true},
                         {7, 129, 3, 0, 0, 0, DType::F16, A::Mish, true, true},
                         {5, 37, 129, 3, 2, 0, DType::BF16, A::Softplus, false, false},
                         {9, 256, 65, 4, 1, 0, DType::F32, A::None, true, true},
                         {2, 256, 33, 0, 0, 1, DType::F16, A::None, false, true},  // x misaligned
                         {0, 5, 3, 0, 0, 0, DType::F32, A::None, false, true},
                         {4, 1024, 130, 0, 0, 0, DType::BF16, A::Mish, false, true}},
                        false, 300);
    // The U-Net FiLM batch: 15 cond_encoder linears reading one g (260 = 128 + 132), PushT widths and odd ones.
    const int outs[] = {512, 512, 1024, 1024, 2048, 2048, 4096, 4096, 4096, 4096, 2048, 2048, 1024, 1024, 74};
    for (int v = 0; v < 2; ++v) {
        std::vector<BatchItem> film;
        for (int i = 0; i < 15; ++i) {
            const DType dt = v == 0 ? (i % 3 == 0 ? DType::F32 : i % 3 == 1 ? DType::BF16 : DType::F16) : DType::F32;
            film.push_back({1, 260, outs[i] - (v == 1 ? 2 * i + 1 : 0), 0, 0, 0, dt, A::None, false, true});
        }
        CAPTURE(v);
        run_linear_batch<B>(film, true, 600);
    }
}

TEST_CASE("linear and linear_batch on streamed (conv-packed) weights") {
    if (!packs_conv()) {
        MESSAGE("this build keeps Linear weights row-major (the process's kernel set does not pack them): nothing to check");
    } else {
        struct Shape3 { int rows, in, out; };
        std::uint32_t seed = 9000;
        for (DType dt : kAllDtypes)
            for (Shape3 sh : {Shape3{1, 260, 1024}, Shape3{2, 7, 33}, Shape3{3, 129, 50}, Shape3{1, 1, 1}}) {
                CAPTURE(dtype_name(dt)); CAPTURE(sh.rows); CAPTURE(sh.in); CAPTURE(sh.out);
                const auto x = random_vec(std::size_t(sh.rows) * sh.in, seed += 10);
                const auto bias = random_vec(std::size_t(sh.out), seed + 1);
                const HostWeights w = make_weights(std::size_t(sh.out) * sh.in, dt, seed + 2, 0.3f);
                const auto pw = packed_conv_bytes(w, sh.out);
                std::vector<double> ref(std::size_t(sh.rows) * sh.out), scale(ref.size());
                for (int r = 0; r < sh.rows; ++r)
                    for (int o = 0; o < sh.out; ++o) {
                        double acc = bias[std::size_t(o)], mag = std::fabs(acc);
                        for (int i = 0; i < sh.in; ++i) {
                            const double v = w.value[std::size_t(o) * sh.in + i] * x[std::size_t(r) * sh.in + i];
                            acc += v;
                            mag += std::fabs(v);
                        }
                        ref[std::size_t(r) * sh.out + o] = acc;
                        scale[std::size_t(r) * sh.out + o] = mag;
                    }
                std::vector<float> y(ref.size(), -7.f), y_act(ref.size());
                LinearParams p;
                p.x = x.data();
                p.w = {nullptr, dt, pw.get()};
                p.bias = bias.data();
                p.y = y.data();
                p.rows = sh.rows;
                p.in = sh.in;
                p.out = sh.out;
                Ops<Cpu>::linear(p);
                check_all(y, ref, scale, 2e-6, "linear on packed weights");
                // The activation runs over the finished rows: SiLU of the plain result, bit for bit.
                p.y = y_act.data();
                p.act = Activation::Silu;
                Ops<Cpu>::linear(p);
                std::vector<float> expect = y;
                // The packed path applies the activation with its set's vector form (the AVX2 set packs).
                ActivationParams ap;
                ap.x = ap.y = expect.data();
                ap.n = std::int64_t(expect.size());
                ap.act = Activation::Silu;
                Ops<Cpu>::activation(ap);
                CHECK(bit_mismatches(expect, y_act) == 0);
                // Strided rows and accumulate are not supported there: a clear error, not a wrong answer.
                p.act = Activation::None;
                p.accumulate = true;
                CHECK_THROWS_WITH_AS(Ops<Cpu>::linear(p), doctest::Contains("packed (streamed) weights need contiguous rows"), flowedge::Error);
                p.accumulate = false;
                p.ld_x = sh.in + 1;
                CHECK_THROWS_WITH_AS(Ops<Cpu>::linear(p), doctest::Contains("packed (streamed) weights need contiguous rows"), flowedge::Error);
            }
        // linear_batch: FiLM-like items (one shared row, 260 inputs) above kParallelMacs together run in one parallel
        // region; every item equals its own linear() call bit for bit, at 1 and 2 threads.
        for (DType dt : kAllDtypes) {
            CAPTURE(dtype_name(dt));
            const int in = 260, outs[] = {1024, 48, 2048, 4096, 100, 4096, 4096, 2048};  // 4.6 M MACs
            const auto x = random_vec(std::size_t(in), 321);
            std::vector<std::unique_ptr<PreparedWeight>> pws;
            std::vector<std::vector<float>> biases, singles, batched;
            LinearBatchParams lb;
            for (int o : outs) {
                const HostWeights w = make_weights(std::size_t(o) * in, dt, std::uint32_t(400 + o), 0.3f);
                pws.push_back(packed_conv_bytes(w, o));
                biases.push_back(random_vec(std::size_t(o), std::uint32_t(500 + o)));
                singles.emplace_back(std::size_t(o));
                batched.emplace_back(std::size_t(o));
            }
            for (std::size_t i = 0; i < pws.size(); ++i) {
                LinearParams& it = lb.items[lb.n_items++];
                it.x = x.data();
                it.w = {nullptr, dt, pws[i].get()};
                it.bias = biases[i].data();
                it.y = singles[i].data();
                it.rows = 1;
                it.in = in;
                it.out = outs[i];
                it.act = i == 1 ? Activation::Mish : Activation::None;
                Ops<Cpu>::linear(it);
                it.y = batched[i].data();
            }
            for (int threads : {1, 2}) {
                for (auto& b : batched) std::fill(b.begin(), b.end(), -3.f);
                with_threads(threads, [&] { Ops<Cpu>::linear_batch(lb); });
                CAPTURE(threads);
                for (std::size_t i = 0; i < pws.size(); ++i) CHECK(bit_mismatches(singles[i], batched[i]) == 0);
            }
        }
    }
}

TEST_CASE_TEMPLATE("linear rejects bad sizes, strides, dtypes and pointers with the shared message" * doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(256);
    LinearParams l;
    l.x = buf.ptr(); l.w = {buf.ptr() + 64, DType::F32}; l.y = buf.ptr() + 128; l.rows = 1; l.in = 4; l.out = 2;
    CHECK_NOTHROW(Ops<B>::linear(l));
    LinearParams p = l;
    p.ld_x = 3;
    CHECK_THROWS_WITH_AS(Ops<B>::linear(p),
                         "flowedge: linear: row stride shorter than the row (expected ld_x >= in and ld_y >= out (0 = contiguous), got ld_x 3, ld_y 0)",
                         Error);
    p = l;
    p.out = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::linear(p),
                         "flowedge: linear: sizes must be positive (expected rows >= 0, in > 0, out > 0, got rows 1, in 4, out 0)", Error);
    p = l;
    p.w.dtype = static_cast<DType>(77);
    CHECK_THROWS_WITH_AS(Ops<B>::linear(p), "flowedge: linear: unknown weight dtype (expected F32, BF16 or F16, got 77)", Error);
    p = l;
    p.y = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::linear(p), "flowedge: linear: null x, w or y pointer", Error);
    Memory<B>::synchronize();
}

TEST_CASE_TEMPLATE("linear_batch rejects bad counts, bad items (naming the item) and overlapping items with the shared message" *
                       doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(256);
    LinearParams l;
    l.x = buf.ptr(); l.w = {buf.ptr() + 64, DType::F32}; l.y = buf.ptr() + 128; l.rows = 1; l.in = 4; l.out = 2;
    LinearBatchParams lb;
    lb.n_items = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb), "flowedge: linear_batch: item count out of range (expected 1..16, got 0)", Error);
    lb.n_items = kMaxLinearBatch + 1;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb), "flowedge: linear_batch: item count out of range (expected 1..16, got 17)", Error);
    lb.n_items = 3;
    for (int i = 0; i < 3; ++i) {
        lb.items[i] = l;
        lb.items[i].y = buf.ptr() + 128 + 8 * i;
    }
    CHECK_NOTHROW(Ops<B>::linear_batch(lb));
    lb.items[2].in = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb),
                         "flowedge: linear_batch: item 2: sizes must be positive (expected rows >= 0, in > 0, out > 0, got rows 1, in 0, out 2)",
                         Error);
    lb.items[2].in = 4;
    lb.items[2].out = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb),
                         "flowedge: linear_batch: item 2: sizes must be positive (expected rows >= 0, in > 0, out > 0, got rows 1, in 4, out 0)",
                         Error);
    lb.items[2].out = 2;
    lb.items[1].ld_x = 3;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb),
                         "flowedge: linear_batch: item 1: row stride shorter than the row (expected ld_x >= in and ld_y >= out (0 = contiguous), got ld_x 3, ld_y 0)",
                         Error);
    lb.items[1].ld_x = 0;
    lb.items[1].ld_y = 1;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb),
                         "flowedge: linear_batch: item 1: row stride shorter than the row (expected ld_x >= in and ld_y >= out (0 = contiguous), got ld_x 0, ld_y 1)",
                         Error);
    lb.items[1].ld_y = 0;
    lb.items[1].w.data = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb), "flowedge: linear_batch: item 1: null x, w or y pointer", Error);
    lb.items[1].w.data = buf.ptr() + 64;
    lb.items[1].x = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb), "flowedge: linear_batch: item 1: null x, w or y pointer", Error);
    lb.items[1].x = buf.ptr();
    lb.items[0].w.dtype = static_cast<DType>(77);
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb),
                         "flowedge: linear_batch: item 0: unknown weight dtype (expected F32, BF16 or F16, got 77)", Error);
    lb.items[0].w.dtype = DType::F32;
    lb.items[2].y = buf.ptr() + 129;  // overlaps item 0's output [128, 130)
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb),
                         "flowedge: linear_batch: item 0: output overlaps the output of item 2 (items must be independent)", Error);
    lb.items[2].y = buf.ptr() + 2;  // writes into the shared input x [0, 4)
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb),
                         "flowedge: linear_batch: item 2: output overlaps the input of item 0 (items must be independent)", Error);
    lb.items[2].y = buf.ptr() + 1;
    CHECK_THROWS_WITH_AS(Ops<B>::linear_batch(lb),
                         "flowedge: linear_batch: item 2: output overlaps the input of item 0 (items must be independent)", Error);
    Memory<B>::synchronize();
}
