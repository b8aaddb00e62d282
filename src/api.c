/* The public entry points: validate a call completely, resolve the backend
 * and the defaults, then hand a valid copy of the params to one backend.
 *
 * Validation runs in a fixed order so that the first message names the most
 * basic mistake: scalars of the problem, pointers and strides, backend and
 * memory kind, host-side arrays (CPU only), tensor extents, aliasing, and
 * last the backend's own "can I do this" check. Nothing is written before
 * all of it has passed. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "problem.h"

/* What the validator needs to know about one tensor argument. */
enum row_kind {
    ROWS_Q,  /* (batch, seqlen_q, heads, d), varlen over cu_seqlens_q */
    ROWS_K,  /* (batch, seqlen_k, heads_kv, d), varlen over cu_seqlens_k, or paged */
    ROWS_DK  /* like ROWS_K but never paged (dk, dv are always per-sequence) */
};

typedef struct tensor_arg {
    const char *name;
    const fa3c_tensor *t;
    enum row_kind rows;
    int heads;
    int elem_size;
    int is_output;
    int dim;     /* its head dim: problem.headdim, or headdim_v for v, out, dout, dv */
} tensor_arg;

/* One call, forward or backward, described uniformly. */
typedef struct call_desc {
    int is_bwd;
    const fa3c_problem *pr;
    tensor_arg tensors[8];
    int ntensors;
    const float *lse;
    const float *descale[3]; /* forward only */
    const float *block_descale[3]; /* forward only: per block of FA3C_FP8_BLOCK_ROWS rows */
    float *dsinks;           /* backward only */
    fa3c_backend backend;
    int check_device;        /* fa3c_*_check_device: read the device-resident arrays too, on stream */
    void *stream;
} call_desc;

static const char *const descale_names[3] = {"q_descale", "k_descale", "v_descale"};
static const char *const block_descale_names[3] = {"q_block_descale", "k_block_descale", "v_block_descale"};

static const char *dtype_name(fa3c_dtype d) {
    switch (d) {
    case FA3C_DTYPE_FP32: return "FP32";
    case FA3C_DTYPE_FP16: return "FP16";
    case FA3C_DTYPE_BF16: return "BF16";
    case FA3C_DTYPE_E4M3: return "E4M3";
    }
    return "?";
}

static int dtype_size(fa3c_dtype d) {
    return d == FA3C_DTYPE_FP32 ? 4 : d == FA3C_DTYPE_E4M3 ? 1 : 2;
}

/* ---- checked int64 arithmetic: sizes may be absurd, the checks must not overflow ---- */

static int add_ok(int64_t *acc, int64_t x) {
    if (x > INT64_MAX - *acc) return 0;
    *acc += x;
    return 1;
}

static int mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* Entries of block descale i (q, k, v): (batch, heads, ceil(seqlen / FA3C_FP8_BLOCK_ROWS)). */
static int64_t block_descale_count(const fa3c_problem *pr, int i) {
    const int64_t rows = i == 0 ? pr->seqlen_q : pr->seqlen_k, heads = i == 0 ? pr->heads_q : pr->heads_kv;
    int64_t n;
    if (!mul_ok((int64_t)pr->batch * heads, (rows + FA3C_FP8_BLOCK_ROWS - 1) / FA3C_FP8_BLOCK_ROWS, &n))
        n = INT64_MAX / 8;   /* past any array: the tensors' extents fail the call */
    return n;
}

/* ---- 1. scalar fields of the problem (no memory is read) ---- */

/* Nothing to compute: no batch, no query heads, or a forward without
 * queries. Such a call succeeds and touches no memory (its tensors have no
 * elements, so their pointers and strides are not looked at). A backward
 * without queries (dk, dv = 0) or any call without keys (out = 0, lse =
 * -inf) has outputs to write and is not empty. */
static int problem_is_empty(const fa3c_problem *pr, int is_bwd) {
    return pr->batch == 0 || pr->heads_q == 0 || (!is_bwd && pr->seqlen_q == 0);
}

static fa3c_status check_problem_scalars(const fa3c_problem *pr, int is_bwd) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    if ((int)pr->dtype < FA3C_DTYPE_FP32 || (int)pr->dtype > FA3C_DTYPE_E4M3)
        return fa3c_error(BAD, "problem.dtype: unknown dtype %d (expected 0..3: FP32, FP16, BF16, E4M3)",
                          (int)pr->dtype);
    if (pr->batch < 0) return fa3c_error(BAD, "problem.batch: must be >= 0 (got %d)", pr->batch);
    if (pr->seqlen_q < 0 || pr->seqlen_q > FA3C_MAX_SEQLEN)
        return fa3c_error(BAD, "problem.seqlen_q: must be in [0, FA3C_MAX_SEQLEN = %d] (got %d)", FA3C_MAX_SEQLEN,
                          pr->seqlen_q);
    if (pr->seqlen_k < 0 || pr->seqlen_k > FA3C_MAX_SEQLEN)
        return fa3c_error(BAD, "problem.seqlen_k: must be in [0, FA3C_MAX_SEQLEN = %d] (got %d)", FA3C_MAX_SEQLEN,
                          pr->seqlen_k);
    if (pr->heads_q < 0) return fa3c_error(BAD, "problem.heads_q: must be >= 0 (got %d)", pr->heads_q);
    if (pr->heads_kv < 0 || (pr->heads_kv == 0 && pr->heads_q > 0))
        return fa3c_error(BAD, "problem.heads_kv: must be >= 1, or 0 with heads_q 0 (got %d)", pr->heads_kv);
    if (pr->heads_kv > 0 && pr->heads_q % pr->heads_kv != 0)
        return fa3c_error(BAD, "problem.heads_q (%d) must be a multiple of problem.heads_kv (%d)",
                          pr->heads_q, pr->heads_kv);
    if (pr->headdim < 8 || pr->headdim > 256 || pr->headdim % 8 != 0)
        return fa3c_error(BAD, "problem.headdim: must be a multiple of 8 in [8, 256] (got %d)", pr->headdim);
    if (pr->headdim_v != 0 && (pr->headdim_v < 8 || pr->headdim_v > 512 || pr->headdim_v % 8 != 0))
        return fa3c_error(BAD, "problem.headdim_v: must be 0 (= headdim) or a multiple of 8 in [8, 512] (got %d)",
                          pr->headdim_v);
    if (!isfinite(pr->softmax_scale) || pr->softmax_scale < 0)
        return fa3c_error(BAD, "problem.softmax_scale: must be finite and >= 0, 0 meaning 1/sqrt(headdim) (got %g)",
                          (double)pr->softmax_scale);
    if (pr->causal != 0 && pr->causal != 1)
        return fa3c_error(BAD, "problem.causal: must be 0 or 1 (got %d)", pr->causal);
    if (pr->window_left < -1)
        return fa3c_error(BAD, "problem.window_left: must be >= -1, -1 = unbounded (got %d)", pr->window_left);
    if (pr->window_right < -1)
        return fa3c_error(BAD, "problem.window_right: must be >= -1, -1 = unbounded (got %d)", pr->window_right);
    if (!isfinite(pr->softcap) || pr->softcap < 0)
        return fa3c_error(BAD, "problem.softcap: must be finite and >= 0, 0 = off (got %g)", (double)pr->softcap);
    if (pr->page_table) {
        if (pr->cu_seqlens_k)
            return fa3c_error(BAD, "problem.page_table: cannot be combined with problem.cu_seqlens_k "
                                   "(paged keys are found through the page table, not token offsets)");
        if (pr->page_size < 1)
            return fa3c_error(BAD, "problem.page_size: must be >= 1 with a page table (got %d)", pr->page_size);
        if (pr->num_pages < 1)
            return fa3c_error(BAD, "problem.num_pages: must be >= 1 with a page table (got %d)", pr->num_pages);
        if (pr->page_size > FA3C_MAX_SEQLEN)
            return fa3c_error(BAD, "problem.page_size: must be <= FA3C_MAX_SEQLEN = %d (got %d)", FA3C_MAX_SEQLEN,
                              pr->page_size);
        int64_t need = ((int64_t)pr->seqlen_k + pr->page_size - 1) / pr->page_size;
        if (pr->page_table_stride > INT32_MAX)   /* keeps batch * stride far inside int64 */
            return fa3c_error(BAD, "problem.page_table_stride: must be <= 2^31 - 1 (got %lld)",
                              (long long)pr->page_table_stride);
        if (pr->page_table_stride < need)
            return fa3c_error(BAD, "problem.page_table_stride: must be >= ceil(seqlen_k / page_size) = %lld (got %lld)",
                              (long long)need, (long long)pr->page_table_stride);
    }
    if (is_bwd && pr->leftpad_k)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.leftpad_k: the backward takes no left-padded KV "
                          "cache (a forward-only argument, as in FA3)");
    if (!problem_is_empty(pr, is_bwd)) {
        if (pr->seqlen_k == 0)
            return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.seqlen_k: 0 keys (out = 0, lse = -inf, dq = 0) "
                              "is not supported yet");
        if (is_bwd && pr->seqlen_q == 0)
            return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.seqlen_q: a backward without queries (dk = dv "
                              "= 0) is not supported yet");
    }
    return FA3C_STATUS_OK;
}

