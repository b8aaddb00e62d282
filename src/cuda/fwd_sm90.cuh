// The FlashAttention-3 forward kernel for sm_90a (bf16 / fp16).
//
// One CTA computes BLOCK_M = 128 query rows of one (batch, head):
//   warpgroup 0  producer: one thread streams Q once, then K and V tiles
//                through a ring of STAGES smem slots with TMA (mbarriers);
//   warpgroups 1, 2  consumers: 64 rows each. Per key block:
//                S = Q·Kᵀ (wgmma, smem x smem), mask, online softmax,
//                O += P·V (wgmma, P from registers).
// Two overlaps hide the softmax behind tensor-core work:
//   intra-warpgroup: S(j) = Q·K(j)ᵀ and O += P(j-1)·V(j-1) are issued
//     together; softmax(j) runs while P·V(j-1) is still in flight;
//   pingpong: named barriers make the two consumer warpgroups take turns
//     issuing GEMMs, so one's softmax runs under the other's GEMMs.
// Key blocks run from the last to the first, so the masked diagonal/edge
// blocks come first and the steady state runs unmasked.
#pragma once
#include "ptx.cuh"
#include "wgmma.cuh"
#include "fwd_params.h"
#include "fwd_tiles.h"
#include "mask.cuh"
#include "softmax.cuh"

// Named-barrier ids (0 is __syncthreads): one per consumer warpgroup for
// the pingpong turn-taking.
enum FwdNamedBarrier { BAR_TURN_WG0 = 1, BAR_TURN_WG1 = 2 };

template <int D, int BLOCK_N, int STAGES>
struct FwdSmem {
    alignas(1024) uint8_t q[FA3C_FWD_BLOCK_M * D * 2];
    alignas(1024) uint8_t k[STAGES][BLOCK_N * D * 2];
    alignas(1024) uint8_t v[STAGES][BLOCK_N * D * 2];
    uint64_t q_full;
    uint64_t k_full[STAGES], k_empty[STAGES];
    uint64_t v_full[STAGES], v_empty[STAGES];
};

// Position of the CTA's work: rows [m0, m0 + 128) of (batch, head).
struct FwdTile {
    int batch, head, head_kv, m0;
    int n_begin, n_end;   // key blocks to visit, visited from n_end - 1 down
};

FA3C_DEVICE FwdTile fwd_tile(const fa3c_fwd_kernel_params &p, int block_n) {
    FwdTile t;
    t.batch = blockIdx.x / p.heads_q;
    t.head = blockIdx.x % p.heads_q;
    t.head_kv = t.head / (p.heads_q / p.heads_kv);
    // blockIdx.y runs fastest-scheduled first: give it the longest (last) rows,
    // which under causal masking have the most key blocks.
    t.m0 = (p.num_m_blocks - 1 - blockIdx.y) * FA3C_FWD_BLOCK_M;
    key_block_range(p, t.m0, FA3C_FWD_BLOCK_M, block_n, t.n_begin, t.n_end);
    return t;
}

// Ring slot and barrier parity of the it-th key block.
FA3C_DEVICE int stage_of(int it, int stages) { return it % stages; }
FA3C_DEVICE uint32_t phase_of(int it, int stages) { return (uint32_t)(it / stages) & 1; }

// ---- producer ----------------------------------------------------------------

// TMA loads of one rows x D tile as D/64 boxes of 64 columns.
template <int D, int ROWS>
FA3C_DEVICE void load_tile(uint8_t *dst, const CUtensorMap *map, uint64_t *bar, int row0, int head, int batch) {
#pragma unroll
    for (int c = 0; c < D / 64; c++) tma_load_4d(dst + c * ROWS * 128, map, bar, c * 64, row0, head, batch);
}

