/* calibrate.c - `pkv calibrate`: fits the cost model of the adaptive policy and writes a policy
 * file.  Live: runs the calibration traces (seed 20260622) on a backend with every candidate
 * route (through `pkv bench --calibration-set`).  Offline: --from-json refits from the rows of
 * `pkv bench` JSON files (anchor steps and trace steps are re-planned on the host to get their
 * terms), and --evaluate replays the model's choice on measured steps against the oracle (the
 * fastest measured route of each step). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "internal.h" /* pkv_cost_fill_terms, pkv_dtype_size: rebuilding the terms of older JSON */

#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

typedef struct meas {
    char step[48];
    char workload[160];
    char row[160]; /* the workload row: the step's arguments without seed and step (or the anchor) */
    pkv_route route;
    pkv_route used;           /* the route that ran (auto: the one it picked) */
    int64_t tasks, grid_ctas; /* of the plan that ran (0: not in the JSON) */
    double us;
    double terms[PKV_COST_TERMS];
    pkv_problem problem;      /* the step, for re-planning auto (--replay-auto) */
    int32_t batch;
    int32_t *lens;            /* owned by the set */
} meas;

typedef struct meas_set {
    meas *m;
    int n, cap;
    int32_t parallelism;
    int32_t ctas_per_unit; /* the tasks per unit the bench run forced (0: the backend's default) */
    char gpu[128];        /* the GPU of the first file that names one */
    int32_t cuda_version; /* its CUDA runtime */
} meas_set;

static void usage(void) {
    printf("usage: pkv calibrate [options]\n"
           "  --out FILE              policy file to write (default persistentkv.policy)\n"
           "live (measures on a backend):\n"
           "  --backend best|cpu|cuda --reps N        runs `pkv bench --calibration-set` and fits\n"
           "  --json FILE             also keep the measurements (for --from-json / --evaluate)\n"
           "offline (from `pkv bench --json` files):\n"
           "  --from-json F1[,F2..]   fit from the measured rows of these files\n"
           "  --evaluate F1[,F2..]    replay the model's route choice on these measured steps\n"
           "  --policy FILE           evaluate this policy instead of fitting one\n"
           "  --replay-auto           also re-plan each evaluated step with auto (route and wave) as the\n"
           "                          measuring GPU would and look its plan up among the measured ones\n"
           "  --parallelism N         SMs of the measuring GPU (default: from the JSON, else 132)\n");
}

static char *read_all(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return NULL; /* a directory's ftell is no size */
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
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

/* The integer after "key": in the text from p (0 when absent). */
static long json_int_after(const char *p, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *q = strstr(p, pat);
    return q ? strtol(q + strlen(pat), NULL, 10) : 0;
}

/* "--trace bimodal --seed 20260623 --batch 8 --requests 24 --step 3" -> "--trace bimodal --batch 8
 * --requests 24": the row of the matrix a step belongs to (its seeds and steps pooled). */
static void row_key(const char *args, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    char buf[192];
    snprintf(buf, sizeof buf, "%s", args);
    bool skip = false;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (skip) {
            skip = false;
            continue;
        }
        if (!strcmp(tok, "--seed") || !strcmp(tok, "--step")) {
            skip = true;
            continue;
        }
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? " " : "", tok);
        if (n >= cap) break;
    }
}

/* Rows of a pkv bench JSON (or several merged): step, route, kernel time; terms by re-planning the
 * step's lengths (the row's "lens", else the anchor or the trace step it names) for the JSON's shape. */
