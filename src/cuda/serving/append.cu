// fa3c_append_kv's kernel (src/api.c validates): new key and value rows
// copied into the cache at each sequence's filled length, the keys' and q's
// first rotary_dim columns rotated on the way when rotary_dim > 0. One CTA
// per new token (batch x seqlen_new; packed sequences leave CTAs past their
// length idle), then one per (sequence, query row) of q. A token's threads
// copy its heads_kv rows of K and then of V, 16 bytes at a time where every
// row start is 16-byte aligned and nothing is rotated, else one element (or
// one rotated pair) at a time. The metadata lives on the device and is not
// validated: a token or query row whose position is past the cache or the
// rotary tables, whose page entry is outside [0, num_pages), or whose packed
// row is outside the new tokens' bound is skipped (nothing is written for it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "backend.h"

struct AppendSide {   // K or V: source and destination, in elements of `es` bytes
    const char *src;
    char *dst;
    int64_t src_stride[3], dst_stride[3];
    int cols;          // headdim or headdim_v
};

struct AppendRotary {  // rotary_dim == 0: off
    const char *cos, *sin;
    const int32_t *pos;   // first positions per sequence; NULL = cache_seqlens
    int64_t stride;
    int dim, rows, interleaved;
};

struct AppendQuery {   // q rotated into q_out; q == NULL: none
    const char *q;
    char *out;
    int64_t q_stride[3], out_stride[3];
    int seqlen, heads, by_row;
};

struct AppendArgs {
    AppendSide side[2];
    AppendRotary rot;
    AppendQuery query;
    const int32_t *cache_seqlens, *page_table, *cu_new;
    int64_t page_table_stride, capacity;
    int batch, seqlen_new, heads_kv, page_size, num_pages, es, dtype;
    int vec16;         // every row start and row length a multiple of 16 bytes
};

__device__ __forceinline__ float load_elem(const char *base, int64_t i, int dtype) {
    switch (dtype) {
    case FA3C_DTYPE_FP32: return ((const float *)base)[i];
    case FA3C_DTYPE_FP16: return __half2float(((const __half *)base)[i]);
    default: return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    }
}

__device__ __forceinline__ void store_elem(char *base, int64_t i, int dtype, float x) {
    switch (dtype) {
    case FA3C_DTYPE_FP32: ((float *)base)[i] = x; break;
    case FA3C_DTYPE_FP16: ((__half *)base)[i] = __float2half_rn(x); break;
    default: ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(x); break;
    }
}

__device__ __forceinline__ void copy_unit(const char *src, char *dst, int64_t u, int es, int vec) {
    if (vec) ((uint4 *)dst)[u] = ((const uint4 *)src)[u];
    else if (es == 2) ((uint16_t *)dst)[u] = ((const uint16_t *)src)[u];
    else if (es == 4) ((uint32_t *)dst)[u] = ((const uint32_t *)src)[u];
    else dst[u] = src[u];
}

// `rows` rows of `cols` elements (src + r * src_stride -> dst + r * dst_stride, in
// elements), the first rot.dim columns rotated at table row `pos`. One thread
// per rotated pair or copied element, so dst may be src.
__device__ void rotate_rows(const AppendArgs &a, const char *src, const int64_t src_stride, char *dst,
                            const int64_t dst_stride, int rows, int cols, int64_t pos) {
    const int half = a.rot.dim / 2, rest = cols - 2 * half, per_row = half + rest;
    for (int64_t i = threadIdx.x; i < (int64_t)rows * per_row; i += blockDim.x) {
        const int r = (int)(i / per_row), k = (int)(i % per_row);
        const char *s = src + r * src_stride * a.es;
        char *d = dst + r * dst_stride * a.es;
        if (k < half) {
            const int i0 = a.rot.interleaved ? 2 * k : k, i1 = a.rot.interleaved ? 2 * k + 1 : k + half;
            const float c = load_elem(a.rot.cos, pos * a.rot.stride + k, a.dtype);
            const float sn = load_elem(a.rot.sin, pos * a.rot.stride + k, a.dtype);
            const float x0 = load_elem(s, i0, a.dtype), x1 = load_elem(s, i1, a.dtype);
            store_elem(d, i0, a.dtype, x0 * c - x1 * sn);
            store_elem(d, i1, a.dtype, x0 * sn + x1 * c);
        } else {
            const int col = 2 * half + (k - half);
            copy_unit(s, d, col, a.es, 0);
        }
    }
}

// The rotary position of sequence b's first new token.
__device__ __forceinline__ int64_t rotary_start(const AppendArgs &a, int b) {
    return a.rot.pos ? a.rot.pos[b] : a.cache_seqlens[b];
}

