// Which tile a CTA works on. A tile is BLOCK_M query rows of one
// (batch, head). Tiles are numbered longest first: all (batch, head) pairs of
// the last row block, then of the one before, ... (under causal masking the
// last rows see the most keys). A persistent launch deals them out in rounds
// of gridDim.x, in snake order: CTA c takes the c-th tile of even rounds and
// the c-th from the end of odd rounds, so one CTA's long and short tiles
// even out without atomics. (Plain round-robin gave CTA 0 the longest tile
// of every round: hdim 256 causal ran 20% slower, bench/RESULTS.md.)
#pragma once
#include "ptx.cuh"
#include "fwd_params.h"
#include "mask.cuh"

struct FwdTile {
    int batch, head, head_kv, m0;
    int n_begin, n_end;   // key blocks to visit, visited from n_end - 1 down
    int u_begin, u_end;   // key blocks with nothing masked (mask skipped)
};

FA3C_DEVICE int num_tiles(const fa3c_fwd_kernel_params &p) { return p.num_m_blocks * p.batch * p.heads_q; }

FA3C_DEVICE FwdTile tile_at(const fa3c_fwd_kernel_params &p, int tile, int block_m, int block_n) {
    FwdTile t;
    int bh = tile % (p.batch * p.heads_q), m_rev = tile / (p.batch * p.heads_q);
    t.batch = bh / p.heads_q;
    t.head = bh % p.heads_q;
    t.head_kv = t.head / (p.heads_q / p.heads_kv);
    t.m0 = (p.num_m_blocks - 1 - m_rev) * block_m;
    key_block_range(p, t.m0, block_m, block_n, t.n_begin, t.n_end);
    unmasked_block_range(p, t.m0, block_m, block_n, t.u_begin, t.u_end);
    return t;
}

FA3C_DEVICE bool tile_is_empty(const FwdTile &t) { return t.n_end <= t.n_begin; }

// 1 when some element of key block n is masked for some row of the tile
// (uniform over the CTA, so the mask is skipped without divergence).
FA3C_DEVICE bool block_needs_mask(const FwdTile &t, int n) { return n < t.u_begin || n >= t.u_end; }

// The CTA's tile in round r (persistent launch: gridDim.x = number of SMs;
// otherwise gridDim.x = number of tiles and there is one round).
FA3C_DEVICE int tile_of_round(int round) {
    int c = (round & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    return round * gridDim.x + c;
}
