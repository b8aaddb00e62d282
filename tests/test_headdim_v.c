/* A value head dim other than the key head dim (problem.headdim_v: MLA's
 * 192 / 128, absorbed decode's 64 / 512) on the CPU backends, against
 * identities that use only the equal-dims path:
 *   - dv < d: v zero-padded to d columns gives the same attention, so out
 *     and lse equal the padded call's first dv columns, and so do dq, dk and
 *     dv's first dv columns (dout padded with zeros);
 *   - dv > d: q and k zero-padded to dv columns leave every score unchanged
 *     (softmax_scale given explicitly), so out, lse and dv equal the padded
 *     call's, dq and dk its first d columns;
 * for both backends (tiled and float64 reference), fp32 and bf16, causal,
 * GQA and packed sequences; plus the argument checks. And qv (absorbed
 * decode's q·kᵀ + qv·vᵀ) against float64 sums. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

enum { B = 2, SQ = 50, SK = 70, HQ = 4, HK = 2 };

typedef struct {
    fa3c_dtype dt;
    int d, dv, causal, packed;
} vcase;

/* x (rows of w columns) into y (rows of W >= w columns, zeros after w). */
static void pad(void *y, const void *x, fa3c_dtype dt, int64_t rows, int w, int W) {
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < W; c++) tu_store(y, dt, r * W + c, c < w ? tu_load(x, dt, r * w + c) : 0.0f);
}

/* The first w of every W columns of a and b: the largest difference. */
static double max_diff_cols(const void *a, int wa, const void *b, int wb, fa3c_dtype dt, int64_t rows, int w) {
    double e = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < w; c++) {
            const double x = tu_load(a, dt, r * wa + c), y = tu_load(b, dt, r * wb + c);
            e = fmax(e, x != x || y != y ? INFINITY : fabs(x - y));
        }
    return e;
}

/* Forward and backward of one problem; lens (packed) or NULL. */
typedef struct {
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
} run_bufs;

static fa3c_problem problem_of(const vcase *c, int d, int dv, const int32_t *cu_q, const int32_t *cu_k) {
    fa3c_problem pr;
    memset(&pr, 0, sizeof pr);
    tu_problem_shape(&pr, c->dt, B, SQ, SK, HQ, HK, d);
    pr.window_left = pr.window_right = -1;
    pr.causal = c->causal;
    pr.headdim_v = dv == d ? 0 : dv;
    pr.softmax_scale = (float)(1.0 / sqrt((double)c->d));   /* the unpadded q's, for both calls */
    pr.cu_seqlens_q = cu_q;
    pr.cu_seqlens_k = cu_k;
    return pr;
}

static int run(const vcase *c, fa3c_backend be, int d, int dv, run_bufs *r, const int32_t *cu_q, const int32_t *cu_k) {
    const int64_t bq = c->packed ? 1 : B, sq = c->packed ? cu_q[B] : SQ, bk = c->packed ? 1 : B, sk = c->packed ? cu_k[B] : SK;
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    f.problem = problem_of(c, d, dv, cu_q, cu_k);
    f.q = tu_tensor(r->q, bq, sq, HQ, d);
    f.k = tu_tensor(r->k, bk, sk, HK, d);
    f.v = tu_tensor(r->v, bk, sk, HK, dv);
    f.out = tu_tensor(r->out, bq, sq, HQ, dv);
    f.lse = r->lse;
    f.backend = be;
    fa3c_status s = fa3c_fwd(&f, NULL);
    CHECK(s == FA3C_STATUS_OK, "forward d %d dv %d: %s", d, dv, fa3c_last_error());
    if (s != FA3C_STATUS_OK) return 0;
    fa3c_bwd_params g;
    fa3c_bwd_params_init(&g);
    g.problem = f.problem;
    g.q = f.q, g.k = f.k, g.v = f.v, g.out = f.out;
    g.dout = tu_tensor(r->dout, bq, sq, HQ, dv);
    g.lse = r->lse;
    g.dq = tu_tensor(r->dq, bq, sq, HQ, d);
    g.dk = tu_tensor(r->dk, bk, sk, HK, d);
    g.dv = tu_tensor(r->dv, bk, sk, HK, dv);
    g.backend = be;
    s = fa3c_bwd(&g, NULL);
    CHECK(s == FA3C_STATUS_OK, "backward d %d dv %d: %s", d, dv, fa3c_last_error());
    return s == FA3C_STATUS_OK;
}

