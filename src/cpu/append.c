/* fa3c_append_kv on the CPU backends (src/api.c validated p): each new
 * token's rows copied to its position, in its sequence's rows of a
 * contiguous cache or through its page table. */
#include <string.h>

#include "backend.h"

fa3c_status fa3c_cpu_append_kv(const fa3c_append_params *p) {
    const int es = p->dtype == FA3C_DTYPE_FP32 ? 4 : p->dtype == FA3C_DTYPE_E4M3 ? 1 : 2;
    const int dims[2] = {p->headdim, p->headdim_v ? p->headdim_v : p->headdim};
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
    return FA3C_STATUS_OK;
}
