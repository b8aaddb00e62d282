/* Tiled backward with float accumulation, in one pass (the 5 tile products of
 * FlashAttention-2: S = Q Kᵀ, dP = dO Vᵀ, dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K)
 * and deterministic: identical bits for any thread count and on every run.
 *
 *   prologue, per (query block, head): Q and dO converted to float once into
 *     packed blocks, D = rowsum(dO ∘ O), lse and per-row key ranges;
 *   main pass, per (batch, kv head, key chunk): for each key block of the chunk
 *     (dK, dV of that block summed in the task, over the GQA group and every
 *     query block, in a fixed order), and dQ accumulated in float in the
 *     chunk's own buffer;
 *   epilogue, per (query block, head): dQ = sum of the chunk buffers, chunk 0
 *     first, scaled and rounded.
 * The number of chunks depends only on the problem shape (never on the thread
 * count), so the order of every sum is fixed. Memory is linear in seqlen:
 * (2 + chunks) float copies of q (chunks <= 8, 1 once batch x kv heads >= 16).
 * The tile products use the forward's 6x16 micro-kernel (cpu/kernels.h). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "problem.h"
#include "cpu/convert.h"
#include "cpu/cpu.h"
#include "cpu/kernels.h"
#include "cpu/tile_io.h"

/* BM query rows (a multiple of MR) by BN keys (a multiple of MR and NR: keys
 * are the rows of Pᵀ and dSᵀ). */
enum { BM = 48, BN = 48, CHUNK_TASKS = 16, MAX_CHUNKS = 8 };

#define AI static inline __attribute__((always_inline))

typedef struct {
    const fa3c_bwd_params *p;
    fa3c_problem pr;
    int d, dp, group, nchunk;
    int dv, dvp;       /* v's, out's, dout's and dv's head dim (headdim_v), padded */
    fa3c_dtype dt;
    int64_t nqb;       /* query blocks over all batches */
    int *qblk;         /* [nqb][2]: (batch, first row) */
    int64_t *qfirst;   /* [batch + 1]: first query block of each batch */
    float *Qf, *dOf;   /* [nqb][hq][BM][dp] float, zero-padded ([dvp] for dO) */
    float *lse, *D;    /* [nqb][hq][BM]; lse = +inf for rows with no mass (P = 0) */
    int *rlo, *rhi;    /* [nqb][BM] visible keys per row (empty for padding rows) */
    int *blo, *bhi;    /* [nqb] union of the rows' ranges */
    int *fmax_lo, *fmin_hi; /* [nqb] max lo, min hi over all BM rows: a tile needs no mask when inside */
    float *dqacc;      /* [nchunk][nqb][hq][BM][dp] */
    double *dsink;     /* [nqb][hq] each block's share of dsinks (NULL without dsinks) */
} bwd_ctx;

typedef struct {
    float *K;        /* [BN][dp] key block */
    float *Kt, *Vt;  /* [dp][BN], [dvp][BN]: transposed key and value blocks */
    float *S, *dP;   /* [BM][BN]: scores -> P, dP -> dS */
    float *G;        /* [BM][BN] tanh' factor (softcap only) */
    float *T;        /* [BN][BM] transposed P or dS */
    float *dK, *dV;  /* [BN][dp], [BN][dvp] */
    float *row;      /* [max(dp, dvp)] */
} bwd_ws;

static int stored_seqlen_k(const fa3c_problem *pr, int b) {
    return pr->cu_seqlens_k ? pr->cu_seqlens_k[b + 1] - pr->cu_seqlens_k[b] : pr->seqlen_k;
}

static size_t blk_off(const bwd_ctx *c, int64_t k, int h) { /* float offset of block (k, h) of a packed buffer */
    return ((size_t)k * c->pr.heads_q + h) * BM * c->dp;
}

static size_t blk_off_v(const bwd_ctx *c, int64_t k, int h) { /* the same in dOf, rows of dvp */
    return ((size_t)k * c->pr.heads_q + h) * BM * c->dvp;
}

