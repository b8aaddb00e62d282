/* See row_check.h. Every routine works on one row at a time and has two
 * modes: exact (double everywhere) and naive (float accumulation, each
 * intermediate rounded to its storage type). */
#include "row_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elem.h"

int rc_spread(int n, int len, int *out) {
    if (n <= 0 || len <= 0) return 0;
    if (n >= len) {
        for (int i = 0; i < len; i++) out[i] = i;
        return len;
    }
    if (n == 1) {
        out[0] = len - 1; /* the last row sees the most keys under a causal mask */
        return 1;
    }
    int m = 0;
    for (int t = 0; t < n; t++) {
        int r = (int)(((int64_t)t * (len - 1) + (n - 1) / 2) / (n - 1));
        if (m == 0 || r != out[m - 1]) out[m++] = r;
    }
    return m;
}

void rc_key_range(const rc_problem *pr, int i, int *lo, int *hi) {
    /* Bottom-right alignment: query i sits on key diagonal i + sk - sq. */
    int64_t diag = (int64_t)i + pr->sk - pr->sq;
    int64_t l = 0, h = pr->sk - 1;
    int64_t right = pr->causal ? 0 : pr->window_right;
    if (pr->window_left >= 0 && diag - pr->window_left > l) l = diag - pr->window_left;
    if (right >= 0 && diag + right < h) h = diag + right;
    if (l > h) { l = 1; h = 0; } /* canonical empty range */
    *lo = (int)l;
    *hi = (int)h;
}

int64_t rc_visible_pairs(const rc_problem *pr) {
    int64_t n = 0;
    for (int i = 0; i < pr->sq; i++) {
        int lo, hi;
        rc_key_range(pr, i, &lo, &hi);
        if (hi >= lo) n += hi - lo + 1;
    }
    return n;
}

/* ---- small pieces ---- */

static const float *row(const float *t, int s, int h, int d, int b, int i, int hh) {
    return t + (((int64_t)b * s + i) * h + hh) * d;
}

static double dot(const float *a, const float *b, int d, int naive) {
    if (naive) {
        float acc = 0; /* what a float-accumulating matmul does */
        for (int x = 0; x < d; x++) acc += a[x] * b[x];
        return acc;
    }
    double acc = 0;
    for (int x = 0; x < d; x++) acc += (double)a[x] * b[x];
    return acc;
}

/* Score of (q row, k row) and, for the backward, d(score)/d(qk). */
static double score(const rc_problem *pr, double qk, int naive, double *dscore) {
    fa3c_dtype r = elem_out_dtype(pr->dtype); /* matmul results are stored in the output type */
    if (naive) qk = elem_round(r, qk);
    double s = qk * pr->scale;
    if (naive) s = elem_round(r, s);
    double ds = pr->scale;
    if (pr->softcap > 0) {
        double t = tanh(s / pr->softcap);
        s = pr->softcap * t;
        if (naive) s = elem_round(r, s);
        ds *= 1 - t * t;
    }
    if (dscore) *dscore = ds;
    return s;
}

static void stats_add(rc_stats *st, double lib, double exact, double naive) {
    double e = fabs(lib - exact);
    if (isinf(lib) && lib == exact) e = 0; /* both -inf: a fully masked row's lse */
    if (!(e <= st->max_err)) st->max_err = isnan(e) ? INFINITY : e;
    double ne = fabs(naive - exact);
    if (isinf(naive) && naive == exact) ne = 0;
    if (ne > st->naive_err) st->naive_err = ne;
    if (isfinite(exact) && fabs(exact) > st->ref_max) st->ref_max = fabs(exact);
    if (isfinite(exact)) {
        st->err_sq += isfinite(e) ? e * e : INFINITY;
        st->ref_sq += exact * exact;
    }
    st->count++;
}

/* ---- forward ---- */

/* One output row (b, h, i) and its lse; scratch holds sk doubles. */
static void fwd_row(const rc_problem *pr, int b, int h, int i, int naive, double *o, double *lse, double *s) {
    int lo, hi, d = pr->d, kh = h / (pr->hq / pr->hkv);
    rc_key_range(pr, i, &lo, &hi);
    memset(o, 0, sizeof(double) * d);
    if (lo > hi) {
        *lse = -INFINITY;
        return;
    }
    const float *qr = row(pr->q, pr->sq, pr->hq, d, b, i, h);
    double m = -INFINITY;
    for (int j = lo; j <= hi; j++) {
        s[j] = score(pr, dot(qr, row(pr->k, pr->sk, pr->hkv, d, b, j, kh), d, naive), naive, NULL);
        if (s[j] > m) m = s[j];
    }
    double l = 0;
    for (int j = lo; j <= hi; j++) {
        if (naive) l = (float)(l + expf((float)(s[j] - m)));
        else l += exp(s[j] - m);
    }
    fa3c_dtype out_dt = elem_out_dtype(pr->dtype);
    for (int j = lo; j <= hi; j++) {
        double p;
        if (!naive) p = exp(s[j] - m) / l;
        else if (pr->dtype == FA3C_DTYPE_E4M3)
            p = elem_round(FA3C_DTYPE_E4M3, expf((float)(s[j] - m))) / l; /* fp8 P is unnormalized, in [0, 1] */
        else
            p = elem_round(pr->dtype, (float)(expf((float)(s[j] - m)) / (float)l));
        const float *vr = row(pr->v, pr->sk, pr->hkv, d, b, j, kh);
        for (int x = 0; x < d; x++) o[x] = naive ? (float)(o[x] + (float)p * vr[x]) : o[x] + p * vr[x];
    }
    if (naive)
        for (int x = 0; x < d; x++) o[x] = elem_round(out_dt, o[x]);
    *lse = naive ? (double)((float)m + logf((float)l)) : m + log(l);
}

