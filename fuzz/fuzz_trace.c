/* fuzz_trace.c - the trace file reader (pkv_trace_read) on arbitrary bytes.  What must hold: a file is
 * read or refused with a status and a message naming the file (parse errors: its line); a trace that is
 * read answers every accessor within its bounds, fills the page table of each step consistently with its
 * rows, and round-trips: written and read back, the same checksum.  Nothing is allocated from a header's
 * counts alone beyond the documented caps (libFuzzer's -malloc_limit_mb catches that). */
#include "persistentkv.h"
#include "pkv_lab.h"
#include "fuzz_util.h"

#define MAX_CHECKED_STEPS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_temp("trace", data, size);
    if (!path) return 0;
    pkv_trace *t = NULL;
    const pkv_status st = pkv_trace_read(path, &t);
    if (st != PKV_OK) {
        FUZZ_CHECK(t == NULL, "a trace came back with status %d", (int)st);
        FUZZ_CHECK(st == PKV_ERR_PARSE || st == PKV_ERR_IO || st == PKV_ERR_OUT_OF_MEMORY, "status %d: %s", (int)st,
                   pkv_last_error());
        FUZZ_CHECK(strstr(pkv_last_error(), path) != NULL, "message without the file: %s", pkv_last_error());
        return 0;
    }
    const int32_t steps = pkv_trace_num_steps(t), requests = pkv_trace_num_requests(t);
    const int64_t pages = pkv_trace_num_pages(t);
    FUZZ_CHECK(steps >= 0 && requests > 0 && pages >= 0, "steps %d, requests %d, pages %lld", steps, requests,
               (long long)pages);
    const int32_t max_active = pkv_trace_get_config(t)->max_active, page_size = pkv_trace_get_config(t)->page_size;
    int32_t *indptr = malloc(((size_t)max_active + 1) * sizeof *indptr), *lens = malloc((size_t)max_active * sizeof *lens);
    /* the page ids of a step's table: sized by its rows' lengths (the pool's size, a header's count, can be far
     * larger than any step needs) */
    int64_t cap = 0;
    int32_t *indices = NULL;
    for (int32_t s = 0; indptr && lens && s < steps && s < MAX_CHECKED_STEPS; s++) {
        const int32_t *rid = NULL, *slen = NULL;
        const int32_t n = pkv_trace_step(t, s, &rid, &slen);
        FUZZ_CHECK(n >= 0 && n <= max_active, "step %d has %d rows (max_active %d)", s, n, max_active);
        int64_t need = 1;
        for (int32_t i = 0; i < n; i++) need += ((int64_t)slen[i] + page_size - 1) / page_size;
        if (need > cap) {
            free(indices);
            indices = malloc((size_t)need * sizeof *indices);
            cap = indices ? need : 0;
            if (!indices) break;
        }
        FUZZ_CHECK(pkv_trace_step_table(t, s, indptr, indices, cap, lens) == PKV_OK, "step %d table: %s", s,
                   pkv_last_error());
        for (int32_t i = 0; i < n; i++) {
            int32_t prompt = -1, decode = -1;
            FUZZ_CHECK(rid[i] >= 0 && rid[i] < requests && (i == 0 || rid[i] > rid[i - 1]), "step %d row %d", s, i);
            pkv_trace_request(t, rid[i], &prompt, &decode);
            FUZZ_CHECK(slen[i] == lens[i] && slen[i] >= 0 && (int64_t)slen[i] <= (int64_t)prompt + decode,
                       "step %d row %d: length %d of %d + %d", s, i, slen[i], prompt, decode);
            FUZZ_CHECK((int64_t)(indptr[i + 1] - indptr[i]) * page_size >= lens[i], "step %d row %d: pages", s, i);
            for (int32_t k = indptr[i]; k < indptr[i + 1]; k++)
                FUZZ_CHECK(indices[k] >= 0 && indices[k] < pages, "step %d: page %d of %lld", s, indices[k],
                           (long long)pages);
        }
    }
    free(indptr), free(lens), free(indices);
    FUZZ_CHECK(pkv_trace_step(t, steps, NULL, NULL) == 0 && pkv_trace_page(t, requests, 0) == -1, "accessors past the end");
    /* written and read back: the same trace */
    const uint64_t sum = pkv_trace_checksum(t);
    char back_path[600];
    snprintf(back_path, sizeof back_path, "%s.back", path);
    FUZZ_CHECK(pkv_trace_write(t, back_path) == PKV_OK, "write: %s", pkv_last_error());
    pkv_trace *back = NULL;
    FUZZ_CHECK(pkv_trace_read(back_path, &back) == PKV_OK, "read back: %s", pkv_last_error());
    FUZZ_CHECK(pkv_trace_checksum(back) == sum, "checksum changed on the round trip");
    pkv_trace_free(back);
    pkv_trace_free(t);
    remove(back_path);
    return 0;
}
