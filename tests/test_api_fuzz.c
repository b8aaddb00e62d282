/* Seeded random fuzzing of the public API on the CPU backends (issue 35; no
 * libFuzzer needed). Each base is a small valid forward or backward call
 * (fp32/fp16/bf16, e4m3 forwards; GQA, masks, softcap, padded and transposed
 * layouts, cu_seqlens, seqused_k, paged KV, qv) whose every tensor and array has
 * its own block between guard zones. Each round applies 1-3 random mutations
 * (boundary and garbage scalars and enums, bad strides, NULL / misaligned /
 * aliasing / wild pointers, broken cu_seqlens, seqused_k and page tables,
 * descales with other dtypes), then calls fa3c_*_check and fa3c_* (stream
 * NULL). Whatever the mutation:
 *   - the status is a known fa3c_status, and the check and the call agree;
 *   - a failure has a message and leaves every byte as it was;
 *   - the check writes nothing; a success writes every element of the
 *     outputs and nothing else, and leaves an empty message;
 *   - under ASan everything outside what the call may read is poisoned while
 *     it runs (guards and slack; for the check and a refused call, everything
 *     but the host arrays' entries), so a stray read is reported too.
 * The call is made only where the contract makes it memory-safe: a pointer
 * shifted past its buffer or a batch larger than the arrays is the caller's
 * bug, so such params get the check only (or nothing, where even the check
 * would read past a host array).
 * FA3C_FUZZ_ITERS: mutated calls per case (default 4000); FA3C_SEED replays a
 * run, FA3C_FUZZ_ONLY=<base> one base of it (as printed on a failure). */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include "harness.h"
#include "testutil.h"
#include "fa3c.h"

#if defined(__SANITIZE_ADDRESS__)
#define FZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FZ_ASAN 1
#endif
#endif
#ifdef FZ_ASAN
#include <sanitizer/asan_interface.h>
#define fz_poison(p, n) __asan_poison_memory_region((p), (n))
#define fz_unpoison(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define fz_poison(p, n) ((void)(p), (void)(n))
#define fz_unpoison(p, n) ((void)(p), (void)(n))
#endif

/* ---- guarded blocks ------------------------------------------------------- */

enum { R_Q, R_K, R_V, R_OUT, R_DOUT, R_DQ, R_DK, R_DV, R_LSE, R_CUQ, R_CUK, R_USED, R_PT, R_DSQ, R_DSK, R_DSV, R_QV, NREG };
static const char *const region_names[NREG] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv", "lse",
                                               "cu_q", "cu_k", "used", "pages", "q_ds", "k_ds", "v_ds", "qv"};

enum {
    GUARD = 64,        /* bytes before every payload (and at least this many after) */
    GUARD_BYTE = 0xa5, /* guards and unused slack */
    OUT_BYTE = 0xff,   /* outputs before a call: all-ones is NaN in every dtype, so an unwritten element shows */
    SLACK = 8,         /* spare entries after each host array (a slightly larger batch still fits) */
    ROUNDS = 8,        /* mutated rounds per base */
    MAX_FAILING = 5    /* failing rounds before a case gives up */
};

typedef struct {
    unsigned char *base, *data; /* block = guard | payload | guard (+ rounding); data = base + GUARD */
    size_t bytes, total;        /* payload, whole block */
    unsigned char *pristine, *before, *mask; /* block copies; mask: bytes a successful call may write */
} region;

static void region_alloc(region *r, size_t bytes) {
    if (bytes == 0) bytes = 4; /* an empty tensor still gets an address */
    r->bytes = bytes;
    r->total = GUARD + (bytes + 63) / 64 * 64 + GUARD;
    r->base = (unsigned char *)aligned_alloc(64, r->total);
    if (!r->base) abort();
    r->data = r->base + GUARD;
    r->pristine = (unsigned char *)tu_alloc(r->total);
    r->before = (unsigned char *)tu_alloc(r->total);
    r->mask = (unsigned char *)tu_alloc(r->total);
    memset(r->base, GUARD_BYTE, r->total);
}

static void region_free(region *r) {
    if (!r->base) return;
    free(r->base);
    free(r->pristine);
    free(r->before);
    free(r->mask);
    memset(r, 0, sizeof *r);
}

/* ---- one fuzzed call ---------------------------------------------------------- */

typedef struct {
    int bwd;
    region r[NREG];
    fa3c_fwd_params f0, f; /* base and mutated */
    fa3c_bwd_params g0, g;
    int cap_cu, cap_used, cap_pt, cap_ds; /* host array capacities, in entries */
    int clean;  /* no dtype change and no pointer moved into another block: outputs must be fully written */
    char log[1024];
    size_t loglen;
} fz;

typedef struct {
    long rounds, calls, check_only, unreadable, failing;
    long status[8];
} fz_stats;

static uint64_t fz_seed;