static int load_rows(const char *path, meas_set *set, int32_t parallelism_opt) {
    char *s = read_all(path);
    if (!s) {
        fprintf(stderr, "pkv calibrate: cannot read %s\n", path);
        return 0;
    }
    pkv_problem prob;
    pkv_problem_default(&prob);
    const char *shape = strstr(s, "\"shape\": {");
    char shape_name[32] = "paper";
    if (shape) json_str_after(shape, "name", shape_name, sizeof shape_name);
    if (shape) {
        const char *end = strchr(shape, '}');
        long hq = json_int_after(shape, "num_qo_heads"), hkv = json_int_after(shape, "num_kv_heads");
        long d = json_int_after(shape, "head_dim"), ps = json_int_after(shape, "page_size");
        if (end && hq > 0 && hkv > 0 && d > 0 && ps > 0) {
            prob.num_qo_heads = (int32_t)hq;
            prob.num_kv_heads = (int32_t)hkv;
            prob.head_dim = (int32_t)d;
            prob.page_size = (int32_t)ps;
            const char *dt = strstr(shape, "\"dtype\": \"bf16\"");
            prob.dtype = dt && dt < end ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
        }
    }
    prob.num_pages = INT32_MAX;
    pkv_plan *plan = NULL;
    if (pkv_plan_create(&plan) != PKV_OK) {
        fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
        free(s);
        return 0;
    }
    int32_t par = parallelism_opt;
    const char *pl = strstr(s, "\"parallelism\": "), *sm = strstr(s, "\"sms\": ");
    if (par <= 0 && pl) par = atoi(pl + 15); /* what the plans were made for (bench JSON since 6e27cff) */
    if (par <= 0 && sm) par = atoi(sm + 7);
    if (par <= 0) par = 132;
    set->parallelism = par;
    const char *cu = strstr(s, "\"ctas_per_unit\": ");
    if (cu) set->ctas_per_unit = atoi(cu + 17);
    const char *gpu = strstr(s, "\"gpu\": {");
    if (gpu && !set->gpu[0]) {
        json_str_after(gpu, "name", set->gpu, sizeof set->gpu);
        set->cuda_version = (int32_t)json_int_after(gpu, "cuda_runtime");
    }
    /* JSON from before the roofline model (no "terms_version": 2) carries the six terms of the
     * linear model; the rest is rebuilt from the row (tasks, lengths) and the shape, with the
     * residency of the H200 kernels then (3 CTAs per SM for G <= 8 and d <= 128, else 2) */
    const bool terms_v2 = strstr(s, "\"terms_version\": 2") != NULL;
    const int32_t G = prob.num_qo_heads / prob.num_kv_heads;
    const int64_t v1_slots = (int64_t)par * (G <= 8 && prob.head_dim <= 128 ? 3 : 2);
    const double token_mb = (double)prob.head_dim * (double)pkv_dtype_size(prob.dtype) * 2.0 / 1e6;
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
        const char *row_end = strchr(q, '\n');
        p = q;
        if (!q2 || !ku || pkv_route_parse(route, &m.route) != PKV_OK) continue;
        m.us = strtod(ku + 13, NULL);
        char used[32];
        const char *ru = strstr(q, "\"route_used\": \"");
        m.used = m.route;
        if (ru && (!row_end || ru < row_end) && json_str_after(ru, "route_used", used, sizeof used))
            pkv_route_parse(used, &m.used);
        const char *tk = strstr(q, "\"tasks\": "), *gc = strstr(q, "\"grid_ctas\": ");
        if (tk && (!row_end || tk < row_end)) m.tasks = strtoll(tk + 9, NULL, 10);
        if (gc && (!row_end || gc < row_end)) m.grid_ctas = strtoll(gc + 13, NULL, 10);
        snprintf(m.workload, sizeof m.workload, "%s", workload);
        char args[192] = "";
        const char *ar = strstr(q, "\"args\": \"");
        if (ar && (!row_end || ar < row_end)) json_str_after(ar, "args", args, sizeof args);
        int B = -1;
        const char *ls = strstr(q, "\"lens\": [");
        if (ls && (!row_end || ls < row_end)) {
            B = 0;
            for (const char *x = ls + 9; *x && *x != ']' && B < 4096;) {
                char *end;
                lens[B++] = (int32_t)strtol(x, &end, 10);
                x = *end == ',' ? end + 1 : end;
                if (end == x && *x != ']') break;
            }
        } else {
            B = step_lens(m.step, workload, lens, 4096);
        }
        if (args[0]) {
            /* several seeds of one row share the step names: the arguments keep them apart */
            char key[160];
            row_key(args, key, sizeof key);
            snprintf(m.workload, sizeof m.workload, "%s %s", shape_name, args);
            snprintf(m.row, sizeof m.row, "%s %s", shape_name, key);
        } else {
            snprintf(m.row, sizeof m.row, "%s", workload);
        }
        if (B < 0 || !(m.us > 0)) continue;
        const char *tm = strstr(q, "\"terms\": [");
        if (tm && (!row_end || tm < row_end)) { /* the terms of the plan that ran */
            const char *x = tm + 10;
            double v[PKV_COST_TERMS] = {0};
            for (int k = 0; k < (terms_v2 ? PKV_COST_TERMS : 6); k++) {
                char *end;
                v[k] = strtod(x, &end);
                x = *end == ',' ? end + 1 : end;
            }
            if (terms_v2) {
                memcpy(m.terms, v, sizeof v);
            } else { /* v1: const, launches, MB, longest task MB, extra waves, largest merge MB */
                int64_t tokens = 0;
                for (int i = 0; i < B; i++) tokens += lens[i];
                const long tasks = json_int_after(q, "tasks");
                pkv_cost_fill_terms(m.terms, (int64_t)v[1], v[2], v[3], v[5], tasks, v1_slots,
                                      (double)tokens * prob.num_kv_heads * token_mb, token_mb,
                                      m.route == PKV_ROUTE_SINGLE || m.route == PKV_ROUTE_SPLIT,
                                      m.route == PKV_ROUTE_FUSED);
            }
        } else if (m.route != PKV_ROUTE_AUTO) {
            indptr[0] = 0;
            for (int i = 0; i < B; i++) indptr[i + 1] = indptr[i] + (lens[i] + prob.page_size - 1) / prob.page_size;
            pkv_page_table t = {B, indptr, NULL, lens};
            pkv_plan_options o;
            pkv_plan_options_default(&o);
            o.route = m.route;
            o.parallelism = par;
            if (pkv_plan_step_host(&prob, &t, &o, plan) != PKV_OK) continue;
            pkv_cost_terms(plan, m.terms);
        }
        m.problem = prob;
        m.batch = B;
        m.lens = (int32_t *)malloc((size_t)(B > 0 ? B : 1) * sizeof(int32_t));
        if (!m.lens) continue;
        if (B > 0) memcpy(m.lens, lens, (size_t)B * sizeof(int32_t));
        if (set->n == set->cap) {
            meas *grown = (meas *)realloc(set->m, (size_t)(set->cap ? 2 * set->cap : 256) * sizeof *set->m);
            if (!grown) {
                free(m.lens);
                break;
            }
            set->m = grown;
            set->cap = set->cap ? 2 * set->cap : 256;
        }
        set->m[set->n++] = m;
        added++;
    }
    pkv_plan_free(plan);
    free(s);
    return added;
}

