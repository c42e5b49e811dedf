/* test_trace.c - the splitmix64 RNG and the trace generators: golden values, the serving-model
 * properties of workloads.md, page tables, trace files (round trip and malformed input) and the
 * status of every bad argument.
 *
 * Golden values: the RNG outputs and the five checksums were computed by an independent Python
 * re-implementation of splitmix64 and of the whole generator (draw order, serving model, page
 * permutation, checksum serialization), and agree with this library bit for bit.  The uniform_int
 * values of anchors.md (B4_uniform, B8_uniform) are a published check of the same RNG. */
#define _POSIX_C_SOURCE 200809L /* getpid */

#include "pkv_lab.h"
#include "pkv_test.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <process.h>
#define pkv_test_pid() ((long)_getpid())
#else
#include <unistd.h>
#define pkv_test_pid() ((long)getpid())
#endif

/* A scratch file path: $TMPDIR (or /tmp) / pkv_test_trace_<pid>_<tag>.csv. */
static void temp_path(char *buf, size_t cap, const char *tag) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    snprintf(buf, cap, "%s/pkv_test_trace_%ld_%s.csv", dir, pkv_test_pid(), tag);
}

static bool write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

static int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ------------------------------------------------------------------------------------------------ */
static void test_rng(void) {
    /* splitmix64 seeded 20260622: first four outputs (independent Python implementation). */
    static const uint64_t golden[4] = {UINT64_C(0x618c7a4e9c128633), UINT64_C(0xcddf5bccd5d1b455),
                                       UINT64_C(0x75ca25d56d35e658), UINT64_C(0x3fed12d48c31a001)};
    pkv_rng rng;
    pkv_rng_seed(&rng, UINT64_C(20260622));
    for (int i = 0; i < 4; i++) {
        uint64_t x = pkv_rng_next(&rng);
        CHECK_MSG(x == golden[i], "output %d: 0x%016" PRIx64 ", expected 0x%016" PRIx64, i, x, golden[i]);
    }

    /* anchors.md: B4_uniform and B8_uniform draw U[1024, 32768] from seed 20250000 + 100 * B. */
    static const int64_t b4[4] = {27620, 18860, 22224, 23985};
    static const int64_t b8[8] = {12349, 24525, 30497, 16786, 17280, 23566, 23502, 23916};
    pkv_rng_seed(&rng, UINT64_C(20250400));
    for (int i = 0; i < 4; i++) CHECK(pkv_rng_uniform_int(&rng, 1024, 32768) == b4[i]);
    pkv_rng_seed(&rng, UINT64_C(20250800));
    for (int i = 0; i < 8; i++) CHECK(pkv_rng_uniform_int(&rng, 1024, 32768) == b8[i]);

    /* uniform_int is lo + next() % span, uniform01 is (next() >> 11) * 2^-53. */
    pkv_rng a, b;
    pkv_rng_seed(&a, 42);
    pkv_rng_seed(&b, 42);
    bool same = true, in_range = true, unit = true;
    for (int i = 0; i < 10000; i++) {
        int64_t v = pkv_rng_uniform_int(&a, -512, 512);
        uint64_t x = pkv_rng_next(&b);
        same = same && v == -512 + (int64_t)(x % 1025);
        in_range = in_range && v >= -512 && v <= 512;
        double u = pkv_rng_uniform01(&a);
        x = pkv_rng_next(&b);
        same = same && u == (double)(x >> 11) / 9007199254740992.0;
        unit = unit && u >= 0.0 && u < 1.0;
    }
    CHECK(same);
    CHECK(in_range);
    CHECK(unit);
    pkv_rng_seed(&a, 7);
    CHECK(pkv_rng_uniform_int(&a, 5, 5) == 5);
    pkv_rng_seed(&a, 7);
    pkv_rng_seed(&b, 7);
    (void)pkv_rng_next(&b);
    (void)pkv_rng_next(&b);
    uint64_t third = pkv_rng_next(&b);
    (void)pkv_rng_uniform_int(&a, 5, 5);
    (void)pkv_rng_uniform_int(&a, INT64_MIN, INT64_MAX);
    CHECK(pkv_rng_next(&a) == third); /* each uniform_int draws exactly once */
}

