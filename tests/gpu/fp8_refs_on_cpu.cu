// The GPU fp8 forward test (test_fp8_fwd.cu) with the CPU's e4m3 forward
// standing in for the GPU (cpu_stand_in.h): it checks the test's own side
// everywhere, CI included (its naive fp8 forward, the quantization with
// descales, the references, the poison and guard checks), and that a
// correct forward passes the accuracy rule. Registered per case in
// tests/CMakeLists.txt.
#include "gpu_util.cuh"
#include "backend.h"
#include "problem.h"
#include "cpu_stand_in.h"
#define fa3c_cuda_fwd_supported(p) FA3C_STATUS_OK

#include "test_fp8_fwd.cu"