void rc_check_fwd(const rc_problem *pr, const int *rows, int nrows, const void *lib_out, fa3c_dtype out_dtype,
                  const float *lib_lse, rc_stats *out_st, rc_stats *lse_st, rc_progress_fn progress) {
    int d = pr->d;
    double *ex = malloc(sizeof(double) * d), *nv = malloc(sizeof(double) * d), *s = malloc(sizeof(double) * pr->sk);
    memset(out_st, 0, sizeof *out_st);
    memset(lse_st, 0, sizeof *lse_st);
    int64_t total = (int64_t)pr->batch * pr->hq, done = 0;
    for (int b = 0; b < pr->batch; b++)
        for (int h = 0; h < pr->hq; h++, done++) {
            if (progress) progress("checking forward rows", done, total);
            for (int r = 0; r < nrows; r++) {
                int i = rows[r];
                double lse_ex, lse_nv;
                fwd_row(pr, b, h, i, 0, ex, &lse_ex, s);
                fwd_row(pr, b, h, i, 1, nv, &lse_nv, s);
                int64_t base = (((int64_t)b * pr->sq + i) * pr->hq + h) * d;
                for (int x = 0; x < d; x++) stats_add(out_st, elem_load(lib_out, out_dtype, base + x), ex[x], nv[x]);
                if (lib_lse) stats_add(lse_st, lib_lse[((int64_t)b * pr->hq + h) * pr->sq + i], lse_ex, lse_nv);
            }
        }
    free(ex);
    free(nv);
    free(s);
}

/* ---- backward (given the forward's out and lse, as the library is) ---- */

/* P, dS of the pair (i, j) of head h; returns 0 when j is masked for i. */
static int bwd_pair(const rc_problem *pr, int b, int h, int i, int j, double D, int naive, double *p, double *ds) {
    int lo, hi, d = pr->d, kh = h / (pr->hq / pr->hkv);
    rc_key_range(pr, i, &lo, &hi);
    if (j < lo || j > hi) return 0;
    fa3c_dtype dt = pr->dtype;
    const float *qr = row(pr->q, pr->sq, pr->hq, d, b, i, h), *dor = row(pr->dout, pr->sq, pr->hq, d, b, i, h);
    double dscore, s = score(pr, dot(qr, row(pr->k, pr->sk, pr->hkv, d, b, j, kh), d, naive), naive, &dscore);
    double lse = pr->lse[((int64_t)b * pr->hq + h) * pr->sq + i];
    double dp = dot(dor, row(pr->v, pr->sk, pr->hkv, d, b, j, kh), d, naive);
    if (naive) {
        *p = elem_round(dt, expf((float)(s - lse)));
        dp = elem_round(dt, dp);
        *ds = elem_round(dt, elem_round(dt, *p * (dp - D)) * dscore);
    } else {
        *p = exp(s - lse);
        *ds = *p * (dp - D) * dscore;
    }
    return 1;
}

/* rowsum(dout * out) of row (b, h, i), the softmax backward's correction. */
static double bwd_D(const rc_problem *pr, int b, int h, int i, int naive) {
    const float *dor = row(pr->dout, pr->sq, pr->hq, pr->d, b, i, h), *or_ = row(pr->out, pr->sq, pr->hq, pr->d, b, i, h);
    return dot(dor, or_, pr->d, naive);
}

static void dq_row(const rc_problem *pr, int b, int h, int i, int naive, double *dq) {
    int d = pr->d, kh = h / (pr->hq / pr->hkv);
    memset(dq, 0, sizeof(double) * d);
    double D = bwd_D(pr, b, h, i, naive);
    for (int j = 0; j < pr->sk; j++) {
        double p, ds;
        if (!bwd_pair(pr, b, h, i, j, D, naive, &p, &ds)) continue;
        const float *kr = row(pr->k, pr->sk, pr->hkv, d, b, j, kh);
        for (int x = 0; x < d; x++) dq[x] = naive ? (float)(dq[x] + (float)ds * kr[x]) : dq[x] + ds * kr[x];
    }
    if (naive)
        for (int x = 0; x < d; x++) dq[x] = elem_round(pr->dtype, dq[x]);
}

