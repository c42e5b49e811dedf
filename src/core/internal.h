/* internal.h - structures shared by the library's layers (not installed). */
#ifndef PKV_INTERNAL_H
#define PKV_INTERNAL_H

#include "persistentkv.h"
#include "tuning.h"

#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PKV_MAX_GROUP 16  /* largest G = Hq / Hkv the kernels handle */
#define PKV_MAX_BATCH (1 << 20)
#define PKV_MAX_HEADS 4096      /* most query heads of a problem */
#define PKV_MAX_PARALLELISM (1 << 16) /* plan options: parallel units, */
#define PKV_MAX_PER_UNIT 1024   /* CTAs per unit, */
#define PKV_MAX_SPLITS_OPT (1 << 16) /* and max_splits, the cap on splits per (row, KV head) */
#define PKV_MAX_SEQ_LEN (1 << 30) /* longest row: token arithmetic (a split's end, a chunk) stays in int32 */
#define PKV_WS_ALIGN 256
/* Graph-stable plans: the int32 words at the plan's off_counts, uploaded with the plan (zeros but the
 * counts): the step's task and merge counts, then the CUDA work claim's (decode.cu, "tasks claimed by
 * SM"; set back to zero by the merge kernel after each launch): tasks claimed, arrivals, orphan cursor,
 * and from PKV_COUNTS_SM a counter per SM for PKV_CLAIM_SMS SMs.  Beside them, and kept like the counts,
 * PKV_COUNTS_WIDEST: the step's widest merge (its state count), from which the CUDA merge kernel of a
 * graph-stable step picks one CTA per merge or one per head (decode.cu, merge_wide). */
#define PKV_COUNTS_TASKS 0
#define PKV_COUNTS_MERGES 1
#define PKV_COUNTS_CLAIMED 2
#define PKV_COUNTS_ARRIVED 3
#define PKV_COUNTS_CURSOR 4
#define PKV_COUNTS_WIDEST 5
#define PKV_COUNTS_SM 8
#define PKV_CLAIM_SMS 256
#define PKV_COUNTS_WORDS (PKV_COUNTS_SM + PKV_CLAIM_SMS)
/* The claim's order of the SMs in a round of tasks (decode.cu, claim_task): task j of a round goes to SM
 * j x b mod nsm, b the first stride from nsm / 8 up that is coprime with nsm (SMs far apart in %smid
 * order, so in different GPCs); returns its inverse a, so SM s ranks s x a mod nsm - a permutation of
 * [0, nsm), which the claim's coverage needs (planner.c; tested by test_plan). */
int32_t pkv_graph_claim_multiplier(int32_t nsm);

/* Loops that vectorise: on x86-64 Linux (GCC) an AVX2 clone of the function is picked at load time
 * where the CPU has it (twice the lanes of the SSE2 baseline, and the 32-bit min/max it lacks). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define PKV_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PKV_VECTOR_CLONES
#endif

/* A backend executes plans; it never decides schedules. */
typedef struct pkv_backend_ops {
    const char *name;
    /* Executes every phase of the plan (tasks, then merges). */
    pkv_status (*run)(pkv_context *ctx, const pkv_plan *plan, void *workspace, size_t ws_bytes,
                      const pkv_tensors *t, void *stream);
    /* Makes the plan's data visible to the device (CUDA); may be NULL. */
    pkv_status (*upload)(pkv_context *ctx, const pkv_plan *plan, void *workspace, size_t ws_bytes,
                         void *stream);
    /* Whether the backend supports this problem (dtype, head dim, group). */
    pkv_status (*supports)(pkv_context *ctx, const pkv_problem *p);
    void (*destroy)(pkv_context *ctx);
} pkv_backend_ops;

struct pkv_context {
    pkv_backend_kind kind;
    const pkv_backend_ops *ops;
    void *backend_state;
    int32_t parallelism;     /* SMs or threads */
    int32_t ctas_per_unit;   /* planner default for this backend */
    int32_t resident[3][2];  /* CUDA: CTAs per SM of the kernel that runs [d 64, 128, 256][G <= 8, G > 8]; 0: unknown */
    int32_t row_gather_below; /* CUDA: pages whose largest power-of-two divisor is below this many tokens are
                                 gathered row by row (cp.async); 0: none (the planner's full-wave rule) */
    int32_t device;
    uint64_t id;             /* unique per context */
    char device_name[160];
    char last_error[512];
    bool has_cost_model;
    pkv_cost_model cost_model;
    pkv_plan *scratch_plan; /* the policy's candidate plans */
    pkv_tuning tuning;      /* PKV_TUNING and PKV_POLICY, parsed at creation (tuning.c); the backends read it */
};

