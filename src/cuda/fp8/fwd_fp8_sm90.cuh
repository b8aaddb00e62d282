// The fp8 (e4m3) forward kernel for sm_90a, head dims 128 and 256: q, k, v
// in e4m3 with per-(batch, K/V head) descales and optional per-block ones, O in bf16, LSE in float32.
//
// One CTA computes 128 query rows of one (batch, head) against every key
// block its mask lets through:
//   warpgroup 0  producer: one thread loads Q once, then K and Vᵀ tiles
//                through a ring of slots (TMA, mbarriers). Vᵀ is the copy of
//                V that fp8_prep.cu writes before the launch: e4m3 wgmma
//                takes both operands K-major, and for O += P·V that means
//                V with the keys contiguous;
//   warpgroups 1, 2  consumers, 64 rows each. Per key block: S = Q·Kᵀ
//                (wgmma e4m3, f32 accumulators), mask, online softmax,
//                P to e4m3 in registers, O += P·Vᵀ (wgmma, A from registers).
// P is kept in [0, 256] (exp2 against the row max less 8, as FA3 does) so
// that e4m3's precision is spent on the largest probabilities; the row
// sums stay f32. By default each GEMM is waited for in turn (the first
// form); FA3C_FP8_OVERLAP turns on the bf16 kernel's two overlaps, the
// intra-warpgroup one and the pingpong between the consumers (docs/FP8.md).
#pragma once
#include <limits.h>
#include <string.h>
#include "ptx.cuh"
#include "wgmma.cuh"
#include "fp8_params.h"

enum { FP8_M = FA3C_FP8_BLOCK_M, FP8_N = FA3C_FP8_BLOCK_N, FP8_ATOM = 1024 };

// Named-barrier ids (0 is __syncthreads): the consumers' turns with
// FA3C_FP8_OVERLAP, one per warpgroup (this one and + 1).
enum Fp8NamedBarrier { BAR_FP8_TURN_WG0 = 1 };

// Q and K as D / 128 column chunks of rows x 128 B; Vᵀ as D rows x 128 B.
template <int D>
struct Fp8Smem {
    enum { STAGES = FA3C_FP8_STAGES(D) };
    alignas(1024) uint8_t q[FP8_M * D];
    alignas(1024) uint8_t k[STAGES][FP8_N * D];
    alignas(1024) uint8_t vt[STAGES][D * FP8_N];
    uint64_t q_full;
    uint64_t kv_full[STAGES], kv_empty[STAGES];
};

// Key blocks [n_begin, n_end) that rows [m0, m0 + 128) see at all.
FA3C_HOST_DEVICE void fp8_key_blocks(const fa3c_fp8_kernel_params &p, int m0, int &n_begin, int &n_end) {
    const long long diag = (long long)p.seqlen_k - p.seqlen_q;
    const long long first = min((long long)m0, (long long)p.seqlen_q - 1), last = min((long long)m0 + FP8_M - 1, (long long)p.seqlen_q - 1);
    long long lo = p.window_left >= 0 ? first + diag - p.window_left : 0;
    long long hi = p.window_right >= 0 ? last + diag + p.window_right : (long long)p.seqlen_k - 1;
    lo = max(lo, 0ll);
    hi = min(hi, (long long)p.seqlen_k - 1);
    if (hi < lo) {
        n_begin = n_end = 0;
        return;
    }
    n_begin = (int)(lo / FP8_N);
    n_end = (int)(hi / FP8_N) + 1;
}

// Key blocks [u_begin, u_end) that every row of [m0, m0 + 128) below
// seqlen_q sees whole, so their scores need no mask: the band's lower end
// grows with the row and so does its upper end, so the last row's lower end
// and the first row's upper end bound it (a row that sees no key leaves the
// range empty).
FA3C_HOST_DEVICE void fp8_unmasked_blocks(const fa3c_fp8_kernel_params &p, int m0, int &u_begin, int &u_end) {
    const long long diag = (long long)p.seqlen_k - p.seqlen_q;
    const long long first = m0, last = min((long long)m0 + FP8_M - 1, (long long)p.seqlen_q - 1);
    long long lo = p.window_left >= 0 ? last + diag - p.window_left : 0;
    long long hi = p.window_right >= 0 ? first + diag + p.window_right : (long long)p.seqlen_k - 1;
    lo = max(lo, 0ll);
    hi = min(hi, (long long)p.seqlen_k - 1);
    u_begin = (int)min((lo + FP8_N - 1) / FP8_N, (long long)INT_MAX);   // the first block starting at or after lo
    u_end = hi < 0 ? 0 : (int)((hi + 1) / FP8_N);                     // past the last one ending at or before hi
    if (u_end < u_begin) u_end = u_begin;
}

