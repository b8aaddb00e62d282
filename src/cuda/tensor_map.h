/* Host-side TMA descriptors (CUtensorMap) for (batch, seqlen, heads, headdim)
 * tensors. The driver's encoder is reached through the runtime's
 * cudaGetDriverEntryPointByVersion, so nothing links against libcuda. */
#ifndef FA3C_TENSOR_MAP_H
#define FA3C_TENSOR_MAP_H

#include <cuda.h>
#include "fa3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 4-D map over t (dims innermost first: headdim, seqlen, heads, batch) with
 * a box of {box_cols elements of headdim, box_rows rows, 1, 1} and the
 * swizzle of that row width (128 B or 64 B). Rows past `seqlen` read as
 * zeros. elem_bytes is 1 or 2. `name` is used in the error message. */
fa3c_status fa3c_tensor_map_rows(CUtensorMap *map, const char *name, const fa3c_tensor *t, int elem_bytes,
                                 int batch, int seqlen, int heads, int headdim, int box_cols, int box_rows);

/* NOT_SUPPORTED (with a message naming `name`) unless t's strides suit TMA:
 * positive multiples of 16 bytes for every dim of extent > 1. */
fa3c_status fa3c_tensor_map_check(const char *name, const fa3c_tensor *t, int elem_bytes, int batch, int seqlen,
                                  int heads);

#ifdef __cplusplus
}
#endif
#endif
