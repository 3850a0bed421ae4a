// torch.nn.Conv1d and ConvTranspose1d as GEMV-like weight streams for short sequences (the Diffusion
// Policy U-Net: 512..4096 channels, lengths 1..16), plus exact generic fallbacks for any other shape.
// At batch 1 these convolutions are pure weight streams (each weight is used L_out <= 16 times), so the
// design goal is bytes in flight per SM, not FLOPs.
//
// conv1d row path (the PushT shapes: 'same' padding pad = K/2, K in {1,3,5}, stride 1 or 2, whole input row
// of L_in in {1,2,4,8,16} positions, in_channels % 4 == 0, aligned weights and input):
//   256 threads = 8 warps per block; a block computes G x OW output channels (G groups of OW outputs; G in
//   {8,4,2,1}: the smallest whose grid still fits in one wave of resident blocks) for one batch element and ALL
//   output positions; the 8/G warps of one group split in_channels. Each lane owns CPL consecutive channels per
//   step of 32*CPL*(8/G) channels: CPL = 4 (F32: K 16-byte loads per output; 16-bit weights whose rows do not
//   allow 16-byte loads: K 8-byte loads) or CPL = 8 (16-bit weights, in_channels % 8 == 0: K 16-byte loads, so
//   a 16-bit stream needs as few load instructions per byte as F32; BF16 widens by a shift or mask, F16 by one
//   pair conversion). OW = 4 for k = 1 on rows of <= 8 positions (one read of the lane's input rows serves 4
//   weight rows: a k = 1 conv has one weight per input value, so with OW = 1 the input reads dominated), else 1.
//   The raw weights are kept in registers row_depth() steps ahead (~160 bytes per lane; 3 steps = 240 bytes for
//   K = 5 with 16-byte units; weights are constants, so the first steps are issued before griddepcontrol.wait
//   and overlap the previous kernel's tail). After the wait the block stages its batch element's input once in
//   shared memory, transposed to [position][channel] (swizzled, <= 96 KiB; else lanes read their rows from
//   global memory), so a lane reads its 4 channels at one position as one conflict-free 16-byte shared load: read
//   from global memory, a lane's rows are one 128-byte line per lane per load (32 L1 wavefronts per warp load;
//   counting wavefronts reproduces the measured 1024->1024 k5 F32 times, 17.3 us at L = 8 vs 10.9 us at L = 4
//   for the same weights, before staging). Every tap/position index is a compile-time constant and the channel
//   loop has no barrier after the one that publishes the staged input, so nothing serialises the weight stream.
//   (The first version staged the input window per chunk in shared memory between two __syncthreads and kept
//   one chunk in flight: 1.4-2.0 TB/s on the big PushT convs; a 4-stage cp.async ring on top of that staging
//   measured slower, 10.0 vs 8.2 ms per sample.) FLOWEDGE_CUDA_CONV_NO_W16=1 / FLOWEDGE_CUDA_CONV_NO_OW=1 /
//   FLOWEDGE_CUDA_CONV_SHALLOW=1 / FLOWEDGE_CUDA_CONV_NO_XS=1 turn CPL = 8 / OW = 4 / the 240-byte depth / the
//   staged input off for A/B timing.
// conv1d tiled path (any other length with kernel/stride in {5/1, 3/1, 3/2, 1/1}): the row path's lane
//   layout with CPL = 4, OW = 1 over tiles of LT output positions, with the input window (LT-1)*stride+K wide
//   staged in shared memory per chunk as float4 (4 channels) per position (odd row length: conflict-free), one
//   chunk of weights prefetched in registers.
// Both end in reduce_and_store(): lane partials are reduced by a warp butterfly and the warps of one output in
// a fixed order through shared memory: deterministic, float accumulation.
// conv_transpose1d fast path (kernel 4, stride 2, pad 1, out_length = 2*in_length <= 32):
//   weights [in, out, 4] are streamed along i: in a warp, lanes form (32/OT) x OT (i, o) pairs so each
//   load instruction reads whole 32-byte sectors (OT consecutive o of 4 taps per i); 8 warps split i;
//   the input row of length L_in (<= 16) is read as float4; reduction over lanes then warps in a fixed
//   order. grid = ceil(out/OT) x batch, OT in {2,4,8} chosen to fill the SMs.
// Generic paths: one thread per output element, float accumulation in (i, k) order.
// Every kernel is launched with detail::launch_pdl and calls pdl_wait() before reading activations.
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxDynSmem = 46 * 1024;  // + static reduction scratch stays under the 48 KiB default

/// The raw load unit of `n` consecutive stored weights: 16 bytes (uint4) or 8 bytes (uint2).
template <class T, int n>
using RawUnit = std::conditional_t<n * sizeof(T) == 16, uint4, uint2>;

