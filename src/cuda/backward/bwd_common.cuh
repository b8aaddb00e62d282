// What the backward kernels share (bwd_sm90.cuh for head dims 64-128,
// bwd_wide_sm90.cuh for 192 and 256): the CTA's sequence and its walk of
// query blocks, the producer, dQ's tile-order accumulator, and the zeroed
// rows of K and V outside the keys used. The host-device index functions
// are checked against brute force on the CPU (tests/gpu/cpu_kernel_math.cu).
#pragma once
#include <limits.h>
#include "ptx.cuh"
#include "bwd_params.h"
#include "bwd_tiles.h"

// Named-barrier ids (0 is __syncthreads), both for the two consumer
// warpgroups: their dS rows are in smem (and the older dS buffer is free
// again); the steps of a deterministic dQ turn (add_dq_in_turn).
enum BwdNamedBarrier { BAR_BWD_DS_READY = 1, BAR_BWD_DQ_TURN = 2 };

enum {
    BWD_STAGES = FA3C_BWD_STAGES,
    BWD_ROW_BYTES = 128,              // tiles are column chunks of 64 elements, 128-byte swizzle
    BWD_ATOM_BYTES = 8 * BWD_ROW_BYTES
};

// The lengths, tokens and mask of the CTA's sequence, worked out by one
// thread (bwd_sequence) and read from smem where needed: the consumers'
// registers are full.
struct BwdSeq {
    int sq, sk, sk_stored;     // queries; keys used (the mask: seqused_k); keys stored (dk, dv rows written)
    int q_tok0, k_tok0;        // token of query / key 0 in the tensors (packed sequences; else 0)
    int q_batch, k_batch;      // the maps' batch coordinate: the batch, or 0 for packed sequences
    int q_packed;              // 1: query tiles may be shifted (fa3c_bwd_rows_start)
    int k_start;               // key of the K/V tile's row 0 (fa3c_bwd_rows_start)
    int rel_lo, rel_hi;        // query i sees key j < sk iff rel_lo <= j - i <= rel_hi
    int m_begin, m_end;        // the query blocks with a row that sees a key of this block
    int m_first;               // the walk's first (bwd_walk_start)
};

FA3C_HOST_DEVICE int clamp_to_int(long long x) { return x < INT_MIN ? INT_MIN : x > INT_MAX ? INT_MAX : (int)x; }

// Query blocks (of block_m rows) [m_begin, m_end) with a row that sees one
// of this CTA's own keys [n_block block_n, + block_n) (empty under a causal
// mask or window that hides them from every query, or when they are past
// the keys used). This and the other host-device index functions here are
// checked against brute force on the CPU (tests/gpu/cpu_kernel_math.cu).
FA3C_HOST_DEVICE void bwd_query_blocks(const BwdSeq &q, int n_block, int block_m, int block_n, int &m_begin,
                                      int &m_end) {
    const long long k_first = (long long)n_block * block_n, k_last = min(k_first + block_n, (long long)q.sk) - 1;
    const long long i_min = max(k_first - q.rel_hi, 0ll), i_max = min(k_last - q.rel_lo, (long long)q.sq - 1);
    if (k_first > k_last || i_min > i_max) {
        m_begin = m_end = 0;
        return;
    }
    m_begin = (int)(i_min / block_m);
    m_end = (int)(i_max / block_m) + 1;
}

FA3C_HOST_DEVICE BwdSeq bwd_sequence(const fa3c_bwd_kernel_params &p, int n_block, int batch, int block_m,
                                     int block_n) {
    BwdSeq q;
    q.q_tok0 = q.k_tok0 = 0;
    q.sq = p.seqlen_q;
    q.sk_stored = p.seqlen_k;
    if (p.cu_seqlens_q) fa3c_bwd_packed_sequence(p.cu_seqlens_q, batch, p.batch, p.seqlen_q, &q.q_tok0, &q.sq);
    if (p.cu_seqlens_k) fa3c_bwd_packed_sequence(p.cu_seqlens_k, batch, p.batch, p.seqlen_k, &q.k_tok0, &q.sk_stored);
    q.sk = p.seqused_k ? max(min(p.seqused_k[batch], q.sk_stored), 0) : q.sk_stored;
    q.q_batch = p.cu_seqlens_q ? 0 : batch;
    q.k_batch = p.cu_seqlens_k ? 0 : batch;
    q.q_packed = p.cu_seqlens_q != nullptr;
    q.k_start = fa3c_bwd_rows_start(n_block, block_n, q.sk_stored, p.cu_seqlens_k != nullptr);
    const long long diag = (long long)q.sk - q.sq;   // bottom-right aligned, per sequence (src/problem.h)
    q.rel_lo = p.window_left >= 0 ? clamp_to_int(diag - p.window_left) : INT_MIN;
    q.rel_hi = p.window_right >= 0 ? clamp_to_int(diag + p.window_right) : INT_MAX;
    bwd_query_blocks(q, n_block, block_m, block_n, q.m_begin, q.m_end);
    q.m_first = q.m_begin;   // bwd_cta_init sets the kernel's (bwd_walk_start)
    return q;
}

