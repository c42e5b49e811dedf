// cuda_backend.cu - the CUDA backend behind the C API: device selection and the launch options from the
// context's tuning (pkv_cuda_backend_init), the page-locked memory of plans' blobs (blob_ops), plan upload (one
// async copy of the plan blob into the workspace, skipped when that plan is already there), and run; and the C
// entry points of the decode side (pkv_cuda.h), whose work is in launch.cu.
#include "cuda_common.cuh"
#include "launch.cuh"
#include "pkv_cuda.h"
#include "timeline.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

/* Plans planned on a CUDA context get their blob from page-locked memory of this backend (blob_ops, the
 * planner's pkv_blob_ops): the upload copies straight from the plan, with no copy into staging first, and an
 * event recorded after that copy tells the planner whether the blob may be rewritten (blob_busy).  While it may
 * not, the planner plans into another of the plan's blobs (src/plan/layout.c, plan_blob_acquire; up to
 * 1 + PKV_PLAN_SPARE_BLOBS, the staging ring's depth): a host fewer than four uploads of a plan ahead of the GPU
 * never waits.  The event and its stream live in a header before the blob.  Portable page-locked memory: a plan
 * may be uploaded by a context of another device (its event is then made again on that device). */
struct blob_head {
    cudaEvent_t done;    // recorded after the last upload from the blob; nullptr until the first
    cudaStream_t stream; // where it was recorded
    int device;          // done's device
    bool pending;        // recorded and not yet seen complete
};
constexpr size_t kBlobHead = PKV_WS_ALIGN; // the blob after the header keeps the blob's alignment
static_assert(sizeof(blob_head) <= kBlobHead, "the blob's header fits before it");

blob_head *head_of(void *blob) { return reinterpret_cast<blob_head *>(static_cast<char *>(blob) - kBlobHead); }