/// 4 consecutive weights widened to float: one 16-byte load (F32) or one 8-byte load (BF16/F16).
template <class T>
__device__ __forceinline__ void load4(const T* p, float* out) {
    detail::widen_raw<T>(__ldg(reinterpret_cast<const RawUnit<T, 4>*>(p)), out);
}

/// Read-only load of one raw unit with an L2 prefetch hint of 256 bytes (a warp's loads walk one contiguous
/// stretch of the weight row, so the neighbouring sectors are always wanted next).
template <class U>
__device__ __forceinline__ U load_raw(const void* p) {
    U r;
    if constexpr (sizeof(U) == 16)
        asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    else
        asm("ld.global.nc.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}

/// Ends a block of the row or tiled path. Each lane holds NV partial sums (its outputs x positions); `red` is
/// the block's [kWarps][NV] shared scratch. Lanes are reduced by a warp butterfly, then the `wpo` warps that
/// share one output group (warps g*wpo .. g*wpo+wpo-1) are summed in warp order, so the result is deterministic.
/// store(g, v, sum) is called once per (group g < n_groups, value v < NV) with the fixed-order sum (no bias).
template <int NV, class Store>
__device__ __forceinline__ void reduce_and_store(float (&acc)[NV], float (*red)[NV], int wpo, int n_groups,
                                                 Store&& store) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
        const float s = detail::warp_sum(acc[v]);
        if (lane == 0) red[warp][v] = s;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n_groups * NV; idx += kThreads) {
        const int g = idx / NV, v = idx % NV;
        float sum = 0.f;
        for (int w2 = 0; w2 < wpo; ++w2) sum += red[g * wpo + w2][v];
        store(g, v, sum);
    }
}

// ---- conv1d row path -----------------------------------------------------------------------------------
// Template parameters: T weight type, KS kernel, S stride, LIN input length, CPL channels per lane per step
// (4, or 8 for 16-bit weights: one 16-byte load per tap), OW outputs per warp (1, or 4 for k = 1 so that one
// read of the input row serves 4 weight rows).

/// Weight steps kept in flight per lane. Base: ~160 bytes of raw weights (2 steps of F32 at K = 5, 4 steps of
/// 16-bit with 4 channels per lane), clamped to 1..4. Deep (OW = 1 only): ~240 bytes, at most 3 steps, never fewer
/// than the base; it differs from the base for K = 5 with 16-byte units (F32, and 16-bit with 8 channels per lane:
/// 3 steps instead of 2; <= 128 registers on sm_90, i.e. 2 blocks of 256 threads per SM, which is what the PushT
/// grids of <= 256 blocks use anyway; launch_conv1d_row keeps the base for 16-bit at L = 16 with 8 channels per
/// lane, where deep would need 144). A lane
/// waits on its oldest step while the others stay in flight, so deep keeps 2 instead of 1 step (160 instead of
/// 80 bytes per lane) in flight during each wait.
template <class T, int KS, int CPL, int OW>
__host__ __device__ constexpr int row_depth(bool deep) {
    const int step_bytes = OW * KS * CPL * int(sizeof(T));
    const int d = 160 / step_bytes;
    const int base = d < 1 ? 1 : (d > 4 ? 4 : d);
    const int dd = 240 / step_bytes > 3 ? 3 : 240 / step_bytes;
    return deep && OW == 1 && dd > base ? dd : base;
}

/// Output groups per block of the row path (a block covers groups x OW output channels; the 8/groups warps of a
/// group split in_channels): the smallest count in {8,4,2,1} whose grid still fits in one wave of resident
/// blocks (`slots` = SMs x blocks per SM: no tail wave, and as many SMs streaming as possible), never splitting
/// a row so finely that a warp's channel step (32 * cpl * 8/groups) exceeds it.
int choose_row_groups(int out_channels, int in_channels, int batch, long long slots, int cpl, int ow) {
    int g = 8;
    while (g > 1) {
        const int next = g / 2;
        const long long blocks = (long long)((out_channels + next * ow - 1) / (next * ow)) * batch;
        if (blocks > slots || 32LL * cpl * (kWarps / next) > in_channels) break;
        g = next;
    }
    return g;
}

/// Row stride (floats) of the staged input of the row path: in_channels rounded up to 8, so the swizzle below stays
/// inside the row.
__host__ __device__ constexpr int row_xs_stride(int in_channels) { return (in_channels + 7) / 8 * 8; }
/// Dynamic shared memory of the row path with the staged input: L_in rows of row_xs_stride() floats.
constexpr int row_xs_bytes(int in_channels, int lin) { return lin * row_xs_stride(in_channels) * int(sizeof(float)); }
/// Column of channel c in a staged input row: 16-byte units u = c/4 are swapped pairwise (u ^ 1) in every second
/// group of 8 units, so that the 8 lanes of a quarter warp hit 8 distinct bank quads both when each lane reads
/// 4 consecutive channels (CPL = 4: units l) and 4 of its 8 (CPL = 8: units 2l + half).
__device__ __forceinline__ int row_xs_col(int c) { return c ^ (((c >> 5) & 1) << 2); }

