/* Randomized differential test (issue 35): thousands of small valid problems,
 * the flash-style CPU backend (FA3C_BACKEND_CPU) against the float64 reference
 * (FA3C_BACKEND_CPU_REFERENCE), both through the public API: forward out and
 * lse, backward dq, dk, dv. Random dtype (fp32/fp16/bf16), batch 1-3, seqlen_q
 * and seqlen_k 1-70 each, GQA ratios, headdim a multiple of 8 up to 128 (mostly
 * small), causal / windows / softcap / scale, varlen with empty sequences,
 * seqused_k, attention sinks (problem.sinks), padded and head-major layouts,
 * normal inputs with occasional large-logit outliers.
 *
 * Tolerances are those of test_cpu_fwd.c and test_cpu_bwd.c: forward max
 * error <= 2x the error of the same math done naively in the input precision
 * (fa3c_cpu_fwd_reference_lowp) + a dtype atol, the LSE likewise; backward
 * error <= rtol(dtype) x the gradient's largest magnitude + 1e-6. Random
 * problems also reach peaked softmaxes (outliers, large scales, few keys),
 * which those files' hand-picked problems avoid: there a score's float
 * rounding is amplified by exp, and in the backward dP - D cancels (like
 * FlashAttention, the flash backward takes D = rowsum(dO∘O) from the stored,
 * dtype-rounded out and P from the stored float lse, where the reference
 * recomputes both in float64), so the true gradient is tiny and the flash's
 * is rounding noise. Both rules therefore add, element by element, a
 * first-order worst-case bound of that inherited rounding (rounding_bounds):
 * small next to the forward's tolerance, about the base one for a typical
 * bf16/fp16 gradient, dominant only where the problem is that ill-conditioned
 * (measured: one element off by 3% of the largest value, 1e-4 of it in fp32,
 * fails over 90% of the problems, in out or a gradient; most of the rest have
 * nothing but zeros). What the mask decides compares exactly: a fully
 * masked row has out = 0 and lse = -inf (and dq = 0) in both backends, and a
 * key no row sees (or past seqused_k) gets dk = dv = 0.
 *
 * FA3C_DIFF_CASES: problems per case (default 1200); FA3C_SEED replays a run and
 * FA3C_DIFF_ONLY=<i> one problem of it (as printed on a mismatch). */
#include <math.h>
#include <stdint.h>
#include "harness.h"
#include "testutil.h"
#include "backend.h"
#include "cpu/cpu.h"

enum { MAXB = 3, MAX_FAILING = 5, WORK_CAP = 60000 };

typedef struct {
    fa3c_dtype dt;
    int b, sq, sk, hq, hkv, d; /* sq, sk: the declared maxima */
    int causal, wl, wr;
    float softcap, scale;     /* scale 0: the default 1/sqrt(d) */
    int varq, vark, seqused;
    int lq[MAXB], lk[MAXB], used[MAXB];
    float outlier;            /* > 0: about 1% of q and k multiplied by this */
    int layout_seed;          /* picks each tensor's layout */
    int deterministic;
    int sinks;                /* 1: problem.sinks = sink (one logit per query head, some -inf) */
    float sink[8];
} dcase;

static void describe(const dcase *c, FILE *f) {
    fprintf(f, "  problem: %s batch %d seqlen_q %d seqlen_k %d heads_q %d heads_kv %d headdim %d\n", tu_dtype_name(c->dt),
            c->b, c->sq, c->sk, c->hq, c->hkv, c->d);
    fprintf(f, "    causal %d window (%d, %d) softcap %.9g softmax_scale %.9g outlier %g deterministic %d layouts %d\n",
            c->causal, c->wl, c->wr, (double)c->softcap, (double)c->scale, (double)c->outlier, c->deterministic,
            c->layout_seed);
    if (c->sinks) {
        fprintf(f, "    sinks");
        for (int h = 0; h < c->hq; h++) fprintf(f, " %.9g", (double)c->sink[h]);
        fprintf(f, "\n");
    }
    fprintf(f, "    lengths q {");
    for (int i = 0; i < c->b; i++) fprintf(f, "%s%d", i ? ", " : "", c->varq ? c->lq[i] : c->sq);
    fprintf(f, "}%s k {", c->varq ? " (cu_seqlens_q)" : "");
    for (int i = 0; i < c->b; i++) fprintf(f, "%s%d", i ? ", " : "", c->vark ? c->lk[i] : c->sk);
    fprintf(f, "}%s", c->vark ? " (cu_seqlens_k)" : "");
    if (c->seqused) {
        fprintf(f, " seqused_k {");
        for (int i = 0; i < c->b; i++) fprintf(f, "%s%d", i ? ", " : "", c->used[i]);
        fprintf(f, "}");
    }
    fprintf(f, "\n");
}

/* ---- random problems -------------------------------------------------------- */

enum { FLAVOR_DENSE, FLAVOR_MASKS, FLAVOR_VARLEN };

