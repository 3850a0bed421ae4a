// Mamba-1's causal depthwise conv + SiLU and selective scan. Kernel-set body: included once per instruction set by
// cpu/kernels.hpp; the argument checks are in Ops<Cpu> (cpu/ops.hpp).
#if FLOWEDGE_ISA_AVX512
/// 2^f for 16 floats f in [-1/2, 1/2]: a degree-6 polynomial fitted for minimal relative error (2e-9).
inline __m512 mamba_exp2_reduced(__m512 f) {
    __m512 p = _mm512_set1_ps(1.5353350318e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398875017e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6184378490e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503323674e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022647738e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718246e-1f));
    return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
}

/// 2^x for 16 floats x <= 0 (the scan's decays exp(dt A) = 2^(dt log2(e) A), dt >= 0, A < 0): n = round(x), 2^(x - n)
/// by a degree-5 polynomial on [-1/2, 1/2] (fitted for minimal relative error, 9e-8), scaled by 2^n with vscalefps
/// (0 below 2^-149, so x <= 0 needs no clamp). The rounding of dt log2(e) adds |dt A| 2^-24 relative; the error
/// bounds are in docs/numerics.md#vector-math-functions. Fewer vector operations than vexp: the scan is bound on its
/// FP pipes.
inline __m512 scan_exp2_nonpositive(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.3264708687e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6715111285e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5507339537e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022242427e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314700365e-1f));
    return _mm512_scalef_ps(_mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f)), n);
}

/// exp(x) for 16 floats: x clamped to [-104, 88.7] (a NaN stays NaN), reduced by ln 2 in two parts (as vexp), 2^f of
/// the remainder by mamba_exp2_reduced, scaled by vscalefps; vexp's accuracy in fewer operations.
inline __m512 mamba_exp(__m512 x) {
    const __m512 m = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-104.f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(m, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), m);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    return _mm512_scalef_ps(mamba_exp2_reduced(_mm512_mul_ps(r, _mm512_set1_ps(1.44269504088896341f))), n);
}

/// SiLU of 16 floats, x / (1 + exp(-x)), on mamba_exp (the causal conv's output and the scan's gate).
inline __m512 mamba_silu(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), mamba_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

/// Softplus (beta 1, threshold 20) of 16 dt values: max(x, 0) + log1p(e), e = mamba_exp(-|x|) in (0, 1], with
/// log1p(e) = 2 atanh(s), s = e / (2 + e) in (0, 1/3], by its odd series to s^15 (truncated below 2e-9 relative);
/// x itself above 20. A few 2^-24 relative (docs/numerics.md#vector-math-functions); NaN stays NaN,
/// softplus(-inf) = 0, softplus(+inf) = inf. About 25 vector operations where vsoftplus takes 40.
inline __m512 scan_softplus(__m512 x) {
    const __m512 e = mamba_exp(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
    const __m512 s = _mm512_div_ps(e, _mm512_add_ps(e, _mm512_set1_ps(2.f)));
    const __m512 z = _mm512_mul_ps(s, s);
    __m512 q = _mm512_set1_ps(1.f / 15.f);
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.f / 13.f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.f / 11.f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.f / 9.f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.f / 7.f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.f / 5.f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.f / 3.f));
    q = _mm512_fmadd_ps(q, z, _mm512_set1_ps(1.f));
    const __m512 y = _mm512_add_ps(_mm512_max_ps(_mm512_setzero_ps(), x), _mm512_mul_ps(_mm512_add_ps(s, s), q));
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(20.f), _CMP_GT_OQ), x);
}
#endif

