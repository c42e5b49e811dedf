/* emit.c - plan emission per route, once the route and its parameters are chosen: the row records,
 * tasks, merges and launch phases of
 *   single, split  one rectangular phase over all rows (S = 1 for single);
 *   bucketed       rows grouped by floor(log2(N)); each bucket is planned as `split` on its own and
 *                  launched separately (split + merge per bucket).  Partial-state slots are reused by the
 *                  next bucket, since buckets run one after the other;
 *   workqueue      one phase of chunks of one size; full chunks come first in the task list, then the
 *                  row tails, longest first.  The fused route is the same plan, executed in one launch:
 *                  the last task of a split (row, KV head) to finish merges its states (a counter per
 *                  merge in the workspace).  Graph-stable plans are work-queue plans on the layout of the
 *                  largest step;
 * and the plan's counters.
 */
#include "plan_internal.h"

#include <stdlib.h>
#include <string.h>

/* Slack after the row order in the planner's int32 scratch (also where the work queue's tails start). */
#define PKV_ORDER_SLACK 64
/* Tail groups sorted by insertion up to this many, else by qsort. */
#define PKV_INSERTION_SORT_MAX 64

/* Emits the schedule of one row split in chunks of chunk_tokens: its row record, its tasks (split
 * outer, KV head inner), and merges for split rows.  The row's n tokens are planned from token `start`
 * (under a sliding window the start of the page that holds the window's first token, else 0); its first
 * task starts at the window (row record: tok_begin; the CUDA rect kernels cut the same splits from it,
 * load_task).  Returns the slots it used. */
