/* planner.c - turns one decode step (per-row lengths) into a plan: tasks over non-empty
 * (row, KV head, split) token ranges, merges for rows split in more than one part, launch phases
 * and counters.  Pure C, host only, O(B + tasks), allocates only to grow the plan's storage.
 *
 * Split rules (P = parallelism x ctas_per_unit, the number of tasks the device runs in one wave;
 * chunks are whole pages, at least min_chunk_tokens long, at most max_splits per (row, KV head)):
 *   single     S = 1 for every row.
 *   split      S = ceil(P / (nonempty_rows x Hkv)) (floor when every non-empty row has the same page
 *              count: one wave), capped so the longest row's chunks stay at least
 *              min_chunk_tokens long; row i uses chunk_i = max(ceil(pages_i / S), min_chunk) pages
 *              and ceil(pages_i / chunk_i) <= S splits (the rest of its grid column exits early).
 *   bucketed   rows grouped by floor(log2(N)); each bucket is planned as `split` on its own and
 *              launched separately (split + merge per bucket).  Partial-state slots are reused by
 *              the next bucket, since buckets run one after the other.
 *   workqueue  one chunk size c for the whole step: the smallest c >= min_chunk such that
 *              sum_i ceil(pages_i / c) x Hkv <= P (one wave); if even c = max pages does not fit,
 *              no row is split.  Full chunks come first in the task list, then the row tails,
 *              longest first.
 *   fused      the workqueue's plan, executed in one launch: the last task of a split (row, KV head)
 *              to finish merges its states (a counter per merge in the workspace).
 *   auto       with a cost model on the context, the candidate of lowest predicted time; else the
 *              rule of auto_rule (single for even batches that fill a wave, the work queue for
 *              ragged ones that do and for one long row, fused otherwise).
 *   P grows to 4 waves of resident tasks for ragged batches of >= 128 (row, KV head) pairs, and
 *   for even batches of more (row, KV head) pairs than one wave, to the waves that fill best when each pair is split 1..4 ways,
 *   and to one wave of every resident CTA where the backend gathers the pages row by row under a kernel of 4 resident
 *   CTAs per unit (CUDA: d = 64 at pages of 1-4 tokens) (resolve_params).
 */
#include "internal.h"

#include <limits.h>
#include <math.h>
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

pkv_status pkv_plan_create(pkv_plan **plan) {
    if (!plan) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "plan output pointer is NULL");
    *plan = (pkv_plan *)calloc(1, sizeof **plan);
    if (!*plan) return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot allocate a plan");
    return PKV_OK;
}

void pkv_plan_free(pkv_plan *plan) {
    if (!plan) return;
    free(plan->blob);
    free(plan->phases);
    free(plan->scratch);
    free(plan->win);
    free(plan);
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- per-step scratch: the resolved options and per-row quantities ---------------------------- */
/* The per-row passes of the policy and the work queue's chunk search vectorise (PKV_VECTOR_CLONES:
 * auto's decision at B = 128 went from ~0.9 to ~0.4 us on the CI machine with the AVX2 clone). */

typedef struct plan_params {
    int64_t P;             /* tasks in one wave */
    int32_t min_chunk_pages;
    int32_t max_splits;
    int32_t forced_splits; /* > 0: S given */
    int32_t forced_chunk;  /* > 0: workqueue chunk given (pages) */
    int64_t nonempty, total, max_len; /* the step's rows: non-empty ones, tokens, longest */
    int64_t min_len;       /* the shortest non-empty row */
    bool ragged;           /* longest row > 1.25 x the mean of the non-empty ones */
    int64_t slots;         /* resident task slots: parallelism x resident CTAs per unit */
    int64_t P_bucketed;    /* > 0: the wave of the bucketed route where it differs from P */
} plan_params;

/* 32-bit division: n >= 0 and n + page_size < 2^32 (validated), and this runs per row */
static int32_t row_pages(const pkv_problem *p, int32_t n) {
    return (int32_t)(((uint32_t)n + (uint32_t)p->page_size - 1u) / (uint32_t)p->page_size);
}

/* S for a set of rows under the `split` rule. */
static int32_t choose_splits(const plan_params *pp, const pkv_problem *p, const int32_t *lens,
                             const int32_t *rows, int32_t nrows) {
    if (pp->forced_splits > 0) return pp->forced_splits < pp->max_splits ? pp->forced_splits : pp->max_splits;
    int64_t nonempty = 0;
    int32_t max_pages = 0, min_pages = INT32_MAX;
    if (!rows) { /* all rows of the step: their tallies are in pp */
        nonempty = pp->nonempty;
        max_pages = row_pages(p, (int32_t)pp->max_len);
        min_pages = row_pages(p, (int32_t)pp->min_len);
    } else {
        for (int32_t k = 0; k < nrows; k++) {
            int32_t n = lens[rows[k]];
            if (n > 0) nonempty++;
            int32_t pg = row_pages(p, n);
            if (pg > max_pages) max_pages = pg;
            if (n > 0 && pg < min_pages) min_pages = pg;
        }
    }
    if (nonempty == 0) return 1;
    /* Rows of one page count split into at most one wave (floor): ceil put up to pairs - 1 tasks
     * past it, e.g. rows of 32K + 1 tokens got 17 chunks where 16 fill the wave (H200, kernel v8:
     * 4.4% slower on single rows whose pairs do not divide the wave, where the work queue's
     * one-wave plan - the same chunks - ran at the split route's speed on the rest).  Ragged rows
     * keep ceil: one more split shortens the longest row's chunks. */
    const int64_t pairs = nonempty * p->num_kv_heads;
    int64_t s = min_pages == max_pages ? pp->P / pairs : ceil_div(pp->P, pairs);
    int64_t by_len = ceil_div(max_pages, pp->min_chunk_pages);
    if (s > by_len) s = by_len;
    if (s > pp->max_splits) s = pp->max_splits;
    return s < 1 ? 1 : (int32_t)s;
}

/* Chunk (pages) of one row under S splits. */
static int32_t row_chunk_pages(const plan_params *pp, int32_t pages, int32_t S) {
    if (pages <= 0) return 1; /* an empty row: no split (a large min_chunk_tokens x page_size would overflow) */
    int64_t c = ceil_div(pages, S);
    if (S > 1 && c < pp->min_chunk_pages) c = pp->min_chunk_pages;
    if (pages > 0 && c > pages) c = pages;
    if (c < 1) c = 1;
    return (int32_t)c;
}

/* Workqueue chunk: smallest c with sum ceil(pages_i / c) x Hkv <= P. */
PKV_VECTOR_CLONES
static int32_t choose_workqueue_chunk(const plan_params *pp, const pkv_problem *p, const int32_t *lens, int32_t B) {
    const int32_t max_pages = row_pages(p, (int32_t)pp->max_len);
    if (max_pages == 0) return 1;
    int32_t lo_cap = (int32_t)ceil_div(max_pages, pp->max_splits); /* respect max_splits */
    if (pp->forced_chunk > 0) {
        int32_t c = pp->forced_chunk > lo_cap ? pp->forced_chunk : lo_cap;
        return c < max_pages ? c : max_pages;
    }
    int32_t lo = pp->min_chunk_pages > lo_cap ? pp->min_chunk_pages : lo_cap;
    if (lo >= max_pages) return max_pages;
    int32_t hi = max_pages;
    /* cost(hi) = the non-empty rows may exceed P (many rows): then no split at all. */
    if (pp->nonempty * p->num_kv_heads > pp->P) return max_pages;
    /* divisions by reciprocal (exact, see candidate_terms) */
    const int64_t budget = pp->P / p->num_kv_heads;
    const double inv_ps = 1.0 / p->page_size, ps_up = p->page_size - 0.5;
    /* bounds from sum(pages) / c <= cost(c) <= sum(pages) / c + rows (one O(B) pass for the pages
     * total, then fewer passes of the search): cost(c) <= budget needs c >= sum / budget and holds
     * once c >= sum / (budget - rows) */
    int64_t sum_pages = 0;
    for (int32_t i = 0; i < B; i++) sum_pages += (int64_t)((lens[i] + ps_up) * inv_ps);
    const int64_t lo_sum = ceil_div(sum_pages, budget > 0 ? budget : 1);
    if (lo_sum > lo) lo = lo_sum < hi ? (int32_t)lo_sum : hi;
    if (budget > pp->nonempty) {
        const int64_t hi_sum = ceil_div(sum_pages, budget - pp->nonempty);
        if (hi_sum < hi && hi_sum >= lo) hi = (int32_t)hi_sum;
    }
    /* each count is a branch-free int32 pass the compiler vectorises: mid >= sum / budget, so the
     * count stays below budget + B, and a row's pages fit in int32 (the indptr does) */
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        const double inv_mid = 1.0 / mid, mid_up = mid - 0.5;
        int32_t cost = 0;
        for (int32_t i = 0; i < B; i++) {
            const double pages = (double)(int32_t)((lens[i] + ps_up) * inv_ps);
            cost += (int32_t)((pages + mid_up) * inv_mid);
        }
        if (cost <= budget)
            hi = (int32_t)mid;
        else
            lo = (int32_t)mid + 1;
    }
    return lo;
}

