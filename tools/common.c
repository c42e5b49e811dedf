/* common.c - shapes, anchor steps and helpers of the pkv tool (the options: options.c). */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

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

/* pkv_float_to_fp8 by the top 16 bits of a float, where every float of those bits has the same code (rounding
 * is monotonic in the magnitude, so the codes of the least and the greatest such float agree), else FP8_MIXED:
 * the same codes several times faster than a conversion per value. */
#define FP8_MIXED 0xffffu
static uint16_t *fp8_table(int e5m2) {
    uint16_t *t = (uint16_t *)malloc(65536 * sizeof *t);
    if (!t) return NULL;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint32_t lo_bits = i << 16, hi_bits = lo_bits | 0xffffu;
        float lo, hi;
        memcpy(&lo, &lo_bits, sizeof lo);
        memcpy(&hi, &hi_bits, sizeof hi);
        const uint8_t a = pkv_float_to_fp8(lo, e5m2), b = pkv_float_to_fp8(hi, e5m2);
        t[i] = a == b ? a : FP8_MIXED;
    }
    return t;
}

void cli_fill_random_fp8(uint8_t *buf, int64_t n, pkv_dtype dtype, float scale, uint64_t seed) {
    pkv_rng r;
    pkv_rng_seed(&r, seed);
    const int e5m2 = dtype == PKV_DTYPE_FP8_E5M2;
    uint16_t *table = fp8_table(e5m2); /* NULL: a conversion per value */
    for (int64_t i = 0; i < n; i++) {
        const float f = (float)(pkv_rng_uniform01(&r) * 2.0 - 1.0) / scale;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        const uint16_t known = table ? table[bits >> 16] : FP8_MIXED;
        const uint8_t c = known != FP8_MIXED ? (uint8_t)known : pkv_float_to_fp8(f, e5m2);
        buf[i] = (c & 0x7fu) ? c : (uint8_t)(c | 1u); /* +-0: the smallest code of its sign */
    }
    free(table);
}

void cli_format_float(char *buf, size_t cap, float x) {
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, cap, "%.*g", digits, (double)x);
        if ((float)strtod(buf, NULL) == x) return;
    }
}

static const struct {
    pkv_dtype dtype;
    const char *name;
} dtype_names[] = {{PKV_DTYPE_FP16, "fp16"},
                   {PKV_DTYPE_BF16, "bf16"},
                   {PKV_DTYPE_FP8_E4M3, "fp8_e4m3"},
                   {PKV_DTYPE_FP8_E5M2, "fp8_e5m2"},
                   {PKV_DTYPE_FP32, "fp32"}};
#define PARSED_DTYPES 4 /* the first four: fp32 is named, never parsed */

const char *cli_dtype_name(pkv_dtype d) {
    for (size_t k = 0; k < sizeof dtype_names / sizeof dtype_names[0]; k++)
        if (dtype_names[k].dtype == d) return dtype_names[k].name;
    return "unknown";
}

bool cli_dtype_parse(const char *name, pkv_dtype *d) {
    for (int k = 0; name && k < PARSED_DTYPES; k++)
        if (strcmp(dtype_names[k].name, name) == 0) {
            *d = dtype_names[k].dtype;
            return true;
        }
    return false;
}

bool cli_kv_is_fp8(const pkv_problem *p) {
    return p->kv_dtype == PKV_DTYPE_FP8_E4M3 || p->kv_dtype == PKV_DTYPE_FP8_E5M2;
}

pkv_dtype cli_kv_dtype(const pkv_problem *p) { return cli_kv_is_fp8(p) ? p->kv_dtype : p->dtype; }

size_t cli_kv_elem_bytes(const pkv_problem *p) { return cli_kv_is_fp8(p) ? 1 : 2; }

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
