/* cost.c - the cost model behind the adaptive policy: the terms of a plan, the roofline-form
 * prediction (lab/pkv_lab.h spells the formula out), the policy file (read and write), and the
 * context's model.  Its fit from measurements is the lab's (src/lab/cost_fit.c). */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const coef_names[PKV_COST_COEFS] = {"const_us",       "launch_us",      "fused_merge_us_per_mb",
                                                       "merge_us_per_mb", "us_per_mb",      "idle_us_per_mb",
                                                       "rho_mb_per_token", "softmax_p"};

void pkv_cost_fill_terms(double t[PKV_COST_TERMS], int64_t launches, double mb, double longest_mb, double merge_mb,
                         int64_t tasks, int64_t slots, double kv_mb, double token_mb, int rect, int fused) {
    t[PKV_TERM_LAUNCHES] = (double)launches;
    t[PKV_TERM_MB] = mb;
    t[PKV_TERM_LONGEST_MB] = longest_mb;
    t[PKV_TERM_MERGE_MB] = merge_mb;
    t[PKV_TERM_TASKS] = (double)tasks;
    t[PKV_TERM_SLOTS] = (double)slots;
    t[PKV_TERM_TASK_MB] = tasks > 0 ? kv_mb / (double)tasks : 0.0;
    t[PKV_TERM_TOKEN_MB] = token_mb;
    t[PKV_TERM_RECT] = rect ? 1.0 : 0.0;
    t[PKV_TERM_FUSED] = fused ? 1.0 : 0.0;
}

pkv_status pkv_cost_terms(const pkv_plan *plan, double t[PKV_COST_TERMS]) {
    if (!plan || !t) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "plan and terms must not be NULL");
    if (plan->slots <= 0 || plan->generation == 0) /* never planned, or its last pkv_plan_step failed */
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "the plan was not planned (or its last planning failed)");
    const pkv_problem *p = &plan->problem;
    const pkv_counters *c = &plan->counters;
    const double es = (double)pkv_kv_elem_size(p), d = p->head_dim; /* K and V bytes of a token */
    int32_t longest = 0;
    for (int32_t k = 0; k < plan->num_tasks; k++) {
        int32_t n = plan->tasks[k].tok_end - plan->tasks[k].tok_begin;
        if (n > longest) longest = n;
    }
    const double token_mb = d * es * 2.0 / 1e6;
    pkv_cost_fill_terms(t, c->launches, (double)(c->kv_bytes + c->qo_bytes + c->merge_state_bytes) / 1e6,
                        (double)longest * token_mb, (double)plan->max_merge_count * plan->group * (d + 1.0) * 4.0 / 1e6,
                        c->tasks, plan->slots, (double)c->kv_bytes / 1e6, token_mb,
                        plan->route == PKV_ROUTE_SINGLE || plan->route == PKV_ROUTE_SPLIT,
                        plan->route == PKV_ROUTE_FUSED);
    return PKV_OK;
}

/* Cube root of u in [1, 2]: the chord through (1, 1) and (2, 2^(1/3)) (error < 0.016), then three
 * Newton steps (relative error <= 1.4e-15; libm's cbrt took ~30 ns with its range reduction). */
static double cbrt_1_2(double u) {
    double y = 0.7400789501051268 + 0.2599210498948732 * u;
    for (int k = 0; k < 3; k++) y = (2.0 * y + u / (y * y)) * (1.0 / 3.0);
    return y;
}

/* The model's two nonlinear quantities for given rho and p: the streaming term
 * (X^p + Y^p)^(1/p) and the idle MB of the last wave. */
