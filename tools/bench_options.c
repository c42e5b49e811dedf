/* bench_options.c - the options of `pkv bench`: usage, parsing and checks into bench_opts, and the
 * context the run measures on.  The checks run in a fixed order, so a command line with several bad
 * options always gets the same message. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <math.h>
#include <string.h>

/* Defaults of the measuring options: CUDA times many short launches, the CPU backend few long runs. */
#define CUDA_REPS 100
#define CUDA_WARMUP 10
#define CUDA_WALL_REPS 20
#define CPU_REPS 2
#define CPU_WARMUP 0
#define CPU_WALL_REPS 2
#define MAX_REPS 1000000
#define DEFAULT_ROTATE_GIB 2.0 /* far more than a GPU's L2: no page of a step is still cached when it comes back */
#define MAX_ROTATE_GIB 1024.0
#define DEFAULT_PAGE_SIZE 16
#define MAX_PAGE_SIZE 256
#define MAX_TOKENS_OPT (1 << 30) /* --window and --min-chunk: a row's length at most */

static void usage(void) {
    printf(
        "usage: pkv bench [options]\n"
        "Replays a trace, the anchor steps or one isolated step and prints a Markdown table.\n\n"
        "backend and route:\n"
        "  --backend best|cpu|cuda   (default best: cuda when a GPU is present)\n"
        "  --route R|all             auto, single, split, bucketed, workqueue, fused or all (default all)\n"
        "  --threads N               CPU backend threads\n"
        "problem:\n"
        "  --shape NAME|HQ:HKV:D     paper (default), g8, g7, mha, d256, d64, g16, or any model's query heads,\n"
        "                            KV heads and head dim (e.g. 48:4:64; fp16 unless --dtype)\n"
        "  --dtype fp16|bf16         (default: the shape's)\n"
        "  --layout nhd|hnd          (default nhd)\n"
        "  --page-size N             (default 16)\n"
        "  --window W                sliding window: each row attends to its last W tokens (default 0: all)\n"
        "  --soft-cap C              logits soft cap (Gemma-2: 50; default 0: none)\n"
        "workload (one of; default: --trace bimodal):\n"
        "  --trace FAMILY            uniform, bimodal, zipf, bucketed, homogeneous\n"
        "      --seed S --batch B --requests N --steps N (CPU default 2) --step S (one step only)\n"
        "  --trace-file PATH         a trace written by `pkv trace --out`\n"
        "  --anchor NAME|all         the anchor steps of anchors.md (paper shape)\n"
        "  --lens N1,N2,...          one isolated step with these lengths\n"
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
        "  --calibration-set         workload: the calibration traces (seed 20260622, five families, several B)\n"
        "  --heldout-set             workload: the held-out traces (seeds 20260623..27, five families, B 1..128)\n"
        "      --set-batches B1,B2.. --set-seeds N (first N of the five)\n"
        "  --behind-producer         also time each step behind a kernel that writes its q (a model layer's order):\n"
        "                            producer alone and producer + step, with a producer that does not and one that\n"
        "                            does trigger its programmatic dependents\n"
        "  --pdl 0|1                 launch the step's kernels as programmatic dependents of the kernel before them\n"
        "                            (pkv_context_config.pdl; default 1)\n"
        "  --no-check                skip the comparison with the float64 reference\n"
        "  --per-step                print every trace step, not only the per-route summary\n"
        "  --json PATH               write every metric as JSON\n");
}

/* Every option of pkv bench (flags with a trailing '!'), for cli_check_options. */
static const char *const known_options[] = {
    "--backend",       "--route",         "--threads",          "--shape",       "--dtype",
    "--layout",        "--page-size",     "--trace",            "--seed",        "--batch",
    "--requests",      "--steps",         "--step",             "--trace-file",  "--anchor",
    "--lens",          "--reps",          "--warmup",           "--wall-reps",   "--rotate-gib",
    "--no-check!",     "--per-step!",     "--json",             "--quiet!",      "--help!",
    "--ctas-per-unit", "--min-chunk",     "--explain!",         "--policy",      "--calibrate-out",
    "--calibration-set!", "--heldout-set!", "--set-batches",    "--set-seeds",   "--parallelism",
    "--kv-interleaved!", "--window",      "--soft-cap",         "--behind-producer!", "--pdl",
    "--graph-max-batch", "--graph-tasks", NULL};

