// The forward kernel's epilogue: a consumer warpgroup's O, divided by the
// row sums, leaves through smem and TMA stores (or from registers), with
// the LSE; split-KV tiles write fp32 partials for the combine instead.
#pragma once
#include "backend.h"   // FA3C_CUDA_SINKS
#include "fwd_smem.cuh"
#include "softmax.cuh"
#include "trace.cuh"

// ---- epilogue ------------------------------------------------------------------

// 4x4 transpose of 32-bit values across the 4 threads of a quad: afterwards
// v[j] of thread q is what v[q] was on thread j. Selects instead of a
// run-time register index, which would send v to local memory.
FA3C_DEVICE void quad_transpose4(uint32_t v[4], int quad) {
    uint32_t out[4] = {v[0], v[1], v[2], v[3]};
#pragma unroll
    for (int j = 1; j < 4; j++) {
        int idx = quad ^ j;
        uint32_t send = idx == 0 ? v[0] : idx == 1 ? v[1] : idx == 2 ? v[2] : v[3];
        uint32_t got = __shfl_xor_sync(~0u, send, j);
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (idx == k) out[k] = got;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = out[k];
}

// Where the epilogue writes row `row` of a tile: the query and head it
// stands for (GQA packing), or nothing (past the end, or above row 0: only
// warpgroups that write nothing have such rows, p.m_shift).
struct OutRow {
    bool valid;
    int query, head;
};
template <bool VARLEN>
FA3C_DEVICE OutRow out_row(const fa3c_fwd_kernel_params &p, const FwdTile &t, int row) {
    OutRow r;
    r.valid = (unsigned)row < (unsigned)tile_rows<VARLEN>(p, t);   // 0 <= row < rows in one compare
    r.query = query_of_row(p, row);
    r.head = t.head + row - r.query * p.pack;
    return r;
}

// Split-KV: this split's O / its row sum in fp32, and its LSE, for
// fwd_combine.cu to merge. Register o[4c + 2r + e] is column 8c + 2*quad + e:
// a quad writes 32 contiguous bytes per 8 columns.
template <int D>
FA3C_DEVICE void store_partial(const fa3c_fwd_kernel_params &p, const FwdTile &t, const float *o,
                               const float inv[2], const float lse[2], const OutRow rows[2], int quad) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!rows[r].valid) continue;
        int64_t row_index = (((int64_t)t.split * p.batch + t.batch) * p.heads_q + rows[r].head) * p.seqlen_q + rows[r].query;
        float *dst = p.o_partial + row_index * D;
#pragma unroll
        for (int c = 0; c < D / 8; c++) {
            int i = 4 * c + 2 * r;
            *(float2 *)(dst + 8 * c + 2 * quad) = make_float2(o[i] * inv[r], o[i + 1] * inv[r]);
        }
        if (quad == 0) p.lse_partial[row_index] = lse[r];
    }
}

FA3C_DEVICE void write_lse(const fa3c_fwd_kernel_params &p, const FwdTile &t, const float lse[2],
                           const OutRow rows[2], int quad) {
    if (p.lse && quad == 0) {
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (rows[r].valid)
                p.lse[((int64_t)t.batch * p.heads_q + rows[r].head) * p.seqlen_q + rows[r].query] = lse[r];
    }
}

// The LSE of a tile whose rows end at its sequence's last query
// (rows_from_end): (heads_q, total_q) for packed sequences (cu_seqlens_q,
// fa3c.h), else (batch, heads_q, seqlen_q); one indexing for both (a branch
// between write_lse and this made ptxas spill at hdim 192).
FA3C_DEVICE void write_lse_from_end(const fa3c_fwd_kernel_params &p, const FwdTile &t, const float lse[2],
                                    const OutRow rows[2], int quad) {
    if (p.lse && quad == 0) {
        const int64_t head_stride = p.cu_seqlens_q ? min(max(p.cu_seqlens_q[p.batch], 0), p.batch * p.seqlen_q)
                                                   : p.seqlen_q;   // total_q as fwd_tile.cuh clamps it
        const int64_t base = p.cu_seqlens_q ? t.q_start : (int64_t)t.batch * p.heads_q * p.seqlen_q;
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (rows[r].valid) p.lse[base + rows[r].head * head_stride + rows[r].query] = lse[r];
    }
}

// Whether consumer warpgroup c may store its O rows of tile t as a TMA box:
// not where its rows start above the sequence's first (rows_from_end: the box
// would write the previous sequence's rows, or start above row 0): those go
// out from registers, row by row.
template <bool VARLEN>
FA3C_DEVICE bool o_box_allowed(const fa3c_fwd_kernel_params &p, const FwdTile &t, int c) {
    return !VARLEN || !rows_from_end(p) || t.m0 + 64 * c >= 0;
}

