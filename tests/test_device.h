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

/* pad < 0: K and V in their own dense pools; pad >= 0: one interleaved buffer (pkv_test_interleave). */
static inline pkv_status pkv_test_run_kv(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc, int64_t pad) {
    pkv_status st;
    size_t ws_bytes = pkv_plan_workspace_size(plan);
    int64_t stride = 0;
    uint16_t *kv = NULL;
    const int64_t page = (int64_t)tc->problem.page_size * tc->problem.num_kv_heads * tc->problem.head_dim;
    if (pad >= 0 && !(kv = pkv_test_interleave(tc, pad, &stride))) return PKV_ERR_OUT_OF_MEMORY;
    if (pkv_context_backend(ctx) == PKV_BACKEND_CPU) {
        void *ws = malloc(ws_bytes ? ws_bytes : 1);
        if (!ws) {
            free(kv);
            return PKV_ERR_OUT_OF_MEMORY;
        }
        pkv_tensors t = {tc->q, kv ? (const void *)kv : tc->k_cache, kv ? (const void *)(kv + page) : tc->v_cache,
                         tc->kv_page_indices, tc->o, tc->lse, stride};
        st = pkv_run(ctx, plan, ws, ws_bytes, &t, NULL);
        free(ws);
        free(kv);
        return st;
    }
    size_t qb = (size_t)tc->q_elems * 2, kvb = (size_t)tc->kv_elems * 2, lb = (size_t)tc->lse_elems * 4;
    size_t ib = (size_t)tc->kv_indptr[tc->batch_size] * 4, kvib = (size_t)(tc->problem.num_pages * stride) * 2;
    void *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *idx = NULL, *ws = NULL;
    st = pkv_dev_malloc(ctx, qb, &q);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, kv ? kvib : kvb, &k);
    if (st == PKV_OK && !kv) st = pkv_dev_malloc(ctx, kvb, &v);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, qb, &o);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, lb, &lse);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, ib, &idx);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, ws_bytes, &ws);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, q, tc->q, qb);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, k, kv ? (const void *)kv : tc->k_cache, kv ? kvib : kvb);
    if (st == PKV_OK && !kv) st = pkv_dev_copy_h2d(ctx, v, tc->v_cache, kvb);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, idx, tc->kv_page_indices, ib);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, o, tc->o, qb);     /* poisoned */
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, lse, tc->lse, lb); /* poisoned */
    if (st == PKV_OK) {
        const void *vp = kv ? (const void *)((const uint16_t *)k + page) : v;
        pkv_tensors t = {q, k, vp, (const int32_t *)idx, o, (float *)lse, stride};
        st = pkv_run(ctx, plan, ws, ws_bytes, &t, NULL);
    }
    if (st == PKV_OK) st = pkv_dev_synchronize(ctx);
    if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, tc->o, o, qb);
    if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, tc->lse, lse, lb);
    void *bufs[] = {q, k, v, o, lse, idx, ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) pkv_dev_free(ctx, bufs[i]);
    free(kv);
    return st;
}

static inline pkv_status pkv_test_run(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc) {
    return pkv_test_run_kv(ctx, plan, tc, -1);
}

#endif