/* 1..70, half of the time 1..16 (short sequences hit more block edges per flop). */
static int rand_len(void) { return tu_rand_int(0, 1) ? tu_rand_int(1, 16) : tu_rand_int(1, 70); }

static int rand_headdim(void) {
    const int u = tu_rand_int(0, 99);
    if (u < 50) return 8 * tu_rand_int(1, 2);
    if (u < 80) return 8 * tu_rand_int(3, 6);
    if (u < 95) return 8 * tu_rand_int(7, 12);
    return 8 * tu_rand_int(13, 16);
}

static void gen(dcase *c, int flavor) {
    memset(c, 0, sizeof *c);
    const fa3c_dtype dts[3] = {FA3C_DTYPE_FP32, FA3C_DTYPE_FP16, FA3C_DTYPE_BF16};
    const int ratios[4] = {1, 2, 3, 4};
    c->dt = dts[tu_rand_int(0, 2)];
    /* Shapes are redrawn above a work cap: every range stays reachable (70 x 70 at small
     * headdims, headdim 128 on short sequences), but the product's tail, which would
     * dominate the time under ASan, is cut. */
    do {
        c->b = tu_rand_int(1, MAXB);
        c->sq = rand_len();
        c->sk = rand_len();
        c->hkv = tu_rand_int(1, 2);
        c->hq = c->hkv * ratios[tu_rand_int(0, 3)];
        c->d = rand_headdim();
    } while ((int64_t)c->b * c->hq * c->sq * c->sk * c->d > WORK_CAP);
    c->wl = c->wr = -1;
    if (flavor == FLAVOR_MASKS || (flavor == FLAVOR_VARLEN && tu_rand_int(0, 1))) {
        switch (tu_rand_int(0, 3)) {
        case 0: c->causal = 1; break;
        case 1: c->wl = tu_rand_int(-1, 40), c->wr = tu_rand_int(-1, 40); break;
        case 2: c->causal = 1, c->wl = tu_rand_int(0, 30); break;
        default: c->wl = tu_rand_int(0, 8), c->wr = tu_rand_int(0, 8); break; /* narrow: rows with sq > sk empty */
        }
    }
    if (tu_rand_int(0, 4) == 0) c->softcap = (float)(0.5 + 30 * tu_uniform() * tu_uniform());
    if (tu_rand_int(0, 3) == 0) c->scale = (float)(0.05 + 1.45 * tu_uniform());
    if (tu_rand_int(0, 4) == 0) c->outlier = (float)(8 + 12 * tu_uniform());
    if (flavor == FLAVOR_VARLEN) {
        c->varq = tu_rand_int(0, 3) != 0;
        c->vark = tu_rand_int(0, 3) != 0;
        c->seqused = tu_rand_int(0, 2) == 0;
        int mq = 0, mk = 0;
        for (int i = 0; i < c->b; i++) { /* empty sequences (either side) included */
            c->lq[i] = tu_rand_int(0, 5) == 0 ? 0 : tu_rand_int(1, c->sq);
            c->lk[i] = tu_rand_int(0, 5) == 0 ? 0 : tu_rand_int(1, c->sk);
            mq = c->lq[i] > mq ? c->lq[i] : mq;
            mk = c->lk[i] > mk ? c->lk[i] : mk;
        }
        if (c->varq && mq > 0 && tu_rand_int(0, 1)) c->sq = mq; /* the declared maximum is reached, or not */
        if (c->vark && mk > 0 && tu_rand_int(0, 1)) c->sk = mk;
        for (int i = 0; i < c->b; i++) c->used[i] = tu_rand_int(0, 5) == 0 ? 0 : tu_rand_int(0, c->sk);
    }
    c->layout_seed = tu_rand_int(0, 1 << 20);
    c->deterministic = tu_rand_int(0, 1);
    if (tu_rand_int(0, 3) == 0) {   /* drawn last: the other fields' draws stay as they were */
        c->sinks = 1;
        for (int h = 0; h < c->hq; h++) c->sink[h] = tu_rand_int(0, 5) == 0 ? -INFINITY : (float)(3 * tu_normal());
    }
}

/* ---- buffers ------------------------------------------------------------------- */

/* Strides of an (nb, ns, nh, d) view: contiguous, padded or head-major. */
static void layout(fa3c_tensor *t, int64_t ns, int64_t nh, int64_t d, uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull); /* own stream: the data draws do not depend on it */
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    const int kind = (int)((z >> 40) % 10), pad = (int)((z >> 20) % 4);
    int64_t *s = t->stride;
    if (ns == 0) ns = 1;
    s[3] = 1;
    if (kind < 7) {
        s[2] = d, s[1] = nh * d, s[0] = ns * nh * d;
    } else if (kind < 9) {
        s[2] = d + 8 * (pad & 1);
        s[1] = nh * s[2] + pad;
        s[0] = ns * s[1] + 3;
    } else {
        s[1] = d, s[2] = ns * d, s[0] = nh * ns * d;
    }
}

