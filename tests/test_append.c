/* test_append.c - pkv_append_kv and pkv_copy_pages on the CPU backend, driven by the page manager.
 *
 * For random shapes (Hkv 1/2/8, d 64/128/256, page sizes 1, 5, 16, 256, NHD and HND, fp16 and bf16):
 * requests are created with prompts, whose K and V are appended in the ragged form; then decode steps
 * extend every request by one token (executing the copy-on-write copies the manager hands out), emit the
 * step's table and append one token per row, in the decode form or FlashInfer's (batch_indices, positions);
 * requests fork (parallel sampling), roll back (truncate) and finish.  Checked: every appended token
 * reads back bitwise equal from the pages (the tokens of the forked parents too, which copy-on-write must
 * keep), and decode attention after the appends (pkv_plan_step + pkv_run) equals the float64 reference on
 * the grown cache.  Then each bad input: its own status and message, and nothing written. */
#include "persistentkv.h"
#include "pkv_lab.h"
#include "pkv_test.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

enum { MAXR = 8, MAXLEN = 700 };

typedef struct scenario {
    pkv_problem p;
    pkv_page_pool *pool;
    uint16_t *k_cache, *v_cache;
    int64_t tok_elems;            /* Hkv x d */
    uint16_t *truth_k[MAXR], *truth_v[MAXR]; /* [MAXLEN, Hkv, d] what each request's tokens must read back */
    int32_t len[MAXR];
    bool live[MAXR];
} scenario;

static pkv_context *g_ctx;

static uint16_t *slot_of(const scenario *s, uint16_t *cache, int32_t page, int32_t slot, int32_t h) {
    const pkv_problem *p = &s->p;
    const int64_t base = (int64_t)page * p->page_size * s->tok_elems;
    return cache + base + (p->layout == PKV_LAYOUT_NHD ? (int64_t)slot * s->tok_elems + (int64_t)h * p->head_dim
                                                        : ((int64_t)h * p->page_size + slot) * p->head_dim);
}

/* Every live request's tokens read back bitwise; returns the mismatches. */
static int64_t read_back(scenario *s) {
    int64_t bad = 0;
    int32_t pages[MAXLEN], n = 0;
    for (int32_t r = 0; r < MAXR; r++) {
        if (!s->live[r]) continue;
        CHECK_OK(pkv_request_pages(s->pool, r, pages, MAXLEN, &n));
        for (int32_t t = 0; t < s->len[r]; t++)
            for (int32_t h = 0; h < s->p.num_kv_heads; h++) {
                const int32_t pg = pages[t / s->p.page_size], sl = t % s->p.page_size;
                const size_t bytes = (size_t)s->p.head_dim * 2;
                bad += memcmp(slot_of(s, s->k_cache, pg, sl, h), s->truth_k[r] + t * s->tok_elems + h * s->p.head_dim, bytes) != 0;
                bad += memcmp(slot_of(s, s->v_cache, pg, sl, h), s->truth_v[r] + t * s->tok_elems + h * s->p.head_dim, bytes) != 0;
            }
    }
    return bad;
}

static void fill(pkv_rng *rng, uint16_t *dst, int64_t n, pkv_dtype dt) {
    for (int64_t e = 0; e < n; e++) dst[e] = pkv_test_random_value(rng, dt);
}

/* Extends request r by n tokens with fresh random K/V in its truth, executing any copy-on-write. */
static pkv_status grow(scenario *s, pkv_rng *rng, int32_t r, int32_t n) {
    pkv_page_copy c;
    pkv_status st = pkv_request_extend(s->pool, r, n, &c);
    if (st != PKV_OK) return st;
    if (c.src_page >= 0) CHECK_OK(pkv_copy_pages(g_ctx, &s->p, &c, 1, s->k_cache, s->v_cache, 0, NULL));
    fill(rng, s->truth_k[r] + (int64_t)s->len[r] * s->tok_elems, n * s->tok_elems, s->p.dtype);
    fill(rng, s->truth_v[r] + (int64_t)s->len[r] * s->tok_elems, n * s->tok_elems, s->p.dtype);
    s->len[r] += n;
    return PKV_OK;
}

