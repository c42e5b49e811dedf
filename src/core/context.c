/* context.c - context creation, backend selection and the public entry points of run. */
#include "internal.h"

#include <inttypes.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

static atomic_uint_fast64_t pkv_next_context_id = 1;

void pkv_context_config_default(pkv_context_config *cfg) {
    if (!cfg) return;
    cfg->backend = PKV_BACKEND_BEST;
    cfg->device = 0;
    cfg->num_threads = 0;
    cfg->pdl = 1;
    cfg->check_pages = 0;
}

int pkv_context_page_fault(const pkv_context *ctx, pkv_page_fault *out) {
    if (!ctx || !out) return 0;
    if (ctx->kind == PKV_BACKEND_CUDA) return pkv_cuda_page_fault(ctx, out);
    if (ctx->has_page_fault) *out = ctx->page_fault;
    return ctx->has_page_fault ? 1 : 0;
}

int pkv_cuda_available(void) { return pkv_cuda_device_count() > 0; }

pkv_status pkv_context_create(const pkv_context_config *cfg, pkv_context **out) {
    if (!out) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "context output pointer is NULL");
    *out = NULL;
    pkv_context_config def;
    if (!cfg) {
        pkv_context_config_default(&def);
        cfg = &def;
    }
    if (cfg->backend != PKV_BACKEND_CPU && cfg->backend != PKV_BACKEND_CUDA && cfg->backend != PKV_BACKEND_BEST)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "backend %d is not CPU, CUDA or BEST", (int)cfg->backend);
    pkv_context *ctx = (pkv_context *)calloc(1, sizeof *ctx);
    if (!ctx) return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot allocate a context");
    ctx->id = atomic_fetch_add(&pkv_next_context_id, 1);
    pkv_status st = pkv_tuning_from_env(NULL, &ctx->tuning); /* the message thread-locally: ctx goes away */
    if (st != PKV_OK) {
        free(ctx);
        return st;
    }
    pkv_backend_kind kind = cfg->backend;
    if (kind == PKV_BACKEND_BEST) kind = pkv_cuda_available() ? PKV_BACKEND_CUDA : PKV_BACKEND_CPU;
    ctx->kind = kind;
    st = kind == PKV_BACKEND_CUDA ? pkv_cuda_backend_init(ctx, cfg->device, cfg->pdl != 0, cfg->check_pages != 0)
                                  : pkv_cpu_backend_init(ctx, cfg->num_threads);
    const char *policy = ctx->tuning.policy;
    if (st == PKV_OK && policy[0]) {
        /* the policy file of this GPU (`pkv calibrate`): it applies to the backend it was measured
         * on (a CUDA runtime version: CUDA contexts; none: CPU contexts), others keep theirs */
        pkv_cost_model m;
        st = pkv_cost_model_load(policy, &m);
        const bool applies = st == PKV_OK && (m.cuda_version > 0) == (kind == PKV_BACKEND_CUDA);
        if (applies && m.parallelism != ctx->caps.parallelism)
            st = pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "%s was measured with parallelism %d, this %s has %d", policy,
                          m.parallelism, ctx->device_name, ctx->caps.parallelism);
        if (applies && st == PKV_OK) st = pkv_context_set_cost_model(ctx, &m);
        if (st != PKV_OK) { /* the reason, prefixed with the variable's name */
            char msg[400];
            const char *why = pkv_last_error(), *prefix = pkv_status_string(st);
            const size_t n = strlen(prefix);
            if (strncmp(why, prefix, n) == 0 && why[n] == ':' && why[n + 1] == ' ') why += n + 2;
            snprintf(msg, sizeof msg, "%s", why);
            pkv_fail(ctx, st, "PKV_POLICY: %s", msg);
        }
    }
    if (st != PKV_OK) {
        if (ctx->ops && ctx->ops->destroy) ctx->ops->destroy(ctx);
        free(ctx);
        return st;
    }
    *out = ctx;
    return PKV_OK;
}

void pkv_context_free(pkv_context *ctx) {
    if (!ctx) return;
    pkv_plan_free(ctx->scratch_plan);
    if (ctx->ops && ctx->ops->destroy) ctx->ops->destroy(ctx);
    free(ctx);
}

pkv_backend_kind pkv_context_backend(const pkv_context *ctx) { return ctx ? ctx->kind : PKV_BACKEND_CPU; }
int32_t pkv_context_parallelism(const pkv_context *ctx) { return ctx ? ctx->caps.parallelism : 0; }
const char *pkv_context_device_name(const pkv_context *ctx) { return ctx ? ctx->device_name : ""; }

static pkv_status check_run_args(pkv_context *ctx, const pkv_plan *plan, void *workspace, size_t ws_bytes) {
    if (!plan) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "plan is NULL");
    if (plan->generation == 0)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "plan holds no step: never planned, or its last pkv_plan_step failed");
    if (plan->workspace_bytes > 0 && !workspace)
        return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "workspace is NULL but the plan needs %zu bytes",
                        plan->workspace_bytes);
    if (ws_bytes < plan->workspace_bytes)
        return pkv_fail(ctx, PKV_ERR_WORKSPACE_TOO_SMALL, "workspace has %zu bytes, the plan needs %zu", ws_bytes,
                        plan->workspace_bytes);
    if (ctx->ops->supports) {
        pkv_status st = ctx->ops->supports(ctx, &plan->problem);
        if (st != PKV_OK) return st;
    }
    return PKV_OK;
}

