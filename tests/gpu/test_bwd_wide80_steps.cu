// The 80-key wide backward's pieces (bwd_wide_sm90.cuh with
// FA3C_BWD_HDIM256_BLOCK_N=80, whatever the library's default), one CTA of
// two warpgroups against float64, bf16 and fp16, independent of TMA and the
// pipeline:
//   gemm_rows_by_keys: S(64 queries x its 40 keys) = Q · Kᵀ on the 80-row K
//     tile (wgmma m64n40);
//   store_keys_by_rows: each warpgroup's P (64 queries x its 40 keys, the
//     wgmma accumulator layout) into the transposed buffer (a row per key);
//   gemm_key_grads: dVᵀ(its 128 head-dim columns x 80 keys) = dOᵀ · P, dO as
//     the Q / dO slot holds it;
//   gemm_wide_dq_half: dQ(64 queries x 64 columns) = P · K for both halves of
//     its 128 columns, K as the K / V tile holds it (80 rows).
// Tiles are staged with plain stores in the 128-byte swizzle (gpu_util.cuh).
#define FA3C_BWD_HDIM256_BLOCK_N 80
#include <cuda_fp16.h>
#include "gpu_util.cuh"
#include "../../src/cuda/backward/bwd_wide_sm90.cuh"

enum { D = 256, M = 64, N = 80 };
static_assert(BwdWideSmem<D>::TRANSPOSED, "this test is of the transposed (80-key) form");

extern __shared__ __align__(1024) uint8_t smem_raw[];

// Warpgroup WG's part: its S columns, P into the buffer (after both
// warpgroups' stores, the GEMMs read all 80 keys), then its dVᵀ and dQ halves
// to global memory.
template <int WG, int FP16>
__device__ void wide80_part(const float *p, uint8_t *sp, const uint8_t *sq, const uint8_t *sdo, const uint8_t *sk,
                            float *s_out, float *dvt, float *dq) {
    typedef WideShare<D, WG> S;
    const int t = threadIdx.x % 128, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
    float x[S::NK / 2];
    wgmma_fence();
    gemm_rows_by_keys<D, FP16, S::NK>(x, sq, sk, S::KEY0);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < S::NK / 2; i++)
        s_out[(16 * w + g + 8 * ((i / 2) % 2)) * N + S::KEY0 + 8 * (i / 4) + 2 * q + i % 2] = x[i];
    for (int i = 0; i < S::NK / 2; i++)   // the accumulator layout of 64 rows x 40 keys
        x[i] = p[(16 * w + g + 8 * ((i / 2) % 2)) * N + S::KEY0 + 8 * (i / 4) + 2 * q + i % 2];
    store_keys_by_rows<N, S::KEY0, S::NK, FP16>(sp, x, w);
    fence_proxy_async_smem();
    named_bar_sync(1, 256);   // both warpgroups' keys are in the buffer
    float acc[S::DV_TILES][N / 2];
    for (int tt = 0; tt < S::DV_TILES; tt++)
        for (int i = 0; i < N / 2; i++) acc[tt][i] = 0.f;
    wgmma_fence();
    gemm_key_grads<D, FP16, S::DV_TILES, S::DV_COL0>(acc, sdo, sp);
    wgmma_commit();
    wgmma_wait<0>();
    for (int tt = 0; tt < S::DV_TILES; tt++)
        for (int i = 0; i < N / 2; i++) {   // row: head-dim column within the tile, column: key
            const int col = S::DV_COL0 + 64 * tt + 16 * w + g + 8 * ((i / 2) % 2), key = 8 * (i / 4) + 2 * q + i % 2;
            dvt[col * N + key] = acc[tt][i];
        }
    float h[32];
    wgmma_fence();
    gemm_wide_dq_half<D, FP16, WG, 0>(h, sp, sk);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < 32; i++)
        dq[(16 * w + g + 8 * ((i / 2) % 2)) * D + S::DQ_COL0 + 8 * (i / 4) + 2 * q + i % 2] = h[i];
    wgmma_fence();
    gemm_wide_dq_half<D, FP16, WG, 1>(h, sp, sk);
    wgmma_commit();
    wgmma_wait<0>();
    for (int i = 0; i < 32; i++)
        dq[(16 * w + g + 8 * ((i / 2) % 2)) * D + S::DQ_COL0 + 64 + 8 * (i / 4) + 2 * q + i % 2] = h[i];
}

template <int FP16>
__global__ void wide80_kernel(const float *p, const uint16_t *qin, const uint16_t *dout, const uint16_t *k,
                              float *s_out, float *dvt, float *dq) {
    uint8_t *sq = align_1024(smem_raw), *sdo = sq + M * D * 2, *sk = sdo + M * D * 2, *sp = sk + N * D * 2;
    for (int i = threadIdx.x; i < M * D; i += blockDim.x) {
        *(uint16_t *)(sq + sw128_offset(M, i / D, i % D)) = qin[i];
        *(uint16_t *)(sdo + sw128_offset(M, i / D, i % D)) = dout[i];
    }
    for (int i = threadIdx.x; i < N * D; i += blockDim.x) *(uint16_t *)(sk + sw128_offset(N, i / D, i % D)) = k[i];
    fence_proxy_async_smem();
    __syncthreads();
    if (threadIdx.x < 128) wide80_part<0, FP16>(p, sp, sq, sdo, sk, s_out, dvt, dq);
    else wide80_part<1, FP16>(p, sp, sq, sdo, sk, s_out, dvt, dq);
}

