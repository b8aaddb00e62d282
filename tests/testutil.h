/* Shared helpers for the C tests (CPU and GPU). Valid C11 and C++ (nvcc).
 *
 *   tu_seed_init()          seed from FA3C_SEED or time^pid, printed for replay
 *   tu_normal()             N(0,1) draw;  tu_fill_normal(buf, dt, n, scale)
 *   tu_load / tu_store      element i of a dtype buffer as float
 *   tu_poison(buf, bytes)   NaN pattern (0xff bytes: NaN in fp32/fp16/bf16/e4m3)
 *   tu_max_abs_err / tu_rel_l2_err on float arrays (NaN counts as infinite error)
 *   tu_strides_bshd         contiguous (b, s, h, d) strides
 *   tu_alloc                malloc that aborts on failure
 *   tu_env_long             an integer from the environment, or a default
 *   tu_pick_threads(i)      one OpenMP thread for most of many tiny calls
 */
#ifndef FA3C_TESTUTIL_H
#define FA3C_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "fa3c.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static uint64_t tu_rng_state;
static int tu_rng_ready;

/* Seed once per process: FA3C_SEED=<n> replays a failing run. */
static inline uint64_t tu_seed_init(void) {
    if (tu_rng_ready) return tu_rng_state;
    const char *env = getenv("FA3C_SEED");
    uint64_t seed;
    if (env && *env) seed = strtoull(env, NULL, 0);
    else seed = ((uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)getpid() << 16) ^ (uint64_t)clock();
    seed &= 0xffffffffull; /* short enough to retype */
    printf("seed %llu (replay with FA3C_SEED=%llu)\n", (unsigned long long)seed, (unsigned long long)seed);
    fflush(stdout);
    tu_rng_state = seed;
    tu_rng_ready = 1;
    return seed;
}

