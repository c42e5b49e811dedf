/* soak.c - many random decode steps on one context, as a server runs them: random shapes (G, KV heads,
 * head dim, page size, layout, dtype, each for an epoch of steps over one page pool with holes of NaN
 * pages no row may read), and per step random lengths (empty to long rows), a random route or a
 * graph-stable plan, sometimes a sliding window or a soft cap, and a fresh random assignment of the pool's
 * pages to the rows (q is drawn per epoch).  Every step's o is poisoned before its run; every `sample`-th
 * step's o is read back whole (every element written, no NaN) and one random row is checked against the
 * float64 reference.  At the end: failures, the worst errors per window of steps (drift), and the device
 * memory free before and after (leaks), on stdout and as JSON.
 *
 *   soak [--backend cpu|cuda] [--steps N] [--epoch N] [--sample K] [--seed S] [--pool-mb M]
 *        [--max-len N] [--check-pages] [--json FILE]
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
    const char *json;
} soak_opts;

#define WINDOW_STEPS 10000
#define MAX_WINDOWS 1024
#define MAX_B 64

typedef struct soak_stats {
    int64_t steps, sampled, failures, runs_by_route[PKV_ROUTE_COUNT_ + 1], epochs;
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
    uint16_t *k, *v;   /* host pools (the reference reads them) */
    void *dk, *dv;     /* device pools (CUDA) */
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
    const int64_t page_elems = (int64_t)e->p.page_size * hkv * e->p.head_dim;
    int64_t num_pages = o->pool_mb * 1024 * 1024 / 2 / page_elems;
    if (num_pages < 16) num_pages = 16;
    e->p.num_pages = num_pages;
    e->usable = num_pages - num_pages / 5; /* a fifth of the pool: holes */
    e->pool_elems = num_pages * page_elems;
    e->k = (uint16_t *)malloc((size_t)e->pool_elems * 2);
    e->v = (uint16_t *)malloc((size_t)e->pool_elems * 2);
    if (!e->k || !e->v) return false;
    const uint16_t nan_bits = pkv_test_nan_bits(e->p.dtype);
    const int64_t hole_from = e->usable * page_elems;
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

