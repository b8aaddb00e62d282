/* fa3c_append_kv (fa3c.h): a decode step's write of new keys and values
 * into a KV cache. Everything is validated once, then one switch: the CPU
 * loop below, or the CUDA kernel (src/cuda/append.cu). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

static const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;

void fa3c_append_params_init(fa3c_append_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->dtype = FA3C_DTYPE_BF16;
    p->backend = FA3C_BACKEND_AUTO;
}

static int elem_size(fa3c_dtype d) { return d == FA3C_DTYPE_FP32 ? 4 : d == FA3C_DTYPE_E4M3 ? 1 : 2; }
static int headdim_v(const fa3c_append_params *p) { return p->headdim_v ? p->headdim_v : p->headdim; }

/* Rows of the cache each sequence has room for. */
static int64_t capacity(const fa3c_append_params *p) {
    return p->page_table ? p->page_table_stride * p->page_size : p->seqlen_cache;
}

/* One tensor argument: its name, logical dims (outer, rows, heads, columns)
 * and whether the call writes it. */
typedef struct {
    const char *name;
    const fa3c_tensor *t;
    int64_t n[4];
    int is_output;
} append_tensor;

/* The byte after the last element (data + the largest offset + 1 element),
 * or 0 when it overflows. */
static uintptr_t tensor_end(const append_tensor *a, int es) {
    uint64_t off = 0;
    for (int i = 0; i < 4; i++) {
        const uint64_t n1 = (uint64_t)(a->n[i] - 1), st = (uint64_t)a->t->stride[i];
        if (st && n1 > (UINT64_MAX / 4) / st) return 0;
        off += n1 * st;
        if (off > (uint64_t)INT64_MAX / (uint64_t)es - 1) return 0;
    }
    const uint64_t bytes = (off + 1) * (uint64_t)es;
    const uintptr_t start = (uintptr_t)a->t->data;
    return start + bytes < start ? 0 : start + (uintptr_t)bytes;
}

static fa3c_status check_tensor(const append_tensor *a, int es) {
    const fa3c_tensor *t = a->t;
    if (!t->data) return fa3c_error(BAD, "%s.data: is NULL", a->name);
    if ((uintptr_t)t->data % (uintptr_t)es)
        return fa3c_error(BAD, "%s.data: must be aligned to its %d-byte elements", a->name, es);
    if (t->stride[3] != 1) return fa3c_error(BAD, "%s: stride of dim 3 must be 1 (got %lld)", a->name, (long long)t->stride[3]);
    for (int i = 0; i < 3; i++)
        if (t->stride[i] < 0)
            return fa3c_error(BAD, "%s: stride of dim %d must be >= 0 (got %lld)", a->name, i, (long long)t->stride[i]);
    if (!tensor_end(a, es)) return fa3c_error(BAD, "%s: its extent overflows the address space", a->name);
    if (a->is_output) {
        /* No two elements at one address: ordered by stride, each dim of more
         * than one element steps past everything the smaller ones span. */
        int order[4] = {0, 1, 2, 3};
        for (int i = 1; i < 4; i++)
            for (int j = i; j > 0 && t->stride[order[j]] < t->stride[order[j - 1]]; j--) {
                int x = order[j];
                order[j] = order[j - 1];
                order[j - 1] = x;
            }
        int64_t span = 1;
        for (int i = 0; i < 4; i++) {
            const int d = order[i];
            if (a->n[d] <= 1) continue;
            if (t->stride[d] < span)
                return fa3c_error(BAD, "%s: stride of dim %d (%lld) makes elements share an address", a->name, d,
                                  (long long)t->stride[d]);
            span = t->stride[d] * (a->n[d] - 1) + span;
        }
    }
    return FA3C_STATUS_OK;
}