// O / sum in the input dtype: packed[j] holds o[2j] and o[2j + 1], which are
// row j % 2 of this thread's two rows, 8-column chunk j / 2 (o's layout,
// see epilogue()), each divided by its row's sum.
template <int D, int FP16>
FA3C_DEVICE void pack_output(const float *o, const float inv[2], uint32_t *packed) {
#pragma unroll
    for (int j = 0; j < D / 4; j++) packed[j] = pack2<FP16>(o[2 * j] * inv[j % 2], o[2 * j + 1] * inv[j % 2]);
}

// Packed O (pack_output) through smem and TMA: stmatrix puts the fragments
// into this warpgroup's staging buffer with the 128-byte swizzle, one thread
// stores the D / 64 boxes of 64 rows at query `query0` (rows past the end
// are clipped by the TMA unit; a box starting above row 0 traps, which is
// why p.m_shift moves whole warpgroups there, which idle). The buffer is
// reused by the next tile, once the store has read it.
template <int D>
FA3C_DEVICE void store_tile_tma(const fa3c_fwd_kernel_params &p, const uint32_t *packed, int query0, int group,
                                int batch, uint8_t *stage, int consumer_index, int ring) {
    int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    if (tid == 0) tma_store_wait_read();   // the previous tile's store is done with the buffer
    named_bar_sync(BAR_EPILOGUE_WG0 + consumer_index, 128);
    trace(consumer_index, ring, TR_EPI_STAGE);
    // Lane l addresses row l % 8 of matrix l / 8: matrices 0, 1 are rows 0-7
    // and 8-15 of 8-column chunk c, matrices 2, 3 the same rows of chunk c + 1.
    // (Opaque: computed here, per tile, rather than hoisted to the kernel's
    // start and held, or spilled, through every tile.)
    int m = lane / 8, row = (int)opaque_u32(warp * 16 + (m % 2) * 8 + lane % 8);
#pragma unroll
    for (int c = 0; c < D / 8; c += 2)
        stmatrix_x4(swizzled_unit<128>(stage, 64, row, c + m / 2), packed[2 * c], packed[2 * c + 1],
                    packed[2 * c + 2], packed[2 * c + 3]);
    fence_proxy_async_smem();   // the stores above, before the TMA unit reads them
    named_bar_sync(BAR_EPILOGUE_WG0 + consumer_index, 128);
    trace(consumer_index, ring, TR_EPI_STAGED);
    if (tid == 0) {
#pragma unroll
        for (int b = 0; b < D / 64; b++)   // boxes wholly past out's columns (headdim_v < D) are not issued
            if (b * 64 < p.out_cols) tma_store_5d(&p.o_map, stage + b * (64 * 128), b * 64, 0, query0, group, batch);
        tma_store_commit();
    }
}

// O / sum of this thread's two rows from registers to out[r] (rows[r] valid),
// its first p.out_cols columns (p.out_vec16 only where that is all D: one
// column test in both paths made ptxas spill at hdim 192):
// with p.out_vec16, each group of four 8-column chunks is transposed across
// the quad so that every thread stores 16 contiguous bytes (full 32-byte
// sectors per row instead of half-used ones); otherwise 4-byte stores.
template <int D, int FP16>
FA3C_DEVICE void store_o_rows(const fa3c_fwd_kernel_params &p, const float *o, const float inv[2],
                              const OutRow rows[2], uint16_t *const out[2], int quad) {
    if (p.out_vec16) {
#pragma unroll
        for (int r = 0; r < 2; r++)   // row by row: one row's predicate live at a time
#pragma unroll
            for (int g = 0; g < D / 32; g++) {
                uint32_t v[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    int i = 4 * (4 * g + j) + 2 * r;
                    v[j] = pack2<FP16>(o[i] * inv[r], o[i + 1] * inv[r]);
                }
                quad_transpose4(v, quad);
                if (rows[r].valid) *(uint4 *)(out[r] + 8 * (4 * g + quad)) = make_uint4(v[0], v[1], v[2], v[3]);
            }
    } else {
#pragma unroll
        for (int i = 0; i < D / 2; i += 2) {
            int r = (i / 2) % 2, col = 8 * (i / 4) + 2 * quad;
            if (rows[r].valid && col < p.out_cols)
                *(uint32_t *)(out[r] + col) = pack2<FP16>(o[i] * inv[r], o[i + 1] * inv[r]);
        }
    }
}

