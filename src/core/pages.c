/* pages.c - the page manager: a pool of KV pages on the host side, as plain data (it never touches
 * device memory).  Requests (ids the caller picks in [0, max_requests)) own ordered lists of pages; a
 * page's reference count is the number of requests whose list holds it (more than one after a fork).
 *
 *   free pages    a stack (LIFO): the page released last is the one handed out next (still hot in L2);
 *                 at creation pages come out in order 0, 1, 2, ...; a request's pages are released from
 *                 its last to its first, so its first page is the next one handed out.
 *   extend        a new page only where the last one is full; a partial last page that is shared is
 *                 first replaced by a fresh page (copy-on-write: the copy is the caller's to execute).
 *   counters      pages used / free / shared, peak, live requests, tokens, internal fragmentation (the
 *                 unused slots of each live request's last page), copies handed out: kept exact by
 *                 every operation, read in O(1).
 *
 * Every operation checks everything first and then changes the pool, so a failure (a specific status and
 * message) leaves it exactly as it was.  Table emission is two passes over the rows (check, then copy
 * the page lists): O(B + pages), no allocation.  Host memory is allocated only at creation and when a
 * request's page list grows past its capacity (doubling; kept when the request is freed, for the next
 * request of that id). */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define PKV_POOL_MAX_REQUESTS (1 << 20)

enum { REQ_NEVER = 0, REQ_LIVE = 1, REQ_FREED = 2 };

typedef struct pool_request {
    int32_t state;  /* REQ_NEVER, REQ_LIVE or REQ_FREED */
    int32_t len;    /* tokens */
    int32_t npages; /* ceil(len / page_size), always */
    int32_t cap;    /* capacity of pages */
    int32_t *pages; /* [cap], the first npages in order */
} pool_request;

struct pkv_page_pool {
    int32_t num_pages, page_size, max_requests;
    int32_t *refs;       /* [num_pages] references per page */
    int32_t *free_stack; /* [num_pages]; free_stack[free_top - 1] is handed out next */
    int32_t free_top;
    pool_request *req;   /* [max_requests] */
    pkv_page_pool_stats st;
};

static int32_t pages_for(const pkv_page_pool *pool, int64_t len) {
    return (int32_t)((len + pool->page_size - 1) / pool->page_size);
}

/* unused slots of a request's last page */
static int64_t frag_of(const pkv_page_pool *pool, int32_t len, int32_t npages) {
    return (int64_t)npages * pool->page_size - len;
}

pkv_status pkv_page_pool_create(int64_t num_pages, int32_t page_size, int32_t max_requests, pkv_page_pool **pool) {
    if (!pool) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pool is NULL");
    *pool = NULL;
    if (num_pages < 1 || num_pages > INT32_MAX)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "num_pages %lld is not in [1, 2^31)", (long long)num_pages);
    if (page_size < 1 || page_size > 256)
        return pkv_fail(NULL, PKV_ERR_PAGE_SIZE, "page_size %d is not in [1, 256]", page_size);
    if (max_requests < 1 || max_requests > PKV_POOL_MAX_REQUESTS)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "max_requests %d is not in [1, %d]", max_requests,
                        PKV_POOL_MAX_REQUESTS);
    pkv_page_pool *p = (pkv_page_pool *)calloc(1, sizeof *p);
    if (!p) return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot allocate the page pool");
    p->refs = (int32_t *)calloc((size_t)num_pages, sizeof *p->refs);
    p->free_stack = (int32_t *)malloc((size_t)num_pages * sizeof *p->free_stack);
    p->req = (pool_request *)calloc((size_t)max_requests, sizeof *p->req);
    if (!p->refs || !p->free_stack || !p->req) {
        pkv_page_pool_free(p);
        return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot allocate a pool of %lld pages and %d requests",
                        (long long)num_pages, max_requests);
    }
    p->num_pages = (int32_t)num_pages;
    p->page_size = page_size;
    p->max_requests = max_requests;
    for (int32_t i = 0; i < p->num_pages; i++) p->free_stack[i] = p->num_pages - 1 - i; /* page 0 on top */
    p->free_top = p->num_pages;
    p->st.num_pages = num_pages;
    p->st.pages_free = num_pages;
    *pool = p;
    return PKV_OK;
}

