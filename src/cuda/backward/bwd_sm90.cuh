// The FlashAttention-3 backward kernel for sm_90a (bf16 / fp16; head dims
// 64 and 128: bwd_tiles.h).
//
// One CTA owns BLOCK_N = 128 keys of one (batch, K/V head) and walks the
// query blocks (M = BLOCK_M(D) rows: 80 at hdim 128, 128 at hdim 64;
// bwd_tiles.h) that see any of them, for each query head of
// the GQA group:
//   warpgroup 0  producer: one thread loads K and V once, then streams Q,
//                dO and the rows' LSE and dsum = rowsum(dO ⊙ O) through a
//                ring of STAGES smem slots (TMA, mbarriers);
//   warpgroups 1, 2  consumers: 64 keys each. Per query block, with the
//                keys as the wgmma M dimension (so Pᵀ and dSᵀ come out of
//                the accumulators already in register-A layout):
//                  Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ          (wgmma, smem x smem)
//                  Pᵀ = exp2(Sᵀ·scale·log2e - LSE·log2e), masked to 0,
//                       under dPᵀ's GEMM
//                  dSᵀ = Pᵀ ⊙ (dPᵀ - dsum); dSᵀ -> smem
//                  dV += Pᵀ·dO                      (wgmma, A from registers)
//                  dQ = dS·K                        (wgmma, smem x smem;
//                                                    hdim 128: dQᵀ = Kᵀ·dSᵀ)
//                  dK += dSᵀ·Q, while dQ is added to an fp32 dQ in global
//                  memory: through smem and one bulk reduction per block
//                  by warp 1 (FA3C_BWD_DQ_WRITER, bwd_dq_writer), or with
//                  vector atomics (deterministic = 1: the key blocks add
//                  in a fixed order, add_dq_in_turn).
// dK and dV stay in registers for the whole walk (GQA: summed over the
// group's heads) and are written once at the end, dK scaled. bwd_prep.cu
// computes dsum and the LSE in log2 units before, and turns the fp32 dQ
// into dq after.
//
// dQ's split between the warpgroups, over all 128 keys (both warpgroups'
// dS: a named barrier), so each dQ element is added once per key block: at
// hdim 128 each takes 64 of the columns of the M query rows, as dQᵀ (M = 80
// can only be wgmma's N: gemm_dq_transposed); at hdim 64 with 128-row
// blocks each takes 64 of the query rows, all 64 columns (gemm_dq). (hdim 64
// with 64-row blocks, FA3C_BWD_HDIM64_BLOCK_M=64: each takes all columns
// over its own 64 keys, twice the atomics.)
#pragma once
#include "wgmma.cuh"
#include "softmax.cuh"   // probs_to_fragments
#include "bwd_tiles.h"
#include "bwd_common.cuh"
#include "bwd_producer.cuh"
#include "bwd_dq.cuh"

enum { BWD_N = FA3C_BWD_BLOCK_N(128) };   // keys per CTA (64 and 128 alike)

// Do the warpgroups split dQ by keys (hdim 64 with 64-row blocks), so that
// both add to the same elements? Otherwise each adds its own 64 x 64 piece
// (gemm_dq).
FA3C_HOST_DEVICE constexpr bool bwd_dq_key_split(int d, int m) { return d == 64 && m == 64; }

// Every tile is stored as D / 64 column chunks of rows x 128 B, as the TMA
// boxes land (fwd_smem.cuh's layout); dS as M / 64 chunks of 128 key rows
// of 64 queries (MN-major A of dQ = dS·K), or with dQ transposed as 2
// chunks of M query rows of 64 keys (K-major B of dQᵀ = Kᵀ·dSᵀ).
template <int D, int BM = FA3C_BWD_BLOCK_M(D)>
struct BwdSmem {
    enum { M = BM, SPLIT_DO = 0, DV = D };   // dO in the Q ring (bwd_producer); v and dO as wide as q
    enum { DQ_TRANSPOSED = FA3C_BWD_DQ_TRANSPOSED(D), DQ_REGS = DQ_TRANSPOSED ? M / 2 : 32 };
    // The writer's dQ buffers (FA3C_BWD_HDIM64_DQ_BUFFERS); with two, no
    // slack to align the base (bwd_smem_bytes).
    enum { DQ_BUFS = D == 64 && M == 128 && FA3C_BWD_WRITER_ON(D) ? FA3C_BWD_HDIM64_DQ_BUFFERS : 1 };
    enum { SMEM_SLACK = DQ_BUFS == 2 ? 0 : 1024 };
    alignas(1024) uint8_t k[BWD_N * D * 2];
    alignas(1024) uint8_t v[BWD_N * D * 2];
    alignas(1024) uint8_t q[BWD_STAGES][M * D * 2];
    alignas(1024) uint8_t dout[BWD_STAGES][M * D * 2];
    alignas(1024) uint8_t ds[2][BWD_N * M * 2];   // two buffers: one barrier per query block
    // Each slot's row 128-byte aligned, as TMA stores into smem need (80 rows: 96 floats).
    alignas(128) float lse_log2[BWD_STAGES][(M + 31) / 32 * 32];
    alignas(128) float dsum[BWD_STAGES][(M + 31) / 32 * 32];
    uint64_t kv_full;                                  // K and V landed (once)
    uint64_t full[BWD_STAGES], empty[BWD_STAGES];      // the Q / dO / LSE / dsum slots
    uint64_t landed;                                   // a step whose foreign rows the producer zeroes first
    BwdSeq seq;
    // FA3C_BWD_DQ_WRITER: the block's dQ in tile order for the writer's bulk
    // reduction, and its barriers (written / read). Last, so that the other
    // members' offsets do not depend on the knob.
    uint64_t dq_full[DQ_BUFS], dq_empty[DQ_BUFS];
    alignas(128) float dq[DQ_BUFS][FA3C_BWD_WRITER_ON(D) ? M * D : 4];
};

