// conv1d on every backend vs a naive double-accumulating loop (padding, stride, every weight dtype, the CPU's chunked
// and parallel paths, the CUDA row/tiled/generic paths and the PushT U-Net shapes), a non-CPU backend also vs
// Ops<Cpu>; conv1d_group_norm (a GroupNorm of a conv's output) vs a double GroupNorm of the exact conv output; the
// CPU's packed weight layout; and the shared argument checks.
#include "../support/conv_case.hpp"
#include "cpu_packed_util.hpp"
#include "group_norm_reference.hpp"
#include "ops_test_util.hpp"

using namespace optest;

namespace {

using fe_test::ConvCase;

/// packed: CPU only, the weights in the packed layout (WeightRef::packed) instead of [out, in, kernel].
/// w_skip > 0 stores the weights w_skip elements past the start of their allocation (a misaligned weight pointer:
/// 16-bit weights at w_skip = 4 are 8- but not 16-byte aligned).
template <class B>
void run_conv1d(const ConvCase& k, DType dt, std::uint32_t seed, bool packed = false, int w_skip = 0) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.lin); CAPTURE(k.kernel); CAPTURE(k.stride); CAPTURE(k.pad);
    CAPTURE(dtype_name(dt)); CAPTURE(packed); CAPTURE(w_skip);
    const int lout = k.conv_out();
    const auto x = random_vec(std::size_t(k.batch) * k.cin * k.lin, seed);
    const auto bias = random_vec(k.cout, seed + 1);
    const std::size_t nw = std::size_t(k.cout) * k.cin * k.kernel;
    const HostWeights w = make_weights(std::size_t(w_skip) + nw, dt, seed + 2, 0.3f);
    const double* wv = w.value.data() + w_skip;
    const std::size_t ny = std::size_t(k.batch) * k.cout * lout;
    std::vector<double> ref(ny), scale(ny);
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int t = 0; t < lout; ++t) {
                double s = k.bias ? bias[o] : 0.0, mag = std::fabs(s);
                for (int i = 0; i < k.cin; ++i)
                    for (int kk = 0; kk < k.kernel; ++kk) {
                        const int src = t * k.stride + kk - k.pad;
                        if (src < 0 || src >= k.lin) continue;
                        const double v = wv[(std::size_t(o) * k.cin + i) * k.kernel + kk] * x[(std::size_t(b) * k.cin + i) * k.lin + src];
                        s += v;
                        mag += std::fabs(v);
                    }
                const std::size_t idx = (std::size_t(b) * k.cout + o) * lout + t;
                ref[idx] = s;
                scale[idx] = mag;
            }
    const std::size_t w_off = std::size_t(w_skip) * dtype_size(dt);
    Dev<float, B> dx(x), db(bias), dy(ny);
    DevWeights<B> dw(w);
    Conv1dParams p = fe_test::conv1d_params(k, dx.ptr(), {dw.d.ptr() + w_off, dt}, k.bias ? db.ptr() : nullptr);
    std::unique_ptr<PreparedWeight> pw;
    if (packed) {
        REQUIRE(w_skip == 0);
        pw = packed_conv_bytes(w, k.cout);
        p.w = {nullptr, dt, pw.get()};
    }
    p.y = dy.ptr();
    Ops<B>::conv1d(p);
    const auto got = dy.host(ny);
    check_all(got, ref, scale, 2e-6, "conv1d");
    CHECK(max_norm_rel(got, ref) <= kTolRef);
    if constexpr (!kIsCpu<B>) {
        std::vector<float> cpu(ny);
        p.x = x.data(); p.w = {w.bytes.data() + w_off, dt}; p.bias = k.bias ? bias.data() : nullptr; p.y = cpu.data();
        Ops<Cpu>::conv1d(p);
        CHECK(max_norm_rel(got, cpu) <= kTolCpu);
    }
}

/// Shorthand for the CUDA path lists below: (batch, in, out, length, kernel, stride, pad) with a bias.
ConvCase cc(int batch, int in, int out, int len, int k, int stride, int pad) { return {batch, in, out, len, k, stride, pad, true}; }

/// conv1d_group_norm: Conv1d, then GroupNorm(groups, conv.cout) + Mish with a FiLM (optionally plus a shared row) or
/// a residual, as the U-Net's two block halves.
struct ConvNormCase {
    ConvCase conv;
    int groups;
    bool film, shared, residual;
};

