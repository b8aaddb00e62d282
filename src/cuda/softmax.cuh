// Online softmax on one consumer warpgroup's accumulator fragment.
//
// Each thread holds two rows (row0 and row0 + 8 of its warp's 16) and, per
// row, BLOCK_N/4 scores spread over the 4 threads of a quad. Register i
// belongs to row (i/2) % 2. Row maxima are reduced over the quad at once;
// row sums stay per-thread partial sums until the end (rescaling is linear).
#pragma once
#include "ptx.cuh"
#include "fwd_tiles.h"

struct SoftmaxState {
    float max[2];        // running max of the scores (in score units)
    float sum[2];        // this thread's partial sum of exp2 terms
};

FA3C_DEVICE void softmax_init(SoftmaxState &st) {
    st.max[0] = st.max[1] = -INFINITY;
    st.sum[0] = st.sum[1] = 0.f;
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
// softmax in ncu's stall sampling (bench/RESULTS.md, run 10).
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

// Scores -> probabilities in place. Updates the running max, returns in
// `rescale` the factor by which the old output and sum must be multiplied,
// and whether it may differ from 1 (false: O need not be touched).
// A row that has seen only masked scores keeps max = -inf; its offset is
// taken as 0 so exp2(-inf - offset) = 0 instead of NaN.
// FA3C_FWD_LAZY_RESCALE = T > 0: the warp's rows keep their max unless one
// of them grew by more than 2^T (in exp2 units); probabilities may then
// reach 2^T, which fp32 sums and 16-bit P hold without loss, and the
// decision is warp-uniform, so the caller skips the O multiplies by branch.
template <int BLOCK_N>
FA3C_DEVICE bool softmax_step(float *s, SoftmaxState &st, float score_log2, float rescale[2]) {
    if (FA3C_FWD_ABLATE_SOFTMAX == 1) {   // speed-of-light ablation: P = S (wrong outputs)
        rescale[0] = rescale[1] = 1.f;
        return false;
    }
    float offset[2], new_max[2];
    bool moves = true;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float v[BLOCK_N / 4];
        gather_row<BLOCK_N>(s, r, v);
        new_max[r] = fmaxf(st.max[r], tree_max<BLOCK_N / 4>(v));   // this thread's part of the row
        if (FA3C_FWD_LAZY_RESCALE == 0) new_max[r] = quad_max(new_max[r]);
    }
    if (FA3C_FWD_LAZY_RESCALE > 0) {
        // From -inf to a finite max is +inf (moves); -inf to -inf is NaN (stays).
        bool grew = (new_max[0] - st.max[0]) * score_log2 > (float)FA3C_FWD_LAZY_RESCALE ||
                    (new_max[1] - st.max[1]) * score_log2 > (float)FA3C_FWD_LAZY_RESCALE;
        moves = __any_sync(~0u, grew);
        // The test saw each thread's own maxima (the warp moves if any
        // thread's would), so the row maxima's shuffles run only on a move
        // (hdim 64 +1-2%, run 66).
        if (moves) {
            new_max[0] = quad_max(new_max[0]);
            new_max[1] = quad_max(new_max[1]);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float m = moves ? new_max[r] : st.max[r];
        offset[r] = m == -INFINITY ? 0.f : m * score_log2;
        rescale[r] = moves ? ex2f(st.max[r] * score_log2 - offset[r]) : 1.f;   // old max -inf -> 0
        st.max[r] = m;
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
    return moves;
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
