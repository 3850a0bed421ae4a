// group_norm (with its fused act -> FiLM -> residual epilogue) and rms_norm on every backend vs naive double loops
// written from the PyTorch definitions, a non-CPU backend also vs Ops<Cpu>; and the shared argument checks.
#include "group_norm_reference.hpp"
#include "ops_test_util.hpp"

using namespace optest;

namespace {

struct GroupNormCase {
    int batch, channels, length, groups;
    Activation act;
    bool film, residual, affine;
    int film_pad;
    Activation post = Activation::None;  // post_act, after the residual (ResNet BasicBlock: residual + ReLU)
    bool shared = false;                 // film_shared: one row added to every batch row's FiLM (the U-Net's timestep part)
};

/// Out of place, then in place (y == x): both must match the reference.
template <class B>
void run_group_norm(const GroupNormCase& k, std::uint32_t seed) {
    CAPTURE(k.batch); CAPTURE(k.channels); CAPTURE(k.length); CAPTURE(k.groups); CAPTURE(int(k.act)); CAPTURE(k.film);
    CAPTURE(k.residual); CAPTURE(k.affine); CAPTURE(k.film_pad); CAPTURE(int(k.post)); CAPTURE(k.shared);
    const std::size_t n = std::size_t(k.batch) * k.channels * k.length;
    auto x = random_vec(n, seed, -2.f, 3.f);
    for (auto& v : x) v += 5.f;  // a large mean: the normalisation must not lose precision to it
    const auto gamma = random_vec(k.channels, seed + 1, 0.5f, 1.5f);
    const auto beta = random_vec(k.channels, seed + 2);
    const int fstride = 2 * k.channels + k.film_pad;
    const auto film = random_vec(std::size_t(k.batch) * fstride, seed + 3);
    const auto res = random_vec(n, seed + 4);
    const auto shared = random_vec(2 * std::size_t(k.channels), seed + 5);
    GroupNormReference r;
    r.batch = k.batch; r.channels = k.channels; r.length = k.length; r.groups = k.groups;
    r.gamma = k.affine ? gamma.data() : nullptr;
    r.beta = k.affine ? beta.data() : nullptr;
    r.act = k.act;
    r.film = k.film ? film.data() : nullptr;
    r.film_stride = fstride;
    r.shared = k.film && k.shared ? shared.data() : nullptr;
    r.residual = k.residual ? res.data() : nullptr;
    r.post = k.post;
    std::vector<double> ref, scale;
    group_norm_reference(r, x, ref, scale);
    Dev<float, B> dx(x), dg(gamma), dbt(beta), df(film), dsh(shared), dr(res), dy(n);
    GroupNormParams p;
    p.x = dx.ptr();
    p.gamma = k.affine ? dg.ptr() : nullptr;
    p.beta = k.affine ? dbt.ptr() : nullptr;
    p.y = dy.ptr();
    p.batch = k.batch; p.channels = k.channels; p.length = k.length; p.groups = k.groups;
    p.act = k.act;
    p.film = k.film ? df.ptr() : nullptr;
    p.film_stride = k.film_pad ? fstride : 0;
    p.film_shared = k.shared ? dsh.ptr() : nullptr;
    p.residual = k.residual ? dr.ptr() : nullptr;
    p.post_act = k.post;
    Ops<B>::group_norm(p);
    const auto got = dy.host(n);
    check_all(got, ref, scale, 2e-6, "group_norm");
    CHECK(max_norm_rel(got, ref) <= kTolRef);
    // In place (y == x) gives the same result.
    Ops<B>::group_norm([&] { auto q = p; q.y = dx.ptr(); return q; }());
    const auto got_in_place = dx.host(n);
    check_all(got_in_place, ref, scale, 2e-6, "group_norm in place");
    CHECK(max_norm_rel(got_in_place, ref) <= kTolRef);
    if constexpr (!kIsCpu<B>) {
        std::vector<float> cpu(n);
        p.x = x.data(); p.gamma = k.affine ? gamma.data() : nullptr; p.beta = k.affine ? beta.data() : nullptr;
        p.film = k.film ? film.data() : nullptr; p.film_shared = k.shared ? shared.data() : nullptr; p.residual = k.residual ? res.data() : nullptr; p.y = cpu.data();
        Ops<Cpu>::group_norm(p);
        CHECK(max_norm_rel(got, cpu) <= kTolCpu);
        CHECK(max_norm_rel(got_in_place, cpu) <= kTolCpu);
    }
}

}  // namespace

