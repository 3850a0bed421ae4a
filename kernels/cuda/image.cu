// The image side of LeRobot's Diffusion Policy around the ResNet encoder: camera frames to normalised float CHW
// (image_to_tensor), torchvision Resize + CenterCrop (resize), feature normalisation (normalize) and the
// SpatialSoftmax keypoint expectation (spatial_softmax).
//
// image_to_tensor, normalize: one thread per output element in grid-stride loops of 256-thread blocks.
// resize: one thread per output pixel, which computes PyTorch's separable _upsample_bilinear2d_aa itself: for each
//   of its vertical taps the horizontal sum over that input row (the CPU's first pass, kept in float), then the
//   vertical sum of those (its second pass); each pass is skipped where the size does not change, as PyTorch does.
//   The tap spans and weights are recomputed per output in PyTorch's float/double mix (aa_span / aa_tap below),
//   and sums are plain float products and adds in tap order (no FMA contraction), as the CPU loop writes them.
// spatial_softmax: one warp per row; max, exp-sum and the expectation are per-lane strided sums combined by a
//   butterfly, so every lane holds the same fixed-order result (deterministic).
#include <string>
#include <string_view>

#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(std::int64_t n) { return detail::blocks_for(n, kThreads, 8LL * detail::sm_count()); }

/// NormKind on one value, in LeRobot's float order: (x - mean) / (std + eps), or 2 * (x - min) / denom - 1.
__device__ __forceinline__ float norm_value(NormKind kind, float v, float offset, float denom) {
    switch (kind) {
        case NormKind::Identity: return v;
        case NormKind::MeanStd: return __fdiv_rn(__fsub_rn(v, offset), denom);
        case NormKind::MinMax: return __fsub_rn(__fdiv_rn(__fmul_rn(2.f, __fsub_rn(v, offset)), denom), 1.f);
    }
    return v;
}

__global__ void __launch_bounds__(kThreads) normalize_kernel(NormalizeParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): x may be an earlier kernel's output
    detail::pdl_allow_next();
    const std::int64_t n = std::int64_t(p.rows) * p.dim;
    for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
        const int d = int(i % p.dim);
        const bool id = p.kind == NormKind::Identity;
        p.y[i] = norm_value(p.kind, p.x[i], id ? 0.f : p.offset[d], id ? 1.f : p.denom[d]);
    }
}

__global__ void __launch_bounds__(kThreads) image_to_tensor_kernel(ImageToTensorParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): the frame may have been written by a kernel
    detail::pdl_allow_next();
    const std::int64_t plane = std::int64_t(p.out_h) * p.out_w;
    const std::int64_t n = std::int64_t(p.batch) * p.channels * plane;
    for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
        const std::int64_t bc = i / plane;
        const int q = int(i - bc * plane);
        const int b = int(bc / p.channels), c = int(bc - std::int64_t(b) * p.channels);
        const int r = p.top + q / p.out_w, col = p.left + q % p.out_w;
        float v;
        if (p.layout == ImageLayout::U8Hwc) {
            const auto* x = static_cast<const std::uint8_t*>(p.x);
            v = __fdiv_rn(float(x[((std::int64_t(b) * p.height + r) * p.width + col) * p.channels + c]), 255.f);
        } else {
            const auto* x = static_cast<const float*>(p.x);
            v = x[((std::int64_t(b) * p.channels + c) * p.height + r) * p.width + col];
        }
        const bool id = p.kind == NormKind::Identity;
        p.y[i] = norm_value(p.kind, v, id ? 0.f : p.offset[c], id ? 1.f : p.denom[c]);
    }
}

/// One axis of the resampling, set up on the host as PyTorch does for float input (align_corners False, no scale
/// factor): scale = float(in) / float(out); support = scale when antialiasing a downsample, else 1 (interp_size 2
/// times 0.5); invscale = float(1.0 / scale) then, else 1. `copy`: in == out, PyTorch skips this axis's pass.
struct AaAxis {
    int in = 0;
    float scale = 1.f, support = 1.f, invscale = 1.f;
    bool copy = true;
};

AaAxis make_axis(int in, int out, bool antialias) {
    AaAxis a;
    a.in = in;
    a.copy = in == out;
    a.scale = float(in) / float(out);
    const bool stretch = antialias && a.scale >= 1.f;
    a.support = stretch ? a.scale : 1.f;
    a.invscale = stretch ? float(1.0 / double(a.scale)) : 1.f;
    return a;
}

/// The input taps [xmin, xmin + xsize) of output index i and the sum of their raw weights (float, in tap order).
struct AaSpan {
    int xmin = 0, xsize = 0;
    float center = 0.f, total = 0.f;
};

