// LayerNorm (with the residual add of a post-norm transformer block fused in). Kernel-set body: included once per
// instruction set by cpu/kernels.hpp; the argument checks are in Ops<Cpu> (cpu/ops.hpp).

/// Rows one pass of layer_norm_rows normalises together: each row's sums are one dependent chain of double adds
/// (latency 4), so eight rows side by side keep both adders busy where one row alone waits on every add.
inline constexpr int kLayerNormRows = 8;

/// torch.nn.LayerNorm(dim, eps) of R rows from r0 of x (+ residual); statistics in double, each row's sums in
/// element order (the same arithmetic at any R).
template <int R>
inline void layer_norm_rows(const LayerNormParams& p, int r0) {
    const std::size_t D = std::size_t(p.dim);
    const float* src[R];
    float* y[R];
    for (int r = 0; r < R; ++r) {
        const float* x = p.x + std::size_t(r0 + r) * D;
        y[r] = p.y + std::size_t(r0 + r) * D;
        src[r] = x;
        if (p.residual) {
            // The sum is formed in float32 as torch does (skip + x), then reduced in double; it goes through y (each
            // y[i] written after its own inputs are read, so y may alias x or the residual, row for row).
            const float* res = p.residual + std::size_t(r0 + r) * D;
            for (std::size_t i = 0; i < D; ++i) y[r][i] = x[i] + res[i];
            src[r] = y[r];
        }
    }
    double sum[R], ss[R], mean[R], rstd[R];
    for (int r = 0; r < R; ++r) sum[r] = ss[r] = 0;
    for (std::size_t i = 0; i < D; ++i)
        for (int r = 0; r < R; ++r) sum[r] += double(src[r][i]);
    for (int r = 0; r < R; ++r) mean[r] = sum[r] / double(D);
    for (std::size_t i = 0; i < D; ++i)
        for (int r = 0; r < R; ++r) {
            const double d = double(src[r][i]) - mean[r];
            ss[r] += d * d;
        }
    for (int r = 0; r < R; ++r) rstd[r] = 1.0 / std::sqrt(ss[r] / double(D) + double(p.eps));
    for (int r = 0; r < R; ++r) {
        const float* s = src[r];
        float* out = y[r];
        const double m = mean[r], rs = rstd[r];
        if (p.gamma && p.beta) {
            for (std::size_t i = 0; i < D; ++i) out[i] = float((double(s[i]) - m) * rs * double(p.gamma[i]) + double(p.beta[i]));
        } else {
            for (std::size_t i = 0; i < D; ++i) {
                const double n = (double(s[i]) - m) * rs;
                out[i] = float(n * (p.gamma ? double(p.gamma[i]) : 1.0) + (p.beta ? double(p.beta[i]) : 0.0));
            }
        }
    }
}

/// torch.nn.LayerNorm(dim, eps) of x (+ residual), per row; statistics in double. x, residual, y: [rows, dim].
inline void layer_norm(const LayerNormParams& p) {
    int r = 0;
    for (; r + kLayerNormRows <= p.rows; r += kLayerNormRows) layer_norm_rows<kLayerNormRows>(p, r);
    for (; r < p.rows; ++r) layer_norm_rows<1>(p, r);
}
