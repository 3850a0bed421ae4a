// flowedge-make-demo-mamba-flow: writes a deterministic Mamba + flow checkpoint at the reference shape
// (no download needed) so the examples, benches and CUDA-vs-CPU comparisons have a model to run.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <numbers>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <flowedge/io/safetensors.hpp>

using namespace flowedge;

namespace {

/// SplitMix64: a portable, seedable stream (std distributions differ between standard libraries).
struct Rng {
    std::uint64_t state;
    std::uint64_t next() {
        std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    /// Uniform in (0, 1].
    double uniform() { return double((next() >> 11) + 1) / 9007199254740992.0; }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
    double normal() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * std::numbers::pi * uniform()); }
};

struct Shape2 {
    int n_layers = 2, d_model = 128, expand = 2, d_state = 16, d_conv = 4, dt_rank = 8, vocab = 256;
    int action_dim = 8, time_dim = 64, hidden = 256, flow_layers = 2;
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Write a deterministic Mamba + flow-matching checkpoint at the reference shape: 2 layers, d_model 128,\n"
                 "d_state 16, d_conv 4, expand 2, dt_rank 8, vocab 256, action_dim 8, flow Tm 64, H 256, 2 hidden layers."};
    app.option_defaults()->always_capture_default();
    std::string out = "models/mamba_flow.safetensors";
    std::uint64_t seed = 20240607;
    app.add_option("OUT", out, "output path (default models/mamba_flow.safetensors)");
    app.add_option("--seed", seed, "SplitMix64 seed of the initialisation");
    CLI11_PARSE(app, argc, argv);

    try {
        const Shape2 s;
        const int di = s.expand * s.d_model;
        Rng rng{seed};
        io::SafeTensorsWriter w;
        std::size_t n_params = 0;
        auto add = [&](const std::string& name, std::vector<std::int64_t> dims, const std::vector<float>& v) {
            Shape shape;
            for (auto d : dims) shape.dims[std::size_t(shape.rank++)] = d;
            w.add_f32(name, shape, v);
            n_params += v.size();
        };
        // torch.nn.Linear / Conv1d default (kaiming_uniform, a = sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        auto kaiming = [&](std::size_t n, int fan_in) {
            const double b = 1.0 / std::sqrt(double(fan_in));
            std::vector<float> v(n);
            for (auto& x : v) x = float(rng.uniform(-b, b));
            return v;
        };
        auto constant = [](std::size_t n, float c) { return std::vector<float>(n, c); };

        std::vector<float> emb(std::size_t(s.vocab) * s.d_model);
        for (auto& x : emb) x = float(0.1 * rng.normal());  // MambaConfig.initializer_range = 0.1
        add("backbone.embeddings.weight", {s.vocab, s.d_model}, emb);
        for (int l = 0; l < s.n_layers; ++l) {
            const std::string L = "backbone.layers." + std::to_string(l) + ".";
            const std::string M = L + "mixer.";
            add(L + "norm.weight", {s.d_model}, constant(std::size_t(s.d_model), 1.f));
            add(M + "in_proj.weight", {2 * di, s.d_model}, kaiming(std::size_t(2 * di) * s.d_model, s.d_model));
            add(M + "conv1d.weight", {di, 1, s.d_conv}, kaiming(std::size_t(di) * s.d_conv, s.d_conv));
            add(M + "conv1d.bias", {di}, kaiming(std::size_t(di), s.d_conv));
            add(M + "x_proj.weight", {s.dt_rank + 2 * s.d_state, di}, kaiming(std::size_t(s.dt_rank + 2 * s.d_state) * di, di));
            add(M + "dt_proj.weight", {di, s.dt_rank}, kaiming(std::size_t(di) * s.dt_rank, s.dt_rank));  // dt_rank^-0.5 bound
            // dt ~ log-uniform in [1e-3, 0.1]; bias = softplus^-1(dt) = dt + log(-expm1(-dt)).
            std::vector<float> dt_bias(static_cast<std::size_t>(di));
            for (auto& b : dt_bias) {
                const double dt = std::max(std::exp(rng.uniform(std::log(1e-3), std::log(0.1))), 1e-4);
                b = float(dt + std::log(-std::expm1(-dt)));
            }
            add(M + "dt_proj.bias", {di}, dt_bias);
            std::vector<float> a_log(std::size_t(di) * s.d_state);  // S4D-real: A = -(1..d_state) per channel
            for (int c = 0; c < di; ++c)
                for (int n = 0; n < s.d_state; ++n) a_log[std::size_t(c) * s.d_state + n] = float(std::log(double(n + 1)));
            add(M + "A_log", {di, s.d_state}, a_log);
            add(M + "D", {di}, constant(std::size_t(di), 1.f));
            add(M + "out_proj.weight", {s.d_model, di}, kaiming(std::size_t(s.d_model) * di, di));
        }
        add("backbone.norm_f.weight", {s.d_model}, constant(std::size_t(s.d_model), 1.f));

        add("flow.in_proj.weight", {s.hidden, s.action_dim}, kaiming(std::size_t(s.hidden) * s.action_dim, s.action_dim));
        add("flow.time_proj.weight", {s.hidden, s.time_dim}, kaiming(std::size_t(s.hidden) * s.time_dim, s.time_dim));
        add("flow.cond_proj.weight", {s.hidden, s.d_model}, kaiming(std::size_t(s.hidden) * s.d_model, s.d_model));
        for (int l = 0; l < s.flow_layers; ++l)
            add("flow.layers." + std::to_string(l) + ".weight", {s.hidden, s.hidden}, kaiming(std::size_t(s.hidden) * s.hidden, s.hidden));
        add("flow.out_proj.weight", {s.action_dim, s.hidden}, kaiming(std::size_t(s.action_dim) * s.hidden, s.hidden));

        w.set_metadata("format", "pt");
        w.set_metadata("flowedge.model", "mamba_flow");
        w.set_metadata("flowedge.generator", "flowedge-make-demo-mamba-flow");
        w.set_metadata("flowedge.seed", std::to_string(seed));
        const std::filesystem::path path(out);
        if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
        w.write(path);
        std::cout << "wrote " << path.string() << " (" << n_params << " parameters, seed " << seed << ")\n";
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
