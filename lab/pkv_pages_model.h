/* pkv_pages_model.h - the simple model of the page manager (src/core/pages.c) that tests and the fuzzer
 * check it against: plain arrays and linear scans, written from the contract in persistentkv.h and
 * docs/pages.md, never from the manager's code.
 *
 * The model predicts each operation's status and, on success, its exact effect - which pages come off the
 * free stack (LIFO: the page released last comes out first; a request releases its pages from the last to
 * the first; at creation pages come out 0, 1, 2, ...), the copy-on-write copy of an extend - and
 * pkv_pages_model_compare checks the manager against it: every request's length and page list, every
 * page's references (also recounted from the lists: no page lost, none owned twice by one request, a
 * page's references = the live requests listing it), and every counter of pkv_page_pool_stats.
 *
 * Header only (static functions), for tests/test_pages.c and fuzz/fuzz_pages.c. */
#ifndef PKV_PAGES_MODEL_H
#define PKV_PAGES_MODEL_H

#include "persistentkv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PKV_MODEL_NEVER = 0, PKV_MODEL_LIVE = 1, PKV_MODEL_FREED = 2 };

typedef struct pkv_pages_model {
    int32_t num_pages, page_size, max_requests;
    int32_t *refs;   /* [num_pages] */
    int32_t *stack;  /* [num_pages] free pages; stack[top - 1] comes out next */
    int32_t top;
    int32_t *state;  /* [max_requests] */
    int32_t *len;    /* [max_requests] */
    int32_t *npages; /* [max_requests] */
    int32_t **pages; /* [max_requests][num_pages] */
    int64_t peak, cow_copies;
} pkv_pages_model;

static inline void pkv_pages_model_free(pkv_pages_model *m) {
    if (m->pages)
        for (int32_t r = 0; r < m->max_requests; r++) free(m->pages[r]);
    free(m->pages);
    free(m->refs);
    free(m->stack);
    free(m->state);
    free(m->len);
    free(m->npages);
    memset(m, 0, sizeof *m);
}

/* 0 on success; small pools only (max_requests x num_pages ints). */
static inline int pkv_pages_model_init(pkv_pages_model *m, int32_t num_pages, int32_t page_size, int32_t max_requests) {
    memset(m, 0, sizeof *m);
    m->num_pages = num_pages;
    m->page_size = page_size;
    m->max_requests = max_requests;
    m->refs = (int32_t *)calloc((size_t)num_pages, sizeof(int32_t));
    m->stack = (int32_t *)calloc((size_t)num_pages, sizeof(int32_t));
    m->state = (int32_t *)calloc((size_t)max_requests, sizeof(int32_t));
    m->len = (int32_t *)calloc((size_t)max_requests, sizeof(int32_t));
    m->npages = (int32_t *)calloc((size_t)max_requests, sizeof(int32_t));
    m->pages = (int32_t **)calloc((size_t)max_requests, sizeof(int32_t *));
    if (!m->refs || !m->stack || !m->state || !m->len || !m->npages || !m->pages) return -1;
    for (int32_t r = 0; r < max_requests; r++)
        if (!(m->pages[r] = (int32_t *)calloc((size_t)num_pages, sizeof(int32_t)))) return -1;
    for (int32_t i = 0; i < num_pages; i++) m->stack[i] = num_pages - 1 - i;
    m->top = num_pages;
    return 0;
}

static inline int32_t pkv_pages_model_pages_for(const pkv_pages_model *m, int64_t len) {
    return (int32_t)((len + m->page_size - 1) / m->page_size);
}

static inline int32_t pkv_pages_model_take(pkv_pages_model *m) {
    const int32_t pg = m->stack[--m->top];
    m->refs[pg] = 1;
    const int64_t used = m->num_pages - m->top;
    if (used > m->peak) m->peak = used;
    return pg;
}

static inline void pkv_pages_model_release(pkv_pages_model *m, int32_t pg) {
    if (--m->refs[pg] == 0) m->stack[m->top++] = pg;
}

/* The status a lookup of a live request gives. */
static inline pkv_status pkv_pages_model_lookup(const pkv_pages_model *m, int32_t req) {
    if (req < 0 || req >= m->max_requests || m->state[req] == PKV_MODEL_NEVER) return PKV_ERR_UNKNOWN_REQUEST;
    if (m->state[req] == PKV_MODEL_FREED) return PKV_ERR_REQUEST_FREED;
    return PKV_OK;
}

