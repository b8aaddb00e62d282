// The forward kernel's paged-KV copier (warps 2 and 3 of the producer
// warpgroup in the variable-length instances, fwd_sm90.cuh): for pages
// whose TMA boxes would be a few rows (kv_copied, fwd_producer.cuh), it
// copies each key block's K and V rows with cp.async while the producer
// loads only Q. Compiled out unless FA3C_FWD_PAGED_COPY_BELOW > 0
// (fwd_tiles.h; docs/KERNEL.md).
#pragma once
#include "fwd_producer.cuh"

// The cache rows of key block n's keys first .. end - 1 (page * page_size
// + row in the page: pages are page_size rows apart, as
// fa3c_fwd_plan_paged_copies checks) into `table`, lane j looking up keys
// first + j, first + 32 + j, ...; -1 for a page outside the cache. ROWS: the most keys a part has (CopierPart).
// FA3C_FWD_COPY_LOOKUPS (fwd_tiles.h) of a lane's lookups are in flight at
// once: 1, one after the other; more, on keys clamped to the last one so
// that the loads need no branch.
template <int BLOCK_N, int ROWS>
FA3C_DEVICE void look_up_cache_rows(uint32_t table, const fa3c_fwd_kernel_params &p, const FwdTile &t, int n,
                                    int first, int end) {
    enum { ROUNDS = (ROWS + 31) / 32, IN_FLIGHT = FA3C_FWD_COPY_LOOKUPS };
    static_assert(IN_FLIGHT >= 1, "FA3C_FWD_COPY_LOOKUPS: at least one lookup in flight");
    const int lane = (int)opaque_u32(threadIdx.x % 32);   // as in copy_paged_kv
    __syncwarp();   // every lane is done reading the last block's rows
    if (IN_FLIGHT == 1) {
#pragma unroll
        for (int r = first + lane; r < first + ROWS; r += 32) {
            if (r < end) {
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
                page[i] = page_of_key(p, t, n * BLOCK_N + min(first + 32 * (i0 + i) + lane, end - 1), row[i]);
#pragma unroll
            for (int i = 0; i < IN_FLIGHT && i0 + i < ROUNDS; i++)
                if (ROWS % 32 == 0 || 32 * (i0 + i) + lane < ROWS)
                    st_shared_s32(table + 4 * (first + 32 * (i0 + i) + lane),
                                  page[i] >= 0 && page[i] < p.num_pages ? page[i] * p.div_page_size.d + row[i] : -1);
        }
    }
    __syncwarp();   // the rows, before any lane reads them
}

// The copier warps (FA3C_FWD_COPIER_WARPS, fwd_tiles.h) share each tile:
// part i copies rows [i ROWS, (i + 1) ROWS) of it, ROWS = BLOCK_N / parts,
// and looks up only those (its own rows of the table: the warps never wait
// for each other).
template <int BLOCK_N>
struct CopierPart {
    enum { PARTS = FA3C_FWD_COPIER_WARPS, ROWS = BLOCK_N / PARTS };
    static_assert(BLOCK_N % PARTS == 0, "FA3C_FWD_COPIER_WARPS must divide BLOCK_N");
};

// Paged K or V of key block n copied with cp.async into the slot at dst
// (p.k_data: pages whose boxes would be a few rows, where TMA runs at one
// box per ~80 cycles), for head dims whose 16-byte units per key row
// (UNITS) divide 32: each pass of a copier warp copies 32 / UNITS whole
// rows of its part, reading their places in the cache from `table`
// (look_up_cache_rows: K's copy fills it, V's of the same block reuses it).
// Each unit lands where TMA would put it: the chunk's row, its 16-byte
// column swizzled by the smem address, as TMA's 128-byte swizzle does
// (load_paged_kv). Rows past the sequence's last key are not copied
// (v_guard, masks); a page index outside the cache copies zeros (as TMA's
// bounds would), never reads outside it. Returns once the lane's copies are
// issued (kv_copier hands them over: copy_tile, or with
// FA3C_FWD_COPY_ASYNC_ARRIVE their own arrivals).
template <int D, int BLOCK_N, bool IS_V>
FA3C_DEVICE void copy_paged_kv(uint8_t *dst, uint32_t table, const fa3c_fwd_kernel_params &p, const FwdTile &t, int n,
                               int part) {
    typedef TileLayout<D> L;
    enum {
        UNITS = D * 2 / 16, ROW_UNITS = L::ROW_BYTES / 16, PASS_ROWS = 32 / UNITS,
        ROWS = CopierPart<BLOCK_N>::ROWS
    };
    static_assert(32 % UNITS == 0, "copy_paged_kv: a key row's units must divide the warp");
    // Opaque lane, part and head: else ptxas hoists what they give (the
    // lane's places, 64-bit head offsets for K and V) out of kv_copier's
    // loops and spills them from its 32-40 registers.
    const int lane = (int)opaque_u32(threadIdx.x % 32);
    // This part's rows of the block: [first, end).
    const int first = (int)opaque_u32(part) * ROWS, end = min(first + ROWS, t.seqlen_k - n * BLOCK_N);
    if (!IS_V) look_up_cache_rows<BLOCK_N, ROWS>(table, p, t, n, first, end);
    // This lane's unit of a row: its smem address in the slot, and its source column.
    const uint32_t unit =
        smem_addr(dst) + (lane % UNITS / ROW_UNITS) * BLOCK_N * L::ROW_BYTES + (lane % ROW_UNITS) * 16;
    const int64_t *stride = IS_V ? p.v_stride : p.k_stride;
    const uint8_t *src = (const uint8_t *)(IS_V ? p.v_data : p.k_data) + (lane % UNITS) * 16 +
                         (int)opaque_u32(t.head_kv) * stride[2] * 2;
    const uint32_t row_bytes = (uint32_t)stride[1] * 2;   // < 2^31: fa3c_fwd_plan_paged_copies
    // One row per pass, its cache row loaded a pass ahead (the smem latency
    // off the issue path; unrolling instead spilled the copier's registers).
    int row = first + lane / UNITS, src_row = row < end ? ld_shared_s32(table + 4 * row) : 0;
#pragma unroll 1
    while (row < end) {
        const int next = row + PASS_ROWS;
        const int next_src_row = next < end ? ld_shared_s32(table + 4 * next) : 0;
        uint32_t addr = unit + row * L::ROW_BYTES;
        addr ^= ((addr >> 7) & (ROW_UNITS - 1)) << 4;   // TMA's swizzle, by address
        // 32 x 32 -> 64 bits, one IMAD.WIDE.U32 (a signed product took three)
        const uint64_t offset = (uint64_t)(uint32_t)max(src_row, 0) * row_bytes;
        cp_async_16(addr, src + offset, src_row >= 0);
        row = next;
        src_row = next_src_row;
    }
}

// kv_copier's tile in flight: 2 * slot, + 1 for V (-1: none).
FA3C_DEVICE int copied_tile(int slot, bool is_v) { return 2 * slot + is_v; }

// The tile whose copies kv_copier has in flight (`pending`) has landed:
// lane 0 tells the consumers. The copies are plain (generic proxy) smem
// writes and wgmma reads through the async proxy: each lane waits for its
// own copies (cp.async groups: all but the newest LEFT) and fences the
// proxies before lane 0 arrives on k_full or v_full (one arrival per copier
// warp; no bytes expected).
template <int LEFT, int D, int BLOCK_N, int STAGES>
FA3C_DEVICE void copied_tile_landed(FwdSmem<D, BLOCK_N, STAGES> &sm, int pending) {
    cp_async_wait_group<LEFT>();
    fence_proxy_async_smem();   // the copies, before wgmma (the async proxy) reads them
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(pending & 1 ? &sm.v_full[pending / 2] : &sm.k_full[pending / 2]);
}

// kv_copier's wait for a slot (or o_free): if it is not free yet, the tile
// in flight is finished first, as the consumers may need it to free the
// slot (they release V of block j - 1 after S of block j). With
// FA3C_FWD_COPY_ASYNC_ARRIVE no tile is held back: a plain wait.
template <int D, int BLOCK_N, int STAGES>
FA3C_DEVICE void copier_wait(FwdSmem<D, BLOCK_N, STAGES> &sm, uint64_t *bar, uint32_t parity, int &pending) {
    if (!FA3C_FWD_COPY_ASYNC_ARRIVE && pending >= 0 && !__shfl_sync(~0u, mbar_test_wait_parity(bar, parity), 0)) {
        copied_tile_landed<0>(sm, pending);
        pending = -1;
    }
    mbar_wait_parity(bar, parity);
}

// kv_copier: K or V of block n into slot s, then the tile before it handed
// over (its copies overlap this tile's issue). With
// FA3C_FWD_COPY_ASYNC_ARRIVE each lane's copies arrive on their barrier
// once landed instead (k_landed, which v_guard hands on to k_full; v_full),
// and nothing is waited for here.
template <int D, int BLOCK_N, int STAGES, bool IS_V>
FA3C_DEVICE void copy_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t, int s,
                           int n, int part, int &pending) {
    if constexpr (FA3C_FWD_COPY_ASYNC_ARRIVE) {
        copy_paged_kv<D, BLOCK_N, IS_V>(IS_V ? sm.v[s] : sm.k[s], smem_addr(sm.copier.row), p, t, n, part);
        cp_async_arrive_noinc(IS_V ? &sm.v_full[s] : &sm.copier.k_landed[s]);
        return;
    }
    fence_proxy_async_smem();   // the consumers' wgmma reads of the slot, before these writes
    copy_paged_kv<D, BLOCK_N, IS_V>(IS_V ? sm.v[s] : sm.k[s], smem_addr(sm.copier.row), p, t, n, part);
    cp_async_commit();
    if (pending >= 0) copied_tile_landed<1>(sm, pending);
    pending = copied_tile(s, IS_V);
}

