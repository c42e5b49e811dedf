/* bench.c - `pkv bench`: replays a trace, the anchor steps or one isolated step on a backend and
 * route, and reports every metric of design.md section 5 that the backend can give: kernel time
 * (CUDA events, median of many runs, KV rotated over a pool larger than L2), synchronized wall
 * time of a whole step (plan + upload + launches + sync), launches, tasks, KV and merge-state
 * bytes, achieved bandwidth against the read ceiling measured in the same run, the floor of the
 * step (a streaming read of the same bytes, timed the same way) and the step efficiency, and the
 * error against the float64 reference on sampled rows.  Markdown table on stdout, JSON on request.
 *
 * This file is the driver: options (bench_options.c), steps (bench_workloads.c), ceilings, then per
 * step its buffers, reference and floors and per route a measured row (bench_measure.c), then the
 * reports (bench_report.c). */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <string.h>

/* The seed of a step's buffers: trace steps share one pool and its contents, isolated step i gets
 * BUFFER_SEED + i. */
#define BUFFER_SEED 0x5eed
/* The CPU backend's cost model for --explain when neither a policy nor the context gives one. */
#define CPU_MODEL_READ_GBPS 20.0

/* Measures every route of every step into res, printing a row per (step, route) unless a trace's
 * summary stands for them. */
static void measure_steps(const bench_opts *o, bench_workload *w, const ceilings *ce, buffers *b, pkv_plan *plan,
                          results *res) {
    const bool rows = !w->trace_mode || o->per_step;
    if (rows) print_row_header();
    int64_t max_pool = 0;
    for (int i = 0; i < w->nsteps; i++)
        if (w->steps[i].pool_pages > max_pool) max_pool = w->steps[i].pool_pages;
    for (int i = 0; i < w->nsteps; i++) {
        step_input *s = &w->steps[i];
        if (!o->quiet) fprintf(stderr, "[%d/%d] %s B=%d\n", i + 1, w->nsteps, s->name, s->batch);
        /* trace steps share one pool: allocate it once, at its largest */
        if (w->trace_mode) s->pool_pages = max_pool;
        buffers_for_step(o, b, s, BUFFER_SEED + (uint64_t)(w->trace_mode ? 0 : i));
        reference ref;
        memset(&ref, 0, sizeof ref);
        if (o->check) reference_compute(o, b, s, &ref);
        double floor_us, gather_us;
        bench_step_floors(o, b, s, ce, w->trace_mode, &floor_us, &gather_us);
        for (int k = 0; k < o->nroutes; k++) {
            row_result r;
            measure(o, b, s, o->routes[k], ce, &ref, floor_us, gather_us, k == 0, plan, &r);
            results_push(res, &r);
            if (rows) print_row(&r);
            fflush(stdout);
        }
        reference_free(&ref);
    }
}

/* The reports after the measurements; the exit status (1: calibration failed, or rows off the
 * reference). */
static int report(bench_opts *o, const bench_workload *w, const ceilings *ce, results *res) {
    if (w->trace_mode) print_summary(o, res);
    print_run_footer(o, ce, w->label);
    print_behind_table(o, res);
    const int bad = report_disagreements(o, res);
    if (o->calibrate_out && !fit_policy(o, res)) return 1;
    if (o->explain) print_explain(o, res);
    if (o->json) {
        write_json(o->json, o, ce, res, w->label);
        fprintf(stderr, "%s: wrote %s\n", bench_prog, o->json);
    }
    if (bad) {
        fprintf(stderr, "%s: %d rows disagree with the reference\n", bench_prog, bad);
        return 1;
    }
    return 0;
}

const char *bench_prog = "pkv bench";

int bench_run(const char *prog, int argc, char **argv) {
    bench_prog = prog;
    static bench_opts o; /* 16 KiB of --lens: not on the stack */
    char err[CLI_ERR_CAP];
    const cli_parse_status ps = bench_options_parse(argc, argv, &o, err, sizeof err);
    if (ps == CLI_PARSE_HELP) bench_usage(stdout);
    if (ps == CLI_PARSE_BAD) fprintf(stderr, "%s: %s\n", prog, err);
    if (ps != CLI_PARSE_GO_ON) return cli_parse_exit_code(ps);
    int st = bench_options_setup(&o);
    bench_workload w;
    memset(&w, 0, sizeof w);
    if (st == BENCH_GO_ON) st = bench_workload_make(&o, &w);
    if (st != BENCH_GO_ON) { /* the context is freed (a sanitizer build's leak check would turn the status into 1) */
        pkv_context_free(o.ctx);
        return st;
    }
    ceilings ce;
    bench_ceilings_measure(&o, &w, &ce);
    /* --explain shows the model auto uses: the policy file, else the context's (the CUDA backend's
     * defaults or PKV_POLICY), else defaults from this run's ceilings */
    if (!o.have_policy && !pkv_context_get_cost_model(o.ctx, &o.model))
        pkv_cost_model_default(&o.model, pkv_context_parallelism(o.ctx), o.cuda ? ce.read_gbps : CPU_MODEL_READ_GBPS,
                               o.cuda ? ce.launch_us : 0.0);
    buffers b;
    memset(&b, 0, sizeof b);
    pkv_plan *plan = NULL;
    TRY(NULL, pkv_plan_create(&plan), "plan create");
    results res;
    memset(&res, 0, sizeof res);
    measure_steps(&o, &w, &ce, &b, plan, &res);
    st = report(&o, &w, &ce, &res);
    bench_workload_free(&w);
    free(res.rows);
    buffers_free(&o, &b);
    bench_ceilings_free(&o, &ce);
    pkv_plan_free(plan);
    pkv_context_free(o.ctx);
    return st;
}

int cmd_bench(int argc, char **argv) { return bench_run("pkv bench", argc, argv); }
