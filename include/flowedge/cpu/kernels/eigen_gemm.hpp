// The Eigen set's matrix products: every GEMM-shaped op of that set (Linear, Conv1d and Conv2d through gemm_rows,
// ConvTranspose1d, attention) multiplies Eigen::Map views of flowedge buffers with Eigen's own product kernels,
// vectorised for the consumer's target (NEON on aarch64). Kernel-set body: included once per instruction set by
// cpu/kernels.hpp; empty outside the Eigen set.
#if FLOWEDGE_ISA_EIGEN

/// Tile bounds of one Eigen product. Eigen 3.4 takes a product's packed panels from the heap once one outgrows
/// EIGEN_STACK_ALLOCATION_LIMIT (128 KiB) and sizes them at run time from the cache sizes; here every operand is a Map
/// of a matrix type with these compile-time maximum sizes, so Eigen uses its fixed-size blocking instead
/// (gemm_blocking_space<..., true>: the panels are arrays of an object on the stack, 160 KiB) whatever the caches,
/// and a destination of at most 32 rows keeps Eigen from starting an OpenMP team of its own (parallelize_gemm goes
/// parallel only above 32 rows), so the threads stay flowedge's (output rows per thread, as in the other sets).
inline constexpr int kEigenRows = 32;    ///< output rows per product (weight rows)
inline constexpr int kEigenCols = 128;   ///< output columns per product (activation columns)
inline constexpr int kEigenDepth = 256;  ///< reduction elements per product (Eigen's kc)
static_assert(kEigenRows <= 32, "Eigen parallelises products whose destination has more than 32 rows at compile time");

/// Offset of element (row, col) in a matrix of storage order Order and leading dimension ld.
template <int Order>
constexpr std::size_t eigen_offset(int row, int col, std::size_t ld) {
    return Order == Eigen::RowMajor ? std::size_t(row) * ld + std::size_t(col) : std::size_t(col) * ld + std::size_t(row);
}

/// C (m x n, column-major, leading dimension ldc) = A (m x k) * B (k x n), or C += A * B when accumulate. A and B are
/// stored in orders AOrder and BOrder (Eigen::RowMajor / Eigen::ColMajor) with leading dimensions lda and ldb; an A of
/// 16-bit floats is widened one tile at a time into stack scratch. Tiled so each Eigen product fits the compile-time
/// blocking above: nothing touches the heap. PerColumn: one matrix-vector product per column of B (Eigen's GEMV,
/// with the A tile in L1), so a column's bits do not depend on how many columns there are; Eigen's GEMM kernel sums
/// a lone column in another order than a column among several.
template <int AOrder, int BOrder, bool PerColumn = false, class AT>
inline void eigen_gemm(int m, int n, int k, const AT* a, std::size_t lda, const float* b, std::size_t ldb, float* c,
                       std::size_t ldc, bool accumulate) {
    using MatA = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, AOrder, kEigenRows, kEigenDepth>;
    using MatB = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, BOrder, kEigenDepth, kEigenCols>;
    using MatC = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor, kEigenRows, kEigenCols>;
    using Stride = Eigen::OuterStride<>;
    constexpr bool kF32 = std::is_same_v<AT, float>;
    [[maybe_unused]] alignas(64) float wide[kF32 ? 1 : kEigenRows * kEigenDepth];
    for (int i0 = 0; i0 < m; i0 += kEigenRows) {
        const int mi = std::min(kEigenRows, m - i0);
        for (int j0 = 0; j0 < n; j0 += kEigenCols) {
            const int nj = std::min(kEigenCols, n - j0);
            Eigen::Map<MatC, Eigen::Unaligned, Stride> cm(c + eigen_offset<Eigen::ColMajor>(i0, j0, ldc), mi, nj, Stride(Eigen::Index(ldc)));
            for (int k0 = 0; k0 < k; k0 += kEigenDepth) {
                const int kk = std::min(kEigenDepth, k - k0);
                const float* ap;
                std::size_t ld;
                if constexpr (kF32) {
                    ap = a + eigen_offset<AOrder>(i0, k0, lda);
                    ld = lda;
                } else {
                    // Contiguous runs (rows of a row-major tile, columns of a column-major one) in whole vectors.
                    constexpr bool kRows = AOrder == Eigen::RowMajor;
                    ld = kRows ? std::size_t(kk) : std::size_t(mi);
                    const int runs = kRows ? mi : kk, run = kRows ? kk : mi;
                    for (int q = 0; q < runs; ++q) {
                        const AT* src = a + (kRows ? eigen_offset<AOrder>(i0 + q, k0, lda) : eigen_offset<AOrder>(i0, k0 + q, lda));
                        float* dst = wide + std::size_t(q) * ld;
                        int e = 0;
                        for (; e + kLanes <= run; e += kLanes) vstore(dst + e, vload(src + e));
                        for (; e < run; ++e) dst[e] = widen(src[e]);
                    }
                    ap = wide;
                }
                const Eigen::Map<const MatA, Eigen::Unaligned, Stride> am(ap, mi, kk, Stride(Eigen::Index(ld)));
                const Eigen::Map<const MatB, Eigen::Unaligned, Stride> bm(b + eigen_offset<BOrder>(k0, j0, ldb), kk, nj, Stride(Eigen::Index(ldb)));
                const bool add = k0 > 0 || accumulate;
                if constexpr (PerColumn) {
                    for (int j = 0; j < nj; ++j) {
                        if (add) cm.col(j).noalias() += am * bm.col(j);
                        else cm.col(j).noalias() = am * bm.col(j);
                    }
                } else if (add) {
                    cm.noalias() += am * bm;
                } else {
                    cm.noalias() = am * bm;
                }
            }
        }
    }
}

/// f(o, c, dot(w row o, x column c)) for rows [o0, o1) and columns [0, ncols) on Eigen's products: each tile of
/// kEigenRows x kEigenCols dots is one eigen_gemm (weights row-major, x columns contiguous) into a stack tile, then
/// goes through the epilogue. PerColumn as in eigen_gemm.
template <bool PerColumn, class WT, class F>
inline void eigen_rows(const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, int o0, int o1, int ncols, F& f) {
    alignas(64) float tile[kEigenRows * kEigenCols];
    for (int ob = o0; ob < o1; ob += kEigenRows) {
        const int rows = std::min(kEigenRows, o1 - ob);
        for (int cb = 0; cb < ncols; cb += kEigenCols) {
            const int cols = std::min(kEigenCols, ncols - cb);
            eigen_gemm<Eigen::RowMajor, Eigen::ColMajor, PerColumn>(rows, cols, len, w + std::size_t(ob) * ldw, ldw,
                                                                    x + std::size_t(cb) * ldx, ldx, tile, kEigenRows, false);
            for (int c = 0; c < cols; ++c)
                for (int r = 0; r < rows; ++r) f(ob + r, cb + c, tile[c * kEigenRows + r]);
        }
    }
}

/// The Eigen set's gemm_rows (gemm.hpp has the other sets'): up to kMaxCols columns (batch-1 convs, few-row linears)
/// one matrix-vector product per column, more on Eigen's GEMM kernel. Linears always take eigen_rows<true>
/// (linear.hpp), so a row's bits never depend on the row count, as in the other sets.
template <class WT, class F>
inline void gemm_rows(const WT* w, std::size_t ldw, const float* x, std::size_t ldx, int len, int o0, int o1, int ncols, F& f) {
    if (ncols <= kMaxCols) eigen_rows<true>(w, ldw, x, ldx, len, o0, o1, ncols, f);
    else eigen_rows<false>(w, ldw, x, ldx, len, o0, o1, ncols, f);
}

#endif
