/* See device_mem.h. The CUDA runtime's C API is plain C, so this file is
 * compiled by the C compiler in both variants. */
#include "device_mem.h"

#ifdef FA3C_RUN_CUDA
#include <cuda_runtime_api.h>

static cudaError_t last = cudaSuccess;
static cudaEvent_t ev_start, ev_stop;
static int events_ready;

static int ok(cudaError_t e) {
    if (e != cudaSuccess) last = e;
    return e == cudaSuccess;
}

int dm_compiled(void) { return 1; }

void *dm_alloc(size_t bytes) {
    void *p = NULL;
    return ok(cudaMalloc(&p, bytes ? bytes : 1)) ? p : NULL;
}

void dm_free(void *ptr) {
    if (ptr) cudaFree(ptr);
}

int dm_upload(void *dst, const void *src, size_t bytes) {
    return ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice)) ? 0 : -1;
}

int dm_download(void *dst, const void *src, size_t bytes) {
    return ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost)) ? 0 : -1;
}

int dm_fill(void *dst, int byte, size_t bytes) {
    return ok(cudaMemset(dst, byte, bytes)) && ok(cudaDeviceSynchronize()) ? 0 : -1;
}

int dm_timer_start(void) {
    if (!events_ready) {
        if (!ok(cudaEventCreate(&ev_start)) || !ok(cudaEventCreate(&ev_stop))) return -1;
        events_ready = 1;
    }
    return ok(cudaEventRecord(ev_start, 0)) ? 0 : -1;
}

double dm_timer_stop_ms(void) {
    float ms = 0;
    if (!ok(cudaEventRecord(ev_stop, 0)) || !ok(cudaEventSynchronize(ev_stop)) ||
        !ok(cudaEventElapsedTime(&ms, ev_start, ev_stop)))
        return -1;
    return ms;
}

const char *dm_error(void) { return cudaGetErrorString(last); }

#else /* no CUDA runtime: there is never a device */

int dm_compiled(void) { return 0; }
void *dm_alloc(size_t bytes) { (void)bytes; return NULL; }
void dm_free(void *ptr) { (void)ptr; }
int dm_upload(void *dst, const void *src, size_t bytes) { (void)dst; (void)src; (void)bytes; return -1; }
int dm_download(void *dst, const void *src, size_t bytes) { (void)dst; (void)src; (void)bytes; return -1; }
int dm_fill(void *dst, int byte, size_t bytes) { (void)dst; (void)byte; (void)bytes; return -1; }
int dm_timer_start(void) { return -1; }
double dm_timer_stop_ms(void) { return -1; }
const char *dm_error(void) { return "fa3c-run was built without the CUDA runtime"; }

#endif
