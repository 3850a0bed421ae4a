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
//
// Many rows under TF32/BF16 math (or f32_gemm) that the library GEMM declines (16-bit weights, Mish/SiLU/Softplus,
// ReLU with accumulate) run as block tiles instead (linear_tiled_outputs): the per-warp kernel reads every x row again
// for each output, so its x traffic grows with rows x outputs (docs/kernels/cuda.md#linear).
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

/// Tiled many-row path: a tile is kTileOut outputs x kTileRows rows; kTileK columns of its weight rows and x rows
/// are staged in shared memory per step, and thread t owns outputs t % 16 + 16 j (j < 4) of rows 2 (t / 16) + i
/// (i < 2). Float products of the stored weights and x (no operand rounding) summed in column order, so only the
/// summation order differs from linear_outputs: within the F32 tolerance, and the same bits for the same tile
/// whatever the grid.
constexpr int kTileOut = 64, kTileRows = 32, kTileK = 32;
constexpr int kTiledMinRows = 32;
static_assert(kWarps * 32 == 256 && kTileOut * kTileK == 8 * 256 && kTileRows * kTileK == 4 * 256,
              "flowedge: linear_tiled_outputs' load and thread mapping assume 256 threads");

/// Whether linear() and linear_batch() run p as tiles (when the library GEMM has declined it).
bool use_tiled(const LinearParams& p) { return p.rows >= kTiledMinRows && (p.math != MathMode::F32 || p.f32_gemm); }

/// Tiles along the outputs; tile t covers outputs [(t % out_tiles) * kTileOut, + kTileOut) and rows
/// [(t / out_tiles) * kTileRows, + kTileRows).
__host__ __device__ __forceinline__ int out_tiles(const LinearParams& p) { return (p.out + kTileOut - 1) / kTileOut; }

__host__ __device__ __forceinline__ std::int64_t tiles_of(const LinearParams& p) {
    return std::int64_t(out_tiles(p)) * ((p.rows + kTileRows - 1) / kTileRows);
}

/// The staged tile slices; +1 column: the column reads of 16 outputs fall in 16 banks.
struct TiledSmem {
    float ws[kTileOut][kTileK + 1];
    float xs[kTileRows][kTileK + 1];
};

template <class T>
__device__ __forceinline__ void linear_tiled_outputs(const LinearParams& p, int block, int n_blocks, TiledSmem& sm) {
    auto& ws = sm.ws;
    auto& xs = sm.xs;
    const int tid = threadIdx.x, to = tid % 16, tr = tid / 16;
    const int ld_x = p.ld_x ? p.ld_x : p.in;
    const int ld_y = p.ld_y ? p.ld_y : p.out;
    const T* w = static_cast<const T*>(p.w.data);
    const int tiles_o = out_tiles(p);
    const int tiles = int(tiles_of(p));
    for (int tile = block; tile < tiles; tile += n_blocks) {
        const int o0 = (tile % tiles_o) * kTileOut, r0 = (tile / tiles_o) * kTileRows;
        float acc[2][4] = {};
        for (int k0 = 0; k0 < p.in; k0 += kTileK) {
            {  // weights: row tid / 4, columns (tid % 4) * 8 .. + 8
                const int ol = tid / 4, kl = (tid % 4) * 8, o = o0 + ol;
                const T* wrow = w + std::size_t(o < p.out ? o : 0) * p.in;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const int k = k0 + kl + j;
                    ws[ol][kl + j] = (o < p.out && k < p.in) ? detail::load_w<T>(wrow, k) : 0.f;
                }
            }
            {  // x: row tid / 8, columns (tid % 8) * 4 .. + 4
                const int rl = tid / 8, kl = (tid % 8) * 4, r = r0 + rl;
                const float* xr = p.x + std::size_t(r < p.rows ? r : 0) * ld_x;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int k = k0 + kl + j;
                    xs[rl][kl + j] = (r < p.rows && k < p.in) ? __ldg(xr + k) : 0.f;
                }
            }
            __syncthreads();
#pragma unroll 8
            for (int k = 0; k < kTileK; ++k) {
                const float x0 = xs[2 * tr][k], x1 = xs[2 * tr + 1][k];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float wv = ws[to + 16 * j][k];
                    acc[0][j] = fmaf(wv, x0, acc[0][j]);
                    acc[1][j] = fmaf(wv, x1, acc[1][j]);
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int r = r0 + 2 * tr + i;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int o = o0 + to + 16 * j;
                if (r < p.rows && o < p.out) {
                    float v = acc[i][j] + (p.bias ? p.bias[o] : 0.f);
                    v = detail::apply_act(p.act, v);
                    float* yp = p.y + std::size_t(r) * ld_y + o;
                    *yp = p.accumulate ? *yp + v : v;
                }
            }
        }
    }
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) linear_tiled_kernel(LinearParams p) {
    detail::pdl_wait();  // launched with launch_pdl: x (and y when accumulating) come from earlier kernels
    detail::pdl_allow_next();
    __shared__ TiledSmem sm;
    linear_tiled_outputs<T>(p, blockIdx.x, gridDim.x, sm);
}

