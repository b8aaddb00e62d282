// Step 1 of the GPU build-up: one warpgroup's wgmma against a CPU matmul.
// Tiles are written into smem with the 128-byte swizzle by plain stores (the
// model in gpu_util.cuh), so this checks the descriptors and the fragment
// layouts independently of TMA.
#include "gpu_util.cuh"
#include "fa3c.h"   // fa3c_float_to_e4m3, fa3c_e4m3_to_float
#include "../../src/cuda/common/wgmma.cuh"
#include "../../src/cuda/backward/bwd_sm90.cuh"   // store_ds, gemm_dq (_transposed): the backward's dQ = dS·K
#include "../../src/cuda/fp8/fwd_fp8_sm90.cuh"   // the fp8 forward's GEMMs and P fragments

extern __shared__ __align__(1024) uint8_t smem_raw[];

// The dynamic smem's base, aligned to 1 KB (the swizzle's period).
__device__ uint8_t *smem_base(void) { return align_1024(smem_raw); }

// A and B (64 x 128 each) into smem with the 128-byte swizzle, by plain
// stores, visible to wgmma: sa at the aligned base, sb 16 KB on.
__device__ void stage_ab_sw128(uint8_t *&sa, uint8_t *&sb, const __nv_bfloat16 *a, const __nv_bfloat16 *b) {
    sa = smem_base();
    sb = sa + 64 * 128 * 2;
    for (int i = threadIdx.x; i < 64 * 128; i += blockDim.x) {
        int r = i / 128, c = i % 128;
        *(__nv_bfloat16 *)(sa + sw128_offset(64, r, c)) = a[i];
        *(__nv_bfloat16 *)(sb + sw128_offset(64, r, c)) = b[i];
    }
    fence_proxy_async_smem();
    __syncthreads();
}

// A 64 x N accumulator of one warpgroup (wgmma layout: register i of thread
// t is row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2), column
// 8 (i / 4) + 2 (t % 4) + i % 2) into a row-major 64 x N matrix.
template <int N>
__device__ void store_accumulator(const float *d, float *out) {
    int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
    for (int i = 0; i < N / 2; i++) {
        int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * q + (i % 2);
        out[row * N + col] = d[i];
    }
}

