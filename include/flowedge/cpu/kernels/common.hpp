// What every op body of a kernel set shares: the dtype dispatch of a stored weight pointer (compiled inside the
// set, so the kernel it calls inlines). Kernel-set body: included once per instruction set by cpu/kernels.hpp.

/// Calls f(typed pointer) with a stored weight pointer cast to its storage type.
template <class F>
inline void with_weights(const void* data, DType dtype, F&& f) {
    switch (dtype) {
        case DType::F32: f(static_cast<const float*>(data)); return;
        case DType::BF16: f(static_cast<const bf16*>(data)); return;
        case DType::F16: f(static_cast<const f16*>(data)); return;
    }
    fail(ErrorKind::Internal, "cpu ops", "unknown weight dtype " + std::to_string(int(dtype)));
}
template <class F>
inline void with_weights(const WeightRef& w, F&& f) {
    with_weights(w.data, w.dtype, static_cast<F&&>(f));
}

/// Most rows per block pack_output_blocks takes (two AVX-512 vectors of outputs and more).
inline constexpr int kMaxPackWidth = 64;

/// dst[b][j][l] = w[b * width + l][j] (zero for rows >= out): a row-major [out, R] weight in blocks of `width` rows,
/// one step of the reduction after another, the "outputs in lanes" layouts of the packed conv kernels (width <=
/// kMaxPackWidth). Load time only. Sequential writes from `width` read streams (one per row): writing one lane at a
/// time with a width-element stride makes packing a visible part of a PushT load.
template <class T>
inline void pack_output_blocks(const T* w, int out, std::size_t R, int width, T* dst) {
    const int blocks = (out + width - 1) / width;
    for (int b = 0; b < blocks; ++b) {
        const T* rows[kMaxPackWidth];
        for (int l = 0; l < width; ++l) rows[l] = b * width + l < out ? w + std::size_t(b * width + l) * R : nullptr;
        T* db = dst + std::size_t(b) * std::size_t(width) * R;
        for (std::size_t j = 0; j < R; ++j, db += width)
            for (int l = 0; l < width; ++l) db[l] = rows[l] ? rows[l][j] : T{};
    }
}

#if FLOWEDGE_ISA_SIMD
/// act(v) for one vector: the vector math activate_inplace applies (bit for bit).
inline VecF activate_vector(Activation act, VecF v) {
    switch (act) {
        case Activation::None: return v;
        case Activation::Silu: return vsilu(v);
        case Activation::Softplus: return vsoftplus(v);
        case Activation::Mish: return vmish(v);
        case Activation::Relu: return vrelu(v);
    }
    return v;
}
#endif
