// The FlashAttention-3 backward kernel for the wide head dims 192 and 256
// (sm_90a; bf16 / fp16; bwd_tiles.h). The narrow head dims' kernel
// (bwd_sm90.cuh) keeps 64 keys' dK and dV per warpgroup in registers: at
// hdim 256 that is 256 registers per thread. Here one CTA owns N = 64 keys
// (80 at hdim 256, FA3C_BWD_HDIM256_BLOCK_N: BwdWideSmem's TRANSPOSED and
// SPLIT_DO forms) of one (batch, K/V head) and walks the
// query blocks of M = 64 rows that see them, for each query head of the
// GQA group (bwd_common.cuh):
//   warpgroup 0  producer: K and V once, then Q, dO, LSE and dsum per step
//                through a ring of STAGES slots (bwd_producer);
//   warpgroups 1, 2  consumers. Per query block, warpgroup w:
//                  S = Q·Kᵀ, dP = dO·Vᵀ for its N / 2 keys (wgmma, 64 x N / 2)
//                  P = exp2(S·scale·log2e - LSE·log2e), masked to 0
//                  dS = P ⊙ (dP - dsum)
//                  P and dS to smem (queries x keys), a barrier, then over
//                  all 64 keys and its share of the head-dim columns:
//                  dQ = dS·K                            (to an fp32 accumulator in
//                                                        global memory: at hdim 192
//                                                        through smem and the writer,
//                                                        bwd_dq_writer; at 256 with
//                                                        vector atomics)
//                  dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS           (wgmma, both operands from smem)
// dKᵀ and dVᵀ stay in registers for the whole walk (GQA: summed over the
// group's heads), split by head-dim columns: warpgroup 0 holds columns
// 0-127, warpgroup 1 the rest (128-255, or 128-191 at hdim 192); dQ's
// columns are split the other way round (warpgroup 1 the last 128), so at
// hdim 192 the two warpgroups' GEMM work is 8 : 7 (with a v of 128 for
// MLA, template DV, dV's columns split 64 / 64: WideShare). They are
// written once at the end, dK scaled.
#pragma once
#include "wgmma.cuh"
#include "softmax.cuh"   // probs_to_fragments
#include "bwd_common.cuh"
#include "bwd_producer.cuh"
#include "bwd_dq.cuh"

// DV_: v's and dout's head dim, D but for MLA prefill's 128 at D = 192
// (WideShare): their tiles DV_ columns wide.
template <int D, int DV_ = D>
struct BwdWideSmem {
    enum {
        M = FA3C_BWD_BLOCK_M(D), N = FA3C_BWD_BLOCK_N(D), DV = DV_,
        // hdim 256's 80 keys (bwd_tiles.h): P and dS transposed, and one dO
        // stage (its own ring, bwd_producer), or they would not fit
        TRANSPOSED = N == 80, SPLIT_DO = N == 80, DO_STAGES = SPLIT_DO ? 1 : BWD_STAGES,
        DQ_BUFS = 1   // the writer's dQ buffers (bwd_dq_writer)
    };
    alignas(1024) uint8_t k[N * D * 2];
    alignas(1024) uint8_t v[N * DV * 2];
    alignas(1024) uint8_t q[BWD_STAGES][M * D * 2];
    alignas(1024) uint8_t dout[DO_STAGES][M * DV * 2];
    // P and dS, M query rows x N keys (one 128-byte chunk), or TRANSPOSED
    // N key rows x M queries, two buffers each: both warpgroups read both
    // halves, and one barrier per step orders step it's writes after step
    // it - 2's reads.
    alignas(1024) uint8_t p[2][M * N * 2];
    alignas(1024) uint8_t ds[2][M * N * 2];
    alignas(128) float lse_log2[BWD_STAGES][M];
    alignas(128) float dsum[BWD_STAGES][M];
    uint64_t kv_full;                                  // K and V landed (once)
    uint64_t full[BWD_STAGES], empty[BWD_STAGES];      // the Q / dO / LSE / dsum slots
    uint64_t landed;                                   // a step whose foreign rows the producer zeroes first
    BwdSeq seq;
    // With the writer (FA3C_BWD_WRITER_ON: hdim 192), the block's dQ in
    // tile order for it (bwd_dq_writer), and its barriers (written / read).
    uint64_t dq_full[DQ_BUFS], dq_empty[DQ_BUFS];
    alignas(128) float dq[DQ_BUFS][FA3C_BWD_WRITER_ON(D) ? M * D : 4];
    uint64_t do_full, do_empty;   // SPLIT_DO: dO's one slot
};