// ---- consumer GEMMs ----------------------------------------------------------------

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

// ---- consumer element-wise steps ---------------------------------------------------

// The columns c (query q0 + c, c in [0, cols)) that key row `key` sees,
// as c >= lo and c <= hi with lo, hi clamped to [-1, cols] (so that no
// unbounded window overflows), less 2 quad: the element loop then compares
// its constant 8 j + e against them. An empty range for keys before
// own_lo (a shifted tile's rows of the block before) and past those used.
FA3C_HOST_DEVICE void seen_columns(int key, int own_lo, int sk, int rel_lo, int rel_hi, int q0, int cols, int quad,
                                   int &lo, int &hi) {
    const bool row_ok = key >= own_lo && key < sk;
    const long long first = (long long)key - rel_hi - q0, last = (long long)key - rel_lo - q0;   // rel = key - q
    lo = row_ok ? (int)max(min(first, (long long)cols), -1ll) - 2 * quad : INT_MAX;
    hi = (int)max(min(last, (long long)cols), -1ll) - 2 * quad;
}

// The LSE or dsum of this thread's query columns 8 j + 2 quad and + 1, from
// the slot at addr.
FA3C_DEVICE float2 column_pair(uint32_t addr, int j) { return ld_shared_f32x2(addr + (8 * j + 2 * (threadIdx.x % 4)) * 4); }

// Pᵀ of this thread's elements, while dPᵀ's GEMM may still run: key rows
// key0 and key0 + 8, query columns q0 + 8 j + 2 quad (+1), their LSE from
// the slot (lse_addr). A pair the mask hides
// (seen_columns) gets a score of -inf, so ex2 gives P = 0; padding query
// rows, and rows a shifted query tile shares with the block before, have
// lse_log2 = +inf, so P = 0 there too. In place in st; with SOFTCAP (scores through softcap·tanh) P goes to
// p_frag here, and P times tanh's derivative, which dS takes once tanh's
// argument is gone, to ps as fp16 pairs (its values are in [0, 1]), pair i
// at ps[128 i]: this thread's slots in smem, as the registers at 80 query
// rows have no room for them (bwd_consumer). MASKED = false: no compares,
// for the steps tile_seen_whole passes (at hdim 64 the two compares and the
// select were about 40% of the element-wise instructions, and the step is
// issue-bound there: docs/BACKWARD.md).
template <int M, int FP16, bool SOFTCAP, bool MASKED>
FA3C_DEVICE void bwd_probs(float *st, uint32_t (*p_frag)[4], uint32_t *ps, uint32_t lse_addr,
                           const fa3c_bwd_kernel_params &p, const int lo[2], const int hi[2]) {
#pragma unroll
    for (int j = 0; j < M / 8; j++) {
        const float2 lse = column_pair(lse_addr, j);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float prob[2], slope[2] = {1.f, 1.f};
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                float score = st[i];
                if (SOFTCAP) {
                    const float t = tanh_approx(score * p.softcap_pre);
                    score = p.softcap * t;
                    slope[e] = 1.f - t * t;
                }
                float x = score * p.score_log2 - (e ? lse.y : lse.x);
                if (MASKED && !(8 * j + e >= lo[r] && 8 * j + e <= hi[r])) x = -INFINITY;
                prob[e] = ex2f(x);
                if (!SOFTCAP) st[i] = prob[e];
            }
            if (SOFTCAP) {
                p_frag[j / 2][2 * (j % 2) + r] = pack2<FP16>(prob[0], prob[1]);
                ps[128 * (2 * j + r)] = pack_f16x2(prob[0] * slope[0], prob[1] * slope[1]);
            }
        }
    }
}

