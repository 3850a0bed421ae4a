// torch.nn.Linear on the CPU: the row-major kernels (every set), the vdpbf16ps kernels (AVX-512 set, MathMode::BF16)
// and weights packed as a kernel-1 Conv1d (AVX2 set, Storage::StreamedMatrix). The small-row packed kernels are in
// packed_linear.hpp. Kernel-set body: included once per instruction set by cpu/kernels.hpp; checks are in Ops<Cpu>.

/// Scalar linear epilogue: bias, then the activation when it must precede an accumulate, then store/accumulate.
struct LinearEpilogue {
    const LinearParams& p;
    std::size_t ldy;
    bool act_after;
    void operator()(int o, int r, float v) const {
        if (p.bias) v += p.bias[o];
        if (!act_after) v = activate(p.act, v);
        float& dst = p.y[std::size_t(r) * ldy + std::size_t(o)];
        dst = p.accumulate ? dst + v : v;
    }
};

#if FLOWEDGE_ISA_AVX512
/// Vector linear epilogue for n (<= 16) consecutive outputs: bias, then store or accumulate, with one masked
/// load/store (lane-wise the same arithmetic as the scalar epilogue). Only used when the activation is not
/// needed before an accumulate (it then runs afterwards over the finished rows, as on the scalar path).
struct LinearEpilogueVec : LinearEpilogue {
    void vec(int o, int r, VecF v, int n) const {
        const __mmask16 m = lane_mask(n);
        if (p.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, p.bias + o));
        float* dst = p.y + std::size_t(r) * ldy + std::size_t(o);
        if (p.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst), v);
        _mm512_mask_storeu_ps(dst, m, v);
    }
};
#endif

template <class WT>
inline void linear_impl(const LinearParams& p, const WT* w) {
    const std::size_t ldx = p.ld_x ? std::size_t(p.ld_x) : std::size_t(p.in);
    const std::size_t ldy = p.ld_y ? std::size_t(p.ld_y) : std::size_t(p.out);
    // The activation runs vectorised over each finished output row segment unless it must precede an
    // accumulate (then it stays in the scalar epilogue).
    const bool act_after = p.act != Activation::None && !p.accumulate;
    auto run = [&](int o0, int o1) {
#if FLOWEDGE_ISA_AVX512
        // Kernels that yield whole vectors of outputs finish them in registers (bias, activation, store).
        if (p.act == Activation::None || act_after) {
            LinearEpilogueVec ev{{p, ldy, act_after}};
            gemm_rows(w, std::size_t(p.in), p.x, ldx, p.in, o0, o1, p.rows, ev);
        } else
#endif
        {
            LinearEpilogue epilogue{p, ldy, act_after};
#if FLOWEDGE_ISA_EIGEN
            eigen_rows<true>(w, std::size_t(p.in), p.x, ldx, p.in, o0, o1, p.rows, epilogue);
#else
            gemm_rows(w, std::size_t(p.in), p.x, ldx, p.in, o0, o1, p.rows, epilogue);
#endif
        }
        if (act_after)
            for (int r = 0; r < p.rows; ++r) activate_inplace(p.act, p.y + std::size_t(r) * ldy + std::size_t(o0), o1 - o0);
    };
    // Small calls (every Mamba/flow-head shape) never enter an OpenMP region, so no pool is woken.
    if (double(p.rows) * p.in * p.out < kParallelMacs) {
        run(0, p.out);
        return;
    }
#pragma omp parallel
    {
        const int tid = thread_index(), nth = thread_count();
        // Thread boundaries on multiples of 16 rows (whole short-row blocks).
        const int units = (p.out + 15) / 16;
        const int o0 = std::min(p.out, 16 * int(std::int64_t(units) * tid / nth));
        const int o1 = std::min(p.out, 16 * int(std::int64_t(units) * (tid + 1) / nth));
        if (o0 < o1) run(o0, o1);
    }
}

#if FLOWEDGE_ISA_AVX512
/// BF16 elements of stack scratch for linear's BF16-rounded x rows (64 KiB).
inline constexpr std::size_t kLinearBhScratch = 32 * 1024;

/// Whether Ops<Cpu>::linear runs p on the vdpbf16ps kernels: MathMode::BF16 requested, rows longer than 8 (the
/// in <= 8 kernel is not multiply-bound, so it stays exact) and one BF16 x row fitting the stack scratch.
inline bool linear_uses_bf16(const LinearParams& p) {
    return p.math == MathMode::BF16 && p.in > 8 && round_up32(std::size_t(p.in)) <= kLinearBhScratch;
}