__device__ void append_token(const AppendArgs &a, int b, int j) {
    int64_t src_outer = b, src_row = j;
    if (a.cu_new) {
        const int32_t start = a.cu_new[b], end = a.cu_new[b + 1];
        if (start < 0 || end < start || j >= end - start || (int64_t)end > (int64_t)a.batch * a.seqlen_new) return;
        src_outer = 0;
        src_row = start + j;
    }
    const int64_t pos = (int64_t)a.cache_seqlens[b] + j;
    if (a.cache_seqlens[b] < 0 || pos >= a.capacity) return;
    int64_t outer = b, row = pos;
    if (a.page_table) {
        const int32_t page = a.page_table[(int64_t)b * a.page_table_stride + pos / a.page_size];
        if (page < 0 || page >= a.num_pages) return;
        outer = page;
        row = pos % a.page_size;
    }
    int64_t rpos = 0;
    if (a.rot.dim) {
        rpos = rotary_start(a, b) + j;
        if (rotary_start(a, b) < 0 || rpos >= a.rot.rows) return;
    }
    for (int t = 0; t < 2; t++) {
        const AppendSide &s = a.side[t];
        const char *src = s.src + (src_outer * s.src_stride[0] + src_row * s.src_stride[1]) * a.es;
        char *dst = s.dst + (outer * s.dst_stride[0] + row * s.dst_stride[1]) * a.es;
        if (t == 0 && a.rot.dim) {
            rotate_rows(a, src, s.src_stride[2], dst, s.dst_stride[2], a.heads_kv, s.cols, rpos);
            continue;
        }
        const int64_t units = a.vec16 ? (int64_t)s.cols * a.es / 16 : s.cols;
        for (int64_t i = threadIdx.x; i < (int64_t)a.heads_kv * units; i += blockDim.x) {
            const int h = (int)(i / units);
            copy_unit(src + h * s.src_stride[2] * a.es, dst + h * s.dst_stride[2] * a.es, i % units, a.es, a.vec16);
        }
    }
}

__device__ void rotate_query(const AppendArgs &a, int b, int i) {
    const AppendQuery &q = a.query;
    const int64_t start = rotary_start(a, b), pos = start + (q.by_row ? i : 0);
    if (start < 0 || pos >= a.rot.rows) return;
    rotate_rows(a, q.q + ((int64_t)b * q.q_stride[0] + i * q.q_stride[1]) * a.es, q.q_stride[2],
                q.out + ((int64_t)b * q.out_stride[0] + i * q.out_stride[1]) * a.es, q.out_stride[2], q.heads,
                a.side[0].cols, pos);
}

__global__ void append_kernel(const AppendArgs a) {
    const int64_t tokens = (int64_t)a.batch * a.seqlen_new, idx = blockIdx.x;
    if (idx < tokens) append_token(a, (int)(idx / a.seqlen_new), (int)(idx % a.seqlen_new));
    else rotate_query(a, (int)((idx - tokens) / a.query.seqlen), (int)((idx - tokens) % a.query.seqlen));
}

static bool aligned16(const void *data, const int64_t *stride, int es, int cols) {
    return (uintptr_t)data % 16 == 0 && (int64_t)cols * es % 16 == 0 && stride[0] * es % 16 == 0 &&
           stride[1] * es % 16 == 0 && stride[2] * es % 16 == 0;
}

extern "C" fa3c_status fa3c_cuda_append_kv(const fa3c_append_params *p, void *stream) {
    AppendArgs a = {};
    a.es = p->dtype == FA3C_DTYPE_FP32 ? 4 : p->dtype == FA3C_DTYPE_E4M3 ? 1 : 2;
    a.dtype = (int)p->dtype;
    const fa3c_tensor *news[2] = {&p->k_new, &p->v_new}, *caches[2] = {&p->k_cache, &p->v_cache};
    const int cols[2] = {p->headdim, p->headdim_v ? p->headdim_v : p->headdim};
    a.vec16 = 1;
    for (int t = 0; t < 2; t++) {
        AppendSide &s = a.side[t];
        s.src = (const char *)news[t]->data;
        s.dst = (char *)caches[t]->data;
        for (int i = 0; i < 3; i++) s.src_stride[i] = news[t]->stride[i], s.dst_stride[i] = caches[t]->stride[i];
        s.cols = cols[t];
        if (p->seqlen_new > 0)
            a.vec16 = a.vec16 && aligned16(s.src, s.src_stride, a.es, s.cols) && aligned16(s.dst, s.dst_stride, a.es, s.cols);
    }
    a.rot.dim = p->rotary_dim;
    a.rot.cos = (const char *)p->rotary_cos;
    a.rot.sin = (const char *)p->rotary_sin;
    a.rot.pos = p->rotary_seqlens;
    a.rot.stride = p->rotary_stride ? p->rotary_stride : p->rotary_dim / 2;
    a.rot.rows = p->rotary_rows;
    a.rot.interleaved = p->rotary_interleaved;
    if (p->q.data) {
        a.query.q = (const char *)p->q.data;
        a.query.out = (char *)p->q_out.data;
        for (int i = 0; i < 3; i++) a.query.q_stride[i] = p->q.stride[i], a.query.out_stride[i] = p->q_out.stride[i];
        a.query.seqlen = p->seqlen_q;
        a.query.heads = p->heads_q;
        a.query.by_row = p->rotary_q_by_row;
    }
    a.cache_seqlens = p->cache_seqlens;
    a.page_table = p->page_table;
    a.cu_new = p->cu_seqlens_new;
    a.page_table_stride = p->page_table_stride;
    a.capacity = p->page_table ? p->page_table_stride * p->page_size : p->seqlen_cache;
    a.batch = p->batch;
    a.seqlen_new = p->seqlen_new;
    a.heads_kv = p->heads_kv;
    a.page_size = p->page_size;
    a.num_pages = p->num_pages;
    const int64_t blocks = (int64_t)p->batch * p->seqlen_new + (p->q.data ? (int64_t)p->batch * p->seqlen_q : 0);
    if (blocks > INT32_MAX)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "append: %lld new tokens and query rows are more than one launch "
                          "takes", (long long)blocks);
    append_kernel<<<(unsigned)blocks, 128, 0, (cudaStream_t)stream>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "append kernel launch failed: %s", cudaGetErrorString(e));
    return FA3C_STATUS_OK;
}
