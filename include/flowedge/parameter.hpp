// Model parameters on a backend, bound by name from a safetensors file: one place that checks
// names, shapes and dtypes, converts small vectors to F32 and uploads (or maps) the big matrices.
#pragma once
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "flowedge/cpu/memory.hpp"
#include "flowedge/dtype.hpp"
#include "flowedge/io/safetensors.hpp"
#include "flowedge/op_params.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/tensor.hpp"
#include "flowedge/weights.hpp"

namespace flowedge {

/// Load-time choices shared by every model.
struct LoadOptions {
    /// Store Storage::Matrix parameters in this dtype regardless of the file's (e.g. BF16 from an F32 file).
    std::optional<DType> weight_dtype{};
    /// WeightQuant::Int8: Conv1d, ConvTranspose1d and streamed Linear weights (the U-Net's convolutions and FiLM
    /// projections) stored as int8 with one scale per output row, quantised from the weight_dtype values; the other
    /// weights as weight_dtype says; WeightQuant::W8A8 also quantises the Conv1d activations (see WeightQuant). CPU
    /// AVX2 / AVX-512 kernel sets for Int8, AVX-512 with VNNI for W8A8 (an Error elsewhere). Bounds: docs/numerics.md.
    WeightQuant quantize = WeightQuant::None;
};

/// One tensor of a model, resident on backend B.
template <Backend B>
class Parameter {
public:
    DType dtype() const { return m_dtype; }
    const Shape& shape() const { return m_shape; }
    std::int64_t numel() const { return m_shape.numel(); }
    /// Bytes of the weight values as stored: one per element when quantised to int8 (the scales not counted).
    std::size_t bytes() const {
        return static_cast<std::size_t>(numel()) * (m_quant != WeightQuant::None ? 1 : dtype_size(m_dtype));  // Int8, W8A8: a byte each
    }
    /// The quantisation applied at load (WeightQuant::None unless LoadOptions::quantize asked and the kind allows).
    WeightQuant quant() const { return m_quant; }
    bool loaded() const { return m_data != nullptr || m_prepared != nullptr; }
    WeightRef ref() const { return {m_data, m_dtype, m_prepared.get()}; }
    /// Bytes of the backend's prepared form (0 when none; see weights.hpp).
    std::size_t prepared_bytes() const { return m_prepared ? m_prepared->bytes() : 0; }
    /// Readies the prepared form (if any) for arithmetic m: in place, no allocation (models call it from set_math).
    void set_math(MathMode m) {
        if (m_prepared) m_prepared->set_math(m);
    }
    /// F32 view of a Storage::Vector parameter (or an F32 matrix).
    const float* f32() const {
        if (m_dtype != DType::F32) fail("parameter", "F32 access to a " + std::string(dtype_name(m_dtype)) + " tensor");
        return static_cast<const float*>(m_data);
    }

    /// Binds tensor `t` (checked against `expected`), converting as `storage`/`opts` ask, then lets the backend
    /// prepare it (Ops<B>::prepare_weight). `keeper` keeps the source mapping alive when the data is referenced in
    /// place (host-accessible backends).
    void load(const io::TensorInfo& t, const Shape& expected, Storage storage, const LoadOptions& opts,
              std::shared_ptr<const void> keeper, std::string_view component) {
        if (!(t.shape == expected))
            fail(ErrorKind::BadFile, component, "tensor '" + t.name + "' has the wrong shape" + expected_got(expected.str(), t.shape.str()));
        m_shape = expected;
        DType want = storage == Storage::Vector ? DType::F32 : opts.weight_dtype.value_or(t.dtype);
        m_dtype = want;
        m_quant = quantizable(storage) ? opts.quantize : WeightQuant::None;
        const std::size_t n = static_cast<std::size_t>(expected.numel());
        const bool aligned = reinterpret_cast<std::uintptr_t>(t.data) % 4 == 0;
        m_prepared.reset();
        if (want == t.dtype && Memory<B>::host_accessible && aligned) {
            m_keeper = std::move(keeper);  // zero-copy: reference the mapped file
            m_data = t.data;
            prepare(storage, t.name, component);
            return;
        }
        std::vector<std::byte> converted;
        const void* src = t.data;
        if (want != t.dtype || !aligned) {
            // The staging copy lives in host memory: refuse a tensor that cannot fit before touching any of it.
            Memory<Cpu>::check_fits(n * dtype_size(want), "tensor '" + t.name + "' (" + component_str(component) + ")");
            converted.resize(n * dtype_size(want));
            convert(t.data, t.dtype, converted.data(), want, n);
            src = converted.data();
        }
        m_owned = Buffer<std::byte, B>(n * dtype_size(want));
        Memory<B>::copy_from_host(m_owned.data(), src, m_owned.bytes());
        Memory<B>::synchronize();
        m_data = m_owned.data();
        prepare(storage, t.name, component);
    }

