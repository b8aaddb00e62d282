/* CPU backend timing: fa3c_cpu_fwd / fa3c_cpu_bwd on one shape.
 *   cpu_bench [batch seqlen heads hdim causal dtype(0..3) bwd(0/1) reps]
 * Defaults: 1 4096 16 128 0 2 (bf16) 0 1. FLOPs as in ARCHITECTURE.md:
 * 4·b·h·s·s·d forward (halved when causal), 2.5x that for backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "backend.h"
#include "../tests/testutil.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    int b = 1, s = 4096, h = 16, d = 128, causal = 0, dt = 2, bwd = 0, reps = 1;
    if (argc > 1) b = atoi(argv[1]);
    if (argc > 2) s = atoi(argv[2]);
    if (argc > 3) h = atoi(argv[3]);
    if (argc > 4) d = atoi(argv[4]);
    if (argc > 5) causal = atoi(argv[5]);
    if (argc > 6) dt = atoi(argv[6]);
    if (argc > 7) bwd = atoi(argv[7]);
    if (argc > 8) reps = atoi(argv[8]);
    const fa3c_dtype t = (fa3c_dtype)dt, ot = t == FA3C_DTYPE_E4M3 ? FA3C_DTYPE_BF16 : t;
    const int64_t n = (int64_t)b * s * h * d;
    const size_t es = tu_dtype_size(t), oes = tu_dtype_size(ot);
    void *q = tu_alloc(es * n), *k = tu_alloc(es * n), *v = tu_alloc(es * n), *o = tu_alloc(oes * n);
    float *lse = (float *)tu_alloc(sizeof(float) * b * h * s);
    tu_fill_normal(q, t, n, 1.0f);
    tu_fill_normal(k, t, n, 1.0f);
    tu_fill_normal(v, t, n, 1.0f);
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, t, b, s, s, h, h, d);
    p.problem.softmax_scale = (float)(1.0 / sqrt((double)d));
    p.problem.causal = causal;
    p.q = tu_tensor(q, b, s, h, d);
    p.k = tu_tensor(k, b, s, h, d);
    p.v = tu_tensor(v, b, s, h, d);
    p.out = tu_tensor(o, b, s, h, d);
    p.lse = lse;
    double flop = 4.0 * b * h * (double)s * s * d * (causal ? 0.5 : 1.0), best = 1e30;
    if (!bwd) {
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            if (fa3c_cpu_fwd(&p) != FA3C_STATUS_OK) return 1;
            double dtm = now() - t0;
            if (dtm < best) best = dtm;
        }
        printf("cpu fwd b=%d s=%d h=%d d=%d causal=%d %s: %.3f s, %.1f GFLOP/s (%.1f GFLOP)\n", b, s, h, d, causal,
               tu_dtype_name(t), best, flop / best * 1e-9, flop * 1e-9);
    } else {
        if (fa3c_cpu_fwd(&p) != FA3C_STATUS_OK) return 1;
        void *dout = tu_alloc(es * n), *dq = tu_alloc(es * n), *dk = tu_alloc(es * n), *dv = tu_alloc(es * n);
        tu_fill_normal(dout, t, n, 1.0f);
        fa3c_bwd_params g;
        fa3c_bwd_params_init(&g);
        g.problem = p.problem;
        g.q = p.q; g.k = p.k; g.v = p.v; g.out = p.out;
        g.dout = tu_tensor(dout, b, s, h, d);
        g.lse = lse;
        g.dq = tu_tensor(dq, b, s, h, d);
        g.dk = tu_tensor(dk, b, s, h, d);
        g.dv = tu_tensor(dv, b, s, h, d);
        flop *= 2.5;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            if (fa3c_cpu_bwd(&g) != FA3C_STATUS_OK) return 1;
            double dtm = now() - t0;
            if (dtm < best) best = dtm;
        }
        printf("cpu bwd b=%d s=%d h=%d d=%d causal=%d %s: %.3f s, %.1f GFLOP/s (%.1f GFLOP)\n", b, s, h, d, causal,
               tu_dtype_name(t), best, flop / best * 1e-9, flop * 1e-9);
    }
    return 0;
}
