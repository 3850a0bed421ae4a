// Opt-in tensor-core torch.nn.Conv1d for batched calls (MathMode::TF32 / BF16): an implicit GEMM on WMMA, so the
// weights are read once per block column for all batch rows instead of once per batch row (the exact row and tiled
// kernels of conv1d_row.cu / conv1d_tiled.cu are weight streams per batch element).
//
// GEMM view: D[o, n] = bias[o] + sum_kk A[o, kk] * B[kk, n] with M = out_channels, N = batch*out_length,
// Kg = in_channels*kernel, n = b*out_length + t, kk = i*kernel + k; A = the weights [out, in, kernel] as stored
// (row-major M x Kg), B[kk, n] = X[b, i, t*stride + k - pad] (zero outside [0, in_length)), gathered im2col-style.
//
// Block: 256 threads = 8 warps = 2 K-groups of 4 warps, each a 2 x 2 warp grid over the block tile BM x BN (64x64,
// 32x64 or 32x32); K step kBK = 32, whose MMA steps are split between the two K-groups (more warps per SM to hide
// latency without smaller tiles; their partial sums are added in a fixed order in the epilogue).
// Pipeline: kStages = 4 (or 6 with FLOWEDGE_CUDA_MMA_STAGES=6) raw stages in shared memory filled with cp.async
// (A: 16-byte copies of the stored dtype when Kg and the weight pointer allow it, else plain loads; B: 4-byte
// zero-filling copies of the gathered floats), so kStages-1 K steps of weights and activations are in flight while
// one is multiplied. Each K step the block converts the raw stage into the compute tiles, 4 elements per access
// (TF32: __float_to_tf32, round to nearest; BF16: round to nearest-even), padded so every WMMA pointer is 32-byte
// aligned; each warp then runs (BM/32) x (BN/32) 16x16 fragments (tf32 m16n16k8 / bf16 m16n16k16, float accumulators).
// Epilogue: accumulators -> shared memory (K-group 0, then + K-group 1) -> bias added -> y[b, o, t] (coalesced
// along t). No atomics: every output is a fixed-order sum, bitwise reproducible run to run.
//
// Cluster variant (sm_90; tiles 4/5 of conv1d_mma, automatic only with FLOWEDGE_CUDA_MMA_CLUSTER=1): 128 x 128
// tiles (8 warps as 2 x 4, 64 x 32 each, no K-groups) with the K steps split over a thread-block cluster of S = 2
// or 4 blocks along grid z; the partial tiles are summed through distributed shared memory in rank order (each
// block reduces 1/S of the rows), so a PushT 2048 x 256 conv at batch 64 gets 32 tiles x 4 = 128 blocks while each
// byte staged in shared memory feeds twice the MMAs of a 64 x 64 tile. No workspace: the reduction stays on chip.
//
// Tile rule (host): [FLOWEDGE_CUDA_MMA_CLUSTER=1 on sm_90: 128x128 with S = 2, else 4, if tiles * S >= 0.75 * SMs
// and each block gets >= 4 K steps]; else the first of 64x64, 32x64, 32x32 (BN = 64 only when N > 32) whose grid
// has >= 0.75 * SMs blocks; else 32x32. PushT at batch 64 on 132 SMs: 64x64 for 2048x256 (128 blocks), 512x1024 and
// 1024x512; 32x64 for 1024x256 and 512x512 (128 blocks).
// Selection rule (conv1d_mma_selected): math != F32, sm_80+, N = batch*out_length >= 32 (FLOWEDGE_CUDA_MMA_MIN_N
// overrides), so batch-1 calls (N <= 16) keep the exact bandwidth-tuned kernels (docs/kernels/cuda_conv.md).
//
// Error (derivation for the tests): each operand is rounded once with unit roundoff u (TF32 2^-11, BF16 2^-8;
// 16-bit stored weights are exact in TF32, BF16 weights exact in BF16), so each product is off by at most
// (2u + u^2)|w||x|; the float accumulation is a few fixed-order chains (K-groups, cluster ranks) of together
// ceil(Kg/kK) MMA steps (kK = 8 / 16) plus the in-MMA sums and the final adds, bounded (loosely) by
// (ceil(Kg/kK) + kK + 1) * 2^-23 * sum|w||x| even with truncating adds. Per output:
//   |y - y_exact| <= ((2u + u^2) + (ceil(Kg/kK) + kK + 1) * 2^-23) * sum_{i,k} |w||x|   (+ bias rounding 2^-24|y|).
// TF32 at Kg = 20480: 9.8e-4 + 3.1e-4 = 1.3e-3; BF16: 7.8e-3 + 1.5e-4 = 8.0e-3.
// Every kernel is launched with programmatic dependent launch (detail::launch_pdl, or the same attribute next to
// the cluster dimension) and calls pdl_wait() before reading activations.
#include <cuda_bf16.h>
#include <mma.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "cluster_splitk.cuh"
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"

