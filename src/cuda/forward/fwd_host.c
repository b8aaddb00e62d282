/* The CUDA backend's forward, host side (fa3c_cuda_fwd; bwd_host.c and fp8_host.c are the
 * backward's and fp8's): what it supports, and turning validated fa3c_fwd_params into kernel
 * parameters (TMA descriptors, softmax constants) and a launch of the right instance. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "fp8_host.h"
#include "fwd_combine.h"
#include "fwd_params.h"
#include "fwd_plan.h"
#include "fwd_tiles.h"
#include "instances.h"
#include "problem.h"
#include "tensor_map.h"

typedef struct {
    fa3c_dtype dtype;
    int headdim, block_n;
    /* 0: the head dim's main instance; > 0: used instead of it for calls
     * under a causal mask (a right bound) with seqlen_k <= short_causal_keys. */
    int short_causal_keys;
    /* 1: for calls whose sequences have their own lengths (seqused_k,
     * cu_seqlens) or a paged KV cache, and only for those (fwd_sm90.cuh, VARLEN). */
    int varlen;
    int short_causal;   /* 1: never a head dim's main instance (used only as above) */
    fa3c_fwd_launcher launch;
    const int *cluster;   /* the most CTAs per cluster it was built for (fwd_launch.cuh) */
} fwd_instance;

/* The instances this build compiled (built_instances.h, from sources.cmake).
 * A short-causal instance is used for calls with seqlen_k up to
 * FA3C_FWD_SHORT_CAUSAL_KEYS_256 (0: never). */
#define FA3C_TABLE_ROW(name, dt, hd, bn, role)                                                              \
    {dt, hd, bn, (role) == FA3C_FWD_ROLE_SHORT_CAUSAL ? FA3C_FWD_SHORT_CAUSAL_KEYS_256 : 0,                  \
     (role) == FA3C_FWD_ROLE_VARLEN, (role) == FA3C_FWD_ROLE_SHORT_CAUSAL, fa3c_fwd_sm90_##name,             \
     &fa3c_fwd_sm90_##name##_cluster},
static const fwd_instance fwd_instances[] = {
    FA3C_BUILT_FWD_INSTANCES(FA3C_TABLE_ROW)
#undef FA3C_TABLE_ROW
    {FA3C_DTYPE_FP32, 0, 0, 0, 0, 0, NULL, NULL}};

/* The SM count and L2 size of the current device (0 where unknown). */
static fa3c_fwd_plan_facts device_facts(void) {
    fa3c_fwd_plan_facts f = {0, 0, 0, 0, 1};   /* cluster: the instance's */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&f.l2_bytes, cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
        cudaGetLastError();
        f.sms = f.l2_bytes = 0;
    }
    return f;
}

/* The head dim of the kernels a call runs on: the smallest this build has for
 * the dtype that is at least the call's (the wider of headdim and headdim_v; 0: none). A narrower head dim runs
 * padded: TMA reads the columns past the tensors' as zeros (they add nothing
 * to the scores or the output) and the stores write the tensors' columns
 * only (fwd_params.h, out_cols). */
static int kernel_headdim(const fa3c_problem *pr) {
    int best = 0;
    for (size_t i = 0; fwd_instances[i].launch; i++) {
        const int d = fwd_instances[i].headdim;
        if (fwd_instances[i].dtype == pr->dtype && d >= fa3c_headdim_max(pr) && (best == 0 || d < best)) best = d;
    }
    return best;
}

/* The instance for this call: of its kernel head dim (kernel_headdim), the
 * variable-length one for calls with seqused_q / _k, a page table or
 * cu_seqlens; else its main one, or its short-causal one where the call
 * qualifies and the build has it. */
static const fwd_instance *find_fwd(const fa3c_problem *pr) {
    const fwd_instance *found = NULL;
    const int right_bound = fa3c_window_right(pr) >= 0, headdim = kernel_headdim(pr);
    int varlen = pr->seqused_k || pr->seqused_q || pr->leftpad_k || pr->page_table || pr->cu_seqlens_q ||
                 pr->cu_seqlens_k;
    for (size_t i = 0; fwd_instances[i].launch; i++) {
        const fwd_instance *in = &fwd_instances[i];
        if (in->dtype != pr->dtype || in->headdim != headdim || in->varlen != varlen) continue;
        if (!in->short_causal && !found) found = in;
        if (in->short_causal_keys > 0 && right_bound && pr->seqlen_k <= in->short_causal_keys) return in;
    }
    return found;
}

int fa3c_cuda_fwd_block_n(const fa3c_problem *pr) {
    const fwd_instance *in = find_fwd(pr);
    return in ? in->block_n : 0;
}

