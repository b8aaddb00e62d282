/* CPU backward: the float64 reference against central finite differences of
 * the reference forward, and the tiled flash backward against the reference
 * over masks, GQA, varlen, dtypes and strided layouts; plus determinism. */
#include <math.h>
#include "harness.h"
#include "testutil.h"
#include "backend.h"
#include "problem.h"
#ifdef _OPENMP
#include <omp.h>
#endif

typedef struct {
    fa3c_dtype dt;
    int b, sq, sk, hq, hkv, d;
    int causal, wl, wr;
    float softcap, scale;
    int varlen, seqused, packed;
} bcase;

typedef struct {
    fa3c_bwd_params p;
    void *bufs[16];
    int nbufs;
    int64_t nq, nk, nlse; /* elements of q-like and k-like tensors, lse entries */
} bsetup;

static void *keep(bsetup *s, size_t bytes) {
    void *x = tu_alloc(bytes);
    s->bufs[s->nbufs++] = x;
    return x;
}

static bcase bbase(fa3c_dtype dt, int b, int sq, int sk, int hq, int hkv, int d) {
    bcase c;
    memset(&c, 0, sizeof c);
    c.dt = dt; c.b = b; c.sq = sq; c.sk = sk; c.hq = hq; c.hkv = hkv; c.d = d;
    c.wl = c.wr = -1;
    return c;
}

/* Inputs, dout, and out + lse from the reference forward. dq/dk/dv left NULL. */
static void bbuild(bsetup *s, const bcase *c) {
    memset(s, 0, sizeof *s);
    fa3c_bwd_params_init(&s->p);
    fa3c_problem *pr = &s->p.problem;
    const size_t es = tu_dtype_size(c->dt);
    const int d = c->d;
    pr->dtype = c->dt;
    pr->batch = c->b; pr->seqlen_q = c->sq; pr->seqlen_k = c->sk;
    pr->heads_q = c->hq; pr->heads_kv = c->hkv; pr->headdim = d;
    pr->softmax_scale = c->scale != 0 ? c->scale : (float)(1.0 / sqrt((double)d));
    pr->causal = c->causal; pr->window_left = c->wl; pr->window_right = c->wr; pr->softcap = c->softcap;
    s->p.backend = FA3C_BACKEND_CPU;
    s->p.deterministic = 1;
    int64_t tq = (int64_t)c->b * c->sq, tk = (int64_t)c->b * c->sk;
    if (c->varlen) {
        int32_t *cq = (int32_t *)keep(s, sizeof(int32_t) * (c->b + 1)), *ck = (int32_t *)keep(s, sizeof(int32_t) * (c->b + 1));
        cq[0] = ck[0] = 0;
        for (int b = 0; b < c->b; b++) {
            int lq = b == 0 ? c->sq : (c->b >= 3 && b == 1 ? 0 : tu_rand_int(1, c->sq));
            int lk = b == 0 ? c->sk : tu_rand_int(1, c->sk);
            cq[b + 1] = cq[b] + lq;
            ck[b + 1] = ck[b] + lk;
        }
        pr->cu_seqlens_q = cq;
        pr->cu_seqlens_k = ck;
        tq = cq[c->b];
        tk = ck[c->b];
    }
    if (c->seqused) {
        int32_t *u = (int32_t *)keep(s, sizeof(int32_t) * c->b);
        for (int b = 0; b < c->b; b++) u[b] = tu_rand_int(1, c->sk);
        pr->seqused_k = u;
    }
    if (c->packed) { /* one (b, s, h, 3, d) buffer for q, k, v and dout/out alike */
        const int h = c->hq;
        int64_t st[4] = {(int64_t)c->sq * h * 3 * d, (int64_t)h * 3 * d, 3 * d, 1};
        char *qkv = (char *)keep(s, es * (size_t)tq * h * 3 * d);
        tu_fill_normal(qkv, c->dt, tq * h * 3 * d, 1.0f);
        s->p.q.data = qkv; s->p.k.data = qkv + es * d; s->p.v.data = qkv + 2 * es * d;
        memcpy(s->p.q.stride, st, sizeof st);
        memcpy(s->p.k.stride, st, sizeof st);
        memcpy(s->p.v.stride, st, sizeof st);
    } else {
        void *q = keep(s, es * (size_t)tq * c->hq * d), *k = keep(s, es * (size_t)tk * c->hkv * d),
             *v = keep(s, es * (size_t)tk * c->hkv * d);
        tu_fill_normal(q, c->dt, tq * c->hq * d, 1.0f);
        tu_fill_normal(k, c->dt, tk * c->hkv * d, 1.0f);
        tu_fill_normal(v, c->dt, tk * c->hkv * d, 1.0f);
        s->p.q = tu_tensor(q, c->b, c->sq, c->hq, d);
        s->p.k = tu_tensor(k, c->b, c->sk, c->hkv, d);
        s->p.v = tu_tensor(v, c->b, c->sk, c->hkv, d);
    }
    s->nq = tq * c->hq * d;
    s->nk = tk * c->hkv * d;
    s->nlse = tq * c->hq;
    void *dout = keep(s, es * (size_t)s->nq), *out = keep(s, es * (size_t)s->nq);
    float *lse = (float *)keep(s, sizeof(float) * (size_t)(s->nlse + 1));
    tu_fill_normal(dout, c->dt, s->nq, 1.0f);
    s->p.dout = tu_tensor(dout, c->b, c->sq, c->hq, d);
    s->p.out = tu_tensor(out, c->b, c->sq, c->hq, d);
    s->p.lse = lse;
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    f.problem = *pr;
    f.q = s->p.q; f.k = s->p.k; f.v = s->p.v; f.out = s->p.out; f.lse = lse;
    fa3c_status st = fa3c_cpu_fwd_reference(&f);
    if (st != FA3C_STATUS_OK) fprintf(stderr, "reference forward failed: %s\n", fa3c_last_error());
    s->p.dq = tu_tensor(NULL, c->b, c->sq, c->hq, d);
    s->p.dk = tu_tensor(NULL, c->b, c->sk, c->hkv, d);
    s->p.dv = tu_tensor(NULL, c->b, c->sk, c->hkv, d);
}

