// The Hopper fp8 (e4m3) forward through the public API (backend CUDA)
// against the float64 CPU reference on the dequantized inputs (stored value
// x descale x block descale), with ARCHITECTURE.md's accuracy rule:
//   max|gpu - ref| <= 2 * max|naive fp8 - ref| + 1e-3 * max|ref|,
// where the naive fp8 forward (below) rounds the probabilities to e4m3 (as
// the kernel does, scaled to [0, 256]) before P·V and the output to bf16.
// The LSE (from f32 scores) within 2e-3; outputs poisoned first and every
// element written; two runs bit-identical; nothing written outside, nor in
// the columns between one head's row of out and the next.
//
// A build with -DFA3C_CUDA_FP8=OFF leaves the CUDA e4m3 kernels off: then
// these tests skip and say so.
#include "gpu_util.cuh"
#include "testutil.h"
#include "backend.h"
#include "problem.h"   // fa3c_key_range
#include "cuda/fp8/fp8_prep.h"   // fa3c_fp8_transpose_v

typedef struct {
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, headdim;
    int causal, window_left, window_right;
    float softcap;
    float outlier;   // > 0: scale 0.1% of q and k entries by this before quantizing (large logits)
    int descales;    // 1: random per-(batch, K/V head) descales in [0.5, 2]; 0: NULL (the kernel's 1)
    int blocks;      // 1: per-block descales too (q_block_descale, ...), log-uniform in [1/8, 8]
} fp8_case;

static fp8_case fcase(int b, int sq, int sk, int hq, int hkv, int d) {
    fp8_case c;
    memset(&c, 0, sizeof c);
    c.batch = b;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.heads_q = hq;
    c.heads_kv = hkv;
    c.headdim = d;
    c.window_left = c.window_right = -1;
    c.descales = 1;
    return c;
}

static float e4m3_round(float x) { return fa3c_e4m3_to_float(fa3c_float_to_e4m3(x)); }
static float bf16_round(float x) { return tu_bf16_to_float(tu_float_to_bf16(x)); }

// The naive fp8 forward on the dequantized (float) q, k, v, contiguous (b, s, h, d).
static void fp8_naive(const fp8_case *c, const fa3c_problem *pr, const float *q, const float *k, const float *v,
                      float *out) {
    const int B = c->batch, SQ = c->seqlen_q, SK = c->seqlen_k, HQ = c->heads_q, HK = c->heads_kv, D = c->headdim;
    double *s = (double *)tu_alloc(sizeof(double) * SK), *acc = (double *)tu_alloc(sizeof(double) * D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++)
            for (int i = 0; i < SQ; i++) {
                const int hk = h / (HQ / HK);
                const float *qi = q + (((int64_t)b * SQ + i) * HQ + h) * D;
                float *oi = out + (((int64_t)b * SQ + i) * HQ + h) * D;
                int lo, hi;
                fa3c_key_range(pr, i, SQ, SK, &lo, &hi);
                double mx = -INFINITY;
                for (int j = lo; j <= hi; j++) {
                    const float *kj = k + (((int64_t)b * SK + j) * HK + hk) * D;
                    double dot = 0;
                    for (int e = 0; e < D; e++) dot += (double)qi[e] * kj[e];
                    s[j] = dot * pr->softmax_scale;
                    if (pr->softcap > 0) s[j] = pr->softcap * tanh(s[j] / pr->softcap);
                    if (s[j] > mx) mx = s[j];
                }
                double sum = 0;
                for (int e = 0; e < D; e++) acc[e] = 0;
                for (int j = lo; j <= hi; j++) {
                    const double p = exp(s[j] - mx);
                    sum += p;
                    const double p8 = e4m3_round((float)(p * 256)) / 256.0;   // as the kernel rounds P
                    const float *vj = v + (((int64_t)b * SK + j) * HK + hk) * D;
                    for (int e = 0; e < D; e++) acc[e] += p8 * vj[e];
                }
                for (int e = 0; e < D; e++) oi[e] = lo <= hi ? bf16_round((float)(acc[e] / sum)) : 0.f;
            }
    free(s);
    free(acc);
}