static size_t tensor_bytes(const fa3c_tensor *t, int64_t nb, int64_t ns, int64_t nh, int64_t d, int es) {
    if (nb == 0 || ns == 0 || nh == 0) return (size_t)es;
    return (size_t)(((nb - 1) * t->stride[0] + (ns - 1) * t->stride[1] + (nh - 1) * t->stride[2] + d) * es);
}

typedef struct {
    dcase c;
    fa3c_problem pr;
    int32_t cuq[MAXB + 1], cuk[MAXB + 1], used[MAXB];
    int64_t nbq, nsq, nbk, nsk;       /* (batch, rows) of the q-like and k-like views */
    int64_t nq, nk, nlse;             /* elements of q-like and k-like tensors (gathered), lse entries */
    fa3c_tensor q, k, v, dout, out, dq, dk, dv; /* out / dq / dk / dv: layouts only (data per run) */
    size_t qb, kb, ob, dqb, dkb, dvb; /* bytes of each buffer */
} dsetup;

static void fill(void *buf, fa3c_dtype dt, int64_t n, float outlier) {
    for (int64_t i = 0; i < n; i++) {
        double x = tu_normal();
        if (outlier > 0 && tu_uniform() < 0.01) x *= outlier;
        tu_store(buf, dt, i, (float)x);
    }
}

static void build(dsetup *s, const dcase *c) {
    memset(s, 0, sizeof *s);
    s->c = *c;
    fa3c_fwd_params tmp;
    fa3c_fwd_params_init(&tmp);
    s->pr = tmp.problem;
    tu_problem_shape(&s->pr, c->dt, c->b, c->sq, c->sk, c->hq, c->hkv, c->d);
    s->pr.causal = c->causal;
    s->pr.window_left = c->wl;
    s->pr.window_right = c->wr;
    s->pr.softcap = c->softcap;
    s->pr.softmax_scale = c->scale;
    const int es = (int)tu_dtype_size(c->dt);
    int lq[MAXB], lk[MAXB];
    for (int i = 0; i < c->b; i++) lq[i] = c->varq ? c->lq[i] : c->sq, lk[i] = c->vark ? c->lk[i] : c->sk;
    tu_prefix_sums(lq, c->b, s->cuq);
    tu_prefix_sums(lk, c->b, s->cuk);
    memcpy(s->used, c->used, sizeof s->used);
    if (c->varq) s->pr.cu_seqlens_q = s->cuq;
    if (c->vark) s->pr.cu_seqlens_k = s->cuk;
    if (c->seqused) s->pr.seqused_k = s->used;
    if (c->sinks) s->pr.sinks = s->c.sink;
    s->nbq = c->varq ? 1 : c->b, s->nsq = c->varq ? s->cuq[c->b] : c->sq;
    s->nbk = c->vark ? 1 : c->b, s->nsk = c->vark ? s->cuk[c->b] : c->sk;
    s->nq = s->nbq * s->nsq * c->hq * c->d;
    s->nk = s->nbk * s->nsk * c->hkv * c->d;
    s->nlse = s->nbq * s->nsq * c->hq;
    uint64_t ls = (uint64_t)c->layout_seed;
    fa3c_tensor *qlike[4] = {&s->q, &s->dout, &s->out, &s->dq}, *klike[4] = {&s->k, &s->v, &s->dk, &s->dv};
    for (int i = 0; i < 4; i++) layout(qlike[i], s->nsq, c->hq, c->d, &ls);
    for (int i = 0; i < 4; i++) layout(klike[i], s->nsk, c->hkv, c->d, &ls);
    s->qb = tensor_bytes(&s->q, s->nbq, s->nsq, c->hq, c->d, es);
    s->ob = tensor_bytes(&s->out, s->nbq, s->nsq, c->hq, c->d, es);
    s->dqb = tensor_bytes(&s->dq, s->nbq, s->nsq, c->hq, c->d, es);
    s->kb = tensor_bytes(&s->k, s->nbk, s->nsk, c->hkv, c->d, es);
    s->dkb = tensor_bytes(&s->dk, s->nbk, s->nsk, c->hkv, c->d, es);
    s->dvb = tensor_bytes(&s->dv, s->nbk, s->nsk, c->hkv, c->d, es);
    const size_t vb = tensor_bytes(&s->v, s->nbk, s->nsk, c->hkv, c->d, es),
                 db = tensor_bytes(&s->dout, s->nbq, s->nsq, c->hq, c->d, es);
    s->q.data = tu_alloc(s->qb);
    s->k.data = tu_alloc(s->kb);
    s->v.data = tu_alloc(vb);
    s->dout.data = tu_alloc(db);
    fill(s->q.data, c->dt, (int64_t)(s->qb / es), c->outlier);
    fill(s->k.data, c->dt, (int64_t)(s->kb / es), c->outlier);
    fill(s->v.data, c->dt, (int64_t)(vb / es), 0);
    fill(s->dout.data, c->dt, (int64_t)(db / es), 0);
}

static void release(dsetup *s) {
    free(s->q.data);
    free(s->k.data);
    free(s->v.data);
    free(s->dout.data);
}

/* ---- the mask, from the contract (docs/API.md), independent of the library ---- */

