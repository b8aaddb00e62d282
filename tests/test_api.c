/* The public API's contract: every bad parameter of every entry point is
 * refused with the right status, a message that names the parameter, and
 * untouched outputs; the small helpers (status strings, version, defaults,
 * the per-thread message) behave as documented; and one small call per
 * entry point works on the CPU. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers under -std=c11 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

#define INVALID FA3C_STATUS_INVALID_ARGUMENT
#define UNSUPPORTED FA3C_STATUS_NOT_SUPPORTED
#define OK FA3C_STATUS_OK

/* ---- a small valid problem with generous buffers ------------------------ */

enum { B = 2, SQ = 5, SK = 7, HQ = 4, HKV = 2, D = 16, ROWS = 32 };
/* ROWS tokens x HQ heads x D x 4 bytes fits every tensor in every dtype and layout used here. */
#define BUF_BYTES ((size_t)ROWS * HQ * D * 4)
#define LSE_BYTES ((size_t)HQ * ROWS * 4)
#define POISON 0x5a

typedef struct fixture {
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
    int32_t cu_q[B + 1], cu_k[B + 1], used_k[B], pages[B * 4];
    float descale[B * HKV];
    fa3c_fwd_params fwd;
    fa3c_bwd_params bwd;
} fixture;

static void *abuf(size_t bytes) {
    void *p = aligned_alloc(64, bytes); /* 64: any alignment a backend might want */
    if (!p) abort();
    return p;
}

static void fixture_init(fixture *f) {
    void **bufs[] = {&f->q, &f->k, &f->v, &f->out, &f->dout, &f->dq, &f->dk, &f->dv};
    for (int i = 0; i < 8; i++) {
        *bufs[i] = abuf(BUF_BYTES);
        memset(*bufs[i], 0, BUF_BYTES);
    }
    /* Inputs hold random bf16 values (the fixture's dtype). */
    void *ins[] = {f->q, f->k, f->v, f->out, f->dout};
    for (int i = 0; i < 5; i++) tu_fill_normal(ins[i], FA3C_DTYPE_BF16, BUF_BYTES / 2, 1.0f);
    f->lse = abuf(LSE_BYTES);
    for (size_t i = 0; i < LSE_BYTES / 4; i++) f->lse[i] = 1.0f;
    int32_t cq[] = {0, 3, 5}, ck[] = {0, 7, 10}, uk[] = {7, 2}, pg[] = {0, 1, 2, 3, 3, 2, 1, 0};
    memcpy(f->cu_q, cq, sizeof cq);
    memcpy(f->cu_k, ck, sizeof ck);
    memcpy(f->used_k, uk, sizeof uk);
    memcpy(f->pages, pg, sizeof pg);
    for (int i = 0; i < B * HKV; i++) f->descale[i] = 0.5f;

    fa3c_fwd_params *p = &f->fwd;
    fa3c_fwd_params_init(p);
    fa3c_problem pr = p->problem;
    pr.dtype = FA3C_DTYPE_BF16;
    pr.batch = B;
    pr.seqlen_q = SQ;
    pr.seqlen_k = SK;
    pr.heads_q = HQ;
    pr.heads_kv = HKV;
    pr.headdim = D;
    p->problem = pr;
    p->q = tu_tensor(f->q, B, SQ, HQ, D);
    p->k = tu_tensor(f->k, B, SK, HKV, D);
    p->v = tu_tensor(f->v, B, SK, HKV, D);
    p->out = tu_tensor(f->out, B, SQ, HQ, D);
    p->lse = f->lse;
    p->backend = FA3C_BACKEND_CPU;

    fa3c_bwd_params *g = &f->bwd;
    fa3c_bwd_params_init(g);
    g->problem = pr;
    g->q = p->q;
    g->k = p->k;
    g->v = p->v;
    g->out = tu_tensor(f->out, B, SQ, HQ, D);
    g->dout = tu_tensor(f->dout, B, SQ, HQ, D);
    g->lse = f->lse;
    g->dq = tu_tensor(f->dq, B, SQ, HQ, D);
    g->dk = tu_tensor(f->dk, B, SK, HKV, D);
    g->dv = tu_tensor(f->dv, B, SK, HKV, D);
    g->backend = FA3C_BACKEND_CPU;
}

static void fixture_free(fixture *f) {
    void *bufs[] = {f->q, f->k, f->v, f->out, f->dout, f->dq, f->dk, f->dv, f->lse};
    for (int i = 0; i < 9; i++) free(bufs[i]);
}

/* The fwd outputs (out, lse) or bwd outputs (dq, dk, dv). */
static void poison_outputs(fixture *f, int bwd) {
    if (bwd) {
        memset(f->dq, POISON, BUF_BYTES);
        memset(f->dk, POISON, BUF_BYTES);
        memset(f->dv, POISON, BUF_BYTES);
    } else {
        memset(f->out, POISON, BUF_BYTES);
        memset(f->lse, POISON, LSE_BYTES);
    }
}

static int untouched(const void *buf, size_t bytes) {
    const unsigned char *c = buf;
    for (size_t i = 0; i < bytes; i++)
        if (c[i] != POISON) return 0;
    return 1;
}

static int outputs_untouched(fixture *f, int bwd) {
    if (bwd) return untouched(f->dq, BUF_BYTES) && untouched(f->dk, BUF_BYTES) && untouched(f->dv, BUF_BYTES);
    return untouched(f->out, BUF_BYTES) && untouched(f->lse, LSE_BYTES);
}

/* Both check functions (fa3c_*_check_device is the same on the CPU
 * backends) and the call must refuse p with `want`, name `needle` in the
 * message, and leave the outputs alone. */
static void expect_fwd(fixture *f, const fa3c_fwd_params *p, fa3c_status want, const char *needle, int line) {
    poison_outputs(f, 0);
    fa3c_status s = fa3c_fwd_check(p);
    CHECK(s == want, "line %d: fa3c_fwd_check -> %s, want %s (%s)", line, fa3c_status_string(s),
          fa3c_status_string(want), fa3c_last_error());
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "line %d: check message '%s' lacks '%s'", line,
          fa3c_last_error(), needle);
    s = fa3c_fwd_check_device(p, NULL);
    CHECK(s == want, "line %d: fa3c_fwd_check_device -> %s, want %s (%s)", line, fa3c_status_string(s),
          fa3c_status_string(want), fa3c_last_error());
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "line %d: check_device message '%s' lacks '%s'", line,
          fa3c_last_error(), needle);
    s = fa3c_fwd(p, NULL);
    CHECK(s == want, "line %d: fa3c_fwd -> %s, want %s (%s)", line, fa3c_status_string(s),
          fa3c_status_string(want), fa3c_last_error());
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "line %d: message '%s' lacks '%s'", line, fa3c_last_error(),
          needle);
    CHECK(outputs_untouched(f, 0), "line %d: a refused fa3c_fwd wrote its outputs", line);
}