namespace flowedge::cuda {
namespace {

using detail::cp_async16;
using detail::cp_async4;
using detail::cp_async_commit;
using detail::cp_async_wait;

constexpr int kMmaThreads = 256;  // 8 warps: KG K-groups x (2 x 8/(2 KG)) warps over the block tile
constexpr int kBK = 32;

constexpr int round_up(int v, int a) { return (v + a - 1) / a * a; }

template <MathMode M>
struct MmaMath;
template <>
struct MmaMath<MathMode::TF32> {
    using Elem = float;
    static constexpr int kK = 8;
    static constexpr int kPad = 4;  // ldm multiple of 4 floats; rows 16 apart stay 32-byte aligned
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::row_major>;
    using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::row_major>;
    using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float>;
    __device__ static Elem cvt(float v) { return nvcuda::wmma::__float_to_tf32(v); }
    __device__ static void store4(Elem* d, const float (&v)[4]) {
        *reinterpret_cast<float4*>(d) = make_float4(cvt(v[0]), cvt(v[1]), cvt(v[2]), cvt(v[3]));
    }
#endif
};
template <>
struct MmaMath<MathMode::BF16> {
    using Elem = __nv_bfloat16;
    static constexpr int kK = 16;
    static constexpr int kPad = 8;  // ldm multiple of 8 bf16
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major>;
    using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major>;
    using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;
    __device__ static Elem cvt(float v) { return __float2bfloat16_rn(v); }
    __device__ static void store4(Elem* d, const float (&v)[4]) {
        __nv_bfloat162* d2 = reinterpret_cast<__nv_bfloat162*>(d);
        d2[0] = __floats2bfloat162_rn(v[0], v[1]);
        d2[1] = __floats2bfloat162_rn(v[2], v[3]);
    }
#endif
};

/// Shared-memory layout of one block (bytes, every region 128-byte aligned).
template <class T, MathMode M, int BM, int BN, int kStages>
struct MmaLayout {
    using Elem = typename MmaMath<M>::Elem;
    static constexpr int kLdA = kBK + MmaMath<M>::kPad;  // compute tile A: BM x kLdA (Elem)
    static constexpr int kLdB = BN + MmaMath<M>::kPad;   // compute tile B: kBK x kLdB (Elem)
    static constexpr int kLdC = BN + 4;                  // epilogue tile: BM x kLdC (float)
    static constexpr int kRawA = round_up(BM * kBK * int(sizeof(T)), 128);  // one raw A stage (stored dtype)
    static constexpr int kRawB = round_up(kBK * BN * 4, 128);               // one raw B stage (float)
    static constexpr int kOffRawB = kStages * kRawA;
    static constexpr int kOffA = kOffRawB + kStages * kRawB;
    static constexpr int kOffB = kOffA + round_up(BM * kLdA * int(sizeof(Elem)), 128);
    static constexpr int kBytes = kOffB + round_up(kBK * kLdB * int(sizeof(Elem)), 128);
    static_assert(BM * kLdC * 4 <= kOffA, "epilogue tile must fit in the raw stages it reuses");
};

__device__ __forceinline__ float widen_raw(bf16 v) { return detail::widen(v); }
__device__ __forceinline__ float widen_raw(f16 v) { return detail::widen(v); }

/// 4 consecutive raw elements (16-byte aligned for float, 8-byte for 16-bit types) widened to float (exact).
template <class T>
__device__ __forceinline__ void load4_raw(const T* p, float (&v)[4]) {
    if constexpr (sizeof(T) == 4) {
        const float4 f = *reinterpret_cast<const float4*>(p);
        v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
    } else {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        v[0] = widen_raw(T{static_cast<std::uint16_t>(u.x & 0xffffu)});
        v[1] = widen_raw(T{static_cast<std::uint16_t>(u.x >> 16)});
        v[2] = widen_raw(T{static_cast<std::uint16_t>(u.y & 0xffffu)});
        v[3] = widen_raw(T{static_cast<std::uint16_t>(u.y >> 16)});
    }
}


/// Arguments besides Conv1dParams, computed once on the host.
struct MmaArgs {
    int m = 0, n = 0, kg = 0;
    std::uint32_t kdiv = 0;  // ceil(2^32 / kernel) for kernel > 1: i = umulhi(kk, kdiv) (exact: (Kg + kBK) * kernel < 2^32)
    bool vec_a = false;      // Kg % (16 / sizeof(T)) == 0 and 16-byte aligned weights: A stages by 16-byte cp.async
};

/// KG: K-groups (2: warps 0-3 and 4-7 split the MMA steps of each K step, each group a 2 x 2 warp grid; 1: all 8
/// warps as a 2 x 4 grid). kCluster (sm_90 only): the block is one of the S blocks of a thread-block cluster along
/// grid z that split the K steps of the same output tile; their partial tiles are summed through distributed shared
/// memory in rank order (deterministic), each block reducing and writing a slice of the tile's rows.
template <class T, MathMode M, int BM, int BN, int kStages, int KG, bool kCluster>
__global__ void __launch_bounds__(kMmaThreads) conv1d_mma_kernel(Conv1dParams p, MmaArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    namespace wmma = nvcuda::wmma;
    using L = MmaLayout<T, M, BM, BN, kStages>;
    using Mm = MmaMath<M>;
    using Elem = typename Mm::Elem;
    constexpr int kWarpsPerGroup = 8 / KG;
    constexpr int kWGN = kWarpsPerGroup / 2;             // warp grid 2 x kWGN per K-group
    constexpr int kWTM = BM / 2, kWTN = BN / kWGN;       // warp tile
    constexpr int kFM = kWTM / 16, kFN = kWTN / 16;      // 16x16 fragments per warp
    static_assert((KG == 1 || KG == 2) && kFM >= 1 && kFN >= 1, "unsupported warp layout");
    constexpr int kAChunkElems = 16 / int(sizeof(T));
    constexpr int kAChunks = BM * kBK / kAChunkElems;  // 16-byte chunks per raw A stage
    constexpr int kSteps = kBK / Mm::kK;                // MMA steps per K step, split over the K-groups
    static_assert(kSteps % KG == 0, "MMA steps must split evenly over the K-groups");
    constexpr int kBRowStep = kMmaThreads / BN;  // B: each thread owns one column, rows tid/BN + j*kBRowStep
    constexpr int kBPerThread = kBK / kBRowStep;
    static_assert(kMmaThreads % BN == 0 && kBK % kBRowStep == 0, "B tile must split evenly over the block");

    extern __shared__ __align__(128) unsigned char smem[];
    const int tid = int(threadIdx.x);
    const int warp = tid >> 5;
    const int kgrp = warp / kWarpsPerGroup;  // K-group
    const int wm = (warp % kWarpsPerGroup) / kWGN, wn = warp % kWGN;
    const int n0 = int(blockIdx.x) * BN, m0 = int(blockIdx.y) * BM;
    int kt0 = 0, n_k = (a.kg + kBK - 1) / kBK;  // this block's K steps: [kt0, kt0 + n_k)
    if constexpr (kCluster) {
#if __CUDA_ARCH__ >= 900
        int kt1 = 0;
        detail::cluster_k_range(n_k, kt0, kt1);
        n_k = kt1 - kt0;
#else
        __trap();  // clusters need sm_90; the host selects this kernel only there
#endif
    }
    const T* w = static_cast<const T*>(p.w.data);

    // A stage `slot` <- weights [m0, m0+BM) x [k0, k0+kBK). Weights are constants: issued before the PDL wait.
    auto load_a = [&](int slot, int k0) {
        T* dst = reinterpret_cast<T*>(smem + slot * L::kRawA);
        if (a.vec_a) {
#pragma unroll
            for (int q = tid; q < kAChunks; q += kMmaThreads) {
                const int r = q / (kBK / kAChunkElems), c = (q % (kBK / kAChunkElems)) * kAChunkElems;
                const int o = m0 + r, kk = k0 + c;
                const bool ok = o < a.m && kk < a.kg;  // Kg % kAChunkElems == 0: a chunk is all in or all out
                const T* src = ok ? w + std::size_t(o) * a.kg + kk : w;
                cp_async16(dst + r * kBK + c, src, ok ? 16 : 0);
            }
        } else {
            for (int e = tid; e < BM * kBK; e += kMmaThreads) {
                const int r = e / kBK, c = e % kBK;
                const int o = m0 + r, kk = k0 + c;
                T v{};
                if (o < a.m && kk < a.kg) v = w[std::size_t(o) * a.kg + kk];
                dst[e] = v;
            }
        }
    };
    // B stage `slot` <- im2col columns [n0, n0+BN) x rows [k0, k0+kBK); zero fill for padding and tails.
    const int col = tid % BN, row0 = tid / BN;
    const int n = n0 + col;
    const bool n_ok = n < a.n;
    const int bb = n_ok ? n / p.out_length : 0;
    const int pos0 = (n_ok ? n - bb * p.out_length : 0) * p.stride - p.pad;
    const float* xb = p.x + std::size_t(bb) * p.in_channels * p.in_length;
    auto load_b = [&](int slot, int k0) {
        float* dst = reinterpret_cast<float*>(smem + L::kOffRawB + slot * L::kRawB);
#pragma unroll
        for (int j = 0; j < kBPerThread; ++j) {
            const int r = row0 + j * kBRowStep;
            const int kk = k0 + r;
            const int i = p.kernel == 1 ? kk : int(__umulhi(std::uint32_t(kk), a.kdiv));
            const int pos = pos0 + (kk - i * p.kernel);
            const bool ok = n_ok && kk < a.kg && pos >= 0 && pos < p.in_length;
            const float* src = ok ? xb + std::size_t(i) * p.in_length + pos : p.x;
            cp_async4(dst + r * BN + col, src, ok ? 4 : 0);
        }
    };

    // Prologue: stages 0..kStages-2. Group s holds B(s) (group 0 also every A of the prologue).
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s)
        if (s < n_k) load_a(s, (kt0 + s) * kBK);
    detail::pdl_wait();  // launched with launch_pdl (common.cuh): x comes from earlier kernels
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_k) load_b(s, (kt0 + s) * kBK);
        cp_async_commit();
    }

    typename Mm::FragC acc[kFM][kFN];
