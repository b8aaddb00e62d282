/* The fp8 (e4m3) forward's host side: what it supports, the V transpose's
 * scratch, and the two launches (fp8_prep.cu, fwd_fp8_sm90.cuh) on the
 * caller's stream. fwd_host.c hands E4M3 calls here. A build configured with
 * -DFA3C_CUDA_FP8=OFF leaves the kernels unused: an E4M3 call on the CUDA
 * backend then says NOT_SUPPORTED. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "fp8_host.h"
#include "fp8_prep.h"
#include "problem.h"
#include "built_instances.h"
#include "tensor_map.h"

/* The kernel reads one block descale per query tile and per key block. */
_Static_assert(FA3C_FP8_BLOCK_M == FA3C_FP8_BLOCK_ROWS && FA3C_FP8_BLOCK_N == FA3C_FP8_BLOCK_ROWS,
               "the e4m3 kernel's tiles must be the descale blocks");

#ifndef FA3C_CUDA_FP8
#define FA3C_CUDA_FP8 0
#endif

/* The instances this build compiled (built_instances.h, from sources.cmake). */
#define FA3C_DECLARE_FP8(name, hdim, block_scales) \
    fa3c_status fa3c_fwd_sm90_##name(const fa3c_fp8_kernel_params *p, void *stream);
FA3C_BUILT_FP8_INSTANCES(FA3C_DECLARE_FP8)
#undef FA3C_DECLARE_FP8

/* Per-block K or V descales take an instance of their own (a per-key-block
 * scale in the loop); q's block descale is one per CTA, read by both. */
static int fp8_block_scales(const fa3c_fwd_params *p) { return p->k_block_descale || p->v_block_descale; }

/* block_scales: fp8_block_scales of the call. */
static fa3c_fp8_launcher find_fp8(int headdim, int block_scales) {
#define FA3C_FP8_CASE(name, hdim, blocks) \
    if (headdim == hdim && block_scales == blocks) return fa3c_fwd_sm90_##name;
    FA3C_BUILT_FP8_INSTANCES(FA3C_FP8_CASE)
#undef FA3C_FP8_CASE
    (void)headdim, (void)block_scales;
    return NULL;
}