// ---- producer ----------------------------------------------------------------------

template <int D>
FA3C_DEVICE void fp8_producer(const fa3c_fp8_kernel_params &p, Fp8Smem<D> &sm, int m0, int head, int batch) {
    const int head_kv = head / p.group;
    int n_begin, n_end;
    fp8_key_blocks(p, m0, n_begin, n_end);
    // Rows that see no key at all: the consumers write zeros and wait for
    // nothing, so nothing is loaded (a copy in flight must not outlive the CTA).
    if (n_begin >= n_end) return;
    mbar_arrive_expect_tx(&sm.q_full, FP8_M * D);
#pragma unroll
    for (int c = 0; c < D / 128; c++) tma_load_4d(sm.q + c * FP8_M * 128, &p.q_map, &sm.q_full, c * 128, m0, head, batch);
    for (int n = n_begin, it = 0; n < n_end; n++, it++) {
        const int s = it % FA3C_FP8_STAGES(D);
        if (it >= FA3C_FP8_STAGES(D)) mbar_wait_parity(&sm.kv_empty[s], (it / FA3C_FP8_STAGES(D) - 1) & 1);
        mbar_arrive_expect_tx(&sm.kv_full[s], 2 * FP8_N * D);
#pragma unroll
        for (int c = 0; c < D / 128; c++)
            tma_load_4d(sm.k[s] + c * FP8_N * 128, &p.k_map, &sm.kv_full[s], c * 128, n * FP8_N, head_kv, batch);
        tma_load_4d(sm.vt[s], &p.vt_map, &sm.kv_full[s], n * FP8_N, 0, head_kv, batch);
    }
}

// ---- consumer GEMMs ----------------------------------------------------------------

// S(64 x 128) = Q(this warpgroup's rows) · K(slot)ᵀ, both K-major: a k-step
// is 32 bytes inside a 128-byte chunk row, chunks are rows x 128 B apart.
template <int D>
FA3C_DEVICE void fp8_gemm_qk(float *s, const uint8_t *q, const uint8_t *k, int wg) {
    const uint64_t q_desc = smem_desc_swizzled(smem_addr(q) + wg * 64 * 128, 16, FP8_ATOM, 128);
    const uint64_t k_desc = smem_desc_swizzled(smem_addr(k), 16, FP8_ATOM, 128);
#pragma unroll
    for (int kk = 0; kk < D / 32; kk++) {
        const uint32_t in_row = (kk % 4) * 32, chunk = kk / 4;
        wgmma_ss_e4m3<FP8_N>(s, smem_desc_advance(q_desc, chunk * FP8_M * 128 + in_row),
                             smem_desc_advance(k_desc, chunk * FP8_N * 128 + in_row), kk > 0);
    }
}

// O(64 x D) += P(64 x 128 keys, e4m3 fragments) · V: B is Vᵀ (D rows of the
// 128 keys, K-major), a k-step is 32 keys = 32 bytes of each row.
template <int D>
FA3C_DEVICE void fp8_gemm_pv(float *o, uint32_t (*p_frag)[4], const uint8_t *vt) {
    const uint64_t vt_desc = smem_desc_swizzled(smem_addr(vt), 16, FP8_ATOM, 128);
#pragma unroll
    for (int kk = 0; kk < FP8_N / 32; kk++) wgmma_rs_e4m3<D>(o, p_frag[kk], smem_desc_advance(vt_desc, kk * 32), 1);
}

template <int N>
FA3C_DEVICE void fp8_fence_regs(float *x) {
#pragma unroll
    for (int i = 0; i < N; i++) reg_fence(x[i]);
}

// O += P·V for one key block, waited for; then this warp releases the
// block's K/V slot (`empty`).
template <int D>
FA3C_DEVICE void fp8_pv_and_release(float *o, uint32_t (*p_frag)[4], const uint8_t *vt, uint64_t *empty) {
    wgmma_fence();
    fp8_gemm_pv<D>(o, p_frag, vt);
    wgmma_commit();
    wgmma_wait<0>();
    fp8_fence_regs<D / 2>(o);
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(empty);
}

