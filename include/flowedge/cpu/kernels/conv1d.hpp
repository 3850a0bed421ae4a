// torch.nn.Conv1d on the CPU: implicit im2col + the row-major kernels (every set), the packed-block kernels (AVX2
// set, also run by the AVX-512 set; Storage::ConvWeight prepared by cpu/weights.hpp) and the vdpbf16ps kernels
// (AVX-512 set, MathMode::BF16).
// Kernel-set body: included once per instruction set by cpu/kernels.hpp; the argument checks are in Ops<Cpu>.

/// Implicit im2col, shared by the Conv1d kernels: panel column n (b = n / out_length, t = n % out_length) over input
/// channels [i0, i0 + ni) is put(j, x[b, i0 + i, t*stride + k - pad]) for j = i*K + k in increasing j (zero where
/// the window leaves the input: PyTorch's zero padding). Each kernel's `put` lays the column out its own way.
template <class Put>
inline void im2col_column(const Conv1dParams& p, int n, int i0, int ni, Put&& put) {
    const int K = p.kernel, Lin = p.in_length, b = n / p.out_length, t = n % p.out_length;
    const float* xb = p.x + (std::size_t(b) * std::size_t(p.in_channels) + std::size_t(i0)) * std::size_t(Lin);
    const int start = t * p.stride - p.pad;
    for (int i = 0; i < ni; ++i) {
        const float* xr = xb + std::size_t(i) * Lin;
        for (int k = 0; k < K; ++k) {
            const int s = start + k;
            put(i * K + k, (s >= 0 && s < Lin) ? xr[s] : 0.f);
        }
    }
}

/// Conv1d output y[b, o, t] of panel column n: the first input-channel chunk stores bias + v, later chunks add v
/// (the same order in every kernel, so a thread count or layout change keeps the bits of each sum's epilogue).
inline void conv_out(const Conv1dParams& p, int n, int o, float v, bool first) {
    const int b = n / p.out_length, t = n % p.out_length;
    float& dst = p.y[(std::size_t(b) * std::size_t(p.out_channels) + std::size_t(o)) * std::size_t(p.out_length) + std::size_t(t)];
    if (first) dst = v + (p.bias ? p.bias[o] : 0.f);
    else dst += v;
}

template <class WT>
inline void conv1d_impl(const Conv1dParams& p, const WT* w) {
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lout = p.out_length;
    const int N = p.batch * Lout;
    const std::size_t R = std::size_t(Cin) * std::size_t(K);
    // Columns per pass (weights are streamed once per pass) and input channels per im2col panel.
    const int ns = std::min(N, 64);
    const std::size_t per_col = (kScratchFloats / std::size_t(ns)) / 16 * 16;
    const int chunk_in = int(std::min<std::size_t>(std::size_t(Cin), per_col / std::size_t(K)));
    [[maybe_unused]] const bool par = double(N) * double(R) * Cout >= kParallelMacs;
    // One parallel region per call and no barrier inside it: every thread builds its own copy of each im2col
    // panel (a few hundred KiB at most, cheap next to its share of the weights) and streams only its own output
    // rows. A thread that loses its core therefore delays only its half instead of stalling the others at every
    // chunk.
#pragma omp parallel if (par)
    {
        alignas(64) float panel[kScratchFloats];
        const int tid = thread_index(), nth = thread_count();
#if FLOWEDGE_ISA_EIGEN
        // Whole 16-row units: Eigen's GEMV sums a row by the position of its group in the product, so a split on any
        // other row would change bits with the thread count.
        const int units = (Cout + 15) / 16;
        const int o0 = std::min(Cout, 16 * int(std::int64_t(units) * tid / nth));
        const int o1 = std::min(Cout, 16 * int(std::int64_t(units) * (tid + 1) / nth));
#else
        const int o0 = int(std::int64_t(Cout) * tid / nth), o1 = int(std::int64_t(Cout) * (tid + 1) / nth);
#endif
        for (int n0 = 0; n0 < N; n0 += ns) {
            const int nn = std::min(ns, N - n0);
            for (int i0 = 0; i0 < Cin; i0 += chunk_in) {
                const int ni = std::min(chunk_in, Cin - i0);
                const int len = ni * K;
                const std::size_t ldp = round_up16(std::size_t(len));
                // Panel column c: the reduction index i*K + k contiguous (the weight row's order).
                for (int c = 0; c < nn; ++c) {
                    float* dst = panel + std::size_t(c) * ldp;
                    im2col_column(p, n0 + c, i0, ni, [dst](int j, float v) { dst[j] = v; });
                }
                const bool first = i0 == 0;
                auto epilogue = [&](int o, int c, float v) { conv_out(p, n0 + c, o, v, first); };
                if (o0 < o1) gemm_rows(w + std::size_t(i0) * K, R, panel, ldp, len, o0, o1, nn, epilogue);
            }
        }
    }
}