static int len_q(const dsetup *s, int b) { return s->c.varq ? s->cuq[b + 1] - s->cuq[b] : s->c.sq; }
static int stored_k(const dsetup *s, int b) { return s->c.vark ? s->cuk[b + 1] - s->cuk[b] : s->c.sk; }
static int len_k(const dsetup *s, int b) {
    const int n = stored_k(s, b);
    return s->c.seqused && s->used[b] < n ? s->used[b] : n;
}

/* Keys [lo, hi] row i of a (sq, sk) sequence sees; empty when lo > hi. */
static void key_range(const dcase *c, int i, int sq, int sk, int *lo, int *hi) {
    const long diag = (long)i + sk - sq, right = c->causal ? 0 : c->wr;
    long l = 0, h = sk - 1;
    if (c->wl >= 0 && diag - c->wl > l) l = diag - c->wl;
    if (right >= 0 && diag + right < h) h = diag + right;
    *lo = (int)l;
    *hi = (int)(h < l - 1 ? l - 1 : h);
}

/* Gathered (contiguous) index of row i of sequence b, head h, in a q-like / k-like tensor. */
static int64_t qrow(const dsetup *s, int b, int i, int h) {
    return ((s->c.varq ? s->cuq[b] + i : (int64_t)b * s->c.sq + i) * s->c.hq + h) * s->c.d;
}
static int64_t krow(const dsetup *s, int b, int j, int h) {
    return ((s->c.vark ? s->cuk[b] + j : (int64_t)b * s->c.sk + j) * s->c.hkv + h) * s->c.d;
}
static int64_t lse_at(const dsetup *s, int b, int h, int i) {
    return s->c.varq ? (int64_t)h * s->cuq[s->c.b] + s->cuq[b] + i : ((int64_t)b * s->c.hq + h) * s->c.sq + i;
}

/* ---- runs ------------------------------------------------------------------------ */

static fa3c_fwd_params fwd_params(const dsetup *s, void *out, float *lse, fa3c_backend be) {
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    p.problem = s->pr;
    p.q = s->q, p.k = s->k, p.v = s->v, p.out = s->out;
    p.out.data = out;
    p.lse = lse;
    p.backend = be;
    return p;
}

/* A forward into fresh poisoned buffers; out gathered to floats. be < 0: the input-precision reference. */
static fa3c_status run_fwd(const dsetup *s, int be, float *outf, float *lse, void *out_keep) {
    void *o = out_keep ? out_keep : tu_alloc(s->ob);
    tu_poison(o, s->ob);
    tu_poison(lse, sizeof(float) * (size_t)(s->nlse + 1));
    fa3c_fwd_params p = fwd_params(s, o, lse, be < 0 ? FA3C_BACKEND_CPU : (fa3c_backend)be);
    const fa3c_status st = be < 0 ? fa3c_cpu_fwd_reference_lowp(&p) : fa3c_fwd(&p, NULL);
    fa3c_tensor t = s->out;
    t.data = o;
    tu_gather(outf, &t, s->c.dt, s->nbq, s->nsq, s->c.hq, s->c.d);
    if (!out_keep) free(o);
    return st;
}

/* A backward (out, lse: the reference forward's) into fresh poisoned buffers; g = dq | dk | dv gathered. */
static fa3c_status run_bwd(const dsetup *s, fa3c_backend be, void *out, const float *lse, float *g) {
    fa3c_bwd_params p;
    fa3c_bwd_params_init(&p);
    p.problem = s->pr;
    p.q = s->q, p.k = s->k, p.v = s->v, p.dout = s->dout, p.out = s->out, p.dq = s->dq, p.dk = s->dk, p.dv = s->dv;
    p.out.data = out;
    p.lse = lse;
    p.dq.data = tu_alloc(s->dqb);
    p.dk.data = tu_alloc(s->dkb);
    p.dv.data = tu_alloc(s->dvb);
    tu_poison(p.dq.data, s->dqb);
    tu_poison(p.dk.data, s->dkb);
    tu_poison(p.dv.data, s->dvb);
    p.deterministic = s->c.deterministic;
    p.backend = be;
    const fa3c_status st = fa3c_bwd(&p, NULL);
    tu_gather(g, &p.dq, s->c.dt, s->nbq, s->nsq, s->c.hq, s->c.d);
    tu_gather(g + s->nq, &p.dk, s->c.dt, s->nbk, s->nsk, s->c.hkv, s->c.d);
    tu_gather(g + s->nq + s->nk, &p.dv, s->c.dt, s->nbk, s->nsk, s->c.hkv, s->c.d);
    free(p.dq.data);
    free(p.dk.data);
    free(p.dv.data);
    return st;
}

/* ---- the inherited rounding ------------------------------------------------------------ */

/* Gathered float copies of the inputs the bound needs. */
typedef struct { float *q, *k, *v, *dout; } dinputs;

