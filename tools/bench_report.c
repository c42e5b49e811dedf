/* bench_report.c - what `pkv bench` reports: the Markdown table (a row per step and route), the
 * per-route summary of a trace, the lines that name the run, the table behind a producer, the --explain
 * table (each route's predicted time next to its measured one), the policy fitted from the rows
 * (--calibrate-out) and the JSON of every metric. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"
#include "pkv_lab.h"

#include <math.h>
#include <string.h>
#include <time.h>

extern char **environ;

/* A row agrees with the reference when its relative error is at most this (the rounding of q's and o's dtype:
 * an fp8 cache's values widen exactly, and the reference reads the same codes at the same scale). */
#define REL_TOL_BF16 2e-2
#define REL_TOL_FP16 4e-3
/* The tasks per unit the backends plan for by default (src/cuda/cuda_backend.cu, src/cpu/cpu_backend.c). */
#define CUDA_DEFAULT_PER_UNIT 2
#define CPU_DEFAULT_PER_UNIT 4

/* ---- the Markdown tables ---------------------------------------------------------------------------- */
void print_row_header(void) {
    printf(
        "| step | B | KV MB | route | kernel us | wall us | launches | tasks | merge KB | GB/s | of ceiling | floor us "
        "| step eff | FlashInfer us | FI / ours | rel err | pages floor us |\n");
    printf("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
           "---: | ---: |\n");
}

void route_label(const row_result *r, char *buf, size_t n) {
    if (r->route_asked == PKV_ROUTE_AUTO)
        snprintf(buf, n, "auto:%s", pkv_route_name(r->route_used));
    else
        snprintf(buf, n, "%s", pkv_route_name(r->route_used));
}

void print_row(const row_result *r) {
    char rl[32], fi[32] = "-", ratio[32] = "-", ceil_s[32] = "-", floor_s[32] = "-", eff[32] = "-", gather[32] = "-";
    char err[32] = "-"; /* "-": not compared (--no-check) */
    route_label(r, rl, sizeof rl);
    if (!isnan(r->rel_err)) snprintf(err, sizeof err, "%.1e", r->rel_err);
    if (r->flashinfer_us > 0) {
        snprintf(fi, sizeof fi, "%.1f", r->flashinfer_us);
        snprintf(ratio, sizeof ratio, "%.2f", r->flashinfer_us / r->kernel_us);
    }
    if (!isnan(r->frac_ceiling)) snprintf(ceil_s, sizeof ceil_s, "%.2f", r->frac_ceiling);
    if (r->floor_us > 0) snprintf(floor_s, sizeof floor_s, "%.1f", r->floor_us);
    if (!isnan(r->step_eff)) snprintf(eff, sizeof eff, "%.2f", r->step_eff);
    if (r->gather_us > 0) snprintf(gather, sizeof gather, "%.1f", r->gather_us);
    printf("| %s | %d | %.1f | %s | %.1f | %.1f | %lld | %lld | %.1f | %.0f | %s | %s | %s | %s | %s | %s | %s |\n",
           r->step, r->batch, r->c.kv_bytes / 1e6, rl, r->kernel_us, r->wall_us, (long long)r->c.launches,
           (long long)r->c.tasks, r->c.merge_state_bytes / 1e3, r->gbps, ceil_s, floor_s, eff, fi, ratio, err, gather);
}

