// torch.nn.Linear on the GPU as a weight stream: each weight element is read once per row block with
// 16-byte coalesced loads; the few activation rows ride along in registers.
//
// Launch geometry: 256 threads = 8 warps per block, one warp per output feature o (grid = ceil(out/8),
// capped and grid-strided). A warp walks w[o, :] with 16-byte loads (4 F32 or 8 BF16/F16 elements per
// lane per step, 512 contiguous bytes per warp per step) and keeps kRows partial sums per lane; rows
// beyond kRows are processed in further passes over the same (by then L1/L2-resident) weight row.
// Numerics: float accumulation per lane in index order, then a butterfly warp reduction; bias and the
// activation are applied once, in float, with precise math.
//
// linear_batch runs up to kMaxLinearBatch independent linears in one launch: each item gets the block count the
// single op would launch for it, the blocks are concatenated (prefix sums in LinearBatchGeometry), and a block
// finds its item, then runs the very same per-output routine with its item-local block index, so each output is
// bit-identical to the single op. Before griddepcontrol.wait a block prefetches its slice of the (constant)
// weights into L2, overlapping the weight fetch with the predecessor's tail.
#include "common.cuh"
#include "flowedge/cuda/launchers.hpp"
#include "flowedge/op_checks.hpp"

namespace flowedge::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;
/// Most blocks one linear (or one linear_batch item) launches; more outputs are grid-strided.
constexpr std::int64_t kMaxBlocksPerItem = 1 << 20;
static_assert(kMaxBlocksPerItem * kMaxLinearBatch <= 0x7fffffff, "flowedge: linear_batch grid must fit in an int");

/// The outputs o = block*kWarps + warp (+ n_blocks*kWarps strides) of one linear; one warp per output feature.
template <class T, bool Vec>
__device__ __forceinline__ void linear_outputs(const LinearParams& p, int block, int n_blocks) {
    const int lane = threadIdx.x & 31;
    const int ld_x = p.ld_x ? p.ld_x : p.in;
    const int ld_y = p.ld_y ? p.ld_y : p.out;
    const T* w = static_cast<const T*>(p.w.data);
    for (int o = block * kWarps + (threadIdx.x >> 5); o < p.out; o += n_blocks * kWarps) {
        const T* wrow = w + std::size_t(o) * p.in;
        for (int r0 = 0; r0 < p.rows; r0 += kRows) {
            float acc[kRows];
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r] = 0.f;
            if constexpr (Vec) {
                constexpr int V = detail::Vec16<T>::n;
#pragma unroll 4
                for (int i = lane * V; i < p.in; i += 32 * V) {
                    float wv[V];
                    detail::load_w16<T>(wrow + i, wv);
#pragma unroll
                    for (int r = 0; r < kRows; ++r) {
                        if (r0 + r < p.rows) {
                            const float* xr = p.x + std::size_t(r0 + r) * ld_x + i;
#pragma unroll
                            for (int q = 0; q < V; q += 4) {
                                const float4 xv = __ldg(reinterpret_cast<const float4*>(xr + q));
                                acc[r] += wv[q] * xv.x;
                                acc[r] += wv[q + 1] * xv.y;
                                acc[r] += wv[q + 2] * xv.z;
                                acc[r] += wv[q + 3] * xv.w;
                            }
                        }
                    }
                }
            } else {
#pragma unroll 4
                for (int i = lane; i < p.in; i += 32) {
                    const float wv = detail::load_w<T>(wrow, i);
#pragma unroll
                    for (int r = 0; r < kRows; ++r)
                        if (r0 + r < p.rows) acc[r] += wv * __ldg(p.x + std::size_t(r0 + r) * ld_x + i);
                }
            }
            float mine = 0.f;
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const float s = detail::warp_sum(acc[r]);
                if (lane == r) mine = s;
            }
            const int r = r0 + lane;
            if (lane < kRows && r < p.rows) {
                float v = mine + (p.bias ? p.bias[o] : 0.f);
                v = detail::apply_act(p.act, v);
                float* yp = p.y + std::size_t(r) * ld_y + o;
                *yp = p.accumulate ? *yp + v : v;
            }
        }
    }
}

template <class T, bool Vec>
__global__ void __launch_bounds__(kWarps * 32) linear_kernel(LinearParams p) {
    detail::pdl_wait();  // launched with launch_pdl: x (and y when accumulating) come from earlier kernels
    detail::pdl_allow_next();
    linear_outputs<T, Vec>(p, blockIdx.x, gridDim.x);
}