static void expect_bwd(fixture *f, const fa3c_bwd_params *p, fa3c_status want, const char *needle, int line) {
    poison_outputs(f, 1);
    fa3c_status s = fa3c_bwd_check(p);
    CHECK(s == want, "line %d: fa3c_bwd_check -> %s, want %s (%s)", line, fa3c_status_string(s),
          fa3c_status_string(want), fa3c_last_error());
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "line %d: check message '%s' lacks '%s'", line,
          fa3c_last_error(), needle);
    s = fa3c_bwd_check_device(p, NULL);
    CHECK(s == want, "line %d: fa3c_bwd_check_device -> %s, want %s (%s)", line, fa3c_status_string(s),
          fa3c_status_string(want), fa3c_last_error());
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "line %d: check_device message '%s' lacks '%s'", line,
          fa3c_last_error(), needle);
    s = fa3c_bwd(p, NULL);
    CHECK(s == want, "line %d: fa3c_bwd -> %s, want %s (%s)", line, fa3c_status_string(s),
          fa3c_status_string(want), fa3c_last_error());
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "line %d: message '%s' lacks '%s'", line, fa3c_last_error(),
          needle);
    CHECK(outputs_untouched(f, 1), "line %d: a refused fa3c_bwd wrote its outputs", line);
}

/* Valid params: the check passes and leaves an empty message. */
static void expect_fwd_ok(const fa3c_fwd_params *p, int line) {
    fa3c_status s = fa3c_fwd_check(p);
    CHECK(s == OK, "line %d: fa3c_fwd_check -> %s (%s)", line, fa3c_status_string(s), fa3c_last_error());
    CHECK(fa3c_last_error()[0] == '\0', "line %d: message left after OK: '%s'", line, fa3c_last_error());
    s = fa3c_fwd_check_device(p, NULL);
    CHECK(s == OK, "line %d: fa3c_fwd_check_device -> %s (%s)", line, fa3c_status_string(s), fa3c_last_error());
}

static void expect_bwd_ok(const fa3c_bwd_params *p, int line) {
    fa3c_status s = fa3c_bwd_check(p);
    CHECK(s == OK, "line %d: fa3c_bwd_check -> %s (%s)", line, fa3c_status_string(s), fa3c_last_error());
    CHECK(fa3c_last_error()[0] == '\0', "line %d: message left after OK: '%s'", line, fa3c_last_error());
    s = fa3c_bwd_check_device(p, NULL);
    CHECK(s == OK, "line %d: fa3c_bwd_check_device -> %s (%s)", line, fa3c_status_string(s), fa3c_last_error());
}

#define FWD_FAIL(f, p, st, needle) expect_fwd(&(f), &(p), st, needle, __LINE__)
#define BWD_FAIL(f, p, st, needle) expect_bwd(&(f), &(p), st, needle, __LINE__)
#define FWD_OK(p) expect_fwd_ok(&(p), __LINE__)
#define BWD_OK(p) expect_bwd_ok(&(p), __LINE__)

/* ---- the baseline is valid ----------------------------------------------- */

TEST(fixture_is_valid) {
    fixture f;
    fixture_init(&f);
    FWD_OK(f.fwd);
    BWD_OK(f.bwd);
    fixture_free(&f);
}

/* ---- null pointers --------------------------------------------------------- */

TEST(null_pointers) {
    fixture f;
    fixture_init(&f);
    CHECK(fa3c_fwd(NULL, NULL) == INVALID, "fa3c_fwd(NULL)");
    CHECK(strstr(fa3c_last_error(), "p:") != NULL, "'%s'", fa3c_last_error());
    CHECK(fa3c_fwd_check(NULL) == INVALID, "fa3c_fwd_check(NULL)");
    CHECK(fa3c_bwd(NULL, NULL) == INVALID, "fa3c_bwd(NULL)");
    CHECK(strstr(fa3c_last_error(), "p:") != NULL, "'%s'", fa3c_last_error());
    CHECK(fa3c_bwd_check(NULL) == INVALID, "fa3c_bwd_check(NULL)");
    fa3c_fwd_params_init(NULL); /* documented as a no-op, not a crash */
    fa3c_bwd_params_init(NULL);

    fa3c_fwd_params p;
    p = f.fwd; p.q.data = NULL; FWD_FAIL(f, p, INVALID, "q.data");
    p = f.fwd; p.k.data = NULL; FWD_FAIL(f, p, INVALID, "k.data");
    p = f.fwd; p.v.data = NULL; FWD_FAIL(f, p, INVALID, "v.data");
    p = f.fwd; p.out.data = NULL; FWD_FAIL(f, p, INVALID, "out.data");
    p = f.fwd; p.lse = NULL; FWD_OK(p); /* lse is optional in the forward */

    fa3c_bwd_params g;
    g = f.bwd; g.q.data = NULL; BWD_FAIL(f, g, INVALID, "q.data");
    g = f.bwd; g.k.data = NULL; BWD_FAIL(f, g, INVALID, "k.data");
    g = f.bwd; g.v.data = NULL; BWD_FAIL(f, g, INVALID, "v.data");
    g = f.bwd; g.out.data = NULL; BWD_FAIL(f, g, INVALID, "out.data");
    g = f.bwd; g.dout.data = NULL; BWD_FAIL(f, g, INVALID, "dout.data");
    g = f.bwd; g.dq.data = NULL; BWD_FAIL(f, g, INVALID, "dq.data");
    g = f.bwd; g.dk.data = NULL; BWD_FAIL(f, g, INVALID, "dk.data");
    g = f.bwd; g.dv.data = NULL; BWD_FAIL(f, g, INVALID, "dv.data");
    g = f.bwd; g.lse = NULL; BWD_FAIL(f, g, INVALID, "lse");
    fixture_free(&f);
}

/* ---- dtypes ------------------------------------------------------------------ */

TEST(dtypes) {
    fixture f;
    fixture_init(&f);
    int bad[] = {-1, 4, 99};
    for (int i = 0; i < 3; i++) {
        fa3c_fwd_params p = f.fwd;
        p.problem.dtype = (fa3c_dtype)bad[i];
        FWD_FAIL(f, p, INVALID, "problem.dtype");
        fa3c_bwd_params g = f.bwd;
        g.problem.dtype = (fa3c_dtype)bad[i];
        BWD_FAIL(f, g, INVALID, "problem.dtype");
    }
    fa3c_dtype good[] = {FA3C_DTYPE_FP32, FA3C_DTYPE_FP16, FA3C_DTYPE_BF16, FA3C_DTYPE_E4M3};
    for (int i = 0; i < 4; i++) {
        fa3c_fwd_params p = f.fwd;
        p.problem.dtype = good[i];
        FWD_OK(p);
    }
    fa3c_bwd_params g = f.bwd;
    g.problem.dtype = FA3C_DTYPE_E4M3;
    BWD_FAIL(f, g, UNSUPPORTED, "E4M3"); /* fp8 is forward only */
    fixture_free(&f);
}

/* ---- shapes ------------------------------------------------------------------- */

