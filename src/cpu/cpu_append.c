/* cpu_append.c - the CPU backend's pkv_append_kv and pkv_copy_pages: host pointers, one thread.
 *
 * Append: token t of [num_tokens, Hkv, d] goes to (row, position) - from batch_indices and positions
 * (FlashInfer's form), from append_indptr (ragged: a row's tokens are its last ones) or one per row (decode:
 * the row's last token) - and so to page kv_page_indices[kv_indptr[row] + position / page_size], slot
 * position % page_size, where each KV head's d values are one contiguous run in NHD and in HND.  Two passes:
 * every token's slot is resolved and checked first (a bad index is a specific status, nothing written),
 * then the rows of d values are copied (an fp8 cache: quantized, value / scale to the nearest fp8 code,
 * saturating).  Page copies move whole pages of cache elements, bit for bit. */
#include "internal.h"

#include <string.h>

/* A row's length: seq_lens, else its pages and last page's tokens (FlashInfer's kv_last_page_len); -1 when
 * neither is given. */
static int64_t row_len(const pkv_append_tensors *t, int32_t row, int32_t npages, int32_t ps) {
    if (t->seq_lens) return t->seq_lens[row];
    if (t->kv_last_page_len) return npages > 0 ? (int64_t)(npages - 1) * ps + t->kv_last_page_len[row] : t->kv_last_page_len[row];
    return -1;
}

/* The page and slot of token tok; a status with its message for a bad index. */
static pkv_status resolve(pkv_context *ctx, const pkv_problem *p, int32_t batch_size, int32_t tok,
                          const pkv_append_tensors *t, int32_t *page, int32_t *slot) {
    const int32_t ps = p->page_size;
    int32_t row;
    int64_t pos;
    if (t->batch_indices) {
        row = t->batch_indices[tok];
        if (row < 0 || row >= batch_size)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_append_kv: batch_indices[%d] = %d is outside [0, %d)",
                            tok, row, batch_size);
        pos = t->positions[tok];
        if (pos < 0)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_append_kv: positions[%d] = %lld is negative", tok,
                            (long long)pos);
    } else if (t->append_indptr) {
        int32_t lo = 0, hi = batch_size; /* the row r with append_indptr[r] <= tok < append_indptr[r + 1] */
        while (hi - lo > 1) {
            const int32_t mid = lo + (hi - lo) / 2;
            if (t->append_indptr[mid] <= tok) lo = mid;
            else hi = mid;
        }
        row = lo;
        pos = -1; /* below, from the row's length */
    } else {
        row = tok;
        pos = -1;
    }
    const int32_t base = t->kv_indptr[row], npages = t->kv_indptr[row + 1] - base;
    const int64_t len = row_len(t, row, npages, ps);
    const bool has_len = t->seq_lens || t->kv_last_page_len;
    if (has_len && len < 0)
        return pkv_fail(ctx, PKV_ERR_NEGATIVE_LENGTH, "pkv_append_kv: row %d's length %lld is negative", row,
                        (long long)len);
    if (len > (int64_t)npages * ps || (!t->seq_lens && t->kv_last_page_len && npages > 0 &&
                                       (t->kv_last_page_len[row] < 1 || t->kv_last_page_len[row] > ps)))
        return pkv_fail(ctx, PKV_ERR_LENGTH_EXCEEDS_PAGES,
                        "pkv_append_kv: row %d's length %lld does not fit its %d pages", row, (long long)len, npages);
    if (pos < 0) { /* ragged or decode: the row's last tokens */
        const int64_t n = t->append_indptr ? t->append_indptr[row + 1] - t->append_indptr[row] : 1;
        const int64_t k = t->append_indptr ? tok - t->append_indptr[row] : 0;
        if (n > len)
            return pkv_fail(ctx, PKV_ERR_BEYOND_LENGTH,
                            "pkv_append_kv: row %d appends %lld tokens but has %lld (extend the request first)", row,
                            (long long)n, (long long)len);
        pos = len - n + k;
    } else if (pos >= (int64_t)npages * ps || (len >= 0 && pos >= len)) {
        return pkv_fail(ctx, PKV_ERR_BEYOND_LENGTH,
                        "pkv_append_kv: token %d goes to position %lld of row %d, which has %lld tokens in %d pages", tok,
                        (long long)pos, row, (long long)len, npages);
    }
    const int32_t pg = t->kv_page_indices[base + pos / ps];
    if (pg < 0 || pg >= p->num_pages)
        return pkv_fail(ctx, PKV_ERR_PAGE_OUT_OF_RANGE, "pkv_append_kv: kv_page_indices[%lld] = %d (row %d) is outside [0, %lld)",
                        (long long)(base + pos / ps), pg, row, (long long)p->num_pages);
    *page = pg;
    *slot = (int32_t)(pos % ps);
    return PKV_OK;
}

