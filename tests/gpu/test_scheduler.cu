// The forward kernel's tile plan (src/cuda/forward/fwd_plan.c) and its scheduler
// (scheduler.cuh, mask.cuh: the same host/device functions the kernel runs),
// checked on the CPU: no GPU needed, so these run in CI too. For random
// problems (GQA packing, split-KV, causal, windows, L2 sections, persistent
// grids smaller and larger than the tile count):
//   - the CTAs' steps visit every tile exactly once;
//   - every tile names a valid (batch, group, row block, split); under a
//     causal mask the partial row block's idle warpgroups are at the top
//     (m_shift);
//   - the splits of a row block cover exactly the key blocks its rows need,
//     without overlap;
//   - the key blocks said to need no mask need none for any row, and every
//     key a row may see lies in the tile's blocks;
//   - the same for each consumer warpgroup's part of a tile (the key blocks
//     it skips hold no key of its rows);
//   - each row's keys are those of the library's definition (src/problem.h),
//     for sequences of their own lengths (seqused_k: the variable-length
//     instances' tile_at<true>) too.
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "backend.h"
#include "cuda/forward/fwd_plan.h"
#include "cuda/forward/fwd_tiles.h"
#include "cuda/forward/scheduler.cuh"
#include "problem.h"

typedef struct {
    fa3c_problem pr;   // pr's arrays unset: check_plan points them at used[], cu_q[], cu_k[]
    int num_splits, sms, l2_bytes, block_m, block_n;
    // The variable-length instances: keys per sequence used[b] (seqused_k),
    // packed queries (cu_seqlens_q = cu_q) and packed keys (cu_seqlens_k = cu_k).
    int varlen, packed_q, packed_k, no_used;   // no_used: varlen without seqused_k
    int32_t used[4], cu_q[5], cu_k[5];
} plan_case;

// Prefix sums of 4 random lengths in [0, max]: empty, full, one, or any.
static void random_prefix_sums(int32_t cu[5], int max) {
    cu[0] = 0;
    for (int b = 0; b < 4; b++) {
        int kind = tu_rand_int(0, 5);
        cu[b + 1] = cu[b] + (kind == 0 ? 0 : kind == 1 ? max : kind == 2 ? 1 : tu_rand_int(0, max));
    }
}

static plan_case random_case(void) {
    plan_case c;
    memset(&c, 0, sizeof c);
    const int hdims[] = {64, 96, 128, 192, 256};
    c.pr.headdim = hdims[tu_rand_int(0, 4)];
    c.pr.batch = tu_rand_int(1, 4);
    c.pr.heads_kv = tu_rand_int(1, 4);
    const int groups[] = {1, 1, 2, 3, 4, 6, 8, 16, 32};
    c.pr.heads_q = c.pr.heads_kv * groups[tu_rand_int(0, 8)];
    int decode = tu_rand_int(0, 2) == 0;
    c.pr.seqlen_q = decode ? tu_rand_int(1, 5) : tu_rand_int(1, 700);
    c.pr.seqlen_k = tu_rand_int(1, 3000);
    c.pr.window_left = c.pr.window_right = -1;
    switch (tu_rand_int(0, 3)) {
    case 1: c.pr.causal = 1; break;
    case 2: c.pr.window_left = tu_rand_int(0, 300); c.pr.window_right = tu_rand_int(0, 50); break;
    case 3: c.pr.causal = 1; c.pr.window_left = tu_rand_int(0, 300); break;
    default: break;
    }
    const int splits[] = {0, 0, 1, 2, 3, 7, 64};
    c.num_splits = splits[tu_rand_int(0, 6)];
    const int sms[] = {132, 132, 7, 1000, 0};
    c.sms = sms[tu_rand_int(0, 4)];
    const int l2[] = {50 << 20, 1 << 20, 0};
    c.l2_bytes = l2[tu_rand_int(0, 2)];
    c.block_m = FA3C_FWD_BLOCK_M(c.pr.headdim);
    c.block_n = FA3C_FWD_BLOCK_N(c.pr.headdim);
    c.varlen = tu_rand_int(0, 2) == 0;
    for (int b = 0; b < 4; b++) {   // empty, full, one key, or anything in between
        int kind = tu_rand_int(0, 5);
        c.used[b] = kind == 0 ? 0 : kind == 1 ? c.pr.seqlen_k : kind == 2 ? 1 : tu_rand_int(0, c.pr.seqlen_k);
    }
    c.no_used = tu_rand_int(0, 2) == 0;
    c.packed_q = c.varlen && tu_rand_int(0, 1);
    c.packed_k = c.varlen && tu_rand_int(0, 1);
    random_prefix_sums(c.cu_q, c.pr.seqlen_q);
    random_prefix_sums(c.cu_k, c.pr.seqlen_k);
    return c;
}

// The problem of a case, its arrays pointing into the case (varlen: seqused_k
// always, cu_seqlens as drawn).
static fa3c_problem problem_of(const plan_case *c) {
    fa3c_problem pr = c->pr;
    if (c->varlen && !c->no_used) pr.seqused_k = c->used;
    if (c->packed_q) pr.cu_seqlens_q = c->cu_q;
    if (c->packed_k) pr.cu_seqlens_k = c->cu_k;
    return pr;
}

