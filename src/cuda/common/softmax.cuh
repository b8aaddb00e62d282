// Online softmax on one consumer warpgroup's accumulator fragment.
//
// Each thread holds two rows (row0 and row0 + 8 of its warp's 16) and, per
// row, BLOCK_N/4 scores spread over the 4 threads of a quad. Register i
// belongs to row (i/2) % 2. Row maxima are reduced over the quad at once;
// row sums stay per-thread partial sums until the end (rescaling is linear).
//
// Probabilities are p = exp2(s * score_log2 - off) with a per-row offset
// `off` in log2 units: the running max (softmax_step), or, where
// FA3C_FWD_STALE_MAX is on, the one the row has until it is exceeded by more
// than 2^T (softmax_step_stale). Any offset gives the same O / sum and LSE;
// it only has to keep p from overflowing.
#pragma once
#include "ptx.cuh"
#include "fwd_tiles.h"

struct SoftmaxState {
    float off[2];   // exp2 offset of each row, log2 units; -inf: no unmasked score seen yet
    float sum[2];   // this thread's partial sum of the probabilities
    bool ready;     // warp-uniform: every row of the warp has a finite offset (softmax_step_stale may run;
                    // a warp with a row that sees no key, e.g. causal rows above the first key, never is)
};

FA3C_DEVICE void softmax_init(SoftmaxState &st) {
    st.off[0] = st.off[1] = -INFINITY;
    st.sum[0] = st.sum[1] = 0.f;
    st.ready = false;
}

FA3C_DEVICE float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(~0u, x, 1));
    return fmaxf(x, __shfl_xor_sync(~0u, x, 2));
}

FA3C_DEVICE float quad_sum(float x) {
    x += __shfl_xor_sync(~0u, x, 1);
    return x + __shfl_xor_sync(~0u, x, 2);
}

// Max / sum of v[0..N) as a tree: log2(N) dependent steps instead of N. A
// chain of 32 dependent FMNMX per row was the longest stretch of the
// softmax in ncu's stall sampling.
// (Recursive templates: a loop over n = (n + 1) / 2 is not unrolled by nvcc,
// and the run-time index would put v in local memory.)
template <int N>
FA3C_DEVICE float tree_max(float *v) {
#pragma unroll
    for (int j = 0; j < N / 2; j++) v[j] = fmaxf(v[j], v[j + (N + 1) / 2]);
    return tree_max<(N + 1) / 2>(v);
}
template <>
__device__ __forceinline__ float tree_max<1>(float *v) { return v[0]; }

template <int N>
FA3C_DEVICE float tree_sum(float *v) {
#pragma unroll
    for (int j = 0; j < N / 2; j++) v[j] += v[j + (N + 1) / 2];
    return tree_sum<(N + 1) / 2>(v);
}
template <>
__device__ __forceinline__ float tree_sum<1>(float *v) { return v[0]; }

// Register i of the fragment is row (i / 2) % 2; the ROW_VALUES = BLOCK_N / 4
// registers of row r are i = 4k + 2r + e.
template <int BLOCK_N>
FA3C_DEVICE void gather_row(const float *s, int r, float *v) {
#pragma unroll
    for (int k = 0; k < BLOCK_N / 8; k++) {
        v[2 * k] = s[4 * k + 2 * r];
        v[2 * k + 1] = s[4 * k + 2 * r + 1];
    }
}

// Scores -> probabilities in place, against the row max. Updates the
// offsets, returns in `rescale` the factor by which the old output and sum
// must be multiplied, and whether it may differ from 1 (false: O need not be
// touched). A row that has seen only masked scores keeps off = -inf; its
// exponentials use 0 instead, so exp2(-inf - 0) = 0 instead of NaN.
// FA3C_FWD_LAZY_RESCALE = T > 0: the warp's rows keep their offset unless
// one of them grew by more than 2^T (in exp2 units); probabilities may then
// reach 2^T, which fp32 sums and 16-bit P hold without loss, and the
// decision is warp-uniform, so the caller skips the O multiplies by branch.
template <int BLOCK_N>
FA3C_DEVICE bool softmax_step(float *s, SoftmaxState &st, float score_log2, float rescale[2]) {
    if (FA3C_FWD_ABLATE_SOFTMAX == 1) {   // speed-of-light ablation: P = S (wrong outputs)
        rescale[0] = rescale[1] = 1.f;
        return false;
    }
    float offset[2], new_off[2];
    bool moves = true;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float v[BLOCK_N / 4];
        gather_row<BLOCK_N>(s, r, v);
        // This thread's part of the row (score_log2 > 0 keeps the order).
        new_off[r] = fmaxf(st.off[r], tree_max<BLOCK_N / 4>(v) * score_log2);
        if (FA3C_FWD_LAZY_RESCALE == 0) new_off[r] = quad_max(new_off[r]);
    }
    if (FA3C_FWD_LAZY_RESCALE > 0) {
        // From -inf to a finite max is +inf (moves); -inf to -inf is NaN (stays).
        bool grew = new_off[0] - st.off[0] > (float)FA3C_FWD_LAZY_RESCALE ||
                    new_off[1] - st.off[1] > (float)FA3C_FWD_LAZY_RESCALE;
        moves = __any_sync(~0u, grew);
        // The test saw each thread's own maxima (the warp moves if any
        // thread's would), so the row maxima's shuffles run only on a move
        // (hdim 64 +1-2%).
        if (moves) {
            new_off[0] = quad_max(new_off[0]);
            new_off[1] = quad_max(new_off[1]);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float m = moves ? new_off[r] : st.off[r];
        offset[r] = m == -INFINITY ? 0.f : m;
        rescale[r] = moves ? ex2f(st.off[r] - offset[r]) : 1.f;   // old offset -inf -> 0
        st.off[r] = m;
    }
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; i++) {
        float x = fmaf(s[i], score_log2, -offset[(i / 2) % 2]);
        s[i] = FA3C_FWD_ABLATE_SOFTMAX == 2 ? x : ex2f(x);   // 2: ablation without the exponentials
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float v[BLOCK_N / 4];
        gather_row<BLOCK_N>(s, r, v);
        st.sum[r] = st.sum[r] * rescale[r] + tree_sum<BLOCK_N / 4>(v);
    }
    if (FA3C_FWD_STALE_MAX) st.ready = __all_sync(~0u, st.off[0] != -INFINITY && st.off[1] != -INFINITY);
    return moves;
}

