/* Tile sizes of the forward kernel per head dim, in one table.
 *
 * BLOCK_M = 128 query rows per CTA: two consumer warpgroups of 64 rows (the
 * wgmma M), which share every K/V tile and pingpong between GEMMs and softmax
 * (optionally 3 warpgroups, 192 rows, for hdim 64).
 * BLOCK_N (keys per tile) and the pipeline depth trade smem against reuse:
 *   Q tile = 128 * D * 2 B, each stage = 2 * BLOCK_N * D * 2 B (K and V),
 *   plus, where it fits, 64 rows x D per consumer to stage O for the TMA
 *   store (fwd_epilogue.cuh; where it does not, O is staged over the V ring),
 *   and the total must stay under the 227 KB a block may use.
 *   hdim  64: N 128, 4 stages:  24 + 4*32 = 152 KB + 24 KB O staging
 *   hdim 128: N 128, 2 stages:  32 + 2*64 = 160 KB + 32 KB O staging
 *   hdim 256: N  80, 2 stages:  64 + 2*80 = 224 KB, O staged in the V ring
 *             (the accumulator of 64x256 already takes 128 registers per
 *             thread; N 80 keeps S small)
 * Measured on the H200: N 80 beats N 64 for hdim 256 from 2k; wider key
 * blocks for hdim 128 (144-192) and hdim 64 (192), and 2 consumers for
 * hdim 64, lost or tied: both keep 128 keys, hdim 64 its 3 consumers
 * (docs/KNOBS.md). */
#ifndef FA3C_FWD_TILES_H
#define FA3C_FWD_TILES_H

/* Consumer warpgroups per CTA (64 query rows each): 2, or 3 for hdim 64
 * where the small O accumulator leaves room (FA3 does the same). */
#ifndef FA3C_FWD_CONSUMERS_64
#define FA3C_FWD_CONSUMERS_64 3
#endif
#define FA3C_FWD_CONSUMERS(D) ((D) == 64 ? FA3C_FWD_CONSUMERS_64 : 2)
#define FA3C_FWD_BLOCK_M(D) (64 * FA3C_FWD_CONSUMERS(D))
#define FA3C_FWD_THREADS(D) (128 * (1 + FA3C_FWD_CONSUMERS(D)))

/* setmaxnreg budgets. The registers setmaxnreg moves between warpgroups are
 * the CTA's pool, what it got at launch: THREADS x the per-thread count
 * __launch_bounds__(THREADS, 1) allows, (65536 / THREADS) rounded down to a
 * multiple of 8 (FA3C_FWD_REG_POOL), so 128*producer + 128*consumers*consumer
 * must not exceed it, or a setmaxnreg.inc waits forever:
 * 2 consumers (384 x 168 = 64512): 24 + 2*240, and in the variable-length
 * instances (whose producer warpgroup spilled at 24) 40 + 2*232;
 * 3 consumers (512 x 128 = 65536): 32 + 3*160. (fwd_sm90.cuh, RegBudget.) */
#define FA3C_FWD_PRODUCER_REGS(D) (FA3C_FWD_CONSUMERS(D) == 2 ? 24 : 32)
#define FA3C_FWD_CONSUMER_REGS(D) (FA3C_FWD_CONSUMERS(D) == 2 ? 240 : 160)
#define FA3C_FWD_PRODUCER_REGS_VARLEN(D) (FA3C_FWD_CONSUMERS(D) == 2 ? 40 : 32)
#define FA3C_FWD_CONSUMER_REGS_VARLEN(D) (FA3C_FWD_CONSUMERS(D) == 2 ? 232 : 160)
#define FA3C_FWD_REG_POOL(D) (FA3C_FWD_THREADS(D) * ((65536 / FA3C_FWD_THREADS(D)) / 8 * 8))

