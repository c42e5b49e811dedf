/* bench.c - `pkv bench`: replays a trace, the anchor steps or one isolated step on a backend and
 * route, and reports every metric of design.md section 5 that the backend can give: kernel time
 * (CUDA events, median of many runs, KV rotated over a pool larger than L2), synchronized wall
 * time of a whole step (plan + upload + launches + sync), launches, tasks, KV and merge-state
 * bytes, achieved bandwidth against the read ceiling measured in the same run, the floor of the
 * step (a streaming read of the same bytes, timed the same way) and the step efficiency, and the
 * error against the float64 reference on sampled rows.  Markdown table on stdout, JSON on request. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "internal.h" /* the plan options' bounds (PKV_MAX_PER_UNIT, ...) */
#include "pkv_lab.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern char **environ;

#define MAX_ROUTES 6

typedef struct bench_opts {
    pkv_context *ctx;
    bool cuda;
    const pkv_shape *shape;
    pkv_problem prob; /* num_pages set per step */
    pkv_route routes[MAX_ROUTES];
    int nroutes;
    int reps, warmup, wall_reps;
    int32_t ctas_per_unit, min_chunk, parallelism;
    int32_t graph_max_batch, graph_tasks; /* graph-stable plans: capacity (-1: the step's batch rounded up to
                                           * a power of two, as servers capture per batch bucket); 0: off */
    bool check, per_step, quiet, explain;
    bool kv_interleaved; /* K and V of each page side by side in one pool (pkv_tensors.kv_page_stride) */
    bool behind;         /* also time each step behind a kernel that writes its q (pkv_dev_time_plan_behind) */
    int pdl;             /* the context's pkv_context_config.pdl */
    pkv_cost_model model;
    const char *calibrate_out;
    int64_t rotate_bytes;
    const char *cmdline;
} bench_opts;

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

static void results_push(results *r, const row_result *x) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->rows = (row_result *)realloc(r->rows, (size_t)r->cap * sizeof *r->rows);
        if (!r->rows) {
            fprintf(stderr, "pkv bench: out of memory\n");
            exit(1);
        }
    }
    r->rows[r->n++] = *x;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "pkv bench: cannot allocate %zu bytes\n", n);
        exit(1);
    }
    return p;
}

static void die_status(pkv_context *ctx, pkv_status st, const char *what) {
    fprintf(stderr, "pkv bench: %s failed: %s\n", what, pkv_last_error());
    (void)st;
    exit(1);
}
/* cmd_bench's exits after its context exists: the context is freed (a sanitizer build's leak check
 * would otherwise turn the status into 1) */
#define BENCH_EXIT(code)            \
    do {                            \
        pkv_context_free(o.ctx);    \
        return (code);              \
    } while (0)
#define TRY(ctx, expr, what)                        \
    do {                                            \
        pkv_status st_ = (expr);                    \
        if (st_ != PKV_OK) die_status(ctx, st_, what); \
    } while (0)

/* ---- workloads ------------------------------------------------------------------------------ */
static int32_t pages_of(int32_t len, int32_t ps) { return (len + ps - 1) / ps; }

/* Rotations so that the rotated window covers rotate_bytes (L2 does not help); capped by memory. */
static int32_t choose_rotations(const bench_opts *o, int64_t step_kv_bytes, int64_t pool_kv_bytes) {
    if (!o->cuda || step_kv_bytes <= 0) return 1;
    int64_t r = (o->rotate_bytes + step_kv_bytes - 1) / step_kv_bytes;
    int64_t cap = (int64_t)24 << 30;
    int64_t by_mem = pool_kv_bytes > 0 ? cap / pool_kv_bytes : 256;
    if (r > by_mem) r = by_mem;
    if (r > 256) r = 256;
    return r < 1 ? 1 : (int32_t)r;
}

static int64_t kv_bytes_per_token(const pkv_problem *p) {
    return (int64_t)p->num_kv_heads * p->head_dim * 2 * 2; /* K and V, 2-byte elements */
}

/* The tokens a row of len attends to: its last `window` under a sliding window.  Rotations, the
 * floor and the fractions of the ceiling count these (the bytes a step reads), not the row's length. */
static int64_t attended(const bench_opts *o, int32_t len) {
    return o->prob.window > 0 && len > o->prob.window ? o->prob.window : len;
}

/* An isolated step: pages scattered at random over a pool of rotations x step pages. */
static void make_isolated_step(const bench_opts *o, const char *name, const int32_t *lens, int32_t B, double fi_us,
                               const char *arg, uint64_t seed, step_input *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->workload_arg, sizeof s->workload_arg, "%s", arg);
    s->batch = B;
    s->flashinfer_us = fi_us;
    s->lens = (int32_t *)xmalloc((size_t)(B ? B : 1) * sizeof(int32_t));
    s->indptr = (int32_t *)xmalloc((size_t)(B + 1) * sizeof(int32_t));
    s->indptr[0] = 0;
    int64_t tokens = 0;
    for (int32_t i = 0; i < B; i++) {
        s->lens[i] = lens[i];
        tokens += attended(o, lens[i]);
        s->indptr[i + 1] = s->indptr[i] + pages_of(lens[i], o->prob.page_size);
    }
    int32_t np = s->indptr[B];
    int64_t step_bytes = (int64_t)np * o->prob.page_size * kv_bytes_per_token(&o->prob);
    s->rotations = choose_rotations(o, tokens * kv_bytes_per_token(&o->prob), step_bytes);
    s->pool_pages = (int64_t)np * s->rotations;
    if (s->pool_pages < 1) s->pool_pages = 1;
    /* random permutation of the pool; rotation r takes the r-th slice */
    int32_t *perm = (int32_t *)xmalloc((size_t)s->pool_pages * sizeof(int32_t));
    for (int64_t i = 0; i < s->pool_pages; i++) perm[i] = (int32_t)i;
    pkv_rng r;
    pkv_rng_seed(&r, seed);
    for (int64_t i = s->pool_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)(pkv_rng_next(&r) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    s->pages = perm; /* [rotations][np] laid out contiguously */
}

/* A trace step: the trace's own pages; rotation r uses copy r of the pool. */
static void make_trace_step(const bench_opts *o, const pkv_trace *t, int32_t step, int32_t rotations,
                            const char *arg, step_input *s) {
    memset(s, 0, sizeof *s);
    const int32_t *ids, *lens;
    int32_t B = pkv_trace_step(t, step, &ids, &lens);
    snprintf(s->name, sizeof s->name, "step%d", step);
    snprintf(s->workload_arg, sizeof s->workload_arg, "%s --step %d", arg, step);
    s->batch = B;
    s->lens = (int32_t *)xmalloc((size_t)(B ? B : 1) * sizeof(int32_t));
    s->indptr = (int32_t *)xmalloc((size_t)(B + 1) * sizeof(int32_t));
    int64_t cap = 0;
    for (int32_t i = 0; i < B; i++) cap += pages_of(lens[i], o->prob.page_size);
    int32_t *idx = (int32_t *)xmalloc((size_t)(cap ? cap : 1) * sizeof(int32_t));
    TRY(NULL, pkv_trace_step_table(t, step, s->indptr, idx, cap, s->lens), "trace step table");
    int64_t np = pkv_trace_num_pages(t);
    s->rotations = rotations;
    s->pool_pages = np * rotations;
    s->pages = (int32_t *)xmalloc((size_t)(cap ? cap : 1) * (size_t)rotations * sizeof(int32_t));
    for (int32_t r = 0; r < rotations; r++)
        for (int64_t j = 0; j < cap; j++) s->pages[r * cap + j] = (int32_t)(idx[j] + r * np);
    free(idx);
}

/* "1,4,16" -> values; the count, or -1 on a malformed list. */
static int parse_int_list(const char *s, int32_t *out, int cap) {
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 4096 || n == cap || (*end && *end != ',')) return -1;
        out[n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return n;
}

/* A set of traces (every family x these seeds x these batch sizes, 3 x B requests each): the
 * first and the middle step of each, named family_B<b>_s<seed>_t<step>, each carrying its trace
 * arguments.  Returns the number of steps. */
