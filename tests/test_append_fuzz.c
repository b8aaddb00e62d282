/* Seeded random fuzzing of fa3c_append_kv on the CPU backend (issue 35; the
 * attention calls have tests/test_api_fuzz.c). Each base is a small valid
 * append: any dtype, contiguous or paged cache, new tokens packed or not,
 * rotary embedding with q rotated in place or into q_out. Each round applies
 * 1-3 random mutations (garbage scalars and enums, bad strides, NULL /
 * misaligned / aliasing pointers, garbage entries in cache_seqlens, the page
 * table, cu_seqlens_new and rotary_seqlens), then calls
 * fa3c_append_kv_check, fa3c_append_kv_check_device and fa3c_append_kv:
 *   - the status is a known one, the three agree, and a failure has a message;
 *   - the checks write nothing, a refused call writes nothing, and a
 *     successful call writes only the caches and q_out;
 *   - every buffer is its own exact allocation, so under ASan (CI's sanitizer
 *     stage) a read or write past one is reported.
 * The call is made only where the contract makes it memory-safe: a mutation
 * that makes a tensor reach further than its buffer (a larger size or stride,
 * a pointer into a smaller buffer) is the caller's bug, so those rounds get
 * the checks only. FA3C_FUZZ_ITERS: rounds (default 4000); FA3C_SEED replays. */
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

enum { B_K_NEW, B_V_NEW, B_K_CACHE, B_V_CACHE, B_Q, B_Q_OUT, B_COS, B_SIN, B_LENS, B_TABLE, B_CU, B_ROT, NBUF };
static const char *const buf_names[NBUF] = {"k_new", "v_new", "k_cache", "v_cache", "q", "q_out",
                                            "rotary_cos", "rotary_sin", "cache_seqlens", "page_table",
                                            "cu_seqlens_new", "rotary_seqlens"};
enum { SLACK = 8 };   /* spare entries after each host array */

typedef struct {
    void *buf[NBUF], *before[NBUF], *pristine[NBUF];   /* before: this round's; pristine: the base's */
    size_t bytes[NBUF];
    fa3c_append_params p0, p;
    int call_safe;   /* no mutation made anything reach past its buffer */
    char log[256];   /* the round's mutations, for a failure's report */
} fz;

static void *buf_new(fz *z, int i, size_t bytes) {
    z->bytes[i] = bytes ? bytes : 4;
    z->buf[i] = tu_alloc(z->bytes[i]);
    z->before[i] = tu_alloc(z->bytes[i]);
    z->pristine[i] = tu_alloc(z->bytes[i]);
    for (size_t k = 0; k < z->bytes[i]; k++) ((unsigned char *)z->buf[i])[k] = (unsigned char)tu_rand_int(0, 255);
    return z->buf[i];
}

static fa3c_tensor dense(void *data, int64_t n1, int64_t n2, int64_t n3) {
    return (fa3c_tensor){data, {n1 * n2 * n3, n2 * n3, n3, 1}};
}