static void *to_device(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}

// fa3c_cuda_fwd_supported on a plain e4m3 problem of 8 tokens, one head of
// head dim d (at most 128; the tensors are never read).
static fa3c_status e4m3_supported(int d) {
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, FA3C_DTYPE_E4M3, 1, 8, 8, 1, 1, d);
    p.problem.softmax_scale = 1.f;
    static uint16_t dummy[8 * 128] __attribute__((aligned(16)));
    p.q = p.k = p.v = p.out = tu_tensor(dummy, 1, 8, 1, d);
    return fa3c_cuda_fwd_supported(&p);
}

// Does the build use the kernels at all?
static int cuda_fp8_enabled(void) {
    return e4m3_supported(128) == FA3C_STATUS_OK || !strstr(fa3c_last_error(), "kernels off");
}

#define REQUIRE_CUDA_FP8()                                                                                   \
    do {                                                                                                     \
        REQUIRE_SM90();                                                                                      \
        if (!cuda_fp8_enabled())                                                                             \
            SKIP("the CUDA e4m3 forward is off in this build (configure with -DFA3C_CUDA_FP8=ON to test it): %s", \
                 fa3c_last_error());                                                                        \
    } while (0)

static void run_case(const char *label, fp8_case c) {
    const int64_t B = c.batch, SQ = c.seqlen_q, SK = c.seqlen_k, HQ = c.heads_q, HK = c.heads_kv, D = c.headdim;
    printf("[%s] e4m3 b=%d sq=%d sk=%d hq=%d hkv=%d d=%d causal=%d window=(%d,%d) softcap=%g outlier=%g descales=%d "
           "blocks=%d\n", label, c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.headdim, c.causal,
           c.window_left, c.window_right, c.softcap, c.outlier, c.descales, c.blocks);
    const int64_t nq = B * SQ * HQ * D, nk = B * SK * HK * D, nlse = B * HQ * SQ;
    fa3c_fwd_params p;
    fa3c_fwd_params_init(&p);
    tu_problem_shape(&p.problem, FA3C_DTYPE_E4M3, c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.headdim);
    p.problem.causal = c.causal;
    p.problem.window_left = c.window_left;
    p.problem.window_right = c.window_right;
    p.problem.softcap = c.softcap;
    p.problem.softmax_scale = (float)(1.0 / sqrt((double)D));

    // e4m3 inputs: N(0, 1) values (a few scaled up with outlier) times their
    // block's descale (so that blocks differ in size, as the scales say),
    // quantized with their descales.
    float *desc[3], *bdesc[3];
    uint8_t *h8[3];
    const int64_t n[3] = {nq, nk, nk};
    int64_t nb[3];
    for (int t = 0; t < 3; t++) {
        const int64_t heads = t == 0 ? HQ : HK, seq = t == 0 ? SQ : SK, blocks = (seq + 127) / 128;
        desc[t] = (float *)tu_alloc(sizeof(float) * B * HK);
        for (int64_t i = 0; i < B * HK; i++) desc[t][i] = c.descales ? (float)(0.5 + 1.5 * tu_uniform()) : 1.f;
        nb[t] = B * heads * blocks;
        bdesc[t] = (float *)tu_alloc(sizeof(float) * nb[t]);
        for (int64_t i = 0; i < nb[t]; i++) bdesc[t][i] = c.blocks ? (float)exp2(6 * tu_uniform() - 3) : 1.f;
        h8[t] = (uint8_t *)tu_alloc((size_t)n[t]);
        for (int64_t i = 0; i < n[t]; i++) {
            const int64_t h = (i / D) % heads, j = (i / (D * heads)) % seq, b = i / (D * heads * seq);
            const int64_t hk = t == 0 ? h / (HQ / HK) : h;
            const float block = bdesc[t][(b * heads + h) * blocks + j / 128];
            float x = (float)tu_normal() * block;
            if (c.outlier > 0 && t < 2 && tu_uniform() < 1e-3) x *= c.outlier;
            h8[t][i] = fa3c_float_to_e4m3(x / (desc[t][b * HK + hk] * block));
        }
    }
    // The dequantized values, as the reference sees them.
    float *f[3];
    for (int t = 0; t < 3; t++) {
        f[t] = (float *)tu_alloc(sizeof(float) * n[t]);
        const int64_t heads = t == 0 ? HQ : HK, seq = t == 0 ? SQ : SK, blocks = (seq + 127) / 128;
        for (int64_t i = 0; i < n[t]; i++) {
            const int64_t h = (i / D) % heads, j = (i / (D * heads)) % seq, b = i / (D * heads * seq);
            const int64_t hk = t == 0 ? h / (HQ / HK) : h;
            f[t][i] = fa3c_e4m3_to_float(h8[t][i]) * desc[t][b * HK + hk] * bdesc[t][(b * heads + h) * blocks + j / 128];
        }
    }
    float *ref = (float *)tu_alloc(sizeof(float) * nq), *ref_lse = (float *)tu_alloc(sizeof(float) * nlse);
    fa3c_fwd_params r = p;
    r.problem.dtype = FA3C_DTYPE_FP32;
    r.q = tu_tensor(f[0], B, SQ, HQ, D);
    r.k = tu_tensor(f[1], B, SK, HK, D);
    r.v = tu_tensor(f[2], B, SK, HK, D);
    r.out = tu_tensor(ref, B, SQ, HQ, D);
    r.lse = ref_lse;
    r.backend = FA3C_BACKEND_CPU_REFERENCE;
    CHECK(fa3c_fwd(&r, NULL) == FA3C_STATUS_OK, "reference: %s", fa3c_last_error());
    float *naive = (float *)tu_alloc(sizeof(float) * nq);
    fp8_naive(&c, &p.problem, f[0], f[1], f[2], naive);

    // The GPU, twice, into poisoned output between guards; each head's row
    // of out is followed by OPAD poisoned columns, which must stay so (a
    // padded head dim writes only its own columns).
    enum { OPAD = 32 };
    const int64_t DO = D + OPAD, nqo = B * SQ * HQ * DO;
    void *d8[3], *ddesc[3], *dbdesc[3];
    for (int t = 0; t < 3; t++) {
        d8[t] = to_device(h8[t], (size_t)n[t]);
        ddesc[t] = to_device(desc[t], sizeof(float) * B * HK);
        dbdesc[t] = to_device(bdesc[t], sizeof(float) * nb[t]);
    }
    const int64_t guard = 4096;
    void *dout_alloc = NULL;
    float *dlse = NULL;
    CUDA_OK(cudaMalloc(&dout_alloc, (nqo + 2 * guard) * 2));
    CUDA_OK(cudaMalloc((void **)&dlse, nlse * 4));
    uint16_t *gout[2] = {(uint16_t *)tu_alloc(nq * 2), (uint16_t *)tu_alloc(nq * 2)};
    uint16_t *gpad = (uint16_t *)tu_alloc(nqo * 2);
    int64_t pad_written = 0;
    float *glse = (float *)tu_alloc(nlse * 4);
    for (int run = 0; run < 2; run++) {
        CUDA_OK(cudaMemset(dout_alloc, 0xFF, (nqo + 2 * guard) * 2));
        CUDA_OK(cudaMemset(dlse, 0xFF, nlse * 4));
        fa3c_fwd_params g = p;
        g.q = tu_tensor(d8[0], B, SQ, HQ, D);
        g.k = tu_tensor(d8[1], B, SK, HK, D);
        g.v = tu_tensor(d8[2], B, SK, HK, D);
        g.out = (fa3c_tensor){(char *)dout_alloc + guard * 2, {SQ * HQ * DO, HQ * DO, DO, 1}};
        g.lse = dlse;
        if (c.descales) {   // else NULL: the kernel's own 1
            g.q_descale = (const float *)ddesc[0];
            g.k_descale = (const float *)ddesc[1];
            g.v_descale = (const float *)ddesc[2];
        }
        if (c.blocks) {
            g.q_block_descale = (const float *)dbdesc[0];
            g.k_block_descale = (const float *)dbdesc[1];
            g.v_block_descale = (const float *)dbdesc[2];
        }
        g.backend = FA3C_BACKEND_CUDA;
        fa3c_status st = fa3c_fwd(&g, NULL);
        CHECK(st == FA3C_STATUS_OK, "fa3c_fwd(CUDA, e4m3): %s: %s", fa3c_status_string(st), fa3c_last_error());
        if (st != FA3C_STATUS_OK) return;
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(gpad, (char *)dout_alloc + guard * 2, nqo * 2, cudaMemcpyDeviceToHost));
        for (int64_t row = 0; row < B * SQ * HQ; row++) {
            memcpy(gout[run] + row * D, gpad + row * DO, D * 2);
            for (int64_t j = D; j < DO; j++) pad_written += gpad[row * DO + j] != 0xFFFF;
        }
        if (run == 0) CUDA_OK(cudaMemcpy(glse, dlse, nlse * 4, cudaMemcpyDeviceToHost));
    }
    float *gf = (float *)tu_alloc(sizeof(float) * nq);
    int64_t unwritten = 0;
    double ref_max = 0;
    for (int64_t i = 0; i < nq; i++) {
        gf[i] = tu_bf16_to_float(gout[0][i]);
        unwritten += isnan(gf[i]);
        if (fabs(ref[i]) > ref_max) ref_max = fabs(ref[i]);
    }
    const double err = tu_max_abs_err(gf, ref, nq), err_naive = tu_max_abs_err(naive, ref, nq);
    const double bound = 2 * err_naive + 1e-3 * ref_max;
    int64_t lse_bad = 0;
    double lse_err = 0;
    for (int64_t i = 0; i < nlse; i++) {
        if (isinf(ref_lse[i]) && isinf(glse[i]) && ref_lse[i] == glse[i]) continue;
        const double e = fabs((double)glse[i] - ref_lse[i]);
        if (!(e <= 2e-3 * (1 + fabs(ref_lse[i])))) lse_bad++;
        if (!(e <= lse_err)) lse_err = isnan(e) ? INFINITY : e;
    }
    uint16_t *guards = (uint16_t *)tu_alloc(guard * 2);
    int64_t guard_written = 0;
    for (int side = 0; side < 2; side++) {
        CUDA_OK(cudaMemcpy(guards, (char *)dout_alloc + (side ? guard + nqo : 0) * 2, guard * 2, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < guard; i++) guard_written += guards[i] != 0xFFFF;
    }
    printf("    max err %.3g (naive fp8 %.3g, bound %.3g, max|ref| %.3g), rel L2 %.3g (naive %.3g), LSE max err %.3g\n",
           err, err_naive, bound, ref_max, tu_rel_l2_err(gf, ref, nq), tu_rel_l2_err(naive, ref, nq), lse_err);
    CHECK(unwritten == 0, "%lld output elements left unwritten (NaN)", (long long)unwritten);
    CHECK(err <= bound, "max error %g over bound %g", err, bound);
    CHECK(lse_bad == 0, "%lld LSE values off (max err %g)", (long long)lse_bad, lse_err);
    CHECK(memcmp(gout[0], gout[1], nq * 2) == 0, "two runs on the same inputs differ: a race");
    CHECK(guard_written == 0, "%lld elements written outside the output", (long long)guard_written);
    CHECK(pad_written == 0, "%lld elements written in the columns past the head dim", (long long)pad_written);

    cudaFree(dout_alloc);
    cudaFree(dlse);
    for (int t = 0; t < 3; t++) {
        cudaFree(d8[t]);
        cudaFree(ddesc[t]);
        cudaFree(dbdesc[t]);
        free(desc[t]);
        free(bdesc[t]);
        free(h8[t]);
        free(f[t]);
    }
    free(ref); free(ref_lse); free(naive); free(gout[0]); free(gout[1]); free(glse); free(gf); free(guards); free(gpad);
}

