/* Tile sizes and register budgets of the backward kernels, shared by the C
 * host code and the CUDA kernels.
 *
 * One CTA owns BLOCK_N(D) keys of one (batch, K/V head) and walks the
 * query blocks of BLOCK_M(D) rows that see them, for every query head of
 * its GQA group; dK and dV stay in the registers of its two consumer
 * warpgroups the whole time, so they need no atomics and are
 * deterministic.
 *
 * Head dims 64-128 (bwd_sm90.cuh): 128 keys, 64 per warpgroup. At hdim 128,
 * 80 query rows per step (FA3's block without a mask): the accumulators of a
 * warpgroup (Sᵀ and dPᵀ 64 x 80, dV and dK 64 x 128, dQᵀ 64 x 80) fit in
 * 240 registers, and each step does a quarter more GEMM work for the same
 * waits and barriers; dQ is computed transposed (dQᵀ = Kᵀ·dSᵀ: wgmma's M is
 * 64 per warpgroup, so 80 queries can only be its N). At
 * hdim 64, dK and dV take half as many, and 128 query rows per step (Sᵀ and
 * dPᵀ 64 x 128) fit: twice the work per step for the same per-step costs
 * (waits, barriers, the softmax's loads), wgmma N = 128 for Sᵀ and dPᵀ, and
 * dQ split by query rows between the warpgroups rather than by keys, so no
 * dQ element is added twice (FA3 takes 128 x 128 at hdim 64 too).
 *
 * Any other head dim (a multiple of 8 up to 256) runs on the next wider
 * kernel (FA3C_BWD_KERNEL_HEADDIM): TMA fills the columns past the tensors'
 * with zeros, which add nothing to S, dP or dQ's sums, and the stores write
 * the tensors' columns only. hdim 96 on hdim 128's kernel: 3/4 of its GEMM
 * work is useful.
 *
 * Head dims 192 and 256 (bwd_wide_sm90.cuh): 64 keys (80 at hdim 256) and
 * 64 query rows; 128 keys' dK + dV would take 256 registers per thread at
 * hdim 256. The warpgroups split dK and dV by head-dim columns (128 of them
 * each at hdim 256), S and dP by keys (32 or 40 each). */
#ifndef FA3C_BWD_TILES_H
#define FA3C_BWD_TILES_H

/* hdim 64's query block: 128 rows (faster than 64 at every length:
 * docs/KNOBS.md), or 64 as before (-DFA3C_BWD_HDIM64_BLOCK_M=64, for A/Bs),
 * whose warpgroups split dQ by keys (each adds all 64 columns over its own
 * 64 keys, twice the atomics). */
#ifndef FA3C_BWD_HDIM64_BLOCK_M
#define FA3C_BWD_HDIM64_BLOCK_M 128
#endif
/* hdim 128's query block: 80 rows (FA3's without a mask) or 64
 * (-DFA3C_BWD_HDIM128_BLOCK_M=64, for A/Bs); either way dQ is computed
 * transposed (FA3C_BWD_DQ_TRANSPOSED). */
#ifndef FA3C_BWD_HDIM128_BLOCK_M
#define FA3C_BWD_HDIM128_BLOCK_M 80
#endif
#if FA3C_BWD_HDIM128_BLOCK_M != 64 && FA3C_BWD_HDIM128_BLOCK_M != 80
#error "FA3C_BWD_HDIM128_BLOCK_M: 64 or 80"
#endif
/* 1: hdim 128's calls with a mask (causal or a window) of at most 2048
 * queries, and every call of at most 512, run in 64-row blocks (a second
 * kernel per dtype), where 80 rows waste more on padding and on blocks the
 * diagonal cuts (64 rows against 80: +6% causal at 512, +2% at 512
 * without a mask, even at 1k-2k; docs/KNOBS.md);
 * 0: every call in FA3C_BWD_HDIM128_BLOCK_M rows. */
