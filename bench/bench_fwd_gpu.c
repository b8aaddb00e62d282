/* fa3c forward on the GPU over the FA3 paper's grid, timed with CUDA events
 * (median of repeats after warm-up, random inputs). No torch needed: this is
 * the quick number; bench/bench.py measures the peers in the same process.
 *
 *   bench_fwd_gpu [--quick] [--hdim D]... [--seqlen S]... [--decode [--page-size P]...] [--seqused] [--causal C] [--csv FILE]
 * Head dims 64, 128, 256 by default; --hdim (repeatable) picks others (96, 192 too);
 * --seqlen (repeatable) replaces the grid's sequence lengths (batch = 16384 / S, rounded down).
 * Grid: total tokens 16384 (batch = 16384 / seqlen), heads = 2048 / hdim.
 * --decode: bench.py's six decode shapes instead (seqlen_q 1, split-KV on auto); the
 * seqlen column is seqlen_k, and the last column is GB/s of q, k, v and out, not TFLOPS.
 * --seqused: every call passes seqused_k = seqlen_k for each sequence (the same work), so that
 * the variable-length kernels (built with FA3C_CUDA_VARLEN=ON) run: their cost against a run
 * without it.
 * --page-size P (with --decode; up to 4, 0 = contiguous): the same K and V read as a paged cache
 * of P-key pages in a shuffled page table (seqused_k = seqlen_k; the variable-length kernels):
 * the cost of pages, small ones (1, 16) in particular, against the contiguous cache. The CSV's
 * last column, page, is the page size (0: none).
 * --backward: fa3c_bwd instead, on the same grid (bf16; TFLOPS count 2.5x the forward's FLOPs,
 * as PEERS.md does); needs a build whose CUDA backward is on (-DFA3C_CUDA_BWD=ON).
 * --fp8: the e4m3 forward instead (hdim 128 and 256, non-causal and causal; descales 1); needs
 * -DFA3C_CUDA_FP8=ON. Both say what the build refused, shape by shape, when it is off.
 * --causal C (0 or 1): only that mask (a profiler's first launch is then the shape wanted).
 * --headdim-v DV: v's (and out's, dout's, dv's) head dim of its own, e.g. --hdim 192 --headdim-v 128
 * for MLA prefill (TFLOPS count q·k over the head dim and P·V over DV). */
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

/* One call of the timed kind: the forward (fa3c_fwd_params) or the backward (fa3c_bwd_params). */
typedef struct {
    const fa3c_fwd_params *fwd;
    const fa3c_bwd_params *bwd;
} timed_call;
static void call_once(timed_call c) {
    if (c.bwd) fa3c_bwd(c.bwd, NULL);
    else fa3c_fwd(c.fwd, NULL);
}

/* Median time of one call in ms: warm-up, then 30 timings of enough calls
 * for >= 5 ms each, so the host cost of a call hides behind the previous kernel. */
static double time_any(timed_call c, cudaEvent_t e0, cudaEvent_t e1) {
    CUDA_TRY(cudaDeviceSynchronize());
    for (int w = 0; w < 10; w++) call_once(c);
    CUDA_TRY(cudaEventRecord(e0, 0));
    call_once(c);
    CUDA_TRY(cudaEventRecord(e1, 0));
    CUDA_TRY(cudaEventSynchronize(e1));
    float one;
    CUDA_TRY(cudaEventElapsedTime(&one, e0, e1));
    int inner = one > 1.f ? 5 : (int)(5.f / (one + 1e-3f)) + 5;
    float times[30];
    for (int r = 0; r < 30; r++) {
        CUDA_TRY(cudaEventRecord(e0, 0));
        for (int i = 0; i < inner; i++) call_once(c);
        CUDA_TRY(cudaEventRecord(e1, 0));
        CUDA_TRY(cudaEventSynchronize(e1));
        CUDA_TRY(cudaEventElapsedTime(&times[r], e0, e1));
        times[r] /= inner;
    }
    CUDA_TRY(cudaGetLastError());
    qsort(times, 30, sizeof(float), cmp_float);
    return times[15];
}

