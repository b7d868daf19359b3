/* A C program linking cuda-rt's shim: it must never crash, with or without a GPU.
 * Prints one line per check; exits non-zero on a failed check. */
#include <stdio.h>
#include <string.h>
#include "../../wrapper.h"

static int failures = 0;
#define CHECK(cond, what) do { if (!(cond)) { printf("FAIL %s\n", what); failures++; } else { printf("ok   %s\n", what); } } while (0)

int main(void) {
    CHECK(curt_device_count(NULL) == CURT_ERROR_INVALID_ARGUMENT, "NULL out pointer is an invalid argument");
    CHECK(strstr(curt_last_error(), "count is NULL") != NULL, "the message names the argument");
    int available = curt_is_available();
    int count = -1;
    int rc = curt_device_count(&count);
    if (available) {
        CHECK(rc == CURT_SUCCESS && count > 0, "device count with a GPU");
        int major = 0, minor = 0;
        CHECK(curt_device_compute_capability(0, &major, &minor) == CURT_SUCCESS && major > 0, "compute capability");
        printf("info device 0: compute capability %d.%d\n", major, minor);
        size_t bytes = 0;
        CHECK(curt_device_total_memory(0, &bytes) == CURT_SUCCESS && bytes > 0, "total memory");
        CHECK(curt_device_total_memory(count + 5, &bytes) == CURT_ERROR_INVALID_ARGUMENT, "bad device id");
        CHECK(strstr(curt_last_error(), "invalid device id") != NULL, "bad device id message");
        int version = 0;
        CHECK(curt_driver_version(&version) == CURT_SUCCESS && version >= 12000, "driver version");
    } else {
        printf("info no GPU: %s\n", curt_last_error());
        CHECK(rc != CURT_SUCCESS, "device count fails without CUDA");
        CHECK(strlen(curt_last_error()) > 0, "and says why");
    }
    printf("%s\n", failures ? "C SMOKE FAILED" : "C SMOKE PASSED");
    return failures ? 1 : 0;
}
