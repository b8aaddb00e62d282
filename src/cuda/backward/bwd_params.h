/* The backward kernels' parameters (bwd_sm90.cuh, bwd_prep.cu): one POD
 * struct, filled on the host by src/cuda/backward/bwd_host.c and passed by value
 * (__grid_constant__), so the TMA descriptors live in parameter space. */
#ifndef FA3C_BWD_PARAMS_H
#define FA3C_BWD_PARAMS_H

#include <cuda.h>
#include <stdint.h>
#include "bwd_tiles.h"   /* FA3C_BWD_DQ_TRANSPOSED */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fa3c_bwd_kernel_params {
    /* 128B-swizzled boxes of 64 columns: K and V of FA3C_BWD_BLOCK_N(headdim) rows,
     * Q and dO of FA3C_BWD_BLOCK_M(headdim) rows; rows past the end read as zeros.
     * Packed sequences (cu_seqlens): one batch of batch x seqlen tokens (a
     * bound; every box stays inside its sequence or before it:
     * fa3c_bwd_rows_start); so does every Q / dO box with seqused_q. */
    CUtensorMap q_map, k_map, v_map, do_map;
    /* lse_log2 and dsum below as (batch x heads_q rows of rows_pad floats),
     * boxes of FA3C_BWD_BLOCK_M(headdim) x 1 (compute-sanitizer's racecheck did not
     * follow the plain bulk copies these replaced). */
    CUtensorMap lse_map, dsum_map;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv;   /* seqlen_*: the longest sequence's */
    int group;                 /* heads_q / heads_kv: one CTA walks the query heads of its K/V head */
    int rows_pad;              /* seqlen_q rounded up to the call's query block (FA3C_BWD_CALL_BLOCK_M): the scratch's rows */
    /* Variable length (NULL = fixed): batch + 1 prefix sums of the query /
     * key counts, and the keys used per sequence, device memory (the API's). */
    const int *cu_seqlens_q, *cu_seqlens_k, *seqused_k;
    /* Scratch, (batch, heads_q, rows_pad[, headdim]) fp32 (bwd_host.c). The
     * rows of lse_log2 and dsum are the smem rows of each query block, row
     * r of block m holding query fa3c_bwd_rows_start(m, ...) + r:
     *   lse_log2  the forward's LSE in log2 units; +inf for fully masked rows, for rows past the
     *             sequence and for rows a shifted block shares with the block before (so P = 0);
     *   dsum      rowsum(dO ⊙ O), 0 on those rows (bwd_prep.cu);
     * dq_accum is in tile order (fa3c_bwd_dq_tile_offset): zeroed, then += dS·K (unscaled) by every
     * key block (atomics), or with dq_written not zeroed; bwd_prep.cu's dq kernel scales it and
     * writes dq.
     * Its rows are the kernel's head dim wide (128 for hdim 96). */
    const float *lse_log2, *dsum;
    float *dq_accum;
    /* deterministic = 1 (NULL otherwise): per (batch, head, query block) the
     * number of key blocks that have added their dQ to it, zeroed; the key
     * blocks that see a query block add in increasing order, each waiting
     * for its turn (bwd_sm90.cuh, add_dq_in_turn), so dq's sums are
     * bitwise reproducible. */
    int *dq_semaphore;
    /* FA3C_BWD_DQ_FIRST_WRITE with the writer, not deterministic (NULL
     * otherwise): per (batch, head, query block), zeroed: 0 = its dQ tile
     * untouched (the accumulator holds garbage; the dq kernel writes zeros),
     * 1 = a key block is storing it, 2 = stored, the others add to it
     * (bwd_dq_writer). */
    int *dq_written;
    int num_m_blocks;          /* rows_pad / the call's query block */
    /* dk (scaled by softmax_scale) and dv, written by the main kernel:
     * element strides (batch, seqlen, heads), all even, headdim stride 1. */
    void *dk, *dv;
    int64_t dk_stride[3], dv_stride[3];
    /* Scores: s = q·k, or with softcap s = softcap * tanh(q·k * softcap_pre)
     * (softcap_pre = softmax_scale / softcap; s is then in natural units);
     * P = exp2(s * score_log2 - lse_log2): score_log2 = softmax_scale·log2(e),
     * or log2(e) with softcap. */
    float score_log2;
    float softcap;             /* 0 = off; dS then carries tanh's derivative 1 - (s / softcap)^2 */
    float softcap_pre;
    float softmax_scale;       /* dK = scale · dSᵀQ, dQ = scale · dS K */
    /* -1 = unbounded; causal is right = 0 (bottom-right aligned per sequence:
     * the kernel turns them into a band of key - query offsets, BwdSeq). */
    int window_left, window_right;
    int headdim;               /* the tensors' (FA3C_BWD_KERNEL_HEADDIM: dk, dv columns past it are not written) */
    int block_n;               /* keys per CTA, FA3C_BWD_BLOCK_N: the K/V maps' box rows (the launch checks it) */
    /* The grid is 1-D: num_n_blocks (the longest sequence's keys / block_n) x heads_kv x batch
     * CTAs, in sections of `section` (K/V head, batch) pairs, key block major within one
     * (bwd_tile_of_cta). The host sets 1: each pair's key blocks in turn. Sections sized to
     * the L2 under a causal mask (FA3's LPT order) measured no faster (bench/RESULTS.md run
     * 119; the host's choice of them is at commit 29fb44d, FA3C_BWD_LPT). */
    int num_n_blocks, section;
    int headdim_v;             /* v's, dout's and dv's columns (problem.headdim_v); the kernel spans the wider */
    /* Queries used per sequence (NULL = all; device memory, the API's): the
     * sequence then has fa3c_bwd_used(...) queries, its last query tile ends
     * there (fa3c_bwd_rows_start), and the rows it takes from the sequence
     * before, which may hold anything past that one's queries used, are
     * zeroed in smem (bwd_producer.cuh). */
    const int *seqused_q;
    /* 1: dk's and dv's rows start 16-byte aligned (pointers and strides), so the
     * staged epilogue (FA3C_BWD_STAGED_EPILOGUE) writes them in 16-byte pieces. */
    int dkv_vec16;
} fa3c_bwd_kernel_params;

