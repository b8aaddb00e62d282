// The index math of the backward and fp8 kernels (their host-device
// functions), against brute force on the CPU: these run everywhere, CI
// included, while the kernels themselves wait for a GPU.
//   - The backward's walk: over every key block's query blocks
//     (bwd_query_blocks) and tile elements (fa3c_bwd_rows_start, seen_columns,
//     the preprocessing's rule for shared and padding rows), each (query,
//     key) pair the mask lets through is seen exactly once, and no other,
//     in the staggered walk order (bwd_walk_block) too;
//     with packed sequences, short ones, seqused_k, causal and windows.
//   - The deterministic dQ's turns: the key blocks that see a query block are
//     a contiguous range starting at first_key_block.
//   - The wide kernel's shares (WideShare): the two warpgroups' dK, dV and dQ
//     columns cover each head dim once, MLA's v of 128 at hdim 192 included,
//     with equal GEMM work there.
//   - The fp8 forward: P's fragment bytes (fp8_fragment_source) carry the keys
//     Vᵀ's slots hold (fa3c_fp8_key_of_slot); its mask bounds
//     (fp8_row_columns), key-block range (fp8_key_blocks) and blocks without
//     a mask (fp8_unmasked_blocks) match the mask; its exp on the FMA pipe
//     (ex2_poly) is 2^x within 1e-4, tiny and non-negative below, NaN as NaN.
#include <math.h>
#include "gpu_util.cuh"
#include "problem.h"
#include "../../src/cuda/backward/bwd_sm90.cuh"
#include "../../src/cuda/backward/bwd_wide_sm90.cuh"
#include "../../src/cuda/fp8/fwd_fp8_sm90.cuh"

// The API's mask (src/problem.h) for one pair.
static int visible(const fa3c_problem *pr, int q, int key, int sq, int sk) {
    int lo, hi;
    fa3c_key_range(pr, q, sq, sk, &lo, &hi);
    return key >= lo && key <= hi;
}

static fa3c_problem mask_problem(int causal, int wl, int wr) {
    fa3c_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.causal = causal;
    pr.window_left = wl;
    pr.window_right = wr;
    return pr;
}

// The (query, key) pairs one tile element of the backward's walk stands for:
// query q0 + c with c = 8 j + 2 quad + e in the narrow kernel (key rows,
// bwd_sm90.cuh), key kc0 + c in the wide one (query rows, bwd_wide_sm90.cuh).
// Counts it if it is seen (the element compares its constant 8 j + e with
// lo and hi) and its row has a finite LSE (the preprocessing's rule: the
// block's own queries, bwd_prep.cu); returns 1 if such a pair is outside the
// tensors.
static int count_pair(int *count, int sk_stored, int q, int key, int own_q_lo, int sq, int seen) {
    if (!seen || q < own_q_lo || q >= sq) return 0;
    if (key < 0 || key >= sk_stored) return 1;
    count[(size_t)q * sk_stored + key]++;
    return 0;
}

