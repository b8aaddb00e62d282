/* fa3c_append_kv on the CPU backends (src/api.c validated p): each new
 * token's rows copied to its position, in its sequence's rows of a
 * contiguous cache or through its page table; with rotary_dim, the new keys'
 * and q's first rotary_dim columns rotated on the way. */
#include <string.h>

#include "backend.h"
#include "convert.h"

/* Row `x` (headdim elements) rotated at table row `pos` into `out`, which may be x. */
static void rotate_row(const fa3c_append_params *p, const void *x, void *out, int64_t pos) {
    const int half = p->rotary_dim / 2;
    const int64_t stride = p->rotary_stride ? p->rotary_stride : half;
    float v[512];
    for (int c = 0; c < p->headdim; c++) v[c] = fa3c_load_f(x, p->dtype, c);
    for (int f = 0; f < half; f++) {
        const int i0 = p->rotary_interleaved ? 2 * f : f, i1 = p->rotary_interleaved ? 2 * f + 1 : f + half;
        const float c = fa3c_load_f(p->rotary_cos, p->dtype, pos * stride + f);
        const float s = fa3c_load_f(p->rotary_sin, p->dtype, pos * stride + f);
        const float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * c - x1 * s;
        v[i1] = x0 * s + x1 * c;
    }
    for (int c = 0; c < p->headdim; c++) fa3c_store_f(out, p->dtype, c, v[c]);
}

static void *element(const fa3c_tensor *t, int64_t i0, int64_t i1, int64_t i2, int es) {
    return (char *)t->data + (i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2]) * es;
}

fa3c_status fa3c_cpu_append_kv(const fa3c_append_params *p) {
    const int es = (int)fa3c_dtype_size(p->dtype);
    const int dims[2] = {p->headdim, p->headdim_v ? p->headdim_v : p->headdim};
    const fa3c_tensor *news[2] = {&p->k_new, &p->v_new}, *caches[2] = {&p->k_cache, &p->v_cache};
    for (int b = 0; b < p->batch; b++) {
        const int64_t pos0 = p->rotary_seqlens ? p->rotary_seqlens[b] : p->cache_seqlens[b];
        const int n = p->seqlen_new == 0 ? 0 : p->cu_seqlens_new ? p->cu_seqlens_new[b + 1] - p->cu_seqlens_new[b] : p->seqlen_new;
        for (int j = 0; j < n; j++) {
            const int64_t pos = (int64_t)p->cache_seqlens[b] + j;
            const int64_t src0 = p->cu_seqlens_new ? 0 : b, src1 = p->cu_seqlens_new ? p->cu_seqlens_new[b] + j : j;
            int64_t outer = b, row = pos;
            if (p->page_table) {
                outer = p->page_table[(int64_t)b * p->page_table_stride + pos / p->page_size];
                row = pos % p->page_size;
            }
            for (int t = 0; t < 2; t++)
                for (int h = 0; h < p->heads_kv; h++) {
                    const void *src = element(news[t], src0, src1, h, es);
                    void *dst = element(caches[t], outer, row, h, es);
                    if (t == 0 && p->rotary_dim) rotate_row(p, src, dst, pos0 + j);
                    else memcpy(dst, src, (size_t)dims[t] * es);
                }
        }
        if (p->q.data)
            for (int i = 0; i < p->seqlen_q; i++)
                for (int h = 0; h < p->heads_q; h++)
                    rotate_row(p, element(&p->q, b, i, h, es), element(&p->q_out, b, i, h, es),
                               pos0 + (p->rotary_q_by_row ? i : 0));
    }
    return FA3C_STATUS_OK;
}