// What consumer warpgroup WG computes (compile-time, so that its
// accumulators are register arrays of fixed size). With v's head dim DV =
// 128 at D = 192 (MLA prefill) dV's columns split 64 / 64, so that with dK's
// 128 / 64 and dQ's 64 / 128 both warpgroups do four 64-column tiles.
template <int D, int WG, int DV = D>
struct WideShare {
    static_assert(DV == D || (D == 192 && DV == 128), "the wide backward's value head dims: D, or 128 at D = 192");
    enum {
        NK = FA3C_BWD_BLOCK_N(D) / 2,         // its keys of S, dP, P and dS: [KEY0, KEY0 + NK)
        KEY0 = NK * WG,
        DK_COL0 = WG == 0 ? 0 : 128,          // its head-dim columns of dK
        DK_TILES = WG == 0 ? 2 : D / 64 - 2,  // ... as 64-column wgmma tiles
        DV_COL0 = DV == D ? DK_COL0 : 64 * WG,   // and of dV
        DV_TILES = DV == D ? DK_TILES : 1,
        DQ_COL0 = WG == 0 ? 0 : D - 128,      // its head-dim columns of dQ
        DQ_N = WG == 0 ? D - 128 : 128
    };
};

// ---- GEMMs -------------------------------------------------------------------------

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

// ---- element-wise steps ------------------------------------------------------------

// The keys (columns c of the warpgroup's NK, key kc0 + c) that query row
// `query` sees: c >= lo and c <= hi, clamped to [-1, cols] and less
// 2 quad, as seen_columns (bwd_sm90.cuh) does for key rows. Keys before
// own_lo (a shifted tile's rows of the block before) and from sk on are
// not seen.
FA3C_HOST_DEVICE void seen_keys(int query, int own_lo, int sk, int rel_lo, int rel_hi, int kc0, int cols, int quad,
                                int &lo, int &hi) {
    const long long first = max((long long)own_lo, (long long)query + rel_lo) - kc0;
    const long long last = min((long long)sk - 1, (long long)query + rel_hi) - kc0;
    lo = (int)max(min(first, (long long)cols), -1ll) - 2 * quad;
    hi = (int)max(min(last, (long long)cols), -1ll) - 2 * quad;
}

// P and dS of this thread's elements, in place: query rows r0 and r0 + 8
// (lse, dsum: theirs), key columns 8 j + 2 quad (+1) of the warpgroup's NK.
// A pair the mask hides gets a score of -inf (P = 0); its dP is finite (K
// and V rows outside the keys used are zeros in smem), so its dS is 0.
// Padding query rows and a shifted tile's shared rows have lse_log2 = +inf.
template <bool SOFTCAP, int NK>
FA3C_DEVICE void wide_probs_and_grads(float *s, float *dp, const float lse[2], const float dsum[2],
                                      const fa3c_bwd_kernel_params &p, const int lo[2], const int hi[2]) {
#pragma unroll
    for (int j = 0; j < NK / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                float score = s[i], slope = 1.f;
                if (SOFTCAP) {
                    const float t = tanh_approx(score * p.softcap_pre);
                    score = p.softcap * t;
                    slope = 1.f - t * t;
                }
                float x = score * p.score_log2 - lse[r];
                if (!(8 * j + e >= lo[r] && 8 * j + e <= hi[r])) x = -INFINITY;
                const float prob = ex2f(x);
                s[i] = prob;
                dp[i] = SOFTCAP ? prob * (dp[i] - dsum[r]) * slope : prob * (dp[i] - dsum[r]);
            }
}

