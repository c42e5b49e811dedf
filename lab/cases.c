/* cases.c - test cases shared by the tests and `pkv check` (pkv_lab.h): the random problem generator,
 * its float64 reference, poisoning, comparisons, and runs of a case on any backend. */
#include "pkv_lab.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

uint16_t pkv_test_nan_bits(pkv_dtype dtype) {
    return dtype == PKV_DTYPE_BF16 ? PKV_TEST_NAN_BF16 : PKV_TEST_NAN_FP16;
}

float pkv_test_to_float(uint16_t bits, pkv_dtype dtype) {
    return dtype == PKV_DTYPE_BF16 ? pkv_bf16_to_float(bits) : pkv_half_to_float(bits);
}

uint16_t pkv_test_from_float(float f, pkv_dtype dtype) {
    return dtype == PKV_DTYPE_BF16 ? pkv_float_to_bf16(f) : pkv_float_to_half(f);
}

int pkv_test_is_fp8(pkv_dtype d) { return d == PKV_DTYPE_FP8_E4M3 || d == PKV_DTYPE_FP8_E5M2; }

pkv_dtype pkv_test_kv_dtype(const pkv_problem *p) { return pkv_test_is_fp8(p->kv_dtype) ? p->kv_dtype : p->dtype; }

size_t pkv_test_kv_size(const pkv_problem *p) { return pkv_test_is_fp8(p->kv_dtype) ? 1 : 2; }

float pkv_test_kv_value(const pkv_test_case *tc, const void *cache, int64_t at, int32_t h, int is_v) {
    const pkv_dtype kt = pkv_test_kv_dtype(&tc->problem);
    if (!pkv_test_is_fp8(kt)) return pkv_test_to_float(((const uint16_t *)cache)[at], kt);
    return pkv_fp8_to_float(((const uint8_t *)cache)[at], kt == PKV_DTYPE_FP8_E5M2) * pkv_test_kv_scale(tc, h, is_v);
}

float pkv_test_kv_scale(const pkv_test_case *tc, int32_t h, int is_v) {
    const float *heads = is_v ? tc->v_head_scales : tc->k_head_scales;
    const float s = is_v ? tc->v_scale : tc->k_scale;
    return heads ? heads[h] : s > 0.0f ? s : 1.0f;
}

/* An fp8 code of value / scale for a random value uniform in [-1, 1], never a zero code. */
static uint8_t random_fp8(pkv_rng *rng, int e5m2, float scale) {
    for (;;) {
        const float f = (float)(2.0 * pkv_rng_uniform01(rng) - 1.0);
        const uint8_t c = pkv_float_to_fp8(f / scale, e5m2);
        if ((c & 0x7fu) != 0) return c;
    }
}

/* d random K and V values of KV head h at element `at` of the pools (the case's kv_dtype and scales). */
static void fill_kv(pkv_test_case *tc, pkv_rng *rng, int64_t at, int32_t h) {
    const pkv_dtype kt = pkv_test_kv_dtype(&tc->problem);
    const int32_t d = tc->problem.head_dim;
    if (!pkv_test_is_fp8(kt)) {
        for (int32_t e = 0; e < d; e++) {
            tc->k_cache[at + e] = pkv_test_random_value(rng, kt);
            tc->v_cache[at + e] = pkv_test_random_value(rng, kt);
        }
        return;
    }
    const int e5m2 = kt == PKV_DTYPE_FP8_E5M2;
    const float ks = pkv_test_kv_scale(tc, h, 0), vs = pkv_test_kv_scale(tc, h, 1);
    uint8_t *k8 = (uint8_t *)tc->k_cache, *v8 = (uint8_t *)tc->v_cache;
    for (int32_t e = 0; e < d; e++) {
        k8[at + e] = random_fp8(rng, e5m2, ks);
        v8[at + e] = random_fp8(rng, e5m2, vs);
    }
}

