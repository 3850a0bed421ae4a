// DiffusionHead tests: PushT parameter count, scheduler tables, tiny U-Net and sampler vs an independent double
// reference, the U-Net's measured workspace and [B, A, H] layout, LeRobot folder / compact loading and round trip, BF16
// weights, CPU MathMode, loader rejections, input validation.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "diffusion_reference.hpp"
#include "flowedge/models/diffusion/export.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "../support/cpu_models_diffusion_head.hpp"

using namespace flowedge;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
    fs::path d = fs::temp_directory_path() / ("flowedge_diffusion_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

const std::vector<float> kMin{-1.5f, 10.f}, kMax{2.5f, 30.f};

/// A tiny LeRobot folder with random weights; returns its path.
fs::path tiny_folder(const std::string& name, const DiffusionConfig& c, const dref::Weights& w) {
    fs::path d = temp_dir(name);
    dref::write_lerobot_folder(d, c, w, kMin, kMax, [](nlohmann::json&) {});
    return d;
}

std::vector<float> seq(std::size_t n, double a, double b) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = float(std::sin(a * double(i + 1)) * b);
    return v;
}

double max_abs_diff(const std::vector<float>& a, const dref::Vec& b) {
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
    return m;
}

/// Runs `f` and returns the flowedge::Error message (empty when nothing was thrown).
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return {};
}

}  // namespace

TEST_CASE("PushT U-Net has 251,511,938 parameters") {
    DiffusionConfig c;  // defaults are the PushT policy
    ConditionalUnet1d<Cpu> unet(c);
    CHECK(unet.n_parameters() == 251511938);
    std::int64_t listed = 0;
    unet.visit_parameters([&](const std::string&, Parameter<Cpu>&, const Shape& s, Storage) { listed += s.numel(); });
    CHECK(listed == 251511938);
    const fs::path demo = fs::path(FLOWEDGE_FIXTURES_DIR) / ".." / ".." / "models" / "diffusion_pusht.flowedge.safetensors";
    if (fs::exists(demo)) {
        auto head = DiffusionHead<Cpu>::load(demo);
        CHECK(head.n_parameters() == 251511938);
    } else {
        MESSAGE("demo checkpoint not generated; counted from the layer configs only");
    }
}

TEST_CASE("scheduler tables match an independent long-double computation") {
    NoiseSchedule s(100);
    const std::vector<float> ref = dref::ref_alphas_cumprod(100);
    for (int i = 0; i < 100; ++i) CHECK(s.alphas_cumprod()[std::size_t(i)] == doctest::Approx(ref[std::size_t(i)]).epsilon(1e-6));
    CHECK(s.betas().back() == doctest::Approx(0.999f));  // the cap binds at the last step
    CHECK(s.timestep(0, 10) == 90);
    CHECK(s.timestep(9, 10) == 0);
    CHECK(s.timestep(0, 100) == 99);
    CHECK(s.timestep(0, 3) == 66);
    DiffusionStepParams p;
    s.step_coefficients(Scheduler::Ddim, 9, 10, p);  // t = 0, prev < 0: abar_prev = 1
    CHECK(p.c_x0 == 1.f);
    CHECK(p.c_other == 0.f);
    CHECK(s.step_coefficients(Scheduler::Ddpm, 8, 10, p));     // t = 10, prev = 0 -> noise
    CHECK_FALSE(s.step_coefficients(Scheduler::Ddpm, 9, 10, p));  // t = 0 -> no noise
    CHECK(p.noise_std == 0.f);
    CHECK_THROWS_AS(s.check_steps(0), Error);
    CHECK_THROWS_AS(s.check_steps(101), Error);
    CHECK(error_of([] { parse_scheduler("euler"); }).find("unknown scheduler 'euler'") != std::string::npos);
    CHECK(parse_scheduler("DDIM") == Scheduler::Ddim);
}