// Where key block n_block (of n_blocks) starts its walk over each head's
// query blocks [m_begin, m_end), wrapping around at m_end. With the
// first-write flags (p.dq_written) the key blocks of a head start spread
// over the range, so that they reach a dQ tile steps apart and find its
// first store complete (started together, all but one would wait for it);
// otherwise at m_begin (deterministic turns go in key-block order).
FA3C_HOST_DEVICE int bwd_walk_start(const fa3c_bwd_kernel_params &p, const BwdSeq &q, int n_block, int n_blocks) {
    if (!p.dq_written || q.m_begin >= q.m_end) return q.m_begin;
    return q.m_begin + (int)((long long)n_block * (q.m_end - q.m_begin) / n_blocks);
}

// Query block of step `it` of the walk (it < blocks x the group's heads).
FA3C_HOST_DEVICE int bwd_walk_block(int it, int m_begin, int m_end, int m_first) {
    const int blocks = m_end - m_begin;
    return m_begin + (m_first - m_begin + it % blocks) % blocks;
}

// A field of the CTA's BwdSeq, read from smem where it is used (a 32-bit
// shared load that ptxas can neither hoist nor keep in a register).
#define BWD_SEQ(sm, field) ld_shared_s32(smem_addr(&(sm).seq.field))

// ---- producer ----------------------------------------------------------------------

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

// The tile-order dQ of query block m of `head` (fa3c_bwd_dq_tile_offset).
template <int D>
FA3C_DEVICE float *bwd_dq_tile(const fa3c_bwd_kernel_params &p, int batch, int head, int m) {
    enum { M = FA3C_BWD_BLOCK_M(D) };
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
    enum { M = FA3C_BWD_BLOCK_M(D), BYTES = M * D * 4 };
    if (p.dq_semaphore) return;
    const int m_begin = BWD_SEQ(sm, m_begin), m_end = BWD_SEQ(sm, m_end), m_first = BWD_SEQ(sm, m_first);
    const int blocks = m_end - m_begin;
    for (int it = 0; it < p.group * blocks; it++) {
        const int head = head_kv * p.group + it / blocks, m = bwd_walk_block(it, m_begin, m_end, m_first);
        float *tile = bwd_dq_tile<D>(p, batch, head, m);
        int *flag = p.dq_written ? p.dq_written + ((int64_t)batch * p.heads_q + head) * p.num_m_blocks + m : nullptr;
        const int claimed = FA3C_BWD_DQ_CLAIM_EARLY && flag ? claim_dq_tile(flag) : -1;
        mbar_wait_parity(&sm.dq_full, it & 1);
        if (flag && (FA3C_BWD_DQ_CLAIM_EARLY ? claimed == 0 : atomicCAS(flag, 0, 1) == 0)) {
            bulk_store(tile, sm.dq, BYTES);
            tma_store_commit();
            tma_store_wait_read();
            mbar_arrive(&sm.dq_empty);
            tma_store_wait_all();
            fence_proxy_async_global();
            st_release_gpu(flag, 2);
            continue;
        }
        if (flag && !FA3C_BWD_DQ_CLAIM_EARLY) {
            wait_counter_at_least(flag, 2);
            fence_proxy_async_global();
        }
        bulk_reduce_add_f32(tile, sm.dq, BYTES);
        tma_store_commit();
        tma_store_wait_read();
        mbar_arrive(&sm.dq_empty);
    }
    tma_store_wait_all();
}