/* NaN in d K and V elements at element `at` of the pools. */
static void nan_kv(pkv_test_case *tc, int64_t at) {
    const pkv_dtype kt = pkv_test_kv_dtype(&tc->problem);
    const int32_t d = tc->problem.head_dim;
    if (pkv_test_is_fp8(kt)) {
        memset((uint8_t *)tc->k_cache + at, PKV_TEST_NAN_FP8, (size_t)d);
        memset((uint8_t *)tc->v_cache + at, PKV_TEST_NAN_FP8, (size_t)d);
        return;
    }
    const uint16_t nan_bits = pkv_test_nan_bits(kt);
    for (int32_t e = 0; e < d; e++) tc->k_cache[at + e] = tc->v_cache[at + e] = nan_bits;
}

/* An fp8 cache's scale: 1/4 of the draws 0 (meaning 1.0), else log-uniform in [1/200, 1/2]. */
static float random_scale(pkv_rng *rng) {
    if (pkv_rng_uniform01(rng) < 0.25) return 0.0f;
    return (float)exp(log(1.0 / 200.0) + pkv_rng_uniform01(rng) * log(100.0));
}

void pkv_test_choices_default(pkv_test_choices *c) {
    memset(c, 0, sizeof *c);
    c->max_batch = 6;
    c->min_batch = 1;
    c->max_len = 3000;
    c->long_len = 0;
    c->long_prob = 0.0;
    c->empty_prob = 0.1;
    c->one_prob = 0.1;
    c->hole_fraction = 0.25;
    c->poison_unused_kv = 1;
}

int64_t pkv_test_pick(pkv_rng *rng, int64_t count) {
    return count <= 1 ? 0 : pkv_rng_uniform_int(rng, 0, count - 1);
}

/* Uniform in [-1, 1], rounded to the dtype, never zero (nor -0). */
uint16_t pkv_test_random_value(pkv_rng *rng, pkv_dtype dtype) {
    for (;;) {
        float f = (float)(2.0 * pkv_rng_uniform01(rng) - 1.0);
        uint16_t bits = pkv_test_from_float(f, dtype);
        if ((bits & 0x7fffu) != 0) return bits;
    }
}

void pkv_test_case_free(pkv_test_case *tc) {
    free(tc->seq_lens);
    free(tc->kv_indptr);
    free(tc->kv_page_indices);
    free(tc->q);
    free(tc->k_cache);
    free(tc->v_cache);
    free(tc->o);
    free(tc->lse);
    free(tc->o_ref);
    free(tc->lse_ref);
    free(tc->k_head_scales);
    free(tc->v_head_scales);
    memset(tc, 0, sizeof *tc);
}

/* Element offset of token t of row i, KV head h, in the K or V pool (dense). */
int64_t pkv_test_kv_at(const pkv_test_case *tc, int32_t i, int32_t t, int32_t h) {
    const pkv_problem *p = &tc->problem;
    const int32_t ps = p->page_size, hkv = p->num_kv_heads, d = p->head_dim;
    const int64_t page = tc->kv_page_indices[tc->kv_indptr[i] + t / ps];
    const int64_t s_token = p->layout == PKV_LAYOUT_NHD ? (int64_t)hkv * d : d;
    const int64_t s_head = p->layout == PKV_LAYOUT_NHD ? d : (int64_t)ps * d;
    return page * ps * hkv * d + (int64_t)h * s_head + (int64_t)(t % ps) * s_token;
}

/* Under the problem's sliding window, NaN in K and V of every token before a row's window (tokens a
 * kernel may bring in with the window's first tile but must never let reach the output). */
void pkv_test_poison_before_window(pkv_test_case *tc) {
    const pkv_problem *p = &tc->problem;
    if (p->window <= 0) return;
    for (int32_t i = 0; i < tc->batch_size; i++)
        for (int32_t t = 0; t < tc->seq_lens[i] - p->window; t++)
            for (int32_t h = 0; h < p->num_kv_heads; h++) nan_kv(tc, pkv_test_kv_at(tc, i, t, h));
}