static void load_list(const char *list, meas_set *set, int32_t par) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int n = load_rows(tok, set, par);
        fprintf(stderr, "pkv calibrate: %d measured rows from %s\n", n, tok);
    }
}

static void set_free(meas_set *set) {
    for (int i = 0; i < set->n; i++) free(set->m[i].lens);
    free(set->m);
    set->m = NULL;
    set->n = set->cap = 0;
}

/* A route the model chooses among (as pkv_plan_step's auto does). */
static bool candidate(pkv_route r) {
    return r == PKV_ROUTE_SINGLE || r == PKV_ROUTE_SPLIT || r == PKV_ROUTE_WORKQUEUE || r == PKV_ROUTE_FUSED;
}

typedef struct row_stat {
    char row[160];
    int steps, model_best;
    double model_reg, auto_reg, worst;
    int auto_steps;
    char worst_step[48];
    double replay_reg; /* --replay-auto: over the steps whose re-planned plan was measured */
    int replay_steps, replay_missing;
} row_stat;

/* `auto` as the measuring GPU planned it, for --replay-auto: a host context with the set's SMs, the
 * backend's default wave (CUDA: 2 tasks per SM; CPU: the CPU backend's), the residency that the measured rows' slots term
 * shows (SMs x the CTAs per SM of the kernel that runs the shape; `light`: that of d = 128, G <= 8)
 * and the model.  Its plan for the step at row i is looked up among the step's measured plans (a
 * fixed route's with the same route, tasks and grid, else the measured auto's when it ran that
 * plan): the measured time, 0 when no measured plan matches, -1 when planning failed; *as_auto: 1
 * when the measured auto ran that same plan. */