/* Appends the last n[i] tokens of each request rows[i] (n[i] = 1 for all: the decode or FlashInfer form by
 * `form`; else ragged). */
static void append_rows(scenario *s, const int32_t *rows, int32_t b, const int32_t *n, int form) {
    int32_t indptr[MAXR + 1], last[MAXR], lens[MAXR], aptr[MAXR + 1], bidx[MAXR * MAXLEN], pos[MAXR * MAXLEN];
    static int32_t indices[MAXR * MAXLEN];
    CHECK_OK(pkv_page_pool_table(s->pool, rows, b, indptr, indices, MAXR * MAXLEN, last, lens));
    int32_t total = 0;
    aptr[0] = 0;
    for (int32_t i = 0; i < b; i++) total += n[i], aptr[i + 1] = total;
    uint16_t *k = (uint16_t *)malloc((size_t)(total + 1) * s->tok_elems * 2);
    uint16_t *v = (uint16_t *)malloc((size_t)(total + 1) * s->tok_elems * 2);
    for (int32_t i = 0; i < b; i++)
        for (int32_t j = 0; j < n[i]; j++) {
            const int32_t r = rows[i], t = s->len[r] - n[i] + j, at = aptr[i] + j;
            memcpy(k + (int64_t)at * s->tok_elems, s->truth_k[r] + (int64_t)t * s->tok_elems, (size_t)s->tok_elems * 2);
            memcpy(v + (int64_t)at * s->tok_elems, s->truth_v[r] + (int64_t)t * s->tok_elems, (size_t)s->tok_elems * 2);
            bidx[at] = i;
            pos[at] = t;
        }
    pkv_append_tensors a = {0};
    a.k = k, a.v = v, a.k_cache = s->k_cache, a.v_cache = s->v_cache;
    a.kv_indptr = indptr, a.kv_page_indices = indices;
    if (form == 0) a.append_indptr = aptr, a.seq_lens = lens;                    /* ragged */
    else if (form == 1) a.kv_last_page_len = last;                               /* decode */
    else a.batch_indices = bidx, a.positions = pos, a.kv_last_page_len = last;   /* FlashInfer's */
    const pkv_status st = pkv_append_kv(g_ctx, &s->p, b, total, &a, NULL);
    CHECK_MSG(st == PKV_OK, "append (form %d, %d rows, %d tokens): %s", form, b, total, pkv_last_error());
    free(k);
    free(v);
}

/* Decode attention over the live requests' grown caches against the float64 reference. */
static void decode_check(scenario *s, pkv_rng *rng, const char *label) {
    int32_t rows[MAXR], b = 0;
    for (int32_t r = 0; r < MAXR; r++)
        if (s->live[r]) rows[b++] = r;
    if (b == 0) return;
    int32_t indptr[MAXR + 1], lens[MAXR];
    static int32_t indices[MAXR * MAXLEN];
    CHECK_OK(pkv_page_pool_table(s->pool, rows, b, indptr, indices, MAXR * MAXLEN, NULL, lens));
    pkv_page_table t = {b, indptr, indices, lens};
    CHECK_OK(pkv_page_pool_check_table(s->pool, rows, &t));
    const int64_t qn = (int64_t)b * s->p.num_qo_heads * s->p.head_dim;
    uint16_t *q = (uint16_t *)malloc((size_t)qn * 2), *o = (uint16_t *)malloc((size_t)qn * 2);
    double *oref = (double *)malloc((size_t)qn * sizeof(double)), *lref = (double *)malloc((size_t)b * s->p.num_qo_heads * sizeof(double));
    float *lse = (float *)malloc((size_t)b * s->p.num_qo_heads * sizeof(float));
    fill(rng, q, qn, s->p.dtype);
    pkv_plan *plan = NULL;
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    CHECK_OK(pkv_plan_create(&plan));
    pkv_status st = pkv_plan_step(g_ctx, &s->p, &t, &opts, plan);
    CHECK_MSG(st == PKV_OK, "%s: plan: %s", label, pkv_last_error());
    const size_t wsb = pkv_plan_workspace_size(plan);
    void *ws = malloc(wsb ? wsb : 1);
    pkv_tensors tt = {.q = q, .k_cache = s->k_cache, .v_cache = s->v_cache, .kv_page_indices = indices, .o = o, .lse = lse};
    if (st == PKV_OK) CHECK_OK(pkv_run(g_ctx, plan, ws, wsb, &tt, NULL));
    CHECK_OK(pkv_reference(&s->p, &t, q, s->k_cache, s->v_cache, oref, lref));
    double num = 0, den = 0;
    for (int64_t e = 0; e < qn; e++) {
        const double x = pkv_test_to_float(o[e], s->p.dtype), d = x - oref[e];
        num += d * d;
        den += oref[e] * oref[e];
    }
    const double rel = sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
    const double tol = s->p.dtype == PKV_DTYPE_BF16 ? PKV_TEST_TOL_O_BF16 : PKV_TEST_TOL_O_FP16;
    CHECK_MSG(rel < tol, "%s: decode after append rel_l2 %.2e (tol %.1e)", label, rel, tol);
    pkv_plan_free(plan);
    free(ws), free(q), free(o), free(oref), free(lref), free(lse);
}

