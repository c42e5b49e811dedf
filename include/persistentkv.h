/*
 * persistentkv.h - decode attention over a paged KV cache for grouped-query attention.
 *
 * The serving API: one header, C11, sized integer types, `pkv_` prefix.  A decode step is two calls:
 *
 *   pkv_plan_step(ctx, &problem, &table, &opts, plan);       host only, O(B + tasks), no device sync
 *   pkv_run(ctx, plan, workspace, bytes, &tensors, stream);  per layer, allocates nothing
 *
 * A plan is plain data (tasks, merges, counters) reused by every layer of the step.  The CPU backend and
 * the CUDA backend execute the same plans.  CUDA graphs: plan graph-stable steps
 * (pkv_plan_options.graph_max_batch), capture pkv_run once, then per step pkv_plan_step, pkv_plan_upload
 * and replay.
 *
 * Math (for query head h of row i, KV head g = h / G, G = Hq / Hkv, N_i tokens):
 *   s_j = scale * dot(q[i,h,:], K[i,g,j,:]),  o[i,h,:] = sum_j softmax(s)_j V[i,g,j,:],
 *   lse[i,h] = ln(sum_j exp(s_j)); a row with N_i = 0 yields o = 0 and lse = -inf.
 * An fp8 KV cache (pkv_problem.kv_dtype) is read as K = float(stored K) x k_scale and V = float(stored V) x
 * v_scale (pkv_tensors: per tensor, or per KV head g), as vLLM and FlashInfer define it.
 *
 * Errors: every call that can fail returns a pkv_status; the message of the last failing call on the
 * calling thread is pkv_last_error().
 *
 * Threads: a context, a plan and a workspace are each used by one thread at a time; distinct ones may be
 * used by distinct threads at once (e.g. a context per GPU worker thread).  A plan is only read by
 * pkv_run, so several contexts may run one plan at the same time, each with its own workspace.
 *
 * Tools, tests and benchmarks use a second library beside this one, the lab (lab/pkv_lab.h: traces, the
 * float64 reference, cost-model fitting, device timers); a server needs none of it.
 */
#ifndef PERSISTENTKV_H
#define PERSISTENTKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The functions the shared library exports: this header's and no others. */
#if defined(_WIN32)
#define PKV_API
#elif defined(__GNUC__) || defined(__clang__)
#define PKV_API __attribute__((visibility("default")))
#else
#define PKV_API
#endif

/* Documented bounds of the inputs (each check refuses what lies past them). */
#define PKV_MAX_BATCH (1 << 20)         /* rows of a step */
#define PKV_MAX_PARALLELISM (1 << 16)   /* pkv_plan_options.parallelism */
#define PKV_MAX_PER_UNIT 1024           /* pkv_plan_options.ctas_per_unit */

#define PKV_VERSION_MAJOR 0
#define PKV_VERSION_MINOR 6
#define PKV_VERSION_PATCH 0

/* ------------------------------------------------------------------------------------------------
 * Status codes and errors.  Values never change once released; new codes are appended.
 * ---------------------------------------------------------------------------------------------- */
typedef enum pkv_status {
    PKV_OK = 0,
    PKV_ERR_NULL_POINTER = 1,        /* a required pointer argument is NULL */
    PKV_ERR_INVALID_ARGUMENT = 2,    /* an argument out of its documented range */
    PKV_ERR_HEAD_GROUP = 3,          /* num_qo_heads is not a positive multiple of num_kv_heads */
    PKV_ERR_UNSUPPORTED_HEAD_DIM = 4,/* head_dim not in {64, 128, 256} */
    PKV_ERR_UNSUPPORTED_DTYPE = 5,   /* dtype not supported by this backend */
    PKV_ERR_NEGATIVE_LENGTH = 6,     /* a seq_lens entry is negative */
    PKV_ERR_LENGTH_EXCEEDS_PAGES = 7,/* seq_lens[i] > pages of row i x page_size */
    PKV_ERR_PAGE_OUT_OF_RANGE = 8,   /* a page id < 0 or >= num_pages */
    PKV_ERR_WORKSPACE_TOO_SMALL = 9, /* workspace smaller than pkv_plan_workspace_size() */
    PKV_ERR_BAD_INDPTR = 10,         /* kv_indptr not starting at 0 or not non-decreasing */
    PKV_ERR_UNSUPPORTED = 11,        /* a valid request this build/backend does not implement */
    PKV_ERR_BACKEND_UNAVAILABLE = 12,/* e.g. CUDA asked for without a GPU or without CUDA support */
    PKV_ERR_CUDA = 13,               /* a CUDA runtime call failed; the message has the details */
    PKV_ERR_OUT_OF_MEMORY = 14,      /* host allocation failed */
    PKV_ERR_PLAN_MISMATCH = 15,      /* plan made for another problem or context */
    PKV_ERR_IO = 16,                 /* file could not be opened, read or written */
    PKV_ERR_PARSE = 17,              /* malformed file content */
    PKV_ERR_PAGE_SIZE = 18,          /* page_size not in [1, 256] */
    PKV_ERR_BATCH_SIZE = 19,         /* batch_size negative or above the supported maximum */
    PKV_ERR_POOL_EXHAUSTED = 20,     /* the page pool has too few free pages (the caller may preempt a request) */
    PKV_ERR_UNKNOWN_REQUEST = 21,    /* a request id outside the pool's range or never created */
    PKV_ERR_REQUEST_FREED = 22,      /* a request used after pkv_request_free */
    PKV_ERR_BEYOND_LENGTH = 23,      /* a token position or length past the request's (or row's) length */
    PKV_ERR_FOREIGN_PAGE = 24        /* a page table names a page its request does not own */
} pkv_status;

/* PKV_VERSION_MAJOR * 10000 + MINOR * 100 + PATCH of the loaded library (bindings check it). */
PKV_API uint32_t pkv_version(void);

