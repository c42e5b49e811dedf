/* check.c - `pkv check`: every route (and a graph-stable plan) on the chosen backend against the float64 reference on
 * random problems (G, head dim, page size, layout, dtype, the cache's type - q's, or fp8 e4m3 / e5m2 with
 * per-tensor or per-KV-head scales - lengths including 0 and 1, scattered pages, NaN in every KV slot no
 * row may read), outputs poisoned before each run.  A run the backend refuses as unsupported is neither a
 * pass nor a failure: it is named, counted apart, and fails the check (it checked nothing). */
#include "cli.h"
#include "options.h"
#include "pkv_lab.h"

#include <stdlib.h>
#include <string.h>

/* A case in one line: batch, shape, layout, types (an fp8 cache's scales: per tensor, or per KV head), window, cap. */
static const char *describe(const pkv_test_case *tc, int64_t pad, char *buf, size_t cap) {
    const pkv_problem *p = &tc->problem;
    char kv[80] = "";
    if (pkv_test_is_fp8(p->kv_dtype)) {
        if (tc->k_head_scales)
            snprintf(kv, sizeof kv, ", %s KV with per-head scales", cli_dtype_name(p->kv_dtype));
        else
            snprintf(kv, sizeof kv, ", %s KV with scales k %g v %g", cli_dtype_name(p->kv_dtype),
                     (double)pkv_test_kv_scale(tc, 0, 0), (double)pkv_test_kv_scale(tc, 0, 1));
    }
    snprintf(buf, cap, "B=%d G=%d Hkv=%d d=%d page=%d %s %s%s%s window %d cap %g", tc->batch_size,
             p->num_qo_heads / p->num_kv_heads, p->num_kv_heads, p->head_dim, p->page_size,
             p->layout == PKV_LAYOUT_HND ? "HND" : "NHD", cli_dtype_name(p->dtype), kv,
             pad >= 0 ? " interleaved K/V" : "", p->window, (double)p->logits_soft_cap);
    return buf;
}

