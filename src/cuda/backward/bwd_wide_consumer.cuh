// The wide backward's consumer warpgroups (bwd_wide_sm90.cuh): the walk over
// the CTA's query blocks, one step each, and the epilogue.
#pragma once
#include "bwd_wide_gemm.cuh"
#include "bwd_wide_elementwise.cuh"

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
