/* bench_options.c - what the options of `pkv bench` (parsed in options.c) need of the machine: the
 * context the run measures on, the measuring defaults of its backend, the output files checked
 * writable before anything is measured, and the --policy file. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli.h"

#include <string.h>

/* Defaults of the measuring options: CUDA times many short launches, the CPU backend few long runs. */
#define CUDA_REPS 100
#define CUDA_WARMUP 10
#define CUDA_WALL_REPS 20
#define CPU_REPS 2
#define CPU_WARMUP 0
#define CPU_WALL_REPS 2

/* The context of --backend, --threads and --pdl. */
static int make_context(bench_opts *o) {
    if (pkv_context_create(&o->cc, &o->ctx) != PKV_OK) {
        fprintf(stderr, "%s: %s\n", bench_prog, pkv_last_error());
        return 1;
    }
    o->cuda = pkv_context_backend(o->ctx) == PKV_BACKEND_CUDA;
    return BENCH_GO_ON;
}

/* An output file that cannot be written fails now, not after the measurements (and leaves no new file). */
static int probe_output(const char *path, const char *option) {
    if (!path) return BENCH_GO_ON;
    FILE *existing = fopen(path, "r");
    if (existing) fclose(existing);
    FILE *probe = fopen(path, "a");
    if (!probe) {
        fprintf(stderr, "%s: cannot write %s (%s)\n", bench_prog, path, option);
        return 1;
    }
    fclose(probe);
    if (!existing) remove(path);
    return BENCH_GO_ON;
}

/* --policy: the cost model for auto (set on the context) and --explain. */
static int load_policy(bench_opts *o) {
    if (!o->policy) return BENCH_GO_ON;
    if (pkv_cost_model_load(o->policy, &o->model) != PKV_OK || pkv_context_set_cost_model(o->ctx, &o->model) != PKV_OK) {
        fprintf(stderr, "%s: %s\n", bench_prog, pkv_last_error());
        return 2;
    }
    o->have_policy = true;
    return BENCH_GO_ON;
}

int bench_options_setup(bench_opts *o) {
    int st = make_context(o);
    if (st != BENCH_GO_ON) return st;
    if (o->reps == BENCH_DEFAULT) o->reps = o->cuda ? CUDA_REPS : CPU_REPS;
    if (o->warmup == BENCH_DEFAULT) o->warmup = o->cuda ? CUDA_WARMUP : CPU_WARMUP;
    if (o->wall_reps == BENCH_DEFAULT) o->wall_reps = o->cuda ? CUDA_WALL_REPS : CPU_WALL_REPS;
    if (o->behind && !o->cuda)
        fprintf(stderr, "%s: --behind-producer times CUDA launches; ignored on the CPU backend\n", bench_prog);
    st = probe_output(o->json, "--json");
    if (st == BENCH_GO_ON) st = probe_output(o->calibrate_out, "--calibrate-out");
    if (st == BENCH_GO_ON) st = load_policy(o);
    return st;
}