/* Never NULL; "unknown status" for codes this version does not know. */
PKV_API const char *pkv_status_string(pkv_status status);

/* The message of the last call on the calling thread that failed ("status: why"; "" if none).  Valid on
 * that thread until its next failing call. */
PKV_API const char *pkv_last_error(void);

/* ------------------------------------------------------------------------------------------------
 * Problem and page table.
 * ---------------------------------------------------------------------------------------------- */
/* Element types.  The fp8 ones are KV-cache types only (pkv_problem.kv_dtype), one byte an element, the OCP
 * formats: E4M3 is e4m3 "fn" (torch.float8_e4m3fn: no infinities, one NaN code per sign, largest finite 448),
 * E5M2 is e5m2 (torch.float8_e5m2: infinities and NaNs as IEEE, largest finite 57344). */
typedef enum pkv_dtype {
    PKV_DTYPE_FP16 = 0,
    PKV_DTYPE_BF16 = 1,
    PKV_DTYPE_FP32 = 2,
    PKV_DTYPE_FP8_E4M3 = 3,
    PKV_DTYPE_FP8_E5M2 = 4
} pkv_dtype;

/* NHD: k_cache [num_pages, page_size, num_kv_heads, head_dim];
 * HND: k_cache [num_pages, num_kv_heads, page_size, head_dim].  Same for v_cache. */
typedef enum pkv_layout { PKV_LAYOUT_NHD = 0, PKV_LAYOUT_HND = 1 } pkv_layout;

typedef struct pkv_problem {
    int32_t num_qo_heads;  /* Hq, at most 4096 */
    int32_t num_kv_heads;  /* Hkv; Hq % Hkv == 0, G = Hq / Hkv in [1, 16] (MQA when Hkv = 1, Hq <= 16) */
    int32_t head_dim;      /* 64, 128 or 256 */
    int32_t page_size;     /* tokens per page, 1..256 */
    int64_t num_pages;     /* size of the page pool (required); page ids must lie in [0, num_pages) */
    pkv_layout layout;
    pkv_dtype dtype;       /* q and o (and the caches unless kv_dtype says otherwise): FP16 or BF16; lse is
                            * always fp32 */
    float sm_scale;        /* <= 0 selects 1 / sqrt(head_dim); at most 1e20 (fp16 scores then stay finite in
                            * float; bf16 inputs whose q.k overflows float give non-finite outputs) */
    float logits_soft_cap; /* > 0: each score s = sm_scale q.k becomes cap x tanh(s / cap) before the
                            * softmax (Gemma-2: 50); 0: none */
    int32_t window;        /* > 0: sliding-window attention, each row attends to its last `window` tokens
                            * only (FlashInfer's window_left + 1); 0: every token.  The planner plans the
                            * attended tokens only */
    /* The element type of k_cache and v_cache.  PKV_DTYPE_FP8_E4M3 or PKV_DTYPE_FP8_E5M2: an fp8 cache of one
     * byte an element (q and o stay dtype, which must then be FP16 or BF16: else PKV_ERR_INVALID_ARGUMENT),
     * dequantized as stored value x scale (pkv_tensors.k_scale, v_scale) and quantized by pkv_append_kv.
     * 0 - what zero-initialising and pkv_problem_default leave - or dtype itself: the caches hold dtype (an
     * fp16 cache beside bf16 q, or the reverse, is not offered).  Other values: PKV_ERR_UNSUPPORTED_DTYPE.
     * Every stride, page size and byte count of the caches is in elements of this type (fp8: bytes); the
     * planner's counters and cost model count one byte per fp8 element.  The CUDA backend reads fp8 caches
     * with its register kernel (heads in M) on every route and G, widening each value exactly to dtype. */
    pkv_dtype kv_dtype;
} pkv_problem;

/* Fills p with the defaults of the `paper` shape (Hq 32, Hkv 8, d 128, page 16, NHD, fp16 q, o and caches
 * (kv_dtype 0)).  NULL: nothing. */
PKV_API void pkv_problem_default(pkv_problem *p);

/* The page table in CSR form (host arrays, as FlashInfer's plan takes them).
 * Row i owns pages kv_page_indices[kv_indptr[i] .. kv_indptr[i+1]) and its true length seq_lens[i]
 * (0 .. 2^30 tokens; longer rows fail with PKV_ERR_INVALID_ARGUMENT) must fit in them.  kv_page_indices
 * may be NULL in pkv_plan_step when the caller only wants a schedule (page ids are then checked by
 * pkv_check_page_table or trusted). */
typedef struct pkv_page_table {
    int32_t batch_size;
    const int32_t *kv_indptr;       /* [batch_size + 1] */
    const int32_t *kv_page_indices; /* [kv_indptr[batch_size]] */
    const int32_t *seq_lens;        /* [batch_size] */
} pkv_page_table;

/* Validates the whole page table against the problem (indptr, lengths, page ids); pkv_plan_step runs
 * the same checks. */
PKV_API pkv_status pkv_check_page_table(const pkv_problem *problem, const pkv_page_table *table);

/* Converts a vLLM-style padded block table [batch_size, max_pages] (row-major, entries past a row's
 * page count are ignored) into CSR: indptr_out [batch_size + 1], indices_out [capacity].
 * Row i uses ceil(seq_lens[i] / page_size) pages.  Fails with PKV_ERR_LENGTH_EXCEEDS_PAGES if a row
 * would need more than max_pages pages, PKV_ERR_INVALID_ARGUMENT if capacity is too small. */
PKV_API pkv_status pkv_block_table_to_csr(const int32_t *block_table, int32_t batch_size, int32_t max_pages,
                                          const int32_t *seq_lens, int32_t page_size, int32_t *indptr_out,
                                          int32_t *indices_out, int64_t capacity);

/* ------------------------------------------------------------------------------------------------
 * Context and backends.
 * ---------------------------------------------------------------------------------------------- */
