// The FlashAttention-3 forward kernel for sm_90a (bf16 / fp16).
//
// One CTA computes BLOCK_M = 128 query rows of one (batch, head) (or of a
// GQA group: rows are (query, head) pairs, fwd_params.h), against all keys or
// one split-KV range of them:
//   warpgroup 0  producer: one thread streams Q once, then K and V tiles
//                through a ring of STAGES smem slots with TMA (mbarriers);
//                in the variable-length instances (VARLEN: sequences of
//                their own lengths, seqused_k or cu_seqlens, and paged KV)
//                a second warp zeroes the V rows outside a sequence's keys
//                before P·V reads them (v_guard);
//   warpgroups 1, 2  consumers: 64 rows each. Per key block:
//                S = Q·Kᵀ (wgmma, smem x smem), mask, online softmax,
//                O += P·V (wgmma, P from registers).
// Two overlaps hide the softmax behind tensor-core work:
//   intra-warpgroup: S(j) = Q·K(j)ᵀ and O += P(j-1)·V(j-1) are issued
//     together; softmax(j) may run while P·V(j-1) is still in flight
//     (where ptxas puts it: see pin_softmax);
//   pingpong: named barriers make the two consumer warpgroups take turns
//     issuing GEMMs, so one's softmax runs under the other's GEMMs.
// Key blocks run from the last to the first, so the masked diagonal/edge
// blocks come first and the steady state runs unmasked. O leaves through
// smem and TMA stores where the smem has room (store_tile_tma).
#pragma once
#include "ptx.cuh"
#include "wgmma.cuh"
#include "fwd_params.h"
#include "fwd_tiles.h"
#include "mask.cuh"
#include "softmax.cuh"
#include "scheduler.cuh"
#include "stream_k.cuh"
#include "trace.cuh"

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

// kv_copier's page lookups of one key block (copy_paged_kv) in smem, a row
// per key, where the copies read them (a register array of them spilled the
// copier's 32-40 registers); V of a block reuses K's.
template <int BLOCK_N>
struct CopyRows {
    int row[BLOCK_N];
};
template <>
struct CopyRows<0> {};

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
    int tail_ticket[4];        // per consumer warpgroup: its ticket at a stream-K cut (stream_k.cuh)
    uint64_t v_ready[STAGES];  // variable-length instances: V slot landed and guarded (v_guard)
    CopyRows<FA3C_FWD_PAGED_COPY_FITS(D) ? BLOCK_N : 0> copy_rows;   // kv_copier's page lookups
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

// ---- producer ----------------------------------------------------------------

// A tile of ROWS x D 16-bit elements is stored as D / CHUNK column chunks of
// ROWS rows x ROW_BYTES, swizzled; one TMA box per chunk.
template <int D>
struct TileLayout {
    enum { CHUNK = FA3C_FWD_CHUNK_COLS(D), ROW_BYTES = CHUNK * 2, ATOM_BYTES = 8 * ROW_BYTES };
};

template <int D, int ROWS>
FA3C_DEVICE void load_tile(uint8_t *dst, const CUtensorMap *map, uint64_t *bar, int row0, int head, int batch) {
    typedef TileLayout<D> L;
#pragma unroll
    for (int c = 0; c < D / L::CHUNK; c++)
        tma_load_4d(dst + c * ROWS * L::ROW_BYTES, map, bar, c * L::CHUNK, row0, head, batch);
}

// Q of a tile: a 5-D box per chunk, {CHUNK columns, pack heads, BLOCK_M /
// pack queries} at (query m0 / pack, group, batch), so that box row
// i * pack + h is query i, head h of the group (GQA packing, fwd_params.h;
// pack = 1 is a plain block of BLOCK_M queries of one head). Packed
// sequences (VARLEN, cu_seqlens_q): queries from the sequence's first token
// on a map of one batch of tokens; rows above 0 (the previous sequence's, or
// zeros before the tensor's start) are never stored. There m0 may be below 0,
// a multiple of pack (tile_at): a plain division, exact, keeps its sign.
template <int D, bool VARLEN>
FA3C_DEVICE void load_q_tile(uint8_t *dst, const fa3c_fwd_kernel_params &p, uint64_t *bar, const FwdTile &t) {
    typedef TileLayout<D> L;
    if (VARLEN && p.cu_seqlens_q) {
#pragma unroll
        for (int c = 0; c < D / L::CHUNK; c++)
            tma_load_5d(dst + c * FA3C_FWD_BLOCK_M(D) * L::ROW_BYTES, &p.q_map, bar, c * L::CHUNK, 0,
                        t.q_start + t.m0 / p.pack, t.group, 0);
        return;
    }
#pragma unroll
    for (int c = 0; c < D / L::CHUNK; c++)
        tma_load_5d(dst + c * FA3C_FWD_BLOCK_M(D) * L::ROW_BYTES, &p.q_map, bar, c * L::CHUNK, 0, fa3c_div(t.m0, p.div_pack),
                    t.group, t.batch);
}

// CTAs per cluster: p.cluster where the build has clusters (FA3C_FWD_CLUSTER).
FA3C_DEVICE int cluster_size(const fa3c_fwd_kernel_params &p) { return FA3C_FWD_CLUSTER > 1 ? p.cluster : 1; }

// Tile number `tile` as the CTA's step `step` sees it: in the stream-K tail,
// only this step's piece of its key blocks. Producer and consumers both
// call it, so they walk the same key blocks. VARLEN: the variable-length
// instances, whose sequences have their own number of keys (tile_at).
template <int D, int BLOCK_N, bool VARLEN>
FA3C_DEVICE FwdTile tile_of_step_at(const fa3c_fwd_kernel_params &p, int tile, int step) {
    FwdTile t = FA3C_FWD_CLUSTER > 1 ? cta_tile_at<VARLEN>(p, tile, cluster_size(p), (int)cluster_cta_rank(),
                                                           FA3C_FWD_BLOCK_M(D), BLOCK_N)
                                     : tile_at<VARLEN>(p, tile, FA3C_FWD_BLOCK_M(D), BLOCK_N);
    if (FA3C_FWD_STREAM_K && tile >= p.whole_tiles) piece_of_tail_tile(p, step, KernelCta(), t);
    return t;
}

// K or V of key block n into a ring slot: one CTA's TMA boxes, or in a
// cluster (PAIRED: p.cluster = 2) half of the rows from each CTA, multicast
// into both CTAs' slots (so each slot's full barrier counts the bytes of
// both halves, and its empty barrier the releases of both CTAs' consumers).
template <int D, int ROWS, bool PAIRED>
FA3C_DEVICE void load_kv_tile(uint8_t *dst, const CUtensorMap *map, uint64_t *bar, int row0, int head, int batch) {
    typedef TileLayout<D> L;
    if (PAIRED) {
        enum { HALF = ROWS / 2 };
        static_assert(HALF % 8 == 0, "a half tile must be whole 8-row swizzle atoms");
        const int rank = (int)cluster_cta_rank();
#pragma unroll
        for (int c = 0; c < D / L::CHUNK; c++)
            tma_load_4d_multicast(dst + (c * ROWS + rank * HALF) * L::ROW_BYTES, map, bar, 0x3, c * L::CHUNK,
                                  row0 + rank * HALF, head, batch);
    } else {
        load_tile<D, ROWS>(dst, map, bar, row0, head, batch);
    }
}

// The page of tile t's sequence that holds key `key`, and the key's row in
// it (`row`).
FA3C_DEVICE int page_of_key(const fa3c_fwd_kernel_params &p, const FwdTile &t, int key, int &row) {
    const int page_index = fa3c_div(key, p.div_page_size);
    row = key - page_index * p.div_page_size.d;
    return p.page_table[t.batch * p.page_table_stride + page_index];
}

// Paged KV (p.page_table; variable-length instances): key block n of tile
// t's sequence from its pages, as boxes of p.page_rows rows, each inside one
// page (page_rows divides both BLOCK_N and page_size). Each box starts on a
// 128-byte boundary of the slot, as TMA requires (backend.c). TMA swizzles
// by the smem address (the PTX ISA's swizzle base offset, (dstMem / 128) %
// 8), so boxes that start inside an 8-row swizzle atom (pages of fewer than
// 8 keys, or of 12, 20, ...) land where one box of the same rows would put
// them; the step test tma_paged_boxes_and_zeroed_rows checks boxes of 1 to
// 14 rows and larger ones against one box (it passes on the H200, run 80).
// Small pages mean many boxes: the producer warp's lanes share them, lane i
// taking boxes i, i + 32, ..., so that one page-table load latency covers up
// to 32 boxes and the TMA issues are not one thread's loop. The boxes wholly
// past the sequence's last key are not loaded: their page table entries need
// not be valid, their K rows are masked and their V rows zeroed (v_guard).
// Lane 0 arrives on `bar` expecting the bytes loaded.
template <int D, int BLOCK_N>
FA3C_DEVICE void load_paged_kv(uint8_t *dst, const CUtensorMap *map, uint64_t *bar, const fa3c_fwd_kernel_params &p,
                               const FwdTile &t, int n) {
    typedef TileLayout<D> L;
    const int lane = threadIdx.x % 32;
    const int key0 = n * BLOCK_N, rows = min(BLOCK_N, t.seqlen_k - key0);   // >= 1 (v_guard)
    const int boxes = (rows + p.page_rows - 1) / p.page_rows;
    if (lane == 0) mbar_arrive_expect_tx(bar, boxes * p.page_rows * D * 2);
    __syncwarp();   // the bytes are expected before any box can land
#pragma unroll 1
    for (int box = lane; box < boxes; box += 32) {
        int row;
        const int page = page_of_key(p, t, key0 + box * p.page_rows, row);
#pragma unroll
        for (int c = 0; c < D / L::CHUNK; c++)
            tma_load_4d(dst + (c * BLOCK_N + box * p.page_rows) * L::ROW_BYTES, map, bar, c * L::CHUNK, row, t.head_kv,
                        page);
    }
}

