/* test_cuda.c - the CUDA backend against the float64 reference: every route on randomized shapes
 * (G 1..16 including 7, head dims 64/128/256, fp16/bf16, NHD/HND, page sizes 1..256, lengths 0 and
 * 1, scattered pages, NaN in every KV slot no row may read), logits soft caps and sliding windows,
 * outputs poisoned before each run;
 * bitwise repeatability; CUDA graph capture and replay; page ids rewritten in place between runs; uploads
 * queued ahead of the GPU; every route right behind a kernel that writes q, K, V or the page ids late
 * (programmatic dependent launch); errors.  Skips (77) without a GPU.
 * PKV_TEST_CASES=N sets the number of random problems (default 60); PKV_TEST_SMALL=1 keeps every row
 * short (for compute-sanitizer runs). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "pkv_test.h"
#include "pkv_lab.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

static const pkv_route routes[] = {PKV_ROUTE_AUTO, PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_BUCKETED,
                                   PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};

/* Every route and a graph-stable plan, the tensors laid out as L says (test_device.h: K and V dense or
 * interleaved per page, rows of q and o dense or further apart); nothing may be written between o's
 * rows. */
static void check_case(pkv_context *ctx, pkv_plan *plan, pkv_test_case *tc, const char *what,
                       pkv_test_layout L) {
    const pkv_problem *p = &tc->problem;
    double tol = p->dtype == PKV_DTYPE_BF16 ? 1.5e-2 : 2e-3;
    const size_t nroutes = sizeof routes / sizeof routes[0];
    for (size_t r = 0; r <= nroutes; r++) { /* r == nroutes: a graph-stable plan (room for 3 more rows) */
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = r < nroutes ? routes[r] : PKV_ROUTE_AUTO;
        if (r == nroutes) opts.graph_max_batch = tc->batch_size + 3;
        const char *rname = r < nroutes ? pkv_route_name(routes[r]) : "graph-stable";
        pkv_test_poison(tc);
        pkv_status st = pkv_plan_step(ctx, p, &tc->table, &opts, plan);
        int64_t gap_writes = 0;
        if (st == PKV_OK) st = pkv_test_run_layout(ctx, plan, tc, &L, &gap_writes);
        CHECK_MSG(st == PKV_OK, "%s route %s: %s", what, rname, pkv_last_error());
        if (st != PKV_OK) continue;
        double err = pkv_test_rel_l2(tc), lerr = pkv_test_lse_err(tc);
        int64_t unwritten = pkv_test_unwritten(tc);
        CHECK_MSG(err < tol && lerr < 1e-2 && unwritten == 0 && pkv_test_empty_rows_nonzero(tc) == 0 && gap_writes == 0,
                  "%s route %s: B=%d G=%d Hkv=%d d=%d page=%d %s %s kv %s%s kv pad %lld q pad %lld o pad %lld window %d cap %g "
                  "rel_l2=%.2e lse=%.2e unwritten=%lld written between o's rows=%lld",
                  what, rname, tc->batch_size, p->num_qo_heads / p->num_kv_heads, p->num_kv_heads, p->head_dim,
                  p->page_size, p->layout == PKV_LAYOUT_HND ? "HND" : "NHD",
                  p->dtype == PKV_DTYPE_BF16 ? "bf16" : "fp16",
                  p->kv_dtype == PKV_DTYPE_FP8_E4M3   ? "e4m3"
                  : p->kv_dtype == PKV_DTYPE_FP8_E5M2 ? "e5m2"
                                                      : "16-bit",
                  tc->k_head_scales ? " (per-head scales)" : "", (long long)L.kv_pad, (long long)L.q_pad,
                  (long long)L.o_pad, p->window, (double)p->logits_soft_cap, err, lerr, (long long)unwritten,
                  (long long)gap_writes);
    }
}

/* A fixed case's problem and data (lens clamped to 1500 tokens under PKV_TEST_SMALL, for the sanitizer
 * runs); false when it could not be built (counted as a failure). */
static bool fixed_case_build(pkv_rng *rng, int32_t hq, int32_t hkv, int32_t d, int32_t page, pkv_layout layout,
                             pkv_dtype dtype, int32_t B, int32_t *lens, pkv_test_case *tc) {
    if (getenv("PKV_TEST_SMALL"))
        for (int32_t r = 0; r < B; r++)
            if (lens[r] > 1500) lens[r] = 1500;
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_qo_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    p.page_size = page;
    p.layout = layout;
    p.dtype = dtype;
    CHECK(pkv_test_case_build(rng, &p, B, lens, 0.25, 1, tc));
    return tc->ok != 0;
}

