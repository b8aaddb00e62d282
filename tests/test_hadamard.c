/* fa3c_hadamard_rotate_f32: against an explicit Sylvester matrix, orthogonality,
 * invariance of Q·Kᵀ under a shared signed rotation, outlier spreading, and
 * argument errors. */
#include <math.h>
#include "harness.h"
#include "testutil.h"

/* Sylvester H[i][j] = (-1)^popcount(i & j) */
static int hsign(int i, int j) { return __builtin_popcount((unsigned)(i & j)) & 1 ? -1 : 1; }

static float rand_sign(void) { return (tu_rand_u64() & 1) ? 1.0f : -1.0f; }

TEST(hadamard_matches_explicit_matrix) {
    for (int len = 1; len <= 256; len *= 2) {
        const int n = 3;
        float *x = (float *)tu_alloc(sizeof(float) * n * len), *x0 = (float *)tu_alloc(sizeof(float) * n * len),
              *sg = (float *)tu_alloc(sizeof(float) * len);
        for (int i = 0; i < n * len; i++) x0[i] = x[i] = (float)tu_normal();
        for (int j = 0; j < len; j++) sg[j] = rand_sign();
        const int use_signs = len != 8; /* len 8: the plain matrix */
        CHECK(fa3c_hadamard_rotate_f32(x, n, len, use_signs ? sg : NULL) == FA3C_STATUS_OK, "len %d", len);
        double err = 0;
        for (int r = 0; r < n; r++)
            for (int j = 0; j < len; j++) {
                double want = 0;
                for (int i = 0; i < len; i++) want += x0[r * len + i] * (use_signs ? sg[i] : 1.0f) * hsign(i, j);
                want /= sqrt((double)len);
                err = fmax(err, fabs(want - x[r * len + j]));
            }
        CHECK(err < 1e-5, "len %d: max err %g vs explicit H", len, err);
        free(x); free(x0); free(sg);
    }
    /* len 8, a unit vector: row i of H/sqrt(8) */
    float e[8] = {0, 0, 0, 1, 0, 0, 0, 0};
    fa3c_hadamard_rotate_f32(e, 1, 8, NULL);
    for (int j = 0; j < 8; j++) CHECK(fabsf(e[j] - hsign(3, j) / sqrtf(8.0f)) < 1e-7f, "e3 col %d = %g", j, e[j]);
}

TEST(hadamard_orthogonal_involution) {
    const int len = 128, n = 5;
    float *x = (float *)tu_alloc(sizeof(float) * n * len), *x0 = (float *)tu_alloc(sizeof(float) * n * len);
    float sg[128];
    for (int j = 0; j < len; j++) sg[j] = rand_sign();
    for (int i = 0; i < n * len; i++) x0[i] = x[i] = (float)tu_normal();
    fa3c_hadamard_rotate_f32(x, n, len, sg);
    for (int r = 0; r < n; r++) {
        double a = 0, b = 0;
        for (int j = 0; j < len; j++) {
            a += (double)x0[r * len + j] * x0[r * len + j];
            b += (double)x[r * len + j] * x[r * len + j];
        }
        CHECK(fabs(sqrt(a) - sqrt(b)) < 1e-5 * sqrt(a), "row %d: norm %g -> %g", r, sqrt(a), sqrt(b));
    }
    for (int i = 0; i < n * len; i++) x[i] = x0[i];
    fa3c_hadamard_rotate_f32(x, n, len, NULL);
    fa3c_hadamard_rotate_f32(x, n, len, NULL);
    CHECK(tu_max_abs_err(x, x0, n * len) < 1e-5, "H·H != I: err %g", tu_max_abs_err(x, x0, n * len));
    free(x); free(x0);
}

TEST(hadamard_preserves_qk) {
    const int len = 64, nq = 7, nk = 9;
    float q[7 * 64], k[9 * 64], q0[7 * 64], k0[9 * 64], sg[64];
    for (int j = 0; j < len; j++) sg[j] = rand_sign();
    for (int i = 0; i < nq * len; i++) q0[i] = q[i] = (float)tu_normal();
    for (int i = 0; i < nk * len; i++) k0[i] = k[i] = (float)tu_normal();
    q[5] = q0[5] = 40.0f; /* an outlier channel */
    fa3c_hadamard_rotate_f32(q, nq, len, sg);
    fa3c_hadamard_rotate_f32(k, nk, len, sg);
    double err = 0;
    for (int a = 0; a < nq; a++)
        for (int b = 0; b < nk; b++) {
            double s0 = 0, s1 = 0;
            for (int j = 0; j < len; j++) {
                s0 += (double)q0[a * len + j] * k0[b * len + j];
                s1 += (double)q[a * len + j] * k[b * len + j];
            }
            err = fmax(err, fabs(s0 - s1));
        }
    CHECK(err < 1e-4, "Q·Kᵀ changed by %g", err);
    /* the outlier is spread: row 0 now has no element above 40/sqrt(64) + a few sigma */
    float mx = 0;
    for (int j = 0; j < len; j++) mx = fmaxf(mx, fabsf(q[j]));
    CHECK(mx < 15.0f, "outlier not spread: max %g", mx);
}

TEST(hadamard_argument_errors) {
    float x[16] = {0};
    const int bad_len[6] = {0, -4, 3, 12, 512, 257};
    for (int i = 0; i < 6; i++) {
        CHECK(fa3c_hadamard_rotate_f32(x, 1, bad_len[i], NULL) == FA3C_STATUS_INVALID_ARGUMENT, "len %d accepted",
              bad_len[i]);
        CHECK(strlen(fa3c_last_error()) > 0, "no message for len %d", bad_len[i]);
    }
    CHECK(fa3c_hadamard_rotate_f32(NULL, 1, 8, NULL) == FA3C_STATUS_INVALID_ARGUMENT, "NULL x accepted");
    CHECK(strstr(fa3c_last_error(), "x") != NULL, "message: %s", fa3c_last_error());
    CHECK(fa3c_hadamard_rotate_f32(x, -1, 8, NULL) == FA3C_STATUS_INVALID_ARGUMENT, "n < 0 accepted");
    CHECK(fa3c_hadamard_rotate_f32(x, 0, 8, NULL) == FA3C_STATUS_OK, "n = 0 is a no-op");
    CHECK(strcmp(fa3c_last_error(), "") == 0, "message not cleared after success: %s", fa3c_last_error());
    float one[1] = {3.0f};
    CHECK(fa3c_hadamard_rotate_f32(one, 1, 1, NULL) == FA3C_STATUS_OK && one[0] == 3.0f, "len 1 is the identity");
    float signs[8] = {1, -1, 1, 1, 0.5f, 1, -1, 1}, y[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y0[8];
    memcpy(y0, y, sizeof y);
    CHECK(fa3c_hadamard_rotate_f32(y, 1, 8, signs) == FA3C_STATUS_INVALID_ARGUMENT, "sign 0.5 accepted");
    CHECK(strstr(fa3c_last_error(), "signs[4]") != NULL, "message: %s", fa3c_last_error());
    CHECK(memcmp(y, y0, sizeof y) == 0, "x modified by a refused call");
}

TEST_MAIN()
