/* test_cpu.c - the CPU backend against the float64 reference, on every route.
 *
 * Random problems cover G in {1, 2, 4, 7, 8, 16}, d in {64, 128, 256}, page sizes {1, 16, 64}, NHD
 * and HND, fp16 and bf16, lengths 0 and 1 among typical ones (a few long rows), page ids scattered
 * over a pool with holes, and every KV slot no row may read set to NaN.  Outputs are poisoned with
 * NaN before every run.  Checked: relative L2 error of o and error of lse against the reference,
 * every output written, empty rows exactly 0 / -inf, bitwise identical results when the same plan
 * runs twice and on 1 and 4 threads, lse = NULL accepted, and the workspace and page-id errors.
 *
 * Tolerances: the CPU backend reads the same fp16/bf16 inputs as the reference, so its error is the
 * rounding of o to the dtype (relative RMS about 2e-4 for fp16 and 1.6e-3 for bf16: half an ulp,
 * uniform) plus fp32 accumulation, which is far smaller.  Seen: at most 2.2e-4 (fp16) and 1.8e-3
 * (bf16); the bounds below sit 3 to 5 times above. */
#include "persistentkv.h"
#include "pkv_test.h"
#include "pkv_lab.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *g_ws = NULL;
static size_t g_ws_cap = 0;

static void *workspace_for(size_t bytes) {
    if (bytes > g_ws_cap) {
        free(g_ws);
        g_ws = malloc(bytes);
        g_ws_cap = g_ws ? bytes : 0;
    }
    return g_ws;
}

static pkv_context *make_ctx(int32_t threads) {
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = threads;
    pkv_context *ctx = NULL;
    pkv_status st = pkv_context_create(&cfg, &ctx);
    CHECK_MSG(st == PKV_OK, "pkv_context_create(%d threads): %s", threads, pkv_last_error());
    return ctx;
}

static pkv_tensors tensors_of(const pkv_test_case *tc, bool with_lse) {
    pkv_tensors t = {0};
    t.q = tc->q;
    t.k_cache = tc->k_cache;
    t.v_cache = tc->v_cache;
    t.kv_page_indices = tc->kv_page_indices;
    t.o = tc->o;
    t.lse = with_lse ? tc->lse : NULL;
    return t;
}

/* Poisons the outputs and runs the plan. */
static pkv_status run_poisoned(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc, bool with_lse) {
    pkv_test_poison(tc);
    size_t need = pkv_plan_workspace_size(plan);
    void *ws = workspace_for(need ? need : 1);
    pkv_tensors t = tensors_of(tc, with_lse);
    pkv_status st = pkv_run(ctx, plan, ws, need, &t, NULL);
    if (st != PKV_OK) fprintf(stderr, "pkv_run: %s\n", pkv_last_error());
    return st;
}

typedef struct error_stats {
    double worst_o[2], worst_lse, worst_abs[2];
    int runs;
} error_stats;

static error_stats g_stats;

/* Checks the outputs against the reference; returns true when everything holds. */
static bool check_outputs(const pkv_test_case *tc, const char *label) {
    bool ok = true;
    const int di = tc->problem.dtype == PKV_DTYPE_BF16;
    int64_t unwritten = pkv_test_unwritten(tc);
    double rel = pkv_test_rel_l2(tc), mabs = pkv_test_max_abs(tc), lerr = pkv_test_lse_err(tc);
    int64_t nonzero_empty = pkv_test_empty_rows_nonzero(tc);
    const double tol = di ? PKV_TEST_TOL_O_BF16 : PKV_TEST_TOL_O_FP16;
    CHECK_MSG(unwritten == 0, "%s: %lld output elements left unwritten", label, (long long)unwritten);
    CHECK_MSG(rel < tol, "%s: relative L2 error %.3g >= %.3g", label, rel, tol);
    CHECK_MSG(lerr < PKV_TEST_TOL_LSE, "%s: lse error %.3g >= %.3g", label, lerr, PKV_TEST_TOL_LSE);
    CHECK_MSG(nonzero_empty == 0, "%s: %lld elements of empty rows are not 0", label, (long long)nonzero_empty);
    ok = unwritten == 0 && rel < tol && lerr < PKV_TEST_TOL_LSE && nonzero_empty == 0;
    if (rel > g_stats.worst_o[di]) g_stats.worst_o[di] = rel;
    if (mabs > g_stats.worst_abs[di]) g_stats.worst_abs[di] = mabs;
    if (lerr > g_stats.worst_lse) g_stats.worst_lse = lerr;
    g_stats.runs++;
    return ok;
}