/* ---- 2. pointers and strides (no memory is read) ---- */

static int elem_aligned(const void *ptr, int size) { return ((uintptr_t)ptr % (uintptr_t)size) == 0; }

static fa3c_status check_tensor_form(const tensor_arg *a) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    const fa3c_tensor *t = a->t;
    if (!t->data) return fa3c_error(BAD, "%s.data: is NULL", a->name);
    for (int dim = 0; dim < 4; dim++)
        if (t->stride[dim] < 0)
            return fa3c_error(BAD, "%s: stride of dim %d must be >= 0 (got %lld)", a->name, dim,
                              (long long)t->stride[dim]);
    if (t->stride[3] != 1)
        return fa3c_error(BAD, "%s: stride of dim 3 must be 1 (got %lld)", a->name, (long long)t->stride[3]);
    /* Misaligned element loads are undefined behaviour in C; refuse them everywhere. */
    if (!elem_aligned(t->data, a->elem_size))
        return fa3c_error(BAD, "%s.data: must be aligned to its %d-byte elements (address %p)", a->name,
                          a->elem_size, t->data);
    return FA3C_STATUS_OK;
}

static fa3c_status check_host_array_ptr(const char *name, const void *ptr, int size) {
    if (ptr && !elem_aligned(ptr, size))
        return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT, "%s: must be aligned to %d bytes (address %p)", name, size, ptr);
    return FA3C_STATUS_OK;
}

/* ---- 3. backend and memory kind ---- */

static void tensor_dims(const call_desc *c, const tensor_arg *a, int host_arrays, int64_t n[4], int64_t s[4]);

/* One argument: a tensor (its four dims as the backends index them, unit
 * stride on the last) or a contiguous array of `count` elements. */
typedef struct {
    const char *name;
    uintptr_t lo;
    int is_output, is_tensor, elem;
    int exact;   /* 0: its size is only bounded (device-side cu_seqlens: batch x the longest sequence) */
    int64_t n[4], st[4], count;
} arg_mem;

static int add_array(arg_mem *m, int k, const char *name, const void *p, int64_t count, int elem, int is_output) {
    if (!p || count <= 0) return k;
    memset(&m[k], 0, sizeof m[k]);
    m[k].name = name;
    m[k].lo = (uintptr_t)p;
    m[k].count = count;
    m[k].elem = elem;
    m[k].is_output = is_output;
    m[k].exact = 1;
    return k + 1;
}

/* Every argument the backend touches, in argument order: its address and
 * (for the overlap check, section 6) the memory it reaches; host_arrays = 0
 * reads no metadata array (the token count is then a bound). */
static int collect_memory(const call_desc *c, int host_arrays, arg_mem *m) {
    const fa3c_problem *pr = c->pr;
    int k = 0;
    for (int i = 0; i < c->ntensors; i++) {
        const tensor_arg *a = &c->tensors[i];
        memset(&m[k], 0, sizeof m[k]);
        m[k].name = a->name;
        m[k].lo = (uintptr_t)a->t->data;
        m[k].is_output = a->is_output;
        m[k].is_tensor = 1;
        m[k].elem = a->elem_size;
        tensor_dims(c, a, host_arrays, m[k].n, m[k].st);
        const int32_t *cu = a->rows == ROWS_Q ? pr->cu_seqlens_q : pr->cu_seqlens_k;
        m[k].exact = host_arrays || !cu || (a->rows == ROWS_K && pr->page_table);
        k++;
    }
    const int64_t lse_rows = pr->cu_seqlens_q && host_arrays ? pr->cu_seqlens_q[pr->batch]
                                                             : (int64_t)pr->batch * pr->seqlen_q;
    int64_t lse_count, pages = 0;
    if (!mul_ok(lse_rows, pr->heads_q, &lse_count)) lse_count = INT64_MAX / 8;
    k = add_array(m, k, "lse", c->lse, lse_count, 4, !c->is_bwd);
    if (c->lse && pr->cu_seqlens_q && !host_arrays) m[k - 1].exact = 0;
    k = add_array(m, k, "problem.cu_seqlens_q", pr->cu_seqlens_q, (int64_t)pr->batch + 1, 4, 0);
    k = add_array(m, k, "problem.cu_seqlens_k", pr->cu_seqlens_k, (int64_t)pr->batch + 1, 4, 0);
    k = add_array(m, k, "problem.seqused_k", pr->seqused_k, pr->batch, 4, 0);
    k = add_array(m, k, "problem.seqused_q", pr->seqused_q, pr->batch, 4, 0);
    k = add_array(m, k, "problem.leftpad_k", pr->leftpad_k, pr->batch, 4, 0);
    if (pr->page_table && pr->page_size > 0) {   /* rows of page_table_stride, each up to the longest sequence's pages */
        const int64_t per_seq = ((int64_t)pr->seqlen_k + pr->page_size - 1) / pr->page_size;
        if (!mul_ok((int64_t)pr->batch - 1, pr->page_table_stride, &pages) || !add_ok(&pages, per_seq))
            pages = INT64_MAX / 8;
    }
    k = add_array(m, k, "problem.page_table", pr->page_table, pages, 4, 0);
    for (int i = 0; i < 3; i++)
        k = add_array(m, k, descale_names[i], c->descale[i], (int64_t)pr->batch * pr->heads_kv, 4, 0);
    for (int i = 0; i < 3; i++)
        k = add_array(m, k, block_descale_names[i], c->block_descale[i], block_descale_count(pr, i), 4, 0);
    k = add_array(m, k, "problem.sinks", pr->sinks, pr->heads_q, 4, 0);
    k = add_array(m, k, "dsinks", c->dsinks, pr->heads_q, 4, 1);
    return k;
}

/* The backend a call runs on: b, or for AUTO CUDA when `probe` (its first
 * tensor) is device memory and a GPU is usable. *usable: whether a CUDA
 * runtime is there to answer questions about memory kinds. */
static fa3c_status pick_backend(fa3c_backend b, const void *probe, fa3c_backend *out, int *usable) {
    fa3c_clear_error();
    *usable = fa3c_cuda_backend_usable();
    if (!*usable && b == FA3C_BACKEND_CUDA) {
        /* The CUDA side may have said why (built without it, no sm_90 GPU, ...). */
        char why[256];
        strncpy(why, fa3c_last_error(), sizeof why - 1);
        why[sizeof why - 1] = '\0';
        return fa3c_error(FA3C_STATUS_NO_DEVICE, "backend: CUDA was requested but is not usable: %s",
                          why[0] ? why : "no usable sm_90 GPU");
    }
    if (b == FA3C_BACKEND_AUTO)
        b = *usable && fa3c_cuda_pointer_is_device(probe) ? FA3C_BACKEND_CUDA : FA3C_BACKEND_CPU;
    *out = b;
    return FA3C_STATUS_OK;
}

/* A pointer backend b reads must be its kind of memory (ask only when usable). */
static fa3c_status check_memory_kind(const char *name, const void *ptr, fa3c_backend b) {
    const int want_device = b == FA3C_BACKEND_CUDA, is_device = fa3c_cuda_pointer_is_device(ptr) != 0;
    if (is_device != want_device)
        return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT, "%s is %s memory; the %s backend needs %s memory", name,
                          is_device ? "device" : "host", want_device ? "CUDA" : "CPU", want_device ? "device" : "host");
    return FA3C_STATUS_OK;
}

static fa3c_status resolve_backend(const call_desc *c, fa3c_backend *out) {
    arg_mem m[28];
    const int n = collect_memory(c, 0, m);
    int usable;
    fa3c_status s = pick_backend(c->backend, c->tensors[0].t->data, out, &usable);
    for (int i = 0; i < n && usable && s == FA3C_STATUS_OK; i++)
        s = check_memory_kind(m[i].name, (const void *)m[i].lo, *out);
    return s;
}

/* ---- 4. host-side arrays (only when they are host memory: CPU backends) ---- */