static void run_scenario(pkv_rng *rng, int32_t hkv, int32_t d, int32_t ps, pkv_layout layout, pkv_dtype dt) {
    scenario s;
    memset(&s, 0, sizeof s);
    pkv_problem_default(&s.p);
    s.p.num_kv_heads = hkv, s.p.num_qo_heads = hkv * 4, s.p.head_dim = d, s.p.page_size = ps;
    s.p.layout = layout, s.p.dtype = dt;
    const int32_t num_pages = (MAXR * MAXLEN) / ps + 2 * MAXR;
    s.p.num_pages = num_pages;
    s.tok_elems = (int64_t)hkv * d;
    const int64_t cache_elems = (int64_t)num_pages * ps * s.tok_elems;
    s.k_cache = (uint16_t *)malloc((size_t)cache_elems * 2);
    s.v_cache = (uint16_t *)malloc((size_t)cache_elems * 2);
    for (int64_t e = 0; e < cache_elems; e++) s.k_cache[e] = s.v_cache[e] = pkv_test_nan_bits(dt);
    for (int32_t r = 0; r < MAXR; r++) {
        s.truth_k[r] = (uint16_t *)malloc((size_t)MAXLEN * s.tok_elems * 2);
        s.truth_v[r] = (uint16_t *)malloc((size_t)MAXLEN * s.tok_elems * 2);
    }
    CHECK_OK(pkv_page_pool_create(num_pages, ps, MAXR, &s.pool));
    char label[160];
    snprintf(label, sizeof label, "Hkv=%d d=%d page=%d %s %s", hkv, d, ps, layout == PKV_LAYOUT_HND ? "HND" : "NHD",
             dt == PKV_DTYPE_BF16 ? "bf16" : "fp16");
    /* prompts of 4 requests, appended in the ragged form */
    int32_t rows[MAXR], n[MAXR], b = 0;
    for (int32_t r = 0; r < 4; r++) {
        const int32_t prompt = (int32_t)pkv_rng_uniform_int(rng, 0, 300);
        CHECK_OK(pkv_request_create(s.pool, r, 0));
        s.live[r] = true;
        CHECK_OK(grow(&s, rng, r, prompt));
        rows[b] = r, n[b++] = prompt;
    }
    append_rows(&s, rows, b, n, 0);
    CHECK_MSG(read_back(&s) == 0, "%s: prompts do not read back", label);
    /* decode steps */
    for (int32_t step = 0; step < 40; step++) {
        if (step % 9 == 4) { /* parallel sampling: fork a live request */
            for (int32_t src = 0; src < MAXR; src++) {
                int32_t dst = -1;
                for (int32_t r = 0; r < MAXR; r++)
                    if (!s.live[r]) dst = r;
                if (s.live[src] && dst >= 0 && s.len[src] > 0) {
                    CHECK_OK(pkv_request_fork(s.pool, src, dst));
                    memcpy(s.truth_k[dst], s.truth_k[src], (size_t)s.len[src] * s.tok_elems * 2);
                    memcpy(s.truth_v[dst], s.truth_v[src], (size_t)s.len[src] * s.tok_elems * 2);
                    s.len[dst] = s.len[src];
                    s.live[dst] = true;
                    break;
                }
            }
        }
        if (step % 13 == 7) /* a rollback */
            for (int32_t r = 0; r < MAXR; r++)
                if (s.live[r] && s.len[r] > 3) {
                    CHECK_OK(pkv_request_truncate(s.pool, r, s.len[r] - 3));
                    s.len[r] -= 3;
                    break;
                }
        if (step == 30) /* a request finishes */
            for (int32_t r = 0; r < MAXR; r++)
                if (s.live[r]) {
                    CHECK_OK(pkv_request_free(s.pool, r));
                    s.live[r] = false;
                    break;
                }
        b = 0;
        for (int32_t r = 0; r < MAXR; r++)
            if (s.live[r] && s.len[r] < MAXLEN - 1) {
                CHECK_OK(grow(&s, rng, r, 1));
                rows[b] = r, n[b++] = 1;
            }
        append_rows(&s, rows, b, n, 1 + step % 2);
        if (step % 10 == 9) {
            CHECK_MSG(read_back(&s) == 0, "%s: step %d does not read back", label, step);
            decode_check(&s, rng, label);
        }
    }
    pkv_page_pool_stats st;
    CHECK_OK(pkv_page_pool_get_stats(s.pool, &st));
    CHECK_MSG(st.cow_copies > 0 || ps == 1, "%s: no copy-on-write happened", label);
    pkv_page_pool_free(s.pool);
    for (int32_t r = 0; r < MAXR; r++) free(s.truth_k[r]), free(s.truth_v[r]);
    free(s.k_cache), free(s.v_cache);
}