typedef enum pkv_backend_kind {
    PKV_BACKEND_CPU = 0,
    PKV_BACKEND_CUDA = 1,
    PKV_BACKEND_BEST = 2 /* CUDA when a GPU is present and the build has CUDA, else CPU */
} pkv_backend_kind;

typedef struct pkv_context pkv_context;

typedef struct pkv_context_config {
    pkv_backend_kind backend;
    int32_t device;      /* CUDA device ordinal */
    int32_t num_threads; /* CPU backend threads; <= 0: number of online processors */
    /* CUDA backend on sm_90 and newer: 1 (the default) launches a run's kernels as programmatic
     * dependents (PDL) of the kernel before them on the stream, so their CTAs are scheduled while that
     * kernel drains instead of after it; they read q, the pages, K, V and write outputs only once it
     * has completed, so any kernel may come before a run.  0: plain stream order (the merge kernel
     * still follows the attention kernel by PDL). */
    int32_t pdl;
    /* Bounds mode, for a server whose page tables may be corrupt (a bug in its block manager, memory
     * written by something else).  CUDA backend: 1 makes every decode kernel check each page id it reads
     * from kv_page_indices against [0, num_pages) before it reads that page; the first kernel thread that
     * finds one outside records it (pkv_context_page_fault), prints it on stdout ("persistentkv: page id
     * ... (row r, KV head h, page j of the row)") and traps: the launch fails with an illegal-instruction
     * error, which the stream reports at its next synchronization, and the CUDA context cannot be used
     * again (the process must restart it).  0 (the default): no check, no cost; an id outside the pool is
     * then read as zeros by the tensor-copy kernels or from wherever it points by the others.  The CPU
     * backend always checks every id a run reads and fails the run with PKV_ERR_PAGE_OUT_OF_RANGE. */
    int32_t check_pages;
} pkv_context_config;

/* A page id found outside the pool by a run: where it was read and what it was. */
typedef struct pkv_page_fault {
    int32_t row;        /* the row (request) whose page it is */
    int32_t kv_head;    /* the KV head being read */
    int32_t page;       /* its place in the row's pages: kv_page_indices[kv_indptr[row] + page] */
    int32_t page_id;    /* the id read there */
} pkv_page_fault;

/* The first page fault a run of the context met (CUDA: in bounds mode, check_pages = 1; CPU: the one its
 * failed run named).  Returns 1 and fills *out when there is one, 0 when none was met (or for NULL). */
PKV_API int pkv_context_page_fault(const pkv_context *ctx, pkv_page_fault *out);

/* The defaults: the best backend, device 0, every processor, PDL on, bounds mode off.  NULL: nothing. */
PKV_API void pkv_context_config_default(pkv_context_config *cfg);

/* Creates a context on the configured backend (cfg NULL: the defaults).  At creation the context reads
 * two environment variables, the only ones the library reads: PKV_POLICY=file, a policy file
 * (pkv_cost_model_load) that replaces the backend's default cost model on contexts of the backend it was
 * measured on - a file that does not load, or was measured with another parallelism, fails the creation;
 * and PKV_TUNING=key=value,... (experiments and tests: docs/tuning.md), whose unknown keys or bad values
 * fail the creation.  On failure *ctx is NULL. */
PKV_API pkv_status pkv_context_create(const pkv_context_config *cfg, pkv_context **ctx);
PKV_API void pkv_context_free(pkv_context *ctx); /* accepts NULL */
PKV_API pkv_backend_kind pkv_context_backend(const pkv_context *ctx);
/* Parallel units the planner splits work over: SM count (CUDA) or thread count (CPU); 0 for NULL. */
PKV_API int32_t pkv_context_parallelism(const pkv_context *ctx);
/* Human-readable device name ("cpu (2 threads)", "NVIDIA H200 (132 SMs, sm_90)"); "" for NULL. */
PKV_API const char *pkv_context_device_name(const pkv_context *ctx);
/* 1 if this build has the CUDA backend and a device is visible, else 0. */
PKV_API int pkv_cuda_available(void);

/* ------------------------------------------------------------------------------------------------
 * Plans.
 * ---------------------------------------------------------------------------------------------- */
typedef enum pkv_route {
    PKV_ROUTE_AUTO = 0,      /* the context's policy picks (the cost model, or the rule of pkv_plan_step) */
    PKV_ROUTE_SINGLE = 1,    /* one task per (row, KV head); no merge */
    PKV_ROUTE_SPLIT = 2,     /* rectangular (row, KV head, S) grid over true lengths + merge */
    PKV_ROUTE_BUCKETED = 3,  /* rows grouped by length bucket, split + merge launch per bucket */
    PKV_ROUTE_WORKQUEUE = 4, /* compact list of non-empty tasks, one launch + one merge launch */
    PKV_ROUTE_FUSED = 5,     /* the workqueue with the merge done in the same launch by the last task
                                of each (row, KV head) to finish: one launch per step */
    PKV_ROUTE_COUNT_ = 6
} pkv_route;

/* "auto", "single", ...; "unknown" for values outside the enum. */
PKV_API const char *pkv_route_name(pkv_route route);
/* Parses "auto", "single", "split", "bucketed", "workqueue", "fused". */
PKV_API pkv_status pkv_route_parse(const char *name, pkv_route *route);

