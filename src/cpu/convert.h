/* Element conversions for the CPU backend: bf16, fp16 and e4m3 <-> float, all
 * round-to-nearest-even in software so results do not depend on the host's
 * instruction set. Header-only (static inline) and valid C and C++. */
#ifndef FA3C_CPU_CONVERT_H
#define FA3C_CPU_CONVERT_H

#include <stdint.h>
#include <string.h>
#include "fa3c.h"

static inline float fa3c_bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fa3c_float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float fa3c_bf16_to_float(uint16_t h) { return fa3c_bits_to_float((uint32_t)h << 16); }

static inline uint16_t fa3c_float_to_bf16(float f) {
    uint32_t u = fa3c_float_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u); /* RNE; overflow carries into inf correctly */
    return (uint16_t)(u >> 16);
}

static inline float fa3c_half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return fa3c_bits_to_float(sign | 0x7f800000u | (m << 13));
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float */
        float f = (float)m * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    return fa3c_bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t fa3c_float_to_half(float f) {
    uint32_t u = fa3c_float_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) { /* normal half: rebias, RNE on the 13 dropped bits */
        uint32_t r = a - (112u << 23);
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return sign; /* < 2^-25: rounds to zero (2^-25 itself ties to 0) */
    /* subnormal half: value = m * 2^(e-150) in units of 2^-24 -> shift by 126-e */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(a >> 23);
    uint32_t res = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (res & 1u))) res++;
    return (uint16_t)(sign | res);
}

/* OCP e4m3fn decode: bias 7, no inf, S.1111.111 is NaN. */
static inline float fa3c_e4m3_decode(uint8_t x) {
    uint32_t e = (x >> 3) & 0xfu, m = x & 7u;
    float v;
    if (e == 15 && m == 7) return fa3c_bits_to_float(0x7fc00000u | ((uint32_t)(x & 0x80u) << 24));
    if (e == 0) v = (float)m * (1.0f / 512.0f);
    else v = fa3c_bits_to_float(((e + 120u) << 23) | (m << 20));
    return (x & 0x80u) ? -v : v;
}

static inline size_t fa3c_dtype_size(fa3c_dtype dt) {
    return dt == FA3C_DTYPE_FP32 ? 4 : dt == FA3C_DTYPE_E4M3 ? 1 : 2;
}

/* Element i (in elements) of a buffer of dtype dt, as float. */
static inline float fa3c_load_f(const void *base, fa3c_dtype dt, int64_t i) {
    switch (dt) {
    case FA3C_DTYPE_FP32: return ((const float *)base)[i];
    case FA3C_DTYPE_FP16: return fa3c_half_to_float(((const uint16_t *)base)[i]);
    case FA3C_DTYPE_BF16: return fa3c_bf16_to_float(((const uint16_t *)base)[i]);
    default: return fa3c_e4m3_decode(((const uint8_t *)base)[i]);
    }
}

/* Round x to dtype dt and back (what storing and reloading would give). */
static inline float fa3c_round_to(fa3c_dtype dt, float x);

static inline void fa3c_store_f(void *base, fa3c_dtype dt, int64_t i, float x) {
    switch (dt) {
    case FA3C_DTYPE_FP32: ((float *)base)[i] = x; break;
    case FA3C_DTYPE_FP16: ((uint16_t *)base)[i] = fa3c_float_to_half(x); break;
    case FA3C_DTYPE_BF16: ((uint16_t *)base)[i] = fa3c_float_to_bf16(x); break;
    default: ((uint8_t *)base)[i] = fa3c_float_to_e4m3(x); break;
    }
}

static inline float fa3c_round_to(fa3c_dtype dt, float x) {
    switch (dt) {
    case FA3C_DTYPE_FP32: return x;
    case FA3C_DTYPE_FP16: return fa3c_half_to_float(fa3c_float_to_half(x));
    case FA3C_DTYPE_BF16: return fa3c_bf16_to_float(fa3c_float_to_bf16(x));
    default: return fa3c_e4m3_decode(fa3c_float_to_e4m3(x));
    }
}

/* Output dtype of the forward: the input's, except BF16 for E4M3 inputs. */
static inline fa3c_dtype fa3c_out_dtype(fa3c_dtype in) {
    return in == FA3C_DTYPE_E4M3 ? FA3C_DTYPE_BF16 : in;
}

#endif