TEST(shapes) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p;
    p = f.fwd; p.problem.batch = -3; FWD_FAIL(f, p, INVALID, "problem.batch");
    p = f.fwd; p.problem.seqlen_q = -1; FWD_FAIL(f, p, INVALID, "problem.seqlen_q");
    p = f.fwd; p.problem.seqlen_k = 0; FWD_FAIL(f, p, UNSUPPORTED, "problem.seqlen_k: 0 keys");
    p = f.fwd; p.problem.seqlen_k = -1; FWD_FAIL(f, p, INVALID, "problem.seqlen_k");
    p = f.fwd; p.problem.heads_q = -1; FWD_FAIL(f, p, INVALID, "problem.heads_q");
    p = f.fwd; p.problem.heads_kv = 0; FWD_FAIL(f, p, INVALID, "problem.heads_kv");
    p = f.fwd; p.problem.heads_q = 3; FWD_FAIL(f, p, INVALID, "problem.heads_q (3) must be a multiple of problem.heads_kv (2)");
    p = f.fwd; p.problem.heads_q = 12; p.problem.heads_kv = 5;
    FWD_FAIL(f, p, INVALID, "problem.heads_q (12) must be a multiple of problem.heads_kv (5)");
    /* GQA ratios other than powers of two, MQA and seqlen 1 are fine. */
    p = f.fwd; p.problem.heads_q = 3; p.problem.heads_kv = 1;
    p.q = tu_tensor(f.q, B, SQ, 3, D); p.out = tu_tensor(f.out, B, SQ, 3, D);
    p.k = tu_tensor(f.k, B, SK, 1, D); p.v = tu_tensor(f.v, B, SK, 1, D);
    FWD_OK(p);
    p = f.fwd; p.problem.seqlen_q = 1; p.problem.seqlen_k = 1; FWD_OK(p);

    fa3c_bwd_params g;
    g = f.bwd; g.problem.batch = -1; BWD_FAIL(f, g, INVALID, "problem.batch");
    g = f.bwd; g.problem.seqlen_q = 0; BWD_FAIL(f, g, UNSUPPORTED, "problem.seqlen_q: a backward without queries");
    g = f.bwd; g.problem.seqlen_k = 0; BWD_FAIL(f, g, UNSUPPORTED, "problem.seqlen_k: 0 keys");
    g = f.bwd; g.problem.heads_q = 5; BWD_FAIL(f, g, INVALID, "problem.heads_q (5) must be a multiple");
    fixture_free(&f);
}

/* Nothing to compute (no batch, no query heads, a forward without queries):
 * the check and the call succeed, whatever the tensors' pointers and
 * strides, and write nothing. A malformed scalar is still named. */
TEST(empty_problems) {
    fixture f;
    fixture_init(&f);
    for (int which = 0; which < 4; which++) {
        fa3c_fwd_params p = f.fwd;
        fa3c_bwd_params g = f.bwd;
        if (which == 0) p.problem.batch = g.problem.batch = 0;
        if (which == 1) p.problem.heads_q = p.problem.heads_kv = g.problem.heads_q = g.problem.heads_kv = 0;
        if (which == 2) p.problem.seqlen_q = 0;                 /* forward only: the backward's dk, dv are not empty */
        if (which == 3) p.problem.batch = g.problem.batch = 0, p.q.data = g.dq.data = NULL, p.q.stride[3] = 7;
        poison_outputs(&f, 0);
        FWD_OK(p);
        fa3c_status s = fa3c_fwd(&p, NULL);
        CHECK(s == OK, "case %d: fa3c_fwd -> %s (%s)", which, fa3c_status_string(s), fa3c_last_error());
        CHECK(outputs_untouched(&f, 0), "case %d: an empty forward wrote its outputs", which);
        if (which == 2) continue;
        poison_outputs(&f, 1);
        BWD_OK(g);
        s = fa3c_bwd(&g, NULL);
        CHECK(s == OK, "case %d: fa3c_bwd -> %s (%s)", which, fa3c_status_string(s), fa3c_last_error());
        CHECK(outputs_untouched(&f, 1), "case %d: an empty backward wrote its outputs", which);
    }
    fa3c_fwd_params p = f.fwd;
    p.problem.batch = 0;
    p.problem.headdim = 100;
    FWD_FAIL(f, p, INVALID, "problem.headdim");
    p = f.fwd;
    p.problem.batch = 0;
    p.backend = (fa3c_backend)9;
    FWD_FAIL(f, p, INVALID, "backend: unknown backend 9");
    fa3c_bwd_params g = f.bwd;
    g.problem.batch = 0;
    g.problem.dtype = FA3C_DTYPE_E4M3;
    BWD_FAIL(f, g, UNSUPPORTED, "E4M3 has no backward");
    fixture_free(&f);
}

/* The public structs' layout as the library reports it (for bindings). */
TEST(struct_layout) {
    CHECK(fa3c_struct_layout("fa3c_fwd_params", NULL) == (int64_t)sizeof(fa3c_fwd_params), "fwd size");
    CHECK(fa3c_struct_layout("fa3c_bwd_params", NULL) == (int64_t)sizeof(fa3c_bwd_params), "bwd size");
    CHECK(fa3c_struct_layout("fa3c_problem", NULL) == (int64_t)sizeof(fa3c_problem), "problem size");
    CHECK(fa3c_struct_layout("fa3c_tensor", NULL) == (int64_t)sizeof(fa3c_tensor), "tensor size");
    CHECK(fa3c_struct_layout("fa3c_append_params", NULL) == (int64_t)sizeof(fa3c_append_params), "append size");
    CHECK(fa3c_struct_layout("fa3c_quantize_params", NULL) == (int64_t)sizeof(fa3c_quantize_params), "quantize size");
    CHECK(fa3c_struct_layout("fa3c_quantize_params", "signs") == (int64_t)offsetof(fa3c_quantize_params, signs),
          "quantize signs offset");
    CHECK(fa3c_struct_layout("fa3c_append_params", "cache_seqlens") == (int64_t)offsetof(fa3c_append_params, cache_seqlens),
          "append cache_seqlens offset");
    CHECK(fa3c_struct_layout("fa3c_fwd_params", "backend") == (int64_t)offsetof(fa3c_fwd_params, backend), "fwd");
    CHECK(fa3c_struct_layout("fa3c_bwd_params", "dv") == (int64_t)offsetof(fa3c_bwd_params, dv), "bwd dv");
    CHECK(fa3c_struct_layout("fa3c_problem", "num_pages") == (int64_t)offsetof(fa3c_problem, num_pages), "pages");
    CHECK(fa3c_struct_layout("fa3c_problem", "nope") == -1, "unknown field");
    CHECK(fa3c_struct_layout("fa3c_nope", NULL) == -1, "unknown struct");
    CHECK(fa3c_struct_layout(NULL, NULL) == -1, "NULL type");
}

/* ---- head dimension ----------------------------------------------------------- */

