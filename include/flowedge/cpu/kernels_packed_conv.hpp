// Conv1d on a load-time packed weight layout ("outputs in lanes"): the CPU path of the U-Net convolutions on
// machines with 16 vector registers (AVX2).
//
// Why: the row-major kernels of kernels_gemm.hpp take dot products along the reduction index, so each step loads
// one vector per weight row *and* one per activation column. With AVX2's 16 registers only 2 weight rows x 4
// columns fit, the im2col panel (4-16 columns x up to 10240 elements, 160 KiB) does not fit Zen 3's 32 KiB L1, and
// the kernel ends up bound by panel traffic from L2 and by too few weight streams in flight: measured on a Zen 3
// EPYC (1 thread) 15.5 G MAC/s at the PushT L4 convs (16 GB/s of weights of ~21 available), 18 G MAC/s at L8/L16,
// against 50.8 G MAC/s of FMA peak.
// Here the weights are stored as [out_block][j][kPackWidth] (j = i*K + k, the im2col index; kPackWidth outputs
// per block, zero-padded past `out`), so one block is a single contiguous stream and one step multiplies two
// weight vectors (kPackWidth outputs) by one broadcast activation per column: no horizontal reductions, and the
// panel is read as one scalar per column per step (it is laid out [j][column]).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "flowedge/cpu/simd.hpp"
#include "flowedge/op_params.hpp"

FLOWEDGE_SIMD_WARNINGS_OFF
namespace flowedge::cpu {

/// Output vectors per packed block and outputs per block (16 with AVX2, 32 with AVX-512).
inline constexpr int kPackVecs = 2;  // load_pair yields exactly two vectors
inline constexpr int kPackWidth = kPackVecs * kLanes;

/// Whether Conv1d weights are kept in the packed layout on this build. AVX2 only: the AVX-512 build keeps the
/// row-major kernels that were tuned and measured on Zen 4 (7 weight rows x 4 columns in 32 registers reached
/// 1.24-1.36x of the weight-streaming floor there), and this layout has only been measured on AVX2.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
inline constexpr bool kPackConvWeights = true;
#else
inline constexpr bool kPackConvWeights = false;
#endif

/// Elements of the packed copy of a [out, R] weight matrix (R = in_channels * kernel): whole blocks.
constexpr std::size_t packed_conv_elements(int out, std::size_t R) {
    return std::size_t((out + kPackWidth - 1) / kPackWidth) * std::size_t(kPackWidth) * R;
}

/// Position of block output l (0 <= l < kPackWidth) within one packed step. F32/F16: l itself. BF16: outputs l and
/// kLanes + l share one 32-bit slot (low and high half), so one full-width load widens to both output vectors with
/// a shift and a mask (load_pair) instead of two zero-extending shuffles plus two shifts.
template <class T>
constexpr int packed_slot(int l) {
    if constexpr (std::is_same_v<T, bf16>) return l < kLanes ? 2 * l : 2 * (l - kLanes) + 1;
    else return l;
}

/// dst[b][j][packed_slot(l)] = w[b*kPackWidth + l][j] (zero for outputs >= out). w: [out, R] row-major;
/// dst: packed_conv_elements(out, R) elements.
template <class T>
inline void pack_conv_weights(const T* w, int out, std::size_t R, T* dst) {
    const int blocks = (out + kPackWidth - 1) / kPackWidth;
    for (int b = 0; b < blocks; ++b) {
        // Sequential writes from kPackWidth read streams (one per output row). Writing one lane at a time with a
        // kPackWidth-element stride instead made packing ~15% of the samples of a 3-run PushT bench (about 1.2 s).
        const T* rows[kPackWidth];
        std::size_t slot[kPackWidth];
        for (int l = 0; l < kPackWidth; ++l) {
            const int o = b * kPackWidth + l;
            rows[l] = o < out ? w + std::size_t(o) * R : nullptr;
            slot[l] = std::size_t(packed_slot<T>(l));
        }
        T* db = dst + std::size_t(b) * kPackWidth * R;
        for (std::size_t j = 0; j < R; ++j, db += kPackWidth)
            for (int l = 0; l < kPackWidth; ++l) db[slot[l]] = rows[l] ? rows[l][j] : T{};
    }
}

#if defined(__AVX2__) || defined(__AVX512F__)
/// Columns one micro-kernel call takes: kPackVecs*NC accumulators + kPackVecs weight vectors + one broadcast
/// must fit the register file (AVX2: 2*6 + 2 + 1 = 15 of 16).
inline constexpr int kPackMaxCols = std::min(8, (kRegisters - kPackVecs - 1) / kPackVecs);

/// The two output vectors of one packed step (kPackWidth elements at p).
inline void load_pair(const float* p, VecF (&wv)[kPackVecs]) {
    wv[0] = vload(p);
    wv[1] = vload(p + kLanes);
}
inline void load_pair(const f16* p, VecF (&wv)[kPackVecs]) {
    wv[0] = vload(p);
    wv[1] = vload(p + kLanes);
}
/// BF16 (packed_slot order): each 32-bit slot holds output l (low half) and output kLanes + l (high half); a BF16
/// value is the high half of its float, so a shift gives the first vector and a mask the second.
inline void load_pair(const bf16* p, VecF (&wv)[kPackVecs]) {
#if defined(__AVX512F__)
    const __m512i raw = _mm512_loadu_si512(p);
    wv[0] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
    wv[1] = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(std::int32_t(0xFFFF0000u))));