/* Fixed shapes that must work: G = 7, G = 16, d = 256, odd page sizes, a long split row. */
static void fixed_cases(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng) {
    struct {
        int32_t hq, hkv, d, page;
        pkv_layout layout;
        pkv_dtype dtype;
        int32_t B;
        int32_t lens[6];
    } cases[] = {
        {28, 4, 128, 16, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 4, {5000, 0, 1, 777}},
        {32, 2, 128, 16, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 3, {4097, 16, 33}},
        {16, 8, 256, 16, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 3, {3000, 129, 2}},
        {14, 2, 64, 5, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 3, {1234, 5, 6}},
        {8, 8, 128, 256, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 2, {700, 256}},
        {32, 8, 128, 1, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 2, {300, 17}},
        {32, 8, 128, 16, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 1, {70000}},
        {64, 8, 128, 16, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 2, {20000, 3}},
        /* page sizes that are multiples of 16 but not powers of two (the tensor-copy kernel's
         * in-page token offsets by division), short last tiles */
        {24, 4, 64, 48, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 3, {1000, 47, 49}},
        {16, 2, 128, 80, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 2, {3001, 15}},
        /* d = 256 through the tensor-copy kernel on sm_90 (one stage per warp): G = 2 with a page size
         * that is not a power of two, HND and a row long enough to split; G = 1 */
        {16, 8, 256, 48, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 3, {9001, 47, 16}},
        {8, 8, 256, 16, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 2, {2000, 31}},
        /* G 9..16 through the tensor-copy kernel's two n-tiles on sm_90: G = 12 at d = 64, and the G = 16
         * of Llama-3.1-405B with a row long enough to split */
        {48, 4, 64, 32, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 3, {3000, 17, 0}},
        {22, 2, 128, 32, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 3, {5000, 33, 1}}, /* G = 11: 3 heads of the 2nd n-tile */
        {128, 8, 128, 16, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 2, {20000, 100}},
        /* pages that are not a multiple of 16 tokens on sm_90: tensor copies in chunks of 8 (pages of 24,
         * offsets by division; G = 12 at d = 64 on pages of 8), cp.async into the tile's boxes for the
         * others (pages of 12 at d = 64, of 2 for G = 16, a long split row of G = 7 on pages of 4) */
        {24, 4, 64, 12, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 3, {1000, 11, 13}},
        {64, 4, 128, 2, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 3, {3001, 3, 1}},
        {32, 8, 128, 24, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 2, {9001, 25}},
        {28, 4, 128, 4, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 3, {20000, 5, 0}},
        {48, 4, 64, 8, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 2, {5000, 9}},
        /* G = 16 at d = 64 on pages of 2 (cp.async on the two n-tiles) */
        {64, 4, 64, 2, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 2, {6001, 3}},
        /* d = 256 on pages of 4 (cp.async into tiles on sm_90) */
        {16, 4, 256, 4, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 3, {4001, 33, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pkv_test_case tc;
        if (!fixed_case_build(rng, cases[i].hq, cases[i].hkv, cases[i].d, cases[i].page, cases[i].layout,
                              cases[i].dtype, cases[i].B, cases[i].lens, &tc))
            continue;
        CHECK_OK(pkv_test_case_reference(&tc));
        char what[32];
        snprintf(what, sizeof what, "fixed case %zu", i);
        check_case(ctx, plan, &tc, what, (pkv_test_layout){-1, 0, 0});
        if (i % 3 == 0) /* K and V interleaved per page, padded; q the query part of a fused QKV output */
            check_case(ctx, plan, &tc, what, (pkv_test_layout){8, 2 * (int64_t)cases[i].hkv * cases[i].d, 8});
        pkv_test_case_free(&tc);
    }
}

/* Logits soft caps and sliding windows (Gemma-2, Mistral): windows of 1 token, shorter than a 16-token
 * tile, starting mid-page and mid-tile, longer than the rows, on rows long enough to split; page sizes
 * the tensor-copy kernel takes whole (16, 32, 48, 64) and in chunks (8 and 24), and that cp.async fills
 * (1, 4, 6 and 7); K and V of every token before a window are NaN.  Capped cases scale the scores
 * (sm_scale) so that every cap binds (the uncapped reference must differ), a cap of 0.05 saturates tanh
 * (e^2y overflows), and each kernel runs capped: tensor copies at d 64/128/256 and G 9..16 (d = 64/128),
 * cp.async on pages of 7, heads in M for G 16 at d = 256, and under PKV_TUNING=tma=0 the register kernels
 * for all of them.  Under PKV_TEST_SMALL (rows clamped to 1500 tokens) windows above 1000 become 1000. */
static void score_option_cases(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng) {
    struct {
        int32_t hq, hkv, d, page;
        pkv_layout layout;
        pkv_dtype dtype;
        float cap, sm_scale; /* sm_scale 0: 1 / sqrt(d) */
        int32_t window, B;
        int32_t lens[5];
    } cases[] = {
        {32, 8, 128, 16, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 0.0f, 0.0f, 4096, 4, {20000, 4100, 4095, 1}},
        {28, 4, 128, 16, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 0.0f, 0.0f, 37, 4, {3000, 38, 36, 0}},
        {8, 8, 64, 48, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 0.0f, 0.0f, 1, 3, {1000, 2, 1}},
        {16, 8, 256, 16, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 0.0f, 0.0f, 5, 3, {9000, 17, 5}},
        {64, 4, 128, 16, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 0.0f, 0.0f, 1000, 3, {12345, 999, 1001}},
        {14, 2, 64, 7, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 0.0f, 0.0f, 300, 3, {5000, 301, 20}},
        {32, 8, 128, 1, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 0.0f, 0.0f, 129, 2, {700, 130}},
        {16, 8, 256, 16, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 50.0f, 8.0f, 0, 3, {9000, 300, 1}},
        {32, 8, 128, 16, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 0.5f, 0.0f, 0, 4, {20000, 33, 0, 2}},
        {48, 4, 64, 32, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 0.25f, 0.0f, 0, 2, {3000, 17}},
        {16, 8, 256, 16, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 30.0f, 6.0f, 4096, 3, {9000, 4097, 100}},
        {24, 8, 128, 64, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 1.0f, 2.0f, 777, 3, {30000, 800, 5}},
        {16, 4, 128, 7, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 20.0f, 4.0f, 300, 3, {4000, 301, 9}},
        {32, 2, 256, 16, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 40.0f, 6.0f, 0, 2, {3000, 40}},
        {64, 8, 64, 16, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 0.05f, 2.0f, 0, 3, {2000, 64, 3}},
        {64, 4, 128, 16, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 10.0f, 3.0f, 500, 3, {6000, 16, 777}},
        /* windows that start inside a chunk of the chunked kernel: pages of 8 and 24 (chunks of 8), capped
         * on the second; pages of 4 and 6 (cp.async) */
        {32, 8, 128, 8, PKV_LAYOUT_NHD, PKV_DTYPE_FP16, 0.0f, 0.0f, 37, 3, {3000, 38, 2}},
        {24, 4, 64, 24, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 0.5f, 0.0f, 301, 3, {5000, 302, 7}},
        {32, 8, 128, 4, PKV_LAYOUT_NHD, PKV_DTYPE_BF16, 0.0f, 0.0f, 37, 3, {3000, 38, 2}},
        {48, 4, 64, 6, PKV_LAYOUT_HND, PKV_DTYPE_FP16, 0.5f, 0.0f, 301, 3, {5000, 302, 7}},
        /* and at d = 256 on pages of 8 (capped, windowed) */
        {16, 8, 256, 8, PKV_LAYOUT_HND, PKV_DTYPE_BF16, 30.0f, 6.0f, 301, 3, {3000, 302, 7}},
    };
    const bool small = getenv("PKV_TEST_SMALL") != NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pkv_test_case tc;
        if (!fixed_case_build(rng, cases[i].hq, cases[i].hkv, cases[i].d, cases[i].page, cases[i].layout,
                              cases[i].dtype, cases[i].B, cases[i].lens, &tc))
            continue;
        tc.problem.sm_scale = cases[i].sm_scale;
        if (cases[i].cap > 0.0f) { /* the cap must matter */
            CHECK_OK(pkv_test_case_reference(&tc));
            double *plain = (double *)malloc((size_t)tc.q_elems * sizeof(double));
            if (plain) memcpy(plain, tc.o_ref, (size_t)tc.q_elems * sizeof(double));
            tc.problem.logits_soft_cap = cases[i].cap;
            CHECK_OK(pkv_test_case_reference(&tc));
            double moved = 0.0, norm = 0.0;
            for (int64_t e = 0; plain && e < tc.q_elems; e++) {
                moved += (tc.o_ref[e] - plain[e]) * (tc.o_ref[e] - plain[e]);
                norm += plain[e] * plain[e];
            }
            CHECK_MSG(moved > 0.01 * 0.01 * norm, "case %zu: a cap of %g moved the reference by %.2g only", i,
                      (double)cases[i].cap, sqrt(moved / (norm > 0 ? norm : 1)));
            free(plain);
        }
        tc.problem.logits_soft_cap = cases[i].cap;
        tc.problem.window = small && cases[i].window > 1000 ? 1000 : cases[i].window;
        pkv_test_poison_before_window(&tc);
        CHECK_OK(pkv_test_case_reference(&tc));
        char what[64];
        snprintf(what, sizeof what, "cap %g scale %g window %d case %zu", (double)cases[i].cap,
                 (double)cases[i].sm_scale, tc.problem.window, i);
        check_case(ctx, plan, &tc, what, (pkv_test_layout){i % 3 == 0 ? 8 : -1, i % 2 ? 16 : 0, 0});
        pkv_test_case_free(&tc);
    }
}

/* Constant-shift invariance (test_cpu's twin): every score of a head equal to c, so o is the mean of V
 * and lse = c + ln n whatever c is; long rows of odd lengths so every split route merges pieces of
 * unequal size. */
static void constant_score_cases(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng) {
    static const double shifts[] = {0.0, 1e3, 1e6, 1e12, 1e20, -1e20};
    for (int shape = 0; shape < 2; shape++)
        for (size_t c = 0; c < sizeof shifts / sizeof shifts[0]; c++) {
            int32_t lens[5] = {20001, 4097, 333, 1, 0};
            pkv_test_case tc;
            if (!fixed_case_build(rng, shape ? 32 : 8, shape ? 8 : 2, shape ? 128 : 64, shape ? 7 : 16,
                                  shape ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD, shape ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16,
                                  5, lens, &tc))
                continue;
            pkv_test_constant_scores(&tc, rng, shifts[c]);
            CHECK_OK(pkv_test_case_reference(&tc));
            char what[48];
            snprintf(what, sizeof what, "scores all %g (shape %d)", shifts[c], shape);
            check_case(ctx, plan, &tc, what, (pkv_test_layout){-1, 0, 0});
            pkv_test_case_free(&tc);
        }
}

/* A case's tensors on the device: q, K, V and the page ids uploaded, o and lse allocated. */
typedef struct dev_case {
    void *q, *k, *v, *o, *lse, *idx;
    size_t qb, kvb, lb, ib; /* bytes of q and o, of K and of V, of lse, of the page ids */
} dev_case;

/* The run's tensors over a dev_case (dense pools and rows). */
static pkv_tensors dev_tensors(const dev_case *d) {
    pkv_tensors t = {.q = d->q,
                     .k_cache = d->k,
                     .v_cache = d->v,
                     .kv_page_indices = (const int32_t *)d->idx,
                     .o = d->o,
                     .lse = (float *)d->lse};
    return t;
}

static bool dev_case_upload(pkv_context *ctx, const pkv_test_case *tc, dev_case *d) {
    memset(d, 0, sizeof *d);
    d->qb = (size_t)tc->q_elems * 2, d->kvb = (size_t)tc->kv_elems * 2, d->lb = (size_t)tc->lse_elems * 4;
    d->ib = (size_t)tc->kv_indptr[tc->batch_size] * 4;
    CHECK_OK(pkv_dev_malloc(ctx, d->qb, &d->q));
    CHECK_OK(pkv_dev_malloc(ctx, d->kvb, &d->k));
    CHECK_OK(pkv_dev_malloc(ctx, d->kvb, &d->v));
    CHECK_OK(pkv_dev_malloc(ctx, d->qb, &d->o));
    CHECK_OK(pkv_dev_malloc(ctx, d->lb, &d->lse));
    CHECK_OK(pkv_dev_malloc(ctx, d->ib, &d->idx));
    if (!d->q || !d->k || !d->v || !d->o || !d->lse || !d->idx) return false;
    CHECK_OK(pkv_dev_copy_h2d(ctx, d->q, tc->q, d->qb));
    CHECK_OK(pkv_dev_copy_h2d(ctx, d->k, tc->k_cache, d->kvb));
    CHECK_OK(pkv_dev_copy_h2d(ctx, d->v, tc->v_cache, d->kvb));
    CHECK_OK(pkv_dev_copy_h2d(ctx, d->idx, tc->kv_page_indices, d->ib));
    return true;
}

static void dev_case_free(pkv_context *ctx, dev_case *d) {
    void *bufs[] = {d->q, d->k, d->v, d->o, d->lse, d->idx};
    for (size_t i = 0; i < 6; i++) pkv_dev_free(ctx, bufs[i]);
}

/* The run's outputs (device o and lse, at the case's current sizes) into the case, and the float64
 * reference for its current inputs. */
static void fetch_and_reference(pkv_context *ctx, pkv_test_case *tc, const void *o, const void *lse) {
    CHECK_OK(pkv_dev_copy_d2h(ctx, tc->o, o, (size_t)tc->q_elems * 2));
    CHECK_OK(pkv_dev_copy_d2h(ctx, tc->lse, lse, (size_t)tc->lse_elems * 4));
    CHECK_OK(pkv_test_case_reference(tc));
}

/* Moves every page id of the case one place along its buffer (the first to the end), so each row reads
 * other pages of the pool. */
static void rotate_page_ids(pkv_test_case *tc) {
    const int32_t n = tc->kv_indptr[tc->batch_size];
    if (n < 2) return;
    const int32_t first = tc->kv_page_indices[0];
    memmove(tc->kv_page_indices, tc->kv_page_indices + 1, (size_t)(n - 1) * sizeof(int32_t));
    tc->kv_page_indices[n - 1] = first;
}

/* The paper shape on rows of 9000, 300, 0, 1 and 4500 tokens (split, short, empty and one-token rows). */
static bool mixed_case(pkv_rng *rng, pkv_test_case *tc) {
    pkv_problem p;
    pkv_problem_default(&p);
    int32_t lens[5] = {9000, 300, 0, 1, 4500};
    CHECK(pkv_test_case_build(rng, &p, 5, lens, 0.1, 1, tc));
    return tc->ok != 0;
}

/* After a graph-stable plan's run has completed: its work-claim words (tasks claimed, arrivals, the
 * orphan cursor, a counter per SM) are back to zero for the next launch, and the step's counts and
 * widest merge are the plan's. */
static bool claim_words_reset(pkv_context *ctx, const pkv_plan *plan, void *ws) {
    size_t off = 0;
    int32_t nw = 0, w[PKV_LAB_MAX_COUNTS_WORDS];
    if (pkv_lab_plan_counts(plan, &off, &nw) != PKV_OK || nw > PKV_LAB_MAX_COUNTS_WORDS) return false;
    if (pkv_dev_copy_d2h(ctx, w, (char *)ws + off, (size_t)nw * sizeof w[0]) != PKV_OK) return false;
    bool ok = w[PKV_LAB_COUNTS_TASKS] == pkv_plan_num_tasks(plan) && w[PKV_LAB_COUNTS_MERGES] == pkv_plan_num_merges(plan) &&
              w[PKV_LAB_COUNTS_WIDEST] == pkv_lab_plan_widest_merge(plan);
    for (int i = PKV_LAB_COUNTS_MERGES + 1; i < nw; i++) ok = ok && (i == PKV_LAB_COUNTS_WIDEST || w[i] == 0);
    return ok;
}

/* Whether PKV_TUNING (key=value,key=value: the library's switches) holds the item key=value. */
static bool tuning_has(const char *item) {
    const char *t = getenv("PKV_TUNING");
    const size_t n = strlen(item);
    for (const char *s = t; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL)
        if (strncmp(s, item, n) == 0 && (s[n] == ',' || s[n] == '\0')) return true;
    return false;
}

/* The decode kernel each shape runs (pkv_dev_decode_kernel, the choice a run makes): with tensor copies
 * on (sm_90 code on an sm_90 device, not PKV_TUNING=tma=0), pages that are a multiple of 16 take them at
 * G <= 16 for d = 64 and 128 and G <= 8 for d = 256, pages of 8, 24, ... at d = 64/128 take them in
 * chunks of 8, and the other page sizes fill the same ring by cp.async into the whole-tile boxes;
 * everything else runs the register kernels.  The outputs would be right either way, so only this
 * catches a tensor-copy path that silently falls back (a map the driver refuses, a gate too strict). */
static void decode_kernel_choice(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng) {
    pkv_dev_info info;
    CHECK_OK(pkv_dev_get_info(ctx, &info));
    const bool tma = info.cc_major >= 9 && !strstr(pkv_context_device_name(ctx), "no sm_90 code") &&
                     !tuning_has("tma=0");
    static const struct {
        int32_t hq, hkv, d, page;
    } shapes[] = {{32, 8, 128, 16}, {32, 8, 128, 48}, {64, 4, 128, 16}, {16, 8, 256, 16}, {64, 4, 256, 16},
                  {32, 8, 128, 8},  {32, 8, 64, 24},  {64, 4, 128, 8},  {32, 8, 128, 4}, {32, 8, 128, 1},
                  {16, 8, 256, 8},  {28, 4, 128, 5},  {14, 2, 64, 16},  {48, 4, 64, 16}, {48, 4, 64, 8},
                  {64, 4, 64, 2}};
    printf("decode kernel of the paper shape: %s\n", tma ? "tensor copies expected" : "register kernels expected");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int32_t lens[2] = {300, 40};
        pkv_test_case tc;
        if (!fixed_case_build(rng, shapes[i].hq, shapes[i].hkv, shapes[i].d, shapes[i].page, PKV_LAYOUT_NHD,
                              PKV_DTYPE_FP16, 2, lens, &tc))
            continue;
        dev_case dc;
        if (dev_case_upload(ctx, &tc, &dc)) {
            const int32_t G = shapes[i].hq / shapes[i].hkv, d = shapes[i].d, page = shapes[i].page;
            const bool whole = tma && (d <= 128 ? G <= 16 : G <= 8);
            char want[64];
            if (whole && page % 16 == 0) snprintf(want, sizeof want, "tensor copies");
            else if (whole && d <= 128 && (page & -page) == 8)
                snprintf(want, sizeof want, "tensor copies in chunks of 8");
            else if (whole) snprintf(want, sizeof want, "cp.async copies (into tiles");
            else snprintf(want, sizeof want, "registers, heads in %s", G > 8 ? "M" : "N");
            const pkv_tensors t = dev_tensors(&dc);
            const char *got = "";
            CHECK_OK(pkv_plan_step(ctx, &tc.problem, &tc.table, NULL, plan));
            CHECK_OK(pkv_dev_decode_kernel(ctx, plan, &t, &got));
            /* want, then the name's end or its qualifier (" (...)", or ")" / ";" inside one) */
            const bool prefix = strncmp(got, want, strlen(want)) == 0;
            const char next = prefix ? got[strlen(want)] : 0;
            CHECK_MSG(prefix && (next == '\0' || next == ' ' || next == ')' || next == ';'),
                      "G=%d d=%d page=%d runs \"%s\", expected \"%s\"", G, d, page, got, want);
        }
        dev_case_free(ctx, &dc);
        pkv_test_case_free(&tc);
    }
    const char *got = NULL;
    CHECK(pkv_dev_decode_kernel(ctx, NULL, NULL, &got) == PKV_ERR_NULL_POINTER);
}