// The same in two steps, without softcap: P as soon as S is done (while dP's
// GEMM runs: FA3's order, as the narrow kernel's), then dS once dP is.
template <int NK>
FA3C_DEVICE void wide_probs(float *s, const float lse[2], const fa3c_bwd_kernel_params &p, const int lo[2],
                            const int hi[2]) {
#pragma unroll
    for (int j = 0; j < NK / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                float x = s[i] * p.score_log2 - lse[r];
                if (!(8 * j + e >= lo[r] && 8 * j + e <= hi[r])) x = -INFINITY;
                s[i] = ex2f(x);
            }
}
template <int NK>
FA3C_DEVICE void wide_grads(const float *prob, float *dp, const float dsum[2]) {
#pragma unroll
    for (int i = 0; i < NK / 2; i++) dp[i] = prob[i] * (dp[i] - dsum[(i / 2) % 2]);
}

// This warp's 16 query rows of P or dS (A fragments of 32 keys) into the
// buffer at the warpgroup's key columns, 8x8 matrices at a time
// (store_ds's pattern, rows and columns swapped).
template <int KEY0>
FA3C_DEVICE void store_rows_by_keys(uint8_t *buf, uint32_t (*frag)[4], int warp) {
    enum { M = 64 };
    const int lane = threadIdx.x % 32;
    const int row = (int)opaque_u32(warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8);
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
        stmatrix_x4(swizzled_unit<128>(buf, M, row, KEY0 / 8 + 2 * kk + lane / 16), frag[kk][0], frag[kk][1],
                    frag[kk][2], frag[kk][3]);
}

