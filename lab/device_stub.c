/* device_stub.c - the lab's device helpers in a build without CUDA: each reports that there is no CUDA
 * backend, never a fake result. */
#include "pkv_lab.h"

#include <stddef.h>


#define PKV_NO_CUDA(ctx) ((void)(ctx), pkv_lab_fail(PKV_ERR_BACKEND_UNAVAILABLE, "this build of PersistentKV has no CUDA backend"))

pkv_status pkv_dev_malloc(pkv_context *ctx, size_t bytes, void **ptr) {
    (void)bytes;
    if (ptr) *ptr = NULL;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_free(pkv_context *ctx, void *ptr) {
    (void)ptr;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_copy_h2d(pkv_context *ctx, void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_copy_d2h(pkv_context *ctx, void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_memset(pkv_context *ctx, void *dst, int value, size_t bytes) {
    (void)dst, (void)value, (void)bytes;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_synchronize(pkv_context *ctx) { return PKV_NO_CUDA(ctx); }
pkv_status pkv_dev_fill_random(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, uint64_t seed) {
    (void)dst, (void)count, (void)dtype, (void)seed;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_fill_random_fp8(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, float scale,
                                   uint64_t seed) {
    (void)dst, (void)count, (void)dtype, (void)scale, (void)seed;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_get_info(pkv_context *ctx, pkv_dev_info *info) {
    (void)info;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_time_plan(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                             const pkv_tensors *base, const int32_t *const *page_sets, int32_t nsets,
                             int32_t warmup, int32_t reps, double *samples_us) {
    (void)plan, (void)ws, (void)ws_bytes, (void)base, (void)page_sets, (void)nsets, (void)warmup, (void)reps,
        (void)samples_us;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_fill_random_late(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, uint64_t seed,
                                    int64_t delay_ns) {
    (void)dst, (void)count, (void)dtype, (void)seed, (void)delay_ns;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_copy_late(pkv_context *ctx, void *dst, const void *src, size_t bytes, int64_t delay_ns) {
    (void)dst, (void)src, (void)bytes, (void)delay_ns;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_time_plan_behind(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                                    const pkv_tensors *base, const int32_t *const *page_sets, int32_t nsets,
                                    int32_t warmup, int32_t reps, int trigger, double *producer_us, double *pair_us) {
    (void)plan, (void)ws, (void)ws_bytes, (void)base, (void)page_sets, (void)nsets, (void)warmup, (void)reps,
        (void)trigger, (void)producer_us, (void)pair_us;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_time_read(pkv_context *ctx, const void *buf, size_t buf_bytes, size_t bytes, int32_t reps,
                             double *median_us) {
    (void)buf, (void)buf_bytes, (void)bytes, (void)reps, (void)median_us;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_time_gather(pkv_context *ctx, const void *k, const void *v, size_t page_bytes,
                               const int32_t *const *page_sets, int32_t nsets, int32_t npages, int32_t reps,
                               double *median_us) {
    (void)k, (void)v, (void)page_bytes, (void)page_sets, (void)nsets, (void)npages, (void)reps, (void)median_us;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_launch_latency(pkv_context *ctx, double *empty_us, double *graph_us) {
    (void)empty_us, (void)graph_us;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_graph_run(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                             const pkv_tensors *t, int32_t replays) {
    (void)plan, (void)ws, (void)ws_bytes, (void)t, (void)replays;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_graph_capture(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                                 const pkv_tensors *t, void **graph) {
    (void)plan, (void)ws, (void)ws_bytes, (void)t;
    if (graph) *graph = NULL;
    return PKV_NO_CUDA(ctx);
}
pkv_status pkv_dev_graph_replay(pkv_context *ctx, void *graph, const pkv_plan *plan, void *ws, size_t ws_bytes) {
    (void)graph, (void)plan, (void)ws, (void)ws_bytes;
    return PKV_NO_CUDA(ctx);
}
void pkv_dev_graph_free(void *graph) { (void)graph; }