static void fz_log(fz *z, const char *fmt, ...) {
    if (z->loglen >= sizeof z->log - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(z->log + z->loglen, sizeof z->log - z->loglen, fmt, ap);
    va_end(ap);
    if (n > 0) z->loglen += (size_t)n;
    if (z->loglen > sizeof z->log - 1) z->loglen = sizeof z->log - 1;
}

static fa3c_problem *prob(fz *z) { return z->bwd ? &z->g.problem : &z->f.problem; }
static fa3c_backend *backend_of(fz *z) { return z->bwd ? &z->g.backend : &z->f.backend; }
static const fa3c_problem *base_problem(const fz *z) { return z->bwd ? &z->g0.problem : &z->f0.problem; }

static int dsize(fa3c_dtype dt) { return dt == FA3C_DTYPE_FP32 ? 4 : dt == FA3C_DTYPE_E4M3 ? 1 : 2; }

/* A tensor argument: which rows it has (as the API indexes them), whether it is written. */
enum { KQ, KK, KDK };
typedef struct {
    const char *name;
    fa3c_tensor *t;
    int kind, out, reg;
} targ;

static int tensors_of(fz *z, targ *a) {
    if (z->bwd) {
        fa3c_bwd_params *g = &z->g;
        const targ t[8] = {{"q", &g->q, KQ, 0, R_Q},       {"k", &g->k, KK, 0, R_K},       {"v", &g->v, KK, 0, R_V},
                           {"out", &g->out, KQ, 0, R_OUT}, {"dout", &g->dout, KQ, 0, R_DOUT}, {"dq", &g->dq, KQ, 1, R_DQ},
                           {"dk", &g->dk, KDK, 1, R_DK},   {"dv", &g->dv, KDK, 1, R_DV}};
        memcpy(a, t, sizeof t);
        return 8;
    }
    fa3c_fwd_params *f = &z->f;
    const targ t[5] = {{"q", &f->q, KQ, 0, R_Q}, {"k", &f->k, KK, 0, R_K}, {"v", &f->v, KK, 0, R_V},
                       {"out", &f->out, KQ, 1, R_OUT}, {"qv", &f->qv, KQ, 0, R_QV}};   /* qv: when given */
    memcpy(a, t, sizeof t);
    return f->qv.data ? 5 : 4;
}

static int elem_of(fz *z, const targ *a) {
    const fa3c_dtype dt = prob(z)->dtype;
    return !z->bwd && a->out && dt == FA3C_DTYPE_E4M3 ? 2 : dsize(dt);
}

/* Host arrays, by index (their pointer types differ). */
enum { A_LSE, A_CUQ, A_CUK, A_USED, A_PT, A_DSQ, A_DSK, A_DSV, NARR };
static const char *const arr_names[NARR] = {"lse", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "page_table",
                                            "q_descale", "k_descale", "v_descale"};
static const int arr_region[NARR] = {R_LSE, R_CUQ, R_CUK, R_USED, R_PT, R_DSQ, R_DSK, R_DSV};

static int narrays(const fz *z) { return z->bwd ? A_PT + 1 : NARR; }

static const void *arr_get(fz *z, int i) {
    fa3c_problem *pr = prob(z);
    switch (i) {
    case A_LSE: return z->bwd ? (const void *)z->g.lse : (const void *)z->f.lse;
    case A_CUQ: return pr->cu_seqlens_q;
    case A_CUK: return pr->cu_seqlens_k;
    case A_USED: return pr->seqused_k;
    case A_PT: return pr->page_table;
    case A_DSQ: return z->bwd ? NULL : z->f.q_descale;
    case A_DSK: return z->bwd ? NULL : z->f.k_descale;
    default: return z->bwd ? NULL : z->f.v_descale;
    }
}

static void arr_set(fz *z, int i, const void *p) {
    fa3c_problem *pr = prob(z);
    switch (i) {
    case A_LSE:
        if (z->bwd) z->g.lse = (const float *)p;
        else z->f.lse = (float *)(uintptr_t)p; /* our own writable block */
        break;
    case A_CUQ: pr->cu_seqlens_q = (const int32_t *)p; break;
    case A_CUK: pr->cu_seqlens_k = (const int32_t *)p; break;
    case A_USED: pr->seqused_k = (const int32_t *)p; break;
    case A_PT: pr->page_table = (const int32_t *)p; break;
    case A_DSQ: if (!z->bwd) z->f.q_descale = (const float *)p; break;
    case A_DSK: if (!z->bwd) z->f.k_descale = (const float *)p; break;
    default: if (!z->bwd) z->f.v_descale = (const float *)p; break;
    }
}

/* ---- the contract's extents ------------------------------------------------------ */

/* Nothing to compute (docs/API.md): such a call touches no memory at all. */
static int is_empty(const fa3c_problem *pr, int bwd) {
    return pr->batch == 0 || pr->heads_q == 0 || (!bwd && pr->seqlen_q == 0);
}

/* The (batch, rows, heads, headdim) extents the API gives a tensor; only for validated params. */
static void dims_of(const fa3c_problem *pr, int kind, int64_t n[4]) {
    const int32_t *cu = kind == KQ ? pr->cu_seqlens_q : pr->cu_seqlens_k;
    n[2] = kind == KQ ? pr->heads_q : pr->heads_kv;
    n[3] = pr->headdim;
    if (kind == KK && pr->page_table) {
        n[0] = pr->num_pages;
        n[1] = pr->page_size;
    } else if (cu) {
        n[0] = 1;
        n[1] = cu[pr->batch];
    } else {
        n[0] = pr->batch;
        n[1] = kind == KQ ? pr->seqlen_q : pr->seqlen_k;
    }
}

/* Bytes from t->data to one past its last element (0: no elements); -1 if that
 * is not an int64 (the contract: an accepted tensor's extent is representable). */
static int64_t extent_bytes(const int64_t n[4], const int64_t s[4], int es) {
    int64_t last = 0;
    for (int d = 0; d < 4; d++)
        if (n[d] <= 0) return 0;
    for (int d = 0; d < 4; d++) {
        if (s[d] < 0 || (s[d] > 0 && n[d] - 1 > (INT64_MAX - last) / s[d])) return -1;
        last += (n[d] - 1) * s[d];
    }
    return last < INT64_MAX / es ? (last + 1) * es : -1;
}

/* An accepted call's tensors must end inside the address space (docs/API.md); returns the first that does not. */
static const char *extent_past_address_space(fz *z) {
    const fa3c_problem *pr = prob(z);
    if (is_empty(pr, z->bwd)) return NULL;
    targ t[8];
    const int nt = tensors_of(z, t);
    for (int i = 0; i < nt; i++) {
        int64_t n[4];
        dims_of(pr, t[i].kind, n);
        const int64_t bytes = extent_bytes(n, t[i].t->stride, elem_of(z, &t[i]));
        if (bytes < 0 || (uint64_t)bytes > UINTPTR_MAX - (uintptr_t)t[i].t->data) return t[i].name;
    }
    return NULL;
}

/* The block whose payload holds [p, p + bytes), or -1. */
static int region_holding(const fz *z, const void *p, int64_t bytes) {
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < NREG; i++) {
        const region *r = &z->r[i];
        if (!r->base) continue;
        const uintptr_t lo = (uintptr_t)r->data;
        if (a >= lo && a <= lo + r->bytes && bytes >= 0 && (uint64_t)bytes <= r->bytes - (a - lo)) return i;
    }
    return -1;
}

/* The block containing p at all (guards included), for descriptions. */
static int region_near(const fz *z, const void *p, int64_t *off) {
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < NREG; i++) {
        const region *r = &z->r[i];
        if (r->base && a >= (uintptr_t)r->base && a < (uintptr_t)r->base + r->total) {
            *off = (int64_t)(a - (uintptr_t)r->data);
            return i;
        }
    }
    return -1;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Entries of host array i that a call may read, as the contract counts them
 * (cu_seqlens: batch + 1; page table: rows of page_table_stride up to the
 * longest sequence's pages); 0 where validation refuses before reading. */
static int64_t arr_count(fz *z, int i, int validated) {
    const fa3c_problem *pr = prob(z);
    if (pr->batch <= 0) return 0;
    switch (i) {
    case A_LSE:
        if (!validated) return 0; /* never read by validation */
        return (int64_t)pr->heads_q * (pr->cu_seqlens_q ? pr->cu_seqlens_q[pr->batch] : (int64_t)pr->batch * pr->seqlen_q);
    case A_CUQ: case A_CUK: return (int64_t)pr->batch + 1;
    case A_USED: return pr->batch;
    case A_PT: {
        /* Refused by its scalars before any entry is read: no count. */
        if (pr->cu_seqlens_k || pr->page_size < 1 || pr->num_pages < 1 || pr->page_size > FA3C_MAX_SEQLEN ||
            pr->seqlen_k < 0 || pr->page_table_stride > INT32_MAX)
            return 0;
        const int64_t need = ceil_div(pr->seqlen_k, pr->page_size);
        if (pr->page_table_stride < need) return 0;
        return ((int64_t)pr->batch - 1) * pr->page_table_stride + need;
    }
    default:
        if (pr->dtype != FA3C_DTYPE_E4M3 || pr->heads_kv < 0) return 0; /* refused before reading */
        return (int64_t)pr->batch * pr->heads_kv;
    }
}

/* Could validation read past a host array? Arrays are read only after every
 * pointer passed its alignment check (the documented check order), so a
 * misaligned one stops it; otherwise every array must hold its entries. */
static int arrays_readable(fz *z) {
    const int na = narrays(z);
    for (int i = 0; i < na; i++) {
        const void *p = arr_get(z, i);
        if (p && (uintptr_t)p % 4 != 0) return 1;
    }
    for (int i = 1; i < na; i++) { /* lse (0) is not read by validation */
        const void *p = arr_get(z, i);
        const int64_t cnt = arr_count(z, i, 0);
        if (p && cnt > 0 && region_holding(z, p, cnt > INT64_MAX / 8 ? -1 : cnt * 4) < 0) return 0;
    }
    return 1;
}

/* Mark (mode 0) or count still-poisoned (mode 1) the elements of an output. */
static int64_t walk_output(fz *z, int reg, const void *data, const int64_t n[4], const int64_t s[4], int es, int mode) {
    region *r = &z->r[reg];
    const int64_t base = (int64_t)((uintptr_t)data - (uintptr_t)r->base);
    int64_t unwritten = 0;
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t h = 0; h < n[2]; h++)
                for (int64_t x = 0; x < n[3]; x++) {
                    unsigned char *e = r->base + base + (a * s[0] + b * s[1] + h * s[2] + x * s[3]) * es;
                    if (mode == 0) {
                        memset(r->mask + (e - r->base), 1, (size_t)es);
                    } else {
                        int all = 1;
                        for (int k = 0; k < es; k++) all &= e[k] == OUT_BYTE;
                        unwritten += all;
                    }
                }
    return unwritten;
}