static double time_call(const fa3c_fwd_params *p, cudaEvent_t e0, cudaEvent_t e1) {
    timed_call c = {p, NULL};
    return time_any(c, e0, e1);
}

/* --seqused: seqused_k = seqlen_k for each of `batch` sequences, in device
 * memory (room for the largest batch, 16384 sequences of one token). */
enum { MAX_BATCH = 16384 };
static int32_t *used_keys;
static void set_seqused(fa3c_fwd_params *p) {
    if (!used_keys) return;
    static int32_t host[MAX_BATCH];
    for (int b = 0; b < p->problem.batch && b < MAX_BATCH; b++) host[b] = p->problem.seqlen_k;
    CUDA_TRY(cudaMemcpy(used_keys, host, sizeof host, cudaMemcpyHostToDevice));
    p->problem.seqused_k = used_keys;
}

/* Dense (batch, seq, heads, D) strides of one tensor. */
static void set_dense(fa3c_tensor *t, void *data, int seq, int heads, int d) {
    t->data = data;
    t->stride[3] = 1;
    t->stride[2] = d;
    t->stride[1] = (int64_t)heads * d;
    t->stride[0] = (int64_t)seq * heads * d;
}

/* Random bf16 over a device buffer: one host chunk of up to 64 M elements
 * (the whole grid buffer), copied as often as the buffer needs (random data:
 * constant data would draw less power). */
static void fill_device_random(void *dst, size_t bytes, uint64_t seed) {
    size_t chunk = bytes < ((size_t)2 << 26) ? bytes : (size_t)2 << 26;   /* bytes */
    uint16_t *h = (uint16_t *)malloc(chunk);
    fill_random_bf16(h, chunk / 2, seed);
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        CUDA_TRY(cudaMemcpy((char *)dst + off, h, n, cudaMemcpyHostToDevice));
    }
    free(h);
}

/* --page-size: K and V of `batch` sequences of seqlen_k keys as pages of
 * page_size keys (the dense buffer cut into pages), listed in a shuffled
 * page table in device memory; NULL on a size that does not divide. */
static int32_t *paged_table(fa3c_fwd_params *p, void *k, void *v, int page_size) {
    const int b = p->problem.batch, sk = p->problem.seqlen_k, hkv = p->problem.heads_kv, d = p->problem.headdim;
    if (sk % page_size != 0) return NULL;
    const int per_seq = sk / page_size, pages = b * per_seq;
    int32_t *h = (int32_t *)malloc((size_t)pages * sizeof(int32_t)), *dt = NULL;
    for (int i = 0; i < pages; i++) h[i] = i;
    uint64_t s = 99;
    for (int i = pages - 1; i > 0; i--) {   /* Fisher-Yates: pages scattered over the cache */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((s >> 33) % (uint64_t)(i + 1)), t = h[i];
        h[i] = h[j];
        h[j] = t;
    }
    CUDA_TRY(cudaMalloc((void **)&dt, (size_t)pages * sizeof(int32_t)));
    CUDA_TRY(cudaMemcpy(dt, h, (size_t)pages * sizeof(int32_t), cudaMemcpyHostToDevice));
    free(h);
    set_dense(&p->k, k, page_size, hkv, d);   /* (pages, page_size, heads_kv, d) */
    set_dense(&p->v, v, page_size, hkv, d);
    p->problem.page_table = dt;
    p->problem.page_table_stride = per_seq;
    p->problem.page_size = page_size;
    p->problem.num_pages = pages;
    return dt;
}