void print_summary(const bench_opts *o, const results *res) {
    printf("\n| route | steps | mean kernel us | mean wall us | tokens/s | launches/step | tasks/step | mean GB/s | "
           "mean of ceiling | mean step eff | worst rel err |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int k = 0; k < o->nroutes; k++) {
        double kt = 0, wt = 0, tok = 0, la = 0, ta = 0, gb = 0, fc = 0, se = 0, worst = 0;
        int n = 0, ne = 0;
        for (int i = 0; i < res->n; i++) {
            const row_result *r = &res->rows[i];
            if (r->route_asked != o->routes[k]) continue;
            n++;
            kt += r->kernel_us;
            wt += r->wall_us;
            tok += r->batch;
            la += (double)r->c.launches;
            ta += (double)r->c.tasks;
            gb += r->gbps;
            if (!isnan(r->frac_ceiling)) fc += r->frac_ceiling;
            if (!isnan(r->step_eff)) {
                se += r->step_eff;
                ne++;
            }
            if (!(r->rel_err <= worst)) worst = r->rel_err;
        }
        if (!n) continue;
        char fcs[16] = "-", ses[16] = "-", ws[16] = "-";
        if (o->cuda) snprintf(fcs, sizeof fcs, "%.2f", fc / n);
        if (ne) snprintf(ses, sizeof ses, "%.2f", se / ne);
        if (o->check) snprintf(ws, sizeof ws, "%.1e", worst);
        printf("| %s | %d | %.1f | %.1f | %.0f | %.2f | %.1f | %.1f | %s | %s | %s |\n", pkv_route_name(o->routes[k]),
               n, kt / n, wt / n, wt > 0 ? tok / (wt * 1e-6) : 0, la / n, ta / n, gb / n, fcs, ses, ws);
    }
}

void print_run_footer(const bench_opts *o, const ceilings *ce, const char *workload) {
    char kv[80] = "", scale[32];
    cli_format_float(scale, sizeof scale, o->kv_scale);
    if (cli_kv_is_fp8(&o->prob))
        snprintf(kv, sizeof kv, " q and o, %s KV cache (scale %s)", cli_dtype_name(o->prob.kv_dtype), scale);
    printf("\nbackend: %s; shape %s (Hq %d, Hkv %d, d %d, %s%s, %s, page %d%s", pkv_context_device_name(o->ctx),
           o->shape_name, o->prob.num_qo_heads, o->prob.num_kv_heads, o->prob.head_dim, cli_dtype_name(o->prob.dtype),
           kv, o->prob.layout == PKV_LAYOUT_HND ? "HND" : "NHD", o->prob.page_size,
           o->kv_interleaved ? ", K/V interleaved per page" : "");
    if (o->prob.window > 0) printf(", window %d", o->prob.window);
    if (o->prob.logits_soft_cap > 0.0f) printf(", soft cap %g", (double)o->prob.logits_soft_cap);
    printf("); workload: %s\n", workload);
    printf("planned for parallelism %d x %d tasks per unit%s\n",
           o->parallelism > 0 ? o->parallelism : pkv_context_parallelism(o->ctx),
           o->ctas_per_unit > 0 ? o->ctas_per_unit : (o->cuda ? CUDA_DEFAULT_PER_UNIT : CPU_DEFAULT_PER_UNIT),
           o->ctas_per_unit > 0 ? "" : " (4 resident waves for ragged batches of >= 128 pairs)");
    if (o->cuda)
        printf("read ceiling %.0f GB/s, empty launch %.2f us, graph replay %.2f us (measured in this run)\n",
               ce->read_gbps, ce->launch_us, ce->graph_us);
}

void print_behind_table(const bench_opts *o, const results *res) {
    if (!o->cuda || !o->behind) return;
    printf("\nBehind a kernel that writes q (PDL %s): CUDA events around the producer alone and around the "
           "producer and the step; step = the difference\n\n",
           o->pdl ? "on: the step's kernels are scheduled while the producer drains" : "off");
    printf("| step | route | kernel us | producer us | producer + step us | step us | triggering producer us | "
           "+ step us | step us |\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < res->n; i++) {
        const row_result *r = &res->rows[i];
        char rl[32];
        route_label(r, rl, sizeof rl);
        printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", r->step, rl, r->kernel_us,
               r->producer_us, r->pair_us, r->pair_us - r->producer_us, r->producer_trig_us, r->pair_trig_us,
               r->pair_trig_us - r->producer_trig_us);
    }
}

int report_disagreements(const bench_opts *o, const results *res) {
    int bad = 0;
    for (int i = 0; i < res->n; i++) {
        double tol = o->prob.dtype == PKV_DTYPE_BF16 ? REL_TOL_BF16 : REL_TOL_FP16;
        if (o->check && (!(res->rows[i].rel_err <= tol) || res->rows[i].nan_outputs > 0)) {
            bad++;
            fprintf(stderr, "%s: %s route %s: rel err %.2e, %d outputs unwritten\n", bench_prog, res->rows[i].step,
                    pkv_route_name(res->rows[i].route_asked), res->rows[i].rel_err, res->rows[i].nan_outputs);
        }
    }
    return bad;
}

