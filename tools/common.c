/* common.c - shapes, anchor steps and option helpers of the pkv tool. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const pkv_shape shapes[] = {
    {"paper", 32, 8, 128, PKV_DTYPE_FP16, "the PersistentKV paper; Llama-3-8B, Mistral-7B"},
    {"g8", 64, 8, 128, PKV_DTYPE_FP16, "Llama-3-70B"},
    {"g7", 28, 4, 128, PKV_DTYPE_BF16, "Qwen2.5-7B"},
    {"mha", 32, 32, 128, PKV_DTYPE_FP16, "Llama-2-7B"},
    {"d256", 16, 8, 256, PKV_DTYPE_BF16, "Gemma-2-9B"},
    {"d64", 14, 2, 64, PKV_DTYPE_BF16, "Qwen2-0.5B"},
    {"g16", 128, 8, 128, PKV_DTYPE_BF16, "Llama-3.1-405B (G = 16, beyond workloads.md)"},
};

const pkv_shape *cli_shapes(int *count) {
    *count = (int)(sizeof shapes / sizeof shapes[0]);
    return shapes;
}

/* A named shape, or any model's as HQ:HKV:D (query heads, KV heads, head dim; fp16 unless --dtype says
 * otherwise; the library checks it when the step is planned).  The returned shape of the second form is
 * the last one parsed. */
const pkv_shape *cli_shape_find(const char *name) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, name) == 0) return &shapes[i];
    static char custom_name[40];
    static pkv_shape custom;
    int hq = 0, hkv = 0, d = 0, used = 0;
    if (sscanf(name, "%d:%d:%d%n", &hq, &hkv, &d, &used) != 3 || name[used] != '\0' || hq <= 0 || hkv <= 0 ||
        d <= 0)
        return NULL;
    snprintf(custom_name, sizeof custom_name, "%d:%d:%d", hq, hkv, d);
    custom = (pkv_shape){custom_name, hq, hkv, d, PKV_DTYPE_FP16, "given as HQ:HKV:D"};
    return &custom;
}

/* Anchor steps in the order of anchors.md.  kind: 0 uniform, 1 bimodal, 2 zipf (drawn), 3 fixed. */
typedef struct anchor_def {
    const char *name;
    int32_t batch, kind, fixed_len;
    double fi_us;
    const char *fi_path;
} anchor_def;

static const anchor_def anchor_defs[] = {
    {"B1_N2048", 1, 3, 2048, 13.3, "tensorcore"},      {"B1_N8192", 1, 3, 8192, 20.6, "cudacore"},
    {"B1_N32768", 1, 3, 32768, 45.6, "tensorcore"},    {"B1_N65536", 1, 3, 65536, 76.2, "tensorcore"},
    {"B1_N131072", 1, 3, 131072, 136.8, "tensorcore"}, {"B4_homo8K", 4, 3, 8192, 44.7, "tensorcore"},
    {"B4_zipf", 4, 2, 0, 55.8, "tensorcore"},          {"B4_bimodal", 4, 1, 0, 69.0, "tensorcore"},
    {"B4_uniform", 4, 0, 0, 102.4, "tensorcore"},      {"B4_homo32K", 4, 3, 32768, 132.3, "tensorcore"},
    {"B8_zipf", 8, 2, 0, 70.8, "tensorcore"},          {"B8_bimodal", 8, 1, 0, 72.8, "tensorcore"},
    {"B8_uniform", 8, 0, 0, 176.9, "tensorcore"},      {"B16_homo8K", 16, 3, 8192, 133.6, "tensorcore"},
    {"B16_bimodal", 16, 1, 0, 216.1, "tensorcore"},    {"B16_zipf", 16, 2, 0, 238.9, "tensorcore"},
    {"B16_uniform", 16, 0, 0, 264.8, "tensorcore"},    {"B16_homo32K", 16, 3, 32768, 482.9, "tensorcore"},
    {"B32_bimodal", 32, 1, 0, 490.6, "tensorcore"},    {"B32_zipf", 32, 2, 0, 542.5, "tensorcore"},
    {"B32_uniform", 32, 0, 0, 647.4, "tensorcore"},    {"B64_homo8K", 64, 3, 8192, 485.8, "tensorcore"},
    {"B64_bimodal", 64, 1, 0, 711.1, "tensorcore"},    {"B64_zipf", 64, 2, 0, 1058.5, "tensorcore"},
    {"B64_uniform", 64, 0, 0, 1244.5, "tensorcore"},   {"B64_homo32K", 64, 3, 32768, 1893.3, "tensorcore"},
};

