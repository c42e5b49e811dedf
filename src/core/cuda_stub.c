/* cuda_stub.c - the CUDA backend's entry points in a build without CUDA: it is reported as
 * unavailable, never faked. */
#include "internal.h"

int pkv_cuda_device_count(void) { return 0; }

pkv_status pkv_cuda_backend_init(pkv_context *ctx, int32_t device, bool pdl) {
    (void)device;
    (void)pdl;
    return pkv_fail(ctx, PKV_ERR_BACKEND_UNAVAILABLE, "this build of PersistentKV has no CUDA backend");
}

pkv_status pkv_cuda_decode_kernel_of(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t, const char **name) {
    (void)plan, (void)t;
    if (name) *name = "";
    return pkv_fail(ctx, PKV_ERR_BACKEND_UNAVAILABLE, "this build of PersistentKV has no CUDA backend");
}