typedef struct pkv_plan_options {
    pkv_route route;
    int32_t parallelism;       /* <= 0: the context's (SMs or threads); at most 2^16 */
    int32_t ctas_per_unit;     /* target resident tasks per parallel unit; <= 0: backend default; at most 1024 */
    int32_t num_splits;        /* SPLIT/BUCKETED: > 0 forces S (at most max_splits); <= 0 chooses by the rule */
    int32_t chunk_pages;       /* WORKQUEUE: > 0 forces the chunk size in pages; <= 0 chooses; at most
                                * 2^30 tokens (chunk_pages x page_size) */
    int32_t min_chunk_tokens;  /* smallest split worth making; <= 0: 128 tokens */
    int32_t max_splits;        /* cap on splits of one (row, KV head); <= 0: 256; at most 2^16 */
    /* > 0: a graph-stable plan for batches of up to graph_max_batch rows (CUDA graphs in serving:
     * capture a step once, replay it for every later step).  Its launches - grid sizes, kernels,
     * parameters, workspace layout - depend only on the problem, the tensors, graph_max_batch,
     * graph_tasks and the context, never on the lengths: the tasks run on a fixed grid of
     * graph_tasks CTAs (those past the step's task count exit before reading anything) and the merges
     * on one of graph_max_batch x Hkv.  So a CUDA graph captured running one such plan replays any
     * later one once it is uploaded (pkv_plan_upload, one copy, outside the graph), when both have the
     * same pkv_plan_graph_signature.  The route is the work queue (route AUTO or WORKQUEUE; any other
     * is PKV_ERR_UNSUPPORTED); the workspace is pkv_plan_workspace_size, the same for every step. */
    int32_t graph_max_batch;
    /* graph-stable plans: CTAs of the task grid; <= 0: the default, the most tasks the planner gives any
     * batch of up to graph_max_batch rows (one wave of the resident CTAs below 128 (row, KV head) pairs,
     * else 4 waves or more; at most max_splits tasks per (row, KV head) and 2^24), so every step is planned
     * as a plain work-queue step; raised to graph_max_batch x Hkv if below.  A smaller grid caps the
     * step's tasks (fewer, longer splits).  The surplus CTAs cost some kernel time against the plain work
     * queue (docs/benchmarks.md): the price of replaying one graph.  A graph_tasks, or a graph_max_batch x
     * Hkv, past 2^24 is PKV_ERR_INVALID_ARGUMENT. */
    int32_t graph_tasks;
} pkv_plan_options;

/* The defaults: route AUTO, every other field 0 (the planner chooses).  NULL: nothing. */
PKV_API void pkv_plan_options_default(pkv_plan_options *opts);

/* A task: attention of one (row, KV head) over tokens [tok_begin, tok_end) for all G query heads.
 * state_slot < 0: the task covers the whole row and writes o/lse directly; otherwise it writes the
 * partial state slot and `merge` is the index of the merge that combines it (else -1).
 * page_base = kv_indptr[row]. */
typedef struct pkv_task {
    int32_t row, kv_head, tok_begin, tok_end, page_base, state_slot, merge;
} pkv_task;

/* A merge: (row, KV head) whose state lives in slots [first_slot, first_slot + count), merged in slot
 * order.  count == 0 marks an empty row (N = 0): o = 0, lse = -inf.  Merges of split rows come
 * before the merges of empty rows within a phase. */
typedef struct pkv_merge {
    int32_t row, kv_head, first_slot, count;
} pkv_merge;

/* One launch group: tasks [task_begin, task_end) then merges [merge_begin, merge_end).
 * WORKQUEUE and SPLIT have one phase; BUCKETED one per non-empty bucket. */
typedef struct pkv_phase {
    int32_t task_begin, task_end, merge_begin, merge_end;
    int32_t grid_splits;  /* SPLIT/BUCKETED/SINGLE: S of the rectangular grid; WORKQUEUE: 0 */
    int32_t row_begin, row_end; /* rows of this phase in the order of pkv_plan_rows (rect routes) */
} pkv_phase;

/* Per-row schedule of the rectangular routes, in the order the plan runs them (pkv_plan_rows). */
typedef struct pkv_row_sched {
    int32_t row, seq_len, page_base, chunk_tokens, num_splits, slot_base;
    int32_t tok_begin; /* first token the row attends to (a sliding window's start; else 0); splits cut
                        * [a, seq_len) in chunks from a = tok_begin - tok_begin % page_size, the first
                        * one starting at tok_begin */
} pkv_row_sched;

typedef struct pkv_counters {
    int64_t launches;          /* kernel launches per layer */
    int64_t tasks;             /* non-empty tasks */
    int64_t grid_ctas;         /* CTAs launched (rect routes include empty splits) */
    int64_t merges;            /* merge entries (split rows + empty rows) */
    int64_t kv_bytes;          /* K and V bytes that must be read */
    int64_t qo_bytes;          /* q read + o written + lse written */
    int64_t merge_state_bytes; /* partial states written and read back */
    int64_t total_tokens;      /* sum of the attended lengths */
} pkv_counters;

typedef struct pkv_plan pkv_plan;

PKV_API pkv_status pkv_plan_create(pkv_plan **plan);
PKV_API void pkv_plan_free(pkv_plan *plan); /* accepts NULL */

/* Plans one decode step.  Reuses the plan's storage (allocates only to grow).  Validates the problem,
 * the options and the page table.  Host only; never touches device memory.  AUTO: with a cost model set
 * on the context (pkv_context_set_cost_model; the CUDA backend sets one for its device) the candidate
 * routes' predicted times are compared in one O(B) pass and the fastest is planned; without one, the
 * rule: SINGLE when the non-empty (row, KV head) pairs fill the parallel units and the batch is even
 * (WORKQUEUE when it is ragged: longest row above 1.25 x the mean), WORKQUEUE for one non-empty row of
 * 4096 tokens or more, FUSED otherwise. */
PKV_API pkv_status pkv_plan_step(pkv_context *ctx, const pkv_problem *problem, const pkv_page_table *table,
                                 const pkv_plan_options *opts, pkv_plan *plan);

/* pkv_plan_step without a context (host tools, tests): opts->parallelism must be set; AUTO uses the rule. */
PKV_API pkv_status pkv_plan_step_host(const pkv_problem *problem, const pkv_page_table *table,
                                      const pkv_plan_options *opts, pkv_plan *plan);

