// Mamba's causal_conv (with its rolling state) and selective_scan on every backend vs the full-sequence definitions
// in double, fed in prefill chunks and single steps, a non-CPU backend also vs Ops<Cpu>; and the shared argument
// checks.
#include "ops_test_util.hpp"

#include <cstddef>

using namespace optest;

namespace {

// Naive causal depthwise conv over a full sequence with zero history (docs/models.md#mamba-1-backbone, step 3). x: [L, C] contiguous.
std::vector<double> ref_causal(const std::vector<float>& x, int L, int C, const std::vector<double>& w,
                               const std::vector<float>& bias, int K, std::vector<double>* scale) {
    std::vector<double> u(std::size_t(L) * C);
    scale->assign(u.size(), 0.0);
    for (int t = 0; t < L; ++t)
        for (int c = 0; c < C; ++c) {
            double s = bias[c], mag = std::fabs(s);
            for (int k = 0; k < K; ++k) {
                const int src = t - (K - 1) + k;
                if (src < 0) continue;
                s += w[std::size_t(c) * K + k] * x[std::size_t(src) * C + c];
                mag += std::fabs(w[std::size_t(c) * K + k] * x[std::size_t(src) * C + c]);
            }
            u[std::size_t(t) * C + c] = s / (1 + std::exp(-s));
            (*scale)[std::size_t(t) * C + c] = 1.2 * mag;
        }
    return u;
}

/// causal_conv over L = sum(pieces) tokens of x inside rows of C + ldx_pad floats (like the x half of in_proj's
/// output), one call per piece continuing the state: every u within the bound of the full-sequence definition, the
/// state afterwards the last K-1 inputs exactly.
template <class B>
void run_causal_pieces(int C, int K, DType dt, int ldx_pad, const std::vector<int>& pieces, std::uint32_t seed) {
    int L = 0;
    for (int len : pieces) L += len;
    CAPTURE(C); CAPTURE(K); CAPTURE(dtype_name(dt)); CAPTURE(ldx_pad); CAPTURE(L);
    const auto x = random_vec(std::size_t(L) * C, seed);
    const auto bias = random_vec(C, seed + 1);
    const HostWeights w = make_weights(std::size_t(C) * K, dt, seed + 2);
    std::vector<double> scale;
    const auto ref = ref_causal(x, L, C, w.value, bias, K, &scale);
    const int ldx = C + ldx_pad;
    std::vector<float> xs(std::size_t(L) * ldx, 1e6f);  // the padding would show in u if read
    for (int t = 0; t < L; ++t)
        for (int c = 0; c < C; ++c) xs[std::size_t(t) * ldx + c] = x[std::size_t(t) * C + c];
    Dev<float, B> dx(xs), db(bias), dst(std::size_t(K - 1) * C), du(std::size_t(L) * C);
    DevWeights<B> dw(w);
    std::vector<float> cpu_state(std::size_t(K - 1) * C, 0.f), cpu_u(std::size_t(L) * C);
    CausalConvParams p;
    p.ld_x = ldx; p.w = dw.ref(); p.bias = db.ptr(); p.state = dst.ptr(); p.channels = C; p.kernel = K;
    int t0 = 0;
    for (int len : pieces) {
        p.x = dx.ptr() + std::size_t(t0) * ldx;
        p.u = du.ptr() + std::size_t(t0) * C;
        p.length = len;
        Ops<B>::causal_conv(p);
        if constexpr (!kIsCpu<B>) {
            CausalConvParams q = p;
            q.x = xs.data() + std::size_t(t0) * ldx; q.w = w.ref(); q.bias = bias.data(); q.state = cpu_state.data();
            q.u = cpu_u.data() + std::size_t(t0) * C;
            Ops<Cpu>::causal_conv(q);
        }
        t0 += len;
    }
    const auto got = du.host(std::size_t(L) * C);
    check_all(got, ref, scale, 2e-6, "causal_conv pieces");
    // The state holds the last K-1 inputs.
    const auto st = dst.host(std::size_t(K - 1) * C);
    std::size_t wrong = 0;
    for (int j = 0; j < K - 1; ++j)
        for (int c = 0; c < C; ++c) wrong += st[std::size_t(j) * C + c] != x[std::size_t(L - (K - 1) + j) * C + c];
    CHECK(wrong == 0);
    if constexpr (!kIsCpu<B>) {
        check_elementwise(got, cpu_u, 4e-6, 1e-6, "causal_conv u vs cpu");
        CHECK(bit_mismatches(st, cpu_state) == 0);
    }
}

struct ScanRef {
    std::vector<double> y, scale, state;
};
/// The selective scan recurrence in double from a zero state over L tokens. B/C rows of ldbc floats, z rows of ldz.
ScanRef ref_scan(int L, int C, int S, const std::vector<float>& u, const std::vector<float>& dt, const std::vector<float>& A,
                 const float* Bm, const float* Cm, int ldbc, const std::vector<float>& D, const float* z, int ldz) {
    ScanRef r{std::vector<double>(std::size_t(L) * C), std::vector<double>(std::size_t(L) * C), std::vector<double>(std::size_t(C) * S, 0.0)};
    std::vector<double>& s = r.state;
    std::vector<double> smag(std::size_t(C) * S, 0.0);
    for (int t = 0; t < L; ++t)
        for (int c = 0; c < C; ++c) {
            double acc = 0, mag = 0;
            const double dtv = dt[std::size_t(t) * C + c], uv = u[std::size_t(t) * C + c];
            for (int n = 0; n < S; ++n) {
                const double a = std::exp(dtv * A[std::size_t(c) * S + n]);
                const double bu = dtv * Bm[std::size_t(t) * ldbc + n] * uv;
                double& sv = s[std::size_t(c) * S + n];
                double& sm = smag[std::size_t(c) * S + n];
                sv = a * sv + bu;
                sm = a * sm + std::fabs(bu);
                acc += sv * Cm[std::size_t(t) * ldbc + n];
                mag += sm * std::fabs(Cm[std::size_t(t) * ldbc + n]);
            }
            const double zz = z[std::size_t(t) * ldz + c];
            const double g = zz / (1 + std::exp(-zz));
            r.y[std::size_t(t) * C + c] = (acc + D[c] * uv) * g;
            r.scale[std::size_t(t) * C + c] = (mag + std::fabs(D[c] * uv)) * std::fabs(g) + std::fabs(r.y[std::size_t(t) * C + c]);
        }
    return r;
}

/// Layout of one scan test: B and C as two views into one [L, ldbc] buffer (B at b_off, C at b_off + d_state, like
/// x_proj's [dt_low | B | C] rows), z inside rows of ldz floats at z_off (like the z half of in_proj's output).
struct ScanCase {
    int d_state, channels, ldbc, b_off, ldz, z_off;
    std::vector<int> chunks;
    float a_lo, a_hi;  // A = -exp(U(a_lo, a_hi))
    bool dt_softplus = false;  // dt given before softplus (dt_proj's raw output), the scan applies it
};

/// selective_scan fed in `chunks`, continuing from the state: y within the bound of the recurrence in double, the
/// final state within 1e-5 (max-norm) of it; off the CPU, y and state within 1e-5 of Ops<Cpu> too.
template <class B>
void run_scan_chunks(const ScanCase& k, std::uint32_t seed) {
    const int S = k.d_state, C = k.channels;
    int L = 0;
    for (int len : k.chunks) L += len;
    CAPTURE(S); CAPTURE(C); CAPTURE(L); CAPTURE(k.ldbc); CAPTURE(k.ldz);
    const auto u = random_vec(std::size_t(L) * C, seed + 1);
    // Raw dt around Mamba's range (softplus(-7) = 1e-3, softplus(1) = 1.3) when the scan applies the softplus, with
    // the threshold's neighbourhood and far tails at a few places.
    auto dt = k.dt_softplus ? random_vec(std::size_t(L) * C, seed + 2, -7.f, 1.f) : random_vec(std::size_t(L) * C, seed + 2, 0.001f, 0.5f);
    if (k.dt_softplus)
        for (float v : {19.9f, 20.f, 20.1f, -25.f, -90.f})
            if (dt.size() > 1) dt[std::size_t(std::abs(v) * 7) % dt.size()] = v;
    std::vector<float> dt_eff = dt;
    if (k.dt_softplus)
        for (auto& v : dt_eff) v = v > 20.f ? v : float(std::log1p(std::exp(double(v))));
    auto A = random_vec(std::size_t(C) * S, seed + 3, k.a_lo, k.a_hi);
    for (auto& a : A) a = -std::exp(a);
    const auto bc = random_vec(std::size_t(L) * k.ldbc, seed + 4);
    const auto D = random_vec(C, seed + 5);
    const auto z = random_vec(std::size_t(L) * k.ldz, seed + 6, -3.f, 3.f);
    const auto ref = ref_scan(L, C, S, u, dt_eff, A, bc.data() + k.b_off, bc.data() + k.b_off + S, k.ldbc, D, z.data() + k.z_off, k.ldz);
    Dev<float, B> du(u), ddt(dt), dA(A), dbc(bc), dD(D), dz(z), dstate(std::size_t(C) * S), dy(std::size_t(L) * C);
    std::vector<float> cpu_state(std::size_t(C) * S, 0.f), cpu_y(std::size_t(L) * C);
    SelectiveScanParams p;
    p.A = dA.ptr(); p.ld_bc = k.ldbc; p.D = dD.ptr(); p.ld_z = k.ldz; p.state = dstate.ptr();
    p.channels = C; p.d_state = S; p.dt_softplus = k.dt_softplus;
    int t0 = 0;
    for (int len : k.chunks) {
        p.u = du.ptr() + std::size_t(t0) * C;
        p.dt = ddt.ptr() + std::size_t(t0) * C;
        p.B = dbc.ptr() + std::size_t(t0) * k.ldbc + k.b_off;
        p.C = dbc.ptr() + std::size_t(t0) * k.ldbc + k.b_off + S;
        p.z = dz.ptr() + std::size_t(t0) * k.ldz + k.z_off;
        p.y = dy.ptr() + std::size_t(t0) * C;
        p.length = len;
        Ops<B>::selective_scan(p);
        if constexpr (!kIsCpu<B>) {
            SelectiveScanParams q = p;
            q.u = u.data() + std::size_t(t0) * C; q.dt = dt.data() + std::size_t(t0) * C; q.A = A.data();
            q.B = bc.data() + std::size_t(t0) * k.ldbc + k.b_off; q.C = q.B + S; q.D = D.data();
            q.z = z.data() + std::size_t(t0) * k.ldz + k.z_off; q.state = cpu_state.data(); q.y = cpu_y.data() + std::size_t(t0) * C;
            Ops<Cpu>::selective_scan(q);
        }
        t0 += len;
    }
    const auto y = dy.host(std::size_t(L) * C), state = dstate.host(std::size_t(C) * S);
    check_all(y, ref.y, ref.scale, 2e-6, "selective_scan");
    CHECK(max_norm_rel(state, ref.state) <= 1e-5);
    if constexpr (!kIsCpu<B>) {
        CHECK(max_norm_rel(y, cpu_y) <= 1e-5);
        CHECK(max_norm_rel(state, cpu_state) <= 1e-5);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("causal_conv: prefill and token-by-token steps both match the full-sequence definition", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    for (DType dt : kAllDtypes) {
        // Prefill of 2 rows, then single steps, then a 3-row chunk; rows 3 floats longer than the channels.
        for (int C : {1, 7, 256}) run_causal_pieces<B>(C, 4, dt, 3, {2, 1, 1, 1, 1, 3}, std::uint32_t(11 + C));
        // x the first half of a wider in_proj row; prefill, then steps (2 < K-1 exercises the history shift).
        run_causal_pieces<B>(37, 4, dt, 37 + 3, {7, 1, 2, 1, 5}, 63);
    }
}

TEST_CASE_TEMPLATE("selective_scan matches the recurrence, split into chunks or not", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    for (int S : {1, 5, 16, 37})
        for (int C : {3, 256}) run_scan_chunks<B>({S, C, 2 * S + 3, 0, C + 5, 0, {3, 1, 3}, 0.f, 3.f}, std::uint32_t(S + C));
    // As in Mamba: B and C after the 5 dt_low columns of x_proj's rows, z the second half of in_proj's rows; a
    // prefill, a step, a chunk; A in [-2, -0.1] (d_state 40: above one 32-lane pass of the CUDA scan).
    for (int N : {16, 40}) run_scan_chunks<B>({N, 37, 5 + 2 * N, 5, 2 * 37, 37, {6, 1, 3}, -2.3026f, 0.6931f}, std::uint32_t(70 + N));
}

TEST_CASE_TEMPLATE("selective_scan with dt_softplus matches the recurrence on softplus(dt)", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    // 256 and 37 channels: the vector blocks (16 / 8 channels) and the per-channel remainder; d_state 16 and 5.
    for (int C : {256, 37})
        for (int S : {16, 5})
            run_scan_chunks<B>({S, C, 8 + 2 * S, 8, 2 * C, C, {4, 1, 2}, -2.3026f, 2.7726f, true}, std::uint32_t(90 + C + S));
}

TEST_CASE_TEMPLATE("causal_conv: kernel sizes 1-5, channels around the vector width, vs the full-sequence definition", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    // K = 4 takes the transposed-weight-block path of the vector code, other K the gathered one; C = 13 and 37
    // leave 5 channels to the scalar loop after 1 or 2 blocks of 8 (AVX2) / 0 or 2 blocks of 16 (AVX-512).
    for (int K : {1, 2, 3, 4, 5})
        for (int C : {13, 37}) {
            const int L = 6;
            CAPTURE(K); CAPTURE(C);
            const auto x = random_vec(std::size_t(L) * C, 71 + C + K);
            const auto bias = random_vec(C, 72 + C + K);
            const HostWeights w = make_weights(std::size_t(C) * K, DType::F32, 73 + C + K);
            std::vector<double> scale;
            const auto ref = ref_causal(x, L, C, w.value, bias, K, &scale);
            Dev<float, B> dx(x), db(bias), dst(std::size_t(std::max(K - 1, 1)) * C), du(std::size_t(L) * C);
            DevWeights<B> dw(w);
            CausalConvParams p;
            p.w = dw.ref(); p.bias = db.ptr(); p.state = K > 1 ? dst.ptr() : nullptr; p.channels = C; p.kernel = K;
            int t0 = 0;
            for (int len : {1, 3, 2}) {  // a step, a chunk, a chunk
                p.x = dx.ptr() + std::size_t(t0) * C;
                p.u = du.ptr() + std::size_t(t0) * C;
                p.length = len;
                Ops<B>::causal_conv(p);
                t0 += len;
            }
            REQUIRE(t0 == L);
            check_all(du.host(std::size_t(L) * C), ref, scale, 2e-6, "causal_conv");
        }
}

TEST_CASE_TEMPLATE("selective_scan: d_state 5, 8, 16, 17, lengths 1-5, channels not a multiple of the vector width", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    // C = 13 and 37: whole 8/16-channel blocks (d_state 16) plus 5 channels on the per-channel path. Each channel
    // is also scanned alone (C = 1, always the per-channel path): its state must come out with the same bits, since
    // both paths update a state element with the same operations (the gate may differ in the last ulp: vector vs
    // scalar SiLU).
    // With dt_softplus the same holds for the softplus of dt (the raw dt then sit in [0.001, 0.5]).
    for (bool dt_softplus : {false, true})
        for (int S : {5, 8, 16, 17})
            for (int C : {13, 37})
                for (int L = 1; L <= 5; ++L) {
                    CAPTURE(S); CAPTURE(C); CAPTURE(L); CAPTURE(dt_softplus);
                    const std::uint32_t seed = std::uint32_t(100 * S + 10 * C + L);
                    const int ldbc = 2 * S, ldz = C;
                    const auto u = random_vec(std::size_t(L) * C, seed + 1);
                    const auto dt = random_vec(std::size_t(L) * C, seed + 2, 0.001f, 0.5f);
                    auto A = random_vec(std::size_t(C) * S, seed + 3, 0.f, 3.f);
                    for (auto& a : A) a = -std::exp(a);
                    const auto bc = random_vec(std::size_t(L) * ldbc, seed + 4);
                    std::vector<float> Bm(bc), Cm(std::size_t(L) * ldbc);
                    for (int t = 0; t < L; ++t)
                        for (int n = 0; n < S; ++n) Cm[std::size_t(t) * ldbc + n] = bc[std::size_t(t) * ldbc + S + n];
                    const auto D = random_vec(C, seed + 5);
                    const auto z = random_vec(std::size_t(L) * ldz, seed + 6, -3.f, 3.f);
                    std::vector<float> dt_eff = dt;
                    if (dt_softplus)
                        for (auto& v : dt_eff) v = float(std::log1p(std::exp(double(v))));
                    const auto ref = ref_scan(L, C, S, u, dt_eff, A, Bm.data(), Cm.data(), ldbc, D, z.data(), ldz);
                    Dev<float, B> du(u), ddt(dt), dA(A), dbc(bc), dD(D), dz(z), dstate(std::size_t(C) * S), dy(std::size_t(L) * C);
                    SelectiveScanParams p;
                    p.u = du.ptr(); p.dt = ddt.ptr(); p.A = dA.ptr(); p.B = dbc.ptr(); p.C = dbc.ptr() + S; p.ld_bc = ldbc;
                    p.D = dD.ptr(); p.z = dz.ptr(); p.ld_z = ldz; p.state = dstate.ptr(); p.y = dy.ptr();
                    p.length = L; p.channels = C; p.d_state = S; p.dt_softplus = dt_softplus;
                    Ops<B>::selective_scan(p);
                    check_all(dy.host(std::size_t(L) * C), ref.y, ref.scale, 2e-6, "selective_scan");
                    const auto state = dstate.host(std::size_t(C) * S);
                    std::size_t state_mismatch = 0;
                    for (int c = 0; c < C; ++c) {
                        std::vector<float> u1(L), dt1(L), z1(L);
                        for (int t = 0; t < L; ++t) {
                            u1[t] = u[std::size_t(t) * C + c];
                            dt1[t] = dt[std::size_t(t) * C + c];
                            z1[t] = z[std::size_t(t) * ldz + c];
                        }
                        const std::vector<float> A1(A.begin() + std::ptrdiff_t(c) * S, A.begin() + std::ptrdiff_t(c + 1) * S), D1{D[c]};
                        Dev<float, B> du1(u1), ddt1(dt1), dA1(A1), dD1(D1), dz1(z1), ds1{std::size_t(S)}, dy1{std::size_t(L)};
                        SelectiveScanParams q = p;
                        q.u = du1.ptr(); q.dt = ddt1.ptr(); q.A = dA1.ptr(); q.D = dD1.ptr(); q.z = dz1.ptr(); q.ld_z = 1;
                        q.state = ds1.ptr(); q.y = dy1.ptr(); q.channels = 1;
                        Ops<B>::selective_scan(q);
                        const auto s1 = ds1.host(std::size_t(S));
                        state_mismatch += std::size_t(std::memcmp(s1.data(), state.data() + std::size_t(c) * S, std::size_t(S) * sizeof(float)) != 0);
                    }
                    CHECK(state_mismatch == 0);
                    // y_from: rows from y_from on and the final state keep the bits of the full run.
                    const auto y_full = dy.host(std::size_t(L) * C);
                    for (int y_from = 1; y_from <= L; ++y_from) {
                        CAPTURE(y_from);
                        Dev<float, B> ds2{std::size_t(C) * S}, dy2(std::vector<float>(std::size_t(L) * C, -7.f));
                        SelectiveScanParams q = p;
                        q.state = ds2.ptr(); q.y = dy2.ptr(); q.y_from = y_from;
                        Ops<B>::selective_scan(q);
                        const auto y2 = dy2.host(std::size_t(L) * C);
                        const std::size_t off = std::size_t(y_from) * C;
                        CHECK(std::memcmp(y2.data() + off, y_full.data() + off, (y_full.size() - off) * sizeof(float)) == 0);
                        CHECK(std::memcmp(ds2.host(std::size_t(C) * S).data(), state.data(), state.size() * sizeof(float)) == 0);
                    }
                }
}

TEST_CASE_TEMPLATE("causal_conv and selective_scan reject bad sizes, strides and null pointers with the shared message" *
                       doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(256);
    float* d = buf.ptr();
    CausalConvParams c;
    c.x = d; c.w = {d + 64, DType::F32}; c.bias = d + 96; c.state = d + 128; c.u = d + 192; c.length = 2; c.channels = 8; c.kernel = 4;
    c.ld_x = 7;
    CHECK_THROWS_WITH_AS(Ops<B>::causal_conv(c), "flowedge: causal_conv: x row stride shorter than channels (expected 0 or >= 8, got 7)", Error);
    c.ld_x = 0;
    c.kernel = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::causal_conv(c),
                         "flowedge: causal_conv: sizes must be positive (expected length >= 0, channels > 0, kernel > 0, got length 2, "
                         "channels 8, kernel 0)",
                         Error);
    c.kernel = 4;
    c.w.dtype = static_cast<DType>(4);
    CHECK_THROWS_WITH_AS(Ops<B>::causal_conv(c), "flowedge: causal_conv: unknown weight dtype (expected F32, BF16 or F16, got 4)", Error);
    c.w.dtype = DType::F32;
    c.state = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::causal_conv(c), "flowedge: causal_conv: null x, w, u or state pointer", Error);

    SelectiveScanParams s;
    s.u = d; s.dt = d; s.A = d; s.B = d; s.C = d; s.D = d; s.z = d; s.state = d + 128; s.y = d + 192;
    s.length = 2; s.channels = 4; s.d_state = 8;
    s.ld_bc = 7;
    CHECK_THROWS_WITH_AS(Ops<B>::selective_scan(s), "flowedge: selective_scan: B/C row stride shorter than d_state (expected 0 or >= 8, got 7)",
                         Error);
    s.ld_bc = 0;
    s.ld_z = 3;
    CHECK_THROWS_WITH_AS(Ops<B>::selective_scan(s), "flowedge: selective_scan: z row stride shorter than channels (expected 0 or >= 4, got 3)",
                         Error);
    s.ld_z = 0;
    s.d_state = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::selective_scan(s),
                         "flowedge: selective_scan: sizes must be positive (expected length >= 0, channels > 0, d_state > 0, got length 2, "
                         "channels 4, d_state 0)",
                         Error);
    s.d_state = 8;
    s.z = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::selective_scan(s), "flowedge: selective_scan: null u, dt, A, B, C, z, state or y pointer", Error);
    Memory<B>::synchronize();
}

