// Steps 2 and 3 of the GPU build-up: a TMA round trip (global -> swizzled smem,
// checked against the swizzle model, zero fill past the sequence end) and an
// mbarrier ring (one producer thread, a consumer warpgroup, many wraps); and
// the same ring shared by a cluster of two CTAs through TMA multicast, as
// the forward kernel's K/V ring runs with FA3C_FWD_CLUSTER = 2. And the two
// pieces of the variable-length kernels' K/V path: a tile loaded as boxes of
// a few rows from scattered pages (load_paged_kv), and v_guard's zeroing of
// the rows past a sequence's end (zero_rows).
#include "gpu_util.cuh"
#include "../../src/cuda/common/ptx.cuh"
#include "../../src/cuda/common/tensor_map.h"
#include "../../src/cuda/forward/fwd_sm90.cuh"

enum { ROWS = 128, BOX_BYTES = ROWS * 128 };

// One TMA box {64 cols, 128 rows} at (col0, row0, head, batch), copied out raw.
__global__ void tma_roundtrip_kernel(const __grid_constant__ CUtensorMap map, int col0, int row0, int head,
                                     int batch, uint8_t *out) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *tile = align_1024(smem_raw);
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

// A consumer warp's sum of a 128-row box of bf16 in smem (all lanes get it).
__device__ float warp_box_sum(const uint8_t *box) {
    const __nv_bfloat16 *t = (const __nv_bfloat16 *)box;
    float acc = 0;
    for (int e = threadIdx.x % 128; e < BOX_BYTES / 2; e += 128) acc += __bfloat162float(t[e]);
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
    return acc;
}

// The consumer warpgroup's four warp sums added into *dst (by thread 0).
__device__ void store_warpgroup_sum(float warp_sum, float *partial, float *dst) {
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = warp_sum;
    named_bar_sync(1, 128);
    if (threadIdx.x == 0) *dst = partial[0] + partial[1] + partial[2] + partial[3];
    named_bar_sync(1, 128);
}

// Ring of STAGES: the producer streams `ntiles` boxes (rows 128*i of one
// head, wrapping), the consumer warpgroup sums each and releases the stage.
template <int STAGES>
__global__ void mbarrier_ring_kernel(const __grid_constant__ CUtensorMap map, int ntiles, int seqlen, float *sums) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *tiles = align_1024(smem_raw);
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
        float acc = warp_box_sum(tiles + s * BOX_BYTES);
        if (threadIdx.x % 32 == 0) mbar_arrive(&empty[s]);
        store_warpgroup_sum(acc, partial, &sums[i]);
    }
}

// The ring of mbarrier_ring_kernel in a cluster of two CTAs: each CTA's
// producer loads half of every box (64 of its 128 rows) into the same stage
// of both CTAs (multicast), so a stage's full barrier counts both halves'
// bytes, and each consumer warp releases the stage in both CTAs (lane r on
// rank r's empty barrier, 8 arrivals per phase). Both CTAs sum every tile;
// each also copies out its stage of tile 0 (swizzle check).
template <int STAGES>
__global__ void __cluster_dims__(2, 1, 1)
    multicast_ring_kernel(const __grid_constant__ CUtensorMap half_map, int ntiles, int seqlen, float *sums,
                          uint8_t *tile0) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *tiles = align_1024(smem_raw);
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ float partial[4];
    const uint32_t rank = cluster_cta_rank();
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 8);   // one arrival per consumer warp of both CTAs
        }
        fence_barrier_init();
    }
    __syncthreads();
    cluster_sync();   // both CTAs' barriers exist before either multicasts
    if (threadIdx.x >= 128) {
        if (threadIdx.x == 128) {
            for (int i = 0; i < ntiles; i++) {
                int s = i % STAGES;
                mbar_wait_parity(&empty[s], ((i / STAGES) & 1) ^ 1);
                mbar_arrive_expect_tx(&full[s], BOX_BYTES);   // both halves land here
                tma_load_4d_multicast(tiles + s * BOX_BYTES + rank * (BOX_BYTES / 2), &half_map, &full[s], 0x3, 0,
                                      (i * ROWS) % seqlen + (int)rank * (ROWS / 2), 0, 0);
            }
        }
    } else {
        for (int i = 0; i < ntiles; i++) {
            int s = i % STAGES;
            mbar_wait_parity(&full[s], (i / STAGES) & 1);
            if (i == 0)
                for (int e = threadIdx.x; e < BOX_BYTES; e += 128)
                    tile0[rank * BOX_BYTES + e] = tiles[s * BOX_BYTES + e];
            float acc = warp_box_sum(tiles + s * BOX_BYTES);
            if (threadIdx.x % 32 < 2) mbar_arrive_cluster(&empty[s], threadIdx.x % 32);
            store_warpgroup_sum(acc, partial, &sums[rank * ntiles + i]);
        }
    }
    cluster_sync();   // the other CTA may still write into this one's smem and barriers
}

