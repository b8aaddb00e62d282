/* Tiled backward with float accumulation, in two race-free passes so that it
 * is deterministic (every gradient element is summed by one task, in a fixed
 * order) and parallel even for MQA with batch 1:
 *   pass 1, per (batch, kv head, key block): for every query head of the GQA
 *           group and every query block, recompute P = exp(score - lse), then
 *           dV += Pᵀ dO and dK += dSᵀ Q (dS = P ∘ (dO Vᵀ - D) ∘ tanh' under softcap);
 *   pass 2, per (batch, head, query block): recompute P and dS, dQ += dS K.
 * D = rowsum(dO ∘ O) is computed once beforehand (linear memory). This costs
 * two extra tile products (S and dP are formed in both passes) but needs no
 * atomics and no per-thread dQ copies. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "problem.h"
#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "cpu/tile_io.h"

/* Both tile sides are multiples of MR (rows of Pᵀ and dSᵀ are keys) and NR. */
enum { BM = 48, BN = 48 };

typedef struct {
    const fa3c_bwd_params *p;
    fa3c_problem pr;
    int d, dp, group;
    fa3c_dtype dt;
    float *D; /* rowsum(dO ∘ O), indexed like lse */
} bwd_ctx;

typedef struct {
    float *Q, *dO;     /* [BM][dp] */
    float *Kt, *Vt;    /* [dp][BN] transposed key block */
    float *K;          /* [BN][dp] key block (pass 2) */
    float *S, *dP;     /* [BM][BN]: scores -> P, dP -> dS */
    float *G;          /* [BM][BN] tanh' factor (softcap only) */
    float *T;          /* [BN][BM] transposed P or dS */
    float *acc1, *acc2;/* [BN][dp] dK, dV (pass 1); acc1 [BM][dp] dQ (pass 2) */
    float *row;        /* [dp] */
    float lse[BM], Dr[BM];
    int lo[BM], hi[BM];
} bwd_ws;

static int stored_seqlen_k(const fa3c_problem *pr, int b) {
    return pr->cu_seqlens_k ? pr->cu_seqlens_k[b + 1] - pr->cu_seqlens_k[b] : pr->seqlen_k;
}

/* Query rows i0.. of head h: Q, dO, lse, D and key ranges; returns the row count. */
static int load_q_block(const bwd_ctx *c, bwd_ws *w, int b, int h, int i0, int sq, int sk) {
    const fa3c_bwd_params *p = c->p;
    const fa3c_problem *pr = &c->pr;
    const int nrows = sq - i0 < BM ? sq - i0 : BM;
    for (int r = 0; r < BM; r++) {
        float *qr = w->Q + (int64_t)r * c->dp, *dr = w->dO + (int64_t)r * c->dp;
        if (r < nrows) {
            const int i = i0 + r;
            load_row_f(qr, p->q.data, c->dt, fa3c_q_offset(pr, &p->q, b, i, h), c->d, c->dp, 1.0f);
            load_row_f(dr, p->dout.data, c->dt, fa3c_q_offset(pr, &p->dout, b, i, h), c->d, c->dp, 1.0f);
            fa3c_key_range(pr, i, sq, sk, &w->lo[r], &w->hi[r]);
            const int64_t li = fa3c_lse_index(pr, b, h, i);
            w->lse[r] = p->lse[li];
            w->Dr[r] = c->D[li];
            if (!(w->lse[r] > -INFINITY)) { /* fully masked row: no probability mass */
                w->hi[r] = w->lo[r] - 1;
                w->lse[r] = 0; /* keeps exp(-inf - lse) = 0 rather than NaN */
            }
        } else {
            memset(qr, 0, sizeof(float) * c->dp);
            memset(dr, 0, sizeof(float) * c->dp);
            w->lo[r] = 1;
            w->hi[r] = 0;
            w->lse[r] = 0;
            w->Dr[r] = 0;
        }
    }
    return nrows;
}

