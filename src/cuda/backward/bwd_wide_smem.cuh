// The wide backward kernel's smem (bwd_wide_sm90.cuh, head dims 192 and 256)
// and what each consumer warpgroup computes (WideShare).
#pragma once
#include "bwd_tiles.h"
#include "bwd_common.cuh"

// DV_: v's and dout's head dim, D but for MLA prefill's 128 at D = 192
// (WideShare): their tiles DV_ columns wide.
template <int D, int DV_ = D>
struct BwdWideSmem {
    enum {
        M = FA3C_BWD_BLOCK_M(D), N = FA3C_BWD_BLOCK_N(D), DV = DV_,
        // hdim 256's 80 keys (bwd_tiles.h): P and dS transposed, and one dO
        // stage (its own ring, bwd_producer), or they would not fit
        TRANSPOSED = N == 80, SPLIT_DO = N == 80, DO_STAGES = SPLIT_DO ? 1 : BWD_STAGES,
        DQ_BUFS = 1   // the writer's dQ buffers (bwd_dq_writer)
    };
    alignas(1024) uint8_t k[N * D * 2];
    alignas(1024) uint8_t v[N * DV * 2];
    alignas(1024) uint8_t q[BWD_STAGES][M * D * 2];
    alignas(1024) uint8_t dout[DO_STAGES][M * DV * 2];
    // P and dS, M query rows x N keys (one 128-byte chunk), or TRANSPOSED
    // N key rows x M queries, two buffers each: both warpgroups read both
    // halves, and one barrier per step orders step it's writes after step
    // it - 2's reads.
    alignas(1024) uint8_t p[2][M * N * 2];
    alignas(1024) uint8_t ds[2][M * N * 2];
    alignas(128) float lse_log2[BWD_STAGES][M];
    alignas(128) float dsum[BWD_STAGES][M];
    uint64_t kv_full;                                  // K and V landed (once)
    uint64_t full[BWD_STAGES], empty[BWD_STAGES];      // the Q / dO / LSE / dsum slots
    uint64_t landed;                                   // a step whose foreign rows the producer zeroes first
    BwdSeq seq;
    // With the writer (FA3C_BWD_WRITER_ON: hdim 192), the block's dQ in
    // tile order for it (bwd_dq_writer), and its barriers (written / read).
    uint64_t dq_full[DQ_BUFS], dq_empty[DQ_BUFS];
    alignas(128) float dq[DQ_BUFS][FA3C_BWD_WRITER_ON(D) ? M * D : 4];
    uint64_t do_full, do_empty;   // SPLIT_DO: dO's one slot
};

// What consumer warpgroup WG computes (compile-time, so that its
// accumulators are register arrays of fixed size). With v's head dim DV =
// 128 at D = 192 (MLA prefill) dV's columns split 64 / 64, so that with dK's
// 128 / 64 and dQ's 64 / 128 both warpgroups do four 64-column tiles.
template <int D, int WG, int DV = D>
struct WideShare {
    static_assert(DV == D || (D == 192 && DV == 128), "the wide backward's value head dims: D, or 128 at D = 192");
    enum {
        NK = FA3C_BWD_BLOCK_N(D) / 2,         // its keys of S, dP, P and dS: [KEY0, KEY0 + NK)
        KEY0 = NK * WG,
        DK_COL0 = WG == 0 ? 0 : 128,          // its head-dim columns of dK
        DK_TILES = WG == 0 ? 2 : D / 64 - 2,  // ... as 64-column wgmma tiles
        DV_COL0 = DV == D ? DK_COL0 : 64 * WG,   // and of dV
        DV_TILES = DV == D ? DK_TILES : 1,
        DQ_COL0 = WG == 0 ? 0 : D - 128,      // its head-dim columns of dQ
        DQ_N = WG == 0 ? D - 128 : 128
    };
};
