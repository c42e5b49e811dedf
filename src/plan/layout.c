/* layout.c - the plan's storage and the workspace: the blob layout [tasks | rows | merges and their
 * arrival counters | counts], the partial states after it, growing the plan's buffers, the workspace
 * bound of pkv_workspace_size, and the fixed capacity and launch signature of graph-stable plans. */
#include "plan_internal.h"

#include <stdlib.h>
#include <string.h>

/* First capacities of the plan's buffers (each doubles as needed). */
#define PKV_BLOB_MIN_BYTES 4096
#define PKV_PHASES_MIN 4
#define PKV_SCRATCH_MIN 256
/* The work claim's first stride: from nsm / PKV_CLAIM_STRIDE_DIV SMs up. */
#define PKV_CLAIM_STRIDE_DIV 8
/* FNV-1a, 64 bits */
#define PKV_FNV_OFFSET 14695981039346656037ull
#define PKV_FNV_PRIME 1099511628211ull

/* The plan blob's layout: [tasks | rows | merges and their arrival counters | counts], each part
 * PKV_WS_ALIGN aligned; counts (graph-stable plans only, else *off_counts = 0): PKV_COUNTS_WORDS int32
 * (the task and merge counts, then the CUDA work claim's words).  Returns the blob's bytes. */
size_t plan_blob_layout(int64_t ntasks, int64_t nrows, int64_t nmerges, bool counts, size_t *off_rows,
                        size_t *off_merges, size_t *off_counts) {
    *off_rows = pkv_align_up((size_t)ntasks * sizeof(pkv_task), PKV_WS_ALIGN);
    *off_merges = pkv_align_up(*off_rows + (size_t)nrows * sizeof(pkv_row_sched), PKV_WS_ALIGN);
    const size_t bytes =
        pkv_align_up(*off_merges + (size_t)nmerges * (sizeof(pkv_merge) + sizeof(int32_t)), PKV_WS_ALIGN);
    *off_counts = counts ? bytes : 0;
    return counts ? bytes + pkv_align_up(PKV_COUNTS_WORDS * sizeof(int32_t), PKV_WS_ALIGN) : bytes;
}

/* The workspace after a blob of blob_bytes: partial o (slots x G x d fp32), then each partial state's
 * running max and sum (slots x G x 2 fp32: m, l), each aligned (offsets in *off_o, *off_ml).  Returns the
 * workspace's bytes.  m and l stay apart rather than folded into one lse = m + ln l: at large scores (|m| far
 * above ln l) a float lse rounds ln l away, and with it the piece's token mass that the merge weighs by. */
size_t plan_states_layout(size_t blob_bytes, int64_t slots, int64_t group, int64_t head_dim, size_t *off_o,
                          size_t *off_ml) {
    *off_o = pkv_align_up(blob_bytes, PKV_WS_ALIGN);
    *off_ml = pkv_align_up(*off_o + (size_t)slots * (size_t)group * (size_t)head_dim * sizeof(float), PKV_WS_ALIGN);
    return pkv_align_up(*off_ml + (size_t)slots * (size_t)group * 2 * sizeof(float), PKV_WS_ALIGN);
}

/* Room for the lists of a step (counts: a graph-stable plan's counts words too) and nphases phases; the
 * lists start empty. */
