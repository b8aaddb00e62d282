// Launch of one fp8 forward instance (an instance file sources.cmake writes).
#pragma once
#include <cuda_runtime.h>
#include "fwd_fp8_sm90.cuh"
#include "backend.h"
#include "launch_check.cuh"

template <int D, bool BLOCK_SCALES>
static fa3c_status launch_fwd_fp8(const fa3c_fp8_kernel_params *p, cudaStream_t stream) {
    const size_t smem = fwd_fp8_smem_bytes<D>();
    static int launch_regs = -1;   // one per instance; read and written atomically (prepare_launch)
    const int budget = 128 * FA3C_FP8_PRODUCER_REGS + 256 * FA3C_FP8_CONSUMER_REGS;
    fa3c_status s = prepare_launch(fwd_fp8_kernel<D, BLOCK_SCALES>, smem, FA3C_FP8_THREADS, budget, &launch_regs, "fp8 forward kernel",
                                   D);
    if (s != FA3C_STATUS_OK) return s;
    const dim3 grid((unsigned)((p->seqlen_q + FA3C_FP8_BLOCK_M - 1) / FA3C_FP8_BLOCK_M), (unsigned)p->heads_q,
                    (unsigned)p->batch);
    fwd_fp8_kernel<D, BLOCK_SCALES><<<grid, FA3C_FP8_THREADS, smem, stream>>>(*p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "fp8 forward kernel (hdim %d) launch failed: %s", D,
                          cudaGetErrorString(e));
    return FA3C_STATUS_OK;
}

#define FA3C_FP8_INSTANCE(NAME, D, BLOCK_SCALES)                                               \
    extern "C" fa3c_status NAME(const fa3c_fp8_kernel_params *p, void *stream) {               \
        return launch_fwd_fp8<D, BLOCK_SCALES>(p, (cudaStream_t)stream);                       \
    }
