/* validate.c - checks a plan against the lengths it was made for: every token of every
 * (row, KV head) covered exactly once, partial-state slots unique within a phase, merges that match
 * the split tasks in slot order, empty rows merged as empty, counters that match the lists. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first violation: its message as the thread's last error (pkv_last_error). */
#define BAD(...)                                                  \
    do {                                                          \
        pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, __VA_ARGS__);    \
        free(idx);                                                \
        free(keys);                                               \
        free(slot_phase);                                         \
        return PKV_ERR_INVALID_ARGUMENT;                          \
    } while (0)

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

pkv_status pkv_plan_validate(const pkv_plan *plan, const int32_t *seq_lens) {
    int32_t *idx = NULL, *slot_phase = NULL;
    task_key *keys = NULL;
    if (!plan || (!seq_lens && plan->batch_size > 0))
        return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "plan or seq_lens is NULL");
    const int32_t B = plan->batch_size, hkv = plan->problem.num_kv_heads, nt = plan->num_tasks;
    idx = (int32_t *)malloc(((size_t)nt + 1 + (size_t)B) * sizeof *idx);
    int32_t *row_base = idx ? idx + nt + 1 : NULL; /* page_base of each row, from the plan's rows */
    slot_phase = (int32_t *)malloc(((size_t)plan->num_state_slots + 1) * sizeof *slot_phase);
    keys = (task_key *)malloc(((size_t)nt + 1) * sizeof *keys);
    if (!idx || !slot_phase || !keys) BAD("out of memory");
    for (int32_t s = 0; s < plan->num_state_slots; s++) slot_phase[s] = -1;
    for (int32_t i = 0; i < B; i++) row_base[i] = -1;
    if (plan->num_rows != B) BAD("plan lists %d rows for a batch of %d", plan->num_rows, B);
    for (int32_t r = 0; r < plan->num_rows; r++) {
        const pkv_row_sched *rs = &plan->rows[r];
        if (rs->row < 0 || rs->row >= B || row_base[rs->row] != -1) BAD("row record %d names row %d twice or out of range", r, rs->row);
        row_base[rs->row] = rs->page_base;
        if (rs->seq_len != seq_lens[rs->row] || rs->tok_begin != pkv_row_start(&plan->problem, seq_lens[rs->row]))
            BAD("row record %d: tokens [%d, %d), the row attends to [%d, %d)", r, rs->tok_begin, rs->seq_len,
                pkv_row_start(&plan->problem, seq_lens[rs->row]), seq_lens[rs->row]);
    }

    /* phases tile the task and merge lists in order */
    int32_t tb = 0, mb = 0;
    for (int32_t i = 0; i < plan->num_phases; i++) {
        const pkv_phase *ph = &plan->phases[i];
        if (ph->task_begin != tb || ph->task_end < ph->task_begin) BAD("phase %d task range broken", i);
        if (ph->merge_begin != mb || ph->merge_end < ph->merge_begin) BAD("phase %d merge range broken", i);
        tb = ph->task_end;
        mb = ph->merge_end;
    }
    if (tb != nt || mb != plan->num_merges) BAD("phases do not cover the task and merge lists");

    for (int32_t k = 0; k < nt; k++) {
        const pkv_task *t = &plan->tasks[k];
        if (t->row < 0 || t->row >= B) BAD("task %d has row %d outside [0, %d)", k, t->row, B);
        if (t->kv_head < 0 || t->kv_head >= hkv) BAD("task %d has KV head %d outside [0, %d)", k, t->kv_head, hkv);
        if (t->tok_begin < 0 || t->tok_end <= t->tok_begin) BAD("task %d has an empty or negative range", k);
        if (t->tok_end > seq_lens[t->row]) BAD("task %d ends at %d past the row's %d tokens", k, t->tok_end, seq_lens[t->row]);
        if (t->tok_begin < pkv_row_start(&plan->problem, seq_lens[t->row]))
            BAD("task %d starts at %d, before its row's window", k, t->tok_begin);
        if (t->state_slot < -1) BAD("task %d has slot %d", k, t->state_slot);
        if (row_base[t->row] != t->page_base)
            BAD("task %d has page_base %d, its row starts at %d", k, t->page_base, row_base[t->row]);
        if (t->state_slot >= plan->num_state_slots) BAD("task %d slot %d outside [0, %d)", k, t->state_slot, plan->num_state_slots);
        if (t->state_slot >= 0) {
            int32_t ph = phase_of_task(plan, k);
            if (slot_phase[t->state_slot] == ph) BAD("slot %d used twice in phase %d", t->state_slot, ph);
            slot_phase[t->state_slot] = ph;
        }
        keys[k] = (task_key){t->row, t->kv_head, t->tok_begin, k};
    }
    qsort(keys, (size_t)nt, sizeof *keys, cmp_key);
    for (int32_t k = 0; k < nt; k++) idx[k] = keys[k].index;

    /* walk (row, head) in order: coverage, slots and merges */
    int32_t k = 0, merges_seen = 0;
    for (int32_t i = 0; i < B; i++) {
        for (int32_t h = 0; h < hkv; h++) {
            int32_t first = k, at = pkv_row_start(&plan->problem, seq_lens[i]);
            while (k < nt && plan->tasks[idx[k]].row == i && plan->tasks[idx[k]].kv_head == h) {
                const pkv_task *t = &plan->tasks[idx[k]];
                if (t->tok_begin != at) BAD("row %d head %d: tokens [%d, %d) not covered exactly once", i, h, at, t->tok_begin > at ? t->tok_begin : at);
                at = t->tok_end;
                if (phase_of_task(plan, idx[k]) != phase_of_task(plan, idx[first]))
                    BAD("row %d head %d spread over two phases", i, h);
                k++;
            }
            if (at != seq_lens[i]) BAD("row %d head %d: covered %d of %d tokens", i, h, at, seq_lens[i]);
            int32_t count = k - first;
            if (count == 1 && plan->tasks[idx[first]].state_slot != -1)
                BAD("row %d head %d has one task but writes a partial state", i, h);
            if (count == 1) continue;
            /* split or empty: exactly one merge */
            int32_t found = -1;
            for (int32_t m = 0; m < plan->num_merges; m++)
                if (plan->merges[m].row == i && plan->merges[m].kv_head == h) {
                    if (found >= 0) BAD("row %d head %d merged twice", i, h);
                    found = m;
                }
            if (found < 0) BAD("row %d head %d has %d tasks and no merge", i, h, count);
            merges_seen++;
            const pkv_merge *m = &plan->merges[found];
            if (m->count > 0 && (m->first_slot < 0 || m->first_slot + m->count > plan->num_state_slots))
                BAD("merge of row %d head %d reads slots [%d, %d) outside [0, %d)", i, h, m->first_slot,
                    m->first_slot + m->count, plan->num_state_slots);
            if (m->count != count) BAD("merge of row %d head %d counts %d states for %d tasks", i, h, m->count, count);
            if (count > 0 && phase_of_merge(plan, found) != phase_of_task(plan, idx[first]))
                BAD("merge of row %d head %d is not in its tasks' phase", i, h);
            for (int32_t j = 0; j < count; j++)
                if (plan->tasks[idx[first + j]].merge != found)
                    BAD("row %d head %d: split %d names merge %d, not %d", i, h, j, plan->tasks[idx[first + j]].merge, found);
            for (int32_t j = 0; j < count; j++)
                if (plan->tasks[idx[first + j]].state_slot != m->first_slot + j)
                    BAD("row %d head %d: split %d writes slot %d, merge expects %d", i, h, j,
                        plan->tasks[idx[first + j]].state_slot, m->first_slot + j);
        }
    }
    if (merges_seen != plan->num_merges) BAD("%d merges listed, %d expected", plan->num_merges, merges_seen);

    /* counters */
    int64_t kv = 0, split_tasks = 0;
    const int64_t es = (int64_t)pkv_dtype_size(plan->problem.dtype), d = plan->problem.head_dim;
    for (int32_t j = 0; j < nt; j++) {
        kv += (int64_t)(plan->tasks[j].tok_end - plan->tasks[j].tok_begin) * d * es * 2;
        split_tasks += plan->tasks[j].state_slot >= 0;
    }
    int64_t total = 0;
    for (int32_t i = 0; i < B; i++) total += seq_lens[i] - pkv_row_start(&plan->problem, seq_lens[i]);
    if (kv != total * hkv * d * es * 2) BAD("tasks read %lld KV bytes, lengths need %lld", (long long)kv, (long long)(total * hkv * d * es * 2));
    if (plan->counters.kv_bytes != kv) BAD("kv_bytes counter %lld != %lld", (long long)plan->counters.kv_bytes, (long long)kv);
    if (plan->counters.tasks != nt) BAD("tasks counter wrong");
    if (plan->counters.merge_state_bytes != 2 * split_tasks * plan->group * (d + 1) * 4) BAD("merge_state_bytes counter wrong");
    if (plan->graph_tasks > 0) {
        /* graph-stable: the step fits the fixed grids and the counts the kernels read are the plan's */
        const int32_t *counts = (const int32_t *)(const void *)((const char *)plan->blob + plan->off_counts);
        if (plan->route != PKV_ROUTE_WORKQUEUE || plan->num_phases != 1) BAD("graph-stable plan is not one work-queue phase");
        if (nt > plan->graph_tasks || plan->num_state_slots > plan->graph_tasks)
            BAD("%d tasks (%d slots) on a grid of %d", nt, plan->num_state_slots, plan->graph_tasks);
        if (plan->num_merges > plan->graph_merges) BAD("%d merges on a grid of %d", plan->num_merges, plan->graph_merges);
        if (counts[PKV_COUNTS_TASKS] != nt || counts[PKV_COUNTS_MERGES] != plan->num_merges)
            BAD("counts %d, %d in the workspace for %d tasks, %d merges", counts[PKV_COUNTS_TASKS],
                counts[PKV_COUNTS_MERGES], nt, plan->num_merges);
        if (counts[PKV_COUNTS_WIDEST] != plan->max_merge_count)
            BAD("widest merge %d in the workspace, the plan's is %d", counts[PKV_COUNTS_WIDEST], plan->max_merge_count);
        for (int w = PKV_COUNTS_MERGES + 1; w < PKV_COUNTS_WORDS; w++)
            if (w != PKV_COUNTS_WIDEST && counts[w] != 0) BAD("work claim word %d is %d, not 0", w, counts[w]);
        if (plan->off_counts + PKV_COUNTS_WORDS * sizeof(int32_t) > plan->blob_bytes || plan->off_state_o < plan->blob_bytes)
            BAD("graph-stable layout broken");
    }
    free(idx);
    free(keys);
    free(slot_phase);
    return PKV_OK;
}