pkv_status plan_reserve(pkv_context *ctx, pkv_plan *plan, int64_t ntasks, int64_t nrows, int64_t nmerges,
                        int64_t nphases, bool counts) {
    if (ntasks > INT32_MAX || nmerges > INT32_MAX)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "plan would have too many tasks (%lld)", (long long)ntasks);
    const size_t off_tasks = 0;
    size_t off_rows, off_merges;
    const size_t bytes = plan_blob_layout(ntasks, nrows, nmerges, counts, &off_rows, &off_merges, &plan->off_counts);
    /* the blob from the backend's memory where it gives some (a plan planned on it for the first time moves
     * there; not under the tuning's pageable_upload, the path of page-locked memory refused), else malloc's */
    const pkv_blob_ops *want = plan->blob_ops      ? plan->blob_ops
                               : plan->blob_refused ? NULL
                               : ctx && ctx->ops && !ctx->tuning.pageable_upload ? ctx->ops->blob
                                                                                 : NULL;
    if (bytes > plan->blob_cap || !plan->blob || want != plan->blob_ops) {
        size_t cap = plan->blob_cap ? plan->blob_cap : PKV_BLOB_MIN_BYTES;
        while (cap < bytes) cap *= 2;
        void *nb = want ? want->alloc(cap) : NULL;
        const pkv_blob_ops *nops = nb ? want : NULL;
        if (want && !nb) plan->blob_refused = true;
        if (!nb) nb = malloc(cap);
        if (!nb) return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of plan storage", cap);
        /* the old blob is one no pending upload reads (plan_blob_acquire) */
        if (plan->blob_ops) {
            plan->blob_ops->free(plan->blob);
            if (nops != plan->blob_ops) { /* the backend's memory ran out: malloc's blob from now on */
                for (int32_t k = 0; k < plan->num_spares; k++) plan->blob_ops->free(plan->blob_spare[k]);
                plan->num_spares = 0;
            }
        } else {
            free(plan->blob);
        }
        plan->blob = nb;
        plan->blob_cap = cap;
        plan->blob_ops = nops;
        plan->memo_valid = false;
    }
    if (nphases > plan->cap_phases) {
        int32_t cap = plan->cap_phases ? plan->cap_phases : PKV_PHASES_MIN;
        while (cap < nphases) cap *= 2;
        pkv_phase *np = (pkv_phase *)realloc(plan->phases, (size_t)cap * sizeof *np);
        if (!np) return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot allocate plan phases");
        plan->phases = np;
        plan->cap_phases = cap;
    }
    plan->blob_bytes = bytes;
    plan->off_tasks = off_tasks;
    plan->off_rows = off_rows;
    plan->off_merges = off_merges;
    plan->tasks = (pkv_task *)((char *)plan->blob + off_tasks);
    plan->rows = (pkv_row_sched *)((char *)plan->blob + off_rows);
    plan->merges = (pkv_merge *)((char *)plan->blob + off_merges);
    plan->num_tasks = plan->num_rows = plan->num_merges = plan->num_phases = 0;
    plan->max_merge_count = 0;
    return PKV_OK;
}

pkv_status plan_blob_acquire(pkv_context *ctx, pkv_plan *plan) {
    const pkv_blob_ops *bo = plan->blob_ops;
    if (!bo || !plan->blob) return PKV_OK;
    bool busy = false;
    pkv_status st = bo->busy(ctx, plan->blob, false, &busy);
    if (st != PKV_OK || !busy) return st;
    /* the last upload from this blob has not run yet: plan into the spare of the oldest upload when that has
     * run, else into a new spare while there are fewer than PKV_PLAN_SPARE_BLOBS, else into the oldest once its
     * upload has run */
    int32_t n = plan->num_spares;
    if (n > 0) {
        st = bo->busy(ctx, plan->blob_spare[0], false, &busy);
        if (st != PKV_OK) return st;
    }
    if ((n == 0 || busy) && n < PKV_PLAN_SPARE_BLOBS) {
        void *nb = bo->alloc(plan->blob_cap);
        if (nb) {
            plan->blob_spare[n] = plan->blob; /* the newest upload last */
            plan->blob_spare_cap[n] = plan->blob_cap;
            plan->num_spares = n + 1;
            plan->blob = nb;
            plan->memo_valid = false; /* the memo describes another blob's lists */
            return PKV_OK;
        }
        if (n == 0) return bo->busy(ctx, plan->blob, true, &busy); /* no other blob to be had: wait */
    }
    if (busy) {
        st = bo->busy(ctx, plan->blob_spare[0], true, &busy);
        if (st != PKV_OK) return st;
    }
    void *const oldest = plan->blob_spare[0];
    const size_t oldest_cap = plan->blob_spare_cap[0];
    for (int32_t k = 1; k < n; k++) {
        plan->blob_spare[k - 1] = plan->blob_spare[k];
        plan->blob_spare_cap[k - 1] = plan->blob_spare_cap[k];
    }
    plan->blob_spare[n - 1] = plan->blob;
    plan->blob_spare_cap[n - 1] = plan->blob_cap;
    plan->blob = oldest;
    plan->blob_cap = oldest_cap;
    plan->memo_valid = false;
    return PKV_OK;
}