/* ---- storage ---------------------------------------------------------------------------------- */
/* The plan blob's layout: [tasks | rows | merges and their arrival counters | counts], each part
 * PKV_WS_ALIGN aligned; counts (graph-stable plans only, else *off_counts = 0): PKV_COUNTS_WORDS int32
 * (the task and merge counts, then the CUDA work claim's words).  Returns the blob's bytes. */
static size_t blob_layout(int64_t ntasks, int64_t nrows, int64_t nmerges, bool counts, size_t *off_rows,
                          size_t *off_merges, size_t *off_counts) {
    *off_rows = align_up((size_t)ntasks * sizeof(pkv_task), PKV_WS_ALIGN);
    *off_merges = align_up(*off_rows + (size_t)nrows * sizeof(pkv_row_sched), PKV_WS_ALIGN);
    const size_t bytes = align_up(*off_merges + (size_t)nmerges * (sizeof(pkv_merge) + sizeof(int32_t)), PKV_WS_ALIGN);
    *off_counts = counts ? bytes : 0;
    return counts ? bytes + align_up(PKV_COUNTS_WORDS * sizeof(int32_t), PKV_WS_ALIGN) : bytes;
}

/* The workspace after a blob of blob_bytes: partial o (slots x G x d fp32), then partial lse (slots x G
 * fp32), each aligned (offsets in *off_o, *off_lse).  Returns the workspace's bytes. */
static size_t states_layout(size_t blob_bytes, int64_t slots, int64_t group, int64_t head_dim, size_t *off_o,
                            size_t *off_lse) {
    *off_o = align_up(blob_bytes, PKV_WS_ALIGN);
    *off_lse = align_up(*off_o + (size_t)slots * (size_t)group * (size_t)head_dim * sizeof(float), PKV_WS_ALIGN);
    return align_up(*off_lse + (size_t)slots * (size_t)group * sizeof(float), PKV_WS_ALIGN);
}

