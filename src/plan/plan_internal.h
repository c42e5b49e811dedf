/* plan_internal.h - what the planner's files share (not installed).
 *
 *   planner.c  the public entry points: pkv_plan_step and its host and capabilities variants, the
 *              workspace bound, the read-only views, options and route names; plan_impl, the step's
 *              sequence of named steps
 *   params.c   the step's parameters: the wave P from the backend's capabilities, the split count
 *              S, the chunk sizes, a sliding window's row lengths
 *   policy.c   route choice: the auto rule, the candidate routes' cost terms in one O(B) pass and the
 *              cost-model comparison
 *   emit.c     plan emission per route: rectangular (single, split), bucketed, work queue (fused and
 *              graph-stable too); the counters
 *   layout.c   storage: the blob and workspace layouts, growing the plan's buffers, the workspace bound,
 *              graph-stable capacity and signature
 */
#ifndef PKV_PLAN_INTERNAL_H
#define PKV_PLAN_INTERNAL_H

#include "internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- named constants of the rules ------------------------------------------------------------- */
#define PKV_DEFAULT_MIN_CHUNK_TOKENS 128 /* the smallest split worth making (min_chunk_tokens <= 0) */
#define PKV_DEFAULT_MAX_SPLITS 256       /* splits of one (row, KV head) (max_splits <= 0) */
#define PKV_HOST_CTAS_PER_UNIT 2         /* host plans: tasks per unit of the wave, and resident */
/* A batch is ragged when its longest row is above RAGGED_NUM / RAGGED_DEN of the mean of its non-empty
 * rows (5 / 4: 1.25 x the mean). */
#define PKV_RAGGED_NUM 5
#define PKV_RAGGED_DEN 4
/* Ragged batches of at least this many (row, KV head) pairs get PKV_RAGGED_WAVES waves of the resident
 * tasks, so that more, smaller tasks let the hardware scheduler even out the load. */
#define PKV_RAGGED_MANY_PAIRS 128
#define PKV_RAGGED_WAVES 4
/* A kernel of small tiles: at least this many resident CTAs per unit; ragged batches of at least
 * PKV_SMALL_TILE_MIN_PAIRS pairs (and fewer than PKV_RAGGED_MANY_PAIRS) then get one wave of them all. */
#define PKV_SMALL_TILE_RESIDENT 4
#define PKV_SMALL_TILE_MIN_PAIRS 32
/* An even batch over one wave: each pair split 1..PKV_EVEN_MAX_SPLIT ways, a larger split kept only when
 * its last wave is fuller by more than 1 / PKV_EVEN_FULLER_DIV (5%). */
#define PKV_EVEN_MAX_SPLIT 4
#define PKV_EVEN_FULLER_DIV 20
/* The auto rule sends one non-empty row of at least this many tokens to the work queue. */
#define PKV_AUTO_LONG_ROW_TOKENS 4096
/* Bucketed route: bucket floor(log2(N)) + 1 of a row of N tokens, 0 when empty - 0..32 for int32
 * lengths; the arrays and the workspace bound count PKV_LENGTH_BUCKETS (one spare). */
#define PKV_LENGTH_BUCKETS 34
/* Graph-stable plans: the largest task grid, 2^24 CTAs (a batch of PKV_MAX_BATCH rows over 16 KV heads; the
 * plan's task list alone is some 0.5 GB there, and the int32 arithmetic of grid and slots stays far from
 * overflow). */
#define PKV_GRAPH_MAX_TASKS (1 << 24)
/* Candidate waves of the cost-model comparison: the planner's wave and one wave of the resident slots. */
#define PKV_MAX_WAVE_CANDIDATES 2

static inline size_t pkv_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static inline int64_t pkv_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Pages of a row of n tokens.  32-bit division: n >= 0 and n + page_size < 2^32 (validated), and this runs
 * per row. */
static inline int32_t pkv_row_pages(const pkv_problem *p, int32_t n) {
    return (int32_t)(((uint32_t)n + (uint32_t)p->page_size - 1u) / (uint32_t)p->page_size);
}
/* ceil(n / c) and floor(n / c) for 0 <= n < 2^31 and 1 <= c < 2^31 through inv_c = 1.0 / c, for the per-row
 * passes that divide by one per-step constant: exact, since the quotient's distance from an integer (at least
 * 0.5 / c) is far above the double product's rounding error (below n / c x 2^-51). */
static inline int32_t pkv_ceil_div_r(int32_t n, int32_t c, double inv_c) {
    return (int32_t)(((double)n + ((double)c - 0.5)) * inv_c);
}
static inline int32_t pkv_floor_div_r(int32_t n, double inv_c) { return (int32_t)(((double)n + 0.5) * inv_c); }
/* The first token of the page that holds token tok. */
static inline int32_t pkv_page_floor(const pkv_problem *p, int32_t tok) { return tok - tok % p->page_size; }

/* ---- params.c: the step's parameters ---------------------------------------------------------- */
typedef struct plan_params {
    int64_t P;             /* tasks in one wave */
    int32_t min_chunk_pages;
    int32_t max_splits;
    int32_t forced_splits; /* > 0: S given */
    int32_t forced_chunk;  /* > 0: workqueue chunk given (pages) */
    int64_t nonempty, total, max_len; /* the step's rows: non-empty ones, tokens, longest */
    int64_t min_len;       /* the shortest non-empty row */
    bool ragged;           /* longest row > PKV_RAGGED_NUM / PKV_RAGGED_DEN x the mean of the non-empty ones */
    int64_t slots;         /* resident task slots: parallelism x resident CTAs per unit */
    int64_t P_bucketed;    /* > 0: the wave of the bucketed route where it differs from P */
} plan_params;

