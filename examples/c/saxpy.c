/* saxpy from C through cuda-rt: compile with NVRTC (kernel cache), allocate from the
 * pool, copy, launch, check against the host. Build (see the README's "C" section):
 *   cc -std=c99 examples/c/saxpy.c -I. -L target/debug -lcuda_rt_c \
 *      -Wl,-rpath,target/debug -o saxpy
 * (with target/debug/libcuda_rt_c.so.0 a link to libcuda_rt_c.so, the soname).
 * Prints "skipped: <reason>" and exits 0 without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include "wrapper.h"

#define N 4096

static const char *source =
    "extern \"C\" __global__ void saxpy(float a, const float *x, float *y, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) y[i] = a * x[i] + y[i];\n"
    "}\n";

#define TRY(call) do { int rc_ = (call); if (rc_ != CURT_SUCCESS) { \
    fprintf(stderr, "%s failed (%d): %s\n", #call, rc_, curt_last_error()); return 1; } } while (0)

int main(void) {
    static float x[N], y[N];
    const char *options[] = {"-std=c++17"};
    curt_module_t module;
    curt_function_t saxpy;
    curt_memory_t dx, dy;
    uint64_t px, py;
    float a = 3.0f;
    int n = N, i, bad = 0;
    void *args[4];
    curt_dim3 grid = {(N + 255) / 256, 1, 1}, block = {256, 1, 1};

    if (!curt_is_available()) {
        printf("skipped: no GPU (%s)\n", curt_last_error());
        return 0;
    }
    for (i = 0; i < N; i++) { x[i] = (float)i; y[i] = 1.0f; }
    TRY(curt_set_device(0));
    TRY(curt_module_compile(source, options, 1, &module));
    TRY(curt_module_get_function(module, "saxpy", &saxpy));
    /* The handle (for copies and free) and the device address (for the kernel). */
    TRY(curt_malloc_ptr(sizeof x, NULL, &dx, &px));
    TRY(curt_malloc_ptr(sizeof y, NULL, &dy, &py));
    TRY(curt_memcpy_htod(dx, 0, x, sizeof x));
    TRY(curt_memcpy_htod(dy, 0, y, sizeof y));
    args[0] = &a; args[1] = &px; args[2] = &py; args[3] = &n;
    TRY(curt_launch(saxpy, grid, block, 0, NULL, args, 4));
    TRY(curt_memcpy_dtoh(y, dy, 0, sizeof y));
    for (i = 0; i < N; i++) {
        if (y[i] != 3.0f * (float)i + 1.0f) bad++;
    }
    TRY(curt_free(dx));
    TRY(curt_free(dy));
    TRY(curt_function_destroy(saxpy));
    TRY(curt_module_destroy(module));
    printf("saxpy: %d of %d wrong\n", bad, N);
    return bad ? 1 : 0;
}
