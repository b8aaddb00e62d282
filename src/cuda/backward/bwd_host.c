/* The CUDA backward's host side: what it supports, its scratch, and its
 * three launches (bwd_prep.cu's preprocessing, the main kernel of
 * bwd_sm90.cuh, bwd_prep.cu's dq kernel), all on the caller's stream.
 * A build configured with -DFA3C_CUDA_BWD=OFF leaves the kernels unused:
 * the CUDA backward then says NOT_SUPPORTED. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "bwd_prep.h"
#include "bwd_tiles.h"
#include "built_instances.h"
#include "problem.h"
#include "tensor_map.h"

#ifndef FA3C_CUDA_BWD
#define FA3C_CUDA_BWD 0
#endif

typedef struct {
    fa3c_dtype dtype;
    int headdim, headdim_v;   /* the kernel's; headdim_v below headdim: built for a narrower v */
    fa3c_bwd_launcher launch;
} bwd_instance;

/* The instances this build compiled (built_instances.h, from sources.cmake). */
#define FA3C_DECLARE_BWD(name, dtype, hdim, hdim_v) \
    fa3c_status fa3c_bwd_sm90_##name(const fa3c_bwd_kernel_params *p, void *stream);
FA3C_BUILT_BWD_INSTANCES(FA3C_DECLARE_BWD)
#undef FA3C_DECLARE_BWD
#define FA3C_BWD_ROW(name, dtype, hdim, hdim_v) {dtype, hdim, hdim_v, fa3c_bwd_sm90_##name},
static const bwd_instance bwd_instances[] = {
    FA3C_BUILT_BWD_INSTANCES(FA3C_BWD_ROW)
#undef FA3C_BWD_ROW
    {FA3C_DTYPE_FP32, 0, 0, NULL}};

/* The instance of the problem's kernel head dim: one built for a narrower v
 * (headdim_v below headdim: MLA prefill's 192 / 128) where v's head dim fits
 * it, else the one whose v is as wide as q. */
static const bwd_instance *find_bwd(const fa3c_problem *pr) {
    const int d = FA3C_BWD_KERNEL_HEADDIM(fa3c_headdim_max(pr)), dv = fa3c_headdim_v(pr);
    const bwd_instance *found = NULL;
    for (size_t i = 0; bwd_instances[i].launch; i++) {
        const bwd_instance *b = &bwd_instances[i];
        if (b->dtype != pr->dtype || b->headdim != d) continue;
        if (b->headdim_v < b->headdim && dv <= b->headdim_v && FA3C_BWD_HDIM192_V128) return b;
        if (b->headdim_v == b->headdim) found = b;
    }
    return found;
}

/* dk and dv leave as pairs of 16-bit values (4-byte stores). */
static fa3c_status check_pair_output(const char *name, const fa3c_tensor *t) {
    fa3c_status s = fa3c_tensor_map_check_aligned(name, t);
    if (s != FA3C_STATUS_OK) return s;
    for (int i = 0; i < 3; i++)
        if (t->stride[i] % 2 != 0)
            return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "%s: the CUDA backward needs even strides (dim %d is %lld)",
                              name, i, (long long)t->stride[i]);
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_cuda_bwd_supported(const fa3c_bwd_params *p) {
    const fa3c_problem *pr = &p->problem;
    if (!FA3C_CUDA_BWD)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED,
                          "CUDA backward: this build leaves its kernels off (-DFA3C_CUDA_BWD=OFF; configure with "
                          "-DFA3C_CUDA_BWD=ON, or use backend CPU)");
    fa3c_status fs = fa3c_cuda_problem_features_supported(pr);
    if (fs != FA3C_STATUS_OK) return fs;
    if (pr->dtype != FA3C_DTYPE_BF16 && pr->dtype != FA3C_DTYPE_FP16)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA backward: only bf16 and fp16 are supported");
    if (!FA3C_BWD_HEADDIM_OK(fa3c_headdim_max(pr)))
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA backward: headdim %d / headdim_v %d is not supported "
                          "(multiples of 8 up to 256)", pr->headdim, fa3c_headdim_v(pr));
    if (!find_bwd(pr))
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA backward: no kernel for %s headdim %d in this build "
                          "(see FA3C_INSTANCES)", pr->dtype == FA3C_DTYPE_FP16 ? "fp16" : "bf16",
                          FA3C_BWD_KERNEL_HEADDIM(fa3c_headdim_max(pr)));
    if ((pr->cu_seqlens_q && (int64_t)pr->batch * pr->seqlen_q > INT32_MAX) ||
        (pr->cu_seqlens_k && (int64_t)pr->batch * pr->seqlen_k > INT32_MAX))
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA backward: packed sequences (cu_seqlens) of batch x seqlen "
                          ">= 2^31 tokens");
    if (pr->batch > 65535 || pr->heads_q > 65535)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA backward: batch and heads must be at most 65535");
    const int block_n = FA3C_BWD_BLOCK_N(FA3C_BWD_KERNEL_HEADDIM(fa3c_headdim_max(pr)));
    if ((int64_t)((pr->seqlen_k + block_n - 1) / block_n) * pr->heads_kv * pr->batch > INT32_MAX)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA backward: key blocks of %d x heads_kv x batch must be "
                          "below 2^31 (one CTA each)", block_n);
    fa3c_status s;
    int q_outer, q_rows, k_outer, k_rows;
    fa3c_tensor_map_extents(pr, &q_outer, &q_rows, &k_outer, &k_rows);   /* no pages here */
    if ((s = fa3c_tensor_map_check_input("q", &p->q, 2, q_outer, q_rows, pr->heads_q)) ||
        (s = fa3c_tensor_map_check_input("k", &p->k, 2, k_outer, k_rows, pr->heads_kv)) ||
        (s = fa3c_tensor_map_check_input("v", &p->v, 2, k_outer, k_rows, pr->heads_kv)) ||
        (s = fa3c_tensor_map_check_input("dout", &p->dout, 2, q_outer, q_rows, pr->heads_q)) ||
        (s = check_pair_output("dk", &p->dk)) || (s = check_pair_output("dv", &p->dv)))
        return s;
    return FA3C_STATUS_OK;
}

