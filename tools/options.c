/* options.c - the option parsers and usages of `pkv bench`, `pkv trace`, `pkv check` and
 * `pkv calibrate` (options.h): one pass over argv against the command's table of options, then each
 * value checked in a fixed order, so a command line with several bad options always gets the same
 * message.  Nothing here prints (but the usages), exits, opens a file or keeps static state. */
#define _POSIX_C_SOURCE 200809L
#include "options.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REPS 1000000
#define DEFAULT_ROTATE_GIB 2.0 /* far more than a GPU's L2: no page of a step is still cached when it comes back */
#define MAX_ROTATE_GIB 1024.0
#define DEFAULT_PAGE_SIZE 16
#define MAX_PAGE_SIZE 256
#define MAX_TOKENS_OPT (1 << 30) /* --window and --min-chunk: a row's length at most */
#define MAX_THREADS 1024
#define MAX_TRACE_BATCH (1 << 20)
#define MAX_TRACE_REQUESTS (1 << 24)
#define MAX_HOLES 0.9 /* the trace generator's */
#define CHECK_DEFAULT_COUNT 50
#define CHECK_MAX_COUNT 10000000
#define CHECK_DEFAULT_MAX_LEN 3000
#define CHECK_MAX_MAX_LEN (1 << 22)
#define TRACE_DEFAULT_SHOW 8
#define MAX_OPTIONS 64 /* the most options of one command */
#define SHOWN 48       /* the most characters of a user's value quoted in a message */

int cli_parse_exit_code(cli_parse_status status) {
    return status == CLI_PARSE_GO_ON ? -1 : status == CLI_PARSE_HELP ? 0 : 2;
}

/* Writes the message into err (when there is room) and returns CLI_PARSE_BAD. */
static cli_parse_status bad(char *err, size_t cap, const char *fmt, ...) {
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return CLI_PARSE_BAD;
}

/* ---- one pass over argv --------------------------------------------------------------------------- */
/* A command's options: names, flags ending in '!'. */
typedef struct opt_set {
    const char *const *known;
    int n;
    const char *val[MAX_OPTIONS]; /* the last value of each option; a flag given: "" */
} opt_set;

static bool wants_help(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (argv[i] && (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)) return true;
    return false;
}

/* Every argument a known option (and its value). */
static cli_parse_status scan(int argc, char **argv, const char *const *known, const char *cmd, opt_set *s, char *err,
                             size_t cap) {
    memset(s, 0, sizeof *s);
    s->known = known;
    while (known[s->n] && s->n < MAX_OPTIONS) s->n++;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!a) return bad(err, cap, "argument %d is NULL", i + 1);
        if (strncmp(a, "--", 2) != 0) return bad(err, cap, "unexpected argument '%.*s' (see pkv %s --help)", SHOWN, a, cmd);
        int k = 0;
        size_t len = 0;
        for (; k < s->n; k++) {
            len = strlen(known[k]);
            if (len && known[k][len - 1] == '!') len--;
            if (strlen(a) == len && strncmp(a, known[k], len) == 0) break;
        }
        if (k == s->n) return bad(err, cap, "unknown option '%.*s' (see pkv %s --help)", SHOWN, a, cmd);
        if (known[k][len] == '!') {
            s->val[k] = "";
            continue;
        }
        if (i + 1 >= argc || !argv[i + 1]) return bad(err, cap, "option %s needs a value", a);
        s->val[k] = argv[++i];
    }
    return CLI_PARSE_GO_ON;
}

/* The value of option name (flags: "" when given), or NULL. */
static const char *get(const opt_set *s, const char *name) {
    const size_t n = strlen(name);
    for (int k = 0; k < s->n; k++)
        if (strncmp(s->known[k], name, n) == 0 && (s->known[k][n] == '\0' || s->known[k][n] == '!')) return s->val[k];
    return NULL;
}

/* ---- values --------------------------------------------------------------------------------------- */
/* An integer in [lo, hi] (def when absent). */
static cli_parse_status int_opt(const opt_set *s, const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out,
                                char *err, size_t cap) {
    const char *v = get(s, name);
    *out = def;
    if (!v) return CLI_PARSE_GO_ON;
    char *end = NULL;
    errno = 0;
    const long long x = strtoll(v, &end, 10);
    if (!end || end == v || *end) return bad(err, cap, "option %s expects an integer, got '%.*s'", name, SHOWN, v);
    if (errno == ERANGE || x < lo || x > hi)
        return bad(err, cap, "option %s takes a value in [%lld, %lld], got %.*s", name, (long long)lo, (long long)hi,
                   SHOWN, v);
    *out = x;
    return CLI_PARSE_GO_ON;
}

/* int_opt into an int32 (lo and hi within int32). */
static cli_parse_status i32_opt(const opt_set *s, const char *name, int64_t def, int64_t lo, int64_t hi, int32_t *out,
                                char *err, size_t cap) {
    int64_t x = def;
    const cli_parse_status st = int_opt(s, name, def, lo, hi, &x, err, cap);
    *out = (int32_t)x;
    return st;
}

/* A seed: any unsigned 64-bit integer. */
static cli_parse_status seed_opt(const opt_set *s, const char *name, uint64_t def, uint64_t *out, char *err,
                                 size_t cap) {
    const char *v = get(s, name);
    *out = def;
    if (!v) return CLI_PARSE_GO_ON;
    char *end = NULL;
    errno = 0;
    const unsigned long long x = strtoull(v, &end, 10);
    if (!end || end == v || *end || strchr(v, '-') || errno == ERANGE)
        return bad(err, cap, "option %s takes an integer in [0, 2^64), got '%.*s'", name, SHOWN, v);
    *out = x;
    return CLI_PARSE_GO_ON;
}

/* A finite number in [lo, hi] (def when absent). */
static cli_parse_status double_opt(const opt_set *s, const char *name, double def, double lo, double hi, double *out,
                                   char *err, size_t cap) {
    const char *v = get(s, name);
    *out = def;
    if (!v) return CLI_PARSE_GO_ON;
    char *end = NULL;
    const double x = strtod(v, &end);
    if (!end || end == v || *end || !isfinite(x))
        return bad(err, cap, "option %s expects a finite number, got '%.*s'", name, SHOWN, v);
    if (!(x >= lo && x <= hi)) return bad(err, cap, "option %s takes a value in [%g, %g], got %.*s", name, lo, hi, SHOWN, v);
    *out = x;
    return CLI_PARSE_GO_ON;
}