// The V transpose alone (fp8_prep.cu) against the host's: strided V
// (packed as in a (b, s, 3, h, d) buffer), keys past seqlen_k zero, each
// group of 32 keys in fa3c_fp8_key_of_slot's order.
TEST(fp8_cuda_v_transpose) {
    REQUIRE_SM90();
    const int B = 2, SK = 200, HK = 3, D = 256, KP = 256;
    const int64_t row = 3 * HK * D, n = (int64_t)B * SK * row;
    uint8_t *hv = (uint8_t *)tu_alloc((size_t)n), *want = (uint8_t *)tu_alloc((size_t)B * HK * D * KP);
    uint8_t *got = (uint8_t *)tu_alloc((size_t)B * HK * D * KP);
    for (int64_t i = 0; i < n; i++) hv[i] = (uint8_t)tu_rand_int(0, 255);
    fa3c_fp8_vt_params t;
    memset(&t, 0, sizeof t);
    t.v_stride[0] = SK * row;
    t.v_stride[1] = row;
    t.v_stride[2] = D;
    t.batch = B;
    t.seqlen_k = SK;
    t.heads_kv = HK;
    t.headdim = D;
    t.keys_pad = KP;
    const int64_t v_off = 2 * HK * D;   // the V third of each token row
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HK; h++)
            for (int d = 0; d < D; d++)
                for (int slot = 0; slot < KP; slot++) {
                    const int key = slot / 32 * 32 + fa3c_fp8_key_of_slot(slot % 32);
                    want[(((int64_t)b * HK + h) * D + d) * KP + slot] =
                        key < SK ? hv[v_off + b * t.v_stride[0] + key * t.v_stride[1] + h * t.v_stride[2] + d] : 0;
                }
    void *dv = to_device(hv, (size_t)n), *dvt = NULL;
    CUDA_OK(cudaMalloc(&dvt, (size_t)B * HK * D * KP));
    CUDA_OK(cudaMemset(dvt, 0xA5, (size_t)B * HK * D * KP));
    t.v = (const uint8_t *)dv + v_off;
    t.vt = (uint8_t *)dvt;
    CHECK(fa3c_fp8_transpose_v(&t, NULL) == FA3C_STATUS_OK, "transpose: %s", fa3c_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got, dvt, (size_t)B * HK * D * KP, cudaMemcpyDeviceToHost));
    int64_t wrong = 0;
    for (int64_t i = 0; i < (int64_t)B * HK * D * KP; i++) wrong += got[i] != want[i];
    printf("  V transpose: %lld of %lld bytes wrong\n", (long long)wrong, (long long)B * HK * D * KP);
    CHECK(wrong == 0, "%lld bytes of the transposed V differ", (long long)wrong);
    cudaFree(dv);
    cudaFree(dvt);
    free(hv);
    free(want);
    free(got);
}

