// Multi-head scaled dot-product attention (torch.nn.MultiheadAttention's core, no mask). Kernel-set body: included
// once per instruction set by cpu/kernels.hpp; the argument checks and size limits are in Ops<Cpu> (cpu/ops.hpp).

/// Most keys one attention call may have: one query's scores sit on the worker's stack (32 KiB).
inline constexpr int kAttentionMaxKeys = 8192;
/// Largest head_dim: one query's output accumulator sits on the stack.
inline constexpr int kAttentionMaxHeadDim = 1024;

/// q . k over n floats: kLanes-wide chains, then the tail.
inline float attention_dot(const float* q, const float* k, int n) {
    VecF acc = vzero();
    int t = 0;
    for (; t + kLanes <= n; t += kLanes) acc = vfma(vload(q + t), vload(k + t), acc);
    float s = vsum(acc);
    for (; t < n; ++t) s += q[t] * k[t];
    return s;
}

#if FLOWEDGE_ISA_EIGEN
/// Queries [i0, i1) of head h on Eigen's products, as many queries per pass as one score block of kAttentionMaxKeys
/// floats holds: S = k q^T (n_kv x queries), the same max-subtracted exp per query column (float32, sum in double),
/// then out^T = v^T S, scaled by 1 / sum. One matrix-vector product per query (PerColumn), so a query's bits do not
/// depend on how many queries share its pass.
inline void attention_rows(const AttentionParams& p, int h, int i0, int i1) {
    const int width = p.n_heads * p.head_dim, dh = p.head_dim, nk = p.n_kv;
    const std::size_t ldq = std::size_t(p.ld_q ? p.ld_q : width), ldk = std::size_t(p.ld_k ? p.ld_k : width);
    const std::size_t ldv = std::size_t(p.ld_v ? p.ld_v : width), ldo = std::size_t(p.ld_out ? p.ld_out : width);
    const std::size_t col = std::size_t(h) * std::size_t(dh);
    const int per_pass = std::max(1, kAttentionMaxKeys / nk);
    alignas(64) float score[kAttentionMaxKeys];
    alignas(64) float inv[kAttentionMaxKeys];
    for (int q0 = i0; q0 < i1; q0 += per_pass) {
        const int nq = std::min(per_pass, i1 - q0);
        eigen_gemm<Eigen::RowMajor, Eigen::ColMajor, true>(nk, nq, dh, p.k + col, ldk, p.q + std::size_t(q0) * ldq + col, ldq, score,
                                                           std::size_t(nk), false);
        for (int c = 0; c < nq; ++c) {
            float* s = score + std::size_t(c) * nk;
            float mx = -INFINITY;
            for (int j = 0; j < nk; ++j) {
                s[j] *= p.scale;
                mx = std::max(mx, s[j]);
            }
            double sum = 0;
            for (int j = 0; j < nk; ++j) {
                s[j] = std::exp(s[j] - mx);
                sum += s[j];
            }
            inv[c] = float(1.0 / sum);
        }
        float* o = p.out + std::size_t(q0) * ldo + col;
        eigen_gemm<Eigen::ColMajor, Eigen::ColMajor, true>(dh, nq, nk, p.v + col, ldv, score, std::size_t(nk), o, ldo, false);
        for (int c = 0; c < nq; ++c)
            for (int t = 0; t < dh; ++t) o[std::size_t(c) * ldo + t] *= inv[c];
    }
}
#else
/// Queries [i0, i1) of head h: scores, max-subtracted exp (float32, sum in double), weighted sum of v rows.
inline void attention_rows(const AttentionParams& p, int h, int i0, int i1) {
    const int width = p.n_heads * p.head_dim, dh = p.head_dim;
    const std::size_t ldq = std::size_t(p.ld_q ? p.ld_q : width), ldk = std::size_t(p.ld_k ? p.ld_k : width);
    const std::size_t ldv = std::size_t(p.ld_v ? p.ld_v : width), ldo = std::size_t(p.ld_out ? p.ld_out : width);
    const std::size_t col = std::size_t(h) * std::size_t(dh);
    alignas(64) float score[kAttentionMaxKeys];
    alignas(64) float acc[kAttentionMaxHeadDim];
    for (int i = i0; i < i1; ++i) {
        const float* q = p.q + std::size_t(i) * ldq + col;
        float mx = -INFINITY;
        for (int j = 0; j < p.n_kv; ++j) {
            score[j] = p.scale * attention_dot(q, p.k + std::size_t(j) * ldk + col, dh);
            mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int j = 0; j < p.n_kv; ++j) {
            score[j] = std::exp(score[j] - mx);
            sum += score[j];
        }
        const float inv = float(1.0 / sum);
        for (int t = 0; t < dh; ++t) acc[t] = 0.f;
        for (int j = 0; j < p.n_kv; ++j) {
            const float* v = p.v + std::size_t(j) * ldv + col;
            const VecF pj = vset1(score[j]);
            int t = 0;
            for (; t + kLanes <= dh; t += kLanes) vstore(acc + t, vfma(pj, vload(v + t), vload(acc + t)));
            for (; t < dh; ++t) acc[t] += score[j] * v[t];
        }
        float* o = p.out + std::size_t(i) * ldo + col;
        for (int t = 0; t < dh; ++t) o[t] = acc[t] * inv;
    }
}
#endif

/// out = softmax(scale q k^T) v per head; (head, query block) items shared over OpenMP threads when large enough.
inline void attention(const AttentionParams& p) {
    const double macs = 2.0 * p.n_q * double(p.n_kv) * p.n_heads * p.head_dim;
    if (macs < kParallelMacs) {
        for (int h = 0; h < p.n_heads; ++h) attention_rows(p, h, 0, p.n_q);
        return;
    }
    constexpr int kBlock = 16;
    const int blocks = (p.n_q + kBlock - 1) / kBlock, items = blocks * p.n_heads;
#pragma omp parallel for schedule(static)
    for (int it = 0; it < items; ++it) {
        const int h = it / blocks, i0 = (it % blocks) * kBlock;
        attention_rows(p, h, i0, std::min(p.n_q, i0 + kBlock));
    }
}