TEST_CASE("tiny U-Net and samplers match the double-precision reference") {
    const DiffusionConfig c = dref::tiny_config();
    const dref::Weights w = dref::random_weights(c, 11);
    const fs::path dir = tiny_folder("tiny", c, w);
    const int B = 3;
    auto head = DiffusionHead<Cpu>::load(dir, {}, B);
    CHECK(head.config().global_cond_dim == 6);
    CHECK(head.config().action_dim == 2);
    dref::RefUnet ref{w, c};
    const std::size_t per = std::size_t(c.horizon) * c.action_dim;
    const std::vector<float> cond = seq(std::size_t(B) * c.global_cond_dim, 0.7, 1.3);
    const std::vector<float> x = seq(std::size_t(B) * per, 0.37, 1.0);
    auto slice = [](const std::vector<float>& v, std::size_t at, std::size_t n) {
        return dref::Vec(v.begin() + std::ptrdiff_t(at), v.begin() + std::ptrdiff_t(at + n));
    };
    SUBCASE("denoiser") {
        for (int t : {0, 37, 99}) {
            std::vector<float> eps(std::size_t(B) * per);
            head.denoise(cond, x, t, eps, B);
            double worst = 0, scale = 0;
            for (int b = 0; b < B; ++b) {
                const dref::Vec r = ref.eps(slice(x, b * per, per), t, slice(cond, std::size_t(b) * c.global_cond_dim, std::size_t(c.global_cond_dim)));
                for (std::size_t i = 0; i < per; ++i) {
                    worst = std::max(worst, std::fabs(double(eps[b * per + i]) - r[i]));
                    scale = std::max(scale, std::fabs(r[i]));
                }
            }
            MESSAGE("t=" << t << " max |eps - ref| = " << worst << " (max |ref| " << scale << ")");
            CHECK(worst < 2e-5 * std::max(1.0, scale));
        }
    }
    SUBCASE("10-step DDIM and seeded DDPM (10 and 100 steps)") {
        struct Case { Scheduler s; int steps; double tol; };
        for (Case k : {Case{Scheduler::Ddim, 10, 1e-4}, Case{Scheduler::Ddpm, 10, 1e-4}, Case{Scheduler::Ddpm, 100, 3e-4}}) {
            std::vector<float> out(std::size_t(B) * per), act(std::size_t(B) * per);
            SampleOptions o{.steps = k.steps, .scheduler = k.s, .seed = 7};
            head.sample_normalized(cond, x, out, o, B);
            head.sample(cond, x, act, o, B);
            double worst = 0;
            for (int b = 0; b < B; ++b) {
                const dref::Vec r = dref::ref_sample(ref, slice(cond, std::size_t(b) * c.global_cond_dim, std::size_t(c.global_cond_dim)),
                                                     slice(x, b * per, per), k.steps, k.s == Scheduler::Ddpm, 7 + std::uint64_t(b));
                worst = std::max(worst, max_abs_diff(std::vector<float>(out.begin() + std::ptrdiff_t(b * per), out.begin() + std::ptrdiff_t((b + 1) * per)), r));
            }
            MESSAGE(std::string(scheduler_name(k.s)) << " " << k.steps << " steps: max |x - ref| = " << worst);
            CHECK(worst < k.tol);
            for (std::size_t i = 0; i < out.size(); ++i) {
                const int a = int(i % std::size_t(c.action_dim));
                CHECK(act[i] == doctest::Approx((out[i] + 1.f) / 2.f * (kMax[std::size_t(a)] - kMin[std::size_t(a)]) + kMin[std::size_t(a)]).epsilon(1e-6));
            }
        }
        // Same seed -> same actions; another seed -> different DDPM actions; batch element b uses seed + b.
        std::vector<float> a1(std::size_t(B) * per), a2(std::size_t(B) * per), a3(std::size_t(B) * per), one(per);
        head.sample(cond, x, a1, {.steps = 10, .scheduler = Scheduler::Ddpm, .seed = 5}, B);
        head.sample(cond, x, a2, {.steps = 10, .scheduler = Scheduler::Ddpm, .seed = 5}, B);
        head.sample(cond, x, a3, {.steps = 10, .scheduler = Scheduler::Ddpm, .seed = 6}, B);
        CHECK(a1 == a2);
        CHECK(a1 != a3);
        head.sample(std::span(cond).subspan(std::size_t(c.global_cond_dim), std::size_t(c.global_cond_dim)),
                    std::span(x).subspan(per, per), one, {.steps = 10, .scheduler = Scheduler::Ddpm, .seed = 6}, 1);
        // Batch 1 and batch 2 take different (equally exact) kernel paths, so compare to float rounding, not bits:
        // the point is that row b uses the noise stream of seed + b.
        for (std::size_t i = 0; i < per; ++i)
            CHECK(std::fabs(one[i] - a1[per + i]) <= 1e-5f * std::max(1.f, std::fabs(one[i])));
    }
    SUBCASE("executed slice") {
        std::vector<float> act(std::size_t(B) * per), ex(std::size_t(B) * c.n_action_steps * c.action_dim);
        head.sample(cond, x, act, {}, B);
        head.executed_actions(act, ex, B);
        for (int b = 0; b < B; ++b)
            for (int r = 0; r < c.n_action_steps; ++r)
                for (int a = 0; a < c.action_dim; ++a)
                    CHECK(ex[(std::size_t(b) * c.n_action_steps + r) * c.action_dim + a] ==
                          act[(std::size_t(b) * c.horizon + r + c.n_obs_steps - 1) * c.action_dim + a]);
    }
    fs::remove_all(dir);
}