/* bench.py's decode shapes: one query per sequence, GQA, long key sequences. */
static void bench_decode(FILE *out, cudaEvent_t e0, cudaEvent_t e1, int page_size) {
    static const int shapes[][5] = {/* hdim, batch, seqlen_k, heads_q, heads_kv */
                                    {64, 16, 16384, 16, 2},  {128, 32, 4096, 32, 32},  {128, 8, 8192, 32, 8},
                                    {128, 8, 32768, 32, 8},  {128, 1, 131072, 64, 8}, {256, 4, 16384, 32, 4}};
    for (int i = 0; i < 6; i++) {
        int d = shapes[i][0], b = shapes[i][1], sk = shapes[i][2], hq = shapes[i][3], hkv = shapes[i][4];
        size_t q_bytes = (size_t)b * hq * d * 2, kv_bytes = (size_t)b * sk * hkv * d * 2;
        void *q, *k, *v, *o;
        float *lse;
        CUDA_TRY(cudaMalloc(&q, q_bytes));
        CUDA_TRY(cudaMalloc(&k, kv_bytes));
        CUDA_TRY(cudaMalloc(&v, kv_bytes));
        CUDA_TRY(cudaMalloc(&o, q_bytes));
        CUDA_TRY(cudaMalloc((void **)&lse, (size_t)b * hq * 4));
        fill_device_random(q, q_bytes, 1);
        fill_device_random(k, kv_bytes, 2);
        fill_device_random(v, kv_bytes, 3);
        fa3c_fwd_params p;
        fa3c_fwd_params_init(&p);
        p.problem.dtype = FA3C_DTYPE_BF16;
        p.problem.batch = b;
        p.problem.seqlen_q = 1;
        p.problem.seqlen_k = sk;
        p.problem.heads_q = hq;
        p.problem.heads_kv = hkv;
        p.problem.headdim = d;
        set_dense(&p.q, q, 1, hq, d);
        set_dense(&p.k, k, sk, hkv, d);
        set_dense(&p.v, v, sk, hkv, d);
        set_dense(&p.out, o, 1, hq, d);
        p.lse = lse;
        p.backend = FA3C_BACKEND_CUDA;
        set_seqused(&p);
        int32_t *table = page_size ? paged_table(&p, k, v, page_size) : NULL;
        fa3c_status st = page_size && !table ? FA3C_STATUS_INVALID_ARGUMENT : fa3c_fwd(&p, NULL);
        if (st != FA3C_STATUS_OK) {
            printf("%-5d %-6d %-6d %-5d %-5d  %s\n", d, 0, sk, b, hq,
                   table || !page_size ? fa3c_last_error() : "page size does not divide seqlen_k");
        } else {
            double ms = time_call(&p, e0, e1);
            double gbs = (2.0 * q_bytes + 2.0 * kv_bytes) / (ms * 1e-3) / 1e9;
            printf("%-5d %-6d %-6d %-5d %-5d %9.4f %8.1f\n", d, 0, sk, b, hq, ms, gbs);
            if (out) fprintf(out, "%d,%d,%d,%d,%d,%.5f,%.1f,%d\n", d, 0, sk, b, hq, ms, gbs, page_size);
        }
        cudaFree(q);
        cudaFree(k);
        cudaFree(v);
        cudaFree(o);
        cudaFree(lse);
        if (table) cudaFree(table);
    }
}