template <class T, int KS, int S, int LIN, int CPL, int OW, int D, bool XS>
__global__ void __launch_bounds__(kThreads) conv1d_row_kernel(Conv1dParams p, int n_groups) {
    static_assert(CPL * sizeof(T) == 16 || CPL * sizeof(T) == 8, "a lane's channels of one tap are 8 or 16 bytes");
    extern __shared__ float4 row_xs[];  // XS: the input of batch element b as [L_in][row_xs_stride] floats
    constexpr int P = KS / 2;
    constexpr int LOUT = (LIN + 2 * P - KS) / S + 1;
    constexpr int NV = OW * LOUT;
    using U = RawUnit<T, CPL>;
    __shared__ float red[kWarps][NV];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wpo = kWarps / n_groups;
    const int g = warp / wpo, ws = warp % wpo;
    const int o0 = (blockIdx.x * n_groups + g) * OW;  // this warp's first output channel
    const int b = blockIdx.y;
    const int in = p.in_channels;
    const int step = 32 * CPL * wpo;  // channels per step of the warps of one group
    const int c_first = CPL * (ws * 32 + lane);
    const T* w = static_cast<const T*>(p.w.data);
    const float* xb = p.x + std::size_t(b) * in * LIN;

    // wbuf[d][ow][q]: unit q (elements CPL*q .. CPL*q+CPL-1) of the flattened [CPL channels][K] weights of
    // output o0+ow at one step. in % CPL == 0, so a lane's CPL channels are either all in range or none.
    U wbuf[D][OW][KS];
    auto load_step = [&](int c, U (*dst)[KS]) {
#pragma unroll
        for (int ow = 0; ow < OW; ++ow) {
            const int o = o0 + ow;
            if (o < p.out_channels && c < in) {
                const T* src = w + (std::size_t(o) * in + c) * KS;
#pragma unroll
                for (int q = 0; q < KS; ++q) dst[ow][q] = load_raw<U>(src + CPL * q);
            } else {
#pragma unroll
                for (int q = 0; q < KS; ++q) dst[ow][q] = U{};
            }
        }
    };
#pragma unroll
    for (int d = 0; d < D; ++d) load_step(c_first + d * step, wbuf[d]);

    detail::pdl_wait();  // the input (previous kernel's output) is complete from here on
    detail::pdl_allow_next();

    const int xs_stride = row_xs_stride(in);
    if constexpr (XS) {
        // Stage the input once per block, transposed to [position][channel]: the channel loop then reads a lane's
        // 4 channels at one position as one conflict-free 16-byte shared load, where reading its rows from global
        // memory touched one 128-byte line per lane per load (32 L1 wavefronts per warp load).
        float* xs = reinterpret_cast<float*>(row_xs);
        const float4* xg = reinterpret_cast<const float4*>(xb);
        for (int idx = threadIdx.x; idx < in * LIN / 4; idx += kThreads) {
            const float4 v = __ldg(xg + idx);
            const float e4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int e = 4 * idx + i;  // element (channel e / LIN, position e % LIN) of the input rows
                xs[(e % LIN) * xs_stride + row_xs_col(e / LIN)] = e4[i];
            }
        }
        __syncthreads();
    }

    float acc[NV];
#pragma unroll
    for (int v = 0; v < NV; ++v) acc[v] = 0.f;

    // y[o][t] += sum_{cc,k} w[o][cc][k] * x[cc][t*S + k - P] over the lane's CPL channels c..c+CPL-1.
    auto fma_step = [&](int c, const U (*wr)[KS]) {
        if (c >= in) return;
        const float4* xr = reinterpret_cast<const float4*>(xb + std::size_t(c) * LIN);  // rows c.., contiguous
#pragma unroll
        for (int half = 0; half < CPL / 4; ++half) {  // 4 channels at a time keeps the live input at 4*LIN floats
            float x[4 * LIN];  // x[cc * LIN + pos]: channel c + 4*half + cc at position pos
            if constexpr (XS) {
                const float* xs = reinterpret_cast<const float*>(row_xs) + row_xs_col(c + 4 * half);
#pragma unroll
                for (int j = 0; j < LIN; ++j) {
                    const float4 v = *reinterpret_cast<const float4*>(xs + j * xs_stride);
                    x[j] = v.x; x[LIN + j] = v.y; x[2 * LIN + j] = v.z; x[3 * LIN + j] = v.w;
                }
            } else {
#pragma unroll
                for (int j = 0; j < LIN; ++j) {
                    const float4 v = __ldg(xr + half * LIN + j);
                    x[4 * j] = v.x; x[4 * j + 1] = v.y; x[4 * j + 2] = v.z; x[4 * j + 3] = v.w;
                }
            }
#pragma unroll
            for (int ow = 0; ow < OW; ++ow) {
                float wf[CPL * KS];
#pragma unroll
                for (int q = 0; q < KS; ++q) detail::widen_raw<T>(wr[ow][q], wf + CPL * q);
#pragma unroll
                for (int cc = 0; cc < 4; ++cc)
#pragma unroll
                    for (int t = 0; t < LOUT; ++t)
#pragma unroll
                        for (int k = 0; k < KS; ++k) {
                            const int pos = t * S + k - P;
                            if (pos >= 0 && pos < LIN)
                                acc[ow * LOUT + t] += wf[(half * 4 + cc) * KS + k] * x[cc * LIN + pos];
                        }
            }
        }
    };

    for (int c = c_first; c < in; c += D * step) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            fma_step(c + d * step, wbuf[d]);
            load_step(c + (d + D) * step, wbuf[d]);
        }
    }

    reduce_and_store<NV>(acc, red, wpo, n_groups, [&](int g2, int v, float sum) {
        const int o = (blockIdx.x * n_groups + g2) * OW + v / LOUT;
        const int t = v % LOUT;
        if (o < p.out_channels) {
            if (p.bias) sum += p.bias[o];
            p.y[(std::size_t(b) * p.out_channels + o) * LOUT + t] = sum;
        }
    });
}

