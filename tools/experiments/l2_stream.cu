// How fast the SMs can stream K/V-like tiles out of the L2 through TMA, each
// CTA on its own or in clusters of two that share every load by multicast
// (the forward kernel's FA3C_FWD_CLUSTER = 2 mechanism), with no compute:
// the ceiling a ring of loads can reach, against the ~5 TB/s of K/V reads
// the forward kernel needs at 650 TFLOPS (docs/KERNEL.md, "Clusters of two
// CTAs"). One CTA per SM; CTAs 2i and 2i + 1 stream the same head (as the
// two CTAs of a pair would), heads round-robin; the 16 heads' K (8 MB) stay
// in the L2. Consumers only wait for each tile and release its slot.
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -I include -I src -I src/cuda/common \
//     -o gpu_l2_stream tools/experiments/l2_stream.cu src/cuda/common/tensor_map.c src/error.c && ./gpu_l2_stream
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include "ptx.cuh"
#include "tensor_map.h"

enum { ROWS = 128, COLS = 128, TILE_BYTES = ROWS * COLS * 2, STAGES = 4, CONSUMER_WARPS = 8, HEADS = 16,
       SEQLEN = 2048, BLOCKS = SEQLEN / ROWS };

template <bool PAIRED>
__global__ void __launch_bounds__(32 * (CONSUMER_WARPS + 1), 1)
    stream_kernel(const __grid_constant__ CUtensorMap map, int reps) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *ring = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    const int cluster = PAIRED ? 2 : 1, rank = PAIRED ? (int)cluster_cta_rank() : 0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], CONSUMER_WARPS * cluster);
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (PAIRED) cluster_sync();
    const int head = (int)(blockIdx.x / 2) % HEADS, tiles = reps * BLOCKS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == CONSUMER_WARPS) {   // the producer
        if (lane == 0)
            for (int i = 0; i < tiles; i++) {
                int s = i % STAGES, row0 = (i % BLOCKS) * ROWS;
                mbar_wait_parity(&empty[s], ((i / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(&full[s], TILE_BYTES);
                for (int c = 0; c < COLS / 64; c++) {
                    uint8_t *dst = ring + s * TILE_BYTES + c * ROWS * 128;
                    if (PAIRED)
                        tma_load_4d_multicast(dst + rank * (ROWS / 2) * 128, &map, &full[s], 0x3, c * 64,
                                              row0 + rank * (ROWS / 2), head, 0);
                    else
                        tma_load_4d(dst, &map, &full[s], c * 64, row0, head, 0);
                }
            }
    } else {
        for (int i = 0; i < tiles; i++) {
            int s = i % STAGES;
            mbar_wait_parity(&full[s], (i / STAGES) & 1);
            if (PAIRED) {
                if (lane < 2) mbar_arrive_cluster(&empty[s], lane);
            } else if (lane == 0) {
                mbar_arrive(&empty[s]);
            }
        }
    }
    if (PAIRED) cluster_sync();
}

#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

// Runs one mode; returns 0 and prints a row, or 1 on a CUDA error.
template <bool PAIRED>
static int run(void *data, int sms, int reps) {
    fa3c_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.stride[3] = 1;
    t.stride[2] = COLS;
    t.stride[1] = (int64_t)HEADS * COLS;
    t.stride[0] = (int64_t)SEQLEN * HEADS * COLS;
    CUtensorMap map;
    const int box_rows = PAIRED ? ROWS / 2 : ROWS;
    if (fa3c_tensor_map_rows(&map, "k", &t, 2, 1, SEQLEN, HEADS, COLS, 64, box_rows) != FA3C_STATUS_OK) {
        fprintf(stderr, "tensor map: %s\n", fa3c_last_error());
        return 1;
    }
    const int smem = STAGES * TILE_BYTES + 1024;
    CUDA_CHECK(cudaFuncSetAttribute(stream_kernel<PAIRED>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = PAIRED ? 2 : 1;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.blockDim = dim3(32 * (CONSUMER_WARPS + 1));
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int grid = sms / 2 * 2;
    if (PAIRED) {
        int fit = 0;
        cfg.gridDim = dim3(grid);
        CUDA_CHECK(cudaOccupancyMaxActiveClusters(&fit, stream_kernel<PAIRED>, &cfg));
        if (fit > 0 && 2 * fit < grid) grid = 2 * fit;
    }
    cfg.gridDim = dim3(grid);
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, stream_kernel<PAIRED>, map, 2));   // warm-up
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0));
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, stream_kernel<PAIRED>, map, reps));
    CUDA_CHECK(cudaEventRecord(e1));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    double delivered = (double)grid * reps * BLOCKS * TILE_BYTES;   // bytes landing in smem
    double l2 = delivered / (PAIRED ? 2 : 1);                       // bytes read from the L2
    printf("%-9s %5d %9.3f %14.2f %12.2f\n", PAIRED ? "pairs" : "single", grid, ms, delivered / ms / 1e9,
           l2 / ms / 1e9);
    return 0;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 200, sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    void *data = NULL;
    size_t bytes = (size_t)SEQLEN * HEADS * COLS * 2;
    CUDA_CHECK(cudaMalloc(&data, bytes));
    CUDA_CHECK(cudaMemset(data, 0, bytes));
    printf("tiles of %d x %d bf16 (%d KB), %d-stage ring, %d heads x %d keys in the L2, %d passes\n", ROWS, COLS,
           TILE_BYTES / 1024, STAGES, HEADS, SEQLEN, reps);
    printf("%-9s %5s %9s %14s %12s\n", "mode", "CTAs", "ms", "to smem TB/s", "L2 TB/s");
    int rc = run<false>(data, sms, reps) || run<true>(data, sms, reps);
    cudaFree(data);
    return rc;
}