TEST(fp8_fwd_hdim128) {
    REQUIRE_CUDA_FP8();
    run_case("hdim 128", fcase(2, 384, 384, 4, 4, 128));
    run_case("seqlen 1", fcase(1, 1, 1, 2, 2, 128));
    run_case("seqlen 17 / 1000", fcase(1, 17, 1000, 2, 1, 128));
}

TEST(fp8_fwd_hdim256) {
    REQUIRE_CUDA_FP8();
    run_case("hdim 256", fcase(1, 300, 300, 2, 2, 256));
    fp8_case c = fcase(1, 260, 700, 4, 2, 256);
    c.causal = 1;
    run_case("hdim 256 causal GQA", c);
}

TEST(fp8_fwd_masks) {
    REQUIRE_CUDA_FP8();
    fp8_case c = fcase(2, 512, 512, 2, 2, 128);
    c.causal = 1;
    run_case("causal", c);
    c = fcase(1, 300, 100, 2, 2, 128);   // the first 200 queries see no key: lse -inf, output 0
    c.causal = 1;
    run_case("causal sq > sk", c);
    c = fcase(1, 400, 400, 2, 2, 128);
    c.window_left = 70;
    c.window_right = 10;
    run_case("window (70, 10)", c);
}

TEST(fp8_fwd_gqa_softcap_logits) {
    REQUIRE_CUDA_FP8();
    run_case("GQA 6:1", fcase(1, 256, 256, 12, 2, 128));
    fp8_case c = fcase(1, 256, 300, 2, 2, 128);
    c.softcap = 5.f;
    run_case("softcap 5", c);
    c = fcase(1, 256, 256, 2, 2, 128);
    c.outlier = 20.f;
    run_case("large logits", c);
    c = fcase(1, 200, 200, 2, 2, 128);
    c.descales = 0;
    run_case("no descales", c);
}

