/* The oracle: naive attention with double accumulation, one query row at a
 * time, straight from the definitions in fa3c.h and problem.h. Slow on
 * purpose (O(sq·sk·d) with no tiling), but memory stays linear in seqlen.
 * Parallel over (batch, head) only, which keeps every sum in a fixed order. */
#include <math.h>
#include <stdlib.h>
#include "backend.h"
#include "problem.h"
#include "cpu/convert.h"
#include "cpu/cpu.h"

/* A copy of the problem with the default scale filled in, so the reference
 * also works when called directly (tests) rather than through api.c. */
static fa3c_problem prepared(const fa3c_problem *pr) {
    fa3c_problem P = *pr;
    P.softmax_scale = fa3c_softmax_scale(pr, 0);
    return P;
}

/* The forward's (with qv its default differs). */
static fa3c_problem prepared_fwd(const fa3c_fwd_params *p) {
    fa3c_problem P = p->problem;
    P.softmax_scale = fa3c_softmax_scale(&P, p->qv.data != NULL);
    return P;
}

static int max_seqlen_k(const fa3c_problem *pr) {
    int m = 0;   /* the keys used, not the declared maximum: with cu_seqlens or seqused_k only a bound */
    for (int b = 0; b < pr->batch; b++) {
        int n = fa3c_seqlen_k_of(pr, b);
        if (n > m) m = n;
    }
    return m > 0 ? m : 1;
}

/* Keys stored for sequence b (dk/dv rows that must be written), seqused_k aside. */
static int stored_seqlen_k(const fa3c_problem *pr, int b) {
    return pr->cu_seqlens_k ? pr->cu_seqlens_k[b + 1] - pr->cu_seqlens_k[b] : pr->seqlen_k;
}

static double descale_of(const float *ds, const fa3c_problem *pr, int b, int hk) {
    return ds ? (double)ds[(int64_t)b * pr->heads_kv + hk] : 1.0;
}

static void load_row(double *dst, const fa3c_tensor *t, fa3c_dtype dt, int64_t off, int d, double mul) {
    for (int c = 0; c < d; c++) dst[c] = (double)fa3c_load_f(t->data, dt, off + c) * mul;
}

static double dot(const double *a, const double *b, int d) {
    double s = 0;
    for (int c = 0; c < d; c++) s += a[c] * b[c];
    return s;
}