static int32_t emit_row(pkv_plan *plan, int32_t row, int32_t n, int32_t start, int32_t page_base, int32_t chunk_tokens,
                        int32_t slot_base) {
    const int32_t hkv = plan->problem.num_kv_heads;
    int32_t nsplit = n > 0 ? (int32_t)pkv_ceil_div(n, chunk_tokens) : 0;
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

/* One rectangular phase (single / split / a bucket) over the given rows; returns the slots it used. */
static int32_t emit_rect_phase(pkv_plan *plan, const plan_params *pp, const pkv_page_table *t, const int32_t *starts,
                               const int32_t *rows, int32_t nrows, int32_t S) {
    const pkv_problem *p = &plan->problem;
    begin_phase(plan, S);
    int32_t slots = 0;
    for (int32_t k = 0; k < nrows; k++) {
        int32_t i = rows[k], n = t->seq_lens[i];
        int32_t pages = pkv_row_pages(p, n);
        int32_t chunk = plan_row_chunk_pages(pp, pages, S) * p->page_size;
        slots += emit_row(plan, i, n, starts ? starts[i] : 0, t->kv_indptr[i], chunk, slots);
    }
    emit_empty_merges(plan, t->seq_lens, rows, nrows);
    end_phase(plan);
    return slots;
}

/* Tasks and merges of rows[0..nrows) under S splits (merges: split rows and empty rows), added to
 * *ntasks and *nmerges. */
static void count_rect(const plan_params *pp, const pkv_problem *p, const int32_t *lens, const int32_t *rows,
                       int32_t nrows, int32_t S, int64_t *ntasks, int64_t *nmerges) {
    const int32_t hkv = p->num_kv_heads;
    for (int32_t k = 0; k < nrows; k++) {
        const int32_t n = lens[rows[k]], pages = pkv_row_pages(p, n);
        const int64_t ns = n > 0 ? pkv_ceil_div(pages, plan_row_chunk_pages(pp, pages, S)) : 0;
        *ntasks += ns * hkv;
        if (ns != 1) *nmerges += hkv;
    }
}

pkv_status plan_emit_rect(const plan_step *s, const plan_params *pp, pkv_plan *plan) {
    const int32_t B = s->table->batch_size;
    const int32_t *lens = s->table->seq_lens;
    pkv_status st = plan_scratch_reserve(s->ctx, plan, (size_t)B + PKV_ORDER_SLACK);
    if (st != PKV_OK) return st;
    int32_t *order = plan->scratch;
    for (int32_t i = 0; i < B; i++) order[i] = i;
    const int32_t S = plan->route == PKV_ROUTE_SINGLE ? 1 : plan_choose_splits(pp, s->problem, lens, order, B);
    int64_t ntasks = 0, nmerges = 0;
    count_rect(pp, s->problem, lens, order, B, S, &ntasks, &nmerges);
    st = plan_reserve(s->ctx, plan, ntasks, B, nmerges, 1, false);
    if (st != PKV_OK) return st;
    plan->num_state_slots = emit_rect_phase(plan, pp, s->table, s->row_starts, order, B, S);
    return PKV_OK;
}

/* Length bucket of the bucketed route: floor(log2(N)) + 1, 0 for an empty row (0..32). */
static int32_t length_bucket(int32_t n) {
    int32_t b = 0;
    for (uint32_t x = (uint32_t)n; x; x >>= 1) b++;
    return b;
}

pkv_status plan_emit_bucketed(const plan_step *s, const plan_params *pp_step, pkv_plan *plan) {
    const int32_t B = s->table->batch_size;
    const int32_t *lens = s->table->seq_lens;
    plan_params pp = *pp_step;
    if (pp.P_bucketed > 0) pp.P = pp.P_bucketed;
    pkv_status st = plan_scratch_reserve(s->ctx, plan, (size_t)B + PKV_ORDER_SLACK);
    if (st != PKV_OK) return st;
    int32_t *order = plan->scratch;
    /* counting sort of the rows by bucket */
    int32_t counts[PKV_LENGTH_BUCKETS] = {0}, starts[PKV_LENGTH_BUCKETS], fill[PKV_LENGTH_BUCKETS], at = 0, nb = 0;
    for (int32_t i = 0; i < B; i++) counts[length_bucket(lens[i])]++;
    for (int b = 0; b < PKV_LENGTH_BUCKETS; b++) {
        starts[b] = at;
        at += counts[b];
        nb += counts[b] > 0;
    }
    memcpy(fill, starts, sizeof fill);
    for (int32_t i = 0; i < B; i++) order[fill[length_bucket(lens[i])]++] = i;
    int64_t ntasks = 0, nmerges = 0;
    int32_t Sb[PKV_LENGTH_BUCKETS];
    for (int b = 0; b < PKV_LENGTH_BUCKETS; b++) {
        if (!counts[b]) continue;
        Sb[b] = plan_choose_splits(&pp, s->problem, lens, order + starts[b], counts[b]);
        count_rect(&pp, s->problem, lens, order + starts[b], counts[b], Sb[b], &ntasks, &nmerges);
    }
    st = plan_reserve(s->ctx, plan, ntasks, B, nmerges, nb, false);
    if (st != PKV_OK) return st;
    int32_t slots = 0;
    for (int b = 0; b < PKV_LENGTH_BUCKETS; b++) {
        if (!counts[b]) continue;
        int32_t used = emit_rect_phase(plan, &pp, s->table, s->row_starts, order + starts[b], counts[b], Sb[b]);
        if (used > slots) slots = used; /* buckets run in sequence: slots are reused */
    }
    plan->num_state_slots = slots;
    return PKV_OK;
}

/* Sort keys of the tail groups: (INT32_MAX - length) << 32 | group ordinal, so ascending keys are
 * longest first, then row order. */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : (x > y);
}

