/* The forward kernel instances: one per (dtype, head dim), each in its own
 * src/cuda/inst/fwd_<dtype>_hdim<D>.cu; for hdim 256 a second one with
 * key blocks of 64 for short causal calls (fwd_tiles.h,
 * FA3C_FWD_SHORT_CAUSAL_KEYS_256); and a variable-length one per (dtype,
 * head dim), *_varlen, for calls whose sequences have their own number of
 * keys (seqused_k). The build defines FA3C_INST_<name> for those it compiles
 * (option FA3C_INSTANCES), and backend.c's table lists only those. */
#ifndef FA3C_INSTANCES_H
#define FA3C_INSTANCES_H

#include "fa3c.h"
#include "fwd_params.h"
#include "fwd_tiles.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef fa3c_status (*fa3c_fwd_launcher)(const fa3c_fwd_kernel_params *p, void *stream);

/* X(name, dtype, hdim, BLOCK_N, varlen). (A wider 176-key hdim-128 tile for long
 * non-causal calls was +5% at 8k until the TMA-store epilogue, which has no
 * smem next to it; after that it was even at 8k and 4% slower at 2k:
 * removed, bench/RESULTS.md run 19.) */
#define FA3C_FWD_INSTANCE_LIST(X) \
    X(bf16_hdim64, FA3C_DTYPE_BF16, 64, FA3C_FWD_BLOCK_N(64), 0) \
    X(bf16_hdim96, FA3C_DTYPE_BF16, 96, FA3C_FWD_BLOCK_N(96), 0) \
    X(bf16_hdim128, FA3C_DTYPE_BF16, 128, FA3C_FWD_BLOCK_N(128), 0) \
    X(bf16_hdim192, FA3C_DTYPE_BF16, 192, FA3C_FWD_BLOCK_N(192), 0) \
    X(bf16_hdim256, FA3C_DTYPE_BF16, 256, FA3C_FWD_BLOCK_N(256), 0) \
    X(fp16_hdim64, FA3C_DTYPE_FP16, 64, FA3C_FWD_BLOCK_N(64), 0) \
    X(fp16_hdim96, FA3C_DTYPE_FP16, 96, FA3C_FWD_BLOCK_N(96), 0) \
    X(fp16_hdim128, FA3C_DTYPE_FP16, 128, FA3C_FWD_BLOCK_N(128), 0) \
    X(fp16_hdim192, FA3C_DTYPE_FP16, 192, FA3C_FWD_BLOCK_N(192), 0) \
    X(fp16_hdim256, FA3C_DTYPE_FP16, 256, FA3C_FWD_BLOCK_N(256), 0) \
    X(bf16_hdim256_n64, FA3C_DTYPE_BF16, 256, 64, 0) \
    X(fp16_hdim256_n64, FA3C_DTYPE_FP16, 256, 64, 0) \
    X(bf16_hdim64_varlen, FA3C_DTYPE_BF16, 64, FA3C_FWD_BLOCK_N(64), 1) \
    X(bf16_hdim96_varlen, FA3C_DTYPE_BF16, 96, FA3C_FWD_BLOCK_N(96), 1) \
    X(bf16_hdim128_varlen, FA3C_DTYPE_BF16, 128, FA3C_FWD_BLOCK_N(128), 1) \
    X(bf16_hdim192_varlen, FA3C_DTYPE_BF16, 192, FA3C_FWD_BLOCK_N(192), 1) \
    X(bf16_hdim256_varlen, FA3C_DTYPE_BF16, 256, FA3C_FWD_BLOCK_N(256), 1) \
    X(fp16_hdim64_varlen, FA3C_DTYPE_FP16, 64, FA3C_FWD_BLOCK_N(64), 1) \
    X(fp16_hdim96_varlen, FA3C_DTYPE_FP16, 96, FA3C_FWD_BLOCK_N(96), 1) \
    X(fp16_hdim128_varlen, FA3C_DTYPE_FP16, 128, FA3C_FWD_BLOCK_N(128), 1) \
    X(fp16_hdim192_varlen, FA3C_DTYPE_FP16, 192, FA3C_FWD_BLOCK_N(192), 1) \
    X(fp16_hdim256_varlen, FA3C_DTYPE_FP16, 256, FA3C_FWD_BLOCK_N(256), 1)

/* Each instance's launcher, and the most CTAs per cluster it was built for
 * (1, or 2: FA3C_FWD_CLUSTER in its translation unit, fwd_tiles.h). */
#define FA3C_DECLARE_FWD(name, dtype, hdim, block_n, varlen)                                 \
    fa3c_status fa3c_fwd_sm90_##name(const fa3c_fwd_kernel_params *p, void *stream);         \
    extern const int fa3c_fwd_sm90_##name##_cluster;
FA3C_FWD_INSTANCE_LIST(FA3C_DECLARE_FWD)
#undef FA3C_DECLARE_FWD

#ifdef __cplusplus
}
#endif
#endif
