// fa3c_quantize_fp8's kernels (src/api.c validates): two passes over x, one
// warp per row. The first finds each block's (batch, group of heads, and with
// block_rows block of rows) largest |value| after the optional rotation and
// folds it into a scratch word with an atomic max (a non-negative float's
// bits order as integers, and NaN's are above inf's, so NaN wins); the second
// divides by descale = amax / 448 and rounds to e4m3, and the CTAs of the
// first chunk write the descales. The rotation
// is fa3c_hadamard_rotate_f32's: signs, butterflies h = 1, 2, 4, ... with
// (a + b, a - b), then the norm, so every value takes the CPU's operations
// in the CPU's order and the result is the CPU backend's, bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "backend.h"

enum { QUANT_THREADS = 256, QUANT_WARPS = QUANT_THREADS / 32, QUANT_ROWS_PER_CTA = 64 };

struct QuantArgs {
    const char *x;
    uint8_t *out;
    float *descale;
    unsigned *amax;       // scratch: one word per block
    const float *signs;   // NULL: all +1
    int64_t x_stride[3], out_stride[3];
    int batch, seqlen, heads, headdim, group, blocks, dtype, hadamard;
    int block_rows, row_blocks;   // rows per descale (seqlen without block_rows) and blocks of them per group
    int vec;              // 1: 16-bit x and both tensors 16-byte aligned with strides to match: a lane's
                          // K contiguous values (the rotation's layout) load and store as vectors
    float norm;           // 1 / sqrt(headdim), rounded as on the host
};

__device__ __forceinline__ float load_x(const char *row, int c, int dtype) {
    if (dtype == FA3C_DTYPE_FP32) return ((const float *)row)[c];
    if (dtype == FA3C_DTYPE_FP16) return __half2float(((const __half *)row)[c]);
    return __bfloat162float(((const __nv_bfloat16 *)row)[c]);
}

// K 16-bit values from column c0 of a row, as one or two vector loads (the
// caller checked the alignment: QuantArgs::vec).
template <int K>
__device__ __forceinline__ void load_x_vector(const char *row, int c0, int dtype, float (&v)[K]) {
    uint32_t w[K / 2];
    const char *p = row + 2 * (int64_t)c0;
    if constexpr (K >= 8) {
#pragma unroll
        for (int i = 0; i < K / 8; i++) *(uint4 *)&w[4 * i] = ((const uint4 *)p)[i];
    } else if constexpr (K == 4) {
        *(uint2 *)w = *(const uint2 *)p;
    } else {
        w[0] = *(const uint32_t *)p;
    }
#pragma unroll
    for (int k = 0; k < K; k++) {
        const unsigned short bits = (unsigned short)(w[k / 2] >> (16 * (k % 2)));
        v[k] = dtype == FA3C_DTYPE_FP16 ? __half2float(__ushort_as_half(bits))
                                        : __bfloat162float(__ushort_as_bfloat16(bits));
    }
}

// This lane's values of row r of block (b, g), K of them at most (a
// compile-time count, so that they stay in registers): with the rotation,
// columns lane K .. lane K + K - 1 (K = headdim / 32, or 1 with headdim lanes
// for headdim < 32); without, columns lane + 32 k. Returns how many it holds
// (a prefix of the K).
template <int K>
__device__ int load_row(const QuantArgs &a, int b, int g, int r, float (&v)[K], int64_t *out_off) {
    const int lane = threadIdx.x % 32, h = g * a.group + r / a.seqlen, s = r % a.seqlen;
    const char *row = a.x + ((int64_t)b * a.x_stride[0] + s * a.x_stride[1] + h * a.x_stride[2]) *
                                (a.dtype == FA3C_DTYPE_FP32 ? 4 : 2);
    *out_off = (int64_t)b * a.out_stride[0] + s * a.out_stride[1] + h * a.out_stride[2];
    if (!a.hadamard) {
        int n = 0;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const bool in_row = lane + 32 * k < a.headdim;
            v[k] = in_row ? load_x(row, lane + 32 * k, a.dtype) : 0.f;
            n += in_row;
        }
        return n;
    }
    // Lanes past a short row (headdim < 32) hold zeros but still take part in
    // the shuffles; their partners are all in the row.
    const bool active = lane * K < a.headdim;
    if constexpr (K >= 2) {
        if (a.vec && active) {
            load_x_vector<K>(row, lane * K, a.dtype, v);
#pragma unroll
            for (int k = 0; k < K; k++) v[k] *= a.signs ? a.signs[lane * K + k] : 1.f;
        }
    }
    if (K == 1 || !a.vec || !active) {
#pragma unroll
        for (int k = 0; k < K; k++) {
            const int c = lane * K + k;
            v[k] = active ? load_x(row, c, a.dtype) * (a.signs ? a.signs[c] : 1.f) : 0.f;
        }
    }
