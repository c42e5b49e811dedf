/* calibrate.c - `pkv calibrate`: fits the cost model of the adaptive policy and writes a policy
 * file.  Live: runs the calibration traces (seed 20260622) on a backend with every candidate
 * route (through `pkv bench --calibration-set`).  Offline: --from-json refits from the rows of
 * `pkv bench` JSON files (anchor steps and trace steps are re-planned on the host to get their
 * terms), and --evaluate replays the model's choice on measured steps against the oracle (the
 * fastest measured route of each step). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct meas {
    char step[48];
    char workload[160];
    pkv_route route;
    double us;
    double terms[PKV_COST_TERMS];
} meas;

typedef struct meas_set {
    meas *m;
    int n, cap;
    int32_t parallelism;
} meas_set;

static void usage(void) {
    printf("usage: pkv calibrate [options]\n"
           "  --out FILE              policy file to write (default persistentkv.policy)\n"
           "live (measures on a backend):\n"
           "  --backend best|cpu|cuda --reps N        runs `pkv bench --calibration-set` and fits\n"
           "offline (from `pkv bench --json` files):\n"
           "  --from-json F1[,F2..]   fit from the measured rows of these files\n"
           "  --evaluate F1[,F2..]    replay the model's route choice on these measured steps\n"
           "  --policy FILE           evaluate this policy instead of fitting one\n"
           "  --parallelism N         SMs of the measuring GPU (default: from the JSON, else 132)\n");
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = (char *)malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* The string value after "key": at p (our own JSON, no escapes in these fields). */
static const char *json_str_after(const char *p, const char *key, char *out, size_t cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *q = strstr(p, pat);
    if (!q) return NULL;
    q += strlen(pat);
    size_t n = 0;
    while (q[n] && q[n] != '"' && n + 1 < cap) n++;
    memcpy(out, q, n);
    out[n] = 0;
    return q + n;
}

/* Lengths of a measured step: an anchor name, or stepK of the trace named by the workload. */
static int step_lens(const char *step, const char *workload, int32_t *lens, int32_t cap) {
    int a = cli_anchor_find(step);
    if (a >= 0) {
        pkv_anchor an;
        cli_anchor_get(a, &an);
        memcpy(lens, an.lens, (size_t)an.batch * sizeof(int32_t));
        return an.batch;
    }
    char fam[32];
    unsigned long long seed = 0;
    int b = 0, req = 0, k = -1;
    if (sscanf(step, "step%d", &k) != 1) return -1;
    if (sscanf(workload, "--trace %31s --seed %llu --batch %d --requests %d", fam, &seed, &b, &req) != 4) return -1;
    pkv_trace_family f;
    if (pkv_trace_family_parse(fam, &f) != PKV_OK) return -1;
    pkv_trace_config c;
    pkv_trace_config_default(&c, f);
    c.seed = seed;
    c.max_active = b;
    c.num_requests = req;
    pkv_trace *t = NULL;
    if (pkv_trace_generate(&c, &t) != PKV_OK) return -1;
    const int32_t *ids, *ls;
    int32_t B = k < pkv_trace_num_steps(t) ? pkv_trace_step(t, k, &ids, &ls) : -1;
    if (B > cap) B = -1;
    if (B > 0) memcpy(lens, ls, (size_t)B * sizeof(int32_t));
    pkv_trace_free(t);
    return B;
}

/* Rows of a pkv bench JSON (or several merged): step, route, kernel time; terms by re-planning. */
static int load_rows(const char *path, meas_set *set, int32_t parallelism_opt) {
    char *s = read_all(path);
    if (!s) {
        fprintf(stderr, "pkv calibrate: cannot read %s\n", path);
        return 0;
    }
    pkv_problem prob;
    pkv_problem_default(&prob);
    prob.num_pages = INT32_MAX;
    pkv_plan *plan = NULL;
    pkv_plan_create(&plan);
    int32_t par = parallelism_opt;
    const char *sm = strstr(s, "\"sms\": ");
    if (par <= 0 && sm) par = atoi(sm + 7);
    if (par <= 0) par = 132;
    set->parallelism = par;
    char workload[160] = "";
    const char *p = s;
    int added = 0;
    static int32_t lens[4096], indptr[4097];
    for (;;) {
        const char *w = strstr(p, "\"workload\": \"");
        const char *r = strstr(p, "\"step\": \"");
        if (!r) break;
        if (w && w < r) {
            json_str_after(w, "workload", workload, sizeof workload);
            p = w + 12;
            continue;
        }
        meas m;
        memset(&m, 0, sizeof m);
        const char *q = json_str_after(r, "step", m.step, sizeof m.step);
        char route[32];
        const char *q2 = json_str_after(q, "route", route, sizeof route);
        const char *ku = strstr(q, "\"kernel_us\": ");
        p = q;
        if (!q2 || !ku || pkv_route_parse(route, &m.route) != PKV_OK) continue;
        m.us = strtod(ku + 13, NULL);
        snprintf(m.workload, sizeof m.workload, "%s", workload);
        int B = step_lens(m.step, workload, lens, 4096);
        if (B < 0 || m.route == PKV_ROUTE_AUTO || m.route == PKV_ROUTE_BUCKETED || !(m.us > 0)) continue;
        indptr[0] = 0;
        for (int i = 0; i < B; i++) indptr[i + 1] = indptr[i] + (lens[i] + prob.page_size - 1) / prob.page_size;
        pkv_page_table t = {B, indptr, NULL, lens};
        pkv_plan_options o;
        pkv_plan_options_default(&o);
        o.route = m.route;
        o.parallelism = par;
        if (pkv_plan_step_host(&prob, &t, &o, plan) != PKV_OK) continue;
        pkv_cost_terms(plan, par, m.terms);
        if (set->n == set->cap) {
            set->cap = set->cap ? 2 * set->cap : 256;
            set->m = (meas *)realloc(set->m, (size_t)set->cap * sizeof *set->m);
        }
        set->m[set->n++] = m;
        added++;
    }
    pkv_plan_free(plan);
    free(s);
    return added;
}