static fa3c_status check_cu_seqlens(const char *name, const int32_t *cu, int batch, int max_len,
                                    const char *max_name) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    if (cu[0] != 0) return fa3c_error(BAD, "%s[0]: must be 0 (got %d)", name, cu[0]);
    for (int b = 0; b < batch; b++) {
        int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0)
            return fa3c_error(BAD, "%s: must be non-decreasing, but %s[%d] = %d < %s[%d] = %d", name, name, b + 1,
                              cu[b + 1], name, b, cu[b]);
        if (len > max_len)
            return fa3c_error(BAD, "%s: sequence %d has length %lld > %s (%d), which must be the maximum length",
                              name, b, (long long)len, max_name, max_len);
    }
    return FA3C_STATUS_OK;
}

static fa3c_status check_host_arrays(const call_desc *c) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    const fa3c_problem *pr = c->pr;
    fa3c_status s;
    if (pr->cu_seqlens_q &&
        (s = check_cu_seqlens("problem.cu_seqlens_q", pr->cu_seqlens_q, pr->batch, pr->seqlen_q,
                              "problem.seqlen_q")) != FA3C_STATUS_OK)
        return s;
    if (pr->cu_seqlens_k &&
        (s = check_cu_seqlens("problem.cu_seqlens_k", pr->cu_seqlens_k, pr->batch, pr->seqlen_k,
                              "problem.seqlen_k")) != FA3C_STATUS_OK)
        return s;
    if (pr->seqused_k)
        for (int b = 0; b < pr->batch; b++)
            if (pr->seqused_k[b] < 0 || pr->seqused_k[b] > pr->seqlen_k)
                return fa3c_error(BAD, "problem.seqused_k[%d]: must be in [0, problem.seqlen_k = %d] (got %d)", b,
                                  pr->seqlen_k, pr->seqused_k[b]);
    if (pr->seqused_q)
        for (int b = 0; b < pr->batch; b++)
            if (pr->seqused_q[b] < 0 || pr->seqused_q[b] > pr->seqlen_q)
                return fa3c_error(BAD, "problem.seqused_q[%d]: must be in [0, problem.seqlen_q = %d] (got %d)", b,
                                  pr->seqlen_q, pr->seqused_q[b]);
    if (pr->leftpad_k)   /* after seqused_k: its count is the bound */
        for (int b = 0; b < pr->batch; b++) {
            const int keys = fa3c_seqlen_k_of(pr, b) + pr->leftpad_k[b];   /* stored, or seqused_k[b] */
            if (pr->leftpad_k[b] < 0 || pr->leftpad_k[b] > keys)
                return fa3c_error(BAD, "problem.leftpad_k[%d]: must be in [0, the sequence's keys = %d] (got %d)", b,
                                  keys, pr->leftpad_k[b]);
        }
    if (pr->page_table) {
        /* Only the entries that cover used keys are read; the rest may hold anything (e.g. -1). */
        for (int b = 0; b < pr->batch; b++) {
            const int64_t lp = fa3c_leftpad_k_of(pr, b), n = fa3c_seqlen_k_of(pr, b);
            const int64_t used = n > 0 ? (lp + n + pr->page_size - 1) / pr->page_size : 0;
            for (int64_t i = n > 0 ? lp / pr->page_size : 0; i < used; i++) {
                int32_t page = pr->page_table[(int64_t)b * pr->page_table_stride + i];
                if (page < 0 || page >= pr->num_pages)
                    return fa3c_error(BAD, "problem.page_table[%d][%lld]: page %d is out of range [0, problem.num_pages = %d)",
                                      b, (long long)i, page, pr->num_pages);
            }
        }
    }
    for (int i = 0; i < 6; i++) {
        const float *d = i < 3 ? c->descale[i] : c->block_descale[i - 3];
        if (!d) continue;
        const int64_t n = i < 3 ? (int64_t)pr->batch * pr->heads_kv : block_descale_count(pr, i - 3);
        if (n >= INT64_MAX / 8) continue;   /* an overflowed count: the tensors' extents refuse the call */
        for (int64_t j = 0; j < n; j++)
            if (!isfinite(d[j]) || d[j] <= 0)
                return fa3c_error(BAD, "%s[%lld]: must be finite and > 0 (got %g)",
                                  i < 3 ? descale_names[i] : block_descale_names[i - 3], (long long)j, (double)d[j]);
    }
    return FA3C_STATUS_OK;
}

/* ---- 5. extents: the largest offset each tensor reaches must be addressable ---- */

/* The (extent, stride) pairs of a tensor's four dims as the backends index it. */
static void tensor_dims(const call_desc *c, const tensor_arg *a, int host_arrays, int64_t n[4], int64_t s[4]) {
    const fa3c_problem *pr = c->pr;
    for (int d = 0; d < 4; d++) s[d] = a->t->stride[d];
    n[2] = a->heads;
    n[3] = a->dim;
    const int32_t *cu = a->rows == ROWS_Q ? pr->cu_seqlens_q : pr->cu_seqlens_k;
    int maxlen = a->rows == ROWS_Q ? pr->seqlen_q : pr->seqlen_k;
    if (a->rows == ROWS_K && pr->page_table) {
        n[0] = pr->num_pages;
        n[1] = pr->page_size;
    } else if (cu) {
        /* Varlen: one token axis. Device-side cu_seqlens can't be read, but the
         * contract bounds the total by batch * max length. */
        n[0] = 1;
        n[1] = host_arrays ? cu[pr->batch] : (int64_t)pr->batch * maxlen;
    } else {
        n[0] = pr->batch;
        n[1] = maxlen;
    }
}

static fa3c_status check_extent(const char *name, const void *data, int elem_size, const int64_t n[4],
                                const int64_t s[4]) {
    int64_t last = 0, bytes;
    int ok = 1;
    for (int d = 0; d < 4 && ok; d++) {
        int64_t step;
        ok = n[d] <= 0 || (mul_ok(n[d] - 1, s[d], &step) && add_ok(&last, step));
    }
    ok = ok && last < INT64_MAX && mul_ok(last + 1, elem_size, &bytes);
    if (!ok || (uint64_t)bytes > (uint64_t)(UINTPTR_MAX - (uintptr_t)data))
        return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT,
                          "%s: shape (%lld, %lld, %lld, %lld) with strides (%lld, %lld, %lld, %lld) reaches past "
                          "the addressable range",
                          name, (long long)n[0], (long long)n[1], (long long)n[2], (long long)n[3], (long long)s[0],
                          (long long)s[1], (long long)s[2], (long long)s[3]);
    return FA3C_STATUS_OK;
}

/* Outputs must give every element its own address, or writes race and clobber.
 * Sufficient rule: ordered by stride, each dim steps past everything the
 * smaller dims span. It accepts every dense or padded layout; exotic
 * interleavings that would also be safe are refused. */
static fa3c_status check_output_distinct(const char *name, const int64_t n[4], const int64_t s[4]) {
    int order[4] = {0, 1, 2, 3};
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && s[order[j]] < s[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int64_t span = 0; /* largest offset reached by the dims taken so far */
    for (int i = 0; i < 4; i++) {
        int d = order[i];
        if (n[d] <= 1) continue;
        if (s[d] <= span)
            return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT,
                              "%s: stride of dim %d (%lld) makes distinct elements overlap; an output needs "
                              "a separate address for each element",
                              name, d, (long long)s[d]);
        span += (n[d] - 1) * s[d]; /* cannot overflow: check_extent passed */
    }
    return FA3C_STATUS_OK;
}

/* The smaller families' tensors (appends, quantization), each of shape n:
 * form, extent, and for an output a separate address per element. */
static fa3c_status check_tensor_shape(const tensor_arg *a, const int64_t n[4]) {
    fa3c_status s;
    if ((s = check_tensor_form(a)) != FA3C_STATUS_OK ||
        (s = check_extent(a->name, a->t->data, a->elem_size, n, a->t->stride)) != FA3C_STATUS_OK)
        return s;
    return a->is_output ? check_output_distinct(a->name, n, a->t->stride) : FA3C_STATUS_OK;
}

/* Bytes from a tensor's start to past its last element; 0 when it has none
 * (check_extent passed, so this cannot overflow). */
static int64_t tensor_span_bytes(const int64_t n[4], const int64_t st[4], int elem_size) {
    int64_t last = 0;
    for (int d = 0; d < 4; d++) {
        if (n[d] <= 0) return 0;
        last += (n[d] - 1) * st[d];
    }
    return (last + 1) * elem_size;
}

static fa3c_status check_extents(const call_desc *c, int host_arrays) {
    fa3c_status s;
    for (int i = 0; i < c->ntensors; i++) {
        const tensor_arg *a = &c->tensors[i];
        int64_t n[4], st[4];
        tensor_dims(c, a, host_arrays, n, st);
        if ((s = check_extent(a->name, a->t->data, a->elem_size, n, st)) != FA3C_STATUS_OK) return s;
        if (a->is_output && (s = check_output_distinct(a->name, n, st)) != FA3C_STATUS_OK) return s;
    }
    if (c->lse) {
        const fa3c_problem *pr = c->pr;
        int64_t rows = pr->cu_seqlens_q && host_arrays ? pr->cu_seqlens_q[pr->batch]
                                                       : (int64_t)pr->batch * pr->seqlen_q;
        int64_t n[4] = {1, 1, pr->heads_q, rows}, st[4] = {0, 0, rows, 1};
        if ((s = check_extent("lse", c->lse, 4, n, st)) != FA3C_STATUS_OK) return s;
    }
    return FA3C_STATUS_OK;
}

