/* The e4m3 forward's block descales (fa3c_fwd_params.q_block_descale,
 * k_block_descale, v_block_descale) on the CPU backends, against the fp32
 * forward of the values they stand for: each e4m3 value times its (batch,
 * K/V head) descale and its row's block descale, written out here. A row's
 * block: query i's is i / 128, key j's (leftpad_k + j) / 128. Layouts: a
 * fixed-length batch, and packed sequences with left-padded keys; causal or
 * not; GQA. The block descales span 1/4 to 4, so a backend that ignored or
 * misplaced them is off by far more than bf16's rounding: the test checks
 * that as well, with the block descales left out. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

enum { B = 2, SQ = 300, SK = 300, HQ = 4, HK = 2, D = 64, BR = FA3C_FP8_BLOCK_ROWS };
enum { NBQ = (SQ + BR - 1) / BR, NBK = (SK + BR - 1) / BR };
static const int SEQ_Q[B] = {300, 170}, SEQ_K[B] = {290, 200}, LEFTPAD[B] = {5, 40};

typedef struct {
    int packed;   /* cu_seqlens_q / _k and leftpad_k; else a fixed-length batch */
    int causal;
} bcase;

/* The largest |a - b| over n outputs, relative to bf16's rounding of b: the
 * e4m3 path writes bf16, the fp32 twin fp32; anything past a few units is a
 * wrong descale. */
static double worst(const uint16_t *a, const float *b, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x = tu_bf16_to_float(a[i]), y = b[i];
        const double e = fabs(x - y) / (fabs(y) * 0x1p-8 + 1e-3);
        if (!(e <= w)) w = e;   /* NaN wins */
    }
    return w;
}