#if FLOWEDGE_ISA_AVX2
/// Reduction steps per micro-kernel pass over one packed block (packed_conv.hpp): that slice of the block
/// (kPackChunk * kConvBlockWidth weights, 8 KiB at F32 on AVX2) and of the panel stay in L1 while every column group
/// uses them, and each output is summed in chunks of this length whose partial sums are then added to a running total
/// (shorter float chains than one sequential sum over in*kernel elements). Even: BF16 blocks store steps in pairs.
inline constexpr int kPackChunk = 128;

/// Most columns per pass of the packed conv kernels (the packed weights are streamed once per pass).
inline constexpr int kPackedPassCols = 64;

/// The passes of the packed conv kernels: columns per pass and input channels per chunk (the panel of one pass and
/// chunk fits kScratchFloats). Shared by conv1d_packed_part and the AVX-512 set's BF16 kernel, which must make the
/// same passes to give the same bits. BF16 blocks pair steps (j, j+1) from j = 0, so every input-channel chunk must
/// start at an even step: an even channel count per chunk (at least 2, hence at most kScratchFloats / (2K) columns).
struct PackedConvPasses {
    int cols;
    int chunk_in;
};
template <class WT>
inline PackedConvPasses packed_conv_passes(const Conv1dParams& p) {
    const std::size_t K = std::size_t(p.kernel);
    constexpr bool kPairs = packed_conv_steps<WT>(1) == 2;
    const int ns = std::min({p.batch * p.out_length, kPackedPassCols, kPairs ? int(kScratchFloats / (2 * K)) : kPackedPassCols});
    int chunk_in = int(std::min<std::size_t>(std::size_t(p.in_channels), kScratchFloats / (std::size_t(ns) * K)));
    if (kPairs && chunk_in < p.in_channels) chunk_in &= ~1;
    return {ns, chunk_in};
}

/// This thread's share (output blocks [blocks*tid/nth, blocks*(tid+1)/nth)) of conv1d_packed_impl, so that several
/// convolutions can share one parallel region (linear_batch, conv_transpose1d on packed weights).
template <class WT>
inline void conv1d_packed_part(const Conv1dParams& p, const WT* wp, int tid, int nth) {
    constexpr int W = kConvBlockWidth<WT>, kMaxCols = kConvMaxCols<WT>;
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lout = p.out_length;
    const int N = p.batch * Lout;
    const std::size_t R = std::size_t(Cin) * std::size_t(K), block_steps = packed_conv_steps<WT>(R);
    const int blocks = (Cout + W - 1) / W;
    constexpr int kCols = kPackedPassCols;
    const auto [ns, chunk_in] = packed_conv_passes<WT>(p);
    {
        alignas(64) float panel[kScratchFloats];
        alignas(64) float tot[kCols * W];
        const int b0 = int(std::int64_t(blocks) * tid / nth), b1 = int(std::int64_t(blocks) * (tid + 1) / nth);
        if (b0 == b1) return;
        for (int n0 = 0; n0 < N; n0 += ns) {
            const int nn = std::min(ns, N - n0);
            const int groups = (nn + kMaxCols - 1) / kMaxCols;
            for (int i0 = 0; i0 < Cin; i0 += chunk_in) {
                const int ni = std::min(chunk_in, Cin - i0);
                const int len = ni * K;
                // The panel transposed ([j][column]): one row of nn columns per reduction index j.
                for (int c = 0; c < nn; ++c)
                    im2col_column(p, n0 + c, i0, ni, [&](int j, float v) { panel[std::size_t(j) * nn + c] = v; });
                const bool first = i0 == 0;
                for (int ob = b0; ob < b1; ++ob) {
                    std::fill(tot, tot + std::size_t(nn) * W, 0.f);
                    const WT* wb = wp + (std::size_t(ob) * block_steps + std::size_t(i0) * K) * W;
                    for (int j0 = 0; j0 < len; j0 += kPackChunk) {
                        const int n = std::min(kPackChunk, len - j0);
                        // Column groups of <= kMaxCols, as even as possible (8 -> 4 + 4: 8 or 12 accumulators each).
                        for (int g = 0, c0 = 0; g < groups; ++g) {
                            const int c1 = nn * (g + 1) / groups;
                            packed_chunk_n(c1 - c0, wb + std::size_t(j0) * W, panel + std::size_t(j0) * nn, std::size_t(nn), n, c0, tot);
                            c0 = c1;
                        }
                    }
                    if constexpr (std::is_same_v<WT, std::int8_t>)
                        scale_block_sums(int8_block_scales(wp + std::size_t(ob) * block_steps * W, R), nn, tot);
                    const int o0 = ob * W, o1 = std::min(Cout, o0 + W);
                    for (int c = 0; c < nn; ++c)
                        for (int o = o0; o < o1; ++o) conv_out(p, n0 + c, o, tot[std::size_t(c) * W + std::size_t(o - o0)], first);
                }
            }
        }
    }
}