/* Per block, the hull of what the call may touch, [lo, hi) offsets in the block. */
typedef struct { int64_t lo, hi; } hull;

static void hull_add(hull *h, const fz *z, int reg, const void *p, int64_t bytes) {
    const int64_t lo = (int64_t)((uintptr_t)p - (uintptr_t)z->r[reg].base);
    if (bytes <= 0) return;
    if (lo < h[reg].lo) h[reg].lo = lo;
    if (lo + bytes > h[reg].hi) h[reg].hi = lo + bytes;
}

static void hulls_clear(const fz *z, hull *h) {
    for (int i = 0; i < NREG; i++) {
        h[i].lo = INT64_MAX;
        h[i].hi = INT64_MIN;
        if (z->r[i].base) memset(z->r[i].mask, 0, z->r[i].total);
    }
}

/* What validation may read: the host arrays' entries, never a tensor or the lse
 * ("no work"), and nothing at all for an empty problem or a misaligned array. */
static void validation_hulls(fz *z, hull *h) {
    const int na = narrays(z);
    hulls_clear(z, h);
    if (is_empty(prob(z), z->bwd)) return;
    for (int i = 0; i < na; i++) {
        const void *p = arr_get(z, i);
        if (p && (uintptr_t)p % 4 != 0) return;
    }
    for (int i = 1; i < na; i++) {
        const void *p = arr_get(z, i);
        const int64_t cnt = p ? arr_count(z, i, 0) : 0;
        const int reg = cnt > 0 ? region_holding(z, p, cnt * 4) : -1; /* arrays_readable: inside a payload */
        if (reg >= 0) hull_add(h, z, reg, p, cnt * 4);
    }
}

/* After a successful check: is the call safe (every extent inside a payload,
 * work small)? If so, fill the write masks and the hulls. */
static int prepare_call(fz *z, hull *h) {
    const fa3c_problem *pr = prob(z);
    hulls_clear(z, h);
    if (is_empty(pr, z->bwd)) return 1; /* touches nothing: every block stays poisoned */
    /* Work: the backends size scratch by the declared maxima and loop over the keys. */
    if (pr->seqlen_q > 4096 || pr->seqlen_k > 4096 || pr->batch > 64 || pr->heads_q > 64) return 0;
    int64_t work = 0;
    for (int b = 0; b < pr->batch; b++) {
        int64_t lq = pr->cu_seqlens_q ? pr->cu_seqlens_q[b + 1] - pr->cu_seqlens_q[b] : pr->seqlen_q;
        int64_t lk = pr->cu_seqlens_k ? pr->cu_seqlens_k[b + 1] - pr->cu_seqlens_k[b] : pr->seqlen_k;
        work += (lq + 1) * (lk + 1) * pr->heads_q * pr->headdim;
    }
    if (work > (1 << 22)) return 0;
    targ t[8];
    const int nt = tensors_of(z, t);
    for (int i = 0; i < nt; i++) {
        int64_t n[4];
        dims_of(pr, t[i].kind, n);
        const int es = elem_of(z, &t[i]);
        const int64_t bytes = extent_bytes(n, t[i].t->stride, es);
        if (bytes == 0) continue;
        const int reg = bytes > 0 ? region_holding(z, t[i].t->data, bytes) : -1;
        if (reg < 0) return 0;
        hull_add(h, z, reg, t[i].t->data, bytes);
        if (t[i].out) walk_output(z, reg, t[i].t->data, n, t[i].t->stride, es, 0);
    }
    for (int i = 0; i < narrays(z); i++) {
        const void *p = arr_get(z, i);
        const int64_t cnt = p ? arr_count(z, i, 1) : 0;
        if (cnt <= 0) continue;
        const int reg = region_holding(z, p, cnt * 4);
        if (reg < 0) return 0;
        hull_add(h, z, reg, p, cnt * 4);
        if (i == A_LSE && !z->bwd) {
            const int64_t n[4] = {1, 1, 1, cnt}, s[4] = {0, 0, 0, 1};
            walk_output(z, reg, p, n, s, 4, 0);
        }
    }
    return 1;
}

/* Elements of the outputs that still hold the poison (clean params only). */
static int64_t unwritten_outputs(fz *z) {
    const fa3c_problem *pr = prob(z);
    if (is_empty(pr, z->bwd)) return 0;
    targ t[8];
    const int nt = tensors_of(z, t);
    int64_t miss = 0;
    for (int i = 0; i < nt; i++) {
        if (!t[i].out) continue;
        int64_t n[4];
        dims_of(pr, t[i].kind, n);
        const int es = elem_of(z, &t[i]);
        const int64_t bytes = extent_bytes(n, t[i].t->stride, es);
        const int reg = bytes > 0 ? region_holding(z, t[i].t->data, bytes) : -1;
        if (reg >= 0) miss += walk_output(z, reg, t[i].t->data, n, t[i].t->stride, es, 1);
    }
    const void *lse = arr_get(z, A_LSE);
    const int64_t cnt = lse && !z->bwd ? arr_count(z, A_LSE, 1) : 0;
    if (cnt > 0) {
        const int reg = region_holding(z, lse, cnt * 4);
        const int64_t n[4] = {1, 1, 1, cnt}, s[4] = {0, 0, 0, 1};
        if (reg >= 0) miss += walk_output(z, reg, lse, n, s, 4, 1);
    }
    return miss;
}

/* ---- descriptions (for replay) ------------------------------------------------------ */

static void describe_ptr(fz *z, char *buf, size_t n, const void *p) {
    int64_t off;
    const int reg = p ? region_near(z, p, &off) : -1;
    if (!p) snprintf(buf, n, "NULL");
    else if (reg >= 0) snprintf(buf, n, "&%s[%+lld B]", region_names[reg], (long long)off);
    else snprintf(buf, n, "%p (outside every block)", p);
}

/* Up to 12 entries of a host array (if it lies in a block). */
static void describe_array(fz *z, const char *name, const void *p, int64_t want) {
    char where[96];
    describe_ptr(z, where, sizeof where, p);
    fprintf(stderr, "    %s = %s", name, where);
    if (p && (uintptr_t)p % 4 == 0 && want > 0) {
        const int64_t cnt = want < 12 ? want : 12;
        if (region_holding(z, p, cnt * 4) >= 0) {
            fprintf(stderr, " {");
            for (int64_t i = 0; i < cnt; i++) {
                int32_t v;
                memcpy(&v, (const char *)p + 4 * i, 4);
                fprintf(stderr, "%s%d", i ? ", " : "", (int)v);
            }
            fprintf(stderr, "%s}", cnt < want ? ", ..." : "");
        }
    }
    fputc('\n', stderr);
}