/// Values rounded to multiples of `step`.
std::vector<float> on_grid(std::vector<float> v, float step) {
    for (float& e : v) e = std::round(e / step) * step;
    return v;
}

/// Scratch for a library-GEMM path of conv p on backend B (none on the CPU), with p.math's library readied first.
template <class B>
struct GemmScratch {
    std::size_t bytes;
    Dev<std::byte, B> buf;
    explicit GemmScratch(const Conv1dParams& p)
        : bytes((Ops<B>::prepare_math(p.math), Ops<B>::conv1d_scratch_bytes(p))), buf(bytes) {}
    void* ptr() { return bytes ? static_cast<void*>(buf.ptr()) : nullptr; }
};

/// conv1d_group_norm under `math` (with GEMM scratch where the backend asks for it, f32_gemm under F32) vs the double
/// GroupNorm of the exact conv output; a non-CPU backend also vs Ops<Cpu>. Inputs lie on a grid (x: multiples of 1/8
/// in [-2, 2]; weights: multiples of 1/64 in [-1, 1]; bias: multiples of 1/8) that every weight dtype and the TF32 /
/// BF16 GEMM operands hold exactly, and in_channels * kernel < 16384 keeps every partial sum below 2^15, a multiple of
/// 2^-9: the raw conv output is then exact in float on every path, whatever the summation order, so one reference
/// and the GroupNorm's own bound serve the exact kernels and the library-GEMM path alike.
template <class B>
void run_conv1d_group_norm(const ConvNormCase& k, DType dt, MathMode math, std::uint32_t seed) {
    const ConvCase& cv = k.conv;
    CAPTURE(cv.batch); CAPTURE(cv.cin); CAPTURE(cv.cout); CAPTURE(cv.lin); CAPTURE(cv.kernel); CAPTURE(cv.stride);
    CAPTURE(k.groups); CAPTURE(k.film); CAPTURE(k.shared); CAPTURE(k.residual); CAPTURE(dtype_name(dt)); CAPTURE(int(math));
    REQUIRE(cv.cin * cv.kernel < 16384);
    const int C = cv.cout, lout = cv.conv_out();
    const std::size_t nx = std::size_t(cv.batch) * cv.cin * cv.lin, ny = std::size_t(cv.batch) * C * lout;
    const auto x = on_grid(random_vec(nx, seed, -2.f, 2.f), 0.125f);
    auto bias = on_grid(random_vec(C, seed + 1, -2.f, 2.f), 0.125f);
    for (float& b : bias) b += 8.f;  // a large mean: the statistics must not lose precision to it
    const HostWeights w = make_weights(std::size_t(C) * cv.cin * cv.kernel, dt, seed + 2, 1.f, 1.f / 64);
    std::vector<float> h(ny);  // the conv output, exact in float
    for (int b = 0; b < cv.batch; ++b)
        for (int o = 0; o < C; ++o)
            for (int t = 0; t < lout; ++t) {
                double acc = bias[std::size_t(o)];
                for (int i = 0; i < cv.cin; ++i)
                    for (int kk = 0; kk < cv.kernel; ++kk) {
                        const int src = t * cv.stride + kk - cv.pad;
                        if (src >= 0 && src < cv.lin)
                            acc += w.value[(std::size_t(o) * cv.cin + i) * cv.kernel + kk] * x[(std::size_t(b) * cv.cin + i) * cv.lin + src];
                    }
                h[(std::size_t(b) * C + o) * lout + t] = float(acc);
                REQUIRE(double(h[(std::size_t(b) * C + o) * lout + t]) == acc);
            }
    const auto gamma = random_vec(C, seed + 3, 0.5f, 1.5f), beta = random_vec(C, seed + 4);
    const auto film = random_vec(std::size_t(cv.batch) * 2 * C, seed + 5), shared = random_vec(2 * std::size_t(C), seed + 6);
    const auto residual = random_vec(ny, seed + 7);
    GroupNormReference r;
    r.batch = cv.batch; r.channels = C; r.length = lout; r.groups = k.groups;
    r.gamma = gamma.data(); r.beta = beta.data(); r.act = Activation::Mish;
    r.film = k.film ? film.data() : nullptr;
    r.film_stride = 2 * C;
    r.shared = k.film && k.shared ? shared.data() : nullptr;
    r.residual = k.residual ? residual.data() : nullptr;
    std::vector<double> ref, scale;
    group_norm_reference(r, h, ref, scale);

    Dev<float, B> dx(x), db(bias), dg(gamma), dbt(beta), df(film), dsh(shared), dres(residual), dh(ny), dy(ny);
    DevWeights<B> dw(w);
    Conv1dGroupNormParams q;
    q.conv = fe_test::conv1d_params(cv, dx.ptr(), {dw.d.ptr(), dt}, db.ptr());
    q.conv.y = dh.ptr();
    q.conv.math = math;
    q.conv.f32_gemm = math == MathMode::F32;
    q.norm.x = dh.ptr(); q.norm.y = dy.ptr(); q.norm.gamma = dg.ptr(); q.norm.beta = dbt.ptr();
    q.norm.batch = cv.batch; q.norm.channels = C; q.norm.length = lout; q.norm.groups = k.groups; q.norm.act = Activation::Mish;
    q.norm.film = k.film ? df.ptr() : nullptr;
    q.norm.film_shared = k.film && k.shared ? dsh.ptr() : nullptr;
    q.norm.residual = k.residual ? dres.ptr() : nullptr;
    GemmScratch<B> scratch(q.conv);
    q.conv.scratch = scratch.ptr();
    q.conv.scratch_bytes = scratch.bytes;
    Ops<B>::conv1d_group_norm(q);
    const auto got = dy.host(ny);
    check_all(got, ref, scale, 2e-6, "conv1d_group_norm");
    CHECK(max_norm_rel(got, ref) <= kTolRef);
    CHECK(dx.host(nx) == x);
#ifdef FLOWEDGE_WITH_CUDA
    if constexpr (std::is_same_v<B, Cuda>) {
        // Batched calls with scratch under a GEMM request take the GEMM-layout norm (F32 weights, or BF16 weights under
        // BF16 math; in_channels * kernel a multiple of 8 keeps the operand rows aligned for the library; groups of at
        // most 2048 elements).
        const bool gemm = scratch.bytes > 0 && (dt == DType::F32 || (dt == DType::BF16 && math == MathMode::BF16)) &&
                          cv.cin * cv.kernel % 8 == 0 && C / k.groups * lout <= 2048;
        if (gemm) CHECK(cuda::conv1d_gemm_group_norm(q, {}));
    }
#endif
    if constexpr (!kIsCpu<B>) {
        std::vector<float> cpu(ny), cpu_h(ny);
        Conv1dGroupNormParams c = q;
        c.conv.x = x.data(); c.conv.w = {w.bytes.data(), dt}; c.conv.bias = bias.data(); c.conv.y = cpu_h.data();
        c.conv.scratch = nullptr; c.conv.scratch_bytes = 0;
        c.norm.x = cpu_h.data(); c.norm.y = cpu.data(); c.norm.gamma = gamma.data(); c.norm.beta = beta.data();
        c.norm.film = k.film ? film.data() : nullptr; c.norm.film_shared = k.film && k.shared ? shared.data() : nullptr;
        c.norm.residual = k.residual ? residual.data() : nullptr;
        Ops<Cpu>::conv1d_group_norm(c);
        CHECK(max_norm_rel(got, cpu) <= kTolCpu);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("conv1d matches a naive loop (padding, stride, dtypes, chunking)", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    const ConvCase cases[] = {
        {1, 1, 1, 1, 1, 1, 0, true},
        {2, 3, 7, 5, 3, 1, 1, true},
        {1, 37, 129, 16, 5, 1, 2, true},
        {3, 7, 37, 7, 3, 2, 1, false},    // stride-2 downsample, odd length
        {1, 129, 3, 4, 1, 1, 0, true},    // 1x1 residual conv
        {1, 16, 8, 2, 3, 2, 1, true},     // downsample of a length-2 input
        {2, 512, 64, 16, 5, 1, 2, true},  // parallel, 32 columns (4 column blocks)
        {1, 4096, 8, 4, 5, 1, 2, true},   // im2col panel split over input channels
        {5, 6, 9, 16, 5, 1, 2, true},     // 80 columns: two weight passes
        {1, 3, 4, 6, 7, 1, 3, true},      // kernel longer than the input
    };
    std::uint32_t seed = 1000;
    for (const auto& k : cases)
        for (DType dt : kAllDtypes) run_conv1d<B>(k, dt, seed += 10);
}

TEST_CASE_TEMPLATE("conv1d matches a naive loop: odd sizes and the CUDA generic fallbacks", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    std::uint32_t seed = 100;
    for (DType dt : kAllDtypes) {
        run_conv1d<B>(cc(1, 3, 7, 37, 5, 1, 2), dt, seed++);    // in % 4 != 0: generic
        run_conv1d<B>(cc(2, 8, 37, 7, 5, 1, 2), dt, seed++);    // tiled, LT 8 with tail
        run_conv1d<B>(cc(1, 4, 3, 1, 3, 2, 1), dt, seed++);     // length 1, stride 2
        run_conv1d<B>(cc(3, 12, 5, 33, 3, 2, 1), dt, seed++);   // several time tiles and batches
        run_conv1d<B>(cc(2, 36, 9, 40, 3, 1, 1), dt, seed++);   // k3 s1, 3 tiles
        run_conv1d<B>(cc(1, 20, 129, 9, 7, 1, 3), dt, seed++);  // kernel 7: generic
        run_conv1d<B>(cc(1, 16, 11, 10, 4, 3, 0), dt, seed++);  // stride 3: generic
        run_conv1d<B>(cc(2, 132, 37, 5, 1, 1, 0), dt, seed++);  // 1x1
        run_conv1d<B>(cc(1, 1028, 7, 3, 5, 1, 2), dt, seed++);  // several channel chunks with a tail
        // Row path (pad = K/2, whole rows of 1/2/4/8/16): odd output counts, channel-step tails, batches.
        run_conv1d<B>(cc(3, 36, 37, 4, 5, 1, 2), dt, seed++);    // k5, 3 batches, 37 outputs
        run_conv1d<B>(cc(2, 1028, 9, 8, 3, 2, 1), dt, seed++);   // k3 s2, a tail of 4 channels past the steps
        run_conv1d<B>(cc(1, 260, 129, 16, 3, 1, 1), dt, seed++); // k3 s1, L 16
        run_conv1d<B>(cc(2, 4, 5, 2, 5, 1, 2), dt, seed++);      // k5 over a row of 2 (most taps in the padding)
        run_conv1d<B>(cc(1, 516, 33, 1, 1, 1, 0), dt, seed++);   // 1x1 on a row of 1
        run_conv1d<B>(cc(1, 4100, 3, 4, 5, 1, 2), dt, seed++);   // many steps per warp, 3 outputs
    }
}

TEST_CASE_TEMPLATE("conv1d matches a naive loop: the CUDA row path's layouts (8 channels per lane, 4 outputs per warp) and their fallbacks",
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    // Which layout runs depends on the card's resident-block count (kernels/cuda conv1d row path); the comments name
    // the layout on an H100/H200. Every case is checked against the double loop on every backend anyway.
    std::uint32_t seed = 200;
    for (DType dt : kAllDtypes) {
        // in % 8 == 0 and in < 256: 16-bit weights take 8 channels per lane (16-byte loads) on any card.
        run_conv1d<B>(cc(1, 8, 5, 4, 5, 1, 2), dt, seed++);       // one lane's worth of channels, 5 outputs
        run_conv1d<B>(cc(2, 24, 19, 8, 5, 1, 2), dt, seed++);     // 3 lanes, 2 batches
        run_conv1d<B>(cc(1, 248, 37, 16, 5, 1, 2), dt, seed++);   // L 16, 31 of 32 lanes
        run_conv1d<B>(cc(1, 16, 3, 2, 5, 1, 2), dt, seed++);      // row of 2
        run_conv1d<B>(cc(1, 40, 9, 1, 3, 2, 1), dt, seed++);      // row of 1, stride 2
        run_conv1d<B>(cc(1, 120, 9, 8, 3, 1, 1), dt, seed++);     // k3 s1
        // 2048 outputs keep the grid at one wave, so 8 channels per lane (several steps, a tail of 8 channels).
        run_conv1d<B>(cc(1, 1032, 2048, 8, 3, 2, 1), dt, seed++);
        run_conv1d<B>(cc(1, 1032, 2050, 8, 1, 1, 0), dt, seed++);  // and 4 outputs per warp, 2 outputs past a warp's 4
        // Few outputs: 8 channels per lane would halve the blocks, so 4 channels per lane (8-byte loads).
        run_conv1d<B>(cc(1, 264, 37, 16, 5, 1, 2), dt, seed++);   // step tail (264 = 256 + 8)
        // in % 8 == 4: 16-bit weights always take 4 channels per lane.
        run_conv1d<B>(cc(1, 20, 13, 4, 5, 1, 2), dt, seed++);
        run_conv1d<B>(cc(2, 1036, 6, 8, 5, 1, 2), dt, seed++);
        // in % 8 == 0 but the input too long to stage in shared memory (16-bit: 4 channels per lane).
        run_conv1d<B>(cc(1, 3080, 2048, 8, 3, 2, 1), dt, seed++);
        // in % 8 == 0 but the weights only 8-byte aligned (16-bit) / 16-byte aligned (F32): 4 channels per lane.
        run_conv1d<B>(cc(1, 32, 9, 4, 5, 1, 2), dt, seed++, false, 4);
        run_conv1d<B>(cc(1, 264, 5, 8, 1, 1, 0), dt, seed++, false, 4);
        // k = 1 on rows of <= 8: 4 outputs per warp; output counts not a multiple of 4, channel tails.
        run_conv1d<B>(cc(1, 12, 37, 8, 1, 1, 0), dt, seed++);     // in % 8 == 4
        run_conv1d<B>(cc(1, 2056, 6, 8, 1, 1, 0), dt, seed++);    // 2 outputs past the last full warp of 4
        run_conv1d<B>(cc(2, 264, 513, 4, 1, 1, 0), dt, seed++);   // many blocks, 2 batches
        run_conv1d<B>(cc(3, 40, 5, 2, 1, 1, 0), dt, seed++);
        run_conv1d<B>(cc(1, 1028, 3, 1, 1, 1, 0), dt, seed++);    // fewer outputs than one warp's 4
        run_conv1d<B>(cc(1, 4104, 130, 8, 1, 1, 0), dt, seed++);  // several steps per lane
        run_conv1d<B>(cc(1, 2048, 512, 8, 1, 1, 0), dt, seed++);  // up1 residual 1x1 (PushT)
        run_conv1d<B>(cc(1, 1024, 2048, 4, 1, 1, 0), dt, seed++); // down2 residual 1x1 (PushT)
        run_conv1d<B>(cc(1, 12, 7, 16, 1, 1, 0), dt, seed++);     // k = 1 at L 16 keeps one output per warp
        // Input staged in shared memory only up to 96 KiB per block: 1544 x 16 floats (98.8 KB) reads global rows.
        run_conv1d<B>(cc(1, 1544, 9, 16, 5, 1, 2), dt, seed++);
        run_conv1d<B>(cc(2, 3080, 5, 8, 3, 2, 1), dt, seed++);    // 98.6 KB per batch element, k3 s2
    }
}

TEST_CASE_TEMPLATE("conv1d matches a naive loop on the PushT U-Net shapes", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    std::uint32_t seed = 300;
    for (DType dt : kAllDtypes) {
        run_conv1d<B>(cc(1, 2, 512, 16, 5, 1, 2), dt, seed++);     // down0 r0 conv1 (generic: in 2)
        run_conv1d<B>(cc(1, 512, 512, 16, 5, 1, 2), dt, seed++);   // down0 / final conv block
        run_conv1d<B>(cc(1, 512, 512, 16, 3, 2, 1), dt, seed++);   // down0 downsample
        run_conv1d<B>(cc(1, 512, 1024, 8, 5, 1, 2), dt, seed++);   // down1 r0 conv1
        run_conv1d<B>(cc(1, 1024, 1024, 8, 3, 2, 1), dt, seed++);  // down1 downsample
        run_conv1d<B>(cc(1, 2048, 2048, 4, 5, 1, 2), dt, seed++);  // down2 / mid
        run_conv1d<B>(cc(1, 4096, 1024, 4, 5, 1, 2), dt, seed++);  // up0 r0 conv1
        run_conv1d<B>(cc(1, 4096, 1024, 4, 1, 1, 0), dt, seed++);  // up0 residual 1x1
        run_conv1d<B>(cc(1, 2048, 512, 8, 5, 1, 2), dt, seed++);   // up1 r0 conv1
        run_conv1d<B>(cc(1, 512, 2, 16, 1, 1, 0), dt, seed++);     // final 1x1
        run_conv1d<B>(cc(2, 1024, 1024, 8, 5, 1, 2), dt, seed++);  // batch 2
    }
}

TEST_CASE_TEMPLATE("conv1d_group_norm matches Conv1d then GroupNorm + Mish + FiLM / residual in double, on every path",
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    const ConvNormCase cases[] = {
        {cc(1, 512, 512, 16, 5, 1, 2), 8, true, true, false},    // PushT down0 conv1 (batch 1: exact kernels)
        {cc(1, 2048, 2048, 4, 5, 1, 2), 8, false, false, true},  // down2 / mid conv2
        {cc(2, 96, 64, 16, 5, 1, 2), 8, true, false, false},     // batch * length 32: the batched paths
        {cc(8, 256, 128, 8, 5, 1, 2), 8, true, true, false},     // PushT-like batch 8
        {cc(16, 128, 256, 4, 5, 1, 2), 8, false, false, true},   // L 4, groups of 128 elements
        {cc(4, 40, 48, 16, 3, 1, 1), 3, true, false, false},     // 16 channels per group, Kg 120
        {cc(3, 37, 20, 11, 5, 1, 2), 4, false, false, true},     // odd sizes: Kg 185 (unaligned rows)
        {cc(1, 36, 64, 7, 5, 1, 2), 2, true, false, false},      // length 7 (tiled path)
        {cc(2, 64, 512, 16, 5, 1, 2), 2, false, false, true},    // groups of 4096 elements: GEMM, transpose, group_norm
        {cc(4, 64, 512, 16, 5, 1, 2), 8, true, false, true},     // groups of 1024 (PushT's at every level) on the GEMM layout
        {cc(2, 64, 256, 16, 5, 1, 2), 2, true, false, false},    // groups of 2048: the GEMM-layout norm's largest
    };
    std::uint32_t seed = 500;
    for (const auto& k : cases) {
        // On the CPU the op is conv1d then group_norm, whose kernels the conv1d cases check at the PushT shapes; the
        // PushT-size cases here pick CUDA paths, and under the sanitizers they were most of this test's CPU time.
        if (kIsCpu<B> && std::int64_t(k.conv.cin) * k.conv.cout * k.conv.kernel > (1 << 20)) {
            seed += 10 * int(std::size(kAllDtypes)) * 2;  // the seeds its CPU runs would take: later cases keep theirs
            continue;
        }
        for (DType dt : kAllDtypes)
            for (MathMode m : {MathMode::F32, MathMode::TF32, MathMode::BF16})
                if (!(kIsCpu<B> && m == MathMode::TF32)) run_conv1d_group_norm<B>(k, dt, m, seed += 10);  // CPU: TF32 = F32
    }
}

TEST_CASE_TEMPLATE("conv1d_group_norm rejects a norm that does not read the conv's output, other shapes and overlapping buffers" *
                       doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(256);
    Conv1dGroupNormParams q;
    q.conv.x = buf.ptr(); q.conv.w = {buf.ptr() + 32, DType::F32}; q.conv.y = buf.ptr() + 64;
    q.conv.in_channels = 2; q.conv.out_channels = 4; q.conv.in_length = 8; q.conv.out_length = 8; q.conv.kernel = 3; q.conv.pad = 1;
    q.norm.x = buf.ptr() + 64; q.norm.y = buf.ptr() + 128;
    q.norm.channels = 4; q.norm.length = 8; q.norm.groups = 2;
    auto bad = [&](auto edit) { Conv1dGroupNormParams r = q; edit(r); return r; };
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d_group_norm(bad([&](auto& r) { r.norm.x = buf.ptr() + 128; })),
                         "flowedge: conv1d_group_norm: the norm must read the conv's output (expected norm.x == conv.y, got another buffer)", Error);
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d_group_norm(bad([](auto& r) { r.norm.length = 4; })),
                         "flowedge: conv1d_group_norm: conv output and norm shapes differ (expected batch 1, channels 4, length 8, got "
                         "batch 1, channels 4, length 4)", Error);
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d_group_norm(bad([&](auto& r) { r.norm.y = buf.ptr() + 80; })),
                         "flowedge: conv1d_group_norm: norm output overlaps the conv's input or output (expected disjoint buffers, got overlap)",
                         Error);
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d_group_norm(bad([](auto& r) { r.norm.groups = 3; })),
                         doctest::Contains("flowedge: group_norm: channels not divisible by groups"), Error);
    Memory<B>::synchronize();
}