#ifndef FA3C_BWD_HDIM128_SHORT_M64
#define FA3C_BWD_HDIM128_SHORT_M64 1
#endif
/* The query block of a call: its kernel's head dim d, whether a mask or
 * window is set, the longest sequence's queries. */
#define FA3C_BWD_CALL_BLOCK_M(d, masked, seqlen_q)                                                  \
    ((d) == 128 && FA3C_BWD_HDIM128_SHORT_M64 && FA3C_BWD_BLOCK_M(128) != 64 &&                     \
             ((seqlen_q) <= 512 || ((masked) && (seqlen_q) <= 2048))                                  \
         ? 64                                                                                         \
         : FA3C_BWD_BLOCK_M(d))

/* Is dQ computed transposed (dQᵀ = Kᵀ·dSᵀ) by the kernel of head dim d?
 * The hdim-128 kernel's, whose 80-row query blocks cannot be wgmma's M. */
#define FA3C_BWD_DQ_TRANSPOSED(d) ((d) == 128)
#define FA3C_BWD_BLOCK_M(d) ((d) == 64 ? FA3C_BWD_HDIM64_BLOCK_M : (d) == 128 ? FA3C_BWD_HDIM128_BLOCK_M : 64)
/* hdim 256's keys per CTA: 80 as FA3 takes them (a quarter more work per
 * step for the same 64 KB of dQ reductions; wgmma N = 40 for S and dP; 2-7%
 * faster than 64, docs/KNOBS.md), or 64 (-DFA3C_BWD_HDIM256_BLOCK_N=64, for
 * A/Bs). 80 keys fit in smem with P and dS stored transposed (80 rows of 64
 * queries) and one dO stage beside Q's two (bwd_wide_sm90.cuh). */
#ifndef FA3C_BWD_HDIM256_BLOCK_N
#define FA3C_BWD_HDIM256_BLOCK_N 80
#endif
#if FA3C_BWD_HDIM256_BLOCK_N != 64 && FA3C_BWD_HDIM256_BLOCK_N != 80
#error "FA3C_BWD_HDIM256_BLOCK_N: 64 or 80 (the wide kernel has no other form)"
#endif
/* Keys per CTA: 128 (two consumer warpgroups of 64 key rows each,
 * bwd_sm90.cuh), or 64 at the wide head dims 192 and 256 (bwd_wide_sm90.cuh;
 * 256: FA3C_BWD_HDIM256_BLOCK_N above), where dK and dV of 64 keys already
 * take 128 of a consumer thread's registers. */
#define FA3C_BWD_BLOCK_N(d) ((d) == 256 ? FA3C_BWD_HDIM256_BLOCK_N : (d) > 128 ? 64 : 128)
#ifndef FA3C_BWD_STAGES
#define FA3C_BWD_STAGES 2          /* Q / dO / LSE / dsum slots in the ring */
#endif
#define FA3C_BWD_CONSUMERS 2
#define FA3C_BWD_THREADS (128 * (1 + FA3C_BWD_CONSUMERS))
/* setmaxnreg budgets: 24 + 2 x 240 per thread-row is 64512 of the 65536. */
#ifndef FA3C_BWD_PRODUCER_REGS
#define FA3C_BWD_PRODUCER_REGS 24
#endif
#ifndef FA3C_BWD_CONSUMER_REGS
#define FA3C_BWD_CONSUMER_REGS 240
#endif
/* dQ's fp32 accumulator is in tile order (fa3c_bwd_dq_tile_offset,
 * bwd_params.h): a block's dQ is one contiguous piece, added with vector
 * reductions of 4 floats, a warp's covering 512 contiguous bytes, and no row
 * masks (rows outside the block add zeros to its own slots).
 * FA3C_BWD_DQ_WRITER: the consumers put dQ in smem and warp 1 of the
 * producer warpgroup adds the block with one bulk reduction
 * (cp.reduce.async.bulk), FA3's dQ path; not with deterministic = 1 (the
 * consumers' in-turn reductions) or hdim 64's 64-row blocks (both
 * warpgroups add to the same elements). On: faster at both head dims, most
 * from 2k (docs/KNOBS.md); 0 builds the consumers' own reductions. */