/* Read-only views of a plan (NULL plan: AUTO, NULL, 0).  The arrays live until the plan is re-planned
 * or freed. */
PKV_API pkv_route pkv_plan_route(const pkv_plan *plan);
PKV_API const pkv_counters *pkv_plan_counters(const pkv_plan *plan);
PKV_API int32_t pkv_plan_num_tasks(const pkv_plan *plan);
PKV_API const pkv_task *pkv_plan_tasks(const pkv_plan *plan);
PKV_API int32_t pkv_plan_num_merges(const pkv_plan *plan);
PKV_API const pkv_merge *pkv_plan_merges(const pkv_plan *plan);
PKV_API int32_t pkv_plan_num_phases(const pkv_plan *plan);
PKV_API const pkv_phase *pkv_plan_phases(const pkv_plan *plan);
PKV_API int32_t pkv_plan_num_rows(const pkv_plan *plan);
PKV_API const pkv_row_sched *pkv_plan_rows(const pkv_plan *plan);

/* Bytes of workspace this plan needs on its backend (plan data + partial states). */
PKV_API size_t pkv_plan_workspace_size(const pkv_plan *plan);
/* An upper bound of pkv_plan_workspace_size for any plan of this problem with up to max_batch rows
 * under the given options (defaults if NULL) on this context: allocate once, plan every step into it. */
PKV_API pkv_status pkv_workspace_size(pkv_context *ctx, const pkv_problem *problem, int32_t max_batch,
                                      const pkv_plan_options *opts, size_t *bytes);
/* A graph-stable plan's launch signature (pkv_plan_options.graph_max_batch): equal for two plans whose
 * runs launch the same kernels with the same parameters (problem, capacities, route) on the same
 * context and tensors, so a graph captured running one replays the other after pkv_plan_upload.
 * 0 for other plans (a graph replays those only with the very plan it was captured with). */
PKV_API uint64_t pkv_plan_graph_signature(const pkv_plan *plan);
/* Tasks the plan's grid holds (graph-stable plans: graph_tasks as resolved; else its task count). */
PKV_API int32_t pkv_plan_grid_tasks(const pkv_plan *plan);
/* Checks the plan's internal consistency against the lengths it was planned for: every attended token of
 * every (row, KV head) covered exactly once, slots unique, merges consistent with tasks, counters
 * consistent.  PKV_ERR_INVALID_ARGUMENT with the first violation in pkv_last_error(). */
PKV_API pkv_status pkv_plan_validate(const pkv_plan *plan, const int32_t *seq_lens);

/* ------------------------------------------------------------------------------------------------
 * The policy behind PKV_ROUTE_AUTO: a roofline cost model of a plan's time, with coefficients that
 * `pkv calibrate` fits on a GPU and writes to a policy file (docs/benchmarks.md section 4 gives the
 * model's form).  The CUDA backend sets defaults derived from its device at context creation.
 * ---------------------------------------------------------------------------------------------- */
typedef enum pkv_cost_coef {
    PKV_COEF_CONST_US,        /* us per step */
    PKV_COEF_LAUNCH_US,       /* us per launch */
    PKV_COEF_FUSED_MERGE,     /* us per MB of the largest merge, merged by the last CTA (fused) */
    PKV_COEF_MERGE,           /* us per MB of the largest merge, merge kernel */
    PKV_COEF_US_PER_MB,       /* 1 / read bandwidth */
    PKV_COEF_IDLE_US_PER_MB,  /* us per MB of the last wave's empty slots */
    PKV_COEF_RHO,             /* MB of device streaming per token of one task's critical path */
    PKV_COEF_P,               /* soft-max exponent of the bandwidth and critical-path terms (0: max) */
    PKV_COST_COEFS
} pkv_cost_coef;

/* The terms of a plan the model weighs (lab/pkv_lab.h documents each and the model's formula). */
typedef enum pkv_cost_term {
    PKV_TERM_LAUNCHES,   /* kernel launches per layer */
    PKV_TERM_MB,         /* MB moved: K, V, q, o and partial states */
    PKV_TERM_LONGEST_MB, /* KV MB of the longest task */
    PKV_TERM_MERGE_MB,   /* partial states of the largest merge, MB */
    PKV_TERM_TASKS,      /* tasks that read KV */
    PKV_TERM_SLOTS,      /* resident task slots */
    PKV_TERM_TASK_MB,    /* mean KV MB of a task */
    PKV_TERM_TOKEN_MB,   /* KV MB per token of one task */
    PKV_TERM_RECT,       /* 1 for a rectangular grid in row order, else 0 */
    PKV_TERM_FUSED,      /* 1 when the last CTA of a split merges it, else 0 */
    PKV_COST_TERMS
} pkv_cost_term;

typedef struct pkv_cost_model {
    double coef[PKV_COST_COEFS]; /* finite and >= 0; rho > 0; p 0 or in [1, 16] */
    int32_t parallelism;  /* SMs (or threads) the model was measured with */
    int32_t cuda_version; /* CUDA runtime version of the measurements (0: CPU) */
    char device[128];     /* device name of the measurements */
    double rms_us;        /* root-mean-square error of the fit */
    int32_t samples;      /* measurements behind the fit */
} pkv_cost_model;

/* Reads a policy file written by `pkv calibrate` into *m (PKV_ERR_IO, or PKV_ERR_PARSE naming the line). */
PKV_API pkv_status pkv_cost_model_load(const char *path, pkv_cost_model *m);
/* Sets the model AUTO uses on this context (copied); NULL clears it, and AUTO then uses the rule of
 * pkv_plan_step.  PKV_ERR_INVALID_ARGUMENT for coefficients out of their ranges. */
PKV_API pkv_status pkv_context_set_cost_model(pkv_context *ctx, const pkv_cost_model *m);
/* Copies the model AUTO uses on this context into *m: 1, or 0 when none is set. */
PKV_API int pkv_context_get_cost_model(const pkv_context *ctx, pkv_cost_model *m);

