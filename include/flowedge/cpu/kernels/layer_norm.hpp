// LayerNorm (with the residual add of a post-norm transformer block fused in). Kernel-set body: included once per
// instruction set by cpu/kernels.hpp; the argument checks are in Ops<Cpu> (cpu/ops.hpp).

/// torch.nn.LayerNorm(dim, eps) of x (+ residual), per row; statistics in double. x, residual, y: [rows, dim].
inline void layer_norm(const LayerNormParams& p) {
    const std::size_t D = std::size_t(p.dim);
    for (int r = 0; r < p.rows; ++r) {
        const float* x = p.x + std::size_t(r) * D;
        const float* res = p.residual ? p.residual + std::size_t(r) * D : nullptr;
        float* y = p.y + std::size_t(r) * D;
        // The sum is formed in float32 as torch does (skip + x), then reduced in double.
        const auto at = [&](std::size_t i) { return res ? x[i] + res[i] : x[i]; };
        double sum = 0;
        for (std::size_t i = 0; i < D; ++i) sum += at(i);
        const double mean = sum / double(D);
        double ss = 0;
        for (std::size_t i = 0; i < D; ++i) {
            const double d = double(at(i)) - mean;
            ss += d * d;
        }
        const double rstd = 1.0 / std::sqrt(ss / double(D) + double(p.eps));
        // Each y[i] is written after its own inputs are read, so y may alias x or the residual.
        for (std::size_t i = 0; i < D; ++i) {
            const double n = (double(at(i)) - mean) * rstd;
            y[i] = float(n * (p.gamma ? double(p.gamma[i]) : 1.0) + (p.beta ? double(p.beta[i]) : 0.0));
        }
    }
}