/* Plan storage: tasks, rows and merges live in one host blob so the CUDA backend uploads the
 * whole plan with one copy; the partial states follow it in the workspace. */
struct pkv_plan {
    pkv_problem problem;
    int32_t batch_size;
    pkv_route route;
    int32_t group;           /* G */

    pkv_task *tasks;         /* points into blob */
    int32_t num_tasks;
    pkv_row_sched *rows;     /* points into blob */
    int32_t num_rows;
    pkv_merge *merges;       /* points into blob */
    int32_t num_merges;
    pkv_phase *phases;       /* separate, host only */
    int32_t num_phases, cap_phases;

    int32_t num_state_slots;
    int32_t max_merge_count; /* the most partial states of one merge (0: no split merges) */
    int64_t slots;           /* resident task slots it was planned for (parallelism x CTAs per unit) */
    pkv_counters counters;

    void *blob;              /* [tasks | rows | merges], each part PKV_WS_ALIGN aligned */
    size_t blob_cap, blob_bytes;
    size_t off_tasks, off_rows, off_merges, off_counters;
    size_t off_state_o, off_state_lse, workspace_bytes;

    /* graph-stable plans (pkv_plan_options.graph_max_batch > 0): the fixed grids, where the step's task
     * and merge counts live in the workspace (PKV_COUNTS_WORDS int32 at off_counts, in the blob), and
     * the launch signature */
    int32_t graph_tasks, graph_merges; /* 0: not graph-stable */
    size_t off_counts;
    uint64_t graph_signature;

    uint64_t generation;     /* unique per successful pkv_plan call */
    /* scratch of the planner */
    int32_t *scratch;
    size_t scratch_cap;
    /* under a sliding window: each row's attended length, then its first token [2 x batch] */
    int32_t *win;
    size_t win_cap;
};

/* Errors: record a formatted message on the context (or thread-locally when ctx is NULL) and
 * return the status, so call sites read `return pkv_fail(ctx, PKV_ERR_..., "...", ...);`. */
pkv_status pkv_fail(pkv_context *ctx, pkv_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void pkv_clear_error(pkv_context *ctx);

/* Shape checks shared by plan, reference and backends. */
pkv_status pkv_check_problem(pkv_context *ctx, const pkv_problem *p);
pkv_status pkv_check_table(pkv_context *ctx, const pkv_problem *p, const pkv_page_table *t,
                           bool check_page_ids);
size_t pkv_dtype_size(pkv_dtype d);
float pkv_problem_scale(const pkv_problem *p);

/* Strides in elements of the KV cache for the problem's layout. */
typedef struct pkv_kv_strides { int64_t page, head, token; } pkv_kv_strides;
pkv_kv_strides pkv_kv_strides_of(const pkv_problem *p);
/* The first token a row of n tokens attends to: n - window under a sliding window, else 0. */
static inline int32_t pkv_row_start(const pkv_problem *p, int32_t n) {
    return p->window > 0 && n > p->window ? n - p->window : 0;
}
/* The strides of a run: pkv_kv_strides_of with the tensors' page stride when they set one. */
pkv_kv_strides pkv_kv_strides_run(const pkv_problem *p, const pkv_tensors *t);
/* Elements from one row of q (or o) to the next: the tensors' stride, or Hq x head_dim when 0. */
static inline int64_t pkv_row_stride(const pkv_problem *p, int64_t given) {
    return given > 0 ? given : (int64_t)p->num_qo_heads * p->head_dim;
}

/* Cost-model terms of a route without building its plan (the policy's fast path; tests compare
 * them with pkv_cost_terms of the built plan).  default_per_unit: ctas_per_unit when not forced. */
pkv_status pkv_plan_route_terms(const pkv_problem *problem, const pkv_page_table *table, const pkv_plan_options *opts,
                                int32_t default_per_unit, double terms[PKV_COST_TERMS]);

/* Fills the cost terms (persistentkv.h) from a plan's tallies; kv_mb: KV MB of all tasks. */
void pkv_cost_fill_terms(double t[PKV_COST_TERMS], int64_t launches, double mb, double longest_mb, double merge_mb,
                         int64_t tasks, int64_t slots, double kv_mb, double token_mb, int rect, int fused);

/* Backends. */
pkv_status pkv_cpu_backend_init(pkv_context *ctx, int32_t num_threads);
pkv_status pkv_cuda_backend_init(pkv_context *ctx, int32_t device, bool pdl); /* stub without CUDA */
int pkv_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* PKV_INTERNAL_H */
