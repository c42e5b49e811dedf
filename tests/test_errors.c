/* test_errors.c - every bad input returns its own status and a non-empty message: NULL pointers,
 * bad shapes, bad lengths, bad page tables, a small workspace, unknown routes, an unavailable CUDA
 * backend; status strings for every code; the free functions accept NULL. */
#include "persistentkv.h"
#include "pkv_lab.h"
#include "pkv_test.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* The expected status, and a new message that starts with the status string, on the context
 * (when one is given) or in the thread-local last error.  Every failure also lands in the
 * thread-local message, so a sentinel put there first shows whether the call wrote one. */
#define SENTINEL "(sentinel message)"
#define CHECK_ERR(expr, expected, ctx)                                                            \
    do {                                                                                          \
        pkv_route r__;                                                                            \
        (void)pkv_route_parse(SENTINEL, &r__);                                                    \
        pkv_status st__ = (expr);                                                                 \
        const char *msg__ = (ctx) ? pkv_last_error() : pkv_last_error();               \
        CHECK_MSG(st__ == (expected), "%s returned %d (%s), expected %d (%s)", #expr, (int)st__,  \
                  pkv_status_string(st__), (int)(expected), pkv_status_string(expected));        \
        CHECK_MSG(msg__ && msg__[0] != '\0', "%s: empty message", #expr);                         \
        CHECK_MSG(strstr(pkv_last_error(), SENTINEL) == NULL, "%s: no new message", #expr);       \
        CHECK_MSG(msg__ && strncmp(msg__, pkv_status_string(expected),                            \
                                   strlen(pkv_status_string(expected))) == 0,                     \
                  "%s: message '%s' does not start with '%s'", #expr, msg__ ? msg__ : "(null)",   \
                  pkv_status_string(expected));                                                   \
    } while (0)

/* A small valid step: paper shape, 3 rows (lengths 20, 0, 33), 5 pages of 16 tokens. */
typedef struct fixture {
    pkv_problem problem;
    int32_t lens[3], indptr[4], pages[5];
    pkv_page_table table;
    uint16_t q[3 * 32 * 128], o[3 * 32 * 128];
    float lse[3 * 32];
    uint16_t *k, *v;
} fixture;

static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    pkv_problem_default(&f->problem);
    f->problem.num_pages = 8;
    const int32_t lens[3] = {20, 0, 33}, indptr[4] = {0, 2, 2, 5}, pages[5] = {7, 1, 3, 0, 5};
    memcpy(f->lens, lens, sizeof lens);
    memcpy(f->indptr, indptr, sizeof indptr);
    memcpy(f->pages, pages, sizeof pages);
    f->table.batch_size = 3;
    f->table.kv_indptr = f->indptr;
    f->table.kv_page_indices = f->pages;
    f->table.seq_lens = f->lens;
    const size_t kv = (size_t)8 * 16 * 8 * 128;
    f->k = (uint16_t *)calloc(kv, sizeof(uint16_t));
    f->v = (uint16_t *)calloc(kv, sizeof(uint16_t));
    for (size_t e = 0; e < kv; e++) f->k[e] = f->v[e] = pkv_float_to_half((float)(e % 7) * 0.125f - 0.375f);
    for (size_t e = 0; e < sizeof f->q / sizeof f->q[0]; e++) f->q[e] = pkv_float_to_half(0.25f);
}

static void fixture_free(fixture *f) {
    free(f->k);
    free(f->v);
}

static pkv_tensors fixture_tensors(fixture *f) {
    pkv_tensors t = {
        .q = f->q, .k_cache = f->k, .v_cache = f->v, .kv_page_indices = f->pages, .o = f->o, .lse = f->lse};
    return t;
}

static void test_status_strings(void) {
    const char *seen[PKV_ERR_FOREIGN_PAGE + 1];
    for (int s = 0; s <= PKV_ERR_FOREIGN_PAGE; s++) {
        const char *str = pkv_status_string((pkv_status)s);
        CHECK_MSG(str && str[0] != '\0', "status %d has no string", s);
        CHECK_MSG(str && strcmp(str, "unknown status") != 0, "status %d is unknown", s);
        seen[s] = str;
        for (int r = 0; r < s; r++) CHECK_MSG(strcmp(seen[r], str) != 0, "statuses %d and %d share '%s'", r, s, str);
    }
    CHECK(strcmp(pkv_status_string(PKV_OK), "ok") == 0);
    CHECK(strcmp(pkv_status_string((pkv_status)-1), "unknown status") == 0);
    CHECK(strcmp(pkv_status_string((pkv_status)(PKV_ERR_FOREIGN_PAGE + 1)), "unknown status") == 0);
    CHECK(strcmp(pkv_status_string((pkv_status)1000000), "unknown status") == 0);
}

static void test_free_null(void) {
    pkv_context_free(NULL);
    pkv_plan_free(NULL);
    pkv_page_pool_free(NULL);
    pkv_dev_graph_free(NULL);
    CHECK(pkv_plan_graph_signature(NULL) == 0 && pkv_plan_grid_tasks(NULL) == 0); /* the views accept NULL */
}

/* Graph-stable plans: each bad option with its own status and message, on a context */
static void test_graph_errors(pkv_context *ctx) {
    fixture f;
    fixture_init(&f);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.graph_max_batch = 2; /* the fixture has 3 rows */
    CHECK_ERR(pkv_plan_step(ctx, &f.problem, &f.table, &opts, plan), PKV_ERR_BATCH_SIZE, ctx);
    CHECK(pkv_plan_graph_signature(plan) == 0);
    opts.graph_max_batch = (1 << 20) + 1; /* above the batch limit */
    CHECK_ERR(pkv_plan_step(ctx, &f.problem, &f.table, &opts, plan), PKV_ERR_BATCH_SIZE, ctx);
    opts.graph_max_batch = 4;
    opts.route = PKV_ROUTE_FUSED;
    CHECK_ERR(pkv_plan_step(ctx, &f.problem, &f.table, &opts, plan), PKV_ERR_UNSUPPORTED, ctx);
    opts.route = PKV_ROUTE_WORKQUEUE;
    opts.graph_tasks = 12; /* 4 rows x 8 KV heads: raised to 32 */
    opts.chunk_pages = 1;
    opts.min_chunk_tokens = 16; /* 33 tokens in 3 chunks x 8 heads + 2 x 8: 40 tasks > 32 */
    CHECK_ERR(pkv_plan_step(ctx, &f.problem, &f.table, &opts, plan), PKV_ERR_INVALID_ARGUMENT, ctx);
    opts.chunk_pages = 0;
    CHECK_OK(pkv_plan_step(ctx, &f.problem, &f.table, &opts, plan));
    CHECK(pkv_plan_grid_tasks(plan) == 32 && pkv_plan_graph_signature(plan) != 0);
    size_t bytes = 0;
    CHECK_ERR(pkv_workspace_size(ctx, &f.problem, 5, &opts, &bytes), PKV_ERR_BATCH_SIZE, ctx);
    CHECK_OK(pkv_workspace_size(ctx, &f.problem, 3, &opts, &bytes));
    CHECK(bytes == pkv_plan_workspace_size(plan));
    pkv_plan_free(plan);
    fixture_free(&f);
}

static void test_context_errors(void) {
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    CHECK_ERR(pkv_context_create(&cfg, NULL), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    cfg.backend = (pkv_backend_kind)7;
    pkv_context *ctx = (pkv_context *)&cfg; /* must be reset to NULL on failure */
    CHECK_ERR(pkv_context_create(&cfg, &ctx), PKV_ERR_INVALID_ARGUMENT, (pkv_context *)NULL);
    CHECK(ctx == NULL);
    if (pkv_cuda_available() == 0) {
        pkv_context_config_default(&cfg);
        cfg.backend = PKV_BACKEND_CUDA;
        ctx = (pkv_context *)&cfg;
        CHECK_ERR(pkv_context_create(&cfg, &ctx), PKV_ERR_BACKEND_UNAVAILABLE, (pkv_context *)NULL);
        CHECK(ctx == NULL);
        /* BEST falls back to the CPU */
        pkv_context_config_default(&cfg);
        CHECK_OK(pkv_context_create(&cfg, &ctx));
        CHECK(ctx && pkv_context_backend(ctx) == PKV_BACKEND_CPU);
        pkv_context_free(ctx);
    } else {
        printf("a CUDA device is visible: the unavailable-backend check is skipped\n");
    }
    /* NULL config means the defaults */
    ctx = NULL;
    CHECK_OK(pkv_context_create(NULL, &ctx));
    CHECK(ctx != NULL);
    pkv_context_free(ctx);
}

static void test_route_errors(void) {
    pkv_route r = PKV_ROUTE_SINGLE;
    CHECK_ERR(pkv_route_parse("fastest", &r), PKV_ERR_INVALID_ARGUMENT, (pkv_context *)NULL);
    CHECK(r == PKV_ROUTE_SINGLE);
    CHECK_ERR(pkv_route_parse("", &r), PKV_ERR_INVALID_ARGUMENT, (pkv_context *)NULL);
    CHECK_ERR(pkv_route_parse("Split", &r), PKV_ERR_INVALID_ARGUMENT, (pkv_context *)NULL);
    CHECK_ERR(pkv_route_parse(NULL, &r), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    CHECK_ERR(pkv_route_parse("auto", NULL), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
}

/* Each bad problem through pkv_plan (context), pkv_plan_host, pkv_check_page_table and
 * pkv_reference. */
static void expect_problem_error(pkv_context *ctx, fixture *f, const pkv_problem *bad, pkv_status want,
                                 const char *what) {
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.parallelism = 4;
    static double o_ref[3 * 32 * 128], lse_ref[3 * 32];
    printf("  bad problem: %s\n", what);
    CHECK_ERR(pkv_plan_step(ctx, bad, &f->table, &opts, plan), want, ctx);
    CHECK_ERR(pkv_plan_step_host(bad, &f->table, &opts, plan), want, (pkv_context *)NULL);
    CHECK_ERR(pkv_check_page_table(bad, &f->table), want, (pkv_context *)NULL);
    CHECK_ERR(pkv_reference(bad, &f->table, f->q, f->k, f->v, o_ref, lse_ref), want, (pkv_context *)NULL);
    size_t bytes = 0;
    CHECK_ERR(pkv_workspace_size(ctx, bad, 4, &opts, &bytes), want, ctx);
    pkv_plan_free(plan);
}

static void test_problem_errors(pkv_context *ctx) {
    fixture f;
    fixture_init(&f);
    pkv_problem bad;

    bad = f.problem;
    bad.num_qo_heads = 30; /* 30 % 8 != 0 */
    expect_problem_error(ctx, &f, &bad, PKV_ERR_HEAD_GROUP, "Hq 30, Hkv 8");
    bad = f.problem;
    bad.num_kv_heads = 0;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_HEAD_GROUP, "Hkv 0");
    bad = f.problem;
    bad.head_dim = 96;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_UNSUPPORTED_HEAD_DIM, "head dim 96");
    bad = f.problem;
    bad.dtype = PKV_DTYPE_FP32;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_UNSUPPORTED_DTYPE, "dtype fp32");
    bad = f.problem;
    bad.page_size = 0;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_PAGE_SIZE, "page size 0");
    bad = f.problem;
    bad.page_size = 300;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_PAGE_SIZE, "page size 300");
    bad = f.problem;
    bad.num_qo_heads = 17;
    bad.num_kv_heads = 1; /* G = 17 */
    expect_problem_error(ctx, &f, &bad, PKV_ERR_UNSUPPORTED, "G 17");
    bad = f.problem;
    bad.layout = (pkv_layout)5;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_INVALID_ARGUMENT, "layout 5");
    bad = f.problem;
    bad.sm_scale = NAN;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_INVALID_ARGUMENT, "sm_scale NaN");
    bad = f.problem;
    bad.sm_scale = 1e31f;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_INVALID_ARGUMENT, "sm_scale 1e31");
    bad = f.problem;
    bad.sm_scale = 1e21f; /* fp16 scores times it would overflow float */
    expect_problem_error(ctx, &f, &bad, PKV_ERR_INVALID_ARGUMENT, "sm_scale 1e21");
    bad = f.problem;
    bad.num_qo_heads = 8192;
    bad.num_kv_heads = 1024;
    expect_problem_error(ctx, &f, &bad, PKV_ERR_UNSUPPORTED, "8192 query heads");
    fixture_free(&f);
}

