/* bench_workloads.c - the steps `pkv bench` measures: isolated steps (the anchor steps of anchors.md,
 * --lens) with their pages scattered at random over a pool, trace steps (a generated trace or a trace
 * file) on the trace's own pages, and the calibration and held-out sets of traces.  On CUDA each step
 * carries several rotations of its pages, so that the timed runs read KV that is not in L2. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <string.h>

/* Rotations: at most this many copies of a step's pages, and their pools at most this large. */
#define MAX_ROTATIONS 256
#define MAX_ROTATED_POOL_BYTES ((int64_t)24 << 30)
/* Seeds of the pages' permutation: anchor i's is ANCHOR_SEED + i, --lens' is LENS_SEED. */
#define ANCHOR_SEED 1000
#define LENS_SEED 99
/* The sets of traces (calibration and held-out). */
#define SET_REQUESTS_PER_ROW 3 /* requests of a set's trace: 3 x B */
#define CALIBRATION_SEED 20260622
/* anchors.md's FlashInfer times are for the paper shape with pages of this size */
#define ANCHORS_PAGE_SIZE 16
static const uint64_t heldout_seeds[] = {20260623, 20260624, 20260625, 20260626, 20260627};
#define HELDOUT_SEEDS ((int)(sizeof heldout_seeds / sizeof heldout_seeds[0]))

/* Rotations so that the rotated window covers rotate_bytes (L2 does not help); capped by memory. */
static int32_t choose_rotations(const bench_opts *o, int64_t step_kv_bytes, int64_t pool_kv_bytes) {
    if (!o->cuda || step_kv_bytes <= 0) return 1;
    int64_t r = (o->rotate_bytes + step_kv_bytes - 1) / step_kv_bytes;
    int64_t by_mem = pool_kv_bytes > 0 ? MAX_ROTATED_POOL_BYTES / pool_kv_bytes : MAX_ROTATIONS;
    if (r > by_mem) r = by_mem;
    if (r > MAX_ROTATIONS) r = MAX_ROTATIONS;
    return r < 1 ? 1 : (int32_t)r;
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

/* The KV bytes that step s of trace t reads. */
static int64_t trace_step_bytes(const bench_opts *o, const pkv_trace *t, int32_t s) {
    const int32_t *ids, *ls;
    int32_t B = pkv_trace_step(t, s, &ids, &ls);
    int64_t tok = 0;
    for (int32_t i = 0; i < B; i++) tok += attended(o, ls[i]);
    return tok * kv_bytes_per_token(&o->prob);
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
                tc.num_requests = SET_REQUESTS_PER_ROW * bs[bi];
                tc.page_size = o->prob.page_size;
                pkv_trace *tr = NULL;
                TRY(NULL, pkv_trace_generate(&tc, &tr), "trace generation");
                char arg[128];
                snprintf(arg, sizeof arg, "--trace %s --seed %llu --batch %d --requests %d",
                         pkv_trace_family_name(tc.family), (unsigned long long)tc.seed, bs[bi], tc.num_requests);
                int64_t pool = pkv_trace_num_pages(tr) * o->prob.page_size * kv_bytes_per_token(&o->prob);
                int32_t nst = pkv_trace_num_steps(tr), picks[2] = {0, nst / 2};
                for (int k = 0; k < 2 && k < nst; k++) {
                    int32_t rot = choose_rotations(o, trace_step_bytes(o, tr, picks[k]), pool);
                    make_trace_step(o, tr, picks[k], rot, arg, &steps[n]);
                    /* the seed's last two digits keep the names short and the seeds apart */
                    snprintf(steps[n].name, sizeof steps[n].name, "%s_B%d_s%llu_t%d", pkv_trace_family_name(tc.family),
                             bs[bi], (unsigned long long)(tc.seed % 100), picks[k]);
                    n++;
                }
                pkv_trace_free(tr);
            }
    *out = steps;
    return n;
}

