// The backward's kernels before and after the main one (bwd_sm90.cuh,
// bwd_wide_sm90.cuh): plain CUDA, memory-bound. They move the same bytes at
// every sequence length, so at short sequences they are a large part of a
// call: both read and write in 16-byte vectors where the tensors allow, and
// the preprocessing also zeroes dQ's accumulator (no separate memset), or
// with the first-write flags only those.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include "bwd_prep.h"
#include "bwd_tiles.h"
#include "backend.h"

enum {
    PREP_ROWS = 32,                  // query rows per preprocessing CTA
    PREP_LANES = 8,                  // threads per row, 8 elements each per pass
    PREP_THREADS = PREP_ROWS * PREP_LANES,
    DQ_THREADS = 128,                // one piece of the accumulator per dq CTA (fa3c_bwd_dq_tile_offset)
    DQ_ROWS = 128,                   // the dq kernel's staging tile: rows of a piece, at most (dq_piece_rows)
    DQ_PITCH = 64 + 8,               // its row pitch, in 16-bit elements
    DSINK_THREADS = 512              // one CTA per head sums its rows of every batch
};

template <int FP16>
static __device__ __forceinline__ float to_float(const void *base, int64_t i) {
    return FP16 ? __half2float(((const __half *)base)[i]) : __bfloat162float(((const __nv_bfloat16 *)base)[i]);
}

// Eight consecutive 16-bit elements at base[i] as floats: one 16-byte load
// (VEC: the caller checked the alignment) or eight 2-byte ones.
template <int FP16, int VEC>
static __device__ __forceinline__ void load8(const void *base, int64_t i, float *x) {
    if (VEC) {
        const uint4 u = *(const uint4 *)((const uint16_t *)base + i);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f;
            if (FP16) f = __half22float2(*(const __half2 *)&w[j]);
            else f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[j]);
            x[2 * j] = f.x;
            x[2 * j + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = to_float<FP16>(base, i + j);
    }
}

