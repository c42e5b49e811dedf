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
 *
 * Incremental steps: each emission of the rectangular single / split phase and of the work queue keeps a memo
 * of what its lists came from (per row: planned length, start, page base, chunk, splits, where its first and
 * last split's tasks are; the work queue's tail order).  A next step on the same plan whose every row keeps
 * its chunk, split count, start and - in the work queue - its partial last chunk and the tails' order (rows a
 * few tokens longer or shorter, none crossing a chunk) has the same lists but for the rows' lengths, the last
 * split's ends, a window's first token and changed page bases: those are written over the memo's lists
 * (O(B x Hkv) writes, no sort) and the plan is the one a fresh emission writes, field for field.  Anything
 * else - another route, chunk, S, batch, graph grid or problem shape, a row crossing a chunk - emits afresh.
 */
#include "plan_internal.h"

#include <stdlib.h>
#include <string.h>

/* The work queue's tail groups sorted by insertion up to this many, else by radix, digits of PKV_RADIX_BITS. */
#define PKV_INSERTION_SORT_MAX 64
#define PKV_RADIX_BITS 6

/* The tasks of one split of a row for KV heads 0..hkv-1 into out[0, hkv): head h's state slot slot + h x
 * slot_step, merge merge + h x merge_step.  Two heads' tasks (56 bytes) at a time from four 16-byte vectors
 * that one add each moves on by two heads: four wide stores instead of a store per field. */
#if defined(__GNUC__)
typedef int32_t pkv_v4i __attribute__((vector_size(16)));
static inline void emit_heads(pkv_task *out, int32_t hkv, int32_t row, int32_t tb, int32_t te, int32_t pb, int32_t slot,
                              int32_t slot_step, int32_t merge, int32_t merge_step) {
    int32_t h = 0;
    if (hkv >= 2) {
        pkv_v4i a = {row, 0, tb, te}, b = {pb, slot, merge, row}, c = {1, tb, te, pb};
        pkv_v4i d = {slot + slot_step, merge + merge_step, 0, 0};
        const pkv_v4i da = {0, 2, 0, 0}, db = {0, 2 * slot_step, 2 * merge_step, 0}, dc = {2, 0, 0, 0};
        const pkv_v4i dd = {2 * slot_step, 2 * merge_step, 0, 0};
        char *o = (char *)out;
        for (; h + 2 <= hkv; h += 2, o += 2 * sizeof(pkv_task)) {
            memcpy(o, &a, 16);
            memcpy(o + 16, &b, 16);
            memcpy(o + 32, &c, 16);
            memcpy(o + 48, &d, 8);
            a += da, b += db, c += dc, d += dd;
        }
    }
    for (; h < hkv; h++) {
        const pkv_task t = {row, h, tb, te, pb, slot + h * slot_step, merge + h * merge_step};
        out[h] = t;
    }
}
/* The merges of a split row for KV heads 0..hkv-1 into out[0, hkv): head h's states at slots
 * [slot_base + h x nsplit, + nsplit).  One 16-byte vector per merge, moved on by one add. */
static inline void emit_merges(pkv_merge *out, int32_t hkv, int32_t row, int32_t slot_base, int32_t nsplit) {
    pkv_v4i m = {row, 0, slot_base, nsplit};
    const pkv_v4i dm = {0, 1, nsplit, 0};
    for (int32_t h = 0; h < hkv; h++, m += dm) memcpy(out + h, &m, 16);
}
#else
static inline void emit_heads(pkv_task *out, int32_t hkv, int32_t row, int32_t tb, int32_t te, int32_t pb, int32_t slot,
                              int32_t slot_step, int32_t merge, int32_t merge_step) {
    for (int32_t h = 0; h < hkv; h++) {
        const pkv_task t = {row, h, tb, te, pb, slot + h * slot_step, merge + h * merge_step};
        out[h] = t;
    }
}
static inline void emit_merges(pkv_merge *out, int32_t hkv, int32_t row, int32_t slot_base, int32_t nsplit) {
    for (int32_t h = 0; h < hkv; h++) out[h] = (pkv_merge){row, h, slot_base + h * nsplit, nsplit};
}
#endif

