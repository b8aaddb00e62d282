// Cycles of the forward kernel's softmax step (src/cuda/common/softmax.cuh:
// softmax_step + probs_to_fragments) on one SM, to compare with the
// in-kernel time that tools/gpu.sh trace measures:
// (1) in isolation, W warps (4 = one consumer warpgroup, one warp per SM
//     sub-partition; 8 = two warpgroups at once). Each step's scores are a
//     fixed set plus a loop-carried term, so nothing can be hoisted; the
//     "copy only" row is that overhead (the add per score, the xor of the
//     fragments), to subtract;
// (2) one warpgroup's softmax while a second warpgroup keeps the tensor
//     cores busy with chained m64n128k16 wgmma (A from smem or from
//     registers, as Q·Kᵀ and P·V use them), and that GEMM's rate alone.
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -I src/cuda/common -I src/cuda/forward -o gpu_softmax tools/experiments/softmax.cu
#include <cstdio>
#include <cuda_runtime.h>
#include "softmax.cuh"
#include "wgmma.cuh"

enum { ITERS = 2048 };

// MODE 0: scores copied and fragments consumed only; 1: + softmax_step and
// probs_to_fragments (the in-kernel stretch between S ready and P ready).
template <int BLOCK_N, int MODE>
__global__ void softmax_kernel(const float *in, unsigned *out, long long *cycles, float score_log2) {
    float s0[BLOCK_N / 2];
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; i++) s0[i] = in[(threadIdx.x * 7 + i * 13) % 4096];
    SoftmaxState st;
    softmax_init(st);
    unsigned acc = 0;
    float feed = 0.f;
    __syncthreads();
    long long t0 = clock64();
    for (int it = 0; it < ITERS; it++) {
        float s[BLOCK_N / 2];
#pragma unroll
        for (int i = 0; i < BLOCK_N / 2; i++) s[i] = s0[i] + feed;
        float rescale[2] = {1.f, 1.f};
        if (MODE == 1) softmax_step<BLOCK_N>(s, st, score_log2, rescale);
        uint32_t frag[BLOCK_N / 16][4];
        probs_to_fragments<BLOCK_N, 0>(s, frag);
#pragma unroll
        for (int k = 0; k < BLOCK_N / 16; k++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc ^= frag[k][j];
        feed = MODE == 1 ? rescale[0] * 1e-30f : (float)(acc & 1) * 1e-30f;
    }
    __syncthreads();
    long long t1 = clock64();
    out[threadIdx.x] = acc + (unsigned)st.sum[0];
    if (threadIdx.x == 0) *cycles = t1 - t0;
}

// Warpgroup 0: ITERS softmax steps (BLOCK_N 128), timed around softmax_step
// alone; with OWN_PV it first issues its own P·V-like group (8 chained
// m64n128k16 wgmma into a 64-register O, A = the previous step's P from its
// registers, or from smem with OWN_PV 2) and waits for it after the softmax,
// as the kernel's loop does. Warpgroup 1 (GEMM != 0): GROUPS groups of 8
// chained m64n128k16 wgmma, A from smem (GEMM 1) or registers (GEMM 2), two
// groups in flight, to keep the tensor cores busy. Tiles are zeroed smem.
// cycles[0]: warpgroup 0's softmax_step cycles summed; cycles[1]: warpgroup
// 1's whole loop.
enum { GROUPS = 4096 };
template <int GEMM, int OWN_PV>
__global__ void __launch_bounds__(256, 1) overlap_kernel(const float *in, unsigned *out, long long *cycles) {
    __shared__ __align__(1024) uint8_t tiles[64 * 128 * 2 + 128 * 128 * 2];   // A 64 x 128, B 128 x 128
    for (int i = threadIdx.x; i < (int)sizeof(tiles) / 4; i += blockDim.x) ((uint32_t *)tiles)[i] = 0;
    __syncthreads();
    const uint64_t a_desc = smem_desc_swizzled(smem_addr(tiles), 16, 1024, 128);
    const uint64_t b_desc = smem_desc_swizzled(smem_addr(tiles + 64 * 128 * 2), 16, 1024, 128);
    if (threadIdx.x < 128) {
        float s0[64], o[64];
#pragma unroll
        for (int i = 0; i < 64; i++) s0[i] = in[(threadIdx.x * 7 + i * 13) % 4096], o[i] = 0.f;
        SoftmaxState st;
        softmax_init(st);
        uint32_t frag[8][4];
#pragma unroll
        for (int k = 0; k < 8; k++)
#pragma unroll
            for (int j = 0; j < 4; j++) frag[k][j] = 0;
        unsigned acc = 0;
        float feed = 0.f;
        long long softmax_cycles = 0;
        for (int it = 0; it < ITERS; it++) {
            float s[64];
#pragma unroll
            for (int i = 0; i < 64; i++) s[i] = s0[i] + feed;
            if (OWN_PV) {
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 8; kk++) {
                    uint32_t in_row = (kk % 4) * 32, chunk = kk / 4;
                    if (OWN_PV == 1)
                        wgmma_rsk<128, 0>(o, frag[kk], smem_desc_advance(b_desc, chunk * 128 * 128 + in_row), 1);
                    else
                        wgmma_ss<128, 0>(o, smem_desc_advance(a_desc, chunk * 64 * 128 + in_row),
                                         smem_desc_advance(b_desc, chunk * 128 * 128 + in_row), 1);
                }
                wgmma_commit();
            }
            float rescale[2];
            long long t0 = clock64();
            softmax_step<128>(s, st, 0.18f, rescale);
            softmax_cycles += clock64() - t0;
            if (OWN_PV) {
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < 64; i++) reg_fence(o[i]);
            }
            probs_to_fragments<128, 0>(s, frag);
#pragma unroll
            for (int k = 0; k < 8; k++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc ^= frag[k][j];
            feed = rescale[0] * 1e-30f;
        }
        out[threadIdx.x] = acc + (unsigned)st.sum[0] + (unsigned)o[threadIdx.x % 64];
        if (threadIdx.x == 0) cycles[0] = softmax_cycles;
    } else if (GEMM) {
        float d[64];
#pragma unroll
        for (int i = 0; i < 64; i++) d[i] = 0.f;
        uint32_t a[8][4];
#pragma unroll
        for (int k = 0; k < 8; k++)
#pragma unroll
            for (int j = 0; j < 4; j++) a[k][j] = 0;
        long long t0 = clock64();
        for (int g = 0; g < GROUPS; g++) {
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                uint32_t in_row = (kk % 4) * 32, chunk = kk / 4;
                if (GEMM == 1)
                    wgmma_ss<128, 0>(d, smem_desc_advance(a_desc, chunk * 64 * 128 + in_row),
                                     smem_desc_advance(b_desc, chunk * 128 * 128 + in_row), 1);
                else
                    wgmma_rsk<128, 0>(d, a[kk], smem_desc_advance(b_desc, chunk * 128 * 128 + in_row), 1);
            }
            wgmma_commit();
            wgmma_wait<1>();
        }
        wgmma_wait<0>();
        long long t1 = clock64();
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 64; i++) sum += d[i];
        out[threadIdx.x] = (unsigned)sum;
        if (threadIdx.x == 128) cycles[1] = t1 - t0;
    }
}