// One sequence of the backward: sq queries of which sq_used used (seqused_q), sk_stored keys of which sk used,
// query blocks of block_m rows (FA3C_BWD_BLOCK_M: 64, 80 or 128) and key blocks
// of block_n (128, or 64 and 80 for the wide kernel, wide = 1). Walks what the CTAs
// of its key blocks would (staggered, as with the first-write flags:
// bwd_walk_start), and counts each (query, key) pair they see; returns the
// number of errors.
static int check_bwd_sequence(int sq, int sq_used, int sk_stored, int sk, int causal, int wl, int wr, int packed,
                              int block_m, int block_n, int wide) {
    const fa3c_problem pr = mask_problem(causal, wl, wr);
    fa3c_bwd_kernel_params p;
    memset(&p, 0, sizeof p);
    int cu_q[2] = {0, sq}, cu_k[2] = {0, sk_stored}, used[1] = {sk}, used_q[1] = {sq_used};
    p.batch = 1;
    p.seqlen_q = sq;
    p.seqlen_k = sk_stored;
    p.cu_seqlens_q = packed ? cu_q : NULL;
    p.cu_seqlens_k = packed ? cu_k : NULL;
    p.seqused_k = sk < sk_stored ? used : NULL;
    p.seqused_q = sq_used < sq ? used_q : NULL;
    p.window_left = wl;
    p.window_right = causal ? 0 : wr;
    int *count = (int *)calloc((size_t)sq * sk_stored + 1, sizeof(int));
    int errors = 0, flag = 0;
    const int n_blocks = (sk_stored + block_n - 1) / block_n;
    for (int n = 0; n < n_blocks; n++) {
        BwdSeq seq = bwd_sequence(p, n, 0, block_m, block_n);
        p.dq_written = &flag;   // the staggered walk
        seq.m_first = bwd_walk_start(p, seq, n, n_blocks);
        p.dq_written = NULL;
        // The consumers' walk over a group of 3 heads (step by step, as
        // bwd_sm90.cuh's loop) is the producer's and the writer's
        // (bwd_walk_block, head = step / blocks).
        const int blocks = seq.m_end - seq.m_begin;
        for (int it = 0, m = seq.m_first, head = 0; it < 3 * blocks; it++) {
            if (m != bwd_walk_block(it, seq.m_begin, seq.m_end, seq.m_first) || head != it / blocks) errors++;
            if (++m == seq.m_end) m = seq.m_begin;
            if (m == seq.m_first) head++;
        }
        for (int i = 0; i < blocks; i++) {
            const int m = bwd_walk_block(i, seq.m_begin, seq.m_end, seq.m_first);
            const int q0 = fa3c_bwd_rows_start(m, block_m, seq.sq, seq.q_shifted);
            if ((packed || sq_used < sq) && q0 + block_m > seq.sq) errors++;   // a box never reads past the queries used
            for (int quad = 0; quad < 4; quad++) {
                if (!wide) {
                    // A tile seen whole takes the step without compares: every element counts.
                    const int whole =
                        tile_seen_whole(seq.k_start, block_n, n * block_n, seq.sk, seq.rel_lo, seq.rel_hi, q0, block_m);
                    for (int row = 0; row < block_n; row++) {   // every key row, in the consumers' terms
                        int lo, hi;
                        const int key = seq.k_start + row;
                        seen_columns(key, n * block_n, seq.sk, seq.rel_lo, seq.rel_hi, q0, block_m, quad, lo, hi);
                        for (int j = 0; j < block_m / 8; j++)
                            for (int e = 0; e < 2; e++)
                                errors += count_pair(count, sk_stored, q0 + 8 * j + 2 * quad + e, key, m * block_m,
                                                     seq.sq, whole || (8 * j + e >= lo && 8 * j + e <= hi));
                    }
                    continue;
                }
                for (int wg = 0; wg < 2; wg++)   // the warpgroups' block_n / 2 keys each
                    for (int row = 0; row < block_m; row++) {   // every query row
                        int lo, hi;
                        const int nk = block_n / 2, q = q0 + row, kc0 = seq.k_start + nk * wg;
                        seen_keys(q, n * block_n, seq.sk, seq.rel_lo, seq.rel_hi, kc0, nk, quad, lo, hi);
                        for (int j = 0; j < nk / 8; j++)
                            for (int e = 0; e < 2; e++)
                                errors += count_pair(count, sk_stored, q, kc0 + 8 * j + 2 * quad + e, m * block_m,
                                                     seq.sq, 8 * j + e >= lo && 8 * j + e <= hi);
                    }
            }
        }
    }
    for (int q = 0; q < sq; q++)
        for (int key = 0; key < sk_stored; key++) {
            const int want = q < sq_used && key < sk && visible(&pr, q, key, sq_used, sk);
            if (count[(size_t)q * sk_stored + key] != want) {
                if (errors < 5)
                    printf("  sq %d/%d sk %d/%d causal %d window (%d,%d) packed %d block_m %d block_n %d: query %d key %d "
                           "seen %d times, want %d\n", sq_used, sq, sk, sk_stored, causal, wl, wr, packed, block_m, block_n, q, key,
                           count[(size_t)q * sk_stored + key], want);
                errors++;
            }
        }
    // The deterministic turns: the key blocks that see query block m are
    // [first_key_block, ...), contiguous.
    for (int m = 0; m * block_m < sq; m++) {
        int first = -1, last = -1, gaps = 0;
        for (int n = 0; n * block_n < sk_stored; n++) {
            const BwdSeq seq = bwd_sequence(p, n, 0, block_m, block_n);
            if (m < seq.m_begin || m >= seq.m_end) continue;
            if (first < 0) first = n;
            else if (n != last + 1) gaps++;
            last = n;
        }
        if (first < 0) continue;
        const BwdSeq seq = bwd_sequence(p, first, 0, block_m, block_n);
        if (gaps || first_key_block(seq.rel_lo, m, block_m, block_n) != first) {
            if (errors < 5)
                printf("  sq %d sk %d/%d causal %d window (%d,%d) block_m %d: query block %d: key blocks from %d "
                       "(first_key_block %d), %d gaps\n", sq, sk, sk_stored, causal, wl, wr, block_m, m, first, first_key_block(seq.rel_lo, m, block_m, block_n), gaps);
            errors++;
        }
    }
    free(count);
    return errors;
}