TEST_CASE("U-Nets with 16 and with more than kMaxLinearBatch residual blocks (FiLM batch split) match the reference") {
    // 4 stages = 16 residual blocks (one full linear_batch of FiLM linears); 5 stages = 20 (a batch of 16 plus one of 4).
    for (const std::vector<int>& dims : {std::vector<int>{8, 12, 16, 20}, std::vector<int>{8, 12, 16, 20, 24}}) {
        DiffusionConfig c = dref::tiny_config();
        c.down_dims = dims;
        c.horizon = 16;
        CAPTURE(dims.size());
        REQUIRE(4 * int(dims.size()) >= kMaxLinearBatch);
        const dref::Weights w = dref::random_weights(c, 23 + dims.size());
        const fs::path dir = tiny_folder("deep" + std::to_string(dims.size()), c, w);
        const int B = 2;
        auto head = DiffusionHead<Cpu>::load(dir, {}, B);
        dref::RefUnet ref{w, c};
        const std::size_t per = std::size_t(c.horizon) * c.action_dim;
        const std::vector<float> cond = seq(std::size_t(B) * c.global_cond_dim, 0.7, 1.3);
        const std::vector<float> x = seq(std::size_t(B) * per, 0.37, 1.0);
        std::vector<float> eps(std::size_t(B) * per);
        head.denoise(cond, x, 37, eps, B);
        double worst = 0, scale = 0;
        for (int b = 0; b < B; ++b) {
            const dref::Vec r = ref.eps(dref::Vec(x.begin() + std::ptrdiff_t(b * per), x.begin() + std::ptrdiff_t((b + 1) * per)), 37,
                                        dref::Vec(cond.begin() + b * c.global_cond_dim, cond.begin() + (b + 1) * c.global_cond_dim));
            for (std::size_t i = 0; i < per; ++i) {
                worst = std::max(worst, std::fabs(double(eps[b * per + i]) - r[i]));
                scale = std::max(scale, std::fabs(r[i]));
            }
        }
        MESSAGE(dims.size() << " stages: max |eps - ref| = " << worst << " (max |ref| " << scale << ")");
        CHECK(scale > 0);
        CHECK(worst < 2e-5 * std::max(1.0, scale));
        fs::remove_all(dir);
    }
}