#pragma unroll
    for (int fm = 0; fm < kFM; ++fm)
#pragma unroll
        for (int fn = 0; fn < kFN; ++fn) wmma::fill_fragment(acc[fm][fn], 0.f);

    Elem* As = reinterpret_cast<Elem*>(smem + L::kOffA);
    Elem* Bs = reinterpret_cast<Elem*>(smem + L::kOffB);
    for (int kt = 0; kt < n_k; ++kt) {
        const int slot = kt % kStages;
        cp_async_wait<kStages - 2>();  // this thread's copies of stage kt have landed
        __syncthreads();               // everyone's have; everyone is done with the compute tiles and slot kt-1
        {
            const int nxt = kt + kStages - 1;  // refills slot (kt-1) % kStages, converted last iteration
            if (nxt < n_k) {
                load_a(nxt % kStages, (kt0 + nxt) * kBK);
                load_b(nxt % kStages, (kt0 + nxt) * kBK);
            }
            cp_async_commit();  // possibly empty: keeps one group per iteration for the wait count
        }
        // Raw stage -> compute tiles, rounding to the math mode, 4 consecutive elements per access (row starts and
        // padded strides keep every quad 16-byte (float) / 8-byte (bf16) aligned).
        const T* ra = reinterpret_cast<const T*>(smem + slot * L::kRawA);
        const float* rb = reinterpret_cast<const float*>(smem + L::kOffRawB + slot * L::kRawB);
#pragma unroll
        for (int q = tid; q < BM * kBK / 4; q += kMmaThreads) {
            float v[4];
            load4_raw<T>(ra + 4 * q, v);
            Mm::store4(As + (q / (kBK / 4)) * L::kLdA + (q % (kBK / 4)) * 4, v);
        }
#pragma unroll
        for (int q = tid; q < kBK * BN / 4; q += kMmaThreads) {
            float v[4];
            load4_raw<float>(rb + 4 * q, v);
            Mm::store4(Bs + (q / (BN / 4)) * L::kLdB + (q % (BN / 4)) * 4, v);
        }
        __syncthreads();
#pragma unroll
        for (int ss = 0; ss < kSteps / KG; ++ss) {
            const int s = kgrp * (kSteps / KG) + ss;
            typename Mm::FragA fa[kFM];
            typename Mm::FragB fb[kFN];
#pragma unroll
            for (int fm = 0; fm < kFM; ++fm)
                wmma::load_matrix_sync(fa[fm], As + (wm * kWTM + fm * 16) * L::kLdA + s * Mm::kK, L::kLdA);
#pragma unroll
            for (int fn = 0; fn < kFN; ++fn)
                wmma::load_matrix_sync(fb[fn], Bs + (s * Mm::kK) * L::kLdB + wn * kWTN + fn * 16, L::kLdB);
#pragma unroll
            for (int fm = 0; fm < kFM; ++fm)
#pragma unroll
                for (int fn = 0; fn < kFN; ++fn) wmma::mma_sync(acc[fm][fn], fa[fm], fb[fn], acc[fm][fn]);
        }
    }

    // Epilogue through shared memory (reuses the raw stages: all copies done, all warps past their last MMA).
    // The two K-groups' partial sums meet in a fixed order: C = group 0 + group 1.
    cp_async_wait<0>();
    __syncthreads();
    float* Cs = reinterpret_cast<float*>(smem);
    if (KG == 1 || kgrp == 0) {
#pragma unroll
        for (int fm = 0; fm < kFM; ++fm)
#pragma unroll
            for (int fn = 0; fn < kFN; ++fn)
                wmma::store_matrix_sync(Cs + (wm * kWTM + fm * 16) * L::kLdC + wn * kWTN + fn * 16, acc[fm][fn], L::kLdC,
                                        wmma::mem_row_major);
    }
    __syncthreads();
    if (KG == 2 && kgrp == 1) {
#pragma unroll
        for (int fm = 0; fm < kFM; ++fm)
#pragma unroll
            for (int fn = 0; fn < kFN; ++fn) {
                float* c = Cs + (wm * kWTM + fm * 16) * L::kLdC + wn * kWTN + fn * 16;
                typename Mm::FragC g0;
                wmma::load_matrix_sync(g0, c, L::kLdC, wmma::mem_row_major);
#pragma unroll
                for (int e = 0; e < g0.num_elements; ++e) g0.x[e] += acc[fm][fn].x[e];
                wmma::store_matrix_sync(c, g0, L::kLdC, wmma::mem_row_major);
            }
    }
    __syncthreads();
    if constexpr (kCluster) {
#if __CUDA_ARCH__ >= 900
        // Every block of the cluster holds its partial tile in Cs; each rank sums and writes 1/S of the tile's rows.
        detail::cluster_reduce_tile<kMmaThreads>(
            Cs, BM, BN, L::kLdC, [&](int r, int c) { return m0 + r < a.m && n0 + c < a.n; },
            [&](int r, int c, float v) {
                const int o = m0 + r, nn = n0 + c;
                const int b = nn / p.out_length, t = nn - b * p.out_length;
                if (p.bias) v += p.bias[o];
                p.y[(std::size_t(b) * a.m + o) * p.out_length + t] = v;
            });
#endif
    } else {
        for (int e = tid; e < BM * BN; e += kMmaThreads) {
            const int r = e / BN, c = e % BN;
            const int o = m0 + r, nn = n0 + c;
            if (o >= a.m || nn >= a.n) continue;
            const int b = nn / p.out_length, t = nn - b * p.out_length;
            float v = Cs[r * L::kLdC + c];
            if (p.bias) v += p.bias[o];
            p.y[(std::size_t(b) * a.m + o) * p.out_length + t] = v;
        }
    }