TEST(bwd_walk_sees_each_pair_once) {
    const int lens[] = {1, 17, 63, 64, 65, 127, 128, 129, 200, 300};
    const int windows[][3] = {{0, -1, -1}, {1, -1, -1}, {0, 40, 8}, {0, 0, 0}, {1, 100, -1}, {0, -1, 30}, {0, 200, 200},
                               {0, 126, 126}};   // the last: tiles seen whole up to one pair (tile_seen_whole)
    int errors = 0, cases = 0;
    for (int a = 0; a < 10; a++)
        for (int b = 0; b < 10; b++)
            for (int w = 0; w < 8; w++)
                for (int packed = 0; packed < 2; packed++)
                    for (int used = 0; used < 4; used++)   // seqused_k (odd), seqused_q (2, 3)
                        for (int kind = 0; kind < 5; kind++) {   // hdim 128's 64 and 80 rows, hdim 64's, the wide kernel's 64 and 80 keys
                            const int sq = lens[a], stored = lens[b], sk = used % 2 ? (stored * 2 + 2) / 3 : stored;
                            const int sq_used = used >= 2 ? (sq + 1) / 3 : sq;
                            const int block_m = kind == 1 ? 128 : kind == 4 ? 80 : 64;
                            const int block_n = kind == 2 ? 64 : kind == 3 ? 80 : 128;
                            errors += check_bwd_sequence(sq, sq_used, stored, sk, windows[w][0], windows[w][1],
                                                         windows[w][2], packed, block_m, block_n, kind == 2 || kind == 3);
                            cases++;
                        }
    printf("  %d shapes (lengths x masks x packed x seqused_k / _q x kernel tile)\n", cases);
    CHECK(errors == 0, "%d errors in the backward's walk", errors);
}

// dQ's tile order (fa3c_bwd_dq_tile_offset): each tile
// element has one slot, and a warpgroup's accumulator element i of thread t
// (wgmma m64nN layout: row 16 (t / 32) + (t % 32) / 4 + 8 ((i / 2) % 2),
// column 8 (i / 4) + 2 (t % 4) + i % 2) of piece p (of P floats) lands where
// the kernel adds it: p P + ((i / 4) 128 + t) 4 + i % 4. Pieces of 64 query
// rows x 64 columns (N = 64), or at hdim 128 dQᵀ's: 64 columns x all the
// block's rows (N = rows: its accumulator's rows are columns).
TEST(bwd_dq_tile_order) {
    const int shapes[4][2] = {{64, 128}, {80, 128}, {128, 64}, {64, 64}};   // (rows, d): hdim 128 (transposed); hdim 64
    int errors = 0;
    for (int s = 0; s < 4; s++) {
        const int rows = shapes[s][0], d = shapes[s][1], transposed = FA3C_BWD_DQ_TRANSPOSED(d);
        const int piece_size = transposed ? 64 * rows : 4096, n = transposed ? rows : 64;
        CHECK(transposed == (d == 128), "hdim %d: dQ transposed %d", d, transposed);
        int *seen = (int *)calloc((size_t)rows * d, sizeof(int));
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < d; c++) {
                const int o = fa3c_bwd_dq_tile_offset(r, c, d, rows);
                if (o < 0 || o >= rows * d) errors++;
                else seen[o]++;
            }
        for (int o = 0; o < rows * d; o++) errors += seen[o] != 1;
        for (int piece = 0; piece < rows * d / piece_size; piece++) {
            const int r0 = transposed ? 0 : (piece / (d / 64)) * 64, c0 = transposed ? piece * 64 : (piece % (d / 64)) * 64;
            for (int t = 0; t < 128; t++)
                for (int i = 0; i < n / 2; i++) {
                    const int lane = t % 32, arow = 16 * (t / 32) + lane / 4 + 8 * ((i / 2) % 2);
                    const int acol = 8 * (i / 4) + 2 * (lane % 4) + i % 2;
                    const int r = transposed ? acol : arow, c = transposed ? arow : acol;
                    errors += fa3c_bwd_dq_tile_offset(r0 + r, c0 + c, d, rows) !=
                              piece * piece_size + ((i / 4) * 128 + t) * 4 + i % 4;
                }
        }
        free(seen);
    }
    // The wide kernel's dQ (add_wide_dq): warpgroup WG's DQ_N columns from DQ_COL0 of the 64 rows, its
    // register 4 j + i % 4 of thread t at column DQ_COL0 + 8 j + 2 (t % 4) + i % 2, added at
    // (c / 64) 4096 + ((c % 64) / 8) 512 + 4 t + i % 4 for the n-tile's first column c.
    for (int d = 192; d <= 256; d += 64)
        for (int wg = 0; wg < 2; wg++) {
            const int col0 = wg == 0 ? 0 : d - 128, ncols = wg == 0 ? d - 128 : 128;
            for (int t = 0; t < 128; t++)
                for (int i = 0; i < ncols / 2; i++) {
                    const int lane = t % 32, row = 16 * (t / 32) + lane / 4 + 8 * ((i / 2) % 2);
                    const int col = col0 + 8 * (i / 4) + 2 * (lane % 4) + i % 2, c = col0 + 8 * (i / 4);
                    errors += fa3c_bwd_dq_tile_offset(row, col, d, 64) != (c / 64) * 4096 + ((c % 64) / 8) * 512 + 4 * t + i % 4;
                }
        }
    CHECK(errors == 0, "%d errors in dQ's tile order", errors);
}