static void describe(const pkv_test_case *tc, char *buf, size_t cap, const char *route, int case_id) {
    const pkv_problem *p = &tc->problem;
    int n = snprintf(buf, cap, "case %d %s: Hq %d Hkv %d d %d page %d %s %s B %d lens", case_id, route,
                     p->num_qo_heads, p->num_kv_heads, p->head_dim, p->page_size,
                     p->layout == PKV_LAYOUT_NHD ? "NHD" : "HND", p->dtype == PKV_DTYPE_FP16 ? "fp16" : "bf16",
                     tc->batch_size);
    for (int32_t i = 0; i < tc->batch_size && n > 0 && (size_t)n < cap - 12; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%d", i ? "," : " ", tc->seq_lens[i]);
}

/* Every route on one case: accuracy, determinism (same plan twice, 1 vs 4 threads), lse = NULL. */
static void check_case(pkv_context *ctx1, pkv_context *ctx4, pkv_test_case *tc, pkv_rng *rng, int case_id,
                       bool compare_threads) {
    CHECK_OK(pkv_test_case_reference(tc));
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    const size_t o_bytes = (size_t)tc->q_elems * sizeof(uint16_t), l_bytes = (size_t)tc->lse_elems * sizeof(float);
    uint16_t *o_first = (uint16_t *)malloc(o_bytes + 2);
    float *lse_first = (float *)malloc(l_bytes + 4);
    static const int32_t pars[] = {0, 2, 16, 132};
    for (int r = PKV_ROUTE_AUTO; r < PKV_ROUTE_COUNT_; r++) {
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = (pkv_route)r;
        opts.parallelism = pars[pkv_rng_uniform_int(rng, 0, 3)];
        if (pkv_rng_uniform01(rng) < 0.25) opts.num_splits = (int32_t)pkv_rng_uniform_int(rng, 1, 40);
        if (pkv_rng_uniform01(rng) < 0.25) opts.chunk_pages = (int32_t)pkv_rng_uniform_int(rng, 1, 8);
        if (pkv_rng_uniform01(rng) < 0.25) opts.min_chunk_tokens = (int32_t)pkv_rng_uniform_int(rng, 1, 64);
        char label[512];
        describe(tc, label, sizeof label, pkv_route_name((pkv_route)r), case_id);
        pkv_status st = pkv_plan_step(ctx4, &tc->problem, &tc->table, &opts, plan);
        CHECK_MSG(st == PKV_OK, "%s: pkv_plan: %s", label, pkv_last_error());
        if (st != PKV_OK) continue;
        const char *why = NULL;
        CHECK_MSG(pkv_test_validate(plan, tc->seq_lens, &why) == PKV_OK, "%s: %s", label, why);

        CHECK_OK(run_poisoned(ctx4, plan, tc, true));
        if (!check_outputs(tc, label)) continue;
        memcpy(o_first, tc->o, o_bytes);
        memcpy(lse_first, tc->lse, l_bytes);
        /* the same plan again: bitwise identical */
        CHECK_OK(run_poisoned(ctx4, plan, tc, true));
        CHECK_MSG(memcmp(o_first, tc->o, o_bytes) == 0 && memcmp(lse_first, tc->lse, l_bytes) == 0,
                  "%s: second run differs", label);
        if (compare_threads) { /* one thread: bitwise identical */
            CHECK_OK(run_poisoned(ctx1, plan, tc, true));
            CHECK_MSG(memcmp(o_first, tc->o, o_bytes) == 0 && memcmp(lse_first, tc->lse, l_bytes) == 0,
                      "%s: 1 thread differs from 4 threads", label);
        }
        if (r == PKV_ROUTE_WORKQUEUE) { /* no lse output: the same o */
            CHECK_OK(run_poisoned(ctx4, plan, tc, false));
            CHECK_MSG(memcmp(o_first, tc->o, o_bytes) == 0, "%s: o differs without lse", label);
        }
    }
    free(o_first);
    free(lse_first);
    pkv_plan_free(plan);
}

static void test_random(pkv_context *ctx1, pkv_context *ctx4) {
    static const int32_t groups[] = {1, 2, 4, 7, 8, 16}, kv_heads[] = {1, 2, 3}, dims[] = {64, 128, 256},
                         pages[] = {1, 16, 64};
    pkv_test_choices ch;
    pkv_test_choices_default(&ch);
    ch.groups = groups;
    ch.num_groups = 6;
    ch.kv_heads = kv_heads;
    ch.num_kv_heads = 3;
    ch.head_dims = dims;
    ch.num_head_dims = 3;
    ch.page_sizes = pages;
    ch.num_page_sizes = 3;
    ch.max_batch = 6;
    ch.max_len = 3000;
    ch.long_len = 20000;
    ch.long_prob = 0.04;
    /* under the sanitizers (PKV_TEST_SANITIZE=1, scripts/sanitize.sh) fewer cases, long rows of 8000
     * tokens (still split many ways) and more of them, so every route, shape and the long-row paths still run */
    const bool sanitize = getenv("PKV_TEST_SANITIZE") && atoi(getenv("PKV_TEST_SANITIZE")) > 0;
    if (sanitize) ch.long_len = 8000, ch.long_prob = 0.1;
    pkv_rng rng;
    pkv_rng_seed(&rng, 20260702);
    const int cases = sanitize ? 16 : 48;
    for (int c = 0; c < cases; c++) {
        pkv_test_case tc;
        if (!pkv_test_case_random(&rng, &ch, &tc)) {
            CHECK_MSG(false, "case %d: out of memory", c);
            pkv_test_case_free(&tc);
            continue;
        }
        check_case(ctx1, ctx4, &tc, &rng, c, c % 3 == 0);
        pkv_test_case_free(&tc);
    }
}

/* Hand-made cases: empty batch, all rows empty, one-token rows, a long row split many ways, large
 * scores (scale 30: softmax far beyond exp's range without the running max), a huge G x d group. */
static void test_edges(pkv_context *ctx1, pkv_context *ctx4) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 99);
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_qo_heads = 8;
    p.num_kv_heads = 2;

    { /* B = 0: nothing to do, nothing touched */
        pkv_test_case tc;
        CHECK(pkv_test_case_build(&rng, &p, 0, NULL, 0.0, 1, &tc));
        pkv_plan *plan = NULL;
        CHECK_OK(pkv_plan_create(&plan));
        CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, NULL, plan));
        pkv_tensors t = {0};
        void *ws = workspace_for(pkv_plan_workspace_size(plan) + 1);
        CHECK_OK(pkv_run(ctx4, plan, ws, pkv_plan_workspace_size(plan), &t, NULL));
        pkv_plan_free(plan);
        pkv_test_case_free(&tc);
    }
    { /* every row empty: o = 0, lse = -inf, no KV needed */
        const int32_t lens[3] = {0, 0, 0};
        pkv_test_case tc;
        CHECK(pkv_test_case_build(&rng, &p, 3, lens, 0.0, 1, &tc));
        CHECK_OK(pkv_test_case_reference(&tc));
        for (int r = PKV_ROUTE_AUTO; r < PKV_ROUTE_COUNT_; r++) {
            pkv_plan_options opts;
            pkv_plan_options_default(&opts);
            opts.route = (pkv_route)r;
            pkv_plan *plan = NULL;
            CHECK_OK(pkv_plan_create(&plan));
            CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan));
            CHECK(pkv_plan_num_tasks(plan) == 0);
            pkv_test_poison(&tc);
            pkv_tensors t = tensors_of(&tc, true);
            t.k_cache = t.v_cache = NULL;
            t.kv_page_indices = NULL;
            size_t need = pkv_plan_workspace_size(plan);
            CHECK_OK(pkv_run(ctx4, plan, workspace_for(need + 1), need, &t, NULL));
            check_outputs(&tc, "all rows empty");
            for (int64_t e = 0; e < tc.lse_elems; e++) CHECK(isinf(tc.lse[e]) && tc.lse[e] < 0);
            pkv_plan_free(plan);
        }
        pkv_test_case_free(&tc);
    }
    { /* one-token rows and a long row split many ways */
        const int32_t lens[5] = {1, 1, 20000, 0, 1};
        for (int layout = 0; layout < 2; layout++) {
            pkv_problem q = p;
            q.layout = (pkv_layout)layout;
            q.page_size = 16;
            pkv_test_case tc;
            CHECK(pkv_test_case_build(&rng, &q, 5, lens, 0.5, 1, &tc));
            CHECK_OK(pkv_test_case_reference(&tc));
            static const int32_t splits[] = {1, 2, 3, 64, 256, 1000};
            for (int s = 0; s < 6; s++) {
                for (int r = PKV_ROUTE_SPLIT; r <= PKV_ROUTE_BUCKETED; r++) {
                    pkv_plan_options opts;
                    pkv_plan_options_default(&opts);
                    opts.route = (pkv_route)r;
                    opts.num_splits = splits[s];
                    opts.min_chunk_tokens = 1;
                    opts.max_splits = 2000;
                    pkv_plan *plan = NULL;
                    CHECK_OK(pkv_plan_create(&plan));
                    CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan));
                    CHECK_OK(run_poisoned(ctx4, plan, &tc, true));
                    char label[96];
                    snprintf(label, sizeof label, "long row, %s, S = %d, %s", pkv_route_name((pkv_route)r),
                             splits[s], layout ? "HND" : "NHD");
                    check_outputs(&tc, label);
                    pkv_plan_free(plan);
                }
            }
            /* workqueue with chunks of one page */
            pkv_plan_options opts;
            pkv_plan_options_default(&opts);
            opts.route = PKV_ROUTE_WORKQUEUE;
            opts.chunk_pages = 1;
            opts.max_splits = 4096;
            pkv_plan *plan = NULL;
            CHECK_OK(pkv_plan_create(&plan));
            CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan));
            CHECK(pkv_plan_num_state_slots(plan) >= 1250 * 2);
            CHECK_OK(run_poisoned(ctx4, plan, &tc, true));
            check_outputs(&tc, "long row, workqueue, chunk of 1 page");
            pkv_plan_free(plan);
            pkv_test_case_free(&tc);
        }
    }
    { /* large scores: sm_scale 30 */
        const int32_t lens[4] = {3000, 17, 1, 700};
        for (int dt = 0; dt < 2; dt++) {
            pkv_problem q = p;
            q.sm_scale = 30.0f;
            q.dtype = dt ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
            pkv_test_case tc;
            CHECK(pkv_test_case_build(&rng, &q, 4, lens, 0.1, 1, &tc));
            CHECK_OK(pkv_test_case_reference(&tc));
            double max_lse = 0;
            for (int64_t e = 0; e < tc.lse_elems; e++)
                if (tc.lse_ref[e] > max_lse) max_lse = tc.lse_ref[e];
            CHECK_MSG(max_lse > 100.0, "scores not large enough (lse %.1f)", max_lse);
            for (int r = PKV_ROUTE_SINGLE; r < PKV_ROUTE_COUNT_; r++) {
                pkv_plan_options opts;
                pkv_plan_options_default(&opts);
                opts.route = (pkv_route)r;
                opts.parallelism = 64;
                pkv_plan *plan = NULL;
                CHECK_OK(pkv_plan_create(&plan));
                CHECK_OK(pkv_plan_step(ctx1, &tc.problem, &tc.table, &opts, plan));
                CHECK_OK(run_poisoned(ctx1, plan, &tc, true));
                char label[64];
                snprintf(label, sizeof label, "scale 30, %s, %s", pkv_route_name((pkv_route)r), dt ? "bf16" : "fp16");
                check_outputs(&tc, label);
                pkv_plan_free(plan);
            }
            pkv_test_case_free(&tc);
        }
    }
    { /* the largest group: G 16, d 256, with splits */
        const int32_t lens[2] = {2500, 300};
        pkv_problem q = p;
        q.num_kv_heads = 1;
        q.num_qo_heads = 16;
        q.head_dim = 256;
        q.page_size = 64;
        pkv_test_case tc;
        CHECK(pkv_test_case_build(&rng, &q, 2, lens, 0.2, 1, &tc));
        CHECK_OK(pkv_test_case_reference(&tc));
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = PKV_ROUTE_WORKQUEUE;
        pkv_plan *plan = NULL;
        CHECK_OK(pkv_plan_create(&plan));
        CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan));
        CHECK(pkv_plan_num_state_slots(plan) > 0);
        CHECK_OK(run_poisoned(ctx4, plan, &tc, true));
        check_outputs(&tc, "G 16 d 256 workqueue");
        pkv_plan_free(plan);
        pkv_test_case_free(&tc);
    }
}