// Four floats -> one register of four e4m3 bytes, a in the lowest
// (cvt.rn.satfinite.e4m3x2.f32 puts its first operand in the high byte).
FA3C_DEVICE uint32_t pack_e4m3x4(float a, float b, float c, float d) {
    uint16_t lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

// The accumulator register of S (64 x 128, f32 layout: register i holds
// row g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 t + i % 2) that byte `byte`
// of e4m3 A-fragment register j of k-step kk takes: row g (j even) or g + 8
// (j odd); A slot 16 (j / 2) + 4 t + byte of the step, i.e. column
// 32 kk + 16 (j / 2) + 2 t + (byte & 1) + 8 (byte >> 1): fa3c_fp8_key_of_slot,
// which Vᵀ's key order matches (fp8_prep.cu). So no shuffles.
FA3C_HOST_DEVICE int fp8_fragment_source(int kk, int j, int byte) {
    return 16 * kk + 8 * (j / 2) + 4 * (byte >> 1) + 2 * (j % 2) + (byte & 1);
}

// P (the f32 accumulator of S) -> e4m3 A fragments, one per 32-key k-step.
FA3C_DEVICE void fp8_probs_to_fragments(const float *s, uint32_t (*frag)[4]) {
#pragma unroll
    for (int kk = 0; kk < FP8_N / 32; kk++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            frag[kk][j] = pack_e4m3x4(s[fp8_fragment_source(kk, j, 0)], s[fp8_fragment_source(kk, j, 1)],
                                      s[fp8_fragment_source(kk, j, 2)], s[fp8_fragment_source(kk, j, 3)]);
}

// ---- consumer softmax --------------------------------------------------------------

struct Fp8RowState {
    float max[2];   // running max of the scores in log2 units (-inf: none seen)
    float sum[2];   // this thread's partial sum of P (P in [0, 256])
};

// The keys query q sees, as offsets from `base` clamped to [-1, 128]:
// [lo_c, hi_c] (empty when lo_c > hi_c), keys past seqlen_k excluded.
FA3C_HOST_DEVICE void fp8_row_columns(const fa3c_fp8_kernel_params &p, long long q, long long base, int &lo_c,
                                      int &hi_c) {
    const long long diag = (long long)p.seqlen_k - p.seqlen_q;
    long long lo = p.window_left >= 0 ? q + diag - p.window_left : LLONG_MIN / 4;
    long long hi = p.window_right >= 0 ? q + diag + p.window_right : LLONG_MAX / 4;
    hi = min(hi, (long long)p.seqlen_k - 1);
    lo_c = (int)max(min(lo - base, 128ll), -1ll);
    hi_c = (int)max(min(hi - base, 128ll), -1ll);
}

// Scores to log2 units with the mask: thread rows row0, row0 + 8 (queries),
// columns key0 + 8 c + 2 t (+1). Masked and past-the-end keys get -inf.
// MASKED = false: a block every row sees whole (fp8_unmasked_blocks).
template <bool MASKED = true>
FA3C_DEVICE void fp8_scores(float *s, const fa3c_fp8_kernel_params &p, float score_log2, float softcap_pre, int row0,
                            int key0) {
    const int t = threadIdx.x % 4;
    // Softcap in a loop of its own under one uniform branch (FA3C_FP8_SOFTCAP_LOOP):
    // inside the mask's loop ptxas predicated it, so calls without softcap still
    // issued its multiplies and tanh for every element.
    if (FA3C_FP8_SOFTCAP_LOOP && p.softcap != 0.f) {
#pragma unroll
        for (int i = 0; i < FP8_N / 2; i++) s[i] = p.softcap * tanh_approx(s[i] * softcap_pre);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int lo_c = 0, hi_c = FP8_N;   // the row's keys, as offsets from key0 + 2 t
        if (MASKED) fp8_row_columns(p, row0 + 8 * r, (long long)key0 + 2 * t, lo_c, hi_c);
#pragma unroll
        for (int c = 0; c < FP8_N / 8; c++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * c + 2 * r + e, off = 8 * c + e;
                float x = s[i];
                if (!FA3C_FP8_SOFTCAP_LOOP && p.softcap != 0.f) x = p.softcap * tanh_approx(x * softcap_pre);
                const float scaled = FA3C_FP8_FUSED_SCALE ? x : x * score_log2;   // fp8_softmax_row scales
                s[i] = !MASKED || (off >= lo_c && off <= hi_c) ? scaled : -INFINITY;
            }
    }
}

// The scores of key block n: without the mask where every row of the CTA
// sees the block whole (FA3C_FP8_UNMASKED_BLOCKS, [u_begin, u_end)).
FA3C_DEVICE void fp8_block_scores(float *s, const fa3c_fp8_kernel_params &p, float score_log2, float softcap_pre,
                                  int row0, int n, int u_begin, int u_end) {
    if (FA3C_FP8_UNMASKED_BLOCKS && n >= u_begin && n < u_end)
        fp8_scores<false>(s, p, score_log2, softcap_pre, row0, n * FP8_N);
    else
        fp8_scores<true>(s, p, score_log2, softcap_pre, row0, n * FP8_N);
}

// 2^x on the FMA pipe, for FA3C_FP8_POLY_EXP: x + 1.5 * 2^23 rounds x to an
// integer n in its low mantissa bits, a cubic gives 2^(x - n) on [-1/2, 1/2]
// (relative error below 1e-4, far under e4m3's 6%), and n joins its exponent
// (n << 23 keeps only n's bits). x is first clamped to -126.5 so that the
// exponent stays in range: 2^x below that is a tiny positive number, which
// e4m3 rounds to 0. NaN stays NaN (max.NaN), -inf gives the tiny number.
FA3C_HOST_DEVICE float ex2_poly(float x) {
#ifdef __CUDA_ARCH__
    asm("max.NaN.f32 %0, %0, 0fC2FD0000;" : "+f"(x));   // -126.5
#else
    x = x != x ? x : fmaxf(x, -126.5f);
#endif
    const float t = x + 12582912.f, f = x - (t - 12582912.f);
    const float p = fmaf(fmaf(fmaf(0.055171627551317215f, f, 0.24261116981506348f), f, 0.6932609677314758f), f,
                         0.9999280571937561f);
#ifdef __CUDA_ARCH__
    return __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));
#else
    uint32_t pb, tb;
    memcpy(&pb, &p, 4);
    memcpy(&tb, &t, 4);
    pb += tb << 23;
    float y;
    memcpy(&y, &pb, 4);
    return y;
#endif
}