/* What this thread's last forward launch chose, for the tests; per thread, as
 * fa3c_last_error is, so that calls from several threads do not race. */
static _Thread_local int last_cluster, last_num_splits;
int fa3c_cuda_fwd_last_cluster(void) { return last_cluster; }
int fa3c_cuda_fwd_last_num_splits(void) { return last_num_splits; }

int fa3c_cuda_backend_usable(void) {
    int count = 0, dev = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();   /* not a sticky error: clear it so later calls start clean */
        fa3c_error(FA3C_STATUS_NO_DEVICE, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        cudaGetLastError();
        fa3c_error(FA3C_STATUS_NO_DEVICE, "cannot query the current CUDA device");
        return 0;
    }
    if (major != 9) {
        fa3c_error(FA3C_STATUS_NO_DEVICE, "device %d is sm_%d%d; the kernels are built for sm_90a (H100/H200)", dev,
                   major, minor);
        return 0;
    }
    return 1;
}

int fa3c_cuda_pointer_is_device(const void *ptr) {
    struct cudaPointerAttributes a;
    if (!ptr || cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

fa3c_status fa3c_cuda_copy_to_host(void *dst, const void *src, size_t bytes, void *stream) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "copying %zu bytes of device metadata to the host: %s", bytes,
                          cudaGetErrorString(e));
    }
    return FA3C_STATUS_OK;
}

static const char *dtype_name(fa3c_dtype d) {
    switch (d) {
    case FA3C_DTYPE_FP32: return "fp32";
    case FA3C_DTYPE_FP16: return "fp16";
    case FA3C_DTYPE_BF16: return "bf16";
    case FA3C_DTYPE_E4M3: return "e4m3";
    }
    return "?";
}

fa3c_status fa3c_cuda_problem_features_supported(const fa3c_problem *pr) {
    if (pr->sinks && !FA3C_CUDA_SINKS)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.sinks: this build's CUDA kernels take no attention "
                          "sinks (built with -DFA3C_CUDA_SINKS=0); the CPU backends take them");
    if (pr->sinks && pr->dtype == FA3C_DTYPE_E4M3)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.sinks: the CUDA fp8 (e4m3) forward does not take "
                          "attention sinks yet (bf16 and fp16 do; the CPU backends take every dtype)");
    if (pr->leftpad_k && (pr->page_table || pr->dtype == FA3C_DTYPE_E4M3))
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.leftpad_k: the CUDA backend takes a left-padded KV "
                          "cache in bf16 / fp16 without a page table (a padding that is not a multiple of the "
                          "pages' boxes would split boxes across pages); the CPU backends take every form");
    if (pr->seqused_q && pr->dtype == FA3C_DTYPE_E4M3)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.seqused_q: the CUDA fp8 (e4m3) forward does not take "
                          "queries used per sequence yet (bf16 and fp16 do; the CPU backends take every dtype)");
    /* A value head dim of its own runs on the kernel of the wider one (the narrower
     * one's columns zero-filled and never stored, as any padded head dim). */
    if (fa3c_headdim_v(pr) != pr->headdim && (fa3c_headdim_v(pr) > 256 || pr->dtype == FA3C_DTYPE_E4M3))
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "problem.headdim_v: the CUDA backend takes a value head dim "
                          "other than headdim (%d) up to 256 in bf16 / fp16 (got %d%s); the CPU backends take "
                          "up to 512", pr->headdim, fa3c_headdim_v(pr),
                          pr->dtype == FA3C_DTYPE_E4M3 ? " in e4m3" : "");
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_cuda_fwd_supported(const fa3c_fwd_params *p) {
    const fa3c_problem *pr = &p->problem;
    fa3c_status s = fa3c_cuda_problem_features_supported(pr);
    if (s != FA3C_STATUS_OK) return s;
    if (pr->dtype == FA3C_DTYPE_E4M3) return fa3c_cuda_fwd_fp8_supported(p);   /* fp8_host.c */
    if (pr->dtype != FA3C_DTYPE_BF16 && pr->dtype != FA3C_DTYPE_FP16)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA forward: dtype %s is not supported yet (bf16, fp16, e4m3)",
                          dtype_name(pr->dtype));
    if ((pr->cu_seqlens_q && (int64_t)pr->batch * pr->seqlen_q > INT32_MAX) ||
        (pr->cu_seqlens_k && (int64_t)pr->batch * pr->seqlen_k > INT32_MAX))
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "CUDA forward: packed sequences (cu_seqlens) of batch x seqlen "
                          ">= 2^31 tokens");
    fa3c_problem fixed = *pr;
    fixed.seqused_k = fixed.seqused_q = fixed.leftpad_k = NULL;
    fixed.page_table = NULL;
    fixed.cu_seqlens_q = fixed.cu_seqlens_k = NULL;
    if (!find_fwd(&fixed))
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED,
                          "CUDA forward: no kernel for %s headdim %d in this build (it runs on the next wider of "
                          "head dims 64, 96, 128, 192, 256; see FA3C_INSTANCES)", dtype_name(pr->dtype), pr->headdim);
    if (!find_fwd(pr))   /* seqused_k or paged KV, and the build has the fixed-length instance only */
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED,
                          "CUDA forward: seqused_k, seqused_q, cu_seqlens and paged KV need the variable-length kernel %s_hdim%d_varlen, which "
                          "this build lacks (built unless -DFA3C_CUDA_VARLEN=OFF; or add it to FA3C_INSTANCES)",
                          dtype_name(pr->dtype), pr->headdim);
    /* Paged: boxes of gcd(block_n, page_size) rows, each starting on a
     * 128-byte boundary of smem as TMA requires: any page size with rows of
     * 128 bytes per chunk, an even one with hdim 96's 64-byte rows. */
    if (pr->page_table &&
        fa3c_fwd_plan_page_rows(pr, find_fwd(pr)->block_n) * FA3C_FWD_CHUNK_COLS(find_fwd(pr)->headdim) * 2 % 128 != 0)
        return fa3c_error(FA3C_STATUS_NOT_SUPPORTED,
                          "CUDA forward: a paged KV cache with headdim %d needs an even page_size (got %d)",
                          pr->headdim, pr->page_size);
    /* Q: per sequence, or packed (one batch of tokens, at most batch x seqlen_q of them);
     * K and V: per sequence (batch, seqlen_k), pages (num_pages, page_size) or packed. */
    int q_outer, q_rows, kv_outer, kv_rows;
    fa3c_tensor_map_extents(pr, &q_outer, &q_rows, &kv_outer, &kv_rows);
    if ((s = fa3c_tensor_map_check_input("q", &p->q, 2, q_outer, q_rows, pr->heads_q)) ||
        (s = fa3c_tensor_map_check_input("k", &p->k, 2, kv_outer, kv_rows, pr->heads_kv)) ||
        (s = fa3c_tensor_map_check_input("v", &p->v, 2, kv_outer, kv_rows, pr->heads_kv)) ||
        (s = fa3c_tensor_map_check_aligned("out", &p->out)))
        return s;
    for (int i = pr->cu_seqlens_q ? 1 : 0; i < 3; i++)   /* packed sequences: stride[0] is not used */
        if (p->out.stride[i] % 2 != 0)
            return fa3c_error(FA3C_STATUS_NOT_SUPPORTED, "out: the CUDA backend needs even strides (dim %d is %lld)",
                              i, (long long)p->out.stride[i]);
    return FA3C_STATUS_OK;
}