template <class T, bool Vec>
__global__ void __launch_bounds__(kWarps * 32) linear_kernel(LinearParams p) {
    detail::pdl_wait();  // launched with launch_pdl: x (and y when accumulating) come from earlier kernels
    detail::pdl_allow_next();
    linear_outputs<T, Vec>(p, blockIdx.x, gridDim.x);
}

/// Launch geometry of a linear_batch: item i owns blocks [block_start[i], block_start[i + 1]); kind[i] selects the
/// weight dtype (0 F32, 1 BF16, 2 F16), bit 2 the vector path, bit 3 the tiled path.
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
    __shared__ TiledSmem sm;  // the tiled items' staging
    // The weight rows this block reads first (outputs block*kWarps .. +kWarps), one 128-byte line per thread.
    {
        const std::size_t esz = (kind & 3u) == 0 ? 4 : 2;
        const std::size_t row_bytes = std::size_t(q.in) * esz;
        const int o0 = (kind & 8u) ? (block % out_tiles(q)) * kTileOut : block * kWarps;
        const int o1 = min(q.out, o0 + ((kind & 8u) ? kTileOut : kWarps));
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
        case 8: linear_tiled_outputs<float>(q, block, n_blocks, sm); break;
        case 9: linear_tiled_outputs<bf16>(q, block, n_blocks, sm); break;
        case 10: linear_tiled_outputs<f16>(q, block, n_blocks, sm); break;
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
    if (use_tiled(p)) {
        const unsigned grid = unsigned(std::min(tiles_of(p), kMaxBlocksPerItem));
        detail::dispatch_dtype(p.w.dtype, [&]<class T>() {
            detail::launch_pdl(linear_tiled_kernel<T>, dim3(grid), dim3(kWarps * 32), 0, st, p);
        });
        FLOWEDGE_CUDA_CHECK_LAUNCH("linear_tiled_kernel");
        return;
    }
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
        const bool tiled = use_tiled(q);
        if (q.rows > 0) total += tiled ? std::min(tiles_of(q), kMaxBlocksPerItem) : detail::blocks_for(q.out, kWarps, kMaxBlocksPerItem);
        detail::dispatch_dtype(q.w.dtype, [&]<class T>() {
            const unsigned dt = q.w.dtype == DType::F32 ? 0u : q.w.dtype == DType::BF16 ? 1u : 2u;
            g.kind[i] = static_cast<unsigned char>(dt | (tiled ? 8u : use_vec<T>(q) ? 4u : 0u));
        });
    }
    g.block_start[p.n_items] = int(total);
    if (total == 0) return;  // every item has zero rows
    detail::launch_pdl(linear_batch_kernel, dim3(unsigned(total)), dim3(kWarps * 32), 0, detail::resolve(s), p, g);
    FLOWEDGE_CUDA_CHECK_LAUNCH("linear_batch_kernel");
}

}  // namespace flowedge::cuda
