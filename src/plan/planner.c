/* planner.c - turns one decode step (per-row lengths) into a plan: tasks over non-empty
 * (row, KV head, split) token ranges, merges for rows split in more than one part, launch phases
 * and counters.  Pure C, host only, O(B + tasks), allocates only to grow the plan's storage.
 *
 * The public entry points live here, with plan_impl, the step as a sequence of named steps: check the
 * inputs, see a sliding window's attended tokens, resolve the options, take the wave from the backend's
 * capabilities (params.c), fix a graph-stable plan's grid (layout.c), choose the route (policy.c), emit
 * it (emit.c), lay out the workspace and count (layout.c, emit.c).  plan_internal.h maps the files.
 */
#include "plan_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint_fast64_t pkv_next_generation = 1;

static const char *const route_names[PKV_ROUTE_COUNT_] = {"auto", "single", "split", "bucketed", "workqueue", "fused"};

const char *pkv_route_name(pkv_route route) {
    return (route >= 0 && route < PKV_ROUTE_COUNT_) ? route_names[route] : "unknown";
}

pkv_status pkv_route_parse(const char *name, pkv_route *route) {
    if (!name || !route) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "route name or output is NULL");
    for (int i = 0; i < PKV_ROUTE_COUNT_; i++)
        if (strcmp(name, route_names[i]) == 0) {
            *route = (pkv_route)i;
            return PKV_OK;
        }
    return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT,
                    "unknown route '%s' (expected auto, single, split, bucketed, workqueue or fused)", name);
}

void pkv_plan_options_default(pkv_plan_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->route = PKV_ROUTE_AUTO;
}

void pkv_backend_caps_host(pkv_backend_caps *caps) {
    if (!caps) return;
    memset(caps, 0, sizeof *caps);
    caps->ctas_per_unit = PKV_HOST_CTAS_PER_UNIT;
}

pkv_status pkv_plan_create(pkv_plan **plan) {
    if (!plan) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "plan output pointer is NULL");
    *plan = (pkv_plan *)calloc(1, sizeof **plan);
    if (!*plan) return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot allocate a plan");
    return PKV_OK;
}

void pkv_plan_free(pkv_plan *plan) {
    if (!plan) return;
    if (plan->blob_ops) {
        plan->blob_ops->free(plan->blob);
        for (int32_t k = 0; k < plan->num_spares; k++) plan->blob_ops->free(plan->blob_spare[k]);
    } else {
        free(plan->blob);
    }
    free(plan->phases);
    free(plan->scratch);
    free(plan->win);
    free(plan->memo);
    free(plan);
}

/* The options that size a plan within their documented bounds (PKV_ERR_INVALID_ARGUMENT otherwise), so
 * the planner's task, slot and byte counts stay far from overflow. */
static pkv_status check_options(pkv_context *ctx, const pkv_plan_options *o, const pkv_problem *p) {
    if (o->route < 0 || o->route >= PKV_ROUTE_COUNT_)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "route %d is not a known route", (int)o->route);
    if (o->parallelism > PKV_MAX_PARALLELISM)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "parallelism %d is above %d", o->parallelism,
                        PKV_MAX_PARALLELISM);
    if (o->ctas_per_unit > PKV_MAX_PER_UNIT)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "ctas_per_unit %d is above %d", o->ctas_per_unit,
                        PKV_MAX_PER_UNIT);
    /* (num_splits and min_chunk_tokens need no bound: max_splits and the rows' lengths clamp them) */
    if (o->max_splits > PKV_MAX_SPLITS_OPT)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "max_splits %d is above %d", o->max_splits, PKV_MAX_SPLITS_OPT);
    if ((int64_t)o->chunk_pages * p->page_size > PKV_MAX_SEQ_LEN)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "chunk_pages %d (x %d tokens) is above %d tokens", o->chunk_pages,
                        p->page_size, PKV_MAX_SEQ_LEN);
    if (o->graph_max_batch > PKV_MAX_BATCH)
        return pkv_fail(ctx, PKV_ERR_BATCH_SIZE, "graph_max_batch %d is above %d", o->graph_max_batch, PKV_MAX_BATCH);
    return PKV_OK;
}

/* Capabilities given from outside a backend (pkv_plan_step_caps, pkv_workspace_size_caps) within the
 * bounds a backend keeps to. */