static void *alloc_t(fa3c_dtype dt, int64_t n) { return tu_alloc((size_t)n * tu_dtype_size(dt)); }

static void check_case(const vcase *c) {
    const int lq[B] = {SQ, 23}, lk[B] = {37, SK};
    int32_t cu_q[B + 1], cu_k[B + 1];
    tu_prefix_sums(lq, B, cu_q);
    tu_prefix_sums(lk, B, cu_k);
    const int32_t *cq = c->packed ? cu_q : NULL, *ck = c->packed ? cu_k : NULL;
    const int64_t rq = (c->packed ? cu_q[B] : (int64_t)B * SQ) * HQ, rk = (c->packed ? cu_k[B] : (int64_t)B * SK) * HK;
    const int W = c->d > c->dv ? c->d : c->dv;   /* the padded call's head dim */
    const fa3c_dtype dt = c->dt;
    run_bufs x, y;   /* x: d / dv; y: W / W */
    x.q = alloc_t(dt, rq * c->d), x.k = alloc_t(dt, rk * c->d), x.v = alloc_t(dt, rk * c->dv);
    x.out = alloc_t(dt, rq * c->dv), x.dout = alloc_t(dt, rq * c->dv), x.dq = alloc_t(dt, rq * c->d);
    x.dk = alloc_t(dt, rk * c->d), x.dv = alloc_t(dt, rk * c->dv), x.lse = (float *)tu_alloc(sizeof(float) * rq);
    y.q = alloc_t(dt, rq * W), y.k = alloc_t(dt, rk * W), y.v = alloc_t(dt, rk * W), y.out = alloc_t(dt, rq * W);
    y.dout = alloc_t(dt, rq * W), y.dq = alloc_t(dt, rq * W), y.dk = alloc_t(dt, rk * W), y.dv = alloc_t(dt, rk * W);
    y.lse = (float *)tu_alloc(sizeof(float) * rq);
    tu_fill_normal(x.q, dt, rq * c->d, 1.0f);
    tu_fill_normal(x.k, dt, rk * c->d, 1.0f);
    tu_fill_normal(x.v, dt, rk * c->dv, 1.0f);
    tu_fill_normal(x.dout, dt, rq * c->dv, 1.0f);
    pad(y.q, x.q, dt, rq, c->d, W);
    pad(y.k, x.k, dt, rk, c->d, W);
    pad(y.v, x.v, dt, rk, c->dv, W);
    pad(y.dout, x.dout, dt, rq, c->dv, W);
    for (fa3c_backend be = FA3C_BACKEND_CPU; be <= FA3C_BACKEND_CPU_REFERENCE; be += 2) {
        tu_poison(x.out, (size_t)rq * c->dv * tu_dtype_size(dt));   /* every output, both calls: each backend */
        tu_poison(x.dq, (size_t)rq * c->d * tu_dtype_size(dt));     /* must write them all itself */
        tu_poison(x.dk, (size_t)rk * c->d * tu_dtype_size(dt));
        tu_poison(x.dv, (size_t)rk * c->dv * tu_dtype_size(dt));
        tu_poison(x.lse, sizeof(float) * rq);
        tu_poison(y.out, (size_t)rq * W * tu_dtype_size(dt));
        tu_poison(y.dq, (size_t)rq * W * tu_dtype_size(dt));
        tu_poison(y.dk, (size_t)rk * W * tu_dtype_size(dt));
        tu_poison(y.dv, (size_t)rk * W * tu_dtype_size(dt));
        tu_poison(y.lse, sizeof(float) * rq);
        if (!run(c, be, c->d, c->dv, &x, cq, ck) || !run(c, be, W, W, &y, cq, ck)) break;
        /* Same sums over the same numbers (zeros added): equal up to the order of a float sum. */
        const double tol = dt == FA3C_DTYPE_FP32 ? 1e-5 : 2e-2;
        const double e_out = max_diff_cols(x.out, c->dv, y.out, W, dt, rq, c->dv);
        const double e_dq = max_diff_cols(x.dq, c->d, y.dq, W, dt, rq, c->d);
        const double e_dk = max_diff_cols(x.dk, c->d, y.dk, W, dt, rk, c->d);
        const double e_dv = max_diff_cols(x.dv, c->dv, y.dv, W, dt, rk, c->dv);
        double e_lse = 0;
        for (int64_t i = 0; i < rq / HQ * HQ; i++) e_lse = fmax(e_lse, fabs(x.lse[i] - y.lse[i]));
        printf("  %s %s d %d dv %d causal %d packed %d: out %.3g lse %.3g dq %.3g dk %.3g dv %.3g\n",
               be == FA3C_BACKEND_CPU ? "CPU" : "CPU reference", tu_dtype_name(dt), c->d, c->dv, c->causal,
               c->packed, e_out, e_lse, e_dq, e_dk, e_dv);
        CHECK(e_out <= tol && e_lse <= 1e-5 && e_dq <= tol && e_dk <= tol && e_dv <= tol,
              "d %d dv %d: differences out %.3g lse %.3g dq %.3g dk %.3g dv %.3g", c->d, c->dv, e_out, e_lse, e_dq,
              e_dk, e_dv);
    }
    void *all[] = {x.q, x.k, x.v, x.out, x.dout, x.dq, x.dk, x.dv, x.lse, y.q, y.k, y.v, y.out, y.dout, y.dq, y.dk, y.dv,
                   y.lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* columns [c0, c0 + w) of x (rows of W columns) into y (rows of w). */
static void take_cols(float *y, const float *x, int64_t rows, int W, int c0, int w) {
    for (int64_t r = 0; r < rows; r++) memcpy(y + r * w, x + r * W + c0, sizeof(float) * w);
}

/* dv a multiple of d, fp32: v and dout cut into dv / d slices of d columns;
 * each slice's equal-dims call gives out's and dv's columns, the same lse,
 * and dq, dk are the slices' sums (dS is linear in dP and D, both sums over
 * the columns). */
static void check_sliced(const vcase *c) {
    const int d = c->d, dv = c->dv, n = dv / d;
    const int64_t rq = (int64_t)B * SQ * HQ, rk = (int64_t)B * SK * HK;
    run_bufs x, y;
    x.q = alloc_t(FA3C_DTYPE_FP32, rq * d), x.k = alloc_t(FA3C_DTYPE_FP32, rk * d);
    x.v = alloc_t(FA3C_DTYPE_FP32, rk * dv), x.out = alloc_t(FA3C_DTYPE_FP32, rq * dv);
    x.dout = alloc_t(FA3C_DTYPE_FP32, rq * dv), x.dq = alloc_t(FA3C_DTYPE_FP32, rq * d);
    x.dk = alloc_t(FA3C_DTYPE_FP32, rk * d), x.dv = alloc_t(FA3C_DTYPE_FP32, rk * dv);
    x.lse = (float *)tu_alloc(sizeof(float) * rq);
    y = x;
    y.v = alloc_t(FA3C_DTYPE_FP32, rk * d), y.out = alloc_t(FA3C_DTYPE_FP32, rq * d);
    y.dout = alloc_t(FA3C_DTYPE_FP32, rq * d), y.dq = alloc_t(FA3C_DTYPE_FP32, rq * d);
    y.dk = alloc_t(FA3C_DTYPE_FP32, rk * d), y.dv = alloc_t(FA3C_DTYPE_FP32, rk * d);
    y.lse = (float *)tu_alloc(sizeof(float) * rq);
    float *sum_dq = (float *)tu_alloc(sizeof(float) * rq * d), *sum_dk = (float *)tu_alloc(sizeof(float) * rk * d);
    float *col = (float *)tu_alloc(sizeof(float) * (rq > rk ? rq : rk) * d);
    tu_fill_normal(x.q, FA3C_DTYPE_FP32, rq * d, 1.0f);
    tu_fill_normal(x.k, FA3C_DTYPE_FP32, rk * d, 1.0f);
    tu_fill_normal(x.v, FA3C_DTYPE_FP32, rk * dv, 1.0f);
    tu_fill_normal(x.dout, FA3C_DTYPE_FP32, rq * dv, 1.0f);
    for (fa3c_backend be = FA3C_BACKEND_CPU; be <= FA3C_BACKEND_CPU_REFERENCE; be += 2) {
        if (!run(c, be, d, dv, &x, NULL, NULL)) break;
        memset(sum_dq, 0, sizeof(float) * rq * d);
        memset(sum_dk, 0, sizeof(float) * rk * d);
        double e_out = 0, e_dv = 0, e_lse = 0, e_dq = 0, e_dk = 0;
        for (int sl = 0; sl < n; sl++) {
            take_cols((float *)y.v, (const float *)x.v, rk, dv, sl * d, d);
            take_cols((float *)y.dout, (const float *)x.dout, rq, dv, sl * d, d);
            if (!run(c, be, d, d, &y, NULL, NULL)) break;
            take_cols(col, (const float *)x.out, rq, dv, sl * d, d);
            e_out = fmax(e_out, tu_max_abs_err(col, (const float *)y.out, rq * d));
            take_cols(col, (const float *)x.dv, rk, dv, sl * d, d);
            e_dv = fmax(e_dv, tu_max_abs_err(col, (const float *)y.dv, rk * d));
            e_lse = fmax(e_lse, tu_max_abs_err(x.lse, y.lse, rq));
            for (int64_t i = 0; i < rq * d; i++) sum_dq[i] += ((const float *)y.dq)[i];
            for (int64_t i = 0; i < rk * d; i++) sum_dk[i] += ((const float *)y.dk)[i];
        }
        e_dq = tu_max_abs_err((const float *)x.dq, sum_dq, rq * d);
        e_dk = tu_max_abs_err((const float *)x.dk, sum_dk, rk * d);
        printf("  %s fp32 d %d dv %d causal %d, %d slices: out %.3g lse %.3g dq %.3g dk %.3g dv %.3g\n",
               be == FA3C_BACKEND_CPU ? "CPU" : "CPU reference", d, dv, c->causal, n, e_out, e_lse, e_dq, e_dk, e_dv);
        CHECK(e_out <= 1e-5 && e_lse <= 1e-5 && e_dq <= 1e-4 && e_dk <= 1e-4 && e_dv <= 1e-5,
              "d %d dv %d: differences out %.3g lse %.3g dq %.3g dk %.3g dv %.3g", d, dv, e_out, e_lse, e_dq, e_dk, e_dv);
    }
    void *all[] = {x.q, x.k, x.v, x.out, x.dout, x.dq, x.dk, x.dv, x.lse, y.v, y.out, y.dout, y.dq, y.dk, y.dv, y.lse,
                   sum_dq, sum_dk, col};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

TEST(value_head_dim_smaller) {   /* MLA prefill: q, k 192, v 128 */
    const vcase cases[] = {{FA3C_DTYPE_FP32, 192, 128, 0, 0}, {FA3C_DTYPE_FP32, 192, 128, 1, 1},
                           {FA3C_DTYPE_BF16, 192, 128, 1, 0}, {FA3C_DTYPE_FP32, 40, 16, 0, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

TEST(value_head_dim_larger) {
    /* Padding q and k (up to 256 columns). */
    const vcase padded[] = {{FA3C_DTYPE_FP32, 64, 192, 0, 1}, {FA3C_DTYPE_BF16, 24, 40, 1, 0}};
    for (size_t i = 0; i < sizeof padded / sizeof padded[0]; i++) check_case(&padded[i]);
    /* Absorbed MLA decode's 64 / 512, by slices of v. */
    const vcase sliced[] = {{FA3C_DTYPE_FP32, 64, 512, 0, 0}, {FA3C_DTYPE_FP32, 64, 512, 1, 0}};
    for (size_t i = 0; i < sizeof sliced / sizeof sliced[0]; i++) check_sliced(&sliced[i]);
}

/* qv (absorbed MLA decode): out and lse against float64 sums written here,
 * scores scale · (q·kᵀ + qv·vᵀ); the default scale is 1/sqrt(d + dv). */
typedef struct {
    fa3c_dtype dt;
    int d, dv, hq, hk, sq, sk, causal;
} qvcase;

static void check_qv(const qvcase *c) {
    const int d = c->d, dv = c->dv, g = c->hq / c->hk;
    const int64_t nq = (int64_t)B * c->sq * c->hq, nk = (int64_t)B * c->sk * c->hk;
    const fa3c_dtype dt = c->dt;
    void *q = alloc_t(dt, nq * d), *qv = alloc_t(dt, nq * dv), *k = alloc_t(dt, nk * d), *v = alloc_t(dt, nk * dv);
    void *out = alloc_t(dt, nq * dv), *out0 = alloc_t(dt, nq * dv);
    float *lse = (float *)tu_alloc(sizeof(float) * nq), *lse0 = (float *)tu_alloc(sizeof(float) * nq);
    double *s = (double *)tu_alloc(sizeof(double) * c->sk);
    tu_fill_normal(q, dt, nq * d, 1.0f);
    tu_fill_normal(qv, dt, nq * dv, 1.0f);
    tu_fill_normal(k, dt, nk * d, 1.0f);
    tu_fill_normal(v, dt, nk * dv, 1.0f);
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    tu_problem_shape(&f.problem, dt, B, c->sq, c->sk, c->hq, c->hk, d);
    f.problem.headdim_v = dv;
    f.problem.causal = c->causal;
    f.q = tu_tensor(q, B, c->sq, c->hq, d);
    f.qv = tu_tensor(qv, B, c->sq, c->hq, dv);
    f.k = tu_tensor(k, B, c->sk, c->hk, d);
    f.v = tu_tensor(v, B, c->sk, c->hk, dv);
    const double scale = 1.0 / sqrt((double)(d + dv));
    for (fa3c_backend be = FA3C_BACKEND_CPU; be <= FA3C_BACKEND_CPU_REFERENCE; be += 2) {
        f.backend = be;
        f.problem.softmax_scale = 0;   /* the default */
        f.out = tu_tensor(out, B, c->sq, c->hq, dv);
        f.lse = lse;
        tu_poison(out, (size_t)nq * dv * tu_dtype_size(dt));
        tu_poison(lse, sizeof(float) * nq);
        CHECK(fa3c_fwd(&f, NULL) == FA3C_STATUS_OK, "qv forward: %s", fa3c_last_error());
        f.problem.softmax_scale = (float)scale;   /* the same, given */
        f.out = tu_tensor(out0, B, c->sq, c->hq, dv);
        f.lse = lse0;
        CHECK(fa3c_fwd(&f, NULL) == FA3C_STATUS_OK, "qv forward, scale given: %s", fa3c_last_error());
        double e_out = 0, e_lse = 0, same = 1;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < c->hq; h++)
                for (int i = 0; i < c->sq; i++) {
                    const int64_t qi = ((int64_t)(b * c->sq + i) * c->hq + h);
                    const int last = c->causal ? i + c->sk - c->sq : c->sk - 1;   /* bottom-right causal */
                    double m = -INFINITY, sum = 0;
                    for (int j = 0; j <= last; j++) {
                        const int64_t kj = ((int64_t)(b * c->sk + j) * c->hk + h / g);
                        double x = 0;
                        for (int e = 0; e < d; e++) x += (double)tu_load(q, dt, qi * d + e) * tu_load(k, dt, kj * d + e);
                        for (int e = 0; e < dv; e++) x += (double)tu_load(qv, dt, qi * dv + e) * tu_load(v, dt, kj * dv + e);
                        s[j] = x * scale;
                        m = fmax(m, s[j]);
                    }
                    for (int j = 0; j <= last; j++) sum += exp(s[j] - m);
                    e_lse = fmax(e_lse, fabs(lse[b * c->hq * c->sq + h * c->sq + i] - (m + log(sum))));
                    for (int e = 0; e < dv; e++) {
                        double o = 0;
                        for (int j = 0; j <= last; j++)
                            o += exp(s[j] - m) / sum * tu_load(v, dt, ((int64_t)(b * c->sk + j) * c->hk + h / g) * dv + e);
                        const double got = tu_load(out, dt, qi * dv + e);
                        e_out = fmax(e_out, got != got ? INFINITY : fabs(got - o));
                        same = same && tu_load(out0, dt, qi * dv + e) == got;
                    }
                }
        for (int64_t i = 0; i < nq; i++) same = same && lse[i] == lse0[i];
        const double tol = dt == FA3C_DTYPE_FP32 ? 2e-5 : 3e-2;
        printf("  %s %s qv d %d dv %d heads %d/%d sq %d sk %d causal %d: out %.3g lse %.3g\n",
               be == FA3C_BACKEND_CPU ? "CPU" : "CPU reference", tu_dtype_name(dt), d, dv, c->hq, c->hk, c->sq, c->sk,
               c->causal, e_out, e_lse);
        CHECK(e_out <= tol && e_lse <= 1e-4, "qv: out off by %.3g, lse by %.3g", e_out, e_lse);
        CHECK(same, "qv: softmax_scale 0 is not 1/sqrt(d + dv)");
    }
    void *all[] = {q, qv, k, v, out, out0, lse, lse0, s};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

TEST(qv_absorbed_decode) {
    const qvcase cases[] = {{FA3C_DTYPE_FP32, 64, 512, 16, 1, 1, 150, 0}, {FA3C_DTYPE_BF16, 64, 512, 8, 1, 3, 90, 1},
                            {FA3C_DTYPE_FP16, 32, 64, 4, 2, 20, 40, 1}, {FA3C_DTYPE_FP32, 16, 24, 2, 2, 9, 70, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_qv(&cases[i]);
}

TEST(qv_is_checked) {
    uint8_t buf[6 * 64];
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, FA3C_DTYPE_E4M3, 1, 1, 1, 1, 1, 16);
    p.problem.headdim_v = 32;
    p.q = tu_tensor(buf, 1, 1, 1, 16);
    p.k = tu_tensor(buf + 64, 1, 1, 1, 16);
    p.v = tu_tensor(buf + 128, 1, 1, 1, 32);
    p.out = tu_tensor(buf + 192, 1, 1, 1, 32);   /* bf16: 64 bytes */
    p.qv = tu_tensor(buf + 256, 1, 1, 1, 32);
    p.backend = FA3C_BACKEND_CPU;
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_NOT_SUPPORTED && strstr(fa3c_last_error(), "qv"), "qv with E4M3: %s",
          fa3c_last_error());
    p.problem.dtype = FA3C_DTYPE_BF16;   /* 2-byte elements: q 32 bytes, v, out, qv 64 */
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_OK, "qv bf16: %s", fa3c_last_error());
    p.qv = tu_tensor(buf + 192, 1, 1, 1, 32);   /* out's own address */
    fa3c_status s = fa3c_fwd_check(&p);
    CHECK(s == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "qv"), "qv aliasing out: status %d (%s)",
          (int)s, fa3c_last_error());
    p.qv = tu_tensor(buf + 258, 1, 1, 1, 32);
    p.qv.stride[3] = 2;
    s = fa3c_fwd_check(&p);
    CHECK(s == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "qv"), "qv with stride 2: status %d (%s)",
          (int)s, fa3c_last_error());
}

TEST(headdim_v_is_checked) {
    float buf[64];
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, FA3C_DTYPE_FP32, 1, 1, 1, 1, 1, 16);
    p.q = tu_tensor(buf, 1, 1, 1, 16);
    p.k = tu_tensor(buf + 16, 1, 1, 1, 16);
    p.v = tu_tensor(buf + 32, 1, 1, 1, 8);
    p.out = tu_tensor(buf + 48, 1, 1, 1, 8);
    p.backend = FA3C_BACKEND_CPU;
    const int bad[] = {-8, 4, 12, 520};
    for (int i = 0; i < 4; i++) {
        p.problem.headdim_v = bad[i];
        fa3c_status s = fa3c_fwd_check(&p);
        CHECK(s == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "headdim_v"), "headdim_v %d: status %d (%s)",
              bad[i], (int)s, fa3c_last_error());
    }
    p.problem.headdim_v = 8;
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_OK, "headdim_v 8: %s", fa3c_last_error());
    /* The lse just past out's 8 columns: no overlap (16 columns would overlap it). */
    p.v = tu_tensor(buf + 48, 1, 1, 1, 8);
    p.out = tu_tensor(buf + 32, 1, 1, 1, 8);
    p.lse = buf + 40;
    CHECK(fa3c_fwd_check(&p) == FA3C_STATUS_OK, "lse just after out: %s", fa3c_last_error());
    p.lse = buf + 39;   /* now on out's last column */
    fa3c_status s = fa3c_fwd_check(&p);
    CHECK(s == FA3C_STATUS_INVALID_ARGUMENT && strstr(fa3c_last_error(), "lse"), "lse overlapping out: status %d (%s)",
          (int)s, fa3c_last_error());
}

TEST_MAIN()