template <int FP16>
static __device__ __forceinline__ uint16_t to_bits(float x) {
    if (FP16) return __half_as_ushort(__float2half_rn(x));
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

// The queries of `batch`'s sequence: how many are used (seqused_q) and
// stored, and the token of the first when packed (else 0), as the main
// kernel sees them (bwd_sequence).
struct PrepRow {
    int sq, sq_stored;
    int64_t tok;
};
static __device__ __forceinline__ PrepRow prep_sequence(const fa3c_bwd_prep_params &p, int batch) {
    PrepRow r;
    int tok = 0;
    r.sq_stored = p.seqlen_q;
    if (p.cu_seqlens_q) fa3c_bwd_packed_sequence(p.cu_seqlens_q, batch, p.batch, p.seqlen_q, &tok, &r.sq_stored);
    r.sq = fa3c_bwd_used(p.seqused_q, batch, r.sq_stored);
    r.tok = tok;
    return r;
}

// The element offset of query q of a sequence in out / dout / dq (strides st).
static __device__ __forceinline__ int64_t row_offset(const fa3c_bwd_prep_params &p, const int64_t *st, int batch,
                                                     int64_t tok, int q, int head) {
    return (p.cu_seqlens_q ? 0 : batch * st[0]) + (tok + q) * st[1] + head * st[2];
}

// The query held by scratch row `row` (row % block_m of query block
// row / block_m's smem tile, fa3c_bwd_rows_start), or -1 for a row outside
// the sequence or owned by the block before.
static __device__ __forceinline__ int scratch_query(const fa3c_bwd_prep_params &p, int row, int sq) {
    const int block = row / p.block_m;
    const int q = fa3c_bwd_rows_start(block, p.block_m, sq, fa3c_bwd_queries_shifted(p.cu_seqlens_q, p.seqused_q)) + row % p.block_m;
    return q >= block * p.block_m && q < sq ? q : -1;
}

// Grid: (rows_pad / PREP_ROWS rounded up, heads_q, batch). Per scratch row: dsum =
// rowsum(dO ⊙ O) and lse_log2 = lse · log2(e), or dsum = 0 and lse_log2 =
// +inf for rows without a query of their own and for fully masked rows.
// Each CTA also zeroes its rows' share of dQ's accumulator (any rows x
// accum_cols floats of it: the tile order permutes within a block; not with
// dq_written, whose first writer stores) and the turn counter or
// first-write flag of a query block that starts in its rows. rows_pad is a
// multiple of block_m (64, 80 or 128), not always of PREP_ROWS: the last
// CTA's rows stop at rows_pad.
template <int FP16, int VEC>
__global__ void __launch_bounds__(PREP_THREADS) bwd_prep_kernel(const fa3c_bwd_prep_params p) {
    const int head = blockIdx.y, batch = blockIdx.z, row0 = blockIdx.x * PREP_ROWS;
    const int rows = min(PREP_ROWS, p.rows_pad - row0);
    const int64_t bh = (int64_t)batch * p.heads_q + head;
    if (!p.dq_written) {
        float4 *zero = (float4 *)(p.dq_accum + (bh * p.rows_pad + row0) * p.accum_cols);
        for (int i = threadIdx.x; i < rows * p.accum_cols / 4; i += PREP_THREADS) zero[i] = make_float4(0, 0, 0, 0);
    }
    int *const flags = p.dq_semaphore ? p.dq_semaphore : p.dq_written;
    const int block = (row0 + p.block_m - 1) / p.block_m;   // the first block starting at or after row0
    if (flags && threadIdx.x == 0 && block * p.block_m < row0 + rows) flags[bh * (p.rows_pad / p.block_m) + block] = 0;

    const int row = row0 + threadIdx.x / PREP_LANES, lane = threadIdx.x % PREP_LANES;   // row < rows_pad: written
    const PrepRow s = prep_sequence(p, batch);
    const int q = scratch_query(p, row, s.sq);
    float sum = 0.f;
    if (q >= 0) {
        const int64_t o = row_offset(p, p.out_stride, batch, s.tok, q, head);
        const int64_t g = row_offset(p, p.dout_stride, batch, s.tok, q, head);
        for (int c = 8 * lane; c < p.headdim_v; c += 8 * PREP_LANES) {
            float x[8], y[8];
            load8<FP16, VEC>(p.out, o + c, x);
            load8<FP16, VEC>(p.dout, g + c, y);
#pragma unroll
            for (int j = 0; j < 8; j++) sum += x[j] * y[j];
        }
    }
#pragma unroll
    for (int width = PREP_LANES / 2; width > 0; width /= 2) sum += __shfl_xor_sync(~0u, sum, width);
    if (lane == 0 && row < p.rows_pad) {
        // The forward's LSE: (batch, heads_q, seqlen_q), or packed (heads_q, total_q).
        const int64_t l = p.cu_seqlens_q ? (int64_t)head * p.cu_seqlens_q[p.batch] + s.tok + q
                                         : bh * p.seqlen_q + q;
        const float lse = q >= 0 ? p.lse[l] : -INFINITY;
        p.dsum[bh * p.rows_pad + row] = q >= 0 ? sum : 0.f;
        p.lse_log2[bh * p.rows_pad + row] = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
    }
}

// Zeros in dq's rows [q_lo, q_hi) of a sequence, columns [col0, col0 + 64)
// (those below headdim), by the CTA's threads, 8 columns at a time.
template <int VEC>
static __device__ __forceinline__ void write_zero_rows(const fa3c_bwd_prep_params &p, const PrepRow &s, int batch,
                                                       int head, int q_lo, int q_hi, int col0) {
    for (int j = threadIdx.x; j < (q_hi - q_lo) * 8; j += DQ_THREADS) {
        const int q = q_lo + j / 8, col = col0 + 8 * (j % 8);
        if (col >= p.headdim) continue;
        uint16_t *dst = (uint16_t *)p.dq + row_offset(p, p.dq_stride, batch, s.tok, q, head) + col;
        if (VEC) *(uint4 *)dst = make_uint4(0, 0, 0, 0);
        else
            for (int e = 0; e < 8; e++) dst[e] = 0;
    }
}

// The rows of one piece of the tile-order accumulator (fa3c_bwd_dq_tile_offset):
// 64, or a whole query block where dQ is transposed.
static __host__ __device__ __forceinline__ int dq_piece_rows(const fa3c_bwd_prep_params &p) {
    return FA3C_BWD_DQ_TRANSPOSED(p.accum_cols) ? p.block_m : 64;
}

// Grid: (rows_pad / R x accum_cols / 64, heads_q, batch), R = dq_piece_rows:
// one piece of R rows x 64 columns of the tile-order accumulator
// (fa3c_bwd_dq_tile_offset) per CTA (zeros for a tile no key block wrote,
// dq_written), read whole (thread t's float4 k is at (128 k + t) 4: the
// accumulator's rows 16 warp + lane / 4 (+ 8), columns 8 k + 2 (lane % 4)
// (+ 1), which are query rows and columns, or transposed columns and query
// rows), scaled and staged in smem as 16-bit rows, then written as 16-byte
// row pieces (VEC) or 2-byte elements.
template <int FP16, int VEC>
__global__ void __launch_bounds__(DQ_THREADS) bwd_dq_kernel(const fa3c_bwd_prep_params p) {
    __shared__ __align__(16) uint16_t tile[DQ_ROWS * DQ_PITCH];
    const int head = blockIdx.y, batch = blockIdx.z, col_pieces = p.accum_cols / 64, R = dq_piece_rows(p);
    const bool transposed = FA3C_BWD_DQ_TRANSPOSED(p.accum_cols);
    const int row0 = blockIdx.x / col_pieces * R, col0 = (blockIdx.x % col_pieces) * 64;
    const PrepRow s = prep_sequence(p, batch);
    const int t = threadIdx.x;
    if (s.sq < s.sq_stored)   // queries past those used: zeros in dq rows [sq, sq_stored) of these R
        write_zero_rows<VEC>(p, s, batch, head, max(row0, s.sq), min(row0 + R, s.sq_stored), col0);
    if (row0 >= p.rows_pad ||
        fa3c_bwd_rows_start(row0 / p.block_m, p.block_m, s.sq, fa3c_bwd_queries_shifted(p.cu_seqlens_q, p.seqused_q)) >= s.sq)
        return;   // past the sequence (packed sequences shorter than the longest)
    const int64_t bh = (int64_t)batch * p.heads_q + head;
    const float4 *piece = (const float4 *)(p.dq_accum + (bh * p.rows_pad + row0) * p.accum_cols +
                                           (blockIdx.x % col_pieces) * R * 64);
    const bool untouched = p.dq_written && p.dq_written[bh * (p.rows_pad / p.block_m) + row0 / p.block_m] == 0;
    const int r = 16 * (t / 32) + (t % 32) / 4, c = 2 * (t % 4);
    for (int k = 0; k < R / 8; k++) {
        const float4 v = untouched ? make_float4(0.f, 0.f, 0.f, 0.f) : piece[128 * k + t];
        const uint16_t x = to_bits<FP16>(v.x * p.softmax_scale), y = to_bits<FP16>(v.y * p.softmax_scale);
        const uint16_t z = to_bits<FP16>(v.z * p.softmax_scale), w = to_bits<FP16>(v.w * p.softmax_scale);
        if (transposed) {   // accumulator rows r, r + 8 are columns; its columns 8 k + c (+ 1) query rows
            tile[(8 * k + c) * DQ_PITCH + r] = x;
            tile[(8 * k + c + 1) * DQ_PITCH + r] = y;
            tile[(8 * k + c) * DQ_PITCH + r + 8] = z;
            tile[(8 * k + c + 1) * DQ_PITCH + r + 8] = w;
        } else {
            *(uint32_t *)&tile[r * DQ_PITCH + 8 * k + c] = x | (uint32_t)y << 16;
            *(uint32_t *)&tile[(r + 8) * DQ_PITCH + 8 * k + c] = z | (uint32_t)w << 16;
        }
    }
    __syncthreads();
    for (int j = t; j < R * 8; j += DQ_THREADS) {   // 8 pieces of 8 columns per row
        const int rr = j / 8, cc = 8 * (j % 8), col = col0 + cc;
        const int q = scratch_query(p, row0 + rr, s.sq);
        if (q < 0 || col >= p.headdim) continue;
        const int64_t o = row_offset(p, p.dq_stride, batch, s.tok, q, head) + col;
        const uint16_t *src = &tile[rr * DQ_PITCH + cc];
        if (VEC) *(uint4 *)((uint16_t *)p.dq + o) = *(const uint4 *)src;
        else
            for (int e = 0; e < 8; e++) ((uint16_t *)p.dq)[o + e] = src[e];
    }
}

// Grid: heads_q CTAs. With attention sinks, the sink's gradient: dsinks[h] =
// -Σ exp(sink - lse) · dsum over the batch and the rows, from the scratch the
// preprocessing wrote (rows without a query of their own have dsum = 0 and
// lse_log2 = +inf: they add 0). Each thread sums a fixed stride of rows and
// the CTA adds the threads' sums in a fixed tree: the same bits every run.
__global__ void __launch_bounds__(DSINK_THREADS) bwd_dsinks_kernel(const fa3c_bwd_prep_params p) {
    __shared__ float part[DSINK_THREADS];
    const int head = blockIdx.x;
    const float sink2 = p.sinks[head] * 1.4426950408889634f;   // log2 units, as lse_log2
    float sum = 0.f;
    if (sink2 != -INFINITY)   // a -inf sink has no probability and no gradient
        for (int b = 0; b < p.batch; b++) {
            const int64_t base = ((int64_t)b * p.heads_q + head) * p.rows_pad;
            for (int r = threadIdx.x; r < p.rows_pad; r += DSINK_THREADS) {
                const float d = p.dsum[base + r];
                if (d != 0.f) sum += exp2f(sink2 - p.lse_log2[base + r]) * d;
            }
        }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int w = DSINK_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) p.dsinks[head] = -part[0];
}