/* Workspace too small, and page ids in the run's tensors that differ from the plan's table. */
static void test_run_errors(pkv_context *ctx4) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 5);
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_qo_heads = 4;
    p.num_kv_heads = 1;
    const int32_t lens[2] = {900, 40};
    pkv_test_case tc;
    CHECK(pkv_test_case_build(&rng, &p, 2, lens, 0.2, 1, &tc));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.route = PKV_ROUTE_SPLIT;
    opts.num_splits = 4;
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan));
    size_t need = pkv_plan_workspace_size(plan);
    CHECK(need > 0);
    CHECK(pkv_plan_num_state_slots(plan) > 0);
    void *ws = workspace_for(need);
    pkv_tensors t = tensors_of(&tc, true);
    pkv_test_poison(&tc);
    CHECK_STATUS(pkv_run(ctx4, plan, ws, need - 1, &t, NULL), PKV_ERR_WORKSPACE_TOO_SMALL);
    CHECK(pkv_last_error()[0] != '\0');
    CHECK(pkv_test_unwritten(&tc) == tc.q_elems + tc.lse_elems); /* nothing written */
    CHECK_STATUS(pkv_run(ctx4, plan, ws, 0, &t, NULL), PKV_ERR_WORKSPACE_TOO_SMALL);
    CHECK_OK(pkv_run(ctx4, plan, ws, need, &t, NULL));
    /* a page id out of range in the run's copy of the table */
    int32_t *bad = (int32_t *)malloc((size_t)tc.kv_indptr[2] * sizeof(int32_t));
    memcpy(bad, tc.kv_page_indices, (size_t)tc.kv_indptr[2] * sizeof(int32_t));
    bad[3] = (int32_t)tc.problem.num_pages;
    t.kv_page_indices = bad;
    pkv_page_fault f = {0, 0, 0, 0};
    CHECK(pkv_context_page_fault(ctx4, &f) == 0); /* none yet */
    CHECK_STATUS(pkv_run(ctx4, plan, ws, need, &t, NULL), PKV_ERR_PAGE_OUT_OF_RANGE);
    CHECK(strstr(pkv_last_error(), "row 0, KV head 0, page 3 of the row") != NULL);
    CHECK(pkv_context_page_fault(ctx4, &f) == 1);
    CHECK_MSG(f.row == 0 && f.kv_head == 0 && f.page == 3 && f.page_id == (int32_t)tc.problem.num_pages,
              "page fault recorded as row %d, KV head %d, page %d, id %d", f.row, f.kv_head, f.page, f.page_id);
    CHECK(pkv_context_page_fault(NULL, &f) == 0 && pkv_context_page_fault(ctx4, NULL) == 0);
    bad[3] = -1;
    CHECK_STATUS(pkv_run(ctx4, plan, ws, need, &t, NULL), PKV_ERR_PAGE_OUT_OF_RANGE);
    CHECK(pkv_last_error()[0] != '\0');
    free(bad);
    pkv_plan_free(plan);
    pkv_test_case_free(&tc);
}

