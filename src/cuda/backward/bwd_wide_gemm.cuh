// The wide backward's GEMMs (bwd_wide_sm90.cuh): S and dP, dVᵀ and dKᵀ, dQ
// (whole or in halves), as wgmma calls on the smem tiles (bwd_wide_smem.cuh).
#pragma once
#include "wgmma.cuh"
#include "bwd_wide_smem.cuh"

// acc(64 query rows x NK keys) = X(the Q or dO slot) · Y(keys [key0, +NK)
// of the K or V tile)ᵀ; both K-major, as the forward's S = Q·Kᵀ; KD: their
// head dim (D for S, v's for dP).
template <int D, int FP16, int NK, int KD = D>
FA3C_DEVICE void gemm_rows_by_keys(float *acc, const uint8_t *x, const uint8_t *y, int key0) {
    enum { M = FA3C_BWD_BLOCK_M(D), N = FA3C_BWD_BLOCK_N(D) };
    const uint64_t x_desc = smem_desc_swizzled(smem_addr(x), 16, BWD_ATOM_BYTES, 128);
    const uint64_t y_desc = smem_desc_swizzled(smem_addr(y) + key0 * BWD_ROW_BYTES, 16, BWD_ATOM_BYTES, 128);
#pragma unroll
    for (int kk = 0; kk < KD / 16; kk++) {
        const uint32_t in_row = (kk % 4) * 32, chunk = kk / 4;
        wgmma_ss<NK, FP16>(acc, smem_desc_advance(x_desc, chunk * M * BWD_ROW_BYTES + in_row),
                           smem_desc_advance(y_desc, chunk * N * BWD_ROW_BYTES + in_row), kk > 0);
    }
}

// accᵀ(the warpgroup's head-dim columns x N keys) += X(the Q or dO slot:
// queries x columns)ᵀ · Y(P or dS: queries x keys), the contraction over the
// 64 query rows: one 64 x N tile per 64 columns, TILES of them from column
// COL0. X is MN-major; Y too as queries x keys, or K-major when TRANSPOSED
// (a row per key).
template <int D, int FP16, int TILES, int COL0>
FA3C_DEVICE void gemm_key_grads(float (*acc)[FA3C_BWD_BLOCK_N(D) / 2], const uint8_t *x, const uint8_t *y) {
    enum { M = FA3C_BWD_BLOCK_M(D), N = FA3C_BWD_BLOCK_N(D), TRANSPOSED = BwdWideSmem<D>::TRANSPOSED };
    const uint64_t y_desc = TRANSPOSED ? smem_desc_swizzled(smem_addr(y), 16, BWD_ATOM_BYTES, 128)
                                       : smem_desc_swizzled(smem_addr(y), M * BWD_ROW_BYTES, BWD_ATOM_BYTES, 128);
#pragma unroll
    for (int t = 0; t < TILES; t++) {
        const uint64_t x_desc = smem_desc_swizzled(smem_addr(x) + (COL0 / 64 + t) * M * BWD_ROW_BYTES,
                                                   M * BWD_ROW_BYTES, BWD_ATOM_BYTES, 128);
#pragma unroll
        for (int kk = 0; kk < M / 16; kk++) {
            if constexpr (TRANSPOSED)   // a k-step is 16 queries: 32 bytes of each key's row
                wgmma_ss_amn<N, FP16>(acc[t], smem_desc_advance(x_desc, kk * 16 * BWD_ROW_BYTES),
                                      smem_desc_advance(y_desc, kk * 32), 1);
            else
                wgmma_ss_mn<64, FP16>(acc[t], smem_desc_advance(x_desc, kk * 16 * BWD_ROW_BYTES),
                                      smem_desc_advance(y_desc, kk * 16 * BWD_ROW_BYTES), 1);
        }
    }
}

// dq(64 query rows x the warpgroup's DQ_N columns) = dS(queries x keys,
// K-major) · K(keys x columns, MN-major: chunks of 64 columns).
template <int D, int FP16, int WG>
FA3C_DEVICE void gemm_wide_dq(float *dq, const uint8_t *ds, const uint8_t *k) {
    typedef WideShare<D, WG> S;
    enum { N = FA3C_BWD_BLOCK_N(D) };
    const uint64_t ds_desc = smem_desc_swizzled(smem_addr(ds), 16, BWD_ATOM_BYTES, 128);
    const uint64_t k_desc = smem_desc_swizzled(smem_addr(k) + (S::DQ_COL0 / 64) * N * BWD_ROW_BYTES,
                                               N * BWD_ROW_BYTES, BWD_ATOM_BYTES, 128);
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++)
        wgmma_ss_bmn<S::DQ_N, FP16>(dq, smem_desc_advance(ds_desc, kk * 32),
                                    smem_desc_advance(k_desc, kk * 16 * BWD_ROW_BYTES), kk > 0);
}

// TRANSPOSED: half H of that, columns [DQ_COL0 + 64 H, + 64), from dS as
// stored (a row per key: MN-major, a k-step is 16 rows). Beside dKᵀ and
// dVᵀ's 160 registers of 80 keys, a whole 128-column dq does not fit.
template <int D, int FP16, int WG, int H>
FA3C_DEVICE void gemm_wide_dq_half(float *dq, const uint8_t *ds, const uint8_t *k) {
    typedef WideShare<D, WG> S;
    enum { N = FA3C_BWD_BLOCK_N(D) };
    const uint64_t ds_desc = smem_desc_swizzled(smem_addr(ds), N * BWD_ROW_BYTES, BWD_ATOM_BYTES, 128);
    const uint64_t k_desc = smem_desc_swizzled(smem_addr(k) + (S::DQ_COL0 / 64 + H) * N * BWD_ROW_BYTES,
                                               N * BWD_ROW_BYTES, BWD_ATOM_BYTES, 128);
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++)
        wgmma_ss_mn<64, FP16>(dq, smem_desc_advance(ds_desc, kk * 16 * BWD_ROW_BYTES),
                              smem_desc_advance(k_desc, kk * 16 * BWD_ROW_BYTES), kk > 0);
}
