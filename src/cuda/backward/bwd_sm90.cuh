// The FlashAttention-3 backward kernel for sm_90a (bf16 / fp16; head dims
// 64 and 128: bwd_tiles.h).
//
// One CTA owns BLOCK_N = 128 keys of one (batch, K/V head) and walks the
// query blocks (M = BLOCK_M(D) rows: 80 at hdim 128, 128 at hdim 64;
// bwd_tiles.h) that see any of them, for each query head of
// the GQA group:
//   warpgroup 0  producer: one thread loads K and V once, then streams Q,
//                dO and the rows' LSE and dsum = rowsum(dO ⊙ O) through a
//                ring of STAGES smem slots (TMA, mbarriers);
//   warpgroups 1, 2  consumers: 64 keys each. Per query block, with the
//                keys as the wgmma M dimension (so Pᵀ and dSᵀ come out of
//                the accumulators already in register-A layout):
//                  Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ          (wgmma, smem x smem)
//                  Pᵀ = exp2(Sᵀ·scale·log2e - LSE·log2e), masked to 0,
//                       under dPᵀ's GEMM
//                  dSᵀ = Pᵀ ⊙ (dPᵀ - dsum); dSᵀ -> smem
//                  dV += Pᵀ·dO                      (wgmma, A from registers)
//                  dQ = dS·K                        (wgmma, smem x smem;
//                                                    hdim 128: dQᵀ = Kᵀ·dSᵀ)
//                  dK += dSᵀ·Q, while dQ is added to an fp32 dQ in global
//                  memory: through smem and one bulk reduction per block
//                  by warp 1 (FA3C_BWD_DQ_WRITER, bwd_dq_writer), or with
//                  vector atomics (deterministic = 1: the key blocks add
//                  in a fixed order, add_dq_in_turn).
// dK and dV stay in registers for the whole walk (GQA: summed over the
// group's heads) and are written once at the end, dK scaled. bwd_prep.cu
// computes dsum and the LSE in log2 units before, and turns the fp32 dQ
// into dq after.
//
// dQ's split between the warpgroups, over all 128 keys (both warpgroups'
// dS: a named barrier), so each dQ element is added once per key block: at
// hdim 128 each takes 64 of the columns of the M query rows, as dQᵀ (M = 80
// can only be wgmma's N: gemm_dq_transposed); at hdim 64 with 128-row
// blocks each takes 64 of the query rows, all 64 columns (gemm_dq). (hdim 64
// with 64-row blocks, FA3C_BWD_HDIM64_BLOCK_M=64: each takes all columns
// over its own 64 keys, twice the atomics.)
#pragma once
#include "bwd_producer.cuh"
#include "bwd_consumer.cuh"   // bwd_smem.cuh, bwd_gemm.cuh, bwd_elementwise.cuh

// ---- the kernel --------------------------------------------------------------------

// Grid: 1-D, p.num_n_blocks x heads_kv x batch CTAs (fa3c_bwd_tile_of_cta).
// M: the query block's rows (bwd_tiles.h: FA3C_BWD_BLOCK_M(D), or at hdim 128
// 64 for the calls FA3C_BWD_HDIM128_SHORT_M64 gives them). FORM: which
// consumers it has, BWD_PLAIN and BWD_SOFTCAP (p.softcap != 0) each alone, or
// BWD_EITHER, both, picked per CTA. ptxas fits them to the registers apart at
// 80 rows (together, the unmasked steps made it spill softcap's) and together
// at 64 and 128 (hdim 64's softcap kernel on its own spilled).
enum { BWD_PLAIN, BWD_SOFTCAP, BWD_EITHER };
template <int D, int FP16, int M = FA3C_BWD_BLOCK_M(D), int FORM = BWD_EITHER>
__global__ void __launch_bounds__(FA3C_BWD_THREADS, 1) bwd_kernel(const __grid_constant__ fa3c_bwd_kernel_params p) {
    static_assert(D == 64 || D == 128, "this kernel: head dims 64 and 128 (96 on 128's)");
    static_assert(128 * FA3C_BWD_PRODUCER_REGS + 128 * FA3C_BWD_CONSUMERS * FA3C_BWD_CONSUMER_REGS <= 65536,
                  "setmaxnreg budgets past the register file");
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    if (BwdSmem<D, M>::SMEM_SLACK == 0 && smem_addr(smem_raw) % 1024 != 0) __trap();   // bwd_smem_bytes kept no slack
    BwdSmem<D, M> &sm = *(BwdSmem<D, M> *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    int n_block, head_kv, batch;
    fa3c_bwd_tile_of_cta(blockIdx.x, p.num_n_blocks, p.heads_kv, p.batch, p.section, &n_block, &head_kv, &batch);

    if (threadIdx.x == 0) {
        bwd_cta_init<D>(p, sm, n_block, batch);
        if (FA3C_BWD_WRITER_ON(D))
            for (int b = 0; b < BwdSmem<D, M>::DQ_BUFS; b++) {
                mbar_init(&sm.dq_full[b], 4 * FA3C_BWD_CONSUMERS);   // one per consumer warp
                mbar_init(&sm.dq_empty[b], 1);                       // the writer
            }
        fence_barrier_init();
    }
    __syncthreads();
    if (n_block * BWD_N >= BWD_SEQ(sm, sk_stored)) return;   // a shorter sequence's key blocks end before this one

    const int warpgroup = __shfl_sync(~0u, threadIdx.x / 128, 0);   // warpgroup-uniform, as setmaxnreg requires
    if (warpgroup == 0) {
        reg_dealloc<FA3C_BWD_PRODUCER_REGS>();
        if (threadIdx.x == 0) bwd_producer<D>(p, sm, head_kv, batch);
        else if (FA3C_BWD_WRITER_ON(D) && threadIdx.x == 32) bwd_dq_writer<D>(p, sm, head_kv, batch);
    } else {
        reg_alloc<FA3C_BWD_CONSUMER_REGS>();
        if (FORM == BWD_SOFTCAP || (FORM == BWD_EITHER && p.softcap != 0.f))
            bwd_consumer<D, M, FP16, true>(p, sm, n_block, head_kv, batch, warpgroup - 1);
        else
            bwd_consumer<D, M, FP16, false>(p, sm, n_block, head_kv, batch, warpgroup - 1);
    }
}

// Dynamic smem a launch needs (the slack lets the kernel align the base).
template <int D, int M = FA3C_BWD_BLOCK_M(D)>
static size_t bwd_smem_bytes(void) {
    enum { BYTES = sizeof(BwdSmem<D, M>) + BwdSmem<D, M>::SMEM_SLACK };
    static_assert(BYTES <= 227 * 1024, "the backward kernel's smem exceeds what a block may use");
    return BYTES;
}
