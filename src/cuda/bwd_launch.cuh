// Launch of one backward instance; each src/cuda/inst/bwd_*.cu file expands
// FA3C_BWD_INSTANCE once, so every kernel is its own translation unit.
#pragma once
#include <cuda_runtime.h>
#include "bwd_sm90.cuh"
#include "backend.h"

template <int D, int FP16>
static fa3c_status launch_bwd(const fa3c_bwd_kernel_params *p, cudaStream_t stream) {
    const size_t smem = bwd_smem_bytes<D>();
    cudaError_t e = cudaFuncSetAttribute(bwd_kernel<D, FP16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "backward kernel (hdim %d): setting %zu B of smem failed: %s", D,
                          smem, cudaGetErrorString(e));
    // setmaxnreg shares out the CTA's launch allocation: fewer registers
    // than the budgets need would hang the kernel (fwd_launch.cuh). Asked once.
    static int launch_regs = -1;
    if (launch_regs < 0) {
        cudaFuncAttributes attr;
        launch_regs = cudaFuncGetAttributes(&attr, bwd_kernel<D, FP16>) == cudaSuccess ? attr.numRegs : 0;
        cudaGetLastError();
    }
    const int budget = 128 * FA3C_BWD_PRODUCER_REGS + 128 * FA3C_BWD_CONSUMERS * FA3C_BWD_CONSUMER_REGS;
    if (launch_regs > 0 && launch_regs * FA3C_BWD_THREADS < budget)
        return fa3c_error(FA3C_STATUS_INTERNAL_ERROR, "backward kernel (hdim %d): %d registers per thread at launch, "
                          "fewer than its setmaxnreg budgets need (%d in all)", D, launch_regs, budget);
    const dim3 grid((unsigned)((p->seqlen_k + FA3C_BWD_BLOCK_N - 1) / FA3C_BWD_BLOCK_N), (unsigned)p->heads_kv,
                    (unsigned)p->batch);
    bwd_kernel<D, FP16><<<grid, FA3C_BWD_THREADS, smem, stream>>>(*p);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "backward kernel (hdim %d) launch failed: %s", D, cudaGetErrorString(e));
    return FA3C_STATUS_OK;
}

#define FA3C_BWD_INSTANCE(NAME, D, FP16)                                                       \
    extern "C" fa3c_status NAME(const fa3c_bwd_kernel_params *p, void *stream) {               \
        return launch_bwd<D, FP16>(p, (cudaStream_t)stream);                                   \
    }