void pkv_page_pool_free(pkv_page_pool *pool) {
    if (!pool) return;
    if (pool->req)
        for (int32_t r = 0; r < pool->max_requests; r++) free(pool->req[r].pages);
    free(pool->req);
    free(pool->refs);
    free(pool->free_stack);
    free(pool);
}

pkv_status pkv_page_pool_get_stats(const pkv_page_pool *pool, pkv_page_pool_stats *stats) {
    if (!pool || !stats) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pool and stats must not be NULL");
    *stats = pool->st;
    return PKV_OK;
}

int32_t pkv_page_pool_page_refs(const pkv_page_pool *pool, int32_t page) {
    if (!pool || page < 0 || page >= pool->num_pages) return -1;
    return pool->refs[page];
}

/* ---- internals ----------------------------------------------------------------------------------- */
/* The live request req, or the status that says why it is not one. */
static pkv_status lookup(const pkv_page_pool *pool, int32_t req, const char *what, pool_request **out) {
    if (!pool) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "%s: pool is NULL", what);
    if (req < 0 || req >= pool->max_requests)
        return pkv_fail(NULL, PKV_ERR_UNKNOWN_REQUEST, "%s: request %d is outside the pool's ids [0, %d)", what, req,
                        pool->max_requests);
    pool_request *r = &pool->req[req];
    if (r->state == REQ_NEVER)
        return pkv_fail(NULL, PKV_ERR_UNKNOWN_REQUEST, "%s: request %d was never created", what, req);
    if (r->state == REQ_FREED)
        return pkv_fail(NULL, PKV_ERR_REQUEST_FREED, "%s: request %d was freed", what, req);
    *out = r;
    return PKV_OK;
}

/* An id that create or fork may make live. */
static pkv_status check_new_id(const pkv_page_pool *pool, int32_t req, const char *what) {
    if (req < 0 || req >= pool->max_requests)
        return pkv_fail(NULL, PKV_ERR_UNKNOWN_REQUEST, "%s: request %d is outside the pool's ids [0, %d)", what, req,
                        pool->max_requests);
    if (pool->req[req].state == REQ_LIVE)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "%s: request %d is live (free it first)", what, req);
    return PKV_OK;
}

/* Room for n pages in the request's list (nothing changes on failure). */
static pkv_status reserve(pool_request *r, int32_t n, int32_t req) {
    if (n <= r->cap) return PKV_OK;
    int64_t cap = r->cap > 0 ? r->cap : 4;
    while (cap < n) cap *= 2;
    int32_t *pages = (int32_t *)realloc(r->pages, (size_t)cap * sizeof *pages);
    if (!pages) return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot grow the page list of request %d", req);
    r->pages = pages;
    r->cap = (int32_t)cap;
    return PKV_OK;
}

/* Pops a free page (the caller checked there is one). */
static int32_t take_page(pkv_page_pool *pool) {
    const int32_t pg = pool->free_stack[--pool->free_top];
    pool->refs[pg] = 1;
    pool->st.pages_used++;
    pool->st.pages_free--;
    if (pool->st.pages_used > pool->st.peak_used) pool->st.peak_used = pool->st.pages_used;
    return pg;
}

/* Drops one reference; the last one returns the page to the top of the free stack. */
static void release_page(pkv_page_pool *pool, int32_t pg) {
    const int32_t refs = --pool->refs[pg];
    if (refs == 1) pool->st.pages_shared--;
    if (refs == 0) {
        pool->free_stack[pool->free_top++] = pg;
        pool->st.pages_used--;
        pool->st.pages_free++;
    }
}

static pkv_status check_len(int64_t len, const char *what) {
    if (len < 0) return pkv_fail(NULL, PKV_ERR_NEGATIVE_LENGTH, "%s: length %lld is negative", what, (long long)len);
    if (len > PKV_MAX_SEQ_LEN)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "%s: length %lld is above 2^30", what, (long long)len);
    return PKV_OK;
}