static void base_build(fz *z) {
    memset(z, 0, sizeof *z);
    fa3c_append_params *p = &z->p0;
    fa3c_append_params_init(p);
    p->dtype = (fa3c_dtype)tu_rand_int(FA3C_DTYPE_FP32, FA3C_DTYPE_E4M3);
    const size_t es = tu_dtype_size(p->dtype);
    const int batch = tu_rand_int(1, 3), hkv = tu_rand_int(1, 2), d = 8 * tu_rand_int(1, 3);
    const int dv = tu_rand_int(0, 1) ? d : 8, cap = tu_rand_int(6, 14), new = tu_rand_int(1, 4);
    const int packed = tu_rand_int(0, 1), paged = tu_rand_int(0, 1);
    p->batch = batch, p->heads_kv = hkv, p->headdim = d, p->headdim_v = dv == d ? 0 : dv, p->seqlen_new = new;
    int32_t *cu = (int32_t *)buf_new(z, B_CU, (size_t)(batch + 1 + SLACK) * 4), counts[4];
    cu[0] = 0;
    for (int b = 0; b < batch; b++) counts[b] = packed ? tu_rand_int(0, new) : new, cu[b + 1] = cu[b] + counts[b];
    const int64_t rows_new = packed ? cu[batch] : (int64_t)batch * new;
    p->k_new = packed ? (fa3c_tensor){buf_new(z, B_K_NEW, (size_t)rows_new * hkv * d * es), {0, hkv * d, d, 1}}
                      : dense(buf_new(z, B_K_NEW, (size_t)rows_new * hkv * d * es), new, hkv, d);
    p->v_new = packed ? (fa3c_tensor){buf_new(z, B_V_NEW, (size_t)rows_new * hkv * dv * es), {0, hkv * dv, dv, 1}}
                      : dense(buf_new(z, B_V_NEW, (size_t)rows_new * hkv * dv * es), new, hkv, dv);
    if (packed) p->cu_seqlens_new = cu;
    int32_t *lens = (int32_t *)buf_new(z, B_LENS, (size_t)(batch + SLACK) * 4);
    for (int b = 0; b < batch; b++) lens[b] = tu_rand_int(0, cap - counts[b]);
    p->cache_seqlens = lens;
    int64_t outer = batch, rows = cap;
    if (paged) {
        const int ps = tu_rand_int(1, 4), per_seq = (cap + ps - 1) / ps, pages = batch * per_seq + tu_rand_int(0, 3);
        int32_t *table = (int32_t *)buf_new(z, B_TABLE, (size_t)(batch * per_seq + SLACK) * 4);
        for (int i = 0; i < batch * per_seq; i++) table[i] = i;   /* then shuffled */
        for (int i = batch * per_seq - 1; i > 0; i--) {
            const int j = tu_rand_int(0, i), t = table[i];
            table[i] = table[j], table[j] = t;
        }
        p->page_table = table, p->page_table_stride = per_seq, p->page_size = ps, p->num_pages = pages;
        outer = pages, rows = ps;
    } else {
        p->seqlen_cache = cap;
    }
    p->k_cache = dense(buf_new(z, B_K_CACHE, (size_t)(outer * rows * hkv * d) * es), rows, hkv, d);
    p->v_cache = dense(buf_new(z, B_V_CACHE, (size_t)(outer * rows * hkv * dv) * es), rows, hkv, dv);
    if (p->dtype != FA3C_DTYPE_E4M3 && tu_rand_int(0, 1)) {
        const int rd = 2 * tu_rand_int(1, d / 2), trows = cap + 4, sq = tu_rand_int(1, 4), hq = tu_rand_int(1, 4);
        p->rotary_dim = rd, p->rotary_rows = trows, p->rotary_interleaved = tu_rand_int(0, 1);
        p->rotary_cos = buf_new(z, B_COS, (size_t)trows * rd / 2 * es);
        p->rotary_sin = buf_new(z, B_SIN, (size_t)trows * rd / 2 * es);
        for (int64_t i = 0; i < (int64_t)trows * rd / 2; i++)   /* finite table values */
            tu_store(z->buf[B_COS], p->dtype, i, (float)tu_uniform()), tu_store(z->buf[B_SIN], p->dtype, i, (float)tu_uniform());
        if (tu_rand_int(0, 1)) {   /* positions of their own, inside the tables */
            int32_t *rot = (int32_t *)buf_new(z, B_ROT, (size_t)(batch + SLACK) * 4);
            for (int b = 0; b < batch; b++) rot[b] = tu_rand_int(0, trows - 4);
            p->rotary_seqlens = rot;
        }
        if (tu_rand_int(0, 3)) {
            p->q = dense(buf_new(z, B_Q, (size_t)batch * sq * hq * d * es), sq, hq, d);
            p->q_out = tu_rand_int(0, 1) ? p->q : dense(buf_new(z, B_Q_OUT, (size_t)batch * sq * hq * d * es), sq, hq, d);
            p->seqlen_q = sq, p->heads_q = hq, p->rotary_q_by_row = tu_rand_int(0, 1);
        }
    }
    /* Values that are valid numbers in every dtype (random bytes may be NaN: harmless, but keep them tidy). */
    for (int i = B_K_NEW; i <= B_Q_OUT; i++)
        if (z->buf[i] && i != B_Q_OUT) tu_fill_normal(z->buf[i], p->dtype, (int64_t)(z->bytes[i] / es), 1.f);
    for (int i = 0; i < NBUF; i++)
        if (z->buf[i]) memcpy(z->pristine[i], z->buf[i], z->bytes[i]);
}