void *blob_alloc(size_t bytes) {
    void *p = nullptr;
    if (cudaHostAlloc(&p, bytes + kBlobHead, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError(); // e.g. a locked-memory limit: the planner keeps malloc's memory
        return nullptr;
    }
    blob_head *h = static_cast<blob_head *>(p);
    h->done = nullptr;
    h->stream = nullptr;
    h->device = -1;
    h->pending = false;
    return static_cast<char *>(p) + kBlobHead;
}

void blob_free(void *blob) {
    if (!blob) return;
    blob_head *h = head_of(blob);
    if (h->pending) cudaEventSynchronize(h->done); // the device's copy leaves the memory first
    if (h->done) cudaEventDestroy(h->done);
    cudaFreeHost(h);
    cudaGetLastError(); // nothing to report from a release
}

pkv_status blob_busy(pkv_context *ctx, void *blob, bool wait, bool *busy) {
    blob_head *h = head_of(blob);
    *busy = false;
    if (!h->pending) return PKV_OK;
    const cudaError_t e = wait ? cudaEventSynchronize(h->done) : cudaEventQuery(h->done);
    if (e == cudaErrorNotReady) {
        cudaGetLastError(); // not an error: the copy has not run yet (and a later launch check must not see it)
        *busy = true;
        return PKV_OK;
    }
    if (e != cudaSuccess)
        return pkv_fail(ctx, PKV_ERR_CUDA, "plan: waiting for the upload of its last step failed: %s",
                        cudaGetErrorString(e));
    h->pending = false;
    return PKV_OK;
}

const pkv_blob_ops blob_ops = {blob_alloc, blob_free, blob_busy};

/* A plan whose blob is not this backend's (planned on the host or a CPU context; or with page-locked memory
 * refused) goes up through page-locked staging buffers: cudaMemcpyAsync from pageable memory may wait for the
 * stream's earlier work before it copies (CUDA's API synchronization rules), which would hold a host that plans
 * the next step while the GPU still runs this one.  A ring of kStaging buffers, each reused once its copy has
 * executed (an event per buffer): a host fewer than kStaging uploads ahead of the GPU never waits, and the plan's
 * own storage is free again as soon as the upload returns. */
constexpr int kStaging = 4;
constexpr size_t kStagingMinBytes = 64 * 1024; // a staging buffer's first size (doubled until a plan fits)
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
    // bounds mode: the fault record (pkv_cuda_fault_*), page-locked host memory the kernels write through
    // its mapped device address, so it can be read after their trap has made the CUDA context unusable
    int32_t *fault;
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
        size_t cap = kStagingMinBytes;
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

/* Queues the upload straight from a blob of blob_ops and records its event (*queued).  Queues nothing (the
 * caller stages the copy) when the blob's last upload is still pending on another stream or device - one event
 * follows one stream - or when no event can be had. */
pkv_status direct_upload(pkv_context *ctx, cuda_state *s, const pkv_plan *plan, void *ws, cudaStream_t stream,
                         bool *queued) {
    *queued = false;
    blob_head *h = head_of(plan->blob);
    if (h->pending) {
        bool busy = false;
        const pkv_status st = blob_busy(ctx, plan->blob, false, &busy);
        if (st != PKV_OK) return st;
        if (busy && (h->stream != stream || h->device != s->device)) return PKV_OK;
    }
    if (h->done && h->device != s->device && !h->pending) { // made on another device: make it again here
        cudaEventDestroy(h->done);
        cudaGetLastError();
        h->done = nullptr;
    }
    if (!h->done) {
        if (cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            h->done = nullptr;
            return PKV_OK;
        }
        h->device = s->device;
    }
    PKV_CUDA_TRY(ctx, cudaMemcpyAsync(ws, plan->blob, plan->blob_bytes, cudaMemcpyHostToDevice, stream));
    const cudaError_t e = cudaEventRecord(h->done, stream);
    if (e != cudaSuccess) { // the copy was queued but cannot be tracked: let it leave the blob now
        cudaGetLastError();
        const cudaError_t w = cudaStreamSynchronize(stream);
        if (w != cudaSuccess)
            return pkv_fail(ctx, PKV_ERR_CUDA, "plan upload: waiting for an untracked copy failed: %s",
                            cudaGetErrorString(w));
        h->pending = false;
    } else {
        h->pending = true;
        h->stream = stream;
    }
    *queued = true;
    return PKV_OK;
}

constexpr int kMaxGridY = 65535; // the rectangular routes' grid: (rows, KV heads, splits)

cuda_state *state_of(pkv_context *ctx) { return static_cast<cuda_state *>(ctx->backend_state); }

pkv_status cuda_supports(pkv_context *ctx, const pkv_problem *p) {
    if (p->dtype != PKV_DTYPE_FP16 && p->dtype != PKV_DTYPE_BF16)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_DTYPE, "the CUDA backend runs fp16 and bf16");
    if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_HEAD_DIM, "the CUDA backend runs head dims 64, 128, 256");
    if (p->num_qo_heads / p->num_kv_heads > PKV_MAX_GROUP)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "the CUDA backend runs G <= %d", PKV_MAX_GROUP);
    if (p->num_kv_heads > kMaxGridY)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "num_kv_heads %d is above the grid limit %d", p->num_kv_heads,
                        kMaxGridY);
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
        const bool locked = plan->blob_ops == &blob_ops; // the plan's blob is this backend's page-locked memory
        if (locked) {
            const pkv_status ds = direct_upload(ctx, s, plan, ws, st, &queued);
            if (ds != PKV_OK) return ds;
        }
        if (!queued && !s->pageable) {
            const pkv_status us = staged_upload(ctx, s, plan, ws, st, &queued);
            if (us != PKV_OK) return us;
        }
        if (!queued) {
            PKV_CUDA_TRY(ctx, cudaMemcpyAsync(ws, plan->blob, plan->blob_bytes, cudaMemcpyHostToDevice, st));
            if (locked) // a copy from page-locked memory reads it when it runs, and no event tracks this one
                PKV_CUDA_TRY(ctx, cudaStreamSynchronize(st));
        }
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
    pkv_page_fault f;
    if (e != cudaSuccess && pkv_cuda_page_fault(ctx, &f)) // an earlier run trapped in bounds mode
        return pkv_fail(ctx, PKV_ERR_CUDA,
                        "decode launch failed: %s (bounds mode: page id %d of row %d, KV head %d, page %d of the "
                        "row, is outside [0, %lld))",
                        cudaGetErrorString(e), f.page_id, f.row, f.kv_head, f.page, (long long)plan->problem.num_pages);
    if (e != cudaSuccess)
        return pkv_fail(ctx, PKV_ERR_CUDA, "decode launch failed: %s", cudaGetErrorString(e));
    return PKV_OK;
}

