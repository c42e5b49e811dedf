/* test_pages.c - the page manager (src/core/pages.c) against the simple model (lab/pkv_pages_model.h).
 *
 *   random operation sequences: the fuzzer's driver (fuzz/fuzz_pages.c) on seeded random inputs of
 *     thousands of operations each over small pools (exhaustion, copy-on-write and bad ids come often);
 *   a serving loop: thousands of decode steps over a larger pool with arrivals, parallel sampling
 *     (forks), finished requests, speculative rollbacks (truncate) and preemption when the pool runs out;
 *     every step's table emitted, equal to the model's and passing the ownership check;
 *   each bad input with its own status and a message that starts with the status string: unknown
 *     request, double free, extending a freed request, pool exhausted (the pool unchanged), a table
 *     naming a foreign page, too small a capacity, NULL pointers, bad sizes;
 *   LIFO reuse and the counters on a hand-worked example. */
#include "persistentkv.h"
#include "pkv_lab.h"
#include "pkv_pages_model.h"
#include "pkv_test.h"

#include "../fuzz/fuzz_pages.c"

#include <stdbool.h>
#include <string.h>

static void test_random_sequences(void) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 20260635);
    const int inputs = getenv("PKV_FUZZ_CASES") ? atoi(getenv("PKV_FUZZ_CASES")) / 10 + 1 : 80;
    int64_t ops = 0;
    for (int c = 0; c < inputs; c++) {
        const size_t n = 3 + 3 * (size_t)pkv_rng_uniform_int(&rng, 100, 3000);
        uint8_t *buf = (uint8_t *)malloc(n);
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)pkv_rng_next(&rng);
        char why[512] = "";
        const int bad = fuzz_pages_run(buf, n, why, sizeof why);
        CHECK_MSG(!bad, "random input %d (%zu bytes): %s", c, n, why);
        ops += (int64_t)(n - 3) / 3;
        free(buf);
    }
    /* the seed corpus's kinds of input: short, empty, one byte */
    char why[512] = "";
    CHECK(fuzz_pages_run((const uint8_t *)"", 0, why, sizeof why) == 0);
    CHECK(fuzz_pages_run((const uint8_t *)"\x05\x01\x02\x00\x00\x05", 6, why, sizeof why) == 0);
    printf("random sequences: %d inputs, %lld operations against the model\n", inputs, (long long)ops);
}

/* A serving loop over a pool of 384 pages of 16 tokens: every live request decodes one token per step;
 * arrivals with prompts, finishes, parallel sampling by fork, rollbacks; out of pages, the youngest
 * request is preempted (freed) and the step retried. */
