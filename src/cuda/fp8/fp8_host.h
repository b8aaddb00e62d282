/* The fp8 (e4m3) forward on the CUDA backend (fp8_host.c); fwd_host.c hands
 * E4M3 calls here. */
#ifndef FA3C_FP8_HOST_H
#define FA3C_FP8_HOST_H

#include "fa3c.h"

#ifdef __cplusplus
extern "C" {
#endif

fa3c_status fa3c_cuda_fwd_fp8_supported(const fa3c_fwd_params *p);
fa3c_status fa3c_cuda_fwd_fp8(const fa3c_fwd_params *p, void *stream);

#ifdef __cplusplus
}
#endif
#endif