/// A/B switches of the row path, read once per process (any value but "0" turns the feature off):
/// FLOWEDGE_CUDA_CONV_NO_W16: 16-bit weights use 4 channels per lane (8-byte loads) as before 2026-12-03;
/// FLOWEDGE_CUDA_CONV_NO_OW: k = 1 convolutions compute one output per warp (input re-read per output);
/// FLOWEDGE_CUDA_CONV_SHALLOW: the base prefetch depth of row_depth() instead of the deep one;
/// FLOWEDGE_CUDA_CONV_NO_XS: lanes read their input rows from global memory (L1) instead of the staged copy.
bool row_w16_enabled() {
    static const bool on = !detail::env_flag("FLOWEDGE_CUDA_CONV_NO_W16");
    return on;
}
bool row_ow_enabled() {
    static const bool on = !detail::env_flag("FLOWEDGE_CUDA_CONV_NO_OW");
    return on;
}
bool row_deep_enabled() {
    static const bool on = !detail::env_flag("FLOWEDGE_CUDA_CONV_SHALLOW");
    return on;
}
bool row_xs_enabled() {
    static const bool on = !detail::env_flag("FLOWEDGE_CUDA_CONV_NO_XS");
    return on;
}

/// Largest staged input of the row path (bytes of dynamic shared memory per block): 96 KiB (every PushT row is
/// <= 64 KiB), or the device's opt-in limit where lower.
int row_xs_limit() {
    const int v = detail::smem_per_block_optin();
    return v < 96 * 1024 ? v : 96 * 1024;
}

/// Blocks of one row-path instantiation one SM holds at once with `smem` bytes of staged input: the register bound
/// (asked once per process: a process mixing devices of different architectures would size the grid for the first
/// one; still correct, maybe a tail wave), and for the staged input the shared-memory bound, counted here with
/// 2 KiB per block for the static reduction scratch and the runtime's reserve (no driver query per launch).
template <class T, int KS, int S, int LIN, int CPL, int OW, int D, bool XS>
int row_per_sm(int smem) {
    constexpr auto kernel = conv1d_row_kernel<T, KS, S, LIN, CPL, OW, D, XS>;
    static const int by_regs = [] {
        if constexpr (XS)
            FLOWEDGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, row_xs_limit()));
        int n = 0;
        FLOWEDGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0));
        return n > 0 ? n : 1;
    }();
    if constexpr (XS) {
        const int by_smem = detail::smem_per_sm() / (smem + 2048);
        const int n = by_smem < by_regs ? by_smem : by_regs;
        return n > 0 ? n : 1;
    } else {
        (void)smem;
        return by_regs;
    }
}

/// Output groups per block for the base-depth register-only instantiation (used to compare lane layouts).
template <class T, int KS, int S, int LIN, int CPL, int OW>
int row_groups(const Conv1dParams& p) {
    constexpr int base = row_depth<T, KS, CPL, OW>(false);
    const long long slots = (long long)row_per_sm<T, KS, S, LIN, CPL, OW, base, false>(0) * detail::sm_count();
    return choose_row_groups(p.out_channels, p.in_channels, p.batch, slots, CPL, OW);
}

