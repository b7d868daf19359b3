/* The C API from C, compiled as strict C99 (-std=c99 -pedantic -Werror): every error
 * path without a GPU (NULL out-pointers, NULL and made-up handles, bad flags, the
 * drop-in allocators), status names, the version, free(NULL), statistics of devices
 * that do not exist, raw streams in and out; and with a GPU a round trip through the
 * pool, streams (raw and wrapped), events, a host callback, peaks and a destroyed
 * handle. Prints one line per check; "C API PASSED" last, exit 0. */
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
    CHECK(curt_free(NULL) == CURT_SUCCESS, "curt_free(NULL) is a no-op, as free(NULL)");
    CHECK(curt_pinned_free(NULL) == CURT_SUCCESS, "curt_pinned_free(NULL) is a no-op");
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

static int same(const char *a, const char *b) { return a != NULL && strcmp(a, b) == 0; }

static void names_and_version(void) {
    char text[32];
    int major = -1, minor = -1, patch = -1;
    CHECK(same(curt_status_name(CURT_SUCCESS), "CURT_SUCCESS"), "status name of success");
    CHECK(same(curt_status_name(CURT_ERROR_INVALID_ARGUMENT), "CURT_ERROR_INVALID_ARGUMENT"), "status name of a bad argument");
    CHECK(same(curt_status_name(CURT_ERROR_OUT_OF_MEMORY), "CURT_ERROR_OUT_OF_MEMORY"), "status name of out of memory");
    CHECK(same(curt_status_name(CURT_ERROR_INVALID_HANDLE), "CURT_ERROR_INVALID_HANDLE"), "status name of a bad handle");
    CHECK(same(curt_status_name(CURT_ERROR_PANIC), "CURT_ERROR_PANIC"), "status name of a caught panic");
    CHECK(same(curt_status_name(-42), "CURT_ERROR_UNRECOGNIZED"), "status name of an unknown code");
    CHECK(curt_status_name(2) != NULL && curt_status_name(987654) != NULL, "status names of CUDA codes are never NULL");
    if (curt_is_available()) {
        CHECK(same(curt_status_name(2), "CUDA_ERROR_OUT_OF_MEMORY"), "the driver names a CUDA code");
    }
    CHECK(curt_version() == CURT_VERSION, "the library's version is the header's");
    CHECK(sscanf(curt_version_string(), "%d.%d.%d", &major, &minor, &patch) == 3
              && major == CURT_VERSION_MAJOR && minor == CURT_VERSION_MINOR && patch == CURT_VERSION_PATCH,
          "the version string says the same");
    sprintf(text, "%d.%d.%d", CURT_VERSION_MAJOR, CURT_VERSION_MINOR, CURT_VERSION_PATCH);
    CHECK(same(curt_version_string(), text), "the version string is major.minor.patch");
}

static void devices_that_do_not_exist(void) {
    curt_pool_stats_t st;
    uint64_t used = 7, reserved = 7, bytes = 7;
    size_t len = 0;
    st.used_bytes = 12345;
    CHECK(curt_pool_stats(9999, &st) != CURT_SUCCESS && st.used_bytes == 12345, "statistics of device 9999 are an error, not zeros");
    CHECK(curt_pool_stats(-1, &st) != CURT_SUCCESS, "statistics of device -1 are an error");
    CHECK(curt_torch_memory_peaks(9999, &used, &reserved) != CURT_SUCCESS && used == 7 && reserved == 7, "peaks of device 9999 are an error");
    CHECK(curt_torch_graph_pools_reserved(9999, &bytes) != CURT_SUCCESS && bytes == 7, "graph pools of device 9999 are an error");
    CHECK(curt_pool_reset_peaks(9999) != CURT_SUCCESS, "resetting the peaks of device 9999 is an error");
    CHECK(curt_pool_snapshot_json(9999, NULL, 0, &len) != CURT_SUCCESS && !HAS("needs"), "a snapshot of device 9999 is an error");
    if (!curt_is_available()) {
        CHECK(curt_pool_stats(0, &st) != CURT_SUCCESS && st.used_bytes == 12345, "without CUDA, device 0 does not exist either");
    }
}

