/* test_device.h - runs a generated test case (test_util.h) on any backend: host pointers on the
 * CPU backend, device copies on the CUDA backend; the outputs come back into tc->o / tc->lse (which
 * the caller poisons first: the poison travels to the device with them). */
#ifndef PKV_TEST_DEVICE_H
#define PKV_TEST_DEVICE_H

#include "pkv_dev.h"
#include "test_util.h"

/* The case's K and V pools as one buffer that interleaves them per page (FlashInfer's and vLLM's
 * [pages, 2, ...] cache) with pad elements after each page's V: page stride 2 x page + pad. */
static inline uint16_t *pkv_test_interleave(const pkv_test_case *tc, int64_t pad, int64_t *stride) {
    const pkv_problem *p = &tc->problem;
    const int64_t page = (int64_t)p->page_size * p->num_kv_heads * p->head_dim;
    *stride = 2 * page + pad;
    uint16_t *kv = (uint16_t *)malloc((size_t)(p->num_pages * *stride) * 2 + 2);
    if (!kv) return NULL;
    const uint16_t nan_bits = pkv_test_nan_bits(p->dtype); /* NaN in the padding (0x7e00 is finite in bf16) */
    for (int64_t i = 0; i < p->num_pages * *stride; i++) kv[i] = nan_bits;
    for (int64_t pg = 0; pg < p->num_pages; pg++) {
        memcpy(kv + pg * *stride, (const uint16_t *)tc->k_cache + pg * page, (size_t)page * 2);
        memcpy(kv + pg * *stride + page, (const uint16_t *)tc->v_cache + pg * page, (size_t)page * 2);
    }
    return kv;
}

/* How a run lays its tensors out: kv_pad < 0, K and V in their own dense pools, >= 0, one interleaved
 * buffer (pkv_test_interleave); q_pad / o_pad > 0, the rows of q / o that many elements further apart
 * than Hq x head_dim (pkv_tensors.q_row_stride / o_row_stride), else dense. */
typedef struct pkv_test_layout {
    int64_t kv_pad, q_pad, o_pad;
} pkv_test_layout;

/* A copy of B rows of `row` elements spread `stride` apart, the gaps filled with `fill`. */
static inline uint16_t *pkv_test_spread_rows(const uint16_t *src, int32_t B, int64_t row, int64_t stride,
                                             uint16_t fill) {
    uint16_t *dst = (uint16_t *)malloc((size_t)(B * stride) * 2 + 2);
    if (!dst) return NULL;
    for (int64_t i = 0; i < B * stride; i++) dst[i] = fill;
    for (int32_t b = 0; b < B; b++) memcpy(dst + b * stride, src + b * row, (size_t)row * 2);
    return dst;
}

/* The rows back from a spread copy; returns how many gap elements are no longer `fill`. */
static inline int64_t pkv_test_gather_rows(uint16_t *dst, const uint16_t *src, int32_t B, int64_t row,
                                           int64_t stride, uint16_t fill) {
    int64_t touched = 0;
    for (int32_t b = 0; b < B; b++) {
        memcpy(dst + b * row, src + b * stride, (size_t)row * 2);
        for (int64_t e = row; e < stride; e++) touched += src[b * stride + e] != fill;
    }
    return touched;
}

/* Runs the case with its tensors laid out as L says; the outputs come back into tc->o / tc->lse, and
 * *gap_writes (when not NULL) counts the elements between o's rows that the run changed. */
