// The forward kernel's producer warpgroup (warpgroup 0, fwd_sm90.cuh):
// the producer (one thread, or in the variable-length instances warp 0)
// streams Q and the K/V ring with TMA; in the variable-length instances
// v_guard (warp 1) zeroes the V rows outside a sequence's keys.
#pragma once
#include "fwd_smem.cuh"
#include "trace.cuh"

// ---- producer ----------------------------------------------------------------

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
// zeros before the tensor's start) are never stored. With seqused_q alone the
// same (rows_from_end), on the map of (batch, seqlen_q). There m0 may be below 0,
// a multiple of pack (tile_at): a plain division, exact, keeps its sign.
template <int D, bool VARLEN>
FA3C_DEVICE void load_q_tile(uint8_t *dst, const fa3c_fwd_kernel_params &p, uint64_t *bar, const FwdTile &t) {
    typedef TileLayout<D> L;
    if (VARLEN && rows_from_end(p)) {
#pragma unroll
        for (int c = 0; c < D / L::CHUNK; c++)
            tma_load_5d(dst + c * FA3C_FWD_BLOCK_M(D) * L::ROW_BYTES, &p.q_map, bar, c * L::CHUNK, 0,
                        t.q_start + t.m0 / p.pack, t.group, p.cu_seqlens_q ? 0 : t.batch);
        return;
    }
#pragma unroll
    for (int c = 0; c < D / L::CHUNK; c++)
        tma_load_5d(dst + c * FA3C_FWD_BLOCK_M(D) * L::ROW_BYTES, &p.q_map, bar, c * L::CHUNK, 0, fa3c_div(t.m0, p.div_pack),
                    t.group, t.batch);
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
// 128-byte boundary of the slot, as TMA requires (fwd_host.c). TMA swizzles
// by the smem address (the PTX ISA's swizzle base offset, (dstMem / 128) %
// 8), so boxes that start inside an 8-row swizzle atom (pages of fewer than
// 8 keys, or of 12, 20, ...) land where one box of the same rows would put
// them; the step test tma_paged_boxes_and_zeroed_rows checks boxes of 1 to
// 14 rows and larger ones against one box.
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

// K or V (IS_V) of key block n into slot s, whose wait is the caller's: the
// paged boxes (every lane of the producer warp), or the tile (the issuer).
template <int D, int BLOCK_N, int STAGES, bool PAIRED, bool VARLEN, bool IS_V>
FA3C_DEVICE void load_kv_slot(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                              int s, int n) {
    uint8_t *dst = IS_V ? sm.v[s] : sm.k[s];
    const CUtensorMap *map = IS_V ? &p.v_map : &p.k_map;
    uint64_t *full = IS_V ? &sm.v_full[s] : &sm.k_full[s];
    if (VARLEN && p.page_table) {
        load_paged_kv<D, BLOCK_N>(dst, map, full, p, t, n);
        return;
    }
    if (!producer_issuer<VARLEN>()) return;
    mbar_arrive_expect_tx(full, BLOCK_N * D * 2);
    if (VARLEN && p.cu_seqlens_k)   // packed keys: from the sequence's first token, blocks from key0
        load_kv_tile<D, BLOCK_N, PAIRED>(dst, map, full, t.k_start + t.key0 + n * BLOCK_N, t.head_kv, 0);
    else   // the batch's cache, from its first key (VARLEN: past leftpad_k)
        load_kv_tile<D, BLOCK_N, PAIRED>(dst, map, full, (VARLEN ? t.k_start : 0) + n * BLOCK_N, t.head_kv, t.batch);
}

// K of key block n into the slot of ring index r, once the slot is free.
template <int D, int BLOCK_N, int STAGES, bool PAIRED, bool VARLEN>
FA3C_DEVICE void produce_k(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t, int r,
                           int n) {
    int s = stage_of(r, STAGES);
    mbar_wait_parity(&sm.k_empty[s], phase_of(r, STAGES) ^ 1);
    trace(FA3C_TRACE_PRODUCER, r, TR_K_SLOT_FREE);
    load_kv_slot<D, BLOCK_N, STAGES, PAIRED, VARLEN, false>(p, sm, t, s, n);
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
    load_kv_slot<D, BLOCK_N, STAGES, PAIRED, VARLEN, true>(p, sm, t, s, n);
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
    next = this_cta_tile<D, BLOCK_N, VARLEN>(p, tile);
    return !tile_is_empty(next);
}

// The producer (one thread, or a warp: producer_issuer) streams, for every
// tile of this CTA, Q once and K, V per key block through the ring. `ring`
// counts key blocks over all tiles: it fixes slot and parity. Q is loaded
// when the consumers are done with the last one: at the tile's start, or
// (FA3C_FWD_EARLY_Q, Q in registers) during the tile before, after the first
// of its key blocks at which the Q buffer is already free (the producer
// never waits for it there: that would hold back the K and V it streams
// ahead, which short tiles need).
template <int D, int BLOCK_N, int STAGES, bool PAIRED, bool VARLEN>
FA3C_DEVICE void producer(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm) {
    enum { EARLY_Q = FA3C_FWD_EARLY_Q && q_in_regs<D>() };
    int ring = 0, q_uses = 0, tiles = 0;
    bool q_loaded = false;   // this tile's Q was loaded during the last one (EARLY_Q)
    for (int step = 0, tile; (tile = tile_of_step(p, step, KernelCta())) != NO_MORE_TILES; step++) {
        if (tile == SKIP_STEP) continue;
        FwdTile t = this_cta_tile<D, BLOCK_N, VARLEN>(p, tile);
        if (tile_is_empty(t)) continue;
        const int tile_count = tiles++;   // tiles loaded before this one
        if (!q_loaded) produce_q<D, BLOCK_N, STAGES, VARLEN>(p, sm, t, q_uses++);
        q_loaded = false;
        for (int n = t.n_end - 1; n >= t.n_begin; n--, ring++) {
            produce_k<D, BLOCK_N, STAGES, PAIRED, VARLEN>(p, sm, t, ring, n);
            produce_v<D, BLOCK_N, STAGES, PAIRED, VARLEN>(p, sm, t, ring, n, n == t.n_end - 1, tile_count);
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
        const FwdTile t = this_cta_tile<D, BLOCK_N, true>(p, tile);
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