/* Every score of a head equal to c (pkv_lab.h). */
void pkv_test_constant_scores(pkv_test_case *tc, pkv_rng *rng, double c) {
    pkv_problem *p = &tc->problem;
    const int32_t d = p->head_dim;
    const pkv_dtype kt = pkv_test_kv_dtype(p);
    const int fp8 = pkv_test_is_fp8(kt);
    if (fp8 && tc->k_head_scales) /* one K scale for every head, so every head's q.k is the same */
        for (int32_t h = 1; h < p->num_kv_heads; h++) tc->k_head_scales[h] = tc->k_head_scales[0];
    const float ks = fp8 ? pkv_test_kv_scale(tc, 0, 0) : 1.0f;
    uint16_t qv[256], kv[256];
    uint8_t kv8[256];
    double dot = 0.0;
    while (fabs(dot) < 1.0) { /* |q.k| >= 1 keeps sm_scale = |c| / |q.k| within its documented 1e20 */
        dot = 0.0;
        for (int32_t e = 0; e < d; e++) {
            qv[e] = pkv_test_random_value(rng, p->dtype);
            double k;
            if (fp8) {
                kv8[e] = random_fp8(rng, kt == PKV_DTYPE_FP8_E5M2, ks);
                k = (double)pkv_fp8_to_float(kv8[e], kt == PKV_DTYPE_FP8_E5M2) * (double)ks;
            } else {
                kv[e] = pkv_test_random_value(rng, p->dtype);
                k = (double)pkv_test_to_float(kv[e], p->dtype);
            }
            dot += (double)pkv_test_to_float(qv[e], p->dtype) * k;
        }
    }
    if ((dot < 0.0) != (c < 0.0)) { /* flipping q's sign bits flips the scores' sign exactly */
        for (int32_t e = 0; e < d; e++) qv[e] ^= 0x8000u;
        dot = -dot;
    }
    p->sm_scale = c == 0.0 ? 1e-30f : (float)(fabs(c) / fabs(dot));
    for (int64_t e = 0; e < tc->q_elems; e++) tc->q[e] = qv[e % d];
    for (int32_t i = 0; i < tc->batch_size; i++)
        for (int32_t t = 0; t < tc->seq_lens[i]; t++)
            for (int32_t h = 0; h < p->num_kv_heads; h++) {
                if (fp8)
                    memcpy((uint8_t *)tc->k_cache + pkv_test_kv_at(tc, i, t, h), kv8, (size_t)d);
                else
                    memcpy(tc->k_cache + pkv_test_kv_at(tc, i, t, h), kv, (size_t)d * sizeof kv[0]);
            }
}

/* A random logits soft cap c in [1, 50] with sm_scale set so that the scaled scores of the tests' data
 * (q, k uniform in [-1, 1]: q.k has a standard deviation of sqrt(d) / 3) spread over 0.5..2 c: a cap that
 * binds, so a backend that ignored it would fail. */
void pkv_test_random_cap(pkv_rng *rng, pkv_problem *p) {
    const double c = (double)pkv_rng_uniform_int(rng, 1, 50), spread = 0.5 + 1.5 * pkv_rng_uniform01(rng);
    p->logits_soft_cap = (float)c;
    p->sm_scale = (float)(spread * c * 3.0 / sqrt((double)p->head_dim));
}

/* Builds a case for the given problem shape (num_pages is computed) and lengths: each row owns
 * ceil(len / page_size) pages, sometimes one more; page ids are a random permutation of the pool
 * (no page shared between rows) with hole_fraction unused pages.  Returns tc->ok. */
int pkv_test_case_build(pkv_rng *rng, const pkv_problem *shape, int32_t batch_size,
                                      const int32_t *lens, double hole_fraction, int poison_unused_kv,
                                      pkv_test_case *tc) {
    return pkv_test_case_build_kv(rng, shape, batch_size, lens, hole_fraction, poison_unused_kv, 0, tc);
}