static void test_serving_loop(void) {
    enum { PAGES = 384, PS = 16, MAXR = 48, STEPS = 4000 };
    pkv_page_pool *pool = NULL;
    CHECK_OK(pkv_page_pool_create(PAGES, PS, MAXR, &pool));
    pkv_pages_model m;
    CHECK(pkv_pages_model_init(&m, PAGES, PS, MAXR) == 0);
    if (!pool || !m.refs) return;
    pkv_rng rng;
    pkv_rng_seed(&rng, 35);
    int32_t reqs[MAXR], indptr[MAXR + 1], lens[MAXR], last[MAXR], indices[PAGES * MAXR];
    int64_t preempted = 0, forks = 0, cows = 0, steps_ok = 0, arrivals = 0;
    int32_t age[MAXR] = {0};
    int32_t clock = 0;
    bool agree = true;
    for (int step = 0; step < STEPS && agree; step++) {
        /* arrivals */
        if (pkv_rng_uniform01(&rng) < 0.3) {
            for (int32_t r = 0; r < MAXR; r++)
                if (m.state[r] != PKV_MODEL_LIVE) {
                    const int32_t prompt = (int32_t)pkv_rng_uniform_int(&rng, 1, 200);
                    const pkv_status w = pkv_pages_model_create(&m, r, prompt), g = pkv_request_create(pool, r, prompt);
                    CHECK(w == g);
                    if (g == PKV_OK) age[r] = ++clock, arrivals++;
                    break;
                }
        }
        /* parallel sampling: fork a live request into a free id */
        if (pkv_rng_uniform01(&rng) < 0.1) {
            int32_t src = (int32_t)pkv_rng_uniform_int(&rng, 0, MAXR - 1), dst = -1;
            for (int32_t r = 0; r < MAXR; r++)
                if (m.state[r] != PKV_MODEL_LIVE) dst = r;
            if (m.state[src] == PKV_MODEL_LIVE && dst >= 0) {
                CHECK(pkv_pages_model_fork(&m, src, dst) == PKV_OK);
                CHECK_OK(pkv_request_fork(pool, src, dst));
                age[dst] = ++clock;
                forks++;
            }
        }
        /* finishes and rollbacks */
        for (int32_t r = 0; r < MAXR; r++) {
            if (m.state[r] != PKV_MODEL_LIVE) continue;
            const double u = pkv_rng_uniform01(&rng);
            if (u < 0.01) {
                CHECK(pkv_pages_model_free_req(&m, r) == PKV_OK);
                CHECK_OK(pkv_request_free(pool, r));
            } else if (u < 0.02 && m.len[r] > 4) {
                const int32_t to = m.len[r] - (int32_t)pkv_rng_uniform_int(&rng, 1, 4);
                CHECK(pkv_pages_model_truncate(&m, r, to) == PKV_OK);
                CHECK_OK(pkv_request_truncate(pool, r, to));
            }
        }
        /* the decode step: one token per live request, preempting the youngest when out of pages */
        for (int32_t r = 0; r < MAXR; r++) {
            if (m.state[r] != PKV_MODEL_LIVE) continue;
            for (;;) {
                pkv_page_copy cw, cg;
                const pkv_status w = pkv_pages_model_extend(&m, r, 1, &cw), g = pkv_request_extend(pool, r, 1, &cg);
                CHECK_MSG(w == g, "step %d: extend of %d returned %d, the model %d", step, r, (int)g, (int)w);
                CHECK(cw.src_page == cg.src_page && cw.dst_page == cg.dst_page);
                if (g == PKV_OK) {
                    cows += cg.src_page >= 0;
                    break;
                }
                if (g != PKV_ERR_POOL_EXHAUSTED) {
                    agree = false;
                    break;
                }
                int32_t victim = -1;
                for (int32_t v = 0; v < MAXR; v++)
                    if (m.state[v] == PKV_MODEL_LIVE && (victim < 0 || age[v] > age[victim])) victim = v;
                CHECK(pkv_pages_model_free_req(&m, victim) == PKV_OK);
                CHECK_OK(pkv_request_free(pool, victim));
                preempted++;
                if (victim == r) break;
            }
        }
        /* the step's table */
        int32_t b = 0;
        for (int32_t r = 0; r < MAXR; r++)
            if (m.state[r] == PKV_MODEL_LIVE) reqs[b++] = r;
        int64_t n = -1;
        CHECK_OK(pkv_page_pool_table_size(pool, reqs, b, &n));
        CHECK_OK(pkv_page_pool_table(pool, reqs, b, indptr, indices, (int64_t)(sizeof indices / sizeof indices[0]),
                                     last, lens));
        int32_t at = 0;
        for (int32_t i = 0; i < b; i++) {
            const int32_t r = reqs[i];
            const bool row_ok = indptr[i] == at && indptr[i + 1] - at == m.npages[r] && lens[i] == m.len[r] &&
                                last[i] == m.len[r] - (m.npages[r] - 1) * PS &&
                                memcmp(indices + at, m.pages[r], (size_t)m.npages[r] * sizeof(int32_t)) == 0;
            if (!row_ok) agree = false;
            at += m.npages[r];
        }
        CHECK_MSG(agree && n == at, "step %d: the table differs from the model's", step);
        pkv_page_table t = {b, indptr, indices, lens};
        CHECK_OK(pkv_page_pool_check_table(pool, reqs, &t));
        if (step % 16 == 0 || step == STEPS - 1) {
            char why[512];
            const int bad = pkv_pages_model_compare(&m, pool, why, sizeof why);
            CHECK_MSG(!bad, "step %d: %s", step, why);
            if (bad) agree = false;
        }
        steps_ok += agree;
    }
    pkv_page_pool_stats st;
    CHECK_OK(pkv_page_pool_get_stats(pool, &st));
    CHECK(steps_ok == STEPS);
    CHECK_MSG(preempted > 0 && forks > 0 && cows > 0 && st.peak_used == PAGES,
              "the loop should exhaust the pool, fork and copy: preempted %lld forks %lld copies %lld peak %lld",
              (long long)preempted, (long long)forks, (long long)cows, (long long)st.peak_used);
    printf("serving loop: %d steps, %lld arrivals, %lld forks, %lld copy-on-write, %lld preempted, peak %lld pages\n",
           STEPS, (long long)arrivals, (long long)forks, (long long)cows, (long long)preempted, (long long)st.peak_used);
    pkv_page_pool_free(pool);
    pkv_pages_model_free(&m);
}