TEST_CASE("the U-Net's measured workspace is exactly what forward() takes, and its [B, A, H] layout is denoise's transposed") {
    // workspace_bytes() is a WorkspaceMeter pass of forward()'s own walk: with one byte less, forward() runs out.
    for (const std::vector<int>& dims : {std::vector<int>{8, 12}, std::vector<int>{8, 12, 16, 20, 24}}) {
        DiffusionConfig c = dref::tiny_config();
        c.down_dims = dims;
        c.horizon = 16;
        CAPTURE(dims.size());
        const fs::path dir = tiny_folder("measured" + std::to_string(dims.size()), c, dref::random_weights(c, 5));
        const int A = c.action_dim, H = c.horizon;
        for (int B : {1, 3}) {
            CAPTURE(B);
            auto head = DiffusionHead<Cpu>::load(dir, {}, B);
            const ConditionalUnet1d<Cpu>& unet = head.unet();
            const std::vector<float> cond = seq(std::size_t(B) * c.global_cond_dim, 0.7, 1.3);
            const std::vector<float> x = seq(std::size_t(B) * H * A, 0.37, 1.0);  // [B, H, A]
            std::vector<float> xt(x.size()), eps_unet(x.size()), eps(x.size());
            for (int b = 0; b < B; ++b)
                for (int h = 0; h < H; ++h)
                    for (int a = 0; a < A; ++a) xt[std::size_t((b * A + a) * H + h)] = x[std::size_t((b * H + h) * A + a)];
            auto run = [&](std::size_t bytes) {
                Workspace<Cpu> ws(bytes);
                Context<Cpu> ctx{{}, &ws, MathMode::F32};
                unet.forward(ctx, View<const float, Cpu>{xt.data(), Shape{B, A, H}}, 37.f,
                             View<const float, Cpu>{cond.data(), Shape{B, c.global_cond_dim}}, View<float, Cpu>{eps_unet.data(), Shape{B, A, H}});
            };
            const std::size_t need = unet.workspace_bytes(B);
            CHECK(error_of([&] { run(need); }).empty());
            CHECK(error_of([&] { run(need - 1); }).find("scratch exhausted") != std::string::npos);
            head.denoise(cond, x, 37, eps, B);
            std::size_t mismatches = 0;
            for (int b = 0; b < B; ++b)
                for (int h = 0; h < H; ++h)
                    for (int a = 0; a < A; ++a)
                        mismatches += eps[std::size_t((b * H + h) * A + a)] != eps_unet[std::size_t((b * A + a) * H + h)];
            CHECK(mismatches == 0);
        }
        fs::remove_all(dir);
    }
}

TEST_CASE("compact round trip is bit-exact and BF16 weights stay close") {
    const DiffusionConfig c = dref::tiny_config();
    const dref::Weights w = dref::random_weights(c, 23);
    const fs::path dir = tiny_folder("roundtrip", c, w);
    const fs::path compact = dir / "tiny.flowedge.safetensors";
    export_diffusion_compact(dir, compact);
    auto a = DiffusionHead<Cpu>::load(dir, {}, 2);
    auto b = DiffusionHead<Cpu>::load(compact, {}, 2);
    CHECK(b.config().down_dims == c.down_dims);
    CHECK(b.config().horizon == c.horizon);
    CHECK(b.action_min() == kMin);
    CHECK(b.action_max() == kMax);
    const std::size_t per = std::size_t(c.horizon) * c.action_dim;
    const std::vector<float> cond = seq(2 * std::size_t(c.global_cond_dim), 0.3, 2.0), x = seq(2 * per, 0.37, 1.0);
    std::vector<float> ya(2 * per), yb(2 * per);
    for (Scheduler s : {Scheduler::Ddim, Scheduler::Ddpm}) {
        a.sample(cond, x, ya, {.steps = 10, .scheduler = s, .seed = 3}, 2);
        b.sample(cond, x, yb, {.steps = 10, .scheduler = s, .seed = 3}, 2);
        CHECK(ya == yb);
    }
    // BF16: weights rounded to 8 mantissa bits; stated bound 2e-2 in normalised units after 10 DDIM steps.
    auto h16 = DiffusionHead<Cpu>::load(compact, {.weight_dtype = DType::BF16}, 2);
    const fs::path compact16 = dir / "tiny_bf16.flowedge.safetensors";
    export_diffusion_compact(dir, compact16, DType::BF16);
    auto f16file = DiffusionHead<Cpu>::load(compact16, {}, 2);
    std::vector<float> n32(2 * per), n16(2 * per), n16f(2 * per);
    a.sample_normalized(cond, x, n32, {}, 2);
    h16.sample_normalized(cond, x, n16, {}, 2);
    f16file.sample_normalized(cond, x, n16f, {}, 2);
    double worst = 0;
    for (std::size_t i = 0; i < n32.size(); ++i) worst = std::max(worst, double(std::fabs(n32[i] - n16[i])));
    MESSAGE("BF16 weights vs F32: max |dx| = " << worst << " (normalised units, 10-step DDIM)");
    CHECK(worst < 2e-2);
    CHECK(n16 == n16f);  // converting at load == converting in the file
    CHECK(h16.device_bytes() < a.device_bytes() + 1);
    fs::remove_all(dir);
}