fa3c_status fa3c_cpu_fwd_reference(const fa3c_fwd_params *p) {
    const fa3c_problem P = prepared_fwd(p);
    const fa3c_problem *pr = &P;
    const int d = pr->headdim, dv = fa3c_headdim_v(pr), group = pr->heads_q / pr->heads_kv, skmax = max_seqlen_k(pr);
    const fa3c_dtype dt = pr->dtype, odt = fa3c_out_dtype(dt);
    const int64_t ntask = (int64_t)pr->batch * pr->heads_q;   /* can exceed INT_MAX */
    int oom = 0;

#pragma omp parallel
    {
        double *q = (double *)malloc(sizeof(double) * (d + 2 * dv));
        double *kk = (double *)malloc(sizeof(double) * (size_t)skmax * d);
        double *vv = (double *)malloc(sizeof(double) * (size_t)skmax * dv);
        double *s = (double *)malloc(sizeof(double) * (size_t)skmax);
        double *acc = q ? q + d : NULL, *qv = q ? q + d + dv : NULL;
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < ntask; t++) {
            if (!q || !kk || !vv || !s) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            const int b = (int)(t / pr->heads_q), h = (int)(t % pr->heads_q), hk = h / group;
            const int sq = fa3c_seqlen_q_of(pr, b), sk = fa3c_seqlen_k_of(pr, b);
            const double qd = descale_of(p->q_descale, pr, b, hk);
            const double kd = descale_of(p->k_descale, pr, b, hk);
            const double vd = descale_of(p->v_descale, pr, b, hk);
            for (int j = 0; j < sk; j++) {
                const int pos = fa3c_leftpad_k_of(pr, b) + j;   /* the key's row in its cache */
                load_row(kk + (int64_t)j * d, &p->k, dt, fa3c_k_offset(pr, &p->k, b, j, hk, 1), d,
                         kd * fa3c_block_descale(p, 1, b, hk, pos));
                load_row(vv + (int64_t)j * dv, &p->v, dt, fa3c_k_offset(pr, &p->v, b, j, hk, 1), dv,
                         vd * fa3c_block_descale(p, 2, b, hk, pos));
            }
            for (int i = 0; i < sq; i++) {
                int lo, hi;
                fa3c_key_range(pr, i, sq, sk, &lo, &hi);
                const int64_t oo = fa3c_q_offset(pr, &p->out, b, i, h);
                const double sink = fa3c_sink(pr, h);
                if (lo > hi) { /* fully masked: zeros, and -inf (or the sink: its softmax is the sink alone) */
                    for (int c = 0; c < dv; c++) fa3c_store_f(p->out.data, odt, oo + c, 0.0f);
                    if (p->lse) p->lse[fa3c_lse_index(pr, b, h, i)] = (float)sink;
                    continue;
                }
                load_row(q, &p->q, dt, fa3c_q_offset(pr, &p->q, b, i, h), d, qd * fa3c_block_descale(p, 0, b, h, i));
                if (p->qv.data) load_row(qv, &p->qv, dt, fa3c_q_offset(pr, &p->qv, b, i, h), dv, 1.0);
                double m = pr->sinks ? sink : -INFINITY;
                for (int j = lo; j <= hi; j++) {
                    const double x = dot(q, kk + (int64_t)j * d, d) + (p->qv.data ? dot(qv, vv + (int64_t)j * dv, dv) : 0);
                    s[j - lo] = fa3c_score(pr, x);
                    if (s[j - lo] > m) m = s[j - lo];
                }
                double sum = pr->sinks ? exp(sink - m) : 0;
                for (int c = 0; c < dv; c++) acc[c] = 0;
                for (int j = lo; j <= hi; j++) {
                    double e = exp(s[j - lo] - m);
                    sum += e;
                    const double *vr = vv + (int64_t)j * dv;
                    for (int c = 0; c < dv; c++) acc[c] += e * vr[c];
                }
                for (int c = 0; c < dv; c++) fa3c_store_f(p->out.data, odt, oo + c, (float)(acc[c] / sum));
                if (p->lse) p->lse[fa3c_lse_index(pr, b, h, i)] = (float)(m + log(sum));
            }
        }
        free(q);
        free(kk);
        free(vv);
        free(s);
    }
    if (oom) return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu reference forward: out of host memory");
    return FA3C_STATUS_OK;
}

/* ---- the same math in the input precision (see cpu.h) ------------------- */