// A (batch 2, seqlen 200, heads 3, headdim 128) bf16 tensor with row padding.
enum { B = 2, S = 200, H = 3, D = 128, ROW_PITCH = 3 * D + 8 };

// Random values on the host (returned; free() it) and a copy on the device
// (t->data; cudaFree() it), or NULL when the device copy fails.
static __nv_bfloat16 *make_tensor(fa3c_tensor *t) {
    const size_t n = (size_t)B * S * ROW_PITCH;
    t->stride[3] = 1;
    t->stride[2] = D;
    t->stride[1] = ROW_PITCH;          // padded: heads*D + 8 elements per token
    t->stride[0] = (int64_t)S * ROW_PITCH;
    __nv_bfloat16 *h = (__nv_bfloat16 *)malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(gpu_randn());
    t->data = NULL;
    if (cudaMalloc(&t->data, n * 2) != cudaSuccess ||
        cudaMemcpy(t->data, h, n * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
        free(h);
        return NULL;
    }
    return h;
}

// Tiles of `sums` that differ from what the ring kernels should sum for
// tile i: rows (i * ROWS) % S.. of head 0, batch 0, columns 0-63 (zeros
// past S). Prints the first few.
static int wrong_ring_sums(const __nv_bfloat16 *h, const fa3c_tensor *t, const float *sums, int ntiles,
                           const char *who) {
    int bad = 0;
    for (int i = 0; i < ntiles; i++) {
        int row0 = (i * ROWS) % S;
        double want = 0;
        for (int r = row0; r < row0 + ROWS && r < S; r++)
            for (int c = 0; c < 64; c++) want += __bfloat162float(h[r * t->stride[1] + c]);
        if (!(fabs(want - sums[i]) < 1e-2 * (1 + fabs(want))) && bad++ < 5)
            printf("%s tile %d: got %g want %g\n", who, i, sums[i], want);
    }
    return bad;
}

// Paged boxes and zeroed rows, for a ROWS x D tile in the kernel's layout
// (TileLayout<D>: chunks of 64 columns with the 128-byte swizzle, or of 32
// with the 64-byte one for hdim 96). tile[0] gets the tile as ROWS / G boxes
// of G rows each from rows src_rows[i] of `pages` (as load_paged_kv places
// them), tile[1] as one box from `gathered` (the same rows, in order), and
// tile[2] from `zeroed` (those rows with rows >= valid zero). out: tile[0]
// as loaded, tile[0] after zero_rows(valid, ROWS) by one warp, tile[1], tile[2].
template <int D, int ROWS>
__global__ void paged_boxes_kernel(const __grid_constant__ CUtensorMap pages, const __grid_constant__ CUtensorMap gathered,
                                   const __grid_constant__ CUtensorMap zeroed, const int *src_rows, int g, int valid,
                                   uint8_t *out) {
    typedef TileLayout<D> L;
    enum { TILE = ROWS * D * 2 };
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t *tile = align_1024(smem_raw);
    __shared__ __align__(8) uint64_t full;
    if (threadIdx.x == 0) {
        mbar_init(&full, 1);
        fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&full, 3 * TILE);
        for (int i = 0; i < ROWS / g; i++)
            for (int c = 0; c < D / L::CHUNK; c++)
                tma_load_4d(tile + (c * ROWS + i * g) * L::ROW_BYTES, &pages, &full, c * L::CHUNK, src_rows[i], 0, 0);
        load_tile<D, ROWS>(tile + TILE, &gathered, &full, 0, 0, 0);
        load_tile<D, ROWS>(tile + 2 * TILE, &zeroed, &full, 0, 0, 0);
    }
    mbar_wait_parity(&full, 0);
    for (int i = threadIdx.x; i < TILE; i += blockDim.x) out[i] = tile[i];
    __syncthreads();
    if (threadIdx.x < 32) zero_rows<D, ROWS>(tile, valid, ROWS, threadIdx.x);
    __syncthreads();
    for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
        out[TILE + i] = tile[i];
        out[2 * TILE + i] = tile[TILE + i];
        out[3 * TILE + i] = tile[2 * TILE + i];
    }
}