TEST_CASE_TEMPLATE("group_norm with fused act -> FiLM -> residual -> post_act matches a naive loop", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    using A = Activation;
    const GroupNormCase cases[] = {
        {1, 1, 1, 1, A::None, false, false, true, 0},
        {2, 8, 16, 8, A::Mish, true, true, true, 0},
        {3, 12, 7, 3, A::Silu, true, false, true, 5},
        {1, 37, 3, 1, A::None, false, true, false, 0},
        {2, 64, 4, 8, A::Mish, false, false, true, 0},
        {1, 16, 129, 4, A::Softplus, true, true, true, 1},
        // The PushT blocks (GroupNorm(8) + Mish, FiLM, residual) and odd shapes.
        {1, 512, 16, 8, A::Mish, false, false, true, 0},
        {1, 512, 16, 8, A::Mish, true, false, true, 0},
        {1, 2048, 4, 8, A::Mish, true, true, true, 0},
        {2, 1024, 8, 8, A::Mish, false, true, true, 0},
        {3, 21, 7, 3, A::Silu, true, true, true, 5},
        {1, 37, 1, 37, A::None, false, false, true, 0},
        {2, 64, 129, 4, A::Softplus, true, false, true, 0},
        // post_act after the residual: the ResNet BasicBlock tail (residual + ReLU), and every other activation.
        {1, 64, 21 * 21, 32, A::None, false, true, true, 0, A::Relu},
        {2, 24, 37, 6, A::Relu, false, true, true, 0, A::Relu},
        {1, 16, 9, 4, A::Mish, true, true, true, 1, A::Silu},
        {3, 12, 7, 3, A::None, true, true, false, 0, A::Mish},
        {1, 8, 33, 2, A::Silu, false, true, true, 0, A::Softplus},
        {1, 32, 5, 8, A::None, false, false, true, 0, A::Relu},
        // Groups over 1024 elements (a cluster per group on sm_90): the ResNet stem (16 x 42 x 42 per group, ReLU),
        // layer1's tail (residual + ReLU) and layer2, in place too; odd sizes; and groups too large for the
        // cluster's registers (x read twice).
        {1, 64, 42 * 42, 4, A::Relu, false, false, true, 0},
        {2, 64, 21 * 21, 4, A::None, false, true, true, 0, A::Relu},
        {1, 128, 11 * 11, 8, A::None, false, false, true, 0, A::Relu},
        {3, 21, 1001, 7, A::Silu, true, true, true, 5, A::Mish},
        {1, 6, 1025 / 3 + 1, 2, A::None, false, false, false, 0},
        {2, 16, 40000 / 16 * 2 + 7, 1, A::Mish, true, true, true, 0, A::Relu},
        // A shared FiLM row added to each batch row's (the U-Net's timestep part): the PushT blocks, a padded
        // stride, a cluster-sized group and one too large for the cluster's registers.
        {1, 2048, 4, 8, A::Mish, true, true, true, 0, A::None, true},
        {3, 512, 16, 8, A::Mish, true, false, true, 0, A::None, true},
        {2, 12, 7, 3, A::Silu, true, true, true, 5, A::None, true},
        {3, 21, 1001, 7, A::Silu, true, true, true, 5, A::Mish, true},
        {2, 16, 40000 / 16 * 2 + 7, 1, A::Mish, true, false, true, 0, A::None, true},
    };
    std::uint32_t seed = 3000;
    for (const auto& k : cases) run_group_norm<B>(k, seed += 10);
}

