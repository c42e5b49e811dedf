/* validate.c - checks a plan against the lengths it was made for: every token of every
 * (row, KV head) covered exactly once, partial-state slots unique within a phase, merges that match
 * the split tasks in slot order, empty rows merged as empty, counters that match the lists. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Records why the plan is invalid as the thread's last error (pkv_last_error); returns
 * PKV_ERR_INVALID_ARGUMENT. */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static pkv_status bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pkv_failv(PKV_ERR_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    return PKV_ERR_INVALID_ARGUMENT;
}
#define BAD(...) return bad(__VA_ARGS__)

/* a task's sort key with its index (qsort has no context argument in C11: the key carries its data) */
typedef struct task_key {
    int32_t row, kv_head, tok_begin, index;
} task_key;

static int cmp_key(const void *a, const void *b) {
    const task_key *x = (const task_key *)a, *y = (const task_key *)b;
    if (x->row != y->row) return x->row < y->row ? -1 : 1;
    if (x->kv_head != y->kv_head) return x->kv_head < y->kv_head ? -1 : 1;
    if (x->tok_begin != y->tok_begin) return x->tok_begin < y->tok_begin ? -1 : 1;
    return 0;
}

/* a merge's (row, KV head) as one key with its index, sorted so each pair's merges are found by binary
 * search: the validator stays O((tasks + merges) log) where a scan per pair was O(B x Hkv x merges) */
typedef struct merge_key {
    int64_t key; /* row x Hkv + KV head; -1 for a pair out of range (found by none) */
    int32_t index;
} merge_key;