int pkv_test_case_build_kv(pkv_rng *rng, const pkv_problem *shape, int32_t batch_size, const int32_t *lens,
                           double hole_fraction, int poison_unused_kv, int head_scales, pkv_test_case *tc) {
    memset(tc, 0, sizeof *tc);
    tc->problem = *shape;
    tc->batch_size = batch_size;
    const pkv_problem *p = &tc->problem;
    const int32_t ps = p->page_size, hq = p->num_qo_heads, hkv = p->num_kv_heads, d = p->head_dim;
    const size_t B = (size_t)batch_size;
    tc->seq_lens = (int32_t *)malloc((B + 1) * sizeof(int32_t));
    tc->kv_indptr = (int32_t *)malloc((B + 1) * sizeof(int32_t));
    if (!tc->seq_lens || !tc->kv_indptr) return 0;
    int64_t used = 0;
    tc->kv_indptr[0] = 0;
    for (int32_t i = 0; i < batch_size; i++) {
        tc->seq_lens[i] = lens[i];
        tc->total_tokens += lens[i];
        int64_t pages = ((int64_t)lens[i] + ps - 1) / ps;
        if (pkv_rng_uniform01(rng) < 0.2) pages += 1; /* a spare page past the length */
        used += pages;
        tc->kv_indptr[i + 1] = (int32_t)used;
    }
    int64_t holes = (int64_t)((double)used * hole_fraction) + (used > 0 ? 1 : 0);
    int64_t num_pages = used + holes;
    tc->problem.num_pages = num_pages;
    /* pool: a random permutation of [0, num_pages); rows take the first `used` entries */
    int32_t *perm = (int32_t *)malloc((size_t)(num_pages > 0 ? num_pages : 1) * sizeof(int32_t));
    tc->kv_page_indices = (int32_t *)malloc((size_t)(used > 0 ? used : 1) * sizeof(int32_t));
    if (!perm || !tc->kv_page_indices) {
        free(perm);
        return 0;
    }
    for (int64_t j = 0; j < num_pages; j++) perm[j] = (int32_t)j;
    for (int64_t j = num_pages - 1; j > 0; j--) {
        int64_t r = pkv_rng_uniform_int(rng, 0, j);
        int32_t tmp = perm[j];
        perm[j] = perm[r];
        perm[r] = tmp;
    }
    for (int64_t j = 0; j < used; j++) tc->kv_page_indices[j] = perm[j];
    free(perm);

    tc->q_elems = (int64_t)batch_size * hq * d;
    tc->lse_elems = (int64_t)batch_size * hq;
    tc->kv_elems = num_pages * ps * hkv * d;
    size_t qn = (size_t)(tc->q_elems > 0 ? tc->q_elems : 1), ln = (size_t)(tc->lse_elems > 0 ? tc->lse_elems : 1);
    /* an fp8 cache: kv_elems bytes (uint16 units rounded up), and its scales drawn first */
    size_t kn = (size_t)(tc->kv_elems > 0 ? tc->kv_elems : 1);
    if (pkv_test_is_fp8(p->kv_dtype)) {
        kn = (kn + 1) / 2;
        if (head_scales) {
            tc->k_head_scales = (float *)malloc((size_t)hkv * sizeof(float));
            tc->v_head_scales = (float *)malloc((size_t)hkv * sizeof(float));
            if (!tc->k_head_scales || !tc->v_head_scales) return 0;
            for (int32_t h = 0; h < hkv; h++) {
                const float a = random_scale(rng), b = random_scale(rng);
                tc->k_head_scales[h] = a > 0.0f ? a : 1.0f;
                tc->v_head_scales[h] = b > 0.0f ? b : 1.0f;
            }
        } else {
            tc->k_scale = random_scale(rng);
            tc->v_scale = random_scale(rng);
        }
    }
    tc->q = (uint16_t *)malloc(qn * sizeof(uint16_t));
    tc->o = (uint16_t *)malloc(qn * sizeof(uint16_t));
    tc->o_ref = (double *)malloc(qn * sizeof(double));
    tc->lse = (float *)malloc(ln * sizeof(float));
    tc->lse_ref = (double *)malloc(ln * sizeof(double));
    tc->k_cache = (uint16_t *)malloc(kn * sizeof(uint16_t));
    tc->v_cache = (uint16_t *)malloc(kn * sizeof(uint16_t));
    if (!tc->q || !tc->o || !tc->o_ref || !tc->lse || !tc->lse_ref || !tc->k_cache || !tc->v_cache) return 0;
    for (int64_t e = 0; e < tc->q_elems; e++) tc->q[e] = pkv_test_random_value(rng, p->dtype);
    if (!pkv_test_is_fp8(p->kv_dtype)) {
        const uint16_t nan_bits = pkv_test_nan_bits(p->dtype);
        for (int64_t e = 0; e < tc->kv_elems; e++) {
            tc->k_cache[e] = poison_unused_kv ? nan_bits : pkv_test_random_value(rng, p->dtype);
            tc->v_cache[e] = poison_unused_kv ? nan_bits : pkv_test_random_value(rng, p->dtype);
        }
    } else { /* every slot of a page: pages, then KV heads, then tokens (both layouts hold a head's d in a run) */
        for (int64_t pg = 0; pg < num_pages; pg++)
            for (int32_t h = 0; h < hkv; h++)
                for (int32_t t = 0; t < ps; t++) {
                    const int64_t at = pg * ps * hkv * d +
                                       (p->layout == PKV_LAYOUT_NHD ? (int64_t)t * hkv * d + (int64_t)h * d
                                                                    : (int64_t)h * ps * d + (int64_t)t * d);
                    if (poison_unused_kv) nan_kv(tc, at);
                    else fill_kv(tc, rng, at, h);
                }
    }
    if (poison_unused_kv) { /* real data only where a row's tokens live */
        for (int32_t i = 0; i < batch_size; i++)
            for (int32_t t = 0; t < lens[i]; t++)
                for (int32_t h = 0; h < hkv; h++) fill_kv(tc, rng, pkv_test_kv_at(tc, i, t, h), h);
    }
    tc->table.batch_size = batch_size;
    tc->table.kv_indptr = tc->kv_indptr;
    tc->table.kv_page_indices = tc->kv_page_indices;
    tc->table.seq_lens = tc->seq_lens;
    tc->ok = 1;
    return 1;
}