#else
    __trap();  // host code never launches this below sm_80 (conv1d_mma checks the device)
#endif
}


// Default smallest N = batch * out_length routed to the library GEMM (cuBLASLt; the WMMA fallback when it declines):
// batch 1 (N <= 16) keeps the exact bandwidth kernels, while from N = 32 one GEMM streams the weights once for every
// column where the exact kernels stream them once per batch row (measurements: docs/performance/cuda.md).
constexpr long long kDefaultMinN = 32;

long long mma_min_n() {
    static const long long v = [] {
        const char* e = std::getenv("FLOWEDGE_CUDA_MMA_MIN_N");
        if (!e || !*e) return kDefaultMinN;
        char* end = nullptr;
        const long long r = std::strtoll(e, &end, 10);
        return (end && *end == '\0' && r >= 1) ? r : kDefaultMinN;
    }();
    return v;
}

/// Opts `kernel` in to `bytes` of dynamic shared memory once per device (host-side, capture-safe).
template <class K>
void set_smem_once(K kernel, int bytes, std::atomic<std::uint64_t>& done_mask) {
    int dev = 0;
    FLOWEDGE_CUDA_CHECK(cudaGetDevice(&dev));
    const std::uint64_t bit = std::uint64_t(1) << (dev & 63);
    if (!(done_mask.load(std::memory_order_acquire) & bit)) {
        FLOWEDGE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        done_mask.fetch_or(bit, std::memory_order_release);
    }
}