// Whether copy_paged_kv serves head dim D (fwd_tiles.h; backend.c sets
// p.k_data for those only).
template <int D>
constexpr bool paged_copy_fits() {
    return FA3C_FWD_PAGED_COPY_FITS(D);
}

// Whether the variable-length instance copies K and V with cp.async in
// its kv_copier warp (small pages, fwd_params.h k_data) instead of the
// producer's TMA loads.
template <int D, bool VARLEN>
FA3C_DEVICE bool kv_copied(const fa3c_fwd_kernel_params &p) {
    return VARLEN && paged_copy_fits<D>() && p.k_data;
}

// The cache rows of key block n's keys (page * page_size + row in the page:
// pages are page_size rows apart, backend.c) into `table`, lane j looking
// up keys j, 32 + j, ...; -1 for a page outside the cache. `rows`: the
// block's keys in the sequence. FA3C_FWD_COPY_LOOKUPS (fwd_tiles.h) of a
// lane's lookups are in flight at once: 1, one after the other; more, on
// keys clamped to the last one so that the loads need no branch.
template <int BLOCK_N>
FA3C_DEVICE void look_up_cache_rows(uint32_t table, const fa3c_fwd_kernel_params &p, const FwdTile &t, int n, int rows) {
    enum { ROUNDS = (BLOCK_N + 31) / 32, IN_FLIGHT = FA3C_FWD_COPY_LOOKUPS };
    static_assert(IN_FLIGHT >= 1, "FA3C_FWD_COPY_LOOKUPS: at least one lookup in flight");
    const int lane = (int)opaque_u32(threadIdx.x % 32);   // as in copy_paged_kv
    __syncwarp();   // every lane is done reading the last block's rows
    if (IN_FLIGHT == 1) {
#pragma unroll
        for (int r = lane; r < BLOCK_N; r += 32) {
            if (r < rows) {
                int row;
                const int page = page_of_key(p, t, n * BLOCK_N + r, row);
                st_shared_s32(table + 4 * r, page >= 0 && page < p.num_pages ? page * p.div_page_size.d + row : -1);
            }
        }
    } else {
#pragma unroll
        for (int i0 = 0; i0 < ROUNDS; i0 += IN_FLIGHT) {
            int page[IN_FLIGHT], row[IN_FLIGHT];
#pragma unroll
            for (int i = 0; i < IN_FLIGHT && i0 + i < ROUNDS; i++)
                page[i] = page_of_key(p, t, n * BLOCK_N + min(32 * (i0 + i) + lane, rows - 1), row[i]);
#pragma unroll
            for (int i = 0; i < IN_FLIGHT && i0 + i < ROUNDS; i++)
                if (BLOCK_N % 32 == 0 || 32 * (i0 + i) + lane < BLOCK_N)
                    st_shared_s32(table + 4 * (32 * (i0 + i) + lane),
                                  page[i] >= 0 && page[i] < p.num_pages ? page[i] * p.div_page_size.d + row[i] : -1);
        }
    }
    __syncwarp();   // the rows, before any lane reads them
}

// Paged K or V of key block n copied with cp.async into the slot at dst
// (p.k_data: pages whose boxes would be a few rows, where TMA runs at one
// box per ~80 cycles), for head dims whose 16-byte units per key row
// (UNITS) divide 32: each pass of the copier warp copies 32 / UNITS whole
// rows, reading their places in the cache from `table` (look_up_cache_rows:
// K's copy fills it, V's of the same block reuses it). Each unit lands where
// TMA would put it: the chunk's row, its 16-byte column swizzled by the smem
// address, as TMA's 128-byte swizzle does (load_paged_kv). Rows past the
// sequence's last key are not copied (v_guard, masks); a page index outside
// the cache copies zeros (as TMA's bounds would), never reads outside it.
// Returns once the lane's copies are issued (kv_copier commits and waits for
// them).
template <int D, int BLOCK_N, bool IS_V>
FA3C_DEVICE void copy_paged_kv(uint8_t *dst, uint32_t table, const fa3c_fwd_kernel_params &p, const FwdTile &t, int n) {
    typedef TileLayout<D> L;
    enum { UNITS = D * 2 / 16, ROW_UNITS = L::ROW_BYTES / 16, PASS_ROWS = 32 / UNITS };
    static_assert(32 % UNITS == 0, "copy_paged_kv: a key row's units must divide the warp");
    // Opaque lane and head: else ptxas hoists what they give (the lane's
    // places, 64-bit head offsets for K and V) out of kv_copier's loops and
    // spills them from its 32-40 registers.
    const int lane = (int)opaque_u32(threadIdx.x % 32);
    const int rows = min(BLOCK_N, t.seqlen_k - n * BLOCK_N);   // >= 1 (v_guard)
    if (!IS_V) look_up_cache_rows<BLOCK_N>(table, p, t, n, rows);
    // This lane's unit of a row: its smem address in the slot, and its source column.
    const uint32_t unit =
        smem_addr(dst) + (lane % UNITS / ROW_UNITS) * BLOCK_N * L::ROW_BYTES + (lane % ROW_UNITS) * 16;
    const int64_t *stride = IS_V ? p.v_stride : p.k_stride;
    const uint8_t *src = (const uint8_t *)(IS_V ? p.v_data : p.k_data) + (lane % UNITS) * 16 +
                         (int)opaque_u32(t.head_kv) * stride[2] * 2;
    const uint32_t row_bytes = (uint32_t)stride[1] * 2;   // < 2^31: backend.c
    // One row per pass, its cache row loaded a pass ahead (the smem latency
    // off the issue path; unrolling instead spilled the copier's registers).
    int row = lane / UNITS, src_row = row < rows ? ld_shared_s32(table + 4 * row) : 0;
#pragma unroll 1
    while (row < rows) {
        const int next = row + PASS_ROWS;
        const int next_src_row = next < rows ? ld_shared_s32(table + 4 * next) : 0;
        uint32_t addr = unit + row * L::ROW_BYTES;
        addr ^= ((addr >> 7) & (ROW_UNITS - 1)) << 4;   // TMA's swizzle, by address
        // 32 x 32 -> 64 bits, one IMAD.WIDE.U32 (a signed product took three)
        const uint64_t offset = (uint64_t)(uint32_t)max(src_row, 0) * row_bytes;
        cp_async_16(addr, src + offset, src_row >= 0);
        row = next;
        src_row = next_src_row;
    }
}

// Whether this thread of the producer issues its single-thread operations
// (barrier arrivals, Q and unpaged K/V loads). The producer is thread 0, or
// in the variable-length instances warp 0, whose lanes share the paged K/V
// boxes (load_paged_kv) and walk the same loop; lane 0 issues the rest.
template <bool VARLEN>
FA3C_DEVICE bool producer_issuer(void) {
    return !VARLEN || threadIdx.x % 32 == 0;
}

// A value every lane of the producer agrees on: lane 0's (VARLEN, a warp).
template <bool VARLEN>
FA3C_DEVICE uint32_t producer_uniform(uint32_t v) {
    return VARLEN ? __shfl_sync(~0u, v, 0) : v;
}

// K of key block n into the slot of ring index r, once the slot is free.
template <int D, int BLOCK_N, int STAGES, bool PAIRED, bool VARLEN>
FA3C_DEVICE void produce_k(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t, int r,
                           int n) {
    int s = stage_of(r, STAGES);
    mbar_wait_parity(&sm.k_empty[s], phase_of(r, STAGES) ^ 1);
    trace(FA3C_TRACE_PRODUCER, r, TR_K_SLOT_FREE);
    if (VARLEN && p.page_table) {
        load_paged_kv<D, BLOCK_N>(sm.k[s], &p.k_map, &sm.k_full[s], p, t, n);
        return;
    }
    if (!producer_issuer<VARLEN>()) return;
    mbar_arrive_expect_tx(&sm.k_full[s], BLOCK_N * D * 2);
    if (VARLEN && p.cu_seqlens_k)   // packed keys: from the sequence's first token, blocks from key0
        load_kv_tile<D, BLOCK_N, PAIRED>(sm.k[s], &p.k_map, &sm.k_full[s], t.k_start + t.key0 + n * BLOCK_N, t.head_kv,
                                         0);
    else
        load_kv_tile<D, BLOCK_N, PAIRED>(sm.k[s], &p.k_map, &sm.k_full[s], n * BLOCK_N, t.head_kv, t.batch);
}

// Whether the V load of a tile's first key block waits, besides its slot,
// for o_free: with O staged in the V ring, the previous tile's O stores
// must have read it (phase o_free_parity; `tile_count` tiles before this one).
template <int D, int BLOCK_N, int STAGES>
FA3C_DEVICE bool v_waits_o_free(bool first_of_tile, int tile_count) {
    return FwdSmem<D, BLOCK_N, STAGES>::O_PLACE == O_STAGE_IN_V && first_of_tile && tile_count > 0;
}
FA3C_DEVICE uint32_t o_free_parity(int tile_count) { return (uint32_t)(tile_count - 1) & 1; }