static pkv_status plan_reserve(pkv_context *ctx, pkv_plan *plan, int64_t ntasks, int64_t nrows, int64_t nmerges,
                               int64_t nphases, bool counts) {
    if (ntasks > INT32_MAX || nmerges > INT32_MAX)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "plan would have too many tasks (%lld)", (long long)ntasks);
    const size_t off_tasks = 0;
    size_t off_rows, off_merges;
    const size_t bytes = blob_layout(ntasks, nrows, nmerges, counts, &off_rows, &off_merges, &plan->off_counts);
    if (bytes > plan->blob_cap || !plan->blob) {
        size_t cap = plan->blob_cap ? plan->blob_cap : 4096;
        while (cap < bytes) cap *= 2;
        void *nb = malloc(cap);
        if (!nb) return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes of plan storage", cap);
        free(plan->blob);
        plan->blob = nb;
        plan->blob_cap = cap;
    }
    if (nphases > plan->cap_phases) {
        int32_t cap = plan->cap_phases ? plan->cap_phases : 4;
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

/* Grows an int32 buffer of the plan to at least n entries (doubling; contents not kept). */
static pkv_status grow_i32(pkv_context *ctx, int32_t **buf, size_t *cap, size_t n, const char *what) {
    if (n <= *cap) return PKV_OK;
    size_t c = *cap ? *cap : 256;
    while (c < n) c *= 2;
    int32_t *nb = (int32_t *)malloc(c * sizeof *nb);
    if (!nb) return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot allocate %s", what);
    free(*buf);
    *buf = nb;
    *cap = c;
    return PKV_OK;
}
static pkv_status scratch_reserve(pkv_context *ctx, pkv_plan *plan, size_t n) {
    return grow_i32(ctx, &plan->scratch, &plan->scratch_cap, n, "planner scratch");
}

/* Under a sliding window a row is planned from the start of the page that holds its first attended
 * token (its splits then start on page boundaries, so the tensor-copy kernel's 16-token tiles of every
 * split but the first are whole; the first task starts at the window, emit_row): each row's length
 * from there (lens) and, when starts is given, that page-aligned start. */
static int32_t page_floor(const pkv_problem *p, int32_t tok) { return tok - tok % p->page_size; }
static int32_t aligned_start(const pkv_problem *p, int32_t n) { return page_floor(p, pkv_row_start(p, n)); }
static void window_lengths(const pkv_problem *p, const pkv_page_table *t, int32_t *lens, int32_t *starts) {
    for (int32_t i = 0; i < t->batch_size; i++) {
        const int32_t s = aligned_start(p, t->seq_lens[i]);
        lens[i] = t->seq_lens[i] - s;
        if (starts) starts[i] = s;
    }
}

/* ---- emitting --------------------------------------------------------------------------------- */
/* Emits the schedule of one row split in chunks of chunk_tokens: its row record, its tasks (split
 * outer, KV head inner), and merges for split or empty rows.  The row's n tokens are planned from token
 * `start` (under a sliding window the start of the page that holds the window's first token, else 0);
 * its first task starts at the window (row record: tok_begin; the CUDA rect kernels cut the same
 * splits from it, load_task).  Returns the slots it used. */
static int32_t emit_row(pkv_plan *plan, int32_t row, int32_t n, int32_t start, int32_t page_base, int32_t chunk_tokens,
                        int32_t slot_base, bool emit_tasks) {
    const int32_t hkv = plan->problem.num_kv_heads;
    int32_t nsplit = n > 0 ? (int32_t)ceil_div(n, chunk_tokens) : 0;
    const int32_t first = pkv_row_start(&plan->problem, start + n); /* start <= first < start + page_size */
    pkv_row_sched *rs = &plan->rows[plan->num_rows++];
    rs->row = row;
    rs->seq_len = start + n;
    rs->tok_begin = first;
    rs->page_base = page_base;
    rs->chunk_tokens = chunk_tokens;
    rs->num_splits = nsplit;
    rs->slot_base = nsplit > 1 ? slot_base : -1;
    const int32_t merge_base = plan->num_merges;
    if (emit_tasks)
        for (int32_t s = 0; s < nsplit; s++)
            for (int32_t h = 0; h < hkv; h++) {
                pkv_task *t = &plan->tasks[plan->num_tasks++];
                t->row = row;
                t->kv_head = h;
                const int64_t end = (int64_t)(s + 1) * chunk_tokens; /* s * chunk_tokens < n */
                t->tok_begin = s > 0 ? start + s * chunk_tokens : first;
                t->tok_end = start + (int32_t)(end < n ? end : n);
                t->page_base = page_base;
                t->state_slot = nsplit > 1 ? slot_base + h * nsplit + s : -1;
                t->merge = nsplit > 1 ? merge_base + h : -1;
            }
    if (nsplit > 1)
        for (int32_t h = 0; h < hkv; h++) {
            pkv_merge *m = &plan->merges[plan->num_merges++];
            m->row = row;
            m->kv_head = h;
            m->first_slot = slot_base + h * nsplit;
            m->count = nsplit;
        }
    if (nsplit > plan->max_merge_count && nsplit > 1) plan->max_merge_count = nsplit;
    return nsplit > 1 ? nsplit * hkv : 0;
}

/* Merges of the empty rows among rows[0..nrows) (o = 0, lse = -inf), after the split merges. */
static void emit_empty_merges(pkv_plan *plan, const int32_t *lens, const int32_t *rows, int32_t nrows) {
    for (int32_t k = 0; k < nrows; k++) {
        int32_t i = rows ? rows[k] : k;
        if (lens[i] != 0) continue;
        for (int32_t h = 0; h < plan->problem.num_kv_heads; h++) {
            pkv_merge *m = &plan->merges[plan->num_merges++];
            m->row = i;
            m->kv_head = h;
            m->first_slot = 0;
            m->count = 0;
        }
    }
}

static void begin_phase(pkv_plan *plan, int32_t S) {
    pkv_phase *ph = &plan->phases[plan->num_phases++];
    ph->task_begin = ph->task_end = plan->num_tasks;
    ph->merge_begin = ph->merge_end = plan->num_merges;
    ph->row_begin = ph->row_end = plan->num_rows;
    ph->grid_splits = S;
}

static void end_phase(pkv_plan *plan) {
    pkv_phase *ph = &plan->phases[plan->num_phases - 1];
    ph->task_end = plan->num_tasks;
    ph->merge_end = plan->num_merges;
    ph->row_end = plan->num_rows;
}

/* One rectangular phase (single / split / a bucket) over the given rows. */
static int32_t emit_rect_phase(pkv_plan *plan, const plan_params *pp, const pkv_page_table *t, const int32_t *starts,
                               const int32_t *rows, int32_t nrows, int32_t S) {
    const pkv_problem *p = &plan->problem;
    begin_phase(plan, S);
    int32_t slots = 0;
    for (int32_t k = 0; k < nrows; k++) {
        int32_t i = rows[k], n = t->seq_lens[i];
        int32_t pages = row_pages(p, n);
        int32_t chunk = row_chunk_pages(pp, pages, S) * p->page_size;
        slots += emit_row(plan, i, n, starts ? starts[i] : 0, t->kv_indptr[i], chunk, slots, true);
    }
    emit_empty_merges(plan, t->seq_lens, rows, nrows);
    end_phase(plan);
    return slots;
}

/* Sort keys of the tail groups: (INT32_MAX - length) << 32 | group ordinal, so ascending keys are
 * longest first, then row order. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : (x > y);
}

static void sort_u64(uint64_t *v, int32_t n) {
    if (n > 64) {
        qsort(v, (size_t)n, sizeof *v, cmp_u64);
        return;
    }
    for (int32_t i = 1; i < n; i++) { /* insertion sort: B is small */
        uint64_t x = v[i];
        int32_t j = i - 1;
        while (j >= 0 && v[j] > x) {
            v[j + 1] = v[j];
            j--;
        }
        v[j + 1] = x;
    }
}

static void compute_counters(pkv_plan *plan) {
    const pkv_problem *p = &plan->problem;
    pkv_counters *c = &plan->counters;
    memset(c, 0, sizeof *c);
    const int64_t es = (int64_t)pkv_dtype_size(p->dtype), d = p->head_dim, hkv = p->num_kv_heads;
    int64_t split_tasks = 0;
    for (int32_t k = 0; k < plan->num_tasks; k++) {
        const pkv_task *t = &plan->tasks[k];
        c->kv_bytes += (int64_t)(t->tok_end - t->tok_begin) * d * es * 2;
        if (t->state_slot >= 0) split_tasks++;
    }
    for (int32_t k = 0; k < plan->num_rows; k++) c->total_tokens += plan->rows[k].seq_len - plan->rows[k].tok_begin;
    c->tasks = plan->num_tasks;
    c->merges = plan->num_merges;
    c->qo_bytes = (int64_t)plan->batch_size * p->num_qo_heads * (d * es * 2 + 4);
    c->merge_state_bytes = 2 * split_tasks * plan->group * (d + 1) * 4;
    /* a phase launches its task kernel when it has tasks and its merge kernel when it has merges */
    for (int32_t k = 0; k < plan->num_phases; k++) {
        const pkv_phase *ph = &plan->phases[k];
        if (plan->route == PKV_ROUTE_FUSED) { /* tasks and merges in one launch */
            int32_t empties = 0;
            for (int32_t m = ph->merge_begin; m < ph->merge_end; m++) empties += plan->merges[m].count == 0;
            c->grid_ctas += (ph->task_end - ph->task_begin) + empties;
            c->launches += (ph->task_end > ph->task_begin || empties > 0) ? 1 : 0;
            continue;
        }
        if (ph->task_end > ph->task_begin) {
            c->launches++;
            c->grid_ctas += plan->route == PKV_ROUTE_WORKQUEUE
                                ? (int64_t)(ph->task_end - ph->task_begin)
                                : (int64_t)(ph->row_end - ph->row_begin) * hkv * ph->grid_splits;
        }
        if (ph->merge_end > ph->merge_begin) c->launches++;
    }
    if (plan->graph_tasks > 0) { /* graph-stable: both kernels on their fixed grids, whatever the step */
        c->launches = 2;
        c->grid_ctas = plan->graph_tasks;
    }
}

/* The planner's parameters for a step: P (tasks per wave; ragged batches - rows longer than 1.25 x
 * the mean - of >= 128 (row, KV head) pairs get 4 waves of resident tasks, so that more, smaller
 * tasks let the hardware scheduler even out the load; even batches keep one wave unless they
 * overflow it, as measured on the H200, docs/kernel-notes.md), chunk bounds and forced values. */
/* Tasks per parallel unit: the wave the planner fills (the backend's default) and the tasks the
 * device holds resident (CUDA: CTAs per SM of the kernel that runs this problem, taken at d = 128
 * for d <= 128; the lighter heads-in-N kernel for G <= 8 holds 3 where the other holds 2). */
