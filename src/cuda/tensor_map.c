/* TMA descriptors through the driver entry point (see tensor_map.h). */
#include "tensor_map.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include "backend.h"

static PFN_cuTensorMapEncodeTiled_v12000 get_encoder(void) {
    /* Looked up once; the pointer is the same for every thread. */
    static PFN_cuTensorMapEncodeTiled_v12000 encode;
    if (!encode) {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
            encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    return encode;
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

fa3c_status fa3c_tensor_map_check(const char *name, const fa3c_tensor *t, int elem_bytes, int batch, int seqlen,
                                  int heads) {
    cuuint64_t strides[3];
    return tma_strides(name, t, elem_bytes, batch, seqlen, heads, strides);
}

fa3c_status fa3c_tensor_map_rows(CUtensorMap *map, const char *name, const fa3c_tensor *t, int elem_bytes,
                                 int batch, int seqlen, int heads, int headdim, int box_cols, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = get_encoder();
    if (!encode) return fa3c_error(FA3C_STATUS_CUDA_ERROR, "cuTensorMapEncodeTiled not found in the CUDA driver");
    cuuint64_t dims[4] = {(cuuint64_t)headdim, (cuuint64_t)seqlen, (cuuint64_t)heads, (cuuint64_t)batch};
    cuuint64_t strides[3];
    fa3c_status st = tma_strides(name, t, elem_bytes, batch, seqlen, heads, strides);
    if (st != FA3C_STATUS_OK) return st;
    int row_bytes = box_cols * elem_bytes;
    cuuint32_t box[4] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows, 1, 1};
    cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    CUtensorMapDataType type = elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    CUtensorMapSwizzle swizzle = row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    CUresult r = encode(map, type, 4, t->data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "%s: cuTensorMapEncodeTiled failed (CUresult %d); is %s.data "
                          "16-byte aligned?", name, (int)r, name);
    return FA3C_STATUS_OK;
}