/* Each bad page table through pkv_plan (context), pkv_plan_host, pkv_check_page_table and
 * pkv_reference. */
static void expect_table_error(pkv_context *ctx, fixture *f, const pkv_page_table *bad, pkv_status want,
                               const char *what) {
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.parallelism = 4;
    static double o_ref[3 * 32 * 128], lse_ref[3 * 32];
    printf("  bad page table: %s\n", what);
    CHECK_ERR(pkv_plan_step(ctx, &f->problem, bad, &opts, plan), want, ctx);
    CHECK_ERR(pkv_plan_step_host(&f->problem, bad, &opts, plan), want, (pkv_context *)NULL);
    CHECK_ERR(pkv_check_page_table(&f->problem, bad), want, (pkv_context *)NULL);
    CHECK_ERR(pkv_reference(&f->problem, bad, f->q, f->k, f->v, o_ref, lse_ref), want, (pkv_context *)NULL);
    pkv_plan_free(plan);
}

static void test_table_errors(pkv_context *ctx) {
    fixture f;
    fixture_init(&f);
    pkv_page_table bad;
    int32_t lens[3], indptr[4], pages[5];

    memcpy(lens, f.lens, sizeof lens);
    lens[1] = -1;
    bad = f.table;
    bad.seq_lens = lens;
    expect_table_error(ctx, &f, &bad, PKV_ERR_NEGATIVE_LENGTH, "length -1");

    memcpy(lens, f.lens, sizeof lens);
    lens[0] = 33; /* row 0 owns 2 pages of 16 */
    bad = f.table;
    bad.seq_lens = lens;
    expect_table_error(ctx, &f, &bad, PKV_ERR_LENGTH_EXCEEDS_PAGES, "length 33 in 2 pages of 16");

    memcpy(lens, f.lens, sizeof lens);
    lens[1] = 1; /* row 1 owns no page */
    bad = f.table;
    bad.seq_lens = lens;
    expect_table_error(ctx, &f, &bad, PKV_ERR_LENGTH_EXCEEDS_PAGES, "length 1 in 0 pages");

    memcpy(pages, f.pages, sizeof pages);
    pages[3] = -1;
    bad = f.table;
    bad.kv_page_indices = pages;
    expect_table_error(ctx, &f, &bad, PKV_ERR_PAGE_OUT_OF_RANGE, "page id -1");

    memcpy(pages, f.pages, sizeof pages);
    pages[4] = 8; /* num_pages is 8 */
    bad = f.table;
    bad.kv_page_indices = pages;
    expect_table_error(ctx, &f, &bad, PKV_ERR_PAGE_OUT_OF_RANGE, "page id = num_pages");

    memcpy(indptr, f.indptr, sizeof indptr);
    indptr[0] = 1;
    bad = f.table;
    bad.kv_indptr = indptr;
    expect_table_error(ctx, &f, &bad, PKV_ERR_BAD_INDPTR, "indptr[0] = 1");

    memcpy(indptr, f.indptr, sizeof indptr);
    indptr[2] = 1; /* 2 -> 1 */
    bad = f.table;
    bad.kv_indptr = indptr;
    expect_table_error(ctx, &f, &bad, PKV_ERR_BAD_INDPTR, "indptr decreasing");

    bad = f.table;
    bad.batch_size = -1;
    expect_table_error(ctx, &f, &bad, PKV_ERR_BATCH_SIZE, "batch -1");

    { /* a row above 2^30 tokens (its pages listed: 2^22 + 1 of 256 tokens, every one page 0) */
        const int32_t n_pages = (1 << 22) + 1;
        int32_t *many = (int32_t *)calloc((size_t)n_pages, sizeof(int32_t));
        int32_t long_indptr[2] = {0, n_pages}, long_len[1] = {(1 << 30) + 1};
        CHECK(many != NULL);
        if (many) {
            fixture g = f;
            g.problem.page_size = 256;
            bad.batch_size = 1;
            bad.kv_indptr = long_indptr;
            bad.kv_page_indices = many;
            bad.seq_lens = long_len;
            expect_table_error(ctx, &g, &bad, PKV_ERR_INVALID_ARGUMENT, "a row of 2^30 + 1 tokens");
            long_len[0] = INT32_MAX;
            long_indptr[1] = (1 << 23);
            free(many);
            many = (int32_t *)calloc((size_t)long_indptr[1], sizeof(int32_t));
            CHECK(many != NULL);
            bad.kv_page_indices = many;
            if (many) expect_table_error(ctx, &g, &bad, PKV_ERR_INVALID_ARGUMENT, "a row of INT32_MAX tokens");
            free(many);
        }
    }

    bad = f.table;
    bad.kv_indptr = NULL;
    expect_table_error(ctx, &f, &bad, PKV_ERR_NULL_POINTER, "indptr NULL");

    bad = f.table;
    bad.seq_lens = NULL;
    expect_table_error(ctx, &f, &bad, PKV_ERR_NULL_POINTER, "seq_lens NULL");

    /* page ids may be left out when planning only, but not for checking or the reference */
    bad = f.table;
    bad.kv_page_indices = NULL;
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.parallelism = 4;
    CHECK_OK(pkv_plan_step_host(&f.problem, &bad, &opts, plan));
    CHECK_ERR(pkv_check_page_table(&f.problem, &bad), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    static double o_ref[3 * 32 * 128], lse_ref[3 * 32];
    CHECK_ERR(pkv_reference(&f.problem, &bad, f.q, f.k, f.v, o_ref, lse_ref), PKV_ERR_NULL_POINTER,
              (pkv_context *)NULL);
    pkv_plan_free(plan);

    size_t bytes = 0;
    CHECK_ERR(pkv_workspace_size(ctx, &f.problem, -1, &opts, &bytes), PKV_ERR_BATCH_SIZE, ctx);
    CHECK_ERR(pkv_workspace_size(ctx, &f.problem, 4, &opts, NULL), PKV_ERR_NULL_POINTER, ctx);
    fixture_free(&f);
}

/* Plan options beyond their documented bounds (the planner's counts and byte sizes would overflow), a
 * plan whose last planning failed, pointers off their elements' alignment, and the cost model's
 * functions without a model. */
static void test_bounds(pkv_context *ctx) {
    fixture f;
    fixture_init(&f);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    size_t bytes = 0;
    struct {
        int32_t parallelism, ctas_per_unit, max_splits, chunk_pages, graph_max_batch;
        const char *what;
    } bad[] = {{(1 << 16) + 1, 0, 0, 0, 0, "parallelism 2^16 + 1"},
               {2147345044, 1522365147, 0, 0, 0, "parallelism and ctas_per_unit near INT32_MAX"},
               {132, 1025, 0, 0, 0, "ctas_per_unit 1025"},
               {132, 0, (1 << 16) + 1, 1, 0, "max_splits 2^16 + 1"},
               {132, 0, 0, (1 << 26) + 1, 0, "chunk_pages x page size above 2^30"},
               {INT32_MAX, INT32_MAX, 0, 0, 128, "a graph-stable plan of INT32_MAX x INT32_MAX slots"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pkv_plan_options o;
        pkv_plan_options_default(&o);
        o.parallelism = bad[i].parallelism;
        o.ctas_per_unit = bad[i].ctas_per_unit;
        o.max_splits = bad[i].max_splits;
        o.chunk_pages = bad[i].chunk_pages;
        o.graph_max_batch = bad[i].graph_max_batch;
        if (o.chunk_pages > 0) o.route = PKV_ROUTE_WORKQUEUE;
        printf("  bad options: %s\n", bad[i].what);
        CHECK_ERR(pkv_workspace_size(ctx, &f.problem, 4, &o, &bytes), PKV_ERR_INVALID_ARGUMENT, ctx);
        CHECK_ERR(pkv_plan_step(ctx, &f.problem, &f.table, &o, plan), PKV_ERR_INVALID_ARGUMENT, ctx);
    }
    {
        pkv_plan_options o; /* a graph-stable grid the options force past 2^24 tasks */
        pkv_plan_options_default(&o);
        o.graph_max_batch = 4;
        o.graph_tasks = INT32_MAX;
        CHECK_ERR(pkv_workspace_size(ctx, &f.problem, 4, &o, &bytes), PKV_ERR_INVALID_ARGUMENT, ctx);
        CHECK_ERR(pkv_plan_step(ctx, &f.problem, &f.table, &o, plan), PKV_ERR_INVALID_ARGUMENT, ctx);
    }

    /* a failed planning leaves no terms: not the last good plan's tasks under the new problem */
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.route = PKV_ROUTE_SPLIT;
    CHECK_OK(pkv_plan_step(ctx, &f.problem, &f.table, &opts, plan));
    double terms[PKV_COST_TERMS];
    CHECK_OK(pkv_cost_terms(plan, terms));
    pkv_problem p256 = f.problem;
    p256.head_dim = 256;
    pkv_plan_options g = opts;
    g.route = PKV_ROUTE_WORKQUEUE;
    g.graph_max_batch = 2; /* the batch has 3 rows */
    CHECK_ERR(pkv_plan_step(ctx, &p256, &f.table, &g, plan), PKV_ERR_BATCH_SIZE, ctx);
    CHECK_ERR(pkv_cost_terms(plan, terms), PKV_ERR_INVALID_ARGUMENT, (pkv_context *)NULL);

    /* pointers off their elements' alignment (the CPU backend too) */
    CHECK_OK(pkv_plan_step(ctx, &f.problem, &f.table, &opts, plan));
    const size_t need = pkv_plan_workspace_size(plan);
    unsigned char *wsb = (unsigned char *)malloc(need + 16);
    float *lse_store = (float *)malloc(sizeof f.lse + 16);
    CHECK(wsb && lse_store);
    if (wsb && lse_store) {
        pkv_tensors t = fixture_tensors(&f);
        CHECK_ERR(pkv_run(ctx, plan, wsb + 4, need, &t, NULL), PKV_ERR_INVALID_ARGUMENT, ctx);
        t.lse = (float *)((unsigned char *)lse_store + 2);
        CHECK_ERR(pkv_run(ctx, plan, wsb, need, &t, NULL), PKV_ERR_INVALID_ARGUMENT, ctx);
        t = fixture_tensors(&f);
        t.o = (unsigned char *)f.o + 1;
        CHECK_ERR(pkv_run(ctx, plan, wsb, need, &t, NULL), PKV_ERR_INVALID_ARGUMENT, ctx);
        t = fixture_tensors(&f);
        CHECK_OK(pkv_run(ctx, plan, wsb, need, &t, NULL));
    }
    free(wsb);
    free(lse_store);

    /* the cost model's functions without a model or terms */
    pkv_cost_model_default(NULL, 132, 4000, 3);
    pkv_cost_model m;
    pkv_cost_model_default(&m, 132, 4000, 3);
    CHECK(isnan(pkv_cost_predict(NULL, terms)) && isnan(pkv_cost_predict(&m, NULL)));
    CHECK(pkv_cost_candidate(NULL, 132) == 0);
    pkv_plan_free(plan);
    fixture_free(&f);
}

/* NULL pointers and a small workspace through plan and run. */
static void test_null_and_run_errors(pkv_context *ctx) {
    fixture f;
    fixture_init(&f);
    pkv_plan *plan = NULL;
    CHECK_ERR(pkv_plan_create(NULL), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.route = PKV_ROUTE_SPLIT;
    opts.num_splits = 2;
    opts.min_chunk_tokens = 16; /* rows of 20 and 33 tokens: split in pages */

    CHECK_ERR(pkv_plan_step(NULL, &f.problem, &f.table, &opts, plan), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    CHECK_ERR(pkv_plan_step(ctx, NULL, &f.table, &opts, plan), PKV_ERR_NULL_POINTER, ctx);
    CHECK_ERR(pkv_plan_step(ctx, &f.problem, NULL, &opts, plan), PKV_ERR_NULL_POINTER, ctx);
    CHECK_ERR(pkv_plan_step(ctx, &f.problem, &f.table, &opts, NULL), PKV_ERR_NULL_POINTER, ctx);
    CHECK_ERR(pkv_plan_step_host(NULL, &f.table, &opts, plan), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    CHECK_ERR(pkv_plan_step_host(&f.problem, NULL, &opts, plan), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    CHECK_ERR(pkv_plan_step_host(&f.problem, &f.table, &opts, NULL), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    /* pkv_plan_host needs the parallelism in the options */
    CHECK_ERR(pkv_plan_step_host(&f.problem, &f.table, NULL, plan), PKV_ERR_INVALID_ARGUMENT, (pkv_context *)NULL);
    pkv_plan_options bad_route = opts;
    bad_route.route = (pkv_route)99;
    CHECK_ERR(pkv_plan_step(ctx, &f.problem, &f.table, &bad_route, plan), PKV_ERR_INVALID_ARGUMENT, ctx);

    /* a plan never filled cannot run */
    pkv_tensors t = fixture_tensors(&f);
    static _Alignas(16) unsigned char ws[1 << 20];
    CHECK_ERR(pkv_run(ctx, plan, ws, sizeof ws, &t, NULL), PKV_ERR_INVALID_ARGUMENT, ctx);

    CHECK_OK(pkv_plan_step(ctx, &f.problem, &f.table, &opts, plan));
    const size_t need = pkv_plan_workspace_size(plan);
    CHECK(need > 0 && need <= sizeof ws);
    CHECK(pkv_plan_num_state_slots(plan) > 0);
    CHECK_OK(pkv_run(ctx, plan, ws, need, &t, NULL));
    CHECK(pkv_last_error()[0] == '\0'); /* a success clears the message */

    CHECK_ERR(pkv_run(NULL, plan, ws, need, &t, NULL), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    CHECK_ERR(pkv_run(ctx, NULL, ws, need, &t, NULL), PKV_ERR_NULL_POINTER, ctx);
    CHECK_ERR(pkv_run(ctx, plan, NULL, need, &t, NULL), PKV_ERR_NULL_POINTER, ctx);
    CHECK_ERR(pkv_run(ctx, plan, ws, need, NULL, NULL), PKV_ERR_NULL_POINTER, ctx);
    CHECK_ERR(pkv_run(ctx, plan, ws, need - 1, &t, NULL), PKV_ERR_WORKSPACE_TOO_SMALL, ctx);
    CHECK_ERR(pkv_run(ctx, plan, ws, 0, &t, NULL), PKV_ERR_WORKSPACE_TOO_SMALL, ctx);
    pkv_tensors bad;
    bad = t;
    bad.q = NULL;
    CHECK_ERR(pkv_run(ctx, plan, ws, need, &bad, NULL), PKV_ERR_NULL_POINTER, ctx);
    bad = t;
    bad.o = NULL;
    CHECK_ERR(pkv_run(ctx, plan, ws, need, &bad, NULL), PKV_ERR_NULL_POINTER, ctx);
    bad = t;
    bad.k_cache = NULL;
    CHECK_ERR(pkv_run(ctx, plan, ws, need, &bad, NULL), PKV_ERR_NULL_POINTER, ctx);
    bad = t;
    bad.v_cache = NULL;
    CHECK_ERR(pkv_run(ctx, plan, ws, need, &bad, NULL), PKV_ERR_NULL_POINTER, ctx);
    bad = t;
    bad.kv_page_indices = NULL;
    CHECK_ERR(pkv_run(ctx, plan, ws, need, &bad, NULL), PKV_ERR_NULL_POINTER, ctx);
    bad = t;
    bad.lse = NULL; /* optional */
    CHECK_OK(pkv_run(ctx, plan, ws, need, &bad, NULL));
    CHECK_ERR(pkv_plan_upload(ctx, plan, ws, need - 1, NULL), PKV_ERR_WORKSPACE_TOO_SMALL, ctx);
    CHECK_OK(pkv_plan_upload(ctx, plan, ws, need, NULL)); /* a no-op on the CPU */

    /* the reference: NULL data with work to do */
    static double o_ref[3 * 32 * 128], lse_ref[3 * 32];
    CHECK_OK(pkv_reference(&f.problem, &f.table, f.q, f.k, f.v, o_ref, lse_ref));
    CHECK(isinf(lse_ref[32]) && lse_ref[32] < 0); /* row 1 is empty */
    CHECK_ERR(pkv_reference(NULL, &f.table, f.q, f.k, f.v, o_ref, lse_ref), PKV_ERR_NULL_POINTER, (pkv_context *)NULL);
    CHECK_ERR(pkv_reference(&f.problem, NULL, f.q, f.k, f.v, o_ref, lse_ref), PKV_ERR_NULL_POINTER,
              (pkv_context *)NULL);
    CHECK_ERR(pkv_reference(&f.problem, &f.table, NULL, f.k, f.v, o_ref, lse_ref), PKV_ERR_NULL_POINTER,
              (pkv_context *)NULL);
    CHECK_ERR(pkv_reference(&f.problem, &f.table, f.q, NULL, f.v, o_ref, lse_ref), PKV_ERR_NULL_POINTER,
              (pkv_context *)NULL);
    CHECK_ERR(pkv_reference(&f.problem, &f.table, f.q, f.k, NULL, o_ref, lse_ref), PKV_ERR_NULL_POINTER,
              (pkv_context *)NULL);
    CHECK_ERR(pkv_reference(&f.problem, &f.table, f.q, f.k, f.v, NULL, lse_ref), PKV_ERR_NULL_POINTER,
              (pkv_context *)NULL);
    CHECK_ERR(pkv_reference(&f.problem, &f.table, f.q, f.k, f.v, o_ref, NULL), PKV_ERR_NULL_POINTER,
              (pkv_context *)NULL);

    /* with no token at all, K, V and page ids may be NULL */
    const int32_t zero_lens[3] = {0, 0, 0};
    pkv_page_table empty = f.table;
    empty.seq_lens = zero_lens;
    CHECK_OK(pkv_plan_step(ctx, &f.problem, &empty, &opts, plan));
    bad = t;
    bad.k_cache = bad.v_cache = NULL;
    bad.kv_page_indices = NULL;
    CHECK_OK(pkv_run(ctx, plan, ws, pkv_plan_workspace_size(plan), &bad, NULL));
    bad.q = NULL;
    CHECK_ERR(pkv_run(ctx, plan, ws, pkv_plan_workspace_size(plan), &bad, NULL), PKV_ERR_NULL_POINTER, ctx);
    pkv_plan_free(plan);
    fixture_free(&f);
}

/* The page-id range check is one vectorised pass (its lanes and its scalar tail): a bad id at any
 * position of a long list, negative or >= num_pages, is caught and named; a valid list passes. */
static void test_page_id_scan(void) {
    enum { N = 1003 };
    static int32_t ids[N];
    int32_t indptr[3] = {0, 500, N}, lens[2] = {500 * 16, (N - 500) * 16};
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_pages = 2000;
    pkv_page_table t = {2, indptr, ids, lens};
    for (int32_t j = 0; j < N; j++) ids[j] = (j * 37) % 1999;
    ids[N - 2] = 1999; /* the largest id, in the scalar tail */
    CHECK_OK(pkv_check_page_table(&p, &t));
    const int32_t at[] = {0, 1, 7, 8, 250, 499, 500, 995, 996, 1000, N - 1};
    const int32_t bad[] = {-1, INT32_MIN, 2000, INT32_MAX, 2001};
    int caught = 0, tried = 0;
    for (size_t a = 0; a < sizeof at / sizeof at[0]; a++)
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            const int32_t keep = ids[at[a]];
            ids[at[a]] = bad[b];
            tried++;
            if (pkv_check_page_table(&p, &t) == PKV_ERR_PAGE_OUT_OF_RANGE) {
                char want[32];
                snprintf(want, sizeof want, "kv_page_indices[%d]", at[a]);
                caught += strstr(pkv_last_error(), want) != NULL;
            }
            ids[at[a]] = keep;
        }
    CHECK_MSG(caught == tried, "page-id scan: %d of %d bad ids caught and named", caught, tried);
    p.num_pages = 1999; /* now ids[N - 2] = 1999 is one past the pool */
    CHECK_STATUS(pkv_check_page_table(&p, &t), PKV_ERR_PAGE_OUT_OF_RANGE);
}

int main(void) {
    test_status_strings();
    test_page_id_scan();
    test_free_null();
    test_context_errors();
    test_route_errors();
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 2;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cfg, &ctx));
    if (ctx) {
        test_problem_errors(ctx);
        test_table_errors(ctx);
        test_null_and_run_errors(ctx);
        test_bounds(ctx);
        test_graph_errors(ctx);
        pkv_context_free(ctx);
    }
    return pkv_test_finish("test_errors");
}
