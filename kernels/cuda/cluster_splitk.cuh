// Split-K over a thread-block cluster (sm_90), shared by conv2d.cu and conv_mma.cu: the S blocks of a cluster along
// grid z take contiguous K ranges of one output tile, and their partial tiles are added through distributed shared
// memory in rank order, so every output is a fixed-order sum (no atomics, no workspace). Design: docs/kernels/cuda.md.
#pragma once
#include <cooperative_groups.h>

#include "common.cuh"

namespace flowedge::cuda::detail {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/// This block's share [begin, end) of `n` K steps: contiguous ranges in rank order over the cluster's blocks.
__device__ __forceinline__ void cluster_k_range(int n, int& begin, int& end) {
    const cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int rank = int(cl.block_rank()), n_rank = int(cl.num_blocks());
    begin = int((long long)n * rank / n_rank);
    end = int((long long)n * (rank + 1) / n_rank);
}

/// Adds the cluster's partial tiles. Every block holds its partial tile in shared memory at `part` (rows x cols,
/// row stride ld); block `rank` takes rows [rank * per, (rank + 1) * per) with per = ceil(rows / S), and for each
/// element (r, c) of them with keep(r, c) calls finish(r, c, sum), the sum over ranks 0..S-1 in that order.
/// The first cluster barrier makes every partial tile visible; the second keeps every block's shared memory alive
/// until all remote reads are done. kThreads: the block size (the element loop's stride).
template <int kThreads, class Keep, class Finish>
__device__ __forceinline__ void cluster_reduce_tile(float* part, int rows, int cols, int ld, Keep&& keep,
                                                    Finish&& finish) {
    const cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    const int rank = int(cl.block_rank()), n_rank = int(cl.num_blocks());
    cl.sync();
    const int per = (rows + n_rank - 1) / n_rank;
    const int r0 = rank * per, r1 = min(rows, r0 + per);
    for (int e = int(threadIdx.x); e < (r1 - r0) * cols; e += kThreads) {
        const int r = r0 + e / cols, c = e % cols;
        if (!keep(r, c)) continue;
        float v = cl.map_shared_rank(part, 0)[r * ld + c];
        for (int q = 1; q < n_rank; ++q) v += cl.map_shared_rank(part, q)[r * ld + c];
        finish(r, c, v);
    }
    cl.sync();
}
#endif

/// Launches `kernel` as clusters of 1 x 1 x cluster_z blocks, with programmatic stream serialisation where
/// launch_pdl() would use it (the kernel calls pdl_wait() before reading activations).
template <class... Params, class... Args>
void launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t st,
                        unsigned cluster_z, Args&&... args) {
    cudaLaunchAttribute attr[2];
    unsigned n_attr = 0;
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = 1;
    attr[n_attr].val.clusterDim.y = 1;
    attr[n_attr].val.clusterDim.z = cluster_z;
    ++n_attr;
    if (pdl_enabled()) {
        attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
        ++n_attr;
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = n_attr;
    FLOWEDGE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace flowedge::cuda::detail