/* ---- the cost model: fitted (--calibrate-out) and explained (--explain) ------------------------------- */
bool fit_policy(bench_opts *o, const results *res) {
    int n = 0;
    double *T = (double *)xmalloc((size_t)res->n * PKV_COST_TERMS * sizeof(double));
    double *y = (double *)xmalloc((size_t)res->n * sizeof(double));
    int32_t *step = (int32_t *)xmalloc((size_t)res->n * sizeof(int32_t));
    const char **keys = (const char **)xmalloc((size_t)res->n * 2 * sizeof(char *));
    int32_t nsteps = 0;
    for (int i = 0; i < res->n; i++) { /* the routes auto chooses among */
        if (res->rows[i].route_asked == PKV_ROUTE_AUTO || res->rows[i].route_asked == PKV_ROUTE_BUCKETED) continue;
        memcpy(T + (size_t)n * PKV_COST_TERMS, res->rows[i].terms, sizeof res->rows[i].terms);
        step[n] = cli_step_id(keys, &nsteps, res->rows[i].step, "");
        y[n++] = res->rows[i].kernel_us;
    }
    pkv_cost_model fit = o->model;
    snprintf(fit.device, sizeof fit.device, "%s", pkv_context_device_name(o->ctx));
    fit.parallelism = pkv_context_parallelism(o->ctx);
    pkv_dev_info info;
    fit.cuda_version = o->cuda && pkv_dev_get_info(o->ctx, &info) == PKV_OK ? info.runtime_version : 0;
    /* ranked by the route choice over this run's steps, as `pkv calibrate` fits */
    const bool ok = pkv_cost_model_fit_steps(n, T, y, step, &fit) == PKV_OK &&
                    pkv_cost_model_save(&fit, o->calibrate_out) == PKV_OK;
    if (!ok) {
        fprintf(stderr, "%s: calibration failed: %s\n", bench_prog, pkv_last_error());
    } else {
        printf("\ncalibrated on %d measurements (rms %.2f us) -> %s\n", n, fit.rms_us, o->calibrate_out);
        o->model = fit;
    }
    free(T);
    free(y);
    free(step);
    free(keys);
    return ok;
}

void print_explain(const bench_opts *o, results *res) {
    printf("\n| step | route | predicted us | measured us | error | launches | MB moved | longest task MB | "
           "merge MB | tasks | slots |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const int32_t par = o->parallelism > 0 ? o->parallelism : pkv_context_parallelism(o->ctx);
    int unweighed = 0;
    for (int i = 0; i < res->n; i++) {
        row_result *r = &res->rows[i];
        r->predicted_us = pkv_cost_predict(&o->model, r->terms);
        char rl[32];
        route_label(r, rl, sizeof rl);
        const bool weighed = pkv_cost_candidate(r->terms, par) != 0;
        unweighed += !weighed;
        printf("| %s | %s | %.1f%s | %.1f | %+.0f%% | %.0f | %.2f | %.3f | %.3f | %.0f | %.0f |\n", r->step, rl,
               r->predicted_us, weighed ? "" : " (not weighed)", r->kernel_us,
               100.0 * (r->predicted_us / r->kernel_us - 1.0),
               r->terms[PKV_TERM_LAUNCHES], r->terms[PKV_TERM_MB], r->terms[PKV_TERM_LONGEST_MB],
               r->terms[PKV_TERM_MERGE_MB], r->terms[PKV_TERM_TASKS], r->terms[PKV_TERM_SLOTS]);
    }
    if (unweighed)
        printf("(not weighed: a single-route plan filling fewer than half of the %d units, which auto does not "
               "consider; pkv_cost_candidate)\n", par);
    printf("model (%s): ", o->model.device);
    cli_print_model(stdout, &o->model);
    printf("\n");
}

/* ---- JSON -------------------------------------------------------------------------------------------- */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x) {
    if (isnan(x) || isinf(x))
        fputs("null", f);
    else
        fprintf(f, "%.6g", x);
}