/* ------------------------------------------------------------------------------------------------
 * Run.
 * ---------------------------------------------------------------------------------------------- */
typedef struct pkv_tensors {
    /* Every pointer at its element's alignment (q and o 2 bytes, k_cache and v_cache their kv_dtype's: 2, or 1
     * for fp8, lse, kv_page_indices and the per-head scales 4, the workspace 8; else PKV_ERR_INVALID_ARGUMENT);
     * CUDA backend: q, k_cache, v_cache, o and the workspace 16-byte aligned. */
    const void *q;                  /* [B, Hq, d]; rows q_row_stride elements apart */
    const void *k_cache;            /* NHD or HND pages, see pkv_layout */
    const void *v_cache;
    const int32_t *kv_page_indices; /* same content as the plan's table, in the backend's memory */
    void *o;                        /* [B, Hq, d]; rows o_row_stride elements apart */
    float *lse;                     /* [B, Hq] or NULL */
    /* Elements from one page to the next in k_cache and in v_cache; 0: dense pools, page_size x Hkv
     * x head_dim.  A cache that interleaves K and V per page (FlashInfer's and vLLM's [num_pages, 2,
     * ...] tensor) is k_cache = its start, v_cache = k_cache + page_size x Hkv x head_dim elements,
     * kv_page_stride = 2 x page_size x Hkv x head_dim.  In elements of kv_dtype (fp8: bytes).  At least one
     * dense page; a multiple of 8 elements on the CUDA backend (16 bytes of fp16 or bf16, 8 of fp8). */
    int64_t kv_page_stride;
    /* Elements from one row (request) of q to the next, and of o; 0: dense, Hq x head_dim.  Each row's
     * Hq x head_dim values stay contiguous, so a q that is the query part of a fused QKV projection
     * ([B, (Hq + 2 Hkv) x head_dim], as serving stacks split it) is q = its start and q_row_stride =
     * (Hq + 2 Hkv) x head_dim, read in place.  At least Hq x head_dim (rows do not overlap); a multiple
     * of 8 on the CUDA backend.  Elements between the rows of o are never written; lse stays [B, Hq]. */
    int64_t q_row_stride;
    int64_t o_row_stride;
    /* The dequantization scales of an fp8 cache (pkv_problem.kv_dtype): a stored element times its scale is
     * the real value, K and V apart, as vLLM's and FlashInfer's k_scale and v_scale (float(stored) x scale,
     * in fp32).  Run-time arguments, so one plan serves every layer of a step whatever each layer's scales.
     * Per tensor: k_scale, v_scale; 0 (what zero-initialising leaves) means 1.0; negative, NaN or infinite:
     * PKV_ERR_INVALID_ARGUMENT.  Per KV head: k_head_scales and v_head_scales, [Hkv] floats each in the
     * backend's memory (as kv_page_indices; CPU: host), each entry positive and finite (the CPU backend checks
     * them: PKV_ERR_INVALID_ARGUMENT); a tensor with per-head scales takes no per-tensor one (its k_scale or
     * v_scale 0 or 1, else PKV_ERR_INVALID_ARGUMENT); NULL: per tensor.  A cache of dtype (fp16, bf16) is read
     * as it is: its scales must be 0 or 1 and the per-head pointers NULL (PKV_ERR_INVALID_ARGUMENT).
     * A NaN stored in a token a row attends to (an fp8 NaN code) makes that row's o NaN for every query head
     * of the token's KV head, and its lse too when the NaN is in K (both backends, every route); slots no row
     * attends to are never read, whatever they hold.  e5m2 infinities go through the float arithmetic as
     * they are. */
    float k_scale;
    float v_scale;
    const float *k_head_scales; /* [Hkv] or NULL */
    const float *v_head_scales; /* [Hkv] or NULL */
} pkv_tensors;

/* Executes the plan: tasks then merges, phase by phase.  CPU backend: host pointers, stream
 * ignored, workspace is host memory.  CUDA backend: device pointers, stream is a cudaStream_t
 * (NULL: default stream), workspace is device memory; the plan is uploaded into the workspace when
 * it changed (one async copy: straight from the plan when it was planned on a CUDA context, whose
 * plans keep their storage in page-locked memory, else out of one of the context's few page-locked
 * staging buffers, allocated at its first uploads; the call does not wait for the stream's earlier work,
 * and the plan may be re-planned as soon as it returns: up to four uploads of a plan object may be
 * pending before its next pkv_plan_step waits for the oldest) and nothing else is allocated, so a run can be captured in a
 * CUDA graph once its plan is uploaded (see pkv_plan_upload).  A captured graph replays the plan it was
 * captured with (its grid sizes, and for a one-row phase the row's schedule, are launch
 * parameters): capture again after planning a new step - or plan graph-stable steps
 * (pkv_plan_options.graph_max_batch): upload each new one and replay.  A workspace serves one stream at a
 * time: the partial states (and the fused route's arrival counters) live in it. */
PKV_API pkv_status pkv_run(pkv_context *ctx, const pkv_plan *plan, void *workspace, size_t workspace_bytes,
                           const pkv_tensors *tensors, void *stream);

/* Uploads the plan into the workspace now (CUDA: one async copy on the stream); a no-op on the CPU backend. */
PKV_API pkv_status pkv_plan_upload(pkv_context *ctx, const pkv_plan *plan, void *workspace,
                                   size_t workspace_bytes, void *stream);