static plan_case fixed_case(int headdim, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int sms);

// The kernel's functions in the fixed-length or the variable-length form,
// as the plan says (any of the variable-length arrays).
static int varlen_plan(const fa3c_fwd_kernel_params &p) {
    return p.seqused_k || p.cu_seqlens_q || p.cu_seqlens_k || p.page_table;
}
static FwdTile tile_of(const fa3c_fwd_kernel_params &p, int tile, const plan_case *c) {
    return varlen_plan(p) ? tile_at<true>(p, tile, c->block_m, c->block_n)
                          : tile_at<false>(p, tile, c->block_m, c->block_n);
}
static FwdTile part_of(const fa3c_fwd_kernel_params &p, const FwdTile &t, int wg, int block_n) {
    return varlen_plan(p) ? warpgroup_part<true>(p, t, wg, block_n) : warpgroup_part<false>(p, t, wg, block_n);
}
static void row_keys(const fa3c_fwd_kernel_params &p, const FwdTile &t, int row, int &lo, int &hi) {
    if (varlen_plan(p)) key_range<true>(p, t, row, lo, hi);
    else key_range<false>(p, t, row, lo, hi);
}
static void blocks_of_rows(const fa3c_fwd_kernel_params &p, const FwdTile &t, int m0, int block_m, int block_n,
                           int &begin, int &end) {
    if (varlen_plan(p)) key_block_range<true>(p, t, m0, block_m, block_n, begin, end);
    else key_block_range<false>(p, t, m0, block_m, block_n, begin, end);
}
static int rows_of(const fa3c_fwd_kernel_params &p, const FwdTile &t) { return varlen_plan(p) ? t.rows : p.rows; }
static int key0_of(const fa3c_fwd_kernel_params &p, const FwdTile &t) { return varlen_plan(p) ? t.key0 : 0; }
static int last_row_of(const fa3c_fwd_kernel_params &p, const FwdTile &t, int m0, int block_m) {
    return varlen_plan(p) ? last_row<true>(p, t, m0, block_m) : last_row<false>(p, t, m0, block_m);
}
static int first_row_of(const fa3c_fwd_kernel_params &p, int m0) {
    return varlen_plan(p) ? first_row<true>(m0) : first_row<false>(m0);
}
// The row block of a tile within its (batch, group): counted from the top,
// or with packed queries from the sequence's end (tile_at).
static int block_index_of(const fa3c_fwd_kernel_params &p, const FwdTile &t, int block_m) {
    return p.cu_seqlens_q ? p.num_m_blocks - (t.rows - t.m0) / block_m : (t.m0 + p.m_shift) / block_m;
}

// Whether tile row `row`'s keys [lo, hi] (empty when lo > hi) are the
// library's definition of them for that query and sequence (src/problem.h).
static int keys_as_defined(const fa3c_problem *pr, const fa3c_fwd_kernel_params &p, int batch, int row, int lo,
                           int hi) {
    int want_lo, want_hi;
    fa3c_key_range(pr, row / p.pack, fa3c_seqlen_q_of(pr, batch), fa3c_seqlen_k_of(pr, batch), &want_lo, &want_hi);
    return lo > hi ? want_lo > want_hi : lo == want_lo && hi == want_hi;
}

// The first of key blocks [begin, end) that masks some key of a row seeing
// keys [lo, hi], or -1: blocks said to need no mask must hold only seen keys.
// Block n holds keys key0 + n block_n ...
static int masked_block_in(int begin, int end, int lo, int hi, int block_n, int key0 = 0) {
    for (int n = begin; n < end; n++)
        if (lo > key0 + n * block_n || key0 + (n + 1) * block_n - 1 > hi) return n;
    return -1;
}

