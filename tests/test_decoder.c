/* test_decoder.c - the end-to-end decoder (model/pkv_model.h) on the tiny model, CPU backend (and CUDA where
 * a GPU is visible): greedy decoding agrees with a prefill of the whole sequence at every position (teacher
 * forcing: the decode path's K/V and attention against the prefill's causal rows), requests decoded together
 * give the tokens they give alone, forks decode as their source, the step's page table on the device follows
 * the page manager through requests that come, go, fork, move in the batch and change outside the steps, and
 * bad calls are refused. */
#include "pkv_lab.h"
#include "pkv_model.h"
#include "pkv_test.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 12

/* The tiny model's decoder configuration with these sizes (max_len 0: the default). */
static pkv_decoder_config tiny_config(pkv_model_shape *s, int32_t page_size, int64_t num_pages, int32_t max_batch,
                                      int32_t max_requests, int32_t max_len) {
    CHECK_OK(pkv_model_shape_named("tiny", s));
    pkv_decoder_config cfg;
    pkv_decoder_config_default(&cfg, s);
    cfg.page_size = page_size;
    cfg.num_pages = num_pages;
    cfg.max_batch = max_batch;
    cfg.max_requests = max_requests;
    if (max_len > 0) cfg.max_len = max_len;
    return cfg;
}

