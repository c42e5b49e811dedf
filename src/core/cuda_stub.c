/* cuda_stub.c - the CUDA backend's entry points in a build without CUDA: it is reported as
 * unavailable, never faked. */
#include "internal.h"

int pkv_cuda_device_count(void) { return 0; }

pkv_status pkv_cuda_backend_init(pkv_context *ctx, int32_t device, bool pdl, bool check_pages) {
    (void)device;
    (void)pdl;
    (void)check_pages;
    return pkv_fail(ctx, PKV_ERR_BACKEND_UNAVAILABLE, "this build of PersistentKV has no CUDA backend");
}

int pkv_cuda_page_fault(const pkv_context *ctx, pkv_page_fault *out) {
    (void)ctx, (void)out;
    return 0;
}

pkv_status pkv_cuda_decode_kernel_of(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t, const char **name) {
    (void)plan, (void)t;
    if (name) *name = "";
    return pkv_fail(ctx, PKV_ERR_BACKEND_UNAVAILABLE, "this build of PersistentKV has no CUDA backend");
}