static fa3c_status launched(const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FA3C_STATUS_OK
                            : fa3c_error(FA3C_STATUS_CUDA_ERROR, "backward: %s launch failed: %s", what,
                                         cudaGetErrorString(e));
}

// 16-byte vectors fit a tensor whose pointer and strides are multiples of 8
// elements (the head dims, 64-256, are).
static bool vector_ok(const void *data, const int64_t *stride) {
    return (uintptr_t)data % 16 == 0 && stride[0] % 8 == 0 && stride[1] % 8 == 0 && stride[2] % 8 == 0;
}

#define FA3C_BWD_AUX_LAUNCH(kernel, grid, threads, fp16, vec, p, stream)                        \
    do {                                                                                        \
        if (fp16 && vec) kernel<1, 1><<<grid, threads, 0, (cudaStream_t)stream>>>(p);          \
        else if (fp16) kernel<1, 0><<<grid, threads, 0, (cudaStream_t)stream>>>(p);            \
        else if (vec) kernel<0, 1><<<grid, threads, 0, (cudaStream_t)stream>>>(p);             \
        else kernel<0, 0><<<grid, threads, 0, (cudaStream_t)stream>>>(p);                      \
    } while (0)

extern "C" fa3c_status fa3c_bwd_prep(const fa3c_bwd_prep_params *p, int fp16, void *stream) {
    // The call's first launch: refuse a block size the dq kernel's staging tile was not sized for
    // before anything runs.
    if (dq_piece_rows(*p) > DQ_ROWS)
        return fa3c_error(FA3C_STATUS_INTERNAL_ERROR, "backward: the dq kernel stages at most %d rows, the main "
                          "kernel's query blocks have %d", (int)DQ_ROWS, dq_piece_rows(*p));
    const dim3 grid((unsigned)((p->rows_pad + PREP_ROWS - 1) / PREP_ROWS), (unsigned)p->heads_q, (unsigned)p->batch);
    const bool vec = vector_ok(p->out, p->out_stride) && vector_ok(p->dout, p->dout_stride);
    FA3C_BWD_AUX_LAUNCH(bwd_prep_kernel, grid, PREP_THREADS, fp16, vec, *p, stream);
    return launched("preprocessing kernel");
}

extern "C" fa3c_status fa3c_bwd_write_dq(const fa3c_bwd_prep_params *p, int fp16, void *stream) {
    const dim3 grid((unsigned)(p->rows_pad / dq_piece_rows(*p) * (p->accum_cols / 64)), (unsigned)p->heads_q,
                    (unsigned)p->batch);
    FA3C_BWD_AUX_LAUNCH(bwd_dq_kernel, grid, DQ_THREADS, fp16, vector_ok(p->dq, p->dq_stride), *p, stream);
    return launched("dq kernel");
}

extern "C" fa3c_status fa3c_bwd_dsinks(const fa3c_bwd_prep_params *p, void *stream) {
    bwd_dsinks_kernel<<<(unsigned)p->heads_q, DSINK_THREADS, 0, (cudaStream_t)stream>>>(*p);
    return launched("dsinks kernel");
}