static void run(pkv_context *ctx, const char *what, int32_t graphs) {
    pkv_model_shape s;
    pkv_decoder_config cfg = tiny_config(&s, 7, 512, 16, 16, 0);
    cfg.graphs = graphs;
    pkv_decoder *d = NULL;
    CHECK_OK(pkv_decoder_create(ctx, &cfg, &d));
    if (!d) return;
    pkv_rng rng;
    pkv_rng_seed(&rng, 99);
    enum { R = 4 };
    const int32_t plen[R] = {5, 23, 1, 40};
    int32_t prompts[R][40 + STEPS + 1], gen[R][STEPS + 1];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < plen[r]; i++) prompts[r][i] = (int32_t)pkv_rng_uniform_int(&rng, 0, s.vocab - 1);
    /* together: prefill each, then STEPS steps of all four */
    int32_t reqs[R] = {0, 1, 2, 3}, tok[R], next[R];
    for (int r = 0; r < R; r++) {
        CHECK_OK(pkv_decoder_prefill(d, reqs[r], prompts[r], plen[r], &gen[r][0], NULL));
        tok[r] = gen[r][0];
    }
    float *logits = (float *)malloc((size_t)R * s.vocab * sizeof(float));
    for (int k = 1; k <= STEPS; k++) {
        CHECK_OK(pkv_decoder_step(d, reqs, tok, R, next, k == STEPS ? logits : NULL));
        for (int r = 0; r < R; r++) tok[r] = gen[r][k] = next[r];
    }
    /* alone: request 3 again as id 8, decoded by itself, the same tokens */
    int32_t t8 = 0, n8 = 0;
    CHECK_OK(pkv_decoder_prefill(d, 8, prompts[3], plen[3], &t8, NULL));
    int same = t8 == gen[3][0];
    for (int k = 1; k <= STEPS; k++) {
        CHECK_OK(pkv_decoder_step(d, (int32_t[]){8}, &t8, 1, &n8, NULL));
        same &= n8 == gen[3][k];
        t8 = n8;
    }
    CHECK_MSG(same, "%s: a request decoded alone gave other tokens than in a batch of four", what);
    /* teacher forcing: the prompt and the generated tokens prefilled at once; the logits of the last
     * position against the batch step's, and every position's argmax is the generated token */
    for (int r = 0; r < R; r++) {
        int32_t full[40 + STEPS + 1];
        memcpy(full, prompts[r], (size_t)plen[r] * 4);
        for (int k = 0; k < STEPS; k++) full[plen[r] + k] = gen[r][k];
        int32_t first = -1;
        float *lf = (float *)malloc((size_t)s.vocab * sizeof(float));
        CHECK_OK(pkv_decoder_prefill(d, 10 + r, full, plen[r] + STEPS, &first, lf));
        CHECK_MSG(first == gen[r][STEPS], "%s: request %d: prefill of the whole sequence gives %d, decoding gave %d",
                  what, r, first, gen[r][STEPS]);
        double num = 0, den = 0;
        for (int v = 0; v < s.vocab; v++) {
            const double dl = lf[v] - logits[(size_t)r * s.vocab + v];
            num += dl * dl;
            den += (double)lf[v] * lf[v];
        }
        CHECK_MSG(sqrt(num / den) < 2e-2, "%s: request %d: logits of prefill and decode differ by %.3g", what, r,
                  sqrt(num / den));
        free(lf);
        CHECK_OK(pkv_decoder_release(d, 10 + r));
    }
    /* a fork decodes as its source (copy-on-write of the shared partial page in every layer) */
    CHECK_OK(pkv_request_fork(pkv_decoder_pool(d), 0, 12)); /* 17 tokens: a partial last page */
    int32_t pair[2] = {0, 12}, ptok[2] = {tok[0], tok[0]}, pnext[2];
    for (int k = 0; k < 3; k++) {
        CHECK_OK(pkv_decoder_step(d, pair, ptok, 2, pnext, NULL));
        CHECK_MSG(pnext[0] == pnext[1], "%s: a fork decoded %d, its source %d", what, pnext[1], pnext[0]);
        ptok[0] = pnext[0], ptok[1] = pnext[1];
    }
    pkv_page_pool_stats st;
    CHECK_OK(pkv_page_pool_get_stats(pkv_decoder_pool(d), &st));
    CHECK(st.cow_copies >= 1);
    pkv_decoder_times t;
    pkv_decoder_last_times(d, &t);
    /* (a step replayed in one graph has its attention inside the replay) */
    CHECK(t.step_us > 0 && ((t.attention_us > 0 && t.gemm_us > 0 && t.append_us > 0) || (graphs && t.graphed_us > 0)));
    /* refusals */
    CHECK_STATUS(pkv_decoder_prefill(d, 13, (int32_t[]){s.vocab}, 1, &t8, NULL), PKV_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(pkv_decoder_step(d, reqs, tok, 0, next, NULL), PKV_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(pkv_decoder_step(d, (int32_t[]){14}, tok, 1, next, NULL), PKV_ERR_UNKNOWN_REQUEST);
    CHECK_STATUS(pkv_decoder_load_weights(d, "/nonexistent/w.bin"), PKV_ERR_IO);
    pkv_decoder *bad = NULL;
    cfg.graphs = 3;
    CHECK_STATUS(pkv_decoder_create(ctx, &cfg, &bad), PKV_ERR_INVALID_ARGUMENT);
    cfg.graphs = 1; /* graph-stable plans are work-queue plans */
    cfg.route = PKV_ROUTE_SPLIT;
    CHECK_STATUS(pkv_decoder_create(ctx, &cfg, &bad), PKV_ERR_UNSUPPORTED);
    CHECK(bad == NULL);
    free(logits);
    pkv_decoder_free(d);
}

/* Decode steps in graphs (cfg.graphs: batch buckets, padded rows, graph-stable plans, on CUDA captured at a bucket's
 * second step and replayed after) against steps op by op on the work queue, whose plans have the same tasks: two
 * decoders of the same weights decode the same requests through batch sizes that move between buckets (1, 2, 3, 4,
 * 5, 7, 8, 6, 12 of a max_batch of 12: a last bucket that is not a power of two), each size for three steps (run,
 * capture, replay) and again later (replays after other buckets); requests leave and come.  Every step's greedy
 * tokens are equal, and its logits: bit for bit on the CPU (the same ops per row), within bf16 GEMM rounding on
 * CUDA (cuBLAS may pick another kernel for more rows). */
static void graphs_match(pkv_context *ctx, const char *what) {
    pkv_model_shape s;
    pkv_decoder_config cfg = tiny_config(&s, 4, 2048, 12, 64, 512);
    cfg.route = PKV_ROUTE_WORKQUEUE;
    pkv_decoder *d[2] = {NULL, NULL};
    for (int g = 0; g < 2; g++) {
        cfg.graphs = g;
        CHECK_OK(pkv_decoder_create(ctx, &cfg, &d[g]));
    }
    if (!d[0] || !d[1]) {
        pkv_decoder_free(d[0]), pkv_decoder_free(d[1]);
        return;
    }
    const bool cuda = pkv_context_backend(ctx) == PKV_BACKEND_CUDA;
    static const int32_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 6, 12, 3, 1, 12, 9};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    pkv_rng rng;
    pkv_rng_seed(&rng, 3636);
    int32_t live[12], tok[12], next[2][12], nlive = 0, next_id = 0, steps = 0, bad_tok = 0;
    double worst = 0.0;
    float *lg[2];
    for (int g = 0; g < 2; g++) lg[g] = (float *)malloc((size_t)12 * s.vocab * sizeof(float));
    for (int k = 0; k < NS; k++) {
        while (nlive > sizes[k]) { /* leave from the middle: the others move up a place */
            const int32_t at = (int32_t)pkv_rng_uniform_int(&rng, 0, nlive - 1);
            for (int g = 0; g < 2; g++) CHECK_OK(pkv_decoder_release(d[g], live[at]));
            memmove(live + at, live + at + 1, (size_t)(nlive - at - 1) * 4);
            memmove(tok + at, tok + at + 1, (size_t)(nlive - at - 1) * 4);
            nlive--;
        }
        while (nlive < sizes[k]) { /* arrivals with prompts of 1..30 tokens */
            const int32_t n = (int32_t)pkv_rng_uniform_int(&rng, 1, 30);
            int32_t prompt[30], first[2];
            for (int32_t i = 0; i < n; i++) prompt[i] = (int32_t)pkv_rng_uniform_int(&rng, 0, s.vocab - 1);
            for (int g = 0; g < 2; g++) CHECK_OK(pkv_decoder_prefill(d[g], next_id, prompt, n, &first[g], NULL));
            CHECK(first[0] == first[1]);
            live[nlive] = next_id++;
            tok[nlive++] = first[0];
        }
        for (int rep = 0; rep < 3; rep++, steps++) {
            for (int g = 0; g < 2; g++) CHECK_OK(pkv_decoder_step(d[g], live, tok, nlive, next[g], lg[g]));
            double num = 0, den = 0;
            for (int64_t i = 0; i < (int64_t)nlive * s.vocab; i++) {
                const double e = (double)lg[1][i] - lg[0][i];
                num += e * e;
                den += (double)lg[0][i] * lg[0][i];
            }
            const double rel = den > 0 ? sqrt(num / den) : 0.0;
            worst = rel > worst ? rel : worst;
            for (int32_t i = 0; i < nlive; i++) bad_tok += next[0][i] != next[1][i];
            memcpy(tok, next[0], (size_t)nlive * 4);
        }
    }
    CHECK_MSG(pkv_plan_graph_signature(pkv_decoder_plan(d[1])) != 0, "%s: steps in graphs not on graph-stable plans", what);
    pkv_decoder_times t;
    pkv_decoder_last_times(d[1], &t);
    printf("%s: graphs against op by op: %d steps, logits rel L2 up to %.3g, %d tokens differ; last step %.0f us graphed\n",
           what, steps, worst, bad_tok, t.graphed_us);
    CHECK_MSG(bad_tok == 0, "%s: %d greedy tokens of steps in graphs differ", what, bad_tok);
    CHECK_MSG(cuda ? worst < 1e-2 : worst == 0.0, "%s: logits of steps in graphs differ by %.3g", what, worst);
    if (cuda)
        CHECK_MSG(t.graphed_us > 0 && t.gemm_us == 0 && t.attention_us == 0, "%s: the last step did not replay its graph",
                  what);
    else
        CHECK(t.graphed_us == 0 && t.gemm_us > 0);
    free(lg[0]), free(lg[1]);
    pkv_decoder_free(d[0]), pkv_decoder_free(d[1]);
}

