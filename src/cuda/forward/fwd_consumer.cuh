// The forward kernel's consumer warpgroups (fwd_sm90.cuh): per key block
// S = Q·Kᵀ, mask, online softmax, O += P·V with wgmma, taking turns
// (pingpong) and overlapping the softmax with P·V; then the epilogue.
#pragma once
#include "fwd_smem.cuh"
#include "wgmma.cuh"
#include "mask.cuh"
#include "softmax.cuh"
#include "trace.cuh"
#include "fwd_epilogue.cuh"

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

// ---- consumer ------------------------------------------------------------------

// The epilogue of a tile, through the O staging of this build (O_STAGE_*).
// `ring` is past the tile's last key block.
template <int D, int BLOCK_N, int STAGES, int FP16, bool VARLEN>
FA3C_DEVICE void finish_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                             float *o, SoftmaxState &st, int row0, int quad, int consumer_index, int ring) {
    uint8_t *stage = o_staging(sm, consumer_index, ring);
    if (FwdSmem<D, BLOCK_N, STAGES>::O_PLACE != O_STAGE_IN_V) {
        epilogue<D, FP16, VARLEN>(p, t, o, st, row0, quad, stage, consumer_index, ring);
        return;
    }
    // O staged in the V ring: once every consumer has read the ring, and only
    // where the epilogue stages (not for split-KV partials or register stores).
    bool staged = p.out_tma && p.num_splits == 1;
    if constexpr (VARLEN) staged = staged && o_box_allowed<VARLEN>(p, t, consumer_index);
    if (staged) wait_v_ring_read<D, STAGES>(sm.v_empty, ring, consumer_index);
    epilogue<D, FP16, VARLEN>(p, t, o, st, row0, quad, staged ? stage : nullptr, consumer_index, ring);
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
// variable-length instances (this_cta_tile, v_guard).
template <int D, int BLOCK_N, int STAGES, int FP16, int SKIP_MASKED, bool VARLEN>
FA3C_DEVICE void consumer_tile(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                               int consumer_index, int &ring, uint32_t q_phase) {
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
    finish_tile<D, BLOCK_N, STAGES, FP16, VARLEN>(p, sm, t, o, st, row0, quad, consumer_index, ring);
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
                                      const FwdTile &t, int consumer_index, int &ring, int &q_uses) {
    if (tile_is_void<true>(t, FA3C_FWD_BLOCK_M(D))) return;
    const int wg_m0 = t.m0 + consumer_index * 64;
    if (tile_is_empty(t)) {
        if (wg_m0 + 64 > 0) write_empty_tile<D, BLOCK_N, STAGES, FP16, true>(p, sm, t, consumer_index);
    } else if (wg_m0 + 64 <= 0 || wg_m0 >= t.rows) {   // no row of the sequence: idle
        idle_consumer_tile<D, BLOCK_N, STAGES, true>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++));
    } else if (p.window_right >= 0) {
        consumer_tile<D, BLOCK_N, STAGES, FP16, 1, true>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++));
    } else {
        consumer_tile<D, BLOCK_N, STAGES, FP16, 0, true>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++));
    }
}

template <int D, int BLOCK_N, int STAGES, int FP16, bool VARLEN>
FA3C_DEVICE void consumer(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, int consumer_index) {
    int ring = 0, q_uses = 0;
    enum { CONSUMERS = FA3C_FWD_CONSUMERS(D) };
    if (consumer_index == CONSUMERS - 1) pass_turn<CONSUMERS>(consumer_index);   // warpgroup 0 goes first
    for (int step = 0, tile; (tile = tile_of_step(p, step, KernelCta())) != NO_MORE_TILES; step++) {
        if (tile == SKIP_STEP) continue;
        FwdTile t = this_cta_tile<D, BLOCK_N, VARLEN>(p, tile);
        if constexpr (VARLEN) {   // (a separate path: the fixed-length code stays as it was, byte for byte)
            consumer_varlen_tile<D, BLOCK_N, STAGES, FP16>(p, sm, t, consumer_index, ring, q_uses);
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
            // costs uniform registers in the loop (2% without masks).
            if (p.window_right >= 0)
                consumer_tile<D, BLOCK_N, STAGES, FP16, 1, VARLEN>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++));
            else
                consumer_tile<D, BLOCK_N, STAGES, FP16, 0, VARLEN>(p, sm, t, consumer_index, ring, q_phase_of(q_uses++));
        }
    }
    if (consumer_index == 0) wait_my_turn<CONSUMERS>(0);   // take the last warpgroup's last pass: barriers end balanced
    if (threadIdx.x % 128 == 0) tma_store_wait_all();      // the staging smem must outlive the O stores
}
