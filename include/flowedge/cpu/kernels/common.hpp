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