#pragma unroll
    for (int hb = 1; hb < K; hb <<= 1)   // partners in this lane
#pragma unroll
        for (int k = 0; k < K; k++)
            if (!(k & hb)) {
                const float x0 = v[k], x1 = v[k + hb];
                v[k] = x0 + x1;
                v[k + hb] = x0 - x1;
            }
    for (int hb = K; hb < a.headdim; hb <<= 1) {   // partners hb / K lanes away; every lane takes part
        const int step = hb / K;
        const bool upper = (lane & step) != 0;
#pragma unroll
        for (int k = 0; k < K; k++) {
            const float other = __shfl_xor_sync(0xffffffffu, v[k], step);
            v[k] = upper ? other - v[k] : v[k] + other;
        }
    }
#pragma unroll
    for (int k = 0; k < K; k++) v[k] *= a.norm;
    return active ? K : 0;
}

// Column of value k of this lane (as load_row laid them out).
template <int K>
__device__ __forceinline__ int column(const QuantArgs &a, int k) {
    const int lane = threadIdx.x % 32;
    return a.hadamard ? lane * K + k : lane + 32 * k;
}

// The descale of row r (of a group's group * seqlen rows) of block blk.
__device__ __forceinline__ int descale_index(const QuantArgs &a, int blk, int r) {
    return blk * a.row_blocks + (r % a.seqlen) / a.block_rows;
}

// The warp's largest |value| into the scratch word of descale d.
__device__ __forceinline__ void fold_amax(const QuantArgs &a, int d, float amax) {
    // fabsf leaves no sign bit, so the bits order as the values (NaN above inf).
    for (int o = 16; o > 0; o >>= 1) amax = __uint_as_float(max(__float_as_uint(amax), __float_as_uint(__shfl_xor_sync(0xffffffffu, amax, o))));
    if (threadIdx.x % 32 == 0) atomicMax(&a.amax[d], __float_as_uint(amax));
}

template <int K>
__global__ void quantize_amax_kernel(const QuantArgs a) {
    const int blk = blockIdx.x, b = blk / a.blocks, g = blk % a.blocks, rows = a.group * a.seqlen;
    const int warp = threadIdx.x / 32;
    float amax = 0.f;
    int d = -1;   // the descale the warp's amax is for; it changes at most at a block of rows' end
    for (int r = blockIdx.y * QUANT_ROWS_PER_CTA + warp; r < min(rows, (int)(blockIdx.y + 1) * QUANT_ROWS_PER_CTA);
         r += QUANT_WARPS) {
        const int dr = descale_index(a, blk, r);
        if (dr != d) {
            if (d >= 0) fold_amax(a, d, amax);
            d = dr, amax = 0.f;
        }
        float v[K];
        int64_t off;
        const int n = load_row<K>(a, b, g, r, v, &off);
#pragma unroll
        for (int k = 0; k < K; k++) {
            const float m = fabsf(v[k]);
            if (k < n && (m > amax || isnan(m))) amax = isnan(amax) ? amax : m;
        }
    }
    if (d >= 0) fold_amax(a, d, amax);
}

__device__ __forceinline__ float descale_of(float amax) { return amax == 0.f ? 1.f : amax / 448.f; }