/// linear_impl under MathMode::BF16: x rows rounded to BF16 (RNE) into stack scratch, as many rows per pass as fit,
/// then the vdpbf16ps kernels with the same epilogues and the same OpenMP split over output rows.
template <class WT>
inline void linear_bf16_impl(const LinearParams& p, const WT* w) {
    const std::size_t ldx = p.ld_x ? std::size_t(p.ld_x) : std::size_t(p.in);
    const std::size_t ldy = p.ld_y ? std::size_t(p.ld_y) : std::size_t(p.out);
    const std::size_t ldb = round_up32(std::size_t(p.in));
    const bool act_after = p.act != Activation::None && !p.accumulate;
    const int rows_per = int(std::min<std::size_t>(std::size_t(p.rows), kLinearBhScratch / ldb));
    const bool par = double(p.rows) * p.in * p.out >= kParallelMacs;
    alignas(64) bf16 xb[kLinearBhScratch];
    for (int r0 = 0; r0 < p.rows; r0 += rows_per) {
        const int nr = std::min(rows_per, p.rows - r0);
        for (int r = 0; r < nr; ++r) round_to_bh(p.x + std::size_t(r0 + r) * ldx, p.in, xb + std::size_t(r) * ldb);
        LinearParams q = p;  // this pass's rows
        q.y = p.y + std::size_t(r0) * ldy;
        q.rows = nr;
        auto run = [&](int o0, int o1) {
            if (q.act == Activation::None || act_after) {
                LinearEpilogueVec ev{{q, ldy, act_after}};
                gemm_rows(w, std::size_t(q.in), xb, ldb, q.in, o0, o1, nr, ev);
            } else {
                LinearEpilogue epilogue{q, ldy, act_after};
                gemm_rows(w, std::size_t(q.in), xb, ldb, q.in, o0, o1, nr, epilogue);
            }
            if (act_after)
                for (int r = 0; r < nr; ++r) activate_inplace(q.act, q.y + std::size_t(r) * ldy + std::size_t(o0), o1 - o0);
        };
        if (!par) {
            run(0, q.out);
            continue;
        }
#pragma omp parallel
        {
            const int tid = thread_index(), nth = thread_count();
            const int units = (q.out + 15) / 16;
            const int o0 = std::min(q.out, 16 * int(std::int64_t(units) * tid / nth));
            const int o1 = std::min(q.out, 16 * int(std::int64_t(units) * (tid + 1) / nth));
            if (o0 < o1) run(o0, o1);
        }
    }
}
#endif

#if FLOWEDGE_ISA_AVX2
/// A Linear on weights packed like a kernel-1 Conv1d (Storage::StreamedMatrix): x [rows, in] is the conv input
/// [batch = rows, in, length 1] and y [rows, out] its output, so rows must be contiguous (ld_x = in, ld_y = out).
inline Conv1dParams linear_as_packed_conv(const LinearParams& p) {
    Conv1dParams c;
    c.x = p.x;
    c.w = p.w;
    c.bias = p.bias;
    c.y = p.y;
    c.batch = p.rows;
    c.in_channels = p.in;
    c.out_channels = p.out;
    c.in_length = c.out_length = 1;
    c.kernel = 1;
    return c;
}

/// Linear on conv blocks (Storage::StreamedMatrix; int8: INT8 blocks), then the activation over the finished rows.
inline void linear_on_blocks(const LinearParams& p, const void* blocks, bool int8) {
    with_blocks(blocks, p.w.dtype, int8, [&](auto w) { conv1d_packed_impl(linear_as_packed_conv(p), w); });
    if (p.act != Activation::None) activate_inplace(p.act, p.y, std::size_t(p.rows) * std::size_t(p.out));
}

/// Several linears on conv blocks (the U-Net's FiLM projections at batch 1: each far below kParallelMacs, together
/// ~7.5 M multiply-adds of streamed weights) in one parallel region, every thread taking its blocks of each item,
/// instead of one after another on one thread. Same kernel per output, same bits as one linear_on_blocks per item.
/// int8[i]: item i's blocks are INT8.
inline void linear_batch_on_blocks(const LinearBatchParams& p, const void* const* blocks, const bool* int8) {
#pragma omp parallel
    {
        const int tid = thread_index(), nth = thread_count();
        for (int i = 0; i < p.n_items; ++i)
            with_blocks(blocks[i], p.items[i].w.dtype, int8[i], [&](auto w) { conv1d_packed_part(linear_as_packed_conv(p.items[i]), w, tid, nth); });
    }
    for (int i = 0; i < p.n_items; ++i)
        if (p.items[i].act != Activation::None)
            activate_inplace(p.items[i].act, p.items[i].y, std::size_t(p.items[i].rows) * std::size_t(p.items[i].out));
}
#endif

/// Ops<Cpu>::linear on the row-major weight p.w.data; bf16: MathMode::BF16 may run on vdpbf16ps (AVX512_BF16).
inline void linear(const LinearParams& p, bool bf16) {
#if FLOWEDGE_ISA_AVX512
    if (bf16 && linear_uses_bf16(p)) {
        with_weights(p.w, [&](auto w) { linear_bf16_impl(p, w); });
        return;
    }
#endif
    (void)bf16;
    with_weights(p.w, [&](auto w) { linear_impl(p, w); });
}
