/* test_device.h - runs a generated test case (test_util.h) on any backend: host pointers on the
 * CPU backend, device copies on the CUDA backend; the outputs come back into tc->o / tc->lse (which
 * the caller poisons first: the poison travels to the device with them). */
#ifndef PKV_TEST_DEVICE_H
#define PKV_TEST_DEVICE_H

#include "pkv_dev.h"
#include "test_util.h"

static inline pkv_status pkv_test_run(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc) {
    pkv_status st;
    size_t ws_bytes = pkv_plan_workspace_size(plan);
    if (pkv_context_backend(ctx) == PKV_BACKEND_CPU) {
        void *ws = malloc(ws_bytes ? ws_bytes : 1);
        if (!ws) return PKV_ERR_OUT_OF_MEMORY;
        pkv_tensors t = {tc->q, tc->k_cache, tc->v_cache, tc->kv_page_indices, tc->o, tc->lse};
        st = pkv_run(ctx, plan, ws, ws_bytes, &t, NULL);
        free(ws);
        return st;
    }
    size_t qb = (size_t)tc->q_elems * 2, kvb = (size_t)tc->kv_elems * 2, lb = (size_t)tc->lse_elems * 4;
    size_t ib = (size_t)tc->kv_indptr[tc->batch_size] * 4;
    void *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *idx = NULL, *ws = NULL;
    st = pkv_dev_malloc(ctx, qb, &q);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, kvb, &k);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, kvb, &v);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, qb, &o);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, lb, &lse);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, ib, &idx);
    if (st == PKV_OK) st = pkv_dev_malloc(ctx, ws_bytes, &ws);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, q, tc->q, qb);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, k, tc->k_cache, kvb);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, v, tc->v_cache, kvb);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, idx, tc->kv_page_indices, ib);
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, o, tc->o, qb);     /* poisoned */
    if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, lse, tc->lse, lb); /* poisoned */
    if (st == PKV_OK) {
        pkv_tensors t = {q, k, v, (const int32_t *)idx, o, (float *)lse};
        st = pkv_run(ctx, plan, ws, ws_bytes, &t, NULL);
    }
    if (st == PKV_OK) st = pkv_dev_synchronize(ctx);
    if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, tc->o, o, qb);
    if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, tc->lse, lse, lb);
    void *bufs[] = {q, k, v, o, lse, idx, ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) pkv_dev_free(ctx, bufs[i]);
    return st;
}

#endif