static pkv_status check_caps(const pkv_backend_caps *c) {
    if (!c) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "capabilities are NULL");
    if (c->parallelism < 0 || c->parallelism > PKV_MAX_PARALLELISM)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "capabilities: parallelism %d is not in [0, %d]",
                        c->parallelism, PKV_MAX_PARALLELISM);
    if (c->ctas_per_unit < 1 || c->ctas_per_unit > PKV_MAX_PER_UNIT)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "capabilities: ctas_per_unit %d is not in [1, %d]",
                        c->ctas_per_unit, PKV_MAX_PER_UNIT);
    for (int d = 0; d < 3; d++)
        for (int g = 0; g < 2; g++)
            if (c->resident[d][g] < 0 || c->resident[d][g] > PKV_MAX_PER_UNIT)
                return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT,
                                "capabilities: resident[%d][%d] %d is not in [0, %d]", d, g, c->resident[d][g],
                                PKV_MAX_PER_UNIT);
    if (c->row_gather_below < 0)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "capabilities: row_gather_below %d is negative",
                        c->row_gather_below);
    return PKV_OK;
}

/* ---- plan_impl's steps ------------------------------------------------------------------------ */

/* Under a sliding window the planner sees each row's attended tokens (from the start of the page that
 * holds the first one) as its length, and the rows' tasks start at the window's first token: *windowed
 * gets those lengths (in the plan's window buffer) and *row_starts the page-aligned starts; otherwise
 * the table stays as it is. */
static pkv_status window_step(pkv_context *ctx, const pkv_problem *problem, pkv_plan *plan,
                              const pkv_page_table **table, pkv_page_table *windowed, const int32_t **row_starts) {
    *row_starts = NULL;
    if (problem->window <= 0 || (*table)->batch_size <= 0) return PKV_OK;
    const int32_t B = (*table)->batch_size;
    const pkv_status st = plan_grow_i32(ctx, &plan->win, &plan->win_cap, 2 * (size_t)B, "the window's row data");
    if (st != PKV_OK) return st;
    int32_t *wl = plan->win, *ws = plan->win + B;
    plan_window_lengths(problem, *table, wl, ws);
    *windowed = **table;
    windowed->seq_lens = wl;
    *table = windowed;
    *row_starts = ws;
    return PKV_OK;
}

/* The options in force (defaults for NULL), checked, and the parallelism they leave (the options', else
 * the capabilities'). */
static pkv_status resolve_options(pkv_context *ctx, const pkv_backend_caps *caps, const pkv_problem *problem,
                                  const pkv_plan_options *opts_in, pkv_plan_options *opts, int32_t *parallelism) {
    if (opts_in)
        *opts = *opts_in;
    else
        pkv_plan_options_default(opts);
    const pkv_status st = check_options(ctx, opts, problem);
    if (st != PKV_OK) return st;
    *parallelism = opts->parallelism > 0 ? opts->parallelism : caps->parallelism;
    if (*parallelism <= 0)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "parallelism must be positive (set it in the options)");
    return PKV_OK;
}

/* Graph-stable plans (graph_max_batch > 0): the work queue on a fixed grid of *graph_cap tasks (see
 * persistentkv.h), whose wave stays within the grid; else *graph_cap = 0.  Clears the plan's graph
 * fields either way. */
static pkv_status graph_step(pkv_context *ctx, const pkv_plan_options *opts, const pkv_problem *problem, int32_t B,
                             pkv_plan *plan, plan_params *pp, pkv_route *route, int32_t *graph_cap) {
    *graph_cap = 0;
    plan->graph_tasks = plan->graph_merges = 0;
    plan->graph_signature = 0;
    if (opts->graph_max_batch <= 0) return PKV_OK;
    if (B > opts->graph_max_batch)
        return pkv_fail(ctx, PKV_ERR_BATCH_SIZE, "batch of %d rows above the graph-stable plan's graph_max_batch %d", B,
                        opts->graph_max_batch);
    if (*route != PKV_ROUTE_AUTO && *route != PKV_ROUTE_WORKQUEUE)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "graph-stable plans run the work queue (route auto or workqueue), not %s",
                        pkv_route_name(*route));
    *route = PKV_ROUTE_WORKQUEUE;
    int64_t cap = 0;
    const pkv_status st = plan_graph_capacity(ctx, opts, pp->slots, problem, &cap);
    if (st != PKV_OK) return st;
    *graph_cap = (int32_t)cap;
    if (pp->P > *graph_cap) pp->P = *graph_cap; /* the chunk search keeps the tasks within the wave */
    return PKV_OK;
}