// One case of paged_boxes_kernel: a "cache" of 512 random rows of 256
// bf16, G-row boxes from random G-aligned rows of it.
template <int D, int ROWS>
static void run_paged_boxes(int g, int valid) {
    enum { TILE = ROWS * D * 2, CACHE = 512, W = 256 };   // W: columns of the cache, >= D
    printf("paged boxes: D %d, %d rows as boxes of %d, rows from %d zeroed\n", D, ROWS, g, valid);
    const int chunk = FA3C_FWD_CHUNK_COLS(D), boxes = ROWS / g;
    __nv_bfloat16 *h[3];
    void *d[3];
    const int rows_of[3] = {CACHE, ROWS, ROWS};
    int src_rows[ROWS], *dsrc;
    for (int i = 0; i < boxes; i++) src_rows[i] = (int)(fabs(gpu_randn()) * 1000) % (CACHE / g) * g;
    for (int k = 0; k < 3; k++) h[k] = (__nv_bfloat16 *)malloc((size_t)rows_of[k] * W * 2);
    for (int i = 0; i < CACHE * W; i++) h[0][i] = __float2bfloat16(gpu_randn());
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < W; c++) {
            h[1][r * W + c] = h[0][(src_rows[r / g] + r % g) * W + c];
            h[2][r * W + c] = r < valid ? h[1][r * W + c] : __float2bfloat16(0.f);
        }
    CUtensorMap maps[3];
    for (int k = 0; k < 3; k++) {
        fa3c_tensor t = {NULL, {(int64_t)rows_of[k] * W, W, W, 1}};
        CUDA_OK(cudaMalloc(&d[k], (size_t)rows_of[k] * W * 2));
        CUDA_OK(cudaMemcpy(d[k], h[k], (size_t)rows_of[k] * W * 2, cudaMemcpyHostToDevice));
        t.data = d[k];
        CHECK(fa3c_tensor_map_rows(&maps[k], "x", &t, 2, 1, rows_of[k], 1, W, chunk, k == 0 ? g : ROWS) ==
                  FA3C_STATUS_OK, "%s", fa3c_last_error());
    }
    uint8_t *dout, *out = (uint8_t *)malloc(4 * TILE);
    CUDA_OK(cudaMalloc(&dout, 4 * TILE));
    CUDA_OK(cudaMalloc((void **)&dsrc, sizeof src_rows));
    CUDA_OK(cudaMemcpy(dsrc, src_rows, sizeof src_rows, cudaMemcpyHostToDevice));
    CUDA_OK(cudaFuncSetAttribute(paged_boxes_kernel<D, ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * TILE + 1024));
    paged_boxes_kernel<D, ROWS><<<1, 128, 3 * TILE + 1024>>>(maps[0], maps[1], maps[2], dsrc, g, valid, dout);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(out, dout, 4 * TILE, cudaMemcpyDeviceToHost));
    int boxes_differ = 0, zeros_differ = 0;
    for (int i = 0; i < TILE; i++) {
        boxes_differ += out[i] != out[2 * TILE + i];
        zeros_differ += out[TILE + i] != out[3 * TILE + i];
    }
    CHECK(boxes_differ == 0, "D %d, boxes of %d rows: %d bytes differ from one box of the same rows", D, g,
          boxes_differ);
    CHECK(zeros_differ == 0, "D %d, rows from %d zeroed: %d bytes differ from a tile loaded with those rows zero", D,
          valid, zeros_differ);
    for (int k = 0; k < 3; k++) { free(h[k]); cudaFree(d[k]); }
    free(out); cudaFree(dout); cudaFree(dsrc);
}