/* One plan run twice on one upload (as each layer of a step runs it), then as a captured CUDA graph
 * replayed 3 times, outputs poisoned before each: o and lse bitwise the same every time, and right.  A
 * graph-stable plan's later runs claim their tasks from counters the earlier run's merge kernel set
 * back to zero (checked after each run). */
static void repeat_runs(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc, const dev_case *dc, void *ws,
                        size_t wsb, const char *what) {
    const size_t qb = dc->qb, lb = dc->lb;
    const bool graph_stable = pkv_plan_graph_signature(plan) != 0;
    pkv_tensors t = dev_tensors(dc);
    uint16_t *o1 = (uint16_t *)malloc(qb), *on = (uint16_t *)malloc(qb);
    float *l1 = (float *)malloc(lb), *ln = (float *)malloc(lb);
    for (int run = 0; o1 && on && l1 && ln && run < 3; run++) {
        CHECK_OK(pkv_dev_memset(ctx, dc->o, 0xff, qb));
        CHECK_OK(pkv_dev_memset(ctx, dc->lse, 0xff, lb));
        CHECK_OK(run < 2 ? pkv_run(ctx, plan, ws, wsb, &t, NULL) : pkv_dev_graph_run(ctx, plan, ws, wsb, &t, 3));
        CHECK_OK(pkv_dev_synchronize(ctx));
        if (graph_stable)
            CHECK_MSG(claim_words_reset(ctx, plan, ws), "%s run %d: the work-claim words are not reset", what, run);
        CHECK_OK(pkv_dev_copy_d2h(ctx, run == 0 ? o1 : on, dc->o, qb));
        CHECK_OK(pkv_dev_copy_d2h(ctx, run == 0 ? l1 : ln, dc->lse, lb));
        if (run > 0) {
            CHECK_MSG(memcmp(o1, on, qb) == 0, "%s: %s differs from a direct run", what,
                      run == 1 ? "a second run of one plan" : "the graph replay");
            CHECK_MSG(memcmp(l1, ln, lb) == 0, "%s: lse of %s differs from a direct run", what,
                      run == 1 ? "a second run of one plan" : "the graph replay");
        }
    }
    if (o1 && l1) { /* and it is right */
        memcpy(tc->o, o1, qb);
        memcpy(tc->lse, l1, lb);
        CHECK_OK(pkv_test_case_reference(tc));
        CHECK_MSG(pkv_test_rel_l2(tc) < 2e-3 && pkv_test_unwritten(tc) == 0, "%s: rel_l2=%.2e", what,
                  pkv_test_rel_l2(tc));
    }
    free(o1), free(on), free(l1), free(ln);
}