/* Prologue for query block k, head h: Q, dO, lse, D. */
FA3C_HOT static void prep_block(const bwd_ctx *c, bwd_ws *w, int64_t k, int h) {
    const fa3c_bwd_params *p = c->p;
    const fa3c_problem *pr = &c->pr;
    const int b = c->qblk[2 * k], i0 = c->qblk[2 * k + 1], d = c->d, dp = c->dp, dv = c->dv, dvp = c->dvp;
    const int sq = fa3c_seqlen_q_of(pr, b), nrows = sq - i0 < BM ? sq - i0 : BM;
    float *Q = c->Qf + blk_off(c, k, h), *dO = c->dOf + blk_off_v(c, k, h);
    float *lse = c->lse + ((size_t)k * pr->heads_q + h) * BM, *D = c->D + ((size_t)k * pr->heads_q + h) * BM;
    for (int ch = 0; ch < c->nchunk; ch++) /* this block's dQ accumulators */
        memset(c->dqacc + (size_t)ch * c->nqb * pr->heads_q * BM * dp + blk_off(c, k, h), 0, sizeof(float) * BM * dp);
    const double sink = fa3c_sink(pr, h);
    double dsink = 0;   /* Σ_rows -p_sink · D: the sink's probability is exp(sink - lse) */
    for (int r = 0; r < BM; r++) {
        float *qr = Q + (int64_t)r * dp, *dr = dO + (int64_t)r * dvp;
        if (r < nrows) {
            const int i = i0 + r;
            load_row_f(qr, p->q.data, c->dt, fa3c_q_offset(pr, &p->q, b, i, h), d, dp, 1.0f);
            load_row_f(dr, p->dout.data, c->dt, fa3c_q_offset(pr, &p->dout, b, i, h), dv, dvp, 1.0f);
            load_row_f(w->row, p->out.data, c->dt, fa3c_q_offset(pr, &p->out, b, i, h), dv, dvp, 1.0f);
            float s = 0; /* the same fused chain as the dP = dO Vᵀ product, so that dP - D is exactly 0 where O = V */
            for (int x = 0; x < dv; x++) s = __builtin_fmaf(dr[x], w->row[x], s);
            D[r] = s;
            const float l = p->lse[fa3c_lse_index(pr, b, h, i)];
            lse[r] = l == -INFINITY ? INFINITY : l; /* fully masked row: exp(s - inf) = 0; a NaN stays NaN */
            if (c->dsink && sink != -INFINITY) dsink -= exp(sink - l) * D[r];   /* a -inf sink has p = 0 */
        } else {
            memset(qr, 0, sizeof(float) * dp);
            memset(dr, 0, sizeof(float) * dvp);
            lse[r] = INFINITY;
            D[r] = 0;
        }
    }
    if (c->dsink) c->dsink[(size_t)k * pr->heads_q + h] = dsink;
}

/* Keys j0 .. j0+nk-1 of (b, hk) into K, Kt, Vt, zero-padded to BN. */
static void load_k_block(const bwd_ctx *c, bwd_ws *w, int b, int hk, int j0, int nk) {
    const fa3c_bwd_params *p = c->p;
    const int d = c->d, dp = c->dp, dv = c->dv;
    for (int jj = 0; jj < BN; jj++) {
        float *kr = w->K + (int64_t)jj * dp;
        if (jj < nk) {
            load_row_f(kr, p->k.data, c->dt, fa3c_k_offset(&c->pr, &p->k, b, j0 + jj, hk, 0), d, dp, 1.0f);
            for (int x = 0; x < d; x++) w->Kt[(int64_t)x * BN + jj] = kr[x];
            load_row_f(w->row, p->v.data, c->dt, fa3c_k_offset(&c->pr, &p->v, b, j0 + jj, hk, 0), dv, c->dvp, 1.0f);
            for (int x = 0; x < dv; x++) w->Vt[(int64_t)x * BN + jj] = w->row[x];
        } else {
            for (int x = 0; x < d; x++) w->Kt[(int64_t)x * BN + jj] = 0.0f;
            for (int x = 0; x < dv; x++) w->Vt[(int64_t)x * BN + jj] = 0.0f;
            memset(kr, 0, sizeof(float) * dp);
        }
    }
    for (int x = d; x < dp; x++)
        for (int jj = 0; jj < BN; jj++) w->Kt[(int64_t)x * BN + jj] = 0.0f;
    for (int x = dv; x < c->dvp; x++)
        for (int jj = 0; jj < BN; jj++) w->Vt[(int64_t)x * BN + jj] = 0.0f;
}

AI void transpose_tile(const float *restrict src, float *restrict dst) { /* [BM][BN] -> [BN][BM] */
    for (int r = 0; r < BM; r++)
        for (int j = 0; j < BN; j++) dst[j * BM + r] = src[r * BN + j];
}