template <int N>
FA3C_DEVICE void bwd_fence_regs(float *x) {
#pragma unroll
    for (int i = 0; i < N; i++) reg_fence(x[i]);
}

// With seqused_k or packed sequences the K and V rows outside the keys
// used may hold anything, NaN included: dQ = dS·K multiplies K's by dS = 0,
// and dS = P ⊙ (dP - dsum) multiplies the dP of V's by P = 0. Rows
// [row0, row0 + rows) of both tiles (N rows each; a warpgroup's share, by
// its 128 threads) are zeroed once, before any wgmma reads them (the
// caller's named barrier then makes every thread's zeros visible to both
// warpgroups). Outside means past this sequence's keys used, or before its
// key 0: a shifted tile of a short packed sequence starts in the sequence
// before, whose unused keys may be NaN. k_start: the tile's first key.
template <int D, int N>
FA3C_DEVICE void zero_unused_key_rows(uint8_t *k, uint8_t *v, int k_start, int sk, int row0, int rows) {
    const int first = k_start + row0;
    if (first >= 0 && first + rows <= sk) return;
    for (int u = threadIdx.x % 128; u < rows * (D / 8); u += 128) {
        const int row = u / (D / 8), unit = u % (D / 8), key = first + row;
        if (key < 0 || key >= sk) {
            st_shared_zero16(smem_addr(swizzled_unit<128>(k, N, row0 + row, unit)));
            st_shared_zero16(smem_addr(swizzled_unit<128>(v, N, row0 + row, unit)));
        }
    }
    fence_proxy_async_smem();
}

// This thread's dq (one 64 x 64 piece of the block's
// tile, in the accumulator's order) added to the tile with 8 vector
// reductions, a warp's 512 contiguous bytes each. No row masks: rows outside
// the block's own (a shifted tile's shared rows, padding) go to the block's
// own slots, which bwd_prep.cu's dq kernel never reads (it reads tile row
// q - q0 for the block's own queries q only); they hold zeros anyway (dS = 0).
FA3C_DEVICE void add_dq_tiled(float *tile, const float *dq, int piece) {
    float *dst = tile + piece * 4096 + (threadIdx.x % 128) * 4;
#pragma unroll
    for (int k = 0; k < 8; k++) red_add_f32x4(dst + k * 512, dq[4 * k], dq[4 * k + 1], dq[4 * k + 2], dq[4 * k + 3]);
}

// The first key block (of block_n keys) that sees query block m (of
// block_m rows): the key
// blocks that do form a contiguous range (bwd_query_blocks' bounds grow
// with the key block), starting at the one holding the first row's first
// key.
FA3C_HOST_DEVICE int first_key_block(int rel_lo, int m, int block_m, int block_n) {
    const long long first_key = (long long)m * block_m + rel_lo;
    return first_key <= 0 ? 0 : (int)(first_key / block_n);
}

// Thread 0's set-up of a CTA, either kernel: its sequence (read from smem by
// everyone after the caller's __syncthreads), the TMA descriptors
// prefetched, and the barriers of K/V and of the Q/dO ring (a full barrier
// per slot for the producer's one arrival, an empty one for each consumer
// warp's). The caller adds its own barriers, then fence_barrier_init.
template <int D, class Smem>
FA3C_DEVICE void bwd_cta_init(const fa3c_bwd_kernel_params &p, Smem &sm, int n_block, int batch) {
    sm.seq = bwd_sequence(p, n_block, batch, FA3C_BWD_BLOCK_M(D), FA3C_BWD_BLOCK_N(D));
    sm.seq.m_first = bwd_walk_start(p, sm.seq, n_block, p.num_n_blocks);
    tma_prefetch_map(&p.q_map);
    tma_prefetch_map(&p.k_map);
    tma_prefetch_map(&p.v_map);
    tma_prefetch_map(&p.do_map);
    tma_prefetch_map(&p.lse_map);
    tma_prefetch_map(&p.dsum_map);
    mbar_init(&sm.kv_full, 1);
    for (int s = 0; s < BWD_STAGES; s++) {
        mbar_init(&sm.full[s], 1);
        mbar_init(&sm.empty[s], 4 * FA3C_BWD_CONSUMERS);   // one per consumer warp
    }
}