static void describe(fz *z) {
    const fa3c_problem *pr = prob(z);
    fprintf(stderr, "  %s params (after: %s):\n", z->bwd ? "bwd" : "fwd", z->loglen ? z->log : "no mutation");
    fprintf(stderr, "    dtype %d batch %d seqlen_q %d seqlen_k %d heads_q %d heads_kv %d headdim %d\n", (int)pr->dtype,
            pr->batch, pr->seqlen_q, pr->seqlen_k, pr->heads_q, pr->heads_kv, pr->headdim);
    fprintf(stderr, "    softmax_scale %.9g causal %d window (%d, %d) softcap %.9g\n", (double)pr->softmax_scale, pr->causal,
            pr->window_left, pr->window_right, (double)pr->softcap);
    fprintf(stderr, "    page_size %d num_pages %d page_table_stride %lld backend %d %s %d\n", pr->page_size, pr->num_pages,
            (long long)pr->page_table_stride, (int)*backend_of(z), z->bwd ? "deterministic" : "num_splits",
            z->bwd ? z->g.deterministic : z->f.num_splits);
    targ t[8];
    const int nt = tensors_of(z, t);
    for (int i = 0; i < nt; i++) {
        char where[96];
        describe_ptr(z, where, sizeof where, t[i].t->data);
        fprintf(stderr, "    %-4s data %s strides (%lld, %lld, %lld, %lld)\n", t[i].name, where,
                (long long)t[i].t->stride[0], (long long)t[i].t->stride[1], (long long)t[i].t->stride[2],
                (long long)t[i].t->stride[3]);
    }
    const int64_t b1 = pr->batch >= 0 && pr->batch < 64 ? pr->batch + 1 : 12;
    describe_array(z, "lse", arr_get(z, A_LSE), 0);
    describe_array(z, "cu_seqlens_q", pr->cu_seqlens_q, b1);
    describe_array(z, "cu_seqlens_k", pr->cu_seqlens_k, b1);
    describe_array(z, "seqused_k", pr->seqused_k, b1 - 1);
    describe_array(z, "page_table", pr->page_table, z->cap_pt);
    if (!z->bwd)
        for (int i = A_DSQ; i <= A_DSV; i++) describe_array(z, arr_names[i], arr_get(z, i), 0);
    fprintf(stderr, "    block sizes:");
    for (int i = 0; i < NREG; i++)
        if (z->r[i].base) fprintf(stderr, " %s %zu", region_names[i], z->r[i].bytes);
    fputc('\n', stderr);
}

/* ---- bases ------------------------------------------------------------------------ */

/* Strides of an (nb, ns, nh, d) view: contiguous, padded or head-major. */
static void layout(fa3c_tensor *t, int64_t nb, int64_t ns, int64_t nh, int64_t d, int varlen) {
    int64_t *s = t->stride;
    const int kind = tu_rand_int(0, 19);
    (void)nb;
    if (ns == 0) ns = 1; /* no rows (empty packed total): strides as for one */
    s[3] = 1;
    if (kind < 12) {
        s[2] = d, s[1] = nh * d, s[0] = ns * nh * d;
    } else if (kind < 17) {
        s[2] = d + 8 * tu_rand_int(0, 2);
        s[1] = nh * s[2] + tu_rand_int(0, 3);
        s[0] = ns * s[1] + tu_rand_int(0, 5);
    } else {
        s[1] = d, s[2] = ns * d, s[0] = nh * ns * d;
    }
    if (varlen && tu_rand_int(0, 3) == 0) s[0] = tu_rand_int(0, 1000); /* ignored with cu_seqlens */
}

/* A tensor in its own block: layout, payload = extent + a little slack. */
static void tensor_in(fz *z, fa3c_tensor *t, int reg, int64_t nb, int64_t ns, int64_t nh, int64_t d, int varlen, int es,
                      int output, fa3c_dtype fill) {
    layout(t, varlen ? 1 : nb, ns, nh, d, varlen);
    const int64_t n[4] = {varlen ? 1 : nb, ns, nh, d};
    const int64_t bytes = extent_bytes(n, t->stride, es) + es * tu_rand_int(0, 4);
    region_alloc(&z->r[reg], (size_t)(bytes > 0 ? bytes : es));
    t->data = z->r[reg].data;
    if (output) memset(z->r[reg].data, OUT_BYTE, z->r[reg].bytes);
    else tu_fill_normal(z->r[reg].data, fill, (int64_t)(z->r[reg].bytes / (size_t)es), 1.0f);
}

static void int_array(fz *z, int reg, int n, const int32_t *vals, int nvals, int lo, int hi) {
    region_alloc(&z->r[reg], sizeof(int32_t) * (size_t)n);
    int32_t *a = (int32_t *)z->r[reg].data;
    for (int i = 0; i < n; i++) a[i] = i < nvals ? vals[i] : tu_rand_int(lo, hi); /* slack: plausible junk */
}