template <class T, MathMode M, int BM, int BN, int ST>
void launch_mma_st(const Conv1dParams& p, const MmaArgs& a, cudaStream_t st) {
    using L = MmaLayout<T, M, BM, BN, ST>;
    auto kernel = conv1d_mma_kernel<T, M, BM, BN, ST, 2, false>;
    static std::atomic<std::uint64_t> done_mask{0};
    set_smem_once(kernel, L::kBytes, done_mask);
    const dim3 grid(unsigned((a.n + BN - 1) / BN), unsigned((a.m + BM - 1) / BM));
    detail::launch_pdl(kernel, grid, dim3(kMmaThreads), std::size_t(L::kBytes), st, p, a);
}

/// 128 x 128 tiles, K split over a cluster of `split` blocks (sm_90). Launched like detail::launch_pdl (same PDL
/// attribute when enabled, the kernel calls pdl_wait() before reading x) plus the cluster dimension.
template <class T, MathMode M>
void launch_mma_cluster(const Conv1dParams& p, const MmaArgs& a, cudaStream_t st, int split) {
    using L = MmaLayout<T, M, 128, 128, 4>;
    auto kernel = conv1d_mma_kernel<T, M, 128, 128, 4, 1, true>;
    static std::atomic<std::uint64_t> done_mask{0};
    set_smem_once(kernel, L::kBytes, done_mask);
    const dim3 grid(unsigned((a.n + 127) / 128), unsigned((a.m + 127) / 128), unsigned(split));
    detail::launch_pdl_cluster(kernel, grid, dim3(kMmaThreads), std::size_t(L::kBytes), st, unsigned(split), p, a);
}