#ifndef FA3C_BWD_DQ_WRITER
#define FA3C_BWD_DQ_WRITER 1
#endif

/* The wide kernel's dQ through smem and the writer, as
 * FA3C_BWD_DQ_WRITER does for the narrow one: at hdim 192 only, where the
 * 48 KB buffer fits beside two Q / dO stages (-8% of the kernel at 2k-16k,
 * docs/KNOBS.md). At hdim 256 it would cost a stage, which loses far more
 * than the writer gains; hdim 256 keeps the consumers' vector reductions. */
#ifndef FA3C_BWD_WIDE_DQ_WRITER
#define FA3C_BWD_WIDE_DQ_WRITER 1
#endif
/* Does the kernel of head dim d hand dQ to the writer (bwd_dq_writer)? Not
 * hdim 64 with 64-row blocks, whose warpgroups add to the same elements. */
#define FA3C_BWD_WRITER_ON(d)                                                        \
    ((d) <= 128 ? FA3C_BWD_DQ_WRITER && !((d) == 64 && FA3C_BWD_BLOCK_M(64) == 64) \
                : FA3C_BWD_WIDE_DQ_WRITER && (d) <= 192)
/* 2: hdim 64's 128-row blocks hand dQ to the writer through two smem
 * buffers, so that a step's dQ need not wait for the writer to have read
 * the previous step's (the fence and wait after dQ's stores were 7% of the
 * samples in an ncu profile). The 64 KB fit only without the 1 KB the kernel
 * keeps to align its smem base: it declares the base 1024-aligned and traps
 * if it is not. 1: one buffer. An experiment until its A/B (docs/KNOBS.md). */
#ifndef FA3C_BWD_HDIM64_DQ_BUFFERS
#define FA3C_BWD_HDIM64_DQ_BUFFERS 1
#endif
/* First writes of dQ, for calls of at most this many queries per sequence
 * at head dims 64-128 (0: never; the default: every length): with the
 * writer (not deterministic), the first key block to reach a dQ tile stores
 * it and the others add to it, so the preprocessing zeroes one flag per tile
 * instead of the accumulator (-30 µs at 16k tokens), and the key blocks'
 * walks are staggered so that they seldom wait for a first store
 * (docs/KNOBS.md). */
#ifndef FA3C_BWD_DQ_FIRST_WRITE
#define FA3C_BWD_DQ_FIRST_WRITE 2147483647
#endif
/* 1: the writer claims a tile's flag for step it (an acquiring CAS, and the
 * wait for a first store in progress) before waiting for the consumers' dQ,
 * so that the round trips run under their step instead of between dq_full
 * and the reduction. 0 (claimed after dq_full) cost the main kernel 3-4% on
 * an H100, so first writes paid only up to 512 queries (docs/KNOBS.md). */
#ifndef FA3C_BWD_DQ_CLAIM_EARLY
#define FA3C_BWD_DQ_CLAIM_EARLY 1
#endif
/* 1: the writer's stores and reductions of dQ into the fp32 accumulator
 * carry an L2 evict-last policy (FA3's choice for its dQ reductions), so the
 * tiles the other key blocks of the head are about to add to stay in the
 * L2; 0: no hint. An experiment until its A/B (docs/KNOBS.md). */
#ifndef FA3C_BWD_DQ_EVICT_LAST
#define FA3C_BWD_DQ_EVICT_LAST 0
#endif

/* The wide kernel's 80-key form without softcap: P computed and stored as
 * soon as S is done, while dP's GEMM runs (FA3's order; the narrow kernel's
 * too), dS once dP is; 0: both after both GEMMs. */
