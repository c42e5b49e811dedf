/* trace.c - decode-step traces of workloads.md: the five generators, per-step page tables, the
 * checksum, and the CSV trace file format (write and read).
 *
 * Everything here is deterministic for a seed on every platform: all random numbers come from one
 * splitmix64 (rng.c) seeded with cfg->seed, drawn in this fixed order:
 *
 *   1. for request i = 0, 1, ..., num_requests - 1, in order: its prompt draws, then its decode draw
 *      (family by family, see draw_request);
 *   2. then the Fisher-Yates shuffle of the page pool, k = num_pages - 1 down to 1, one
 *      uniform_int(0, k) per k.
 *
 * Serving model (the same for every family):
 *   - request i arrives at step floor(i / max_active);
 *   - each step serves the first max_active live requests (arrived, not finished) in request order;
 *   - a served row appends its new token's K/V before attention, so at the k-th step a request is
 *     served (k = 1, 2, ...) its length is prompt_len + k; it leaves after decode_len served steps.
 *     Once served, a request is served every step until it leaves (only earlier requests can leave
 *     ahead of it), so its length grows by exactly one per step;
 *   - the trace stops after max_steps steps, or (max_steps <= 0) when every request has finished.
 *
 * Pages: request i owns ceil((prompt_len + decode_len) / page_size) pages, enough for its final
 * length; a step's row of length N uses its first ceil(N / page_size) pages.  With T the sum over
 * requests, the pool holds num_pages = ceil(T / (1 - hole_fraction)) pages (T when hole_fraction is
 * 0), shuffled by Fisher-Yates; request 0 takes the first pages of the shuffled pool, request 1 the
 * next ones, and so on; the remaining num_pages - T pages are the holes.  Page ids are int32, so
 * num_pages must not exceed INT32_MAX. */
#include "pkv_lab.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pkv_trace {
    pkv_trace_config config;
    int32_t num_requests;
    int32_t *prompt_len;   /* [num_requests] */
    int32_t *decode_len;   /* [num_requests] */
    int64_t *page_offset;  /* [num_requests + 1]: request r owns pages[page_offset[r] .. [r+1]) */
    int32_t *pages;        /* [page_offset[num_requests]] physical page ids */
    int64_t num_pages;     /* pool size, holes included */
    int32_t num_steps;
    int64_t *step_offset;  /* [num_steps + 1]: step s owns rows [step_offset[s] .. [s+1]) */
    int32_t *row_request;  /* [step_offset[num_steps]] request id of each row */
    int32_t *row_len;      /* [step_offset[num_steps]] sequence length of each row */
};

/* ------------------------------------------------------------------------------------------------
 * Families and configuration.
 * ---------------------------------------------------------------------------------------------- */
static const char *const family_names[PKV_TRACE_FAMILY_COUNT_] = {
    "uniform", "bimodal", "zipf", "bucketed", "homogeneous"};

const char *pkv_trace_family_name(pkv_trace_family f) {
    if ((int)f < 0 || (int)f >= (int)PKV_TRACE_FAMILY_COUNT_) return "unknown";
    return family_names[f];
}

pkv_status pkv_trace_family_parse(const char *name, pkv_trace_family *f) {
    if (!name || !f) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "trace family name or output is NULL");
    for (int i = 0; i < (int)PKV_TRACE_FAMILY_COUNT_; i++) {
        if (strcmp(name, family_names[i]) == 0) {
            *f = (pkv_trace_family)i;
            return PKV_OK;
        }
    }
    return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT,
                    "unknown trace family '%s' (uniform, bimodal, zipf, bucketed, homogeneous)", name);
}

void pkv_trace_config_default(pkv_trace_config *cfg, pkv_trace_family family) {
    if (!cfg) return;
    cfg->family = family;
    cfg->seed = UINT64_C(20260623); /* the first held-out seed */
    if (family == PKV_TRACE_BUCKETED) { /* the B1 bucketed run */
        cfg->num_requests = 16;
        cfg->max_active = 1;
        cfg->max_steps = 64;
    } else { /* the B8 runs */
        cfg->num_requests = 24;
        cfg->max_active = 8;
        cfg->max_steps = 48;
    }
    cfg->page_size = 16;
    cfg->hole_fraction = 0.0;
}

/* NULL if the configuration is usable, else what is wrong with it. */
static const char *config_problem(const pkv_trace_config *cfg) {
    if ((int)cfg->family < 0 || (int)cfg->family >= (int)PKV_TRACE_FAMILY_COUNT_)
        return "family is not a pkv_trace_family";
    if (cfg->num_requests <= 0) return "num_requests must be positive";
    if (cfg->max_active <= 0) return "max_active must be positive";
    if (cfg->page_size < 1 || cfg->page_size > 256) return "page_size must be in [1, 256]";
    if (!(cfg->hole_fraction >= 0.0 && cfg->hole_fraction <= 0.9)) /* also rejects NaN */
        return "hole_fraction must be in [0, 0.9]";
    return NULL;
}

/* ------------------------------------------------------------------------------------------------
 * Allocation of a trace.
 * ---------------------------------------------------------------------------------------------- */
static void *alloc_array(int64_t count, size_t elem) {
    if (count < 0 || (uint64_t)count > SIZE_MAX / elem) return NULL;
    return malloc(count > 0 ? (size_t)count * elem : 1);
}

void pkv_trace_free(pkv_trace *t) {
    if (!t) return;
    free(t->prompt_len);
    free(t->decode_len);
    free(t->page_offset);
    free(t->pages);
    free(t->step_offset);
    free(t->row_request);
    free(t->row_len);
    free(t);
}

