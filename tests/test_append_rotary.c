/* fa3c_append_kv's optional parts on the CPU backend: rotary embedding of
 * the new keys and of q (interleaved and GPT-NeoX pairs, rotary_dim below the
 * head dim, positions from cache_seqlens or rotary_seqlens, queries at one
 * position or row by row, q rotated in place or into q_out) against a float64
 * rotation; packed new tokens (cu_seqlens_new, a sequence with none); FA3's
 * cache_batch_idx written as a page table of one page per sequence; and the
 * refusals of the new fields by name, with nothing written.
 * tests/gpu/test_append_gpu.cu runs the same calls on the GPU against this
 * backend. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

enum { B = 3, NEW = 4, H = 2, HQ = 4, SQ = 3, D = 32, ROWS = 24, TROWS = 40 };

typedef struct {
    fa3c_dtype dt;
    size_t es;
    void *k_new, *v_new, *k_cache, *v_cache, *q, *q_out, *cos, *sin;
    int32_t lens[B], rot_pos[B], cu[B + 1];
} fixture;

/* A contiguous cache (B sequences of ROWS rows), new tokens (B, NEW), q (B, SQ, HQ, D),
 * rotary tables of TROWS rows at angles pos · 10000^(-f / half). */
static fa3c_append_params setup(fixture *f, fa3c_dtype dt, int rotary_dim, int interleaved) {
    f->dt = dt;
    f->es = tu_dtype_size(dt);
    const size_t kv = (size_t)B * NEW * H * D, cache = (size_t)B * ROWS * H * D, q = (size_t)B * SQ * HQ * D;
    f->k_new = tu_alloc(kv * f->es), f->v_new = tu_alloc(kv * f->es);
    f->k_cache = tu_alloc(cache * f->es), f->v_cache = tu_alloc(cache * f->es);
    f->q = tu_alloc(q * f->es), f->q_out = tu_alloc(q * f->es);
    tu_fill_normal(f->k_new, dt, (int64_t)kv, 1.f);
    tu_fill_normal(f->v_new, dt, (int64_t)kv, 1.f);
    tu_fill_normal(f->k_cache, dt, (int64_t)cache, 1.f);
    tu_fill_normal(f->v_cache, dt, (int64_t)cache, 1.f);
    tu_fill_normal(f->q, dt, (int64_t)q, 1.f);
    tu_poison(f->q_out, q * f->es);
    const int half = rotary_dim / 2 > 0 ? rotary_dim / 2 : 1;
    f->cos = tu_alloc((size_t)TROWS * half * f->es), f->sin = tu_alloc((size_t)TROWS * half * f->es);
    for (int t = 0; t < TROWS; t++)
        for (int i = 0; i < half; i++) {
            const double a = t * pow(10000.0, -(double)i / half);
            tu_store(f->cos, dt, (int64_t)t * half + i, (float)cos(a));
            tu_store(f->sin, dt, (int64_t)t * half + i, (float)sin(a));
        }
    const int32_t lens[B] = {0, 9, 20}, rot[B] = {3, 0, 30};
    memcpy(f->lens, lens, sizeof lens);
    memcpy(f->rot_pos, rot, sizeof rot);

    fa3c_append_params p;
    fa3c_append_params_init(&p);
    p.dtype = dt;
    p.batch = B, p.seqlen_new = NEW, p.heads_kv = H, p.headdim = D;
    p.k_new = tu_tensor(f->k_new, B, NEW, H, D);
    p.v_new = tu_tensor(f->v_new, B, NEW, H, D);
    p.k_cache = tu_tensor(f->k_cache, B, ROWS, H, D);
    p.v_cache = tu_tensor(f->v_cache, B, ROWS, H, D);
    p.seqlen_cache = ROWS;
    p.cache_seqlens = f->lens;
    if (rotary_dim) {
        p.rotary_dim = rotary_dim, p.rotary_rows = TROWS, p.rotary_interleaved = interleaved;
        p.rotary_cos = f->cos, p.rotary_sin = f->sin;
        p.q = tu_tensor(f->q, B, SQ, HQ, D), p.q_out = tu_tensor(f->q_out, B, SQ, HQ, D);
        p.seqlen_q = SQ, p.heads_q = HQ;
    }
    return p;
}