/* The preprocessing and dq kernels (bwd_prep.cu): inputs as the API has
 * them, in elements. */
typedef struct fa3c_bwd_prep_params {
    const void *out, *dout;
    int64_t out_stride[3], dout_stride[3];
    /* The forward's LSE, natural log: (batch, heads_q, seqlen_q), or with
     * cu_seqlens_q (heads_q, total_q), total_q = cu_seqlens_q[batch]. */
    const float *lse;
    const int *cu_seqlens_q;   /* NULL = fixed length */
    float *lse_log2, *dsum, *dq_accum;
    int *dq_semaphore;         /* deterministic = 1 (else NULL): zeroed by the preprocessing */
    int *dq_written;           /* the main kernel's (else NULL): zeroed by the preprocessing, which then
                                  leaves dq_accum as it is */
    void *dq;
    int64_t dq_stride[3];
    int batch, seqlen_q, heads_q, headdim, rows_pad;
    int block_m;               /* FA3C_BWD_CALL_BLOCK_M: the main kernel's query block */
    int accum_cols;            /* dq_accum's row length: the kernel's head dim (128 for hdim 96) */
    float softmax_scale;
    const float *sinks;        /* problem.sinks and their gradient's output (fa3c_bwd_dsinks); NULL = none */
    float *dsinks;
    int headdim_v;             /* out's and dout's columns (dsum's sum) */
    const int *seqused_q;      /* as the main kernel's; dq rows past a sequence's queries used are written as zeros */
} fa3c_bwd_prep_params;

#ifdef __CUDACC__
#define FA3C_BWD_HD __host__ __device__
#else
#define FA3C_BWD_HD
#endif

/* Sequence b of packed sequences (prefix sums cu, device memory): its first
 * token and length, clamped as the forward's tiles are (fwd_tile.cuh) so
 * that prefix sums breaking the API's contract (a sequence longer than
 * max_len, sums out of order) give wrong gradients, never an access outside
 * the tensors or the scratch. */
static inline FA3C_BWD_HD void fa3c_bwd_packed_sequence(const int *cu, int b, int batch, int max_len, int *tok0,
                                                        int *len) {
    int t = cu[b], n = cu[b + 1] - t;
    n = n < 0 ? 0 : n > max_len ? max_len : n;
    t = t < 0 ? 0 : t > batch * max_len - n ? batch * max_len - n : t;   /* batch x max_len < 2^31: checked */
    *tok0 = t;
    *len = n;
}