    /// Sets an F32 vector computed at load (e.g. A = -exp(A_log)); uploads to B.
    void assign_f32(const std::vector<float>& values, const Shape& shape) {
        m_shape = shape;
        m_dtype = DType::F32;
        m_quant = WeightQuant::None;
        m_owned = Buffer<std::byte, B>(values.size() * sizeof(float));
        Memory<B>::copy_from_host(m_owned.data(), values.data(), m_owned.bytes());
        Memory<B>::synchronize();
        m_data = m_owned.data();
    }

    /// Sets a tensor computed on the host at load (e.g. a convolution with its BatchNorm folded in), stored in `dtype`
    /// (round-to-nearest-even from F32) and prepared by the backend like a loaded tensor of kind `storage`.
    void assign(std::span<const float> values, const Shape& shape, DType dtype, Storage storage, const std::string& name,
                std::string_view component) {
        check(values.size() == static_cast<std::size_t>(shape.numel()), component,
              "tensor '" + name + "': computed value count does not match its shape " + shape.str() +
                  expected_got(shape.numel(), values.size()));
        m_shape = shape;
        m_dtype = storage == Storage::Vector ? DType::F32 : dtype;
        m_quant = WeightQuant::None;
        m_keeper.reset();
        m_prepared.reset();
        std::vector<std::byte> stored(values.size() * dtype_size(m_dtype));
        convert(values.data(), DType::F32, stored.data(), m_dtype, values.size());
        m_owned = Buffer<std::byte, B>(stored.size());
        Memory<B>::copy_from_host(m_owned.data(), stored.data(), stored.size());
        Memory<B>::synchronize();
        m_data = m_owned.data();
        prepare(storage, name, component);
    }

    /// Element-wise dtype conversion on the host (exact widening, round-to-nearest-even narrowing).
    static void convert(const void* src, DType from, void* dst, DType to, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
            float v;
            if (from == DType::F32) std::memcpy(&v, static_cast<const std::byte*>(src) + 4 * i, 4);
            else {
                std::uint16_t h;
                std::memcpy(&h, static_cast<const std::byte*>(src) + 2 * i, 2);
                v = from == DType::BF16 ? to_float(bf16{h}) : to_float(f16{h});
            }
            if (to == DType::F32) std::memcpy(static_cast<std::byte*>(dst) + 4 * i, &v, 4);
            else {
                const std::uint16_t h = to == DType::BF16 ? to_bf16(v).bits : to_f16(v).bits;
                std::memcpy(static_cast<std::byte*>(dst) + 2 * i, &h, 2);
            }
        }
    }

private:
    static std::string component_str(std::string_view c) { return std::string(c); }

    /// The backend's layout for this tensor (none: read as stored); the stored data is released when the prepared
    /// form replaces it.
    void prepare(Storage storage, const std::string& name, std::string_view component) {
        m_prepared = Ops<B>::prepare_weight(storage, {m_data, m_dtype, nullptr}, m_shape,
                                            "tensor '" + name + "' (" + component_str(component) + ")", m_quant);
        if (m_prepared && m_prepared->replaces_source()) {
            m_owned = Buffer<std::byte, B>();
            m_keeper.reset();
            m_data = nullptr;
        }
    }

    DType m_dtype = DType::F32;
    WeightQuant m_quant = WeightQuant::None;
    Shape m_shape{};
    const void* m_data = nullptr;
    Buffer<std::byte, B> m_owned;
    std::shared_ptr<const void> m_keeper;
    std::unique_ptr<PreparedWeight> m_prepared;
};

/// Signature of the visitor every layer/model accepts in visit_parameters:
/// f(name relative to the visited object, parameter, expected shape, storage kind).
template <Backend B>
using ParameterVisitor = std::function<void(const std::string&, Parameter<B>&, const Shape&, Storage)>;

/// Binds every parameter a module lists (via visit_parameters) from `file`, names prefixed by `prefix`.
/// A missing key is an error naming it; so is a wrong shape.
template <Backend B, class Module>
void bind_parameters(Module& module, const std::shared_ptr<const io::SafeTensors>& file, const std::string& prefix,
                     const LoadOptions& opts, std::string_view component) {
    module.visit_parameters([&](const std::string& name, Parameter<B>& p, const Shape& shape, Storage storage) {
        const std::string key = prefix + name;
        const io::TensorInfo* t = file->find(key);
        if (!t) fail(ErrorKind::BadFile, component, file->path().string() + ": missing tensor '" + key + "'");
        t->require_float(component, file->path().string());
        p.load(*t, shape, storage, opts, file, component);
    });
}

}  // namespace flowedge
