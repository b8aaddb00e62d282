// For the *_refs_on_cpu.cu files: a GPU suite built so that the CPU stands
// in for the GPU. Device memory becomes host memory and backend CUDA the
// CPU backend, so the suite's own side (its references, layouts, poison and
// guard checks, accuracy rules) runs on every machine, CI included. Include
// after gpu_util.cuh and before the suite; the file defines its
// fa3c_cuda_*_supported as OK itself.
#pragma once
#include <stdlib.h>
#include <string.h>

#undef REQUIRE_SM90
#define REQUIRE_SM90() \
    do {               \
    } while (0)
#define cudaMalloc(pp, n) (*(void **)(pp) = malloc(n), cudaSuccess)
#define cudaMemcpy(d, s, n, kind) (memcpy(d, s, n), cudaSuccess)
#define cudaMemset(d, v, n) (memset(d, v, n), cudaSuccess)
#define cudaFree(p) free(p)
#define cudaDeviceSynchronize() cudaSuccess
#define FA3C_BACKEND_CUDA FA3C_BACKEND_CPU
// The CPU backend takes attention sinks: their cases run here whatever the
// CUDA kernels' switch (backend.h).
#undef FA3C_CUDA_SINKS
#define FA3C_CUDA_SINKS 1