// dSᵀ = Pᵀ ⊙ (dPᵀ - dsum), in place in dpt; with SOFTCAP times tanh's
// derivative (ps, bwd_probs). Masked pairs have P = 0 and a finite dP (the
// K and V rows outside the keys used are zeros in smem:
// zero_unused_key_rows), so their dS is 0.
template <int M, bool SOFTCAP>
FA3C_DEVICE void bwd_grads(float *dpt, const float *pt, const uint32_t *ps, uint32_t dsum_addr) {
#pragma unroll
    for (int j = 0; j < M / 8; j++) {
        const float2 ds = column_pair(dsum_addr, j);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float2 w;
            if (SOFTCAP) w = unpack_f16x2(ps[128 * (2 * j + r)]);
            else w = make_float2(pt[4 * j + 2 * r], pt[4 * j + 2 * r + 1]);
            dpt[4 * j + 2 * r] = w.x * (dpt[4 * j + 2 * r] - ds.x);
            dpt[4 * j + 2 * r + 1] = w.y * (dpt[4 * j + 2 * r + 1] - ds.y);
        }
    }
}

// With softcap below 80 query rows, both in one pass after both GEMMs
// (tanh's derivative joins dS), which at 80 rows ptxas could not fit without
// serializing the wgmmas (C7512); 80 rows take bwd_probs' form. Pᵀ and dSᵀ of this thread's elements, in place: key rows key0 and
// key0 + 8, query columns q0 + 8 j + 2 quad (+1). P = 0 where the row does
// not see the column (seen_columns); padding query rows, and rows a shifted
// query tile shares with the block before, have lse_log2 = +inf, so P = 0
// there too. SOFTCAP: scores through softcap·tanh, and dS times tanh's
// derivative.
template <int M, bool SOFTCAP>
FA3C_DEVICE void probs_and_grads(float *st, float *dpt, const float *lse_log2, const float *dsum,
                                 const fa3c_bwd_kernel_params &p, const int lo[2], const int hi[2]) {
    const int quad = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < M / 8; j++) {
        const int col = 8 * j + 2 * quad;
        const float2 lse = *(const float2 *)&lse_log2[col], ds = *(const float2 *)&dsum[col];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                const bool seen = 8 * j + e >= lo[r] && 8 * j + e <= hi[r];
                float score = st[i], slope = 1.f;
                if (SOFTCAP) {
                    const float t = tanh_approx(score * p.softcap_pre);
                    score = p.softcap * t;
                    slope = 1.f - t * t;
                }
                const float prob = seen ? ex2f(score * p.score_log2 - (e ? lse.y : lse.x)) : 0.f;
                const float grad = prob * (dpt[i] - (e ? ds.y : ds.x));
                st[i] = prob;
                dpt[i] = !seen ? 0.f : SOFTCAP ? grad * slope : grad;   // V rows past the keys used may be NaN
            }
    }
}

// This warp's 16 key rows of dSᵀ (A fragments, 16-bit; M queries) into
// the dS buffer, 8x8 matrices at a time: fragment register j of k-step kk
// is the matrix of rows 8 (j % 2).., columns 16 kk + 8 (j / 2)..
// (probs_to_fragments); columns past 64 go to the next chunk. The row is
// opaque to ptxas: it hoisted the addresses out of the loop over query
// blocks and spilled one at hdim 128 (softcap's registers).
template <int M>
FA3C_DEVICE void store_ds(uint8_t *ds, uint32_t (*frag)[4], int wg, int warp) {
    const int lane = threadIdx.x % 32;
    const int row = (int)opaque_u32(wg * 64 + warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8);
#pragma unroll
    for (int kk = 0; kk < M / 16; kk++)
        stmatrix_x4(swizzled_unit<128>(ds, BWD_N, row, 2 * kk + lane / 16), frag[kk][0], frag[kk][1], frag[kk][2],
                    frag[kk][3]);
}

// With dQ transposed (hdim 128): the same, transposed, into a dS buffer of
// M query rows per 64-key chunk: the 8x8 matrices stored transposed, so
// that lane l addresses query 16 kk + 8 (l / 16) + l % 8 at this warp's keys
// (8 of them per 16-byte unit: unit 2 warp + (l / 8) % 2 of chunk wg).
template <int M>
FA3C_DEVICE void store_ds_by_queries(uint8_t *ds, uint32_t (*frag)[4], int wg, int warp) {
    const int lane = threadIdx.x % 32;
    const int unit = (int)opaque_u32(wg * 8 + warp * 2 + (lane / 8) % 2), query = lane % 8 + 8 * (lane / 16);
#pragma unroll
    for (int kk = 0; kk < M / 16; kk++)
        stmatrix_x4_trans(swizzled_unit<128>(ds, M, 16 * kk + query, unit), frag[kk][0], frag[kk][1], frag[kk][2],
                          frag[kk][3]);
}