// V of key block n into the slot of ring index r, once it is free.
template <int D, int BLOCK_N, int STAGES, bool PAIRED, bool VARLEN>
FA3C_DEVICE void produce_v(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t, int r,
                           int n, bool first_of_tile, int tile_count) {
    int s = stage_of(r, STAGES);
    mbar_wait_parity(&sm.v_empty[s], phase_of(r, STAGES) ^ 1);
    if (v_waits_o_free<D, BLOCK_N, STAGES>(first_of_tile, tile_count))
        mbar_wait_parity(&sm.o_free, o_free_parity(tile_count));
    trace(FA3C_TRACE_PRODUCER, r, TR_V_SLOT_FREE);
    if (VARLEN && p.page_table) {
        load_paged_kv<D, BLOCK_N>(sm.v[s], &p.v_map, &sm.v_full[s], p, t, n);
        return;
    }
    if (!producer_issuer<VARLEN>()) return;
    mbar_arrive_expect_tx(&sm.v_full[s], BLOCK_N * D * 2);
    if (VARLEN && p.cu_seqlens_k)
        load_kv_tile<D, BLOCK_N, PAIRED>(sm.v[s], &p.v_map, &sm.v_full[s], t.k_start + t.key0 + n * BLOCK_N, t.head_kv,
                                         0);
    else
        load_kv_tile<D, BLOCK_N, PAIRED>(sm.v[s], &p.v_map, &sm.v_full[s], n * BLOCK_N, t.head_kv, t.batch);
}

// kv_copier's tile in flight: 2 * slot, + 1 for V (-1: none).
FA3C_DEVICE int copied_tile(int slot, bool is_v) { return 2 * slot + is_v; }

// The tile whose copies kv_copier has in flight (`pending`) has landed:
// lane 0 tells the consumers. The copies are plain (generic proxy) smem
// writes and wgmma reads through the async proxy: each lane waits for its
// own copies (cp.async groups: all but the newest LEFT) and fences the
// proxies before lane 0 arrives on k_full or v_full (count 1 each; no bytes
// expected).
template <int LEFT, int D, int BLOCK_N, int STAGES>
FA3C_DEVICE void copied_tile_landed(FwdSmem<D, BLOCK_N, STAGES> &sm, int pending) {
    cp_async_wait_group<LEFT>();
    fence_proxy_async_smem();   // the copies, before wgmma (the async proxy) reads them
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(pending & 1 ? &sm.v_full[pending / 2] : &sm.k_full[pending / 2]);
}

// kv_copier's wait for a slot (or o_free): if it is not free yet, the tile
// in flight is finished first, as the consumers may need it to free the
// slot (they release V of block j - 1 after S of block j).
template <int D, int BLOCK_N, int STAGES>
FA3C_DEVICE void copier_wait(FwdSmem<D, BLOCK_N, STAGES> &sm, uint64_t *bar, uint32_t parity, int &pending) {
    if (pending >= 0 && !__shfl_sync(~0u, mbar_test_wait_parity(bar, parity), 0)) {
        copied_tile_landed<0>(sm, pending);
        pending = -1;
    }
    mbar_wait_parity(bar, parity);
}

// kv_copier: K or V of block n into slot s, then the tile before it handed
// over (its copies overlap this tile's issue).
template <int D, int BLOCK_N, int STAGES, bool IS_V>
FA3C_DEVICE void copy_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t, int s,
                           int n, int &pending) {
    fence_proxy_async_smem();   // the consumers' wgmma reads of the slot, before these writes
    copy_paged_kv<D, BLOCK_N, IS_V>(IS_V ? sm.v[s] : sm.k[s], smem_addr(&sm.copy_rows), p, t, n);
    cp_async_commit();
    if (pending >= 0) copied_tile_landed<1>(sm, pending);
    pending = copied_tile(s, IS_V);
}

// Q in registers (FA3C_FWD_Q_IN_REGS): hdim 128 (2 consumers with 240
// registers; hdim 64's 160-register consumers would spill).
template <int D>
constexpr bool q_in_regs() {
    return FA3C_FWD_Q_IN_REGS && D % 64 == 0 && D <= 128 && FA3C_FWD_CONSUMERS(D) == 2;
}

// Q of tile t into the Q buffer, once the consumers are done with the last
// one; `use` counts the Q loads (barrier parity).
template <int D, int BLOCK_N, int STAGES, bool VARLEN>
FA3C_DEVICE void produce_q(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                           int use) {
    mbar_wait_parity(&sm.q_empty, q_phase_of(use) ^ 1);   // a fresh barrier passes parity 1 at once
    if (!producer_issuer<VARLEN>()) return;
    mbar_arrive_expect_tx(&sm.q_full, FA3C_FWD_BLOCK_M(D) * D * 2);
    load_q_tile<D, VARLEN>(sm.q, p, &sm.q_full, t);
}

// The tile the producer streams after step `step`'s, if the next step has
// one that is not empty (else false: nothing is fetched ahead of it).
template <int D, int BLOCK_N, bool VARLEN>
FA3C_DEVICE bool next_tile_of(const fa3c_fwd_kernel_params &p, int step, FwdTile &next) {
    int tile = tile_of_step(p, step + 1, KernelCta());
    if (tile < 0) return false;
    next = tile_of_step_at<D, BLOCK_N, VARLEN>(p, tile, step + 1);
    return !tile_is_empty(next);
}

// The producer (one thread, or a warp: producer_issuer) streams, for every
// tile of this CTA, Q once and K, V per key block through the ring. `ring`
// counts key blocks over all tiles: it fixes slot and parity. Q is loaded
// when the consumers are done with the last one: at the tile's start, or
// (FA3C_FWD_EARLY_Q, Q in registers) during the tile before, after the first
// of its key blocks at which the Q buffer is already free (the producer
// never waits for it there: that would hold back the K and V it streams
// ahead, which short tiles need). With small pages (kv_copied) the
// kv_copier warp streams K and V, and the producer only Q.
template <int D, int BLOCK_N, int STAGES, bool PAIRED, bool VARLEN>
FA3C_DEVICE void producer(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm) {
    enum { EARLY_Q = FA3C_FWD_EARLY_Q && q_in_regs<D>() };
    int ring = 0, q_uses = 0, tiles = 0;
    bool q_loaded = false;   // this tile's Q was loaded during the last one (EARLY_Q)
    for (int step = 0, tile; (tile = tile_of_step(p, step, KernelCta())) != NO_MORE_TILES; step++) {
        if (tile == SKIP_STEP) continue;
        FwdTile t = tile_of_step_at<D, BLOCK_N, VARLEN>(p, tile, step);
        if (tile_is_empty(t)) continue;
        const int tile_count = tiles++;   // tiles loaded before this one
        if (!q_loaded) produce_q<D, BLOCK_N, STAGES, VARLEN>(p, sm, t, q_uses++);
        q_loaded = false;
        for (int n = t.n_end - 1; n >= t.n_begin; n--, ring++) {
            if (!kv_copied<D, VARLEN>(p)) {   // else kv_copier's
                produce_k<D, BLOCK_N, STAGES, PAIRED, VARLEN>(p, sm, t, ring, n);
                produce_v<D, BLOCK_N, STAGES, PAIRED, VARLEN>(p, sm, t, ring, n, n == t.n_end - 1, tile_count);
            }
            // The next tile is looked up here, not kept: the producer's 24
            // registers would spill it.
            FwdTile next;
            if (EARLY_Q && !q_loaded &&
                producer_uniform<VARLEN>(mbar_test_wait_parity(&sm.q_empty, q_phase_of(q_uses) ^ 1)) &&
                next_tile_of<D, BLOCK_N, VARLEN>(p, step, next)) {
                produce_q<D, BLOCK_N, STAGES, VARLEN>(p, sm, next, q_uses++);
                q_loaded = true;
            }
        }
    }
}

// ---- V guard (variable-length instances) ---------------------------------------

// Zero rows [from, to) of a tile of ROWS x D (clamped to [0, ROWS)). Each
// column chunk holds its rows one after the other, ROW_BYTES each (the
// swizzle moves 16-byte units only within a row), so those rows are one
// stretch per chunk.
template <int D, int ROWS>
FA3C_DEVICE void zero_rows(uint8_t *tile, int from, int to, int lane) {
    typedef TileLayout<D> L;
    enum { UNITS = ROWS * (L::ROW_BYTES / 16) };   // 16-byte units per chunk
    const uint32_t base = smem_addr(tile);
    const int first = max(from, 0) * (L::ROW_BYTES / 16), end = min(to, ROWS) * (L::ROW_BYTES / 16);
#pragma unroll 1
    for (int c = 0; c < D / L::CHUNK; c++)
#pragma unroll 1
        for (int u = first + lane; u < end; u += 32) st_shared_zero16(base + (c * UNITS + u) * 16);
}

// The variable-length instances' second producer warp. It walks the
// producer's key blocks; once a V tile has landed, it zeroes the rows past
// the sequence's last key, then lets the consumers read the slot (v_ready,
// which they wait for instead of v_full). Those rows are the cache's rows
// past seqused_k or past the sequence's end in its last page, which may hold
// anything, NaN included, or (paged) rows not loaded at all, and P·V would
// multiply them by P = 0 (0 x NaN = NaN: FA3 has this bug with KV caches).
// Keys need no such care: their scores are masked to -inf.
template <int D, int BLOCK_N, int STAGES>
FA3C_DEVICE void v_guard(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm) {
    const int lane = threadIdx.x % 32;
    int ring = 0;
    for (int step = 0, tile; (tile = tile_of_step(p, step, KernelCta())) != NO_MORE_TILES; step++) {
        if (tile == SKIP_STEP) continue;
        const FwdTile t = tile_of_step_at<D, BLOCK_N, true>(p, tile, step);
        if (tile_is_empty(t)) continue;
        for (int n = t.n_end - 1; n >= t.n_begin; n--, ring++) {
            const int s = stage_of(ring, STAGES);
            mbar_wait_parity(&sm.v_full[s], phase_of(ring, STAGES));
            // Rows [first, end) hold keys of the sequence (key0 + n BLOCK_N + row in [0, keys)); end >= 1:
            // the tile needs a key of block n; first > 0 only for packed keys' first block.
            const int key = t.key0 + n * BLOCK_N, first = -key, end = t.seqlen_k - key;
            if (first > 0 || end < BLOCK_N) {
                zero_rows<D, BLOCK_N>(sm.v[s], 0, first, lane);
                zero_rows<D, BLOCK_N>(sm.v[s], end, BLOCK_N, lane);
                fence_proxy_async_smem();   // the zeros, before P·V (wgmma: the async proxy) reads them
            }
            mbar_arrive(&sm.v_ready[s]);   // every lane: each one's zeros are released by its own arrival
        }
    }
}