/* Overridable with -D for tuning runs (tools/gpu.sh check variants). */
#ifndef FA3C_FWD_BLOCK_N_64
#define FA3C_FWD_BLOCK_N_64 128
#endif
#ifndef FA3C_FWD_BLOCK_N_128
#define FA3C_FWD_BLOCK_N_128 128
#endif
#ifndef FA3C_FWD_BLOCK_N_256
#define FA3C_FWD_BLOCK_N_256 80
#endif
#ifndef FA3C_FWD_STAGES_64
#define FA3C_FWD_STAGES_64 4
#endif
#ifndef FA3C_FWD_STAGES_128
#define FA3C_FWD_STAGES_128 2
#endif
#ifndef FA3C_FWD_STAGES_256
#define FA3C_FWD_STAGES_256 2
#endif
/* 1: the consumer warpgroups take turns issuing GEMMs (pingpong); 0: off (ablation). */
#ifndef FA3C_FWD_PINGPONG
#define FA3C_FWD_PINGPONG 1
#endif
/* T > 0: lazy rescaling (softmax.cuh): a warp's rows keep their running max
 * until one grows by more than 2^T, and the O multiplies (and the row
 * maxima's shuffles) are skipped by a warp-uniform branch while none does;
 * 0: the max moves every block. A small gain, most at hdim 128 and 256,
 * where the O multiplies sat after the P·V wait (docs/KNOBS.md). */
#ifndef FA3C_FWD_LAZY_RESCALE
#define FA3C_FWD_LAZY_RESCALE 8
#endif
/* Probabilities reach 2^T, and fp16 P holds at most 65504. */
#if FA3C_FWD_LAZY_RESCALE < 0 || FA3C_FWD_LAZY_RESCALE > 15
#error "FA3C_FWD_LAZY_RESCALE must be 0..15"
#endif
/* 1: the key blocks after a warp's first (once its rows have a finite
 * offset) skip the row max: their exponentials use the offsets the rows
 * have, and the block's partial row sums, which bound every probability,
 * show when one grew past 2^T (softmax.cuh, softmax_step_stale); rows then
 * shift by a power of 2, or, where a probability overflowed, the warp
 * computes its scores again (mma.sync) and takes the max after all.
 * Needs T = FA3C_FWD_LAZY_RESCALE > 0. 0: the row max every block.
 * Faster at hdim 64-128, even at 256 (docs/KNOBS.md). */
#ifndef FA3C_FWD_STALE_MAX
#define FA3C_FWD_STALE_MAX 1
#endif
/* 1: persistent CTAs (one per SM) walk the tiles, longest first, and load
 * the next tile while finishing the current one; 0: one CTA per tile. */
#ifndef FA3C_FWD_PERSISTENT
#define FA3C_FWD_PERSISTENT 1
#endif
/* 1: softmax(j) runs while P·V(j-1) is on the tensor cores: it is pinned in
 * front of the wait for P·V(j-1) (ptxas otherwise moves that wait above it,
 * fwd_consumer.cuh, pin_softmax), and O is rescaled after that wait, to block j's
 * max, instead of in the GEMM-issue stretch; 0: the order ptxas picks, with
 * the rescale between Q·Kᵀ(j) and P·V(j-1). On for hdim 192 and 256, where
 * it is faster; off for hdim 64, where it is slower, and for hdim 128 since
 * the stale row max shortened the softmax (docs/KNOBS.md). A -D value
 * applies to every head dim. */
#ifdef FA3C_FWD_SOFTMAX_UNDER_PV
#define FA3C_FWD_SOFTMAX_UNDER_PV_D(D) FA3C_FWD_SOFTMAX_UNDER_PV
#else
#define FA3C_FWD_SOFTMAX_UNDER_PV_D(D) ((D) > 128)
#endif
/* 1: where D is a multiple of 64, the epilogue stages O in smem (stmatrix)
 * and writes it with TMA stores, instead of 16-byte stores from registers
 * after a shuffle transpose; 0: always from registers. */
