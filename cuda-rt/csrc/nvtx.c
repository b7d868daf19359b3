/*
 * cuda-rt's NVTX shim: plain C functions over NVTX v3's header-only core API, so Rust
 * can call NVTX without reimplementing its injection protocol. NVTX v3 finds the tool
 * (e.g. Nsight Systems) through NVTX_INJECTION64_PATH on the first call; without a
 * tool every call is a load and a null check.
 *
 * `message` is a NUL-terminated ASCII/UTF-8 string the caller keeps alive for the call;
 * `has_color` selects whether `argb` (0xAARRGGBB) is applied.
 */
#include <stdint.h>

#include "nvtx3/nvToolsExt.h"

static void cuda_rt_nvtx_attributes(nvtxEventAttributes_t *a, const char *message,
                                    uint32_t argb, int has_color)
{
    /* Zeroing first is what NVTX asks: unused fields must be 0. */
    *a = (nvtxEventAttributes_t){0};
    a->version = NVTX_VERSION;
    a->size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a->messageType = NVTX_MESSAGE_TYPE_ASCII;
    a->message.ascii = message;
    if (has_color) {
        a->colorType = NVTX_COLOR_ARGB;
        a->color = argb;
    }
}

/* nvtxRangePushEx; returns the zero-based depth of the new range, or a negative value
 * when no tool tracks push/pop (always the case without a tool). */
int cuda_rt_nvtx_range_push(const char *message, uint32_t argb, int has_color)
{
    nvtxEventAttributes_t a;
    cuda_rt_nvtx_attributes(&a, message, argb, has_color);
    return nvtxRangePushEx(&a);
}

/* nvtxRangePop; returns the depth of the range ended, or a negative value. */
int cuda_rt_nvtx_range_pop(void)
{
    return nvtxRangePop();
}

/* nvtxMarkEx: an instantaneous event. */
void cuda_rt_nvtx_mark(const char *message, uint32_t argb, int has_color)
{
    nvtxEventAttributes_t a;
    cuda_rt_nvtx_attributes(&a, message, argb, has_color);
    nvtxMarkEx(&a);
}
