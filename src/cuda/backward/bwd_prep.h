/* The backward's small kernels around the main one (bwd_prep.cu). */
#ifndef FA3C_BWD_PREP_H
#define FA3C_BWD_PREP_H

#include "fa3c.h"
#include "bwd_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Before: dsum = rowsum(dout ⊙ out) and lse_log2 = lse · log2(e) (+inf for
 * rows the forward masked fully, -inf LSE, and for the padding rows up to
 * rows_pad) per (batch, head, row); dq_accum zeroed, or with dq_written
 * only those flags; the dQ turn counters zeroed. */
fa3c_status fa3c_bwd_prep(const fa3c_bwd_prep_params *p, int fp16, void *stream);

/* After: dq = softmax_scale · dq_accum, in the input dtype. */
fa3c_status fa3c_bwd_write_dq(const fa3c_bwd_prep_params *p, int fp16, void *stream);

/* After the preprocessing, with attention sinks (p->sinks, p->dsinks):
 * dsinks[h] = -Σ exp(sinks[h] - lse) · dsum over the batch and rows, in a
 * fixed order (deterministic). */
fa3c_status fa3c_bwd_dsinks(const fa3c_bwd_prep_params *p, void *stream);

/* A backward kernel instance's launcher (bwd_launch.cuh; bwd_host.c has the
 * table of those built). */
typedef fa3c_status (*fa3c_bwd_launcher)(const fa3c_bwd_kernel_params *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif
