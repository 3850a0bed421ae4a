// torch.nn.MaxPool2d (dilation 1, ceil_mode off) on the CPU. Kernel-set body: included once per instruction set by
// cpu/kernels.hpp; the argument checks are in Ops<Cpu>.

/// y[b, c, r, q] = max over the window rows r*stride - pad + kh, columns q*stride - pad + kw inside the image. As
/// PyTorch's CPU kernel, a NaN replaces the running max (`val > max || isnan(val)`), so any NaN in the window wins;
/// padding never contributes (pad <= kernel / 2 leaves every window at least one pixel).
inline void max_pool2d(const MaxPool2dParams& p) {
    const std::size_t in_plane = std::size_t(p.in_h) * p.in_w, out_plane = std::size_t(p.out_h) * p.out_w;
    const std::size_t planes = std::size_t(p.batch) * p.channels;
    for (std::size_t pl = 0; pl < planes; ++pl) {
        const float* x = p.x + pl * in_plane;
        float* y = p.y + pl * out_plane;
        for (int r = 0; r < p.out_h; ++r) {
            const int h0 = std::max(r * p.stride - p.pad, 0), h1 = std::min(r * p.stride - p.pad + p.kernel, p.in_h);
            for (int q = 0; q < p.out_w; ++q) {
                const int w0 = std::max(q * p.stride - p.pad, 0), w1 = std::min(q * p.stride - p.pad + p.kernel, p.in_w);
                float m = -INFINITY;
                for (int h = h0; h < h1; ++h) {
                    const float* xr = x + std::size_t(h) * p.in_w;
                    for (int w = w0; w < w1; ++w) {
                        const float v = xr[w];
                        if (v > m || std::isnan(v)) m = v;
                    }
                }
                y[std::size_t(r) * p.out_w + q] = m;
            }
        }
    }
}
