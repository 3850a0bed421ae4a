// GroupNorm (+ activation, FiLM, residual) and RMSNorm. Kernel-set body: included once per instruction set by
// cpu/kernels.hpp; the argument checks are in Ops<Cpu> (cpu/ops.hpp).
/// torch.nn.GroupNorm + fused act -> FiLM (scale * a + bias) -> residual -> post_act epilogue. Statistics in double.
inline void group_norm(const GroupNormParams& p) {
    const int cpg = p.channels / p.groups, L = p.length;
    const std::size_t fstride = p.film_stride ? std::size_t(p.film_stride) : 2 * std::size_t(p.channels);
    const double count = double(cpg) * L;
    for (int b = 0; b < p.batch; ++b) {
        for (int g = 0; g < p.groups; ++g) {
            const std::size_t base = (std::size_t(b) * p.channels + std::size_t(g) * cpg) * L;
            const float* xg = p.x + base;
            const std::size_t n = std::size_t(cpg) * L;
            double sum = 0;
            for (std::size_t i = 0; i < n; ++i) sum += xg[i];
            const double mean = sum / count;
            double ss = 0;
            for (std::size_t i = 0; i < n; ++i) {
                const double d = xg[i] - mean;
                ss += d * d;
            }
            const float rstd = float(1.0 / std::sqrt(ss / count + double(p.eps)));
            const float meanf = float(mean);
            // Three passes over the group (contiguous in y): affine, activation over the whole group at once
            // (vectorised Mish: the U-Net's every GroupNorm), then FiLM and residual. y may alias x.
            for (int cc = 0; cc < cpg; ++cc) {
                const int c = g * cpg + cc;
                const float scale = p.gamma ? p.gamma[c] * rstd : rstd;
                const float shift = p.beta ? p.beta[c] : 0.f;
                const std::size_t off = base + std::size_t(cc) * L;
                for (int t = 0; t < L; ++t) p.y[off + t] = (p.x[off + t] - meanf) * scale + shift;
            }
            activate_inplace(p.act, p.y + base, static_cast<long long>(n));
            if (p.film || p.residual) {
                for (int cc = 0; cc < cpg; ++cc) {
                    const int c = g * cpg + cc;
                    float fs = 1.f, fb = 0.f;
                    if (p.film) {
                        fs = p.film[std::size_t(b) * fstride + std::size_t(c)];
                        fb = p.film[std::size_t(b) * fstride + std::size_t(p.channels) + std::size_t(c)];
                    }
                    const std::size_t off = base + std::size_t(cc) * L;
                    for (int t = 0; t < L; ++t) {
                        float a = p.y[off + t];
                        if (p.film) a = fs * a + fb;
                        if (p.residual) a += p.residual[off + t];
                        p.y[off + t] = a;
                    }
                }
            }
            activate_inplace(p.post_act, p.y + base, static_cast<long long>(n));
        }
    }
}

/// Mamba RMSNorm: y = x / sqrt(mean(x^2) + eps) * weight, per row. x, y: [rows, dim].
inline void rms_norm(const RmsNormParams& p) {
    for (int r = 0; r < p.rows; ++r) {
        const float* x = p.x + std::size_t(r) * p.dim;
        float* y = p.y + std::size_t(r) * p.dim;
        double ss = 0;
        int i = 0;
#if FLOWEDGE_ISA_AVX512
        // Sum of squares in double, 8 lanes at a time (two chains); the scale pass 16 floats at a time.
        __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
        for (; i + 16 <= p.dim; i += 16) {
            const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
            s0 = _mm512_fmadd_pd(a, a, s0);
            s1 = _mm512_fmadd_pd(b, b, s1);
        }
        ss = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
#elif FLOWEDGE_ISA_AVX2
        // Sum of squares in double, 4 lanes per chain, 4 chains (16 floats per step; the products are exact in
        // double, so only the order of the additions differs from the scalar loop).
        __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
        for (; i + 16 <= p.dim; i += 16) {
            const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
            const __m256d c = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), d = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
            s0 = _mm256_fmadd_pd(a, a, s0);
            s1 = _mm256_fmadd_pd(b, b, s1);
            s2 = _mm256_fmadd_pd(c, c, s2);
            s3 = _mm256_fmadd_pd(d, d, s3);
        }
        const __m256d s = _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3));
        const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
        ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
#endif
        for (; i < p.dim; ++i) ss += double(x[i]) * x[i];
        const float inv = float(1.0 / std::sqrt(ss / p.dim + double(p.eps)));
        i = 0;
#if FLOWEDGE_ISA_AVX512
        const __m512 vinv = _mm512_set1_ps(inv);
        for (; i + 16 <= p.dim; i += 16) {
            const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vinv);
            _mm512_storeu_ps(y + i, p.weight ? _mm512_mul_ps(v, _mm512_loadu_ps(p.weight + i)) : v);
        }
#elif FLOWEDGE_ISA_AVX2
        // (x * inv) * weight, 8 floats at a time: the scalar loop's order.
        const __m256 vinv = _mm256_set1_ps(inv);
        for (; i + 8 <= p.dim; i += 8) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
            _mm256_storeu_ps(y + i, p.weight ? _mm256_mul_ps(v, _mm256_loadu_ps(p.weight + i)) : v);
        }
#endif
        for (; i < p.dim; ++i) y[i] = x[i] * inv * (p.weight ? p.weight[i] : 1.f);
    }
}
