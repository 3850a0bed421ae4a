// The cost of one layer-to-layer exchange in the fused Mamba-flow kernels (kernels/cuda/flow_solve.cu), alone: one
// cluster of 8 blocks; per step every warp's lanes 0-7 store one float into the eight blocks' shared memory, then each
// block waits until the step's values from all blocks have arrived. Variants:
//   sync     cooperative_groups cluster.sync() after remote stores (what flow_solve.cu does today)
//   mbarrier st.async remote stores that count their bytes on the receiver's mbarrier (complete_tx): a block waits
//            only for the bytes addressed to it, nobody waits for the other blocks to arrive
//   local    __syncthreads() only, no remote traffic (the loop's own cost)
// for 256 / 512 / 1024 threads per block. Prints ns per step (p50 / min / max over launches) and writes JSON.
//
// Usage: cuda_cluster_exchange_probe [--steps N] [--launches N] [--json FILE]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cg = cooperative_groups;

namespace {

constexpr int kCluster = 8;
constexpr int kMaxWarps = 32;
constexpr unsigned long long kWaitLimitNs = 200000000ull;  // a lost byte count ends the probe with an error, not a hang

enum Variant { kSync = 0, kMbarrier = 1, kLocal = 2 };
const char* const kVariantName[] = {"sync", "mbarrier", "local"};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ unsigned map_rank(unsigned addr, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ void store_async(unsigned remote, float v, unsigned remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];"
                 :
                 : "r"(remote), "r"(__float_as_uint(v)), "r"(remote_bar)
                 : "memory");
}
__device__ __forceinline__ void arm(unsigned bar, unsigned bytes) {
    asm volatile(
        "{ .reg .b64 st;\n"
        "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 st, [%0], %1; }"
        :
        : "r"(bar), "r"(bytes)
        : "memory");
}
__device__ __forceinline__ bool try_wait(unsigned bar, unsigned parity) {
    unsigned done;
    asm volatile(
        "{ .reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}
#endif

template <int Threads>
__global__ void __launch_bounds__(Threads, 1) exchange_kernel(int variant, int steps, unsigned long long* ns, int* failed,
                                                              float* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int Warps = Threads / 32;
    __shared__ __align__(16) float buf[3][kCluster][kMaxWarps];
    __shared__ __align__(8) unsigned long long bars[2];
    const cg::cluster_group cl = cg::this_cluster();
    const unsigned rank = cl.block_rank();
    const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (int b = 0; b < 2; ++b) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[b])));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cl.sync();
    const unsigned long long t0 = global_ns();
    float acc = 0.f;
    const unsigned bytes = unsigned(kCluster * Warps * sizeof(float));
    for (int i = 0; i < steps; ++i) {
        const float v = float(i + warp) + acc * 1e-30f;  // depends on the previous step's data
        if (variant == kSync) {
            if (lane < kCluster) cl.map_shared_rank(&buf[i % 3][0][0], lane)[rank * kMaxWarps + warp] = v;
            cl.sync();
        } else if (variant == kMbarrier) {
            const unsigned b = unsigned(i & 1), parity = unsigned((i >> 1) & 1);
            const unsigned bar = smem_addr(&bars[b]);
            if (tid == 0) arm(bar, bytes);
            if (lane < kCluster)
                store_async(map_rank(smem_addr(&buf[b][rank][warp]), unsigned(lane)), v, map_rank(bar, unsigned(lane)));
            const unsigned long long w0 = global_ns();
            bool lost = false;
            while (!try_wait(bar, parity))
                if (global_ns() - w0 > kWaitLimitNs) {
                    atomicExch(failed, 1);
                    lost = true;
                    break;
                }
            if (lost) break;
            __syncthreads();  // as the fused kernels: no warp runs two exchanges ahead of a lagging one
        } else {
            buf[i % 3][rank][warp] = v;
            __syncthreads();
        }
        acc += buf[variant == kMbarrier ? (i & 1) : i % 3][(rank + 1) % kCluster][(warp + 1) % Warps];
    }
    const unsigned long long t1 = global_ns();
    if (rank == 0 && tid == 0) *ns = t1 - t0;
    if (acc == 12345.f) *sink = acc;  // keeps the loads
    cl.sync();  // no block leaves while another may still store into its shared memory
#else
    if (threadIdx.x == 0) *failed = 2;  // clusters need sm_90
#endif
}

