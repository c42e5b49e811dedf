/* bridge.c - the lab's entry points that need the library's internals (pkv_lab.h): built into the lab
 * libraries only, never into the serving library.  Each is a thin read of a plan or a context, or a
 * forward to an internal function under its lab name. */
#include "internal.h"
#include "pkv_lab.h"

#include <stdarg.h>
#include <string.h>

_Static_assert(PKV_LAB_COUNTS_TASKS == PKV_COUNTS_TASKS && PKV_LAB_COUNTS_MERGES == PKV_COUNTS_MERGES &&
                   PKV_LAB_COUNTS_CLAIMED == PKV_COUNTS_CLAIMED && PKV_LAB_COUNTS_ARRIVED == PKV_COUNTS_ARRIVED &&
                   PKV_LAB_COUNTS_CURSOR == PKV_COUNTS_CURSOR && PKV_LAB_COUNTS_WIDEST == PKV_COUNTS_WIDEST &&
                   PKV_LAB_COUNTS_SM == PKV_COUNTS_SM,
               "the lab's names of the counts words follow internal.h");
_Static_assert(PKV_LAB_MAX_COUNTS_WORDS == PKV_COUNTS_WORDS, "the lab's bound of the counts words");

pkv_status pkv_lab_fail(pkv_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pkv_failv(st, fmt, ap);
    va_end(ap);
    return st;
}

int32_t pkv_lab_context_device(const pkv_context *ctx) {
    return ctx && ctx->kind == PKV_BACKEND_CUDA ? ctx->device : -1;
}

pkv_status pkv_lab_plan_counts(const pkv_plan *plan, size_t *offset, int32_t *words) {
    if (!plan || !offset || !words) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "plan, offset and words must not be NULL");
    if (plan->graph_tasks == 0) return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "the plan is not graph-stable");
    *offset = plan->off_counts;
    *words = PKV_COUNTS_WORDS;
    return PKV_OK;
}

int32_t pkv_lab_plan_widest_merge(const pkv_plan *plan) { return plan ? plan->max_merge_count : 0; }

int32_t pkv_lab_plan_patched(const pkv_plan *plan) { return plan && plan->generation && plan->last_patched; }

int32_t pkv_lab_claim_multiplier(int32_t nsm) { return pkv_graph_claim_multiplier(nsm); }

pkv_status pkv_dev_decode_kernel(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t, const char **name) {
    if (!ctx || !plan || !t || !name) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "context, plan, tensors and name must not be NULL");
    *name = "";
    return pkv_cuda_decode_kernel_of(ctx, plan, t, name);
}

_Static_assert(sizeof(pkv_lab_caps) == sizeof(pkv_backend_caps), "pkv_lab_caps mirrors pkv_backend_caps");

static pkv_backend_caps caps_of(const pkv_lab_caps *c) {
    pkv_backend_caps b;
    b.parallelism = c->parallelism;
    b.ctas_per_unit = c->ctas_per_unit;
    memcpy(b.resident, c->resident, sizeof b.resident);
    b.row_gather_below = c->row_gather_below;
    return b;
}

pkv_status pkv_lab_context_caps(const pkv_context *ctx, pkv_lab_caps *caps) {
    if (!ctx || !caps) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "context and caps must not be NULL");
    caps->parallelism = ctx->caps.parallelism;
    caps->ctas_per_unit = ctx->caps.ctas_per_unit;
    memcpy(caps->resident, ctx->caps.resident, sizeof caps->resident);
    caps->row_gather_below = ctx->caps.row_gather_below;
    return PKV_OK;
}

pkv_status pkv_lab_context_set_caps(pkv_context *ctx, const pkv_lab_caps *caps) {
    if (!ctx || !caps) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "context and caps must not be NULL");
    bool ok = caps->parallelism >= 1 && caps->parallelism <= PKV_MAX_PARALLELISM && caps->ctas_per_unit >= 1 &&
              caps->ctas_per_unit <= PKV_MAX_PER_UNIT && caps->row_gather_below >= 0;
    for (int d = 0; d < 3; d++)
        for (int g = 0; g < 2; g++) ok &= caps->resident[d][g] >= 0 && caps->resident[d][g] <= PKV_MAX_PER_UNIT;
    if (!ok) return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "capabilities out of range");
    ctx->caps = caps_of(caps);
    return PKV_OK;
}

pkv_status pkv_lab_plan_step_caps(const pkv_lab_caps *caps, const pkv_cost_model *model, const pkv_problem *problem,
                                  const pkv_page_table *table, const pkv_plan_options *opts, pkv_plan *plan) {
    if (!caps) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "caps is NULL");
    const pkv_backend_caps b = caps_of(caps);
    return pkv_plan_step_caps(&b, model, problem, table, opts, plan);
}

int32_t pkv_plan_num_state_slots(const pkv_plan *p) { return p ? p->num_state_slots : 0; }
const pkv_problem *pkv_plan_problem(const pkv_plan *p) { return p ? &p->problem : NULL; }
int32_t pkv_plan_batch_size(const pkv_plan *p) { return p ? p->batch_size : 0; }
