/* pkv_dev.h - device helpers for the pkv tool, benchmarks and tests (exported by the library).
 * In a build without CUDA every function returns PKV_ERR_BACKEND_UNAVAILABLE. */
#ifndef PKV_DEV_H
#define PKV_DEV_H

#include "persistentkv.h"

#ifdef __cplusplus
extern "C" {
#endif

pkv_status pkv_dev_malloc(pkv_context *ctx, size_t bytes, void **ptr);
pkv_status pkv_dev_free(pkv_context *ctx, void *ptr);
/* The host-to-device copy and the memset return when they are done on the device. */
pkv_status pkv_dev_copy_h2d(pkv_context *ctx, void *dst, const void *src, size_t bytes);
pkv_status pkv_dev_copy_d2h(pkv_context *ctx, void *dst, const void *src, size_t bytes);
pkv_status pkv_dev_memset(pkv_context *ctx, void *dst, int value, size_t bytes);
pkv_status pkv_dev_synchronize(pkv_context *ctx);
/* Fills count fp16/bf16 values with seeded pseudo-random numbers in [-1, 1] on the device. */
pkv_status pkv_dev_fill_random(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, uint64_t seed);
/* The same values, written late by one CTA on the default stream, asynchronously: the kernel first lets a
 * programmatic dependent start (griddepcontrol.launch_dependents), spins delay_ns, then fills.  A run
 * queued right behind it that touched dst before its dependency wait would see the old values (tests). */
pkv_status pkv_dev_fill_random_late(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, uint64_t seed,
                                    int64_t delay_ns);
/* A device-to-device copy of bytes (a multiple of 4) written late in the same way (tests: page ids that
 * a kernel right before a run rewrites). */
pkv_status pkv_dev_copy_late(pkv_context *ctx, void *dst, const void *src, size_t bytes, int64_t delay_ns);
/* Device properties: name, SMs, L2 bytes, compute capability, CUDA runtime and driver versions. */
typedef struct pkv_dev_info {
    char name[128];
    int32_t sms, cc_major, cc_minor, runtime_version, driver_version;
    int64_t l2_bytes, mem_bytes;
} pkv_dev_info;
pkv_status pkv_dev_get_info(pkv_context *ctx, pkv_dev_info *info);
/* The decode kernel a run of the plan with these tensors launches on this CUDA context: "tensor copies",
 * "tensor copies in chunks of N" (pages not a multiple of 16 tokens), "cp.async copies ..." (other such
 * pages; the rest of the name says the layout and the grids it runs on) or "registers, heads in N|M ..."
 * (static storage; "" on error). */
pkv_status pkv_dev_decode_kernel(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t, const char **name);

/* Kernel time of reps runs of the plan (CUDA events around each run; each run queued behind a short
 * spin kernel so the host's launch cost is off the clock).  Run r uses page-index set r % nsets
 * (device pointers), so KV can rotate over a pool larger than L2.  samples_us has reps entries. */
pkv_status pkv_dev_time_plan(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                             const pkv_tensors *base, const int32_t *const *page_sets, int32_t nsets,
                             int32_t warmup, int32_t reps, double *samples_us);
/* A step behind the kernel that produces its q, as in a model's layer: a small kernel that rewrites
 * q in place (a dense q: q_row_stride 0, else PKV_ERR_UNSUPPORTED; grid of up to 2 CTAs per SM;
 * trigger != 0: it calls griddepcontrol.launch_dependents at its start, as PDL-aware kernels do), then
 * pkv_run; CUDA events around the producer alone (*producer_us) and around the producer and the run
 * (*pair_us), medians over reps, timed like pkv_dev_time_plan.  With the context's PDL on, the run's
 * kernels are scheduled while the producer drains. */
pkv_status pkv_dev_time_plan_behind(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                                    const pkv_tensors *base, const int32_t *const *page_sets, int32_t nsets,
                                    int32_t warmup, int32_t reps, int trigger, double *producer_us, double *pair_us);
/* Streaming read of `bytes` from buf (16-byte loads), timed like a step; the window moves through
 * buf_bytes so L2 does not help.  Best of a few grid sizes; median over reps. */
pkv_status pkv_dev_time_read(pkv_context *ctx, const void *buf, size_t buf_bytes, size_t bytes, int32_t reps,
                             double *median_us);
/* The floor of a step's access pattern: a pure read of its pages (npages ids per set, device
 * pointers; run r uses set r % nsets), each page of K and of V read whole (page_bytes, contiguous in
 * both layouts), a warp per page; timed like a step, best of a few grid sizes, median over reps. */
pkv_status pkv_dev_time_gather(pkv_context *ctx, const void *k, const void *v, size_t page_bytes,
                               const int32_t *const *page_sets, int32_t nsets, int32_t npages, int32_t reps,
                               double *median_us);
/* Launch costs: back-to-back empty launches (us per launch), and the replay of a CUDA graph of one
 * empty kernel (us per replay). */
pkv_status pkv_dev_launch_latency(pkv_context *ctx, double *empty_us, double *graph_us);
/* Captures one pkv_run of an uploaded plan into a CUDA graph, replays it `replays` times. */
pkv_status pkv_dev_graph_run(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                             const pkv_tensors *t, int32_t replays);
/* Serving with graph-stable plans (pkv_plan_options.graph_max_batch): capture one pkv_run of the plan
 * (uploaded first) on a stream of the graph's own into an instantiated graph (*graph); then each
 * replay waits for the work queued on the default stream before it, uploads the given plan on that
 * stream (outside the graph) and replays the graph, synchronized.
 * A replay refuses a plan whose pkv_plan_graph_signature is not the captured one's. */
pkv_status pkv_dev_graph_capture(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                                 const pkv_tensors *t, void **graph);
pkv_status pkv_dev_graph_replay(pkv_context *ctx, void *graph, const pkv_plan *plan, void *ws, size_t ws_bytes);
void pkv_dev_graph_free(void *graph); /* accepts NULL */

#ifdef __cplusplus
}
#endif

#endif
