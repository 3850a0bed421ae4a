// torch.nn.ConvTranspose1d on the CPU: the axpy + col2im form (every set) and the packed kernel-1 Conv1d + col2im form
// (AVX2 set, also run by the AVX-512 set; Storage::ConvTransposeWeight prepared by cpu/weights.hpp). Kernel-set body: included once per
// instruction set by cpu/kernels.hpp; the argument checks are in Ops<Cpu>.

#if FLOWEDGE_ISA_AVX2
/// torch.nn.ConvTranspose1d on packed weights (Storage::ConvTransposeWeight: [out*K, in] rows o*K + k, see
/// pack_conv_transpose_weights). Per group of batch rows and chunk of whole packed blocks of rows:
///   Z[b, r, s] = sum_i wt[r, i] x[b, i, s]             (the packed kernel-1 Conv1d, any number of threads)
///   y[b, o, s*stride - pad + k] += Z[b, o*K + k, s]    (col2im, threads split by output channel)
/// after y = bias. Each y element gets bias, then its (k, s) terms in increasing k: the same order for any chunking
/// or thread count. Why: the axpy form (conv_transpose1d_impl) re-reads its partial sums from L2 for every 4 input
/// channels, which holds the PushT Upsample1d weight stream far below the read bandwidth; this form streams them like
/// a Conv1d.
/// Needs in_length * kConvBlockWidth<WT> <= kScratchFloats (the caller checks).
template <class WT>
inline void conv_transpose1d_packed_impl(const ConvTranspose1dParams& p, const WT* wp) {
    constexpr int W = kConvBlockWidth<WT>;
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lin = p.in_length, Lout = p.out_length;
    const int J = Cout * K;
    const int group = std::max(1, std::min(p.batch, int(kScratchFloats / (std::size_t(W) * std::size_t(Lin)))));
    const int chunk_rows = int(kScratchFloats / (std::size_t(group) * std::size_t(Lin))) / W * W;  // >= W
    const std::size_t block_elems = std::size_t(W) * packed_conv_steps<WT>(std::size_t(Cin));
    alignas(64) float z[kScratchFloats];
    [[maybe_unused]] const bool par = double(p.batch) * Lin * double(J) * Cin >= kParallelMacs;
#pragma omp parallel if (par)
    {
        const int tid = thread_index(), nth = thread_count();
        auto share = [&](int lo, int hi, int& a, int& b) {  // this thread's part of [lo, hi)
            a = lo + int(std::int64_t(hi - lo) * tid / nth);
            b = lo + int(std::int64_t(hi - lo) * (tid + 1) / nth);
        };
        int oa, ob;
        share(0, Cout, oa, ob);
        for (int b = 0; b < p.batch; ++b)
            for (int o = oa; o < ob; ++o)
                std::fill_n(p.y + (std::size_t(b) * Cout + std::size_t(o)) * std::size_t(Lout), Lout, p.bias ? p.bias[o] : 0.f);
        for (int b0 = 0; b0 < p.batch; b0 += group) {
            const int nb = std::min(group, p.batch - b0);
            for (int r0 = 0; r0 < J; r0 += chunk_rows) {
                const int r1 = std::min(J, r0 + chunk_rows), rows = r1 - r0;
                Conv1dParams c;
                c.x = p.x + std::size_t(b0) * std::size_t(Cin) * std::size_t(Lin);
                c.w = p.w;
                c.y = z;
                c.batch = nb;
                c.in_channels = Cin;
                c.out_channels = rows;
                c.in_length = c.out_length = Lin;
                c.kernel = 1;
                conv1d_packed_part(c, wp + std::size_t(r0 / W) * block_elems, tid, nth);
#pragma omp barrier
                share(r0 / K, (r1 + K - 1) / K, oa, ob);
                for (int bb = 0; bb < nb; ++bb)
                    for (int o = oa; o < ob; ++o) {
                        float* yo = p.y + (std::size_t(b0 + bb) * Cout + std::size_t(o)) * std::size_t(Lout);
                        for (int k = std::max(0, r0 - o * K); k < K && o * K + k < r1; ++k) {
                            const float* zr = z + (std::size_t(bb) * rows + std::size_t(o * K + k - r0)) * std::size_t(Lin);
                            for (int s = 0; s < Lin; ++s) {
                                const int t = s * p.stride - p.pad + k;
                                if (t >= 0 && t < Lout) yo[t] += zr[s];
                            }
                        }
                    }
#pragma omp barrier
            }
        }
    }
}
#endif