/* The same plan twice, and as a captured CUDA graph: bitwise identical outputs - a work-queue plan and
 * a graph-stable one. */
static void repeat_and_graph(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng) {
    pkv_test_case tc;
    if (!mixed_case(rng, &tc)) return;
    dev_case dc;
    if (!dev_case_upload(ctx, &tc, &dc)) {
        dev_case_free(ctx, &dc);
        pkv_test_case_free(&tc);
        return;
    }
    for (int graph_stable = 0; graph_stable < 2; graph_stable++) {
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = PKV_ROUTE_WORKQUEUE;
        if (graph_stable) opts.graph_max_batch = tc.batch_size + 2;
        CHECK_OK(pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan));
        const size_t wsb = pkv_plan_workspace_size(plan);
        void *ws = NULL;
        CHECK_OK(pkv_dev_malloc(ctx, wsb, &ws));
        if (!ws) break;
        repeat_runs(ctx, plan, &tc, &dc, ws, wsb, graph_stable ? "graph-stable plan" : "work-queue plan");
        if (!graph_stable) {
            /* a workspace too small is refused, and page or row strides the 16-byte accesses cannot take */
            pkv_tensors t = dev_tensors(&dc);
            CHECK_STATUS(pkv_run(ctx, plan, ws, wsb - 1, &t, NULL), PKV_ERR_WORKSPACE_TOO_SMALL);
            t.kv_page_stride = (int64_t)tc.problem.page_size * tc.problem.num_kv_heads * tc.problem.head_dim + 4;
            CHECK_STATUS(pkv_run(ctx, plan, ws, wsb, &t, NULL), PKV_ERR_INVALID_ARGUMENT);
            t.kv_page_stride = 0;
            const int64_t row = (int64_t)tc.problem.num_qo_heads * tc.problem.head_dim;
            t.q_row_stride = row + 4;
            CHECK_STATUS(pkv_run(ctx, plan, ws, wsb, &t, NULL), PKV_ERR_INVALID_ARGUMENT);
            CHECK(strstr(pkv_last_error(), "q_row_stride") != NULL);
            t.q_row_stride = 0, t.o_row_stride = row + 12;
            CHECK_STATUS(pkv_run(ctx, plan, ws, wsb, &t, NULL), PKV_ERR_INVALID_ARGUMENT);
            CHECK(strstr(pkv_last_error(), "o_row_stride") != NULL);
        }
        pkv_dev_free(ctx, ws);
    }
    dev_case_free(ctx, &dc);
    pkv_test_case_free(&tc);
}