/// Pipeline depth: 4 stages (default; 83 KB of shared memory for TF32 64x64, two blocks fit an SM) or 6
/// (FLOWEDGE_CUDA_MMA_STAGES=6, read once: 5 K steps in flight, ~115 KB, one block per SM; for A/B timing).
/// The 128 x 128 cluster tiles always use 4 (163 KB).
int mma_stages() {
    static const int v = [] {
        const char* e = std::getenv("FLOWEDGE_CUDA_MMA_STAGES");
        return (e && std::string_view(e) == "6") ? 6 : 4;
    }();
    return v;
}

/// FLOWEDGE_CUDA_MMA_CLUSTER=1 (read once) lets the automatic tile rule pick the 128 x 128 cluster split-K tiles on
/// sm_90 (off by default until timed on an H200).
bool mma_cluster_auto() {
    static const bool v = [] {
        const char* e = std::getenv("FLOWEDGE_CUDA_MMA_CLUSTER");
        return e && std::string_view(e) == "1";
    }();
    return v;
}

template <class T, MathMode M, int BM, int BN>
void launch_mma(const Conv1dParams& p, const MmaArgs& a, cudaStream_t st) {
    if (mma_stages() == 6) launch_mma_st<T, M, BM, BN, 6>(p, a, st);
    else launch_mma_st<T, M, BM, BN, 4>(p, a, st);
}

