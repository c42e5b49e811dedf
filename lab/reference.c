/* reference.c - the float64 reference of decode attention over a paged KV cache (design.md §1):
 * the definition every backend is checked against.  Slow on purpose: plain loops, one row and one
 * KV head at a time, every score kept in double, exact two-pass softmax (max, then sum).
 *
 * For query head h of row i (KV head g = h / G), with N = seq_lens[i]:
 *   s_j = scale * dot(q[i,h,:], K[i,g,j,:])           j in [0, N)
 *         (logits_soft_cap c > 0: s_j = c * tanh(scale * dot / c));  a sliding window W > 0 keeps
 *         j in [max(0, N - W), N) only
 *   o[i,h,:] = sum_j exp(s_j - max s) V[i,g,j,:] / sum_j exp(s_j - max s)
 *   lse[i,h] = max s + ln(sum_j exp(s_j - max s));     N = 0: o = 0, lse = -inf.
 * An fp8 cache (kv_dtype) is read as the double of each code times its scale, exactly: the error of the
 * CPU backend's fp32 dequantization is part of what the tests measure. */
#include "pkv_lab.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The largest G the library documents (persistentkv.h): the per-head sums below. */
#define REF_MAX_GROUP 16

static double load_elem(const uint16_t *base, int64_t index, pkv_dtype dtype) {
    uint16_t bits = base[index];
    return dtype == PKV_DTYPE_BF16 ? (double)pkv_bf16_to_float(bits) : (double)pkv_half_to_float(bits);
}

static bool is_fp8(pkv_dtype d) { return d == PKV_DTYPE_FP8_E4M3 || d == PKV_DTYPE_FP8_E5M2; }

/* A cache element as a double: fp16 / bf16 as they are, an fp8 code times scale. */
static double load_kv(const void *base, int64_t index, pkv_dtype kv_dtype, double scale) {
    if (is_fp8(kv_dtype))
        return (double)pkv_fp8_to_float(((const uint8_t *)base)[index], kv_dtype == PKV_DTYPE_FP8_E5M2) * scale;
    return load_elem((const uint16_t *)base, index, kv_dtype);
}

pkv_status pkv_reference(const pkv_problem *problem, const pkv_page_table *table, const void *q,
                         const void *k_cache, const void *v_cache, double *o_ref, double *lse_ref) {
    return pkv_reference_kv(problem, table, q, k_cache, v_cache, 0.0f, 0.0f, NULL, NULL, o_ref, lse_ref);
}

