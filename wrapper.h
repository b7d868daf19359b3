/* cuda-rt's C ABI. Link with -lcuda_rt_c (libcuda_rt_c.so, built by `cargo build`; its
 * soname is libcuda_rt_c.so.0, the number changing with an incompatible ABI); see the
 * README's "C" section for the compile line, the soname link, pkg-config and CMake.
 *
 * Every function returns CURT_SUCCESS (0) or an error code: a positive CUDA driver
 * code (CUresult) when the driver failed, otherwise one of the negative CURT_ERROR_*
 * codes. After a failure, curt_last_error() gives the message (thread-local, valid until
 * the next failing call on the same thread, or the thread's exit). No function ever
 * unwinds or aborts, wherever it is called from: also from a thread-local or
 * pthread_key_create destructor while a thread exits, or from an atexit handler. Once
 * the thread's storage is torn down (those places), calls still return their codes but
 * record no message, and curt_last_error() returns "".
 *
 * Objects are handles (curt_stream_t, curt_event_t, ...): opaque values looked up in a
 * table, never pointers. NULL, a destroyed handle, one of another kind or a made-up
 * value is CURT_ERROR_INVALID_HANDLE, never a crash, except that curt_free(NULL) and
 * curt_pinned_free(NULL) do nothing and succeed, as C's free(NULL). Where a function takes a
 * curt_stream_t, NULL means the calling thread's current stream of the current device.
 * Out-pointers must be NULL (CURT_ERROR_INVALID_ARGUMENT) or valid; they are written
 * only on success. Strings are NUL-terminated UTF-8. */
#ifndef CUDA_RT_WRAPPER_H
#define CUDA_RT_WRAPPER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header; curt_version() gives the library's, to compare. */
#define CURT_VERSION_MAJOR 0
#define CURT_VERSION_MINOR 1
#define CURT_VERSION_PATCH 0
#define CURT_VERSION (CURT_VERSION_MAJOR * 10000 + CURT_VERSION_MINOR * 100 + CURT_VERSION_PATCH)

#define CURT_SUCCESS 0
#define CURT_ERROR_INVALID_ARGUMENT (-1)
#define CURT_ERROR_NOT_FOUND (-2)
#define CURT_ERROR_OUT_OF_MEMORY (-3)
#define CURT_ERROR_COMPILE (-4)
#define CURT_ERROR_NOT_SUPPORTED (-5)
#define CURT_ERROR_OTHER (-6)
#define CURT_ERROR_INVALID_HANDLE (-7)
#define CURT_ERROR_PANIC (-99)

#define CURT_STREAM_NON_BLOCKING 1
#define CURT_EVENT_BLOCKING_SYNC 1
#define CURT_EVENT_DISABLE_TIMING 2
#define CURT_CAPTURE_MODE_GLOBAL 0
#define CURT_CAPTURE_MODE_THREAD_LOCAL 1
#define CURT_CAPTURE_MODE_RELAXED 2

typedef struct curt_stream_s *curt_stream_t;
typedef struct curt_event_s *curt_event_t;
typedef struct curt_memory_s *curt_memory_t;   /* device memory */
typedef struct curt_pinned_s *curt_pinned_t;   /* pinned host memory */
typedef struct curt_module_s *curt_module_t;
typedef struct curt_function_s *curt_function_t;
typedef struct curt_graph_s *curt_graph_t;
typedef struct curt_recorder_s *curt_recorder_t; /* graph recorder */

/* CUDA's stream type: CUstream (cuda.h) and cudaStream_t (cuda_runtime.h) are both
 * `struct CUstream_st *`, so either passes here without a cast or an include. */
struct CUstream_st;

/* A memory pool's statistics. */
typedef struct curt_pool_stats_t {
    uint64_t used_bytes;       /* handed out */
    uint64_t total_bytes;      /* reserved from the device (or host) */
    uint64_t free_bytes;       /* cached: total - used */
    uint64_t n_free_blocks;    /* cached blocks */
    uint64_t peak_used_bytes;
    uint64_t peak_total_bytes;
    uint64_t mallocs;          /* mallocs served */
    uint64_t frees;            /* blocks given back */
    uint64_t cache_hits;       /* mallocs served from the cache */
    uint64_t cache_misses;     /* mallocs with no cached fit */
    uint64_t backend_allocs;   /* allocations asked of the driver */
    uint64_t backend_frees;    /* allocations given back to the driver */
} curt_pool_stats_t;

