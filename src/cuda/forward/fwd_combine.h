/* Split-KV: merging the splits' partial results (fwd_combine.cu). */
#ifndef FA3C_FWD_COMBINE_H
#define FA3C_FWD_COMBINE_H

#include "fa3c.h"
#include "fwd_params.h"

/* The most splits a call uses (fwd_host.c); the combine keeps one weight per split in smem. */
#define FA3C_MAX_SPLITS 128

#ifdef __cplusplus
extern "C" {
#endif

/* out (and lse, when p->lse) from p->o_partial and p->lse_partial: for each
 * row, lse = log(sum_s exp(lse_s)) and O = sum_s exp(lse_s - lse) * O_s.
 * headdim: the kernel's (the partials' row width); out gets p->out_cols columns.
 * fp16: out is fp16, else bf16. Launched on `stream` after the forward kernel. */
fa3c_status fa3c_fwd_combine(const fa3c_fwd_kernel_params *p, int headdim, int fp16, void *stream);

#ifdef __cplusplus
}
#endif
#endif
