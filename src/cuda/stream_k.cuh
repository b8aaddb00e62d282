// Where the two pieces of a tile cut by the stream-K tail meet (the cut is
// planned in scheduler.cuh). Each piece is computed like a tile of its own,
// by a different CTA, into O, row maxima and sums relative to its own
// maxima. Per consumer warpgroup, the first to finish takes ticket 0 of the
// cut, leaves its state in the cut's scratch slot and is done; the second
// waits until that state is complete (it is being written right then: the
// wait is short and never for a CTA that might not run), merges it into its
// own and goes on to the usual epilogue. The merge gives the same bits
// whichever piece finishes first, so the result is deterministic.
#pragma once
#include "ptx.cuh"
#include "fwd_params.h"
#include "fwd_tiles.h"
#include "softmax.cuh"
#include "scheduler.cuh"

// The cut's slot for this warpgroup: FA3C_FWD_TAIL_SLOT_FLOAT4S(D) float4s,
// thread tid's i-th at i * 128 + tid (a warp's store is 512 contiguous
// bytes): O values 4i .. 4i + 3 for i < D / 8, then (max0, max1, sum0, sum1).
template <int D>
FA3C_DEVICE float4 *tail_slot(const fa3c_fwd_kernel_params &p, int slot) {
    return (float4 *)p.tail_partial + (size_t)slot * FA3C_FWD_TAIL_SLOT_FLOAT4S(D);
}

// `mine`: this thread's first float4 of the slot (its others are 128 on:
// constant offsets, no address registers).
template <int D>
FA3C_DEVICE void leave_piece(float4 *mine, const float *o, const SoftmaxState &st, int *ready) {
#pragma unroll
    for (int i = 0; i < D / 8; i++) mine[i * 128] = make_float4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
    mine[D / 8 * 128] = make_float4(st.off[0], st.off[1], st.sum[0], st.sum[1]);
    __threadfence();
    red_release_gpu_add(ready, 1);
}

// o, st += the other piece's state (this thread's part from `theirs_at`, as
// leave_piece wrote it). Each piece's probabilities are relative to its own
// offsets (softmax.cuh), so it is weighted by exp2(its offset - the larger
// offset). The two products are rounded apart and then added: IEEE
// multiplication and addition commute exactly, so the result has the same
// bits whichever piece is this one, i.e. whichever CTA finished first (a
// fused a * x + b * y would not). With hdim 256, ptxas spills 32 bytes here,
// once per cut piece, outside the key loop.
FA3C_DEVICE float merge_value(float mine, float w_mine, float theirs, float w_theirs) {
    return __fadd_rn(__fmul_rn(mine, w_mine), __fmul_rn(theirs, w_theirs));
}

template <int D>
FA3C_DEVICE void merge_piece(const float4 *theirs_at, float *o, SoftmaxState &st) {
    const float4 other = __ldcg(&theirs_at[D / 8 * 128]);
    const float their_off[2] = {other.x, other.y}, their_sum[2] = {other.z, other.w};
    float w_mine[2], w_theirs[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float off = fmaxf(st.off[r], their_off[r]);
        const float offset = off == -INFINITY ? 0.f : off;
        w_mine[r] = ex2f(st.off[r] - offset);   // -inf -> 0
        w_theirs[r] = ex2f(their_off[r] - offset);
        st.off[r] = off;
        st.sum[r] = merge_value(st.sum[r], w_mine[r], their_sum[r], w_theirs[r]);
    }
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        const float4 v = __ldcg(&theirs_at[i * 128]);
        const float theirs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++)   // register 4i + e is row e / 2
            o[4 * i + e] = merge_value(o[4 * i + e], w_mine[e / 2], theirs[e], w_theirs[e / 2]);
    }
}

// true: this warpgroup now holds the whole tile and writes it; false: the
// other piece will. `ticket_smem`: a word of this warpgroup's in smem, to
// pass thread 0's ticket; `bar_id`: a named barrier of this warpgroup.
template <int D, int CONSUMERS>
FA3C_DEVICE bool meet_other_piece(const fa3c_fwd_kernel_params &p, TailCut cut, float *o, SoftmaxState &st,
                                  int consumer_index, int *ticket_smem, int bar_id) {
    const int tid = threadIdx.x % 128, slot_index = cut.cut * CONSUMERS + consumer_index;
    int *ticket = p.tail_sync + 2 * slot_index, *ready = ticket + 1;
    float4 *slot = tail_slot<D>(p, slot_index) + tid;   // this thread's first float4
    if (tid == 0) *ticket_smem = atomicAdd(ticket, 1);
    named_bar_sync(bar_id, 128);
    // Read through a shuffle from lane 0: the compiler then knows `first` is
    // the same for the warp; a branch on a plain smem load counts as
    // divergent, and the code after it (the next tiles' key loops) lost the
    // uniform datapath (R2UR before every wgmma; with the early return that
    // finish_tile no longer has, every shape ran 3-6% slower, run 32).
    const bool first = __shfl_sync(~0u, *ticket_smem, 0) == 0;
    named_bar_sync(bar_id, 128);   // all have read it before a later cut writes it
    if (first) {
        leave_piece<D>(slot, o, st, ready);
        return false;
    }
    wait_counter_at_least(ready, 128);
    merge_piece<D>(slot, o, st);
    return true;
}