void cuda_destroy(pkv_context *ctx) {
#ifdef PKV_TIMELINE
    const char *tl = ctx->tuning.timeline_out;
    if (tl[0] && pkv::timeline_dump(tl) != 0) fprintf(stderr, "persistentkv: cannot write the timeline to %s\n", tl);
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
        if (s->fault) cudaFreeHost(s->fault);
        cudaGetLastError(); // nothing to report from a teardown
    }
    free(ctx->backend_state);
    ctx->backend_state = nullptr;
}

pkv_status cuda_append(pkv_context *ctx, const pkv_problem *p, int32_t batch_size, int32_t num_tokens,
                       const pkv_append_tensors *t, void *stream) {
    PKV_CUDA_TRY(ctx, cudaSetDevice(state_of(ctx)->device));
    return pkv_cuda_append(ctx, p, batch_size, num_tokens, t, stream);
}

pkv_status cuda_copy_pages(pkv_context *ctx, const pkv_problem *p, const pkv_page_copy *copies, int32_t count,
                           void *k_cache, void *v_cache, int64_t page_stride, void *stream) {
    PKV_CUDA_TRY(ctx, cudaSetDevice(state_of(ctx)->device));
    return pkv_cuda_copy_pages(ctx, p, copies, count, k_cache, v_cache, page_stride, stream);
}

const pkv_backend_ops cuda_ops = {"cuda",       cuda_run,    cuda_upload,     cuda_supports,
                                  cuda_destroy, cuda_append, cuda_copy_pages, &blob_ops};

} // namespace

extern "C" pkv_status pkv_cuda_decode_kernel_of(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t,
                                                const char **name) {
    if (ctx->ops != &cuda_ops) return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "not a CUDA context");
    const pkv_status st = cuda_supports(ctx, &plan->problem);
    if (st != PKV_OK) return st;
    *name = pkv_cuda_decode_kernel_name(plan, t, &state_of(ctx)->launch);
    return PKV_OK;
}

extern "C" int pkv_cuda_page_fault(const pkv_context *ctx, pkv_page_fault *out) {
    const cuda_state *s = ctx->ops == &cuda_ops ? static_cast<const cuda_state *>(ctx->backend_state) : nullptr;
    if (!s || !s->fault) return 0;
    const volatile int32_t *f = s->fault; // written by a kernel through the mapped address
    if (f[PKV_FAULT_STATE] != 2) return 0;
    *out = {f[PKV_FAULT_ROW], f[PKV_FAULT_HEAD], f[PKV_FAULT_PAGE], f[PKV_FAULT_ID]};
    return 1;
}

extern "C" int pkv_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" cudaError_t pkv_cuda_decode_init_attributes(int cc_major, size_t smem_optin,
                                                       int32_t tma_stages[PKV_TMA_HEAD_DIMS][2],
                                                       int32_t tma_max_stages[PKV_TMA_HEAD_DIMS], int *sm90_code) {
    return pkv::decode_init_attributes(cc_major, smem_optin, tma_stages, tma_max_stages, sm90_code);
}

extern "C" int pkv_cuda_decode_resident_ctas(int32_t group, int32_t head_dim) {
    return pkv::decode_resident_ctas(group, head_dim);
}

extern "C" cudaError_t pkv_cuda_decode_run(const pkv_plan *plan, void *workspace, const pkv_tensors *t,
                                           cudaStream_t stream, const pkv_cuda_launch_opts *opts) {
    return pkv::decode_run(plan, workspace, t, stream, opts);
}

extern "C" const char *pkv_cuda_decode_kernel_name(const pkv_plan *plan, const pkv_tensors *t,
                                                   const pkv_cuda_launch_opts *opts) {
    return pkv::decode_kernel_name(plan, t, opts);
}

/* auto's cost model until a policy file replaces it: the read bandwidth from the memory clock and bus width
 * times the share of that peak a streaming read reaches (the read ceiling of docs/kernel-notes.md, H200),
 * and a fixed cost per launch */
constexpr double kStreamReadShare = 0.92;
constexpr double kLaunchUs = 3.0;

