/* Internal declarations of the CPU backend (not exported, not public). */
#ifndef FA3C_CPU_H
#define FA3C_CPU_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Naive forward in the input precision, as FA's tests' attention_ref(upcast=False):
 * float accumulation, but q·scale, the scores (and each softcap step), the
 * probabilities and the output are rounded to the input dtype (BF16 for E4M3
 * inputs, which are dequantized first). Writes out and, if set, lse (float
 * log-sum-exp of the rounded scores). The accuracy rule measures a kernel
 * against 2x this function's error versus fa3c_cpu_fwd_reference. */
fa3c_status fa3c_cpu_fwd_reference_lowp(const fa3c_fwd_params *p);

/* dq rows past problem.seqused_q (stored but not used) are zeros: both CPU
 * backwards call this first. */
void fa3c_cpu_zero_unused_dq_rows(const fa3c_bwd_params *p);

/* fa3c_hadamard_rotate_f32 on arguments already checked (len a power of two
 * <= 256, signs NULL or +-1): n contiguous rows rotated in place. */
void fa3c_cpu_hadamard_rows(float *x, int64_t n, int len, const float *signs);

#ifdef __cplusplus
}
#endif
#endif
