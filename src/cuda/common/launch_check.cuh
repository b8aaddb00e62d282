// What every warp-specialized kernel's launcher checks first (fwd_launch.cuh,
// bwd_launch.cuh, fp8_launch.cuh).
#pragma once
#include <cuda_runtime.h>
#include "backend.h"

// Allow the kernel `smem` bytes of dynamic smem, and check that its launch
// allocation covers the setmaxnreg budgets (`budget` registers for the CTA's
// `threads`): fewer registers per thread than the budgets need (ptxas chose
// fewer than the launch bounds allow) would hang the kernel. `launch_regs`
// caches the count, one per instance (-1: not asked yet). `what` names the
// kernel in the messages ("forward kernel").
template <typename Kernel>
static fa3c_status prepare_launch(Kernel kernel, size_t smem, int threads, int budget, int *launch_regs,
                                  const char *what, int d) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "%s (hdim %d): setting %zu B of smem failed: %s", what, d, smem,
                          cudaGetErrorString(e));
    int regs = __atomic_load_n(launch_regs, __ATOMIC_RELAXED);   // threads may launch at once: all store the same
    if (regs < 0) {
        cudaFuncAttributes attr;
        regs = cudaFuncGetAttributes(&attr, kernel) == cudaSuccess ? attr.numRegs : 0;
        cudaGetLastError();
        __atomic_store_n(launch_regs, regs, __ATOMIC_RELAXED);
    }
    if (regs > 0 && regs * threads < budget)
        return fa3c_error(FA3C_STATUS_INTERNAL_ERROR, "%s (hdim %d): %d registers per thread at launch, fewer than its "
                          "setmaxnreg budgets need (%d in all)", what, d, regs, budget);
    return FA3C_STATUS_OK;
}