/* A trace with its per-request arrays allocated for cap requests (pages and steps not yet). */
static pkv_trace *trace_alloc(const pkv_trace_config *cfg, int32_t cap) {
    pkv_trace *t = (pkv_trace *)calloc(1, sizeof *t);
    if (!t) return NULL;
    t->config = *cfg;
    t->num_requests = cfg->num_requests;
    t->prompt_len = (int32_t *)alloc_array(cap, sizeof(int32_t));
    t->decode_len = (int32_t *)alloc_array(cap, sizeof(int32_t));
    t->page_offset = (int64_t *)alloc_array((int64_t)cap + 1, sizeof(int64_t));
    if (!t->prompt_len || !t->decode_len || !t->page_offset) {
        pkv_trace_free(t);
        return NULL;
    }
    t->page_offset[0] = 0;
    return t;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ------------------------------------------------------------------------------------------------
 * Generation.
 * ---------------------------------------------------------------------------------------------- */

/* floor(65536 / sqrt(r)) in integer arithmetic: the largest q with q * q * r <= 2^32.  The same
 * value as floor(65536.0 / sqrt((double)r)), without depending on the platform's sqrt. */
static int64_t zipf_base(int64_t r) {
    int64_t lo = 0, hi = 65536; /* invariant: lo * lo * r <= 2^32 (r >= 1) */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (mid * mid * r <= (INT64_C(1) << 32)) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Draws request i's lengths (workloads.md), prompt draws first, then the decode draw:
 *   uniform      prompt U[4096, 32768]; decode U[16, 96]
 *   bimodal      requests i % 4 == 3 (the 4th, 8th, ... request) are long: prompt U[24576, 65536],
 *                decode U[32, 128]; the others prompt U[2048, 12288], decode U[8, 64]
 *   zipf         rank r = U[1, 32], then jitter U[-512, 512]; prompt = max(1024, 2048 +
 *                floor(65536 / sqrt(r)) + jitter); decode U[8, 128]
 *   bucketed     prompt 8192, 16384, 32768, 65536 for i % 4 = 0, 1, 2, 3 (no draw); decode U[32, 96]
 *   homogeneous  prompt 32768 (no draw); decode U[32, 96]
 * The prompt is then rounded up to a multiple of 16. */
static void draw_request(pkv_trace_family family, int32_t i, pkv_rng *rng, int32_t *prompt,
                         int32_t *decode) {
    static const int64_t bucket_prompts[4] = {8192, 16384, 32768, 65536};
    int64_t p = 0, d = 0;
    switch (family) {
    case PKV_TRACE_UNIFORM:
        p = pkv_rng_uniform_int(rng, 4096, 32768);
        d = pkv_rng_uniform_int(rng, 16, 96);
        break;
    case PKV_TRACE_BIMODAL:
        if (i % 4 == 3) {
            p = pkv_rng_uniform_int(rng, 24576, 65536);
            d = pkv_rng_uniform_int(rng, 32, 128);
        } else {
            p = pkv_rng_uniform_int(rng, 2048, 12288);
            d = pkv_rng_uniform_int(rng, 8, 64);
        }
        break;
    case PKV_TRACE_ZIPF: {
        int64_t rank = pkv_rng_uniform_int(rng, 1, 32);
        int64_t jitter = pkv_rng_uniform_int(rng, -512, 512);
        p = 2048 + zipf_base(rank) + jitter;
        if (p < 1024) p = 1024;
        d = pkv_rng_uniform_int(rng, 8, 128);
        break;
    }
    case PKV_TRACE_BUCKETED:
        p = bucket_prompts[i % 4];
        d = pkv_rng_uniform_int(rng, 32, 96);
        break;
    case PKV_TRACE_HOMOGENEOUS:
    case PKV_TRACE_FAMILY_COUNT_:
        p = 32768;
        d = pkv_rng_uniform_int(rng, 32, 96);
        break;
    }
    *prompt = (int32_t)ceil_div(p, 16) * 16;
    *decode = (int32_t)d;
}

/* Runs the serving model of the file comment over the trace's requests.  With record false it
 * only counts steps and rows; with record true it fills the step arrays, which must hold them.
 * served[] is scratch of num_requests entries. */
static pkv_status run_schedule(pkv_trace *t, int32_t *served, bool record, int32_t *num_steps_out,
                               int64_t *num_rows_out) {
    const int64_t n = t->num_requests, max_active = t->config.max_active;
    int64_t finished = 0, first_open = 0, rows = 0, step = 0;
    for (int64_t r = 0; r < n; r++) {
        served[r] = 0;
        if (t->decode_len[r] == 0) finished++;
    }
    if (record) t->step_offset[0] = 0;
    for (;; step++) {
        if (finished == n) break;
        if (t->config.max_steps > 0 && step >= t->config.max_steps) break;
        if (step >= INT32_MAX)
            return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "trace would exceed INT32_MAX steps");
        int64_t arrived = (step + 1) * max_active; /* requests i with floor(i / max_active) <= step */
        if (arrived > n) arrived = n;
        while (first_open < n && served[first_open] >= t->decode_len[first_open]) first_open++;
        int64_t batch = 0;
        for (int64_t r = first_open; r < arrived && batch < max_active; r++) {
            if (served[r] >= t->decode_len[r]) continue;
            served[r]++;
            if (record) {
                t->row_request[rows] = (int32_t)r;
                t->row_len[rows] = t->prompt_len[r] + served[r];
            }
            if (served[r] == t->decode_len[r]) finished++;
            rows++;
            batch++;
        }
        if (record) t->step_offset[step + 1] = rows;
    }
    *num_steps_out = (int32_t)step;
    *num_rows_out = rows;
    return PKV_OK;
}

pkv_status pkv_trace_generate(const pkv_trace_config *cfg, pkv_trace **trace) {
    if (!trace) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "trace output pointer is NULL");
    *trace = NULL;
    if (!cfg) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "trace config is NULL");
    const char *why = config_problem(cfg);
    if (why) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "trace config: %s", why);

    pkv_trace *t = trace_alloc(cfg, cfg->num_requests);
    if (!t) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate a trace of %" PRId32 " requests",
                            cfg->num_requests);
    if (t->config.hole_fraction == 0.0) t->config.hole_fraction = 0.0; /* -0.0 -> +0.0 */

    /* 1. Request lengths, in request order. */
    pkv_rng rng;
    pkv_rng_seed(&rng, cfg->seed);
    for (int32_t i = 0; i < t->num_requests; i++) {
        draw_request(cfg->family, i, &rng, &t->prompt_len[i], &t->decode_len[i]);
        int64_t need = ceil_div((int64_t)t->prompt_len[i] + t->decode_len[i], cfg->page_size);
        t->page_offset[i + 1] = t->page_offset[i] + need;
    }
    const int64_t used_pages = t->page_offset[t->num_requests];
    int64_t pool = used_pages;
    if (cfg->hole_fraction > 0.0 && used_pages <= INT32_MAX) {
        double want = (double)used_pages / (1.0 - cfg->hole_fraction);
        pool = (int64_t)want;
        if ((double)pool < want) pool++; /* ceil of one correctly rounded IEEE division */
    }
    if (pool > INT32_MAX) {
        pkv_trace_free(t);
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT,
                        "trace needs a pool of %" PRId64 " pages (with holes); page ids are int32",
                        pool);
    }
    t->num_pages = pool;

    /* 2. The shuffled pool; its first used_pages entries are the requests' pages. */
    t->pages = (int32_t *)alloc_array(pool, sizeof(int32_t));
    int32_t *served = (int32_t *)alloc_array(t->num_requests, sizeof(int32_t));
    if (!t->pages || !served) {
        free(served);
        pkv_trace_free(t);
        return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate a pool of %" PRId64 " pages", pool);
    }
    for (int64_t k = 0; k < pool; k++) t->pages[k] = (int32_t)k;
    for (int64_t k = pool - 1; k >= 1; k--) {
        int64_t j = pkv_rng_uniform_int(&rng, 0, k);
        int32_t tmp = t->pages[k];
        t->pages[k] = t->pages[j];
        t->pages[j] = tmp;
    }

    /* 3. The steps: count, allocate, record. */
    int32_t num_steps = 0;
    int64_t num_rows = 0;
    pkv_status st = run_schedule(t, served, false, &num_steps, &num_rows);
    if (st == PKV_OK) {
        t->step_offset = (int64_t *)alloc_array((int64_t)num_steps + 1, sizeof(int64_t));
        t->row_request = (int32_t *)alloc_array(num_rows, sizeof(int32_t));
        t->row_len = (int32_t *)alloc_array(num_rows, sizeof(int32_t));
        if (!t->step_offset || !t->row_request || !t->row_len)
            st = pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate %" PRId64 " trace rows", num_rows);
    }
    if (st == PKV_OK) st = run_schedule(t, served, true, &num_steps, &num_rows);
    free(served);
    if (st != PKV_OK) {
        pkv_trace_free(t);
        return st;
    }
    t->num_steps = num_steps;
    *trace = t;
    return PKV_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Accessors.
 * ---------------------------------------------------------------------------------------------- */