static int add_trace_set(const bench_opts *o, const uint64_t *seeds, int nseeds, const int32_t *bs, int nb,
                         step_input **out) {
    step_input *steps =
        (step_input *)xmalloc((size_t)PKV_TRACE_FAMILY_COUNT_ * (size_t)(nb * nseeds) * 2 * sizeof *steps);
    int n = 0;
    for (int f = 0; f < PKV_TRACE_FAMILY_COUNT_; f++)
        for (int si = 0; si < nseeds; si++)
            for (int bi = 0; bi < nb; bi++) {
                pkv_trace_config tc;
                pkv_trace_config_default(&tc, (pkv_trace_family)f);
                tc.seed = seeds[si];
                tc.max_active = bs[bi];
                tc.num_requests = 3 * bs[bi];
                tc.page_size = o->prob.page_size;
                pkv_trace *tr = NULL;
                TRY(NULL, pkv_trace_generate(&tc, &tr), "trace generation");
                char arg[128];
                snprintf(arg, sizeof arg, "--trace %s --seed %llu --batch %d --requests %d",
                         pkv_trace_family_name(tc.family), (unsigned long long)tc.seed, bs[bi], tc.num_requests);
                int64_t pool = pkv_trace_num_pages(tr) * o->prob.page_size * kv_bytes_per_token(&o->prob);
                int32_t nst = pkv_trace_num_steps(tr), picks[2] = {0, nst / 2};
                for (int k = 0; k < 2 && k < nst; k++) {
                    const int32_t *ids, *ls;
                    int32_t B = pkv_trace_step(tr, picks[k], &ids, &ls);
                    int64_t tok = 0;
                    for (int32_t i = 0; i < B; i++) tok += attended(o, ls[i]);
                    int32_t rot = choose_rotations(o, tok * kv_bytes_per_token(&o->prob), pool);
                    make_trace_step(o, tr, picks[k], rot, arg, &steps[n]);
                    snprintf(steps[n].name, sizeof steps[n].name, "%s_B%d_s%llu_t%d", pkv_trace_family_name(tc.family),
                             bs[bi], (unsigned long long)(tc.seed % 100), picks[k]);
                    n++;
                }
                pkv_trace_free(tr);
            }
    *out = steps;
    return n;
}

static void free_step(step_input *s) {
    free(s->lens);
    free(s->indptr);
    free(s->pages);
    memset(s, 0, sizeof *s);
}

/* ---- device or host buffers ------------------------------------------------------------------ */
typedef struct buffers {
    void *k, *v, *q, *o, *ws; /* interleaved K/V: v points into k's allocation */
    int64_t kv_page_stride;  /* 0: dense pools */
    float *lse;
    int32_t **page_sets; /* per rotation */
    int32_t nsets;
    size_t kv_bytes, ws_bytes, q_bytes;
    int64_t pool_pages;
} buffers;

static void *buf_alloc(const bench_opts *o, size_t n) {
    if (!o->cuda) return xmalloc(n);
    void *p = NULL;
    TRY(o->ctx, pkv_dev_malloc(o->ctx, n, &p), "device allocation");
    return p;
}

static void buf_free(const bench_opts *o, void *p) {
    if (!p) return;
    if (o->cuda)
        pkv_dev_free(o->ctx, p);
    else
        free(p);
}

static void fill_random(const bench_opts *o, void *p, int64_t n, uint64_t seed) {
    if (o->cuda)
        TRY(o->ctx, pkv_dev_fill_random(o->ctx, p, n, o->prob.dtype, seed), "random fill");
    else
        cli_fill_random((uint16_t *)p, n, o->prob.dtype, seed);
}

static void to_backend(const bench_opts *o, void *dst, const void *src, size_t n) {
    if (o->cuda)
        TRY(o->ctx, pkv_dev_copy_h2d(o->ctx, dst, src, n), "copy to device");
    else
        memcpy(dst, src, n);
}

static void from_backend(const bench_opts *o, void *dst, const void *src, size_t n) {
    if (o->cuda)
        TRY(o->ctx, pkv_dev_copy_d2h(o->ctx, dst, src, n), "copy to host");
    else
        memcpy(dst, src, n);
}

static void buffers_free(const bench_opts *o, buffers *b) {
    buf_free(o, b->k);
    if (!b->kv_page_stride) buf_free(o, b->v);
    buf_free(o, b->q);
    buf_free(o, b->o);
    buf_free(o, b->lse);
    buf_free(o, b->ws);
    for (int32_t r = 0; r < b->nsets; r++) buf_free(o, b->page_sets[r]);
    free(b->page_sets);
    memset(b, 0, sizeof *b);
}

/* Allocates the pools for a step (reusing the K/V pools when they are large enough). */
static void buffers_for_step(const bench_opts *o, buffers *b, const step_input *s, uint64_t seed) {
    const pkv_problem *p = &o->prob;
    size_t kv = (size_t)s->pool_pages * (size_t)p->page_size * (size_t)p->num_kv_heads * (size_t)p->head_dim * 2;
    if (kv > b->kv_bytes) {
        buf_free(o, b->k);
        if (!b->kv_page_stride) buf_free(o, b->v);
        if (o->kv_interleaved) { /* one pool, [pages][K page, V page] */
            const int64_t page_elems = (int64_t)p->page_size * p->num_kv_heads * p->head_dim;
            b->k = buf_alloc(o, 2 * kv);
            b->v = (char *)b->k + page_elems * 2;
            b->kv_page_stride = 2 * page_elems;
            fill_random(o, b->k, (int64_t)kv, seed * 3 + 1);
        } else {
            b->k = buf_alloc(o, kv);
            b->v = buf_alloc(o, kv);
            b->kv_page_stride = 0;
            fill_random(o, b->k, (int64_t)(kv / 2), seed * 3 + 1);
            fill_random(o, b->v, (int64_t)(kv / 2), seed * 3 + 2);
        }
        b->kv_bytes = kv;
    }
    size_t qb = (size_t)(s->batch ? s->batch : 1) * (size_t)p->num_qo_heads * (size_t)p->head_dim * 2;
    if (qb > b->q_bytes) {
        buf_free(o, b->q);
        buf_free(o, b->o);
        buf_free(o, b->lse);
        b->q = buf_alloc(o, qb);
        b->o = buf_alloc(o, qb);
        b->lse = (float *)buf_alloc(o, qb); /* >= B x Hq floats */
        b->q_bytes = qb;
    }
    fill_random(o, b->q, (int64_t)(qb / 2), seed * 3 + 3);
    for (int32_t r = 0; r < b->nsets; r++) buf_free(o, b->page_sets[r]);
    free(b->page_sets);
    int32_t np = s->indptr[s->batch];
    b->nsets = s->rotations;
    b->page_sets = (int32_t **)xmalloc((size_t)b->nsets * sizeof(int32_t *));
    for (int32_t r = 0; r < b->nsets; r++) {
        b->page_sets[r] = (int32_t *)buf_alloc(o, (size_t)(np ? np : 1) * sizeof(int32_t));
        to_backend(o, b->page_sets[r], s->pages + (size_t)r * np, (size_t)np * sizeof(int32_t));
    }
    b->pool_pages = s->pool_pages;
}

static void ensure_workspace(const bench_opts *o, buffers *b, size_t need) {
    if (need <= b->ws_bytes) return;
    buf_free(o, b->ws);
    b->ws_bytes = need + (need >> 2) + 4096;
    b->ws = buf_alloc(o, b->ws_bytes);
}

/* ---- reference on sampled rows ----------------------------------------------------------------- */
typedef struct reference {
    int32_t nrows;
    int32_t rows[4];
    double *o; /* [nrows, Hq, d] */
    double *lse;
} reference;

static void reference_free(reference *r) {
    free(r->o);
    free(r->lse);
    memset(r, 0, sizeof *r);
}

/* Picks up to 4 rows (longest, shortest, first, last) with at most ~96K tokens in all, copies their
 * pages (rotation 0) to the host and computes the float64 reference. */
static void reference_compute(const bench_opts *o, const buffers *b, const step_input *s, reference *ref) {
    memset(ref, 0, sizeof *ref);
    if (s->batch == 0) return;
    const pkv_problem *p = &o->prob;
    int32_t cand[4] = {0, s->batch - 1, 0, 0};
    for (int32_t i = 0; i < s->batch; i++) {
        if (s->lens[i] > s->lens[cand[2]]) cand[2] = i;
        if (s->lens[i] < s->lens[cand[3]]) cand[3] = i;
    }
    int64_t budget = 96 * 1024;
    for (int k = 0; k < 4; k++) {
        bool dup = false;
        for (int32_t j = 0; j < ref->nrows; j++) dup |= ref->rows[j] == cand[k];
        if (dup || (s->lens[cand[k]] > budget && ref->nrows > 0)) continue;
        ref->rows[ref->nrows++] = cand[k];
        budget -= s->lens[cand[k]];
    }
    const int32_t R = ref->nrows, ps = p->page_size;
    const size_t page_elems = (size_t)ps * p->num_kv_heads * p->head_dim;
    int32_t indptr[5] = {0}, lens[4];
    for (int32_t j = 0; j < R; j++) {
        lens[j] = s->lens[ref->rows[j]];
        indptr[j + 1] = indptr[j] + pages_of(lens[j], ps);
    }
    int32_t np = indptr[R];
    uint16_t *hk = (uint16_t *)xmalloc((size_t)(np ? np : 1) * page_elems * 2);
    uint16_t *hv = (uint16_t *)xmalloc((size_t)(np ? np : 1) * page_elems * 2);
    int32_t *hidx = (int32_t *)xmalloc((size_t)(np ? np : 1) * sizeof(int32_t));
    uint16_t *hq = (uint16_t *)xmalloc((size_t)R * p->num_qo_heads * p->head_dim * 2);
    for (int32_t j = 0; j < R; j++) {
        int32_t row = ref->rows[j];
        for (int32_t k = 0; k < indptr[j + 1] - indptr[j]; k++) {
            int32_t phys = s->pages[s->indptr[row] + k]; /* rotation 0 */
            size_t at = (size_t)(indptr[j] + k);
            const size_t pstride = b->kv_page_stride ? (size_t)b->kv_page_stride : page_elems; /* elements */
            from_backend(o, hk + at * page_elems, (const char *)b->k + (size_t)phys * pstride * 2, page_elems * 2);
            from_backend(o, hv + at * page_elems, (const char *)b->v + (size_t)phys * pstride * 2, page_elems * 2);
            hidx[at] = (int32_t)at;
        }
        size_t qrow = (size_t)p->num_qo_heads * p->head_dim;
        from_backend(o, hq + j * qrow, (const char *)b->q + (size_t)row * qrow * 2, qrow * 2);
    }
    pkv_problem sub = *p;
    sub.num_pages = np;
    pkv_page_table t = {R, indptr, hidx, lens};
    ref->o = (double *)xmalloc((size_t)R * p->num_qo_heads * p->head_dim * sizeof(double));
    ref->lse = (double *)xmalloc((size_t)R * p->num_qo_heads * sizeof(double));
    TRY(NULL, pkv_reference(&sub, &t, hq, hk, hv, ref->o, ref->lse), "reference");
    free(hk);
    free(hv);
    free(hidx);
    free(hq);
}

