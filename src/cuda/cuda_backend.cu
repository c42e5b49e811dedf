// cuda_backend.cu - the CUDA backend behind the C API: device selection, plan upload (one async
// copy of the plan blob into the workspace, skipped when that plan is already there), and run.
#include "cuda_common.cuh"
#include "pkv_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

/* A plan's upload goes through page-locked staging buffers: cudaMemcpyAsync from pageable memory may
 * wait for the stream's earlier work before it copies (CUDA's API synchronization rules), which would
 * hold a host that plans the next step while the GPU still runs this one.  A ring of kStaging buffers,
 * each reused once its copy has executed (an event per buffer): a host fewer than kStaging uploads
 * ahead of the GPU never waits, and the plan's own storage is free again as soon as the upload returns. */
constexpr int kStaging = 4;
struct staging_buffer {
    void *buf;        // page-locked, cap bytes
    size_t cap;
    cudaEvent_t done; // recorded after the copy out of buf
    bool pending;     // done recorded and not yet waited for
};

struct cuda_state {
    int device;
    int cc_major, cc_minor;
    pkv_cuda_launch_opts launch; // PDL, kernel choices (PKV_NO_PDL, PKV_DECODE_KERNEL, PKV_MERGE_KERNEL,
                                 // PKV_DECODE_DEEP, PKV_DECODE_TMA, PKV_TMA_STAGES, PKV_TMA_CHUNKED,
                                 // PKV_DECODE_CPASYNC, PKV_CPASYNC_LAYOUT)
    const void *uploaded_ws;  // workspace that holds uploaded_gen's plan
    uint64_t uploaded_gen;
    staging_buffer stage[kStaging];
    int next_stage;
    bool pageable; // uploads straight from the plan (PKV_PAGEABLE_UPLOAD=1, or page-locked memory refused)
};

/* Copies the plan's blob into the next staging buffer and queues its upload on the stream (*queued).  When
 * no page-locked buffer can be had it queues nothing and returns PKV_OK: the caller then copies from the
 * plan, and later uploads do the same. */
pkv_status staged_upload(pkv_context *ctx, cuda_state *s, const pkv_plan *plan, void *ws, cudaStream_t stream,
                         bool *queued) {
    *queued = false;
    staging_buffer &b = s->stage[s->next_stage];
    if (b.pending) { // this buffer's last copy must have left it before it is refilled
        const cudaError_t e = cudaEventSynchronize(b.done);
        if (e != cudaSuccess)
            return pkv_fail(ctx, PKV_ERR_CUDA, "plan upload: waiting for an earlier upload failed: %s",
                            cudaGetErrorString(e));
        b.pending = false;
    }
    if (!b.done && cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        b.done = nullptr;
        s->pageable = true;
        return PKV_OK;
    }
    if (b.cap < plan->blob_bytes) {
        if (b.buf) cudaFreeHost(b.buf);
        b.buf = nullptr;
        b.cap = 0;
        size_t cap = 64 * 1024;
        while (cap < plan->blob_bytes) cap *= 2;
        if (cudaHostAlloc(&b.buf, cap, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError(); // e.g. a locked-memory limit: stay correct, copy from pageable memory
            b.buf = nullptr;
            s->pageable = true;
            return PKV_OK;
        }
        b.cap = cap;
    }
    memcpy(b.buf, plan->blob, plan->blob_bytes);
    cudaError_t e = cudaMemcpyAsync(ws, b.buf, plan->blob_bytes, cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess && (e = cudaEventRecord(b.done, stream)) != cudaSuccess)
        cudaStreamSynchronize(stream); // the copy was queued but cannot be tracked: let it leave the buffer now
    if (e != cudaSuccess) return pkv_fail(ctx, PKV_ERR_CUDA, "plan upload failed: %s", cudaGetErrorString(e));
    b.pending = true;
    s->next_stage = (s->next_stage + 1) % kStaging;
    *queued = true;
    return PKV_OK;
}

/* An environment setting equal to value (the A/B and test switches below). */
bool env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

cuda_state *state_of(pkv_context *ctx) { return static_cast<cuda_state *>(ctx->backend_state); }

pkv_status cuda_supports(pkv_context *ctx, const pkv_problem *p) {
    if (p->dtype != PKV_DTYPE_FP16 && p->dtype != PKV_DTYPE_BF16)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_DTYPE, "the CUDA backend runs fp16 and bf16");
    if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_HEAD_DIM, "the CUDA backend runs head dims 64, 128, 256");
    if (p->num_qo_heads / p->num_kv_heads > PKV_MAX_GROUP)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "the CUDA backend runs G <= %d", PKV_MAX_GROUP);
    if (p->num_kv_heads > 65535)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "num_kv_heads %d is above the grid limit 65535", p->num_kv_heads);
    return PKV_OK;
}

