/* fa3c_quantize_fp8 on the CPU backends (src/api.c validated p): per block
 * of (batch, group of heads; with block_rows, of rows too), the rows
 * optionally rotated (random signs, then the Hadamard transform), the
 * block's largest |value| found, then every value divided by descale =
 * amax / 448 and rounded to e4m3. */
#include <math.h>

#include "backend.h"
#include "convert.h"
#include "cpu.h"

/* Row (b, s, h) of x as floats, rotated when asked (api.c checked the signs). */
static void load_row(const fa3c_quantize_params *p, int b, int s, int h, float *row) {
    const int64_t *st = p->x.stride;
    const int64_t base = b * st[0] + s * st[1] + h * st[2];
    for (int c = 0; c < p->headdim; c++) row[c] = fa3c_load_f(p->x.data, p->dtype, base + c);
    if (p->hadamard) fa3c_cpu_hadamard_rows(row, 1, p->headdim, p->signs);
}

fa3c_status fa3c_cpu_quantize_fp8(const fa3c_quantize_params *p) {
    const int group = p->group ? p->group : 1, blocks = p->heads / group;
    /* Rows per descale: all of them, or blocks of block_rows (the last one shorter). */
    const int rows = p->block_rows ? p->block_rows : p->seqlen;
    const int row_blocks = p->block_rows ? (p->seqlen + p->block_rows - 1) / p->block_rows : 1;
    float row[512];
    for (int b = 0; b < p->batch; b++)
        for (int g = 0; g < blocks; g++)
            for (int r = 0; r < row_blocks; r++) {
                const int s0 = r * rows, s1 = s0 + rows < p->seqlen ? s0 + rows : p->seqlen;
                float amax = 0.f;   /* NaN and inf win: they must reach the descale */
                for (int h = g * group; h < (g + 1) * group; h++)
                    for (int s = s0; s < s1; s++) {
                        load_row(p, b, s, h, row);
                        for (int c = 0; c < p->headdim; c++) {
                            const float a = fabsf(row[c]);
                            if (a > amax || isnan(a)) amax = isnan(amax) ? amax : a;
                        }
                    }
                const float descale = amax == 0.f ? 1.f : amax / 448.f;
                p->descale[((int64_t)b * blocks + g) * row_blocks + r] = descale;
                for (int h = g * group; h < (g + 1) * group; h++)
                    for (int s = s0; s < s1; s++) {
                        load_row(p, b, s, h, row);
                        uint8_t *o = (uint8_t *)p->out.data + b * p->out.stride[0] + s * p->out.stride[1] +
                                     h * p->out.stride[2];
                        for (int c = 0; c < p->headdim; c++) o[c] = fa3c_float_to_e4m3(row[c] / descale);
                    }
            }
    return FA3C_STATUS_OK;
}