/* Draws one random length under the choices. */
int32_t pkv_test_random_len(pkv_rng *rng, const pkv_test_choices *c) {
    double u = pkv_rng_uniform01(rng);
    if (u < c->empty_prob) return 0;
    if (u < c->empty_prob + c->one_prob) return 1;
    if (c->long_len > 0 && pkv_rng_uniform01(rng) < c->long_prob)
        return (int32_t)pkv_rng_uniform_int(rng, 2, c->long_len);
    return (int32_t)pkv_rng_uniform_int(rng, 2, c->max_len > 2 ? c->max_len : 2);
}

/* Draws a whole random case under the choices.  Returns tc->ok. */
int pkv_test_case_random(pkv_rng *rng, const pkv_test_choices *c, pkv_test_case *tc) {
    static const int32_t def_groups[] = {1, 4, 8}, def_kv[] = {1, 2}, def_dims[] = {64, 128},
                         def_pages[] = {1, 16, 64};
    static const pkv_layout def_layouts[] = {PKV_LAYOUT_NHD, PKV_LAYOUT_HND};
    static const pkv_dtype def_dtypes[] = {PKV_DTYPE_FP16, PKV_DTYPE_BF16};
    pkv_problem p;
    int head_scales = 0;
    pkv_problem_default(&p);
    int32_t G = c->num_groups ? c->groups[pkv_test_pick(rng, c->num_groups)] : def_groups[pkv_test_pick(rng, 3)];
    p.num_kv_heads = c->num_kv_heads ? c->kv_heads[pkv_test_pick(rng, c->num_kv_heads)] : def_kv[pkv_test_pick(rng, 2)];
    p.num_qo_heads = G * p.num_kv_heads;
    p.head_dim = c->num_head_dims ? c->head_dims[pkv_test_pick(rng, c->num_head_dims)] : def_dims[pkv_test_pick(rng, 2)];
    p.page_size = c->num_page_sizes ? c->page_sizes[pkv_test_pick(rng, c->num_page_sizes)] : def_pages[pkv_test_pick(rng, 3)];
    p.layout = c->num_layouts ? c->layouts[pkv_test_pick(rng, c->num_layouts)] : def_layouts[pkv_test_pick(rng, 2)];
    p.dtype = c->num_dtypes ? c->dtypes[pkv_test_pick(rng, c->num_dtypes)] : def_dtypes[pkv_test_pick(rng, 2)];
    if (c->num_kv_dtypes > 0) { /* drawn only when listed: the other cases' draws stay as they were */
        p.kv_dtype = c->kv_dtypes[pkv_test_pick(rng, c->num_kv_dtypes)];
        head_scales = pkv_test_is_fp8(p.kv_dtype) && pkv_rng_uniform01(rng) < c->head_scale_prob;
    }
    int32_t lo = c->min_batch > 0 ? c->min_batch : 0, hi = c->max_batch > lo ? c->max_batch : lo;
    int32_t B = (int32_t)pkv_rng_uniform_int(rng, lo, hi);
    int32_t *lens = (int32_t *)malloc((size_t)(B > 0 ? B : 1) * sizeof(int32_t));
    if (!lens) {
        memset(tc, 0, sizeof *tc);
        return 0;
    }
    for (int32_t i = 0; i < B; i++) lens[i] = pkv_test_random_len(rng, c);
    int ok = pkv_test_case_build_kv(rng, &p, B, lens, c->hole_fraction, c->poison_unused_kv, head_scales, tc);
    free(lens);
    return ok;
}