static void base_free(fz *z) {
    for (int i = 0; i < NBUF; i++) free(z->buf[i]), free(z->before[i]), free(z->pristine[i]);
}

static int garbage_int(int old) {
    const int picks[9] = {-1, 0, 1, 2, old < INT_MAX ? old + 1 : 0, old > INT_MIN ? old - 1 : 0, INT_MAX, INT_MIN,
                          tu_rand_int(-5, 100)};
    return picks[tu_rand_int(0, 8)];
}

/* One mutation of z->p; clears call_safe where it could make a read or write reach past a buffer. */
static void mutate(fz *z) {
    fa3c_append_params *p = &z->p;
    const int kind = tu_rand_int(0, 4);
    const size_t used = strlen(z->log);
    snprintf(z->log + used, sizeof z->log - used, " %s", (const char *[]){"scalar", "enum", "stride", "pointer", "array entry"}[kind]);
    switch (kind) {
    case 0: {   /* a scalar: larger than before is check-only */
        int *f[13] = {&p->batch, &p->seqlen_new, &p->heads_kv, &p->headdim, &p->headdim_v, &p->seqlen_cache,
                      &p->page_size, &p->num_pages, &p->rotary_dim, &p->rotary_rows, &p->seqlen_q, &p->heads_q,
                      &p->rotary_interleaved};
        const int which = tu_rand_int(0, 12);
        int *x = f[which];
        const int old = *x;
        *x = garbage_int(old);
        snprintf(z->log + strlen(z->log), sizeof z->log - strlen(z->log), "[%d: %d -> %d]", which, old, *x);
        if (*x > old && x != &p->rotary_interleaved) z->call_safe = 0;
        if (x == &p->rotary_rows || x == &p->headdim_v) z->call_safe = 0;   /* reads further, or another v extent */
        break;
    }
    case 1: {   /* an enum or flag */
        const int which = tu_rand_int(0, 2);
        if (which == 0) {
            const fa3c_dtype old = p->dtype;
            p->dtype = (fa3c_dtype)tu_rand_int(-1, 5);
            snprintf(z->log + strlen(z->log), sizeof z->log - strlen(z->log), "[dtype %d -> %d]", (int)old, (int)p->dtype);
            if ((int)p->dtype >= 0 && (int)p->dtype <= 3 && tu_dtype_size(p->dtype) > tu_dtype_size(z->p0.dtype))
                z->call_safe = 0;
        } else if (which == 1) {
            p->backend = (fa3c_backend)tu_rand_int(-1, 5);
            if (p->backend == FA3C_BACKEND_CUDA) z->call_safe = 0;   /* host pointers: refused, but keep it simple */
        } else {
            p->rotary_q_by_row = garbage_int(p->rotary_q_by_row);
            z->call_safe = 0;   /* row by row reads further rows of the tables */
        }
        break;
    }
    case 2: {   /* a stride: a larger one reaches further */
        fa3c_tensor *t[6] = {&p->k_new, &p->v_new, &p->k_cache, &p->v_cache, &p->q, &p->q_out};
        fa3c_tensor *x = t[tu_rand_int(0, 5)];
        const int dim = tu_rand_int(0, 3);
        const int64_t old = x->stride[dim];
        const int64_t picks[6] = {0, 1, -1, old / 2, old + 1, INT64_MAX / 2};
        x->stride[dim] = picks[tu_rand_int(0, 5)];
        snprintf(z->log + strlen(z->log), sizeof z->log - strlen(z->log), "[tensor %d dim %d: %lld -> %lld]",
                 (int)(x - &p->k_new), dim, (long long)old, (long long)x->stride[dim]);
        if (x->stride[dim] > old || x->stride[dim] < 0) z->call_safe = 0;
        if (dim == 0 && p->page_table && x == &p->k_new) z->call_safe = 0;
        break;
    }
    case 3: {   /* a pointer: NULL, misaligned, or another buffer (aliasing) */
        const void **ptrs[12] = {(const void **)&p->k_new.data, (const void **)&p->v_new.data,
                                 (const void **)&p->k_cache.data, (const void **)&p->v_cache.data,
                                 (const void **)&p->q.data, (const void **)&p->q_out.data,
                                 &p->rotary_cos, &p->rotary_sin, (const void **)&p->cache_seqlens,
                                 (const void **)&p->page_table, (const void **)&p->cu_seqlens_new,
                                 (const void **)&p->rotary_seqlens};
        const int i = tu_rand_int(0, 11);
        const int how = tu_rand_int(0, 2);
        if (how == 0) *ptrs[i] = NULL;
        else if (how == 1 && *ptrs[i]) *ptrs[i] = (const char *)*ptrs[i] + 1;
        else *ptrs[i] = z->buf[tu_rand_int(0, NBUF - 1)];
        z->call_safe = 0;   /* the checks only: a pointer into a smaller buffer is the caller's bug */
        break;
    }
    default: {   /* an entry of a host array */
        int32_t *arrs[4] = {(int32_t *)z->buf[B_LENS], (int32_t *)z->buf[B_TABLE], (int32_t *)z->buf[B_CU],
                            (int32_t *)z->buf[B_ROT]};
        const int i = tu_rand_int(0, 3);
        if (!arrs[i]) break;
        const int n = (int)(z->bytes[B_LENS + i] / 4) - SLACK;
        int32_t *e = &arrs[i][tu_rand_int(0, n > 0 ? n - 1 : 0)];
        const int32_t old = *e;
        *e = garbage_int(old);
        snprintf(z->log + strlen(z->log), sizeof z->log - strlen(z->log), "[%s[%d]: %d -> %d]", buf_names[B_LENS + i],
                 (int)(e - arrs[i]), old, *e);
        /* more packed tokens than k_new holds: the caller's bug */
        if (i == 2 && e == &arrs[i][z->p0.batch] && *e > old) z->call_safe = 0;
        break;
    }
    }
}