template <class WT>
inline void conv_transpose1d_impl(const ConvTranspose1dParams& p, const WT* w) {
    const int K = p.kernel, Cin = p.in_channels, Cout = p.out_channels, Lin = p.in_length, Lout = p.out_length;
    const std::size_t J = std::size_t(Cout) * std::size_t(K);
    // Passes cover whole batch elements (so every output is written in exactly one pass); the partial sums
    // Z[(b, s), (o, k)] = sum_i w[i, o, k] x[b, i, s] of an output-channel chunk live in the stack scratch.
    const int nb = std::max(1, std::min(p.batch, 64 / std::max(1, Lin)));
    const int ns = nb * Lin;
    const std::size_t per_col = (kScratchFloats / std::size_t(ns)) / 16 * 16;
    const int chunk_o = int(std::min<std::size_t>(std::size_t(Cout), per_col / std::size_t(K)));
    alignas(64) float z[kScratchFloats];
    [[maybe_unused]] const bool par = double(p.batch) * Lin * double(J) * Cin >= kParallelMacs;
#pragma omp parallel if (par)
    {
        const int tid = thread_index(), nth = thread_count();
        [[maybe_unused]] float xs[64 * 4];
        for (int b0 = 0; b0 < p.batch; b0 += nb) {
            const int nbb = std::min(nb, p.batch - b0);
            [[maybe_unused]] const int nn = nbb * Lin;
            for (int oA = 0; oA < Cout; oA += chunk_o) {
                const int no = std::min(chunk_o, Cout - oA);
                const int jlen = no * K;
                const std::size_t ldz = round_up16(std::size_t(jlen));
                const int units = (jlen + 15) / 16;
                const int j0 = std::min(jlen, 16 * int(std::int64_t(units) * tid / nth));
                const int j1 = std::min(jlen, 16 * int(std::int64_t(units) * (tid + 1) / nth));
#if FLOWEDGE_ISA_EIGEN
                // Z rows [j0, j1) of each batch element: Z_b (no*K x Lin) = w^T (no*K x Cin) * x_b (Cin x Lin).
                for (int bb = 0; bb < nbb && j0 < j1; ++bb)
                    eigen_gemm<Eigen::ColMajor, Eigen::RowMajor>(j1 - j0, Lin, Cin, w + std::size_t(oA) * K + std::size_t(j0), J,
                                                                 p.x + std::size_t(b0 + bb) * Cin * std::size_t(Lin), std::size_t(Lin),
                                                                 z + std::size_t(bb * Lin) * ldz + std::size_t(j0), ldz, false);
#else
                for (int c = 0; c < nn; ++c) std::fill(z + std::size_t(c) * ldz + j0, z + std::size_t(c) * ldz + j1, 0.f);
                if (j0 < j1) {
                    for (int i = 0; i < Cin; i += 4) {
                        const int g = std::min(4, Cin - i);
                        for (int c = 0; c < nn; ++c) {
                            const int b = b0 + c / Lin, s = c % Lin;
                            for (int gg = 0; gg < 4; ++gg)
                                xs[c * 4 + gg] = gg < g ? p.x[(std::size_t(b) * Cin + std::size_t(i + gg)) * Lin + s] : 0.f;
                        }
                        const WT* wr = w + std::size_t(i) * J + std::size_t(oA) * K;
                        switch (g) {
                            case 4: axpy_rows<4>(wr, J, xs, nn, z, ldz, j0, j1); break;
                            case 3: axpy_rows<3>(wr, J, xs, nn, z, ldz, j0, j1); break;
                            case 2: axpy_rows<2>(wr, J, xs, nn, z, ldz, j0, j1); break;
                            default: axpy_rows<1>(wr, J, xs, nn, z, ldz, j0, j1); break;
                        }
                    }
                }
#endif
#pragma omp barrier
                // col2im: y[b, o, t] = bias[o] + sum over k with t + pad - k = s*stride, 0 <= s < Lin.
#pragma omp for schedule(static)
                for (int o = oA; o < oA + no; ++o) {
                    const float bias = p.bias ? p.bias[o] : 0.f;
                    for (int bb = 0; bb < nbb; ++bb) {
                        float* yr = p.y + (std::size_t(b0 + bb) * Cout + std::size_t(o)) * Lout;
                        for (int t = 0; t < Lout; ++t) {
                            float acc = bias;
                            for (int k = 0; k < K; ++k) {
                                const int num = t + p.pad - k;
                                if (num < 0 || num % p.stride != 0) continue;
                                const int s = num / p.stride;
                                if (s >= Lin) continue;
                                acc += z[std::size_t(bb * Lin + s) * ldz + std::size_t(o - oA) * K + k];
                            }
                            yr[t] = acc;
                        }
                    }
                }
            }
        }
    }
}

/// Ops<Cpu>::conv_transpose1d after its checks. blocks: the weight packed as [out*K, in] conv blocks (AVX2 and AVX-512 sets; int8:
/// the INT8 blocks), or null for the [in, out, K] weight p.w.data.
inline void conv_transpose1d(const ConvTranspose1dParams& p, const void* blocks, bool int8) {
#if FLOWEDGE_ISA_AVX2
    if (blocks) {
        with_blocks(blocks, p.w.dtype, int8, [&](auto w) {
            constexpr int W = kConvBlockWidth<std::remove_cvref_t<decltype(*w)>>;
            if (std::size_t(p.in_length) * W > kScratchFloats) [[unlikely]]
                fail(ErrorKind::Unsupported, "cpu conv_transpose1d", "in_length too long for packed weights" +
                                                 expected_got("<= " + std::to_string(kScratchFloats / W), p.in_length));
            conv_transpose1d_packed_impl(p, w);
        });
        return;
    }
#elif FLOWEDGE_ISA_AVX512
    if (blocks) {
        ::flowedge::cpu::avx2::conv_transpose1d(p, blocks, int8);  // the AVX2 set's layout and kernels
        return;
    }
#endif
    (void)blocks;
    (void)int8;  // only the x86 sets prepare blocks (cpu/weights.hpp)
    with_weights(p.w, [&](auto w) { conv_transpose1d_impl(p, w); });
}
