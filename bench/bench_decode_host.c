/* bench_decode_host.c - the host's part of a decode step of the end-to-end loop (model/decoder.c), by part,
 * without the model: pkv_decoder_step_host at B = 1, 2, 4, ..., 128 - each request's token
 * (pkv_request_extend), the step's table (the rows' lengths and positions and the page ids that changed), the
 * plan (pkv_plan_step on the lengths), the inputs staged in backend memory, and the scatter of the changed
 * ids (the only device work it queues; on the CPU backend its computing is left out).
 *
 * The decoder runs on a CPU context whose planner plans for an H100's capabilities (132 SMs, 2 tasks per SM in
 * its default wave, 3 resident CTAs per SM at d = 128 and 4 at d = 64, pages of a multiple of 8 tokens read by
 * tensor copies: what the CUDA backend reports there), with Llama-3-8B's attention (32 query heads, 8 KV heads
 * of 128, bf16, pages of 16 tokens) under a one-layer stub of a model; each request starts at a length drawn uniformly in
 * [256, 1280] tokens, grows a token per step and is rolled back by 16 tokens every 16 steps, so the context
 * stays put.  With a policy file (`pkv calibrate`'s, e.g. bench/results/h100.policy) the planner's route
 * comes from that cost model, as on a CUDA context with PKV_POLICY set; without one, from the auto rule.
 * Medians of reps steps per B (after 64 untimed), microseconds; `patched`: the share of those steps whose plan was
 * patched over the last step's (the planner's incremental steps).  --flush-mb M writes M MiB between steps, as a
 * model's layers computed on the host (the CPU backend in `pkv decode`) would, so that each step starts with
 * the host's caches cold; by default they stay warm, as on a GPU machine's host.  --graphs on plans as the
 * decoder's steps in graphs do (pkv_decoder_config.graphs: graph-stable plans for the batch's bucket).
 *
 *   build/bench_decode_host [--reps N] [--batch B] [--flush-mb M] [--policy FILE] [--graphs on|off] [--json FILE]
 *   (Markdown table on stdout; --batch: that B alone) */
#define _POSIX_C_SOURCE 200809L
#include "pkv_lab.h"
#include "pkv_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PARTS 7
static const char *const part_names[PARTS] = {"extend", "table", "plan", "stage", "launch", "host", "call"};

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail(const char *what) {
    fprintf(stderr, "bench_decode_host: %s: %s\n", what, pkv_last_error());
    return 1;
}