/* The kernel's parameters for this call on instance `inst` with num_splits
 * asked (0: auto): TMA maps, tiles, splits, the epilogue's choices. */
static fa3c_status plan_fwd(const fa3c_fwd_params *p, const fwd_instance *inst, int num_splits,
                            fa3c_fwd_kernel_params *k) {
    const fa3c_problem *pr = &p->problem;
    const int kd = inst->headdim;   /* the kernel's head dim: pr->headdim, or wider (padded) */
    const int block_n = inst->block_n, block_m = FA3C_FWD_BLOCK_M(kd), cols = FA3C_FWD_CHUNK_COLS(kd);
    fa3c_status s;
    memset(k, 0, sizeof *k);
    fa3c_fwd_plan_facts facts = device_facts();
    facts.block_m = block_m;
    facts.block_n = block_n;
    facts.cluster = *inst->cluster;   /* e.g. the main hdim-256 instances: 2 (fwd_tiles.h, FA3C_FWD_CLUSTER_256) */
    int q_outer, q_rows, kv_outer, kv_rows;
    fa3c_tensor_map_extents(pr, &q_outer, &q_rows, &kv_outer, &kv_rows);
    int pack = fa3c_fwd_plan_pack(pr, block_m);
    if (pack > 1 && fa3c_tensor_map_groups(&k->q_map, "q", &p->q, q_outer, q_rows, pr->heads_q, pack, pr->headdim,
                                           cols, block_m) != FA3C_STATUS_OK)
        pack = 1;   /* strides the 5-D map can't take: no packing */
    /* K and V boxes: a key block, in a cluster the half each CTA loads for
     * both, or with a page table a part of a block inside one page (k->page_rows). */
    if ((pack == 1 && (s = fa3c_tensor_map_groups(&k->q_map, "q", &p->q, q_outer, q_rows, pr->heads_q, 1,
                                                  pr->headdim, cols, block_m))) ||
        (s = fa3c_fwd_plan_tiles(k, pr, pack, num_splits, &facts)))
        return s;
    int kv_box = pr->page_table ? k->page_rows : block_n / k->cluster;
    if ((s = fa3c_tensor_map_rows(&k->k_map, "k", &p->k, 2, kv_outer, kv_rows, pr->heads_kv, pr->headdim, cols,
                                  kv_box)) ||
        (s = fa3c_tensor_map_rows(&k->v_map, "v", &p->v, 2, kv_outer, kv_rows, pr->heads_kv, fa3c_headdim_v(pr),
                                  cols, kv_box)))
        return s;
    k->out = p->out.data;
    k->out_stride[0] = p->out.stride[0];
    k->out_stride[1] = p->out.stride[1];
    k->out_stride[2] = p->out.stride[2];
    k->out_vec16 = kd == fa3c_headdim_v(pr) && (uintptr_t)p->out.data % 16 == 0 &&
                   (pr->cu_seqlens_q || p->out.stride[0] % 8 == 0) && p->out.stride[1] % 8 == 0 &&
                   p->out.stride[2] % 8 == 0;
    k->lse = p->lse;
    k->sinks = pr->sinks;
    /* O through TMA stores (instances with smem for it, fwd_epilogue.cuh): one box
     * is one consumer's 64 rows, so the group must divide 64; split-KV writes
     * fp32 partials instead. Strides TMA can't take: stores from registers. */
    k->out_cols = fa3c_headdim_v(pr);   /* out's columns: v's */
    k->out_tma = k->num_splits == 1 && kd % 64 == 0 && 64 % k->pack == 0 &&
                 fa3c_tensor_map_groups(&k->o_map, "out", &p->out, q_outer, q_rows, pr->heads_q, k->pack,
                                        fa3c_headdim_v(pr), 64, 64) == FA3C_STATUS_OK;
    k->softcap = pr->softcap;   /* 0 = off (validated >= 0) */
    fa3c_score_log2_factors(pr, &k->score_log2, &k->softcap_pre);
    return FA3C_STATUS_OK;
}

