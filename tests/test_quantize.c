/* fa3c_quantize_fp8 on the CPU backend: against a float64 rotation and
 * quantization (bf16 and fp32 inputs, groups of heads, padded strides, the
 * Hadamard rotation with random signs, head dims 16-256); NaN and all-zero
 * blocks; refusals by name with nothing written; and what the rotation is for:
 * on N(0,1) inputs with 0.1% N(0,10^2) outliers, the e4m3 forward's error
 * against the float64 attention of the unquantized inputs is lower with it.
 * tests/gpu/test_quantize_gpu.cu runs the same calls on the GPU against this
 * backend. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

/* Row x (d doubles) rotated: signs, then H / sqrt(d) with H the Sylvester Hadamard matrix. */
static void rotate64(double *x, int d, const float *signs) {
    double y[512];
    for (int i = 0; i < d; i++) {
        double acc = 0;
        for (int j = 0; j < d; j++)   /* H[i][j] = (-1)^popcount(i & j) */
            acc += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[j] * (signs ? signs[j] : 1.0);
        y[i] = acc / sqrt((double)d);
    }
    memcpy(x, y, (size_t)d * sizeof(double));
}

typedef struct {
    fa3c_dtype dt;
    int b, s, h, d, group, hadamard, pad;
    int block_rows;   /* 0, or FA3C_FP8_BLOCK_ROWS: a descale per block of rows too */
} qcase;

static void check_case(const qcase *c) {
    const int es = (int)tu_dtype_size(c->dt), row = c->h * c->d + c->pad, blocks = c->h / c->group;
    const int rows = c->block_rows ? c->block_rows : c->s, nr = c->block_rows ? (c->s + rows - 1) / rows : 1;
    void *x = tu_alloc((size_t)c->b * c->s * row * es);
    uint8_t *out = (uint8_t *)tu_alloc((size_t)c->b * c->s * row);
    float *descale = (float *)tu_alloc((size_t)c->b * blocks * nr * 4), signs[256];
    tu_fill_normal(x, c->dt, (int64_t)c->b * c->s * row, 2.f);
    memset(out, 0xee, (size_t)c->b * c->s * row);
    for (int j = 0; j < c->d && j < 256; j++) signs[j] = tu_rand_int(0, 1) ? 1.f : -1.f;
    fa3c_quantize_params p;
    fa3c_quantize_params_init(&p);
    p.dtype = c->dt, p.batch = c->b, p.seqlen = c->s, p.heads = c->h, p.headdim = c->d, p.group = c->group;
    p.x = (fa3c_tensor){x, {(int64_t)c->s * row, row, c->d, 1}};
    p.out = (fa3c_tensor){out, {(int64_t)c->s * row, row, c->d, 1}};
    p.descale = descale;
    p.hadamard = c->hadamard;
    p.signs = c->hadamard ? signs : NULL;
    p.block_rows = c->block_rows;
    CHECK(fa3c_quantize_fp8(&p, NULL) == FA3C_STATUS_OK, "quantize: %s", fa3c_last_error());
    double worst = 0, *v = (double *)tu_alloc((size_t)c->s * c->group * c->d * sizeof(double));
    int pad_ok = 1;
    for (int b = 0; b < c->b; b++)
        for (int gr = 0; gr < blocks * nr; gr++) {
            const int g = gr / nr, s0 = gr % nr * rows, s1 = s0 + rows < c->s ? s0 + rows : c->s;
            double amax = 0;
            for (int hh = 0; hh < c->group; hh++)
                for (int s = s0; s < s1; s++) {
                    double *r = v + ((int64_t)hh * c->s + s) * c->d;
                    for (int j = 0; j < c->d; j++)
                        r[j] = tu_load(x, c->dt, ((int64_t)b * c->s + s) * row + (g * c->group + hh) * c->d + j);
                    if (c->hadamard) rotate64(r, c->d, signs);
                    for (int j = 0; j < c->d; j++) amax = fmax(amax, fabs(r[j]));
                }
            const double want = amax / 448, got = descale[b * blocks * nr + gr];
            CHECK(fabs(got - want) <= 1e-6 * want, "descale[%d][%d][%d] %.9g, want %.9g", b, g, gr % nr, got, want);
            for (int hh = 0; hh < c->group; hh++)
                for (int s = s0; s < s1; s++) {
                    const uint8_t *o = out + ((int64_t)b * c->s + s) * row + (g * c->group + hh) * c->d;
                    for (int j = 0; j < c->d; j++) {
                        const double ref = v[((int64_t)hh * c->s + s) * c->d + j];
                        /* half an e4m3 step: 2^-4 relative, 2^-10 of the descale among subnormals; float rounding */
                        const double err = fabs(fa3c_e4m3_to_float(o[j]) * got - ref);
                        const double bound = 0x1p-4 * fabs(ref) + 0x1p-10 * got + 1e-5 * amax;
                        if (err / bound > worst) worst = err / bound;
                    }
                    if (c->pad && hh == c->group - 1 && g == blocks - 1)   /* the padding is not written */
                        for (int j = 0; j < c->pad; j++) pad_ok &= o[c->d + j] == 0xee;
                }
        }
    CHECK(worst <= 1.0, "%s b%d s%d h%d d%d group %d hadamard %d block_rows %d: dequantized error %.3g of the bound",
          tu_dtype_name(c->dt), c->b, c->s, c->h, c->d, c->group, c->hadamard, c->block_rows, worst);
    CHECK(pad_ok, "the row padding was written");
    free(x), free(out), free(descale), free(v);
}

