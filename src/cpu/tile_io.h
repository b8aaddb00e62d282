/* Row loads and stores between tensors of any dtype and float tiles, with the
 * dtype switch outside the inner loop so each loop vectorises. */
#ifndef FA3C_CPU_TILE_IO_H
#define FA3C_CPU_TILE_IO_H

#include <string.h>
#include "cpu/convert.h"

/* dst[0..d) = src[off + c] * mul; dst[d..dp) = 0. */
static inline void load_row_f(float *restrict dst, const void *base, fa3c_dtype dt, int64_t off, int d,
                              int dp, float mul) {
    switch (dt) {
    case FA3C_DTYPE_FP32: {
        const float *s = (const float *)base + off;
        for (int c = 0; c < d; c++) dst[c] = s[c] * mul;
        break;
    }
    case FA3C_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)base + off;
        for (int c = 0; c < d; c++) dst[c] = fa3c_bf16_to_float(s[c]) * mul;
        break;
    }
    case FA3C_DTYPE_FP16: {
        const uint16_t *s = (const uint16_t *)base + off;
        for (int c = 0; c < d; c++) dst[c] = fa3c_half_to_float(s[c]) * mul;
        break;
    }
    default: {
        const uint8_t *s = (const uint8_t *)base + off;
        for (int c = 0; c < d; c++) dst[c] = fa3c_e4m3_decode(s[c]) * mul;
        break;
    }
    }
    for (int c = d; c < dp; c++) dst[c] = 0.0f;
}

/* base[off + c] = src[c] * mul, rounded to dt. */
static inline void store_row_f(void *base, fa3c_dtype dt, int64_t off, const float *restrict src, int d, float mul) {
    switch (dt) {
    case FA3C_DTYPE_FP32: {
        float *o = (float *)base + off;
        for (int c = 0; c < d; c++) o[c] = src[c] * mul;
        break;
    }
    case FA3C_DTYPE_BF16: {
        uint16_t *o = (uint16_t *)base + off;
        for (int c = 0; c < d; c++) o[c] = fa3c_float_to_bf16(src[c] * mul);
        break;
    }
    case FA3C_DTYPE_FP16: {
        uint16_t *o = (uint16_t *)base + off;
        for (int c = 0; c < d; c++) o[c] = fa3c_float_to_half(src[c] * mul);
        break;
    }
    default: {
        uint8_t *o = (uint8_t *)base + off;
        for (int c = 0; c < d; c++) o[c] = fa3c_float_to_e4m3(src[c] * mul);
        break;
    }
    }
}

#endif
