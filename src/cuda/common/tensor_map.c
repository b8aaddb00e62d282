/* TMA descriptors through the driver entry point (see tensor_map.h). */
#include "tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "backend.h"

static PFN_cuTensorMapEncodeTiled_v12000 get_encoder(void) {
    /* Looked up once, with relaxed atomics: racing threads store the same pointer. */
    static void *encode;
    void *fn = __atomic_load_n(&encode, __ATOMIC_RELAXED);
    if (!fn) {
        enum cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            fn = NULL;
        __atomic_store_n(&encode, fn, __ATOMIC_RELAXED);
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

/* TMA strides (bytes) of dims 1..3 (seqlen, heads, batch). A dim of extent 1
 * is never stepped over, so it gets a legal dummy stride. */
static fa3c_status tma_strides(const char *name, const fa3c_tensor *t, int elem_bytes, int batch, int seqlen,
                               int heads, cuuint64_t strides[3]) {
    int64_t s[3] = {t->stride[1], t->stride[2], t->stride[0]};
    int64_t extent[3] = {seqlen, heads, batch};
    const int dim_of[3] = {1, 2, 0};
    for (int i = 0; i < 3; i++) {
        int64_t bytes = extent[i] == 1 ? 16 : s[i] * elem_bytes;
        if (bytes <= 0 || bytes % 16 != 0 || bytes >= ((int64_t)1 << 40))
            return fa3c_error(FA3C_STATUS_NOT_SUPPORTED,
                              "%s: the CUDA backend needs the strides of dims 0-2 to be positive multiples of 16 "
                              "bytes (TMA); stride of dim %d is %lld elements",
                              name, dim_of[i], (long long)s[i]);
        strides[i] = (cuuint64_t)bytes;
    }
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_tensor_map_check_aligned(const char *name, const fa3c_tensor *t) {
    if ((uintptr_t)t->data % 16 != 0)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "%s.data: the CUDA backend needs 16-byte aligned tensors", name);
    return FA3C_STATUS_OK;
}

static int packed_tokens(int batch, int seqlen) {   /* the kernels' coordinates are int32 */
    int64_t n = (int64_t)batch * seqlen;
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

void fa3c_tensor_map_extents(const fa3c_problem *pr, int *q_outer, int *q_rows, int *kv_outer, int *kv_rows) {
    *q_outer = pr->cu_seqlens_q ? 1 : pr->batch;
    *q_rows = pr->cu_seqlens_q ? packed_tokens(pr->batch, pr->seqlen_q) : pr->seqlen_q;
    *kv_outer = pr->page_table ? pr->num_pages : pr->cu_seqlens_k ? 1 : pr->batch;
    *kv_rows = pr->page_table ? pr->page_size : pr->cu_seqlens_k ? packed_tokens(pr->batch, pr->seqlen_k) : pr->seqlen_k;
}

fa3c_status fa3c_tensor_map_check_input(const char *name, const fa3c_tensor *t, int elem_bytes, int batch, int seqlen,
                                        int heads) {
    fa3c_status s = fa3c_tensor_map_check_aligned(name, t);
    return s != FA3C_STATUS_OK ? s : fa3c_tensor_map_check(name, t, elem_bytes, batch, seqlen, heads);
}

fa3c_status fa3c_tensor_map_check(const char *name, const fa3c_tensor *t, int elem_bytes, int batch, int seqlen,
                                  int heads) {
    cuuint64_t strides[3];
    return tma_strides(name, t, elem_bytes, batch, seqlen, heads, strides);
}

/* Encode a tiled, swizzled map of 16-bit (or 8-bit) elements; the swizzle
 * follows the box's row width (128 B or 64 B). */
static fa3c_status encode_tiled(CUtensorMap *map, const char *name, void *data, int elem_bytes, int rank,
                                const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = get_encoder();
    if (!encode) return fa3c_error(FA3C_STATUS_CUDA_ERROR, "cuTensorMapEncodeTiled not found in the CUDA driver");
    cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
    CUtensorMapDataType type = elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    CUtensorMapSwizzle swizzle = box[0] * elem_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    CUresult r = encode(map, type, (cuuint32_t)rank, data, dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "%s: cuTensorMapEncodeTiled failed (CUresult %d); is %s.data "
                          "16-byte aligned?", name, (int)r, name);
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_tensor_map_rows(CUtensorMap *map, const char *name, const fa3c_tensor *t, int elem_bytes,
                                 int batch, int seqlen, int heads, int headdim, int box_cols, int box_rows) {
    cuuint64_t dims[4] = {(cuuint64_t)headdim, (cuuint64_t)seqlen, (cuuint64_t)heads, (cuuint64_t)batch};
    cuuint64_t strides[3];
    fa3c_status st = tma_strides(name, t, elem_bytes, batch, seqlen, heads, strides);
    if (st != FA3C_STATUS_OK) return st;
    cuuint32_t box[4] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows, 1, 1};
    return encode_tiled(map, name, t->data, elem_bytes, 4, dims, strides, box);
}

fa3c_status fa3c_tensor_map_groups(CUtensorMap *map, const char *name, const fa3c_tensor *t, int batch, int seqlen,
                                   int heads, int pack, int headdim, int box_cols, int box_rows) {
    cuuint64_t s[3];   /* bytes: seqlen, heads, batch */
    fa3c_status st = tma_strides(name, t, 2, batch, seqlen, heads, s);
    if (st != FA3C_STATUS_OK) return st;
    int groups = heads / pack;
    /* A dim of extent 1 is never stepped over: any legal stride will do. */
    cuuint64_t dims[5] = {(cuuint64_t)headdim, (cuuint64_t)pack, (cuuint64_t)seqlen, (cuuint64_t)groups,
                          (cuuint64_t)batch};
    cuuint64_t strides[4] = {pack > 1 ? s[1] : 16, s[0], groups > 1 ? s[1] * (cuuint64_t)pack : 16, s[2]};
    cuuint32_t box[5] = {(cuuint32_t)box_cols, (cuuint32_t)pack, (cuuint32_t)(box_rows / pack), 1, 1};
    return encode_tiled(map, name, t->data, 2, 5, dims, strides, box);
}

fa3c_status fa3c_tensor_map_f32_rows(CUtensorMap *map, const char *name, void *data, int64_t cols, int64_t rows,
                                     int box_cols) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = get_encoder();
    if (!encode) return fa3c_error(FA3C_STATUS_CUDA_ERROR, "cuTensorMapEncodeTiled not found in the CUDA driver");
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * 4};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, 1}, elem_strides[2] = {1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, data, dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fa3c_error(FA3C_STATUS_INTERNAL_ERROR, "%s: cuTensorMapEncodeTiled failed (CUresult %d)", name, (int)r);
    return FA3C_STATUS_OK;
}