/* ---- requests ------------------------------------------------------------------------------------ */
pkv_status pkv_request_create(pkv_page_pool *pool, int32_t req, int32_t prompt_len) {
    if (!pool) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_request_create: pool is NULL");
    pkv_status s = check_new_id(pool, req, "pkv_request_create");
    if (s == PKV_OK) s = check_len(prompt_len, "pkv_request_create");
    if (s != PKV_OK) return s;
    const int32_t need = pages_for(pool, prompt_len);
    if (need > pool->free_top)
        return pkv_fail(NULL, PKV_ERR_POOL_EXHAUSTED, "request %d needs %d pages for %d tokens, %d are free", req, need,
                        prompt_len, pool->free_top);
    pool_request *r = &pool->req[req];
    if ((s = reserve(r, need, req)) != PKV_OK) return s;
    for (int32_t j = 0; j < need; j++) r->pages[j] = take_page(pool);
    r->state = REQ_LIVE;
    r->len = prompt_len;
    r->npages = need;
    pool->st.live_requests++;
    pool->st.tokens += prompt_len;
    pool->st.fragmentation += frag_of(pool, r->len, r->npages);
    return PKV_OK;
}

pkv_status pkv_request_free(pkv_page_pool *pool, int32_t req) {
    pool_request *r = NULL;
    const pkv_status s = lookup(pool, req, "pkv_request_free", &r);
    if (s != PKV_OK) return s;
    for (int32_t j = r->npages - 1; j >= 0; j--) release_page(pool, r->pages[j]);
    pool->st.live_requests--;
    pool->st.tokens -= r->len;
    pool->st.fragmentation -= frag_of(pool, r->len, r->npages);
    r->state = REQ_FREED;
    r->len = r->npages = 0;
    return PKV_OK;
}

pkv_status pkv_request_extend(pkv_page_pool *pool, int32_t req, int32_t n, pkv_page_copy *copy) {
    if (copy) copy->src_page = copy->dst_page = -1;
    pool_request *r = NULL;
    pkv_status s = lookup(pool, req, "pkv_request_extend", &r);
    if (s != PKV_OK) return s;
    if (n < 0) return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "pkv_request_extend: n = %d is negative", n);
    const int64_t len = (int64_t)r->len + n;
    if ((s = check_len(len, "pkv_request_extend")) != PKV_OK) return s;
    if (n == 0) return PKV_OK;
    const int32_t ps = pool->page_size;
    const bool cow = r->len % ps != 0 && pool->refs[r->pages[r->npages - 1]] > 1;
    const int32_t npages = pages_for(pool, len);
    const int32_t need = npages - r->npages + (cow ? 1 : 0);
    if (need > pool->free_top)
        return pkv_fail(NULL, PKV_ERR_POOL_EXHAUSTED, "request %d needs %d more pages for %d tokens%s, %d are free",
                        req, need, n, cow ? " (one a copy of its shared last page)" : "", pool->free_top);
    if (cow && !copy)
        return pkv_fail(NULL, PKV_ERR_NULL_POINTER,
                        "pkv_request_extend: request %d's last page %d is shared and must be copied, but copy is NULL",
                        req, r->pages[r->npages - 1]);
    if ((s = reserve(r, npages, req)) != PKV_OK) return s;
    pool->st.fragmentation -= frag_of(pool, r->len, r->npages);
    if (cow) {
        const int32_t old = r->pages[r->npages - 1], fresh = take_page(pool);
        release_page(pool, old); /* still referenced by the request(s) it is shared with */
        r->pages[r->npages - 1] = fresh;
        copy->src_page = old;
        copy->dst_page = fresh;
        pool->st.cow_copies++;
    }
    for (int32_t j = r->npages; j < npages; j++) r->pages[j] = take_page(pool);
    r->npages = npages;
    r->len = (int32_t)len;
    pool->st.tokens += n;
    pool->st.fragmentation += frag_of(pool, r->len, r->npages);
    return PKV_OK;
}

pkv_status pkv_request_truncate(pkv_page_pool *pool, int32_t req, int32_t new_len) {
    pool_request *r = NULL;
    pkv_status s = lookup(pool, req, "pkv_request_truncate", &r);
    if (s != PKV_OK) return s;
    if ((s = check_len(new_len, "pkv_request_truncate")) != PKV_OK) return s;
    if (new_len > r->len)
        return pkv_fail(NULL, PKV_ERR_BEYOND_LENGTH, "pkv_request_truncate: request %d has %d tokens, not %d", req,
                        r->len, new_len);
    const int32_t keep = pages_for(pool, new_len);
    pool->st.fragmentation -= frag_of(pool, r->len, r->npages);
    for (int32_t j = r->npages - 1; j >= keep; j--) release_page(pool, r->pages[j]);
    pool->st.tokens -= r->len - new_len;
    r->npages = keep;
    r->len = new_len;
    pool->st.fragmentation += frag_of(pool, r->len, r->npages);
    return PKV_OK;
}