fa3c_status fa3c_cuda_fwd_fp8_supported(const fa3c_fwd_params *p) {
    const fa3c_problem *pr = &p->problem;
    if (!FA3C_CUDA_FP8)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED,
                          "CUDA forward: this build leaves the e4m3 kernels off (-DFA3C_CUDA_FP8=OFF; configure with "
                          "-DFA3C_CUDA_FP8=ON, or use backend CPU)");
    const int kd = FA3C_FP8_KERNEL_HEADDIM(pr->headdim);
    if (!kd)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED,
                          "CUDA forward: e4m3 with headdim %d is not supported (multiples of 32 up to 256)", pr->headdim);
    if (!find_fp8(kd, fp8_block_scales(p)))
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA forward: no e4m3 kernel for headdim %d in this build (it runs "
                          "on the hdim-%d instance; see FA3C_INSTANCES)", pr->headdim, kd);
    if (pr->cu_seqlens_q || pr->cu_seqlens_k || pr->seqused_k || pr->page_table)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA forward: e4m3 with cu_seqlens, seqused_k or a paged KV cache "
                          "is not supported yet");
    if (pr->batch > 65535 || pr->heads_q > 65535)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA forward: e4m3 needs batch and heads of at most 65535");
    fa3c_status s;
    if ((s = fa3c_tensor_map_check_input("q", &p->q, 1, pr->batch, pr->seqlen_q, pr->heads_q)) ||
        (s = fa3c_tensor_map_check_input("k", &p->k, 1, pr->batch, pr->seqlen_k, pr->heads_kv)) ||
        (s = fa3c_tensor_map_check_aligned("out", &p->out)))
        return s;
    for (int i = 0; i < 3; i++)   /* bf16 pairs leave as 4-byte stores */
        if (p->out.stride[i] % 2 != 0)
            return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "out: the CUDA backend needs even strides (dim %d is %lld)", i,
                              (long long)p->out.stride[i]);
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_cuda_fwd_fp8(const fa3c_fwd_params *p, void *stream) {
    fa3c_status s = fa3c_cuda_fwd_fp8_supported(p);
    if (s != FA3C_STATUS_OK) return s;
    const fa3c_problem *pr = &p->problem;
    const int d = pr->headdim, kd = FA3C_FP8_KERNEL_HEADDIM(d);   /* kd: the kernel's, d rounded up */
    const int keys_pad = (pr->seqlen_k + FA3C_FP8_BLOCK_N - 1) / FA3C_FP8_BLOCK_N * FA3C_FP8_BLOCK_N;

    /* Vᵀ: (batch, heads_kv, headdim, keys_pad) bytes, stream-ordered scratch. */
    const size_t vt_bytes = (size_t)pr->batch * pr->heads_kv * d * keys_pad;
    void *vt = NULL;
    cudaError_t e = cudaMallocAsync(&vt, vt_bytes, (cudaStream_t)stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fa3c_error(e == cudaErrorMemoryAllocation ? FA3C_STATUS_OUT_OF_MEMORY : FA3C_STATUS_CUDA_ERROR,
                          "fp8 forward: cudaMallocAsync of %zu B for the transposed V failed: %s", vt_bytes,
                          cudaGetErrorString(e));
    }
    fa3c_fp8_vt_params t;
    memset(&t, 0, sizeof t);
    t.v = (const uint8_t *)p->v.data;
    memcpy(t.v_stride, p->v.stride, sizeof t.v_stride);
    t.vt = (uint8_t *)vt;
    t.batch = pr->batch;
    t.seqlen_k = pr->seqlen_k;
    t.heads_kv = pr->heads_kv;
    t.headdim = d;
    t.keys_pad = keys_pad;

    fa3c_fp8_kernel_params k;
    memset(&k, 0, sizeof k);
    /* Vᵀ as a (batch, rows = headdim, heads_kv, columns = keys_pad) tensor of bytes. The boxes are the
     * kernel's (kd columns of q and k, kd rows of Vᵀ): past d, TMA fills zeros. */
    fa3c_tensor vt_tensor = {vt, {(int64_t)pr->heads_kv * d * keys_pad, keys_pad, (int64_t)d * keys_pad, 1}};
    if ((s = fa3c_tensor_map_rows(&k.q_map, "q", &p->q, 1, pr->batch, pr->seqlen_q, pr->heads_q, d, 128,
                                  FA3C_FP8_BLOCK_M)) ||
        (s = fa3c_tensor_map_rows(&k.k_map, "k", &p->k, 1, pr->batch, pr->seqlen_k, pr->heads_kv, d, 128,
                                  FA3C_FP8_BLOCK_N)) ||
        (s = fa3c_tensor_map_rows(&k.vt_map, "v (transposed)", &vt_tensor, 1, pr->batch, d, pr->heads_kv, keys_pad,
                                  128, kd))) {
        cudaFreeAsync(vt, (cudaStream_t)stream);
        return s;
    }
    k.out = p->out.data;
    memcpy(k.out_stride, p->out.stride, sizeof k.out_stride);
    k.lse = p->lse;
    k.q_descale = p->q_descale;
    k.k_descale = p->k_descale;
    k.v_descale = p->v_descale;
    k.q_block_descale = p->q_block_descale;
    k.k_block_descale = p->k_block_descale;
    k.v_block_descale = p->v_block_descale;
    k.batch = pr->batch;
    k.seqlen_q = pr->seqlen_q;
    k.seqlen_k = pr->seqlen_k;
    k.heads_q = pr->heads_q;
    k.heads_kv = pr->heads_kv;
    k.group = pr->heads_q / pr->heads_kv;
    k.softmax_scale = pr->softmax_scale;
    k.softcap = pr->softcap;
    k.window_left = pr->window_left;
    k.window_right = fa3c_window_right(pr);
    k.headdim = d;

    s = fa3c_fp8_transpose_v(&t, stream);
    if (s == FA3C_STATUS_OK) s = find_fp8(kd, fp8_block_scales(p))(&k, stream);
    cudaFreeAsync(vt, (cudaStream_t)stream);
    return s;
}
