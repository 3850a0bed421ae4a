// torch.nn.Conv2d on cuBLASLt (opt-in tensor-core MathMode TF32/BF16, or F32 for models that ask, Conv2dParams::f32_gemm): per image an explicit im2col panel in the
// caller's scratch, one library GEMM that writes the image's output in place, then one epilogue over the batch
// (bias, residual, activation). The exact kernels (conv2d.cu, conv2d_kstream.cu) run on the CUDA cores; this path
// puts the ResNet backbones' products (ACT: ~11 G multiply-adds per 480x640 frame) on the tensor cores.
//
// GEMM view (column-major, as cuBLASLt sees memory; gemm_lt.cuh), per image b, P = out_h*out_w, Kg = in*kh*kw,
// p = r*out_w + q, kk = (i*kh + u)*kw + v:
//   A = the panel, row-major [P][Kg]: panel[p][kk] = x[b, i, r*stride + u - pad, q*stride + v - pad] (0 outside),
//       column-major Kg x P, used transposed;
//   B = the weights as stored, row-major [O][Kg] = column-major Kg x O;
//   D = column-major P x O = y[b] as torch lays it out ([O][P]), written directly (no transpose pass).
// Then y = act(y + bias[o] (+ residual)) in place, in float.
//
// Operand types (as conv1d_gemm): F32 weights -> TF32 GEMM under TF32 or BF16 math (the panel rounded to TF32
// nearest when written, the weights converted by the library); BF16 weights under BF16 math -> BF16 GEMM (panel
// rounded to BF16 nearest-even, weights exact); F32 weights under F32 math with Conv2dParams::f32_gemm -> F32 GEMM
// (CUBLAS_COMPUTE_32F, panel exact: F32 products, float sums in the library's order, within the exact kernels'
// bound). Anything else (F16 weights, BF16 weights under TF32, F32 math without f32_gemm) declines.
// Error per output (the test's bound), u_x the panel's rounding (TF32 2^-11, BF16 2^-8), u_w the library's
// conversion of F32 weights (taken as truncation, 2^-10; 0 for BF16 weights):
//   TF32: |y - y_exact| <= (2^-10 + 2^-11 + Kg * 2^-24) * sum_{i,u,v} |w||x| (+ 2^-24 |y| per epilogue add);
//   BF16 weights: (2^-8 + Kg * 2^-24) * sum |w||x|.
// Determinism: one algorithm per shape (heuristic, cached), no atomics: bitwise repeatable on one GPU model.
//
// Resources: no allocation. The scratch (Conv2dParams::scratch, conv2d_scratch_bytes(p) bytes, sized by the model
// at load) holds one image's panel (float elements, enough for either kind) and the library workspace.
// conv2d_gemm returns false, leaving y untouched (at most the scratch written), when the weight dtype x math pair, the
// scratch, the handle (none yet while capturing) or the library's algorithm is missing, or FLOWEDGE_CUDA_NO_LT=1:
// conv2d then runs exactly.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common.cuh"
#include "gemm_lt.cuh"
#include "flowedge/cuda/device.hpp"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kIm2colThreads = 256;   ///< the flat kernel's block
constexpr int kIm2colColumns = 128;   ///< panel columns (kk) per block of the column kernel
constexpr int kIm2colPixels = 32;     ///< consecutive pixels per block of the column kernel
constexpr int kEpilogueThreads = 256;

/// The GEMM conv2d_gemm would run for p, if any (weight dtype x math, see the file comment).
bool conv2d_gemm_kind(const Conv2dParams& p, lt::GemmKind& kind) {
    if (p.w.dtype == DType::F32 && p.math == MathMode::F32 && p.f32_gemm) {
        kind = lt::GemmKind::F32;
        return true;
    }
    if (p.w.dtype == DType::F32 && (p.math == MathMode::TF32 || p.math == MathMode::BF16)) {
        kind = lt::GemmKind::Tf32;
        return true;
    }
    if (p.w.dtype == DType::BF16 && p.math == MathMode::BF16) {
        kind = lt::GemmKind::Bf16;
        return true;
    }
    return false;
}

struct Conv2dGemmLayout {
    std::size_t panel = 0, total = 0;
};
/// [one image's panel P x Kg (4 bytes per element, enough for both kinds) | library workspace].
Conv2dGemmLayout conv2d_gemm_layout(const Conv2dParams& p) {
    const std::size_t pix = std::size_t(p.out_h) * std::size_t(p.out_w);
    const std::size_t kg = std::size_t(p.in_channels) * std::size_t(p.kernel_h) * std::size_t(p.kernel_w);
    Conv2dGemmLayout l;
    l.panel = lt::align_up(pix * kg * sizeof(float));
    l.total = l.panel + lt::kLtWorkspaceBytes;
    return l;
}