int32_t pkv_trace_num_steps(const pkv_trace *t) { return t ? t->num_steps : 0; }

int32_t pkv_trace_num_requests(const pkv_trace *t) { return t ? t->num_requests : 0; }

const pkv_trace_config *pkv_trace_get_config(const pkv_trace *t) { return t ? &t->config : NULL; }

int32_t pkv_trace_step(const pkv_trace *t, int32_t s, const int32_t **request_ids,
                       const int32_t **seq_lens) {
    if (!t || s < 0 || s >= t->num_steps) {
        if (request_ids) *request_ids = NULL;
        if (seq_lens) *seq_lens = NULL;
        return 0;
    }
    int64_t begin = t->step_offset[s];
    if (request_ids) *request_ids = t->row_request + begin;
    if (seq_lens) *seq_lens = t->row_len + begin;
    return (int32_t)(t->step_offset[s + 1] - begin);
}

void pkv_trace_request(const pkv_trace *t, int32_t r, int32_t *prompt_len, int32_t *decode_len) {
    bool ok = t && r >= 0 && r < t->num_requests;
    if (prompt_len) *prompt_len = ok ? t->prompt_len[r] : 0;
    if (decode_len) *decode_len = ok ? t->decode_len[r] : 0;
}

int64_t pkv_trace_num_pages(const pkv_trace *t) { return t ? t->num_pages : 0; }

/* -1 when request or j is out of range. */
int32_t pkv_trace_page(const pkv_trace *t, int32_t request, int32_t j) {
    if (!t || request < 0 || request >= t->num_requests || j < 0) return -1;
    int64_t index = t->page_offset[request] + j;
    if (index >= t->page_offset[request + 1]) return -1;
    return t->pages[index];
}