pkv_status pkv_request_fork(pkv_page_pool *pool, int32_t src, int32_t dst) {
    pool_request *r = NULL;
    pkv_status s = lookup(pool, src, "pkv_request_fork", &r);
    if (s != PKV_OK) return s;
    if ((s = check_new_id(pool, dst, "pkv_request_fork")) != PKV_OK) return s;
    pool_request *d = &pool->req[dst];
    if ((s = reserve(d, r->npages, dst)) != PKV_OK) return s;
    for (int32_t j = 0; j < r->npages; j++) {
        const int32_t pg = r->pages[j];
        if (pool->refs[pg]++ == 1) pool->st.pages_shared++;
        d->pages[j] = pg;
    }
    d->state = REQ_LIVE;
    d->len = r->len;
    d->npages = r->npages;
    pool->st.live_requests++;
    pool->st.tokens += d->len;
    pool->st.fragmentation += frag_of(pool, d->len, d->npages);
    return PKV_OK;
}

pkv_status pkv_request_length(const pkv_page_pool *pool, int32_t req, int32_t *length) {
    if (!length) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_request_length: length is NULL");
    pool_request *r = NULL;
    const pkv_status s = lookup(pool, req, "pkv_request_length", &r);
    if (s != PKV_OK) return s;
    *length = r->len;
    return PKV_OK;
}

pkv_status pkv_request_pages(const pkv_page_pool *pool, int32_t req, int32_t *pages_out, int64_t capacity,
                             int32_t *count) {
    if (!count) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_request_pages: count is NULL");
    pool_request *r = NULL;
    const pkv_status s = lookup(pool, req, "pkv_request_pages", &r);
    if (s != PKV_OK) return s;
    *count = r->npages;
    if (capacity == 0 && !pages_out) return PKV_OK;
    if (!pages_out) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_request_pages: pages_out is NULL");
    if (capacity < r->npages)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "pkv_request_pages: request %d has %d pages, capacity is %lld",
                        req, r->npages, (long long)capacity);
    if (r->npages > 0) memcpy(pages_out, r->pages, (size_t)r->npages * sizeof *pages_out);
    return PKV_OK;
}

pkv_status pkv_request_pages_from(const pkv_page_pool *pool, int32_t req, int32_t first, int32_t *pages_out,
                                  int64_t capacity, int32_t *count) {
    if (!count) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_request_pages_from: count is NULL");
    pool_request *r = NULL;
    const pkv_status s = lookup(pool, req, "pkv_request_pages_from", &r);
    if (s != PKV_OK) return s;
    if (first < 0 || first > r->npages)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "pkv_request_pages_from: first %d is not in [0, %d]", first,
                        r->npages);
    const int32_t n = r->npages - first;
    if (n > 0 && !pages_out) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_request_pages_from: pages_out is NULL");
    if (capacity < n)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT,
                        "pkv_request_pages_from: %d pages from %d on, capacity is %lld", n, first, (long long)capacity);
    if (n > 0) memcpy(pages_out, r->pages + first, (size_t)n * sizeof *pages_out);
    *count = r->npages;
    return PKV_OK;
}

/* ---- tables -------------------------------------------------------------------------------------- */
/* The rows' page count (every request live), or the status of the first bad row. */
static pkv_status rows_pages(const pkv_page_pool *pool, const int32_t *reqs, int32_t batch_size, const char *what,
                             int64_t *total) {
    if (!pool) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "%s: pool is NULL", what);
    if (batch_size < 0 || batch_size > PKV_MAX_BATCH)
        return pkv_fail(NULL, PKV_ERR_BATCH_SIZE, "%s: batch_size %d is not in [0, %d]", what, batch_size,
                        PKV_MAX_BATCH);
    if (batch_size > 0 && !reqs) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "%s: reqs is NULL", what);
    int64_t sum = 0;
    for (int32_t i = 0; i < batch_size; i++) {
        pool_request *r = NULL;
        const pkv_status s = lookup(pool, reqs[i], what, &r);
        if (s != PKV_OK) return s;
        sum += r->npages;
    }
    if (sum > INT32_MAX)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "%s: %lld pages do not fit an int32 kv_indptr", what,
                        (long long)sum);
    *total = sum;
    return PKV_OK;
}

