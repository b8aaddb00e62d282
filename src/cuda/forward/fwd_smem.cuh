// The forward kernel's shared memory and what every role of the CTA
// agrees on: the named barriers, the layout of Q, the K/V ring, the
// barriers and the O staging (FwdSmem), ring slots and parities, the tile
// layout the TMA boxes and wgmma descriptors share, and the tile walk the
// producer, v_guard and the consumers all follow.
#pragma once
#include "ptx.cuh"
#include "fwd_params.h"
#include "fwd_tiles.h"
#include "scheduler.cuh"

// Named-barrier ids (0 is __syncthreads): per consumer warpgroup, one for
// the turn-taking (pingpong; round robin with 3 warpgroups) and one for its
// epilogue's O staging.
enum FwdNamedBarrier { BAR_TURN_WG0 = 1, BAR_EPILOGUE_WG0 = 4 };

// Where O is staged for the TMA-store epilogue: 64 rows x D per consumer
// warpgroup, as D / 64 boxes of 64 rows x 128 B (128-byte swizzle).
//   O_STAGE_OWN   a buffer of its own, where the smem has room next to Q and
//                 the K/V ring (hdim 64 and 128);
//   O_STAGE_IN_V  over the V ring (hdim 192 and 256, where Q and the ring
//                 take the smem; FA3 does the same): O may be written once
//                 every consumer has released the V slot it goes to, and
//                 the producer loads the next tile's first V only once the
//                 O stores have read the ring (the o_free barrier). With
//                 FA3C_FWD_O_IN_V_SLOT, consumer c takes the slot of the
//                 tile's (CONSUMERS - c)-th last key block, which the others
//                 release earliest (see o_staging);
//   O_STAGE_NONE  D not a multiple of 64 (hdim 96): O goes out from registers.
enum OStagePlace { O_STAGE_NONE, O_STAGE_OWN, O_STAGE_IN_V };

// Bytes of Q, the K/V ring, the barriers (< 1 KB) and the base alignment (1 KB).
template <int D, int BLOCK_N, int STAGES>
constexpr int qkv_smem_bytes() {
    return FA3C_FWD_BLOCK_M(D) * D * 2 + 2 * STAGES * BLOCK_N * D * 2 + 2048;
}
template <int D, int BLOCK_N, int STAGES>
constexpr int o_stage_place() {
    return !FA3C_FWD_TMA_STORE || D % 64 != 0 ? O_STAGE_NONE
           : qkv_smem_bytes<D, BLOCK_N, STAGES>() +
                         FA3C_FWD_CONSUMERS(D) * 64 * D * 2 <= FA3C_FWD_SMEM_LIMIT
               ? O_STAGE_OWN
           : FA3C_FWD_O_IN_V && (FA3C_FWD_O_IN_V_SLOT ? 64 <= BLOCK_N && FA3C_FWD_CONSUMERS(D) <= STAGES
                                                      : FA3C_FWD_CONSUMERS(D) * 64 <= STAGES * BLOCK_N)
               ? O_STAGE_IN_V
               : O_STAGE_NONE;
}
template <int BYTES>
struct OStaging {
    alignas(1024) uint8_t o[BYTES];
};
template <>
struct OStaging<0> {};

template <int D, int BLOCK_N, int STAGES>
struct FwdSmem {
    static constexpr int O_PLACE = o_stage_place<D, BLOCK_N, STAGES>();
    alignas(1024) uint8_t q[FA3C_FWD_BLOCK_M(D) * D * 2];
    alignas(1024) uint8_t k[STAGES][BLOCK_N * D * 2];
    alignas(1024) uint8_t v[STAGES][BLOCK_N * D * 2];
    uint64_t q_full, q_empty;
    uint64_t k_full[STAGES], k_empty[STAGES];
    uint64_t v_full[STAGES], v_empty[STAGES];
    uint64_t o_free;           // O_STAGE_IN_V: the O stores of a tile have read the V ring
    float softmax_anchor[4];   // one per consumer warpgroup, written, never read: see pin_softmax()
    uint64_t v_ready[STAGES];  // variable-length instances: V slot landed and guarded (v_guard)
    OStaging<O_PLACE == O_STAGE_OWN ? FA3C_FWD_CONSUMERS(D) * 64 * D * 2 : 0> staging;
};

