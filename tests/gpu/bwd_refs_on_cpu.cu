// The GPU backward test (test_bwd.cu) with the CPU flash backward standing
// in for the GPU (cpu_stand_in.h): it checks the test's own side everywhere,
// CI included (its naive low-precision backward, the float64 reference, the
// layouts of packed sequences and seqused_k, the poison and guard checks),
// and that a correct backward passes its accuracy rule. Registered per case
// in tests/CMakeLists.txt.
#include "gpu_util.cuh"
#include "backend.h"
#include "problem.h"
#include "cpu_stand_in.h"
#define fa3c_cuda_bwd_supported(p) FA3C_STATUS_OK

#include "test_bwd.cu"