static int32_t default_ctas(const pkv_context *ctx) { return ctx ? ctx->ctas_per_unit : 2; }
static int32_t resident_ctas(const pkv_context *ctx, const pkv_problem *p) {
    if (!ctx) return 2;
    if (!p) return ctx->ctas_per_unit; /* plan_impl reports the NULL problem */
    const int32_t light = ctx->resident[1][0]; /* d = 128, G <= 8 */
    if (light > 0 && p->num_qo_heads <= 8 * p->num_kv_heads && p->head_dim <= 128) return light;
    return ctx->ctas_per_unit;
}
/* The exact residency of the kernel that runs the problem at its head dim (CUDA: the occupancy
 * API; the d = 64 kernels hold 4), else resident_ctas. */
static int32_t resident_exact(const pkv_context *ctx, const pkv_problem *p) {
    if (!p) return resident_ctas(ctx, p);
    const int di = p->head_dim == 64 ? 0 : p->head_dim == 128 ? 1 : p->head_dim == 256 ? 2 : -1;
    if (ctx && di >= 0 && ctx->resident[di][p->num_qo_heads > 8 * p->num_kv_heads] > 0)
        return ctx->resident[di][p->num_qo_heads > 8 * p->num_kv_heads];
    return resident_ctas(ctx, p);
}

/* Resident task slots the planner's waves count: parallelism x the larger of the CTAs per unit (at least
 * per_unit) and the kernel's exact residency. */
static int64_t resident_slots(int64_t parallelism, int64_t per_unit, int64_t resident, int64_t resident_x) {
    const int64_t r = resident > per_unit ? resident : per_unit;
    return parallelism * (resident_x > r ? resident_x : r);
}

static void resolve_params(const pkv_plan_options *opts, int32_t parallelism, int32_t default_per_unit,
                           int32_t resident, int32_t resident_x, bool row_gathered, const pkv_problem *problem,
                           const pkv_page_table *table, plan_params *pp) {
    int32_t per_unit = opts->ctas_per_unit > 0 ? opts->ctas_per_unit : default_per_unit;
    if (resident < per_unit) resident = per_unit;
    pp->P = (int64_t)parallelism * per_unit;
    pp->P_bucketed = 0;
    pp->slots = resident_slots(parallelism, per_unit, resident, resident_x);
    int32_t min_tokens = opts->min_chunk_tokens > 0 ? opts->min_chunk_tokens : 128;
    pp->min_chunk_pages = (int32_t)ceil_div(min_tokens, problem->page_size);
    pp->max_splits = opts->max_splits > 0 ? opts->max_splits : 256;
    pp->forced_splits = opts->num_splits;
    pp->forced_chunk = opts->chunk_pages;
    int64_t nonempty = 0, total = 0, max_len = 0, min_len = INT64_MAX;
    for (int32_t i = 0; i < table->batch_size; i++) {
        int32_t n = table->seq_lens[i];
        nonempty += n > 0;
        total += n;
        if (n > max_len) max_len = n;
        if (n > 0 && n < min_len) min_len = n;
    }
    pp->nonempty = nonempty;
    pp->total = total;
    pp->max_len = max_len;
    pp->min_len = nonempty ? min_len : 0;
    pp->ragged = nonempty > 0 && 4 * max_len * nonempty > 5 * total;
    const int64_t units = nonempty * problem->num_kv_heads;
    if (opts->ctas_per_unit <= 0 && pp->ragged) {
        /* ragged with at least 128 pairs: 4 waves of the resident tasks, so the block scheduler
         * can balance (fewer pairs: one wave; measured on the H200, B8 ragged steps lose 10-15%
         * with 2 waves) */
        if (units >= 128)
            pp->P = (int64_t)parallelism * resident * 4;
        else if (units >= 32 && resident_x >= 4)
            /* a kernel with small tiles (d = 64: 4 resident CTAs per SM) needs them all in flight:
             * one wave of the resident tasks (H200: d64 B16 ragged 14-17% faster; the d = 128
             * kernels gained 0-3% on B8 and lost 1-3% on B4, so they keep 2 per SM).  Not for the
             * bucketed baseline, whose phases each fill the wave. */
            pp->P_bucketed = pp->P, pp->P = (int64_t)parallelism * resident_x;
    } else if (opts->ctas_per_unit <= 0 && units > pp->P) {
        /* An even batch with more (row, KV head) pairs than one wave: unsplit, the last wave of
         * resident tasks R may run nearly empty (512 pairs on 396 resident CTAs: 1.3 waves in the
         * time of 2).  Split each pair S = 1..4 ways and keep the S whose last wave is fullest
         * (a larger S only when more than 5% fuller); P becomes those waves of R. */
        const int64_t R = (int64_t)parallelism * resident;
        int64_t best_waves = ceil_div(units, R), best_num = units, best_den = best_waves * R;
        for (int64_t S = 2; S <= 4; S++) {
            const int64_t w = ceil_div(units * S, R);
            if (units * S * best_den > best_num * w * R + best_num * w * R / 20) {
                best_waves = w;
                best_num = units * S;
                best_den = w * R;
            }
        }
        if (best_num != units) pp->P = best_waves * R;
    }
    if (opts->ctas_per_unit <= 0 && row_gathered && resident_x >= 4 && !(pp->ragged && units >= 128) &&
        pp->P < (int64_t)parallelism * resident_x)
        /* pages gathered row by row (the backend's row_gather_below: on sm_90, cp.async rows of 128 bytes at
         * d = 64) by a kernel of small tiles (4 resident CTAs per SM): the wave counts every resident CTA, for
         * the memory requests in flight.  H200, d = 64: single requests 6-17% faster at pages 1, 2 and 4 (B1_N131072
         * 74.5 against 89.6 us at page 1), even batches within 1%; no gain at page 16 (whole-page tensor copies)
         * nor for d = 128 at 3 per SM (dev/probe_ctas_d64.sh, dev/probe_ctas_pages.sh; docs/kernel-notes.md v18).
         * Ragged batches of >= 128 pairs keep their 4 waves (forcing one wave of 4 lost 5-15% on B32/B64). */
        pp->P = (int64_t)parallelism * resident_x;
}

/* The cost-model terms of the candidate routes for this step without building their plans: the
 * same rules as plan_impl, one O(B) pass for all four (the work queue's chunk searched once, or
 * given).  Divisions by a per-step constant go through a double reciprocal: floor((n + 0.5) / c)
 * is exact for n, c < 2^31, since n / c's fractional part is a multiple of 1 / c > the rounding
 * error.  tests/test_plan checks the terms against pkv_cost_terms of the built plans. */
enum { TC_SINGLE, TC_SPLIT, TC_WORKQUEUE, TC_FUSED, TC_COUNT };
#define PKV_MAX_WAVE_CANDIDATES 2 /* the planner's wave and one wave of the resident slots */
static const pkv_route term_routes[TC_COUNT] = {PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};