pkv_status pkv_reference_kv(const pkv_problem *problem, const pkv_page_table *table, const void *q,
                            const void *k_cache, const void *v_cache, float k_scale, float v_scale,
                            const float *k_head_scales, const float *v_head_scales, double *o_ref, double *lse_ref) {
    /* the library's own checks of the shapes and the table: the reference defines the math, not the bounds */
    pkv_status st = pkv_check_page_table(problem, table);
    if (st != PKV_OK) return st;
    const int32_t B = table->batch_size;
    if (B == 0) return PKV_OK;
    if (!q || !o_ref || !lse_ref)
        return pkv_lab_fail(PKV_ERR_NULL_POINTER, "q, o_ref and lse_ref must not be NULL");
    int64_t max_len = 0;
    for (int32_t i = 0; i < B; i++)
        if (table->seq_lens[i] > max_len) max_len = table->seq_lens[i];
    if (max_len > 0 && (!k_cache || !v_cache))
        return pkv_lab_fail(PKV_ERR_NULL_POINTER, "k_cache and v_cache must not be NULL");

    const int32_t hq = problem->num_qo_heads, hkv = problem->num_kv_heads, d = problem->head_dim;
    const int32_t G = hq / hkv, ps = problem->page_size;
    const pkv_dtype dtype = problem->dtype;
    const pkv_dtype kv_dtype = is_fp8(problem->kv_dtype) ? problem->kv_dtype : dtype;
    if (!is_fp8(kv_dtype) && (k_head_scales || v_head_scales || (k_scale != 0.0f && k_scale != 1.0f) ||
                              (v_scale != 0.0f && v_scale != 1.0f)))
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "the reference: scales apply to fp8 caches only");
    if (!(k_scale >= 0.0f) || !(v_scale >= 0.0f) || isinf(k_scale) || isinf(v_scale))
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "the reference: k_scale and v_scale must be finite and >= 0");
    /* the scale as the library takes it: a float (1 / sqrt(d) rounded to float by default) */
    const double scale = problem->sm_scale > 0 ? (double)problem->sm_scale : (double)(float)(1.0 / sqrt((double)d));
    const double cap = (double)problem->logits_soft_cap;
    /* element strides of a page, a KV head and a token in the pool, by layout */
    const int64_t s_page = (int64_t)ps * hkv * d;
    const int64_t s_head = problem->layout == PKV_LAYOUT_NHD ? d : (int64_t)ps * d;
    const int64_t s_token = problem->layout == PKV_LAYOUT_NHD ? (int64_t)hkv * d : d;
    const uint16_t *q16 = (const uint16_t *)q;        // q [B, Hq, d]; K and V pages NHD or HND, kv_dtype

    /* scores [G, max_len], the G query vectors [G, d] and one K or V row [d], all double */
    size_t n_scores = (size_t)G * (size_t)(max_len > 0 ? max_len : 1);
    double *scores = (double *)malloc(n_scores * sizeof(double));
    double *qd = (double *)malloc((size_t)G * (size_t)d * sizeof(double));
    double *row = (double *)malloc((size_t)d * sizeof(double));
    if (!scores || !qd || !row) {
        free(scores);
        free(qd);
        free(row);
        return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate the reference's scratch");
    }

    for (int32_t i = 0; i < B; i++) {
        const int32_t n = table->seq_lens[i];
        const int32_t t0 = problem->window > 0 && n > problem->window ? n - problem->window : 0;
        const int32_t *pages = n > 0 ? table->kv_page_indices + table->kv_indptr[i] : NULL;
        for (int32_t g = 0; g < hkv; g++) {
            const double ks = k_head_scales ? (double)k_head_scales[g] : (k_scale > 0.0f ? (double)k_scale : 1.0);
            const double vs = v_head_scales ? (double)v_head_scales[g] : (v_scale > 0.0f ? (double)v_scale : 1.0);
            double *o_rows = o_ref + ((int64_t)i * hq + (int64_t)g * G) * d; // o_ref [B, Hq, d]
            double *lse_rows = lse_ref + (int64_t)i * hq + (int64_t)g * G;   // lse_ref [B, Hq]
            memset(o_rows, 0, (size_t)G * (size_t)d * sizeof(double));
            if (n == 0) {
                for (int32_t j = 0; j < G; j++) lse_rows[j] = -INFINITY;
                continue;
            }
            for (int32_t j = 0; j < G; j++)
                for (int32_t e = 0; e < d; e++)
                    qd[(int64_t)j * d + e] = load_elem(q16, ((int64_t)i * hq + (int64_t)g * G + j) * d + e, dtype);
            /* pass 1: scores */
            for (int32_t t = t0; t < n; t++) {
                int64_t at = (int64_t)pages[t / ps] * s_page + (int64_t)g * s_head + (int64_t)(t % ps) * s_token;
                for (int32_t e = 0; e < d; e++) row[e] = load_kv(k_cache, at + e, kv_dtype, ks);
                for (int32_t j = 0; j < G; j++) {
                    double dot = 0.0;
                    for (int32_t e = 0; e < d; e++) dot += qd[(int64_t)j * d + e] * row[e];
                    scores[(int64_t)j * n + t] = cap > 0.0 ? cap * tanh(scale * dot / cap) : scale * dot;
                }
            }
            /* pass 2: softmax weights and the weighted sum of V */
            double maxs[REF_MAX_GROUP], sums[REF_MAX_GROUP];
            for (int32_t j = 0; j < G; j++) {
                double m = -INFINITY;
                for (int32_t t = t0; t < n; t++)
                    if (scores[(int64_t)j * n + t] > m) m = scores[(int64_t)j * n + t];
                maxs[j] = m;
                sums[j] = 0.0;
            }
            for (int32_t t = t0; t < n; t++) {
                int64_t at = (int64_t)pages[t / ps] * s_page + (int64_t)g * s_head + (int64_t)(t % ps) * s_token;
                for (int32_t e = 0; e < d; e++) row[e] = load_kv(v_cache, at + e, kv_dtype, vs);
                for (int32_t j = 0; j < G; j++) {
                    double p = exp(scores[(int64_t)j * n + t] - maxs[j]);
                    sums[j] += p;
                    double *o = o_rows + (int64_t)j * d;
                    for (int32_t e = 0; e < d; e++) o[e] += p * row[e];
                }
            }
            for (int32_t j = 0; j < G; j++) {
                double *o = o_rows + (int64_t)j * d;
                for (int32_t e = 0; e < d; e++) o[e] /= sums[j];
                lse_rows[j] = maxs[j] + log(sums[j]);
            }
        }
    }
    free(scores);
    free(qd);
    free(row);
    return PKV_OK;
}
