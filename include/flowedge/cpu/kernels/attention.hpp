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

#if FLOWEDGE_ISA_SIMD
// The blocked kernel (SIMD sets): a block of kAttnBlock queries of one head at a time, queries in vector lanes.
// Scores: the block's queries transposed to [head_dim][block] on the stack, each key's elements broadcast against
// them (kAttnScoreKeys keys x 2 query vectors of accumulators per tile), so no horizontal sums. Softmax per query
// (lane): the max, exp(s - max) (vexp, ~1 ulp), the sum in double in key order. p v: a register-blocked product of
// the block's probabilities (broadcast) and v's rows (kAttnPvRows queries x kAttnPvVecs head vectors per tile), then
// the 1 / sum scaling, as attention_rows does per query.
inline constexpr int kAttnBlock = 2 * kLanes;
inline constexpr int kAttnScoreKeys = kRegisters >= 32 ? 12 : 6;
inline constexpr int kAttnPvRows = kRegisters >= 32 ? 6 : 4;
inline constexpr int kAttnPvVecs = kRegisters >= 32 ? 4 : 3;
/// Most keys of the blocked kernel: one block's scores [n_kv][block] sit on the worker's stack (128 KiB).
inline constexpr int kAttnBlockMaxKeys = 32768 / kAttnBlock;
/// Widest head of the blocked kernel: one block's transposed queries [head_dim][block] on the stack (32 KiB).
inline constexpr int kAttnBlockMaxHeadDim = 8192 / kAttnBlock;

/// Whether attention() runs p on the blocked kernel (else attention_rows): the scratch fits, whole head vectors.
inline bool attention_blocked(const AttentionParams& p) {
    return p.n_kv <= kAttnBlockMaxKeys && p.head_dim <= kAttnBlockMaxHeadDim && p.head_dim % kLanes == 0;
}