// FA3C_BWD_DQ_WRITER: this thread's REGS dQ values (one warpgroup's piece
// of the block's tile, fa3c_bwd_dq_tile_offset) into sm.dq (the writer's
// buffer; the caller waited for it to be free), then this warp's arrival
// on dq_full.
template <int REGS>
FA3C_DEVICE void put_dq_tiled(float *buf, uint64_t *dq_full, const float *dq, int piece) {
    float *dst = buf + piece * 128 * REGS + (threadIdx.x % 128) * 4;
#pragma unroll
    for (int k = 0; k < REGS / 4; k++)
        st_shared_f32x4(dst + k * 512, dq[4 * k], dq[4 * k + 1], dq[4 * k + 2], dq[4 * k + 3]);
    fence_proxy_async_smem();   // the bulk reduction reads it through the async proxy
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(dq_full);
}

// Deterministic dQ (p.dq_semaphore): wait until the key blocks before this
// one that see query block m have added theirs, add (where both warpgroups
// add to the same elements, hdim 64 with 64-row blocks, warpgroup 0
// first), then count this one in. Key block n waits only for lower n of its (head, batch): CTAs
// that start earlier (lower blockIdx.x, fa3c_bwd_tile_of_cta) and wait only for lower
// ones still, so the chain always ends in a CTA that can go on (FA3 relies
// on the same launch order). One thread spins and releases; the named
// barrier carries its acquire to the others and their adds to its release.
template <int D, int M>
FA3C_DEVICE void add_dq_in_turn(const fa3c_bwd_kernel_params &p, const float *dq, int n_block, int batch, int head,
                                int m, int rel_lo, int wg) {
    enum { KEY_SPLIT = bwd_dq_key_split(D, M), REGS = BwdSmem<D, M>::DQ_REGS };
    int *sem = p.dq_semaphore + ((int64_t)batch * p.heads_q + head) * p.num_m_blocks + m;
    const bool leader = threadIdx.x == 128;   // the first thread of consumer warpgroup 0
    if (leader) wait_counter_at_least(sem, n_block - first_key_block(rel_lo, m, M, BWD_N));
    named_bar_sync(BAR_BWD_DQ_TURN, 128 * FA3C_BWD_CONSUMERS);
    float *tile = bwd_dq_tile<D, M>(p, batch, head, m);
    if (KEY_SPLIT) {
        if (wg == 0) add_dq_tiled<REGS>(tile, dq, 0);
        named_bar_sync(BAR_BWD_DQ_TURN, 128 * FA3C_BWD_CONSUMERS);
        if (wg == 1) add_dq_tiled<REGS>(tile, dq, 0);
    } else {
        add_dq_tiled<REGS>(tile, dq, wg);
    }
    named_bar_sync(BAR_BWD_DQ_TURN, 128 * FA3C_BWD_CONSUMERS);
    if (leader) {
        __threadfence();
        red_release_gpu_add(sem, 1);
    }
}

// acc(64 keys x D) * scale to this thread's key rows key0, key0 + 8 of
// `out` (16-bit; element strides, all even): those in [own_lo, sk_stored),
// at token tok0 + key (packed sequences: `batch` is 0 then), its first
// `cols` columns (the tensors' head dim: 96 of hdim 128's kernel).
template <int D, int FP16>
FA3C_DEVICE void store_key_rows(void *out, const int64_t *stride, const float *acc, float scale, int batch,
                                int head_kv, int tok0, int key0, int own_lo, int sk_stored, int cols) {
    const int quad = threadIdx.x % 4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + 8 * r;
        if (key < own_lo || key >= sk_stored) continue;
        uint16_t *row = (uint16_t *)out + batch * stride[0] + (int64_t)(tok0 + key) * stride[1] + head_kv * stride[2] +
                        2 * quad;
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            if (8 * j >= cols) continue;   // a narrower head dim: its columns only
            const float x = acc[4 * j + 2 * r] * scale, y = acc[4 * j + 2 * r + 1] * scale;
            *(uint32_t *)(row + 8 * j) = FP16 ? pack_f16x2(x, y) : pack_bf16x2(x, y);
        }
    }
}