static pkv_status emit_route(const plan_step *s, plan_params *pp, int32_t wq_chunk, pkv_plan *plan) {
    switch (plan->route) {
    case PKV_ROUTE_SINGLE:
    case PKV_ROUTE_SPLIT: return plan_emit_rect(s, pp, plan);
    case PKV_ROUTE_BUCKETED: return plan_emit_bucketed(s, pp, plan);
    default: return plan_emit_workqueue(s, pp, wq_chunk, plan); /* WORKQUEUE and FUSED */
    }
}

/* One step for a device of these capabilities; ctx (may be NULL) receives the errors; model: the cost
 * model auto weighs (NULL: the auto rule). */
static pkv_status plan_impl(pkv_context *ctx, const pkv_backend_caps *caps, const pkv_cost_model *model,
                            const pkv_problem *problem, const pkv_page_table *table, const pkv_plan_options *opts_in,
                            pkv_plan *plan) {
    if (plan) plan->generation = 0, plan->last_patched = false; /* a plan that fails, even at the checks, is not runnable */
    pkv_status st = pkv_check_problem(ctx, problem);
    if (st != PKV_OK) return st;
    st = pkv_check_table(ctx, problem, table, table && table->kv_page_indices != NULL);
    if (st != PKV_OK) return st;
    if (!plan) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "plan is NULL");
    pkv_page_table windowed;
    const int32_t *row_starts;
    st = window_step(ctx, problem, plan, &table, &windowed, &row_starts);
    if (st != PKV_OK) return st;
    pkv_plan_options opts;
    int32_t parallelism;
    st = resolve_options(ctx, caps, problem, opts_in, &opts, &parallelism);
    if (st != PKV_OK) return st;

    const plan_caps pc = plan_caps_for(caps, problem);
    plan_params pp;
    plan_resolve_params(&opts, parallelism, &pc, problem, table, &pp);
    const int32_t B = table->batch_size;
    plan->slots = pp.slots;
    plan->problem = *problem;
    plan->batch_size = B;
    plan->group = problem->num_qo_heads / problem->num_kv_heads;

    pkv_route route = opts.route;
    int32_t graph_cap;
    st = graph_step(ctx, &opts, problem, B, plan, &pp, &route, &graph_cap);
    if (st != PKV_OK) return st;
    int32_t wq_chunk = -1; /* the work queue's chunk (pages), once searched */
    if (route == PKV_ROUTE_AUTO && model)
        route = plan_policy_choose(model, &opts, parallelism, &pc, problem, table->seq_lens, B, &pp, &wq_chunk);
    else if (route == PKV_ROUTE_AUTO)
        route = plan_auto_rule(&pp, problem);
    plan->route = route;

    st = plan_blob_acquire(ctx, plan); /* a blob no pending upload reads */
    if (st != PKV_OK) return st;
    const plan_step step = {ctx, problem, table, row_starts, &opts, graph_cap};
    st = emit_route(&step, &pp, wq_chunk, plan);
    if (st != PKV_OK) return st;
    plan_finish_layout(plan, graph_cap, opts.graph_max_batch, !plan->last_patched);
    plan_compute_counters(plan);
    plan->generation = atomic_fetch_add(&pkv_next_generation, 1);
    return PKV_OK;
}

/* ---- entry points ----------------------------------------------------------------------------- */

pkv_status pkv_plan_step(pkv_context *ctx, const pkv_problem *problem, const pkv_page_table *table,
                         const pkv_plan_options *opts, pkv_plan *plan) {
    if (!ctx) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "context is NULL");
    pkv_clear_error(ctx);
    if (plan) plan->generation = 0; /* a failed step leaves no runnable plan (not the previous step's) */
    if (ctx->ops->supports && problem) {
        pkv_status st = pkv_check_problem(ctx, problem);
        if (st != PKV_OK) return st;
        st = ctx->ops->supports(ctx, problem);
        if (st != PKV_OK) return st;
    }
    return plan_impl(ctx, &ctx->caps, ctx->has_cost_model ? &ctx->cost_model : NULL, problem, table, opts, plan);
}

