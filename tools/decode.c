/* decode.c - `pkv decode`: the end-to-end decode loop (model/pkv_model.h) - continuous batching over a trace
 * family (arrivals, prompts, decode lengths, departures) through a model's layers, or greedy generation of
 * given prompts (the check against transformers).  Reports tokens/s, per-step wall time and its split by
 * part, attention's share as the context grows, KV pages in use; Markdown on stdout, JSON with --json,
 * progress on stderr. */
#include "cli.h"
#include "options.h"
#include "pkv_lab.h"
#include "pkv_model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A token id in [0, vocab). */
static bool token_id(const char *s, int32_t vocab, int32_t *out) {
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (!s[0] || *end || errno || v < 0 || v >= vocab) return false;
    *out = (int32_t)v;
    return true;
}

/* The prompts of --prompts: one line of token ids each. */
static int read_prompts(const char *path, int32_t ***out, int32_t **lens, int32_t vocab) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "pkv decode: cannot open %s\n", path);
        return -1;
    }
    int n = 0, cap = 0;
    int32_t **p = NULL, *l = NULL;
    char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            p = (int32_t **)realloc(p, (size_t)cap * sizeof *p);
            l = (int32_t *)realloc(l, (size_t)cap * sizeof *l);
        }
        p[n] = (int32_t *)malloc(sizeof line / 2 * sizeof(int32_t));
        l[n] = 0;
        for (char *s = strtok(line, " ,\t\n"); s; s = strtok(NULL, " ,\t\n")) {
            int32_t t = 0;
            if (!token_id(s, vocab, &t)) {
                fprintf(stderr, "pkv decode: %s line %d: '%s' is not a token id in [0, %d)\n", path, n + 1, s, vocab);
                fclose(f);
                return -1;
            }
            p[n][l[n]++] = t;
        }
        if (l[n] > 0) n++;
        else free(p[n]);
    }
    fclose(f);
    *out = p;
    *lens = l;
    return n;
}

/* --batch random prompts of 16..64 tokens from --seed (when no --prompts file is given). */
static int random_prompts(const decode_opts *o, int32_t vocab, int32_t ***out, int32_t **lens) {
    pkv_rng rng;
    pkv_rng_seed(&rng, o->seed);
    const int n = o->batch;
    int32_t **p = (int32_t **)malloc((size_t)n * sizeof *p), *l = (int32_t *)malloc((size_t)n * sizeof *l);
    for (int r = 0; r < n; r++) {
        l[r] = (int32_t)pkv_rng_uniform_int(&rng, 16, 64);
        p[r] = (int32_t *)malloc((size_t)l[r] * sizeof(int32_t));
        for (int32_t i = 0; i < l[r]; i++) p[r][i] = (int32_t)pkv_rng_uniform_int(&rng, 0, vocab - 1);
    }
    *out = p;
    *lens = l;
    return n;
}

/* The run's prompts (--prompts, else --batch random ones): their count, at most --batch, or minus the exit
 * status after saying why (1: no prompt or an unreadable file, 2: more prompts than --batch). */
static int load_prompts(const decode_opts *o, const pkv_model_shape *s, int32_t ***prompts, int32_t **plen) {
    const int n = o->prompts ? read_prompts(o->prompts, prompts, plen, s->vocab) : random_prompts(o, s->vocab, prompts, plen);
    if (n <= 0) {
        if (n == 0) fprintf(stderr, "pkv decode: %s has no prompt\n", o->prompts);
        return -1;
    }
    if (n > o->batch) {
        fprintf(stderr, "pkv decode: %d prompts, more than --batch %d\n", n, o->batch);
        return -2;
    }
    return n;
}