static void brelease(bsetup *s) {
    for (int i = 0; i < s->nbufs; i++) free(s->bufs[i]);
}

typedef fa3c_status (*bwd_fn)(const fa3c_bwd_params *);

/* Run fn into poisoned dq/dk/dv; g gets nq + 2 nk floats (dq, dk, dv). */
static fa3c_status brun(bwd_fn fn, const bsetup *s, float *g) {
    const fa3c_dtype dt = s->p.problem.dtype;
    const size_t es = tu_dtype_size(dt);
    void *dq = tu_alloc(es * s->nq), *dk = tu_alloc(es * s->nk), *dv = tu_alloc(es * s->nk);
    tu_poison(dq, es * s->nq);
    tu_poison(dk, es * s->nk);
    tu_poison(dv, es * s->nk);
    fa3c_bwd_params p = s->p;
    p.dq.data = dq; p.dk.data = dk; p.dv.data = dv;
    fa3c_status st = fn(&p);
    for (int64_t i = 0; i < s->nq; i++) g[i] = tu_load(dq, dt, i);
    for (int64_t i = 0; i < s->nk; i++) g[s->nq + i] = tu_load(dk, dt, i);
    for (int64_t i = 0; i < s->nk; i++) g[s->nq + s->nk + i] = tu_load(dv, dt, i);
    free(dq); free(dk); free(dv);
    return st;
}

static fa3c_status fa3c_bwd_via_api(const fa3c_bwd_params *p) { return fa3c_bwd(p, NULL); }

/* loss = sum(dout ∘ out) with out from the reference forward, in double. */
static double loss_of(const bsetup *s) {
    const int64_t n = s->nq;
    float *out = (float *)tu_alloc(sizeof(float) * n), *lse = (float *)tu_alloc(sizeof(float) * (s->nlse + 1));
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    f.problem = s->p.problem;
    f.q = s->p.q; f.k = s->p.k; f.v = s->p.v;
    f.out = tu_tensor(out, s->p.problem.batch, s->p.problem.seqlen_q, s->p.problem.heads_q, s->p.problem.headdim);
    f.lse = lse;
    fa3c_cpu_fwd_reference(&f);
    double L = 0;
    for (int64_t i = 0; i < n; i++) L += (double)out[i] * ((const float *)s->p.dout.data)[i];
    free(out); free(lse);
    return L;
}

