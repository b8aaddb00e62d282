// Throughput of the softmax's instructions on one SM (results per clock per
// SM), to check the model of the forward loop against the hardware
// (docs/KERNEL.md, "Where the time goes"; bench/RESULTS.md run 43):
// ex2.approx (MUFU), max, fma, add, the softmax's fma -> ex2 -> add step, and
// the f32 -> bf16x2 conversion of P (with an add to chain it), the packed
// 16-bit ex2 forms (one instruction, two values), 2^x as a cubic on the FMA
// pipe (exp2_poly), and a mix of 3 MUFU ex2 to 1 cubic (per value).
// One CTA of W warps, 8 independent chains per thread.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o gpu_pipes tools/experiments/pipes.cu && ./gpu_pipes
#include <cstdio>
#include <cuda_runtime.h>

enum { ITERS = 4096, ILP = 8, OPS = 10 };

// 2^x for x <= 0 without the MUFU: x = j + f, j the nearest integer (the
// 1.5 * 2^23 rounding trick), 2^f by a cubic on [-0.5, 0.5] (relative error
// 1.0e-4, fitted to the relative error), and j added to the exponent field.
__device__ __forceinline__ float exp2_poly(float x) {
    x = fmaxf(x, -127.f);
    float t = x + 12582912.f;
    float f = x - (t - 12582912.f);
    float p = fmaf(fmaf(fmaf(0.05500859f, f, 0.24221037f), f, 0.6932829f), f, 1.f);
    return __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));
}

template <int OP>
__global__ void pipe_kernel(float *out, long long *cycles, float seed) {
    float v[ILP];
    for (int i = 0; i < ILP; i++) v[i] = seed * (threadIdx.x + i);
    __syncthreads();
    long long t0 = clock64();
    for (int it = 0; it < ITERS; it++) {
#pragma unroll
        for (int i = 0; i < ILP; i++) {
            if (OP == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(v[i]));
            if (OP == 1) asm volatile("max.f32 %0, %0, %1;" : "+f"(v[i]) : "f"(v[(i + 1) % ILP]));
            if (OP == 2) asm volatile("fma.rn.f32 %0, %0, %1, %1;" : "+f"(v[i]) : "f"(seed));
            if (OP == 3) asm volatile("add.f32 %0, %0, %1;" : "+f"(v[i]) : "f"(seed));
            if (OP == 4) {   // one softmax element: scale and shift, ex2, add into the row sum
                float e;
                asm volatile("fma.rn.f32 %0, %1, %2, %2;" : "=f"(e) : "f"(v[i]), "f"(seed));
                asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(e));
                asm volatile("add.f32 %0, %0, %1;" : "+f"(v[i]) : "f"(e));
            }
            if (OP == 5) {   // two floats to a bf16 pair (F2FP), as P is packed for P·V
                unsigned r;
                asm volatile("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(v[i]));
                asm volatile("add.f32 %0, %0, %1;" : "+f"(v[i]) : "f"(__uint_as_float(r & 0x80000000u)));
            }
            if (OP == 6 || OP == 7) {   // one instruction, two 16-bit values
                unsigned u = __float_as_uint(v[i]) & 0xBBFFBBFFu;   // two negative halves
                if (OP == 6) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(u));
                else asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(u));
                v[i] = __uint_as_float(u);
            }
            if (OP == 8) v[i] = exp2_poly(-v[i]);
            if (OP == 9) {   // 3 of 4 on the MUFU, 1 on the FMA pipe
                if (i % 4 == 3) v[i] = exp2_poly(-v[i]);
                else asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(v[i]));
            }
        }
    }
    __syncthreads();
    long long t1 = clock64();
    float acc = 0;
    for (int i = 0; i < ILP; i++) acc += v[i];
    out[threadIdx.x] = acc;
    if (threadIdx.x == 0) *cycles = t1 - t0;
}

int main() {
    const char *names[OPS] = {"ex2.approx.f32 (MUFU)", "max.f32", "fma.f32", "add.f32", "fma+ex2+add (per ex2)",
                              "cvt.bf16x2+add (per cvt)", "ex2.approx.f16x2 (instr)", "ex2.approx.bf16x2 (instr)",
                              "ex2 as a cubic (FMA pipe)", "3 MUFU : 1 cubic (per ex2)"};
    void (*kernels[OPS])(float *, long long *, float) = {pipe_kernel<0>, pipe_kernel<1>, pipe_kernel<2>,
                                                         pipe_kernel<3>, pipe_kernel<4>, pipe_kernel<5>,
                                                         pipe_kernel<6>, pipe_kernel<7>, pipe_kernel<8>,
                                                         pipe_kernel<9>};
    float *out;
    long long *cyc, h;
    if (cudaMalloc(&out, 1024 * sizeof(float)) != cudaSuccess || cudaMalloc(&cyc, sizeof(long long)) != cudaSuccess) {
        printf("no GPU\n");
        return 1;
    }
    printf("%-24s %6s %14s\n", "instruction", "warps", "per clk per SM");
    for (int op = 0; op < OPS; op++)
        for (int warps = 1; warps <= 16; warps *= 2) {
            kernels[op]<<<1, 32 * warps>>>(out, cyc, 0.999f);   // warm-up
            kernels[op]<<<1, 32 * warps>>>(out, cyc, 0.999f);
            if (cudaDeviceSynchronize() != cudaSuccess) { printf("launch failed\n"); return 1; }
            cudaMemcpy(&h, cyc, sizeof h, cudaMemcpyDeviceToHost);
            printf("%-24s %6d %14.1f\n", names[op], warps, 32.0 * warps * ITERS * ILP / (double)h);
        }
    return 0;
}