// Checks one plan; returns 0 (after CHECK failures) when something is wrong.
// Counts plans of packed queries with split-KV in *packed_splits, if given.
static int check_plan(const plan_case *c, int *packed_splits = NULL) {
    const fa3c_problem problem = problem_of(c);
    const fa3c_problem *pr = &problem;
    fa3c_fwd_kernel_params p;
    memset(&p, 0, sizeof p);
    fa3c_fwd_plan_facts facts = {c->sms, c->l2_bytes, c->block_m, c->block_n};
    int pack = fa3c_fwd_plan_pack(pr, c->block_m);
    fa3c_status st = fa3c_fwd_plan_tiles(&p, pr, pack, c->num_splits, &facts);
    char what[200];
    snprintf(what, sizeof what,
             "b %d hq %d hkv %d d %d sq %d sk %d causal %d window (%d,%d) splits %d sms %d l2 %d seqused %s%d,%d,.. "
             "cu_q %s%d,%d,.. cu_k %s%d,%d,..",
             pr->batch, pr->heads_q, pr->heads_kv, pr->headdim, pr->seqlen_q, pr->seqlen_k, pr->causal,
             pr->window_left, pr->window_right, c->num_splits, c->sms, c->l2_bytes, c->varlen ? "" : "(off) ",
             c->used[0], c->used[1], c->packed_q ? "" : "(off) ", c->cu_q[1], c->cu_q[2], c->packed_k ? "" : "(off) ",
             c->cu_k[1], c->cu_k[2]);
    CHECK(st == FA3C_STATUS_OK, "%s: plan failed", what);
    if (st != FA3C_STATUS_OK) return 0;
    CHECK(p.seqused_k == pr->seqused_k && p.cu_seqlens_q == pr->cu_seqlens_q && p.cu_seqlens_k == pr->cu_seqlens_k &&
              (!varlen_plan(p) || p.cluster == 1),
          "%s: arrays not in the plan, or cluster %d", what, p.cluster);
    CHECK(pack == 1 || (c->block_m % pack == 0 && pack == pr->heads_q / pr->heads_kv), "%s: pack %d", what, pack);
    CHECK(p.num_splits >= 1 && (c->num_splits == 0 || p.num_splits <= c->num_splits), "%s: %d splits", what,
          p.num_splits);
    if (packed_splits && pr->cu_seqlens_q && p.num_splits > 1) ++*packed_splits;
    // Under a right bound (causal) without packing, the partial row block's
    // whole idle warpgroups are at the top (fewest keys); otherwise at the
    // bottom. (Packed queries: each sequence's tiles end at its end instead.)
    int want_shift = FA3C_FWD_CAUSAL_SHIFT && p.window_right >= 0 && pack == 1 && !pr->cu_seqlens_q
                         ? (p.num_m_blocks * c->block_m - p.rows) / 64 * 64
                         : 0;
    CHECK(p.m_shift == want_shift && p.m_shift >= 0 && p.m_shift < c->block_m, "%s: m_shift %d (want %d)", what,
          p.m_shift, want_shift);

    // The launch's grid, from the plan.
    int grid = p.grid;
    CHECK(grid >= 1 && grid <= p.num_tiles && (c->sms <= 0 || !FA3C_FWD_PERSISTENT || grid <= c->sms),
          "%s: grid %d for %d tiles", what, grid, p.num_tiles);
    // Every tile visited exactly once, by one CTA's steps.
    int *visits = (int *)calloc((size_t)p.num_tiles, sizeof(int));
    int ok = 1;
    for (int cta = 0; cta < grid && ok; cta++) {
        for (int step = 0;; step++) {
            // As the kernel's producer and consumers walk their steps.
            int tile = tile_of_step(p, step, HostCta{grid, cta});
            if (tile == NO_MORE_TILES) break;
            if (tile == SKIP_STEP) continue;
            ok = tile >= 0 && tile < p.num_tiles && visits[tile] == 0;
            CHECK(ok, "%s: cta %d step %d: tile %d of %d (%d visits before)", what, cta, step, tile, p.num_tiles,
                  ok ? visits[tile] : -1);
            if (!ok) break;
            visits[tile]++;
        }
    }
    for (int i = 0; i < p.num_tiles && ok; i++) {
        ok = visits[i] == 1;
        CHECK(ok, "%s: tile %d never visited", what, i);
    }
    free(visits);
    if (!ok) return 0;

    // Every tile: valid indices; per row block, the splits' key ranges tile
    // the needed range; masks and key ranges agree with the rows' keys.
    const int key_blocks = (pr->seqlen_k + c->block_n - 1) / c->block_n;
    const int row_blocks = p.batch * p.groups * p.num_m_blocks;
    int *covered = (int *)calloc((size_t)row_blocks * key_blocks, sizeof(int));
    // Packed queries: how often each row of each (batch, group) is in a tile
    // of each split (once: with split-KV, the combine reads a partial of
    // every split for every row of a sequence, fwd_combine.cu).
    const size_t rows_per_split = (size_t)row_blocks * c->block_m;
    int *row_seen = (int *)calloc(rows_per_split * p.num_splits, sizeof(int));
    for (int tile = 0; tile < p.num_tiles && ok; tile++) {
        FwdTile t = tile_of(p, tile, c);
        const int rows = rows_of(p, t), key0 = key0_of(p, t);
        const int in_place = pr->cu_seqlens_q ? (rows - t.m0) % c->block_m == 0 && t.m0 < rows
                                              : (t.m0 + p.m_shift) % c->block_m == 0 && t.m0 + c->block_m > 0 &&
                                                    t.m0 < p.rows;
        ok = t.batch >= 0 && t.batch < p.batch && t.group >= 0 && t.group < p.groups && t.head == t.group * pack &&
             t.head_kv == t.head / (pr->heads_q / pr->heads_kv) && in_place && t.split >= 0 &&
             t.split < p.num_splits;
        CHECK(ok, "%s: tile %d -> batch %d group %d head %d kv %d m0 %d (rows %d) split %d", what, tile, t.batch,
              t.group, t.head, t.head_kv, t.m0, rows, t.split);
        if (!ok) break;
        ok = !varlen_plan(p) || (t.seqlen_k == fa3c_seqlen_k_of(pr, t.batch) &&
                                 t.seqlen_q == fa3c_seqlen_q_of(pr, t.batch) && t.rows == t.seqlen_q * p.pack &&
                                 key0 <= 0 && key0 > -c->block_n && (key0 == 0 || pr->cu_seqlens_k));
        CHECK(ok, "%s: tile %d of batch %d: %d keys, %d queries, key0 %d (want %d keys, %d queries)", what, tile,
              t.batch, t.seqlen_k, t.seqlen_q, key0, fa3c_seqlen_k_of(pr, t.batch), fa3c_seqlen_q_of(pr, t.batch));
        if (t.m0 + c->block_m <= 0) {   // void (packed queries): nothing to walk
            ok = pr->cu_seqlens_q && tile_is_empty(t) && tile_is_void<true>(t, c->block_m);
            CHECK(ok, "%s: tile %d has no row but blocks [%d, %d)", what, tile, t.n_begin, t.n_end);
            continue;
        }
        // Packed keys: no K/V box reaches past the sequence's last key (the host does not know where the
        // packed tensors end); packed queries: no Q box past its last row (in_place).
        ok = !pr->cu_seqlens_k || tile_is_empty(t) || key0 + t.n_end * c->block_n <= t.seqlen_k;
        CHECK(ok, "%s: tile %d walks blocks [%d, %d) from key0 %d past the sequence's %d keys", what, tile, t.n_begin,
              t.n_end, key0, t.seqlen_k);
        const int rb = (t.batch * p.groups + t.group) * p.num_m_blocks + block_index_of(p, t, c->block_m);
        for (int n = t.n_begin; n < t.n_end; n++) covered[(size_t)rb * key_blocks + n]++;
        if (pr->cu_seqlens_q)
            for (int row = max(t.m0, 0); row < min(t.m0 + c->block_m, rows); row++)
                row_seen[t.split * rows_per_split + (size_t)(t.batch * p.groups + t.group) * p.num_m_blocks * c->block_m +
                         row]++;
        int full_begin, full_end;
        blocks_of_rows(p, t, t.m0, c->block_m, c->block_n, full_begin, full_end);
        int last = last_row_of(p, t, t.m0, c->block_m);
        for (int row = first_row_of(p, t.m0); row <= last && ok; row++) {
            int lo, hi;
            row_keys(p, t, row, lo, hi);
            ok = keys_as_defined(pr, p, t.batch, row, lo, hi);
            CHECK(ok, "%s: tile %d row %d: keys [%d, %d], not as src/problem.h defines them", what, tile, row, lo, hi);
            if (lo > hi) continue;   // a fully masked row
            ok = (lo - key0) / c->block_n >= full_begin && (hi - key0) / c->block_n < full_end;
            CHECK(ok, "%s: row %d keys [%d, %d] outside blocks [%d, %d) (key0 %d)", what, row, lo, hi, full_begin,
                  full_end, key0);
            int bad = ok ? masked_block_in(t.u_begin, t.u_end, lo, hi, c->block_n, key0) : -1;
            ok = ok && bad < 0;
            CHECK(bad < 0, "%s: row %d keys [%d, %d], block %d said unmasked", what, row, lo, hi, bad);
        }
        // Each computing warpgroup's part: it keeps at least one block, the
        // blocks it skips hold no key of its rows, its unmasked blocks mask none.
        for (int wg = 0; wg < c->block_m / 64 && ok && !tile_is_empty(t); wg++) {
            int first = t.m0 + 64 * wg;
            if (first >= rows) break;
            if (first + 64 <= 0 || (first < 0 && !pr->cu_seqlens_q)) continue;   // its rows above row 0: idle
            FwdTile w = part_of(p, t, wg, c->block_n);
            ok = w.n_begin == t.n_begin && w.n_end > t.n_begin && w.n_end <= t.n_end;
            CHECK(ok, "%s: tile %d warpgroup %d keeps blocks [%d, %d) of [%d, %d)", what, tile, wg, w.n_begin,
                  w.n_end, t.n_begin, t.n_end);
            for (int row = first_row_of(p, first); row <= last_row_of(p, t, first, 64) && ok; row++) {
                int lo, hi;
                row_keys(p, t, row, lo, hi);
                if (lo > hi) continue;
                ok = hi - key0 < w.n_end * c->block_n || w.n_end == t.n_end;
                CHECK(ok, "%s: tile %d warpgroup %d row %d sees key %d, past its blocks [%d, %d)", what, tile, wg, row,
                      hi, w.n_begin, w.n_end);
                int bad = ok ? masked_block_in(max(w.u_begin, w.n_begin), min(w.u_end, w.n_end), lo, hi, c->block_n,
                                               key0)
                             : -1;
                ok = ok && bad < 0;
                CHECK(bad < 0, "%s: warpgroup %d row %d keys [%d, %d], block %d said unmasked", what, wg, row, lo, hi,
                      bad);
            }
        }
    }
    for (int rb = 0; rb < row_blocks && ok; rb++) {
        FwdTile seq;   // the row block's sequence, for its lengths
        sequence_of_batch(p, rb / (p.groups * p.num_m_blocks), c->block_n, seq);
        const int index = rb % p.num_m_blocks;
        int m0 = pr->cu_seqlens_q ? seq.rows - (p.num_m_blocks - index) * c->block_m : index * c->block_m - p.m_shift;
        int begin = 0, end = 0;
        if (m0 + c->block_m > 0) blocks_of_rows(p, seq, m0, c->block_m, c->block_n, begin, end);
        for (int n = 0; n < key_blocks && ok; n++) {
            int want = n >= begin && n < end;
            ok = covered[(size_t)rb * key_blocks + n] == want;
            CHECK(ok, "%s: row block %d, key block %d covered %d times (want %d)", what, rb, n,
                  covered[(size_t)rb * key_blocks + n], want);
        }
    }
    free(covered);
    for (int bg = 0; bg < p.batch * p.groups && ok && pr->cu_seqlens_q; bg++) {
        const int rows = fa3c_seqlen_q_of(pr, bg / p.groups) * p.pack;
        for (int split = 0; split < p.num_splits && ok; split++)
            for (int row = 0; row < p.num_m_blocks * c->block_m && ok; row++) {
                const int seen = row_seen[split * rows_per_split + (size_t)bg * p.num_m_blocks * c->block_m + row];
                ok = seen == (row < rows);
                CHECK(ok, "%s: (batch, group) %d row %d of %d in %d tiles of split %d", what, bg, row, rows, seen,
                      split);
            }
    }
    free(row_seen);
    return ok;
}