/* The host arrays the checks read are inside their buffers (batch and the table's rows). */
static int arrays_readable(const fz *z) {
    const fa3c_append_params *p = &z->p;
    if (p->batch < 0 || p->batch > (int64_t)(z->bytes[B_LENS] / 4) - 1) return 0;
    const void *arrs[4] = {p->cache_seqlens, p->page_table, p->cu_seqlens_new, p->rotary_seqlens};
    const int64_t need[4] = {p->batch, p->page_table ? (int64_t)p->batch * p->page_table_stride : 0, p->batch + 1,
                             p->batch};
    for (int i = 0; i < 4; i++) {
        if (!arrs[i]) continue;
        int k = 0;
        while (k < NBUF && z->buf[k] != arrs[i]) k++;
        if (k == NBUF) return (uintptr_t)arrs[i] % 4 != 0;   /* misaligned: refused before it is read */
        if (need[i] * 4 > (int64_t)z->bytes[k]) return 0;
    }
    return 1;
}

static int64_t changed(const fz *z, int allow_outputs) {
    int64_t n = 0;
    for (int i = 0; i < NBUF; i++) {
        if (!z->buf[i]) continue;
        const int output = i == B_K_CACHE || i == B_V_CACHE || i == B_Q_OUT ||
                           (i == B_Q && z->p.q_out.data == z->buf[B_Q]);
        if (allow_outputs && output) continue;
        for (size_t k = 0; k < z->bytes[i]; k++) n += ((unsigned char *)z->buf[i])[k] != ((unsigned char *)z->before[i])[k];
    }
    return n;
}