static inline pkv_status pkv_pages_model_new_id(const pkv_pages_model *m, int32_t req) {
    if (req < 0 || req >= m->max_requests) return PKV_ERR_UNKNOWN_REQUEST;
    return m->state[req] == PKV_MODEL_LIVE ? PKV_ERR_INVALID_ARGUMENT : PKV_OK;
}

static inline pkv_status pkv_pages_model_create(pkv_pages_model *m, int32_t req, int32_t len) {
    pkv_status s = pkv_pages_model_new_id(m, req);
    if (s != PKV_OK) return s;
    if (len < 0) return PKV_ERR_NEGATIVE_LENGTH;
    if (len > (1 << 30)) return PKV_ERR_INVALID_ARGUMENT;
    const int32_t need = pkv_pages_model_pages_for(m, len);
    if (need > m->top) return PKV_ERR_POOL_EXHAUSTED;
    for (int32_t j = 0; j < need; j++) m->pages[req][j] = pkv_pages_model_take(m);
    m->state[req] = PKV_MODEL_LIVE;
    m->len[req] = len;
    m->npages[req] = need;
    return PKV_OK;
}

static inline pkv_status pkv_pages_model_free_req(pkv_pages_model *m, int32_t req) {
    const pkv_status s = pkv_pages_model_lookup(m, req);
    if (s != PKV_OK) return s;
    for (int32_t j = m->npages[req] - 1; j >= 0; j--) pkv_pages_model_release(m, m->pages[req][j]);
    m->state[req] = PKV_MODEL_FREED;
    m->len[req] = m->npages[req] = 0;
    return PKV_OK;
}

/* *copy: the expected copy-on-write ({-1, -1} when none). */
static inline pkv_status pkv_pages_model_extend(pkv_pages_model *m, int32_t req, int32_t n, pkv_page_copy *copy) {
    copy->src_page = copy->dst_page = -1;
    const pkv_status s = pkv_pages_model_lookup(m, req);
    if (s != PKV_OK) return s;
    if (n < 0) return PKV_ERR_INVALID_ARGUMENT;
    const int64_t len = (int64_t)m->len[req] + n;
    if (len > (1 << 30)) return PKV_ERR_INVALID_ARGUMENT;
    if (n == 0) return PKV_OK;
    int32_t *pages = m->pages[req];
    const int32_t np = m->npages[req];
    const int cow = m->len[req] % m->page_size != 0 && m->refs[pages[np - 1]] > 1;
    const int32_t want = pkv_pages_model_pages_for(m, len);
    if (want - np + cow > m->top) return PKV_ERR_POOL_EXHAUSTED;
    if (cow) {
        const int32_t old = pages[np - 1], fresh = pkv_pages_model_take(m);
        pkv_pages_model_release(m, old);
        pages[np - 1] = fresh;
        copy->src_page = old;
        copy->dst_page = fresh;
        m->cow_copies++;
    }
    for (int32_t j = np; j < want; j++) pages[j] = pkv_pages_model_take(m);
    m->npages[req] = want;
    m->len[req] = (int32_t)len;
    return PKV_OK;
}

static inline pkv_status pkv_pages_model_truncate(pkv_pages_model *m, int32_t req, int32_t new_len) {
    const pkv_status s = pkv_pages_model_lookup(m, req);
    if (s != PKV_OK) return s;
    if (new_len < 0) return PKV_ERR_NEGATIVE_LENGTH;
    if (new_len > m->len[req]) return PKV_ERR_BEYOND_LENGTH;
    const int32_t keep = pkv_pages_model_pages_for(m, new_len);
    for (int32_t j = m->npages[req] - 1; j >= keep; j--) pkv_pages_model_release(m, m->pages[req][j]);
    m->npages[req] = keep;
    m->len[req] = new_len;
    return PKV_OK;
}

static inline pkv_status pkv_pages_model_fork(pkv_pages_model *m, int32_t src, int32_t dst) {
    pkv_status s = pkv_pages_model_lookup(m, src);
    if (s != PKV_OK) return s;
    if ((s = pkv_pages_model_new_id(m, dst)) != PKV_OK) return s;
    for (int32_t j = 0; j < m->npages[src]; j++) {
        m->pages[dst][j] = m->pages[src][j];
        m->refs[m->pages[src][j]]++;
    }
    m->state[dst] = PKV_MODEL_LIVE;
    m->len[dst] = m->len[src];
    m->npages[dst] = m->npages[src];
    return PKV_OK;
}

