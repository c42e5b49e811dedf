/* calibrate.c - `pkv calibrate`: fits the cost model of the adaptive policy and writes a policy
 * file.  Live: runs the calibration traces (seed 20260622) on a backend with every candidate
 * route (through `pkv bench --calibration-set`).  Offline: --from-json refits from the rows of
 * `pkv bench` JSON files (anchor steps and trace steps are re-planned on the host to get their
 * terms), and --evaluate replays the model's choice on measured steps against the oracle (the
 * fastest measured route of each step). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "options.h"

#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_POLICY_FILE "persistentkv.policy"
#define DEFAULT_PARALLELISM 132 /* an H200's SMs: the parallelism of JSON that names none */
#define MAX_ROW_BATCH 4096      /* the most rows of a measured step read back */
#define SET_FIRST_CAP 256       /* measured rows of a set's first allocation */
#define CUDA_DEFAULT_PER_UNIT 2 /* the CUDA backend's wave: tasks per SM (src/cuda/cuda_backend.cu) */
#define CPU_DEFAULT_PER_UNIT 4  /* and the CPU backend's (src/cpu/cpu_backend.c) */
/* The `light` kernel: d = LIGHT_HEAD_DIM and G <= LIGHT_MAX_GROUP; its CTAs per SM when no row shows them. */
#define LIGHT_HEAD_DIM 128
#define LIGHT_MAX_GROUP 8
#define FALLBACK_LIGHT_CTAS_PER_SM 2
/* JSON without "terms_version": 2 (terms v1): six terms, and the residency they assumed. */
#define V1_TERMS 6
#define V1_LIGHT_MAX_GROUP 8
#define V1_LIGHT_MAX_HEAD_DIM 128
#define V1_LIGHT_CTAS_PER_SM 3
#define V1_CTAS_PER_SM 2
#define ROW_REGRET_LIMIT 0.03 /* workload rows whose model regret is over this are counted */

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