/* The command line, for the JSON. */
static const char *record_cmdline(int argc, char **argv) {
    static char cmdline[1024];
    size_t at = (size_t)snprintf(cmdline, sizeof cmdline, "pkv bench");
    for (int i = 0; i < argc && at < sizeof cmdline; i++)
        at += (size_t)snprintf(cmdline + at, sizeof cmdline - at, " %s", argv[i]);
    return cmdline;
}

/* --backend, --threads and --pdl into a new context. */
static int make_context(int argc, char **argv, bench_opts *o) {
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    if (!cli_context_config(argc, argv, "bench", &cc)) return 2;
    cc.pdl = cli_opt_range(argc, argv, "--pdl", 1, 0, 1);
    o->pdl = cc.pdl;
    if (pkv_context_create(&cc, &o->ctx) != PKV_OK) {
        fprintf(stderr, "pkv bench: %s\n", pkv_last_error());
        return 1;
    }
    o->cuda = pkv_context_backend(o->ctx) == PKV_BACKEND_CUDA;
    return BENCH_GO_ON;
}

/* The problem: --shape, --dtype, --layout, --page-size, --window, --soft-cap. */
static int parse_problem(int argc, char **argv, bench_opts *o) {
    const char *shape = cli_opt(argc, argv, "--shape");
    o->shape = cli_shape_find(shape ? shape : "paper");
    if (!o->shape) {
        fprintf(stderr, "pkv bench: unknown shape '%s'\n", shape);
        return 2;
    }
    pkv_problem_default(&o->prob);
    o->prob.num_qo_heads = o->shape->hq;
    o->prob.num_kv_heads = o->shape->hkv;
    o->prob.head_dim = o->shape->d;
    o->prob.dtype = o->shape->dtype;
    const char *dt = cli_opt(argc, argv, "--dtype");
    const char *lay = cli_opt(argc, argv, "--layout");
    if ((dt && strcmp(dt, "bf16") != 0 && strcmp(dt, "fp16") != 0) ||
        (lay && strcmp(lay, "hnd") != 0 && strcmp(lay, "nhd") != 0)) {
        fprintf(stderr, "pkv bench: --dtype takes fp16 or bf16, --layout nhd or hnd\n");
        return 2;
    }
    if (dt) o->prob.dtype = strcmp(dt, "bf16") == 0 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
    if (lay) o->prob.layout = strcmp(lay, "hnd") == 0 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD;
    o->prob.page_size = cli_opt_range(argc, argv, "--page-size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE);
    o->prob.window = cli_opt_range(argc, argv, "--window", 0, 0, MAX_TOKENS_OPT);
    o->prob.logits_soft_cap = (float)cli_opt_double(argc, argv, "--soft-cap", 0.0);
    if (!(o->prob.logits_soft_cap >= 0.0f) || isinf(o->prob.logits_soft_cap)) { /* a double past float's range too */
        fprintf(stderr, "pkv bench: --soft-cap takes a finite value >= 0 (0: none)\n");
        return 2;
    }
    return BENCH_GO_ON;
}

/* --route: one route, or every route (auto first). */
static int parse_routes(int argc, char **argv, bench_opts *o) {
    const char *route = cli_opt(argc, argv, "--route");
    if (!route || strcmp(route, "all") == 0) {
        static const pkv_route all[BENCH_MAX_ROUTES] = {PKV_ROUTE_AUTO,     PKV_ROUTE_SINGLE,    PKV_ROUTE_SPLIT,
                                                        PKV_ROUTE_BUCKETED, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};
        memcpy(o->routes, all, sizeof all);
        o->nroutes = BENCH_MAX_ROUTES;
        return BENCH_GO_ON;
    }
    if (pkv_route_parse(route, &o->routes[0]) != PKV_OK) {
        fprintf(stderr, "pkv bench: %s\n", pkv_last_error());
        return 2;
    }
    o->nroutes = 1;
    return BENCH_GO_ON;
}

/* An unwritable --json path fails now, not after the measurements (and leaves no new file). */
static int probe_json_path(int argc, char **argv) {
    const char *json_out = cli_opt(argc, argv, "--json");
    if (!json_out) return BENCH_GO_ON;
    FILE *existing = fopen(json_out, "r");
    if (existing) fclose(existing);
    FILE *probe = fopen(json_out, "a");
    if (!probe) {
        fprintf(stderr, "pkv bench: cannot write %s\n", json_out);
        return 1;
    }
    fclose(probe);
    if (!existing) remove(json_out);
    return BENCH_GO_ON;
}

/* How to measure: repetitions, the rotation, the output file, the flags and the planner's options. */
static int parse_measuring(int argc, char **argv, bench_opts *o) {
    o->reps = cli_opt_range(argc, argv, "--reps", o->cuda ? CUDA_REPS : CPU_REPS, 1, MAX_REPS);
    o->warmup = cli_opt_range(argc, argv, "--warmup", o->cuda ? CUDA_WARMUP : CPU_WARMUP, 0, MAX_REPS);
    o->wall_reps = cli_opt_range(argc, argv, "--wall-reps", o->cuda ? CUDA_WALL_REPS : CPU_WALL_REPS, 1, MAX_REPS);
    const double rotate_gib = cli_opt_double(argc, argv, "--rotate-gib", DEFAULT_ROTATE_GIB);
    if (!(rotate_gib >= 0.0 && rotate_gib <= MAX_ROTATE_GIB)) {
        fprintf(stderr, "pkv bench: --rotate-gib takes a value in [0, 1024]\n");
        return 2;
    }
    o->rotate_bytes = (int64_t)(rotate_gib * (double)(1 << 30));
    const int json = probe_json_path(argc, argv);
    if (json != BENCH_GO_ON) return json;
    o->check = !cli_flag(argc, argv, "--no-check");
    o->kv_interleaved = cli_flag(argc, argv, "--kv-interleaved");
    o->behind = cli_flag(argc, argv, "--behind-producer");
    if (o->behind && !o->cuda)
        fprintf(stderr, "pkv bench: --behind-producer times CUDA launches; ignored on the CPU backend\n");
    o->ctas_per_unit = cli_opt_range(argc, argv, "--ctas-per-unit", 0, 0, PKV_MAX_PER_UNIT);
    o->min_chunk = cli_opt_range(argc, argv, "--min-chunk", 0, 0, MAX_TOKENS_OPT);
    o->parallelism = cli_opt_range(argc, argv, "--parallelism", 0, 0, PKV_MAX_PARALLELISM);
    const char *gmb = cli_opt(argc, argv, "--graph-max-batch");
    o->graph_max_batch =
        gmb && strcmp(gmb, "pow2") == 0 ? -1 : cli_opt_range(argc, argv, "--graph-max-batch", 0, 0, PKV_MAX_BATCH);
    o->graph_tasks = cli_opt_range(argc, argv, "--graph-tasks", 0, 0, INT32_MAX / 2);
    o->per_step = cli_flag(argc, argv, "--per-step");
    o->quiet = cli_flag(argc, argv, "--quiet");
    o->explain = cli_flag(argc, argv, "--explain");
    o->calibrate_out = cli_opt(argc, argv, "--calibrate-out");
    return BENCH_GO_ON;
}

/* --policy: the cost model for auto (set on the context) and --explain. */
static int load_policy(int argc, char **argv, bench_opts *o) {
    const char *policy = cli_opt(argc, argv, "--policy");
    if (!policy) return BENCH_GO_ON;
    if (pkv_cost_model_load(policy, &o->model) != PKV_OK || pkv_context_set_cost_model(o->ctx, &o->model) != PKV_OK) {
        fprintf(stderr, "pkv bench: %s\n", pkv_last_error());
        return 2;
    }
    o->have_policy = true;
    return BENCH_GO_ON;
}

int bench_options_parse(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    if (cli_flag(argc, argv, "--help")) {
        usage();
        return 0;
    }
    if (!cli_check_options(argc, argv, known_options, "bench")) return 2;
    o->cmdline = record_cmdline(argc, argv);
    int st = make_context(argc, argv, o);
    if (st == BENCH_GO_ON) st = parse_problem(argc, argv, o);
    if (st == BENCH_GO_ON) st = parse_routes(argc, argv, o);
    if (st == BENCH_GO_ON) st = parse_measuring(argc, argv, o);
    if (st == BENCH_GO_ON) st = load_policy(argc, argv, o);
    return st;
}