static void snapshot(fz *z) {
    for (int i = 0; i < NBUF; i++)
        if (z->buf[i]) memcpy(z->before[i], z->buf[i], z->bytes[i]);
}

TEST(fuzz_append) {
    const long iters = tu_env_long("FA3C_FUZZ_ITERS", 4000);
    long calls = 0, check_only = 0, skipped = 0, ok = 0, failures = 0;
    fz z;
    for (long round = 0; round < iters && failures < 5; round++) {
        if (round % 8 == 0) {
            if (round) base_free(&z);
            base_build(&z);
        }
        z.p = z.p0;
        for (int i = 0; i < NBUF; i++)   /* the last round's calls and entry mutations undone */
            if (z.buf[i]) memcpy(z.buf[i], z.pristine[i], z.bytes[i]);
        z.call_safe = 1;
        z.log[0] = '\0';
        const int nmut = round % 8 == 0 ? 0 : tu_rand_int(1, 3);
        for (int k = 0; k < nmut; k++) mutate(&z);
        if (!arrays_readable(&z)) {
            skipped++;
            continue;
        }
        const int before_failures = harness_failures;
        snapshot(&z);
        const fa3c_status s1 = fa3c_append_kv_check(&z.p);
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", fa3c_last_error());
        const fa3c_status s1d = fa3c_append_kv_check_device(&z.p, NULL);
        CHECK(s1d == s1 && strcmp(msg, fa3c_last_error()) == 0, "check_device %s '%s', check %s '%s'",
              fa3c_status_string(s1d), fa3c_last_error(), fa3c_status_string(s1), msg);
        CHECK((int)s1 >= FA3C_STATUS_OK && (int)s1 <= FA3C_STATUS_INTERNAL_ERROR, "unknown status %d", (int)s1);
        CHECK((s1 == FA3C_STATUS_OK) == (msg[0] == '\0'), "check %s with message '%s'", fa3c_status_string(s1), msg);
        CHECK(changed(&z, 0) == 0, "a check wrote");
        if (nmut == 0) CHECK(s1 == FA3C_STATUS_OK, "the unmutated base was refused: %s", msg);
        ok += s1 == FA3C_STATUS_OK;
        if (getenv("FA3C_FUZZ_TRACE")) fprintf(stderr, "round %ld:%s -> %s\n", round, z.log, fa3c_status_string(s1));
        if (s1 == FA3C_STATUS_OK && !z.call_safe) {
            check_only++;
        } else {
            const fa3c_status s2 = fa3c_append_kv(&z.p, NULL);
            calls++;
            CHECK(s2 == s1, "check said %s, the call %s (%s)", fa3c_status_string(s1), fa3c_status_string(s2),
                  fa3c_last_error());
            CHECK(changed(&z, s2 == FA3C_STATUS_OK) == 0, "the call (%s) wrote outside its outputs",
                  fa3c_status_string(s2));
        }
        if (harness_failures != before_failures) {
            failures++;
            fprintf(stderr, "  round %ld (%d mutations:%s), base dtype %d batch %d paged %d packed %d rotary %d q %d\n",
                    round, nmut, z.log, (int)z.p0.dtype, z.p0.batch, z.p0.page_table != NULL, z.p0.cu_seqlens_new != NULL,
                    z.p0.rotary_dim, z.p0.q.data != NULL);
        }
    }
    base_free(&z);
    printf("  fuzz_append: %ld rounds; %ld accepted by the check; %ld calls, %ld check-only, %ld skipped (arrays "
           "too short)\n", iters, ok, calls, check_only, skipped);
    CHECK(calls > iters / 4, "only %ld of %ld rounds made a call", calls, iters);
}

TEST_MAIN()
