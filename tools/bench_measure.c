/* bench_measure.c - the measurements of `pkv bench`: the buffers of a step (device or host), the
 * float64 reference on sampled rows, the ceilings and floors measured in the run, and the timing of
 * one (step, route): kernel time (CUDA events, median of many runs, KV rotated over a pool larger than
 * L2; on the CPU the wall time of pkv_run), optionally behind a producer kernel, the synchronized wall
 * time of a whole step (plan + upload + launches + sync), and a graph replay of graph-stable plans. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"
#include "pkv_lab.h"

#include <math.h>
#include <string.h>

#define RESULTS_FIRST_CAP 64
/* The workspace grows to a quarter more than asked, plus this, so that the next steps seldom regrow it. */
#define WS_SLACK_BYTES 4096
/* The reference: rows of at most this many tokens in all (the longest row goes in regardless). */
#define REF_TOKEN_BUDGET (96 * 1024)
/* The read ceiling: a streaming read of a buffer at least this large, timed this many times; the buffer
 * is also the floor's, so it grows to the largest step's bytes plus 1 / 2^FLOOR_HEADROOM_SHIFT. */
#define READ_CEILING_BYTES ((size_t)4 << 30)
#define READ_CEILING_REPS 10
#define READ_CEILING_SEED 7
#define FLOOR_HEADROOM_SHIFT 4
#define MIN_FLOOR_BYTES 16 /* the read probe reads 16-byte vectors */

void results_push(results *r, const row_result *x) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : RESULTS_FIRST_CAP;
        r->rows = (row_result *)realloc(r->rows, (size_t)r->cap * sizeof *r->rows);
        if (!r->rows) {
            fprintf(stderr, "%s: out of memory\n", bench_prog);
            exit(1);
        }
    }
    r->rows[r->n++] = *x;
}

/* ---- device or host buffers ------------------------------------------------------------------ */
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

/* n random elements of q's type (dtype), or of the KV cache's (kv: an fp8 cache holds codes of values in
 * [-1, 1] divided by its scale). */
static void fill_random(const bench_opts *o, void *p, int64_t n, bool kv, uint64_t seed) {
    const pkv_problem *pr = &o->prob;
    if (kv && cli_kv_is_fp8(pr)) {
        if (o->cuda)
            TRY(o->ctx, pkv_dev_fill_random_fp8(o->ctx, p, n, pr->kv_dtype, o->kv_scale, seed), "random fill");
        else
            cli_fill_random_fp8((uint8_t *)p, n, pr->kv_dtype, o->kv_scale, seed);
    } else if (o->cuda) {
        TRY(o->ctx, pkv_dev_fill_random(o->ctx, p, n, pr->dtype, seed), "random fill");
    } else {
        cli_fill_random((uint16_t *)p, n, pr->dtype, seed);
    }
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

void buffers_free(const bench_opts *o, buffers *b) {
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

/* The K and V pools of a step's pool_pages (kv bytes each, elements of the cache's type), filled at random:
 * seed * 3 + 1 and + 2 are K's and V's streams (q's is + 3). */
static void kv_pools_for_step(const bench_opts *o, buffers *b, size_t kv, uint64_t seed) {
    const pkv_problem *p = &o->prob;
    const size_t es = cli_kv_elem_bytes(p);
    buf_free(o, b->k);
    if (!b->kv_page_stride) buf_free(o, b->v);
    if (o->kv_interleaved) { /* one pool, [pages][K page, V page] */
        const int64_t page_elems = (int64_t)p->page_size * p->num_kv_heads * p->head_dim;
        b->k = buf_alloc(o, 2 * kv);
        b->v = (char *)b->k + (size_t)page_elems * es;
        b->kv_page_stride = 2 * page_elems;
        fill_random(o, b->k, (int64_t)(2 * kv / es), true, seed * 3 + 1);
    } else {
        b->k = buf_alloc(o, kv);
        b->v = buf_alloc(o, kv);
        b->kv_page_stride = 0;
        fill_random(o, b->k, (int64_t)(kv / es), true, seed * 3 + 1);
        fill_random(o, b->v, (int64_t)(kv / es), true, seed * 3 + 2);
    }
    b->kv_bytes = kv;
}

void buffers_for_step(const bench_opts *o, buffers *b, const step_input *s, uint64_t seed) {
    const pkv_problem *p = &o->prob;
    size_t kv = (size_t)s->pool_pages * (size_t)p->page_size * (size_t)p->num_kv_heads * (size_t)p->head_dim *
                cli_kv_elem_bytes(p);
    if (kv > b->kv_bytes) kv_pools_for_step(o, b, kv, seed);
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
    fill_random(o, b->q, (int64_t)(qb / 2), false, seed * 3 + 3);
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
    b->ws_bytes = need + (need >> 2) + WS_SLACK_BYTES;
    b->ws = buf_alloc(o, b->ws_bytes);
}

/* ---- reference on sampled rows ----------------------------------------------------------------- */
void reference_free(reference *r) {
    free(r->o);
    free(r->lse);
    memset(r, 0, sizeof *r);
}

/* The rows to check: longest, shortest, first, last (each once), within REF_TOKEN_BUDGET tokens. */
static void reference_pick_rows(const step_input *s, reference *ref) {
    int32_t cand[BENCH_REF_MAX_ROWS] = {0, s->batch - 1, 0, 0};
    for (int32_t i = 0; i < s->batch; i++) {
        if (s->lens[i] > s->lens[cand[2]]) cand[2] = i;
        if (s->lens[i] < s->lens[cand[3]]) cand[3] = i;
    }
    int64_t budget = REF_TOKEN_BUDGET;
    for (int k = 0; k < BENCH_REF_MAX_ROWS; k++) {
        bool dup = false;
        for (int32_t j = 0; j < ref->nrows; j++) dup |= ref->rows[j] == cand[k];
        if (dup || (s->lens[cand[k]] > budget && ref->nrows > 0)) continue;
        ref->rows[ref->nrows++] = cand[k];
        budget -= s->lens[cand[k]];
    }
}

/* Copies the picked rows' pages (rotation 0) to the host and computes the float64 reference (an fp8 cache's
 * codes read at its scale, as the run reads them). */
void reference_compute(const bench_opts *o, const buffers *b, const step_input *s, reference *ref) {
    memset(ref, 0, sizeof *ref);
    if (s->batch == 0) return;
    const pkv_problem *p = &o->prob;
    reference_pick_rows(s, ref);
    const int32_t R = ref->nrows, ps = p->page_size;
    const size_t page_elems = (size_t)ps * p->num_kv_heads * p->head_dim, es = cli_kv_elem_bytes(p);
    int32_t indptr[BENCH_REF_MAX_ROWS + 1] = {0}, lens[BENCH_REF_MAX_ROWS];
    for (int32_t j = 0; j < R; j++) {
        lens[j] = s->lens[ref->rows[j]];
        indptr[j + 1] = indptr[j] + pages_of(lens[j], ps);
    }
    int32_t np = indptr[R];
    char *hk = (char *)xmalloc((size_t)(np ? np : 1) * page_elems * es);
    char *hv = (char *)xmalloc((size_t)(np ? np : 1) * page_elems * es);
    int32_t *hidx = (int32_t *)xmalloc((size_t)(np ? np : 1) * sizeof(int32_t));
    uint16_t *hq = (uint16_t *)xmalloc((size_t)R * p->num_qo_heads * p->head_dim * 2);
    for (int32_t j = 0; j < R; j++) {
        int32_t row = ref->rows[j];
        for (int32_t k = 0; k < indptr[j + 1] - indptr[j]; k++) {
            int32_t phys = s->pages[s->indptr[row] + k]; /* rotation 0 */
            size_t at = (size_t)(indptr[j] + k);
            const size_t pstride = b->kv_page_stride ? (size_t)b->kv_page_stride : page_elems; /* elements */
            from_backend(o, hk + at * page_elems * es, (const char *)b->k + (size_t)phys * pstride * es, page_elems * es);
            from_backend(o, hv + at * page_elems * es, (const char *)b->v + (size_t)phys * pstride * es, page_elems * es);
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
    const float scale = cli_kv_is_fp8(p) ? o->kv_scale : 0.0f;
    TRY(NULL, pkv_reference_kv(&sub, &t, hq, hk, hv, scale, scale, NULL, NULL, ref->o, ref->lse), "reference");
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

/* ---- ceilings and floors ----------------------------------------------------------------------------- */
void bench_ceilings_measure(const bench_opts *o, const bench_workload *w, ceilings *ce) {
    memset(ce, 0, sizeof *ce);
    ce->read_gbps = NAN;
    ce->launch_us = ce->graph_us = NAN;
    if (!o->cuda) {
        fprintf(stderr, "%s: %s (kernel time = wall time of pkv_run; no device ceilings)\n", bench_prog,
                pkv_context_device_name(o->ctx));
        return;
    }
    ce->read_buf_bytes = READ_CEILING_BYTES;
    for (int i = 0; i < w->nsteps; i++) { /* the floor of the largest step needs a buffer that large */
        size_t kvb = 0;
        for (int32_t r = 0; r < w->steps[i].batch; r++)
            kvb += (size_t)w->steps[i].lens[r] * (size_t)kv_bytes_per_token(&o->prob);
        const size_t need = kvb + (kvb >> FLOOR_HEADROOM_SHIFT);
        if (need > ce->read_buf_bytes) ce->read_buf_bytes = need;
    }
    TRY(o->ctx, pkv_dev_malloc(o->ctx, ce->read_buf_bytes, &ce->read_buf), "ceiling buffer");
    TRY(o->ctx,
        pkv_dev_fill_random(o->ctx, ce->read_buf, (int64_t)(ce->read_buf_bytes / 2), PKV_DTYPE_FP16, READ_CEILING_SEED),
        "fill");
    double us = 0;
    TRY(o->ctx,
        pkv_dev_time_read(o->ctx, ce->read_buf, ce->read_buf_bytes, ce->read_buf_bytes, READ_CEILING_REPS, &us),
        "read ceiling");
    ce->read_gbps = (double)ce->read_buf_bytes / (us * 1e3);
    TRY(o->ctx, pkv_dev_launch_latency(o->ctx, &ce->launch_us, &ce->graph_us), "launch latency");
    fprintf(stderr,
            "%s: %s; read ceiling %.0f GB/s (4 GiB streaming read); empty launch %.2f us; graph replay %.2f "
            "us\n",
            bench_prog, pkv_context_device_name(o->ctx), ce->read_gbps, ce->launch_us, ce->graph_us);
}

void bench_ceilings_free(const bench_opts *o, ceilings *ce) {
    if (ce->read_buf) pkv_dev_free(o->ctx, ce->read_buf);
    ce->read_buf = NULL;
}

void bench_step_floors(const bench_opts *o, const buffers *b, const step_input *s, const ceilings *ce,
                       bool trace_mode, double *floor_us, double *gather_us) {
    *floor_us = 0;
    int64_t kvb = 0;
    for (int32_t r = 0; r < s->batch; r++) kvb += attended(o, s->lens[r]) * kv_bytes_per_token(&o->prob);
    if (o->cuda && kvb >= MIN_FLOOR_BYTES) {
        size_t fb = (size_t)kvb < ce->read_buf_bytes ? (size_t)kvb : ce->read_buf_bytes;
        TRY(o->ctx, pkv_dev_time_read(o->ctx, ce->read_buf, ce->read_buf_bytes, fb, o->reps, floor_us), "floor");
    }
    /* isolated steps: the floor of their own pages too (a pure read of every K and V page of the
     * step, whole, through its page table): what the scattered pages cost before any compute */
    *gather_us = 0;
    const int32_t npages = s->indptr[s->batch];
    /* (the probe reads dense pools, every page whole: not a window's floor) */
    if (o->cuda && !trace_mode && npages > 0 && !o->kv_interleaved && o->prob.window == 0) {
        const size_t page_bytes = (size_t)o->prob.page_size * (size_t)kv_bytes_per_token(&o->prob) / 2; /* K or V */
        TRY(o->ctx, pkv_dev_time_gather(o->ctx, b->k, b->v, page_bytes, (const int32_t *const *)b->page_sets,
                                        b->nsets, npages, o->reps, gather_us), "pages floor");
    }
}

/* ---- measuring one (step, route) -------------------------------------------------------------------- */
/* What the steps of measure share: the step as planned and the tensors it runs on. */
typedef struct route_run {
    const bench_opts *o;
    buffers *b;
    const step_input *s;
    pkv_plan *plan;
    pkv_problem prob;
    pkv_page_table tab;
    pkv_plan_options opts;
    pkv_tensors t;
} route_run;

/* Plans the step for route (graph-stable when asked) and fills what the plan tells of the row. */
static void plan_route(route_run *x, pkv_route route, row_result *r) {
    const bench_opts *o = x->o;
    const step_input *s = x->s;
    x->prob = o->prob;
    x->prob.num_pages = x->b->pool_pages;
    x->tab = (pkv_page_table){s->batch, s->indptr, s->pages, s->lens};
    pkv_plan_options_default(&x->opts);
    x->opts.route = route;
    x->opts.ctas_per_unit = o->ctas_per_unit;
    x->opts.parallelism = o->parallelism;
    x->opts.min_chunk_tokens = o->min_chunk;
    if (o->graph_max_batch != 0) {
        int32_t cap = 1;
        while (cap < s->batch) cap *= 2;
        x->opts.graph_max_batch = o->graph_max_batch > 0 ? o->graph_max_batch : cap;
        x->opts.graph_tasks = o->graph_tasks;
    }
    TRY(o->ctx, pkv_plan_step(o->ctx, &x->prob, &x->tab, &x->opts, x->plan), "plan");
    ensure_workspace(o, x->b, pkv_plan_workspace_size(x->plan));
    snprintf(r->step, sizeof r->step, "%s", s->name);
    r->batch = s->batch;
    r->route_asked = route;
    r->route_used = pkv_plan_route(x->plan);
    r->c = *pkv_plan_counters(x->plan);
    r->total_tokens = r->c.total_tokens;
    pkv_cost_terms(x->plan, r->terms);
    r->flashinfer_us = s->flashinfer_us;
    x->t = (pkv_tensors){.q = x->b->q,
                         .k_cache = x->b->k,
                         .v_cache = x->b->v,
                         .kv_page_indices = x->b->page_sets[0],
                         .o = x->b->o,
                         .lse = x->b->lse,
                         .kv_page_stride = x->b->kv_page_stride,
                         .k_scale = cli_kv_is_fp8(&o->prob) ? o->kv_scale : 0.0f,
                         .v_scale = cli_kv_is_fp8(&o->prob) ? o->kv_scale : 0.0f};
    r->decode_kernel = NULL;
    if (o->cuda) TRY(o->ctx, pkv_dev_decode_kernel(o->ctx, x->plan, &x->t, &r->decode_kernel), "decode kernel");
}

/* Correctness first: one run on poisoned outputs (rotation 0), compared with the reference. */
static void check_route(route_run *x, const reference *ref, row_result *r) {
    const bench_opts *o = x->o;
    buffers *b = x->b;
    size_t on = (size_t)x->s->batch * x->prob.num_qo_heads * x->prob.head_dim * 2;
    if (o->cuda)
        TRY(o->ctx, pkv_dev_memset(o->ctx, b->o, 0xff, on), "poison");
    else
        memset(b->o, 0xff, on);
    TRY(o->ctx, pkv_run(o->ctx, x->plan, b->ws, b->ws_bytes, &x->t, NULL), "run");
    if (o->cuda) TRY(o->ctx, pkv_dev_synchronize(o->ctx), "synchronize");
    if (o->check)
        reference_compare(o, b, x->s, ref, r);
    else
        r->rel_err = r->max_err = NAN;
}

/* Kernel time: median and 10th / 90th percentiles of o->reps runs. */
static void time_kernel(route_run *x, bool warm_first, row_result *r) {
    const bench_opts *o = x->o;
    buffers *b = x->b;
    double *samples = (double *)xmalloc((size_t)o->reps * sizeof(double));
    if (o->cuda) {
        /* the first route of a step is timed twice and the first pass discarded: the first timing of a
         * step runs cold and reads slow on short steps */
        for (int pass = warm_first ? 0 : 1; pass < 2; pass++)
            TRY(o->ctx,
                pkv_dev_time_plan(o->ctx, x->plan, b->ws, b->ws_bytes, &x->t, (const int32_t *const *)b->page_sets,
                                  b->nsets, o->warmup, o->reps, samples),
                "timing");
    } else {
        for (int i = 0; i < o->reps; i++) {
            double t0 = cli_now_us();
            TRY(o->ctx, pkv_run(o->ctx, x->plan, b->ws, b->ws_bytes, &x->t, NULL), "run");
            samples[i] = cli_now_us() - t0;
        }
    }
    r->kernel_us = cli_median(samples, o->reps);
    r->kernel_p10 = cli_percentile(samples, o->reps, 0.1);
    r->kernel_p90 = cli_percentile(samples, o->reps, 0.9);
    free(samples);
}

/* --behind-producer (CUDA): behind a producer that does not trigger its dependents, then one that does. */
static void time_behind(route_run *x, row_result *r) {
    const bench_opts *o = x->o;
    buffers *b = x->b;
    r->producer_us = r->pair_us = r->producer_trig_us = r->pair_trig_us = NAN;
    if (!o->cuda || !o->behind) return;
    TRY(o->ctx,
        pkv_dev_time_plan_behind(o->ctx, x->plan, b->ws, b->ws_bytes, &x->t, (const int32_t *const *)b->page_sets,
                                 b->nsets, o->warmup, o->reps, 0, &r->producer_us, &r->pair_us),
        "timing behind a producer");
    TRY(o->ctx,
        pkv_dev_time_plan_behind(o->ctx, x->plan, b->ws, b->ws_bytes, &x->t, (const int32_t *const *)b->page_sets,
                                 b->nsets, o->warmup, o->reps, 1, &r->producer_trig_us, &r->pair_trig_us),
        "timing behind a producer");
}

/* The whole step: plan + upload + launches + sync (host clock, median, each rep on the next rotation),
 * and the plan alone; wall has room for o->wall_reps samples. */
static void time_wall(route_run *x, double *wall, row_result *r) {
    const bench_opts *o = x->o;
    buffers *b = x->b;
    const step_input *s = x->s;
    int wr = o->wall_reps;
    double *pl = (double *)xmalloc((size_t)wr * sizeof(double));
    for (int i = 0; i < wr; i++) {
        x->t.kv_page_indices = b->page_sets[i % b->nsets];
        x->tab.kv_page_indices = s->pages + (size_t)(i % b->nsets) * s->indptr[s->batch];
        double t0 = cli_now_us();
        TRY(o->ctx, pkv_plan_step(o->ctx, &x->prob, &x->tab, &x->opts, x->plan), "plan");
        double t1 = cli_now_us();
        TRY(o->ctx, pkv_run(o->ctx, x->plan, b->ws, b->ws_bytes, &x->t, NULL), "run");
        if (o->cuda) TRY(o->ctx, pkv_dev_synchronize(o->ctx), "synchronize");
        double t2 = cli_now_us();
        wall[i] = t2 - t0;
        pl[i] = t1 - t0;
    }
    r->wall_us = cli_median(wall, wr);
    r->plan_us = cli_median(pl, wr);
    free(pl);
}

/* Graph-stable plans on CUDA: the same step replayed from a graph captured once (one fixed page-id
 * buffer, as a graph needs), each replay after a new plan and its upload; wall as in time_wall. */
static void time_graph(route_run *x, double *wall, row_result *r) {
    const bench_opts *o = x->o;
    buffers *b = x->b;
    r->graph_wall_us = NAN;
    if (!o->cuda || x->opts.graph_max_batch == 0) return;
    int wr = o->wall_reps;
    x->t.kv_page_indices = b->page_sets[0];
    x->tab.kv_page_indices = x->s->pages;
    TRY(o->ctx, pkv_plan_step(o->ctx, &x->prob, &x->tab, &x->opts, x->plan), "plan");
    void *graph = NULL;
    TRY(o->ctx, pkv_dev_graph_capture(o->ctx, x->plan, b->ws, b->ws_bytes, &x->t, &graph), "graph capture");
    for (int i = 0; i < wr; i++) {
        double t0 = cli_now_us();
        TRY(o->ctx, pkv_plan_step(o->ctx, &x->prob, &x->tab, &x->opts, x->plan), "plan");
        TRY(o->ctx, pkv_dev_graph_replay(o->ctx, graph, x->plan, b->ws, b->ws_bytes), "graph replay");
        wall[i] = cli_now_us() - t0;
    }
    pkv_dev_graph_free(graph);
    r->graph_wall_us = cli_median(wall, wr);
}

/* What follows from the times: bandwidth, fractions of the ceiling and the floor, tokens per second,
 * and the command that repeats the row. */
static void derive_row(const bench_opts *o, const step_input *s, pkv_route route, const ceilings *ce,
                       double floor_us, double gather_us, row_result *r) {
    double bytes = (double)(r->c.kv_bytes + r->c.qo_bytes + r->c.merge_state_bytes);
    r->gbps = r->kernel_us > 0 ? bytes / (r->kernel_us * 1e3) : 0;
    r->frac_ceiling = ce && ce->read_gbps > 0 ? r->gbps / ce->read_gbps : NAN;
    r->floor_us = floor_us;
    r->gather_us = gather_us;
    r->step_eff = floor_us > 0 && r->kernel_us > 0 ? floor_us / r->kernel_us : NAN;
    r->tokens_per_s = r->wall_us > 0 ? s->batch / (r->wall_us * 1e-6) : 0;
    char score[128] = "";
    if (cli_kv_is_fp8(&o->prob)) {
        char scale[32];
        cli_format_float(scale, sizeof scale, o->kv_scale);
        snprintf(score, sizeof score, " --kv-dtype %s --kv-scale %s", cli_dtype_name(o->prob.kv_dtype), scale);
    }
    if (o->prob.window > 0) snprintf(score + strlen(score), sizeof score - strlen(score), " --window %d", o->prob.window);
    if (o->prob.logits_soft_cap > 0.0f)
        snprintf(score + strlen(score), sizeof score - strlen(score), " --soft-cap %g",
                 (double)o->prob.logits_soft_cap);
    snprintf(r->repro, sizeof r->repro,
             "pkv bench --backend %s --shape %s --dtype %s --layout %s --page-size %d%s %s --route %s",
             o->cuda ? "cuda" : "cpu", o->shape_name, cli_dtype_name(o->prob.dtype),
             o->prob.layout == PKV_LAYOUT_HND ? "hnd" : "nhd", o->prob.page_size, score, s->workload_arg,
             pkv_route_name(route));
    snprintf(r->trace, sizeof r->trace, "%s", s->workload_arg);
    r->lens = s->lens;
}

void measure(const bench_opts *o, buffers *b, const step_input *s, pkv_route route, const ceilings *ce,
             const reference *ref, double floor_us, double gather_us, bool warm_first, pkv_plan *plan,
             row_result *r) {
    memset(r, 0, sizeof *r);
    route_run x = {.o = o, .b = b, .s = s, .plan = plan};
    plan_route(&x, route, r);
    check_route(&x, ref, r);
    time_kernel(&x, warm_first, r);
    time_behind(&x, r);
    double *wall = (double *)xmalloc((size_t)o->wall_reps * sizeof(double));
    time_wall(&x, wall, r);
    time_graph(&x, wall, r);
    free(wall);
    derive_row(o, s, route, ce, floor_us, gather_us, r);
}