/* Reference backward vs central differences (fp32, tiny shapes). */
static void check_fd(const bcase *c, const char *what) {
    bsetup s;
    bbuild(&s, c);
    float *g = (float *)tu_alloc(sizeof(float) * (s.nq + 2 * s.nk));
    CHECK(brun(fa3c_cpu_bwd_reference, &s, g) == FA3C_STATUS_OK, "%s: status", what);
    float *bufs[3] = {(float *)s.p.q.data, (float *)s.p.k.data, (float *)s.p.v.data};
    const int64_t n[3] = {s.nq, s.nk, s.nk}, off[3] = {0, s.nq, s.nq + s.nk};
    double worst = 0;
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < n[t]; i++) {
            const float x0 = bufs[t][i], xp = x0 + 2e-3f, xm = x0 - 2e-3f;
            bufs[t][i] = xp;
            const double lp = loss_of(&s);
            bufs[t][i] = xm;
            const double lm = loss_of(&s);
            bufs[t][i] = x0;
            const double fd = (lp - lm) / ((double)xp - (double)xm), an = g[off[t] + i];
            const double err = fabs(fd - an) / (1e-3 + 1e-3 * fabs(fd));
            if (err > worst) worst = err;
            CHECK(err <= 1.0, "%s: %s[%lld] analytic %.6g vs finite difference %.6g", what, t == 0 ? "dq" : t == 1 ? "dk" : "dv",
                  (long long)i, an, fd);
        }
    if (getenv("FA3C_VERBOSE")) printf("  %-32s worst err/tol %.3g\n", what, worst);
    free(g);
    brelease(&s);
}

TEST(bwd_reference_fd_basic) {
    bcase c = bbase(FA3C_DTYPE_FP32, 1, 4, 5, 2, 2, 8);
    check_fd(&c, "basic 4x5");
    c.scale = 0.8f;
    check_fd(&c, "scale 0.8");
}

TEST(bwd_reference_fd_causal_window) {
    bcase c = bbase(FA3C_DTYPE_FP32, 1, 5, 4, 1, 1, 8);
    c.causal = 1;
    check_fd(&c, "causal 5x4 (masked row)");
    c = bbase(FA3C_DTYPE_FP32, 2, 6, 6, 1, 1, 8);
    c.wl = 2; c.wr = 1;
    check_fd(&c, "window (2,1)");
}

TEST(bwd_reference_fd_softcap) {
    bcase c = bbase(FA3C_DTYPE_FP32, 1, 4, 6, 2, 1, 8);
    c.softcap = 1.5f;
    c.scale = 0.7f;
    check_fd(&c, "softcap 1.5");
}

TEST(bwd_reference_fd_gqa_varlen) {
    bcase c = bbase(FA3C_DTYPE_FP32, 1, 3, 4, 3, 1, 8);
    check_fd(&c, "gqa 3:1");
    c = bbase(FA3C_DTYPE_FP32, 3, 4, 5, 2, 1, 8);
    c.varlen = 1;
    c.causal = 1;
    check_fd(&c, "varlen causal gqa");
}