/* Grows an int32 buffer of the plan to at least n entries (doubling; contents not kept).  A buffer never
 * allocated gets its first capacity even for n = 0, so the caller's pointers into it (order + B for an empty
 * batch) are never offsets from NULL. */
pkv_status plan_grow_i32(pkv_context *ctx, int32_t **buf, size_t *cap, size_t n, const char *what) {
    if (n <= *cap && *buf) return PKV_OK;
    size_t c = *cap ? *cap : PKV_SCRATCH_MIN;
    while (c < n) c *= 2;
    int32_t *nb = (int32_t *)malloc(c * sizeof *nb);
    if (!nb) return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot allocate %s", what);
    free(*buf);
    *buf = nb;
    *cap = c;
    return PKV_OK;
}

pkv_status plan_scratch_reserve(pkv_context *ctx, pkv_plan *plan, size_t n) {
    return plan_grow_i32(ctx, &plan->scratch, &plan->scratch_cap, n, "planner scratch");
}

/* Tasks of a graph-stable plan's grid: graph_tasks, else the most the planner's wave rules give a batch
 * of up to graph_max_batch rows (params.c: below PKV_RAGGED_MANY_PAIRS (row, KV head) pairs one wave of
 * the resident slots; from there, PKV_RAGGED_WAVES waves for ragged batches and up to
 * ceil(PKV_EVEN_MAX_SPLIT x pairs / slots) waves for even ones), so a graph-stable step is planned as a
 * plain one is and only the grid's surplus CTAs differ; at most max_splits tasks per pair (the wave of a
 * forced parallelism and ctas_per_unit could ask for far more than any step has) and PKV_GRAPH_MAX_TASKS;
 * at least a task per pair of the largest batch.  A grid past PKV_GRAPH_MAX_TASKS tasks (graph_tasks, or a
 * batch of more pairs) is refused (PKV_ERR_INVALID_ARGUMENT), for the plan and its workspace size alike. */
pkv_status plan_graph_capacity(pkv_context *ctx, const pkv_plan_options *opts, int64_t slots, const pkv_problem *p,
                               int64_t *cap_out) {
    const int64_t pairs = (int64_t)opts->graph_max_batch * p->num_kv_heads;
    int64_t cap = slots;
    if (opts->graph_tasks > 0) {
        cap = opts->graph_tasks;
    } else {
        if (pairs >= PKV_RAGGED_MANY_PAIRS && slots > 0) {
            const int64_t even = (PKV_EVEN_MAX_SPLIT * pairs + slots - 1) / slots * slots;
            cap = PKV_RAGGED_WAVES * slots > even ? PKV_RAGGED_WAVES * slots : even;
        }
        /* no step has more: the work queue leaves at most max_splits tasks per (row, KV head) */
        const int64_t most = pairs * (opts->max_splits > 0 ? opts->max_splits : PKV_DEFAULT_MAX_SPLITS);
        if (cap > most) cap = most;
        if (cap > PKV_GRAPH_MAX_TASKS) cap = PKV_GRAPH_MAX_TASKS; /* fewer, longer splits past the largest grid */
    }
    if (cap < pairs) cap = pairs;
    if (cap > PKV_GRAPH_MAX_TASKS)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "graph-stable plan of %lld tasks is too large", (long long)cap);
    *cap_out = cap;
    return PKV_OK;
}