PKV_VECTOR_CLONES
static void candidate_terms(const plan_params *pp, const pkv_problem *p, const int32_t *lens, int32_t B,
                            int32_t wq_chunk_pages, double t[TC_COUNT][PKV_COST_TERMS]) {
    const int64_t hkv = p->num_kv_heads, G = p->num_qo_heads / hkv, d = p->head_dim;
    const int64_t es = (int64_t)pkv_dtype_size(p->dtype);
    const int32_t S = choose_splits(pp, p, lens, NULL, B);
    const int32_t wq_pages = wq_chunk_pages > 0 ? wq_chunk_pages : choose_workqueue_chunk(pp, p, lens, B);
    const double inv_ps = 1.0 / p->page_size, inv_S = 1.0 / S, inv_wq = 1.0 / ((double)wq_pages * p->page_size);
    const int64_t wq_tokens = (int64_t)wq_pages * p->page_size, min_chunk = pp->min_chunk_pages;
    const int64_t tokens = pp->total, empty = B - pp->nonempty, nonempty = pp->nonempty;
    int64_t tasks[2] = {0, 0}, split_tasks[2] = {0, 0}, max_count[2] = {0, 0}, longest[2] = {0, 0}; /* split, wq */
    /* Branch-free int32 passes the compiler vectorises (a row's splits are at most max_splits, so
     * the sums stay below 2^31).  The work queue: chunks per row; its longest task and largest
     * merge follow from the longest row. */
    {
        const double wq_up = (double)wq_tokens - 0.5;
        int32_t wt = 0, wst = 0;
        for (int32_t i = 0; i < B; i++) {
            const int32_t ns = (int32_t)(((double)lens[i] + wq_up) * inv_wq); /* 0 for an empty row */
            wt += ns;
            wst += ns > 1 ? ns : 0;
        }
        tasks[1] = wt, split_tasks[1] = wst;
        const int64_t ns_max = ceil_div(pp->max_len, wq_tokens);
        max_count[1] = ns_max > 1 ? ns_max : 0;
        longest[1] = wq_tokens < pp->max_len ? wq_tokens : pp->max_len;
    }
    if (S == 1) { /* the split route is the single route */
        tasks[0] = nonempty, longest[0] = pp->max_len;
    } else { /* chunk = max(ceil(pages / S), min_chunk) pages, at most the row (at least 1) */
        const double ps_up = p->page_size - 0.5, S_up = S - 0.5;
        const int32_t mc = (int32_t)min_chunk, ps = p->page_size;
        int32_t st = 0, sst = 0, cmax = 0, lmax = 0;
        for (int32_t i = 0; i < B; i++) {
            const int32_t n = lens[i];
            const int32_t pages = (int32_t)(((double)n + ps_up) * inv_ps);
            int32_t cp = (int32_t)(((double)pages + S_up) * inv_S);
            cp = cp < mc ? mc : cp;
            cp = cp > pages ? pages : cp;
            cp = cp < 1 ? 1 : cp;
            /* ceil(pages / cp) <= S: a float quotient, then one correction each way */
            int32_t ns = (int32_t)((double)pages / (double)cp);
            ns += ns * cp < pages;
            ns -= ((ns - 1) * cp >= pages) & (ns > 0);
            const int32_t split = ns > 1 ? ns : 0;
            st += ns;
            sst += split;
            cmax = split > cmax ? split : cmax;
            /* the first chunk: cp pages when the row has more (then cp x ps < n < 2^31), else the row */
            const int32_t first = cp < pages ? (int32_t)((uint32_t)cp * (uint32_t)ps) : n;
            lmax = first > lmax ? first : lmax;
        }
        tasks[0] = st, split_tasks[0] = sst, max_count[0] = cmax, longest[0] = lmax;
    }
    for (int r = 0; r < 2; r++) tasks[r] *= hkv, split_tasks[r] *= hkv;
    const int64_t kv = tokens * hkv * d * es * 2, qo = (int64_t)B * p->num_qo_heads * (d * es * 2 + 4);
    const double token_mb = (double)(d * es * 2) / 1e6, merge_mb_per_state = (double)G * (d + 1.0) * 4.0 / 1e6;
    for (int k = 0; k < TC_COUNT; k++) {
        const int r = k == TC_SPLIT ? 0 : 1; /* the split and work-queue tallies */
        int64_t ntasks, nsplit, maxc, lng, launches;
        if (k == TC_SINGLE) {
            ntasks = nonempty * hkv, nsplit = 0, maxc = 0, lng = pp->max_len;
        } else {
            ntasks = tasks[r], nsplit = split_tasks[r], maxc = max_count[r], lng = longest[r];
        }
        const int64_t merges = nsplit > 0 || empty > 0;
        if (k == TC_FUSED)
            launches = (ntasks > 0 || empty > 0) ? 1 : 0;
        else
            launches = (ntasks > 0) + merges;
        const int64_t ms = 2 * nsplit * G * (d + 1) * 4;
        pkv_cost_fill_terms(t[k], launches, (double)(kv + qo + ms) / 1e6, (double)lng * token_mb,
                            (double)maxc * merge_mb_per_state, ntasks, pp->slots, (double)kv / 1e6, token_mb,
                            k == TC_SINGLE || k == TC_SPLIT, k == TC_FUSED);
    }
}

/* Length bucket of the bucketed route: floor(log2(N)) + 1, 0 for an empty row (0..32). */
static int32_t length_bucket(int32_t n) {
    int32_t b = 0;
    for (uint32_t x = (uint32_t)n; x; x >>= 1) b++;
    return b;
}

/* The auto rule (no cost model set), from every route measured on the held-out traces (H200,
 * bench/results/h200_policy_eval.md):
 *   single     when the non-empty rows fill a wave (rows x Hkv >= P) and the batch is even (longest
 *              row <= 1.25 x the mean); a ragged batch that large goes to the work queue instead,
 *              whose longest-first task order balances it (mha B64: 7-16% faster than single);
 *   workqueue  for one non-empty row of >= 4096 tokens: its merge kernel (launched early with PDL)
 *              beats the fused route's merge by the last CTA by ~1 us (3-8% of such a step);
 *   fused      otherwise (one launch). */
static pkv_route auto_rule(const plan_params *pp, const pkv_problem *p) {
    if (pp->nonempty * p->num_kv_heads >= pp->P) return pp->ragged ? PKV_ROUTE_WORKQUEUE : PKV_ROUTE_SINGLE;
    if (pp->nonempty == 1 && pp->max_len >= 4096) return PKV_ROUTE_WORKQUEUE;
    return PKV_ROUTE_FUSED;
}

/* Tasks of a graph-stable plan's grid: graph_tasks, else the most the planner's wave rules give a batch
 * of up to graph_max_batch rows (resolve_params: below 128 (row, KV head) pairs one wave of the resident
 * slots; from 128, 4 waves for ragged batches and up to ceil(4 x pairs / slots) waves for even ones), so
 * a graph-stable step is planned as a plain one is and only the grid's surplus CTAs differ; at least a
 * task per pair of the largest batch.  A grid past INT32_MAX / 2 tasks is refused
 * (PKV_ERR_INVALID_ARGUMENT), for the plan and its workspace size alike. */
static pkv_status graph_capacity(pkv_context *ctx, const pkv_plan_options *opts, int64_t slots, const pkv_problem *p,
                                 int64_t *cap_out) {
    const int64_t pairs = (int64_t)opts->graph_max_batch * p->num_kv_heads;
    int64_t cap = slots;
    if (opts->graph_tasks > 0) {
        cap = opts->graph_tasks;
    } else if (pairs >= 128 && slots > 0) {
        const int64_t even = (4 * pairs + slots - 1) / slots * slots;
        cap = 4 * slots > even ? 4 * slots : even;
    }
    if (cap < pairs) cap = pairs;
    if (cap > INT32_MAX / 2)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "graph-stable plan of %lld tasks is too large", (long long)cap);
    *cap_out = cap;
    return PKV_OK;
}

