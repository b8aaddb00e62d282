/* Tile sizes and register budgets of the backward kernel (bwd_sm90.cuh),
 * shared by the C host code and the CUDA kernels.
 *
 * One CTA owns BLOCK_N = 128 keys of one (batch, K/V head) and walks the
 * query blocks of BLOCK_M = 64 rows that see them, for every query head of
 * its GQA group; dK and dV stay in the registers of its two consumer
 * warpgroups (64 keys each) the whole time, so they need no atomics and are
 * deterministic. 64 query rows per step keep the four accumulators of a
 * warpgroup (Sᵀ and dPᵀ 64 x 64, dV and dK 64 x D) inside 240 registers at
 * hdim 128, as FA3 does. Head dims 64 and 128 for now (bwd_host.c says
 * NOT_SUPPORTED for the others): 96 and 192 have 64-byte chunks, and 256's
 * dK + dV alone would take 256 registers. */
#ifndef FA3C_BWD_TILES_H
#define FA3C_BWD_TILES_H

#define FA3C_BWD_BLOCK_M 64
#define FA3C_BWD_BLOCK_N 128
#define FA3C_BWD_STAGES 2          /* Q / dO / LSE / dsum slots in the ring */
#define FA3C_BWD_CONSUMERS 2
#define FA3C_BWD_THREADS (128 * (1 + FA3C_BWD_CONSUMERS))
/* setmaxnreg budgets: 24 + 2 x 240 per thread-row is 64512 of the 65536. */
#define FA3C_BWD_PRODUCER_REGS 24
#define FA3C_BWD_CONSUMER_REGS 240
#define FA3C_BWD_HEADDIM_OK(d) ((d) == 64 || (d) == 128)

#endif