/* ', "key": value' (null for NaN / inf) and ', "key": "text"' */
static void json_field_num(FILE *f, const char *key, double x) {
    fprintf(f, ", \"%s\": ", key);
    json_num(f, x);
}
static void json_field_str(FILE *f, const char *key, const char *text) {
    fprintf(f, ", \"%s\": ", key);
    json_str(f, text);
}

/* The commit measured: PKV_COMMIT, else git's short hash of HEAD, else "unknown". */
static void json_commit(char *commit, size_t cap) {
    snprintf(commit, cap, "unknown");
    const char *env = getenv("PKV_COMMIT");
    if (env && *env) {
        snprintf(commit, cap, "%s", env);
        return;
    }
    FILE *g = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r");
    if (!g) return;
    if (fgets(commit, (int)cap, g)) commit[strcspn(commit, "\n")] = 0;
    if (!commit[0]) snprintf(commit, cap, "unknown");
    pclose(g);
}

/* ', "env": {...}': the PKV_* settings of this run (kernel choices, A/B switches) besides PKV_COMMIT: the
 * command alone does not say which kernels ran. */
static void json_env(FILE *f) {
    fprintf(f, ", \"env\": {");
    int nenv = 0;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "PKV_", 4) != 0 || !eq || strncmp(*e, "PKV_COMMIT=", 11) == 0) continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - *e < 127 ? eq - *e : 127), *e);
        fprintf(f, "%s", nenv++ ? ", " : "");
        json_str(f, name);
        fprintf(f, ": ");
        json_str(f, eq + 1);
    }
    fprintf(f, "}");
}

/* "meta": the tool, commit, date, backend and device, the command and its environment, the workload,
 * what the plans were made for and the shape; then "ceilings". */
static void json_meta(FILE *f, const bench_opts *o, const ceilings *ce, const char *workload) {
    char commit[64], date[64] = "", kv_scale[32];
    cli_format_float(kv_scale, sizeof kv_scale, cli_kv_is_fp8(&o->prob) ? o->kv_scale : 1.0f);
    json_commit(commit, sizeof commit);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    fprintf(f, "{\n  \"meta\": {\"tool\": \"pkv bench\", \"commit\": ");
    json_str(f, commit);
    json_field_str(f, "date", date);
    json_field_str(f, "backend", o->cuda ? "cuda" : "cpu");
    json_field_str(f, "device", pkv_context_device_name(o->ctx));
    pkv_dev_info info;
    if (o->cuda && pkv_dev_get_info(o->ctx, &info) == PKV_OK)
        fprintf(f,
                ", \"gpu\": {\"name\": \"%s\", \"sms\": %d, \"cc\": \"%d.%d\", \"l2_bytes\": %lld, \"cuda_runtime\": "
                "%d, \"cuda_driver\": %d}",
                info.name, info.sms, info.cc_major, info.cc_minor, (long long)info.l2_bytes, info.runtime_version,
                info.driver_version);
    json_field_str(f, "command", o->cmdline);
    json_env(f);
    json_field_str(f, "workload", workload);
    /* what the plans were made for (pkv calibrate --replay-auto re-plans with it) */
    fprintf(f, ", \"parallelism\": %d, \"ctas_per_unit\": %d",
            o->parallelism > 0 ? o->parallelism : pkv_context_parallelism(o->ctx),
            o->ctas_per_unit > 0 ? o->ctas_per_unit : 0);
    fprintf(f,
            ",\n    \"shape\": {\"name\": \"%s\", \"num_qo_heads\": %d, \"num_kv_heads\": %d, \"head_dim\": %d, "
            "\"page_size\": %d, "
            "\"layout\": \"%s\", \"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"kv_scale\": %s, \"kv_interleaved\": %s, "
            "\"window\": %d, \"logits_soft_cap\": %g}, "
            "\"reps\": %d, \"wall_reps\": %d, \"terms_version\": 2},\n",
            o->shape_name, o->prob.num_qo_heads, o->prob.num_kv_heads, o->prob.head_dim, o->prob.page_size,
            o->prob.layout == PKV_LAYOUT_HND ? "HND" : "NHD", cli_dtype_name(o->prob.dtype),
            cli_dtype_name(cli_kv_dtype(&o->prob)), kv_scale,
            o->kv_interleaved ? "true" : "false", o->prob.window, (double)o->prob.logits_soft_cap, o->reps,
            o->wall_reps);
    fprintf(f, "  \"ceilings\": {\"read_gbps\": ");
    json_num(f, ce->read_gbps);
    json_field_num(f, "empty_launch_us", ce->launch_us);
    json_field_num(f, "graph_launch_us", ce->graph_us);
    fprintf(f, "},\n");
}

