// torch.nn.Conv2d on the CPU (the ResNet18 image encoder): an im2col panel of output positions, laid out in tiles of
// kConv2dMaxVecs vectors so the positions run along the vector lanes, times MR output channels whose weights are
// broadcast one reduction step at a time (an outer-product micro-kernel: MR x NV accumulators, every panel vector
// loaded once per MR FMAs). Weights stay row-major [out, in*kh*kw]; BF16/F16 rows are widened per MR-row block into
// stack scratch. Kernel-set body: included once per instruction set by cpu/kernels.hpp; the checks are in Ops<Cpu>.

/// Position vectors per panel tile: 4 x 16 on AVX-512 (32 registers), 2 x 8 elsewhere (16 registers).
inline constexpr int kConv2dMaxVecs = FLOWEDGE_ISA_AVX512 ? 4 : 2;
/// Positions per full panel tile.
inline constexpr int kConv2dTile = kConv2dMaxVecs * kLanes;
/// Longest reduction chunk (input channels * kh * kw) one pass takes: bounds the widened-weight scratch (MR rows).
inline constexpr int kConv2dMaxLen = 2304;

/// Output channels per micro-kernel for nv position vectors: MR * nv accumulators + nv panel vectors + one
/// broadcast fill the register file, at most 8.
constexpr int conv2d_rows(int nv) {
    const int r = (kRegisters - nv - 1) / nv;
    return r > 8 ? 8 : r;
}
inline constexpr int kConv2dMaxRows = conv2d_rows(1);