int32_t pkv_graph_claim_multiplier(int32_t nsm) {
    if (nsm <= 1) return 0;
    int32_t b = (nsm + 7) / 8;
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
    for (int i = 0; i < 8; i++) h = (h ^ (uint64_t)((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}
static uint64_t graph_signature(const pkv_plan *plan, int32_t max_batch) {
    const pkv_problem *p = &plan->problem;
    float f[2] = {p->sm_scale, p->logits_soft_cap};
    uint32_t fb[2];
    memcpy(fb, f, sizeof fb);
    const int64_t v[] = {p->num_qo_heads, p->num_kv_heads, p->head_dim, p->page_size, p->num_pages, (int64_t)p->layout,
                         (int64_t)p->dtype, fb[0], fb[1], p->window, max_batch, plan->graph_tasks, plan->graph_merges,
                         (int64_t)plan->route, (int64_t)plan->off_tasks, (int64_t)plan->off_merges,
                         (int64_t)plan->off_counts, (int64_t)plan->off_state_o, (int64_t)plan->off_state_lse,
                         (int64_t)plan->workspace_bytes, (int64_t)plan->blob_bytes};
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) h = fnv_mix(h, v[i]);
    return h ? h : 1;
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

static pkv_status plan_impl(pkv_context *ctx, int32_t parallelism, int32_t default_cpu, int32_t resident, int32_t resident_x,
                            const pkv_problem *problem,
                            const pkv_page_table *table, const pkv_plan_options *opts_in, pkv_plan *plan) {
    if (plan) plan->generation = 0; /* a plan that fails, even at the checks, is not runnable */
    pkv_status st = pkv_check_problem(ctx, problem);
    if (st != PKV_OK) return st;
    st = pkv_check_table(ctx, problem, table, table && table->kv_page_indices != NULL);
    if (st != PKV_OK) return st;
    if (!plan) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "plan is NULL");
    /* a sliding window: the planner sees each row's attended tokens as its length, and the rows'
     * tasks start at the window's first token */
    pkv_page_table windowed;
    const int32_t *row_starts = NULL;
    if (problem->window > 0 && table->batch_size > 0) {
        st = grow_i32(ctx, &plan->win, &plan->win_cap, 2 * (size_t)table->batch_size, "the window's row data");
        if (st != PKV_OK) return st;
        int32_t *wl = plan->win, *ws = plan->win + table->batch_size;
        window_lengths(problem, table, wl, ws);
        windowed = *table;
        windowed.seq_lens = wl;
        table = &windowed;
        row_starts = ws;
    }
    pkv_plan_options opts;
    if (opts_in)
        opts = *opts_in;
    else
        pkv_plan_options_default(&opts);
    st = check_options(ctx, &opts, problem);
    if (st != PKV_OK) return st;
    if (opts.parallelism > 0) parallelism = opts.parallelism;
    if (parallelism <= 0)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "parallelism must be positive (set it in the options)");
    plan_params pp;
    const bool row_gathered = ctx && ctx->row_gather_below > 0 &&
                              (problem->page_size & -problem->page_size) < ctx->row_gather_below;
    resolve_params(&opts, parallelism, default_cpu, resident, resident_x, row_gathered, problem, table, &pp);

    const int32_t B = table->batch_size, hkv = problem->num_kv_heads;
    plan->slots = pp.slots;
    const int32_t *lens = table->seq_lens;
    plan->problem = *problem;
    plan->batch_size = B;
    plan->group = problem->num_qo_heads / hkv;

    const int64_t empty = B - pp.nonempty;
    pkv_route route = opts.route;
    /* graph-stable: the work queue on a fixed grid of graph_cap tasks (see persistentkv.h) */
    const bool graph = opts.graph_max_batch > 0;
    int32_t graph_cap = 0;
    plan->graph_tasks = plan->graph_merges = 0;
    plan->graph_signature = 0;
    if (graph) {
        if (B > opts.graph_max_batch)
            return pkv_fail(ctx, PKV_ERR_BATCH_SIZE, "batch of %d rows above the graph-stable plan's graph_max_batch %d",
                            B, opts.graph_max_batch);
        if (route != PKV_ROUTE_AUTO && route != PKV_ROUTE_WORKQUEUE)
            return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "graph-stable plans run the work queue (route auto or workqueue), not %s",
                            pkv_route_name(route));
        route = PKV_ROUTE_WORKQUEUE;
        int64_t cap = 0;
        st = graph_capacity(ctx, &opts, pp.slots, problem, &cap);
        if (st != PKV_OK) return st;
        graph_cap = (int32_t)cap;
        if (pp.P > graph_cap) pp.P = graph_cap; /* the chunk search keeps the tasks within the wave */
    }
    int32_t wq_chunk = -1; /* the work queue's chunk (pages), once searched */
    if (route == PKV_ROUTE_AUTO && !graph && ctx && ctx->has_cost_model) {
        /* the policy: each candidate's predicted time from its terms (O(B) each, no plan built),
         * the lowest wins; ties keep the earlier candidate.  Candidates: the four routes at the
         * planner's wave P, and, when the step has fewer (row, KV head) pairs than resident task
         * slots (splitting decides its length), P is one wave (not the 4 waves of ragged batches of
         * >= 128 pairs), at least two non-empty rows and nothing forced, the split, work-queue and
         * fused routes at one wave of all resident slots (k tasks per unit, k = the kernel's
         * resident CTAs).  Against the 4 waves, one resident wave lost 3-5% on 8 of the B16 rows
         * of the FlashInfer side by side at 90dc1f1 (kernel v8) and 0.8% on average over the
         * held-out B16 steps it was picked for; without the candidate the re-planned auto's regret
         * fell from 0.26% to 0.23% (600 held-out steps at 28235f0; 0.26% on 578 of the 6e27cff
         * ones, 0.29% before).  A single row keeps the planner's 2 per unit: 3 per unit
         * measured 2-9% slower on the H200's held-out B1 rows (more states per merge, a cost the
         * model does not see).  The model's critical-path and idle-slot terms rank those waves as
         * the H200 does (dev/wave_model.c against the measured sweep in
         * bench/results/probes/h200_sweep_wave.txt: 9 of 9 rows within 1% of the best). */
        int64_t waves[PKV_MAX_WAVE_CANDIDATES];
        int nwaves = 0;
        waves[nwaves++] = pp.P;
        const int64_t units = pp.nonempty * hkv;
        if (opts.ctas_per_unit <= 0 && pp.forced_splits <= 0 && pp.forced_chunk <= 0 && units < pp.slots &&
            pp.P <= pp.slots && pp.nonempty >= 2) {
            /* one wave of every resident slot: the sweep's best or within 1% of it on every row
             * (2 per unit, the other one-wave size, is the planner's default below 128 pairs) */
            const int64_t full = (int64_t)parallelism * resident_x; /* the kernel's exact residency */
            if (full != pp.P && full > 0) waves[nwaves++] = full;
        }
        static const int pref[TC_COUNT] = {TC_SINGLE, TC_FUSED, TC_SPLIT, TC_WORKQUEUE}; /* ties: the simpler */
        double best_us = INFINITY;
        int64_t best_P = pp.P;
        route = auto_rule(&pp, problem); /* kept if no prediction is finite */
        for (int w = 0; w < nwaves; w++) {
            plan_params pw = pp;
            pw.P = waves[w];
            const int32_t chunk = choose_workqueue_chunk(&pw, problem, lens, B);
            double t[TC_COUNT][PKV_COST_TERMS];
            candidate_terms(&pw, problem, lens, B, chunk, t);
            for (int k = w == 0 ? 0 : 1; k < TC_COUNT; k++) { /* single does not depend on P */
                if (!pkv_cost_candidate(t[pref[k]], parallelism)) continue;
                const double us = pkv_cost_predict(&ctx->cost_model, t[pref[k]]);
                if (us < best_us) { /* false for NaN */
                    best_us = us;
                    route = term_routes[pref[k]];
                    best_P = waves[w];
                    wq_chunk = chunk;
                }
            }
        }
        pp.P = best_P;
    } else if (route == PKV_ROUTE_AUTO) {
        route = auto_rule(&pp, problem);
    }
    plan->route = route;

    st = scratch_reserve(ctx, plan, (size_t)B + 64);
    if (st != PKV_OK) return st;
    int32_t *order = plan->scratch;
    int32_t slots = 0;

    if (route == PKV_ROUTE_SINGLE || route == PKV_ROUTE_SPLIT) {
        for (int32_t i = 0; i < B; i++) order[i] = i;
        int32_t S = route == PKV_ROUTE_SINGLE ? 1 : choose_splits(&pp, problem, lens, order, B);
        int64_t ntasks = 0, nmerges = empty * hkv;
        for (int32_t i = 0; i < B; i++) {
            int32_t pages = row_pages(problem, lens[i]);
            int64_t ns = lens[i] > 0 ? ceil_div(pages, row_chunk_pages(&pp, pages, S)) : 0;
            ntasks += ns * hkv;
            if (ns > 1) nmerges += hkv;
        }
        st = plan_reserve(ctx, plan, ntasks, B, nmerges, 1, false);
        if (st != PKV_OK) return st;
        slots = emit_rect_phase(plan, &pp, table, row_starts, order, B, S);
    } else if (route == PKV_ROUTE_BUCKETED) {
        if (pp.P_bucketed > 0) pp.P = pp.P_bucketed;
        /* counting sort of rows by bucket = floor(log2(N)) + 1, 0 for empty rows */
        int32_t counts[34] = {0};
        for (int32_t i = 0; i < B; i++) counts[length_bucket(lens[i])]++;
        int32_t starts[34], at = 0, nb = 0;
        for (int b = 0; b < 34; b++) {
            starts[b] = at;
            at += counts[b];
            nb += counts[b] > 0;
        }
        int32_t fill[34];
        memcpy(fill, starts, sizeof fill);
        for (int32_t i = 0; i < B; i++) order[fill[length_bucket(lens[i])]++] = i;
        int64_t ntasks = 0, nmerges = 0;
        int32_t Sb[34];
        for (int b = 0; b < 34; b++) {
            if (!counts[b]) continue;
            Sb[b] = choose_splits(&pp, problem, lens, order + starts[b], counts[b]);
            for (int32_t k = 0; k < counts[b]; k++) {
                int32_t n = lens[order[starts[b] + k]];
                int32_t pages = row_pages(problem, n);
                int64_t ns = n > 0 ? ceil_div(pages, row_chunk_pages(&pp, pages, Sb[b])) : 0;
                ntasks += ns * hkv;
                if (ns != 1) nmerges += hkv;
            }
        }
        st = plan_reserve(ctx, plan, ntasks, B, nmerges, nb, false);
        if (st != PKV_OK) return st;
        for (int b = 0; b < 34; b++) {
            if (!counts[b]) continue;
            int32_t s = emit_rect_phase(plan, &pp, table, row_starts, order + starts[b], counts[b], Sb[b]);
            if (s > slots) slots = s; /* buckets run in sequence: slots are reused */
        }
    } else { /* WORKQUEUE and FUSED */
        int32_t c = wq_chunk > 0 ? wq_chunk : choose_workqueue_chunk(&pp, problem, lens, B);
        int32_t chunk_tokens = c * problem->page_size;
        int64_t ntasks = 0, nmerges = empty * hkv;
        for (int32_t i = 0; i < B; i++) {
            int64_t ns = lens[i] > 0 ? ceil_div(lens[i], chunk_tokens) : 0;
            ntasks += ns * hkv;
            if (ns > 1) nmerges += hkv;
        }
        if (graph) {
            if (ntasks > graph_cap)
                return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                                "this step needs %lld tasks, above the graph-stable plan's %d (raise graph_tasks, or "
                                "leave chunk_pages to the planner)",
                                (long long)ntasks, graph_cap);
            /* the layout of the largest step: the same offsets and workspace for every step */
            st = plan_reserve(ctx, plan, graph_cap, opts.graph_max_batch, (int64_t)opts.graph_max_batch * hkv, 1, true);
        } else {
            st = plan_reserve(ctx, plan, ntasks, B, nmerges, 1, false);
        }
        if (st != PKV_OK) return st;
        begin_phase(plan, 0);
        for (int32_t i = 0; i < B; i++)
            slots += emit_row(plan, i, lens[i], row_starts ? row_starts[i] : 0, table->kv_indptr[i], chunk_tokens, slots,
                              true);
        emit_empty_merges(plan, lens, NULL, B);
        /* full chunks first (already in row order), then the tails longest first.  A row's tail
         * tasks (one per KV head, same length) are the row's last Hkv tasks: sort the rows, not the
         * tasks (ties keep row order, so the order is that of sorting tasks by length, row, head). */
        pkv_task *tasks = plan->tasks;
        const int32_t nt = plan->num_tasks;
        /* scratch (int32 units): [B + 64 | tails: nt tasks | pad to 8 bytes | keys: B uint64] */
        const size_t key_at = ((size_t)(B + 64) + (size_t)nt * (sizeof(pkv_task) / sizeof(int32_t)) + 1) & ~(size_t)1;
        st = scratch_reserve(ctx, plan, key_at + 2 * (size_t)B + 2);
        if (st != PKV_OK) return st;
        pkv_task *tails = (pkv_task *)(plan->scratch + B + 64);
        uint64_t *keys = (uint64_t *)(void *)(plan->scratch + key_at); /* one per tail group (row) */
        int32_t w = 0, ntail = 0, ngroups = 0;
        for (int32_t k = 0; k < nt; k++) {
            /* a chunk's planned length: a windowed row's first chunk counts from its page's start */
            const int32_t tb = plan->rows[tasks[k].row].tok_begin;
            const int32_t begin = tasks[k].tok_begin == tb ? page_floor(problem, tb) : tasks[k].tok_begin;
            const int32_t len = tasks[k].tok_end - begin;
            if (len == chunk_tokens) {
                tasks[w++] = tasks[k];
            } else {
                if (tasks[k].kv_head == 0)
                    keys[ngroups++] = ((uint64_t)(uint32_t)(INT32_MAX - len) << 32) | (uint32_t)ntail;
                tails[ntail++] = tasks[k];
            }
        }
        sort_u64(keys, ngroups);
        for (int32_t gi = 0; gi < ngroups; gi++)
            for (int32_t h = 0; h < hkv; h++) tasks[w++] = tails[(uint32_t)keys[gi] + h];
        end_phase(plan);
    }
    plan->num_state_slots = slots;
    /* zeroed arrival counters right after the merges (used by the fused route) */
    memset((char *)plan->blob + plan->off_merges + (size_t)plan->num_merges * sizeof(pkv_merge), 0,
           (size_t)plan->num_merges * sizeof(int32_t));

    /* workspace layout: [plan blob | partial states]; graph-stable: room for a slot per task of the grid */
    plan->workspace_bytes = states_layout(plan->blob_bytes, graph ? graph_cap : slots, plan->group, problem->head_dim,
                                          &plan->off_state_o, &plan->off_state_lse);
    /* fused: one arrival counter per merge; zeros travel with the plan upload and the last task of
     * each merge resets its counter, so every run starts from zero */
    plan->off_counters = plan->off_merges + (size_t)plan->num_merges * sizeof(pkv_merge);
    if (graph) {
        int32_t *counts = (int32_t *)(void *)((char *)plan->blob + plan->off_counts);
        memset(counts, 0, PKV_COUNTS_WORDS * sizeof(int32_t)); /* the work claim starts from zeros */
        counts[PKV_COUNTS_TASKS] = plan->num_tasks;
        counts[PKV_COUNTS_MERGES] = plan->num_merges;
        counts[PKV_COUNTS_WIDEST] = plan->max_merge_count;
        plan->graph_tasks = graph_cap;
        plan->graph_merges = opts.graph_max_batch * hkv;
        plan->graph_signature = graph_signature(plan, opts.graph_max_batch);
    }
    compute_counters(plan);
    plan->generation = atomic_fetch_add(&pkv_next_generation, 1);
    return PKV_OK;
}

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
    return plan_impl(ctx, ctx->parallelism, default_ctas(ctx), resident_ctas(ctx, problem), resident_exact(ctx, problem),
                     problem, table, opts, plan);
}