// Ring slot and barrier parity of the it-th key block.
FA3C_DEVICE int stage_of(int it, int stages) { return it % stages; }
FA3C_DEVICE uint32_t phase_of(int it, int stages) { return (uint32_t)(it / stages) & 1; }

// O_STAGE_IN_V with FA3C_FWD_O_IN_V_SLOT: the ring index whose V slot
// consumer c stages O in, `ring` being past the tile's last key block:
// ring - CONSUMERS + c. The warpgroups finish a tile in turn order, so the
// first to finish takes the slot the others are done with soonest, and
// waits for that slot alone. (It may be the previous tile's: then the
// producer's o_free wait, before this tile's first V, has freed it.)
template <int D>
FA3C_DEVICE int o_staging_ring_index(int ring, int c) {
    return ring - FA3C_FWD_CONSUMERS(D) + c;
}

// Consumer c's 64 x D staging area (its first 64-column box; the next box is
// 64 * 128 bytes on), or NULL where O goes out from registers.
template <int D, int PLACE>
struct StagingOf {   // O_STAGE_OWN
    template <class Smem>
    FA3C_DEVICE uint8_t *get(Smem &sm, int c, int) { return sm.staging.o + c * 64 * D * 2; }
};
template <int D>
struct StagingOf<D, O_STAGE_IN_V> {
    template <class Smem>
    FA3C_DEVICE uint8_t *get(Smem &sm, int c, int ring) {
        enum { STAGES = sizeof(sm.v) / sizeof(sm.v[0]) };
        if (!FA3C_FWD_O_IN_V_SLOT) return &sm.v[0][0] + c * 64 * D * 2;
        return sm.v[stage_of(o_staging_ring_index<D>(ring, c) + STAGES, STAGES)];   // + STAGES: never negative
    }
};
template <int D>
struct StagingOf<D, O_STAGE_NONE> {
    template <class Smem>
    FA3C_DEVICE uint8_t *get(Smem &, int, int) { return nullptr; }
};
// `ring`: past the tile's last key block (used by O_STAGE_IN_V).
template <int D, int BLOCK_N, int STAGES>
FA3C_DEVICE uint8_t *o_staging(FwdSmem<D, BLOCK_N, STAGES> &sm, int consumer_index, int ring) {
    return StagingOf<D, FwdSmem<D, BLOCK_N, STAGES>::O_PLACE>().get(sm, consumer_index, ring);
}
// Q barrier parity of the use-th tile that loads Q (one Q buffer).
FA3C_DEVICE uint32_t q_phase_of(int use) { return (uint32_t)use & 1; }

// Q in registers (FA3C_FWD_Q_IN_REGS): hdim 128 (2 consumers with 240
// registers; hdim 64's 160-register consumers would spill).
template <int D>
constexpr bool q_in_regs() {
    return FA3C_FWD_Q_IN_REGS && D % 64 == 0 && D <= 128 && FA3C_FWD_CONSUMERS(D) == 2;
}

// A tile of ROWS x D 16-bit elements is stored as D / CHUNK column chunks of
// ROWS rows x ROW_BYTES, swizzled; one TMA box per chunk.
template <int D>
struct TileLayout {
    enum { CHUNK = FA3C_FWD_CHUNK_COLS(D), ROW_BYTES = CHUNK * 2, ATOM_BYTES = 8 * ROW_BYTES };
};

// ---- the tile walk ------------------------------------------------------------

// CTAs per cluster: p.cluster where the build has clusters (FA3C_FWD_CLUSTER).
FA3C_DEVICE int cluster_size(const fa3c_fwd_kernel_params &p) { return FA3C_FWD_CLUSTER > 1 ? p.cluster : 1; }

// Tile number `tile` as this CTA computes it (its rows of a cluster tile).
// VARLEN: the variable-length instances, whose sequences have their own
// number of keys (tile_at).
template <int D, int BLOCK_N, bool VARLEN>
FA3C_DEVICE FwdTile this_cta_tile(const fa3c_fwd_kernel_params &p, int tile) {
    return FA3C_FWD_CLUSTER > 1 ? cta_tile_at<VARLEN>(p, tile, cluster_size(p), (int)cluster_cta_rank(),
                                                      FA3C_FWD_BLOCK_M(D), BLOCK_N)
                                : tile_at<VARLEN>(p, tile, FA3C_FWD_BLOCK_M(D), BLOCK_N);
}