static inline int pkv_pages_model_fail_(char *why, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return 1;
}

/* 0 when the manager agrees with the model in everything; else 1 and the first difference in why. */
static inline int pkv_pages_model_compare(const pkv_pages_model *m, const pkv_page_pool *pool, char *why, size_t cap) {
    /* recount the references from the page lists: the model's own bookkeeping is checked too */
    int32_t *count = (int32_t *)calloc((size_t)m->num_pages, sizeof(int32_t));
    int32_t *buf = (int32_t *)calloc((size_t)m->num_pages + 1, sizeof(int32_t));
    if (!count || !buf) {
        free(count);
        free(buf);
        return pkv_pages_model_fail_(why, cap, "out of memory");
    }
    int rc = 0;
    int64_t live = 0, tokens = 0, frag = 0, used = 0, shared = 0;
    for (int32_t r = 0; r < m->max_requests && !rc; r++) {
        int32_t len = -1, n = -1;
        const pkv_status ls = pkv_request_length(pool, r, &len);
        const pkv_status ps = pkv_request_pages(pool, r, buf, m->num_pages + 1, &n);
        const pkv_status want = pkv_pages_model_lookup(m, r);
        if (ls != want || ps != want) {
            rc = pkv_pages_model_fail_(why, cap, "request %d: length/pages return %d/%d, the model %d", r, (int)ls,
                                       (int)ps, (int)want);
            break;
        }
        if (want != PKV_OK) continue;
        live++;
        tokens += m->len[r];
        if (len != m->len[r] || n != m->npages[r] || n != pkv_pages_model_pages_for(m, len)) {
            rc = pkv_pages_model_fail_(why, cap, "request %d: length %d with %d pages, the model %d with %d", r, len, n,
                                       m->len[r], m->npages[r]);
            break;
        }
        frag += (int64_t)n * m->page_size - len;
        for (int32_t j = 0; j < n; j++) {
            if (buf[j] != m->pages[r][j]) {
                rc = pkv_pages_model_fail_(why, cap, "request %d: page %d is %d, the model's %d", r, j, buf[j],
                                           m->pages[r][j]);
                break;
            }
            for (int32_t e = 0; e < j; e++)
                if (buf[e] == buf[j]) {
                    rc = pkv_pages_model_fail_(why, cap, "request %d holds page %d twice", r, buf[j]);
                    break;
                }
            count[buf[j]]++;
        }
    }
    for (int32_t pg = 0; pg < m->num_pages && !rc; pg++) {
        const int32_t refs = pkv_page_pool_page_refs(pool, pg);
        if (refs != count[pg] || m->refs[pg] != count[pg])
            rc = pkv_pages_model_fail_(why, cap, "page %d: %d references, the model %d, the lists %d", pg, refs,
                                       m->refs[pg], count[pg]);
        used += count[pg] > 0;
        shared += count[pg] > 1;
    }
    if (!rc && used + m->top != m->num_pages)
        rc = pkv_pages_model_fail_(why, cap, "%lld pages used + %d free != %d: a page was lost", (long long)used, m->top,
                                   m->num_pages);
    pkv_page_pool_stats st;
    if (!rc && pkv_page_pool_get_stats(pool, &st) != PKV_OK) rc = pkv_pages_model_fail_(why, cap, "get_stats failed");
    if (!rc && (st.num_pages != m->num_pages || st.pages_used != used || st.pages_free != m->top ||
                st.peak_used != m->peak || st.pages_shared != shared || st.live_requests != live ||
                st.tokens != tokens || st.fragmentation != frag || st.cow_copies != m->cow_copies))
        rc = pkv_pages_model_fail_(
            why, cap,
            "stats: used %lld/%lld free %lld/%d peak %lld/%lld shared %lld/%lld live %lld/%lld tokens %lld/%lld "
            "fragmentation %lld/%lld copies %lld/%lld (manager/model)",
            (long long)st.pages_used, (long long)used, (long long)st.pages_free, m->top, (long long)st.peak_used,
            (long long)m->peak, (long long)st.pages_shared, (long long)shared, (long long)st.live_requests,
            (long long)live, (long long)st.tokens, (long long)tokens, (long long)st.fragmentation, (long long)frag,
            (long long)st.cow_copies, (long long)m->cow_copies);
    free(count);
    free(buf);
    return rc;
}

#endif
