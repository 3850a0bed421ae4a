// Independent double-precision reference of LeRobot's conditional U-Net and schedulers, written from docs/models.md (#diffusion-policy-u-net, #schedulers)
// with plain loops (no flowedge ops), plus helpers that build tiny random checkpoints for the diffusion tests.
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flowedge/io/safetensors.hpp"
#include "flowedge/models/diffusion/head.hpp"

namespace dref {

using Vec = std::vector<double>;
using Weights = std::map<std::string, std::vector<float>>;  // U-Net name (under diffusion.unet.) -> values

inline double mish(double v) { return v * std::tanh(std::log1p(std::exp(v))); }

/// Reference U-Net over one sample, channel-major activations [C][L] in double.
struct RefUnet {
    const Weights& w;
    flowedge::DiffusionConfig c;

    const std::vector<float>& W(const std::string& n) const { return w.at(n); }

    Vec conv(const Vec& x, int cin, int L, const std::string& name, int cout, int k, int stride, int pad, int& lout) const {
        lout = (L + 2 * pad - k) / stride + 1;
        const auto& wt = W(name + ".weight");
        const auto& b = W(name + ".bias");
        Vec y(static_cast<std::size_t>(cout) * lout, 0.0);
        for (int o = 0; o < cout; ++o)
            for (int t = 0; t < lout; ++t) {
                double s = b[std::size_t(o)];
                for (int i = 0; i < cin; ++i)
                    for (int kk = 0; kk < k; ++kk) {
                        const int src = t * stride + kk - pad;
                        if (src >= 0 && src < L) s += double(wt[(std::size_t(o) * cin + i) * k + kk]) * x[std::size_t(i) * L + src];
                    }
                y[std::size_t(o) * lout + t] = s;
            }
        return y;
    }
    Vec convT(const Vec& x, int cin, int L, const std::string& name, int cout) const {
        const int k = 4, stride = 2, pad = 1, lout = (L - 1) * stride - 2 * pad + k;
        const auto& wt = W(name + ".weight");
        const auto& b = W(name + ".bias");
        Vec y(static_cast<std::size_t>(cout) * lout, 0.0);
        for (int o = 0; o < cout; ++o)
            for (int t = 0; t < lout; ++t) y[std::size_t(o) * lout + t] = b[std::size_t(o)];
        // scatter form: each input column s contributes to t = s*stride - pad + kk
        for (int i = 0; i < cin; ++i)
            for (int s = 0; s < L; ++s)
                for (int o = 0; o < cout; ++o)
                    for (int kk = 0; kk < k; ++kk) {
                        const int t = s * stride - pad + kk;
                        if (t >= 0 && t < lout) y[std::size_t(o) * lout + t] += double(wt[(std::size_t(i) * cout + o) * k + kk]) * x[std::size_t(i) * L + s];
                    }
        return y;
    }
    Vec groupnorm_mish(const Vec& x, int C, int L, int groups, const std::string& name) const {
        const auto& g = W(name + ".weight");
        const auto& b = W(name + ".bias");
        Vec y(x.size());
        const int cpg = C / groups;
        for (int gr = 0; gr < groups; ++gr) {
            double m = 0, v = 0;
            for (int c = gr * cpg; c < (gr + 1) * cpg; ++c)
                for (int t = 0; t < L; ++t) m += x[std::size_t(c) * L + t];
            m /= double(cpg) * L;
            for (int c = gr * cpg; c < (gr + 1) * cpg; ++c)
                for (int t = 0; t < L; ++t) v += (x[std::size_t(c) * L + t] - m) * (x[std::size_t(c) * L + t] - m);
            v /= double(cpg) * L;
            for (int c = gr * cpg; c < (gr + 1) * cpg; ++c)
                for (int t = 0; t < L; ++t)
                    y[std::size_t(c) * L + t] = mish((x[std::size_t(c) * L + t] - m) / std::sqrt(v + 1e-5) * g[std::size_t(c)] + b[std::size_t(c)]);
        }
        return y;
    }
    Vec block(const Vec& x, int cin, int L, const std::string& p, int cout, int groups) const {
        int lo;
        Vec h = conv(x, cin, L, p + ".block.0", cout, c.kernel_size, 1, c.kernel_size / 2, lo);
        return groupnorm_mish(h, cout, L, groups, p + ".block.1");
    }
    Vec res(const Vec& x, int cin, int L, const Vec& g, const std::string& p, int cout) const {
        Vec a = block(x, cin, L, p + ".conv1", cout, c.n_groups);
        const auto& fw = W(p + ".cond_encoder.1.weight");
        const auto& fb = W(p + ".cond_encoder.1.bias");
        const int cd = int(g.size());
        for (int o = 0; o < cout; ++o) {
            double sc = fb[std::size_t(o)], bi = fb[std::size_t(cout + o)];
            for (int i = 0; i < cd; ++i) {
                sc += double(fw[std::size_t(o) * cd + i]) * g[std::size_t(i)];
                bi += double(fw[std::size_t(cout + o) * cd + i]) * g[std::size_t(i)];
            }
            for (int t = 0; t < L; ++t) a[std::size_t(o) * L + t] = sc * a[std::size_t(o) * L + t] + bi;
        }
        Vec o2 = block(a, cout, L, p + ".conv2", cout, c.n_groups);
        Vec r = x;
        int lo;
        if (cin != cout) r = conv(x, cin, L, p + ".residual_conv", cout, 1, 1, 0, lo);
        for (std::size_t i = 0; i < o2.size(); ++i) o2[i] += r[i];
        return o2;
    }
    /// eps[H][A] for one sample x[H][A], timestep t, cond[gcd].
    Vec eps(const Vec& xha, double t, const Vec& cond) const {
        const int H = c.horizon, A = c.action_dim, td = c.step_embed_dim, half = td / 2;
        Vec e(static_cast<std::size_t>(td), 0.0);
        for (int i = 0; i < half; ++i) {
            const double f = std::exp(-double(i) * std::log(10000.0) / double(half - 1));
            e[std::size_t(i)] = std::sin(t * f);
            e[std::size_t(half + i)] = std::cos(t * f);
        }
        auto lin = [&](const Vec& in, const std::string& n, int out) {
            const auto& wt = W(n + ".weight");
            const auto& b = W(n + ".bias");
            Vec y(static_cast<std::size_t>(out), 0.0);
            for (int o = 0; o < out; ++o) {
                double s = b[std::size_t(o)];
                for (std::size_t i = 0; i < in.size(); ++i) s += double(wt[std::size_t(o) * in.size() + i]) * in[i];
                y[std::size_t(o)] = s;
            }
            return y;
        };
        Vec h = lin(e, "diffusion_step_encoder.1", 4 * td);
        for (double& v : h) v = mish(v);
        Vec te = lin(h, "diffusion_step_encoder.3", td);
        Vec g = te;
        g.insert(g.end(), cond.begin(), cond.end());
        for (double& v : g) v = mish(v);
        Vec x(static_cast<std::size_t>(A) * H, 0.0);
        for (int hh = 0; hh < H; ++hh)
            for (int a = 0; a < A; ++a) x[std::size_t(a) * H + hh] = xha[std::size_t(hh) * A + a];
        const int S = c.stages();
        std::vector<Vec> skips;
        std::vector<int> skipc;
        int C = A, L = H;
        for (int s = 0; s < S; ++s) {
            const std::string p = "down_modules." + std::to_string(s);
            const int out = c.down_dims[std::size_t(s)];
            x = res(x, C, L, g, p + ".0", out);
            x = res(x, out, L, g, p + ".1", out);
            C = out;
            skips.push_back(x);
            skipc.push_back(C);
            if (s < S - 1) {
                int lo;
                x = conv(x, C, L, p + ".2", C, 3, 2, 1, lo);
                L = lo;
            }
        }
        x = res(x, C, L, g, "mid_modules.0", C);
        x = res(x, C, L, g, "mid_modules.1", C);
        for (int u = 0; u < S - 1; ++u) {
            const std::string p = "up_modules." + std::to_string(u);
            Vec sk = skips.back();
            const int cs = skipc.back();
            skips.pop_back();
            skipc.pop_back();
            x.insert(x.end(), sk.begin(), sk.end());  // channel concat, x first
            const int lo = c.down_dims[std::size_t(S - 2 - u)];
            x = res(x, C + cs, L, g, p + ".0", lo);
            x = res(x, lo, L, g, p + ".1", lo);
            C = lo;
            x = convT(x, C, L, p + ".2", C);
            L *= 2;
        }
        x = block(x, C, L, "final_conv.0", C, 8);
        int lo;
        x = conv(x, C, L, "final_conv.1", A, 1, 1, 0, lo);
        Vec out(static_cast<std::size_t>(H) * A, 0.0);
        for (int hh = 0; hh < H; ++hh)
            for (int a = 0; a < A; ++a) out[std::size_t(hh) * A + a] = x[std::size_t(a) * H + hh];
        return out;
    }
};

/// alphas_cumprod computed independently: long double cosine, float32 betas, float32 running product.
inline std::vector<float> ref_alphas_cumprod(int T) {
    auto abar = [](long double tau) {
        const long double v = std::cos((tau + 0.008L) / 1.008L * 3.141592653589793238462643383279502884L / 2.0L);
        return v * v;
    };
    std::vector<float> out;
    float prod = 1.f;
    for (int i = 0; i < T; ++i) {
        long double beta = 1.0L - abar((long double)(i + 1) / T) / abar((long double)i / T);
        if (beta > 0.999L) beta = 0.999L;
        prod *= 1.f - float(beta);
        out.push_back(prod);
    }
    return out;
}

/// Independent SplitMix64 + Box-Muller generator (docs/models.md#seeded-noise): sequential, with the cached second draw.
struct RefNormal {
    std::uint64_t state;
    bool has = false;
    double cached = 0;
    explicit RefNormal(std::uint64_t seed) : state(seed) {}
    std::uint64_t next() {
        state += 0x9e3779b97f4a7c15ull;
        std::uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    double uniform() { return double((next() >> 40) + 1) / 16777217.0; }
    float draw() {
        if (has) {
            has = false;
            return float(cached);
        }
        const double u1 = uniform(), u2 = uniform();
        const double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * 3.14159265358979323846 * u2;
        cached = r * std::sin(th);
        has = true;
        return float(r * std::cos(th));
    }
};

/// Reference sampler in double (scheduler coefficients in double too), for one sample. Returns normalised x.
inline Vec ref_sample(const RefUnet& u, const Vec& cond, const Vec& noise, int steps, bool ddpm, std::uint64_t seed) {
    const int T = u.c.num_train_timesteps, ratio = T / steps;
    const std::vector<float> ac = ref_alphas_cumprod(T);
    Vec x = noise;
    RefNormal rng(seed);
    for (int i = 0; i < steps; ++i) {
        const int t = (steps - 1 - i) * ratio, prev = t - ratio;
        const double at = ac[std::size_t(t)], ap = prev >= 0 ? ac[std::size_t(prev)] : 1.0;
        Vec e = u.eps(x, t, cond);
        std::vector<float> z;
        if (ddpm && prev >= 0)
            for (std::size_t k = 0; k < x.size(); ++k) z.push_back(rng.draw());
        for (std::size_t k = 0; k < x.size(); ++k) {
            double x0 = (x[k] - std::sqrt(1 - at) * e[k]) / std::sqrt(at);
            if (u.c.clip_sample) x0 = std::clamp(x0, -double(u.c.clip_sample_range), double(u.c.clip_sample_range));
            if (!ddpm) {
                x[k] = std::sqrt(ap) * x0 + std::sqrt(1 - ap) * e[k];
            } else {
                const double a = at / ap, b = 1 - a;
                double v = std::sqrt(ap) * b / (1 - at) * x0 + std::sqrt(a) * (1 - ap) / (1 - at) * x[k];
                if (prev >= 0) v += std::sqrt(std::max((1 - ap) / (1 - at) * b, 1e-20)) * z[k];
                x[k] = v;
            }
        }
    }
    return x;
}

/// SplitMix64-driven uniform in [-1, 1) for test weights.
struct Rng {
    std::uint64_t s;
    double next() {
        s += 0x9e3779b97f4a7c15ull;
        std::uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        return double(z >> 11) / double(1ull << 53) * 2.0 - 1.0;
    }
};

/// Tiny config of the unit tests: stages 2, dims 8/16, horizon 4.
inline flowedge::DiffusionConfig tiny_config() {
    flowedge::DiffusionConfig c;
    c.action_dim = 2;
    c.horizon = 4;
    c.n_action_steps = 2;
    c.n_obs_steps = 2;
    c.global_cond_dim = 6;
    c.down_dims = {8, 16};
    c.kernel_size = 3;
    c.n_groups = 4;
    c.step_embed_dim = 8;
    c.num_train_timesteps = 100;
    return c;
}

/// Random weights for every U-Net parameter of `c` (kaiming-like bounds; norms near 1/0).
inline Weights random_weights(const flowedge::DiffusionConfig& c, std::uint64_t seed) {
    Weights w;
    flowedge::ConditionalUnet1d<flowedge::Cpu> skel(c);
    Rng rng{seed};
    skel.visit_parameters([&](const std::string& name, flowedge::Parameter<flowedge::Cpu>&, const flowedge::Shape& s, flowedge::Storage) {
        std::vector<float> v(std::size_t(s.numel()));
        const bool norm = name.find("block.1.") != std::string::npos;
        double bound = 0.5;
        if (!norm && s.rank >= 2) {
            // fan_in: conv weight [out, in, k] -> in*k; transposed conv [in, out, k] -> out*k; linear [out, in] -> in
            const bool transposed = name.rfind("up_modules.", 0) == 0 && name.find(".2.weight") != std::string::npos;
            const double fan = s.rank == 2 ? double(s[1]) : (transposed ? double(s[1]) * s[2] : double(s[1]) * s[2]);
            bound = 1.0 / std::sqrt(fan);
        }
        for (auto& x : v) {
            const double r = rng.next();
            if (norm) x = float(name.size() > 6 && name.substr(name.size() - 6) == "weight" ? 1.0 + 0.2 * r : 0.2 * r);
            else x = float(bound * r);
        }
        w[name] = std::move(v);
    });
    return w;
}

/// Writes a LeRobot-style pretrained_model folder for `c`/`w` (config.json, model.safetensors,
/// policy_postprocessor.json + its state file). `edit` can modify the config json before it is written.
template <class Edit>
void write_lerobot_folder(const std::filesystem::path& dir, const flowedge::DiffusionConfig& c, const Weights& w,
                          const std::vector<float>& mn, const std::vector<float>& mx, Edit&& edit,
                          const std::string& drop_key = "", const std::string& reshape_key = "") {
    namespace fs = std::filesystem;
    fs::create_directories(dir);
    nlohmann::json j = {
        {"type", "diffusion"},
        {"n_obs_steps", c.n_obs_steps},
        {"normalization_mapping", {{"VISUAL", "MEAN_STD"}, {"STATE", "MIN_MAX"}, {"ACTION", "MIN_MAX"}}},
        {"input_features", {{"observation.state", {{"type", "STATE"}, {"shape", {c.global_cond_dim / c.n_obs_steps}}}}}},
        {"output_features", {{"action", {{"type", "ACTION"}, {"shape", {c.action_dim}}}}}},
        {"horizon", c.horizon},
        {"n_action_steps", c.n_action_steps},
        {"spatial_softmax_num_keypoints", 32},
        {"down_dims", c.down_dims},
        {"kernel_size", c.kernel_size},
        {"n_groups", c.n_groups},
        {"diffusion_step_embed_dim", c.step_embed_dim},
        {"use_film_scale_modulation", true},
        {"noise_scheduler_type", "DDPM"},
        {"num_train_timesteps", c.num_train_timesteps},
        {"beta_schedule", "squaredcos_cap_v2"},
        {"beta_start", 0.0001},
        {"beta_end", 0.02},
        {"prediction_type", "epsilon"},
        {"clip_sample", c.clip_sample},
        {"clip_sample_range", c.clip_sample_range},
        {"num_inference_steps", nullptr},
    };
    edit(j);
    std::ofstream(dir / "config.json") << j.dump(2);
    flowedge::ConditionalUnet1d<flowedge::Cpu> skel(c);
    flowedge::io::SafeTensorsWriter model;
    skel.visit_parameters([&](const std::string& name, flowedge::Parameter<flowedge::Cpu>&, const flowedge::Shape& s, flowedge::Storage) {
        if (name == drop_key) return;
        flowedge::Shape shape = s;
        if (name == reshape_key) shape.dims[0] += 1;
        std::vector<float> v = w.at(name);
        v.resize(std::size_t(shape.numel()), 0.f);
        model.add("diffusion.unet." + name, flowedge::DType::F32, shape, v.data());
    });
    model.write(dir / "model.safetensors");
    nlohmann::json pp = {{"name", "policy_postprocessor"},
                         {"steps", {{{"registry_name", "unnormalizer_processor"}, {"config", nlohmann::json::object()},
                                     {"state_file", "policy_postprocessor_step_0_unnormalizer_processor.safetensors"}},
                                    {{"registry_name", "device_processor"}, {"config", nlohmann::json::object()}}}}};
    std::ofstream(dir / "policy_postprocessor.json") << pp.dump(2);
    flowedge::io::SafeTensorsWriter st;
    st.add("action.min", flowedge::DType::F32, flowedge::Shape{std::int64_t(mn.size())}, mn.data());
    st.add("action.max", flowedge::DType::F32, flowedge::Shape{std::int64_t(mx.size())}, mx.data());
    st.write(dir / "policy_postprocessor_step_0_unnormalizer_processor.safetensors");
}

}  // namespace dref