/* The text after pattern in the row that starts at q and ends at row_end (NULL: the text's end), or NULL. */
static const char *row_field(const char *q, const char *row_end, const char *pattern) {
    const char *x = strstr(q, pattern);
    return x && (!row_end || x < row_end) ? x + strlen(pattern) : NULL;
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

/* What the rows of one JSON file are read against. */
typedef struct json_file {
    pkv_problem prob;    /* its shape (num_pages unbounded) */
    char shape_name[32];
    int32_t par;         /* the parallelism its plans were made for */
    bool terms_v2;       /* "terms_version": 2: the rows carry every term of the plans that ran */
    int64_t v1_slots;    /* else: the resident task slots that its six terms assumed */
    double token_mb;     /* KV MB of one token of one KV head */
    pkv_plan *plan;      /* re-plans the rows that carry no terms */
} json_file;

/* The JSON's shape into jf->prob and jf->shape_name (the paper shape's defaults where it names none). */
static void json_shape(const char *s, json_file *jf) {
    pkv_problem *prob = &jf->prob;
    pkv_problem_default(prob);
    const char *shape = strstr(s, "\"shape\": {");
    snprintf(jf->shape_name, sizeof jf->shape_name, "paper");
    if (shape) json_str_after(shape, "name", jf->shape_name, sizeof jf->shape_name);
    if (shape) {
        const char *end = strchr(shape, '}');
        long hq = json_int_after(shape, "num_qo_heads"), hkv = json_int_after(shape, "num_kv_heads");
        long d = json_int_after(shape, "head_dim"), ps = json_int_after(shape, "page_size");
        if (end && hq > 0 && hkv > 0 && d > 0 && ps > 0) {
            prob->num_qo_heads = (int32_t)hq;
            prob->num_kv_heads = (int32_t)hkv;
            prob->head_dim = (int32_t)d;
            prob->page_size = (int32_t)ps;
            const char *dt = strstr(shape, "\"dtype\": \"bf16\"");
            prob->dtype = dt && dt < end ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
            char kv[16] = "";
            const char *kt = strstr(shape, "\"kv_dtype\": ");
            pkv_dtype kd = PKV_DTYPE_FP16;
            if (kt && kt < end) json_str_after(kt, "kv_dtype", kv, sizeof kv);
            if (cli_dtype_parse(kv, &kd) && (kd == PKV_DTYPE_FP8_E4M3 || kd == PKV_DTYPE_FP8_E5M2)) prob->kv_dtype = kd;
        }
    }
    prob->num_pages = INT32_MAX;
}

/* The run's settings: the parallelism its plans were made for (--parallelism, else the JSON's, else its
 * GPU's SMs, else an H200's), the tasks per unit it forced, the first GPU named in the set; and how its
 * rows' terms are written.  JSON without "terms_version": 2 carries the six terms of the linear model
 * (const, launches, MB, longest task MB, extra waves, largest merge MB); the rest is rebuilt from the row
 * (tasks, lengths) and the shape, with the residency those terms assumed: V1_LIGHT_CTAS_PER_SM CTAs per
 * SM for G <= V1_LIGHT_MAX_GROUP and d <= V1_LIGHT_MAX_HEAD_DIM, else V1_CTAS_PER_SM. */
static void json_run(const char *s, meas_set *set, int32_t parallelism_opt, json_file *jf) {
    int32_t par = parallelism_opt;
    const char *pl = strstr(s, "\"parallelism\": "), *sm = strstr(s, "\"sms\": ");
    if (par <= 0 && pl) par = (int32_t)json_int_after(pl, "parallelism");
    if (par <= 0 && sm) par = (int32_t)json_int_after(sm, "sms");
    if (par <= 0) par = DEFAULT_PARALLELISM;
    set->parallelism = jf->par = par;
    if (strstr(s, "\"ctas_per_unit\": ")) set->ctas_per_unit = (int32_t)json_int_after(s, "ctas_per_unit");
    const char *gpu = strstr(s, "\"gpu\": {");
    if (gpu && !set->gpu[0]) {
        json_str_after(gpu, "name", set->gpu, sizeof set->gpu);
        set->cuda_version = (int32_t)json_int_after(gpu, "cuda_runtime");
    }
    const pkv_problem *prob = &jf->prob;
    jf->terms_v2 = strstr(s, "\"terms_version\": 2") != NULL;
    const int32_t G = prob->num_qo_heads / prob->num_kv_heads;
    const bool light = G <= V1_LIGHT_MAX_GROUP && prob->head_dim <= V1_LIGHT_MAX_HEAD_DIM;
    jf->v1_slots = (int64_t)par * (light ? V1_LIGHT_CTAS_PER_SM : V1_CTAS_PER_SM);
    jf->token_mb = (double)prob->head_dim * (double)cli_kv_elem_bytes(prob) * 2.0 / 1e6;
}

/* The row's lengths into lens: its "lens", else the anchor or the trace step it names; the batch, or -1. */
static int row_lens(const char *q, const char *row_end, const meas *m, const char *workload, int32_t *lens) {
    const char *ls = row_field(q, row_end, "\"lens\": [");
    if (!ls) return step_lens(m->step, workload, lens, MAX_ROW_BATCH);
    int B = 0;
    for (const char *x = ls; *x && *x != ']' && B < MAX_ROW_BATCH;) {
        char *end;
        lens[B++] = (int32_t)strtol(x, &end, 10);
        x = *end == ',' ? end + 1 : end;
        if (end == x && *x != ']') break;
    }
    return B;
}

/* The row's terms into m->terms: the plan's that ran, as the JSON gives them (rebuilt from the six of
 * older JSON), else by re-planning the lengths with the row's fixed route (auto: none); false when
 * re-planning fails. */
static bool row_terms(const char *q, const char *row_end, const json_file *jf, const int32_t *lens, int B, meas *m) {
    const char *tm = row_field(q, row_end, "\"terms\": [");
    if (tm) {
        const char *x = tm;
        double v[PKV_COST_TERMS] = {0};
        for (int k = 0; k < (jf->terms_v2 ? PKV_COST_TERMS : V1_TERMS); k++) {
            char *end;
            v[k] = strtod(x, &end);
            x = *end == ',' ? end + 1 : end;
        }
        if (jf->terms_v2) {
            memcpy(m->terms, v, sizeof v);
        } else { /* v1: const, launches, MB, longest task MB, extra waves, largest merge MB */
            int64_t tokens = 0;
            for (int i = 0; i < B; i++) tokens += lens[i];
            const long tasks = json_int_after(q, "tasks");
            pkv_cost_fill_terms(m->terms, (int64_t)v[1], v[2], v[3], v[5], tasks, jf->v1_slots,
                                (double)tokens * jf->prob.num_kv_heads * jf->token_mb, jf->token_mb,
                                m->route == PKV_ROUTE_SINGLE || m->route == PKV_ROUTE_SPLIT,
                                m->route == PKV_ROUTE_FUSED);
        }
        return true;
    }
    if (m->route == PKV_ROUTE_AUTO) return true;
    static int32_t indptr[MAX_ROW_BATCH + 1];
    const pkv_problem *prob = &jf->prob;
    indptr[0] = 0;
    for (int i = 0; i < B; i++) indptr[i + 1] = indptr[i] + (lens[i] + prob->page_size - 1) / prob->page_size;
    pkv_page_table t = {B, indptr, NULL, lens};
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.route = m->route;
    o.parallelism = jf->par;
    if (pkv_plan_step_host(prob, &t, &o, jf->plan) != PKV_OK) return false;
    pkv_cost_terms(jf->plan, m->terms);
    return true;
}

/* The measured row whose "step" is at r into m (lens into lens; m->lens not set), read after the file's
 * last "workload"; *next: where the search for the next row goes on.  The batch, or -1 to skip the row. */
static int parse_row(const char *r, const char *workload, const json_file *jf, int32_t *lens, meas *m,
                     const char **next) {
    memset(m, 0, sizeof *m);
    const char *q = json_str_after(r, "step", m->step, sizeof m->step);
    char route[32];
    const char *q2 = json_str_after(q, "route", route, sizeof route);
    const char *ku = row_field(q, NULL, "\"kernel_us\": ");
    const char *row_end = strchr(q, '\n');
    *next = q;
    if (!q2 || !ku || pkv_route_parse(route, &m->route) != PKV_OK) return -1;
    m->us = strtod(ku, NULL);
    char used[32];
    m->used = m->route;
    if (row_field(q, row_end, "\"route_used\": \"") && json_str_after(q, "route_used", used, sizeof used))
        pkv_route_parse(used, &m->used);
    const char *tk = row_field(q, row_end, "\"tasks\": "), *gc = row_field(q, row_end, "\"grid_ctas\": ");
    if (tk) m->tasks = strtoll(tk, NULL, 10);
    if (gc) m->grid_ctas = strtoll(gc, NULL, 10);
    snprintf(m->workload, sizeof m->workload, "%s", workload);
    char args[192] = "";
    if (row_field(q, row_end, "\"args\": \"")) json_str_after(q, "args", args, sizeof args);
    const int B = row_lens(q, row_end, m, workload, lens);
    if (args[0]) {
        /* several seeds of one row share the step names: the arguments keep them apart */
        char key[160];
        row_key(args, key, sizeof key);
        snprintf(m->workload, sizeof m->workload, "%s %s", jf->shape_name, args);
        snprintf(m->row, sizeof m->row, "%s %s", jf->shape_name, key);
    } else {
        snprintf(m->row, sizeof m->row, "%s", workload);
    }
    if (B < 0 || !(m->us > 0)) return -1;
    if (!row_terms(q, row_end, jf, lens, B, m)) return -1;
    m->problem = jf->prob;
    m->batch = B;
    return B;
}

/* Appends m (its lens copied from lens); false when out of memory. */
static bool set_push(meas_set *set, meas m, const int32_t *lens) {
    m.lens = (int32_t *)malloc((size_t)(m.batch > 0 ? m.batch : 1) * sizeof(int32_t));
    if (!m.lens) return true; /* the row is dropped, the next ones may fit */
    if (m.batch > 0) memcpy(m.lens, lens, (size_t)m.batch * sizeof(int32_t));
    if (set->n == set->cap) {
        meas *grown = (meas *)realloc(set->m, (size_t)(set->cap ? 2 * set->cap : SET_FIRST_CAP) * sizeof *set->m);
        if (!grown) {
            free(m.lens);
            return false;
        }
        set->m = grown;
        set->cap = set->cap ? 2 * set->cap : SET_FIRST_CAP;
    }
    set->m[set->n++] = m;
    return true;
}

/* Rows of a pkv bench JSON (or several merged): step, route, kernel time; terms by re-planning the
 * step's lengths (the row's "lens", else the anchor or the trace step it names) for the JSON's shape. */
static int load_rows(const char *path, meas_set *set, int32_t parallelism_opt) {
    char *s = read_all(path);
    if (!s) {
        fprintf(stderr, "pkv calibrate: cannot read %s\n", path);
        return -1;
    }
    json_file jf;
    memset(&jf, 0, sizeof jf);
    json_shape(s, &jf);
    if (pkv_plan_create(&jf.plan) != PKV_OK) {
        fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
        free(s);
        return -1;
    }
    json_run(s, set, parallelism_opt, &jf);
    char workload[160] = "";
    const char *p = s;
    int added = 0;
    static int32_t lens[MAX_ROW_BATCH];
    for (;;) {
        const char *w = strstr(p, "\"workload\": \"");
        const char *r = strstr(p, "\"step\": \"");
        if (!r) break;
        if (w && w < r) {
            json_str_after(w, "workload", workload, sizeof workload);
            p = w + strlen("\"workload\": ");
            continue;
        }
        meas m;
        const int B = parse_row(r, workload, &jf, lens, &m, &p);
        if (B < 0) continue;
        const int before = set->n;
        if (!set_push(set, m, lens)) break;
        added += set->n > before;
    }
    pkv_plan_free(jf.plan);
    free(s);
    return added;
}

/* The rows of every file of the comma-separated list into set; false (with a message) when a file cannot be
 * read or holds no measured row. */
static bool load_list(const char *list, meas_set *set, int32_t par) {
    for (const char *p = list; *p;) {
        const size_t n = strcspn(p, ",");
        char *path = (char *)malloc(n + 1);
        if (!path) {
            fprintf(stderr, "pkv calibrate: out of memory\n");
            return false;
        }
        memcpy(path, p, n);
        path[n] = '\0';
        const int rows = load_rows(path, set, par);
        if (rows > 0)
            fprintf(stderr, "pkv calibrate: %d measured rows from %s\n", rows, path);
        else if (rows == 0)
            fprintf(stderr, "pkv calibrate: no measured rows in %s (a `pkv bench --json` file has them)\n", path);
        free(path);
        if (rows <= 0) return false;
        p += n + (p[n] == ',');
    }
    return true;
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

/* The regrets over every evaluated step. */
typedef struct eval_totals {
    double sum, worst, asum; /* the model's (sum, worst) and the measured auto's */
    int steps, hits, asteps;
    char worst_step[220];
    double rsum, rasum; /* --replay-auto: the re-planned auto's, and the measured auto's on the same steps */
    int rsteps, rmissing, rdiffer;
} eval_totals;

/* Whether m[i] and m[j] are rows of one measured step. */
static bool same_step(const meas_set *set, int i, int j) {
    return !strcmp(set->m[i].step, set->m[j].step) && !strcmp(set->m[i].workload, set->m[j].workload);
}

/* The row of pkv_lab_caps.resident ([d 64, 128, 256][G <= 8, G > 8]) of head dim d. */
static int resident_dim(int32_t d) { return d == 64 ? 0 : d == LIGHT_HEAD_DIM ? 1 : 2; }

/* `auto` as the measuring GPU planned it, for --replay-auto: a host context with the set's SMs, the
 * backend's default wave (CUDA: CUDA_DEFAULT_PER_UNIT tasks per SM; CPU: the CPU backend's), the residency
 * that the measured rows' slots term shows (SMs x the CTAs per SM of the kernel that runs the shape;
 * `light`: that of d = 128, G <= 8) and the model.  Its plan for the step at row i is looked up among the
 * step's measured plans (a fixed route's with the same route, tasks and grid, else the measured auto's
 * when it ran that plan): the measured time, 0 when no measured plan matches, -1 when planning failed;
 * *as_auto: 1 when the measured auto ran that same plan. */
static double replay_auto(pkv_lab_caps *caps, const pkv_cost_model *model, pkv_plan *plan, const meas_set *set, int i,
                          int32_t light, int *as_auto) {
    *as_auto = 0;
    const meas *m0 = &set->m[i];
    double slots = 0;
    for (int j = i; j < set->n; j++)
        if (same_step(set, i, j) && set->m[j].terms[PKV_TERM_SLOTS] > 0) {
            slots = set->m[j].terms[PKV_TERM_SLOTS];
            break;
        }
    const pkv_problem *p = &m0->problem;
    memset(caps->resident, 0, sizeof caps->resident);
    caps->resident[resident_dim(LIGHT_HEAD_DIM)][0] = light;
    if (slots > 0)
        caps->resident[resident_dim(p->head_dim)][p->num_qo_heads > LIGHT_MAX_GROUP * p->num_kv_heads] =
            (int32_t)(slots / set->parallelism + 0.5);
    static int32_t indptr[MAX_ROW_BATCH + 1];
    if (m0->batch > MAX_ROW_BATCH) return -1;
    indptr[0] = 0;
    for (int b = 0; b < m0->batch; b++) indptr[b + 1] = indptr[b] + (m0->lens[b] + p->page_size - 1) / p->page_size;
    pkv_page_table t = {m0->batch, indptr, NULL, m0->lens};
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.route = PKV_ROUTE_AUTO;
    o.ctas_per_unit = set->ctas_per_unit; /* forced in the bench run, else 0 */
    if (pkv_lab_plan_step_caps(caps, model, p, &t, &o, plan) != PKV_OK) return -1;
    const pkv_route r = pkv_plan_route(plan);
    const int64_t tasks = pkv_plan_counters(plan)->tasks, grid = pkv_plan_counters(plan)->grid_ctas;
    double fixed = 0, own = 0;
    for (int j = i; j < set->n; j++) {
        const meas *x = &set->m[j];
        if (!same_step(set, i, j)) continue;
        if (x->used != r || x->tasks != tasks || x->grid_ctas != grid) continue;
        if (x->route == PKV_ROUTE_AUTO)
            own = x->us, *as_auto = 1;
        else if (fixed == 0)
            fixed = x->us;
    }
    return fixed > 0 ? fixed : own;
}

/* --replay-auto: the capabilities of the measuring GPU as the planner saw them - the set's SMs, the backend's
 * default wave (CUDA: CUDA_DEFAULT_PER_UNIT tasks per SM; CPU: the CPU backend's) - with *rplan; *light: the
 * residency of d = 128, G <= 8 that the rows' slots term shows (unchanged when none does).  False (with a
 * message) when the plan cannot be made. */
static bool replay_caps(const meas_set *set, pkv_lab_caps *caps, pkv_plan **rplan, int32_t *light) {
    if (pkv_plan_create(rplan) != PKV_OK) {
        fprintf(stderr, "pkv calibrate: --replay-auto: %s\n", pkv_last_error());
        return false;
    }
    memset(caps, 0, sizeof *caps);
    caps->parallelism = set->parallelism;
    caps->ctas_per_unit = set->cuda_version > 0 ? CUDA_DEFAULT_PER_UNIT : CPU_DEFAULT_PER_UNIT;
    for (int i = 0; i < set->n; i++) {
        const pkv_problem *p = &set->m[i].problem;
        const bool is_light = p->head_dim == LIGHT_HEAD_DIM && p->num_qo_heads <= LIGHT_MAX_GROUP * p->num_kv_heads;
        if (is_light && set->m[i].terms[PKV_TERM_SLOTS] > 0) {
            *light = (int32_t)(set->m[i].terms[PKV_TERM_SLOTS] / set->parallelism + 0.5);
            break;
        }
    }
    return true;
}

/* The times of the step whose first row is i: the oracle (*best: the fastest measured fixed route,
 * bucketed included; INFINITY: none), the measured time of the route the model picks among its candidates
 * (*pick_us; 0: none) and the measured auto's (*auto_us; 0: none). */
static void step_times(const pkv_cost_model *m, const meas_set *set, int i, double *best, double *pick_us,
                       double *auto_us) {
    double pick_pred = INFINITY;
    *best = INFINITY;
    *pick_us = *auto_us = 0;
    for (int j = i; j < set->n; j++) {
        const meas *x = &set->m[j];
        if (!same_step(set, i, j)) continue;
        if (x->route == PKV_ROUTE_AUTO) {
            *auto_us = x->us;
            continue;
        }
        if (x->us < *best) *best = x->us;
        if (!candidate(x->route) || !pkv_cost_candidate(x->terms, set->parallelism)) continue;
        double pr = pkv_cost_predict(m, x->terms);
        if (pr < pick_pred) {
            pick_pred = pr;
            *pick_us = x->us;
        }
    }
}

/* The row_stat of workload row `row` in rows (a new one when it has none yet). */
static row_stat *row_of(row_stat *rows, int *nrows, const char *row) {
    int k = 0;
    while (k < *nrows && strcmp(rows[k].row, row)) k++;
    if (k == *nrows) snprintf(rows[(*nrows)++].row, sizeof rows[0].row, "%s", row);
    return &rows[k];
}

/* Counts step m (its oracle best, the model's pick, the measured auto's time) into the totals and its row. */
static void tally_step(eval_totals *tot, row_stat *rs, const meas *m, double best, double pick_us, double auto_us) {
    double reg = pick_us / best - 1.0;
    tot->sum += reg;
    tot->steps++;
    tot->hits += reg <= 0.0;
    if (reg > tot->worst) {
        tot->worst = reg;
        snprintf(tot->worst_step, sizeof tot->worst_step, "%s (%s)", m->step, m->workload);
    }
    rs->steps++;
    rs->model_best += reg <= 0.0;
    rs->model_reg += reg;
    if (reg >= rs->worst) {
        rs->worst = reg;
        snprintf(rs->worst_step, sizeof rs->worst_step, "%s", m->step);
    }
    if (auto_us > 0) {
        rs->auto_reg += auto_us / best - 1.0;
        rs->auto_steps++;
        tot->asum += auto_us / best - 1.0;
        tot->asteps++;
    }
}

/* Counts the re-planned auto of a step (rus: its measured time, <= 0 when its plan was not measured). */
static void tally_replay(eval_totals *tot, row_stat *rs, double rus, int as_auto, double best, double auto_us) {
    if (rus > 0) {
        tot->rsum += rus / best - 1.0;
        tot->rsteps++;
        rs->replay_reg += rus / best - 1.0;
        rs->replay_steps++;
        if (auto_us > 0) {
            tot->rasum += auto_us / best - 1.0;
            tot->rdiffer += !as_auto;
        }
    } else {
        tot->rmissing++;
        rs->replay_missing++;
    }
}

/* The table of workload rows; the count of rows whose model regret is over ROW_REGRET_LIMIT. */
static int print_rows(const row_stat *rows, int nrows, bool replay) {
    printf("\n| workload row | steps | model picks the fastest | model mean regret | model worst step | "
           "measured auto mean regret |%s\n",
           replay ? " re-planned auto mean regret (steps whose plan was measured) |" : "");
    printf("| --- | ---: | ---: | ---: | --- | ---: |%s\n", replay ? " ---: |" : "");
    int over = 0;
    for (int k = 0; k < nrows; k++) {
        const row_stat *rs = &rows[k];
        double mr = rs->model_reg / rs->steps;
        over += mr > ROW_REGRET_LIMIT;
        printf("| %s | %d | %d | %.2f%% | %s %.1f%% | ", rs->row, rs->steps, rs->model_best, 100.0 * mr, rs->worst_step,
               100.0 * rs->worst);
        if (rs->auto_steps)
            printf("%.2f%% |", 100.0 * rs->auto_reg / rs->auto_steps);
        else
            printf("- |");
        if (replay && rs->replay_steps)
            printf(" %.2f%% (%d of %d) |", 100.0 * rs->replay_reg / rs->replay_steps, rs->replay_steps,
                   rs->replay_steps + rs->replay_missing);
        else if (replay)
            printf(" - (0 of %d) |", rs->replay_missing);
        printf("\n");
    }
    return over;
}

/* The lines under the table: the model's regrets, the measured auto's and the re-planned auto's. */
static void print_totals(const eval_totals *t, const char *label, int nrows, int over, bool replay) {
    printf("\n%sevaluation on %d measured steps in %d workload rows: the model's route is the fastest on %d; "
           "mean regret %.2f%%, worst %.2f%% (%s); rows with a mean regret over 3%%: %d",
           label, t->steps, nrows, t->hits, t->steps ? 100.0 * t->sum / t->steps : 0.0, 100.0 * t->worst,
           t->worst_step, over);
    if (t->asteps) printf("; measured auto: mean regret %.2f%% over %d steps", 100.0 * t->asum / t->asteps, t->asteps);
    printf("\n");
    if (!replay) return;
    printf("%sauto re-planned with this model (route and wave): its plan was measured on %d of %d steps; mean "
           "regret %.2f%% over them",
           label, t->rsteps, t->rsteps + t->rmissing, t->rsteps ? 100.0 * t->rsum / t->rsteps : 0.0);
    if (t->rsteps)
        printf(" (the measured auto on the same steps: %.2f%%; a plan other than the measured auto's on %d)",
               100.0 * t->rasum / t->rsteps, t->rdiffer);
    printf("\n");
}

/* For each measured step: the oracle (the fastest measured fixed route, bucketed included), the
 * route the model picks among its candidates, and the measured `auto` row when there is one; the
 * regrets pooled per workload row (seeds and steps of one trace family and B together). */
static void evaluate(const pkv_cost_model *m, const meas_set *set, const char *label, bool replay) {
    pkv_plan *rplan = NULL;
    int32_t light = FALLBACK_LIGHT_CTAS_PER_SM;
    pkv_lab_caps caps;
    const bool replaying = replay && replay_caps(set, &caps, &rplan, &light);
    eval_totals tot;
    memset(&tot, 0, sizeof tot);
    row_stat *rows = (row_stat *)calloc((size_t)(set->n ? set->n : 1), sizeof *rows);
    int nrows = 0;
    for (int i = 0; i < set->n; i++) {
        bool first = true;
        for (int j = 0; j < i && first; j++)
            if (same_step(set, j, i)) first = false;
        if (!first) continue;
        double best, pick_us, auto_us;
        step_times(m, set, i, &best, &pick_us, &auto_us);
        if (!(best < INFINITY) || pick_us <= 0) continue;
        row_stat *rs = row_of(rows, &nrows, set->m[i].row);
        tally_step(&tot, rs, &set->m[i], best, pick_us, auto_us);
        if (replaying) {
            int as_auto = 0;
            const double rus = replay_auto(&caps, m, rplan, set, i, light, &as_auto);
            tally_replay(&tot, rs, rus, as_auto, best, auto_us);
        }
    }
    const int over = print_rows(rows, nrows, replaying);
    print_totals(&tot, label, nrows, over, replaying);
    pkv_plan_free(rplan);
    free(rows);
}

/* Live: `pkv bench --calibration-set` with the fit written to --out (and --backend, --reps, --json passed on),
 * its messages under pkv calibrate's name. */
static int calibrate_live(const calibrate_opts *o) {
    char *args[16];
    int n = 0;
    args[n++] = (char *)"--calibration-set";
    args[n++] = (char *)"--calibrate-out";
    args[n++] = (char *)(o->out ? o->out : DEFAULT_POLICY_FILE);
    args[n++] = (char *)"--explain";
    args[n++] = (char *)"--quiet";
    if (o->backend) args[n++] = (char *)"--backend", args[n++] = (char *)o->backend;
    if (o->reps) args[n++] = (char *)"--reps", args[n++] = (char *)o->reps;
    if (o->json) args[n++] = (char *)"--json", args[n++] = (char *)o->json;
    return bench_run("pkv calibrate", n, args);
}

/* The fit's inputs: each candidate row's terms, time and step. */
typedef struct fit_rows {
    double *T;         /* [rows][PKV_COST_TERMS] */
    double *y;         /* [rows] */
    int32_t *step;     /* [rows]: the step of each row (cli_step_id) */
    const char **keys; /* [2 x rows]: cli_step_id's keys */
} fit_rows;

/* Fits m to the candidate routes' rows of set (ranked by the route choice over the measured steps,
 * pkv_cost_model_fit_steps), evaluates it on them and writes it to out; 0, else the exit status. */
static int fit_and_write(const meas_set *set, fit_rows *f, const char *from, const char *out, bool replay,
                         pkv_cost_model *m) {
    int nfit = 0;
    int32_t nsteps = 0;
    for (int i = 0; i < set->n; i++) {
        if (!candidate(set->m[i].route)) continue; /* the fit is over the routes the model chooses among */
        memcpy(f->T + (size_t)nfit * PKV_COST_TERMS, set->m[i].terms, sizeof set->m[i].terms);
        f->y[nfit] = set->m[i].us;
        f->step[nfit++] = cli_step_id(f->keys, &nsteps, set->m[i].step, set->m[i].workload);
    }
    pkv_cost_model_default(m, set->parallelism, 0, 0);
    if (set->gpu[0]) /* the SM count in at most 5 digits, so that the name fits the device field */
        snprintf(m->device, sizeof m->device, "%.48s (%d SMs), fit from %.40s", set->gpu,
                 (int)(set->parallelism % 100000), from);
    else
        snprintf(m->device, sizeof m->device, "fit from %.100s", from);
    m->cuda_version = set->cuda_version;
    if (pkv_cost_model_fit_steps(nfit, f->T, f->y, f->step, m) != PKV_OK) {
        fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
        return 1;
    }
    printf("fit on %d measurements of %d steps, ranked by route choice: rms %.2f us; ", nfit, nsteps, m->rms_us);
    cli_print_model(stdout, m);
    printf("\n");
    evaluate(m, set, "fit set: ", replay);
    const char *dst = out ? out : DEFAULT_POLICY_FILE;
    if (pkv_cost_model_save(m, dst) != PKV_OK) {
        fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
        return 1;
    }
    printf("wrote %s\n", dst);
    return 0;
}

/* --from-json: the rows of the files in `from`, fitted, evaluated and written (fit_and_write). */
static int calibrate_from_json(const char *from, const char *out, int32_t par, bool replay, pkv_cost_model *m) {
    meas_set set = {0};
    if (!load_list(from, &set, par)) {
        set_free(&set);
        return 1;
    }
    const size_t rows = (size_t)(set.n ? set.n : 1);
    fit_rows f = {(double *)malloc(rows * PKV_COST_TERMS * sizeof(double)), (double *)malloc(rows * sizeof(double)),
                  (int32_t *)malloc(rows * sizeof(int32_t)), (const char **)malloc(rows * 2 * sizeof(char *))};
    int status = 1;
    if (!f.T || !f.y || !f.step || !f.keys)
        fprintf(stderr, "pkv calibrate: out of memory for %d measurements\n", set.n);
    else
        status = fit_and_write(&set, &f, from, out, replay, m);
    free(f.T);
    free(f.y);
    free(f.step);
    free(f.keys);
    set_free(&set);
    return status;
}

int cmd_calibrate(int argc, char **argv) {
    calibrate_opts o;
    char err[CLI_ERR_CAP];
    const cli_parse_status ps = calibrate_options_parse(argc, argv, &o, err, sizeof err);
    if (ps == CLI_PARSE_HELP) calibrate_usage(stdout);
    if (ps == CLI_PARSE_BAD) fprintf(stderr, "pkv calibrate: %s\n", err);
    if (ps != CLI_PARSE_GO_ON) return cli_parse_exit_code(ps);
    if (o.live) return calibrate_live(&o);
    pkv_cost_model m;
    if (o.policy && pkv_cost_model_load(o.policy, &m) != PKV_OK) {
        fprintf(stderr, "pkv calibrate: %s\n", pkv_last_error());
        return 1;
    }
    if (o.from_json) {
        const int st = calibrate_from_json(o.from_json, o.out, o.parallelism, o.replay_auto, &m);
        if (st) return st;
    }
    if (o.evaluate) {
        meas_set set = {0};
        const bool loaded = load_list(o.evaluate, &set, o.parallelism);
        if (loaded) evaluate(&m, &set, "held-out: ", o.replay_auto);
        set_free(&set);
        if (!loaded) return 1;
    }
    return 0;
}
