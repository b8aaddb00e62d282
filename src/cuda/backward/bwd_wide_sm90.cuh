// The FlashAttention-3 backward kernel for the wide head dims 192 and 256
// (sm_90a; bf16 / fp16; bwd_tiles.h). The narrow head dims' kernel
// (bwd_sm90.cuh) keeps 64 keys' dK and dV per warpgroup in registers: at
// hdim 256 that is 256 registers per thread. Here one CTA owns N = 64 keys
// (80 at hdim 256, FA3C_BWD_HDIM256_BLOCK_N: BwdWideSmem's TRANSPOSED and
// SPLIT_DO forms) of one (batch, K/V head) and walks the
// query blocks of M = 64 rows that see them, for each query head of the
// GQA group (bwd_common.cuh):
//   warpgroup 0  producer: K and V once, then Q, dO, LSE and dsum per step
//                through a ring of STAGES slots (bwd_producer);
//   warpgroups 1, 2  consumers. Per query block, warpgroup w:
//                  S = Q·Kᵀ, dP = dO·Vᵀ for its N / 2 keys (wgmma, 64 x N / 2)
//                  P = exp2(S·scale·log2e - LSE·log2e), masked to 0
//                  dS = P ⊙ (dP - dsum)
//                  P and dS to smem (queries x keys), a barrier, then over
//                  all 64 keys and its share of the head-dim columns:
//                  dQ = dS·K                            (to an fp32 accumulator in
//                                                        global memory: at hdim 192
//                                                        through smem and the writer,
//                                                        bwd_dq_writer; at 256 with
//                                                        vector atomics)
//                  dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS           (wgmma, both operands from smem)
// dKᵀ and dVᵀ stay in registers for the whole walk (GQA: summed over the
// group's heads), split by head-dim columns: warpgroup 0 holds columns
// 0-127, warpgroup 1 the rest (128-255, or 128-191 at hdim 192); dQ's
// columns are split the other way round (warpgroup 1 the last 128), so at
// hdim 192 the two warpgroups' GEMM work is 8 : 7 (with a v of 128 for
// MLA, template DV, dV's columns split 64 / 64: WideShare). They are
// written once at the end, dK scaled.
#pragma once
#include "bwd_producer.cuh"
#include "bwd_wide_consumer.cuh"   // bwd_wide_smem.cuh, bwd_wide_gemm.cuh, bwd_wide_elementwise.cuh

// ---- the kernel --------------------------------------------------------------------

// Grid: 1-D, p.num_n_blocks x heads_kv x batch CTAs (fa3c_bwd_tile_of_cta).
// DV: v's head dim (BwdWideSmem, WideShare).
template <int D, int FP16, int DV = D>
__global__ void __launch_bounds__(FA3C_BWD_THREADS, 1) bwd_wide_kernel(const __grid_constant__ fa3c_bwd_kernel_params p) {
    static_assert(D == 192 || D == 256, "the wide backward: head dims 192 and 256");
    static_assert(128 * FA3C_BWD_PRODUCER_REGS + 128 * FA3C_BWD_CONSUMERS * FA3C_BWD_CONSUMER_REGS <= 65536,
                  "setmaxnreg budgets past the register file");
    enum { M = FA3C_BWD_BLOCK_M(D), N = FA3C_BWD_BLOCK_N(D) };
    extern __shared__ uint8_t smem_raw[];
    typedef BwdWideSmem<D, DV> Smem;
    Smem &sm = *(Smem *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    int n_block, head_kv, batch;
    fa3c_bwd_tile_of_cta(blockIdx.x, p.num_n_blocks, p.heads_kv, p.batch, p.section, &n_block, &head_kv, &batch);

    if (threadIdx.x == 0) {
        bwd_cta_init<D>(p, sm, n_block, batch);
        if (FA3C_BWD_WRITER_ON(D)) {
            mbar_init(&sm.dq_full[0], 4 * FA3C_BWD_CONSUMERS);   // one per consumer warp
            mbar_init(&sm.dq_empty[0], 1);                       // the writer
        }
        if (Smem::SPLIT_DO) {
            mbar_init(&sm.do_full, 1);
            mbar_init(&sm.do_empty, 4 * FA3C_BWD_CONSUMERS);
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (n_block * N >= BWD_SEQ(sm, sk_stored)) return;   // a shorter sequence's key blocks end before this one

    const int warpgroup = __shfl_sync(~0u, threadIdx.x / 128, 0);   // warpgroup-uniform, as setmaxnreg requires
    if (warpgroup == 0) {
        reg_dealloc<FA3C_BWD_PRODUCER_REGS>();
        if (threadIdx.x == 0) bwd_producer<D>(p, sm, head_kv, batch);
        else if (FA3C_BWD_WRITER_ON(D) && threadIdx.x == 32) bwd_dq_writer<D>(p, sm, head_kv, batch);
    } else {
        reg_alloc<FA3C_BWD_CONSUMER_REGS>();
        if (warpgroup == 1) bwd_wide_consumer_of<D, FP16, 0, DV>(p, sm, n_block, head_kv, batch);
        else bwd_wide_consumer_of<D, FP16, 1, DV>(p, sm, n_block, head_kv, batch);
    }
}

// Dynamic smem a launch needs (the +1024 lets the kernel align the base).
template <int D, int DV = D>
static size_t bwd_wide_smem_bytes(void) {
    static_assert(sizeof(BwdWideSmem<D, DV>) + 1024 <= 227 * 1024, "the wide backward kernel's smem exceeds a block's");
    return sizeof(BwdWideSmem<D, DV>) + 1024;
}
