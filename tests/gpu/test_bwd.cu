// The Hopper backward kernel through the public API (backend CUDA) against
// the float64 CPU reference backward, with ARCHITECTURE.md's accuracy rule
// per gradient:
//   max|gpu - ref| <= 2 * max|naive-in-input-precision - ref| + 1e-3 * max|ref|,
// where the naive backward (below) rounds each intermediate (P, dP, dsum,
// dS) and each gradient to the input dtype, as a framework's bf16 autograd
// would. Outputs are poisoned first and must be written everywhere; dk and
// dv (no atomics) must be bit-identical over two runs, dq (summed with
// atomics) within the rule both times, and with deterministic = 1
// bit-identical too; nothing is written past the outputs.
//
// The CUDA backward is off unless the build has -DFA3C_CUDA_BWD=ON (its
// kernels have not yet run on a GPU): then these tests skip and say so.
#include "gpu_util.cuh"
#include "testutil.h"
#include "backend.h"
#include "problem.h"   // fa3c_key_range: the mask's definition

typedef struct {
    fa3c_dtype dtype;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim;
    int causal, window_left, window_right;
    int packed_qkv;   // q, k, v interleaved in one (b, s, 3, h, d) buffer (heads_q == heads_kv)
    float outlier;    // > 0: scale 0.1% of q and k entries by this (large logits)
    int deterministic;   // 1: dq must be bit-identical over the two runs too
    float softcap;
} bwd_case;

static bwd_case bcase(fa3c_dtype dt, int b, int sq, int sk, int hq, int hkv, int d) {
    bwd_case c;
    memset(&c, 0, sizeof c);
    c.dtype = dt;
    c.batch = b;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.heads_q = hq;
    c.heads_kv = hkv;
    c.headdim = d;
    c.window_left = c.window_right = -1;
    return c;
}

static float round_to(fa3c_dtype dt, float x) {
    uint16_t b;
    tu_store(&b, dt, 0, x);
    return tu_load(&b, dt, 0);
}

// The naive backward in the input precision, on contiguous (b, s, h, d)
// float copies of the inputs, out and lse as the GPU gets them.
static void bwd_naive_lowp(const bwd_case *c, const fa3c_problem *pr, const float *q, const float *k, const float *v,
                           const float *o, const float *dout, const float *lse, float *dq, float *dk, float *dv) {
    const int B = c->batch, SQ = c->seqlen_q, SK = c->seqlen_k, HQ = c->heads_q, HK = c->heads_kv, D = c->headdim;
    const int group = HQ / HK;
    const double scale = pr->softmax_scale;
    memset(dq, 0, sizeof(float) * B * SQ * HQ * D);
    double *dk_acc = (double *)tu_alloc(sizeof(double) * B * SK * HK * D), *dv_acc = (double *)tu_alloc(sizeof(double) * B * SK * HK * D);
    memset(dk_acc, 0, sizeof(double) * B * SK * HK * D);
    memset(dv_acc, 0, sizeof(double) * B * SK * HK * D);
    float *ds = (float *)tu_alloc(sizeof(float) * SK);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++) {
            const int hk = h / group;
            for (int i = 0; i < SQ; i++) {
                const float *qi = q + (((int64_t)b * SQ + i) * HQ + h) * D, *gi = dout + (((int64_t)b * SQ + i) * HQ + h) * D;
                const float *oi = o + (((int64_t)b * SQ + i) * HQ + h) * D;
                const float l = lse[((int64_t)b * HQ + h) * SQ + i];
                double dsum = 0;
                for (int e = 0; e < D; e++) dsum += (double)gi[e] * oi[e];
                const float dsum_r = round_to(c->dtype, (float)dsum);
                int lo, hi;
                fa3c_key_range(pr, i, SQ, SK, &lo, &hi);
                for (int j = 0; j < SK; j++) {
                    ds[j] = 0;
                    if (j < lo || j > hi || isinf(l)) continue;
                    const float *kj = k + (((int64_t)b * SK + j) * HK + hk) * D, *vj = v + (((int64_t)b * SK + j) * HK + hk) * D;
                    double s = 0, dp = 0;
                    for (int e = 0; e < D; e++) {
                        s += (double)qi[e] * kj[e];
                        dp += (double)gi[e] * vj[e];
                    }
                    double score = s * scale, slope = 1;
                    if (pr->softcap > 0) {   // score = cap · tanh(score / cap), tanh' = 1 - t^2
                        const double t = tanh(score / pr->softcap);
                        score = pr->softcap * t;
                        slope = 1 - t * t;
                    }
                    const float p = round_to(c->dtype, (float)exp(score - l));
                    ds[j] = round_to(c->dtype, (float)(p * (round_to(c->dtype, (float)dp) - dsum_r) * slope));
                    double *dvj = dv_acc + (((int64_t)b * SK + j) * HK + hk) * D, *dkj = dk_acc + (((int64_t)b * SK + j) * HK + hk) * D;
                    for (int e = 0; e < D; e++) {
                        dvj[e] += (double)p * gi[e];
                        dkj[e] += (double)ds[j] * qi[e] * scale;
                    }
                }
                float *dqi = dq + (((int64_t)b * SQ + i) * HQ + h) * D;
                for (int e = 0; e < D; e++) {
                    double acc = 0;
                    for (int j = lo; j <= hi; j++) acc += (double)ds[j] * k[(((int64_t)b * SK + j) * HK + hk) * D + e];
                    dqi[e] = round_to(c->dtype, (float)(acc * scale));
                }
            }
        }
    for (int64_t i = 0; i < (int64_t)B * SK * HK * D; i++) {
        dk[i] = round_to(c->dtype, (float)dk_acc[i]);
        dv[i] = round_to(c->dtype, (float)dv_acc[i]);
    }
    free(dk_acc);
    free(dv_acc);
    free(ds);
}

