/* Attention sinks (problem.sinks, dsinks) on the CPU backends, against
 * identities that do not use the sink code:
 *   - the forward: a sink joins the softmax's denominator only, so with the
 *     same inputs lse_sink = log(exp(lse) + exp(sink)) and out_sink = out ·
 *     exp(lse - lse_sink), from a call without sinks (both backends);
 *   - rows that see no key: out 0, lse = sink; a -inf sink changes nothing;
 *   - the backward: dq, dk, dv of the tiled backend against the float64
 *     reference with sinks, and dsinks against central differences of
 *     L = Σ dout ⊙ out through the float64 reference forward;
 *   - the API: dsinks without sinks, and sinks or dsinks overlapping an
 *     output, are refused with a message. (The CUDA backend's NOT_SUPPORTED
 *     is in tests/gpu/test_bwd.cu, bwd_not_supported_is_reported.) */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

enum { B = 2, SQ = 70, SK = 90, HQ = 4, HK = 2, D = 32 };
enum { NQ = B * SQ * HQ * D, NK = B * SK * HK * D, NL = B * HQ * SQ };

typedef struct {
    float q[NQ], k[NK], v[NK], out[NQ], dout[NQ], lse[NL];
    float dq[NQ], dk[NK], dv[NK];
    float sinks[HQ], dsinks[HQ];
} bufs;

static fa3c_problem problem(int causal, int sq, const float *sinks) {
    fa3c_problem pr;
    memset(&pr, 0, sizeof pr);
    tu_problem_shape(&pr, FA3C_DTYPE_FP32, B, sq, SK, HQ, HK, D);
    pr.window_left = pr.window_right = -1;   /* no window (a zeroed struct means (0, 0)) */
    pr.causal = causal;
    pr.sinks = sinks;
    return pr;
}

static fa3c_status forward(bufs *b, fa3c_backend be, int causal, int sq, const float *sinks) {
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    p.problem = problem(causal, sq, sinks);
    p.q = tu_tensor(b->q, B, sq, HQ, D);
    p.k = tu_tensor(b->k, B, SK, HK, D);
    p.v = tu_tensor(b->v, B, SK, HK, D);
    p.out = tu_tensor(b->out, B, sq, HQ, D);
    p.lse = b->lse;
    p.backend = be;
    return fa3c_fwd(&p, NULL);
}

static fa3c_bwd_params bwd_params(bufs *b, fa3c_backend be, int causal, const float *sinks, float *dsinks) {
    fa3c_bwd_params p;
    fa3c_bwd_params_init(&p);
    p.problem = problem(causal, SQ, sinks);
    p.q = tu_tensor(b->q, B, SQ, HQ, D);
    p.k = tu_tensor(b->k, B, SK, HK, D);
    p.v = tu_tensor(b->v, B, SK, HK, D);
    p.out = tu_tensor(b->out, B, SQ, HQ, D);
    p.dout = tu_tensor(b->dout, B, SQ, HQ, D);
    p.lse = b->lse;
    p.dq = tu_tensor(b->dq, B, SQ, HQ, D);
    p.dk = tu_tensor(b->dk, B, SK, HK, D);
    p.dv = tu_tensor(b->dv, B, SK, HK, D);
    p.dsinks = dsinks;
    p.backend = be;
    return p;
}

static bufs *new_bufs(void) {
    bufs *b = (bufs *)tu_alloc(sizeof(bufs));
    tu_fill_normal(b->q, FA3C_DTYPE_FP32, NQ, 1.0f);
    tu_fill_normal(b->k, FA3C_DTYPE_FP32, NK, 1.0f);
    tu_fill_normal(b->v, FA3C_DTYPE_FP32, NK, 1.0f);
    tu_fill_normal(b->dout, FA3C_DTYPE_FP32, NQ, 1.0f);
    /* Around the scores' size, one far above them, one -inf (no sink). */
    const float sinks[HQ] = {(float)tu_normal(), 0.5f + (float)tu_normal(), 6.0f, -INFINITY};
    memcpy(b->sinks, sinks, sizeof sinks);
    return b;
}

static const char *backend_name(fa3c_backend be) { return be == FA3C_BACKEND_CPU ? "CPU" : "CPU reference"; }