/* LIFO reuse, copy-on-write and every counter on a worked example (page size 4, 8 pages). */
static void test_worked_example(void) {
    pkv_page_pool *pool = NULL;
    CHECK_OK(pkv_page_pool_create(8, 4, 4, &pool));
    if (!pool) return;
    int32_t pages[8], n = 0;
    pkv_page_pool_stats st;
    CHECK_OK(pkv_request_create(pool, 0, 6)); /* pages 0, 1; 2 slots unused */
    CHECK_OK(pkv_request_create(pool, 1, 4)); /* page 2; full */
    CHECK_OK(pkv_request_pages(pool, 0, pages, 8, &n));
    CHECK(n == 2 && pages[0] == 0 && pages[1] == 1);
    CHECK_OK(pkv_page_pool_get_stats(pool, &st));
    CHECK(st.pages_used == 3 && st.pages_free == 5 && st.fragmentation == 2 && st.tokens == 10 && st.live_requests == 2);
    pkv_page_copy c;
    CHECK_OK(pkv_request_extend(pool, 1, 1, &c)); /* request 1 full: a new page 3 */
    CHECK(c.src_page == -1 && c.dst_page == -1);
    CHECK_OK(pkv_request_free(pool, 0)); /* releases 1 then 0: page 0 is handed out next */
    CHECK_OK(pkv_request_create(pool, 2, 1));
    CHECK_OK(pkv_request_pages(pool, 2, pages, 8, &n));
    CHECK(n == 1 && pages[0] == 0);
    /* fork request 1 (pages 2, 3; 5 tokens): both shared; extending the fork copies page 3 */
    CHECK_OK(pkv_request_fork(pool, 1, 3));
    CHECK(pkv_page_pool_page_refs(pool, 2) == 2 && pkv_page_pool_page_refs(pool, 3) == 2);
    CHECK_OK(pkv_page_pool_get_stats(pool, &st));
    CHECK(st.pages_shared == 2 && st.pages_used == 3 && st.fragmentation == 3 + 3 + 3);
    CHECK_OK(pkv_request_extend(pool, 3, 1, &c));
    CHECK(c.src_page == 3 && c.dst_page == 1); /* page 1 was on top of the free stack */
    /* the fork's pages from its last one on: the copy in place of page 3 */
    int32_t tail[2] = {-9, -9};
    CHECK_OK(pkv_request_pages_from(pool, 3, 1, tail, 2, &n));
    CHECK(n == 2 && tail[0] == 1 && tail[1] == -9);
    CHECK_OK(pkv_request_pages_from(pool, 3, 2, NULL, 0, &n)); /* nothing past the end */
    CHECK(n == 2);
    CHECK_FAILS(pkv_request_pages_from(pool, 3, 3, tail, 2, &n), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_request_pages_from(pool, 3, -1, tail, 2, &n), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_request_pages_from(pool, 3, 0, tail, 1, &n), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_request_pages_from(pool, 3, 0, NULL, 4, &n), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_request_pages_from(pool, 77, 0, tail, 2, &n), PKV_ERR_UNKNOWN_REQUEST);
    CHECK(pkv_page_pool_page_refs(pool, 3) == 1 && pkv_page_pool_page_refs(pool, 1) == 1);
    CHECK_OK(pkv_request_extend(pool, 1, 1, &c)); /* page 3 is request 1's alone now: no copy */
    CHECK(c.src_page == -1);
    CHECK_OK(pkv_page_pool_get_stats(pool, &st));
    CHECK(st.pages_shared == 1 && st.cow_copies == 1 && st.pages_used == 4 && st.peak_used == 4);
    /* truncate into the shared page 2, then extend: a copy of page 2 */
    CHECK_OK(pkv_request_truncate(pool, 3, 2));
    CHECK(pkv_page_pool_page_refs(pool, 1) == 0);
    CHECK_OK(pkv_request_extend(pool, 3, 1, &c));
    CHECK(c.src_page == 2 && c.dst_page == 1);
    CHECK_OK(pkv_page_pool_get_stats(pool, &st));
    CHECK(st.pages_shared == 0 && st.cow_copies == 2 && st.tokens == 6 + 1 + 3);
    /* the table of requests 1, 2, 3 */
    const int32_t reqs[3] = {1, 2, 3};
    int32_t indptr[4], indices[8], last[3], lens[3];
    int64_t need = 0;
    CHECK_OK(pkv_page_pool_table_size(pool, reqs, 3, &need));
    CHECK(need == 4);
    CHECK_OK(pkv_page_pool_table(pool, reqs, 3, indptr, indices, 8, last, lens));
    CHECK(indptr[0] == 0 && indptr[1] == 2 && indptr[2] == 3 && indptr[3] == 4);
    CHECK(indices[0] == 2 && indices[1] == 3 && indices[2] == 0 && indices[3] == 1);
    CHECK(last[0] == 2 && last[1] == 1 && last[2] == 3 && lens[0] == 6 && lens[1] == 1 && lens[2] == 3);
    pkv_page_pool_free(pool);
}

