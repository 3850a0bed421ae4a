// torch.nn.Conv1d and ConvTranspose1d as GEMV-like weight streams for short sequences (the Diffusion
// Policy U-Net: 512..4096 channels, lengths 2..16), plus exact generic fallbacks for any other shape.
//
// conv1d fast path (kernel/stride in {5/1, 3/1, 3/2, 1/1}, in_channels % 4 == 0, aligned weights):
//   256 threads = 8 warps per block; a block computes OB output channels (OB in {8,4,2,1}, smaller when
//   that is needed to put >= 2 blocks on every SM) for one batch element and one tile of LT output
//   positions (LT in {2,4,8,16}); the 8/OB warps of one output split in_channels. Input channels are
//   walked in chunks of 128*(8/OB): each lane owns 4 consecutive channels of the chunk and loads their
//   4*K weights with K 16-byte (F32) or 8-byte (BF16/F16) cp.async copies into a per-thread slot of a shared
//   ring kNStages chunks deep (the warp reads one contiguous stretch of the weight row); the matching input window (LT-1)*stride+K wide is staged
//   in shared memory as float4 (4 channels) per position, padded to an odd row length (conflict-free),
//   and each lane does 4*K*LT FMAs from registers. Lane partials are reduced by a warp butterfly and the
//   warps of one output in a fixed order through shared memory: deterministic, float accumulation.
// conv_transpose1d fast path (kernel 4, stride 2, pad 1, out_length = 2*in_length <= 32):
//   weights [in, out, 4] are streamed along i: in a warp, lanes form (32/OT) x OT (i, o) pairs so each
//   load instruction reads whole 32-byte sectors (OT consecutive o of 4 taps per i); 8 warps split i;
//   the input row of length L_in (<= 16) is read as float4; reduction over lanes then warps in a fixed
//   order. grid = ceil(out/OT) x batch, OT in {2,4,8} chosen to fill the SMs.
// Generic paths: one thread per output element, float accumulation in (i, k) order.
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxDynSmem = 46 * 1024;  // cap on the staged input window (the weight ring comes on top)

/// 4 consecutive weights widened to float: one 16-byte load (F32) or one 8-byte load (BF16/F16).
template <class T>
__device__ __forceinline__ void load4(const T* p, float* out) {
    float v[4];
    if constexpr (sizeof(T) == 4) detail::load_w16<T>(p, v);
    else detail::load_w8<T>(p, v);
    out[0] = v[0]; out[1] = v[1]; out[2] = v[2]; out[3] = v[3];
}

/// Weight stages in flight per block: each lane's 4*K weights of the next kNStages-1 channel chunks are being copied
/// into shared memory (cp.async) while the current chunk is computed. One chunk of register prefetch (the first
/// version) kept ~40 KB per SM in flight and reached 1.5-2.0 TB/s on the big PushT convs; an H200 needs ~3x that.
constexpr int kNStages = 4;

/// Per-thread async copy global -> shared of BYTES (16 or 8) bytes; zero-fills when `valid` is false.
template <int BYTES>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, bool valid) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int src_size = valid ? BYTES : 0;
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_size));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/// 4 consecutive weights (one lane's 4 channels at one tap group) read back from shared memory, widened.
template <class T>
__device__ __forceinline__ void smem_load4(const T* p, float* out) {
    if constexpr (sizeof(T) == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    } else {
        const uint2 raw = *reinterpret_cast<const uint2*>(p);
        out[0] = detail::widen(T{static_cast<std::uint16_t>(raw.x & 0xffffu)});
        out[1] = detail::widen(T{static_cast<std::uint16_t>(raw.x >> 16)});
        out[2] = detail::widen(T{static_cast<std::uint16_t>(raw.y & 0xffffu)});
        out[3] = detail::widen(T{static_cast<std::uint16_t>(raw.y >> 16)});
    }
}

/// Bytes of shared memory a conv1d_fast_kernel block needs: the staged input window plus the weight ring.
template <class T, int KS, int XWP>
constexpr int conv1d_fast_smem(int ob_per_block) {
    return 128 * (kWarps / ob_per_block) / 4 * XWP * int(sizeof(float4)) + kNStages * kThreads * 4 * KS * int(sizeof(T));
}

