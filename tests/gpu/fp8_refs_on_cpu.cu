// The GPU fp8 forward test (test_fp8_fwd.cu) with the CPU standing in for
// the GPU: device memory is host memory, and backend CUDA is the CPU's e4m3
// forward. It checks the test's own side on every machine, CI included: its
// naive fp8 forward, the quantization with descales, the references, the
// poison and guard checks, and that a correct forward passes the accuracy
// rule. Registered per case in tests/CMakeLists.txt.
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
#define fa3c_cuda_fwd_supported(p) FA3C_STATUS_OK
#define FA3C_BACKEND_CUDA FA3C_BACKEND_CPU

#include "test_fp8_fwd.cu"
