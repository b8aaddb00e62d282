// Throughput of the softmax's instructions on one SM (results per clock per
// SM), to check the model of the forward loop against the hardware
// (docs/KERNEL.md, "Where the time goes"; bench/RESULTS.md run 43):
// ex2.approx (MUFU), max, fma, add, the softmax's fma -> ex2 -> add step, and
// the f32 -> bf16x2 conversion of P (with an add to chain it).
// One CTA of W warps, 8 independent chains per thread.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o gpu_pipes tools/gpu_pipes.cu && ./gpu_pipes
#include <cstdio>
#include <cuda_runtime.h>

enum { ITERS = 4096, ILP = 8, OPS = 6 };

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
                              "cvt.bf16x2+add (per cvt)"};
    void (*kernels[OPS])(float *, long long *, float) = {pipe_kernel<0>, pipe_kernel<1>, pipe_kernel<2>,
                                                         pipe_kernel<3>, pipe_kernel<4>, pipe_kernel<5>};
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