/* A small valid call; meta: with varlen / seqused_k / paged KV. */
static void base_build(fz *z, int bwd, int meta) {
    memset(z, 0, sizeof *z);
    z->bwd = bwd;
    const fa3c_dtype dts[4] = {FA3C_DTYPE_FP32, FA3C_DTYPE_FP16, FA3C_DTYPE_BF16, FA3C_DTYPE_E4M3};
    const fa3c_dtype dt = dts[!bwd && tu_rand_int(0, 7) == 0 ? 3 : tu_rand_int(0, 2)];
    const int es = dsize(dt), oes = dt == FA3C_DTYPE_E4M3 ? 2 : es;
    const int hd[7] = {8, 8, 16, 16, 24, 32, 64};
    const int b = tu_rand_int(1, 3), hkv = tu_rand_int(1, 2), hq = hkv * tu_rand_int(1, 3), d = hd[tu_rand_int(0, 6)];
    const int sq = tu_rand_int(1, 9), sk = tu_rand_int(1, 9);
    fa3c_problem pr;
    {
        fa3c_fwd_params tmp;
        fa3c_fwd_params_init(&tmp);
        pr = tmp.problem;
    }
    tu_problem_shape(&pr, dt, b, sq, sk, hq, hkv, d);
    if (tu_rand_int(0, 3) == 0) pr.causal = 1;
    if (tu_rand_int(0, 3) == 0) pr.window_left = tu_rand_int(-1, 4), pr.window_right = tu_rand_int(-1, 4);
    if (tu_rand_int(0, 4) == 0) pr.softcap = (float)(0.5 + 4.5 * tu_uniform());
    if (tu_rand_int(0, 2) == 0) pr.softmax_scale = (float)(0.1 + 0.9 * tu_uniform());

    const int use_meta = meta || tu_rand_int(0, 9) == 0;
    const int varq = use_meta && tu_rand_int(0, 1);
    const int paged = use_meta && tu_rand_int(0, bwd ? 7 : 2) == 0; /* backward: NOT_SUPPORTED */
    const int vark = use_meta && !paged && tu_rand_int(0, 1);
    const int used = use_meta && tu_rand_int(0, 2) == 0;
    int32_t cuq[4], cuk[4], usedv[3];
    cuq[0] = cuk[0] = 0;
    for (int i = 0; i < b; i++) { /* lengths 0..max (empty sequences included) when varlen, else the fixed ones */
        cuq[i + 1] = cuq[i] + (varq ? tu_rand_int(0, sq) : sq);
        cuk[i + 1] = cuk[i] + (vark ? tu_rand_int(0, sk) : sk);
        usedv[i] = tu_rand_int(0, sk);
    }
    const int tq = cuq[b], tk = cuk[b];
    z->cap_cu = b + 1 + SLACK;
    z->cap_used = b + SLACK;
    int_array(z, R_CUQ, z->cap_cu, cuq, b + 1, -3, 40);
    int_array(z, R_CUK, z->cap_cu, cuk, b + 1, -3, 40);
    int_array(z, R_USED, z->cap_used, usedv, b, -2, sk + 2);
    if (varq) pr.cu_seqlens_q = (const int32_t *)z->r[R_CUQ].data;
    if (vark) pr.cu_seqlens_k = (const int32_t *)z->r[R_CUK].data;
    if (used) pr.seqused_k = (const int32_t *)z->r[R_USED].data;

    /* Paged KV: a shuffled pool with spare pages; entries past a sequence's keys are -1. */
    const int ps = tu_rand_int(1, 4), per_seq = (int)ceil_div(sk, ps), npages = b * per_seq + tu_rand_int(0, 2);
    const int pts = per_seq + tu_rand_int(0, 2);
    z->cap_pt = b * pts + SLACK;
    {
        int32_t perm[40], table[64];
        for (int i = 0; i < npages; i++) perm[i] = i;
        for (int i = npages - 1; i > 0; i--) {
            int j = tu_rand_int(0, i), x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
        }
        for (int i = 0; i < b; i++)
            for (int j = 0; j < pts; j++) {
                const int needed = used ? (int)ceil_div(usedv[i], ps) : per_seq;
                table[i * pts + j] = j < per_seq && (j < needed || tu_rand_int(0, 1)) ? perm[i * per_seq + j] : -1;
            }
        int_array(z, R_PT, z->cap_pt, table, b * pts, -1, npages + 1);
    }
    if (paged) {
        pr.page_table = (const int32_t *)z->r[R_PT].data;
        pr.page_size = ps;
        pr.num_pages = npages;
        pr.page_table_stride = pts;
    }

    /* Tensors. */
    fa3c_tensor q, k, v, out;
    tensor_in(z, &q, R_Q, b, varq ? tq : sq, hq, d, varq, es, 0, dt);
    if (paged) {
        tensor_in(z, &k, R_K, npages, ps, hkv, d, 0, es, 0, dt);
        tensor_in(z, &v, R_V, npages, ps, hkv, d, 0, es, 0, dt);
    } else {
        tensor_in(z, &k, R_K, b, vark ? tk : sk, hkv, d, vark, es, 0, dt);
        tensor_in(z, &v, R_V, b, vark ? tk : sk, hkv, d, vark, es, 0, dt);
    }
    tensor_in(z, &out, R_OUT, b, varq ? tq : sq, hq, d, varq, oes, !bwd, dt);
    region_alloc(&z->r[R_LSE], sizeof(float) * ((size_t)hq * tq + (size_t)tu_rand_int(0, 4)));
    memset(z->r[R_LSE].data, bwd ? 0 : OUT_BYTE, z->r[R_LSE].bytes);

    if (!bwd) {
        z->cap_ds = b * hkv + SLACK;
        for (int i = 0; i < 3; i++) {
            region_alloc(&z->r[R_DSQ + i], sizeof(float) * (size_t)z->cap_ds);
            float *ds = (float *)z->r[R_DSQ + i].data;
            for (int j = 0; j < z->cap_ds; j++) ds[j] = (float)(0.5 + 1.5 * tu_uniform());
        }
        fa3c_fwd_params *f = &z->f0;
        fa3c_fwd_params_init(f);
        f->problem = pr;
        f->q = q, f->k = k, f->v = v, f->out = out;
        if (tu_rand_int(0, 3)) f->lse = (float *)z->r[R_LSE].data;
        if (dt == FA3C_DTYPE_E4M3 && tu_rand_int(0, 1)) {
            f->q_descale = (const float *)z->r[R_DSQ].data;
            f->k_descale = (const float *)z->r[R_DSK].data;
            f->v_descale = (const float *)z->r[R_DSV].data;
        }
        if (dt != FA3C_DTYPE_E4M3 && tu_rand_int(0, 3) == 0)   /* qv (absorbed MLA decode), as q with v's head dim */
            tensor_in(z, &f->qv, R_QV, b, varq ? tq : sq, hq, d, varq, es, 0, dt);
        f->num_splits = tu_rand_int(0, 3);
        f->backend = tu_rand_int(0, 1) ? FA3C_BACKEND_CPU : FA3C_BACKEND_CPU_REFERENCE;
    } else {
        /* The backward's out and lse come from the reference forward of the same problem. */
        fa3c_fwd_params f;
        fa3c_fwd_params_init(&f);
        f.problem = pr;
        f.q = q, f.k = k, f.v = v, f.out = out;
        f.lse = (float *)z->r[R_LSE].data;
        f.backend = FA3C_BACKEND_CPU_REFERENCE;
        const fa3c_status st = fa3c_fwd(&f, NULL);
        CHECK(st == FA3C_STATUS_OK, "base forward for the backward: %s (%s)", fa3c_status_string(st), fa3c_last_error());
        fa3c_bwd_params *g = &z->g0;
        fa3c_bwd_params_init(g);
        g->problem = pr;
        g->q = q, g->k = k, g->v = v, g->out = out;
        g->lse = (const float *)z->r[R_LSE].data;
        tensor_in(z, &g->dout, R_DOUT, b, varq ? tq : sq, hq, d, varq, es, 0, dt);
        tensor_in(z, &g->dq, R_DQ, b, varq ? tq : sq, hq, d, varq, es, 1, dt);
        /* dk, dv: never paged (batch, seqlen_k), or the packed keys */
        tensor_in(z, &g->dk, R_DK, b, vark ? tk : sk, hkv, d, vark, es, 1, dt);
        tensor_in(z, &g->dv, R_DV, b, vark ? tk : sk, hkv, d, vark, es, 1, dt);
        g->deterministic = tu_rand_int(0, 1);
        g->backend = tu_rand_int(0, 1) ? FA3C_BACKEND_CPU : FA3C_BACKEND_CPU_REFERENCE;
    }
    for (int i = 0; i < NREG; i++)
        if (z->r[i].base) memcpy(z->r[i].pristine, z->r[i].base, z->r[i].total);
}

static void base_free(fz *z) {
    for (int i = 0; i < NREG; i++) region_free(&z->r[i]);
}

/* ---- mutations -------------------------------------------------------------------------- */

static int clamp_int(int64_t v) { return (int)(v < INT_MIN ? INT_MIN : v > INT_MAX ? INT_MAX : v); }

static int garbage_int(int old) {
    static const int special[] = {0, -1, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 255, 256, 257, 1 << 16,
                                  FA3C_MAX_SEQLEN, FA3C_MAX_SEQLEN + 1, INT_MAX - 1, INT_MAX, INT_MIN, INT_MIN + 1, -2, -8};
    switch (tu_rand_int(0, 3)) {
    case 0: return clamp_int((int64_t)old + tu_rand_int(-2, 2));
    case 1: return clamp_int((int64_t)old * 2);
    default: return special[tu_rand_int(0, (int)(sizeof special / sizeof special[0]) - 1)];
    }
}

/* Wrapping int64 arithmetic: garbage in, garbage out, no UB in the test itself. */
static int64_t wrap(uint64_t x) {
    int64_t v;
    memcpy(&v, &x, sizeof v);
    return v;
}

static int64_t garbage_i64(int64_t old) {
    const int64_t special[] = {-1, 0, 1, 2, 3, 8, INT64_MAX, INT64_MIN, INT64_MAX / 2, (int64_t)1 << 20,
                               (int64_t)1 << 40, INT32_MAX, (int64_t)INT32_MAX + 1, -((int64_t)1 << 33)};
    switch (tu_rand_int(0, 5)) {
    case 0: return wrap((uint64_t)old + 1);
    case 1: return wrap((uint64_t)old - 1);
    case 2: return wrap((uint64_t)old * 2);
    case 3: return wrap(0 - (uint64_t)old);
    default: return special[tu_rand_int(0, (int)(sizeof special / sizeof special[0]) - 1)];
    }
}

static float garbage_float(float old) {
    const float special[] = {0.0f, -0.0f, -1.0f, 1.0f, NAN, INFINITY, -INFINITY, 1e30f, 1e-30f, FLT_MAX,
                             FLT_MIN, 1.4e-45f, 0.5f, 50.0f, -old, old * 1000.0f};
    return special[tu_rand_int(0, (int)(sizeof special / sizeof special[0]) - 1)];
}

static void mut_scalar(fz *z) {
    fa3c_problem *pr = prob(z);
    if (tu_rand_int(0, 9) == 0) {
        const int64_t old = pr->page_table_stride;
        pr->page_table_stride = garbage_i64(old);
        fz_log(z, "page_table_stride %lld -> %lld; ", (long long)old, (long long)pr->page_table_stride);
        return;
    }
    int *fields[13] = {&pr->batch,       &pr->seqlen_q,     &pr->seqlen_k,  &pr->heads_q,   &pr->heads_kv,
                       &pr->headdim,     &pr->causal,       &pr->window_left, &pr->window_right, &pr->page_size,
                       &pr->num_pages,   z->bwd ? &z->g.deterministic : &z->f.num_splits, &pr->heads_q};
    const char *names[13] = {"batch",       "seqlen_q",    "seqlen_k",  "heads_q",   "heads_kv",
                             "headdim",     "causal",      "window_left", "window_right", "page_size",
                             "num_pages",   z->bwd ? "deterministic" : "num_splits", "heads_q"};
    const int i = tu_rand_int(0, 12);
    const int old = *fields[i];
    *fields[i] = garbage_int(old);
    fz_log(z, "%s %d -> %d; ", names[i], old, *fields[i]);
}