/* --anchor NAME|all: the anchor steps, with FlashInfer's time where anchors.md has it (CUDA, the paper
 * shape, page 16, every token, no cap, an fp16 cache). */
static int anchor_steps(const bench_opts *o, bench_workload *w) {
    int first = 0, last = cli_anchor_count();
    if (o->anchor >= 0) first = o->anchor, last = first + 1;
    bool paper = strcmp(o->shape_name, "paper") == 0 && o->prob.page_size == ANCHORS_PAGE_SIZE &&
                 o->prob.window == 0 && o->prob.logits_soft_cap == 0.0f && !cli_kv_is_fp8(&o->prob);
    w->steps = (step_input *)xmalloc((size_t)(last - first) * sizeof *w->steps);
    for (int i = first; i < last; i++) {
        pkv_anchor a;
        cli_anchor_get(i, &a);
        char arg[64];
        snprintf(arg, sizeof arg, "--anchor %s", a.name);
        make_isolated_step(o, a.name, a.lens, a.batch, paper && o->cuda ? a.flashinfer_us : 0, arg,
                           ANCHOR_SEED + (uint64_t)i, &w->steps[w->nsteps++]);
    }
    snprintf(w->label, sizeof w->label, "anchor %s", o->anchor >= 0 ? w->steps[0].name : "all");
    return BENCH_GO_ON;
}

/* --lens N1,N2,... (checked by the parser): one isolated step. */
static int lens_step(const bench_opts *o, bench_workload *w) {
    w->steps = (step_input *)xmalloc(sizeof *w->steps);
    char arg[96];
    snprintf(arg, sizeof arg, "--lens %.80s", o->lens_arg);
    make_isolated_step(o, "lens", o->lens, o->nlens, 0, arg, LENS_SEED, &w->steps[w->nsteps++]);
    snprintf(w->label, sizeof w->label, "lens %.200s", o->lens_arg);
    return BENCH_GO_ON;
}

/* --calibration-set: every family, B 1, 4, 16, 64 (CPU: 1 and 4; or --set-batches, e.g. to span the B a
 * server runs), the first and the middle step of each. */
static int calibration_set(const bench_opts *o, bench_workload *w) {
    static const uint64_t seeds[] = {CALIBRATION_SEED};
    static const int32_t gpu_b[] = {1, 4, 16, 64}, cpu_b[] = {1, 4};
    const int32_t *bs = o->nset_batches > 0 ? o->set_batches : o->cuda ? gpu_b : cpu_b;
    const int nb = o->nset_batches > 0 ? o->nset_batches : o->cuda ? 4 : 2;
    w->trace_mode = true;
    w->nsteps = add_trace_set(o, seeds, 1, bs, nb, &w->steps);
    snprintf(w->label, sizeof w->label, "calibration set (seed 20260622)");
    return BENCH_GO_ON;
}

/* --heldout-set: every family, the held-out seeds (--set-seeds: the first N), B 1..128 (CPU: 1 and 2;
 * or --set-batches), the first and the middle step of each. */
static int heldout_set(const bench_opts *o, bench_workload *w) {
    w->trace_mode = true;
    int32_t bs[BENCH_MAX_SET_BATCHES] = {1, 2, 4, 8, 16, 32, 64, 128};
    const int gpu_nb = 8, cpu_nb = 2; /* the first of bs */
    int nb = o->cuda ? gpu_nb : cpu_nb;
    if (o->nset_batches > 0) {
        nb = o->nset_batches;
        memcpy(bs, o->set_batches, (size_t)nb * sizeof bs[0]);
    }
    const int ns = o->set_seeds;
    w->nsteps = add_trace_set(o, heldout_seeds, ns, bs, nb, &w->steps);
    snprintf(w->label, sizeof w->label, "held-out set (seeds 20260623..%d)", (int)heldout_seeds[ns - 1]);
    return BENCH_GO_ON;
}