/* K and V interleaved per page in one buffer (pkv_tensors.kv_page_stride), with and without padding
 * between pages, and rows of q and o further apart than Hq x d (q_row_stride, o_row_stride: q as the
 * query part of a fused QKV projection): the same outputs, bit for bit, as the dense tensors on every
 * route, nothing written between o's rows; bad strides are refused before anything is written. */
static void test_strides(pkv_context *ctx4) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 77);
    static const pkv_route routes[] = {PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
    for (int c = 0; c < 6; c++) {
        pkv_problem p;
        pkv_problem_default(&p);
        p.num_qo_heads = c % 2 ? 8 : 12;
        p.num_kv_heads = c % 2 ? 2 : 4;
        p.head_dim = c < 2 ? 64 : 128;
        p.page_size = c % 3 == 0 ? 16 : c % 3 == 1 ? 5 : 1;
        p.layout = c % 2 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD;
        p.dtype = c >= 4 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
        const int32_t lens[4] = {700, 0, 33, 160};
        pkv_test_case tc;
        CHECK(pkv_test_case_build(&rng, &p, 4, lens, 0.2, 1, &tc));
        if (!tc.ok) continue;
        CHECK_OK(pkv_test_case_reference(&tc));
        pkv_plan *plan = NULL;
        CHECK_OK(pkv_plan_create(&plan));
        const size_t ob = (size_t)tc.q_elems * 2, lb = (size_t)tc.lse_elems * 4;
        uint16_t *o_dense = (uint16_t *)malloc(ob);
        float *l_dense = (float *)malloc(lb);
        for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++) {
            pkv_plan_options opts;
            pkv_plan_options_default(&opts);
            opts.route = routes[r];
            opts.min_chunk_tokens = 16; /* small chunks: the split routes split and merge */
            CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan));
            pkv_test_poison(&tc);
            CHECK_OK(pkv_test_run_kv(ctx4, plan, &tc, -1));
            memcpy(o_dense, tc.o, ob);
            memcpy(l_dense, tc.lse, lb);
            /* K/V pad (-1: dense pools), q pad, o pad; odd pads: any stride on the CPU backend */
            static const pkv_test_layout layouts[] = {{0, 0, 0}, {9, 0, 0}, {-1, 2 * 128, 0}, {-1, 0, 3}, {9, 7, 1}};
            for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
                const pkv_test_layout *L = &layouts[l];
                char label[112];
                snprintf(label, sizeof label, "strides, case %d route %d: K/V pad %lld, q pad %lld, o pad %lld", c,
                         (int)routes[r], (long long)L->kv_pad, (long long)L->q_pad, (long long)L->o_pad);
                int64_t gap_writes = -1;
                pkv_test_poison(&tc);
                CHECK_OK(pkv_test_run_layout(ctx4, plan, &tc, L, &gap_writes));
                CHECK_MSG(memcmp(tc.o, o_dense, ob) == 0 && memcmp(tc.lse, l_dense, lb) == 0 && gap_writes == 0,
                          "%s: outputs differ from the dense tensors' (%lld writes between o's rows)", label,
                          (long long)gap_writes);
                check_outputs(&tc, label);
            }
        }
        /* strides below one page, or negative, are refused */
        size_t need = pkv_plan_workspace_size(plan);
        void *ws = workspace_for(need ? need : 1);
        pkv_tensors t = tensors_of(&tc, true);
        const int64_t page = (int64_t)p.page_size * p.num_kv_heads * p.head_dim;
        pkv_test_poison(&tc);
        t.kv_page_stride = page - 1;
        CHECK_STATUS(pkv_run(ctx4, plan, ws, need, &t, NULL), PKV_ERR_INVALID_ARGUMENT);
        CHECK(strstr(pkv_last_error(), "kv_page_stride") != NULL);
        t.kv_page_stride = -2 * page;
        CHECK_STATUS(pkv_run(ctx4, plan, ws, need, &t, NULL), PKV_ERR_INVALID_ARGUMENT);
        CHECK(pkv_test_unwritten(&tc) == tc.q_elems + tc.lse_elems); /* nothing written */
        t.kv_page_stride = INT64_MAX / 4; /* page offsets would overflow int64 */
        CHECK_STATUS(pkv_run(ctx4, plan, ws, need, &t, NULL), PKV_ERR_INVALID_ARGUMENT);
        t.kv_page_stride = page; /* one dense page: the same as 0 */
        CHECK_OK(pkv_run(ctx4, plan, ws, need, &t, NULL));
        /* row strides below one row (rows would overlap), negative or overflowing are refused */
        const int64_t row = (int64_t)p.num_qo_heads * p.head_dim;
        const int64_t bad_rows[] = {row - 1, -row, INT64_MAX / 4};
        for (int which = 0; which < 2; which++)
            for (size_t i = 0; i < sizeof bad_rows / sizeof bad_rows[0]; i++) {
                pkv_tensors tb = t;
                *(which ? &tb.o_row_stride : &tb.q_row_stride) = bad_rows[i];
                pkv_test_poison(&tc);
                CHECK_STATUS(pkv_run(ctx4, plan, ws, need, &tb, NULL), PKV_ERR_INVALID_ARGUMENT);
                CHECK(strstr(pkv_last_error(), which ? "o_row_stride" : "q_row_stride") != NULL);
                CHECK(pkv_test_unwritten(&tc) == tc.q_elems + tc.lse_elems);
            }
        t.q_row_stride = t.o_row_stride = row; /* one dense row: the same as 0 */
        pkv_test_poison(&tc);
        CHECK_OK(pkv_run(ctx4, plan, ws, need, &t, NULL));
        check_outputs(&tc, "row strides of one dense row");
        t.q_row_stride = t.o_row_stride = 0;
        /* a step that fails leaves no runnable plan behind (not the previous step's) */
        pkv_problem bad = tc.problem;
        bad.window = -5;
        CHECK_STATUS(pkv_plan_step(ctx4, &bad, &tc.table, NULL, plan), PKV_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(pkv_run(ctx4, plan, ws, need, &t, NULL), PKV_ERR_INVALID_ARGUMENT);
        bad = tc.problem;
        bad.head_dim = 96;
        CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, NULL, plan));
        CHECK_STATUS(pkv_plan_step(ctx4, &bad, &tc.table, NULL, plan), PKV_ERR_UNSUPPORTED_HEAD_DIM);
        CHECK_STATUS(pkv_run(ctx4, plan, ws, need, &t, NULL), PKV_ERR_INVALID_ARGUMENT);
        CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, NULL, plan));
        CHECK_OK(pkv_run(ctx4, plan, ws, need, &t, NULL));
        free(o_dense);
        free(l_dense);
        pkv_plan_free(plan);
        pkv_test_case_free(&tc);
    }
}