// The variable-length instances' third producer warp, for small pages
// (kv_copied): it walks the producer's key blocks and copies each one's K
// and V with cp.async (copy_paged_kv) while the producer loads only Q. Two
// tiles (K or V) are in flight: a tile's copies are issued, then the
// previous tile's are waited for and handed over (copy_tile), unless a slot
// wait found the consumers still on it (copier_wait). A warp of its own: in
// the producer's 40 registers the copies spilled.
template <int D, int BLOCK_N, int STAGES>
FA3C_DEVICE void kv_copier(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm) {
    if constexpr (paged_copy_fits<D>()) {
        if (!kv_copied<D, true>(p)) return;
        int ring = 0, tiles = 0, pending = -1;
        for (int step = 0, tile; (tile = tile_of_step(p, step, KernelCta())) != NO_MORE_TILES; step++) {
            if (tile == SKIP_STEP) continue;
            const FwdTile t = tile_of_step_at<D, BLOCK_N, true>(p, tile, step);
            if (tile_is_empty(t)) continue;
            const int tile_count = tiles++;   // as the producer counts them (o_free)
            for (int n = t.n_end - 1; n >= t.n_begin; n--, ring++) {
                const int s = stage_of(ring, STAGES);
                const uint32_t free_parity = phase_of(ring, STAGES) ^ 1;
                copier_wait(sm, &sm.k_empty[s], free_parity, pending);
                trace(FA3C_TRACE_PRODUCER, ring, TR_K_SLOT_FREE);
                copy_tile<D, BLOCK_N, STAGES, false>(p, sm, t, s, n, pending);
                copier_wait(sm, &sm.v_empty[s], free_parity, pending);
                if (v_waits_o_free<D, BLOCK_N, STAGES>(n == t.n_end - 1, tile_count))
                    copier_wait(sm, &sm.o_free, o_free_parity(tile_count), pending);
                trace(FA3C_TRACE_PRODUCER, ring, TR_V_SLOT_FREE);
                copy_tile<D, BLOCK_N, STAGES, true>(p, sm, t, s, n, pending);
            }
        }
        if (pending >= 0) copied_tile_landed<0>(sm, pending);
    }
}

// The barriers that say a V slot may be read: v_full (the load landed), or
// in the variable-length instances v_ready (and v_guard has zeroed it).
template <bool VARLEN, int D, int BLOCK_N, int STAGES>
FA3C_DEVICE uint64_t *v_readable(FwdSmem<D, BLOCK_N, STAGES> &sm) {
    return VARLEN ? sm.v_ready : sm.v_full;
}

// ---- consumer GEMMs ------------------------------------------------------------

// S(64 x BLOCK_N) = Q(rows of this warpgroup) · K(stage)ᵀ; both tiles
// K-major: a k-step of 16 elements is +32 B inside a chunk's row, chunks are
// ROWS * ROW_BYTES apart, 8-row atoms ATOM_BYTES apart. For D >= 192 the Q
// address is made opaque: ptxas otherwise hoists the D / 16 Q descriptors
// (64-bit each) out of the key loop, runs out of uniform registers, and
// moves them back with an R2UR before every wgmma (seen in the SASS).
template <int D, int BLOCK_N, int FP16>
FA3C_DEVICE void gemm_qk(float *s, const uint8_t *q, const uint8_t *k, int consumer) {
    typedef TileLayout<D> L;
    enum { STEPS_PER_CHUNK = L::CHUNK / 16 };
    uint32_t q_addr = smem_addr(q) + consumer * 64 * L::ROW_BYTES;
    if (D >= 192) q_addr = opaque_u32(q_addr);
    const uint64_t q_desc = smem_desc_swizzled(q_addr, 16, L::ATOM_BYTES, L::ROW_BYTES);
    const uint64_t k_desc = smem_desc_swizzled(smem_addr(k), 16, L::ATOM_BYTES, L::ROW_BYTES);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t in_row = (kk % STEPS_PER_CHUNK) * 32, chunk = kk / STEPS_PER_CHUNK;
        uint32_t q_off = chunk * FA3C_FWD_BLOCK_M(D) * L::ROW_BYTES + in_row;
        uint32_t k_off = chunk * BLOCK_N * L::ROW_BYTES + in_row;
        wgmma_ss<BLOCK_N, FP16>(s, smem_desc_advance(q_desc, q_off), smem_desc_advance(k_desc, k_off), kk > 0);
    }
}

// The same S with Q from this warp's registers (FA3C_FWD_Q_IN_REGS): q_frag[kk]
// holds the A fragment of k-step kk (load_q_fragments).
template <int D, int BLOCK_N, int FP16>
FA3C_DEVICE void gemm_qk_regs(float *s, uint32_t (*q_frag)[4], const uint8_t *k) {
    typedef TileLayout<D> L;
    enum { STEPS_PER_CHUNK = L::CHUNK / 16 };
    const uint64_t k_desc = smem_desc_swizzled(smem_addr(k), 16, L::ATOM_BYTES, L::ROW_BYTES);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t k_off = (kk / STEPS_PER_CHUNK) * BLOCK_N * L::ROW_BYTES + (kk % STEPS_PER_CHUNK) * 32;
        wgmma_rsk<BLOCK_N, FP16>(s, q_frag[kk], smem_desc_advance(k_desc, k_off), kk > 0);
    }
}

// A consumer warp's Q rows (16 of its warpgroup's 64) as wgmma A fragments,
// one per k-step of 16 columns, from the Q tile (FA3C_FWD_Q_IN_REGS).
template <int D>
FA3C_DEVICE void load_q_fragments(uint32_t (*q_frag)[4], const uint8_t *q, int consumer) {
    int warp = (threadIdx.x % 128) / 32;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        load_a_fragment<128>(q_frag[kk], q, FA3C_FWD_BLOCK_M(D), consumer * 64 + warp * 16, kk * 16);
}

// S of this warp's 16 rows once more, with warp-level mma.sync, from Q (this
// warp's registers, or the Q tile) and the K slot: the rare path of
// softmax_step_stale (STEP_LOST, a probability overflowed). Per warp, so the
// warpgroup need not agree on it; PV(j-1) may still be in flight.
template <int D, int BLOCK_N, int FP16, bool Q_REGS>
FA3C_DEVICE void recompute_scores_warp(float *s, uint32_t (*q_frag)[4], const uint8_t *q, const uint8_t *k,
                                       int consumer) {
    typedef TileLayout<D> L;
    const int warp = (threadIdx.x % 128) / 32;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; i++) s[i] = 0.f;
    if (Q_REGS) {
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int c = 0; c < BLOCK_N / 16; c++) {   // two n8 slices of S per ldmatrix
                uint32_t b[4];
                load_b_fragments_x2<L::ROW_BYTES>(b, k, BLOCK_N, 16 * c, kk * 16);
                mma_m16n8k16<FP16>(&s[8 * c], q_frag[kk], b[0], b[1]);
                mma_m16n8k16<FP16>(&s[8 * c + 4], q_frag[kk], b[2], b[3]);
            }
    } else {   // Q from smem, fragment by fragment: few registers live (hdim 64 has 160)
#pragma unroll
        for (int c = 0; c < BLOCK_N / 16; c++)
#pragma unroll 1
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[4], b[4];
                load_a_fragment<L::ROW_BYTES>(a, q, FA3C_FWD_BLOCK_M(D), consumer * 64 + warp * 16, kk * 16);
                load_b_fragments_x2<L::ROW_BYTES>(b, k, BLOCK_N, 16 * c, kk * 16);
                mma_m16n8k16<FP16>(&s[8 * c], a, b[0], b[1]);
                mma_m16n8k16<FP16>(&s[8 * c + 4], a, b[2], b[3]);
            }
    }
}

// O(64 x D) += P(64 x BLOCK_N, registers) · V(stage); V is MN-major: a k-step
// is 16 rows, chunks of CHUNK columns are BLOCK_N * ROW_BYTES apart (LBO).
template <int D, int BLOCK_N, int FP16>
FA3C_DEVICE void gemm_pv(float *o, uint32_t (*p_frag)[4], const uint8_t *v) {
    typedef TileLayout<D> L;
    const uint64_t v_desc = smem_desc_swizzled(smem_addr(v), BLOCK_N * L::ROW_BYTES, L::ATOM_BYTES, L::ROW_BYTES);
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; kk++)
        wgmma_rs<D, FP16>(o, p_frag[kk], smem_desc_advance(v_desc, kk * 16 * L::ROW_BYTES), 1);
}

// S = Q·K(slot)ᵀ as one wgmma commit group, Q from this warp's registers
// (q_frag, FA3C_FWD_Q_IN_REGS) or from smem.
template <int D, int BLOCK_N, int FP16, bool Q_REGS>
FA3C_DEVICE void issue_qk(float *s, uint32_t (*q_frag)[4], const uint8_t *q, const uint8_t *k, int consumer) {
    wgmma_fence();
    if (Q_REGS) gemm_qk_regs<D, BLOCK_N, FP16>(s, q_frag, k);
    else gemm_qk<D, BLOCK_N, FP16>(s, q, k, consumer);
    wgmma_commit();
}

