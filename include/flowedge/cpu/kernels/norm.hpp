// GroupNorm (+ activation, FiLM, residual) and RMSNorm. Kernel-set body: included once per instruction set by
// cpu/kernels.hpp; the argument checks are in Ops<Cpu> (cpu/ops.hpp).
/// sum_{i < n} x[i] and sum_{i < n} (x[i] - mean)^2 in double: four chains of double lanes on the SIMD sets (the
/// widening is exact, so only the order of the additions, and the squares fused into them, differ from a scalar loop).
inline double sum_f64(const float* x, std::size_t n) {
    std::size_t i = 0;
    double s = 0;
#if FLOWEDGE_ISA_AVX512
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm256_loadu_ps(x + i)));
        a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8)));
        a2 = _mm512_add_pd(a2, _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16)));
        a3 = _mm512_add_pd(a3, _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24)));
    }
    s = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
#elif FLOWEDGE_ISA_AVX2
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm_loadu_ps(x + i)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)));
        a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)));
        a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12)));
    }
    alignas(32) double t[4];
    _mm256_store_pd(t, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
    s = (t[0] + t[1]) + (t[2] + t[3]);
#endif
    for (; i < n; ++i) s += x[i];
    return s;
}
inline double sum_sq_dev_f64(const float* x, std::size_t n, double mean) {
    std::size_t i = 0;
    double s = 0;
#if FLOWEDGE_ISA_AVX512
    const __m512d m = _mm512_set1_pd(mean);
    __m512d a0 = _mm512_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    auto dev = [&](std::size_t k) { return _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + k)), m); };
    for (; i + 32 <= n; i += 32) {
        const __m512d d0 = dev(i), d1 = dev(i + 8), d2 = dev(i + 16), d3 = dev(i + 24);
        a0 = _mm512_fmadd_pd(d0, d0, a0);
        a1 = _mm512_fmadd_pd(d1, d1, a1);
        a2 = _mm512_fmadd_pd(d2, d2, a2);
        a3 = _mm512_fmadd_pd(d3, d3, a3);
    }
    s = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
#elif FLOWEDGE_ISA_AVX2
    const __m256d m = _mm256_set1_pd(mean);
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    auto dev = [&](std::size_t k) { return _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k)), m); };
    for (; i + 16 <= n; i += 16) {
        const __m256d d0 = dev(i), d1 = dev(i + 4), d2 = dev(i + 8), d3 = dev(i + 12);
        a0 = _mm256_fmadd_pd(d0, d0, a0);
        a1 = _mm256_fmadd_pd(d1, d1, a1);
        a2 = _mm256_fmadd_pd(d2, d2, a2);
        a3 = _mm256_fmadd_pd(d3, d3, a3);
    }
    alignas(32) double t[4];
    _mm256_store_pd(t, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
    s = (t[0] + t[1]) + (t[2] + t[3]);
#endif
    for (; i < n; ++i) {
        const double d = x[i] - mean;
        s += d * d;
    }
    return s;
}

/// Element i of batch row b's FiLM vector (scale at c, bias at channels + c): film, plus the shared row if set.
inline float film_term(const GroupNormParams& p, int b, std::size_t stride, std::size_t i) {
    const float f = p.film[std::size_t(b) * stride + i];
    return p.film_shared ? f + p.film_shared[i] : f;
}

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
            const double mean = sum_f64(xg, n) / count;
            const float rstd = float(1.0 / std::sqrt(sum_sq_dev_f64(xg, n, mean) / count + double(p.eps)));
            const float meanf = float(mean);
#if FLOWEDGE_ISA_SIMD
            // One pass per channel: affine, activation, FiLM, residual and post-activation in registers (y may alias x).
            for (int cc = 0; cc < cpg; ++cc) {
                const int c = g * cpg + cc;
                const VecF neg_mean = vset1(-meanf), scale = vset1(p.gamma ? p.gamma[c] * rstd : rstd);
                const VecF shift = vset1(p.beta ? p.beta[c] : 0.f);
                VecF fs = vset1(1.f), fb = vzero();
                if (p.film) {
                    fs = vset1(film_term(p, b, fstride, std::size_t(c)));
                    fb = vset1(film_term(p, b, fstride, std::size_t(p.channels) + std::size_t(c)));
                }
                const std::size_t off = base + std::size_t(cc) * L;
                for (int t = 0; t < L; t += kLanes) {
                    const int m = std::min(kLanes, L - t);
                    VecF a = vfma(vadd(packed::load_n(p.x + off + t, m), neg_mean), scale, shift);
                    a = activate_vector(p.act, a);
                    if (p.film) a = vfma(fs, a, fb);
                    if (p.residual) a = vadd(a, packed::load_n(p.residual + off + t, m));
                    packed::store_n(p.y + off + t, activate_vector(p.post_act, a), m);
                }
            }
#else
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
                        fs = film_term(p, b, fstride, std::size_t(c));
                        fb = film_term(p, b, fstride, std::size_t(p.channels) + std::size_t(c));
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
#endif
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
