/* test_threads.c - the threading contract of persistentkv.h ("Threads"): contexts, plans and
 * workspaces are independent objects, so threads that each use their own work at once; a plan, once
 * made, is only read by pkv_run, so several contexts may run the same plan at the same time (each
 * with its own workspace); the last error is per context and per thread.  Eight threads on the CPU
 * backend, each with its own context:
 *   - all run one shared plan into their own outputs, many times, against the float64 reference;
 *   - each plans and runs its own steps on its own route, against the reference, and validates each of
 *     its plans many times (pkv_plan_validate) while the others validate theirs;
 *   - each makes a plan fail with a page id of its own and, after every thread has done the same,
 *     still reads its own message from pkv_last_error() and pkv_last_error().
 * Meant for a ThreadSanitizer build too (-fsanitize=thread), where a data race fails the run. */
#define _POSIX_C_SOURCE 200809L /* pthread barriers under strict C11 */
#include "persistentkv.h"
#include "pkv_test.h"
#include "pkv_lab.h"

#include <pthread.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define NTHREADS 8
#define SHARED_RUNS 12

typedef struct shared_step {
    pkv_test_case tc;     /* problem, table, q, K, V and the reference */
    const pkv_plan *plan; /* planned once, read by every thread */
} shared_step;

typedef struct worker {
    int index;
    const shared_step *shared;
    pthread_barrier_t *barrier;
    /* results, checked by the main thread */
    int shared_runs_ok, own_runs_ok, own_runs, validations, validations_ok;
    double worst_rel;
    char error_seen[256], ctx_error_seen[256], error_wanted[64];
    pkv_status bad_status;
    int setup_failed;
} worker;