// O += P·V(slot) as one wgmma commit group.
template <int D, int BLOCK_N, int FP16>
FA3C_DEVICE void issue_pv(float *o, uint32_t (*p_frag)[4], const uint8_t *v) {
    wgmma_fence();
    gemm_pv<D, BLOCK_N, FP16>(o, p_frag, v);
    wgmma_commit();
}

template <int N>
FA3C_DEVICE void fence_regs(float *x) {
#pragma unroll
    for (int i = 0; i < N; i++) reg_fence(x[i]);
}

// O *= rescale of its row (the online-softmax correction of the last step).
template <int D>
FA3C_DEVICE void rescale_output(float *o, const float rescale[2]) {
    if (FA3C_FWD_ABLATE_SOFTMAX == 1) return;   // the ablation without softmax (fwd_tiles.h)
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] *= rescale[(i / 2) % 2];
}

// ptxas hoists a wgmma wait as early as it may. Left alone, it puts all of
// softmax(j) after the wait for P·V(j-1), so the two run one after the other
// and the intra-warpgroup overlap is lost (seen in the SASS). A shared store
// of a value that depends on every exp of this thread, before the wait, pins
// the softmax in front of it: ptxas keeps memory operations in order around
// the wait. One thread stores, but the dependency holds for the whole
// instruction stream. Per head dim (fwd_tiles.h, FA3C_FWD_SOFTMAX_UNDER_PV).
template <bool PIN>
FA3C_DEVICE void pin_softmax(float *anchor, const SoftmaxState &st, int tid) {
    if (PIN && tid == 0) st_shared_f32(anchor, st.sum[0] + st.sum[1]);
}

// Release a smem slot: one arrival per consumer warp, after its wgmma wait.
FA3C_DEVICE void release(uint64_t *bar) {
    if (threadIdx.x % 32 == 0) mbar_arrive(bar);
}

// Release a K or V ring slot. In a cluster both CTAs' producers write into
// it (load_kv_tile), so each consumer warp arrives on the slot's barrier in
// every CTA of the cluster: lane r on rank r's.
FA3C_DEVICE void release_kv(uint64_t *bar, int cluster) {
    if (FA3C_FWD_CLUSTER > 1 && cluster > 1) {
        const uint32_t lane = threadIdx.x % 32;
        if (lane < (uint32_t)cluster) mbar_arrive_cluster(bar, lane);
    } else {
        release(bar);
    }
}

// O_STAGE_IN_V: wait until every consumer warp has released the last use of
// the V slots this warpgroup stages O in (the v_empty phase of ring index
// ring - 1 - k for each slot; with FA3C_FWD_O_IN_V_SLOT only its own slot's
// index, o_staging_ring_index), so that the tile's P·V have read them before
// O is written over them. The next use of each slot is the next tile's,
// which the producer holds back until release_o_staging.
template <int D, int STAGES>
FA3C_DEVICE void wait_v_ring_read(uint64_t *v_empty, int ring, int consumer_index) {
#pragma unroll
    for (int k = 0; k < (FA3C_FWD_O_IN_V_SLOT ? 1 : STAGES); k++) {
        int r = FA3C_FWD_O_IN_V_SLOT ? o_staging_ring_index<D>(ring, consumer_index) : ring - 1 - k;
        if (r >= 0) mbar_wait_parity(&v_empty[stage_of(r, STAGES)], phase_of(r, STAGES));
    }
}

// O_STAGE_IN_V: one arrival per consumer warpgroup and tile on o_free, after
// this warpgroup's O stores (if it staged) have read the V ring; the producer
// waits for it before the next tile's first V load. In a cluster on every
// CTA's o_free: both producers write into this CTA's V ring.
FA3C_DEVICE void release_o_staging(uint64_t *o_free, bool staged, int cluster) {
    if (threadIdx.x % 128 == 0) {
        if (staged) tma_store_wait_read();
        if (FA3C_FWD_CLUSTER > 1 && cluster > 1) {   // clusters of 2
            mbar_arrive_cluster(o_free, 0);
            mbar_arrive_cluster(o_free, 1);
        } else {
            mbar_arrive(o_free);
        }
    }
}

// Turn-taking between the consumer warpgroups: warpgroup c issues its GEMMs
// when c - 1 has issued its own, so one's softmax runs under the others'
// GEMMs (pingpong with 2, round robin with 3). Each barrier id joins the
// waiting warpgroup and the one passing the turn: 256 threads.
template <int CONSUMERS>
FA3C_DEVICE void wait_my_turn(int consumer) {
    if (FA3C_FWD_PINGPONG) named_bar_sync(BAR_TURN_WG0 + consumer, 256);
}
template <int CONSUMERS>
FA3C_DEVICE void pass_turn(int consumer) {
    if (FA3C_FWD_PINGPONG) named_bar_arrive(BAR_TURN_WG0 + (consumer + 1) % CONSUMERS, 256);
}

// Scores in place: softcap and the mask, where they apply.
template <int BLOCK_N, bool VARLEN>
FA3C_DEVICE void prepare_scores(float *s, const fa3c_fwd_kernel_params &p, const FwdTile &t, int row0, int n,
                                int quad) {
    if (p.softcap > 0.f) {
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; i++) s[i] = p.softcap * tanh_approx(s[i] * p.softcap_pre);
    }
    if (block_needs_mask(t, n)) apply_mask<BLOCK_N, VARLEN>(s, p, t, row0, n, quad);
}

// ---- epilogue ------------------------------------------------------------------

// 4x4 transpose of 32-bit values across the 4 threads of a quad: afterwards
// v[j] of thread q is what v[q] was on thread j. Selects instead of a
// run-time register index, which would send v to local memory.
FA3C_DEVICE void quad_transpose4(uint32_t v[4], int quad) {
    uint32_t out[4] = {v[0], v[1], v[2], v[3]};
#pragma unroll
    for (int j = 1; j < 4; j++) {
        int idx = quad ^ j;
        uint32_t send = idx == 0 ? v[0] : idx == 1 ? v[1] : idx == 2 ? v[2] : v[3];
        uint32_t got = __shfl_xor_sync(~0u, send, j);
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (idx == k) out[k] = got;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = out[k];
}

template <int FP16>
FA3C_DEVICE uint32_t pack2(float lo, float hi) {
    return FP16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
}

// Where the epilogue writes row `row` of a tile: the query and head it
// stands for (GQA packing), or nothing (past the end, or above row 0: only
// warpgroups that write nothing have such rows, p.m_shift).
struct OutRow {
    bool valid;
    int query, head;
};
template <bool VARLEN>
FA3C_DEVICE OutRow out_row(const fa3c_fwd_kernel_params &p, const FwdTile &t, int row) {
    OutRow r;
    r.valid = (unsigned)row < (unsigned)tile_rows<VARLEN>(p, t);   // 0 <= row < rows in one compare
    r.query = query_of_row(p, row);
    r.head = t.head + row - r.query * p.pack;
    return r;
}

// Split-KV: this split's O / its row sum in fp32, and its LSE, for
// fwd_combine.cu to merge. Register o[4c + 2r + e] is column 8c + 2*quad + e:
// a quad writes 32 contiguous bytes per 8 columns.
template <int D>
FA3C_DEVICE void store_partial(const fa3c_fwd_kernel_params &p, const FwdTile &t, const float *o,
                               const float inv[2], const float lse[2], const OutRow rows[2], int quad) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!rows[r].valid) continue;
        int64_t row_index = (((int64_t)t.split * p.batch + t.batch) * p.heads_q + rows[r].head) * p.seqlen_q + rows[r].query;
        float *dst = p.o_partial + row_index * D;
#pragma unroll
        for (int c = 0; c < D / 8; c++) {
            int i = 4 * c + 2 * r;
            *(float2 *)(dst + 8 * c + 2 * quad) = make_float2(o[i] * inv[r], o[i + 1] * inv[r]);
        }
        if (quad == 0) p.lse_partial[row_index] = lse[r];
    }
}

FA3C_DEVICE void write_lse(const fa3c_fwd_kernel_params &p, const FwdTile &t, const float lse[2],
                           const OutRow rows[2], int quad) {
    if (p.lse && quad == 0) {
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (rows[r].valid)
                p.lse[((int64_t)t.batch * p.heads_q + rows[r].head) * p.seqlen_q + rows[r].query] = lse[r];
    }
}

// The LSE of packed sequences (cu_seqlens_q): (heads_q, total_q), fa3c.h.
FA3C_DEVICE void write_lse_packed(const fa3c_fwd_kernel_params &p, const FwdTile &t, const float lse[2],
                                  const OutRow rows[2], int quad) {
    if (p.lse && quad == 0) {
        const int64_t total = min(max(p.cu_seqlens_q[p.batch], 0), p.batch * p.seqlen_q);   // as fwd_tile.cuh
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (rows[r].valid) p.lse[rows[r].head * total + t.q_start + rows[r].query] = lse[r];
    }
}

// Whether consumer warpgroup c may store its O rows of tile t as a TMA box:
// not with packed sequences where its rows start above the sequence's first
// (the box would write the previous sequence's rows): those go out from
// registers, row by row.
template <bool VARLEN>
FA3C_DEVICE bool o_box_allowed(const fa3c_fwd_kernel_params &p, const FwdTile &t, int c) {
    return !VARLEN || !p.cu_seqlens_q || t.m0 + 64 * c >= 0;
}