static void gather_inputs(const dsetup *s, dinputs *in) {
    const dcase *c = &s->c;
    in->q = (float *)tu_alloc(sizeof(float) * (size_t)(s->nq + 1));
    in->dout = (float *)tu_alloc(sizeof(float) * (size_t)(s->nq + 1));
    in->k = (float *)tu_alloc(sizeof(float) * (size_t)(s->nk + 1));
    in->v = (float *)tu_alloc(sizeof(float) * (size_t)(s->nk + 1));
    tu_gather(in->q, &s->q, c->dt, s->nbq, s->nsq, c->hq, c->d);
    tu_gather(in->dout, &s->dout, c->dt, s->nbq, s->nsq, c->hq, c->d);
    tu_gather(in->k, &s->k, c->dt, s->nbk, s->nsk, c->hkv, c->d);
    tu_gather(in->v, &s->v, c->dt, s->nbk, s->nsk, c->hkv, c->d);
}

static void free_inputs(dinputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->dout);
}

/* First-order, worst-case bounds of how far the flash backend may be from the
 * exact result because it computes in float and (backward) takes out and lse
 * from the forward; u is the unit roundoff of the dtype, e = 2^-24 that of float.
 *   s_ij = q_i·k_j scale in float (+ softcap, exp): the weight exp(s_ij - m_i)
 *     has relative error <= rho_ij = (d+2)e scale sum|q_i∘k_j| + e(|s_ij| + |lse_i| + 8)
 *     (+ 4e cap with softcap); the backward's P_ij = exp(s_ij - lse_i) from
 *     the float lse likewise.
 * Forward, dout (gathered like out): out_i = sum_j P_ij v_j moves by at most
 *   sum_j P_ij rho_ij |v_j - out_i| (the normalisation), + (n+3)e sum_j P_ij |v_j|.
 * Backward, dgrad (gathered like dq | dk | dv):
 *   D_i = dO_i·O_i from O rounded to the dtype:  |dD_i| <= (u + (d+2)e) sum|dO_i∘O_i|
 *   dP_ij = dO_i·v_j in float:                      (d+2)e sum|dO_i∘v_j|
 *   dS_ij = P_ij (dP_ij - D_i) f_ij (f the softcap's tanh', error <= 2 ds/cap)
 *   propagated through dq = scale sum_j dS k_j, dk = scale sum_i dS q_i,
 *   dv = sum_i P dO_i, plus n e of each sum of n terms (float accumulation).
 * P, dP and D here are exact (float64, from the inputs); out_i is the reference's. */
static void rounding_bounds(const dsetup *s, const dinputs *in, const float *outf, double *dout, double *delta) {
    const dcase *c = &s->c;
    const int d = c->d, group = c->hq / c->hkv;
    const double e = ldexp(1.0, -24), u = c->dt == FA3C_DTYPE_FP32 ? e : c->dt == FA3C_DTYPE_FP16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
    const double scale = c->scale != 0 ? (double)c->scale : (double)(float)(1.0 / sqrt((double)d)), cap = c->softcap;
    const int64_t nq = s->nq, nk = s->nk;
    double S[128], dP[128], sabs[128], vabs[128]; /* per visible key of a row (at most 70) */
    for (int64_t x = 0; x < nq + 2 * nk; x++) delta[x] = 0;
    for (int64_t x = 0; x < nq; x++) dout[x] = 0;
    for (int b = 0; b < c->b; b++) {
        const int sq = len_q(s, b), sk = len_k(s, b);
        const double gk = (double)(sq * group + 2) * e; /* dk, dv sum over every row of the group */
        for (int h = 0; h < c->hq; h++) {
            const int hk = h / group;
            for (int i = 0; i < sq; i++) {
                int lo, hi;
                key_range(c, i, sq, sk, &lo, &hi);
                if (lo > hi) continue;
                const float *q = in->q + qrow(s, b, i, h), *dO = in->dout + qrow(s, b, i, h), *O = outf + qrow(s, b, i, h);
                double m = -INFINITY, sum = 0, D = 0, od = 0;
                for (int j = lo; j <= hi; j++) {
                    const float *kj = in->k + krow(s, b, j, hk), *vj = in->v + krow(s, b, j, hk);
                    double qk = 0, qka = 0, dv = 0, dva = 0;
                    for (int x = 0; x < d; x++) {
                        qk += (double)q[x] * kj[x], qka += fabs((double)q[x] * kj[x]);
                        dv += (double)dO[x] * vj[x], dva += fabs((double)dO[x] * vj[x]);
                    }
                    double sj = qk * scale;
                    if (cap > 0) sj = cap * tanh(sj / cap);
                    S[j - lo] = sj, dP[j - lo] = dv, sabs[j - lo] = qka * scale, vabs[j - lo] = dva;
                    if (sj > m) m = sj;
                }
                const double sink = c->sinks ? (double)c->sink[h] : -INFINITY;   /* in the softmax, no value row */
                if (sink > m) m = sink;
                if (c->sinks) sum += exp(sink - m);
                for (int j = lo; j <= hi; j++) sum += exp(S[j - lo] - m);
                const double lse = m + log(sum);
                for (int x = 0; x < d; x++) od += fabs((double)dO[x] * O[x]);
                for (int j = lo; j <= hi; j++) D += exp(S[j - lo] - lse) * dP[j - lo];
                const double dD = (u + (d + 2) * e) * od, gq = (double)(hi - lo + 3) * e;
                double *bq = delta + qrow(s, b, i, h), *bo = dout + qrow(s, b, i, h);
                for (int j = lo; j <= hi; j++) {
                    const double sj = S[j - lo], p = exp(sj - lse), g = dP[j - lo] - D;
                    const double ds_abs = (d + 2) * e * sabs[j - lo] + e * fabs(sj) + (cap > 0 ? 4 * e * cap : 0);
                    const double rho = ds_abs + e * (fabs(lse) + 8);
                    const double f = cap > 0 ? 1 - (sj / cap) * (sj / cap) : 1;
                    const double dS = fabs(p * g * f);
                    double ddS = p * (rho * fabs(g) + dD + (d + 2) * e * vabs[j - lo]) * fabs(f);
                    if (cap > 0) ddS += p * fabs(g) * 2 * ds_abs / cap;
                    const float *kj = in->k + krow(s, b, j, hk), *vj = in->v + krow(s, b, j, hk);
                    double *bk = delta + nq + krow(s, b, j, hk), *bv = delta + nq + nk + krow(s, b, j, hk);
                    for (int x = 0; x < d; x++) {
                        bo[x] += p * (rho * fabs((double)vj[x] - O[x]) + gq * fabs(vj[x]));
                        bq[x] += scale * (ddS + gq * dS) * fabs(kj[x]);
                        bk[x] += scale * (ddS + gk * dS) * fabs(q[x]);
                        bv[x] += p * (rho + gk) * fabs(dO[x]);
                    }
                }
            }
        }
    }
}