#ifndef FA3C_FWD_TMA_STORE
#define FA3C_FWD_TMA_STORE 1
#endif
/* 1: where the smem has no room for a separate O staging buffer (hdim 192,
 * 256), stage O in the V ring for the TMA store (fwd_smem.cuh, O_STAGE_IN_V;
 * faster at every length, most at 512: docs/KNOBS.md); 0: those head dims
 * store O from registers. */
#ifndef FA3C_FWD_O_IN_V
#define FA3C_FWD_O_IN_V 1
#endif
/* With O staged in the V ring: 1, each consumer warpgroup stages its O in
 * one V slot of its own (needs 64 <= BLOCK_N and a slot per warpgroup) and
 * waits only for that slot to be read, the first to finish taking the slot
 * the others released first; 0, consumer c stages at c * 64 rows from the
 * ring's start, across slots, and waits for every slot, so warpgroup 0 waits
 * for warpgroup 1's last P·V (fwd_smem.cuh, o_staging_ring_index). Even or
 * faster, most at short causal calls (docs/KNOBS.md). */
#ifndef FA3C_FWD_O_IN_V_SLOT
#define FA3C_FWD_O_IN_V_SLOT 1
#endif
/* 1 (default): for hdim 128 (2 consumers with 240 registers; hdim 64's
 * 160-register consumers spill with it), each consumer loads its Q rows into
 * registers once per tile (ldmatrix) and issues Q·Kᵀ with A from registers
 * (wgmma_rsk), so Q is read from smem once per tile instead of once per key
 * block (a fifth of the loop's smem reads), and its smem is released at once,
 * so the next tile's Q loads during this one. Costs D / 4 registers. 0: Q·Kᵀ
 * from smem. Faster on hdim 128, most at 512 (docs/KNOBS.md). */
#ifndef FA3C_FWD_Q_IN_REGS
#define FA3C_FWD_Q_IN_REGS 1
#endif
/* 1: with Q in registers (FA3C_FWD_Q_IN_REGS), whose smem is free from a
 * tile's start, the producer loads the next tile's Q during this tile, after
 * the first key block at which the Q buffer is free (never waiting for it
 * there), instead of at the next tile's start: at short lengths the
 * consumers waited for the next tile's Q and first K (docs/KNOBS.md).
 * 0: at the next tile's start. */
#ifndef FA3C_FWD_EARLY_Q
#define FA3C_FWD_EARLY_Q 1
#endif
/* 2: clusters of two CTAs share their K and V loads (TMA multicast): the
 * two take neighbouring row blocks of one (batch, head), and each loads
 * half of every K and V tile into both CTAs' smem, so the pair reads K and V
 * from the L2 once instead of twice (fwd_producer.cuh, load_kv_tile; hdim 256
 * non-causal 512 ran near the L2's bandwidth). Used where the
 * row blocks pair up and walk the same key blocks: no mask or window, no
 * split-KV, an even number of row blocks (fwd_plan.c). 1: no clusters, and
 * the code compiled out; the default is 1 except in the main hdim-256
 * instances (FA3C_FWD_CLUSTER_256 below). */
/* FA3C_FWD_CLUSTER_256 = 2 (default): the main hdim-256 instances (80-key
 * blocks; src/cuda/sources.cmake marks their translation units with
 * FA3C_FWD_CLUSTERED_INSTANCE) are built with clusters of two, the others
 * without: clusters gain for hdim 256 without a mask up to 2k, and the
 * cluster code costs hdim 64 and 128 1-5% everywhere (docs/KNOBS.md).
 * 1: no instance clustered. */
#ifndef FA3C_FWD_CLUSTER_256
#define FA3C_FWD_CLUSTER_256 2
#endif
#ifndef FA3C_FWD_CLUSTER
#if defined(FA3C_FWD_CLUSTERED_INSTANCE) && FA3C_FWD_CLUSTER_256 == 2
#define FA3C_FWD_CLUSTER 2
#else
#define FA3C_FWD_CLUSTER 1
#endif
#endif
#if FA3C_FWD_CLUSTER != 1 && FA3C_FWD_CLUSTER != 2
#error "FA3C_FWD_CLUSTER must be 1 or 2"
#endif
/* 1: under a causal mask (a right bound) the partial row block's idle
 * warpgroups go to the top (fwd_params.h, m_shift), so the tile with the
 * most keys has all its warpgroups computing; 0: at the bottom, and the
 * shift's code compiled out (ablation). Faster for hdim 64 causal (192-row
 * tiles: every grid length leaves a partial one), no change without a mask,
 * where the check costs one compare per tile (docs/KNOBS.md). */
