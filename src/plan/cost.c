/* cost.c - the cost model behind the adaptive policy: roofline-style terms of a plan, a linear
 * prediction with per-device coefficients, their least-squares fit from measurements, the policy
 * file, and the auto route's choice among candidate plans. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const term_names[PKV_COST_TERMS] = {"const_us", "launch_us", "us_per_mb", "task_us_per_mb",
                                                        "wave_us", "merge_us_per_mb"};

pkv_status pkv_cost_terms(const pkv_plan *plan, int32_t parallelism, double t[PKV_COST_TERMS]) {
    if (!plan || !t) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "plan and terms must not be NULL");
    if (parallelism <= 0) return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "parallelism must be positive");
    const pkv_problem *p = &plan->problem;
    const pkv_counters *c = &plan->counters;
    const double es = (double)pkv_dtype_size(p->dtype), d = p->head_dim;
    int32_t longest = 0, max_count = 0;
    for (int32_t k = 0; k < plan->num_tasks; k++) {
        int32_t n = plan->tasks[k].tok_end - plan->tasks[k].tok_begin;
        if (n > longest) longest = n;
    }
    for (int32_t k = 0; k < plan->num_merges; k++)
        if (plan->merges[k].count > max_count) max_count = plan->merges[k].count;
    double slots = 2.0 * parallelism;
    double waves = ceil((double)c->grid_ctas / slots) - 1.0;
    t[0] = 1.0;
    t[1] = (double)c->launches;
    t[2] = (double)(c->kv_bytes + c->qo_bytes + c->merge_state_bytes) / 1e6;
    t[3] = (double)longest * d * es * 2.0 / 1e6;
    t[4] = waves > 0 ? waves : 0.0;
    t[5] = (double)max_count * plan->group * (d + 1.0) * 4.0 / 1e6;
    return PKV_OK;
}

double pkv_cost_predict(const pkv_cost_model *m, const double t[PKV_COST_TERMS]) {
    double us = 0;
    for (int k = 0; k < PKV_COST_TERMS; k++) us += m->coef[k] * t[k];
    return us;
}

void pkv_cost_model_default(pkv_cost_model *m, int32_t parallelism, double read_gbps, double launch_us) {
    memset(m, 0, sizeof *m);
    m->version = 1;
    m->parallelism = parallelism;
    snprintf(m->device, sizeof m->device, "defaults");
    if (read_gbps <= 0) read_gbps = 2000;
    if (launch_us <= 0) launch_us = 3.0;
    m->coef[0] = 2.0 * launch_us;                          /* task and q reads, epilogue */
    m->coef[1] = launch_us;                                /* per launch */
    m->coef[2] = 1e3 / read_gbps;                          /* us per MB at the read ceiling */
    m->coef[3] = 1e3 / (read_gbps / (2.0 * parallelism));  /* one CTA's share of the bandwidth */
    m->coef[4] = 2.0 * launch_us;                          /* an extra wave of short tasks */
    m->coef[5] = 1e3 / 50.0;                               /* one CTA reading partial states */
}