/* Keys j0 .. j0+nk-1 of (b, hk) into Kt, Vt (and K when want_k), zero-padded to BN. */
static void load_k_block(const bwd_ctx *c, bwd_ws *w, int b, int hk, int j0, int nk, int want_k) {
    const fa3c_bwd_params *p = c->p;
    const int d = c->d, dp = c->dp;
    for (int jj = 0; jj < BN; jj++) {
        if (jj < nk) {
            float *kr = want_k ? w->K + (int64_t)jj * dp : w->row;
            load_row_f(kr, p->k.data, c->dt, fa3c_k_offset(&c->pr, &p->k, b, j0 + jj, hk, 0), d, dp, 1.0f);
            for (int x = 0; x < d; x++) w->Kt[(int64_t)x * BN + jj] = kr[x];
            load_row_f(w->row, p->v.data, c->dt, fa3c_k_offset(&c->pr, &p->v, b, j0 + jj, hk, 0), d, dp, 1.0f);
            for (int x = 0; x < d; x++) w->Vt[(int64_t)x * BN + jj] = w->row[x];
        } else {
            for (int x = 0; x < d; x++) w->Kt[(int64_t)x * BN + jj] = w->Vt[(int64_t)x * BN + jj] = 0.0f;
            if (want_k) memset(w->K + (int64_t)jj * dp, 0, sizeof(float) * dp);
        }
    }
}

/* S -> P and dP -> dS for the tile (query rows of w, keys j0..j0+BN-1). */
static inline void tile_grad(const bwd_ctx *c, bwd_ws *w, int j0) {
    const float scale = c->pr.softmax_scale, cap = c->pr.softcap;
    gemm(BM, BN, c->d, w->Q, c->dp, w->Kt, BN, w->S, BN, 0, NULL);
    gemm(BM, BN, c->d, w->dO, c->dp, w->Vt, BN, w->dP, BN, 0, NULL);
    for (int r = 0; r < BM; r++) {
        float *s = w->S + r * BN, *dp = w->dP + r * BN;
        const int lo = w->lo[r] - j0, hi = w->hi[r] - j0; /* visible columns [lo, hi] */
        if (cap > 0) {
            float *g = w->G + r * BN;
            for (int j = 0; j < BN; j++) {
                const float t = tanhf(s[j] * scale / cap);
                s[j] = cap * t;
                g[j] = 1.0f - t * t;
            }
        } else {
            for (int j = 0; j < BN; j += VW) vstore(s + j, vload(s + j) * vsplat(scale));
        }
        for (int j = 0; j < BN; j++)
            if (j < lo || j > hi) s[j] = -INFINITY;
        for (int j = 0; j < BN; j += VW) vstore(s + j, vexp_sub(s + j, w->lse[r]));
        const vf D = vsplat(w->Dr[r]);
        for (int j = 0; j < BN; j += VW) vstore(dp + j, vload(s + j) * (vload(dp + j) - D));
        if (cap > 0)
            for (int j = 0; j < BN; j++) dp[j] *= w->G[r * BN + j];
    }
}

static void transpose_tile(const float *restrict src, float *restrict dst) { /* [BM][BN] -> [BN][BM] */
    for (int r = 0; r < BM; r++)
        for (int j = 0; j < BN; j++) dst[j * BM + r] = src[r * BN + j];
}

static int block_visible(const bwd_ws *w, int j0, int j1) { /* any row sees a key in [j0, j1] */
    for (int r = 0; r < BM; r++)
        if (w->lo[r] <= w->hi[r] && w->lo[r] <= j1 && w->hi[r] >= j0) return 1;
    return 0;
}