TEST(headdim) {
    fixture f;
    fixture_init(&f);
    int bad[] = {0, -8, 4, 12, 100, 264, 512};
    for (int i = 0; i < 7; i++) {
        fa3c_fwd_params p = f.fwd;
        p.problem.headdim = bad[i];
        FWD_FAIL(f, p, INVALID, "problem.headdim: must be a multiple of 8 in [8, 256]");
        fa3c_bwd_params g = f.bwd;
        g.problem.headdim = bad[i];
        BWD_FAIL(f, g, INVALID, "problem.headdim");
    }
    fa3c_fwd_params p = f.fwd;
    p.problem.headdim = 100;
    fa3c_fwd_check(&p);
    CHECK(strcmp(fa3c_last_error(), "problem.headdim: must be a multiple of 8 in [8, 256] (got 100)") == 0, "'%s'",
          fa3c_last_error());
    /* Both ends of the range are valid (256 needs bigger buffers: shrink the problem). */
    int good[] = {8, 64, 136, 256};
    for (int i = 0; i < 4; i++) {
        p = f.fwd;
        int d = good[i];
        p.problem.batch = 1; p.problem.seqlen_q = 1; p.problem.seqlen_k = 1;
        p.problem.headdim = d;
        p.q = tu_tensor(f.q, 1, 1, HQ, d); p.out = tu_tensor(f.out, 1, 1, HQ, d);
        p.k = tu_tensor(f.k, 1, 1, HKV, d); p.v = tu_tensor(f.v, 1, 1, HKV, d);
        FWD_OK(p);
    }
    fixture_free(&f);
}

/* ---- strides, alignment, extents, aliasing --------------------------------------- */

TEST(strides) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p;
    p = f.fwd; p.k.stride[3] = 2; FWD_FAIL(f, p, INVALID, "k: stride of dim 3 must be 1 (got 2)");
    p = f.fwd; p.q.stride[3] = 0; FWD_FAIL(f, p, INVALID, "q: stride of dim 3 must be 1 (got 0)");
    p = f.fwd; p.v.stride[1] = -16; FWD_FAIL(f, p, INVALID, "v: stride of dim 1 must be >= 0 (got -16)");
    p = f.fwd; p.out.stride[0] = -1; FWD_FAIL(f, p, INVALID, "out: stride of dim 0");
    p = f.fwd; p.q.stride[2] = -1; FWD_FAIL(f, p, INVALID, "q: stride of dim 2");
    /* Inputs may broadcast (stride 0); outputs may not overlap themselves. */
    p = f.fwd; p.k.stride[0] = 0; p.v.stride[0] = 0; FWD_OK(p);
    p = f.fwd; p.out.stride[0] = 0; FWD_FAIL(f, p, INVALID, "out: stride of dim 0");
    p = f.fwd; p.out.stride[2] = 8; FWD_FAIL(f, p, INVALID, "out: stride of dim 2");
    /* Transposed (b, h, s, d) and packed QKV views are fine. */
    p = f.fwd;
    p.q.stride[2] = SQ * D; p.q.stride[1] = D;
    p.out.stride[2] = SQ * D; p.out.stride[1] = D;
    FWD_OK(p);
    p = f.fwd; /* q, k, v interleaved per token: (b, s, 3, h, d) with h = 2 */
    p.problem.heads_q = HKV;
    p.q.data = f.q; p.k.data = (uint16_t *)f.q + HKV * D; p.v.data = (uint16_t *)f.q + 2 * HKV * D;
    for (int i = 0; i < 3; i++) {
        fa3c_tensor *t = i == 0 ? &p.q : i == 1 ? &p.k : &p.v;
        t->stride[3] = 1; t->stride[2] = D; t->stride[1] = 3 * HKV * D; t->stride[0] = (int64_t)SK * 3 * HKV * D;
    }
    p.out = tu_tensor(f.out, B, SQ, HKV, D);
    FWD_OK(p);
    /* Element alignment. */
    p = f.fwd; p.q.data = (char *)f.q + 1; FWD_FAIL(f, p, INVALID, "q.data: must be aligned");
    p = f.fwd; p.problem.dtype = FA3C_DTYPE_FP32; p.v.data = (char *)f.v + 2; FWD_FAIL(f, p, INVALID, "v.data: must be aligned");
    p = f.fwd; p.lse = (float *)((char *)f.lse + 2); FWD_FAIL(f, p, INVALID, "lse: must be aligned");
    /* Offsets that overflow int64 (or the address space) are refused... */
    p = f.fwd; p.k.stride[0] = INT64_MAX / 2; FWD_FAIL(f, p, INVALID, "k: shape");
    p = f.fwd; p.q.stride[1] = (int64_t)1 << 62; FWD_FAIL(f, p, INVALID, "addressable range");
    /* ...but tensors past 2^31 elements are fine: indexing is int64 (check only, nothing is read). */
    p = f.fwd; p.k.stride[0] = (int64_t)1 << 33; p.v.stride[0] = (int64_t)1 << 33; FWD_OK(p);
    /* Outputs must not alias inputs. */
    p = f.fwd; p.out.data = f.q; FWD_FAIL(f, p, INVALID, "out.data: must not alias q");
    p = f.fwd; p.out.data = f.v; FWD_FAIL(f, p, INVALID, "out.data: must not alias v");
    p = f.fwd; p.lse = (float *)f.k; FWD_FAIL(f, p, INVALID, "must not alias k");
    /* ... nor overlap them anywhere when either is an array (the lse, metadata): a forward whose lse
     * was the memory of cu_seqlens_q used to pass the checks and crash the CPU backend. */
    p = f.fwd; p.lse = (float *)((uint16_t *)f.k + 8); FWD_FAIL(f, p, INVALID, "lse: must not overlap k");
    p = f.fwd; p.problem.cu_seqlens_q = f.cu_q; p.lse = (float *)f.cu_q;
    FWD_FAIL(f, p, INVALID, "lse: must not alias problem.cu_seqlens_q");
    p = f.fwd; p.problem.cu_seqlens_k = f.cu_k; p.lse = (float *)f.cu_k;
    FWD_FAIL(f, p, INVALID, "lse: must not alias problem.cu_seqlens_k");
    /* In buffers the forward does not poison (dk, dq), with valid prefix sums: only the overlap is wrong. */
    memcpy((char *)f.dk + 4, f.cu_q, sizeof f.cu_q);
    p = f.fwd; p.lse = (float *)f.dk; p.problem.cu_seqlens_q = (const int32_t *)((char *)f.dk + 4);
    FWD_FAIL(f, p, INVALID, "lse: must not overlap problem.cu_seqlens_q");
    memcpy(f.dq, f.cu_k, sizeof f.cu_k);
    p = f.fwd; p.out.data = f.dq; p.problem.cu_seqlens_k = (const int32_t *)f.dq;
    FWD_FAIL(f, p, INVALID, "out.data: must not alias problem.cu_seqlens_k");
    /* The check is by the elements a tensor touches, not its span: an array in the gap between an
     * output's rows (every other token slot) is fine, one inside a row is not. */
    {
        int32_t *gap = (int32_t *)((uint16_t *)f.dq + HQ * D), *inside = (int32_t *)((uint16_t *)f.dq + 2 * HQ * D + 8);
        memcpy(gap, f.cu_q, sizeof f.cu_q);
        memcpy(inside, f.cu_q, sizeof f.cu_q);
        p = f.fwd; p.out.data = f.dq; p.out.stride[1] = 2 * HQ * D; p.out.stride[0] = SQ * 2 * HQ * D;
        p.problem.cu_seqlens_q = gap;
        FWD_OK(p);
        p.problem.cu_seqlens_q = inside;
        FWD_FAIL(f, p, INVALID, "out.data: must not overlap problem.cu_seqlens_q");
    }

    fa3c_bwd_params g;
    g = f.bwd; g.dout.stride[3] = 4; BWD_FAIL(f, g, INVALID, "dout: stride of dim 3 must be 1 (got 4)");
    g = f.bwd; g.dk.stride[1] = -2; BWD_FAIL(f, g, INVALID, "dk: stride of dim 1");
    g = f.bwd; g.dv.stride[2] = 0; BWD_FAIL(f, g, INVALID, "dv: stride of dim 2");
    g = f.bwd; g.dq.data = f.q; BWD_FAIL(f, g, INVALID, "dq.data: must not alias q");
    g = f.bwd; g.dk.data = f.dv; BWD_FAIL(f, g, INVALID, "must not alias");
    g = f.bwd; g.lse = (float *)((uint16_t *)f.dq + 16); BWD_FAIL(f, g, INVALID, "dq.data: must not overlap lse");
    g = f.bwd; g.dv.data = (char *)f.dv + 1; BWD_FAIL(f, g, INVALID, "dv.data: must be aligned");
    fixture_free(&f);
}