/* Fills o_ref and lse_ref with the float64 reference. */
pkv_status pkv_test_case_reference(pkv_test_case *tc) {
    return pkv_reference_kv(&tc->problem, &tc->table, tc->q, tc->k_cache, tc->v_cache, tc->k_scale, tc->v_scale,
                            tc->k_head_scales, tc->v_head_scales, tc->o_ref, tc->lse_ref);
}

/* Fills o with the dtype's NaN pattern and lse with NaN, so unwritten elements show. */
void pkv_test_poison(pkv_test_case *tc) {
    const uint16_t nan_bits = pkv_test_nan_bits(tc->problem.dtype);
    for (int64_t e = 0; e < tc->q_elems; e++) tc->o[e] = nan_bits;
    for (int64_t e = 0; e < tc->lse_elems; e++) tc->lse[e] = NAN;
}

/* Output elements (o and lse) still NaN: 0 when every element was written with a number. */
int64_t pkv_test_unwritten(const pkv_test_case *tc) {
    int64_t bad = 0;
    for (int64_t e = 0; e < tc->q_elems; e++) {
        float f = pkv_test_to_float(tc->o[e], tc->problem.dtype);
        if (isnan(f)) bad++;
    }
    for (int64_t e = 0; e < tc->lse_elems; e++)
        if (isnan(tc->lse[e])) bad++;
    return bad;
}

/* Relative L2 error of o against o_ref: ||o - o_ref|| / max(||o_ref||, tiny).  NaN or inf in o
 * gives +inf. */
double pkv_test_rel_l2(const pkv_test_case *tc) {
    double num = 0.0, den = 0.0;
    for (int64_t e = 0; e < tc->q_elems; e++) {
        double x = (double)pkv_test_to_float(tc->o[e], tc->problem.dtype);
        if (!isfinite(x)) return INFINITY;
        double diff = x - tc->o_ref[e];
        num += diff * diff;
        den += tc->o_ref[e] * tc->o_ref[e];
    }
    if (den < 1e-300) return sqrt(num);
    return sqrt(num / den);
}

/* Largest |o - o_ref|; +inf when o holds NaN or inf. */
double pkv_test_max_abs(const pkv_test_case *tc) {
    double worst = 0.0;
    for (int64_t e = 0; e < tc->q_elems; e++) {
        double x = (double)pkv_test_to_float(tc->o[e], tc->problem.dtype);
        if (!isfinite(x)) return INFINITY;
        double diff = fabs(x - tc->o_ref[e]);
        if (diff > worst) worst = diff;
    }
    return worst;
}