TEST_CASE("CPU MathMode: TF32 is exact; BF16 math stays within 4e-2 of the F32 actions, deterministic and reversible") {
    // Stated bound: per op, BF16 math is off by at most ~2^-8 (BF16 weights) or ~2^-7 (F32 weights, both operands
    // rounded) of sum |w||x| (op_params.hpp, MathMode), twice the weight rounding alone; the BF16-weight test above
    // states 2e-2 in normalised units after 10 DDIM steps for that, so BF16 math gets twice that: 4e-2.
    DiffusionConfig c = dref::tiny_config();
    c.down_dims = {16, 32};  // reduction lengths 48..192: several vdpbf16ps steps, odd tails
    c.horizon = 8;
    const dref::Weights w = dref::random_weights(c, 29);
    const fs::path dir = tiny_folder("math", c, w);
    const int B = 2;
    const std::size_t per = std::size_t(c.horizon) * c.action_dim;
    const std::vector<float> cond = seq(std::size_t(B) * c.global_cond_dim, 0.3, 2.0), x = seq(std::size_t(B) * per, 0.37, 1.0);
    for (DType dt : {DType::F32, DType::BF16}) {
        CAPTURE(int(dt));
        auto h = DiffusionHead<Cpu>::load(dir, {.weight_dtype = dt}, B);
        std::vector<float> f32(B * per), tf32(B * per), b1(B * per), b2(B * per), back(B * per);
        std::vector<float> d1(B * per), d2(B * per), e32(B * per), e16(B * per);
        const SampleOptions ddim{.steps = 10, .scheduler = Scheduler::Ddim}, ddpm{.steps = 10, .scheduler = Scheduler::Ddpm, .seed = 4};
        h.sample_normalized(cond, x, f32, ddim, B);
        h.denoise(cond, x, 60, e32, B);
        h.set_math(MathMode::TF32);
        h.sample_normalized(cond, x, tf32, ddim, B);
        CHECK(tf32 == f32);  // no TF32 hardware on the CPU: exact
        h.set_math(MathMode::BF16);
        CHECK(h.math() == MathMode::BF16);
        h.sample_normalized(cond, x, b1, ddim, B);
        h.sample_normalized(cond, x, b2, ddim, B);
        CHECK(b1 == b2);  // deterministic
        h.sample_normalized(cond, x, d1, ddpm, B);
        h.sample_normalized(cond, x, d2, ddpm, B);
        CHECK(d1 == d2);
        h.denoise(cond, x, 60, e16, B);
        h.set_math(MathMode::F32);
        h.sample_normalized(cond, x, back, ddim, B);
        CHECK(back == f32);  // reversible
        double worst = 0, worst_eps = 0, scale_eps = 0;
        for (std::size_t i = 0; i < f32.size(); ++i) worst = std::max(worst, double(std::fabs(b1[i] - f32[i])));
        for (std::size_t i = 0; i < e32.size(); ++i) {
            worst_eps = std::max(worst_eps, double(std::fabs(e16[i] - e32[i])));
            scale_eps = std::max(scale_eps, double(std::fabs(e32[i])));
        }
        MESSAGE("weights " << dtype_name(dt) << ", BF16 math vs F32 math: max |dx| = " << worst
                           << " (normalised, 10-step DDIM), one denoise max |d eps| = " << worst_eps << " of max |eps| " << scale_eps);
        if (cpu::bf16_math_available()) {
            CHECK(b1 != f32);  // the vdpbf16ps path really ran
            CHECK(worst < 4e-2);
            CHECK(worst_eps < 4e-2 * std::max(1.0, scale_eps));
        } else {
            CHECK(b1 == f32);  // no AVX512_BF16 kernels in this process: every mode is exact
        }
    }
    fs::remove_all(dir);
}