/// Launch geometry of a linear_batch: item i owns blocks [block_start[i], block_start[i + 1]); kind[i] selects the
/// weight dtype (0 F32, 1 BF16, 2 F16) and bit 2 the vector path.
struct LinearBatchGeometry {
    int block_start[kMaxLinearBatch + 1];
    unsigned char kind[kMaxLinearBatch];
};
static_assert(sizeof(LinearBatchParams) + sizeof(LinearBatchGeometry) <= 4096 - 256,
              "flowedge: linear_batch kernel parameters must stay under the 4 KB limit");

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// __grid_constant__: the item is picked by a run-time index, which must read the parameter space in place rather
// than make each thread copy the ~1 KB struct to local memory.
__global__ void __launch_bounds__(kWarps * 32)
    linear_batch_kernel(const __grid_constant__ LinearBatchParams p, const __grid_constant__ LinearBatchGeometry g) {
    const int b = blockIdx.x;
    int item = 0;
    while (item + 1 < p.n_items && b >= g.block_start[item + 1]) ++item;
    const LinearParams& q = p.items[item];
    const int block = b - g.block_start[item], n_blocks = g.block_start[item + 1] - g.block_start[item];
    const unsigned kind = g.kind[item];
    // The weight rows this block reads first (outputs block*kWarps .. +kWarps), one 128-byte line per thread.
    {
        const std::size_t esz = (kind & 3u) == 0 ? 4 : 2;
        const std::size_t row_bytes = std::size_t(q.in) * esz;
        const int o0 = block * kWarps, o1 = min(q.out, o0 + kWarps);
        const char* base = static_cast<const char*>(q.w.data) + std::size_t(o0) * row_bytes;
        const std::size_t bytes = std::size_t(o1 - o0) * row_bytes;
        for (std::size_t off = std::size_t(threadIdx.x) * 128; off < bytes; off += std::size_t(blockDim.x) * 128) prefetch_l2(base + off);
    }
    detail::pdl_wait();  // x (and y when accumulating) come from earlier kernels
    detail::pdl_allow_next();
    switch (kind) {
        case 0: linear_outputs<float, false>(q, block, n_blocks); break;
        case 1: linear_outputs<bf16, false>(q, block, n_blocks); break;
        case 2: linear_outputs<f16, false>(q, block, n_blocks); break;
        case 4: linear_outputs<float, true>(q, block, n_blocks); break;
        case 5: linear_outputs<bf16, true>(q, block, n_blocks); break;
        case 6: linear_outputs<f16, true>(q, block, n_blocks); break;
        default: break;
    }
}

/// Whether the single op takes the 16-byte vector path for `p` (the batch must decide identically).
template <class T>
bool use_vec(const LinearParams& p) {
    constexpr int V = detail::Vec16<T>::n;
    const int ld_x = p.ld_x ? p.ld_x : p.in;
    return p.in % V == 0 && ld_x % 4 == 0 && detail::aligned(p.w.data, 16) && detail::aligned(p.x, 16);
}

}  // namespace

void linear(const LinearParams& p, Stream s) {
    if (!(p.rows >= 0 && p.in > 0 && p.out > 0)) [[unlikely]]
        fail("cuda linear", "sizes must be positive" +
             expected_got("rows >= 0, in > 0, out > 0", std::to_string(p.rows) + "x" + std::to_string(p.in) + "->" + std::to_string(p.out)));
    check(p.x && p.w.data && p.y, "cuda linear", "null x, w or y pointer");
    const int ld_x = p.ld_x ? p.ld_x : p.in;
    const int ld_y = p.ld_y ? p.ld_y : p.out;
    if (!(ld_x >= p.in && ld_y >= p.out)) [[unlikely]]
        fail("cuda linear", "row stride smaller than the row" +
             expected_got(">= " + std::to_string(p.in) + "/" + std::to_string(p.out), std::to_string(ld_x) + "/" + std::to_string(ld_y)));
    if (p.rows == 0) return;
    if (linear_gemm(p, s)) return;  // opt-in library GEMM for many rows (TF32/BF16 math or f32_gemm; gemm_lt.cu)
    const cudaStream_t st = detail::resolve(s);
    const unsigned grid = detail::blocks_for(p.out, kWarps, kMaxBlocksPerItem);
    detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
        if (use_vec<T>(p)) detail::launch_pdl(linear_kernel<T, true>, dim3(grid), dim3(kWarps * 32), 0, st, p);
        else detail::launch_pdl(linear_kernel<T, false>, dim3(grid), dim3(kWarps * 32), 0, st, p);
    });
    FLOWEDGE_CUDA_CHECK_LAUNCH("linear_kernel");
}

void linear_batch(const LinearBatchParams& p_in, Stream s) {
    check_linear_batch(p_in, "cuda linear_batch");
    // Items the library GEMM takes (non-F32 MathMode or f32_gemm, many rows) run there (gemm_lt.cu); the rest in one
    // launch.
    LinearBatchParams p;
    for (int i = 0; i < p_in.n_items; ++i) {
        const LinearParams& q = p_in.items[i];
        if (q.rows > 0 && linear_gemm(q, s)) continue;
        p.items[p.n_items++] = q;
    }
    LinearBatchGeometry g{};
    std::int64_t total = 0;
    for (int i = 0; i < p.n_items; ++i) {
        const LinearParams& q = p.items[i];
        g.block_start[i] = int(total);
        if (q.rows > 0) total += detail::blocks_for(q.out, kWarps, kMaxBlocksPerItem);
        detail::dispatch_dtype(q.w.dtype, [&]<class T>() {
            const unsigned dt = q.w.dtype == DType::F32 ? 0u : q.w.dtype == DType::BF16 ? 1u : 2u;
            g.kind[i] = static_cast<unsigned char>(dt | (use_vec<T>(q) ? 4u : 0u));
        });
    }
    g.block_start[p.n_items] = int(total);
    if (total == 0) return;  // every item has zero rows
    detail::launch_pdl(linear_batch_kernel, dim3(unsigned(total)), dim3(kWarps * 32), 0, detail::resolve(s), p, g);
    FLOWEDGE_CUDA_CHECK_LAUNCH("linear_batch_kernel");
}

}  // namespace flowedge::cuda