/* ---- masks ---------------------------------------------------------------------- */

TEST(windows) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p;
    p = f.fwd; p.problem.window_left = -2; FWD_FAIL(f, p, INVALID, "problem.window_left: must be >= -1");
    p = f.fwd; p.problem.window_right = -5; FWD_FAIL(f, p, INVALID, "problem.window_right: must be >= -1, -1 = unbounded (got -5)");
    p = f.fwd; p.problem.causal = 2; FWD_FAIL(f, p, INVALID, "problem.causal: must be 0 or 1 (got 2)");
    p = f.fwd; p.problem.causal = -1; FWD_FAIL(f, p, INVALID, "problem.causal");
    p = f.fwd; p.problem.window_left = 0; p.problem.window_right = 0; FWD_OK(p);
    p = f.fwd; p.problem.window_left = 1000000; p.problem.causal = 1; FWD_OK(p);
    fa3c_bwd_params g;
    g = f.bwd; g.problem.window_left = -7; BWD_FAIL(f, g, INVALID, "problem.window_left");
    g = f.bwd; g.problem.causal = 3; BWD_FAIL(f, g, INVALID, "problem.causal");
    fixture_free(&f);
}

TEST(softcap_scale) {
    fixture f;
    fixture_init(&f);
    float bad_cap[] = {-1.0f, -0.0001f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        fa3c_fwd_params p = f.fwd;
        p.problem.softcap = bad_cap[i];
        FWD_FAIL(f, p, INVALID, "problem.softcap: must be finite and >= 0");
        fa3c_bwd_params g = f.bwd;
        g.problem.softcap = bad_cap[i];
        BWD_FAIL(f, g, INVALID, "problem.softcap");
    }
    float bad_scale[] = {-0.5f, NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 4; i++) {
        fa3c_fwd_params p = f.fwd;
        p.problem.softmax_scale = bad_scale[i];
        FWD_FAIL(f, p, INVALID, "problem.softmax_scale");
        fa3c_bwd_params g = f.bwd;
        g.problem.softmax_scale = bad_scale[i];
        BWD_FAIL(f, g, INVALID, "problem.softmax_scale");
    }
    fa3c_fwd_params p = f.fwd;
    p.problem.softcap = 30.0f;
    p.problem.softmax_scale = 0.0f; /* 0 = 1/sqrt(d) */
    FWD_OK(p);
    p.problem.softmax_scale = 0.125f;
    FWD_OK(p);
    fixture_free(&f);
}

/* ---- variable length --------------------------------------------------------------- */

TEST(varlen_arrays) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p;
    /* Valid: either array alone or both. */
    p = f.fwd; p.problem.cu_seqlens_q = f.cu_q; FWD_OK(p);
    p = f.fwd; p.problem.cu_seqlens_k = f.cu_k; FWD_OK(p);
    p = f.fwd; p.problem.cu_seqlens_q = f.cu_q; p.problem.cu_seqlens_k = f.cu_k; FWD_OK(p);
    /* Varlen ignores stride[0]: any value, even one that would overflow, is fine. */
    p = f.fwd; p.problem.cu_seqlens_q = f.cu_q; p.q.stride[0] = INT64_MAX; FWD_OK(p);

    int32_t a[B + 1];
    p = f.fwd; p.problem.cu_seqlens_q = a;
    a[0] = 1; a[1] = 3; a[2] = 5; FWD_FAIL(f, p, INVALID, "problem.cu_seqlens_q[0]: must be 0 (got 1)");
    a[0] = 0; a[1] = 4; a[2] = 2; FWD_FAIL(f, p, INVALID, "problem.cu_seqlens_q: must be non-decreasing");
    a[0] = 0; a[1] = 6; a[2] = 8; FWD_FAIL(f, p, INVALID, "problem.cu_seqlens_q: sequence 0 has length 6 > problem.seqlen_q (5)");
    a[0] = 0; a[1] = 0; a[2] = 0; FWD_OK(p); /* empty sequences are allowed */
    int32_t c[B + 1];
    p = f.fwd; p.problem.cu_seqlens_k = c;
    c[0] = -1; c[1] = 3; c[2] = 5; FWD_FAIL(f, p, INVALID, "problem.cu_seqlens_k[0]");
    c[0] = 0; c[1] = 3; c[2] = 11; FWD_FAIL(f, p, INVALID, "problem.cu_seqlens_k: sequence 1 has length 8 > problem.seqlen_k (7)");
    c[0] = 0; c[1] = 3; c[2] = 1; FWD_FAIL(f, p, INVALID, "problem.cu_seqlens_k: must be non-decreasing");
    p = f.fwd; p.problem.cu_seqlens_q = (const int32_t *)((const char *)f.cu_q + 2);
    FWD_FAIL(f, p, INVALID, "problem.cu_seqlens_q: must be aligned");

    fa3c_bwd_params g;
    g = f.bwd; g.problem.cu_seqlens_q = f.cu_q; g.problem.cu_seqlens_k = f.cu_k; BWD_OK(g);
    g = f.bwd; g.problem.cu_seqlens_q = a; a[0] = 0; a[1] = 4; a[2] = 3;
    BWD_FAIL(f, g, INVALID, "problem.cu_seqlens_q");
    g = f.bwd; g.problem.cu_seqlens_k = c; c[0] = 2; c[1] = 3; c[2] = 4;
    BWD_FAIL(f, g, INVALID, "problem.cu_seqlens_k[0]");
    /* Every packed sequence empty: those tensors touch no memory, so outputs that share their
     * address with them alias nothing (bwd_random_problems found this refused). */
    a[0] = a[1] = a[2] = 0;
    c[0] = c[1] = c[2] = 0;
    g = f.bwd; g.problem.cu_seqlens_q = a; g.problem.cu_seqlens_k = f.cu_k; g.dq.data = g.dk.data; BWD_OK(g);
    g = f.bwd; g.problem.cu_seqlens_k = c; g.dv.data = g.dk.data; BWD_OK(g);
    p = f.fwd; p.problem.cu_seqlens_q = a; p.out.data = p.q.data; FWD_OK(p);
    fixture_free(&f);
}