// S(64x64) = A(64x128) · B(64x128)^T, both K-major: the Q·K^T shape.
__global__ void wgmma_ss_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *out) {
    uint8_t *sa, *sb;
    stage_ab_sw128(sa, sb, a, b);
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.f;
    wgmma_fence();
    for (int kk = 0; kk < 8; kk++) {   // 8 k-steps of 16 over K = 128 (two 64-wide chunks)
        uint32_t off = (kk / 4) * 64 * 128 + (kk % 4) * 32;
        wgmma_ss<64, 0>(d, smem_desc_sw128(smem_addr(sa) + off, 16, 1024),
                        smem_desc_sw128(smem_addr(sb) + off, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    store_accumulator<64>(d, out);
}

// S(64x64) = A(64x128, registers) · B(64x128)^T, B K-major: Q·K^T with Q in
// registers. A goes through smem with the swizzle and comes back with
// ldmatrix (load_a_fragment), as the kernel would load Q.
__global__ void wgmma_rsk_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *out) {
    uint8_t *sa, *sb;
    stage_ab_sw128(sa, sb, a, b);
    int w = threadIdx.x / 32;
    uint32_t frag[8][4];
    for (int kk = 0; kk < 8; kk++) load_a_fragment<128>(frag[kk], sa, 64, 16 * w, 16 * kk);
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.f;
    wgmma_fence();
    for (int kk = 0; kk < 8; kk++) {
        uint32_t off = (kk / 4) * 64 * 128 + (kk % 4) * 32;
        wgmma_rsk<64, 0>(d, frag[kk], smem_desc_sw128(smem_addr(sb) + off, 16, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    store_accumulator<64>(d, out);
}

// The same S with warp-level mma.sync m16n8k16, A and B both by ldmatrix
// from the swizzled tiles (load_a_fragment, load_b_fragments_x2): the
// forward kernel's rare recompute of S (recompute_scores_warp). Its
// accumulator layout must be the wgmma one.
__global__ void mma_sync_qkt_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b, float *out) {
    uint8_t *sa, *sb;
    stage_ab_sw128(sa, sb, a, b);
    int w = threadIdx.x / 32;
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.f;
    for (int kk = 0; kk < 8; kk++) {
        uint32_t frag[4];
        load_a_fragment<128>(frag, sa, 64, 16 * w, 16 * kk);
        for (int c = 0; c < 4; c++) {
            uint32_t bf[4];
            load_b_fragments_x2<128>(bf, sb, 64, 16 * c, 16 * kk);
            mma_m16n8k16<0>(&d[8 * c], frag, bf[0], bf[1]);
            mma_m16n8k16<0>(&d[8 * c + 4], frag, bf[2], bf[3]);
        }
    }
    store_accumulator<64>(d, out);
}

// O(64x128) = P(64x64, registers) · V(64x128), V MN-major: the P·V shape.
__global__ void wgmma_rs_kernel(const __nv_bfloat16 *p, const __nv_bfloat16 *v, float *out) {
    uint8_t *sv = smem_base();
    for (int i = threadIdx.x; i < 64 * 128; i += blockDim.x) {
        int r = i / 128, c = i % 128;
        *(__nv_bfloat16 *)(sv + sw128_offset(64, r, c)) = v[i];
    }
    fence_proxy_async_smem();
    __syncthreads();
    int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
    float d[64];
    for (int i = 0; i < 64; i++) d[i] = 0.f;
    wgmma_fence();
    for (int kk = 0; kk < 4; kk++) {
        // A fragment of rows 16w+g (+8), columns 16kk + 2q (+1) (+8).
        uint32_t a[4];
        int r0 = 16 * w + g, c0 = 16 * kk + 2 * q;
        const uint32_t *p32 = (const uint32_t *)p;
        a[0] = p32[(r0 * 64 + c0) / 2];
        a[1] = p32[((r0 + 8) * 64 + c0) / 2];
        a[2] = p32[(r0 * 64 + c0 + 8) / 2];
        a[3] = p32[((r0 + 8) * 64 + c0 + 8) / 2];
        wgmma_rs<128, 0>(d, a, smem_desc_sw128(smem_addr(sv) + kk * 16 * 128, 64 * 128, 1024), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    store_accumulator<128>(d, out);
}

static void fill_bf16(__nv_bfloat16 *h, float *hf, int n) {
    for (int i = 0; i < n; i++) {
        h[i] = __float2bfloat16(gpu_randn());
        hf[i] = __bfloat162float(h[i]);
    }
}

typedef void (*QktKernel)(const __nv_bfloat16 *, const __nv_bfloat16 *, float *);

// S(64x64) = A(64x128) · B(64x128)^T through `kernel`, against a float64 matmul.
static void check_qkt(QktKernel kernel, const char *name, uint64_t seed) {
    gpu_rng_seed(seed);
    static __nv_bfloat16 ha[64 * 128], hb[64 * 128];
    static float fa[64 * 128], fb[64 * 128], out[64 * 64];
    fill_bf16(ha, fa, 64 * 128);
    fill_bf16(hb, fb, 64 * 128);
    __nv_bfloat16 *da, *db;
    float *dout;
    CUDA_OK(cudaMalloc(&da, sizeof ha));
    CUDA_OK(cudaMalloc(&db, sizeof hb));
    CUDA_OK(cudaMalloc(&dout, sizeof out));
    CUDA_OK(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dout, 0xFF, sizeof out));   // NaN poison
    int smem = 2 * 64 * 128 * 2 + 1024;
    CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<1, 128, smem>>>(da, db, dout);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
    double maxerr = 0;
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 64; j++) {
            double ref = 0;
            for (int k = 0; k < 128; k++) ref += (double)fa[i * 128 + k] * fb[j * 128 + k];
            double e = fabs(ref - out[i * 64 + j]);
            if (!(e <= maxerr)) maxerr = isnan(e) ? INFINITY : e;
        }
    printf("wgmma %s max abs error %.3g\n", name, maxerr);
    CHECK(maxerr < 1e-3, "max error %g", maxerr);
    cudaFree(da); cudaFree(db); cudaFree(dout);
}

TEST(wgmma_ss_qkt_64x64x128) {
    REQUIRE_SM90();
    check_qkt(wgmma_ss_kernel, "ss", 1234);
}

TEST(wgmma_rsk_qkt_ldmatrix_64x64x128) {
    REQUIRE_SM90();
    check_qkt(wgmma_rsk_kernel, "rsk (A by ldmatrix)", 4321);
}

TEST(mma_sync_qkt_ldmatrix_64x64x128) {
    REQUIRE_SM90();
    check_qkt(mma_sync_qkt_kernel, "mma.sync (A and B by ldmatrix)", 5678);
}

TEST(wgmma_rs_pv_64x128x64) {
    REQUIRE_SM90();
    gpu_rng_seed(99);
    static __nv_bfloat16 hp[64 * 64], hv[64 * 128];
    static float fp[64 * 64], fv[64 * 128], out[64 * 128];
    fill_bf16(hp, fp, 64 * 64);
    fill_bf16(hv, fv, 64 * 128);
    __nv_bfloat16 *dp, *dv;
    float *dout;
    CUDA_OK(cudaMalloc(&dp, sizeof hp));
    CUDA_OK(cudaMalloc(&dv, sizeof hv));
    CUDA_OK(cudaMalloc(&dout, sizeof out));
    CUDA_OK(cudaMemcpy(dp, hp, sizeof hp, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, hv, sizeof hv, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dout, 0xFF, sizeof out));
    int smem = 64 * 128 * 2 + 1024;
    CUDA_OK(cudaFuncSetAttribute(wgmma_rs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    wgmma_rs_kernel<<<1, 128, smem>>>(dp, dv, dout);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
    double maxerr = 0;
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 128; j++) {
            double ref = 0;
            for (int k = 0; k < 64; k++) ref += (double)fp[i * 64 + k] * fv[k * 128 + j];
            double e = fabs(ref - out[i * 128 + j]);
            if (!(e <= maxerr)) maxerr = isnan(e) ? INFINITY : e;
        }
    printf("wgmma rs max abs error %.3g\n", maxerr);
    CHECK(maxerr < 1e-3, "max error %g", maxerr);
    cudaFree(dp); cudaFree(dv); cudaFree(dout);
}

// The backward's dQ = dS·K with the kernel's own helpers (bwd_sm90.cuh):
// dSᵀ (128 keys x M queries, given as bf16, key-major) goes into A
// fragments and through store_ds (stmatrix) to the dS buffer, K (128 keys x
// 128 columns) is staged as the TMA would land it, and gemm_dq reads both
// MN-major (wgmma_ss_mn). out: dQ (80 x 128) from hdim 128's transposed
// form (M = 80: dS stored by query rows with store_ds_by_queries, dQᵀ =
// Kᵀ·dSᵀ of columns [64 wg, +64) over all keys, wg = 0, 1, by
// gemm_dq_transposed; out64t: the same form with 64 queries, the 64-row
// blocks' of FA3C_BWD_HDIM128_SHORT_M64); out64: dQ (128 x 64) of
// K's first 64 columns from hdim 64's split (M = 128: query rows [64 wg,
// +64), all columns over all keys); out64k: dQ (64 x 64) from hdim 64's
// split with 64-row blocks (all columns over keys [64 wg, +64), summed).
template <int M, bool BY_QUERIES = false>
__device__ void stage_ds(uint8_t *sds, const __nv_bfloat16 *dst) {
    int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
    const uint16_t *d16 = (const uint16_t *)dst;
    for (int half = 0; half < 2; half++) {   // store_ds writes a warpgroup's 64 key rows: both halves here
        uint32_t frag[M / 16][4];
        for (int kk = 0; kk < M / 16; kk++)
            for (int j = 0; j < 4; j++) {
                int row = half * 64 + 16 * w + g + 8 * (j % 2), col = 16 * kk + 8 * (j / 2) + 2 * q;
                frag[kk][j] = (uint32_t)d16[row * M + col] | ((uint32_t)d16[row * M + col + 1] << 16);
            }
        if (BY_QUERIES) store_ds_by_queries<M>(sds, frag, half, w);
        else store_ds<M>(sds, frag, half, w);
    }
}

__global__ void wgmma_dq_kernel(const __nv_bfloat16 *dst, const __nv_bfloat16 *dst128, const __nv_bfloat16 *dst80,
                                const __nv_bfloat16 *k, float *out, float *out64t, float *out64, float *out64k) {
    uint8_t *sk = smem_base(), *sk64 = sk + 128 * 128 * 2, *sds = sk64 + 128 * 64 * 2, *sds128 = sds + 128 * 64 * 2;
    uint8_t *sds80 = sds128 + 128 * 128 * 2, *sds64q = sds80 + 128 * 80 * 2;
    for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
        int r = i / 128, c = i % 128;
        *(__nv_bfloat16 *)(sk + sw128_offset(128, r, c)) = k[i];
        if (c < 64) *(__nv_bfloat16 *)(sk64 + sw128_offset(128, r, c)) = k[i];
    }
    stage_ds<64>(sds, dst);
    stage_ds<128>(sds128, dst128);
    stage_ds<80, true>(sds80, dst80);
    stage_ds<64, true>(sds64q, dst);
    fence_proxy_async_smem();
    __syncthreads();
    int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    float d[32], dt[40];
    for (int wg = 0; wg < 2; wg++) {
        wgmma_fence();
        gemm_dq_transposed<80, 0>(dt, sds80, sk, wg);
        wgmma_commit();
        wgmma_wait<0>();
        for (int i = 0; i < 40; i++) {   // accumulator rows: columns; its columns: queries
            int col = 16 * w + g + 8 * ((i / 2) % 2), query = 8 * (i / 4) + 2 * q + (i % 2);
            out[query * 128 + wg * 64 + col] = dt[i];
        }
        wgmma_fence();
        gemm_dq_transposed<64, 0>(d, sds64q, sk, wg);
        wgmma_commit();
        wgmma_wait<0>();
        for (int i = 0; i < 32; i++) {
            int col = 16 * w + g + 8 * ((i / 2) % 2), query = 8 * (i / 4) + 2 * q + (i % 2);
            out64t[query * 128 + wg * 64 + col] = d[i];
        }
        wgmma_fence();
        gemm_dq<64, 128, 0>(d, sds128, sk64, wg);
        wgmma_commit();
        wgmma_wait<0>();
        for (int i = 0; i < 32; i++) {
            int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * q + (i % 2);
            out64[(wg * 64 + row) * 64 + col] = d[i];
        }
        wgmma_fence();
        gemm_dq<64, 64, 0>(d, sds, sk64, wg);
        wgmma_commit();
        wgmma_wait<0>();
        for (int i = 0; i < 32; i++) {
            int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * q + (i % 2);
            out64k[row * 64 + col] = wg == 0 ? d[i] : out64k[row * 64 + col] + d[i];
        }
    }
}

TEST(wgmma_bwd_dq_forms) {
    REQUIRE_SM90();
    gpu_rng_seed(2024);
    static __nv_bfloat16 hds[128 * 64], hds128[128 * 128], hds80[128 * 80], hk[128 * 128];
    static float fds[128 * 64], fds128[128 * 128], fds80[128 * 80], fk[128 * 128], out[80 * 128], out64t[64 * 128],
        out64[128 * 64], out64k[64 * 64];
    fill_bf16(hds, fds, 128 * 64);
    fill_bf16(hds128, fds128, 128 * 128);
    fill_bf16(hds80, fds80, 128 * 80);
    fill_bf16(hk, fk, 128 * 128);
    __nv_bfloat16 *dds, *dds128, *dds80, *dk;
    float *dout, *dout64t, *dout64, *dout64k;
    CUDA_OK(cudaMalloc(&dds, sizeof hds));
    CUDA_OK(cudaMalloc(&dds128, sizeof hds128));
    CUDA_OK(cudaMalloc(&dds80, sizeof hds80));
    CUDA_OK(cudaMalloc(&dk, sizeof hk));
    CUDA_OK(cudaMalloc(&dout, sizeof out));
    CUDA_OK(cudaMalloc(&dout64t, sizeof out64t));
    CUDA_OK(cudaMalloc(&dout64, sizeof out64));
    CUDA_OK(cudaMalloc(&dout64k, sizeof out64k));
    CUDA_OK(cudaMemcpy(dds, hds, sizeof hds, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dds128, hds128, sizeof hds128, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dds80, hds80, sizeof hds80, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, hk, sizeof hk, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dout, 0xFF, sizeof out));
    CUDA_OK(cudaMemset(dout64t, 0xFF, sizeof out64t));
    CUDA_OK(cudaMemset(dout64, 0xFF, sizeof out64));
    CUDA_OK(cudaMemset(dout64k, 0xFF, sizeof out64k));
    int smem = 128 * 128 * 2 + 128 * 64 * 2 + 128 * 64 * 2 + 128 * 128 * 2 + 128 * 80 * 2 + 128 * 64 * 2 + 1024;
    CUDA_OK(cudaFuncSetAttribute(wgmma_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    wgmma_dq_kernel<<<1, 128, smem>>>(dds, dds128, dds80, dk, dout, dout64t, dout64, dout64k);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out64t, dout64t, sizeof out64t, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out64, dout64, sizeof out64, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out64k, dout64k, sizeof out64k, cudaMemcpyDeviceToHost));
    double maxerr = 0, maxerr64t = 0, maxerr64 = 0, maxerr64k = 0;
    for (int i = 0; i < 80; i++)
        for (int j = 0; j < 128; j++) {
            double ref = 0;   // dQ[i][j] = sum over keys n of dS[i][n] K[n][j], dS[i][n] = dSᵀ[n][i]
            for (int n = 0; n < 128; n++) ref += (double)fds80[n * 80 + i] * fk[n * 128 + j];
            double e = fabs(ref - out[i * 128 + j]);
            if (!(e <= maxerr)) maxerr = isnan(e) ? INFINITY : e;
        }
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 128; j++) {
            double ref = 0;
            for (int n = 0; n < 128; n++) ref += (double)fds[n * 64 + i] * fk[n * 128 + j];
            double e = fabs(ref - out64t[i * 128 + j]);
            if (!(e <= maxerr64t)) maxerr64t = isnan(e) ? INFINITY : e;
            if (j < 64) {
                e = fabs(ref - out64k[i * 64 + j]);
                if (!(e <= maxerr64k)) maxerr64k = isnan(e) ? INFINITY : e;
            }
        }
    for (int i = 0; i < 128; i++)
        for (int j = 0; j < 64; j++) {
            double ref = 0;
            for (int n = 0; n < 128; n++) ref += (double)fds128[n * 128 + i] * fk[n * 128 + j];
            double e = fabs(ref - out64[i * 64 + j]);
            if (!(e <= maxerr64)) maxerr64 = isnan(e) ? INFINITY : e;
        }
    printf("wgmma dQ = dS K max abs error: hdim 128 (dQᵀ, 80 / 64 queries) %.3g / %.3g, hdim 64 splits: rows %.3g, "
           "keys %.3g\n", maxerr, maxerr64t, maxerr64, maxerr64k);
    CHECK(maxerr < 1e-3, "hdim 128 transposed: max error %g", maxerr);
    CHECK(maxerr64t < 1e-3, "hdim 128 transposed, 64 queries: max error %g", maxerr64t);
    CHECK(maxerr64 < 1e-3, "hdim 64 row split: max error %g", maxerr64);
    CHECK(maxerr64k < 1e-3, "hdim 64 key split: max error %g", maxerr64k);
    cudaFree(dds); cudaFree(dds128); cudaFree(dds80); cudaFree(dk); cudaFree(dout); cudaFree(dout64t); cudaFree(dout64); cudaFree(dout64k);
}

// Byte offset of (row, col) in an 8-bit tile of rows x 128 bytes with the
// 128-byte swizzle (16-byte unit u of row r at u ^ (r % 8)).
static __host__ __device__ inline size_t sw128_offset_u8(int row, int col) {
    return (size_t)row * 128 + (size_t)((((col / 16) ^ (row & 7))) * 16) + col % 16;
}

// The fp8 forward's two GEMMs with its own helpers (fwd_fp8_sm90.cuh), one
// warpgroup: S(128 x 128) = Q(a 128-row tile, as either consumer) · Kᵀ, both e4m3
// K-major; then O(64 x 128) = e4m3(P) · V with P (given as floats, 64 x 128)
// packed from the accumulator layout by fp8_probs_to_fragments and V staged
// as the transposed, key-permuted tile fp8_prep.cu writes.
__global__ void wgmma_fp8_kernel(const uint8_t *q, const uint8_t *k, const float *p, const uint8_t *v, float *s_out,
                                 float *o_out) {
    uint8_t *sq = smem_base(), *sk = sq + 128 * 128, *svt = sk + 128 * 128;
    for (int i = threadIdx.x; i < 128 * 128; i += blockDim.x) {
        int r = i / 128, c = i % 128;
        sq[sw128_offset_u8(r, c)] = q[i];
        sk[sw128_offset_u8(r, c)] = k[i];
        // Vᵀ row d, slot c: V[key][d] with key = the slot's key in its 32-key group.
        int key = c / 32 * 32 + fa3c_fp8_key_of_slot(c % 32);
        svt[sw128_offset_u8(r, c)] = v[key * 128 + r];
    }
    fence_proxy_async_smem();
    __syncthreads();
    int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, qd = lane % 4;
    float sc[64];
    for (int wg = 1; wg >= 0; wg--) {   // Q rows 64..127 (the second consumer's), then 0..63
        wgmma_fence();
        fp8_gemm_qk<128>(sc, sq, sk, wg);
        wgmma_commit();
        wgmma_wait<0>();
        for (int i = 0; i < 64; i++) {
            int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * qd + (i % 2);
            s_out[(64 * wg + row) * 128 + col] = sc[i];
        }
    }
    for (int i = 0; i < 64; i++) {
        int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * qd + (i % 2);
        sc[i] = p[row * 128 + col];   // P in the accumulator layout
    }
    uint32_t frag[4][4];
    fp8_probs_to_fragments(sc, frag);
    float o[64];
    for (int i = 0; i < 64; i++) o[i] = 0.f;
    wgmma_fence();
    fp8_gemm_pv<128>(o, frag, svt);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < 64; i++) {
        int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * qd + (i % 2);
        o_out[row * 128 + col] = o[i];
    }
}

TEST(wgmma_e4m3_fp8_forward_gemms) {
    REQUIRE_SM90();
    gpu_rng_seed(808);
    static uint8_t hq[128 * 128], hk[128 * 128], hv[128 * 128];
    static float hp[64 * 128], s_out[128 * 128], o_out[64 * 128];
    for (int i = 0; i < 128 * 128; i++) {
        hq[i] = fa3c_float_to_e4m3(gpu_randn());
        hk[i] = fa3c_float_to_e4m3(gpu_randn());
        hv[i] = fa3c_float_to_e4m3(gpu_randn());
    }
    for (int i = 0; i < 64 * 128; i++) hp[i] = 256.f * (float)fabs(gpu_randn()) / 4.f;   // P in [0, ~256]
    uint8_t *dq, *dk, *dv;
    float *dp, *ds, *dout;
    CUDA_OK(cudaMalloc(&dq, sizeof hq));
    CUDA_OK(cudaMalloc(&dk, sizeof hk));
    CUDA_OK(cudaMalloc(&dv, sizeof hv));
    CUDA_OK(cudaMalloc(&dp, sizeof hp));
    CUDA_OK(cudaMalloc(&ds, sizeof s_out));
    CUDA_OK(cudaMalloc(&dout, sizeof o_out));
    CUDA_OK(cudaMemcpy(dq, hq, sizeof hq, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, hk, sizeof hk, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, hv, sizeof hv, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dp, hp, sizeof hp, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(ds, 0xFF, sizeof s_out));
    CUDA_OK(cudaMemset(dout, 0xFF, sizeof o_out));
    int smem = 3 * 128 * 128 + 1024;
    CUDA_OK(cudaFuncSetAttribute(wgmma_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    wgmma_fp8_kernel<<<1, 128, smem>>>(dq, dk, dp, dv, ds, dout);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(s_out, ds, sizeof s_out, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(o_out, dout, sizeof o_out, cudaMemcpyDeviceToHost));
    double s_err = 0, o_err = 0, s_max = 0, o_max = 0;
    for (int i = 64; i < 128; i++)   // the second consumer's S rows
        for (int j = 0; j < 128; j++) {
            double s = 0;
            for (int e = 0; e < 128; e++) s += (double)fa3c_e4m3_to_float(hq[i * 128 + e]) * fa3c_e4m3_to_float(hk[j * 128 + e]);
            double es = fabs(s - s_out[i * 128 + j]);
            if (!(es <= s_err)) s_err = isnan(es) ? INFINITY : es;
            if (fabs(s) > s_max) s_max = fabs(s);
        }
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < 128; j++) {
            double s = 0, o = 0;
            for (int e = 0; e < 128; e++) s += (double)fa3c_e4m3_to_float(hq[i * 128 + e]) * fa3c_e4m3_to_float(hk[j * 128 + e]);
            for (int key = 0; key < 128; key++)   // P rounded to e4m3, as the fragments carry it
                o += (double)fa3c_e4m3_to_float(fa3c_float_to_e4m3(hp[i * 128 + key])) * fa3c_e4m3_to_float(hv[key * 128 + j]);
            double es = fabs(s - s_out[i * 128 + j]), eo = fabs(o - o_out[i * 128 + j]);
            if (!(es <= s_err)) s_err = isnan(es) ? INFINITY : es;
            if (!(eo <= o_err)) o_err = isnan(eo) ? INFINITY : eo;
            if (fabs(o) > o_max) o_max = fabs(o);
            if (fabs(s) > s_max) s_max = fabs(s);
        }
    // fp8 wgmma accumulates with less than f32's precision (DeepGEMM's notes), so the bounds are
    // relative, and loose: a wrong layout or key order gives errors the size of the values.
    printf("wgmma e4m3: S = Q K^T max abs error %.3g (max |S| %.3g); O = P V max abs error %.3g (max |O| %.3g)\n",
           s_err, s_max, o_err, o_max);
    CHECK(s_err < 5e-3 * s_max, "S: max error %g", s_err);
    CHECK(o_err < 5e-3 * o_max, "O: max error %g", o_err);
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dp); cudaFree(ds); cudaFree(dout);
}

TEST_MAIN()
