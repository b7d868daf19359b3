/* The C API from C: every error path without a GPU (NULL out-pointers, NULL and
 * made-up handles, bad flags, the drop-in allocators), and with one a round trip
 * through the pool, streams, events, a host callback and a destroyed handle. Prints
 * one line per check; "C API PASSED" last, exit 0. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "../../wrapper.h"

static int failures = 0;
#define CHECK(cond, what) do { if (!(cond)) { printf("FAIL %s (%s)\n", what, curt_last_error()); failures++; } else { printf("ok   %s\n", what); } } while (0)
#define HAS(text) (strstr(curt_last_error(), text) != NULL)

static void bump(void *p) { ++*(volatile int *)p; }

static void without_gpu_too(void) {
    curt_memory_t m = NULL;
    curt_stream_t s = NULL;
    curt_event_t e = NULL;
    curt_graph_t g = NULL;
    CHECK(curt_malloc(16, NULL, NULL) == CURT_ERROR_INVALID_ARGUMENT && HAS("mem is NULL"), "curt_malloc NULL out-pointer");
    CHECK(curt_stream_create(0, 0, NULL) == CURT_ERROR_INVALID_ARGUMENT && HAS("stream is NULL"), "curt_stream_create NULL out-pointer");
    CHECK(curt_stream_create(99, 0, &s) == CURT_ERROR_INVALID_ARGUMENT && HAS("unknown stream flags"), "bad stream flags");
    CHECK(curt_event_create(0, NULL) == CURT_ERROR_INVALID_ARGUMENT, "curt_event_create NULL out-pointer");
    CHECK(curt_module_compile(NULL, NULL, 0, NULL) == CURT_ERROR_INVALID_ARGUMENT, "curt_module_compile NULLs");
    CHECK(curt_free(NULL) == CURT_ERROR_INVALID_HANDLE && HAS("memory handle is NULL"), "curt_free(NULL)");
    m = (curt_memory_t)(uintptr_t)0x0300000100000001ull;
    CHECK(curt_free(m) == CURT_ERROR_INVALID_HANDLE && HAS("invalid memory handle"), "made-up memory handle");
    CHECK(curt_stream_destroy((curt_stream_t)(uintptr_t)42) == CURT_ERROR_INVALID_HANDLE, "made-up stream handle");
    CHECK(curt_event_destroy(e) == CURT_ERROR_INVALID_HANDLE, "NULL event handle");
    CHECK(curt_graph_destroy(g) == CURT_ERROR_INVALID_HANDLE, "NULL graph handle");
    CHECK(curt_set_allocator(NULL, NULL, NULL) == CURT_ERROR_INVALID_ARGUMENT, "NULL allocator functions");
    CHECK(curt_torch_alloc(0, 0, NULL) == NULL, "torch alloc of 0 bytes is NULL");
    CHECK(curt_torch_alloc(-5, 0, NULL) == NULL && HAS("negative size"), "torch alloc of a negative size says why");
    curt_cupy_free(NULL, (void *)0x1000, 0);
    CHECK(HAS("was not allocated"), "freeing an unknown address is an error, not a crash");
}

static void with_gpu(void) {
    curt_stream_t s = NULL;
    curt_memory_t a = NULL, b = NULL;
    curt_event_t e0 = NULL, e1 = NULL;
    unsigned char host[4096], back[4096];
    int i, done = 0, hits = 0;
    float ms = -1.0f;
    curt_pool_stats_t st;
    for (i = 0; i < 4096; i++) host[i] = (unsigned char)i;
    CHECK(curt_set_device(0) == CURT_SUCCESS, "set device 0");
    CHECK(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &s) == CURT_SUCCESS, "stream");
    CHECK(curt_malloc(4096, s, &a) == CURT_SUCCESS, "pool malloc on a stream");
    CHECK(curt_malloc_async(4096, s, &b) == CURT_SUCCESS, "stream-ordered malloc");
    CHECK(curt_pool_stats(0, &st) == CURT_SUCCESS && st.used_bytes >= 4096, "pool statistics");
    CHECK(curt_event_create(0, &e0) == CURT_SUCCESS && curt_event_create(0, &e1) == CURT_SUCCESS, "events");
    CHECK(curt_event_record(e0, s) == CURT_SUCCESS, "record");
    CHECK(curt_memcpy_htod_async(a, 0, host, sizeof host, s) == CURT_SUCCESS, "htod async");
    CHECK(curt_memcpy_dtod_async(b, 0, a, 0, sizeof host, s) == CURT_SUCCESS, "dtod async");
    CHECK(curt_memset_async(b, 100, 0xab, 50, s) == CURT_SUCCESS, "memset async");
    CHECK(curt_stream_launch_host_func(s, bump, &hits) == CURT_SUCCESS, "host callback");
    CHECK(curt_event_record(e1, s) == CURT_SUCCESS, "record again");
    CHECK(curt_event_synchronize(e1) == CURT_SUCCESS, "event synchronize");
    CHECK(curt_event_query(e1, &done) == CURT_SUCCESS && done == 1, "event query");
    CHECK(curt_event_elapsed_time(e0, e1, &ms) == CURT_SUCCESS && ms >= 0.0f, "elapsed time");
    CHECK(curt_stream_synchronize(s) == CURT_SUCCESS && hits == 1, "callback ran once");
    CHECK(curt_memcpy_dtoh(back, b, 0, sizeof back) == CURT_SUCCESS, "dtoh");
    memset(host + 100, 0xab, 50);
    CHECK(memcmp(host, back, sizeof back) == 0, "bytes round-trip with the memset");
    CHECK(curt_memset(a, 4000, 0, 200) == CURT_ERROR_INVALID_ARGUMENT, "memset past the end is refused");
    CHECK(curt_free(a) == CURT_SUCCESS && curt_free(b) == CURT_SUCCESS, "free");
    CHECK(curt_free(a) == CURT_ERROR_INVALID_HANDLE, "double free is an invalid handle");
    CHECK(curt_event_destroy(e0) == CURT_SUCCESS && curt_event_destroy(e1) == CURT_SUCCESS, "event destroy");
    CHECK(curt_stream_destroy(s) == CURT_SUCCESS, "stream destroy");
    CHECK(curt_stream_synchronize(s) == CURT_ERROR_INVALID_HANDLE, "destroyed stream is an invalid handle");
}

int main(void) {
    without_gpu_too();
    if (curt_is_available()) {
        with_gpu();
    } else {
        printf("info no GPU: %s\n", curt_last_error());
    }
    printf("%s\n", failures ? "C API FAILED" : "C API PASSED");
    return failures ? 1 : 0;
}
