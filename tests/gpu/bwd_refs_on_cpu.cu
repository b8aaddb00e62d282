// The GPU backward test (test_bwd.cu) with the CPU standing in for the GPU:
// device memory is host memory, and backend CUDA is the CPU flash backward.
// It checks the test's own side on every machine, CI included: its naive
// low-precision backward, the float64 reference, the layouts of packed
// sequences and seqused_k, the poison and guard checks, and that a correct
// backward passes its accuracy rule (the CPU's does, with room). Registered
// per case in tests/CMakeLists.txt (all but the NOT_SUPPORTED one, which is
// about the CUDA backend itself).
#include "gpu_util.cuh"
#include "testutil.h"
#include "backend.h"
#include "problem.h"
#include <stdlib.h>

#undef REQUIRE_SM90
#define REQUIRE_SM90() \
    do {               \
    } while (0)
#define cudaMalloc(pp, n) (*(void **)(pp) = malloc(n), cudaSuccess)
#define cudaMemcpy(d, s, n, kind) (memcpy(d, s, n), cudaSuccess)
#define cudaMemset(d, v, n) (memset(d, v, n), cudaSuccess)
#define cudaFree(p) free(p)
#define cudaDeviceSynchronize() cudaSuccess
#define fa3c_cuda_bwd_supported(p) FA3C_STATUS_OK
#define FA3C_BACKEND_CUDA FA3C_BACKEND_CPU

#include "test_bwd.cu"