/* ---- 6. aliasing: outputs against every other argument ---- */

/* The bytes [lo, hi) of an array. */
static void array_bytes(const arg_mem *a, uintptr_t *lo, uintptr_t *hi) {
    int64_t bytes;
    *lo = a->lo;
    *hi = mul_ok(a->count, a->elem, &bytes) && (uint64_t)bytes <= (uint64_t)(UINTPTR_MAX - a->lo)
              ? a->lo + (uintptr_t)bytes : UINTPTR_MAX;
}

/* Does an element of the tensor fall in bytes [lo, hi)? Its rows (dim 3,
 * contiguous) sit at the offsets of dims 0-2; walking those from the
 * largest stride down, only the indices whose sub-block can reach [lo, hi)
 * are visited, so a small array against any layout of separate rows costs
 * a few steps. Past `budget` steps (outputs interleaved with themselves are
 * refused elsewhere, so only inputs get here) it answers yes. */
static int tensor_touches(const arg_mem *t, int level, const int *order, int64_t off, uintptr_t lo, uintptr_t hi,
                          int *budget) {
    const int64_t e = t->elem;
    if (--*budget < 0) return 1;
    if (level == 3) {   /* one row: [off, off + n3) elements */
        const uintptr_t a = t->lo + (uintptr_t)(off * e), b = a + (uintptr_t)(t->n[3] * e);
        return a < hi && lo < b;
    }
    const int d = order[level];
    int64_t below = t->n[3] * e;   /* bytes the dims after this one reach past their start */
    for (int l = level + 1; l < 3; l++) below += (t->n[order[l]] - 1) * t->st[order[l]] * e;
    /* A dim of one index steps nowhere (its stride may be anything: varlen's ignored batch stride). */
    const int64_t step = t->n[d] > 1 ? t->st[d] * e : 0, count = step == 0 ? 1 : t->n[d];
    /* Indices whose block [start, start + below) meets [lo, hi): start < hi and start + below > lo. */
    const int64_t start0 = (int64_t)(t->lo - 0) + off * e;   /* as an integer address */
    int64_t i_min = 0, i_max = count - 1;
    if (step > 0) {
        const int64_t need_lo = (int64_t)lo - below + 1 - start0, need_hi = (int64_t)hi - 1 - start0;
        if (need_lo > 0) i_min = (need_lo + step - 1) / step;
        i_max = need_hi < 0 ? -1 : need_hi / step < i_max ? need_hi / step : i_max;
    }
    for (int64_t i = i_min; i <= i_max; i++)
        if (tensor_touches(t, level + 1, order, off + i * t->st[d], lo, hi, budget)) return 1;
    return 0;
}

static int tensor_meets_array(const arg_mem *t, const arg_mem *a) {
    uintptr_t lo, hi;
    array_bytes(a, &lo, &hi);
    for (int d = 0; d < 4; d++)
        if (t->n[d] <= 0) return 0;
    int order[3] = {0, 1, 2};   /* dims 0-2 by stride, largest first */
    for (int i = 1; i < 3; i++)
        for (int j = i; j > 0 && t->st[order[j]] > t->st[order[j - 1]]; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    int budget = 1 << 16;
    return tensor_touches(t, 0, order, 0, lo, hi, &budget);
}

/* An output must not share memory with any other argument: the backends read
 * the inputs and metadata while they write it. A tensor against an array
 * (the lse, metadata), and arrays against each other, by the bytes they
 * touch; two tensors by their start address only: interleaved views of one
 * buffer (packed qkv, dq/dk/dv in one dqkv) are disjoint, and other partial
 * overlaps between tensors are the caller's bug (docs/API.md). Where a size
 * is only bounded (packed sequences whose cu_seqlens live on the device),
 * by start address too: the bound may reach into the next allocation. */
/* A tensor of no elements (packed sequences whose total is 0) touches no
 * memory, so it meets nothing, whatever its address. */
static int touches_nothing(const arg_mem *a) {
    return a->is_tensor && a->exact && (a->n[0] == 0 || a->n[1] == 0 || a->n[2] == 0 || a->n[3] == 0);
}

static fa3c_status check_aliasing(const call_desc *c, int host_arrays) {
    arg_mem m[28];
    const int n = collect_memory(c, host_arrays, m);
    for (int i = 0; i < n; i++) {
        if (!m[i].is_output || touches_nothing(&m[i])) continue;
        for (int j = 0; j < n; j++) {
            if (j == i || touches_nothing(&m[j])) continue;
            int clash;
            if ((m[i].is_tensor && m[j].is_tensor) || !m[i].exact || !m[j].exact) {
                clash = m[i].lo == m[j].lo;
            } else if (m[i].is_tensor || m[j].is_tensor) {
                clash = m[i].is_tensor ? tensor_meets_array(&m[i], &m[j]) : tensor_meets_array(&m[j], &m[i]);
            } else {
                uintptr_t a0, a1, b0, b1;
                array_bytes(&m[i], &a0, &a1);
                array_bytes(&m[j], &b0, &b1);
                clash = a0 < b1 && b0 < a1;
            }
            if (clash)
                return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT, "%s%s: must not %s %s (outputs are written while "
                                  "inputs are read)", m[i].name, m[i].is_tensor ? ".data" : "",
                                  m[i].lo == m[j].lo ? "alias" : "overlap", m[j].name);
        }
    }
    return FA3C_STATUS_OK;
}

/* ---- the common sequence ---- */

/* fa3c_*_check_device: the device-resident arrays copied to the host and
 * checked as check_host_arrays checks host ones, then the tensors' extents
 * with the true token counts (check_extents). The page table is copied in
 * the rows its checks read: (batch - 1) strides and one sequence's pages. */
static fa3c_status check_device_arrays(const call_desc *c) {
    const fa3c_problem *pr = c->pr;
    int64_t table = 0;
    if (pr->page_table)   /* validated sizes: fits in int64 (check_problem_scalars, check_extents) */
        table = ((int64_t)pr->batch - 1) * pr->page_table_stride +
                ((int64_t)pr->seqlen_k + pr->page_size - 1) / pr->page_size;
    const int64_t descales = (int64_t)pr->batch * pr->heads_kv;
    enum { N = 12 };
    const void *src[N] = {pr->cu_seqlens_q, pr->cu_seqlens_k, pr->seqused_k, pr->page_table,
                          c->descale[0],    c->descale[1],    c->descale[2], pr->seqused_q, pr->leftpad_k,
                          c->block_descale[0], c->block_descale[1], c->block_descale[2]};
    const int64_t count[N] = {(int64_t)pr->batch + 1, (int64_t)pr->batch + 1, pr->batch, table,
                              descales, descales, descales, pr->batch, pr->batch,
                              block_descale_count(pr, 0), block_descale_count(pr, 1), block_descale_count(pr, 2)};
    void *copy[N] = {0};
    fa3c_status s = FA3C_STATUS_OK;
    for (int i = 0; i < N && s == FA3C_STATUS_OK; i++) {
        if (!src[i] || count[i] <= 0 || count[i] >= INT64_MAX / 8) continue;   /* overflowed: check_extents refuses */
        const size_t bytes = (size_t)count[i] * 4;   /* int32 and float32 alike */
        if (!(copy[i] = malloc(bytes)))
            s = fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "checking device metadata: no host memory for %zu bytes", bytes);
        else
            s = fa3c_cuda_copy_to_host(copy[i], src[i], bytes, c->stream);
    }
    if (s == FA3C_STATUS_OK) {
        fa3c_problem h = *pr;
        call_desc hc = *c;
        hc.pr = &h;
        if (copy[0]) h.cu_seqlens_q = (const int32_t *)copy[0];
        if (copy[1]) h.cu_seqlens_k = (const int32_t *)copy[1];
        if (copy[2]) h.seqused_k = (const int32_t *)copy[2];
        if (copy[3]) h.page_table = (const int32_t *)copy[3];
        if (copy[7]) h.seqused_q = (const int32_t *)copy[7];
        if (copy[8]) h.leftpad_k = (const int32_t *)copy[8];
        for (int i = 0; i < 3; i++) {
            if (copy[4 + i]) hc.descale[i] = (const float *)copy[4 + i];
            hc.block_descale[i] = (const float *)copy[9 + i];   /* NULL where not copied: not read */
        }
        s = check_host_arrays(&hc);
        if (s == FA3C_STATUS_OK) s = check_extents(&hc, 1);
    }
    for (int i = 0; i < N; i++) free(copy[i]);
    return s;
}

