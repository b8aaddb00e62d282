/* Host-side helpers that read an fa3c_problem: per-sequence lengths, the
 * mask rule and element addressing. Shared by validation and the CPU backend
 * so that the whole library agrees on one definition of each. Host memory
 * only (cu_seqlens, seqused_q / _k and page_table are dereferenced). */
#ifndef FA3C_PROBLEM_H
#define FA3C_PROBLEM_H

#include <math.h>
#include <stdint.h>
#include "fa3c.h"

/* Queries stored for sequence b (dq rows a backward writes), seqused_q aside. */
static inline int fa3c_stored_seqlen_q(const fa3c_problem *pr, int b) {
    return pr->cu_seqlens_q ? pr->cu_seqlens_q[b + 1] - pr->cu_seqlens_q[b] : pr->seqlen_q;
}

/* Queries used: the rows computed, and the count the mask aligns to. */
static inline int fa3c_seqlen_q_of(const fa3c_problem *pr, int b) {
    int n = fa3c_stored_seqlen_q(pr, b);
    if (pr->seqused_q && pr->seqused_q[b] < n) n = pr->seqused_q[b];
    return n;
}

/* Rows of sequence b's cache before its first key (problem.leftpad_k). */
static inline int fa3c_leftpad_k_of(const fa3c_problem *pr, int b) { return pr->leftpad_k ? pr->leftpad_k[b] : 0; }

/* Keys used: the stored ones (or seqused_k), less the left padding. */
static inline int fa3c_seqlen_k_of(const fa3c_problem *pr, int b) {
    int n = pr->cu_seqlens_k ? pr->cu_seqlens_k[b + 1] - pr->cu_seqlens_k[b] : pr->seqlen_k;
    if (pr->seqused_k && pr->seqused_k[b] < n) n = pr->seqused_k[b];
    return n - fa3c_leftpad_k_of(pr, b);
}

/* The mask's right bound: causal is the window (left, 0); -1 = unbounded. The
 * one place that turns causal into a window (the kernels' params take it). */
static inline int fa3c_window_right(const fa3c_problem *pr) { return pr->causal ? 0 : pr->window_right; }

/* Keys [lo, hi] (inclusive) that query row i may see, for sequence lengths sq, sk.
 * Bottom-right aligned as in FA2/FA3: the diagonal is j = i + sk - sq. The
 * range may be empty (lo > hi): the row is fully masked. */
static inline void fa3c_key_range(const fa3c_problem *pr, int i, int sq, int sk, int *lo, int *hi) {
    long diag = (long)i + sk - sq;
    long l = 0, h = sk - 1;
    if (pr->window_left >= 0 && diag - pr->window_left > l) l = diag - pr->window_left;
    long right = fa3c_window_right(pr);
    if (right >= 0 && diag + right < h) h = diag + right;
    if (l > sk) l = sk;
    if (h < -1) h = -1;
    *lo = (int)l;
    *hi = (int)h;
}

/* Element offset of row i, head h of a q-like tensor (q, out, dout, dq). */
static inline int64_t fa3c_q_offset(const fa3c_problem *pr, const fa3c_tensor *t, int b, int i, int h) {
    int64_t row = pr->cu_seqlens_q ? (int64_t)(pr->cu_seqlens_q[b] + i) * t->stride[1]
                                   : (int64_t)b * t->stride[0] + (int64_t)i * t->stride[1];
    return row + (int64_t)h * t->stride[2];
}

/* Element offset of key j, kv-head h of a k-like tensor (k, v, and dk, dv
 * which are never paged): row leftpad_k[b] + j of the sequence's keys. */
static inline int64_t fa3c_k_offset(const fa3c_problem *pr, const fa3c_tensor *t, int b, int j, int h, int paged) {
    int64_t row;
    j += fa3c_leftpad_k_of(pr, b);
    if (paged && pr->page_table) {
        int64_t page = pr->page_table[(int64_t)b * pr->page_table_stride + j / pr->page_size];
        row = page * t->stride[0] + (int64_t)(j % pr->page_size) * t->stride[1];
    } else if (pr->cu_seqlens_k) {
        row = (int64_t)(pr->cu_seqlens_k[b] + j) * t->stride[1];
    } else {
        row = (int64_t)b * t->stride[0] + (int64_t)j * t->stride[1];
    }
    return row + (int64_t)h * t->stride[2];
}

