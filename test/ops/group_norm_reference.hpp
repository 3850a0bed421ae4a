// GroupNorm with the fused epilogue (affine -> act -> FiLM -> residual -> post act) in double, written from
// torch.nn.GroupNorm's definition: the reference of test_norm.cpp's group_norm and of test_conv1d.cpp's
// group_norm_conv1d (whose conv reads this output).
#pragma once
#include <cmath>
#include <cstddef>
#include <vector>

#include "ops_test_util.hpp"

namespace optest {

/// The inputs of one reference GroupNorm over x [batch, channels, length]; null pointers leave that part out.
struct GroupNormReference {
    int batch = 1, channels = 1, length = 1, groups = 1;
    const float* gamma = nullptr;  ///< [channels] with beta; null: no affine
    const float* beta = nullptr;
    Activation act = Activation::None;
    const float* film = nullptr;    ///< [batch, film_stride]: scale at [c], shift at [channels + c]
    int film_stride = 0;
    const float* shared = nullptr;  ///< [2 * channels] added to every batch row's FiLM (the U-Net's timestep part)
    const float* residual = nullptr;  ///< [batch, channels, length]
    Activation post = Activation::None;
};

/// value[i]: the reference output; scale[i]: a bound on the magnitudes its float computation rounds (+1: normalised
/// values are O(1), so an absolute floor).
inline void group_norm_reference(const GroupNormReference& r, const std::vector<float>& x, std::vector<double>& value,
                                 std::vector<double>& scale) {
    const std::size_t n = std::size_t(r.batch) * r.channels * r.length;
    value.assign(n, 0.0);
    scale.assign(n, 0.0);
    const int cpg = r.channels / r.groups;
    for (int b = 0; b < r.batch; ++b)
        for (int g = 0; g < r.groups; ++g) {
            const std::size_t base = (std::size_t(b) * r.channels + std::size_t(g) * cpg) * r.length;
            const std::size_t m = std::size_t(cpg) * r.length;
            double sum = 0, ss = 0;
            for (std::size_t i = 0; i < m; ++i) sum += x[base + i];
            const double mean = sum / double(m);
            for (std::size_t i = 0; i < m; ++i) ss += (x[base + i] - mean) * (x[base + i] - mean);
            const double rstd = 1 / std::sqrt(ss / double(m) + 1e-5);
            for (std::size_t j = 0; j < m; ++j) {
                const std::size_t i = base + j, c = std::size_t(g) * cpg + j / std::size_t(r.length);
                const double gm = r.gamma ? r.gamma[c] : 1.0, bt = r.beta ? r.beta[c] : 0.0;
                const double nrm = (x[i] - mean) * rstd;
                double a = ref_act(r.act, nrm * gm + bt);
                double sc = std::fabs(nrm * gm) + std::fabs(bt) + std::fabs(a);
                if (r.film) {
                    const float* f = r.film + std::size_t(b) * r.film_stride;
                    double fs = f[c], fb = f[std::size_t(r.channels) + c];
                    if (r.shared) {
                        fs += r.shared[c];
                        fb += r.shared[std::size_t(r.channels) + c];
                    }
                    a = fs * a + fb;
                    sc = sc * std::fabs(fs) + std::fabs(fb);
                }
                if (r.residual) {
                    a += r.residual[i];
                    sc += std::fabs(r.residual[i]);
                }
                value[i] = ref_act(r.post, a);
                scale[i] = sc + 1.0;
            }
        }
}

}  // namespace optest
