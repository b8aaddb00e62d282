/* The forward kernel's tile plan (see fwd_plan.h). */
#include "fwd_plan.h"

#include <stdint.h>
#include "backend.h"
#include "fwd_combine.h"
#include "fwd_tiles.h"
#include "problem.h"

/* The tile order's L2 sections (scheduler.cuh): as many (batch, head) pairs
 * as keep their K and V within a quarter of the L2 (two sections may be in
 * flight at once, and Q and O stream through the L2 too). At least one pair;
 * -DFA3C_FWD_L2_SECTIONS=0 makes one section of all pairs (the old order). */
#ifndef FA3C_FWD_L2_SECTIONS
#define FA3C_FWD_L2_SECTIONS 1
#endif
static int l2_section_heads(const fa3c_problem *pr, int pack, int l2_bytes) {
    long long pairs = (long long)pr->batch * (pr->heads_q / pack);
    if (!FA3C_FWD_L2_SECTIONS || l2_bytes <= 0) return (int)pairs;
    /* K and V bytes per (batch, head or group): GQA heads that share a KV head share them. */
    double kv_bytes = 2.0 * pr->seqlen_k * pr->headdim * 2 * pack / (pr->heads_q / pr->heads_kv);
    double fit = (l2_bytes / 4.0) / kv_bytes;
    return fit < 1.0 ? 1 : fit >= (double)pairs ? (int)pairs : (int)fit;
}

static int gcd(int a, int b) {
    while (b) {
        int r = a % b;
        a = b;
        b = r;
    }
    return a;
}

int fa3c_fwd_plan_page_rows(const fa3c_problem *pr, int block_n) { return gcd(block_n, pr->page_size); }

/* GQA packing (fwd_params.h): the query heads that share a KV head go into
 * the rows of one tile when that takes fewer tiles, i.e. when seqlen_q is
 * short (decode): each K/V block is then loaded once for all of them, and
 * the tile's rows are used. The group must divide the tile's rows (the Q
 * box is {pack, BLOCK_M / pack} rows). */
int fa3c_fwd_plan_pack(const fa3c_problem *pr, int block_m) {
    int group = pr->heads_q / pr->heads_kv;
    if (group == 1 || block_m % group != 0 || (long long)pr->seqlen_q * group > INT32_MAX) return 1;
    long long packed = ((long long)pr->seqlen_q * group + block_m - 1) / block_m;
    long long unpacked = (long long)group * ((pr->seqlen_q + block_m - 1) / block_m);
    return packed < unpacked ? group : 1;
}

/* Split-KV: how many key ranges. num_splits = 1: one; n > 1: n (at most one
 * per key block, and at most MAX_SPLITS); 0 (auto): split only when the
 * tiles leave SMs idle (decode, short prefill of few heads), into as many
 * ranges as fill the SMs once, each at least MIN_BLOCKS_PER_SPLIT key blocks
 * long so that the extra pass pays. */
enum { MAX_SPLITS = FA3C_MAX_SPLITS, MIN_BLOCKS_PER_SPLIT = 4 };

static int num_key_splits(int requested, long long tiles, int key_blocks, int sms) {
    int splits = requested;
    if (splits == 0) {
        if (sms <= 0 || tiles * 5 >= (long long)sms * 4) return 1;   /* 80% of the SMs busy already */
        long long fill = sms / tiles, most = key_blocks / MIN_BLOCKS_PER_SPLIT;
        splits = (int)(fill < most ? fill : most);
    }
    if (splits > key_blocks) splits = key_blocks;
    if (splits > MAX_SPLITS) splits = MAX_SPLITS;
    return splits < 1 ? 1 : splits;
}

/* The tile order's constants and divisors (fwd_params.h, scheduler.cuh),
 * from pack, groups, num_m_blocks, num_splits, num_tiles and section_heads. */
static void fill_schedule(fa3c_fwd_kernel_params *k) {
    int pairs = k->batch * k->groups;
    k->div_splits = fa3c_fast_div_make(k->num_splits);
    k->div_pack = fa3c_fast_div_make(k->pack);
    k->div_group_size = fa3c_fast_div_make(k->heads_q / k->heads_kv);
    k->div_groups = fa3c_fast_div_make(k->groups);
    k->div_section_tiles = fa3c_fast_div_make(k->section_heads * k->num_m_blocks);
    k->div_section_width = fa3c_fast_div_make(k->section_heads);
    k->full_pair_sections = pairs / k->section_heads;
    k->div_last_width = fa3c_fast_div_make(pairs % k->section_heads ? pairs % k->section_heads : k->section_heads);
    int per_section = k->section_heads * k->num_m_blocks * k->num_splits;
    k->div_pairs_per_section = fa3c_fast_div_make((per_section + 1) / 2);
    k->full_tile_sections = k->num_tiles / per_section;
    k->last_section_tiles = k->num_tiles % per_section;
    k->tile_pairs = k->full_tile_sections * ((per_section + 1) / 2) + (k->last_section_tiles + 1) / 2;
}

