// torch.nn.Conv1d row path for the Diffusion Policy U-Net's batch-1 shapes ('same' padding, whole input rows of
// 1..16 positions, 512..4096 channels): each block streams a few weight rows against its batch element's input row,
// because at these lengths the convolution is a weight stream and the goal is bytes in flight per SM, not FLOPs.
// Lane layout, prefetch depth, input staging and numerics: docs/kernels/cuda_conv.md.
#include <cstddef>

#include "common.cuh"
#include "conv1d_paths.cuh"
#include "conv_common.cuh"

namespace flowedge::cuda {
namespace {

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

// Template parameters of the row path: T weight type, KS kernel, S stride, LIN input length, CPL channels per lane
// per step (4, or 8 for 16-bit weights: one 16-byte load per tap), OW outputs per warp (1, or 4 for k = 1 so that
// one read of the input row serves 4 weight rows).

/// Weight steps kept in flight per lane. Base: ~160 bytes of raw weights (2 steps of F32 at K = 5, 4 steps of
/// 16-bit with 4 channels per lane), clamped to 1..4. Deep (OW = 1 only): ~240 bytes, at most 3 steps, never fewer
/// than the base; it differs from the base for K = 5 with 16-byte units (F32, and 16-bit with 8 channels per lane:
/// 3 steps instead of 2; <= 128 registers on sm_90, i.e. 2 blocks of 256 threads per SM, which is what the PushT
/// grids of <= 256 blocks use anyway; launch_conv1d_row keeps the base for 16-bit at L = 16 with 8 channels per
/// lane, where deep would need 144). A lane waits on its oldest step while the others stay in flight, so deep keeps
/// 2 instead of 1 step (160 instead of 80 bytes per lane) in flight during each wait.
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
        if (blocks > slots || 32LL * cpl * (detail::kConvWarps / next) > in_channels) break;
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
__global__ void __launch_bounds__(detail::kConvThreads) conv1d_row_kernel(Conv1dParams p, int n_groups) {
    static_assert(CPL * sizeof(T) == 16 || CPL * sizeof(T) == 8, "a lane's channels of one tap are 8 or 16 bytes");
    extern __shared__ float4 row_xs[];  // XS: the input of batch element b as [L_in][row_xs_stride] floats
    constexpr int P = KS / 2;
    constexpr int LOUT = (LIN + 2 * P - KS) / S + 1;
    constexpr int NV = OW * LOUT;
    using U = detail::RawUnit<T, CPL>;
    __shared__ float red[detail::kConvWarps][NV];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wpo = detail::kConvWarps / n_groups;
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
        for (int idx = threadIdx.x; idx < in * LIN / 4; idx += detail::kConvThreads) {
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

    detail::reduce_and_store<NV>(acc, red, wpo, n_groups, [&](int g2, int v, float sum) {
        const int o = (blockIdx.x * n_groups + g2) * OW + v / LOUT;
        const int t = v % LOUT;
        if (o < p.out_channels) {
            if (p.bias) sum += p.bias[o];
            p.y[(std::size_t(b) * p.out_channels + o) * LOUT + t] = sum;
        }
    });
}

/// A/B switches of the row path, read once per process (any value but "0" turns the feature off):
/// FLOWEDGE_CUDA_CONV_NO_W16: 16-bit weights use 4 channels per lane (8-byte loads);
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
        FLOWEDGE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, detail::kConvThreads, 0));
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
        detail::launch_pdl(conv1d_row_kernel<T, KS, S, LIN, CPL, OW, D, XS>, grid, dim3(detail::kConvThreads),
                           std::size_t(bytes), st, p, g);
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

}  // namespace

namespace detail {

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

template bool try_conv1d_row<float>(const Conv1dParams&, cudaStream_t);
template bool try_conv1d_row<bf16>(const Conv1dParams&, cudaStream_t);
template bool try_conv1d_row<f16>(const Conv1dParams&, cudaStream_t);

}  // namespace detail
}  // namespace flowedge::cuda
