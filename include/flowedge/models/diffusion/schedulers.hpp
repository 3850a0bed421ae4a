// Host-side DDIM / DDPM scheduler arithmetic (diffusers semantics as LeRobot configures them, docs/models.md#schedulers).
#pragma once
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/op_params.hpp"

namespace flowedge {

/// Which sampler a DiffusionHead runs.
enum class Scheduler : std::uint8_t { Ddim = 0, Ddpm = 1 };

/// "ddim" / "ddpm".
constexpr const char* scheduler_name(Scheduler s) { return s == Scheduler::Ddim ? "ddim" : "ddpm"; }

/// Parses "ddim" / "ddpm" (also diffusers' "DDIM" / "DDPM"); anything else is an error naming the value.
inline Scheduler parse_scheduler(std::string_view name) {
    std::string lower(name);
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "ddim") return Scheduler::Ddim;
    if (lower == "ddpm") return Scheduler::Ddpm;
    fail("scheduler", "unknown scheduler '" + std::string(name) + "'" + expected_got("ddim or ddpm", std::string(name)));
}

/// squaredcos_cap_v2 noise schedule: betas computed in double and stored as float32, alphas_cumprod as the
/// float32 running product of (1 - beta) (torch.cumprod on a float32 tensor).
class NoiseSchedule {
public:
    NoiseSchedule() = default;
    /// Tables for T = num_train_timesteps (allocated here, at load).
    explicit NoiseSchedule(int num_train_timesteps) {
        check(num_train_timesteps >= 1, "scheduler",
              "num_train_timesteps must be positive" + expected_got(">= 1", num_train_timesteps));
        const int T = num_train_timesteps;
        auto abar = [](double tau) {
            const double c = std::cos((tau + 0.008) / 1.008 * 3.14159265358979323846 / 2.0);
            return c * c;
        };
        m_betas.resize(std::size_t(T));
        m_alphas_cumprod.resize(std::size_t(T));
        float prod = 1.f;
        for (int i = 0; i < T; ++i) {
            const double beta = std::min(1.0 - abar(double(i + 1) / T) / abar(double(i) / T), 0.999);
            m_betas[std::size_t(i)] = float(beta);
            prod = prod * (1.f - m_betas[std::size_t(i)]);
            m_alphas_cumprod[std::size_t(i)] = prod;
        }
    }

    int num_train_timesteps() const { return int(m_betas.size()); }
    const std::vector<float>& betas() const { return m_betas; }
    const std::vector<float>& alphas_cumprod() const { return m_alphas_cumprod; }

    /// "leading" spacing: step i of n runs at t_i = (n-1-i) * (T / n). n must be in [1, T].
    int timestep(int i, int n_steps) const { return (n_steps - 1 - i) * (num_train_timesteps() / n_steps); }

    /// Throws unless 1 <= n_steps <= T.
    void check_steps(int n_steps) const {
        if (!(n_steps >= 1 && n_steps <= num_train_timesteps())) [[unlikely]] fail("scheduler",
              "steps out of range" + expected_got("1.." + std::to_string(num_train_timesteps()), n_steps));
    }

    /// Fills the per-step scalar coefficients of DiffusionStepParams for step i of an n-step run, computed in
    /// float32 in the order diffusers evaluates them (no allocation). Also returns whether noise is added
    /// (DDPM with prev >= 0).
    bool step_coefficients(Scheduler kind, int i, int n_steps, DiffusionStepParams& p) const {
        const int T = num_train_timesteps();
        const int ratio = T / n_steps;
        const int t = timestep(i, n_steps);
        const int prev = t - ratio;
        const float abar_t = m_alphas_cumprod[std::size_t(t)];
        const float abar_prev = prev >= 0 ? m_alphas_cumprod[std::size_t(prev)] : 1.f;
        const float beta_prod_t = 1.f - abar_t;
        p.sqrt_abar = std::sqrt(abar_t);
        p.sqrt_one_minus_abar = std::sqrt(beta_prod_t);
        if (kind == Scheduler::Ddim) {
            p.kind = StepKind::Ddim;
            p.c_x0 = std::sqrt(abar_prev);
            p.c_other = std::sqrt(1.f - abar_prev);  // eta = 0: std_dev_t = 0
            p.noise_std = 0.f;
            return false;
        }
        p.kind = StepKind::Ddpm;
        const float beta_prod_prev = 1.f - abar_prev;
        const float current_alpha = abar_t / abar_prev;
        const float current_beta = 1.f - current_alpha;
        p.c_x0 = (std::sqrt(abar_prev) * current_beta) / beta_prod_t;
        p.c_other = std::sqrt(current_alpha) * beta_prod_prev / beta_prod_t;
        if (prev >= 0) {
            float variance = (1.f - abar_prev) / (1.f - abar_t) * current_beta;
            variance = std::max(variance, 1e-20f);
            p.noise_std = std::sqrt(variance);
            return true;
        }
        p.noise_std = 0.f;
        return false;
    }

private:
    std::vector<float> m_betas;
    std::vector<float> m_alphas_cumprod;
};

}  // namespace flowedge