/// Launches the layout (CPL, OW): with the input staged in shared memory where it fits, and with the deep
/// prefetch where it differs from the base (each unless switched off).
template <class T, int KS, int S, int LIN, int CPL, int OW>
void launch_conv1d_row(const Conv1dParams& p, cudaStream_t st) {
    // 16-bit at 8 channels per lane on rows of 16 keeps the base depth: deep + staged input needs 144 registers
    // there (1 block per SM).
    constexpr bool deep_ok = !(sizeof(T) == 2 && CPL == 8 && LIN > 8);
    constexpr int base = row_depth<T, KS, CPL, OW>(false), deep = row_depth<T, KS, CPL, OW>(deep_ok);
    const int smem = row_xs_bytes(p.in_channels, LIN);
    const bool xs = row_xs_enabled() && smem <= row_xs_limit();
    auto go = [&]<int D, bool XS>() {
        const int bytes = XS ? smem : 0;
        const long long slots = (long long)row_per_sm<T, KS, S, LIN, CPL, OW, D, XS>(bytes) * detail::sm_count();
        const int g = choose_row_groups(p.out_channels, p.in_channels, p.batch, slots, CPL, OW);
        const dim3 grid(unsigned((p.out_channels + g * OW - 1) / (g * OW)), unsigned(p.batch));
        detail::launch_pdl(conv1d_row_kernel<T, KS, S, LIN, CPL, OW, D, XS>, grid, dim3(kThreads), std::size_t(bytes),
                           st, p, g);
    };
    if constexpr (deep != base) {
        if (row_deep_enabled()) {
            if (xs) return go.template operator()<deep, true>();
            return go.template operator()<deep, false>();
        }
    }
    if (xs) return go.template operator()<base, true>();
    go.template operator()<base, false>();
}

/// Picks the lane layout. 8 channels per lane for 16-bit weights when the rows allow 16-byte loads, the input is
/// staged in shared memory (read from global memory, 8 channels per lane would double the L1 wavefronts of the
/// input reads per weight byte: a lane's rows span a whole 128-byte line at L_in >= 4) and the grid keeps as many
/// blocks as with 4 (at 512 input channels, 8 per lane would halve the blocks: 1 step per lane either way, so the
/// 4-channel layout's extra parallelism wins). 4 outputs per warp for k = 1 on rows of <= 8 positions (k = 1 has
/// one weight per input value, so one input read per weight row made the input dominate).
template <class T, int KS, int S, int LIN>
void launch_conv1d_row_layout(const Conv1dParams& p, cudaStream_t st) {
    constexpr int OW = KS == 1 && LIN <= 8 ? 4 : 1;
    const bool ow_on = OW > 1 && row_ow_enabled();
    if constexpr (sizeof(T) == 2) {
        const bool staged = row_xs_enabled() && row_xs_bytes(p.in_channels, LIN) <= row_xs_limit();
        if (row_w16_enabled() && staged && p.in_channels % 8 == 0 && detail::aligned(p.w.data, 16)) {
            const auto blocks = [&](int groups, int ow) { return (p.out_channels + groups * ow - 1) / (groups * ow); };
            if (ow_on) {
                const int g8 = row_groups<T, KS, S, LIN, 8, OW>(p), g4 = row_groups<T, KS, S, LIN, 4, OW>(p);
                if (blocks(g8, OW) >= blocks(g4, OW)) return launch_conv1d_row<T, KS, S, LIN, 8, OW>(p, st);
            } else {
                const int g8 = row_groups<T, KS, S, LIN, 8, 1>(p), g4 = row_groups<T, KS, S, LIN, 4, 1>(p);
                if (blocks(g8, 1) >= blocks(g4, 1)) return launch_conv1d_row<T, KS, S, LIN, 8, 1>(p, st);
            }
        }
    }
    if (ow_on) return launch_conv1d_row<T, KS, S, LIN, 4, OW>(p, st);
    launch_conv1d_row<T, KS, S, LIN, 4, 1>(p, st);
}

template <class T, int KS, int S>
bool try_conv1d_row_lin(const Conv1dParams& p, cudaStream_t st) {
    switch (p.in_length) {
        case 1: launch_conv1d_row_layout<T, KS, S, 1>(p, st); return true;
        case 2: launch_conv1d_row_layout<T, KS, S, 2>(p, st); return true;
        case 4: launch_conv1d_row_layout<T, KS, S, 4>(p, st); return true;
        case 8: launch_conv1d_row_layout<T, KS, S, 8>(p, st); return true;
        case 16: launch_conv1d_row_layout<T, KS, S, 16>(p, st); return true;
        default: return false;
    }
}

template <class T>
bool try_conv1d_row(const Conv1dParams& p, cudaStream_t st) {
    const std::size_t wal = sizeof(T) == 4 ? 16 : 8;
    if (p.in_channels % 4 != 0 || p.pad != p.kernel / 2 || !detail::aligned(p.w.data, wal) ||
        !detail::aligned(p.x, 16))
        return false;
    if (p.kernel == 5 && p.stride == 1) return try_conv1d_row_lin<T, 5, 1>(p, st);
    if (p.kernel == 3 && p.stride == 1) return try_conv1d_row_lin<T, 3, 1>(p, st);
    if (p.kernel == 3 && p.stride == 2) return try_conv1d_row_lin<T, 3, 2>(p, st);
    if (p.kernel == 1 && p.stride == 1) return try_conv1d_row_lin<T, 1, 1>(p, st);
    return false;
}