static void mut_float(fz *z) {
    fa3c_problem *pr = prob(z);
    float *f = tu_rand_int(0, 1) ? &pr->softmax_scale : &pr->softcap;
    const float old = *f;
    *f = garbage_float(old);
    fz_log(z, "%s %g -> %g; ", f == &pr->softcap ? "softcap" : "softmax_scale", (double)old, (double)*f);
}

static void mut_enum(fz *z) {
    if (tu_rand_int(0, 1)) {
        const int vals[9] = {-1, 4, 5, 99, INT_MAX, INT_MIN, 0, 1, 3}; /* and other valid dtypes */
        const int v = vals[tu_rand_int(0, 8)];
        fz_log(z, "dtype %d -> %d; ", (int)prob(z)->dtype, v);
        prob(z)->dtype = (fa3c_dtype)v;
        z->clean = 0;
    } else {
        const int vals[8] = {-1, 4, 17, INT_MAX, FA3C_BACKEND_AUTO, FA3C_BACKEND_CPU, FA3C_BACKEND_CUDA,
                             FA3C_BACKEND_CPU_REFERENCE};
        const int v = vals[tu_rand_int(0, 7)];
        fz_log(z, "backend %d -> %d; ", (int)*backend_of(z), v);
        *backend_of(z) = (fa3c_backend)v;
    }
}

static void mut_stride(fz *z) {
    targ t[8];
    const int nt = tensors_of(z, t), i = tu_rand_int(0, nt - 1), d = tu_rand_int(0, 3);
    const int64_t old = t[i].t->stride[d];
    const int64_t dim3[4] = {0, 2, -1, 8};
    t[i].t->stride[d] = d == 3 && tu_rand_int(0, 1) ? dim3[tu_rand_int(0, 3)] : garbage_i64(old);
    fz_log(z, "%s.stride[%d] %lld -> %lld; ", t[i].name, d, (long long)old, (long long)t[i].t->stride[d]);
}

/* A pointer somewhere in block reg's payload, k elements of es bytes in (clamped). */
static void *inside(fz *z, int reg, int64_t k, int es) {
    const region *r = &z->r[reg];
    int64_t off = k * es;
    if (off < 0) off = 0;
    if ((size_t)off > r->bytes) off = (int64_t)(r->bytes / (size_t)es) * es;
    return r->data + off;
}

static int random_region(fz *z) {
    int reg;
    do reg = tu_rand_int(0, NREG - 1);
    while (!z->r[reg].base);
    return reg;
}

static void mut_tensor_ptr(fz *z) {
    targ t[8];
    const int nt = tensors_of(z, t), i = tu_rand_int(0, nt - 1);
    const int dt = (int)prob(z)->dtype, es = dt >= 0 && dt <= 3 ? dsize((fa3c_dtype)dt) : 4;
    void *old = t[i].t->data, *p;
    switch (tu_rand_int(0, 6)) {
    case 0: p = NULL; break;
    case 1: p = (char *)z->r[t[i].reg].data + (es == 4 && tu_rand_int(0, 1) ? 2 : 1); break; /* misaligned */
    case 2: p = inside(z, t[i].reg, tu_rand_int(-1, 6), es); break;                          /* shifted in its block */
    case 3: { /* exactly another argument's address */
        const int j = tu_rand_int(0, nt - 1);
        p = j != i ? t[j].t->data : (void *)(uintptr_t)arr_get(z, tu_rand_int(0, narrays(z) - 1));
        z->clean = 0;
        break;
    }
    case 4: { /* partly over another block */
        const int reg = random_region(z);
        p = inside(z, reg, tu_rand_int(0, 5), es);
        z->clean = z->clean && reg == t[i].reg;
        break;
    }
    case 5: p = (void *)(uintptr_t)4096; break;                /* never dereferenced by validation */
    default: p = (void *)(UINTPTR_MAX - 63); break;            /* near the top of the address space */
    }
    t[i].t->data = p;
    char a[96], b[96];
    describe_ptr(z, a, sizeof a, old);
    describe_ptr(z, b, sizeof b, p);
    fz_log(z, "%s.data %s -> %s; ", t[i].name, a, b);
}

static void mut_array_ptr(fz *z) {
    const int i = tu_rand_int(0, narrays(z) - 1);
    const void *old = arr_get(z, i), *p;
    switch (tu_rand_int(0, 4)) {
    case 0: p = NULL; break;
    case 1: p = (const char *)z->r[arr_region[i]].data + tu_rand_int(1, 3); break; /* misaligned */
    case 2: p = z->r[arr_region[i]].data; break; /* attach (its block holds valid contents for the base) */
    case 3: { /* into another argument's block (outputs included: an overlap) */
        const int reg = random_region(z);
        p = inside(z, reg, tu_rand_int(0, 3), 4);
        z->clean = z->clean && reg == arr_region[i];
        break;
    }
    default: { /* a page table for a base without one: some page scalars too */
        p = z->r[arr_region[i]].data;
        if (i == A_PT && !prob(z)->page_table) {
            fa3c_problem *pr = prob(z);
            pr->page_size = tu_rand_int(0, 4);
            pr->num_pages = tu_rand_int(0, 8);
            pr->page_table_stride = tu_rand_int(0, 4);
            fz_log(z, "pages (size %d, num %d, stride %lld); ", pr->page_size, pr->num_pages,
                   (long long)pr->page_table_stride);
        }
        break;
    }
    }
    arr_set(z, i, p);
    char a[96], b[96];
    describe_ptr(z, a, sizeof a, old);
    describe_ptr(z, b, sizeof b, p);
    fz_log(z, "%s %s -> %s; ", arr_names[i], a, b);
}

/* cu_seqlens contents: decreasing, too long, negative, past the tokens. */
static void mut_cu(fz *z) {
    const int which = tu_rand_int(0, 1), reg = which ? R_CUK : R_CUQ;
    int32_t *cu = (int32_t *)z->r[reg].data;
    const int b = base_problem(z)->batch, i = tu_rand_int(0, b);
    const int old = cu[i];
    switch (tu_rand_int(0, 6)) {
    case 0: cu[i] = -1; break;
    case 1: cu[i] = tu_rand_int(0, 1) ? INT_MAX : INT_MIN; break;
    case 2: cu[i] = clamp_int((int64_t)old + tu_rand_int(-2, 2)); break;
    case 3: cu[i] = i > 0 ? clamp_int((int64_t)cu[i - 1] - 1) : 1; break;                      /* decreasing (or cu[0] != 0) */
    case 4: cu[b] = clamp_int((int64_t)cu[b] + tu_rand_int(1, 40)); break; /* the total past the tensors */
    case 5: cu[i] = clamp_int((int64_t)old + 1000); break;                 /* longer than the maximum */
    default: if (i < b) { cu[i] = cu[i + 1]; cu[i + 1] = old; } break;     /* swapped */
    }
    if (tu_rand_int(0, 2) == 0) arr_set(z, which ? A_CUK : A_CUQ, cu);     /* and use it */
    fz_log(z, "%s[%d] contents mutated (%d -> %d, last %d); ", which ? "cu_seqlens_k" : "cu_seqlens_q", i, old, cu[i],
           cu[b]);
}