template <class T, MathMode M>
void launch_mma_tiles(const Conv1dParams& p, const MmaArgs& a, cudaStream_t st, int tile) {
    if (tile == 1) return launch_mma<T, M, 64, 64>(p, a, st);
    if (tile == 2) return launch_mma<T, M, 32, 64>(p, a, st);
    if (tile == 3) return launch_mma<T, M, 32, 32>(p, a, st);
    if (tile == 4) return launch_mma_cluster<T, M>(p, a, st, 2);
    if (tile == 5) return launch_mma_cluster<T, M>(p, a, st, 4);
    const long long want = (3LL * detail::sm_count()) / 4;
    auto blocks = [&](int bm, int bn) { return (long long)((a.m + bm - 1) / bm) * ((a.n + bn - 1) / bn); };
    if (mma_cluster_auto() && detail::compute_major() >= 9) {
        const int n_k = (a.kg + kBK - 1) / kBK;
        for (int split : {2, 4})
            if (blocks(128, 128) * split >= want && n_k >= 4 * split) return launch_mma_cluster<T, M>(p, a, st, split);
    }
    if (a.n > 32 && blocks(64, 64) >= want) return launch_mma<T, M, 64, 64>(p, a, st);
    if (a.n > 32 && blocks(32, 64) >= want) return launch_mma<T, M, 32, 64>(p, a, st);
    launch_mma<T, M, 32, 32>(p, a, st);
}

}  // namespace

bool conv1d_mma_selected(const Conv1dParams& p) {
    if (p.math == MathMode::F32) return false;
    if (std::int64_t(p.batch) * p.out_length < mma_min_n()) return false;
    if ((std::int64_t(p.in_channels) * p.kernel + kBK) * p.kernel >= (std::int64_t(1) << 32)) return false;
    return detail::compute_major() >= 8;
}

void conv1d_mma(const Conv1dParams& p, Stream s, int tile) {
    constexpr std::string_view comp = "cuda conv1d_mma";
    detail::check_conv1d(p, comp);
    if (!(p.math == MathMode::TF32 || p.math == MathMode::BF16)) [[unlikely]]
        fail(comp, "math mode must be TF32 or BF16" + expected_got("1 or 2", int(p.math)));
    const std::int64_t n = std::int64_t(p.batch) * p.out_length;
    const std::int64_t kg = std::int64_t(p.in_channels) * p.kernel;
    if (!(n < (std::int64_t(1) << 31) / 2 && (kg + kBK) * p.kernel < (std::int64_t(1) << 32))) [[unlikely]]
        fail(comp,
             "problem too large for 32-bit tile indexing" + expected_got("batch*out_length < 2^30, (Kg+32)*kernel < 2^32",
             std::to_string(n) + ", " + std::to_string((kg + kBK) * p.kernel)));
    if (!(std::int64_t(p.out_channels + 63) / 64 <= 65535)) [[unlikely]]
        fail(comp, "too many output channels" + expected_got("<= 4194240", p.out_channels));
    if (!(tile >= 0 && tile <= 5)) [[unlikely]]
        fail(comp, "unknown tile choice" + expected_got("0..5", tile));
    if (!(tile < 4 || detail::compute_major() >= 9)) [[unlikely]]
        fail(ErrorKind::Unsupported, comp, "cluster tiles (4, 5) need an sm_90 device" + expected_got(">= 9", detail::compute_major()));
    if (!(detail::compute_major() >= 8)) [[unlikely]]
        fail(ErrorKind::Unsupported, comp, "tensor-core math needs an sm_80+ device" + expected_got(">= 8", detail::compute_major()));
    MmaArgs a;
    a.m = p.out_channels;
    a.n = int(n);
    a.kg = int(kg);
    a.kdiv = p.kernel > 1 ? std::uint32_t(((std::uint64_t(1) << 32) + std::uint64_t(p.kernel) - 1) / std::uint64_t(p.kernel)) : 0u;
    const cudaStream_t st = detail::resolve(s);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        a.vec_a = kg % (16 / std::int64_t(sizeof(T))) == 0 && detail::aligned(p.w.data, 16);
        if (p.math == MathMode::TF32) launch_mma_tiles<T, MathMode::TF32>(p, a, st, tile);
        else launch_mma_tiles<T, MathMode::BF16>(p, a, st, tile);
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("conv1d_mma");
}

}  // namespace flowedge::cuda
