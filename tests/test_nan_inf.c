/* NaN and inf in the inputs reach the outputs where the float64 reference
 * puts them, on the CPU backend, forward and backward: a NaN key or query
 * must never look like a fully masked row (out 0, lse -inf) or vanish behind
 * the other keys; fully masked is decided by the key range.
 * One difference is allowed, and documented (docs/API.md): a NaN or inf in
 * the K or V row of a key that a row's mask hides may still reach that row
 * when the key shares a block with keys the row sees (0 · NaN in the block's
 * GEMM), as in FlashAttention. So the masked (causal) cases check only that
 * nothing is hidden: NaN wherever the reference has NaN, and the reference's
 * value (finite or infinite) wherever the backend's is not NaN. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "harness.h"
#include "fa3c.h"

enum { B = 1, S = 150, H = 2, D = 64, N = B * S * H * D, NL = B * H * S };

typedef struct {
    float q[N], k[N], v[N], out[N], dout[N], lse[NL];
    float dq[N], dk[N], dv[N];
} bufs;

static fa3c_tensor tensor(void *data) {
    fa3c_tensor t = {data, {S * H * D, H * D, D, 1}};
    return t;
}

static void fill(float *x, int n, unsigned *seed) {
    for (int i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

static fa3c_problem problem(int causal) {
    fa3c_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.dtype = FA3C_DTYPE_FP32;
    pr.batch = B;
    pr.seqlen_q = pr.seqlen_k = S;
    pr.heads_q = pr.heads_kv = H;
    pr.headdim = D;
    pr.causal = causal;
    pr.window_left = pr.window_right = -1;
    return pr;
}

static fa3c_status forward(bufs *b, fa3c_backend be, int causal) {
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    p.problem = problem(causal);
    p.q = tensor(b->q), p.k = tensor(b->k), p.v = tensor(b->v), p.out = tensor(b->out);
    p.lse = b->lse;
    p.backend = be;
    return fa3c_fwd(&p, NULL);
}

static fa3c_status backward(bufs *b, fa3c_backend be, int causal) {
    fa3c_bwd_params p;
    fa3c_bwd_params_init(&p);
    p.problem = problem(causal);
    p.q = tensor(b->q), p.k = tensor(b->k), p.v = tensor(b->v), p.out = tensor(b->out), p.dout = tensor(b->dout);
    p.dq = tensor(b->dq), p.dk = tensor(b->dk), p.dv = tensor(b->dv);
    p.lse = b->lse;
    p.backend = be;
    return fa3c_bwd(&p, NULL);
}

/* a against the reference b: NaN and infinities where b has them, and close
 * where b is finite; with `masked`, a may also be NaN where b is not (the
 * masked keys' 0 · inf). */
static int same_pattern(const char *what, const float *a, const float *b, int n, double tol, int masked) {
    int nan = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        nan += isnan(b[i]);
        const int allowed = masked && isnan(a[i]) && !isnan(b[i]);
        const int ok = allowed || (isnan(a[i]) == isnan(b[i]) && isinf(a[i]) == isinf(b[i]) &&
                                   (!isfinite(b[i]) || fabs((double)a[i] - b[i]) <= tol * (1 + fabs((double)b[i]))));
        if (!ok && bad++ < 3) printf("    %s[%d]: %g, reference %g\n", what, i, (double)a[i], (double)b[i]);
    }
    printf("  %s: %d NaN in the reference, %d mismatches\n", what, nan, bad);
    return bad;
}

/* One poisoned input element (NaN or inf) at `at` of q, k or v. */
static void run(const char *name, int which, int at, float value, int causal) {
    printf("[%s]\n", name);
    static bufs ref, cpu;
    unsigned seed = 7;
    fill(ref.q, N, &seed), fill(ref.k, N, &seed), fill(ref.v, N, &seed), fill(ref.dout, N, &seed);
    (which == 0 ? ref.q : which == 1 ? ref.k : ref.v)[at] = value;
    memcpy(&cpu, &ref, sizeof ref);
    CHECK(forward(&ref, FA3C_BACKEND_CPU_REFERENCE, causal) == FA3C_STATUS_OK, "reference forward: %s", fa3c_last_error());
    CHECK(forward(&cpu, FA3C_BACKEND_CPU, causal) == FA3C_STATUS_OK, "forward: %s", fa3c_last_error());
    int bad = same_pattern("out", cpu.out, ref.out, N, 1e-4, causal) +
              same_pattern("lse", cpu.lse, ref.lse, NL, 1e-4, causal);
    /* The backward from the reference forward's out and lse on both sides. */
    memcpy(cpu.out, ref.out, sizeof ref.out);
    memcpy(cpu.lse, ref.lse, sizeof ref.lse);
    CHECK(backward(&ref, FA3C_BACKEND_CPU_REFERENCE, causal) == FA3C_STATUS_OK, "reference backward: %s",
          fa3c_last_error());
    CHECK(backward(&cpu, FA3C_BACKEND_CPU, causal) == FA3C_STATUS_OK, "backward: %s", fa3c_last_error());
    bad += same_pattern("dq", cpu.dq, ref.dq, N, 1e-3, causal) + same_pattern("dk", cpu.dk, ref.dk, N, 1e-3, causal) +
           same_pattern("dv", cpu.dv, ref.dv, N, 1e-3, causal);
    CHECK(bad == 0, "%s: %d elements where the CPU backend and the reference disagree on NaN/inf or value", name, bad);
}

TEST(nan_key) { run("NaN in key 37, head 0", 1, (37 * H + 0) * D + 5, NAN, 0); }

TEST(nan_key_causal) { run("NaN in key 37, causal", 1, (37 * H + 1) * D, NAN, 1); }

TEST(nan_query) { run("NaN in query 3, head 1", 0, (3 * H + 1) * D + 9, NAN, 0); }

TEST(nan_value) { run("NaN in value 120", 2, (120 * H + 0) * D + 63, NAN, 0); }

TEST(inf_key) { run("inf in key 80", 1, (80 * H + 0) * D + 2, INFINITY, 0); }

TEST(inf_value) { run("-inf in value 10, causal", 2, (10 * H + 1) * D + 7, -INFINITY, 1); }

TEST_MAIN()
