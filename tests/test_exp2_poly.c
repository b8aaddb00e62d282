/* src/cuda/exp2_poly.h, the FMA-pipe 2^x the forward kernel can use for part
 * of its softmax exponentials, run on the CPU: the same C code, with the
 * round-down add done through the FPU's rounding mode (the kernel uses
 * __fadd_rd). Checks the relative error against exp2 in double, the exact
 * zero for masked scores, and the floor trick. */
#include <fenv.h>
#include <math.h>
#include "harness.h"
#include "testutil.h"
#include "cuda/exp2_poly.h"

/* x + MAGIC rounded toward -inf, as __fadd_rd does on the GPU. */
static float add_round_down(float x, float y) {
    int old = fegetround();
    fesetround(FE_DOWNWARD);
    volatile float a = x, b = y;
    volatile float t = a + b;
    fesetround(old);
    return t;
}

/* The kernel's ex2_fma (ptx.cuh) on the CPU. */
static float exp2_fma_cpu(float x) {
    x = fmaxf(x, -127.f);
    return fa3c_exp2_from_floor(x, add_round_down(x, FA3C_EXP2_MAGIC));
}

static double rel_err(float x) {
    double want = exp2((double)x);
    return fabs((double)exp2_fma_cpu(x) - want) / want;
}

TEST(exp2_poly_relative_error) {
    /* A dense grid over the normal range of the results, plus random points
     * and the points next to every integer (where the cubic meets itself). */
    double worst = 0;
    float worst_x = 0;
    for (int i = 0; i <= 1 << 22; i++) {
        float x = -126.f + 127.f * (float)i / (float)(1 << 22);
        if (x >= 1.f) break;
        double e = rel_err(x);
        if (e > worst) worst = e, worst_x = x;
    }
    for (int i = 0; i < 200000; i++) {
        float x = -126.f * (float)((tu_rand_u64() >> 11) * 0x1.0p-53);
        double e = rel_err(x);
        if (e > worst) worst = e, worst_x = x;
    }
    /* Below -126 the result is a denormal (see the next test): the lower
     * neighbour of -126 is left out. */
    for (int j = -126; j <= 0; j++) {
        float xs[3] = {(float)j, nextafterf((float)j, INFINITY), nextafterf((float)j, -INFINITY)};
        for (int k = 0; k < (j > -126 ? 3 : 2); k++) {
            double e = rel_err(xs[k]);
            if (e > worst) worst = e, worst_x = xs[k];
        }
    }
    CHECK(worst <= 8.7e-5, "max relative error %.3g at x = %.9g (bound 8.7e-5: the cubic's 8.56e-5 plus rounding)",
          worst, worst_x);
    /* Below the rounding of P to fp16 (2^-11) and bf16 (2^-8), which follows. */
    CHECK(worst < 0x1p-11 / 4, "max relative error %.3g", worst);
}

TEST(exp2_poly_masked_and_tiny) {
    /* A masked score is -inf: the clamp to -127 must give exactly +0. */
    float z = exp2_fma_cpu(-INFINITY);
    CHECK(z == 0.f && !signbit(z), "2^-inf = %g", z);
    CHECK(exp2_fma_cpu(-127.f) == 0.f, "2^-127 = %g", exp2_fma_cpu(-127.f));
    CHECK(exp2_fma_cpu(-1000.f) == 0.f, "2^-1000 = %g", exp2_fma_cpu(-1000.f));
    /* (-127, -126): a denormal, never more than 2^-126. */
    for (int i = 1; i < 1000; i++) {
        float x = -127.f + (float)i / 1000.f, y = exp2_fma_cpu(x);
        CHECK(y >= 0.f && y <= 0x1p-126f, "2^%g = %g", x, y);
    }
    CHECK(exp2_fma_cpu(0.f) == 1.f, "2^0 = %.9g", exp2_fma_cpu(0.f));
}

TEST(exp2_poly_floor_trick) {
    /* t = x + 1.5 * 2^23 rounded down holds floor(x) exactly, and t's bits
     * shifted left by 23 are floor(x) << 23 as a 32-bit integer. */
    for (int i = 0; i < 300000; i++) {
        float x = -127.f + 128.f * (float)((tu_rand_u64() >> 11) * 0x1.0p-53);
        if (x >= 1.f) continue;
        float t = add_round_down(x, FA3C_EXP2_MAGIC);
        uint32_t t_bits;
        memcpy(&t_bits, &t, sizeof t);
        int fl = (int)floorf(x);
        CHECK(t - FA3C_EXP2_MAGIC == floorf(x), "x %.9g: t - magic = %.9g, floor %d", x, t - FA3C_EXP2_MAGIC, fl);
        CHECK((uint32_t)(t_bits << 23) == (uint32_t)fl << 23, "x %.9g: bits", x);
        if (harness_failures) return;
    }
}

TEST_MAIN()