/* Every route of `routes` on tc (small chunks, so the split routes split and merge), against the
 * reference already in tc; `what` names the setting in failure messages. */
static void check_routes(pkv_context *ctx, pkv_test_case *tc, const pkv_route *routes, size_t nroutes,
                         const char *what) {
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    for (size_t r = 0; r < nroutes; r++) {
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = routes[r];
        opts.min_chunk_tokens = 16;
        CHECK_OK(pkv_plan_step(ctx, &tc->problem, &tc->table, &opts, plan));
        CHECK_OK(run_poisoned(ctx, plan, tc, true));
        char label[96];
        snprintf(label, sizeof label, "%s route %s", what, pkv_route_name(routes[r]));
        check_outputs(tc, label);
    }
    pkv_plan_free(plan);
}

/* The L1 distance of the reference outputs of tc from `before` (the same case's earlier reference). */
static double ref_moved(const pkv_test_case *tc, const double *before) {
    double diff = 0;
    for (int64_t i = 0; i < tc->q_elems; i++) diff += fabs(before[i] - tc->o_ref[i]);
    return diff;
}

/* Logits soft-capping (Gemma-2): every route against the float64 reference with the cap, and the cap
 * must matter (the uncapped reference differs); bad caps are refused at plan time. */
static void test_soft_cap(pkv_context *ctx4) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 91);
    static const pkv_route routes[] = {PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_BUCKETED, PKV_ROUTE_WORKQUEUE,
                                       PKV_ROUTE_FUSED};
    static const float caps[] = {0.5f, 50.0f};
    for (int c = 0; c < 2; c++) {
        pkv_problem p;
        pkv_problem_default(&p);
        p.num_qo_heads = 16;
        p.num_kv_heads = 8;
        p.head_dim = c ? 256 : 64;
        p.dtype = c ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
        p.logits_soft_cap = caps[c];
        const int32_t lens[3] = {1200, 7, 0};
        pkv_test_case tc;
        CHECK(pkv_test_case_build(&rng, &p, 3, lens, 0.2, 1, &tc));
        if (!tc.ok) continue;
        /* the uncapped reference first: with a small cap the outputs must move */
        tc.problem.logits_soft_cap = 0.0f;
        CHECK_OK(pkv_test_case_reference(&tc));
        double *plain = (double *)malloc((size_t)tc.q_elems * sizeof(double));
        memcpy(plain, tc.o_ref, (size_t)tc.q_elems * sizeof(double));
        tc.problem.logits_soft_cap = caps[c];
        CHECK_OK(pkv_test_case_reference(&tc));
        if (c == 0)
            CHECK_MSG(ref_moved(&tc, plain) > 1e-3 * (double)tc.q_elems, "a cap of 0.5 left the reference unchanged");
        free(plain);
        char what[32];
        snprintf(what, sizeof what, "soft cap %g", (double)caps[c]);
        check_routes(ctx4, &tc, routes, sizeof routes / sizeof routes[0], what);
        pkv_plan *plan = NULL;
        CHECK_OK(pkv_plan_create(&plan));
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        tc.problem.logits_soft_cap = -1.0f;
        CHECK_STATUS(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan), PKV_ERR_INVALID_ARGUMENT);
        tc.problem.logits_soft_cap = INFINITY;
        CHECK_STATUS(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan), PKV_ERR_INVALID_ARGUMENT);
        pkv_plan_free(plan);
        pkv_test_case_free(&tc);
    }
}