TEST(seqused_k) {
    fixture f;
    fixture_init(&f);
    int32_t u[B];
    fa3c_fwd_params p = f.fwd;
    p.problem.seqused_k = u;
    u[0] = 0; u[1] = SK; FWD_OK(p);
    u[0] = -1; u[1] = 2; FWD_FAIL(f, p, INVALID, "problem.seqused_k[0]: must be in [0, problem.seqlen_k = 7] (got -1)");
    u[0] = 3; u[1] = 8; FWD_FAIL(f, p, INVALID, "problem.seqused_k[1]");
    p.problem.seqused_k = (const int32_t *)((const char *)u + 1);
    FWD_FAIL(f, p, INVALID, "problem.seqused_k: must be aligned");
    fa3c_bwd_params g = f.bwd;
    g.problem.seqused_k = u;
    u[0] = 3; u[1] = 100; BWD_FAIL(f, g, INVALID, "problem.seqused_k[1]");
    u[0] = 3; u[1] = 4; BWD_OK(g);
    fixture_free(&f);
}

/* ---- paged KV ------------------------------------------------------------------------ */

/* k, v as 4 pages of 4 tokens; each sequence needs ceil(7/4) = 2 pages. */
static fa3c_fwd_params paged(fixture *f) {
    fa3c_fwd_params p = f->fwd;
    p.problem.page_table = f->pages;
    p.problem.page_size = 4;
    p.problem.num_pages = 4;
    p.problem.page_table_stride = 4;
    p.k = tu_tensor(f->k, 4, 4, HKV, D);
    p.v = tu_tensor(f->v, 4, 4, HKV, D);
    return p;
}

TEST(paging) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p;
    p = paged(&f); FWD_OK(p);
    p = paged(&f); p.problem.page_table_stride = 2; FWD_OK(p);
    p = paged(&f); p.problem.page_size = 0; FWD_FAIL(f, p, INVALID, "problem.page_size: must be >= 1");
    p = paged(&f); p.problem.page_size = -4; FWD_FAIL(f, p, INVALID, "problem.page_size");
    p = paged(&f); p.problem.num_pages = 0; FWD_FAIL(f, p, INVALID, "problem.num_pages: must be >= 1");
    p = paged(&f); p.problem.page_table_stride = 1;
    FWD_FAIL(f, p, INVALID, "problem.page_table_stride: must be >= ceil(seqlen_k / page_size) = 2 (got 1)");
    p = paged(&f); p.problem.num_pages = 3; /* the table refers to page 3 */
    FWD_FAIL(f, p, INVALID, "problem.page_table[1][0]: page 3 is out of range [0, problem.num_pages = 3)");
    p = paged(&f); p.problem.cu_seqlens_k = f.cu_k;
    FWD_FAIL(f, p, INVALID, "problem.page_table: cannot be combined with problem.cu_seqlens_k");
    int32_t t[B * 2] = {0, 1, 2, -1};
    p = paged(&f); p.problem.page_table = t; p.problem.page_table_stride = 2;
    FWD_FAIL(f, p, INVALID, "problem.page_table[1][1]: page -1 is out of range [0, problem.num_pages = 4)");
    /* Entries past a sequence's used keys are never read: -1 there is fine. */
    int32_t used[B] = {7, 4};
    p.problem.seqused_k = used;
    FWD_OK(p);
    /* Pages hold num_pages * page_size tokens: a paged k extent past int64 is refused. */
    p = paged(&f); p.k.stride[0] = INT64_MAX / 2; FWD_FAIL(f, p, INVALID, "k: shape");
    /* Paged varlen queries are fine. */
    p = paged(&f); p.problem.cu_seqlens_q = f.cu_q; FWD_OK(p);

    fa3c_bwd_params g = f.bwd;
    g.problem.page_table = f.pages;
    g.problem.page_size = 4;
    g.problem.num_pages = 4;
    g.problem.page_table_stride = 4;
    BWD_FAIL(f, g, UNSUPPORTED, "problem.page_table: paged KV is not supported in the backward");
    fixture_free(&f);
}

/* ---- fp8 descales ------------------------------------------------------------------- */

TEST(descales) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p;
    p = f.fwd; p.q_descale = f.descale; FWD_FAIL(f, p, INVALID, "q_descale: only valid with dtype E4M3 (dtype is BF16)");
    p = f.fwd; p.k_descale = f.descale; p.problem.dtype = FA3C_DTYPE_FP16; FWD_FAIL(f, p, INVALID, "k_descale: only valid with dtype E4M3");
    p = f.fwd; p.v_descale = f.descale; p.problem.dtype = FA3C_DTYPE_FP32; FWD_FAIL(f, p, INVALID, "v_descale");
    p = f.fwd; p.problem.dtype = FA3C_DTYPE_E4M3;
    p.q_descale = p.k_descale = p.v_descale = f.descale;
    FWD_OK(p);
    float bad[B * HKV] = {1, 1, 0, 1};
    p.k_descale = bad; FWD_FAIL(f, p, INVALID, "k_descale[2]: must be finite and > 0");
    bad[2] = NAN; FWD_FAIL(f, p, INVALID, "k_descale[2]");
    p.k_descale = f.descale; p.v_descale = (const float *)((const char *)f.descale + 1);
    FWD_FAIL(f, p, INVALID, "v_descale: must be aligned");

    /* Block descales: (batch, heads, one block of 128 rows) here, E4M3 only, finite and > 0. */
    float qb[B * HQ] = {1, 2, 1, 1, 1, 1, 1, 1}, kb[B * HKV] = {1, 1, 1, 1};
    p = f.fwd; p.q_block_descale = qb;
    FWD_FAIL(f, p, INVALID, "q_block_descale: only valid with dtype E4M3 (dtype is BF16)");
    p.problem.dtype = FA3C_DTYPE_E4M3; p.k_block_descale = p.v_block_descale = kb; FWD_OK(p);
    qb[7] = -1; FWD_FAIL(f, p, INVALID, "q_block_descale[7]: must be finite and > 0");
    qb[7] = 1; kb[1] = INFINITY; FWD_FAIL(f, p, INVALID, "k_block_descale[1]: must be finite and > 0");
    kb[1] = 1; p.v_block_descale = (const float *)((const char *)kb + 2);
    FWD_FAIL(f, p, INVALID, "v_block_descale: must be aligned");
    p.v_block_descale = kb; p.out.data = kb;   /* an output over the input arrays */
    FWD_FAIL(f, p, INVALID, "out.data: must not overlap");
    p = f.fwd; p.problem.dtype = FA3C_DTYPE_E4M3; p.k_block_descale = kb; p.backend = FA3C_BACKEND_CUDA;
    if (!fa3c_cuda_available()) FWD_FAIL(f, p, FA3C_STATUS_NO_DEVICE, "backend: CUDA");
    fixture_free(&f);
}