/* Graph-stable plans as a server runs them: one CUDA graph captured on the first step, then steps of
 * other lengths (0, 1, short, split) and batch sizes (0..6) each planned, uploaded and replayed with a
 * new q in the same buffers, against the reference, outputs poisoned; a plan of other capacities is
 * refused by the replay.  Two shapes: the paper shape (tensor copies on sm_90) and G = 7 bf16 on pages
 * of 5 (register kernels). */
static void graph_stable_replay(pkv_context *ctx, pkv_plan *plan_g, pkv_rng *rng) {
    enum { MAXB = 6 };
    for (int shape = 0; shape < 2; shape++) {
        pkv_problem p;
        pkv_problem_default(&p);
        if (shape == 1) p.num_qo_heads = 28, p.num_kv_heads = 4, p.page_size = 5, p.dtype = PKV_DTYPE_BF16;
        int32_t full[MAXB] = {9000, 4000, 3000, 700, 5000, 20000};
        if (getenv("PKV_TEST_SMALL"))
            for (int i = 0; i < MAXB; i++) full[i] = full[i] > 1500 ? 1500 : full[i];
        pkv_test_case tc;
        CHECK(pkv_test_case_build(rng, &p, MAXB, full, 0.1, 1, &tc));
        if (!tc.ok) {
            pkv_test_case_free(&tc);
            continue;
        }
        dev_case dc;
        void *ws = NULL, *graph = NULL;
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.graph_max_batch = MAXB;
        CHECK_OK(pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan_g));
        const size_t wsb = pkv_plan_workspace_size(plan_g);
        CHECK_OK(pkv_dev_malloc(ctx, wsb, &ws));
        const bool up = dev_case_upload(ctx, &tc, &dc);
        pkv_tensors t = dev_tensors(&dc);
        if (up && ws) CHECK_OK(pkv_dev_graph_capture(ctx, plan_g, ws, wsb, &t, &graph));
        const double tol = p.dtype == PKV_DTYPE_BF16 ? 1.5e-2 : 2e-3;
        const int64_t q_full = tc.q_elems, lse_full = tc.lse_elems;
        for (int step = 0; graph && step < 10; step++) {
            const int32_t B = step == 0 ? MAXB : (int32_t)pkv_rng_uniform_int(rng, 0, MAXB);
            for (int32_t i = 0; i < B; i++) {
                const int64_t kind = pkv_rng_uniform_int(rng, 0, 3);
                tc.seq_lens[i] = (int32_t)(kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? pkv_rng_uniform_int(rng, 2, 200)
                                                                               : pkv_rng_uniform_int(rng, 1, full[i]));
            }
            tc.batch_size = tc.table.batch_size = B;
            tc.q_elems = (int64_t)B * p.num_qo_heads * p.head_dim;
            tc.lse_elems = (int64_t)B * p.num_qo_heads;
            CHECK_OK(pkv_dev_fill_random(ctx, dc.q, q_full, p.dtype, 500 + (uint64_t)step)); /* this step's q */
            CHECK_OK(pkv_dev_memset(ctx, dc.o, 0xff, dc.qb));
            CHECK_OK(pkv_dev_memset(ctx, dc.lse, 0xff, dc.lb));
            pkv_status st = pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan_g);
            CHECK(st == PKV_OK && pkv_plan_workspace_size(plan_g) == wsb);
            if (st == PKV_OK) st = pkv_dev_graph_replay(ctx, graph, plan_g, ws, wsb);
            CHECK_MSG(st == PKV_OK, "graph-stable replay, shape %d step %d: %s", shape, step,
                      pkv_last_error());
            if (st != PKV_OK) break;
            CHECK_MSG(claim_words_reset(ctx, plan_g, ws),
                      "graph-stable replay, shape %d step %d: work-claim words not reset", shape, step);
            CHECK_OK(pkv_dev_copy_d2h(ctx, tc.q, dc.q, (size_t)tc.q_elems * 2));
            fetch_and_reference(ctx, &tc, dc.o, dc.lse);
            const double err = pkv_test_rel_l2(&tc), lerr = pkv_test_lse_err(&tc);
            const int64_t unwritten = pkv_test_unwritten(&tc);
            CHECK_MSG(err < tol && lerr < 1e-2 && unwritten == 0 && pkv_test_empty_rows_nonzero(&tc) == 0,
                      "graph-stable replay, shape %d step %d (B=%d, %d tasks): rel_l2=%.2e lse=%.2e unwritten=%lld",
                      shape, step, B, pkv_plan_num_tasks(plan_g), err, lerr, (long long)unwritten);
        }
        /* a plan of another grid is not the captured graph's */
        pkv_plan_options other = opts;
        other.graph_tasks = pkv_plan_grid_tasks(plan_g) + 1;
        if (graph && pkv_plan_step(ctx, &tc.problem, &tc.table, &other, plan_g) == PKV_OK)
            CHECK_STATUS(pkv_dev_graph_replay(ctx, graph, plan_g, ws, wsb), PKV_ERR_INVALID_ARGUMENT);
        tc.batch_size = tc.table.batch_size = MAXB;
        tc.q_elems = q_full, tc.lse_elems = lse_full;
        pkv_dev_graph_free(graph);
        dev_case_free(ctx, &dc);
        pkv_dev_free(ctx, ws);
        pkv_test_case_free(&tc);
    }
}