/* A launch shape; each extent at least 1. */
typedef struct curt_dim3 {
    unsigned int x, y, z;
} curt_dim3;

/* The library's version, major * 10000 + minor * 100 + patch (CURT_VERSION of the
 * header it was built from), and as text ("0.1.0"; static). */
int curt_version(void);
const char *curt_version_string(void);

/* The name of a status code: "CURT_SUCCESS", "CURT_ERROR_OUT_OF_MEMORY"..., the driver's
 * name ("CUDA_ERROR_ILLEGAL_ADDRESS"...) of a positive CUDA code, or
 * "CURT_ERROR_UNRECOGNIZED". Static, never NULL. */
const char *curt_status_name(int code);

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

/* ---- Devices ---------------------------------------------------------------- */

/* Make device `id` current on this thread. */
int curt_set_device(int id);

/* This thread's current device. */
int curt_get_device(int *id);

/* Block until all work on the current device is done. */
int curt_device_synchronize(void);

/* Free and total memory of device `id`, in bytes. */
int curt_device_mem_info(int id, size_t *free_bytes, size_t *total_bytes);

/* Name of device `id` into `buf` (`len` > 0 bytes), NUL-terminated, cut to fit. */
int curt_device_name(int id, char *buf, size_t len);

/* ---- Device memory ---------------------------------------------------------- */

/* `size` bytes from cuda-rt's caching pool on `stream`'s device, in that stream's
 * arena (reuse without synchronisation follows the stream). Size 0: a null pointer. */
int curt_malloc(size_t size, curt_stream_t stream, curt_memory_t *mem);

/* curt_malloc that also writes the device address to `*ptr` (no curt_memory_ptr call
 * needed; 0 for size 0). */
int curt_malloc_ptr(size_t size, curt_stream_t stream, curt_memory_t *mem, uint64_t *ptr);

/* `size` bytes with the current allocator (curt_set_allocator; the pool by default)
 * on the current device. */
int curt_alloc(size_t size, curt_memory_t *mem);

/* `size` bytes of plain device memory (cuMemAlloc, no pool) on `device`. */
int curt_malloc_device(int device, size_t size, curt_memory_t *mem);

/* `size` bytes of managed (unified) memory on the current device. */
int curt_malloc_managed(size_t size, curt_memory_t *mem);

/* `size` bytes from the driver's stream-ordered pool, ordered on `stream`. */
int curt_malloc_async(size_t size, curt_stream_t stream, curt_memory_t *mem);

/* Free `mem` (back to its pool once queued work using it is done). The handle is dead
 * afterwards; its address must no longer be used. NULL: nothing, CURT_SUCCESS. */
int curt_free(curt_memory_t mem);

/* Device address of `mem` (valid until curt_free). */
int curt_memory_ptr(curt_memory_t mem, uint64_t *ptr);

/* Size of `mem` in bytes. */
int curt_memory_size(curt_memory_t mem, size_t *size);

/* DLPack (v1.x). The structs are dlpack.h's; include dlpack.h before this header to
 * use its own declarations (and all of its enums). */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif
#define CURT_DL_CUDA 2
#define CURT_DL_CUDA_HOST 3
#define CURT_DL_CUDA_MANAGED 13
#define CURT_DLPACK_MAJOR 1
#define CURT_DLPACK_MINOR 1
#define CURT_DLPACK_FLAG_READ_ONLY 1

/* Exports `mem` as a compact row-major tensor of `ndim` extents and `dtype` (whole
 * bytes per element; the shape must fit the memory). The memory stays alive until the
 * consumer calls the tensor's deleter, whatever happens to `mem` meanwhile. */
int curt_memory_to_dlpack(curt_memory_t mem, int32_t ndim, const int64_t *shape,
                          DLDataType dtype, DLManagedTensor **out);
