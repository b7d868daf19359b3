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

/* What the record callback sets: `bytes` bytes of `mem` to `value`, on the stream it
 * gets; `seen` counts its calls. */
struct fill { curt_memory_t mem; int value; size_t bytes; int seen; };

static int fill_cb(curt_stream_t stream, void *p) {
    struct fill *f = (struct fill *)p;
    f->seen++;
    return curt_memset_async(f->mem, 0, f->value, f->bytes, stream);
}

static int sync_cb(curt_stream_t stream, void *p) {
    (void)p;
    return curt_stream_synchronize(stream); /* not allowed while capturing */
}

static void without_gpu_too(void) {
    curt_memory_t m = NULL;
    curt_stream_t s = NULL;
    curt_event_t e = NULL;
    curt_graph_t g = NULL;
    curt_recorder_t r = NULL;
    curt_recorder_stats_t rs;
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
    CHECK(curt_recorder_create(0, 7, &r) == CURT_ERROR_INVALID_ARGUMENT && HAS("unknown capture mode"), "bad recorder capture mode");
    CHECK(curt_recorder_create(0, CURT_CAPTURE_MODE_THREAD_LOCAL, &r) == CURT_SUCCESS, "recorder without a GPU call");
    CHECK(curt_recorder_stats(r, &rs) == CURT_SUCCESS && rs.capacity == 32 && rs.entries == 0, "recorder statistics");
    CHECK(curt_graph_record(r, "k", 1, NULL, NULL, NULL) == CURT_ERROR_INVALID_ARGUMENT && HAS("fn is NULL"), "NULL record callback");
    CHECK(curt_recorder_destroy(r) == CURT_SUCCESS, "recorder destroy");
    CHECK(curt_recorder_destroy(r) == CURT_ERROR_INVALID_HANDLE, "destroyed recorder handle");
    CHECK(curt_set_allocator(NULL, NULL, NULL) == CURT_ERROR_INVALID_ARGUMENT, "NULL allocator functions");
    CHECK(curt_torch_alloc(0, 0, NULL) == NULL, "torch alloc of 0 bytes is NULL");
    CHECK(curt_torch_alloc(-5, 0, NULL) == NULL && HAS("negative size"), "torch alloc of a negative size says why");
    curt_cupy_free(NULL, (void *)0x1000, 0);
    CHECK(HAS("was not allocated"), "freeing an unknown address is an error, not a crash");
}

/* A recorder whose callback sets memory: recorded once, replayed, updated in place
 * with another buffer and value, a callback error passed through. */
static void with_recorder(void) {
    curt_stream_t s = NULL;
    curt_memory_t a = NULL, b = NULL;
    curt_recorder_t r = NULL;
    curt_recorder_stats_t st;
    unsigned char back[256];
    struct fill f;
    uint64_t key = 42;
    int i, ok_a = 1, ok_b = 1;
    CHECK(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &s) == CURT_SUCCESS, "recorder stream");
    CHECK(curt_malloc(256, s, &a) == CURT_SUCCESS && curt_malloc(256, s, &b) == CURT_SUCCESS, "recorder buffers");
    CHECK(curt_recorder_create(2, CURT_CAPTURE_MODE_THREAD_LOCAL, &r) == CURT_SUCCESS, "recorder");
    f.mem = a; f.value = 5; f.bytes = sizeof back; f.seen = 0;
    CHECK(curt_graph_record(r, &key, sizeof key, s, fill_cb, &f) == CURT_SUCCESS && f.seen == 1, "recorded");
    CHECK(curt_memset_async(a, 0, 0, sizeof back, s) == CURT_SUCCESS, "cleared between launches");
    CHECK(curt_graph_record(r, &key, sizeof key, s, fill_cb, &f) == CURT_SUCCESS && f.seen == 1, "replayed without a callback");
    CHECK(curt_stream_synchronize(s) == CURT_SUCCESS, "recorder sync");
    CHECK(curt_memcpy_dtoh(back, a, 0, sizeof back) == CURT_SUCCESS, "recorder dtoh");
    for (i = 0; i < (int)sizeof back; i++) ok_a &= back[i] == 5;
    CHECK(ok_a, "the replay set the memory again");
    f.mem = b; f.value = 9;
    CHECK(curt_graph_record_update(r, &key, sizeof key, s, fill_cb, &f) == CURT_SUCCESS && f.seen == 2, "updated with another buffer and value");
    CHECK(curt_stream_synchronize(s) == CURT_SUCCESS, "recorder sync after the update");
    CHECK(curt_memcpy_dtoh(back, b, 0, sizeof back) == CURT_SUCCESS, "recorder dtoh after the update");
    for (i = 0; i < (int)sizeof back; i++) ok_b &= back[i] == 9;
    CHECK(ok_b, "the update set the other buffer");
    CHECK(curt_graph_record(r, "sync", 4, s, sync_cb, NULL) != CURT_SUCCESS && HAS("synchronize"), "a synchronize in the callback is its error");
    CHECK(curt_recorder_stats(r, &st) == CURT_SUCCESS, "recorder stats");
    CHECK(st.hits == 1 && st.misses == 1 && st.updates + st.update_fallbacks == 1 && st.failures == 1 && st.entries == 1, "recorder counts");
    CHECK(curt_recorder_destroy(r) == CURT_SUCCESS, "recorder destroyed");
    CHECK(curt_free(a) == CURT_SUCCESS && curt_free(b) == CURT_SUCCESS, "recorder buffers freed");
    CHECK(curt_stream_destroy(s) == CURT_SUCCESS, "recorder stream destroyed");
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
    with_recorder();
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
