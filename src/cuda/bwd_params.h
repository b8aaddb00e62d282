/* The backward kernels' parameters (bwd_sm90.cuh, bwd_prep.cu): one POD
 * struct, filled on the host by src/cuda/bwd_host.c and passed by value
 * (__grid_constant__), so the TMA descriptors live in parameter space. */
#ifndef FA3C_BWD_PARAMS_H
#define FA3C_BWD_PARAMS_H

#include <cuda.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fa3c_bwd_kernel_params {
    /* 128B-swizzled boxes of 64 columns: K and V of FA3C_BWD_BLOCK_N rows,
     * Q and dO of FA3C_BWD_BLOCK_M rows; rows past the end read as zeros. */
    CUtensorMap q_map, k_map, v_map, do_map;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
    int group;                 /* heads_q / heads_kv: one CTA walks the query heads of its K/V head */
    int rows_pad;              /* seqlen_q rounded up to FA3C_BWD_BLOCK_M: the row count of the scratch */
    /* Scratch, (batch, heads_q, rows_pad[, headdim]) fp32 (bwd_host.c):
     *   lse_log2  the forward's LSE in log2 units, +inf for fully masked and padding rows (so P = 0 there);
     *   dsum      rowsum(dO ⊙ O), 0 on padding rows (bwd_prep.cu);
     *   dq_accum  zeroed, then += dS·K (unscaled) by every key block (atomics); bwd_prep.cu's
     *             dq kernel scales it and writes dq. */
    const float *lse_log2, *dsum;
    float *dq_accum;
    /* deterministic = 1 (NULL otherwise): per (batch, head, query block) the
     * number of key blocks that have added their dQ to it, zeroed; the key
     * blocks that see a query block add in increasing order, each waiting
     * for its turn (bwd_sm90.cuh, add_dq_in_turn), so dq's sums are
     * bitwise reproducible. */
    int *dq_semaphore;
    int num_m_blocks;          /* rows_pad / FA3C_BWD_BLOCK_M */
    /* dk (scaled by softmax_scale) and dv, written by the main kernel:
     * element strides (batch, seqlen, heads), all even, headdim stride 1. */
    void *dk, *dv;
    int64_t dk_stride[3], dv_stride[3];
    /* Scores: s = q·k, or with softcap s = softcap * tanh(q·k * softcap_pre)
     * (softcap_pre = softmax_scale / softcap; s is then in natural units);
     * P = exp2(s * score_log2 - lse_log2): score_log2 = softmax_scale·log2(e),
     * or log2(e) with softcap. */
    float score_log2;
    float softcap;             /* 0 = off; dS then carries tanh's derivative 1 - (s / softcap)^2 */
    float softcap_pre;
    float softmax_scale;       /* dK = scale · dSᵀQ, dQ = scale · dS K */
    /* The mask as one band: query i sees key j < seqlen_k iff rel_lo <= j - i
     * <= rel_hi (bottom-right aligned: diag = seqlen_k - seqlen_q, rel_lo =
     * diag - window_left, rel_hi = diag + window_right; causal is right = 0),
     * INT_MIN / INT_MAX where unbounded, clamped to int on the host. */
    int rel_lo, rel_hi;
} fa3c_bwd_kernel_params;

/* The preprocessing and dq kernels (bwd_prep.cu): inputs as the API has
 * them, in elements. */
typedef struct fa3c_bwd_prep_params {
    const void *out, *dout;
    int64_t out_stride[3], dout_stride[3];
    const float *lse;          /* the forward's: (batch, heads_q, seqlen_q), natural log */
    float *lse_log2, *dsum, *dq_accum;
    void *dq;
    int64_t dq_stride[3];
    int batch, seqlen_q, heads_q, headdim, rows_pad;
    float softmax_scale;
} fa3c_bwd_prep_params;

#ifdef __cplusplus
}
#endif
#endif
