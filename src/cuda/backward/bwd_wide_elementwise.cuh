// The wide backward's element-wise steps (bwd_wide_sm90.cuh): which keys a
// thread's rows see, P and dS, their smem stores, dQ to the accumulator or
// the writer's buffer, dK and dV out.
#pragma once
#include "softmax.cuh"   // probs_to_fragments
#include "bwd_wide_smem.cuh"
#include "bwd_dq.cuh"

// The keys (columns c of the warpgroup's NK, key kc0 + c) that query row
// `query` sees: c >= lo and c <= hi, clamped to [-1, cols] and less
// 2 quad, as seen_columns (bwd_sm90.cuh) does for key rows. Keys before
// own_lo (a shifted tile's rows of the block before) and from sk on are
// not seen.
FA3C_HOST_DEVICE void seen_keys(int query, int own_lo, int sk, int rel_lo, int rel_hi, int kc0, int cols, int quad,
                                int &lo, int &hi) {
    const long long first = max((long long)own_lo, (long long)query + rel_lo) - kc0;
    const long long last = min((long long)sk - 1, (long long)query + rel_hi) - kc0;
    lo = (int)max(min(first, (long long)cols), -1ll) - 2 * quad;
    hi = (int)max(min(last, (long long)cols), -1ll) - 2 * quad;
}

// P and dS of this thread's elements, in place: query rows r0 and r0 + 8
// (lse, dsum: theirs), key columns 8 j + 2 quad (+1) of the warpgroup's NK.
// A pair the mask hides gets a score of -inf (P = 0); its dP is finite (K
// and V rows outside the keys used are zeros in smem), so its dS is 0.
// Padding query rows and a shifted tile's shared rows have lse_log2 = +inf.
template <bool SOFTCAP, int NK>
FA3C_DEVICE void wide_probs_and_grads(float *s, float *dp, const float lse[2], const float dsum[2],
                                      const fa3c_bwd_kernel_params &p, const int lo[2], const int hi[2]) {
#pragma unroll
    for (int j = 0; j < NK / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                float score = s[i], slope = 1.f;
                if (SOFTCAP) {
                    const float t = tanh_approx(score * p.softcap_pre);
                    score = p.softcap * t;
                    slope = 1.f - t * t;
                }
                float x = score * p.score_log2 - lse[r];
                if (!(8 * j + e >= lo[r] && 8 * j + e <= hi[r])) x = -INFINITY;
                const float prob = ex2f(x);
                s[i] = prob;
                dp[i] = SOFTCAP ? prob * (dp[i] - dsum[r]) * slope : prob * (dp[i] - dsum[r]);
            }
}

// The same in two steps, without softcap: P as soon as S is done (while dP's
// GEMM runs: FA3's order, as the narrow kernel's), then dS once dP is.
template <int NK>
FA3C_DEVICE void wide_probs(float *s, const float lse[2], const fa3c_bwd_kernel_params &p, const int lo[2],
                            const int hi[2]) {
#pragma unroll
    for (int j = 0; j < NK / 8; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int i = 4 * j + 2 * r + e;
                float x = s[i] * p.score_log2 - lse[r];
                if (!(8 * j + e >= lo[r] && 8 * j + e <= hi[r])) x = -INFINITY;
                s[i] = ex2f(x);
            }
}
template <int NK>
FA3C_DEVICE void wide_grads(const float *prob, float *dp, const float dsum[2]) {
#pragma unroll
    for (int i = 0; i < NK / 2; i++) dp[i] = prob[i] * (dp[i] - dsum[(i / 2) % 2]);
}

// This warp's 16 query rows of P or dS (A fragments of 32 keys) into the
// buffer at the warpgroup's key columns, 8x8 matrices at a time
// (store_ds's pattern, rows and columns swapped).
template <int KEY0>
FA3C_DEVICE void store_rows_by_keys(uint8_t *buf, uint32_t (*frag)[4], int warp) {
    enum { M = 64 };
    const int lane = threadIdx.x % 32;
    const int row = (int)opaque_u32(warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8);
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
        stmatrix_x4(swizzled_unit<128>(buf, M, row, KEY0 / 8 + 2 * kk + lane / 16), frag[kk][0], frag[kk][1],
                    frag[kk][2], frag[kk][3]);
}

