// Causal / sliding-window / sequence-end masking for the forward kernel.
//
// Query row i (0-based) may see keys j with lo(i) <= j <= hi(i), where the
// diagonal is bottom-right aligned as in FA2/FA3 (src/problem.h, the CPU
// definition): diag = i + seqlen_k - seqlen_q, lo = diag - window_left,
// hi = min(diag + window_right, seqlen_k - 1); causal is window_right = 0.
// The lengths are the call's, or in the variable-length instances (VARLEN)
// the tile's sequence's own (fwd_tile.cuh); there key block n holds keys
// key0 + n BLOCK_N .. (key0 < 0 for packed keys), elsewhere n BLOCK_N ..
#pragma once
#include "ptx.cuh"
#include "fwd_params.h"
#include "fwd_tiles.h"
#include "fwd_tile.cuh"

// The query index of tile row `row` (GQA packing puts p.pack heads of one
// query on consecutive rows). Rows < 0 (p.m_shift) occur only without
// packing, where the division by 1 keeps them as they are (fast_div.h).
FA3C_HOST_DEVICE int query_of_row(const fa3c_fwd_kernel_params &p, int row) { return fa3c_div(row, p.div_pack); }

// Inclusive key range of row `row` of tile t.
template <bool VARLEN>
FA3C_HOST_DEVICE void key_range(const fa3c_fwd_kernel_params &p, const FwdTile &t, int row, int &lo, int &hi) {
    int diag = query_of_row(p, row) + tile_keys<VARLEN>(p, t) - tile_queries<VARLEN>(p, t);
    lo = p.window_left >= 0 ? max(diag - p.window_left, 0) : 0;
    hi = p.window_right >= 0 ? min(diag + p.window_right, tile_keys<VARLEN>(p, t) - 1) : tile_keys<VARLEN>(p, t) - 1;
}

// First and last real row of the CTA's rows [m0, m0 + block_m): rows past
// the end are computed (their Q rows read as zeros) but never written; rows
// above row 0 (p.m_shift) fill whole warpgroups, which idle. (In the
// variable-length instances a packed sequence's first tile may start at any
// row above 0: its rows there are computed but never written.)
template <bool VARLEN = false>
FA3C_HOST_DEVICE int first_row(int m0) { return FA3C_FWD_CAUSAL_SHIFT || VARLEN ? max(m0, 0) : m0; }
template <bool VARLEN = false>
FA3C_HOST_DEVICE int last_row(const fa3c_fwd_kernel_params &p, const FwdTile &t, int m0, int block_m) {
    return min(m0 + block_m, tile_rows<VARLEN>(p, t)) - 1;
}

// Key blocks [n_begin, n_end) that rows [m0, m0 + block_m) of tile t need at all.
template <bool VARLEN>
FA3C_HOST_DEVICE void key_block_range(const fa3c_fwd_kernel_params &p, const FwdTile &t, int m0, int block_m,
                                      int block_n, int &n_begin, int &n_end) {
    int lo_first, hi_first, lo_last, hi_last;
    key_range<VARLEN>(p, t, first_row<VARLEN>(m0), lo_first, hi_first);
    key_range<VARLEN>(p, t, last_row<VARLEN>(p, t, m0, block_m), lo_last, hi_last);
    if (VARLEN) {   // keys counted from key0 (the fixed-length code is kept as it was, byte for byte)
        n_begin = (lo_first - t.key0) / block_n;
        n_end = hi_last < 0 ? 0 : (hi_last - t.key0) / block_n + 1;
    } else {
        n_begin = lo_first / block_n;
        n_end = hi_last < 0 ? 0 : hi_last / block_n + 1;
    }
    if (n_end < n_begin) n_end = n_begin;
}

// Key blocks [u_begin, u_end) in which no element is masked for any row of
// the CTA: the steady state, where the mask is skipped. lo and hi grow with
// the row, so the tightest bounds are the last row's lo and the first row's
// hi. Computed once per tile, so the per-block test is two compares.
template <bool VARLEN>
FA3C_HOST_DEVICE void unmasked_block_range(const fa3c_fwd_kernel_params &p, const FwdTile &t, int m0, int block_m,
                                           int block_n, int &u_begin, int &u_end) {
    int lo_first, hi_first, lo_last, hi_last;
    key_range<VARLEN>(p, t, first_row<VARLEN>(m0), lo_first, hi_first);
    key_range<VARLEN>(p, t, last_row<VARLEN>(p, t, m0, block_m), lo_last, hi_last);
    if (VARLEN) {   // keys counted from key0
        u_begin = (lo_last - t.key0 + block_n - 1) / block_n;
        u_end = hi_first < 0 ? 0 : (hi_first + 1 - t.key0) / block_n;
    } else {
        u_begin = (lo_last + block_n - 1) / block_n;          // first block starting at or after lo_last
        u_end = hi_first < 0 ? 0 : (hi_first + 1) / block_n;  // blocks ending at or before hi_first
    }
    if (u_end < u_begin) u_end = u_begin;
}

// Set masked scores of one accumulator tile (m64 x BLOCK_N, this thread's
// registers) to -inf. Rows row0 and row0 + 8 belong to this thread; column of
// register i is 8*(i/4) + 2*quad + (i%2).
template <int BLOCK_N, bool VARLEN>
FA3C_DEVICE void apply_mask(float *s, const fa3c_fwd_kernel_params &p, const FwdTile &t, int row0, int n, int quad) {
    int lo[2], hi[2];
    key_range<VARLEN>(p, t, row0, lo[0], hi[0]);
    key_range<VARLEN>(p, t, row0 + 8, lo[1], hi[1]);
    int col_base = VARLEN ? tile_key0<VARLEN>(t) + n * BLOCK_N + 2 * quad : n * BLOCK_N + 2 * quad;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; i++) {
        int r = (i / 2) % 2;
        int col = col_base + 8 * (i / 4) + (i % 2);
        if (col < lo[r] || col > hi[r]) s[i] = -INFINITY;
    }
}