TEST_CASE("loader rejects unsupported settings, naming the field or key") {
    const DiffusionConfig c = dref::tiny_config();
    const dref::Weights w = dref::random_weights(c, 5);
    int n = 0;
    auto reject = [&](auto edit, const std::string& must_name, const std::string& drop = "", const std::string& reshape = "",
                      std::vector<float> mn = kMin, std::vector<float> mx = kMax) {
        const fs::path d = temp_dir("reject" + std::to_string(n++));
        dref::write_lerobot_folder(d, c, w, mn, mx, edit, drop, reshape);
        const std::string msg = error_of([&] { DiffusionHead<Cpu>::load(d); });
        INFO("message: " << msg);
        CHECK(msg.find(must_name) != std::string::npos);
        CHECK(msg.rfind("flowedge: ", 0) == 0);
        fs::remove_all(d);
    };
    reject([](nlohmann::json& j) { j["beta_schedule"] = "linear"; }, "beta_schedule");
    reject([](nlohmann::json& j) { j["prediction_type"] = "sample"; }, "prediction_type");
    reject([](nlohmann::json& j) { j["normalization_mapping"]["ACTION"] = "MEAN_STD"; }, "normalization_mapping.ACTION");
    reject([](nlohmann::json& j) { j["horizon"] = 5; j["n_action_steps"] = 2; }, "horizon");
    reject([](nlohmann::json& j) { j["noise_scheduler_type"] = "EULER"; }, "noise_scheduler_type");
    reject([](nlohmann::json& j) { j["use_film_scale_modulation"] = false; }, "use_film_scale_modulation");
    reject([](nlohmann::json& j) { j["type"] = "act"; }, "policy type");
    reject([](nlohmann::json& j) { j.erase("kernel_size"); }, "'kernel_size'");
    reject([](nlohmann::json& j) { j["n_groups"] = 3; }, "down_dims[0]");
    reject([](nlohmann::json&) {}, "diffusion.unet.mid_modules.1.conv2.block.1.bias", "mid_modules.1.conv2.block.1.bias");
    reject([](nlohmann::json&) {}, "diffusion.unet.up_modules.0.2.weight", "", "up_modules.0.2.weight");
    reject([](nlohmann::json&) {}, "action.min", "", "", std::vector<float>{0.f, 30.f}, std::vector<float>{1.f, 30.f});
    reject([](nlohmann::json& j) { j["input_features"]["observation.state"]["shape"] = {4}; }, "global_cond_dim");
    // Compact form: bad meta / dims / min >= max.
    const fs::path d = tiny_folder("compact_reject", c, w);
    const fs::path good = d / "good.flowedge.safetensors";
    export_diffusion_compact(d, good);
    auto rewrite = [&](const std::string& key, std::vector<float> values) {
        auto src = io::SafeTensors::open(good);
        io::SafeTensorsWriter out;
        ConditionalUnet1d<Cpu> skel(c);
        skel.visit_parameters([&](const std::string& name, Parameter<Cpu>&, const Shape&, Storage) {
            const io::TensorInfo* t = src->find(io::diffusion_compact_name(name));
            out.add(t->name, t->dtype, t->shape, t->data);
        });
        for (const char* k : {"dp.action_min", "dp.action_max", "dp.dims", "dp.meta"}) {
            const io::TensorInfo* t = src->find(k);
            if (key == k) out.add(k, DType::F32, Shape{std::int64_t(values.size())}, values.data());
            else out.add(k, t->dtype, t->shape, t->data);
        }
        const fs::path p = d / ("bad_" + key + ".flowedge.safetensors");
        out.write(p);
        return error_of([&] { DiffusionHead<Cpu>::load(p); });
    };
    auto meta = io::diffusion_meta(c);
    std::vector<float> m(meta.begin(), meta.end());
    m[2] = 6;  // horizon 6 with 2 stages is fine; 5 is not
    m[3] = 2;
    CHECK(rewrite("dp.meta", m).empty());
    m[2] = 5;
    CHECK(rewrite("dp.meta", m).find("horizon") != std::string::npos);
    m = std::vector<float>(meta.begin(), meta.end());
    m[11] = 1;
    CHECK(rewrite("dp.meta", m).find("beta_schedule") != std::string::npos);
    CHECK(rewrite("dp.dims", {8, 18}).find("down_dims[1]") != std::string::npos);
    CHECK(rewrite("dp.action_max", {2.5f, 10.f}).find("dp.action_max") != std::string::npos);
    fs::remove_all(d);
}