/* A serving loop keeps its page table in one buffer and rewrites it between steps: a plan (and a
 * captured graph) run again after the page ids changed in place must read the new ids, not copies left
 * in an SM's caches by the run before (a graph-stable task entry read through the non-coherent path
 * once came back stale on the register kernels; kernel-notes v13c).  Each round moves every row's pages
 * one place along the buffer, so each row reads other pages; outputs poisoned, checked against the
 * reference each time.  Two shapes (tensor copies on sm_90; G = 7 bf16 on pages of 5, register
 * kernels), a work-queue plan and a graph-stable one replayed from its graph. */
static void page_table_in_place(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng) {
    for (int shape = 0; shape < 2; shape++) {
        pkv_problem p;
        pkv_problem_default(&p);
        if (shape == 1) p.num_qo_heads = 28, p.num_kv_heads = 4, p.page_size = 5, p.dtype = PKV_DTYPE_BF16;
        int32_t lens[4] = {3000, 700, 1, 1500};
        pkv_test_case tc; /* every slot of the pool random (no NaN poison): a moved page id reads real data */
        CHECK(pkv_test_case_build(rng, &p, 4, lens, 0.1, 0, &tc));
        dev_case dc;
        if (!tc.ok || !dev_case_upload(ctx, &tc, &dc)) {
            if (tc.ok) dev_case_free(ctx, &dc);
            pkv_test_case_free(&tc);
            continue;
        }
        const double tol = p.dtype == PKV_DTYPE_BF16 ? 1.5e-2 : 2e-3;
        for (int graph_stable = 0; graph_stable < 2; graph_stable++) {
            pkv_plan_options opts;
            pkv_plan_options_default(&opts);
            opts.route = PKV_ROUTE_WORKQUEUE;
            if (graph_stable) opts.graph_max_batch = tc.batch_size;
            CHECK_OK(pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan));
            const size_t wsb = pkv_plan_workspace_size(plan);
            void *ws = NULL, *graph = NULL;
            CHECK_OK(pkv_dev_malloc(ctx, wsb, &ws));
            pkv_tensors t = dev_tensors(&dc);
            if (ws && graph_stable) CHECK_OK(pkv_dev_graph_capture(ctx, plan, ws, wsb, &t, &graph));
            for (int round = 0; ws && (graph || !graph_stable) && round < 3; round++) {
                if (round > 0) { /* the same buffer, every id moved one place: rows read other pages */
                    rotate_page_ids(&tc);
                    CHECK_OK(pkv_dev_copy_h2d(ctx, dc.idx, tc.kv_page_indices, dc.ib));
                }
                CHECK_OK(pkv_dev_memset(ctx, dc.o, 0xff, dc.qb));
                CHECK_OK(pkv_dev_memset(ctx, dc.lse, 0xff, dc.lb));
                CHECK_OK(graph ? pkv_dev_graph_replay(ctx, graph, plan, ws, wsb)
                               : pkv_run(ctx, plan, ws, wsb, &t, NULL));
                CHECK_OK(pkv_dev_synchronize(ctx));
                fetch_and_reference(ctx, &tc, dc.o, dc.lse);
                const double err = pkv_test_rel_l2(&tc);
                const int64_t unwritten = pkv_test_unwritten(&tc);
                CHECK_MSG(err < tol && unwritten == 0, "page table rewritten in place, shape %d, %s, round %d: "
                          "rel_l2=%.2e unwritten=%lld", shape, graph_stable ? "graph-stable replay" : "work queue",
                          round, err, (long long)unwritten);
            }
            pkv_dev_graph_free(graph);
            pkv_dev_free(ctx, ws);
        }
        dev_case_free(ctx, &dc);
        pkv_test_case_free(&tc);
    }
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* A host that plans and uploads the next steps while the GPU still runs earlier work, as a serving
 * loop that overlaps its scheduling with the GPU does: with a kernel holding the stream for 300 ms,
 * the first three plan-and-run calls (fewer than the upload staging ring holds) return without waiting
 * for it, and eight steps of other lengths queued back to back on one plan object and one workspace
 * each give their own outputs (each upload took the plan as it was when uploaded).  Under
 * PKV_TUNING=pageable_upload=1 (uploads from pageable memory) and PKV_TEST_SMALL (the sanitizer runs, whose
 * interception of each call costs time) the wait is printed, not checked. */