static void load_list(const char *list, meas_set *set, int32_t par) {
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int n = load_rows(tok, set, par);
        fprintf(stderr, "pkv calibrate: %d measured rows from %s\n", n, tok);
    }
}

/* For each measured step: the route the model picks among the measured ones vs the fastest. */
static void evaluate(const pkv_cost_model *m, const meas_set *set) {
    double sum = 0, worst = 0;
    int steps = 0, hits = 0;
    char worst_step[220] = "";
    for (int i = 0; i < set->n; i++) {
        bool first = true;
        for (int j = 0; j < i; j++)
            if (!strcmp(set->m[j].step, set->m[i].step) && !strcmp(set->m[j].workload, set->m[i].workload)) first = false;
        if (!first) continue;
        double best = INFINITY, pick_pred = INFINITY, pick_us = 0;
        for (int j = i; j < set->n; j++) {
            const meas *x = &set->m[j];
            if (strcmp(x->step, set->m[i].step) || strcmp(x->workload, set->m[i].workload)) continue;
            if (x->us < best) best = x->us;
            double pr = pkv_cost_predict(m, x->terms);
            if (pr < pick_pred) {
                pick_pred = pr;
                pick_us = x->us;
            }
        }
        double reg = pick_us / best - 1.0;
        sum += reg;
        steps++;
        hits += reg <= 0.0;
        if (reg > worst) {
            worst = reg;
            snprintf(worst_step, sizeof worst_step, "%s (%s)", set->m[i].step, set->m[i].workload);
        }
    }
    printf("evaluation on %d measured steps: the model's route is the fastest on %d; mean regret %.2f%%, worst %.2f%% (%s)\n",
           steps, hits, steps ? 100.0 * sum / steps : 0.0, 100.0 * worst, worst_step);
}

int cmd_calibrate(int argc, char **argv) {
    static const char *const known[] = {"--out", "--backend", "--reps", "--from-json", "--evaluate", "--policy",
                                        "--parallelism", "--help!", NULL};
    if (cli_flag(argc, argv, "--help")) {
        usage();
        return 0;
    }
    if (!cli_check_options(argc, argv, known, "calibrate")) return 2;
    const char *out = cli_opt(argc, argv, "--out");
    const char *from = cli_opt(argc, argv, "--from-json");
    const char *eval = cli_opt(argc, argv, "--evaluate");
    const char *policy = cli_opt(argc, argv, "--policy");
    int32_t par = (int32_t)cli_opt_int(argc, argv, "--parallelism", 0);
    if (!from && !eval && !policy) { /* live */
        const char *be = cli_opt(argc, argv, "--backend");
        const char *reps = cli_opt(argc, argv, "--reps");
        char *args[16];
        int n = 0;
        args[n++] = (char *)"--calibration-set";
        args[n++] = (char *)"--calibrate-out";
        args[n++] = (char *)(out ? out : "persistentkv.policy");
        args[n++] = (char *)"--explain";
        args[n++] = (char *)"--quiet";
        if (be) args[n++] = (char *)"--backend", args[n++] = (char *)be;
        if (reps) args[n++] = (char *)"--reps", args[n++] = (char *)reps;
        return cmd_bench(n, args);
    }
    pkv_cost_model m;
    if (policy) {
        if (pkv_cost_model_load(policy, &m) != PKV_OK) {
            fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
            return 1;
        }
    }
    if (from) {
        meas_set set = {0};
        load_list(from, &set, par);
        double *T = (double *)malloc((size_t)(set.n ? set.n : 1) * PKV_COST_TERMS * sizeof(double));
        double *y = (double *)malloc((size_t)(set.n ? set.n : 1) * sizeof(double));
        for (int i = 0; i < set.n; i++) {
            memcpy(T + (size_t)i * PKV_COST_TERMS, set.m[i].terms, sizeof set.m[i].terms);
            y[i] = set.m[i].us;
        }
        pkv_cost_model_default(&m, set.parallelism, 0, 0);
        snprintf(m.device, sizeof m.device, "fit from %.100s", from);
        if (pkv_cost_model_fit(set.n, T, y, &m) != PKV_OK) {
            fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
            return 1;
        }
        printf("fit on %d measurements: rms %.2f us; const %.3g us, %.3g us/launch, %.3g us/MB, %.3g us/MB longest task, "
               "%.3g us/extra wave, %.3g us/MB merged\n",
               set.n, m.rms_us, m.coef[0], m.coef[1], m.coef[2], m.coef[3], m.coef[4], m.coef[5]);
        evaluate(&m, &set);
        free(T);
        free(y);
        free(set.m);
        const char *dst = out ? out : "persistentkv.policy";
        if (pkv_cost_model_save(&m, dst) != PKV_OK) {
            fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
            return 1;
        }
        printf("wrote %s\n", dst);
    }
    if (eval) {
        if (!from && !policy) {
            fprintf(stderr, "pkv calibrate: --evaluate needs --from-json or --policy\n");
            return 2;
        }
        meas_set set = {0};
        load_list(eval, &set, par);
        printf("held-out: ");
        evaluate(&m, &set);
        free(set.m);
    }
    return 0;
}
