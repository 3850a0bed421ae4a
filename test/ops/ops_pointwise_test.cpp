// Norms, activations, elementwise, Mamba conv/scan, scheduler step and un-normalisation on every backend
// vs naive double-precision loops written from the PyTorch/SPEC definitions.
#include "ops_test_util.hpp"

#include <algorithm>
#include <cfloat>
#include <cstddef>
#include <initializer_list>

#include "flowedge/noise.hpp"

using namespace optest;

TEST_CASE_TEMPLATE("group_norm with fused act -> FiLM -> residual matches a naive loop", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    struct Case { int batch, channels, length, groups; Activation act; bool film, residual, affine; int film_pad; };
    const Case cases[] = {
        {1, 1, 1, 1, Activation::None, false, false, true, 0},
        {2, 8, 16, 8, Activation::Mish, true, true, true, 0},
        {3, 12, 7, 3, Activation::Silu, true, false, true, 5},
        {1, 37, 3, 1, Activation::None, false, true, false, 0},
        {2, 64, 4, 8, Activation::Mish, false, false, true, 0},
        {1, 16, 129, 4, Activation::Softplus, true, true, true, 1},
    };
    std::uint32_t seed = 3000;
    for (const auto& k : cases) {
        CAPTURE(k.channels); CAPTURE(k.length); CAPTURE(k.groups);
        const std::size_t n = std::size_t(k.batch) * k.channels * k.length;
        auto x = random_vec(n, seed++, -2.f, 3.f);
        for (auto& v : x) v += 5.f;  // a large mean: the normalisation must not lose precision to it
        const auto gamma = random_vec(k.channels, seed++, 0.5f, 1.5f);
        const auto beta = random_vec(k.channels, seed++);
        const int fstride = 2 * k.channels + k.film_pad;
        const auto film = random_vec(std::size_t(k.batch) * fstride, seed++);
        const auto res = random_vec(n, seed++);
        std::vector<double> ref(n), scale(n);
        const int cpg = k.channels / k.groups;
        for (int b = 0; b < k.batch; ++b)
            for (int g = 0; g < k.groups; ++g) {
                double sum = 0, ss = 0;
                const std::size_t base = (std::size_t(b) * k.channels + std::size_t(g) * cpg) * k.length;
                const std::size_t m = std::size_t(cpg) * k.length;
                for (std::size_t i = 0; i < m; ++i) sum += x[base + i];
                const double mean = sum / m;
                for (std::size_t i = 0; i < m; ++i) ss += (x[base + i] - mean) * (x[base + i] - mean);
                const double rstd = 1 / std::sqrt(ss / m + 1e-5);
                for (int cc = 0; cc < cpg; ++cc)
                    for (int t = 0; t < k.length; ++t) {
                        const int c = g * cpg + cc;
                        const std::size_t i = base + std::size_t(cc) * k.length + t;
                        const double gm = k.affine ? gamma[c] : 1.0, bt = k.affine ? beta[c] : 0.0;
                        const double nrm = (x[i] - mean) * rstd;
                        double a = ref_act(k.act, nrm * gm + bt);
                        double sc = std::fabs(nrm * gm) + std::fabs(bt) + std::fabs(a);
                        if (k.film) {
                            const double fs = film[std::size_t(b) * fstride + c], fb = film[std::size_t(b) * fstride + k.channels + c];
                            a = fs * a + fb;
                            sc = sc * std::fabs(fs) + std::fabs(fb);
                        }
                        if (k.residual) {
                            a += res[i];
                            sc += std::fabs(res[i]);
                        }
                        ref[i] = a;
                        scale[i] = sc + 1.0;  // normalised values are O(1): absolute floor
                    }
            }
        Dev<float, B> dx(x), dg(gamma), dbt(beta), df(film), dr(res), dy(n);
        GroupNormParams p;
        p.x = dx.ptr();
        p.gamma = k.affine ? dg.ptr() : nullptr;
        p.beta = k.affine ? dbt.ptr() : nullptr;
        p.y = dy.ptr();
        p.batch = k.batch; p.channels = k.channels; p.length = k.length; p.groups = k.groups;
        p.act = k.act;
        p.film = k.film ? df.ptr() : nullptr;
        p.film_stride = k.film_pad ? fstride : 0;
        p.residual = k.residual ? dr.ptr() : nullptr;
        Ops<B>::group_norm(p);
        check_all(dy.host(n), ref, scale, 2e-6, "group_norm");
        // In place (y == x) gives the same result.
        Ops<B>::group_norm([&] { auto q = p; q.y = dx.ptr(); return q; }());
        check_all(dx.host(n), ref, scale, 2e-6, "group_norm in place");
    }
}

