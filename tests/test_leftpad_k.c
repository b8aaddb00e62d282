/* problem.leftpad_k (FA3's leftpad_k / cache_leftpad: a left-padded KV cache)
 * on the CPU backends, against calls that never see it: each sequence b
 * alone, as a batch-1 problem of its queries and its keys [leftpad_k[b], n)
 * copied out. The cache's layouts: (batch, seqlen_k) with seqused_k, packed
 * keys (cu_seqlens_k), pages; the padding rows hold NaN, which must reach no
 * output. One sequence without padding, one padded to its last key (no
 * keys: out 0, lse -inf). Causal (the diagonal aligns to the keys after the
 * padding), a window, GQA. Plus the argument checks, and the backward's
 * refusal. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

enum { B = 3, SQ = 6, SK = 64, HQ = 4, HK = 2, D = 32, PAGE = 16 };
static const int USED[B] = {50, 64, 30}, LEFTPAD[B] = {7, 0, 30};

enum { CONTIGUOUS, PACKED, PAGED };

static double diff(float a, float b) { return a != a || b != b ? INFINITY : fabs((double)a - b); }

static fa3c_status forward(const fa3c_problem *pr, fa3c_backend be, float *q, float *k, float *v, int64_t kb,
                           int64_t ks, float *out, float *lse) {
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    f.problem = *pr;
    f.q = tu_tensor(q, pr->batch, SQ, HQ, D);
    f.k = tu_tensor(k, kb, ks, HK, D), f.v = tu_tensor(v, kb, ks, HK, D);
    f.out = tu_tensor(out, pr->batch, SQ, HQ, D);
    f.lse = lse;
    f.backend = be;
    return fa3c_fwd(&f, NULL);
}

static void check_layout(int layout, int causal, int wl, int wr, fa3c_backend be) {
    /* The keys of sequence b live at cache row (b, j) (CONTIGUOUS), token cu[b] + j (PACKED), or
     * position j of its pages (PAGED: page b * 4 + (3 - j / PAGE), scattered). */
    int32_t used[B], leftpad[B], cu[B + 1], table[B * 4];
    for (int b = 0; b < B; b++) used[b] = USED[b], leftpad[b] = LEFTPAD[b];
    tu_prefix_sums(USED, B, cu);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < 4; i++) table[b * 4 + i] = b * 4 + (3 - i);
    const int64_t rows = layout == PACKED ? cu[B] : (int64_t)B * SK;   /* PAGED: 12 pages of 16 rows */
    float *q = tu_alloc(sizeof(float) * B * SQ * HQ * D), *out = tu_alloc(sizeof(float) * B * SQ * HQ * D);
    float *lse = tu_alloc(sizeof(float) * B * HQ * SQ);
    float *k = tu_alloc(sizeof(float) * rows * HK * D), *v = tu_alloc(sizeof(float) * rows * HK * D);
    float *k1 = tu_alloc(sizeof(float) * SK * HK * D), *v1 = tu_alloc(sizeof(float) * SK * HK * D);
    float *out1 = tu_alloc(sizeof(float) * SQ * HQ * D), *lse1 = tu_alloc(sizeof(float) * HQ * SQ);
    tu_fill_normal(q, FA3C_DTYPE_FP32, (int64_t)B * SQ * HQ * D, 1.0f);
    tu_fill_normal(k, FA3C_DTYPE_FP32, rows * HK * D, 1.0f);
    tu_fill_normal(v, FA3C_DTYPE_FP32, rows * HK * D, 1.0f);
    /* Where key position j of sequence b is, as a row of k / v. */
