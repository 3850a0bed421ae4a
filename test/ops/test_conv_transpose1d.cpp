// conv_transpose1d on every backend vs the scatter definition in double (every weight dtype, output padding, strides,
// the CPU's parallel/chunked paths, the CUDA tiled and generic paths, the PushT upsamples), a non-CPU backend also vs
// Ops<Cpu>; the CPU's packed weight layout; and the shared argument checks.
#include "../support/conv_case.hpp"
#include "cpu_packed_util.hpp"
#include "ops_test_util.hpp"

using namespace optest;

namespace {

using fe_test::ConvCase;

/// packed: CPU only, the weights packed as the kernel-1 Conv1d [out*kernel, in] (Storage::ConvTransposeWeight).
template <class B>
void run_conv_transpose1d(const ConvCase& k, int out_pad, DType dt, std::uint32_t seed, bool packed = false) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel); CAPTURE(k.stride); CAPTURE(k.pad);
    CAPTURE(out_pad); CAPTURE(dtype_name(dt)); CAPTURE(packed);
    const int lout = k.transpose_out() + out_pad;
    const auto x = random_vec(std::size_t(k.batch) * k.cin * k.lin, seed);
    const auto bias = random_vec(k.cout, seed + 1);
    const HostWeights w = make_weights(std::size_t(k.cin) * k.cout * k.kernel, dt, seed + 2, 0.3f);
    const std::size_t ny = std::size_t(k.batch) * k.cout * lout;
    std::vector<double> ref(ny, 0.0), scale(ny, 0.0);
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int t = 0; t < lout; ++t) {
                const std::size_t idx = (std::size_t(b) * k.cout + o) * lout + t;
                ref[idx] = k.bias ? bias[o] : 0.0;
                scale[idx] = std::fabs(ref[idx]);
            }
    // Scatter form, straight from the PyTorch definition: input s contributes to output s*stride - pad + k.
    for (int b = 0; b < k.batch; ++b)
        for (int i = 0; i < k.cin; ++i)
            for (int s = 0; s < k.lin; ++s)
                for (int o = 0; o < k.cout; ++o)
                    for (int kk = 0; kk < k.kernel; ++kk) {
                        const int t = s * k.stride - k.pad + kk;
                        if (t < 0 || t >= lout) continue;
                        const double v = w.value[(std::size_t(i) * k.cout + o) * k.kernel + kk] *
                                         x[(std::size_t(b) * k.cin + i) * k.lin + s];
                        const std::size_t idx = (std::size_t(b) * k.cout + o) * lout + t;
                        ref[idx] += v;
                        scale[idx] += std::fabs(v);
                    }
    for (auto& s : scale)
        if (s == 0.0) s = 1e-30;  // outputs with no contribution and no bias must be exactly zero
    Dev<float, B> dx(x), db(bias), dy(random_vec(ny, seed + 9));  // garbage in y: every output must be written
    DevWeights<B> dw(w);
    ConvTranspose1dParams p = fe_test::conv_transpose1d_params(k, dx.ptr(), dw.ref(), k.bias ? db.ptr() : nullptr);
    p.out_length = lout;
    std::unique_ptr<PreparedWeight> pw;
    if (packed) {
        pw = packed_conv_transpose_bytes(w, k.cin, k.cout, k.kernel);
        p.w = {nullptr, dt, pw.get()};
    }
    p.y = dy.ptr();
    Ops<B>::conv_transpose1d(p);
    const auto got = dy.host(ny);
    check_all(got, ref, scale, 2e-6, "conv_transpose1d");
    CHECK(max_norm_rel(got, ref) <= kTolRef);
    if constexpr (!kIsCpu<B>) {
        std::vector<float> cpu(ny);
        p.x = x.data(); p.w = w.ref(); p.bias = k.bias ? bias.data() : nullptr; p.y = cpu.data();
        Ops<Cpu>::conv_transpose1d(p);
        CHECK(max_norm_rel(got, cpu) <= kTolCpu);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("conv_transpose1d matches the scatter definition", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    const ConvCase cases[] = {
        {1, 1, 1, 1, 4, 2, 1, true},
        {2, 3, 5, 4, 4, 2, 1, true},
        {1, 37, 129, 8, 4, 2, 1, true},
        {3, 7, 9, 5, 3, 1, 0, false},
        {1, 5, 3, 3, 5, 3, 2, true},
        {1, 600, 300, 8, 4, 2, 1, true},  // parallel, output channels in chunks
        {5, 9, 6, 16, 4, 2, 1, true},     // several batch passes
        // CUDA paths: tiled (k 4, s 2, p 1) at the PushT upsamples, odd channels, length 1; generic otherwise.
        {1, 1024, 1024, 4, 4, 2, 1, true},  // PushT up0 upsample
        {1, 512, 512, 8, 4, 2, 1, true},    // PushT up1 upsample
        {3, 7, 37, 4, 4, 2, 1, true},       // tiled, odd channels, batch 3
        {2, 37, 129, 1, 4, 2, 1, true},     // tiled, length 1
        {2, 3, 7, 5, 4, 2, 1, true},        // length 5: generic
        {1, 37, 129, 3, 3, 2, 0, true},     // output padding: generic
        {1, 5, 9, 7, 5, 3, 2, true},        // stride 3: generic
    };
    std::uint32_t seed = 2000;
    for (const auto& k : cases)
        for (DType dt : kAllDtypes)
            for (int out_pad = 0; out_pad < k.stride; ++out_pad) {
                run_conv_transpose1d<B>(k, out_pad, dt, seed += 10);
                if (kIsCpu<B> && packs_conv()) run_conv_transpose1d<B>(k, out_pad, dt, seed += 10, /*packed=*/true);
            }
}

TEST_CASE("conv_transpose1d on packed weights: same bits for any batch grouping, row chunking and thread count") {
    if (packs_conv()) {
        // A batch-40 call of length 16 takes groups of batch rows and several chunks of output rows (the z scratch
        // holds 65536 floats); every batch row must equal its own batch-1 call bit for bit, at 1 and 2 threads.
        for (DType dt : kAllDtypes) {
            CAPTURE(dtype_name(dt));
            // K = 5 does not divide the 96-row chunks, so output channels straddle chunk boundaries.
            const int cin = 96, cout = 300, K = 5, L = 16, batch = 40, lout = 31;
            const HostWeights w = make_weights(std::size_t(cin) * cout * K, dt, 91, 0.3f);
            const auto pw = packed_conv_transpose_bytes(w, cin, cout, K);
            const auto x = random_vec(std::size_t(batch) * cin * L, 92);
            const auto bias = random_vec(std::size_t(cout), 93);
            ConvTranspose1dParams p;
            p.w = {nullptr, dt, pw.get()};
            p.bias = bias.data();
            p.in_channels = cin;
            p.out_channels = cout;
            p.in_length = L;
            p.out_length = lout;
            p.kernel = K;
            p.stride = 2;
            p.pad = 2;
            std::vector<float> single(std::size_t(batch) * cout * lout);
            for (int b = 0; b < batch; ++b) {
                p.batch = 1;
                p.x = x.data() + std::size_t(b) * cin * L;
                p.y = single.data() + std::size_t(b) * cout * lout;
                Ops<Cpu>::conv_transpose1d(p);
            }
            for (int threads : {1, 2}) {
                std::vector<float> y(single.size(), -5.f);
                p.batch = batch;
                p.x = x.data();
                p.y = y.data();
                with_threads(threads, [&] { Ops<Cpu>::conv_transpose1d(p); });
                CAPTURE(threads);
                CHECK(bit_mismatches(y, single) == 0);
            }
        }
    }
}

TEST_CASE_TEMPLATE("conv_transpose1d rejects inconsistent shapes, bad dtypes and null pointers with the shared message" *
                       doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(64);
    ConvTranspose1dParams t;
    t.x = buf.ptr(); t.w = {buf.ptr(), DType::F32}; t.y = buf.ptr();
    t.in_channels = 2; t.out_channels = 2; t.in_length = 4; t.out_length = 10;  // kernel 4, stride 2, pad 1: 8..9
    CHECK_THROWS_WITH_AS(Ops<B>::conv_transpose1d(t),
                         "flowedge: conv_transpose1d: out_length inconsistent with in_length, kernel, stride and pad (expected 8..9, got 10)",
                         Error);
    t.out_length = 7;
    CHECK_THROWS_WITH_AS(Ops<B>::conv_transpose1d(t),
                         "flowedge: conv_transpose1d: out_length inconsistent with in_length, kernel, stride and pad (expected 8..9, got 7)",
                         Error);
    t.in_length = 1; t.kernel = 2; t.pad = 1; t.out_length = 1;
    CHECK_THROWS_WITH_AS(Ops<B>::conv_transpose1d(t),
                         "flowedge: conv_transpose1d: padding leaves no output (expected 2 * pad < (in_length - 1) * stride + kernel = 2, got pad 1)",
                         Error);
    t.in_length = 4; t.kernel = 4; t.out_length = 8; t.stride = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::conv_transpose1d(t),
                         "flowedge: conv_transpose1d: sizes must be positive (expected batch, in_channels, out_channels, in_length, kernel, "
                         "stride > 0 and pad >= 0, got batch 1, in_channels 2, out_channels 2, in_length 4, kernel 4, stride 0, pad 1)",
                         Error);
    t.stride = 2;
    t.w.dtype = static_cast<DType>(5);
    CHECK_THROWS_WITH_AS(Ops<B>::conv_transpose1d(t), "flowedge: conv_transpose1d: unknown weight dtype (expected F32, BF16 or F16, got 5)",
                         Error);
    t.w.dtype = DType::F32;
    t.y = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::conv_transpose1d(t), "flowedge: conv_transpose1d: null x, w or y pointer", Error);
    Memory<B>::synchronize();
}