/* The same as a DLManagedTensorVersioned (version 1.1, no flags). */
int curt_memory_to_dlpack_versioned(curt_memory_t mem, int32_t ndim, const int64_t *shape,
                                    DLDataType dtype, DLManagedTensorVersioned **out);
/* Imports a kDLCUDA or kDLCUDAManaged tensor as a handle spanning its elements (strides
 * honoured); curt_free of the handle calls the tensor's deleter once. On error the
 * tensor stays the caller's, its deleter not called. */
int curt_memory_from_dlpack(DLManagedTensor *tensor, curt_memory_t *mem);
/* The same for a DLManagedTensorVersioned: major version 1; read-only tensors refused. */
int curt_memory_from_dlpack_versioned(DLManagedTensorVersioned *tensor, curt_memory_t *mem);

/* Mark `mem` as used by `stream` (NULL: the current stream; PyTorch's record_stream):
 * once freed, its memory is not reused before the work queued on `stream` until the
 * free has completed (an event recorded at the free, polled by the pool; no host
 * synchronisation). Nothing for `mem`'s own stream or for memory that is not pooled. */
int curt_pool_record_stream(curt_memory_t mem, curt_stream_t stream);

/* Statistics of the default pool on `device` (peaks since the last
 * curt_pool_reset_peaks). A device that does not exist (or no usable CUDA) is an error,
 * never zeros. */
int curt_pool_stats(int device, curt_pool_stats_t *stats);

/* Restart the peaks of `device` from now: the default pool's and those of
 * curt_torch_memory_peaks (torch's reset_peak_memory_stats() is refused under a
 * pluggable allocator). */
int curt_pool_reset_peaks(int device);

/* Limit of the default pool per device, in bytes (0: none). Past it, allocation
 * fails with CURT_ERROR_OUT_OF_MEMORY. */
int curt_pool_set_limit(uint64_t bytes);

/* The default pool's limit on the current device (0: none). */
int curt_pool_get_limit(uint64_t *bytes);

/* Release the default pool's cached free blocks to the driver. */
int curt_pool_free_all_blocks(void);

/* The default pool's segments and blocks on `device` as JSON, in the shape of
 * PyTorch's torch.cuda.memory._snapshot() (an error for a device that does not
 * exist). Writes the length (without the NUL) to
 * `*len`, and the text with its NUL to `buf` when `cap` is larger than that; otherwise
 * fails with CURT_ERROR_INVALID_ARGUMENT (call again with `*len + 1` bytes). */
int curt_pool_snapshot_json(int device, char *buf, size_t cap, size_t *len);

/* ---- Pinned host memory ----------------------------------------------------- */

/* `size` bytes of pinned host memory from the default pinned pool. */
int curt_pinned_malloc(size_t size, curt_pinned_t *mem);

/* Free pinned memory (back to the pool once copies using it are done). NULL: nothing,
 * CURT_SUCCESS. */
int curt_pinned_free(curt_pinned_t mem);

/* Host address (valid until curt_pinned_free) and size (`size` may be NULL). */
int curt_pinned_ptr(curt_pinned_t mem, void **ptr, size_t *size);

/* Statistics of the default pinned pool. */
int curt_pinned_pool_stats(curt_pool_stats_t *stats);

/* The default pinned pool's snapshot as JSON, as curt_pool_snapshot_json. */
int curt_pinned_pool_snapshot_json(char *buf, size_t cap, size_t *len);

/* Limit of the default pinned pool in bytes (0: none). */
int curt_pinned_pool_set_limit(uint64_t bytes);

/* Release the default pinned pool's cached free blocks. */
int curt_pinned_pool_free_all_blocks(void);

/* ---- Copies and memset -------------------------------------------------------
 * Device sides are handles plus a byte offset, checked against the allocation
 * (CURT_ERROR_INVALID_ARGUMENT past its end). Host sides are raw addresses: the caller
 * guarantees `bytes` readable (src) or writable (dst) bytes there, untouched by
 * others during the call (bytes 0: may be NULL). The _async forms queue on `stream`;
 * their host buffer is free again when they return (pageable memory is staged). */