fa3c_status fa3c_cpu_fwd_reference_lowp(const fa3c_fwd_params *p) {
    const fa3c_problem P = prepared_fwd(p);
    const fa3c_problem *pr = &P;
    const int d = pr->headdim, dv = fa3c_headdim_v(pr), group = pr->heads_q / pr->heads_kv, skmax = max_seqlen_k(pr);
    const fa3c_dtype dt = pr->dtype, rd = fa3c_out_dtype(dt); /* rd: the precision rounded to */
    const float scale = pr->softmax_scale, cap = pr->softcap;
    const int64_t ntask = (int64_t)pr->batch * pr->heads_q;   /* can exceed INT_MAX */
    int oom = 0;

#pragma omp parallel
    {
        float *q = (float *)malloc(sizeof(float) * (d + 2 * dv));
        float *kk = (float *)malloc(sizeof(float) * (size_t)skmax * d);
        float *vv = (float *)malloc(sizeof(float) * (size_t)skmax * dv);
        float *s = (float *)malloc(sizeof(float) * (size_t)skmax);
        float *acc = q ? q + d : NULL, *qv = q ? q + d + dv : NULL;
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < ntask; t++) {
            if (!q || !kk || !vv || !s) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            const int b = (int)(t / pr->heads_q), h = (int)(t % pr->heads_q), hk = h / group;
            const int sq = fa3c_seqlen_q_of(pr, b), sk = fa3c_seqlen_k_of(pr, b);
            const float qd = (float)descale_of(p->q_descale, pr, b, hk);
            const float kd = (float)descale_of(p->k_descale, pr, b, hk);
            const float vd = (float)descale_of(p->v_descale, pr, b, hk);
            for (int j = 0; j < sk; j++) {
                int64_t ko = fa3c_k_offset(pr, &p->k, b, j, hk, 1), vo = fa3c_k_offset(pr, &p->v, b, j, hk, 1);
                const int pos = fa3c_leftpad_k_of(pr, b) + j;   /* the key's row in its cache */
                const float kdj = kd * fa3c_block_descale(p, 1, b, hk, pos), vdj = vd * fa3c_block_descale(p, 2, b, hk, pos);
                for (int c = 0; c < d; c++) kk[(int64_t)j * d + c] = fa3c_round_to(rd, fa3c_load_f(p->k.data, dt, ko + c) * kdj);
                for (int c = 0; c < dv; c++) vv[(int64_t)j * dv + c] = fa3c_round_to(rd, fa3c_load_f(p->v.data, dt, vo + c) * vdj);
            }
            for (int i = 0; i < sq; i++) {
                int lo, hi;
                fa3c_key_range(pr, i, sq, sk, &lo, &hi);
                const int64_t oo = fa3c_q_offset(pr, &p->out, b, i, h);
                const float sink = fa3c_sink(pr, h);
                if (lo > hi) {
                    for (int c = 0; c < dv; c++) fa3c_store_f(p->out.data, rd, oo + c, 0.0f);
                    if (p->lse) p->lse[fa3c_lse_index(pr, b, h, i)] = sink;
                    continue;
                }
                const int64_t qo = fa3c_q_offset(pr, &p->q, b, i, h);
                const float qdi = qd * fa3c_block_descale(p, 0, b, h, i);
                for (int c = 0; c < d; c++)
                    q[c] = fa3c_round_to(rd, fa3c_round_to(rd, fa3c_load_f(p->q.data, dt, qo + c) * qdi) * scale);
                if (p->qv.data) {
                    const int64_t qvo = fa3c_q_offset(pr, &p->qv, b, i, h);
                    for (int c = 0; c < dv; c++) qv[c] = fa3c_round_to(rd, fa3c_load_f(p->qv.data, dt, qvo + c) * scale);
                }
                float m = pr->sinks ? sink : -INFINITY;
                for (int j = lo; j <= hi; j++) {
                    const float *kr = kk + (int64_t)j * d, *vr = vv + (int64_t)j * dv;
                    float x = 0;
                    for (int c = 0; c < d; c++) x += q[c] * kr[c];
                    for (int c = 0; p->qv.data && c < dv; c++) x += qv[c] * vr[c];
                    x = fa3c_round_to(rd, x);
                    if (cap > 0) x = fa3c_round_to(rd, fa3c_round_to(rd, tanhf(fa3c_round_to(rd, x / cap))) * cap);
                    s[j - lo] = x;
                    if (x > m) m = x;
                }
                float sum = pr->sinks ? expf(sink - m) : 0;
                for (int j = lo; j <= hi; j++) {
                    s[j - lo] = expf(s[j - lo] - m);
                    sum += s[j - lo];
                }
                for (int c = 0; c < dv; c++) acc[c] = 0;
                for (int j = lo; j <= hi; j++) {
                    const float pj = fa3c_round_to(rd, s[j - lo] / sum);
                    const float *vr = vv + (int64_t)j * dv;
                    for (int c = 0; c < dv; c++) acc[c] += pj * vr[c];
                }
                for (int c = 0; c < dv; c++) fa3c_store_f(p->out.data, rd, oo + c, acc[c]);
                if (p->lse) p->lse[fa3c_lse_index(pr, b, h, i)] = m + logf(sum);
            }
        }
        free(q);
        free(kk);
        free(vv);
        free(s);
    }
    if (oom) return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu lowp reference forward: out of host memory");
    return FA3C_STATUS_OK;
}

