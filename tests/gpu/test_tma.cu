// Steps 2 and 3 of the GPU build-up: a TMA round trip (global -> swizzled smem,
// checked against the swizzle model, zero fill past the sequence end) and an
// mbarrier ring (one producer thread, a consumer warpgroup, many wraps).
#include "gpu_util.cuh"
#include "../../src/cuda/ptx.cuh"
#include "../../src/cuda/tensor_map.h"

enum { ROWS = 128, BOX_BYTES = ROWS * 128 };

// One TMA box {64 cols, 128 rows} at (col0, row0, head, batch), copied out raw.
__global__ void tma_roundtrip_kernel(const __grid_constant__ CUtensorMap map, int col0, int row0, int head,
                                     int batch, uint8_t *out) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *tile = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ __align__(8) uint64_t full;
    if (threadIdx.x == 0) {
        mbar_init(&full, 1);
        fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&full, BOX_BYTES);
        tma_load_4d(tile, &map, &full, col0, row0, head, batch);
    }
    mbar_wait_parity(&full, 0);
    for (int i = threadIdx.x; i < BOX_BYTES; i += blockDim.x) out[i] = tile[i];
}

// Ring of STAGES: the producer streams `ntiles` boxes (rows 128*i of one
// head, wrapping), the consumer warpgroup sums each and releases the stage.
template <int STAGES>
__global__ void mbarrier_ring_kernel(const __grid_constant__ CUtensorMap map, int ntiles, int seqlen, float *sums) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *tiles = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ float partial[4];
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 4);   // one arrival per consumer warp
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x >= 128) {          // producer warpgroup: one thread issues
        if (threadIdx.x == 128) {
            for (int i = 0; i < ntiles; i++) {
                int s = i % STAGES;
                uint32_t phase = (i / STAGES) & 1;
                mbar_wait_parity(&empty[s], phase ^ 1);   // fresh barrier: passes at once
                mbar_arrive_expect_tx(&full[s], BOX_BYTES);
                tma_load_4d(tiles + s * BOX_BYTES, &map, &full[s], 0, (i * ROWS) % seqlen, 0, 0);
            }
        }
        return;
    }
    for (int i = 0; i < ntiles; i++) {
        int s = i % STAGES;
        mbar_wait_parity(&full[s], (i / STAGES) & 1);
        const __nv_bfloat16 *t = (const __nv_bfloat16 *)(tiles + s * BOX_BYTES);
        float acc = 0;
        for (int e = threadIdx.x; e < BOX_BYTES / 2; e += 128) acc += __bfloat162float(t[e]);
        for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
        if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
        __syncwarp();
        if (threadIdx.x % 32 == 0) mbar_arrive(&empty[s]);
        named_bar_sync(1, 128);
        if (threadIdx.x == 0) sums[i] = partial[0] + partial[1] + partial[2] + partial[3];
        named_bar_sync(1, 128);
    }
}

// A (batch 2, seqlen 200, heads 3, headdim 128) bf16 tensor with row padding.
enum { B = 2, S = 200, H = 3, D = 128, ROW_PITCH = 3 * D + 8 };

static void make_tensor(__nv_bfloat16 *h, fa3c_tensor *t) {
    t->stride[3] = 1;
    t->stride[2] = D;
    t->stride[1] = ROW_PITCH;          // padded: heads*D + 8 elements per token
    t->stride[0] = (int64_t)S * ROW_PITCH;
    for (size_t i = 0; i < (size_t)B * S * ROW_PITCH; i++) h[i] = __float2bfloat16(gpu_randn());
}

TEST(tma_roundtrip_swizzle_and_zero_fill) {
    REQUIRE_SM90();
    gpu_rng_seed(7);
    size_t n = (size_t)B * S * ROW_PITCH;
    __nv_bfloat16 *h = (__nv_bfloat16 *)malloc(n * 2), *d;
    uint8_t out[BOX_BYTES], *dout;
    fa3c_tensor t;
    make_tensor(h, &t);
    CUDA_OK(cudaMalloc(&d, n * 2));
    CUDA_OK(cudaMalloc(&dout, BOX_BYTES));
    CUDA_OK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    t.data = d;
    CUtensorMap map;
    fa3c_status st = fa3c_tensor_map_rows(&map, "x", &t, 2, B, S, H, D, 64, ROWS);
    CHECK(st == FA3C_STATUS_OK, "tensor map: %s", fa3c_last_error());
    int col0 = 64, row0 = 128, head = 2, batch = 1;   // rows 128..255: 200.. are past the end
    CUDA_OK(cudaFuncSetAttribute(tma_roundtrip_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, BOX_BYTES + 1024));
    tma_roundtrip_kernel<<<1, 128, BOX_BYTES + 1024>>>(map, col0, row0, head, batch, dout);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(out, dout, BOX_BYTES, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < 64; c++) {
            uint16_t got, want = 0;
            memcpy(&got, out + sw128_offset(ROWS, r, c), 2);
            if (row0 + r < S) {
                __nv_bfloat16 v = h[batch * t.stride[0] + (row0 + r) * t.stride[1] + head * D + col0 + c];
                memcpy(&want, &v, 2);
            }
            if (got != want && bad++ < 5) printf("row %d col %d: got %04x want %04x\n", r, c, got, want);
        }
    CHECK(bad == 0, "%d elements differ from the swizzle model", bad);
    free(h); cudaFree(d); cudaFree(dout);
}

TEST(mbarrier_ring_3_stages_100_tiles) {
    REQUIRE_SM90();
    gpu_rng_seed(11);
    size_t n = (size_t)B * S * ROW_PITCH;
    __nv_bfloat16 *h = (__nv_bfloat16 *)malloc(n * 2), *d;
    fa3c_tensor t;
    make_tensor(h, &t);
    enum { NT = 100, STAGES = 3 };
    float sums[NT], *dsums;
    CUDA_OK(cudaMalloc(&d, n * 2));
    CUDA_OK(cudaMalloc(&dsums, sizeof sums));
    CUDA_OK(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dsums, 0xFF, sizeof sums));
    t.data = d;
    CUtensorMap map;
    CHECK(fa3c_tensor_map_rows(&map, "x", &t, 2, B, S, H, D, 64, ROWS) == FA3C_STATUS_OK, "%s", fa3c_last_error());
    int smem = STAGES * BOX_BYTES + 1024;
    CUDA_OK(cudaFuncSetAttribute(mbarrier_ring_kernel<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    mbarrier_ring_kernel<STAGES><<<1, 256, smem>>>(map, NT, S, dsums);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(sums, dsums, sizeof sums, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < NT; i++) {
        int row0 = (i * ROWS) % S;
        double want = 0;
        for (int r = row0; r < row0 + ROWS && r < S; r++)
            for (int c = 0; c < 64; c++) want += __bfloat162float(h[r * t.stride[1] + c]);
        if (!(fabs(want - sums[i]) < 1e-2 * (1 + fabs(want))) && bad++ < 5)
            printf("tile %d: got %g want %g\n", i, sums[i], want);
    }
    CHECK(bad == 0, "%d of %d tiles summed wrong", bad, NT);
    free(h); cudaFree(d); cudaFree(dsums);
}

TEST_MAIN()