/* The e4m3 block descale (fa3c_fwd_params.q_block_descale, k_, v_: which =
 * 0, 1, 2) of row `pos` of sequence b, head `head` (a query head for q, a
 * K/V head for k and v): 1 without one. pos is the row's position in its
 * sequence: query i, or key j's leftpad_k[b] + j (its row in the cache). */
static inline float fa3c_block_descale(const fa3c_fwd_params *p, int which, int b, int head, int pos) {
    const float *d = which == 0 ? p->q_block_descale : which == 1 ? p->k_block_descale : p->v_block_descale;
    if (!d) return 1.0f;
    const fa3c_problem *pr = &p->problem;
    const int64_t rows = which == 0 ? pr->seqlen_q : pr->seqlen_k, heads = which == 0 ? pr->heads_q : pr->heads_kv;
    const int64_t blocks = (rows + FA3C_FP8_BLOCK_ROWS - 1) / FA3C_FP8_BLOCK_ROWS;
    return d[((int64_t)b * heads + head) * blocks + pos / FA3C_FP8_BLOCK_ROWS];
}

/* Index of (b, h, i) in the LSE array: (batch, heads, seqlen_q), or (heads, total_q) with varlen. */
static inline int64_t fa3c_lse_index(const fa3c_problem *pr, int b, int h, int i) {
    if (pr->cu_seqlens_q) {
        int64_t total = pr->cu_seqlens_q[pr->batch];
        return (int64_t)h * total + pr->cu_seqlens_q[b] + i;
    }
    return ((int64_t)b * pr->heads_q + h) * pr->seqlen_q + i;
}

/* The head dim of v, out, dout and dv (problem.headdim_v, 0 = headdim). */
static inline int fa3c_headdim_v(const fa3c_problem *pr) {
    return pr->headdim_v ? pr->headdim_v : pr->headdim;
}

/* The softmax scale a call uses: softmax_scale, or by default 1/sqrt(headdim),
 * and 1/sqrt(headdim + headdim_v) with the forward's qv (FA3's). */
static inline float fa3c_softmax_scale(const fa3c_problem *pr, int with_qv) {
    if (pr->softmax_scale != 0) return pr->softmax_scale;
    return with_qv ? (float)(1.0 / sqrt((double)(pr->headdim + fa3c_headdim_v(pr)))) : 1.0f / sqrtf((float)pr->headdim);
}

/* The wider of the two head dims: the columns a padded kernel spans. */
static inline int fa3c_headdim_max(const fa3c_problem *pr) {
    return fa3c_headdim_v(pr) > pr->headdim ? fa3c_headdim_v(pr) : pr->headdim;
}

/* Head h's sink logit (problem.sinks), -inf without sinks: one more term
 * exp(sink) in every row's softmax denominator, with no value row. */
static inline float fa3c_sink(const fa3c_problem *pr, int h) {
    return pr->sinks ? pr->sinks[h] : -INFINITY;
}

/* Score transform shared by every backend: scale, then optional softcap. */
static inline double fa3c_score(const fa3c_problem *pr, double qk) {
    double s = qk * pr->softmax_scale;
    return pr->softcap > 0 ? pr->softcap * tanh(s / pr->softcap) : s;
}

/* fa3c_score as the GPU kernels apply it, shared by the forward and backward
 * hosts so that the backward recomputes exactly the forward's P: the raw q·k
 * (or softcap · tanh(q·k · softcap_pre), then in natural units) times
 * score_log2 is the exponent in base 2. softcap_pre is 0 without softcap. */
static inline void fa3c_score_log2_factors(const fa3c_problem *pr, float *score_log2, float *softcap_pre) {
    const float log2e = 1.4426950408889634f;
    *score_log2 = pr->softcap > 0.f ? log2e : pr->softmax_scale * log2e;
    *softcap_pre = pr->softcap > 0.f ? pr->softmax_scale / pr->softcap : 0.f;
}

#endif