int cli_anchor_count(void) { return (int)(sizeof anchor_defs / sizeof anchor_defs[0]); }

int cli_anchor_find(const char *name) {
    for (int i = 0; i < cli_anchor_count(); i++)
        if (strcmp(anchor_defs[i].name, name) == 0) return i;
    return -1;
}

/* Lengths by the rule of anchors.md: splitmix64 seeded 20250000 + 100 B + kind; uniform U[1024, 32768];
 * bimodal U[256, 1024] or U[16384, 32768] by a fair coin; zipf k ~ k^-1.1 on 1..64 by inverse CDF,
 * N = clamp(round(32768 / k^1.1), 256, 32768). */
void cli_anchor_get(int i, pkv_anchor *a) {
    const anchor_def *d = &anchor_defs[i];
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", d->name);
    a->batch = d->batch;
    a->flashinfer_us = d->fi_us;
    a->flashinfer_path = d->fi_path;
    pkv_rng r;
    pkv_rng_seed(&r, 20250000ull + 100ull * (uint64_t)d->batch + (uint64_t)d->kind);
    double cdf[64], total = 0;
    for (int k = 1; k <= 64; k++) total += pow((double)k, -1.1);
    double acc = 0;
    for (int k = 1; k <= 64; k++) {
        acc += pow((double)k, -1.1);
        cdf[k - 1] = acc / total;
    }
    for (int32_t j = 0; j < d->batch; j++) {
        switch (d->kind) {
        case 0: a->lens[j] = (int32_t)pkv_rng_uniform_int(&r, 1024, 32768); break;
        case 1:
            a->lens[j] = pkv_rng_uniform01(&r) < 0.5 ? (int32_t)pkv_rng_uniform_int(&r, 256, 1024)
                                                     : (int32_t)pkv_rng_uniform_int(&r, 16384, 32768);
            break;
        case 2: {
            double u = pkv_rng_uniform01(&r);
            int k = 1;
            while (k < 64 && u > cdf[k - 1]) k++;
            double n = floor(32768.0 / pow((double)k, 1.1) + 0.5);
            a->lens[j] = (int32_t)(n < 256 ? 256 : n > 32768 ? 32768 : n);
            break;
        }
        default: a->lens[j] = d->fixed_len;
        }
    }
}

const char *cli_opt(int argc, char **argv, const char *name) {
    for (int i = 0; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return NULL;
}

bool cli_flag(int argc, char **argv, const char *name) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return true;
    return false;
}

bool cli_check_options(int argc, char **argv, const char *const *known, const char *cmd) {
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0) {
            fprintf(stderr, "pkv %s: unexpected argument '%s' (see pkv %s --help)\n", cmd, argv[i], cmd);
            return false;
        }
        bool found = false, takes_value = true;
        for (const char *const *k = known; *k; k++) {
            size_t n = strlen(*k);
            bool is_flag = n > 0 && (*k)[n - 1] == '!';
            size_t len = is_flag ? n - 1 : n;
            if (strlen(argv[i]) == len && strncmp(argv[i], *k, len) == 0) {
                found = true;
                takes_value = !is_flag;
                break;
            }
        }
        if (!found) {
            fprintf(stderr, "pkv %s: unknown option '%s' (see pkv %s --help)\n", cmd, argv[i], cmd);
            return false;
        }
        if (takes_value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "pkv %s: option '%s' needs a value\n", cmd, argv[i]);
                return false;
            }
            i++;
        }
    }
    return true;
}

int64_t cli_opt_int(int argc, char **argv, const char *name, int64_t def) {
    const char *v = cli_opt(argc, argv, name);
    if (!v) return def;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!end || end == v || *end || errno == ERANGE) {
        fprintf(stderr, "pkv: option %s expects an integer, got '%s'\n", name, v);
        exit(2);
    }
    return x;
}

int32_t cli_opt_range(int argc, char **argv, const char *name, int64_t def, int64_t lo, int64_t hi) {
    const int64_t x = cli_opt_int(argc, argv, name, def);
    if (x < lo || x > hi) {
        fprintf(stderr, "pkv: option %s takes a value in [%lld, %lld], got %lld\n", name, (long long)lo, (long long)hi,
                (long long)x);
        exit(2);
    }
    return (int32_t)x;
}