/* ------------------------------------------------------------------------------------------------
 * The page manager (docs/pages.md): the KV cache's pages on the host side, as plain data - it never
 * touches device memory.  A pool of num_pages pages of page_size tokens; requests (ids the caller picks
 * in [0, max_requests), as SGLang's req_pool_idx) own pages: created with a prompt length, extended by
 * tokens (a new page only when the last one is full), truncated, forked and freed.  Free pages are
 * reused last-in first-out (hot pages first).  Each page has a reference count: 1 for an owned page,
 * more when forked requests share a read-only prefix.  A request that writes into a shared partial last
 * page gets its own copy first (copy-on-write): the extend that needs one returns it in *copy, and the
 * caller copies that page (pkv_copy_pages) before appending into it.  Every operation either succeeds or
 * changes nothing and returns a specific status (PKV_ERR_POOL_EXHAUSTED when pages run out: the caller
 * can preempt a request and retry).  A pool is used by one thread at a time.
 *
 * A decode step: pkv_request_extend(r, 1) for each live row, pkv_page_pool_table for the rows (CSR,
 * O(B + pages), no allocation), pkv_append_kv of the step's new K and V, then pkv_plan_step and pkv_run.
 * ---------------------------------------------------------------------------------------------- */
typedef struct pkv_page_pool pkv_page_pool;

/* The counters of a pool (exact at every moment). */
typedef struct pkv_page_pool_stats {
    int64_t num_pages;      /* the pool's size */
    int64_t pages_used;     /* pages with a reference (a shared page counts once) */
    int64_t pages_free;     /* num_pages - pages_used */
    int64_t peak_used;      /* the most pages_used has been since creation */
    int64_t pages_shared;   /* pages with more than one reference (fork) */
    int64_t live_requests;  /* requests created (or forked) and not freed */
    int64_t tokens;         /* sum of the live requests' lengths */
    int64_t fragmentation;  /* internal fragmentation: unused token slots in the live requests' last pages,
                             * sum over requests (a shared last page counts once per request) */
    int64_t cow_copies;     /* copy-on-write page copies handed out since creation */
} pkv_page_pool_stats;

/* A page copy: the whole page src_page (K and V) onto dst_page (copy-on-write, pkv_copy_pages). */
typedef struct pkv_page_copy {
    int32_t src_page, dst_page;
} pkv_page_copy;

/* A pool of num_pages pages (1 .. 2^31 - 1) of page_size tokens (1 .. 256) for request ids in
 * [0, max_requests) (1 .. 2^20).  Allocates everything but the requests' page lists here.  On failure
 * *pool is NULL. */
PKV_API pkv_status pkv_page_pool_create(int64_t num_pages, int32_t page_size, int32_t max_requests,
                                        pkv_page_pool **pool);
PKV_API void pkv_page_pool_free(pkv_page_pool *pool); /* accepts NULL */
PKV_API pkv_status pkv_page_pool_get_stats(const pkv_page_pool *pool, pkv_page_pool_stats *stats);
/* References of a page (0: free); -1 for a NULL pool or a page outside [0, num_pages). */
PKV_API int32_t pkv_page_pool_page_refs(const pkv_page_pool *pool, int32_t page);

/* Creates request req with prompt_len tokens (0 .. 2^30): ceil(prompt_len / page_size) fresh pages.  req
 * must not be live (a freed id may be created again). */
PKV_API pkv_status pkv_request_create(pkv_page_pool *pool, int32_t req, int32_t prompt_len);
/* Releases the request's pages (a page returns to the free list when its last reference goes).
 * PKV_ERR_REQUEST_FREED for a double free. */
PKV_API pkv_status pkv_request_free(pkv_page_pool *pool, int32_t req);
/* Grows the request by n tokens (n >= 0; a decode step is 1; a chunk of prefill more): new pages only
 * where the last one is full.  When the last page is partial and shared, the request first takes a
 * fresh copy of it: *copy (may be NULL only when the caller never forks) is then that copy and the
 * return is PKV_OK with copy->src_page >= 0; otherwise copy->src_page = copy->dst_page = -1. */
PKV_API pkv_status pkv_request_extend(pkv_page_pool *pool, int32_t req, int32_t n, pkv_page_copy *copy);
/* Shortens the request to new_len tokens (<= its length: else PKV_ERR_BEYOND_LENGTH), releasing the
 * pages past ceil(new_len / page_size) (speculative decoding's rejected tokens, a rollback). */
PKV_API pkv_status pkv_request_truncate(pkv_page_pool *pool, int32_t req, int32_t new_len);
/* Creates request dst as a fork of live request src (parallel sampling, a shared system prompt): the
 * same length and the same pages, each now shared (read-only: a write into the shared partial last page
 * copies it first, see pkv_request_extend).  Takes no page, so it never exhausts the pool. */
PKV_API pkv_status pkv_request_fork(pkv_page_pool *pool, int32_t src, int32_t dst);
/* The request's length in tokens. */
PKV_API pkv_status pkv_request_length(const pkv_page_pool *pool, int32_t req, int32_t *length);
/* The request's pages in order into pages_out [capacity] (NULL with capacity 0: the count only);
 * *count = its page count.  PKV_ERR_INVALID_ARGUMENT when capacity is below it. */
PKV_API pkv_status pkv_request_pages(const pkv_page_pool *pool, int32_t req, int32_t *pages_out, int64_t capacity,
                                     int32_t *count);
/* The request's pages from index first on (first <= its page count) into pages_out [capacity]; *count = its
 * page count.  O(pages copied): what a server that keeps each row's page ids in place (one slot of a fixed
 * stride per row, on the device) reads per step - the last page (a copy-on-write replaces it) and a new one. */
PKV_API pkv_status pkv_request_pages_from(const pkv_page_pool *pool, int32_t req, int32_t first, int32_t *pages_out,
                                          int64_t capacity, int32_t *count);

/* The page-table entries (sum of the pages) of the rows reqs [batch_size] into *num_indices: the
 * capacity pkv_page_pool_table needs.  O(B). */
PKV_API pkv_status pkv_page_pool_table_size(const pkv_page_pool *pool, const int32_t *reqs, int32_t batch_size,
                                            int64_t *num_indices);