#ifndef FA3C_FWD_CAUSAL_SHIFT
#define FA3C_FWD_CAUSAL_SHIFT 1
#endif

/* hdim 256 under a causal mask (a right bound) with seqlen_k <= this: key
 * blocks of 64 (instances *_hdim256_n64, fwd_host.c), where the 80-key
 * blocks leave the last block of short rows partly empty (512 keys are 6.4
 * blocks of 80). 64 keys win under a causal mask up to 1k keys, tie or lose
 * beyond, and lose without a mask (docs/KNOBS.md). 0: never. */
#ifndef FA3C_FWD_SHORT_CAUSAL_KEYS_256
#define FA3C_FWD_SHORT_CAUSAL_KEYS_256 1024
#endif

/* Speed-of-light ablations for tools/gpu.sh tune only: they give WRONG outputs
 * (the GPU tests fail with them). 1: no softmax at all (P = S, O never
 * rescaled), so the loop is the GEMMs, the barriers and the conversion to
 * 16 bits; 2: the softmax without its exponentials (max, scale, sum kept).
 * They say how much of the loop's time the softmax costs (docs/KNOBS.md).
 * 0 (default): the real kernel. */
#ifndef FA3C_FWD_ABLATE_SOFTMAX
#define FA3C_FWD_ABLATE_SOFTMAX 0
#endif
#if FA3C_FWD_ABLATE_SOFTMAX || FA3C_FWD_LAZY_RESCALE == 0
#undef FA3C_FWD_STALE_MAX
#define FA3C_FWD_STALE_MAX 0
#endif

/* 1: the kernel stamps the clock at each phase of every key block in its
 * first CTAs, and the launcher writes the stamps to $FA3C_TRACE_OUT
 * (trace.cuh, tools/gpu.sh trace). For measurement builds only: it adds a
 * few stores per key block. 0 (default): compiled out. */
#ifndef FA3C_FWD_TRACE
#define FA3C_FWD_TRACE 0
#endif

/* Dynamic smem a block may use on sm_90 (227 KB). */
#define FA3C_FWD_SMEM_LIMIT (227 * 1024)

/* hdim 96: N 128, 3 stages: 24 + 3*48 = 168 KB; hdim 192: N 112, 2 stages:
 * 48 + 2*84 = 216 KB (O takes 96 registers; FA3 uses 112 too). */
#define FA3C_FWD_BLOCK_N(D)                                                                      \
    ((D) == 64 ? FA3C_FWD_BLOCK_N_64 : (D) == 96 ? 128 : (D) == 128 ? FA3C_FWD_BLOCK_N_128      \
     : (D) == 192 ? 112 : FA3C_FWD_BLOCK_N_256)
#define FA3C_FWD_STAGES(D)                                                                       \
    ((D) == 64 ? FA3C_FWD_STAGES_64 : (D) == 96 ? 3 : (D) == 128 ? FA3C_FWD_STAGES_128          \
     : (D) == 192 ? 2 : FA3C_FWD_STAGES_256)

/* Tiles live in smem as column chunks of FA3C_FWD_CHUNK_COLS(D) elements,
 * one TMA box each, with the TMA/wgmma swizzle of that row width: 64
 * columns (128 B rows, 128B swizzle) when D is a multiple of 64, else 32
 * (64 B rows, 64B swizzle; hdim 96). */
#define FA3C_FWD_CHUNK_COLS(D) ((D) % 64 == 0 ? 64 : 32)

#endif