void pkv_cost_roofline_parts(const double t[PKV_COST_TERMS], double rho, double p, double *stream, double *idle) {
    const double b = t[PKV_TERM_TOKEN_MB], mb = t[PKV_TERM_MB];
    const double N = t[PKV_TERM_TASKS] > 1 ? t[PKV_TERM_TASKS] : 1.0, R = t[PKV_TERM_SLOTS] > 1 ? t[PKV_TERM_SLOTS] : 1.0;
    const double L = b > 0 ? t[PKV_TERM_LONGEST_MB] / b : 0.0;
    const double w = ceil(N / R), n_last = N - (w - 1.0) * R;
    double X = mb;
    if ((w <= 1.0 || t[PKV_TERM_RECT] > 0) && b > 0) {
        /* the idle end of the last window: fewer than n_sat tasks left running, their lengths
         * taken as spread evenly over [lo, L] around the mean task */
        const double q = rho / b / (N < R ? N : R);
        if (q < 1.0) {
            const double mean = t[PKV_TERM_TASK_MB] / b, lo = 2.0 * mean - L > 0 ? 2.0 * mean - L : 0.0;
            X += rho * q * (L - lo) / 2.0;
        }
    }
    const double Y = rho * L;
    /* the fit's exponents without pow() or cbrt() (the policy's decision runs this up to seven
     * times per step): M x (1 + r^p)^(1/p) with r = min / max in [0, 1] */
    const double X2 = X * X, Y2 = Y * Y, M = X > Y ? X : Y, r = M > 0 ? (X > Y ? Y : X) / M : 0.0;
    if (isnan(X) || isnan(Y) || !(M > 0) || isinf(M))
        *stream = X + Y; /* NaN, 0 or inf kept as such (a NaN prediction never wins) */
    else if (p <= 0)
        *stream = M;
    else if (p == 2.0)
        *stream = sqrt(X2 + Y2);
    else if (p == 3.0)
        *stream = M * cbrt_1_2(1.0 + r * r * r);
    else if (p == 4.0)
        *stream = sqrt(sqrt(X2 * X2 + Y2 * Y2));
    else if (p == 6.0)
        *stream = M * cbrt_1_2(sqrt(1.0 + r * r * r * r * r * r));
    else
        *stream = pow(pow(X, p) + pow(Y, p), 1.0 / p);
    *idle = w > 1.0 ? (1.0 - n_last / R) * mb * R / N : 0.0;
}

double pkv_cost_predict(const pkv_cost_model *m, const double t[PKV_COST_TERMS]) {
    if (!m || !t) return NAN;
    const double *c = m->coef;
    double stream, idle;
    pkv_cost_roofline_parts(t, c[PKV_COEF_RHO], c[PKV_COEF_P], &stream, &idle);
    const double merge = t[PKV_TERM_FUSED] > 0 ? c[PKV_COEF_FUSED_MERGE] : c[PKV_COEF_MERGE];
    return c[PKV_COEF_CONST_US] + c[PKV_COEF_LAUNCH_US] * t[PKV_TERM_LAUNCHES] + merge * t[PKV_TERM_MERGE_MB] +
           c[PKV_COEF_US_PER_MB] * stream + c[PKV_COEF_IDLE_US_PER_MB] * idle;
}

int pkv_cost_candidate(const double terms[PKV_COST_TERMS], int32_t parallelism) {
    if (!terms) return 0;
    return !(terms[PKV_TERM_RECT] > 0 && terms[PKV_TERM_MERGE_MB] == 0 && 2.0 * terms[PKV_TERM_TASKS] < (double)parallelism);
}