/* Sliding windows: every route against the float64 reference (which attends to [n - W, n) only),
 * windows of 1 token, shorter than a page, across pages and longer than the rows; a window shorter
 * than the rows must change the output. */
static void test_window(pkv_context *ctx4) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 4095);
    static const pkv_route routes[] = {PKV_ROUTE_AUTO, PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_BUCKETED,
                                       PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
    static const int32_t windows[] = {1, 5, 300, 100000};
    for (int c = 0; c < 4; c++) {
        pkv_problem p;
        pkv_problem_default(&p);
        p.num_qo_heads = 8;
        p.num_kv_heads = 2;
        p.head_dim = 64;
        p.page_size = c == 1 ? 7 : 16;
        p.layout = c % 2 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD;
        const int32_t lens[5] = {2000, 0, 1, 301, 40};
        pkv_test_case tc;
        CHECK(pkv_test_case_build(&rng, &p, 5, lens, 0.2, 1, &tc));
        if (!tc.ok) continue;
        CHECK_OK(pkv_test_case_reference(&tc));
        double *plain = (double *)malloc((size_t)tc.q_elems * sizeof(double));
        memcpy(plain, tc.o_ref, (size_t)tc.q_elems * sizeof(double));
        tc.problem.window = windows[c];
        pkv_test_poison_before_window(&tc); /* no route may read a token before a window */
        CHECK_OK(pkv_test_case_reference(&tc));
        const double moved = ref_moved(&tc, plain);
        CHECK_MSG((moved > 0) == (windows[c] < 2000), "window %d: the reference %s", windows[c],
                  moved > 0 ? "changed" : "did not change");
        free(plain);
        char what[32];
        snprintf(what, sizeof what, "window %d", windows[c]);
        check_routes(ctx4, &tc, routes, sizeof routes / sizeof routes[0], what);
        pkv_test_case_free(&tc);
    }
}