pkv_status cuda_upload(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes, void *stream) {
    cuda_state *s = state_of(ctx);
    if (s->uploaded_ws == ws && s->uploaded_gen == plan->generation) return PKV_OK;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    PKV_CUDA_TRY(ctx, cudaStreamIsCapturing(st, &cap));
    if (cap != cudaStreamCaptureStatusNone)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED,
                        "the plan is not in this workspace yet and a stream capture is active: call "
                        "pkv_plan_upload (or one pkv_run) before capturing");
    PKV_CUDA_TRY(ctx, cudaSetDevice(s->device));
    if (plan->blob_bytes > 0) {
        bool queued = false;
        if (!s->pageable) {
            const pkv_status us = staged_upload(ctx, s, plan, ws, st, &queued);
            if (us != PKV_OK) return us;
        }
        if (!queued)
            PKV_CUDA_TRY(ctx, cudaMemcpyAsync(ws, plan->blob, plan->blob_bytes, cudaMemcpyHostToDevice, st));
    }
    s->uploaded_ws = ws;
    s->uploaded_gen = plan->generation;
    return PKV_OK;
}

pkv_status cuda_run(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes, const pkv_tensors *t,
                    void *stream) {
    cuda_state *s = state_of(ctx);
    // nothing to launch - except for a graph-stable plan, whose launches must not depend on the step
    if (plan->graph_tasks == 0 && (plan->num_phases == 0 || (plan->num_tasks == 0 && plan->num_merges == 0)))
        return PKV_OK;
    pkv_status ps = cuda_upload(ctx, plan, ws, ws_bytes, stream);
    if (ps != PKV_OK) return ps;
    cudaError_t e = pkv_cuda_decode_run(plan, ws, t, static_cast<cudaStream_t>(stream), &s->launch);
    if (e != cudaSuccess)
        return pkv_fail(ctx, PKV_ERR_CUDA, "decode launch failed: %s", cudaGetErrorString(e));
    return PKV_OK;
}

void cuda_destroy(pkv_context *ctx) {
#ifdef PKV_TIMELINE
    const char *tl = getenv("PKV_TIMELINE_OUT");
    if (tl && pkv_cuda_timeline_dump(tl) != 0) fprintf(stderr, "persistentkv: cannot write the timeline to %s\n", tl);
#endif
    cuda_state *s = state_of(ctx);
    if (s) {
        cudaSetDevice(s->device);
        for (int i = 0; i < kStaging; i++) { // a buffer is freed once its last copy has left it
            staging_buffer &b = s->stage[i];
            if (b.pending) cudaEventSynchronize(b.done);
            if (b.done) cudaEventDestroy(b.done);
            if (b.buf) cudaFreeHost(b.buf);
        }
        cudaGetLastError(); // nothing to report from a teardown
    }
    free(ctx->backend_state);
    ctx->backend_state = nullptr;
}

const pkv_backend_ops cuda_ops = {"cuda", cuda_run, cuda_upload, cuda_supports, cuda_destroy};

} // namespace

extern "C" pkv_status pkv_cuda_decode_kernel_of(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t,
                                                const char **name) {
    if (ctx->ops != &cuda_ops) return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "not a CUDA context");
    *name = pkv_cuda_decode_kernel_name(plan, t, &state_of(ctx)->launch);
    return PKV_OK;
}

