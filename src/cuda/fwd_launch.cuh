// Launch of one forward instance; each src/cuda/inst/*.cu file expands
// FA3C_FWD_INSTANCE once, so every kernel is its own translation unit.
#pragma once
#include <cuda_runtime.h>
#include "fwd_sm90.cuh"
#include "backend.h"

template <int D, int BLOCK_N, int FP16>
static fa3c_status launch_fwd(const fa3c_fwd_kernel_params *p, cudaStream_t stream) {
    size_t smem = fwd_smem_bytes<D, BLOCK_N>();
    cudaError_t e = cudaFuncSetAttribute(fwd_kernel<D, BLOCK_N, FP16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "forward kernel (hdim %d): setting %zu B of smem failed: %s", D,
                          smem, cudaGetErrorString(e));
    // p->grid (fwd_plan.c): persistent, one CTA per SM walks the tiles; else one CTA per tile.
    fwd_kernel<D, BLOCK_N, FP16><<<p->grid, FA3C_FWD_THREADS(D), smem, stream>>>(*p);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "forward kernel (hdim %d) launch failed: %s", D, cudaGetErrorString(e));
    return FA3C_STATUS_OK;
}

// BLOCK_N: keys per tile (FA3C_FWD_BLOCK_N(D), fwd_tiles.h).
#define FA3C_FWD_INSTANCE(NAME, D, BLOCK_N, FP16)                                              \
    extern "C" fa3c_status NAME(const fa3c_fwd_kernel_params *p, void *stream) {               \
        return launch_fwd<D, BLOCK_N, FP16>(p, (cudaStream_t)stream);                          \
    }
