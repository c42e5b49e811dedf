/* append.c - pkv_append_kv and pkv_copy_pages: the arguments' checks (everything a backend can check
 * without reading the index arrays, which may be device memory) and the dispatch to the context's backend
 * (cpu_append.c, or the CUDA backend's src/cuda/append.cu).  Copies go to the backend in chunks of
 * PKV_MAX_PAGE_COPIES, in order. */
#include "internal.h"

#include <string.h>

static bool misaligned(const void *p, size_t a) { return ((uintptr_t)p % a) != 0; }

pkv_status pkv_append_kv(pkv_context *ctx, const pkv_problem *problem, int32_t batch_size, int32_t num_tokens,
                         const pkv_append_tensors *t, void *stream) {
    if (!ctx || !t) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "pkv_append_kv: ctx and tensors must not be NULL");
    pkv_status s = pkv_check_problem(ctx, problem);
    if (s != PKV_OK) return s;
    if (batch_size < 0 || batch_size > PKV_MAX_BATCH)
        return pkv_fail(ctx, PKV_ERR_BATCH_SIZE, "pkv_append_kv: batch_size %d is not in [0, %d]", batch_size,
                        PKV_MAX_BATCH);
    if (num_tokens < 0)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_append_kv: num_tokens %d is negative", num_tokens);
    const bool flashinfer = t->batch_indices || t->positions, ragged = t->append_indptr != NULL;
    if (flashinfer && (!t->batch_indices || !t->positions))
        return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "pkv_append_kv: batch_indices and positions go together");
    if (flashinfer && ragged)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "pkv_append_kv: give batch_indices and positions, or append_indptr, not both");
    if (!flashinfer && !ragged && num_tokens != batch_size)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "pkv_append_kv: the decode form (no batch_indices, positions nor append_indptr) appends one "
                        "token per row: num_tokens %d != batch_size %d",
                        num_tokens, batch_size);
    if (num_tokens > 0 && batch_size == 0)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_append_kv: %d tokens for no row", num_tokens);
    if (num_tokens == 0) return PKV_OK;
    if (!t->k || !t->v || !t->k_cache || !t->v_cache || !t->kv_indptr || !t->kv_page_indices)
        return pkv_fail(ctx, PKV_ERR_NULL_POINTER,
                        "pkv_append_kv: k, v, k_cache, v_cache, kv_indptr and kv_page_indices must not be NULL");
    if (!flashinfer && !t->kv_last_page_len && !t->seq_lens)
        return pkv_fail(ctx, PKV_ERR_NULL_POINTER,
                        "pkv_append_kv: the ragged and decode forms need the rows' lengths (kv_last_page_len or "
                        "seq_lens)");
    const int64_t tok_elems = (int64_t)problem->num_kv_heads * problem->head_dim;
    const int64_t page_elems = tok_elems * problem->page_size;
    if ((t->k_token_stride != 0 && t->k_token_stride < tok_elems) ||
        (t->v_token_stride != 0 && t->v_token_stride < tok_elems))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "pkv_append_kv: k_token_stride %lld and v_token_stride %lld must be 0 or at least Hkv x d = %lld",
                        (long long)t->k_token_stride, (long long)t->v_token_stride, (long long)tok_elems);
    if (t->kv_page_stride != 0 && t->kv_page_stride < page_elems)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_append_kv: kv_page_stride %lld is below a page (%lld)",
                        (long long)t->kv_page_stride, (long long)page_elems);
    const size_t kv_es = pkv_kv_elem_size(problem);
    if (misaligned(t->k, 2) || misaligned(t->v, 2) || misaligned(t->k_cache, kv_es) || misaligned(t->v_cache, kv_es) ||
        misaligned(t->kv_indptr, 4) || misaligned(t->kv_page_indices, 4))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_append_kv: a pointer is not aligned to its element");
    s = pkv_check_kv_scales(ctx, problem, t->k_scale, t->v_scale, t->k_head_scales, t->v_head_scales, "pkv_append_kv");
    if (s != PKV_OK) return s;
    if (!ctx->ops->append)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "the %s backend does not append", ctx->ops->name);
    return ctx->ops->append(ctx, problem, batch_size, num_tokens, t, stream);
}

pkv_status pkv_copy_pages(pkv_context *ctx, const pkv_problem *problem, const pkv_page_copy *copies, int32_t count,
                          void *k_cache, void *v_cache, int64_t kv_page_stride, void *stream) {
    if (!ctx) return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "pkv_copy_pages: ctx is NULL");
    pkv_status s = pkv_check_problem(ctx, problem);
    if (s != PKV_OK) return s;
    if (count < 0) return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_copy_pages: count %d is negative", count);
    if (count == 0) return PKV_OK;
    if (!copies || !k_cache || !v_cache)
        return pkv_fail(ctx, PKV_ERR_NULL_POINTER, "pkv_copy_pages: copies, k_cache and v_cache must not be NULL");
    const int64_t page_elems = (int64_t)problem->num_kv_heads * problem->head_dim * problem->page_size;
    if (kv_page_stride != 0 && kv_page_stride < page_elems)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_copy_pages: kv_page_stride %lld is below a page (%lld)",
                        (long long)kv_page_stride, (long long)page_elems);
    const size_t kv_es = pkv_kv_elem_size(problem);
    if (misaligned(k_cache, kv_es) || misaligned(v_cache, kv_es))
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_copy_pages: k_cache and v_cache must be %zu-byte aligned",
                        kv_es);
    for (int32_t c = 0; c < count; c++) {
        const int32_t a = copies[c].src_page, b = copies[c].dst_page;
        if (a < 0 || a >= problem->num_pages || b < 0 || b >= problem->num_pages)
            return pkv_fail(ctx, PKV_ERR_PAGE_OUT_OF_RANGE, "pkv_copy_pages: copy %d (%d -> %d) leaves [0, %lld)", c, a,
                            b, (long long)problem->num_pages);
        if (a == b)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "pkv_copy_pages: copy %d copies page %d onto itself", c, a);
        /* within a chunk the copies run at once: no page written twice, none both read and written */
        const int32_t first = c - c % PKV_MAX_PAGE_COPIES;
        for (int32_t e = first; e < c; e++)
            if (copies[e].dst_page == b || copies[e].dst_page == a || copies[e].src_page == b)
                return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                                "pkv_copy_pages: copies %d and %d touch page %d, one of them writing it", e, c,
                                copies[e].dst_page == a ? a : b);
    }
    if (!ctx->ops->copy_pages)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "the %s backend does not copy pages", ctx->ops->name);
    for (int32_t c = 0; c < count; c += PKV_MAX_PAGE_COPIES) {
        const int32_t n = count - c < PKV_MAX_PAGE_COPIES ? count - c : PKV_MAX_PAGE_COPIES;
        if ((s = ctx->ops->copy_pages(ctx, problem, copies + c, n, k_cache, v_cache, kv_page_stride, stream)) != PKV_OK)
            return s;
    }
    return PKV_OK;
}