/* ---- backward ----------------------------------------------------------------
 * Per row i of head h:  s_j = score(q_i·k_j), p = softmax(s) (recomputed in
 * double, not read from lse), o_i = Σ p_j v_j, D_i = dO_i·o_i,
 * dS_ij = p_ij (dO_i·v_j − D_i), times 1 − (s_ij/cap)² under softcap (tanh'),
 * dq_i = scale Σ_j dS_ij k_j, dk_j += scale dS_ij q_i, dv_j += p_ij dO_i;
 * with sinks, p is softmax([s, sink]) and dsink_h = -Σ_i p_i,sink D_i.
 * One task per (batch, kv head) owns dk/dv of that head, summed over its GQA
 * group, and its heads' shares of dsinks (summed over the batch after). */
void fa3c_cpu_zero_unused_dq_rows(const fa3c_bwd_params *p) {
    const fa3c_problem *pr = &p->problem;
    if (!pr->seqused_q) return;
    for (int b = 0; b < pr->batch; b++)
        for (int i = fa3c_seqlen_q_of(pr, b); i < fa3c_stored_seqlen_q(pr, b); i++)
            for (int h = 0; h < pr->heads_q; h++) {
                const int64_t o = fa3c_q_offset(pr, &p->dq, b, i, h);
                for (int c = 0; c < pr->headdim; c++) fa3c_store_f(p->dq.data, pr->dtype, o + c, 0.0f);
            }
}