// The backward's 1-D grid (fa3c_bwd_tile_of_cta): every (key block, K/V head,
// batch) is one CTA's, a pair's key blocks come in increasing CTA order (the
// deterministic turns rely on it), and within a section every pair's key
// block n comes before any pair's key block n + 1 (the longest CTAs first).
TEST(bwd_grid_order) {
    int errors = 0, cases = 0;
    for (int n_blocks = 1; n_blocks <= 9; n_blocks += 2)
        for (int heads = 1; heads <= 5; heads++)
            for (int batch = 1; batch <= 4; batch++)
                for (int section = 1; section <= 8; section *= 2) {
                    const int pairs = heads * batch, total = n_blocks * pairs;
                    int *owner = (int *)calloc((size_t)total, sizeof(int)), *last = (int *)malloc(pairs * sizeof(int));
                    for (int i = 0; i < pairs; i++) last[i] = -1;
                    int prev_n = 0, prev_section = 0;
                    for (int cta = 0; cta < total; cta++) {
                        int n, h, b;
                        fa3c_bwd_tile_of_cta(cta, n_blocks, heads, batch, section, &n, &h, &b);
                        if (n < 0 || n >= n_blocks || h < 0 || h >= heads || b < 0 || b >= batch) {
                            errors++;
                            continue;
                        }
                        const int pair = b * heads + h, sec = pair / section;
                        owner[pair * n_blocks + n]++;
                        errors += n != last[pair] + 1;   // key blocks 0, 1, 2, ... of each pair in order
                        last[pair] = n;
                        errors += sec < prev_section || (sec == prev_section && n < prev_n);
                        prev_section = sec, prev_n = n;
                    }
                    for (int i = 0; i < total; i++) errors += owner[i] != 1;
                    free(owner), free(last);
                    cases++;
                }
    CHECK(errors == 0, "%d errors in the backward's grid order over %d shapes", errors, cases);
}

// Packed sequences' tiles never leave the tensors: a box of `rows` rows at
// the sequence's token tok0 + fa3c_bwd_rows_start(...) ends by the
// sequence's end (it may start in the sequence before).
TEST(bwd_packed_tiles_stay_inside) {
    int errors = 0;
    for (int len = 1; len < 400; len++)
        for (int rows = 64; rows <= 128; rows += 16)   // 64 and 128 rows, 64 / 80 / 128 keys
            for (int block = 0; block * rows < len; block++) {
                const int start = fa3c_bwd_rows_start(block, rows, len, 1);
                // ends by the sequence's end, covers the block's first row, and starts
                // before token 0 of the sequence only when the sequence is shorter than a box
                if (start + rows > len || start > block * rows || (len >= rows && start < 0)) errors++;
            }
    CHECK(errors == 0, "%d tiles outside their sequence", errors);
}

