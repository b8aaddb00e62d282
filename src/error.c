/* Status strings, version, parameter defaults and the per-thread detailed
 * error message behind fa3c_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"

/* Per thread so concurrent callers never see each other's messages; sized
 * for a message that quotes a parameter name and a few numbers. */
#define FA3C_ERROR_CAPACITY 1024
static _Thread_local char error_message[FA3C_ERROR_CAPACITY];

fa3c_status fa3c_error(fa3c_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    /* vsnprintf truncates and always terminates; a long message is cut, never overflows. */
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return s;
}

void fa3c_clear_error(void) { error_message[0] = '\0'; }

const char *fa3c_last_error(void) { return error_message; }

const char *fa3c_status_string(fa3c_status s) {
    switch (s) {
    case FA3C_STATUS_OK: return "ok";
    case FA3C_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case FA3C_STATUS_NOT_SUPPORTED: return "not supported";
    case FA3C_STATUS_OUT_OF_MEMORY: return "out of memory";
    case FA3C_STATUS_NO_DEVICE: return "no usable CUDA device";
    case FA3C_STATUS_CUDA_ERROR: return "CUDA error";
    case FA3C_STATUS_INTERNAL_ERROR: return "internal error";
    }
    return "unknown status"; /* values from a newer header or garbage */
}

#define FA3C_STR2(x) #x
#define FA3C_STR(x) FA3C_STR2(x)
const char *fa3c_version(void) {
    return FA3C_STR(FA3C_VERSION_MAJOR) "." FA3C_STR(FA3C_VERSION_MINOR) "." FA3C_STR(FA3C_VERSION_PATCH);
}

static void problem_init(fa3c_problem *pr) {
    memset(pr, 0, sizeof *pr);
    pr->dtype = FA3C_DTYPE_BF16;
    pr->window_left = -1; /* zero would mean a window of width 0, not "none" */
    pr->window_right = -1;
}

void fa3c_fwd_params_init(fa3c_fwd_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    problem_init(&p->problem);
    p->backend = FA3C_BACKEND_AUTO;
}

void fa3c_bwd_params_init(fa3c_bwd_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    problem_init(&p->problem);
    p->backend = FA3C_BACKEND_AUTO;
}

void fa3c_quantize_params_init(fa3c_quantize_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->dtype = FA3C_DTYPE_BF16;
    p->backend = FA3C_BACKEND_AUTO;
}

void fa3c_append_params_init(fa3c_append_params *p) {
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->dtype = FA3C_DTYPE_BF16;
    p->backend = FA3C_BACKEND_AUTO;
}