/* Solves the normal equations over the active terms; inactive coefficients are 0. */
static int solve_ls(int32_t n, const double *T, const double *y, const int *active, double *coef) {
    double A[PKV_COST_TERMS][PKV_COST_TERMS + 1], scale[PKV_COST_TERMS];
    int idx[PKV_COST_TERMS], m = 0;
    for (int k = 0; k < PKV_COST_TERMS; k++)
        if (active[k]) idx[m++] = k;
    /* columns scaled to unit norm: the terms span many orders of magnitude */
    for (int a = 0; a < m; a++) {
        double s2 = 0;
        for (int32_t i = 0; i < n; i++) s2 += T[(size_t)i * PKV_COST_TERMS + idx[a]] * T[(size_t)i * PKV_COST_TERMS + idx[a]];
        scale[a] = s2 > 0 ? 1.0 / sqrt(s2) : 0.0;
    }
    for (int a = 0; a < m; a++) {
        for (int b = 0; b <= m; b++) A[a][b] = 0;
        for (int32_t i = 0; i < n; i++) {
            const double *ti = T + (size_t)i * PKV_COST_TERMS;
            for (int b = 0; b < m; b++) A[a][b] += ti[idx[a]] * scale[a] * ti[idx[b]] * scale[b];
            A[a][m] += ti[idx[a]] * scale[a] * y[i];
        }
        A[a][a] += 1e-12; /* a whisper of ridge: an all-zero term gets coefficient 0 */
    }
    for (int col = 0; col < m; col++) { /* Gaussian elimination with partial pivoting */
        int piv = col;
        for (int r = col + 1; r < m; r++)
            if (fabs(A[r][col]) > fabs(A[piv][col])) piv = r;
        if (fabs(A[piv][col]) < 1e-300) return 0;
        if (piv != col)
            for (int b = 0; b <= m; b++) {
                double tmp = A[col][b];
                A[col][b] = A[piv][b];
                A[piv][b] = tmp;
            }
        for (int r = 0; r < m; r++) {
            if (r == col) continue;
            double f = A[r][col] / A[col][col];
            for (int b = col; b <= m; b++) A[r][b] -= f * A[col][b];
        }
    }
    for (int k = 0; k < PKV_COST_TERMS; k++) coef[k] = 0;
    for (int a = 0; a < m; a++) coef[idx[a]] = A[a][m] / A[a][a] * scale[a];
    return 1;
}

pkv_status pkv_cost_model_fit(int32_t n, const double *terms, const double *us, pkv_cost_model *m) {
    if (!terms || !us || !m) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "terms, times and model must not be NULL");
    if (n < PKV_COST_TERMS)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "%d measurements cannot fit %d coefficients", n, PKV_COST_TERMS);
    /* Relative least squares (each row weighted by 1 / its time, so a 10 us step counts as much as a
     * 2 ms one), non-negative by elimination: drop the most negative coefficient and refit. */
    double *wt = (double *)malloc((size_t)n * PKV_COST_TERMS * sizeof(double));
    double *wy = (double *)malloc((size_t)n * sizeof(double));
    if (!wt || !wy) {
        free(wt);
        free(wy);
        return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot allocate the fit");
    }
    for (int32_t i = 0; i < n; i++) {
        double w = us[i] > 0 ? 1.0 / us[i] : 1.0;
        for (int k = 0; k < PKV_COST_TERMS; k++) wt[(size_t)i * PKV_COST_TERMS + k] = terms[(size_t)i * PKV_COST_TERMS + k] * w;
        wy[i] = us[i] * w;
    }
    int active[PKV_COST_TERMS];
    double coef[PKV_COST_TERMS];
    for (int k = 0; k < PKV_COST_TERMS; k++) active[k] = 1;
    for (int iter = 0; iter < PKV_COST_TERMS; iter++) {
        if (!solve_ls(n, wt, wy, active, coef)) {
            free(wt);
            free(wy);
            return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "the measurements do not determine the model");
        }
        int worst = -1;
        for (int k = 0; k < PKV_COST_TERMS; k++)
            if (active[k] && coef[k] < 0 && (worst < 0 || coef[k] < coef[worst])) worst = k;
        if (worst < 0) break;
        active[worst] = 0;
    }
    double se = 0;
    for (int32_t i = 0; i < n; i++) {
        double pred = 0;
        for (int k = 0; k < PKV_COST_TERMS; k++) pred += coef[k] * terms[(size_t)i * PKV_COST_TERMS + k];
        se += (pred - us[i]) * (pred - us[i]);
    }
    free(wt);
    free(wy);
    memcpy(m->coef, coef, sizeof coef);
    m->rms_us = sqrt(se / n);
    m->samples = n;
    m->version = 1;
    return PKV_OK;
}