template <class T, int KS, int S, int LT>
__global__ void __launch_bounds__(kThreads) conv1d_fast_kernel(Conv1dParams p, int ob_per_block) {
    constexpr int XW = (LT - 1) * S + KS;
    constexpr int XWP = XW | 1;
    constexpr int kLaneW = 4 * KS;                   // weights one lane owns per chunk (4 channels x K taps)
    constexpr int kPiece = sizeof(T) == 4 ? 16 : 8;  // cp.async size: 4 weights (F32: KS x 16 B, 16-bit: KS x 8 B)
    extern __shared__ float4 xs[];  // [32 * wpo groups][XWP] float4 = 4 channels at one input position, then the ring
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
    const int n_chunks = (in + ch_chunk - 1) / ch_chunk;
    const int g_local = ws * 32 + lane;
    const int x_start = t0 * S - p.pad;
    const float* xb = p.x + std::size_t(b) * in * p.in_length;
    const T* wrow = static_cast<const T*>(p.w.data) + std::size_t(o_ok ? o : 0) * in * KS;
    // This thread's slot of the weight ring: stage s at ring + s * kThreads * kLaneW (read back only by this thread,
    // so the ring needs no barrier; stride kLaneW elements is bank-conflict-free for K in {1, 3, 5}).
    T* ring = reinterpret_cast<T*>(xs + 32 * wpo * XWP) + std::size_t(threadIdx.x) * kLaneW;

    auto issue_chunk = [&](int chunk) {  // always commits a group (possibly empty) so wait counts stay fixed
        if (chunk < n_chunks) {
            const int c = chunk * ch_chunk + 4 * g_local;
            const bool ok = o_ok && c < in;
            const T* src = wrow + std::size_t(ok ? c : 0) * KS;
            T* dst = ring + std::size_t(chunk % kNStages) * kThreads * kLaneW;
#pragma unroll
            for (int q = 0; q < kLaneW * int(sizeof(T)) / kPiece; ++q)
                cp_async<kPiece>(reinterpret_cast<char*>(dst) + q * kPiece, reinterpret_cast<const char*>(src) + q * kPiece, ok);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kNStages - 1; ++s) issue_chunk(s);  // weights are constant: stream them before the wait
    detail::pdl_wait();       // the input (previous kernel's output) is complete from here on
    detail::pdl_allow_next();

    float acc[LT];
#pragma unroll
    for (int t = 0; t < LT; ++t) acc[t] = 0.f;

    float* xsf = reinterpret_cast<float*>(xs);
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
        const int c0 = chunk * ch_chunk;
        issue_chunk(chunk + kNStages - 1);  // overwrites the stage this thread consumed last iteration

        __syncthreads();  // previous chunk's readers are done with the input window
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
        cp_async_wait<kNStages - 1>();  // this thread's copies of `chunk` have landed
        __syncthreads();

        float wc[kLaneW];
        const T* wsrc = ring + std::size_t(chunk % kNStages) * kThreads * kLaneW;
#pragma unroll
        for (int q = 0; q < KS; ++q) smem_load4<T>(wsrc + 4 * q, wc + 4 * q);
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
    cp_async_wait<0>();  // no copy may outlive the block

#pragma unroll
    for (int t = 0; t < LT; ++t) {
        const float s = detail::warp_sum(acc[t]);
        if (lane == 0) red[warp][t] = s;
    }
    __syncthreads();
    if (threadIdx.x < ob_per_block * LT) {
        const int obi = threadIdx.x / LT;
        const int t = threadIdx.x % LT;
        const int o2 = blockIdx.x * ob_per_block + obi;
        if (o2 < p.out_channels && t0 + t < p.out_length) {
            float sum = 0.f;
            for (int w2 = 0; w2 < wpo; ++w2) sum += red[obi * wpo + w2][t];
            if (p.bias) sum += p.bias[o2];
            p.y[(std::size_t(b) * p.out_channels + o2) * p.out_length + t0 + t] = sum;
        }
    }
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
    constexpr int kMaxSmem = conv1d_fast_smem<T, KS, XWP>(1);
    // Once per instantiation (process-wide; not a stream operation, so legal inside a graph capture): allow more
    // than the 48 KiB default of dynamic shared memory (the weight ring).
    static const cudaError_t smem_status = cudaFuncSetAttribute(
        conv1d_fast_kernel<T, KS, S, LT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);
    if (smem_status != cudaSuccess)
        detail::throw_cuda_error(smem_status, "cudaFuncSetAttribute(conv1d_fast_kernel)", __FILE__, __LINE__);
    const int n_tiles = (p.out_length + LT - 1) / LT;
    const long long target = 2LL * detail::sm_count();
    int ob = 8;
    auto x_smem = [](int ob) { return 128 * (kWarps / ob) / 4 * XWP * int(sizeof(float4)); };
    while (ob > 1 && (long long)((p.out_channels + ob - 1) / ob) * n_tiles * p.batch < target &&
           x_smem(ob / 2) <= kMaxDynSmem)
        ob /= 2;
    const dim3 grid(unsigned((p.out_channels + ob - 1) / ob), unsigned(n_tiles), unsigned(p.batch));
    detail::launch_pdl(conv1d_fast_kernel<T, KS, S, LT>, grid, dim3(kThreads), conv1d_fast_smem<T, KS, XWP>(ob), st, p, ob);
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
    check(p.batch > 0 && p.in_channels > 0 && p.out_channels > 0 && p.in_length > 0 && p.kernel > 0 &&
              p.stride > 0 && p.pad >= 0,
          comp, "sizes must be positive (pad non-negative)");
    check(p.x && p.w.data && p.y, comp, "null x, w or y pointer");
    const int want = (p.in_length + 2 * p.pad - p.kernel) / p.stride + 1;
    check(p.in_length + 2 * p.pad >= p.kernel && p.out_length == want, comp,
          "out_length inconsistent with in_length/kernel/stride/pad" + expected_got(want, p.out_length));
    const cudaStream_t st = detail::resolve(s);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        if (try_conv1d_fast<T>(p, st)) return;
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