FA3C_HOT static void dkdv_block(const bwd_ctx *c, bwd_ws *w, int b, int hk, int j0) {
    const fa3c_bwd_params *p = c->p;
    const fa3c_problem *pr = &c->pr;
    const int dp = c->dp, sq = fa3c_seqlen_q_of(pr, b), sk = fa3c_seqlen_k_of(pr, b);
    const int nst = stored_seqlen_k(pr, b) - j0 < BN ? stored_seqlen_k(pr, b) - j0 : BN; /* rows to write */
    const int nk = sk - j0 < nst ? (sk - j0 > 0 ? sk - j0 : 0) : nst;                    /* rows with keys */
    memset(w->acc1, 0, sizeof(float) * BN * dp);
    memset(w->acc2, 0, sizeof(float) * BN * dp);
    if (nk > 0) {
        load_k_block(c, w, b, hk, j0, nk, 0);
        for (int h = hk * c->group; h < (hk + 1) * c->group; h++)
            for (int i0 = 0; i0 < sq; i0 += BM) {
                load_q_block(c, w, b, h, i0, sq, sk);
                if (!block_visible(w, j0, j0 + nk - 1)) continue;
                tile_grad(c, w, j0);
                transpose_tile(w->S, w->T);
                gemm(BN, dp, BM, w->T, BM, w->dO, dp, w->acc2, dp, 1, NULL); /* dV += Pᵀ dO */
                transpose_tile(w->dP, w->T);
                gemm(BN, dp, BM, w->T, BM, w->Q, dp, w->acc1, dp, 1, NULL);  /* dK += dSᵀ Q */
            }
    }
    for (int jj = 0; jj < nst; jj++) {
        store_row_f(p->dk.data, c->dt, fa3c_k_offset(pr, &p->dk, b, j0 + jj, hk, 0), w->acc1 + (int64_t)jj * dp, c->d,
                    pr->softmax_scale);
        store_row_f(p->dv.data, c->dt, fa3c_k_offset(pr, &p->dv, b, j0 + jj, hk, 0), w->acc2 + (int64_t)jj * dp, c->d,
                    1.0f);
    }
}

FA3C_HOT static void dq_block(const bwd_ctx *c, bwd_ws *w, int b, int h, int i0) {
    const fa3c_bwd_params *p = c->p;
    const fa3c_problem *pr = &c->pr;
    const int dp = c->dp, hk = h / c->group, sq = fa3c_seqlen_q_of(pr, b), sk = fa3c_seqlen_k_of(pr, b);
    const int nrows = load_q_block(c, w, b, h, i0, sq, sk);
    int kmin = INT_MAX, kmax = -1;
    for (int r = 0; r < nrows; r++)
        if (w->lo[r] <= w->hi[r]) {
            if (w->lo[r] < kmin) kmin = w->lo[r];
            if (w->hi[r] > kmax) kmax = w->hi[r];
        }
    memset(w->acc1, 0, sizeof(float) * BM * dp);
    for (int j0 = kmin; j0 <= kmax; j0 += BN) {
        const int nk = kmax + 1 - j0 < BN ? kmax + 1 - j0 : BN;
        load_k_block(c, w, b, hk, j0, nk, 1);
        tile_grad(c, w, j0);
        gemm(BM, dp, BN, w->dP, BN, w->K, dp, w->acc1, dp, 1, NULL); /* dQ += dS K */
    }
    for (int r = 0; r < nrows; r++)
        store_row_f(p->dq.data, c->dt, fa3c_q_offset(pr, &p->dq, b, i0 + r, h), w->acc1 + (int64_t)r * dp, c->d,
                    pr->softmax_scale);
}

static int alloc_ws(bwd_ws *w, int dp) {
    w->Q = scratch_floats((size_t)BM * dp);
    w->dO = scratch_floats((size_t)BM * dp);
    w->Kt = scratch_floats((size_t)dp * BN);
    w->Vt = scratch_floats((size_t)dp * BN);
    w->K = scratch_floats((size_t)BN * dp);
    w->S = scratch_floats((size_t)BM * BN);
    w->dP = scratch_floats((size_t)BM * BN);
    w->G = scratch_floats((size_t)BM * BN);
    w->T = scratch_floats((size_t)BM * BN);
    w->acc1 = scratch_floats((size_t)(BM > BN ? BM : BN) * dp);
    w->acc2 = scratch_floats((size_t)BN * dp);
    w->row = scratch_floats((size_t)dp);
    return w->Q && w->dO && w->Kt && w->Vt && w->K && w->S && w->dP && w->G && w->T && w->acc1 && w->acc2 && w->row;
}