/// One panel element rounded to the GEMM's operand type.
template <class P, bool Tf32>
__device__ __forceinline__ P to_panel(float val) {
    if constexpr (std::is_same_v<P, __nv_bfloat16>) return __float2bfloat16_rn(val);
    else if constexpr (Tf32) return lt::round_tf32(val);
    else return val;
}

/// panel[p][kk] for image b: a thread owns one column kk (input channel i, tap u, v: divided out once) and walks
/// kIm2colPixels consecutive pixels p of its block, stepping (r, q) without dividing; consecutive threads take
/// consecutive kk, so each pixel's row of the panel is written coalesced. (The flat kernel below divides a 64-bit
/// index per element, and that integer work bounds it: docs/kernels/cuda.md.)
template <class P, bool Tf32>
__global__ void __launch_bounds__(kIm2colColumns) conv2d_im2col_kernel(const Conv2dParams p, int b, P* __restrict__ panel) {
    detail::pdl_wait();
    const int khw = p.kernel_h * p.kernel_w, kg = p.in_channels * khw;
    const int kk = int(blockIdx.x) * kIm2colColumns + int(threadIdx.x);
    if (kk >= kg) return;
    const int i = kk / khw, uv = kk - i * khw;
    const int u = uv / p.kernel_w, v = uv - u * p.kernel_w;
    const float* __restrict__ xc = p.x + (std::size_t(b) * p.in_channels + i) * p.in_h * p.in_w;
    const int pixels = p.out_h * p.out_w;
    for (int p0 = int(blockIdx.y) * kIm2colPixels; p0 < pixels; p0 += int(gridDim.y) * kIm2colPixels) {
        int r = p0 / p.out_w, q = p0 - r * p.out_w;
        const int p1 = min(p0 + kIm2colPixels, pixels);
        for (int pix = p0; pix < p1; ++pix) {
            const int row = r * p.stride_h + u - p.pad_h, col = q * p.stride_w + v - p.pad_w;
            const float val = (row >= 0 && row < p.in_h && col >= 0 && col < p.in_w) ? xc[std::size_t(row) * p.in_w + col] : 0.f;
            panel[std::size_t(pix) * kg + kk] = to_panel<P, Tf32>(val);
            if (++q == p.out_w) {
                q = 0;
                ++r;
            }
        }
    }
}

/// The previous panel kernel (one thread per element, flat index), kept for the A/B under FLOWEDGE_CUDA_IM2COL_FLAT=1.
template <class P, bool Tf32>
__global__ void __launch_bounds__(kIm2colThreads) conv2d_im2col_flat_kernel(const Conv2dParams p, int b, P* __restrict__ panel,
                                                                            std::int64_t n_elements) {
    detail::pdl_wait();
    const int khw = p.kernel_h * p.kernel_w, kg = p.in_channels * khw;
    const float* __restrict__ xb = p.x + std::size_t(b) * p.in_channels * p.in_h * p.in_w;
    for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n_elements;
         e += std::int64_t(gridDim.x) * blockDim.x) {
        const int pix = int(e / kg), kk = int(e - std::int64_t(pix) * kg);
        const int r = pix / p.out_w, q = pix - r * p.out_w;
        const int i = kk / khw, uv = kk - i * khw;
        const int u = uv / p.kernel_w, v = uv - u * p.kernel_w;
        const int row = r * p.stride_h + u - p.pad_h, col = q * p.stride_w + v - p.pad_w;
        const float val = (row >= 0 && row < p.in_h && col >= 0 && col < p.in_w) ? xb[(std::size_t(i) * p.in_h + row) * p.in_w + col] : 0.f;
        panel[e] = to_panel<P, Tf32>(val);
    }
}

/// y = act(y + bias[o] + residual) over the whole batch, in place (y holds the GEMM's products), float.
__global__ void __launch_bounds__(kEpilogueThreads) conv2d_gemm_epilogue_kernel(const Conv2dParams p, std::int64_t n_elements) {
    detail::pdl_wait();
    const std::int64_t pix = std::int64_t(p.out_h) * p.out_w;
    for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n_elements;
         e += std::int64_t(gridDim.x) * blockDim.x) {
        float v = p.y[e];
        if (p.bias) v += p.bias[(e / pix) % p.out_channels];
        if (p.residual) v += p.residual[e];
        if (p.act == Activation::Relu) v = fmaxf(v, 0.f);
        p.y[e] = v;
    }
}

unsigned grid_for(std::int64_t n, int threads) {
    const std::int64_t blocks = (n + threads - 1) / threads;
    return unsigned(std::min<std::int64_t>(blocks, std::int64_t(detail::sm_count()) * 32));
}