static void upload_runs_ahead(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng) {
    enum { STEPS = 8, B = 3, AHEAD = 3 };
    pkv_problem p;
    pkv_problem_default(&p);
    int32_t full[B] = {6000, 2000, 9000}, lens[STEPS][B];
    pkv_test_case tc;
    CHECK(pkv_test_case_build(rng, &p, B, full, 0.1, 1, &tc));
    dev_case dc;
    if (!tc.ok || !dev_case_upload(ctx, &tc, &dc)) {
        if (tc.ok) dev_case_free(ctx, &dc);
        pkv_test_case_free(&tc);
        return;
    }
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    void *o[STEPS] = {0}, *lse[STEPS] = {0}, *ws = NULL, *scratch = NULL;
    size_t wsb = 0;
    bool ok = true;
    for (int k = 0; k < STEPS; k++) {
        for (int i = 0; i < B; i++) /* a split, a short and an empty length among them */
            lens[k][i] = k == 0 ? full[i] : (int32_t)pkv_rng_uniform_int(rng, k == 1 && i == 1 ? 0 : 1, full[i]);
        memcpy(tc.seq_lens, lens[k], sizeof lens[k]);
        CHECK_OK(pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan));
        if (pkv_plan_workspace_size(plan) > wsb) wsb = pkv_plan_workspace_size(plan);
        CHECK_OK(pkv_dev_malloc(ctx, dc.qb, &o[k]));
        CHECK_OK(pkv_dev_malloc(ctx, dc.lb, &lse[k]));
        ok = ok && o[k] && lse[k];
    }
    CHECK_OK(pkv_dev_malloc(ctx, wsb, &ws));
    CHECK_OK(pkv_dev_malloc(ctx, 4096, &scratch));
    for (int warm = 0; ok && ws && scratch && warm < 2; warm++) {
        /* warm = 0: each step once, synchronized (every kernel the steps use is loaded); warm = 1: all
         * eight queued behind the long kernel */
        for (int k = 0; k < STEPS; k++) {
            CHECK_OK(pkv_dev_memset(ctx, o[k], 0xff, dc.qb));
            CHECK_OK(pkv_dev_memset(ctx, lse[k], 0xff, dc.lb));
        }
        CHECK_OK(pkv_dev_synchronize(ctx));
        if (warm) CHECK_OK(pkv_dev_fill_random_late(ctx, scratch, 2048, p.dtype, 1, 300 * 1000 * 1000));
        const double t0 = now_ms();
        double ahead_ms = 0;
        for (int k = 0; k < STEPS; k++) {
            memcpy(tc.seq_lens, lens[k], sizeof lens[k]);
            CHECK_OK(pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan));
            pkv_tensors t = dev_tensors(&dc);
            t.o = o[k], t.lse = (float *)lse[k];
            CHECK_OK(pkv_run(ctx, plan, ws, wsb, &t, NULL));
            if (!warm) CHECK_OK(pkv_dev_synchronize(ctx));
            if (k == AHEAD - 1) ahead_ms = now_ms() - t0;
        }
        if (warm) {
            const bool pageable = tuning_has("pageable_upload=1");
            if (pageable || getenv("PKV_TEST_SMALL")) /* pageable, or under a sanitizer */
                printf("uploads from %s: %d plan-and-run calls behind a 300 ms kernel took %.1f ms\n",
                       pageable ? "pageable memory" : "the staging ring (PKV_TEST_SMALL: not checked)", AHEAD,
                       ahead_ms);
            else
                CHECK_MSG(ahead_ms < 150, "%d plan-and-run calls behind a 300 ms kernel took %.1f ms: an upload "
                          "waited for the stream", AHEAD, ahead_ms);
        }
        CHECK_OK(pkv_dev_synchronize(ctx));
        for (int k = 0; k < STEPS; k++) {
            memcpy(tc.seq_lens, lens[k], sizeof lens[k]);
            tc.total_tokens = 0;
            for (int i = 0; i < B; i++) tc.total_tokens += lens[k][i];
            fetch_and_reference(ctx, &tc, o[k], lse[k]);
            CHECK_MSG(pkv_test_rel_l2(&tc) < 2e-3 && pkv_test_unwritten(&tc) == 0 &&
                          pkv_test_empty_rows_nonzero(&tc) == 0,
                      "step %d of %d %s: rel_l2=%.2e unwritten=%lld", k, STEPS,
                      warm ? "queued behind a long kernel" : "run one at a time", pkv_test_rel_l2(&tc),
                      (long long)pkv_test_unwritten(&tc));
        }
    }
    for (int k = 0; k < STEPS; k++) pkv_dev_free(ctx, o[k]), pkv_dev_free(ctx, lse[k]);
    pkv_dev_free(ctx, ws);
    pkv_dev_free(ctx, scratch);
    dev_case_free(ctx, &dc);
    pkv_test_case_free(&tc);
}

/* Every route queued right behind a kernel that writes one of the run's inputs late, as a model's layer
 * has one before attention (q from the projection, the new token's K and V appended to the cache, the
 * block table of the step): it lets its programmatic dependents start at once, spins 20 us, then writes
 * q, the whole K pool, the whole V pool, or the page ids (every id moved one place along the buffer).  A
 * run whose kernels touched that input (or the outputs) before their dependency wait would use the old
 * values; with PDL off (pdl = 0) the same runs in stream order.  Every pool slot holds real data here
 * (no NaN poison), since moved page ids point rows at other pages. */
static void behind_a_producer(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng, const char *what) {
    pkv_test_case tc;
    if (!mixed_case(rng, &tc)) return;
    dev_case dc;
    void *ids_next = NULL;
    if (!dev_case_upload(ctx, &tc, &dc)) {
        dev_case_free(ctx, &dc);
        pkv_test_case_free(&tc);
        return;
    }
    const pkv_dtype dt = tc.problem.dtype;
    const size_t kvb = dc.kvb;
    CHECK_OK(pkv_dev_fill_random(ctx, dc.k, tc.kv_elems, dt, 77));
    CHECK_OK(pkv_dev_fill_random(ctx, dc.v, tc.kv_elems, dt, 78));
    CHECK_OK(pkv_dev_copy_d2h(ctx, tc.k_cache, dc.k, kvb));
    CHECK_OK(pkv_dev_copy_d2h(ctx, tc.v_cache, dc.v, kvb));
    CHECK_OK(pkv_dev_malloc(ctx, dc.ib, &ids_next));
    void *q = dc.q, *o = dc.o, *lse = dc.lse;
    const size_t qb = dc.qb, lb = dc.lb;
    pkv_tensors t = dev_tensors(&dc);
    static const char *written[] = {"q", "K", "V", "the page ids"};
    for (size_t r = 0; ids_next && r < sizeof routes / sizeof routes[0]; r++) {
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = routes[r];
        CHECK_OK(pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan));
        const size_t wsb = pkv_plan_workspace_size(plan);
        void *ws = NULL;
        CHECK_OK(pkv_dev_malloc(ctx, wsb, &ws));
        if (!ws) break;
        CHECK_OK(pkv_plan_upload(ctx, plan, ws, wsb, NULL));
        for (int target = 0; target < 4; target++) {
            const uint64_t seed = 2000 + 10 * (uint64_t)r + (uint64_t)target;
            if (target == 0) CHECK_OK(pkv_dev_fill_random(ctx, q, tc.q_elems, dt, 1000 + r)); /* the old q */
            if (target == 3) { /* the next ids, staged on the device */
                rotate_page_ids(&tc);
                CHECK_OK(pkv_dev_copy_h2d(ctx, ids_next, tc.kv_page_indices, dc.ib));
            }
            CHECK_OK(pkv_dev_memset(ctx, o, 0xff, qb));
            CHECK_OK(pkv_dev_memset(ctx, lse, 0xff, lb));
            CHECK_OK(pkv_dev_synchronize(ctx));
            const int64_t late_ns = 20000;
            if (target == 0) CHECK_OK(pkv_dev_fill_random_late(ctx, q, tc.q_elems, dt, seed, late_ns));
            if (target == 1) CHECK_OK(pkv_dev_fill_random_late(ctx, dc.k, tc.kv_elems, dt, seed, late_ns));
            if (target == 2) CHECK_OK(pkv_dev_fill_random_late(ctx, dc.v, tc.kv_elems, dt, seed, late_ns));
            if (target == 3) CHECK_OK(pkv_dev_copy_late(ctx, dc.idx, ids_next, dc.ib, late_ns));
            CHECK_OK(pkv_run(ctx, plan, ws, wsb, &t, NULL));
            CHECK_OK(pkv_dev_synchronize(ctx));
            /* the producer's values: the reference's */
            if (target == 0) CHECK_OK(pkv_dev_copy_d2h(ctx, tc.q, q, qb));
            if (target == 1) CHECK_OK(pkv_dev_copy_d2h(ctx, tc.k_cache, dc.k, kvb));
            if (target == 2) CHECK_OK(pkv_dev_copy_d2h(ctx, tc.v_cache, dc.v, kvb));
            fetch_and_reference(ctx, &tc, o, lse);
            const double err = pkv_test_rel_l2(&tc), lerr = pkv_test_lse_err(&tc);
            const int64_t unwritten = pkv_test_unwritten(&tc);
            CHECK_MSG(err < 2e-3 && lerr < 1e-2 && unwritten == 0,
                      "%s, route %s behind a producer that writes %s late: rel_l2=%.2e lse=%.2e unwritten=%lld", what,
                      pkv_route_name(routes[r]), written[target], err, lerr, (long long)unwritten);
        }
        pkv_dev_free(ctx, ws);
    }
    pkv_dev_free(ctx, ids_next);
    dev_case_free(ctx, &dc);
    pkv_test_case_free(&tc);
}