// O / sum in the input dtype: packed[j] holds o[2j] and o[2j + 1], which are
// row j % 2 of this thread's two rows, 8-column chunk j / 2 (o's layout,
// see epilogue()), each divided by its row's sum.
template <int D, int FP16>
FA3C_DEVICE void pack_output(const float *o, const float inv[2], uint32_t *packed) {
#pragma unroll
    for (int j = 0; j < D / 4; j++) packed[j] = pack2<FP16>(o[2 * j] * inv[j % 2], o[2 * j + 1] * inv[j % 2]);
}

// Packed O (pack_output) through smem and TMA: stmatrix puts the fragments
// into this warpgroup's staging buffer with the 128-byte swizzle, one thread
// stores the D / 64 boxes of 64 rows at query `query0` (rows past the end
// are clipped by the TMA unit; a box starting above row 0 traps, which is
// why p.m_shift moves whole warpgroups there, which idle). The buffer is
// reused by the next tile, once the store has read it.
template <int D>
FA3C_DEVICE void store_tile_tma(const fa3c_fwd_kernel_params &p, const uint32_t *packed, int query0, int group,
                                int batch, uint8_t *stage, int consumer_index, int ring) {
    int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    if (tid == 0) tma_store_wait_read();   // the previous tile's store is done with the buffer
    named_bar_sync(BAR_EPILOGUE_WG0 + consumer_index, 128);
    trace(consumer_index, ring, TR_EPI_STAGE);
    // Lane l addresses row l % 8 of matrix l / 8: matrices 0, 1 are rows 0-7
    // and 8-15 of 8-column chunk c, matrices 2, 3 the same rows of chunk c + 1.
    // (Opaque: computed here, per tile, rather than hoisted to the kernel's
    // start and held, or spilled, through every tile.)
    int m = lane / 8, row = (int)opaque_u32(warp * 16 + (m % 2) * 8 + lane % 8);
#pragma unroll
    for (int c = 0; c < D / 8; c += 2)
        stmatrix_x4(swizzled_unit<128>(stage, 64, row, c + m / 2), packed[2 * c], packed[2 * c + 1],
                    packed[2 * c + 2], packed[2 * c + 3]);
    fence_proxy_async_smem();   // the stores above, before the TMA unit reads them
    named_bar_sync(BAR_EPILOGUE_WG0 + consumer_index, 128);
    trace(consumer_index, ring, TR_EPI_STAGED);
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < D / 64; b++)
            tma_store_5d(&p.o_map, stage + b * (64 * 128), b * 64, 0, query0, group, batch);
        tma_store_commit();
    }
}

// O / sum of this thread's two rows from registers to out[r] (rows[r] valid):
// with p.out_vec16, each group of four 8-column chunks is transposed across
// the quad so that every thread stores 16 contiguous bytes (full 32-byte
// sectors per row instead of half-used ones); otherwise 4-byte stores.
template <int D, int FP16>
FA3C_DEVICE void store_o_rows(const fa3c_fwd_kernel_params &p, const float *o, const float inv[2],
                              const OutRow rows[2], uint16_t *const out[2], int quad) {
    if (p.out_vec16) {
#pragma unroll
        for (int r = 0; r < 2; r++)   // row by row: one row's predicate live at a time
#pragma unroll
            for (int g = 0; g < D / 32; g++) {
                uint32_t v[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int i = 4 * (4 * g + j) + 2 * r;
                    v[j] = pack2<FP16>(o[i] * inv[r], o[i + 1] * inv[r]);
                }
                quad_transpose4(v, quad);
                if (rows[r].valid) *(uint4 *)(out[r] + 8 * (4 * g + quad)) = make_uint4(v[0], v[1], v[2], v[3]);
            }
    } else {
#pragma unroll
        for (int i = 0; i < D / 2; i += 2) {
            int r = (i / 2) % 2, col = 8 * (i / 4) + 2 * quad;
            if (rows[r].valid) *(uint32_t *)(out[r] + col) = pack2<FP16>(o[i] * inv[r], o[i + 1] * inv[r]);
        }
    }
}

// The epilogue of a tile of packed sequences (variable-length instances,
// cu_seqlens_q): rows from the sequence's first token in one batch of
// tokens; a TMA box where the warpgroup's rows all lie in the sequence,
// else row by row from registers (o_box_allowed).
template <int D, int FP16>
FA3C_DEVICE void epilogue_packed(const fa3c_fwd_kernel_params &p, const FwdTile &t, const float *o,
                                 const float inv[2], const float lse[2], const OutRow rows[2], int quad,
                                 uint8_t *stage, int consumer_index, int ring) {
    if (stage && p.out_tma && o_box_allowed<true>(p, t, consumer_index)) {
        uint32_t packed[D / 4];
        pack_output<D, FP16>(o, inv, packed);
        // hdim 64: t.m0 opaque, else ptxas reuses consumer_varlen_tile's first
        // row of the warpgroup, held through the whole tile, and spilled it.
        const int m0 = D == 64 ? (int)opaque_u32(t.m0) : t.m0;
        const int query0 = t.q_start + (m0 + consumer_index * 64) / p.pack;
        store_tile_tma<D>(p, packed, query0, t.group, 0, stage, consumer_index, ring);
    } else {
        uint16_t *out[2];
#pragma unroll
        for (int r = 0; r < 2; r++)
            out[r] = (uint16_t *)p.out + (int64_t)(t.q_start + rows[r].query) * p.out_stride[1] +
                     rows[r].head * p.out_stride[2];
        store_o_rows<D, FP16>(p, o, inv, rows, out, quad);
    }
    write_lse_packed(p, t, lse, rows, quad);
}

// O / sum -> out (input dtype), and the LSE; or, with split-KV, the partial
// results (store_partial). Rows past the end are dropped. `stage`: where
// this warpgroup stages O for store_tile_tma (NULL: nowhere). `ring`: for
// the phase trace only (trace.cuh).
// Register o[4c + 2r + e] is row row0 + 8r, column 8c + 2*quad + e. With
// p.out_vec16, each group of four 8-column chunks is transposed across the
// quad so that every thread stores 16 contiguous bytes (full 32-byte sectors
// per row instead of half-used ones); otherwise 4-byte stores.
template <int D, int FP16, bool VARLEN>
FA3C_DEVICE void epilogue(const fa3c_fwd_kernel_params &p, const FwdTile &t, float *o, SoftmaxState &st, int row0,
                          int quad, uint8_t *stage, int consumer_index, int ring) {
    trace(consumer_index, ring, TR_EPI_BEGIN);
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(st.sum[r]);
        inv[r] = sum > 0.f ? rcp_approx(sum) : 0.f;   // fully masked row: output 0
        lse[r] = sum > 0.f ? (st.off[r] + lg2_approx(sum)) * 0.69314718f : -INFINITY;   // ln 2
    }
    const OutRow rows[2] = {out_row<VARLEN>(p, t, row0), out_row<VARLEN>(p, t, row0 + 8)};
    if (p.num_splits > 1) {
        store_partial<D>(p, t, o, inv, lse, rows, quad);
        return;
    }
    if constexpr (VARLEN) {
        if (p.cu_seqlens_q) {
            epilogue_packed<D, FP16>(p, t, o, inv, lse, rows, quad, stage, consumer_index, ring);
            return;
        }
    }
    if (stage && p.out_tma) {
        const int query0 = fa3c_div(t.m0 + consumer_index * 64, p.div_pack);
        uint32_t packed[D / 4];
        pack_output<D, FP16>(o, inv, packed);
        store_tile_tma<D>(p, packed, query0, t.group, t.batch, stage, consumer_index, ring);
        write_lse(p, t, lse, rows, quad);
        return;
    }
    uint16_t *out[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        out[r] = (uint16_t *)p.out + t.batch * p.out_stride[0] + rows[r].query * p.out_stride[1] +
                 rows[r].head * p.out_stride[2];
    store_o_rows<D, FP16>(p, o, inv, rows, out, quad);
    write_lse(p, t, lse, rows, quad);
}

// ---- consumer ------------------------------------------------------------------

// The epilogue of a tile, through the O staging of this build (O_STAGE_*).
// `ring` is past the tile's last key block; `step` the CTA's step (for the
// stream-K cut, if any).
template <int D, int BLOCK_N, int STAGES, int FP16, bool VARLEN>
FA3C_DEVICE void finish_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                             float *o, SoftmaxState &st, int row0, int quad, int consumer_index, int ring,
                             int step) {
    // A piece of a stream-K cut tile: the piece that finishes second writes
    // it. (One structured path for both: an early return for the other made
    // ptxas move hdim 256's key loop off the uniform datapath.)
    const TailCut cut = cut_of_step(p, step, KernelCta());
    const bool writes = cut.part == CUT_NONE ||
                        meet_other_piece<D, FA3C_FWD_CONSUMERS(D)>(p, cut, o, st, consumer_index,
                                                                   &sm.tail_ticket[consumer_index],
                                                                   BAR_EPILOGUE_WG0 + consumer_index);
    uint8_t *stage = o_staging(sm, consumer_index, ring);
    if (FwdSmem<D, BLOCK_N, STAGES>::O_PLACE != O_STAGE_IN_V) {
        if (writes) epilogue<D, FP16, VARLEN>(p, t, o, st, row0, quad, stage, consumer_index, ring);
        return;
    }
    // O staged in the V ring: once every consumer has read the ring, and only
    // where the epilogue stages (not for split-KV partials or register stores).
    bool staged = writes && p.out_tma && p.num_splits == 1;
    if constexpr (VARLEN) staged = staged && o_box_allowed<VARLEN>(p, t, consumer_index);
    if (staged) wait_v_ring_read<D, STAGES>(sm.v_empty, ring, consumer_index);
    if (writes) epilogue<D, FP16, VARLEN>(p, t, o, st, row0, quad, staged ? stage : nullptr, consumer_index, ring);
    release_o_staging(&sm.o_free, staged, cluster_size(p));
}