/* Largest |lse - lse_ref| / max(1, |lse_ref|); empty rows must give -inf in both (0 error), any
 * other mismatch of infinities or a NaN gives +inf. */
double pkv_test_lse_err(const pkv_test_case *tc) {
    double worst = 0.0;
    for (int64_t e = 0; e < tc->lse_elems; e++) {
        double x = (double)tc->lse[e], r = tc->lse_ref[e];
        if (isinf(r) || isinf(x) || isnan(x)) {
            if (!(isinf(r) && isinf(x) && (r < 0) == (x < 0))) return INFINITY;
            continue;
        }
        double err = fabs(x - r) / (fabs(r) > 1.0 ? fabs(r) : 1.0);
        if (err > worst) worst = err;
    }
    return worst;
}

/* Rows of length 0 must give o == +0 or -0 exactly: count the elements that do not. */
int64_t pkv_test_empty_rows_nonzero(const pkv_test_case *tc) {
    const int64_t row = (int64_t)tc->problem.num_qo_heads * tc->problem.head_dim;
    int64_t bad = 0;
    for (int32_t i = 0; i < tc->batch_size; i++)
        if (tc->seq_lens[i] == 0)
            for (int64_t e = 0; e < row; e++)
                if ((tc->o[(int64_t)i * row + e] & 0x7fffu) != 0) bad++;
    return bad;
}

/* The case's K and V pools as one buffer that interleaves them per page (FlashInfer's and vLLM's
 * [pages, 2, ...] cache) with pad elements after each page's V: page stride 2 x page + pad. */
uint16_t *pkv_test_interleave(const pkv_test_case *tc, int64_t pad, int64_t *stride) {
    const pkv_problem *p = &tc->problem;
    const int64_t page = (int64_t)p->page_size * p->num_kv_heads * p->head_dim;
    const size_t es = pkv_test_kv_size(p);
    *stride = 2 * page + pad;
    char *kv = (char *)malloc((size_t)(p->num_pages * *stride) * es + 2);
    if (!kv) return NULL;
    if (es == 1) { /* NaN in the padding */
        memset(kv, PKV_TEST_NAN_FP8, (size_t)(p->num_pages * *stride));
    } else {
        const uint16_t nan_bits = pkv_test_nan_bits(p->dtype); /* 0x7e00 is finite in bf16 */
        for (int64_t i = 0; i < p->num_pages * *stride; i++) ((uint16_t *)(void *)kv)[i] = nan_bits;
    }
    for (int64_t pg = 0; pg < p->num_pages; pg++) {
        memcpy(kv + (size_t)(pg * *stride) * es, (const char *)tc->k_cache + (size_t)(pg * page) * es, (size_t)page * es);
        memcpy(kv + (size_t)(pg * *stride + page) * es, (const char *)tc->v_cache + (size_t)(pg * page) * es,
               (size_t)page * es);
    }
    return (uint16_t *)(void *)kv;
}

/* A copy of B rows of `row` elements spread `stride` apart, the gaps filled with `fill`. */
uint16_t *pkv_test_spread_rows(const uint16_t *src, int32_t B, int64_t row, int64_t stride,
                                             uint16_t fill) {
    uint16_t *dst = (uint16_t *)malloc((size_t)(B * stride) * 2 + 2);
    if (!dst) return NULL;
    for (int64_t i = 0; i < B * stride; i++) dst[i] = fill;
    for (int32_t b = 0; b < B; b++) memcpy(dst + b * stride, src + b * row, (size_t)row * 2);
    return dst;
}