bool cli_context_config(int argc, char **argv, const char *cmd, pkv_context_config *cc) {
    const char *be = cli_opt(argc, argv, "--backend");
    if (be && strcmp(be, "cpu") == 0)
        cc->backend = PKV_BACKEND_CPU;
    else if (be && strcmp(be, "cuda") == 0)
        cc->backend = PKV_BACKEND_CUDA;
    else if (be && strcmp(be, "best") == 0)
        cc->backend = PKV_BACKEND_BEST;
    else if (be) {
        fprintf(stderr, "pkv %s: unknown backend '%s' (best, cpu or cuda)\n", cmd, be);
        return false;
    }
    cc->num_threads = cli_opt_range(argc, argv, "--threads", 0, 0, 1024);
    return true;
}

double cli_opt_double(int argc, char **argv, const char *name, double def) {
    const char *v = cli_opt(argc, argv, name);
    if (!v) return def;
    char *end = NULL;
    double x = strtod(v, &end);
    if (!end || end == v || *end || !isfinite(x)) {
        fprintf(stderr, "pkv: option %s expects a finite number, got '%s'\n", name, v);
        exit(2);
    }
    return x;
}

double cli_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

int cli_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double cli_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cli_cmp_double);
    return v[n / 2];
}

double cli_percentile(double *v, int n, double q) {
    if (n <= 0) return 0;
    int i = (int)(q * (n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

void cli_fill_random(uint16_t *buf, int64_t n, pkv_dtype dtype, uint64_t seed) {
    pkv_rng r;
    pkv_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) {
        float f = (float)(pkv_rng_uniform01(&r) * 2.0 - 1.0);
        buf[i] = dtype == PKV_DTYPE_BF16 ? pkv_float_to_bf16(f) : pkv_float_to_half(f);
    }
}

bool cli_trace_config(int argc, char **argv, const char *family_option, const char *cmd, pkv_trace_config *c) {
    pkv_trace_family fam;
    const char *name = cli_opt(argc, argv, family_option);
    if (pkv_trace_family_parse(name ? name : "bimodal", &fam) != PKV_OK) {
        fprintf(stderr, "pkv %s: %s\n", cmd, pkv_last_error());
        return false;
    }
    pkv_trace_config_default(c, fam);
    c->seed = (uint64_t)cli_opt_int(argc, argv, "--seed", (int64_t)c->seed);
    c->max_active = cli_opt_range(argc, argv, "--batch", c->max_active, 1, 1 << 20);
    if (cli_opt(argc, argv, "--batch") && !cli_opt(argc, argv, "--requests")) c->num_requests = 3 * c->max_active;
    c->num_requests = cli_opt_range(argc, argv, "--requests", c->num_requests, 1, 1 << 24);
    c->page_size = cli_opt_range(argc, argv, "--page-size", c->page_size, 1, 256);
    return true;
}

int32_t cli_step_id(const char **keys, int32_t *n, const char *a, const char *b) {
    int32_t s = 0;
    while (s < *n && (strcmp(keys[2 * s], a) || strcmp(keys[2 * s + 1], b))) s++;
    if (s == *n) {
        keys[2 * s] = a;
        keys[2 * s + 1] = b;
        (*n)++;
    }
    return s;
}

void cli_print_model(FILE *f, const pkv_cost_model *m) {
    const double *c = m->coef;
    fprintf(f, "%.3g us + %.3g us/launch + %.3g (fused) / %.3g (merge kernel) us/MB merged + %.4g us/MB (%.0f GB/s) x "
               "soft-max(p %.3g) of the streamed MB and rho %.4g MB/token x the longest task + %.3g us/MB idle",
            c[PKV_COEF_CONST_US], c[PKV_COEF_LAUNCH_US], c[PKV_COEF_FUSED_MERGE], c[PKV_COEF_MERGE], c[PKV_COEF_US_PER_MB],
            c[PKV_COEF_US_PER_MB] > 0 ? 1e3 / c[PKV_COEF_US_PER_MB] : 0.0, c[PKV_COEF_P], c[PKV_COEF_RHO],
            c[PKV_COEF_IDLE_US_PER_MB]);
}