#if FLOWEDGE_ISA_AVX512
/// Lane k: sum over n of sn[k][n] C[n], for the 16 state vectors of a 16-channel block (vsum16's transpose-add tree,
/// whose first level adds lanes 2i and 2i+1 of unpacked pairs; C is unpacked once per token the same way, so that
/// level is a mul and an fma on the states instead of 2 muls and an add).
/// clo = unpacklo(C, C), chi = unpackhi(C, C).
inline __m512 scan_dot16(const __m512 (&sn)[16], __m512 clo, __m512 chi) {
    __m512 s[8], u[4];
    for (int k = 0; k < 8; ++k)
        s[k] = _mm512_fmadd_ps(_mm512_unpackhi_ps(sn[2 * k], sn[2 * k + 1]), chi,
                               _mm512_mul_ps(_mm512_unpacklo_ps(sn[2 * k], sn[2 * k + 1]), clo));
    for (int m = 0; m < 4; ++m)
        u[m] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * m], s[2 * m + 1], 0x44), _mm512_shuffle_ps(s[2 * m], s[2 * m + 1], 0xEE));
    const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}
#endif

#if FLOWEDGE_ISA_AVX2
/// 2^x for 8 floats x <= 0 in each of N vectors (in place), the AVX-512 scan_exp2_nonpositive's polynomial on the
/// same n = round(x), f = x - n. Without vscalefps, 2^n goes into the exponent bits, which needs a normal result: x is
/// clamped at -125 first (NaN stays NaN), so a decay below 2^-125 comes out as 2^-125 (an absolute error under 3e-38
/// of the state it scales). 13 vector operations where vexp takes 21. The N vectors go step by step together, so
/// independent chains sit side by side in the instruction stream (bench/results/mamba_flow_cpu.md, session 24).
template <int N>
[[gnu::always_inline]] inline void scan_exp2_nonpositive(__m256 (&x)[N]) {
    __m256 n[N], p[N];
    for (int i = 0; i < N; ++i) x[i] = _mm256_max_ps(_mm256_set1_ps(-125.f), x[i]);
    for (int i = 0; i < N; ++i) n[i] = _mm256_round_ps(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    for (int i = 0; i < N; ++i) x[i] = _mm256_sub_ps(x[i], n[i]);
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(_mm256_set1_ps(1.3264708687e-3f), x[i], _mm256_set1_ps(9.6715111285e-3f));
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], x[i], _mm256_set1_ps(5.5507339537e-2f));
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], x[i], _mm256_set1_ps(2.4022242427e-1f));
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], x[i], _mm256_set1_ps(6.9314700365e-1f));
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], x[i], _mm256_set1_ps(1.f));  // in [2^-1/2, 2^1/2]
    for (int i = 0; i < N; ++i)  // times 2^n, n >= -125: stays normal
        x[i] = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p[i]), _mm256_slli_epi32(_mm256_cvtps_epi32(n[i]), 23)));
}

/// exp(x) for 8 floats in each of N vectors (in place), vexp's reduction and polynomial (the same bits wherever vexp
/// takes its exponent-add path), with x clamped to [-86, 88] so that path always applies: exp of x below -86 comes out
/// as exp(-86) (under 5e-38; NaN stays NaN). Step by step over the N vectors, as scan_exp2_nonpositive.
template <int N>
[[gnu::always_inline]] inline void scan_exp(__m256 (&x)[N]) {
    __m256 n[N], r[N], p[N];
    for (int i = 0; i < N; ++i) x[i] = _mm256_min_ps(_mm256_set1_ps(88.f), _mm256_max_ps(_mm256_set1_ps(-86.f), x[i]));
    for (int i = 0; i < N; ++i)
        n[i] = _mm256_round_ps(_mm256_mul_ps(x[i], _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    for (int i = 0; i < N; ++i) r[i] = _mm256_fnmadd_ps(n[i], _mm256_set1_ps(0.693359375f), x[i]);
    for (int i = 0; i < N; ++i) r[i] = _mm256_fnmadd_ps(n[i], _mm256_set1_ps(-2.12194440e-4f), r[i]);
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(_mm256_set1_ps(1.9875691500e-4f), r[i], _mm256_set1_ps(1.3981999507e-3f));
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], r[i], _mm256_set1_ps(8.3334519073e-3f));
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], r[i], _mm256_set1_ps(4.1665795894e-2f));
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], r[i], _mm256_set1_ps(1.6666665459e-1f));
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], r[i], _mm256_set1_ps(5.0000001201e-1f));
    for (int i = 0; i < N; ++i)
        p[i] = _mm256_add_ps(_mm256_fmadd_ps(p[i], _mm256_mul_ps(r[i], r[i]), r[i]), _mm256_set1_ps(1.f));
    for (int i = 0; i < N; ++i)
        x[i] = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p[i]), _mm256_slli_epi32(_mm256_cvtps_epi32(n[i]), 23)));
}