static fa3c_status check_backend_value(fa3c_backend b) {
    if ((int)b < FA3C_BACKEND_AUTO || (int)b > FA3C_BACKEND_CPU_REFERENCE)
        return fa3c_error(FA3C_STATUS_INVALID_ARGUMENT, "backend: unknown backend %d (expected 0..3: AUTO, CPU, "
                          "CUDA, CPU_REFERENCE)", (int)b);
    return FA3C_STATUS_OK;
}

static fa3c_status validate(const call_desc *c, fa3c_backend *resolved) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    fa3c_status s;
    if ((s = check_backend_value(c->backend)) != FA3C_STATUS_OK) return s;
    for (int i = 0; i < c->ntensors; i++)
        if ((s = check_tensor_form(&c->tensors[i])) != FA3C_STATUS_OK) return s;
    if ((s = check_host_array_ptr("lse", c->lse, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("problem.cu_seqlens_q", c->pr->cu_seqlens_q, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("problem.cu_seqlens_k", c->pr->cu_seqlens_k, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("problem.seqused_k", c->pr->seqused_k, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("problem.seqused_q", c->pr->seqused_q, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("problem.leftpad_k", c->pr->leftpad_k, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("problem.page_table", c->pr->page_table, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("problem.sinks", c->pr->sinks, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("dsinks", c->dsinks, 4)) != FA3C_STATUS_OK)
        return s;
    for (int i = 0; i < 3; i++)
        if ((s = check_host_array_ptr(descale_names[i], c->descale[i], 4)) != FA3C_STATUS_OK ||
            (s = check_host_array_ptr(block_descale_names[i], c->block_descale[i], 4)) != FA3C_STATUS_OK)
            return s;

    if ((s = resolve_backend(c, resolved)) != FA3C_STATUS_OK) return s;
    int host_arrays = *resolved != FA3C_BACKEND_CUDA;
    if (host_arrays && (s = check_host_arrays(c)) != FA3C_STATUS_OK) return s;
    if (!host_arrays && c->check_device && (s = check_device_arrays(c)) != FA3C_STATUS_OK) return s;
    if ((s = check_extents(c, host_arrays)) != FA3C_STATUS_OK) return s;
    if (*resolved == FA3C_BACKEND_CUDA) {
        /* TMA needs 16-byte aligned base addresses. */
        for (int i = 0; i < c->ntensors; i++)
            if ((uintptr_t)c->tensors[i].t->data % 16 != 0)
                return fa3c_error(BAD, "%s.data: must be 16-byte aligned for the CUDA backend (address %p)",
                                  c->tensors[i].name, c->tensors[i].t->data);
    }
    return check_aliasing(c, host_arrays);
}

/* ---- forward ---- */

/* prepare_fwd / prepare_bwd: validate p and fill *out with the backend and
 * scale resolved. A problem with nothing to compute (problem_is_empty) has
 * its scalars validated only: its memory is not looked at, and the callers
 * touch none. check_device (fa3c_*_check_device): on the CUDA backend, also
 * the device-resident arrays, copied to the host on stream. */
static fa3c_status prepare_fwd(const fa3c_fwd_params *p, fa3c_fwd_params *out, int check_device, void *stream) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    fa3c_status s;
    if (!p) return fa3c_error(BAD, "p: the params pointer is NULL");
    const fa3c_problem *pr = &p->problem;
    if ((s = check_problem_scalars(pr, 0)) != FA3C_STATUS_OK) return s;
    if (p->num_splits < 0) return fa3c_error(BAD, "num_splits: must be >= 0, 0 = auto (got %d)", p->num_splits);
    const float *descale[3] = {p->q_descale, p->k_descale, p->v_descale};
    const float *block_descale[3] = {p->q_block_descale, p->k_block_descale, p->v_block_descale};
    for (int i = 0; i < 3; i++)
        if ((descale[i] || block_descale[i]) && pr->dtype != FA3C_DTYPE_E4M3)
            return fa3c_error(BAD, "%s: only valid with dtype E4M3 (dtype is %s)",
                              descale[i] ? descale_names[i] : block_descale_names[i], dtype_name(pr->dtype));
    *out = *p;
    if (problem_is_empty(pr, 0)) return check_backend_value(p->backend);

    int in = dtype_size(pr->dtype);
    int out_size = pr->dtype == FA3C_DTYPE_E4M3 ? 2 : in; /* E4M3 in -> BF16 out */
    call_desc c = {.is_bwd = 0, .pr = pr, .lse = p->lse, .backend = p->backend, .ntensors = 4,
                   .descale = {p->q_descale, p->k_descale, p->v_descale},
                   .block_descale = {p->q_block_descale, p->k_block_descale, p->v_block_descale},
                   .check_device = check_device,
                   .stream = stream};
    const int d = pr->headdim, dv = fa3c_headdim_v(pr);
    c.tensors[0] = (tensor_arg){"q", &p->q, ROWS_Q, pr->heads_q, in, 0, d};
    c.tensors[1] = (tensor_arg){"k", &p->k, ROWS_K, pr->heads_kv, in, 0, d};
    c.tensors[2] = (tensor_arg){"v", &p->v, ROWS_K, pr->heads_kv, in, 0, dv};
    c.tensors[3] = (tensor_arg){"out", &p->out, ROWS_Q, pr->heads_q, out_size, 1, dv};
    if (p->qv.data) {
        if (pr->dtype == FA3C_DTYPE_E4M3)
            return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "qv: not with dtype E4M3 (BF16, FP16, or FP32 on the CPU)");
        c.tensors[c.ntensors++] = (tensor_arg){"qv", &p->qv, ROWS_Q, pr->heads_q, in, 0, dv};
    }
    fa3c_backend backend;
    if ((s = validate(&c, &backend)) != FA3C_STATUS_OK) return s;
    if (p->qv.data && backend == FA3C_BACKEND_CUDA)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "qv: not on the CUDA backend yet (the CPU backends take it)");

    out->backend = backend;
    out->problem.softmax_scale = fa3c_softmax_scale(pr, p->qv.data != NULL);
    if (backend == FA3C_BACKEND_CUDA && (s = fa3c_cuda_fwd_supported(out)) != FA3C_STATUS_OK) return s;
    return FA3C_STATUS_OK;
}

/* What the check functions return: the status, the message cleared on success. */
static fa3c_status checked(fa3c_status s) {
    if (s == FA3C_STATUS_OK) fa3c_clear_error();
    return s;
}

fa3c_status fa3c_fwd_check(const fa3c_fwd_params *p) {
    fa3c_fwd_params r;
    return checked(prepare_fwd(p, &r, 0, NULL));
}

fa3c_status fa3c_fwd_check_device(const fa3c_fwd_params *p, void *stream) {
    fa3c_fwd_params r;
    return checked(prepare_fwd(p, &r, 1, stream));
}

fa3c_status fa3c_fwd(const fa3c_fwd_params *p, void *stream) {
    fa3c_fwd_params r;
    fa3c_status s = prepare_fwd(p, &r, 0, NULL);
    if (s != FA3C_STATUS_OK) return s;
    fa3c_clear_error();
    if (problem_is_empty(&r.problem, 0)) return FA3C_STATUS_OK;
    switch (r.backend) {
    case FA3C_BACKEND_CUDA: s = fa3c_cuda_fwd(&r, stream); break;
    case FA3C_BACKEND_CPU_REFERENCE: s = fa3c_cpu_fwd_reference(&r); break;
    default: s = fa3c_cpu_fwd(&r); break;
    }
    if (s == FA3C_STATUS_OK) fa3c_clear_error();
    return s;
}

/* ---- backward ---- */

static fa3c_status bwd_dtype_supported(const fa3c_problem *pr) {
    if (pr->dtype == FA3C_DTYPE_E4M3)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.dtype: E4M3 has no backward (fp8 is forward only)");
    return FA3C_STATUS_OK;
}

static fa3c_status prepare_bwd(const fa3c_bwd_params *p, fa3c_bwd_params *out, int check_device, void *stream) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    fa3c_status s;
    if (!p) return fa3c_error(BAD, "p: the params pointer is NULL");
    const fa3c_problem *pr = &p->problem;
    if ((s = check_problem_scalars(pr, 1)) != FA3C_STATUS_OK) return s;
    if (p->deterministic != 0 && p->deterministic != 1)
        return fa3c_error(BAD, "deterministic: must be 0 or 1 (got %d)", p->deterministic);
    if (p->dsinks && !pr->sinks)
        return fa3c_error(BAD, "dsinks: given without problem.sinks (the gradient of sinks the call does not have)");
    *out = *p;
    if (problem_is_empty(pr, 1)) {
        if ((s = check_backend_value(p->backend)) != FA3C_STATUS_OK) return s;
        return bwd_dtype_supported(pr);
    }
    if (!p->lse) return fa3c_error(BAD, "lse: is NULL; the backward needs the forward's log-sum-exp");

    int es = dtype_size(pr->dtype);
    call_desc c = {.is_bwd = 1, .pr = pr, .lse = p->lse, .dsinks = p->dsinks, .backend = p->backend, .ntensors = 8,
                   .check_device = check_device, .stream = stream};
    const int d = pr->headdim, dv = fa3c_headdim_v(pr);
    c.tensors[0] = (tensor_arg){"q", &p->q, ROWS_Q, pr->heads_q, es, 0, d};
    c.tensors[1] = (tensor_arg){"k", &p->k, ROWS_K, pr->heads_kv, es, 0, d};
    c.tensors[2] = (tensor_arg){"v", &p->v, ROWS_K, pr->heads_kv, es, 0, dv};
    c.tensors[3] = (tensor_arg){"out", &p->out, ROWS_Q, pr->heads_q, es, 0, dv};
    c.tensors[4] = (tensor_arg){"dout", &p->dout, ROWS_Q, pr->heads_q, es, 0, dv};
    c.tensors[5] = (tensor_arg){"dq", &p->dq, ROWS_Q, pr->heads_q, es, 1, d};
    c.tensors[6] = (tensor_arg){"dk", &p->dk, ROWS_DK, pr->heads_kv, es, 1, d};
    c.tensors[7] = (tensor_arg){"dv", &p->dv, ROWS_DK, pr->heads_kv, es, 1, dv};
    fa3c_backend backend;
    if ((s = validate(&c, &backend)) != FA3C_STATUS_OK) return s;
    /* Well-formed but unsupported: only after every malformed case has been named. */
    if ((s = bwd_dtype_supported(pr)) != FA3C_STATUS_OK) return s;
    if (pr->page_table)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.page_table: paged KV is not supported in the backward");

    out->backend = backend;
    out->problem.softmax_scale = fa3c_softmax_scale(pr, 0);
    if (backend == FA3C_BACKEND_CUDA && (s = fa3c_cuda_bwd_supported(out)) != FA3C_STATUS_OK) return s;
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_bwd_check(const fa3c_bwd_params *p) {
    fa3c_bwd_params r;
    return checked(prepare_bwd(p, &r, 0, NULL));
}

fa3c_status fa3c_bwd_check_device(const fa3c_bwd_params *p, void *stream) {
    fa3c_bwd_params r;
    return checked(prepare_bwd(p, &r, 1, stream));
}

fa3c_status fa3c_bwd(const fa3c_bwd_params *p, void *stream) {
    fa3c_bwd_params r;
    fa3c_status s = prepare_bwd(p, &r, 0, NULL);
    if (s != FA3C_STATUS_OK) return s;
    fa3c_clear_error();
    if (problem_is_empty(&r.problem, 1)) return FA3C_STATUS_OK;
    switch (r.backend) {
    case FA3C_BACKEND_CUDA: s = fa3c_cuda_bwd(&r, stream); break;
    case FA3C_BACKEND_CPU_REFERENCE: s = fa3c_cpu_bwd_reference(&r); break;
    default: s = fa3c_cpu_bwd(&r); break;
    }
    if (s == FA3C_STATUS_OK) fa3c_clear_error();
    return s;
}

/* ---- KV cache appends (fa3c_append_kv) ---- */

/* The rotary fields: all unset without rotary_dim, else complete. */
static fa3c_status check_append_rotary(const fa3c_append_params *p) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    if (p->rotary_dim == 0) {
        const char *stray = p->rotary_cos       ? "rotary_cos"
                            : p->rotary_sin     ? "rotary_sin"
                            : p->rotary_seqlens ? "rotary_seqlens"
                            : p->q.data         ? "q"
                            : p->q_out.data     ? "q_out"
                                                : NULL;
        return stray ? fa3c_error(BAD, "%s: given with rotary_dim = 0 (there is no rotary embedding to apply)", stray)
                     : FA3C_STATUS_OK;
    }
    if (p->dtype == FA3C_DTYPE_E4M3)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "rotary_dim: no rotary embedding of E4M3 tokens (rotate them "
                          "before quantizing)");
    if (p->rotary_dim < 0 || p->rotary_dim % 2 || p->rotary_dim > p->headdim)
        return fa3c_error(BAD, "rotary_dim: must be 0 or even and in [2, headdim = %d] (got %d)", p->headdim,
                          p->rotary_dim);
    if (!p->rotary_cos || !p->rotary_sin)
        return fa3c_error(BAD, "%s: is NULL with rotary_dim = %d", p->rotary_cos ? "rotary_sin" : "rotary_cos",
                          p->rotary_dim);
    if (p->rotary_rows < 1) return fa3c_error(BAD, "rotary_rows: must be >= 1 with rotary tables (got %d)", p->rotary_rows);
    if (p->rotary_stride != 0 && (p->rotary_stride < p->rotary_dim / 2 || p->rotary_stride > INT32_MAX))
        return fa3c_error(BAD, "rotary_stride: must be 0 (= rotary_dim / 2) or in [rotary_dim / 2 = %d, 2^31 - 1] (got %lld)",
                          p->rotary_dim / 2, (long long)p->rotary_stride);
    if (p->rotary_interleaved != 0 && p->rotary_interleaved != 1)
        return fa3c_error(BAD, "rotary_interleaved: must be 0 or 1 (got %d)", p->rotary_interleaved);
    if (p->rotary_q_by_row != 0 && p->rotary_q_by_row != 1)
        return fa3c_error(BAD, "rotary_q_by_row: must be 0 or 1 (got %d)", p->rotary_q_by_row);
    const int es = dtype_size(p->dtype);
    fa3c_status s;
    if ((s = check_host_array_ptr("rotary_cos", p->rotary_cos, es)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("rotary_sin", p->rotary_sin, es)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("rotary_seqlens", p->rotary_seqlens, 4)) != FA3C_STATUS_OK)
        return s;
    if (!p->q.data && p->q_out.data) return fa3c_error(BAD, "q.data: is NULL while q_out is given");
    if (p->q.data) {
        if (p->seqlen_q < 1 || p->seqlen_q > FA3C_MAX_SEQLEN)
            return fa3c_error(BAD, "seqlen_q: must be in [1, FA3C_MAX_SEQLEN] with q (got %d)", p->seqlen_q);
        if (p->heads_q < 1) return fa3c_error(BAD, "heads_q: must be >= 1 with q (got %d)", p->heads_q);
    }
    return FA3C_STATUS_OK;
}

static fa3c_status check_append_scalars(const fa3c_append_params *p) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    if ((int)p->dtype < FA3C_DTYPE_FP32 || (int)p->dtype > FA3C_DTYPE_E4M3)
        return fa3c_error(BAD, "dtype: unknown dtype %d (expected 0..3: FP32, FP16, BF16, E4M3)", (int)p->dtype);
    fa3c_status s = check_backend_value(p->backend);
    if (s != FA3C_STATUS_OK) return s;
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
    } else if (p->seqlen_cache < 1 || p->seqlen_cache > FA3C_MAX_SEQLEN) {
        return fa3c_error(BAD, "seqlen_cache: must be in [1, FA3C_MAX_SEQLEN] for a contiguous cache (got %d)",
                          p->seqlen_cache);
    }
    if (!p->cache_seqlens) return fa3c_error(BAD, "cache_seqlens: is NULL (each sequence's filled length is needed)");
    if ((s = check_host_array_ptr("cache_seqlens", p->cache_seqlens, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("page_table", p->page_table, 4)) != FA3C_STATUS_OK ||
        (s = check_host_array_ptr("cu_seqlens_new", p->cu_seqlens_new, 4)) != FA3C_STATUS_OK)
        return s;
    return check_append_rotary(p);
}

/* Rows of the cache each sequence has room for. */
static int64_t append_capacity(const fa3c_append_params *p) {
    return p->page_table ? p->page_table_stride * p->page_size : p->seqlen_cache;
}

/* The append's metadata as host arrays (the caller's, or copies of device ones). */
typedef struct append_arrays {
    const int32_t *lens, *table, *cu_new, *rotary_pos;
} append_arrays;

/* Every position a sequence's new tokens go to lies in the cache, every page
 * they write is in range, and every rotary position is a row of the tables. */
static fa3c_status check_append_lengths(const fa3c_append_params *p, const append_arrays *a) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    fa3c_status s;
    if (p->cu_seqlens_new && p->seqlen_new > 0 &&
        (s = check_cu_seqlens("cu_seqlens_new", a->cu_new, p->batch, p->seqlen_new, "seqlen_new")) != FA3C_STATUS_OK)
        return s;
    const int64_t cap = append_capacity(p);
    for (int b = 0; b < p->batch; b++) {
        const int64_t n = p->seqlen_new == 0 ? 0 : p->cu_seqlens_new ? (int64_t)a->cu_new[b + 1] - a->cu_new[b] : p->seqlen_new;
        if (a->lens[b] < 0 || a->lens[b] + n > cap)
            return fa3c_error(BAD, "cache_seqlens[%d]: must be in [0, %lld - %lld new tokens = %lld] (got %d): the new "
                              "tokens must fit in the cache", b, (long long)cap, (long long)n, (long long)(cap - n),
                              a->lens[b]);
        if (a->table)
            for (int64_t i = a->lens[b] / p->page_size; n > 0 && i <= (a->lens[b] + n - 1) / p->page_size; i++) {
                const int32_t page = a->table[(int64_t)b * p->page_table_stride + i];
                if (page < 0 || page >= p->num_pages)
                    return fa3c_error(BAD, "page_table[%d][%lld]: page %d is out of range [0, num_pages = %d)", b,
                                      (long long)i, page, p->num_pages);
            }
        if (!p->rotary_dim) continue;
        const int64_t pos = a->rotary_pos ? a->rotary_pos[b] : a->lens[b];
        int64_t span = n > 0 ? n - 1 : 0;
        if (p->q.data && p->rotary_q_by_row && p->seqlen_q - 1 > span) span = p->seqlen_q - 1;
        if (pos < 0 || pos + span >= p->rotary_rows)
            return fa3c_error(BAD, "%s[%d]: rotary positions %lld to %lld are outside the tables' rows [0, rotary_rows = "
                              "%d)", a->rotary_pos ? "rotary_seqlens" : "cache_seqlens", b, (long long)pos,
                              (long long)(pos + span), p->rotary_rows);
    }
    return FA3C_STATUS_OK;
}