/// Raw triangle weight of tap j: filter((j + xmin - center + 0.5) * invscale) with PyTorch's operand types
/// (int - float in float, + 0.5 and * invscale in double, the filter's argument and result in float).
__device__ __forceinline__ float aa_tap(int j, const AaSpan& s, float invscale) {
    const float d = __fsub_rn(float(j + s.xmin), s.center);
    float x = float(__dmul_rn(__dadd_rn(double(d), 0.5), double(invscale)));
    if (x < 0.f) x = -x;
    return x < 1.f ? float(__dsub_rn(1.0, double(x))) : 0.f;
}

__device__ __forceinline__ AaSpan aa_span(const AaAxis& a, int i) {
    AaSpan s;
    s.center = float(__dmul_rn(double(a.scale), __dadd_rn(double(i), 0.5)));  // scale * (i + 0.5), stored as float
    s.xmin = max(int(__dadd_rn(double(__fsub_rn(s.center, a.support)), 0.5)), 0);
    s.xsize = min(int(__dadd_rn(double(__fadd_rn(s.center, a.support)), 0.5)), a.in) - s.xmin;
    float total = 0.f;
    for (int j = 0; j < s.xsize; ++j) total = __fadd_rn(total, aa_tap(j, s, a.invscale));
    s.total = total;
    return s;
}

/// Normalised weight of tap j (left raw where the raw weights sum to 0, as PyTorch).
__device__ __forceinline__ float aa_weight(int j, const AaSpan& s, float invscale) {
    const float w = aa_tap(j, s, invscale);
    return s.total != 0.f ? __fdiv_rn(w, s.total) : w;
}

struct ResizeArgs {
    AaAxis h, w;
};

__global__ void __launch_bounds__(kThreads) resize_kernel(ResizeParams p, ResizeArgs a) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): x is an earlier kernel's output
    detail::pdl_allow_next();
    const std::int64_t plane = std::int64_t(p.out_h) * p.out_w;
    const std::int64_t n = std::int64_t(p.planes) * plane;
    for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
        const std::int64_t pl = i / plane;
        const int q = int(i - pl * plane);
        const int r = p.top + q / p.out_w, c = p.left + q % p.out_w;  // position in the resized image
        const float* x = p.x + pl * p.in_h * p.in_w;
        const AaSpan sx = a.w.copy ? AaSpan{} : aa_span(a.w, c);
        // First pass: the horizontal resampling of input row `row` at column c.
        auto row_value = [&](int row) {
            const float* xr = x + std::int64_t(row) * p.in_w;
            if (a.w.copy) return xr[c];
            float acc = __fmul_rn(xr[sx.xmin], aa_weight(0, sx, a.w.invscale));
            for (int j = 1; j < sx.xsize; ++j) acc = __fadd_rn(acc, __fmul_rn(xr[sx.xmin + j], aa_weight(j, sx, a.w.invscale)));
            return acc;
        };
        float v;
        if (a.h.copy) {
            v = row_value(r);
        } else {
            const AaSpan sy = aa_span(a.h, r);
            v = __fmul_rn(row_value(sy.xmin), aa_weight(0, sy, a.h.invscale));
            for (int j = 1; j < sy.xsize; ++j) v = __fadd_rn(v, __fmul_rn(row_value(sy.xmin + j), aa_weight(j, sy, a.h.invscale)));
        }
        p.y[i] = v;
    }
}

constexpr int kRowsPerBlock = kThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__global__ void __launch_bounds__(kThreads) spatial_softmax_kernel(SpatialSoftmaxParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): x is the keypoint conv's output
    detail::pdl_allow_next();
    const int lane = int(threadIdx.x) & 31;
    const std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
    if (row >= p.rows) return;  // whole warps leave together
    const float* x = p.x + row * p.positions;
    float m = -INFINITY;
    for (int i = lane; i < p.positions; i += 32) m = fmaxf(m, x[i]);
    m = warp_max(m);  // a NaN input still makes every output NaN below, as torch.softmax
    float s = 0.f;
    for (int i = lane; i < p.positions; i += 32) s += expf(x[i] - m);
    s = detail::warp_sum(s);  // the xor butterfly gives every lane the same bits
    float ex = 0.f, ey = 0.f;
    for (int i = lane; i < p.positions; i += 32) {
        const float att = __fdiv_rn(expf(x[i] - m), s);
        ex = fmaf(att, p.pos_grid[2 * std::int64_t(i)], ex);
        ey = fmaf(att, p.pos_grid[2 * std::int64_t(i) + 1], ey);
    }
    ex = detail::warp_sum(ex);
    ey = detail::warp_sum(ey);
    if (lane == 0) {
        p.y[2 * row] = ex;
        p.y[2 * row + 1] = ey;
    }
}