/// out[r][q] = sum_{j < len} w[min(r, nrows-1)*ldw + j] * panel[j*NV*kLanes + q] for MR rows and NV*kLanes positions
/// (rows at or past nrows repeat the last valid row; the caller ignores them).
template <int MR, int NV>
inline void conv2d_tile(const float* w, std::size_t ldw, int nrows, const float* panel, int len, float* out) {
    constexpr int W = NV * kLanes;
    VecF acc[MR][NV];
    for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = vzero();
    const float* wr[MR];
    for (int r = 0; r < MR; ++r) wr[r] = w + std::size_t(std::min(r, nrows - 1)) * ldw;
    for (int j = 0; j < len; ++j) {
        VecF xv[NV];
        for (int v = 0; v < NV; ++v) xv[v] = vload(panel + std::size_t(j) * W + v * kLanes);
        for (int r = 0; r < MR; ++r) {
            const VecF wb = vset1(wr[r][j]);
            for (int v = 0; v < NV; ++v) acc[r][v] = vfma(wb, xv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) vstore(out + r * W + v * kLanes, acc[r][v]);
}

/// conv2d_tile for a run-time (MR, nv): MR = conv2d_rows(nv0) of the block's widest tile, nv <= nv0.
inline void conv2d_tile_any(int MR, int nv, const float* w, std::size_t ldw, int nrows, const float* panel, int len, float* out) {
    constexpr int M1 = conv2d_rows(1), M2 = conv2d_rows(2);
#if FLOWEDGE_ISA_AVX512
    constexpr int M3 = conv2d_rows(3), M4 = conv2d_rows(4);
    static_assert(M1 == 8 && M2 == 8 && M3 == 8 && M4 == 6, "conv2d: the (MR, nv) table below assumes 32 registers");
    if (MR == M4) {
        switch (nv) {
            case 1: conv2d_tile<M4, 1>(w, ldw, nrows, panel, len, out); return;
            case 2: conv2d_tile<M4, 2>(w, ldw, nrows, panel, len, out); return;
            case 3: conv2d_tile<M4, 3>(w, ldw, nrows, panel, len, out); return;
            default: conv2d_tile<M4, 4>(w, ldw, nrows, panel, len, out); return;
        }
    }
    switch (nv) {
        case 1: conv2d_tile<M1, 1>(w, ldw, nrows, panel, len, out); return;
        case 2: conv2d_tile<M2, 2>(w, ldw, nrows, panel, len, out); return;
        default: conv2d_tile<M3, 3>(w, ldw, nrows, panel, len, out); return;
    }
#else
    static_assert(M1 == 8 && M2 == 6, "conv2d: the (MR, nv) table below assumes 16 registers");
    if (MR == M2) {
        if (nv == 1) conv2d_tile<M2, 1>(w, ldw, nrows, panel, len, out);
        else conv2d_tile<M2, 2>(w, ldw, nrows, panel, len, out);
        return;
    }
    conv2d_tile<M1, 1>(w, ldw, nrows, panel, len, out);
#endif
}

/// a / stride for a >= 0 without a division at the ResNet's strides 1 and 2 (the stem's edge segments are many).
inline int div_stride(int a, int stride) { return stride == 1 ? a : stride == 2 ? a >> 1 : a / stride; }

/// Im2col of one tile: dst[(j - j0) * W + q] = x[b, i, r*sh + kh - ph, c*sw + kw - pw] for the tile's positions
/// q < cnt (position n0 + q = r * out_w + c of image b), j = (i * kh_count + kh) * kw_count + kw in [j0, j0 + len);
/// zero outside the image (PyTorch's zero padding) and for q in [cnt, W).
inline void conv2d_im2col(const Conv2dParams& p, int b, int n0, int cnt, int W, int j0, int len, float* dst) {
    const int KH = p.kernel_h, KW = p.kernel_w, KK = KH * KW, OW = p.out_w;
    int i = j0 / KK, kh = (j0 % KK) / KW, kw = j0 % KW;
    const int r0 = n0 / OW, c0 = n0 % OW;
    for (int jj = 0; jj < len; ++jj) {
        float* row = dst + std::size_t(jj) * W;
        const float* xi = p.x + (std::size_t(b) * p.in_channels + std::size_t(i)) * std::size_t(p.in_h) * std::size_t(p.in_w);
        int q = 0, r = r0, c = c0;
        while (q < cnt) {
            const int seg = std::min(cnt - q, OW - c);
            const int ih = r * p.stride_h + kh - p.pad_h;
            if (ih < 0 || ih >= p.in_h) {
                for (int s = 0; s < seg; ++s) row[q + s] = 0.f;
            } else {
                const float* xr = xi + std::size_t(ih) * p.in_w;
                const int base = c * p.stride_w + kw - p.pad_w, sw = p.stride_w;
                // Segment elements [s_lo, s_hi) read inside the input row (iw = base + s*sw); the padding either side
                // is zero. Edge taps (kw = 0 or kw = kernel-1 with padding: two rows in three of a 3x3 conv) copy
                // their interior like the others instead of testing every element; the divisions run only at the
                // edges (the stem's stride-2 rows have many short segments).
                const int s_lo = base >= 0 ? 0 : std::min(seg, div_stride(-base + sw - 1, sw));
                const int s_hi = base + (seg - 1) * sw < p.in_w ? seg
                                 : std::max(s_lo, std::min(seg, base < p.in_w ? div_stride(p.in_w - 1 - base, sw) + 1 : 0));
                for (int s = 0; s < s_lo; ++s) row[q + s] = 0.f;
                if (sw == 1) {
                    copy_floats(row + q + s_lo, xr + base + s_lo, s_hi - s_lo);
                } else if (sw == 2) {
                    copy_floats_even(row + q + s_lo, xr + base + 2 * s_lo, s_hi - s_lo);
                } else {
                    for (int s = s_lo; s < s_hi; ++s) row[q + s] = xr[base + s * sw];
                }
                for (int s = s_hi; s < seg; ++s) row[q + s] = 0.f;
            }
            q += seg;
            ++r;
            c = 0;
        }
        for (; q < W; ++q) row[q] = 0.f;
        if (++kw == KW) {
            kw = 0;
            if (++kh == KH) {
                kh = 0;
                ++i;
            }
        }
    }
}

/// One im2col column: dst[jj] = x[b, i, r*sh + kh - ph, c*sw + kw - pw] for output position n = r * out_w + c and
/// j = j0 + jj = (i * kh_count + kh) * kw_count + kw, jj < len; zero outside the image. Whole input channels (the
/// late layers' single chunk) go one kernel row at a time with the in-image taps found once per position.
inline void conv2d_im2col_column(const Conv2dParams& p, int b, int n, int j0, int len, float* dst) {
    const int KH = p.kernel_h, KW = p.kernel_w, KK = KH * KW;
    const int r = n / p.out_w, c = n % p.out_w;
    const std::size_t plane = std::size_t(p.in_h) * std::size_t(p.in_w);
    const float* xb = p.x + std::size_t(b) * p.in_channels * plane;
    const int iw0 = c * p.stride_w - p.pad_w, ih0 = r * p.stride_h - p.pad_h;
    if (j0 % KK == 0 && len % KK == 0) {
        const int kw_lo = std::clamp(-iw0, 0, KW), kw_hi = std::clamp(p.in_w - iw0, kw_lo, KW);
        for (int i = j0 / KK, ie = i + len / KK; i < ie; ++i) {
            const float* xi = xb + std::size_t(i) * plane;
            for (int kh = 0; kh < KH; ++kh, dst += KW) {
                const int ih = ih0 + kh;
                if (ih < 0 || ih >= p.in_h) {
                    for (int kw = 0; kw < KW; ++kw) dst[kw] = 0.f;
                    continue;
                }
                const float* xr = xi + std::size_t(ih) * p.in_w + iw0;
                for (int kw = 0; kw < kw_lo; ++kw) dst[kw] = 0.f;
                for (int kw = kw_lo; kw < kw_hi; ++kw) dst[kw] = xr[kw];
                for (int kw = kw_hi; kw < KW; ++kw) dst[kw] = 0.f;
            }
        }
        return;
    }
    int i = j0 / KK, kh = (j0 % KK) / KW, kw = j0 % KW;
    for (int jj = 0; jj < len; ++jj) {
        const int ih = ih0 + kh, iw = iw0 + kw;
        dst[jj] = (ih >= 0 && ih < p.in_h && iw >= 0 && iw < p.in_w) ? xb[std::size_t(i) * plane + std::size_t(ih) * p.in_w + std::size_t(iw)] : 0.f;
        if (++kw == KW) {
            kw = 0;
            if (++kh == KH) {
                kh = 0;
                ++i;
            }
        }
    }
}

/// Writes one tile's sums for rows [o, o + rows) and positions [0, cnt): the first reduction chunk stores
/// bias + v, later chunks add v; the last adds the residual and applies the activation (the torch order
/// act(conv + bias + residual), the sum itself in chunk order).
inline void conv2d_epilogue(const Conv2dParams& p, int b, int n0, int cnt, int o, int rows, const float* out, int W,
                            bool first, bool last) {
    const std::size_t N = std::size_t(p.out_h) * std::size_t(p.out_w);
    for (int r = 0; r < rows; ++r) {
        const std::size_t base = (std::size_t(b) * p.out_channels + std::size_t(o + r)) * N + std::size_t(n0);
        float* y = p.y + base;
        const float* v = out + std::size_t(r) * W;
        if (first) {
            const float bias = p.bias ? p.bias[o + r] : 0.f;
            for (int q = 0; q < cnt; ++q) y[q] = v[q] + bias;
        } else {
            for (int q = 0; q < cnt; ++q) y[q] += v[q];
        }
        if (last) {
            if (p.residual) {
                const float* res = p.residual + base;
                for (int q = 0; q < cnt; ++q) y[q] += res[q];
            }
            activate_inplace(p.act, y, cnt);
        }
    }
}

/// This thread's share of a conv2d: position tiles [t0, t1) of the flattened (image, tile) index and output channels
/// [o0, o1). Panels are built per block of consecutive tiles of one image and reduction chunk, then every MR-row
/// block of weights runs over every tile of the block (its widened copy, for 16-bit weights, made once per block).
template <class WT>
inline void conv2d_part(const Conv2dParams& p, const WT* w, int t0, int t1, int o0, int o1) {
    constexpr bool kF32 = std::is_same_v<WT, float>;
    const int N = p.out_h * p.out_w, tiles_per_image = (N + kConv2dTile - 1) / kConv2dTile;
    const int R = p.in_channels * p.kernel_h * p.kernel_w;
    alignas(64) float panel[kScratchFloats];
    alignas(64) float wide[kF32 ? 1 : kConv2dMaxRows * kConv2dMaxLen];
    alignas(64) float out[kConv2dMaxRows * kConv2dTile];
    // The longest chunk that still lets one full tile into the panel scratch.
    const int len0 = std::min({R, kConv2dMaxLen, int(kScratchFloats / kConv2dTile)});
    for (int t = t0; t < t1;) {
        const int b = t / tiles_per_image, tb = t % tiles_per_image, n0 = tb * kConv2dTile;
        const int tiles_left = std::min(t1 - t, tiles_per_image - tb);
        const int block_tiles = std::max(1, std::min(tiles_left, int(kScratchFloats / (std::size_t(kConv2dTile) * len0))));
        const int nb = std::min(block_tiles * kConv2dTile, N - n0);
        const int nb_pad = (nb + kLanes - 1) / kLanes * kLanes;  // panel floats per reduction step
        // A short block (the late ResNet layers: 9 or 36 positions) takes a longer chunk.
        const int len_chunk = std::min({R, kConv2dMaxLen, int(kScratchFloats / std::size_t(nb_pad))});
        const int nv0 = (std::min(kConv2dTile, nb) + kLanes - 1) / kLanes;
        const int MR = conv2d_rows(nv0);
        for (int j0 = 0; j0 < R; j0 += len_chunk) {
            const int len = std::min(len_chunk, R - j0);
            const bool first = j0 == 0, last = j0 + len == R;
            std::size_t off = 0;
            for (int q0 = 0; q0 < nb; q0 += kConv2dTile) {
                const int cnt = std::min(kConv2dTile, nb - q0);
                const int W = (cnt + kLanes - 1) / kLanes * kLanes;
                conv2d_im2col(p, b, n0 + q0, cnt, W, j0, len, panel + off);
                off += std::size_t(W) * len;
            }
            for (int o = o0; o < o1; o += MR) {
                const int rows = std::min(MR, o1 - o);
                const float* wr;
                std::size_t ldw;
                if constexpr (kF32) {
                    wr = w + std::size_t(o) * R + j0;
                    ldw = std::size_t(R);
                } else {
                    for (int r = 0; r < rows; ++r) {
                        const WT* src = w + std::size_t(o + r) * R + j0;
                        float* dst = wide + std::size_t(r) * len;
                        int j = 0;
                        for (; j + kLanes <= len; j += kLanes) vstore(dst + j, vload(src + j));
                        for (; j < len; ++j) dst[j] = widen(src[j]);
                    }
                    wr = wide;
                    ldw = std::size_t(len);
                }
                off = 0;
                for (int q0 = 0; q0 < nb; q0 += kConv2dTile) {
                    const int cnt = std::min(kConv2dTile, nb - q0);
                    const int nv = (cnt + kLanes - 1) / kLanes, W = nv * kLanes;
                    conv2d_tile_any(MR, nv, wr, ldw, rows, panel + off, len, out);
                    conv2d_epilogue(p, b, n0 + q0, cnt, o, rows, out, W, first, last);
                    off += std::size_t(W) * len;
                }
            }
        }
        t += block_tiles;
    }
}

/// Most output positions per image for which conv2d_dot_part runs instead (the ResNet's 3x3 layer4 and keypoint
/// conv): there a position tile would leave most lanes empty and every weight is used only a few times, so the
/// weight-streaming dot kernels of gemm.hpp (whole vectors of contiguous weights, positions as columns) win.
inline constexpr int kConv2dDotPositions = 16;

/// Columns per dot micro-kernel call on the conv path: a 3x3 output (ResNet layer4 at an 84x84 crop) in one call, so
/// each weight row streams from memory once (eight columns and then one would stream it twice); 3 rows x 9 columns
/// fill 27 of AVX-512's 32 registers with accumulators.
inline constexpr int kConv2dDotCols = 9;

/// Reduction chunk of the kConv2dDotCols-column dot path: 9 columns x 576 floats (20.7 KiB) fit a 32 KiB L1 beside
/// the weight lines in flight; 576 = 64 x 9 keeps chunks on whole input channels of a 3x3 kernel.
inline constexpr int kConv2dDotChunk = 576;

/// res[r][c] = sum_{j < len} w[r*ldw + j] * x[c*ldx + j] for RO weight rows and kConv2dDotCols columns: gemm.hpp's
/// dot_block with each activation vector loaded once per step into a register (left to itself GCC folds it into every
/// row's FMA as a memory operand: 30 loads per 27 FMAs, load-port bound where the weights are not).
template <int RO, class WT>
inline void conv2d_dot_block(const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, float (&res)[RO][kConv2dDotCols]) {
    constexpr int NC = kConv2dDotCols;
    VecF acc[RO][NC];
    for (int r = 0; r < RO; ++r)
        for (int c = 0; c < NC; ++c) acc[r][c] = vzero();
    int j = 0;
    for (; j + kLanes <= len; j += kLanes) {
        VecF wv[RO];
        for (int r = 0; r < RO; ++r) {
            if (sizeof(WT) == 4 || (j & 31) == 0) prefetch_ahead(w + std::size_t(r) * ldw, j, len, std::size_t(RO) * ldw);
            wv[r] = vload(w + std::size_t(r) * ldw + j);
        }
        for (int c = 0; c < NC; ++c) {
            VecF xv = vload(x + std::size_t(c) * ldx + j);
#if FLOWEDGE_ISA_SIMD
            asm("" : "+v"(xv));
#endif
            for (int r = 0; r < RO; ++r) acc[r][c] = vfma(wv[r], xv, acc[r][c]);
        }
    }
    for (int r = 0; r < RO; ++r)
        for (int c = 0; c < NC; ++c) res[r][c] = vsum(acc[r][c]);
    for (; j < len; ++j)
        for (int r = 0; r < RO; ++r) {
            const float wf = widen(w[std::size_t(r) * ldw + j]);
            for (int c = 0; c < NC; ++c) res[r][c] += wf * x[std::size_t(c) * ldx + j];
        }
}

/// f(o, c, dot(w row o, x column c)) for rows [o0, o1) and kConv2dDotCols columns (rows_for_cols rows per block).
template <class WT, class F>
inline void conv2d_dot_rows(const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, int o0, int o1, F& f) {
    constexpr int RO = rows_for_cols(kConv2dDotCols), NC = kConv2dDotCols;
    int o = o0;
    for (; o + RO <= o1; o += RO) {
        float res[RO][NC];
        conv2d_dot_block<RO>(w + std::size_t(o) * ldw, ldw, x, ldx, len, res);
        for (int r = 0; r < RO; ++r)
            for (int c = 0; c < NC; ++c) f(o + r, c, res[r][c]);
    }
    for (; o < o1; ++o) {
        float res[1][NC];
        conv2d_dot_block<1>(w + std::size_t(o) * ldw, ldw, x, ldx, len, res);
        for (int c = 0; c < NC; ++c) f(o, c, res[0][c]);
    }
}

/// gemm_rows for the conv paths: f(o, c, dot(w row o, x column c)) for rows [o0, o1) and ncols columns. A multiple
/// of kConv2dDotCols columns runs in column blocks of that width over row blocks that stay in L2 while every column
/// block uses them; other counts take gemm_rows.
template <class WT, class F>
inline void conv2d_dot_columns(const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, int o0, int o1,
                               int ncols, F& f) {
    if (ncols % kConv2dDotCols != 0) {
        gemm_rows(w, ldw, x, ldx, len, o0, o1, ncols, f);
        return;
    }
    for_l2_row_blocks(std::size_t(len) * sizeof(WT), o0, o1, ncols, kConv2dDotCols, [&](int ob, int oe, int cb, int) {
        ColumnOffset<F> g{f, cb};
        conv2d_dot_rows(w, ldw, x + std::size_t(cb) * ldx, ldx, len, ob, oe, g);
    });
}

/// The epilogue of the column-panel paths (dot, Eigen): f(o, c, v) adds v, the dot of output channel o and panel
/// column c (position n0 + c of image b), to y; the first reduction chunk starts from the bias, the last adds the
/// residual and applies the activation (conv2d_epilogue's order).
struct Conv2dColumnEpilogue {
    const Conv2dParams& p;
    int b, n0;
    bool first, last;
    void operator()(int o, int c, float v) const {
        const std::size_t N = std::size_t(p.out_h) * std::size_t(p.out_w);
        const std::size_t at = (std::size_t(b) * std::size_t(p.out_channels) + std::size_t(o)) * N + std::size_t(n0 + c);
        float s = first ? v + (p.bias ? p.bias[o] : 0.f) : p.y[at] + v;
        if (last) {
            if (p.residual) s += p.residual[at];
            s = activate(p.act, s);
        }
        p.y[at] = s;
    }
};

/// This thread's share (output channels [o0, o1)) of a conv2d with at most kConv2dDotPositions positions per image:
/// per image and reduction chunk, the im2col panel with one column per position ([position][j], j contiguous as in
/// the weight rows) and gemm_rows over the thread's weight rows; epilogue order as conv2d_epilogue.
template <class WT>
inline void conv2d_dot_part(const Conv2dParams& p, const WT* w, int o0, int o1) {
    const int N = p.out_h * p.out_w, R = p.in_channels * p.kernel_h * p.kernel_w;
    alignas(64) float panel[kScratchFloats];
    // Column stride: the chunk rounded up to 16 floats plus 16, so that columns (and the weight rows, whose stride
    // is often a multiple of 2 KiB) do not all fall on the same few L1 sets.
    // A multiple of kConv2dDotCols positions takes chunks of kConv2dDotChunk: a column block then stays in L1 while
    // every weight row multiplies it.
    const std::size_t fit = (kScratchFloats / std::size_t(N)) / 16 * 16 - 16;
    const int len_chunk = int(std::min({std::size_t(R), fit, N % kConv2dDotCols == 0 ? std::size_t(kConv2dDotChunk) : fit}));
    for (int b = 0; b < p.batch; ++b) {
        for (int j0 = 0; j0 < R; j0 += len_chunk) {
            const int len = std::min(len_chunk, R - j0);
            const std::size_t ldp = round_up16(std::size_t(len)) + 16;
            // conv2d_im2col writes [j][position] rows of width W: build one position at a time into its column.
            for (int n = 0; n < N; ++n) conv2d_im2col_column(p, b, n, j0, len, panel + std::size_t(n) * ldp);
            Conv2dColumnEpilogue epilogue{p, b, 0, j0 == 0, j0 + len == R};
            conv2d_dot_columns(w + std::size_t(j0), std::size_t(R), panel, ldp, len, o0, o1, N, epilogue);
        }
    }
}

#if FLOWEDGE_ISA_EIGEN
/// This thread's share (output channels [o0, o1)) of a conv2d on the Eigen set: per image, block of kEigenCols output
/// positions and reduction chunk, conv2d_dot_part's panel (one contiguous column per position) times the thread's
/// weight rows through gemm_rows (Eigen products), then Conv2dColumnEpilogue.
template <class WT>
inline void conv2d_eigen_part(const Conv2dParams& p, const WT* w, int o0, int o1) {
    const int N = p.out_h * p.out_w, R = p.in_channels * p.kernel_h * p.kernel_w;
    const int positions = std::min(N, kEigenCols);
    const int len_chunk = std::min(R, int(kScratchFloats / std::size_t(positions)) / 16 * 16);
    alignas(64) float panel[kScratchFloats];
    for (int b = 0; b < p.batch; ++b) {
        for (int n0 = 0; n0 < N; n0 += positions) {
            const int nb = std::min(positions, N - n0);
            for (int j0 = 0; j0 < R; j0 += len_chunk) {
                const int len = std::min(len_chunk, R - j0);
                const std::size_t ldp = round_up16(std::size_t(len));
                for (int n = 0; n < nb; ++n) conv2d_im2col_column(p, b, n0 + n, j0, len, panel + std::size_t(n) * ldp);
                Conv2dColumnEpilogue epilogue{p, b, n0, j0 == 0, j0 + len == R};
                gemm_rows(w + std::size_t(j0), std::size_t(R), panel, ldp, len, o0, o1, nb, epilogue);
            }
        }
    }
}
#endif

/// Ops<Cpu>::conv2d after its checks: OpenMP over position tiles when there are enough of them (the early, large
/// layers: no panel is built twice), else over output channels (the late layers, 9-36 positions: each thread builds
/// the same small panel and streams its own weight rows).
inline void conv2d(const Conv2dParams& p) {
    const int N = p.out_h * p.out_w, tiles = p.batch * ((N + kConv2dTile - 1) / kConv2dTile);
    const double macs = double(p.batch) * N * double(p.in_channels) * p.kernel_h * p.kernel_w * p.out_channels;
    [[maybe_unused]] const bool par = macs >= kParallelMacs;
    with_weights(p.w, [&](auto w) {
#if FLOWEDGE_ISA_EIGEN
        // Every layer on Eigen's products, output channels split in units of one product's rows.
#pragma omp parallel if (par)
        {
            const int tid = thread_index(), nth = thread_count(), units = (p.out_channels + kEigenRows - 1) / kEigenRows;
            const int o0 = std::min(p.out_channels, int(std::int64_t(units) * tid / nth) * kEigenRows);
            const int o1 = std::min(p.out_channels, int(std::int64_t(units) * (tid + 1) / nth) * kEigenRows);
            if (o0 < o1) conv2d_eigen_part(p, w, o0, o1);
        }
        return;
#endif
        if (N <= kConv2dDotPositions) {
#pragma omp parallel if (par)
            {
                // Output channels split in units of 16 rows (whole vectors for the short-row kernels).
                const int tid = thread_index(), nth = thread_count(), units = (p.out_channels + 15) / 16;
                const int o0 = std::min(p.out_channels, int(std::int64_t(units) * tid / nth) * 16);
                const int o1 = std::min(p.out_channels, int(std::int64_t(units) * (tid + 1) / nth) * 16);
                if (o0 < o1) conv2d_dot_part(p, w, o0, o1);
            }
            return;
        }
#pragma omp parallel if (par)
        {
            const int tid = thread_index(), nth = thread_count();
            if (nth == 1) {
                conv2d_part(p, w, 0, tiles, 0, p.out_channels);
            } else if (tiles >= 2 * nth) {
                conv2d_part(p, w, int(std::int64_t(tiles) * tid / nth), int(std::int64_t(tiles) * (tid + 1) / nth), 0, p.out_channels);
            } else {
                // Output-channel split in units of 8 rows.
                const int units = (p.out_channels + 7) / 8;
                const int o0 = std::min(p.out_channels, int(std::int64_t(units) * tid / nth) * 8);
                const int o1 = std::min(p.out_channels, int(std::int64_t(units) * (tid + 1) / nth) * 8);
                if (o0 < o1) conv2d_part(p, w, 0, tiles, o0, o1);
            }
        }
    });
}