/* The rows back from a spread copy; returns how many gap elements are no longer `fill`. */
int64_t pkv_test_gather_rows(uint16_t *dst, const uint16_t *src, int32_t B, int64_t row,
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
pkv_status pkv_test_run_layout(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc,
                                             const pkv_test_layout *L, int64_t *gap_writes) {
    const pkv_problem *p = &tc->problem;
    const int32_t B = tc->batch_size;
    const int64_t page = (int64_t)p->page_size * p->num_kv_heads * p->head_dim;
    const size_t es = pkv_test_kv_size(p); /* bytes of a cache element */
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
                         .v_cache = kv ? (const void *)((const char *)kv + (size_t)page * es) : tc->v_cache,
                         .kv_page_indices = tc->kv_page_indices,
                         .o = o_host,
                         .lse = tc->lse,
                         .kv_page_stride = stride,
                         .q_row_stride = qs,
                         .o_row_stride = os,
                         .k_scale = tc->k_scale,
                         .v_scale = tc->v_scale,
                         .k_head_scales = tc->k_head_scales,
                         .v_head_scales = tc->v_head_scales};
        if (st == PKV_OK) st = pkv_run(ctx, plan, ws, ws_bytes, &t, NULL);
        free(ws);
    } else if (st == PKV_OK) {
        size_t kvb = (size_t)tc->kv_elems * es, lb = (size_t)tc->lse_elems * 4;
        size_t ib = (size_t)tc->kv_indptr[B] * 4, kvib = (size_t)(p->num_pages * stride) * es;
        size_t hb = (size_t)p->num_kv_heads * sizeof(float);
        void *q = NULL, *k = NULL, *v = NULL, *o = NULL, *lse = NULL, *idx = NULL, *ws = NULL, *khs = NULL, *vhs = NULL;
        st = pkv_dev_malloc(ctx, qb, &q);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, kv ? kvib : kvb, &k);
        if (st == PKV_OK && !kv) st = pkv_dev_malloc(ctx, kvb, &v);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, ob, &o);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, lb, &lse);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, ib, &idx);
        if (st == PKV_OK) st = pkv_dev_malloc(ctx, ws_bytes, &ws);
        if (st == PKV_OK && tc->k_head_scales) st = pkv_dev_malloc(ctx, hb, &khs);
        if (st == PKV_OK && tc->v_head_scales) st = pkv_dev_malloc(ctx, hb, &vhs);
        if (st == PKV_OK && khs) st = pkv_dev_copy_h2d(ctx, khs, tc->k_head_scales, hb);
        if (st == PKV_OK && vhs) st = pkv_dev_copy_h2d(ctx, vhs, tc->v_head_scales, hb);
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, q, q_host, qb);
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, k, kv ? (const void *)kv : tc->k_cache, kv ? kvib : kvb);
        if (st == PKV_OK && !kv) st = pkv_dev_copy_h2d(ctx, v, tc->v_cache, kvb);
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, idx, tc->kv_page_indices, ib);
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, o, o_host, ob);      /* poisoned */
        if (st == PKV_OK) st = pkv_dev_copy_h2d(ctx, lse, tc->lse, lb); /* poisoned */
        if (st == PKV_OK) {
            const void *vp = kv ? (const void *)((const char *)k + (size_t)page * es) : v;
            pkv_tensors t = {.q = q,
                             .k_cache = k,
                             .v_cache = vp,
                             .kv_page_indices = (const int32_t *)idx,
                             .o = o,
                             .lse = (float *)lse,
                             .kv_page_stride = stride,
                             .q_row_stride = qs,
                             .o_row_stride = os,
                             .k_scale = tc->k_scale,
                             .v_scale = tc->v_scale,
                             .k_head_scales = (const float *)khs,
                             .v_head_scales = (const float *)vhs};
            st = pkv_run(ctx, plan, ws, ws_bytes, &t, NULL);
        }
        if (st == PKV_OK) st = pkv_dev_synchronize(ctx);
        if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, o_host, o, ob);
        if (st == PKV_OK) st = pkv_dev_copy_d2h(ctx, tc->lse, lse, lb);
        void *bufs[] = {q, k, v, o, lse, idx, ws, khs, vhs};
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
pkv_status pkv_test_run_kv(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc, int64_t pad) {
    const pkv_test_layout L = {pad, 0, 0};
    return pkv_test_run_layout(ctx, plan, tc, &L, NULL);
}

pkv_status pkv_test_run(pkv_context *ctx, const pkv_plan *plan, pkv_test_case *tc) {
    return pkv_test_run_kv(ctx, plan, tc, -1);
}