/* S -> P and dP -> dS for the tile of query block k, head h, keys j0 .. j0+BN-1. */
AI void tile_grad(const bwd_ctx *c, bwd_ws *w, int64_t k, const float *lse, const float *D, int j0) {
    const float scale = c->pr.softmax_scale, cap = c->pr.softcap;
    const int *rlo = c->rlo + k * BM, *rhi = c->rhi + k * BM;
    const int full = c->fmax_lo[k] <= j0 && c->fmin_hi[k] >= j0 + BN - 1;
    for (int r = 0; r < BM; r++) {
        float *s = w->S + r * BN, *dp = w->dP + r * BN;
        if (cap > 0) {
            float *g = w->G + r * BN;
            for (int j = 0; j < BN; j++) {
                const float t = tanhf(s[j] * scale / cap);
                s[j] = cap * t;
                g[j] = 1.0f - t * t;
            }
        } else {
            const vf sc = vsplat(scale);
            for (int j = 0; j < BN; j += VW) vstore(s + j, vload(s + j) * sc);
        }
        if (!full) {
            const int lo = rlo[r] - j0, hi = rhi[r] - j0; /* visible columns [lo, hi] */
            for (int j = 0; j < BN; j++)
                if (j < lo || j > hi) s[j] = -INFINITY;
        }
        const vf l = vsplat(lse[r]), Dr = vsplat(D[r]);
        for (int j = 0; j < BN; j += VW) {
            const vf pv = vexp(vload(s + j) - l);
            vstore(s + j, pv);
            vstore(dp + j, pv * (vload(dp + j) - Dr));
        }
        if (cap > 0)
            for (int j = 0; j < BN; j++) dp[j] *= w->G[r * BN + j];
    }
}

/* Key blocks ch, ch + nchunk, ... of (b, hk): dK and dV of each block, and the
 * chunk's share of dQ. */
FA3C_HOT static void kv_task(const bwd_ctx *c, bwd_ws *w, int b, int hk, int ch) {
    const fa3c_bwd_params *p = c->p;
    const fa3c_problem *pr = &c->pr;
    const int dp = c->dp, dvp = c->dvp, hq = pr->heads_q;
    const int skst = stored_seqlen_k(pr, b), sk = fa3c_seqlen_k_of(pr, b);
    float *dqacc = c->dqacc + (size_t)ch * c->nqb * hq * BM * dp;
    for (int j0 = ch * BN; j0 < skst; j0 += c->nchunk * BN) {
        const int nst = skst - j0 < BN ? skst - j0 : BN;                        /* rows to write */
        const int nk = sk - j0 < nst ? (sk - j0 > 0 ? sk - j0 : 0) : nst;      /* rows with keys */
        memset(w->dK, 0, sizeof(float) * BN * dp);
        memset(w->dV, 0, sizeof(float) * BN * dvp);
        if (nk > 0) {
            const int j1 = j0 + nk - 1;
            load_k_block(c, w, b, hk, j0, nk);
            for (int h = hk * c->group; h < (hk + 1) * c->group; h++)
                for (int64_t k = c->qfirst[b]; k < c->qfirst[b + 1]; k++) {
                    if (c->blo[k] > j1 || c->bhi[k] < j0 || c->blo[k] > c->bhi[k]) continue;
                    const size_t o = blk_off(c, k, h);
                    const float *Q = c->Qf + o, *dO = c->dOf + blk_off_v(c, k, h);
                    const float *lse = c->lse + ((size_t)k * hq + h) * BM, *D = c->D + ((size_t)k * hq + h) * BM;
                    gemm(BM, BN, c->d, Q, dp, w->Kt, BN, w->S, BN, 0, NULL);   /* S = Q Kᵀ */
                    gemm(BM, BN, c->dv, dO, dvp, w->Vt, BN, w->dP, BN, 0, NULL); /* dP = dO Vᵀ */
                    tile_grad(c, w, k, lse, D, j0);
                    transpose_tile(w->S, w->T);
                    gemm(BN, dvp, BM, w->T, BM, dO, dvp, w->dV, dvp, 1, NULL); /* dV += Pᵀ dO */
                    transpose_tile(w->dP, w->T);
                    gemm(BN, dp, BM, w->T, BM, Q, dp, w->dK, dp, 1, NULL);    /* dK += dSᵀ Q */
                    gemm(BM, dp, BN, w->dP, BN, w->K, dp, dqacc + o, dp, 1, NULL); /* dQ += dS K */
                }
        }
        for (int jj = 0; jj < nst; jj++) {
            store_row_f(p->dk.data, c->dt, fa3c_k_offset(pr, &p->dk, b, j0 + jj, hk, 0), w->dK + (int64_t)jj * dp,
                        c->d, pr->softmax_scale);
            store_row_f(p->dv.data, c->dt, fa3c_k_offset(pr, &p->dv, b, j0 + jj, hk, 0), w->dV + (int64_t)jj * dvp,
                        c->dv, 1.0f);
        }
    }
}