int main(int argc, char **argv) {
    int quick = 0, decode = 0, seqused = 0, page_sizes[4] = {0}, npages = 0, picked[5] = {0}, npicked = 0;
    int backward = 0, fp8 = 0, only_causal = -1, headdim_v = 0;
    int own_seqlens[8] = {0}, nown = 0;
    const char *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--hdim") && i + 1 < argc && npicked < 5) picked[npicked++] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seqlen") && i + 1 < argc && nown < 8 && atoi(argv[i + 1]) >= 1 &&
                 atoi(argv[i + 1]) <= 16384)
            own_seqlens[nown++] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode")) decode = 1;
        else if (!strcmp(argv[i], "--seqused")) seqused = 1;
        else if (!strcmp(argv[i], "--page-size") && i + 1 < argc && atoi(argv[i + 1]) >= 0 && npages < 4)
            page_sizes[npages++] = atoi(argv[++i]), seqused = 1;
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
        else if (!strcmp(argv[i], "--backward")) backward = 1;
        else if (!strcmp(argv[i], "--fp8")) fp8 = 1;
        else if (!strcmp(argv[i], "--causal") && i + 1 < argc && (!strcmp(argv[i + 1], "0") || !strcmp(argv[i + 1], "1")))
            only_causal = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--headdim-v") && i + 1 < argc && atoi(argv[i + 1]) >= 8 && atoi(argv[i + 1]) <= 256)
            headdim_v = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--quick] [--hdim D]... [--seqlen S (1..16384)]... [--decode [--page-size P]...] [--seqused] "
                    "[--backward | --fp8] [--causal 0|1] [--headdim-v DV] [--csv FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    if (npages && !decode) {
        fprintf(stderr, "--page-size goes with --decode\n");
        return 2;
    }
    if ((backward || fp8) && (decode || seqused || (backward && fp8))) {
        fprintf(stderr, "--backward and --fp8 go alone (not with each other, --decode or --seqused)\n");
        return 2;
    }
    if (!fa3c_cuda_available()) {
        printf("SKIPPED: no usable sm_90 GPU (fa3c_cuda_available() == 0)\n");
        return 0;
    }
    FILE *out = csv ? fopen(csv, "w") : NULL;
    if (out) fprintf(out, "hdim,causal,seqlen,batch,heads,ms,tflops%s\n", decode ? ",page" : "");
    if (seqused) CUDA_TRY(cudaMalloc((void **)&used_keys, MAX_BATCH * sizeof(int32_t)));
    cudaEvent_t e0, e1;
    CUDA_TRY(cudaEventCreate(&e0));
    CUDA_TRY(cudaEventCreate(&e1));
    if (decode) {
        for (int i = 0; i < (npages ? npages : 1); i++) {
            if (page_sizes[i]) printf("%spaged KV cache: pages of %d keys, shuffled\n", i ? "\n" : "", page_sizes[i]);
            else if (npages > 1) printf("%scontiguous KV cache\n", i ? "\n" : "");
            printf("%-5s %-6s %-6s %-5s %-5s %9s %8s\n", "hdim", "causal", "seqlen", "batch", "heads", "ms", "GB/s");
            bench_decode(out, e0, e1, page_sizes[i]);
        }
        if (out) fclose(out);
        return 0;
    }
    const int hdims[] = {64, 96, 128, 192, 256};
    const int seqlens_full[] = {512, 1024, 2048, 4096, 8192, 16384};
    const int seqlens_quick[] = {512, 2048, 8192};
    const int *seqlens = nown ? own_seqlens : quick ? seqlens_quick : seqlens_full;
    int nseq = nown ? nown : quick ? 3 : 6;
    const size_t total = 16384ull * 2048;   /* tokens x hidden: the same for every shape */
    void *q, *k, *v, *o;
    float *lse;
    CUDA_TRY(cudaMalloc(&q, total * 2));
    CUDA_TRY(cudaMalloc(&k, total * 2));
    CUDA_TRY(cudaMalloc(&v, total * 2));
    CUDA_TRY(cudaMalloc(&o, total * 2));
    CUDA_TRY(cudaMalloc((void **)&lse, 16384ull * 64 * 4));
    fill_device_random(q, total * 2, 1234);
    fill_device_random(k, total * 2, 1235);
    fill_device_random(v, total * 2, 1236);
    void *dout = NULL, *dq = NULL, *dk = NULL, *dvp = NULL, *q8 = NULL, *k8 = NULL, *v8 = NULL;
    if (backward) {   /* dout random; out and lse from a forward per shape */
        CUDA_TRY(cudaMalloc(&dout, total * 2));
        CUDA_TRY(cudaMalloc(&dq, total * 2));
        CUDA_TRY(cudaMalloc(&dk, total * 2));
        CUDA_TRY(cudaMalloc(&dvp, total * 2));
        fill_device_random(dout, total * 2, 1237);
    }
    if (fp8) {   /* e4m3 copies of q, k, v: the bf16 values rounded (random bytes could be NaN) */
        void **dst[3] = {&q8, &k8, &v8};
        const uint64_t seeds[3] = {1234, 1235, 1236};
        size_t chunk = total < ((size_t)1 << 26) ? total : (size_t)1 << 26;
        uint16_t *h16 = (uint16_t *)malloc(chunk * 2);
        uint8_t *h8 = (uint8_t *)malloc(chunk);
        for (int t = 0; t < 3; t++) {
            CUDA_TRY(cudaMalloc(dst[t], total));
            fill_random_bf16(h16, chunk, seeds[t]);
            for (size_t i = 0; i < chunk; i++) {
                uint32_t u = (uint32_t)h16[i] << 16;
                float f;
                memcpy(&f, &u, 4);
                h8[i] = fa3c_float_to_e4m3(f);
            }
            for (size_t off = 0; off < total; off += chunk)
                CUDA_TRY(cudaMemcpy((char *)*dst[t] + off, h8, total - off < chunk ? total - off : chunk,
                                    cudaMemcpyHostToDevice));
        }
        free(h16);
        free(h8);
    }
    printf("%-5s %-6s %-6s %-5s %-5s %9s %8s\n", "hdim", "causal", "seqlen", "batch", "heads", "ms", "TFLOPS");
    for (int hi = 0; hi < 5; hi++) {
        int d = hdims[hi], wanted = npicked == 0 && d % 64 == 0 && d != 192 && (!fp8 || d >= 128);
        if (headdim_v > d) continue;   /* the buffers hold 2048 columns of the head dim's heads */
        for (int j = 0; j < npicked; j++) wanted |= picked[j] == d;
        if (!wanted) continue;
        for (int causal = 0; causal < 2; causal++)
            for (int si = 0; si < nseq && (only_causal < 0 || only_causal == causal); si++) {
                int s = seqlens[si], b = 16384 / s, heads = 2048 / d, dv = headdim_v ? headdim_v : d;
                fa3c_fwd_params p;
                fa3c_fwd_params_init(&p);
                p.problem.dtype = fp8 ? FA3C_DTYPE_E4M3 : FA3C_DTYPE_BF16;
                p.problem.batch = b;
                p.problem.seqlen_q = p.problem.seqlen_k = s;
                p.problem.heads_q = p.problem.heads_kv = heads;
                p.problem.headdim = d;
                p.problem.headdim_v = dv != d ? dv : 0;
                p.problem.causal = causal;
                set_dense(&p.q, fp8 ? q8 : q, s, heads, d);
                set_dense(&p.k, fp8 ? k8 : k, s, heads, d);
                set_dense(&p.v, fp8 ? v8 : v, s, heads, dv);
                set_dense(&p.out, o, s, heads, dv);
                p.lse = lse;
                p.backend = FA3C_BACKEND_CUDA;
                set_seqused(&p);
                fa3c_status st = fa3c_fwd(&p, NULL);
                fa3c_bwd_params g;
                if (st == FA3C_STATUS_OK && backward) {
                    fa3c_bwd_params_init(&g);
                    g.problem = p.problem;
                    g.q = p.q;
                    g.k = p.k;
                    g.v = p.v;
                    g.out = p.out;
                    g.lse = lse;
                    set_dense(&g.dout, dout, s, heads, dv);
                    set_dense(&g.dq, dq, s, heads, d);
                    set_dense(&g.dk, dk, s, heads, d);
                    set_dense(&g.dv, dvp, s, heads, dv);
                    g.backend = FA3C_BACKEND_CUDA;
                    st = fa3c_bwd(&g, NULL);
                }
                if (st != FA3C_STATUS_OK) {
                    printf("%-5d %-6d %-6d %-5d %-5d  %s\n", d, causal, s, b, heads, fa3c_last_error());
                    continue;
                }
                timed_call c = {&p, backward ? &g : NULL};
                double ms = time_any(c, e0, e1);
                double flops = (backward ? 2.5 : 1.0) * 2.0 * b * heads * (double)s * s * (d + dv) / (causal ? 2 : 1);
                double tflops = flops / (ms * 1e-3) / 1e12;
                printf("%-5d %-6d %-6d %-5d %-5d %9.4f %8.1f\n", d, causal, s, b, heads, ms, tflops);
                if (out) fprintf(out, "%d,%d,%d,%d,%d,%.5f,%.1f\n", d, causal, s, b, heads, ms, tflops);
            }
    }
    if (out) fclose(out);
    cudaFree(dout);
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(dvp);
    cudaFree(q8);
    cudaFree(k8);
    cudaFree(v8);
    return 0;
}
