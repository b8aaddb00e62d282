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
 * rows_pad) per (batch, head, row); dq_accum and the dQ turn counters
 * zeroed. */
fa3c_status fa3c_bwd_prep(const fa3c_bwd_prep_params *p, int fp16, void *stream);

/* After: dq = softmax_scale · dq_accum, in the input dtype. */
fa3c_status fa3c_bwd_write_dq(const fa3c_bwd_prep_params *p, int fp16, void *stream);

/* The backward kernel instances (src/cuda/inst/bwd_*.cu). */
typedef fa3c_status (*fa3c_bwd_launcher)(const fa3c_bwd_kernel_params *p, void *stream);
#define FA3C_BWD_INSTANCE_LIST(X) \
    X(bf16_hdim64, FA3C_DTYPE_BF16, 64) \
    X(bf16_hdim128, FA3C_DTYPE_BF16, 128) \
    X(bf16_hdim192, FA3C_DTYPE_BF16, 192) \
    X(bf16_hdim256, FA3C_DTYPE_BF16, 256) \
    X(fp16_hdim64, FA3C_DTYPE_FP16, 64) \
    X(fp16_hdim128, FA3C_DTYPE_FP16, 128) \
    X(fp16_hdim192, FA3C_DTYPE_FP16, 192) \
    X(fp16_hdim256, FA3C_DTYPE_FP16, 256)
#define FA3C_DECLARE_BWD(name, dtype, hdim) \
    fa3c_status fa3c_bwd_sm90_##name(const fa3c_bwd_kernel_params *p, void *stream);
FA3C_BWD_INSTANCE_LIST(FA3C_DECLARE_BWD)
#undef FA3C_DECLARE_BWD

#ifdef __cplusplus
}
#endif
#endif