/* Greedy generation of the prompts (all decoded together), tokens to --out-tokens. */
static int generate(pkv_decoder *d, const decode_opts *o, const pkv_model_shape *s) {
    int32_t **prompts = NULL, *plen = NULL;
    const int n = load_prompts(o, s, &prompts, &plen);
    if (n < 0) return -n;
    int32_t *reqs = malloc((size_t)n * 4), *tok = malloc((size_t)n * 4), *next = malloc((size_t)n * 4);
    int32_t *gen = malloc((size_t)n * (size_t)o->max_new * 4);
    float *logits = o->out_logits ? malloc((size_t)n * (size_t)s->vocab * sizeof(float)) : NULL;
    for (int r = 0; r < n; r++) {
        reqs[r] = r;
        if (pkv_decoder_prefill(d, r, prompts[r], plen[r], &tok[r], logits ? logits + (size_t)r * s->vocab : NULL) !=
            PKV_OK) {
            fprintf(stderr, "pkv decode: prefill of prompt %d: %s\n", r + 1, pkv_last_error());
            return 1;
        }
        gen[(size_t)r * o->max_new] = tok[r];
    }
    const double t0 = cli_now_us();
    for (int k = 1; k < o->max_new; k++) {
        if (pkv_decoder_step(d, reqs, tok, n, next, NULL) != PKV_OK) {
            fprintf(stderr, "pkv decode: step %d: %s\n", k, pkv_last_error());
            return 1;
        }
        for (int r = 0; r < n; r++) tok[r] = gen[(size_t)r * o->max_new + k] = next[r];
    }
    const double wall = (cli_now_us() - t0) / 1e6;
    FILE *f = o->out_tokens ? fopen(o->out_tokens, "w") : stdout;
    if (!f) {
        fprintf(stderr, "pkv decode: cannot write %s\n", o->out_tokens);
        return 1;
    }
    for (int r = 0; r < n; r++) {
        for (int k = 0; k < o->max_new; k++) fprintf(f, "%s%d", k ? " " : "", gen[(size_t)r * o->max_new + k]);
        fputc('\n', f);
    }
    if (f != stdout) fclose(f);
    if (logits) {
        FILE *lf = fopen(o->out_logits, "wb");
        if (!lf || fwrite(logits, sizeof(float), (size_t)n * s->vocab, lf) != (size_t)n * s->vocab) {
            fprintf(stderr, "pkv decode: cannot write %s\n", o->out_logits);
            if (lf) fclose(lf);
            return 1;
        }
        fclose(lf);
        free(logits);
    }
    fprintf(stderr, "pkv decode: %d prompts, %d new tokens each, %s KV, %.1f decode tokens/s\n", n, o->max_new,
            o->kv_dtype ? cli_dtype_name(o->kv_dtype) : "bf16", wall > 0 ? n * (o->max_new - 1) / wall : 0.0);
    return 0;
}

/* Continuous batching over a trace: requests arrive in order, up to --batch are decoded per step, each
 * leaves after its decode length. */