static float to_f(uint16_t x, pkv_dtype d) { return d == PKV_DTYPE_BF16 ? pkv_bf16_to_float(x) : pkv_half_to_float(x); }

/* Compares the backend's o with the reference; counts outputs left unwritten (NaN poison). */
static void reference_compare(const bench_opts *o, const buffers *b, const step_input *s, const reference *ref,
                              row_result *r) {
    const pkv_problem *p = &o->prob;
    size_t n = (size_t)s->batch * p->num_qo_heads * p->head_dim;
    uint16_t *ho = (uint16_t *)xmalloc(n * 2 + 2);
    from_backend(o, ho, b->o, n * 2);
    r->nan_outputs = 0;
    for (size_t i = 0; i < n; i++) r->nan_outputs += isnan(to_f(ho[i], p->dtype)) ? 1 : 0;
    double num = 0, den = 0, mx = 0;
    size_t qrow = (size_t)p->num_qo_heads * p->head_dim;
    for (int32_t j = 0; j < ref->nrows; j++)
        for (size_t e = 0; e < qrow; e++) {
            double got = to_f(ho[(size_t)ref->rows[j] * qrow + e], p->dtype), want = ref->o[j * qrow + e];
            double d = fabs(got - want);
            if (!(d <= mx)) mx = d; /* NaN propagates */
            num += d * d;
            den += want * want;
        }
    r->max_err = mx;
    r->rel_err = den > 0 ? sqrt(num / den) : sqrt(num);
    free(ho);
}

/* ---- measuring one (step, route) -------------------------------------------------------------------- */
typedef struct ceilings {
    double read_gbps, launch_us, graph_us;
    void *read_buf;
    size_t read_buf_bytes;
} ceilings;

static void measure(const bench_opts *o, buffers *b, const step_input *s, pkv_route route, const ceilings *ce,
                    const reference *ref, double floor_us, double gather_us, bool warm_first, pkv_plan *plan,
                    row_result *r) {
    memset(r, 0, sizeof *r);
    pkv_problem prob = o->prob;
    prob.num_pages = b->pool_pages;
    pkv_page_table tab = {s->batch, s->indptr, s->pages, s->lens};
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.route = route;
    opts.ctas_per_unit = o->ctas_per_unit;
    opts.parallelism = o->parallelism;
    opts.min_chunk_tokens = o->min_chunk;
    if (o->graph_max_batch != 0) {
        int32_t cap = 1;
        while (cap < s->batch) cap *= 2;
        opts.graph_max_batch = o->graph_max_batch > 0 ? o->graph_max_batch : cap;
        opts.graph_tasks = o->graph_tasks;
    }
    TRY(o->ctx, pkv_plan_step(o->ctx, &prob, &tab, &opts, plan), "plan");
    ensure_workspace(o, b, pkv_plan_workspace_size(plan));
    snprintf(r->step, sizeof r->step, "%s", s->name);
    r->batch = s->batch;
    r->route_asked = route;
    r->route_used = pkv_plan_route(plan);
    r->c = *pkv_plan_counters(plan);
    r->total_tokens = r->c.total_tokens;
    pkv_cost_terms(plan, r->terms);
    r->flashinfer_us = s->flashinfer_us;
    pkv_tensors t = {.q = b->q,
                     .k_cache = b->k,
                     .v_cache = b->v,
                     .kv_page_indices = b->page_sets[0],
                     .o = b->o,
                     .lse = b->lse,
                     .kv_page_stride = b->kv_page_stride};

    r->decode_kernel = NULL;
    if (o->cuda) TRY(o->ctx, pkv_dev_decode_kernel(o->ctx, plan, &t, &r->decode_kernel), "decode kernel");

    /* correctness first: poisoned outputs, rotation 0 */
    size_t on = (size_t)s->batch * prob.num_qo_heads * prob.head_dim * 2;
    if (o->cuda)
        TRY(o->ctx, pkv_dev_memset(o->ctx, b->o, 0xff, on), "poison");
    else
        memset(b->o, 0xff, on);
    TRY(o->ctx, pkv_run(o->ctx, plan, b->ws, b->ws_bytes, &t, NULL), "run");
    if (o->cuda) TRY(o->ctx, pkv_dev_synchronize(o->ctx), "synchronize");
    if (o->check)
        reference_compare(o, b, s, ref, r);
    else
        r->rel_err = r->max_err = NAN;

    /* kernel time */
    double *samples = (double *)xmalloc((size_t)o->reps * sizeof(double));
    if (o->cuda) {
        /* the first route of a step is timed twice, the first time discarded: timed once, it read
         * 5-10% slow on short steps (auto, timed first, against the same plan timed moments later) */
        for (int pass = warm_first ? 0 : 1; pass < 2; pass++)
            TRY(o->ctx,
                pkv_dev_time_plan(o->ctx, plan, b->ws, b->ws_bytes, &t, (const int32_t *const *)b->page_sets,
                                  b->nsets, o->warmup, o->reps, samples),
                "timing");
    } else {
        for (int i = 0; i < o->reps; i++) {
            double t0 = cli_now_us();
            TRY(o->ctx, pkv_run(o->ctx, plan, b->ws, b->ws_bytes, &t, NULL), "run");
            samples[i] = cli_now_us() - t0;
        }
    }
    r->kernel_us = cli_median(samples, o->reps);
    r->kernel_p10 = cli_percentile(samples, o->reps, 0.1);
    r->kernel_p90 = cli_percentile(samples, o->reps, 0.9);
    free(samples);
    r->producer_us = r->pair_us = r->producer_trig_us = r->pair_trig_us = NAN;
    if (o->cuda && o->behind) {
        TRY(o->ctx,
            pkv_dev_time_plan_behind(o->ctx, plan, b->ws, b->ws_bytes, &t, (const int32_t *const *)b->page_sets,
                                     b->nsets, o->warmup, o->reps, 0, &r->producer_us, &r->pair_us),
            "timing behind a producer");
        TRY(o->ctx,
            pkv_dev_time_plan_behind(o->ctx, plan, b->ws, b->ws_bytes, &t, (const int32_t *const *)b->page_sets,
                                     b->nsets, o->warmup, o->reps, 1, &r->producer_trig_us, &r->pair_trig_us),
            "timing behind a producer");
    }

    /* whole step: plan + upload + launches + sync (host clock), and plan alone */
    int wr = o->wall_reps;
    double *wall = (double *)xmalloc((size_t)wr * sizeof(double));
    double *pl = (double *)xmalloc((size_t)wr * sizeof(double));
    for (int i = 0; i < wr; i++) {
        t.kv_page_indices = b->page_sets[i % b->nsets];
        tab.kv_page_indices = s->pages + (size_t)(i % b->nsets) * s->indptr[s->batch];
        double t0 = cli_now_us();
        TRY(o->ctx, pkv_plan_step(o->ctx, &prob, &tab, &opts, plan), "plan");
        double t1 = cli_now_us();
        TRY(o->ctx, pkv_run(o->ctx, plan, b->ws, b->ws_bytes, &t, NULL), "run");
        if (o->cuda) TRY(o->ctx, pkv_dev_synchronize(o->ctx), "synchronize");
        double t2 = cli_now_us();
        wall[i] = t2 - t0;
        pl[i] = t1 - t0;
    }
    r->wall_us = cli_median(wall, wr);
    r->plan_us = cli_median(pl, wr);
    /* graph-stable: the same step replayed from a graph captured once (one fixed page-id buffer, as a
     * graph needs), each replay after a new plan and its upload */
    r->graph_wall_us = NAN;
    if (o->cuda && opts.graph_max_batch != 0) {
        t.kv_page_indices = b->page_sets[0];
        tab.kv_page_indices = s->pages;
        TRY(o->ctx, pkv_plan_step(o->ctx, &prob, &tab, &opts, plan), "plan");
        void *graph = NULL;
        TRY(o->ctx, pkv_dev_graph_capture(o->ctx, plan, b->ws, b->ws_bytes, &t, &graph), "graph capture");
        for (int i = 0; i < wr; i++) {
            double t0 = cli_now_us();
            TRY(o->ctx, pkv_plan_step(o->ctx, &prob, &tab, &opts, plan), "plan");
            TRY(o->ctx, pkv_dev_graph_replay(o->ctx, graph, plan, b->ws, b->ws_bytes), "graph replay");
            wall[i] = cli_now_us() - t0;
        }
        pkv_dev_graph_free(graph);
        r->graph_wall_us = cli_median(wall, wr);
    }
    free(wall);
    free(pl);

    double bytes = (double)(r->c.kv_bytes + r->c.qo_bytes + r->c.merge_state_bytes);
    r->gbps = r->kernel_us > 0 ? bytes / (r->kernel_us * 1e3) : 0;
    r->frac_ceiling = ce && ce->read_gbps > 0 ? r->gbps / ce->read_gbps : NAN;
    r->floor_us = floor_us;
    r->gather_us = gather_us;
    r->step_eff = floor_us > 0 && r->kernel_us > 0 ? floor_us / r->kernel_us : NAN;
    r->tokens_per_s = r->wall_us > 0 ? s->batch / (r->wall_us * 1e-6) : 0;
    char score[64] = "";
    if (o->prob.window > 0) snprintf(score, sizeof score, " --window %d", o->prob.window);
    if (o->prob.logits_soft_cap > 0.0f)
        snprintf(score + strlen(score), sizeof score - strlen(score), " --soft-cap %g",
                 (double)o->prob.logits_soft_cap);
    snprintf(r->repro, sizeof r->repro,
             "pkv bench --backend %s --shape %s --dtype %s --layout %s --page-size %d%s %s --route %s",
             o->cuda ? "cuda" : "cpu", o->shape->name, o->prob.dtype == PKV_DTYPE_BF16 ? "bf16" : "fp16",
             o->prob.layout == PKV_LAYOUT_HND ? "hnd" : "nhd", o->prob.page_size, score, s->workload_arg,
             pkv_route_name(route));
    snprintf(r->trace, sizeof r->trace, "%s", s->workload_arg);
    r->lens = s->lens;
}

