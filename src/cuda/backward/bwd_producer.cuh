// The backward's producer thread (either kernel, bwd_sm90.cuh and
// bwd_wide_sm90.cuh): K and V once, then the ring of Q, dO, LSE and dsum
// along the CTA's walk (bwd_common.cuh).
#pragma once
#include "bwd_common.cuh"

// A tile of `rows` rows at row0 of (head, batch), as D / 64 boxes.
template <int D>
FA3C_DEVICE void bwd_load_rows(uint8_t *dst, const CUtensorMap *map, uint64_t *bar, int rows, int row0, int head,
                               int batch) {
#pragma unroll
    for (int c = 0; c < D / 64; c++) tma_load_4d(dst + c * rows * BWD_ROW_BYTES, map, bar, c * 64, row0, head, batch);
}

// The producer thread: K and V once, then Q, dO, LSE and dsum of each step
// into the ring (Smem: either kernel's layout, with these member names).
// With Smem::SPLIT_DO (hdim 256's 80-key CTAs) dO has a ring of its own,
// one slot (do_full, do_empty), freed once dVᵀ has read it, before Q's.
template <int D, class Smem>
FA3C_DEVICE void bwd_producer(const fa3c_bwd_kernel_params &p, Smem &sm, int head_kv, int batch) {
    enum { M = FA3C_BWD_BLOCK_M(D), N = FA3C_BWD_BLOCK_N(D) };
    const int m_begin = BWD_SEQ(sm, m_begin), m_end = BWD_SEQ(sm, m_end), m_first = BWD_SEQ(sm, m_first);
    if (m_begin >= m_end) return;
    const int k_row0 = BWD_SEQ(sm, k_tok0) + BWD_SEQ(sm, k_start);
    mbar_arrive_expect_tx(&sm.kv_full, 2 * N * D * 2);
    bwd_load_rows<D>(sm.k, &p.k_map, &sm.kv_full, N, k_row0, head_kv, BWD_SEQ(sm, k_batch));
    bwd_load_rows<D>(sm.v, &p.v_map, &sm.kv_full, N, k_row0, head_kv, BWD_SEQ(sm, k_batch));
    int it = 0;
    for (int g = 0; g < p.group; g++) {
        const int head = head_kv * p.group + g, row = batch * p.heads_q + head;   // of the scratch maps
        for (int i = 0; i < m_end - m_begin; i++, it++) {
            const int s = it % BWD_STAGES, m = bwd_walk_block(i, m_begin, m_end, m_first);
            const int row0 = BWD_SEQ(sm, q_tok0) + fa3c_bwd_rows_start(m, M, BWD_SEQ(sm, sq), BWD_SEQ(sm, q_packed));
            if (it >= BWD_STAGES) mbar_wait_parity(&sm.empty[s], (it / BWD_STAGES - 1) & 1);
            if constexpr (Smem::SPLIT_DO) {
                mbar_arrive_expect_tx(&sm.full[s], M * D * 2 + 2 * M * 4);
                bwd_load_rows<D>(sm.q[s], &p.q_map, &sm.full[s], M, row0, head, BWD_SEQ(sm, q_batch));
                tma_load_2d(sm.lse_log2[s], &p.lse_map, &sm.full[s], m * M, row);
                tma_load_2d(sm.dsum[s], &p.dsum_map, &sm.full[s], m * M, row);
                if (it > 0) mbar_wait_parity(&sm.do_empty, (it - 1) & 1);
                mbar_arrive_expect_tx(&sm.do_full, M * D * 2);
                bwd_load_rows<D>(sm.dout[0], &p.do_map, &sm.do_full, M, row0, head, BWD_SEQ(sm, q_batch));
                continue;
            }
            mbar_arrive_expect_tx(&sm.full[s], 2 * M * D * 2 + 2 * M * 4);
            bwd_load_rows<D>(sm.q[s], &p.q_map, &sm.full[s], M, row0, head, BWD_SEQ(sm, q_batch));
            bwd_load_rows<D>(sm.dout[s], &p.do_map, &sm.full[s], M, row0, head, BWD_SEQ(sm, q_batch));
            tma_load_2d(sm.lse_log2[s], &p.lse_map, &sm.full[s], m * M, row);
            tma_load_2d(sm.dsum[s], &p.dsum_map, &sm.full[s], m * M, row);
        }
    }
}