/* Emits the schedule of one row split in nsplit = ceil(n / chunk_tokens) chunks of chunk_tokens: its row
 * record, its tasks (split outer, KV head inner), and merges for split rows.  The row's n tokens are planned
 * from token `start` (under a sliding window the start of the page that holds the window's first token, else
 * 0); its first task starts at the window (row record: tok_begin; the CUDA rect kernels cut the same splits
 * from it, load_task).  The tasks of the row's whole chunks go to full[0 ..), those of a last, partial chunk
 * to tail[0, Hkv): NULL, right after the whole chunks' (the rectangular routes); the work queue puts the
 * tails after every row's whole chunks.  Returns the slots it used. */
static inline int32_t emit_row(pkv_plan *plan, int32_t row, int32_t n, int32_t start, int32_t page_base,
                               int32_t chunk_tokens, int32_t nsplit, int32_t slot_base, pkv_task *full,
                               pkv_task *tail) {
    const int32_t hkv = plan->problem.num_kv_heads;
    const int32_t first = pkv_row_start(&plan->problem, start + n); /* start <= first < start + page_size */
    pkv_row_sched *rs = &plan->rows[plan->num_rows++];
    rs->row = row;
    rs->seq_len = start + n;
    rs->tok_begin = first;
    rs->page_base = page_base;
    rs->chunk_tokens = chunk_tokens;
    rs->num_splits = nsplit;
    const bool split = nsplit > 1;
    rs->slot_base = split ? slot_base : -1;
    const int32_t merge_base = plan->num_merges;
    /* whole chunks: all but a last one that the row's end cuts short */
    const int32_t nfull = (int64_t)nsplit * chunk_tokens > n ? nsplit - 1 : nsplit;
    const int32_t slot_step = split ? nsplit : 0, merge_step = split ? 1 : 0;
    if (!tail) tail = full + (int64_t)nfull * hkv;
    for (int32_t s = 0; s < nsplit; s++) {
        pkv_task *out = s < nfull ? full + (int64_t)s * hkv : tail;
        /* a split before the last ends at a chunk's end ((s + 1) x chunk_tokens < n), the last at the row's */
        const int32_t tb = s > 0 ? start + s * chunk_tokens : first;
        const int32_t te = s + 1 < nsplit ? start + (s + 1) * chunk_tokens : start + n;
        const int32_t slot = split ? slot_base + s : -1, merge = split ? merge_base : -1;
        emit_heads(out, hkv, row, tb, te, page_base, slot, slot_step, merge, merge_step);
    }
    if (split) {
        emit_merges(plan->merges + plan->num_merges, hkv, row, slot_base, nsplit);
        plan->num_merges += hkv;
        if (nsplit > plan->max_merge_count) plan->max_merge_count = nsplit;
    }
    plan->num_tasks += nsplit * hkv;
    return split ? nsplit * hkv : 0;
}

/* Merges of the empty rows among rows[0..nrows) (o = 0, lse = -inf), after the split merges. */
static void emit_empty_merges(pkv_plan *plan, const int32_t *lens, const int32_t *rows, int32_t nrows) {
    for (int32_t k = 0; k < nrows; k++) {
        int32_t i = rows ? rows[k] : k;
        if (lens[i] != 0) continue;
        const int32_t hkv = plan->problem.num_kv_heads;
        pkv_merge *m = plan->merges + plan->num_merges;
        for (int32_t h = 0; h < hkv; h++) m[h] = (pkv_merge){i, h, 0, 0};
        plan->num_merges += hkv;
    }
}

/* ---- the memo of an emission ------------------------------------------------------------------------ */
/* One row of the memo: what its tasks were emitted from, and where its first and last split's head-0 tasks
 * are (the whole chunks' tasks lie together from first_at; with tail set, the last split's lie apart, at
 * last_at). */
typedef struct memo_row {
    int32_t n, start, page_base, chunk, ns;
    int32_t tail;     /* 1: the last split is a work-queue tail, written apart from the whole chunks */
    int32_t first_at; /* the whole chunks' first task (ns - tail > 0) */
    int32_t last_at;  /* the last split's first task (ns > 0) */
} memo_row;
#define PKV_MEMO_ROW_WORDS ((size_t)(sizeof(memo_row) / sizeof(int32_t)))

/* Room for a memo of B rows (rows, then the tail order), or NULL when it cannot be had: the memo is only an
 * optimisation, so that is no error (the step is planned, and the next one is emitted afresh). */