/* ---- output -------------------------------------------------------------------------------------- */
static void print_row_header(void) {
    printf(
        "| step | B | KV MB | route | kernel us | wall us | launches | tasks | merge KB | GB/s | of ceiling | floor us "
        "| step eff | FlashInfer us | FI / ours | rel err | pages floor us |\n");
    printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
           "---: | ---: |\n");
}

static void route_label(const row_result *r, char *buf, size_t n) {
    if (r->route_asked == PKV_ROUTE_AUTO)
        snprintf(buf, n, "auto:%s", pkv_route_name(r->route_used));
    else
        snprintf(buf, n, "%s", pkv_route_name(r->route_used));
}

static void print_row(const row_result *r) {
    char rl[32], fi[32] = "-", ratio[32] = "-", ceil_s[32] = "-", floor_s[32] = "-", eff[32] = "-", gather[32] = "-";
    route_label(r, rl, sizeof rl);
    if (r->flashinfer_us > 0) {
        snprintf(fi, sizeof fi, "%.1f", r->flashinfer_us);
        snprintf(ratio, sizeof ratio, "%.2f", r->flashinfer_us / r->kernel_us);
    }
    if (!isnan(r->frac_ceiling)) snprintf(ceil_s, sizeof ceil_s, "%.2f", r->frac_ceiling);
    if (r->floor_us > 0) snprintf(floor_s, sizeof floor_s, "%.1f", r->floor_us);
    if (!isnan(r->step_eff)) snprintf(eff, sizeof eff, "%.2f", r->step_eff);
    if (r->gather_us > 0) snprintf(gather, sizeof gather, "%.1f", r->gather_us);
    printf("| %s | %d | %.1f | %s | %.1f | %.1f | %lld | %lld | %.1f | %.0f | %s | %s | %s | %s | %s | %.1e | %s |\n",
           r->step, r->batch, r->c.kv_bytes / 1e6, rl, r->kernel_us, r->wall_us, (long long)r->c.launches,
           (long long)r->c.tasks, r->c.merge_state_bytes / 1e3, r->gbps, ceil_s, floor_s, eff, fi, ratio, r->rel_err,
           gather);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x) {
    if (isnan(x) || isinf(x))
        fputs("null", f);
    else
        fprintf(f, "%.6g", x);
}

/* ', "key": value' (null for NaN / inf) and ', "key": "text"' */
static void json_field_num(FILE *f, const char *key, double x) {
    fprintf(f, ", \"%s\": ", key);
    json_num(f, x);
}
static void json_field_str(FILE *f, const char *key, const char *text) {
    fprintf(f, ", \"%s\": ", key);
    json_str(f, text);
}