int main(int argc, char **argv) {
    soak_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    if (o.backend == PKV_BACKEND_CUDA && !pkv_cuda_available()) {
        printf("SKIP: no CUDA device (or a build without CUDA): the GPU soak not run\n");
        return 77;
    }
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = o.backend;
    cc.check_pages = o.check_pages;
    pkv_context *ctx = NULL;
    if (pkv_context_create(&cc, &ctx) != PKV_OK) {
        fprintf(stderr, "soak: %s\n", pkv_last_error());
        return 1;
    }
    const bool cuda = pkv_context_backend(ctx) == PKV_BACKEND_CUDA;
    soak_stats s;
    memset(&s, 0, sizeof s);
    pkv_dev_info info;
    memset(&info, 0, sizeof info);
    snprintf(info.name, sizeof info.name, "%s", pkv_context_device_name(ctx));
    pkv_rng rng;
    pkv_rng_seed(&rng, o.seed);
    pkv_plan *plan = NULL;
    if (pkv_plan_create(&plan) != PKV_OK) return 1;

    /* per-step buffers, at their largest: B rows of up to 64 x 256 outputs, page ids of the whole pool */
    const size_t o_cap = (size_t)MAX_B * 16 * 8 * 256, lse_cap = (size_t)MAX_B * 16 * 8;
    uint16_t *h_o = (uint16_t *)malloc(o_cap * 2), *h_q = (uint16_t *)malloc(o_cap * 2);
    float *h_lse = (float *)malloc(lse_cap * sizeof(float));
    double *ref_o = (double *)malloc((size_t)16 * 8 * 256 * sizeof(double)), *ref_lse = (double *)malloc(16 * 8 * sizeof(double));
    int32_t lens[MAX_B], indptr[MAX_B + 1];
    void *d_q = NULL, *d_o = NULL, *d_lse = NULL, *d_idx = NULL, *ws = NULL;
    size_t ws_cap = 0, idx_cap = 0;
    int32_t *indices = NULL, *perm = NULL;
    if (!h_o || !h_q || !h_lse || !ref_o || !ref_lse) return 1;
    if (cuda) {
        if (pkv_dev_malloc(ctx, o_cap * 2, &d_q) != PKV_OK || pkv_dev_malloc(ctx, o_cap * 2, &d_o) != PKV_OK ||
            pkv_dev_malloc(ctx, lse_cap * sizeof(float), &d_lse) != PKV_OK) {
            fprintf(stderr, "soak: %s\n", pkv_last_error());
            return 1;
        }
        pkv_dev_get_info(ctx, &info);
        s.mem_free_start = info.mem_free_bytes;
        s.mem_free_min = INT64_MAX;
    }
    const double t0 = now_s();
    epoch e;
    memset(&e, 0, sizeof e);
    int64_t epoch_left = 0;
    for (int64_t step = 0; step < o.steps; step++) {
        if (epoch_left == 0) { /* a new shape and pool */
            if (e.k) {
                epoch_end(ctx, &e);
                if (cuda && pkv_dev_get_info(ctx, &info) == PKV_OK) {
                    if (info.mem_free_bytes < s.mem_free_min) s.mem_free_min = info.mem_free_bytes;
                    if (info.mem_free_bytes > s.mem_free_max) s.mem_free_max = info.mem_free_bytes;
                }
            }
            if (!epoch_begin(ctx, &o, &rng, &e)) {
                fprintf(stderr, "soak: cannot set up an epoch's pool: %s\n", pkv_last_error());
                s.failures++;
                break;
            }
            free(perm);
            free(indices);
            perm = (int32_t *)malloc((size_t)e.usable * sizeof(int32_t));
            indices = (int32_t *)malloc((size_t)e.usable * sizeof(int32_t));
            if (!perm || !indices) return 1;
            for (int64_t i = 0; i < e.usable; i++) perm[i] = (int32_t)i;
            if (cuda && idx_cap < (size_t)e.usable * 4) {
                if (d_idx) pkv_dev_free(ctx, d_idx);
                idx_cap = (size_t)e.usable * 4;
                if (pkv_dev_malloc(ctx, idx_cap, &d_idx) != PKV_OK) return 1;
            }
            /* q for the epoch's largest step (a step uses its first B rows) */
            const int64_t q_max = (int64_t)MAX_B * e.p.num_qo_heads * e.p.head_dim;
            for (int64_t i = 0; i < q_max; i++) h_q[i] = pkv_test_random_value(&rng, e.p.dtype);
            if (cuda && pkv_dev_copy_h2d(ctx, d_q, h_q, (size_t)q_max * 2) != PKV_OK) return 1;
            epoch_left = o.epoch;
            s.epochs++;
        }
        epoch_left--;
        pkv_problem p = e.p;
        const int32_t B = step_lengths(&rng, &o, &e, lens);
        deal_pages(&rng, &e, perm, B, lens, indptr, indices);
        const double u = pkv_rng_uniform01(&rng);
        if (u < 0.1) p.window = (int32_t)pkv_rng_uniform_int(&rng, 1, 4096);
        else if (u < 0.2) pkv_test_random_cap(&rng, &p);
        const int64_t q_elems = (int64_t)B * p.num_qo_heads * p.head_dim;
        pkv_page_table table = {B, indptr, indices, lens};
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        const int r = (int)pkv_test_pick(&rng, PKV_ROUTE_COUNT_ + 1); /* the last: a graph-stable plan */
        opts.route = r < PKV_ROUTE_COUNT_ ? (pkv_route)r : PKV_ROUTE_AUTO;
        if (r == PKV_ROUTE_COUNT_) opts.graph_max_batch = B + (int32_t)pkv_test_pick(&rng, 8);
        pkv_status st = pkv_plan_step(ctx, &p, &table, &opts, plan);
        if (st != PKV_OK) {
            fprintf(stderr, "soak: step %lld: plan failed: %s\n", (long long)step, pkv_last_error());
            s.failures++;
            continue;
        }
        const size_t need = pkv_plan_workspace_size(plan);
        if (need > ws_cap) {
            if (cuda) {
                if (ws) pkv_dev_free(ctx, ws);
                if (pkv_dev_malloc(ctx, need, &ws) != PKV_OK) return 1;
            } else {
                free(ws);
                ws = malloc(need);
                if (!ws) return 1;
            }
            ws_cap = need;
        }
        const size_t o_bytes = (size_t)q_elems * 2, lse_bytes = (size_t)B * p.num_qo_heads * sizeof(float);
        pkv_tensors t;
        memset(&t, 0, sizeof t);
        if (cuda) {
            if (indptr[B] > 0) st = pkv_dev_copy_h2d(ctx, d_idx, indices, (size_t)indptr[B] * 4);
            if (st == PKV_OK) st = pkv_dev_memset(ctx, d_o, 0xff, o_bytes); /* NaN: unwritten shows */
            if (st == PKV_OK) st = pkv_dev_memset(ctx, d_lse, 0xff, lse_bytes);
            t = (pkv_tensors){d_q, e.dk, e.dv, (const int32_t *)d_idx, d_o, (float *)d_lse, 0, 0, 0};
        } else {
            memset(h_o, 0xff, o_bytes);
            memset(h_lse, 0xff, lse_bytes);
            t = (pkv_tensors){h_q, e.k, e.v, indices, h_o, h_lse, 0, 0, 0};
        }
        if (st == PKV_OK) st = pkv_run(ctx, plan, ws, ws_cap, &t, NULL);
        s.steps++;
        s.runs_by_route[r]++;
        if (st != PKV_OK) {
            fprintf(stderr, "soak: step %lld (route %d): run failed: %s\n", (long long)step, r, pkv_last_error());
            s.failures++;
            if (cuda) break; /* a CUDA error leaves the context unusable */
            continue;
        }
        if (step % o.sample != 0) continue;
        /* a sampled step: every output written, one row against the float64 reference */
        if (cuda) {
            st = pkv_dev_copy_d2h(ctx, h_o, d_o, o_bytes);
            if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, h_lse, d_lse, lse_bytes);
            if (st != PKV_OK) {
                fprintf(stderr, "soak: step %lld: %s\n", (long long)step, pkv_last_error());
                s.failures++;
                break;
            }
        }
        s.sampled++;
        int64_t unwritten = 0;
        for (int64_t i = 0; i < q_elems; i++) unwritten += isnan(pkv_test_to_float(h_o[i], p.dtype));
        const int32_t row = (int32_t)pkv_test_pick(&rng, B), hq = p.num_qo_heads, d = p.head_dim;
        pkv_page_table one = {1, (int32_t[]){0, indptr[row + 1] - indptr[row]}, indices + indptr[row], &lens[row]};
        st = pkv_reference(&p, &one, h_q + (int64_t)row * hq * d, e.k, e.v, ref_o, ref_lse);
        double num = 0, den = 0, lse_err = 0;
        for (int64_t i = 0; st == PKV_OK && i < (int64_t)hq * d; i++) {
            const double x = pkv_test_to_float(h_o[(int64_t)row * hq * d + i], p.dtype), dx = x - ref_o[i];
            num += dx * dx;
            den += ref_o[i] * ref_o[i];
        }
        for (int32_t h = 0; st == PKV_OK && h < hq; h++) {
            const double l = h_lse[row * hq + h], lr = ref_lse[h];
            const double err = isinf(lr) ? (l == lr ? 0.0 : INFINITY) : fabs(l - lr) / fmax(1.0, fabs(lr));
            if (!(err <= lse_err)) lse_err = err;
        }
        const double rel = den > 0 ? sqrt(num / den) : sqrt(num); /* an empty row: o must be 0 */
        const int di = p.dtype == PKV_DTYPE_BF16;
        const double tol = di ? 1.5e-2 : 2e-3;
        if (rel > s.worst_o[di] || isnan(rel)) s.worst_o[di] = isnan(rel) ? INFINITY : rel;
        if (lse_err > s.worst_lse) s.worst_lse = lse_err;
        const int64_t w = step / WINDOW_STEPS < MAX_WINDOWS ? step / WINDOW_STEPS : MAX_WINDOWS - 1;
        if (rel / tol > s.window_worst[w] || isnan(rel)) s.window_worst[w] = isnan(rel) ? INFINITY : rel / tol;
        if (st != PKV_OK || unwritten || !(rel < tol) || !(lse_err < 1e-2)) {
            s.failures++;
            fprintf(stderr,
                    "soak: step %lld route %d B %d row %d (len %d) G %d Hkv %d d %d page %d %s %s window %d cap %g: "
                    "unwritten %lld, relative L2 %.3g, lse error %.3g%s%s\n",
                    (long long)step, r, B, row, lens[row], hq / p.num_kv_heads, p.num_kv_heads, d, p.page_size,
                    p.layout == PKV_LAYOUT_HND ? "HND" : "NHD", di ? "bf16" : "fp16", p.window,
                    (double)p.logits_soft_cap, (long long)unwritten, rel, lse_err, st ? ": " : "",
                    st ? pkv_last_error() : "");
            if (s.failures > 20) break;
        }
        if (s.steps % 10000 == 0 || step + 1 == o.steps)
            fprintf(stderr, "soak: %lld steps, %lld sampled, %lld failures, %.0f s\n", (long long)s.steps,
                    (long long)s.sampled, (long long)s.failures, now_s() - t0);
    }
    epoch_end(ctx, &e);
    const double wall = now_s() - t0;
    if (cuda) {
        pkv_dev_free(ctx, d_q);
        pkv_dev_free(ctx, d_o);
        pkv_dev_free(ctx, d_lse);
        if (d_idx) pkv_dev_free(ctx, d_idx);
        if (ws) pkv_dev_free(ctx, ws);
        pkv_dev_synchronize(ctx);
        if (pkv_dev_get_info(ctx, &info) == PKV_OK) s.mem_free_end = info.mem_free_bytes;
    } else {
        free(ws);
    }
    /* leaks: the device memory free after everything is freed again, as after the set-up plus its buffers */
    const int64_t leak = cuda ? (s.mem_free_start + (int64_t)(o_cap * 4 + lse_cap * 4)) - s.mem_free_end : 0;
    const bool leaked = cuda && leak > (int64_t)4 << 20;
    if (leaked) s.failures++;
    printf("soak on %s: %lld steps (%lld epochs of shapes), %lld sampled against the float64 reference, %lld "
           "failures; worst relative L2 of o: fp16 %.3g, bf16 %.3g; worst lse error %.3g; %.1f s\n",
           info.name, (long long)s.steps, (long long)s.epochs, (long long)s.sampled, (long long)s.failures,
           s.worst_o[0], s.worst_o[1], s.worst_lse, wall);
    if (cuda)
        printf("device memory free: %.1f MiB after set-up, %.1f MiB at the end (its buffers freed), between "
               "epochs %.1f..%.1f MiB%s\n",
               s.mem_free_start / 1048576.0, s.mem_free_end / 1048576.0, s.mem_free_min / 1048576.0,
               s.mem_free_max / 1048576.0, leaked ? ": LEAK" : "");
    if (o.json) {
        FILE *f = fopen(o.json, "w");
        if (!f) {
            fprintf(stderr, "soak: cannot write %s\n", o.json);
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
                (long long)s.steps, (long long)s.epochs, (long long)s.sampled, (long long)s.failures, wall);
        fprintf(f, "  \"runs_by_route\": {");
        for (int r = 0; r <= PKV_ROUTE_COUNT_; r++)
            fprintf(f, "%s\"%s\": %lld", r ? ", " : "", r < PKV_ROUTE_COUNT_ ? pkv_route_name((pkv_route)r) : "graph-stable",
                    (long long)s.runs_by_route[r]);
        fprintf(f, "},\n  \"worst_rel_l2\": {\"fp16\": %.4g, \"bf16\": %.4g}, \"worst_lse_err\": %.4g,\n", s.worst_o[0],
                s.worst_o[1], s.worst_lse);
        fprintf(f, "  \"worst_over_tolerance_per_%d_steps\": [", WINDOW_STEPS);
        const int64_t nw = (s.steps + WINDOW_STEPS - 1) / WINDOW_STEPS;
        for (int64_t w = 0; w < nw && w < MAX_WINDOWS; w++) fprintf(f, "%s%.3f", w ? ", " : "", s.window_worst[w]);
        fprintf(f, "],\n  \"device_mem_free_mib\": {\"after_setup\": %.1f, \"end\": %.1f, \"epochs_min\": %.1f, "
                   "\"epochs_max\": %.1f}\n}\n",
                s.mem_free_start / 1048576.0, s.mem_free_end / 1048576.0,
                s.mem_free_min == INT64_MAX ? 0.0 : s.mem_free_min / 1048576.0, s.mem_free_max / 1048576.0);
        fclose(f);
    }
    pkv_plan_free(plan);
    pkv_context_free(ctx);
    free(h_o);
    free(h_q);
    free(h_lse);
    free(ref_o);
    free(ref_lse);
    free(perm);
    free(indices);
    return s.failures ? 1 : 0;
}