static memo_row *memo_reserve(pkv_plan *plan, int32_t B) {
    const size_t n = (size_t)B * (PKV_MEMO_ROW_WORDS + 1) + 1;
    if (n > plan->memo_cap || !plan->memo) {
        size_t c = plan->memo_cap ? plan->memo_cap : 256;
        while (c < n) c *= 2;
        int32_t *m = (int32_t *)malloc(c * sizeof *m);
        if (!m) return NULL;
        free(plan->memo);
        plan->memo = m;
        plan->memo_cap = c;
    }
    return (memo_row *)(void *)plan->memo;
}
static int32_t *memo_order(pkv_plan *plan, int32_t B) { return plan->memo + (size_t)B * PKV_MEMO_ROW_WORDS; }

/* The memo's header after a fresh emission of kind (splits: S of a rectangular phase; chunk_tokens: the work
 * queue's); the memo is valid only when its rows were recorded. */
static void memo_set(pkv_plan *plan, const plan_step *s, int32_t kind, int32_t splits, int32_t chunk_tokens,
                     int32_t tails, bool recorded) {
    plan->memo_kind = kind;
    plan->memo_route = plan->route;
    plan->memo_batch = s->table->batch_size;
    plan->memo_kv_heads = s->problem->num_kv_heads;
    plan->memo_page_size = s->problem->page_size;
    plan->memo_window = s->problem->window;
    plan->memo_splits = splits;
    plan->memo_chunk_tokens = chunk_tokens;
    plan->memo_graph_cap = s->graph_cap;
    plan->memo_graph_batch = s->graph_cap > 0 ? s->opts->graph_max_batch : 0;
    plan->memo_tails = tails;
    plan->memo_valid = recorded;
}

/* Whether the memo describes lists of this kind, route, batch, problem shape, S or chunk and graph grid. */
static bool memo_matches(const pkv_plan *plan, const plan_step *s, int32_t kind, int32_t splits, int32_t chunk_tokens) {
    const pkv_problem *p = s->problem;
    return plan->memo_valid && plan->memo && plan->memo_kind == kind && plan->memo_route == plan->route &&
           plan->memo_batch == s->table->batch_size && plan->memo_kv_heads == p->num_kv_heads &&
           plan->memo_page_size == p->page_size && plan->memo_window == p->window && plan->memo_splits == splits &&
           plan->memo_chunk_tokens == chunk_tokens && plan->memo_graph_cap == s->graph_cap &&
           plan->memo_graph_batch == (s->graph_cap > 0 ? s->opts->graph_max_batch : 0);
}

/* Writes row i's new planned length n and page base over its lists (its chunk, splits, start and task places
 * are the memo's): the row record, every task's page base when it moved, the last split's end and, under a
 * window, the first split's first token - what emit_row would write differently. */
