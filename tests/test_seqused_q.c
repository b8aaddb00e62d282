/* problem.seqused_q (FA3's: queries used per sequence) on the CPU backends,
 * against calls that never see it: each sequence b alone, as a batch-1
 * problem of its first seqused_q[b] queries and its keys (tensors pointing
 * at its tokens). Packed sequences with one fully used, one cut short and
 * one with no query used; causal (the diagonal aligns to the used count),
 * a window, GQA; both backends, fp32. out and lse rows past the used
 * queries keep their poison; the backward writes zeros to their dq rows,
 * and dk, dv come from the used queries only. Plus the argument checks. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

enum { B = 3, HQ = 4, HK = 2, D = 64 };
static const int LQ[B] = {37, 64, 5}, LK[B] = {50, 64, 30}, USED[B] = {20, 64, 0};

typedef struct {
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
} bufs;

static void alloc_bufs(bufs *r, int64_t tq, int64_t tk) {
    r->q = tu_alloc(sizeof(float) * tq * HQ * D), r->dout = tu_alloc(sizeof(float) * tq * HQ * D);
    r->out = tu_alloc(sizeof(float) * tq * HQ * D), r->dq = tu_alloc(sizeof(float) * tq * HQ * D);
    r->lse = tu_alloc(sizeof(float) * tq * HQ);
    r->k = tu_alloc(sizeof(float) * tk * HK * D), r->v = tu_alloc(sizeof(float) * tk * HK * D);
    r->dk = tu_alloc(sizeof(float) * tk * HK * D), r->dv = tu_alloc(sizeof(float) * tk * HK * D);
}

static void free_bufs(bufs *r) {
    free(r->q), free(r->k), free(r->v), free(r->out), free(r->lse), free(r->dout), free(r->dq), free(r->dk), free(r->dv);
}

/* Forward then backward of pr over r (q-like tensors tq tokens, k-like tk). */
static int run(const fa3c_problem *pr, fa3c_backend be, bufs *r, int64_t bq, int64_t sq, int64_t bk, int64_t sk) {
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    f.problem = *pr;
    f.q = tu_tensor(r->q, bq, sq, HQ, D), f.k = tu_tensor(r->k, bk, sk, HK, D), f.v = tu_tensor(r->v, bk, sk, HK, D);
    f.out = tu_tensor(r->out, bq, sq, HQ, D);
    f.lse = r->lse;
    f.backend = be;
    fa3c_status s = fa3c_fwd(&f, NULL);
    CHECK(s == FA3C_STATUS_OK, "forward: %s", fa3c_last_error());
    if (s != FA3C_STATUS_OK) return 0;
    fa3c_bwd_params g;
    fa3c_bwd_params_init(&g);
    g.problem = *pr;
    g.q = f.q, g.k = f.k, g.v = f.v, g.out = f.out, g.lse = r->lse;
    g.dout = tu_tensor(r->dout, bq, sq, HQ, D), g.dq = tu_tensor(r->dq, bq, sq, HQ, D);
    g.dk = tu_tensor(r->dk, bk, sk, HK, D), g.dv = tu_tensor(r->dv, bk, sk, HK, D);
    g.backend = be;
    s = fa3c_bwd(&g, NULL);
    CHECK(s == FA3C_STATUS_OK, "backward: %s", fa3c_last_error());
    return s == FA3C_STATUS_OK;
}

static double diff(float a, float b) { return a != a || b != b ? INFINITY : fabs((double)a - b); }