/* flash backward vs reference backward */
static void check_bwd(const bcase *c, const char *what) {
    bsetup s;
    bbuild(&s, c);
    const int64_t n = s.nq + 2 * s.nk;
    float *gr = (float *)tu_alloc(sizeof(float) * n), *gf = (float *)tu_alloc(sizeof(float) * n);
    fa3c_status s1 = brun(fa3c_cpu_bwd_reference, &s, gr), s2 = brun(fa3c_cpu_bwd, &s, gf);
    CHECK(s1 == FA3C_STATUS_OK && s2 == FA3C_STATUS_OK, "%s: status %d %d (%s)", what, s1, s2, fa3c_last_error());
    /* relative to each gradient's largest magnitude: bf16/fp16 outputs carry rounding and the
     * kernel uses the stored (rounded) out for D = rowsum(dO∘O), as FlashAttention does */
    const double rtol = c->dt == FA3C_DTYPE_FP32 ? 5e-6 : c->dt == FA3C_DTYPE_FP16 ? 2e-3 : 1.2e-2;
    const char *names[3] = {"dq", "dk", "dv"};
    const int64_t cnt[3] = {s.nq, s.nk, s.nk}, off[3] = {0, s.nq, s.nq + s.nk};
    for (int t = 0; t < 3; t++) {
        double mx = 0;
        int64_t nan = 0;
        for (int64_t i = 0; i < cnt[t]; i++) {
            if (fabs(gr[off[t] + i]) > mx) mx = fabs(gr[off[t] + i]);
            nan += isnan(gf[off[t] + i]) || isnan(gr[off[t] + i]);
        }
        const double e = tu_max_abs_err(gf + off[t], gr + off[t], cnt[t]), rel = tu_rel_l2_err(gf + off[t], gr + off[t], cnt[t]);
        CHECK(nan == 0, "%s: %lld %s elements unwritten", what, (long long)nan, names[t]);
        CHECK(e <= rtol * mx + 1e-6, "%s: %s max err %.3g > %.2g x max|ref| %.3g (rel l2 %.3g)", what, names[t], e, rtol, mx, rel);
        if (getenv("FA3C_VERBOSE")) printf("  %-36s %s err %.3g / max %.3g rel l2 %.3g\n", what, names[t], e, mx, rel);
    }
    free(gr); free(gf);
    brelease(&s);
}

static const fa3c_dtype bdtypes[3] = {FA3C_DTYPE_FP32, FA3C_DTYPE_FP16, FA3C_DTYPE_BF16};

TEST(bwd_flash_dtypes_hdims) {
    const int hd[5] = {8, 40, 64, 128, 256};
    char what[96];
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 5; i++) {
            bcase c = bbase(bdtypes[t], 1, 61, 75, 2, 1, hd[i]);
            snprintf(what, sizeof what, "%s d=%d", tu_dtype_name(c.dt), c.d);
            check_bwd(&c, what);
        }
}

TEST(bwd_flash_causal) {
    const int sz[4][2] = {{100, 100}, {50, 130}, {130, 50}, {1, 77}};
    char what[96];
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++) {
            bcase c = bbase(bdtypes[t], 2, sz[i][0], sz[i][1], 2, 2, 64);
            c.causal = 1;
            snprintf(what, sizeof what, "%s causal %dx%d", tu_dtype_name(c.dt), c.sq, c.sk);
            check_bwd(&c, what);
        }
}

TEST(bwd_flash_window_softcap) {
    char what[96];
    for (int t = 0; t < 3; t++) {
        bcase c = bbase(bdtypes[t], 1, 120, 100, 2, 1, 64);
        c.wl = 17; c.wr = 5;
        snprintf(what, sizeof what, "%s window (17,5)", tu_dtype_name(c.dt));
        check_bwd(&c, what);
        c = bbase(bdtypes[t], 1, 90, 110, 2, 2, 96);
        c.softcap = 3.0f; c.scale = 0.4f;
        snprintf(what, sizeof what, "%s softcap", tu_dtype_name(c.dt));
        check_bwd(&c, what);
        c.causal = 1; c.wl = 30;
        snprintf(what, sizeof what, "%s softcap causal window", tu_dtype_name(c.dt));
        check_bwd(&c, what);
    }
}

TEST(bwd_flash_gqa) {
    const int g[3][2] = {{8, 1}, {6, 1}, {6, 2}};
    char what[96];
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 3; t++) {
            bcase c = bbase(bdtypes[t], 1, 70, 90, g[i][0], g[i][1], 64);
            c.causal = i == 1;
            snprintf(what, sizeof what, "%s gqa %d:%d", tu_dtype_name(c.dt), g[i][0], g[i][1]);
            check_bwd(&c, what);
        }
}