/// conv1d_impl on packed conv blocks (Storage::ConvWeight on the AVX2 set): the same column passes, input-channel
/// chunks, thread split (by output blocks) and epilogue order (bias + first chunk, then += later chunks), but the
/// im2col panel is laid out [j][column] and each packed block of kConvBlockWidth<WT> outputs is streamed once per pass
/// (one contiguous stream per thread). Per output: sum over j in kPackChunk pieces, each piece sequential in j;
/// deterministic for any thread count and column grouping.
template <class WT>
inline void conv1d_packed_impl(const Conv1dParams& p, const WT* wp) {
    [[maybe_unused]] const bool par =
        double(p.batch) * p.out_length * double(p.in_channels) * p.kernel * p.out_channels >= kParallelMacs;
#pragma omp parallel if (par)
    conv1d_packed_part(p, wp, thread_index(), thread_count());
}
#endif

#if FLOWEDGE_ISA_AVX512
/// conv1d_impl under MathMode::BF16: the same passes, thread split and epilogue, but each im2col panel column is
/// rounded to BF16 (RNE) as it is built, with the reduction index i*K + k contiguous (the weight row's order, which
/// vdpbf16ps pairs along) and zeros up to a multiple of 32; BF16 halves the panel, so a pass takes twice the
/// input channels.
template <class WT>
inline void conv1d_bf16_impl(const Conv1dParams& p, const WT* w) {
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lout = p.out_length;
    const int N = p.batch * Lout;
    const std::size_t R = std::size_t(Cin) * std::size_t(K);
    constexpr std::size_t kPanelBh = 2 * kScratchFloats;  // BF16 elements in the same 256 KiB
    const int ns = std::min(N, 64);
    const std::size_t per_col = (kPanelBh / std::size_t(ns)) / 32 * 32;
    const int chunk_in = int(std::min<std::size_t>(std::size_t(Cin), per_col / std::size_t(K)));
    [[maybe_unused]] const bool par = double(N) * double(R) * Cout >= kParallelMacs;
#pragma omp parallel if (par)
    {
        alignas(64) bf16 panel[kPanelBh];
        const int tid = thread_index(), nth = thread_count();
        const int o0 = int(std::int64_t(Cout) * tid / nth), o1 = int(std::int64_t(Cout) * (tid + 1) / nth);
        for (int n0 = 0; n0 < N; n0 += ns) {
            const int nn = std::min(ns, N - n0);
            for (int i0 = 0; i0 < Cin; i0 += chunk_in) {
                const int ni = std::min(chunk_in, Cin - i0);
                const int len = ni * K;
                const std::size_t ldp = round_up32(std::size_t(len));
                for (int c = 0; c < nn; ++c) {
                    bf16* dst = panel + std::size_t(c) * ldp;
                    // Gathered 32 floats at a time, then rounded together (vcvtne2ps2bf16).
                    alignas(64) float tmp[32];
                    int fill = 0;
                    std::size_t at = 0;
                    im2col_column(p, n0 + c, i0, ni, [&](int, float v) {
                        tmp[fill++] = v;
                        if (fill == 32) {
                            store_bh_n(dst + at, tmp, 32);
                            at += 32;
                            fill = 0;
                        }
                    });
                    if (fill) store_bh_n(dst + at, tmp, fill);
                }
                const bool first = i0 == 0;
                auto epilogue = [&](int o, int c, float v) { conv_out(p, n0 + c, o, v, first); };
                if (o0 < o1) gemm_rows(w + std::size_t(i0) * K, R, panel, ldp, len, o0, o1, nn, epilogue);
            }
        }
    }
}
#endif