static void check_case(int causal, int wl, int wr, fa3c_backend be) {
    int32_t cu_q[B + 1], cu_k[B + 1], used[B];
    tu_prefix_sums(LQ, B, cu_q);
    tu_prefix_sums(LK, B, cu_k);
    for (int b = 0; b < B; b++) used[b] = USED[b];
    const int64_t tq = cu_q[B], tk = cu_k[B];
    bufs r, one;
    alloc_bufs(&r, tq, tk);
    alloc_bufs(&one, 64, 64);
    tu_fill_normal(r.q, FA3C_DTYPE_FP32, tq * HQ * D, 1.0f);
    tu_fill_normal(r.k, FA3C_DTYPE_FP32, tk * HK * D, 1.0f);
    tu_fill_normal(r.v, FA3C_DTYPE_FP32, tk * HK * D, 1.0f);
    tu_fill_normal(r.dout, FA3C_DTYPE_FP32, tq * HQ * D, 1.0f);
    tu_poison(r.out, sizeof(float) * tq * HQ * D);
    tu_poison(r.lse, sizeof(float) * tq * HQ);
    tu_poison(r.dq, sizeof(float) * tq * HQ * D);
    fa3c_problem pr;
    memset(&pr, 0, sizeof pr);
    tu_problem_shape(&pr, FA3C_DTYPE_FP32, B, 64, 64, HQ, HK, D);
    pr.causal = causal, pr.window_left = wl, pr.window_right = wr;
    pr.cu_seqlens_q = cu_q, pr.cu_seqlens_k = cu_k, pr.seqused_q = used;
    if (!run(&pr, be, &r, 1, tq, 1, tk)) goto done;

    double e_out = 0, e_lse = 0, e_dq = 0, e_dkv = 0;
    int64_t untouched_bad = 0, dq_nonzero = 0;
    for (int b = 0; b < B; b++) {
        /* Sequence b alone: its used queries, its keys, copied to a batch-1 problem. */
        const int u = USED[b], nk = LK[b];
        memcpy(one.q, r.q + (int64_t)cu_q[b] * HQ * D, sizeof(float) * u * HQ * D);
        memcpy(one.dout, r.dout + (int64_t)cu_q[b] * HQ * D, sizeof(float) * u * HQ * D);
        memcpy(one.k, r.k + (int64_t)cu_k[b] * HK * D, sizeof(float) * nk * HK * D);
        memcpy(one.v, r.v + (int64_t)cu_k[b] * HK * D, sizeof(float) * nk * HK * D);
        fa3c_problem p1;
        memset(&p1, 0, sizeof p1);
        tu_problem_shape(&p1, FA3C_DTYPE_FP32, 1, u, nk, HQ, HK, D);
        p1.causal = causal, p1.window_left = wl, p1.window_right = wr;
        if (u > 0 && !run(&p1, FA3C_BACKEND_CPU_REFERENCE, &one, 1, u, 1, nk)) goto done;
        for (int i = 0; i < LQ[b]; i++)
            for (int h = 0; h < HQ; h++) {
                const int64_t row = ((int64_t)(cu_q[b] + i) * HQ + h) * D, lrow = (int64_t)h * tq + cu_q[b] + i;
                if (i < u) {
                    for (int c = 0; c < D; c++) {
                        e_out = fmax(e_out, diff(r.out[row + c], one.out[((int64_t)i * HQ + h) * D + c]));
                        e_dq = fmax(e_dq, diff(r.dq[row + c], one.dq[((int64_t)i * HQ + h) * D + c]));
                    }
                    e_lse = fmax(e_lse, diff(r.lse[lrow], one.lse[(int64_t)h * u + i]));
                } else {   /* not used: out and lse keep their poison, dq is zero */
                    uint32_t bits;
                    memcpy(&bits, &r.lse[lrow], 4);
                    untouched_bad += bits != 0xffffffffu;
                    for (int c = 0; c < D; c++) {
                        memcpy(&bits, &r.out[row + c], 4);
                        untouched_bad += bits != 0xffffffffu;
                        dq_nonzero += r.dq[row + c] != 0.0f;
                    }
                }
            }
        for (int64_t x = 0; x < (int64_t)nk * HK * D; x++) {   /* no used query: zero gradients */
            const int64_t at = (int64_t)cu_k[b] * HK * D + x;
            e_dkv = fmax(e_dkv, fmax(diff(r.dk[at], u ? one.dk[x] : 0.0f), diff(r.dv[at], u ? one.dv[x] : 0.0f)));
        }
    }
    const double tol = be == FA3C_BACKEND_CPU_REFERENCE ? 1e-6 : 2e-4;
    printf("  %s causal %d window (%d,%d): max err out %.2g lse %.2g dq %.2g dk/dv %.2g\n",
           be == FA3C_BACKEND_CPU ? "cpu" : "reference", causal, wl, wr, e_out, e_lse, e_dq, e_dkv);
    CHECK(e_out <= tol && e_lse <= tol && e_dq <= tol && e_dkv <= tol,
          "seqused_q against each sequence alone: out %g lse %g dq %g dk/dv %g (tolerance %g)", e_out, e_lse, e_dq,
          e_dkv, tol);
    CHECK(untouched_bad == 0, "%lld out / lse values written past seqused_q", (long long)untouched_bad);
    CHECK(dq_nonzero == 0, "%lld dq values past seqused_q are not zero", (long long)dq_nonzero);
done:
    free_bufs(&r);
    free_bufs(&one);
}

TEST(seqused_q_against_each_sequence_alone) {
    for (int be = 0; be < 2; be++) {
        const fa3c_backend backend = be ? FA3C_BACKEND_CPU_REFERENCE : FA3C_BACKEND_CPU;
        check_case(0, -1, -1, backend);
        check_case(1, -1, -1, backend);
        check_case(0, 12, 3, backend);
    }
}

TEST(seqused_q_checks) {
    int32_t cu[B + 1], used[B] = {1, 70, 0};
    tu_prefix_sums(LQ, B, cu);
    float *x = tu_alloc(sizeof(float) * cu[B] * HQ * D), *o = tu_alloc(sizeof(float) * cu[B] * HQ * D);
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    tu_problem_shape(&f.problem, FA3C_DTYPE_FP32, B, 64, 64, HQ, HK, D);
    f.problem.cu_seqlens_q = cu, f.problem.cu_seqlens_k = cu, f.problem.seqused_q = used;
    f.q = tu_tensor(x, 1, cu[B], HQ, D), f.k = f.v = tu_tensor(x, 1, cu[B], HK, D);
    f.out = tu_tensor(o, 1, cu[B], HQ, D);
    f.backend = FA3C_BACKEND_CPU;
    CHECK(fa3c_fwd_check(&f) == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "problem.seqused_q[1]"),
          "seqused_q past seqlen_q: want INVALID_ARGUMENT naming the entry, got: %s", fa3c_last_error());
    used[1] = -1;
    CHECK(fa3c_fwd_check(&f) == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "problem.seqused_q[1]"),
          "negative seqused_q: want INVALID_ARGUMENT naming the entry, got: %s", fa3c_last_error());
    free(x);
    free(o);
}

TEST_MAIN()