TEST_CASE("conv1d on packed weights matches a naive loop (builds that pack Conv1d weights)") {
    if (!packs_conv()) {
        MESSAGE("this build keeps Conv1d weights row-major (the process's kernel set does not pack them): nothing to check");
    } else {
        // Column counts 1..80 (every micro-kernel width and the 64-column passes), input-channel chunks, output
        // counts that are not a multiple of the block width, reductions longer than one kPackChunk.
        const ConvCase cases[] = {
            {1, 1, 1, 1, 1, 1, 0, true},
            {2, 3, 7, 5, 3, 1, 1, true},
            {1, 37, 129, 16, 5, 1, 2, true},
            {3, 7, 37, 7, 3, 2, 1, false},
            {1, 129, 3, 4, 1, 1, 0, true},
            {1, 16, 8, 2, 3, 2, 1, true},
            {2, 512, 64, 16, 5, 1, 2, true},
            {1, 4096, 8, 4, 5, 1, 2, true},
            {5, 6, 9, 16, 5, 1, 2, true},
            {1, 3, 4, 6, 7, 1, 3, true},
            {1, 300, 33, 8, 5, 1, 2, true},
            {1, 64, 17, 5, 5, 1, 2, false},
            {1, 64, 17, 6, 5, 1, 2, true},
            {1, 2048, 40, 4, 5, 1, 2, true},
            {4, 401, 30, 16, 3, 1, 1, true},  // 64 columns, K = 3: 341 channels per pass (BF16 pairs: 340), odd R
        };
        std::uint32_t seed = 5000;
        for (const auto& k : cases)
            for (DType dt : kAllDtypes) run_conv1d<Cpu>(k, dt, seed += 10, /*packed=*/true);
    }
}

