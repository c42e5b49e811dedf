/* bench_pages.c - the host cost of the page manager's decode step: one pkv_request_extend per row and the
 * step's table (pkv_page_pool_table: indptr, page ids, last-page lengths, lengths), for 64 and 256 rows at
 * several context lengths, on a pool of 16-token pages whose free list was shuffled by earlier requests (a
 * warm pool, as in serving).  Medians of repeated runs, in ns per call and per 64 rows.
 *
 *   build-cpu/bench_pages [reps]        (Markdown table on stdout) */
#define _POSIX_C_SOURCE 200809L
#include "persistentkv.h"
#include "pkv_lab.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 2000;
    const int32_t ps = 16;
    static const int32_t batches[] = {64, 256}, lens[] = {128, 512, 2048, 8192};
    printf("| rows | tokens per row | pages per row | table ns | table ns per 64 rows | extend+table ns per 64 rows | "
           "O(B) changes ns per 64 rows |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    double *t_table = (double *)malloc((size_t)reps * sizeof(double)), *t_step = (double *)malloc((size_t)reps * sizeof(double));
    double *t_delta = (double *)malloc((size_t)reps * sizeof(double));
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int32_t B = batches[bi], len = lens[li];
            const int64_t pages = (int64_t)B * (len / ps + 8) * 2;
            pkv_page_pool *pool = NULL;
            if (pkv_page_pool_create(pages, ps, 2 * B, &pool) != PKV_OK) return 1;
            /* warm the free list: requests of mixed lengths come and go */
            pkv_rng rng;
            pkv_rng_seed(&rng, 7);
            for (int32_t r = 0; r < 2 * B; r++) pkv_request_create(pool, r, (int32_t)pkv_rng_uniform_int(&rng, 1, len));
            for (int32_t r = 0; r < 2 * B; r += 2) pkv_request_free(pool, r);
            int32_t *reqs = (int32_t *)malloc((size_t)B * sizeof(int32_t));
            for (int32_t i = 0; i < B; i++) {
                reqs[i] = 2 * i;
                pkv_request_create(pool, reqs[i], len - ps / 2);
            }
            int64_t cap = 0;
            pkv_page_pool_table_size(pool, reqs, B, &cap);
            cap += B * 2 + (int64_t)reps / ps * B + B;
            int32_t *indptr = (int32_t *)malloc((size_t)(B + 1) * 4), *idx = (int32_t *)malloc((size_t)cap * 4);
            int32_t *last = (int32_t *)malloc((size_t)B * 4), *sl = (int32_t *)malloc((size_t)B * 4);
            /* the O(B) path (docs/pages.md): per row its length and its pages from the last one known on */
            int32_t *known = (int32_t *)malloc((size_t)B * 4), *pairs = (int32_t *)malloc((size_t)B * 4 * 4);
            for (int32_t i = 0; i < B; i++) pkv_request_pages(pool, reqs[i], NULL, 0, &known[i]);
            pkv_page_copy c;
            for (int rep = 0; rep < reps; rep++) {
                const double t0 = now_ns();
                for (int32_t i = 0; i < B; i++) pkv_request_extend(pool, reqs[i], 1, &c);
                const double t1 = now_ns();
                if (pkv_page_pool_table(pool, reqs, B, indptr, idx, cap, last, sl) != PKV_OK) {
                    fprintf(stderr, "table: %s\n", pkv_last_error());
                    return 1;
                }
                const double t2 = now_ns();
                int32_t npairs = 0, tail[4];
                for (int32_t i = 0; i < B; i++) {
                    int32_t n = 0, len_i = 0;
                    pkv_request_length(pool, reqs[i], &len_i);
                    pkv_request_pages(pool, reqs[i], NULL, 0, &n);
                    const int32_t from = known[i] > 0 && known[i] <= n ? known[i] - 1 : (n > 0 ? n - 1 : 0);
                    if (n - from > 4 || pkv_request_pages_from(pool, reqs[i], from, tail, 4, &n) != PKV_OK) return 1;
                    for (int32_t j = 0; j < n - from; j++, npairs++) pairs[2 * npairs] = from + j, pairs[2 * npairs + 1] = tail[j];
                    known[i] = n;
                    sl[i] = len_i;
                }
                const double t3 = now_ns();
                if (npairs < B) return 1; /* at least the last page of each row */
                t_table[rep] = t2 - t1;
                t_step[rep] = t2 - t0;
                t_delta[rep] = t3 - t2;
                if (rep % 16 == 15) /* keep the length steady: a rollback of 16 tokens */
                    for (int32_t i = 0; i < B; i++) pkv_request_truncate(pool, reqs[i], len - ps / 2);
            }
            qsort(t_table, (size_t)reps, sizeof(double), cmp_double);
            qsort(t_step, (size_t)reps, sizeof(double), cmp_double);
            qsort(t_delta, (size_t)reps, sizeof(double), cmp_double);
            const double mt = t_table[reps / 2], ms = t_step[reps / 2], md = t_delta[reps / 2];
            printf("| %d | %d | %d | %.0f | %.0f | %.0f | %.0f |\n", B, len, (len + ps - 1) / ps, mt, mt * 64.0 / B,
                   ms * 64.0 / B, md * 64.0 / B);
            free(reqs), free(indptr), free(idx), free(last), free(sl), free(known), free(pairs);
            pkv_page_pool_free(pool);
        }
    free(t_table), free(t_step), free(t_delta);
    return 0;
}