/* Writes the CSR page table of the live requests reqs [batch_size] (row i = request reqs[i]) into the
 * caller's arrays, as pkv_plan_step and FlashInfer take it: kv_indptr [batch_size + 1],
 * kv_page_indices [capacity], and optionally (NULL: skipped) kv_last_page_len [batch_size] (FlashInfer's
 * paged_kv_last_page_len: tokens in the row's last page, 0 for an empty row) and seq_lens [batch_size].
 * O(B + pages), allocates nothing.  Nothing is written when it fails. */
PKV_API pkv_status pkv_page_pool_table(const pkv_page_pool *pool, const int32_t *reqs, int32_t batch_size,
                                       int32_t *kv_indptr, int32_t *kv_page_indices, int64_t capacity,
                                       int32_t *kv_last_page_len, int32_t *seq_lens);
/* The debug check of ownership: table is a step's page table (host arrays) whose row i is request
 * reqs[i]; every page the row names must be, at its position, the request's own page
 * (PKV_ERR_FOREIGN_PAGE names the first that is not), its length must be within the request's
 * (PKV_ERR_BEYOND_LENGTH), and the table must pass the checks of pkv_check_page_table for a pool of
 * this size (its statuses).  O(B + pages). */
PKV_API pkv_status pkv_page_pool_check_table(const pkv_page_pool *pool, const int32_t *reqs,
                                             const pkv_page_table *table);

/* ------------------------------------------------------------------------------------------------
 * Appending K and V into the pages (docs/pages.md): the step's new tokens written into the slots the
 * page table gives them, in the problem's layout (NHD or HND) and dtype, on the context's backend (CPU:
 * host pointers; CUDA: device pointers, on the stream, nothing allocated, so a graph can capture it).
 * ---------------------------------------------------------------------------------------------- */
typedef struct pkv_append_tensors {
    const void *k;                   /* [num_tokens, Hkv, d] the new keys; tokens k_token_stride elements apart */
    const void *v;                   /* [num_tokens, Hkv, d] the new values */
    int64_t k_token_stride;          /* 0: dense, Hkv x d (a fused QKV projection's k: its row stride) */
    int64_t v_token_stride;
    void *k_cache;                   /* the pools, as pkv_tensors (NHD or HND pages) */
    void *v_cache;
    int64_t kv_page_stride;          /* as pkv_tensors.kv_page_stride (0: dense) */
    const int32_t *kv_indptr;        /* [B + 1] the rows' pages (the step's table, after the extend) */
    const int32_t *kv_page_indices;  /* [kv_indptr[B]] */
    /* the rows' lengths (after the extend), one of: FlashInfer's kv_last_page_len [B] (tokens in the
     * last page), or seq_lens [B]; needed by the ragged and decode forms */
    const int32_t *kv_last_page_len;
    const int32_t *seq_lens;
    /* where token t goes - one of three forms:
     *   FlashInfer's: batch_indices [num_tokens] (its row) and positions [num_tokens] (its position in the row);
     *   ragged (prefill): append_indptr [B + 1], the row's tokens [append_indptr[i], append_indptr[i+1]),
     *     which are the row's last ones (positions length - n_i .. length - 1);
     *   decode (all three NULL): num_tokens == B, token i is row i's last. */
    const int32_t *batch_indices;
    const int32_t *positions;
    const int32_t *append_indptr;
    /* An fp8 cache (pkv_problem.kv_dtype): k and v are dtype (fp16 or bf16) and each value is stored as
     * fp8(float(value) / scale) - the scales of pkv_tensors, with the same rules (per tensor, 0 meaning 1.0,
     * or per KV head in the backend's memory) - rounded to nearest even and saturating: a quotient beyond the
     * format's largest finite (448 for E4M3, 57344 for E5M2), infinities included, is stored as the largest
     * finite of its sign; NaN is stored as NaN.  A cache of dtype: scales 0 or 1 and no per-head pointers,
     * values copied bit for bit. */
    float k_scale;
    float v_scale;
    const float *k_head_scales; /* [Hkv] or NULL */
    const float *v_head_scales; /* [Hkv] or NULL */
} pkv_append_tensors;

/* Writes num_tokens new tokens of K and V into the pages (problem: Hkv, d, page_size, num_pages, layout,
 * dtype, kv_dtype).  The CPU backend checks every index (row, position, page id) first and writes nothing
 * when one is bad (PKV_ERR_BEYOND_LENGTH, PKV_ERR_PAGE_OUT_OF_RANGE, PKV_ERR_BAD_INDPTR); the CUDA backend
 * cannot read the indices without a sync, so its kernel skips a token whose slot is out of range instead of
 * writing it.  CUDA: k, v, the caches 16-byte aligned and the strides multiples of 8 (of 16 for an fp8
 * cache's kv_page_stride); per-head scales are read from device memory, unchecked (as the page ids). */
PKV_API pkv_status pkv_append_kv(pkv_context *ctx, const pkv_problem *problem, int32_t batch_size,
                                 int32_t num_tokens, const pkv_append_tensors *tensors, void *stream);

/* Copies whole pages of K and V (the copies of pkv_request_extend; a host array of count entries, each
 * page id in [0, num_pages), no dst twice) on the context's backend, bit for bit: kv_page_stride and the
 * pages in elements of the problem's kv_dtype (fp8: bytes).  CUDA: the copies go in the launch's parameters
 * (no upload, capturable), PKV_MAX_PAGE_COPIES per launch; the caches 16-byte aligned, the page stride a
 * multiple of 16 bytes. */
#define PKV_MAX_PAGE_COPIES 64
PKV_API pkv_status pkv_copy_pages(pkv_context *ctx, const pkv_problem *problem, const pkv_page_copy *copies,
                                  int32_t count, void *k_cache, void *v_cache, int64_t kv_page_stride, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* PERSISTENTKV_H */