// A key block this warpgroup does not compute, with the barrier protocol of
// one it does: its turn (taken at once, so the others lose no time), and the
// release of its ring slot after a wait on the slot's full barriers, so that
// the release counts for this use of the slot.
template <int D, int BLOCK_N, int STAGES, bool VARLEN>
FA3C_DEVICE void skip_key_block(FwdSmem<D, BLOCK_N, STAGES> &sm, int consumer_index, int &ring, int cluster) {
    int s = stage_of(ring, STAGES);
    uint32_t ph = phase_of(ring, STAGES);
    ring++;
    wait_my_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);
    pass_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);
    mbar_wait_parity(&sm.k_full[s], ph);
    release_kv(&sm.k_empty[s], cluster);
    mbar_wait_parity(&v_readable<VARLEN>(sm)[s], ph);
    release_kv(&sm.v_empty[s], cluster);
}

// softmax(j) in place on S(j), whose softcap and mask the caller applied
// (prepare_scores): against the offsets the warp's rows have
// (softmax_step_stale) where it has them; else, or where a probability
// overflowed (S is computed again from the K slot, which the caller still
// holds), against the row max. Returns whether O must be multiplied by
// `rescale`.
template <int D, int BLOCK_N, int FP16, bool Q_REGS, bool VARLEN>
FA3C_DEVICE bool softmax_of_block(float *s, SoftmaxState &st, float rescale[2], const fa3c_fwd_kernel_params &p,
                                  const FwdTile &w, int row0, int n, int quad, uint32_t (*q_frag)[4],
                                  const uint8_t *q, const uint8_t *k, int consumer_index) {
    const int verdict = FA3C_FWD_STALE_MAX && st.ready ? softmax_step_stale<BLOCK_N>(s, st, p.score_log2, rescale)
                                                       : STEP_NEEDS_MAX;
    if (verdict == STEP_LOST) {   // rare: S again, then with the row max
        recompute_scores_warp<D, BLOCK_N, FP16, Q_REGS>(s, q_frag, q, k, consumer_index);
        prepare_scores<BLOCK_N, VARLEN>(s, p, w, row0, n, quad);
    }
    if (verdict >= STEP_LOST) return softmax_step<BLOCK_N>(s, st, p.score_log2, rescale);
    return verdict == STEP_SHIFTED;
}

// One tile of one consumer warpgroup. `ring` is the key-block count over all
// tiles of this CTA (ring slot and parity); `q_phase` this tile's Q barrier
// parity. The warpgroups alternate turns across tiles too: each takes the
// same number of turns per tile (one per key block, plus one). SKIP_MASKED:
// the leading key blocks masked for all of this warpgroup's rows are skipped
// (their turns taken empty), and its own unmasked range is used. VARLEN: the
// variable-length instances (tile_of_step_at, v_guard).
template <int D, int BLOCK_N, int STAGES, int FP16, int SKIP_MASKED, bool VARLEN>
FA3C_DEVICE void consumer_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                               int consumer_index, int &ring, uint32_t q_phase, int step) {
    enum {
        UNDER_PV = FA3C_FWD_SOFTMAX_UNDER_PV_D(D),
        Q_REGS = q_in_regs<D>()
    };
    int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, quad = lane % 4;
    int row0 = t.m0 + consumer_index * 64 + warp * 16 + lane / 4;   // this thread's rows: row0, row0 + 8

    float o[D / 2];
    uint32_t q_frag[Q_REGS ? D / 16 : 1][4];   // FA3C_FWD_Q_IN_REGS: this warp's Q rows
    float s[BLOCK_N / 2];
    uint32_t p_frag[BLOCK_N / 16][4];   // P of the last block, as wgmma A fragments
    SoftmaxState st;
    softmax_init(st);
    float rescale[2];
    bool rescale_o = true;   // O must be multiplied by rescale (softmax_step)

    trace(consumer_index, ring, TR_TILE_START);
    mbar_wait_parity(&sm.q_full, q_phase);
    if (Q_REGS) {   // Q in registers: its smem is free for the next tile at once
        load_q_fragments<D>(q_frag, sm.q, consumer_index);
        release(&sm.q_empty);
    }

    // The blocks masked for all of this warpgroup's rows come first: skipped.
    const FwdTile w = SKIP_MASKED ? warpgroup_part<VARLEN>(p, t, consumer_index, BLOCK_N) : t;
    if (SKIP_MASKED)
        for (int n = t.n_end - 1; n >= w.n_end; n--)
            skip_key_block<D, BLOCK_N, STAGES, VARLEN>(sm, consumer_index, ring, cluster_size(p));

    // First key block: S only; its P·V is issued with the next block's S.
    int n = w.n_end - 1;
    int cur = stage_of(ring, STAGES);
    mbar_wait_parity(&sm.k_full[cur], phase_of(ring, STAGES));
    trace(consumer_index, ring, TR_DATA);
    wait_my_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);
    trace(consumer_index, ring, TR_TURN);
    issue_qk<D, BLOCK_N, FP16, Q_REGS>(s, q_frag, sm.q, sm.k[cur], consumer_index);
    pass_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;   // under the first Q·Kᵀ
    wgmma_wait<0>();
    fence_regs<BLOCK_N / 2>(s);
    trace(consumer_index, ring, TR_S_READY);
    release_kv(&sm.k_empty[cur], cluster_size(p));
    prepare_scores<BLOCK_N, VARLEN>(s, p, w, row0, n, quad);
    rescale_o = softmax_step<BLOCK_N>(s, st, p.score_log2, rescale);   // the rows' first offsets
    trace(consumer_index, ring, TR_SOFTMAX);
    probs_to_fragments<BLOCK_N, FP16>(s, p_frag);
    trace(consumer_index, ring, TR_CONVERTED);

    for (n = n - 1; n >= t.n_begin; n--) {
        int prev = stage_of(ring, STAGES);
        uint32_t prev_phase = phase_of(ring, STAGES);
        ring++;
        cur = stage_of(ring, STAGES);
        mbar_wait_parity(&sm.k_full[cur], phase_of(ring, STAGES));
        mbar_wait_parity(&v_readable<VARLEN>(sm)[prev], prev_phase);
        trace(consumer_index, ring, TR_DATA);
        wait_my_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);
        trace(consumer_index, ring, TR_TURN);
        issue_qk<D, BLOCK_N, FP16, Q_REGS>(s, q_frag, sm.q, sm.k[cur], consumer_index);
        if (!UNDER_PV && rescale_o) rescale_output<D>(o, rescale);   // runs under Q·Kᵀ(j)
        issue_pv<D, BLOCK_N, FP16>(o, p_frag, sm.v[prev]);
        pass_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);

        wgmma_wait<1>();                 // S(j) is ready; P·V(j-1) may still run
        fence_regs<BLOCK_N / 2>(s);
        trace(consumer_index, ring, TR_S_READY);
        prepare_scores<BLOCK_N, VARLEN>(s, p, w, row0, n, quad);
        rescale_o = softmax_of_block<D, BLOCK_N, FP16, Q_REGS, VARLEN>(s, st, rescale, p, w, row0, n, quad, q_frag, sm.q,
                                                               sm.k[cur], consumer_index);
        release_kv(&sm.k_empty[cur], cluster_size(p));   // after a possible recompute of S from it
        pin_softmax<UNDER_PV>(&sm.softmax_anchor[consumer_index], st, tid);
        trace(consumer_index, ring, TR_SOFTMAX);

        wgmma_wait<0>();                 // P·V(j-1) done: its P registers are free
        fence_regs<D / 2>(o);
        trace(consumer_index, ring, TR_PV_DONE);
        release_kv(&sm.v_empty[prev], cluster_size(p));
        if (UNDER_PV && rescale_o) rescale_output<D>(o, rescale);   // to block j's max
        probs_to_fragments<BLOCK_N, FP16>(s, p_frag);
        trace(consumer_index, ring, TR_CONVERTED);
    }
    if (!Q_REGS) release(&sm.q_empty);   // every Q·Kᵀ of this tile has completed

    // Last P·V.
    int last = stage_of(ring, STAGES);
    mbar_wait_parity(&v_readable<VARLEN>(sm)[last], phase_of(ring, STAGES));
    ring++;
    trace(consumer_index, ring, TR_LAST_DATA);
    wait_my_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);
    trace(consumer_index, ring, TR_LAST_TURN);
    if (!UNDER_PV && rescale_o) rescale_output<D>(o, rescale);
    issue_pv<D, BLOCK_N, FP16>(o, p_frag, sm.v[last]);
    pass_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);
    wgmma_wait<0>();
    fence_regs<D / 2>(o);
    trace(consumer_index, ring, TR_LAST_PV_DONE);
    release_kv(&sm.v_empty[last], cluster_size(p));
    finish_tile<D, BLOCK_N, STAGES, FP16, VARLEN>(p, sm, t, o, st, row0, quad, consumer_index, ring, step);
    trace(consumer_index, ring, TR_TILE_END);
}

// A consumer warpgroup whose 64 rows all lie past the end (decode: a few
// packed rows in a 128-row tile) or above row 0 (p.m_shift) computes
// nothing, but keeps the barrier protocol of consumer_tile: the same waits
// and releases of every ring slot and the same number of turns.
template <int D, int BLOCK_N, int STAGES, bool VARLEN>
FA3C_DEVICE void idle_consumer_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                                    int consumer_index, int &ring, uint32_t q_phase) {
    mbar_wait_parity(&sm.q_full, q_phase);
    release(&sm.q_empty);   // at once: the producer may load the next Q during this tile (FA3C_FWD_EARLY_Q)
    for (int n = t.n_end - 1; n >= t.n_begin; n--)
        skip_key_block<D, BLOCK_N, STAGES, VARLEN>(sm, consumer_index, ring, cluster_size(p));
    wait_my_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);   // consumer_tile takes one turn more than key blocks
    pass_turn<FA3C_FWD_CONSUMERS(D)>(consumer_index);
    if (FwdSmem<D, BLOCK_N, STAGES>::O_PLACE == O_STAGE_IN_V) release_o_staging(&sm.o_free, false, cluster_size(p));
}

