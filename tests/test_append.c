/* fa3c_append_kv on the CPU backend: new tokens land at each sequence's
 * filled length, in its rows of a contiguous cache or through its pages
 * (across page boundaries), with v of its own head dim and strided inputs;
 * every other byte of the caches is left as it was; bad lengths and page
 * entries are refused by name with nothing written; the check functions agree
 * with the call. tests/gpu/test_append_gpu.cu runs the same on the GPU. */
#include <stdint.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

enum { B = 3, NEW = 5, H = 2, D = 16, DV = 8, ES = 2 };

typedef struct {
    uint16_t *k_new, *v_new, *k_cache, *v_cache;
    size_t cache_rows;   /* outer x rows of each cache */
    int32_t lens[B];
    int32_t table[B * 8];
} fixture;

/* bf16 bit patterns (any 16-bit values copy the same way) */
static void fill(uint16_t *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (uint16_t)tu_rand_int(0, 0xFFFF);
}

/* k_new with a padded token row (stride[1] = H * D + 3), v_new packed. */
static fa3c_append_params setup(fixture *f, int paged) {
    fa3c_append_params p;
    fa3c_append_params_init(&p);
    p.dtype = FA3C_DTYPE_BF16;
    p.batch = B;
    p.seqlen_new = NEW;
    p.heads_kv = H;
    p.headdim = D;
    p.headdim_v = DV;
    const int64_t k_row = H * D + 3;
    f->k_new = (uint16_t *)tu_alloc((size_t)B * NEW * k_row * ES);
    f->v_new = (uint16_t *)tu_alloc((size_t)B * NEW * H * DV * ES);
    fill(f->k_new, (size_t)B * NEW * k_row);
    fill(f->v_new, (size_t)B * NEW * H * DV);
    p.k_new = (fa3c_tensor){f->k_new, {NEW * k_row, k_row, D, 1}};
    p.v_new = (fa3c_tensor){f->v_new, {NEW * H * DV, H * DV, DV, 1}};
    const int32_t lens[B] = {0, 7, 19};   /* empty, mid-page, and the last rows of the cache (24 = 19 + 5) */
    memcpy(f->lens, lens, sizeof lens);
    p.cache_seqlens = f->lens;
    if (paged) {   /* pages of 3 rows, 8 per sequence (24 rows), shuffled; 30 pages */
        const int PS = 3, PAGES = 30;
        for (int i = 0; i < B * 8; i++) f->table[i] = (i * 7 + 3) % PAGES;
        f->cache_rows = (size_t)PAGES * PS;
        p.page_table = f->table;
        p.page_table_stride = 8;
        p.page_size = PS;
        p.num_pages = PAGES;
        f->table[0 * 8 + 5] = -1;   /* past sequence 0's new rows: never read */
        p.k_cache = (fa3c_tensor){NULL, {PS * H * D, H * D, D, 1}};
        p.v_cache = (fa3c_tensor){NULL, {PS * H * DV, H * DV, DV, 1}};
    } else {
        p.seqlen_cache = 24;
        f->cache_rows = (size_t)B * 24;
        p.k_cache = (fa3c_tensor){NULL, {24 * H * D, H * D, D, 1}};
        p.v_cache = (fa3c_tensor){NULL, {24 * H * DV, H * DV, DV, 1}};
    }
    f->k_cache = (uint16_t *)tu_alloc(f->cache_rows * H * D * ES);
    f->v_cache = (uint16_t *)tu_alloc(f->cache_rows * H * DV * ES);
    fill(f->k_cache, f->cache_rows * H * D);
    fill(f->v_cache, f->cache_rows * H * DV);
    p.k_cache.data = f->k_cache;
    p.v_cache.data = f->v_cache;
    return p;
}

static void release(fixture *f) {
    free(f->k_new), free(f->v_new), free(f->k_cache), free(f->v_cache);
}

/* The caches as they must be after the append, from copies of before. */
static void expected(const fa3c_append_params *p, uint16_t *k, uint16_t *v) {
    for (int b = 0; b < B; b++)
        for (int j = 0; j < NEW; j++) {
            int64_t pos = p->cache_seqlens[b] + j, outer = b, row = pos;
            if (p->page_table) {
                outer = p->page_table[b * p->page_table_stride + pos / p->page_size];
                row = pos % p->page_size;
            }
            for (int h = 0; h < H; h++) {
                const int64_t *ks = p->k_cache.stride, *vs = p->v_cache.stride, *kn = p->k_new.stride, *vn = p->v_new.stride;
                memcpy(k + outer * ks[0] + row * ks[1] + h * ks[2],
                       (const uint16_t *)p->k_new.data + b * kn[0] + j * kn[1] + h * kn[2], D * ES);
                memcpy(v + outer * vs[0] + row * vs[1] + h * vs[2],
                       (const uint16_t *)p->v_new.data + b * vn[0] + j * vn[1] + h * vn[2], DV * ES);
            }
        }
}

