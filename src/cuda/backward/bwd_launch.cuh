// Launch of one backward instance; each instance file that sources.cmake
// writes expands FA3C_BWD_INSTANCE once, so every kernel is its own
// translation unit.
#pragma once
#include <cuda_runtime.h>
#include "bwd_sm90.cuh"
#include "bwd_wide_sm90.cuh"
#include "backend.h"
#include "launch_check.cuh"

// DV: v's head dim the kernel is built for (D, or 128 at D = 192: MLA
// prefill, whose v and dO tiles are then 128 columns wide, not padded to 192).
template <int D, int FP16, int DV = D>
static fa3c_status launch_bwd(const fa3c_bwd_kernel_params *p, cudaStream_t stream) {
    // Head dims 64-128: bwd_sm90.cuh's kernel; 192 and 256: bwd_wide_sm90.cuh's.
    static_assert(DV == D || D > 128, "a value head dim of its own: the wide kernel only");
    void (*kernel)(fa3c_bwd_kernel_params);
    size_t smem;
    // The host's query block (FA3C_BWD_CALL_BLOCK_M): the instance's own, or at
    // hdim 128 with FA3C_BWD_HDIM128_SHORT_M64 64 rows for short calls; at 80
    // rows with the unmasked steps (or FA3C_BWD_HDIM128_SPLIT_FORMS) the
    // softcap form is a kernel of its own (bwd_kernel's FORM).
    const int block_m = p->num_m_blocks > 0 ? p->rows_pad / p->num_m_blocks : 0;
    constexpr bool SHORT_M64 = D == 128 && FA3C_BWD_HDIM128_SHORT_M64 && FA3C_BWD_BLOCK_M(128) != 64;
    const bool m64 = SHORT_M64 && block_m == 64, softcap = p->softcap != 0.f;
    // One launch-register record per kernel; read and written atomically (prepare_launch).
    static int regs_main = -1, regs_softcap = -1, regs_m64 = -1;
    int *regs = &regs_main;
    if constexpr (D > 128) {
        kernel = bwd_wide_kernel<D, FP16, DV>, smem = bwd_wide_smem_bytes<D, DV>();
    } else {
        smem = bwd_smem_bytes<D>();
        if constexpr (FA3C_BWD_BLOCK_M(D) == 80 && (FA3C_BWD_UNMASKED_STEPS(D) || FA3C_BWD_HDIM128_SPLIT_FORMS)) {
            kernel = bwd_kernel<D, FP16, 80, BWD_PLAIN>;
            if (softcap) kernel = bwd_kernel<D, FP16, 80, BWD_SOFTCAP>, regs = &regs_softcap;
        } else {
            kernel = bwd_kernel<D, FP16>;
        }
        if constexpr (SHORT_M64)
            if (m64) kernel = bwd_kernel<D, FP16, 64>, smem = bwd_smem_bytes<D, 64>(), regs = &regs_m64;
    }
    const int budget = 128 * FA3C_BWD_PRODUCER_REGS + 128 * FA3C_BWD_CONSUMERS * FA3C_BWD_CONSUMER_REGS;
    // The host (C flags) and this kernel (CUDA flags) must agree on the knobs
    // that shape the work: a build that splits them would hang or write past dk.
    if ((block_m != FA3C_BWD_BLOCK_M(D) && !(SHORT_M64 && block_m == 64)) ||
        p->num_m_blocks * block_m != p->rows_pad || p->block_n != FA3C_BWD_BLOCK_N(D) ||
        p->num_n_blocks != (p->seqlen_k + FA3C_BWD_BLOCK_N(D) - 1) / FA3C_BWD_BLOCK_N(D) || p->section < 1 ||
        FA3C_BWD_KERNEL_HEADDIM(p->headdim > p->headdim_v ? p->headdim : p->headdim_v) != D || p->headdim_v > DV)
        return fa3c_error(FA3C_STATUS_INTERNAL_ERROR, "backward kernel (hdim %d, v %d): the host planned %d-row query "
                          "blocks and %d-key CTAs of head dims %d / %d; this kernel was built for %d rows and %d keys "
                          "(FA3C_BWD_* knobs differ between the C and CUDA flags)", D, DV,
                          p->rows_pad / (p->num_m_blocks > 0 ? p->num_m_blocks : 1), p->block_n, p->headdim,
                          p->headdim_v, FA3C_BWD_BLOCK_M(D), FA3C_BWD_BLOCK_N(D));
    fa3c_status s = prepare_launch(kernel, smem, FA3C_BWD_THREADS, budget, regs, "backward kernel", D);
    if (s != FA3C_STATUS_OK) return s;
    const dim3 grid((unsigned)((int64_t)p->num_n_blocks * p->heads_kv * p->batch));   // < 2^31: checked by the host
    kernel<<<grid, FA3C_BWD_THREADS, smem, stream>>>(*p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return fa3c_error(FA3C_STATUS_CUDA_ERROR, "backward kernel (hdim %d) launch failed: %s", D, cudaGetErrorString(e));
    return FA3C_STATUS_OK;
}

#define FA3C_BWD_INSTANCE(NAME, D, FP16, DV)                                                   \
    extern "C" fa3c_status NAME(const fa3c_bwd_kernel_params *p, void *stream) {               \
        return launch_bwd<D, FP16, DV>(p, (cudaStream_t)stream);                               \
    }
