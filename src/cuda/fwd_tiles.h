/* Tile sizes of the forward kernel per head dim, in one table.
 *
 * BLOCK_M = 128 query rows per CTA: two consumer warpgroups of 64 rows (the
 * wgmma M), which share every K/V tile and pingpong between GEMMs and softmax.
 * BLOCK_N (keys per tile) and the pipeline depth trade smem against reuse:
 *   Q tile = 128 * D * 2 B, each stage = 2 * BLOCK_N * D * 2 B (K and V),
 *   and the total must stay under the 227 KB a block may use.
 *   hdim  64: N 128, 4 stages:  16 + 4*32 = 144 KB
 *   hdim 128: N 128, 2 stages:  32 + 2*64 = 160 KB
 *   hdim 256: N  64, 2 stages:  64 + 2*64 = 192 KB (the accumulator of
 *             64x256 already takes 128 registers per thread; N 64 keeps S small)
 * First choices from the FA3 paper's tiles and the smem budget; retune by
 * measurement (bench/RESULTS.md). */
#ifndef FA3C_FWD_TILES_H
#define FA3C_FWD_TILES_H

#define FA3C_FWD_BLOCK_M 128
#define FA3C_FWD_CONSUMER_WARPGROUPS 2
#define FA3C_FWD_THREADS (128 * (1 + FA3C_FWD_CONSUMER_WARPGROUPS))

/* setmaxnreg budgets: 128*24 + 256*240 = 64512 <= 65536 registers. */
#define FA3C_FWD_PRODUCER_REGS 24
#define FA3C_FWD_CONSUMER_REGS 240

#define FA3C_FWD_BLOCK_N(D) ((D) <= 128 ? 128 : 64)
#define FA3C_FWD_STAGES(D) ((D) <= 64 ? 4 : 2)

#endif