static int serve(pkv_decoder *d, const decode_opts *o, const pkv_model_shape *s, pkv_trace *t, const char *device,
                 bool cuda) {
    const int32_t nreq = pkv_trace_num_requests(t), B = o->batch;
    int32_t *live = malloc((size_t)B * 4), *left = malloc((size_t)nreq * 4), *tok = malloc((size_t)B * 4);
    int32_t *next = malloc((size_t)B * 4), *ctx_len = malloc((size_t)nreq * 4);
    int32_t nlive = 0, arrived = 0, steps = 0;
    int64_t tokens = 0;
    double wall = 0, attn = 0, gemm = 0, append = 0, other = 0, graphed = 0, host = 0, prefill_s = 0;
    const size_t max_steps = (size_t)(o->steps > 0 ? o->steps : 1 << 20);
    double *step_ms = malloc(sizeof(double) * max_steps);
    /* the host part of each step by part (pkv_decoder_times' host_*), then host_us */
    enum { H_EXTEND, H_TABLE, H_PLAN, H_STAGE, H_LAUNCH, H_HOST, H_PARTS };
    static const char *const h_names[H_PARTS] = {"extend", "table", "plan", "stage", "launch", "host"};
    double *h_us[H_PARTS];
    for (int k = 0; k < H_PARTS; k++) h_us[k] = malloc(sizeof(double) * max_steps);
    pkv_rng rng;
    pkv_rng_seed(&rng, o->seed);
    /* attention's share of the step by mean context (buckets of powers of two, 1K .. 128K+) */
    double share_sum[9] = {0}, share_n[9] = {0};
    while ((arrived < nreq || nlive > 0) && (o->steps == 0 || steps < o->steps)) {
        while (nlive < B && arrived < nreq) { /* arrivals */
            int32_t prompt = 0, dec = 0;
            pkv_trace_request(t, arrived, &prompt, &dec);
            const double p0 = cli_now_us();
            pkv_status st;
            int32_t first = 0;
            if (o->exact_prefill) {
                int32_t *ids = malloc((size_t)prompt * 4);
                for (int32_t i = 0; i < prompt; i++) ids[i] = (int32_t)pkv_rng_uniform_int(&rng, 0, s->vocab - 1);
                st = pkv_decoder_prefill(d, arrived, ids, prompt, &first, NULL);
                free(ids);
            } else {
                st = pkv_decoder_prefill_synthetic(d, arrived, prompt);
                first = (int32_t)pkv_rng_uniform_int(&rng, 0, s->vocab - 1);
            }
            prefill_s += (cli_now_us() - p0) / 1e6;
            if (st != PKV_OK) {
                fprintf(stderr, "pkv decode: prefill of request %d (%d tokens): %s\n", arrived, prompt, pkv_last_error());
                return 1;
            }
            live[nlive] = arrived;
            tok[nlive] = first;
            left[arrived] = dec;
            ctx_len[arrived] = prompt;
            nlive++;
            arrived++;
        }
        if (pkv_decoder_step(d, live, tok, nlive, next, NULL) != PKV_OK) {
            fprintf(stderr, "pkv decode: step %d: %s\n", steps, pkv_last_error());
            return 1;
        }
        pkv_decoder_times tm;
        pkv_decoder_last_times(d, &tm);
        double mean_ctx = 0;
        for (int32_t i = 0; i < nlive; i++) mean_ctx += ++ctx_len[live[i]];
        mean_ctx /= nlive;
        int bucket = 0;
        while (bucket < 8 && mean_ctx >= 1024.0 * (1 << (bucket + 1))) bucket++;
        if (tm.graphed_us == 0) { /* a replayed step's attention is inside its graph: the share from steps op by op */
            share_sum[bucket] += tm.attention_us / tm.step_us;
            share_n[bucket]++;
        }
        step_ms[steps] = tm.step_us / 1e3;
        h_us[H_EXTEND][steps] = tm.host_extend_us, h_us[H_TABLE][steps] = tm.host_table_us;
        h_us[H_PLAN][steps] = tm.host_plan_us, h_us[H_STAGE][steps] = tm.host_stage_us;
        h_us[H_LAUNCH][steps] = tm.host_launch_us, h_us[H_HOST][steps] = tm.host_us;
        wall += tm.step_us, attn += tm.attention_us, gemm += tm.gemm_us, append += tm.append_us;
        other += tm.other_us, graphed += tm.graphed_us, host += tm.host_us;
        tokens += nlive;
        steps++;
        for (int32_t i = nlive - 1; i >= 0; i--) { /* departures */
            tok[i] = next[i];
            if (--left[live[i]] <= 0) {
                pkv_decoder_release(d, live[i]);
                live[i] = live[nlive - 1], tok[i] = tok[nlive - 1];
                nlive--;
            }
        }
        if (steps % 50 == 0) fprintf(stderr, "pkv decode: step %d, %d live, %.0f tokens/s\n", steps, nlive, tokens / (wall / 1e6));
    }
    pkv_page_pool_stats ps;
    pkv_page_pool_get_stats(pkv_decoder_pool(d), &ps);
    const double tps = tokens / (wall / 1e6), median = cli_median(step_ms, steps);
    const char *prefill = o->exact_prefill ? "exact" : "synthetic";
    const char *kvt = o->kv_dtype ? cli_dtype_name(o->kv_dtype) : "bf16";
    const double kv_scale = o->kv_dtype ? o->kv_scale : 1.0;
    const int64_t kv_bytes = pkv_decoder_kv_bytes(d);
    const char *mode = !o->graphs ? "no graphs"
                       : cuda     ? "one CUDA graph per step and batch bucket"
                                  : "batch buckets op by op (no graphs on a CPU)";
    printf("## pkv decode: %s (%d layers), %s, B %d, %s prefill, %s KV, %s, on %s\n\n", s->name, s->layers,
           pkv_trace_family_name(o->family), B, prefill, kvt, mode, device);
    printf("| steps | tokens | tokens/s | median step ms | attention | GEMMs | append | other | in graphs | host | peak KV "
           "pages |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    printf("| %d | %lld | %.1f | %.3f | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %lld |\n\n", steps,
           (long long)tokens, tps, median, 100 * attn / wall, 100 * gemm / wall, 100 * append / wall, 100 * other / wall,
           100 * graphed / wall, 100 * host / wall, (long long)ps.peak_used);
    if (o->graphs && cuda)
        printf("in graphs: the replayed steps, attention included (a bucket's first step runs op by op, and is timed by "
               "part)\n\n");
    printf("attention's share of the step by mean context%s:", o->graphs && cuda ? " (the steps run op by op)" : "");
    int shares = 0;
    for (int b = 0; b < 9; b++)
        if (share_n[b] > 0)
            printf(" %s%dK: %.1f%%", b == 8 ? ">=" : "<", 2 << b, 100 * share_sum[b] / share_n[b]), shares++;
    if (!shares) printf(" not measured (every step replayed a graph)");
    printf("\nprefill (%s, counted apart): %.2f s\n", prefill, prefill_s);
    printf("KV pools: %s, scale %g (real value = stored x scale), %.1f MiB in all layers (%lld bytes)\n", kvt, kv_scale,
           (double)kv_bytes / (1 << 20), (long long)kv_bytes);
    /* the host's work per step by part: the mean, and the median (the steady step: the mean also carries the
     * arrivals' whole rows) */
    double h_mean[H_PARTS], h_median[H_PARTS];
    for (int k = 0; k < H_PARTS; k++) {
        h_mean[k] = 0;
        for (int32_t i = 0; i < steps; i++) h_mean[k] += h_us[k][i];
        h_mean[k] /= steps > 0 ? steps : 1;
        h_median[k] = cli_median(h_us[k], steps);
    }
    printf("\nhost per step, us (%d steps; the CPU backend's computing left out):\n\n", steps);
    printf("| | extend | table | plan | stage | launch | host |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    printf("| mean | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", h_mean[0], h_mean[1], h_mean[2], h_mean[3],
           h_mean[4], h_mean[5]);
    printf("| median | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", h_median[0], h_median[1], h_median[2], h_median[3],
           h_median[4], h_median[5]);
    if (o->json) {
        FILE *f = fopen(o->json, "w");
        if (!f) {
            fprintf(stderr, "pkv decode: cannot write %s\n", o->json);
            return 1;
        }
        const char *commit = getenv("PKV_COMMIT");
        fprintf(f, "{\"tool\": \"pkv decode\", \"commit\": \"%s\", \"device\": \"%s\", \"model\": \"%s\", \"layers\": %d, "
                   "\"trace\": \"%s\", \"batch\": %d, \"requests\": %d, \"prefill\": \"%s\", \"steps\": %d, "
                   "\"tokens\": %lld, \"tokens_per_s\": %.2f, \"median_step_ms\": %.4f, \"graphs\": %s, "
                   "\"split_us\": {\"attention\": %.1f, \"gemm\": %.1f, \"append\": %.1f, \"other\": %.1f, "
                   "\"graphed\": %.1f, \"host\": %.1f, \"wall\": %.1f}, "
                   "\"peak_kv_pages\": %lld, \"prefill_s\": %.3f, \"kv_dtype\": \"%s\", \"kv_scale\": %.9g, "
                   "\"kv_bytes\": %lld, ",
                commit ? commit : "unknown", device, s->name, s->layers, pkv_trace_family_name(o->family), B, nreq,
                prefill, steps, (long long)tokens, tps, median, o->graphs ? "true" : "false", attn, gemm, append, other,
                graphed, host, wall,
                (long long)ps.peak_used, prefill_s, kvt, kv_scale, (long long)kv_bytes);
        for (int m = 0; m < 2; m++) {
            fprintf(f, "\"host_us_per_step_%s\": {", m ? "median" : "mean");
            for (int k = 0; k < H_PARTS; k++)
                fprintf(f, "%s\"%s\": %.3f", k ? ", " : "", h_names[k], m ? h_median[k] : h_mean[k]);
            fprintf(f, "}, ");
        }
        fprintf(f, "\"attention_share_by_context\": {");
        int first = 1;
        for (int b = 0; b < 9; b++)
            if (share_n[b] > 0) {
                fprintf(f, "%s\"%s%dK\": %.4f", first ? "" : ", ", b == 8 ? ">=" : "<", 2 << b, share_sum[b] / share_n[b]);
                first = 0;
            }
        fprintf(f, "}}\n");
        fclose(f);
    }
    free(live), free(left), free(tok), free(next), free(ctx_len), free(step_ms);
    for (int k = 0; k < H_PARTS; k++) free(h_us[k]);
    return 0;
}

