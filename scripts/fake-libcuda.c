// Build: gcc -O2 -shared -fPIC -o /tmp/fakecuda/libcuda.so.1 scripts/fake-libcuda.c -ldl
// Use:   CUDA_RT_LIBCUDA=/tmp/fakecuda/libcuda.so.1 target/release/examples/hot_paths async
// Minimal fake libcuda for host-side instruction counting: every call succeeds
// and does (almost) nothing.
//
// Like a real 12.x/13.x driver it exports cuGetProcAddress_v2, through which cuda-rt
// resolves every entry point. Two macros make it an older driver, for the loader's
// tests (cuda-sys/tests/loader.rs):
//   -DFAKE_DRIVER_VERSION=11080     what cuDriverGetVersion reports (default 13000)
//   -DFAKE_NO_GET_PROC_ADDRESS      leave cuGetProcAddress_v2 out, as drivers before 12.0
// and one makes its device memory host memory, for the staged copies' byte checks
// without a GPU (cuda-rt/tests/staging.rs):
//   -DFAKE_REAL_MEMORY              cuMemAlloc allocates, copies and memsets are memcpy
//                                   and memset, done at once; streams are dummies
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#ifndef FAKE_DRIVER_VERSION
#define FAKE_DRIVER_VERSION 13000
#endif
typedef int CUresult;
static uint64_t next_ptr = 1ull << 40;
static int ctx_dummy;
CUresult cuInit(unsigned f) { return 0; }
CUresult cuDriverGetVersion(int *v) { *v = FAKE_DRIVER_VERSION; return 0; }
#ifndef FAKE_NO_GET_PROC_ADDRESS
// The fake has one version of each function: `sym` at any ABI version is the newest of
// sym_v3, sym_v2 and sym that this file defines (looked up in this library only).
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    static void *self;
    (void)ver; (void)flags;
    *pfn = 0;
    if (!self) {
        Dl_info info;
        if (!dladdr((void *)cuInit, &info) || !(self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD))) {
            if (status) *status = 1;
            return 500; // CUDA_ERROR_NOT_FOUND
        }
    }
    const char *suffixes[] = {"_v3", "_v2", ""};
    for (int i = 0; i < 3; i++) {
        char name[256];
        snprintf(name, sizeof name, "%s%s", sym, suffixes[i]);
        if ((*pfn = dlsym(self, name))) {
            if (status) *status = 0;
            return 0;
        }
    }
    if (status) *status = 1; // CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
    return 500;
}
#endif
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int o) { *d = o; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { *c = &ctx_dummy; return 0; }
CUresult cuCtxSetCurrent(void *c) { return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = &ctx_dummy; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemAllocAsync(uint64_t *p, size_t n, void *s) { *p = next_ptr; return 0; }
CUresult cuMemFreeAsync(uint64_t p, void *s) { return 0; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) { *p = aligned_alloc(4096, (n + 4095) & ~4095ul); return *p ? 0 : 2; }
CUresult cuMemFreeHost(void *p) { free(p); return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = "fake"; return 0; }
CUresult cuStreamIsCapturing(void *s, int *st) { *st = 0; return 0; }
CUresult cuEventQuery(void *e) { return 0; }
CUresult cuEventSynchronize(void *e) { return 0; }
// Device memory (caching pool) and events (event cache), for `hot_paths pool|event`.
#ifdef FAKE_REAL_MEMORY
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) { void *q = aligned_alloc(4096, (n + 4095) & ~4095ul); *p = (uint64_t)q; return q ? 0 : 2; }
CUresult cuMemFree_v2(uint64_t p) { free((void *)p); return 0; }
CUresult cuMemcpyHtoD_v2(uint64_t d, const void *h, size_t n) { memcpy((void *)d, h, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *h, uint64_t d, size_t n) { memcpy(h, (void *)d, n); return 0; }
CUresult cuMemcpyHtoDAsync_v2(uint64_t d, const void *h, size_t n, void *s) { memcpy((void *)d, h, n); return 0; }
CUresult cuMemcpyDtoHAsync_v2(void *h, uint64_t d, size_t n, void *s) { memcpy(h, (void *)d, n); return 0; }
CUresult cuMemcpyDtoD_v2(uint64_t a, uint64_t b, size_t n) { memcpy((void *)a, (void *)b, n); return 0; }
CUresult cuMemcpyDtoDAsync_v2(uint64_t a, uint64_t b, size_t n, void *s) { memcpy((void *)a, (void *)b, n); return 0; }
CUresult cuMemsetD8_v2(uint64_t d, unsigned char v, size_t n) { memset((void *)d, v, n); return 0; }
CUresult cuMemsetD8Async(uint64_t d, unsigned char v, size_t n, void *s) { memset((void *)d, v, n); return 0; }
static int stream_dummy;
CUresult cuStreamCreate(void **s, unsigned f) { *s = &stream_dummy; return 0; }
CUresult cuStreamCreateWithPriority(void **s, unsigned f, int p) { *s = &stream_dummy; return 0; }
CUresult cuStreamDestroy_v2(void *s) { return 0; }
CUresult cuStreamSynchronize(void *s) { return 0; }
CUresult cuStreamQuery(void *s) { return 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned f) { return 0; }
CUresult cuStreamGetCtx(void *s, void **c) { *c = &ctx_dummy; return 0; }
CUresult cuCtxGetDevice(int *d) { *d = 0; return 0; }
#else
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) { *p = next_ptr; next_ptr += (n + 4095) & ~4095ul; return 0; }
CUresult cuMemFree_v2(uint64_t p) { return 0; }
#endif
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { *b = 1ull << 37; return 0; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 1ull << 36; *t = 1ull << 37; return 0; }
static int ev_dummy;
CUresult cuEventCreate(void **e, unsigned f) { *e = &ev_dummy; return 0; }
CUresult cuEventDestroy_v2(void *e) { return 0; }
CUresult cuEventRecord(void *e, void *s) { return 0; }
// Modules and kernels, for the kernel cache's host-side figures (a loaded "module" is
// a dummy; every name is found). Compute capability 9.0 (attributes 75 and 76).
static int mod_dummy, fn_dummy;
CUresult cuDeviceGetAttribute(int *v, int attr, int d) { *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 132 : 1024; return 0; }
CUresult cuModuleLoadData(void **m, const void *img) { *m = &mod_dummy; return 0; }
CUresult cuModuleUnload(void *m) { return 0; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) { *f = &fn_dummy; return 0; }
CUresult cuModuleLoadDataEx(void **m, const void *img, unsigned n, void *o, void **v) { *m = &mod_dummy; return 0; }
// Launches, for `hot_paths launch|launch_raw`: every kernel takes one 4-byte parameter
// (cuFuncGetParamInfo says CUDA_ERROR_INVALID_VALUE past it, as the real driver does).
CUresult cuFuncGetParamInfo(void *f, size_t i, size_t *off, size_t *size) { if (i >= 1) return 1; *off = 0; *size = 4; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem, void *s, void **params, void **extra) { return 0; }
