/* The shim called while the process or a thread tears down: from a pthread key
 * destructor of an exiting thread (after Rust's thread-locals of that thread are
 * destroyed) and from an atexit handler (after the main thread's are destroyed).
 * wrapper.h promises that no function unwinds or aborts there: each place prints one
 * "ok" line per check, and the process must exit 0 with "C TEARDOWN PASSED" last. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../../wrapper.h"

static int failures = 0;
#define CHECK(cond, what) do { if (!(cond)) { printf("FAIL %s: %s\n", where, what); failures++; } else { printf("ok   %s: %s\n", where, what); } fflush(stdout); } while (0)

/* Every entry point, a failing one first; the codes of those that need CUDA are not
 * checked (no GPU here, maybe one there), only that they return. */
static void call_everything(const char *where) {
    CHECK(curt_device_count(NULL) == CURT_ERROR_INVALID_ARGUMENT, "NULL out pointer is still an invalid argument");
    const char *msg = curt_last_error();
    CHECK(msg != NULL, "curt_last_error is never NULL");
    /* The slot may be torn down (""), or alive (the message). */
    CHECK(msg[0] == '\0' || strstr(msg, "count is NULL") != NULL, "curt_last_error is empty or the message");
    int available = curt_is_available();
    CHECK(available == 0 || available == 1, "curt_is_available returns 0 or 1");
    int count = -1, version = 0, major = 0, minor = 0;
    size_t bytes = 0;
    (void)curt_device_count(&count);
    (void)curt_driver_version(&version);
    (void)curt_device_compute_capability(0, &major, &minor);
    (void)curt_device_total_memory(0, &bytes);
    CHECK(curt_last_error() != NULL, "every entry point returned");
}

static pthread_key_t key;

static void key_destructor(void *value) {
    (void)value;
    call_everything("pthread key destructor");
    printf("KEY DESTRUCTOR DONE\n");
    fflush(stdout);
}

static void *thread_body(void *arg) {
    (void)arg;
    /* A failing call first, so the thread has a last-error slot to tear down. */
    const char *where = "thread";
    CHECK(curt_device_count(NULL) == CURT_ERROR_INVALID_ARGUMENT, "failing call before exit");
    pthread_setspecific(key, (void *)1);
    return NULL;
}

static void at_exit(void) {
    call_everything("atexit handler");
    printf("%s\n", failures ? "C TEARDOWN FAILED" : "C TEARDOWN PASSED");
    fflush(stdout);
    if (failures) _exit(1);
}

int main(void) {
    const char *where = "main";
    CHECK(pthread_key_create(&key, key_destructor) == 0, "pthread_key_create");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thread_body, NULL) == 0, "pthread_create");
    CHECK(pthread_join(t, NULL) == 0, "pthread_join");
    /* The main thread's slot exists before exit, so exit() destroys it before the
     * atexit handler runs. */
    CHECK(curt_device_count(NULL) == CURT_ERROR_INVALID_ARGUMENT, "failing call in main");
    CHECK(atexit(at_exit) == 0, "atexit");
    return failures ? 1 : 0;
}
