/* problem.c - problem defaults, shape checks, page-table checks and the block-table helper. */
#include "internal.h"

#include <math.h>

void pkv_problem_default(pkv_problem *p) {
    if (!p) return;
    p->num_qo_heads = 32;
    p->num_kv_heads = 8;
    p->head_dim = 128;
    p->page_size = 16;
    p->num_pages = 0;
    p->layout = PKV_LAYOUT_NHD;
    p->dtype = PKV_DTYPE_FP16;
    p->sm_scale = 0.0f;
    p->logits_soft_cap = 0.0f;
    p->window = 0;
    p->kv_dtype = (pkv_dtype)0; /* the caches hold dtype */
}

size_t pkv_dtype_size(pkv_dtype d) {
    switch (d) {
    case PKV_DTYPE_FP8_E4M3:
    case PKV_DTYPE_FP8_E5M2: return 1;
    case PKV_DTYPE_FP16:
    case PKV_DTYPE_BF16: return 2;
    case PKV_DTYPE_FP32: return 4;
    }
    return 0;
}

const char *pkv_dtype_name(pkv_dtype d) {
    switch (d) {
    case PKV_DTYPE_FP16: return "fp16";
    case PKV_DTYPE_BF16: return "bf16";
    case PKV_DTYPE_FP32: return "fp32";
    case PKV_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case PKV_DTYPE_FP8_E5M2: return "fp8_e5m2";
    }
    return "unknown";
}

/* The scales' common rules (pkv_tensors, pkv_append_tensors): per tensor 0 (1.0) or positive and finite;
 * per head only for fp8 caches, and then no per-tensor scale but 0 or 1; caches of dtype take no scale. */
static pkv_status check_scale_pair(pkv_context *ctx, const char *who, const char *name, float s,
                                   const float *heads, bool fp8) {
    if (!(s >= 0.0f) || isinf(s))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "%s: %s %g is not a finite value >= 0 (0: 1.0)", who, name,
                        (double)s);
    if (!fp8 && (heads || (s != 0.0f && s != 1.0f)))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "%s: %s%s applies to fp8 caches only (pkv_problem.kv_dtype); a cache of dtype takes 0 or 1 "
                        "and no per-head scales",
                        who, name, heads ? " per head" : "");
    if (heads && s != 0.0f && s != 1.0f)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "%s: %s %g and per-head scales both given: a tensor takes one or the other", who, name,
                        (double)s);
    if (heads && ((uintptr_t)heads & 3u) != 0)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "%s: the per-head %s array is not 4-byte aligned", who, name);
    return PKV_OK;
}

pkv_status pkv_check_kv_scales(pkv_context *ctx, const pkv_problem *p, float k_scale, float v_scale,
                               const float *k_heads, const float *v_heads, const char *who) {
    const bool fp8 = pkv_dtype_is_fp8(pkv_kv_dtype(p));
    pkv_status st = check_scale_pair(ctx, who, "k_scale", k_scale, k_heads, fp8);
    if (st == PKV_OK) st = check_scale_pair(ctx, who, "v_scale", v_scale, v_heads, fp8);
    return st;
}

pkv_status pkv_check_head_scales(pkv_context *ctx, const pkv_problem *p, const float *k_heads, const float *v_heads,
                                 const char *who) {
    const float *arrays[2] = {k_heads, v_heads};
    const char *names[2] = {"k_head_scales", "v_head_scales"};
    for (int a = 0; a < 2; a++) {
        if (!arrays[a]) continue;
        for (int32_t h = 0; h < p->num_kv_heads; h++)
            if (!(arrays[a][h] > 0.0f) || isinf(arrays[a][h]))
                return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "%s: %s[%d] = %g is not a positive finite scale", who,
                                names[a], h, (double)arrays[a][h]);
    }
    return PKV_OK;
}

float pkv_problem_scale(const pkv_problem *p) {
    return p->sm_scale > 0.0f ? p->sm_scale : (float)(1.0 / sqrt((double)p->head_dim));
}

pkv_kv_strides pkv_kv_strides_of(const pkv_problem *p) {
    pkv_kv_strides s;
    int64_t d = p->head_dim, hkv = p->num_kv_heads, ps = p->page_size;
    s.page = ps * hkv * d;
    if (p->layout == PKV_LAYOUT_NHD) {
        s.token = hkv * d;
        s.head = d;
    } else {
        s.head = ps * d;
        s.token = d;
    }
    return s;
}

pkv_kv_strides pkv_kv_strides_run(const pkv_problem *p, const pkv_tensors *t) {
    pkv_kv_strides s = pkv_kv_strides_of(p);
    if (t && t->kv_page_stride > 0) s.page = t->kv_page_stride;
    return s;
}