/* fa3c_append_kv_check_device: the device-resident arrays copied to the host and checked. */
static fa3c_status check_append_device_arrays(const fa3c_append_params *p, void *stream) {
    const int32_t *dev[4] = {p->cache_seqlens, p->page_table, p->cu_seqlens_new, p->rotary_seqlens};
    const int64_t count[4] = {p->batch, p->page_table ? (int64_t)p->batch * p->page_table_stride : 0, p->batch + 1,
                              p->batch};
    int32_t *host[4] = {NULL, NULL, NULL, NULL};
    fa3c_status s = FA3C_STATUS_OK;
    for (int i = 0; i < 4 && s == FA3C_STATUS_OK; i++) {
        if (!dev[i]) continue;
        host[i] = (int32_t *)malloc((size_t)count[i] * 4);
        s = host[i] ? fa3c_cuda_copy_to_host(host[i], dev[i], (size_t)count[i] * 4, stream)
                    : fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "checking device metadata: no host memory");
    }
    if (s == FA3C_STATUS_OK) {
        const append_arrays a = {host[0], host[1], host[2], host[3]};
        s = check_append_lengths(p, &a);
    }
    for (int i = 0; i < 4; i++) free(host[i]);
    return s;
}

/* Validates p (the tensors as the attention calls check theirs) and resolves
 * *backend. The outputs (the caches, q_out) must not overlap anything else
 * they are not, by byte range; the two caches may interleave in one buffer,
 * so they are told apart by their start only, and q_out may be q exactly. */