/// Builds image b's panel with the column kernel (or the flat one under FLOWEDGE_CUDA_IM2COL_FLAT=1).
template <class P, bool Tf32>
void launch_im2col(const Conv2dParams& p, int b, void* panel, std::int64_t pix, std::int64_t kg, cudaStream_t st) {
    if (detail::env_flag("FLOWEDGE_CUDA_IM2COL_FLAT")) {
        detail::launch_pdl(conv2d_im2col_flat_kernel<P, Tf32>, dim3(grid_for(pix * kg, kIm2colThreads)), dim3(kIm2colThreads), 0, st, p,
                           b, static_cast<P*>(panel), pix * kg);
        return;
    }
    const std::int64_t pixel_blocks = std::min<std::int64_t>((pix + kIm2colPixels - 1) / kIm2colPixels, 65535);
    const dim3 grid(unsigned((kg + kIm2colColumns - 1) / kIm2colColumns), unsigned(pixel_blocks));
    detail::launch_pdl(conv2d_im2col_kernel<P, Tf32>, grid, dim3(kIm2colColumns), 0, st, p, b, static_cast<P*>(panel));
}

}  // namespace

std::size_t conv2d_scratch_bytes(const Conv2dParams& p) {
    if (p.batch <= 0 || p.in_channels <= 0 || p.out_channels <= 0 || p.out_h <= 0 || p.out_w <= 0 || p.kernel_h <= 0 ||
        p.kernel_w <= 0)
        return 0;
    if (!device_available() || detail::compute_major() < 8) return 0;
    return conv2d_gemm_layout(p).total;
}

bool conv2d_gemm(const Conv2dParams& p, Stream s) {
    lt::GemmKind kind{};
    if (!conv2d_gemm_kind(p, kind) || detail::env_flag("FLOWEDGE_CUDA_NO_LT")) return false;
    if (!(p.act == Activation::None || p.act == Activation::Relu)) return false;  // the epilogue's activations
    if (!device_available() || detail::compute_major() < 8) return false;
    const Conv2dGemmLayout sl = conv2d_gemm_layout(p);
    if (!p.scratch || p.scratch_bytes < sl.total || !detail::aligned(p.scratch, lt::kAlign)) return false;
    const std::int64_t pix = std::int64_t(p.out_h) * p.out_w, kg = std::int64_t(p.in_channels) * p.kernel_h * p.kernel_w;
    const std::int64_t panel_elements = pix * kg, y_elements = std::int64_t(p.batch) * p.out_channels * pix;
    if (pix >= (std::int64_t(1) << 30) || kg >= (std::int64_t(1) << 31) || panel_elements >= (std::int64_t(1) << 40)) return false;
    const cudaStream_t st = detail::resolve(s);
    auto* base = static_cast<unsigned char*>(p.scratch);
    void* panel = base;
    void* workspace = base + sl.panel;
    lt::GemmShape g;
    g.kind = kind;
    g.m = int(pix);
    g.n = p.out_channels;
    g.k = int(kg);
    g.ldb = int(kg);
    g.ldd = int(pix);
    g.align_w = lt::pointer_alignment(panel);
    g.align_b = lt::pointer_alignment(p.w.data);
    g.workspace = lt::kLtWorkspaceBytes;
    const std::size_t image_y = std::size_t(p.out_channels) * std::size_t(pix);
    // One plan for every image: the alignment all of their output pointers share.
    g.align_d = std::min(lt::pointer_alignment(p.y), lt::pointer_alignment(reinterpret_cast<const void*>(image_y * sizeof(float))));
    for (int b = 0; b < p.batch; ++b) {
        float* y = p.y + b * image_y;
        if (kind == lt::GemmKind::Tf32) launch_im2col<float, true>(p, b, panel, pix, kg, st);
        else if (kind == lt::GemmKind::F32) launch_im2col<float, false>(p, b, panel, pix, kg, st);
        else launch_im2col<__nv_bfloat16, false>(p, b, panel, pix, kg, st);
        FLOWEDGE_CUDA_CHECK_LAUNCH("conv2d_im2col");
        // The first image decides: without a handle or an algorithm nothing is written to y. Later images run the
        // same cached plan on the same handle, so they cannot decline once the first ran.
        if (!lt::gemm(g, panel, p.w.data, y, workspace, st)) {
            if (b == 0) return false;
            fail(ErrorKind::Internal, "cuda conv2d_gemm", "the GEMM plan of image 0 was refused for image " + std::to_string(b));
        }
    }
    if (p.bias || p.residual || p.act != Activation::None) {
        detail::launch_pdl(conv2d_gemm_epilogue_kernel, dim3(grid_for(y_elements, kEpilogueThreads)), dim3(kEpilogueThreads), 0, st, p,
                           y_elements);
        FLOWEDGE_CUDA_CHECK_LAUNCH("conv2d_gemm_epilogue");
    }
    return true;
}

}  // namespace flowedge::cuda
