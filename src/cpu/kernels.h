/* Small compute pieces shared by the tiled forward and backward: a register-
 * blocked matrix-multiply micro-kernel and a vectorised exp, both written with
 * GCC/Clang vector extensions so that the same source becomes SSE, AVX2+FMA or
 * AVX-512 code depending on the target of the function that inlines it. */
#ifndef FA3C_CPU_KERNELS_H
#define FA3C_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__GNUC__) && !defined(__clang__)
#  pragma GCC diagnostic ignored "-Wpsabi" /* vector types only cross inlined calls */
#endif

#define VW 8  /* floats per vector */
#define MR 6  /* micro-tile rows: 6 x 16 = 12 accumulators + 2 B vectors + 1 broadcast */
#define NR 16 /* micro-tile columns: two vectors */

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4))); /* unaligned access */

static inline vf vload(const float *p) { return *(const vfu *)p; }
#define vstore(p, x) (*(vfu *)(p) = (x))
/* A broadcast written in place as a vector literal. As a function, GCC 12
 * lowered it before target_clones copied the callers, into a chain of lane
 * inserts instead of one vbroadcastss: the micro-kernel ran 3x slower. */
#define vsplat(x) ((vf){(x), (x), (x), (x), (x), (x), (x), (x)})
/* mask ? a : b, lane-wise (C has no ?: on vectors) */
#define vselect(mask, a, b) ((vf)((((vi)(a)) & (mask)) | (((vi)(b)) & ~(mask))))

/* Function multi-versioning for the hot loops (x86-64 GNU/Linux with ifunc):
 * one binary runs AVX-512 / AVX2+FMA code where available and SSE2 elsewhere. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) && !defined(FA3C_NO_CLONES)
#  define FA3C_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#  define FA3C_HOT
#endif

static inline size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* C[MR x NR] = (acc ? C * (alpha ? alpha[row] : 1) : 0) + A[MR x K] · B[K x NR].
 * A has row stride lda, B row stride ldb, C row stride ldc (all in floats). */
static inline __attribute__((always_inline)) void
micro_6x16(int K, const float *restrict A, int lda, const float *restrict B, int ldb,
           float *restrict C, int ldc, int acc, const float *restrict alpha) {
    vf c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (acc) {
#define LOADC(r)                                                                  \
    {                                                                             \
        vf s = vsplat(alpha ? alpha[r] : 1.0f);                                   \
        c##r##0 = vload(C + (r) * ldc) * s;                                       \
        c##r##1 = vload(C + (r) * ldc + VW) * s;                                  \
    }
        LOADC(0) LOADC(1) LOADC(2) LOADC(3) LOADC(4) LOADC(5)
#undef LOADC
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = vsplat(0.0f);
    }
    for (int k = 0; k < K; k++) {
        const vf b0 = vload(B + (int64_t)k * ldb), b1 = vload(B + (int64_t)k * ldb + VW);
        vf a;
        a = vsplat(A[k]);           c00 += a * b0; c01 += a * b1;
        a = vsplat(A[lda + k]);     c10 += a * b0; c11 += a * b1;
        a = vsplat(A[2 * lda + k]); c20 += a * b0; c21 += a * b1;
        a = vsplat(A[3 * lda + k]); c30 += a * b0; c31 += a * b1;
        a = vsplat(A[4 * lda + k]); c40 += a * b0; c41 += a * b1;
        a = vsplat(A[5 * lda + k]); c50 += a * b0; c51 += a * b1;
    }
#define STOREC(r) vstore(C + (r) * ldc, c##r##0); vstore(C + (r) * ldc + VW, c##r##1);
    STOREC(0) STOREC(1) STOREC(2) STOREC(3) STOREC(4) STOREC(5)
#undef STOREC
}

/* C[M x N] (=|+=) A[M x K] · B[K x N]; M % MR == 0, N % NR == 0. */
static inline __attribute__((always_inline)) void
gemm(int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc,
     int acc, const float *alpha) {
    for (int j = 0; j < N; j += NR)
        for (int i = 0; i < M; i += MR)
            micro_6x16(K, A + (int64_t)i * lda, lda, B + j, ldb, C + (int64_t)i * ldc + j, ldc, acc,
                       alpha ? alpha + i : NULL);
}

/* exp(x), relative error ~2e-7 (Cody-Waite reduction and a degree-7
 * polynomial); exactly 0 for x < -87.3 (incl. -inf), x must not be NaN or > 88. */
static inline __attribute__((always_inline)) vf vexp(vf x) {
    const vf log2e = vsplat(1.44269504088896341f), ln2_hi = vsplat(0.693359375f),
             ln2_lo = vsplat(-2.12194440e-4f), magic = vsplat(12582912.0f); /* 1.5 * 2^23 */
    vf xc = vselect(x < vsplat(-87.0f), vsplat(-87.0f), x);
    vf n = (xc * log2e + magic) - magic; /* round to nearest integer */
    vf r = (xc - n * ln2_hi) - n * ln2_lo; /* |r| <= ln2/2 */
    vf p = vsplat(1.0f / 5040.0f);
    p = p * r + vsplat(1.0f / 720.0f);
    p = p * r + vsplat(1.0f / 120.0f);
    p = p * r + vsplat(1.0f / 24.0f);
    p = p * r + vsplat(1.0f / 6.0f);
    p = p * r + vsplat(0.5f);
    p = p * r + vsplat(1.0f);
    p = p * r + vsplat(1.0f);
    vi e = (__builtin_convertvector(n, vi) + 127) << 23;
    vf y = p * (vf)e;
    return vselect(x < vsplat(-87.3f), vsplat(0.0f), y);
}

/* exp(src[0..VW) - sub). */
static inline __attribute__((always_inline)) vf vexp_sub(const float *src, float sub) {
    return vexp(vload(src) - vsplat(sub));
}

/* 64-byte aligned scratch of n floats (freed with free()). */
static inline float *scratch_floats(size_t n) {
    return (float *)aligned_alloc(64, round_up(n * sizeof(float), 64));
}

#endif
