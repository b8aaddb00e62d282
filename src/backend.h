/* Internal contract between the API layer (src/api.c) and the backends.
 *
 * api.c validates a call completely, fills in defaults (softmax_scale != 0
 * afterwards) and then calls exactly one backend function. A backend may
 * assume its params are valid; it reports only failures of its own
 * (allocation, CUDA errors, combinations it does not support) through
 * fa3c_error(). */
#ifndef FA3C_BACKEND_H
#define FA3C_BACKEND_H

#include "fa3c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Set this thread's detailed message (printf-style) and return status s. */
fa3c_status fa3c_error(fa3c_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Clear this thread's message (after a successful call). */
void fa3c_clear_error(void);

/* CPU backend (src/cpu/). Pointers are host memory. */
fa3c_status fa3c_cpu_fwd(const fa3c_fwd_params *p);            /* tiled online softmax, float */
fa3c_status fa3c_cpu_fwd_reference(const fa3c_fwd_params *p);  /* naive, double */
fa3c_status fa3c_cpu_bwd(const fa3c_bwd_params *p);
fa3c_status fa3c_cpu_bwd_reference(const fa3c_bwd_params *p);
fa3c_status fa3c_cpu_append_kv(const fa3c_append_params *p);    /* src/cpu/append.c */
fa3c_status fa3c_cpu_quantize_fp8(const fa3c_quantize_params *p); /* src/cpu/quantize.c */

/* CUDA backend (src/cuda/). Built only with nvcc; src/cuda_stub.c otherwise. */
int fa3c_cuda_backend_usable(void);                 /* compiled in and an sm_90 GPU present */
int fa3c_cuda_pointer_is_device(const void *ptr);   /* 1 if device (or managed) memory */
/* bytes from device memory src to host dst, ordered on stream, which it then
 * synchronizes (fa3c_*_check_device). */
fa3c_status fa3c_cuda_copy_to_host(void *dst, const void *src, size_t bytes, void *stream);
/* fa3c_append_kv's kernel (src/cuda/serving/append.cu), on validated params. */
fa3c_status fa3c_cuda_append_kv(const fa3c_append_params *p, void *stream);
/* fa3c_quantize_fp8's kernels (src/cuda/fp8/quantize.cu), on validated params. */
fa3c_status fa3c_cuda_quantize_fp8(const fa3c_quantize_params *p, void *stream);
fa3c_status fa3c_cuda_fwd(const fa3c_fwd_params *p, void *stream);
fa3c_status fa3c_cuda_bwd(const fa3c_bwd_params *p, void *stream);
/* NOT_SUPPORTED with a message when the CUDA backend cannot do this call. */
fa3c_status fa3c_cuda_fwd_supported(const fa3c_fwd_params *p);
fa3c_status fa3c_cuda_bwd_supported(const fa3c_bwd_params *p);
/* The part both of those share: NOT_SUPPORTED for problem features no CUDA
 * kernel takes yet (sinks in fp8, headdim_v != headdim). Called by them only. */
fa3c_status fa3c_cuda_problem_features_supported(const fa3c_problem *pr);
/* 1: the CUDA bf16 / fp16 kernels take attention sinks (problem.sinks and
 * dsinks: the forward's epilogue and combine, the backward's dsinks kernel).
 * 0 compiles the forward's sink code out and makes such calls NOT_SUPPORTED
 * (docs/KNOBS.md). */
#ifndef FA3C_CUDA_SINKS
#define FA3C_CUDA_SINKS 1
#endif
/* 1: fa3c_quantize_fp8 runs its kernels on device memory (on since
 * test_quantize_gpu passed on an H100, memcheck clean); 0: such calls are
 * NOT_SUPPORTED (docs/KNOBS.md). */
#ifndef FA3C_CUDA_QUANTIZE
#define FA3C_CUDA_QUANTIZE 1
#endif
/* Keys per block of the forward instance this problem would run on; 0 when
 * the build has none (for tests of the instance choice). */
int fa3c_cuda_fwd_block_n(const fa3c_problem *pr);
/* CTAs per cluster of the last forward kernel launched by this thread (1
 * or 2, FA3C_FWD_CLUSTER); 0 before any (for tests that clusters ran). */
int fa3c_cuda_fwd_last_cluster(void);
/* Key splits (split-KV) of the last forward kernel launched by this thread;
 * 0 before any (for tests that a call did split). */
int fa3c_cuda_fwd_last_num_splits(void);

#ifdef __cplusplus
}
#endif
#endif