/* Constant-shift invariance: every score of a head equal to c, so the weights are uniform whatever c is
 * (o = mean of V, lse = c + ln n).  Split routes merge pieces of unequal size (odd lengths, chunks of
 * 16 tokens); a merge that carried each piece's mass in one float lse loses it once |c| >> ln(l). */
static void test_constant_scores(pkv_context *ctx4) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 1000003);
    static const pkv_route routes[] = {PKV_ROUTE_AUTO, PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_BUCKETED,
                                       PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
    static const double shifts[] = {0.0, 1e3, 1e6, 1e12, 1e20, -1e20};
    for (int shape = 0; shape < 2; shape++)
        for (size_t c = 0; c < sizeof shifts / sizeof shifts[0]; c++) {
            pkv_problem p;
            pkv_problem_default(&p);
            p.num_qo_heads = shape ? 32 : 8;
            p.num_kv_heads = shape ? 8 : 2;
            p.head_dim = shape ? 128 : 64;
            p.page_size = shape ? 7 : 16;
            p.layout = shape ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD;
            p.dtype = shape ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
            const int32_t lens[6] = {1001, 37, 333, 1, 0, 2049};
            pkv_test_case tc;
            CHECK(pkv_test_case_build(&rng, &p, 6, lens, 0.2, 1, &tc));
            if (!tc.ok) continue;
            pkv_test_constant_scores(&tc, &rng, shifts[c]);
            CHECK_OK(pkv_test_case_reference(&tc));
            char what[48];
            snprintf(what, sizeof what, "scores all %g (shape %d)", shifts[c], shape);
            check_routes(ctx4, &tc, routes, sizeof routes / sizeof routes[0], what);
            pkv_test_case_free(&tc);
        }
}