TEST(bwd_flash_varlen) {
    char what[96];
    for (int t = 0; t < 3; t++)
        for (int causal = 0; causal < 2; causal++) {
            bcase c = bbase(bdtypes[t], 4, 110, 95, 4, 2, 64);
            c.varlen = 1;
            c.causal = causal;
            snprintf(what, sizeof what, "%s varlen causal=%d", tu_dtype_name(c.dt), causal);
            check_bwd(&c, what);
        }
}

TEST(bwd_flash_seqused_packed) {
    char what[96];
    for (int t = 0; t < 3; t++) {
        bcase c = bbase(bdtypes[t], 2, 60, 100, 2, 1, 64);
        c.seqused = 1;
        snprintf(what, sizeof what, "%s seqused_k", tu_dtype_name(c.dt));
        check_bwd(&c, what);
        c = bbase(bdtypes[t], 2, 83, 83, 3, 3, 64);
        c.packed = 1;
        c.causal = 1;
        snprintf(what, sizeof what, "%s packed qkv", tu_dtype_name(c.dt));
        check_bwd(&c, what);
    }
}

TEST(bwd_flash_long) {
    bcase c = bbase(FA3C_DTYPE_BF16, 1, 600, 600, 2, 1, 128);
    c.causal = 1;
    check_bwd(&c, "bf16 s600 causal");
}

TEST(bwd_deterministic) {
    /* bitwise the same on every run and for any thread count */
    bcase c = bbase(FA3C_DTYPE_BF16, 2, 150, 170, 4, 1, 64);
    c.causal = 1;
    bsetup s;
    bbuild(&s, &c);
    const int64_t n = s.nq + 2 * s.nk;
    float *a = (float *)tu_alloc(sizeof(float) * n), *b = (float *)tu_alloc(sizeof(float) * n);
    brun(fa3c_cpu_bwd, &s, a);
    brun(fa3c_cpu_bwd, &s, b);
    CHECK(memcmp(a, b, sizeof(float) * n) == 0, "two runs differ");
#ifdef _OPENMP
    const int nt = omp_get_max_threads();
    omp_set_num_threads(nt > 1 ? 1 : 3);
    brun(fa3c_cpu_bwd, &s, b);
    omp_set_num_threads(nt);
    CHECK(memcmp(a, b, sizeof(float) * n) == 0, "a different thread count gives different bits");
#endif
    free(a); free(b);
    brelease(&s);
}

TEST(bwd_public_api_cpu) {
    bcase c = bbase(FA3C_DTYPE_FP16, 2, 50, 70, 4, 2, 64);
    c.causal = 1;
    bsetup s;
    bbuild(&s, &c);
    const int64_t n = s.nq + 2 * s.nk;
    float *a = (float *)tu_alloc(sizeof(float) * n), *b = (float *)tu_alloc(sizeof(float) * n);
    brun(fa3c_cpu_bwd, &s, a);
    s.p.problem.softmax_scale = 0;
    fa3c_status st = brun(fa3c_bwd_via_api, &s, b);
    CHECK(st == FA3C_STATUS_OK, "fa3c_bwd: %s", fa3c_last_error());
    CHECK(memcmp(a, b, sizeof(float) * n) == 0, "fa3c_bwd differs from fa3c_cpu_bwd");
    free(a); free(b);
    brelease(&s);
}

/* ---- varlen backward against plain batch-1 runs (no shared addressing helpers) ---- */

static fa3c_status fwd_be(fa3c_fwd_params f, fa3c_backend be) {
    f.backend = be;
    return fa3c_fwd(&f, NULL);
}