/* ---- --kv-compare: an fp8 KV cache against bf16 ----------------------------------------------------- */

/* The differences of one step's logits (rows x vocab, ref the bf16 run's): the largest absolute difference, the
 * sums of squares behind the relative L2 (diff^2, ref^2), and the rows whose greedy tokens agree. */
typedef struct cmp_acc {
    double max_abs, diff2, ref2;
    int64_t agree, rows;
} cmp_acc;

static void cmp_add(cmp_acc *a, const float *ref, const float *got, const int32_t *ref_tok, const int32_t *got_tok,
                    int32_t rows, int32_t vocab) {
    for (int64_t i = 0; i < (int64_t)rows * vocab; i++) {
        const double dv = (double)got[i] - (double)ref[i];
        if (fabs(dv) > a->max_abs || dv != dv) a->max_abs = dv != dv ? INFINITY : fabs(dv);
        a->diff2 += dv * dv;
        a->ref2 += (double)ref[i] * ref[i];
    }
    for (int32_t r = 0; r < rows; r++) a->agree += ref_tok[r] == got_tok[r];
    a->rows += rows;
}
static double cmp_rel_l2(const cmp_acc *a) { return a->ref2 > 0 ? sqrt(a->diff2 / a->ref2) : 0.0; }
static double cmp_agreement(const cmp_acc *a) { return a->rows ? (double)a->agree / a->rows : 0.0; }

