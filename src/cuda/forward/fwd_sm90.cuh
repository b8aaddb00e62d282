// The FlashAttention-3 forward kernel for sm_90a (bf16 / fp16).
//
// One CTA computes BLOCK_M = 128 query rows of one (batch, head) (or of a
// GQA group: rows are (query, head) pairs, fwd_params.h), against all keys or
// one split-KV range of them:
//   warpgroup 0  producer: one thread streams Q once, then K and V tiles
//                through a ring of STAGES smem slots with TMA (mbarriers);
//                in the variable-length instances (VARLEN: sequences of
//                their own lengths, seqused_k or cu_seqlens, and paged KV)
//                a second warp zeroes the V rows outside a sequence's keys
//                before P·V reads them (v_guard);
//   warpgroups 1, 2  consumers: 64 rows each. Per key block:
//                S = Q·Kᵀ (wgmma, smem x smem), mask, online softmax,
//                O += P·V (wgmma, P from registers).
// Two overlaps hide the softmax behind tensor-core work:
//   intra-warpgroup: S(j) = Q·K(j)ᵀ and O += P(j-1)·V(j-1) are issued
//     together; softmax(j) may run while P·V(j-1) is still in flight
//     (where ptxas puts it: see pin_softmax);
//   pingpong: named barriers make the two consumer warpgroups take turns
//     issuing GEMMs, so one's softmax runs under the other's GEMMs.
// Key blocks run from the last to the first, so the masked diagonal/edge
// blocks come first and the steady state runs unmasked. O leaves through
// smem and TMA stores where the smem has room (store_tile_tma).
//
// Files: fwd_smem.cuh (the smem layout, ring and tile walk all roles
// share), fwd_producer.cuh (warpgroup 0), fwd_consumer.cuh (the consumer
// warpgroups) and fwd_epilogue.cuh (their O and LSE stores); this file has
// the register budgets and the kernel that gives each warpgroup its role.
#pragma once
#include "fwd_producer.cuh"
#include "fwd_consumer.cuh"

// The setmaxnreg budgets of an instance (fwd_tiles.h). The variable-length
// instances' producer warpgroup (key counts, page lookups, v_guard) spilled
// at 24 registers: it gets more, the consumers a little less. TOTAL must fit
// the CTA's register pool, or a setmaxnreg.inc waits forever: checked here
// against the launch bounds, and at launch against ptxas's register count.
template <int D, bool VARLEN>
struct RegBudget {
    enum {
        PRODUCER = VARLEN ? FA3C_FWD_PRODUCER_REGS_VARLEN(D) : FA3C_FWD_PRODUCER_REGS(D),
        CONSUMER = VARLEN ? FA3C_FWD_CONSUMER_REGS_VARLEN(D) : FA3C_FWD_CONSUMER_REGS(D),
        TOTAL = 128 * PRODUCER + 128 * FA3C_FWD_CONSUMERS(D) * CONSUMER
    };
    static_assert(TOTAL <= FA3C_FWD_REG_POOL(D), "setmaxnreg budgets past the CTA's register pool");
};

// VARLEN: the variable-length instance of the head dim and dtype (sequences
// with their own number of keys, p.seqused_k, or paged KV; fwd_host.c picks it).
template <int D, int BLOCK_N, int FP16, bool VARLEN>
__global__ void __launch_bounds__(FA3C_FWD_THREADS(D), 1) fwd_kernel(const __grid_constant__ fa3c_fwd_kernel_params p) {
    enum { STAGES = FA3C_FWD_STAGES(D) };
    typedef FwdSmem<D, BLOCK_N, STAGES> Smem;
    extern __shared__ uint8_t smem_raw[];
    Smem &sm = *(Smem *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);

    if (threadIdx.x == 0) {
        tma_prefetch_map(&p.q_map);
        tma_prefetch_map(&p.k_map);
        tma_prefetch_map(&p.v_map);
        if (p.out_tma) tma_prefetch_map(&p.o_map);
        // K/V slots and o_free count the consumers of every CTA in the cluster.
        const int cluster = cluster_size(p);
        mbar_init(&sm.q_full, 1);
        mbar_init(&sm.q_empty, 4 * FA3C_FWD_CONSUMERS(D));             // one per consumer warp
        mbar_init(&sm.o_free, FA3C_FWD_CONSUMERS(D) * cluster);        // one per consumer warpgroup
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&sm.k_full[s], 1);   // the producer's TMA: one arrival
            mbar_init(&sm.v_full[s], 1);
            mbar_init(&sm.k_empty[s], 4 * FA3C_FWD_CONSUMERS(D) * cluster);
            mbar_init(&sm.v_empty[s], 4 * FA3C_FWD_CONSUMERS(D) * cluster);
            if (VARLEN) mbar_init(&sm.v_ready[s], 32);   // v_guard's lanes
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (cluster_size(p) > 1) cluster_sync();   // the other CTA's barriers are ready before any multicast

    // Warpgroup-uniform role, as setmaxnreg requires (budgets: RegBudget).
    int warpgroup = __shfl_sync(~0u, threadIdx.x / 128, 0);
    if (warpgroup == 0) {
        reg_dealloc<RegBudget<D, VARLEN>::PRODUCER>();
        // In a cluster (p.cluster = 2) the producer is a copy of its own: a
        // run-time branch per load spilled the 24-register producer.
        if (threadIdx.x < (VARLEN ? 32 : 1)) {   // producer_issuer
            if (cluster_size(p) > 1) producer<D, BLOCK_N, STAGES, true, VARLEN>(p, sm);
            else producer<D, BLOCK_N, STAGES, false, VARLEN>(p, sm);
        } else if (VARLEN && threadIdx.x / 32 == 1) {
            v_guard<D, BLOCK_N, STAGES>(p, sm);
        }
    } else {
        reg_alloc<RegBudget<D, VARLEN>::CONSUMER>();
        consumer<D, BLOCK_N, STAGES, FP16, VARLEN>(p, sm, warpgroup - 1);
    }
    // The other CTA's producer writes into this CTA's smem and its consumers
    // arrive on this CTA's barriers until both are done.
    if (cluster_size(p) > 1) cluster_sync();
}

// Dynamic smem a launch needs (the +1024 lets the kernel align the base).
template <int D, int BLOCK_N>
static size_t fwd_smem_bytes(void) {
    static_assert(sizeof(FwdSmem<D, BLOCK_N, FA3C_FWD_STAGES(D)>) + 1024 <= FA3C_FWD_SMEM_LIMIT,
                  "the forward kernel's smem exceeds what a block may use");
    return sizeof(FwdSmem<D, BLOCK_N, FA3C_FWD_STAGES(D)>) + 1024;
}
