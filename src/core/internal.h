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
#define PKV_MAX_HEADS 4096      /* most query heads of a problem */
#define PKV_MAX_SPLITS_OPT (1 << 16) /* and max_splits, the cap on splits per (row, KV head) */
#define PKV_MAX_SEQ_LEN (1 << 30) /* longest row: token arithmetic (a split's end, a chunk) stays in int32 */
#define PKV_WS_ALIGN 256
/* Graph-stable plans: the int32 words at the plan's off_counts, uploaded with the plan (zeros but the
 * counts): the step's task and merge counts, then the CUDA work claim's (src/cuda/claim.cuh, "tasks claimed by
 * SM"; set back to zero by the merge kernel after each launch): tasks claimed, arrivals, orphan cursor,
 * and from PKV_COUNTS_SM a counter per SM for PKV_CLAIM_SMS SMs.  Beside them, and kept like the counts,
 * PKV_COUNTS_WIDEST: the step's widest merge (its state count), from which the CUDA merge kernel of a
 * graph-stable step picks one CTA per merge or one per head (src/cuda/merge.cuh, merge_wide). */
#define PKV_COUNTS_TASKS 0
#define PKV_COUNTS_MERGES 1
#define PKV_COUNTS_CLAIMED 2
#define PKV_COUNTS_ARRIVED 3
#define PKV_COUNTS_CURSOR 4
#define PKV_COUNTS_WIDEST 5
#define PKV_COUNTS_SM 8
#define PKV_CLAIM_SMS 256
#define PKV_COUNTS_WORDS (PKV_COUNTS_SM + PKV_CLAIM_SMS)
/* The claim's order of the SMs in a round of tasks (src/cuda/claim.cuh, claim_task): task j of a round goes to SM
 * j x b mod nsm, b the first stride from nsm / 8 up that is coprime with nsm (SMs far apart in %smid
 * order, so in different GPCs); returns its inverse a, so SM s ranks s x a mod nsm - a permutation of
 * [0, nsm), which the claim's coverage needs (src/plan/layout.c; tested by test_plan). */
int32_t pkv_graph_claim_multiplier(int32_t nsm);

/* Loops that vectorise: on x86-64 Linux (GCC) an AVX2 clone of the function is picked at load time
 * where the CPU has it (twice the lanes of the SSE2 baseline, and the 32-bit min/max it lacks). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define PKV_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PKV_VECTOR_CLONES
#endif

/* Host memory a backend hands plans for their blob: page-locked on CUDA, so that the upload copies straight from
 * the plan (no copy into staging first).  A blob the device may still be reading (an upload queued and not yet
 * run) is not rewritten: the planner asks `busy` before it plans into a blob and, when it is, plans into one of
 * the plan's other blobs (layout.c, plan_blob_acquire).  Blobs are allocated and freed only through the ops that
 * gave them (pkv_plan.blob_ops). */
typedef struct pkv_blob_ops {
    void *(*alloc)(size_t bytes); /* NULL when none can be had (the plan then keeps malloc's memory) */
    void (*free)(void *blob);     /* waits for the blob's queued uploads first; accepts NULL */
    /* *busy: an upload queued from the blob may not have run yet; wait: first waits until it has (then *busy is
     * false).  A failure is recorded on ctx (may be NULL). */
    pkv_status (*busy)(pkv_context *ctx, void *blob, bool wait, bool *busy);
} pkv_blob_ops;

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
    /* Writes the step's new K and V into the pages (pkv_append_kv, arguments checked by append.c); may be NULL. */
    pkv_status (*append)(pkv_context *ctx, const pkv_problem *p, int32_t batch_size, int32_t num_tokens,
                         const pkv_append_tensors *t, void *stream);
    /* Copies whole pages (pkv_copy_pages: at most PKV_MAX_PAGE_COPIES, checked by append.c); may be NULL. */
    pkv_status (*copy_pages)(pkv_context *ctx, const pkv_problem *p, const pkv_page_copy *copies, int32_t count,
                             void *k_cache, void *v_cache, int64_t page_stride, void *stream);
    /* The memory of the blobs of plans planned on this backend's contexts; may be NULL (malloc). */
    const pkv_blob_ops *blob;
} pkv_backend_ops;