template <int D, int BLOCK_N, int STAGES>
FA3C_DEVICE void producer(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t) {
    mbar_arrive_expect_tx(&sm.q_full, FA3C_FWD_BLOCK_M * D * 2);
    load_tile<D, FA3C_FWD_BLOCK_M>(sm.q, &p.q_map, &sm.q_full, t.m0, t.head, t.batch);
    int it = 0;
    for (int n = t.n_end - 1; n >= t.n_begin; n--, it++) {
        int s = stage_of(it, STAGES);
        uint32_t ph = phase_of(it, STAGES);
        mbar_wait_parity(&sm.k_empty[s], ph ^ 1);   // a fresh barrier passes parity 1 at once
        mbar_arrive_expect_tx(&sm.k_full[s], BLOCK_N * D * 2);
        load_tile<D, BLOCK_N>(sm.k[s], &p.k_map, &sm.k_full[s], n * BLOCK_N, t.head_kv, t.batch);
        mbar_wait_parity(&sm.v_empty[s], ph ^ 1);
        mbar_arrive_expect_tx(&sm.v_full[s], BLOCK_N * D * 2);
        load_tile<D, BLOCK_N>(sm.v[s], &p.v_map, &sm.v_full[s], n * BLOCK_N, t.head_kv, t.batch);
    }
}

// ---- consumer GEMMs ------------------------------------------------------------

// S(64 x BLOCK_N) = Q(rows of this warpgroup) · K(stage)ᵀ; both tiles K-major
// with the 128B swizzle: a k-step of 16 is +32 B inside a 64-column chunk.
template <int D, int BLOCK_N, int FP16>
FA3C_DEVICE void gemm_qk(float *s, const uint8_t *q, const uint8_t *k, int consumer) {
    uint32_t q_addr = smem_addr(q) + consumer * 64 * 128, k_addr = smem_addr(k);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t q_off = (kk / 4) * FA3C_FWD_BLOCK_M * 128 + (kk % 4) * 32;
        uint32_t k_off = (kk / 4) * BLOCK_N * 128 + (kk % 4) * 32;
        wgmma_ss<BLOCK_N, FP16>(s, smem_desc_sw128(q_addr + q_off, 16, 1024),
                                smem_desc_sw128(k_addr + k_off, 16, 1024), kk > 0);
    }
}

// O(64 x D) += P(64 x BLOCK_N, registers) · V(stage); V is MN-major: a k-step
// is 16 rows (2 KB), 64-column chunks are BLOCK_N * 128 B apart.
template <int D, int BLOCK_N, int FP16>
FA3C_DEVICE void gemm_pv(float *o, uint32_t (*p_frag)[4], const uint8_t *v) {
    uint32_t v_addr = smem_addr(v);
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / 16; kk++)
        wgmma_rs<D, FP16>(o, p_frag[kk], smem_desc_sw128(v_addr + kk * 16 * 128, BLOCK_N * 128, 1024), 1);
}

template <int N>
FA3C_DEVICE void fence_regs(float *x) {
#pragma unroll
    for (int i = 0; i < N; i++) reg_fence(x[i]);
}

// Release a smem slot: one arrival per consumer warp, after its wgmma wait.
FA3C_DEVICE void release(uint64_t *bar) {
    if (threadIdx.x % 32 == 0) mbar_arrive(bar);
}

// Turn-taking between the two consumer warpgroups (pingpong).
FA3C_DEVICE void wait_my_turn(int consumer) { named_bar_sync(BAR_TURN_WG0 + consumer, 256); }
FA3C_DEVICE void pass_turn(int consumer) { named_bar_arrive(BAR_TURN_WG0 + (1 - consumer), 256); }

// Scores in place: softcap and the mask, where they apply.
template <int BLOCK_N>
FA3C_DEVICE void prepare_scores(float *s, const fa3c_fwd_kernel_params &p, const FwdTile &t, int row0, int n,
                                int quad) {
    if (p.softcap > 0.f) {
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; i++) s[i] = p.softcap * tanh_approx(s[i] * p.softcap_pre);
    }
    if (block_needs_mask(p, t.m0, FA3C_FWD_BLOCK_M, BLOCK_N, n)) apply_mask<BLOCK_N>(s, p, row0, n, quad);
}

// ---- epilogue ------------------------------------------------------------------

