/* bench.h - what the files of `pkv bench` share (private to tools/bench*.c): the options of a run, the
 * steps it measures, the buffers and the reference of a step, the ceilings, the rows of results, and
 * the entry points of each file:
 *   bench_options.c    what the options need of the machine: the context, the files, the policy
 *                      (the options themselves: options.c)
 *   bench_workloads.c  the steps: isolated anchor and --lens steps, trace steps, the trace sets
 *   bench_measure.c    buffers, the float64 reference, the ceilings and floors, timing one route
 *   bench_report.c     the Markdown tables, the summary, the JSON, the policy fitted from the rows
 *   bench.c            cmd_bench: the driver */
#ifndef PKV_BENCH_H
#define PKV_BENCH_H

#include "cli.h"
#include "options.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* What the setup and workload steps return to go on; any other value is the command's exit status. */
#define BENCH_GO_ON (-1)

/* "pkv bench", or "pkv calibrate" when calibrate runs the measurements: the prefix of every message. */
extern const char *bench_prog;

/* One step to measure: lengths and, per rotation, the physical page of each logical page. */
typedef struct step_input {
    char name[48];
    int32_t batch;
    int32_t *lens;
    int32_t *indptr;
    int32_t *pages;      /* [rotations][indptr[B]] */
    int32_t rotations;
    int64_t pool_pages;  /* pages the K and V pools hold */
    double flashinfer_us; /* 0 when unknown */
    char workload_arg[192];
} step_input;

/* The steps of a run and what the report calls them. */
typedef struct bench_workload {
    step_input *steps;
    int nsteps;
    bool trace_mode; /* trace steps: one shared pool, a per-route summary instead of a row per step */
    char label[256];
} bench_workload;

typedef struct row_result {
    char step[48];
    int32_t batch;
    int64_t total_tokens;
    pkv_route route_asked, route_used;
    pkv_counters c;
    double kernel_us, kernel_p10, kernel_p90, wall_us, plan_us, floor_us;
    double gather_us; /* the floor of the step's pages: a pure read of each K and V page, whole */
    /* --behind-producer: the producer alone and producer + step (events around both), with a producer
     * that does not trigger its dependents and one that does (NAN: not measured) */
    double producer_us, pair_us, producer_trig_us, pair_trig_us;
    /* graph-stable plans on CUDA: a step as a server runs it with a CUDA graph captured once - plan +
     * upload + graph launch + sync (host clock, median); NAN otherwise */
    double graph_wall_us;
    double gbps, frac_ceiling, step_eff, tokens_per_s;
    double rel_err, max_err;
    int nan_outputs;
    double flashinfer_us;
    double terms[PKV_COST_TERMS], predicted_us;
    char repro[512];
    char trace[192];      /* the step's workload arguments (trace, seed, B, step) */
    const char *decode_kernel; /* CUDA: the decode kernel the run launched (pkv_dev_decode_kernel); NULL on the CPU */
    const int32_t *lens;  /* the step's lengths (owned by its step_input) */
} row_result;

typedef struct results {
    row_result *rows;
    int n, cap;
} results;

/* Device or host buffers of a step. */
typedef struct buffers {
    void *k, *v, *q, *o, *ws; /* interleaved K/V: v points into k's allocation */
    int64_t kv_page_stride;  /* 0: dense pools */
    float *lse;
    int32_t **page_sets; /* per rotation */
    int32_t nsets;
    size_t kv_bytes, ws_bytes, q_bytes;
    int64_t pool_pages;
} buffers;

/* The float64 reference of a step's sampled rows. */
#define BENCH_REF_MAX_ROWS 4 /* longest, shortest, first, last */
typedef struct reference {
    int32_t nrows;
    int32_t rows[BENCH_REF_MAX_ROWS];
    double *o; /* [nrows, Hq, d] */
    double *lse;
} reference;

/* What the device can do, measured in this run (NAN on the CPU backend). */
typedef struct ceilings {
    double read_gbps, launch_us, graph_us;
    void *read_buf;
    size_t read_buf_bytes;
} ceilings;

/* ---- helpers of every file ---------------------------------------------------------------------- */
static inline void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "%s: cannot allocate %zu bytes\n", bench_prog, n);
        exit(1);
    }
    return p;
}

static inline void die_status(pkv_context *ctx, pkv_status st, const char *what) {
    fprintf(stderr, "%s: %s failed: %s\n", bench_prog, what, pkv_last_error());
    (void)st;
    exit(1);
}