static double replay_auto(pkv_context *ctx, pkv_plan *plan, const meas_set *set, int i, int32_t light, int *as_auto) {
    *as_auto = 0;
    const meas *m0 = &set->m[i];
    double slots = 0;
    for (int j = i; j < set->n; j++)
        if (!strcmp(set->m[j].step, m0->step) && !strcmp(set->m[j].workload, m0->workload) &&
            set->m[j].terms[PKV_TERM_SLOTS] > 0) {
            slots = set->m[j].terms[PKV_TERM_SLOTS];
            break;
        }
    const pkv_problem *p = &m0->problem;
    const int di = p->head_dim == 64 ? 0 : p->head_dim == 128 ? 1 : 2, g16 = p->num_qo_heads > 8 * p->num_kv_heads;
    memset(ctx->resident, 0, sizeof ctx->resident);
    ctx->resident[1][0] = light;
    if (slots > 0) ctx->resident[di][g16] = (int32_t)(slots / set->parallelism + 0.5);
    static int32_t indptr[4097];
    if (m0->batch > 4096) return -1;
    indptr[0] = 0;
    for (int b = 0; b < m0->batch; b++) indptr[b + 1] = indptr[b] + (m0->lens[b] + p->page_size - 1) / p->page_size;
    pkv_page_table t = {m0->batch, indptr, NULL, m0->lens};
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.route = PKV_ROUTE_AUTO;
    o.ctas_per_unit = set->ctas_per_unit; /* forced in the bench run, else 0 */
    if (pkv_plan_step(ctx, p, &t, &o, plan) != PKV_OK) return -1;
    const pkv_route r = plan->route;
    const int64_t tasks = plan->counters.tasks, grid = plan->counters.grid_ctas;
    double fixed = 0, own = 0;
    for (int j = i; j < set->n; j++) {
        const meas *x = &set->m[j];
        if (strcmp(x->step, m0->step) || strcmp(x->workload, m0->workload)) continue;
        if (x->used != r || x->tasks != tasks || x->grid_ctas != grid) continue;
        if (x->route == PKV_ROUTE_AUTO)
            own = x->us, *as_auto = 1;
        else if (fixed == 0)
            fixed = x->us;
    }
    return fixed > 0 ? fixed : own;
}

/* For each measured step: the oracle (the fastest measured fixed route, bucketed included), the
 * route the model picks among its candidates, and the measured `auto` row when there is one; the
 * regrets pooled per workload row (seeds and steps of one trace family and B together). */