pkv_status pkv_cost_model_save(const pkv_cost_model *m, const char *path) {
    if (!m || !path) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "model and path must not be NULL");
    FILE *f = fopen(path, "w");
    if (!f) return pkv_fail(NULL, PKV_ERR_IO, "cannot write policy file '%s'", path);
    fprintf(f, "persistentkv-policy 1\n");
    fprintf(f, "device = %s\nparallelism = %d\ncuda_version = %d\nsamples = %d\nrms_us = %.6g\n", m->device,
            m->parallelism, m->cuda_version, m->samples, m->rms_us);
    for (int k = 0; k < PKV_COST_TERMS; k++) fprintf(f, "%s = %.9g\n", term_names[k], m->coef[k]);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return pkv_fail(NULL, PKV_ERR_IO, "cannot write policy file '%s'", path);
    return PKV_OK;
}

pkv_status pkv_cost_model_load(const char *path, pkv_cost_model *m) {
    if (!m || !path) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "model and path must not be NULL");
    FILE *f = fopen(path, "r");
    if (!f) return pkv_fail(NULL, PKV_ERR_IO, "cannot open policy file '%s'", path);
    pkv_cost_model r;
    memset(&r, 0, sizeof r);
    char line[512];
    int seen = 0, lineno = 0;
    pkv_status st = PKV_OK;
    while (st == PKV_OK && fgets(line, sizeof line, f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = 0;
        if (lineno == 1) {
            if (strcmp(line, "persistentkv-policy 1") != 0)
                st = pkv_fail(NULL, PKV_ERR_PARSE, "'%s' is not a version 1 policy file", path);
            r.version = 1;
            continue;
        }
        if (!line[0] || line[0] == '#') continue;
        char *eq = strstr(line, " = ");
        if (!eq) {
            st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: expected 'key = value'", path, lineno);
            break;
        }
        *eq = 0;
        const char *key = line, *val = eq + 3;
        char *end = NULL;
        if (strcmp(key, "device") == 0) {
            snprintf(r.device, sizeof r.device, "%s", val);
            continue;
        }
        double x = strtod(val, &end);
        if (!end || *end || !isfinite(x)) {
            st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: '%s' is not a number", path, lineno, val);
            break;
        }
        if (strcmp(key, "parallelism") == 0) r.parallelism = (int32_t)x;
        else if (strcmp(key, "cuda_version") == 0) r.cuda_version = (int32_t)x;
        else if (strcmp(key, "samples") == 0) r.samples = (int32_t)x;
        else if (strcmp(key, "rms_us") == 0) r.rms_us = x;
        else {
            int k = 0;
            while (k < PKV_COST_TERMS && strcmp(key, term_names[k]) != 0) k++;
            if (k == PKV_COST_TERMS) {
                st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: unknown key '%s'", path, lineno, key);
                break;
            }
            if (x < 0) {
                st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: coefficient '%s' is negative", path, lineno, key);
                break;
            }
            r.coef[k] = x;
            seen |= 1 << k;
        }
    }
    fclose(f);
    if (st != PKV_OK) return st;
    if (r.version != 1) return pkv_fail(NULL, PKV_ERR_PARSE, "'%s' is empty", path);
    if (seen != (1 << PKV_COST_TERMS) - 1) return pkv_fail(NULL, PKV_ERR_PARSE, "'%s' lacks coefficients", path);
    *m = r;
    return PKV_OK;
}

pkv_status pkv_context_set_cost_model(pkv_context *ctx, const pkv_cost_model *m) {
    if (!ctx) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "context is NULL");
    if (!m) {
        ctx->has_cost_model = false;
        return PKV_OK;
    }
    for (int k = 0; k < PKV_COST_TERMS; k++)
        if (!(m->coef[k] >= 0) || !isfinite(m->coef[k]))
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "cost coefficient %d is negative or not finite", k);
    ctx->cost_model = *m;
    ctx->has_cost_model = true;
    return PKV_OK;
}