/// Softplus (beta 1, threshold 20) of N vectors of dt values (in place), the AVX-512 scan_softplus's formula: max(x, 0)
/// + log1p(e), e = exp(-|x|) (scan_exp), log1p(e) = 2 atanh(s), s = e / (2 + e), by its odd series to s^15; x itself
/// above 20. About 35 vector operations where vsoftplus takes 55.
template <int N>
[[gnu::always_inline]] inline void scan_softplus(__m256 (&x)[N]) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    __m256 e[N], s[N], z[N], q[N];
    for (int i = 0; i < N; ++i) e[i] = _mm256_or_ps(x[i], sign);  // -|x|
    scan_exp(e);
    for (int i = 0; i < N; ++i) s[i] = _mm256_div_ps(e[i], _mm256_add_ps(e[i], _mm256_set1_ps(2.f)));
    for (int i = 0; i < N; ++i) z[i] = _mm256_mul_ps(s[i], s[i]);
    for (int i = 0; i < N; ++i) q[i] = _mm256_fmadd_ps(_mm256_set1_ps(1.f / 15.f), z[i], _mm256_set1_ps(1.f / 13.f));
    for (int i = 0; i < N; ++i) q[i] = _mm256_fmadd_ps(q[i], z[i], _mm256_set1_ps(1.f / 11.f));
    for (int i = 0; i < N; ++i) q[i] = _mm256_fmadd_ps(q[i], z[i], _mm256_set1_ps(1.f / 9.f));
    for (int i = 0; i < N; ++i) q[i] = _mm256_fmadd_ps(q[i], z[i], _mm256_set1_ps(1.f / 7.f));
    for (int i = 0; i < N; ++i) q[i] = _mm256_fmadd_ps(q[i], z[i], _mm256_set1_ps(1.f / 5.f));
    for (int i = 0; i < N; ++i) q[i] = _mm256_fmadd_ps(q[i], z[i], _mm256_set1_ps(1.f / 3.f));
    for (int i = 0; i < N; ++i) q[i] = _mm256_fmadd_ps(q[i], z[i], _mm256_set1_ps(1.f));
    for (int i = 0; i < N; ++i) {
        const __m256 y = _mm256_add_ps(_mm256_max_ps(_mm256_setzero_ps(), x[i]), _mm256_mul_ps(_mm256_add_ps(s[i], s[i]), q[i]));
        x[i] = _mm256_blendv_ps(y, x[i], _mm256_cmp_ps(x[i], _mm256_set1_ps(20.f), _CMP_GT_OQ));
    }
}

/// SiLU of N vectors (in place), x / (1 + exp(-x)) on scan_exp: the scan's gate.
template <int N>
[[gnu::always_inline]] inline void scan_silu(__m256 (&x)[N]) {
    __m256 e[N];
    for (int i = 0; i < N; ++i) e[i] = _mm256_sub_ps(_mm256_setzero_ps(), x[i]);
    scan_exp(e);
    for (int i = 0; i < N; ++i) x[i] = _mm256_div_ps(x[i], _mm256_add_ps(_mm256_set1_ps(1.f), e[i]));
}
#endif

