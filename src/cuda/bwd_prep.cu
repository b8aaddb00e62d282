// The backward's kernels before and after the main one (bwd_sm90.cuh):
// plain CUDA, one warp per query row, memory-bound and small next to it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include "bwd_prep.h"
#include "bwd_tiles.h"
#include "backend.h"

enum { ROWS_PER_CTA = 4 };   // one warp per row

template <int FP16>
static __device__ __forceinline__ float load16(const void *base, int64_t i) {
    return FP16 ? __half2float(((const __half *)base)[i]) : __bfloat162float(((const __nv_bfloat16 *)base)[i]);
}

template <int FP16>
static __device__ __forceinline__ void store16(void *base, int64_t i, float x) {
    if (FP16) ((__half *)base)[i] = __float2half_rn(x);
    else ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(x);
}

// The queries of `batch`'s sequence: how many, and the token of the first
// when packed (else 0), as the main kernel sees them (bwd_sequence).
struct PrepRow {
    int sq;
    int64_t tok;
};
static __device__ __forceinline__ PrepRow prep_sequence(const fa3c_bwd_prep_params &p, int batch) {
    PrepRow r;
    int tok = 0;
    r.sq = p.seqlen_q;
    if (p.cu_seqlens_q) fa3c_bwd_packed_sequence(p.cu_seqlens_q, batch, p.batch, p.seqlen_q, &tok, &r.sq);
    r.tok = tok;
    return r;
}

// The element offset of query q of a sequence in out / dout / dq (strides st).
static __device__ __forceinline__ int64_t row_offset(const fa3c_bwd_prep_params &p, const int64_t *st, int batch,
                                                     int64_t tok, int q, int head) {
    return (p.cu_seqlens_q ? 0 : batch * st[0]) + (tok + q) * st[1] + head * st[2];
}

// Grid: (rows_pad / ROWS_PER_CTA, heads_q, batch). Scratch row `row` is row
// row % block_m of query block row / block_m's smem tile, which holds query
// fa3c_bwd_rows_start(...) + row % block_m (bwd_params.h): rows outside the
// sequence, or owned by the block before, get lse_log2 = +inf and dsum = 0.
template <int FP16>
__global__ void __launch_bounds__(32 * ROWS_PER_CTA) bwd_prep_kernel(const fa3c_bwd_prep_params p) {
    const int row = blockIdx.x * ROWS_PER_CTA + threadIdx.x / 32, lane = threadIdx.x % 32;
    const int head = blockIdx.y, batch = blockIdx.z, block = row / p.block_m;
    const PrepRow s = prep_sequence(p, batch);
    const int q = fa3c_bwd_rows_start(block, p.block_m, s.sq, p.cu_seqlens_q != nullptr) + row % p.block_m;
    const bool valid = q >= block * p.block_m && q < s.sq;
    float sum = 0.f;
    if (valid) {
        const int64_t o = row_offset(p, p.out_stride, batch, s.tok, q, head);
        const int64_t g = row_offset(p, p.dout_stride, batch, s.tok, q, head);
        for (int c = lane; c < p.headdim; c += 32) sum += load16<FP16>(p.out, o + c) * load16<FP16>(p.dout, g + c);
    }
#pragma unroll
    for (int width = 16; width > 0; width /= 2) sum += __shfl_xor_sync(~0u, sum, width);
    if (lane == 0) {
        const int64_t i = ((int64_t)batch * p.heads_q + head) * p.rows_pad + row;
        // The forward's LSE: (batch, heads_q, seqlen_q), or packed (heads_q, total_q).
        const int64_t l = p.cu_seqlens_q ? (int64_t)head * p.cu_seqlens_q[p.batch] + s.tok + q
                                         : ((int64_t)batch * p.heads_q + head) * p.seqlen_q + q;
        const float lse = valid ? p.lse[l] : -INFINITY;
        p.dsum[i] = valid ? sum : 0.f;
        p.lse_log2[i] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    }
}

// Grid: (ceil(seqlen_q / ROWS_PER_CTA), heads_q, batch).
template <int FP16>
__global__ void __launch_bounds__(32 * ROWS_PER_CTA) bwd_dq_kernel(const fa3c_bwd_prep_params p) {
    const int q = blockIdx.x * ROWS_PER_CTA + threadIdx.x / 32, lane = threadIdx.x % 32;
    const int head = blockIdx.y, batch = blockIdx.z;
    const PrepRow s = prep_sequence(p, batch);
    if (q >= s.sq) return;
    const int64_t o = row_offset(p, p.dq_stride, batch, s.tok, q, head);
    // Tile order (fa3c_bwd_dq_tile_offset): query q is row q - q0 of block q / block_m's tile.
    const int m = q / p.block_m, r = q - fa3c_bwd_rows_start(m, p.block_m, s.sq, p.cu_seqlens_q != nullptr);
    const float *tile = p.dq_accum + (((int64_t)batch * p.heads_q + head) * p.rows_pad + (int64_t)m * p.block_m) *
                                         p.accum_cols;
    for (int c = lane; c < p.headdim; c += 32)
        store16<FP16>(p.dq, o + c, tile[fa3c_bwd_dq_tile_offset(r, c, p.accum_cols)] * p.softmax_scale);
}

static fa3c_status launched(const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FA3C_STATUS_OK
                            : fa3c_error(FA3C_STATUS_CUDA_ERROR, "backward: %s launch failed: %s", what,
                                         cudaGetErrorString(e));
}

extern "C" fa3c_status fa3c_bwd_prep(const fa3c_bwd_prep_params *p, int fp16, void *stream) {
    const dim3 grid((unsigned)(p->rows_pad / ROWS_PER_CTA), (unsigned)p->heads_q, (unsigned)p->batch);
    if (fp16) bwd_prep_kernel<1><<<grid, 32 * ROWS_PER_CTA, 0, (cudaStream_t)stream>>>(*p);
    else bwd_prep_kernel<0><<<grid, 32 * ROWS_PER_CTA, 0, (cudaStream_t)stream>>>(*p);
    return launched("preprocessing kernel");
}

extern "C" fa3c_status fa3c_bwd_write_dq(const fa3c_bwd_prep_params *p, int fp16, void *stream) {
    const dim3 grid((unsigned)((p->seqlen_q + ROWS_PER_CTA - 1) / ROWS_PER_CTA), (unsigned)p->heads_q,
                    (unsigned)p->batch);
    if (fp16) bwd_dq_kernel<1><<<grid, 32 * ROWS_PER_CTA, 0, (cudaStream_t)stream>>>(*p);
    else bwd_dq_kernel<0><<<grid, 32 * ROWS_PER_CTA, 0, (cudaStream_t)stream>>>(*p);
    return launched("dq kernel");
}