// The instance table's choice for hdim 256: 64-key blocks under a causal
// mask (or any right bound) up to FA3C_FWD_SHORT_CAUSAL_KEYS_256 keys, the
// main 80-key instance otherwise (fwd_host.c, find_fwd).
TEST(instance_choice_hdim256_short_causal) {
    fa3c_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.dtype = FA3C_DTYPE_BF16;
    pr.headdim = 256;
    pr.batch = pr.heads_q = pr.heads_kv = 1;
    pr.seqlen_q = pr.seqlen_k = 512;
    pr.window_left = pr.window_right = -1;
    if (FA3C_FWD_SHORT_CAUSAL_KEYS_256 <= 0 || fa3c_cuda_fwd_block_n(&pr) == 0) {
        SKIP("this build has no bf16 hdim 256 instance or no short-causal choice (FA3C_INSTANCES)");
    }
    CHECK(fa3c_cuda_fwd_block_n(&pr) == FA3C_FWD_BLOCK_N(256), "non-causal 512: block_n %d", fa3c_cuda_fwd_block_n(&pr));
    pr.causal = 1;
    int short_n = fa3c_cuda_fwd_block_n(&pr);
    if (short_n == FA3C_FWD_BLOCK_N(256)) SKIP("this build lacks the bf16_hdim256_n64 instance (FA3C_INSTANCES)");
    CHECK(short_n == 64, "causal 512: block_n %d", short_n);
    pr.seqlen_q = pr.seqlen_k = FA3C_FWD_SHORT_CAUSAL_KEYS_256;
    CHECK(fa3c_cuda_fwd_block_n(&pr) == 64, "causal at the limit: block_n %d", fa3c_cuda_fwd_block_n(&pr));
    pr.seqlen_k = FA3C_FWD_SHORT_CAUSAL_KEYS_256 + 1;
    CHECK(fa3c_cuda_fwd_block_n(&pr) == FA3C_FWD_BLOCK_N(256), "causal past the limit: block_n %d",
          fa3c_cuda_fwd_block_n(&pr));
    pr.causal = 0;
    pr.seqlen_k = 300;
    pr.window_left = 50;
    pr.window_right = 20;
    CHECK(fa3c_cuda_fwd_block_n(&pr) == 64, "window (50, 20), 300 keys: block_n %d", fa3c_cuda_fwd_block_n(&pr));
    pr.dtype = FA3C_DTYPE_FP16;
    CHECK(fa3c_cuda_fwd_block_n(&pr) == 64 || fa3c_cuda_fwd_block_n(&pr) == 0, "fp16: block_n %d",
          fa3c_cuda_fwd_block_n(&pr));
    // With seqused_k only the variable-length instance (80-key blocks) may run it, or none.
    const int32_t used = 200;
    pr.dtype = FA3C_DTYPE_BF16;
    pr.seqused_k = &used;
    CHECK(fa3c_cuda_fwd_block_n(&pr) == FA3C_FWD_BLOCK_N(256) || fa3c_cuda_fwd_block_n(&pr) == 0,
          "seqused_k, window, 300 keys: block_n %d", fa3c_cuda_fwd_block_n(&pr));
}