TEST_CASE("conv1d on packed weights: same bits for any batch grouping and thread count") {
    if (packs_conv()) {
        // Each output is summed the same way whichever column group it falls in: a batch-3 call (12 columns: groups
        // of 6 for F32/F16 blocks, 4 for BF16 blocks) equals three batch-1 calls (4 columns: one group), bit for
        // bit, at 1 and 2 threads.
        const int cin = 700, cout = 200, K = 5, L = 4, batch = 3;  // 12 x 3500 x 200 MACs: above kParallelMacs
        for (DType dt : kAllDtypes) {
            CAPTURE(dtype_name(dt));
            const HostWeights w = make_weights(std::size_t(cout) * cin * K, dt, 77, 0.3f);
            const auto pw = packed_conv_bytes(w, cout);
            const auto x = random_vec(std::size_t(batch) * cin * L, 78);
            Conv1dParams p;
            p.w = {nullptr, dt, pw.get()};
            p.in_channels = cin;
            p.out_channels = cout;
            p.in_length = L;
            p.out_length = L;
            p.kernel = K;
            p.pad = 2;
            std::vector<float> single(std::size_t(batch) * cout * L);
            for (int b = 0; b < batch; ++b) {
                p.batch = 1;
                p.x = x.data() + std::size_t(b) * cin * L;
                p.y = single.data() + std::size_t(b) * cout * L;
                Ops<Cpu>::conv1d(p);
            }
            for (int threads : {1, 2}) {
                std::vector<float> y(single.size());
                p.batch = batch;
                p.x = x.data();
                p.y = y.data();
                with_threads(threads, [&] { Ops<Cpu>::conv1d(p); });
                CAPTURE(threads);
                CHECK(bit_mismatches(y, single) == 0);
            }
        }
    }
}