static void *to_device(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

// Skips the test unless this build's CUDA backward is on.
#define REQUIRE_CUDA_BWD()                                                                                   \
    do {                                                                                                     \
        REQUIRE_SM90();                                                                                      \
        if (!cuda_bwd_enabled())                                                                             \
            SKIP("the CUDA backward is off in this build (its kernels are unverified; configure with "       \
                 "-DFA3C_CUDA_BWD=ON to test them): %s", fa3c_last_error());                                \
    } while (0)

// fa3c_cuda_bwd_supported on a plain problem: does the build use the kernels at all?
static int cuda_bwd_enabled(void) {
    fa3c_bwd_params p;
    fa3c_bwd_params_init(&p);
    p.problem.batch = p.problem.seqlen_q = p.problem.seqlen_k = p.problem.heads_q = p.problem.heads_kv = 1;
    p.problem.headdim = 128;
    p.problem.softmax_scale = 1.f;
    static uint16_t dummy[128] __attribute__((aligned(16)));
    fa3c_tensor t = tu_tensor(dummy, 1, 1, 1, 128);
    p.q = p.k = p.v = p.out = p.dout = p.dq = p.dk = p.dv = t;
    fa3c_status s = fa3c_cuda_bwd_supported(&p);
    return s == FA3C_STATUS_OK || !strstr(fa3c_last_error(), "leaves them off");
}

// Per gradient: written everywhere, within the rule of the naive one.
static void check_grad(const char *name, const float *g, const float *lowp, const float *ref, int64_t n) {
    int64_t unwritten = 0;
    double ref_max = 0;
    for (int64_t i = 0; i < n; i++) {
        unwritten += isnan(g[i]);
        if (fabs(ref[i]) > ref_max) ref_max = fabs(ref[i]);
    }
    const double err = tu_max_abs_err(g, ref, n), err_lowp = tu_max_abs_err(lowp, ref, n);
    const double bound = 2 * err_lowp + 1e-3 * ref_max;
    printf("    %s: max err %.3g (naive %.3g, bound %.3g, max|ref| %.3g), rel L2 %.3g\n", name, err, err_lowp, bound,
           ref_max, tu_rel_l2_err(g, ref, n));
    CHECK(unwritten == 0, "%s: %lld elements left unwritten (NaN)", name, (long long)unwritten);
    CHECK(err <= bound, "%s: max error %g over bound %g", name, err, bound);
}

// Poisoned guard elements (0xFFFF) either side of n elements at alloc + guard still poisoned?
static int64_t guards_written(const void *alloc, int64_t guard, int64_t n) {
    uint16_t *h = (uint16_t *)tu_alloc((size_t)guard * 2);
    int64_t written = 0;
    for (int side = 0; side < 2; side++) {
        if (cudaMemcpy(h, (const char *)alloc + (side ? guard + n : 0) * 2, (size_t)guard * 2, cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
            written = -1;
            break;
        }
        for (int64_t i = 0; i < guard; i++) written += h[i] != 0xFFFF;
    }
    free(h);
    return written;
}

static void run_case(const char *label, bwd_case c) {
    const int64_t B = c.batch, SQ = c.seqlen_q, SK = c.seqlen_k, HQ = c.heads_q, HK = c.heads_kv, D = c.headdim;
    const size_t es = tu_dtype_size(c.dtype);
    printf("[%s] %s b=%d sq=%d sk=%d hq=%d hkv=%d d=%d causal=%d window=(%d,%d) packed=%d outlier=%g "
           "deterministic=%d softcap=%g\n", label, tu_dtype_name(c.dtype), c.batch, c.seqlen_q, c.seqlen_k, c.heads_q,
           c.heads_kv, c.headdim, c.causal, c.window_left, c.window_right, c.packed_qkv, c.outlier, c.deterministic,
           c.softcap);
    const int64_t nq = B * SQ * HQ * D, nk = B * SK * HK * D, nlse = B * HQ * SQ;
    fa3c_bwd_params p;
    fa3c_bwd_params_init(&p);
    tu_problem_shape(&p.problem, c.dtype, c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.headdim);
    p.problem.causal = c.causal;
    p.problem.window_left = c.window_left;
    p.problem.window_right = c.window_right;
    p.problem.softmax_scale = (float)(1.0 / sqrt((double)D));
    p.deterministic = c.deterministic;
    p.problem.softcap = c.softcap;

    // Inputs in the dtype: q, k, v (separate or packed), dout.
    void *hqkv = NULL, *hq, *hk, *hv;
    if (c.packed_qkv) {
        hqkv = tu_alloc(3 * nq * es);
        tu_fill_normal(hqkv, c.dtype, 3 * nq, 1.f);
        hq = hqkv;
        hk = (char *)hqkv + HQ * D * es;
        hv = (char *)hqkv + 2 * HQ * D * es;
        for (int i = 0; i < 3; i++) {
            fa3c_tensor *t = i == 0 ? &p.q : i == 1 ? &p.k : &p.v;
            t->stride[0] = SQ * 3 * HQ * D;
            t->stride[1] = 3 * HQ * D;
            t->stride[2] = D;
            t->stride[3] = 1;
        }
    } else {
        hq = tu_alloc(nq * es);
        hk = tu_alloc(nk * es);
        hv = tu_alloc(nk * es);
        tu_fill_normal(hq, c.dtype, nq, 1.f);
        tu_fill_normal(hk, c.dtype, nk, 1.f);
        tu_fill_normal(hv, c.dtype, nk, 1.f);
        tu_strides_bshd(p.q.stride, B, SQ, HQ, D);
        tu_strides_bshd(p.k.stride, B, SK, HK, D);
        tu_strides_bshd(p.v.stride, B, SK, HK, D);
    }
    if (c.outlier > 0) {
        for (int64_t i = 0; i < nq / 1000 + 1; i++) {
            fa3c_tensor t = p.q;
            int64_t j = tu_rand_int(0, (int)(nq - 1)), d = j % D, h = (j / D) % HQ, s = (j / D / HQ) % SQ, b = j / D / HQ / SQ;
            int64_t off = b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d;
            tu_store(hq, c.dtype, off, tu_load(hq, c.dtype, off) * c.outlier);
        }
        for (int64_t i = 0; i < nk / 1000 + 1; i++) {
            fa3c_tensor t = p.k;
            int64_t j = tu_rand_int(0, (int)(nk - 1)), d = j % D, h = (j / D) % HK, s = (j / D / HK) % SK, b = j / D / HK / SK;
            int64_t off = b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d;
            tu_store(hk, c.dtype, off, tu_load(hk, c.dtype, off) * c.outlier);
        }
    }
    void *hdout = tu_alloc(nq * es);
    tu_fill_normal(hdout, c.dtype, nq, 1.f);
    p.q.data = hq;
    p.k.data = hk;
    p.v.data = hv;
    tu_strides_bshd(p.dout.stride, B, SQ, HQ, D);
    p.dout.data = hdout;

    // out (in the dtype) and lse from the float64 reference forward: what a forward would hand the backward.
    float *fq = (float *)tu_alloc(nq * 4), *fk = (float *)tu_alloc(nk * 4), *fv = (float *)tu_alloc(nk * 4);
    float *fdout = (float *)tu_alloc(nq * 4), *fo = (float *)tu_alloc(nq * 4), *lse = (float *)tu_alloc(nlse * 4);
    tu_gather(fq, &p.q, c.dtype, B, SQ, HQ, D);
    tu_gather(fk, &p.k, c.dtype, B, SK, HK, D);
    tu_gather(fv, &p.v, c.dtype, B, SK, HK, D);
    tu_gather(fdout, &p.dout, c.dtype, B, SQ, HQ, D);
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    f.problem = p.problem;
    f.problem.dtype = FA3C_DTYPE_FP32;
    f.q = tu_tensor(fq, B, SQ, HQ, D);
    f.k = tu_tensor(fk, B, SK, HK, D);
    f.v = tu_tensor(fv, B, SK, HK, D);
    f.out = tu_tensor(fo, B, SQ, HQ, D);
    f.lse = lse;
    f.backend = FA3C_BACKEND_CPU_REFERENCE;
    CHECK(fa3c_fwd(&f, NULL) == FA3C_STATUS_OK, "reference forward: %s", fa3c_last_error());
    void *hout = tu_alloc(nq * es);
    for (int64_t i = 0; i < nq; i++) {
        tu_store(hout, c.dtype, i, fo[i]);
        fo[i] = tu_load(hout, c.dtype, i);   // the rounded out, as the backward sees it
    }
    tu_strides_bshd(p.out.stride, B, SQ, HQ, D);

    // The float64 reference backward on float copies, and the naive one in the dtype.
    float *ref = (float *)tu_alloc((nq + 2 * nk) * 4), *lowp = (float *)tu_alloc((nq + 2 * nk) * 4);
    fa3c_bwd_params r = p;
    r.problem.dtype = FA3C_DTYPE_FP32;
    r.q = f.q;
    r.k = f.k;
    r.v = f.v;
    r.out = tu_tensor(fo, B, SQ, HQ, D);
    r.dout = tu_tensor(fdout, B, SQ, HQ, D);
    r.lse = lse;
    r.dq = tu_tensor(ref, B, SQ, HQ, D);
    r.dk = tu_tensor(ref + nq, B, SK, HK, D);
    r.dv = tu_tensor(ref + nq + nk, B, SK, HK, D);
    r.backend = FA3C_BACKEND_CPU_REFERENCE;
    CHECK(fa3c_bwd(&r, NULL) == FA3C_STATUS_OK, "reference backward: %s", fa3c_last_error());
    bwd_naive_lowp(&c, &p.problem, fq, fk, fv, fo, fdout, lse, lowp, lowp + nq, lowp + nq + nk);

    // The GPU: inputs on the device, outputs between poisoned guards, two runs.
    const size_t q_bytes = (c.packed_qkv ? 3 * nq : nq) * es;
    void *dq_in = to_device(hqkv ? hqkv : hq, q_bytes);
    void *dk_in = hqkv ? (char *)dq_in + HQ * D * es : to_device(hk, nk * es);
    void *dv_in = hqkv ? (char *)dq_in + 2 * HQ * D * es : to_device(hv, nk * es);
    void *d_out = to_device(hout, nq * es), *d_dout = to_device(hdout, nq * es);
    float *d_lse = (float *)to_device(lse, nlse * 4);
    const int64_t guard = 4096;
    const int64_t n_out[3] = {nq, nk, nk};
    void *alloc[3] = {NULL, NULL, NULL};
    for (int t = 0; t < 3; t++) CUDA_OK(cudaMalloc(&alloc[t], (n_out[t] + 2 * guard) * es));
    void *gout[2][3];
    for (int run = 0; run < 2; run++) {
        for (int t = 0; t < 3; t++) CUDA_OK(cudaMemset(alloc[t], 0xFF, (n_out[t] + 2 * guard) * es));
        fa3c_bwd_params g = p;
        g.q.data = dq_in;
        g.k.data = dk_in;
        g.v.data = dv_in;
        g.out.data = d_out;
        g.dout.data = d_dout;
        g.lse = d_lse;
        g.dq = tu_tensor((char *)alloc[0] + guard * es, B, SQ, HQ, D);
        g.dk = tu_tensor((char *)alloc[1] + guard * es, B, SK, HK, D);
        g.dv = tu_tensor((char *)alloc[2] + guard * es, B, SK, HK, D);
        g.backend = FA3C_BACKEND_CUDA;
        fa3c_status st = fa3c_bwd(&g, NULL);
        CHECK(st == FA3C_STATUS_OK, "fa3c_bwd(CUDA): %s: %s", fa3c_status_string(st), fa3c_last_error());
        if (st != FA3C_STATUS_OK) return;
        CUDA_OK(cudaDeviceSynchronize());
        for (int t = 0; t < 3; t++) {
            gout[run][t] = tu_alloc(n_out[t] * es);
            CUDA_OK(cudaMemcpy(gout[run][t], (char *)alloc[t] + guard * es, n_out[t] * es, cudaMemcpyDeviceToHost));
        }
    }
    const char *names[3] = {"dq", "dk", "dv"};
    const int64_t offs[3] = {0, nq, nq + nk};
    for (int run = 0; run < 2; run++)
        for (int t = 0; t < 3; t++) {
            float *gf = (float *)tu_alloc(n_out[t] * 4);
            for (int64_t i = 0; i < n_out[t]; i++) gf[i] = tu_load(gout[run][t], c.dtype, i);
            if (run == 0 || t == 0) {   // dq again on the second run: its atomics may add in another order
                char what[32];
                snprintf(what, sizeof what, "%s (run %d)", names[t], run + 1);
                check_grad(what, gf, lowp + offs[t], ref + offs[t], n_out[t]);
            }
            free(gf);
        }
    if (c.deterministic) CHECK(memcmp(gout[0][0], gout[1][0], nq * es) == 0, "deterministic: dq differs between two runs");
    CHECK(memcmp(gout[0][1], gout[1][1], nk * es) == 0, "dk differs between two runs: a race");
    CHECK(memcmp(gout[0][2], gout[1][2], nk * es) == 0, "dv differs between two runs: a race");
    for (int t = 0; t < 3; t++) {
        int64_t w = guards_written(alloc[t], guard, n_out[t]);
        CHECK(w == 0, "%s: %lld elements written outside the output", names[t], (long long)w);
    }

    for (int t = 0; t < 3; t++) cudaFree(alloc[t]);
    cudaFree(dq_in);
    if (!hqkv) {
        cudaFree(dk_in);
        cudaFree(dv_in);
    }
    cudaFree(d_out);
    cudaFree(d_dout);
    cudaFree(d_lse);
    for (int run = 0; run < 2; run++)
        for (int t = 0; t < 3; t++) free(gout[run][t]);
    if (hqkv) free(hqkv);
    else {
        free(hq);
        free(hk);
        free(hv);
    }
    free(hdout); free(hout);
    free(fq); free(fk); free(fv); free(fdout); free(fo); free(lse); free(ref); free(lowp);
}

#define BF16 FA3C_DTYPE_BF16
#define FP16 FA3C_DTYPE_FP16

TEST(bwd_bf16_hdim128_basic) {
    REQUIRE_CUDA_BWD();
    run_case("basic", bcase(BF16, 2, 256, 256, 2, 2, 128));
}

TEST(bwd_bf16_hdim64) {
    REQUIRE_CUDA_BWD();
    run_case("hdim 64", bcase(BF16, 2, 300, 300, 3, 3, 64));
}

TEST(bwd_fp16) {
    REQUIRE_CUDA_BWD();
    run_case("fp16 hdim 128", bcase(FP16, 1, 200, 200, 2, 2, 128));
    run_case("fp16 hdim 64", bcase(FP16, 1, 130, 70, 2, 2, 64));
}

TEST(bwd_seqlens_1_17_1000) {
    REQUIRE_CUDA_BWD();
    run_case("seqlen 1", bcase(BF16, 2, 1, 1, 2, 2, 128));
    run_case("seqlen 17", bcase(BF16, 1, 17, 17, 2, 2, 64));
    run_case("seqlen 1000", bcase(BF16, 1, 1000, 1000, 1, 1, 128));
    run_case("sq 65, sk 129", bcase(BF16, 1, 65, 129, 2, 2, 128));
}

TEST(bwd_causal) {
    REQUIRE_CUDA_BWD();
    bwd_case c = bcase(BF16, 2, 384, 384, 2, 2, 128);
    c.causal = 1;
    run_case("causal", c);
    c = bcase(BF16, 1, 100, 300, 2, 2, 128);   // bottom-right: every query sees the first 200 keys
    c.causal = 1;
    run_case("causal sq < sk", c);
    c = bcase(BF16, 1, 300, 100, 2, 2, 64);    // the first 200 queries see no key: lse -inf, dq 0
    c.causal = 1;
    run_case("causal sq > sk (fully masked rows)", c);
}

TEST(bwd_gqa_8_and_6) {
    REQUIRE_CUDA_BWD();
    run_case("GQA 8:1", bcase(BF16, 1, 200, 200, 8, 1, 128));
    bwd_case c = bcase(BF16, 2, 150, 260, 12, 2, 64);
    c.causal = 1;
    run_case("GQA 6:1 causal", c);
}

TEST(bwd_sliding_window) {
    REQUIRE_CUDA_BWD();
    bwd_case c = bcase(BF16, 1, 500, 500, 2, 2, 128);
    c.window_left = 64;
    c.window_right = 32;
    run_case("window (64, 32)", c);
    c = bcase(BF16, 1, 300, 140, 2, 2, 64);    // rows whose window holds no key
    c.window_left = 10;
    c.window_right = 0;
    run_case("window (10, 0), sq > sk", c);
}

TEST(bwd_packed_qkv_and_large_logits) {
    REQUIRE_CUDA_BWD();
    bwd_case c = bcase(BF16, 2, 200, 200, 2, 2, 128);
    c.packed_qkv = 1;
    run_case("packed qkv", c);
    c = bcase(BF16, 1, 256, 256, 2, 2, 64);
    c.outlier = 12.f;
    run_case("large logits", c);
}

TEST(bwd_deterministic) {
    REQUIRE_CUDA_BWD();
    bwd_case c = bcase(BF16, 2, 700, 700, 4, 2, 128);   // six key blocks add to each query block in turn
    c.deterministic = 1;
    run_case("deterministic hdim 128", c);
    c = bcase(BF16, 1, 450, 520, 2, 2, 64);              // both warpgroups add to the same columns
    c.deterministic = 1;
    c.causal = 1;
    run_case("deterministic hdim 64 causal", c);
    c = bcase(BF16, 1, 400, 400, 2, 2, 128);             // a left bound: the first key block moves with the query block
    c.deterministic = 1;
    c.window_left = 150;
    c.window_right = 20;
    run_case("deterministic window", c);
}

TEST(bwd_softcap) {
    REQUIRE_CUDA_BWD();
    bwd_case c = bcase(BF16, 1, 300, 300, 2, 2, 128);
    c.softcap = 5.f;   // small, so that most scores are in tanh's bend
    c.outlier = 8.f;
    run_case("softcap 5", c);
    c = bcase(FP16, 1, 200, 260, 4, 2, 64);
    c.softcap = 30.f;
    c.causal = 1;
    run_case("softcap 30 causal GQA fp16", c);
}

// What the kernels do not do yet says NOT_SUPPORTED with a message, never a wrong answer.
TEST(bwd_not_supported_is_reported) {
    REQUIRE_SM90();
    fa3c_bwd_params p;
    fa3c_bwd_params_init(&p);
    tu_problem_shape(&p.problem, BF16, 1, 64, 64, 1, 1, 128);
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, 64 * 128 * 2));
    fa3c_tensor t = tu_tensor(d, 1, 64, 1, 128);
    p.q = p.k = p.v = p.out = p.dout = p.dq = p.dk = p.dv = t;
    float *lse = NULL;
    CUDA_OK(cudaMalloc((void **)&lse, 64 * 4));
    p.lse = lse;
    p.backend = FA3C_BACKEND_CUDA;
    const char *what[1] = {"hdim 96"}, *needle[1] = {"headdim 96"};
    for (int i = 0; i < 1; i++) {
        fa3c_bwd_params q = p;
        if (i == 0) {   // the same buffers viewed with 96 columns
            q.problem.headdim = 96;
            fa3c_tensor *ts[8] = {&q.q, &q.k, &q.v, &q.out, &q.dout, &q.dq, &q.dk, &q.dv};
            for (int j = 0; j < 8; j++) tu_strides_bshd(ts[j]->stride, 1, 64, 1, 96);
        }
        fa3c_status s = fa3c_bwd_check(&q);
        printf("  %s: %s: %s\n", what[i], fa3c_status_string(s), fa3c_last_error());
        CHECK(s == FA3C_STATUS_NOT_SUPPORTED, "%s: status %d, want NOT_SUPPORTED", what[i], (int)s);
        CHECK(s != FA3C_STATUS_NOT_SUPPORTED || strstr(fa3c_last_error(), needle[i]) ||
                  strstr(fa3c_last_error(), "leaves them off"),
              "%s: message '%s' does not name it", what[i], fa3c_last_error());
    }
    cudaFree(d);
    cudaFree(lse);
}

TEST_MAIN()