/* ---- backend choice ------------------------------------------------------------------- */

TEST(backend_enum) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p;
    p = f.fwd; p.backend = (fa3c_backend)-1; FWD_FAIL(f, p, INVALID, "backend: unknown backend -1");
    p = f.fwd; p.backend = (fa3c_backend)4; FWD_FAIL(f, p, INVALID, "backend: unknown backend 4");
    p = f.fwd; p.num_splits = -1; FWD_FAIL(f, p, INVALID, "num_splits: must be >= 0");
    p = f.fwd; p.num_splits = 7; FWD_OK(p);
    p = f.fwd; p.backend = FA3C_BACKEND_AUTO; FWD_OK(p); /* host memory -> CPU */
    p = f.fwd; p.backend = FA3C_BACKEND_CPU_REFERENCE; FWD_OK(p);
    p = f.fwd; p.backend = FA3C_BACKEND_CUDA;
    if (fa3c_cuda_available())
        FWD_FAIL(f, p, INVALID, "q is host memory; the CUDA backend needs device memory");
    else
        FWD_FAIL(f, p, FA3C_STATUS_NO_DEVICE, "backend: CUDA");

    fa3c_bwd_params g;
    g = f.bwd; g.backend = (fa3c_backend)17; BWD_FAIL(f, g, INVALID, "backend: unknown backend 17");
    g = f.bwd; g.backend = FA3C_BACKEND_AUTO; BWD_OK(g);
    g = f.bwd; g.backend = FA3C_BACKEND_CUDA;
    if (!fa3c_cuda_available()) BWD_FAIL(f, g, FA3C_STATUS_NO_DEVICE, "backend: CUDA");
    fixture_free(&f);
}

/* ---- backward-only parameters ------------------------------------------------------------ */

TEST(bwd_specific) {
    fixture f;
    fixture_init(&f);
    fa3c_bwd_params g;
    g = f.bwd; g.deterministic = 2; BWD_FAIL(f, g, INVALID, "deterministic: must be 0 or 1 (got 2)");
    g = f.bwd; g.deterministic = 1; BWD_OK(g);
    g = f.bwd; g.lse = NULL; BWD_FAIL(f, g, INVALID, "lse: is NULL");
    g = f.bwd; g.lse = (const float *)((const char *)f.lse + 1); BWD_FAIL(f, g, INVALID, "lse: must be aligned");
    g = f.bwd; g.dk = tu_tensor(f.dk, B, SK, HKV, D); g.dk.stride[1] = D; /* rows overlap heads */
    BWD_FAIL(f, g, INVALID, "dk: stride of dim");
    g = f.bwd; g.dq.data = f.dout; BWD_FAIL(f, g, INVALID, "dq.data: must not alias dout");
    g = f.bwd; g.dv.data = f.lse; BWD_FAIL(f, g, INVALID, "dv.data: must not alias lse");
    /* E4M3 and paging: valid requests the backward cannot serve. */
    g = f.bwd; g.problem.dtype = FA3C_DTYPE_E4M3; BWD_FAIL(f, g, UNSUPPORTED, "problem.dtype");
    /* A malformed request is named before an unsupported one. */
    g = f.bwd; g.problem.dtype = FA3C_DTYPE_E4M3; g.problem.headdim = 7; BWD_FAIL(f, g, INVALID, "problem.headdim");
    fixture_free(&f);
}

/* ---- check functions agree with the calls and never write ------------------------------- */

TEST(check_functions) {
    fixture f;
    fixture_init(&f);
    poison_outputs(&f, 0);
    CHECK(fa3c_fwd_check(&f.fwd) == OK, "%s", fa3c_last_error());
    CHECK(outputs_untouched(&f, 0), "fa3c_fwd_check wrote its outputs");
    poison_outputs(&f, 1);
    CHECK(fa3c_bwd_check(&f.bwd) == OK, "%s", fa3c_last_error());
    CHECK(outputs_untouched(&f, 1), "fa3c_bwd_check wrote its outputs");
    /* The check does not modify the params (scale stays 0 = default). */
    fa3c_fwd_params before = f.fwd;
    fa3c_fwd_check(&f.fwd);
    CHECK(memcmp(&before, &f.fwd, sizeof before) == 0, "fa3c_fwd_check modified its params");
    fixture_free(&f);
}

/* ---- small helpers ------------------------------------------------------------------------ */

TEST(status_strings) {
    struct { fa3c_status s; const char *want; } t[] = {
        {FA3C_STATUS_OK, "ok"},
        {FA3C_STATUS_INVALID_ARGUMENT, "invalid argument"},
        {FA3C_STATUS_NOT_SUPPORTED, "not supported"},
        {FA3C_STATUS_OUT_OF_MEMORY, "out of memory"},
        {FA3C_STATUS_NO_DEVICE, "no usable CUDA device"},
        {FA3C_STATUS_CUDA_ERROR, "CUDA error"},
        {FA3C_STATUS_INTERNAL_ERROR, "internal error"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        CHECK(strcmp(fa3c_status_string(t[i].s), t[i].want) == 0, "status %d -> '%s'", (int)t[i].s,
              fa3c_status_string(t[i].s));
    CHECK(strcmp(fa3c_status_string((fa3c_status)7), "unknown status") == 0, "7");
    CHECK(strcmp(fa3c_status_string((fa3c_status)-1), "unknown status") == 0, "-1");
    CHECK(fa3c_status_string((fa3c_status)123456) != NULL, "NULL");
}

TEST(version) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FA3C_VERSION_MAJOR, FA3C_VERSION_MINOR, FA3C_VERSION_PATCH);
    CHECK(strcmp(fa3c_version(), want) == 0, "'%s' vs '%s'", fa3c_version(), want);
    CHECK(strcmp(fa3c_version(), "0.7.0") == 0, "'%s'", fa3c_version());
    CHECK(FA3C_VERSION == 700, "%d", FA3C_VERSION);
}

TEST(params_init) {
    fa3c_fwd_params p;
    memset(&p, 0x7b, sizeof p);
    fa3c_fwd_params_init(&p);
    CHECK(p.problem.dtype == FA3C_DTYPE_BF16, "dtype %d", (int)p.problem.dtype);
    CHECK(p.problem.window_left == -1 && p.problem.window_right == -1, "windows %d %d", p.problem.window_left,
          p.problem.window_right);
    CHECK(p.problem.softmax_scale == 0 && p.problem.softcap == 0 && p.problem.causal == 0, "scalars");
    CHECK(p.backend == FA3C_BACKEND_AUTO && p.num_splits == 0, "backend/splits");
    CHECK(!p.lse && !p.q_descale && !p.k_descale && !p.v_descale && !p.q.data && !p.out.data, "pointers");
    CHECK(!p.problem.cu_seqlens_q && !p.problem.cu_seqlens_k && !p.problem.seqused_k && !p.problem.page_table, "varlen");
    fa3c_bwd_params g;
    memset(&g, 0x7b, sizeof g);
    fa3c_bwd_params_init(&g);
    CHECK(g.problem.dtype == FA3C_DTYPE_BF16 && g.problem.window_left == -1 && g.problem.window_right == -1, "problem");
    CHECK(g.backend == FA3C_BACKEND_AUTO && g.deterministic == 0 && !g.lse && !g.dq.data, "rest");
}