template <int Threads>
bool run(int variant, int steps, int launches, unsigned long long* d_ns, int* d_failed, float* d_sink, std::vector<double>& per_step) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(kCluster, 1, 1);
    cfg.blockDim = dim3(Threads, 1, 1);
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kCluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    for (int l = 0; l < launches + 1; ++l) {  // the first launch warms up
        if (cudaLaunchKernelEx(&cfg, exchange_kernel<Threads>, variant, steps, d_ns, d_failed, d_sink) != cudaSuccess) return false;
        unsigned long long ns = 0;
        int failed = 0;
        if (cudaMemcpy(&ns, d_ns, sizeof ns, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
        if (cudaMemcpy(&failed, d_failed, sizeof failed, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
        if (failed) {
            std::fprintf(stderr, "%s at %d threads: %s\n", kVariantName[variant], Threads,
                         failed == 2 ? "clusters need sm_90" : "a step's bytes never arrived (200 ms)");
            return false;
        }
        if (l > 0) per_step.push_back(double(ns) / steps);
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 2000, launches = 20;
    std::string json;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if ((a == "--steps" || a == "--launches" || a == "--json") && i + 1 < argc) {
            const std::string v = argv[++i];
            if (a == "--json") {
                json = v;
                continue;
            }
            const int n = std::atoi(v.c_str());
            if (n < 1) {
                std::fprintf(stderr, "%s: expected a positive integer, got '%s'\n", a.c_str(), v.c_str());
                return 2;
            }
            (a == "--steps" ? steps : launches) = n;
        } else {
            std::fprintf(stderr, "unknown or incomplete option '%s' (expected --steps N, --launches N, --json FILE)\n", a.c_str());
            return 2;
        }
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major < 9) {
        std::printf("cuda_cluster_exchange_probe: needs an sm_90 GPU (thread-block clusters); skipped\n");
        return 0;
    }
    unsigned long long* d_ns = nullptr;
    int* d_failed = nullptr;
    float* d_sink = nullptr;
    if (cudaMalloc(&d_ns, sizeof *d_ns) || cudaMalloc(&d_failed, sizeof *d_failed) || cudaMalloc(&d_sink, sizeof *d_sink) ||
        cudaMemset(d_failed, 0, sizeof *d_failed)) {
        std::fprintf(stderr, "cuda allocation failed\n");
        return 1;
    }
    std::printf("cluster exchange probe on %s (sm_%d%d): one cluster of %d blocks, %d steps per launch, %d launches\n",
                prop.name, prop.major, prop.minor, kCluster, steps, launches);
    std::string rows;
    int rc = 0;
    for (int variant : {kSync, kMbarrier, kLocal})
        for (int threads : {256, 512, 1024}) {
            std::vector<double> t;
            const bool ok = threads == 256    ? run<256>(variant, steps, launches, d_ns, d_failed, d_sink, t)
                            : threads == 512 ? run<512>(variant, steps, launches, d_ns, d_failed, d_sink, t)
                                             : run<1024>(variant, steps, launches, d_ns, d_failed, d_sink, t);
            if (!ok) {
                std::printf("  %-9s %4d threads: FAILED (%s)\n", kVariantName[variant], threads, cudaGetErrorString(cudaGetLastError()));
                rc = 1;
                cudaMemset(d_failed, 0, sizeof *d_failed);
                continue;
            }
            std::sort(t.begin(), t.end());
            const double p50 = t[t.size() / 2];
            std::printf("  %-9s %4d threads: ns per step p50 %7.1f  min %7.1f  max %7.1f\n", kVariantName[variant], threads, p50,
                        t.front(), t.back());
            char row[256];
            std::snprintf(row, sizeof row, "%s{\"variant\": \"%s\", \"threads\": %d, \"ns_per_step_p50\": %.2f, \"min\": %.2f, \"max\": %.2f}",
                          rows.empty() ? "" : ", ", kVariantName[variant], threads, p50, t.front(), t.back());
            rows += row;
        }
    if (!json.empty()) {
        FILE* f = std::fopen(json.c_str(), "w");
        if (!f) {
            std::fprintf(stderr, "cannot write %s\n", json.c_str());
            return 1;
        }
        std::fprintf(f, "{\"device\": \"%s\", \"cluster\": %d, \"steps\": %d, \"launches\": %d, \"rows\": [%s]}\n", prop.name,
                     kCluster, steps, launches, rows.c_str());
        std::fclose(f);
    }
    return rc;
}
