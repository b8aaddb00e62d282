/* Element conversions for fa3c-run: float <-> storage type, round to
 * nearest even. Written here rather than borrowed from the library so the
 * CLI's check does not share a bug with what it checks (e4m3 excepted: its
 * conversions are tested on their own in tests/test_fp8.c). */
#ifndef FA3C_RUN_ELEM_H
#define FA3C_RUN_ELEM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fa3c.h"

static inline uint32_t elem_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float elem_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float bf16_to_float(uint16_t h) { return elem_float((uint32_t)h << 16); }

static inline uint16_t float_to_bf16(float f) {
    uint32_t u = elem_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float fp16_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0x1f ? (m ? NAN : INFINITY) : e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}

static inline uint16_t float_to_fp16(float f) {
    uint16_t sign = (uint16_t)((elem_bits(f) >> 16) & 0x8000u);
    if (isnan(f)) return (uint16_t)(sign | 0x7e00u);
    double x = fabs((double)f);
    if (x >= 65520.0) return (uint16_t)(sign | 0x7c00u); /* rounds past the largest half */
    int e;
    frexp(x, &e);
    int q = e - 11 < -24 ? -24 : e - 11;    /* exponent of one unit in the last place */
    double n = nearbyint(ldexp(x, -q));     /* RNE under the default rounding mode */
    double r = ldexp(n, q);
    if (r < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)n); /* subnormal (or zero) */
    frexp(r, &e);
    return (uint16_t)(sign | (uint16_t)((e + 14) << 10) | (uint16_t)((int)ldexp(r, 11 - e) - 1024));
}

static inline int elem_size(fa3c_dtype dt) { return dt == FA3C_DTYPE_FP32 ? 4 : dt == FA3C_DTYPE_E4M3 ? 1 : 2; }

/* The output type of a forward on dt: E4M3 in -> BF16 out. */
static inline fa3c_dtype elem_out_dtype(fa3c_dtype dt) { return dt == FA3C_DTYPE_E4M3 ? FA3C_DTYPE_BF16 : dt; }

static inline float elem_load(const void *buf, fa3c_dtype dt, int64_t i) {
    switch (dt) {
    case FA3C_DTYPE_FP32: return ((const float *)buf)[i];
    case FA3C_DTYPE_FP16: return fp16_to_float(((const uint16_t *)buf)[i]);
    case FA3C_DTYPE_BF16: return bf16_to_float(((const uint16_t *)buf)[i]);
    case FA3C_DTYPE_E4M3: return fa3c_e4m3_to_float(((const uint8_t *)buf)[i]);
    }
    return NAN;
}

static inline void elem_store(void *buf, fa3c_dtype dt, int64_t i, float x) {
    switch (dt) {
    case FA3C_DTYPE_FP32: ((float *)buf)[i] = x; break;
    case FA3C_DTYPE_FP16: ((uint16_t *)buf)[i] = float_to_fp16(x); break;
    case FA3C_DTYPE_BF16: ((uint16_t *)buf)[i] = float_to_bf16(x); break;
    case FA3C_DTYPE_E4M3: ((uint8_t *)buf)[i] = fa3c_float_to_e4m3(x); break;
    }
}

/* x rounded to dt and back: what storing an intermediate in dt costs. */
static inline double elem_round(fa3c_dtype dt, double x) {
    switch (dt) {
    case FA3C_DTYPE_FP32: return (float)x;
    case FA3C_DTYPE_FP16: return fp16_to_float(float_to_fp16((float)x));
    case FA3C_DTYPE_BF16: return bf16_to_float(float_to_bf16((float)x));
    case FA3C_DTYPE_E4M3: return fa3c_e4m3_to_float(fa3c_float_to_e4m3((float)x));
    }
    return x;
}

#endif