/* Epilogue for query block k, head h: dQ = Σ_chunks (in order) · scale. */
FA3C_HOT static void dq_store(const bwd_ctx *c, bwd_ws *w, int64_t k, int h) {
    const fa3c_bwd_params *p = c->p;
    const fa3c_problem *pr = &c->pr;
    const int b = c->qblk[2 * k], i0 = c->qblk[2 * k + 1], dp = c->dp;
    const int sq = fa3c_seqlen_q_of(pr, b), nrows = sq - i0 < BM ? sq - i0 : BM;
    const size_t o = blk_off(c, k, h), cs = (size_t)c->nqb * pr->heads_q * BM * dp;
    for (int r = 0; r < nrows; r++) {
        const float *src = c->dqacc + o + (size_t)r * dp;
        if (c->nchunk > 1) {
            memcpy(w->row, src, sizeof(float) * dp);
            for (int ch = 1; ch < c->nchunk; ch++)
                for (int x = 0; x < dp; x++) w->row[x] += src[ch * cs + x];
            src = w->row;
        }
        store_row_f(p->dq.data, c->dt, fa3c_q_offset(pr, &p->dq, b, i0 + r, h), src, c->d, pr->softmax_scale);
    }
}

static int alloc_ws(bwd_ws *w, int dp, int dvp) {
    w->K = scratch_floats((size_t)BN * dp);
    w->Kt = scratch_floats((size_t)dp * BN);
    w->Vt = scratch_floats((size_t)dvp * BN);
    w->S = scratch_floats((size_t)BM * BN);
    w->dP = scratch_floats((size_t)BM * BN);
    w->G = scratch_floats((size_t)BM * BN);
    w->T = scratch_floats((size_t)BM * BN);
    w->dK = scratch_floats((size_t)BN * dp);
    w->dV = scratch_floats((size_t)BN * dvp);
    w->row = scratch_floats((size_t)(dp > dvp ? dp : dvp));
    return w->K && w->Kt && w->Vt && w->S && w->dP && w->G && w->T && w->dK && w->dV && w->row;
}

static void free_ws(bwd_ws *w) {
    free(w->K); free(w->Kt); free(w->Vt); free(w->S); free(w->dP);
    free(w->G); free(w->T); free(w->dK); free(w->dV); free(w->row);
}

static void free_ctx(bwd_ctx *c) {
    free(c->qblk); free(c->qfirst); free(c->Qf); free(c->dOf); free(c->lse); free(c->D);
    free(c->rlo); free(c->rhi); free(c->blo); free(c->bhi); free(c->fmax_lo); free(c->fmin_hi); free(c->dqacc);
    free(c->dsink);
}