/* The decode steps' page table on the device against the page manager, step after step, while requests come,
 * go, fork, change places in the batch and are truncated or extended outside the steps: every position's row
 * holds its request's pages (the host half of the step, pkv_decoder_step_host), also after a step that failed
 * part way. */
static void table_churn(pkv_context *ctx, const char *what) {
    pkv_model_shape s;
    pkv_decoder_config cfg = tiny_config(&s, 5, 3000, 8, 64, 400);
    pkv_decoder *d = NULL;
    CHECK_OK(pkv_decoder_create(ctx, &cfg, &d));
    if (!d) return;
    pkv_page_pool *pool = pkv_decoder_pool(d);
    const bool cuda = pkv_context_backend(ctx) == PKV_BACKEND_CUDA;
    int32_t stride = 0;
    const int32_t *table = pkv_decoder_table(d, &stride);
    int32_t *host = (int32_t *)malloc((size_t)cfg.max_batch * stride * sizeof(int32_t));
    int32_t *pages = (int32_t *)malloc((size_t)stride * sizeof(int32_t));
    int32_t live[8], tokens[8] = {0}, n = 0, next_id = 0, bad = 0, steps = 0;
    bool used[64] = {false};
    pkv_rng rng;
    pkv_rng_seed(&rng, 36);
    for (int it = 0; it < 600 && !bad; it++) {
        const int ev = (int)pkv_rng_uniform_int(&rng, 0, 9);
        int32_t len = 0;
        if (ev <= 2 && n < 8) { /* an arrival, or a fork of a live request, at a random place in the batch */
            int32_t id = next_id;
            while (used[id]) id = (id + 1) % 64;
            next_id = (id + 1) % 64;
            if (ev == 2 && n > 0) CHECK_OK(pkv_request_fork(pool, live[pkv_rng_uniform_int(&rng, 0, n - 1)], id));
            else CHECK_OK(pkv_decoder_prefill_synthetic(d, id, (int32_t)pkv_rng_uniform_int(&rng, 1, 60)));
            used[id] = true;
            const int32_t at = (int32_t)pkv_rng_uniform_int(&rng, 0, n);
            live[n++] = live[at];
            live[at] = id;
        } else if (ev == 3 && n > 1) { /* a departure */
            const int32_t at = (int32_t)pkv_rng_uniform_int(&rng, 0, n - 1);
            CHECK_OK(pkv_decoder_release(d, live[at]));
            used[live[at]] = false;
            live[at] = live[--n];
        } else if (ev == 4 && n > 1) { /* two requests change places */
            const int32_t a = (int32_t)pkv_rng_uniform_int(&rng, 0, n - 1);
            const int32_t b = (int32_t)pkv_rng_uniform_int(&rng, 0, n - 1);
            const int32_t t = live[a];
            live[a] = live[b], live[b] = t;
        } else if (ev == 5 && n > 0) { /* outside the steps: a rollback, or tokens added */
            const int32_t r = live[pkv_rng_uniform_int(&rng, 0, n - 1)];
            CHECK_OK(pkv_request_length(pool, r, &len));
            pkv_page_copy c;
            if (pkv_rng_uniform_int(&rng, 0, 1) && len > 1)
                CHECK_OK(pkv_request_truncate(pool, r, (int32_t)pkv_rng_uniform_int(&rng, 1, len - 1)));
            else if (len < 300)
                CHECK_OK(pkv_request_extend(pool, r, (int32_t)pkv_rng_uniform_int(&rng, 1, 12), &c));
        } else if (ev == 6 && n > 0) { /* a step that fails at its last row's pages (longer than max_len) */
            const int32_t r = live[n - 1];
            pkv_page_copy c;
            CHECK_OK(pkv_request_length(pool, r, &len));
            CHECK_OK(pkv_request_extend(pool, r, cfg.max_len + 1 - len, &c));
            CHECK_STATUS(pkv_decoder_step_host(d, live, tokens, n), PKV_ERR_INVALID_ARGUMENT);
            CHECK_OK(pkv_decoder_release(d, r));
            used[r] = false;
            n--;
        }
        for (int32_t i = 0; i < n; i++) { /* long requests leave */
            CHECK_OK(pkv_request_length(pool, live[i], &len));
            if (len >= 350) {
                CHECK_OK(pkv_decoder_release(d, live[i]));
                used[live[i]] = false;
                live[i--] = live[--n];
            }
        }
        if (n == 0) continue;
        CHECK_OK(pkv_decoder_step_host(d, live, tokens, n));
        steps++;
        const size_t bytes = (size_t)n * stride * sizeof(int32_t);
        if (cuda) CHECK_OK(pkv_dev_copy_d2h(ctx, host, table, bytes));
        else memcpy(host, table, bytes);
        for (int32_t i = 0; i < n && !bad; i++) {
            int32_t np = 0;
            CHECK_OK(pkv_request_pages(pool, live[i], pages, stride, &np));
            if (memcmp(host + (size_t)i * stride, pages, (size_t)np * sizeof(int32_t)) != 0) bad = 1;
            CHECK_MSG(!bad, "%s: step %d: position %d's ids on the device are not request %d's %d pages", what, steps,
                      i, live[i], np);
        }
    }
    CHECK(steps > 300);
    free(host), free(pages);
    pkv_decoder_free(d);
}

int main(void) {
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = PKV_BACKEND_CPU;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cc, &ctx));
    if (ctx) run(ctx, "cpu", 0);
    if (ctx) run(ctx, "cpu, graphs", 1);
    if (ctx) graphs_match(ctx, "cpu");
    if (ctx) table_churn(ctx, "cpu");
    pkv_context_free(ctx);
    if (pkv_cuda_available()) {
        cc.backend = PKV_BACKEND_CUDA;
        ctx = NULL;
        CHECK_OK(pkv_context_create(&cc, &ctx));
        if (ctx) run(ctx, "cuda", 0);
        if (ctx) run(ctx, "cuda, graphs", 1);
        if (ctx) graphs_match(ctx, "cuda");
        if (ctx) table_churn(ctx, "cuda");
        pkv_context_free(ctx);
    } else {
        printf("SKIP (part): no CUDA device: the decoder on CUDA not run\n");
    }
    return pkv_test_finish("test_decoder");
}