static inline pkv_status pkv_test_run_layout(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc,
                                             const pkv_test_layout *L, int64_t *gap_writes) {
    const pkv_problem *p = &tc->problem;
    const int32_t B = tc->batch_size;
    const int64_t page = (int64_t)p->page_size * p->num_kv_heads * p->head_dim;
    const int64_t row = (int64_t)p->num_qo_heads * p->head_dim;
    const int64_t qs = L->q_pad > 0 ? row + L->q_pad : 0, os = L->o_pad > 0 ? row + L->o_pad : 0;
    const uint16_t gap_fill = 0x3c01; /* finite in fp16 and bf16, and not the outputs' poison */
    size_t ws_bytes = pkv_plan_workspace_size(plan);
    int64_t stride = 0;
    uint16_t *kv = NULL, *qh = NULL, *oh = NULL;
    pkv_status st = PKV_OK;
    if (gap_writes) *gap_writes = 0;
    if (L->kv_pad >= 0 && !(kv = pkv_test_interleave(tc, L->kv_pad, &stride))) st = PKV_ERR_OUT_OF_MEMORY;
    if (st == PKV_OK && qs &&
        !(qh = pkv_test_spread_rows((const uint16_t *)tc->q, B, row, qs, pkv_test_nan_bits(p->dtype))))
        st = PKV_ERR_OUT_OF_MEMORY;
    if (st == PKV_OK && os && !(oh = pkv_test_spread_rows((const uint16_t *)tc->o, B, row, os, gap_fill)))
        st = PKV_ERR_OUT_OF_MEMORY;
    const void *q_host = qh ? (const void *)qh : tc->q;
    void *o_host = oh ? (void *)oh : tc->o;
    size_t qb = (size_t)(qs ? B * qs : tc->q_elems) * 2, ob = (size_t)(os ? B * os : tc->q_elems) * 2;
    if (st == PKV_OK && pkv_context_backend(ctx) == PKV_BACKEND_CPU) {
        void *ws = malloc(ws_bytes ? ws_bytes : 1);
        if (!ws) st = PKV_ERR_OUT_OF_MEMORY;
        pkv_tensors t = {.q = q_host,
                         .k_cache = kv ? (const void *)kv : tc->k_cache,
                         .v_cache = kv ? (const void *)(kv + page) : tc->v_cache,
                         .kv_page_indices = tc->kv_page_indices,
                         .o = o_host,
                         .lse = tc->lse,
                         .kv_page_stride = stride,
                         .q_row_stride = qs,
                         .o_row_stride = os};
        if (st == PKV_OK) st = pkv_run(ctx, plan, ws, ws_bytes, &t, NULL);
        free(ws);
    } else if (st == PKV_OK) {
        size_t kvb = (size_t)tc->kv_elems * 2, lb = (size_t)tc->lse_elems * 4;
        size_t ib = (size_t)tc->kv_indptr[B] * 4, kvib = (size_t)(p->num_pages * stride) * 2;
        void *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *idx = NULL, *ws = NULL;
        st = pkv_dev_malloc(ctx, qb, &q);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, kv ? kvib : kvb, &k);
        if (st == PKV_OK && !kv) st = pkv_dev_malloc(ctx, kvb, &v);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, ob, &o);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, lb, &lse);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, ib, &idx);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, ws_bytes, &ws);
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, q, q_host, qb);
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, k, kv ? (const void *)kv : tc->k_cache, kv ? kvib : kvb);
        if (st == PKV_OK && !kv) st = pkv_dev_copy_h2d(ctx, v, tc->v_cache, kvb);
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, idx, tc->kv_page_indices, ib);
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, o, o_host, ob);      /* poisoned */
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, lse, tc->lse, lb); /* poisoned */
        if (st == PKV_OK) {
            const void *vp = kv ? (const void *)((const uint16_t *)k + page) : v;
            pkv_tensors t = {.q = q,
                             .k_cache = k,
                             .v_cache = vp,
                             .kv_page_indices = (const int32_t *)idx,
                             .o = o,
                             .lse = (float *)lse,
                             .kv_page_stride = stride,
                             .q_row_stride = qs,
                             .o_row_stride = os};
            st = pkv_run(ctx, plan, ws, ws_bytes, &t, NULL);
        }
        if (st == PKV_OK) st = pkv_dev_synchronize(ctx);
        if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, o_host, o, ob);
        if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, tc->lse, lse, lb);
        void *bufs[] = {q, k, v, o, lse, idx, ws};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) pkv_dev_free(ctx, bufs[i]);
    }
    if (st == PKV_OK && oh) {
        const int64_t touched = pkv_test_gather_rows((uint16_t *)tc->o, oh, B, row, os, gap_fill);
        if (gap_writes) *gap_writes = touched;
    }
    free(kv);
    free(qh);
    free(oh);
    return st;
}

/* pad < 0: K and V in their own dense pools; pad >= 0: one interleaved buffer (pkv_test_interleave). */
static inline pkv_status pkv_test_run_kv(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc, int64_t pad) {
    const pkv_test_layout L = {pad, 0, 0};
    return pkv_test_run_layout(ctx, plan, tc, &L, NULL);
}

static inline pkv_status pkv_test_run(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc) {
    return pkv_test_run_kv(ctx, plan, tc, -1);
}

#endif