/* dst [n] fp8 codes <- src [n] fp16 / bf16 values / scale (round to nearest even, saturating, NaN kept) */
static void quantize_row(uint8_t *dst, const uint16_t *src, int32_t n, pkv_dtype dtype, int e5m2, float scale) {
    for (int32_t e = 0; e < n; e++) {
        const float f = dtype == PKV_DTYPE_BF16 ? pkv_bf16_to_float(src[e]) : pkv_half_to_float(src[e]);
        dst[e] = pkv_float_to_fp8(f / scale, e5m2);
    }
}

/* The write pass for an fp8 cache (every slot already resolved and checked): each KV head's d values
 * quantized with its scale. */
static void append_fp8(const pkv_problem *p, int32_t batch_size, int32_t num_tokens, const pkv_append_tensors *t) {
    const int e5m2 = pkv_kv_dtype(p) == PKV_DTYPE_FP8_E5M2;
    const int32_t hkv = p->num_kv_heads, d = p->head_dim;
    const pkv_kv_strides st = pkv_kv_strides_of(p);
    const int64_t pstride = t->kv_page_stride > 0 ? t->kv_page_stride : st.page;
    const int64_t ks = t->k_token_stride > 0 ? t->k_token_stride : (int64_t)hkv * d;
    const int64_t vs = t->v_token_stride > 0 ? t->v_token_stride : (int64_t)hkv * d;
    const uint16_t *k = (const uint16_t *)t->k, *v = (const uint16_t *)t->v;
    uint8_t *kc = (uint8_t *)t->k_cache, *vc = (uint8_t *)t->v_cache;
    int32_t page, slot;
    for (int32_t tok = 0; tok < num_tokens; tok++) {
        resolve(NULL, p, batch_size, tok, t, &page, &slot);
        for (int32_t h = 0; h < hkv; h++) {
            const int64_t dst = (int64_t)page * pstride + (int64_t)h * st.head + (int64_t)slot * st.token;
            const float ksc = t->k_head_scales ? t->k_head_scales[h] : pkv_scale_or_one(t->k_scale);
            const float vsc = t->v_head_scales ? t->v_head_scales[h] : pkv_scale_or_one(t->v_scale);
            quantize_row(kc + dst, k + (int64_t)tok * ks + (int64_t)h * d, d, p->dtype, e5m2, ksc);
            quantize_row(vc + dst, v + (int64_t)tok * vs + (int64_t)h * d, d, p->dtype, e5m2, vsc);
        }
    }
}

