/* The CUDA backend's entry points when fa3c is built without nvcc: nothing
 * is usable, no pointer is device memory, and every call says why. */
#include "backend.h"

#define NO_CUDA_MESSAGE "fa3c was built without the CUDA backend"

int fa3c_cuda_backend_usable(void) {
    /* The API layer quotes this reason when CUDA was asked for explicitly. */
    fa3c_error(FA3C_STATUS_NO_DEVICE, NO_CUDA_MESSAGE);
    return 0;
}

int fa3c_cuda_pointer_is_device(const void *ptr) { return 0; }

fa3c_status fa3c_cuda_copy_to_host(void *dst, const void *src, size_t bytes, void *stream) {
    return fa3c_error(FA3C_STATUS_NO_DEVICE, NO_CUDA_MESSAGE);
}

fa3c_status fa3c_cuda_append_kv(const fa3c_append_params *p, void *stream) {
    return fa3c_error(FA3C_STATUS_NO_DEVICE, NO_CUDA_MESSAGE);
}

fa3c_status fa3c_cuda_quantize_fp8(const fa3c_quantize_params *p, void *stream) {
    return fa3c_error(FA3C_STATUS_NO_DEVICE, NO_CUDA_MESSAGE);
}

fa3c_status fa3c_cuda_fwd(const fa3c_fwd_params *p, void *stream) {
    return fa3c_error(FA3C_STATUS_NO_DEVICE, NO_CUDA_MESSAGE);
}

fa3c_status fa3c_cuda_bwd(const fa3c_bwd_params *p, void *stream) {
    return fa3c_error(FA3C_STATUS_NO_DEVICE, NO_CUDA_MESSAGE);
}

fa3c_status fa3c_cuda_fwd_supported(const fa3c_fwd_params *p) {
    return fa3c_error(FA3C_STATUS_NO_DEVICE, NO_CUDA_MESSAGE);
}

fa3c_status fa3c_cuda_bwd_supported(const fa3c_bwd_params *p) {
    return fa3c_error(FA3C_STATUS_NO_DEVICE, NO_CUDA_MESSAGE);
}

int fa3c_cuda_fwd_block_n(const fa3c_problem *pr) { return 0; }

int fa3c_cuda_fwd_last_cluster(void) { return 0; }

int fa3c_cuda_fwd_last_num_splits(void) { return 0; }