/* The same prompts, weights and seed through a bf16 KV decoder and an fp8 one (dc: the bf16 one's configuration),
 * both fed the bf16 run's greedy tokens (teacher forcing: the two runs see the same inputs at every step); step 0
 * is the prefill's logits (the first generated token), steps 1 .. max_new - 1 the decode steps'. */
static int kv_compare(pkv_context *ctx, pkv_decoder_config *dc, const decode_opts *o, const pkv_model_shape *s) {
    int32_t **prompts = NULL, *plen = NULL;
    const int n = load_prompts(o, s, &prompts, &plen);
    if (n < 0) return -n;
    if (o->pages == 0) { /* what the prompts and their new tokens hold, a page each to spare */
        int64_t pages = 0;
        for (int r = 0; r < n; r++) pages += (plen[r] + o->max_new + o->page_size - 1) / o->page_size + 1;
        dc->num_pages = pages;
    }
    const char *kvt = cli_dtype_name(o->kv_compare), *device = pkv_context_device_name(ctx);
    pkv_decoder_config dc8 = *dc;
    dc->kv_dtype = (pkv_dtype)0;
    dc->kv_scale = 0.0f;
    dc8.kv_dtype = o->kv_compare;
    dc8.kv_scale = o->kv_scale;
    fprintf(stderr, "pkv decode: %s, %d layers, %d prompts, bf16 KV against %s KV (scale %g), on %s: setting up\n",
            s->name, s->layers, n, kvt, (double)o->kv_scale, device);
    pkv_decoder *dref = NULL, *dq = NULL;
    if (pkv_decoder_create(ctx, dc, &dref) != PKV_OK || pkv_decoder_create(ctx, &dc8, &dq) != PKV_OK ||
        (o->weights && (pkv_decoder_load_weights(dref, o->weights) != PKV_OK ||
                        pkv_decoder_load_weights(dq, o->weights) != PKV_OK))) {
        fprintf(stderr, "pkv decode: %s\n", pkv_last_error());
        pkv_decoder_free(dref);
        pkv_decoder_free(dq);
        return 1;
    }
    const int steps = o->max_new;
    const size_t V = (size_t)s->vocab;
    float *lref = malloc((size_t)n * V * sizeof(float)), *lq = malloc((size_t)n * V * sizeof(float));
    int32_t *reqs = malloc((size_t)n * 4), *tok = malloc((size_t)n * 4), *tq = malloc((size_t)n * 4);
    cmp_acc *per = calloc((size_t)steps, sizeof(cmp_acc)), all = {0};
    int rc = 0;
    for (int r = 0; r < n && rc == 0; r++) {
        reqs[r] = r;
        if (pkv_decoder_prefill(dref, r, prompts[r], plen[r], &tok[r], lref + (size_t)r * V) != PKV_OK ||
            pkv_decoder_prefill(dq, r, prompts[r], plen[r], &tq[r], lq + (size_t)r * V) != PKV_OK) {
            fprintf(stderr, "pkv decode: prefill of prompt %d: %s\n", r + 1, pkv_last_error());
            rc = 1;
        }
    }
    if (rc == 0) cmp_add(&per[0], lref, lq, tok, tq, n, s->vocab);
    int32_t *next = malloc((size_t)n * 4);
    for (int k = 1; k < steps && rc == 0; k++) {
        if (pkv_decoder_step(dref, reqs, tok, n, next, lref) != PKV_OK ||
            pkv_decoder_step(dq, reqs, tok, n, tq, lq) != PKV_OK) { /* both fed the bf16 run's tokens */
            fprintf(stderr, "pkv decode: step %d: %s\n", k, pkv_last_error());
            rc = 1;
            break;
        }
        cmp_add(&per[k], lref, lq, next, tq, n, s->vocab);
        memcpy(tok, next, (size_t)n * 4);
    }
    if (rc == 0) {
        for (int k = 0; k < steps; k++) {
            if (per[k].max_abs > all.max_abs) all.max_abs = per[k].max_abs;
            all.diff2 += per[k].diff2, all.ref2 += per[k].ref2, all.agree += per[k].agree, all.rows += per[k].rows;
        }
        const int64_t b16 = pkv_decoder_kv_bytes(dref), b8 = pkv_decoder_kv_bytes(dq);
        printf("## pkv decode --kv-compare: %s (%d layers), %s KV (scale %g) against bf16 KV, %d prompts, %d steps "
               "teacher-forced, on %s\n\n",
               s->name, s->layers, kvt, (double)o->kv_scale, n, steps, device);
        printf("| step | max abs logit diff | rel L2 of logits | greedy agreement |\n| ---: | ---: | ---: | ---: |\n");
        for (int k = 0; k < steps; k++)
            printf("| %d%s | %.4g | %.4g | %.3f |\n", k, k ? "" : " (prefill)", per[k].max_abs, cmp_rel_l2(&per[k]),
                   cmp_agreement(&per[k]));
        printf("| all | %.4g | %.4g | %.3f |\n\n", all.max_abs, cmp_rel_l2(&all), cmp_agreement(&all));
        printf("greedy agreement: %lld of %lld tokens; KV pools: bf16 %lld bytes, %s %lld bytes\n", (long long)all.agree,
               (long long)all.rows, (long long)b16, kvt, (long long)b8);
        if (o->json) {
            FILE *f = fopen(o->json, "w");
            if (!f) {
                fprintf(stderr, "pkv decode: cannot write %s\n", o->json);
                rc = 1;
            } else {
                const char *commit = getenv("PKV_COMMIT");
                fprintf(f, "{\"tool\": \"pkv decode --kv-compare\", \"commit\": \"%s\", \"device\": \"%s\", \"model\": "
                           "\"%s\", \"layers\": %d, \"kv_dtype\": \"%s\", \"kv_scale\": %.9g, \"reference_kv_dtype\": "
                           "\"bf16\", \"prompts\": %d, \"steps\": %d, \"teacher_forced\": true, \"kv_bytes\": %lld, "
                           "\"reference_kv_bytes\": %lld, \"per_step\": [",
                        commit ? commit : "unknown", device, s->name, s->layers, kvt, (double)o->kv_scale, n, steps,
                        (long long)b8, (long long)b16);
                for (int k = 0; k < steps; k++)
                    fprintf(f, "%s{\"step\": %d, \"max_abs_logit_diff\": %.6g, \"rel_l2\": %.6g, \"agreement\": %.6g}",
                            k ? ", " : "", k, per[k].max_abs, cmp_rel_l2(&per[k]), cmp_agreement(&per[k]));
                fprintf(f, "], \"overall\": {\"max_abs_logit_diff\": %.6g, \"rel_l2\": %.6g, \"agreement\": %.6g, "
                           "\"agreeing_tokens\": %lld, \"tokens\": %lld}}\n",
                        all.max_abs, cmp_rel_l2(&all), cmp_agreement(&all), (long long)all.agree, (long long)all.rows);
                fclose(f);
            }
        }
    }
    for (int r = 0; r < n; r++) free(prompts[r]);
    free(prompts), free(plen), free(lref), free(lq), free(reqs), free(tok), free(tq), free(next), free(per);
    pkv_decoder_free(dref);
    pkv_decoder_free(dq);
    return rc;
}