static inline void patch_row(pkv_plan *plan, memo_row *m, int32_t i, int32_t n, int32_t page_base) {
    const int32_t hkv = plan->problem.num_kv_heads, nwhole = m->ns - m->tail;
    pkv_task *const tasks = plan->tasks;
    pkv_row_sched *rs = &plan->rows[i];
    if (page_base != m->page_base) {
        pkv_task *t = tasks + m->first_at;
        for (int64_t k = 0; k < (int64_t)nwhole * hkv; k++) t[k].page_base = page_base;
        if (m->tail)
            for (int32_t h = 0; h < hkv; h++) tasks[m->last_at + h].page_base = page_base;
        rs->page_base = page_base;
        m->page_base = page_base;
    }
    if (n != m->n) {
        const int32_t end = m->start + n;
        pkv_task *last = tasks + m->last_at;
        for (int32_t h = 0; h < hkv; h++) last[h].tok_end = end;
        rs->seq_len = end;
        m->n = n;
        if (plan->problem.window > 0) { /* the window's first token moved with the end */
            const int32_t first = pkv_row_start(&plan->problem, end);
            pkv_task *t0 = tasks + (nwhole > 0 ? m->first_at : m->last_at);
            for (int32_t h = 0; h < hkv; h++) t0[h].tok_begin = first;
            rs->tok_begin = first;
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

/* Each row's chunk (tokens) and splits under S splits of the rectangular routes (chunk_i =
 * plan_row_chunk_pages pages), into the per-row arrays chunk[] and nsplit[] (indexed by row), and the tasks
 * and merges of rows[0..nrows) (merges: split rows and empty rows) added to *ntasks and *nmerges.  The
 * divisions by per-step constants go through reciprocals (pkv_ceil_div_r). */
static void count_rect(const plan_params *pp, const pkv_problem *p, const int32_t *lens, const int32_t *rows,
                       int32_t nrows, int32_t S, int32_t *chunk, int32_t *nsplit, int64_t *ntasks, int64_t *nmerges) {
    const int32_t hkv = p->num_kv_heads, ps = p->page_size;
    const double inv_ps = 1.0 / ps, inv_S = 1.0 / S;
    int64_t tasks = 0, merges = 0;
    for (int32_t k = 0; k < nrows; k++) {
        const int32_t i = rows[k], n = lens[i], pages = pkv_ceil_div_r(n, ps, inv_ps);
        int32_t cp, ns;
        if (pages == 0) {
            cp = 1, ns = 0; /* plan_row_chunk_pages' chunk of an empty row */
        } else if (S == 1) {
            cp = pages, ns = 1;
        } else {
            cp = pkv_ceil_div_r(pages, S, inv_S);
            if (cp < pp->min_chunk_pages) cp = pp->min_chunk_pages;
            if (cp > pages) cp = pages;
            ns = (int32_t)(((uint32_t)pages + (uint32_t)cp - 1u) / (uint32_t)cp);
        }
        chunk[i] = cp * ps;
        nsplit[i] = ns;
        tasks += ns;
        merges += ns != 1;
    }
    *ntasks += tasks * hkv;
    *nmerges += merges * hkv;
}

/* One rectangular phase (single / split / a bucket) over the given rows, their chunks and splits from
 * count_rect; returns the slots it used. */
static int32_t emit_rect_phase(pkv_plan *plan, const pkv_page_table *t, const int32_t *starts, const int32_t *rows,
                               int32_t nrows, int32_t S, const int32_t *chunk, const int32_t *nsplit, memo_row *memo) {
    begin_phase(plan, S);
    const int32_t hkv = plan->problem.num_kv_heads;
    int32_t slots = 0;
    for (int32_t k = 0; k < nrows; k++) {
        const int32_t i = rows[k], at = plan->num_tasks, start = starts ? starts[i] : 0;
        slots += emit_row(plan, i, t->seq_lens[i], start, t->kv_indptr[i], chunk[i], nsplit[i], slots,
                          plan->tasks + at, NULL);
        if (memo) /* rows[k] = k: the memo is indexed by row */
            memo[i] = (memo_row){t->seq_lens[i], start,    t->kv_indptr[i], chunk[i], nsplit[i],
                                 0,              at,       at + (nsplit[i] > 0 ? (nsplit[i] - 1) * hkv : 0)};
    }
    emit_empty_merges(plan, t->seq_lens, rows, nrows);
    end_phase(plan);
    return slots;
}

pkv_status plan_emit_rect(const plan_step *s, const plan_params *pp, pkv_plan *plan) {
    const int32_t B = s->table->batch_size;
    const int32_t *lens = s->table->seq_lens;
    /* scratch: [row order: B | chunk: B | splits: B] */
    pkv_status st = plan_scratch_reserve(s->ctx, plan, 3 * (size_t)B);
    if (st != PKV_OK) return st;
    int32_t *order = plan->scratch, *chunk = order + B, *nsplit = chunk + B;
    for (int32_t i = 0; i < B; i++) order[i] = i;
    /* the step's tallies (pp) are those of all its rows */
    const int32_t S = plan->route == PKV_ROUTE_SINGLE ? 1 : plan_choose_splits(pp, s->problem, lens, NULL, B);
    int64_t ntasks = 0, nmerges = 0;
    count_rect(pp, s->problem, lens, order, B, S, chunk, nsplit, &ntasks, &nmerges);
    if (memo_matches(plan, s, PKV_MEMO_RECT, S, 0)) { /* the same lists but for lengths and page bases? */
        memo_row *m = (memo_row *)(void *)plan->memo;
        int32_t i = 0;
        for (; i < B; i++) {
            const int32_t start = s->row_starts ? s->row_starts[i] : 0;
            if (m[i].ns != nsplit[i] || m[i].chunk != chunk[i] || m[i].start != start) break;
            patch_row(plan, &m[i], i, lens[i], s->table->kv_indptr[i]);
        }
        if (i == B) {
            plan->last_patched = true;
            return PKV_OK;
        }
    }
    plan->memo_valid = false; /* from here the lists are written afresh */
    st = plan_reserve(s->ctx, plan, ntasks, B, nmerges, 1, false);
    if (st != PKV_OK) return st;
    memo_row *memo = memo_reserve(plan, B);
    plan->num_state_slots = emit_rect_phase(plan, s->table, s->row_starts, order, B, S, chunk, nsplit, memo);
    memo_set(plan, s, PKV_MEMO_RECT, S, 0, 0, memo != NULL);
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
    /* scratch: [row order: B | chunk: B | splits: B] */
    pkv_status st = plan_scratch_reserve(s->ctx, plan, 3 * (size_t)B);
    if (st != PKV_OK) return st;
    int32_t *order = plan->scratch, *chunk = order + B, *nsplit = chunk + B;
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
        count_rect(&pp, s->problem, lens, order + starts[b], counts[b], Sb[b], chunk, nsplit, &ntasks, &nmerges);
    }
    plan->memo_valid = false; /* bucketed plans keep no memo: a row changes bucket at each power of two */
    st = plan_reserve(s->ctx, plan, ntasks, B, nmerges, nb, false);
    if (st != PKV_OK) return st;
    int32_t slots = 0;
    for (int b = 0; b < PKV_LENGTH_BUCKETS; b++) {
        if (!counts[b]) continue;
        const int32_t used =
            emit_rect_phase(plan, s->table, s->row_starts, order + starts[b], counts[b], Sb[b], chunk, nsplit, NULL);
        if (used > slots) slots = used; /* buckets run in sequence: slots are reused */
    }
    plan->num_state_slots = slots;
    return PKV_OK;
}

/* Sorts the work queue's tail keys, (INT32_MAX - length) << 32 | row, built in row order: ascending keys are
 * longest first, then row order.  Insertion sort for a few; else a stable radix sort (least significant digit
 * first, digits of PKV_RADIX_BITS) over the bits of the length part that differ among the keys, which the
 * row order of the input leaves ordered by row within a length.  tmp: room for n keys. */
static void sort_tail_keys(uint64_t *v, uint64_t *tmp, int32_t n) {
    if (n <= PKV_INSERTION_SORT_MAX) {
        for (int32_t i = 1; i < n; i++) {
            const uint64_t x = v[i];
            int32_t j = i - 1;
            while (j >= 0 && v[j] > x) {
                v[j + 1] = v[j];
                j--;
            }
            v[j + 1] = x;
        }
        return;
    }
    uint32_t any = 0, all = ~0u;
    for (int32_t i = 0; i < n; i++) {
        any |= (uint32_t)(v[i] >> 32);
        all &= (uint32_t)(v[i] >> 32);
    }
    uint32_t differ = any ^ all;
    int lo = 0;
    while (differ && !(differ & 1u)) differ >>= 1, lo++;
    uint64_t *src = v, *dst = tmp;
    enum { DIGITS = 1 << PKV_RADIX_BITS };
    for (int shift = 32 + lo; differ; shift += PKV_RADIX_BITS, differ >>= PKV_RADIX_BITS) {
        int32_t at[DIGITS + 1] = {0};
        for (int32_t i = 0; i < n; i++) at[((src[i] >> shift) & (DIGITS - 1)) + 1]++;
        for (int d = 0; d < DIGITS; d++) at[d + 1] += at[d];
        for (int32_t i = 0; i < n; i++) dst[at[(src[i] >> shift) & (DIGITS - 1)]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != v) memcpy(v, src, (size_t)n * sizeof *v);
}

/* A work-queue step over the memo's lists: when the tails, in the memo's order, are still longest first (ties
 * in row order) and every row keeps its splits, start and partial last chunk, patches each row (patch_row) and
 * returns true; else false, and the caller emits afresh (over a part of the rows patched: every list is
 * rewritten). */
static bool workqueue_patch(pkv_plan *plan, const plan_step *s, const int32_t *nsplit, const int32_t *tails_of) {
    const int32_t B = s->table->batch_size;
    const int32_t *order = memo_order(plan, B);
    uint64_t prev = 0;
    for (int32_t g = 0; g < plan->memo_tails; g++) {
        const int32_t r = order[g], t = tails_of[r];
        const uint64_t key = ((uint64_t)(uint32_t)(INT32_MAX - t) << 32) | (uint32_t)r;
        if (t == 0 || (g > 0 && key <= prev)) return false;
        prev = key;
    }
    memo_row *m = (memo_row *)(void *)plan->memo;
    const int32_t *lens = s->table->seq_lens, *indptr = s->table->kv_indptr;
    for (int32_t i = 0; i < B; i++) {
        const int32_t start = s->row_starts ? s->row_starts[i] : 0;
        if (m[i].ns != nsplit[i] || m[i].tail != (tails_of[i] != 0) || m[i].start != start) return false;
        patch_row(plan, &m[i], i, lens[i], indptr[i]);
    }
    return true;
}

/* The work queue: one chunk size for the whole step, its tasks ordered whole chunks first (in row order),
 * then the rows' last, partial chunks longest first (ties in row order; a row's Hkv tail tasks together, in
 * head order: the order of sorting the tail tasks by length, row, head).  Each row's tasks are written where
 * that order puts them, so no pass moves them afterwards. */
pkv_status plan_emit_workqueue(const plan_step *s, const plan_params *pp, int32_t wq_chunk, pkv_plan *plan) {
    const pkv_problem *problem = s->problem;
    const int32_t B = s->table->batch_size, hkv = problem->num_kv_heads;
    const int32_t *lens = s->table->seq_lens;
    const int32_t c = wq_chunk > 0 ? wq_chunk : plan_workqueue_chunk(pp, problem, lens, B);
    const int32_t chunk_tokens = c * problem->page_size;
    /* scratch (int32 units): [tail keys: B uint64 | the sort's room: B uint64 | tail ranks: B | splits: B |
     * tails: B] */
    pkv_status st = plan_scratch_reserve(s->ctx, plan, 7 * (size_t)B + 2);
    if (st != PKV_OK) return st;
    uint64_t *keys = (uint64_t *)(void *)plan->scratch, *tmp = keys + B;
    int32_t *rank = (int32_t *)(void *)(tmp + B), *nsplit = rank + B, *tails_of = nsplit + B;
    /* each row's chunks (divisions by the step's chunk through its reciprocal), the tasks and merges, and a
     * key for each row whose last chunk is partial */
    const double inv_ct = 1.0 / chunk_tokens;
    int64_t nsum = 0, nfull = 0, nsplit_rows = 0;
    int32_t ngroups = 0;
    for (int32_t i = 0; i < B; i++) {
        const int32_t n = lens[i], ns = pkv_ceil_div_r(n, chunk_tokens, inv_ct);
        const int32_t tail = n - (int32_t)((int64_t)pkv_floor_div_r(n, inv_ct) * chunk_tokens);
        nsplit[i] = ns;
        tails_of[i] = tail;
        rank[i] = -1; /* no partial chunk */
        nsum += ns;
        nfull += ns - (tail != 0);
        nsplit_rows += ns > 1;
        if (tail) keys[ngroups++] = ((uint64_t)(uint32_t)(INT32_MAX - tail) << 32) | (uint32_t)i;
    }
    const int64_t ntasks = nsum * hkv, nmerges = (B - pp->nonempty + nsplit_rows) * hkv;
    if (s->graph_cap > 0 && ntasks > s->graph_cap)
        return pkv_fail(s->ctx, PKV_ERR_INVALID_ARGUMENT,
                        "this step needs %lld tasks, above the graph-stable plan's %d (raise graph_tasks, or "
                        "leave chunk_pages to the planner)",
                        (long long)ntasks, s->graph_cap);
    if (memo_matches(plan, s, PKV_MEMO_WORKQUEUE, 0, chunk_tokens) && plan->memo_tails == ngroups &&
        workqueue_patch(plan, s, nsplit, tails_of)) {
        plan->last_patched = true;
        return PKV_OK;
    }
    plan->memo_valid = false; /* from here the lists are written afresh */
    if (s->graph_cap > 0) { /* the layout of the largest step: the same offsets and workspace for every step */
        const int32_t gm = s->opts->graph_max_batch;
        st = plan_reserve(s->ctx, plan, s->graph_cap, gm, (int64_t)gm * hkv, 1, true);
    } else {
        st = plan_reserve(s->ctx, plan, ntasks, B, nmerges, 1, false);
    }
    if (st != PKV_OK) return st;
    sort_tail_keys(keys, tmp, ngroups);
    memo_row *memo = memo_reserve(plan, B);
    int32_t *order = memo ? memo_order(plan, B) : NULL;
    for (int32_t g = 0; g < ngroups; g++) {
        rank[(uint32_t)keys[g]] = g;
        if (order) order[g] = (int32_t)(uint32_t)keys[g];
    }
    begin_phase(plan, 0);
    pkv_task *const tasks = plan->tasks, *full = tasks, *tails = tasks + nfull * hkv;
    int32_t slots = 0;
    for (int32_t i = 0; i < B; i++) {
        const int32_t ns = nsplit[i], r = rank[i], start = s->row_starts ? s->row_starts[i] : 0;
        pkv_task *tail = r >= 0 ? tails + (int64_t)r * hkv : NULL;
        slots += emit_row(plan, i, lens[i], start, s->table->kv_indptr[i], chunk_tokens, ns, slots, full, tail);
        if (memo) {
            const int32_t first_at = (int32_t)(full - tasks);
            const int32_t last_at = tail ? (int32_t)(tail - tasks) : first_at + (ns > 0 ? (ns - 1) * hkv : 0);
            memo[i] = (memo_row){lens[i], start, s->table->kv_indptr[i], chunk_tokens, ns, r >= 0, first_at, last_at};
        }
        full += (int64_t)(ns - (r >= 0)) * hkv;
    }
    emit_empty_merges(plan, lens, NULL, B);
    end_phase(plan);
    plan->num_state_slots = slots;
    memo_set(plan, s, PKV_MEMO_WORKQUEUE, 0, chunk_tokens, ngroups, memo != NULL);
    return PKV_OK;
}

/* The counters from the row records and phases: a row's tasks cover its attended tokens [tok_begin, seq_len)
 * once per KV head, and those of a row split in more than one part each write a partial state (emit_row), so
 * nothing here walks the task list. */
void plan_compute_counters(pkv_plan *plan) {
    const pkv_problem *p = &plan->problem;
    pkv_counters *c = &plan->counters;
    memset(c, 0, sizeof *c);
    /* q and o in dtype, K and V in the cache's element type (fp8: one byte) */
    const int64_t es = (int64_t)pkv_dtype_size(p->dtype), kv_es = (int64_t)pkv_kv_elem_size(p);
    const int64_t d = p->head_dim, hkv = p->num_kv_heads;
    int64_t tokens = 0, split_rows_tasks = 0, split_rows = 0;
    for (int32_t k = 0; k < plan->num_rows; k++) {
        const pkv_row_sched *rs = &plan->rows[k];
        tokens += rs->seq_len - rs->tok_begin;
        split_rows_tasks += rs->num_splits > 1 ? rs->num_splits : 0;
        split_rows += rs->num_splits > 1;
    }
    const int64_t split_tasks = split_rows_tasks * hkv;
    c->total_tokens = tokens;
    c->kv_bytes = tokens * hkv * d * kv_es * 2; /* K and V */
    c->tasks = plan->num_tasks;
    c->merges = plan->num_merges;
    c->qo_bytes = (int64_t)plan->batch_size * p->num_qo_heads * (d * es * 2 + 4); /* q, o and the fp32 lse */
    c->merge_state_bytes = 2 * split_tasks * plan->group * (d + 1) * 4; /* fp32 states written, read back */
    /* a phase launches its task kernel when it has tasks and its merge kernel when it has merges */
    for (int32_t k = 0; k < plan->num_phases; k++) {
        const pkv_phase *ph = &plan->phases[k];
        if (plan->route == PKV_ROUTE_FUSED) { /* tasks and merges in one launch */
            /* the empty rows' merges: a fused plan has one phase, and its merges are the split rows' and the
             * empty rows', one per KV head each */
            const int64_t empties = (int64_t)(ph->merge_end - ph->merge_begin) - split_rows * hkv;
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
