// What every role of both backward kernels shares (bwd_sm90.cuh for head
// dims 64-128, bwd_wide_sm90.cuh for 192 and 256): the CTA's sequence, its
// walk of query blocks and its set-up, and the zeroed rows of K and V
// outside the keys used. The roles' own pieces: bwd_producer.cuh (the
// loads), bwd_dq.cuh (dQ's accumulator and its writer). The host-device index functions
// are checked against brute force on the CPU (tests/gpu/cpu_kernel_math.cu).
#pragma once
#include <limits.h>
#include "ptx.cuh"
#include "bwd_params.h"
#include "bwd_tiles.h"

// Named-barrier ids (0 is __syncthreads), both for the two consumer
// warpgroups: their dS rows are in smem (and the older dS buffer is free
// again); the steps of a deterministic dQ turn (add_dq_in_turn).
// BAR_BWD_STAGED + wg: one consumer warpgroup's dK / dV rows in smem
// (FA3C_BWD_STAGED_EPILOGUE).
enum BwdNamedBarrier { BAR_BWD_DS_READY = 1, BAR_BWD_DQ_TURN = 2, BAR_BWD_STAGED = 3 };

enum {
    BWD_STAGES = FA3C_BWD_STAGES,
    BWD_ROW_BYTES = 128,              // tiles are column chunks of 64 elements, 128-byte swizzle
    BWD_ATOM_BYTES = 8 * BWD_ROW_BYTES
};

// The lengths, tokens and mask of the CTA's sequence, worked out by one
// thread (bwd_sequence) and read from smem where needed: the consumers'
// registers are full.
struct BwdSeq {
    int sq, sk, sk_stored;     // queries used (seqused_q); keys used (the mask: seqused_k); keys stored (dk, dv rows written)
    int q_tok0, k_tok0;        // token of query / key 0 in the tensors (packed sequences; else 0)
    int q_batch, k_batch;      // the maps' batch coordinate: the batch, or 0 for packed sequences
    int q_shifted;             // 1: query tiles may be shifted (fa3c_bwd_rows_start)
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
    q.sq = fa3c_bwd_used(p.seqused_q, batch, q.sq);
    q.sk = fa3c_bwd_used(p.seqused_k, batch, q.sk_stored);
    q.q_batch = p.cu_seqlens_q ? 0 : batch;
    q.k_batch = p.cu_seqlens_k ? 0 : batch;
    q.q_shifted = fa3c_bwd_queries_shifted(p.cu_seqlens_q, p.seqused_q);
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
template <int D, int N, int DV = D>
FA3C_DEVICE void zero_unused_key_rows(uint8_t *k, uint8_t *v, int k_start, int sk, int row0, int rows) {
    const int first = k_start + row0;
    if (first >= 0 && first + rows <= sk) return;
    for (int u = threadIdx.x % 128; u < rows * (D / 8); u += 128) {
        const int row = u / (D / 8), unit = u % (D / 8), key = first + row;
        if (key < 0 || key >= sk) {
            st_shared_zero16(smem_addr(swizzled_unit<128>(k, N, row0 + row, unit)));
            if (unit < DV / 8) st_shared_zero16(smem_addr(swizzled_unit<128>(v, N, row0 + row, unit)));
        }
    }
    fence_proxy_async_smem();
}

// FA3C_BWD_STAGED_EPILOGUE, either kernel: dK or dV rows staged in `tile`
// (the K or V tile's layout: column chunks of CHUNK_ROWS rows x 128 B,
// swizzled) to `out` (16-bit; element strides, rows 16-byte aligned:
// p.dkv_vec16) in 16-byte pieces, a warp's 512 contiguous bytes where the
// rows allow: tile rows [row0, row0 + ROWS), 16-byte units [unit0, unit0 +
// UNITS) of them, by the warpgroup's 128 threads; the rows of keys in
// [own_lo, sk_stored) (key = k_start + tile row), at token tok0 + key, their
// first `cols` columns.
template <int CHUNK_ROWS, int ROWS, int UNITS>
FA3C_DEVICE void write_staged_rows(void *out, const int64_t *stride, const uint8_t *tile, int row0, int unit0,
                                   int batch, int head_kv, int tok0, int k_start, int own_lo, int sk_stored,
                                   int cols) {
    for (int i = threadIdx.x % 128; i < ROWS * UNITS; i += 128) {
        const int row = row0 + i / UNITS, u = unit0 + i % UNITS, key = k_start + row;
        if (key < own_lo || key >= sk_stored || 8 * u >= cols) continue;
        const uint4 x = ld_shared_u32x4(smem_addr(swizzled_unit<128>((uint8_t *)tile, CHUNK_ROWS, row, u)));
        *(uint4 *)((uint16_t *)out + batch * stride[0] + (int64_t)(tok0 + key) * stride[1] + head_kv * stride[2] +
                   8 * u) = x;
    }
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
    sm.seq = bwd_sequence(p, n_block, batch, Smem::M, FA3C_BWD_BLOCK_N(D));
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
    mbar_init(&sm.landed, 1);   // a slot the producer zeroes rows of (bwd_producer.cuh)
}