/* What the planner takes from the backend's capabilities for one problem (plan_caps_for). */
typedef struct plan_caps {
    int32_t parallelism;  /* units (caps; the options may override it) */
    int32_t per_unit;     /* the wave's default tasks per unit */
    int32_t resident;     /* resident CTAs per unit of the problem's kernel family (d <= 128 light kernel) */
    int32_t resident_x;   /* the exact residency of the kernel that runs the problem */
    bool row_gathered;    /* the backend gathers this problem's pages row by row */
} plan_caps;

plan_caps plan_caps_for(const pkv_backend_caps *caps, const pkv_problem *p);
int64_t plan_resident_slots(int64_t parallelism, int64_t per_unit, int64_t resident, int64_t resident_x);
void plan_resolve_params(const pkv_plan_options *opts, int32_t parallelism, const plan_caps *pc,
                         const pkv_problem *problem, const pkv_page_table *table, plan_params *pp);
int32_t plan_choose_splits(const plan_params *pp, const pkv_problem *p, const int32_t *lens, const int32_t *rows,
                           int32_t nrows);
int32_t plan_row_chunk_pages(const plan_params *pp, int32_t pages, int32_t S);
int32_t plan_workqueue_chunk(const plan_params *pp, const pkv_problem *p, const int32_t *lens, int32_t B);
void plan_window_lengths(const pkv_problem *p, const pkv_page_table *t, int32_t *lens, int32_t *starts);

/* ---- policy.c: route choice ------------------------------------------------------------------- */
pkv_route plan_auto_rule(const plan_params *pp, const pkv_problem *p);
/* Auto with a cost model: the route of lowest predicted time; may change pp->P to the wave it was
 * weighed at, and sets *wq_chunk (pages) when it searched the work queue's chunk. */
pkv_route plan_policy_choose(const pkv_cost_model *model, const pkv_plan_options *opts, int32_t parallelism,
                             const plan_caps *pc, const pkv_problem *problem, const int32_t *lens, int32_t B,
                             plan_params *pp, int32_t *wq_chunk);

/* ---- emit.c: plan emission -------------------------------------------------------------------- */
/* The step as emit sees it: lengths are a sliding window's attended tokens (from row_starts). */
typedef struct plan_step {
    pkv_context *ctx;           /* for errors; may be NULL */
    const pkv_problem *problem;
    const pkv_page_table *table; /* seq_lens: the planned lengths */
    const int32_t *row_starts;   /* a sliding window's page-aligned row starts; NULL: 0 */
    const pkv_plan_options *opts;
    int32_t graph_cap;           /* > 0: graph-stable, the task grid */
} plan_step;

pkv_status plan_emit_rect(const plan_step *s, const plan_params *pp, pkv_plan *plan);
pkv_status plan_emit_bucketed(const plan_step *s, const plan_params *pp, pkv_plan *plan);
pkv_status plan_emit_workqueue(const plan_step *s, const plan_params *pp, int32_t wq_chunk, pkv_plan *plan);
void plan_compute_counters(pkv_plan *plan);

/* ---- layout.c: storage ------------------------------------------------------------------------ */
size_t plan_blob_layout(int64_t ntasks, int64_t nrows, int64_t nmerges, bool counts, size_t *off_rows,
                        size_t *off_merges, size_t *off_counts);
size_t plan_states_layout(size_t blob_bytes, int64_t slots, int64_t group, int64_t head_dim, size_t *off_o,
                          size_t *off_ml);
pkv_status plan_reserve(pkv_context *ctx, pkv_plan *plan, int64_t ntasks, int64_t nrows, int64_t nmerges,
                        int64_t nphases, bool counts);
/* Makes plan->blob one that no pending upload reads (a backend's blobs, pkv_blob_ops): the current one when its
 * uploads have run, else another of the plan's blobs (the lists are then emitted afresh), waiting only when
 * 1 + PKV_PLAN_SPARE_BLOBS uploads of the plan are pending. */
pkv_status plan_blob_acquire(pkv_context *ctx, pkv_plan *plan);
pkv_status plan_grow_i32(pkv_context *ctx, int32_t **buf, size_t *cap, size_t n, const char *what);
pkv_status plan_scratch_reserve(pkv_context *ctx, pkv_plan *plan, size_t n);
/* Writes what follows the emitted lists: arrival counters, the workspace layout, a graph-stable
 * plan's counts and signature.  rewrite false: the lists were patched over an emission of the same layout
 * (emit.c), whose counters and counts in the blob are already this step's. */
void plan_finish_layout(pkv_plan *plan, int32_t graph_cap, int32_t graph_max_batch, bool rewrite);
pkv_status plan_graph_capacity(pkv_context *ctx, const pkv_plan_options *opts, int64_t slots, const pkv_problem *p,
                               int64_t *cap_out);
/* The workspace bound of pkv_workspace_size for checked options with a known parallelism. */
pkv_status plan_workspace_bound(pkv_context *ctx, const pkv_backend_caps *caps, const pkv_problem *problem,
                                int32_t max_batch, const pkv_plan_options *opts, int64_t parallelism, size_t *bytes);

#endif /* PKV_PLAN_INTERNAL_H */