pkv_status pkv_cpu_append(pkv_context *ctx, const pkv_problem *p, int32_t batch_size, int32_t num_tokens,
                          const pkv_append_tensors *t, void *stream) {
    (void)stream;
    const int32_t *ip = t->kv_indptr;
    if (ip[0] != 0) return pkv_fail(ctx, PKV_ERR_BAD_INDPTR, "pkv_append_kv: kv_indptr[0] is %d, expected 0", ip[0]);
    for (int32_t i = 0; i < batch_size; i++)
        if (ip[i + 1] < ip[i])
            return pkv_fail(ctx, PKV_ERR_BAD_INDPTR, "pkv_append_kv: kv_indptr decreases at row %d (%d -> %d)", i, ip[i],
                            ip[i + 1]);
    if (t->append_indptr) {
        const int32_t *ap = t->append_indptr;
        if (ap[0] != 0 || ap[batch_size] != num_tokens)
            return pkv_fail(ctx, PKV_ERR_BAD_INDPTR, "pkv_append_kv: append_indptr runs from %d to %d, not 0 to %d",
                            ap[0], ap[batch_size], num_tokens);
        for (int32_t i = 0; i < batch_size; i++)
            if (ap[i + 1] < ap[i])
                return pkv_fail(ctx, PKV_ERR_BAD_INDPTR, "pkv_append_kv: append_indptr decreases at row %d (%d -> %d)",
                                i, ap[i], ap[i + 1]);
    }
    int32_t page, slot;
    for (int32_t tok = 0; tok < num_tokens; tok++) {
        const pkv_status s = resolve(ctx, p, batch_size, tok, t, &page, &slot);
        if (s != PKV_OK) return s;
    }
    const pkv_dtype kv_dtype = pkv_kv_dtype(p);
    if (pkv_dtype_is_fp8(kv_dtype)) {
        const pkv_status s = pkv_check_head_scales(ctx, p, t->k_head_scales, t->v_head_scales, "pkv_append_kv");
        if (s != PKV_OK) return s;
        append_fp8(p, batch_size, num_tokens, t);
        return PKV_OK;
    }
    const size_t es = pkv_dtype_size(p->dtype);
    const int32_t hkv = p->num_kv_heads, d = p->head_dim;
    const pkv_kv_strides st = pkv_kv_strides_of(p);
    const int64_t pstride = t->kv_page_stride > 0 ? t->kv_page_stride : st.page;
    const int64_t ks = t->k_token_stride > 0 ? t->k_token_stride : (int64_t)hkv * d;
    const int64_t vs = t->v_token_stride > 0 ? t->v_token_stride : (int64_t)hkv * d;
    for (int32_t tok = 0; tok < num_tokens; tok++) {
        resolve(ctx, p, batch_size, tok, t, &page, &slot);
        for (int32_t h = 0; h < hkv; h++) {
            const int64_t dst = (int64_t)page * pstride + (int64_t)h * st.head + (int64_t)slot * st.token;
            memcpy((char *)t->k_cache + dst * es, (const char *)t->k + ((int64_t)tok * ks + (int64_t)h * d) * es,
                   (size_t)d * es);
            memcpy((char *)t->v_cache + dst * es, (const char *)t->v + ((int64_t)tok * vs + (int64_t)h * d) * es,
                   (size_t)d * es);
        }
    }
    return PKV_OK;
}

pkv_status pkv_cpu_copy_pages(pkv_context *ctx, const pkv_problem *p, const pkv_page_copy *copies, int32_t count,
                              void *k_cache, void *v_cache, int64_t page_stride, void *stream) {
    (void)ctx, (void)stream;
    const size_t es = pkv_kv_elem_size(p);
    const int64_t page_elems = (int64_t)p->num_kv_heads * p->head_dim * p->page_size;
    const int64_t ps = page_stride > 0 ? page_stride : page_elems;
    for (int32_t c = 0; c < count; c++) {
        const int64_t src = copies[c].src_page * ps * (int64_t)es, dst = copies[c].dst_page * ps * (int64_t)es;
        memcpy((char *)k_cache + dst, (const char *)k_cache + src, (size_t)page_elems * es);
        memcpy((char *)v_cache + dst, (const char *)v_cache + src, (size_t)page_elems * es);
    }
    return PKV_OK;
}
