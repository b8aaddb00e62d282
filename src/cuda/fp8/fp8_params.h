/* The fp8 (e4m3) forward's parameters and shared definitions
 * (fwd_fp8_sm90.cuh, fp8_prep.cu, fp8_host.c). */
#ifndef FA3C_FP8_PARAMS_H
#define FA3C_FP8_PARAMS_H

#include <cuda.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tiles: 128 query rows per CTA (two consumer warpgroups of 64), key blocks
 * of 128, a ring of K and Vᵀ tiles (FA3C_FP8_STAGES); kernels for head dims
 * 128 and 256 (rows of 128 or 256 bytes: whole 128-byte swizzle chunks). */
#define FA3C_FP8_BLOCK_M 128
#define FA3C_FP8_BLOCK_N 128
/* 1: the consumers overlap softmax(n) with their own P·V(n-1) and take
 * turns issuing their GEMMs (pingpong; fwd_fp8_sm90.cuh). 0: each GEMM is
 * waited for in turn, the first form. 1 is faster on every quick shape and
 * passes the same tests (docs/KNOBS.md). */
#ifndef FA3C_FP8_OVERLAP
#define FA3C_FP8_OVERLAP 1
#endif
/* K/Vᵀ slots in the ring: 2; 3 with FA3C_FP8_OVERLAP, whose loop frees a
 * slot only a block later, once P·V of its block has landed (hdim 256:
 * 32 + 3 x 64 KB, within 227 KB). */
#define FA3C_FP8_STAGES(d) (FA3C_FP8_OVERLAP ? 3 : 2)
/* 1: key blocks that every row of the CTA sees whole (fp8_unmasked_blocks:
 * without a mask or window all but a sequence's ragged last block; causal,
 * all off the diagonal) take their scores without the mask's two compares
 * and select per element, as the bf16 forward does; 0: every block masked.
 * On: with the three below, +33% to +41% at hdim 128 (docs/KNOBS.md). */
#ifndef FA3C_FP8_UNMASKED_BLOCKS
#define FA3C_FP8_UNMASKED_BLOCKS 1
#endif
/* 1: the scores' softcap in a loop of its own under one uniform branch;
 * 0: inside the mask's loop, where ptxas predicates it, so calls without
 * softcap still issue its two multiplies and tanh per element (a fifth of
 * the hdim-128 loop's instructions). On (docs/KNOBS.md). */
#ifndef FA3C_FP8_SOFTCAP_LOOP
#define FA3C_FP8_SOFTCAP_LOOP 1
#endif
/* 1: the scores stay unscaled until the exp, whose subtraction takes the
 * scale in one FFMA (the row maximum is scaled once per row), saving a
 * multiply per element; 0: scaled as they come out of the GEMM. On
 * (docs/KNOBS.md). */
#ifndef FA3C_FP8_FUSED_SCALE
#define FA3C_FP8_FUSED_SCALE 1
#endif
/* 1: the overlapped loop skips O's rescale in a warp whose rows all kept
 * their maximum (a rescale of exactly 1), D / 2 multiplies per thread; 0:
 * every block rescales. On (docs/KNOBS.md). */
#ifndef FA3C_FP8_LAZY_RESCALE
#define FA3C_FP8_LAZY_RESCALE 1
#endif
/* N > 0: one of every N of a row's 8-key column groups takes its exps on the
 * FMA pipe (ex2_poly) instead of MUFU.EX2, whose 16 results per SM per clock
 * make the hdim-128 loop's 66 exps per warp and key block as long as its
 * GEMMs (docs/FP8.md); 0: every exp on MUFU. An experiment until its A/B
 * (docs/KNOBS.md). */
#ifndef FA3C_FP8_POLY_EXP
#define FA3C_FP8_POLY_EXP 0
#endif
#define FA3C_FP8_THREADS 384
#define FA3C_FP8_PRODUCER_REGS 24
#define FA3C_FP8_CONSUMER_REGS 240
/* The kernel instances' head dims. */
#define FA3C_FP8_HEADDIM_OK(d) ((d) == 128 || (d) == 256)
/* The instance that runs a call's head dim d: any multiple of 32 up to 256
 * (fp8_prep.cu's V transpose moves tiles of 32 columns), on the next
 * instance up; the columns past d are TMA's zero fill, which adds nothing to
 * Q·Kᵀ or P·V, and O's past d are not written. 0: none. */
#define FA3C_FP8_KERNEL_HEADDIM(d) ((d) <= 0 || (d) % 32 != 0 ? 0 : (d) <= 128 ? 128 : (d) <= 256 ? 256 : 0)

typedef struct fa3c_fp8_kernel_params {
    /* e4m3 boxes of 128 bytes (columns) with the 128-byte swizzle: Q of 128
     * rows, K of 128 keys, Vᵀ (the transposed copy fp8_prep.cu writes) of
     * the kernel's head dim in rows x 128 keys. Rows past the end, and the
     * columns (Vᵀ: rows) past a smaller call's head dim, read as zeros. */
    CUtensorMap q_map, k_map, vt_map;
    void *out;                       /* bf16, element strides (batch, seqlen, heads), even */
    int64_t out_stride[3];
    float *lse;                      /* NULL = not written; (batch, heads_q, seqlen_q), natural log */
    const float *q_descale, *k_descale, *v_descale;   /* (batch, heads_kv); NULL = 1 */
    /* Per block of FA3C_FP8_BLOCK_ROWS rows, times the above: q (batch,
     * heads_q, ceil(seqlen_q / 128)), k and v (batch, heads_kv, ceil(seqlen_k
     * / 128)); NULL = 1. A query tile and a key block are one such block. */
    const float *q_block_descale, *k_block_descale, *v_block_descale;
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, group;
    float softmax_scale;
    float softcap;                   /* 0 = off */
    int window_left, window_right;   /* -1 = unbounded; causal is right = 0 (bottom-right aligned) */
    int headdim;                     /* the call's, at most the kernel's (FA3C_FP8_KERNEL_HEADDIM): O's columns */
} fa3c_fp8_kernel_params;

/* fp8_prep.cu: V (batch, seqlen_k, heads_kv, headdim), element strides, to
 * Vᵀ (batch, heads_kv, headdim, keys_pad) contiguous, zero past seqlen_k. */
typedef struct fa3c_fp8_vt_params {
    const uint8_t *v;
    int64_t v_stride[3];
    uint8_t *vt;
    int batch, seqlen_k, heads_kv, headdim, keys_pad;
} fa3c_fp8_vt_params;

#ifdef __CUDACC__
#define FA3C_FP8_HD __host__ __device__
#else
#define FA3C_FP8_HD
#endif

/* The key that column `slot` of a 32-key group of Vᵀ holds (its offset in
 * the group). e4m3's register-A fragment of a k-step (32 keys) gives thread
 * t of a quad keys 4t..4t+3 and 16+4t..16+4t+3 of a row, while the f32
 * accumulator of S gives it keys 2t, 2t+1, 8+2t, 9+2t (and 16 more): so
 * P's fragment is packed from the accumulator as it stands, with A's slot
 * 4t+i holding key 2t + (i & 1) + 8 (i >> 1), and Vᵀ's keys are stored in
 * that order, so that P·V pairs each probability with its key's row. */
static inline FA3C_FP8_HD int fa3c_fp8_key_of_slot(int slot) {
    const int x = slot & 15, t = x >> 2, i = x & 3;
    return (slot & 16) + 2 * t + (i & 1) + 8 * (i >> 1);
}

#ifdef __cplusplus
}
#endif
#endif
