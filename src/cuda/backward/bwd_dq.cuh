// dQ's fp32 accumulator in tile order (fa3c_bwd_dq_tile_offset), either
// kernel: the consumers' vector reductions into a tile, and the writer
// thread that adds the consumers' smem buffer with one bulk reduction (or
// stores it first, with the first-write flags).
#pragma once
#include "bwd_common.cuh"

// The tile-order dQ of query block m of `head` (fa3c_bwd_dq_tile_offset).
template <int D, int M>
FA3C_DEVICE float *bwd_dq_tile(const fa3c_bwd_kernel_params &p, int batch, int head, int m) {
    return p.dq_accum + (((int64_t)batch * p.heads_q + head) * p.rows_pad + (int64_t)m * M) * D;
}

// FA3C_BWD_DQ_CLAIM_EARLY: claim dQ tile `flag`'s first write (0 -> 1) for
// this key block; returns the flag's old value: 0 (this block stores), or,
// once a first store in progress is complete, 2 (this block adds after it:
// the acquire and the proxy fence order the reduction after that store).
FA3C_DEVICE int claim_dq_tile(int *flag) {
    const int old = atom_cas_acquire_gpu(flag, 0, 1);
    if (old == 0) return 0;
    if (old != 2) wait_counter_at_least(flag, 2);
    fence_proxy_async_global();
    return 2;
}

// The dQ writer (FA3C_BWD_WRITER_ON), one thread of the producer
// warpgroup, either kernel: per step (the consumers' walk), wait for both
// warpgroups' dQ in sm.dq, add it to the block's tile with one bulk
// reduction, and hand the buffer back once read. With p.dq_written
// (FA3C_BWD_DQ_FIRST_WRITE) the accumulator was not zeroed: the first key
// block to claim a tile's flag (0 -> 1) stores its dQ there and raises the
// flag to 2 once the store is complete; the others wait for 2, then add.
// deterministic = 1 adds in turn from the consumers instead.
template <int D, class Smem>
FA3C_DEVICE void bwd_dq_writer(const fa3c_bwd_kernel_params &p, Smem &sm, int head_kv, int batch) {
    enum { M = Smem::M, BYTES = M * D * 4, BUFS = Smem::DQ_BUFS };
    if (p.dq_semaphore) return;
    const int m_begin = BWD_SEQ(sm, m_begin), m_end = BWD_SEQ(sm, m_end), m_first = BWD_SEQ(sm, m_first);
    const int blocks = m_end - m_begin;
    const uint64_t policy = FA3C_BWD_DQ_EVICT_LAST ? l2_policy_evict_last() : 0;
    for (int it = 0; it < p.group * blocks; it++) {
        const int head = head_kv * p.group + it / blocks, m = bwd_walk_block(it, m_begin, m_end, m_first);
        float *tile = bwd_dq_tile<D, M>(p, batch, head, m);
        int *flag = p.dq_written ? p.dq_written + ((int64_t)batch * p.heads_q + head) * p.num_m_blocks + m : nullptr;
        const int claimed = FA3C_BWD_DQ_CLAIM_EARLY && flag ? claim_dq_tile(flag) : -1;
        const int b = it % BUFS;
        mbar_wait_parity(&sm.dq_full[b], (it / BUFS) & 1);
        if (flag && (FA3C_BWD_DQ_CLAIM_EARLY ? claimed == 0 : atomicCAS(flag, 0, 1) == 0)) {
            if (FA3C_BWD_DQ_EVICT_LAST) bulk_store_hint(tile, sm.dq[b], BYTES, policy);
            else bulk_store(tile, sm.dq[b], BYTES);
            tma_store_commit();
            tma_store_wait_read();
            mbar_arrive(&sm.dq_empty[b]);
            tma_store_wait_all();
            fence_proxy_async_global();
            st_release_gpu(flag, 2);
            continue;
        }
        if (flag && !FA3C_BWD_DQ_CLAIM_EARLY) {
            wait_counter_at_least(flag, 2);
            fence_proxy_async_global();
        }
        if (FA3C_BWD_DQ_EVICT_LAST) bulk_reduce_add_f32_hint(tile, sm.dq[b], BYTES, policy);
        else bulk_reduce_add_f32(tile, sm.dq[b], BYTES);
        tma_store_commit();
        tma_store_wait_read();
        mbar_arrive(&sm.dq_empty[b]);
    }
    tma_store_wait_all();
}

// This thread's REGS dq values (one warpgroup's piece of the block's tile,
// in the accumulator's order) added to the tile with REGS / 4 vector
// reductions, a warp's 512 contiguous bytes each. No row masks: rows outside
// the block's own (a shifted tile's shared rows, padding) go to the block's
// own slots, which bwd_prep.cu's dq kernel never reads (it reads tile row
// q - q0 for the block's own queries q only); they hold zeros anyway (dS = 0).
template <int REGS>
FA3C_DEVICE void add_dq_tiled(float *tile, const float *dq, int piece) {
    float *dst = tile + piece * 128 * REGS + (threadIdx.x % 128) * 4;
#pragma unroll
    for (int k = 0; k < REGS / 4; k++) red_add_f32x4(dst + k * 512, dq[4 * k], dq[4 * k + 1], dq[4 * k + 2], dq[4 * k + 3]);
}
