// The narrow backward's element-wise steps (bwd_sm90.cuh): which keys a
// thread's rows see, Pᵀ and dSᵀ from the scores, dSᵀ to smem, dQ to the
// writer's buffer or the accumulator, dK and dV out.
#pragma once
#include "softmax.cuh"   // probs_to_fragments
#include "bwd_smem.cuh"
#include "bwd_dq.cuh"

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
