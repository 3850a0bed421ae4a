// torch.nn.MaxPool2d (dilation 1, ceil_mode off) on the CPU. Kernel-set body: included once per instruction set by
// cpu/kernels.hpp; the argument checks are in Ops<Cpu>.

/// m replaced by v where `v > m || isnan(v)` (PyTorch's max-pool update; a NaN wins), one vector at a time.
#if FLOWEDGE_ISA_AVX512
inline VecF pool_max_update(VecF m, VecF v) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), m, v);
}
#elif FLOWEDGE_ISA_AVX2
inline VecF pool_max_update(VecF m, VecF v) {
    return _mm256_blendv_ps(m, v, _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
#endif
inline float pool_max_update(float m, float v) { return (v > m || std::isnan(v)) ? v : m; }

/// Input columns one pass of max_pool2d's column maxima covers.
inline constexpr int kPoolColumns = 1024;

/// y[b, c, r, q] = max over the window rows r*stride - pad + kh, columns q*stride - pad + kw inside the image. As
/// PyTorch's CPU kernel, a NaN replaces the running max (`val > max || isnan(val)`), so any NaN in the window wins;
/// padding never contributes (pad <= kernel / 2 leaves every window at least one pixel). Per output row: the maxima
/// down the window's rows for a run of input columns (vectors on the SIMD sets), then across each window's columns.
/// Equal values of either sign of zero may come out with the other sign than PyTorch's scan order gives.
inline void max_pool2d(const MaxPool2dParams& p) {
    const std::size_t in_plane = std::size_t(p.in_h) * p.in_w, out_plane = std::size_t(p.out_h) * p.out_w;
    const std::size_t planes = std::size_t(p.batch) * p.channels;
    // Output columns per pass: their windows span at most kPoolColumns input columns.
    const int qs = std::max(1, (kPoolColumns - p.kernel) / p.stride + 1);
    alignas(64) float col[kPoolColumns];
    for (std::size_t pl = 0; pl < planes; ++pl) {
        const float* x = p.x + pl * in_plane;
        float* y = p.y + pl * out_plane;
        for (int r = 0; r < p.out_h; ++r) {
            const int h0 = std::max(r * p.stride - p.pad, 0), h1 = std::min(r * p.stride - p.pad + p.kernel, p.in_h);
            for (int q0 = 0; q0 < p.out_w; q0 += qs) {
                const int q1 = std::min(p.out_w, q0 + qs);
                const int c0 = std::max(q0 * p.stride - p.pad, 0), c1 = std::min((q1 - 1) * p.stride - p.pad + p.kernel, p.in_w);
                const float* x0 = x + std::size_t(h0) * p.in_w + c0;
                int c = 0;
#if FLOWEDGE_ISA_SIMD
                for (; c < c1 - c0; c += kLanes) {
                    const int n = std::min(kLanes, c1 - c0 - c);
                    VecF m = packed::load_n(x0 + c, n);
                    for (int h = h0 + 1; h < h1; ++h) m = pool_max_update(m, packed::load_n(x0 + std::size_t(h - h0) * p.in_w + c, n));
                    packed::store_n(col + c, m, n);
                }
#endif
                for (; c < c1 - c0; ++c) {
                    float m = x0[c];
                    for (int h = h0 + 1; h < h1; ++h) m = pool_max_update(m, x0[std::size_t(h - h0) * p.in_w + c]);
                    col[c] = m;
                }
                for (int q = q0; q < q1; ++q) {
                    const int w0 = std::max(q * p.stride - p.pad, 0), w1 = std::min(q * p.stride - p.pad + p.kernel, p.in_w);
                    float m = col[w0 - c0];
                    for (int w = w0 + 1; w < w1; ++w) m = pool_max_update(m, col[w - c0]);
                    y[std::size_t(r) * p.out_w + q] = m;
                }
            }
        }
    }
}