pkv_status pkv_page_pool_table_size(const pkv_page_pool *pool, const int32_t *reqs, int32_t batch_size,
                                    int64_t *num_indices) {
    if (!num_indices) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_page_pool_table_size: num_indices is NULL");
    int64_t total = 0;
    const pkv_status s = rows_pages(pool, reqs, batch_size, "pkv_page_pool_table_size", &total);
    if (s == PKV_OK) *num_indices = total;
    return s;
}

pkv_status pkv_page_pool_table(const pkv_page_pool *pool, const int32_t *reqs, int32_t batch_size, int32_t *kv_indptr,
                               int32_t *kv_page_indices, int64_t capacity, int32_t *kv_last_page_len,
                               int32_t *seq_lens) {
    int64_t total = 0;
    const pkv_status s = rows_pages(pool, reqs, batch_size, "pkv_page_pool_table", &total);
    if (s != PKV_OK) return s;
    if (!kv_indptr) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_page_pool_table: kv_indptr is NULL");
    if (total > 0 && !kv_page_indices)
        return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_page_pool_table: kv_page_indices is NULL");
    if (total > capacity)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT,
                        "pkv_page_pool_table: the rows have %lld pages, kv_page_indices holds %lld (see "
                        "pkv_page_pool_table_size)",
                        (long long)total, (long long)capacity);
    const int32_t ps = pool->page_size;
    int32_t at = 0;
    kv_indptr[0] = 0;
    for (int32_t i = 0; i < batch_size; i++) {
        const pool_request *r = &pool->req[reqs[i]];
        if (r->npages > 0) memcpy(kv_page_indices + at, r->pages, (size_t)r->npages * sizeof *kv_page_indices);
        at += r->npages;
        kv_indptr[i + 1] = at;
        if (kv_last_page_len) kv_last_page_len[i] = r->len - (r->npages > 0 ? (r->npages - 1) * ps : 0);
        if (seq_lens) seq_lens[i] = r->len;
    }
    return PKV_OK;
}

pkv_status pkv_page_pool_check_table(const pkv_page_pool *pool, const int32_t *reqs, const pkv_page_table *table) {
    if (!pool || !table) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "pkv_page_pool_check_table: pool and table must not be NULL");
    if (table->batch_size > 0 && (!reqs || !table->kv_page_indices))
        return pkv_fail(NULL, PKV_ERR_NULL_POINTER,
                        "pkv_page_pool_check_table: reqs and the table's kv_page_indices must not be NULL");
    pkv_problem shape;
    pkv_problem_default(&shape);
    shape.page_size = pool->page_size;
    shape.num_pages = pool->num_pages;
    pkv_status s = pkv_check_table(NULL, &shape, table, true);
    if (s != PKV_OK) return s;
    for (int32_t i = 0; i < table->batch_size; i++) {
        pool_request *r = NULL;
        if ((s = lookup(pool, reqs[i], "pkv_page_pool_check_table", &r)) != PKV_OK) return s;
        const int32_t base = table->kv_indptr[i], count = table->kv_indptr[i + 1] - base;
        for (int32_t j = 0; j < count; j++) {
            const int32_t pg = table->kv_page_indices[base + j];
            if (j >= r->npages)
                return pkv_fail(NULL, PKV_ERR_FOREIGN_PAGE,
                                "row %d (request %d) names page %d at position %d, but the request owns %d pages", i,
                                reqs[i], pg, j, r->npages);
            if (pg != r->pages[j])
                return pkv_fail(NULL, PKV_ERR_FOREIGN_PAGE,
                                "row %d (request %d) names page %d (%d references) at position %d, where the request "
                                "owns page %d",
                                i, reqs[i], pg, pool->refs[pg], j, r->pages[j]);
        }
        if (table->seq_lens[i] > r->len)
            return pkv_fail(NULL, PKV_ERR_BEYOND_LENGTH, "row %d (request %d) has length %d, the request %d tokens", i,
                            reqs[i], table->seq_lens[i], r->len);
    }
    return PKV_OK;
}