TEST(tma_paged_boxes_and_zeroed_rows) {
    REQUIRE_SM90();
    gpu_rng_seed(17);
    run_paged_boxes<64, 128>(16, 77);    // 128-byte swizzle, one chunk
    run_paged_boxes<64, 128>(8, 1);
    run_paged_boxes<128, 128>(128, 128); // nothing to zero
    run_paged_boxes<128, 128>(32, 0);    // everything
    run_paged_boxes<96, 128>(8, 100);    // 64-byte swizzle, three chunks
    run_paged_boxes<96, 128>(32, 64);
    run_paged_boxes<256, 80>(40, 33);    // hdim 256's 80-key blocks
    run_paged_boxes<256, 80>(16, 79);
    run_paged_boxes<192, 112>(56, 57);   // hdim 192's 112-key blocks
    // Boxes that start inside an 8-row swizzle atom (pages of 1, 2, 4, 5, 7, 10, 14 keys, or of any
    // size with such a gcd with the key block): the layout must still be that of one box.
    run_paged_boxes<128, 128>(1, 100);
    run_paged_boxes<64, 128>(2, 128);
    run_paged_boxes<128, 128>(4, 37);
    run_paged_boxes<256, 80>(5, 80);
    run_paged_boxes<256, 80>(10, 3);
    run_paged_boxes<192, 112>(7, 112);
    run_paged_boxes<192, 112>(14, 50);
    run_paged_boxes<96, 128>(2, 77);     // 64-byte rows: two rows per 128-byte boundary
    run_paged_boxes<96, 128>(4, 128);
}

TEST(tma_roundtrip_swizzle_and_zero_fill) {
    REQUIRE_SM90();
    gpu_rng_seed(7);
    uint8_t out[BOX_BYTES], *dout;
    fa3c_tensor t;
    __nv_bfloat16 *h = make_tensor(&t);
    CUDA_OK(h ? cudaSuccess : cudaErrorMemoryAllocation);
    CUDA_OK(cudaMalloc(&dout, BOX_BYTES));
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
    free(h); cudaFree(t.data); cudaFree(dout);
}