static void run_overlap(const float *in, unsigned *out, long long *cyc) {
    struct { void (*k)(const float *, unsigned *, long long *); const char *name; int gemm; } v[] = {
        {overlap_kernel<0, 0>, "softmax_step alone", 0},
        {overlap_kernel<0, 1>, "+ own P.V (A regs)", 0},
        {overlap_kernel<0, 2>, "+ own P.V (A smem)", 0},
        {overlap_kernel<2, 0>, "+ other's GEMM (A regs)", 1},
        {overlap_kernel<2, 1>, "+ own P.V (A regs) + other's GEMM (A regs)", 1},
        {overlap_kernel<1, 2>, "+ own P.V (A smem) + other's GEMM (A smem)", 1},
    };
    for (auto &x : v) {
        long long h[2] = {0, 0};
        cudaMemset(cyc, 0, 2 * sizeof(long long));
        x.k<<<1, 256>>>(in, out, cyc);
        x.k<<<1, 256>>>(in, out, cyc);
        if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess ||
            cudaMemcpy(h, cyc, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) {
            printf("%s: launch failed\n", x.name);
            return;
        }
        printf("%-44s softmax_step %5.0f cycles", x.name, (double)h[0] / ITERS);
        if (x.gemm) printf("  other's GEMM %5.0f FLOP/clk", 2.0 * 64 * 128 * 128 * GROUPS / (double)h[1]);
        printf("\n");
    }
}

template <int BLOCK_N>
static void run(const float *in, unsigned *out, long long *cyc) {
    void (*kernels[2])(const float *, unsigned *, long long *, float) = {softmax_kernel<BLOCK_N, 0>,
                                                                          softmax_kernel<BLOCK_N, 1>};
    const char *names[2] = {"copy only", "softmax step"};
    for (int mode = 0; mode < 2; mode++)
        for (int warps = 4; warps <= 12; warps += 4) {
            long long h = 0;
            kernels[mode]<<<1, 32 * warps>>>(in, out, cyc, 0.18f);
            kernels[mode]<<<1, 32 * warps>>>(in, out, cyc, 0.18f);
            if (cudaDeviceSynchronize() != cudaSuccess) { printf("launch failed\n"); return; }
            cudaMemcpy(&h, cyc, sizeof h, cudaMemcpyDeviceToHost);
            printf("BLOCK_N %3d %-14s %3d warps: %6.0f cycles per step\n", BLOCK_N, names[mode], warps,
                   (double)h / ITERS);
        }
}

int main() {
    float host[4096];
    unsigned seed = 12345;
    for (int i = 0; i < 4096; i++) {   // scores of about N(0, 8): a sum of uniforms
        float x = 0;
        for (int k = 0; k < 4; k++) {
            seed = seed * 1664525u + 1013904223u;
            x += (seed >> 8) * (1.f / 16777216.f) - 0.5f;
        }
        host[i] = x * 14.f;
    }
    float *in;
    unsigned *out;
    long long *cyc;
    if (cudaMalloc(&in, sizeof host) != cudaSuccess || cudaMalloc(&out, 1024 * sizeof(unsigned)) != cudaSuccess ||
        cudaMalloc(&cyc, 2 * sizeof(long long)) != cudaSuccess) {
        printf("no GPU\n");
        return 1;
    }
    cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice);
    run<128>(in, out, cyc);
    run<80>(in, out, cyc);
    run_overlap(in, out, cyc);
    return 0;
}