int32_t pkv_graph_claim_multiplier(int32_t nsm) {
    if (nsm <= 1) return 0;
    int32_t b = (nsm + PKV_CLAIM_STRIDE_DIV - 1) / PKV_CLAIM_STRIDE_DIV;
    for (;; b++) { /* the first b coprime with nsm (nsm - 1 is, so the search ends by then) */
        int32_t x = b, y = nsm;
        while (y) {
            const int32_t t = x % y;
            x = y;
            y = t;
        }
        if (x == 1) break;
    }
    for (int32_t a = 1; a < nsm; a++)
        if ((int64_t)a * b % nsm == 1) return a;
    return 1;
}

/* FNV-1a over what a graph-stable plan's launches depend on (field by field: no struct padding). */
static uint64_t fnv_mix(uint64_t h, int64_t v) {
    for (int i = 0; i < 8; i++) h = (h ^ (uint64_t)((v >> (8 * i)) & 0xff)) * PKV_FNV_PRIME;
    return h;
}

static uint64_t graph_signature(const pkv_plan *plan, int32_t max_batch) {
    const pkv_problem *p = &plan->problem;
    float f[2] = {p->sm_scale, p->logits_soft_cap};
    uint32_t fb[2];
    memcpy(fb, f, sizeof fb);
    const int64_t v[] = {p->num_qo_heads, p->num_kv_heads, p->head_dim, p->page_size, p->num_pages, (int64_t)p->layout,
                         (int64_t)p->dtype, (int64_t)pkv_kv_dtype(p), fb[0], fb[1], p->window, max_batch, plan->graph_tasks, plan->graph_merges,
                         (int64_t)plan->route, (int64_t)plan->off_tasks, (int64_t)plan->off_merges,
                         (int64_t)plan->off_counts, (int64_t)plan->off_state_o, (int64_t)plan->off_state_ml,
                         (int64_t)plan->workspace_bytes, (int64_t)plan->blob_bytes};
    uint64_t h = PKV_FNV_OFFSET;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = fnv_mix(h, v[i]);
    return h ? h : 1;
}

void plan_finish_layout(pkv_plan *plan, int32_t graph_cap, int32_t graph_max_batch, bool rewrite) {
    /* fused: one arrival counter per merge right after the merges; zeros travel with the plan upload and
     * the last task of each merge resets its counter, so every run starts from zero */
    plan->off_counters = plan->off_merges + (size_t)plan->num_merges * sizeof(pkv_merge);
    if (rewrite) memset((char *)plan->blob + plan->off_counters, 0, (size_t)plan->num_merges * sizeof(int32_t));
    /* workspace layout: [plan blob | partial states]; graph-stable: room for a slot per task of the grid */
    plan->workspace_bytes = plan_states_layout(plan->blob_bytes, graph_cap > 0 ? graph_cap : plan->num_state_slots,
                                               plan->group, plan->problem.head_dim, &plan->off_state_o,
                                               &plan->off_state_ml);
    if (graph_cap > 0) {
        if (rewrite) {
            int32_t *counts = (int32_t *)(void *)((char *)plan->blob + plan->off_counts);
            memset(counts, 0, PKV_COUNTS_WORDS * sizeof(int32_t)); /* the work claim starts from zeros */
            counts[PKV_COUNTS_TASKS] = plan->num_tasks;
            counts[PKV_COUNTS_MERGES] = plan->num_merges;
            counts[PKV_COUNTS_WIDEST] = plan->max_merge_count;
        }
        plan->graph_tasks = graph_cap;
        plan->graph_merges = graph_max_batch * plan->problem.num_kv_heads;
        plan->graph_signature = graph_signature(plan, graph_max_batch);
    }
}