TEST(forward_sink_joins_the_denominator) {
    bufs *b = new_bufs();
    static float out0[NQ], lse0[NL];
    for (int causal = 0; causal < 2; causal++)
        for (fa3c_backend be = FA3C_BACKEND_CPU; be <= FA3C_BACKEND_CPU_REFERENCE; be += 2) {
            CHECK(forward(b, be, causal, SQ, NULL) == FA3C_STATUS_OK, "forward: %s", fa3c_last_error());
            memcpy(out0, b->out, sizeof out0);
            memcpy(lse0, b->lse, sizeof lse0);
            tu_poison(b->out, sizeof b->out);
            tu_poison(b->lse, sizeof b->lse);
            CHECK(forward(b, be, causal, SQ, b->sinks) == FA3C_STATUS_OK, "forward with sinks: %s", fa3c_last_error());
            double e_out = 0, e_lse = 0;
            for (int bb = 0; bb < B; bb++)
                for (int h = 0; h < HQ; h++)
                    for (int i = 0; i < SQ; i++) {
                        const int64_t l = ((int64_t)bb * HQ + h) * SQ + i;
                        const double s = b->sinks[h], want_lse = s == -INFINITY ? lse0[l] : s > lse0[l]
                                             ? s + log1p(exp(lse0[l] - s)) : lse0[l] + log1p(exp(s - lse0[l]));
                        e_lse = fmax(e_lse, fabs(b->lse[l] - want_lse));
                        const double w = exp(lse0[l] - want_lse);
                        for (int c = 0; c < D; c++) {
                            const int64_t o = (((int64_t)bb * SQ + i) * HQ + h) * D + c;
                            e_out = fmax(e_out, fabs(b->out[o] - out0[o] * w));
                        }
                    }
            printf("  %s causal %d: max err out %.3g, lse %.3g\n", backend_name(be), causal, e_out, e_lse);
            CHECK(e_out <= 1e-5 && e_lse <= 1e-5, "%s causal %d: out err %.3g, lse err %.3g", backend_name(be),
                  causal, e_out, e_lse);
            /* -inf sinks everywhere: the call without sinks, bit for bit. */
            const float none[HQ] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
            CHECK(forward(b, be, causal, SQ, none) == FA3C_STATUS_OK, "forward: %s", fa3c_last_error());
            CHECK(memcmp(b->out, out0, sizeof out0) == 0 && memcmp(b->lse, lse0, sizeof lse0) == 0,
                  "%s causal %d: -inf sinks change the output", backend_name(be), causal);
        }
    free(b);
}

TEST(rows_without_keys_get_the_sink) {
    /* Causal with 200 queries over 90 keys: the first 110 rows see no key. */
    enum { SQL = 200 };
    float *q = (float *)tu_alloc(sizeof(float) * B * SQL * HQ * D), *out = (float *)tu_alloc(sizeof(float) * B * SQL * HQ * D);
    float *lse = (float *)tu_alloc(sizeof(float) * B * HQ * SQL);
    bufs *b = new_bufs();
    tu_fill_normal(q, FA3C_DTYPE_FP32, (int64_t)B * SQL * HQ * D, 1.0f);
    for (fa3c_backend be = FA3C_BACKEND_CPU; be <= FA3C_BACKEND_CPU_REFERENCE; be += 2) {
        fa3c_fwd_params p;
        fa3c_fwd_params_init(&p);
        p.problem = problem(1, SQL, b->sinks);
        p.q = tu_tensor(q, B, SQL, HQ, D);
        p.k = tu_tensor(b->k, B, SK, HK, D);
        p.v = tu_tensor(b->v, B, SK, HK, D);
        p.out = tu_tensor(out, B, SQL, HQ, D);
        p.lse = lse;
        p.backend = be;
        tu_poison(out, sizeof(float) * B * SQL * HQ * D);
        CHECK(fa3c_fwd(&p, NULL) == FA3C_STATUS_OK, "forward: %s", fa3c_last_error());
        int bad = 0;
        for (int bb = 0; bb < B; bb++)
            for (int h = 0; h < HQ; h++)
                for (int i = 0; i < SQL - SK; i++) {
                    const float l = lse[((int64_t)bb * HQ + h) * SQL + i];
                    bad += !(l == b->sinks[h]);
                    for (int c = 0; c < D; c++) bad += out[(((int64_t)bb * SQL + i) * HQ + h) * D + c] != 0.0f;
                }
        CHECK(bad == 0, "%s: %d values of rows without keys are not out 0, lse = sink", backend_name(be), bad);
    }
    free(q);
    free(out);
    free(lse);
    free(b);
}

/* L = Σ dout ⊙ out through the float64 reference forward, with head h's sink moved by delta. */
static double loss_with_sink(bufs *b, int causal, int h, double delta) {
    float s[HQ];
    memcpy(s, b->sinks, sizeof s);
    s[h] = (float)(s[h] + delta);
    static float out[NQ];
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    p.problem = problem(causal, SQ, s);
    p.q = tu_tensor(b->q, B, SQ, HQ, D);
    p.k = tu_tensor(b->k, B, SK, HK, D);
    p.v = tu_tensor(b->v, B, SK, HK, D);
    p.out = tu_tensor(out, B, SQ, HQ, D);
    p.backend = FA3C_BACKEND_CPU_REFERENCE;
    if (fa3c_fwd(&p, NULL) != FA3C_STATUS_OK) return NAN;
    double L = 0;
    for (int64_t i = 0; i < NQ; i++) L += (double)b->dout[i] * out[i];
    return L;
}