int main(int argc, char **argv) {
    int reps = 2000, only_b = 0, flush_mb = 0, step_graphs = 0;
    const char *policy = NULL, *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--policy") == 0 && i + 1 < argc) policy = argv[++i];
        else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) json = argv[++i];
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) only_b = atoi(argv[++i]);
        else if (strcmp(argv[i], "--flush-mb") == 0 && i + 1 < argc) flush_mb = atoi(argv[++i]);
        else if (strcmp(argv[i], "--graphs") == 0 && i + 1 < argc &&
                 (strcmp(argv[i + 1], "on") == 0 || strcmp(argv[i + 1], "off") == 0))
            step_graphs = strcmp(argv[++i], "on") == 0;
        else {
            fprintf(stderr, "usage: bench_decode_host [--reps N] [--batch B] [--flush-mb M] [--policy FILE] [--graphs on|off] "
                            "[--json FILE]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    const size_t flush_bytes = (size_t)(flush_mb > 0 ? flush_mb : 0) << 20;
    unsigned char *flush = flush_bytes ? (unsigned char *)malloc(flush_bytes) : NULL;
    if (flush_bytes && !flush) return fail("flush buffer");
    enum { MAX_B = 128, MIN_LEN = 256, MAX_LEN = 1280, ROLLBACK = 16, WARMUP = 64, PARALLELISM = 132 };
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = PKV_BACKEND_CPU;
    cc.num_threads = 1;
    pkv_context *ctx = NULL;
    if (pkv_context_create(&cc, &ctx) != PKV_OK) return fail("context");
    pkv_lab_caps h100 = {PARALLELISM, 2, {{4, 0}, {3, 0}, {0, 0}}, 8}; /* 0: not needed here */
    if (pkv_lab_context_set_caps(ctx, &h100) != PKV_OK) return fail("capabilities");
    if (policy) {
        pkv_cost_model m;
        if (pkv_cost_model_load(policy, &m) != PKV_OK || pkv_context_set_cost_model(ctx, &m) != PKV_OK)
            return fail(policy);
    }
    /* Llama-3-8B's attention under a one-layer stub of a model (the host path does not depend on the rest) */
    pkv_model_shape s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "attention-of-llama3-8b");
    s.layers = 1, s.hidden = 256, s.q_heads = 32, s.kv_heads = 8, s.head_dim = 128, s.mlp = 256, s.vocab = 256;
    s.rope_theta = 500000.0, s.rms_eps = 1e-5;
    pkv_decoder_config dc;
    pkv_decoder_config_default(&dc, &s);
    dc.max_batch = MAX_B;
    dc.max_requests = MAX_B;
    dc.graphs = step_graphs;
    dc.max_len = MAX_LEN + 2 * ROLLBACK;
    dc.num_pages = (int64_t)MAX_B * ((dc.max_len + dc.page_size - 1) / dc.page_size + 1);
    pkv_decoder *d = NULL;
    if (pkv_decoder_create(ctx, &dc, &d) != PKV_OK) return fail("decoder");
    int32_t reqs[MAX_B], tokens[MAX_B];
    pkv_rng rng;
    pkv_rng_seed(&rng, 36);
    for (int32_t i = 0; i < MAX_B; i++) {
        reqs[i] = i;
        tokens[i] = i % s.vocab;
        if (pkv_decoder_prefill_synthetic(d, i, (int32_t)pkv_rng_uniform_int(&rng, MIN_LEN, MAX_LEN)) != PKV_OK)
            return fail("prefill");
    }
    double *t[PARTS];
    for (int k = 0; k < PARTS; k++) t[k] = (double *)malloc((size_t)reps * sizeof(double));
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) {
        fprintf(stderr, "bench_decode_host: cannot write %s\n", json);
        return 1;
    }
    if (jf)
        fprintf(jf,
                "{\"tool\": \"bench_decode_host\", \"planner\": \"%s\", \"caps\": \"H100 (132 SMs)\", \"flush_mb\": %d, \"graphs\": \"%s\", \"reps\": %d, "
                "\"rows\": [",
                policy ? policy : "auto rule", flush_mb, step_graphs ? "on" : "off", reps);
    printf("## bench_decode_host: the decode step's host part, us (median of %d steps), planner %s, H100's "
           "capabilities, caches %s%s\n\n",
           reps, policy ? policy : "auto rule", flush ? "cold" : "warm",
           step_graphs ? ", graph-stable plans (whole steps in graphs)" : "");
    printf("| B | route | tasks | extend | table | plan | stage | launch | host | call | patched |\n");
    printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int rows = 0;
    const int nsteps = (WARMUP + reps + ROLLBACK - 1) / ROLLBACK * ROLLBACK;
    for (int32_t B = only_b > 0 ? only_b : 1; B <= MAX_B; B = only_b > 0 ? MAX_B + 1 : 2 * B) {
        int patched = 0;
        for (int k = 0; k < nsteps; k++) {
            if (flush) memset(flush, k & 0xff, flush_bytes);
            const double c0 = now_us();
            if (pkv_decoder_step_host(d, reqs, tokens, B) != PKV_OK) return fail("step");
            const double call = now_us() - c0;
            const int rep = k - WARMUP;
            if (rep >= 0 && rep < reps) {
                pkv_decoder_times tm;
                pkv_decoder_last_times(d, &tm);
                const double v[PARTS] = {tm.host_extend_us, tm.host_table_us, tm.host_plan_us, tm.host_stage_us,
                                         tm.host_launch_us, tm.host_us, call};
                for (int p = 0; p < PARTS; p++) t[p][rep] = v[p];
                patched += pkv_lab_plan_patched(pkv_decoder_plan(d));
            }
            if (k % ROLLBACK == ROLLBACK - 1) /* each row back by the tokens it grew */
                for (int32_t i = 0; i < B; i++) {
                    int32_t len = 0;
                    if (pkv_request_length(pkv_decoder_pool(d), reqs[i], &len) != PKV_OK ||
                        pkv_request_truncate(pkv_decoder_pool(d), reqs[i], len - ROLLBACK) != PKV_OK)
                        return fail("rollback");
                }
        }
        double med[PARTS];
        for (int k = 0; k < PARTS; k++) {
            qsort(t[k], (size_t)reps, sizeof(double), cmp_double);
            med[k] = t[k][reps / 2];
        }
        const pkv_plan *plan = pkv_decoder_plan(d);
        const char *route = pkv_route_name(pkv_plan_route(plan));
        printf("| %d | %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f%% |\n", B, route,
               pkv_plan_num_tasks(plan), med[0], med[1], med[2], med[3], med[4], med[5], med[6],
               100.0 * patched / reps);
        if (jf) {
            fprintf(jf, "%s{\"B\": %d, \"route\": \"%s\", \"tasks\": %d", rows++ ? ", " : "", B, route,
                    pkv_plan_num_tasks(plan));
            for (int k = 0; k < PARTS; k++) fprintf(jf, ", \"%s_us\": %.3f", part_names[k], med[k]);
            fprintf(jf, ", \"patched\": %.4f", (double)patched / reps);
            fprintf(jf, "}");
        }
    }
    if (jf) {
        fprintf(jf, "]}\n");
        fclose(jf);
    }
    for (int k = 0; k < PARTS; k++) free(t[k]);
    free(flush);
    pkv_decoder_free(d);
    pkv_context_free(ctx);
    return 0;
}