pkv_status pkv_run(pkv_context *ctx, const pkv_plan *plan, void *workspace, size_t ws_bytes,
                   const pkv_tensors *t, void *stream) {
    if (!ctx) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "context is NULL");
    pkv_status st = check_run_args(ctx, plan, workspace, ws_bytes);
    if (st != PKV_OK) return st;
    if (!t) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "tensors is NULL");
    if (plan->batch_size > 0) {
        if (!t->q || !t->o) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "q and o must not be NULL");
        if (plan->counters.total_tokens > 0 && (!t->k_cache || !t->v_cache || !t->kv_page_indices))
            return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "k_cache, v_cache and kv_page_indices must not be NULL");
    }
    const int64_t dense = (int64_t)plan->problem.page_size * plan->problem.num_kv_heads * plan->problem.head_dim;
    if (t->kv_page_stride < 0 || (t->kv_page_stride > 0 && t->kv_page_stride < dense))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "kv_page_stride %" PRId64 " is neither 0 (dense) nor at least one page (%" PRId64 " elements)",
                        t->kv_page_stride, dense);
    if (t->kv_page_stride > 0 && plan->problem.num_pages > 0 &&
        t->kv_page_stride > (INT64_MAX / 2) / plan->problem.num_pages) /* page offsets stay in int64 */
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "kv_page_stride %" PRId64 " x %lld pages overflows",
                        t->kv_page_stride, (long long)plan->problem.num_pages);
    /* the page stride (checked above), then the row strides of q and o */
    const int64_t strides[3] = {t->kv_page_stride, t->q_row_stride, t->o_row_stride};
    const char *stride_names[3] = {"kv_page_stride", "q_row_stride", "o_row_stride"};
    const int64_t row = (int64_t)plan->problem.num_qo_heads * plan->problem.head_dim;
    for (int i = 1; i < 3; i++) {
        if (strides[i] < 0 || (strides[i] > 0 && strides[i] < row))
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                            "%s %" PRId64 " is neither 0 (dense) nor at least one row (Hq x head_dim = %" PRId64 ")",
                            stride_names[i], strides[i], row);
        if (strides[i] > (INT64_MAX / 2) / ((int64_t)plan->batch_size + 1)) /* row offsets stay in int64 */
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "%s %" PRId64 " x %d rows overflows", stride_names[i],
                            strides[i], plan->batch_size);
    }
    /* every element at its natural alignment (fp16/bf16 2 bytes, fp8 1, lse and page ids 4, the workspace's
     * states and counters 8), on both backends; the CUDA kernels use 16-byte vector accesses (below) */
    {
        const void *ptrs[] = {t->q, t->k_cache, t->v_cache, t->o, t->lse, t->kv_page_indices, workspace};
        const char *names[] = {"q", "k_cache", "v_cache", "o", "lse", "kv_page_indices", "workspace"};
        const unsigned kv_align = (unsigned)pkv_kv_elem_size(&plan->problem);
        const unsigned align[] = {2, kv_align, kv_align, 2, 4, 4, 8};
        for (int i = 0; i < 7; i++)
            if (((uintptr_t)ptrs[i] & (align[i] - 1u)) != 0)
                return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "%s is not %u-byte aligned", names[i], align[i]);
    }
    st = pkv_check_kv_scales(ctx, &plan->problem, t->k_scale, t->v_scale, t->k_head_scales, t->v_head_scales,
                             "pkv_run");
    if (st != PKV_OK) return st;
    if (ctx->kind == PKV_BACKEND_CUDA) {
        for (int i = 0; i < 3; i++)
            if (strides[i] % 8 != 0)
                return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                                "%s %" PRId64 " is not a multiple of 8 elements (16 bytes)", stride_names[i],
                                strides[i]);
        const void *ptrs[] = {t->q, t->k_cache, t->v_cache, t->o, workspace};
        const char *names[] = {"q", "k_cache", "v_cache", "o", "workspace"};
        for (int i = 0; i < 5; i++)
            if (((uintptr_t)ptrs[i] & 15u) != 0)
                return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "%s is not 16-byte aligned", names[i]);
    }
    return ctx->ops->run(ctx, plan, workspace, ws_bytes, t, stream);
}

pkv_status pkv_plan_upload(pkv_context *ctx, const pkv_plan *plan, void *workspace, size_t ws_bytes,
                           void *stream) {
    if (!ctx) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "context is NULL");
    pkv_status st = check_run_args(ctx, plan, workspace, ws_bytes);
    if (st != PKV_OK) return st;
    return ctx->ops->upload ? ctx->ops->upload(ctx, plan, workspace, ws_bytes, stream) : PKV_OK;
}