pkv_status pkv_plan_step_host(const pkv_problem *problem, const pkv_page_table *table, const pkv_plan_options *opts,
                         pkv_plan *plan) {
    return plan_impl(NULL, 0, 2, 2, 2, problem, table, opts, plan);
}

pkv_status pkv_workspace_size(pkv_context *ctx, const pkv_problem *problem, int32_t max_batch,
                              const pkv_plan_options *opts_in, size_t *bytes) {
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
    int64_t par = opts.parallelism > 0 ? opts.parallelism : (ctx ? ctx->parallelism : 0);
    if (par <= 0) return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "parallelism unknown: pass a context or set it");
    int64_t per = opts.ctas_per_unit > 0 ? opts.ctas_per_unit : default_ctas(ctx), res = resident_ctas(ctx, problem);
    const int64_t res_x = resident_exact(ctx, problem);
    if (opts.graph_max_batch > 0) {
        /* graph-stable: the plans' own fixed layout (plan_reserve + the states), whatever the step */
        if (max_batch > opts.graph_max_batch)
            return pkv_fail(ctx, PKV_ERR_BATCH_SIZE, "max_batch %d above graph_max_batch %d", max_batch, opts.graph_max_batch);
        int64_t cap = 0;
        st = graph_capacity(ctx, &opts, resident_slots(par, per, res, res_x), problem, &cap);
        if (st != PKV_OK) return st;
        const int64_t gm = opts.graph_max_batch;
        size_t o_rows, o_merges, o_counts, o_state, o_lse;
        const size_t blob = blob_layout(cap, gm, gm * problem->num_kv_heads, true, &o_rows, &o_merges, &o_counts);
        *bytes = states_layout(blob, cap, problem->num_qo_heads / problem->num_kv_heads, problem->head_dim, &o_state,
                               &o_lse);
        return PKV_OK;
    }
    if (res_x > res) res = res_x; /* bounds the one-wave P too */
    if (res < per || opts.ctas_per_unit > 0) res = per;
    /* up to 4 waves of the resident tasks for ragged batches unless ctas_per_unit is forced */
    int64_t P = par * res * (opts.ctas_per_unit > 0 ? 1 : 4), hkv = problem->num_kv_heads, G = problem->num_qo_heads / hkv;
    /* an even batch over one wave: its pairs split up to 4 ways, P = the waves of resident tasks that holds */
    if (opts.ctas_per_unit <= 0 && 4 * (int64_t)max_batch * hkv + par * res > P) P = 4 * (int64_t)max_batch * hkv + par * res;
    int64_t max_splits = opts.max_splits > 0 ? opts.max_splits : 256;
    /* Every rule keeps split slots <= P + B x Hkv (a wave plus one rounding per row); a forced S
     * gives up to B x Hkv x S, a forced workqueue chunk up to B x Hkv x max_splits. */
    int64_t slots = P + (int64_t)max_batch * hkv;
    if (opts.num_splits > 0) {
        int64_t s = (int64_t)max_batch * hkv * (opts.num_splits < max_splits ? opts.num_splits : max_splits);
        if (s > slots) slots = s;
    }
    if (opts.chunk_pages > 0 && (int64_t)max_batch * hkv * max_splits > slots) slots = (int64_t)max_batch * hkv * max_splits;
    /* tasks: every phase holds at most P + its rows x Hkv; bucketed has up to 34 phases */
    int64_t tasks = slots + (int64_t)(max_batch < 34 ? max_batch : 34) * P + (int64_t)max_batch * hkv;
    size_t o_rows, o_merges, o_counts, o_state, o_lse;
    const size_t blob = blob_layout(tasks, max_batch, (int64_t)max_batch * hkv, false, &o_rows, &o_merges, &o_counts);
    /* one alignment unit of slack on top of the layout */
    *bytes = states_layout(blob, slots, G, problem->head_dim, &o_state, &o_lse) + PKV_WS_ALIGN;
    return PKV_OK;
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
int32_t pkv_plan_num_state_slots(const pkv_plan *p) { return p ? p->num_state_slots : 0; }
const pkv_problem *pkv_plan_problem(const pkv_plan *p) { return p ? &p->problem : NULL; }
int32_t pkv_plan_batch_size(const pkv_plan *p) { return p ? p->batch_size : 0; }
size_t pkv_plan_workspace_size(const pkv_plan *p) { return p ? p->workspace_bytes : 0; }
uint64_t pkv_plan_graph_signature(const pkv_plan *p) { return p && p->generation ? p->graph_signature : 0; }
int32_t pkv_plan_grid_tasks(const pkv_plan *p) { return !p ? 0 : p->graph_tasks > 0 ? p->graph_tasks : p->num_tasks; }