// TRANSPOSED: this warp's 16 query rows of P or dS (the accumulator of the
// warpgroup's NK keys) into the buffer of N key rows x 64 queries, rows
// [KEY0, KEY0 + NK): 8x8 matrices (key group j, query half r) stored
// transposed, two key groups per stmatrix (one for an odd last group).
template <int N, int KEY0, int NK, int FP16>
FA3C_DEVICE void store_keys_by_rows(uint8_t *buf, const float *x, int warp) {
    const int lane = threadIdx.x % 32, i = lane / 8;   // the matrix this lane addresses
    uint32_t r[NK / 8][2];
#pragma unroll
    for (int j = 0; j < NK / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            r[j][h] = pack2<FP16>(x[4 * j + 2 * h], x[4 * j + 2 * h + 1]);
#pragma unroll
    for (int j = 0; j < NK / 8; j += 2) {
        const int key = (int)opaque_u32(KEY0 + 8 * (j + i / 2) + lane % 8);
        uint8_t *row = swizzled_unit<128>(buf, N, key, 2 * warp + i % 2);
        if (j + 1 < NK / 8) stmatrix_x4_trans(row, r[j][0], r[j][1], r[j + 1][0], r[j + 1][1]);
        else stmatrix_x2_trans(row, r[j][0], r[j][1]);
    }
}

// Where this thread's float4 j of its dq (the warpgroup's DQ_N columns of
// the 64 query rows, in the wgmma accumulator's order) goes in a block's
// tile (tile order, fa3c_bwd_dq_tile_offset), from the tile's start: a
// warp's float4 j cover 512 contiguous bytes.
template <int D, int WG>
FA3C_DEVICE int wide_dq_offset(int j) {
    const int c = WideShare<D, WG>::DQ_COL0 + 8 * j;
    return (c / 64) * 4096 + ((c % 64) / 8) * 512 + (threadIdx.x % 128) * 4;
}

// dq added to query block m's tile: one vector reduction of 4 floats per 8 columns.
template <int D, int WG>
FA3C_DEVICE void add_wide_dq(float *tile, const float *dq) {
#pragma unroll
    for (int j = 0; j < WideShare<D, WG>::DQ_N / 8; j++)
        red_add_f32x4(tile + wide_dq_offset<D, WG>(j), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
}

// TRANSPOSED: half H of it (gemm_wide_dq_half's 64 columns).
template <int D, int WG, int H>
FA3C_DEVICE void add_wide_dq_half(float *tile, const float *dq) {
#pragma unroll
    for (int j = 0; j < 8; j++)
        red_add_f32x4(tile + wide_dq_offset<D, WG>(8 * H + j), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
}

// With the writer: the same into sm.dq (the writer's buffer; the
// caller waited for it to be free), then this warp's arrival on dq_full.
template <int D, int WG>
FA3C_DEVICE void put_wide_dq(float *buf, uint64_t *dq_full, const float *dq) {
#pragma unroll
    for (int j = 0; j < WideShare<D, WG>::DQ_N / 8; j++)
        st_shared_f32x4(buf + wide_dq_offset<D, WG>(j), dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
    fence_proxy_async_smem();   // the bulk reduction reads it through the async proxy
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(dq_full);
}

// accᵀ (head-dim columns x keys) * scale to `out` (16-bit; element strides,
// all even): keys in [own_lo, sk_stored) of the tile's N (from k_start),
// at token tok0 + key (packed sequences: `batch` is 0 then), its first `cols`
// columns (the tensors' head dim: 160 of hdim 192's kernel).
template <int D, int FP16, int TILES, int COL0>
FA3C_DEVICE void store_key_columns(void *out, const int64_t *stride, float (*acc)[FA3C_BWD_BLOCK_N(D) / 2],
                                   float scale, int batch, int head_kv, int tok0, int k_start, int own_lo,
                                   int sk_stored, int cols) {
    enum { N = FA3C_BWD_BLOCK_N(D) };
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32, quad = lane % 4;
    uint16_t *base = (uint16_t *)out + batch * stride[0] + head_kv * stride[2];
#pragma unroll
    for (int j = 0; j < N / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int key = k_start + 8 * j + 2 * quad + e;
            if (key < own_lo || key >= sk_stored) continue;
            uint16_t *row = base + (int64_t)(tok0 + key) * stride[1];
#pragma unroll
            for (int t = 0; t < TILES; t++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float x = acc[t][4 * j + 2 * r + e] * scale;
                    const int col = COL0 + 64 * t + warp * 16 + lane / 4 + 8 * r;
                    if (col < cols) row[col] = FP16 ? (uint16_t)pack_f16x2(x, 0.f) : (uint16_t)pack_bf16x2(x, 0.f);
                }
        }
}

// FA3C_BWD_STAGED_EPILOGUE: accᵀ (this warpgroup's head-dim columns x the
// N keys) * scale as 16-bit values into `tile` (the K or V tile's layout:
// column chunks of N key rows x 128 B), the chunks of its columns, 8x8
// matrices stored transposed (store_keys_by_rows); then out to dk or dv with
// write_staged_rows (bwd_common.cuh).
template <int D, int FP16, int TILES, int COL0>
FA3C_DEVICE void stage_key_columns(uint8_t *tile, float (*acc)[FA3C_BWD_BLOCK_N(D) / 2], float scale, int warp) {
    enum { N = FA3C_BWD_BLOCK_N(D) };
#pragma unroll
    for (int t = 0; t < TILES; t++) {
#pragma unroll
        for (int i = 0; i < N / 2; i++) acc[t][i] *= scale;
        store_keys_by_rows<N, 0, N, FP16>(tile + (COL0 / 64 + t) * N * BWD_ROW_BYTES, acc[t], warp);
    }
}