fa3c_status fa3c_cuda_fwd(const fa3c_fwd_params *p, void *stream) {
    if (p->problem.dtype == FA3C_DTYPE_E4M3) return fa3c_cuda_fwd_fp8(p, stream);
    fa3c_status s = fa3c_cuda_fwd_supported(p);
    if (s != FA3C_STATUS_OK) return s;
    const fa3c_problem *pr = &p->problem;
    const fwd_instance *inst = find_fwd(pr);
    const int kd = inst->headdim;
    fa3c_fwd_kernel_params k;
    if ((s = plan_fwd(p, inst, p->num_splits, &k)) != FA3C_STATUS_OK) return s;

    /* Split-KV: the partial results live in stream-ordered memory from the
     * device's default pool, freed once the combine is queued. */
    void *ws = NULL;
    if (k.num_splits > 1) {
        const size_t rows = (size_t)pr->batch * pr->heads_q * pr->seqlen_q * k.num_splits;
        const size_t bytes = rows * (kd + 1) * sizeof(float);
        cudaError_t e = cudaMallocAsync(&ws, bytes, (cudaStream_t)stream);
        if (e == cudaSuccess) {
            k.o_partial = (float *)ws;
            k.lse_partial = k.o_partial + rows * kd;
        } else {
            cudaGetLastError();
            ws = NULL;
            /* Auto, or packed queries (whose scratch is sized by batch x the
             * longest sequence, which may be far more than their tokens): run
             * unsplit rather than fail. */
            if (p->num_splits != 0 && !pr->cu_seqlens_q)
                return fa3c_error(e == cudaErrorMemoryAllocation ? FA3C_STATUS_OUT_OF_MEMORY : FA3C_STATUS_CUDA_ERROR,
                                  "split-KV: cudaMallocAsync of %zu B for the partial results of %d splits failed: %s",
                                  bytes, k.num_splits, cudaGetErrorString(e));
            if ((s = plan_fwd(p, inst, 1, &k)) != FA3C_STATUS_OK) return s;
        }
    }
    last_cluster = k.cluster;
    last_num_splits = k.num_splits;
    s = inst->launch(&k, stream);
    if (ws) {
        if (s == FA3C_STATUS_OK) s = fa3c_fwd_combine(&k, kd, pr->dtype == FA3C_DTYPE_FP16, stream);
        cudaFreeAsync(ws, (cudaStream_t)stream);
    }
    return s;
}