fa3c_status fa3c_fwd_plan_tiles(fa3c_fwd_kernel_params *k, const fa3c_problem *pr, int pack, int num_splits,
                                const fa3c_fwd_plan_facts *facts) {
    k->batch = pr->batch;
    k->seqlen_q = pr->seqlen_q;
    k->seqlen_k = pr->seqlen_k;
    k->seqused_k = pr->seqused_k;
    k->seqused_q = pr->seqused_q;
    k->leftpad_k = pr->leftpad_k;
    k->cu_seqlens_q = pr->cu_seqlens_q;
    k->cu_seqlens_k = pr->cu_seqlens_k;
    /* Paged KV: boxes of gcd(block_n, page_size) rows (fwd_params.h); the
     * caller checks that they start on 128-byte boundaries (fa3c_fwd_plan_page_rows). */
    k->page_table = pr->page_table;
    k->page_table_stride = pr->page_table ? pr->page_table_stride : 0;
    k->page_rows = pr->page_table ? fa3c_fwd_plan_page_rows(pr, facts->block_n) : 0;
    k->div_page_size = fa3c_fast_div_make(pr->page_table ? pr->page_size : 1);
    k->heads_q = pr->heads_q;
    k->heads_kv = pr->heads_kv;
    k->window_left = pr->window_left;
    k->window_right = fa3c_window_right(pr);
    k->pack = pack;
    k->groups = pr->heads_q / pack;
    k->rows = pr->seqlen_q * pack;
    k->num_m_blocks = (k->rows + facts->block_m - 1) / facts->block_m;
    /* With a right bound (causal), the last rows see the most keys: the
     * padding rows of the partial tile go to the top (fwd_params.h), in whole
     * consumer warpgroups of 64 rows, which then idle, so that no warpgroup
     * that computes has rows above row 0 (a TMA store there traps). Not with
     * GQA packing, whose Q box must start at a whole query. */
    k->m_shift = FA3C_FWD_CAUSAL_SHIFT && k->window_right >= 0 && pack == 1 && !pr->cu_seqlens_q && !pr->seqused_q
                     ? (k->num_m_blocks * facts->block_m - k->rows) / 64 * 64
                     : 0;   /* packed sequences, seqused_q: each one's tiles end at its end (scheduler.cuh) */
    long long tiles = (long long)k->num_m_blocks * pr->batch * k->groups;
    int key_blocks = (pr->seqlen_k + facts->block_n - 1) / facts->block_n;
    /* Packed queries too: the partials are kept per (batch, head, query of
     * the sequence), and the combine writes each sequence's queries where
     * cu_seqlens_q puts them (fwd_combine.cu). A sequence with fewer key
     * blocks than the longest gets empty splits, which write lse = -inf. */
    k->num_splits = num_key_splits(num_splits, tiles, key_blocks, facts->sms);
    k->blocks_per_split = (key_blocks + k->num_splits - 1) / k->num_splits;
    k->num_splits = (key_blocks + k->blocks_per_split - 1) / k->blocks_per_split;   /* no split without keys */
    if (tiles * k->num_splits > INT32_MAX)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA forward: more than 2^31 tiles of %d query rows",
                          facts->block_m);
    /* Clusters of two CTAs that share their K/V loads (fwd_params.h): where
     * the row blocks of every (batch, group) pair up, without split-KV, and
     * without a mask or window (both halves of a pair walk the same key
     * blocks; masked pairs measured slower); not for sequences of their
     * own lengths or paged KV (not built for them yet). From here on tiles
     * are cluster tiles, dealt out to clusters. */
    int unmasked = k->window_left < 0 && k->window_right < 0;
    k->cluster = facts->cluster > 1 && unmasked && k->num_splits == 1 &&
                         !k->seqused_k && !k->seqused_q && !k->leftpad_k && !k->page_table && !k->cu_seqlens_q &&
                         !k->cu_seqlens_k &&
                         k->num_m_blocks % 2 == 0
                     ? 2
                     : 1;
    k->num_m_blocks /= k->cluster;
    tiles /= k->cluster;
    k->num_tiles = (int)(tiles * k->num_splits);
    int clusters = facts->sms / k->cluster;
    k->grid = k->cluster * (FA3C_FWD_PERSISTENT && clusters > 0 && clusters < k->num_tiles ? clusters : k->num_tiles);
    k->section_heads = l2_section_heads(pr, pack, facts->l2_bytes);
    fill_schedule(k);
    return FA3C_STATUS_OK;
}
