/* test_cost.c - the cost model of the adaptive policy on the CPU: its terms follow the plan's
 * counters, the fit recovers known coefficients, policy files round-trip and bad ones are refused,
 * and auto with a model picks the candidate of lowest predicted time (synthetic device constants).
 * Simulated GPUs are planned for through pkv_plan_step_caps with their capabilities. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include "pkv_test.h"
#include "internal.h"
#include "pkv_lab.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static void table_for(const int32_t *lens, int32_t B, int32_t ps, int32_t *indptr, pkv_page_table *t) {
    indptr[0] = 0;
    for (int32_t i = 0; i < B; i++) indptr[i + 1] = indptr[i] + (lens[i] + ps - 1) / ps;
    t->batch_size = B;
    t->kv_indptr = indptr;
    t->kv_page_indices = NULL;
    t->seq_lens = lens;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Plan time of auto and of the route auto chose (at auto's wave) on a device of these capabilities
 * and cost model (NULL: the auto rule); the difference is the decision's cost. */
static pkv_route time_decision(const pkv_backend_caps *caps, const pkv_cost_model *model, const pkv_problem *p,
                               const pkv_page_table *t, pkv_plan *plan, int32_t alt_wave, double *auto_us,
                               double *fixed_us) {
    pkv_plan_options a;
    pkv_plan_options_default(&a);
    a.parallelism = 132; /* a GPU's SMs, as its backend would plan */
    for (int k = 0; k < 50; k++) pkv_plan_step_caps(caps, model, p, t, &a, plan);
    const pkv_route chosen = pkv_plan_route(plan);
    const int32_t tasks = pkv_plan_num_tasks(plan);
    {   /* the fixed route at auto's wave (a plan's cost grows with its tasks): the planner's, or
         * the other one auto weighs, one wave of the resident CTAs (alt_wave per unit) */
        pkv_plan_options f = a;
        f.route = chosen;
        if (pkv_plan_step_caps(caps, model, p, t, &f, plan) == PKV_OK && pkv_plan_num_tasks(plan) != tasks) {
            a.ctas_per_unit = alt_wave;
            f.ctas_per_unit = alt_wave;
            CHECK(pkv_plan_step_caps(caps, model, p, t, &f, plan) == PKV_OK && pkv_plan_num_tasks(plan) == tasks);
        }
    }
    /* each plan timed alone, the two kinds alternating; the 10th percentile of 2000 each, which a busy
     * machine's outliers do not move as they move a mean */
    enum { N = 2000 };
    static double ts[2][N];
    const int32_t wave = a.ctas_per_unit;
    for (int k = 0; k < N; k++) {
        for (int which = 0; which < 2; which++) {
            a.route = which ? chosen : PKV_ROUTE_AUTO;
            a.ctas_per_unit = which ? wave : 0;
            double t0 = now_us();
            pkv_plan_step_caps(caps, model, p, t, &a, plan);
            ts[which][k] = now_us() - t0;
        }
    }
    for (int which = 0; which < 2; which++) {
        qsort(ts[which], N, sizeof(double), cmp_double);
        *(which ? fixed_us : auto_us) = ts[which][N / 10];
    }
    return chosen;
}