TEST_CASE_TEMPLATE("rms_norm matches a naive loop, with and without a weight", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    struct Shape { int rows, dim; };
    for (Shape s : {Shape{5, 1}, Shape{5, 3}, Shape{5, 37}, Shape{5, 128}, Shape{5, 129}, Shape{1, 128}, Shape{4, 37},
                    Shape{7, 129}, Shape{3, 1025}})
        for (bool with_w : {true, false}) {
            const int rows = s.rows, dim = s.dim;
            CAPTURE(rows); CAPTURE(dim); CAPTURE(with_w);
            const auto x = random_vec(std::size_t(rows) * dim, 40 + dim + rows, -3.f, 3.f);
            const auto w = random_vec(dim, 41 + dim);
            std::vector<double> ref(x.size()), scale(x.size());
            for (int r = 0; r < rows; ++r) {
                double ss = 0;
                for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
                const double inv = 1 / std::sqrt(ss / dim + 1e-5);
                for (int i = 0; i < dim; ++i) {
                    ref[r * dim + i] = x[r * dim + i] * inv * (with_w ? w[i] : 1.0);
                    scale[r * dim + i] = std::fabs(ref[r * dim + i]);
                }
            }
            Dev<float, B> dx(x), dw(w), dy(x.size());
            RmsNormParams p;
            p.x = dx.ptr(); p.weight = with_w ? dw.ptr() : nullptr; p.y = dy.ptr(); p.rows = rows; p.dim = dim;
            Ops<B>::rms_norm(p);
            const auto got = dy.host(x.size());
            check_all(got, ref, scale, 2e-6, "rms_norm");
            if constexpr (!kIsCpu<B>) {
                std::vector<float> cpu(x.size());
                p.x = x.data(); p.weight = with_w ? w.data() : nullptr; p.y = cpu.data();
                Ops<Cpu>::rms_norm(p);
                check_elementwise(got, cpu, 2e-6, 1e-7, "rms_norm vs cpu");
            }
        }
}

TEST_CASE_TEMPLATE("group_norm and rms_norm reject bad sizes, strides and null pointers with the shared message" *
                       doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(64);
    GroupNormParams g;
    g.x = buf.ptr(); g.y = buf.ptr(); g.channels = 6; g.groups = 4; g.length = 2;
    CHECK_THROWS_WITH_AS(Ops<B>::group_norm(g), "flowedge: group_norm: channels not divisible by groups (expected a multiple of 4, got 6)",
                         Error);
    g.groups = 3;
    g.film_stride = 11;
    CHECK_THROWS_WITH_AS(Ops<B>::group_norm(g), "flowedge: group_norm: FiLM row stride shorter than 2 * channels (expected 0 or >= 12, got 11)",
                         Error);
    g.film_stride = 0;
    g.film_shared = buf.ptr();
    CHECK_THROWS_WITH_AS(Ops<B>::group_norm(g), "flowedge: group_norm: shared FiLM row without a FiLM tensor (expected film set, got null)",
                         Error);
    g.film_shared = nullptr;
    g.length = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::group_norm(g),
                         "flowedge: group_norm: sizes must be positive (expected batch, channels, length, groups > 0, got batch 1, channels 6, "
                         "length 0, groups 3)",
                         Error);
    g.length = 2;
    g.x = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::group_norm(g), "flowedge: group_norm: null x or y pointer", Error);
    RmsNormParams r;
    r.x = buf.ptr(); r.y = buf.ptr(); r.rows = 2; r.dim = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::rms_norm(r), "flowedge: rms_norm: sizes must be positive (expected rows >= 0, dim > 0, got rows 2, dim 0)",
                         Error);
    r.dim = 8;
    r.y = nullptr;
    CHECK_THROWS_WITH_AS(Ops<B>::rms_norm(r), "flowedge: rms_norm: null x or y pointer", Error);
    Memory<B>::synchronize();
}