static int cmp_merge_key(const void *a, const void *b) {
    const merge_key *x = (const merge_key *)a, *y = (const merge_key *)b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int32_t phase_of_task(const pkv_plan *p, int32_t k) {
    for (int32_t i = 0; i < p->num_phases; i++)
        if (k >= p->phases[i].task_begin && k < p->phases[i].task_end) return i;
    return -1;
}

static int32_t phase_of_merge(const pkv_plan *p, int32_t k) {
    for (int32_t i = 0; i < p->num_phases; i++)
        if (k >= p->phases[i].merge_begin && k < p->phases[i].merge_end) return i;
    return -1;
}

/* The plan under validation, its lengths and the validator's buffers. */
typedef struct vstate {
    const pkv_plan *plan;
    const int32_t *lens;
    int32_t B, hkv, nt;
    int32_t *idx;        /* task indices sorted by (row, KV head, first token) */
    int32_t *row_base;   /* page_base of each row, from the plan's rows */
    int32_t *slot_phase; /* the phase that last wrote each slot */
    task_key *keys;
    merge_key *mkeys;    /* the merges sorted by (row, KV head) */
} vstate;

/* One row record per row, each with the row's tokens. */
static pkv_status check_rows(const vstate *v) {
    const pkv_plan *plan = v->plan;
    for (int32_t i = 0; i < v->B; i++) v->row_base[i] = -1;
    if (plan->num_rows != v->B) BAD("plan lists %d rows for a batch of %d", plan->num_rows, v->B);
    for (int32_t r = 0; r < plan->num_rows; r++) {
        const pkv_row_sched *rs = &plan->rows[r];
        if (rs->row < 0 || rs->row >= v->B || v->row_base[rs->row] != -1)
            BAD("row record %d names row %d twice or out of range", r, rs->row);
        v->row_base[rs->row] = rs->page_base;
        const int32_t n = v->lens[rs->row];
        if (rs->seq_len != n || rs->tok_begin != pkv_row_start(&plan->problem, n))
            BAD("row record %d: tokens [%d, %d), the row attends to [%d, %d)", r, rs->tok_begin, rs->seq_len,
                pkv_row_start(&plan->problem, n), n);
    }
    return PKV_OK;
}

/* Phases tile the task and merge lists in order. */
static pkv_status check_phases(const vstate *v) {
    const pkv_plan *plan = v->plan;
    int32_t tb = 0, mb = 0;
    for (int32_t i = 0; i < plan->num_phases; i++) {
        const pkv_phase *ph = &plan->phases[i];
        if (ph->task_begin != tb || ph->task_end < ph->task_begin) BAD("phase %d task range broken", i);
        if (ph->merge_begin != mb || ph->merge_end < ph->merge_begin) BAD("phase %d merge range broken", i);
        tb = ph->task_end;
        mb = ph->merge_end;
    }
    if (tb != v->nt || mb != plan->num_merges) BAD("phases do not cover the task and merge lists");
    return PKV_OK;
}

/* Each task on its own: in range, within its row's window, its page base and slot; then the tasks
 * sorted by (row, KV head, first token) into idx. */
static pkv_status check_tasks(const vstate *v) {
    const pkv_plan *plan = v->plan;
    for (int32_t s = 0; s < plan->num_state_slots; s++) v->slot_phase[s] = -1;
    for (int32_t k = 0; k < v->nt; k++) {
        const pkv_task *t = &plan->tasks[k];
        if (t->row < 0 || t->row >= v->B) BAD("task %d has row %d outside [0, %d)", k, t->row, v->B);
        if (t->kv_head < 0 || t->kv_head >= v->hkv) BAD("task %d has KV head %d outside [0, %d)", k, t->kv_head, v->hkv);
        if (t->tok_begin < 0 || t->tok_end <= t->tok_begin) BAD("task %d has an empty or negative range", k);
        if (t->tok_end > v->lens[t->row]) BAD("task %d ends at %d past the row's %d tokens", k, t->tok_end, v->lens[t->row]);
        if (t->tok_begin < pkv_row_start(&plan->problem, v->lens[t->row]))
            BAD("task %d starts at %d, before its row's window", k, t->tok_begin);
        if (t->state_slot < -1) BAD("task %d has slot %d", k, t->state_slot);
        if (v->row_base[t->row] != t->page_base)
            BAD("task %d has page_base %d, its row starts at %d", k, t->page_base, v->row_base[t->row]);
        if (t->state_slot >= plan->num_state_slots)
            BAD("task %d slot %d outside [0, %d)", k, t->state_slot, plan->num_state_slots);
        if (t->state_slot >= 0) {
            int32_t ph = phase_of_task(plan, k);
            if (v->slot_phase[t->state_slot] == ph) BAD("slot %d used twice in phase %d", t->state_slot, ph);
            v->slot_phase[t->state_slot] = ph;
        }
        v->keys[k] = (task_key){t->row, t->kv_head, t->tok_begin, k};
    }
    qsort(v->keys, (size_t)v->nt, sizeof *v->keys, cmp_key);
    for (int32_t k = 0; k < v->nt; k++) v->idx[k] = v->keys[k].index;
    return PKV_OK;
}

/* The one merge of a split or empty (row i, KV head h) whose count tasks start at idx[first]: in range,
 * in its tasks' phase, named by its tasks, reading their slots in split order. */
static pkv_status check_merge_of(const vstate *v, int32_t i, int32_t h, int32_t first, int32_t count) {
    const pkv_plan *plan = v->plan;
    const int64_t key = (int64_t)i * v->hkv + h;
    int32_t lo = 0, hi = plan->num_merges; /* the first merge key >= key */
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (v->mkeys[mid].key < key) lo = mid + 1;
        else hi = mid;
    }
    const int32_t found = lo < plan->num_merges && v->mkeys[lo].key == key ? v->mkeys[lo].index : -1;
    if (found >= 0 && lo + 1 < plan->num_merges && v->mkeys[lo + 1].key == key) BAD("row %d head %d merged twice", i, h);
    if (found < 0) BAD("row %d head %d has %d tasks and no merge", i, h, count);
    const pkv_merge *m = &plan->merges[found];
    if (m->count > 0 && (m->first_slot < 0 || m->first_slot + m->count > plan->num_state_slots))
        BAD("merge of row %d head %d reads slots [%d, %d) outside [0, %d)", i, h, m->first_slot,
            m->first_slot + m->count, plan->num_state_slots);
    if (m->count != count) BAD("merge of row %d head %d counts %d states for %d tasks", i, h, m->count, count);
    if (count > 0 && phase_of_merge(plan, found) != phase_of_task(plan, v->idx[first]))
        BAD("merge of row %d head %d is not in its tasks' phase", i, h);
    for (int32_t j = 0; j < count; j++)
        if (plan->tasks[v->idx[first + j]].merge != found)
            BAD("row %d head %d: split %d names merge %d, not %d", i, h, j, plan->tasks[v->idx[first + j]].merge, found);
    for (int32_t j = 0; j < count; j++)
        if (plan->tasks[v->idx[first + j]].state_slot != m->first_slot + j)
            BAD("row %d head %d: split %d writes slot %d, merge expects %d", i, h, j,
                plan->tasks[v->idx[first + j]].state_slot, m->first_slot + j);
    return PKV_OK;
}