static double run_case(const bcase *c, fa3c_backend be, int drop_blocks) {
    int32_t cu_q[B + 1] = {0}, cu_k[B + 1] = {0}, leftpad[B];
    for (int b = 0; b < B; b++) {
        cu_q[b + 1] = cu_q[b] + SEQ_Q[b];
        cu_k[b + 1] = cu_k[b] + LEFTPAD[b] + SEQ_K[b];
        leftpad[b] = LEFTPAD[b];
    }
    /* Rows of q (tokens or batch x SQ) and of k / v (tokens, padding included, or batch x SK). */
    const int64_t rq = c->packed ? cu_q[B] : (int64_t)B * SQ, rk = c->packed ? cu_k[B] : (int64_t)B * SK;
    uint8_t *q8 = tu_alloc(rq * HQ * D), *k8 = tu_alloc(rk * HK * D), *v8 = tu_alloc(rk * HK * D);
    float *q = tu_alloc(sizeof(float) * rq * HQ * D), *k = tu_alloc(sizeof(float) * rk * HK * D);
    float *v = tu_alloc(sizeof(float) * rk * HK * D);
    uint16_t *out8 = tu_alloc(2 * rq * HQ * D);
    float *out = tu_alloc(sizeof(float) * rq * HQ * D);
    float qd[B * HK], kd[B * HK], vd[B * HK], qb[B * HQ * NBQ], kb[B * HK * NBK], vb[B * HK * NBK];
    for (int i = 0; i < B * HK; i++)
        qd[i] = (float)(0.5 + tu_uniform()), kd[i] = (float)(0.5 + tu_uniform()), vd[i] = (float)(0.5 + tu_uniform());
    for (int i = 0; i < B * HQ * NBQ; i++) qb[i] = (float)exp2(4 * tu_uniform() - 2);
    for (int i = 0; i < B * HK * NBK; i++) kb[i] = (float)exp2(4 * tu_uniform() - 2), vb[i] = (float)exp2(4 * tu_uniform() - 2);
    tu_fill_normal(q8, FA3C_DTYPE_E4M3, rq * HQ * D, 1.0f);
    tu_fill_normal(k8, FA3C_DTYPE_E4M3, rk * HK * D, 1.0f);
    tu_fill_normal(v8, FA3C_DTYPE_E4M3, rk * HK * D, 1.0f);
    /* The fp32 twin: what each stored value stands for. Query row r of sequence b is its
     * position i; key row r is position r - (the sequence's first row), leftpad included. */
    for (int b = 0; b < B; b++) {
        const int nq = c->packed ? SEQ_Q[b] : SQ, nk = c->packed ? LEFTPAD[b] + SEQ_K[b] : SK;
        const int64_t q0 = c->packed ? cu_q[b] : (int64_t)b * SQ, k0 = c->packed ? cu_k[b] : (int64_t)b * SK;
        for (int i = 0; i < nq; i++)
            for (int h = 0; h < HQ; h++) {
                const float m = qd[b * HK + h / (HQ / HK)] * qb[(b * HQ + h) * NBQ + i / BR];
                for (int x = 0; x < D; x++) {
                    const int64_t e = ((q0 + i) * HQ + h) * D + x;
                    q[e] = tu_load(q8, FA3C_DTYPE_E4M3, e) * m;
                }
            }
        for (int j = 0; j < nk; j++)
            for (int h = 0; h < HK; h++) {
                const float mk = kd[b * HK + h] * kb[(b * HK + h) * NBK + j / BR];
                const float mv = vd[b * HK + h] * vb[(b * HK + h) * NBK + j / BR];
                for (int x = 0; x < D; x++) {
                    const int64_t e = ((k0 + j) * HK + h) * D + x;
                    k[e] = tu_load(k8, FA3C_DTYPE_E4M3, e) * mk;
                    v[e] = tu_load(v8, FA3C_DTYPE_E4M3, e) * mv;
                }
            }
    }
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    fa3c_problem *pr = &f.problem;
    pr->dtype = FA3C_DTYPE_FP32, pr->batch = B, pr->seqlen_q = SQ, pr->seqlen_k = SK, pr->heads_q = HQ, pr->heads_kv = HK, pr->headdim = D;
    pr->causal = c->causal;
    if (c->packed) pr->cu_seqlens_q = cu_q, pr->cu_seqlens_k = cu_k, pr->leftpad_k = leftpad;
    f.backend = be;
    /* (batch, rows, heads, D); packed, stride[0] is ignored and the rows are tokens. */
    f.q = tu_tensor(q, B, SQ, HQ, D), f.k = tu_tensor(k, B, SK, HK, D), f.v = tu_tensor(v, B, SK, HK, D);
    f.out = tu_tensor(out, B, SQ, HQ, D);
    CHECK(fa3c_fwd(&f, NULL) == FA3C_STATUS_OK, "fp32 twin: %s", fa3c_last_error());
    pr->dtype = FA3C_DTYPE_E4M3;
    f.q.data = q8, f.k.data = k8, f.v.data = v8, f.out.data = out8;
    f.q_descale = qd, f.k_descale = kd, f.v_descale = vd;
    if (!drop_blocks) f.q_block_descale = qb, f.k_block_descale = kb, f.v_block_descale = vb;
    CHECK(fa3c_fwd(&f, NULL) == FA3C_STATUS_OK, "e4m3: %s", fa3c_last_error());
    const double w = worst(out8, out, rq * HQ * D);
    free(q8), free(k8), free(v8), free(q), free(k), free(v), free(out8), free(out);
    return w;
}

TEST(e4m3_block_descales_against_the_values_they_stand_for) {
    const bcase cases[] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
    for (int i = 0; i < 4; i++)
        for (int be = 0; be < 2; be++) {
            const fa3c_backend backend = be ? FA3C_BACKEND_CPU_REFERENCE : FA3C_BACKEND_CPU;
            const double w = run_case(&cases[i], backend, 0);
            printf("  %s %s, %s: max error %.2f bf16 units\n", cases[i].packed ? "packed, left-padded" : "fixed length",
                   cases[i].causal ? "causal" : "no mask", be ? "reference" : "cpu", w);
            CHECK(w <= 4, "packed %d causal %d backend %d: error %.2f bf16 units", cases[i].packed, cases[i].causal,
                  (int)backend, w);
        }
}

TEST(e4m3_block_descales_matter) {
    /* Without them the same call is far from the twin: the test above would see a lost descale. */
    const bcase c = {1, 0};
    const double w = run_case(&c, FA3C_BACKEND_CPU, 1);
    printf("  without the block descales: max error %.0f bf16 units\n", w);
    CHECK(w > 100, "without the block descales the error is only %.2f bf16 units", w);
}

TEST_MAIN()
