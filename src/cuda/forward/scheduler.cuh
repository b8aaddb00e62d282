// Which tiles a CTA works on, and in what order. A tile is BLOCK_M query
// rows of one (batch, head), against all its keys or, with split-KV, one
// range of them.
//
// Tile numbering (tile_at): the (batch, head) pairs (batch, group with GQA
// packing; the splits of split-KV innermost) are cut into L2
// sections of p.section_heads pairs, whose K and V fit in a part of the L2
// together (chosen on the host, fwd_host.c). Tiles are numbered section by
// section; inside a section longest first: the last row block of every pair,
// then the one before, ... (under causal masking the last rows see the most
// keys; there the partial row block, if any, is the first one: p.m_shift).
// The CTAs running at one time then share the K/V of a few heads through the
// L2 instead of each streaming its own head from DRAM (at 2k the kernel
// was DRAM-bound before).
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
// 17%.) A stream-K tail that cut the last round's tiles into
// equal shares of key blocks measured no gain and was removed
// (it is in the history before the commit that says so).
#pragma once
#include "ptx.cuh"
#include "fwd_params.h"
#include "mask.cuh"
#include "fwd_tiles.h"
#include "fwd_tile.cuh"

// (FwdTile: fwd_tile.cuh.)

FA3C_HOST_DEVICE int num_tiles(const fa3c_fwd_kernel_params &p) { return p.num_tiles; }

// Tiles of one L2 section: the splits of every row block of its pairs.
FA3C_HOST_DEVICE int tiles_per_section(const fa3c_fwd_kernel_params &p) {
    return p.section_heads * p.num_m_blocks * p.num_splits;
}

// The splits of one (batch, group, row block) are consecutive tile numbers.
// Divisions by launch constants go through fast_div.h. VARLEN: the
// variable-length instances, whose sequences have their own lengths
// (sequence_of_batch). With cu_seqlens_q or seqused_q a sequence's row blocks are counted
// from its end (block m_rev covers rows [rows - (m_rev + 1) block_m, + block_m)),
// so that no Q box reaches past the sequence's end (fwd_tile.cuh); a tile
// whose rows all lie below 0 is void (tile_is_void): nothing to do.
template <bool VARLEN = false>
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
    t.m0 = (p.num_m_blocks - 1 - m_rev) * block_m - (FA3C_FWD_CAUSAL_SHIFT ? p.m_shift : 0);
    if (VARLEN) {
        sequence_of_batch(p, t.batch, block_n, t);
        if (rows_from_end(p)) t.m0 = t.rows - (m_rev + 1) * block_m;
        if (t.m0 + block_m <= 0) {   // void: no row of the sequence
            t.n_begin = t.n_end = t.u_begin = t.u_end = 0;
            return t;
        }
    }
    key_block_range<VARLEN>(p, t, t.m0, block_m, block_n, t.n_begin, t.n_end);
    t.n_begin = max(t.n_begin, t.split * p.blocks_per_split);
    t.n_end = min(t.n_end, (t.split + 1) * p.blocks_per_split);
    unmasked_block_range<VARLEN>(p, t, t.m0, block_m, block_n, t.u_begin, t.u_end);
    return t;
}

FA3C_HOST_DEVICE bool tile_is_empty(const FwdTile &t) { return t.n_end <= t.n_begin; }

// A tile with no row of its sequence (variable-length instances, packed
// sequences shorter than the longest): nothing to load, compute or write.
template <bool VARLEN>
FA3C_HOST_DEVICE bool tile_is_void(const FwdTile &t, int block_m) { return VARLEN && t.m0 + block_m <= 0; }

// What the consumer warpgroup of rows [t.m0 + 64 * index, + 64) needs of a
// non-empty tile: the key blocks past its last row's reach (causal, window)
// are masked for all its rows, and they come first in the walk (from n_end - 1
// down), so it skips them (one block is always kept: rows that see no key
// still come out as zeros and -inf on the usual path); and its unmasked range,
// which may be wider than the tile's, so it masks fewer blocks.
template <bool VARLEN = false>
FA3C_HOST_DEVICE FwdTile warpgroup_part(const fa3c_fwd_kernel_params &p, const FwdTile &t, int index, int block_n) {
    FwdTile w = t;
    int m0 = t.m0 + 64 * index, begin, end;
    key_block_range<VARLEN>(p, t, m0, 64, block_n, begin, end);
    w.n_end = max(min(end, t.n_end), t.n_begin + 1);
    unmasked_block_range<VARLEN>(p, t, m0, 64, block_n, w.u_begin, w.u_end);
    return w;
}

// 1 when some element of key block n is masked for some row of the tile (or
// of the warpgroup, for a warpgroup_part): uniform over the warpgroup, so the
// mask is skipped without divergence.
FA3C_HOST_DEVICE bool block_needs_mask(const FwdTile &t, int n) { return n < t.u_begin || n >= t.u_end; }

// Which CTA of how many: read from the hardware in the kernel (only where
// needed), given by a host test. With clusters (p.cluster = 2) the tiles are
// dealt out to clusters as they are to CTAs without: "CTA" is then the
// cluster. (Builds with clusters launch with a cluster size even when it is
// 1, so the cluster registers are always defined.)
struct KernelCta {
    __device__ __forceinline__ int grid() const {
        return FA3C_FWD_CLUSTER > 1 ? (int)cluster_count_x() : (int)gridDim.x;
    }
    __device__ __forceinline__ int index() const {
        return FA3C_FWD_CLUSTER > 1 ? (int)cluster_id_x() : (int)blockIdx.x;
    }
};
struct HostCta {
    int grid_size, cta_index;
    __host__ __device__ __forceinline__ int grid() const { return grid_size; }
    __host__ __device__ __forceinline__ int index() const { return cta_index; }
};

// What the CTA of rank `rank` in a cluster of `cluster` CTAs computes of
// tile number `tile`: the tile itself (cluster 1), or (p.cluster = 2,
// fwd_params.h) its block_m rows of the cluster tile of 2 block_m rows. The
// plan uses clusters only without a mask or window, so both halves walk the
// same key blocks (they share every K/V load).
template <bool VARLEN = false>
FA3C_HOST_DEVICE FwdTile cta_tile_at(const fa3c_fwd_kernel_params &p, int tile, int cluster, int rank, int block_m,
                                     int block_n) {
    FwdTile t = tile_at<VARLEN>(p, tile, block_m * cluster, block_n);
    t.m0 += rank * block_m;
    return t;
}

// What tile_of_step returns instead of a tile number.
enum { NO_MORE_TILES = -1, SKIP_STEP = -2 };

// The tile of the CTA's step-th step: a tile number, SKIP_STEP for the
// missing partner of an odd section's middle tile, or NO_MORE_TILES.
// Producer and consumers walk the same steps.
template <class Cta>
FA3C_HOST_DEVICE int tile_of_step(const fa3c_fwd_kernel_params &p, int step, const Cta &cta) {
    // One CTA per tile (not persistent, or no more tiles than CTAs).
    if (!FA3C_FWD_PERSISTENT || num_tiles(p) <= cta.grid())
        return step == 0 && cta.index() < num_tiles(p) ? cta.index() : NO_MORE_TILES;
    bool uneven = p.window_left >= 0 || p.window_right >= 0;   // causal is window_right = 0
    if (!uneven) {   // round-robin
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