// FA3C_BWD_STAGED_EPILOGUE: acc(64 keys x D) * scale as 16-bit values into
// this warpgroup's 64 rows of `tile` (the K or V tile's layout: D / 64
// chunks of BWD_N rows x 128 B, swizzled), 8x8 matrices at a time; then
// out to dk or dv with write_staged_rows (bwd_common.cuh).
template <int D, int FP16>
FA3C_DEVICE void stage_key_rows(uint8_t *tile, float *acc, float scale, int wg, int warp) {
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc[i] *= scale;
    uint32_t frag[D / 16][4];
    probs_to_fragments<D, FP16>(acc, frag);
    store_ds<D>(tile, frag, wg, warp);
}

// ---- consumer ----------------------------------------------------------------------

// Step it's Sᵀ = K·Qᵀ for this warpgroup's 64 keys, once its slot has
// landed: one commit group.
template <int D, int M, int FP16>
FA3C_DEVICE void issue_scores(float *st, BwdSmem<D, M> &sm, int it, int wg) {
    const int s = it % BWD_STAGES;
    mbar_wait_parity(&sm.full[s], (it / BWD_STAGES) & 1);
    wgmma_fence();
    gemm_keys_by_rows<D, M, FP16>(st, sm.k, sm.q[s], wg);
    wgmma_commit();
}

// Does every key row k_start + [0, keys) see every query column q0 + [0,
// cols) (seen_columns' terms)? No keys before own_lo (a shifted tile's rows
// of the block before) or from sk on, and every (key, query) pair inside the
// band [rel_lo, rel_hi]. Padding query rows need no mask: their P is 0
// through LSE = +inf. Then the step needs no compares (bwd_step).
FA3C_HOST_DEVICE bool tile_seen_whole(int k_start, int keys, int own_lo, int sk, int rel_lo, int rel_hi, int q0,
                                      int cols) {
    const long long k0 = k_start, k1 = k0 + keys - 1, q1 = (long long)q0 + cols - 1;
    return k0 >= own_lo && k1 < sk && k1 - q0 <= rel_hi && k0 - q1 >= rel_lo;
}

