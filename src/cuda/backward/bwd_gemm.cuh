// The narrow backward's GEMMs (bwd_sm90.cuh): Sᵀ and dPᵀ, dV and dK, dQ or
// dQᵀ, as wgmma calls on the smem tiles (bwd_smem.cuh) and register fragments.
#pragma once
#include "wgmma.cuh"
#include "bwd_smem.cuh"

// acc(64 keys x M queries) = X(this warpgroup's 64 rows of the K or V
// tile) · Y(the Q or dO slot)ᵀ; both K-major, as the forward's S = Q·Kᵀ.
template <int D, int M, int FP16>
FA3C_DEVICE void gemm_keys_by_rows(float *acc, const uint8_t *x, const uint8_t *y, int wg) {
    const uint64_t x_desc = smem_desc_swizzled(smem_addr(x) + wg * 64 * BWD_ROW_BYTES, 16, BWD_ATOM_BYTES, 128);
    const uint64_t y_desc = smem_desc_swizzled(smem_addr(y), 16, BWD_ATOM_BYTES, 128);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t in_row = (kk % 4) * 32, chunk = kk / 4;
        wgmma_ss<M, FP16>(acc, smem_desc_advance(x_desc, chunk * BWD_N * BWD_ROW_BYTES + in_row),
                          smem_desc_advance(y_desc, chunk * M * BWD_ROW_BYTES + in_row), kk > 0);
    }
}

// acc(64 keys x D) += A(64 keys x M queries, registers) · Y(the Q or dO
// slot, M x D, MN-major: a k-step is 16 rows), as the forward's O += P·V.
template <int D, int M, int FP16>
FA3C_DEVICE void gemm_accumulate_rows(float *acc, uint32_t (*a_frag)[4], const uint8_t *y) {
    const uint64_t y_desc = smem_desc_swizzled(smem_addr(y), M * BWD_ROW_BYTES, BWD_ATOM_BYTES, 128);
#pragma unroll
    for (int kk = 0; kk < M / 16; kk++)
        wgmma_rs<D, FP16>(acc, a_frag[kk], smem_desc_advance(y_desc, kk * 16 * BWD_ROW_BYTES), 1);
}

// hdim 64: dq(64 queries x 64 columns) = dS(queries x keys) · K(keys x
// columns), both read MN-major from smem: dS as stored (a row per key, a
// chunk per 64 queries), K as loaded. The split (M: the query block's rows):
//   M = 128: queries [64 wg, + 64) (dS's chunk wg), all columns and keys;
//   M = 64: all queries and columns over keys [64 wg, + 64).
template <int D, int M, int FP16>
FA3C_DEVICE void gemm_dq(float *dq, const uint8_t *ds, const uint8_t *k, int wg) {
    static_assert(D == 64, "hdim 128 computes dQ transposed (gemm_dq_transposed)");
    enum { KEY_SPLIT = bwd_dq_key_split(D, M), KEYS = KEY_SPLIT ? 64 : BWD_N };
    const int ds_chunk = M == 128 ? wg : 0, key0 = KEY_SPLIT ? wg * 64 : 0;
    // M and N are one 64-element chunk each, so the leading offsets are never used.
    const uint64_t ds_desc = smem_desc_swizzled(smem_addr(ds) + (ds_chunk * BWD_N + key0) * BWD_ROW_BYTES,
                                                BWD_N * BWD_ROW_BYTES, BWD_ATOM_BYTES, 128);
    const uint64_t k_desc = smem_desc_swizzled(smem_addr(k) + key0 * BWD_ROW_BYTES,
                                               BWD_N * BWD_ROW_BYTES, BWD_ATOM_BYTES, 128);
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; kk++)
        wgmma_ss_mn<64, FP16>(dq, smem_desc_advance(ds_desc, kk * 16 * BWD_ROW_BYTES),
                              smem_desc_advance(k_desc, kk * 16 * BWD_ROW_BYTES), kk > 0);
}

// dqt(64 columns x M queries) = Kᵀ(columns [64 wg, + 64) x 128 keys: K's
// chunk wg, MN-major) · dSᵀ(128 keys x M queries: dS stored by query rows,
// K-major), over all 128 keys: the hdim-128 kernel's dQ (DQ_TRANSPOSED).
template <int M, int FP16>
FA3C_DEVICE void gemm_dq_transposed(float *dqt, const uint8_t *ds, const uint8_t *k, int wg) {
    const uint64_t k_desc = smem_desc_swizzled(smem_addr(k) + wg * BWD_N * BWD_ROW_BYTES, BWD_N * BWD_ROW_BYTES,
                                               BWD_ATOM_BYTES, 128);
    const uint64_t ds_desc = smem_desc_swizzled(smem_addr(ds), 16, BWD_ATOM_BYTES, 128);
#pragma unroll
    for (int kk = 0; kk < BWD_N / 16; kk++) {
        const uint32_t in_row = (kk % 4) * 32, chunk = kk / 4;
        wgmma_ss_amn<M, FP16>(dqt, smem_desc_advance(k_desc, kk * 16 * BWD_ROW_BYTES),
                              smem_desc_advance(ds_desc, chunk * M * BWD_ROW_BYTES + in_row), kk > 0);
    }
}