/// Mamba causal depthwise conv + SiLU with a rolling (kernel-1)-row history in `state`. The SIMD sets take a block
/// of channels at a time through every token (the block's taps are arranged once, not once per token) and apply the
/// SiLU in registers; the multiply-add order per output is the scalar loop's (bias, then taps 0..K-1).
inline void causal_conv(const CausalConvParams& p) {
    const int K = p.kernel, C = p.channels, L = p.length, H = K - 1;
    const std::size_t ldx = p.ld_x ? std::size_t(p.ld_x) : std::size_t(C);
    // Row `row` of xx = [state ; x] from channel 0.
    auto xx_row = [&](int row) -> const float* {
        return row < H ? p.state + std::size_t(row) * C : p.x + std::size_t(row - H) * ldx;
    };
    with_weights(p.w, [&](auto w) {
        int c0 = 0;
#if FLOWEDGE_ISA_AVX512
        // 16 channels at a time.
        if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(w)>>, float>) {
            const __m512i lane_k = _mm512_mullo_epi32(
                _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(K));
            const bool ping = packed::amx_ping_ready();  // x_proj follows on AMX (kernels/packed_linear.hpp)
            for (; c0 + 16 <= C; c0 += 16) {
                if (ping && c0 % packed::kAmxPingChannels == 0) packed::amx_ping();
                const __m512 b = p.bias ? _mm512_loadu_ps(p.bias + c0) : _mm512_setzero_ps();
                if (K == 4) {
                    // The 16 x 4 weight block is 4 vectors; tap k of channels 0..7 comes from the first two, of
                    // channels 8..15 from the last two (two lane permutes and a 256-bit merge per tap).
                    const float* wb = w + std::size_t(c0) * 4;
                    const __m512 a0 = _mm512_loadu_ps(wb), a1 = _mm512_loadu_ps(wb + 16);
                    const __m512 a2 = _mm512_loadu_ps(wb + 32), a3 = _mm512_loadu_ps(wb + 48);
                    __m512 wk[4];
                    for (int k = 0; k < 4; ++k) {
                        const __m512i idx = _mm512_add_epi32(
                            _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0), _mm512_set1_epi32(k));
                        wk[k] = _mm512_shuffle_f32x4(_mm512_permutex2var_ps(a0, idx, a1), _mm512_permutex2var_ps(a2, idx, a3), 0x44);
                    }
                    for (int t = 0; t < L; ++t) {
                        __m512 acc = b;
                        for (int k = 0; k < 4; ++k) acc = _mm512_fmadd_ps(wk[k], _mm512_loadu_ps(xx_row(t + k) + c0), acc);
                        _mm512_storeu_ps(p.u + std::size_t(t) * C + c0, mamba_silu(acc));
                    }
                    continue;
                }
                for (int t = 0; t < L; ++t) {
                    __m512 acc = b;
                    for (int k = 0; k < K; ++k) {
                        const __m512 wk = _mm512_i32gather_ps(lane_k, w + std::size_t(c0) * K + k, 4);
                        acc = _mm512_fmadd_ps(wk, _mm512_loadu_ps(xx_row(t + k) + c0), acc);
                    }
                    _mm512_storeu_ps(p.u + std::size_t(t) * C + c0, mamba_silu(acc));
                }
            }
        }
#elif FLOWEDGE_ISA_AVX2
        // 8 channels at a time.
        if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(w)>>, float>) {
            const __m256i lane_k = _mm256_mullo_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_epi32(K));
            for (; c0 + 8 <= C; c0 += 8) {
                const __m256 b = p.bias ? _mm256_loadu_ps(p.bias + c0) : _mm256_setzero_ps();
                if (K == 4) {
                    // The 8 x 4 weight block [c][k] as rows [c | c + 4] (128-bit halves), then a 4 x 4 transpose in
                    // each half: wk[k] = tap k of channels 0..3 | 4..7 (12 shuffles, no gather).
                    const float* wb = w + std::size_t(c0) * 4;
                    __m256 r[4], wk[4];
                    for (int j = 0; j < 4; ++j)
                        r[j] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(wb + 4 * j)), _mm_loadu_ps(wb + 16 + 4 * j), 1);
                    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
                    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
                    wk[0] = _mm256_shuffle_ps(t0, t2, 0x44);
                    wk[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
                    wk[2] = _mm256_shuffle_ps(t1, t3, 0x44);
                    wk[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
                    for (int t = 0; t < L; ++t) {
                        __m256 acc = b;
                        for (int k = 0; k < 4; ++k) acc = _mm256_fmadd_ps(wk[k], _mm256_loadu_ps(xx_row(t + k) + c0), acc);
                        _mm256_storeu_ps(p.u + std::size_t(t) * C + c0, vsilu(acc));
                    }
                    continue;
                }
                for (int t = 0; t < L; ++t) {
                    __m256 acc = b;
                    for (int k = 0; k < K; ++k) {
                        const __m256 wk = _mm256_i32gather_ps(w + std::size_t(c0) * K + k, lane_k, 4);
                        acc = _mm256_fmadd_ps(wk, _mm256_loadu_ps(xx_row(t + k) + c0), acc);
                    }
                    _mm256_storeu_ps(p.u + std::size_t(t) * C + c0, vsilu(acc));
                }
            }
        }