template <class T, int KS, int S, int LT>
__global__ void __launch_bounds__(kThreads) conv1d_fast_kernel(Conv1dParams p, int ob_per_block) {
    constexpr int XW = (LT - 1) * S + KS;
    constexpr int XWP = XW | 1;
    extern __shared__ float4 xs[];  // [32 * wpo groups][XWP] float4 = 4 channels at one input position
    __shared__ float red[kWarps][LT];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wpo = kWarps / ob_per_block;
    const int ob = warp / wpo, ws = warp % wpo;
    const int o = blockIdx.x * ob_per_block + ob;
    const bool o_ok = o < p.out_channels;
    const int b = blockIdx.z;
    const int t0 = blockIdx.y * LT;
    const int in = p.in_channels;
    const int ch_chunk = 128 * wpo;
    const int g_local = ws * 32 + lane;
    const int x_start = t0 * S - p.pad;
    const float* xb = p.x + std::size_t(b) * in * p.in_length;
    const T* wrow = static_cast<const T*>(p.w.data) + std::size_t(o_ok ? o : 0) * in * KS;

    float acc[LT];
#pragma unroll
    for (int t = 0; t < LT; ++t) acc[t] = 0.f;

    float wn[4 * KS];
    auto load_weights = [&](int c0, float* dst) {
        const int c = c0 + 4 * g_local;
        if (o_ok && c < in) {
            const T* src = wrow + std::size_t(c) * KS;
#pragma unroll
            for (int q = 0; q < KS; ++q) load4<T>(src + 4 * q, dst + 4 * q);
        } else {
#pragma unroll
            for (int q = 0; q < 4 * KS; ++q) dst[q] = 0.f;
        }
    };
    load_weights(0, wn);
    detail::pdl_wait();  // the input (previous kernel's output) is complete from here on
    detail::pdl_allow_next();

    float* xsf = reinterpret_cast<float*>(xs);
    for (int c0 = 0; c0 < in; c0 += ch_chunk) {
        float wc[4 * KS];
#pragma unroll
        for (int q = 0; q < 4 * KS; ++q) wc[q] = wn[q];
        if (c0 + ch_chunk < in) load_weights(c0 + ch_chunk, wn);  // in flight during this chunk

        __syncthreads();  // previous chunk's readers are done with xs
        const int n_stage = ch_chunk * XW;
        for (int idx = threadIdx.x; idx < n_stage; idx += kThreads) {
            const int cl = idx / XW;
            const int j = idx - cl * XW;
            const int c = c0 + cl;
            const int pos = x_start + j;
            float v = 0.f;
            if (c < in && pos >= 0 && pos < p.in_length) v = __ldg(xb + std::size_t(c) * p.in_length + pos);
            xsf[((cl >> 2) * XWP + j) * 4 + (cl & 3)] = v;
        }
        __syncthreads();

#pragma unroll
        for (int j = 0; j < XW; ++j) {
            const float4 xv = xs[g_local * XWP + j];
            const float xa[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
#pragma unroll
                for (int t = 0; t < LT; ++t) {
                    const int k = j - t * S;
                    if (k >= 0 && k < KS) acc[t] += wc[cc * KS + k] * xa[cc];
                }
            }
        }
    }

    reduce_and_store<LT>(acc, red, wpo, ob_per_block, [&](int obi, int t, float sum) {
        const int o2 = blockIdx.x * ob_per_block + obi;
        if (o2 < p.out_channels && t0 + t < p.out_length) {
            if (p.bias) sum += p.bias[o2];
            p.y[(std::size_t(b) * p.out_channels + o2) * p.out_length + t0 + t] = sum;
        }
    });
}

template <class T>
__global__ void conv1d_generic_kernel(Conv1dParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
    const T* w = static_cast<const T*>(p.w.data);
    for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
         idx += std::int64_t(gridDim.x) * blockDim.x) {
        const int t = int(idx % p.out_length);
        const int o = int((idx / p.out_length) % p.out_channels);
        const int b = int(idx / (std::int64_t(p.out_length) * p.out_channels));
        const float* xb = p.x + std::size_t(b) * p.in_channels * p.in_length;
        float acc = 0.f;
        for (int i = 0; i < p.in_channels; ++i) {
            const std::size_t wbase = (std::size_t(o) * p.in_channels + i) * p.kernel;
            for (int k = 0; k < p.kernel; ++k) {
                const int pos = t * p.stride + k - p.pad;
                if (pos >= 0 && pos < p.in_length)
                    acc += detail::load_w<T>(w, wbase + k) * __ldg(xb + std::size_t(i) * p.in_length + pos);
            }
        }
        if (p.bias) acc += p.bias[o];
        p.y[idx] = acc;
    }
}

