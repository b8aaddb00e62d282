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

/* The forward kernel's Q (and O) map: 5-D, (headdim, pack, seqlen,
 * heads / pack, batch), box {box_cols, pack, box_rows / pack, 1, 1}, so
 * that one box is box_rows rows of which row i * pack + h is query i, head h
 * of a group of `pack` consecutive heads (GQA packing; pack = 1: box_rows
 * queries of one head). box_rows must be a multiple of pack. */
fa3c_status fa3c_tensor_map_groups(CUtensorMap *map, const char *name, const fa3c_tensor *t, int batch, int seqlen,
                                   int heads, int pack, int headdim, int box_cols, int box_rows);

/* A 2-D map over rows x cols floats (rows contiguous, cols a multiple of 4)
 * with boxes of box_cols x 1 and no swizzle: the backward's per-row scratch
 * (lse_log2, dsum), loaded by TMA like the tiles. */
fa3c_status fa3c_tensor_map_f32_rows(CUtensorMap *map, const char *name, void *data, int64_t cols, int64_t rows,
                                     int box_cols);

/* The outer and row extents of the Q-like (q, out, dout) and K/V maps of a
 * problem: per sequence (batch, seqlen); packed sequences (cu_seqlens) as one
 * batch of batch x seqlen tokens, a bound clamped to int32 (the true totals
 * are device memory; the kernels' boxes stay inside their sequences); K/V
 * pages (num_pages, page_size). */
void fa3c_tensor_map_extents(const fa3c_problem *pr, int *q_outer, int *q_rows, int *kv_outer, int *kv_rows);

/* A TMA input of elem_bytes-sized elements: 16-byte aligned
 * (fa3c_tensor_map_check_aligned) and strides TMA can take
 * (fa3c_tensor_map_check). */
fa3c_status fa3c_tensor_map_check_input(const char *name, const fa3c_tensor *t, int elem_bytes, int batch, int seqlen,
                                        int heads);

/* NOT_SUPPORTED (with a message naming `name`) unless t->data is 16-byte
 * aligned, as TMA and the kernels' vector stores need. */
fa3c_status fa3c_tensor_map_check_aligned(const char *name, const fa3c_tensor *t);

/* NOT_SUPPORTED (with a message naming `name`) unless t's strides suit TMA:
 * positive multiples of 16 bytes for every dim of extent > 1. */
fa3c_status fa3c_tensor_map_check(const char *name, const fa3c_tensor *t, int elem_bytes, int batch, int seqlen,
                                  int heads);

#ifdef __cplusplus
}
#endif
#endif
