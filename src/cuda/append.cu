// fa3c_append_kv's kernel (src/api.c validates): new key and value rows
// copied into the cache at each sequence's filled length. One CTA per new
// token; its threads copy the token's heads_kv rows of K and then of V, 16
// bytes at a time where every row start is 16-byte aligned, else one element
// at a time. cache_seqlens and the page table live on the device and are not
// validated: a token whose position is past the cache, or whose page entry
// is outside [0, num_pages), is skipped (nothing is written for it).
#include <cuda_runtime.h>
#include <stdint.h>
#include "backend.h"

struct AppendSide {   // K or V: source and destination, in elements of `es` bytes
    const char *src;
    char *dst;
    int64_t src_stride[3], dst_stride[3];
    int cols;          // headdim or headdim_v
};

struct AppendArgs {
    AppendSide side[2];
    const int32_t *cache_seqlens, *page_table;
    int64_t page_table_stride, capacity;
    int batch, seqlen_new, heads_kv, page_size, num_pages, es;
    int vec16;         // every row start and row length a multiple of 16 bytes
};

template <int VEC>
__global__ void append_kernel(const AppendArgs a) {
    const int b = blockIdx.x / a.seqlen_new, j = blockIdx.x % a.seqlen_new;
    const int64_t pos = (int64_t)a.cache_seqlens[b] + j;
    if (a.cache_seqlens[b] < 0 || pos >= a.capacity) return;
    int64_t outer = b, row = pos;
    if (a.page_table) {
        const int32_t page = a.page_table[(int64_t)b * a.page_table_stride + pos / a.page_size];
        if (page < 0 || page >= a.num_pages) return;
        outer = page;
        row = pos % a.page_size;
    }
    for (int t = 0; t < 2; t++) {
        const AppendSide &s = a.side[t];
        const int64_t row_bytes = (int64_t)s.cols * a.es, units = VEC ? row_bytes / 16 : s.cols;
        for (int64_t i = threadIdx.x; i < (int64_t)a.heads_kv * units; i += blockDim.x) {
            const int h = (int)(i / units);
            const int64_t u = i % units;
            const char *src = s.src + ((int64_t)b * s.src_stride[0] + j * s.src_stride[1] + h * s.src_stride[2]) * a.es;
            char *dst = s.dst + (outer * s.dst_stride[0] + row * s.dst_stride[1] + h * s.dst_stride[2]) * a.es;
            if (VEC) {
                ((uint4 *)dst)[u] = ((const uint4 *)src)[u];
            } else if (a.es == 2) {
                ((uint16_t *)dst)[u] = ((const uint16_t *)src)[u];
            } else if (a.es == 4) {
                ((uint32_t *)dst)[u] = ((const uint32_t *)src)[u];
            } else {
                dst[u] = src[u];
            }
        }
    }
}

static bool aligned16(const void *data, const int64_t *stride, int es, int cols) {
    return (uintptr_t)data % 16 == 0 && (int64_t)cols * es % 16 == 0 && stride[0] * es % 16 == 0 &&
           stride[1] * es % 16 == 0 && stride[2] * es % 16 == 0;
}

extern "C" fa3c_status fa3c_cuda_append_kv(const fa3c_append_params *p, void *stream) {
    AppendArgs a;
    a.es = p->dtype == FA3C_DTYPE_FP32 ? 4 : p->dtype == FA3C_DTYPE_E4M3 ? 1 : 2;
    const fa3c_tensor *news[2] = {&p->k_new, &p->v_new}, *caches[2] = {&p->k_cache, &p->v_cache};
    const int cols[2] = {p->headdim, p->headdim_v ? p->headdim_v : p->headdim};
    a.vec16 = 1;
    for (int t = 0; t < 2; t++) {
        AppendSide &s = a.side[t];
        s.src = (const char *)news[t]->data;
        s.dst = (char *)caches[t]->data;
        for (int i = 0; i < 3; i++) s.src_stride[i] = news[t]->stride[i], s.dst_stride[i] = caches[t]->stride[i];
        s.cols = cols[t];
        a.vec16 = a.vec16 && aligned16(s.src, s.src_stride, a.es, s.cols) && aligned16(s.dst, s.dst_stride, a.es, s.cols);
    }
    a.cache_seqlens = p->cache_seqlens;
    a.page_table = p->page_table;
    a.page_table_stride = p->page_table_stride;
    a.capacity = p->page_table ? p->page_table_stride * p->page_size : p->seqlen_cache;
    a.batch = p->batch;
    a.seqlen_new = p->seqlen_new;
    a.heads_kv = p->heads_kv;
    a.page_size = p->page_size;
    a.num_pages = p->num_pages;
    const int64_t blocks = (int64_t)p->batch * p->seqlen_new;
    if (blocks > INT32_MAX)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "append: %lld new tokens are more than one launch takes",
                          (long long)blocks);
    if (a.vec16) append_kernel<1><<<(unsigned)blocks, 128, 0, (cudaStream_t)stream>>>(a);
    else append_kernel<0><<<(unsigned)blocks, 128, 0, (cudaStream_t)stream>>>(a);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "append kernel launch failed: %s", cudaGetErrorString(e));
    return FA3C_STATUS_OK;
}