#define KEY_ROW(b, j)                                                                                  \
    (layout == CONTIGUOUS ? (int64_t)(b) * SK + (j)                                                    \
     : layout == PACKED   ? (int64_t)cu[b] + (j)                                                       \
                          : (int64_t)table[(b) * 4 + (j) / PAGE] * PAGE + (j) % PAGE)
    for (int b = 0; b < B; b++)   /* the padding: NaN */
        for (int j = 0; j < LEFTPAD[b]; j++)
            for (int x = 0; x < HK * D; x++) k[KEY_ROW(b, j) * HK * D + x] = v[KEY_ROW(b, j) * HK * D + x] = NAN;
    fa3c_problem pr;
    memset(&pr, 0, sizeof pr);
    tu_problem_shape(&pr, FA3C_DTYPE_FP32, B, SQ, SK, HQ, HK, D);
    pr.causal = causal, pr.window_left = wl, pr.window_right = wr;
    pr.leftpad_k = leftpad;
    if (layout == PACKED) pr.cu_seqlens_k = cu;
    else pr.seqused_k = used;
    if (layout == PAGED) pr.page_table = table, pr.page_table_stride = 4, pr.page_size = PAGE, pr.num_pages = B * 4;
    const int64_t kb = layout == PACKED ? 1 : layout == PAGED ? B * 4 : B, ks = layout == PACKED ? cu[B]
                                                                         : layout == PAGED ? PAGE : SK;
    fa3c_status s = forward(&pr, be, q, k, v, kb, ks, out, lse);
    CHECK(s == FA3C_STATUS_OK, "forward with leftpad_k: %s", fa3c_last_error());
    double e_out = 0, e_lse = 0;
    for (int b = 0; b < B && s == FA3C_STATUS_OK; b++) {
        const int nk = USED[b] - LEFTPAD[b];
        for (int j = 0; j < nk; j++) {
            memcpy(k1 + (int64_t)j * HK * D, k + KEY_ROW(b, LEFTPAD[b] + j) * HK * D, sizeof(float) * HK * D);
            memcpy(v1 + (int64_t)j * HK * D, v + KEY_ROW(b, LEFTPAD[b] + j) * HK * D, sizeof(float) * HK * D);
        }
        for (int64_t x = 0; x < (int64_t)SQ * HQ * D; x++) {
            const float *row = out + (int64_t)b * SQ * HQ * D;
            if (nk == 0) e_out = fmax(e_out, diff(row[x], 0.0f));
        }
        if (nk == 0) {   /* no keys: out 0, lse -inf */
            for (int x = 0; x < HQ * SQ; x++) e_lse = fmax(e_lse, lse[b * HQ * SQ + x] == -INFINITY ? 0.0 : INFINITY);
            continue;
        }
        fa3c_problem p1;
        memset(&p1, 0, sizeof p1);
        tu_problem_shape(&p1, FA3C_DTYPE_FP32, 1, SQ, nk, HQ, HK, D);
        p1.causal = causal, p1.window_left = wl, p1.window_right = wr;
        s = forward(&p1, FA3C_BACKEND_CPU_REFERENCE, q + (int64_t)b * SQ * HQ * D, k1, v1, 1, nk, out1, lse1);
        CHECK(s == FA3C_STATUS_OK, "sequence %d alone: %s", b, fa3c_last_error());
        for (int64_t x = 0; x < (int64_t)SQ * HQ * D; x++)
            e_out = fmax(e_out, diff(out[(int64_t)b * SQ * HQ * D + x], out1[x]));
        for (int x = 0; x < HQ * SQ; x++) {
            const float a = lse[b * HQ * SQ + x], w = lse1[x];
            e_lse = fmax(e_lse, a == w ? 0.0 : diff(a, w));   /* -inf == -inf: rows the window empties */
        }
    }
#undef KEY_ROW
    const double tol = be == FA3C_BACKEND_CPU_REFERENCE ? 1e-6 : 2e-4;
    printf("  %s %s causal %d window (%d,%d): max err out %.2g lse %.2g\n",
           be == FA3C_BACKEND_CPU ? "cpu" : "reference",
           layout == CONTIGUOUS ? "contiguous" : layout == PACKED ? "packed" : "paged", causal, wl, wr, e_out, e_lse);
    CHECK(e_out <= tol && e_lse <= tol, "leftpad_k against each sequence alone: out %g lse %g (tolerance %g)", e_out,
          e_lse, tol);
    free(q), free(out), free(lse), free(k), free(v), free(k1), free(v1), free(out1), free(lse1);
}

TEST(leftpad_k_against_each_sequence_alone) {
    for (int be = 0; be < 2; be++)
        for (int layout = CONTIGUOUS; layout <= PAGED; layout++) {
            const fa3c_backend backend = be ? FA3C_BACKEND_CPU_REFERENCE : FA3C_BACKEND_CPU;
            check_layout(layout, 0, -1, -1, backend);
            check_layout(layout, 1, -1, -1, backend);
            check_layout(layout, 0, 9, 2, backend);
        }
}

TEST(leftpad_k_checks) {
    int32_t used[B], leftpad[B];
    for (int b = 0; b < B; b++) used[b] = USED[b], leftpad[b] = LEFTPAD[b];
    static float buf[B * SK * HQ * D];
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    tu_problem_shape(&f.problem, FA3C_DTYPE_FP32, B, SQ, SK, HQ, HK, D);
    f.problem.seqused_k = used, f.problem.leftpad_k = leftpad;
    f.q = tu_tensor(buf, B, SQ, HQ, D), f.k = tu_tensor(buf, B, SK, HK, D), f.v = tu_tensor(buf, B, SK, HK, D);
    f.out = tu_tensor(buf + B * SQ * HQ * D, B, SQ, HQ, D);
    f.backend = FA3C_BACKEND_CPU;
    CHECK(fa3c_fwd_check(&f) == FA3C_STATUS_OK, "valid leftpad_k refused: %s", fa3c_last_error());
    leftpad[1] = 65;
    CHECK(fa3c_fwd_check(&f) == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "problem.leftpad_k[1]"),
          "leftpad_k past the keys: want INVALID_ARGUMENT naming the entry, got: %s", fa3c_last_error());
    leftpad[1] = 0, leftpad[2] = 31;   /* past seqused_k[2] = 30 */
    CHECK(fa3c_fwd_check(&f) == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "problem.leftpad_k[2]"),
          "leftpad_k past seqused_k: want INVALID_ARGUMENT naming the entry, got: %s", fa3c_last_error());
    leftpad[2] = -1;
    CHECK(fa3c_fwd_check(&f) == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "problem.leftpad_k[2]"),
          "negative leftpad_k: want INVALID_ARGUMENT naming the entry, got: %s", fa3c_last_error());
    leftpad[2] = 30;
    fa3c_bwd_params g;
    fa3c_bwd_params_init(&g);
    g.problem = f.problem;
    CHECK(fa3c_bwd_check(&g) == FA3C_STATUS_NOT_SUPPORTED && strstr(fa3c_last_error(), "leftpad_k"),
          "backward with leftpad_k: want NOT_SUPPORTED naming it, got: %s", fa3c_last_error());
}

TEST_MAIN()