static void raw_streams_without_gpu(void) {
    curt_stream_t s = NULL;
    curt_memory_t m = NULL;
    struct CUstream_st *raw = (struct CUstream_st *)(uintptr_t)1;
    struct CUstream_st *made_up = (struct CUstream_st *)(uintptr_t)0x7e57;
    uint64_t ptr = 0;
    CHECK(curt_stream_raw(NULL, NULL) == CURT_ERROR_INVALID_ARGUMENT && HAS("raw is NULL"), "curt_stream_raw NULL out-pointer");
    CHECK(curt_stream_wrap(NULL, -1, NULL) == CURT_ERROR_INVALID_ARGUMENT && HAS("stream is NULL"), "curt_stream_wrap NULL out-pointer");
    CHECK(curt_stream_raw((curt_stream_t)(uintptr_t)42, &raw) == CURT_ERROR_INVALID_HANDLE, "raw of a made-up handle");
    CHECK(curt_stream_wrap(made_up, 9999, &s) != CURT_SUCCESS && s == NULL, "wrapping a stream of device 9999 is refused");
    /* Wrapping borrows: the handle gives the same CUstream back, and destroying the
     * handle never reaches the driver with it (a made-up one would crash it). */
    CHECK(curt_stream_wrap(made_up, -1, &s) == CURT_SUCCESS && s != NULL, "wrap a raw stream of the current device");
    CHECK(curt_stream_raw(s, &raw) == CURT_SUCCESS && raw == made_up, "the wrapped handle gives its CUstream back");
    CHECK(curt_stream_destroy(s) == CURT_SUCCESS, "destroying the wrapper");
    CHECK(curt_stream_raw(s, &raw) == CURT_ERROR_INVALID_HANDLE, "the wrapper is gone");
    CHECK(curt_stream_wrap(NULL, -1, &s) == CURT_SUCCESS && curt_stream_raw(s, &raw) == CURT_SUCCESS && raw == NULL,
          "the legacy default stream wraps as 0");
    CHECK(curt_stream_destroy(s) == CURT_SUCCESS, "destroying that wrapper");
    CHECK(curt_malloc_ptr(16, NULL, NULL, &ptr) == CURT_ERROR_INVALID_ARGUMENT && HAS("mem is NULL"), "curt_malloc_ptr NULL handle out-pointer");
    CHECK(curt_malloc_ptr(16, NULL, &m, NULL) == CURT_ERROR_INVALID_ARGUMENT && HAS("ptr is NULL") && m == NULL, "curt_malloc_ptr NULL address out-pointer");
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
    struct CUstream_st *raw = NULL, *raw_again = NULL;
    curt_stream_t w = NULL;
    uint64_t addr = 0, addr_again = 1, peak_used = 0, peak_reserved = 0;
    int count = 0;
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

    /* A stream's raw CUstream, wrapped by a second handle: work through the wrapper
     * lands on the same stream, and destroying the wrapper leaves the stream alive. */
    CHECK(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &s) == CURT_SUCCESS, "stream for the raw round trip");
    CHECK(curt_stream_raw(s, &raw) == CURT_SUCCESS && raw != NULL, "its raw CUstream");
    CHECK(curt_stream_wrap(raw, 0, &w) == CURT_SUCCESS && curt_stream_raw(w, &raw_again) == CURT_SUCCESS && raw_again == raw,
          "wrapped, the same CUstream");
    CHECK(curt_malloc_ptr(4096, w, &a, &addr) == CURT_SUCCESS && addr != 0, "curt_malloc_ptr on the wrapped stream");
    CHECK(curt_memory_ptr(a, &addr_again) == CURT_SUCCESS && addr_again == addr, "the address it gave is the handle's");
    CHECK(curt_memcpy_htod_async(a, 0, host, sizeof host, w) == CURT_SUCCESS
              && curt_memcpy_dtoh_async(back, a, 0, sizeof back, w) == CURT_SUCCESS, "copies queued on the wrapper");
    CHECK(curt_stream_destroy(w) == CURT_SUCCESS, "wrapper destroyed");
    CHECK(curt_stream_synchronize(s) == CURT_SUCCESS && memcmp(host, back, sizeof back) == 0,
          "the stream outlives its wrapper and ran the copies");
    CHECK(curt_free(a) == CURT_SUCCESS && curt_stream_destroy(s) == CURT_SUCCESS, "free and destroy");

    /* Peaks: up with an allocation, back to what is in use after a reset. */
    CHECK(curt_malloc(1 << 22, NULL, &a) == CURT_SUCCESS && curt_free(a) == CURT_SUCCESS, "4 MiB allocated and freed");
    CHECK(curt_pool_stats(0, &st) == CURT_SUCCESS && st.peak_used_bytes >= (1u << 22), "the peak counts it");
    CHECK(curt_torch_memory_peaks(0, &peak_used, &peak_reserved) == CURT_SUCCESS && peak_used >= (1u << 22)
              && peak_reserved >= peak_used, "so do the peaks with the graph pools");
    CHECK(curt_pool_reset_peaks(0) == CURT_SUCCESS, "reset the peaks");
    CHECK(curt_pool_stats(0, &st) == CURT_SUCCESS && st.peak_used_bytes == st.used_bytes && st.peak_total_bytes == st.total_bytes,
          "after the reset the peaks are the current values");
    CHECK(curt_device_count(&count) == CURT_SUCCESS && curt_pool_stats(count, &st) == CURT_ERROR_INVALID_ARGUMENT,
          "statistics of the device past the last are a bad argument");
    with_recorder();
}

int main(void) {
    without_gpu_too();
    names_and_version();
    devices_that_do_not_exist();
    raw_streams_without_gpu();
    if (curt_is_available()) {
        with_gpu();
    } else {
        printf("info no GPU: %s\n", curt_last_error());
    }
    printf("%s\n", failures ? "C API FAILED" : "C API PASSED");
    return failures ? 1 : 0;
}