static void mut_used_pages(fz *z) {
    const fa3c_problem *pr0 = base_problem(z);
    if (tu_rand_int(0, 1)) {
        int32_t *u = (int32_t *)z->r[R_USED].data;
        const int i = tu_rand_int(0, pr0->batch - 1), old = u[i];
        const int vals[7] = {-1, pr0->seqlen_k + 1, INT_MAX, INT_MIN, 0, pr0->seqlen_k, pr0->seqlen_k - 1};
        u[i] = vals[tu_rand_int(0, 6)];
        if (tu_rand_int(0, 1)) arr_set(z, A_USED, u);
        fz_log(z, "seqused_k[%d] %d -> %d; ", i, old, u[i]);
    } else {
        int32_t *pt = (int32_t *)z->r[R_PT].data;
        const int i = tu_rand_int(0, z->cap_pt - 1), old = pt[i], np = pr0->num_pages;
        const int vals[6] = {-1, np, np - 1, INT_MAX, INT_MIN, 0};
        pt[i] = vals[tu_rand_int(0, 5)];
        fz_log(z, "page_table entry %d: %d -> %d; ", i, old, pt[i]);
    }
}

static void mut_descale_lse(fz *z) {
    const int what = tu_rand_int(0, 3);
    if (z->bwd || what == 0) { /* lse: gone, or back */
        const void *p = tu_rand_int(0, 1) ? NULL : z->r[R_LSE].data;
        arr_set(z, A_LSE, p);
        fz_log(z, "lse -> %s; ", p ? "&lse" : "NULL");
        return;
    }
    const int i = A_DSQ + tu_rand_int(0, 2);
    float *ds = (float *)z->r[arr_region[i]].data;
    if (what == 1) { /* attached: with a dtype other than E4M3 this must be refused */
        arr_set(z, i, ds);
        fz_log(z, "%s attached (dtype %d); ", arr_names[i], (int)prob(z)->dtype);
    } else { /* contents: 0, negative, NaN, inf are refused; a denormal or a huge one is valid */
        const float vals[7] = {0.0f, -1.0f, NAN, INFINITY, -0.0f, 1.4e-45f, 1e38f};
        const int j = tu_rand_int(0, z->cap_ds - 1);
        ds[j] = vals[tu_rand_int(0, 6)];
        fz_log(z, "%s[%d] = %g; ", arr_names[i], j, (double)ds[j]);
    }
}

/* weights[k]: how often mutation k is drawn. */
typedef void (*mut_fn)(fz *);
static const mut_fn mutations[9] = {mut_scalar, mut_float, mut_enum, mut_stride, mut_tensor_ptr,
                                    mut_array_ptr, mut_cu, mut_used_pages, mut_descale_lse};

static void mutate(fz *z, const int *weights) {
    int total = 0;
    for (int k = 0; k < 9; k++) total += weights[k];
    int x = tu_rand_int(0, total - 1);
    for (int k = 0; k < 9; k++) {
        if (x < weights[k]) {
            mutations[k](z);
            return;
        }
        x -= weights[k];
    }
}

/* ---- one round: check, call, compare ---------------------------------------------------- */

static fa3c_status do_check(fz *z) { return z->bwd ? fa3c_bwd_check(&z->g) : fa3c_fwd_check(&z->f); }
static fa3c_status do_call(fz *z) { return z->bwd ? fa3c_bwd(&z->g, NULL) : fa3c_fwd(&z->f, NULL); }

static int known_status(fa3c_status s) { return (int)s >= FA3C_STATUS_OK && (int)s <= FA3C_STATUS_INTERNAL_ERROR; }

/* Bytes of the blocks that differ from the snapshot, outside the masks when use_mask. */
static int64_t changed_bytes(fz *z, int use_mask, char *where, size_t n) {
    int64_t c = 0;
    where[0] = '\0';
    for (int i = 0; i < NREG; i++) {
        const region *r = &z->r[i];
        if (!r->base) continue;
        for (size_t k = 0; k < r->total; k++)
            if (r->base[k] != r->before[k] && !(use_mask && r->mask[k])) {
                if (c++ == 0)
                    snprintf(where, n, "%s[%+lld B]%s", region_names[i], (long long)k - GUARD,
                             k < GUARD || k >= GUARD + r->bytes ? " (guard)" : "");
            }
    }
    return c;
}

/* Poison block i outside [lo, hi) (offsets in the block) for the duration of a call. */
static void poison_outside(region *r, int64_t lo, int64_t hi) {
    if (hi <= lo) {
        fz_poison(r->base, r->total);
        return;
    }
    if (lo > 0) fz_poison(r->base, (size_t)lo);
    if ((size_t)hi < r->total) fz_poison(r->base + hi, r->total - (size_t)hi);
}

static void unpoison_all(fz *z) {
    for (int i = 0; i < NREG; i++)
        if (z->r[i].base) fz_unpoison(z->r[i].base, z->r[i].total);
}

/* Restore the base, apply nmut mutations, then check and call. */
static void run_round(fz *z, int nmut, const int *weights, fa3c_status expect_base, fz_stats *st) {
    for (int i = 0; i < NREG; i++)
        if (z->r[i].base) memcpy(z->r[i].base, z->r[i].pristine, z->r[i].total);
    z->f = z->f0;
    z->g = z->g0;
    z->loglen = 0;
    z->log[0] = '\0';
    z->clean = 1;
    for (int k = 0; k < nmut; k++) mutate(z, weights);
    st->rounds++;
    if (!arrays_readable(z)) { /* even validation would read past a host array: the caller's bug */
        st->unreadable++;
        return;
    }
    for (int i = 0; i < NREG; i++)
        if (z->r[i].base) memcpy(z->r[i].before, z->r[i].base, z->r[i].total);
    const fa3c_fwd_params f_before = z->f;
    const fa3c_bwd_params g_before = z->g;

    /* The check: only host arrays may be read; everything else is poisoned. */
    hull vh[NREG];
    validation_hulls(z, vh);
    for (int i = 0; i < NREG; i++)
        if (z->r[i].base) poison_outside(&z->r[i], vh[i].lo, vh[i].hi);
    const fa3c_status s1 = do_check(z);
    char msg1[1024];
    snprintf(msg1, sizeof msg1, "%s", fa3c_last_error());
    /* fa3c_*_check_device: on host memory, the same verdict and message from the same reads. */
    const fa3c_status s1d = z->bwd ? fa3c_bwd_check_device(&z->g, NULL) : fa3c_fwd_check_device(&z->f, NULL);
    CHECK(s1d == s1 && strcmp(fa3c_last_error(), msg1) == 0, "check_device said %s '%s', the check %s '%s'",
          fa3c_status_string(s1d), fa3c_last_error(), fa3c_status_string(s1), msg1);
    unpoison_all(z);
    char where[128];
    CHECK(known_status(s1), "check returned unknown status %d", (int)s1);
    if ((int)s1 >= 0 && (int)s1 < 8) st->status[s1]++;
    CHECK(memcmp(&f_before, &z->f, sizeof f_before) == 0 && memcmp(&g_before, &z->g, sizeof g_before) == 0,
          "the check modified its params");
    int64_t c = changed_bytes(z, 0, where, sizeof where);
    CHECK(c == 0, "the check (%s) wrote %lld bytes, first at %s", fa3c_status_string(s1), (long long)c, where);
    CHECK((s1 == FA3C_STATUS_OK) == (msg1[0] == '\0'), "check %s with message '%s'", fa3c_status_string(s1), msg1);
    if (nmut == 0)
        CHECK(s1 == expect_base, "the unmutated base: %s, want %s (%s)", fa3c_status_string(s1),
              fa3c_status_string(expect_base), msg1);

    if (s1 == FA3C_STATUS_OK) {
        const char *bad = extent_past_address_space(z);
        CHECK(bad == NULL, "the check accepted %s, whose extent reaches past the address space", bad ? bad : "");
        if (bad) return;
    }

    /* The call, where the contract makes it memory-safe. */
    hull h[NREG];
    if (s1 == FA3C_STATUS_OK && !prepare_call(z, h)) {
        st->check_only++;
        return;
    }
    for (int i = 0; i < NREG; i++) /* a refused call reads what its validation reads */
        if (z->r[i].base) poison_outside(&z->r[i], s1 == FA3C_STATUS_OK ? h[i].lo : vh[i].lo, s1 == FA3C_STATUS_OK ? h[i].hi : vh[i].hi);
    const fa3c_status s2 = do_call(z);
    char msg2[1024];
    snprintf(msg2, sizeof msg2, "%s", fa3c_last_error());
    unpoison_all(z);
    st->calls++;
    CHECK(s2 == s1, "check said %s, the call %s (%s)", fa3c_status_string(s1), fa3c_status_string(s2), msg2);
    if (s2 != FA3C_STATUS_OK) {
        CHECK(msg2[0] != '\0', "call failed (%s) without a message", fa3c_status_string(s2));
        c = changed_bytes(z, 0, where, sizeof where);
        CHECK(c == 0, "a refused call (%s: %s) wrote %lld bytes, first at %s", fa3c_status_string(s2), msg2,
              (long long)c, where);
    } else if (s1 == FA3C_STATUS_OK) {
        CHECK(msg2[0] == '\0', "message left after a success: '%s'", msg2);
        c = changed_bytes(z, 1, where, sizeof where);
        CHECK(c == 0, "a successful call wrote %lld bytes outside its outputs, first at %s", (long long)c, where);
        if (z->clean) {
            const int64_t miss = unwritten_outputs(z);
            CHECK(miss == 0, "a successful call left %lld output elements unwritten", (long long)miss);
        }
    }
}

