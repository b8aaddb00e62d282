// Helpers for the GPU step tests: CUDA error checks, the skip rule, and the
// 128-byte swizzle model that the tests compare the hardware against.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include "harness.h"
#include "testutil.h"

// Check a CUDA call; on failure record it and leave the test case.
#define CUDA_OK(call)                                                                  \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            CHECK(e_ == cudaSuccess, "%s -> %s", #call, cudaGetErrorString(e_));       \
            return;                                                                    \
        }                                                                              \
    } while (0)

// 1 when an sm_90 GPU is usable; else a reason in `why`.
static int gpu_sm90_present(char *why, size_t n) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(why, n, "no CUDA GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    if (prop.major != 9) {
        snprintf(why, n, "GPU 0 is %s (sm_%d%d), not sm_90", prop.name, prop.major, prop.minor);
        return 0;
    }
    return 1;
}

#define REQUIRE_SM90()                                                                 \
    do {                                                                               \
        char why_[256];                                                                \
        if (!gpu_sm90_present(why_, sizeof why_)) SKIP("GPU test needs an sm_90 GPU: %s", why_); \
    } while (0)

// A pointer into dynamic smem rounded up to 1 KB, the 128-byte swizzle's
// period (launches ask for 1 KB more than they use).
static __device__ __forceinline__ uint8_t *align_1024(uint8_t *p) {
    return (uint8_t *)(((uintptr_t)p + 1023) & ~(uintptr_t)1023);
}

// Byte offset of element (row, col) of a 16-bit tile of `rows` rows stored as
// column chunks of 64 elements (128 B rows), each chunk `rows` x 128 B with
// the 128-byte swizzle: 16-byte unit u of row r lands at u ^ (r % 8).
static __host__ __device__ inline size_t sw128_offset(int rows, int row, int col) {
    int chunk = col / 64, unit = (col % 64) / 8, elem = col % 8;
    return (size_t)chunk * rows * 128 + (size_t)row * 128 + (size_t)((unit ^ (row & 7)) * 16) + elem * 2;
}

static uint64_t gpu_rng_state = 0x9E3779B97F4A7C15ull;
static void gpu_rng_seed(uint64_t s) { gpu_rng_state = s ? s : 1; }
static float gpu_randn(void) {
    // xorshift64* then Box-Muller: cheap, reproducible from the printed seed.
    double u[2];
    for (int i = 0; i < 2; i++) {
        gpu_rng_state ^= gpu_rng_state >> 12;
        gpu_rng_state ^= gpu_rng_state << 25;
        gpu_rng_state ^= gpu_rng_state >> 27;
        u[i] = ((gpu_rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
    }
    return (float)(sqrt(-2.0 * log(u[0] + 1e-300)) * cos(6.283185307179586 * u[1]));
}

// Random N(0, 1) q, k, v in dt for the GPU suites, with data pointers and
// strides set in q, k, v: three contiguous (b, s, h, d) tensors, or with
// `packed` one (b, s, 3, h, d) buffer (needs hq == hkv and sq == sk) that
// the three view with strides (packed QKV). The host buffers go to bufs
// (bufs[1], bufs[2] NULL when packed): free them with free().
static void random_qkv(fa3c_tensor *q, fa3c_tensor *k, fa3c_tensor *v, void *bufs[3], fa3c_dtype dt, int packed,
                       int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d) {
    const size_t es = tu_dtype_size(dt);
    const int64_t nq = b * sq * hq * d, nk = b * sk * hk * d;
    if (packed) {
        bufs[0] = tu_alloc(3 * nq * es);
        bufs[1] = bufs[2] = NULL;
        tu_fill_normal(bufs[0], dt, 3 * nq, 1.f);
        for (int i = 0; i < 3; i++) {
            fa3c_tensor *t = i == 0 ? q : i == 1 ? k : v;
            t->data = (char *)bufs[0] + i * hq * d * es;
            t->stride[0] = sq * 3 * hq * d;
            t->stride[1] = 3 * hq * d;
            t->stride[2] = d;
            t->stride[3] = 1;
        }
        return;
    }
    const int64_t n[3] = {nq, nk, nk};
    for (int i = 0; i < 3; i++) bufs[i] = tu_alloc(n[i] * es);
    for (int i = 0; i < 3; i++) tu_fill_normal(bufs[i], dt, n[i], 1.f);
    *q = tu_tensor(bufs[0], b, sq, hq, d);
    *k = tu_tensor(bufs[1], b, sk, hk, d);
    *v = tu_tensor(bufs[2], b, sk, hk, d);
}
