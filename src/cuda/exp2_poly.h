/* 2^x on the FMA pipe, for softmax exponents x <= 0.
 *
 * The forward kernel's softmax is bound by the issue rate of MUFU.EX2 (64 per
 * warp per key block, bench/RESULTS.md run 15). This computes 2^x with FP32
 * adds, FMAs and integer ops instead, so some of the exponentials can move to
 * the FMA pipe (FA3C_FWD_EXP2_FMA_EVERY in fwd_tiles.h; off by default until
 * measured). Split x = j + f with j = floor(x), f in [0, 1); 2^f is a cubic,
 * and 2^j is added to the exponent field. Relative error <= 8.6e-5, below
 * the rounding of P to bf16 or fp16. C99 and CUDA: tests/test_exp2_poly.c
 * checks the same code on the CPU. */
#ifndef FA3C_EXP2_POLY_H
#define FA3C_EXP2_POLY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FA3C_EXP2_HD static __host__ __device__ __forceinline__
#else
#define FA3C_EXP2_HD static inline
#endif

/* 2^f on [0, 1]: the minimax cubic with p(0) = 1 (relative error 8.56e-5). */
#define FA3C_EXP2_C1 0.69511663f
#define FA3C_EXP2_C2 0.22764498f
#define FA3C_EXP2_C3 0.07706724f

FA3C_EXP2_HD float fa3c_exp2_unit(float f) {
    return fmaf(fmaf(fmaf(FA3C_EXP2_C3, f, FA3C_EXP2_C2), f, FA3C_EXP2_C1), f, 1.0f);
}

/* t = x + 1.5 * 2^23, rounded toward -inf: the ulp there is 1, so
 * t = 1.5 * 2^23 + floor(x) exactly, with floor(x) in the low bits of t. */
#define FA3C_EXP2_MAGIC 12582912.0f

/* 2^x for x in [-127, 1), given t as above. x = -127 gives exactly +0 (the
 * clamp of -inf, a masked score); x in (-127, -126) gives a denormal, where
 * MUFU.EX2.FTZ gives 0: both are far below any row sum, which is >= 1. */
FA3C_EXP2_HD float fa3c_exp2_from_floor(float x, float t) {
    float j = t - FA3C_EXP2_MAGIC;   /* floor(x), exact */
    float p = fa3c_exp2_unit(x - j);
    uint32_t p_bits, t_bits;
    memcpy(&p_bits, &p, sizeof p);
    memcpy(&t_bits, &t, sizeof t);
    p_bits += t_bits << 23;          /* + floor(x) << 23: the exponent field scales by 2^floor(x) */
    memcpy(&p, &p_bits, sizeof p);
    return p;
}

#endif