TEST(mbarrier_ring_3_stages_100_tiles) {
    REQUIRE_SM90();
    gpu_rng_seed(11);
    fa3c_tensor t;
    __nv_bfloat16 *h = make_tensor(&t);
    CUDA_OK(h ? cudaSuccess : cudaErrorMemoryAllocation);
    enum { NT = 100, STAGES = 3 };
    float sums[NT], *dsums;
    CUDA_OK(cudaMalloc(&dsums, sizeof sums));
    CUDA_OK(cudaMemset(dsums, 0xFF, sizeof sums));
    CUtensorMap map;
    CHECK(fa3c_tensor_map_rows(&map, "x", &t, 2, B, S, H, D, 64, ROWS) == FA3C_STATUS_OK, "%s", fa3c_last_error());
    int smem = STAGES * BOX_BYTES + 1024;
    CUDA_OK(cudaFuncSetAttribute(mbarrier_ring_kernel<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    mbarrier_ring_kernel<STAGES><<<1, 256, smem>>>(map, NT, S, dsums);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(sums, dsums, sizeof sums, cudaMemcpyDeviceToHost));
    int bad = wrong_ring_sums(h, &t, sums, NT, "ring");
    CHECK(bad == 0, "%d of %d tiles summed wrong", bad, NT);
    free(h); cudaFree(t.data); cudaFree(dsums);
}

TEST(tma_multicast_ring_cluster_of_2) {
    REQUIRE_SM90();
    gpu_rng_seed(13);
    fa3c_tensor t;
    __nv_bfloat16 *h = make_tensor(&t);
    CUDA_OK(h ? cudaSuccess : cudaErrorMemoryAllocation);
    enum { NT = 100, STAGES = 2 };
    float sums[2 * NT], *dsums;
    static uint8_t tile0[2 * BOX_BYTES];
    uint8_t *dtile0;
    CUDA_OK(cudaMalloc(&dsums, sizeof sums));
    CUDA_OK(cudaMalloc(&dtile0, sizeof tile0));
    CUDA_OK(cudaMemset(dsums, 0xFF, sizeof sums));
    CUDA_OK(cudaMemset(dtile0, 0xFF, sizeof tile0));
    CUtensorMap map;   // boxes of half a tile: 64 columns x 64 rows
    CHECK(fa3c_tensor_map_rows(&map, "x", &t, 2, B, S, H, D, 64, ROWS / 2) == FA3C_STATUS_OK, "%s", fa3c_last_error());
    int smem = STAGES * BOX_BYTES + 1024;
    // Room for the forward kernel's smem too: for the logs, how many clusters
    // of two CTAs of that size (one CTA per SM) fit on this GPU at once.
    enum { FWD_SMEM = 200 * 1024 };
    CUDA_OK(cudaFuncSetAttribute(multicast_ring_kernel<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, FWD_SMEM));
    {
        cudaLaunchConfig_t cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDim = dim3(2);
        cfg.blockDim = dim3(256);
        cfg.dynamicSmemBytes = FWD_SMEM;
        int fit = 0, sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        if (cudaOccupancyMaxActiveClusters(&fit, multicast_ring_kernel<STAGES>, &cfg) == cudaSuccess)
            printf("clusters of 2 CTAs with 200 KB smem resident at once: %d (%d SMs)\n", fit, sms);
        cudaGetLastError();
    }
    multicast_ring_kernel<STAGES><<<2, 256, smem>>>(map, NT, S, dsums, dtile0);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(sums, dsums, sizeof sums, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(tile0, dtile0, sizeof tile0, cudaMemcpyDeviceToHost));
    int bad = wrong_ring_sums(h, &t, sums, NT, "rank 0") + wrong_ring_sums(h, &t, sums + NT, NT, "rank 1");
    CHECK(bad == 0, "%d of %d tile sums wrong", bad, 2 * NT);
    // Tile 0 in both CTAs: rows 0-63 from rank 0's load, 64-127 from rank 1's,
    // each in place under the swizzle of one 128-row box.
    bad = 0;
    for (int rank = 0; rank < 2; rank++)
        for (int r = 0; r < ROWS; r++)
            for (int c = 0; c < 64; c++) {
                uint16_t got, want;
                memcpy(&got, tile0 + rank * BOX_BYTES + sw128_offset(ROWS, r, c), 2);
                __nv_bfloat16 v = h[r * t.stride[1] + c];
                memcpy(&want, &v, 2);
                if (got != want && bad++ < 5)
                    printf("rank %d row %d col %d: got %04x want %04x\n", rank, r, c, got, want);
            }
    CHECK(bad == 0, "%d elements of tile 0 differ from the swizzle model", bad);
    free(h); cudaFree(t.data); cudaFree(dsums); cudaFree(dtile0);
}

TEST_MAIN()
