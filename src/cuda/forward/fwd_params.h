/* The forward kernel's parameters: one POD struct, filled on the host by
 * src/cuda/forward/fwd_host.c and passed by value (__grid_constant__) so the TMA
 * descriptors inside it live in parameter space, as TMA requires. */
#ifndef FA3C_FWD_PARAMS_H
#define FA3C_FWD_PARAMS_H

#include <cuda.h>
#include <stdint.h>
#include "fast_div.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fa3c_fwd_kernel_params {
    CUtensorMap q_map, k_map, v_map;   /* 128B-swizzled boxes of 64 x rows */
    CUtensorMap o_map;                 /* out, boxes of 64 columns x 64 rows (one consumer's), like q_map */
    int out_tma;                       /* 1: o_map is valid; instances with smem to stage O store through it */
    void *out;
    int64_t out_stride[3];             /* elements: batch, seqlen, heads */
    int out_vec16;                     /* 1: out rows allow 16-byte stores (aligned base and strides, out_cols = D) */
    float *lse;                        /* NULL = not written; (batch, heads_q, seqlen_q) */
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    /* GQA packing: the `pack` query heads of a group share one tile, as rows
     * (query i, head h of the group) -> row i * pack + h; 1 = off. A tile
     * covers BLOCK_M of the `rows` = seqlen_q * pack rows of one (batch, group),
     * groups = heads_q / pack. */
    int pack, groups, rows;
    int num_m_blocks;                  /* tiles per (batch, group) and split */
    /* Rows of padding above row 0, a multiple of 64: tile i covers rows
     * [i BLOCK_M - m_shift, + BLOCK_M). Under a causal mask (fwd_plan.c) the
     * partial tile's idle warpgroups go to the top, where the rows see the
     * fewest keys, instead of the bottom, where they see the most (a tile
     * whose one computing warpgroup walks every key block). */
    int m_shift;
    int num_splits;                    /* split-KV: key blocks cut into num_splits ranges */
    int blocks_per_split;              /* key blocks per range */
    int num_tiles;                     /* num_m_blocks * batch * groups * num_splits */
    /* num_splits > 1: each split writes O / its row sum (fp32) and its LSE
     * here, (split, batch, heads_q, seqlen_q[, headdim]), and fwd_combine.cu
     * merges them into out and lse. With packed sequences (cu_seqlens_q) the
     * query index is the query within its sequence, as without. */
    float *o_partial, *lse_partial;
    int section_heads;                 /* (batch, group) pairs per L2 section of the tile order (scheduler.cuh) */
    /* The tile order's constants and divisors, computed once on the host
     * (fwd_host.c, fill_schedule): the scheduler runs per tile, on the
     * critical path between two tiles. */
    fa3c_fast_div div_splits;          /* num_splits */
    fa3c_fast_div div_pack;            /* pack */
    fa3c_fast_div div_group_size;      /* heads_q / heads_kv */
    fa3c_fast_div div_groups;          /* groups */
    fa3c_fast_div div_section_tiles;   /* section_heads * num_m_blocks */
    fa3c_fast_div div_section_width;   /* section_heads */
    fa3c_fast_div div_last_width;      /* pairs in the last section (batch * groups - full sections' pairs) */
    int full_pair_sections;            /* sections holding section_heads pairs */
    /* Longest/shortest pairs under a mask (tile_of_step): */
    fa3c_fast_div div_pairs_per_section;   /* (tiles per section + 1) / 2 */
    int full_tile_sections, last_section_tiles, tile_pairs;
    /* Scores: s = q·k (raw), or with softcap s = softcap * tanh(q·k * softcap_pre).
     * p = exp2(s * score_log2 - off), lse = (off + log2(sum)) * ln 2 (softmax.cuh). */
    float score_log2;
    float softcap;                     /* 0 = off */
    float softcap_pre;                 /* softmax_scale / softcap */
    int window_left, window_right;     /* -1 = unbounded; causal is right = 0 */
    int grid;                          /* CTAs to launch: one per tile, at most one per SM when persistent */
    /* CTAs per cluster: 1, or 2 (FA3C_FWD_CLUSTER, fwd_plan.c): tiles are then
     * cluster tiles of 2 BLOCK_M rows, numbered and dealt out to clusters as
     * tiles are to CTAs; rank r of a cluster takes rows [r BLOCK_M, + BLOCK_M),
     * and each rank loads half of every K and V tile for both (the maps' boxes
     * are BLOCK_N / 2 rows). num_m_blocks and num_tiles count cluster tiles,
     * grid counts CTAs. */
    int cluster;
    /* Variable-length instances (the kernel's VARLEN, fwd_host.c): keys used
     * per sequence, batch int32 in device memory (NULL = seqlen_k each);
     * seqlen_k is the most any may use (the K/V tensors' length). The keys
     * past a sequence's count may hold anything, NaN included: they are
     * masked, and the V rows among them are zeroed before P·V reads them
     * (fwd_producer.cuh, v_guard). */
    const int *seqused_k;
    /* Paged KV (variable-length instances; NULL = K and V per sequence):
     * key j of sequence b is row j % page_size of page
     * page_table[b * page_table_stride + j / page_size], and k_map / v_map
     * are (headdim, page_size, heads_kv, num_pages) with boxes of page_rows =
     * gcd(BLOCK_N, page_size) rows (down to 1), each inside one page
     * (fwd_producer.cuh, load_paged_kv). */
    const int *page_table;
    int64_t page_table_stride;
    int page_rows;
    fa3c_fast_div div_page_size;
    /* Queries used per sequence (variable-length instances; NULL = all of
     * them): batch int32 in device memory, problem.seqused_q. Sequence b has
     * min(seqused_q[b], its queries) queries; its row blocks are then counted
     * from that end, as with cu_seqlens_q (scheduler.cuh), so no tile has a
     * row past it and no O row past it is stored. */
    const int *seqused_q;
    /* Left padding of a KV cache (variable-length instances; NULL = none):
     * batch int32 in device memory, problem.leftpad_k. Sequence b's keys
     * start at row leftpad_k[b] of its cache (sequence_of_batch: k_start) and
     * end where they would without it. Not with a page table (fwd_host.c). */
    const int *leftpad_k;
    /* Where the paged K/V copier's pointers, strides and page count were
     * (removed, docs/KNOBS.md): the fields after keep their offsets, and the
     * kernels their SASS. Never read. */
    int64_t unused_copier_fields[7];
    /* Packed sequences (variable-length instances; NULL = fixed length):
     * batch + 1 prefix sums of the query / key counts, device memory. The
     * q / out (k / v) maps are then one batch of batch x seqlen_q (_k) tokens,
     * a bound the host knows (the true totals are on the device), and every
     * box stays inside its sequence or before it (fwd_tile.cuh, scheduler.cuh). */
    const int *cu_seqlens_q, *cu_seqlens_k;
    /* problem.sinks (NULL = none; FA3C_CUDA_SINKS): one logit per query head
     * in every row's softmax, with no value row; the epilogue (fwd_epilogue.cuh,
     * row_normalizer) or, with split-KV, the combine adds it. Last, so that the
     * fields before keep their offsets (and the kernels their SASS). */
    const float *sinks;
    /* The tensors' head dim (problem.headdim): the kernel's D, or less when a
     * head dim runs on the next wider instance (fwd_host.c, find_fwd). TMA
     * reads the columns past it as zeros, and no store writes them
     * (store_o_rows; store_tile_tma's boxes are clipped at the map's width). */
    int out_cols;
} fa3c_fwd_kernel_params;

#ifdef __cplusplus
}
#endif
#endif