#if defined(FLOWEDGE_CPU_X86)
TEST_CASE("conv1d on BF16 blocks: the AVX-512 set's 512-bit kernel gives the AVX2 set's kernel's bits") {
    if (cpu::active_isa() != cpu::Isa::Avx512) {
        MESSAGE("the AVX-512 set is not this process's kernel set: nothing to check");
        return;
    }
    // Odd and even block counts (a thread's last block alone), odd R (a half-used last pair), column counts 1..80
    // (every group width and the 64-column passes), several input-channel chunks, reductions longer than kPackChunk.
    const ConvCase cases[] = {
        {1, 1, 1, 1, 1, 1, 0, true},       {2, 3, 7, 5, 3, 1, 1, true},      {1, 37, 129, 16, 5, 1, 2, true},
        {3, 7, 37, 7, 3, 2, 1, false},     {1, 129, 3, 4, 1, 1, 0, true},    {1, 512, 72, 16, 5, 1, 2, true},
        {1, 4096, 48, 4, 5, 1, 2, true},   {5, 6, 9, 16, 5, 1, 2, true},     {1, 300, 200, 8, 5, 1, 2, true},
        {1, 64, 17, 5, 5, 1, 2, false},    {1, 2048, 40, 4, 5, 1, 2, true},  {4, 401, 30, 16, 3, 1, 1, true},
        {1, 1024, 120, 8, 3, 2, 1, true},
    };
    std::uint32_t seed = 9000;
    for (const auto& k : cases) {
        CAPTURE(k.cin);
        CAPTURE(k.cout);
        CAPTURE(k.lin);
        const HostWeights w = make_weights(std::size_t(k.cout) * k.cin * k.kernel, DType::BF16, seed += 10, 0.3f);
        const auto pw = packed_conv_bytes(w, k.cout);
        const WeightRef ref{nullptr, DType::BF16, pw.get()};
        const void* blocks = cpu::packed_weight(ref)->data();
        const auto x = random_vec(std::size_t(k.batch) * k.cin * k.lin, seed + 1);
        const auto bias = random_vec(std::size_t(k.cout), seed + 2);
        Conv1dParams p = conv1d_params(k, x.data(), ref, k.bias ? bias.data() : nullptr);
        const std::size_t ny = std::size_t(k.batch) * k.cout * p.out_length;
        for (int threads : {1, 2}) {
            CAPTURE(threads);
            std::vector<float> y_ymm(ny, -1.f), y_zmm(ny, -2.f);
            with_threads(threads, [&] {
                p.y = y_ymm.data();
                cpu::avx2::conv1d(p, blocks, false, false);
                p.y = y_zmm.data();
                cpu::avx512::packed_bf16_zmm::conv1d(p, static_cast<const bf16*>(blocks));
            });
            CHECK(bit_mismatches(y_zmm, y_ymm) == 0);
        }
    }
}
#endif