#else
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    wv[0] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    wv[1] = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(std::int32_t(0xFFFF0000u))));
#endif
}

/// Packed steps a software prefetch runs ahead of the loads (one prefetcht0 per 64-byte line). The hardware
/// prefetcher alone kept one packed stream at ~14 GB/s on Zen 3 (the ~13 instructions per line limit how far the
/// out-of-order window runs ahead); 16-32 steps ahead measured 19-21 GB/s at the PushT L4 convs (1 thread, F32,
/// the machine's streaming-sum bandwidth 21 GB/s), 48 steps and more were slower.
#ifndef FLOWEDGE_PACK_PREFETCH_BYTES
#define FLOWEDGE_PACK_PREFETCH_BYTES 2048
#endif
inline constexpr int kPackPrefetchBytes = FLOWEDGE_PACK_PREFETCH_BYTES;

/// acc[v][c] += sum_{j in [0, n)} wp[j*kPackWidth + v*kLanes + lane] * x[j*ldx + c], sequentially in j.
/// wp: packed block from its step j0; x: panel rows from j0 ([j][column], ldx floats per row).
template <int NC, class WT>
inline void packed_steps(const WT* wp, const float* x, std::size_t ldx, int n, VecF (&acc)[kPackVecs][NC]) {
    constexpr int kStepsPerLine = int(64 / (kPackWidth * sizeof(WT))) > 0 ? int(64 / (kPackWidth * sizeof(WT))) : 1;
    for (int j = 0; j < n; ++j) {
        if (j % kStepsPerLine == 0)
            __builtin_prefetch(reinterpret_cast<const char*>(wp + std::size_t(j) * kPackWidth) + kPackPrefetchBytes, 0, 3);
        VecF wv[kPackVecs];
        load_pair(wp + std::size_t(j) * kPackWidth, wv);
        // Up to 4 columns, keep the weight vectors in registers: GCC otherwise folds the load into every FMA
        // (12 loads instead of 6 per step at 4 columns; L4/L8 measured 5-15% faster). At 5-6 columns there are
        // no spare registers (the asm then forces spills: L16 10% slower), so GCC's choice stays.
        if constexpr (NC <= 4)
            for (int v = 0; v < kPackVecs; ++v) asm("" : "+x"(wv[v]));
        const float* xj = x + std::size_t(j) * ldx;
        for (int c = 0; c < NC; ++c) {
            const VecF b = vset1(xj[c]);
            for (int v = 0; v < kPackVecs; ++v) acc[v][c] = vfma(wv[v], b, acc[v][c]);
        }
    }
}

/// tot[c*kPackWidth + l] += block x panel columns [c0, c0 + NC) over n steps (fresh accumulators, then added).
template <int NC, class WT>
inline void packed_chunk(const WT* wp, const float* x, std::size_t ldx, int n, int c0, float* tot) {
    VecF acc[kPackVecs][NC];
    for (int v = 0; v < kPackVecs; ++v)
        for (int c = 0; c < NC; ++c) acc[v][c] = vzero();
    packed_steps<NC>(wp, x + c0, ldx, n, acc);
    for (int c = 0; c < NC; ++c)
        for (int v = 0; v < kPackVecs; ++v) {
            float* t = tot + std::size_t(c0 + c) * kPackWidth + std::size_t(v) * kLanes;
            vstore(t, vadd(vload(t), acc[v][c]));
        }
}

/// Runtime-NC front end of packed_chunk (1 <= nc <= kPackMaxCols).
template <class WT>
inline void packed_chunk_n(int nc, const WT* wp, const float* x, std::size_t ldx, int n, int c0, float* tot) {
    switch (nc) {
        case 1: packed_chunk<1>(wp, x, ldx, n, c0, tot); return;
        case 2: packed_chunk<2>(wp, x, ldx, n, c0, tot); return;
        case 3: packed_chunk<3>(wp, x, ldx, n, c0, tot); return;
        case 4: packed_chunk<4>(wp, x, ldx, n, c0, tot); return;
        case 5: if constexpr (kPackMaxCols >= 5) { packed_chunk<5>(wp, x, ldx, n, c0, tot); return; } break;
        case 6: if constexpr (kPackMaxCols >= 6) { packed_chunk<6>(wp, x, ldx, n, c0, tot); return; } break;
        case 7: if constexpr (kPackMaxCols >= 7) { packed_chunk<7>(wp, x, ldx, n, c0, tot); return; } break;
        case 8: if constexpr (kPackMaxCols >= 8) { packed_chunk<8>(wp, x, ldx, n, c0, tot); return; } break;
        default: break;
    }
    __builtin_unreachable();
}
#endif

}  // namespace flowedge::cpu
FLOWEDGE_SIMD_WARNINGS_ON