TEST_CASE("sample/denoise validate their inputs") {
    const DiffusionConfig c = dref::tiny_config();
    const dref::Weights w = dref::random_weights(c, 9);
    const fs::path dir = tiny_folder("validate", c, w);
    auto head = DiffusionHead<Cpu>::load(dir, {}, 2);
    const std::size_t per = std::size_t(c.horizon) * c.action_dim;
    std::vector<float> cond(std::size_t(c.global_cond_dim), 0.f), x = seq(per, 0.37, 1.0), y(per);
    CHECK(error_of([&] { head.sample(cond, x, y, {.steps = 0}); }).find("steps") != std::string::npos);
    CHECK(error_of([&] { head.sample(cond, x, y, {.steps = 101}); }).find("steps") != std::string::npos);
    CHECK(error_of([&] { head.sample(cond, x, y, {}, 3); }).find("batch") != std::string::npos);
    CHECK(error_of([&] { head.sample(cond, x, std::span(y).first(per - 1)); }).find("output has the wrong size") != std::string::npos);
    CHECK(error_of([&] { head.sample(std::span(cond).first(3), x, y); }).find("condition has the wrong size") != std::string::npos);
    CHECK(error_of([&] { head.denoise(cond, x, 100, y, 1); }).find("timestep") != std::string::npos);
    cond[2] = NAN;
    CHECK(error_of([&] { head.sample(cond, x, y); }).find("non-finite condition value at index 2") != std::string::npos);
    cond[2] = 0.f;
    x[5] = INFINITY;
    CHECK(error_of([&] { head.sample(cond, x, y); }).find("non-finite noise value at index 5") != std::string::npos);
    x[5] = 0.f;
    head.sample(cond, x, y);  // still usable after rejected calls
    for (float v : y) CHECK(std::isfinite(v));
    fs::remove_all(dir);
}

TEST_CASE("non-finite output is reported naming the step") {
    const DiffusionConfig c = dref::tiny_config();
    dref::Weights w = dref::random_weights(c, 9);
    w["final_conv.1.bias"][1] = INFINITY;  // eps is infinite from the first step on
    const fs::path dir = tiny_folder("nonfinite", c, w);
    auto head = DiffusionHead<Cpu>::load(dir);
    const std::size_t per = std::size_t(c.horizon) * c.action_dim;
    std::vector<float> cond(std::size_t(c.global_cond_dim), 0.5f), x = seq(per, 0.37, 1.0), y(per);
    const std::string msg = error_of([&] { head.sample(cond, x, y, {.steps = 10, .scheduler = Scheduler::Ddim}); });
    INFO(msg);
    CHECK(msg.find("non-finite sample after step 0 of 10 (timestep 90") != std::string::npos);
    fs::remove_all(dir);
}
