// Helpers shared by the translation units of the flowedge._flowedge module (bindings.cpp: the heads,
// policy_bindings.cpp: DiffusionPolicy, act_bindings.cpp: ActPolicy): argument conversion, device/dtype/seed parsing, the GIL-releasing holder.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/mamba_flow/policy.hpp"
#include "flowedge/residency.hpp"

namespace flowedge::python {

namespace nb = nanobind;
using namespace nb::literals;

/// A bad argument detected by the bindings (shape, size, range): raised as FlowEdgeValueError.
struct ArgumentError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void bad_arg(const std::string& what) { throw ArgumentError("flowedge: python: " + what); }

using F32 = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy, float>;

/// float32 C-contiguous view of any numeric array-like: zero-copy when it already is one, otherwise one
/// numpy conversion. Non-numeric input (strings, objects, None) is a TypeError naming the argument.
inline F32 as_f32(nb::handle obj, const char* name) {
    nb::module_ np = nb::module_::import_("numpy");
    F32 view;
    if (nb::try_cast<F32>(obj, view, /*convert=*/false)) return view;  // already float32, C-contiguous, on the CPU
    nb::object arr;
    try {
        arr = np.attr("asarray")(obj);
    } catch (nb::python_error&) {
        throw nb::type_error((std::string("flowedge: argument '") + name + "' must be a numeric array").c_str());
    }
    const std::string kind = nb::cast<std::string>(arr.attr("dtype").attr("kind"));
    if (kind.size() != 1 || std::string("biuf").find(kind[0]) == std::string::npos)
        throw nb::type_error((std::string("flowedge: argument '") + name + "' must be a numeric array (got dtype " +
                              nb::cast<std::string>(arr.attr("dtype").attr("str")) + ")").c_str());
    nb::object conv = np.attr("ascontiguousarray")(arr, "dtype"_a = np.attr("float32"));
    return nb::cast<F32>(conv);
}

/// Token ids as int32: integer input only; values outside int32 are an error, never wrapped.
inline std::vector<std::int32_t> as_tokens(nb::handle obj) {
    nb::module_ np = nb::module_::import_("numpy");
    nb::object arr;
    try {
        arr = np.attr("asarray")(obj);
    } catch (nb::python_error&) {
        throw nb::type_error("flowedge: argument 'tokens' must be an integer array");
    }
    const std::string kind = nb::cast<std::string>(arr.attr("dtype").attr("kind"));
    if (nb::cast<std::size_t>(arr.attr("size")) == 0) bad_arg("tokens must not be empty");
    if (kind != "i" && kind != "u")
        throw nb::type_error(("flowedge: argument 'tokens' must hold integers (got dtype " +
                              nb::cast<std::string>(arr.attr("dtype").attr("str")) + ")").c_str());
    if (nb::cast<int>(arr.attr("ndim")) != 1) bad_arg("tokens must be one-dimensional [L]");
    nb::object i64 = np.attr("ascontiguousarray")(arr, "dtype"_a = np.attr("int64"));
    auto view = nb::cast<nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(i64);
    std::vector<std::int32_t> out(view.shape(0));  // copied: int32 ids are tiny
    for (std::size_t i = 0; i < out.size(); ++i) {
        const std::int64_t v = view(i);
        if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
            bad_arg("token id at position " + std::to_string(i) + " does not fit in int32 (got " + std::to_string(v) + ")");
        out[i] = std::int32_t(v);
    }
    return out;
}

/// A new float32 numpy array of `shape`, owning its memory.
inline OutArray new_array(const std::vector<std::size_t>& shape) {
    std::size_t n = 1;
    for (std::size_t d : shape) n *= d;
    float* data = new float[n > 0 ? n : 1];
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    return OutArray(data, shape.size(), shape.data(), owner);
}

inline std::vector<std::size_t> shape_of(const F32& a) {
    std::vector<std::size_t> s(a.ndim());
    for (std::size_t i = 0; i < a.ndim(); ++i) s[i] = a.shape(i);
    return s;
}

inline std::string shape_str(const F32& a) {
    std::string s = "(";
    for (std::size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
    return s + (a.ndim() == 1 ? ",)" : ")");
}

inline std::span<const float> span_of(const F32& a) { return {a.data(), a.size()}; }

/// A device request (docs/contracts.md): "cpu"; "cuda", which fails unless the model ends up resident on the GPU (as the
/// programs' --device cuda does); "auto", which uploads when it can and otherwise runs on the CPU, saying why in
/// fallback_reason.
struct DeviceRequest {
    Device want;
    bool fallback_allowed;
};

inline DeviceRequest device_arg(const std::string& device) {
    if (device == "cpu") return {Device::Cpu, false};
    if (device == "cuda") return {Device::Cuda, false};
    if (device == "auto") return {Device::Cuda, true};
    bad_arg("unknown device '" + device + "' (expected 'cpu', 'cuda' or 'auto')");
}

inline std::optional<DType> dtype_arg(nb::handle dtype) {
    if (dtype.is_none()) return std::nullopt;
    std::string s;
    if (nb::isinstance<nb::str>(dtype)) {
        s = nb::cast<std::string>(dtype);
    } else {
        nb::module_ np = nb::module_::import_("numpy");
        try {
            s = nb::cast<std::string>(np.attr("dtype")(dtype).attr("name"));
        } catch (nb::python_error&) {
            throw nb::type_error("flowedge: dtype must be None, a string or a numpy dtype");
        }
    }
    if (const std::optional<DType> d = weight_dtype_from_name(s)) return d;
    bad_arg("unknown weight dtype '" + s + "' (expected float32, bfloat16 or float16)");
}

/// A `math` property's value: the lower-case names only (the C API also takes upper case).
inline MathMode math_arg(const std::string& v) {
    if (v != "f32" && v != "tf32" && v != "bf16") bad_arg("math must be 'f32', 'tf32' or 'bf16' (got '" + v + "')");
    return parse_math_mode(v);
}

/// LoadOptions::quantize from None or "none" / "int8" / "w8a8".
inline WeightQuant quantize_arg(nb::handle quantize) {
    if (quantize.is_none()) return WeightQuant::None;
    if (!nb::isinstance<nb::str>(quantize)) throw nb::type_error("flowedge: quantize must be None, 'none', 'int8' or 'w8a8'");
    const std::string s = nb::cast<std::string>(quantize);
    if (const std::optional<WeightQuant> q = weight_quant_from_name(s)) return *q;
    bad_arg("unknown quantize '" + s + "' (expected None, " + kWeightQuantNames + ")");
}

/// The DDPM seed: a non-negative Python int of at most 64 bits (a negative one is a ValueError, not a TypeError).
inline std::uint64_t seed_arg(const nb::int_& seed) {
    const std::string text = nb::cast<std::string>(nb::str(seed));
    if (PyObject_RichCompareBool(seed.ptr(), nb::int_(0).ptr(), Py_LT) == 1) bad_arg("seed must be >= 0 (got " + text + ")");
    std::uint64_t v = 0;
    if (!nb::try_cast(seed, v)) bad_arg("seed must be below 2**64 (got " + text + ")");
    return v;
}

/// Leading batch of an input that is either one row [n] (returns 0: unbatched) or [B, n].
inline std::size_t batch_of(const F32& a, std::size_t row, const char* name, const char* row_desc) {
    if (a.ndim() == 1 && a.shape(0) == row) return 0;
    if (a.ndim() == 2 && a.shape(1) == row && a.shape(0) >= 1) return a.shape(0);
    bad_arg(std::string(name) + " must be [" + row_desc + "] or [batch, " + row_desc + "] with " + row_desc + " = " +
            std::to_string(row) + " (got shape " + shape_str(a) + ")");
}

/// A Resident<Model> plus the lock that serialises calls from several Python threads.
template <template <class> class Model>
struct Held {
    Resident<Model> model;
    std::mutex mutex;
    explicit Held(Resident<Model>&& m) : model(std::move(m)) {}

    const char* backend() const { return model.backend(); }
    bool cuda_resident() const { return model.cuda_resident(); }
    std::string fallback_reason() const { return model.fallback_reason(); }

    /// Runs f(model) with the GIL released and the lock held.
    template <class F>
    void run(F&& f) {
        nb::gil_scoped_release release;
        std::lock_guard lock(mutex);
        model.visit(f);
    }
    /// Reads a value from the model (lock held, GIL kept: cheap accessors only).
    template <class F>
    auto get(F&& f) {
        std::lock_guard lock(mutex);
        return model.visit(f);
    }
};

using PyDiffusion = Held<DiffusionHead>;
using PyMamba = Held<Mamba>;
using PyFlow = Held<FlowHead>;
using PyPolicy = Held<MambaFlowPolicy>;

template <template <class> class Model, class Loader>
Resident<Model> load_resident(const std::string& device, Loader&& loader) {
    const DeviceRequest req = device_arg(device);
    const ResidencyFlags flags = ResidencyFlags::from_env();
    const char* use_auto = "; pass device='auto' to allow the CPU fallback";
    // Without the CUDA backend an explicit "cuda" cannot succeed: say so before reading the weights.
    if (req.want == Device::Cuda && !req.fallback_allowed && !backend_available_v<Cuda> && !flags.cuda_required)
        throw Error(std::string("flowedge: python: device='cuda' requested but this build has no CUDA backend "
                                "(rebuild with FLOWEDGE_BACKEND=cuda pip install .)") + use_auto,
                    ErrorKind::Device);
    Resident<Model> r = [&] {
        nb::gil_scoped_release release;
        return Resident<Model>::load(req.want, flags, loader);
    }();
    if (req.want == Device::Cuda && !req.fallback_allowed && !r.cuda_resident())
        throw Error("flowedge: python: device='cuda' requested but the model is not resident on the GPU (" +
                        r.fallback_reason() + ")" + use_auto,
                    ErrorKind::Device);
    return r;
}

template <class T, class Cls>
void common_properties(Cls& cls) {
    cls.def_prop_ro("backend", [](T& s) { return std::string(s.backend()); }, "\"cpu\" or \"cuda\": where inference runs.")
        .def_prop_ro("cuda_resident", [](T& s) { return s.cuda_resident(); },
                     "True when weights and scratch live on the GPU (False after a CPU fallback).")
        .def_prop_ro("fallback_reason", [](T& s) { return s.fallback_reason(); },
                     "Why the model runs on the CPU although device='auto' was asked for ('' otherwise).");
}

/// Adds flowedge.DiffusionPolicy (the whole LeRobot policy) to the module; defined in policy_bindings.cpp.
void bind_diffusion_policy(nb::module_& m);
/// Adds flowedge.ActPolicy and flowedge.policy_type to the module; defined in act_bindings.cpp.
void bind_act_policy(nb::module_& m);

}  // namespace flowedge::python
