// Argument checks for every op of op_params.hpp, called by each backend's Ops table before it computes, so Cpu and
// Cuda reject the same bad input with the same flowedge::Error text: "flowedge: <op>: <what> (expected X, got Y)".
// Limits of one backend's kernels (a CPU stack scratch, the CUDA scan's d_state) stay in that backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "flowedge/error.hpp"
#include "flowedge/op_params.hpp"

namespace flowedge {

namespace op_checks_detail {

// Messages are built only on failure: the checks run on every op call and the CPU path must not allocate.

/// "name value, name value" for the got-part of a size message.
inline std::string fields(std::initializer_list<std::pair<const char*, long long>> f) {
    std::string s;
    for (const auto& [name, value] : f) {
        if (!s.empty()) s += ", ";
        s.append(name).append(" ").append(std::to_string(value));
    }
    return s;
}

/// Whether the float ranges [a, a + na) and [b, b + nb) share an element.
inline bool ranges_overlap(const float* a, std::size_t na, const float* b, std::size_t nb) {
    const auto lo_a = reinterpret_cast<std::uintptr_t>(a), lo_b = reinterpret_cast<std::uintptr_t>(b);
    return na > 0 && nb > 0 && lo_a < lo_b + nb * sizeof(float) && lo_b < lo_a + na * sizeof(float);
}

inline bool known_dtype(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

/// The checks of one LinearParams, reporting through fail_with(what), which throws.
template <class Fail>
void check_linear_item(const LinearParams& q, Fail&& fail_with) {
    if (!(q.rows >= 0 && q.in > 0 && q.out > 0)) [[unlikely]]
        fail_with("sizes must be positive" +
                  expected_got("rows >= 0, in > 0, out > 0", fields({{"rows", q.rows}, {"in", q.in}, {"out", q.out}})));
    if (!((q.ld_x == 0 || q.ld_x >= q.in) && (q.ld_y == 0 || q.ld_y >= q.out))) [[unlikely]]
        fail_with("row stride shorter than the row" +
                  expected_got("ld_x >= in and ld_y >= out (0 = contiguous)", fields({{"ld_x", q.ld_x}, {"ld_y", q.ld_y}})));
    if (!known_dtype(q.w.dtype)) [[unlikely]]
        fail_with("unknown weight dtype" + expected_got("F32, BF16 or F16", int(q.w.dtype)));
    if (q.rows > 0 && !(q.x && (q.w.data || q.w.prepared) && q.y)) [[unlikely]] fail_with(std::string("null x, w or y pointer"));
}

/// Conv1d / ConvTranspose1d sizes: everything positive, padding non-negative.
template <class P>
void check_conv_sizes(const P& p, std::string_view op) {
    if (!(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_length > 0 && p.kernel > 0 && p.stride > 0 &&
          p.pad >= 0)) [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("batch, in_channels, out_channels, in_length, kernel, stride > 0 and pad >= 0",
                                  fields({{"batch", p.batch}, {"in_channels", p.in_channels}, {"out_channels", p.out_channels},
                                          {"in_length", p.in_length}, {"kernel", p.kernel}, {"stride", p.stride},
                                          {"pad", p.pad}})));
    if (!known_dtype(p.w.dtype)) [[unlikely]] fail(op, "unknown weight dtype" + expected_got("F32, BF16 or F16", int(p.w.dtype)));
}

}  // namespace op_checks_detail

/// Throws flowedge::Error "flowedge: <component>: item <i>: <what> (expected X, got Y)" unless 1 <= n_items <=
/// kMaxLinearBatch, every item passes the LinearParams checks and no item's output overlaps another item's input or
/// output. check_args(LinearBatchParams) calls it with component "linear_batch".
inline void check_linear_batch(const LinearBatchParams& p, std::string_view component) {
    if (!(p.n_items >= 1 && p.n_items <= kMaxLinearBatch)) [[unlikely]]
        fail(component, "item count out of range" + expected_got("1.." + std::to_string(kMaxLinearBatch), p.n_items));
    struct Range {
        std::uintptr_t lo = 0, hi = 0;
    };
    Range xr[kMaxLinearBatch], yr[kMaxLinearBatch];
    for (int i = 0; i < p.n_items; ++i) {
        const LinearParams& q = p.items[i];
        op_checks_detail::check_linear_item(q, [&](const std::string& what) { fail(component, "item " + std::to_string(i) + ": " + what); });
        if (q.rows == 0) continue;
        const auto at = [](const float* base, std::int64_t n) {
            return Range{reinterpret_cast<std::uintptr_t>(base), reinterpret_cast<std::uintptr_t>(base + n)};
        };
        const int ld_x = q.ld_x ? q.ld_x : q.in, ld_y = q.ld_y ? q.ld_y : q.out;
        xr[i] = at(q.x, std::int64_t(q.rows - 1) * ld_x + q.in);
        yr[i] = at(q.y, std::int64_t(q.rows - 1) * ld_y + q.out);
    }
    const auto overlap = [](Range a, Range b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; };
    const auto item_fail = [&](int i, const std::string& what) { fail(component, "item " + std::to_string(i) + ": " + what); };
    for (int i = 0; i < p.n_items; ++i)
        for (int j = 0; j < p.n_items; ++j) {
            if (i == j) continue;
            if (overlap(yr[i], xr[j]))
                item_fail(i, "output overlaps the input of item " + std::to_string(j) + " (items must be independent)");
            if (j > i && overlap(yr[i], yr[j]))
                item_fail(i, "output overlaps the output of item " + std::to_string(j) + " (items must be independent)");
        }
}

/// Ops::linear: positive sizes, strides at least the row, a known weight dtype, x/w/y set when rows > 0.
inline void check_args(const LinearParams& p) {
    op_checks_detail::check_linear_item(p, [](const std::string& what) { fail("linear", what); });
}

/// Ops::linear_batch: 1..kMaxLinearBatch valid items, no output overlapping another item's input or output.
inline void check_args(const LinearBatchParams& p) { check_linear_batch(p, "linear_batch"); }

/// Ops::conv1d: positive sizes, a known weight dtype, out_length = (in_length + 2 pad - kernel) / stride + 1, x/w/y set.
inline void check_args(const Conv1dParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "conv1d";
    check_conv_sizes(p, op);
    const long long padded = (long long)p.in_length + 2LL * p.pad;
    if (padded < p.kernel) [[unlikely]]
        fail(op, "kernel longer than the padded input" +
                     expected_got("kernel <= in_length + 2 * pad = " + std::to_string(padded), p.kernel));
    const long long want = (padded - p.kernel) / p.stride + 1;
    if (p.out_length != want) [[unlikely]]
        fail(op, "out_length inconsistent with in_length, kernel, stride and pad" + expected_got(want, p.out_length));
    if (!(p.x && (p.w.data || p.w.prepared) && p.y)) [[unlikely]] fail(op, "null x, w or y pointer");
}

/// Ops::conv_transpose1d: positive sizes, a known weight dtype, out_length = (in_length - 1) stride - 2 pad + kernel
/// plus an output padding below stride, x/w/y set.
inline void check_args(const ConvTranspose1dParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "conv_transpose1d";
    check_conv_sizes(p, op);
    const long long full = ((long long)p.in_length - 1) * p.stride + p.kernel;
    const long long lo = full - 2LL * p.pad;
    if (lo <= 0) [[unlikely]]
        fail(op, "padding leaves no output" + expected_got("2 * pad < (in_length - 1) * stride + kernel = " + std::to_string(full),
                                                           fields({{"pad", p.pad}})));
    if (!(p.out_length >= lo && p.out_length < lo + p.stride)) [[unlikely]]
        fail(op, "out_length inconsistent with in_length, kernel, stride and pad" +
                     expected_got(std::to_string(lo) + ".." + std::to_string(lo + p.stride - 1), p.out_length));
    if (!(p.x && (p.w.data || p.w.prepared) && p.y)) [[unlikely]] fail(op, "null x, w or y pointer");
}

/// Ops::group_norm: positive sizes, channels a multiple of groups, a FiLM row stride of at least 2 channels, a shared
/// FiLM row only with a FiLM tensor, x/y set.
inline void check_args(const GroupNormParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "group_norm";
    if (!(p.batch > 0 && p.channels > 0 && p.length > 0 && p.groups > 0)) [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("batch, channels, length, groups > 0",
                                  fields({{"batch", p.batch}, {"channels", p.channels}, {"length", p.length}, {"groups", p.groups}})));
    if (p.channels % p.groups != 0) [[unlikely]]
        fail(op, "channels not divisible by groups" + expected_got("a multiple of " + std::to_string(p.groups), p.channels));
    if (!(p.film_stride == 0 || p.film_stride >= 2LL * p.channels)) [[unlikely]]
        fail(op, "FiLM row stride shorter than 2 * channels" +
                     expected_got("0 or >= " + std::to_string(2LL * p.channels), p.film_stride));
    if (p.film_shared && !p.film) [[unlikely]] fail(op, "shared FiLM row without a FiLM tensor" + expected_got("film set", "null"));
    if (!(p.x && p.y)) [[unlikely]] fail(op, "null x or y pointer");
}

/// Ops::conv1d_group_norm: each op's checks, the norm reading the conv's output (norm.x == conv.y) of the conv's
/// output shape, and a norm output that overlaps neither the conv's input nor its output.
inline void check_args(const Conv1dGroupNormParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "conv1d_group_norm";
    check_args(p.conv);
    check_args(p.norm);
    if (p.norm.x != p.conv.y) [[unlikely]] fail(op, "the norm must read the conv's output" + expected_got("norm.x == conv.y", "another buffer"));
    if (!(p.norm.batch == p.conv.batch && p.norm.channels == p.conv.out_channels && p.norm.length == p.conv.out_length)) [[unlikely]]
        fail(op, "conv output and norm shapes differ" +
                     expected_got(fields({{"batch", p.conv.batch}, {"channels", p.conv.out_channels}, {"length", p.conv.out_length}}),
                                  fields({{"batch", p.norm.batch}, {"channels", p.norm.channels}, {"length", p.norm.length}})));
    const std::size_t n_in = std::size_t(p.conv.batch) * std::size_t(p.conv.in_channels) * std::size_t(p.conv.in_length);
    const std::size_t n_out = std::size_t(p.norm.batch) * std::size_t(p.norm.channels) * std::size_t(p.norm.length);
    if (ranges_overlap(p.norm.y, n_out, p.conv.x, n_in) || ranges_overlap(p.norm.y, n_out, p.conv.y, n_out)) [[unlikely]]
        fail(op, "norm output overlaps the conv's input or output" + expected_got("disjoint buffers", "overlap"));
}

/// Ops::rms_norm: rows >= 0, dim > 0, x/y set when rows > 0.
inline void check_args(const RmsNormParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "rms_norm";
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("rows >= 0, dim > 0", fields({{"rows", p.rows}, {"dim", p.dim}})));
    if (p.rows > 0 && !(p.x && p.y)) [[unlikely]] fail(op, "null x or y pointer");
}

/// Ops::activation: n >= 0, x/y set when n > 0.
inline void check_args(const ActivationParams& p) {
    constexpr std::string_view op = "activation";
    if (p.n < 0) [[unlikely]] fail(op, "negative element count" + expected_got(">= 0", p.n));
    if (p.n > 0 && !(p.x && p.y)) [[unlikely]] fail(op, "null x or y pointer");
}

/// Ops::axpby: n >= 0; when n > 0, x/out set and y set unless b == 0.
inline void check_args(const AxpbyParams& p) {
    constexpr std::string_view op = "axpby";
    if (p.n < 0) [[unlikely]] fail(op, "negative element count" + expected_got(">= 0", p.n));
    if (p.n == 0) return;
    if (!(p.x && p.out)) [[unlikely]] fail(op, "null x or out pointer");
    if (!(p.y || p.b == 0.f)) [[unlikely]] fail(op, "y is null but b is not zero");
}

/// Ops::concat_channels: batch, length > 0, ca, cb >= 0; y set, a/b set unless their channel count is zero.
inline void check_args(const ConcatParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "concat_channels";
    if (!(p.batch > 0 && p.ca >= 0 && p.cb >= 0 && p.length > 0)) [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("batch > 0, ca >= 0, cb >= 0, length > 0",
                                  fields({{"batch", p.batch}, {"ca", p.ca}, {"cb", p.cb}, {"length", p.length}})));
    if (!(p.y && (p.a || p.ca == 0) && (p.b || p.cb == 0))) [[unlikely]] fail(op, "null a, b or y pointer");
}

/// Ops::sinusoid: rows >= 0, half > 0, out set when rows > 0.
inline void check_args(const SinusoidParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "sinusoid";
    if (!(p.rows >= 0 && p.half > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("rows >= 0, half > 0", fields({{"rows", p.rows}, {"half", p.half}})));
    if (p.rows > 0 && !p.out) [[unlikely]] fail(op, "null out pointer");
}

/// Ops::embedding: rows >= 0, dim > 0, a known table dtype, ids/table/y set when rows > 0 (ids themselves are the
/// caller's to validate against the vocabulary).
inline void check_args(const EmbeddingParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "embedding";
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("rows >= 0, dim > 0", fields({{"rows", p.rows}, {"dim", p.dim}})));
    if (!known_dtype(p.table.dtype)) [[unlikely]] fail(op, "unknown table dtype" + expected_got("F32, BF16 or F16", int(p.table.dtype)));
    if (p.rows > 0 && !(p.ids && p.table.data && p.y)) [[unlikely]] fail(op, "null ids, table or y pointer");
}

/// Ops::causal_conv: length >= 0, channels, kernel > 0, x stride at least channels, a known weight dtype; when
/// length > 0, x/w/u set and state set unless kernel == 1 (no history).
inline void check_args(const CausalConvParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "causal_conv";
    if (!(p.length >= 0 && p.channels > 0 && p.kernel > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("length >= 0, channels > 0, kernel > 0",
                                                         fields({{"length", p.length}, {"channels", p.channels}, {"kernel", p.kernel}})));
    if (!(p.ld_x == 0 || p.ld_x >= p.channels)) [[unlikely]]
        fail(op, "x row stride shorter than channels" + expected_got("0 or >= " + std::to_string(p.channels), p.ld_x));
    if (!known_dtype(p.w.dtype)) [[unlikely]] fail(op, "unknown weight dtype" + expected_got("F32, BF16 or F16", int(p.w.dtype)));
    if (p.length > 0 && !(p.x && p.w.data && p.u && (p.state || p.kernel == 1))) [[unlikely]]
        fail(op, "null x, w, u or state pointer");
}

/// Ops::selective_scan: length >= 0, channels, d_state > 0, B/C and z strides at least their rows; when length > 0,
/// every tensor but D set (a null D means no skip term).
inline void check_args(const SelectiveScanParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "selective_scan";
    if (!(p.length >= 0 && p.channels > 0 && p.d_state > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("length >= 0, channels > 0, d_state > 0",
                                                         fields({{"length", p.length}, {"channels", p.channels}, {"d_state", p.d_state}})));
    if (!(p.ld_bc == 0 || p.ld_bc >= p.d_state)) [[unlikely]]
        fail(op, "B/C row stride shorter than d_state" + expected_got("0 or >= " + std::to_string(p.d_state), p.ld_bc));
    if (!(p.ld_z == 0 || p.ld_z >= p.channels)) [[unlikely]]
        fail(op, "z row stride shorter than channels" + expected_got("0 or >= " + std::to_string(p.channels), p.ld_z));
    if (p.length > 0 && !(p.u && p.dt && p.A && p.B && p.C && p.z && p.state && p.y)) [[unlikely]]
        fail(op, "null u, dt, A, B, C, z, state or y pointer");
}

/// Ops::diffusion_step: batch > 0, per_sample >= 0, a known StepKind; when there is work, x/eps set and sqrt_abar
/// non-zero (x0 divides by it).
inline void check_args(const DiffusionStepParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "diffusion_step";
    if (!(p.batch > 0 && p.per_sample >= 0)) [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("batch > 0, per_sample >= 0", fields({{"batch", p.batch}, {"per_sample", p.per_sample}})));
    if (!(p.kind == StepKind::Ddim || p.kind == StepKind::Ddpm)) [[unlikely]]
        fail(op, "unknown scheduler kind" + expected_got("Ddim (0) or Ddpm (1)", int(p.kind)));
    if (!(p.channel_major_length >= 0 && (p.channel_major_length == 0 || p.per_sample % p.channel_major_length == 0)))
        [[unlikely]]
        fail(op, "channel_major_length must divide per_sample" +
                     expected_got("0 or a divisor of " + std::to_string(p.per_sample), p.channel_major_length));
    if (p.per_sample == 0) return;
    if (!(p.x && p.eps)) [[unlikely]] fail(op, "null x or eps pointer");
    if (p.sqrt_abar == 0.f) [[unlikely]] fail(op, "sqrt_abar is zero (x0 divides by it)");
}

/// Ops::unnormalize: rows >= 0, dim > 0, x/y/min/max set when rows > 0.
inline void check_args(const UnnormalizeParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "unnormalize";
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("rows >= 0, dim > 0", fields({{"rows", p.rows}, {"dim", p.dim}})));
    if (p.rows > 0 && !(p.x && p.y && p.min && p.max)) [[unlikely]] fail(op, "null x, y, min or max pointer");
}

/// Ops::conv2d: positive sizes, a known weight dtype, out_h/out_w = (in + 2 pad - kernel) / stride + 1, x/w/y set.
inline void check_args(const Conv2dParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "conv2d";
    if (!(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_h > 0 && p.in_w > 0 && p.kernel_h > 0 &&
          p.kernel_w > 0 && p.stride_h > 0 && p.stride_w > 0 && p.pad_h >= 0 && p.pad_w >= 0)) [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("batch, channels, in_h, in_w, kernel, stride > 0 and pad >= 0",
                                  fields({{"batch", p.batch}, {"in_channels", p.in_channels}, {"out_channels", p.out_channels},
                                          {"in_h", p.in_h}, {"in_w", p.in_w}, {"kernel_h", p.kernel_h}, {"kernel_w", p.kernel_w},
                                          {"stride_h", p.stride_h}, {"stride_w", p.stride_w}, {"pad_h", p.pad_h}, {"pad_w", p.pad_w}})));
    if (!known_dtype(p.w.dtype)) [[unlikely]] fail(op, "unknown weight dtype" + expected_got("F32, BF16 or F16", int(p.w.dtype)));
    const long long ph = (long long)p.in_h + 2LL * p.pad_h, pw = (long long)p.in_w + 2LL * p.pad_w;
    if (ph < p.kernel_h || pw < p.kernel_w) [[unlikely]]
        fail(op, "kernel larger than the padded input" +
                     expected_got("kernel <= in + 2 * pad = " + std::to_string(ph) + " x " + std::to_string(pw),
                                  std::to_string(p.kernel_h) + " x " + std::to_string(p.kernel_w)));
    const long long oh = (ph - p.kernel_h) / p.stride_h + 1, ow = (pw - p.kernel_w) / p.stride_w + 1;
    if (p.out_h != oh || p.out_w != ow) [[unlikely]]
        fail(op, "output size inconsistent with input, kernel, stride and pad" +
                     expected_got(std::to_string(oh) + " x " + std::to_string(ow),
                                  std::to_string(p.out_h) + " x " + std::to_string(p.out_w)));
    if (!(p.x && (p.w.data || p.w.prepared) && p.y)) [[unlikely]] fail(op, "null x, w or y pointer");
    if (p.x == p.y) [[unlikely]] fail(op, "y aliases x (the output must be a separate buffer)");
}

/// Ops::max_pool2d: positive sizes, pad <= kernel / 2 (as PyTorch), out = (in + 2 pad - kernel) / stride + 1, x/y set.
inline void check_args(const MaxPool2dParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "max_pool2d";
    if (!(p.batch > 0 && p.channels > 0 && p.in_h > 0 && p.in_w > 0 && p.kernel > 0 && p.stride > 0 && p.pad >= 0))
        [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("batch, channels, in_h, in_w, kernel, stride > 0 and pad >= 0",
                                  fields({{"batch", p.batch}, {"channels", p.channels}, {"in_h", p.in_h}, {"in_w", p.in_w},
                                          {"kernel", p.kernel}, {"stride", p.stride}, {"pad", p.pad}})));
    if (2 * p.pad > p.kernel) [[unlikely]]
        fail(op, "padding wider than half the kernel" + expected_got("pad <= " + std::to_string(p.kernel / 2), p.pad));
    const long long oh = ((long long)p.in_h + 2LL * p.pad - p.kernel) / p.stride + 1;
    const long long ow = ((long long)p.in_w + 2LL * p.pad - p.kernel) / p.stride + 1;
    if (oh < 1 || ow < 1 || p.out_h != oh || p.out_w != ow) [[unlikely]]
        fail(op, "output size inconsistent with input, kernel, stride and pad" +
                     expected_got(std::to_string(oh) + " x " + std::to_string(ow),
                                  std::to_string(p.out_h) + " x " + std::to_string(p.out_w)));
    if (!(p.x && p.y)) [[unlikely]] fail(op, "null x or y pointer");
}

/// Ops::spatial_softmax: rows >= 0, positions > 0, x/pos_grid/y set when rows > 0.
inline void check_args(const SpatialSoftmaxParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "spatial_softmax";
    if (!(p.rows >= 0 && p.positions > 0)) [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("rows >= 0, positions > 0", fields({{"rows", p.rows}, {"positions", p.positions}})));
    if (p.rows > 0 && !(p.x && p.pos_grid && p.y)) [[unlikely]] fail(op, "null x, pos_grid or y pointer");
}

/// Ops::normalize: rows >= 0, dim > 0, a known NormKind; x/y set when rows > 0, offset/denom too unless Identity.
inline void check_args(const NormalizeParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "normalize";
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail(op, "sizes must be positive" + expected_got("rows >= 0, dim > 0", fields({{"rows", p.rows}, {"dim", p.dim}})));
    if (!(p.kind == NormKind::Identity || p.kind == NormKind::MeanStd || p.kind == NormKind::MinMax)) [[unlikely]]
        fail(op, "unknown normalisation kind" + expected_got("Identity (0), MeanStd (1) or MinMax (2)", int(p.kind)));
    if (p.rows > 0 && !(p.x && p.y && (p.kind == NormKind::Identity || (p.offset && p.denom)))) [[unlikely]]
        fail(op, "null x, y, offset or denom pointer");
}

/// Ops::image_to_tensor: positive sizes, a known layout and NormKind, the window inside the frame, pointers set.
inline void check_args(const ImageToTensorParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "image_to_tensor";
    if (!(p.batch > 0 && p.channels > 0 && p.height > 0 && p.width > 0 && p.out_h > 0 && p.out_w > 0)) [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("batch, channels, height, width, out_h, out_w > 0",
                                  fields({{"batch", p.batch}, {"channels", p.channels}, {"height", p.height}, {"width", p.width},
                                          {"out_h", p.out_h}, {"out_w", p.out_w}})));
    if (!(p.layout == ImageLayout::U8Hwc || p.layout == ImageLayout::F32Chw)) [[unlikely]]
        fail(op, "unknown image layout" + expected_got("U8Hwc (0) or F32Chw (1)", int(p.layout)));
    if (!(p.kind == NormKind::Identity || p.kind == NormKind::MeanStd || p.kind == NormKind::MinMax)) [[unlikely]]
        fail(op, "unknown normalisation kind" + expected_got("Identity (0), MeanStd (1) or MinMax (2)", int(p.kind)));
    if (!(p.top >= 0 && p.left >= 0 && (long long)p.top + p.out_h <= p.height && (long long)p.left + p.out_w <= p.width))
        [[unlikely]]
        fail(op, "window outside the frame" +
                     expected_got("inside " + std::to_string(p.height) + " x " + std::to_string(p.width),
                                  fields({{"top", p.top}, {"left", p.left}, {"out_h", p.out_h}, {"out_w", p.out_w}})));
    if (!(p.x && p.y && (p.kind == NormKind::Identity || (p.offset && p.denom)))) [[unlikely]]
        fail(op, "null x, y, offset or denom pointer");
}

/// Ops::resize: positive sizes, the window inside the resized image, x/y set and distinct.
inline void check_args(const ResizeParams& p) {
    using namespace op_checks_detail;
    constexpr std::string_view op = "resize";
    if (!(p.planes > 0 && p.in_h > 0 && p.in_w > 0 && p.resized_h > 0 && p.resized_w > 0 && p.out_h > 0 && p.out_w > 0))
        [[unlikely]]
        fail(op, "sizes must be positive" +
                     expected_got("planes, in_h, in_w, resized_h, resized_w, out_h, out_w > 0",
                                  fields({{"planes", p.planes}, {"in_h", p.in_h}, {"in_w", p.in_w}, {"resized_h", p.resized_h},
                                          {"resized_w", p.resized_w}, {"out_h", p.out_h}, {"out_w", p.out_w}})));
    if (!(p.top >= 0 && p.left >= 0 && (long long)p.top + p.out_h <= p.resized_h &&
          (long long)p.left + p.out_w <= p.resized_w)) [[unlikely]]
        fail(op, "window outside the resized image" +
                     expected_got("inside " + std::to_string(p.resized_h) + " x " + std::to_string(p.resized_w),
                                  fields({{"top", p.top}, {"left", p.left}, {"out_h", p.out_h}, {"out_w", p.out_w}})));
    if (!(p.x && p.y)) [[unlikely]] fail(op, "null x or y pointer");
    if (p.x == p.y) [[unlikely]] fail(op, "y aliases x (the output must be a separate buffer)");
}

}  // namespace flowedge
