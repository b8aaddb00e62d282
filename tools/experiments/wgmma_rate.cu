// wgmma throughput on every SM by operand source and N (results in FMA per
// clock per SM and TFLOPS), to check the backward's budget (docs/BACKWARD.md,
// "The cycle budget"): does an m64n64k16 with both operands in smem run at the
// tensor cores' rate, or at what shared memory can feed it (A 2 KB + B 2 KB
// per 32 tensor clocks at 2048 FMA/clk)? One CTA per SM, W consumer
// warpgroups issuing back-to-back wgmmas over a K of 64 (4 k-steps of 16)
// into one accumulator, 16 per commit group.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -Isrc/cuda/common -o gpu_wgmma_rate tools/experiments/wgmma_rate.cu
//   ./gpu_wgmma_rate
#include <cstdio>
#include <cuda_runtime.h>
#include "ptx.cuh"
#include "wgmma.cuh"

enum { ITERS = 2048, KSTEPS = 4 };
enum Src { SS = 0, RS = 1, SS_MN = 2 };

template <int N, int SRC>
FA3C_DEVICE void issue(float *acc, uint32_t a_base, uint32_t b_base, const uint32_t (*a_frag)[4]) {
#pragma unroll
    for (int rep = 0; rep < 4; rep++)
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            if constexpr (SRC == SS) {
                const uint64_t da = smem_desc_swizzled(a_base + kk * 32, 16, 1024, 128);
                const uint64_t db = smem_desc_swizzled(b_base + kk * 32, 16, 1024, 128);
                wgmma_ss<N, 0>(acc, da, db, 1);
            } else if constexpr (SRC == RS) {
                const uint64_t db = smem_desc_swizzled(b_base + kk * 32, 16, 1024, 128);
                wgmma_rsk<N, 0>(acc, a_frag[kk], db, 1);
            } else {   // both MN-major: a k-step is 16 rows of 128 bytes
                const uint64_t da = smem_desc_swizzled(a_base + kk * 16 * 128, 64 * 128, 1024, 128);
                const uint64_t db = smem_desc_swizzled(b_base + kk * 16 * 128, 64 * 128, 1024, 128);
                wgmma_ss_mn<N, 0>(acc, da, db, 1);
            }
        }
}

template <int N, int SRC>
__global__ void __launch_bounds__(384, 1) rate_kernel(float *out, long long *cycles, int warpgroups) {
    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t *base = (uint8_t *)(((uintptr_t)smem + 1023) & ~(uintptr_t)1023);
    for (int i = threadIdx.x; i < (64 + 256) * 128 / 4; i += blockDim.x)
        ((uint32_t *)base)[i] = 0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu);   // small bf16 values
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg >= warpgroups) return;
    const uint32_t a_base = smem_addr(base), b_base = smem_addr(base + 64 * 128);
    uint32_t a_frag[KSTEPS][4];
    for (int k = 0; k < KSTEPS; k++)
        for (int j = 0; j < 4; j++) a_frag[k][j] = 0x3c003c00u + threadIdx.x + k * 4 + j;
    float acc[N / 2];
    for (int i = 0; i < N / 2; i++) acc[i] = 0.f;
    long long t0 = clock64();
    for (int it = 0; it < ITERS; it++) {
        wgmma_fence();
        issue<N, SRC>(acc, a_base, b_base, a_frag);
        wgmma_commit();
        wgmma_wait<0>();
    }
    long long t1 = clock64();
    float s = 0.f;
    for (int i = 0; i < N / 2; i++) s += acc[i];
    if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 3 + wg] = t1 - t0;
    if (s == 1234.5f) out[threadIdx.x] = s;
}

template <int N, int SRC>
static void run(const char *name, int sms, float *out, long long *cycles, long long *h_cycles) {
    const int smem = (64 + 256) * 128 + 1024;
    cudaFuncSetAttribute(rate_kernel<N, SRC>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    for (int w = 1; w <= 3; w++) {
        rate_kernel<N, SRC><<<sms, 384, smem>>>(out, cycles, w);   // warm-up
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        cudaEventRecord(e0);
        rate_kernel<N, SRC><<<sms, 384, smem>>>(out, cycles, w);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        cudaMemcpy(h_cycles, cycles, sms * 3 * sizeof(long long), cudaMemcpyDeviceToHost);
        long long cyc = 0;
        for (int b = 0; b < sms; b++)
            for (int g = 0; g < w; g++) cyc = h_cycles[b * 3 + g] > cyc ? h_cycles[b * 3 + g] : cyc;
        const double fma_per_sm = (double)w * ITERS * 4 * KSTEPS * 64.0 * N * 16;
        printf("%-6s N=%3d warpgroups %d: %7.0f FMA/clk/SM  %6.0f TFLOPS  smem operand bytes/clk %5.1f\n", name, N, w,
               fma_per_sm / cyc, 2 * fma_per_sm * sms / (ms * 1e-3) / 1e12,
               (double)w * ITERS * 4 * KSTEPS * ((SRC == RS ? 0 : 64 * 32) + N * 32) / cyc);
    }
}

int main() {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const int sms = prop.multiProcessorCount;
    printf("%s, %d SMs\n", prop.name, sms);
    float *out;
    long long *cycles, h_cycles[3 * 256];
    cudaMalloc(&out, 4096), cudaMalloc(&cycles, sms * 3 * sizeof(long long));
    run<64, SS>("ss", sms, out, cycles, h_cycles);
    run<64, RS>("rs", sms, out, cycles, h_cycles);
    run<64, SS_MN>("ss_mn", sms, out, cycles, h_cycles);
    run<80, SS>("ss", sms, out, cycles, h_cycles);
    run<80, RS>("rs", sms, out, cycles, h_cycles);
    run<128, SS>("ss", sms, out, cycles, h_cycles);
    run<128, RS>("rs", sms, out, cycles, h_cycles);
    run<256, SS>("ss", sms, out, cycles, h_cycles);
    const cudaError_t err = cudaDeviceSynchronize();
    printf("%s\n", cudaGetErrorString(err));
    return err != cudaSuccess;
}
