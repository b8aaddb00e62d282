// Launch of one forward instance; each instance file that sources.cmake
// writes expands FA3C_FWD_INSTANCE once, so every kernel is its own
// translation unit.
#pragma once
#include <cuda_runtime.h>
#include <string.h>
#include "fwd_sm90.cuh"
#include "backend.h"
#include "launch_check.cuh"

#if FA3C_FWD_TRACE
#include <stdio.h>
#include <stdlib.h>
// Trace builds (trace.cuh): clear the stamps before a launch, and write them
// after it to $FA3C_TRACE_OUT (a header of five int32 - D, CTAs, roles,
// blocks, events - then the uint64 stamps), overwritten by each call.
static void trace_clear(cudaStream_t stream) {
    void *stamps = NULL;
    if (cudaGetSymbolAddress(&stamps, fa3c_trace_stamps) == cudaSuccess)
        cudaMemsetAsync(stamps, 0, sizeof(fa3c_trace_stamps), stream);
}
static void trace_write(cudaStream_t stream, int d) {
    const char *path = getenv("FA3C_TRACE_OUT");
    if (!path || cudaStreamSynchronize(stream) != cudaSuccess) return;
    static unsigned long long host[sizeof(fa3c_trace_stamps) / 8];
    if (cudaMemcpyFromSymbol(host, fa3c_trace_stamps, sizeof(host)) != cudaSuccess) return;
    FILE *f = fopen(path, "wb");
    if (!f) return;
    int header[5] = {d, FA3C_TRACE_CTAS, FA3C_TRACE_ROLES, FA3C_TRACE_BLOCKS, TR_EVENTS};
    fwrite(header, sizeof(header), 1, f);
    fwrite(host, sizeof(host), 1, f);
    fclose(f);
}
#else
static void trace_clear(cudaStream_t) {}
static void trace_write(cudaStream_t, int) {}
#endif

// Builds with clusters (FA3C_FWD_CLUSTER) launch in clusters of p->cluster
// CTAs (of 1 too, so that the kernel's cluster registers are defined), and a
// persistent grid of no more clusters than fit on the GPU at once (with
// clusters of 2 that may be fewer than SMs / 2; more would run in a second
// wave). The count is looked up once per instance and device.
template <int D, int BLOCK_N, int FP16, bool VARLEN>
static cudaError_t launch_in_clusters(const fa3c_fwd_kernel_params *p, size_t smem, cudaStream_t stream) {
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = (unsigned)p->cluster;
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)p->grid);
    cfg.blockDim = dim3(FA3C_FWD_THREADS(D));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    // Clusters of 2 resident at once, asked once per device: 1 + the count
    // (0: not asked yet), with relaxed atomics (threads racing store the same value).
    enum { DEVICES = 64 };
    static int pairs_that_fit_plus_1[DEVICES];
    int dev = 0;
    if (FA3C_FWD_PERSISTENT && p->cluster == 2 && cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < DEVICES) {
        int cached = __atomic_load_n(&pairs_that_fit_plus_1[dev], __ATOMIC_RELAXED);
        if (cached == 0) {
            int fit = 0;
            if (cudaOccupancyMaxActiveClusters(&fit, fwd_kernel<D, BLOCK_N, FP16, VARLEN>, &cfg) != cudaSuccess) {
                cudaGetLastError();
                fit = 0;
            }
            cached = 1 + (fit > 0 ? fit : 0);
            __atomic_store_n(&pairs_that_fit_plus_1[dev], cached, __ATOMIC_RELAXED);
        }
        const int pairs = cached - 1;
        if (pairs > 0 && 2 * pairs < p->grid) cfg.gridDim = dim3(2u * (unsigned)pairs);
    }
    return cudaLaunchKernelEx(&cfg, fwd_kernel<D, BLOCK_N, FP16, VARLEN>, *p);
}

template <int D, int BLOCK_N, int FP16, bool VARLEN>
static fa3c_status launch_fwd(const fa3c_fwd_kernel_params *p, cudaStream_t stream) {
    size_t smem = fwd_smem_bytes<D, BLOCK_N>();
    // p->grid (fwd_plan.c): persistent, one CTA per SM walks the tiles; else one CTA per tile.
    // The plan (C, fwd_host.c) and the kernel (CUDA) must agree on clusters:
    // a pairing plan on an unpaired kernel would wait for half-loaded tiles.
    if (p->cluster > FA3C_FWD_CLUSTER)
        return fa3c_error(FA3C_STATUS_INTERNAL_ERROR, "forward kernel (hdim %d): the plan pairs CTAs but this instance "
                          "was built without clusters (FA3C_FWD_CLUSTER differs between the C and CUDA flags)", D);
    static int launch_regs = -1;   // one per instance; read and written atomically (prepare_launch)
    fa3c_status s = prepare_launch(fwd_kernel<D, BLOCK_N, FP16, VARLEN>, smem, FA3C_FWD_THREADS(D),
                                   (int)RegBudget<D, VARLEN>::TOTAL, &launch_regs, "forward kernel", D);
    if (s != FA3C_STATUS_OK) return s;
    cudaError_t e;
    trace_clear(stream);
    if (FA3C_FWD_CLUSTER > 1) {
        e = launch_in_clusters<D, BLOCK_N, FP16, VARLEN>(p, smem, stream);
    } else {
        fwd_kernel<D, BLOCK_N, FP16, VARLEN><<<p->grid, FA3C_FWD_THREADS(D), smem, stream>>>(*p);
        e = cudaGetLastError();
    }
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "forward kernel (hdim %d) launch failed: %s", D, cudaGetErrorString(e));
    trace_write(stream, D);
    return FA3C_STATUS_OK;
}

// BLOCK_N: keys per tile (FA3C_FWD_BLOCK_N(D), fwd_tiles.h). VARLEN: 1 for
// the variable-length instance (p->seqused_k; fwd_sm90.cuh). NAME_cluster:
// the most CTAs per cluster this translation unit was built for
// (FA3C_FWD_CLUSTER here), which fwd_host.c's plan reads, so that plan and
// kernel agree by construction.
#define FA3C_FWD_INSTANCE(NAME, D, BLOCK_N, FP16, VARLEN)                                      \
    extern "C" fa3c_status NAME(const fa3c_fwd_kernel_params *p, void *stream) {               \
        return launch_fwd<D, BLOCK_N, FP16, VARLEN>(p, (cudaStream_t)stream);                  \
    }                                                                                          \
    extern "C" const int NAME##_cluster = FA3C_FWD_CLUSTER;
