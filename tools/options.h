/* options.h - the option parsers of the pkv tool's subcommands (tools/options.c), apart from the
 * commands so that a fuzzer can drive them (they link with common.c and the lab library only).
 *
 * Each parser reads argv (the arguments after the subcommand) into a plain-data options struct and
 * returns one of cli_parse_status; it never prints, never exits, never opens a file and never creates a
 * context: what needs the machine (the context, the files the options name) is the command's to do
 * after.  On CLI_PARSE_BAD, err holds a one-line message without the "pkv <command>: " prefix.  Safe on
 * any argv (any strings, numbers of any size; argv itself is only read) and reentrant: the options
 * point into argv or hold copies, no static storage.  An option given twice takes its last value. */
#ifndef PKV_OPTIONS_H
#define PKV_OPTIONS_H

#include "cli.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum cli_parse_status {
    CLI_PARSE_GO_ON = 0, /* options read: run the command */
    CLI_PARSE_HELP = 1,  /* --help: print the usage, exit 0 */
    CLI_PARSE_BAD = 2,   /* a bad option: print err, exit 2 */
} cli_parse_status;

/* The exit status of a command that stops at status (CLI_PARSE_GO_ON: -1, go on). */
int cli_parse_exit_code(cli_parse_status status);

/* Room for a parser's message. */
#define CLI_ERR_CAP 512

/* ---- pkv bench ---------------------------------------------------------------------------------- */
#define BENCH_MAX_ROUTES 6 /* auto and the five fixed routes (--route all) */
#define BENCH_MAX_LENS 4096 /* --lens: at most this many lengths */
#define BENCH_MAX_LEN (1 << 30) /* a row's longest (the library's) */
#define BENCH_MAX_SET_BATCHES 16
#define BENCH_MAX_SET_BATCH 4096
#define BENCH_HELDOUT_SEEDS 5
#define BENCH_DEFAULT -1 /* reps, warmup, wall_reps, steps: the backend's default */

typedef enum bench_workload_kind {
    BENCH_WORKLOAD_TRACE,      /* --trace FAMILY (the default: bimodal) */
    BENCH_WORKLOAD_TRACE_FILE, /* --trace-file PATH */
    BENCH_WORKLOAD_ANCHOR,     /* --anchor NAME|all */
    BENCH_WORKLOAD_LENS,       /* --lens N1,N2,... */
    BENCH_WORKLOAD_CALIBRATION_SET,
    BENCH_WORKLOAD_HELDOUT_SET,
} bench_workload_kind;

typedef struct bench_opts {
    /* ---- parsed by bench_options_parse ---- */
    pkv_context_config cc; /* --backend, --threads, --pdl */
    char shape_name[40];   /* a named shape or HQ:HKV:D */
    pkv_problem prob;      /* checked by the library; num_pages set per step; kv_dtype 0 or fp8 */
    float kv_scale;        /* an fp8 cache's per-tensor k_scale = v_scale (--kv-scale; 1 otherwise) */
    pkv_route routes[BENCH_MAX_ROUTES];
    int nroutes;
    int reps, warmup, wall_reps; /* BENCH_DEFAULT until bench_options_setup */
    int32_t ctas_per_unit, min_chunk, parallelism;
    int32_t graph_max_batch, graph_tasks; /* graph-stable plans: capacity (-1: the step's batch rounded up to
                                           * a power of two, as servers capture per batch bucket); 0: off */
    bool check, per_step, quiet, explain;
    bool kv_interleaved; /* K and V of each page side by side in one pool (pkv_tensors.kv_page_stride) */
    bool behind;         /* also time each step behind a kernel that writes its q (pkv_dev_time_plan_behind) */
    int pdl;             /* the context's pkv_context_config.pdl */
    int64_t rotate_bytes;
    const char *json, *policy, *calibrate_out; /* into argv; NULL: not given */
    /* the workload */
    bench_workload_kind workload;
    int anchor; /* --anchor: its index, or -1 for all */
    int32_t lens[BENCH_MAX_LENS];
    int32_t nlens;
    const char *lens_arg;   /* --lens as given (the repro lines) */
    const char *trace_file;
    pkv_trace_config trace; /* --trace, --seed, --batch, --requests, --page-size */
    int32_t steps;          /* --steps (BENCH_DEFAULT: the backend's; 0: all) */
    int32_t step;           /* --step (-1: not given) */
    int32_t set_batches[BENCH_MAX_SET_BATCHES];
    int nset_batches;       /* 0: the backend's */
    int set_seeds;
    char cmdline[1024];     /* the command line, for the JSON */
    /* ---- set up by the command after parsing ---- */
    pkv_context *ctx;
    bool cuda;
    pkv_cost_model model;
    bool have_policy; /* model came from --policy */
} bench_opts;

cli_parse_status bench_options_parse(int argc, char **argv, bench_opts *o, char *err, size_t cap);
void bench_usage(FILE *f);

/* ---- pkv trace ---------------------------------------------------------------------------------- */
typedef struct trace_opts {
    const char *in, *out; /* into argv; NULL: not given */
    pkv_trace_config config;
    int64_t show; /* steps to print; -1: all */
} trace_opts;

cli_parse_status trace_options_parse(int argc, char **argv, trace_opts *o, char *err, size_t cap);
void trace_usage(FILE *f);

/* ---- pkv check ---------------------------------------------------------------------------------- */
typedef struct check_opts {
    pkv_context_config cc;
    int count;
    int32_t max_len;
    uint64_t seed;
} check_opts;

cli_parse_status check_options_parse(int argc, char **argv, check_opts *o, char *err, size_t cap);
void check_usage(FILE *f);

/* ---- pkv calibrate ------------------------------------------------------------------------------ */
typedef struct calibrate_opts {
    const char *out, *from_json, *evaluate, *policy, *json; /* into argv; NULL: not given */
    const char *backend, *reps; /* live: passed on to pkv bench (checked here) */
    int32_t parallelism;        /* 0: the JSON's */
    bool replay_auto;
    bool live; /* none of --from-json, --evaluate, --policy */
} calibrate_opts;

cli_parse_status calibrate_options_parse(int argc, char **argv, calibrate_opts *o, char *err, size_t cap);
void calibrate_usage(FILE *f);

/* ---- pkv decode --------------------------------------------------------------------------------- */
typedef struct decode_opts {
    const char *model;                           /* into argv (checked by the command: model/pkv_model.h) */
    const char *weights, *prompts, *out_tokens, *out_logits, *json; /* into argv; NULL: not given */
    bool exact_prefill;                          /* --prefill exact (default with --prompts), else synthetic */
    pkv_backend_kind backend;
    pkv_trace_family family;
    int32_t layers, batch, requests, steps, page_size, max_new; /* layers, requests, steps 0: the default */
    int64_t pages;                                             /* 0: what the trace needs */
    uint64_t seed;
    pkv_dtype kv_dtype;  /* --kv-dtype: the KV pools' type, 0 for the model's (bf16), or fp8 (E4M3 / E5M2) */
    pkv_dtype kv_compare; /* --kv-compare: the fp8 type run beside a bf16 KV run (0: no comparison) */
    float kv_scale;      /* --kv-scale: an fp8 pool's k_scale = v_scale, real value = stored x scale (default 1) */
    int32_t graphs;      /* --graphs: 1 on, 0 off, -1 not given (on where the backend is CUDA; pkv_decoder_config.graphs) */
} decode_opts;

cli_parse_status decode_options_parse(int argc, char **argv, decode_opts *o, char *err, size_t cap);
void decode_usage(FILE *f);

#endif