template <class T, int KS, int S, int LT>
void launch_conv1d_fast(const Conv1dParams& p, cudaStream_t st) {
    constexpr int XW = (LT - 1) * S + KS;
    constexpr int XWP = XW | 1;
    const int n_tiles = (p.out_length + LT - 1) / LT;
    auto smem_for = [](int ob) { return 128 * (kWarps / ob) / 4 * XWP * int(sizeof(float4)); };
    const long long target = 2LL * detail::sm_count();
    int ob = 8;
    while (ob > 1 && (long long)((p.out_channels + ob - 1) / ob) * n_tiles * p.batch < target &&
           smem_for(ob / 2) <= kMaxDynSmem)
        ob /= 2;
    const dim3 grid(unsigned((p.out_channels + ob - 1) / ob), unsigned(n_tiles), unsigned(p.batch));
    detail::launch_pdl(conv1d_fast_kernel<T, KS, S, LT>, grid, dim3(kThreads), smem_for(ob), st, p, ob);
}

template <class T, int KS, int S>
void launch_conv1d_lt(const Conv1dParams& p, cudaStream_t st) {
    if (p.out_length <= 2) launch_conv1d_fast<T, KS, S, 2>(p, st);
    else if (p.out_length <= 4) launch_conv1d_fast<T, KS, S, 4>(p, st);
    else if (p.out_length <= 8) launch_conv1d_fast<T, KS, S, 8>(p, st);
    else launch_conv1d_fast<T, KS, S, 16>(p, st);
}

template <class T>
bool try_conv1d_fast(const Conv1dParams& p, cudaStream_t st) {
    const std::size_t wal = sizeof(T) == 4 ? 16 : 8;
    if (p.in_channels % 4 != 0 || !detail::aligned(p.w.data, wal)) return false;
    if (p.kernel == 5 && p.stride == 1) launch_conv1d_lt<T, 5, 1>(p, st);
    else if (p.kernel == 3 && p.stride == 1) launch_conv1d_lt<T, 3, 1>(p, st);
    else if (p.kernel == 3 && p.stride == 2) launch_conv1d_lt<T, 3, 2>(p, st);
    else if (p.kernel == 1 && p.stride == 1) launch_conv1d_lt<T, 1, 1>(p, st);
    else return false;
    return true;
}

// ---- ConvTranspose1d ---------------------------------------------------------------------------------