// O / sum -> out (input dtype), and the LSE. Rows past seqlen_q are dropped.
template <int D, int FP16>
FA3C_DEVICE void epilogue(const fa3c_fwd_kernel_params &p, const FwdTile &t, float *o, SoftmaxState &st, int row0,
                          int quad) {
    float inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = quad_sum(st.sum[r]);
        inv[r] = sum > 0.f ? 1.f / sum : 0.f;   // fully masked row: output 0
        lse[r] = sum > 0.f ? st.max[r] * p.lse_scale + logf(sum) : -INFINITY;
    }
    uint16_t *out = (uint16_t *)p.out + t.batch * p.out_stride[0] + t.head * p.out_stride[2];
#pragma unroll
    for (int i = 0; i < D / 2; i += 2) {
        int r = (i / 2) % 2, row = row0 + 8 * r, col = 8 * (i / 4) + 2 * quad;
        if (row < p.seqlen_q) {
            uint32_t packed = FP16 ? pack_f16x2(o[i] * inv[r], o[i + 1] * inv[r])
                                   : pack_bf16x2(o[i] * inv[r], o[i + 1] * inv[r]);
            *(uint32_t *)(out + row * p.out_stride[1] + col) = packed;
        }
    }
    if (p.lse && quad == 0) {
        float *lse_row = p.lse + ((int64_t)t.batch * p.heads_q + t.head) * p.seqlen_q;
        if (row0 < p.seqlen_q) lse_row[row0] = lse[0];
        if (row0 + 8 < p.seqlen_q) lse_row[row0 + 8] = lse[1];
    }
}

// ---- consumer ------------------------------------------------------------------

template <int D, int BLOCK_N, int STAGES, int FP16>
FA3C_DEVICE void consumer(const fa3c_fwd_kernel_params &p, FwdSmem<D, BLOCK_N, STAGES> &sm, const FwdTile &t,
                          int consumer_index) {
    int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, quad = lane % 4;
    int row0 = t.m0 + consumer_index * 64 + warp * 16 + lane / 4;   // this thread's rows: row0, row0 + 8

    float o[D / 2];
    float s[BLOCK_N / 2];
    uint32_t p_frag[BLOCK_N / 16][4];
    SoftmaxState st;
    softmax_init(st);
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;

    if (consumer_index == 1) pass_turn(1);   // warpgroup 0 takes the first turn
    mbar_wait_parity(&sm.q_full, 0);

    // First key block: S only; its P·V is issued with the next block's S.
    int n = t.n_end - 1;
    mbar_wait_parity(&sm.k_full[0], 0);
    wait_my_turn(consumer_index);
    wgmma_fence();
    gemm_qk<D, BLOCK_N, FP16>(s, sm.q, sm.k[0], consumer_index);
    wgmma_commit();
    pass_turn(consumer_index);
    wgmma_wait<0>();
    fence_regs<BLOCK_N / 2>(s);
    release(&sm.k_empty[0]);
    float rescale[2];
    prepare_scores<BLOCK_N>(s, p, t, row0, n, quad);
    softmax_step<BLOCK_N>(s, st, p.score_log2, rescale);
    probs_to_fragments<BLOCK_N, FP16>(s, p_frag);

    int it = 1;
    for (n = n - 1; n >= t.n_begin; n--, it++) {
        int cur = stage_of(it, STAGES), prev = stage_of(it - 1, STAGES);
        mbar_wait_parity(&sm.k_full[cur], phase_of(it, STAGES));
        mbar_wait_parity(&sm.v_full[prev], phase_of(it - 1, STAGES));
        wait_my_turn(consumer_index);
        wgmma_fence();
        gemm_qk<D, BLOCK_N, FP16>(s, sm.q, sm.k[cur], consumer_index);
        wgmma_commit();
        gemm_pv<D, BLOCK_N, FP16>(o, p_frag, sm.v[prev]);
        wgmma_commit();
        pass_turn(consumer_index);

        wgmma_wait<1>();                 // S(j) is ready; P·V(j-1) may still run
        fence_regs<BLOCK_N / 2>(s);
        release(&sm.k_empty[cur]);
        prepare_scores<BLOCK_N>(s, p, t, row0, n, quad);
        softmax_step<BLOCK_N>(s, st, p.score_log2, rescale);

        wgmma_wait<0>();                 // P·V(j-1) done: O may be rescaled
        fence_regs<D / 2>(o);
        release(&sm.v_empty[prev]);
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] *= rescale[(i / 2) % 2];
        probs_to_fragments<BLOCK_N, FP16>(s, p_frag);
    }

    // Last P·V.
    int last = stage_of(it - 1, STAGES);
    mbar_wait_parity(&sm.v_full[last], phase_of(it - 1, STAGES));
    wait_my_turn(consumer_index);
    wgmma_fence();
    gemm_pv<D, BLOCK_N, FP16>(o, p_frag, sm.v[last]);
    wgmma_commit();
    pass_turn(consumer_index);
    wgmma_wait<0>();
    fence_regs<D / 2>(o);
    release(&sm.v_empty[last]);
    if (consumer_index == 0) wait_my_turn(0);   // consume warpgroup 1's last pass: barriers end balanced

    epilogue<D, FP16>(p, t, o, st, row0, quad);
}