static void release(fixture *f) {
    free(f->k_new), free(f->v_new), free(f->k_cache), free(f->v_cache), free(f->q), free(f->q_out), free(f->cos),
        free(f->sin);
}

/* Row `got` (D elements) against row `x` rotated in float64 at table row pos:
 * rotated columns within the dtype's rounding, the rest bit for bit. */
static int row_ok(const fa3c_append_params *p, const void *x, const void *got, int64_t pos) {
    const fa3c_dtype dt = p->dtype;
    const int half = p->rotary_dim / 2;
    const double ulp = dt == FA3C_DTYPE_FP32 ? 0x1p-22 : dt == FA3C_DTYPE_BF16 ? 0x1p-7 : 0x1p-10;
    int ok = 1;
    for (int i = 0; i < half; i++) {
        const int i0 = p->rotary_interleaved ? 2 * i : i, i1 = p->rotary_interleaved ? 2 * i + 1 : i + half;
        const double c = tu_load(p->rotary_cos, dt, pos * half + i), s = tu_load(p->rotary_sin, dt, pos * half + i);
        const double x0 = tu_load(x, dt, i0), x1 = tu_load(x, dt, i1);
        const double r0 = x0 * c - x1 * s, r1 = x0 * s + x1 * c, tol = ulp * (fabs(x0) + fabs(x1)) + 1e-30;
        ok &= fabs(tu_load(got, dt, i0) - r0) <= tol && fabs(tu_load(got, dt, i1) - r1) <= tol;
    }
    const size_t es = tu_dtype_size(dt);
    return ok && memcmp((const char *)x + 2 * half * es, (const char *)got + 2 * half * es, (D - 2 * half) * es) == 0;
}

static void *at(const fa3c_tensor *t, int64_t b, int64_t s, int64_t h, size_t es) {
    return (char *)t->data + (b * t->stride[0] + s * t->stride[1] + h * t->stride[2]) * es;
}

/* One rotary call: every key row (rotated), value row (copied) and query row. */
static void rotary_case(fa3c_dtype dt, int rotary_dim, int interleaved, int by_row, int use_rot_pos, int in_place) {
    fixture f;
    fa3c_append_params p = setup(&f, dt, rotary_dim, interleaved);
    p.rotary_q_by_row = by_row;
    if (use_rot_pos) p.rotary_seqlens = f.rot_pos;
    const size_t qb = (size_t)B * SQ * HQ * D * f.es;
    void *q_before = tu_alloc(qb);
    memcpy(q_before, f.q, qb);
    if (in_place) p.q_out = p.q;
    const fa3c_tensor q_ref = tu_tensor(q_before, B, SQ, HQ, D);
    const fa3c_status s = fa3c_append_kv(&p, NULL);
    CHECK(s == FA3C_STATUS_OK, "rotary append: %s", fa3c_last_error());
    int bad = 0;
    for (int b = 0; b < B; b++) {
        const int64_t pos0 = use_rot_pos ? f.rot_pos[b] : f.lens[b];
        for (int j = 0; j < NEW; j++)
            for (int h = 0; h < H; h++) {
                bad += !row_ok(&p, at(&p.k_new, b, j, h, f.es), at(&p.k_cache, b, f.lens[b] + j, h, f.es), pos0 + j);
                bad += memcmp(at(&p.v_new, b, j, h, f.es), at(&p.v_cache, b, f.lens[b] + j, h, f.es), D * f.es) != 0;
            }
        for (int i = 0; i < SQ; i++)
            for (int h = 0; h < HQ; h++)
                bad += !row_ok(&p, at(&q_ref, b, i, h, f.es), at(&p.q_out, b, i, h, f.es), pos0 + (by_row ? i : 0));
    }
    CHECK(bad == 0, "%s rotary_dim %d %s, q %s, positions from %s, %s: %d rows wrong", tu_dtype_name(dt), rotary_dim,
          interleaved ? "interleaved" : "NeoX", by_row ? "by row" : "at one position",
          use_rot_pos ? "rotary_seqlens" : "cache_seqlens", in_place ? "in place" : "into q_out", bad);
    free(q_before);
    release(&f);
}

