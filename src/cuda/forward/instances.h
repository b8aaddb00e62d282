/* The forward kernel instances this build compiled, one per translation unit
 * (src/cuda/sources.cmake holds the one list and writes them, with
 * built_instances.h): per (dtype, head dim) a main instance, for hdim 256 a
 * second one with key blocks of 64 for short causal calls (fwd_tiles.h,
 * FA3C_FWD_SHORT_CAUSAL_KEYS_256), and a variable-length one for calls
 * whose sequences have their own number of keys (seqused_k, cu_seqlens,
 * paged K/V). */
#ifndef FA3C_INSTANCES_H
#define FA3C_INSTANCES_H

#include "fa3c.h"
#include "fwd_params.h"
#include "fwd_tiles.h"
#include "built_instances.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef fa3c_status (*fa3c_fwd_launcher)(const fa3c_fwd_kernel_params *p, void *stream);

/* What a forward instance is for (the role column of sources.cmake). */
enum { FA3C_FWD_ROLE_MAIN, FA3C_FWD_ROLE_SHORT_CAUSAL, FA3C_FWD_ROLE_VARLEN };

/* Each instance's launcher, and the most CTAs per cluster it was built for
 * (1, or 2: FA3C_FWD_CLUSTER in its translation unit, fwd_tiles.h). */
#define FA3C_DECLARE_FWD(name, dtype, hdim, block_n, role)                                   \
    fa3c_status fa3c_fwd_sm90_##name(const fa3c_fwd_kernel_params *p, void *stream);         \
    extern const int fa3c_fwd_sm90_##name##_cluster;
FA3C_BUILT_FWD_INSTANCES(FA3C_DECLARE_FWD)
#undef FA3C_DECLARE_FWD

#ifdef __cplusplus
}
#endif
#endif