// Descales per block of 128 rows (q_block_descale, k_, v_), each block's
// values that much larger or smaller: a score scale per key block, O kept
// in the current V block's unit (fp8_v_ratio).
TEST(fp8_fwd_block_descales) {
    REQUIRE_CUDA_FP8();
    fp8_case c = fcase(2, 400, 520, 4, 2, 128);
    c.blocks = 1;
    run_case("blocks hdim 128 GQA", c);
    c.causal = 1;
    run_case("blocks causal", c);
    c = fcase(1, 300, 300, 2, 2, 256);
    c.blocks = 1;
    c.window_left = 150;
    c.window_right = 40;
    run_case("blocks hdim 256 window", c);
    c = fcase(1, 256, 384, 2, 2, 128);
    c.blocks = 1;
    c.softcap = 5.f;
    c.descales = 0;
    run_case("blocks softcap, no head descales", c);
}

// Head dims below an instance's run on the next one up (FA3C_FP8_KERNEL_HEADDIM):
// q's and k's columns past the head dim and Vᵀ's rows are TMA's zeros, O's
// columns past it are not written (run_case: every element checked, nothing
// outside written). A head dim that is no multiple of 32 says so (below).
TEST(fp8_fwd_padded_head_dims) {
    REQUIRE_CUDA_FP8();
    fp8_case c = fcase(1, 200, 260, 4, 2, 64);
    c.causal = 1;
    run_case("hdim 64 causal GQA", c);
    run_case("hdim 96", fcase(2, 130, 300, 2, 2, 96));
    run_case("hdim 32", fcase(1, 64, 100, 2, 2, 32));
    c = fcase(1, 300, 300, 2, 1, 192);
    c.blocks = 1;
    run_case("hdim 192 blocks", c);
    c = fcase(1, 150, 200, 2, 2, 160);
    c.softcap = 5.f;
    c.window_left = 60;
    c.window_right = 0;
    run_case("hdim 160 softcap window", c);
}

TEST(fp8_fwd_head_dim_not_supported) {
    REQUIRE_CUDA_FP8();
    const fa3c_status st = e4m3_supported(80);
    CHECK(st == FA3C_STATUS_NOT_SUPPORTED && strstr(fa3c_last_error(), "multiples of 32"),
          "hdim 80: %s, '%s'", fa3c_status_string(st), fa3c_last_error());
}

// Small shapes for compute-sanitizer (tools/gpu.sh bwd-fp8): ragged blocks,
// causal GQA, both kernels' head dims and a padded one on each.
TEST(fp8_fwd_small) {
    REQUIRE_CUDA_FP8();
    fp8_case c = fcase(1, 70, 150, 4, 2, 128);
    c.causal = 1;
    run_case("small causal GQA", c);
    run_case("small hdim 256", fcase(1, 40, 33, 2, 2, 256));
    run_case("small hdim 96 (padded)", fcase(1, 50, 70, 2, 1, 96));
    run_case("small hdim 160 (padded)", fcase(1, 33, 140, 2, 2, 160));
    c = fcase(1, 200, 150, 2, 1, 128);
    c.blocks = 1;
    run_case("small blocks", c);
}

TEST_MAIN()