TEST(rotary_matches_float64) {
    const fa3c_dtype dts[3] = {FA3C_DTYPE_BF16, FA3C_DTYPE_FP16, FA3C_DTYPE_FP32};
    for (int t = 0; t < 3; t++)
        for (int inter = 0; inter < 2; inter++) {
            rotary_case(dts[t], D, inter, 1, 0, 0);
            rotary_case(dts[t], D / 2, inter, 0, 1, 1);
            rotary_case(dts[t], 6, inter, 1, 1, 0);
        }
}

/* Packed new tokens: sequence b appends rows cu[b] .. cu[b + 1] - 1 (lengths 3, 0, 4). */
TEST(packed_new_tokens) {
    for (int paged = 0; paged < 2; paged++) {
        fixture f;
        fa3c_append_params p = setup(&f, FA3C_DTYPE_BF16, 0, 0);
        const int32_t cu[B + 1] = {0, 3, 3, 7};
        memcpy(f.cu, cu, sizeof cu);
        p.cu_seqlens_new = f.cu;
        p.k_new = tu_tensor(f.k_new, 1, B * NEW, H, D);
        p.v_new = tu_tensor(f.v_new, 1, B * NEW, H, D);
        int32_t table[B * 6];
        if (paged) {   /* the cache's rows as 18 pages of 4, 6 per sequence, reversed */
            for (int i = 0; i < B * 6; i++) table[i] = B * 6 - 1 - i;
            p.page_table = table, p.page_table_stride = 6, p.page_size = 4, p.num_pages = B * 6;
            p.k_cache = tu_tensor(f.k_cache, B * 6, 4, H, D);
            p.v_cache = tu_tensor(f.v_cache, B * 6, 4, H, D);
        }
        const size_t cb = (size_t)B * ROWS * H * D * f.es;
        char *k = (char *)tu_alloc(cb), *v = (char *)tu_alloc(cb);
        memcpy(k, f.k_cache, cb), memcpy(v, f.v_cache, cb);
        const size_t row = (size_t)H * D * f.es;
        for (int b = 0; b < B; b++)
            for (int j = 0; j < cu[b + 1] - cu[b]; j++) {
                const int64_t pos = f.lens[b] + j;
                const int64_t r = paged ? (int64_t)table[b * 6 + pos / 4] * 4 + pos % 4 : (int64_t)b * ROWS + pos;
                memcpy(k + r * row, (char *)f.k_new + (cu[b] + j) * row, row);
                memcpy(v + r * row, (char *)f.v_new + (cu[b] + j) * row, row);
            }
        CHECK(fa3c_append_kv(&p, NULL) == FA3C_STATUS_OK, "packed append: %s", fa3c_last_error());
        CHECK(memcmp(k, f.k_cache, cb) == 0 && memcmp(v, f.v_cache, cb) == 0,
              "%s cache: not the packed rows at the filled lengths with every other byte kept", paged ? "paged" : "contiguous");
        free(k), free(v);
        release(&f);
    }
}

/* FA3's cache_batch_idx = {2, 0, 3} over a cache of 4 sequences: a page table of
 * one page (of seqlen_cache rows) per sequence. */
TEST(cache_batch_idx_as_a_page_table) {
    fixture f;
    fa3c_append_params p = setup(&f, FA3C_DTYPE_BF16, 0, 0);
    const size_t row = (size_t)H * D * f.es, cb = (size_t)4 * ROWS * row;
    void *kc = tu_alloc(cb), *vc = tu_alloc(cb);
    tu_fill_normal(kc, f.dt, 4 * ROWS * H * D, 1.f);
    tu_fill_normal(vc, f.dt, 4 * ROWS * H * D, 1.f);
    int32_t idx[B] = {2, 0, 3};
    p.k_cache = tu_tensor(kc, 4, ROWS, H, D), p.v_cache = tu_tensor(vc, 4, ROWS, H, D);
    p.page_table = idx, p.page_table_stride = 1, p.page_size = ROWS, p.num_pages = 4;
    char *k = (char *)tu_alloc(cb), *v = (char *)tu_alloc(cb);
    memcpy(k, kc, cb), memcpy(v, vc, cb);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < NEW; j++) {
            memcpy(k + ((size_t)idx[b] * ROWS + f.lens[b] + j) * row, (char *)f.k_new + ((size_t)b * NEW + j) * row, row);
            memcpy(v + ((size_t)idx[b] * ROWS + f.lens[b] + j) * row, (char *)f.v_new + ((size_t)b * NEW + j) * row, row);
        }
    CHECK(fa3c_append_kv(&p, NULL) == FA3C_STATUS_OK, "cache_batch_idx append: %s", fa3c_last_error());
    CHECK(memcmp(k, kc, cb) == 0 && memcmp(v, vc, cb) == 0, "rows not in the cache rows cache_batch_idx names");
    free(k), free(v), free(kc), free(vc);
    release(&f);
}