pkv_status pkv_check_problem(pkv_context *ctx, const pkv_problem *p) {
    if (!p) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "problem is NULL");
    if (p->num_kv_heads <= 0 || p->num_qo_heads <= 0)
        return pkv_fail(ctx, PKV_ERR_HEAD_GROUP, "num_qo_heads (%d) and num_kv_heads (%d) must be positive",
                        p->num_qo_heads, p->num_kv_heads);
    if (p->num_qo_heads % p->num_kv_heads != 0)
        return pkv_fail(ctx, PKV_ERR_HEAD_GROUP, "num_qo_heads (%d) is not a multiple of num_kv_heads (%d)",
                        p->num_qo_heads, p->num_kv_heads);
    if (p->num_qo_heads > PKV_MAX_HEADS)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "num_qo_heads %d is above the supported maximum %d", p->num_qo_heads,
                        PKV_MAX_HEADS);
    int32_t g = p->num_qo_heads / p->num_kv_heads;
    if (g > PKV_MAX_GROUP)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "group size G = %d is above the supported maximum %d", g,
                        PKV_MAX_GROUP);
    if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_HEAD_DIM, "head_dim %d is not one of 64, 128, 256", p->head_dim);
    if (p->page_size < 1 || p->page_size > 256)
        return pkv_fail(ctx, PKV_ERR_PAGE_SIZE, "page_size %d is not in [1, 256]", p->page_size);
    if (pkv_dtype_is_fp8(p->dtype))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "dtype %s is q's and o's, which are fp16 or bf16; an fp8 KV cache is pkv_problem.kv_dtype",
                        pkv_dtype_name(p->dtype));
    if (pkv_dtype_is_fp8(p->kv_dtype) && p->dtype != PKV_DTYPE_FP16 && p->dtype != PKV_DTYPE_BF16)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "an fp8 KV cache (kv_dtype %s) needs q and o in fp16 or bf16, not dtype %d",
                        pkv_dtype_name(p->kv_dtype), (int)p->dtype);
    if (p->dtype != PKV_DTYPE_FP16 && p->dtype != PKV_DTYPE_BF16)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_DTYPE, "dtype %d is not fp16 or bf16", (int)p->dtype);
    if (p->kv_dtype != 0 && p->kv_dtype != p->dtype && !pkv_dtype_is_fp8(p->kv_dtype))
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_DTYPE,
                        "kv_dtype %d is neither 0 nor dtype (caches of dtype %s) nor fp8_e4m3 / fp8_e5m2",
                        (int)p->kv_dtype, pkv_dtype_name(p->dtype));
    if (p->layout != PKV_LAYOUT_NHD && p->layout != PKV_LAYOUT_HND)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "layout %d is not NHD or HND", (int)p->layout);
    if (p->num_pages < 0 || p->num_pages > INT32_MAX)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "num_pages %lld is not in [0, 2^31)", (long long)p->num_pages);
    if (!(p->sm_scale == p->sm_scale) || isinf(p->sm_scale))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "sm_scale is not finite");
    /* sm_scale x log2(e) x a score must stay finite in float: fp16 scores are below 65504^2 x 256 ~ 1.1e12 */
    if (p->sm_scale > 1e20f)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "sm_scale %g is above 1e20", (double)p->sm_scale);
    if (!(p->logits_soft_cap >= 0.0f) || isinf(p->logits_soft_cap))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "logits_soft_cap %g is not a finite value >= 0 (0: none)",
                        (double)p->logits_soft_cap);
    if (p->window < 0)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "window %d is negative (0: no sliding window)", p->window);
    return PKV_OK;
}

/* The largest page id read as unsigned (a negative id reads as >= 2^31): one vectorised pass. */
PKV_VECTOR_CLONES
static uint32_t max_page_id_unsigned(const int32_t *ids, int32_t n) {
    uint32_t hi = 0;
    for (int32_t j = 0; j < n; j++) {
        const uint32_t v = (uint32_t)ids[j];
        hi = v > hi ? v : hi;
    }
    return hi;
}