fa3c_status fa3c_cpu_bwd_reference(const fa3c_bwd_params *p) {
    fa3c_cpu_zero_unused_dq_rows(p);
    const fa3c_problem P = prepared(&p->problem);
    const fa3c_problem *pr = &P;
    const int d = pr->headdim, dv = fa3c_headdim_v(pr), group = pr->heads_q / pr->heads_kv;
    int skmax = max_seqlen_k(pr);
    for (int b = 0; b < pr->batch; b++)
        if (stored_seqlen_k(pr, b) > skmax) skmax = stored_seqlen_k(pr, b);
    const fa3c_dtype dt = pr->dtype;
    const double scale = pr->softmax_scale, cap = pr->softcap;
    const int64_t ntask = (int64_t)pr->batch * pr->heads_kv;
    int oom = 0;
    double *dsink = p->dsinks ? (double *)calloc((size_t)pr->batch * pr->heads_q, sizeof(double)) : NULL;
    if (p->dsinks && !dsink) return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu reference backward: out of host memory");

#pragma omp parallel
    {
        double *row = (double *)malloc(sizeof(double) * (2 * d + 2 * dv));
        double *kk = (double *)malloc(sizeof(double) * (size_t)skmax * d);
        double *vv = (double *)malloc(sizeof(double) * (size_t)skmax * dv);
        double *dk = (double *)malloc(sizeof(double) * (size_t)skmax * d);
        double *dvv = (double *)malloc(sizeof(double) * (size_t)skmax * dv);
        double *s = (double *)malloc(sizeof(double) * (size_t)skmax * 2);
#pragma omp for schedule(dynamic)
        for (int64_t t = 0; t < ntask; t++) {
            if (!row || !kk || !vv || !dk || !dvv || !s) {
#pragma omp atomic write
                oom = 1;
                continue;
            }
            double *q = row, *dq = row + d, *dov = row + 2 * d, *o = row + 2 * d + dv, *pp = s + skmax;
            const int b = (int)(t / pr->heads_kv), hk = (int)(t % pr->heads_kv);
            const int sq = fa3c_seqlen_q_of(pr, b), sk = fa3c_seqlen_k_of(pr, b), skst = stored_seqlen_k(pr, b);
            for (int j = 0; j < sk; j++) {
                load_row(kk + (int64_t)j * d, &p->k, dt, fa3c_k_offset(pr, &p->k, b, j, hk, 0), d, 1.0);
                load_row(vv + (int64_t)j * dv, &p->v, dt, fa3c_k_offset(pr, &p->v, b, j, hk, 0), dv, 1.0);
            }
            for (int64_t x = 0; x < (int64_t)skst * d; x++) dk[x] = 0;
            for (int64_t x = 0; x < (int64_t)skst * dv; x++) dvv[x] = 0;
            for (int h = hk * group; h < (hk + 1) * group; h++) {
                for (int i = 0; i < sq; i++) {
                    int lo, hi;
                    fa3c_key_range(pr, i, sq, sk, &lo, &hi);
                    const int64_t dqo = fa3c_q_offset(pr, &p->dq, b, i, h);
                    if (lo > hi) {
                        for (int c = 0; c < d; c++) fa3c_store_f(p->dq.data, dt, dqo + c, 0.0f);
                        continue;
                    }
                    load_row(q, &p->q, dt, fa3c_q_offset(pr, &p->q, b, i, h), d, 1.0);
                    load_row(dov, &p->dout, dt, fa3c_q_offset(pr, &p->dout, b, i, h), dv, 1.0);
                    const double sink = fa3c_sink(pr, h);
                    double m = pr->sinks ? sink : -INFINITY;
                    for (int j = lo; j <= hi; j++) {
                        s[j - lo] = fa3c_score(pr, dot(q, kk + (int64_t)j * d, d));
                        if (s[j - lo] > m) m = s[j - lo];
                    }
                    double sum = pr->sinks ? exp(sink - m) : 0;
                    for (int j = lo; j <= hi; j++) sum += (pp[j - lo] = exp(s[j - lo] - m));
                    for (int c = 0; c < d; c++) dq[c] = 0;
                    for (int c = 0; c < dv; c++) o[c] = 0;
                    for (int j = lo; j <= hi; j++) {
                        pp[j - lo] /= sum;
                        for (int c = 0; c < dv; c++) o[c] += pp[j - lo] * vv[(int64_t)j * dv + c];
                    }
                    const double D = dot(dov, o, dv);
                    if (dsink) dsink[(int64_t)b * pr->heads_q + h] -= exp(sink - m) / sum * D;
                    for (int j = lo; j <= hi; j++) {
                        const double pj = pp[j - lo];
                        double ds = pj * (dot(dov, vv + (int64_t)j * dv, dv) - D);
                        if (cap > 0) ds *= 1.0 - (s[j - lo] / cap) * (s[j - lo] / cap);
                        for (int c = 0; c < d; c++) {
                            dq[c] += ds * kk[(int64_t)j * d + c];
                            dk[(int64_t)j * d + c] += ds * q[c];
                        }
                        for (int c = 0; c < dv; c++) dvv[(int64_t)j * dv + c] += pj * dov[c];
                    }
                    for (int c = 0; c < d; c++) fa3c_store_f(p->dq.data, dt, dqo + c, (float)(dq[c] * scale));
                }
            }
            for (int j = 0; j < skst; j++) { /* keys past seqused_k get zero gradients */
                const int64_t ko = fa3c_k_offset(pr, &p->dk, b, j, hk, 0), vo = fa3c_k_offset(pr, &p->dv, b, j, hk, 0);
                for (int c = 0; c < d; c++) fa3c_store_f(p->dk.data, dt, ko + c, (float)(dk[(int64_t)j * d + c] * scale));
                for (int c = 0; c < dv; c++) fa3c_store_f(p->dv.data, dt, vo + c, (float)dvv[(int64_t)j * dv + c]);
            }
        }
        free(row);
        free(kk);
        free(vv);
        free(dk);
        free(dvv);
        free(s);
    }
    if (dsink && !oom)
        for (int h = 0; h < pr->heads_q; h++) {
            double sum = 0;
            for (int b = 0; b < pr->batch; b++) sum += dsink[(int64_t)b * pr->heads_q + h];
            p->dsinks[h] = (float)sum;
        }
    free(dsink);
    if (oom) return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "cpu reference backward: out of host memory");
    return FA3C_STATUS_OK;
}