// Rows whose every key is masked (or an empty key range): zeros and -inf.
template <int D, int FP16>
FA3C_DEVICE void write_empty_tile(const fa3c_fwd_kernel_params &p, const FwdTile &t, int consumer_index) {
    int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, quad = lane % 4;
    int row0 = t.m0 + consumer_index * 64 + warp * 16 + lane / 4;
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    SoftmaxState st;
    softmax_init(st);
    epilogue<D, FP16>(p, t, o, st, row0, quad);
}

template <int D, int FP16>
__global__ void __launch_bounds__(FA3C_FWD_THREADS, 1) fwd_kernel(const __grid_constant__ fa3c_fwd_kernel_params p) {
    enum { BLOCK_N = FA3C_FWD_BLOCK_N(D), STAGES = FA3C_FWD_STAGES(D) };
    typedef FwdSmem<D, BLOCK_N, STAGES> Smem;
    extern __shared__ uint8_t smem_raw[];
    Smem &sm = *(Smem *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);

    FwdTile t = fwd_tile(p, BLOCK_N);
    // Warpgroup-uniform role, as setmaxnreg requires.
    int warpgroup = __shfl_sync(~0u, threadIdx.x / 128, 0);

    if (t.n_end <= t.n_begin) {                  // nothing visible: no loads at all
        if (warpgroup > 0) write_empty_tile<D, FP16>(p, t, warpgroup - 1);
        return;
    }
    if (threadIdx.x == 0) {
        tma_prefetch_map(&p.q_map);
        tma_prefetch_map(&p.k_map);
        tma_prefetch_map(&p.v_map);
        mbar_init(&sm.q_full, 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&sm.k_full[s], 1);
            mbar_init(&sm.v_full[s], 1);
            mbar_init(&sm.k_empty[s], 4 * FA3C_FWD_CONSUMER_WARPGROUPS);   // one per consumer warp
            mbar_init(&sm.v_empty[s], 4 * FA3C_FWD_CONSUMER_WARPGROUPS);
        }
        fence_barrier_init();
    }
    __syncthreads();

    if (warpgroup == 0) {
        reg_dealloc<FA3C_FWD_PRODUCER_REGS>();
        if (threadIdx.x == 0) producer<D, BLOCK_N, STAGES>(p, sm, t);
    } else {
        reg_alloc<FA3C_FWD_CONSUMER_REGS>();
        consumer<D, BLOCK_N, STAGES, FP16>(p, sm, t, warpgroup - 1);
    }
}

// Dynamic smem a launch needs (the +1024 lets the kernel align the base).
template <int D>
static size_t fwd_smem_bytes(void) {
    return sizeof(FwdSmem<D, FA3C_FWD_BLOCK_N(D), FA3C_FWD_STAGES(D)>) + 1024;
}
