// The transformer's data-movement and pointwise ops: exact GELU, the feature-map transpose and ACT's 2-D sinusoidal
// position embedding. Kernel-set body: included once per instruction set by cpu/kernels.hpp.

/// y = x / 2 * (1 + erf(x / sqrt 2)) (torch.nn.functional.gelu, approximate='none'), evaluated in double.
inline void gelu(const GeluParams& p) {
    for (std::int64_t i = 0; i < p.n; ++i) {
        const double x = p.x[i];
        p.y[i] = float(0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440)));
    }
}

/// y[c, r] = x[r, c] for x: [rows, cols], in 32 x 32 tiles.
inline void transpose(const TransposeParams& p) {
    constexpr int kTile = 32;
    for (int r0 = 0; r0 < p.rows; r0 += kTile)
        for (int c0 = 0; c0 < p.cols; c0 += kTile) {
            const int r1 = std::min(p.rows, r0 + kTile), c1 = std::min(p.cols, c0 + kTile);
            for (int r = r0; r < r1; ++r)
                for (int c = c0; c < c1; ++c) p.y[std::size_t(c) * p.rows + r] = p.x[std::size_t(r) * p.cols + c];
        }
}

/// LeRobot's ACTSinusoidalPositionEmbedding2d, token-major (see PositionEmbedding2dParams). Every step is the float32
/// operation torch performs: range / (n + eps) * 2 pi, then / 10000^(2 floor(i/2) / half), then sin or cos.
inline void position_embedding_2d(const PositionEmbedding2dParams& p) {
    const int half = p.dim / 2;
    const auto embed = [&](float* out, int pos, int n) {
        const float angle = float(pos) / (float(n) + 1e-6f) * float(6.283185307179586);
        for (int i = 0; i < half; ++i) {
            const float expo = float(2 * (i / 2)) / float(half);
            const float inv_freq = std::pow(10000.f, expo);
            const float a = angle / inv_freq;
            out[i] = (i % 2 == 0) ? std::sin(a) : std::cos(a);
        }
    };
    for (int r = 0; r < p.h; ++r)
        for (int c = 0; c < p.w; ++c) {
            float* y = p.y + (std::size_t(r) * p.w + c) * std::size_t(p.dim);
            embed(y, r + 1, p.h);
            embed(y + half, c + 1, p.w);
        }
}