extern "C" int pkv_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" pkv_status pkv_cuda_backend_init(pkv_context *ctx, int32_t device, bool pdl) {
    int n = pkv_cuda_device_count();
    if (n <= 0) return pkv_fail(ctx, PKV_ERR_BACKEND_UNAVAILABLE, "no CUDA device is visible");
    if (device < 0 || device >= n)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "CUDA device %d is not in [0, %d)", device, n);
    PKV_CUDA_TRY(ctx, cudaSetDevice(device));
    cudaDeviceProp prop;
    PKV_CUDA_TRY(ctx, cudaGetDeviceProperties(&prop, device));
    if (prop.major < 8)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "device %s has compute capability %d.%d; sm_80 or newer is needed",
                        prop.name, prop.major, prop.minor);
    int32_t tma_stages[PKV_TMA_HEAD_DIMS][2], tma_max_stages[PKV_TMA_HEAD_DIMS];
    int sm90_code = 0;
    cudaError_t e = pkv_cuda_decode_init_attributes(prop.major, prop.sharedMemPerBlockOptin, tma_stages,
                                                    tma_max_stages, &sm90_code);
    if (e != cudaSuccess)
        return pkv_fail(ctx, PKV_ERR_CUDA, "cannot configure the decode kernels for %s: %s", prop.name,
                        cudaGetErrorString(e));
    cuda_state *s = static_cast<cuda_state *>(calloc(1, sizeof(cuda_state)));
    if (!s) return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot allocate the CUDA backend state");
    s->device = device;
    s->cc_major = prop.major;
    s->cc_minor = prop.minor;
    /* PKV_PAGEABLE_UPLOAD=1: plan uploads copy straight from the plan's pageable storage (A/B runs) */
    s->pageable = env_is("PKV_PAGEABLE_UPLOAD", "1");
    /* PDL needs the kernels' griddepcontrol instructions, in sm_90 code only (a compute_80 PTX build
     * JIT-compiled here has none, and its merge must wait for the decode grid the ordinary way) */
    s->launch.use_pdl = sm90_code && getenv("PKV_NO_PDL") == nullptr;
    s->launch.entry_pdl = s->launch.use_pdl && pdl;
    s->launch.allow_n8 = !env_is("PKV_DECODE_KERNEL", "m");
    /* PKV_MERGE_KERNEL=head|row forces one merge kernel (A/B runs); default: chosen per plan */
    s->launch.merge_kernel = env_is("PKV_MERGE_KERNEL", "head") ? 1 : env_is("PKV_MERGE_KERNEL", "row") ? 2 : 0;
    /* two tiles in flight per warp (2 CTAs per SM) for grids of at most 2 CTAs per SM: measured
     * slower on the H200 (B1 steps +2-9%, docs/kernel-notes.md v4), so off unless PKV_DECODE_DEEP=1 */
    s->launch.deep_max_ctas = env_is("PKV_DECODE_DEEP", "1") ? 2 * prop.multiProcessorCount : 0;
    /* sm_90: K and V through shared memory by TMA tensor copies where the shape allows
     * (PKV_DECODE_TMA=0: the register kernel everywhere; PKV_TMA_STAGES=N forces the ring depth) */
    s->launch.tma = sm90_code && !env_is("PKV_DECODE_TMA", "0");
    /* and for pages not a multiple of 16 tokens at d <= 128, a tile in chunks of the largest power of two
     * that divides the page size, where the chunks have 8 tokens (pages of 8, 24, 40, ...): on the H200
     * 1.1% faster than the register kernels at page size 8 over the anchors, but 2% slower at page size 1
     * (16 copies of 256 bytes per tensor and tile; single requests 13-15% slower; docs/kernel-notes.md v14).
     * PKV_TMA_CHUNKED=0: never; =all: chunks of any size (1, 2, 4, 8); tests and A/B runs */
    s->launch.tma_chunk_min = env_is("PKV_TMA_CHUNKED", "0") ? 0 : env_is("PKV_TMA_CHUNKED", "all") ? 1 : 8;
    /* the pages whose chunks take no tensor copies (1, 2, 4 tokens, ...: page size 1 among them) fill the
     * same ring by cp.async, 16 bytes per lane and instruction: on the H200 at page size 1, 1-4% faster than
     * the register kernels on grids of more than 2 CTAs per SM (docs/kernel-notes.md v15), and filling the
     * whole-tile boxes (below) on every grid (v17; decode.cu cp_async_min_ctas); v15's token-major rows
     * only on grids of more than 2 CTAs per SM (smaller ones measured 0-8% slower that way).
     * PKV_DECODE_CPASYNC=0: the register kernels there; =all: cp.async on every grid in both layouts */
    s->launch.cp_async = !env_is("PKV_DECODE_CPASYNC", "0");
    s->launch.cp_async_min_ctas = env_is("PKV_DECODE_CPASYNC", "all") ? 0 : 2 * prop.multiProcessorCount + 1;
    /* the cp.async copies fill the d/64 boxes of a whole-tile copy (no ldmatrix conflicts), and d = 256 pages
     * that are not a multiple of 16 tokens take them too, on every grid: on the H200 0.6% faster than v15's
     * token-major rows at page size 1 (best route over the anchors), d = 256 4-5% faster than the register
     * kernels at page sizes 1 and 8 (docs/kernel-notes.md v16).  PKV_CPASYNC_LAYOUT=rows: v15's token-major
     * rows (d <= 128; d = 256 runs the register kernels there) */
    s->launch.cp_async_tiles = !env_is("PKV_CPASYNC_LAYOUT", "rows");
    /* graph-stable plans: a step of more tasks than SMs (and not claimed by SM, below) spreads them evenly
     * over the fixed grid, not in its first CTAs (H200: geomean 1.025 against 1.036 of the plain work
     * queue's time on the anchors at a 4-wave grid); one of at most one task per SM runs them in the
     * grid's first CTAs, which load their entries with the task count (decode.cu).  PKV_GRAPH_SPREAD=0:
     * the first CTAs whatever the count; PKV_GRAPH_FIRST=0: spread whatever the count */
    s->launch.graph_first = env_is("PKV_GRAPH_SPREAD", "0")  ? INT32_MAX
                            : env_is("PKV_GRAPH_FIRST", "0") ? 0
                                                             : prop.multiProcessorCount;
    /* and up to a resident wave of tasks claimed by the SM a CTA lands on (decode.cu), over the device's
     * SMs; PKV_GRAPH_CLAIM=0 turns it off, PKV_GRAPH_CLAIM_SMS=N deals the tasks over N SMs (tests: over
     * fewer than the device has, an SM is dealt more tasks than it gets CTAs, and the CTAs that wait for
     * unclaimed tasks must find and run them) */
    const char *claim_sms = getenv("PKV_GRAPH_CLAIM_SMS");
    int32_t nsm = claim_sms ? atoi(claim_sms) : prop.multiProcessorCount;
    if (nsm < 1) nsm = 1;
    if (nsm > PKV_CLAIM_SMS) nsm = PKV_CLAIM_SMS;
    s->launch.claim_sms = env_is("PKV_GRAPH_CLAIM", "0") ? 0 : nsm;
    s->launch.claim_mul = pkv_graph_claim_multiplier(nsm);
    /* graph-stable merges: a step of narrow merges runs one CTA per merge on the per-head kernel's fixed
     * grid, as a plain plan would (v13d; PKV_GRAPH_MERGE=head: the per-head grid whatever the step) */
    s->launch.graph_merge_adapt = !env_is("PKV_GRAPH_MERGE", "head");
    const char *wide_at = getenv("PKV_MERGE_WIDE_AT");
    s->launch.merge_wide_at = wide_at && atoi(wide_at) > 0 ? atoi(wide_at) : 2; /* v13d: 3 before */
    const char *stages = getenv("PKV_TMA_STAGES");
    s->launch.tma_stages = stages ? atoi(stages) : 0;
    for (int k = 0; k < PKV_TMA_HEAD_DIMS; k++) {
        s->launch.tma_default_stages[k][0] = tma_stages[k][0];
        s->launch.tma_default_stages[k][1] = tma_stages[k][1];
        s->launch.tma_max_stages[k] = tma_max_stages[k];
    }
    ctx->backend_state = s;
    ctx->ops = &cuda_ops;
    ctx->device = device;
    ctx->parallelism = prop.multiProcessorCount;
    /* resident CTAs per SM of the kernels, as the planner's default tasks per SM */
    const int m8 = pkv_cuda_decode_resident_ctas(8, 128, 0);
    ctx->ctas_per_unit = m8 > 0 ? m8 : 2;
    /* and of the kernel that runs each head dim and group size (the d = 64 kernels hold more CTAs
     * than the d = 128 ones; heads in N, for G <= 8, more than heads in M) */
    static const int32_t dims[3] = {64, 128, 256};
    for (int k = 0; k < 3; k++) {
        ctx->resident[k][0] = pkv_cuda_decode_resident_ctas(8, dims[k], s->launch.allow_n8);
        ctx->resident[k][1] = pkv_cuda_decode_resident_ctas(16, dims[k], 0);
    }
    /* the pages the cp.async copies gather row by row: chunks below tma_chunk_min tokens (all pages that are not
     * a multiple of 16 when chunked tensor copies are off); the planner then fills a wave of every resident CTA
     * of the d = 64 kernels (planner.c resolve_params; PKV_ROW_GATHER_WAVE=0: the default wave, A/B runs) */
    ctx->row_gather_below = s->launch.tma && s->launch.cp_async && !env_is("PKV_ROW_GATHER_WAVE", "0")
                                ? (s->launch.tma_chunk_min > 0 ? s->launch.tma_chunk_min : 16)
                                : 0;
    snprintf(ctx->device_name, sizeof ctx->device_name, "%.64s (%d SMs, sm_%d%d%s)", prop.name, prop.multiProcessorCount,
             prop.major, prop.minor,
             prop.major >= 9 && !sm90_code ? "; this build has no sm_90 code: register kernels, no PDL" : "");
    /* auto's cost model until a policy file replaces it: the read bandwidth from the memory clock
     * and bus width (a streaming read reaches ~92% of that peak on the H200), 3 us per launch */
    int mem_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
        cudaGetLastError();
        mem_khz = bus_bits = 0;
    }
    const double peak_gbps = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    pkv_cost_model_default(&ctx->cost_model, prop.multiProcessorCount, 0.92 * peak_gbps, 3.0);
    snprintf(ctx->cost_model.device, sizeof ctx->cost_model.device, "defaults for %.64s (%.0f GB/s peak)", prop.name,
             peak_gbps);
    ctx->has_cost_model = true;
    return PKV_OK;
}