#endif
        // The channels no vector block took (all of them in the scalar and Eigen sets, and for non-F32 weights).
        for (int t = 0; t < L && c0 < C; ++t) {
            float* u = p.u + std::size_t(t) * C;
            for (int c = c0; c < C; ++c) {
                float acc = p.bias ? p.bias[c] : 0.f;
                for (int k = 0; k < K; ++k) acc += widen(w[std::size_t(c) * K + k]) * xx_row(t + k)[c];
                u[c] = acc;
            }
            activate_inplace(Activation::Silu, u + c0, C - c0);
        }
    });
    // New history: the last H rows of xx (shift the old state forward when fewer than H new rows came in).
    for (int j = 0; j < H; ++j) {
        const int row = L + j;  // row of xx
        float* dst = p.state + std::size_t(j) * C;
        if (row < H) std::memmove(dst, p.state + std::size_t(row) * C, std::size_t(C) * sizeof(float));
        else std::memcpy(dst, p.x + std::size_t(row - H) * ldx, std::size_t(C) * sizeof(float));
    }
}


/// Channels whose per-channel scan terms the vector kernels compute ahead of their blocks (AVX-512: 3 x 1 KiB of stack).
inline constexpr int kScanChunk = 256;

/// dt[t, c] of a scan (softplus applied when p.dt_softplus), for the channels no vector block took: the vector
/// softplus of the set on one lane, so a channel gets the same bits on either path.
inline float scan_dt(const SelectiveScanParams& p, std::size_t tc) {
    if (!p.dt_softplus) return p.dt[tc];
#if FLOWEDGE_ISA_AVX512
    return _mm512_cvtss_f32(scan_softplus(_mm512_set1_ps(p.dt[tc])));
#elif FLOWEDGE_ISA_AVX2
    __m256 v[1] = {_mm256_set1_ps(p.dt[tc])};
    scan_softplus(v);
    return _mm256_cvtss_f32(v[0]);
#else
    return softplus(p.dt[tc]);
#endif
}