// W8A8: the block layout and the AVX2 set's kernel, which use im2col_column and conv_out above.
#include "flowedge/cpu/kernels/packed_conv_w8a8.hpp"
// The dot-product kernels on packed blocks (AVX-512 set).
#include "flowedge/cpu/kernels/packed_conv_dot.hpp"
// The same two modes on AMX tiles (AVX-512 set, where the CPU has AMX).
#include "flowedge/cpu/kernels/amx_conv.hpp"
// The exact kernel on BF16 blocks with 512-bit vectors (AVX-512 set).
#include "flowedge/cpu/kernels/packed_conv_bf16_zmm.hpp"

/// Ops<Cpu>::conv1d after its checks. blocks: the weight in the packed block layout (AVX2 and AVX-512 sets; int8: the
/// avx2::Int8Blocks of INT8 or W8A8 blocks), or null for the row-major weight p.w.data; bf16: run MathMode::BF16 on
/// vdpbf16ps (AVX-512 set with AVX512_BF16: row-major weights, and BF16 blocks; F32 and F16 blocks stay exact).
/// BF16 blocks under MathMode::BF16 and W8A8 blocks run on AMX tiles where cpu::amx_bf16_available() /
/// amx_int8_available() (amx_conv.hpp), else on the vector dot-product kernels (AVX-512 set: vpdpbusd; AVX2 set:
/// W8A8 on vpmaddubsw, packed_conv_w8a8.hpp). INT8 weight-only blocks under
/// MathMode::BF16 run on AMX tiles (int8 widened to BF16 per tile) where cpu::amx_bf16_available(), and exactly (the
/// widening F32 kernel) everywhere else.
inline void conv1d(const Conv1dParams& p, const void* blocks, bool int8, bool bf16) {
#if FLOWEDGE_ISA_AVX2
    if (blocks) {
        if (int8 && static_cast<const Int8Blocks*>(blocks)->w8a8) {
            w8a8::conv1d(p, static_cast<const Int8Blocks*>(blocks)->data);
            return;
        }
        // Every MathMode runs the exact packed kernel (no BF16 arithmetic kernel exists in this set).
        with_blocks(blocks, p.w.dtype, int8, [&](auto w) { conv1d_packed_impl(p, w); });
        return;
    }
#elif FLOWEDGE_ISA_AVX512
    if (blocks) {
        if (int8) {
            const auto* q = static_cast<const ::flowedge::cpu::avx2::Int8Blocks*>(blocks);
            if (q->w8a8) {
                if (::flowedge::cpu::amx_int8_available()) packed_dot::amx::conv1d_w8a8_amx(p, q->data);
                else packed_dot::conv1d_w8a8(p, q->data);
                return;
            }
            if (bf16 && p.math == MathMode::BF16 && ::flowedge::cpu::amx_bf16_available() && packed_dot::amx::bh_plan(p).ns > 0) {
                packed_dot::amx::conv1d_int8_bh_amx(p, q->data);
                return;
            }
        }
        // At <= kExactBf16MaxCols columns (the U-Net's L = 4 convs at batch 1) a BF16 request on BF16 blocks runs the
        // exact 512-bit kernel: those convs stream weights, and it streams them faster than the AMX / vdpbf16ps
        // kernels (bench/results/diffusion_cpu_bf16_zmm.md); exact results are within the BF16 bound too.
        const bool exact_faster = p.batch * p.out_length <= packed_bf16_zmm::kExactBf16MaxCols && packed_bf16_zmm::enabled();
        if (bf16 && p.math == MathMode::BF16 && !int8 && p.w.dtype == DType::BF16 && packed_dot::bh_pairs_per_column(p) > 0 &&
            !exact_faster) {
            const auto* wb = static_cast<const ::flowedge::bf16*>(blocks);
            if (::flowedge::cpu::amx_bf16_available() && packed_dot::amx::bh_plan(p).ns > 0) packed_dot::amx::conv1d_bh_amx(p, wb);
            else packed_dot::conv1d_bh(p, wb);
            return;
        }
        if (!int8 && p.w.dtype == DType::BF16 && packed_bf16_zmm::enabled()) {
            packed_bf16_zmm::conv1d(p, static_cast<const ::flowedge::bf16*>(blocks));
            return;
        }
        ::flowedge::cpu::avx2::conv1d(p, blocks, int8, false);  // the AVX2 set's layout and exact kernels
        return;
    }
    if (bf16 && p.math == MathMode::BF16) {
        with_weights(p.w, [&](auto w) { conv1d_bf16_impl(p, w); });
        return;
    }
#endif
    (void)blocks;
    (void)int8;
    (void)bf16;
    with_weights(p.w, [&](auto w) { conv1d_impl(p, w); });
}