// Online softmax step for row r of the thread's two (0: row0, 1: row0 + 8):
// the new row max, the sum rescaled, P in place; returns the factor O's row
// must be rescaled by (fp8_rescale_o_row: the overlapped loop applies it
// only once the P·V in flight has landed).
// With FA3C_FP8_FUSED_SCALE, s holds the scores unscaled: their maximum
// times score_log2 (> 0) is the scaled one, and the scale joins the exp's
// subtraction in one FFMA.
FA3C_DEVICE float fp8_softmax_row(float *s, Fp8RowState &st, int r, float score_log2) {
    float mx = FA3C_FP8_FUSED_SCALE ? -INFINITY : st.max[r];
#pragma unroll
    for (int c = 0; c < FP8_N / 8; c++) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * r], s[4 * c + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 2));
    if (FA3C_FP8_FUSED_SCALE) mx = fmaxf(st.max[r], mx * score_log2);
    // A row that has seen no key yet keeps offset 0: exp2(-inf - 0) = 0, never NaN.
    const float off = mx == -INFINITY ? 0.f : mx - 8.f;
    const float rescale = mx == -INFINITY ? 1.f : ex2f(st.max[r] - mx);
    st.max[r] = mx;
    float sum = st.sum[r] * rescale;
#pragma unroll
    for (int c = 0; c < FP8_N / 8; c++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float x = s[4 * c + 2 * r + e];
            const float arg = FA3C_FP8_FUSED_SCALE ? fmaf(x, score_log2, -off) : x - off;
            const bool poly = FA3C_FP8_POLY_EXP > 0 && c % (FA3C_FP8_POLY_EXP > 0 ? FA3C_FP8_POLY_EXP : 1) == 0;
            const float prob = poly ? ex2_poly(arg) : ex2f(arg);
            s[4 * c + 2 * r + e] = prob;
            sum += prob;
        }
    st.sum[r] = sum;
    return rescale;
}

template <int D>
FA3C_DEVICE void fp8_rescale_o_row(float *o, int r, float rescale) {
#pragma unroll
    for (int c = 0; c < D / 8; c++) {
        o[4 * c + 2 * r] *= rescale;
        o[4 * c + 2 * r + 1] *= rescale;
    }
}