TEST(last_error_cleared) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p = f.fwd;
    p.problem.batch = -1;
    fa3c_fwd_check(&p);
    CHECK(fa3c_last_error()[0] != '\0', "no message after a failure");
    /* A query in between keeps the failure's message. */
    (void)fa3c_cuda_available();
    CHECK(strstr(fa3c_last_error(), "problem.batch") != NULL, "query cleared the message: '%s'", fa3c_last_error());
    CHECK(fa3c_fwd_check(&f.fwd) == OK, "%s", fa3c_last_error());
    CHECK(fa3c_last_error()[0] == '\0', "after a successful check: '%s'", fa3c_last_error());
    fa3c_fwd_check(&p);
    /* the fixture runs on the CPU backend, which implements every call: it must succeed */
    fa3c_status s = fa3c_fwd(&f.fwd, NULL);
    CHECK(s == OK, "fa3c_fwd on the CPU: %s (%s)", fa3c_status_string(s), fa3c_last_error());
    CHECK(fa3c_last_error()[0] == '\0', "after a successful fa3c_fwd: '%s'", fa3c_last_error());
    fixture_free(&f);
}

/* ---- the message is per thread ------------------------------------------------------------- */

static pthread_barrier_t barrier;

static void *thread_fail(void *arg) {
    fixture *f = arg;
    fa3c_fwd_params p = f->fwd;
    p.problem.headdim = 100;
    fa3c_fwd_check(&p); /* fail here ... */
    pthread_barrier_wait(&barrier);
    pthread_barrier_wait(&barrier); /* ... while the other thread fails differently and succeeds */
    return (void *)(intptr_t)(strstr(fa3c_last_error(), "problem.headdim") != NULL);
}

static void *thread_other(void *arg) {
    fixture *f = arg;
    pthread_barrier_wait(&barrier);
    fa3c_fwd_params p = f->fwd;
    p.problem.batch = -1;
    fa3c_fwd_check(&p);
    int ok = strstr(fa3c_last_error(), "problem.batch") != NULL;
    fa3c_fwd_check(&f->fwd);
    ok = ok && fa3c_last_error()[0] == '\0';
    pthread_barrier_wait(&barrier);
    return (void *)(intptr_t)ok;
}

TEST(thread_local_message) {
    fixture f;
    fixture_init(&f);
    pthread_barrier_init(&barrier, NULL, 2);
    pthread_t a, b;
    void *ra, *rb;
    pthread_create(&a, NULL, thread_fail, &f);
    pthread_create(&b, NULL, thread_other, &f);
    pthread_join(a, &ra);
    pthread_join(b, &rb);
    CHECK((intptr_t)ra == 1, "thread A's message changed by thread B's calls");
    CHECK((intptr_t)rb == 1, "thread B saw the wrong messages");
    pthread_barrier_destroy(&barrier);
    fixture_free(&f);
}

/* ---- positive smoke tests on the CPU --------------------------------------------------------- */

static void read_bf16(float *dst, const void *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tu_load(src, FA3C_DTYPE_BF16, i);
}

TEST(smoke_fwd_cpu) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p = f.fwd;
    p.problem.causal = 1;
    int64_t n = (int64_t)B * SQ * HQ * D, nl = (int64_t)B * HQ * SQ;
    float *ref = tu_alloc(n * 4), *got = tu_alloc(n * 4), *ref_lse = tu_alloc(nl * 4);
    tu_poison(f.out, BUF_BYTES);
    p.backend = FA3C_BACKEND_CPU_REFERENCE;
    fa3c_status s = fa3c_fwd(&p, NULL); /* the CPU backends implement everything: NOT_SUPPORTED fails */
    CHECK(s == OK, "reference: %s (%s)", fa3c_status_string(s), fa3c_last_error());
    read_bf16(ref, f.out, n);
    memcpy(ref_lse, f.lse, nl * 4);
    tu_poison(f.out, BUF_BYTES);
    tu_poison(f.lse, LSE_BYTES);
    p.backend = FA3C_BACKEND_CPU;
    s = fa3c_fwd(&p, NULL);
    CHECK(s == OK, "cpu: %s (%s)", fa3c_status_string(s), fa3c_last_error());
    CHECK(fa3c_last_error()[0] == '\0', "message after success: '%s'", fa3c_last_error());
    read_bf16(got, f.out, n);
    double err = tu_max_abs_err(got, ref, n), lerr = tu_max_abs_err(f.lse, ref_lse, nl);
    CHECK(err <= 2e-2, "out max err %g", err); /* a few bf16 ulps of O(1) values */
    CHECK(lerr <= 1e-4, "lse max err %g", lerr);
    free(ref); free(got); free(ref_lse);
    fixture_free(&f);
}

TEST(smoke_bwd_cpu) {
    fixture f;
    fixture_init(&f);
    fa3c_fwd_params p = f.fwd;
    p.backend = FA3C_BACKEND_CPU_REFERENCE;
    fa3c_status s = fa3c_fwd(&p, NULL); /* out and lse for the backward; NOT_SUPPORTED fails */
    CHECK(s == OK, "reference forward: %s (%s)", fa3c_status_string(s), fa3c_last_error());
    int64_t nq = (int64_t)B * SQ * HQ * D, nk = (int64_t)B * SK * HKV * D;
    float *ref = tu_alloc((nq + 2 * nk) * 4), *got = tu_alloc((nq + 2 * nk) * 4);
    fa3c_bwd_params g = f.bwd;
    for (int pass = 0; pass < 2; pass++) {
        g.backend = pass == 0 ? FA3C_BACKEND_CPU_REFERENCE : FA3C_BACKEND_CPU;
        tu_poison(f.dq, BUF_BYTES); tu_poison(f.dk, BUF_BYTES); tu_poison(f.dv, BUF_BYTES);
        s = fa3c_bwd(&g, NULL); /* the CPU backends implement everything: NOT_SUPPORTED fails */
        CHECK(s == OK, "pass %d: %s (%s)", pass, fa3c_status_string(s), fa3c_last_error());
        float *dst = pass == 0 ? ref : got;
        read_bf16(dst, f.dq, nq);
        read_bf16(dst + nq, f.dk, nk);
        read_bf16(dst + nq + nk, f.dv, nk);
    }
    double err = tu_max_abs_err(got, ref, nq + 2 * nk);
    CHECK(err <= 5e-2, "grad max err %g", err);
    free(ref); free(got);
    fixture_free(&f);
}

TEST_MAIN()