// One step of the walk (query block m of head `head`), in FA3's order, so
// that element-wise work and the dQ handoff run under the tensor cores' GEMMs:
//   Sᵀ, dPᵀ issued (two groups); Pᵀ once Sᵀ is done, under dPᵀ's GEMM; dSᵀ;
//   dSᵀ to smem; dV issued; the barrier (both warpgroups' dSᵀ in smem);
//   dQ issued, then dK once dV is done (its P fragments are free);
//   dQ handed on (writer, atomics or in turn) under dK's GEMM;
//   the slot released once dK has read Q.
// MASKED: Pᵀ compares each element against the mask; a copy without the
// compares takes the steps tile_seen_whole passes.
template <int D, int M, int FP16, bool SOFTCAP, bool MASKED>
FA3C_DEVICE void bwd_step(const fa3c_bwd_kernel_params &p, BwdSmem<D, M> &sm, int it, int m, int head, int n_block,
                          int batch, int wg, int warp, int lane, float *dk, float *dv) {
    enum { DQ_TRANSPOSED = BwdSmem<D, M>::DQ_TRANSPOSED, DQ_REGS = BwdSmem<D, M>::DQ_REGS };
    // Softcap at 80 rows: tanh's work beside both score accumulators in flight
    // spilled (ptxas), so dPᵀ is issued once Pᵀ is done, and P·tanh' waits for
    // it in smem (bwd_probs) rather than in registers.
    constexpr bool SOFTCAP_80 = SOFTCAP && M == 80;
    const int row_in_tile = wg * 64 + warp * 16 + lane / 4;   // this thread's key rows: this and + 8
    const int s = it % BWD_STAGES;

    // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for this warpgroup's 64 keys, two commit groups.
    float st[M / 2], dpt[M / 2];
    issue_scores<D, M, FP16>(st, sm, it, wg);
    if (!SOFTCAP_80) {
        wgmma_fence();
        gemm_keys_by_rows<D, M, FP16>(dpt, sm.v, sm.dout[s], wg);
        wgmma_commit();
    }

    // Which elements this thread's rows see (seen_columns).
    const int sq = BWD_SEQ(sm, sq), q0 = fa3c_bwd_rows_start(m, M, sq, BWD_SEQ(sm, q_shifted));
    const int rel_lo = BWD_SEQ(sm, rel_lo);
    int lo[2] = {0, 0}, hi[2] = {M, M};
    if (MASKED) {
        const int key0 = BWD_SEQ(sm, k_start) + row_in_tile, own_lo = n_block * BWD_N, quad = lane % 4;
        const int sk = BWD_SEQ(sm, sk), rel_hi = BWD_SEQ(sm, rel_hi);
        seen_columns(key0, own_lo, sk, rel_lo, rel_hi, q0, M, quad, lo[0], hi[0]);
        seen_columns(key0 + 8, own_lo, sk, rel_lo, rel_hi, q0, M, quad, lo[1], hi[1]);
    }

    // Pᵀ under dPᵀ's GEMM, then dSᵀ. (dV issued between the two, so that
    // dSᵀ runs under its GEMM, measured no faster.)
    uint32_t p_frag[M / 16][4], ds_frag[M / 16][4];
    if constexpr (SOFTCAP && !SOFTCAP_80) {
        wgmma_wait<0>();
        bwd_fence_regs<M / 2>(st);
        bwd_fence_regs<M / 2>(dpt);
        probs_and_grads<M, true>(st, dpt, sm.lse_log2[s], sm.dsum[s], p, lo, hi);
        probs_to_fragments<M, FP16>(st, p_frag);
    } else {
        // With softcap, P·tanh' in this warpgroup's chunk of the step's dS buffer,
        // free until the dS stores below (after a barrier of the warpgroup).
        uint32_t *ps = (uint32_t *)(sm.ds[it % 2] + wg * M * BWD_ROW_BYTES) + threadIdx.x % 128;
        const uint32_t lse_addr = smem_addr(sm.lse_log2[s]), dsum_addr = smem_addr(sm.dsum[s]);
        wgmma_wait<SOFTCAP_80 ? 0 : 1>();
        bwd_fence_regs<M / 2>(st);
        bwd_probs<M, FP16, SOFTCAP, MASKED>(st, p_frag, ps, lse_addr, p, lo, hi);
        if (SOFTCAP_80) {
            wgmma_fence();
            gemm_keys_by_rows<D, M, FP16>(dpt, sm.v, sm.dout[s], wg);
            wgmma_commit();
        }
        if (!SOFTCAP) probs_to_fragments<M, FP16>(st, p_frag);
        wgmma_wait<0>();
        bwd_fence_regs<M / 2>(dpt);
        bwd_grads<M, SOFTCAP>(dpt, st, ps, dsum_addr);
    }

    // dSᵀ to smem for dQ = dS·K, before the wgmma that reads ds_frag is
    // issued (an in-flight wgmma's registers are not to be touched).
    // Buffer it % 2: the barrier of step it - 1 came after both
    // warpgroups' dQ(it - 2) was complete.
    uint8_t *ds = sm.ds[it % 2];
    probs_to_fragments<M, FP16>(dpt, ds_frag);
    if (SOFTCAP_80) named_bar_sync(BAR_BWD_STAGED + wg, 128);   // its ps read (bwd_grads)
    if (DQ_TRANSPOSED) store_ds_by_queries<M>(ds, ds_frag, wg, warp);
    else store_ds<M>(ds, ds_frag, wg, warp);
    fence_proxy_async_smem();
    wgmma_fence();
    gemm_accumulate_rows<D, M, FP16>(dv, p_frag, sm.dout[s]);
    wgmma_commit();
    named_bar_sync(BAR_BWD_DS_READY, 128 * FA3C_BWD_CONSUMERS);
    // At M = 80 dV is waited for before dQ's GEMM is issued (1-3% faster
    // at 1k-16k than after, when P's and dS's fragments and dQ's
    // accumulators are live together: docs/KNOBS.md).
    constexpr bool DV_BEFORE_DQ = M == 80;
    if (DV_BEFORE_DQ) wgmma_wait<0>();
    float dq[DQ_REGS];
    wgmma_fence();
    if constexpr (DQ_TRANSPOSED) gemm_dq_transposed<M, FP16>(dq, ds, sm.k, wg);
    else gemm_dq<D, M, FP16>(dq, ds, sm.k, wg);
    wgmma_commit();
    if (!DV_BEFORE_DQ) wgmma_wait<1>();   // dV is done: p_frag is free
    wgmma_fence();
    gemm_accumulate_rows<D, M, FP16>(dk, ds_frag, sm.q[s]);
    wgmma_commit();
    wgmma_wait<1>();   // dQ is done; dK runs on
    bwd_fence_regs<DQ_REGS>(dq);

    // dQ added under dK's GEMM.
    if (p.dq_semaphore) {
        add_dq_in_turn<D, M>(p, dq, n_block, batch, head, m, rel_lo, wg);
    } else if (FA3C_BWD_WRITER_ON(D)) {   // buffer b is free once the writer has read step it - DQ_BUFS's
        enum { BUFS = BwdSmem<D, M>::DQ_BUFS };
        const int b = it % BUFS;
        if (it >= BUFS) mbar_wait_parity(&sm.dq_empty[b], (it / BUFS - 1) & 1);
        put_dq_tiled<DQ_REGS>(sm.dq[b], &sm.dq_full[b], dq, wg);
    } else {
        add_dq_tiled<DQ_REGS>(bwd_dq_tile<D, M>(p, batch, head, m), dq, bwd_dq_key_split(D, M) ? 0 : wg);
    }

    wgmma_wait<0>();
    // dK has read Q: the slot's Q, dO, LSE and dsum are free.
    __syncwarp();
    if (lane == 0) mbar_arrive(&sm.empty[s]);
}