/* One row of "rows" (without its separator). */
static void json_row(FILE *f, const row_result *r) {
    fprintf(f,
            "    {\"step\": \"%s\", \"batch\": %d, \"total_tokens\": %lld, \"route\": \"%s\", \"route_used\": \"%s\"",
            r->step, r->batch, (long long)r->total_tokens, pkv_route_name(r->route_asked),
            pkv_route_name(r->route_used));
    if (r->decode_kernel) json_field_str(f, "decode_kernel", r->decode_kernel);
    json_field_num(f, "kernel_us", r->kernel_us);
    json_field_num(f, "kernel_p10_us", r->kernel_p10);
    json_field_num(f, "kernel_p90_us", r->kernel_p90);
    json_field_num(f, "wall_us", r->wall_us);
    json_field_num(f, "plan_us", r->plan_us);
    fprintf(f,
            ", \"kv_bytes\": %lld, \"qo_bytes\": %lld, \"merge_state_bytes\": %lld, \"launches\": %lld, \"tasks\": "
            "%lld, \"grid_ctas\": %lld, \"merges\": %lld",
            (long long)r->c.kv_bytes, (long long)r->c.qo_bytes, (long long)r->c.merge_state_bytes,
            (long long)r->c.launches, (long long)r->c.tasks, (long long)r->c.grid_ctas, (long long)r->c.merges);
    json_field_num(f, "achieved_gbps", r->gbps);
    json_field_num(f, "frac_read_ceiling", r->frac_ceiling);
    json_field_num(f, "floor_us", r->floor_us > 0 ? r->floor_us : NAN);
    json_field_num(f, "pages_floor_us", r->gather_us > 0 ? r->gather_us : NAN);
    if (!isnan(r->pair_us)) {
        json_field_num(f, "producer_us", r->producer_us);
        json_field_num(f, "producer_step_us", r->pair_us);
        json_field_num(f, "producer_trigger_us", r->producer_trig_us);
        json_field_num(f, "producer_trigger_step_us", r->pair_trig_us);
    }
    if (!isnan(r->graph_wall_us)) json_field_num(f, "graph_replay_wall_us", r->graph_wall_us);
    json_field_num(f, "step_efficiency", r->step_eff);
    json_field_num(f, "tokens_per_s", r->tokens_per_s);
    json_field_num(f, "rel_err", r->rel_err);
    json_field_num(f, "max_err", r->max_err);
    fprintf(f, ", \"unwritten_outputs\": %d", r->nan_outputs);
    json_field_num(f, "flashinfer_best_us", r->flashinfer_us > 0 ? r->flashinfer_us : NAN);
    json_field_str(f, "repro", r->repro);
    json_field_str(f, "args", r->trace);
    fprintf(f, ", \"terms\": [");
    for (int k = 0; k < PKV_COST_TERMS; k++) fprintf(f, "%s%.9g", k ? "," : "", r->terms[k]);
    fprintf(f, "], \"lens\": [");
    for (int32_t k = 0; k < r->batch && r->lens; k++) fprintf(f, "%s%d", k ? "," : "", r->lens[k]);
    fprintf(f, "]}");
}

void write_json(const char *path, const bench_opts *o, const ceilings *ce, const results *res, const char *workload) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "%s: cannot write %s\n", bench_prog, path);
        exit(1);
    }
    json_meta(f, o, ce, workload);
    fprintf(f, "  \"rows\": [\n");
    for (int i = 0; i < res->n; i++) {
        json_row(f, &res->rows[i]);
        fprintf(f, "%s\n", i + 1 < res->n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (ferror(f) | fclose(f)) { /* both: the file is closed either way */
        fprintf(stderr, "%s: writing %s failed\n", bench_prog, path);
        exit(1);
    }
}