// Rows whose every key is masked (or an empty key range): zeros and -inf.
template <int D, int BLOCK_N, int STAGES, int FP16, bool VARLEN>
FA3C_DEVICE void write_empty_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                                  int consumer_index) {
    int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, quad = lane % 4;
    int row0 = t.m0 + consumer_index * 64 + warp * 16 + lane / 4;
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    SoftmaxState st;
    softmax_init(st);
    // Not through the V ring: the producer may be filling it for the next tile.
    bool in_v = FwdSmem<D, BLOCK_N, STAGES>::O_PLACE == O_STAGE_IN_V;
    epilogue<D, FP16, VARLEN>(p, t, o, st, row0, quad, in_v ? nullptr : o_staging(sm, consumer_index, 0), consumer_index,
                     TR_NO_BLOCK);
}

// The variable-length instances' dispatch of a tile to a consumer warpgroup
// (consumer() below): as the fixed-length one, but a tile may be void (no
// row of its packed sequence), and a packed sequence's first tile may start
// at any row above 0, so that a warpgroup with rows on both sides computes
// and writes its rows from 0 on.
template <int D, int BLOCK_N, int STAGES, int FP16>
FA3C_DEVICE void consumer_varlen_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm,
                                      const FwdTile &t, int consumer_index, int &ring, int &q_uses, int step) {
    if (tile_is_void<true>(t, FA3C_FWD_BLOCK_M(D))) return;
    const int wg_m0 = t.m0 + consumer_index * 64;
    if (tile_is_empty(t)) {
        if (wg_m0 + 64 > 0) write_empty_tile<D, BLOCK_N, STAGES, FP16, true>(p, sm, t, consumer_index);
    } else if (wg_m0 + 64 <= 0 || wg_m0 >= t.rows) {   // no row of the sequence: idle
        idle_consumer_tile<D, BLOCK_N, STAGES, true>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++));
    } else if (p.window_right >= 0) {
        consumer_tile<D, BLOCK_N, STAGES, FP16, 1, true>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++), step);
    } else {
        consumer_tile<D, BLOCK_N, STAGES, FP16, 0, true>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++), step);
    }
}

template <int D, int BLOCK_N, int STAGES, int FP16, bool VARLEN>
FA3C_DEVICE void consumer(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, int consumer_index) {
    int ring = 0, q_uses = 0;
    enum { CONSUMERS = FA3C_FWD_CONSUMERS(D) };
    if (consumer_index == CONSUMERS - 1) pass_turn<CONSUMERS>(consumer_index);   // warpgroup 0 goes first
    for (int step = 0, tile; (tile = tile_of_step(p, step, KernelCta())) != NO_MORE_TILES; step++) {
        if (tile == SKIP_STEP) continue;
        FwdTile t = tile_of_step_at<D, BLOCK_N, VARLEN>(p, tile, step);
        if constexpr (VARLEN) {   // (a separate path: the fixed-length code stays as it was, byte for byte)
            consumer_varlen_tile<D, BLOCK_N, STAGES, FP16>(p, sm, t, consumer_index, ring, q_uses, step);
            continue;
        }
        // This warpgroup's first row; < 0: all its rows are above row 0 (p.m_shift), none to write.
        const int wg_m0 = t.m0 + consumer_index * 64;
        if (tile_is_empty(t)) {
            if (!FA3C_FWD_CAUSAL_SHIFT || wg_m0 >= 0)
                write_empty_tile<D, BLOCK_N, STAGES, FP16, VARLEN>(p, sm, t, consumer_index);
        } else if ((unsigned)wg_m0 >= (unsigned)p.rows) {   // past the end or above row 0: idle
            idle_consumer_tile<D, BLOCK_N, STAGES, VARLEN>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++));
        } else {
            // Only rows with a last key (causal, window) can have leading
            // blocks masked for a whole warpgroup. The skipping code is a
            // separate copy: its ring position differs per warpgroup, which
            // costs uniform registers in the loop (2% without masks, run 24).
            if (p.window_right >= 0)
                consumer_tile<D, BLOCK_N, STAGES, FP16, 1, VARLEN>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++),
                                                                   step);
            else
                consumer_tile<D, BLOCK_N, STAGES, FP16, 0, VARLEN>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++),
                                                                   step);
        }
    }
    if (consumer_index == 0) wait_my_turn<CONSUMERS>(0);   // take the last warpgroup's last pass: barriers end balanced
    if (threadIdx.x % 128 == 0) tma_store_wait_all();      // the staging smem must outlive the O stores
}

// The setmaxnreg budgets of an instance (fwd_tiles.h). The variable-length
// instances' producer warpgroup (key counts, page lookups, v_guard) spilled
// at 24 registers: it gets more, the consumers a little less. TOTAL must fit
// the CTA's register pool, or a setmaxnreg.inc waits forever: checked here
// against the launch bounds, and at launch against ptxas's register count.
template <int D, bool VARLEN>
struct RegBudget {
    enum {
        PRODUCER = VARLEN ? FA3C_FWD_PRODUCER_REGS_VARLEN(D) : FA3C_FWD_PRODUCER_REGS(D),
        CONSUMER = VARLEN ? FA3C_FWD_CONSUMER_REGS_VARLEN(D) : FA3C_FWD_CONSUMER_REGS(D),
        TOTAL = 128 * PRODUCER + 128 * FA3C_FWD_CONSUMERS(D) * CONSUMER
    };
    static_assert(TOTAL <= FA3C_FWD_REG_POOL(D), "setmaxnreg budgets past the CTA's register pool");
};

// VARLEN: the variable-length instance of the head dim and dtype (sequences
// with their own number of keys, p.seqused_k, or paged KV; backend.c picks it).
template <int D, int BLOCK_N, int FP16, bool VARLEN>
__global__ void __launch_bounds__(FA3C_FWD_THREADS(D), 1) fwd_kernel(const __grid_constant__ fa3c_fwd_kernel_params p) {
    enum { STAGES = FA3C_FWD_STAGES(D) };
    typedef FwdSmem<D, BLOCK_N, STAGES> Smem;
    extern __shared__ uint8_t smem_raw[];
    Smem &sm = *(Smem *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);

    if (threadIdx.x == 0) {
        tma_prefetch_map(&p.q_map);
        tma_prefetch_map(&p.k_map);
        tma_prefetch_map(&p.v_map);
        if (p.out_tma) tma_prefetch_map(&p.o_map);
        // K/V slots and o_free count the consumers of every CTA in the cluster.
        const int cluster = cluster_size(p);
        mbar_init(&sm.q_full, 1);
        mbar_init(&sm.q_empty, 4 * FA3C_FWD_CONSUMERS(D));             // one per consumer warp
        mbar_init(&sm.o_free, FA3C_FWD_CONSUMERS(D) * cluster);        // one per consumer warpgroup
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&sm.k_full[s], 1);
            mbar_init(&sm.v_full[s], 1);
            mbar_init(&sm.k_empty[s], 4 * FA3C_FWD_CONSUMERS(D) * cluster);
            mbar_init(&sm.v_empty[s], 4 * FA3C_FWD_CONSUMERS(D) * cluster);
            if (VARLEN) mbar_init(&sm.v_ready[s], 32);   // v_guard's lanes
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (cluster_size(p) > 1) cluster_sync();   // the other CTA's barriers are ready before any multicast

    // Warpgroup-uniform role, as setmaxnreg requires (budgets: RegBudget).
    int warpgroup = __shfl_sync(~0u, threadIdx.x / 128, 0);
    if (warpgroup == 0) {
        reg_dealloc<RegBudget<D, VARLEN>::PRODUCER>();
        // In a cluster (p.cluster = 2) the producer is a copy of its own: a
        // run-time branch per load spilled the 24-register producer.
        if (threadIdx.x < (VARLEN ? 32 : 1)) {   // producer_issuer
            if (cluster_size(p) > 1) producer<D, BLOCK_N, STAGES, true, VARLEN>(p, sm);
            else producer<D, BLOCK_N, STAGES, false, VARLEN>(p, sm);
        } else if (VARLEN && threadIdx.x / 32 == 1) {
            v_guard<D, BLOCK_N, STAGES>(p, sm);
        } else if (VARLEN && threadIdx.x / 32 == 2) {
            kv_copier<D, BLOCK_N, STAGES>(p, sm);
        }
    } else {
        reg_alloc<RegBudget<D, VARLEN>::CONSUMER>();
        consumer<D, BLOCK_N, STAGES, FP16, VARLEN>(p, sm, warpgroup - 1);
    }
    // The other CTA's producer writes into this CTA's smem and its consumers
    // arrive on this CTA's barriers until both are done.
    if (cluster_size(p) > 1) cluster_sync();
}

// Dynamic smem a launch needs (the +1024 lets the kernel align the base).
template <int D, int BLOCK_N>
static size_t fwd_smem_bytes(void) {
    static_assert(sizeof(FwdSmem<D, BLOCK_N, FA3C_FWD_STAGES(D)>) + 1024 <= FA3C_FWD_SMEM_LIMIT,
                  "the forward kernel's smem exceeds what a block may use");
    return sizeof(FwdSmem<D, BLOCK_N, FA3C_FWD_STAGES(D)>) + 1024;
}