// The epilogue of a tile whose rows end at its sequence's last query
// (variable-length instances, rows_from_end): packed sequences (cu_seqlens_q),
// rows from the sequence's first token in one batch of tokens, or queries
// used per sequence (seqused_q) in (batch, seqlen_q); a TMA box where the
// warpgroup's rows all lie in the sequence, else row by row from registers
// (o_box_allowed).
template <int D, int FP16>
FA3C_DEVICE void epilogue_from_end(const fa3c_fwd_kernel_params &p, const FwdTile &t, const float *o,
                                   const float inv[2], const float lse[2], const OutRow rows[2], int quad,
                                   uint8_t *stage, int consumer_index, int ring) {
    if (stage && p.out_tma && o_box_allowed<true>(p, t, consumer_index)) {
        uint32_t packed[D / 4];
        pack_output<D, FP16>(o, inv, packed);
        // hdim 64: t.m0 opaque, else ptxas reuses consumer_varlen_tile's first
        // row of the warpgroup, held through the whole tile, and spilled it.
        const int m0 = D == 64 ? (int)opaque_u32(t.m0) : t.m0;
        const int query0 = t.q_start + (m0 + consumer_index * 64) / p.pack;
        store_tile_tma<D>(p, packed, query0, t.group, p.cu_seqlens_q ? 0 : t.batch, stage, consumer_index, ring);
    } else {
        const int64_t batch_offset = p.cu_seqlens_q ? 0 : t.batch * p.out_stride[0];
        uint16_t *out[2];
#pragma unroll
        for (int r = 0; r < 2; r++)
            out[r] = (uint16_t *)p.out + batch_offset + (int64_t)(t.q_start + rows[r].query) * p.out_stride[1] +
                     rows[r].head * p.out_stride[2];
        store_o_rows<D, FP16>(p, o, inv, rows, out, quad);
    }
    write_lse_from_end(p, t, lse, rows, quad);
}

// A row's 1 / sum (0 for a row that saw no key: output 0) and its LSE (natural
// log), from its sum of exp2(x - off) over the keys, and with attention sinks
// the sink's logit in log2 units (sink2, -inf: none), which joins the sum
// only: with mx = max(off, sink2), sum' = sum 2^(off - mx) + 2^(sink2 - mx),
// so that neither term overflows, and inv = 2^(off - mx) / sum'. A row that
// saw no key gets lse = the sink (-inf without one).
FA3C_DEVICE void row_normalizer(float sum, float off, float sink2, float &inv, float &lse) {
    if (!(sum > 0.f)) {
        inv = 0.f;
        lse = sink2 * 0.69314718f;   // ln 2
        return;
    }
    const float mx = fmaxf(off, sink2), a = ex2f(off - mx), total = sum * a + ex2f(sink2 - mx);
    inv = a * rcp_approx(total);
    lse = (mx + lg2_approx(total)) * 0.69314718f;
}

// O / sum -> out (input dtype), and the LSE; or, with split-KV, the partial
// results (store_partial). Rows past the end are dropped. `stage`: where
// this warpgroup stages O for store_tile_tma (NULL: nowhere). `ring`: for
// the phase trace only (trace.cuh).
// Register o[4c + 2r + e] is row row0 + 8r, column 8c + 2*quad + e. With
// p.out_vec16, each group of four 8-column chunks is transposed across the
// quad so that every thread stores 16 contiguous bytes (full 32-byte sectors
// per row instead of half-used ones); otherwise 4-byte stores.
template <int D, int FP16, bool VARLEN>
FA3C_DEVICE void epilogue(const fa3c_fwd_kernel_params &p, const FwdTile &t, float *o, SoftmaxState &st, int row0,
                          int quad, uint8_t *stage, int consumer_index, int ring) {
    trace(consumer_index, ring, TR_EPI_BEGIN);
    float sum[2], inv[2], lse[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        sum[r] = quad_sum(st.sum[r]);
        inv[r] = sum[r] > 0.f ? rcp_approx(sum[r]) : 0.f;   // fully masked row: output 0
        lse[r] = sum[r] > 0.f ? (st.off[r] + lg2_approx(sum[r])) * 0.69314718f : -INFINITY;   // ln 2
    }
    const OutRow rows[2] = {out_row<VARLEN>(p, t, row0), out_row<VARLEN>(p, t, row0 + 8)};
    if (FA3C_CUDA_SINKS && p.sinks && p.num_splits == 1) {   // split-KV: the combine adds the sink, once
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float sink2 = rows[r].valid ? p.sinks[rows[r].head] * 1.44269504f : -INFINITY;   // log2(e)
            row_normalizer(sum[r], st.off[r], sink2, inv[r], lse[r]);
        }
    }
    if (p.num_splits > 1) {
        store_partial<D>(p, t, o, inv, lse, rows, quad);
        return;
    }
    if constexpr (VARLEN) {
        if (rows_from_end(p)) {
            epilogue_from_end<D, FP16>(p, t, o, inv, lse, rows, quad, stage, consumer_index, ring);
            return;
        }
    }
    if (stage && p.out_tma) {
        const int query0 = fa3c_div(t.m0 + consumer_index * 64, p.div_pack);
        uint32_t packed[D / 4];
        pack_output<D, FP16>(o, inv, packed);
        store_tile_tma<D>(p, packed, query0, t.group, t.batch, stage, consumer_index, ring);
        write_lse(p, t, lse, rows, quad);
        return;
    }
    uint16_t *out[2];
#pragma unroll
    for (int r = 0; r < 2; r++)
        out[r] = (uint16_t *)p.out + t.batch * p.out_stride[0] + rows[r].query * p.out_stride[1] +
                 rows[r].head * p.out_stride[2];
    store_o_rows<D, FP16>(p, o, inv, rows, out, quad);
    write_lse(p, t, lse, rows, quad);
}
