// Cycle stamps of the forward kernel's phases, for tools/gpu.sh trace: where
// a warpgroup's time goes per key block (waiting for K/V, for its turn, for
// S, the softmax, the wait for P·V, the conversion) and at tile edges.
// Only in builds with -DFA3C_FWD_TRACE=1 (fwd_tiles.h); otherwise trace()
// is empty and the kernel is unchanged.
//
// Layout of fa3c_trace_stamps: [CTA < FA3C_TRACE_CTAS][role < 5][key block <
// FA3C_TRACE_BLOCKS][event < TR_EVENTS], each the SM's clock64 at the event
// (0: not recorded). Roles 0-3 are consumer warpgroups, 4 the producer. The
// key-block index is the role's ring counter, which runs over every tile of
// the CTA. The launcher (fwd_launch.cuh) writes the array to the file
// $FA3C_TRACE_OUT after each call; tools/gpu/trace_report.py reads it.
#pragma once
#include "ptx.cuh"
#include "fwd_tiles.h"

enum TraceEvent {
    // consumer, per key block
    TR_TILE_START = 0,   // tile entered (before the Q wait), at its first block
    TR_DATA = 1,         // K (and the previous V) have landed
    TR_TURN = 2,         // its turn to issue GEMMs
    TR_S_READY = 3,      // S = Q·Kᵀ done
    TR_SOFTMAX = 4,      // softmax done
    TR_PV_DONE = 5,      // the previous block's P·V done
    TR_CONVERTED = 6,    // O rescaled, P converted: ready for the next block
    // consumer, the tile's last P·V (at the ring index after the last block)
    TR_LAST_DATA = 8,
    TR_LAST_TURN = 9,
    TR_LAST_PV_DONE = 10,
    TR_TILE_END = 11,    // epilogue done
    // consumer, inside the epilogue (same ring index as TR_TILE_END)
    TR_EPI_BEGIN = 7,    // entered (after, O in the V ring, the ring's reads)
    TR_EPI_STAGE = 14,   // TMA-store epilogue: the staging buffer is free (previous store read it, barrier)
    TR_EPI_STAGED = 15,  // TMA-store epilogue: O is in the staging buffer (stmatrix, fence, barrier)
    // producer, per key block
    TR_K_SLOT_FREE = 12,   // k_empty passed, K load issued
    TR_V_SLOT_FREE = 13,   // v_empty passed, V load issued
    TR_EVENTS = 16
};

#define FA3C_TRACE_CTAS 4
#define FA3C_TRACE_ROLES 5
#define FA3C_TRACE_PRODUCER 4
#define FA3C_TRACE_BLOCKS 4096
enum { TR_NO_BLOCK = FA3C_TRACE_BLOCKS };   // a ring index trace() ignores (tiles with no key block)

#if FA3C_FWD_TRACE
__device__ unsigned long long fa3c_trace_stamps[FA3C_TRACE_CTAS * FA3C_TRACE_ROLES * FA3C_TRACE_BLOCKS * TR_EVENTS];
#endif

// Stamp `event` of key block `ring` for `role`, from the role's first thread
// (a consumer warpgroup's; for the producer role the first lane of the warp
// stamping: the producer, thread 0 or warp 0).
FA3C_DEVICE void trace(int role, int ring, int event) {
#if FA3C_FWD_TRACE
    bool leader = role == FA3C_TRACE_PRODUCER ? threadIdx.x % 32 == 0 : threadIdx.x % 128 == 0;
    if (leader && blockIdx.x < FA3C_TRACE_CTAS && ring < FA3C_TRACE_BLOCKS)
        fa3c_trace_stamps[((blockIdx.x * FA3C_TRACE_ROLES + role) * FA3C_TRACE_BLOCKS + ring) * TR_EVENTS + event] =
            clock64();
#else
    (void)role, (void)ring, (void)event;
#endif
}
