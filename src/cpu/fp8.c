/* fp8 e4m3fn (OCP): bias 7, largest finite 448, no infinities, NaN = S.1111.111.
 * Encoding rounds to nearest even and saturates: finite overflow and +-inf map to
 * +-448 (as FA3's scaled fp8 paths expect). Every NaN maps to the canonical 0x7f
 * (the sign is dropped), as the public header documents. */
#include "cpu/convert.h"

uint8_t fa3c_float_to_e4m3(float x) {
    uint32_t u = fa3c_float_to_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448 (incl. inf): saturate */
    if (a < 0x3c800000u) { /* below 2^-6: subnormal, units of 2^-9 (code 8 = 2^-6 is right too) */
        float q = fa3c_bits_to_float(a) * 512.0f; /* exact: power-of-two scale */
        uint32_t n = (uint32_t)q;
        float frac = q - (float)n;
        if (frac > 0.5f || (frac == 0.5f && (n & 1u))) n++;
        return (uint8_t)(sign | n);
    }
    /* normal: rebias 127 -> 7 and keep 3 mantissa bits, RNE; a carry bumps the exponent */
    uint32_t t = a - (120u << 23);
    t += 0x7ffffu + ((t >> 20) & 1u);
    return (uint8_t)(sign | (t >> 20));
}

float fa3c_e4m3_to_float(uint8_t x) { return fa3c_e4m3_decode(x); }
