/* fa3c forward on the GPU over the FA3 paper's grid, timed with CUDA events
 * (median of repeats after warm-up, random inputs). No torch needed: this is
 * the quick number; bench/bench.py measures the peers in the same process.
 *
 *   bench_fwd_gpu [--quick] [--hdim D]... [--csv FILE]
 * Head dims 64, 128, 256 by default; --hdim (repeatable) picks others (96, 192 too).
 * Grid: total tokens 16384 (batch = 16384 / seqlen), heads = 2048 / hdim. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa3c.h"

#define CUDA_TRY(x)                                                                            \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Random bf16 bits of N(0,1)-ish values (sum of uniforms), filled on the host once. */
static void fill_random_bf16(uint16_t *h, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        float acc = 0;
        for (int j = 0; j < 4; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            acc += (float)((s >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
        }
        float f = acc * 1.7320508f;
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    }
}

int main(int argc, char **argv) {
    int quick = 0, picked[5] = {0}, npicked = 0;
    const char *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--hdim") && i + 1 < argc && npicked < 5) picked[npicked++] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--hdim D]... [--csv FILE]\n", argv[0]);
            return 2;
        }
    }
    if (!fa3c_cuda_available()) {
        printf("SKIPPED: no usable sm_90 GPU (fa3c_cuda_available() == 0)\n");
        return 0;
    }
    FILE *out = csv ? fopen(csv, "w") : NULL;
    if (out) fprintf(out, "hdim,causal,seqlen,batch,heads,ms,tflops\n");
    const int hdims[] = {64, 96, 128, 192, 256};
    const int seqlens_full[] = {512, 1024, 2048, 4096, 8192, 16384};
    const int seqlens_quick[] = {512, 2048, 8192};
    const int *seqlens = quick ? seqlens_quick : seqlens_full;
    int nseq = quick ? 3 : 6;
    const size_t total = 16384ull * 2048;   /* tokens x hidden: the same for every shape */
    void *q, *k, *v, *o;
    float *lse;
    CUDA_TRY(cudaMalloc(&q, total * 2));
    CUDA_TRY(cudaMalloc(&k, total * 2));
    CUDA_TRY(cudaMalloc(&v, total * 2));
    CUDA_TRY(cudaMalloc(&o, total * 2));
    CUDA_TRY(cudaMalloc((void **)&lse, 16384ull * 64 * 4));
    uint16_t *h = (uint16_t *)malloc(total * 2);
    for (int i = 0; i < 3; i++) {
        fill_random_bf16(h, total, 1234 + i);
        CUDA_TRY(cudaMemcpy(i == 0 ? q : i == 1 ? k : v, h, total * 2, cudaMemcpyHostToDevice));
    }
    free(h);
    cudaEvent_t e0, e1;
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    printf("%-5s %-6s %-6s %-5s %-5s %9s %8s\n", "hdim", "causal", "seqlen", "batch", "heads", "ms", "TFLOPS");
    for (int hi = 0; hi < 5; hi++) {
        int d = hdims[hi], wanted = npicked == 0 && d % 64 == 0 && d != 192;
        for (int j = 0; j < npicked; j++) wanted |= picked[j] == d;
        if (!wanted) continue;
        for (int causal = 0; causal < 2; causal++)
            for (int si = 0; si < nseq; si++) {
                int s = seqlens[si], b = 16384 / s, heads = 2048 / d;
                fa3c_fwd_params p;
                fa3c_fwd_params_init(&p);
                p.problem.dtype = FA3C_DTYPE_BF16;
                p.problem.batch = b;
                p.problem.seqlen_q = p.problem.seqlen_k = s;
                p.problem.heads_q = p.problem.heads_kv = heads;
                p.problem.headdim = d;
                p.problem.causal = causal;
                void *bufs[4] = {q, k, v, o};
                fa3c_tensor *ts[4] = {&p.q, &p.k, &p.v, &p.out};
                for (int t = 0; t < 4; t++) {
                    ts[t]->data = bufs[t];
                    ts[t]->stride[3] = 1;
                    ts[t]->stride[2] = d;
                    ts[t]->stride[1] = (int64_t)heads * d;
                    ts[t]->stride[0] = (int64_t)s * heads * d;
                }
                p.lse = lse;
                p.backend = FA3C_BACKEND_CUDA;
                fa3c_status st = fa3c_fwd(&p, NULL);
                if (st != FA3C_STATUS_OK) {
                    printf("%-5d %-6d %-6d %-5d %-5d  %s\n", d, causal, s, b, heads, fa3c_last_error());
                    continue;
                }
                CUDA_TRY(cudaDeviceSynchronize());
                /* warm-up ~ 50 ms, then 30 timed runs of enough calls for >= 1 ms each */
                for (int w = 0; w < 10; w++) fa3c_fwd(&p, NULL);
                CUDA_TRY(cudaEventRecord(e0, 0));
                fa3c_fwd(&p, NULL);
                CUDA_TRY(cudaEventRecord(e1, 0));
                CUDA_TRY(cudaEventSynchronize(e1));
                float one;
                CUDA_TRY(cudaEventElapsedTime(&one, e0, e1));
                /* >= 5 calls per timing, so the host cost of a call hides behind the previous kernel */
                int inner = one > 1.f ? 5 : (int)(5.f / (one + 1e-3f)) + 5;
                float times[30];
                for (int r = 0; r < 30; r++) {
                    CUDA_TRY(cudaEventRecord(e0, 0));
                    for (int i = 0; i < inner; i++) fa3c_fwd(&p, NULL);
                    CUDA_TRY(cudaEventRecord(e1, 0));
                    CUDA_TRY(cudaEventSynchronize(e1));
                    CUDA_TRY(cudaEventElapsedTime(&times[r], e0, e1));
                    times[r] /= inner;
                }
                CUDA_TRY(cudaGetLastError());
                qsort(times, 30, sizeof(float), cmp_float);
                double ms = times[15];
                double flops = 4.0 * b * heads * (double)s * s * d / (causal ? 2 : 1);
                double tflops = flops / (ms * 1e-3) / 1e12;
                printf("%-5d %-6d %-6d %-5d %-5d %9.4f %8.1f\n", d, causal, s, b, heads, ms, tflops);
                if (out) fprintf(out, "%d,%d,%d,%d,%d,%.5f,%.1f\n", d, causal, s, b, heads, ms, tflops);
            }
    }
    if (out) fclose(out);
    return 0;
}