TEST(fp8_fragment_bytes_meet_their_keys) {
    int errors = 0;
    for (int kk = 0; kk < FP8_N / 32; kk++)
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < 4; j++)
                for (int byte = 0; byte < 4; byte++) {
                    // The accumulator register's row and column (the wgmma f32 layout) ...
                    const int i = fp8_fragment_source(kk, j, byte), row = 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
                    // ... against A's: row g (j even) or g + 8, slot 16 (j / 2) + 4 t + byte of k-step kk.
                    const int slot = 16 * (j / 2) + 4 * t + byte;
                    if (row != 8 * (j % 2) || col != 32 * kk + fa3c_fp8_key_of_slot(slot)) errors++;
                }
    int seen[32] = {0};
    for (int slot = 0; slot < 32; slot++) seen[fa3c_fp8_key_of_slot(slot)]++;
    for (int key = 0; key < 32; key++) errors += seen[key] != 1;
    CHECK(errors == 0, "%d fragment bytes or slots out of place", errors);
}

// The fp8 kernel's params of problem pr's mask at lengths sq, sk (causal as
// window_right 0, as fp8_host.c sets them).
static fa3c_fp8_kernel_params fp8_mask_params(const fa3c_problem *pr, int sq, int sk) {
    fa3c_fp8_kernel_params p;
    memset(&p, 0, sizeof p);
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.window_left = pr->window_left;
    p.window_right = pr->causal ? 0 : pr->window_right;
    return p;
}

TEST(fp8_mask_bounds_and_key_blocks) {
    const int lens[] = {1, 17, 100, 128, 129, 300};
    const int windows[][3] = {{0, -1, -1}, {1, -1, -1}, {0, 40, 8}, {0, 0, 0}, {1, 70, -1}};
    int errors = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int w = 0; w < 5; w++) {
                const int sq = lens[a], sk = lens[b];
                const fa3c_problem pr = mask_problem(windows[w][0], windows[w][1], windows[w][2]);
                const fa3c_fp8_kernel_params p = fp8_mask_params(&pr, sq, sk);
                for (int m0 = 0; m0 < sq; m0 += FP8_M) {
                    int n_begin, n_end;
                    fp8_key_blocks(p, m0, n_begin, n_end);
                    for (int q = m0; q < m0 + FP8_M && q < sq; q++)
                        for (int n = 0; n * FP8_N < sk; n++)
                            for (int t = 0; t < 4; t++) {
                                int lo, hi;
                                fp8_row_columns(p, q, (long long)n * FP8_N + 2 * t, lo, hi);
                                for (int c = 0; c < FP8_N / 8; c++)
                                    for (int e = 0; e < 2; e++) {
                                        const int off = 8 * c + e, key = n * FP8_N + off + 2 * t;
                                        const int want = key < sk && visible(&pr, q, key, sq, sk);
                                        errors += (off >= lo && off <= hi) != want;
                                        errors += want && (n < n_begin || n >= n_end);   // a needed block skipped
                                    }
                            }
                }
            }
    CHECK(errors == 0, "%d mask or key-block errors in the fp8 forward", errors);
}

// The blocks the fp8 forward takes without a mask (fp8_unmasked_blocks) are
// exactly those every row of the CTA (below seqlen_q) sees whole.
TEST(fp8_unmasked_blocks_are_seen_whole) {
    // 255 and 130 / 256 put a band's end one key before a block's (an off-by-one in either bound shows)
    const int lens[] = {1, 17, 100, 128, 129, 130, 255, 256, 300, 640};
    const int windows[][3] = {{0, -1, -1}, {1, -1, -1}, {0, 40, 8}, {0, 0, 0}, {1, 70, -1}, {0, 200, 150}, {1, 300, -1}};
    int errors = 0, whole_blocks = 0;
    for (int a = 0; a < 10; a++)
        for (int b = 0; b < 10; b++)
            for (int w = 0; w < 7; w++) {
                const int sq = lens[a], sk = lens[b];
                const fa3c_problem pr = mask_problem(windows[w][0], windows[w][1], windows[w][2]);
                const fa3c_fp8_kernel_params p = fp8_mask_params(&pr, sq, sk);
                for (int m0 = 0; m0 < sq; m0 += FP8_M) {
                    int u_begin, u_end;
                    fp8_unmasked_blocks(p, m0, u_begin, u_end);
                    for (int n = 0; n * FP8_N < sk + FP8_N; n++) {
                        int whole = 1;
                        for (int q = m0; q < m0 + FP8_M && q < sq && whole; q++)
                            for (int key = n * FP8_N; key < (n + 1) * FP8_N && whole; key++)
                                whole = key < sk && visible(&pr, q, key, sq, sk);
                        errors += whole != (n >= u_begin && n < u_end);
                        whole_blocks += whole;
                    }
                }
            }
    CHECK(errors == 0, "%d blocks where fp8_unmasked_blocks and the mask disagree", errors);
    CHECK(whole_blocks > 100, "only %d blocks seen whole: the cases test too little", whole_blocks);
}

