/* bridge.c - the lab's entry points that need the library's internals (pkv_lab.h): built into the lab
 * libraries only, never into the serving library.  Each is a thin read of a plan or a context, or a
 * forward to an internal function under its lab name. */
#include "internal.h"
#include "pkv_lab.h"

#include <stdarg.h>

_Static_assert(PKV_LAB_COUNTS_TASKS == PKV_COUNTS_TASKS && PKV_LAB_COUNTS_MERGES == PKV_COUNTS_MERGES &&
                   PKV_LAB_COUNTS_CLAIMED == PKV_COUNTS_CLAIMED && PKV_LAB_COUNTS_ARRIVED == PKV_COUNTS_ARRIVED &&
                   PKV_LAB_COUNTS_CURSOR == PKV_COUNTS_CURSOR && PKV_LAB_COUNTS_WIDEST == PKV_COUNTS_WIDEST &&
                   PKV_LAB_COUNTS_SM == PKV_COUNTS_SM,
               "the lab's names of the counts words follow internal.h");

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

int32_t pkv_lab_claim_multiplier(int32_t nsm) { return pkv_graph_claim_multiplier(nsm); }

pkv_status pkv_dev_decode_kernel(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t, const char **name) {
    if (!ctx || !plan || !t || !name) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "context, plan, tensors and name must not be NULL");
    *name = "";
    return pkv_cuda_decode_kernel_of(ctx, plan, t, name);
}