/* Query blocks, their key ranges, and the packed buffers. */
static int setup(bwd_ctx *c) {
    const fa3c_problem *pr = &c->pr;
    int64_t n = 0, maxkb = 0;
    c->qfirst = (int64_t *)malloc(sizeof(int64_t) * (size_t)(pr->batch + 1));
    if (!c->qfirst) return 0;
    for (int b = 0; b < pr->batch; b++) {
        c->qfirst[b] = n;
        n += (fa3c_seqlen_q_of(pr, b) + BM - 1) / BM;
        const int64_t kb = (stored_seqlen_k(pr, b) + BN - 1) / BN;
        if (kb > maxkb) maxkb = kb;
    }
    c->qfirst[pr->batch] = n;
    c->nqb = n;
    /* chunks of key blocks: enough tasks for any thread count, from the shape alone */
    const int64_t bh = (int64_t)pr->batch * pr->heads_kv;
    int64_t nch = (CHUNK_TASKS + bh - 1) / bh;
    if (nch > MAX_CHUNKS) nch = MAX_CHUNKS;
    if (nch > maxkb) nch = maxkb;
    c->nchunk = nch > 1 ? (int)nch : 1;
    const size_t n1 = n > 0 ? (size_t)n : 1, blk = n1 * pr->heads_q * BM * c->dp;
    c->qblk = (int *)malloc(sizeof(int) * 2 * n1);
    c->Qf = scratch_floats(blk);
    c->dOf = scratch_floats(n1 * pr->heads_q * BM * c->dvp);
    c->dqacc = scratch_floats(blk * c->nchunk);
    c->lse = (float *)malloc(sizeof(float) * n1 * pr->heads_q * BM);
    c->D = (float *)malloc(sizeof(float) * n1 * pr->heads_q * BM);
    c->rlo = (int *)malloc(sizeof(int) * n1 * BM);
    c->rhi = (int *)malloc(sizeof(int) * n1 * BM);
    c->blo = (int *)malloc(sizeof(int) * n1);
    c->bhi = (int *)malloc(sizeof(int) * n1);
    c->fmax_lo = (int *)malloc(sizeof(int) * n1);
    c->fmin_hi = (int *)malloc(sizeof(int) * n1);
    if (c->p->dsinks) c->dsink = (double *)malloc(sizeof(double) * n1 * pr->heads_q);
    if (!c->qblk || !c->Qf || !c->dOf || !c->dqacc || !c->lse || !c->D || !c->rlo || !c->rhi || !c->blo || !c->bhi ||
        !c->fmax_lo || !c->fmin_hi || (c->p->dsinks && !c->dsink))
        return 0;
    int64_t k = 0;
    for (int b = 0; b < pr->batch; b++) {
        const int sq = fa3c_seqlen_q_of(pr, b), sk = fa3c_seqlen_k_of(pr, b);
        for (int i0 = 0; i0 < sq; i0 += BM, k++) {
            c->qblk[2 * k] = b;
            c->qblk[2 * k + 1] = i0;
            int *lo = c->rlo + k * BM, *hi = c->rhi + k * BM;
            int ulo = INT_MAX, uhi = -1, mlo = INT_MIN, mhi = INT_MAX;
            for (int r = 0; r < BM; r++) {
                if (i0 + r < sq) {
                    fa3c_key_range(pr, i0 + r, sq, sk, &lo[r], &hi[r]);
                } else {
                    lo[r] = 1;
                    hi[r] = 0;
                }
                if (lo[r] <= hi[r]) {
                    if (lo[r] < ulo) ulo = lo[r];
                    if (hi[r] > uhi) uhi = hi[r];
                }
                if (lo[r] > mlo) mlo = lo[r];
                if (hi[r] < mhi) mhi = hi[r];
            }
            c->blo[k] = ulo;
            c->bhi[k] = uhi;
            c->fmax_lo[k] = mlo;
            c->fmin_hi[k] = mhi;
        }
    }
    return 1;
}

fa3c_status fa3c_cpu_bwd(const fa3c_bwd_params *p) {
    fa3c_cpu_zero_unused_dq_rows(p);
    bwd_ctx c;
    memset(&c, 0, sizeof c);
    c.p = p;
    c.pr = p->problem;
    c.d = c.pr.headdim;
    c.dp = (int)round_up((size_t)c.d, NR);
    c.dv = fa3c_headdim_v(&c.pr);
    c.dvp = (int)round_up((size_t)c.dv, NR);
    c.group = c.pr.heads_q / c.pr.heads_kv;
    c.dt = c.pr.dtype;
    c.pr.softmax_scale = fa3c_softmax_scale(&c.pr, 0);
    const fa3c_problem *pr = &c.pr;
    if (!setup(&c)) {
        free_ctx(&c);
        return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu backward: out of host memory");
    }
    int oom = 0;
    const int64_t nqh = c.nqb * pr->heads_q, ntask = (int64_t)pr->batch * pr->heads_kv * c.nchunk;

#pragma omp parallel
    {
        bwd_ws w;
        const int ok = alloc_ws(&w, c.dp, c.dvp);
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < nqh; t++)
            if (ok) prep_block(&c, &w, t / pr->heads_q, (int)(t % pr->heads_q));
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < ntask; t++) {
            if (!ok) continue;
            const int64_t bh = t / c.nchunk;
            kv_task(&c, &w, (int)(bh / pr->heads_kv), (int)(bh % pr->heads_kv), (int)(t % c.nchunk));
        }
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < nqh; t++)
            if (ok) dq_store(&c, &w, t / pr->heads_q, (int)(t % pr->heads_q));
        if (!ok) {
#pragma omp atomic write
            oom = 1;
        }
        free_ws(&w);
    }
    if (!oom && p->dsinks)   /* the blocks' shares in block order: the same bits on every run */
        for (int h = 0; h < pr->heads_q; h++) {
            double sum = 0;
            for (int64_t k = 0; k < c.nqb; k++) sum += c.dsink[(size_t)k * pr->heads_q + h];
            p->dsinks[h] = (float)sum;
        }
    free_ctx(&c);
    if (oom) return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu backward: out of host memory for tiles");
    return FA3C_STATUS_OK;
}
