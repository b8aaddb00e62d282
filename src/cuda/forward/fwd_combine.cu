// Split-KV, second pass: every split of the forward kernel wrote its O
// (already divided by its own row sum, fp32) and its LSE; this merges them.
// With lse = log(sum_s exp(lse_s)), the exact softmax over all keys is
// O = sum_s exp(lse_s - lse) * O_s. An attention sink (p.sinks) counts in
// lse as a split whose O is 0. One warp per output row; rows whose every
// split saw no key (all lse_s = -inf) get O = 0 and lse = -inf (the sink,
// with one), as in the one-pass kernel. Packed sequences (cu_seqlens_q): the partials are
// kept per query of each sequence, as without; query i of sequence b goes
// to token start_b + i of out, and its LSE to (head, start_b + i) of the
// (heads_q, total_q) LSE. Rows past a sequence's queries (or its seqused_q)
// were not written by the forward kernel and are skipped.
#include <cuda_runtime.h>
#include <math.h>
#include "backend.h"
#include "fwd_combine.h"
#include "ptx.cuh"
#include "fwd_tile.cuh"

enum { COMBINE_WARPS = 4 };

static __device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(~0u, x, o));
    return x;
}
static __device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(~0u, x, o);
    return x;
}

// The split loop's loads are independent (the weights sit in smem), so
// they are unrolled to be in flight together: a loop that loaded a split's
// LSE and then its O, one split after the other, took 17 us for 64 rows of
// 16 splits.
__global__ void __launch_bounds__(32 * COMBINE_WARPS) fwd_combine_kernel(const fa3c_fwd_kernel_params p, int headdim,
                                                                         int fp16) {
    __shared__ float weights[COMBINE_WARPS][FA3C_MAX_SPLITS];
    const int64_t rows = (int64_t)p.batch * p.heads_q * p.seqlen_q;   // (batch, head, query), row-major
    const int64_t row = (int64_t)blockIdx.x * COMBINE_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int query = (int)(row % p.seqlen_q), head = (int)(row / p.seqlen_q % p.heads_q);
    const int batch = (int)(row / ((int64_t)p.seqlen_q * p.heads_q));
    float *w = weights[threadIdx.x / 32];
    // Where the row goes: (batch, query, head) of out and (batch, head, query)
    // of lse, or for packed sequences token q_start + query of both.
    int64_t out_offset = batch * p.out_stride[0] + query * p.out_stride[1] + head * p.out_stride[2];
    int64_t lse_offset = row;
    if (rows_from_end(p)) {
        FwdTile seq;   // the sequence's clamped lengths and offsets, as the forward kernel has them
        sequence_of_batch(p, batch, 1, seq);
        if (query >= seq.seqlen_q) return;   // no such query (or one past seqused_q): nothing was written for it
        if (p.cu_seqlens_q) {
            const int64_t total = min(max(p.cu_seqlens_q[p.batch], 0), p.batch * p.seqlen_q);   // as write_lse_from_end
            out_offset = (seq.q_start + query) * p.out_stride[1] + head * p.out_stride[2];
            lse_offset = head * total + seq.q_start + query;
        }
    }

    // An attention sink joins the sum as one more split with no value rows.
    const float sink = FA3C_CUDA_SINKS && p.sinks ? p.sinks[head] : -INFINITY;
    float max_lse = sink;
    for (int s = lane; s < p.num_splits; s += 32) {
        w[s] = p.lse_partial[s * rows + row];
        max_lse = fmaxf(max_lse, w[s]);
    }
    max_lse = warp_max(max_lse);
    float lse = -INFINITY;
    if (max_lse > -INFINITY) {
        float sum = 0.f;
        for (int s = lane; s < p.num_splits; s += 32) sum += expf(w[s] - max_lse);
        lse = max_lse + logf(warp_sum(sum) + expf(sink - max_lse));
    }
    if (isnan(sink)) lse = sink;   // fmaxf above skips a NaN: a NaN sink makes a NaN row, as in the one-pass kernel
    for (int s = lane; s < p.num_splits; s += 32) w[s] = lse == -INFINITY ? 0.f : expf(w[s] - lse);   // 0: no key
    __syncwarp();

    uint16_t *out = (uint16_t *)p.out + out_offset;
    const float *o = p.o_partial + row * headdim;
    const int64_t split_stride = rows * headdim;
    for (int col = 2 * lane; col < p.out_cols; col += 64) {   // the partials' rows are headdim (the kernel's) wide
        float2 acc = make_float2(0.f, 0.f);
#pragma unroll 8
        for (int s = 0; s < p.num_splits; s++) {
            float2 v = *(const float2 *)(o + s * split_stride + col);
            acc.x += w[s] * v.x;
            acc.y += w[s] * v.y;
        }
        *(uint32_t *)(out + col) = fp16 ? pack_f16x2(acc.x, acc.y) : pack_bf16x2(acc.x, acc.y);
    }
    if (p.lse && lane == 0) p.lse[lse_offset] = lse;
}

extern "C" fa3c_status fa3c_fwd_combine(const fa3c_fwd_kernel_params *p, int headdim, int fp16, void *stream) {
    int64_t rows = (int64_t)p->batch * p->heads_q * p->seqlen_q;
    int64_t blocks = (rows + COMBINE_WARPS - 1) / COMBINE_WARPS;
    if (blocks > INT32_MAX)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "split-KV combine: %lld rows are too many", (long long)rows);
    fwd_combine_kernel<<<(unsigned)blocks, 32 * COMBINE_WARPS, 0, (cudaStream_t)stream>>>(*p, headdim, fp16);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "split-KV combine kernel launch failed: %s", cudaGetErrorString(e));
    return FA3C_STATUS_OK;
}