int curt_memcpy_htod(curt_memory_t dst, size_t dst_offset, const void *src, size_t bytes);
int curt_memcpy_dtoh(void *dst, curt_memory_t src, size_t src_offset, size_t bytes);
int curt_memcpy_dtod(curt_memory_t dst, size_t dst_offset, curt_memory_t src, size_t src_offset,
                     size_t bytes);
int curt_memcpy_htod_async(curt_memory_t dst, size_t dst_offset, const void *src, size_t bytes,
                           curt_stream_t stream);
int curt_memcpy_dtoh_async(void *dst, curt_memory_t src, size_t src_offset, size_t bytes,
                           curt_stream_t stream);
int curt_memcpy_dtod_async(curt_memory_t dst, size_t dst_offset, curt_memory_t src,
                           size_t src_offset, size_t bytes, curt_stream_t stream);
/* Set `bytes` bytes at `mem` + `offset` to the low 8 bits of `value`. */
int curt_memset(curt_memory_t mem, size_t offset, int value, size_t bytes);
int curt_memset_async(curt_memory_t mem, size_t offset, int value, size_t bytes,
                      curt_stream_t stream);

/* ---- Streams ---------------------------------------------------------------- */

/* A stream on the current device: `flags` 0 or CURT_STREAM_NON_BLOCKING, `priority`
 * (lower is higher; clamped to the device's range). */
int curt_stream_create(int flags, int priority, curt_stream_t *stream);

/* Destroy a stream (queued work still runs). A handle of curt_stream_wrap goes, its
 * CUstream stays. */
int curt_stream_destroy(curt_stream_t stream);

/* The raw CUstream / cudaStream_t of `stream` (NULL: the current stream; 0 is the legacy
 * default stream), to give cuBLAS, NCCL or a <<<>>> launch; valid while the handle is. */
int curt_stream_raw(curt_stream_t stream, struct CUstream_st **raw);

/* A handle that borrows `raw`, a stream of `device` (-1: the current device) made
 * elsewhere (0 and CU_STREAM_PER_THREAD are the default streams). Destroying the handle
 * does not destroy `raw`: its owner keeps it alive as long as the handle is used, and as
 * long as any memory that was allocated on it, or used on it (an _async call, a recorded
 * stream), is not freed; and destroys it only once the work queued on it is done. The
 * pool keys its cache by stream handle, and the driver may give a destroyed stream's
 * handle to the next stream at once: memory freed onto a stream destroyed with work
 * still queued could go to the new stream under that work. (Streams of
 * curt_stream_create are kept by cuda-rt until their work is done.) */
int curt_stream_wrap(struct CUstream_st *raw, int device, curt_stream_t *stream);

/* Block until the work queued on `stream` is done. */
int curt_stream_synchronize(curt_stream_t stream);

/* *done = 1 when the work queued on `stream` is done, else 0. */
int curt_stream_query(curt_stream_t stream, int *done);

/* Work queued on `stream` after this waits for `event`'s last record. */
int curt_stream_wait_event(curt_stream_t stream, curt_event_t event);

/* Run fn(user_data) once, on a driver thread, after the work queued before it on
 * `stream`; later work waits for it. `fn` must not call CUDA or cuda-rt; `user_data`
 * must stay valid until it has run. Refused while the stream captures a graph. */
int curt_stream_launch_host_func(curt_stream_t stream, void (*fn)(void *user_data),
                                 void *user_data);

/* ---- Events ----------------------------------------------------------------- */

/* An event on the current device; `flags` a mix of CURT_EVENT_*, or 0. */
int curt_event_create(int flags, curt_event_t *event);

/* Destroy an event. */
int curt_event_destroy(curt_event_t event);

/* Record `event` on `stream`. */
int curt_event_record(curt_event_t event, curt_stream_t stream);

/* *done = 1 when the work before the last record is done, else 0. */
int curt_event_query(curt_event_t event, int *done);

/* Block until the work before the last record is done. */
int curt_event_synchronize(curt_event_t event);