// A value as the 16-bit type holds it: its bits, and the float it rounds to.
static uint16_t to_16(float x, int fp16, float *rounded) {
    uint16_t bits;
    if (fp16) {
        const __half h = __float2half(x);
        *rounded = __half2float(h);
        memcpy(&bits, &h, 2);
    } else {
        const __nv_bfloat16 b = __float2bfloat16(x);
        *rounded = __bfloat162float(b);
        memcpy(&bits, &b, 2);
    }
    return bits;
}

template <int FP16>
static void run_wide80(void) {
    gpu_rng_seed(80 + FP16);
    static float hp[M * N], fq[M * D], fdo[M * D], fk[N * D], sres[M * N], dvt[D * N], dq[M * D];
    static uint16_t hq[M * D], hdo[M * D], hk[N * D];
    for (int i = 0; i < M * N; i++) to_16(gpu_randn(), FP16, &hp[i]);   // P as the 16-bit buffer holds it
    for (int i = 0; i < M * D; i++) hq[i] = to_16(gpu_randn(), FP16, &fq[i]), hdo[i] = to_16(gpu_randn(), FP16, &fdo[i]);
    for (int i = 0; i < N * D; i++) hk[i] = to_16(gpu_randn(), FP16, &fk[i]);
    float *dp, *ds, *ddvt, *ddq;
    uint16_t *dq16, *ddo, *dk;
    CUDA_OK(cudaMalloc(&dp, sizeof hp));
    CUDA_OK(cudaMalloc(&dq16, sizeof hq));
    CUDA_OK(cudaMalloc(&ddo, sizeof hdo));
    CUDA_OK(cudaMalloc(&dk, sizeof hk));
    CUDA_OK(cudaMalloc(&ds, sizeof sres));
    CUDA_OK(cudaMalloc(&ddvt, sizeof dvt));
    CUDA_OK(cudaMalloc(&ddq, sizeof dq));
    CUDA_OK(cudaMemcpy(dp, hp, sizeof hp, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dq16, hq, sizeof hq, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(ddo, hdo, sizeof hdo, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, hk, sizeof hk, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(ds, 0xFF, sizeof sres));   // NaN: every element must be written
    CUDA_OK(cudaMemset(ddvt, 0xFF, sizeof dvt));
    CUDA_OK(cudaMemset(ddq, 0xFF, sizeof dq));
    const int smem = 2 * M * D * 2 + N * D * 2 + N * M * 2 + 1024;
    CUDA_OK(cudaFuncSetAttribute(wide80_kernel<FP16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    wide80_kernel<FP16><<<1, 256, smem>>>(dp, dq16, ddo, dk, ds, ddvt, ddq);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(sres, ds, sizeof sres, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(dvt, ddvt, sizeof dvt, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(dq, ddq, sizeof dq, cudaMemcpyDeviceToHost));
    double err_s = 0, err_dv = 0, err_dq = 0;
    for (int r = 0; r < M; r++)
        for (int key = 0; key < N; key++) {
            double ref = 0;   // S[q][key] = sum over columns of Q[q][c] K[key][c]
            for (int c = 0; c < D; c++) ref += (double)fq[r * D + c] * fk[key * D + c];
            const double e = fabs(ref - sres[r * N + key]);
            if (!(e <= err_s)) err_s = isnan(e) ? INFINITY : e;
        }
    for (int c = 0; c < D; c++)
        for (int key = 0; key < N; key++) {
            double ref = 0;   // dVᵀ[c][key] = sum over queries of dO[q][c] P[q][key]
            for (int r = 0; r < M; r++) ref += (double)fdo[r * D + c] * hp[r * N + key];
            const double e = fabs(ref - dvt[c * N + key]);
            if (!(e <= err_dv)) err_dv = isnan(e) ? INFINITY : e;
        }
    for (int r = 0; r < M; r++)
        for (int c = 0; c < D; c++) {
            double ref = 0;   // dQ[q][c] = sum over keys of P[q][key] K[key][c]
            for (int key = 0; key < N; key++) ref += (double)hp[r * N + key] * fk[key * D + c];
            const double e = fabs(ref - dq[r * D + c]);
            if (!(e <= err_dq)) err_dq = isnan(e) ? INFINITY : e;
        }
    printf("80-key wide backward pieces (%s), max abs error: S = Q·Kᵀ %.3g, dVᵀ = dOᵀ·P %.3g, dQ = P·K %.3g\n",
           FP16 ? "fp16" : "bf16", err_s, err_dv, err_dq);
    CHECK(err_s < 1e-3, "%s S (gemm_rows_by_keys, 40 keys per warpgroup): max error %g", FP16 ? "fp16" : "bf16", err_s);
    CHECK(err_dv < 1e-3, "%s dVᵀ (gemm_key_grads from store_keys_by_rows): max error %g", FP16 ? "fp16" : "bf16", err_dv);
    CHECK(err_dq < 1e-3, "%s dQ (gemm_wide_dq_half): max error %g", FP16 ? "fp16" : "bf16", err_dq);
    cudaFree(dp); cudaFree(dq16); cudaFree(ddo); cudaFree(dk); cudaFree(ds); cudaFree(ddvt); cudaFree(ddq);
}

TEST(bwd_wide80_store_and_gemms) {
    REQUIRE_SM90();
    run_wide80<0>();
    run_wide80<1>();
}

TEST_MAIN()