// The walk of consumer warpgroup wg, then its dK and dV out. SOFTCAP:
// p.softcap != 0, a copy of its own, picked once per CTA rather than
// branched on inside the loop.
template <int D, int M, int FP16, bool SOFTCAP>
FA3C_DEVICE void bwd_consumer(const fa3c_bwd_kernel_params &p, BwdSmem<D, M> &sm, int n_block, int head_kv, int batch,
                              int wg) {
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int row_in_tile = wg * 64 + warp * 16 + lane / 4;   // this thread's key rows: this and + 8
    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = dv[i] = 0.f;
    if (BWD_SEQ(sm, m_begin) < BWD_SEQ(sm, m_end)) {
        mbar_wait_parity(&sm.kv_full, 0);
        if (p.seqused_k || p.cu_seqlens_k) {   // both warpgroups' zeros before any wgmma reads the tiles
            zero_unused_key_rows<D, BWD_N>(sm.k, sm.v, BWD_SEQ(sm, k_start), BWD_SEQ(sm, sk), wg * 64, 64);
            named_bar_sync(BAR_BWD_DS_READY, 128 * FA3C_BWD_CONSUMERS);
        }
    }
    // One walk over (head of the group, query block), the producer's order.
    // The sequence's fields come from smem at each step: registers are full.
    const int m_begin = BWD_SEQ(sm, m_begin), m_end = BWD_SEQ(sm, m_end), steps = p.group * (m_end - m_begin);
    int m = BWD_SEQ(sm, m_first), head = head_kv * p.group;
    for (int it = 0; it < steps; it++) {
        // A step whose every element the CTA's keys see needs no mask
        // compares (bwd_step, FA3C_BWD_UNMASKED_STEPS(D)): without a mask or
        // window every step but a sequence's last key block's, under a causal
        // mask every step off the diagonal.
        bool whole = false;
        if (!SOFTCAP && FA3C_BWD_UNMASKED_STEPS(D)) {
            const int q0 = fa3c_bwd_rows_start(m, M, BWD_SEQ(sm, sq), BWD_SEQ(sm, q_shifted));
            whole = tile_seen_whole(BWD_SEQ(sm, k_start), BWD_N, n_block * BWD_N, BWD_SEQ(sm, sk),
                                    BWD_SEQ(sm, rel_lo), BWD_SEQ(sm, rel_hi), q0, M);
        }
        if (!whole)
            bwd_step<D, M, FP16, SOFTCAP, true>(p, sm, it, m, head, n_block, batch, wg, warp, lane, dk, dv);
        else if constexpr (!SOFTCAP)
            bwd_step<D, M, FP16, SOFTCAP, false>(p, sm, it, m, head, n_block, batch, wg, warp, lane, dk, dv);
        if (++m == m_end) m = m_begin;   // the walk wraps (bwd_walk_start)
        if (m == BWD_SEQ(sm, m_first)) head++;
    }
    bwd_fence_regs<D / 2>(dk);
    bwd_fence_regs<D / 2>(dv);
    const int key0 = BWD_SEQ(sm, k_start) + row_in_tile, own_lo = n_block * BWD_N, sk_stored = BWD_SEQ(sm, sk_stored);
    const int k_batch = BWD_SEQ(sm, k_batch), k_tok0 = BWD_SEQ(sm, k_tok0);
    if (FA3C_BWD_STAGED_EPILOGUE && p.dkv_vec16) {
        // Both warpgroups' GEMMs read every row of K (dQ) and their own of V: once
        // both are done, the tiles take this warpgroup's dK and dV rows.
        named_bar_sync(BAR_BWD_DS_READY, 128 * FA3C_BWD_CONSUMERS);
        stage_key_rows<D, FP16>(sm.k, dk, p.softmax_scale, wg, warp);
        stage_key_rows<D, FP16>(sm.v, dv, 1.f, wg, warp);
        named_bar_sync(BAR_BWD_STAGED + wg, 128);
        const int k_start = BWD_SEQ(sm, k_start);
        write_staged_rows<BWD_N, 64, D / 8>(p.dk, p.dk_stride, sm.k, wg * 64, 0, k_batch, head_kv, k_tok0, k_start,
                                            own_lo, sk_stored, p.headdim);
        write_staged_rows<BWD_N, 64, D / 8>(p.dv, p.dv_stride, sm.v, wg * 64, 0, k_batch, head_kv, k_tok0, k_start,
                                            own_lo, sk_stored, p.headdim_v);
        return;
    }
    store_key_rows<D, FP16>(p.dk, p.dk_stride, dk, p.softmax_scale, k_batch, head_kv, k_tok0, key0, own_lo, sk_stored,
                            p.headdim);
    store_key_rows<D, FP16>(p.dv, p.dv_stride, dv, 1.f, k_batch, head_kv, k_tok0, key0, own_lo, sk_stored, p.headdim_v);
}