TEST(backward_with_sinks) {
    bufs *b = new_bufs();
    b->sinks[3] = -1.0f;   /* finite everywhere here: the differences need it */
    static float ref[2 * NQ + 2 * NK];
    float dsinks_ref[HQ];
    for (int causal = 0; causal < 2; causal++) {
        CHECK(forward(b, FA3C_BACKEND_CPU_REFERENCE, causal, SQ, b->sinks) == FA3C_STATUS_OK, "forward: %s",
              fa3c_last_error());
        fa3c_bwd_params p = bwd_params(b, FA3C_BACKEND_CPU_REFERENCE, causal, b->sinks, dsinks_ref);
        CHECK(fa3c_bwd(&p, NULL) == FA3C_STATUS_OK, "reference backward: %s", fa3c_last_error());
        memcpy(ref, b->dq, sizeof b->dq);
        memcpy(ref + NQ, b->dk, sizeof b->dk);
        memcpy(ref + NQ + NK, b->dv, sizeof b->dv);
        /* dsinks of the reference against central differences of the loss. */
        for (int h = 0; h < HQ; h++) {
            const double eps = 1e-2, fd = (loss_with_sink(b, causal, h, eps) - loss_with_sink(b, causal, h, -eps)) / (2 * eps);
            printf("  causal %d head %d: dsinks %.6f, central difference %.6f\n", causal, h, dsinks_ref[h], fd);
            CHECK(fabs(dsinks_ref[h] - fd) <= 1e-3 * (1 + fabs(fd)), "causal %d head %d: dsinks %.6g, differences %.6g",
                  causal, h, dsinks_ref[h], fd);
        }
        /* The tiled backend against the reference. */
        float dsinks[HQ];
        tu_poison(b->dq, sizeof b->dq);
        tu_poison(dsinks, sizeof dsinks);
        p = bwd_params(b, FA3C_BACKEND_CPU, causal, b->sinks, dsinks);
        CHECK(fa3c_bwd(&p, NULL) == FA3C_STATUS_OK, "backward: %s", fa3c_last_error());
        const double e_dq = tu_max_abs_err(b->dq, ref, NQ), e_dk = tu_max_abs_err(b->dk, ref + NQ, NK),
                     e_dv = tu_max_abs_err(b->dv, ref + NQ + NK, NK);
        double e_ds = 0;
        for (int h = 0; h < HQ; h++) e_ds = fmax(e_ds, fabs(dsinks[h] - dsinks_ref[h]) / (1 + fabs(dsinks_ref[h])));
        printf("  causal %d: max err dq %.3g dk %.3g dv %.3g, dsinks (relative) %.3g\n", causal, e_dq, e_dk, e_dv, e_ds);
        CHECK(e_dq <= 1e-4 && e_dk <= 1e-4 && e_dv <= 1e-4 && e_ds <= 1e-5,
              "causal %d: errors dq %.3g dk %.3g dv %.3g dsinks %.3g", causal, e_dq, e_dk, e_dv, e_ds);
        /* Without dsinks the gradients are the same. */
        static float dq1[NQ];
        memcpy(dq1, b->dq, sizeof dq1);
        p = bwd_params(b, FA3C_BACKEND_CPU, causal, b->sinks, NULL);
        CHECK(fa3c_bwd(&p, NULL) == FA3C_STATUS_OK, "backward without dsinks: %s", fa3c_last_error());
        CHECK(memcmp(dq1, b->dq, sizeof dq1) == 0, "causal %d: dq differs without dsinks", causal);
    }
    free(b);
}

TEST(sink_arguments_are_checked) {
    bufs *b = new_bufs();
    CHECK(forward(b, FA3C_BACKEND_CPU, 0, SQ, b->sinks) == FA3C_STATUS_OK, "forward: %s", fa3c_last_error());
    fa3c_bwd_params p = bwd_params(b, FA3C_BACKEND_CPU, 0, NULL, b->dsinks);
    fa3c_status s = fa3c_bwd_check(&p);
    CHECK(s == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "dsinks"),
          "dsinks without sinks: status %d (%s)", (int)s, fa3c_last_error());
    p = bwd_params(b, FA3C_BACKEND_CPU, 0, b->sinks, b->dq + 5);   /* dsinks inside dq */
    s = fa3c_bwd_check(&p);
    CHECK(s == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "dsinks"),
          "dsinks overlapping dq: status %d (%s)", (int)s, fa3c_last_error());
    p = bwd_params(b, FA3C_BACKEND_CPU, 0, b->sinks, b->sinks);   /* dsinks over the sinks */
    s = fa3c_bwd_check(&p);
    CHECK(s == FA3C_STATUS_INVALID_ARGUMENT, "dsinks over sinks: status %d (%s)", (int)s, fa3c_last_error());
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    f.problem = problem(0, SQ, b->out + 7);   /* sinks inside the output */
    f.q = tu_tensor(b->q, B, SQ, HQ, D);
    f.k = tu_tensor(b->k, B, SK, HK, D);
    f.v = tu_tensor(b->v, B, SK, HK, D);
    f.out = tu_tensor(b->out, B, SQ, HQ, D);
    f.backend = FA3C_BACKEND_CPU;
    s = fa3c_fwd_check(&f);
    CHECK(s == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "sinks"),
          "sinks overlapping out: status %d (%s)", (int)s, fa3c_last_error());
    free(b);
}

TEST_MAIN()