pkv_status pkv_plan_step_host(const pkv_problem *problem, const pkv_page_table *table, const pkv_plan_options *opts,
                              pkv_plan *plan) {
    pkv_backend_caps caps;
    pkv_backend_caps_host(&caps);
    return plan_impl(NULL, &caps, NULL, problem, table, opts, plan);
}

pkv_status pkv_plan_step_caps(const pkv_backend_caps *caps, const pkv_cost_model *model, const pkv_problem *problem,
                              const pkv_page_table *table, const pkv_plan_options *opts, pkv_plan *plan) {
    if (plan) plan->generation = 0;
    const pkv_status st = check_caps(caps);
    if (st != PKV_OK) return st;
    return plan_impl(NULL, caps, model, problem, table, opts, plan);
}

static pkv_status workspace_size_impl(pkv_context *ctx, const pkv_backend_caps *caps, const pkv_problem *problem,
                                      int32_t max_batch, const pkv_plan_options *opts_in, size_t *bytes) {
    if (!bytes) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "bytes output is NULL");
    pkv_status st = pkv_check_problem(ctx, problem);
    if (st != PKV_OK) return st;
    if (max_batch < 0 || max_batch > PKV_MAX_BATCH)
        return pkv_fail(ctx, PKV_ERR_BATCH_SIZE, "max_batch %d is not in [0, %d]", max_batch, PKV_MAX_BATCH);
    pkv_plan_options opts;
    if (opts_in)
        opts = *opts_in;
    else
        pkv_plan_options_default(&opts);
    st = check_options(ctx, &opts, problem);
    if (st != PKV_OK) return st;
    const int64_t par = opts.parallelism > 0 ? opts.parallelism : caps->parallelism;
    if (par <= 0) return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "parallelism unknown: pass a context or set it");
    return plan_workspace_bound(ctx, caps, problem, max_batch, &opts, par, bytes);
}

pkv_status pkv_workspace_size(pkv_context *ctx, const pkv_problem *problem, int32_t max_batch,
                              const pkv_plan_options *opts, size_t *bytes) {
    pkv_backend_caps host;
    pkv_backend_caps_host(&host);
    return workspace_size_impl(ctx, ctx ? &ctx->caps : &host, problem, max_batch, opts, bytes);
}

pkv_status pkv_workspace_size_caps(const pkv_backend_caps *caps, const pkv_problem *problem, int32_t max_batch,
                                   const pkv_plan_options *opts, size_t *bytes) {
    const pkv_status st = check_caps(caps);
    if (st != PKV_OK) return st;
    return workspace_size_impl(NULL, caps, problem, max_batch, opts, bytes);
}

/* ---- views -------------------------------------------------------------------------------------- */
pkv_route pkv_plan_route(const pkv_plan *p) { return p ? p->route : PKV_ROUTE_AUTO; }
const pkv_counters *pkv_plan_counters(const pkv_plan *p) { return p ? &p->counters : NULL; }
int32_t pkv_plan_num_tasks(const pkv_plan *p) { return p ? p->num_tasks : 0; }
const pkv_task *pkv_plan_tasks(const pkv_plan *p) { return p ? p->tasks : NULL; }
int32_t pkv_plan_num_merges(const pkv_plan *p) { return p ? p->num_merges : 0; }
const pkv_merge *pkv_plan_merges(const pkv_plan *p) { return p ? p->merges : NULL; }
int32_t pkv_plan_num_phases(const pkv_plan *p) { return p ? p->num_phases : 0; }
const pkv_phase *pkv_plan_phases(const pkv_plan *p) { return p ? p->phases : NULL; }
int32_t pkv_plan_num_rows(const pkv_plan *p) { return p ? p->num_rows : 0; }
const pkv_row_sched *pkv_plan_rows(const pkv_plan *p) { return p ? p->rows : NULL; }
size_t pkv_plan_workspace_size(const pkv_plan *p) { return p ? p->workspace_bytes : 0; }
uint64_t pkv_plan_graph_signature(const pkv_plan *p) { return p && p->generation ? p->graph_signature : 0; }
int32_t pkv_plan_grid_tasks(const pkv_plan *p) { return !p ? 0 : p->graph_tasks > 0 ? p->graph_tasks : p->num_tasks; }