/* count random cases under the choices through check_case: a quarter of them with a sliding window, a
 * third capped; dense or interleaved K/V; every other case with q as the query part of a fused QKV output,
 * every fourth case (one with a dense q) with o's rows further apart. */
static void random_cases(pkv_context *ctx, pkv_plan *plan, pkv_rng *rng, const pkv_test_choices *ch, int count,
                         const char *label) {
    for (int n = 0; n < count; n++) {
        pkv_test_case tc;
        CHECK(pkv_test_case_random(rng, ch, &tc));
        if (!tc.ok) continue;
        if (n % 4 == 1) {
            tc.problem.window = (int32_t)pkv_rng_uniform_int(rng, 1, ch->max_len);
            pkv_test_poison_before_window(&tc);
        }
        if (n % 6 == 1 || n % 6 == 4) pkv_test_random_cap(rng, &tc.problem);
        CHECK_OK(pkv_test_case_reference(&tc));
        char what[48];
        snprintf(what, sizeof what, "%s %d", label, n);
        const int64_t qkv_pad = 2 * (int64_t)tc.problem.num_kv_heads * tc.problem.head_dim;
        check_case(ctx, plan, &tc, what,
                   (pkv_test_layout){n % 3 == 0 ? -1 : n % 3 == 1 ? 0 : 8, n % 2 ? qkv_pad : 0, n % 4 == 2 ? 24 : 0});
        pkv_test_case_free(&tc);
    }
}

int main(void) {
    if (!pkv_cuda_available()) PKV_TEST_SKIP("no CUDA device (or a build without CUDA): GPU tests not run");
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = PKV_BACKEND_CUDA;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cc, &ctx));
    if (!ctx) return pkv_test_finish("test_cuda");
    printf("device: %s\n", pkv_context_device_name(ctx));
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_rng rng;
    pkv_rng_seed(&rng, 20261129);

    decode_kernel_choice(ctx, plan, &rng);
    fixed_cases(ctx, plan, &rng);
    repeat_and_graph(ctx, plan, &rng);
    graph_stable_replay(ctx, plan, &rng);
    page_table_in_place(ctx, plan, &rng);
    upload_runs_ahead(ctx, plan, &rng);
    behind_a_producer(ctx, plan, &rng, "PDL on");
    {
        pkv_context_config off = cc;
        off.pdl = 0;
        pkv_context *ctx_off = NULL;
        CHECK_OK(pkv_context_create(&off, &ctx_off));
        if (ctx_off) behind_a_producer(ctx_off, plan, &rng, "PDL off");
        pkv_context_free(ctx_off);
    }
    score_option_cases(ctx, plan, &rng);
    constant_score_cases(ctx, plan, &rng);

    static const int32_t groups[] = {1, 2, 3, 4, 7, 8, 12, 16}, dims[] = {64, 128, 256},
                         pages[] = {1, 2, 8, 12, 16, 24, 64, 256},
                         hkv[] = {1, 2, 4, 8};
    static const pkv_layout layouts[] = {PKV_LAYOUT_NHD, PKV_LAYOUT_HND};
    static const pkv_dtype dtypes[] = {PKV_DTYPE_FP16, PKV_DTYPE_BF16};
    pkv_test_choices ch;
    pkv_test_choices_default(&ch);
    ch.groups = groups, ch.num_groups = 8;
    ch.head_dims = dims, ch.num_head_dims = 3;
    ch.page_sizes = pages, ch.num_page_sizes = 8;
    ch.kv_heads = hkv, ch.num_kv_heads = 4;
    ch.layouts = layouts, ch.num_layouts = 2;
    ch.dtypes = dtypes, ch.num_dtypes = 2;
    ch.max_batch = 12;
    ch.max_len = 2500;
    ch.long_len = getenv("PKV_TEST_SMALL") ? 0 : 40000;
    ch.long_prob = getenv("PKV_TEST_SMALL") ? 0.0 : 0.05;
    if (getenv("PKV_TEST_SMALL")) ch.max_len = 600;
    const char *env = getenv("PKV_TEST_CASES");
    int count = env ? atoi(env) : 60;
    random_cases(ctx, plan, &rng, &ch, count, "random case");
    /* fp8 caches (e4m3 and e5m2 beside fp16 and bf16 q), half of them with per-KV-head scales (in device
     * memory), through the same routes and layouts: the reference dequantizes the same codes exactly */
    static const pkv_dtype kv8[] = {PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};
    ch.kv_dtypes = kv8, ch.num_kv_dtypes = 2;
    ch.head_scale_prob = 0.5;
    random_cases(ctx, plan, &rng, &ch, count / 2 > 8 ? count / 2 : 8, "fp8 random case");
    pkv_plan_free(plan);
    pkv_context_free(ctx);
    return pkv_test_finish("test_cuda");
}