/* The merges' keys, sorted (check_merge_of searches them). */
static void sort_merges(const vstate *v) {
    const pkv_plan *plan = v->plan;
    for (int32_t m = 0; m < plan->num_merges; m++) {
        const pkv_merge *x = &plan->merges[m];
        const bool in_range = x->row >= 0 && x->row < v->B && x->kv_head >= 0 && x->kv_head < v->hkv;
        v->mkeys[m] = (merge_key){in_range ? (int64_t)x->row * v->hkv + x->kv_head : -1, m};
    }
    qsort(v->mkeys, (size_t)plan->num_merges, sizeof *v->mkeys, cmp_merge_key);
}

/* Walks (row, KV head) in order over the sorted tasks: every attended token covered exactly once, in
 * one phase; a single task writes no partial state; split and empty pairs have their merge. */
static pkv_status check_coverage(const vstate *v) {
    const pkv_plan *plan = v->plan;
    int32_t k = 0, merges_seen = 0;
    for (int32_t i = 0; i < v->B; i++) {
        for (int32_t h = 0; h < v->hkv; h++) {
            int32_t first = k, at = pkv_row_start(&plan->problem, v->lens[i]);
            while (k < v->nt && plan->tasks[v->idx[k]].row == i && plan->tasks[v->idx[k]].kv_head == h) {
                const pkv_task *t = &plan->tasks[v->idx[k]];
                if (t->tok_begin != at)
                    BAD("row %d head %d: tokens [%d, %d) not covered exactly once", i, h, at,
                        t->tok_begin > at ? t->tok_begin : at);
                at = t->tok_end;
                if (phase_of_task(plan, v->idx[k]) != phase_of_task(plan, v->idx[first]))
                    BAD("row %d head %d spread over two phases", i, h);
                k++;
            }
            if (at != v->lens[i]) BAD("row %d head %d: covered %d of %d tokens", i, h, at, v->lens[i]);
            int32_t count = k - first;
            if (count == 1 && plan->tasks[v->idx[first]].state_slot != -1)
                BAD("row %d head %d has one task but writes a partial state", i, h);
            if (count == 1) continue;
            const pkv_status st = check_merge_of(v, i, h, first, count);
            if (st != PKV_OK) return st;
            merges_seen++;
        }
    }
    if (merges_seen != plan->num_merges) BAD("%d merges listed, %d expected", plan->num_merges, merges_seen);
    return PKV_OK;
}

/* The counters against the lists and the lengths. */
static pkv_status check_counters(const vstate *v) {
    const pkv_plan *plan = v->plan;
    int64_t kv = 0, split_tasks = 0;
    const int64_t es = (int64_t)pkv_kv_elem_size(&plan->problem), d = plan->problem.head_dim; /* K and V bytes */
    for (int32_t j = 0; j < v->nt; j++) {
        kv += (int64_t)(plan->tasks[j].tok_end - plan->tasks[j].tok_begin) * d * es * 2;
        split_tasks += plan->tasks[j].state_slot >= 0;
    }
    int64_t total = 0;
    for (int32_t i = 0; i < v->B; i++) total += v->lens[i] - pkv_row_start(&plan->problem, v->lens[i]);
    if (kv != total * v->hkv * d * es * 2)
        BAD("tasks read %lld KV bytes, lengths need %lld", (long long)kv, (long long)(total * v->hkv * d * es * 2));
    if (plan->counters.kv_bytes != kv) BAD("kv_bytes counter %lld != %lld", (long long)plan->counters.kv_bytes, (long long)kv);
    if (plan->counters.tasks != v->nt) BAD("tasks counter wrong");
    if (plan->counters.merge_state_bytes != 2 * split_tasks * plan->group * (d + 1) * 4) BAD("merge_state_bytes counter wrong");
    return PKV_OK;
}

