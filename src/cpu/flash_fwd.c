/* Tiled forward (FlashAttention on the CPU): per (batch, head, block of BM
 * query rows), stream key blocks of BN keys with an online softmax - running
 * row max m and sum l, rescaling the float accumulator O by exp(m_old - m_new).
 * Memory is O(BM·d + BN·d) per thread; no sq x sk buffer. OpenMP over the
 * (row block, head) tasks; each output row is produced by one task, in a fixed
 * order, so results are the same on every run. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "problem.h"
#include "cpu/convert.h"
#include "cpu/kernels.h"
#include "cpu/tile_io.h"

/* 48 = 8 micro-tiles of 6 rows; 64 keys = 4 micro-tiles of 16. With d = 128 the
 * working set (Q, O 24 KiB each, K, V 32 KiB each) stays in L2. */
enum { BM = 48, BN = 64 };

typedef struct {
    const fa3c_fwd_params *p;
    fa3c_problem pr; /* with softmax_scale filled in */
    int d, dp, group;
    int dv, dvp;       /* v's and out's head dim (headdim_v), padded */
    /* With qv the scores' contraction runs over [q, qv]·[k, v]: qk = dp + dv
     * values (dp + dvp stored per Q row), else d (dp stored). */
    int qk, qw;
    fa3c_dtype dt, odt;
} fwd_ctx;

typedef struct {
    float *Q;  /* [BM][qw]  q · descale · scale (then qv · scale) */
    float *Kt; /* [qk][BN]  k block, transposed (then v's) */
    float *V;  /* [BN][dvp] v block */
    float *S;  /* [BM][BN]  scores, then probabilities */
    float *O;  /* [BM][dvp] unnormalised output */
    float *row;/* [dp]      one converted key row */
} fwd_ws;

static float descale_at(const float *ds, const fa3c_problem *pr, int b, int hk) {
    return ds ? ds[(int64_t)b * pr->heads_kv + hk] : 1.0f;
}

/* Keys j0 .. j0+nk-1 of (b, hk) into Kt (transposed) and V, zero-padded to BN. */
static void load_kv(const fwd_ctx *c, fwd_ws *w, int b, int hk, int j0, int nk, float kd, float vd) {
    const fa3c_fwd_params *p = c->p;
    const int d = c->d, dp = c->dp;
    for (int jj = 0; jj < BN; jj++) {
        float *vr = w->V + (int64_t)jj * c->dvp;
        if (jj < nk) {
            const int pos = fa3c_leftpad_k_of(&c->pr, b) + j0 + jj;   /* the key's row in its cache */
            load_row_f(w->row, p->k.data, c->dt, fa3c_k_offset(&c->pr, &p->k, b, j0 + jj, hk, 1), d, dp,
                       kd * fa3c_block_descale(p, 1, b, hk, pos));
            load_row_f(vr, p->v.data, c->dt, fa3c_k_offset(&c->pr, &p->v, b, j0 + jj, hk, 1), c->dv, c->dvp,
                       vd * fa3c_block_descale(p, 2, b, hk, pos));
            for (int x = 0; x < c->qk; x++) w->Kt[(int64_t)x * BN + jj] = x < dp ? w->row[x] : vr[x - dp];
        } else {
            for (int x = 0; x < c->qk; x++) w->Kt[(int64_t)x * BN + jj] = 0.0f;
            memset(vr, 0, sizeof(float) * c->dvp);
        }
    }
}

/* max of a and b, NaN if either is (fmaxf would drop it). */
static inline float nan_max(float a, float b) {
    return a != a || b != b ? NAN : a > b ? a : b;
}

/* The row's max, NaN if it holds a NaN: a NaN score must reach the output
 * and the LSE, as in the float64 reference, not hide the row. */
static inline float row_max(const float *r) {
    vf m = vload(r);
    for (int j = VW; j < BN; j += VW) {
        vf x = vload(r + j);
        m = vselect((x > m) | (x != x), x, m);   /* a NaN lane stays NaN: nothing compares greater */
    }
    float mx = m[0];
    for (int t = 1; t < VW; t++) mx = nan_max(m[t], mx);
    return mx;
}