pkv_status pkv_plan_route_terms(const pkv_problem *problem, const pkv_page_table *table, const pkv_plan_options *opts,
                                int32_t default_per_unit, double terms[PKV_COST_TERMS]) {
    pkv_status st = pkv_check_problem(NULL, problem);
    if (st == PKV_OK) st = pkv_check_table(NULL, problem, table, false);
    if (st != PKV_OK) return st;
    if (!opts || !terms || opts->parallelism <= 0)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "options with a parallelism and terms are needed");
    if (opts->route == PKV_ROUTE_AUTO || opts->route == PKV_ROUTE_BUCKETED || opts->route < 0 || opts->route >= PKV_ROUTE_COUNT_)
        return pkv_fail(NULL, PKV_ERR_UNSUPPORTED, "terms without a plan exist for single, split, workqueue and fused");
    pkv_page_table windowed = *table; /* a sliding window: each row's attended tokens */
    int32_t *wl = NULL;
    if (problem->window > 0 && table->batch_size > 0) {
        wl = (int32_t *)malloc((size_t)table->batch_size * sizeof *wl);
        if (!wl) return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot allocate the window's row lengths");
        window_lengths(problem, table, wl, NULL);
        windowed.seq_lens = wl;
    }
    plan_params pp;
    resolve_params(opts, opts->parallelism, default_per_unit, default_per_unit, default_per_unit, false, problem,
                   &windowed, &pp);
    double t[TC_COUNT][PKV_COST_TERMS];
    candidate_terms(&pp, problem, windowed.seq_lens, table->batch_size, -1, t);
    free(wl);
    int k = 0;
    while (term_routes[k] != opts->route) k++;
    memcpy(terms, t[k], sizeof t[k]);
    return PKV_OK;
}