/* Graph-stable plans (the CUDA-graph layout) execute on the CPU backend too: steps of 0..6 rows,
 * empty, short and split rows, some windowed or capped, each against the reference, all in one workspace of the size
 * the first step gave. */
static void test_graph_stable(pkv_context *ctx4) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 61);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    if (!plan) return;
    size_t ws0 = 0;
    for (int step = 0; step < 12; step++) {
        pkv_problem p;
        pkv_problem_default(&p);
        p.num_qo_heads = 8;
        p.num_kv_heads = 2;
        p.head_dim = 64;
        p.dtype = step % 2 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
        if (step % 3 == 2) p.logits_soft_cap = 30.0f;
        const int32_t B = (int32_t)pkv_rng_uniform_int(&rng, 0, 6);
        int32_t lens[6];
        for (int32_t i = 0; i < B; i++)
            lens[i] = (int32_t)pkv_rng_uniform_int(&rng, 0, 1) * (int32_t)pkv_rng_uniform_int(&rng, 1, 3000);
        pkv_test_case tc;
        CHECK(pkv_test_case_build(&rng, &p, B, lens, 0.2, 1, &tc));
        if (!tc.ok) continue;
        if (step % 4 == 1) { /* a sliding window, NaN before it */
            tc.problem.window = 257;
            pkv_test_poison_before_window(&tc);
        }
        CHECK_OK(pkv_test_case_reference(&tc));
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.graph_max_batch = 6;
        opts.graph_tasks = 24;
        CHECK_OK(pkv_plan_step(ctx4, &tc.problem, &tc.table, &opts, plan));
        if (step == 0) ws0 = pkv_plan_workspace_size(plan);
        CHECK(pkv_plan_grid_tasks(plan) == 24 && pkv_plan_workspace_size(plan) == ws0);
        char what[48];
        snprintf(what, sizeof what, "graph-stable step %d (B=%d)", step, B);
        if (run_poisoned(ctx4, plan, &tc, true) == PKV_OK) check_outputs(&tc, what);
        pkv_test_case_free(&tc);
    }
    pkv_plan_free(plan);
}

int main(void) {
    pkv_context *ctx1 = make_ctx(1), *ctx4 = make_ctx(4);
    if (!ctx1 || !ctx4) return pkv_test_finish("test_cpu");
    CHECK(pkv_context_backend(ctx4) == PKV_BACKEND_CPU);
    CHECK(pkv_context_parallelism(ctx1) == 1 && pkv_context_parallelism(ctx4) == 4);
    CHECK(strcmp(pkv_context_device_name(ctx4), "cpu (4 threads)") == 0);
    CHECK(strcmp(pkv_context_device_name(ctx1), "cpu (1 thread)") == 0);
    test_edges(ctx1, ctx4);
    test_run_errors(ctx4);
    test_strides(ctx4);
    test_soft_cap(ctx4);
    test_window(ctx4);
    test_constant_scores(ctx4);
    test_graph_stable(ctx4);
    test_random(ctx1, ctx4);
    printf("test_cpu: %d checked runs; worst relative L2 of o: fp16 %.3g, bf16 %.3g; worst max abs: fp16 %.3g, "
           "bf16 %.3g; worst lse error %.3g\n",
           g_stats.runs, g_stats.worst_o[0], g_stats.worst_o[1], g_stats.worst_abs[0], g_stats.worst_abs[1],
           g_stats.worst_lse);
    pkv_context_free(ctx1);
    pkv_context_free(ctx4);
    free(g_ws);
    return pkv_test_finish("test_cpu");
}