/// Vector helpers of the softmax: std::max(m, s) per lane, and float lanes widened to double in halves.
#if FLOWEDGE_ISA_AVX512
using VecD = __m512d;
inline VecF attn_vmax(VecF m, VecF s) { return _mm512_max_ps(s, m); }
inline VecD vzero_d() { return _mm512_setzero_pd(); }
inline VecD vadd_d(VecD a, VecD b) { return _mm512_add_pd(a, b); }
inline VecD widen_lo(VecF v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
inline VecD widen_hi(VecF v) { return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))); }
inline void vstore_d(double* p, VecD v) { _mm512_storeu_pd(p, v); }
#else
using VecD = __m256d;
inline VecF attn_vmax(VecF m, VecF s) { return _mm256_max_ps(s, m); }
inline VecD vzero_d() { return _mm256_setzero_pd(); }
inline VecD vadd_d(VecD a, VecD b) { return _mm256_add_pd(a, b); }
inline VecD widen_lo(VecF v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
inline VecD widen_hi(VecF v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
inline void vstore_d(double* p, VecD v) { _mm256_storeu_pd(p, v); }
#endif

/// st[j][i] = scale * sum_d qt[d][i] k[j][d] for J keys (d in order, one chain per score). k: key 0's head columns.
template <int J>
inline void attention_scores_tile(const float* qt, const float* k, std::size_t ldk, int dh, float scale, float* st) {
    VecF acc[J][2];
    for (int j = 0; j < J; ++j) acc[j][0] = acc[j][1] = vzero();
    for (int d = 0; d < dh; ++d) {
        const VecF q0 = vload(qt + std::size_t(d) * kAttnBlock), q1 = vload(qt + std::size_t(d) * kAttnBlock + kLanes);
        for (int j = 0; j < J; ++j) {
            const VecF kb = vset1(k[std::size_t(j) * ldk + std::size_t(d)]);
            acc[j][0] = vfma(q0, kb, acc[j][0]);
            acc[j][1] = vfma(q1, kb, acc[j][1]);
        }
    }
    const VecF s = vset1(scale);
    for (int j = 0; j < J; ++j) {
        vstore(st + std::size_t(j) * kAttnBlock, vmul(acc[j][0], s));
        vstore(st + std::size_t(j) * kAttnBlock + kLanes, vmul(acc[j][1], s));
    }
}

template <int J = kAttnScoreKeys>
inline void attention_scores_tile_n(int nj, const float* qt, const float* k, std::size_t ldk, int dh, float scale, float* st) {
    if constexpr (J > 1) {
        if (nj < J) return attention_scores_tile_n<J - 1>(nj, qt, k, ldk, dh, scale, st);
    }
    attention_scores_tile<J>(qt, k, ldk, dh, scale, st);
}

/// out[r][t] = inv[r] * sum_j st[j][r] v[j][t] for R queries (block rows from r0) x V head vectors, j in order in
/// one chain (attention_rows' arithmetic). v and out point at the tile's first head column.
template <int R, int V>
inline void attention_pv_tile(const float* st, int r0, const float* v, std::size_t ldv, int n_kv, const float* inv, float* out,
                              std::size_t ldo) {
    VecF acc[R][V];
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < V; ++t) acc[r][t] = vzero();
    for (int j = 0; j < n_kv; ++j) {
        VecF vv[V];
        for (int t = 0; t < V; ++t) vv[t] = vload(v + std::size_t(j) * ldv + std::size_t(t) * kLanes);
        for (int r = 0; r < R; ++r) {
            const VecF pj = vset1(st[std::size_t(j) * kAttnBlock + std::size_t(r0 + r)]);
            for (int t = 0; t < V; ++t) acc[r][t] = vfma(pj, vv[t], acc[r][t]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < V; ++t) vstore(out + std::size_t(r0 + r) * ldo + std::size_t(t) * kLanes, vmul(acc[r][t], vset1(inv[r0 + r])));
}

template <int R = kAttnPvRows, int V = kAttnPvVecs>
inline void attention_pv_tile_n(int nr, int nv, const float* st, int r0, const float* v, std::size_t ldv, int n_kv, const float* inv,
                                float* out, std::size_t ldo) {
    if constexpr (R > 1) {
        if (nr < R) return attention_pv_tile_n<R - 1, V>(nr, nv, st, r0, v, ldv, n_kv, inv, out, ldo);
    }
    if constexpr (V > 1) {
        if (nv < V) return attention_pv_tile_n<R, V - 1>(nr, nv, st, r0, v, ldv, n_kv, inv, out, ldo);
    }
    attention_pv_tile<R, V>(st, r0, v, ldv, n_kv, inv, out, ldo);
}

/// Queries [i0, i1) (at most kAttnBlock) of head h on the blocked kernel.
inline void attention_block(const AttentionParams& p, int h, int i0, int i1) {
    const int width = p.n_heads * p.head_dim, dh = p.head_dim, nq = i1 - i0;
    const std::size_t ldq = std::size_t(p.ld_q ? p.ld_q : width), ldk = std::size_t(p.ld_k ? p.ld_k : width);
    const std::size_t ldv = std::size_t(p.ld_v ? p.ld_v : width), ldo = std::size_t(p.ld_out ? p.ld_out : width);
    const std::size_t col = std::size_t(h) * std::size_t(dh);
    alignas(64) float qt[kAttnBlockMaxHeadDim * kAttnBlock];
    alignas(64) float st[kAttnBlockMaxKeys * kAttnBlock];
    // Query by query: each reads its head slice contiguously (one strided store per element).
    for (int i = 0; i < kAttnBlock; ++i) {
        const float* q = p.q + std::size_t(i0 + i) * ldq + col;
        for (int d = 0; d < dh; ++d) qt[std::size_t(d) * kAttnBlock + std::size_t(i)] = i < nq ? q[d] : 0.f;
    }
    for (int j = 0; j < p.n_kv; j += kAttnScoreKeys)
        attention_scores_tile_n(std::min(kAttnScoreKeys, p.n_kv - j), qt, p.k + std::size_t(j) * ldk + col, ldk, dh, p.scale,
                                st + std::size_t(j) * kAttnBlock);
    // Softmax per query (lane), vectors over the block's queries: the max over the keys (std::max(m, s) in key
    // order, as max_ps(s, m) returns m unless s > m), then exp(s - max) and its sum in double, each lane's sum in
    // key order (two or four lanes of doubles per float vector).
    constexpr int kQv = kAttnBlock / kLanes;  // query vectors per block
    VecF mx[kQv];
    for (int v = 0; v < kQv; ++v) mx[v] = vset1(-INFINITY);
    for (int j = 0; j < p.n_kv; ++j)
        for (int v = 0; v < kQv; ++v) mx[v] = attn_vmax(mx[v], vload(st + std::size_t(j) * kAttnBlock + std::size_t(v) * kLanes));
    VecF neg_max[kQv];
    for (int v = 0; v < kQv; ++v) neg_max[v] = vmul(mx[v], vset1(-1.f));
    VecD sum[2 * kQv];
    for (int v = 0; v < 2 * kQv; ++v) sum[v] = vzero_d();
    for (int j = 0; j < p.n_kv; ++j) {
        float* sj = st + std::size_t(j) * kAttnBlock;
        for (int v = 0; v < kQv; ++v) {
            const VecF e = vexp(vadd(vload(sj + v * kLanes), neg_max[v]));
            vstore(sj + v * kLanes, e);
            sum[2 * v] = vadd_d(sum[2 * v], widen_lo(e));
            sum[2 * v + 1] = vadd_d(sum[2 * v + 1], widen_hi(e));
        }
    }
    alignas(64) double sums[kAttnBlock];
    alignas(64) float inv[kAttnBlock];
    for (int v = 0; v < 2 * kQv; ++v) vstore_d(sums + v * (kLanes / 2), sum[v]);
    for (int i = 0; i < kAttnBlock; ++i) inv[i] = float(1.0 / sums[i]);
    const int head_vecs = dh / kLanes;
    for (int r0 = 0; r0 < nq; r0 += kAttnPvRows)
        for (int t0 = 0; t0 < head_vecs; t0 += kAttnPvVecs)
            attention_pv_tile_n(std::min(kAttnPvRows, nq - r0), std::min(kAttnPvVecs, head_vecs - t0), st, r0,
                                p.v + col + std::size_t(t0) * kLanes, ldv, p.n_kv, inv, p.out + std::size_t(i0) * ldo + col + std::size_t(t0) * kLanes,
                                ldo);
}
#endif

/// out = softmax(scale q k^T) v per head on the blocked kernel where it applies (SIMD sets), else attention_rows;
/// (head, query block) items shared over OpenMP threads when large enough.
inline void attention(const AttentionParams& p) {
    // Work items: (head, block of queries); the blocked kernel's blocks are its lane blocks.
    int block = 16;
    void (*rows)(const AttentionParams&, int, int, int) = attention_rows;
#if FLOWEDGE_ISA_SIMD
    if (attention_blocked(p)) {
        block = kAttnBlock;
        rows = attention_block;
    }
#endif
    const int blocks = (p.n_q + block - 1) / block, items = blocks * p.n_heads;
    const double macs = 2.0 * p.n_q * double(p.n_kv) * p.n_heads * p.head_dim;
    if (macs < kParallelMacs) {
        for (int it = 0; it < items; ++it) rows(p, it / blocks, (it % blocks) * block, std::min(p.n_q, (it % blocks + 1) * block));
        return;
    }
#pragma omp parallel for schedule(static)
    for (int it = 0; it < items; ++it) {
        const int h = it / blocks, i0 = (it % blocks) * block;
        rows(p, h, i0, std::min(p.n_q, i0 + block));
    }
}