/* Milliseconds between two completed records (both events with timing). */
int curt_event_elapsed_time(curt_event_t start, curt_event_t end, float *ms);

/* ---- Modules, NVRTC and launch ---------------------------------------------- */

/* Load a PTX, cubin or fatbin file on the current device. */
int curt_module_load_file(const char *path, curt_module_t *module);

/* Load an image of `size` bytes (PTX NUL-terminated, cubin, fatbin). */
int curt_module_load_data(const void *image, size_t size, curt_module_t *module);

/* Compile CUDA C++ `source` with NVRTC for the current device with `n_options`
 * options, through cuda-rt's kernel cache, and load it. A compile error is
 * CURT_ERROR_COMPILE with the log in curt_last_error(). */
int curt_module_compile(const char *source, const char *const *options, size_t n_options,
                        curt_module_t *module);

/* Destroy a module handle (functions from it keep the module loaded). */
int curt_module_destroy(curt_module_t module);

/* The kernel `name` (extern "C" name or mangled name) of `module`. */
int curt_module_get_function(curt_module_t module, const char *name,
                             curt_function_t *function);

/* Destroy a function handle. */
int curt_function_destroy(curt_function_t function);

/* Launch `function` on `stream` with `grid` x `block` threads and `shared_mem` bytes of
 * dynamic shared memory. The caller guarantees: `args` holds `n_args` pointers (one
 * per kernel parameter; the count is checked where the driver tells it), args[i]
 * points to a value of the i-th parameter's type, and every address the kernel uses
 * stays allocated until it has run (a kernel can do anything device memory allows).
 * Launched into a capture begun with curt_stream_begin_capture (or a graph recorder),
 * the graph keeps the function's module loaded: its handles may be destroyed once the
 * capture ends. In a capture begun with the raw driver (cuStreamBeginCapture), the
 * module must stay loaded (a module or function handle kept) until the graph's last
 * launch has run. */
int curt_launch(curt_function_t function, curt_dim3 grid, curt_dim3 block,
                unsigned int shared_mem, curt_stream_t stream, void **args, size_t n_args);

/* ---- Graphs ----------------------------------------------------------------- */

/* Begin capturing `stream`'s work (not the legacy default stream), in a
 * CURT_CAPTURE_MODE_*. */
int curt_stream_begin_capture(curt_stream_t stream, int mode);

/* End the capture; *graph is the captured graph, instantiated. */
int curt_stream_end_capture(curt_stream_t stream, curt_graph_t *graph);

/* Re-instantiate `graph` with `flags` (CUgraphInstantiate_flags bits). */
int curt_graph_instantiate(curt_graph_t graph, uint64_t flags);

/* Launch `graph` on `stream`. */
int curt_graph_launch(curt_graph_t graph, curt_stream_t stream);

/* Destroy a graph (queued launches still run). */
int curt_graph_destroy(curt_graph_t graph);

/* ---- Graph recorders ----------------------------------------------------------
 * Record once, replay cheaply, update in place: a callback that queues work on a
 * stream is captured into a graph the first time its key is seen, and the executable
 * is launched again on later calls with that key, without calling the callback. Keys
 * are byte strings (`key_len` bytes at `key`; NULL with 0 is the empty key; a
 * uint64_t key is its 8 bytes); make them of whatever shapes the work (sizes, which
 * buffers). The least recently used executables go beyond the recorder's capacity.
 *
 * The callback runs on the calling thread, once per capture, with `stream` a handle to
 * the recorder's capture stream (valid during the callback; also the thread's current
 * stream then, so NULL works too). It queues work there and returns CURT_SUCCESS, or an
 * error code: the record call then returns that code, with the thread's last error
 * message at the callback's return, and nothing is cached or launched. A call a
 * capture refuses (a synchronous copy, a synchronize) fails inside the callback with
 * its own message; the capture is ended and thrown away either way. A kernel the
 * callback launches runs again at every replay: every address it uses must stay valid
 * for as long as the recorder holds the executable. The callback must not call the
 * same recorder (CURT_ERROR_OTHER). One call at a time per recorder: calls from other
 * threads wait. */