pkv_status pkv_trace_step_table(const pkv_trace *t, int32_t s, int32_t *indptr, int32_t *indices,
                                int64_t capacity, int32_t *lens) {
    if (!t || !indptr || !lens || (!indices && capacity > 0))
        return pkv_lab_fail(PKV_ERR_NULL_POINTER, "trace, indptr, indices or lens is NULL");
    if (s < 0 || s >= t->num_steps)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "step %" PRId32 " outside [0, %" PRId32 ")", s,
                        t->num_steps);
    const int64_t begin = t->step_offset[s], end = t->step_offset[s + 1];
    const int64_t page_size = t->config.page_size;
    int64_t needed = 0;
    for (int64_t row = begin; row < end; row++) needed += ceil_div(t->row_len[row], page_size);
    if (capacity < needed)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT,
                        "step %" PRId32 " needs %" PRId64 " page indices, capacity is %" PRId64, s, needed,
                        capacity);
    int64_t filled = 0;
    indptr[0] = 0;
    for (int64_t row = begin; row < end; row++) {
        const int32_t r = t->row_request[row];
        const int64_t count = ceil_div(t->row_len[row], page_size);
        memcpy(indices + filled, t->pages + t->page_offset[r], (size_t)count * sizeof(int32_t));
        filled += count;
        indptr[row - begin + 1] = (int32_t)filled; /* <= num_pages <= INT32_MAX: pages are unique */
        lens[row - begin] = t->row_len[row];
    }
    return PKV_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Checksum: 64-bit FNV-1a over this little-endian serialization (u32 = 4 bytes, u64 = 8 bytes,
 * signed values in two's complement):
 *   u32 family, u64 seed, u32 num_requests, u32 max_active, u32 max_steps, u32 page_size,
 *   u64 IEEE-754 bits of hole_fraction, u64 num_pages, u32 num_steps;
 *   for each step s: u32 row count, then for each row u32 request id, u32 seq_len;
 *   for each request r: u32 prompt_len, u32 decode_len, u32 page count, u32 each page id.
 * ---------------------------------------------------------------------------------------------- */
#define FNV_OFFSET_BASIS UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)

static uint64_t fnv_u64(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t fnv_u32(uint64_t h, uint32_t v) {
    for (int i = 0; i < 4; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= FNV_PRIME;
    }
    return h;
}

static uint64_t double_bits(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

uint64_t pkv_trace_checksum(const pkv_trace *t) {
    if (!t) return 0;
    const pkv_trace_config *c = &t->config;
    uint64_t h = FNV_OFFSET_BASIS;
    h = fnv_u32(h, (uint32_t)c->family);
    h = fnv_u64(h, c->seed);
    h = fnv_u32(h, (uint32_t)c->num_requests);
    h = fnv_u32(h, (uint32_t)c->max_active);
    h = fnv_u32(h, (uint32_t)c->max_steps);
    h = fnv_u32(h, (uint32_t)c->page_size);
    h = fnv_u64(h, double_bits(c->hole_fraction));
    h = fnv_u64(h, (uint64_t)t->num_pages);
    h = fnv_u32(h, (uint32_t)t->num_steps);
    for (int32_t s = 0; s < t->num_steps; s++) {
        h = fnv_u32(h, (uint32_t)(t->step_offset[s + 1] - t->step_offset[s]));
        for (int64_t row = t->step_offset[s]; row < t->step_offset[s + 1]; row++) {
            h = fnv_u32(h, (uint32_t)t->row_request[row]);
            h = fnv_u32(h, (uint32_t)t->row_len[row]);
        }
    }
    for (int32_t r = 0; r < t->num_requests; r++) {
        h = fnv_u32(h, (uint32_t)t->prompt_len[r]);
        h = fnv_u32(h, (uint32_t)t->decode_len[r]);
        h = fnv_u32(h, (uint32_t)(t->page_offset[r + 1] - t->page_offset[r]));
        for (int64_t k = t->page_offset[r]; k < t->page_offset[r + 1]; k++)
            h = fnv_u32(h, (uint32_t)t->pages[k]);
    }
    return h;
}

/* ------------------------------------------------------------------------------------------------
 * Trace files (CSV, text).  Layout:
 *
 *   # persistentkv-trace v1
 *   # family=<name> seed=<u64> num_requests=<n> max_active=<n> max_steps=<n> page_size=<n> hole_fraction=<x>
 *   # num_pages=<n> num_steps=<n>
 *   request,<id>,<prompt_len>,<decode_len>,<page0> <page1> ...     one per request, ids 0, 1, ...
 *   step,<s>,<request>,<seq_len>                                    one per row, after the requests
 *
 * The first three lines are exactly as shown (single spaces, keys in this order); hole_fraction is
 * printed with 17 significant digits so it reads back bit for bit (the "C" numeric locale is
 * assumed).  Later lines starting with '#' are comments; empty lines are ignored.  A request line
 * lists exactly ceil((prompt_len + decode_len) / page_size) page ids, each in [0, num_pages) and
 * used by no other request.  Step lines come in non-decreasing step order, with s in
 * [0, num_steps), request ids increasing within a step, at most max_active rows per step and
 * 0 <= seq_len <= prompt_len + decode_len.  A step with no line has no rows.  num_steps is at most
 * 2^24 (the step array is sized from it once the lines are read); num_requests sizes nothing by
 * itself (the request arrays grow with the request lines).  A file with a NUL byte is refused (text).
 * ---------------------------------------------------------------------------------------------- */
#define TRACE_MAGIC "# persistentkv-trace v1"

pkv_status pkv_trace_write(const pkv_trace *t, const char *path) {
    if (!t || !path) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "trace or path is NULL");
    FILE *f = fopen(path, "w");
    if (!f) return pkv_lab_fail(PKV_ERR_IO, "cannot open trace file '%s' for writing", path);
    const pkv_trace_config *c = &t->config;
    bool ok = fprintf(f, "%s\n", TRACE_MAGIC) >= 0;
    ok = ok && fprintf(f,
                       "# family=%s seed=%" PRIu64 " num_requests=%" PRId32 " max_active=%" PRId32
                       " max_steps=%" PRId32 " page_size=%" PRId32 " hole_fraction=%.17g\n",
                       pkv_trace_family_name(c->family), c->seed, c->num_requests, c->max_active,
                       c->max_steps, c->page_size, c->hole_fraction) >= 0;
    ok = ok && fprintf(f, "# num_pages=%" PRId64 " num_steps=%" PRId32 "\n", t->num_pages, t->num_steps) >= 0;
    for (int32_t r = 0; ok && r < t->num_requests; r++) {
        ok = fprintf(f, "request,%" PRId32 ",%" PRId32 ",%" PRId32 ",", r, t->prompt_len[r],
                     t->decode_len[r]) >= 0;
        for (int64_t k = t->page_offset[r]; ok && k < t->page_offset[r + 1]; k++)
            ok = fprintf(f, k == t->page_offset[r] ? "%" PRId32 : " %" PRId32, t->pages[k]) >= 0;
        ok = ok && fputc('\n', f) != EOF;
    }
    for (int32_t s = 0; ok && s < t->num_steps; s++) {
        for (int64_t row = t->step_offset[s]; ok && row < t->step_offset[s + 1]; row++)
            ok = fprintf(f, "step,%" PRId32 ",%" PRId32 ",%" PRId32 "\n", s, t->row_request[row],
                         t->row_len[row]) >= 0;
    }
    ok = ok && !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok) return pkv_lab_fail(PKV_ERR_IO, "cannot write trace file '%s'", path);
    return PKV_OK;
}

/* --- reading: lines ---------------------------------------------------------------------------- */
typedef struct line_reader {
    FILE *file;
    char *buf;
    size_t cap;
    long number; /* 1-based number of the line in buf */
} line_reader;

/* Reads the next line into lr->buf without its "\n" or "\r\n".  Returns 1 for a line, 0 at the
 * end of the file, -1 when out of memory, -2 on a read error, -3 for a NUL byte in the line (a text
 * file has none: fgets and strlen would cut the line there and read on as if it had ended). */
static int read_line(line_reader *lr) {
    size_t len = 0;
    int c = EOF;
    for (;;) {
        c = getc(lr->file);
        if (c == EOF || c == '\n') break;
        if (c == '\0') {
            lr->number++;
            return -3;
        }
        if (lr->cap - len < 2) {
            if (lr->cap > SIZE_MAX / 2) return -1;
            size_t cap = lr->cap ? lr->cap * 2 : 4096;
            char *grown = (char *)realloc(lr->buf, cap);
            if (!grown) return -1;
            lr->buf = grown;
            lr->cap = cap;
        }
        lr->buf[len++] = (char)c;
    }
    if (c == EOF && ferror(lr->file)) return -2;
    if (c == EOF && len == 0) return 0;
    if (!lr->buf && !(lr->buf = (char *)malloc(lr->cap = 4096))) return -1; /* an empty first line */
    lr->number++;
    lr->buf[len] = '\0';
    if (len > 0 && lr->buf[len - 1] == '\r') lr->buf[--len] = '\0';
    return 1;
}

/* --- reading: fields (each advances *p past what it took, or returns false) --------------------- */
static bool take_literal(const char **p, const char *literal) {
    size_t n = strlen(literal);
    if (strncmp(*p, literal, n) != 0) return false;
    *p += n;
    return true;
}

/* An optional '-' then decimal digits, in [lo, hi]. */
static bool take_int(const char **p, int64_t lo, int64_t hi, int64_t *out) {
    const char *s = *p;
    bool negative = *s == '-';
    if (negative) s++;
    if (*s < '0' || *s > '9') return false;
    uint64_t magnitude = 0;
    while (*s >= '0' && *s <= '9') {
        uint64_t digit = (uint64_t)(*s - '0');
        if (magnitude > (UINT64_C(1) << 63) / 10) return false;
        magnitude = magnitude * 10 + digit;
        if (magnitude > (UINT64_C(1) << 63)) return false;
        s++;
    }
    int64_t value;
    if (negative) value = magnitude == (UINT64_C(1) << 63) ? INT64_MIN : -(int64_t)magnitude;
    else if (magnitude > (uint64_t)INT64_MAX) return false;
    else value = (int64_t)magnitude;
    if (value < lo || value > hi) return false;
    *p = s;
    *out = value;
    return true;
}

/* Decimal digits, any value of a uint64_t. */
static bool take_u64(const char **p, uint64_t *out) {
    const char *s = *p;
    if (*s < '0' || *s > '9') return false;
    uint64_t value = 0;
    while (*s >= '0' && *s <= '9') {
        uint64_t digit = (uint64_t)(*s - '0');
        if (value > (UINT64_MAX - digit) / 10) return false;
        value = value * 10 + digit;
        s++;
    }
    *p = s;
    *out = value;
    return true;
}

/* A finite number as strtod reads it, starting with a digit, '-' or '.'. */
static bool take_double(const char **p, double *out) {
    const char *s = *p;
    if (!((*s >= '0' && *s <= '9') || *s == '-' || *s == '.')) return false;
    char *end = NULL;
    double value = strtod(s, &end);
    if (end == s || !(value == value) || value > 1e308 || value < -1e308) return false;
    *p = end;
    *out = value;
    return true;
}

/* --- reading: growable arrays ------------------------------------------------------------------ */
typedef struct i32_array { int32_t *data; int64_t size, cap; } i32_array;

static bool i32_push(i32_array *a, int32_t v) {
    if (a->size == a->cap) {
        int64_t cap = a->cap ? a->cap * 2 : 1024;
        if ((uint64_t)cap > SIZE_MAX / sizeof(int32_t)) return false;
        int32_t *grown = (int32_t *)realloc(a->data, (size_t)cap * sizeof(int32_t));
        if (!grown) return false;
        a->data = grown;
        a->cap = cap;
    }
    a->data[a->size++] = v;
    return true;
}

static int compare_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* --- reading: the file ------------------------------------------------------------------------- */
typedef struct trace_reader {
    const char *path;
    line_reader lines;
    pkv_trace *trace;
    int32_t requests_read;
    int64_t rows_in_last_step; /* rows read so far of the step of the last step line */
    int32_t request_cap;    /* requests the per-request arrays hold: they grow as request lines come, so
                             * a header's num_requests allocates nothing by itself */
    long *request_line;     /* [request_cap] line number of each request (for messages) */
    i32_array pages, row_step, row_request, row_len;
} trace_reader;

static pkv_status parse_fail(const trace_reader *rd, const char *what, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static pkv_status parse_fail(const trace_reader *rd, const char *what, ...) {
    char detail[256];
    va_list ap;
    va_start(ap, what);
    vsnprintf(detail, sizeof detail, what, ap);
    va_end(ap);
    return pkv_lab_fail(PKV_ERR_PARSE, "trace file '%s', line %ld: %s", rd->path, rd->lines.number,
                    detail);
}

/* Reads the next line; a missing line is a parse error. */
static pkv_status next_header_line(trace_reader *rd) {
    int got = read_line(&rd->lines);
    if (got == 1) return PKV_OK;
    if (got == -3) return parse_fail(rd, "NUL byte (a trace file is text)");
    if (got == -1) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate a line buffer");
    if (got == -2) return pkv_lab_fail(PKV_ERR_IO, "cannot read trace file '%s'", rd->path);
    rd->lines.number++;
    return parse_fail(rd, "file ends inside the header");
}

static pkv_status parse_header(trace_reader *rd, pkv_trace_config *cfg, int64_t *num_pages,
                               int64_t *num_steps) {
    pkv_status st = next_header_line(rd);
    if (st != PKV_OK) return st;
    if (strcmp(rd->lines.buf, TRACE_MAGIC) != 0) return parse_fail(rd, "expected '%s'", TRACE_MAGIC);

    if ((st = next_header_line(rd)) != PKV_OK) return st;
    const char *p = rd->lines.buf;
    if (!take_literal(&p, "# family=")) return parse_fail(rd, "expected '# family=<name> ...'");
    char name[32];
    size_t n = strcspn(p, " ");
    if (n >= sizeof name) return parse_fail(rd, "unknown trace family");
    memcpy(name, p, n);
    name[n] = '\0';
    p += n;
    int found = -1;
    for (int i = 0; i < (int)PKV_TRACE_FAMILY_COUNT_; i++)
        if (strcmp(name, family_names[i]) == 0) found = i;
    if (found < 0) return parse_fail(rd, "unknown trace family '%s'", name);
    cfg->family = (pkv_trace_family)found;
    int64_t v = 0;
    if (!take_literal(&p, " seed=") || !take_u64(&p, &cfg->seed))
        return parse_fail(rd, "expected ' seed=<unsigned 64-bit integer>'");
    if (!take_literal(&p, " num_requests=") || !take_int(&p, INT32_MIN, INT32_MAX, &v))
        return parse_fail(rd, "expected ' num_requests=<int32>'");
    cfg->num_requests = (int32_t)v;
    if (!take_literal(&p, " max_active=") || !take_int(&p, INT32_MIN, INT32_MAX, &v))
        return parse_fail(rd, "expected ' max_active=<int32>'");
    cfg->max_active = (int32_t)v;
    if (!take_literal(&p, " max_steps=") || !take_int(&p, INT32_MIN, INT32_MAX, &v))
        return parse_fail(rd, "expected ' max_steps=<int32>'");
    cfg->max_steps = (int32_t)v;
    if (!take_literal(&p, " page_size=") || !take_int(&p, INT32_MIN, INT32_MAX, &v))
        return parse_fail(rd, "expected ' page_size=<int32>'");
    cfg->page_size = (int32_t)v;
    if (!take_literal(&p, " hole_fraction=") || !take_double(&p, &cfg->hole_fraction))
        return parse_fail(rd, "expected ' hole_fraction=<number>'");
    if (*p != '\0') return parse_fail(rd, "unexpected text after hole_fraction: '%.40s'", p);
    const char *why = config_problem(cfg);
    if (why) return parse_fail(rd, "%s", why);
    if (cfg->hole_fraction == 0.0) cfg->hole_fraction = 0.0; /* -0.0 -> +0.0 */

    if ((st = next_header_line(rd)) != PKV_OK) return st;
    p = rd->lines.buf;
    if (!take_literal(&p, "# num_pages=") || !take_int(&p, 0, INT32_MAX, num_pages))
        return parse_fail(rd, "expected '# num_pages=<n in [0, INT32_MAX]> num_steps=<n>'");
    if (!take_literal(&p, " num_steps=") || !take_int(&p, 0, 1 << 24, num_steps) || *p != '\0')
        return parse_fail(rd, "expected ' num_steps=<n in [0, 2^24]>' to end the line");
    if (cfg->max_steps > 0 && *num_steps > cfg->max_steps)
        return parse_fail(rd, "num_steps %" PRId64 " exceeds max_steps %" PRId32, *num_steps,
                          cfg->max_steps);
    return PKV_OK;
}

/* Room for request r in the per-request arrays (doubling, up to num_requests). */
static bool grow_requests(trace_reader *rd, int32_t r) {
    pkv_trace *t = rd->trace;
    if (r < rd->request_cap) return true;
    int64_t cap = (int64_t)rd->request_cap * 2;
    if (cap > t->num_requests) cap = t->num_requests;
    int32_t *prompt = (int32_t *)realloc(t->prompt_len, (size_t)cap * sizeof(int32_t));
    if (prompt) t->prompt_len = prompt;
    int32_t *decode = (int32_t *)realloc(t->decode_len, (size_t)cap * sizeof(int32_t));
    if (decode) t->decode_len = decode;
    int64_t *offset = (int64_t *)realloc(t->page_offset, ((size_t)cap + 1) * sizeof(int64_t));
    if (offset) t->page_offset = offset;
    long *line = (long *)realloc(rd->request_line, (size_t)cap * sizeof(long));
    if (line) rd->request_line = line;
    if (!prompt || !decode || !offset || !line) return false;
    rd->request_cap = (int32_t)cap;
    return true;
}

static pkv_status parse_request_line(trace_reader *rd, const char *p) {
    pkv_trace *t = rd->trace;
    const int32_t r = rd->requests_read;
    if (r >= t->num_requests)
        return parse_fail(rd, "more request lines than num_requests=%" PRId32, t->num_requests);
    if (rd->row_step.size > 0) return parse_fail(rd, "request line after step lines");
    int64_t id = 0, prompt = 0, decode = 0;
    if (!take_int(&p, 0, INT32_MAX, &id) || id != r || !take_literal(&p, ","))
        return parse_fail(rd, "expected request id %" PRId32 " (requests are listed in order)", r);
    if (!take_int(&p, 0, INT32_MAX, &prompt) || !take_literal(&p, ","))
        return parse_fail(rd, "expected a prompt length in [0, INT32_MAX]");
    if (!take_int(&p, 0, INT32_MAX - prompt, &decode) || !take_literal(&p, ","))
        return parse_fail(rd, "expected a decode length with prompt + decode <= INT32_MAX");
    if (!grow_requests(rd, r)) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate trace requests");
    const int64_t count = ceil_div(prompt + decode, t->config.page_size);
    const int64_t used = rd->pages.size;
    if (count > t->num_pages - used)
        return parse_fail(rd, "request %" PRId32 " needs %" PRId64 " pages; the pool of %" PRId64
                              " has %" PRId64 " left", r, count, t->num_pages, t->num_pages - used);
    for (int64_t k = 0; k < count; k++) {
        int64_t page = 0;
        if (k > 0 && !take_literal(&p, " "))
            return parse_fail(rd, "request %" PRId32 " lists %" PRId64 " pages, expected %" PRId64, r, k, count);
        if (!take_int(&p, 0, t->num_pages - 1, &page))
            return parse_fail(rd, "page %" PRId64 " of request %" PRId32 " is not an id in [0, %" PRId64 ")",
                              k, r, t->num_pages);
        if (!i32_push(&rd->pages, (int32_t)page))
            return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate trace pages");
    }
    if (*p != '\0')
        return parse_fail(rd, "request %" PRId32 " has more than its %" PRId64 " pages (or trailing text)",
                          r, count);
    t->prompt_len[r] = (int32_t)prompt;
    t->decode_len[r] = (int32_t)decode;
    t->page_offset[r + 1] = rd->pages.size;
    rd->request_line[r] = rd->lines.number;
    rd->requests_read++;
    return PKV_OK;
}

static pkv_status parse_step_line(trace_reader *rd, const char *p) {
    const pkv_trace *t = rd->trace;
    if (rd->requests_read < t->num_requests)
        return parse_fail(rd, "step line before all %" PRId32 " request lines", t->num_requests);
    int64_t s = 0, r = 0, len = 0;
    const int64_t rows = rd->row_step.size;
    const int64_t last_step = rows > 0 ? rd->row_step.data[rows - 1] : 0;
    if (!take_int(&p, 0, (int64_t)t->num_steps - 1, &s) || !take_literal(&p, ","))
        return parse_fail(rd, "expected a step index in [0, num_steps=%" PRId32 ")", t->num_steps);
    if (s < last_step) return parse_fail(rd, "step %" PRId64 " after step %" PRId64, s, last_step);
    if (!take_int(&p, 0, (int64_t)t->num_requests - 1, &r) || !take_literal(&p, ","))
        return parse_fail(rd, "expected a request id in [0, %" PRId32 ")", t->num_requests);
    const int64_t max_len = (int64_t)t->prompt_len[r] + t->decode_len[r];
    if (!take_int(&p, 0, max_len, &len) || *p != '\0')
        return parse_fail(rd, "expected a sequence length in [0, %" PRId64 "] to end the line", max_len);
    const int64_t in_step = (rows > 0 && s == last_step) ? rd->rows_in_last_step : 0;
    if (in_step > 0 && r <= rd->row_request.data[rows - 1])
        return parse_fail(rd, "request %" PRId64 " after request %" PRId32 " in step %" PRId64
                              " (ids must increase within a step)", r, rd->row_request.data[rows - 1], s);
    if (in_step >= t->config.max_active)
        return parse_fail(rd, "step %" PRId64 " has more than max_active=%" PRId32 " rows", s,
                          t->config.max_active);
    if (!i32_push(&rd->row_step, (int32_t)s) || !i32_push(&rd->row_request, (int32_t)r) ||
        !i32_push(&rd->row_len, (int32_t)len))
        return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate trace rows");
    rd->rows_in_last_step = in_step + 1;
    return PKV_OK;
}

/* After the last line: every request present, page ids unique across requests, step offsets. */
static pkv_status finish_trace(trace_reader *rd) {
    pkv_trace *t = rd->trace;
    if (rd->requests_read < t->num_requests)
        return parse_fail(rd, "file ends after %" PRId32 " of %" PRId32 " request lines", rd->requests_read,
                          t->num_requests);
    const int64_t total = rd->pages.size;
    uint64_t *keys = (uint64_t *)alloc_array(total, sizeof(uint64_t)); /* page << 32 | request */
    if (!keys) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate %" PRId64 " page keys", total);
    for (int32_t r = 0; r < t->num_requests; r++)
        for (int64_t k = t->page_offset[r]; k < t->page_offset[r + 1]; k++)
            keys[k] = ((uint64_t)(uint32_t)rd->pages.data[k] << 32) | (uint32_t)r;
    if (total > 1) qsort(keys, (size_t)total, sizeof *keys, compare_u64);
    for (int64_t k = 1; k < total; k++) {
        if ((keys[k] >> 32) == (keys[k - 1] >> 32)) {
            uint32_t page = (uint32_t)(keys[k] >> 32), first = (uint32_t)keys[k - 1], second = (uint32_t)keys[k];
            free(keys);
            rd->lines.number = rd->request_line[second];
            return parse_fail(rd, "page %" PRIu32 " of request %" PRIu32 " is also a page of request %" PRIu32,
                              page, second, first);
        }
    }
    free(keys);

    t->pages = rd->pages.data; /* the trace takes the arrays over */
    rd->pages.data = NULL;
    if (!t->pages && !(t->pages = (int32_t *)malloc(1)))
        return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate trace pages");
    const int64_t rows = rd->row_step.size;
    t->step_offset = (int64_t *)alloc_array((int64_t)t->num_steps + 1, sizeof(int64_t));
    if (!t->step_offset) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate trace steps");
    int64_t row = 0;
    for (int32_t s = 0; s <= t->num_steps; s++) {
        t->step_offset[s] = row;
        while (row < rows && rd->row_step.data[row] == s) row++;
    }
    t->row_request = rd->row_request.data;
    t->row_len = rd->row_len.data;
    rd->row_request.data = rd->row_len.data = NULL;
    if (!t->row_request) t->row_request = (int32_t *)malloc(1);
    if (!t->row_len) t->row_len = (int32_t *)malloc(1);
    if (!t->row_request || !t->row_len)
        return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate trace rows");
    return PKV_OK;
}

static pkv_status read_trace(trace_reader *rd) {
    pkv_trace_config cfg;
    int64_t num_pages = 0, num_steps = 0;
    pkv_status st = parse_header(rd, &cfg, &num_pages, &num_steps);
    if (st != PKV_OK) return st;
    rd->request_cap = cfg.num_requests < 1024 ? cfg.num_requests : 1024;
    rd->trace = trace_alloc(&cfg, rd->request_cap);
    rd->request_line = (long *)alloc_array(rd->request_cap, sizeof(long));
    if (!rd->trace || !rd->request_line)
        return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate a trace of %" PRId32 " requests",
                        cfg.num_requests);
    rd->trace->num_pages = num_pages;
    rd->trace->num_steps = (int32_t)num_steps;
    for (;;) {
        int got = read_line(&rd->lines);
        if (got == -3) return parse_fail(rd, "NUL byte (a trace file is text)");
        if (got == -1) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate a line buffer");
        if (got == -2) return pkv_lab_fail(PKV_ERR_IO, "cannot read trace file '%s'", rd->path);
        if (got == 0) break;
        const char *p = rd->lines.buf;
        if (*p == '\0' || *p == '#') continue;
        if (take_literal(&p, "request,")) st = parse_request_line(rd, p);
        else if (take_literal(&p, "step,")) st = parse_step_line(rd, p);
        else st = parse_fail(rd, "expected a 'request,' or 'step,' line");
        if (st != PKV_OK) return st;
    }
    return finish_trace(rd);
}

pkv_status pkv_trace_read(const char *path, pkv_trace **trace) {
    if (!trace) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "trace output pointer is NULL");
    *trace = NULL;
    if (!path) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "trace file path is NULL");
    trace_reader rd;
    memset(&rd, 0, sizeof rd);
    rd.path = path;
    rd.lines.file = fopen(path, "r");
    if (!rd.lines.file) return pkv_lab_fail(PKV_ERR_IO, "cannot open trace file '%s'", path);
    pkv_status st = read_trace(&rd);
    fclose(rd.lines.file);
    free(rd.lines.buf);
    free(rd.request_line);
    free(rd.pages.data);
    free(rd.row_step.data);
    free(rd.row_request.data);
    free(rd.row_len.data);
    if (st != PKV_OK) {
        pkv_trace_free(rd.trace);
        return st;
    }
    *trace = rd.trace;
    return PKV_OK;
}