/* What a backend tells the planner about its device: the planner's only input from the backend.  Filled
 * by the backend's init (ctx->caps); tests and tools that plan for a simulated device pass their own to
 * pkv_plan_step_caps instead of writing into a context. */
typedef struct pkv_backend_caps {
    int32_t parallelism;      /* units the planner splits work over: SMs or threads */
    int32_t ctas_per_unit;    /* tasks per unit of the planner's default wave (>= 1) */
    int32_t resident[3][2];   /* CTAs per unit that the kernel running [d 64, 128, 256][G <= PKV_CAPS_GROUP_SPLIT,
                                 G > PKV_CAPS_GROUP_SPLIT] holds resident (CUDA: the occupancy API); 0: unknown */
    int32_t row_gather_below; /* pages whose largest power-of-two divisor is below this many tokens are gathered
                                 row by row (CUDA: cp.async rows); 0: none */
} pkv_backend_caps;
/* The G that splits the two kernel families of resident[][] (the second index: G > PKV_CAPS_GROUP_SPLIT). */
#define PKV_CAPS_GROUP_SPLIT 8
/* The first index of resident[][] for a head dim: 0, 1, 2 for d = 64, 128, 256; -1 for others. */
static inline int pkv_caps_dim_index(int32_t head_dim) {
    return head_dim == 64 ? 0 : head_dim == 128 ? 1 : head_dim == 256 ? 2 : -1;
}
/* The capabilities host plans assume (pkv_plan_step_host): parallelism 0 (the options give it), 2 tasks
 * per unit, residency unknown, no row gathering. */
void pkv_backend_caps_host(pkv_backend_caps *caps);

struct pkv_context {
    pkv_backend_kind kind;
    const pkv_backend_ops *ops;
    void *backend_state;
    pkv_backend_caps caps;   /* what the backend reported at creation; the planner reads only this */
    int32_t device;
    uint64_t id;             /* unique per context */
    char device_name[160];
    bool has_cost_model;
    pkv_cost_model cost_model;
    pkv_plan *scratch_plan; /* the policy's candidate plans */
    pkv_tuning tuning;      /* PKV_TUNING and PKV_POLICY, parsed at creation (tuning.c); the backends read it */
    bool has_page_fault;    /* the CPU backend's first page id outside the pool (pkv_context_page_fault) */
    pkv_page_fault page_fault;
};

/* A plan in a backend's blob memory has up to 1 + PKV_PLAN_SPARE_BLOBS blobs: as many uploads of one plan
 * object may be pending before its next step waits for the oldest (the CUDA staging ring's depth). */
#define PKV_PLAN_SPARE_BLOBS 3

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
    const pkv_blob_ops *blob_ops; /* who gave blob and the spares; NULL: malloc */
    /* a backend's blobs: the others, oldest upload first, planned into while blob's upload is pending */
    void *blob_spare[PKV_PLAN_SPARE_BLOBS];
    size_t blob_spare_cap[PKV_PLAN_SPARE_BLOBS];
    int32_t num_spares;
    bool blob_refused;       /* the backend's memory could not be had: malloc's from then on */
    size_t off_tasks, off_rows, off_merges, off_counters;
    size_t off_state_o, off_state_ml, workspace_bytes; /* partial states: o_s, then (m_s, l_s) */

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
    /* what the lists in the blob were emitted from (emit.c, plan_memo), so that a next step of the same shape
     * (the same route, chunks and split counts, rows only longer or shorter within them) patches the rows'
     * lengths and ends into them instead of emitting every task again */
    bool memo_valid;
    bool last_patched;       /* the last successful step was patched (tests) */
    int32_t memo_kind;       /* PKV_MEMO_RECT, PKV_MEMO_WORKQUEUE */
    int32_t memo_batch, memo_kv_heads, memo_page_size, memo_window, memo_splits, memo_chunk_tokens;
    int32_t memo_graph_cap, memo_graph_batch, memo_tails;
    pkv_route memo_route;
    int32_t *memo;           /* [per row: PKV_MEMO_ROW_WORDS | the work queue's tail rows in rank order: batch] */
    size_t memo_cap;
};
#define PKV_MEMO_RECT 1
#define PKV_MEMO_WORKQUEUE 2