// The variable-length instances read seqused_k and cu_seqlens from device
// memory, which the host cannot check: a length below 0 or above the call's
// maximum is kept within [0, maximum], so the kernel never walks keys or
// rows past the tensors; packed keys' blocks end at the last key.
static FwdTile sequence(const fa3c_fwd_kernel_params &p, int b) {
    FwdTile t;
    sequence_of_batch(p, b, 128, t);
    return t;
}
TEST(scheduler_sequence_lengths_clamped) {
    fa3c_fwd_kernel_params p;
    memset(&p, 0, sizeof p);
    const int32_t used[4] = {-5, 0, 700, 1000};
    p.batch = 4;
    p.seqlen_q = 300;
    p.seqlen_k = 700;
    p.pack = 2;
    CHECK(sequence(p, 2).seqlen_k == 700 && sequence(p, 2).key0 == 0, "no seqused_k: %d keys", sequence(p, 2).seqlen_k);
    p.seqused_k = used;
    CHECK(sequence(p, 0).seqlen_k == 0 && sequence(p, 1).seqlen_k == 0 && sequence(p, 2).seqlen_k == 700 &&
              sequence(p, 3).seqlen_k == 700,
          "keys %d %d %d %d (want 0 0 700 700)", sequence(p, 0).seqlen_k, sequence(p, 1).seqlen_k,
          sequence(p, 2).seqlen_k, sequence(p, 3).seqlen_k);
    const int32_t cu_q[5] = {0, 100, 90, 500, 800}, cu_k[5] = {0, 300, 1200, 1250, 1250};
    p.seqused_k = NULL;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    const FwdTile s0 = sequence(p, 0), s1 = sequence(p, 1), s2 = sequence(p, 2), s3 = sequence(p, 3);
    CHECK(s0.seqlen_q == 100 && s0.rows == 200 && s0.q_start == 0 && s1.seqlen_q == 0 && s2.seqlen_q == 300 &&
              s2.q_start == 90 && s3.seqlen_q == 300,
          "queries %d %d %d %d (want 100 0 300 300)", s0.seqlen_q, s1.seqlen_q, s2.seqlen_q, s3.seqlen_q);
    CHECK(s0.seqlen_k == 300 && s0.key0 == -84 && s1.seqlen_k == 700 && s1.k_start == 300 && s1.key0 == -68 &&
              s2.seqlen_k == 50 && s2.key0 == -78 && s3.seqlen_k == 0 && s3.key0 == 0,
          "keys %d %d %d %d, key0 %d %d %d %d", s0.seqlen_k, s1.seqlen_k, s2.seqlen_k, s3.seqlen_k, s0.key0, s1.key0,
          s2.key0, s3.key0);
    // Starts past the batch x seqlen tokens the host knows of (or below 0): the sequence kept inside them.
    const int32_t cu_bad[5] = {-50, 10, 5000, 5100, 9000};
    p.cu_seqlens_q = cu_bad;
    p.cu_seqlens_k = cu_bad;
    const FwdTile b0 = sequence(p, 0), b2 = sequence(p, 2);
    CHECK(b0.q_start == 0 && b0.seqlen_q == 60 && b2.q_start == 1200 - 100 && b2.seqlen_q == 100 &&
              b2.k_start == 2800 - 100 && b2.seqlen_k == 100,
          "clamped starts: q %d (%d) and %d (%d), k %d (%d)", b0.q_start, b0.seqlen_q, b2.q_start, b2.seqlen_q,
          b2.k_start, b2.seqlen_k);
}