/* ---- tolerances (test_cpu_fwd.c, test_cpu_bwd.c) ------------------------------------ */

static double fwd_atol(fa3c_dtype dt) { return dt == FA3C_DTYPE_FP32 ? 2e-6 : dt == FA3C_DTYPE_FP16 ? 5e-4 : 4e-3; }
static double bwd_rtol(fa3c_dtype dt) { return dt == FA3C_DTYPE_FP32 ? 5e-6 : dt == FA3C_DTYPE_FP16 ? 2e-3 : 1.2e-2; }

/* Worst error / tolerance per dtype and quantity, for the summary line (1 = at the bound). */
typedef struct {
    double worst[3][5]; /* [fp32, fp16, bf16][out, lse, dq, dk, dv] */
    long cases, masked_rows, dead_keys, failing;
} dstats;

static int dt_index(fa3c_dtype dt) { return dt == FA3C_DTYPE_FP32 ? 0 : dt == FA3C_DTYPE_FP16 ? 1 : 2; }

static void note(dstats *st, fa3c_dtype dt, int what, double err, double tol) {
    const double r = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0);
    if (!(r <= st->worst[dt_index(dt)][what])) st->worst[dt_index(dt)][what] = r;
}

/* ---- one problem ---------------------------------------------------------------------- */

