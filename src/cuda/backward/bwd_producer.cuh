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

// Tile rows [0, rows) of a query tile set to zero (D / 8 16-byte units
// each), by this thread alone.
template <int D, int M>
FA3C_DEVICE void zero_tile_rows(uint8_t *tile, int rows) {
    for (int r = 0; r < rows; r++)
        for (int u = 0; u < D / 8; u++) st_shared_zero16(smem_addr(swizzled_unit<128>(tile, M, r, u)));
}

// How many of a query tile's first rows to zero: those before its sequence
// (q0 < 0: the sequence is shorter than a tile) when they may hold anything.
// With seqused_q, packed sequences' rows past their queries used may hold
// NaN, which the GEMMs would carry into dK and dV even where P and dS are 0.
// Without seqused_q the rows before are the sequence before's queries, and
// in a fixed-length batch (or before token 0) they are outside the tensor,
// which TMA reads as zeros.
FA3C_DEVICE int foreign_query_rows(const fa3c_bwd_kernel_params &p, int tok0, int q0) {
    return p.seqused_q && p.cu_seqlens_q && q0 < 0 && tok0 > 0 ? -q0 : 0;
}

// A step whose query tile starts with foreign rows (foreign_query_rows):
// Q, dO, LSE and dsum land on `landed` (its use count in `landings`), this
// thread zeroes those rows of Q and dO, then completes the slot's barriers
// with plain arrivals (their phases wait for no bytes).
template <int D, class Smem>
FA3C_DEVICE void load_step_zeroing(const fa3c_bwd_kernel_params &p, Smem &sm, int s, int row0, int head, int m,
                                   int row, int foreign, int &landings) {
    enum { M = Smem::M, DV = Smem::DV };
    uint8_t *dout = sm.dout[Smem::SPLIT_DO ? 0 : s];
    mbar_arrive_expect_tx(&sm.landed, M * (D + DV) * 2 + 2 * M * 4);
    bwd_load_rows<D>(sm.q[s], &p.q_map, &sm.landed, M, row0, head, BWD_SEQ(sm, q_batch));
    bwd_load_rows<DV>(dout, &p.do_map, &sm.landed, M, row0, head, BWD_SEQ(sm, q_batch));
    tma_load_2d(sm.lse_log2[s], &p.lse_map, &sm.landed, m * M, row);
    tma_load_2d(sm.dsum[s], &p.dsum_map, &sm.landed, m * M, row);
    mbar_wait_parity(&sm.landed, landings++ & 1);
    zero_tile_rows<D, M>(sm.q[s], foreign);
    zero_tile_rows<DV, M>(dout, foreign);
    fence_proxy_async_smem();   // the consumers' wgmmas read them through the async proxy
    mbar_arrive(&sm.full[s]);
    if constexpr (Smem::SPLIT_DO) mbar_arrive(&sm.do_full);
}

// The producer thread: K and V once, then Q, dO, LSE and dsum of each step
// into the ring (Smem: either kernel's layout, with these member names).
// With Smem::SPLIT_DO (hdim 256's 80-key CTAs) dO has a ring of its own,
// one slot (do_full, do_empty), freed once dVᵀ has read it, before Q's.
template <int D, class Smem>
FA3C_DEVICE void bwd_producer(const fa3c_bwd_kernel_params &p, Smem &sm, int head_kv, int batch) {
    enum { M = Smem::M, N = FA3C_BWD_BLOCK_N(D), DV = Smem::DV };   // DV: v's and dO's tiles' head dim
    const int m_begin = BWD_SEQ(sm, m_begin), m_end = BWD_SEQ(sm, m_end), m_first = BWD_SEQ(sm, m_first);
    if (m_begin >= m_end) return;
    const int k_row0 = BWD_SEQ(sm, k_tok0) + BWD_SEQ(sm, k_start);
    mbar_arrive_expect_tx(&sm.kv_full, N * (D + DV) * 2);
    bwd_load_rows<D>(sm.k, &p.k_map, &sm.kv_full, N, k_row0, head_kv, BWD_SEQ(sm, k_batch));
    bwd_load_rows<DV>(sm.v, &p.v_map, &sm.kv_full, N, k_row0, head_kv, BWD_SEQ(sm, k_batch));
    int it = 0, landings = 0;
    for (int g = 0; g < p.group; g++) {
        const int head = head_kv * p.group + g, row = batch * p.heads_q + head;   // of the scratch maps
        for (int i = 0; i < m_end - m_begin; i++, it++) {
            const int s = it % BWD_STAGES, m = bwd_walk_block(i, m_begin, m_end, m_first);
            const int q0 = fa3c_bwd_rows_start(m, M, BWD_SEQ(sm, sq), BWD_SEQ(sm, q_shifted));
            const int row0 = BWD_SEQ(sm, q_tok0) + q0, foreign = foreign_query_rows(p, BWD_SEQ(sm, q_tok0), q0);
            if (it >= BWD_STAGES) mbar_wait_parity(&sm.empty[s], (it / BWD_STAGES - 1) & 1);
            if (foreign) {
                if constexpr (Smem::SPLIT_DO) {
                    if (it > 0) mbar_wait_parity(&sm.do_empty, (it - 1) & 1);
                }
                load_step_zeroing<D>(p, sm, s, row0, head, m, row, foreign, landings);
                continue;
            }
            if constexpr (Smem::SPLIT_DO) {
                mbar_arrive_expect_tx(&sm.full[s], M * D * 2 + 2 * M * 4);
                bwd_load_rows<D>(sm.q[s], &p.q_map, &sm.full[s], M, row0, head, BWD_SEQ(sm, q_batch));
                tma_load_2d(sm.lse_log2[s], &p.lse_map, &sm.full[s], m * M, row);
                tma_load_2d(sm.dsum[s], &p.dsum_map, &sm.full[s], m * M, row);
                if (it > 0) mbar_wait_parity(&sm.do_empty, (it - 1) & 1);
                mbar_arrive_expect_tx(&sm.do_full, M * DV * 2);
                bwd_load_rows<DV>(sm.dout[0], &p.do_map, &sm.do_full, M, row0, head, BWD_SEQ(sm, q_batch));
                continue;
            }
            mbar_arrive_expect_tx(&sm.full[s], M * (D + DV) * 2 + 2 * M * 4);
            bwd_load_rows<D>(sm.q[s], &p.q_map, &sm.full[s], M, row0, head, BWD_SEQ(sm, q_batch));
            bwd_load_rows<DV>(sm.dout[s], &p.do_map, &sm.full[s], M, row0, head, BWD_SEQ(sm, q_batch));
            tma_load_2d(sm.lse_log2[s], &p.lse_map, &sm.full[s], m * M, row);
            tma_load_2d(sm.dsum[s], &p.dsum_map, &sm.full[s], m * M, row);
        }
    }
}
