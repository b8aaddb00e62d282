// The narrow backward's consumer warpgroups (bwd_sm90.cuh): one step per
// query block (bwd_step), the walk over the CTA's query blocks and the
// epilogue (bwd_consumer).
#pragma once
#include "bwd_gemm.cuh"
#include "bwd_elementwise.cuh"

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