/* r[j] = exp(r[j] - mx); returns the sum. */
static inline float row_exp_sum(float *r, float mx) {
    vf s = vsplat(0.0f);
    for (int j = 0; j < BN; j += VW) {
        vf e = vexp_sub(r + j, mx);
        vstore(r + j, e);
        s += e;
    }
    float t = 0;
    for (int k = 0; k < VW; k++) t += s[k];
    return t;
}

FA3C_HOT static void fwd_block(const fwd_ctx *c, fwd_ws *w, int b, int h, int i0) {
    const fa3c_fwd_params *p = c->p;
    const fa3c_problem *pr = &c->pr;
    const int d = c->d, dp = c->dp, dv = c->dv, dvp = c->dvp, hk = h / c->group;
    const int sq = fa3c_seqlen_q_of(pr, b), sk = fa3c_seqlen_k_of(pr, b);
    const int nrows = sq - i0 < BM ? sq - i0 : BM;
    const float cap = pr->softcap;
    int lo[BM], hi[BM];
    float m[BM], l[BM], alpha[BM];
    int kmin = INT_MAX, kmax = -1;

    for (int r = 0; r < nrows; r++) {
        fa3c_key_range(pr, i0 + r, sq, sk, &lo[r], &hi[r]);
        if (lo[r] <= hi[r]) {
            if (lo[r] < kmin) kmin = lo[r];
            if (hi[r] > kmax) kmax = hi[r];
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const float qmul = descale_at(p->q_descale, pr, b, hk) * pr->softmax_scale;
    const float kd = descale_at(p->k_descale, pr, b, hk), vd = descale_at(p->v_descale, pr, b, hk);
    for (int r = 0; r < BM; r++) {
        float *qrow = w->Q + (int64_t)r * c->qw;
        if (r < nrows) {
            load_row_f(qrow, p->q.data, c->dt, fa3c_q_offset(pr, &p->q, b, i0 + r, h), d, dp,
                       qmul * fa3c_block_descale(p, 0, b, h, i0 + r));
            if (p->qv.data)
                load_row_f(qrow + dp, p->qv.data, c->dt, fa3c_q_offset(pr, &p->qv, b, i0 + r, h), dv, dvp,
                           pr->softmax_scale);
        } else {
            memset(qrow, 0, sizeof(float) * c->qw);
        }
    }
    memset(w->O, 0, sizeof(float) * BM * dvp);

    for (int j0 = kmin; j0 <= kmax; j0 += BN) {
        const int nk = kmax + 1 - j0 < BN ? kmax + 1 - j0 : BN;
        load_kv(c, w, b, hk, j0, nk, kd, vd);
        gemm(BM, BN, c->qk, w->Q, c->qw, w->Kt, BN, w->S, BN, 0, NULL);
        if (cap > 0)
            for (int r = 0; r < nrows; r++)
                for (int jj = 0; jj < nk; jj++) {
                    float *s = w->S + r * BN + jj;
                    *s = cap * tanhf(*s / cap);
                }
        int full = nk == BN;
        for (int r = 0; r < nrows && full; r++) full = lo[r] <= j0 && hi[r] >= j0 + BN - 1;
        if (!full)
            for (int r = 0; r < nrows; r++)
                for (int jj = 0; jj < BN; jj++)
                    if (j0 + jj < lo[r] || j0 + jj > hi[r]) w->S[r * BN + jj] = -INFINITY;
        for (int r = 0; r < BM; r++) {
            float *srow = w->S + r * BN;
            const float mx = r < nrows ? row_max(srow) : -INFINITY;
            const float mnew = nan_max(mx, m[r]);
            if (r >= nrows || mnew == -INFINITY) { /* nothing visible yet: keep O = 0 */
                alpha[r] = r < nrows ? 1.0f : 0.0f;
                memset(srow, 0, sizeof(float) * BN);
                continue;
            }
            alpha[r] = expf(m[r] - mnew);
            l[r] = l[r] * alpha[r] + row_exp_sum(srow, mnew);
            m[r] = mnew;
        }
        gemm(BM, dvp, BN, w->S, BN, w->V, dvp, w->O, dvp, 1, alpha);
    }

    const float sink = fa3c_sink(pr, h);
    for (int r = 0; r < nrows; r++) {
        const int64_t oo = fa3c_q_offset(pr, &p->out, b, i0 + r, h);
        float *orow = w->O + (int64_t)r * dvp;
        float lse;
        const float mx = nan_max(m[r], sink);
        if (lo[r] > hi[r]) { /* fully masked row (by the key range, never by the sum): zeros and -inf (or the sink) */
            memset(orow, 0, sizeof(float) * dv);
            store_row_f(p->out.data, c->odt, oo, orow, dv, 1.0f);
            lse = sink;
        } else if (pr->sinks && mx != -INFINITY) { /* the sink joins the denominator only */
            const float a = m[r] == -INFINITY ? 0.0f : expf(m[r] - mx), denom = l[r] * a + expf(sink - mx);
            store_row_f(p->out.data, c->odt, oo, orow, dv, a / denom);
            lse = mx + logf(denom);
        } else if (l[r] == 0) { /* keys seen, every score -inf: the reference's exp(-inf - -inf) is NaN */
            for (int x = 0; x < dv; x++) orow[x] = NAN;
            store_row_f(p->out.data, c->odt, oo, orow, dv, 1.0f);
            lse = NAN;
        } else { /* NaN scores give l = NaN: NaN out and lse */
            store_row_f(p->out.data, c->odt, oo, orow, dv, 1.0f / l[r]);
            lse = m[r] + logf(l[r]);
        }
        if (p->lse) p->lse[fa3c_lse_index(pr, b, h, i0 + r)] = lse;
    }
}

fa3c_status fa3c_cpu_fwd(const fa3c_fwd_params *p) {
    fwd_ctx c;
    c.p = p;
    c.pr = p->problem;
    c.d = c.pr.headdim;
    c.dp = (int)round_up((size_t)c.d, NR);
    c.dv = fa3c_headdim_v(&c.pr);
    c.dvp = (int)round_up((size_t)c.dv, NR);
    c.group = c.pr.heads_q / c.pr.heads_kv;
    c.dt = c.pr.dtype;
    c.odt = fa3c_out_dtype(c.dt);
    c.qk = p->qv.data ? c.dp + c.dv : c.d;
    c.qw = p->qv.data ? c.dp + c.dvp : c.dp;
    c.pr.softmax_scale = fa3c_softmax_scale(&c.pr, p->qv.data != NULL);

    /* (batch, first row) of every row block */
    int64_t nblk = 0;
    for (int b = 0; b < c.pr.batch; b++) nblk += (fa3c_seqlen_q_of(&c.pr, b) + BM - 1) / BM;
    int *blk = (int *)malloc(sizeof(int) * 2 * (size_t)(nblk > 0 ? nblk : 1));
    if (!blk) return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu forward: out of host memory");
    int64_t k = 0;
    for (int b = 0; b < c.pr.batch; b++)
        for (int i0 = 0; i0 < fa3c_seqlen_q_of(&c.pr, b); i0 += BM) {
            blk[2 * k] = b;
            blk[2 * k + 1] = i0;
            k++;
        }
    const int64_t ntask = nblk * c.pr.heads_q;
    int oom = 0;

#pragma omp parallel
    {
        fwd_ws w;
        const int dp = c.dp, dvp = c.dvp;
        w.Q = scratch_floats((size_t)BM * c.qw);
        w.Kt = scratch_floats((size_t)c.qw * BN);
        w.V = scratch_floats((size_t)BN * dvp);
        w.S = scratch_floats((size_t)BM * BN);
        w.O = scratch_floats((size_t)BM * dvp);
        w.row = scratch_floats((size_t)dp);
        const int ok = w.Q && w.Kt && w.V && w.S && w.O && w.row;
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < ntask; t++) {
            if (!ok) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            const int64_t bi = t / c.pr.heads_q;
            fwd_block(&c, &w, blk[2 * bi], (int)(t % c.pr.heads_q), blk[2 * bi + 1]);
        }
        free(w.Q);
        free(w.Kt);
        free(w.V);
        free(w.S);
        free(w.O);
        free(w.row);
    }
    free(blk);
    if (oom) return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu forward: out of host memory for tiles");
    return FA3C_STATUS_OK;
}
