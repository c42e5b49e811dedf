/* cli.h - what the pkv tool's subcommands share: model shapes, anchor steps, timing helpers (the option
 * parsers: options.h). */
#ifndef PKV_CLI_H
#define PKV_CLI_H

#include "pkv_lab.h"

#include <stdbool.h>
#include <stdio.h>

/* Model shapes of workloads.md. */
typedef struct pkv_shape {
    const char *name;
    int32_t hq, hkv, d;
    pkv_dtype dtype;
    const char *source;
} pkv_shape;

const pkv_shape *cli_shapes(int *count);

/* The 26 anchor steps (anchors.md): lengths drawn by the documented rule, FlashInfer's best time. */
#define CLI_MAX_ANCHOR_B 64
typedef struct pkv_anchor {
    char name[32];
    int32_t batch;
    int32_t lens[CLI_MAX_ANCHOR_B];
    double flashinfer_us;   /* FlashInfer's best kernel time on the H200, `paper` shape (anchors.md) */
    const char *flashinfer_path;
} pkv_anchor;

int cli_anchor_count(void);
/* Fills a with anchor i (0-based, anchors.md order). */
void cli_anchor_get(int i, pkv_anchor *a);
int cli_anchor_find(const char *name); /* index or -1 */

double cli_now_us(void);
int cli_cmp_double(const void *a, const void *b);
double cli_median(double *v, int n); /* sorts v */
double cli_percentile(double *v, int n, double q); /* v sorted */

/* The id of the step keyed (a, b) in the order steps were first met: keys holds the (a, b) pointer
 * pairs of the *n steps met so far (room for 2 x the rows) and grows by one pair for a new step. */
int32_t cli_step_id(const char **keys, int32_t *n, const char *a, const char *b);

/* Prints a cost model's formula with its coefficients (no newline): what auto predicts from. */
void cli_print_model(FILE *f, const pkv_cost_model *m);

/* Fills buf with random fp16/bf16 values in [-1, 1] (host). */
void cli_fill_random(uint16_t *buf, int64_t n, pkv_dtype dtype, uint64_t seed);
/* Fills buf with n fp8 codes (dtype PKV_DTYPE_FP8_E4M3 or _E5M2) of random values in [-1, 1] divided by scale
 * (pkv_float_to_fp8: nearest even, saturating), so that code x scale lies in about [-1, 1]; a value that
 * rounds to zero takes the smallest code of its sign, so no code is zero (host; pkv_dev_fill_random_fp8 on
 * the device). */
void cli_fill_random_fp8(uint8_t *buf, int64_t n, pkv_dtype dtype, float scale, uint64_t seed);

/* A float in the fewest significant digits (6 to 9) that read back as the same float ("0.05", not
 * "0.0500000007"): repro lines and JSON give back the very value. */
void cli_format_float(char *buf, size_t cap, float x);

/* Element types by name: "fp16", "bf16", "fp8_e4m3", "fp8_e5m2" ("fp32" named, never parsed). */
const char *cli_dtype_name(pkv_dtype d);
bool cli_dtype_parse(const char *name, pkv_dtype *d);
/* A problem's KV cache: fp8 (kv_dtype E4M3 or E5M2), its element type (kv_dtype if fp8, else dtype) and
 * the bytes of one element (1 or 2). */
bool cli_kv_is_fp8(const pkv_problem *p);
pkv_dtype cli_kv_dtype(const pkv_problem *p);
size_t cli_kv_elem_bytes(const pkv_problem *p);

int cmd_bench(int argc, char **argv);
/* pkv bench with its messages prefixed by prog ("pkv calibrate" runs its live measurements so). */
int bench_run(const char *prog, int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_decode(int argc, char **argv);

#endif