pkv_status pkv_check_table(pkv_context *ctx, const pkv_problem *p, const pkv_page_table *t,
                           bool check_page_ids) {
    if (!t) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "page table is NULL");
    if (t->batch_size < 0 || t->batch_size > PKV_MAX_BATCH)
        return pkv_fail(ctx, PKV_ERR_BATCH_SIZE, "batch_size %d is not in [0, %d]", t->batch_size, PKV_MAX_BATCH);
    if (!t->kv_indptr) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "kv_indptr is NULL");
    if (!t->seq_lens && t->batch_size > 0) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "seq_lens is NULL");
    if (t->kv_indptr[0] != 0)
        return pkv_fail(ctx, PKV_ERR_BAD_INDPTR, "kv_indptr[0] is %d, expected 0", t->kv_indptr[0]);
    for (int32_t i = 0; i < t->batch_size; i++) {
        int32_t a = t->kv_indptr[i], b = t->kv_indptr[i + 1];
        if (b < a)
            return pkv_fail(ctx, PKV_ERR_BAD_INDPTR, "kv_indptr decreases at row %d (%d -> %d)", i, a, b);
        int32_t n = t->seq_lens[i];
        if (n < 0) return pkv_fail(ctx, PKV_ERR_NEGATIVE_LENGTH, "seq_lens[%d] = %d is negative", i, n);
        if (n > PKV_MAX_SEQ_LEN)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "seq_lens[%d] = %d is above the %d tokens a row may have",
                            i, n, PKV_MAX_SEQ_LEN);
        if ((int64_t)n > (int64_t)(b - a) * p->page_size)
            return pkv_fail(ctx, PKV_ERR_LENGTH_EXCEEDS_PAGES,
                            "seq_lens[%d] = %d does not fit in its %d pages of %d tokens", i, n, b - a,
                            p->page_size);
    }
    if (check_page_ids && t->batch_size > 0) {
        if (!t->kv_page_indices && t->kv_indptr[t->batch_size] > 0)
            return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "kv_page_indices is NULL");
        /* one vectorised pass over every listed page: valid ids are [0, min(num_pages, 2^31)), so the
         * unsigned maximum is below that bound exactly when every id is; the offender is located only
         * on failure (B64 steps of 73K pages: 31 -> ~5 us on a 2-core x86-64 machine) */
        const int32_t *ids = t->kv_page_indices;
        const int32_t n = t->kv_indptr[t->batch_size];
        const int64_t bound = p->num_pages < (int64_t)INT32_MAX + 1 ? p->num_pages : (int64_t)INT32_MAX + 1;
        if (n > 0 && (int64_t)max_page_id_unsigned(ids, n) >= bound) {
            for (int32_t i = 0; i < t->batch_size; i++)
                for (int32_t j = t->kv_indptr[i]; j < t->kv_indptr[i + 1]; j++)
                    if (ids[j] < 0 || (int64_t)ids[j] >= p->num_pages)
                        return pkv_fail(ctx, PKV_ERR_PAGE_OUT_OF_RANGE,
                                        "kv_page_indices[%d] = %d (row %d) is outside [0, %lld)", j, ids[j], i,
                                        (long long)p->num_pages);
        }
    }
    return PKV_OK;
}

pkv_status pkv_check_page_table(const pkv_problem *problem, const pkv_page_table *table) {
    pkv_status st = pkv_check_problem(NULL, problem);
    if (st != PKV_OK) return st;
    return pkv_check_table(NULL, problem, table, true);
}

pkv_status pkv_block_table_to_csr(const int32_t *block_table, int32_t batch_size, int32_t max_pages,
                                  const int32_t *seq_lens, int32_t page_size, int32_t *indptr_out,
                                  int32_t *indices_out, int64_t capacity) {
    if (!block_table || !seq_lens || !indptr_out || !indices_out)
        return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "block_table, seq_lens, indptr_out and indices_out must not be NULL");
    if (batch_size < 0 || batch_size > PKV_MAX_BATCH)
        return pkv_fail(NULL, PKV_ERR_BATCH_SIZE, "batch_size %d is not in [0, %d]", batch_size, PKV_MAX_BATCH);
    if (max_pages < 0) return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "max_pages %d is negative", max_pages);
    if (page_size < 1 || page_size > 256)
        return pkv_fail(NULL, PKV_ERR_PAGE_SIZE, "page_size %d is not in [1, 256]", page_size);
    int64_t at = 0;
    indptr_out[0] = 0;
    for (int32_t i = 0; i < batch_size; i++) {
        int32_t n = seq_lens[i];
        if (n < 0) return pkv_fail(NULL, PKV_ERR_NEGATIVE_LENGTH, "seq_lens[%d] = %d is negative", i, n);
        int64_t need = ((int64_t)n + page_size - 1) / page_size;
        if (need > max_pages)
            return pkv_fail(NULL, PKV_ERR_LENGTH_EXCEEDS_PAGES,
                            "row %d needs %lld pages for %d tokens but the block table has %d", i,
                            (long long)need, n, max_pages);
        if (at + need > capacity || at + need > INT32_MAX)
            return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "indices capacity %lld is too small",
                            (long long)capacity);
        for (int64_t j = 0; j < need; j++) indices_out[at + j] = block_table[(int64_t)i * max_pages + j];
        at += need;
        indptr_out[i + 1] = (int32_t)at;
    }
    return PKV_OK;
}