/* ------------------------------------------------------------------------------------------------ */
static void test_families(void) {
    static const char *const names[5] = {"uniform", "bimodal", "zipf", "bucketed", "homogeneous"};
    for (int f = 0; f < 5; f++) {
        pkv_trace_family parsed = PKV_TRACE_FAMILY_COUNT_;
        CHECK(strcmp(pkv_trace_family_name((pkv_trace_family)f), names[f]) == 0);
        CHECK_OK(pkv_trace_family_parse(names[f], &parsed));
        CHECK(parsed == (pkv_trace_family)f);
    }
    pkv_trace_family parsed = PKV_TRACE_UNIFORM;
    CHECK_STATUS(pkv_trace_family_parse("Uniform", &parsed), PKV_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(pkv_trace_family_parse("", &parsed), PKV_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(pkv_trace_family_parse(NULL, &parsed), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_trace_family_parse("zipf", NULL), PKV_ERR_NULL_POINTER);
    CHECK(strcmp(pkv_trace_family_name(PKV_TRACE_FAMILY_COUNT_), "unknown") == 0);
    CHECK(strcmp(pkv_trace_family_name((pkv_trace_family)-1), "unknown") == 0);

    pkv_trace_config cfg;
    pkv_trace_config_default(&cfg, PKV_TRACE_ZIPF);
    CHECK(cfg.family == PKV_TRACE_ZIPF && cfg.seed == UINT64_C(20260623) && cfg.num_requests == 24 &&
          cfg.max_active == 8 && cfg.max_steps == 48 && cfg.page_size == 16 && cfg.hole_fraction == 0.0);
    pkv_trace_config_default(&cfg, PKV_TRACE_BUCKETED);
    CHECK(cfg.family == PKV_TRACE_BUCKETED && cfg.seed == UINT64_C(20260623) && cfg.num_requests == 16 &&
          cfg.max_active == 1 && cfg.max_steps == 64 && cfg.page_size == 16 && cfg.hole_fraction == 0.0);
    pkv_trace_config_default(NULL, PKV_TRACE_UNIFORM); /* no crash */
}

/* ------------------------------------------------------------------------------------------------ */
static void test_golden_checksums(void) {
    /* Default configuration of each family (seed 20260623); cross-checked in Python. */
    static const uint64_t golden[5] = {UINT64_C(0x19d8285154827897), UINT64_C(0xe54cc4d234228ff6),
                                       UINT64_C(0xc79ef6cbca65cceb), UINT64_C(0xa8e117f84257db74),
                                       UINT64_C(0x8ed4aba67abcd008)};
    static const int32_t golden_steps[5] = {48, 48, 48, 64, 48};
    static const int64_t golden_pages[5] = {35907, 28670, 32091, 30797, 49267};
    for (int f = 0; f < 5; f++) {
        pkv_trace_config cfg;
        pkv_trace_config_default(&cfg, (pkv_trace_family)f);
        pkv_trace *t = NULL, *again = NULL;
        CHECK_OK(pkv_trace_generate(&cfg, &t));
        CHECK_OK(pkv_trace_generate(&cfg, &again));
        if (!t || !again) {
            pkv_trace_free(t);
            pkv_trace_free(again);
            continue;
        }
        uint64_t sum = pkv_trace_checksum(t);
        CHECK_MSG(sum == golden[f], "%s: checksum 0x%016" PRIx64 ", expected 0x%016" PRIx64,
                  pkv_trace_family_name(cfg.family), sum, golden[f]);
        CHECK(pkv_trace_checksum(again) == sum);
        CHECK(pkv_trace_num_steps(t) == golden_steps[f]);
        CHECK(pkv_trace_num_pages(t) == golden_pages[f]);
        CHECK(pkv_trace_num_requests(t) == cfg.num_requests);
        const pkv_trace_config *got = pkv_trace_get_config(t);
        CHECK(got && got->family == cfg.family && got->seed == cfg.seed && got->max_steps == cfg.max_steps);
        pkv_trace_free(again);

        cfg.seed += 1; /* another seed, another trace */
        CHECK_OK(pkv_trace_generate(&cfg, &again));
        CHECK(again && pkv_trace_checksum(again) != sum);
        pkv_trace_free(again);
        pkv_trace_free(t);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Checks every property of workloads.md and the serving model on one trace. */
static void check_trace_properties(const pkv_trace *t) {
    const pkv_trace_config *cfg = pkv_trace_get_config(t);
    const int32_t n = pkv_trace_num_requests(t), steps = pkv_trace_num_steps(t);
    const int64_t num_pages = pkv_trace_num_pages(t);
    const int32_t ma = cfg->max_active, ps = cfg->page_size;

    /* Lengths of each family. */
    bool lengths_ok = true;
    int64_t total_pages = 0;
    for (int32_t r = 0; r < n; r++) {
        int32_t p = 0, d = 0;
        pkv_trace_request(t, r, &p, &d);
        bool ok = p % 16 == 0;
        switch (cfg->family) {
        case PKV_TRACE_UNIFORM: ok = ok && p >= 4096 && p <= 32768 && d >= 16 && d <= 96; break;
        case PKV_TRACE_BIMODAL:
            if (r % 4 == 3) ok = ok && p >= 24576 && p <= 65536 && d >= 32 && d <= 128;
            else ok = ok && p >= 2048 && p <= 12288 && d >= 8 && d <= 64;
            break;
        case PKV_TRACE_ZIPF: ok = ok && p >= 1024 && p <= 2048 + 65536 + 512 && d >= 8 && d <= 128; break;
        case PKV_TRACE_BUCKETED: ok = ok && p == (8192 << (r % 4)) && d >= 32 && d <= 96; break;
        case PKV_TRACE_HOMOGENEOUS: ok = ok && p == 32768 && d >= 32 && d <= 96; break;
        case PKV_TRACE_FAMILY_COUNT_: ok = false; break;
        }
        CHECK_MSG(ok, "%s request %d: prompt %d decode %d", pkv_trace_family_name(cfg->family), (int)r,
                  (int)p, (int)d);
        lengths_ok = lengths_ok && ok;
        total_pages += ceil_div64((int64_t)p + d, ps);
    }
    CHECK(lengths_ok);

    /* Pool size and page ids: unique across requests, inside [0, num_pages). */
    int64_t expected_pool = total_pages;
    if (cfg->hole_fraction > 0.0) expected_pool = (int64_t)ceil((double)total_pages / (1.0 - cfg->hole_fraction));
    CHECK_MSG(num_pages == expected_pool, "num_pages %" PRId64 ", expected %" PRId64, num_pages, expected_pool);
    unsigned char *owner = (unsigned char *)calloc((size_t)num_pages + 1, 1);
    CHECK(owner != NULL);
    if (!owner) return;
    bool pages_ok = true;
    for (int32_t r = 0; r < n; r++) {
        int32_t p = 0, d = 0;
        pkv_trace_request(t, r, &p, &d);
        int32_t count = (int32_t)ceil_div64((int64_t)p + d, ps);
        for (int32_t j = 0; j < count; j++) {
            int32_t page = pkv_trace_page(t, r, j);
            if (page < 0 || page >= num_pages || owner[page]) pages_ok = false;
            else owner[page] = 1;
        }
        pages_ok = pages_ok && pkv_trace_page(t, r, count) == -1;
    }
    CHECK(pages_ok);
    free(owner);

    /* The serving model: arrivals, the first max_active live requests, lengths +1 per step. */
    int32_t *served = (int32_t *)calloc((size_t)n, sizeof(int32_t));
    int32_t *last_step = (int32_t *)malloc((size_t)n * sizeof(int32_t));
    CHECK(served && last_step);
    if (!served || !last_step) {
        free(served);
        free(last_step);
        return;
    }
    for (int32_t r = 0; r < n; r++) last_step[r] = -1;
    bool batch_ok = true, order_ok = true, arrival_ok = true, growth_ok = true, fifo_ok = true;
    for (int32_t s = 0; s < steps; s++) {
        const int32_t *ids = NULL, *lens = NULL;
        int32_t b = pkv_trace_step(t, s, &ids, &lens);
        batch_ok = batch_ok && b >= 0 && b <= ma;
        /* B = min(max_active, live requests): count the live ones before this step. */
        int32_t live = 0;
        for (int32_t r = 0; r < n; r++) {
            int32_t p = 0, d = 0;
            pkv_trace_request(t, r, &p, &d);
            if ((int64_t)r / ma <= s && served[r] < d) live++;
        }
        batch_ok = batch_ok && b == (live < ma ? live : ma);
        for (int32_t k = 0; k < b; k++) {
            int32_t r = ids[k], p = 0, d = 0;
            pkv_trace_request(t, r, &p, &d);
            if (k > 0 && ids[k] <= ids[k - 1]) order_ok = false;
            if ((int64_t)r / ma > s) arrival_ok = false;
            if (served[r] > 0 && last_step[r] != s - 1) growth_ok = false; /* once in, every step */
            served[r]++;
            last_step[r] = s;
            if (lens[k] != p + served[r] || served[r] > d) growth_ok = false;
        }
        /* Nobody skipped: a live request not served has a higher id than every served one. */
        for (int32_t r = 0; r < n && b == ma; r++) {
            int32_t p = 0, d = 0;
            pkv_trace_request(t, r, &p, &d);
            bool was_live = (int64_t)r / ma <= s && served[r] - (last_step[r] == s) < d;
            if (was_live && last_step[r] != s && r < ids[b - 1]) fifo_ok = false;
        }
    }
    CHECK(batch_ok);
    CHECK(order_ok);
    CHECK(arrival_ok);
    CHECK(growth_ok);
    CHECK(fifo_ok);
    if (cfg->max_steps <= 0) { /* ran to completion: every request produced all its tokens */
        bool complete = true;
        for (int32_t r = 0; r < n; r++) {
            int32_t p = 0, d = 0;
            pkv_trace_request(t, r, &p, &d);
            complete = complete && served[r] == d;
        }
        CHECK(complete);
    } else {
        CHECK(steps <= cfg->max_steps);
    }
    free(served);
    free(last_step);

    /* Step page tables agree with the trace's pages; capacity is enforced. */
    bool table_ok = true;
    for (int32_t s = 0; s < steps; s++) {
        const int32_t *ids = NULL, *lens = NULL;
        int32_t b = pkv_trace_step(t, s, &ids, &lens);
        int64_t needed = 0;
        for (int32_t k = 0; k < b; k++) needed += ceil_div64(lens[k], ps);
        int32_t *indptr = (int32_t *)malloc(((size_t)b + 1) * sizeof(int32_t));
        int32_t *indices = (int32_t *)malloc((size_t)needed * sizeof(int32_t) + 1);
        int32_t *out_lens = (int32_t *)malloc((size_t)b * sizeof(int32_t) + 1);
        if (!indptr || !indices || !out_lens) {
            table_ok = false;
        } else if (pkv_trace_step_table(t, s, indptr, indices, needed, out_lens) != PKV_OK) {
            table_ok = false;
        } else {
            table_ok = table_ok && indptr[0] == 0 && indptr[b] == needed;
            for (int32_t k = 0; k < b; k++) {
                table_ok = table_ok && out_lens[k] == lens[k] &&
                           indptr[k + 1] - indptr[k] == ceil_div64(lens[k], ps);
                for (int32_t j = indptr[k]; j < indptr[k + 1]; j++)
                    table_ok = table_ok && indices[j] == pkv_trace_page(t, ids[k], j - indptr[k]);
            }
            if (needed > 0 && s % 7 == 0)
                CHECK_STATUS(pkv_trace_step_table(t, s, indptr, indices, needed - 1, out_lens),
                             PKV_ERR_INVALID_ARGUMENT);
        }
        free(indptr);
        free(indices);
        free(out_lens);
    }
    CHECK(table_ok);
}

static void test_properties(void) {
    for (int f = 0; f < 5; f++) {
        pkv_trace_config cfg;
        pkv_trace_config_default(&cfg, (pkv_trace_family)f);
        pkv_trace *t = NULL;
        CHECK_OK(pkv_trace_generate(&cfg, &t));
        if (t) check_trace_properties(t);
        pkv_trace_free(t);

        /* To completion, other page sizes, holes, other batch sizes. */
        pkv_trace_config other = cfg;
        other.max_steps = 0;
        other.page_size = f == 0 ? 1 : 16 * f + 3;
        other.hole_fraction = 0.25 * (f % 4);
        other.max_active = 1 << f;
        other.num_requests = 3 * other.max_active + 1;
        other.seed = UINT64_C(20260622) + (uint64_t)f;
        CHECK_OK(pkv_trace_generate(&other, &t));
        if (t) check_trace_properties(t);
        pkv_trace_free(t);
    }

    /* The first step serves requests 0 .. max_active - 1 at prompt + 1. */
    pkv_trace_config cfg;
    pkv_trace_config_default(&cfg, PKV_TRACE_UNIFORM);
    pkv_trace *t = NULL;
    CHECK_OK(pkv_trace_generate(&cfg, &t));
    if (t) {
        const int32_t *ids = NULL, *lens = NULL;
        int32_t b = pkv_trace_step(t, 0, &ids, &lens);
        CHECK(b == 8);
        for (int32_t k = 0; k < b; k++) {
            int32_t p = 0;
            pkv_trace_request(t, k, &p, NULL);
            CHECK(ids[k] == k && lens[k] == p + 1);
        }
    }
    pkv_trace_free(t);

    /* hole_fraction 0.9: ten times the used pages. */
    cfg.hole_fraction = 0.9;
    cfg.num_requests = 4;
    CHECK_OK(pkv_trace_generate(&cfg, &t));
    if (t) check_trace_properties(t);
    pkv_trace_free(t);
}

/* ------------------------------------------------------------------------------------------------ */
static void test_accessors_and_arguments(void) {
    pkv_trace_config good;
    pkv_trace_config_default(&good, PKV_TRACE_UNIFORM);
    pkv_trace *t = (pkv_trace *)&good; /* any non-NULL value: must be reset to NULL on failure */

    CHECK_STATUS(pkv_trace_generate(NULL, &t), PKV_ERR_NULL_POINTER);
    CHECK(t == NULL);
    CHECK_STATUS(pkv_trace_generate(&good, NULL), PKV_ERR_NULL_POINTER);

    pkv_trace_config bad = good;
    bad.num_requests = 0;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    CHECK(t == NULL);
    bad.num_requests = -3;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad = good;
    bad.max_active = 0;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad.max_active = -1;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad = good;
    bad.page_size = 0;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad.page_size = 257;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad.page_size = 256;
    CHECK_OK(pkv_trace_generate(&bad, &t));
    pkv_trace_free(t);
    bad = good;
    bad.hole_fraction = -0.01;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad.hole_fraction = 0.95;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad.hole_fraction = NAN;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad = good;
    bad.family = PKV_TRACE_FAMILY_COUNT_;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad.family = (pkv_trace_family)-1;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);

    /* A pool above INT32_MAX pages: 100000 requests of ~32K tokens at page_size 1; or one that
     * fits only without its holes. */
    bad = good;
    bad.family = PKV_TRACE_HOMOGENEOUS;
    bad.page_size = 1;
    bad.num_requests = 100000;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    bad.num_requests = 60000; /* about 1.97e9 pages used */
    bad.hole_fraction = 0.5;
    CHECK_STATUS(pkv_trace_generate(&bad, &t), PKV_ERR_INVALID_ARGUMENT);

    /* Accessors on NULL and out of range. */
    CHECK(pkv_trace_num_steps(NULL) == 0);
    CHECK(pkv_trace_num_requests(NULL) == 0);
    CHECK(pkv_trace_num_pages(NULL) == 0);
    CHECK(pkv_trace_get_config(NULL) == NULL);
    CHECK(pkv_trace_checksum(NULL) == 0);
    CHECK(pkv_trace_page(NULL, 0, 0) == -1);
    pkv_trace_free(NULL);

    CHECK_OK(pkv_trace_generate(&good, &t));
    if (!t) return;
    const int32_t *ids = &good.num_requests, *lens = &good.num_requests;
    CHECK(pkv_trace_step(t, -1, &ids, &lens) == 0 && ids == NULL && lens == NULL);
    CHECK(pkv_trace_step(t, pkv_trace_num_steps(t), &ids, &lens) == 0 && ids == NULL);
    CHECK(pkv_trace_step(NULL, 0, &ids, &lens) == 0);
    CHECK(pkv_trace_step(t, 0, NULL, NULL) == 8);
    int32_t p = -1, d = -1;
    pkv_trace_request(t, -1, &p, &d);
    CHECK(p == 0 && d == 0);
    pkv_trace_request(t, 24, &p, &d);
    CHECK(p == 0 && d == 0);
    pkv_trace_request(NULL, 0, &p, &d);
    CHECK(p == 0 && d == 0);
    pkv_trace_request(t, 0, NULL, NULL); /* no crash */
    CHECK(pkv_trace_page(t, -1, 0) == -1);
    CHECK(pkv_trace_page(t, 24, 0) == -1);
    CHECK(pkv_trace_page(t, 0, -1) == -1);
    CHECK(pkv_trace_page(t, 0, 0) >= 0);

    int32_t indptr[9], lens_out[8];
    int32_t *indices = (int32_t *)malloc(sizeof(int32_t) * 40000);
    CHECK(indices != NULL);
    if (indices) {
        CHECK_OK(pkv_trace_step_table(t, 0, indptr, indices, 40000, lens_out));
        CHECK_STATUS(pkv_trace_step_table(NULL, 0, indptr, indices, 40000, lens_out), PKV_ERR_NULL_POINTER);
        CHECK_STATUS(pkv_trace_step_table(t, 0, NULL, indices, 40000, lens_out), PKV_ERR_NULL_POINTER);
        CHECK_STATUS(pkv_trace_step_table(t, 0, indptr, NULL, 40000, lens_out), PKV_ERR_NULL_POINTER);
        CHECK_STATUS(pkv_trace_step_table(t, 0, indptr, indices, 40000, NULL), PKV_ERR_NULL_POINTER);
        CHECK_STATUS(pkv_trace_step_table(t, -1, indptr, indices, 40000, lens_out), PKV_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(pkv_trace_step_table(t, pkv_trace_num_steps(t), indptr, indices, 40000, lens_out),
                     PKV_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(pkv_trace_step_table(t, 0, indptr, indices, 0, lens_out), PKV_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(pkv_trace_step_table(t, 0, indptr, indices, -1, lens_out), PKV_ERR_INVALID_ARGUMENT);
    }
    free(indices);

    char path[512];
    temp_path(path, sizeof path, "args");
    CHECK_STATUS(pkv_trace_write(NULL, path), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_trace_write(t, NULL), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_trace_write(t, "/nonexistent-pkv-dir/trace.csv"), PKV_ERR_IO);
    pkv_trace *read = t;
    CHECK_STATUS(pkv_trace_read(NULL, &read), PKV_ERR_NULL_POINTER);
    CHECK(read == NULL);
    CHECK_STATUS(pkv_trace_read(path, NULL), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_trace_read("/nonexistent-pkv-dir/trace.csv", &read), PKV_ERR_IO);
    CHECK(read == NULL);
    pkv_trace_free(t);
}

/* ------------------------------------------------------------------------------------------------ */
static void test_round_trip(void) {
    char path[512];
    temp_path(path, sizeof path, "roundtrip");
    for (int f = 0; f < 5; f++) {
        pkv_trace_config cfg;
        pkv_trace_config_default(&cfg, (pkv_trace_family)f);
        if (f == 2) cfg.hole_fraction = 0.3; /* a fraction that is not a short decimal in binary */
        if (f == 4) {
            cfg.max_steps = 0;
            cfg.seed = UINT64_MAX;
            cfg.page_size = 7;
        }
        pkv_trace *t = NULL, *back = NULL;
        CHECK_OK(pkv_trace_generate(&cfg, &t));
        if (!t) continue;
        CHECK_OK(pkv_trace_write(t, path));
        CHECK_OK(pkv_trace_read(path, &back));
        if (back) {
            CHECK(pkv_trace_checksum(back) == pkv_trace_checksum(t));
            const pkv_trace_config *a = pkv_trace_get_config(t), *b = pkv_trace_get_config(back);
            CHECK(a->family == b->family && a->seed == b->seed && a->num_requests == b->num_requests &&
                  a->max_active == b->max_active && a->max_steps == b->max_steps &&
                  a->page_size == b->page_size && a->hole_fraction == b->hole_fraction);
            CHECK(pkv_trace_num_steps(back) == pkv_trace_num_steps(t));
            CHECK(pkv_trace_num_pages(back) == pkv_trace_num_pages(t));
            check_trace_properties(back);
        }
        pkv_trace_free(back);
        pkv_trace_free(t);
    }
    remove(path);
}

/* A small valid file: 2 requests, pages chosen by hand (page 2 is a hole), 2 steps. */
static const char *const small_header =
    "# persistentkv-trace v1\n"
    "# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=0\n"
    "# num_pages=6 num_steps=3\n";
static const char *const small_body =
    "request,0,32,1,5 0 3\n"
    "request,1,16,2,1 4\n"
    "step,0,0,33\n"
    "step,0,1,17\n"
    "step,2,1,18\n";

static void test_read_keeps_pages(void) {
    char path[512], text[1024];
    temp_path(path, sizeof path, "small");
    snprintf(text, sizeof text, "%s%s", small_header, small_body);
    CHECK(write_text(path, text));
    pkv_trace *t = NULL;
    CHECK_OK(pkv_trace_read(path, &t));
    if (t) {
        static const int32_t pages0[3] = {5, 0, 3}, pages1[2] = {1, 4};
        for (int j = 0; j < 3; j++) CHECK(pkv_trace_page(t, 0, j) == pages0[j]);
        for (int j = 0; j < 2; j++) CHECK(pkv_trace_page(t, 1, j) == pages1[j]);
        CHECK(pkv_trace_page(t, 0, 3) == -1);
        CHECK(pkv_trace_num_pages(t) == 6);
        CHECK(pkv_trace_num_steps(t) == 3);
        CHECK(pkv_trace_get_config(t)->family == PKV_TRACE_BIMODAL);
        const int32_t *ids = NULL, *lens = NULL;
        CHECK(pkv_trace_step(t, 0, &ids, &lens) == 2);
        CHECK(ids[0] == 0 && lens[0] == 33 && ids[1] == 1 && lens[1] == 17);
        CHECK(pkv_trace_step(t, 1, &ids, &lens) == 0); /* a step without lines is empty */
        CHECK(pkv_trace_step(t, 2, &ids, &lens) == 1);
        CHECK(ids[0] == 1 && lens[0] == 18);
        int32_t indptr[3], indices[8], lens_out[2];
        CHECK_OK(pkv_trace_step_table(t, 0, indptr, indices, 8, lens_out));
        CHECK(indptr[0] == 0 && indptr[1] == 3 && indptr[2] == 5);
        CHECK(indices[0] == 5 && indices[1] == 0 && indices[2] == 3 && indices[3] == 1 && indices[4] == 4);
        CHECK(lens_out[0] == 33 && lens_out[1] == 17);

        /* Written back and read again: same checksum, same pages. */
        char path2[512];
        temp_path(path2, sizeof path2, "small2");
        pkv_trace *back = NULL;
        CHECK_OK(pkv_trace_write(t, path2));
        CHECK_OK(pkv_trace_read(path2, &back));
        CHECK(back && pkv_trace_checksum(back) == pkv_trace_checksum(t));
        CHECK(back && pkv_trace_page(back, 0, 0) == 5);
        pkv_trace_free(back);
        remove(path2);
    }
    pkv_trace_free(t);

    /* CRLF line ends, comments and empty lines are accepted. */
    snprintf(text, sizeof text,
             "# persistentkv-trace v1\r\n"
             "# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=0\r\n"
             "# num_pages=6 num_steps=3\r\n"
             "# a comment\r\n\r\n"
             "request,0,32,1,5 0 3\r\nrequest,1,16,2,1 4\r\nstep,0,0,33\r\nstep,0,1,17\r\nstep,2,1,18");
    CHECK(write_text(path, text));
    CHECK_OK(pkv_trace_read(path, &t));
    CHECK(t && pkv_trace_step(t, 2, NULL, NULL) == 1);
    pkv_trace_free(t);
    remove(path);
}

/* Writes text, expects PKV_ERR_PARSE with "line <line>" in the message. */
static void expect_parse_error(const char *text, long line, int case_number) {
    char path[512], tag[32], want[32];
    snprintf(tag, sizeof tag, "bad%d", case_number);
    temp_path(path, sizeof path, tag);
    CHECK(write_text(path, text));
    pkv_trace *t = NULL;
    pkv_status st = pkv_trace_read(path, &t);
    CHECK_MSG(st == PKV_ERR_PARSE, "case %d: status %d, expected PKV_ERR_PARSE", case_number, (int)st);
    CHECK(t == NULL);
    snprintf(want, sizeof want, "line %ld:", line);
    CHECK_MSG(strstr(pkv_last_error(), want) != NULL, "case %d: message '%s' does not name %s", case_number,
              pkv_last_error(), want);
    pkv_trace_free(t);
    remove(path);
}

static void test_malformed(void) {
    static const char *const line2 =
        "# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=0\n";
    static const char *const magic = "# persistentkv-trace v1\n";
    static const char *const line3 = "# num_pages=6 num_steps=3\n";
    static const char *const requests = "request,0,32,1,5 0 3\nrequest,1,16,2,1 4\n";
    struct bad_case {
        const char *header2, *header3, *body; /* NULL: the valid line */
        long line;
    };
    static const struct bad_case cases[] = {
        /* header, line 2 */
        {"# family=lognormal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=0\n", NULL, "", 2},
        {"# family=bimodal seed=-5 num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=0\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=0 max_active=2 max_steps=0 page_size=16 hole_fraction=0\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=2 max_active=0 max_steps=0 page_size=16 hole_fraction=0\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=300 hole_fraction=0\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=0.95\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=nan\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=16\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=0 x=1\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=99999999999 max_active=2 max_steps=0 page_size=16 hole_fraction=0\n", NULL, "", 2},
        {"# seed=5 family=bimodal num_requests=2 max_active=2 max_steps=0 page_size=16 hole_fraction=0\n", NULL, "", 2},
        {"# family=bimodal seed=5 num_requests=2 max_active=2 max_steps=2 page_size=16 hole_fraction=0\n", NULL, "", 3},
        /* header, line 3 */
        {NULL, "# num_pages=6\n", "", 3},
        {NULL, "# num_pages=-1 num_steps=3\n", "", 3},
        {NULL, "# num_pages=3000000000 num_steps=3\n", "", 3},
        {NULL, "", "", 3}, /* file ends inside the header */
        /* more steps than the step array may be sized for from the header alone */
        {NULL, "# num_pages=6 num_steps=16777217\n", "", 3},
        /* requests */
        {NULL, NULL, "request,1,16,2,1 4\n", 4},
        {NULL, NULL, "request,0,32,1,5 0\n", 4},
        {NULL, NULL, "request,0,32,1,5 0 3 2\n", 4},
        {NULL, NULL, "request,0,32,1,5 0 6\n", 4},
        {NULL, NULL, "request,0,32,1,5  0 3\n", 4},
        {NULL, NULL, "request,0,abc,1,5 0 3\n", 4},
        {NULL, NULL, "request,0,-32,1,5 0 3\n", 4},
        {NULL, NULL, "request,0,32,1\n", 4},
        {NULL, NULL, "request,0,32,1,5 0 3\nrequest,1,16,2,1 5\n", 5},      /* page 5 used twice */
        {NULL, NULL, "request,0,32,1,5 0 3\nrequest,1,16,2,1 4\nrequest,2,16,2,2\n", 6},
        {NULL, NULL, "request,0,32,1,5 0 3\nrequest,1,100,2,1 4 2 3 7 8 9\n", 5}, /* pool too small */
        {NULL, NULL, "request,0,32,1,5 0 3\n", 4},                             /* a request missing */
        /* steps */
        {NULL, NULL, "request,0,32,1,5 0 3\nstep,0,0,33\n", 5},
        {NULL, NULL, "REQS step,3,0,33\n", 6},
        {NULL, NULL, "REQS step,1,0,33\nstep,0,1,17\n", 7},
        {NULL, NULL, "REQS step,0,1,17\nstep,0,0,33\n", 7},
        {NULL, NULL, "REQS step,0,0,33\nstep,0,0,33\n", 7},
        {NULL, NULL, "REQS step,0,2,17\n", 6},
        {NULL, NULL, "REQS step,0,0,34\n", 6},
        {NULL, NULL, "REQS step,0,0,-1\n", 6},
        {NULL, NULL, "REQS step,0,0,33,1\n", 6},
        {NULL, NULL, "REQS step,0,0,33\nrequest,2,16,0,\n", 7},
        {NULL, NULL, "REQS step;0;0;33\n", 6},
        {NULL, NULL, "REQS steps,0,0,33\n", 6},
    };
    char text[2048];
    const int count = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < count; i++) {
        const struct bad_case *c = &cases[i];
        const char *body = c->body;
        char expanded[512];
        if (strncmp(body, "REQS ", 5) == 0) { /* the two valid request lines, then the rest */
            snprintf(expanded, sizeof expanded, "%s%s", requests, body + 5);
            body = expanded;
        }
        snprintf(text, sizeof text, "%s%s%s%s", magic, c->header2 ? c->header2 : line2,
                 c->header3 ? c->header3 : line3, body);
        expect_parse_error(text, c->line, i);
    }

    /* more rows in a step than max_active */
    snprintf(text, sizeof text, "%s%s%s%sstep,0,0,33\nstep,0,1,17\n", magic,
             "# family=bimodal seed=5 num_requests=2 max_active=1 max_steps=0 page_size=16 hole_fraction=0\n",
             line3, requests);
    expect_parse_error(text, 7, 100);
    /* wrong magic, empty file */
    expect_parse_error("# persistentkv-trace v2\n", 1, 101);
    expect_parse_error("", 1, 102);
    snprintf(text, sizeof text, "%s%s%s", "# persistentkv-trace v1 \n", line2, line3);
    expect_parse_error(text, 1, 103);
}

/* Found by fuzz_trace (fuzz/corpus/trace/regress-*): a header's num_requests sized the request arrays
 * before any line was read (2147483647: ~48 GiB), and a NUL byte inside a line cut it short unseen. */
static void test_fuzz_regressions(void) {
    char path[512];
    temp_path(path, sizeof path, "fuzz");
    pkv_trace *t = NULL;
    /* the arrays grow with the request lines: the missing ones are reported, nothing huge allocated */
    CHECK(write_text(path, "# persistentkv-trace v1\n# family=bimodal seed=5 num_requests=2147483647 max_active=2 "
                           "max_steps=0 page_size=16 hole_fraction=0\n# num_pages=6 num_steps=3\n"
                           "request,0,32,1,5 0 3\nrequest,1,16,2,1 4\n"));
    CHECK_STATUS(pkv_trace_read(path, &t), PKV_ERR_PARSE);
    CHECK_MSG(strstr(pkv_last_error(), "2 of 2147483647 request lines") != NULL, "%s", pkv_last_error());
    /* more requests than one growth step of the arrays */
    {
        enum { R = 3000 };
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (f) {
            fprintf(f, "# persistentkv-trace v1\n# family=uniform seed=1 num_requests=%d max_active=4 max_steps=0 "
                       "page_size=16 hole_fraction=0\n# num_pages=%d num_steps=1\n", R, R);
            for (int r = 0; r < R; r++) fprintf(f, "request,%d,16,0,%d\n", r, R - 1 - r);
            fprintf(f, "step,0,%d,16\n", R - 1);
            fclose(f);
            CHECK_OK(pkv_trace_read(path, &t));
            int32_t prompt = 0, decode = 0;
            pkv_trace_request(t, R - 1, &prompt, &decode);
            CHECK(pkv_trace_num_requests(t) == R && prompt == 16 && decode == 0 && pkv_trace_page(t, R - 1, 0) == 0);
            pkv_trace_free(t);
            t = NULL;
        }
    }
    /* a NUL byte in a line: refused on that line (fgets + strlen read "request,0,32,1,5 0 3" and went on) */
    static const char nul_file[] = "# persistentkv-trace v1\n# family=bimodal seed=5 num_requests=2 max_active=2 "
                                   "max_steps=0 page_size=16 hole_fraction=0\n# num_pages=6 num_steps=3\n"
                                   "request,0,32,1,5 0 3\0 junk\nrequest,1,16,2,1 4\n";
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fwrite(nul_file, 1, sizeof nul_file - 1, f);
        fclose(f);
        CHECK_STATUS(pkv_trace_read(path, &t), PKV_ERR_PARSE);
        CHECK_MSG(strstr(pkv_last_error(), "line 4: NUL byte") != NULL, "%s", pkv_last_error());
    }
    CHECK(t == NULL);
    remove(path);
}

int main(void) {
    test_fuzz_regressions();
    test_rng();
    test_families();
    test_golden_checksums();
    test_properties();
    test_accessors_and_arguments();
    test_round_trip();
    test_read_keeps_pages();
    test_malformed();
    return pkv_test_finish("test_trace");
}