// What softmax_step_stale did with a block (STEP_NEEDS_MAX: not run, the
// caller runs softmax_step).
enum { STEP_KEPT, STEP_SHIFTED, STEP_LOST, STEP_NEEDS_MAX };

// Scores -> probabilities in place against the offsets the rows already
// have (st.ready), without the row max: its tree of FMNMX and shuffles was a
// quarter of the softmax's stall samples. A
// thread's partial row sum of the block bounds each of its probabilities, so
// while every one stays <= 2^T (FA3C_FWD_LAZY_RESCALE) nothing can have
// overflowed and the block is done (STEP_KEPT). Otherwise (a warp vote):
// - all sums finite: each row is shifted by 2^-k, k the exponent of its
//   largest probability, which is exact (a power of 2); rescale[] is that
//   factor for O (STEP_SHIFTED);
// - a sum is inf (a score jumped by 128 or more in exp2 units, or NaN
//   input): the probabilities lost information. st is unchanged, and the
//   caller computes the scores again and runs softmax_step (STEP_LOST).
template <int BLOCK_N>
FA3C_DEVICE int softmax_step_stale(float *s, SoftmaxState &st, float score_log2, float rescale[2]) {
    // A sum over 2^T then has a probability over 2, so a shift moves the row
    // (compiled, unused, where the knob is off).
    static_assert(!FA3C_FWD_STALE_MAX || (1 << FA3C_FWD_LAZY_RESCALE) >= 2 * (BLOCK_N / 4),
                  "2^T must be at least twice the values per thread and row");
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; i++) s[i] = ex2f(fmaf(s[i], score_log2, -st.off[(i / 2) % 2]));
    float block_sum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float v[BLOCK_N / 4];
        gather_row<BLOCK_N>(s, r, v);
        block_sum[r] = tree_sum<BLOCK_N / 4>(v);
    }
    const float limit = (float)(1 << FA3C_FWD_LAZY_RESCALE);
    const bool over = !(block_sum[0] <= limit && block_sum[1] <= limit);   // NaN counts as over
    if (!__any_sync(~0u, over)) {
        st.sum[0] += block_sum[0];
        st.sum[1] += block_sum[1];
        return STEP_KEPT;
    }
    if (__any_sync(~0u, !(block_sum[0] < INFINITY && block_sum[1] < INFINITY))) return STEP_LOST;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float v[BLOCK_N / 4];
        gather_row<BLOCK_N>(s, r, v);
        const float m = quad_max(tree_max<BLOCK_N / 4>(v));   // finite, >= 0
        const int k = min(max((__float_as_int(m) >> 23) - 127, 0), 126);   // m in [2^k, 2^(k+1))
        rescale[r] = __int_as_float((127 - k) << 23);   // 2^-k
        st.sum[r] = (st.sum[r] + block_sum[r]) * rescale[r];
        st.off[r] += (float)k;
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; i++)
            if ((i / 2) % 2 == r) s[i] *= rescale[r];
    }
    return STEP_SHIFTED;
}

// Probabilities (f32 accumulator layout) -> wgmma A fragments of 16-bit
// pairs. The m64n16 slice of the accumulator has the register-A layout of
// k16, so this is a pure conversion, no shuffles.
template <int BLOCK_N, int FP16>
FA3C_DEVICE void probs_to_fragments(const float *s, uint32_t (*frag)[4]) {
#pragma unroll
    for (int k = 0; k < BLOCK_N / 16; k++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            frag[k][j] = FP16 ? pack_f16x2(s[8 * k + 2 * j], s[8 * k + 2 * j + 1])
                              : pack_bf16x2(s[8 * k + 2 * j], s[8 * k + 2 * j + 1]);
}