template <class T, int LIN>
__global__ void __launch_bounds__(kThreads) convt_fast_kernel(ConvTranspose1dParams p, int ot) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    constexpr int LOUT = 2 * LIN;
    __shared__ float red[kWarps][8][LOUT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int isub = lane / ot, osub = lane % ot;
    const int ipw = 32 / ot;
    const int o = blockIdx.x * ot + osub;
    const bool o_ok = o < p.out_channels;
    const int b = blockIdx.y;
    const float* xb = p.x + std::size_t(b) * p.in_channels * LIN;
    const T* w = static_cast<const T*>(p.w.data);

    float acc[LOUT];
#pragma unroll
    for (int t = 0; t < LOUT; ++t) acc[t] = 0.f;

    if (o_ok) {
#pragma unroll 2
        for (int i = warp * ipw + isub; i < p.in_channels; i += kWarps * ipw) {
            float w4[4];
            load4<T>(w + (std::size_t(i) * p.out_channels + o) * 4, w4);
            float xv[LIN];
            const float* xr = xb + std::size_t(i) * LIN;
            if constexpr (LIN % 4 == 0) {
#pragma unroll
                for (int s = 0; s < LIN; s += 4) {
                    const float4 v = __ldg(reinterpret_cast<const float4*>(xr + s));
                    xv[s] = v.x; xv[s + 1] = v.y; xv[s + 2] = v.z; xv[s + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int s = 0; s < LIN; ++s) xv[s] = __ldg(xr + s);
            }
#pragma unroll
            for (int s = 0; s < LIN; ++s) {
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int t = 2 * s - 1 + k;
                    if (t >= 0 && t < LOUT) acc[t] += w4[k] * xv[s];
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < LOUT; ++t) {
        float v = acc[t];
        for (int off = 16; off >= ot; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (isub == 0) red[warp][osub][t] = v;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < ot * LOUT; idx += kThreads) {
        const int os = idx / LOUT, t = idx % LOUT;
        const int o2 = blockIdx.x * ot + os;
        if (o2 < p.out_channels) {
            float sum = 0.f;
#pragma unroll
            for (int w2 = 0; w2 < kWarps; ++w2) sum += red[w2][os][t];
            if (p.bias) sum += p.bias[o2];
            p.y[(std::size_t(b) * p.out_channels + o2) * LOUT + t] = sum;
        }
    }
}

template <class T>
__global__ void convt_generic_kernel(ConvTranspose1dParams p) {
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): inputs come from earlier kernels
    detail::pdl_allow_next();
    const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
    const T* w = static_cast<const T*>(p.w.data);
    for (std::int64_t idx = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; idx < total;
         idx += std::int64_t(gridDim.x) * blockDim.x) {
        const int t = int(idx % p.out_length);
        const int o = int((idx / p.out_length) % p.out_channels);
        const int b = int(idx / (std::int64_t(p.out_length) * p.out_channels));
        const float* xb = p.x + std::size_t(b) * p.in_channels * p.in_length;
        float acc = 0.f;
        for (int i = 0; i < p.in_channels; ++i) {
            for (int k = 0; k < p.kernel; ++k) {
                const int num = t + p.pad - k;
                if (num < 0 || num % p.stride != 0) continue;
                const int s = num / p.stride;
                if (s >= p.in_length) continue;
                acc += detail::load_w<T>(w, (std::size_t(i) * p.out_channels + o) * p.kernel + k) *
                       __ldg(xb + std::size_t(i) * p.in_length + s);
            }
        }
        if (p.bias) acc += p.bias[o];
        p.y[idx] = acc;
    }
}

template <class T, int LIN>
void launch_convt_fast(const ConvTranspose1dParams& p, cudaStream_t st) {
    const long long target = 2LL * detail::sm_count();
    int ot = sizeof(T) == 4 ? 2 : 4;  // smallest OT whose per-i stretch is a whole 32-byte sector
    while (ot < 8 && (long long)((p.out_channels + 2 * ot - 1) / (2 * ot)) * p.batch >= target) ot *= 2;
    const dim3 grid(unsigned((p.out_channels + ot - 1) / ot), unsigned(p.batch));
    detail::launch_pdl(convt_fast_kernel<T, LIN>, dim3(grid), dim3(kThreads), 0, st, p, ot);
}

template <class T>
bool try_convt_fast(const ConvTranspose1dParams& p, cudaStream_t st) {
    const std::size_t wal = sizeof(T) == 4 ? 16 : 8;
    if (p.kernel != 4 || p.stride != 2 || p.pad != 1 || p.out_length != 2 * p.in_length) return false;
    if (!detail::aligned(p.w.data, wal) || !detail::aligned(p.x, 16)) return false;
    switch (p.in_length) {
        case 1: launch_convt_fast<T, 1>(p, st); return true;
        case 2: launch_convt_fast<T, 2>(p, st); return true;
        case 4: launch_convt_fast<T, 4>(p, st); return true;
        case 8: launch_convt_fast<T, 8>(p, st); return true;
        case 16: launch_convt_fast<T, 16>(p, st); return true;
        default: return false;
    }
}

}  // namespace

void conv1d(const Conv1dParams& p, Stream s) {
    constexpr std::string_view comp = "cuda conv1d";
    detail::check_conv1d(p, comp);
    // Opt-in TF32/BF16 tensor-core paths: cuBLASLt (gemm_lt.cu) for F32 weights and for BF16 weights under BF16
    // math; F32 weights it declines (no scratch, say) go to conv_mma.cu (TF32 PushT batch 64 on an H200: 128.5 ms vs
    // 146 exact). 16-bit weights the GEMM declines stay on the exact kernels, which beat conv_mma there (same
    // process, batch 64: BF16 weights exact 87.7 ms vs conv_mma TF32 121.8; F16 exact 82.5 vs 121.4 / 112.5).
    if (conv1d_mma_selected(p)) {
        if (conv1d_gemm(p, s)) return;
        if (p.w.dtype == DType::F32) return conv1d_mma(p, s);
    }
    const cudaStream_t st = detail::resolve(s);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        if (try_conv1d_row<T>(p, st) || try_conv1d_fast<T>(p, st)) return;
        const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
        detail::launch_pdl(conv1d_generic_kernel<T>, dim3(detail::blocks_for(total, 128)), dim3(128), 0, st, p);
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv1d");
}

void conv_transpose1d(const ConvTranspose1dParams& p, Stream s) {
    constexpr std::string_view comp = "cuda conv_transpose1d";
    check(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_length > 0 && p.kernel > 0 &&
              p.stride > 0 && p.pad >= 0,
          comp, "sizes must be positive (pad non-negative)");
    check(p.x && p.w.data && p.y, comp, "null x, w or y pointer");
    const int base = (p.in_length - 1) * p.stride - 2 * p.pad + p.kernel;
    check(p.out_length >= base && p.out_length < base + p.stride && p.out_length > 0, comp,
          "out_length inconsistent with in_length/kernel/stride/pad" +
              expected_got(std::to_string(base) + ".." + std::to_string(base + p.stride - 1), p.out_length));
    const cudaStream_t st = detail::resolve(s);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        if (try_convt_fast<T>(p, st)) return;
        const std::int64_t total = std::int64_t(p.batch) * p.out_channels * p.out_length;
        detail::launch_pdl(convt_generic_kernel<T>, dim3(detail::blocks_for(total, 128)), dim3(128), 0, st, p);
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv_transpose1d");
}

}  // namespace flowedge::cuda