static fa3c_status prepare_append(const fa3c_append_params *p, fa3c_backend *backend, int check_device, void *stream) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    if (!p) return fa3c_error(BAD, "p: the params pointer is NULL");
    fa3c_status s = check_append_scalars(p);
    if (s != FA3C_STATUS_OK) return s;
    *backend = p->backend;
    const int writes_kv = p->seqlen_new > 0, has_q = p->q.data != NULL;
    if (p->batch == 0 || (!writes_kv && !has_q)) return FA3C_STATUS_OK;   /* nothing to write, nothing touched */

    const int es = dtype_size(p->dtype), dv = p->headdim_v ? p->headdim_v : p->headdim;
    const int64_t outer = p->page_table ? p->num_pages : p->batch, rows = p->page_table ? p->page_size : p->seqlen_cache;
    /* Packed new tokens: one token axis, bounded by batch x seqlen_new until cu_seqlens_new is read. */
    const int64_t new_outer = p->cu_seqlens_new ? 1 : p->batch;
    int64_t new_rows = p->cu_seqlens_new ? (int64_t)p->batch * p->seqlen_new : p->seqlen_new;
    enum { K_NEW, V_NEW, K_CACHE, V_CACHE, Q, Q_OUT, LENS, TABLE, CU_NEW, COS, SIN, ROT_POS, NARGS };
    const tensor_arg ts[6] = {
        {"k_new", &p->k_new, ROWS_Q, p->heads_kv, es, 0, p->headdim},
        {"v_new", &p->v_new, ROWS_Q, p->heads_kv, es, 0, dv},
        {"k_cache", &p->k_cache, ROWS_K, p->heads_kv, es, 1, p->headdim},
        {"v_cache", &p->v_cache, ROWS_K, p->heads_kv, es, 1, dv},
        {"q", &p->q, ROWS_Q, p->heads_q, es, 0, p->headdim},
        {"q_out", &p->q_out, ROWS_Q, p->heads_q, es, 1, p->headdim},
    };
    int64_t n[6][4];
    for (int i = 0; i < 6; i++) {
        const int64_t dims[3][2] = {{new_outer, new_rows}, {outer, rows}, {p->batch, p->seqlen_q}};
        n[i][0] = dims[i / 2][0], n[i][1] = dims[i / 2][1], n[i][2] = ts[i].heads, n[i][3] = ts[i].dim;
        if ((i < Q ? writes_kv : has_q) && (s = check_tensor_shape(&ts[i], n[i])) != FA3C_STATUS_OK) return s;
    }
    const int64_t rot_stride = p->rotary_stride ? p->rotary_stride : p->rotary_dim / 2;
    const int64_t table_n[4] = {p->rotary_rows, p->rotary_dim / 2, 1, 1}, table_s[4] = {rot_stride, 1, 0, 0};
    if (p->rotary_dim && ((s = check_extent("rotary_cos", p->rotary_cos, es, table_n, table_s)) != FA3C_STATUS_OK ||
                          (s = check_extent("rotary_sin", p->rotary_sin, es, table_n, table_s)) != FA3C_STATUS_OK))
        return s;

    const char *names[NARGS] = {"k_new", "v_new", "k_cache", "v_cache", "q", "q_out", "cache_seqlens", "page_table",
                                "cu_seqlens_new", "rotary_cos", "rotary_sin", "rotary_seqlens"};
    const void *ptr[NARGS] = {writes_kv ? p->k_new.data : NULL, writes_kv ? p->v_new.data : NULL,
                              writes_kv ? p->k_cache.data : NULL, writes_kv ? p->v_cache.data : NULL,
                              p->q.data, p->q_out.data, p->cache_seqlens, p->page_table,
                              writes_kv ? p->cu_seqlens_new : NULL, p->rotary_cos, p->rotary_sin, p->rotary_seqlens};
    int usable;
    if ((s = pick_backend(p->backend, writes_kv ? p->k_cache.data : p->q.data, backend, &usable)) != FA3C_STATUS_OK)
        return s;
    for (int i = 0; i < NARGS && usable; i++)
        if (ptr[i] && (s = check_memory_kind(names[i], ptr[i], *backend)) != FA3C_STATUS_OK) return s;
    if (*backend != FA3C_BACKEND_CUDA) {
        const append_arrays a = {p->cache_seqlens, p->page_table, p->cu_seqlens_new, p->rotary_seqlens};
        if ((s = check_append_lengths(p, &a)) != FA3C_STATUS_OK) return s;
        if (p->cu_seqlens_new && writes_kv) new_rows = p->cu_seqlens_new[p->batch];   /* the exact extent */
    } else if (check_device && (s = check_append_device_arrays(p, stream)) != FA3C_STATUS_OK) {
        return s;
    }

    /* Byte ranges [lo, hi), for the overlap rules. */
    uintptr_t lo[NARGS], hi[NARGS];
    for (int i = 0; i < NARGS; i++) {
        lo[i] = hi[i] = (uintptr_t)ptr[i];
        if (!lo[i]) continue;   /* not part of this call: its sizes were not checked */
        int64_t bytes;   /* cannot overflow: the extents were checked */
        if (i < LENS) {
            if (i < K_CACHE) n[i][1] = new_rows;   /* packed new tokens may number 0 */
            bytes = tensor_span_bytes(n[i], ts[i].t->stride, es);
        } else if (i == COS || i == SIN) {
            bytes = (((int64_t)p->rotary_rows - 1) * rot_stride + p->rotary_dim / 2) * es;
        } else {
            bytes = 4 * (i == TABLE ? (int64_t)p->batch * p->page_table_stride : i == CU_NEW ? p->batch + 1 : p->batch);
        }
        hi[i] = lo[i] + (uintptr_t)bytes;
    }
    const int in_place = has_q && p->q.data == p->q_out.data && !memcmp(p->q.stride, p->q_out.stride, sizeof p->q.stride);
    const int outputs[3] = {K_CACHE, V_CACHE, Q_OUT};
    for (int k = 0; k < 3; k++) {
        const int o = outputs[k];
        for (int i = 0; i < NARGS && lo[o]; i++) {
            if (i == o || !lo[i] || (o != Q_OUT && (i == K_CACHE || i == V_CACHE)) || (o == Q_OUT && i == Q && in_place))
                continue;
            if (lo[i] < hi[o] && lo[o] < hi[i])
                return fa3c_error(BAD, "%s: overlaps %s (%s)", names[o], names[i],
                                  o == Q_OUT && i == Q ? "rotating in place needs q_out to be q, with the same strides"
                                                       : "it is written");
        }
    }
    if (writes_kv && lo[K_CACHE] == lo[V_CACHE]) return fa3c_error(BAD, "v_cache: starts where k_cache does");
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_append_kv_check(const fa3c_append_params *p) {
    fa3c_backend backend;
    return checked(prepare_append(p, &backend, 0, NULL));
}