extern "C" pkv_status pkv_cuda_backend_init(pkv_context *ctx, int32_t device, bool pdl, bool check_pages) {
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
    s->launch.merge_kernel = tu.merge;
    s->launch.merge_wide_at = tu.merge_wide_at;
    /* sm_90: K and V through shared memory (tensor copies, cp.async) where the shape allows (launch.cu
     * tma_maps_for); tma=0: the register kernels, as on sm_80-89 */
    s->launch.tma = sm90_code && tu.tma;
    s->launch.tma_stages = tu.tma_stages;
    /* graph-stable plans: a step of at most one task per SM runs them in the grid's first CTAs, which load
     * their entries with the task count; up to a resident wave of tasks are claimed by the SM a CTA lands on
     * (claim.cuh), over the device's SMs unless claim_sms deals them over fewer (tests: an SM is then dealt
     * more tasks than it gets CTAs, and the CTAs that wait for unclaimed tasks must find and run them); more
     * spread over the grid (docs/kernel-notes.md v13, v13b, v13c) */
    s->launch.graph_first = prop.multiProcessorCount;
    const int32_t nsm = tu.claim_sms > 0                          ? tu.claim_sms
                        : prop.multiProcessorCount > PKV_CLAIM_SMS ? PKV_CLAIM_SMS
                                                                   : prop.multiProcessorCount;
    s->launch.claim_sms = nsm;
    s->launch.claim_mul = pkv_graph_claim_multiplier(nsm);
    for (int k = 0; k < PKV_TMA_HEAD_DIMS; k++) {
        s->launch.tma_default_stages[k][0] = tma_stages[k][0];
        s->launch.tma_default_stages[k][1] = tma_stages[k][1];
        s->launch.tma_max_stages[k] = tma_max_stages[k];
    }
    ctx->backend_state = s;
    ctx->ops = &cuda_ops;
    if (check_pages) {
        void *host = nullptr, *dev = nullptr;
        if (cudaHostAlloc(&host, PKV_FAULT_WORDS * sizeof(int32_t), cudaHostAllocMapped) == cudaSuccess)
            s->fault = static_cast<int32_t *>(host); // cuda_destroy frees it
        if (!s->fault || cudaHostGetDevicePointer(&dev, host, 0) != cudaSuccess) {
            const cudaError_t e = cudaGetLastError();
            return pkv_fail(ctx, PKV_ERR_CUDA, "bounds mode: cannot map its fault record: %s", cudaGetErrorString(e));
        }
        memset(s->fault, 0, PKV_FAULT_WORDS * sizeof(int32_t));
        s->launch.fault = static_cast<int32_t *>(dev);
    }
    ctx->device = device;
    ctx->caps.parallelism = prop.multiProcessorCount;
    /* the planner's default tasks per SM: the heads-in-M kernel's residency at d = 128 (2 CTAs per SM on
     * every GPU this library is built for; the wave of kernel-notes v3) */
    const int m16 = pkv_cuda_decode_resident_ctas(16, 128);
    ctx->caps.ctas_per_unit = m16 > 0 ? m16 : 2;
    /* and the residency of the register kernel that runs each head dim and group size (the d = 64 kernels
     * hold more CTAs than the d = 128 ones; heads in N, for G <= 8, more than heads in M) */
    static const int32_t dims[PKV_TMA_HEAD_DIMS] = {64, 128, 256};
    for (int k = 0; k < PKV_TMA_HEAD_DIMS; k++) {
        ctx->caps.resident[k][0] = pkv_cuda_decode_resident_ctas(8, dims[k]);
        ctx->caps.resident[k][1] = pkv_cuda_decode_resident_ctas(16, dims[k]);
    }
    /* the pages the cp.async copies gather row by row (sm_90 ring on): those whose largest power-of-two
     * divisor is below the tensor copies' chunk; the planner then fills a wave of every resident CTA of the
     * d = 64 kernels (src/plan/params.c plan_resolve_params; docs/kernel-notes.md v18) */
    ctx->caps.row_gather_below = s->launch.tma ? PKV_TMA_CHUNK_TOKENS : 0;
    snprintf(ctx->device_name, sizeof ctx->device_name, "%.64s (%d SMs, sm_%d%d%s)", prop.name, prop.multiProcessorCount,
             prop.major, prop.minor,
             prop.major >= 9 && !sm90_code ? "; this build has no sm_90 code: register kernels, no PDL" : "");
    int mem_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
        cudaGetLastError();
        mem_khz = bus_bits = 0;
    }
    const double peak_gbps = 2.0 * mem_khz * 1e3 * (bus_bits / 8.0) / 1e9;
    pkv_cost_model_default(&ctx->cost_model, prop.multiProcessorCount, kStreamReadShare * peak_gbps, kLaunchUs);
    snprintf(ctx->cost_model.device, sizeof ctx->cost_model.device, "defaults for %.64s (%.0f GB/s peak)", prop.name,
             peak_gbps);
    ctx->has_cost_model = true;
    return PKV_OK;
}