static void evaluate(const pkv_cost_model *m, const meas_set *set, const char *label, bool replay) {
    double sum = 0, worst = 0, asum = 0;
    int steps = 0, hits = 0, asteps = 0;
    /* --replay-auto: the host context that plans as the measuring GPU did */
    pkv_context *ctx = NULL;
    pkv_plan *rplan = NULL;
    int32_t light = 2;
    double rsum = 0, rasum = 0;
    int rsteps = 0, rmissing = 0, rdiffer = 0;
    if (replay) {
        pkv_context_config cfg;
        pkv_context_config_default(&cfg);
        cfg.backend = PKV_BACKEND_CPU;
        cfg.num_threads = 1;
        if (pkv_context_create(&cfg, &ctx) != PKV_OK || pkv_plan_create(&rplan) != PKV_OK) {
            fprintf(stderr, "pkv calibrate: --replay-auto: %s\n", pkv_last_error());
            pkv_context_free(ctx);
            ctx = NULL;
        } else {
            ctx->parallelism = set->parallelism;
            if (set->cuda_version > 0) ctx->ctas_per_unit = 2; /* the CUDA backend's wave (H200: 2 per SM) */
            ctx->has_cost_model = true;
            ctx->cost_model = *m;
            for (int i = 0; i < set->n; i++) {
                const pkv_problem *p = &set->m[i].problem;
                if (p->head_dim == 128 && p->num_qo_heads <= 8 * p->num_kv_heads && set->m[i].terms[PKV_TERM_SLOTS] > 0) {
                    light = (int32_t)(set->m[i].terms[PKV_TERM_SLOTS] / set->parallelism + 0.5);
                    break;
                }
            }
        }
    }
    char worst_step[220] = "";
    row_stat *rows = (row_stat *)calloc((size_t)(set->n ? set->n : 1), sizeof *rows);
    int nrows = 0;
    for (int i = 0; i < set->n; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++)
            if (!strcmp(set->m[j].step, set->m[i].step) && !strcmp(set->m[j].workload, set->m[i].workload)) first = false;
        if (!first) continue;
        double best = INFINITY, pick_pred = INFINITY, pick_us = 0, auto_us = 0;
        for (int j = i; j < set->n; j++) {
            const meas *x = &set->m[j];
            if (strcmp(x->step, set->m[i].step) || strcmp(x->workload, set->m[i].workload)) continue;
            if (x->route == PKV_ROUTE_AUTO) {
                auto_us = x->us;
                continue;
            }
            if (x->us < best) best = x->us;
            if (!candidate(x->route) || !pkv_cost_candidate(x->terms, set->parallelism)) continue;
            double pr = pkv_cost_predict(m, x->terms);
            if (pr < pick_pred) {
                pick_pred = pr;
                pick_us = x->us;
            }
        }
        if (!(best < INFINITY) || pick_us <= 0) continue;
        double reg = pick_us / best - 1.0;
        sum += reg;
        steps++;
        hits += reg <= 0.0;
        if (reg > worst) {
            worst = reg;
            snprintf(worst_step, sizeof worst_step, "%s (%s)", set->m[i].step, set->m[i].workload);
        }
        int k = 0;
        while (k < nrows && strcmp(rows[k].row, set->m[i].row)) k++;
        if (k == nrows) snprintf(rows[nrows++].row, sizeof rows[0].row, "%s", set->m[i].row);
        row_stat *rs = &rows[k];
        rs->steps++;
        rs->model_best += reg <= 0.0;
        rs->model_reg += reg;
        if (reg >= rs->worst) {
            rs->worst = reg;
            snprintf(rs->worst_step, sizeof rs->worst_step, "%s", set->m[i].step);
        }
        if (auto_us > 0) {
            rs->auto_reg += auto_us / best - 1.0;
            rs->auto_steps++;
            asum += auto_us / best - 1.0;
            asteps++;
        }
        if (ctx) {
            int as_auto = 0;
            const double rus = replay_auto(ctx, rplan, set, i, light, &as_auto);
            if (rus > 0) {
                rsum += rus / best - 1.0;
                rsteps++;
                rs->replay_reg += rus / best - 1.0;
                rs->replay_steps++;
                if (auto_us > 0) {
                    rasum += auto_us / best - 1.0;
                    rdiffer += !as_auto;
                }
            } else {
                rmissing++;
                rs->replay_missing++;
            }
        }
    }
    printf("\n| workload row | steps | model picks the fastest | model mean regret | model worst step | measured auto mean regret |%s\n",
           ctx ? " re-planned auto mean regret (steps whose plan was measured) |" : "");
    printf("| --- | ---: | ---: | ---: | --- | ---: |%s\n", ctx ? " ---: |" : "");
    int over = 0;
    for (int k = 0; k < nrows; k++) {
        const row_stat *rs = &rows[k];
        double mr = rs->model_reg / rs->steps;
        over += mr > 0.03;
        printf("| %s | %d | %d | %.2f%% | %s %.1f%% | ", rs->row, rs->steps, rs->model_best, 100.0 * mr, rs->worst_step,
               100.0 * rs->worst);
        if (rs->auto_steps)
            printf("%.2f%% |", 100.0 * rs->auto_reg / rs->auto_steps);
        else
            printf("- |");
        if (ctx && rs->replay_steps)
            printf(" %.2f%% (%d of %d) |", 100.0 * rs->replay_reg / rs->replay_steps, rs->replay_steps,
                   rs->replay_steps + rs->replay_missing);
        else if (ctx)
            printf(" - (0 of %d) |", rs->replay_missing);
        printf("\n");
    }
    printf("\n%sevaluation on %d measured steps in %d workload rows: the model's route is the fastest on %d; mean regret "
           "%.2f%%, worst %.2f%% (%s); rows with a mean regret over 3%%: %d",
           label, steps, nrows, hits, steps ? 100.0 * sum / steps : 0.0, 100.0 * worst, worst_step, over);
    if (asteps) printf("; measured auto: mean regret %.2f%% over %d steps", 100.0 * asum / asteps, asteps);
    printf("\n");
    if (ctx) {
        printf("%sauto re-planned with this model (route and wave): its plan was measured on %d of %d steps; mean "
               "regret %.2f%% over them",
               label, rsteps, rsteps + rmissing, rsteps ? 100.0 * rsum / rsteps : 0.0);
        if (rsteps)
            printf(" (the measured auto on the same steps: %.2f%%; a plan other than the measured auto's on %d)",
                   100.0 * rasum / rsteps, rdiffer);
        printf("\n");
    }
    pkv_plan_free(rplan);
    pkv_context_free(ctx);
    free(rows);
}

