// Plain-old-data parameter structs for every primitive: shared verbatim by Ops<Cpu> and the CUDA launchers.
//
// All pointers point into memory of the backend executing the op. Activations are float32, row-major.
// Large weight matrices keep their storage dtype (WeightRef) and are widened on the fly; small vectors
// (biases, norm weights, A, D, min/max) are float32, converted once at load.
#pragma once
#include <cstddef>
#include <cstdint>

#include "flowedge/dtype.hpp"

namespace flowedge {

class PreparedWeight;

/// A weight tensor in its storage dtype, plus the form its backend prepared at load (weights.hpp), if any.
struct WeightRef {
    /// The tensor as stored ([out, in], [out, in, kernel], ...), or null where the prepared form replaced it.
    const void* data = nullptr;
    DType dtype = DType::F32;
    /// The backend's re-laid-out copy (Ops<B>::prepare_weight), opaque outside that backend; null when none.
    const PreparedWeight* prepared = nullptr;
};

/// Pointwise activation applied inside an op (or on its own by Ops::activation).
enum class Activation : std::uint8_t {
    None = 0,
    Silu,      ///< x * sigmoid(x)                       (torch.nn.SiLU)
    Mish,      ///< x * tanh(softplus(x))                (torch.nn.Mish)
    Softplus,  ///< log1p(exp(x)), stable for large |x|  (torch.nn.functional.softplus, beta 1, threshold 20)
    Relu,      ///< max(x, 0), NaN stays NaN              (torch.nn.ReLU)
};

/// Arithmetic a backend may use for the big contractions (Conv1d, Linear). A request: F32 is the exact path (float
/// products and sums), and a backend or shape without a faster path computes exactly. Otherwise, per output, with
/// S = sum_i |w_i||x_i| and n the reduction length (in, or in_channels * kernel):
///   CUDA (sm_80+, batched calls), cuBLASLt path: TF32 <= (2^-10 + 2^-11 + n 2^-24) S, BF16 <= (2^-8 + n 2^-24) S;
///   CPU BF16 (vdpbf16ps on AVX512_BF16 CPUs; linear for in > 8): <= (c + g(1 + c)) S + g|bias| + a denormal term,
///     c = 2^-8 (BF16 weights) or 2^-7 + 2^-16 (F32/F16 weights), g = gamma_{3 ceil(n/32) + 6}; CPU TF32 is exact.
/// Derivations, the CUDA WMMA fallback's bound and the tests that check them: docs/numerics.md#math-modes.
enum class MathMode : std::uint8_t {
    F32 = 0,  ///< exact float math (default)
    TF32,     ///< tensor cores, TF32 operands, float accumulation (opt-in; exact on the CPU)
    BF16,     ///< BF16 operands, float accumulation (opt-in: CUDA tensor cores, CPU vdpbf16ps)
};

/// Dense layer, torch.nn.Linear: y[r, o] = (accumulate ? y[r, o] : 0) + act(sum_i x[r, i] * w[o, i] + bias[o]).
/// x: [rows, in] with row stride ld_x (0 = in); w: [out, in]; bias: [out] or null; y: [rows, out], stride ld_y (0 = out).
struct LinearParams {
    const float* x = nullptr;
    WeightRef w{};
    const float* bias = nullptr;
    float* y = nullptr;
    int rows = 0, in = 0, out = 0;
    int ld_x = 0, ld_y = 0;
    Activation act = Activation::None;
    bool accumulate = false;
    /// Requested arithmetic (MathMode); F32 = the exact path. Ops<Cpu> honours BF16 for in > 8 on a CPU with
    /// AVX512_BF16 (x rows and F32/F16 weights rounded to BF16, vdpbf16ps); TF32 and every other case are exact.
    MathMode math = MathMode::F32;
    /// Under F32 math, let the backend run many rows (>= 32) as its library's F32 GEMM (CUDA: cuBLASLt,
    /// CUBLAS_COMPUTE_32F: F32 products and float sums in the library's order, no TF32) instead of the fixed-order
    /// exact kernels, which stream the weights once for a few rows and are slow for hundreds. Ignored on the CPU.
    bool f32_gemm = false;
};

/// Whether the CUDA linear op (kernels/cuda/linear.cu, use_vec) walks an F32 weight row in 16-byte vector steps
/// rather than element by element: the two sum in different orders, so an op that reproduces the linear op's bits
/// (the fused Mamba-flow paths) must take the same choice for the same pointers and row stride (0 = in).
inline bool linear_f32_vector_path(const void* w, const void* x, int in, int ld_x = 0) {
    auto aligned16 = [](const void* q) { return reinterpret_cast<std::uintptr_t>(q) % 16 == 0; };
    return in % 4 == 0 && (ld_x ? ld_x : in) % 4 == 0 && aligned16(w) && aligned16(x);
}

/// Most LinearParams items one LinearBatchParams carries (one op launch on the GPU).
inline constexpr int kMaxLinearBatch = 16;

/// Several independent torch.nn.Linear ops executed as one op (on the GPU: one kernel launch), e.g. the FiLM
/// cond_encoder linears of every U-Net residual block, which all read the same condition vector.
/// items[0, n_items) each follow LinearParams exactly (own x/w/bias/y, sizes, strides, weight dtype, act,
/// accumulate); the result equals calling the single linear op on each item. Items must be independent: no
/// item's y may overlap another item's x or y (checked). Passed by value as a kernel parameter, so it stays small.
struct LinearBatchParams {
    int n_items = 0;
    LinearParams items[kMaxLinearBatch]{};
};
static_assert(sizeof(LinearBatchParams) <= 2048, "flowedge: LinearBatchParams must stay well under the 4 KB CUDA kernel-parameter limit");

/// torch.nn.Conv1d (groups 1, dilation 1): y[b, o, t] = bias[o] + sum_{i,k} w[o, i, k] * x[b, i, t*stride + k - pad],
/// x outside [0, in_length) reads as zero. x: [batch, in_channels, in_length]; w: [out, in, kernel]; y: [batch, out, out_length].
struct Conv1dParams {
    const float* x = nullptr;
    WeightRef w{};
    const float* bias = nullptr;
    float* y = nullptr;
    int batch = 1, in_channels = 0, out_channels = 0, in_length = 0, out_length = 0;
    int kernel = 1, stride = 1, pad = 0;
    /// Requested arithmetic (MathMode); F32 = the exact path. Ops<Cpu> honours BF16 on a CPU with AVX512_BF16
    /// (im2col panel and F32/F16 weights rounded to BF16, vdpbf16ps); TF32 and other CPUs are exact.
    MathMode math = MathMode::F32;
    /// Under F32 math with that scratch, let Ops<Cuda> run batched calls (batch * out_length >= 32) as im2col +
    /// cuBLASLt's F32 GEMM (CUBLAS_COMPUTE_32F: F32 products, float sums in the library's order) instead of the
    /// exact kernels, which are tuned for batch 1. Ignored on the CPU.
    bool f32_gemm = false;
    /// Optional scratch on the op's backend for a library GEMM path that needs one (CUDA: the im2col panel,
    /// GEMM output and GEMM library workspace of the cuBLASLt path, Ops<B>::conv1d_scratch_bytes(p) bytes,
    /// 256-byte aligned). Without it (null / too small) the backend uses a path that needs none.
    void* scratch = nullptr;
    std::size_t scratch_bytes = 0;
};

/// torch.nn.ConvTranspose1d (groups 1, dilation 1, output_padding folded into out_length):
/// y[b, o, t] = bias[o] + sum over (i, s, k) with s*stride - pad + k == t of w[i, o, k] * x[b, i, s].
/// x: [batch, in_channels, in_length]; w: [in, out, kernel]; y: [batch, out, out_length].
struct ConvTranspose1dParams {
    const float* x = nullptr;
    WeightRef w{};
    const float* bias = nullptr;
    float* y = nullptr;
    int batch = 1, in_channels = 0, out_channels = 0, in_length = 0, out_length = 0;
    int kernel = 4, stride = 2, pad = 1;
    /// As in Conv1dParams: the requested arithmetic, and under F32 math whether batched calls (batch * in_length >= 32)
    /// may run as one cuBLASLt F32 GEMM. With a GEMM request and scratch (Ops<B>::conv_transpose1d_scratch_bytes(p)
    /// bytes, 256-byte aligned) Ops<Cuda> computes batched calls as a library GEMM over every (output channel, tap)
    /// pair then a gather of the taps; otherwise, and on the CPU, the exact kernels.
    MathMode math = MathMode::F32;
    bool f32_gemm = false;
    void* scratch = nullptr;
    std::size_t scratch_bytes = 0;
};

/// torch.nn.GroupNorm(groups, channels, eps, affine) followed by optional fused epilogues, in this order:
///   a = act(groupnorm(x) * gamma[c] + beta[c]);
///   if film:     a = f[b, c] * a + f[b, channels + c]      (FiLM scale|bias, plain scale)
///   if residual: a = a + residual[b, c, t]
///   y = post_act(a).
/// f = film, or film + film_shared (one row added to every batch row's) when film_shared is set.
/// x, y, residual: [batch, channels, length] (images: length = H * W); film: [batch, 2*channels] with row stride
/// film_stride (0 = 2*channels); film_shared: [2*channels] or null (needs film). The U-Net passes its FiLM vectors in
/// two parts: the condition's, per batch row, and the timestep's, shared (ConditionalUnet1d::condition).
/// Statistics over (channels/groups) x length elements per group, biased variance.
/// The U-Net uses act = Mish with FiLM/residual; a ResNet BasicBlock's second norm uses residual + post_act = Relu.
struct GroupNormParams {
    const float* x = nullptr;
    const float* gamma = nullptr;
    const float* beta = nullptr;
    float* y = nullptr;
    int batch = 1, channels = 0, length = 0, groups = 1;
    float eps = 1e-5f;
    Activation act = Activation::None;
    const float* film = nullptr;
    int film_stride = 0;
    const float* film_shared = nullptr;
    const float* residual = nullptr;
    Activation post_act = Activation::None;
};

/// A GroupNorm of a Conv1d's output, as one op (Ops<B>::conv1d_group_norm; LeRobot's Conv1dBlock and the U-Net's
/// residual block halves): norm.y = norm's epilogue(GroupNorm(conv(conv.x))). conv.y is scratch for the raw conv
/// output: a backend that runs the two ops writes it and the norm reads it; CUDA's library-GEMM path for batched
/// calls normalises the GEMM's own [position][channel] output and leaves conv.y unwritten. norm.x must be conv.y;
/// norm's batch, channels and length must be the conv's batch, out_channels and out_length.
struct Conv1dGroupNormParams {
    Conv1dParams conv;
    GroupNormParams norm;
};

/// RMSNorm as in Mamba: y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight. x, y: [rows, dim].
struct RmsNormParams {
    const float* x = nullptr;
    const float* weight = nullptr;
    float* y = nullptr;
    int rows = 0, dim = 0;
    float eps = 1e-5f;
};

/// Elementwise y[i] = act(x[i]) for n elements (x may equal y).
struct ActivationParams {
    const float* x = nullptr;
    float* y = nullptr;
    std::int64_t n = 0;
    Activation act = Activation::None;
};

/// Elementwise out[i] = a*x[i] + b*y[i] (out may alias x or y; y may be null when b == 0).
struct AxpbyParams {
    const float* x = nullptr;
    const float* y = nullptr;
    float* out = nullptr;
    std::int64_t n = 0;
    float a = 1.f, b = 0.f;
};

/// Most hidden H x H layers a fused flow solve carries (FlowHead::kMaxLayers).
inline constexpr int kFlowSolveMaxLayers = 8;

/// Solver steps [first, first + count) of a batch-1 flow-matching solve as one fused op (Ops<Cuda>::flow_solve; the
/// CPU has none and FlowHead runs its per-op steps there): x <- step(x) with the FlowHead's velocity
///   h = silu(in_proj @ x + (tproj[j] + c)), h = silu(W_l @ h) for each hidden layer, v = out_proj @ h,
/// at half-step j = 2k (Heun: + 2k + 2; RK4: + 2k + 1 twice, 2k + 2) and the solver's combinations, each product,
/// bias and combination evaluated exactly as the single ops do (linear one warp per output, axpby a*x + b*y), so the
/// result equals FlowHead's per-op solve bit for bit. F32 weights.
struct FlowSolveParams {
    float* x = nullptr;            ///< [A]: the state at step `first` in, at step first + count out
    const float* c = nullptr;      ///< [H]: cond_proj @ condition
    const float* tproj = nullptr;  ///< [2N + 1, H]: time_proj @ temb(j / 2N) for every half step j
    const float* in_proj = nullptr;                     ///< [H, A]
    const float* layers[kFlowSolveMaxLayers] = {};      ///< [H, H] each
    const float* out_proj = nullptr;                    ///< [A, H]
    /// Per product (in_proj, layers..., out_proj): whether the single linear op would take its 16-byte vector path
    /// (its summation order); bit i for product i.
    std::uint32_t vec_mask = 0;
    int action_dim = 0, hidden = 0, n_layers = 0;
    int solver = 0;  ///< 0 Euler, 1 Heun, 2 RK4 (flowedge::Solver)
    int steps = 0, first = 0, count = 0;
    float dt = 0.f, half_dt = 0.f, sixth_dt = 0.f;  ///< float(1/N), float(0.5/N), float(1/(6N))
};

/// Limits of the fused Mamba-flow action (Ops<Cuda>::mamba_flow_act): backbone layers, prefix tokens, action width.
inline constexpr int kMambaActMaxLayers = 4;
inline constexpr int kMambaActMaxTokens = 16;
inline constexpr int kMambaActMaxAction = 64;

/// One Mamba layer's F32 tensors for the fused action, and its recurrent state (written: the state after the prefix).
struct MambaLayerTensors {
    const float* norm = nullptr;      ///< [D] RMSNorm weight
    const float* in_proj = nullptr;   ///< [2 di, D]
    const float* conv_w = nullptr;    ///< [di, K]
    const float* conv_b = nullptr;    ///< [di]
    const float* x_proj = nullptr;    ///< [R + 2S, di]
    const float* dt_proj = nullptr;   ///< [di, R]
    const float* dt_bias = nullptr;   ///< [di]
    const float* A = nullptr;         ///< [di, S]: -exp(A_log)
    const float* D = nullptr;         ///< [di]
    const float* out_proj = nullptr;  ///< [D, di]
    float* conv_state = nullptr;      ///< [K - 1, di]
    float* ssm_state = nullptr;       ///< [di, S]
};

/// A whole batch-1 Mamba-flow action as one fused op: state reset, prefill of the tokens (the last layer's out_proj
/// and norm_f for the last row only, as Mamba::prefill_last_device), c = cond_proj @ last hidden row, x = noise, then
/// flow.count = flow.steps solver steps (FlowSolveParams), every op evaluated as the single ops do, so the action,
/// the backbone state and `hidden` equal the per-op path's bits. Tokens and noise travel by value (no copies).
struct MambaFlowActParams {
    FlowSolveParams flow;              ///< x: the head's state buffer (the action, out); c unused (computed in the op)
    const float* cond_proj = nullptr;  ///< [H, D]
    const float* embedding = nullptr;  ///< [vocab, D]
    const float* norm_f = nullptr;     ///< [D]
    float* hidden = nullptr;           ///< [D]: the last row of the final norm (out)
    MambaLayerTensors layers[kMambaActMaxLayers];
    /// Vector (16-byte) steps of each product as the single linear op would choose: bits 4l + 0..3 for layer l's
    /// in_proj, x_proj, dt_proj, out_proj; bit 16 for cond_proj.
    std::uint32_t vec_mask = 0;
    int n_layers = 0, d_model = 0, d_inner = 0, d_state = 0, d_conv = 0, dt_rank = 0;
    float eps = 1e-5f;
    int n_tokens = 0;
    /// Set by the op: how many leading layers' projection weights the kernel copies to shared memory (as many as fit).
    int staged_layers = 0;
    std::int32_t tokens[kMambaActMaxTokens] = {};
    float noise[kMambaActMaxAction] = {};
};

/// Channel concatenation, torch.cat([a, b], dim=1): y[b] = [a[b] ; b[b]].
/// a: [batch, ca, length]; b: [batch, cb, length]; y: [batch, ca + cb, length].
struct ConcatParams {
    const float* a = nullptr;
    const float* b = nullptr;
    float* y = nullptr;
    int batch = 1, ca = 0, cb = 0, length = 1;
};

/// Sinusoidal features of the times t_r = t + r * t_step (float32), one per row (t_step 0: the same t in every row):
/// out[r, i] = sin(t_r * f_i), out[r, half + i] = cos(t_r * f_i), f_i = exp(-i * log_base / denom), i < half.
/// Float32 arithmetic in this order (matches LeRobot's SinusoidalPosEmb with denom = half - 1, log_base = ln 10000).
struct SinusoidParams {
    float t = 0.f;
    float t_step = 0.f;
    float* out = nullptr;
    int rows = 1, half = 0;
    float log_base = 9.210340371976184f;  // ln(10000)
    float denom = 1.f;
};

/// Embedding lookup, torch.nn.Embedding: y[r, :] = table[ids[r], :]. ids are validated by the caller.
/// ids: [rows] (int32, on the executing backend); table: [vocab, dim]; y: [rows, dim].
struct EmbeddingParams {
    const std::int32_t* ids = nullptr;
    WeightRef table{};
    float* y = nullptr;
    int rows = 0, dim = 0;
};

/// Mamba causal depthwise conv + SiLU over `length` new tokens with a rolling history:
/// with xx = [state (K-1 rows, oldest first) ; x], u[t, c] = silu(bias[c] + sum_k w[c, k] * xx[t + k, c]);
/// afterwards state holds the last K-1 rows of xx. Prefill starts from a zeroed state.
/// x: [length, channels] with row stride ld_x (0 = channels); w: [channels, 1, kernel]; state: [kernel-1, channels];
/// u: [length, channels].
struct CausalConvParams {
    const float* x = nullptr;
    int ld_x = 0;
    WeightRef w{};
    const float* bias = nullptr;
    float* state = nullptr;
    float* u = nullptr;
    int length = 0, channels = 0, kernel = 4;
};

/// Mamba-1 selective scan with D skip and SiLU(z) gate, continuing from `state`:
///   s[c, n] = exp(dt[t, c] * A[c, n]) * s[c, n] + dt[t, c] * B[t, n] * u[t, c]
///   y[t, c] = (sum_n s[c, n] * C[t, n] + D[c] * u[t, c]) * silu(z[t, c])
/// u, dt, y: [length, channels]; A: [channels, d_state] (already -exp(A_log)); D: [channels];
/// B, C: [length, d_state] with row stride ld_bc; z: [length, channels] with row stride ld_z; state: [channels, d_state].
/// dt_softplus: dt holds dt_proj's output before its softplus and the scan applies softplus (beta 1, threshold 20)
/// to each dt first (mamba_ssm's delta_softplus), saving a pass over dt.
/// y_from > 0: rows t < y_from of y may be left unwritten (the state still advances over every token; a backend may
/// write them anyway), for callers that read only the last rows (Mamba's prefill_last on its last layer).
struct SelectiveScanParams {
    const float* u = nullptr;
    const float* dt = nullptr;
    const float* A = nullptr;
    const float* B = nullptr;
    const float* C = nullptr;
    int ld_bc = 0;
    const float* D = nullptr;
    const float* z = nullptr;
    int ld_z = 0;
    float* state = nullptr;
    float* y = nullptr;
    int length = 0, channels = 0, d_state = 0;
    bool dt_softplus = false;
    int y_from = 0;
};

/// Which reverse-diffusion update DiffusionStepParams performs.
enum class StepKind : std::uint8_t { Ddim = 0, Ddpm = 1 };

/// One scheduler update over x: [batch, per_sample] given eps of the same shape (docs/models.md#scheduler-step):
///   x0 = (x - sqrt_one_minus_abar * eps) / sqrt_abar, clamped to +-clip_range when clip;
///   Ddim: x = c_x0 * x0 + c_other * eps;
///   Ddpm: x = c_x0 * x0 + c_other * x + noise_std * z, z the standard normal with global draw index
///         draw_offset + i from the SplitMix64/Box-Muller stream seeded with seed + b (no noise when noise_std == 0).
struct DiffusionStepParams {
    float* x = nullptr;
    const float* eps = nullptr;
    int batch = 1, per_sample = 0;
    StepKind kind = StepKind::Ddim;
    float sqrt_abar = 1.f, sqrt_one_minus_abar = 0.f;
    bool clip = false;
    float clip_range = 1.f;
    float c_x0 = 0.f, c_other = 0.f, noise_std = 0.f;
    std::uint64_t seed = 0;
    /// When set, the seed is read from this backend pointer instead (a captured CUDA graph can then be
    /// replayed with a new seed without re-capture).
    const std::uint64_t* seed_ptr = nullptr;
    /// With seed_ptr set: it holds [batch] seeds and element b's stream is seeded with seed_ptr[b] (not *seed_ptr + b),
    /// so the rows of one call can be independent environments, each with its own noise stream (DiffusionPolicy).
    bool seed_per_row = false;
    std::uint64_t draw_offset = 0;
    /// 0: each sample is in the sample layout [horizon, action_dim] and element i takes draw i. L > 0: each sample is
    /// channel-major [per_sample / L, L] (the U-Net's [action_dim, horizon], L = horizon), and element a*L + h takes
    /// the draw of its sample-layout index h * (per_sample / L) + a, so DDPM noise does not depend on the layout.
    int channel_major_length = 0;
};

/// torch.nn.Conv2d (groups 1, dilation 1, zero padding) with a fused epilogue (a ResNet conv with its eval-mode
/// BatchNorm folded into w and bias, plus the block's residual and ReLU):
///   y[b, o, r, c] = act(bias[o] + sum_{i,kh,kw} w[o, i, kh, kw] * x[b, i, r*stride_h + kh - pad_h, c*stride_w + kw - pad_w]
///                       + residual[b, o, r, c]),
/// x outside the image reads as zero. x: [batch, in_channels, in_h, in_w]; w: [out, in, kernel_h, kernel_w];
/// bias: [out] or null; residual, y: [batch, out, out_h, out_w], residual null for none (y must not alias x).
struct Conv2dParams {
    const float* x = nullptr;
    WeightRef w{};
    const float* bias = nullptr;
    const float* residual = nullptr;
    float* y = nullptr;
    int batch = 1, in_channels = 0, out_channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
    int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
    Activation act = Activation::None;
    /// Requested arithmetic (MathMode); F32 = the exact kernels. Ops<Cuda> runs TF32/BF16 as im2col + a cuBLASLt
    /// tensor-core GEMM (kernels/cuda/conv2d_gemm.cu) when `scratch` holds Ops<B>::conv2d_scratch_bytes(p) bytes
    /// (256-byte aligned); without it, and on the CPU, every mode computes exactly.
    MathMode math = MathMode::F32;
    /// Under F32 math with that scratch, let Ops<Cuda> run im2col + cuBLASLt's F32 GEMM (CUBLAS_COMPUTE_32F: F32
    /// products, float sums in the library's order) instead of the exact kernels (ACT's 480x640 backbone). Ignored
    /// on the CPU.
    bool f32_gemm = false;
    void* scratch = nullptr;
    std::size_t scratch_bytes = 0;
};

/// A Conv2d and the GroupNorm over its output as one fused op (Ops<Cuda>::conv2d_group_norm; the CPU has none and the
/// layers run the two ops): conv.y = norm's epilogue(GroupNorm(conv(x))). conv: no bias, residual or activation (the
/// norm's epilogue carries them), F32 math; norm: gamma, beta, groups, eps, act, residual, post_act (its x, y,
/// batch, channels and length are ignored: the conv's output is normalised; FiLM is not taken).
struct Conv2dGroupNormParams {
    Conv2dParams conv;
    GroupNormParams norm;
};

/// torch.nn.MaxPool2d(kernel, stride, padding) (dilation 1, ceil_mode off): y[b, c, r, q] = max over the window
/// rows r*stride - pad .. + kernel-1, columns q*stride - pad .. + kernel-1 inside the image (padding never wins;
/// NaN propagates as in PyTorch). x: [batch, channels, in_h, in_w]; y: [batch, channels, out_h, out_w].
struct MaxPool2dParams {
    const float* x = nullptr;
    float* y = nullptr;
    int batch = 1, channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
    int kernel = 3, stride = 2, pad = 1;
};

/// LeRobot SpatialSoftmax after its 1x1 keypoint conv: per row, attention = softmax(x[r, :]) over the positions
/// (float, max-subtracted, as torch.softmax), then y[r, j] = sum_p attention[p] * pos_grid[p, j], j = 0 (x), 1 (y).
/// x: [rows, positions] (rows = batch * keypoints, positions = H * W); pos_grid: [positions, 2] (the module's
/// `pos_grid` buffer); y: [rows, 2].
struct SpatialSoftmaxParams {
    const float* x = nullptr;
    const float* pos_grid = nullptr;
    float* y = nullptr;
    int rows = 0, positions = 0;
};

/// How a feature is normalised (LeRobot NormalizationMode), with the per-element `offset` / `denom` prepared at load:
///   MeanStd: y = (x - mean) / (std + eps)              offset = mean, denom = std + eps   (float32, as LeRobot)
///   MinMax:  y = 2 * (x - min) / denom - 1             offset = min,  denom = max - min, or eps where that is 0
/// QUANTILES / QUANTILE10 are MinMax with their quantiles as min and max.
enum class NormKind : std::uint8_t { Identity = 0, MeanStd, MinMax };

/// LeRobot's NormalizerProcessorStep on a [rows, dim] feature (state, environment state): per column d,
/// y[r, d] = norm(x[r, d]; offset[d], denom[d]) (NormKind). x may equal y.
struct NormalizeParams {
    const float* x = nullptr;
    float* y = nullptr;
    const float* offset = nullptr;
    const float* denom = nullptr;
    int rows = 0, dim = 0;
    NormKind kind = NormKind::MinMax;
};

/// How a camera frame is laid out in memory.
enum class ImageLayout : std::uint8_t {
    U8Hwc = 0,  ///< uint8 [batch, height, width, channels], value v -> float(v) / 255 (LeRobot's env preprocessing)
    F32Chw,     ///< float32 [batch, channels, height, width], already in [0, 1]
};

/// Camera frames to normalised float CHW, cut to a window (the center crop when no resize follows):
///   y[b, c, r, q] = norm(v(x, b, c, top + r, left + q); offset[c], denom[c])   (NormKind per channel, as NormalizeParams)
/// x: [batch, height, width, channels] uint8 or [batch, channels, height, width] float (ImageLayout);
/// offset, denom: [channels] (ignored for Identity); y: [batch, channels, out_h, out_w], the window
/// top..top+out_h-1, left..left+out_w-1 of the frame (inside it).
struct ImageToTensorParams {
    const void* x = nullptr;
    ImageLayout layout = ImageLayout::U8Hwc;
    float* y = nullptr;
    const float* offset = nullptr;
    const float* denom = nullptr;
    NormKind kind = NormKind::MeanStd;
    int batch = 1, channels = 3, height = 0, width = 0;
    int top = 0, left = 0, out_h = 0, out_w = 0;
};

/// torchvision.transforms.Resize((resized_h, resized_w)) on float CHW images (torch.nn.functional.interpolate,
/// bilinear, align_corners False, antialias as given; torchvision's default for tensors is antialias on), then the
/// window top..top+out_h-1, left..left+out_w-1 of the resized image (torchvision CenterCrop after it):
/// x: [planes, in_h, in_w] (planes = batch * channels); y: [planes, out_h, out_w].
/// With antialias, each output takes the triangle filter stretched by the scale when downsampling (support
/// scale = in / out per axis, weights normalised to sum 1, separable, as PyTorch's _upsample_bilinear2d_aa).
struct ResizeParams {
    const float* x = nullptr;
    float* y = nullptr;
    int planes = 0, in_h = 0, in_w = 0, resized_h = 0, resized_w = 0;
    int top = 0, left = 0, out_h = 0, out_w = 0;
    bool antialias = true;
};

/// MIN_MAX un-normalisation: y[r, d] = (x[r, d] + 1) / 2 * (max[d] - min[d]) + min[d]. x, y: [rows, dim].
struct UnnormalizeParams {
    const float* x = nullptr;
    float* y = nullptr;
    const float* min = nullptr;
    const float* max = nullptr;
    int rows = 0, dim = 0;
};

}  // namespace flowedge
