/* cli.h - what the pkv tool's subcommands share: option parsing, model shapes, anchor steps. */
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

const pkv_shape *cli_shape_find(const char *name);
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

/* Options: "--name value" pairs; returns the value or NULL. */
const char *cli_opt(int argc, char **argv, const char *name);
bool cli_flag(int argc, char **argv, const char *name);
/* Rejects options not in the NULL-terminated list (flags listed with a trailing '!'). */
bool cli_check_options(int argc, char **argv, const char *const *known, const char *cmd);
int64_t cli_opt_int(int argc, char **argv, const char *name, int64_t def);
/* An int32 option that must lie in [lo, hi] (else a message and exit 2). */
int32_t cli_opt_range(int argc, char **argv, const char *name, int64_t def, int64_t lo, int64_t hi);
double cli_opt_double(int argc, char **argv, const char *name, double def);
/* The context options of the commands that make one: --backend (best, cpu or cuda) and --threads into cc;
 * false (with a message naming cmd) for an unknown backend. */
bool cli_context_config(int argc, char **argv, const char *cmd, pkv_context_config *cc);

/* A trace config from --<family_option> NAME, --seed, --batch (then 3 x B requests), --requests and
 * --page-size; prints the error and returns false on an unknown family. */
bool cli_trace_config(int argc, char **argv, const char *family_option, const char *cmd, pkv_trace_config *c);

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
int cmd_check(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);

#endif