static uint64_t checksum(const uint16_t *a, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t e = 0; e < n; e++) h = (h ^ a[e]) * 1099511628211ull;
    return h;
}

static void test_errors(void) {
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_kv_heads = 2, p.num_qo_heads = 4, p.head_dim = 64, p.page_size = 4, p.num_pages = 8;
    const int64_t cache = 8 * 4 * 2 * 64;
    uint16_t *kc = (uint16_t *)calloc((size_t)cache, 2), *vc = (uint16_t *)calloc((size_t)cache, 2);
    uint16_t k[3 * 128], v[3 * 128];
    for (int e = 0; e < 3 * 128; e++) k[e] = v[e] = 0x3c00;
    /* two rows: 5 tokens in pages {3, 6}, 2 tokens in page {1} */
    int32_t indptr[3] = {0, 2, 3}, indices[3] = {3, 6, 1}, lens[2] = {5, 2}, last[2] = {1, 2};
    pkv_append_tensors a = {0};
    a.k = k, a.v = v, a.k_cache = kc, a.v_cache = vc, a.kv_indptr = indptr, a.kv_page_indices = indices;
    a.seq_lens = lens;
    CHECK_OK(pkv_append_kv(g_ctx, &p, 2, 2, &a, NULL)); /* decode form */
    const uint64_t sum = checksum(kc, cache) ^ checksum(vc, cache);
    int32_t bidx[3] = {0, 1, 1}, pos[3] = {4, 1, 2}, aptr[3] = {0, 2, 3};
    a.batch_indices = bidx, a.positions = pos;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_BEYOND_LENGTH); /* position 2 of a 2-token row */
    pos[2] = 1;
    bidx[1] = 2;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_INVALID_ARGUMENT); /* row 2 of 2 */
    bidx[1] = 1;
    pos[0] = -1;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_INVALID_ARGUMENT);
    pos[0] = 4;
    a.seq_lens = NULL; /* without lengths, only the pages bound a position */
    pos[1] = 4;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_BEYOND_LENGTH);
    pos[1] = 1;
    indices[1] = 8;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_PAGE_OUT_OF_RANGE);
    indices[1] = 6;
    a.positions = NULL;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_NULL_POINTER);
    a.batch_indices = NULL;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_INVALID_ARGUMENT); /* decode form, 3 tokens */
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 2, &a, NULL), PKV_ERR_NULL_POINTER);     /* no lengths */
    a.append_indptr = aptr, a.kv_last_page_len = last;
    last[1] = 5;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_LENGTH_EXCEEDS_PAGES);
    last[1] = 2;
    aptr[1] = 3, aptr[2] = 3; /* 3 tokens into the 2-token row... no: 3 into row 0, 0 into row 1 */
    a.kv_last_page_len = NULL, a.seq_lens = lens;
    lens[0] = 2;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_BEYOND_LENGTH);
    lens[0] = 5;
    aptr[1] = 4;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_BAD_INDPTR);
    aptr[1] = 2;
    indptr[1] = 4;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_BAD_INDPTR);
    indptr[1] = 2;
    lens[1] = -1;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_NEGATIVE_LENGTH);
    lens[1] = 2;
    CHECK_MSG((checksum(kc, cache) ^ checksum(vc, cache)) == sum, "a failing append wrote into the cache");
    CHECK_OK(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL)); /* the ragged form, now right */
    a.k = NULL;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_NULL_POINTER);
    a.k = k;
    a.k_token_stride = 5;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, 3, &a, NULL), PKV_ERR_INVALID_ARGUMENT);
    a.k_token_stride = 0;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, -1, 3, &a, NULL), PKV_ERR_BATCH_SIZE);
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 2, -3, &a, NULL), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_append_kv(NULL, &p, 2, 3, &a, NULL), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_append_kv(g_ctx, NULL, 2, 3, &a, NULL), PKV_ERR_NULL_POINTER);
    CHECK_OK(pkv_append_kv(g_ctx, &p, 2, 0, &a, NULL)); /* nothing to append */
    /* copies */
    pkv_page_copy c[3] = {{3, 5}, {6, 7}, {1, 2}};
    CHECK_OK(pkv_copy_pages(g_ctx, &p, c, 3, kc, vc, 0, NULL));
    CHECK(memcmp(kc + 5 * 512, kc + 3 * 512, 1024) == 0 && memcmp(vc + 7 * 512, vc + 6 * 512, 1024) == 0);
    c[1].dst_page = 8;
    CHECK_FAILS(pkv_copy_pages(g_ctx, &p, c, 3, kc, vc, 0, NULL), PKV_ERR_PAGE_OUT_OF_RANGE);
    c[1].dst_page = 6;
    CHECK_FAILS(pkv_copy_pages(g_ctx, &p, c, 3, kc, vc, 0, NULL), PKV_ERR_INVALID_ARGUMENT); /* onto itself */
    c[1].dst_page = 5;
    CHECK_FAILS(pkv_copy_pages(g_ctx, &p, c, 3, kc, vc, 0, NULL), PKV_ERR_INVALID_ARGUMENT); /* 5 written twice */
    c[1].dst_page = 3;
    CHECK_FAILS(pkv_copy_pages(g_ctx, &p, c, 3, kc, vc, 0, NULL), PKV_ERR_INVALID_ARGUMENT); /* 3 read and written */
    CHECK_FAILS(pkv_copy_pages(g_ctx, &p, NULL, 3, kc, vc, 0, NULL), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_copy_pages(g_ctx, &p, c, -1, kc, vc, 0, NULL), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_copy_pages(g_ctx, &p, c, 3, kc, vc, 7, NULL), PKV_ERR_INVALID_ARGUMENT);
    free(kc), free(vc);
}

int main(void) {
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 2;
    CHECK_OK(pkv_context_create(&cfg, &g_ctx));
    if (!g_ctx) return pkv_test_finish("test_append");
    test_errors();
    pkv_rng rng;
    pkv_rng_seed(&rng, 3535);
    static const int32_t hkvs[] = {1, 2, 8}, dims[] = {64, 128, 256}, pss[] = {1, 5, 16, 256};
    int cases = 0;
    for (int i = 0; i < 12; i++) {
        const int32_t hkv = hkvs[i % 3], d = dims[(i / 3) % 3], ps = pss[i % 4];
        run_scenario(&rng, hkv, d, ps, i % 2 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD, (i / 2) % 2 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16);
        cases++;
    }
    printf("append: %d scenarios (prompts, 40 decode steps, forks, rollbacks) read back and decoded\n", cases);
    pkv_context_free(g_ctx);
    return pkv_test_finish("test_append");
}