/* Errors: record a formatted message on the context (or thread-locally when ctx is NULL) and
 * return the status, so call sites read `return pkv_fail(ctx, PKV_ERR_..., "...", ...);`. */
pkv_status pkv_fail(pkv_context *ctx, pkv_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
pkv_status pkv_failv(pkv_status st, const char *fmt, va_list ap);
void pkv_clear_error(pkv_context *ctx);

/* fp16 / bf16 <-> float, round to nearest even (half.c). */
uint16_t pkv_float_to_half(float f);
float pkv_half_to_float(uint16_t h);
/* fp8 (half.c): decode any code; encode with round to nearest even, saturating (a finite value beyond the
 * largest, or an infinity, becomes the largest finite of its sign; NaN stays NaN). */
float pkv_fp8_to_float(uint8_t v, int e5m2); /* e5m2 0: e4m3, 1: e5m2 */
uint8_t pkv_float_to_fp8(float f, int e5m2);
uint16_t pkv_float_to_bf16(float f);
float pkv_bf16_to_float(uint16_t h);

/* Shape checks shared by plan, reference and backends. */
pkv_status pkv_check_problem(pkv_context *ctx, const pkv_problem *p);
pkv_status pkv_check_table(pkv_context *ctx, const pkv_problem *p, const pkv_page_table *t,
                           bool check_page_ids);
size_t pkv_dtype_size(pkv_dtype d);
const char *pkv_dtype_name(pkv_dtype d); /* "fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2"; "unknown" */
float pkv_problem_scale(const pkv_problem *p);
static inline bool pkv_dtype_is_fp8(pkv_dtype d) { return d == PKV_DTYPE_FP8_E4M3 || d == PKV_DTYPE_FP8_E5M2; }
/* The caches' element type of a checked problem: kv_dtype when it is fp8, else dtype (kv_dtype 0 or dtype). */
static inline pkv_dtype pkv_kv_dtype(const pkv_problem *p) {
    return pkv_dtype_is_fp8(p->kv_dtype) ? p->kv_dtype : p->dtype;
}
/* Bytes of one cache element (fp8 1, fp16 / bf16 2). */
static inline size_t pkv_kv_elem_size(const pkv_problem *p) { return pkv_dtype_size(pkv_kv_dtype(p)); }
/* A per-tensor scale as used: 0 is 1.0. */
static inline float pkv_scale_or_one(float s) { return s > 0.0f ? s : 1.0f; }
/* The scales of a run or an append (pkv_tensors, pkv_append_tensors) by what the host can see: per-tensor
 * values, which pointers are set, their alignment (who names the call in the message). */
pkv_status pkv_check_kv_scales(pkv_context *ctx, const pkv_problem *p, float k_scale, float v_scale,
                               const float *k_heads, const float *v_heads, const char *who);
/* The entries of per-head scales in host memory (either pointer may be NULL): positive and finite. */
pkv_status pkv_check_head_scales(pkv_context *ctx, const pkv_problem *p, const float *k_heads, const float *v_heads,
                                 const char *who);

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

/* Plans one step as pkv_plan_step would on a context of these capabilities, without a context: tests and
 * tools plan for a simulated device this way.  model: the cost model auto weighs (as
 * pkv_context_set_cost_model accepts), NULL: the auto rule.  Errors are reported thread-locally
 * (pkv_last_error); capabilities out of range are PKV_ERR_INVALID_ARGUMENT. */
pkv_status pkv_plan_step_caps(const pkv_backend_caps *caps, const pkv_cost_model *model, const pkv_problem *problem,
                              const pkv_page_table *table, const pkv_plan_options *opts, pkv_plan *plan);
/* pkv_workspace_size for a device of these capabilities, without a context. */
pkv_status pkv_workspace_size_caps(const pkv_backend_caps *caps, const pkv_problem *problem, int32_t max_batch,
                                   const pkv_plan_options *opts, size_t *bytes);

/* Cost-model terms of a route (single, split, workqueue or fused) without building its plan (the policy's
 * fast path; tests compare them with pkv_cost_terms of the plan pkv_plan_step_caps builds for the same
 * capabilities).  The parallelism: the options', else the capabilities'. */
pkv_status pkv_plan_route_terms(const pkv_backend_caps *caps, const pkv_problem *problem, const pkv_page_table *table,
                                const pkv_plan_options *opts, double terms[PKV_COST_TERMS]);

/* The cost model (cost.c): terms of a built plan, the predicted time, whether the policy weighs a
 * candidate, defaults from device properties, and the policy file's writer (the reader is public). */
pkv_status pkv_cost_terms(const pkv_plan *plan, double terms[PKV_COST_TERMS]);
double pkv_cost_predict(const pkv_cost_model *m, const double terms[PKV_COST_TERMS]);
int pkv_cost_candidate(const double terms[PKV_COST_TERMS], int32_t parallelism);
void pkv_cost_model_default(pkv_cost_model *m, int32_t parallelism, double read_gbps, double launch_us);
pkv_status pkv_cost_model_save(const pkv_cost_model *m, const char *path);
/* The model's streaming term (bandwidth and critical path under the soft max) and the last wave's idle
 * slots, for given rho and p (the prediction's and the fit's shared part). */
void pkv_cost_roofline_parts(const double t[PKV_COST_TERMS], double rho, double p, double *stream, double *idle);
/* Why a model cannot drive the policy, written to why (false: it can). */
bool pkv_cost_model_invalid(const pkv_cost_model *m, char *why, size_t cap);

/* Fills the cost terms from a plan's tallies; kv_mb: KV MB of all tasks. */
void pkv_cost_fill_terms(double t[PKV_COST_TERMS], int64_t launches, double mb, double longest_mb, double merge_mb,
                         int64_t tasks, int64_t slots, double kv_mb, double token_mb, int rect, int fused);

/* Appending K and V (append.c, cpu_append.c): the CPU backend's operations. */
pkv_status pkv_cpu_append(pkv_context *ctx, const pkv_problem *p, int32_t batch_size, int32_t num_tokens,
                          const pkv_append_tensors *t, void *stream);
pkv_status pkv_cpu_copy_pages(pkv_context *ctx, const pkv_problem *p, const pkv_page_copy *copies, int32_t count,
                              void *k_cache, void *v_cache, int64_t page_stride, void *stream);

/* Backends. */
pkv_status pkv_cpu_backend_init(pkv_context *ctx, int32_t num_threads);
pkv_status pkv_cuda_backend_init(pkv_context *ctx, int32_t device, bool pdl, bool check_pages); /* stub without CUDA */
/* The CUDA backend's recorded page fault (bounds mode); 0 without one (and in a build without CUDA). */
int pkv_cuda_page_fault(const pkv_context *ctx, pkv_page_fault *out);
int pkv_cuda_device_count(void);
/* The decode kernel a run of the plan with these tensors launches on a CUDA context (static storage);
 * PKV_ERR_UNSUPPORTED on another backend, PKV_ERR_BACKEND_UNAVAILABLE without CUDA. */
pkv_status pkv_cuda_decode_kernel_of(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t, const char **name);

#ifdef __cplusplus
}
#endif

#endif /* PKV_INTERNAL_H */