// ---- the kernel --------------------------------------------------------------------

// Grid: 1-D, p.num_n_blocks x heads_kv x batch CTAs (fa3c_bwd_tile_of_cta).
// M: the query block's rows (bwd_tiles.h: FA3C_BWD_BLOCK_M(D), or at hdim 128
// 64 for the calls FA3C_BWD_HDIM128_SHORT_M64 gives them). FORM: which
// consumers it has, BWD_PLAIN and BWD_SOFTCAP (p.softcap != 0) each alone, or
// BWD_EITHER, both, picked per CTA. ptxas fits them to the registers apart at
// 80 rows (together, the unmasked steps made it spill softcap's) and together
// at 64 and 128 (hdim 64's softcap kernel on its own spilled).
enum { BWD_PLAIN, BWD_SOFTCAP, BWD_EITHER };
template <int D, int FP16, int M = FA3C_BWD_BLOCK_M(D), int FORM = BWD_EITHER>
__global__ void __launch_bounds__(FA3C_BWD_THREADS, 1) bwd_kernel(const __grid_constant__ fa3c_bwd_kernel_params p) {
    static_assert(D == 64 || D == 128, "this kernel: head dims 64 and 128 (96 on 128's)");
    static_assert(128 * FA3C_BWD_PRODUCER_REGS + 128 * FA3C_BWD_CONSUMERS * FA3C_BWD_CONSUMER_REGS <= 65536,
                  "setmaxnreg budgets past the register file");
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    if (BwdSmem<D, M>::SMEM_SLACK == 0 && smem_addr(smem_raw) % 1024 != 0) __trap();   // bwd_smem_bytes kept no slack
    BwdSmem<D, M> &sm = *(BwdSmem<D, M> *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    int n_block, head_kv, batch;
    fa3c_bwd_tile_of_cta(blockIdx.x, p.num_n_blocks, p.heads_kv, p.batch, p.section, &n_block, &head_kv, &batch);

    if (threadIdx.x == 0) {
        bwd_cta_init<D>(p, sm, n_block, batch);
        if (FA3C_BWD_WRITER_ON(D))
            for (int b = 0; b < BwdSmem<D, M>::DQ_BUFS; b++) {
                mbar_init(&sm.dq_full[b], 4 * FA3C_BWD_CONSUMERS);   // one per consumer warp
                mbar_init(&sm.dq_empty[b], 1);                       // the writer
            }
        fence_barrier_init();
    }
    __syncthreads();
    if (n_block * BWD_N >= BWD_SEQ(sm, sk_stored)) return;   // a shorter sequence's key blocks end before this one

    const int warpgroup = __shfl_sync(~0u, threadIdx.x / 128, 0);   // warpgroup-uniform, as setmaxnreg requires
    if (warpgroup == 0) {
        reg_dealloc<FA3C_BWD_PRODUCER_REGS>();
        if (threadIdx.x == 0) bwd_producer<D>(p, sm, head_kv, batch);
        else if (FA3C_BWD_WRITER_ON(D) && threadIdx.x == 32) bwd_dq_writer<D>(p, sm, head_kv, batch);
    } else {
        reg_alloc<FA3C_BWD_CONSUMER_REGS>();
        if (FORM == BWD_SOFTCAP || (FORM == BWD_EITHER && p.softcap != 0.f))
            bwd_consumer<D, M, FP16, true>(p, sm, n_block, head_kv, batch, warpgroup - 1);
        else
            bwd_consumer<D, M, FP16, false>(p, sm, n_block, head_kv, batch, warpgroup - 1);
    }
}

// Dynamic smem a launch needs (the slack lets the kernel align the base).
template <int D, int M = FA3C_BWD_BLOCK_M(D)>
static size_t bwd_smem_bytes(void) {
    enum { BYTES = sizeof(BwdSmem<D, M>) + BwdSmem<D, M>::SMEM_SLACK };
    static_assert(BYTES <= 227 * 1024, "the backward kernel's smem exceeds what a block may use");
    return BYTES;
}