#ifndef FA3C_BWD_WIDE_P_UNDER_DP
#define FA3C_BWD_WIDE_P_UNDER_DP 1
#endif

/* The wide kernel's 80-key form: dKᵀ's GEMM issued before dQ's second half
 * (1), so that the tensor pipe has work while the first half's reductions
 * still read the registers the second half writes (4% faster at hdim 256);
 * 0: dQ's second half first, dKᵀ under its reductions. */
#ifndef FA3C_BWD_WIDE_DK_FIRST
#define FA3C_BWD_WIDE_DK_FIRST 1
#endif

/* Every head dim: dK and dV leave through smem (the K and V tiles, free
 * once both warpgroups' last GEMMs are done) as whole 16-byte row pieces, a
 * warp's covering contiguous rows (1), rather than as 4-byte pairs from the
 * accumulators, a warp's touching 8 rows per store (0). With hdim 128's
 * 80-row blocks 2-12% faster at 512-16k, the wide kernel 1-7% (docs/KNOBS.md). */
#ifndef FA3C_BWD_STAGED_EPILOGUE
#define FA3C_BWD_STAGED_EPILOGUE 1
#endif

/* Per head dim, 1: the narrow kernel's steps that no mask cuts
 * (tile_seen_whole: without a mask or window, every step but a sequence's
 * last key block's) run a copy of the step without the mask's compares,
 * which were about 40% of the element-wise instructions of hdim 64's
 * issue-bound Pᵀ (docs/BACKWARD.md); at 80 rows the softcap form is then a
 * kernel of its own (bwd_kernel's FORM). 0: every step with the compares.
 * On at hdim 64, where it gains 1% to 8%; off at 128, where it lost 1.5% to
 * 2.5% (docs/KNOBS.md). */
#ifndef FA3C_BWD_HDIM64_UNMASKED_STEPS
#define FA3C_BWD_HDIM64_UNMASKED_STEPS 1
#endif
#ifndef FA3C_BWD_HDIM128_UNMASKED_STEPS
#define FA3C_BWD_HDIM128_UNMASKED_STEPS 0
#endif
#define FA3C_BWD_UNMASKED_STEPS(d)                                                                  \
    ((d) == 64 ? FA3C_BWD_HDIM64_UNMASKED_STEPS : (d) == 128 ? FA3C_BWD_HDIM128_UNMASKED_STEPS : 0)
/* 1: at 80 rows the plain and softcap consumers are kernels of their own
 * (bwd_kernel's FORM), as the unmasked steps need (ptxas spilled the softcap
 * form beside them); 1 without the unmasked steps separates the split's
 * cost from theirs in an A/B (docs/KNOBS.md). 0: one kernel with both. */
#ifndef FA3C_BWD_HDIM128_SPLIT_FORMS
#define FA3C_BWD_HDIM128_SPLIT_FORMS FA3C_BWD_HDIM128_UNMASKED_STEPS
#endif

/* 1: calls of kernel head dim 192 whose v is at most 128 wide (MLA prefill:
 * q, k 192, v 128) run the instances built for it (`*_hdim192_v128`: v and
 * dO tiles 128 columns wide, 13% less GEMM work than padding them to 192,
 * and 24 KB less smem); 0: the hdim-192 instance, v padded with zeros.
 * Off until its GPU tests and A/B (docs/KNOBS.md). */
#ifndef FA3C_BWD_HDIM192_V128
#define FA3C_BWD_HDIM192_V128 0
#endif

/* Head dims a multiple of 8 in [8, 256], and the kernel each runs on. */
#define FA3C_BWD_HEADDIM_OK(d) ((d) >= 8 && (d) <= 256 && (d) % 8 == 0)
#define FA3C_BWD_KERNEL_HEADDIM(d) ((d) <= 64 ? 64 : (d) <= 128 ? 128 : (d) <= 192 ? 192 : 256)

#endif