/* splitmix64: tiny, good enough for test data */
static inline uint64_t tu_rand_u64(void) {
    if (!tu_rng_ready) tu_seed_init();
    uint64_t z = (tu_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1), never 0 (safe for log). */
static inline double tu_uniform(void) { return ((double)(tu_rand_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* Uniform integer in [lo, hi]. */
static inline int tu_rand_int(int lo, int hi) { return lo + (int)(tu_rand_u64() % (uint64_t)(hi - lo + 1)); }

static inline double tu_normal(void) {
    double u1 = tu_uniform(), u2 = tu_uniform();
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline size_t tu_dtype_size(fa3c_dtype dt) {
    return dt == FA3C_DTYPE_FP32 ? 4 : dt == FA3C_DTYPE_E4M3 ? 1 : 2;
}

static inline const char *tu_dtype_name(fa3c_dtype dt) {
    switch (dt) {
    case FA3C_DTYPE_FP32: return "fp32";
    case FA3C_DTYPE_FP16: return "fp16";
    case FA3C_DTYPE_BF16: return "bf16";
    case FA3C_DTYPE_E4M3: return "e4m3";
    }
    return "?";
}

/* ---- element conversion (independent of the library's own, RNE) ---------- */

static inline float tu_bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t tu_f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float tu_half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp(1024.0 + m, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

static inline uint16_t tu_float_to_half(float f) {
    uint32_t u = tu_f_bits(f), a = u & 0x7fffffffu;
    uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
    double x = fabs((double)f);
    if (x >= 65520.0) return (uint16_t)(s | 0x7c00u);
    int e;
    frexp(x, &e); /* x = m * 2^e, m in [0.5, 1) */
    int q = e - 11 < -24 ? -24 : e - 11; /* quantum exponent: 11 significant bits, subnormal floor */
    double n = nearbyint(ldexp(x, -q)); /* exact scaling; RNE in the default mode */
    double r = ldexp(n, q);
    if (r == 0) return s;
    if (r < ldexp(1.0, -14)) return (uint16_t)(s | (uint16_t)n);
    frexp(r, &e);
    return (uint16_t)(s | (uint16_t)((e + 14) << 10) | (uint16_t)((int)ldexp(r, 11 - e) - 1024));
}

static inline float tu_bf16_to_float(uint16_t h) { return tu_bits_f((uint32_t)h << 16); }

static inline uint16_t tu_float_to_bf16(float f) {
    uint32_t u = tu_f_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* e4m3: the library's conversions are under test in test_fp8.c; tests of
 * attention may rely on them. */
static inline float tu_load(const void *buf, fa3c_dtype dt, int64_t i) {
    switch (dt) {
    case FA3C_DTYPE_FP32: return ((const float *)buf)[i];
    case FA3C_DTYPE_FP16: return tu_half_to_float(((const uint16_t *)buf)[i]);
    case FA3C_DTYPE_BF16: return tu_bf16_to_float(((const uint16_t *)buf)[i]);
    case FA3C_DTYPE_E4M3: return fa3c_e4m3_to_float(((const uint8_t *)buf)[i]);
    }
    return NAN;
}

static inline void tu_store(void *buf, fa3c_dtype dt, int64_t i, float x) {
    switch (dt) {
    case FA3C_DTYPE_FP32: ((float *)buf)[i] = x; break;
    case FA3C_DTYPE_FP16: ((uint16_t *)buf)[i] = tu_float_to_half(x); break;
    case FA3C_DTYPE_BF16: ((uint16_t *)buf)[i] = tu_float_to_bf16(x); break;
    case FA3C_DTYPE_E4M3: ((uint8_t *)buf)[i] = fa3c_float_to_e4m3(x); break;
    }
}

/* n elements of N(0, scale^2), rounded to dt. */
static inline void tu_fill_normal(void *buf, fa3c_dtype dt, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) tu_store(buf, dt, i, (float)(scale * tu_normal()));
}

static inline void *tu_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "testutil: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

/* All-ones bytes are NaN in fp32, fp16, bf16 and e4m3: an unwritten element shows. */
static inline void tu_poison(void *buf, size_t bytes) { memset(buf, 0xff, bytes); }

/* Number of NaN elements (after a poisoned buffer was written, expect 0). */
static inline int64_t tu_count_nan(const void *buf, fa3c_dtype dt, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += isnan(tu_load(buf, dt, i)) ? 1 : 0;
    return c;
}

/* max |a - b|; NaN or inf anywhere (unless both equal infinities) gives +inf. */
static inline double tu_max_abs_err(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(a[i]) && a[i] == b[i]) continue;
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* ||a - b|| / ||b||  (b is the reference). */
static inline double tu_rel_l2_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isinf(a[i]) && a[i] == b[i]) continue;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (isnan(num)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Contiguous strides of a (b, s, h, d) tensor, in elements. */
static inline void tu_strides_bshd(int64_t stride[4], int64_t b, int64_t s, int64_t h, int64_t d) {
    (void)b;
    stride[3] = 1;
    stride[2] = d;
    stride[1] = h * d;
    stride[0] = s * h * d;
}

static inline fa3c_tensor tu_tensor(void *data, int64_t b, int64_t s, int64_t h, int64_t d) {
    fa3c_tensor t;
    t.data = data;
    tu_strides_bshd(t.stride, b, s, h, d);
    return t;
}

/* The shape fields of a problem (everything else keeps fa3c_*_params_init's defaults). */
static inline void tu_problem_shape(fa3c_problem *pr, fa3c_dtype dt, int batch, int seqlen_q, int seqlen_k,
                                    int heads_q, int heads_kv, int headdim) {
    pr->dtype = dt;
    pr->batch = batch;
    pr->seqlen_q = seqlen_q;
    pr->seqlen_k = seqlen_k;
    pr->heads_q = heads_q;
    pr->heads_kv = heads_kv;
    pr->headdim = headdim;
}

/* cu[0] = 0, cu[b + 1] = cu[b] + len[b]: varlen offsets from per-sequence lengths. */
static inline void tu_prefix_sums(const int *len, int n, int32_t *cu) {
    cu[0] = 0;
    for (int b = 0; b < n; b++) cu[b + 1] = cu[b] + len[b];
}

/* A whole tensor (b, s, h, d, any strides) gathered into a contiguous float array. */
static inline void tu_gather(float *dst, const fa3c_tensor *t, fa3c_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d) {
    int64_t k = 0;
    for (int64_t ib = 0; ib < b; ib++)
        for (int64_t is = 0; is < s; is++)
            for (int64_t ih = 0; ih < h; ih++)
                for (int64_t id = 0; id < d; id++)
                    dst[k++] = tu_load(t->data, dt, ib * t->stride[0] + is * t->stride[1] + ih * t->stride[2] + id);
}

/* The integer in environment variable `name` (strtol, any base), or dflt when unset or empty. */
static inline long tu_env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 0) : dflt;
}

/* For tests of thousands of tiny calls: OpenMP's spinning barriers would
 * dominate them (and two test processes on two cores would starve each other:
 * 10x slower under ctest -j2), so call i runs on one thread unless i % 32 == 0,
 * which keeps the default team so that the parallel paths run too. Results do
 * not depend on the thread count (test_cpu_bwd checks it). */
static inline void tu_pick_threads(long i) {
#ifdef _OPENMP
    static int dflt;
    if (!dflt) dflt = omp_get_max_threads();
    omp_set_num_threads(i % 32 == 0 ? dflt : 1);
#else
    (void)i;
#endif
}

#endif