int cmd_calibrate(int argc, char **argv) {
    static const char *const known[] = {"--out", "--backend", "--reps", "--from-json", "--evaluate", "--policy",
                                        "--parallelism", "--json", "--replay-auto!", "--help!", NULL};
    if (cli_flag(argc, argv, "--help")) {
        usage();
        return 0;
    }
    if (!cli_check_options(argc, argv, known, "calibrate")) return 2;
    const char *out = cli_opt(argc, argv, "--out");
    const char *from = cli_opt(argc, argv, "--from-json");
    const char *eval = cli_opt(argc, argv, "--evaluate");
    const bool replay = cli_flag(argc, argv, "--replay-auto");
    const char *policy = cli_opt(argc, argv, "--policy");
    int32_t par = cli_opt_range(argc, argv, "--parallelism", 0, 0, PKV_MAX_PARALLELISM);
    if (!from && !eval && !policy) { /* live */
        const char *be = cli_opt(argc, argv, "--backend");
        const char *reps = cli_opt(argc, argv, "--reps");
        const char *json = cli_opt(argc, argv, "--json");
        char *args[16];
        int n = 0;
        args[n++] = (char *)"--calibration-set";
        args[n++] = (char *)"--calibrate-out";
        args[n++] = (char *)(out ? out : "persistentkv.policy");
        args[n++] = (char *)"--explain";
        args[n++] = (char *)"--quiet";
        if (be) args[n++] = (char *)"--backend", args[n++] = (char *)be;
        if (reps) args[n++] = (char *)"--reps", args[n++] = (char *)reps;
        if (json) args[n++] = (char *)"--json", args[n++] = (char *)json;
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
        int32_t *step = (int32_t *)malloc((size_t)(set.n ? set.n : 1) * sizeof(int32_t));
        const char **keys = (const char **)malloc((size_t)(set.n ? set.n : 1) * 2 * sizeof(char *));
        if (!T || !y || !step || !keys) {
            fprintf(stderr, "pkv calibrate: out of memory for %d measurements\n", set.n);
            free(T);
            free(y);
            free(step);
            free(keys);
            set_free(&set);
            return 1;
        }
        int nfit = 0;
        int32_t nsteps = 0;
        for (int i = 0; i < set.n; i++) {
            if (!candidate(set.m[i].route)) continue; /* the fit is over the routes the model chooses among */
            memcpy(T + (size_t)nfit * PKV_COST_TERMS, set.m[i].terms, sizeof set.m[i].terms);
            y[nfit] = set.m[i].us;
            step[nfit++] = cli_step_id(keys, &nsteps, set.m[i].step, set.m[i].workload);
        }
        pkv_cost_model_default(&m, set.parallelism, 0, 0);
        if (set.gpu[0])
            snprintf(m.device, sizeof m.device, "%.48s (%d SMs), fit from %.40s", set.gpu, (int)(set.parallelism % 100000), from);
        else
            snprintf(m.device, sizeof m.device, "fit from %.100s", from);
        m.cuda_version = set.cuda_version;
        /* ranked by the route choice over the measured steps (pkv_cost_model_fit_steps) */
        const pkv_status fit_st = pkv_cost_model_fit_steps(nfit, T, y, step, &m);
        free(step);
        free(keys);
        if (fit_st != PKV_OK) {
            fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
            free(T);
            free(y);
            set_free(&set);
            return 1;
        }
        printf("fit on %d measurements of %d steps, ranked by route choice: rms %.2f us; ", nfit, nsteps, m.rms_us);
        cli_print_model(stdout, &m);
        printf("\n");
        evaluate(&m, &set, "fit set: ", replay);
        free(T);
        free(y);
        set_free(&set);
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
        evaluate(&m, &set, "held-out: ", replay);
        set_free(&set);
    }
    return 0;
}