/* --kv-scale: an fp8 cache's per-tensor scale (real value = stored x scale), positive and a float; 1 when absent. */
static cli_parse_status kv_scale_opt(const opt_set *s, float *out, char *err, size_t cap) {
    double scale = 1.0;
    const cli_parse_status st = double_opt(s, "--kv-scale", 1.0, -DBL_MAX, DBL_MAX, &scale, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    if (!(scale > 0.0 && scale <= FLT_MAX && (float)scale > 0.0f))
        return bad(err, cap, "option --kv-scale takes a positive scale (real value = stored x scale) that a float "
                   "holds, got %.*s", SHOWN, get(s, "--kv-scale"));
    *out = (float)scale;
    return CLI_PARSE_GO_ON;
}

/* A path: not empty. */
static cli_parse_status path_opt(const opt_set *s, const char *name, const char **out, char *err, size_t cap) {
    *out = get(s, name);
    if (*out && !**out) return bad(err, cap, "option %s needs a path, got ''", name);
    return CLI_PARSE_GO_ON;
}

/* A comma-separated list of paths: no empty element. */
static cli_parse_status list_opt(const opt_set *s, const char *name, const char **out, char *err, size_t cap) {
    *out = get(s, name);
    if (!*out) return CLI_PARSE_GO_ON;
    const char *v = *out;
    if (!*v || *v == ',' || v[strlen(v) - 1] == ',' || strstr(v, ",,"))
        return bad(err, cap, "option %s expects comma-separated paths, got '%.*s'", name, SHOWN, v);
    return CLI_PARSE_GO_ON;
}

/* --backend and --threads into cc. */
static cli_parse_status context_opts(const opt_set *s, pkv_context_config *cc, char *err, size_t cap) {
    pkv_context_config_default(cc);
    const char *be = get(s, "--backend");
    if (be && strcmp(be, "cpu") == 0)
        cc->backend = PKV_BACKEND_CPU;
    else if (be && strcmp(be, "cuda") == 0)
        cc->backend = PKV_BACKEND_CUDA;
    else if (be && strcmp(be, "best") == 0)
        cc->backend = PKV_BACKEND_BEST;
    else if (be)
        return bad(err, cap, "unknown backend '%.*s' (best, cpu or cuda)", SHOWN, be);
    /* 0 would be the library's "every core": the default, said by leaving --threads out */
    return i32_opt(s, "--threads", 0, 1, MAX_THREADS, &cc->num_threads, err, cap);
}

/* --seed, --batch (then 3 x B requests), --requests into c (the family's defaults for the rest). */
static cli_parse_status trace_config_opts(const opt_set *s, const char *family_option, pkv_trace_config *c, char *err,
                                          size_t cap) {
    const char *name = get(s, family_option);
    pkv_trace_family fam = PKV_TRACE_BIMODAL;
    if (name && pkv_trace_family_parse(name, &fam) != PKV_OK)
        return bad(err, cap, "unknown trace family '%.*s' (uniform, bimodal, zipf, bucketed, homogeneous)", SHOWN,
                   name);
    pkv_trace_config_default(c, fam);
    cli_parse_status st = seed_opt(s, "--seed", c->seed, &c->seed, err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--batch", c->max_active, 1, MAX_TRACE_BATCH, &c->max_active, err, cap);
    if (st == CLI_PARSE_GO_ON && get(s, "--batch")) c->num_requests = 3 * c->max_active;
    if (st == CLI_PARSE_GO_ON)
        st = i32_opt(s, "--requests", c->num_requests, 1, MAX_TRACE_REQUESTS, &c->num_requests, err, cap);
    return st;
}

/* ---- pkv bench ------------------------------------------------------------------------------------ */
void bench_usage(FILE *f) {
    fprintf(
        f,
        "usage: pkv bench [options]\n"
        "Replays a trace, the anchor steps or one isolated step and prints a Markdown table.\n\n"
        "backend and route:\n"
        "  --backend best|cpu|cuda   (default best: cuda when a GPU is present)\n"
        "  --route R|all             auto, single, split, bucketed, workqueue, fused or all (default all)\n"
        "  --threads N               CPU backend threads, 1..1024 (default: every core)\n"
        "problem:\n"
        "  --shape NAME|HQ:HKV:D     paper (default), g8, g7, mha, d256, d64, g16, or any model's query heads,\n"
        "                            KV heads and head dim (e.g. 48:4:64; fp16 unless --dtype; head dim 64, 128\n"
        "                            or 256, HQ a multiple of HKV, G = HQ / HKV at most 16)\n"
        "  --dtype fp16|bf16|fp8     q and o (default: the shape's); fp8: fp16 q and o with an fp8_e4m3 cache\n"
        "                            (--dtype fp16 --kv-dtype fp8_e4m3; add --kv-dtype fp8_e5m2 for e5m2)\n"
        "  --kv-dtype T              the KV cache's type: q's (fp16 or bf16, the default), fp8_e4m3 or fp8_e5m2\n"
        "                            (one byte an element: half the bytes of fp16, as KV MB, GB/s and the floors\n"
        "                            count them)\n"
        "  --kv-scale S              an fp8 cache's scale, K and V alike (k_scale = v_scale): real value = stored\n"
        "                            x S (default 1); the cache holds random values in [-1, 1] as codes of value / S\n"
        "  --layout nhd|hnd          (default nhd)\n"
        "  --page-size N             1..256 (default 16)\n"
        "  --window W                sliding window: each row attends to its last W tokens (default 0: all)\n"
        "  --soft-cap C              logits soft cap (Gemma-2: 50; default 0: none)\n");
    fprintf(
        f,
        "workload (one of; default: --trace bimodal):\n"
        "  --trace FAMILY            uniform, bimodal, zipf, bucketed, homogeneous\n"
        "      --seed S --batch B --requests N\n"
        "  --trace-file PATH         a trace written by `pkv trace --out`\n"
        "      (either trace) --steps N (CPU default 2; 0: all) --step S (one step only)\n"
        "  --anchor NAME|all         the anchor steps of anchors.md (paper shape); all 26 on a CPU take about\n"
        "                            half an hour and 9 GB of memory (README)\n"
        "  --lens N1,N2,...          one isolated step with these lengths (0..2^30 each, at most 4096)\n"
        "  --calibration-set         the calibration traces (seed 20260622, five families, B 1, 4, 16, 64)\n"
        "  --heldout-set             the held-out traces (seeds 20260623..27, five families, B 1..128)\n"
        "      --set-batches B1,B2.. (1..4096, at most 16; either set) --set-seeds N (held-out: first N of five)\n"
        "measuring:\n"
        "  --reps N --warmup N --wall-reps N   (CUDA defaults 100 / 10 / 20; CPU 2 / 0 / 2)\n"
        "  --rotate-gib X            KV rotated over at least X GiB (default 2)\n"
        "  --kv-interleaved          K and V of each page side by side in one pool (kv_page_stride)\n"
        "  --ctas-per-unit N         planner: tasks per SM in one wave (default: the backend's)\n"
        "  --min-chunk N             planner: smallest split in tokens (default 128)\n"
        "  --graph-max-batch N|pow2  graph-stable plans (CUDA-graph serving) for batches of up to N rows (pow2: the\n"
        "                            step's batch rounded up to a power of two); routes auto and workqueue only\n"
        "  --graph-tasks N           graph-stable plans: CTAs of the task grid (default: the most tasks the planner\n"
        "                            gives a batch of that capacity)\n"
        "  --parallelism N           planner: plan as for N SMs (default: the backend's SMs or threads;\n"
        "                            e.g. 132 on the CPU backend to run the plans an H200 would get)\n"
        "  --explain                 each route's predicted time (cost model) next to its measured time\n"
        "  --policy FILE             cost model for auto and --explain (default: the context's: PKV_POLICY, else the\n"
        "                            CUDA backend's device defaults; the CPU backend has none: auto uses its rule)\n"
        "  --calibrate-out FILE      fit the cost model to this run's measurements and write a policy file\n"
        "  --behind-producer         also time each step behind a kernel that writes its q (a model layer's order):\n"
        "                            producer alone and producer + step, with a producer that does not and one that\n"
        "                            does trigger its programmatic dependents\n"
        "  --pdl 0|1                 launch the step's kernels as programmatic dependents of the kernel before them\n"
        "                            (pkv_context_config.pdl; default 1)\n"
        "  --no-check                skip the comparison with the float64 reference\n"
        "  --per-step                print every trace step, not only the per-route summary\n"
        "  --quiet                   no progress lines on stderr\n"
        "  --json PATH               write every metric as JSON\n");
}

static const char *const bench_known[] = {
    "--backend",       "--route",         "--threads",          "--shape",       "--dtype",
    "--layout",        "--page-size",     "--trace",            "--seed",        "--batch",
    "--requests",      "--steps",         "--step",             "--trace-file",  "--anchor",
    "--lens",          "--reps",          "--warmup",           "--wall-reps",   "--rotate-gib",
    "--no-check!",     "--per-step!",     "--json",             "--quiet!",      "--help!",
    "--ctas-per-unit", "--min-chunk",     "--explain!",         "--policy",      "--calibrate-out",
    "--calibration-set!", "--heldout-set!", "--set-batches",    "--set-seeds",   "--parallelism",
    "--kv-interleaved!", "--window",      "--soft-cap",         "--behind-producer!", "--pdl",
    "--graph-max-batch", "--graph-tasks", "--kv-dtype",      "--kv-scale",    NULL};

static void record_cmdline(int argc, char **argv, bench_opts *o) {
    size_t at = (size_t)snprintf(o->cmdline, sizeof o->cmdline, "pkv bench");
    for (int i = 0; i < argc && at < sizeof o->cmdline; i++)
        at += (size_t)snprintf(o->cmdline + at, sizeof o->cmdline - at, " %s", argv[i]);
}

/* A named shape, or HQ:HKV:D (plain decimal numbers, each at most 5 digits). */
static bool parse_shape(const char *name, pkv_problem *p, char *shape_name, size_t cap) {
    int count = 0;
    const pkv_shape *shapes = cli_shapes(&count);
    for (int i = 0; i < count; i++)
        if (strcmp(shapes[i].name, name) == 0) {
            snprintf(shape_name, cap, "%s", shapes[i].name);
            p->num_qo_heads = shapes[i].hq;
            p->num_kv_heads = shapes[i].hkv;
            p->head_dim = shapes[i].d;
            p->dtype = shapes[i].dtype;
            return true;
        }
    int32_t v[3] = {0, 0, 0};
    const char *q = name;
    for (int k = 0; k < 3; k++) {
        int digits = 0;
        while (*q >= '0' && *q <= '9' && digits < 6) v[k] = 10 * v[k] + (*q++ - '0'), digits++;
        if (digits == 0 || digits > 5 || v[k] <= 0 || *q != (k < 2 ? ':' : '\0')) return false;
        q++;
    }
    snprintf(shape_name, cap, "%d:%d:%d", v[0], v[1], v[2]);
    p->num_qo_heads = v[0];
    p->num_kv_heads = v[1];
    p->head_dim = v[2];
    p->dtype = PKV_DTYPE_FP16;
    return true;
}

/* --dtype, --kv-dtype and --kv-scale: q's and o's type, the cache's (kv_dtype 0 for a cache of q's type)
 * and an fp8 cache's scale. */
static cli_parse_status bench_dtypes(const opt_set *s, bench_opts *o, char *err, size_t cap) {
    const char *dt = get(s, "--dtype"), *kt = get(s, "--kv-dtype");
    const bool fp8_short = dt && strcmp(dt, "fp8") == 0; /* fp16 q and o, an e4m3 cache */
    if (dt && !fp8_short && strcmp(dt, "bf16") != 0 && strcmp(dt, "fp16") != 0)
        return bad(err, cap,
                   "--dtype takes fp16, bf16 or fp8 (fp16 q and o with an fp8_e4m3 cache; the cache alone: "
                   "--kv-dtype), got '%.*s'",
                   SHOWN, dt);
    pkv_dtype kv = PKV_DTYPE_FP16;
    if (kt && !cli_dtype_parse(kt, &kv))
        return bad(err, cap, "--kv-dtype takes fp16, bf16, fp8_e4m3 or fp8_e5m2, got '%.*s'", SHOWN, kt);
    if (dt) o->prob.dtype = strcmp(dt, "bf16") == 0 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
    o->prob.kv_dtype = fp8_short ? PKV_DTYPE_FP8_E4M3 : (pkv_dtype)0;
    if (kt && (kv == PKV_DTYPE_FP8_E4M3 || kv == PKV_DTYPE_FP8_E5M2)) {
        o->prob.kv_dtype = kv;
    } else if (kt && fp8_short) {
        return bad(err, cap, "--dtype fp8 asks for an fp8 cache and --kv-dtype %s for an %s one: give one", kt, kt);
    } else if (kt && kv != o->prob.dtype) { /* the library reads a cache of q's type or an fp8 one */
        return bad(err, cap, "--kv-dtype %s with %s q and o: a cache of fp16 or bf16 holds q's type (--dtype %s)",
                   kt, cli_dtype_name(o->prob.dtype), kt);
    }
    float scale = 1.0f;
    const cli_parse_status st = kv_scale_opt(s, &scale, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    if (get(s, "--kv-scale") && !cli_kv_is_fp8(&o->prob))
        return bad(err, cap, "--kv-scale applies to an fp8 cache (--kv-dtype fp8_e4m3 or fp8_e5m2, or --dtype fp8)");
    o->kv_scale = scale;
    return CLI_PARSE_GO_ON;
}

/* The problem: --shape, the types, --layout, --page-size, --window, --soft-cap; checked by the library. */
static cli_parse_status bench_problem(const opt_set *s, bench_opts *o, char *err, size_t cap) {
    const char *shape = get(s, "--shape");
    pkv_problem_default(&o->prob);
    if (!parse_shape(shape ? shape : "paper", &o->prob, o->shape_name, sizeof o->shape_name))
        return bad(err, cap,
                   "unknown shape '%.*s' (paper, g8, g7, mha, d256, d64, g16, or HQ:HKV:D such as 48:4:64)", SHOWN,
                   shape);
    const char *lay = get(s, "--layout");
    cli_parse_status st = bench_dtypes(s, o, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    if (lay && strcmp(lay, "hnd") != 0 && strcmp(lay, "nhd") != 0)
        return bad(err, cap, "--layout takes nhd or hnd, got '%.*s'", SHOWN, lay);
    if (lay) o->prob.layout = strcmp(lay, "hnd") == 0 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD;
    st = i32_opt(s, "--page-size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE, &o->prob.page_size, err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--window", 0, 0, MAX_TOKENS_OPT, &o->prob.window, err, cap);
    double soft_cap = 0;
    if (st == CLI_PARSE_GO_ON) st = double_opt(s, "--soft-cap", 0.0, 0.0, FLT_MAX, &soft_cap, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    o->prob.logits_soft_cap = (float)soft_cap;
    /* the library's own checks, now rather than when the first step is planned */
    const int32_t indptr[1] = {0};
    const pkv_page_table empty = {0, indptr, NULL, NULL};
    if (pkv_check_page_table(&o->prob, &empty) != PKV_OK)
        return bad(err, cap, "--shape %s (%s%s%s): %s", o->shape_name, cli_dtype_name(o->prob.dtype),
                   cli_kv_is_fp8(&o->prob) ? ", KV " : "", cli_kv_is_fp8(&o->prob) ? cli_dtype_name(o->prob.kv_dtype) : "",
                   pkv_last_error());
    return CLI_PARSE_GO_ON;
}

/* --route: one route, or every route (auto first). */
static cli_parse_status bench_routes(const opt_set *s, bench_opts *o, char *err, size_t cap) {
    const char *route = get(s, "--route");
    if (!route || strcmp(route, "all") == 0) {
        static const pkv_route all[BENCH_MAX_ROUTES] = {PKV_ROUTE_AUTO,     PKV_ROUTE_SINGLE,    PKV_ROUTE_SPLIT,
                                                        PKV_ROUTE_BUCKETED, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
        memcpy(o->routes, all, sizeof all);
        o->nroutes = BENCH_MAX_ROUTES;
        return CLI_PARSE_GO_ON;
    }
    if (pkv_route_parse(route, &o->routes[0]) != PKV_OK)
        return bad(err, cap, "unknown route '%.*s' (auto, single, split, bucketed, workqueue, fused or all)", SHOWN,
                   route);
    o->nroutes = 1;
    return CLI_PARSE_GO_ON;
}

/* How to measure: repetitions, the rotation, the files, the flags and the planner's options. */
static cli_parse_status bench_measuring(const opt_set *s, bench_opts *o, char *err, size_t cap) {
    int32_t v[3] = {BENCH_DEFAULT, BENCH_DEFAULT, BENCH_DEFAULT};
    cli_parse_status st = i32_opt(s, "--reps", BENCH_DEFAULT, 1, MAX_REPS, &v[0], err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--warmup", BENCH_DEFAULT, 0, MAX_REPS, &v[1], err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--wall-reps", BENCH_DEFAULT, 1, MAX_REPS, &v[2], err, cap);
    double rotate_gib = 0;
    if (st == CLI_PARSE_GO_ON)
        st = double_opt(s, "--rotate-gib", DEFAULT_ROTATE_GIB, 0.0, MAX_ROTATE_GIB, &rotate_gib, err, cap);
    if (st == CLI_PARSE_GO_ON) st = path_opt(s, "--json", &o->json, err, cap);
    if (st == CLI_PARSE_GO_ON) st = path_opt(s, "--policy", &o->policy, err, cap);
    if (st == CLI_PARSE_GO_ON) st = path_opt(s, "--calibrate-out", &o->calibrate_out, err, cap);
    if (st == CLI_PARSE_GO_ON)
        st = i32_opt(s, "--ctas-per-unit", 0, 0, PKV_MAX_PER_UNIT, &o->ctas_per_unit, err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--min-chunk", 0, 0, MAX_TOKENS_OPT, &o->min_chunk, err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--parallelism", 0, 0, PKV_MAX_PARALLELISM, &o->parallelism, err, cap);
    const char *gmb = get(s, "--graph-max-batch");
    if (st == CLI_PARSE_GO_ON && gmb && strcmp(gmb, "pow2") == 0)
        o->graph_max_batch = -1;
    else if (st == CLI_PARSE_GO_ON)
        st = i32_opt(s, "--graph-max-batch", 0, 0, PKV_MAX_BATCH, &o->graph_max_batch, err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--graph-tasks", 0, 0, INT32_MAX / 2, &o->graph_tasks, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    o->reps = v[0], o->warmup = v[1], o->wall_reps = v[2];
    o->rotate_bytes = (int64_t)(rotate_gib * (double)(1 << 30));
    o->check = !get(s, "--no-check");
    o->kv_interleaved = get(s, "--kv-interleaved") != NULL;
    o->behind = get(s, "--behind-producer") != NULL;
    o->per_step = get(s, "--per-step") != NULL;
    o->quiet = get(s, "--quiet") != NULL;
    o->explain = get(s, "--explain") != NULL;
    return CLI_PARSE_GO_ON;
}

/* --lens N1,N2,...: each length in [0, 2^30], at most BENCH_MAX_LENS of them, their pages (of the
 * problem's size) at most a page table's 2^31 - 1. */
static cli_parse_status bench_lens(const char *lens, bench_opts *o, char *err, size_t cap) {
    o->lens_arg = lens;
    const char *p = lens;
    int64_t pages = 0;
    for (;;) {
        if (o->nlens == BENCH_MAX_LENS) return bad(err, cap, "--lens takes at most %d lengths", BENCH_MAX_LENS);
        char *end = NULL;
        errno = 0;
        const long long v = strtoll(p, &end, 10);
        if (end == p) {
            const size_t n = strcspn(p, ",");
            return bad(err, cap, "--lens expects comma-separated lengths (e.g. 300,2000); length %d is '%.*s'",
                       o->nlens + 1, (int)(n < SHOWN ? n : SHOWN), p);
        }
        if (v < 0)
            return bad(err, cap, "--lens: length %d is %.*s, a length is at least 0", o->nlens + 1,
                       (int)(end - p < SHOWN ? end - p : SHOWN), p);
        if (errno == ERANGE || v > BENCH_MAX_LEN)
            return bad(err, cap, "--lens: length %d is %.*s, above the longest row the library takes (2^30 = %d)",
                       o->nlens + 1, (int)(end - p < SHOWN ? end - p : SHOWN), p, BENCH_MAX_LEN);
        o->lens[o->nlens++] = (int32_t)v;
        pages += (v + o->prob.page_size - 1) / o->prob.page_size;
        if (*end == '\0') break;
        if (*end != ',')
            return bad(err, cap, "--lens expects comma-separated lengths (e.g. 300,2000); '%c' after length %d",
                       *end, o->nlens);
        p = end + 1;
    }
    if (pages > INT32_MAX)
        return bad(err, cap, "--lens: %lld pages of %d tokens in all, more than a page table holds (2^31 - 1)",
                   (long long)pages, o->prob.page_size);
    return CLI_PARSE_GO_ON;
}

/* --set-batches B1,B2,...: each in [1, BENCH_MAX_SET_BATCH], at most BENCH_MAX_SET_BATCHES. */
static cli_parse_status bench_set_batches(const char *v, bench_opts *o, char *err, size_t cap) {
    const char *p = v;
    for (;;) {
        if (o->nset_batches == BENCH_MAX_SET_BATCHES)
            return bad(err, cap, "--set-batches takes at most %d batch sizes", BENCH_MAX_SET_BATCHES);
        char *end = NULL;
        errno = 0;
        const long long b = strtoll(p, &end, 10);
        if (end == p || errno == ERANGE || b < 1 || b > BENCH_MAX_SET_BATCH || (*end && *end != ','))
            return bad(err, cap, "--set-batches expects comma-separated batch sizes in [1, %d], got '%.*s'",
                       BENCH_MAX_SET_BATCH, SHOWN, v);
        o->set_batches[o->nset_batches++] = (int32_t)b;
        if (!*end) return CLI_PARSE_GO_ON;
        p = end + 1;
    }
}

/* The workload: one of --anchor, --lens, --trace, --trace-file, --calibration-set, --heldout-set, with
 * only the options that apply to it. */
static cli_parse_status bench_workload(const opt_set *s, bench_opts *o, char *err, size_t cap) {
    static const char *const kinds[] = {"--trace",           "--trace-file",    "--anchor",
                                        "--lens",            "--calibration-set", "--heldout-set"};
    const char *given = NULL;
    o->workload = BENCH_WORKLOAD_TRACE;
    for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++) {
        if (!get(s, kinds[k])) continue;
        if (given) return bad(err, cap, "%s and %s each name a workload: give one", given, kinds[k]);
        given = kinds[k];
        o->workload = (bench_workload_kind)k;
    }
    /* options of other workloads are refused, not silently ignored */
    static const struct {
        const char *option;
        unsigned kinds; /* bits of bench_workload_kind */
        const char *applies;
    } scope[] = {
        {"--seed", 1u << BENCH_WORKLOAD_TRACE, "--trace"},
        {"--batch", 1u << BENCH_WORKLOAD_TRACE, "--trace"},
        {"--requests", 1u << BENCH_WORKLOAD_TRACE, "--trace"},
        {"--steps", 1u << BENCH_WORKLOAD_TRACE | 1u << BENCH_WORKLOAD_TRACE_FILE, "--trace or --trace-file"},
        {"--step", 1u << BENCH_WORKLOAD_TRACE | 1u << BENCH_WORKLOAD_TRACE_FILE, "--trace or --trace-file"},
        {"--set-batches", 1u << BENCH_WORKLOAD_HELDOUT_SET | 1u << BENCH_WORKLOAD_CALIBRATION_SET,
         "--heldout-set or --calibration-set"},
        {"--set-seeds", 1u << BENCH_WORKLOAD_HELDOUT_SET, "--heldout-set"},
    };
    for (size_t k = 0; k < sizeof scope / sizeof scope[0]; k++)
        if (get(s, scope[k].option) && !(scope[k].kinds & (1u << o->workload)))
            return bad(err, cap, "%s applies to %s, not to %s", scope[k].option, scope[k].applies,
                       given ? given : "the default trace");
    cli_parse_status st = trace_config_opts(s, "--trace", &o->trace, err, cap);
    o->trace.page_size = o->prob.page_size;
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--steps", BENCH_DEFAULT, 0, INT32_MAX, &o->steps, err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(s, "--step", -1, 0, INT32_MAX, &o->step, err, cap);
    if (st == CLI_PARSE_GO_ON) st = path_opt(s, "--trace-file", &o->trace_file, err, cap);
    int64_t seeds = BENCH_HELDOUT_SEEDS;
    if (st == CLI_PARSE_GO_ON) st = int_opt(s, "--set-seeds", BENCH_HELDOUT_SEEDS, 1, BENCH_HELDOUT_SEEDS, &seeds, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    o->set_seeds = (int)seeds;
    const char *sb = get(s, "--set-batches");
    if (sb && (st = bench_set_batches(sb, o, err, cap)) != CLI_PARSE_GO_ON) return st;
    const char *anchor = get(s, "--anchor");
    if (anchor) {
        o->anchor = strcmp(anchor, "all") == 0 ? -1 : cli_anchor_find(anchor);
        if (o->anchor == -1 && strcmp(anchor, "all") != 0)
            return bad(err, cap, "unknown anchor '%.*s' (all, or one of anchors.md: B1_N2048 .. B64_homo32K)", SHOWN,
                       anchor);
    }
    const char *lens = get(s, "--lens");
    if (lens) return bench_lens(lens, o, err, cap);
    return CLI_PARSE_GO_ON;
}

cli_parse_status bench_options_parse(int argc, char **argv, bench_opts *o, char *err, size_t cap) {
    memset(o, 0, sizeof *o);
    if (err && cap) err[0] = '\0';
    if (wants_help(argc, argv)) return CLI_PARSE_HELP;
    opt_set s;
    cli_parse_status st = scan(argc, argv, bench_known, "bench", &s, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    record_cmdline(argc, argv, o);
    st = context_opts(&s, &o->cc, err, cap);
    if (st == CLI_PARSE_GO_ON) st = i32_opt(&s, "--pdl", 1, 0, 1, &o->cc.pdl, err, cap);
    o->pdl = o->cc.pdl;
    if (st == CLI_PARSE_GO_ON) st = bench_problem(&s, o, err, cap);
    if (st == CLI_PARSE_GO_ON) st = bench_routes(&s, o, err, cap);
    if (st == CLI_PARSE_GO_ON) st = bench_measuring(&s, o, err, cap);
    if (st == CLI_PARSE_GO_ON) st = bench_workload(&s, o, err, cap);
    return st;
}

/* ---- pkv trace ------------------------------------------------------------------------------------ */
void trace_usage(FILE *f) {
    fprintf(f, "usage: pkv trace [options]\n"
               "  --family NAME      uniform, bimodal (default), zipf, bucketed, homogeneous\n"
               "  --seed S           (default 20260623, the first held-out seed)\n"
               "  --batch B          max_active rows per step (family default: 8, bucketed 1)\n"
               "  --requests N       requests (default: family's, or 3 x B when --batch is given)\n"
               "  --steps N          stop after N steps (default: the family's; 0: when every request is done)\n"
               "  --page-size N      1..256 (default 16)\n"
               "  --holes F          fraction of unused pages in the pool, 0..0.9 (default 0)\n"
               "  --in PATH          read a trace file instead of generating (alone, or with --out and --show)\n"
               "  --out PATH         write the trace file\n"
               "  --show N           print the first N steps (default 8; 0 for none, -1 for all)\n");
}

cli_parse_status trace_options_parse(int argc, char **argv, trace_opts *o, char *err, size_t cap) {
    static const char *const known[] = {"--family", "--seed", "--batch", "--requests", "--steps", "--page-size",
                                        "--holes",  "--in",   "--out",   "--show",     "--help!", NULL};
    memset(o, 0, sizeof *o);
    if (err && cap) err[0] = '\0';
    if (wants_help(argc, argv)) return CLI_PARSE_HELP;
    opt_set s;
    cli_parse_status st = scan(argc, argv, known, "trace", &s, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    if ((st = path_opt(&s, "--in", &o->in, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = path_opt(&s, "--out", &o->out, err, cap)) != CLI_PARSE_GO_ON) return st;
    static const char *const generating[] = {"--family", "--seed", "--batch", "--requests", "--steps", "--page-size",
                                             "--holes"};
    for (size_t k = 0; o->in && k < sizeof generating / sizeof generating[0]; k++)
        if (get(&s, generating[k]))
            return bad(err, cap, "%s generates a trace, --in reads one: give one or the other", generating[k]);
    st = trace_config_opts(&s, "--family", &o->config, err, cap);
    if (st == CLI_PARSE_GO_ON)
        st = i32_opt(&s, "--steps", o->config.max_steps, 0, INT32_MAX, &o->config.max_steps, err, cap);
    if (st == CLI_PARSE_GO_ON)
        st = i32_opt(&s, "--page-size", o->config.page_size, 1, MAX_PAGE_SIZE, &o->config.page_size, err, cap);
    if (st == CLI_PARSE_GO_ON)
        st = double_opt(&s, "--holes", o->config.hole_fraction, 0.0, MAX_HOLES, &o->config.hole_fraction, err, cap);
    if (st == CLI_PARSE_GO_ON) st = int_opt(&s, "--show", TRACE_DEFAULT_SHOW, -1, INT32_MAX, &o->show, err, cap);
    return st;
}

/* ---- pkv check ------------------------------------------------------------------------------------ */
void check_usage(FILE *f) {
    fprintf(f, "usage: pkv check [options]\n"
               "  --backend best|cpu|cuda   (default best)\n"
               "  --count N                 random problems (default 50; every third with K and V interleaved per page,\n"
               "                            every fourth with a sliding window, every fifth with a logits soft cap;\n"
               "                            about half with an fp8 cache, e4m3 or e5m2, half of those with per-KV-head\n"
               "                            scales); a run the backend refuses as unsupported is named and fails the check\n"
               "  --seed S                  (default 1)\n"
               "  --max-len N               typical row length bound, 1..4194304 (default 3000)\n"
               "  --threads N               CPU backend threads, 1..1024 (default: every core)\n");
}

cli_parse_status check_options_parse(int argc, char **argv, check_opts *o, char *err, size_t cap) {
    static const char *const known[] = {"--backend", "--count", "--seed", "--max-len", "--threads", "--help!", NULL};
    memset(o, 0, sizeof *o);
    if (err && cap) err[0] = '\0';
    if (wants_help(argc, argv)) return CLI_PARSE_HELP;
    opt_set s;
    cli_parse_status st = scan(argc, argv, known, "check", &s, err, cap);
    if (st == CLI_PARSE_GO_ON) st = context_opts(&s, &o->cc, err, cap);
    int64_t count = 0;
    if (st == CLI_PARSE_GO_ON) st = int_opt(&s, "--count", CHECK_DEFAULT_COUNT, 1, CHECK_MAX_COUNT, &count, err, cap);
    o->count = (int)count;
    if (st == CLI_PARSE_GO_ON)
        st = i32_opt(&s, "--max-len", CHECK_DEFAULT_MAX_LEN, 1, CHECK_MAX_MAX_LEN, &o->max_len, err, cap);
    if (st == CLI_PARSE_GO_ON) st = seed_opt(&s, "--seed", 1, &o->seed, err, cap);
    return st;
}

/* ---- pkv calibrate -------------------------------------------------------------------------------- */
void calibrate_usage(FILE *f) {
    fprintf(f, "usage: pkv calibrate [options]\n"
               "  --out FILE              policy file to write (default persistentkv.policy)\n"
               "live (measures on a backend):\n"
               "  --backend best|cpu|cuda --reps N        runs `pkv bench --calibration-set` and fits\n"
               "  --json FILE             also keep the measurements (for --from-json / --evaluate)\n"
               "offline (from `pkv bench --json` files):\n"
               "  --from-json F1[,F2..]   fit from the measured rows of these files\n"
               "  --evaluate F1[,F2..]    replay the model's route choice on these measured steps\n"
               "  --policy FILE           evaluate this policy instead of fitting one (with --evaluate)\n"
               "  --replay-auto           also re-plan each evaluated step with auto (route and wave) as the\n"
               "                          measuring GPU would and look its plan up among the measured ones\n"
               "  --parallelism N         SMs of the measuring GPU (default: from the JSON, else 132)\n");
}

cli_parse_status calibrate_options_parse(int argc, char **argv, calibrate_opts *o, char *err, size_t cap) {
    static const char *const known[] = {"--out", "--backend", "--reps", "--from-json", "--evaluate", "--policy",
                                        "--parallelism", "--json", "--replay-auto!", "--help!", NULL};
    memset(o, 0, sizeof *o);
    if (err && cap) err[0] = '\0';
    if (wants_help(argc, argv)) return CLI_PARSE_HELP;
    opt_set s;
    cli_parse_status st = scan(argc, argv, known, "calibrate", &s, err, cap);
    if (st == CLI_PARSE_GO_ON) st = path_opt(&s, "--out", &o->out, err, cap);
    if (st == CLI_PARSE_GO_ON) st = path_opt(&s, "--json", &o->json, err, cap);
    if (st == CLI_PARSE_GO_ON) st = path_opt(&s, "--policy", &o->policy, err, cap);
    if (st == CLI_PARSE_GO_ON) st = list_opt(&s, "--from-json", &o->from_json, err, cap);
    if (st == CLI_PARSE_GO_ON) st = list_opt(&s, "--evaluate", &o->evaluate, err, cap);
    pkv_context_config cc;
    if (st == CLI_PARSE_GO_ON) st = context_opts(&s, &cc, err, cap); /* --backend checked as pkv bench would */
    o->backend = get(&s, "--backend");
    int64_t reps = 0;
    if (st == CLI_PARSE_GO_ON) st = int_opt(&s, "--reps", 1, 1, MAX_REPS, &reps, err, cap);
    o->reps = get(&s, "--reps");
    if (st == CLI_PARSE_GO_ON) st = i32_opt(&s, "--parallelism", 0, 0, PKV_MAX_PARALLELISM, &o->parallelism, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    o->replay_auto = get(&s, "--replay-auto") != NULL;
    o->live = !o->from_json && !o->evaluate && !o->policy;
    if (o->live && (o->replay_auto || get(&s, "--parallelism")))
        return bad(err, cap, "%s applies to --from-json or --evaluate (a live calibration measures its own)",
                   o->replay_auto ? "--replay-auto" : "--parallelism");
    if (!o->live && (o->backend || o->reps || o->json))
        return bad(err, cap, "%s applies to a live calibration, not to --from-json, --evaluate or --policy",
                   o->backend ? "--backend" : o->reps ? "--reps" : "--json");
    if (o->out && !o->live && !o->from_json)
        return bad(err, cap, "--out applies to a fit (live or --from-json); --policy --evaluate writes nothing");
    if (o->evaluate && !o->from_json && !o->policy)
        return bad(err, cap, "--evaluate needs a model: --from-json (fit one) or --policy (a policy file)");
    if (o->policy && o->from_json)
        return bad(err, cap, "--policy evaluates a given policy and --from-json fits one: give one");
    if (o->policy && !o->evaluate) return bad(err, cap, "--policy needs --evaluate (the measured steps to replay)");
    return CLI_PARSE_GO_ON;
}

/* ---- pkv decode ----------------------------------------------------------------------------------- */
void decode_usage(FILE *f) {
    fprintf(f,
            "usage: pkv decode [options]\n"
            "  the end-to-end decode loop: a model's layers (random bf16 weights, or --weights) around the\n"
            "  attention engine, the KV cache owned by the page manager; greedy sampling\n\n"
            "  --model NAME          llama3-8b (default), qwen2.5-32b, llama3.1-70b, hf-small, tiny\n"
            "  --layers N            run the model's first N layers only (memory: the KV pool is per layer)\n"
            "  --backend cpu|cuda|best   default: best (cuda when a GPU is visible)\n"
            "  --trace FAMILY        continuous batching over a workloads.md family (uniform, bimodal, zipf,\n"
            "                        bucketed, homogeneous; default bimodal) ...\n"
            "  --batch B             ... with at most B requests decoded per step (default 8)\n"
            "  --requests N          ... N requests (default 3 x B)\n"
            "  --seed S              the trace's seed (default 20260623) and the weights'\n"
            "  --steps N             stop after N decode steps (default: the trace's end)\n"
            "  --prefill exact|synthetic  exact: prompts through the model (short prompts); synthetic (default\n"
            "                        with --trace): prompt K/V are the pool's random values, no model compute\n"
            "  --prompts FILE        instead of a trace: one prompt per line (token ids), prefilled exactly,\n"
            "                        decoded together for --max-new tokens (default 32)\n"
            "  --weights FILE        the model's weights (PKVW file, as bench/check_transformers.py writes)\n"
            "  --out-tokens FILE     the generated tokens of --prompts, one line per prompt\n"
            "  --out-logits FILE     the logits of each prompt's first generated token (float32 [prompts, vocab])\n"
            "  --page-size N         tokens per page (default 16)\n"
            "  --pages N             pages per layer's pool (default: what the trace needs)\n"
            "  --json FILE           the report as JSON\n"
            "  --kv-dtype T          the KV pools' type: bf16 (the model's, the default), fp8_e4m3 (or fp8) or\n"
            "                        fp8_e5m2: one byte an element, quantized as appended (nearest even, saturating)\n"
            "  --kv-scale S          an fp8 pool's scale, K and V alike: real value = stored x S (default 1)\n"
            "  --kv-compare T        accuracy of an fp8 KV cache (fp8_e4m3, fp8 or fp8_e5m2, with --kv-scale): the\n"
            "                        prompts (--prompts, or --batch random prompts of 16..64 tokens from --seed)\n"
            "                        run twice, bf16 KV and T KV, the same weights, both fed the bf16 run's greedy\n"
            "                        tokens for --max-new steps; per step and overall the max absolute logit\n"
            "                        difference, the logits' relative L2 difference and greedy agreement\n"
            "  --graphs on|off       decode steps in CUDA graphs, one per batch bucket (B rounded up to a power\n"
            "                        of two): the whole step one replay, attention from graph-stable work-queue\n"
            "                        plans (default on for CUDA, off for the CPU, which runs the padded buckets op\n"
            "                        by op); off times every step by part (attention, GEMMs, append, other)\n");
}

/* --kv-dtype, --kv-compare and --kv-scale (the decoder's model is bf16: a 16-bit pool is bf16). */
static cli_parse_status decode_kv(const opt_set *s, decode_opts *o, char *err, size_t cap) {
    const char *kt = get(s, "--kv-dtype"), *kc = get(s, "--kv-compare");
    pkv_dtype kv = (pkv_dtype)0;
    if (kt && strcmp(kt, "fp8") == 0) kv = PKV_DTYPE_FP8_E4M3;
    else if (kt && !cli_dtype_parse(kt, &kv))
        return bad(err, cap, "--kv-dtype takes bf16, fp8_e4m3 (or fp8) or fp8_e5m2, got '%.*s'", SHOWN, kt);
    if (kt && kv == PKV_DTYPE_FP16)
        return bad(err, cap, "--kv-dtype fp16: the model is bf16, so a 16-bit KV cache holds bf16 (--kv-dtype bf16, "
                   "or fp8_e4m3 / fp8_e5m2)");
    o->kv_dtype = kv == PKV_DTYPE_BF16 ? (pkv_dtype)0 : kv;
    if (kc) {
        pkv_dtype c = (pkv_dtype)0;
        if (strcmp(kc, "fp8") == 0) c = PKV_DTYPE_FP8_E4M3;
        else if (!cli_dtype_parse(kc, &c) || (c != PKV_DTYPE_FP8_E4M3 && c != PKV_DTYPE_FP8_E5M2))
            return bad(err, cap, "--kv-compare takes fp8_e4m3 (or fp8) or fp8_e5m2 (run beside bf16 KV), got '%.*s'",
                       SHOWN, kc);
        if (kt) return bad(err, cap, "--kv-compare runs bf16 KV and %s KV: --kv-dtype does not apply", kc);
        o->kv_compare = c;
    }
    float scale = 1.0f;
    const cli_parse_status st = kv_scale_opt(s, &scale, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    if (get(s, "--kv-scale") && !o->kv_dtype && !o->kv_compare)
        return bad(err, cap, "--kv-scale applies to an fp8 KV cache (--kv-dtype fp8_e4m3 or fp8_e5m2, or --kv-compare)");
    o->kv_scale = scale;
    return CLI_PARSE_GO_ON;
}

cli_parse_status decode_options_parse(int argc, char **argv, decode_opts *o, char *err, size_t cap) {
    static const char *const known[] = {"--model",   "--layers",     "--backend",    "--trace",     "--batch",
                                        "--requests", "--seed",      "--steps",      "--prefill",   "--prompts",
                                        "--weights", "--out-tokens", "--out-logits", "--page-size", "--pages",
                                        "--max-new", "--json",       "--kv-dtype",   "--kv-scale",  "--kv-compare",
                                        "--graphs",  "--help!",      NULL};
    memset(o, 0, sizeof *o);
    if (err && cap) err[0] = '\0';
    if (wants_help(argc, argv)) return CLI_PARSE_HELP;
    opt_set s;
    cli_parse_status st = scan(argc, argv, known, "decode", &s, err, cap);
    if (st != CLI_PARSE_GO_ON) return st;
    o->model = get(&s, "--model") ? get(&s, "--model") : "llama3-8b";
    if (!o->model[0]) return bad(err, cap, "option --model needs a name, got ''");
    const char *be = get(&s, "--backend");
    o->backend = PKV_BACKEND_BEST;
    if (be && strcmp(be, "cpu") == 0) o->backend = PKV_BACKEND_CPU;
    else if (be && strcmp(be, "cuda") == 0) o->backend = PKV_BACKEND_CUDA;
    else if (be && strcmp(be, "best") != 0) return bad(err, cap, "unknown backend '%.*s' (best, cpu or cuda)", SHOWN, be);
    const char *fam = get(&s, "--trace");
    o->family = PKV_TRACE_BIMODAL;
    if (fam && pkv_trace_family_parse(fam, &o->family) != PKV_OK)
        return bad(err, cap, "unknown trace family '%.*s' (uniform, bimodal, zipf, bucketed, homogeneous)", SHOWN, fam);
    const char *gr = get(&s, "--graphs");
    if (gr && strcmp(gr, "on") != 0 && strcmp(gr, "off") != 0)
        return bad(err, cap, "option --graphs takes on or off, got '%.*s'", SHOWN, gr);
    o->graphs = !gr ? -1 : strcmp(gr, "on") == 0; /* -1: on where the backend is CUDA */
    const char *pre = get(&s, "--prefill");
    if (pre && strcmp(pre, "exact") != 0 && strcmp(pre, "synthetic") != 0)
        return bad(err, cap, "option --prefill takes exact or synthetic, got '%.*s'", SHOWN, pre);
    if ((st = path_opt(&s, "--weights", &o->weights, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = path_opt(&s, "--prompts", &o->prompts, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = path_opt(&s, "--out-tokens", &o->out_tokens, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = path_opt(&s, "--out-logits", &o->out_logits, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = path_opt(&s, "--json", &o->json, err, cap)) != CLI_PARSE_GO_ON) return st;
    if (o->prompts && pre && strcmp(pre, "synthetic") == 0)
        return bad(err, cap, "--prompts are prefilled exactly (--prefill synthetic applies to --trace)");
    o->exact_prefill = pre ? strcmp(pre, "exact") == 0 : o->prompts != NULL;
    if ((st = i32_opt(&s, "--layers", 0, 1, 1024, &o->layers, err, cap)) != CLI_PARSE_GO_ON) return st;
    if (o->weights && o->layers > 0) return bad(err, cap, "--weights holds the whole model: --layers does not apply");
    if ((st = i32_opt(&s, "--batch", 8, 1, 4096, &o->batch, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = i32_opt(&s, "--requests", 0, 1, 1 << 20, &o->requests, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = i32_opt(&s, "--steps", 0, 1, 1 << 30, &o->steps, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = i32_opt(&s, "--page-size", 16, 1, MAX_PAGE_SIZE, &o->page_size, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = i32_opt(&s, "--max-new", 32, 1, 1 << 20, &o->max_new, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = int_opt(&s, "--pages", 0, 1, INT32_MAX, &o->pages, err, cap)) != CLI_PARSE_GO_ON) return st;
    if ((st = decode_kv(&s, o, err, cap)) != CLI_PARSE_GO_ON) return st;
    /* the comparison decodes prompts: the trace's options and the generation's outputs do not apply */
    static const char *const not_compare[] = {"--trace", "--requests", "--steps", "--prefill", "--out-tokens",
                                              "--out-logits"};
    for (size_t k = 0; o->kv_compare && k < sizeof not_compare / sizeof not_compare[0]; k++)
        if (get(&s, not_compare[k]))
            return bad(err, cap, "%s does not apply to --kv-compare (prompts prefilled exactly, then --max-new "
                       "teacher-forced steps)", not_compare[k]);
    if (o->kv_compare) o->exact_prefill = true;
    return seed_opt(&s, "--seed", 20260623, &o->seed, err, cap);
}