TEST_CASE_TEMPLATE("conv1d rejects inconsistent shapes, bad dtypes and null pointers with the shared message" *
                       doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(64);
    Conv1dParams c;
    c.x = buf.ptr(); c.w = {buf.ptr(), DType::F32}; c.y = buf.ptr();
    c.in_channels = 2; c.out_channels = 2; c.in_length = 4; c.kernel = 3; c.pad = 1; c.out_length = 5;
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d(c),
                         "flowedge: conv1d: out_length inconsistent with in_length, kernel, stride and pad (expected 4, got 5)", Error);
    c.in_channels = 4; c.out_length = 7; c.in_length = 8;
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d(c),
                         "flowedge: conv1d: out_length inconsistent with in_length, kernel, stride and pad (expected 8, got 7)", Error);
    c.in_length = 1; c.pad = 0; c.out_length = 1;
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d(c),
                         "flowedge: conv1d: kernel longer than the padded input (expected kernel <= in_length + 2 * pad = 1, got 3)", Error);
    c.in_length = 4; c.pad = -1; c.out_length = 1;
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d(c),
                         "flowedge: conv1d: sizes must be positive (expected batch, in_channels, out_channels, in_length, kernel, stride > 0 "
                         "and pad >= 0, got batch 1, in_channels 4, out_channels 2, in_length 4, kernel 3, stride 1, pad -1)",
                         Error);
    c.pad = 1; c.out_length = 4;
    c.w.dtype = static_cast<DType>(9);
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d(c), "flowedge: conv1d: unknown weight dtype (expected F32, BF16 or F16, got 9)", Error);
    c.w.dtype = DType::F32;
    c.x = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::conv1d(c), "flowedge: conv1d: null x, w or y pointer", Error);
    Memory<B>::synchronize();
}