static void write_json(const char *path, const bench_opts *o, const ceilings *ce, const results *res,
                       const char *workload) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "pkv bench: cannot write %s\n", path);
        exit(1);
    }
    char commit[64] = "unknown", date[64] = "";
    const char *env = getenv("PKV_COMMIT");
    if (env && *env) {
        snprintf(commit, sizeof commit, "%s", env);
    } else {
        FILE *g = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
        if (g) {
            if (fgets(commit, sizeof commit, g)) commit[strcspn(commit, "\n")] = 0;
            if (!commit[0]) snprintf(commit, sizeof commit, "unknown");
            pclose(g);
        }
    }
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f, "{\n  \"meta\": {\"tool\": \"pkv bench\", \"commit\": ");
    json_str(f, commit);
    json_field_str(f, "date", date);
    json_field_str(f, "backend", o->cuda ? "cuda" : "cpu");
    json_field_str(f, "device", pkv_context_device_name(o->ctx));
    pkv_dev_info info;
    if (o->cuda && pkv_dev_get_info(o->ctx, &info) == PKV_OK)
        fprintf(f,
                ", \"gpu\": {\"name\": \"%s\", \"sms\": %d, \"cc\": \"%d.%d\", \"l2_bytes\": %lld, \"cuda_runtime\": "
                "%d, \"cuda_driver\": %d}",
                info.name, info.sms, info.cc_major, info.cc_minor, (long long)info.l2_bytes, info.runtime_version,
                info.driver_version);
    json_field_str(f, "command", o->cmdline);
    /* the PKV_* settings of this run (kernel choices, A/B switches) besides PKV_COMMIT: the command alone
     * does not say which kernels ran */
    fprintf(f, ", \"env\": {");
    int nenv = 0;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "PKV_", 4) != 0 || !eq || strncmp(*e, "PKV_COMMIT=", 11) == 0) continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e < 127 ? eq - *e : 127), *e);
        fprintf(f, "%s", nenv++ ? ", " : "");
        json_str(f, name);
        fprintf(f, ": ");
        json_str(f, eq + 1);
    }
    fprintf(f, "}");
    json_field_str(f, "workload", workload);
    /* what the plans were made for (pkv calibrate --replay-auto re-plans with it) */
    fprintf(f, ", \"parallelism\": %d, \"ctas_per_unit\": %d",
            o->parallelism > 0 ? o->parallelism : pkv_context_parallelism(o->ctx),
            o->ctas_per_unit > 0 ? o->ctas_per_unit : 0);
    fprintf(f,
            ",\n    \"shape\": {\"name\": \"%s\", \"num_qo_heads\": %d, \"num_kv_heads\": %d, \"head_dim\": %d, "
            "\"page_size\": %d, "
            "\"layout\": \"%s\", \"dtype\": \"%s\", \"kv_interleaved\": %s, \"window\": %d, \"logits_soft_cap\": %g}, "
            "\"reps\": %d, \"wall_reps\": %d, \"terms_version\": 2},\n",
            o->shape->name, o->prob.num_qo_heads, o->prob.num_kv_heads, o->prob.head_dim, o->prob.page_size,
            o->prob.layout == PKV_LAYOUT_HND ? "HND" : "NHD", o->prob.dtype == PKV_DTYPE_BF16 ? "bf16" : "fp16",
            o->kv_interleaved ? "true" : "false", o->prob.window, (double)o->prob.logits_soft_cap, o->reps,
            o->wall_reps);
    fprintf(f, "  \"ceilings\": {\"read_gbps\": ");
    json_num(f, ce->read_gbps);
    json_field_num(f, "empty_launch_us", ce->launch_us);
    json_field_num(f, "graph_launch_us", ce->graph_us);
    fprintf(f, "},\n  \"rows\": [\n");
    for (int i = 0; i < res->n; i++) {
        const row_result *r = &res->rows[i];
        char rl[32];
        route_label(r, rl, sizeof rl);
        fprintf(
            f,
            "    {\"step\": \"%s\", \"batch\": %d, \"total_tokens\": %lld, \"route\": \"%s\", \"route_used\": \"%s\"",
            r->step, r->batch, (long long)r->total_tokens, pkv_route_name(r->route_asked),
            pkv_route_name(r->route_used));
        if (r->decode_kernel) json_field_str(f, "decode_kernel", r->decode_kernel);
        json_field_num(f, "kernel_us", r->kernel_us);
        json_field_num(f, "kernel_p10_us", r->kernel_p10);
        json_field_num(f, "kernel_p90_us", r->kernel_p90);
        json_field_num(f, "wall_us", r->wall_us);
        json_field_num(f, "plan_us", r->plan_us);
        fprintf(f,
                ", \"kv_bytes\": %lld, \"qo_bytes\": %lld, \"merge_state_bytes\": %lld, \"launches\": %lld, \"tasks\": "
                "%lld, "
                "\"grid_ctas\": %lld, \"merges\": %lld",
                (long long)r->c.kv_bytes, (long long)r->c.qo_bytes, (long long)r->c.merge_state_bytes,
                (long long)r->c.launches, (long long)r->c.tasks, (long long)r->c.grid_ctas, (long long)r->c.merges);
        json_field_num(f, "achieved_gbps", r->gbps);
        json_field_num(f, "frac_read_ceiling", r->frac_ceiling);
        json_field_num(f, "floor_us", r->floor_us > 0 ? r->floor_us : NAN);
        json_field_num(f, "pages_floor_us", r->gather_us > 0 ? r->gather_us : NAN);
        if (!isnan(r->pair_us)) {
            json_field_num(f, "producer_us", r->producer_us);
            json_field_num(f, "producer_step_us", r->pair_us);
            json_field_num(f, "producer_trigger_us", r->producer_trig_us);
            json_field_num(f, "producer_trigger_step_us", r->pair_trig_us);
        }
        if (!isnan(r->graph_wall_us)) json_field_num(f, "graph_replay_wall_us", r->graph_wall_us);
        json_field_num(f, "step_efficiency", r->step_eff);
        json_field_num(f, "tokens_per_s", r->tokens_per_s);
        json_field_num(f, "rel_err", r->rel_err);
        json_field_num(f, "max_err", r->max_err);
        fprintf(f, ", \"unwritten_outputs\": %d", r->nan_outputs);
        json_field_num(f, "flashinfer_best_us", r->flashinfer_us > 0 ? r->flashinfer_us : NAN);
        json_field_str(f, "repro", r->repro);
        json_field_str(f, "args", r->trace);
        fprintf(f, ", \"terms\": [");
        for (int k = 0; k < PKV_COST_TERMS; k++) fprintf(f, "%s%.9g", k ? "," : "", r->terms[k]);
        fprintf(f, "], \"lens\": [");
        for (int32_t k = 0; k < r->batch && r->lens; k++) fprintf(f, "%s%d", k ? "," : "", r->lens[k]);
        fprintf(f, "]}%s\n", i + 1 < res->n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (ferror(f) | fclose(f)) { /* both: the file is closed either way */
        fprintf(stderr, "pkv bench: writing %s failed\n", path);
        exit(1);
    }
}

/* Per-route summary over the steps of a trace. */
static void print_summary(const bench_opts *o, const results *res) {
    printf("\n| route | steps | mean kernel us | mean wall us | tokens/s | launches/step | tasks/step | mean GB/s | "
           "mean of ceiling | mean step eff | worst rel err |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int k = 0; k < o->nroutes; k++) {
        double kt = 0, wt = 0, tok = 0, la = 0, ta = 0, gb = 0, fc = 0, se = 0, worst = 0;
        int n = 0, ne = 0;
        for (int i = 0; i < res->n; i++) {
            const row_result *r = &res->rows[i];
            if (r->route_asked != o->routes[k]) continue;
            n++;
            kt += r->kernel_us;
            wt += r->wall_us;
            tok += r->batch;
            la += (double)r->c.launches;
            ta += (double)r->c.tasks;
            gb += r->gbps;
            if (!isnan(r->frac_ceiling)) fc += r->frac_ceiling;
            if (!isnan(r->step_eff)) {
                se += r->step_eff;
                ne++;
            }
            if (!(r->rel_err <= worst)) worst = r->rel_err;
        }
        if (!n) continue;
        char fcs[16] = "-", ses[16] = "-";
        if (o->cuda) snprintf(fcs, sizeof fcs, "%.2f", fc / n);
        if (ne) snprintf(ses, sizeof ses, "%.2f", se / ne);
        printf("| %s | %d | %.1f | %.1f | %.0f | %.2f | %.1f | %.1f | %s | %s | %.1e |\n", pkv_route_name(o->routes[k]),
               n, kt / n, wt / n, wt > 0 ? tok / (wt * 1e-6) : 0, la / n, ta / n, gb / n, fcs, ses, worst);
    }
}

static void usage(void) {
    printf(
        "usage: pkv bench [options]\n"
        "Replays a trace, the anchor steps or one isolated step and prints a Markdown table.\n\n"
        "backend and route:\n"
        "  --backend best|cpu|cuda   (default best: cuda when a GPU is present)\n"
        "  --route R|all             auto, single, split, bucketed, workqueue, fused or all (default all)\n"
        "  --threads N               CPU backend threads\n"
        "problem:\n"
        "  --shape NAME|HQ:HKV:D     paper (default), g8, g7, mha, d256, d64, g16, or any model's query heads,\n"
        "                            KV heads and head dim (e.g. 48:4:64; fp16 unless --dtype)\n"
        "  --dtype fp16|bf16         (default: the shape's)\n"
        "  --layout nhd|hnd          (default nhd)\n"
        "  --page-size N             (default 16)\n"
        "  --window W                sliding window: each row attends to its last W tokens (default 0: all)\n"
        "  --soft-cap C              logits soft cap (Gemma-2: 50; default 0: none)\n"
        "workload (one of; default: --trace bimodal):\n"
        "  --trace FAMILY            uniform, bimodal, zipf, bucketed, homogeneous\n"
        "      --seed S --batch B --requests N --steps N (CPU default 2) --step S (one step only)\n"
        "  --trace-file PATH         a trace written by `pkv trace --out`\n"
        "  --anchor NAME|all         the anchor steps of anchors.md (paper shape)\n"
        "  --lens N1,N2,...          one isolated step with these lengths\n"
        "measuring:\n"
        "  --reps N --warmup N --wall-reps N   (CUDA defaults 100 / 10 / 20; CPU 2 / 0 / 2)\n"
        "  --rotate-gib X            KV rotated over at least X GiB (default 2)\n"
        "  --kv-interleaved          K and V of each page side by side in one pool (kv_page_stride)\n"
        "  --ctas-per-unit N         planner: tasks per SM in one wave (default: the backend's)\n"
        "  --min-chunk N             planner: smallest split in tokens (default 128)\n"
        "  --graph-max-batch N|pow2  graph-stable plans (CUDA-graph serving) for batches of up to N rows (pow2: the\n"
        "                            step's batch rounded up to a power of two); routes auto and workqueue only\n"
        "  --graph-tasks N           graph-stable plans: CTAs of the task grid (default: the most tasks the planner\n"
        "                            gives a batch of that capacity)\n"
        "  --parallelism N           planner: plan as for N SMs (default: the backend's SMs or threads;\n"
        "                            e.g. 132 on the CPU backend to run the plans an H200 would get)\n"
        "  --explain                 each route's predicted time (cost model) next to its measured time\n"
        "  --policy FILE             cost model for auto and --explain (default: the context's: PKV_POLICY, else the\n"
        "                            CUDA backend's device defaults; the CPU backend has none: auto uses its rule)\n"
        "  --calibrate-out FILE      fit the cost model to this run's measurements and write a policy file\n"
        "  --calibration-set         workload: the calibration traces (seed 20260622, five families, several B)\n"
        "  --heldout-set             workload: the held-out traces (seeds 20260623..27, five families, B 1..128)\n"
        "      --set-batches B1,B2.. --set-seeds N (first N of the five)\n"
        "  --behind-producer         also time each step behind a kernel that writes its q (a model layer's order):\n"
        "                            producer alone and producer + step, with a producer that does not and one that\n"
        "                            does trigger its programmatic dependents\n"
        "  --pdl 0|1                 launch the step's kernels as programmatic dependents of the kernel before them\n"
        "                            (pkv_context_config.pdl; default 1)\n"
        "  --no-check                skip the comparison with the float64 reference\n"
        "  --per-step                print every trace step, not only the per-route summary\n"
        "  --json PATH               write every metric as JSON\n");
}

int cmd_bench(int argc, char **argv) {
    static const char *const known[] = {"--backend",
                                        "--route",
                                        "--threads",
                                        "--shape",
                                        "--dtype",
                                        "--layout",
                                        "--page-size",
                                        "--trace",
                                        "--seed",
                                        "--batch",
                                        "--requests",
                                        "--steps",
                                        "--step",
                                        "--trace-file",
                                        "--anchor",
                                        "--lens",
                                        "--reps",
                                        "--warmup",
                                        "--wall-reps",
                                        "--rotate-gib",
                                        "--no-check!",
                                        "--per-step!",
                                        "--json",
                                        "--quiet!",
                                        "--help!",
                                        "--ctas-per-unit",
                                        "--min-chunk",
                                        "--explain!",
                                        "--policy",
                                        "--calibrate-out",
                                        "--calibration-set!",
                                        "--heldout-set!",
                                        "--set-batches",
                                        "--set-seeds",
                                        "--parallelism",
                                        "--kv-interleaved!",
                                        "--window",
                                        "--soft-cap",
                                        "--behind-producer!",
                                        "--pdl",
                                        "--graph-max-batch",
                                        "--graph-tasks",
                                        NULL};
    if (cli_flag(argc, argv, "--help")) {
        usage();
        return 0;
    }
    if (!cli_check_options(argc, argv, known, "bench")) return 2;
    bench_opts o;
    memset(&o, 0, sizeof o);
    /* the command line, for the JSON */
    static char cmdline[1024];
    size_t at = (size_t)snprintf(cmdline, sizeof cmdline, "pkv bench");
    for (int i = 0; i < argc && at < sizeof cmdline; i++)
        at += (size_t)snprintf(cmdline + at, sizeof cmdline - at, " %s", argv[i]);
    o.cmdline = cmdline;

    pkv_context_config cc;
    pkv_context_config_default(&cc);
    if (!cli_context_config(argc, argv, "bench", &cc)) return 2;
    cc.pdl = cli_opt_range(argc, argv, "--pdl", 1, 0, 1);
    o.pdl = cc.pdl;
    if (pkv_context_create(&cc, &o.ctx) != PKV_OK) {
        fprintf(stderr, "pkv bench: %s\n", pkv_last_error());
        return 1;
    }
    o.cuda = pkv_context_backend(o.ctx) == PKV_BACKEND_CUDA;

    const char *shape = cli_opt(argc, argv, "--shape");
    o.shape = cli_shape_find(shape ? shape : "paper");
    if (!o.shape) {
        fprintf(stderr, "pkv bench: unknown shape '%s'\n", shape);
        BENCH_EXIT(2);
    }
    pkv_problem_default(&o.prob);
    o.prob.num_qo_heads = o.shape->hq;
    o.prob.num_kv_heads = o.shape->hkv;
    o.prob.head_dim = o.shape->d;
    o.prob.dtype = o.shape->dtype;
    const char *dt = cli_opt(argc, argv, "--dtype");
    const char *lay = cli_opt(argc, argv, "--layout");
    if ((dt && strcmp(dt, "bf16") != 0 && strcmp(dt, "fp16") != 0) ||
        (lay && strcmp(lay, "hnd") != 0 && strcmp(lay, "nhd") != 0)) {
        fprintf(stderr, "pkv bench: --dtype takes fp16 or bf16, --layout nhd or hnd\n");
        BENCH_EXIT(2);
    }
    if (dt) o.prob.dtype = strcmp(dt, "bf16") == 0 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
    if (lay) o.prob.layout = strcmp(lay, "hnd") == 0 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD;
    o.prob.page_size = cli_opt_range(argc, argv, "--page-size", 16, 1, 256);
    o.prob.window = cli_opt_range(argc, argv, "--window", 0, 0, 1 << 30);
    o.prob.logits_soft_cap = (float)cli_opt_double(argc, argv, "--soft-cap", 0.0);
    if (!(o.prob.logits_soft_cap >= 0.0f) || isinf(o.prob.logits_soft_cap)) { /* a double past float's range too */
        fprintf(stderr, "pkv bench: --soft-cap takes a finite value >= 0 (0: none)\n");
        BENCH_EXIT(2);
    }

    const char *route = cli_opt(argc, argv, "--route");
    if (!route || strcmp(route, "all") == 0) {
        pkv_route all[MAX_ROUTES] = {PKV_ROUTE_AUTO, PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_BUCKETED,
                                     PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
        memcpy(o.routes, all, sizeof all);
        o.nroutes = MAX_ROUTES;
    } else {
        if (pkv_route_parse(route, &o.routes[0]) != PKV_OK) {
            fprintf(stderr, "pkv bench: %s\n", pkv_last_error());
            BENCH_EXIT(2);
        }
        o.nroutes = 1;
    }
    o.reps = cli_opt_range(argc, argv, "--reps", o.cuda ? 100 : 2, 1, 1000000);
    o.warmup = cli_opt_range(argc, argv, "--warmup", o.cuda ? 10 : 0, 0, 1000000);
    o.wall_reps = cli_opt_range(argc, argv, "--wall-reps", o.cuda ? 20 : 2, 1, 1000000);
    const double rotate_gib = cli_opt_double(argc, argv, "--rotate-gib", 2.0);
    if (!(rotate_gib >= 0.0 && rotate_gib <= 1024.0)) {
        fprintf(stderr, "pkv bench: --rotate-gib takes a value in [0, 1024]\n");
        BENCH_EXIT(2);
    }
    o.rotate_bytes = (int64_t)(rotate_gib * (double)(1 << 30));
    const char *json_out = cli_opt(argc, argv, "--json");
    if (json_out) { /* an unwritable path fails now, not after the measurements (and leaves no new file) */
        FILE *existing = fopen(json_out, "r");
        if (existing) fclose(existing);
        FILE *probe = fopen(json_out, "a");
        if (!probe) {
            fprintf(stderr, "pkv bench: cannot write %s\n", json_out);
            BENCH_EXIT(1);
        }
        fclose(probe);
        if (!existing) remove(json_out);
    }
    o.check = !cli_flag(argc, argv, "--no-check");
    o.kv_interleaved = cli_flag(argc, argv, "--kv-interleaved");
    o.behind = cli_flag(argc, argv, "--behind-producer");
    if (o.behind && !o.cuda)
        fprintf(stderr, "pkv bench: --behind-producer times CUDA launches; ignored on the CPU backend\n");
    o.ctas_per_unit = cli_opt_range(argc, argv, "--ctas-per-unit", 0, 0, PKV_MAX_PER_UNIT);
    o.min_chunk = cli_opt_range(argc, argv, "--min-chunk", 0, 0, 1 << 30);
    o.parallelism = cli_opt_range(argc, argv, "--parallelism", 0, 0, PKV_MAX_PARALLELISM);
    const char *gmb = cli_opt(argc, argv, "--graph-max-batch");
    o.graph_max_batch = gmb && strcmp(gmb, "pow2") == 0 ? -1 : cli_opt_range(argc, argv, "--graph-max-batch", 0, 0, PKV_MAX_BATCH);
    o.graph_tasks = cli_opt_range(argc, argv, "--graph-tasks", 0, 0, INT32_MAX / 2);
    o.per_step = cli_flag(argc, argv, "--per-step");
    o.quiet = cli_flag(argc, argv, "--quiet");
    o.explain = cli_flag(argc, argv, "--explain");
    o.calibrate_out = cli_opt(argc, argv, "--calibrate-out");
    const char *policy = cli_opt(argc, argv, "--policy");
    bool have_policy = false;
    if (policy) {
        if (pkv_cost_model_load(policy, &o.model) != PKV_OK || pkv_context_set_cost_model(o.ctx, &o.model) != PKV_OK) {
            fprintf(stderr, "pkv bench: %s\n", pkv_last_error());
            BENCH_EXIT(2);
        }
        have_policy = true;
    }

    /* workload -> steps */
    step_input *steps = NULL;
    int nsteps = 0;
    char workload[256];
    const char *anchor = cli_opt(argc, argv, "--anchor");
    const char *lens = cli_opt(argc, argv, "--lens");
    const char *tfile = cli_opt(argc, argv, "--trace-file");
    bool trace_mode = false;
    if (anchor) {
        int first = 0, last = cli_anchor_count();
        if (strcmp(anchor, "all") != 0) {
            first = cli_anchor_find(anchor);
            if (first < 0) {
                fprintf(stderr, "pkv bench: unknown anchor '%s'\n", anchor);
                BENCH_EXIT(2);
            }
            last = first + 1;
        }
        /* anchors.md's FlashInfer times: the paper shape, page 16, every token, no cap */
        bool paper = strcmp(o.shape->name, "paper") == 0 && o.prob.page_size == 16 && o.prob.window == 0 &&
                     o.prob.logits_soft_cap == 0.0f;
        steps = (step_input *)xmalloc((size_t)(last - first) * sizeof *steps);
        for (int i = first; i < last; i++) {
            pkv_anchor a;
            cli_anchor_get(i, &a);
            char arg[64];
            snprintf(arg, sizeof arg, "--anchor %s", a.name);
            make_isolated_step(&o, a.name, a.lens, a.batch, paper && o.cuda ? a.flashinfer_us : 0, arg,
                               1000 + (uint64_t)i, &steps[nsteps++]);
        }
        snprintf(workload, sizeof workload, "anchor %s", anchor);
    } else if (lens) {
        int32_t buf[4096];
        int32_t B = 0;
        const char *p = lens;
        while (*p && B < 4096) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v > 1 << 30) {
                fprintf(stderr, "pkv bench: --lens expects comma-separated lengths\n");
                BENCH_EXIT(2);
            }
            buf[B++] = (int32_t)v;
            p = *end == ',' ? end + 1 : end;
            if (*end && *end != ',') {
                fprintf(stderr, "pkv bench: --lens expects comma-separated lengths\n");
                BENCH_EXIT(2);
            }
        }
        if (*p) {
            fprintf(stderr, "pkv bench: --lens takes at most 4096 lengths\n");
            BENCH_EXIT(2);
        }
        steps = (step_input *)xmalloc(sizeof *steps);
        char arg[96];
        snprintf(arg, sizeof arg, "--lens %.80s", lens);
        make_isolated_step(&o, "lens", buf, B, 0, arg, 99, &steps[nsteps++]);
        snprintf(workload, sizeof workload, "lens %.200s", lens);
    } else if (cli_flag(argc, argv, "--calibration-set")) {
        /* the calibration traces: seed 20260622, every family, B 1, 4, 16, 64 (CPU: 1 and 4), the
         * first and the middle step of each */
        trace_mode = true;
        static const uint64_t seeds[] = {20260622};
        static const int32_t gpu_b[] = {1, 4, 16, 64}, cpu_b[] = {1, 4};
        nsteps = add_trace_set(&o, seeds, 1, o.cuda ? gpu_b : cpu_b, o.cuda ? 4 : 2, &steps);
        snprintf(workload, sizeof workload, "calibration set (seed 20260622)");
    } else if (cli_flag(argc, argv, "--heldout-set")) {
        /* the held-out traces: seeds 20260623..27, every family, B 1..128 (or --set-batches), the
         * first and the middle step of each */
        trace_mode = true;
        static const uint64_t seeds[] = {20260623, 20260624, 20260625, 20260626, 20260627};
        int32_t bs[16] = {1, 2, 4, 8, 16, 32, 64, 128};
        int nb = o.cuda ? 8 : 2;
        const char *sb = cli_opt(argc, argv, "--set-batches");
        if (sb && (nb = parse_int_list(sb, bs, 16)) <= 0) {
            fprintf(stderr, "pkv bench: --set-batches expects comma-separated batch sizes\n");
            BENCH_EXIT(2);
        }
        int ns = cli_opt_range(argc, argv, "--set-seeds", 5, 1, 5);
        nsteps = add_trace_set(&o, seeds, ns, bs, nb, &steps);
        snprintf(workload, sizeof workload, "held-out set (seeds 20260623..%d)", 20260622 + ns);
    } else {
        trace_mode = true;
        pkv_trace *tr = NULL;
        char arg[96];
        if (tfile) {
            TRY(NULL, pkv_trace_read(tfile, &tr), "trace read");
            snprintf(arg, sizeof arg, "--trace-file %.80s", tfile);
        } else {
            pkv_trace_config tc;
            if (!cli_trace_config(argc, argv, "--trace", "bench", &tc)) BENCH_EXIT(2);
            pkv_trace_family fam = tc.family;
            TRY(NULL, pkv_trace_generate(&tc, &tr), "trace generation");
            snprintf(arg, sizeof arg, "--trace %s --seed %llu --batch %d --requests %d", pkv_trace_family_name(fam),
                     (unsigned long long)tc.seed, tc.max_active, tc.num_requests);
        }
        int32_t total = pkv_trace_num_steps(tr);
        int32_t limit = cli_opt_range(argc, argv, "--steps", o.cuda ? 0 : 2, 0, INT32_MAX);
        int32_t only = cli_opt_range(argc, argv, "--step", -1, -1, INT32_MAX);
        int32_t first = 0, last = total;
        if (only >= 0) {
            if (only >= total) {
                fprintf(stderr, "pkv bench: --step %d but the trace has %d steps\n", only, total);
                pkv_trace_free(tr);
                BENCH_EXIT(2);
            }
            first = only;
            last = only + 1;
        } else if (limit > 0 && limit < total) {
            last = limit;
            if (!o.cuda)
                fprintf(stderr, "pkv bench: CPU backend replays the first %d of %d steps (--steps 0 for all)\n", limit,
                        total);
        }
        int64_t pool = pkv_trace_num_pages(tr) * o.prob.page_size * kv_bytes_per_token(&o.prob);
        int64_t min_step = INT64_MAX;
        for (int32_t s = first; s < last; s++) {
            const int32_t *ids, *ls;
            int32_t B = pkv_trace_step(tr, s, &ids, &ls);
            int64_t tok = 0;
            for (int32_t i = 0; i < B; i++) tok += attended(&o, ls[i]);
            if (tok > 0 && tok * kv_bytes_per_token(&o.prob) < min_step) min_step = tok * kv_bytes_per_token(&o.prob);
        }
        int32_t rot = choose_rotations(&o, min_step == INT64_MAX ? 0 : min_step, pool);
        steps = (step_input *)xmalloc((size_t)(last - first) * sizeof *steps);
        for (int32_t s = first; s < last; s++) make_trace_step(&o, tr, s, rot, arg, &steps[nsteps++]);
        snprintf(workload, sizeof workload, "%s (steps %d..%d of %d)", arg, first, last - 1, total);
        pkv_trace_free(tr);
    }

    /* ceilings, measured in this run */
    ceilings ce;
    memset(&ce, 0, sizeof ce);
    ce.read_gbps = NAN;
    ce.launch_us = ce.graph_us = NAN;
    if (o.cuda) {
        ce.read_buf_bytes = (size_t)4 << 30;
        for (int i = 0; i < nsteps; i++) { /* the floor of the largest step needs a buffer that large */
            size_t kvb = 0;
            for (int32_t r = 0; r < steps[i].batch; r++)
                kvb += (size_t)steps[i].lens[r] * (size_t)kv_bytes_per_token(&o.prob);
            if (kvb + (kvb >> 4) > ce.read_buf_bytes) ce.read_buf_bytes = kvb + (kvb >> 4);
        }
        TRY(o.ctx, pkv_dev_malloc(o.ctx, ce.read_buf_bytes, &ce.read_buf), "ceiling buffer");
        TRY(o.ctx, pkv_dev_fill_random(o.ctx, ce.read_buf, (int64_t)(ce.read_buf_bytes / 2), PKV_DTYPE_FP16, 7),
            "fill");
        double us = 0;
        TRY(o.ctx, pkv_dev_time_read(o.ctx, ce.read_buf, ce.read_buf_bytes, ce.read_buf_bytes, 10, &us),
            "read ceiling");
        ce.read_gbps = (double)ce.read_buf_bytes / (us * 1e3);
        TRY(o.ctx, pkv_dev_launch_latency(o.ctx, &ce.launch_us, &ce.graph_us), "launch latency");
        fprintf(stderr,
                "pkv bench: %s; read ceiling %.0f GB/s (4 GiB streaming read); empty launch %.2f us; graph replay %.2f "
                "us\n",
                pkv_context_device_name(o.ctx), ce.read_gbps, ce.launch_us, ce.graph_us);
    } else {
        fprintf(stderr, "pkv bench: %s (kernel time = wall time of pkv_run; no device ceilings)\n",
                pkv_context_device_name(o.ctx));
    }

    /* --explain shows the model auto uses: the policy file, else the context's (the CUDA backend's
     * defaults or PKV_POLICY), else defaults from this run's ceilings */
    if (!have_policy && !pkv_context_get_cost_model(o.ctx, &o.model))
        pkv_cost_model_default(&o.model, pkv_context_parallelism(o.ctx), o.cuda ? ce.read_gbps : 20.0,
                               o.cuda ? ce.launch_us : 0.0);
    buffers b;
    memset(&b, 0, sizeof b);
    pkv_plan *plan = NULL;
    TRY(NULL, pkv_plan_create(&plan), "plan create");
    results res;
    memset(&res, 0, sizeof res);
    if (!trace_mode || o.per_step) print_row_header();
    int64_t max_pool = 0;
    for (int i = 0; i < nsteps; i++)
        if (steps[i].pool_pages > max_pool) max_pool = steps[i].pool_pages;
    for (int i = 0; i < nsteps; i++) {
        step_input *s = &steps[i];
        if (!o.quiet) fprintf(stderr, "[%d/%d] %s B=%d\n", i + 1, nsteps, s->name, s->batch);
        /* trace steps share one pool: allocate it once, at its largest */
        if (trace_mode) s->pool_pages = max_pool;
        buffers_for_step(&o, &b, s, 0x5eed + (uint64_t)(trace_mode ? 0 : i));
        reference ref;
        memset(&ref, 0, sizeof ref);
        if (o.check) reference_compute(&o, &b, s, &ref);
        double floor_us = 0;
        int64_t kvb = 0;
        for (int32_t r = 0; r < s->batch; r++) kvb += attended(&o, s->lens[r]) * kv_bytes_per_token(&o.prob);
        if (o.cuda && kvb >= 16) {
            size_t fb = (size_t)kvb < ce.read_buf_bytes ? (size_t)kvb : ce.read_buf_bytes;
            TRY(o.ctx, pkv_dev_time_read(o.ctx, ce.read_buf, ce.read_buf_bytes, fb, o.reps, &floor_us), "floor");
        }
        /* isolated steps: the floor of their own pages too (a pure read of every K and V page of the
         * step, whole, through its page table): what the scattered pages cost before any compute */
        double gather_us = 0;
        const int32_t npages = s->indptr[s->batch];
        /* (the probe reads dense pools, every page whole: not a window's floor) */
        if (o.cuda && !trace_mode && npages > 0 && !o.kv_interleaved && o.prob.window == 0) {
            const size_t page_bytes = (size_t)o.prob.page_size * (size_t)kv_bytes_per_token(&o.prob) / 2; /* K or V */
            TRY(o.ctx, pkv_dev_time_gather(o.ctx, b.k, b.v, page_bytes, (const int32_t *const *)b.page_sets, b.nsets,
                                           npages, o.reps, &gather_us), "pages floor");
        }
        for (int k = 0; k < o.nroutes; k++) {
            row_result r;
            measure(&o, &b, s, o.routes[k], &ce, &ref, floor_us, gather_us, k == 0, plan, &r);
            results_push(&res, &r);
            if (!trace_mode || o.per_step) print_row(&r);
            fflush(stdout);
        }
        reference_free(&ref);
    }
    if (trace_mode) print_summary(&o, &res);
    printf("\nbackend: %s; shape %s (Hq %d, Hkv %d, d %d, %s, %s, page %d%s", pkv_context_device_name(o.ctx),
           o.shape->name, o.prob.num_qo_heads, o.prob.num_kv_heads, o.prob.head_dim,
           o.prob.dtype == PKV_DTYPE_BF16 ? "bf16" : "fp16", o.prob.layout == PKV_LAYOUT_HND ? "HND" : "NHD",
           o.prob.page_size, o.kv_interleaved ? ", K/V interleaved per page" : "");
    if (o.prob.window > 0) printf(", window %d", o.prob.window);
    if (o.prob.logits_soft_cap > 0.0f) printf(", soft cap %g", (double)o.prob.logits_soft_cap);
    printf("); workload: %s\n", workload);
    printf("planned for parallelism %d x %d tasks per unit%s\n",
           o.parallelism > 0 ? o.parallelism : pkv_context_parallelism(o.ctx),
           o.ctas_per_unit > 0 ? o.ctas_per_unit : (o.cuda ? 2 : 4),
           o.ctas_per_unit > 0 ? "" : " (4 resident waves for ragged batches of >= 128 pairs)");
    if (o.cuda)
        printf("read ceiling %.0f GB/s, empty launch %.2f us, graph replay %.2f us (measured in this run)\n",
               ce.read_gbps, ce.launch_us, ce.graph_us);
    if (o.cuda && o.behind) {
        printf("\nBehind a kernel that writes q (PDL %s): CUDA events around the producer alone and around the "
               "producer and the step; step = the difference\n\n",
               o.pdl ? "on: the step's kernels are scheduled while the producer drains" : "off");
        printf("| step | route | kernel us | producer us | producer + step us | step us | triggering producer us | "
               "+ step us | step us |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        for (int i = 0; i < res.n; i++) {
            const row_result *r = &res.rows[i];
            char rl[32];
            route_label(r, rl, sizeof rl);
            printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", r->step, rl, r->kernel_us,
                   r->producer_us, r->pair_us, r->pair_us - r->producer_us, r->producer_trig_us, r->pair_trig_us,
                   r->pair_trig_us - r->producer_trig_us);
        }
    }
    int bad = 0;
    for (int i = 0; i < res.n; i++) {
        double tol = o.prob.dtype == PKV_DTYPE_BF16 ? 2e-2 : 4e-3;
        if (o.check && (!(res.rows[i].rel_err <= tol) || res.rows[i].nan_outputs > 0)) {
            bad++;
            fprintf(stderr, "pkv bench: %s route %s: rel err %.2e, %d outputs unwritten\n", res.rows[i].step,
                    pkv_route_name(res.rows[i].route_asked), res.rows[i].rel_err, res.rows[i].nan_outputs);
        }
    }
    if (o.calibrate_out) {
        int n = 0;
        double *T = (double *)xmalloc((size_t)res.n * PKV_COST_TERMS * sizeof(double));
        double *y = (double *)xmalloc((size_t)res.n * sizeof(double));
        int32_t *step = (int32_t *)xmalloc((size_t)res.n * sizeof(int32_t));
        const char **keys = (const char **)xmalloc((size_t)res.n * 2 * sizeof(char *));
        int32_t nsteps = 0;
        for (int i = 0; i < res.n; i++) {
            if (res.rows[i].route_asked == PKV_ROUTE_AUTO || res.rows[i].route_asked == PKV_ROUTE_BUCKETED) continue;
            memcpy(T + (size_t)n * PKV_COST_TERMS, res.rows[i].terms, sizeof res.rows[i].terms);
            step[n] = cli_step_id(keys, &nsteps, res.rows[i].step, "");
            y[n++] = res.rows[i].kernel_us;
        }
        pkv_cost_model fit = o.model;
        snprintf(fit.device, sizeof fit.device, "%s", pkv_context_device_name(o.ctx));
        fit.parallelism = pkv_context_parallelism(o.ctx);
        pkv_dev_info info;
        fit.cuda_version = o.cuda && pkv_dev_get_info(o.ctx, &info) == PKV_OK ? info.runtime_version : 0;
        /* ranked by the route choice over this run's steps, as `pkv calibrate` fits */
        if (pkv_cost_model_fit_steps(n, T, y, step, &fit) != PKV_OK ||
            pkv_cost_model_save(&fit, o.calibrate_out) != PKV_OK) {
            fprintf(stderr, "pkv bench: calibration failed: %s\n", pkv_last_error());
            return 1;
        }
        printf("\ncalibrated on %d measurements (rms %.2f us) -> %s\n", n, fit.rms_us, o.calibrate_out);
        o.model = fit;
        free(T);
        free(y);
        free(step);
        free(keys);
    }
    if (o.explain) {
        printf("\n| step | route | predicted us | measured us | error | launches | MB moved | longest task MB | "
               "merge MB | tasks | slots |\n");
        printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        const int32_t par = o.parallelism > 0 ? o.parallelism : pkv_context_parallelism(o.ctx);
        int unweighed = 0;
        for (int i = 0; i < res.n; i++) {
            row_result *r = &res.rows[i];
            r->predicted_us = pkv_cost_predict(&o.model, r->terms);
            char rl[32];
            route_label(r, rl, sizeof rl);
            const bool weighed = pkv_cost_candidate(r->terms, par) != 0;
            unweighed += !weighed;
            printf("| %s | %s | %.1f%s | %.1f | %+.0f%% | %.0f | %.2f | %.3f | %.3f | %.0f | %.0f |\n", r->step, rl,
                   r->predicted_us, weighed ? "" : " (not weighed)", r->kernel_us,
                   100.0 * (r->predicted_us / r->kernel_us - 1.0),
                   r->terms[PKV_TERM_LAUNCHES], r->terms[PKV_TERM_MB], r->terms[PKV_TERM_LONGEST_MB],
                   r->terms[PKV_TERM_MERGE_MB], r->terms[PKV_TERM_TASKS], r->terms[PKV_TERM_SLOTS]);
        }
        if (unweighed)
            printf("(not weighed: a single-route plan filling fewer than half of the %d units, which auto does not "
                   "consider; pkv_cost_candidate)\n", par);
        printf("model (%s): ", o.model.device);
        cli_print_model(stdout, &o.model);
        printf("\n");
    }
    const char *json = cli_opt(argc, argv, "--json");
    if (json) {
        write_json(json, &o, &ce, &res, workload);
        fprintf(stderr, "pkv bench: wrote %s\n", json);
    }
    for (int i = 0; i < nsteps; i++) free_step(&steps[i]);
    free(steps);
    free(res.rows);
    buffers_free(&o, &b);
    if (ce.read_buf) pkv_dev_free(o.ctx, ce.read_buf);
    pkv_plan_free(plan);
    pkv_context_free(o.ctx);
    if (bad) {
        fprintf(stderr, "pkv bench: %d rows disagree with the reference\n", bad);
        return 1;
    }
    return 0;
}