static void run(int paged) {
    fixture f;
    fa3c_append_params p = setup(&f, paged);
    const size_t kb = f.cache_rows * H * D * ES, vb = f.cache_rows * H * DV * ES;
    uint16_t *k = (uint16_t *)tu_alloc(kb), *v = (uint16_t *)tu_alloc(vb);
    memcpy(k, f.k_cache, kb);
    memcpy(v, f.v_cache, vb);
    expected(&p, k, v);
    CHECK(fa3c_append_kv_check(&p) == FA3C_STATUS_OK, "check: %s", fa3c_last_error());
    CHECK(fa3c_append_kv_check_device(&p, NULL) == FA3C_STATUS_OK, "check_device: %s", fa3c_last_error());
    fa3c_status s = fa3c_append_kv(&p, NULL);
    CHECK(s == FA3C_STATUS_OK, "append (%s): %s", paged ? "paged" : "contiguous", fa3c_last_error());
    CHECK(memcmp(k, f.k_cache, kb) == 0 && memcmp(v, f.v_cache, vb) == 0,
          "%s cache: not the new rows at the filled lengths with every other byte kept", paged ? "paged" : "contiguous");
    free(k), free(v);
    release(&f);
}

TEST(contiguous_cache) { run(0); }
TEST(paged_cache_across_pages) { run(1); }

/* A refused call names what is wrong and writes nothing. */
static void expect_refused(fixture *f, const fa3c_append_params *p, const char *needle) {
    const size_t kb = f->cache_rows * H * D * ES;
    uint16_t *k = (uint16_t *)tu_alloc(kb);
    memcpy(k, f->k_cache, kb);
    fa3c_status c = fa3c_append_kv_check(p), s = fa3c_append_kv(p, NULL);
    CHECK(c == FA3C_STATUS_INVALID_ARGUMENT && s == c, "'%s': check %s, call %s", needle, fa3c_status_string(c),
          fa3c_status_string(s));
    CHECK(strstr(fa3c_last_error(), needle) != NULL, "message '%s' lacks '%s'", fa3c_last_error(), needle);
    CHECK(memcmp(k, f->k_cache, kb) == 0, "'%s': a refused append wrote the cache", needle);
    free(k);
}

TEST(bad_inputs_are_refused) {
    fixture f;
    fa3c_append_params p = setup(&f, 1), x;
    x = p;
    f.lens[2] = 20;   /* 20 + 5 > 24 rows */
    expect_refused(&f, &x, "cache_seqlens[2]");
    f.lens[2] = 19;
    f.lens[1] = -1;
    expect_refused(&f, &x, "cache_seqlens[1]");
    f.lens[1] = 7;
    f.table[1 * 8 + 3] = 30;   /* sequence 1 writes rows 7..11: pages 2 and 3 */
    expect_refused(&f, &x, "page_table[1][3]");
    f.table[1 * 8 + 3] = 4;
    x = p;
    x.cache_seqlens = NULL;
    expect_refused(&f, &x, "cache_seqlens");
    x = p;
    x.k_new.data = (char *)f.k_cache + 64;   /* the new rows inside the cache */
    expect_refused(&f, &x, "k_cache: overlaps k_new");
    x = p;
    x.k_cache.stride[3] = 2;
    expect_refused(&f, &x, "k_cache: stride of dim 3");
    x = p;
    x.v_cache.stride[1] = 1;   /* rows over each other */
    expect_refused(&f, &x, "v_cache: stride");
    x = p;
    x.headdim = 0;
    expect_refused(&f, &x, "headdim");
    CHECK(fa3c_append_kv(NULL, NULL) == FA3C_STATUS_INVALID_ARGUMENT, "NULL params");
    /* Nothing to write: OK, nothing read (even with NULL tensors). */
    fa3c_append_params e;
    fa3c_append_params_init(&e);
    e.heads_kv = 1, e.headdim = 8, e.seqlen_cache = 4, e.cache_seqlens = f.lens;
    CHECK(fa3c_append_kv(&e, NULL) == FA3C_STATUS_OK, "an empty append: %s", fa3c_last_error());
    release(&f);
}

TEST_MAIN()
