// Elementwise and data-movement ops (activation, axpby, concat, sinusoid, embedding, the scheduler step, MIN_MAX
// un-normalisation). Kernel-set body: included once per instruction set by cpu/kernels.hpp; the argument checks
// are in Ops<Cpu> (cpu/ops.hpp).
/// Elementwise y = act(x) (x may equal y).
inline void activation(const ActivationParams& p) {
    if (p.x != p.y) std::memmove(p.y, p.x, std::size_t(p.n) * sizeof(float));
    activate_inplace(p.act, p.y, p.n);
}

/// Elementwise out = a*x + b*y (out may alias x or y; y may be null when b == 0).
inline void axpby(const AxpbyParams& p) {
    if (p.b == 0.f || !p.y) {
        for (std::int64_t i = 0; i < p.n; ++i) p.out[i] = p.a * p.x[i];
    } else {
        for (std::int64_t i = 0; i < p.n; ++i) p.out[i] = p.a * p.x[i] + p.b * p.y[i];
    }
}

/// torch.cat([a, b], dim=1) for [batch, c, length] tensors.
inline void concat_channels(const ConcatParams& p) {
    const std::size_t na = std::size_t(p.ca) * p.length, nb = std::size_t(p.cb) * p.length;
    for (int b = 0; b < p.batch; ++b) {
        float* y = p.y + std::size_t(b) * (na + nb);
        if (na) std::memmove(y, p.a + std::size_t(b) * na, na * sizeof(float));
        if (nb) std::memmove(y + na, p.b + std::size_t(b) * nb, nb * sizeof(float));
    }
}

/// Sinusoidal time features: out[r] = [sin(t_r*f_i) | cos(t_r*f_i)], t_r = t + r * t_step,
/// f_i = exp(-(i * (log_base / denom))) in float32.
inline void sinusoid(const SinusoidParams& p) {
    const float step = p.log_base / p.denom;
    for (int r = 0; r < p.rows; ++r) {
        float* out = p.out + std::size_t(r) * 2 * p.half;
        if (r > 0 && p.t_step == 0.f) {
            std::memcpy(out, p.out, std::size_t(2 * p.half) * sizeof(float));
            continue;
        }
        const float t = p.t + float(r) * p.t_step;
        for (int i = 0; i < p.half; ++i) {
            const float f = std::exp(float(i) * -step);
            const float arg = t * f;
            out[i] = std::sin(arg);
            out[p.half + i] = std::cos(arg);
        }
    }
}

/// torch.nn.Embedding: y[r, :] = table[ids[r], :] widened to float (ids validated by the caller).
inline void embedding(const EmbeddingParams& p) {
    with_weights(p.table, [&](auto table) {
        for (int r = 0; r < p.rows; ++r) {
            const auto* row = table + std::size_t(p.ids[r]) * p.dim;
            float* y = p.y + std::size_t(r) * p.dim;
            for (int i = 0; i < p.dim; ++i) y[i] = widen(row[i]);
        }
    });
}

/// The sample-layout index of element i of a sample (DiffusionStepParams::channel_major_length).
inline int draw_index(const DiffusionStepParams& p, int i) {
    const int L = p.channel_major_length;
    return L > 0 ? (i % L) * (p.per_sample / L) + i / L : i;
}

/// One DDIM/DDPM update of x: [batch, per_sample] given eps (docs/models.md#scheduler-step); DDPM noise by global
/// draw index.
inline void diffusion_step(const DiffusionStepParams& p) {
    const std::uint64_t seed0 = p.seed_ptr ? *p.seed_ptr : p.seed;
    const bool noise = p.kind == StepKind::Ddpm && p.noise_std != 0.f;
    for (int b = 0; b < p.batch; ++b) {
        float* x = p.x + std::size_t(b) * p.per_sample;
        const float* e = p.eps + std::size_t(b) * p.per_sample;
        const std::uint64_t row_seed = p.seed_ptr && p.seed_per_row ? p.seed_ptr[b] : seed0 + std::uint64_t(b);
        for (int i = 0; i < p.per_sample; ++i) {
            float x0 = (x[i] - p.sqrt_one_minus_abar * e[i]) / p.sqrt_abar;
            if (p.clip) x0 = std::min(std::max(x0, -p.clip_range), p.clip_range);
            if (p.kind == StepKind::Ddim) {
                x[i] = p.c_x0 * x0 + p.c_other * e[i];
            } else {
                float v = p.c_x0 * x0 + p.c_other * x[i];
                if (noise) v += p.noise_std * normal_at(row_seed, p.draw_offset + std::uint64_t(draw_index(p, i)));
                x[i] = v;
            }
        }
    }
}

/// MIN_MAX un-normalisation y = (x + 1) / 2 * (max - min) + min per column. x, y: [rows, dim].
inline void unnormalize(const UnnormalizeParams& p) {
    for (int r = 0; r < p.rows; ++r)
        for (int d = 0; d < p.dim; ++d) {
            const std::size_t i = std::size_t(r) * p.dim + d;
            p.y[i] = (p.x[i] + 1.f) / 2.f * (p.max[d] - p.min[d]) + p.min[d];
        }
}

/// Sum of n floats read once at full vector width in 4 independent chains: the read-bandwidth probe of the
/// benchmarks (what streaming weights can reach on this machine).
inline float stream_sum(const float* a, std::int64_t n) {
    VecF acc[4] = {vzero(), vzero(), vzero(), vzero()};
    std::int64_t i = 0;
    for (; i + 4 * kLanes <= n; i += 4 * kLanes)
        for (int u = 0; u < 4; ++u) acc[u] = vadd(acc[u], vload(a + i + u * kLanes));
    float total = vsum(vadd(vadd(acc[0], acc[1]), vadd(acc[2], acc[3])));
    for (; i < n; ++i) total += a[i];
    return total;
}

#if FLOWEDGE_ISA_SIMD
/// x[i] = vexp(x[i]) over n values, n a multiple of kLanes (the vector exp on an array, for its tests).
inline void vexp_inplace(float* x, std::size_t n) {
    for (std::size_t i = 0; i < n; i += kLanes) vstore(x + i, vexp(vload(x + i)));
}
/// x[i] = vlog(x[i]) over n values, n a multiple of kLanes.
inline void vlog_inplace(float* x, std::size_t n) {
    for (std::size_t i = 0; i < n; i += kLanes) vstore(x + i, vlog(vload(x + i)));
}
#endif

/// dst[0, kLanes) = src[0, kLanes) widened by the set's vector load (for its tests).
template <class T>
inline void widen_lanes(const T* src, float* dst) {
    vstore(dst, vload(src));
}