/* --trace-file, else the trace --trace names (and its arguments, for the rows' repro lines). */
static int open_trace(const bench_opts *o, pkv_trace **tr, char *arg, size_t arg_cap) {
    if (o->trace_file) {
        TRY(NULL, pkv_trace_read(o->trace_file, tr), "trace read");
        snprintf(arg, arg_cap, "--trace-file %.80s", o->trace_file);
        return BENCH_GO_ON;
    }
    TRY(NULL, pkv_trace_generate(&o->trace, tr), "trace generation");
    snprintf(arg, arg_cap, "--trace %s --seed %llu --batch %d --requests %d", pkv_trace_family_name(o->trace.family),
             (unsigned long long)o->trace.seed, o->trace.max_active, o->trace.num_requests);
    return BENCH_GO_ON;
}

/* The trace's steps [*first, *last): --step S alone, else the first --steps (CPU default 2; 0: all). */
static int trace_step_range(const bench_opts *o, int32_t total, int32_t *first, int32_t *last) {
    const int32_t cpu_steps = 2;
    const int32_t limit = o->steps != BENCH_DEFAULT ? o->steps : o->cuda ? 0 : cpu_steps, only = o->step;
    *first = 0;
    *last = total;
    if (only >= 0) {
        if (only >= total) {
            fprintf(stderr, "%s: --step %d but the trace has %d steps (0..%d)\n", bench_prog, only, total, total - 1);
            return 2;
        }
        *first = only;
        *last = only + 1;
    } else if (limit > 0 && limit < total) {
        *last = limit;
        if (!o->cuda)
            fprintf(stderr, "%s: CPU backend replays the first %d of %d steps (--steps 0 for all)\n", bench_prog,
                    limit, total);
    }
    return BENCH_GO_ON;
}

/* A trace's steps: one pool, rotated as often as its smallest step needs. */
static int trace_steps(const bench_opts *o, bench_workload *w) {
    w->trace_mode = true;
    pkv_trace *tr = NULL;
    char arg[96];
    int st = open_trace(o, &tr, arg, sizeof arg);
    if (st != BENCH_GO_ON) return st;
    int32_t total = pkv_trace_num_steps(tr), first, last;
    st = trace_step_range(o, total, &first, &last);
    if (st != BENCH_GO_ON) {
        pkv_trace_free(tr);
        return st;
    }
    int64_t pool = pkv_trace_num_pages(tr) * o->prob.page_size * kv_bytes_per_token(&o->prob);
    int64_t min_step = INT64_MAX;
    for (int32_t s = first; s < last; s++) {
        const int64_t bytes = trace_step_bytes(o, tr, s);
        if (bytes > 0 && bytes < min_step) min_step = bytes;
    }
    int32_t rot = choose_rotations(o, min_step == INT64_MAX ? 0 : min_step, pool);
    w->steps = (step_input *)xmalloc((size_t)(last - first) * sizeof *w->steps);
    for (int32_t s = first; s < last; s++) make_trace_step(o, tr, s, rot, arg, &w->steps[w->nsteps++]);
    snprintf(w->label, sizeof w->label, "%s (steps %d..%d of %d)", arg, first, last - 1, total);
    pkv_trace_free(tr);
    return BENCH_GO_ON;
}

int bench_workload_make(const bench_opts *o, bench_workload *w) {
    memset(w, 0, sizeof *w);
    switch (o->workload) {
    case BENCH_WORKLOAD_ANCHOR: return anchor_steps(o, w);
    case BENCH_WORKLOAD_LENS: return lens_step(o, w);
    case BENCH_WORKLOAD_CALIBRATION_SET: return calibration_set(o, w);
    case BENCH_WORKLOAD_HELDOUT_SET: return heldout_set(o, w);
    default: return trace_steps(o, w);
    }
}

void bench_workload_free(bench_workload *w) {
    for (int i = 0; i < w->nsteps; i++) {
        step_input *s = &w->steps[i];
        free(s->lens);
        free(s->indptr);
        free(s->pages);
    }
    free(w->steps);
    memset(w, 0, sizeof *w);
}