static double rel_l2_of(const pkv_test_case *tc, const uint16_t *o) {
    double num = 0.0, den = 0.0;
    for (int64_t e = 0; e < tc->q_elems; e++) {
        const double x = (double)pkv_half_to_float(o[e]);
        if (!isfinite(x)) return INFINITY;
        num += (x - tc->o_ref[e]) * (x - tc->o_ref[e]);
        den += tc->o_ref[e] * tc->o_ref[e];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void *work(void *arg) {
    worker *w = (worker *)arg;
    const shared_step *sh = w->shared;
    w->worst_rel = 0.0;
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 1 + w->index % 2; /* some contexts with a pool of their own */
    pkv_context *ctx = NULL;
    if (pkv_context_create(&cfg, &ctx) != PKV_OK) {
        w->setup_failed = 1;
        pthread_barrier_wait(w->barrier);
        pthread_barrier_wait(w->barrier);
        return NULL;
    }

    /* 1. the shared plan, into this thread's workspace and outputs */
    const size_t ws_bytes = pkv_plan_workspace_size(sh->plan);
    void *ws = malloc(ws_bytes + 1);
    uint16_t *o = (uint16_t *)malloc((size_t)sh->tc.q_elems * sizeof(uint16_t));
    for (int r = 0; r < SHARED_RUNS && ws && o; r++) {
        for (int64_t e = 0; e < sh->tc.q_elems; e++) o[e] = PKV_TEST_NAN_FP16;
        const pkv_tensors t = {.q = sh->tc.q,
                               .k_cache = sh->tc.k_cache,
                               .v_cache = sh->tc.v_cache,
                               .kv_page_indices = sh->tc.kv_page_indices,
                               .o = o};
        if (pkv_run(ctx, sh->plan, ws, ws_bytes, &t, NULL) != PKV_OK) continue;
        const double rel = rel_l2_of(&sh->tc, o);
        if (rel > w->worst_rel) w->worst_rel = rel;
        if (rel < PKV_TEST_TOL_O_FP16) w->shared_runs_ok++;
    }
    free(ws);
    free(o);

    /* 2. steps of its own: a random problem per step, this thread's route */
    pkv_rng rng;
    pkv_rng_seed(&rng, 1000u + (uint64_t)w->index);
    pkv_test_choices ch;
    pkv_test_choices_default(&ch);
    ch.max_batch = 5;
    ch.max_len = 900;
    pkv_plan *plan = NULL;
    if (pkv_plan_create(&plan) != PKV_OK) w->setup_failed = 1;
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.route = (pkv_route)(1 + w->index % (PKV_ROUTE_COUNT_ - 1)); /* single .. fused */
    opts.parallelism = 16;                                           /* splits even on one thread */
    for (int s = 0; s < 4 && plan; s++) {
        pkv_test_case tc;
        if (!pkv_test_case_random(&rng, &ch, &tc) || pkv_test_case_reference(&tc) != PKV_OK) {
            pkv_test_case_free(&tc);
            continue;
        }
        w->own_runs++;
        pkv_test_poison(&tc);
        if (pkv_plan_step(ctx, &tc.problem, &tc.table, &opts, plan) == PKV_OK) {
            for (int v = 0; v < 200; v++, w->validations++) {
                const char *why = NULL;
                if (pkv_test_validate(plan, tc.table.seq_lens, &why) == PKV_OK && why && why[0] == '\0')
                    w->validations_ok++;
            }
            const size_t bytes = pkv_plan_workspace_size(plan);
            void *wsp = malloc(bytes + 1);
            const pkv_tensors t = {.q = tc.q,
                                   .k_cache = tc.k_cache,
                                   .v_cache = tc.v_cache,
                                   .kv_page_indices = tc.kv_page_indices,
                                   .o = tc.o,
                                   .lse = tc.lse};
            const double tol = tc.problem.dtype == PKV_DTYPE_FP16 ? PKV_TEST_TOL_O_FP16 : PKV_TEST_TOL_O_BF16;
            if (wsp && pkv_run(ctx, plan, wsp, bytes, &t, NULL) == PKV_OK && pkv_test_unwritten(&tc) == 0 &&
                pkv_test_rel_l2(&tc) < tol && pkv_test_lse_err(&tc) < PKV_TEST_TOL_LSE)
                w->own_runs_ok++;
            free(wsp);
        }
        pkv_test_case_free(&tc);
    }

    /* 3. an error of its own, read back after every thread has made one */
    int32_t bad_pages[1] = {(int32_t)(sh->tc.problem.num_pages + 1000 * w->index + 7)};
    const int32_t indptr[2] = {0, 1}, lens[1] = {5};
    const pkv_page_table bad = {1, indptr, bad_pages, lens};
    snprintf(w->error_wanted, sizeof w->error_wanted, "= %d ", bad_pages[0]);
    w->bad_status = plan ? pkv_plan_step(ctx, &sh->tc.problem, &bad, NULL, plan) : PKV_ERR_NULL_POINTER;
    pthread_barrier_wait(w->barrier); /* every thread has failed its own plan */
    snprintf(w->error_seen, sizeof w->error_seen, "%s", pkv_last_error());
    snprintf(w->ctx_error_seen, sizeof w->ctx_error_seen, "%s", pkv_last_error());
    pthread_barrier_wait(w->barrier);
    pkv_plan_free(plan);
    pkv_context_free(ctx);
    return NULL;
}

int main(void) {
    shared_step sh;
    pkv_rng rng;
    pkv_rng_seed(&rng, 20261201);
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_qo_heads = 8;
    p.num_kv_heads = 2;
    p.head_dim = 64;
    const int32_t lens[5] = {700, 1, 0, 333, 129};
    CHECK(pkv_test_case_build(&rng, &p, 5, lens, 0.2, 1, &sh.tc));
    CHECK_OK(pkv_test_case_reference(&sh.tc));
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.route = PKV_ROUTE_WORKQUEUE;
    opts.parallelism = 16;
    CHECK_OK(pkv_plan_step_host(&sh.tc.problem, &sh.tc.table, &opts, plan));
    CHECK(pkv_plan_num_merges(plan) > 0); /* the shared plan splits and merges */
    sh.plan = plan;

    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, NTHREADS);
    worker w[NTHREADS];
    pthread_t th[NTHREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < NTHREADS; i++) {
        w[i].index = i;
        w[i].shared = &sh;
        w[i].barrier = &barrier;
        CHECK(pthread_create(&th[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&barrier);

    for (int i = 0; i < NTHREADS; i++) {
        CHECK_MSG(!w[i].setup_failed, "thread %d could not set up", i);
        CHECK_MSG(w[i].shared_runs_ok == SHARED_RUNS, "thread %d: %d of %d runs of the shared plan correct "
                  "(worst rel L2 %.3g)", i, w[i].shared_runs_ok, SHARED_RUNS, w[i].worst_rel);
        CHECK_MSG(w[i].own_runs > 0 && w[i].own_runs_ok == w[i].own_runs, "thread %d: %d of %d own steps correct",
                  i, w[i].own_runs_ok, w[i].own_runs);
        CHECK_MSG(w[i].validations > 0 && w[i].validations_ok == w[i].validations,
                  "thread %d: %d of %d validations of its own plans passed", i, w[i].validations_ok,
                  w[i].validations);
        CHECK_MSG(w[i].bad_status == PKV_ERR_PAGE_OUT_OF_RANGE, "thread %d: bad page id gave %s", i,
                  pkv_status_string(w[i].bad_status));
        CHECK_MSG(strstr(w[i].error_seen, w[i].error_wanted) != NULL,
                  "thread %d: pkv_last_error() = \"%s\", expected its own id \"%s\"", i, w[i].error_seen,
                  w[i].error_wanted);
        CHECK_MSG(strstr(w[i].ctx_error_seen, w[i].error_wanted) != NULL,
                  "thread %d: pkv_last_error() = \"%s\", expected \"%s\"", i, w[i].ctx_error_seen,
                  w[i].error_wanted);
    }
    pkv_plan_free(plan);
    pkv_test_case_free(&sh.tc);
    return pkv_test_finish("test_threads");
}