// O's two rows times their rescales. With FA3C_FP8_LAZY_RESCALE skipped
// where no row of the warp changed its maximum (rescales of exactly 1, so
// the skip changes no bit), which after the first blocks is most blocks.
template <int D>
FA3C_DEVICE void fp8_rescale_o(float *o, const float rescale[2]) {
    if (FA3C_FP8_LAZY_RESCALE && !__any_sync(~0u, rescale[0] != 1.f || rescale[1] != 1.f)) return;
    fp8_rescale_o_row<D>(o, 0, rescale[0]);
    fp8_rescale_o_row<D>(o, 1, rescale[1]);
}

// ---- consumer ----------------------------------------------------------------------

// The score scales: s = q·k · descales · scale, with softcap softcap ·
// tanh(that / softcap), then log2 units. fp8_head_score_scale: those of the
// CTA's head and query block; fp8_score_scale: key block n's, times its
// per-block K descale (k_blocks; NULL: none, the head's scales unchanged).
typedef struct {
    float score_log2, softcap_pre;
} Fp8ScoreScale;

FA3C_DEVICE Fp8ScoreScale fp8_head_score_scale(const fa3c_fp8_kernel_params &p, float qk_scale) {
    return Fp8ScoreScale{(p.softcap != 0.f ? 1.f : qk_scale) * 1.4426950408889634f,
                         p.softcap != 0.f ? qk_scale / p.softcap : 0.f};
}

FA3C_DEVICE Fp8ScoreScale fp8_score_scale(const fa3c_fp8_kernel_params &p, Fp8ScoreScale head, const float *k_blocks,
                                          int n) {
    if (!k_blocks) return head;
    const float kb = k_blocks[n];
    return Fp8ScoreScale{p.softcap != 0.f ? head.score_log2 : head.score_log2 * kb, head.softcap_pre * kb};
}

// O is kept in units of the current key block's V descale (v_blocks[n]; a
// scale cannot join P, whose e4m3 range it would leave): moving to block n
// multiplies O by the old block's over the new one's, folded into the
// online softmax's rescale. 1 without per-block V descales.
FA3C_DEVICE float fp8_v_ratio(const float *v_blocks, int n, float &v_block) {
    if (!v_blocks) return 1.f;
    const float next = v_blocks[n], ratio = v_block / next;
    v_block = next;
    return ratio;
}

