// Which tiles a CTA works on, and in what order. A tile is BLOCK_M query
// rows of one (batch, head), against all its keys or, with split-KV, one
// range of them.
//
// Tile numbering (tile_at): the (batch, head) pairs (batch, group with GQA
// packing; the splits of split-KV innermost) are cut into L2
// sections of p.section_heads pairs, whose K and V fit in a part of the L2
// together (chosen on the host, backend.c). Tiles are numbered section by
// section; inside a section longest first: the last row block of every pair,
// then the one before, ... (under causal masking the last rows see the most
// keys). The CTAs running at one time then share the K/V of a few heads
// through the L2 instead of each streaming its own head from DRAM
// (bench/RESULTS.md, run 12: at 2k the kernel was DRAM-bound before).
//
// Persistent order (tile_of_step): without a causal mask or window every
// tile is the same work, and tiles are dealt out round-robin in that order
// (consecutive GQA heads, which share K/V, run at the same time). With one,
// inside each section the k-th longest tile is paired with the k-th
// shortest, and the pairs are dealt out round-robin, one pair (two
// consecutive steps) per CTA: every pair holds about the same work, so every
// CTA gets about the same work, without atomics. (Plain round-robin over
// single tiles gave CTA 0 the longest tile of every round, and rounds that
// straddle sections unbalance a snake order: hdim 256 causal 8k lost 20% and
// 17%, runs 2 and 12.)
#pragma once
#include "ptx.cuh"
#include "fwd_params.h"
#include "mask.cuh"

struct FwdTile {
    int batch, head, head_kv;   // head: the first query head of the tile (of its group, when packed)
    int group;                  // head / p.pack
    int split;                  // key range of split-KV (0 without)
    int m0;                     // first row (query, or query x head when packed)
    int n_begin, n_end;         // key blocks to visit, visited from n_end - 1 down
    int u_begin, u_end;         // key blocks with nothing masked (mask skipped)
};

FA3C_HOST_DEVICE int num_tiles(const fa3c_fwd_kernel_params &p) { return p.num_tiles; }

// Tiles of one L2 section: the splits of every row block of its pairs.
FA3C_HOST_DEVICE int tiles_per_section(const fa3c_fwd_kernel_params &p) {
    return p.section_heads * p.num_m_blocks * p.num_splits;
}

// The splits of one (batch, group, row block) are consecutive tile numbers.
// Divisions by launch constants go through fast_div.h.
FA3C_HOST_DEVICE FwdTile tile_at(const fa3c_fwd_kernel_params &p, int tile, int block_m, int block_n) {
    FwdTile t;
    t.split = fa3c_mod(tile, p.div_splits);
    tile = fa3c_div(tile, p.div_splits);
    int section = fa3c_div(tile, p.div_section_tiles), in_section = fa3c_mod(tile, p.div_section_tiles);
    // The last section may be narrower.
    fa3c_fast_div width = section < p.full_pair_sections ? p.div_section_width : p.div_last_width;
    int bh = section * p.section_heads + fa3c_mod(in_section, width), m_rev = fa3c_div(in_section, width);
    t.batch = fa3c_div(bh, p.div_groups);
    t.group = fa3c_mod(bh, p.div_groups);
    t.head = t.group * p.pack;
    t.head_kv = fa3c_div(t.head, p.div_group_size);
    t.m0 = (p.num_m_blocks - 1 - m_rev) * block_m;
    key_block_range(p, t.m0, block_m, block_n, t.n_begin, t.n_end);
    t.n_begin = max(t.n_begin, t.split * p.blocks_per_split);
    t.n_end = min(t.n_end, (t.split + 1) * p.blocks_per_split);
    unmasked_block_range(p, t.m0, block_m, block_n, t.u_begin, t.u_end);
    return t;
}

FA3C_HOST_DEVICE bool tile_is_empty(const FwdTile &t) { return t.n_end <= t.n_begin; }

// What the consumer warpgroup of rows [t.m0 + 64 * index, + 64) needs of a
// non-empty tile: the key blocks past its last row's reach (causal, window)
// are masked for all its rows, and they come first in the walk (from n_end - 1
// down), so it skips them (one block is always kept: rows that see no key
// still come out as zeros and -inf on the usual path); and its unmasked range,
// which may be wider than the tile's, so it masks fewer blocks.
FA3C_HOST_DEVICE FwdTile warpgroup_part(const fa3c_fwd_kernel_params &p, const FwdTile &t, int index, int block_n) {
    FwdTile w = t;
    int m0 = t.m0 + 64 * index, begin, end;
    key_block_range(p, m0, 64, block_n, begin, end);
    w.n_end = max(min(end, t.n_end), t.n_begin + 1);
    unmasked_block_range(p, m0, 64, block_n, w.u_begin, w.u_end);
    return w;
}

// 1 when some element of key block n is masked for some row of the tile (or
// of the warpgroup, for a warpgroup_part): uniform over the warpgroup, so the
// mask is skipped without divergence.
FA3C_HOST_DEVICE bool block_needs_mask(const FwdTile &t, int n) { return n < t.u_begin || n >= t.u_end; }

// Which CTA of how many: read from the hardware in the kernel (only where
// needed), given by a host test.
struct KernelCta {
    __device__ __forceinline__ int grid() const { return (int)gridDim.x; }
    __device__ __forceinline__ int index() const { return (int)blockIdx.x; }
};
struct HostCta {
    int grid_size, cta_index;
    __host__ __device__ __forceinline__ int grid() const { return grid_size; }
    __host__ __device__ __forceinline__ int index() const { return cta_index; }
};

// The tile of the CTA's step-th step: a tile number, SKIP_STEP for the
// missing partner of an odd section's middle tile, or NO_MORE_TILES.
// Producer and consumers walk the same steps.
enum { NO_MORE_TILES = -1, SKIP_STEP = -2 };
template <class Cta>
FA3C_HOST_DEVICE int tile_of_step(const fa3c_fwd_kernel_params &p, int step, const Cta &cta) {
    // One CTA per tile (not persistent, or no more tiles than CTAs).
    if (!FA3C_FWD_PERSISTENT || num_tiles(p) <= cta.grid())
        return step == 0 && cta.index() < num_tiles(p) ? cta.index() : NO_MORE_TILES;
    bool uneven = p.window_left >= 0 || p.window_right >= 0;   // causal is window_right = 0
    if (!uneven) {
        int tile = step * cta.grid() + cta.index();
        return tile < num_tiles(p) ? tile : NO_MORE_TILES;
    }
    int slot = (step >> 1) * cta.grid() + cta.index();
    if (slot >= p.tile_pairs) return NO_MORE_TILES;
    int section = fa3c_div(slot, p.div_pairs_per_section), k = fa3c_mod(slot, p.div_pairs_per_section);
    int per_section = tiles_per_section(p);
    int n = section < p.full_tile_sections ? per_section : p.last_section_tiles;
    int index = (step & 1) ? n - 1 - k : k;
    if ((step & 1) && index == k) return SKIP_STEP;
    return section * per_section + index;
}