static void free_ws(bwd_ws *w) {
    free(w->Q); free(w->dO); free(w->Kt); free(w->Vt); free(w->K); free(w->S);
    free(w->dP); free(w->G); free(w->T); free(w->acc1); free(w->acc2); free(w->row);
}

/* (batch, first row) of every block of `bs` rows; lengths from len(pr, b). */
static int *list_blocks(const fa3c_problem *pr, int bs, int (*len)(const fa3c_problem *, int), int64_t *n) {
    int64_t cnt = 0;
    for (int b = 0; b < pr->batch; b++) cnt += (len(pr, b) + bs - 1) / bs;
    int *blk = (int *)malloc(sizeof(int) * 2 * (size_t)(cnt > 0 ? cnt : 1));
    if (!blk) return NULL;
    int64_t k = 0;
    for (int b = 0; b < pr->batch; b++)
        for (int i0 = 0; i0 < len(pr, b); i0 += bs) {
            blk[2 * k] = b;
            blk[2 * k + 1] = i0;
            k++;
        }
    *n = cnt;
    return blk;
}

fa3c_status fa3c_cpu_bwd(const fa3c_bwd_params *p) {
    bwd_ctx c;
    c.p = p;
    c.pr = p->problem;
    c.d = c.pr.headdim;
    c.dp = (int)round_up((size_t)c.d, NR);
    c.group = c.pr.heads_q / c.pr.heads_kv;
    c.dt = c.pr.dtype;
    if (c.pr.softmax_scale == 0) c.pr.softmax_scale = (float)(1.0 / sqrt((double)c.d));
    const fa3c_problem *pr = &c.pr;

    const int64_t total_q = pr->cu_seqlens_q ? pr->cu_seqlens_q[pr->batch] : (int64_t)pr->batch * pr->seqlen_q;
    c.D = (float *)malloc(sizeof(float) * (size_t)(total_q * pr->heads_q > 0 ? total_q * pr->heads_q : 1));
    int64_t nqb = 0, nkb = 0;
    int *qblk = list_blocks(pr, BM, fa3c_seqlen_q_of, &nqb);
    int *kblk = list_blocks(pr, BN, stored_seqlen_k, &nkb);
    if (!c.D || !qblk || !kblk) {
        free(c.D); free(qblk); free(kblk);
        return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu backward: out of host memory");
    }
    int oom = 0;
    const int64_t nd = (int64_t)pr->batch * pr->heads_q, n1 = nkb * pr->heads_kv, n2 = nqb * pr->heads_q;

#pragma omp parallel
    {
        bwd_ws w;
        const int ok = alloc_ws(&w, c.dp);
        /* D = rowsum(dO ∘ O), in float from the stored tensors */
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < nd; t++) {
            if (!ok) continue;
            const int b = (int)(t / pr->heads_q), h = (int)(t % pr->heads_q);
            for (int i = 0; i < fa3c_seqlen_q_of(pr, b); i++) {
                load_row_f(w.Q, p->out.data, c.dt, fa3c_q_offset(pr, &p->out, b, i, h), c.d, c.dp, 1.0f);
                load_row_f(w.dO, p->dout.data, c.dt, fa3c_q_offset(pr, &p->dout, b, i, h), c.d, c.dp, 1.0f);
                float s = 0;
                for (int x = 0; x < c.d; x++) s += w.Q[x] * w.dO[x];
                c.D[fa3c_lse_index(pr, b, h, i)] = s;
            }
        }
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < n1; t++) {
            if (!ok) continue;
            const int64_t bi = t / pr->heads_kv;
            dkdv_block(&c, &w, kblk[2 * bi], (int)(t % pr->heads_kv), kblk[2 * bi + 1]);
        }
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < n2; t++) {
            if (!ok) continue;
            const int64_t bi = t / pr->heads_q;
            dq_block(&c, &w, qblk[2 * bi], (int)(t % pr->heads_q), qblk[2 * bi + 1]);
        }
        if (!ok) {
#pragma omp atomic write
            oom = 1;
        }
        free_ws(&w);
    }
    free(c.D);
    free(qblk);
    free(kblk);
    if (oom) return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu backward: out of host memory for tiles");
    return FA3C_STATUS_OK;
}