static void dkv_row(const rc_problem *pr, int b, int kh, int j, int naive, double *dk, double *dv) {
    int d = pr->d, group = pr->hq / pr->hkv;
    memset(dk, 0, sizeof(double) * d);
    memset(dv, 0, sizeof(double) * d);
    for (int h = kh * group; h < (kh + 1) * group; h++)
        for (int i = 0; i < pr->sq; i++) {
            int lo, hi;
            rc_key_range(pr, i, &lo, &hi);
            if (j < lo || j > hi) continue; /* skip the dot product for D too */
            double p, ds;
            bwd_pair(pr, b, h, i, j, bwd_D(pr, b, h, i, naive), naive, &p, &ds);
            const float *qr = row(pr->q, pr->sq, pr->hq, d, b, i, h), *dor = row(pr->dout, pr->sq, pr->hq, d, b, i, h);
            for (int x = 0; x < d; x++) {
                dk[x] = naive ? (float)(dk[x] + (float)ds * qr[x]) : dk[x] + ds * qr[x];
                dv[x] = naive ? (float)(dv[x] + (float)p * dor[x]) : dv[x] + p * dor[x];
            }
        }
    if (naive)
        for (int x = 0; x < d; x++) {
            dk[x] = elem_round(pr->dtype, dk[x]);
            dv[x] = elem_round(pr->dtype, dv[x]);
        }
}

void rc_check_bwd(const rc_problem *pr, const int *qrows, int nq, const int *krows, int nk, const void *lib_dq,
                  const void *lib_dk, const void *lib_dv, rc_stats *dq_st, rc_stats *dk_st, rc_stats *dv_st,
                  rc_progress_fn progress) {
    int d = pr->d;
    double *e1 = malloc(sizeof(double) * d), *e2 = malloc(sizeof(double) * d);
    double *n1 = malloc(sizeof(double) * d), *n2 = malloc(sizeof(double) * d);
    memset(dq_st, 0, sizeof *dq_st);
    memset(dk_st, 0, sizeof *dk_st);
    memset(dv_st, 0, sizeof *dv_st);
    int64_t total = (int64_t)pr->batch * (pr->hq + pr->hkv), done = 0;
    for (int b = 0; b < pr->batch; b++) {
        for (int h = 0; h < pr->hq; h++, done++) {
            if (progress) progress("checking dq rows", done, total);
            for (int r = 0; r < nq; r++) {
                int i = qrows[r];
                dq_row(pr, b, h, i, 0, e1);
                dq_row(pr, b, h, i, 1, n1);
                int64_t base = (((int64_t)b * pr->sq + i) * pr->hq + h) * d;
                for (int x = 0; x < d; x++) stats_add(dq_st, elem_load(lib_dq, pr->dtype, base + x), e1[x], n1[x]);
            }
        }
        for (int kh = 0; kh < pr->hkv; kh++, done++) {
            if (progress) progress("checking dk, dv rows", done, total);
            for (int r = 0; r < nk; r++) {
                int j = krows[r];
                dkv_row(pr, b, kh, j, 0, e1, e2);
                dkv_row(pr, b, kh, j, 1, n1, n2);
                int64_t base = (((int64_t)b * pr->sk + j) * pr->hkv + kh) * d;
                for (int x = 0; x < d; x++) {
                    stats_add(dk_st, elem_load(lib_dk, pr->dtype, base + x), e1[x], n1[x]);
                    stats_add(dv_st, elem_load(lib_dv, pr->dtype, base + x), e2[x], n2[x]);
                }
            }
        }
    }
    free(e1);
    free(e2);
    free(n1);
    free(n2);
}

/* ---- the rule ---- */

int rc_pass(const rc_stats *st, fa3c_dtype out_dtype, int is_lse, double *bound) {
    /* atol: a couple of output-type ulps at the largest value (float
     * accumulation over long rows for fp32); lse is float in every dtype. */
    double ulp = is_lse ? 0x1p-14
               : out_dtype == FA3C_DTYPE_FP32 ? 0x1p-17
               : out_dtype == FA3C_DTYPE_FP16 ? 0x1p-10
                                              : 0x1p-7;
    double scale = st->ref_max > 1 ? st->ref_max : 1;
    *bound = 2 * st->naive_err + ulp * scale;
    return st->max_err <= *bound; /* NaN fails */
}

double rc_rel_l2(const rc_stats *st) {
    if (!isfinite(st->err_sq)) return INFINITY;
    return st->ref_sq > 0 ? sqrt(st->err_sq / st->ref_sq) : sqrt(st->err_sq);
}
