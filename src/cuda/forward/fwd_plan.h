/* The tile plan of a forward call: GQA packing, split-KV, the tile count,
 * the L2 sections and the tile order's constants (fwd_params.h). Pure
 * arithmetic: the device's facts (SM count, L2 size) come in as numbers, so
 * tests/gpu/test_scheduler.cu checks the plan on the CPU together with the
 * kernel's own scheduler (scheduler.cuh, host-callable). */
#ifndef FA3C_FWD_PLAN_H
#define FA3C_FWD_PLAN_H

#include "fa3c.h"
#include "fwd_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the plan needs from the device and the kernel instance. */
typedef struct fa3c_fwd_plan_facts {
    int sms;        /* SMs; <= 0: unknown (no automatic split) */
    int l2_bytes;   /* L2 size; <= 0: unknown (one L2 section) */
    int block_m;    /* rows per tile */
    int block_n;    /* keys per block */
    int cluster;    /* the most CTAs per cluster the instance can run: 2 with
                       FA3C_FWD_CLUSTER = 2, else 1 (0 is taken as 1) */
} fa3c_fwd_plan_facts;

/* Paged KV: the rows of each K/V box, gcd(block_n, page_size): a box must
 * lie inside one page, and start on a 128-byte boundary of the slot (TMA),
 * which the caller checks (fwd_host.c: any page size for 128-byte rows, an
 * even one for hdim 96's 64-byte rows). */
int fa3c_fwd_plan_page_rows(const fa3c_problem *pr, int block_n);

/* The GQA pack the plan would use: heads_q / heads_kv when packing the
 * query heads of a KV head into one tile takes fewer tiles and the group
 * divides block_m; else 1. */
int fa3c_fwd_plan_pack(const fa3c_problem *pr, int block_m);

/* Fills k's batch, seqlens, seqused_k, page table fields, heads, window (causal is window_right = 0),
 * pack (as given), groups, rows, grid, cluster,
 * num_m_blocks, num_splits, blocks_per_split, num_tiles, section_heads,
 * and the order's constants. num_splits: the call's request (0 = auto).
 * NOT_SUPPORTED (with a message) when there would be 2^31 tiles or more. */
fa3c_status fa3c_fwd_plan_tiles(fa3c_fwd_kernel_params *k, const fa3c_problem *pr, int pack, int num_splits,
                                const fa3c_fwd_plan_facts *facts);

#ifdef __cplusplus
}
#endif
#endif