static void check_case(const dcase *c, dstats *st) {
    dsetup s;
    build(&s, c);
    const dcase *C = &s.c;
    const int64_t nq = s.nq, nk = s.nk, nl = s.nlse;
    float *ref = (float *)tu_alloc(sizeof(float) * (size_t)(nq + 1)), *low = (float *)tu_alloc(sizeof(float) * (size_t)(nq + 1)),
          *fl = (float *)tu_alloc(sizeof(float) * (size_t)(nq + 1));
    float *lref = (float *)tu_alloc(sizeof(float) * (size_t)(nl + 1)), *llow = (float *)tu_alloc(sizeof(float) * (size_t)(nl + 1)),
          *lfl = (float *)tu_alloc(sizeof(float) * (size_t)(nl + 1));
    void *ref_out = tu_alloc(s.ob); /* the backward's out */

    /* Forward: reference, input-precision reference, flash. */
    const fa3c_status s1 = run_fwd(&s, FA3C_BACKEND_CPU_REFERENCE, ref, lref, ref_out);
    const fa3c_status s2 = run_fwd(&s, -1, low, llow, NULL);
    const fa3c_status s3 = run_fwd(&s, FA3C_BACKEND_CPU, fl, lfl, NULL);
    CHECK(s1 == FA3C_STATUS_OK && s2 == FA3C_STATUS_OK && s3 == FA3C_STATUS_OK, "forward status %d %d %d (%s)", s1, s2, s3,
          fa3c_last_error());
    dinputs in;
    gather_inputs(&s, &in);
    const int64_t ng = nq + 2 * nk;
    double *dout = (double *)tu_alloc(sizeof(double) * (size_t)(nq + 1)), *delta = (double *)tu_alloc(sizeof(double) * (size_t)(ng + 1));
    rounding_bounds(&s, &in, ref, dout, delta);
    const double e_fl = tu_max_abs_err(fl, ref, nq), e_low = tu_max_abs_err(low, ref, nq);
    const double l_fl = tu_max_abs_err(lfl, lref, nl), l_low = tu_max_abs_err(llow, lref, nl);
    double lmax = 0;
    for (int64_t i = 0; i < nl; i++)
        if (isfinite(lref[i]) && fabs(lref[i]) > lmax) lmax = fabs(lref[i]);
    const double tol_o = 2 * e_low + fwd_atol(C->dt), tol_l = 2 * l_low + (1e-5 * lmax > 1e-4 ? 1e-5 * lmax : 1e-4);
    double worst_o = 0;
    int64_t at_o = 0;
    for (int64_t i = 0; i < nq; i++) { /* element by element: <= 2 x lowp err + atol + the inherited rounding's bound */
        const double r = fabs((double)fl[i] - ref[i]) / (tol_o + dout[i]);
        if (!(r <= worst_o)) worst_o = isnan(r) ? INFINITY : r, at_o = i;
    }
    note(st, C->dt, 0, worst_o, 1);
    note(st, C->dt, 1, l_fl, tol_l);
    CHECK(worst_o <= 1, "out[%lld]: err %.3g > 2 x lowp err %.3g + %.1g + inherited rounding %.3g (max err %.3g)",
          (long long)at_o, fabs((double)fl[at_o] - ref[at_o]), e_low, fwd_atol(C->dt), dout[at_o], e_fl);
    CHECK(l_fl <= tol_l, "lse: max err %.3g > %.3g (lowp %.3g)", l_fl, tol_l, l_low);

    /* Fully masked rows: exactly out = 0 and lse = -inf in both backends (and only there). */
    int64_t bad_masked = 0, bad_live = 0;
    for (int b = 0; b < C->b; b++) {
        const int sq = len_q(&s, b), sk = len_k(&s, b);
        for (int i = 0; i < sq; i++) {
            int lo, hi;
            key_range(C, i, sq, sk, &lo, &hi);
            for (int h = 0; h < C->hq; h++) {
                const int64_t o = qrow(&s, b, i, h), l = lse_at(&s, b, h, i);
                if (lo > hi) {   /* lse -inf, or the sink: its softmax is the sink alone */
                    st->masked_rows++;
                    const float want = C->sinks ? C->sink[h] : -INFINITY;
                    int ok = lfl[l] == want && lref[l] == want;
                    for (int x = 0; x < C->d; x++) ok &= fl[o + x] == 0.0f && ref[o + x] == 0.0f;
                    bad_masked += !ok;
                } else {
                    bad_live += !isfinite(lfl[l]) || !isfinite(lref[l]);
                }
            }
        }
    }
    CHECK(bad_masked == 0, "%lld fully masked rows are not exactly (out 0, lse -inf or the sink)", (long long)bad_masked);
    CHECK(bad_live == 0, "%lld rows that see keys have a non-finite lse", (long long)bad_live);

    /* Backward, from the reference forward's out and lse. */
    float *gr = (float *)tu_alloc(sizeof(float) * (size_t)(ng + 1)), *gf = (float *)tu_alloc(sizeof(float) * (size_t)(ng + 1));
    const fa3c_status b1 = run_bwd(&s, FA3C_BACKEND_CPU_REFERENCE, ref_out, lref, gr);
    const fa3c_status b2 = run_bwd(&s, FA3C_BACKEND_CPU, ref_out, lref, gf);
    CHECK(b1 == FA3C_STATUS_OK && b2 == FA3C_STATUS_OK, "backward status %d %d (%s)", b1, b2, fa3c_last_error());
    const char *names[3] = {"dq", "dk", "dv"};
    const int64_t cnt[3] = {nq, nk, nk}, off[3] = {0, nq, nq + nk};
    for (int t = 0; t < 3; t++) {
        double mx = 0;
        for (int64_t i = 0; i < cnt[t]; i++)
            if (fabs(gr[off[t] + i]) > mx) mx = fabs(gr[off[t] + i]);
        /* element by element: |flash - ref| <= rtol x max|ref| + 1e-6 + the inherited rounding's bound */
        const double base = bwd_rtol(C->dt) * mx + 1e-6;
        double worst = 0;
        int64_t at = 0;
        for (int64_t i = 0; i < cnt[t]; i++) {
            const double err = fabs((double)gf[off[t] + i] - gr[off[t] + i]), r = err / (base + delta[off[t] + i]);
            if (!(r <= worst)) worst = isnan(r) ? INFINITY : r, at = i;
        }
        note(st, C->dt, 2 + t, worst, 1);
        CHECK(worst <= 1, "%s[%lld]: err %.3g > %.2g x max|ref| %.3g + 1e-6 + inherited rounding %.3g (max err %.3g, rel l2 %.3g)",
              names[t], (long long)at, fabs((double)gf[off[t] + at] - gr[off[t] + at]), bwd_rtol(C->dt), mx,
              delta[off[t] + at], tu_max_abs_err(gf + off[t], gr + off[t], cnt[t]), tu_rel_l2_err(gf + off[t], gr + off[t], cnt[t]));
    }
    free(dout);
    free(delta);
    free_inputs(&in);
    /* Exact zeros: dq of fully masked rows; dk, dv of keys no row sees (or past seqused_k). */
    int64_t bad_dq = 0, bad_dkv = 0;
    for (int b = 0; b < C->b; b++) {
        const int sq = len_q(&s, b), sk = len_k(&s, b), skst = stored_k(&s, b);
        char seen[128];
        memset(seen, 0, sizeof seen);
        for (int i = 0; i < sq; i++) {
            int lo, hi;
            key_range(C, i, sq, sk, &lo, &hi);
            for (int j = lo; j <= hi; j++) seen[j] = 1;
            if (lo <= hi) continue;
            for (int h = 0; h < C->hq; h++)
                for (int x = 0; x < C->d; x++) bad_dq += gf[qrow(&s, b, i, h) + x] != 0.0f || gr[qrow(&s, b, i, h) + x] != 0.0f;
        }
        for (int j = 0; j < skst; j++) {
            if (j < sk && seen[j]) continue;
            st->dead_keys++;
            for (int h = 0; h < C->hkv; h++)
                for (int x = 0; x < C->d; x++) {
                    const int64_t k = krow(&s, b, j, h) + x;
                    bad_dkv += gf[nq + k] != 0.0f || gf[nq + nk + k] != 0.0f || gr[nq + k] != 0.0f || gr[nq + nk + k] != 0.0f;
                }
        }
    }
    CHECK(bad_dq == 0, "%lld dq elements of fully masked rows are not exactly 0", (long long)bad_dq);
    CHECK(bad_dkv == 0, "%lld dk/dv elements of keys no row sees are not exactly 0", (long long)bad_dkv);
    if (getenv("FA3C_VERBOSE"))
        printf("  %s b%d %dx%d h%d/%d d%d: out %.3g (lowp %.3g) lse %.3g\n", tu_dtype_name(C->dt), C->b, C->sq, C->sk, C->hq,
               C->hkv, C->d, e_fl, e_low, l_fl);
    free(ref); free(low); free(fl); free(lref); free(llow); free(lfl); free(ref_out); free(gr); free(gf);
    release(&s);
}