int main(void) {
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_pages = 1 << 30;
    int32_t lens[128], indptr[129];
    pkv_rng r;
    pkv_rng_seed(&r, 5);
    for (int i = 0; i < 128; i++) lens[i] = (int32_t)pkv_rng_uniform_int(&r, 0, 40000);
    pkv_page_table t;
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.parallelism = 132;

    /* terms follow the counters */
    table_for(lens, 8, 16, indptr, &t);
    for (int route = PKV_ROUTE_SINGLE; route < PKV_ROUTE_COUNT_; route++) {
        o.route = (pkv_route)route;
        CHECK_OK(pkv_plan_step_host(&p, &t, &o, plan));
        double tm[PKV_COST_TERMS];
        CHECK_OK(pkv_cost_terms(plan, tm));
        const pkv_counters *c = pkv_plan_counters(plan);
        CHECK(tm[PKV_TERM_LAUNCHES] == (double)c->launches);
        CHECK(fabs(tm[PKV_TERM_MB] - (c->kv_bytes + c->qo_bytes + c->merge_state_bytes) / 1e6) < 1e-9);
        CHECK(tm[PKV_TERM_LONGEST_MB] > 0 && tm[PKV_TERM_LONGEST_MB] * 1e6 <= c->kv_bytes / 8.0 + 1); /* one head's row */
        CHECK((tm[PKV_TERM_MERGE_MB] > 0) == (c->merge_state_bytes > 0));
        CHECK(tm[PKV_TERM_TASKS] == (double)c->tasks);
        CHECK(tm[PKV_TERM_SLOTS] == 132.0 * 2); /* host plans: 2 resident CTAs per unit */
        CHECK(fabs(tm[PKV_TERM_TASK_MB] * c->tasks - c->kv_bytes / 1e6) < 1e-9);
        CHECK(tm[PKV_TERM_TOKEN_MB] == 128 * 2 * 2 / 1e6);
        CHECK(tm[PKV_TERM_RECT] == (route == PKV_ROUTE_SINGLE || route == PKV_ROUTE_SPLIT));
        CHECK(tm[PKV_TERM_FUSED] == (route == PKV_ROUTE_FUSED));
    }
    CHECK_STATUS(pkv_cost_terms(NULL, NULL), PKV_ERR_NULL_POINTER);

    /* the policy's fast terms (no plan built) equal the terms of the built plans: host plans, and plans
     * for simulated devices (residency, row gathering) */
    {
        static const int32_t hkvs[] = {1, 2, 4, 8}, groups[] = {1, 4, 7, 16}, pages[] = {1, 16, 64};
        int mismatches = 0, compared = 0;
        for (int k = 0; k < 400; k++) {
            pkv_problem q = p;
            q.num_kv_heads = hkvs[pkv_rng_uniform_int(&r, 0, 3)];
            q.num_qo_heads = q.num_kv_heads * groups[pkv_rng_uniform_int(&r, 0, 3)];
            q.page_size = pages[pkv_rng_uniform_int(&r, 0, 2)];
            /* sliding windows, most of them starting mid-page (the first task is shorter than its chunk) */
            q.window = k % 4 == 1 ? (int32_t)pkv_rng_uniform_int(&r, 1, 20000) : 0;
            if (k % 8 == 5) q.page_size = (int32_t)pkv_rng_uniform_int(&r, 2, 256);
            int32_t B = (int32_t)pkv_rng_uniform_int(&r, 0, 100);
            for (int i = 0; i < B; i++)
                lens[i] = pkv_rng_uniform01(&r) < 0.1 ? 0 : (int32_t)pkv_rng_uniform_int(&r, 1, 50000);
            table_for(lens, B, q.page_size, indptr, &t);
            pkv_plan_options fo;
            pkv_plan_options_default(&fo);
            fo.parallelism = (int32_t)pkv_rng_uniform_int(&r, 1, 140);
            if (k % 3 == 1) fo.ctas_per_unit = (int32_t)pkv_rng_uniform_int(&r, 1, 8);
            if (k % 5 == 2) fo.min_chunk_tokens = (int32_t)pkv_rng_uniform_int(&r, 1, 2000);
            if (k % 7 == 3) fo.num_splits = (int32_t)pkv_rng_uniform_int(&r, 1, 40);
            const pkv_route rs[] = {PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
            pkv_backend_caps caps;
            pkv_backend_caps_host(&caps);
            if (k % 2 == 1) { /* a simulated device */
                static const int32_t res[] = {0, 2, 3, 4, 6};
                caps.ctas_per_unit = (int32_t)pkv_rng_uniform_int(&r, 1, 4);
                for (int di = 0; di < 3; di++)
                    for (int gi = 0; gi < 2; gi++) caps.resident[di][gi] = res[pkv_rng_uniform_int(&r, 0, 4)];
                caps.row_gather_below = pkv_rng_uniform01(&r) < 0.5 ? 0 : 8;
                if (pkv_rng_uniform01(&r) < 0.3) q.head_dim = 64;
            }
            for (int ri = 0; ri < 4; ri++) {
                fo.route = rs[ri];
                double a[PKV_COST_TERMS], b[PKV_COST_TERMS];
                CHECK_OK(pkv_plan_step_caps(&caps, NULL, &q, &t, &fo, plan));
                CHECK_OK(pkv_cost_terms(plan, a));
                CHECK_OK(pkv_plan_route_terms(&caps, &q, &t, &fo, b));
                compared++;
                for (int j = 0; j < PKV_COST_TERMS; j++)
                    if (fabs(a[j] - b[j]) > 1e-9 * (1 + fabs(a[j]))) {
                        if (mismatches++ < 5)
                            printf("route %s term %d: plan %g, fast %g (B %d Hkv %d G %d page %d window %d par %d)\n",
                                   pkv_route_name(rs[ri]), j, a[j], b[j], B, q.num_kv_heads,
                                   q.num_qo_heads / q.num_kv_heads, q.page_size, q.window, fo.parallelism);
                    }
            }
        }
        CHECK_MSG(mismatches == 0, "%d of %d fast term sets differ from the plans'", mismatches, compared);
    }

    /* a window whose first token lies mid-page: the fast terms once counted the KV bytes and the longest
     * task from the page's start, the plan from the window's first token (fuzz_plan: one row of 596
     * tokens, window 513, pages of 139, split: 1.233 MB predicted, 1.063 MB planned) */
    {
        pkv_problem q = p;
        q.page_size = 139, q.window = 513;
        lens[0] = 596;
        table_for(lens, 1, q.page_size, indptr, &t);
        pkv_backend_caps caps;
        pkv_backend_caps_host(&caps);
        const pkv_route rs[] = {PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
        for (int ri = 0; ri < 4; ri++) {
            pkv_plan_options fo;
            pkv_plan_options_default(&fo);
            fo.parallelism = 4, fo.route = rs[ri], fo.min_chunk_tokens = 1;
            double a[PKV_COST_TERMS], b[PKV_COST_TERMS];
            CHECK_OK(pkv_plan_step_caps(&caps, NULL, &q, &t, &fo, plan));
            CHECK_OK(pkv_cost_terms(plan, a));
            CHECK_OK(pkv_plan_route_terms(&caps, &q, &t, &fo, b));
            for (int j = 0; j < PKV_COST_TERMS; j++)
                CHECK_MSG(fabs(a[j] - b[j]) <= 1e-9 * (1 + fabs(a[j])), "window mid-page, %s term %d: plan %g, fast %g",
                          pkv_route_name(rs[ri]), j, a[j], b[j]);
        }
    }

    /* the fit recovers a known model from its own predictions (rho on the fit's grid, p = 3; every
     * linear coefficient non-zero, the two merge columns told apart by the fused route) */
    pkv_cost_model truth;
    pkv_cost_model_default(&truth, 132, 4500, 2.5);
    truth.coef[PKV_COEF_CONST_US] = 1.5;
    truth.coef[PKV_COEF_MERGE] = 7.0;
    truth.coef[PKV_COEF_RHO] = 0.01 * pow(20.0, 112 / 160.0);
    enum { N = 160 };
    static double T[N][PKV_COST_TERMS], y[N];
    static int32_t step_of[N];
    int n = 0;
    for (int k = 0; k < 40; k++) {
        int32_t B = 1 + (int32_t)pkv_rng_uniform_int(&r, 0, 127);
        const int ragged = k % 2;
        for (int i = 0; i < B; i++)
            lens[i] = ragged ? (int32_t)pkv_rng_uniform_int(&r, 1, 40000) : 1000 * (1 + k % 20);
        table_for(lens, B, 16, indptr, &t);
        for (int route = PKV_ROUTE_SINGLE; route <= PKV_ROUTE_FUSED && n < N; route++) {
            if (route == PKV_ROUTE_BUCKETED) continue;
            o.route = (pkv_route)route;
            CHECK_OK(pkv_plan_step_host(&p, &t, &o, plan));
            CHECK_OK(pkv_cost_terms(plan, T[n]));
            y[n] = pkv_cost_predict(&truth, T[n]);
            step_of[n] = k;
            n++;
        }
    }
    pkv_cost_model fit;
    memset(&fit, 0, sizeof fit);
    CHECK_OK(pkv_cost_model_fit(n, &T[0][0], y, &fit));
    for (int k = 0; k < PKV_COST_COEFS; k++)
        CHECK_MSG(fabs(fit.coef[k] - truth.coef[k]) <= 1e-3 * (1 + truth.coef[k]), "coef %d: %g vs %g", k, fit.coef[k],
                  truth.coef[k]);
    CHECK(fit.rms_us < 1e-3);
    CHECK(fit.samples == n);
    CHECK_STATUS(pkv_cost_model_fit(3, &T[0][0], y, &fit), PKV_ERR_INVALID_ARGUMENT);
    y[0] = 0;
    CHECK_STATUS(pkv_cost_model_fit(n, &T[0][0], y, &fit), PKV_ERR_INVALID_ARGUMENT);
    y[0] = pkv_cost_predict(&truth, T[0]);

    /* the fit ranked by route choice: with times that are the model's own it is the plain fit; with
     * noisy times its choice over the steps is never worse than the plain fit's (that pair is among
     * its candidates) and its squared relative error stays within 25% of the plain fit's */
    {
        pkv_cost_model ranked;
        memset(&ranked, 0, sizeof ranked);
        CHECK_OK(pkv_cost_model_fit_steps(n, &T[0][0], y, step_of, &ranked));
        for (int k = 0; k < PKV_COST_COEFS; k++)
            CHECK_MSG(fabs(ranked.coef[k] - fit.coef[k]) <= 1e-9 * (1 + fabs(fit.coef[k])), "ranked coef %d: %g vs %g",
                      k, ranked.coef[k], fit.coef[k]);
        static double noisy[N];
        for (int i = 0; i < n; i++) noisy[i] = y[i] * (0.9 + 0.2 * pkv_rng_uniform01(&r));
        pkv_cost_model plain;
        memset(&plain, 0, sizeof plain);
        CHECK_OK(pkv_cost_model_fit(n, &T[0][0], noisy, &plain));
        CHECK_OK(pkv_cost_model_fit_steps(n, &T[0][0], noisy, step_of, &ranked));
        double reg[2] = {0, 0}, err[2] = {0, 0};
        const pkv_cost_model *ms[2] = {&plain, &ranked};
        for (int v = 0; v < 2; v++) {
            for (int i = 0; i < n; i++) {
                const double e = pkv_cost_predict(ms[v], T[i]) / noisy[i] - 1.0;
                err[v] += e * e;
            }
            for (int k = 0; k < 40; k++) {
                double best = INFINITY, pred = INFINITY, pick = 0;
                for (int i = 0; i < n; i++) {
                    if (step_of[i] != k) continue;
                    const double pr = pkv_cost_predict(ms[v], T[i]);
                    if (noisy[i] < best) best = noisy[i];
                    if (pr < pred) pred = pr, pick = noisy[i];
                }
                reg[v] += pick / best - 1.0;
            }
        }
        CHECK_MSG(reg[1] <= reg[0] + 1e-12, "ranked fit's regret %g above the plain fit's %g", reg[1], reg[0]);
        CHECK_MSG(err[1] <= 1.25 * err[0] * (1 + 1e-9), "ranked fit's error %g above 1.25 x %g", err[1], err[0]);
        step_of[3] = n; /* a step id out of range */
        CHECK_STATUS(pkv_cost_model_fit_steps(n, &T[0][0], noisy, step_of, &ranked), PKV_ERR_INVALID_ARGUMENT);
        step_of[3] = -1;
        CHECK_STATUS(pkv_cost_model_fit_steps(n, &T[0][0], noisy, step_of, &ranked), PKV_ERR_INVALID_ARGUMENT);
        step_of[3] = 0;
        printf("ranked fit on noisy times: choice regret %.3f%% (plain fit %.3f%%), squared relative error %.3f (%.3f)\n",
               100.0 * reg[1] / 40, 100.0 * reg[0] / 40, err[1], err[0]);
    }

    /* the model's physics, on the synthetic constants of a 132-SM GPU at 4500 GB/s */
    {
        double t1[PKV_COST_TERMS], t2[PKV_COST_TERMS];
        /* one long row: 8 single tasks cannot reach the bandwidth; a split fills the GPU */
        int32_t one = 65536;
        table_for(&one, 1, 16, indptr, &t);
        o.route = PKV_ROUTE_SINGLE;
        CHECK_OK(pkv_plan_step_host(&p, &t, &o, plan));
        CHECK_OK(pkv_cost_terms(plan, t1));
        o.route = PKV_ROUTE_SPLIT;
        CHECK_OK(pkv_plan_step_host(&p, &t, &o, plan));
        CHECK_OK(pkv_cost_terms(plan, t2));
        CHECK_MSG(pkv_cost_predict(&truth, t2) * 4 < pkv_cost_predict(&truth, t1), "split %g us vs single %g us",
                  pkv_cost_predict(&truth, t2), pkv_cost_predict(&truth, t1));
        /* an even batch that fills the GPU: both read the same bytes near the ceiling; the split
         * pays its merge launch and states */
        for (int i = 0; i < 128; i++) lens[i] = 8192;
        table_for(lens, 128, 16, indptr, &t);
        o.route = PKV_ROUTE_SINGLE;
        CHECK_OK(pkv_plan_step_host(&p, &t, &o, plan));
        CHECK_OK(pkv_cost_terms(plan, t1));
        const double floor_us = t1[PKV_TERM_MB] * truth.coef[PKV_COEF_US_PER_MB];
        CHECK_MSG(pkv_cost_predict(&truth, t1) < 1.25 * floor_us + 10, "single %g us, floor %g us",
                  pkv_cost_predict(&truth, t1), floor_us);
        o.route = PKV_ROUTE_SPLIT;
        o.num_splits = 4;
        CHECK_OK(pkv_plan_step_host(&p, &t, &o, plan));
        o.num_splits = 0;
        CHECK_OK(pkv_cost_terms(plan, t2));
        CHECK(pkv_cost_predict(&truth, t2) > pkv_cost_predict(&truth, t1));
    }

    /* policy files */
    char path[256], bad[256];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/pkv_test_cost_%d.policy", tmp, (int)getpid());
    snprintf(bad, sizeof bad, "%s/pkv_test_cost_%d.bad", tmp, (int)getpid());
    snprintf(fit.device, sizeof fit.device, "synthetic GPU");
    fit.parallelism = 132;
    CHECK_OK(pkv_cost_model_save(&fit, path));
    pkv_cost_model back;
    CHECK_OK(pkv_cost_model_load(path, &back));
    CHECK(strcmp(back.device, "synthetic GPU") == 0 && back.parallelism == 132 && back.samples == n);
    for (int k = 0; k < PKV_COST_COEFS; k++) CHECK(fabs(back.coef[k] - fit.coef[k]) <= 1e-8 * (1 + fabs(fit.coef[k])));
    CHECK_STATUS(pkv_cost_model_load("/nonexistent/x.policy", &back), PKV_ERR_IO);
    /* a complete body, then each way of breaking it */
    static const char good[] = "persistentkv-policy 2\nparallelism = 4\nconst_us = 0\nlaunch_us = 6\n"
                               "fused_merge_us_per_mb = 100\nmerge_us_per_mb = 0\nus_per_mb = 0.22\n"
                               "idle_us_per_mb = 0.09\nrho_mb_per_token = 0.08\n";
    char body[1024];
    snprintf(body, sizeof body, "%ssoftmax_p = 3\n", good);
    {
        FILE *f = fopen(bad, "w");
        fputs(body, f);
        fclose(f);
        CHECK_OK(pkv_cost_model_load(bad, &back));
    }
    const char *bodies[] = {"not a policy\n",
                            "persistentkv-policy 1\nconst_us = 1\n", /* the linear model's files: refused */
                            "persistentkv-policy 2\nconst_us = 1\n",
                            "persistentkv-policy 2\nconst_us = x\n",
                            "persistentkv-policy 2\nwhat = 1\n",
                            "persistentkv-policy 2\nconst_us = -1\n",
                            "softmax_p = 1000\n",           /* overflows the soft max */
                            "softmax_p = 3\nconst_us = 1\n", /* a key twice */
                            "softmax_p = 3\nparallelism = 1e12\n",
                            "softmax_p = 3\nparallelism = 2.5\n"};
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        FILE *f = fopen(bad, "w");
        if (strncmp(bodies[i], "persistentkv", 12) != 0) fputs(good, f);
        fputs(bodies[i], f);
        fclose(f);
        CHECK_MSG(pkv_cost_model_load(bad, &back) == PKV_ERR_PARSE, "body %zu loaded", i);
    }
    {
        /* a comment longer than the line buffer whose tail would read as the missing softmax_p line */
        FILE *f = fopen(bad, "w");
        fputs(good, f);
        fputc('#', f);
        for (int k = 0; k < 510; k++) fputc('-', f);
        fputs("softmax_p = 3\n", f);
        fclose(f);
        CHECK_STATUS(pkv_cost_model_load(bad, &back), PKV_ERR_PARSE);
        CHECK_MSG(strstr(pkv_last_error(), "longer than") != NULL, "long line: %s", pkv_last_error());
    }
    {
        /* a NUL byte after a value (fuzz_policy, fuzz/corpus/policy/regress-nul-after-value): strtod stopped
         * there and the line loaded as "softmax_p = 3" */
        static const char nul_line[] = "softmax_p = 3\0 junk\n";
        FILE *f = fopen(bad, "wb");
        fputs(good, f);
        fwrite(nul_line, 1, sizeof nul_line - 1, f);
        fclose(f);
        CHECK_STATUS(pkv_cost_model_load(bad, &back), PKV_ERR_PARSE);
        CHECK_MSG(strstr(pkv_last_error(), ":10: NUL byte") != NULL, "NUL: %s", pkv_last_error());
    }
    {
        FILE *f = fopen(bad, "w"); /* no parallelism */
        fputs("persistentkv-policy 2\nconst_us = 0\nlaunch_us = 6\nfused_merge_us_per_mb = 100\nmerge_us_per_mb = 0\n"
              "us_per_mb = 0.22\nidle_us_per_mb = 0.09\nrho_mb_per_token = 0.08\nsoftmax_p = 3\n", f);
        fclose(f);
        CHECK_STATUS(pkv_cost_model_load(bad, &back), PKV_ERR_PARSE);
    }

    /* PKV_POLICY: loaded at context creation; a bad file or another device's fails it clearly */
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = PKV_BACKEND_CPU;
    cc.num_threads = 4;
    pkv_context *ctx = NULL;
    pkv_cost_model got;
    setenv("PKV_POLICY", bad, 1);
    CHECK_STATUS(pkv_context_create(&cc, &ctx), PKV_ERR_PARSE);
    CHECK(ctx == NULL && strstr(pkv_last_error(), "PKV_POLICY") != NULL);
    CHECK_MSG(strstr(strstr(pkv_last_error(), "parse error") + 1, "parse error") == NULL, "status twice: %s",
              pkv_last_error());
    fit.cuda_version = 13000; /* measured on a GPU: a CPU context keeps the rule */
    fit.parallelism = 132;
    CHECK_OK(pkv_cost_model_save(&fit, path));
    setenv("PKV_POLICY", path, 1);
    CHECK_OK(pkv_context_create(&cc, &ctx));
    CHECK(pkv_context_get_cost_model(ctx, &got) == 0);
    pkv_context_free(ctx);
    ctx = NULL;
    fit.cuda_version = 0;
    CHECK_OK(pkv_cost_model_save(&fit, path));
    setenv("PKV_POLICY", path, 1); /* measured with 132, this context has 4 threads */
    CHECK_STATUS(pkv_context_create(&cc, &ctx), PKV_ERR_INVALID_ARGUMENT);
    fit.parallelism = 4;
    CHECK_OK(pkv_cost_model_save(&fit, path));
    CHECK_OK(pkv_context_create(&cc, &ctx));
    CHECK(pkv_context_get_cost_model(ctx, &got) == 1 && fabs(got.coef[PKV_COEF_RHO] - fit.coef[PKV_COEF_RHO]) < 1e-8 * fit.coef[PKV_COEF_RHO]);
    pkv_context_free(ctx);
    ctx = NULL;
    unsetenv("PKV_POLICY");
    remove(path);
    remove(bad);

    /* auto with a model picks the candidate of lowest predicted time */
    CHECK_OK(pkv_context_create(&cc, &ctx));
    CHECK(pkv_context_get_cost_model(ctx, &got) == 0); /* the CPU backend: the rule until a model is set */
    pkv_cost_model models[3];
    for (int mi = 0; mi < 2; mi++) {
        memset(&models[mi], 0, sizeof models[mi]);
        models[mi].coef[PKV_COEF_RHO] = 0.05;
        models[mi].coef[PKV_COEF_P] = 3;
    }
    models[0].coef[PKV_COEF_LAUNCH_US] = 100.0; /* launches dominate: a one-launch route */
    models[1].coef[PKV_COEF_FUSED_MERGE] = models[1].coef[PKV_COEF_MERGE] = 1000.0; /* merges dominate: no split */
    models[1].coef[PKV_COEF_CONST_US] = 1;
    pkv_cost_model_default(&models[2], 4, 20, 0.5);
    CHECK_STATUS(pkv_context_set_cost_model(ctx, &models[0]), PKV_OK);
    models[0].coef[PKV_COEF_RHO] = 0;
    CHECK_STATUS(pkv_context_set_cost_model(ctx, &models[0]), PKV_ERR_INVALID_ARGUMENT);
    models[0].coef[PKV_COEF_RHO] = 0.05;
    models[0].coef[PKV_COEF_P] = 100;
    CHECK_STATUS(pkv_context_set_cost_model(ctx, &models[0]), PKV_ERR_INVALID_ARGUMENT);
    models[0].coef[PKV_COEF_P] = 3;
    { /* finite constants whose predictions overflow: auto still plans a real route (the rule's) */
        pkv_cost_model huge = models[0];
        huge.coef[PKV_COEF_LAUNCH_US] = 1e308;
        huge.coef[PKV_COEF_US_PER_MB] = 1e308;
        CHECK_OK(pkv_context_set_cost_model(ctx, &huge));
        table_for(lens, 4, 16, indptr, &t);
        pkv_plan_options a;
        pkv_plan_options_default(&a);
        CHECK_OK(pkv_plan_step(ctx, &p, &t, &a, plan));
        CHECK(pkv_plan_route(plan) != PKV_ROUTE_AUTO);
    }
    for (int mi = 0; mi < 3; mi++) {
        CHECK_OK(pkv_context_set_cost_model(ctx, &models[mi]));
        for (int k = 0; k < 20; k++) {
            int32_t B = 1 + (int32_t)pkv_rng_uniform_int(&r, 0, 15);
            for (int i = 0; i < B; i++) lens[i] = (int32_t)pkv_rng_uniform_int(&r, 1, 20000);
            table_for(lens, B, 16, indptr, &t);
            pkv_plan_options a;
            pkv_plan_options_default(&a);
            CHECK_OK(pkv_plan_step(ctx, &p, &t, &a, plan));
            double tm[PKV_COST_TERMS];
            CHECK_OK(pkv_cost_terms(plan, tm));
            double chosen = pkv_cost_predict(&models[mi], tm);
            pkv_route picked = pkv_plan_route(plan);
            for (int route = PKV_ROUTE_SINGLE; route <= PKV_ROUTE_FUSED; route++) {
                if (route == PKV_ROUTE_BUCKETED) continue;
                a.route = (pkv_route)route;
                CHECK_OK(pkv_plan_step(ctx, &p, &t, &a, plan));
                CHECK_OK(pkv_cost_terms(plan, tm));
                CHECK_MSG(chosen <= pkv_cost_predict(&models[mi], tm) + 1e-9, "model %d picked %s over %s", mi,
                          pkv_route_name(picked), pkv_route_name((pkv_route)route));
            }
            if (mi == 0) CHECK(picked == PKV_ROUTE_SINGLE || picked == PKV_ROUTE_FUSED);
            if (mi == 1) CHECK(picked == PKV_ROUTE_SINGLE);
        }
    }
    /* a single plan whose tasks fill fewer than half of the units is not weighed (its time is one
     * task's critical path, which the model underestimates for long head vectors): 8 rows x 8 KV heads
     * on 132 units go to another route even where merges cost the most; 16 rows (128 tasks) keep it */
    {
        double tt[PKV_COST_TERMS] = {0};
        tt[PKV_TERM_RECT] = 1, tt[PKV_TERM_TASKS] = 65;
        CHECK(pkv_cost_candidate(tt, 132) == 0 && pkv_cost_candidate(tt, 130) == 1);
        tt[PKV_TERM_MERGE_MB] = 0.01; /* a split plan */
        CHECK(pkv_cost_candidate(tt, 132) == 1);
        tt[PKV_TERM_MERGE_MB] = 0, tt[PKV_TERM_RECT] = 0; /* the work queue */
        CHECK(pkv_cost_candidate(tt, 132) == 1);
        CHECK_OK(pkv_context_set_cost_model(ctx, &models[1]));
        pkv_plan_options a;
        pkv_plan_options_default(&a);
        a.parallelism = 132;
        for (int i = 0; i < 16; i++) lens[i] = 4096 + 7 * i;
        table_for(lens, 8, 16, indptr, &t);
        CHECK_OK(pkv_plan_step(ctx, &p, &t, &a, plan));
        CHECK_MSG(pkv_plan_route(plan) != PKV_ROUTE_SINGLE, "64 tasks on 132 units: auto picked single");
        table_for(lens, 16, 16, indptr, &t);
        CHECK_OK(pkv_plan_step(ctx, &p, &t, &a, plan));
        CHECK_MSG(pkv_plan_route(plan) == PKV_ROUTE_SINGLE, "128 tasks on 132 units, merges dominating: auto picked %s",
                  pkv_route_name(pkv_plan_route(plan)));
    }
    /* the planner's wave from the kernel's residency: a (fake) kernel holding 6 CTAs per unit gets
     * one wave of them for a ragged batch of 32-127 (row, KV head) pairs, 4 per unit (the device's
     * wave) below 32 pairs and for the bucketed baseline */
    {
        pkv_backend_caps six;
        memset(&six, 0, sizeof six);
        six.parallelism = 4;
        six.ctas_per_unit = 4;
        six.resident[1][0] = 6;
        pkv_plan_options a;
        pkv_plan_options_default(&a);
        a.parallelism = 132;
        a.route = PKV_ROUTE_WORKQUEUE;
        for (int i = 0; i < 8; i++) lens[i] = i % 2 ? 30000 : 2000; /* 8 rows x 8 KV heads: 64 pairs, ragged */
        table_for(lens, 8, 16, indptr, &t);
        CHECK_OK(pkv_plan_step_caps(&six, NULL, &p, &t, &a, plan));
        const int32_t wide = pkv_plan_num_tasks(plan);
        CHECK_MSG(wide > 132 * 4 && wide <= 132 * 6, "64 ragged pairs: %d tasks, expected (528, 792]", wide);
        a.route = PKV_ROUTE_BUCKETED;
        CHECK_OK(pkv_plan_step_caps(&six, NULL, &p, &t, &a, plan));
        const pkv_phase *ph = pkv_plan_phases(plan);
        for (int32_t k = 0; k < pkv_plan_num_phases(plan); k++)
            CHECK_MSG(ph[k].task_end - ph[k].task_begin <= 132 * 4 + 8 * 8, "bucket %d: %d tasks", k,
                      ph[k].task_end - ph[k].task_begin);
        a.route = PKV_ROUTE_WORKQUEUE;
        table_for(lens, 3, 16, indptr, &t); /* 24 pairs */
        CHECK_OK(pkv_plan_step_caps(&six, NULL, &p, &t, &a, plan));
        CHECK_MSG(pkv_plan_num_tasks(plan) <= 132 * 4, "24 ragged pairs: %d tasks", pkv_plan_num_tasks(plan));
    }
    /* pages gathered row by row (a backend's row_gather_below) under a kernel of 4 resident CTAs per unit (d = 64):
     * the wave counts all 4 where the planner's default is 2 - a single row at page 1, 2 or 4 (12: chunks of 4) is
     * split 4 x 132 / 8 = 66 ways; pages of 8 and 16, d = 128 (3 resident) and a forced ctas_per_unit keep the
     * default; a ragged batch of 128 pairs keeps its 4 waves of the resident tasks */
    {
        pkv_backend_caps gather;
        memset(&gather, 0, sizeof gather);
        gather.parallelism = 4;
        gather.ctas_per_unit = 2;
        gather.resident[0][0] = 4;
        gather.resident[1][0] = 3;
        pkv_problem p64 = p;
        p64.head_dim = 64;
        pkv_plan_options a;
        pkv_plan_options_default(&a);
        a.parallelism = 132;
        a.route = PKV_ROUTE_SPLIT;
        static const int32_t pages[] = {1, 2, 4, 12, 8, 16};
        for (int g = 0; g < 2; g++) {
            gather.row_gather_below = g ? 8 : 0;
            for (int k = 0; k < 6; k++) {
                lens[0] = 32768;
                table_for(lens, 1, pages[k], indptr, &t);
                p64.page_size = pages[k];
                CHECK_OK(pkv_plan_step_caps(&gather, NULL, &p64, &t, &a, plan));
                const int32_t want = g && pages[k] % 8 ? 528 : 264;
                CHECK_MSG(pkv_plan_num_tasks(plan) == want, "d 64, page %d, row_gather_below %d: %d tasks, expected %d",
                          pages[k], gather.row_gather_below, pkv_plan_num_tasks(plan), want);
                pkv_problem p128 = p64;
                p128.head_dim = 128;
                CHECK_OK(pkv_plan_step_caps(&gather, NULL, &p128, &t, &a, plan));
                CHECK_MSG(pkv_plan_num_tasks(plan) == 264, "d 128, page %d: %d tasks, expected 264", pages[k],
                          pkv_plan_num_tasks(plan));
            }
        }
        a.ctas_per_unit = 3;
        table_for(lens, 1, 1, indptr, &t);
        p64.page_size = 1;
        CHECK_OK(pkv_plan_step_caps(&gather, NULL, &p64, &t, &a, plan));
        CHECK_MSG(pkv_plan_num_tasks(plan) == 8 * (132 * 3 / 8), "forced 3 per unit: %d tasks", pkv_plan_num_tasks(plan));
        a.ctas_per_unit = 0;
        a.route = PKV_ROUTE_WORKQUEUE;
        for (int i = 0; i < 16; i++) lens[i] = i % 2 ? 30000 : 2000; /* 128 ragged pairs */
        table_for(lens, 16, 1, indptr, &t);
        int32_t ragged[2];
        for (int g = 0; g < 2; g++) {
            gather.row_gather_below = g ? 8 : 0;
            CHECK_OK(pkv_plan_step_caps(&gather, NULL, &p64, &t, &a, plan));
            ragged[g] = pkv_plan_num_tasks(plan);
        }
        CHECK_MSG(ragged[0] == ragged[1] && ragged[1] > 132 * 4, "128 ragged pairs: %d and %d tasks", ragged[0], ragged[1]);
    }
    /* auto's wave: with fewer (row, KV head) pairs than resident slots, >= 2 rows and a planner's
     * wave of one wave (ragged batches of >= 128 pairs get 4), the split, work-queue and fused
     * routes are also weighed at one wave of the resident tasks per unit; the pick's prediction is
     * at most every route's at the waves weighed (forced by ctas_per_unit), on ragged B <= 15 steps
     * the device defaults pick a wave other than the planner's in some step (else the search is
     * off), and a ragged B = 16 step (128 pairs) keeps the planner's 4 waves */
    /* a GPU as its backend describes it at d = 128: the planner's wave 2 per unit, the light kernel holds 3 */
    pkv_backend_caps gpu;
    memset(&gpu, 0, sizeof gpu);
    gpu.parallelism = 132;
    gpu.ctas_per_unit = 2;
    gpu.resident[1][0] = 3;
    {
        pkv_cost_model dev;
        pkv_cost_model_default(&dev, 132, 4600, 3);
        int other_wave = 0;
        for (int k = 0; k < 30; k++) {
            const int32_t B = 2 + (int32_t)pkv_rng_uniform_int(&r, 0, 14);
            for (int i = 0; i < B; i++)
                lens[i] = (int32_t)(i % 4 == 0 ? pkv_rng_uniform_int(&r, 16384, 65536) : pkv_rng_uniform_int(&r, 256, 8192));
            table_for(lens, B, 16, indptr, &t);
            pkv_plan_options a;
            pkv_plan_options_default(&a);
            a.parallelism = 132;
            CHECK_OK(pkv_plan_step_caps(&gpu, &dev, &p, &t, &a, plan));
            double tm[PKV_COST_TERMS];
            CHECK_OK(pkv_cost_terms(plan, tm));
            const double chosen = pkv_cost_predict(&dev, tm);
            const pkv_route picked = pkv_plan_route(plan);
            const int32_t picked_tasks = pkv_plan_num_tasks(plan);
            a.route = picked;
            CHECK_OK(pkv_plan_step_caps(&gpu, &dev, &p, &t, &a, plan));
            other_wave += pkv_plan_num_tasks(plan) != picked_tasks;
            if (B * p.num_kv_heads >= 128)
                CHECK_MSG(pkv_plan_num_tasks(plan) == picked_tasks, "B %d ragged: auto left the planner's 4 waves (%d "
                          "tasks, its route alone %d)", B, picked_tasks, pkv_plan_num_tasks(plan));
            for (int cpu = 0; cpu <= 3; cpu += 3) {
                if (cpu == 3 && B * p.num_kv_heads >= 128) continue; /* not weighed there */
                a.ctas_per_unit = cpu; /* 0: the planner's wave, 3: one wave of the resident slots */
                for (int route = PKV_ROUTE_SINGLE; route <= PKV_ROUTE_FUSED; route++) {
                    if (route == PKV_ROUTE_BUCKETED) continue;
                    a.route = (pkv_route)route;
                    CHECK_OK(pkv_plan_step_caps(&gpu, &dev, &p, &t, &a, plan));
                    CHECK_OK(pkv_cost_terms(plan, tm));
                    CHECK_MSG(chosen <= pkv_cost_predict(&dev, tm) * (1 + 1e-12), "B %d: auto (%s) predicted %.3f us, "
                              "%s at %d per unit %.3f us", B, pkv_route_name(picked), chosen,
                              pkv_route_name((pkv_route)route), cpu, pkv_cost_predict(&dev, tm));
                }
            }
        }
        CHECK_MSG(other_wave > 0, "auto never left the planner's wave on 30 ragged B <= 16 steps");
        {   /* 16 ragged rows, 128 pairs: the planner's 4 resident waves, never one, also under the
             * coefficients of a policy fitted on a GPU, which would take one resident wave on some of
             * these steps if it were weighed */
            pkv_cost_model fitted = dev;
            const double coef[PKV_COST_COEFS] = {7.19447622, 1.70602385, 37.4617022, 0,
                                                 0.225445815, 0.0415522585, 0.0438918171, 0};
            memcpy(fitted.coef, coef, sizeof coef);
            int one_wave = 0;
            for (int k = 0; k < 40; k++) {
                for (int i = 0; i < 16; i++)
                    lens[i] = (int32_t)(pkv_rng_uniform01(&r) < 0.3 ? pkv_rng_uniform_int(&r, 16384, 65536)
                                                                    : pkv_rng_uniform_int(&r, 512, 8192));
                lens[0] = 65536; /* ragged */
                table_for(lens, 16, 16, indptr, &t);
                pkv_plan_options a;
                pkv_plan_options_default(&a);
                a.parallelism = 132;
                CHECK_OK(pkv_plan_step_caps(&gpu, &fitted, &p, &t, &a, plan));
                one_wave += pkv_plan_num_tasks(plan) <= 132 * 3;
            }
            CHECK_MSG(one_wave == 0, "ragged B16: auto planned one resident wave on %d of 40 steps", one_wave);
        }
        /* a single row keeps the planner's wave (its route planned alone gives the same tasks) */
        for (int k = 0; k < 10; k++) {
            lens[0] = (int32_t)pkv_rng_uniform_int(&r, 4096, 131072);
            table_for(lens, 1, 16, indptr, &t);
            pkv_plan_options a;
            pkv_plan_options_default(&a);
            a.parallelism = 132;
            CHECK_OK(pkv_plan_step_caps(&gpu, &dev, &p, &t, &a, plan));
            const int32_t auto_tasks = pkv_plan_num_tasks(plan);
            a.route = pkv_plan_route(plan);
            CHECK_OK(pkv_plan_step_caps(&gpu, &dev, &p, &t, &a, plan));
            CHECK_MSG(pkv_plan_num_tasks(plan) == auto_tasks, "B1 of %d tokens: auto planned %d tasks, its route %d",
                      lens[0], auto_tasks, pkv_plan_num_tasks(plan));
        }
    }
    /* decision cost of auto with a model (reported, not asserted: timings are not tests): auto's
     * plan time minus the plan time of the route it chose, on the GPU above */
    for (int i = 0; i < 128; i++) lens[i] = (int32_t)pkv_rng_uniform_int(&r, 1, 32768);
    table_for(lens, 128, 16, indptr, &t);
    double with_model, fixed;
    pkv_route chosen = time_decision(&gpu, &models[2], &p, &t, plan, 3, &with_model, &fixed);
    printf("plan, B = 128 for 132 SMs: auto with the cost model %.2f us, the chosen route (%s) alone %.2f us: "
           "decision %.2f us\n", with_model, pkv_route_name(chosen), fixed, with_model - fixed);
    { /* B = 16 ragged: fewer pairs than slots, so the split routes are also weighed at 3 per SM */
        for (int i = 0; i < 16; i++) lens[i] = (int32_t)(i % 4 == 0 ? pkv_rng_uniform_int(&r, 16384, 65536) : pkv_rng_uniform_int(&r, 256, 8192));
        table_for(lens, 16, 16, indptr, &t);
        double m16, f16;
        const pkv_route c16 = time_decision(&gpu, &models[2], &p, &t, plan, 3, &m16, &f16);
        printf("plan, B = 16 ragged for 132 SMs (two waves weighed): auto with the cost model %.2f us, the chosen route (%s) "
               "alone %.2f us: decision %.2f us\n", m16, pkv_route_name(c16), f16, m16 - f16);
        for (int i = 0; i < 128; i++) lens[i] = (int32_t)pkv_rng_uniform_int(&r, 1, 32768);
        table_for(lens, 128, 16, indptr, &t);
    }
    double with_rule; /* the rule: one comparison after the O(B) pass */
    chosen = time_decision(&gpu, NULL, &p, &t, plan, 3, &with_rule, &fixed);
    printf("plan, B = 128 for 132 SMs: auto with the rule %.2f us, the chosen route (%s) alone %.2f us: decision %.2f us\n",
           with_rule, pkv_route_name(chosen), fixed, with_rule - fixed);
    pkv_context_free(ctx);
    pkv_plan_free(plan);
    return pkv_test_finish("test_cost");
}