int cmd_check(int argc, char **argv) {
    check_opts o;
    char err[CLI_ERR_CAP];
    const cli_parse_status ps = check_options_parse(argc, argv, &o, err, sizeof err);
    if (ps == CLI_PARSE_HELP) check_usage(stdout);
    if (ps == CLI_PARSE_BAD) fprintf(stderr, "pkv check: %s\n", err);
    if (ps != CLI_PARSE_GO_ON) return cli_parse_exit_code(ps);
    const int count = o.count;
    const int32_t max_len = o.max_len;
    pkv_context *ctx = NULL;
    if (pkv_context_create(&o.cc, &ctx) != PKV_OK) {
        fprintf(stderr, "pkv check: %s\n", pkv_last_error());
        return 1;
    }
    pkv_rng rng;
    pkv_rng_seed(&rng, o.seed);
    static const int32_t groups[] = {1, 2, 4, 7, 8, 16}, dims[] = {64, 128, 256}, pages[] = {1, 16, 64},
                         hkv[] = {1, 2, 4};
    static const pkv_layout layouts[] = {PKV_LAYOUT_NHD, PKV_LAYOUT_HND};
    static const pkv_dtype dtypes[] = {PKV_DTYPE_FP16, PKV_DTYPE_BF16};
    /* the cache: half the cases q's type (kv_dtype 0), the other half fp8, half of those with per-head scales */
    static const pkv_dtype kv_dtypes[] = {(pkv_dtype)0, (pkv_dtype)0, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};
    pkv_test_choices ch;
    pkv_test_choices_default(&ch);
    ch.groups = groups, ch.num_groups = 6;
    ch.head_dims = dims, ch.num_head_dims = 3;
    ch.page_sizes = pages, ch.num_page_sizes = 3;
    ch.kv_heads = hkv, ch.num_kv_heads = 3;
    ch.layouts = layouts, ch.num_layouts = 2;
    ch.dtypes = dtypes, ch.num_dtypes = 2;
    ch.kv_dtypes = kv_dtypes, ch.num_kv_dtypes = 4;
    ch.head_scale_prob = 0.5;
    ch.max_len = max_len;
    ch.long_len = ch.max_len * 8;
    ch.long_prob = 0.05;
    pkv_plan *plan = NULL;
    if (pkv_plan_create(&plan) != PKV_OK) {
        fprintf(stderr, "pkv check: %s\n", pkv_last_error());
        pkv_context_free(ctx);
        return 1;
    }
    const pkv_route routes[] = {PKV_ROUTE_AUTO, PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_BUCKETED, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
    int passed = 0, failed = 0, unsupported = 0, fp8_runs = 0;
    char desc[256];
    double worst = 0;
    for (int n = 0; n < count; n++) {
        pkv_test_case tc;
        bool built = pkv_test_case_random(&rng, &ch, &tc);
        if (built && n % 4 == 3) { /* every fourth with a sliding window (NaN before it), some capped */
            tc.problem.window = (int32_t)pkv_rng_uniform_int(&rng, 1, ch.max_len);
            pkv_test_poison_before_window(&tc);
        }
        if (built && n % 5 == 3) pkv_test_random_cap(&rng, &tc.problem); /* a cap that binds */
        if (!built || pkv_test_case_reference(&tc) != PKV_OK) {
            fprintf(stderr, "pkv check: cannot build case %d: %s\n", n, pkv_last_error());
            if (built) pkv_test_case_free(&tc);
            pkv_plan_free(plan);
            pkv_context_free(ctx);
            return 1;
        }
        const pkv_problem *p = &tc.problem;
        double tol = p->dtype == PKV_DTYPE_BF16 ? 1.5e-2 : 2e-3;
        const size_t nroutes = sizeof routes / sizeof routes[0];
        for (size_t r = 0; r <= nroutes; r++) { /* r == nroutes: a graph-stable plan (room for 2 more rows) */
            pkv_plan_options opts;
            pkv_plan_options_default(&opts);
            opts.route = r < nroutes ? routes[r] : PKV_ROUTE_AUTO;
            if (r == nroutes) opts.graph_max_batch = tc.batch_size + 2;
            pkv_test_poison(&tc);
            pkv_status st = pkv_plan_step(ctx, p, &tc.table, &opts, plan);
            /* every third case with K and V interleaved per page in one buffer (kv_page_stride) */
            const int64_t pad = n % 3 == 2 ? 8 : -1;
            if (st == PKV_OK) st = pkv_test_run_kv(ctx, plan, &tc, pad);
            if (st == PKV_ERR_UNSUPPORTED || st == PKV_ERR_UNSUPPORTED_DTYPE) {
                unsupported++;
                printf("UNSUPPORTED case %d route %s (not run, not passed): %s: %s\n", n,
                       r < nroutes ? pkv_route_name(routes[r]) : "graph-stable", describe(&tc, pad, desc, sizeof desc),
                       pkv_last_error());
                continue;
            }
            double err = st == PKV_OK ? pkv_test_rel_l2(&tc) : 1.0;
            int64_t unwritten = st == PKV_OK ? pkv_test_unwritten(&tc) : -1;
            double lerr = st == PKV_OK ? pkv_test_lse_err(&tc) : 1.0;
            bool ok = st == PKV_OK && err < tol && unwritten == 0 && lerr < 1e-2;
            if (err > worst && st == PKV_OK) worst = err;
            fp8_runs += pkv_test_is_fp8(p->kv_dtype) ? 1 : 0;
            if (ok) {
                passed++;
            } else {
                failed++;
                printf("FAIL case %d route %s: %s: %s rel_l2=%.2e lse_err=%.2e unwritten=%lld\n", n,
                       r < nroutes ? pkv_route_name(routes[r]) : "graph-stable", describe(&tc, pad, desc, sizeof desc),
                       st == PKV_OK ? "ok" : pkv_last_error(), err, lerr, (long long)unwritten);
            }
        }
        if ((n + 1) % 10 == 0 || n + 1 == count)
            fprintf(stderr, "[%d/%d] %d passed, %d failed, %d unsupported\n", n + 1, count, passed, failed, unsupported);
        pkv_test_case_free(&tc);
    }
    printf("pkv check on %s: %d passed, %d failed, %d unsupported (worst relative L2 error %.2e; fp8 caches: %d "
           "runs)\n",
           pkv_context_device_name(ctx), passed, failed, unsupported, worst, fp8_runs);
    if (unsupported)
        printf("pkv check: %d runs refused by the %s backend as unsupported: they checked nothing (UNSUPPORTED lines "
               "above)\n",
               unsupported, pkv_context_backend(ctx) == PKV_BACKEND_CUDA ? "CUDA" : "CPU");
    pkv_plan_free(plan);
    pkv_context_free(ctx);
    return failed == 0 && unsupported == 0 ? 0 : 1;
}