// BLOCK_SCALES: the instance for calls with per-block K or V descales
// (fp8_host.c picks it); the other runs the loop with its scales constant.
template <int D, bool BLOCK_SCALES>
FA3C_DEVICE void fp8_consumer(const fa3c_fp8_kernel_params &p, Fp8Smem<D> &sm, int m0, int head, int batch, int wg) {
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int row0 = m0 + wg * 64 + warp * 16 + lane / 4;   // this thread's query rows: row0, row0 + 8
    const int head_kv = head / p.group, dq = batch * p.heads_kv + head_kv;
    const float q_descale = p.q_descale ? p.q_descale[dq] : 1.f, k_descale = p.k_descale ? p.k_descale[dq] : 1.f;
    const float v_descale = p.v_descale ? p.v_descale[dq] : 1.f;
    // Per-block descales: the query tile is one block, each key block one (fp8_host.c checks the sizes agree).
    const int64_t q_blocks = (p.seqlen_q + FP8_M - 1) / FP8_M, k_blocks_per_head = (p.seqlen_k + FP8_N - 1) / FP8_N;
    const float q_block = p.q_block_descale ? p.q_block_descale[((int64_t)batch * p.heads_q + head) * q_blocks + m0 / FP8_M] : 1.f;
    const float *k_blocks = BLOCK_SCALES && p.k_block_descale ? p.k_block_descale + (int64_t)dq * k_blocks_per_head : NULL;
    const float *v_blocks = BLOCK_SCALES && p.v_block_descale ? p.v_block_descale + (int64_t)dq * k_blocks_per_head : NULL;
    const Fp8ScoreScale head_scale = fp8_head_score_scale(p, q_descale * q_block * k_descale * p.softmax_scale);
    int n_begin, n_end, u_begin = 0, u_end = 0;
    fp8_key_blocks(p, m0, n_begin, n_end);
    if (FA3C_FP8_UNMASKED_BLOCKS) fp8_unmasked_blocks(p, m0, u_begin, u_end);
    float v_block = v_blocks && n_begin < n_end ? v_blocks[n_begin] : 1.f;   // O's unit (fp8_v_ratio)

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    Fp8RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}};
    if (n_begin < n_end) mbar_wait_parity(&sm.q_full, 0);
    if (!FA3C_FP8_OVERLAP) {   // each GEMM waited for in turn
        for (int n = n_begin, it = 0; n < n_end; n++, it++) {
            const int s = it % FA3C_FP8_STAGES(D);
            mbar_wait_parity(&sm.kv_full[s], (it / FA3C_FP8_STAGES(D)) & 1);
            float sc[FP8_N / 2];
            wgmma_fence();
            fp8_gemm_qk<D>(sc, sm.q, sm.k[s], wg);
            wgmma_commit();
            wgmma_wait<0>();
            fp8_fence_regs<FP8_N / 2>(sc);
            const Fp8ScoreScale sc_scale = fp8_score_scale(p, head_scale, k_blocks, n);
            fp8_block_scores(sc, p, sc_scale.score_log2, sc_scale.softcap_pre, row0, n, u_begin, u_end);
            const float v_ratio = fp8_v_ratio(v_blocks, n, v_block);
#pragma unroll
            for (int r = 0; r < 2; r++)
                fp8_rescale_o_row<D>(o, r, fp8_softmax_row(sc, st, r, sc_scale.score_log2) * v_ratio);
            uint32_t p_frag[FP8_N / 32][4];
            fp8_probs_to_fragments(sc, p_frag);
            fp8_pv_and_release<D>(o, p_frag, sm.vt[s], &sm.kv_empty[s]);
        }
    } else if (n_begin < n_end) {
        // FA3's two overlaps. Intra-warpgroup: S(n) and O += P(n-1)·V(n-1)
        // are issued together, and softmax(n) runs while P·V(n-1) is in
        // flight (O is rescaled once it lands). Pingpong: the two consumers
        // take turns issuing their GEMMs (named barriers), so that one's
        // softmax runs under the other's GEMMs. Warpgroup 1 lets warpgroup 0
        // go first; the last turn is never handed back (no arrival left over).
        const int last = n_end - 1 - n_begin;   // turns: one per key block after the first
        if (wg == 1 && last > 0) named_bar_arrive(BAR_FP8_TURN_WG0, 256);
        float sc[FP8_N / 2], rescale[2];
        uint32_t p_frag[FP8_N / 32][4];
        mbar_wait_parity(&sm.kv_full[0], 0);
        wgmma_fence();
        fp8_gemm_qk<D>(sc, sm.q, sm.k[0], wg);
        wgmma_commit();
        wgmma_wait<0>();
        fp8_fence_regs<FP8_N / 2>(sc);
        Fp8ScoreScale sc_scale = fp8_score_scale(p, head_scale, k_blocks, n_begin);
        fp8_block_scores(sc, p, sc_scale.score_log2, sc_scale.softcap_pre, row0, n_begin, u_begin, u_end);
        fp8_softmax_row(sc, st, 0, sc_scale.score_log2);   // O is 0: nothing to rescale
        fp8_softmax_row(sc, st, 1, sc_scale.score_log2);
        fp8_probs_to_fragments(sc, p_frag);
        for (int it = 1; it <= last; it++) {
            const int s = it % FA3C_FP8_STAGES(D), prev = (it - 1) % FA3C_FP8_STAGES(D);
            mbar_wait_parity(&sm.kv_full[s], (it / FA3C_FP8_STAGES(D)) & 1);
            named_bar_sync(BAR_FP8_TURN_WG0 + wg, 256);
            wgmma_fence();
            fp8_gemm_qk<D>(sc, sm.q, sm.k[s], wg);
            wgmma_commit();
            fp8_gemm_pv<D>(o, p_frag, sm.vt[prev]);
            wgmma_commit();
            if (!(wg == 1 && it == last)) named_bar_arrive(BAR_FP8_TURN_WG0 + (1 - wg), 256);
            wgmma_wait<1>();   // S(n); P·V(n-1) may still run
            fp8_fence_regs<FP8_N / 2>(sc);
            sc_scale = fp8_score_scale(p, head_scale, k_blocks, n_begin + it);
            fp8_block_scores(sc, p, sc_scale.score_log2, sc_scale.softcap_pre, row0, n_begin + it, u_begin, u_end);
            const float v_ratio = fp8_v_ratio(v_blocks, n_begin + it, v_block);
            rescale[0] = fp8_softmax_row(sc, st, 0, sc_scale.score_log2) * v_ratio;
            rescale[1] = fp8_softmax_row(sc, st, 1, sc_scale.score_log2) * v_ratio;
            wgmma_wait<0>();   // P·V(n-1): its slot is free, O may be rescaled, P(n-1)'s registers reused
            fp8_fence_regs<D / 2>(o);
            __syncwarp();
            if (lane == 0) mbar_arrive(&sm.kv_empty[prev]);
            fp8_rescale_o<D>(o, rescale);
            fp8_probs_to_fragments(sc, p_frag);
        }
        const int s = last % FA3C_FP8_STAGES(D);   // the last block's P·V
        fp8_pv_and_release<D>(o, p_frag, sm.vt[s], &sm.kv_empty[s]);
    }

    // O / sum · v_descale (and the last key block's, O's unit) in bf16, and
    // the LSE; rows past the end and columns past p.headdim are not written.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = st.sum[r];
        sum += __shfl_xor_sync(~0u, sum, 1);
        sum += __shfl_xor_sync(~0u, sum, 2);
        const int row = row0 + 8 * r;
        const float scale = sum > 0.f ? v_descale * v_block / sum : 0.f;
        if (row < p.seqlen_q) {
            uint16_t *out = (uint16_t *)p.out + batch * p.out_stride[0] + (int64_t)row * p.out_stride[1] +
                            head * p.out_stride[2] + 2 * t;
#pragma unroll
            for (int c = 0; c < D / 8; c++)   // a smaller head dim's columns only (a multiple of 32: whole chunks)
                if (8 * c < p.headdim)
                    *(uint32_t *)(out + 8 * c) = pack_bf16x2(o[4 * c + 2 * r] * scale, o[4 * c + 2 * r + 1] * scale);
            if (p.lse && t == 0) {
                // log2 of the row's sum of exp2(score) = max - 8 + log2(sum), in natural units.
                const float lse = sum > 0.f ? (st.max[r] - 8.f + lg2_approx(sum)) * 0.6931471805599453f : -INFINITY;
                p.lse[((int64_t)batch * p.heads_q + head) * p.seqlen_q + row] = lse;
            }
        }
    }
}