template <int K>
__global__ void quantize_write_kernel(const QuantArgs a) {
    const int blk = blockIdx.x, b = blk / a.blocks, g = blk % a.blocks, rows = a.group * a.seqlen;
    if (blockIdx.y == 0)
        for (int i = threadIdx.x; i < a.row_blocks; i += blockDim.x)
            a.descale[blk * a.row_blocks + i] = descale_of(__uint_as_float(a.amax[blk * a.row_blocks + i]));
    const int warp = threadIdx.x / 32;
    for (int r = blockIdx.y * QUANT_ROWS_PER_CTA + warp; r < min(rows, (int)(blockIdx.y + 1) * QUANT_ROWS_PER_CTA);
         r += QUANT_WARPS) {
        const float descale = descale_of(__uint_as_float(a.amax[descale_index(a, blk, r)]));
        float v[K];
        int64_t off;
        const int n = load_row<K>(a, b, g, r, v, &off);
        uint32_t q[(K + 3) / 4] = {};   // the e4m3 bytes, four to a word
#pragma unroll
        for (int k = 0; k < K; k++)
            q[k / 4] |= (uint32_t)__nv_cvt_float_to_fp8(v[k] / descale, __NV_SATFINITE, __NV_E4M3) << (8 * (k % 4));
        if (K >= 4 && a.vec && a.hadamard && n == K) {   // the lane's K contiguous bytes in one store
            uint8_t *dst = a.out + off + column<K>(a, 0);
            if constexpr (K == 16) *(uint4 *)dst = make_uint4(q[0], q[1], q[2], q[3]);
            else if constexpr (K == 8) *(uint2 *)dst = make_uint2(q[0], q[1]);
            else if constexpr (K == 4) *(uint32_t *)dst = q[0];
            continue;
        }
#pragma unroll
        for (int k = 0; k < K; k++)
            if (k < n) a.out[off + column<K>(a, k)] = (uint8_t)(q[k / 4] >> (8 * (k % 4)));
    }
}

// Both passes with K values per lane.
template <int K>
static void launch_quantize(const QuantArgs &a, dim3 grid, cudaStream_t st) {
    quantize_amax_kernel<K><<<grid, QUANT_THREADS, 0, st>>>(a);
    quantize_write_kernel<K><<<grid, QUANT_THREADS, 0, st>>>(a);
}

extern "C" fa3c_status fa3c_cuda_quantize_fp8(const fa3c_quantize_params *p, void *stream) {
    QuantArgs a = {};
    a.x = (const char *)p->x.data;
    a.out = (uint8_t *)p->out.data;
    a.descale = p->descale;
    a.signs = p->signs;
    for (int i = 0; i < 3; i++) a.x_stride[i] = p->x.stride[i], a.out_stride[i] = p->out.stride[i];
    a.batch = p->batch, a.seqlen = p->seqlen, a.heads = p->heads, a.headdim = p->headdim;
    a.group = p->group ? p->group : 1;
    a.blocks = p->heads / a.group;
    a.dtype = (int)p->dtype;
    a.hadamard = p->hadamard;
    a.vec = p->dtype != FA3C_DTYPE_FP32 && (uintptr_t)p->x.data % 16 == 0 && (uintptr_t)p->out.data % 16 == 0;
    for (int i = 0; i < 3; i++) a.vec = a.vec && p->x.stride[i] % 8 == 0 && p->out.stride[i] % 16 == 0;
    a.norm = (float)(1.0 / sqrt((double)p->headdim));
    a.block_rows = p->block_rows ? p->block_rows : p->seqlen;
    a.row_blocks = (p->seqlen + a.block_rows - 1) / a.block_rows;
    const int64_t blocks = (int64_t)p->batch * a.blocks, rows = (int64_t)a.group * p->seqlen;
    const int64_t chunks = (rows + QUANT_ROWS_PER_CTA - 1) / QUANT_ROWS_PER_CTA, descales = blocks * a.row_blocks;
    if (descales > INT32_MAX || chunks > 65535)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "quantize: %lld blocks of %lld rows are more than one launch takes",
                          (long long)descales, (long long)rows);
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = cudaMallocAsync((void **)&a.amax, (size_t)descales * 4, st);
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_OUT_OF_MEMORY, "quantize: %lld bytes of scratch: %s", (long long)descales * 4,
                          cudaGetErrorString(e));
    const dim3 grid((unsigned)blocks, (unsigned)chunks);
    cudaMemsetAsync(a.amax, 0, (size_t)descales * 4, st);
    // Values per lane: headdim / 32 with the rotation (a power of two <= 256), else
    // ceil(headdim / 32) (headdim <= 512) rounded up to a power of two.
    const int per = (p->headdim + 31) / 32;
    if (per <= 1) launch_quantize<1>(a, grid, st);
    else if (per <= 2) launch_quantize<2>(a, grid, st);
    else if (per <= 4) launch_quantize<4>(a, grid, st);
    else if (per <= 8) launch_quantize<8>(a, grid, st);
    else launch_quantize<16>(a, grid, st);
    e = cudaGetLastError();
    cudaFreeAsync(a.amax, st);
    if (e != cudaSuccess) return fa3c_error(FA3C_STATUS_CUDA_ERROR, "quantize kernels: %s", cudaGetErrorString(e));
    return FA3C_STATUS_OK;
}
