/* Device memory for fa3c-run, behind a tiny interface so the CLI itself
 * needs no CUDA header. device_mem.c implements it with the CUDA runtime
 * when built with FA3C_RUN_CUDA, and as a stub that has no device otherwise. */
#ifndef FA3C_RUN_DEVICE_MEM_H
#define FA3C_RUN_DEVICE_MEM_H

#include <stddef.h>

int dm_compiled(void);                                   /* 1 if built against the CUDA runtime */
void *dm_alloc(size_t bytes);                            /* NULL on failure: see dm_error() */
void dm_free(void *ptr);
int dm_upload(void *dst, const void *src, size_t bytes); /* 0 on success */
int dm_download(void *dst, const void *src, size_t bytes);
int dm_fill(void *dst, int byte, size_t bytes);          /* poison device outputs */
int dm_timer_start(void);                                /* event timing on the default stream */
double dm_timer_stop_ms(void);                           /* waits for the work; < 0 on error */
const char *dm_error(void);                              /* the last failure, for messages */

#endif