// The variable-length instances' copier warps (warps 2, 3), for small pages
// (kv_copied): each walks the producer's key blocks and copies its part of
// each one's K and V rows (CopierPart) with cp.async (copy_paged_kv) while
// the producer loads only Q. Per warp, two tiles (K or V) are in flight: a
// tile's copies are issued, then the previous tile's are waited for and
// handed over (copy_tile: one arrival per warp on the full barrier),
// unless a slot wait found the consumers still on it (copier_wait); with
// FA3C_FWD_COPY_ASYNC_ARRIVE the copies arrive on their own and nothing is
// waited for but the slots. Warps of their own: in the producer's 40
// registers the copies spilled.
template <int D, int BLOCK_N, int STAGES>
FA3C_DEVICE void kv_copier(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, int part) {
    if constexpr (paged_copy_fits<D>()) {
        if (!kv_copied<D, true>(p)) return;
        int ring = 0, tiles = 0, pending = -1;
        for (int step = 0, tile; (tile = tile_of_step(p, step, KernelCtaRereads())) != NO_MORE_TILES; step++) {
            if (tile == SKIP_STEP) continue;
            const FwdTile t = this_cta_tile<D, BLOCK_N, true>(p, tile);
            if (tile_is_empty(t)) continue;
            const int tile_count = tiles++;   // as the producer counts them (o_free)
            for (int n = t.n_end - 1; n >= t.n_begin; n--, ring++) {
                const int s = stage_of(ring, STAGES);
                const uint32_t free_parity = phase_of(ring, STAGES) ^ 1;
                copier_wait(sm, &sm.k_empty[s], free_parity, pending);
                if (part == 0) trace(FA3C_TRACE_PRODUCER, ring, TR_K_SLOT_FREE);
                copy_tile<D, BLOCK_N, STAGES, false>(p, sm, t, s, n, part, pending);
                copier_wait(sm, &sm.v_empty[s], free_parity, pending);
                if (v_waits_o_free<D, BLOCK_N, STAGES>(n == t.n_end - 1, tile_count)) {
                    copier_wait(sm, &sm.o_free, o_free_parity(tile_count), pending);
                    // The O stores (TMA: the async proxy) read this slot; their completion was observed
                    // with a bulk wait_group.read, for which the PTX ISA promises no implicit proxy
                    // fence (copy_tile fences each slot but with FA3C_FWD_COPY_ASYNC_ARRIVE).
                    if (FA3C_FWD_COPY_ASYNC_ARRIVE) fence_proxy_async_smem();
                }
                if (part == 0) trace(FA3C_TRACE_PRODUCER, ring, TR_V_SLOT_FREE);
                copy_tile<D, BLOCK_N, STAGES, true>(p, sm, t, s, n, part, pending);
            }
        }
        if (pending >= 0) copied_tile_landed<0>(sm, pending);
        if (FA3C_FWD_COPY_ASYNC_ARRIVE) cp_async_wait_all();   // nothing left in flight when the warp exits
    }
}