/* Sequence b's queries (keys) used: min(used[b], len), at least 0; len
 * without `used`. */
static inline FA3C_BWD_HD int fa3c_bwd_used(const int *used, int b, int len) {
    if (!used) return len;
    const int n = used[b];
    return n < 0 ? 0 : n < len ? n : len;
}

/* Are query tiles shifted (fa3c_bwd_rows_start)? With packed sequences or
 * queries used per sequence: the main kernel and the preprocessing and dq
 * kernels must agree. */
static inline FA3C_BWD_HD int fa3c_bwd_queries_shifted(const int *cu_seqlens_q, const int *seqused_q) {
    return cu_seqlens_q || seqused_q;
}

/* The first row (query or key, counted in its sequence) of the smem tile of
 * block `block` of `rows` rows, in a sequence of `len` rows: block x rows,
 * or where the maps cannot stop a box at the sequence's end (`shifted`:
 * packed sequences, or queries used per sequence, whose rows past the used
 * ones may hold anything), shifted up so that the box ends there (negative
 * when the sequence is shorter than a box: the tile then starts in the
 * sequence before, or before row 0, which TMA reads as zeros). Tile rows
 * before block x rows belong to the block before, or to no block, and are
 * masked. */
static inline FA3C_BWD_HD int fa3c_bwd_rows_start(int block, int rows, int len, int shifted) {
    return shifted && block * rows + rows > len ? len - rows : block * rows;
}

/* The key block, K/V head and batch of CTA `cta` of the 1-D grid: sections
 * of `section` (K/V head, batch) pairs, the last one narrower where they do
 * not divide; key block major within a section, heads before batches.
 * Under a causal mask key block 0 sees the most query blocks, so every
 * section starts with its longest CTAs and the grid does not end on one
 * (FA3's LPT order). A pair's lower key blocks come first, as the
 * deterministic turns need (add_dq_in_turn). */
static inline FA3C_BWD_HD void fa3c_bwd_tile_of_cta(int cta, int n_blocks, int heads_kv, int batch, int section,
                                                    int *n_block, int *head_kv, int *b) {
    const int pairs = heads_kv * batch, per_section = section * n_blocks;   /* <= pairs x n_blocks < 2^31 */
    const int s = cta / per_section, in_section = cta - s * per_section;
    const int width = pairs - s * section < section ? pairs - s * section : section;
    const int pair = s * section + in_section % width;
    *n_block = in_section / width;
    *head_kv = pair % heads_kv;
    *b = pair / heads_kv;
}

/* dQ's accumulator in tile order (bwd_tiles.h): query block m of a
 * (batch, head) holds its tile's block_m x d floats at m x block_m x d, as
 * pieces of what one consumer warpgroup computes, each in the order of the
 * wgmma accumulator: float4 k of thread t (warp t / 32, lane t % 32) at
 * (k 128 + t) 4, holding accumulator rows 16 warp + lane / 4 (+ 8) and
 * columns 8 k + 2 (lane % 4) (+ 1). So a warp adds 512 contiguous bytes per
 * vector reduction, or a whole block goes out in one bulk reduction.
 * Pieces: 64 query rows x 64 columns (piece (r / 64) (d / 64) + c / 64); or
 * with dQ transposed (FA3C_BWD_DQ_TRANSPOSED) 64 columns x block_m query
 * rows (piece c / 64, the accumulator's rows the columns). The offset of
 * tile row r, column c: */
static inline FA3C_BWD_HD int fa3c_bwd_dq_tile_offset(int r, int c, int d, int block_m) {
    const int transposed = FA3C_BWD_DQ_TRANSPOSED(d);
    const int piece = transposed ? c / 64 : (r / 64) * (d / 64) + c / 64;
    const int piece_size = transposed ? 64 * block_m : 4096;
    const int rr = transposed ? c % 64 : r % 64, cc = transposed ? r : c % 64;   /* accumulator row, column */
    const int t = (rr / 16) * 32 + (rr % 8) * 4 + (cc % 8) / 2, e = ((rr % 16) / 8) * 2 + cc % 2;
    return piece * piece_size + ((cc / 8) * 128 + t) * 4 + e;
}

#ifdef __cplusplus
}
#endif
#endif
