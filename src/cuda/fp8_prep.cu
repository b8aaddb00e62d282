// The fp8 forward's V transpose (fwd_fp8_sm90.cuh reads Vᵀ): e4m3 wgmma
// takes B K-major, so O += P·V needs each V column's keys contiguous. One
// byte per thread (a first form: the copy is O(seqlen) against the
// kernel's O(seqlen^2)); keys in each group of 32 in the order of P's
// register fragments (fa3c_fp8_key_of_slot); zeros past seqlen_k.
#include <cuda_runtime.h>
#include "fp8_prep.h"
#include "backend.h"

// Grid-stride over Vᵀ (batch, heads_kv, headdim, keys_pad).
__global__ void __launch_bounds__(256) fp8_transpose_v_kernel(const fa3c_fp8_vt_params p) {
    const int64_t n = (int64_t)p.batch * p.heads_kv * p.headdim * p.keys_pad;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int slot = (int)(i % p.keys_pad);
        const int64_t rest = i / p.keys_pad;
        const int d = (int)(rest % p.headdim), head = (int)(rest / p.headdim % p.heads_kv);
        const int batch = (int)(rest / p.headdim / p.heads_kv);
        const int key = slot / 32 * 32 + fa3c_fp8_key_of_slot(slot % 32);
        p.vt[i] = key < p.seqlen_k
                      ? p.v[batch * p.v_stride[0] + (int64_t)key * p.v_stride[1] + head * p.v_stride[2] + d]
                      : (uint8_t)0;
    }
}

extern "C" fa3c_status fa3c_fp8_transpose_v(const fa3c_fp8_vt_params *p, void *stream) {
    const int64_t n = (int64_t)p->batch * p->heads_kv * p->headdim * p->keys_pad;
    const int64_t blocks = (n + 255) / 256;
    fp8_transpose_v_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, (cudaStream_t)stream>>>(*p);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FA3C_STATUS_OK
                            : fa3c_error(FA3C_STATUS_CUDA_ERROR, "fp8 forward: V transpose launch failed: %s",
                                         cudaGetErrorString(e));
}
