/* fuzz_pages.c - libFuzzer target: a byte string drives a random sequence of page-manager operations
 * (create, extend by one token and by many, truncate, fork, free, table emission and its ownership
 * check, a forged table) against the simple model of lab/pkv_pages_model.h; after every operation the
 * status must be the model's and the whole pool must equal the model's (pages, references, counters).
 * Any difference aborts with the operation and the difference.
 *
 * Input: byte 0 the pool's size, byte 1 its page size, byte 2 its request ids; then 3 bytes per operation
 * (kind, request, argument).  Build: linked against the pkv and pkv_lab libraries with -fsanitize=fuzzer
 * (fuzz/CMakeLists.txt); seeds in fuzz/corpus/pages/.  tests/test_pages.c runs the same driver
 * (fuzz_pages_run) on seeded random inputs in every CTest run. */
#include "persistentkv.h"
#include "pkv_pages_model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 0 when every operation agreed with the model; else 1 and the first disagreement in why. */
static int fuzz_pages_run(const uint8_t *data, size_t size, char *why, size_t cap) {
    if (size < 3) return 0;
    static const int32_t page_sizes[8] = {1, 2, 3, 4, 7, 16, 32, 256};
    const int32_t num_pages = 1 + data[0] % 48, page_size = page_sizes[data[1] % 8], max_req = 1 + data[2] % 12;
    pkv_page_pool *pool = NULL;
    pkv_pages_model m;
    memset(&m, 0, sizeof m);
    int rc = 0;
    if (pkv_page_pool_create(num_pages, page_size, max_req, &pool) != PKV_OK ||
        pkv_pages_model_init(&m, num_pages, page_size, max_req) != 0) {
        snprintf(why, cap, "cannot create a pool of %d pages: %s", num_pages, pkv_last_error());
        pkv_page_pool_free(pool);
        pkv_pages_model_free(&m);
        return 1;
    }
    int32_t reqs[16], indptr[17], last[16], lens[16];
    int32_t *indices = (int32_t *)malloc((size_t)(num_pages * 16 + 1) * sizeof(int32_t));
    if (!indices) {
        snprintf(why, cap, "out of memory");
        rc = 1;
    }
    for (size_t at = 3, step = 0; !rc && at + 3 <= size; at += 3, step++) {
        const uint8_t kind = data[at] % 9, arg = data[at + 2];
        const int32_t req = (int32_t)(data[at + 1] % (max_req + 2)) - 1; /* -1 and max_req: unknown ids */
        const int32_t len = req >= 0 && req < max_req ? m.len[req] : 0;
        pkv_status got = PKV_OK, want = PKV_OK;
        pkv_page_copy cg = {-2, -2}, cw = {-1, -1};
        const char *op = "";
        switch (kind) {
        case 0:
            op = "create";
            want = pkv_pages_model_create(&m, req, arg % (3 * page_size + 1));
            got = pkv_request_create(pool, req, arg % (3 * page_size + 1));
            break;
        case 1:
        case 2:
            op = "extend 1";
            want = pkv_pages_model_extend(&m, req, 1, &cw);
            got = pkv_request_extend(pool, req, 1, &cg);
            break;
        case 3:
            op = "extend n";
            want = pkv_pages_model_extend(&m, req, (int32_t)(arg % 40) - 2, &cw);
            got = pkv_request_extend(pool, req, (int32_t)(arg % 40) - 2, &cg);
            break;
        case 4:
            op = "truncate";
            want = pkv_pages_model_truncate(&m, req, len - (int32_t)(arg % 8) + 1);
            got = pkv_request_truncate(pool, req, len - (int32_t)(arg % 8) + 1);
            break;
        case 5: {
            op = "fork";
            const int32_t dst = (int32_t)(arg % (max_req + 1));
            want = pkv_pages_model_fork(&m, req, dst);
            got = pkv_request_fork(pool, req, dst);
            break;
        }
        case 6:
            op = "free";
            want = pkv_pages_model_free_req(&m, req);
            got = pkv_request_free(pool, req);
            break;
        default: { /* the table of up to 16 rows (live requests, one at times unknown), checked and forged */
            op = "table";
            int32_t b = 0;
            for (int32_t r = 0; r < max_req && b < 16; r++)
                if (m.state[r] == PKV_MODEL_LIVE && ((arg >> (r % 8)) & 1)) reqs[b++] = r;
            if (kind == 8 && b < 16 && (arg & 3) == 3) reqs[b++] = req; /* maybe not live */
            want = PKV_OK;
            for (int32_t i = 0; i < b && want == PKV_OK; i++) want = pkv_pages_model_lookup(&m, reqs[i]);
            int64_t n = -1;
            got = pkv_page_pool_table_size(pool, reqs, b, &n);
            if (got == PKV_OK) got = pkv_page_pool_table(pool, reqs, b, indptr, indices, n, last, lens);
            if (got != want || got != PKV_OK) break;
            pkv_page_table t = {b, indptr, indices, lens};
            int32_t at_page = 0;
            for (int32_t i = 0; i < b && !rc; i++) {
                const int32_t r = reqs[i];
                if (indptr[i] != at_page || indptr[i + 1] - indptr[i] != m.npages[r] || lens[i] != m.len[r] ||
                    last[i] != (m.npages[r] ? m.len[r] - (m.npages[r] - 1) * page_size : 0) ||
                    (m.npages[r] && memcmp(indices + indptr[i], m.pages[r], (size_t)m.npages[r] * sizeof(int32_t))))
                    rc = pkv_pages_model_fail_(why, cap, "step %zu: the table's row %d (request %d) differs", step, i, r);
                at_page += m.npages[r];
            }
            if (rc) break;
            got = pkv_page_pool_check_table(pool, reqs, &t);
            if (got != PKV_OK) break;
            if (at_page > 0) { /* forge: another page in one slot must be found out, and only that */
                const int32_t j = arg % at_page, saved = indices[j];
                indices[j] = (saved + 1 + arg % (num_pages > 1 ? num_pages - 1 : 1)) % num_pages;
                const pkv_status f = pkv_page_pool_check_table(pool, reqs, &t);
                if (indices[j] != saved && f != PKV_ERR_FOREIGN_PAGE)
                    rc = pkv_pages_model_fail_(why, cap, "step %zu: a forged table passed the check (%d)", step, (int)f);
                indices[j] = saved;
            }
            break;
        }
        }
        if (rc) break;
        if (got != want) {
            rc = pkv_pages_model_fail_(why, cap, "step %zu: %s of request %d (arg %d) returned %d (%s), the model %d", step,
                                       op, req, arg, (int)got, pkv_last_error(), (int)want);
            break;
        }
        if ((kind >= 1 && kind <= 3) && (cg.src_page != cw.src_page || cg.dst_page != cw.dst_page)) {
            rc = pkv_pages_model_fail_(why, cap, "step %zu: copy-on-write %d -> %d, the model %d -> %d", step,
                                       cg.src_page, cg.dst_page, cw.src_page, cw.dst_page);
            break;
        }
        char inner[384];
        if (pkv_pages_model_compare(&m, pool, inner, sizeof inner)) {
            rc = pkv_pages_model_fail_(why, cap, "step %zu, after %s of request %d: %s", step, op, req, inner);
            break;
        }
    }
    free(indices);
    pkv_page_pool_free(pool);
    pkv_pages_model_free(&m);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char why[512];
    if (fuzz_pages_run(data, size, why, sizeof why)) {
        fprintf(stderr, "fuzz_pages: %s\n", why);
        abort();
    }
    return 0;
}