// ---- the kernel --------------------------------------------------------------------

// Grid: (query blocks of 128, heads_q, batch).
template <int D, bool BLOCK_SCALES>
__global__ void __launch_bounds__(FA3C_FP8_THREADS, 1) fwd_fp8_kernel(const __grid_constant__ fa3c_fp8_kernel_params p) {
    static_assert(FA3C_FP8_HEADDIM_OK(D), "fp8 head dims: 128 and 256");
    static_assert(128 * FA3C_FP8_PRODUCER_REGS + 256 * FA3C_FP8_CONSUMER_REGS <= 65536, "setmaxnreg budgets");
    extern __shared__ uint8_t smem_raw[];
    Fp8Smem<D> &sm = *(Fp8Smem<D> *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const int m0 = blockIdx.x * FP8_M, head = blockIdx.y, batch = blockIdx.z;
    if (threadIdx.x == 0) {
        tma_prefetch_map(&p.q_map);
        tma_prefetch_map(&p.k_map);
        tma_prefetch_map(&p.vt_map);
        mbar_init(&sm.q_full, 1);
        for (int s = 0; s < FA3C_FP8_STAGES(D); s++) {
            mbar_init(&sm.kv_full[s], 1);
            mbar_init(&sm.kv_empty[s], 8);   // one per consumer warp
        }
        fence_barrier_init();
    }
    __syncthreads();
    const int warpgroup = __shfl_sync(~0u, threadIdx.x / 128, 0);
    if (warpgroup == 0) {
        reg_dealloc<FA3C_FP8_PRODUCER_REGS>();
        if (threadIdx.x == 0) fp8_producer<D>(p, sm, m0, head, batch);
    } else {
        reg_alloc<FA3C_FP8_CONSUMER_REGS>();
        fp8_consumer<D, BLOCK_SCALES>(p, sm, m0, head, batch, warpgroup - 1);
    }
}

template <int D>
static size_t fwd_fp8_smem_bytes(void) {
    static_assert(sizeof(Fp8Smem<D>) + 1024 <= 227 * 1024, "the fp8 kernel's smem exceeds what a block may use");
    return sizeof(Fp8Smem<D>) + 1024;
}
