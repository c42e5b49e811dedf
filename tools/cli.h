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

int cmd_bench(int argc, char **argv);
/* pkv bench with its messages prefixed by prog ("pkv calibrate" runs its live measurements so). */
int bench_run(const char *prog, int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_decode(int argc, char **argv);

#endif