void pkv_cost_model_default(pkv_cost_model *m, int32_t parallelism, double read_gbps, double launch_us) {
    if (!m) return;
    memset(m, 0, sizeof *m);
    m->parallelism = parallelism;
    m->cuda_version = 0;
    m->rms_us = 0;
    m->samples = 0;
    snprintf(m->device, sizeof m->device, "defaults");
    if (read_gbps <= 0) read_gbps = 2000;
    if (launch_us <= 0) launch_us = 3.0;
    if (parallelism <= 0) parallelism = 1;
    double *c = m->coef;
    c[PKV_COEF_CONST_US] = 0.0;
    c[PKV_COEF_LAUNCH_US] = 2.0 * launch_us;    /* a launch and its share of the dependent tail */
    c[PKV_COEF_FUSED_MERGE] = 1e3 / 10.0;       /* one CTA reads the states at ~10 GB/s */
    c[PKV_COEF_MERGE] = 0.0;                    /* the merge kernel spreads them: its launch dominates */
    c[PKV_COEF_US_PER_MB] = 1e3 / read_gbps;
    c[PKV_COEF_IDLE_US_PER_MB] = 0.4 * 1e3 / read_gbps; /* empty slots of a last wave, partly hidden */
    /* ~1.2 tasks per SM of d = 128 (0.512 MB per 1000 tokens) saturate the bandwidth (H200 fit: 156) */
    c[PKV_COEF_RHO] = 1.2 * parallelism * 512e-6;
    c[PKV_COEF_P] = 3.0;
}

/* Why a model cannot drive the policy, written to why (false: it can): coefficients finite and
 * >= 0, rho > 0, and p 0 (max) or in [1, 16] (larger exponents overflow the soft max).  The
 * caller's buffer: contexts may be configured from several threads. */
bool pkv_cost_model_invalid(const pkv_cost_model *m, char *why, size_t cap) {
    for (int k = 0; k < PKV_COST_COEFS; k++)
        if (!(m->coef[k] >= 0) || !isfinite(m->coef[k])) {
            snprintf(why, cap, "coefficient %s is negative or not finite", coef_names[k]);
            return true;
        }
    if (!(m->coef[PKV_COEF_RHO] > 0)) {
        snprintf(why, cap, "rho_mb_per_token must be positive");
        return true;
    }
    const double p = m->coef[PKV_COEF_P];
    if (p != 0 && !(p >= 1 && p <= 16)) {
        snprintf(why, cap, "softmax_p must be 0 (max) or in [1, 16]");
        return true;
    }
    return false;
}

pkv_status pkv_cost_model_save(const pkv_cost_model *m, const char *path) {
    if (!m || !path) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "model and path must not be NULL");
    FILE *f = fopen(path, "w");
    if (!f) return pkv_fail(NULL, PKV_ERR_IO, "cannot write policy file '%s'", path);
    fprintf(f, "persistentkv-policy 2\n");
    fprintf(f, "device = %s\nparallelism = %d\ncuda_version = %d\nsamples = %d\nrms_us = %.6g\n", m->device,
            m->parallelism, m->cuda_version, m->samples, m->rms_us);
    for (int k = 0; k < PKV_COST_COEFS; k++) fprintf(f, "%s = %.9g\n", coef_names[k], m->coef[k]);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return pkv_fail(NULL, PKV_ERR_IO, "cannot write policy file '%s'", path);
    return PKV_OK;
}

/* Reads the next line of a policy file into buf without its "\n": 1 for a line, 0 at the end of the
 * file, -1 for a line of more than cap - 2 characters, -2 for a NUL byte in it, -3 on a read error. */
static int policy_line(FILE *f, char *buf, size_t cap) {
    size_t len = 0;
    int c;
    while ((c = getc(f)) != EOF && c != '\n') {
        if (c == '\0') return -2;
        if (len + 2 >= cap) return -1;
        buf[len++] = (char)c;
    }
    if (c == EOF && ferror(f)) return -3;
    if (c == EOF && len == 0) return 0;
    buf[len] = '\0';
    return 1;
}

