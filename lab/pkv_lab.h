/*
 * pkv_lab.h - the lab: what tools, tests and benchmarks use beside the serving API (persistentkv.h).
 *
 * The serving library does not depend on any of it.  The lab is built as a static library (pkv_lab:
 * the tools and tests link it, with the library's own objects) and as a shared one for the Python
 * package's traces and reference (libpersistentkv_lab).  Its parts:
 *   - errors: lab calls report through the library's one channel, pkv_last_error();
 *   - plan internals for tests and tools: state slots, the graph-stable counts words, planning for a
 *     described device (its capabilities) without a context;
 *   - the cost model's terms, prediction and fitting, and policy files (`pkv calibrate`);
 *   - fp16 / bf16 conversions, the float64 reference, deterministic traces and their RNG;
 *   - device helpers and timers (memory, random fill, ceilings, event timing, CUDA graphs);
 *   - test-case generators shared by the tests and `pkv check`.
 * Nothing here is part of the library's stable ABI.
 */
#ifndef PKV_LAB_H
#define PKV_LAB_H

#include "persistentkv.h"

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------
 * Errors and context hooks.
 * ---------------------------------------------------------------------------------------------- */
/* Records "status: message" as the calling thread's last error (pkv_last_error) and returns st. */
pkv_status pkv_lab_fail(pkv_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The CUDA device ordinal of a CUDA context (-1 on another backend or NULL). */
int32_t pkv_lab_context_device(const pkv_context *ctx);

/* ------------------------------------------------------------------------------------------------
 * Plan internals.
 * ---------------------------------------------------------------------------------------------- */
int32_t pkv_plan_num_state_slots(const pkv_plan *plan);
const pkv_problem *pkv_plan_problem(const pkv_plan *plan);
int32_t pkv_plan_batch_size(const pkv_plan *plan);

/* What the planner knows of a backend: parallel units, default tasks per unit, CTAs of the kernel that runs
 * [d 64, 128, 256][G <= 8, G > 8] resident per unit (0: unknown), and the page sizes whose pages the
 * backend gathers row by row (largest power-of-two divisor below this many tokens; 0: none). */
typedef struct pkv_lab_caps {
    int32_t parallelism;
    int32_t ctas_per_unit;
    int32_t resident[3][2];
    int32_t row_gather_below;
} pkv_lab_caps;
/* The capabilities a context's backend reported at creation. */
pkv_status pkv_lab_context_caps(const pkv_context *ctx, pkv_lab_caps *caps);
/* Replaces the capabilities a context's planner plans for (benchmarks of the host path that plan for another
 * device: a CPU context with a GPU's); its backend still runs every plan on its own device. */
pkv_status pkv_lab_context_set_caps(pkv_context *ctx, const pkv_lab_caps *caps);
/* pkv_plan_step as for a device with these capabilities (opts->parallelism may override caps's), without
 * a context; AUTO uses model when not NULL, else the rule. */
pkv_status pkv_lab_plan_step_caps(const pkv_lab_caps *caps, const pkv_cost_model *model, const pkv_problem *problem,
                                  const pkv_page_table *table, const pkv_plan_options *opts, pkv_plan *plan);

/* Graph-stable plans keep int32 words in the workspace at *offset (bytes), *words of them: the step's
 * task and merge counts, then the CUDA work claim's (tasks claimed, arrivals, orphan cursor; the merge
 * kernel sets them back to zero after each launch), the widest merge, and a counter per SM.  The word
 * indices: */
enum {
    PKV_LAB_COUNTS_TASKS = 0,
    PKV_LAB_COUNTS_MERGES = 1,
    PKV_LAB_COUNTS_CLAIMED = 2,
    PKV_LAB_COUNTS_ARRIVED = 3,
    PKV_LAB_COUNTS_CURSOR = 4,
    PKV_LAB_COUNTS_WIDEST = 5,
    PKV_LAB_COUNTS_SM = 8,
    PKV_LAB_MAX_COUNTS_WORDS = 8 + 256 /* the most words of any plan */
};
/* PKV_ERR_INVALID_ARGUMENT for a plan that is not graph-stable. */
pkv_status pkv_lab_plan_counts(const pkv_plan *plan, size_t *offset, int32_t *words);
/* The most partial states of one merge of the plan (0: no split merges). */
int32_t pkv_lab_plan_widest_merge(const pkv_plan *plan);
/* 1 when the plan's last step was patched over its previous emission (an incremental step), else 0. */
int32_t pkv_lab_plan_patched(const pkv_plan *plan);
/* The claim's order of the SMs in a round of tasks: SM s ranks s x m mod nsm, m this multiplier. */
int32_t pkv_lab_claim_multiplier(int32_t nsm);

/* ------------------------------------------------------------------------------------------------
 * Cost model terms, prediction and fitting (the policy behind PKV_ROUTE_AUTO; the
 * coefficients and pkv_cost_model are in persistentkv.h).
 * The terms of a plan (pkv_cost_terms; the planner computes the same for its candidate routes in
 * one O(B) pass without building them):
 *   PKV_TERM_LAUNCHES    kernel launches per layer
 *   PKV_TERM_MB          MB moved: K, V, q, o and partial states
 *   PKV_TERM_LONGEST_MB  KV MB of the longest task (one CTA's critical path)
 *   PKV_TERM_MERGE_MB    partial states of the largest merge, MB (count x G x (d + 1) x 4 bytes)
 *   PKV_TERM_TASKS       tasks that read KV (CTAs with work)
 *   PKV_TERM_SLOTS       resident task slots (SMs x CTAs per SM of the kernel that runs the problem)
 *   PKV_TERM_TASK_MB     mean KV MB of a task
 *   PKV_TERM_TOKEN_MB    KV MB per token of one task (K and V of one KV head)
 *   PKV_TERM_RECT        1 for a rectangular grid in row order (single, split), else 0
 *   PKV_TERM_FUSED       1 when the last CTA of a split merges it (fused), else 0
 * The model (roofline form, version 2; docs/benchmarks.md section 4):
 *   L = LONGEST_MB / TOKEN_MB tokens, N = TASKS, R = SLOTS, w = ceil(N / R) waves,
 *   X = MB (+ the idle end of a one-wave or row-ordered grid: with n_sat = rho / TOKEN_MB tasks
 *       needed to saturate the bandwidth and q = n_sat / min(N, R) < 1, X += rho q (L - lo) / 2,
 *       lo = max(0, 2 TASK_MB / TOKEN_MB - L)),
 *   Y = rho L (the longest task's own critical path),
 *   idle = (w > 1) (1 - n_last / R) MB R / N (empty slots of the last wave),
 *   us = const + launch x LAUNCHES + (FUSED ? fused_merge : merge) x MERGE_MB
 *        + us_per_mb x (X^p + Y^p)^(1/p) + idle_us_per_mb x idle.
 * pkv_cost_model_fit finds rho and p by a grid search and the rest by non-negative least squares
 * on relative error from measured runs; pkv_cost_model_fit_steps (`pkv calibrate`) picks among the
 * near-best pairs the one that ranks each step's measured routes best; pkv_cost_model_default
 * derives them from device properties.
 * ---------------------------------------------------------------------------------------------- */
/* The terms: pkv_cost_term (persistentkv.h). */

/* Terms of a plan (see above), for the parallelism and residency it was planned for; a plan whose last
 * pkv_plan_step failed has none (PKV_ERR_INVALID_ARGUMENT). */
pkv_status pkv_cost_terms(const pkv_plan *plan, double terms[PKV_COST_TERMS]);
/* The model's predicted time (us) of a plan with these terms; NaN if either pointer is NULL. */
double pkv_cost_predict(const pkv_cost_model *m, const double terms[PKV_COST_TERMS]);
/* Whether the policy weighs a candidate with these terms (1) or not (0): not a rectangular plan without
 * split merges (the single route, or a split route that splits nothing) whose tasks fill fewer than half
 * of the `parallelism` units.  Its time is then one task's own critical path, which the model's
 * per-token rho underestimates for long head vectors (H200, d = 256, a 4096-token window: 64 such
 * tasks took 94.9 us, predicted 69.4, where the fused route took 71.4); the work queue and fused plans
 * of the same rows stay candidates.  NULL terms: 0. */
int pkv_cost_candidate(const double terms[PKV_COST_TERMS], int32_t parallelism);
/* Defaults from device properties: SMs, read bandwidth (GB/s; <= 0: 2000), launch latency (us;
 * <= 0: 3).  NULL m: nothing. */
void pkv_cost_model_default(pkv_cost_model *m, int32_t parallelism, double read_gbps, double launch_us);
/* Fit from n measurements (terms [n][PKV_COST_TERMS], us [n]): rho and p by grid search, the
 * linear coefficients by least squares on relative error (rows weighted by 1 / us), kept
 * non-negative.  Fills coef, rms_us (absolute) and samples; keeps the identity fields. */
pkv_status pkv_cost_model_fit(int32_t n, const double *terms, const double *us, pkv_cost_model *m);
/* The same fit ranked by the choice it drives: step[i] in [0, n) names the step that measurement i
 * (one route of it) belongs to; among the (rho, p) pairs whose squared relative error is within 25%
 * of the best pair's, the one whose predicted fastest route per step has the lowest mean regret
 * against the measured fastest is kept (ties: the lower error).  step NULL: pkv_cost_model_fit. */
pkv_status pkv_cost_model_fit_steps(int32_t n, const double *terms, const double *us, const int32_t *step,
                                    pkv_cost_model *m);
/* Fills the terms from a plan's tallies (as pkv_cost_terms does; kv_mb: KV MB of all tasks). */
void pkv_cost_fill_terms(double t[PKV_COST_TERMS], int64_t launches, double mb, double longest_mb, double merge_mb,
                         int64_t tasks, int64_t slots, double kv_mb, double token_mb, int rect, int fused);
/* Writes the model as a policy file that pkv_cost_model_load reads: "persistentkv-policy 2", then key = value lines. */
pkv_status pkv_cost_model_save(const pkv_cost_model *m, const char *path);

/* ------------------------------------------------------------------------------------------------
 * fp16 / bf16 <-> float (round to nearest even), as the library converts.
 * ---------------------------------------------------------------------------------------------- */
uint16_t pkv_float_to_half(float f);
float pkv_half_to_float(uint16_t h);
uint16_t pkv_float_to_bf16(float f);
float pkv_bf16_to_float(uint16_t h);
/* fp8 (e5m2 0: e4m3 "fn", largest 448, no infinities; 1: e5m2, largest 57344): any code decoded; floats
 * encoded with round to nearest even, saturating (beyond the largest finite, infinities included: the
 * largest finite of the sign; NaN: NaN). */
float pkv_fp8_to_float(uint8_t v, int e5m2);
uint8_t pkv_float_to_fp8(float f, int e5m2);

/* ------------------------------------------------------------------------------------------------
 * Float64 reference: the definition every backend is checked against.  Inputs are host arrays: q of
 * problem->dtype, the dense page pools of its kv_dtype; o_ref [B, Hq, d] and lse_ref [B, Hq] are doubles.
 * ---------------------------------------------------------------------------------------------- */
pkv_status pkv_reference(const pkv_problem *problem, const pkv_page_table *table, const void *q,
                         const void *k_cache, const void *v_cache, double *o_ref, double *lse_ref);
/* The same with an fp8 cache's scales, as pkv_tensors takes them (0: 1.0; per-head arrays [Hkv] on the host,
 * NULL: per tensor): each element read as the double of its code times its scale. */
pkv_status pkv_reference_kv(const pkv_problem *problem, const pkv_page_table *table, const void *q,
                            const void *k_cache, const void *v_cache, float k_scale, float v_scale,
                            const float *k_head_scales, const float *v_head_scales, double *o_ref, double *lse_ref);

/* ------------------------------------------------------------------------------------------------
 * Traces (workloads.md).  A trace is a sequence of decode steps; each step lists its active rows
 * (request id, current length).  Generators are deterministic for a seed on every platform.
 * ---------------------------------------------------------------------------------------------- */
typedef enum pkv_trace_family {
    PKV_TRACE_UNIFORM = 0,
    PKV_TRACE_BIMODAL = 1,
    PKV_TRACE_ZIPF = 2,
    PKV_TRACE_BUCKETED = 3,
    PKV_TRACE_HOMOGENEOUS = 4,
    PKV_TRACE_FAMILY_COUNT_ = 5
} pkv_trace_family;

const char *pkv_trace_family_name(pkv_trace_family f);
pkv_status pkv_trace_family_parse(const char *name, pkv_trace_family *f);

typedef struct pkv_trace_config {
    pkv_trace_family family;
    uint64_t seed;
    int32_t num_requests; /* requests in the trace */
    int32_t max_active;   /* rows served per step (B in steady state) */
    int32_t max_steps;    /* stop after this many steps (<= 0: until every request finished) */
    int32_t page_size;    /* for the page permutation */
    double hole_fraction; /* fraction of unused pages in the pool, [0, 0.9] */
} pkv_trace_config;

/* Defaults of workloads.md for the family: B8 runs (24 requests, max_active 8, 48 steps), or the
 * B1 bucketed run (16 requests, max_active 1, 64 steps) for PKV_TRACE_BUCKETED. */
void pkv_trace_config_default(pkv_trace_config *cfg, pkv_trace_family family);

typedef struct pkv_trace pkv_trace;

pkv_status pkv_trace_generate(const pkv_trace_config *cfg, pkv_trace **trace);
void pkv_trace_free(pkv_trace *trace); /* accepts NULL */

int32_t pkv_trace_num_steps(const pkv_trace *t);
int32_t pkv_trace_num_requests(const pkv_trace *t);
const pkv_trace_config *pkv_trace_get_config(const pkv_trace *t);
/* Active rows of step s: count, and pointers to request ids and lengths (valid while t lives). */
int32_t pkv_trace_step(const pkv_trace *t, int32_t s, const int32_t **request_ids,
                       const int32_t **seq_lens);
/* Prompt and decode lengths of request r. */
void pkv_trace_request(const pkv_trace *t, int32_t r, int32_t *prompt_len, int32_t *decode_len);
/* Total pages of the pool (including holes) and the physical page of page j of request r. */
int64_t pkv_trace_num_pages(const pkv_trace *t);
int32_t pkv_trace_page(const pkv_trace *t, int32_t request, int32_t j);
/* Fills the CSR page table of step s: indptr [B+1], indices (capacity entries), lens [B]. */
pkv_status pkv_trace_step_table(const pkv_trace *t, int32_t s, int32_t *indptr, int32_t *indices,
                                int64_t capacity, int32_t *lens);
/* A 64-bit FNV-1a checksum of every step's rows and lengths and every request's pages. */
uint64_t pkv_trace_checksum(const pkv_trace *t);

/* Trace files: a small CSV (header comment with the config, then "step,request,seq_len" rows and
 * "page" rows).  Reading a written file gives a trace with the same checksum. */
pkv_status pkv_trace_write(const pkv_trace *t, const char *path);
pkv_status pkv_trace_read(const char *path, pkv_trace **trace);

/* Our deterministic RNG (splitmix64), exposed so tools and tests draw the same numbers. */
typedef struct pkv_rng { uint64_t state; } pkv_rng;
void pkv_rng_seed(pkv_rng *r, uint64_t seed);
uint64_t pkv_rng_next(pkv_rng *r);
/* lo + next() % (hi - lo + 1), as anchors.md defines it. */
int64_t pkv_rng_uniform_int(pkv_rng *r, int64_t lo, int64_t hi);
/* (next() >> 11) * 2^-53, in [0, 1). */
double pkv_rng_uniform01(pkv_rng *r);

/* ------------------------------------------------------------------------------------------------
 * Device helpers for tools, benchmarks and tests.  In a build without CUDA every function returns
 * PKV_ERR_BACKEND_UNAVAILABLE.
 * ---------------------------------------------------------------------------------------------- */
pkv_status pkv_dev_malloc(pkv_context *ctx, size_t bytes, void **ptr);
pkv_status pkv_dev_free(pkv_context *ctx, void *ptr);
/* The host-to-device copy and the memset return when they are done on the device. */
pkv_status pkv_dev_copy_h2d(pkv_context *ctx, void *dst, const void *src, size_t bytes);
pkv_status pkv_dev_copy_d2h(pkv_context *ctx, void *dst, const void *src, size_t bytes);
pkv_status pkv_dev_memset(pkv_context *ctx, void *dst, int value, size_t bytes);
pkv_status pkv_dev_synchronize(pkv_context *ctx);
/* Fills count fp16/bf16 values with seeded pseudo-random numbers in [-1, 1] on the device (other dtypes:
 * PKV_ERR_UNSUPPORTED_DTYPE). */
pkv_status pkv_dev_fill_random(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, uint64_t seed);
/* Fills count one-byte codes of an fp8 cache (dtype PKV_DTYPE_FP8_E4M3 or _E5M2) on the device: each the code of
 * a seeded pseudo-random value in [-1, 1] divided by scale (positive, finite; nearest even, saturating, as
 * pkv_float_to_fp8), so that code x scale lies in about [-1, 1]; a value that rounds to zero takes the smallest
 * code of its sign: no code is zero (nor NaN). */
pkv_status pkv_dev_fill_random_fp8(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, float scale,
                                   uint64_t seed);
/* The same values, written late by one CTA on the default stream, asynchronously: the kernel first lets a
 * programmatic dependent start (griddepcontrol.launch_dependents), spins delay_ns, then fills.  A run
 * queued right behind it that touched dst before its dependency wait would see the old values (tests). */
pkv_status pkv_dev_fill_random_late(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, uint64_t seed,
                                    int64_t delay_ns);
/* A device-to-device copy of bytes (a multiple of 4) written late in the same way (tests: page ids that
 * a kernel right before a run rewrites). */
pkv_status pkv_dev_copy_late(pkv_context *ctx, void *dst, const void *src, size_t bytes, int64_t delay_ns);
/* Device properties: name, SMs, L2 bytes, compute capability, CUDA runtime and driver versions, and the
 * device memory free now (cudaMemGetInfo: the soak's leak check). */
typedef struct pkv_dev_info {
    char name[128];
    int32_t sms, cc_major, cc_minor, runtime_version, driver_version;
    int64_t l2_bytes, mem_bytes, mem_free_bytes;
} pkv_dev_info;
pkv_status pkv_dev_get_info(pkv_context *ctx, pkv_dev_info *info);
/* The decode kernel a run of the plan with these tensors launches on this CUDA context: "tensor copies",
 * "tensor copies in chunks of N" (pages not a multiple of 16 tokens), "cp.async copies ..." (other such
 * pages; the rest of the name says the layout and the grids it runs on) or "registers, heads in N|M ..."
 * (static storage; "" on error). */
pkv_status pkv_dev_decode_kernel(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t, const char **name);

/* Kernel time of reps runs of the plan (CUDA events around each run; each run queued behind a short
 * spin kernel so the host's launch cost is off the clock).  Run r uses page-index set r % nsets
 * (device pointers), so KV can rotate over a pool larger than L2.  samples_us has reps entries. */
pkv_status pkv_dev_time_plan(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                             const pkv_tensors *base, const int32_t *const *page_sets, int32_t nsets,
                             int32_t warmup, int32_t reps, double *samples_us);
/* A step behind the kernel that produces its q, as in a model's layer: a small kernel that rewrites
 * q in place (a dense q: q_row_stride 0, else PKV_ERR_UNSUPPORTED; grid of up to 2 CTAs per SM;
 * trigger != 0: it calls griddepcontrol.launch_dependents at its start, as PDL-aware kernels do), then
 * pkv_run; CUDA events around the producer alone (*producer_us) and around the producer and the run
 * (*pair_us), medians over reps, timed like pkv_dev_time_plan.  With the context's PDL on, the run's
 * kernels are scheduled while the producer drains. */
pkv_status pkv_dev_time_plan_behind(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                                    const pkv_tensors *base, const int32_t *const *page_sets, int32_t nsets,
                                    int32_t warmup, int32_t reps, int trigger, double *producer_us, double *pair_us);
/* Streaming read of `bytes` from buf (16-byte loads), timed like a step; the window moves through
 * buf_bytes so L2 does not help.  Best of a few grid sizes; median over reps. */
pkv_status pkv_dev_time_read(pkv_context *ctx, const void *buf, size_t buf_bytes, size_t bytes, int32_t reps,
                             double *median_us);
/* The floor of a step's access pattern: a pure read of its pages (npages ids per set, device
 * pointers; run r uses set r % nsets), each page of K and of V read whole (page_bytes, contiguous in
 * both layouts), a warp per page; timed like a step, best of a few grid sizes, median over reps. */
pkv_status pkv_dev_time_gather(pkv_context *ctx, const void *k, const void *v, size_t page_bytes,
                               const int32_t *const *page_sets, int32_t nsets, int32_t npages, int32_t reps,
                               double *median_us);
/* Launch costs: back-to-back empty launches (us per launch), and the replay of a CUDA graph of one
 * empty kernel (us per replay). */
pkv_status pkv_dev_launch_latency(pkv_context *ctx, double *empty_us, double *graph_us);
/* Captures one pkv_run of an uploaded plan into a CUDA graph, replays it `replays` times. */
pkv_status pkv_dev_graph_run(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                             const pkv_tensors *t, int32_t replays);
/* Serving with graph-stable plans (pkv_plan_options.graph_max_batch): capture one pkv_run of the plan
 * (uploaded first) on a stream of the graph's own into an instantiated graph (*graph); then each
 * replay waits for the work queued on the default stream before it, uploads the given plan on that
 * stream (outside the graph) and replays the graph, synchronized.
 * A replay refuses a plan whose pkv_plan_graph_signature is not the captured one's. */
pkv_status pkv_dev_graph_capture(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                                 const pkv_tensors *t, void **graph);
pkv_status pkv_dev_graph_replay(pkv_context *ctx, void *graph, const pkv_plan *plan, void *ws, size_t ws_bytes);
void pkv_dev_graph_free(void *graph); /* accepts NULL */

/* ------------------------------------------------------------------------------------------------
 * Test cases: a seeded random problem generator (shape, lengths, a scattered page pool, fp16/bf16 data,
 * the CSR table), its float64 reference, output poisoning and the comparisons (relative L2 and max abs
 * error of o, lse error, "every element written"), and runs of a case on any backend (host pointers on
 * the CPU backend, device copies on the CUDA backend).  Shared by the tests and `pkv check`.
 *
 * Typical use:
 *   pkv_test_case tc;
 *   pkv_test_choices ch; pkv_test_choices_default(&ch);
 *   pkv_test_case_random(&rng, &ch, &tc);      // or pkv_test_case_build(&rng, &problem, B, lens, ...)
 *   pkv_test_case_reference(&tc);              // o_ref, lse_ref
 *   pkv_test_poison(&tc);  pkv_test_run(ctx, plan, &tc);
 *   pkv_test_unwritten(&tc) == 0, pkv_test_rel_l2(&tc) < tol, pkv_test_lse_err(&tc) < tol
 *   pkv_test_case_free(&tc);
 *
 * Data: q, K and V are uniform in [-1, 1] rounded to the dtype, never zero.  An fp8 cache (the problem's
 * kv_dtype) holds the codes of such values divided by the case's scales (per tensor, 1/4 of them 0 = 1.0,
 * else log-uniform in [1/200, 1/2]; or per KV head), never a zero code.  With poison_unused_kv set, every
 * KV slot no row reads (the tail of a row's last page, pages a row owns past its length, and the unused
 * "hole" pages of the pool) holds NaN, so a kernel that reads or mixes in a token it must not see turns
 * its output into NaN.
 * ---------------------------------------------------------------------------------------------- */
/* NaN bit patterns used to poison outputs and unused KV slots (PKV_TEST_NAN_FP8: a NaN in e4m3 and e5m2). */
#define PKV_TEST_NAN_FP16 ((uint16_t)0x7e00u)
#define PKV_TEST_NAN_BF16 ((uint16_t)0x7fc0u)
#define PKV_TEST_NAN_FP8 0x7f

/* The CPU backend's tolerances against the float64 reference (test_cpu, test_fuzz). */
#define PKV_TEST_TOL_O_FP16 1.0e-3 /* relative L2 of o */
#define PKV_TEST_TOL_O_BF16 6.0e-3
#define PKV_TEST_TOL_LSE 5.0e-5    /* |lse - ref| / max(1, |ref|), fp32 lse */

/* What the random generator may pick.  Each list has count entries (count 0: the default noted). */
typedef struct pkv_test_choices {
    const int32_t *groups;      int32_t num_groups;      /* G; default {1, 4, 8} */
    const int32_t *kv_heads;    int32_t num_kv_heads;    /* Hkv; default {1, 2} */
    const int32_t *head_dims;   int32_t num_head_dims;   /* default {64, 128} */
    const int32_t *page_sizes;  int32_t num_page_sizes;  /* default {1, 16, 64} */
    const pkv_layout *layouts;  int32_t num_layouts;     /* default {NHD, HND} */
    const pkv_dtype *dtypes;    int32_t num_dtypes;      /* default {FP16, BF16} */
    int32_t max_batch;          /* B drawn in [min_batch, max_batch]; default 1..6 */
    int32_t min_batch;
    int32_t max_len;            /* typical lengths drawn in [2, max_len]; default 3000 */
    int32_t long_len;           /* with probability long_prob a row gets up to long_len tokens */
    double long_prob;
    double empty_prob;          /* probability of a row of length 0; default 0.1 */
    double one_prob;            /* probability of a row of length 1; default 0.1 */
    double hole_fraction;       /* unused pages / used pages; default 0.25 */
    int poison_unused_kv;       /* NaN in every KV slot no row reads; default 1 */
    const pkv_dtype *kv_dtypes; int32_t num_kv_dtypes;   /* the caches' kv_dtype; default (none listed): 0, of dtype */
    double head_scale_prob;     /* an fp8 case's probability of per-KV-head scales; default 0 (per tensor) */
} pkv_test_choices;

/* A generated problem with its host data, outputs and reference. */
typedef struct pkv_test_case {
    pkv_problem problem;
    pkv_page_table table;     /* points at the arrays below */
    int32_t batch_size;
    int32_t *seq_lens;        // [B]
    int32_t *kv_indptr;       // [B + 1]
    int32_t *kv_page_indices; // [kv_indptr[B]]
    uint16_t *q;              // [B, Hq, d]
    /* [num_pages, page_size, Hkv, d] (NHD) or [num_pages, Hkv, page_size, d] (HND) elements of kv_dtype:
     * 2 bytes, or for an fp8 cache 1 byte each (read them as uint8_t; pkv_test_kv_value) */
    uint16_t *k_cache;
    uint16_t *v_cache;
    uint16_t *o;              // [B, Hq, d]   output under test
    float *lse;               // [B, Hq]      output under test
    double *o_ref;            // [B, Hq, d]
    double *lse_ref;          // [B, Hq]
    int64_t q_elems, kv_elems, lse_elems, total_tokens;
    int ok;                   /* 1 when every allocation succeeded */
    /* an fp8 cache's scales as pkv_tensors takes them (0: 1.0), or per KV head ([Hkv], else NULL) */
    float k_scale, v_scale;
    float *k_head_scales, *v_head_scales;
} pkv_test_case;

uint16_t pkv_test_nan_bits(pkv_dtype dtype);
float pkv_test_to_float(uint16_t bits, pkv_dtype dtype);
uint16_t pkv_test_from_float(float f, pkv_dtype dtype);
/* fp8 kv_dtype checks for tests: an fp8 type; the caches' element type (kv_dtype if fp8, else dtype) and its
 * bytes; the scale of KV head h's K (is_v 0) or V (1) as a run uses it; a cache element as a float
 * (element `at` of cache, KV head h). */
int pkv_test_is_fp8(pkv_dtype d);
pkv_dtype pkv_test_kv_dtype(const pkv_problem *p);
size_t pkv_test_kv_size(const pkv_problem *p);
float pkv_test_kv_scale(const pkv_test_case *tc, int32_t h, int is_v);
float pkv_test_kv_value(const pkv_test_case *tc, const void *cache, int64_t at, int32_t h, int is_v);
void pkv_test_choices_default(pkv_test_choices *c);
int64_t pkv_test_pick(pkv_rng *rng, int64_t count);
/* Uniform in [-1, 1], rounded to the dtype, never zero (nor -0). */
uint16_t pkv_test_random_value(pkv_rng *rng, pkv_dtype dtype);
void pkv_test_case_free(pkv_test_case *tc);
/* Element offset of token t of row i, KV head h, in the K or V pool (dense). */
int64_t pkv_test_kv_at(const pkv_test_case *tc, int32_t i, int32_t t, int32_t h);
/* Under the problem's sliding window, NaN in K and V of every token before a row's window (tokens a
 * kernel may bring in with the window's first tile but must never let reach the output). */
void pkv_test_poison_before_window(pkv_test_case *tc);
/* A random logits soft cap c in [1, 50] with sm_scale set so that the scaled scores of the tests' data
 * (q, k uniform in [-1, 1]: q.k has a standard deviation of sqrt(d) / 3) spread over 0.5..2 c: a cap that
 * binds, so a backend that ignored it would fail. */
void pkv_test_random_cap(pkv_rng *rng, pkv_problem *p);
/* Builds a case for the given problem shape (num_pages is computed) and lengths: each row owns
 * ceil(len / page_size) pages, sometimes one more; page ids are a random permutation of the pool
 * (no page shared between rows) with hole_fraction unused pages.  Returns tc->ok. */
int pkv_test_case_build(pkv_rng *rng, const pkv_problem *shape, int32_t batch_size, const int32_t *lens, double hole_fraction, int poison_unused_kv, pkv_test_case *tc);
/* The same; for an fp8 kv_dtype head_scales != 0 draws per-KV-head scales instead of per-tensor ones. */
int pkv_test_case_build_kv(pkv_rng *rng, const pkv_problem *shape, int32_t batch_size, const int32_t *lens,
                           double hole_fraction, int poison_unused_kv, int head_scales, pkv_test_case *tc);
/* Makes every score of a head the same constant c (an fp8 case with per-head K scales gets head 0's K scale
 * on every head first): K of every token of a KV head is one random vector,
 * q of every row and query head one random vector (its sign set by c's), and sm_scale = |c| / |q.k|
 * (|q.k| >= 1 by redrawing; c = 0 gives sm_scale 1e-30).  Softmax weights are then uniform whatever c
 * is: o is the mean of V over the attended tokens and lse = c + ln(n), so a backend whose merge loses
 * mass at large |scores| shows.  Used KV slots only: poisoned slots stay NaN.  |c| <= 1e20. */
void pkv_test_constant_scores(pkv_test_case *tc, pkv_rng *rng, double c);
/* Draws one random length under the choices. */
int32_t pkv_test_random_len(pkv_rng *rng, const pkv_test_choices *c);
/* Draws a whole random case under the choices.  Returns tc->ok. */
int pkv_test_case_random(pkv_rng *rng, const pkv_test_choices *c, pkv_test_case *tc);
/* Fills o_ref and lse_ref with the float64 reference. */
pkv_status pkv_test_case_reference(pkv_test_case *tc);
/* Fills o with the dtype's NaN pattern and lse with NaN, so unwritten elements show. */
void pkv_test_poison(pkv_test_case *tc);
/* Output elements (o and lse) still NaN: 0 when every element was written with a number. */
int64_t pkv_test_unwritten(const pkv_test_case *tc);
/* Relative L2 error of o against o_ref: ||o - o_ref|| / max(||o_ref||, tiny).  NaN or inf in o
 * gives +inf. */
double pkv_test_rel_l2(const pkv_test_case *tc);
/* Largest |o - o_ref|; +inf when o holds NaN or inf. */
double pkv_test_max_abs(const pkv_test_case *tc);
/* Largest |lse - lse_ref| / max(1, |lse_ref|); empty rows must give -inf in both (0 error), any
 * other mismatch of infinities or a NaN gives +inf. */
double pkv_test_lse_err(const pkv_test_case *tc);
/* Rows of length 0 must give o == +0 or -0 exactly: count the elements that do not. */
int64_t pkv_test_empty_rows_nonzero(const pkv_test_case *tc);

/* How a run lays its tensors out: kv_pad < 0, K and V in their own dense pools, >= 0, one interleaved
 * buffer (pkv_test_interleave); q_pad / o_pad > 0, the rows of q / o that many elements further apart
 * than Hq x head_dim (pkv_tensors.q_row_stride / o_row_stride), else dense. */
typedef struct pkv_test_layout {
    int64_t kv_pad, q_pad, o_pad;
} pkv_test_layout;

/* The case's K and V pools as one buffer that interleaves them per page (FlashInfer's and vLLM's
 * [pages, 2, ...] cache) with pad elements after each page's V: page stride 2 x page + pad. */
uint16_t *pkv_test_interleave(const pkv_test_case *tc, int64_t pad, int64_t *stride);
/* A copy of B rows of `row` elements spread `stride` apart, the gaps filled with `fill`. */
uint16_t *pkv_test_spread_rows(const uint16_t *src, int32_t B, int64_t row, int64_t stride, uint16_t fill);
/* The rows back from a spread copy; returns how many gap elements are no longer `fill`. */
int64_t pkv_test_gather_rows(uint16_t *dst, const uint16_t *src, int32_t B, int64_t row, int64_t stride, uint16_t fill);
/* Runs the case with its tensors laid out as L says; the outputs come back into tc->o / tc->lse, and
 * *gap_writes (when not NULL) counts the elements between o's rows that the run changed. */
pkv_status pkv_test_run_layout(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc, const pkv_test_layout *L, int64_t *gap_writes);
/* pad < 0: K and V in their own dense pools; pad >= 0: one interleaved buffer (pkv_test_interleave). */
pkv_status pkv_test_run_kv(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc, int64_t pad);
pkv_status pkv_test_run(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc);

#ifdef __cplusplus
}
#endif

#endif /* PKV_LAB_H */