static fa3c_status check_scalars(const fa3c_append_params *p) {
    if ((int)p->dtype < FA3C_DTYPE_FP32 || (int)p->dtype > FA3C_DTYPE_E4M3)
        return fa3c_error(BAD, "dtype: unknown dtype %d (expected 0..3: FP32, FP16, BF16, E4M3)", (int)p->dtype);
    if ((int)p->backend < FA3C_BACKEND_AUTO || (int)p->backend > FA3C_BACKEND_CPU_REFERENCE)
        return fa3c_error(BAD, "backend: unknown backend %d (expected 0..3)", (int)p->backend);
    if (p->batch < 0) return fa3c_error(BAD, "batch: must be >= 0 (got %d)", p->batch);
    if (p->seqlen_new < 0 || p->seqlen_new > FA3C_MAX_SEQLEN)
        return fa3c_error(BAD, "seqlen_new: must be in [0, FA3C_MAX_SEQLEN] (got %d)", p->seqlen_new);
    if (p->heads_kv < 1) return fa3c_error(BAD, "heads_kv: must be >= 1 (got %d)", p->heads_kv);
    if (p->headdim < 1 || p->headdim > 512) return fa3c_error(BAD, "headdim: must be in [1, 512] (got %d)", p->headdim);
    if (p->headdim_v < 0 || p->headdim_v > 512)
        return fa3c_error(BAD, "headdim_v: must be 0 (= headdim) or in [1, 512] (got %d)", p->headdim_v);
    if (p->page_table) {
        if (p->page_size < 1 || p->page_size > FA3C_MAX_SEQLEN)
            return fa3c_error(BAD, "page_size: must be in [1, FA3C_MAX_SEQLEN] with a page table (got %d)", p->page_size);
        if (p->num_pages < 1) return fa3c_error(BAD, "num_pages: must be >= 1 with a page table (got %d)", p->num_pages);
        if (p->page_table_stride < 1 || p->page_table_stride > INT32_MAX)
            return fa3c_error(BAD, "page_table_stride: must be in [1, 2^31 - 1] (got %lld)", (long long)p->page_table_stride);
        if ((uintptr_t)p->page_table % 4) return fa3c_error(BAD, "page_table: must be 4-byte aligned");
    } else if (p->seqlen_cache < 1 || p->seqlen_cache > FA3C_MAX_SEQLEN) {
        return fa3c_error(BAD, "seqlen_cache: must be in [1, FA3C_MAX_SEQLEN] for a contiguous cache (got %d)",
                          p->seqlen_cache);
    }
    if (!p->cache_seqlens) return fa3c_error(BAD, "cache_seqlens: is NULL (each sequence's filled length is needed)");
    if ((uintptr_t)p->cache_seqlens % 4) return fa3c_error(BAD, "cache_seqlens: must be 4-byte aligned");
    return FA3C_STATUS_OK;
}

/* Every position a sequence's new tokens go to lies in the cache: checked on
 * the host (CPU backends, or copies for fa3c_append_kv_check_device). */
static fa3c_status check_lengths(const fa3c_append_params *p, const int32_t *lens, const int32_t *table) {
    const int64_t cap = capacity(p);
    for (int b = 0; b < p->batch; b++) {
        if (lens[b] < 0 || (int64_t)lens[b] + p->seqlen_new > cap)
            return fa3c_error(BAD, "cache_seqlens[%d]: must be in [0, %lld - seqlen_new = %lld] (got %d): the new tokens "
                              "must fit in the cache", b, (long long)cap, (long long)(cap - p->seqlen_new), lens[b]);
        if (!table) continue;
        for (int64_t i = lens[b] / p->page_size; i <= ((int64_t)lens[b] + p->seqlen_new - 1) / p->page_size; i++) {
            const int32_t page = table[(int64_t)b * p->page_table_stride + i];
            if (page < 0 || page >= p->num_pages)
                return fa3c_error(BAD, "page_table[%d][%lld]: page %d is out of range [0, num_pages = %d)", b,
                                  (long long)i, page, p->num_pages);
        }
    }
    return FA3C_STATUS_OK;
}