/* The callback of curt_graph_record. */
typedef int (*curt_record_fn)(curt_stream_t stream, void *user_data);

/* A recorder's statistics. */
typedef struct curt_recorder_stats_t {
    uint64_t hits;             /* calls that replayed the key's executable */
    uint64_t misses;           /* calls that recorded a new one */
    uint64_t captures;         /* callbacks captured (misses and updates) */
    uint64_t instantiations;   /* executables made (misses and refused updates) */
    uint64_t updates;          /* executables updated in place */
    uint64_t update_fallbacks; /* updates refused, replaced by a new instantiation */
    uint64_t evictions;        /* executables evicted beyond the capacity */
    uint64_t failures;         /* calls that failed: nothing cached */
    uint64_t entries;          /* executables cached now */
    uint64_t capacity;         /* executables kept at most */
} curt_recorder_stats_t;

/* A recorder keeping up to `capacity` executables (0: 32), capturing in `mode` (a
 * CURT_CAPTURE_MODE_*; THREAD_LOCAL is the usual choice). */
int curt_recorder_create(size_t capacity, int mode, curt_recorder_t *recorder);

/* Destroy a recorder: what its executables kept alive goes once their launches are
 * done (waited for here). */
int curt_recorder_destroy(curt_recorder_t recorder);

/* Launch the executable recorded for the key on `stream` (NULL: the current stream),
 * first recording fn(capture stream, user_data) when there is none. */
int curt_graph_record(curt_recorder_t recorder, const void *key, size_t key_len,
                      curt_stream_t stream, curt_record_fn fn, void *user_data);

/* Record fn again and launch it as the key's recording: the executable is updated in
 * place when only kernel arguments and other parameters changed (other buffers of the
 * same sizes, other scalars), else replaced by a new instantiation (counted in
 * update_fallbacks). Launches queued before keep their parameters. When the recording
 * is only kernels launched one after another with curt_launch (and the driver reports
 * their parameter sizes, CUDA 12.4+), the update sets the changed kernels' arguments
 * without capturing them (not counted in captures); fn may then be called twice in
 * one update when it queues anything else (it queues work only: nothing runs twice). */
int curt_graph_record_update(curt_recorder_t recorder, const void *key, size_t key_len,
                             curt_stream_t stream, curt_record_fn fn, void *user_data);

/* Drop the key's executable; *removed = 1 if there was one, else 0. */
int curt_recorder_remove(curt_recorder_t recorder, const void *key, size_t key_len,
                         int *removed);

/* The recorder's statistics. */
int curt_recorder_stats(curt_recorder_t recorder, curt_recorder_stats_t *stats);

/* ---- Allocators --------------------------------------------------------------- */

/* Make malloc_fn(ctx, size, device) / free_fn(ctx, ptr, device) the process-wide allocator
 * of curt_alloc. Both may be called from any thread with `ctx` for as long as memory
 * from them lives; a non-zero malloc result must be `size` bytes of `device` memory,
 * valid until free; 0 means failure. Refused inside a scoped allocator. */
int curt_set_allocator(uint64_t (*malloc_fn)(void *ctx, size_t size, int device),
                       void (*free_fn)(void *ctx, uint64_t ptr, int device), void *ctx);

/* Make the default pool the process-wide allocator again. */
int curt_reset_allocator(void);

/* Drop-in allocators: memory from cuda-rt's pool for `device`, kept in a registry by
 * address until freed. On failure they return NULL and curt_last_error() says why
 * (out of memory with the pool's figures, a bad device, a negative size); they never
 * return NULL silently for a non-zero size. Size 0 returns NULL with no error. The
 * free functions ignore NULL, and record an error (no crash) for an unknown address. */

/* PyTorch CUDAPluggableAllocator alloc: on `stream`'s arena (a cudaStream_t/CUstream
 * of `device`, or 0). The caller guarantees the stream stays alive until the memory is
 * freed, and that a stream whose arena got memory is destroyed only once its queued
 * work is done (see curt_stream_wrap: the arenas of the drop-in allocators are keyed by
 * stream handle, as PyTorch's and CuPy's own are; PyTorch's pool streams are never
 * destroyed). In a process where PyTorch's libc10.so is loaded, a failure is thrown instead
 * of returning NULL, since PyTorch does not check for NULL: out of memory as PyTorch's
 * c10::OutOfMemoryError (Python's torch.cuda.OutOfMemoryError, "CUDA out of memory.
 * Tried to allocate ..."), anything else as c10::Error (a RuntimeError with cuda-rt's
 * message). */