TEST(quantize_matches_float64) {
    const qcase cases[] = {
        {FA3C_DTYPE_BF16, 2, 37, 4, 64, 1, 0, 0},  {FA3C_DTYPE_BF16, 2, 37, 4, 64, 4, 1, 8},
        {FA3C_DTYPE_FP32, 1, 9, 6, 128, 3, 1, 0},  {FA3C_DTYPE_FP16, 3, 5, 2, 256, 1, 1, 16},
        {FA3C_DTYPE_BF16, 1, 33, 2, 16, 2, 1, 0},  {FA3C_DTYPE_FP32, 2, 7, 3, 24, 1, 0, 4},
        {FA3C_DTYPE_BF16, 1, 300, 1, 8, 1, 1, 0},
        /* a descale per block of 128 rows too: the last block short, or the only one */
        {FA3C_DTYPE_BF16, 2, 300, 4, 64, 2, 1, 8, FA3C_FP8_BLOCK_ROWS}, {FA3C_DTYPE_FP32, 1, 128, 2, 32, 1, 0, 0, FA3C_FP8_BLOCK_ROWS},
        {FA3C_DTYPE_FP16, 1, 40, 3, 16, 3, 0, 0, FA3C_FP8_BLOCK_ROWS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
}

static fa3c_quantize_params small(float *x, uint8_t *out, float *descale) {
    fa3c_quantize_params p;
    fa3c_quantize_params_init(&p);
    p.dtype = FA3C_DTYPE_FP32, p.batch = 1, p.seqlen = 4, p.heads = 2, p.headdim = 8;
    p.x = tu_tensor(x, 1, 4, 2, 8), p.out = tu_tensor(out, 1, 4, 2, 8), p.descale = descale;
    return p;
}

TEST(quantize_nan_zero_and_refusals) {
    float x[64], descale[2] = {-7.f, -7.f}, signs[8] = {1, -1, 1, 1, -1, 1, 1, 1};
    uint8_t out[64];
    for (int i = 0; i < 64; i++) x[i] = (i / 8) % 2 ? (float)(i % 5) - 2.f : 0.f;   /* head 0 all zeros */
    x[8 + 3] = NAN;                                                              /* head 1: one NaN */
    fa3c_quantize_params p = small(x, out, descale);
    CHECK(fa3c_quantize_fp8(&p, NULL) == FA3C_STATUS_OK, "%s", fa3c_last_error());
    CHECK(descale[0] == 1.f, "an all-zero block's descale is %g, want 1", descale[0]);
    CHECK(isnan(descale[1]), "a block with a NaN has descale %g, want NaN", descale[1]);
    int zeros = 1, nans = 1;
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < 8; j++) zeros &= out[s * 16 + j] == 0, nans &= isnan(fa3c_e4m3_to_float(out[s * 16 + 8 + j]));
    CHECK(zeros && nans, "zeros -> 0x00 (%d), NaN block -> NaN everywhere (%d)", zeros, nans);

    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    struct { const char *what; fa3c_quantize_params p; } bad[12];
    int n = 0;
    bad[n].what = "group", bad[n].p = p, bad[n].p.group = 3, n++;
    bad[n].what = "hadamard", bad[n].p = p, bad[n].p.hadamard = 1, bad[n].p.headdim = 6, n++;
    bad[n].what = "signs: given with hadamard = 0", bad[n].p = p, bad[n].p.signs = signs, n++;
    bad[n].what = "signs[1]", bad[n].p = p, bad[n].p.hadamard = 1, bad[n].p.signs = signs, n++;
    bad[n].what = "out: overlaps x", bad[n].p = p, bad[n].p.out.data = (uint8_t *)x + 3, n++;
    bad[n].what = "descale: overlaps x", bad[n].p = p, bad[n].p.descale = x + 60, n++;
    bad[n].what = "descale: is NULL", bad[n].p = p, bad[n].p.descale = NULL, n++;
    bad[n].what = "dtype", bad[n].p = p, bad[n].p.dtype = FA3C_DTYPE_E4M3, n++;
    bad[n].what = "out: stride", bad[n].p = p, bad[n].p.out.stride[1] = 4, n++;
    bad[n].what = "headdim", bad[n].p = p, bad[n].p.headdim = 0, n++;
    bad[n].what = "block_rows", bad[n].p = p, bad[n].p.block_rows = 64, n++;
    signs[1] = 0.5f;
    for (int i = 0; i < n; i++) {
        memset(out, 0x5a, sizeof out);
        descale[0] = descale[1] = -7.f;
        const fa3c_status c = fa3c_quantize_fp8_check(&bad[i].p), s = fa3c_quantize_fp8(&bad[i].p, NULL);
        CHECK(c == BAD && s == BAD, "'%s': check %s, call %s", bad[i].what, fa3c_status_string(c), fa3c_status_string(s));
        CHECK(strstr(fa3c_last_error(), bad[i].what) != NULL, "message '%s' lacks '%s'", fa3c_last_error(), bad[i].what);
        int kept = descale[0] == -7.f && descale[1] == -7.f;
        for (int j = 0; j < 64; j++) kept &= out[j] == 0x5a;
        CHECK(kept, "'%s': a refused call wrote", bad[i].what);
    }
    p.batch = 0, p.x.data = NULL, p.out.data = NULL, p.descale = NULL;
    CHECK(fa3c_quantize_fp8(&p, NULL) == FA3C_STATUS_OK, "an empty batch: %s", fa3c_last_error());
}

/* The reason for the rotation (FA3 paper, section 3.3): outliers in q and k. */
TEST(quantize_rotation_lowers_attention_error) {
    enum { S = 256, H = 2, D = 128 };
    const int64_t n = (int64_t)S * H * D;
    float *q = (float *)tu_alloc(n * 4), *k = (float *)tu_alloc(n * 4), *v = (float *)tu_alloc(n * 4), signs[D];
    float *ref = (float *)tu_alloc(n * 4), *lse = (float *)tu_alloc((size_t)S * H * 4);
    uint16_t *out = (uint16_t *)tu_alloc(n * 2);
    uint8_t *q8 = (uint8_t *)tu_alloc(n), *k8 = (uint8_t *)tu_alloc(n), *v8 = (uint8_t *)tu_alloc(n);
    float *out_f = (float *)tu_alloc(n * 4);
    float *arrays[3] = {q, k, v};
    for (int a = 0; a < 3; a++)
        for (int64_t i = 0; i < n; i++)
            arrays[a][i] = (float)(tu_normal() + (tu_uniform() < 0.001 ? 10.0 * tu_normal() : 0.0));
    for (int j = 0; j < D; j++) signs[j] = tu_rand_int(0, 1) ? 1.f : -1.f;
    /* the float64 attention of the unquantized inputs */
    fa3c_fwd_params f;
    fa3c_fwd_params_init(&f);
    tu_problem_shape(&f.problem, FA3C_DTYPE_FP32, 1, S, S, H, H, D);
    f.q = tu_tensor(q, 1, S, H, D), f.k = tu_tensor(k, 1, S, H, D), f.v = tu_tensor(v, 1, S, H, D);
    f.out = tu_tensor(ref, 1, S, H, D), f.lse = lse, f.backend = FA3C_BACKEND_CPU_REFERENCE;
    CHECK(fa3c_fwd(&f, NULL) == FA3C_STATUS_OK, "reference: %s", fa3c_last_error());
    double rmse[4];   /* [2 blocks + rot]: per (batch, head) or per block of 128 rows; rotated or not */
    for (int variant = 0; variant < 4; variant++) {
        const int rot = variant % 2, blocks = variant / 2;
        float descales[3][H * (S / FA3C_FP8_BLOCK_ROWS)];
        uint8_t *dst[3] = {q8, k8, v8};
        for (int a = 0; a < 3; a++) {
            fa3c_quantize_params p;
            fa3c_quantize_params_init(&p);
            p.dtype = FA3C_DTYPE_FP32, p.batch = 1, p.seqlen = S, p.heads = H, p.headdim = D;
            p.x = tu_tensor(arrays[a], 1, S, H, D), p.out = tu_tensor(dst[a], 1, S, H, D), p.descale = descales[a];
            p.hadamard = rot && a < 2, p.signs = rot && a < 2 ? signs : NULL;   /* q and k only */
            p.block_rows = blocks ? FA3C_FP8_BLOCK_ROWS : 0;
            CHECK(fa3c_quantize_fp8(&p, NULL) == FA3C_STATUS_OK, "quantize: %s", fa3c_last_error());
        }
        fa3c_fwd_params g;
        fa3c_fwd_params_init(&g);
        tu_problem_shape(&g.problem, FA3C_DTYPE_E4M3, 1, S, S, H, H, D);
        g.q = tu_tensor(q8, 1, S, H, D), g.k = tu_tensor(k8, 1, S, H, D), g.v = tu_tensor(v8, 1, S, H, D);
        g.out = tu_tensor(out, 1, S, H, D), g.lse = lse;
        if (blocks) g.q_block_descale = descales[0], g.k_block_descale = descales[1], g.v_block_descale = descales[2];
        else g.q_descale = descales[0], g.k_descale = descales[1], g.v_descale = descales[2];
        g.backend = FA3C_BACKEND_CPU;
        CHECK(fa3c_fwd(&g, NULL) == FA3C_STATUS_OK, "e4m3 forward: %s", fa3c_last_error());
        for (int64_t i = 0; i < n; i++) out_f[i] = tu_bf16_to_float(out[i]);
        double se = 0;
        for (int64_t i = 0; i < n; i++) se += ((double)out_f[i] - ref[i]) * ((double)out_f[i] - ref[i]);
        rmse[variant] = sqrt(se / (double)n);
    }
    printf("  e4m3 forward RMSE against float64, hdim %d, 0.1%% outliers x10: per (batch, head) scales %.3g, "
           "with the rotation %.3g; per block of 128 rows %.3g, with the rotation %.3g\n",
           D, rmse[0], rmse[1], rmse[2], rmse[3]);
    CHECK(rmse[1] < rmse[0], "the rotation did not lower the error (%.3g vs %.3g)", rmse[1], rmse[0]);
    /* A block's scale is at most its head's, never coarser: no worse beyond rounding's luck (up to
     * +10% over 40 seeds; on these i.i.d. outliers the blocks' maxima are alike, so about as good). */
    CHECK(rmse[2] <= 1.25 * rmse[0] && rmse[3] <= 1.25 * rmse[1], "block scales raised the error: %.3g, %.3g vs %.3g, %.3g",
          rmse[2], rmse[3], rmse[0], rmse[1]);
    free(q), free(k), free(v), free(ref), free(lse), free(out), free(q8), free(k8), free(v8), free(out_f);
}

TEST_MAIN()
