/* cuda-rt's C ABI. Link with -lcuda_rt_c (libcuda_rt_c.so, built by `cargo build`).
 *
 * Every function returns CURT_SUCCESS (0) or an error code: a positive CUDA driver
 * code (CUresult) when the driver failed, otherwise one of the negative CURT_ERROR_*
 * codes. After a failure, curt_last_error() gives the message (thread-local, valid until
 * the next failing call on the same thread, or the thread's exit). No function ever
 * unwinds or aborts, wherever it is called from: also from a thread-local or
 * pthread_key_create destructor while a thread exits, or from an atexit handler. Once
 * the thread's storage is torn down (those places), calls still return their codes but
 * record no message, and curt_last_error() returns "". */
#ifndef CUDA_RT_WRAPPER_H
#define CUDA_RT_WRAPPER_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CURT_SUCCESS 0
#define CURT_ERROR_INVALID_ARGUMENT (-1)
#define CURT_ERROR_NOT_FOUND (-2)
#define CURT_ERROR_OUT_OF_MEMORY (-3)
#define CURT_ERROR_COMPILE (-4)
#define CURT_ERROR_NOT_SUPPORTED (-5)
#define CURT_ERROR_OTHER (-6)
#define CURT_ERROR_PANIC (-99)

/* The last error message on this thread ("" if none, or once the thread's storage is
 * torn down). Never NULL. */
const char *curt_last_error(void);

/* 1 if CUDA is usable, else 0 (the reason is in curt_last_error()). */
int curt_is_available(void);

/* Number of CUDA devices. */
int curt_device_count(int *count);

/* The driver's CUDA version, e.g. 13000 for 13.0. */
int curt_driver_version(int *version);

/* Compute capability of device `id`. */
int curt_device_compute_capability(int id, int *major, int *minor);

/* Total memory of device `id`, in bytes. */
int curt_device_total_memory(int id, size_t *bytes);

#ifdef __cplusplus
}
#endif

#endif /* CUDA_RT_WRAPPER_H */