void *curt_torch_alloc(ssize_t size, int device, void *stream);
/* PyTorch CUDAPluggableAllocator free. */
void curt_torch_free(void *ptr, ssize_t size, int device, void *stream);
/* `size` bytes on the arena of `stream` (0: the legacy default stream) of `device`;
 * NULL and curt_last_error() on failure, never thrown. Free with curt_cupy_free. */
void *curt_dropin_alloc(size_t size, int device, void *stream);
/* PyTorch CUDAPluggableAllocator record_stream hook: memory of curt_torch_alloc at `ptr`
 * is used by `stream` (a cudaStream_t of its device, or 0, alive until the memory is
 * freed): once freed it is reused only after `stream`'s work up to the free. */
void curt_torch_record_stream(void *ptr, void *stream);
/* What curt_cupy_malloc's `param` may point to (python/cuda_rt_alloc.py fills one):
 * how to read CuPy's current stream and how to raise a Python exception, both called
 * with the GIL held, as CuPy calls its allocator. */
typedef struct curt_cupy_param {
    /* CuPy's C API get_current_stream_ptr: the current cudaStream_t, or -1 with a
     * Python exception set. NULL: cuda-rt's current stream. */
    intptr_t (*current_stream)(void);
    /* PyErr_SetString: sets the exception a failed allocation raises. NULL: none. */
    void (*set_error)(void *exception_type, const char *message);
    void *out_of_memory; /* the exception type (PyObject*) for an out-of-memory */
    void *error;         /* the exception type for any other failure */
} curt_cupy_param_t;
/* CuPy CFunctionAllocator malloc: on the arena of CuPy's current stream when `param`
 * (a curt_cupy_param_t, or NULL) says how to read it, else of cuda-rt's current stream
 * of `device`. On failure the exception of `param` is set and (void*)-1 returned, the
 * value after which CuPy's Cython code raises it (NULL where none was set). */
void *curt_cupy_malloc(void *param, size_t size, int device);
/* CuPy CFunctionAllocator free. */
void curt_cupy_free(void *param, void *ptr, int device);
/* Number of live drop-in allocations. */
int curt_dropin_live_count(size_t *count);

/* PyTorch's other CUDAPluggableAllocator hooks (python/cuda_rt_alloc.py sets them).
 * CUDA graphs: between begin and end, allocations on a capturing stream of `device` come
 * from a private pool per mempool id (id0, id1), kept until released as often as begun;
 * `filter` (a std::function*) is not called: the driver's capture status decides. */
void curt_torch_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1, void *filter);
/* Closes the allocation window of mempool (id0, id1). */
void curt_torch_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1);
/* A graph using mempool (id0, id1) was reset: the pool goes once released by every graph. */
void curt_torch_release_pool(int device, uint64_t id0, uint64_t id1);
/* Bytes reserved now by the private graph pools of `device`. */
int curt_torch_graph_pools_reserved(int device, uint64_t *bytes);
/* Peak bytes in use and reserved on `device` by the default pool and the private graph
 * pools together (what torch's max_memory_allocated / max_memory_reserved count),
 * since the last curt_pool_reset_peaks. */
int curt_torch_memory_peaks(int device, uint64_t *peak_used, uint64_t *peak_reserved);
/* torch.cuda.empty_cache(): every device's cached blocks back to the driver. */
void curt_torch_empty_cache(void);
/* torch.cuda.set_per_process_memory_fraction(fraction, device): the pool's limit on
 * `device`; a bad fraction is thrown into PyTorch when loaded, else curt_last_error(). */
void curt_torch_set_memory_fraction(double fraction, int device);

#ifdef __cplusplus
}
#endif

#endif /* CUDA_RT_WRAPPER_H */