fa3c_status fa3c_append_kv_check_device(const fa3c_append_params *p, void *stream) {
    fa3c_backend backend;
    return checked(prepare_append(p, &backend, 1, stream));
}

fa3c_status fa3c_append_kv(const fa3c_append_params *p, void *stream) {
    fa3c_backend backend;
    fa3c_status s = prepare_append(p, &backend, 0, NULL);
    if (s != FA3C_STATUS_OK || p->batch == 0 || (p->seqlen_new == 0 && !p->q.data)) return checked(s);
    fa3c_clear_error();
    return checked(backend == FA3C_BACKEND_CUDA ? fa3c_cuda_append_kv(p, stream) : fa3c_cpu_append_kv(p));
}

/* ---- fp8 quantization (fa3c_quantize_fp8) ---- */

static fa3c_status prepare_quantize(const fa3c_quantize_params *p, fa3c_backend *backend) {
    const fa3c_status BAD = FA3C_STATUS_INVALID_ARGUMENT;
    if (!p) return fa3c_error(BAD, "p: the params pointer is NULL");
    if (p->dtype != FA3C_DTYPE_FP32 && p->dtype != FA3C_DTYPE_FP16 && p->dtype != FA3C_DTYPE_BF16)
        return fa3c_error(BAD, "dtype: x must be FP32, FP16 or BF16 (got %d)", (int)p->dtype);
    fa3c_status s = check_backend_value(p->backend);
    if (s != FA3C_STATUS_OK) return s;
    if (p->batch < 0 || p->seqlen < 0 || p->seqlen > FA3C_MAX_SEQLEN)
        return fa3c_error(BAD, "batch, seqlen: must be >= 0 and seqlen <= FA3C_MAX_SEQLEN (got %d, %d)", p->batch,
                          p->seqlen);
    if (p->heads < 1) return fa3c_error(BAD, "heads: must be >= 1 (got %d)", p->heads);
    if (p->headdim < 1 || p->headdim > 512) return fa3c_error(BAD, "headdim: must be in [1, 512] (got %d)", p->headdim);
    const int group = p->group ? p->group : 1;
    if (group < 1 || p->heads % group)
        return fa3c_error(BAD, "group: must be 0 (= 1) or divide heads = %d (got %d)", p->heads, p->group);
    if (p->hadamard != 0 && p->hadamard != 1) return fa3c_error(BAD, "hadamard: must be 0 or 1 (got %d)", p->hadamard);
    if (p->hadamard && (p->headdim > 256 || (p->headdim & (p->headdim - 1))))
        return fa3c_error(BAD, "hadamard: the rotation needs headdim a power of two <= 256 (got %d)", p->headdim);
    if (!p->hadamard && p->signs) return fa3c_error(BAD, "signs: given with hadamard = 0");
    if (p->block_rows != 0 && p->block_rows != FA3C_FP8_BLOCK_ROWS)
        return fa3c_error(BAD, "block_rows: must be 0 (one descale over all rows) or FA3C_FP8_BLOCK_ROWS = %d (got %d)",
                          FA3C_FP8_BLOCK_ROWS, p->block_rows);
    if ((s = check_host_array_ptr("signs", p->signs, 4)) != FA3C_STATUS_OK) return s;
    *backend = p->backend;
    if (p->batch == 0 || p->seqlen == 0) return FA3C_STATUS_OK;   /* nothing to read or write */
    if (!p->descale) return fa3c_error(BAD, "descale: is NULL (the scales are written there)");
    if ((s = check_host_array_ptr("descale", p->descale, 4)) != FA3C_STATUS_OK) return s;

    const tensor_arg ts[2] = {{"x", &p->x, ROWS_Q, p->heads, dtype_size(p->dtype), 0, p->headdim},
                              {"out", &p->out, ROWS_Q, p->heads, 1, 1, p->headdim}};
    const int64_t n[4] = {p->batch, p->seqlen, p->heads, p->headdim};
    uintptr_t lo[4], hi[4];
    for (int i = 0; i < 2; i++) {
        if ((s = check_tensor_shape(&ts[i], n)) != FA3C_STATUS_OK) return s;
        lo[i] = (uintptr_t)ts[i].t->data;
        hi[i] = lo[i] + (uintptr_t)tensor_span_bytes(n, ts[i].t->stride, ts[i].elem_size);
    }
    const int64_t row_blocks = p->block_rows ? (p->seqlen + p->block_rows - 1) / p->block_rows : 1;
    lo[2] = (uintptr_t)p->descale, hi[2] = lo[2] + (uintptr_t)((int64_t)p->batch * (p->heads / group) * row_blocks * 4);
    lo[3] = (uintptr_t)p->signs, hi[3] = lo[3] + (p->signs ? (uintptr_t)p->headdim * 4 : 0);
    const char *names[4] = {"x", "out", "descale", "signs"};
    int usable;
    if ((s = pick_backend(p->backend, p->x.data, backend, &usable)) != FA3C_STATUS_OK) return s;
    for (int i = 0; i < 4 && usable; i++)
        if (lo[i] && (s = check_memory_kind(names[i], (const void *)lo[i], *backend)) != FA3C_STATUS_OK) return s;
    for (int o = 1; o <= 2; o++)   /* the outputs: out and descale */
        for (int i = 0; i < 4; i++)
            if (i != o && lo[i] && lo[i] < hi[o] && lo[o] < hi[i])
                return fa3c_error(BAD, "%s: overlaps %s (it is written)", names[o], names[i]);
    if (*backend != FA3C_BACKEND_CUDA && p->signs)
        for (int j = 0; j < p->headdim; j++)   /* anything but +-1 would not be a rotation */
            if (p->signs[j] != 1.0f && p->signs[j] != -1.0f)
                return fa3c_error(BAD, "signs[%d]: must be +1 or -1 (got %g)", j, (double)p->signs[j]);
    if (*backend == FA3C_BACKEND_CUDA && !FA3C_CUDA_QUANTIZE)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "fa3c_quantize_fp8: the CUDA kernels are built but off until "
                          "their GPU test has run (-DFA3C_CUDA_QUANTIZE=1); the CPU backends take host memory");
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_quantize_fp8_check(const fa3c_quantize_params *p) {
    fa3c_backend backend;
    return checked(prepare_quantize(p, &backend));
}

fa3c_status fa3c_quantize_fp8(const fa3c_quantize_params *p, void *stream) {
    fa3c_backend backend;
    fa3c_status s = prepare_quantize(p, &backend);
    if (s != FA3C_STATUS_OK || p->batch == 0 || p->seqlen == 0) return checked(s);
    fa3c_clear_error();
    return checked(backend == FA3C_BACKEND_CUDA ? fa3c_cuda_quantize_fp8(p, stream) : fa3c_cpu_quantize_fp8(p));
}

int fa3c_cuda_available(void) {
    /* A query, not a call that can fail: keep the last failure's message. */
    char saved[1024];
    strncpy(saved, fa3c_last_error(), sizeof saved - 1);
    saved[sizeof saved - 1] = '\0';
    int usable = fa3c_cuda_backend_usable();
    if (saved[0])
        fa3c_error(FA3C_STATUS_OK, "%s", saved);
    else
        fa3c_clear_error();
    return usable;
}
