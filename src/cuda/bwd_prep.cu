// The backward's kernels before and after the main one (bwd_sm90.cuh):
// plain CUDA, one warp per query row, memory-bound and small next to it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include "bwd_prep.h"
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

// Grid: (rows_pad / ROWS_PER_CTA, heads_q, batch).
template <int FP16>
__global__ void __launch_bounds__(32 * ROWS_PER_CTA) bwd_prep_kernel(const fa3c_bwd_prep_params p) {
    const int row = blockIdx.x * ROWS_PER_CTA + threadIdx.x / 32, lane = threadIdx.x % 32;
    const int head = blockIdx.y, batch = blockIdx.z;
    float sum = 0.f;
    if (row < p.seqlen_q) {
        const int64_t o = batch * p.out_stride[0] + row * p.out_stride[1] + head * p.out_stride[2];
        const int64_t g = batch * p.dout_stride[0] + row * p.dout_stride[1] + head * p.dout_stride[2];
        for (int c = lane; c < p.headdim; c += 32) sum += load16<FP16>(p.out, o + c) * load16<FP16>(p.dout, g + c);
    }
#pragma unroll
    for (int width = 16; width > 0; width /= 2) sum += __shfl_xor_sync(~0u, sum, width);
    if (lane == 0) {
        const int64_t bh = (int64_t)batch * p.heads_q + head, i = bh * p.rows_pad + row;
        const float lse = row < p.seqlen_q ? p.lse[bh * p.seqlen_q + row] : -INFINITY;
        p.dsum[i] = row < p.seqlen_q ? sum : 0.f;
        p.lse_log2[i] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    }
}

// Grid: (ceil(seqlen_q / ROWS_PER_CTA), heads_q, batch).
template <int FP16>
__global__ void __launch_bounds__(32 * ROWS_PER_CTA) bwd_dq_kernel(const fa3c_bwd_prep_params p) {
    const int row = blockIdx.x * ROWS_PER_CTA + threadIdx.x / 32, lane = threadIdx.x % 32;
    const int head = blockIdx.y, batch = blockIdx.z;
    if (row >= p.seqlen_q) return;
    const float *acc = p.dq_accum + (((int64_t)batch * p.heads_q + head) * p.rows_pad + row) * p.headdim;
    const int64_t o = batch * p.dq_stride[0] + row * p.dq_stride[1] + head * p.dq_stride[2];
    for (int c = lane; c < p.headdim; c += 32) store16<FP16>(p.dq, o + c, acc[c] * p.softmax_scale);
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