/* The bound for plans that are not graph-stable.  Every rule keeps split slots <= P + B x Hkv (a wave
 * plus one rounding per row), P at most PKV_RAGGED_WAVES waves of the resident tasks or, for an even
 * batch over one wave, its pairs split up to PKV_EVEN_MAX_SPLIT ways plus a wave; a forced S gives up to
 * B x Hkv x S, a forced workqueue chunk up to B x Hkv x max_splits.  Tasks: every phase holds at most
 * P + its rows x Hkv, and bucketed has up to PKV_LENGTH_BUCKETS phases. */
static size_t plain_workspace_bound(const pkv_problem *problem, int64_t max_batch, const pkv_plan_options *opts,
                                    int64_t par, int64_t per, int64_t res) {
    const bool forced_wave = opts->ctas_per_unit > 0;
    const int64_t hkv = problem->num_kv_heads, G = problem->num_qo_heads / hkv;
    int64_t P = par * res * (forced_wave ? 1 : PKV_RAGGED_WAVES);
    const int64_t even = PKV_EVEN_MAX_SPLIT * max_batch * hkv + par * res;
    if (!forced_wave && even > P) P = even;
    const int64_t max_splits = opts->max_splits > 0 ? opts->max_splits : PKV_DEFAULT_MAX_SPLITS;
    int64_t slots = P + max_batch * hkv;
    if (opts->num_splits > 0) {
        const int64_t s = max_batch * hkv * (opts->num_splits < max_splits ? opts->num_splits : max_splits);
        if (s > slots) slots = s;
    }
    if (opts->chunk_pages > 0 && max_batch * hkv * max_splits > slots) slots = max_batch * hkv * max_splits;
    const int64_t tasks =
        slots + (max_batch < PKV_LENGTH_BUCKETS ? max_batch : PKV_LENGTH_BUCKETS) * P + max_batch * hkv;
    size_t o_rows, o_merges, o_counts, o_state, o_ml;
    const size_t blob = plan_blob_layout(tasks, max_batch, max_batch * hkv, false, &o_rows, &o_merges, &o_counts);
    /* one alignment unit of slack on top of the layout */
    return plan_states_layout(blob, slots, G, problem->head_dim, &o_state, &o_ml) + PKV_WS_ALIGN;
}

pkv_status plan_workspace_bound(pkv_context *ctx, const pkv_backend_caps *caps, const pkv_problem *problem,
                                int32_t max_batch, const pkv_plan_options *opts, int64_t par, size_t *bytes) {
    const plan_caps pc = plan_caps_for(caps, problem);
    const int64_t per = opts->ctas_per_unit > 0 ? opts->ctas_per_unit : pc.per_unit;
    int64_t res = pc.resident;
    const int64_t res_x = pc.resident_x;
    if (opts->graph_max_batch > 0) {
        /* graph-stable: the plans' own fixed layout (plan_reserve + the states), whatever the step */
        if (max_batch > opts->graph_max_batch)
            return pkv_fail(ctx, PKV_ERR_BATCH_SIZE, "max_batch %d above graph_max_batch %d", max_batch,
                            opts->graph_max_batch);
        int64_t cap = 0;
        const pkv_status st = plan_graph_capacity(ctx, opts, plan_resident_slots(par, per, res, res_x), problem, &cap);
        if (st != PKV_OK) return st;
        const int64_t gm = opts->graph_max_batch;
        size_t o_rows, o_merges, o_counts, o_state, o_ml;
        const size_t blob = plan_blob_layout(cap, gm, gm * problem->num_kv_heads, true, &o_rows, &o_merges, &o_counts);
        *bytes = plan_states_layout(blob, cap, problem->num_qo_heads / problem->num_kv_heads, problem->head_dim,
                                    &o_state, &o_ml);
        return PKV_OK;
    }
    if (res_x > res) res = res_x; /* bounds the one-wave P too */
    if (res < per || opts->ctas_per_unit > 0) res = per;
    *bytes = plain_workspace_bound(problem, max_batch, opts, par, per, res);
    return PKV_OK;
}