// Paged KV: K/V boxes of gcd(block_n, page_size) rows (a box lies inside
// one page), and no clusters with a page table (a plan that would pair).
TEST(scheduler_paged_kv_plan) {
    fa3c_problem pr;
    memset(&pr, 0, sizeof pr);
    const int cases[][3] = {{128, 16, 16}, {128, 256, 128}, {128, 128, 128}, {80, 64, 16},
                            {112, 32, 16}, {128, 12, 4},    {128, 8, 8},     {80, 48, 16},
                            {128, 1, 1},   {80, 12, 4},     {112, 17, 1},    {128, 6, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pr.page_size = cases[i][1];
        CHECK(fa3c_fwd_plan_page_rows(&pr, cases[i][0]) == cases[i][2], "block %d, pages of %d: boxes of %d (want %d)",
              cases[i][0], cases[i][1], fa3c_fwd_plan_page_rows(&pr, cases[i][0]), cases[i][2]);
    }
    plan_case c = fixed_case(128, 32, 16, 16, 512, 512, 132);
    const int32_t table[1] = {0};
    c.pr.page_table = table;
    c.pr.page_table_stride = 4;
    c.pr.page_size = 256;
    c.pr.num_pages = 64;
    fa3c_fwd_kernel_params p;
    memset(&p, 0, sizeof p);
    fa3c_fwd_plan_facts facts = {c.sms, c.l2_bytes, c.block_m, c.block_n, 2};
    CHECK(fa3c_fwd_plan_tiles(&p, &c.pr, 1, 1, &facts) == FA3C_STATUS_OK && p.cluster == 1 &&
              p.page_table == table && p.page_table_stride == 4 && p.page_rows == 128 && p.div_page_size.d == 256,
          "paged plan: cluster %d, page rows %d, page size %d", p.cluster, p.page_rows, p.div_page_size.d);
    c.pr.page_table = NULL;   // the same plan without pages pairs
    CHECK(fa3c_fwd_plan_tiles(&p, &c.pr, 1, 1, &facts) == FA3C_STATUS_OK && p.cluster == 2, "unpaged: cluster %d",
          p.cluster);
}

TEST(scheduler_random_plans) {
    int packed_splits = 0;
    for (int i = 0; i < 3000; i++) {
        plan_case c = random_case();
        if (!check_plan(&c, &packed_splits)) return;
    }
    printf("    %d plans of packed queries with split-KV\n", packed_splits);
    CHECK(packed_splits >= 50, "only %d plans of packed queries with split-KV", packed_splits);
}

// Walks a cluster plan as `clusters` clusters would (the plan's grid, or
// fewer when the launch finds that not all fit on the GPU at once,
// fwd_launch.cuh): both CTAs of a cluster get the same (batch, KV head) and
// key blocks and neighbouring row blocks; every row block of every (batch,
// group) comes once; the blocks are each half's own (no mask or window), and
// hold every key each row sees. 0 when something is wrong.
static int walk_clusters(const fa3c_fwd_kernel_params &p, const plan_case *c, int clusters, const char *what) {
    const int blocks = p.num_m_blocks * 2, pairs = p.batch * p.groups;
    int *visits = (int *)calloc((size_t)pairs * blocks, sizeof(int));
    int ok = 1;
    for (int cl = 0; cl < clusters && ok; cl++)
        for (int step = 0; ok; step++) {
            int tile = tile_of_step(p, step, HostCta{clusters, cl});
            if (tile == NO_MORE_TILES) break;
            if (tile == SKIP_STEP) continue;
            ok = tile >= 0 && tile < p.num_tiles;
            CHECK(ok, "%s: cluster %d step %d: tile %d of %d", what, cl, step, tile, p.num_tiles);
            if (!ok) break;
            FwdTile r[2] = {cta_tile_at(p, tile, 2, 0, c->block_m, c->block_n),
                            cta_tile_at(p, tile, 2, 1, c->block_m, c->block_n)};
            const FwdTile &a = r[0], &b = r[1];
            ok = a.batch == b.batch && a.head_kv == b.head_kv && a.group == b.group && a.split == 0 &&
                 b.split == 0 && a.n_begin == b.n_begin && a.n_end == b.n_end && a.u_begin == b.u_begin &&
                 a.u_end == b.u_end && b.m0 == a.m0 + c->block_m && (a.m0 + p.m_shift) % (2 * c->block_m) == 0 &&
                 b.m0 < p.rows && b.m0 >= 0;
            CHECK(ok, "%s: cluster %d step %d: ranks at (b %d, kv %d, m0 %d, blocks [%d, %d)) and (b %d, kv %d, m0 %d, "
                  "blocks [%d, %d))", what, cl, step, a.batch, a.head_kv, a.m0, a.n_begin, a.n_end, b.batch, b.head_kv,
                  b.m0, b.n_begin, b.n_end);
            for (int k = 0; k < 2 && ok; k++) {
                const FwdTile &t = r[k];
                int begin, end;
                key_block_range<false>(p, t, t.m0, c->block_m, c->block_n, begin, end);
                ok = begin == t.n_begin && end == t.n_end;
                CHECK(ok, "%s: rank %d at m0 %d needs blocks [%d, %d), walks [%d, %d)", what, k, t.m0, begin, end,
                      t.n_begin, t.n_end);
                for (int row = first_row(t.m0); row <= last_row<false>(p, t, t.m0, c->block_m) && ok; row++) {
                    int lo, hi;
                    key_range<false>(p, t, row, lo, hi);
                    if (lo > hi) continue;
                    int bad = masked_block_in(t.u_begin, t.u_end, lo, hi, c->block_n);
                    ok = lo / c->block_n >= t.n_begin && hi / c->block_n < t.n_end && bad < 0;
                    CHECK(ok, "%s: rank %d row %d keys [%d, %d]: blocks [%d, %d), unmasked [%d, %d)", what, k, row, lo,
                          hi, t.n_begin, t.n_end, t.u_begin, t.u_end);
                }
                if (ok) visits[(size_t)(t.batch * p.groups + t.group) * blocks + (t.m0 + p.m_shift) / c->block_m]++;
            }
        }
    for (int i = 0; i < pairs * blocks && ok; i++) {
        ok = visits[i] == 1;
        CHECK(ok, "%s: %d clusters: row block %d of pair %d visited %d times", what, clusters, i % blocks, i / blocks,
              visits[i]);
    }
    free(visits);
    return ok;
}

// The plan with clusters of two CTAs (fwd_params.h; FA3C_FWD_CLUSTER = 2
// builds): used exactly where the row blocks pair up (an even number of
// them, no split-KV, no mask or window), and then walked as the kernel's
// clusters would (walk_clusters). Returns 0 when something is wrong, else
// the cluster size.
static int check_cluster_plan(const plan_case *c) {
    const fa3c_problem problem = problem_of(c);   // the variable-length arrays: never paired (not built for them)
    const fa3c_problem *pr = &problem;
    fa3c_fwd_kernel_params p;
    memset(&p, 0, sizeof p);
    fa3c_fwd_plan_facts facts = {c->sms, c->l2_bytes, c->block_m, c->block_n, 2};
    int pack = fa3c_fwd_plan_pack(pr, c->block_m);
    char what[200];
    snprintf(what, sizeof what,
             "b %d hq %d hkv %d d %d sq %d sk %d causal %d window (%d,%d) splits %d sms %d", pr->batch,
             pr->heads_q, pr->heads_kv, pr->headdim, pr->seqlen_q, pr->seqlen_k, pr->causal, pr->window_left,
             pr->window_right, c->num_splits, c->sms);
    int ok = fa3c_fwd_plan_tiles(&p, pr, pack, c->num_splits, &facts) == FA3C_STATUS_OK;
    CHECK(ok, "%s: plan failed", what);
    if (!ok) return 0;
    const int blocks = (p.rows + c->block_m - 1) / c->block_m;   // row blocks of block_m per (batch, group)
    const int unmasked = !pr->causal && pr->window_left < 0 && pr->window_right < 0;
    const int can = unmasked && p.num_splits == 1 && blocks % 2 == 0 && !pr->seqused_k &&
                    !pr->cu_seqlens_q && !pr->cu_seqlens_k;
    ok = p.cluster == (can ? 2 : 1) && p.num_m_blocks * p.cluster == blocks && p.grid % p.cluster == 0 &&
         (c->sms <= 0 || !FA3C_FWD_PERSISTENT || p.grid <= c->sms);
    CHECK(ok, "%s: cluster %d (want %d), %d blocks of %d rows, grid %d", what, p.cluster, can ? 2 : 1,
          p.num_m_blocks, c->block_m * p.cluster, p.grid);
    if (!ok || p.cluster == 1) return ok;
    ok = walk_clusters(p, c, p.grid / 2, what) &&
         (!FA3C_FWD_PERSISTENT || walk_clusters(p, c, (p.grid / 2 * 2 + 2) / 3, what));
    return ok ? 2 : 0;
}

// One given problem without a mask, on `sms` SMs and a 50 MB L2.
static plan_case fixed_case(int headdim, int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int sms) {
    plan_case c;
    memset(&c, 0, sizeof c);
    c.pr.headdim = headdim;
    c.pr.batch = batch;
    c.pr.heads_q = heads_q;
    c.pr.heads_kv = heads_kv;
    c.pr.seqlen_q = seqlen_q;
    c.pr.seqlen_k = seqlen_k;
    c.pr.window_left = c.pr.window_right = -1;
    c.sms = sms;
    c.l2_bytes = 50 << 20;
    c.block_m = FA3C_FWD_BLOCK_M(headdim);
    c.block_n = FA3C_FWD_BLOCK_N(headdim);
    return c;
}

TEST(scheduler_decode_packs_and_splits) {
    // Decode with GQA: one packed tile per KV head, split to fill the SMs.
    plan_case c = fixed_case(128, 1, 64, 8, 1, 131072, 132);
    fa3c_fwd_kernel_params p;
    memset(&p, 0, sizeof p);
    fa3c_fwd_plan_facts facts = {c.sms, c.l2_bytes, c.block_m, c.block_n};
    int pack = fa3c_fwd_plan_pack(&c.pr, c.block_m);
    CHECK(pack == 8, "pack %d", pack);
    CHECK(fa3c_fwd_plan_tiles(&p, &c.pr, pack, 0, &facts) == FA3C_STATUS_OK, "plan");
    CHECK(p.num_tiles == 8 * 16 && p.num_splits == 16, "%d tiles, %d splits (want 128, 16)", p.num_tiles,
          p.num_splits);
    CHECK(check_plan(&c), "plan checks");
}

TEST(scheduler_cluster_pairs) {
    int paired = 0;
    for (int i = 0; i < 3000; i++) {
        plan_case c = random_case();
        c.varlen = i % 10 == 0;   // a tenth with seqused_k (and perhaps cu_seqlens), which must never pair
        c.packed_q = c.packed_q && c.varlen;
        c.packed_k = c.packed_k && c.varlen;
        if (i % 2) {   // half of them without a mask or split-KV, where clusters may apply
            c.pr.causal = 0;
            c.pr.window_left = c.pr.window_right = -1;
            c.num_splits = 1;
        }
        int cluster = check_cluster_plan(&c);
        if (!cluster) return;
        paired += cluster == 2;
    }
    CHECK(paired >= 300, "only %d of 3000 random plans used clusters", paired);
    // The grid's shapes without a mask: hdim 128 at 512 (4 row blocks per
    // head) pairs up; 1024 cluster tiles on 66 clusters.
    plan_case c = fixed_case(128, 32, 16, 16, 512, 512, 132);
    c.num_splits = 1;
    CHECK(check_cluster_plan(&c) == 2, "hdim 128, 512");
    fa3c_fwd_kernel_params p;
    memset(&p, 0, sizeof p);
    fa3c_fwd_plan_facts facts = {c.sms, c.l2_bytes, c.block_m, c.block_n, 2};
    CHECK(fa3c_fwd_plan_tiles(&p, &c.pr, 1, 1, &facts) == FA3C_STATUS_OK && p.cluster == 2 && p.num_tiles == 1024 &&
              p.grid == 132,
          "hdim 128, 512: cluster %d, %d tiles, grid %d (want 2, 1024, 132)", p.cluster, p.num_tiles, p.grid);
    // hdim 64 at 512: 3 row blocks of 192, which do not pair.
    c = fixed_case(64, 32, 32, 32, 512, 512, 132);
    fa3c_fwd_plan_facts facts64 = {c.sms, c.l2_bytes, c.block_m, c.block_n, 2};
    CHECK(fa3c_fwd_plan_tiles(&p, &c.pr, 1, 1, &facts64) == FA3C_STATUS_OK && p.cluster == 1,
          "hdim 64, 512: cluster %d", p.cluster);
}

TEST_MAIN()