pkv_status pkv_cost_model_load(const char *path, pkv_cost_model *m) {
    if (!m || !path) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "model and path must not be NULL");
    FILE *f = fopen(path, "r");
    if (!f) return pkv_fail(NULL, PKV_ERR_IO, "cannot open policy file '%s'", path);
    pkv_cost_model r;
    memset(&r, 0, sizeof r);
    char line[512];
    int seen = 0, lineno = 0, seen_header = 0, got;
    pkv_status st = PKV_OK;
    while (st == PKV_OK && (got = policy_line(f, line, sizeof line)) != 0) {
        lineno++;
        if (got == -1) {
            st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: line longer than %d characters", path, lineno,
                          (int)sizeof line - 2);
            break;
        }
        if (got == -2) { /* strtod and strcmp would stop there and take the line's start for all of it */
            st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: NUL byte (a policy file is text)", path, lineno);
            break;
        }
        if (got == -3) {
            st = pkv_fail(NULL, PKV_ERR_IO, "cannot read policy file '%s'", path);
            break;
        }
        line[strcspn(line, "\r")] = 0;
        if (lineno == 1) {
            if (strcmp(line, "persistentkv-policy 2") != 0)
                st = pkv_fail(NULL, PKV_ERR_PARSE, "'%s' is not a version 2 policy file (`pkv calibrate` writes one)",
                              path);
            seen_header = 1;
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
        static const char *const ints[3] = {"parallelism", "cuda_version", "samples"};
        int ik = 0;
        while (ik < 3 && strcmp(key, ints[ik]) != 0) ik++;
        if (ik < 3) {
            if (x < 0 || x > INT32_MAX || x != floor(x)) {
                st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: '%s' must be a non-negative integer", path, lineno, key);
                break;
            }
            if (seen & (1 << (PKV_COST_COEFS + ik))) {
                st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: '%s' appears twice", path, lineno, key);
                break;
            }
            seen |= 1 << (PKV_COST_COEFS + ik);
            if (ik == 0) r.parallelism = (int32_t)x;
            else if (ik == 1) r.cuda_version = (int32_t)x;
            else r.samples = (int32_t)x;
        } else if (strcmp(key, "rms_us") == 0) {
            r.rms_us = x;
        } else {
            int k = 0;
            while (k < PKV_COST_COEFS && strcmp(key, coef_names[k]) != 0) k++;
            if (k == PKV_COST_COEFS) {
                st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: unknown key '%s'", path, lineno, key);
                break;
            }
            if (x < 0) {
                st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: coefficient '%s' is negative", path, lineno, key);
                break;
            }
            if (seen & (1 << k)) {
                st = pkv_fail(NULL, PKV_ERR_PARSE, "%s:%d: '%s' appears twice", path, lineno, key);
                break;
            }
            r.coef[k] = x;
            seen |= 1 << k;
        }
    }
    fclose(f);
    if (st != PKV_OK) return st;
    if (!seen_header) return pkv_fail(NULL, PKV_ERR_PARSE, "'%s' is empty", path);
    if ((seen & ((1 << PKV_COST_COEFS) - 1)) != (1 << PKV_COST_COEFS) - 1)
        return pkv_fail(NULL, PKV_ERR_PARSE, "'%s' lacks coefficients", path);
    if (!(seen & (1 << PKV_COST_COEFS)) || r.parallelism <= 0)
        return pkv_fail(NULL, PKV_ERR_PARSE, "'%s' lacks a positive parallelism (the SMs it was measured on)", path);
    char why[96];
    if (pkv_cost_model_invalid(&r, why, sizeof why)) return pkv_fail(NULL, PKV_ERR_PARSE, "'%s': %s", path, why);
    *m = r;
    return PKV_OK;
}

pkv_status pkv_context_set_cost_model(pkv_context *ctx, const pkv_cost_model *m) {
    if (!ctx) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "context is NULL");
    if (!m) {
        ctx->has_cost_model = false;
        return PKV_OK;
    }
    char why[96];
    if (pkv_cost_model_invalid(m, why, sizeof why)) return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "cost model: %s", why);
    ctx->cost_model = *m;
    ctx->has_cost_model = true;
    return PKV_OK;
}

int pkv_context_get_cost_model(const pkv_context *ctx, pkv_cost_model *m) {
    if (!ctx || !m || !ctx->has_cost_model) return 0;
    *m = ctx->cost_model;
    return 1;
}