static void sort_u64(uint64_t *v, int32_t n) {
    if (n > PKV_INSERTION_SORT_MAX) {
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

/* The work queue's task order: full chunks first (already in row order), then the tails longest first.
 * A row's tail tasks (one per KV head, same length) are the row's last Hkv tasks: sort the rows, not the
 * tasks (ties keep row order, so the order is that of sorting tasks by length, row, head). */
static pkv_status order_tails(pkv_context *ctx, pkv_plan *plan, int32_t B, int32_t chunk_tokens) {
    const pkv_problem *problem = &plan->problem;
    const int32_t hkv = problem->num_kv_heads;
    pkv_task *tasks = plan->tasks;
    const int32_t nt = plan->num_tasks;
    /* scratch (int32 units): [B + slack | tails: nt tasks | pad to 8 bytes | keys: B uint64] */
    const size_t key_at =
        ((size_t)(B + PKV_ORDER_SLACK) + (size_t)nt * (sizeof(pkv_task) / sizeof(int32_t)) + 1) & ~(size_t)1;
    pkv_status st = plan_scratch_reserve(ctx, plan, key_at + 2 * (size_t)B + 2);
    if (st != PKV_OK) return st;
    pkv_task *tails = (pkv_task *)(plan->scratch + B + PKV_ORDER_SLACK);
    uint64_t *keys = (uint64_t *)(void *)(plan->scratch + key_at); /* one per tail group (row) */
    int32_t w = 0, ntail = 0, ngroups = 0;
    for (int32_t k = 0; k < nt; k++) {
        /* a chunk's planned length: a windowed row's first chunk counts from its page's start */
        const int32_t tb = plan->rows[tasks[k].row].tok_begin;
        const int32_t begin = tasks[k].tok_begin == tb ? pkv_page_floor(problem, tb) : tasks[k].tok_begin;
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
    return PKV_OK;
}

pkv_status plan_emit_workqueue(const plan_step *s, const plan_params *pp, int32_t wq_chunk, pkv_plan *plan) {
    const pkv_problem *problem = s->problem;
    const int32_t B = s->table->batch_size, hkv = problem->num_kv_heads;
    const int32_t *lens = s->table->seq_lens;
    const int32_t c = wq_chunk > 0 ? wq_chunk : plan_workqueue_chunk(pp, problem, lens, B);
    const int32_t chunk_tokens = c * problem->page_size;
    int64_t ntasks = 0, nmerges = (B - pp->nonempty) * hkv;
    for (int32_t i = 0; i < B; i++) {
        const int64_t ns = lens[i] > 0 ? pkv_ceil_div(lens[i], chunk_tokens) : 0;
        ntasks += ns * hkv;
        if (ns > 1) nmerges += hkv;
    }
    pkv_status st;
    if (s->graph_cap > 0) {
        if (ntasks > s->graph_cap)
            return pkv_fail(s->ctx, PKV_ERR_INVALID_ARGUMENT,
                            "this step needs %lld tasks, above the graph-stable plan's %d (raise graph_tasks, or "
                            "leave chunk_pages to the planner)",
                            (long long)ntasks, s->graph_cap);
        /* the layout of the largest step: the same offsets and workspace for every step */
        const int32_t gm = s->opts->graph_max_batch;
        st = plan_reserve(s->ctx, plan, s->graph_cap, gm, (int64_t)gm * hkv, 1, true);
    } else {
        st = plan_reserve(s->ctx, plan, ntasks, B, nmerges, 1, false);
    }
    if (st != PKV_OK) return st;
    begin_phase(plan, 0);
    int32_t slots = 0;
    for (int32_t i = 0; i < B; i++)
        slots += emit_row(plan, i, lens[i], s->row_starts ? s->row_starts[i] : 0, s->table->kv_indptr[i], chunk_tokens,
                          slots);
    emit_empty_merges(plan, lens, NULL, B);
    st = order_tails(s->ctx, plan, B, chunk_tokens);
    if (st != PKV_OK) return st;
    end_phase(plan);
    plan->num_state_slots = slots;
    return PKV_OK;
}

void plan_compute_counters(pkv_plan *plan) {
    const pkv_problem *p = &plan->problem;
    pkv_counters *c = &plan->counters;
    memset(c, 0, sizeof *c);
    /* q and o in dtype, K and V in the cache's element type (fp8: one byte) */
    const int64_t es = (int64_t)pkv_dtype_size(p->dtype), kv_es = (int64_t)pkv_kv_elem_size(p);
    const int64_t d = p->head_dim, hkv = p->num_kv_heads;
    int64_t split_tasks = 0;
    for (int32_t k = 0; k < plan->num_tasks; k++) {
        const pkv_task *t = &plan->tasks[k];
        c->kv_bytes += (int64_t)(t->tok_end - t->tok_begin) * d * kv_es * 2; /* K and V */
        if (t->state_slot >= 0) split_tasks++;
    }
    for (int32_t k = 0; k < plan->num_rows; k++) c->total_tokens += plan->rows[k].seq_len - plan->rows[k].tok_begin;
    c->tasks = plan->num_tasks;
    c->merges = plan->num_merges;
    c->qo_bytes = (int64_t)plan->batch_size * p->num_qo_heads * (d * es * 2 + 4); /* q, o and the fp32 lse */
    c->merge_state_bytes = 2 * split_tasks * plan->group * (d + 1) * 4; /* fp32 states written, read back */
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