/* Graph-stable plans: the step fits the fixed grids and the counts the kernels read are the plan's. */
static pkv_status check_graph(const vstate *v) {
    const pkv_plan *plan = v->plan;
    if (plan->graph_tasks <= 0) return PKV_OK;
    const int32_t *counts = (const int32_t *)(const void *)((const char *)plan->blob + plan->off_counts);
    if (plan->route != PKV_ROUTE_WORKQUEUE || plan->num_phases != 1) BAD("graph-stable plan is not one work-queue phase");
    if (v->nt > plan->graph_tasks || plan->num_state_slots > plan->graph_tasks)
        BAD("%d tasks (%d slots) on a grid of %d", v->nt, plan->num_state_slots, plan->graph_tasks);
    if (plan->num_merges > plan->graph_merges) BAD("%d merges on a grid of %d", plan->num_merges, plan->graph_merges);
    if (counts[PKV_COUNTS_TASKS] != v->nt || counts[PKV_COUNTS_MERGES] != plan->num_merges)
        BAD("counts %d, %d in the workspace for %d tasks, %d merges", counts[PKV_COUNTS_TASKS],
            counts[PKV_COUNTS_MERGES], v->nt, plan->num_merges);
    if (counts[PKV_COUNTS_WIDEST] != plan->max_merge_count)
        BAD("widest merge %d in the workspace, the plan's is %d", counts[PKV_COUNTS_WIDEST], plan->max_merge_count);
    for (int w = PKV_COUNTS_MERGES + 1; w < PKV_COUNTS_WORDS; w++)
        if (w != PKV_COUNTS_WIDEST && counts[w] != 0) BAD("work claim word %d is %d, not 0", w, counts[w]);
    if (plan->off_counts + PKV_COUNTS_WORDS * sizeof(int32_t) > plan->blob_bytes || plan->off_state_o < plan->blob_bytes)
        BAD("graph-stable layout broken");
    return PKV_OK;
}

pkv_status pkv_plan_validate(const pkv_plan *plan, const int32_t *seq_lens) {
    if (!plan || (!seq_lens && plan->batch_size > 0))
        return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "plan or seq_lens is NULL");
    vstate v;
    v.plan = plan;
    v.lens = seq_lens;
    v.B = plan->batch_size, v.hkv = plan->problem.num_kv_heads, v.nt = plan->num_tasks;
    v.idx = (int32_t *)malloc(((size_t)v.nt + 1 + (size_t)v.B) * sizeof *v.idx);
    v.row_base = v.idx ? v.idx + v.nt + 1 : NULL;
    v.slot_phase = (int32_t *)malloc(((size_t)plan->num_state_slots + 1) * sizeof *v.slot_phase);
    v.keys = (task_key *)malloc(((size_t)v.nt + 1) * sizeof *v.keys);
    v.mkeys = (merge_key *)malloc(((size_t)plan->num_merges + 1) * sizeof *v.mkeys);
    pkv_status st = !v.idx || !v.slot_phase || !v.keys || !v.mkeys ? bad("out of memory") : PKV_OK;
    if (st == PKV_OK) st = check_rows(&v);
    if (st == PKV_OK) st = check_phases(&v);
    if (st == PKV_OK) st = check_tasks(&v);
    if (st == PKV_OK) sort_merges(&v);
    if (st == PKV_OK) st = check_coverage(&v);
    if (st == PKV_OK) st = check_counters(&v);
    if (st == PKV_OK) st = check_graph(&v);
    free(v.idx);
    free(v.keys);
    free(v.mkeys);
    free(v.slot_phase);
    return st;
}