// The wide backward's shares: warpgroup 0's and 1's columns of dK, dV and
// dQ tile [0, D), [0, DV) and [0, D) exactly once, and its smem holds v and
// dO DV wide.
template <int D, int DV>
static int wide_share_errors(int *work) {
    typedef WideShare<D, 0, DV> A;
    typedef WideShare<D, 1, DV> B;
    int seen_k[256] = {0}, seen_v[256] = {0}, seen_q[256] = {0}, errors = 0;
    for (int c = 0; c < 64 * A::DK_TILES; c++) seen_k[A::DK_COL0 + c]++;
    for (int c = 0; c < 64 * B::DK_TILES; c++) seen_k[B::DK_COL0 + c]++;
    for (int c = 0; c < 64 * A::DV_TILES; c++) seen_v[A::DV_COL0 + c]++;
    for (int c = 0; c < 64 * B::DV_TILES; c++) seen_v[B::DV_COL0 + c]++;
    for (int c = 0; c < A::DQ_N; c++) seen_q[A::DQ_COL0 + c]++;
    for (int c = 0; c < B::DQ_N; c++) seen_q[B::DQ_COL0 + c]++;
    for (int c = 0; c < 256; c++)
        errors += seen_k[c] != (c < D) || seen_v[c] != (c < DV) || seen_q[c] != (c < D);
    errors += sizeof(((BwdWideSmem<D, DV> *)0)->v) != (size_t)BwdWideSmem<D, DV>::N * DV * 2;
    errors += sizeof(((BwdWideSmem<D, DV> *)0)->dout[0]) != (size_t)BwdWideSmem<D, DV>::M * DV * 2;
    work[0] = A::DK_TILES + A::DV_TILES + A::DQ_N / 64;   // 64-column tiles of each warpgroup
    work[1] = B::DK_TILES + B::DV_TILES + B::DQ_N / 64;
    return errors;
}

TEST(bwd_wide_shares_cover_the_columns) {
    int w192[2], w256[2], mla[2];
    const int e192 = wide_share_errors<192, 192>(w192), e256 = wide_share_errors<256, 256>(w256);
    const int e_mla = wide_share_errors<192, 128>(mla);
    CHECK(e192 == 0, "hdim 192: the shares miss or repeat columns (%d errors)", e192);
    CHECK(e256 == 0, "hdim 256: the shares miss or repeat columns (%d errors)", e256);
    CHECK(e_mla == 0, "hdim 192 with v 128: the shares miss or repeat columns (%d errors)", e_mla);
    CHECK(mla[0] == mla[1], "hdim 192 with v 128: warpgroup tiles %d and %d, want equal", mla[0], mla[1]);
}

// ex2_poly against exp2 in double: within 1e-4 relative where 2^x is a
// normal float well above e4m3's reach, >= 0 and tiny below, NaN kept.
TEST(fp8_poly_exp_is_exp2) {
    double worst = 0;
    int bad = 0;
    for (int i = 0; i <= 1360000; i++) {   // x in [-125, 11] in steps of 1e-4
        const float x = -125.f + 1e-4f * (float)i;
        const double rel = fabs((double)ex2_poly(x) / exp2((double)x) - 1);
        worst = rel > worst ? rel : worst;
    }
    CHECK(worst < 1e-4, "ex2_poly: relative error %g, want < 1e-4", worst);
    const float below[] = {-125.9f, -126.4f, -126.5f, -127.f, -200.f, -1e30f, -INFINITY};
    for (int i = 0; i < 7; i++) {
        const float y = ex2_poly(below[i]);
        bad += !(y >= 0.f && y < 1e-37f);
    }
    CHECK(bad == 0, "ex2_poly: %d inputs below -125.9 gave something other than a tiny non-negative value", bad);
    CHECK(isnan(ex2_poly(NAN)), "ex2_poly(NaN) is not NaN");
    CHECK(ex2_poly(0.f) > 0.9999f && ex2_poly(0.f) < 1.0001f && ex2_poly(8.f) > 255.97f && ex2_poly(8.f) < 256.03f,
          "ex2_poly(0) = %g, ex2_poly(8) = %g", ex2_poly(0.f), ex2_poly(8.f));
}

TEST_MAIN()
