/* Incoherent processing for fp8 (FA3 paper, section 3.3): rotate rows of Q and K by
 * the same random-sign Hadamard matrix so outliers spread across the row while
 * Q·Kᵀ is unchanged. Fast Walsh-Hadamard transform, O(len log len) per row. */
#include <math.h>
#include "cpu.h"

void fa3c_cpu_hadamard_rows(float *x, int64_t n, int len, const float *signs) {
    const float norm = (float)(1.0 / sqrt((double)len));
    for (int64_t r = 0; r < n; r++) {
        float *row = x + r * (int64_t)len;
        if (signs)
            for (int j = 0; j < len; j++) row[j] *= signs[j];
        /* Sylvester butterflies: H_2k = [[H, H], [H, -H]] */
        for (int h = 1; h < len; h <<= 1)
            for (int i = 0; i < len; i += 2 * h)
                for (int j = i; j < i + h; j++) {
                    float a = row[j], b = row[j + h];
                    row[j] = a + b;
                    row[j + h] = a - b;
                }
        for (int j = 0; j < len; j++) row[j] *= norm;
    }
}

fa3c_status fa3c_hadamard_rotate_f32(float *x, int64_t n, int len, const float *signs) {
    if (!x) return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT, "hadamard: x is NULL");
    if (n < 0) return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT, "hadamard: n must be >= 0 (got %lld)", (long long)n);
    if (len < 1 || len > 256 || (len & (len - 1)) != 0)
        return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT,
                          "hadamard: len must be a power of two in [1, 256] (got %d)", len);
    if (signs)   /* anything but +-1 would make the rotation non-orthogonal */
        for (int j = 0; j < len; j++)
            if (signs[j] != 1.0f && signs[j] != -1.0f)
                return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT, "hadamard: signs[%d] must be +1 or -1 (got %g)", j,
                                  (double)signs[j]);
    fa3c_cpu_hadamard_rows(x, n, len, signs);
    fa3c_clear_error();
    return FA3C_STATUS_OK;
}
