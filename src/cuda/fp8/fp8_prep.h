/* The fp8 forward's V transpose (fp8_prep.cu) and kernel instances. */
#ifndef FA3C_FP8_PREP_H
#define FA3C_FP8_PREP_H

#include "fa3c.h"
#include "fp8_params.h"

#ifdef __cplusplus
extern "C" {
#endif

fa3c_status fa3c_fp8_transpose_v(const fa3c_fp8_vt_params *p, void *stream);

/* An e4m3 kernel instance's launcher (fp8_launch.cuh; fp8_host.c finds those built). */
typedef fa3c_status (*fa3c_fp8_launcher)(const fa3c_fp8_kernel_params *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif
