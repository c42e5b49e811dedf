/* soak.c - many random decode steps on one context, as a server runs them: random shapes (G, KV heads,
 * head dim, page size, layout, dtype, on the CPU backend fp8 caches in a third of the epochs (e4m3 or e5m2,
 * per-tensor or per-KV-head scales), each for an epoch of steps over one page pool with holes of NaN pages
 * no row may read), and per step random lengths (empty to long rows), a random route or a
 * graph-stable plan, sometimes a sliding window or a soft cap, and a fresh random assignment of the pool's
 * pages to the rows (q is drawn per epoch).  Every step's o is poisoned before its run; every `sample`-th
 * step's o is read back whole (every element written, no NaN) and one random row is checked against the
 * float64 reference.  Every other epoch serves instead: the page manager owns the pool's pages, requests
 * arrive with prompts (appended by pkv_append_kv), grow a token per step (appended), fork (copy-on-write
 * page copies by pkv_copy_pages), roll back, are preempted when pages run out and leave; each step's table
 * comes from the manager and passes its ownership check, and on CUDA the device pool is compared with a
 * host mirror (the same appends and copies on the CPU backend) at the epoch's end.  At the end: failures,
 * the worst errors per window of steps (drift), and the device memory free before and after (leaks), on
 * stdout and as JSON.
 *
 *   soak [--backend cpu|cuda] [--steps N] [--epoch N] [--sample K] [--seed S] [--pool-mb M]
 *        [--max-len N] [--check-pages] [--max-seconds T] [--json FILE]
 *
 * Exit 0 when every check held, 1 on a failure, 77 when the backend is not there, 2 on bad options. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "pkv_lab.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct soak_opts {
    pkv_backend_kind backend;
    int64_t steps;
    int32_t epoch, sample, max_len;
    uint64_t seed;
    int64_t pool_mb;
    int check_pages;
    double max_seconds; /* stop starting steps after this long (0: no limit); the results still written */
    const char *json;
} soak_opts;

#define WINDOW_STEPS 10000
#define MAX_WINDOWS 1024
#define MAX_B 64

typedef struct soak_stats {
    int64_t steps, sampled, failures, runs_by_route[PKV_ROUTE_COUNT_ + 1], epochs;
    int64_t served_steps, arrivals, forks, cow_copies, rollbacks, preemptions, departures, appended_tokens;
    double worst_o[2], worst_lse;              /* fp16, bf16 */
    double window_worst[MAX_WINDOWS];          /* worst relative error of o per WINDOW_STEPS steps */
    int64_t mem_free_start, mem_free_end;      /* device memory free after set-up and after teardown */
    int64_t mem_free_min, mem_free_max;        /* at each epoch's end, its pool freed */
} soak_stats;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    const long long v = strtoll(s, &end, 10);
    if (!s[0] || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int parse_opts(int argc, char **argv, soak_opts *o) {
    o->backend = PKV_BACKEND_CUDA;
    o->steps = 100000;
    o->epoch = 2000;
    o->sample = 10;
    o->seed = 1;
    o->pool_mb = 256;
    o->max_len = 65536;
    o->check_pages = 0;
    o->max_seconds = 0;
    o->json = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x = 0;
        if (strcmp(a, "--check-pages") == 0) {
            o->check_pages = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "soak: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--backend") == 0 && (strcmp(v, "cpu") == 0 || strcmp(v, "cuda") == 0))
            o->backend = v[1] == 'p' ? PKV_BACKEND_CPU : PKV_BACKEND_CUDA;
        else if (strcmp(a, "--steps") == 0 && parse_i64(v, 1, INT64_C(1) << 40, &x)) o->steps = x;
        else if (strcmp(a, "--epoch") == 0 && parse_i64(v, 1, 1 << 30, &x)) o->epoch = (int32_t)x;
        else if (strcmp(a, "--sample") == 0 && parse_i64(v, 1, 1 << 30, &x)) o->sample = (int32_t)x;
        else if (strcmp(a, "--seed") == 0 && parse_i64(v, 0, INT64_MAX, &x)) o->seed = (uint64_t)x;
        else if (strcmp(a, "--pool-mb") == 0 && parse_i64(v, 1, 1 << 16, &x)) o->pool_mb = x;
        else if (strcmp(a, "--max-len") == 0 && parse_i64(v, 1, 1 << 24, &x)) o->max_len = (int32_t)x;
        else if (strcmp(a, "--max-seconds") == 0 && parse_i64(v, 1, 1 << 30, &x)) o->max_seconds = (double)x;
        else if (strcmp(a, "--json") == 0) o->json = v;
        else {
            fprintf(stderr, "soak: bad option %s %s\n", a, v);
            return 2;
        }
    }
    return 0;
}

/* One epoch's shape and pool.  Pages [0, usable) are dealt to rows; [usable, num_pages) are holes of NaN. */
typedef struct epoch {
    pkv_problem p;
    int64_t usable, pool_elems;
    uint16_t *k, *v;   /* host pools (the reference reads them); an fp8 cache's: pool_elems bytes */
    void *dk, *dv;     /* device pools (CUDA) */
    float ks, vs;      /* an fp8 cache's scales: per tensor (0: 1.0), or per KV head [Hkv] (else NULL) */
    float *kh, *vh;
} epoch;

static int32_t pick_i32(pkv_rng *rng, const int32_t *vals, int32_t n) { return vals[pkv_test_pick(rng, n)]; }

static bool epoch_begin(pkv_context *ctx, const soak_opts *o, pkv_rng *rng, epoch *e) {
    static const int32_t groups[] = {1, 2, 3, 4, 5, 7, 8, 12, 16}, hkvs[] = {1, 2, 4, 8}, dims[] = {64, 128, 256},
                         pages[] = {1, 2, 7, 8, 16, 24, 32, 64, 128, 256};
    memset(e, 0, sizeof *e);
    pkv_problem_default(&e->p);
    const int32_t G = pick_i32(rng, groups, 9), hkv = G * 8 > 64 ? 1 + (int32_t)pkv_test_pick(rng, 2) : pick_i32(rng, hkvs, 4);
    e->p.num_kv_heads = hkv;
    e->p.num_qo_heads = G * hkv;
    e->p.head_dim = pick_i32(rng, dims, 3);
    e->p.page_size = pick_i32(rng, pages, 10);
    e->p.layout = pkv_test_pick(rng, 2) ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD;
    e->p.dtype = pkv_test_pick(rng, 2) ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
    const bool fp8 = pkv_context_backend(ctx) == PKV_BACKEND_CPU && pkv_test_pick(rng, 3) == 0;
    if (fp8) { /* the CUDA decode kernels do not read fp8 caches yet */
        e->p.kv_dtype = pkv_test_pick(rng, 2) ? PKV_DTYPE_FP8_E5M2 : PKV_DTYPE_FP8_E4M3;
        if (pkv_test_pick(rng, 2)) {
            e->kh = (float *)malloc((size_t)hkv * sizeof(float));
            e->vh = (float *)malloc((size_t)hkv * sizeof(float));
            if (!e->kh || !e->vh) return false;
            for (int32_t h = 0; h < hkv; h++)
                e->kh[h] = (float)(0.005 + 0.5 * pkv_rng_uniform01(rng)), e->vh[h] = (float)(0.005 + 0.5 * pkv_rng_uniform01(rng));
        } else {
            e->ks = pkv_test_pick(rng, 4) ? (float)(0.005 + 0.5 * pkv_rng_uniform01(rng)) : 0.0f;
            e->vs = pkv_test_pick(rng, 4) ? (float)(0.005 + 0.5 * pkv_rng_uniform01(rng)) : 0.0f;
        }
    }
    const size_t es = fp8 ? 1 : 2;
    const int64_t page_elems = (int64_t)e->p.page_size * hkv * e->p.head_dim;
    int64_t num_pages = o->pool_mb * 1024 * 1024 / 2 / page_elems;
    if (num_pages < 16) num_pages = 16;
    e->p.num_pages = num_pages;
    e->usable = num_pages - num_pages / 5; /* a fifth of the pool: holes */
    e->pool_elems = num_pages * page_elems;
    e->k = (uint16_t *)malloc((size_t)e->pool_elems * es);
    e->v = (uint16_t *)malloc((size_t)e->pool_elems * es);
    if (!e->k || !e->v) return false;
    const int64_t hole_from = e->usable * page_elems;
    if (fp8) { /* codes of magnitude up to 2, random signs; NaN codes in the holes */
        uint8_t *k8 = (uint8_t *)e->k, *v8 = (uint8_t *)e->v;
        for (int64_t i = 0; i < e->pool_elems; i++) {
            k8[i] = i < hole_from ? (uint8_t)(pkv_rng_uniform_int(rng, 0, 0x40) | (pkv_rng_next(rng) & 0x80)) : PKV_TEST_NAN_FP8;
            v8[i] = i < hole_from ? (uint8_t)(pkv_rng_uniform_int(rng, 0, 0x40) | (pkv_rng_next(rng) & 0x80)) : PKV_TEST_NAN_FP8;
        }
        return true;
    }
    const uint16_t nan_bits = pkv_test_nan_bits(e->p.dtype);
    for (int64_t i = 0; i < e->pool_elems; i++) {
        e->k[i] = i < hole_from ? pkv_test_random_value(rng, e->p.dtype) : nan_bits;
        e->v[i] = i < hole_from ? pkv_test_random_value(rng, e->p.dtype) : nan_bits;
    }
    if (pkv_context_backend(ctx) == PKV_BACKEND_CUDA) {
        const size_t bytes = (size_t)e->pool_elems * 2;
        if (pkv_dev_malloc(ctx, bytes, &e->dk) != PKV_OK || pkv_dev_malloc(ctx, bytes, &e->dv) != PKV_OK ||
            pkv_dev_copy_h2d(ctx, e->dk, e->k, bytes) != PKV_OK || pkv_dev_copy_h2d(ctx, e->dv, e->v, bytes) != PKV_OK)
            return false;
    }
    return true;
}

static void epoch_end(pkv_context *ctx, epoch *e) {
    if (e->dk) pkv_dev_free(ctx, e->dk);
    if (e->dv) pkv_dev_free(ctx, e->dv);
    free(e->k);
    free(e->v);
    free(e->kh);
    free(e->vh);
    memset(e, 0, sizeof *e);
}

/* A step's lengths: mostly short, some long, some empty or of one token; the total within the pool. */
static int32_t step_lengths(pkv_rng *rng, const soak_opts *o, const epoch *e, int32_t *lens) {
    const int32_t B = (int32_t)pkv_rng_uniform_int(rng, 1, pkv_test_pick(rng, 4) == 0 ? MAX_B : 16);
    const int64_t ps = e->p.page_size;
    int64_t pages_left = e->usable;
    for (int32_t i = 0; i < B; i++) {
        const double u = pkv_rng_uniform01(rng);
        int64_t n = u < 0.05 ? 0 : u < 0.10 ? 1 : u < 0.70 ? pkv_rng_uniform_int(rng, 2, 2048)
                  : u < 0.95 ? pkv_rng_uniform_int(rng, 2048, 16384) : pkv_rng_uniform_int(rng, 16384, o->max_len);
        if (n > o->max_len) n = o->max_len;
        int64_t need = (n + ps - 1) / ps + 1; /* a spare page for rows that own one more */
        if (need > pages_left / (B - i)) {
            n = (pages_left / (B - i) - 1) * ps;
            if (n < 0) n = 0;
            need = (n + ps - 1) / ps + 1;
        }
        lens[i] = (int32_t)n;
        pages_left -= need;
    }
    return B;
}

/* Deals pages to the rows: a partial Fisher-Yates shuffle of the usable ids (perm persists across steps). */
static void deal_pages(pkv_rng *rng, const epoch *e, int32_t *perm, int32_t B, const int32_t *lens, int32_t *indptr,
                       int32_t *indices) {
    int64_t next = 0;
    indptr[0] = 0;
    for (int32_t i = 0; i < B; i++) {
        int64_t np = (lens[i] + e->p.page_size - 1) / e->p.page_size + (pkv_test_pick(rng, 8) == 0);
        for (int64_t j = 0; j < np; j++, next++) {
            const int64_t r = pkv_rng_uniform_int(rng, next, e->usable - 1);
            const int32_t t = perm[next];
            perm[next] = perm[r];
            perm[r] = t;
            indices[next] = perm[next];
        }
        indptr[i + 1] = (int32_t)next;
    }
}

/* Everything a step needs, across epochs: the contexts, the plan, host and device buffers, the counters. */
typedef struct soak {
    soak_opts o;
    pkv_context *ctx;   /* the backend under test */
    pkv_context *hctx;  /* CPU: the host mirror's appends and copies (ctx itself on the CPU backend) */
    bool cuda;
    pkv_rng rng;
    pkv_plan *plan;
    soak_stats s;
    uint16_t *h_q, *h_o;
    float *h_lse;
    double *ref_o, *ref_lse;
    void *d_q, *d_o, *d_lse, *d_idx, *ws;
    size_t ws_cap, idx_cap;
} soak;

/* Buffers of the largest step: MAX_B rows of up to 64 x 256 outputs. */
#define O_CAP ((size_t)MAX_B * 64 * 256)
#define LSE_CAP ((size_t)MAX_B * 64)

static bool grow_dev(soak *S, void **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    if (*buf) pkv_dev_free(S->ctx, *buf);
    *buf = NULL;
    *cap = 0;
    if (pkv_dev_malloc(S->ctx, need, buf) != PKV_OK) return false;
    *cap = need;
    return true;
}

/* One attention step on the given table: a random route (or a graph-stable plan), o poisoned, run; on a
 * sampled step every output checked written and one random row against the float64 reference.  Returns
 * false when the soak must stop (a CUDA error, or too many failures). */
static bool attend(soak *S, const epoch *e, pkv_problem p, int32_t B, const int32_t *lens, const int32_t *indptr,
                   const int32_t *indices, int64_t step) {
    soak_stats *s = &S->s;
    pkv_page_table table = {B, indptr, indices, lens};
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    const int r = (int)pkv_test_pick(&S->rng, PKV_ROUTE_COUNT_ + 1); /* the last: a graph-stable plan */
    opts.route = r < PKV_ROUTE_COUNT_ ? (pkv_route)r : PKV_ROUTE_AUTO;
    if (r == PKV_ROUTE_COUNT_) opts.graph_max_batch = B + (int32_t)pkv_test_pick(&S->rng, 8);
    pkv_status st = pkv_plan_step(S->ctx, &p, &table, &opts, S->plan);
    if (st != PKV_OK) {
        fprintf(stderr, "soak: step %lld: plan failed: %s\n", (long long)step, pkv_last_error());
        s->failures++;
        return s->failures <= 20;
    }
    const size_t need = pkv_plan_workspace_size(S->plan);
    if (need > S->ws_cap) {
        if (S->cuda) {
            if (!grow_dev(S, &S->ws, &S->ws_cap, need)) return false;
        } else {
            free(S->ws);
            S->ws = malloc(need);
            if (!S->ws) return false;
            S->ws_cap = need;
        }
    }
    const int64_t q_elems = (int64_t)B * p.num_qo_heads * p.head_dim;
    const size_t o_bytes = (size_t)q_elems * 2, lse_bytes = (size_t)B * p.num_qo_heads * sizeof(float);
    pkv_tensors t;
    memset(&t, 0, sizeof t);
    if (S->cuda) {
        if (!grow_dev(S, &S->d_idx, &S->idx_cap, (size_t)(indptr[B] > 0 ? indptr[B] : 1) * 4)) return false;
        if (indptr[B] > 0) st = pkv_dev_copy_h2d(S->ctx, S->d_idx, indices, (size_t)indptr[B] * 4);
        if (st == PKV_OK) st = pkv_dev_memset(S->ctx, S->d_o, 0xff, o_bytes); /* NaN: unwritten shows */
        if (st == PKV_OK) st = pkv_dev_memset(S->ctx, S->d_lse, 0xff, lse_bytes);
        t = (pkv_tensors){S->d_q, e->dk, e->dv, (const int32_t *)S->d_idx, S->d_o, (float *)S->d_lse, 0, 0, 0, 0.0f, 0.0f, NULL, NULL};
    } else {
        memset(S->h_o, 0xff, o_bytes);
        memset(S->h_lse, 0xff, lse_bytes);
        t = (pkv_tensors){S->h_q, e->k, e->v, indices, S->h_o, S->h_lse, 0, 0, 0, e->ks, e->vs, e->kh, e->vh};
    }
    if (st == PKV_OK) st = pkv_run(S->ctx, S->plan, S->ws, S->ws_cap, &t, NULL);
    s->steps++;
    s->runs_by_route[r]++;
    if (st != PKV_OK) {
        fprintf(stderr, "soak: step %lld (route %d): run failed: %s\n", (long long)step, r, pkv_last_error());
        s->failures++;
        return !S->cuda && s->failures <= 20; /* a CUDA error leaves the context unusable */
    }
    if (step % S->o.sample != 0) return true;
    if (S->cuda) {
        st = pkv_dev_copy_d2h(S->ctx, S->h_o, S->d_o, o_bytes);
        if (st == PKV_OK) st = pkv_dev_copy_d2h(S->ctx, S->h_lse, S->d_lse, lse_bytes);
        if (st != PKV_OK) {
            fprintf(stderr, "soak: step %lld: %s\n", (long long)step, pkv_last_error());
            s->failures++;
            return false;
        }
    }
    s->sampled++;
    int64_t unwritten = 0;
    for (int64_t i = 0; i < q_elems; i++) unwritten += isnan(pkv_test_to_float(S->h_o[i], p.dtype));
    const int32_t row = (int32_t)pkv_test_pick(&S->rng, B), hq = p.num_qo_heads, d = p.head_dim;
    const int32_t one_indptr[2] = {0, indptr[row + 1] - indptr[row]};
    pkv_page_table one = {1, one_indptr, indices + indptr[row], &lens[row]};
    st = pkv_reference_kv(&p, &one, S->h_q + (int64_t)row * hq * d, e->k, e->v, e->ks, e->vs, e->kh, e->vh, S->ref_o,
                          S->ref_lse);
    double num = 0, den = 0, lse_err = 0;
    for (int64_t i = 0; st == PKV_OK && i < (int64_t)hq * d; i++) {
        const double x = pkv_test_to_float(S->h_o[(int64_t)row * hq * d + i], p.dtype), dx = x - S->ref_o[i];
        num += dx * dx;
        den += S->ref_o[i] * S->ref_o[i];
    }
    for (int32_t h = 0; st == PKV_OK && h < hq; h++) {
        const double l = S->h_lse[row * hq + h], lr = S->ref_lse[h];
        const double err = isinf(lr) ? (l == lr ? 0.0 : INFINITY) : fabs(l - lr) / fmax(1.0, fabs(lr));
        if (!(err <= lse_err)) lse_err = err;
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num); /* an empty row: o must be 0 */
    const int di = p.dtype == PKV_DTYPE_BF16;
    const double tol = di ? 1.5e-2 : 2e-3;
    if (rel > s->worst_o[di] || isnan(rel)) s->worst_o[di] = isnan(rel) ? INFINITY : rel;
    if (lse_err > s->worst_lse) s->worst_lse = lse_err;
    const int64_t w = step / WINDOW_STEPS < MAX_WINDOWS ? step / WINDOW_STEPS : MAX_WINDOWS - 1;
    if (rel / tol > s->window_worst[w] || isnan(rel)) s->window_worst[w] = isnan(rel) ? INFINITY : rel / tol;
    if (st != PKV_OK || unwritten || !(rel < tol) || !(lse_err < 1e-2)) {
        s->failures++;
        fprintf(stderr,
                "soak: step %lld route %d B %d row %d (len %d) G %d Hkv %d d %d page %d %s %s kv_dtype %d window %d "
                "cap %g: unwritten %lld, relative L2 %.3g, lse error %.3g%s%s\n",
                (long long)step, r, B, row, lens[row], hq / p.num_kv_heads, p.num_kv_heads, d, p.page_size,
                p.layout == PKV_LAYOUT_HND ? "HND" : "NHD", di ? "bf16" : "fp16", (int)p.kv_dtype, p.window,
                (double)p.logits_soft_cap, (long long)unwritten, rel, lse_err, st ? ": " : "", st ? pkv_last_error() : "");
    }
    return s->failures <= 20;
}

/* ---- serving epochs: the page manager owns the pool's usable pages -------------------------------------- */
#define MAX_REQ 256
#define RAND_ELEMS ((int64_t)1 << 22) /* the epoch's random K/V values, read at random offsets */

typedef struct serving {
    pkv_page_pool *pool;
    int32_t live[MAX_REQ], nlive, left[MAX_REQ], free_ids[MAX_REQ], nfree;
    uint16_t *rand;     /* RAND_ELEMS random values of the dtype (twice over, so windows need no wrap) */
    void *d_k, *d_v;    /* device copies of a step's new K and V */
    void *d_meta;       /* device: indptr [MAX_B + 1], seq_lens [MAX_B], append_indptr [2] */
    int32_t *indices;   /* the step's table (host) */
    int64_t cap;
} serving;

static bool serving_begin(soak *S, const epoch *e, serving *v) {
    memset(v, 0, sizeof *v);
    if (pkv_page_pool_create(e->usable, e->p.page_size, MAX_REQ, &v->pool) != PKV_OK) return false;
    for (int32_t i = MAX_REQ - 1; i >= 0; i--) v->free_ids[v->nfree++] = i;
    v->rand = (uint16_t *)malloc((size_t)RAND_ELEMS * 2 * 2);
    v->cap = e->usable;
    v->indices = (int32_t *)malloc((size_t)v->cap * sizeof(int32_t));
    if (!v->rand || !v->indices) return false;
    for (int64_t i = 0; i < RAND_ELEMS; i++) v->rand[i] = v->rand[i + RAND_ELEMS] = pkv_test_random_value(&S->rng, e->p.dtype);
    if (S->cuda && (pkv_dev_malloc(S->ctx, (size_t)RAND_ELEMS * 2, &v->d_k) != PKV_OK ||
                    pkv_dev_malloc(S->ctx, (size_t)RAND_ELEMS * 2, &v->d_v) != PKV_OK ||
                    pkv_dev_malloc(S->ctx, (size_t)(3 * MAX_B + 3) * 4, &v->d_meta) != PKV_OK))
        return false;
    return true;
}

static void serving_end(soak *S, serving *v) {
    pkv_page_pool_free(v->pool);
    free(v->rand);
    free(v->indices);
    if (v->d_k) pkv_dev_free(S->ctx, v->d_k);
    if (v->d_v) pkv_dev_free(S->ctx, v->d_v);
    if (v->d_meta) pkv_dev_free(S->ctx, v->d_meta);
    memset(v, 0, sizeof *v);
}

/* The manager's table of rows (host), its index array grown to what forks' shared pages add up to. */
static bool table_of(serving *v, const int32_t *rows, int32_t B, int32_t *indptr, int32_t *lens) {
    int64_t need = 0;
    if (pkv_page_pool_table_size(v->pool, rows, B, &need) != PKV_OK) return false;
    if (need > v->cap) {
        int32_t *grown = (int32_t *)realloc(v->indices, (size_t)need * 2 * sizeof(int32_t));
        if (!grown) return false;
        v->indices = grown;
        v->cap = need * 2;
    }
    return pkv_page_pool_table(v->pool, rows, B, indptr, v->indices, v->cap, NULL, lens) == PKV_OK;
}

static void drop(serving *v, int32_t k) { /* live[k] leaves (already freed in the pool) */
    v->free_ids[v->nfree++] = v->live[k];
    v->live[k] = v->live[--v->nlive];
}

/* Appends n tokens of rows rows[0..B) (the ragged form: the rows' last n_i tokens; decode: n_i = 1) from
 * random windows, into the host mirror and, on CUDA, the device pool. */
static bool append_rows(soak *S, const epoch *e, serving *v, int32_t B, const int32_t *rows, const int32_t *n) {
    const int64_t tok = (int64_t)e->p.num_kv_heads * e->p.head_dim;
    int32_t indptr[MAX_B + 1], lens[MAX_B], aptr[MAX_B + 1];
    if (!table_of(v, rows, B, indptr, lens)) return false;
    aptr[0] = 0;
    for (int32_t i = 0; i < B; i++) aptr[i + 1] = aptr[i] + n[i];
    const int64_t elems = (int64_t)aptr[B] * tok;
    if (elems == 0) return true;
    if (elems > RAND_ELEMS) return false;
    const int64_t ok = pkv_rng_uniform_int(&S->rng, 0, RAND_ELEMS - 1), ov = pkv_rng_uniform_int(&S->rng, 0, RAND_ELEMS - 1);
    pkv_append_tensors a;
    memset(&a, 0, sizeof a);
    a.k = v->rand + ok, a.v = v->rand + ov;
    a.k_cache = e->k, a.v_cache = e->v;
    a.kv_indptr = indptr, a.kv_page_indices = v->indices, a.seq_lens = lens, a.append_indptr = aptr;
    a.k_scale = e->ks, a.v_scale = e->vs, a.k_head_scales = e->kh, a.v_head_scales = e->vh;
    if (pkv_append_kv(S->hctx, &e->p, B, aptr[B], &a, NULL) != PKV_OK) return false;
    if (!S->cuda) return true;
    int32_t *meta = (int32_t *)v->d_meta;
    if (!grow_dev(S, &S->d_idx, &S->idx_cap, (size_t)(indptr[B] > 0 ? indptr[B] : 1) * 4)) return false;
    pkv_status st = pkv_dev_copy_h2d(S->ctx, v->d_k, v->rand + ok, (size_t)elems * 2);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(S->ctx, v->d_v, v->rand + ov, (size_t)elems * 2);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(S->ctx, S->d_idx, v->indices, (size_t)indptr[B] * 4);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(S->ctx, meta, indptr, (size_t)(B + 1) * 4);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(S->ctx, meta + MAX_B + 1, lens, (size_t)B * 4);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(S->ctx, meta + 2 * MAX_B + 1, aptr, (size_t)(B + 1) * 4);
    a.k = v->d_k, a.v = v->d_v;
    a.k_cache = e->dk, a.v_cache = e->dv;
    a.kv_indptr = meta, a.kv_page_indices = (const int32_t *)S->d_idx, a.seq_lens = meta + MAX_B + 1;
    a.append_indptr = meta + 2 * MAX_B + 1;
    if (st == PKV_OK) st = pkv_append_kv(S->ctx, &e->p, B, aptr[B], &a, NULL);
    return st == PKV_OK;
}

static bool copy_pages(soak *S, const epoch *e, const pkv_page_copy *c, int32_t count) {
    if (count == 0) return true;
    if (pkv_copy_pages(S->hctx, &e->p, c, count, e->k, e->v, 0, NULL) != PKV_OK) return false;
    return !S->cuda || pkv_copy_pages(S->ctx, &e->p, c, count, e->dk, e->dv, 0, NULL) == PKV_OK;
}

/* Preempts a random live request (frees it), as a server does when pages run out. */
static void preempt(soak *S, serving *v) {
    if (v->nlive == 0) return;
    const int32_t k = (int32_t)pkv_test_pick(&S->rng, v->nlive);
    pkv_request_free(v->pool, v->live[k]);
    drop(v, k);
    S->s.preemptions++;
}

/* One serving step: departures, rollbacks, forks, arrivals (prompt appended), a token for every live
 * request (copies, then the append), the manager's table checked, attention.  False: stop the soak. */
static bool serve_step(soak *S, const epoch *e, serving *v, int64_t step) {
    soak_stats *s = &S->s;
    pkv_rng *rng = &S->rng;
    const int32_t ps = e->p.page_size;
    const int64_t tok = (int64_t)e->p.num_kv_heads * e->p.head_dim;
    for (int32_t k = v->nlive - 1; k >= 0; k--) /* departures: each request has its decode budget */
        if (--v->left[v->live[k]] <= 0) {
            if (pkv_request_free(v->pool, v->live[k]) != PKV_OK) return false;
            drop(v, k);
            s->departures++;
        }
    if (v->nlive > 0 && pkv_test_pick(rng, 50) == 0) { /* a rollback of a few tokens */
        const int32_t r = v->live[pkv_test_pick(rng, v->nlive)];
        int32_t len = 0;
        pkv_request_length(v->pool, r, &len);
        if (pkv_request_truncate(v->pool, r, len > 8 ? len - (int32_t)pkv_rng_uniform_int(rng, 1, 8) : len) != PKV_OK)
            return false;
        s->rollbacks++;
    }
    if (v->nlive > 0 && v->nlive < MAX_B && v->nfree > 0 && pkv_test_pick(rng, 20) == 0) { /* a fork */
        const int32_t src = v->live[pkv_test_pick(rng, v->nlive)], dst = v->free_ids[--v->nfree];
        if (pkv_request_fork(v->pool, src, dst) != PKV_OK) return false;
        v->live[v->nlive++] = dst;
        v->left[dst] = (int32_t)pkv_rng_uniform_int(rng, 4, 200);
        s->forks++;
    }
    const int32_t target = (int32_t)(8 + step % 40); /* the batch breathes between 8 and 47 */
    for (int a = 0; a < 2 && v->nlive < target && v->nfree > 0; a++) { /* arrivals */
        int64_t max_prompt = RAND_ELEMS / tok < 6000 ? RAND_ELEMS / tok : 6000;
        if (max_prompt > e->usable * ps / 16) max_prompt = e->usable * ps / 16; /* a sixteenth of the pool */
        const int32_t prompt = (int32_t)pkv_rng_uniform_int(rng, 0, max_prompt);
        const int32_t r = v->free_ids[v->nfree - 1];
        pkv_status st = pkv_request_create(v->pool, r, prompt);
        if (st == PKV_ERR_POOL_EXHAUSTED) {
            preempt(S, v);
            break;
        }
        if (st != PKV_OK) return false;
        v->nfree--;
        v->live[v->nlive++] = r;
        v->left[r] = (int32_t)pkv_rng_uniform_int(rng, 8, 400);
        if (!append_rows(S, e, v, 1, &r, &prompt)) return false;
        s->arrivals++;
        s->appended_tokens += prompt;
    }
    /* a token for every live request (preempting others while pages run out): the copy-on-write copies
     * first, then the append */
    pkv_page_copy copies[MAX_B];
    int32_t ncopy = 0, ones[MAX_B], pending[MAX_B];
    const int32_t npending = v->nlive;
    memcpy(pending, v->live, (size_t)npending * sizeof(int32_t));
    for (int32_t j = 0; j < npending; j++) {
        const int32_t r = pending[j];
        int32_t k = 0;
        while (k < v->nlive && v->live[k] != r) k++;
        if (k == v->nlive) continue; /* preempted meanwhile */
        pkv_page_copy c;
        pkv_status st = pkv_request_extend(v->pool, r, 1, &c);
        while (st == PKV_ERR_POOL_EXHAUSTED && v->nlive > 1) { /* preempt another request, retry */
            int32_t victim = (int32_t)pkv_test_pick(rng, v->nlive);
            if (v->live[victim] == r) victim = (victim + 1) % v->nlive;
            pkv_request_free(v->pool, v->live[victim]);
            drop(v, victim);
            s->preemptions++;
            st = pkv_request_extend(v->pool, r, 1, &c);
        }
        if (st == PKV_ERR_POOL_EXHAUSTED) { /* alone and still no page: preempted itself */
            pkv_request_free(v->pool, r);
            drop(v, 0);
            s->preemptions++;
            continue;
        }
        if (st != PKV_OK) return false;
        if (c.src_page >= 0) copies[ncopy++] = c;
    }
    for (int32_t k = 0; k < v->nlive; k++) ones[k] = 1;
    s->cow_copies += ncopy;
    if (!copy_pages(S, e, copies, ncopy)) return false;
    const int32_t B = v->nlive;
    if (B == 0) return true;
    if (!append_rows(S, e, v, B, v->live, ones)) return false;
    s->appended_tokens += B;
    /* the step's table from the manager, checked, then attention over it */
    int32_t indptr[MAX_B + 1], lens[MAX_B];
    if (!table_of(v, v->live, B, indptr, lens)) return false;
    const pkv_page_table t = {B, indptr, v->indices, lens};
    pkv_problem p = e->p;
    if (pkv_page_pool_check_table(v->pool, v->live, &t) != PKV_OK || pkv_check_page_table(&p, &t) != PKV_OK) {
        fprintf(stderr, "soak: step %lld: the manager's table fails its check: %s\n", (long long)step, pkv_last_error());
        s->failures++;
        return false;
    }
    pkv_page_pool_stats ps_;
    if (pkv_page_pool_get_stats(v->pool, &ps_) != PKV_OK || ps_.pages_used + ps_.pages_free != ps_.num_pages ||
        ps_.live_requests != v->nlive) {
        fprintf(stderr, "soak: step %lld: the pool's counters disagree\n", (long long)step);
        s->failures++;
        return false;
    }
    s->served_steps++;
    return attend(S, e, p, B, lens, indptr, v->indices, step);
}

/* CUDA: the device pool equals the host mirror (every append and copy went to both). */
static bool pools_agree(soak *S, const epoch *e) {
    if (!S->cuda) return true;
    const size_t bytes = (size_t)e->pool_elems * 2;
    uint16_t *h = (uint16_t *)malloc(bytes);
    bool ok = h && pkv_dev_copy_d2h(S->ctx, h, e->dk, bytes) == PKV_OK && memcmp(h, e->k, bytes) == 0 &&
              pkv_dev_copy_d2h(S->ctx, h, e->dv, bytes) == PKV_OK && memcmp(h, e->v, bytes) == 0;
    free(h);
    if (!ok) fprintf(stderr, "soak: the device pool differs from the host mirror after a serving epoch\n");
    return ok;
}

int main(int argc, char **argv) {
    soak S;
    memset(&S, 0, sizeof S);
    int rc = parse_opts(argc, argv, &S.o);
    if (rc) return rc;
    const soak_opts *o = &S.o;
    if (o->backend == PKV_BACKEND_CUDA && !pkv_cuda_available()) {
        printf("SKIP: no CUDA device (or a build without CUDA): the GPU soak not run\n");
        return 77;
    }
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = o->backend;
    cc.check_pages = o->check_pages;
    if (pkv_context_create(&cc, &S.ctx) != PKV_OK) {
        fprintf(stderr, "soak: %s\n", pkv_last_error());
        return 1;
    }
    S.cuda = pkv_context_backend(S.ctx) == PKV_BACKEND_CUDA;
    S.hctx = S.ctx;
    if (S.cuda) {
        pkv_context_config hc;
        pkv_context_config_default(&hc);
        hc.backend = PKV_BACKEND_CPU;
        if (pkv_context_create(&hc, &S.hctx) != PKV_OK) return 1;
    }
    soak_stats *s = &S.s;
    pkv_dev_info info;
    memset(&info, 0, sizeof info);
    snprintf(info.name, sizeof info.name, "%s", pkv_context_device_name(S.ctx));
    pkv_rng_seed(&S.rng, o->seed);
    if (pkv_plan_create(&S.plan) != PKV_OK) return 1;
    S.h_o = (uint16_t *)malloc(O_CAP * 2);
    S.h_q = (uint16_t *)malloc(O_CAP * 2);
    S.h_lse = (float *)malloc(LSE_CAP * sizeof(float));
    S.ref_o = (double *)malloc((size_t)64 * 256 * sizeof(double));
    S.ref_lse = (double *)malloc(64 * sizeof(double));
    int32_t lens[MAX_B], indptr[MAX_B + 1];
    int32_t *indices = NULL, *perm = NULL;
    if (!S.h_o || !S.h_q || !S.h_lse || !S.ref_o || !S.ref_lse) return 1;
    if (S.cuda) {
        if (pkv_dev_malloc(S.ctx, O_CAP * 2, &S.d_q) != PKV_OK || pkv_dev_malloc(S.ctx, O_CAP * 2, &S.d_o) != PKV_OK ||
            pkv_dev_malloc(S.ctx, LSE_CAP * sizeof(float), &S.d_lse) != PKV_OK) {
            fprintf(stderr, "soak: %s\n", pkv_last_error());
            return 1;
        }
        pkv_dev_get_info(S.ctx, &info);
        s->mem_free_start = info.mem_free_bytes;
        s->mem_free_min = INT64_MAX;
    }
    const double t0 = now_s();
    epoch e;
    memset(&e, 0, sizeof e);
    serving v;
    memset(&v, 0, sizeof v);
    bool serve = false;
    int64_t epoch_left = 0;
    for (int64_t step = 0; step < o->steps; step++) {
        if (epoch_left == 0) { /* a new shape and pool; serving and plain epochs alternate */
            if (e.k) {
                if (serve) {
                    if (!pools_agree(&S, &e)) s->failures++;
                    serving_end(&S, &v);
                }
                epoch_end(S.ctx, &e);
                if (S.cuda && pkv_dev_get_info(S.ctx, &info) == PKV_OK) {
                    if (info.mem_free_bytes < s->mem_free_min) s->mem_free_min = info.mem_free_bytes;
                    if (info.mem_free_bytes > s->mem_free_max) s->mem_free_max = info.mem_free_bytes;
                }
            }
            serve = s->epochs % 2 == 1;
            if (!epoch_begin(S.ctx, o, &S.rng, &e) || (serve && !serving_begin(&S, &e, &v))) {
                fprintf(stderr, "soak: cannot set up an epoch: %s\n", pkv_last_error());
                s->failures++;
                break;
            }
            free(perm);
            free(indices);
            perm = (int32_t *)malloc((size_t)e.usable * sizeof(int32_t));
            indices = (int32_t *)malloc((size_t)e.usable * sizeof(int32_t));
            if (!perm || !indices) return 1;
            for (int64_t i = 0; i < e.usable; i++) perm[i] = (int32_t)i;
            /* q for the epoch's largest step (a step uses its first B rows) */
            const int64_t q_max = (int64_t)MAX_B * e.p.num_qo_heads * e.p.head_dim;
            for (int64_t i = 0; i < q_max; i++) S.h_q[i] = pkv_test_random_value(&S.rng, e.p.dtype);
            if (S.cuda && pkv_dev_copy_h2d(S.ctx, S.d_q, S.h_q, (size_t)q_max * 2) != PKV_OK) return 1;
            epoch_left = o->epoch;
            s->epochs++;
        }
        epoch_left--;
        bool go_on;
        if (serve) {
            go_on = serve_step(&S, &e, &v, step);
            if (!go_on && s->failures == 0) {
                fprintf(stderr, "soak: step %lld: serving failed: %s\n", (long long)step, pkv_last_error());
                s->failures++;
            }
        } else {
            pkv_problem p = e.p;
            const int32_t B = step_lengths(&S.rng, o, &e, lens);
            deal_pages(&S.rng, &e, perm, B, lens, indptr, indices);
            const double u = pkv_rng_uniform01(&S.rng);
            if (u < 0.1) p.window = (int32_t)pkv_rng_uniform_int(&S.rng, 1, 4096);
            else if (u < 0.2) pkv_test_random_cap(&S.rng, &p);
            go_on = attend(&S, &e, p, B, lens, indptr, indices, step);
        }
        if (!go_on) break;
        if (o->max_seconds > 0 && step % 256 == 0 && now_s() - t0 > o->max_seconds) {
            fprintf(stderr, "soak: --max-seconds %.0f reached after %lld steps\n", o->max_seconds, (long long)s->steps);
            break;
        }
        if (s->steps % 10000 == 0 || step + 1 == o->steps)
            fprintf(stderr, "soak: %lld steps, %lld sampled, %lld failures, %.0f s\n", (long long)s->steps,
                    (long long)s->sampled, (long long)s->failures, now_s() - t0);
    }
    if (serve && e.k) {
        if (!pools_agree(&S, &e)) s->failures++;
        serving_end(&S, &v);
    }
    epoch_end(S.ctx, &e);
    const double wall = now_s() - t0;
    if (S.cuda) {
        pkv_dev_free(S.ctx, S.d_q);
        pkv_dev_free(S.ctx, S.d_o);
        pkv_dev_free(S.ctx, S.d_lse);
        if (S.d_idx) pkv_dev_free(S.ctx, S.d_idx);
        if (S.ws) pkv_dev_free(S.ctx, S.ws);
        pkv_dev_synchronize(S.ctx);
        if (pkv_dev_get_info(S.ctx, &info) == PKV_OK) s->mem_free_end = info.mem_free_bytes;
    } else {
        free(S.ws);
    }
    /* leaks: the device memory free after everything is freed again, as after the set-up plus its buffers */
    const int64_t leak = S.cuda ? (s->mem_free_start + (int64_t)(O_CAP * 4 + LSE_CAP * 4)) - s->mem_free_end : 0;
    const bool leaked = S.cuda && leak > (int64_t)4 << 20;
    if (leaked) s->failures++;
    printf("soak on %s: %lld steps (%lld epochs of shapes; %lld steps served by the page manager: %lld arrivals, "
           "%lld forks, %lld copy-on-write copies, %lld rollbacks, %lld preemptions, %lld departures, %lld tokens "
           "appended), %lld sampled against the float64 reference, %lld failures; worst relative L2 of o: fp16 "
           "%.3g, bf16 %.3g; worst lse error %.3g; %.1f s\n",
           info.name, (long long)s->steps, (long long)s->epochs, (long long)s->served_steps, (long long)s->arrivals,
           (long long)s->forks, (long long)s->cow_copies, (long long)s->rollbacks, (long long)s->preemptions,
           (long long)s->departures, (long long)s->appended_tokens, (long long)s->sampled, (long long)s->failures,
           s->worst_o[0], s->worst_o[1], s->worst_lse, wall);
    if (S.cuda)
        printf("device memory free: %.1f MiB after set-up, %.1f MiB at the end (its buffers freed), between "
               "epochs %.1f..%.1f MiB%s\n",
               s->mem_free_start / 1048576.0, s->mem_free_end / 1048576.0, s->mem_free_min / 1048576.0,
               s->mem_free_max / 1048576.0, leaked ? ": LEAK" : "");
    if (o->json) {
        FILE *f = fopen(o->json, "w");
        if (!f) {
            fprintf(stderr, "soak: cannot write %s\n", o->json);
            return 1;
        }
        const char *commit = getenv("PKV_COMMIT");
        char date[32];
        const time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        fprintf(f, "{\n  \"tool\": \"soak\", \"commit\": \"%s\", \"device\": \"%s\", \"date\": \"%s\",\n  \"command\": \"",
                commit ? commit : "unknown", info.name, date);
        for (int i = 0; i < argc; i++) fprintf(f, "%s%s", i ? " " : "", argv[i]);
        fprintf(f, "\",\n  \"steps\": %lld, \"epochs\": %lld, \"sampled\": %lld, \"failures\": %lld, \"wall_s\": %.1f,\n",
                (long long)s->steps, (long long)s->epochs, (long long)s->sampled, (long long)s->failures, wall);
        fprintf(f, "  \"serving\": {\"steps\": %lld, \"arrivals\": %lld, \"forks\": %lld, \"cow_copies\": %lld, "
                   "\"rollbacks\": %lld, \"preemptions\": %lld, \"departures\": %lld, \"appended_tokens\": %lld},\n",
                (long long)s->served_steps, (long long)s->arrivals, (long long)s->forks, (long long)s->cow_copies,
                (long long)s->rollbacks, (long long)s->preemptions, (long long)s->departures,
                (long long)s->appended_tokens);
        fprintf(f, "  \"runs_by_route\": {");
        for (int r = 0; r <= PKV_ROUTE_COUNT_; r++)
            fprintf(f, "%s\"%s\": %lld", r ? ", " : "", r < PKV_ROUTE_COUNT_ ? pkv_route_name((pkv_route)r) : "graph-stable",
                    (long long)s->runs_by_route[r]);
        fprintf(f, "},\n  \"worst_rel_l2\": {\"fp16\": %.4g, \"bf16\": %.4g}, \"worst_lse_err\": %.4g,\n", s->worst_o[0],
                s->worst_o[1], s->worst_lse);
        fprintf(f, "  \"worst_over_tolerance_per_%d_steps\": [", WINDOW_STEPS);
        const int64_t nw = (s->steps + WINDOW_STEPS - 1) / WINDOW_STEPS;
        for (int64_t w = 0; w < nw && w < MAX_WINDOWS; w++) fprintf(f, "%s%.3f", w ? ", " : "", s->window_worst[w]);
        fprintf(f, "],\n  \"device_mem_free_mib\": {\"after_setup\": %.1f, \"end\": %.1f, \"epochs_min\": %.1f, "
                   "\"epochs_max\": %.1f}\n}\n",
                s->mem_free_start / 1048576.0, s->mem_free_end / 1048576.0,
                s->mem_free_min == INT64_MAX ? 0.0 : s->mem_free_min / 1048576.0, s->mem_free_max / 1048576.0);
        fclose(f);
    }
    pkv_plan_free(S.plan);
    if (S.hctx != S.ctx) pkv_context_free(S.hctx);
    pkv_context_free(S.ctx);
    free(S.h_o);
    free(S.h_q);
    free(S.h_lse);
    free(S.ref_o);
    free(S.ref_lse);
    free(perm);
    free(indices);
    return s->failures ? 1 : 0;
}