/* max |a - b| over n elements of two dtype buffers (NaN counts as infinite). */
static double max_diff_rows(const void *a, int64_t ia, const void *b, int64_t ib, int64_t n, fa3c_dtype dt) {
    double m = 0;
    for (int64_t x = 0; x < n; x++) {
        double d = fabs((double)tu_load(a, dt, ia + x) - (double)tu_load(b, dt, ib + x));
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

TEST(bwd_varlen_vs_per_sequence) {
    /* different lengths incl. a length-1 query, a sequence with sq > sk, GQA 2:1, causal */
    enum { NB = 4, HQ = 4, HKV = 2, D = 32 };
    const int lq[NB] = {37, 1, 70, 9}, lk[NB] = {50, 63, 70, 4};
    const fa3c_dtype dts[2] = {FA3C_DTYPE_FP32, FA3C_DTYPE_FP16};
    const fa3c_backend bes[2] = {FA3C_BACKEND_CPU, FA3C_BACKEND_CPU_REFERENCE};
    int32_t cq[NB + 1], ck[NB + 1];
    tu_prefix_sums(lq, NB, cq);
    tu_prefix_sums(lk, NB, ck);
    const int tq = cq[NB], tk = ck[NB];
    const int64_t nq = (int64_t)tq * HQ * D, nk = (int64_t)tk * HKV * D;
    for (int t = 0; t < 2; t++) {
        const fa3c_dtype dt = dts[t];
        const size_t es = tu_dtype_size(dt);
        char *q = (char *)tu_alloc(es * nq), *k = (char *)tu_alloc(es * nk), *v = (char *)tu_alloc(es * nk),
             *dout = (char *)tu_alloc(es * nq), *out = (char *)tu_alloc(es * nq);
        char *dq = (char *)tu_alloc(es * nq), *dk = (char *)tu_alloc(es * nk), *dv = (char *)tu_alloc(es * nk);
        float *lse = (float *)tu_alloc(sizeof(float) * HQ * tq);
        tu_fill_normal(q, dt, nq, 1.0f);
        tu_fill_normal(k, dt, nk, 1.0f);
        tu_fill_normal(v, dt, nk, 1.0f);
        tu_fill_normal(dout, dt, nq, 1.0f);
        fa3c_fwd_params f;
        fa3c_fwd_params_init(&f);
        tu_problem_shape(&f.problem, dt, NB, 70, 70, HQ, HKV, D);
        f.problem.causal = 1;
        f.problem.cu_seqlens_q = cq; f.problem.cu_seqlens_k = ck;
        f.q = tu_tensor(q, 1, tq, HQ, D); f.k = tu_tensor(k, 1, tk, HKV, D); f.v = tu_tensor(v, 1, tk, HKV, D);
        f.out = tu_tensor(out, 1, tq, HQ, D);
        f.lse = lse;
        CHECK(fwd_be(f, FA3C_BACKEND_CPU_REFERENCE) == FA3C_STATUS_OK, "varlen forward: %s", fa3c_last_error());
        fa3c_bwd_params g;
        fa3c_bwd_params_init(&g);
        g.problem = f.problem;
        g.q = f.q; g.k = f.k; g.v = f.v; g.out = f.out; g.lse = lse;
        g.dout = tu_tensor(dout, 1, tq, HQ, D);
        g.dq = tu_tensor(dq, 1, tq, HQ, D); g.dk = tu_tensor(dk, 1, tk, HKV, D); g.dv = tu_tensor(dv, 1, tk, HKV, D);
        g.deterministic = 1;
        for (int e = 0; e < 2; e++) {
            tu_poison(dq, es * nq); tu_poison(dk, es * nk); tu_poison(dv, es * nk);
            g.backend = bes[e];
            fa3c_status st = fa3c_bwd(&g, NULL);
            CHECK(st == FA3C_STATUS_OK, "%s backend %d varlen bwd: %s", tu_dtype_name(dt), bes[e], fa3c_last_error());
            double err[3] = {0, 0, 0}, mag[3] = {0, 0, 0};
            for (int b = 0; b < NB; b++) {
                /* this sequence alone in its own contiguous buffers, out/lse from its own forward */
                const int64_t sqn = (int64_t)lq[b] * HQ * D, skn = (int64_t)lk[b] * HKV * D;
                char *sb[8];
                const int64_t sz[8] = {sqn, skn, skn, sqn, sqn, sqn, skn, skn}; /* q k v dout out dq dk dv */
                for (int i = 0; i < 8; i++) sb[i] = (char *)tu_alloc(es * sz[i] + 1);
                memcpy(sb[0], q + es * (size_t)cq[b] * HQ * D, es * sqn);
                memcpy(sb[1], k + es * (size_t)ck[b] * HKV * D, es * skn);
                memcpy(sb[2], v + es * (size_t)ck[b] * HKV * D, es * skn);
                memcpy(sb[3], dout + es * (size_t)cq[b] * HQ * D, es * sqn);
                float *sl = (float *)tu_alloc(sizeof(float) * HQ * lq[b]);
                fa3c_fwd_params sf = f;
                sf.problem.batch = 1; sf.problem.seqlen_q = lq[b]; sf.problem.seqlen_k = lk[b];
                sf.problem.cu_seqlens_q = sf.problem.cu_seqlens_k = NULL;
                sf.q = tu_tensor(sb[0], 1, lq[b], HQ, D); sf.k = tu_tensor(sb[1], 1, lk[b], HKV, D);
                sf.v = tu_tensor(sb[2], 1, lk[b], HKV, D); sf.out = tu_tensor(sb[4], 1, lq[b], HQ, D);
                sf.lse = sl;
                CHECK(fwd_be(sf, FA3C_BACKEND_CPU_REFERENCE) == FA3C_STATUS_OK, "seq %d forward: %s", b, fa3c_last_error());
                fa3c_bwd_params sg = g;
                sg.problem = sf.problem;
                sg.q = sf.q; sg.k = sf.k; sg.v = sf.v; sg.out = sf.out; sg.lse = sl;
                sg.dout = tu_tensor(sb[3], 1, lq[b], HQ, D);
                sg.dq = tu_tensor(sb[5], 1, lq[b], HQ, D); sg.dk = tu_tensor(sb[6], 1, lk[b], HKV, D);
                sg.dv = tu_tensor(sb[7], 1, lk[b], HKV, D);
                tu_poison(sb[5], es * sqn); tu_poison(sb[6], es * skn); tu_poison(sb[7], es * skn);
                sg.backend = FA3C_BACKEND_CPU_REFERENCE;
                CHECK(fa3c_bwd(&sg, NULL) == FA3C_STATUS_OK, "seq %d bwd: %s", b, fa3c_last_error());
                /* row by row: varlen token cu[b] + i against row i of the sequence's own run */
                const char *vl[3] = {dq, dk, dv};
                const int64_t base[3] = {(int64_t)cq[b] * HQ * D, (int64_t)ck[b] * HKV * D, (int64_t)ck[b] * HKV * D};
                const int64_t rowlen[3] = {HQ * D, HKV * D, HKV * D}, rows[3] = {lq[b], lk[b], lk[b]};
                for (int w = 0; w < 3; w++)
                    for (int64_t r = 0; r < rows[w]; r++) {
                        double d = max_diff_rows(vl[w], base[w] + r * rowlen[w], sb[5 + w], r * rowlen[w], rowlen[w], dt);
                        if (d > err[w]) err[w] = d;
                        for (int64_t x = 0; x < rowlen[w]; x++) {
                            double a = fabs(tu_load(sb[5 + w], dt, r * rowlen[w] + x));
                            if (a > mag[w]) mag[w] = a;
                        }
                    }
                for (int i = 0; i < 8; i++) free(sb[i]);
                free(sl);
            }
            const double rtol = dt == FA3C_DTYPE_FP32 ? 1e-5 : 4e-3;
            const char *names[3] = {"dq", "dk", "dv"};
            for (int w = 0; w < 3; w++) {
                CHECK(err[w] <= rtol * mag[w] + 1e-6, "%s backend %d: varlen %s differs from per-sequence runs by %.3g (max |g| %.3g)",
                      tu_dtype_name(dt), bes[e], names[w], err[w], mag[w]);
                if (getenv("FA3C_VERBOSE"))
                    printf("  varlen bwd %s be %d %s err %.3g max %.3g\n", tu_dtype_name(dt), bes[e], names[w], err[w], mag[w]);
            }
        }
        free(q); free(k); free(v); free(dout); free(out); free(dq); free(dk); free(dv); free(lse);
    }
}

TEST_MAIN()
