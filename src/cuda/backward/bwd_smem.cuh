// The narrow backward kernel's smem (bwd_sm90.cuh, head dims 64 and 128):
// keys per CTA, how the warpgroups split dQ, and the layout of one CTA's tiles.
#pragma once
#include "bwd_tiles.h"
#include "bwd_common.cuh"

enum { BWD_N = FA3C_BWD_BLOCK_N(128) };   // keys per CTA (64 and 128 alike)

// Do the warpgroups split dQ by keys (hdim 64 with 64-row blocks), so that
// both add to the same elements? Otherwise each adds its own 64 x 64 piece
// (gemm_dq).
FA3C_HOST_DEVICE constexpr bool bwd_dq_key_split(int d, int m) { return d == 64 && m == 64; }

// Every tile is stored as D / 64 column chunks of rows x 128 B, as the TMA
// boxes land (fwd_smem.cuh's layout); dS as M / 64 chunks of 128 key rows
// of 64 queries (MN-major A of dQ = dS·K), or with dQ transposed as 2
// chunks of M query rows of 64 keys (K-major B of dQᵀ = Kᵀ·dSᵀ).
template <int D, int BM = FA3C_BWD_BLOCK_M(D)>
struct BwdSmem {
    enum { M = BM, SPLIT_DO = 0, DV = D };   // dO in the Q ring (bwd_producer); v and dO as wide as q
    enum { DQ_TRANSPOSED = FA3C_BWD_DQ_TRANSPOSED(D), DQ_REGS = DQ_TRANSPOSED ? M / 2 : 32 };
    // The writer's dQ buffers (FA3C_BWD_HDIM64_DQ_BUFFERS); with two, no
    // slack to align the base (bwd_smem_bytes).
    enum { DQ_BUFS = D == 64 && M == 128 && FA3C_BWD_WRITER_ON(D) ? FA3C_BWD_HDIM64_DQ_BUFFERS : 1 };
    enum { SMEM_SLACK = DQ_BUFS == 2 ? 0 : 1024 };
    alignas(1024) uint8_t k[BWD_N * D * 2];
    alignas(1024) uint8_t v[BWD_N * D * 2];
    alignas(1024) uint8_t q[BWD_STAGES][M * D * 2];
    alignas(1024) uint8_t dout[BWD_STAGES][M * D * 2];
    alignas(1024) uint8_t ds[2][BWD_N * M * 2];   // two buffers: one barrier per query block
    // Each slot's row 128-byte aligned, as TMA stores into smem need (80 rows: 96 floats).
    alignas(128) float lse_log2[BWD_STAGES][(M + 31) / 32 * 32];
    alignas(128) float dsum[BWD_STAGES][(M + 31) / 32 * 32];
    uint64_t kv_full;                                  // K and V landed (once)
    uint64_t full[BWD_STAGES], empty[BWD_STAGES];      // the Q / dO / LSE / dsum slots
    uint64_t landed;                                   // a step whose foreign rows the producer zeroes first
    BwdSeq seq;
    // FA3C_BWD_DQ_WRITER: the block's dQ in tile order for the writer's bulk
    // reduction, and its barriers (written / read). Last, so that the other
    // members' offsets do not depend on the knob.
    uint64_t dq_full[DQ_BUFS], dq_empty[DQ_BUFS];
    alignas(128) float dq[DQ_BUFS][FA3C_BWD_WRITER_ON(D) ? M * D : 4];
};