/* Does every row of t (16-bit elements) start 16-byte aligned? */
static int rows_vec16(const fa3c_tensor *t) {
    return (uintptr_t)t->data % 16 == 0 && t->stride[0] % 8 == 0 && t->stride[1] % 8 == 0 && t->stride[2] % 8 == 0;
}

/* The kernel's parameters: TMA maps, sizes, the sequences, scale and mask
 * (bwd_params.h). */
static fa3c_status fill_kernel_params(fa3c_bwd_kernel_params *k, const fa3c_bwd_params *p, int block_m,
                                      int rows_pad) {
    const fa3c_problem *pr = &p->problem;
    /* The kernel spans the wider head dim (kernel_d); each map keeps its tensor's
     * own columns (q, k: d; v, dout: dv), so TMA fills the rest with zeros. */
    const int d = pr->headdim, dv = fa3c_headdim_v(pr), kernel_d = FA3C_BWD_KERNEL_HEADDIM(fa3c_headdim_max(pr));
    const int block_n = FA3C_BWD_BLOCK_N(kernel_d);
    fa3c_status s;
    memset(k, 0, sizeof *k);
    int q_outer, q_rows, k_outer, k_rows;
    fa3c_tensor_map_extents(pr, &q_outer, &q_rows, &k_outer, &k_rows);   /* no pages here */
    if ((s = fa3c_tensor_map_rows(&k->q_map, "q", &p->q, 2, q_outer, q_rows, pr->heads_q, d, 64, block_m)) ||
        (s = fa3c_tensor_map_rows(&k->do_map, "dout", &p->dout, 2, q_outer, q_rows, pr->heads_q, dv, 64, block_m)) ||
        (s = fa3c_tensor_map_rows(&k->k_map, "k", &p->k, 2, k_outer, k_rows, pr->heads_kv, d, 64, block_n)) ||
        (s = fa3c_tensor_map_rows(&k->v_map, "v", &p->v, 2, k_outer, k_rows, pr->heads_kv, dv, 64, block_n)))
        return s;
    k->cu_seqlens_q = pr->cu_seqlens_q;
    k->cu_seqlens_k = pr->cu_seqlens_k;
    k->seqused_k = pr->seqused_k;
    k->seqused_q = pr->seqused_q;
    k->batch = pr->batch;
    k->seqlen_q = pr->seqlen_q;
    k->seqlen_k = pr->seqlen_k;
    k->heads_q = pr->heads_q;
    k->heads_kv = pr->heads_kv;
    k->headdim = d;
    k->headdim_v = dv;
    k->block_n = block_n;
    k->num_n_blocks = (pr->seqlen_k + block_n - 1) / block_n;
    k->section = 1;   /* each (K/V head, batch) pair's key blocks in turn (bwd_params.h) */
    k->group = pr->heads_q / pr->heads_kv;
    k->rows_pad = rows_pad;
    k->dk = p->dk.data;
    k->dv = p->dv.data;
    memcpy(k->dk_stride, p->dk.stride, sizeof k->dk_stride);
    memcpy(k->dv_stride, p->dv.stride, sizeof k->dv_stride);
    k->dkv_vec16 = rows_vec16(&p->dk) && rows_vec16(&p->dv);
    k->softmax_scale = pr->softmax_scale;
    k->softcap = pr->softcap;   /* 0 = off (validated >= 0) */
    fa3c_score_log2_factors(pr, &k->score_log2, &k->softcap_pre);   /* as the forward's */
    k->window_left = pr->window_left;
    k->window_right = fa3c_window_right(pr);
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_cuda_bwd(const fa3c_bwd_params *p, void *stream) {
    fa3c_status s = fa3c_cuda_bwd_supported(p);
    if (s != FA3C_STATUS_OK) return s;
    const fa3c_problem *pr = &p->problem;
    const int d = pr->headdim, fp16 = pr->dtype == FA3C_DTYPE_FP16;
    const int kernel_d = FA3C_BWD_KERNEL_HEADDIM(fa3c_headdim_max(pr));
    const int masked = pr->window_left >= 0 || fa3c_window_right(pr) >= 0;
    const int block_m = FA3C_BWD_CALL_BLOCK_M(kernel_d, masked, pr->seqlen_q);
    const int rows_pad = (pr->seqlen_q + block_m - 1) / block_m * block_m;
    fa3c_bwd_kernel_params k;
    if ((s = fill_kernel_params(&k, p, block_m, rows_pad)) != FA3C_STATUS_OK) return s;

    /* Scratch, stream-ordered: dq_accum (fp32) and one int per query block
     * (deterministic = 1: the dQ turn counters; with the first-write flags,
     * dq_written), zeroed by the preprocessing (dq_accum only without the
     * flags); then lse_log2 and dsum. Every part is a multiple of 64 bytes
     * (rows_pad is a multiple of the block's 64, 80 or 128 rows), as the
     * TMA maps of lse_log2 and dsum need 16. */
    const int first_write = FA3C_BWD_WRITER_ON(kernel_d) && kernel_d <= 128 && !p->deterministic &&
                            pr->seqlen_q <= FA3C_BWD_DQ_FIRST_WRITE;
    const size_t rows = (size_t)pr->batch * pr->heads_q * rows_pad;
    const size_t accum_bytes = rows * kernel_d * sizeof(float), row_bytes = rows * sizeof(float);
    const size_t sem_bytes = p->deterministic || first_write ? rows / block_m * sizeof(int) : 0;
    const size_t zeroed = accum_bytes + (sem_bytes + 255) / 256 * 256, total = zeroed + 2 * row_bytes;
    void *ws = NULL;
    cudaError_t e = cudaMallocAsync(&ws, total, (cudaStream_t)stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fa3c_error(e == cudaErrorMemoryAllocation ? FA3C_STATUS_OUT_OF_MEMORY : FA3C_STATUS_CUDA_ERROR,
                          "CUDA backward: cudaMallocAsync of %zu B of scratch failed: %s", total,
                          cudaGetErrorString(e));
    }
    if ((s = fa3c_tensor_map_f32_rows(&k.lse_map, "lse (log2, scratch)", (char *)ws + zeroed, rows_pad,
                                      (int64_t)pr->batch * pr->heads_q, block_m)) ||
        (s = fa3c_tensor_map_f32_rows(&k.dsum_map, "dsum (scratch)", (char *)ws + zeroed + row_bytes, rows_pad,
                                      (int64_t)pr->batch * pr->heads_q, block_m))) {
        cudaFreeAsync(ws, (cudaStream_t)stream);
        return s;
    }
    k.dq_accum = (float *)ws;
    k.dq_semaphore = p->deterministic ? (int *)((char *)ws + accum_bytes) : NULL;
    k.dq_written = first_write ? (int *)((char *)ws + accum_bytes) : NULL;
    k.num_m_blocks = rows_pad / block_m;
    k.lse_log2 = (float *)((char *)ws + zeroed);
    k.dsum = (float *)((char *)ws + zeroed + row_bytes);

    fa3c_bwd_prep_params prep;
    memset(&prep, 0, sizeof prep);
    prep.out = p->out.data;
    prep.dout = p->dout.data;
    memcpy(prep.out_stride, p->out.stride, sizeof prep.out_stride);
    memcpy(prep.dout_stride, p->dout.stride, sizeof prep.dout_stride);
    prep.lse = p->lse;
    prep.cu_seqlens_q = pr->cu_seqlens_q;
    prep.seqused_q = pr->seqused_q;
    prep.lse_log2 = (float *)k.lse_log2;
    prep.dsum = (float *)k.dsum;
    prep.dq_accum = k.dq_accum;
    prep.dq_semaphore = k.dq_semaphore;
    prep.dq_written = k.dq_written;
    prep.dq = p->dq.data;
    memcpy(prep.dq_stride, p->dq.stride, sizeof prep.dq_stride);
    prep.batch = pr->batch;
    prep.seqlen_q = pr->seqlen_q;
    prep.heads_q = pr->heads_q;
    prep.headdim = d;
    prep.headdim_v = fa3c_headdim_v(pr);
    prep.accum_cols = kernel_d;
    prep.rows_pad = rows_pad;
    prep.block_m = block_m;
    prep.softmax_scale = pr->softmax_scale;

    prep.sinks = pr->sinks;
    prep.dsinks = p->dsinks;

    s = fa3c_bwd_prep(&prep, fp16, stream);
    if (s == FA3C_STATUS_OK && p->dsinks) s = fa3c_bwd_dsinks(&prep, stream);
    if (s == FA3C_STATUS_OK) s = find_bwd(pr)->launch(&k, stream);
    if (s == FA3C_STATUS_OK) s = fa3c_bwd_write_dq(&prep, fp16, stream);
    cudaFreeAsync(ws, (cudaStream_t)stream);
    return s;
}