/* A refused call names the field and writes nothing (caches and q_out). */
static void expect_refused(fixture *f, const fa3c_append_params *p, fa3c_status want, const char *needle) {
    const size_t cb = (size_t)B * ROWS * H * D * f->es, qb = (size_t)B * SQ * HQ * D * f->es;
    char *k = (char *)tu_alloc(cb), *q = (char *)tu_alloc(qb);
    memcpy(k, f->k_cache, cb), memcpy(q, f->q_out, qb);
    const fa3c_status c = fa3c_append_kv_check(p), s = fa3c_append_kv(p, NULL);
    CHECK(c == want && s == want, "'%s': check %s, call %s", needle, fa3c_status_string(c), fa3c_status_string(s));
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "message '%s' lacks '%s'", fa3c_last_error(), needle);
    CHECK(memcmp(k, f->k_cache, cb) == 0 && memcmp(q, f->q_out, qb) == 0, "'%s': a refused call wrote", needle);
    free(k), free(q);
}

TEST(bad_optional_fields_are_refused) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    fixture f;
    fa3c_append_params p = setup(&f, FA3C_DTYPE_BF16, D, 1), x;
    x = p, x.rotary_rows = 22;   /* sequence 2 needs rows 20 .. 23 */
    expect_refused(&f, &x, BAD, "cache_seqlens[2]: rotary positions 20 to 23");
    x = p, x.rotary_seqlens = f.rot_pos, x.rotary_q_by_row = 1;   /* 30 + 3 >= 32 */
    x.rotary_rows = 32;
    expect_refused(&f, &x, BAD, "rotary_seqlens[2]: rotary positions 30 to 33");
    x = p, x.rotary_dim = 7;
    expect_refused(&f, &x, BAD, "rotary_dim");
    x = p, x.rotary_dim = D + 2;
    expect_refused(&f, &x, BAD, "rotary_dim");
    x = p, x.rotary_sin = NULL;
    expect_refused(&f, &x, BAD, "rotary_sin");
    x = p, x.rotary_stride = D / 2 - 1;
    expect_refused(&f, &x, BAD, "rotary_stride");
    x = p, x.rotary_interleaved = 2;
    expect_refused(&f, &x, BAD, "rotary_interleaved");
    x = p, x.rotary_dim = 0, x.rotary_cos = x.rotary_sin = NULL;
    expect_refused(&f, &x, BAD, "q: given with rotary_dim = 0");
    x = p, x.seqlen_q = 0;
    expect_refused(&f, &x, BAD, "seqlen_q");
    x = p, x.q_out.data = (char *)f.q + 2 * f.es;   /* shifted by two elements: neither q nor apart */
    expect_refused(&f, &x, BAD, "q_out: overlaps q");
    x = p, x.q_out.data = f.k_cache;
    expect_refused(&f, &x, BAD, "overlaps");
    x = p, x.dtype = FA3C_DTYPE_E4M3;
    expect_refused(&f, &x, FA3C_STATUS_NOT_SUPPORTED, "E4M3");
    x = p;
    const int32_t decreasing[B + 1] = {0, 3, 2, 7}, too_long[B + 1] = {0, 5, 5, 7};
    memcpy(f.cu, decreasing, sizeof decreasing);
    x.cu_seqlens_new = f.cu;
    expect_refused(&f, &x, BAD, "cu_seqlens_new: must be non-decreasing");
    memcpy(f.cu, too_long, sizeof too_long);
    expect_refused(&f, &x, BAD, "cu_seqlens_new: sequence 0 has length 5");
    /* No new tokens, but q: q alone is rotated. */
    x = p, x.seqlen_new = 0;
    CHECK(fa3c_append_kv(&x, NULL) == FA3C_STATUS_OK, "q without new tokens: %s", fa3c_last_error());
    CHECK(row_ok(&x, f.q, f.q_out, f.lens[0]), "q without new tokens: not rotated at cache_seqlens[0]");
    release(&f);
}

TEST_MAIN()