bool known_kind(NormKind k) { return k == NormKind::Identity || k == NormKind::MeanStd || k == NormKind::MinMax; }

}  // namespace

void normalize(const NormalizeParams& p, Stream s) {
    constexpr std::string_view comp = "cuda normalize";
    if (!(p.rows >= 0 && p.dim > 0)) [[unlikely]]
        fail(comp, "sizes must be positive" + expected_got("rows >= 0, dim > 0", p.dim));
    if (!(known_kind(p.kind))) [[unlikely]]
        fail(comp, "unknown normalisation kind" + expected_got("0, 1 or 2", int(p.kind)));
    if (p.rows == 0) return;
    check(p.x && p.y && (p.kind == NormKind::Identity || (p.offset && p.denom)), comp, "null x, y, offset or denom pointer");
    const std::int64_t n = std::int64_t(p.rows) * p.dim;
    detail::launch_pdl(normalize_kernel, dim3(grid_for(n)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("normalize_kernel");
}

void image_to_tensor(const ImageToTensorParams& p, Stream s) {
    constexpr std::string_view comp = "cuda image_to_tensor";
    check(p.batch > 0 && p.channels > 0 && p.height > 0 && p.width > 0 && p.out_h > 0 && p.out_w > 0, comp,
          "sizes must be positive");
    if (!(p.layout == ImageLayout::U8Hwc || p.layout == ImageLayout::F32Chw)) [[unlikely]]
        fail(comp, "unknown image layout" + expected_got("0 or 1", int(p.layout)));
    if (!(known_kind(p.kind))) [[unlikely]]
        fail(comp, "unknown normalisation kind" + expected_got("0, 1 or 2", int(p.kind)));
    check(p.top >= 0 && p.left >= 0 && (long long)p.top + p.out_h <= p.height && (long long)p.left + p.out_w <= p.width,
          comp, "window outside the frame");
    check(p.x && p.y && (p.kind == NormKind::Identity || (p.offset && p.denom)), comp, "null x, y, offset or denom pointer");
    const std::int64_t n = std::int64_t(p.batch) * p.channels * p.out_h * p.out_w;
    detail::launch_pdl(image_to_tensor_kernel, dim3(grid_for(n)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("image_to_tensor_kernel");
}

void resize(const ResizeParams& p, Stream s) {
    constexpr std::string_view comp = "cuda resize";
    check(p.planes > 0 && p.in_h > 0 && p.in_w > 0 && p.resized_h > 0 && p.resized_w > 0 && p.out_h > 0 && p.out_w > 0,
          comp, "sizes must be positive");
    check(p.top >= 0 && p.left >= 0 && (long long)p.top + p.out_h <= p.resized_h &&
              (long long)p.left + p.out_w <= p.resized_w,
          comp, "window outside the resized image");
    check(p.x && p.y && p.x != p.y, comp, "null x or y pointer, or y aliases x");
    ResizeArgs a;
    a.h = make_axis(p.in_h, p.resized_h, p.antialias);
    a.w = make_axis(p.in_w, p.resized_w, p.antialias);
    const std::int64_t n = std::int64_t(p.planes) * p.out_h * p.out_w;
    detail::launch_pdl(resize_kernel, dim3(grid_for(n)), dim3(kThreads), 0, detail::resolve(s), p, a);
    FLOWEDGE_CUDA_CHECK_LAUNCH("resize_kernel");
}

void spatial_softmax(const SpatialSoftmaxParams& p, Stream s) {
    constexpr std::string_view comp = "cuda spatial_softmax";
    if (!(p.rows >= 0 && p.positions > 0)) [[unlikely]]
        fail(comp, "sizes must be positive" + expected_got("positions > 0", p.positions));
    if (p.rows == 0) return;
    check(p.x && p.pos_grid && p.y, comp, "null x, pos_grid or y pointer");
    const std::int64_t blocks = (std::int64_t(p.rows) + kRowsPerBlock - 1) / kRowsPerBlock;
    check(blocks <= 0x7fffffffLL, comp, "too many rows");
    detail::launch_pdl(spatial_softmax_kernel, dim3(unsigned(blocks)), dim3(kThreads), 0, detail::resolve(s), p);
    FLOWEDGE_CUDA_CHECK_LAUNCH("spatial_softmax_kernel");
}

}  // namespace flowedge::cuda