TEST_CASE_TEMPLATE("rms_norm matches a naive loop", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    for (int dim : {1, 3, 37, 128, 129}) {
        const int rows = 5;
        const auto x = random_vec(std::size_t(rows) * dim, 40 + dim, -3.f, 3.f);
        const auto w = random_vec(dim, 41 + dim);
        std::vector<double> ref(x.size()), scale(x.size());
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
            const double inv = 1 / std::sqrt(ss / dim + 1e-5);
            for (int i = 0; i < dim; ++i) {
                ref[r * dim + i] = x[r * dim + i] * inv * w[i];
                scale[r * dim + i] = std::fabs(ref[r * dim + i]);
            }
        }
        Dev<float, B> dx(x), dw(w), dy(x.size());
        RmsNormParams p;
        p.x = dx.ptr(); p.weight = dw.ptr(); p.y = dy.ptr(); p.rows = rows; p.dim = dim;
        Ops<B>::rms_norm(p);
        check_all(dy.host(x.size()), ref, scale, 2e-6, "rms_norm");
    }
}

TEST_CASE_TEMPLATE("activation: SiLU, Mish, Softplus (threshold 20) over a wide range", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    std::vector<float> x;
    for (float v = -90.f; v <= 90.f; v += 0.37f) x.push_back(v);
    for (float v : {0.f, -0.f, 19.999f, 20.f, 20.0001f, 25.f, -20.f, 1e-6f, -1e-6f}) x.push_back(v);
    for (Activation a : {Activation::None, Activation::Silu, Activation::Mish, Activation::Softplus}) {
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

TEST_CASE_TEMPLATE("axpby, concat_channels, unnormalize, embedding", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    SUBCASE("axpby with aliasing and a null y") {
        const std::size_t n = 37;
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
        check_all(dout.host(n), ref, sc, 2e-7, "axpby");
        p.out = dy.ptr();  // out aliases y
        Ops<B>::axpby(p);
        check_all(dy.host(n), ref, sc, 2e-7, "axpby out=y");
        p.y = nullptr; p.b = 0.f; p.out = dx.ptr();  // scale in place
        Ops<B>::axpby(p);
        for (std::size_t i = 0; i < n; ++i) ref[i] = 0.75 * x[i], sc[i] = std::fabs(ref[i]);
        check_all(dx.host(n), ref, sc, 2e-7, "axpby null y");
    }
    SUBCASE("concat_channels") {
        const int batch = 3, ca = 5, cb = 7, L = 4;
        const auto a = random_vec(std::size_t(batch) * ca * L, 7), b = random_vec(std::size_t(batch) * cb * L, 8);
        Dev<float, B> da(a), db(b), dy(std::size_t(batch) * (ca + cb) * L);
        ConcatParams p;
        p.a = da.ptr(); p.b = db.ptr(); p.y = dy.ptr(); p.batch = batch; p.ca = ca; p.cb = cb; p.length = L;
        Ops<B>::concat_channels(p);
        const auto y = dy.host(std::size_t(batch) * (ca + cb) * L);
        for (int bb = 0; bb < batch; ++bb)
            for (int c = 0; c < ca + cb; ++c)
                for (int t = 0; t < L; ++t) {
                    const float want = c < ca ? a[(std::size_t(bb) * ca + c) * L + t] : b[(std::size_t(bb) * cb + c - ca) * L + t];
                    REQUIRE(y[(std::size_t(bb) * (ca + cb) + c) * L + t] == want);
                }
    }
    SUBCASE("unnormalize") {
        const int rows = 7, dim = 3;
        const auto x = random_vec(rows * dim, 9);
        const std::vector<float> mn{-1.f, 10.f, 0.5f}, mx{3.f, 510.f, 0.75f};
        Dev<float, B> dx(x), dmn(mn), dmx(mx), dy(rows * dim);
        UnnormalizeParams p;
        p.x = dx.ptr(); p.y = dy.ptr(); p.min = dmn.ptr(); p.max = dmx.ptr(); p.rows = rows; p.dim = dim;
        Ops<B>::unnormalize(p);
        std::vector<double> ref(rows * dim), sc(rows * dim);
        for (int r = 0; r < rows; ++r)
            for (int d = 0; d < dim; ++d) {
                ref[r * dim + d] = (x[r * dim + d] + 1.0) / 2.0 * (mx[d] - mn[d]) + mn[d];
                sc[r * dim + d] = std::fabs(mx[d]) + std::fabs(mn[d]);
            }
        check_all(dy.host(rows * dim), ref, sc, 4e-7, "unnormalize");
    }
    SUBCASE("embedding in every dtype") {
        for (DType dt : kAllDtypes) {
            const int vocab = 11, dim = 37;
            const HostWeights t = make_weights(std::size_t(vocab) * dim, dt, 77);
            const std::vector<std::int32_t> ids{3, 0, 10, 3, 7};
            Dev<std::int32_t, B> di(ids);
            DevWeights<B> dtab(t);
            Dev<float, B> dy(ids.size() * dim);
            EmbeddingParams p;
            p.ids = di.ptr(); p.table = dtab.ref(); p.y = dy.ptr(); p.rows = int(ids.size()); p.dim = dim;
            Ops<B>::embedding(p);
            const auto y = dy.host(ids.size() * dim);
            for (std::size_t r = 0; r < ids.size(); ++r)
                for (int i = 0; i < dim; ++i) REQUIRE(double(y[r * dim + i]) == t.value[std::size_t(ids[r]) * dim + i]);
        }
    }
}

TEST_CASE_TEMPLATE("sinusoid follows the float32 recipe of LeRobot's SinusoidalPosEmb", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    for (float t : {0.f, 1.f, 37.f, 99.f}) {
        const int half = 64, rows = 3;
        Dev<float, B> d(std::size_t(rows) * 2 * half);
        SinusoidParams p;
        p.t = t; p.out = d.ptr(); p.rows = rows; p.half = half; p.denom = float(half - 1);
        Ops<B>::sinusoid(p);
        const auto y = d.host(std::size_t(rows) * 2 * half);
        for (int r = 0; r < rows; ++r)
            for (int i = 0; i < half; ++i) {
                // exact f_i = 10000^(-i/63); the float32 recipe rounds t*f_i, so allow |t*f| * 1e-6 + 1e-6 absolute
                const double f = std::pow(10000.0, -double(i) / (half - 1));
                const double tol = std::fabs(t * f) * 1e-6 + 1e-6;
                CHECK(std::fabs(y[std::size_t(r) * 2 * half + i] - std::sin(t * f)) <= tol);
                CHECK(std::fabs(y[std::size_t(r) * 2 * half + half + i] - std::cos(t * f)) <= tol);
            }
    }
}

namespace {
// Naive causal depthwise conv over a full sequence with zero history (SPEC 1.1 step 3).
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
}  // namespace

TEST_CASE_TEMPLATE("causal_conv: prefill and token-by-token steps both match the full-sequence definition", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    for (DType dt : kAllDtypes)
        for (int C : {1, 7, 256}) {
            const int K = 4, L = 9, ldx_pad = 3;
            CAPTURE(C); CAPTURE(dtype_name(dt));
            const auto x = random_vec(std::size_t(L) * C, 11 + C);
            const auto bias = random_vec(C, 12 + C);
            const HostWeights w = make_weights(std::size_t(C) * K, dt, 13 + C);
            std::vector<double> scale;
            const auto ref = ref_causal(x, L, C, w.value, bias, K, &scale);
            // Strided input (x inside a wider row, like the x half of in_proj's output).
            const int ldx = C + ldx_pad;
            std::vector<float> xs(std::size_t(L) * ldx, 1e6f);
            for (int t = 0; t < L; ++t)
                for (int c = 0; c < C; ++c) xs[std::size_t(t) * ldx + c] = x[std::size_t(t) * C + c];
            Dev<float, B> dx(xs), db(bias), dst(std::size_t(K - 1) * C), du(std::size_t(L) * C);
            DevWeights<B> dw(w);
            CausalConvParams p;
            p.ld_x = ldx; p.w = dw.ref(); p.bias = db.ptr(); p.state = dst.ptr(); p.channels = C; p.kernel = K;
            // (a) prefill of 2 rows, then single steps, then a 3-row chunk.
            const int pieces[] = {2, 1, 1, 1, 1, 3};
            int t0 = 0;
            for (int len : pieces) {
                p.x = dx.ptr() + std::size_t(t0) * ldx;
                p.u = du.ptr() + std::size_t(t0) * C;
                p.length = len;
                Ops<B>::causal_conv(p);
                t0 += len;
            }
            REQUIRE(t0 == L);
            check_all(du.host(std::size_t(L) * C), ref, scale, 2e-6, "causal_conv pieces");
            // The state holds the last K-1 inputs.
            const auto st = dst.host(std::size_t(K - 1) * C);
            for (int j = 0; j < K - 1; ++j)
                for (int c = 0; c < C; ++c) REQUIRE(st[std::size_t(j) * C + c] == x[std::size_t(L - (K - 1) + j) * C + c]);
        }
}

namespace {
struct ScanRef {
    std::vector<double> y, scale;
};
ScanRef ref_scan(int L, int C, int S, const std::vector<float>& u, const std::vector<float>& dt, const std::vector<float>& A,
                 const std::vector<float>& Bm, const std::vector<float>& Cm, int ldbc, const std::vector<float>& D,
                 const std::vector<float>& z, int ldz) {
    ScanRef r{std::vector<double>(std::size_t(L) * C), std::vector<double>(std::size_t(L) * C)};
    std::vector<double> s(std::size_t(C) * S, 0.0), smag(std::size_t(C) * S, 0.0);
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
}  // namespace

TEST_CASE_TEMPLATE("selective_scan matches the recurrence, split into chunks or not", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    for (int S : {1, 5, 16, 37})
        for (int C : {3, 256}) {
            CAPTURE(S); CAPTURE(C);
            const int L = 7, ldbc = 2 * S + 3, ldz = C + 5;
            const auto u = random_vec(std::size_t(L) * C, 1 + S + C);
            const auto dt = random_vec(std::size_t(L) * C, 2 + S + C, 0.001f, 0.5f);
            auto A = random_vec(std::size_t(C) * S, 3 + S + C, 0.f, 3.f);
            for (auto& a : A) a = -std::exp(a);
            const auto bc = random_vec(std::size_t(L) * ldbc, 4 + S + C);
            std::vector<float> Bm(bc), Cm(std::size_t(L) * ldbc);
            for (int t = 0; t < L; ++t)
                for (int n = 0; n < S; ++n) Cm[std::size_t(t) * ldbc + n] = bc[std::size_t(t) * ldbc + S + n];
            const auto D = random_vec(C, 5 + S + C);
            const auto z = random_vec(std::size_t(L) * ldz, 6 + S + C, -3.f, 3.f);
            const auto ref = ref_scan(L, C, S, u, dt, A, Bm, Cm, ldbc, D, z, ldz);
            // B and C as two views into one [L, ldbc] buffer, like x_proj's output.
            Dev<float, B> du(u), ddt(dt), dA(A), dbc(bc), dD(D), dz(z), dstate(std::size_t(C) * S), dy(std::size_t(L) * C);
            SelectiveScanParams p;
            p.A = dA.ptr(); p.ld_bc = ldbc; p.D = dD.ptr(); p.ld_z = ldz; p.state = dstate.ptr();
            p.channels = C; p.d_state = S;
            for (auto [t0, len] : {std::pair{0, 3}, std::pair{3, 1}, std::pair{4, 3}}) {
                p.u = du.ptr() + std::size_t(t0) * C;
                p.dt = ddt.ptr() + std::size_t(t0) * C;
                p.B = dbc.ptr() + std::size_t(t0) * ldbc;
                p.C = dbc.ptr() + std::size_t(t0) * ldbc + S;
                p.z = dz.ptr() + std::size_t(t0) * ldz;
                p.y = dy.ptr() + std::size_t(t0) * C;
                p.length = len;
                Ops<B>::selective_scan(p);
            }
            check_all(dy.host(std::size_t(L) * C), ref.y, ref.scale, 2e-6, "selective_scan");
        }
}

TEST_CASE("SplitMix64 normals match values computed independently") {
    // First raw SplitMix64 output for seed 0 (the reference generator's well-known value).
    CHECK(splitmix64_at(0, 0) == 0xe220a8397b1dcdafull);
    CHECK(splitmix64_at(0, 1) == 0x6e789e6aa1b965f4ull);
    // Values computed once by hand with a separate Python implementation of SPEC 1.4 (stateful SplitMix64,
    // uniform ((u >> 40) + 1) / 16777217, Box-Muller r*cos then r*sin), printed as float32.
    const float seed0[6] = {-0.4527577757835388f, 0.20776602625846863f, 2.6506049633026123f,
                            -0.490423321723938f, -0.9886044859886169f, 1.872101068496704f};
    const float seed7[4] = {1.364992380142212f, 0.1445212960243225f, -0.396524041891098f, -0.22759634256362915f};
    for (int j = 0; j < 6; ++j) CHECK(normal_at(0, std::uint64_t(j)) == seed0[j]);
    for (int j = 0; j < 4; ++j) CHECK(normal_at(7, std::uint64_t(j)) == seed7[j]);
    // fill_normal at any offset equals normal_at draw by draw.
    for (std::uint64_t off : {0ull, 1ull, 5ull}) {
        float buf[7];
        fill_normal(3, off, buf, 7);
        for (std::uint64_t i = 0; i < 7; ++i) CHECK(buf[i] == normal_at(3, off + i));
    }
}

TEST_CASE_TEMPLATE("diffusion_step: DDIM and seeded DDPM updates with clamp", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    const int batch = 2, per = 32;
    const std::size_t n = std::size_t(batch) * per;
    const auto x = random_vec(n, 21, -3.f, 3.f), eps = random_vec(n, 22, -2.f, 2.f);
    const float sab = 0.3f, s1m = std::sqrt(1 - 0.09f), cx0 = 0.6f, coth = 0.7f, nstd = 0.2f;
    for (StepKind kind : {StepKind::Ddim, StepKind::Ddpm})
        for (bool clip : {false, true})
            for (bool use_ptr : {false, true}) {
                CAPTURE(int(kind)); CAPTURE(clip); CAPTURE(use_ptr);
                const std::uint64_t seed = 1234, off = 48;
                std::vector<double> ref(n), sc(n);
                for (int b = 0; b < batch; ++b)
                    for (int i = 0; i < per; ++i) {
                        const std::size_t k = std::size_t(b) * per + i;
                        double x0 = (x[k] - double(s1m) * eps[k]) / sab;
                        if (clip) x0 = std::min(1.0, std::max(-1.0, x0));
                        double v = kind == StepKind::Ddim ? cx0 * x0 + coth * eps[k] : cx0 * x0 + coth * x[k];
                        if (kind == StepKind::Ddpm) v += nstd * double(normal_at(seed + b, off + i));
                        ref[k] = v;
                        sc[k] = std::fabs(cx0 * x0) + 3 * std::fabs(coth * x[k]) + std::fabs(coth * eps[k]) + 1.0;
                    }
                Dev<float, B> dx(x), de(eps);
                Dev<std::uint64_t, B> dseed(std::vector<std::uint64_t>{seed});
                DiffusionStepParams p;
                p.x = dx.ptr(); p.eps = de.ptr(); p.batch = batch; p.per_sample = per; p.kind = kind;
                p.sqrt_abar = sab; p.sqrt_one_minus_abar = s1m; p.clip = clip; p.clip_range = 1.f;
                p.c_x0 = cx0; p.c_other = coth; p.noise_std = kind == StepKind::Ddpm ? nstd : 0.f;
                p.seed = use_ptr ? 999 : seed;  // the pointer wins when set
                p.seed_ptr = use_ptr ? dseed.ptr() : nullptr;
                p.draw_offset = off;
                Ops<B>::diffusion_step(p);
                check_all(dx.host(n), ref, sc, 2e-6, "diffusion_step");
            }
}

TEST_CASE_TEMPLATE("causal_conv: kernel sizes 1-5, channels around the vector width, vs the full-sequence definition", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
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
    // C = 13 and 37: whole 8/16-channel blocks (d_state 16) plus 5 channels on the per-channel path. Each channel
    // is also scanned alone (C = 1, always the per-channel path): its state must come out with the same bits, since
    // both paths update a state element with the same operations (the gate may differ in the last ulp: vector vs
    // scalar SiLU).
    for (int S : {5, 8, 16, 17})
        for (int C : {13, 37})
            for (int L = 1; L <= 5; ++L) {
                CAPTURE(S); CAPTURE(C); CAPTURE(L);
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
                const auto ref = ref_scan(L, C, S, u, dt, A, Bm, Cm, ldbc, D, z, ldz);
                Dev<float, B> du(u), ddt(dt), dA(A), dbc(bc), dD(D), dz(z), dstate(std::size_t(C) * S), dy(std::size_t(L) * C);
                SelectiveScanParams p;
                p.u = du.ptr(); p.dt = ddt.ptr(); p.A = dA.ptr(); p.B = dbc.ptr(); p.C = dbc.ptr() + S; p.ld_bc = ldbc;
                p.D = dD.ptr(); p.z = dz.ptr(); p.ld_z = ldz; p.state = dstate.ptr(); p.y = dy.ptr();
                p.length = L; p.channels = C; p.d_state = S;
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
            }
}

// ---- The vector exp/log/activations of cpu/math.hpp (builds with AVX-512 or AVX2 + FMA) ----
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
namespace {
#if defined(__AVX512F__)
constexpr int kW = 16;
using VecT = __m512;
VecT vec_load(const float* p) { return _mm512_loadu_ps(p); }
void vec_store(float* p, VecT v) { _mm512_storeu_ps(p, v); }
#else
constexpr int kW = 8;
using VecT = __m256;
VecT vec_load(const float* p) { return _mm256_loadu_ps(p); }
void vec_store(float* p, VecT v) { _mm256_storeu_ps(p, v); }
#endif

/// f applied to every element of x, kW at a time (x padded with 1 to a multiple of kW).
template <class F>
std::vector<float> apply_vec(F f, std::vector<float> x) {
    const std::size_t n = x.size();
    x.resize((n + kW - 1) / kW * kW, 1.f);
    for (std::size_t i = 0; i < x.size(); i += kW) vec_store(&x[i], f(vec_load(&x[i])));
    x.resize(n);
    return x;
}

/// Spacing of floats in the binade of |r| (2^-149, the denormal step, below FLT_MIN).
double ulp_at(double r) {
    r = std::fabs(r);
    if (r < double(FLT_MIN)) return std::ldexp(1.0, -149);
    int e;
    std::frexp(r, &e);
    return std::ldexp(1.0, e - 24);
}

/// Every 97th float (by bit pattern) with |x| <= lim, both signs, then `extra`.
std::vector<float> float_sweep(float lim, std::initializer_list<float> extra) {
    std::vector<float> x;
    for (std::uint32_t b = 0; b < 0x7f800000u; b += 97) {
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
    const float lo = -104.f, hi = 88.7f;
    const auto x = float_sweep(120.f, {lo, std::nextafter(lo, -200.f), std::nextafter(lo, 0.f), -103.97208f, -87.336548f,
                                      -87.33655f, hi, std::nextafter(hi, 0.f), std::nextafter(hi, 200.f), 88.72284f, 1e30f,
                                      -1e30f, FLT_MAX, -FLT_MAX, FLT_MIN, 0.f, -0.f});
    const auto y = apply_vec([](VecT v) { return cpu::vexp(v); }, x);
    const float top = apply_vec([](VecT v) { return cpu::vexp(v); }, {hi})[0];
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
    const auto s = apply_vec([](VecT v) { return cpu::vexp(v); }, {NAN, -NAN, INFINITY, -INFINITY});
    CHECK(std::isnan(s[0]));
    CHECK(std::isnan(s[1]));
    CHECK(same_bits(s[2], top));
    CHECK(same_bits(s[3], 0.f));
}

TEST_CASE("vlog: <= 0.9 ulp over positive normal floats, log(1) = 0") {
    std::vector<float> x;
    for (std::uint32_t b = 0x00800000u; b < 0x7f800000u; b += 97) {
        float f;
        std::memcpy(&f, &b, sizeof f);
        x.push_back(f);
    }
    for (float v : {1.f, std::nextafter(1.f, 2.f), std::nextafter(1.f, 0.f), 1.41421356f, 1.41421366f, 0.70710677f, 2.f,
                    FLT_MIN, FLT_MAX, 3.4e38f})
        x.push_back(v);
    const auto y = apply_vec([](VecT v) { return cpu::vlog(v); }, x);
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

TEST_CASE("vector SiLU / Softplus / Mish: close to the definitions over +-130, NaN and inf as documented, exact tails") {
    std::vector<float> x = float_sweep(130.f, {-104.f, -103.9f, -88.7f, -88.8f, -87.3f, 88.7f, 88.8f, 19.999f, 20.f, 20.0001f,
                                               -20.f, 9.f, -9.f, 1e-30f, -1e-30f, 1e-40f, -1e-40f});
    if (x.size() % kW == 0) x.push_back(0.5f);  // one masked tail in the sweep itself
    for (Activation a : {Activation::Silu, Activation::Softplus, Activation::Mish}) {
        CAPTURE(int(a));
        std::vector<float> y = x;
        cpu::activate_inplace(a, y.data(), static_cast<long long>(y.size()));
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
        // Tails: every length 1 .. 2 kW + 1 gives the lanes' bits of the full-vector run and writes nothing past n.
        for (int n = 1; n <= 2 * kW + 1; ++n) {
            std::vector<float> buf(std::size_t(n + kW), -7.f);
            std::copy(x.begin(), x.begin() + n, buf.begin());
            cpu::activate_inplace(a, buf.data(), n);
            for (int i = 0; i < n; ++i) CHECK(same_bits(buf[std::size_t(i)], y[std::size_t(i)]));
            for (int i = n; i < n + kW; ++i) CHECK(buf[std::size_t(i)] == -7.f);
        }
    }
    // NaN / inf (the same in the AVX-512 and AVX2 forms): SiLU, Softplus and Mish propagate NaN like the scalar forms;
    // SiLU(-inf) = -inf (scalar: NaN), Mish(-inf) = NaN.
    auto act = [](Activation a, float v) {
        cpu::activate_inplace(a, &v, 1);
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
}
#endif
