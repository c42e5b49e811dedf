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
    pkv_cuda_launch_opts launch; // PDL, kernel choices (from the device and the context's tuning)
    const void *uploaded_ws;  // workspace that holds uploaded_gen's plan
    uint64_t uploaded_gen;
    staging_buffer stage[kStaging];
    int next_stage;
    bool pageable; // uploads straight from the plan (tuning pageable_upload=1, or page-locked memory refused)
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
    const char *tl = ctx->tuning.timeline_out;
    if (tl[0] && pkv_cuda_timeline_dump(tl) != 0) fprintf(stderr, "persistentkv: cannot write the timeline to %s\n", tl);
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
    const pkv_tuning &tu = ctx->tuning; // PKV_TUNING (tuning.c documents each key)
    s->pageable = tu.pageable_upload;
    /* PDL needs the kernels' griddepcontrol instructions, in sm_90 code only (a compute_80 PTX build
     * JIT-compiled here has none, and its merge must wait for the decode grid the ordinary way) */
    s->launch.use_pdl = sm90_code && tu.pdl;
    s->launch.entry_pdl = s->launch.use_pdl && pdl;
    s->launch.allow_n8 = 1;
    s->launch.merge_kernel = tu.merge;
    s->launch.deep_max_ctas = 0; /* retired: two tiles in flight (kernel-notes v4) */
    /* sm_90: K and V through shared memory by TMA tensor copies where the shape allows (tma=0: the register
     * kernels everywhere); pages of 8, 24, ... in chunks of 8 tokens, the other page sizes by cp.async into
     * the whole-tile boxes on every grid */
    s->launch.tma = sm90_code && tu.tma;
    s->launch.tma_chunk_min = 8;
    s->launch.cp_async = 1;
    s->launch.cp_async_min_ctas = 2 * prop.multiProcessorCount + 1; /* token-major rows only, retired */
    s->launch.cp_async_tiles = 1;
    /* graph-stable plans: steps of at most one task per SM in the grid's first CTAs, up to a resident wave
     * claimed by SM (over claim_sms SMs: tests), more spread over the grid */
    s->launch.graph_first = prop.multiProcessorCount;
    const int32_t nsm = tu.claim_sms > 0                          ? tu.claim_sms
                        : prop.multiProcessorCount > PKV_CLAIM_SMS ? PKV_CLAIM_SMS
                                                                   : prop.multiProcessorCount;
    s->launch.claim_sms = nsm;
    s->launch.claim_mul = pkv_graph_claim_multiplier(nsm);
    s->launch.graph_merge_adapt = 1;
    s->launch.merge_wide_at = tu.merge_wide_at;
    s->launch.tma_stages = tu.tma_stages;
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
     * of the d = 64 kernels (planner.c resolve_params; kernel-notes v18) */
    ctx->row_gather_below = s->launch.tma && s->launch.cp_async
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