int cmd_decode(int argc, char **argv) {
    decode_opts o;
    char err[CLI_ERR_CAP];
    const cli_parse_status ps = decode_options_parse(argc, argv, &o, err, sizeof err);
    if (ps == CLI_PARSE_HELP) decode_usage(stdout);
    if (ps == CLI_PARSE_BAD) fprintf(stderr, "pkv decode: %s\n", err);
    if (ps != CLI_PARSE_GO_ON) return cli_parse_exit_code(ps);
    pkv_model_shape s;
    if (pkv_model_shape_named(o.model, &s) != PKV_OK) {
        fprintf(stderr, "pkv decode: %s\n", pkv_last_error());
        return 2;
    }
    if (o.layers > 0) {
        if (o.layers > s.layers) {
            fprintf(stderr, "pkv decode: --layers %d: %s has %d\n", o.layers, s.name, s.layers);
            return 2;
        }
        s.layers = o.layers;
    }
    pkv_trace *t = NULL;
    int64_t pages = o.pages;
    int32_t max_len = 0; /* a request's most tokens: its row of the step's table */
    if (!o.prompts) {
        pkv_trace_config tc;
        pkv_trace_config_default(&tc, o.family);
        tc.seed = o.seed;
        tc.max_active = o.batch;
        tc.num_requests = o.requests > 0 ? o.requests : 3 * o.batch;
        tc.page_size = o.page_size;
        if (pkv_trace_generate(&tc, &t) != PKV_OK) {
            fprintf(stderr, "pkv decode: %s\n", pkv_last_error());
            return 2;
        }
        if (pages == 0) { /* the most pages the live requests hold at once, plus a page each for growth */
            for (int32_t st = 0; st < pkv_trace_num_steps(t); st++) {
                const int32_t *rid = NULL, *len = NULL;
                const int32_t n = pkv_trace_step(t, st, &rid, &len);
                int64_t sum = 0;
                for (int32_t i = 0; i < n; i++) sum += (len[i] + o.page_size - 1) / o.page_size + 1;
                if (sum > pages) pages = sum;
            }
            pages += o.batch;
        }
        for (int32_t r = 0; r < pkv_trace_num_requests(t); r++) {
            int32_t prompt = 0, dec = 0;
            pkv_trace_request(t, r, &prompt, &dec);
            if (prompt + dec + 1 > max_len) max_len = prompt + dec + 1;
        }
    } else {
        if (pages == 0) pages = 65536;
        max_len = 65536 + o.max_new; /* prompts of up to 64K tokens (a line holds fewer) */
    }
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = o.backend;
    pkv_context *ctx = NULL;
    if (pkv_context_create(&cc, &ctx) != PKV_OK) {
        fprintf(stderr, "pkv decode: %s\n", pkv_last_error());
        pkv_trace_free(t);
        return 1;
    }
    if (o.graphs < 0) o.graphs = pkv_context_backend(ctx) == PKV_BACKEND_CUDA; /* the default: graphs on CUDA */
    pkv_decoder_config dc;
    pkv_decoder_config_default(&dc, &s);
    dc.page_size = o.page_size;
    dc.num_pages = pages;
    dc.max_batch = o.batch > 256 ? o.batch : 256; /* prefill chunks of up to 256 rows */
    dc.max_requests = t ? pkv_trace_num_requests(t) : o.batch;
    dc.seed = o.seed;
    dc.max_len = max_len;
    dc.graphs = o.graphs;
    if (o.kv_compare) {
        const int crc = kv_compare(ctx, &dc, &o, &s);
        pkv_trace_free(t);
        pkv_context_free(ctx);
        return crc;
    }
    dc.kv_dtype = o.kv_dtype;
    dc.kv_scale = o.kv_dtype ? o.kv_scale : 0.0f;
    fprintf(stderr, "pkv decode: %s, %d layers, %lld pages of %d tokens per layer, %s KV, on %s: setting up\n", s.name,
            s.layers, (long long)pages, o.page_size, o.kv_dtype ? cli_dtype_name(o.kv_dtype) : "bf16",
            pkv_context_device_name(ctx));
    pkv_decoder *d = NULL;
    if (pkv_decoder_create(ctx, &dc, &d) != PKV_OK || (o.weights && pkv_decoder_load_weights(d, o.weights) != PKV_OK)) {
        fprintf(stderr, "pkv decode: %s\n", pkv_last_error());
        pkv_decoder_free(d);
        pkv_trace_free(t);
        pkv_context_free(ctx);
        return 1;
    }
    const int rc = o.prompts ? generate(d, &o, &s) : serve(d, &o, &s, t, pkv_context_device_name(ctx),
                                                 pkv_context_backend(ctx) == PKV_BACKEND_CUDA);
    pkv_decoder_free(d);
    pkv_trace_free(t);
    pkv_context_free(ctx);
    return rc;
}