#define TRY(ctx, expr, what)                        \
    do {                                            \
        pkv_status st_ = (expr);                    \
        if (st_ != PKV_OK) die_status(ctx, st_, what); \
    } while (0)

static inline int32_t pages_of(int32_t len, int32_t ps) { return (len + ps - 1) / ps; }

/* K and V bytes of one token: elements of the cache's type (2 bytes, or 1 for an fp8 cache). */
static inline int64_t kv_bytes_per_token(const pkv_problem *p) {
    return (int64_t)p->num_kv_heads * p->head_dim * 2 * (int64_t)cli_kv_elem_bytes(p);
}

/* The tokens a row of len attends to: its last `window` under a sliding window.  Rotations, the
 * floor and the fractions of the ceiling count these (the bytes a step reads), not the row's length. */
static inline int64_t attended(const bench_opts *o, int32_t len) {
    return o->prob.window > 0 && len > o->prob.window ? o->prob.window : len;
}

/* ---- bench_options.c ------------------------------------------------------------------------------ */
/* After bench_options_parse: the context (o->ctx, NULL until then), the backend's defaults, the --json
 * and --calibrate-out files checked writable, the --policy loaded: BENCH_GO_ON, else the exit status
 * (with a message). */
int bench_options_setup(bench_opts *o);

/* ---- bench_workloads.c ---------------------------------------------------------------------------- */
/* The steps of the workload the options name (--anchor, --lens, --calibration-set, --heldout-set,
 * --trace-file, else a trace): BENCH_GO_ON, else the exit status (with a message). */
int bench_workload_make(const bench_opts *o, bench_workload *w);
void bench_workload_free(bench_workload *w);

/* ---- bench_measure.c ------------------------------------------------------------------------------ */
/* The read ceiling and launch latencies (CUDA), with a buffer large enough for every step's floor. */
void bench_ceilings_measure(const bench_opts *o, const bench_workload *w, ceilings *ce);
void bench_ceilings_free(const bench_opts *o, ceilings *ce);
/* Allocates the pools for a step (reusing the K/V pools when they are large enough). */
void buffers_for_step(const bench_opts *o, buffers *b, const step_input *s, uint64_t seed);
void buffers_free(const bench_opts *o, buffers *b);
/* Picks up to BENCH_REF_MAX_ROWS rows, copies their pages to the host and computes the float64 reference. */
void reference_compute(const bench_opts *o, const buffers *b, const step_input *s, reference *ref);
void reference_free(reference *r);
/* The floors of a step (CUDA, else 0): a streaming read of its bytes (*floor_us) and, for isolated
 * steps, a read of its own pages through its page table (*gather_us). */
void bench_step_floors(const bench_opts *o, const buffers *b, const step_input *s, const ceilings *ce,
                       bool trace_mode, double *floor_us, double *gather_us);
/* Plans, checks and times one (step, route) into r. */
void measure(const bench_opts *o, buffers *b, const step_input *s, pkv_route route, const ceilings *ce,
             const reference *ref, double floor_us, double gather_us, bool warm_first, pkv_plan *plan,
             row_result *r);
void results_push(results *r, const row_result *x);

/* ---- bench_report.c ------------------------------------------------------------------------------- */
void print_row_header(void);
void print_row(const row_result *r);
/* "auto:<route it ran>" or the route. */
void route_label(const row_result *r, char *buf, size_t n);
/* Per-route summary over the steps of a trace. */
void print_summary(const bench_opts *o, const results *res);
/* The lines under the tables: backend, shape, workload, the plans' parallelism and the ceilings. */
void print_run_footer(const bench_opts *o, const ceilings *ce, const char *workload);
/* --behind-producer on CUDA: each row behind a kernel that writes q. */
void print_behind_table(const bench_opts *o, const results *res);
/* With the reference check on: a message per row off the reference; their count. */
int report_disagreements(const bench_opts *o, const results *res);
/* --calibrate-out: fits o->model to the rows and writes it; false (with a message) on failure. */
bool fit_policy(bench_opts *o, const results *res);
/* --explain: each row's predicted time next to its measured time, and the model. */
void print_explain(const bench_opts *o, results *res);
void write_json(const char *path, const bench_opts *o, const ceilings *ce, const results *res, const char *workload);

#endif
