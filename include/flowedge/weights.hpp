// How a layer's weight reaches its backend's kernels: the layer names what the tensor is (Storage), the backend
// decides its layout at load (Ops<B>::prepare_weight) and owns the result. Layers and Parameter never see a layout.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "flowedge/op_params.hpp"

namespace flowedge {

/// What a parameter tensor is, as its layer declares it in visit_parameters.
enum class Storage : std::uint8_t {
    Matrix,  ///< keeps the file's dtype (or LoadOptions::weight_dtype); widened on the fly by the ops
    Vector,  ///< always converted to F32 (biases, norm weights, A_log, D, ...)
    ConvWeight,           ///< a Conv1d weight [out, in, kernel], stored like Matrix
    ConvTransposeWeight,  ///< a ConvTranspose1d weight [in, out, kernel], stored like Matrix
    Conv2dWeight,         ///< a Conv2d weight [out, in, kh, kw], stored like Matrix
    /// A Linear weight [out, in] streamed once per call at a row or two (the U-Net's FiLM projections), stored like
    /// Matrix.
    StreamedMatrix,
    /// A Linear weight [out, in] multiplied at a few rows per call from cache (Mamba/flow-head projections: decode,
    /// flow solves, short prefills), stored like Matrix.
    SmallRowsMatrix,
    /// A Linear weight [out, in] multiplied at many rows per call (ACT's ~300 encoder tokens and 100 decoder queries),
    /// stored like Matrix; the backend may keep a copy laid out for its GEMM beside it.
    ManyRowsMatrix,
};

/// Opt-in weight quantisation at load (LoadOptions::quantize).
enum class WeightQuant : std::uint8_t {
    None,  ///< weights keep their stored dtype (the default)
    /// INT8 weight-only, for the weights streamed by the packed conv kernels (Storage::ConvWeight, ConvTransposeWeight,
    /// StreamedMatrix): int8 values with one F32 scale per output row (symmetric, scale = max |w| of the row / 127;
    /// a row is a Conv1d output channel's [in, kernel] slice, a Linear output, or a ConvTranspose1d (output channel,
    /// tap) pair), F32 activations and accumulation. The CPU's AVX2 and AVX-512 kernel sets have the kernels;
    /// elsewhere loading fails (ErrorKind::Unsupported) rather than ignore the request.
    Int8,
    /// W8A8: the weights as Int8, and the Conv1d activations quantised too, per call: each im2col column (one output
    /// position's [in, kernel] input window) to unsigned 8 bits over its own range [min, max] (step (max - min) / 255),
    /// the products summed in int32 (AVX512_VNNI vpdpbusd, four multiply-adds per byte lane) and scaled back to F32;
    /// on the AVX2 kernel set (no VNNI: vpmaddubsw, whose int16 pair sums would saturate at 8 bits) to 7 bits (step
    /// (max - min) / 127). ConvTranspose1d and streamed Linear weights run weight-only as Int8. CPU AVX2 kernel set, or
    /// the AVX-512 set on an AVX512_VNNI CPU; elsewhere loading fails (ErrorKind::Unsupported). Error bound:
    /// docs/numerics.md.
    W8A8,
};

/// The names the C API, Python and the programs take for WeightQuant ("none", "int8", "w8a8"; case as written);
/// nullopt for anything else (the caller's error then lists kWeightQuantNames).
constexpr std::optional<WeightQuant> weight_quant_from_name(std::string_view s) {
    if (s == "none") return WeightQuant::None;
    if (s == "int8") return WeightQuant::Int8;
    if (s == "w8a8") return WeightQuant::W8A8;
    return std::nullopt;
}
inline constexpr const char* kWeightQuantNames = "none, int8 or w8a8";

constexpr const char* weight_quant_name(WeightQuant q) {
    switch (q) {
        case WeightQuant::Int8: return "int8";
        case WeightQuant::W8A8: return "w8a8";
        case WeightQuant::None: break;
    }
    return "none";
}

/// Whether LoadOptions::quantize applies to a tensor of this storage kind (the weights the packed conv kernels stream).
constexpr bool quantizable(Storage s) {
    return s == Storage::ConvWeight || s == Storage::ConvTransposeWeight || s == Storage::StreamedMatrix;
}

/// A backend's re-laid-out form of one weight (e.g. the CPU's packed blocks), made once at load by
/// Ops<B>::prepare_weight and reached by the kernels through WeightRef::prepared.
class PreparedWeight {
public:
    virtual ~PreparedWeight() = default;
    /// Bytes it holds (the memory the preparation costs).
    virtual std::size_t bytes() const = 0;
    /// Whether the kernels read only this form, so the stored tensor can be released.
    virtual bool replaces_source() const = 0;
    /// Readies the form for arithmetic m (in place, no allocation); a model's set_math calls it.
    virtual void set_math(MathMode m) = 0;
};

}  // namespace flowedge