static void test_errors(void) {
    pkv_page_pool *pool = NULL;
    CHECK_FAILS(pkv_page_pool_create(0, 16, 4, &pool), PKV_ERR_INVALID_ARGUMENT);
    CHECK(pool == NULL);
    CHECK_FAILS(pkv_page_pool_create(8, 0, 4, &pool), PKV_ERR_PAGE_SIZE);
    CHECK_FAILS(pkv_page_pool_create(8, 257, 4, &pool), PKV_ERR_PAGE_SIZE);
    CHECK_FAILS(pkv_page_pool_create(8, 16, 0, &pool), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_page_pool_create(8, 16, 4, NULL), PKV_ERR_NULL_POINTER);
    CHECK_OK(pkv_page_pool_create(4, 16, 4, &pool));
    if (!pool) return;
    pkv_page_copy c;
    int32_t len = 0;
    /* unknown requests: outside the ids, never created */
    CHECK_FAILS(pkv_request_extend(pool, 7, 1, &c), PKV_ERR_UNKNOWN_REQUEST);
    CHECK_FAILS(pkv_request_extend(pool, -1, 1, &c), PKV_ERR_UNKNOWN_REQUEST);
    CHECK_FAILS(pkv_request_free(pool, 2), PKV_ERR_UNKNOWN_REQUEST);
    CHECK_FAILS(pkv_request_length(pool, 3, &len), PKV_ERR_UNKNOWN_REQUEST);
    CHECK_FAILS(pkv_request_create(pool, 4, 1), PKV_ERR_UNKNOWN_REQUEST);
    /* double free, extending / truncating / forking a freed request */
    CHECK_OK(pkv_request_create(pool, 0, 20));
    CHECK_FAILS(pkv_request_create(pool, 0, 20), PKV_ERR_INVALID_ARGUMENT); /* live */
    CHECK_OK(pkv_request_free(pool, 0));
    CHECK_FAILS(pkv_request_free(pool, 0), PKV_ERR_REQUEST_FREED);
    CHECK_FAILS(pkv_request_extend(pool, 0, 1, &c), PKV_ERR_REQUEST_FREED);
    CHECK_FAILS(pkv_request_truncate(pool, 0, 0), PKV_ERR_REQUEST_FREED);
    CHECK_FAILS(pkv_request_fork(pool, 0, 1), PKV_ERR_REQUEST_FREED);
    CHECK_FAILS(pkv_request_length(pool, 0, &len), PKV_ERR_REQUEST_FREED);
    const int32_t freed = 0;
    int64_t n = 0;
    CHECK_FAILS(pkv_page_pool_table_size(pool, &freed, 1, &n), PKV_ERR_REQUEST_FREED);
    /* bad lengths */
    CHECK_FAILS(pkv_request_create(pool, 1, -1), PKV_ERR_NEGATIVE_LENGTH);
    CHECK_FAILS(pkv_request_create(pool, 1, (1 << 30) + 1), PKV_ERR_INVALID_ARGUMENT);
    CHECK_OK(pkv_request_create(pool, 1, 17)); /* 2 pages */
    CHECK_FAILS(pkv_request_truncate(pool, 1, 18), PKV_ERR_BEYOND_LENGTH);
    CHECK_FAILS(pkv_request_truncate(pool, 1, -3), PKV_ERR_NEGATIVE_LENGTH);
    CHECK_FAILS(pkv_request_extend(pool, 1, -1, &c), PKV_ERR_INVALID_ARGUMENT);
    /* pool exhausted: a clear status, the pool unchanged */
    pkv_page_pool_stats before, after;
    CHECK_OK(pkv_page_pool_get_stats(pool, &before));
    CHECK_FAILS(pkv_request_extend(pool, 1, 48, &c), PKV_ERR_POOL_EXHAUSTED); /* needs 3 more, 2 free */
    CHECK_FAILS(pkv_request_create(pool, 2, 33), PKV_ERR_POOL_EXHAUSTED);
    CHECK_OK(pkv_page_pool_get_stats(pool, &after));
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    CHECK_OK(pkv_request_length(pool, 1, &len));
    CHECK(len == 17);
    /* a shared partial last page needs somewhere to put its copy */
    CHECK_OK(pkv_request_fork(pool, 1, 2));
    CHECK_FAILS(pkv_request_fork(pool, 1, 2), PKV_ERR_INVALID_ARGUMENT); /* dst live */
    CHECK_FAILS(pkv_request_extend(pool, 2, 1, NULL), PKV_ERR_NULL_POINTER);
    CHECK_OK(pkv_request_extend(pool, 2, 1, &c));
    CHECK(c.src_page >= 0 && c.dst_page >= 0 && c.src_page != c.dst_page);
    /* tables: a foreign page, too small a capacity, length beyond the request's */
    const int32_t reqs[2] = {1, 2};
    int32_t indptr[3], indices[8], lens[2];
    CHECK_FAILS(pkv_page_pool_table(pool, reqs, 2, indptr, indices, 3, NULL, lens), PKV_ERR_INVALID_ARGUMENT);
    CHECK_OK(pkv_page_pool_table(pool, reqs, 2, indptr, indices, 8, NULL, lens));
    pkv_page_table t = {2, indptr, indices, lens};
    CHECK_OK(pkv_page_pool_check_table(pool, reqs, &t));
    const int32_t swapped[2] = {2, 1};
    CHECK_FAILS(pkv_page_pool_check_table(pool, swapped, &t), PKV_ERR_FOREIGN_PAGE); /* row 0 names 1's copy page */
    const int32_t own = indices[3];
    indices[3] = indices[1]; /* request 2's last page replaced by request 1's */
    CHECK_FAILS(pkv_page_pool_check_table(pool, reqs, &t), PKV_ERR_FOREIGN_PAGE);
    indices[3] = own;
    lens[1] = 19;
    CHECK_FAILS(pkv_page_pool_check_table(pool, reqs, &t), PKV_ERR_BEYOND_LENGTH);
    lens[1] = 18;
    indices[0] = 9;
    CHECK_FAILS(pkv_page_pool_check_table(pool, reqs, &t), PKV_ERR_PAGE_OUT_OF_RANGE);
    const int32_t unknown[2] = {1, 3};
    CHECK_FAILS(pkv_page_pool_check_table(pool, unknown, &t), PKV_ERR_PAGE_OUT_OF_RANGE); /* the shape first */
    indices[0] = 0; /* request 1's first page again */
    CHECK_OK(pkv_page_pool_check_table(pool, reqs, &t));
    CHECK_FAILS(pkv_page_pool_check_table(pool, unknown, &t), PKV_ERR_UNKNOWN_REQUEST);
    /* NULL pointers and bad sizes */
    CHECK_FAILS(pkv_request_create(NULL, 0, 1), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_request_extend(NULL, 0, 1, &c), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_request_length(pool, 1, NULL), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_request_pages(pool, 1, NULL, 4, &len), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_request_pages(pool, 1, indices, 1, &len), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_page_pool_table(pool, NULL, 2, indptr, indices, 8, NULL, NULL), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_page_pool_table(pool, reqs, -1, indptr, indices, 8, NULL, NULL), PKV_ERR_BATCH_SIZE);
    CHECK_FAILS(pkv_page_pool_table(pool, reqs, 2, NULL, indices, 8, NULL, NULL), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_page_pool_table_size(pool, reqs, 2, NULL), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_page_pool_get_stats(NULL, &after), PKV_ERR_NULL_POINTER);
    CHECK_FAILS(pkv_page_pool_check_table(pool, reqs, NULL), PKV_ERR_NULL_POINTER);
    CHECK(pkv_page_pool_page_refs(NULL, 0) == -1 && pkv_page_pool_page_refs(pool, 4) == -1 &&
          pkv_page_pool_page_refs(pool, -1) == -1);
    CHECK_OK(pkv_page_pool_table(pool, reqs, 0, indptr, NULL, 0, NULL, NULL)); /* an empty step */
    CHECK(indptr[0] == 0);
    pkv_page_pool_free(pool);
}

int main(void) {
    test_worked_example();
    test_errors();
    test_random_sequences();
    test_serving_loop();
    return pkv_test_finish("test_pages");
}