// TRANSPOSED: this warp's 16 query rows of P or dS (the accumulator of the
// warpgroup's NK keys) into the buffer of N key rows x 64 queries, rows
// [KEY0, KEY0 + NK): 8x8 matrices (key group j, query half r) stored
// transposed, two key groups per stmatrix (one for an odd last group).
template <int N, int KEY0, int NK, int FP16>
FA3C_DEVICE void store_keys_by_rows(uint8_t *buf, const float *x, int warp) {
    const int lane = threadIdx.x % 32, i = lane / 8;   // the matrix this lane addresses
    uint32_t r[NK / 8][2];
#pragma unroll
    for (int j = 0; j < NK / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            r[j][h] = pack2<FP16>(x[4 * j + 2 * h], x[4 * j + 2 * h + 1]);
#pragma unroll
    for (int j = 0; j < NK / 8; j += 2) {
        const int key = (int)opaque_u32(KEY0 + 8 * (j + i / 2) + lane % 8);
        uint8_t *row = swizzled_unit<128>(buf, N, key, 2 * warp + i % 2);
        if (j + 1 < NK / 8) stmatrix_x4_trans(row, r[j][0], r[j][1], r[j + 1][0], r[j + 1][1]);
        else stmatrix_x2_trans(row, r[j][0], r[j][1]);
    }
}

// Where this thread's float4 j of its dq (the warpgroup's DQ_N columns of
// the 64 query rows, in the wgmma accumulator's order) goes in a block's
// tile (tile order, fa3c_bwd_dq_tile_offset), from the tile's start: a
// warp's float4 j cover 512 contiguous bytes.
template <int D, int WG>
FA3C_DEVICE int wide_dq_offset(int j) {
    const int c = WideShare<D, WG>::DQ_COL0 + 8 * j;
    return (c / 64) * 4096 + ((c % 64) / 8) * 512 + (threadIdx.x % 128) * 4;
}

// dq added to query block m's tile: one vector reduction of 4 floats per 8 columns.
template <int D, int WG>
FA3C_DEVICE void add_wide_dq(float *tile, const float *dq) {
#pragma unroll
    for (int j = 0; j < WideShare<D, WG>::DQ_N / 8; j++)
        red_add_f32x4(tile + wide_dq_offset<D, WG>(j), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
}

// TRANSPOSED: half H of it (gemm_wide_dq_half's 64 columns).
template <int D, int WG, int H>
FA3C_DEVICE void add_wide_dq_half(float *tile, const float *dq) {
#pragma unroll
    for (int j = 0; j < 8; j++)
        red_add_f32x4(tile + wide_dq_offset<D, WG>(8 * H + j), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
}

// With the writer: the same into sm.dq (the writer's buffer; the
// caller waited for it to be free), then this warp's arrival on dq_full.
template <int D, int WG>
FA3C_DEVICE void put_wide_dq(float *buf, uint64_t *dq_full, const float *dq) {
#pragma unroll
    for (int j = 0; j < WideShare<D, WG>::DQ_N / 8; j++)
        st_shared_f32x4(buf + wide_dq_offset<D, WG>(j), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
    fence_proxy_async_smem();   // the bulk reduction reads it through the async proxy
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(dq_full);
}

// accᵀ (head-dim columns x keys) * scale to `out` (16-bit; element strides,
// all even): keys in [own_lo, sk_stored) of the tile's N (from k_start),
// at token tok0 + key (packed sequences: `batch` is 0 then), its first `cols`
// columns (the tensors' head dim: 160 of hdim 192's kernel).
template <int D, int FP16, int TILES, int COL0>
FA3C_DEVICE void store_key_columns(void *out, const int64_t *stride, float (*acc)[FA3C_BWD_BLOCK_N(D) / 2],
                                   float scale, int batch, int head_kv, int tok0, int k_start, int own_lo,
                                   int sk_stored, int cols) {
    enum { N = FA3C_BWD_BLOCK_N(D) };
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32, quad = lane % 4;
    uint16_t *base = (uint16_t *)out + batch * stride[0] + head_kv * stride[2];
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int key = k_start + 8 * j + 2 * quad + e;
            if (key < own_lo || key >= sk_stored) continue;
            uint16_t *row = base + (int64_t)(tok0 + key) * stride[1];
#pragma unroll
            for (int t = 0; t < TILES; t++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float x = acc[t][4 * j + 2 * r + e] * scale;
                    const int col = COL0 + 64 * t + warp * 16 + lane / 4 + 8 * r;
                    if (col < cols) row[col] = FP16 ? (uint16_t)pack_f16x2(x, 0.f) : (uint16_t)pack_bf16x2(x, 0.f);
                }
        }
}

// FA3C_BWD_STAGED_EPILOGUE: accᵀ (this warpgroup's head-dim columns x the
// N keys) * scale as 16-bit values into `tile` (the K or V tile's layout:
// column chunks of N key rows x 128 B), the chunks of its columns, 8x8
// matrices stored transposed (store_keys_by_rows); then out to dk or dv with
// write_staged_rows (bwd_common.cuh).
template <int D, int FP16, int TILES, int COL0>
FA3C_DEVICE void stage_key_columns(uint8_t *tile, float (*acc)[FA3C_BWD_BLOCK_N(D) / 2], float scale, int warp) {
    enum { N = FA3C_BWD_BLOCK_N(D) };
#pragma unroll
    for (int t = 0; t < TILES; t++) {
#pragma unroll
        for (int i = 0; i < N / 2; i++) acc[t][i] *= scale;
        store_keys_by_rows<N, 0, N, FP16>(tile + (COL0 / 64 + t) * N * BWD_ROW_BYTES, acc[t], warp);
    }
}

// ---- consumer ----------------------------------------------------------------------

template <int D, int FP16, int WG, bool SOFTCAP, int DV>
FA3C_DEVICE void bwd_wide_consumer(const fa3c_bwd_kernel_params &p, BwdWideSmem<D, DV> &sm, int n_block, int head_kv,
                                   int batch) {
    typedef WideShare<D, WG, DV> S;
    typedef BwdWideSmem<D, DV> Smem;
    enum { M = FA3C_BWD_BLOCK_M(D), N = FA3C_BWD_BLOCK_N(D) };
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    float dk[S::DK_TILES][N / 2], dv[S::DV_TILES][N / 2];
#pragma unroll
    for (int t = 0; t < S::DK_TILES; t++)
#pragma unroll
        for (int i = 0; i < N / 2; i++) dk[t][i] = 0.f;
#pragma unroll
    for (int t = 0; t < S::DV_TILES; t++)
#pragma unroll
        for (int i = 0; i < N / 2; i++) dv[t][i] = 0.f;
    if (BWD_SEQ(sm, m_begin) < BWD_SEQ(sm, m_end)) {
        mbar_wait_parity(&sm.kv_full, 0);
        if (p.seqused_k || p.cu_seqlens_k) {   // both warpgroups' zeros before any wgmma reads the tiles
            zero_unused_key_rows<D, N, DV>(sm.k, sm.v, BWD_SEQ(sm, k_start), BWD_SEQ(sm, sk), S::KEY0, S::NK);
            named_bar_sync(BAR_BWD_DS_READY, 128 * FA3C_BWD_CONSUMERS);
        }
    }
    const int m_begin = BWD_SEQ(sm, m_begin), m_end = BWD_SEQ(sm, m_end), steps = p.group * (m_end - m_begin);
    int m = BWD_SEQ(sm, m_first), head = head_kv * p.group;
    for (int it = 0; it < steps; it++) {
        const int s = it % BWD_STAGES, s_do = Smem::SPLIT_DO ? 0 : s;
        mbar_wait_parity(&sm.full[s], (it / BWD_STAGES) & 1);

        // S and dP for this warpgroup's NK keys, two commit groups.
        float st[S::NK / 2], dpt[S::NK / 2];
        wgmma_fence();
        gemm_rows_by_keys<D, FP16, S::NK>(st, sm.q[s], sm.k, S::KEY0);
        wgmma_commit();
        if constexpr (Smem::SPLIT_DO) {   // dO has a ring of its own
            mbar_wait_parity(&sm.do_full, it & 1);
            wgmma_fence();
        }
        gemm_rows_by_keys<D, FP16, S::NK, DV>(dpt, sm.dout[s_do], sm.v, S::KEY0);
        wgmma_commit();

        // This thread's query rows: their LSE, dsum and the keys they see.
        const int sq = BWD_SEQ(sm, sq), q0 = fa3c_bwd_rows_start(m, M, sq, BWD_SEQ(sm, q_shifted));
        const int rel_lo = BWD_SEQ(sm, rel_lo), row0 = warp * 16 + lane / 4;
        float lse[2], dsum[2];
        int lo[2], hi[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            lse[r] = __int_as_float(ld_shared_s32(smem_addr(&sm.lse_log2[s][row0 + 8 * r])));
            dsum[r] = __int_as_float(ld_shared_s32(smem_addr(&sm.dsum[s][row0 + 8 * r])));
            seen_keys(q0 + row0 + 8 * r, n_block * N, BWD_SEQ(sm, sk), rel_lo, BWD_SEQ(sm, rel_hi),
                      BWD_SEQ(sm, k_start) + S::KEY0, S::NK, lane % 4, lo[r], hi[r]);
        }
        // P and dS to smem; the barrier: both warpgroups' halves are there
        // (and step it - 2's buffers are read: each warpgroup waited for its
        // GEMMs before it came to the barrier of step it - 1).
        if constexpr (Smem::TRANSPOSED && !SOFTCAP && FA3C_BWD_WIDE_P_UNDER_DP) {
            wgmma_wait<1>();   // S is done, dP's GEMM still runs: P and its store under it
            bwd_fence_regs<S::NK / 2>(st);
            wide_probs<S::NK>(st, lse, p, lo, hi);
            store_keys_by_rows<N, S::KEY0, S::NK, FP16>(sm.p[it % 2], st, warp);
            wgmma_wait<0>();
            bwd_fence_regs<S::NK / 2>(dpt);
            wide_grads<S::NK>(st, dpt, dsum);
            store_keys_by_rows<N, S::KEY0, S::NK, FP16>(sm.ds[it % 2], dpt, warp);
        } else if constexpr (Smem::TRANSPOSED) {
            wgmma_wait<0>();
            bwd_fence_regs<S::NK / 2>(st);
            bwd_fence_regs<S::NK / 2>(dpt);
            wide_probs_and_grads<SOFTCAP, S::NK>(st, dpt, lse, dsum, p, lo, hi);
            store_keys_by_rows<N, S::KEY0, S::NK, FP16>(sm.p[it % 2], st, warp);
            store_keys_by_rows<N, S::KEY0, S::NK, FP16>(sm.ds[it % 2], dpt, warp);
        } else {
            wgmma_wait<0>();
            bwd_fence_regs<S::NK / 2>(st);
            bwd_fence_regs<S::NK / 2>(dpt);
            wide_probs_and_grads<SOFTCAP, S::NK>(st, dpt, lse, dsum, p, lo, hi);
            uint32_t p_frag[2][4], ds_frag[2][4];
            probs_to_fragments<32, FP16>(st, p_frag);
            probs_to_fragments<32, FP16>(dpt, ds_frag);
            store_rows_by_keys<S::KEY0>(sm.p[it % 2], p_frag, warp);
            store_rows_by_keys<S::KEY0>(sm.ds[it % 2], ds_frag, warp);
        }
        fence_proxy_async_smem();
        named_bar_sync(BAR_BWD_DS_READY, 128 * FA3C_BWD_CONSUMERS);

        if constexpr (Smem::TRANSPOSED) {
            // dQ in two halves: half 0, dVᵀ; half 0 added while dVᵀ runs;
            // half 1, dKᵀ; half 1 added while dKᵀ runs. dO's slot is freed
            // once dVᵀ is done, Q's once dKᵀ is. Deterministic: both halves
            // in one turn (add_dq_in_turn's protocol).
            float *tile = bwd_dq_tile<D, M>(p, batch, head, m);
            int *sem = p.dq_semaphore ? p.dq_semaphore + ((int64_t)batch * p.heads_q + head) * p.num_m_blocks + m
                                      : nullptr;
            const bool leader = threadIdx.x == 128;
            float dq[32];
            wgmma_fence();
            gemm_wide_dq_half<D, FP16, WG, 0>(dq, sm.ds[it % 2], sm.k);
            wgmma_commit();
            gemm_key_grads<D, FP16, S::DV_TILES, S::DV_COL0>(dv, sm.dout[s_do], sm.p[it % 2]);
            wgmma_commit();
            wgmma_wait<1>();
            bwd_fence_regs<32>(dq);
            if (sem) {
                if (leader) wait_counter_at_least(sem, n_block - first_key_block(rel_lo, m, M, N));
                named_bar_sync(BAR_BWD_DQ_TURN, 128 * FA3C_BWD_CONSUMERS);
            }
            add_wide_dq_half<D, WG, 0>(tile, dq);
            wgmma_fence();
            if constexpr (FA3C_BWD_WIDE_DK_FIRST) {
                // dKᵀ before dQ's second half: its accumulators are free, so the pipe
                // has dVᵀ and dKᵀ while the first half's reductions still read dq's
                // registers, which the second half's wgmma must wait for.
                gemm_key_grads<D, FP16, S::DK_TILES, S::DK_COL0>(dk, sm.q[s], sm.ds[it % 2]);
                wgmma_commit();
                gemm_wide_dq_half<D, FP16, WG, 1>(dq, sm.ds[it % 2], sm.k);
                wgmma_commit();
                wgmma_wait<2>();
                __syncwarp();
                if (lane == 0) mbar_arrive(&sm.do_empty);
                wgmma_wait<0>();
            } else {
                gemm_wide_dq_half<D, FP16, WG, 1>(dq, sm.ds[it % 2], sm.k);
                wgmma_commit();
                gemm_key_grads<D, FP16, S::DK_TILES, S::DK_COL0>(dk, sm.q[s], sm.ds[it % 2]);
                wgmma_commit();
                wgmma_wait<2>();
                __syncwarp();
                if (lane == 0) mbar_arrive(&sm.do_empty);
                wgmma_wait<1>();
            }
            bwd_fence_regs<32>(dq);
            add_wide_dq_half<D, WG, 1>(tile, dq);
            if (sem) {
                named_bar_sync(BAR_BWD_DQ_TURN, 128 * FA3C_BWD_CONSUMERS);
                if (leader) {
                    __threadfence();
                    red_release_gpu_add(sem, 1);
                }
            }
        } else {
            // dQ first, added while dVᵀ and dKᵀ run.
            float dq[S::DQ_N / 2];
            wgmma_fence();
            gemm_wide_dq<D, FP16, WG>(dq, sm.ds[it % 2], sm.k);
            wgmma_commit();
            gemm_key_grads<D, FP16, S::DV_TILES, S::DV_COL0>(dv, sm.dout[s], sm.p[it % 2]);
            gemm_key_grads<D, FP16, S::DK_TILES, S::DK_COL0>(dk, sm.q[s], sm.ds[it % 2]);
            wgmma_commit();
            wgmma_wait<1>();
            bwd_fence_regs<S::DQ_N / 2>(dq);
            float *tile = bwd_dq_tile<D, M>(p, batch, head, m);
            if (p.dq_semaphore) {   // deterministic: the key blocks that see block m add in turn (add_dq_in_turn)
                int *sem = p.dq_semaphore + ((int64_t)batch * p.heads_q + head) * p.num_m_blocks + m;
                const bool leader = threadIdx.x == 128;
                if (leader) wait_counter_at_least(sem, n_block - first_key_block(rel_lo, m, M, N));
                named_bar_sync(BAR_BWD_DQ_TURN, 128 * FA3C_BWD_CONSUMERS);
                add_wide_dq<D, WG>(tile, dq);
                named_bar_sync(BAR_BWD_DQ_TURN, 128 * FA3C_BWD_CONSUMERS);
                if (leader) {
                    __threadfence();
                    red_release_gpu_add(sem, 1);
                }
            } else if (FA3C_BWD_WRITER_ON(D)) {   // the writer's buffer is free once it has read step it - 1's
                if (it > 0) mbar_wait_parity(&sm.dq_empty[0], (it - 1) & 1);
                put_wide_dq<D, WG>(sm.dq[0], &sm.dq_full[0], dq);
            } else {
                add_wide_dq<D, WG>(tile, dq);
            }
        }

        // dVᵀ and dKᵀ have read dO and Q: the slot is free.
        wgmma_wait<0>();
        __syncwarp();
        if (lane == 0) mbar_arrive(&sm.empty[s]);
        if (++m == m_end) m = m_begin;   // the walk wraps (bwd_walk_start)
        if (m == BWD_SEQ(sm, m_first)) head++;
    }
#pragma unroll
    for (int t = 0; t < S::DK_TILES; t++) bwd_fence_regs<N / 2>(dk[t]);
#pragma unroll
    for (int t = 0; t < S::DV_TILES; t++) bwd_fence_regs<N / 2>(dv[t]);
    const int k_start = BWD_SEQ(sm, k_start), own_lo = n_block * N, sk_stored = BWD_SEQ(sm, sk_stored);
    const int k_batch = BWD_SEQ(sm, k_batch), k_tok0 = BWD_SEQ(sm, k_tok0);
    if (FA3C_BWD_STAGED_EPILOGUE && p.dkv_vec16) {
        // Both warpgroups' GEMMs read other columns of K (dQ) and V (dP) than
        // their own: once both are done, the tiles take each one's dK and dV
        // columns, which it then writes out alone.
        named_bar_sync(BAR_BWD_DS_READY, 128 * FA3C_BWD_CONSUMERS);
        stage_key_columns<D, FP16, S::DK_TILES, S::DK_COL0>(sm.k, dk, p.softmax_scale, warp);
        stage_key_columns<D, FP16, S::DV_TILES, S::DV_COL0>(sm.v, dv, 1.f, warp);
        named_bar_sync(BAR_BWD_STAGED + WG, 128);
        write_staged_rows<N, N, 8 * S::DK_TILES>(p.dk, p.dk_stride, sm.k, 0, S::DK_COL0 / 8, k_batch, head_kv, k_tok0,
                                                 k_start, own_lo, sk_stored, p.headdim);
        write_staged_rows<N, N, 8 * S::DV_TILES>(p.dv, p.dv_stride, sm.v, 0, S::DV_COL0 / 8, k_batch, head_kv, k_tok0,
                                                 k_start, own_lo, sk_stored, p.headdim_v);
        return;
    }
    store_key_columns<D, FP16, S::DK_TILES, S::DK_COL0>(p.dk, p.dk_stride, dk, p.softmax_scale, k_batch, head_kv, k_tok0, k_start, own_lo,
                                   sk_stored, p.headdim);
    store_key_columns<D, FP16, S::DV_TILES, S::DV_COL0>(p.dv, p.dv_stride, dv, 1.f, k_batch, head_kv, k_tok0, k_start, own_lo, sk_stored,
                                   p.headdim_v);
}

template <int D, int FP16, int WG, int DV>
FA3C_DEVICE void bwd_wide_consumer_of(const fa3c_bwd_kernel_params &p, BwdWideSmem<D, DV> &sm, int n_block,
                                      int head_kv, int batch) {
    if (p.softcap != 0.f) bwd_wide_consumer<D, FP16, WG, true, DV>(p, sm, n_block, head_kv, batch);
    else bwd_wide_consumer<D, FP16, WG, false, DV>(p, sm, n_block, head_kv, batch);
}

// ---- the kernel --------------------------------------------------------------------

// Grid: 1-D, p.num_n_blocks x heads_kv x batch CTAs (fa3c_bwd_tile_of_cta).
// DV: v's head dim (BwdWideSmem, WideShare).
template <int D, int FP16, int DV = D>
__global__ void __launch_bounds__(FA3C_BWD_THREADS, 1) bwd_wide_kernel(const __grid_constant__ fa3c_bwd_kernel_params p) {
    static_assert(D == 192 || D == 256, "the wide backward: head dims 192 and 256");
    static_assert(128 * FA3C_BWD_PRODUCER_REGS + 128 * FA3C_BWD_CONSUMERS * FA3C_BWD_CONSUMER_REGS <= 65536,
                  "setmaxnreg budgets past the register file");
    enum { M = FA3C_BWD_BLOCK_M(D), N = FA3C_BWD_BLOCK_N(D) };
    extern __shared__ uint8_t smem_raw[];
    typedef BwdWideSmem<D, DV> Smem;
    Smem &sm = *(Smem *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    int n_block, head_kv, batch;
    fa3c_bwd_tile_of_cta(blockIdx.x, p.num_n_blocks, p.heads_kv, p.batch, p.section, &n_block, &head_kv, &batch);

    if (threadIdx.x == 0) {
        bwd_cta_init<D>(p, sm, n_block, batch);
        if (FA3C_BWD_WRITER_ON(D)) {
            mbar_init(&sm.dq_full[0], 4 * FA3C_BWD_CONSUMERS);   // one per consumer warp
            mbar_init(&sm.dq_empty[0], 1);                       // the writer
        }
        if (Smem::SPLIT_DO) {
            mbar_init(&sm.do_full, 1);
            mbar_init(&sm.do_empty, 4 * FA3C_BWD_CONSUMERS);
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (n_block * N >= BWD_SEQ(sm, sk_stored)) return;   // a shorter sequence's key blocks end before this one

    const int warpgroup = __shfl_sync(~0u, threadIdx.x / 128, 0);   // warpgroup-uniform, as setmaxnreg requires
    if (warpgroup == 0) {
        reg_dealloc<FA3C_BWD_PRODUCER_REGS>();
        if (threadIdx.x == 0) bwd_producer<D>(p, sm, head_kv, batch);
        else if (FA3C_BWD_WRITER_ON(D) && threadIdx.x == 32) bwd_dq_writer<D>(p, sm, head_kv, batch);
    } else {
        reg_alloc<FA3C_BWD_CONSUMER_REGS>();
        if (warpgroup == 1) bwd_wide_consumer_of<D, FP16, 0, DV>(p, sm, n_block, head_kv, batch);
        else bwd_wide_consumer_of<D, FP16, 1, DV>(p, sm, n_block, head_kv, batch);
    }
}

// Dynamic smem a launch needs (the +1024 lets the kernel align the base).
template <int D, int DV = D>
static size_t bwd_wide_smem_bytes(void) {
    static_assert(sizeof(BwdWideSmem<D, DV>) + 1024 <= 227 * 1024, "the wide backward kernel's smem exceeds a block's");
    return sizeof(BwdWideSmem<D, DV>) + 1024;
}