/* ---- the cases -------------------------------------------------------------------------- */

/* Each base gets its own stream (seed, case, base), so FA3C_FUZZ_ONLY replays one. */
static void reseed(uint64_t salt, long base) {
    tu_rng_state = fz_seed ^ (salt * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)base * 0xD1B54A32D192ED03ull);
    (void)tu_rand_u64();
}

static void fuzz(const char *name, uint64_t salt, int bwd_every, int meta, const int *weights) {
    static int seeded;
    if (!seeded) fz_seed = tu_seed_init(), seeded = 1; /* the seed itself, not the stream's later state */
    const long iters = tu_env_long("FA3C_FUZZ_ITERS", 4000), only = tu_env_long("FA3C_FUZZ_ONLY", -1);
    const long bases = only >= 0 ? only + 1 : (iters + ROUNDS - 1) / ROUNDS;
    fz_stats st;
    memset(&st, 0, sizeof st);
    fz *z = (fz *)tu_alloc(sizeof *z);
    for (long base = 0; base < bases && st.failing < MAX_FAILING; base++) {
        if (only >= 0 && base != only) continue;
        reseed(salt, base);
        tu_pick_threads(base);
        const int bwd = bwd_every > 0 && base % bwd_every == 0;
        base_build(z, bwd, meta);
        const fa3c_status want = bwd && z->g0.problem.page_table ? FA3C_STATUS_NOT_SUPPORTED : FA3C_STATUS_OK;
        for (int round = 0; round <= ROUNDS && st.failing < MAX_FAILING; round++) {
            const int before = harness_failures;
            run_round(z, round == 0 ? 0 : tu_rand_int(1, 3), weights, want, &st);
            if (harness_failures != before) {
                st.failing++;
                describe(z);
                fprintf(stderr, "  replay: FA3C_SEED=%llu FA3C_FUZZ_ONLY=%ld test_api_fuzz %s (round %d)\n",
                        (unsigned long long)fz_seed, base, name, round);
            }
        }
        base_free(z);
    }
    free(z);
    printf("  %s: %ld rounds; check: ok %ld, invalid %ld, not supported %ld, no device %ld; %ld calls, "
           "%ld check-only (extents past the buffers or too big), %ld skipped (arrays too short)\n",
           name, st.rounds, st.status[0], st.status[1], st.status[2], st.status[4], st.calls, st.check_only,
           st.unreadable);
    CHECK(st.calls > st.rounds / 4 || only >= 0, "only %ld of %ld rounds made a call", st.calls, st.rounds);
}

/* mutation weights: scalar float enum stride tensor_ptr array_ptr cu used/pages descale/lse */
TEST(fuzz_fwd) {
    static const int w[9] = {6, 2, 2, 5, 5, 2, 1, 1, 2};
    fuzz("fuzz_fwd", 1, 0, 0, w);
}

TEST(fuzz_bwd) {
    static const int w[9] = {6, 2, 2, 6, 6, 2, 1, 1, 1};
    fuzz("fuzz_bwd", 2, 1, 0, w);
}

TEST(fuzz_paged_varlen) {
    static const int w[9] = {4, 1, 1, 3, 3, 4, 5, 5, 2};
    fuzz("fuzz_paged_varlen", 3, 3, 1, w); /* every third base a backward */
}

/* ---- regressions the fuzzing found ---- */

/* FA3C_BACKEND_CPU_REFERENCE sized its per-thread scratch by the declared
 * problem.seqlen_k, which with cu_seqlens_k is only a maximum: FA3C_MAX_SEQLEN
 * over 3 real keys passed the check, then the call failed with OUT_OF_MEMORY
 * (64 GiB per scratch array per thread; under ASan the allocation aborted the
 * process). It sizes it by the keys used now. Both backends, forward and
 * backward, must succeed. (The fuzz driver still keeps declared lengths
 * under 4096, for its run time.) */
TEST(reference_scratch_by_keys_used) {
    static float q[16], k[24], v[24], out[16], dout[16], dq[16], dk[24], dv[24], lse[2];
    static const int32_t cu_k[2] = {0, 3};
    tu_fill_normal(q, FA3C_DTYPE_FP32, 16, 1.0f);
    tu_fill_normal(k, FA3C_DTYPE_FP32, 24, 1.0f);
    tu_fill_normal(v, FA3C_DTYPE_FP32, 24, 1.0f);
    tu_fill_normal(dout, FA3C_DTYPE_FP32, 16, 1.0f);
    const fa3c_backend bes[2] = {FA3C_BACKEND_CPU, FA3C_BACKEND_CPU_REFERENCE};
    for (int e = 0; e < 2; e++) {
        fa3c_fwd_params p;
        fa3c_fwd_params_init(&p);
        tu_problem_shape(&p.problem, FA3C_DTYPE_FP32, 1, 2, FA3C_MAX_SEQLEN, 1, 1, 8);
        p.problem.cu_seqlens_k = cu_k; /* 3 keys; seqlen_k is their declared maximum */
        p.q = tu_tensor(q, 1, 2, 1, 8), p.k = tu_tensor(k, 1, 3, 1, 8), p.v = tu_tensor(v, 1, 3, 1, 8);
        p.out = tu_tensor(out, 1, 2, 1, 8);
        p.lse = lse;
        p.backend = bes[e];
        fa3c_status s = fa3c_fwd_check(&p);
        CHECK(s == FA3C_STATUS_OK, "backend %d: forward check %s (%s)", (int)bes[e], fa3c_status_string(s), fa3c_last_error());
        s = fa3c_fwd(&p, NULL);
        CHECK(s == FA3C_STATUS_OK, "backend %d: forward %s (%s)", (int)bes[e], fa3c_status_string(s), fa3c_last_error());
        fa3c_bwd_params g;
        fa3c_bwd_params_init(&g);
        g.problem = p.problem;
        g.q = p.q, g.k = p.k, g.v = p.v, g.out = p.out, g.lse = lse;
        g.dout = tu_tensor(dout, 1, 2, 1, 8), g.dq = tu_tensor(dq, 1, 2, 1, 8);
        g.dk = tu_tensor(dk, 1, 3, 1, 8), g.dv = tu_tensor(dv, 1, 3, 1, 8);
        g.backend = bes[e];
        s = fa3c_bwd(&g, NULL);
        CHECK(s == FA3C_STATUS_OK, "backend %d: backward %s (%s)", (int)bes[e], fa3c_status_string(s), fa3c_last_error());
    }
}

TEST_MAIN()