#if defined(FLOWEDGE_CPU_X86)
// The AVX2 set's scan forms (kernels/mamba.hpp) against double on the grids of docs/numerics.md#vector-math-functions:
// the decays exp(dt A) for dt in [0.001, 2], -A in [0.08, 12]; softplus over [-30, 30]; SiLU over [-80, 80]. The
// measuring code is compiled for AVX2 (as the kernel set is) and runs only where the CPU has it.
namespace {
struct ScanMathErrors {
    double decay_abs = 0, softplus_rel = 0, silu_rel = 0;
    float softplus_special[8], exp2_special[8], silu_special[8];
};
const float kScanSpecial[8] = {NAN, INFINITY, -INFINITY, -200.f, 0.f, -0.f, 1e-30f, -1e-30f};
FLOWEDGE_TARGET_AVX2_PUSH
template <class F>
void apply8(F f, const float* in, float* out) {
    __m256 v[1] = {_mm256_loadu_ps(in)};
    f(v);
    _mm256_storeu_ps(out, v[0]);
}
ScanMathErrors avx2_scan_math_errors() {
    namespace k = flowedge::cpu::avx2;
    ScanMathErrors e;
    auto exp2 = [](__m256(&v)[1]) { k::scan_exp2_nonpositive(v); };
    auto softplus = [](__m256(&v)[1]) { k::scan_softplus(v); };
    auto silu = [](__m256(&v)[1]) { k::scan_silu(v); };
    float in[8], out[8];
    for (int i = 0; i < 500; ++i)
        for (int j = 0; j < 1000; j += 8) {
            const float dt = 0.001f + (2.f - 0.001f) * float(i) / 499.f;
            float a[8];
            for (int l = 0; l < 8; ++l) {
                a[l] = -(0.08f + (12.f - 0.08f) * float(j + l) / 999.f);
                in[l] = dt * 1.44269504088896341f * a[l];
            }
            apply8(exp2, in, out);
            for (int l = 0; l < 8; ++l) e.decay_abs = std::max(e.decay_abs, std::fabs(out[l] - std::exp(double(dt) * a[l])));
        }
    for (int i = 0; i < 80000; i += 8) {
        for (int l = 0; l < 8; ++l) in[l] = -30.f + 60.f * float(i + l) / 79999.f;
        apply8(softplus, in, out);
        for (int l = 0; l < 8; ++l) {
            const double ref = in[l] > 20 ? in[l] : std::log1p(std::exp(double(in[l])));
            e.softplus_rel = std::max(e.softplus_rel, std::fabs(out[l] - ref) / ref);
        }
        for (int l = 0; l < 8; ++l) in[l] = -80.f + 160.f * float(i + l) / 79999.f;
        apply8(silu, in, out);
        for (int l = 0; l < 8; ++l) {
            const double ref = in[l] / (1 + std::exp(-double(in[l])));
            if (ref != 0) e.silu_rel = std::max(e.silu_rel, std::fabs(out[l] - ref) / std::fabs(ref));
        }
    }
    apply8(softplus, kScanSpecial, e.softplus_special);
    apply8(exp2, kScanSpecial, e.exp2_special);
    apply8(silu, kScanSpecial, e.silu_special);
    return e;
}
FLOWEDGE_TARGET_POP
}  // namespace

