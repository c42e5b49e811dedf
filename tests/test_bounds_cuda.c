/* test_bounds_cuda.c - bounds mode (pkv_context_config.check_pages) on the CUDA backend.  With the mode on,
 * every route and a graph-stable plan give the reference's outputs on a valid table (no false alarm); a page
 * id planted outside the pool in the run's table after planning is caught before any decode kernel reads
 * it: the run's stream fails, and the recorded fault names the planted row, page and id.  A trap leaves the
 * CUDA context unusable, so each planted case runs in a child process (this binary with "plant N").
 * Usage: test_bounds_cuda [plant CASE] */
#define _POSIX_C_SOURCE 200809L /* popen */
#include "pkv_lab.h"
#include "pkv_test.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The planted cases: a route (or a graph-stable plan), the page size (16: tensor-copy kernel on sm_90,
 * 1: cp.async, 7: the register kernels), the id planted (past the pool or negative). */
typedef struct plant_case {
    pkv_route route;
    int graph;
    int32_t page_size;
    int negative;
} plant_case;
static const plant_case plants[] = {
    {PKV_ROUTE_SINGLE, 0, 16, 0}, {PKV_ROUTE_SPLIT, 0, 7, 1},     {PKV_ROUTE_WORKQUEUE, 0, 1, 0},
    {PKV_ROUTE_FUSED, 0, 16, 1},  {PKV_ROUTE_BUCKETED, 0, 16, 0}, {PKV_ROUTE_AUTO, 1, 16, 0},
};
enum { kPlants = sizeof plants / sizeof plants[0] };

static pkv_context *bounds_ctx(void) {
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = PKV_BACKEND_CUDA;
    cc.check_pages = 1;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cc, &ctx));
    return ctx;
}

static bool build(pkv_rng *rng, int32_t page_size, pkv_test_case *tc) {
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_qo_heads = 32;
    p.num_kv_heads = 8;
    p.head_dim = 128;
    p.page_size = page_size;
    const int32_t lens[4] = {9000, 700, 1, 0};
    CHECK(pkv_test_case_build(rng, &p, 4, lens, 0.25, 1, tc));
    return tc->ok != 0;
}

/* No false alarm: every route and a graph-stable plan against the reference with the mode on. */
static void valid_tables(pkv_context *ctx, pkv_rng *rng) {
    static const int32_t pages[] = {16, 7, 1};
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    for (int k = 0; k < 3; k++) {
        pkv_test_case tc;
        if (!build(rng, pages[k], &tc)) continue;
        CHECK_OK(pkv_test_case_reference(&tc));
        for (int r = 0; r <= PKV_ROUTE_FUSED + 1; r++) {
            pkv_plan_options opts;
            pkv_plan_options_default(&opts);
            opts.route = r <= PKV_ROUTE_FUSED ? (pkv_route)r : PKV_ROUTE_AUTO;
            if (r > PKV_ROUTE_FUSED) opts.graph_max_batch = 8;
            pkv_test_poison(&tc);
            pkv_status st = pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan);
            if (st == PKV_OK) st = pkv_test_run(ctx, plan, &tc);
            CHECK_MSG(st == PKV_OK, "page %d route %d: %s", pages[k], r, pkv_last_error());
            const double err = pkv_test_rel_l2(&tc);
            CHECK_MSG(err < 2e-3 && pkv_test_unwritten(&tc) == 0, "page %d route %d: relative L2 %.2e", pages[k], r,
                      err);
        }
        pkv_test_case_free(&tc);
    }
    pkv_page_fault f;
    CHECK(pkv_context_page_fault(ctx, &f) == 0);
    pkv_plan_free(plan);
}

/* Child: plan on the valid table, plant the bad id in the run's copy, run; prints what it saw. */
static int plant(int which) {
    const plant_case *pc = &plants[which];
    pkv_context *ctx = bounds_ctx();
    if (!ctx) return 2;
    pkv_rng rng;
    pkv_rng_seed(&rng, 777 + (uint64_t)which);
    pkv_test_case tc;
    if (!build(&rng, pc->page_size, &tc)) return 2;
    pkv_plan *plan = NULL;
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.route = pc->route;
    if (pc->graph) opts.graph_max_batch = 8;
    if (pkv_plan_create(&plan) != PKV_OK || pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan) != PKV_OK) {
        printf("plan failed: %s\n", pkv_last_error());
        return 2;
    }
    const int32_t row = 0, page = tc.kv_indptr[1] / 2 + 1; /* a page in the middle of the long row */
    const int32_t id = pc->negative ? -5 : (int32_t)tc.problem.num_pages + 3;
    tc.kv_page_indices[tc.kv_indptr[row] + page] = id;
    fflush(stdout);
    const pkv_status st = pkv_test_run(ctx, plan, &tc);
    fflush(stdout); /* the kernel's own line */
    pkv_page_fault f;
    const int got = pkv_context_page_fault(ctx, &f);
    printf("run: %s (%s)\n", pkv_status_string(st), st == PKV_OK ? "" : pkv_last_error());
    if (got) printf("fault: row %d kv_head %d page %d id %d\n", f.row, f.kv_head, f.page, f.page_id);
    printf("planted: row %d page %d id %d\n", row, page, id);
    const int ok = st != PKV_OK && got && f.row == row && f.page == page && f.page_id == id && f.kv_head >= 0 &&
                   f.kv_head < tc.problem.num_kv_heads;
    fflush(stdout);
    _Exit(ok ? 0 : 1); /* no teardown in a context the trap has made unusable */
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "plant") == 0) return plant(atoi(argv[2]) % kPlants);
    if (!pkv_cuda_available()) PKV_TEST_SKIP("no CUDA device (or a build without CUDA): GPU tests not run");
    pkv_context *ctx = bounds_ctx();
    if (!ctx) return pkv_test_finish("test_bounds_cuda");
    pkv_rng rng;
    pkv_rng_seed(&rng, 4242);
    valid_tables(ctx, &rng);
    pkv_context_free(ctx);
    for (int k = 0; k < kPlants; k++) {
        char cmd[4200], out[8192] = "";
        snprintf(cmd, sizeof cmd, "'%s' plant %d 2>&1", argv[0], k);
        FILE *pipe = popen(cmd, "r");
        CHECK(pipe != NULL);
        if (!pipe) continue;
        size_t n = fread(out, 1, sizeof out - 1, pipe);
        out[n] = '\0';
        const int rc = pclose(pipe);
        CHECK_MSG(rc == 0 && strstr(out, "persistentkv: page id") != NULL,
                  "planted case %d (route %s%s, page %d): exit %d, output:\n%s", k, pkv_route_name(plants[k].route),
                  plants[k].graph ? ", graph-stable" : "", plants[k].page_size, rc, out);
        printf("planted case %d (route %s%s, page size %d): %s", k, pkv_route_name(plants[k].route),
               plants[k].graph ? " graph-stable" : "", plants[k].page_size, rc == 0 ? "caught\n" : "MISSED\n");
    }
    return pkv_test_finish("test_bounds_cuda");
}