/// Mamba-1 selective scan with D skip and SiLU(z) gate (see SelectiveScanParams), continuing from state. Rows
/// t < p.y_from advance the state only (no C-weighted sum, gate or y store); the state's and the other rows' bits do
/// not depend on y_from.
inline void selective_scan(const SelectiveScanParams& p) {
    const int C = p.channels, S = p.d_state;
    const std::size_t ldbc = p.ld_bc ? std::size_t(p.ld_bc) : std::size_t(S);
    const std::size_t ldz = p.ld_z ? std::size_t(p.ld_z) : std::size_t(C);
#if FLOWEDGE_ISA_AVX512
    const bool ping = packed::amx_ping_ready();  // out_proj follows on AMX (kernels/packed_linear.hpp)
#endif
    for (int t = 0; t < p.length; ++t) {
        const float* Bt = p.B + std::size_t(t) * ldbc;
        const float* Ct = p.C + std::size_t(t) * ldbc;
        const bool want_y = t >= p.y_from;
        int c = 0;
#if FLOWEDGE_ISA_AVX512
        if (S == 16) {
            // 16 channels at a time: one vector of states per channel, the 16 state vectors weighted by C and
            // reduced together (scan_dot16), then D skip and SiLU(z) gate as vectors. Per chunk of channels, the
            // per-channel terms (dt log2(e), dt u, the gate; softplus of dt when asked) are computed first, as
            // independent vectors that pipeline, so the blocks' chains only broadcast them.
            const __m512 vB = _mm512_loadu_ps(Bt), vC = _mm512_loadu_ps(Ct);
            const __m512 clo = _mm512_unpacklo_ps(vC, vC), chi = _mm512_unpackhi_ps(vC, vC);
            const float* zt = p.z + std::size_t(t) * ldz;
            alignas(64) float dt2[kScanChunk], du[kScanChunk], gate[kScanChunk];
            while (c + 16 <= C) {
                const int c_end = c + std::min(kScanChunk, (C - c) / 16 * 16);
                for (int j = c; j < c_end; j += 16) {
                    const std::size_t tc = std::size_t(t) * C + j;
                    const __m512 dt_raw = _mm512_loadu_ps(p.dt + tc);
                    const __m512 dtv = p.dt_softplus ? scan_softplus(dt_raw) : dt_raw;
                    _mm512_store_ps(dt2 + (j - c), _mm512_mul_ps(dtv, _mm512_set1_ps(1.44269504088896341f)));
                    _mm512_store_ps(du + (j - c), _mm512_mul_ps(dtv, _mm512_loadu_ps(p.u + tc)));
                    if (want_y) _mm512_store_ps(gate + (j - c), mamba_silu(_mm512_loadu_ps(zt + j)));
                }
                for (int c0 = c; c < c_end; c += 16) {
                    if (ping && c % packed::kAmxPingChannels == 0) packed::amx_ping();
                    const std::size_t tc0 = std::size_t(t) * C + c;
                    const int j0 = c - c0;
                    __m512 sn[16];
                    // Unrolled (GCC otherwise keeps a loop that stores the state vectors to the stack and reloads p.A and
                    // p.state each iteration, as the state stores may alias p).
                    float* const st0 = p.state + std::size_t(c) * 16;
                    const float* const a0 = p.A + std::size_t(c) * 16;
#if defined(__clang__)
#pragma unroll 16
#else
#pragma GCC unroll 16
#endif
                    for (int k = 0; k < 16; ++k) {
                        float* st = st0 + std::size_t(k) * 16;
                        const __m512 decay = scan_exp2_nonpositive(
                            _mm512_mul_ps(_mm512_set1_ps(dt2[j0 + k]), _mm512_loadu_ps(a0 + std::size_t(k) * 16)));
                        sn[k] = _mm512_fmadd_ps(decay, _mm512_loadu_ps(st), _mm512_mul_ps(_mm512_set1_ps(du[j0 + k]), vB));
                        _mm512_storeu_ps(st, sn[k]);
                    }
                    if (!want_y) continue;
                    const __m512 dv = p.D ? _mm512_loadu_ps(p.D + c) : _mm512_setzero_ps();
                    const __m512 yv = _mm512_fmadd_ps(dv, _mm512_loadu_ps(p.u + tc0), scan_dot16(sn, clo, chi));
                    _mm512_storeu_ps(p.y + tc0, _mm512_mul_ps(yv, _mm512_load_ps(gate + j0)));
                }
            }
        }
#elif FLOWEDGE_ISA_AVX2
        if (S == 16) {
            // 8 channels at a time, two vectors of states per channel: prod[k] = s_lo C_lo + s_hi C_hi (one
            // fma), then the 8 prod vectors summed lane-wise by a transpose-add tree whose additions are the
            // ones vsum makes for one vector ((l + l+4), then pairs), so each channel gets the bits of the
            // per-channel loop below; then D skip and SiLU(z) gate as vectors. Per chunk of channels the
            // per-channel terms (dt log2(e), dt u, the gate; softplus of dt when asked) come first, as independent
            // vectors, so the blocks' chains only broadcast them (as the AVX-512 set).
            const __m256 vB0 = _mm256_loadu_ps(Bt), vB1 = _mm256_loadu_ps(Bt + 8);
            const __m256 vC0 = _mm256_loadu_ps(Ct), vC1 = _mm256_loadu_ps(Ct + 8);
            const float* zt = p.z + std::size_t(t) * ldz;
            alignas(32) float dt2[kScanChunk], du[kScanChunk], gate[kScanChunk];
            while (c + 8 <= C) {
                const int c0 = c, c_end = c + std::min(kScanChunk, (C - c) / 8 * 8);
                // Four vectors at a time (their chains interleaved), then one at a time.
                auto terms = [&](int j, auto nv) {
                    constexpr int NV = decltype(nv)::value;
                    const std::size_t tc = std::size_t(t) * C + j;
                    __m256 dtv[NV], g[NV];
                    for (int i = 0; i < NV; ++i) dtv[i] = _mm256_loadu_ps(p.dt + tc + 8 * i);
                    if (p.dt_softplus) scan_softplus(dtv);
                    for (int i = 0; i < NV; ++i) {
                        _mm256_store_ps(dt2 + (j - c0) + 8 * i, _mm256_mul_ps(dtv[i], _mm256_set1_ps(1.44269504088896341f)));
                        _mm256_store_ps(du + (j - c0) + 8 * i, _mm256_mul_ps(dtv[i], _mm256_loadu_ps(p.u + tc + 8 * i)));
                    }
                    if (!want_y) return;
                    for (int i = 0; i < NV; ++i) g[i] = _mm256_loadu_ps(zt + j + 8 * i);
                    scan_silu(g);
                    for (int i = 0; i < NV; ++i) _mm256_store_ps(gate + (j - c0) + 8 * i, g[i]);
                };
                int j = c;
                for (; j + 32 <= c_end; j += 32) terms(j, std::integral_constant<int, 4>{});
                for (; j < c_end; j += 8) terms(j, std::integral_constant<int, 1>{});
                for (; c < c_end; c += 8) {
                    const std::size_t tc0 = std::size_t(t) * C + c;
                    const int j0 = c - c0;
                    __m256 prod[8];
                    float* const st = p.state + std::size_t(c) * 16;
                    const float* const a = p.A + std::size_t(c) * 16;
                    for (int k = 0; k < 8; k += 2) {  // two channels' decays interleaved (scan_exp2_nonpositive)
                        __m256 d[4];
                        for (int i = 0; i < 4; ++i)
                            d[i] = _mm256_mul_ps(_mm256_set1_ps(dt2[j0 + k + i / 2]), _mm256_loadu_ps(a + (k * 16 + i * 8)));
                        scan_exp2_nonpositive(d);
                        for (int i = 0; i < 4; ++i) {
                            const __m256 b = _mm256_mul_ps(_mm256_set1_ps(du[j0 + k + i / 2]), i % 2 ? vB1 : vB0);
                            d[i] = _mm256_fmadd_ps(d[i], _mm256_loadu_ps(st + (k * 16 + i * 8)), b);
                            _mm256_storeu_ps(st + (k * 16 + i * 8), d[i]);
                        }
                        prod[k] = _mm256_fmadd_ps(d[1], vC1, _mm256_mul_ps(d[0], vC0));
                        prod[k + 1] = _mm256_fmadd_ps(d[3], vC1, _mm256_mul_ps(d[2], vC0));
                    }
                    if (!want_y) continue;
                    // h[k] = [lanes l + l+4 of prod[k] | of prod[k+4]] (l = 0..3), then pairs within 128-bit halves.
                    __m256 h[4];
                    for (int k = 0; k < 4; ++k)
                        h[k] = _mm256_add_ps(_mm256_permute2f128_ps(prod[k], prod[k + 4], 0x20),
                                             _mm256_permute2f128_ps(prod[k], prod[k + 4], 0x31));
                    const __m256 q01 = _mm256_add_ps(_mm256_unpacklo_ps(h[0], h[1]), _mm256_unpackhi_ps(h[0], h[1]));
                    const __m256 q23 = _mm256_add_ps(_mm256_unpacklo_ps(h[2], h[3]), _mm256_unpackhi_ps(h[2], h[3]));
                    const __m256 sum = _mm256_add_ps(_mm256_shuffle_ps(q01, q23, 0x44), _mm256_shuffle_ps(q01, q23, 0xEE));
                    const __m256 uv = _mm256_loadu_ps(p.u + tc0);
                    const __m256 dv = p.D ? _mm256_loadu_ps(p.D + c) : _mm256_setzero_ps();
                    const __m256 yv = _mm256_fmadd_ps(dv, uv, sum);
                    _mm256_storeu_ps(p.y + tc0, _mm256_mul_ps(yv, _mm256_load_ps(gate + j0)));
                }
            }
        }
#endif
        for (; c < C; ++c) {
            const std::size_t tc = std::size_t(t) * C + c;
            const float dtv = scan_dt(p, tc), uv = p.u[tc];
            const float du = dtv * uv;
            float* s = p.state + std::size_t(c) * S;
            const float* a = p.A + std::size_t(c) * S;
            float acc = 0.f;
            int n = 0;
#if FLOWEDGE_ISA_AVX512
            // The decays as the 16-channel blocks form them (the same bits for a channel on either path).
            __m512 vacc = _mm512_setzero_ps();
            const __m512 vdt2 = _mm512_set1_ps(dtv * 1.44269504088896341f), vdu = _mm512_set1_ps(du);
            for (; n + 16 <= S; n += 16) {
                const __m512 decay = scan_exp2_nonpositive(_mm512_mul_ps(vdt2, _mm512_loadu_ps(a + n)));
                const __m512 sn = _mm512_fmadd_ps(decay, _mm512_loadu_ps(s + n), _mm512_mul_ps(vdu, _mm512_loadu_ps(Bt + n)));
                _mm512_storeu_ps(s + n, sn);
                vacc = _mm512_fmadd_ps(sn, _mm512_loadu_ps(Ct + n), vacc);
            }
            acc = _mm512_reduce_add_ps(vacc);
#elif FLOWEDGE_ISA_AVX2
            if (S >= 8) {
                // The decays as the 8-channel blocks form them (the same bits for a channel on either path).
                __m256 vacc = _mm256_setzero_ps();
                const __m256 vdt2 = _mm256_set1_ps(dtv * 1.44269504088896341f), vdu = _mm256_set1_ps(du);
                for (; n + 8 <= S; n += 8) {
                    __m256 decay[1] = {_mm256_mul_ps(vdt2, _mm256_loadu_ps(a + n))};
                    scan_exp2_nonpositive(decay);
                    const __m256 sn = _mm256_fmadd_ps(decay[0], _mm256_loadu_ps(s + n), _mm256_mul_ps(vdu, _mm256_loadu_ps(Bt + n)));
                    _mm256_storeu_ps(s + n, sn);
                    vacc = _mm256_fmadd_ps(sn, _mm256_loadu_ps(Ct + n), vacc);
                }
                acc = vsum(vacc);
            }
#endif
            for (; n < S; ++n) {
                const float sn = std::exp(dtv * a[n]) * s[n] + du * Bt[n];
                s[n] = sn;
                acc += sn * Ct[n];
            }
            if (!want_y) continue;
            const float d = p.D ? p.D[c] : 0.f;
            p.y[tc] = (acc + d * uv) * silu(p.z[std::size_t(t) * ldz + c]);
        }
    }
}