TEST_CASE("AVX2 selective_scan math (decay, softplus, gate SiLU) within its stated bounds of double") {
    if (!flowedge::cpu::detect_cpu_features().avx2) {
        MESSAGE("no AVX2 on this CPU: skipped");
        return;
    }
    const ScanMathErrors e = avx2_scan_math_errors();
    const double ulp = std::ldexp(1.0, -24);
    MESSAGE("decay abs " << e.decay_abs / ulp << " 2^-24, softplus rel " << e.softplus_rel / ulp << " 2^-24, silu rel "
                         << e.silu_rel / ulp << " 2^-24");
    CHECK(e.decay_abs <= 2.5 * ulp);
    CHECK(e.softplus_rel <= 4 * ulp);
    CHECK(e.silu_rel <= 3 * ulp);
    // NaN stays NaN; the clamps' limits: softplus(+inf) = inf, softplus(-inf) = exp(-86), a decay never below 2^-125.
    CHECK(std::isnan(e.softplus_special[0]));
    CHECK(e.softplus_special[1] == INFINITY);
    CHECK(e.softplus_special[2] == doctest::Approx(std::exp(-86.0)).epsilon(1e-6));
    CHECK(e.softplus_special[4] == doctest::Approx(std::log(2.0)).epsilon(1e-7));
    CHECK(std::isnan(e.exp2_special[0]));
    CHECK(e.exp2_special[3] == std::ldexp(1.f, -125));
    CHECK(e.exp2_special[4] == 1.f);
    CHECK(std::isnan(e.silu_special[0]));
    CHECK(e.silu_special[1] == INFINITY);
}
#endif
