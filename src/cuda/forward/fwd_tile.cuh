// A tile of the forward kernel (what one CTA computes in one step) and the
// lengths of its sequence. In the fixed-length instances every sequence has
// the call's lengths, read from the parameters where they are used; in the
// variable-length instances (the kernel's VARLEN) the tile carries its
// sequence's own, looked up once per tile (sequence_of_batch): key counts
// (seqused_k), query counts (seqused_q), and for packed sequences
// (cu_seqlens) their token offsets, query counts and the key of their first
// key block.
#pragma once
#include "ptx.cuh"
#include "fwd_params.h"

struct FwdTile {
    int batch, head, head_kv;   // head: the first query head of the tile (of its group, when packed)
    int group;                  // head / p.pack
    int split;                  // key range of split-KV (0 without)
    int m0;                     // first row (query, or query x head when packed)
    int n_begin, n_end;         // key blocks to visit, visited from n_end - 1 down
    int u_begin, u_end;         // key blocks with nothing masked (mask skipped)
    // Variable-length instances only (unset in the others):
    int seqlen_q, rows, seqlen_k;   // the sequence's queries, rows (queries x pack) and keys
    int q_start, k_start;           // its first token in q / out (cu_seqlens_q; else 0) and its first key's
                                    // row in k / v (cu_seqlens_k's token, plus leftpad_k; else 0)
    int key0;                       // the key of row 0 of key block 0: 0, or <= 0 for packed keys,
                                    // whose blocks end at the sequence's last key (sequence_of_batch)
};

// The sequence's lengths as the masks read them: the call's, or with VARLEN
// the tile's own (the fixed-length code reads the parameters at the same
// points as before these existed: its machine code did not change).
template <bool VARLEN>
FA3C_HOST_DEVICE int tile_keys(const fa3c_fwd_kernel_params &p, const FwdTile &t) {
    return VARLEN ? t.seqlen_k : p.seqlen_k;
}
template <bool VARLEN>
FA3C_HOST_DEVICE int tile_queries(const fa3c_fwd_kernel_params &p, const FwdTile &t) {
    return VARLEN ? t.seqlen_q : p.seqlen_q;
}
template <bool VARLEN>
FA3C_HOST_DEVICE int tile_rows(const fa3c_fwd_kernel_params &p, const FwdTile &t) {
    return VARLEN ? t.rows : p.rows;
}
template <bool VARLEN>
FA3C_HOST_DEVICE int tile_key0(const FwdTile &t) {
    return VARLEN ? t.key0 : 0;
}

// Whether a sequence's row blocks end at its last query (packed queries, or
// queries used per sequence): then a tile's first rows may lie above row 0
// (tile_at), and no row past the sequence's end is loaded or stored.
FA3C_HOST_DEVICE bool rows_from_end(const fa3c_fwd_kernel_params &p) { return p.cu_seqlens_q || p.seqused_q; }

// Sequence b's lengths and offsets into t (variable-length instances). The
// arrays are device memory the host could not check: each length is kept
// within [0, the call's maximum] and each packed sequence within the
// batch x seqlen tokens the host knows of, so that bad values cannot send
// the kernel past those bounds (within them, valid arrays remain the
// caller's duty: the tensors may be shorter). With cu_seqlens_k the key
// blocks end at the last key (key0 = keys - ceil(keys / block_n) block_n):
// no K/V box then reaches past the sequence's end, so none reads past the
// packed tensors, whose length the host does not know; keys below 0 (the
// previous sequence's, or zeros before the tensor's start) are masked.
FA3C_HOST_DEVICE void sequence_of_batch(const fa3c_fwd_kernel_params &p, int b, int block_n, FwdTile &t) {
    int q0 = 0, nq = p.seqlen_q, k0 = 0, nk = p.seqlen_k;
    if (p.cu_seqlens_q) {
        q0 = p.cu_seqlens_q[b];
        nq = min(max(p.cu_seqlens_q[b + 1] - q0, 0), p.seqlen_q);
        q0 = min(max(q0, 0), p.batch * p.seqlen_q - nq);
    }
    if (p.cu_seqlens_k) {
        k0 = p.cu_seqlens_k[b];
        nk = min(max(p.cu_seqlens_k[b + 1] - k0, 0), p.seqlen_k);
        k0 = min(max(k0, 0), p.batch * p.seqlen_k - nk);
    }
    if (p.seqused_k) nk = min(max(p.seqused_k[b], 0), nk);
    if (p.leftpad_k) {   // the keys start past the padding: row k0 of the packed keys, or of the batch's cache
        const int pad = min(max(p.leftpad_k[b], 0), nk);
        nk -= pad;
        k0 += pad;
    }
    if (p.seqused_q) nq = min(max(p.seqused_q[b], 0), nq);
    t.seqlen_q = nq;
    t.rows = nq * p.pack;
    t.seqlen_k = nk;
    t.q_start = q0;
    t.k_start = k0;
    t.key0 = p.cu_seqlens_k ? nk - (nk + block_n - 1) / block_n * block_n : 0;
}
