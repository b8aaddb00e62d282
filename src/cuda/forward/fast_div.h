/* n / d and n % d for 0 <= n < 2^31 and a divisor d >= 1 that is fixed for
 * a kernel launch: the host precomputes a multiplier and a shift, and the
 * device divides with a high multiply, an add and a shift instead of the
 * ~20-instruction integer division (the tile scheduler divides several
 * times per tile: 6.6% of the warp samples at seqlen 512). With s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1,
 * n / d = (umulhi(n, m) + n) >> s. C99 and CUDA; tests/test_fast_div.c
 * checks it against the division. */
#ifndef FA3C_FAST_DIV_H
#define FA3C_FAST_DIV_H

#include <stdint.h>

typedef struct fa3c_fast_div {
    int32_t d;
    uint32_t mul, shift;
} fa3c_fast_div;

#ifdef __CUDACC__
#define FA3C_FAST_DIV_HD static __host__ __device__ __forceinline__
#else
#define FA3C_FAST_DIV_HD static inline
#endif

/* d >= 1. */
FA3C_FAST_DIV_HD fa3c_fast_div fa3c_fast_div_make(int32_t d) {
    fa3c_fast_div f;
    uint32_t s = 0;
    while (((uint64_t)1 << s) < (uint64_t)d) s++;
    f.d = d;
    f.shift = s;
    f.mul = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << s) - (uint64_t)d)) / (uint64_t)d + 1);
    return f;
}

FA3C_FAST_DIV_HD uint32_t fa3c_umulhi(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

/* 0 <= n < 2^31; for d = 1 (mul 1, shift 0) any n, negative too. */
FA3C_FAST_DIV_HD int32_t fa3c_div(int32_t n, fa3c_fast_div f) {
    return (int32_t)((fa3c_umulhi((uint32_t)n, f.mul) + (uint32_t)n) >> f.shift);
}
FA3C_FAST_DIV_HD int32_t fa3c_mod(int32_t n, fa3c_fast_div f) { return n - fa3c_div(n, f) * f.d; }

#endif