/* Validates p; *backend is what it runs on. */
static fa3c_status prepare(const fa3c_append_params *p, fa3c_backend *backend, int check_device, void *stream) {
    if (!p) return fa3c_error(BAD, "p: the params pointer is NULL");
    fa3c_status s = check_scalars(p);
    if (s != FA3C_STATUS_OK) return s;
    *backend = p->backend;
    if (p->batch == 0 || p->seqlen_new == 0) return FA3C_STATUS_OK;   /* nothing to write, nothing touched */

    const int es = elem_size(p->dtype), dv = headdim_v(p);
    const int64_t outer = p->page_table ? p->num_pages : p->batch, rows = p->page_table ? p->page_size : p->seqlen_cache;
    const append_tensor ts[4] = {
        {"k_new", &p->k_new, {p->batch, p->seqlen_new, p->heads_kv, p->headdim}, 0},
        {"v_new", &p->v_new, {p->batch, p->seqlen_new, p->heads_kv, dv}, 0},
        {"k_cache", &p->k_cache, {outer, rows, p->heads_kv, p->headdim}, 1},
        {"v_cache", &p->v_cache, {outer, rows, p->heads_kv, dv}, 1},
    };
    for (int i = 0; i < 4; i++)
        if ((s = check_tensor(&ts[i], es)) != FA3C_STATUS_OK) return s;

    /* The backend, and every pointer the memory it reads (asked only where a
     * CUDA runtime can answer), as the attention calls resolve theirs. */
    fa3c_clear_error();
    const int usable = fa3c_cuda_backend_usable();
    if (!usable && *backend == FA3C_BACKEND_CUDA) {
        char why[256];
        snprintf(why, sizeof why, "%s", fa3c_last_error());
        return fa3c_error(FA3C_STATUS_NO_DEVICE, "backend: CUDA was requested but is not usable: %s",
                          why[0] ? why : "no usable sm_90 GPU");
    }
    if (*backend == FA3C_BACKEND_AUTO)
        *backend = usable && fa3c_cuda_pointer_is_device(p->k_cache.data) ? FA3C_BACKEND_CUDA : FA3C_BACKEND_CPU;
    const int device = *backend == FA3C_BACKEND_CUDA;
    const struct {
        const char *name;
        const void *ptr;
    } ptrs[6] = {{"k_new.data", p->k_new.data},   {"v_new.data", p->v_new.data},   {"k_cache.data", p->k_cache.data},
                 {"v_cache.data", p->v_cache.data}, {"cache_seqlens", p->cache_seqlens}, {"page_table", p->page_table}};
    for (int i = 0; i < 6 && usable; i++)
        if (ptrs[i].ptr && fa3c_cuda_pointer_is_device(ptrs[i].ptr) != device)
            return fa3c_error(BAD, "%s: is %s memory; the %s backend needs %s memory", ptrs[i].name,
                              device ? "host" : "device", device ? "CUDA" : "CPU", device ? "device" : "host");

    /* Outputs apart from the inputs (by byte range; the two caches by start:
     * one buffer may interleave them). */
    uintptr_t lo[6], hi[6];
    for (int i = 0; i < 4; i++) lo[i] = (uintptr_t)ts[i].t->data, hi[i] = tensor_end(&ts[i], es);
    lo[4] = (uintptr_t)p->cache_seqlens, hi[4] = lo[4] + (uintptr_t)p->batch * 4;
    lo[5] = (uintptr_t)p->page_table;
    hi[5] = lo[5] + (uintptr_t)(p->page_table ? (int64_t)p->batch * p->page_table_stride * 4 : 0);
    const char *names[6] = {"k_new", "v_new", "k_cache", "v_cache", "cache_seqlens", "page_table"};
    for (int o = 2; o < 4; o++)
        for (int i = 0; i < 6; i++)
            if (i != o && (i < 2 || i > 3) && lo[i] < hi[o] && lo[o] < hi[i])
                return fa3c_error(BAD, "%s: overlaps %s (the cache is written)", names[o], names[i]);
    if (lo[2] == lo[3]) return fa3c_error(BAD, "v_cache: starts where k_cache does");

    if (!device) return check_lengths(p, p->cache_seqlens, p->page_table);
    if (!check_device) return FA3C_STATUS_OK;
    /* fa3c_append_kv_check_device: the device arrays on the host. */
    const int64_t table = p->page_table ? (int64_t)p->batch * p->page_table_stride : 0;
    int32_t *lens = (int32_t *)malloc((size_t)p->batch * 4), *tab = table ? (int32_t *)malloc((size_t)table * 4) : NULL;
    if (!lens || (table && !tab)) s = fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "checking device metadata: no host memory");
    if (s == FA3C_STATUS_OK) s = fa3c_cuda_copy_to_host(lens, p->cache_seqlens, (size_t)p->batch * 4, stream);
    if (s == FA3C_STATUS_OK && tab) s = fa3c_cuda_copy_to_host(tab, p->page_table, (size_t)table * 4, stream);
    if (s == FA3C_STATUS_OK) s = check_lengths(p, lens, tab);
    free(lens);
    free(tab);
    return s;
}

/* The CPU backends: one row (headdim or headdim_v elements) at a time. */
static void append_cpu(const fa3c_append_params *p) {
    const int es = elem_size(p->dtype), dims[2] = {p->headdim, headdim_v(p)};
    const fa3c_tensor *news[2] = {&p->k_new, &p->v_new}, *caches[2] = {&p->k_cache, &p->v_cache};
    for (int b = 0; b < p->batch; b++)
        for (int j = 0; j < p->seqlen_new; j++) {
            const int64_t pos = (int64_t)p->cache_seqlens[b] + j;
            int64_t outer = b, row = pos;
            if (p->page_table) {
                outer = p->page_table[(int64_t)b * p->page_table_stride + pos / p->page_size];
                row = pos % p->page_size;
            }
            for (int t = 0; t < 2; t++)
                for (int h = 0; h < p->heads_kv; h++) {
                    const int64_t *si = news[t]->stride, *so = caches[t]->stride;
                    memcpy((char *)caches[t]->data + (outer * so[0] + row * so[1] + h * so[2]) * es,
                           (const char *)news[t]->data + ((int64_t)b * si[0] + j * si[1] + h * si[2]) * es,
                           (size_t)dims[t] * es);
                }
        }
}

fa3c_status fa3c_append_kv_check(const fa3c_append_params *p) {
    fa3c_backend backend;
    fa3c_status s = prepare(p, &backend, 0, NULL);
    if (s == FA3C_STATUS_OK) fa3c_clear_error();
    return s;
}

fa3c_status fa3c_append_kv_check_device(const fa3c_append_params *p, void *stream) {
    fa3c_backend backend;
    fa3c_status s = prepare(p, &backend, 1, stream);
    if (s == FA3C_STATUS_OK) fa3c_clear_error();
    return s;
}

fa3c_status fa3c_append_kv(const fa3c_append_params *p, void *stream) {
    fa3c_backend backend;
    fa3c_status s = prepare(p, &backend, 0, NULL);
    if (s != FA3C_STATUS_OK) return s;
    fa3c_clear_error();
    if (p->batch == 0 || p->seqlen_new == 0) return FA3C_STATUS_OK;
    if (backend == FA3C_BACKEND_CUDA) {
        s = fa3c_cuda_append_kv(p, stream);
    } else {
        append_cpu(p);
        s = FA3C_STATUS_OK;
    }
    if (s == FA3C_STATUS_OK) fa3c_clear_error();
    return s;
}