/* ---- the cases ------------------------------------------------------------------------------- */

static void differential(const char *name, uint64_t salt, int flavor) {
    static uint64_t seed;
    static int seeded;
    if (!seeded) seed = tu_seed_init(), seeded = 1; /* the seed itself, not the stream's later state */
    const long only = tu_env_long("FA3C_DIFF_ONLY", -1), n = only >= 0 ? only + 1 : tu_env_long("FA3C_DIFF_CASES", 1200);
    dstats st;
    memset(&st, 0, sizeof st);
    for (long i = 0; i < n && st.failing < MAX_FAILING; i++) {
        if (only >= 0 && i != only) continue;
        /* Each problem has its own stream (seed, case, index): FA3C_DIFF_ONLY replays one. */
        tu_rng_state = seed ^ (salt * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)i * 0xD1B54A32D192ED03ull);
        (void)tu_rand_u64();
        dcase c;
        gen(&c, flavor);
        tu_pick_threads(i);
        const int before = harness_failures;
        check_case(&c, &st);
        st.cases++;
        if (harness_failures != before) {
            st.failing++;
            describe(&c, stderr);
            fprintf(stderr, "  replay: FA3C_SEED=%llu FA3C_DIFF_ONLY=%ld test_differential %s\n", (unsigned long long)seed, i,
                    name);
        }
    }
    printf("  %s: %ld problems, %ld fully masked rows, %ld keys no row sees; worst error/tolerance "
           "(out lse dq dk dv):\n",
           name, st.cases, st.masked_rows, st.dead_keys);
    for (int t = 0; t < 3; t++)
        printf("    %s %.2f %.2f %.2f %.2f %.2f\n", t == 0 ? "fp32" : t == 1 ? "fp16" : "bf16", st.worst[t][0], st.worst[t][1],
               st.worst[t][2], st.worst[t][3], st.worst[t][4]);
}

TEST(diff_dense) { differential("diff_dense", 1, FLAVOR_DENSE); }

TEST(diff_masks) { differential("diff_masks", 2, FLAVOR_MASKS); }

TEST(diff_varlen) { differential("diff_varlen", 3, FLAVOR_VARLEN); }

/* The CUDA backend against the CPU needs device buffers, which plain C tests
 * do not allocate (no CUDA runtime here): that comparison lives in tests/gpu. */
/* The GPU side of the differential is tests/gpu/test_fwd.cu's
 * fwd_random_problems and test_bwd.cu's bwd_random_problems (the CUDA
 * kernels on random problems against the float64 reference; the latter also
 * runs here with the CPU standing in for the GPU: bwd_refs_on_cpu). */
TEST(diff_gpu_vs_cpu) { SKIP("GPU differential: runs as tests/gpu test_fwd fwd_random_problems and test_bwd bwd_random_problems"); }

TEST_MAIN()
