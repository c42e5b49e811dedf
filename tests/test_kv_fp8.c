/* test_kv_fp8.c - fp8 KV caches (pkv_problem.kv_dtype: e4m3, e5m2) on the CPU backend.
 *
 * Decode against the float64 reference on every route (auto, single, split, bucketed, workqueue, fused, the
 * split ones forced to split) x NHD and HND x page sizes 1, 3, 16, 64, 256 x head dims 64, 128, 256 x e4m3
 * and e5m2 x per-tensor and per-KV-head scales, q and o in fp16 or bf16 (alternating), G and Hkv drawn,
 * lengths 0 and 1 among typical ones, pages scattered over a pool with holes and every KV slot no row reads
 * set to the fp8 NaN code; outputs poisoned before each run.  Then: K and V interleaved in one buffer with
 * padding, strided q and o rows, caches at odd addresses (one-byte alignment), sliding windows and soft
 * caps, the constant-score family (exact merges at any score), bitwise determinism, the planner's counters
 * and cost terms (one byte per fp8 element), NaN codes in attended tokens (o NaN for the token's KV head, lse
 * too for K, on every route, as the reference), pkv_append_kv quantizing on write (every slot equals the
 * conversion of value / scale, saturation at the largest finite, NaN kept, bf16 and fp16 sources, per-tensor
 * and per-head scales, decode after the append), pkv_copy_pages of one-byte pages, and every bad input's
 * status and message.
 *
 * Tolerances: the reference reads the same fp8 codes (the double of each code times its scale), so the
 * error left is the fp32 dequantization (one rounding of code x scale), fp32 accumulation and the rounding
 * of o to fp16 / bf16 - the fp16 / bf16 path's bounds (PKV_TEST_TOL_*) apply unchanged. */
#include "persistentkv.h"
#include "pkv_lab.h"
#include "pkv_test.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static pkv_context *g_ctx;
static double g_worst[2]; /* relative L2 of o, fp16 and bf16 q/o */
static int g_runs;

static const pkv_route kRoutes[] = {PKV_ROUTE_AUTO,     PKV_ROUTE_SINGLE,    PKV_ROUTE_SPLIT,
                                    PKV_ROUTE_BUCKETED, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};

/* Options that make the split routes split rows of a few hundred tokens. */
static pkv_plan_options options_for(pkv_route route, int32_t page_size) {
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.route = route;
    if (route == PKV_ROUTE_AUTO) return o;
    o.parallelism = 16;
    o.min_chunk_tokens = 16;
    if (route == PKV_ROUTE_SPLIT || route == PKV_ROUTE_BUCKETED) o.num_splits = 3;
    if (route == PKV_ROUTE_WORKQUEUE || route == PKV_ROUTE_FUSED) o.chunk_pages = page_size >= 48 ? 1 : 48 / page_size;
    return o;
}

static void describe(const pkv_test_case *tc, const char *what, char *buf, size_t cap) {
    const pkv_problem *p = &tc->problem;
    int n = snprintf(buf, cap, "%s: Hq %d Hkv %d d %d page %d %s q %s kv %s %s scales B %d lens", what,
                     p->num_qo_heads, p->num_kv_heads, p->head_dim, p->page_size,
                     p->layout == PKV_LAYOUT_NHD ? "NHD" : "HND", p->dtype == PKV_DTYPE_BF16 ? "bf16" : "fp16",
                     p->kv_dtype == PKV_DTYPE_FP8_E5M2 ? "e5m2" : "e4m3", tc->k_head_scales ? "per-head" : "per-tensor",
                     tc->batch_size);
    for (int32_t i = 0; i < tc->batch_size && n > 0 && (size_t)n < cap - 12; i++)
        n += snprintf(buf + n, cap - (size_t)n, "%s%d", i ? "," : " ", tc->seq_lens[i]);
}

/* The outputs against the reference: every element written, relative L2 of o and lse error in bounds,
 * empty rows 0. */
static bool outputs_ok(const pkv_test_case *tc, const char *label) {
    const int bf16 = tc->problem.dtype == PKV_DTYPE_BF16;
    const double tol = bf16 ? PKV_TEST_TOL_O_BF16 : PKV_TEST_TOL_O_FP16;
    const int64_t unwritten = pkv_test_unwritten(tc), nonzero = pkv_test_empty_rows_nonzero(tc);
    const double rel = pkv_test_rel_l2(tc), lerr = pkv_test_lse_err(tc);
    CHECK_MSG(unwritten == 0, "%s: %lld outputs unwritten", label, (long long)unwritten);
    CHECK_MSG(rel < tol, "%s: relative L2 error of o %.3g >= %.3g", label, rel, tol);
    CHECK_MSG(lerr < PKV_TEST_TOL_LSE, "%s: lse error %.3g >= %.3g", label, lerr, PKV_TEST_TOL_LSE);
    CHECK_MSG(nonzero == 0, "%s: %lld elements of empty rows are not 0", label, (long long)nonzero);
    if (rel > g_worst[bf16] && rel < INFINITY) g_worst[bf16] = rel;
    g_runs++;
    return unwritten == 0 && rel < tol && lerr < PKV_TEST_TOL_LSE && nonzero == 0;
}

/* Plans the case with the options, checks the plan, runs it (outputs poisoned) with the tensors laid out as
 * L says, and checks the outputs. */
static bool run_checked(pkv_test_case *tc, const pkv_plan_options *o, const pkv_test_layout *L, const char *what) {
    char label[512];
    describe(tc, what, label, sizeof label);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    bool ok = false;
    pkv_status st = pkv_plan_step(g_ctx, &tc->problem, &tc->table, o, plan);
    CHECK_MSG(st == PKV_OK, "%s: pkv_plan_step: %s", label, pkv_last_error());
    if (st == PKV_OK) {
        const char *why = "";
        CHECK_MSG(pkv_test_validate(plan, tc->seq_lens, &why) == PKV_OK, "%s: invalid plan: %s", label, why);
        pkv_test_poison(tc);
        const pkv_test_layout dense = {-1, 0, 0};
        int64_t gap = 0;
        st = pkv_test_run_layout(g_ctx, plan, tc, L ? L : &dense, &gap);
        CHECK_MSG(st == PKV_OK, "%s: pkv_run: %s", label, pkv_last_error());
        CHECK_MSG(gap == 0, "%s: %lld elements between the rows of o written", label, (long long)gap);
        if (st == PKV_OK) ok = outputs_ok(tc, label);
    }
    pkv_plan_free(plan);
    return ok;
}

static int32_t random_len(pkv_rng *rng) {
    const double u = pkv_rng_uniform01(rng);
    if (u < 0.1) return 0;
    if (u < 0.2) return 1;
    if (u < 0.3) return (int32_t)pkv_rng_uniform_int(rng, 400, 700);
    return (int32_t)pkv_rng_uniform_int(rng, 2, 300);
}

/* A random problem of the given shape and cache format. */
static pkv_problem shape_of(pkv_rng *rng, int32_t d, int32_t ps, pkv_layout layout, pkv_dtype kv, pkv_dtype dtype) {
    static const int32_t groups[] = {1, 4, 7, 16};
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_kv_heads = (int32_t)pkv_rng_uniform_int(rng, 1, 2);
    p.num_qo_heads = p.num_kv_heads * groups[pkv_rng_uniform_int(rng, 0, 3)];
    p.head_dim = d;
    p.page_size = ps;
    p.layout = layout;
    p.dtype = dtype;
    p.kv_dtype = kv;
    return p;
}

/* Every route x layout x page size x head dim x format x scale mode. */
static void test_sweep(pkv_rng *rng) {
    static const int32_t dims[] = {64, 128, 256}, pages[] = {1, 3, 16, 64, 256};
    static const pkv_dtype kvs[] = {PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2};
    int cases = 0, failed = 0;
    for (int ip = 0; ip < 5; ip++)
        for (int id = 0; id < 3; id++)
            for (int il = 0; il < 2; il++)
                for (int ik = 0; ik < 2; ik++)
                    for (int heads = 0; heads < 2; heads++) {
                        const pkv_dtype dt = cases % 2 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
                        pkv_problem p = shape_of(rng, dims[id], pages[ip], il ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD,
                                                 kvs[ik], dt);
                        const int32_t B = (int32_t)pkv_rng_uniform_int(rng, 1, 4);
                        int32_t lens[4];
                        for (int32_t i = 0; i < B; i++) lens[i] = random_len(rng);
                        pkv_test_case tc;
                        CHECK(pkv_test_case_build_kv(rng, &p, B, lens, 0.25, 1, heads, &tc));
                        CHECK_OK(pkv_test_case_reference(&tc));
                        for (size_t r = 0; r < sizeof kRoutes / sizeof kRoutes[0]; r++) {
                            const pkv_plan_options o = options_for(kRoutes[r], p.page_size);
                            failed += !run_checked(&tc, &o, NULL, pkv_route_name(kRoutes[r]));
                        }
                        pkv_test_case_free(&tc);
                        cases++;
                    }
    printf("sweep: %d cases x %d routes (%d failed)\n", cases, (int)(sizeof kRoutes / sizeof kRoutes[0]), failed);
}

/* Interleaved K/V with padding, strided q and o, odd cache addresses, windows and caps, constant scores,
 * determinism. */
static void test_layouts(pkv_rng *rng) {
    int runs = 0;
    for (int c = 0; c < 16; c++) {
        pkv_problem p = shape_of(rng, c % 3 == 0 ? 64 : c % 3 == 1 ? 128 : 256, c % 4 == 0 ? 1 : c % 4 == 1 ? 5 : 16,
                                 c % 2 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD, c % 4 < 2 ? PKV_DTYPE_FP8_E4M3 : PKV_DTYPE_FP8_E5M2,
                                 c % 3 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16);
        if (c % 5 == 1) pkv_test_random_cap(rng, &p);
        if (c % 5 == 2) p.window = (int32_t)pkv_rng_uniform_int(rng, 1, 200);
        int32_t lens[3];
        for (int i = 0; i < 3; i++) lens[i] = random_len(rng);
        pkv_test_case tc;
        CHECK(pkv_test_case_build_kv(rng, &p, 3, lens, 0.2, 1, c % 2, &tc));
        pkv_test_poison_before_window(&tc);
        CHECK_OK(pkv_test_case_reference(&tc));
        const pkv_test_layout L = {c % 3 == 0 ? -1 : (int64_t)(c % 4) * 16, c % 2 ? 24 : 0, c % 3 ? 40 : 0};
        for (size_t r = 0; r < sizeof kRoutes / sizeof kRoutes[0]; r++) {
            const pkv_plan_options o = options_for(kRoutes[r], p.page_size);
            run_checked(&tc, &o, &L, p.window ? "window, strided" : p.logits_soft_cap > 0 ? "soft cap, strided" : "strided");
            runs++;
        }
        /* the caches one byte past an aligned address: fp8 elements need no more alignment */
        {
            pkv_plan *plan = NULL;
            CHECK_OK(pkv_plan_create(&plan));
            const pkv_plan_options o = options_for(PKV_ROUTE_FUSED, p.page_size);
            CHECK_OK(pkv_plan_step(g_ctx, &tc.problem, &tc.table, &o, plan));
            const size_t kvb = (size_t)tc.kv_elems;
            uint8_t *buf = (uint8_t *)malloc(2 * kvb + 2);
            memcpy(buf + 1, tc.k_cache, kvb);
            memcpy(buf + kvb + 1, tc.v_cache, kvb);
            size_t wsb = pkv_plan_workspace_size(plan);
            void *ws = malloc(wsb ? wsb : 1);
            pkv_test_poison(&tc);
            pkv_tensors t = {.q = tc.q, .k_cache = buf + 1, .v_cache = buf + kvb + 1, .kv_page_indices = tc.kv_page_indices,
                             .o = tc.o, .lse = tc.lse, .k_scale = tc.k_scale, .v_scale = tc.v_scale,
                             .k_head_scales = tc.k_head_scales, .v_head_scales = tc.v_head_scales};
            CHECK_OK(pkv_run(g_ctx, plan, ws, wsb, &t, NULL));
            outputs_ok(&tc, "caches at odd addresses");
            /* determinism: the same plan again, bitwise the same outputs */
            uint16_t *o1 = (uint16_t *)malloc((size_t)tc.q_elems * 2 + 2);
            memcpy(o1, tc.o, (size_t)tc.q_elems * 2);
            pkv_test_poison(&tc);
            CHECK_OK(pkv_run(g_ctx, plan, ws, wsb, &t, NULL));
            CHECK_MSG(memcmp(o1, tc.o, (size_t)tc.q_elems * 2) == 0, "case %d: a second run differs", c);
            free(o1), free(ws), free(buf);
            pkv_plan_free(plan);
        }
        pkv_test_case_free(&tc);
    }
    /* every score of a head the same constant: o is the mean of V, lse = c + ln n, at any scale */
    static const double consts[] = {0.0, 1e3, 1e12, -1e20};
    for (int c = 0; c < 8; c++) {
        pkv_problem p = shape_of(rng, c % 2 ? 128 : 64, c % 2 ? 16 : 1, c % 2 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD,
                                 c < 4 ? PKV_DTYPE_FP8_E4M3 : PKV_DTYPE_FP8_E5M2, PKV_DTYPE_FP16);
        const int32_t lens[3] = {517, 1, 260};
        pkv_test_case tc;
        CHECK(pkv_test_case_build_kv(rng, &p, 3, lens, 0.2, 1, c % 2, &tc));
        pkv_test_constant_scores(&tc, rng, consts[c % 4]);
        CHECK_OK(pkv_test_case_reference(&tc));
        for (size_t r = 0; r < sizeof kRoutes / sizeof kRoutes[0]; r++) {
            const pkv_plan_options o = options_for(kRoutes[r], p.page_size);
            run_checked(&tc, &o, NULL, "constant scores");
            runs++;
        }
        pkv_test_case_free(&tc);
    }
    printf("layouts, windows, caps, constant scores: %d runs\n", runs);
}

/* The planner counts one byte per fp8 element: KV bytes and the cost model's per-token MB are halved. */
static void test_counters(pkv_rng *rng) {
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_pages = 4096;
    int32_t lens[6], indptr[7] = {0};
    for (int i = 0; i < 6; i++) {
        lens[i] = (int32_t)pkv_rng_uniform_int(rng, 0, 3000);
        indptr[i + 1] = indptr[i] + (lens[i] + 15) / 16;
    }
    const pkv_page_table t = {6, indptr, NULL, lens};
    pkv_plan *a = NULL, *b = NULL;
    CHECK_OK(pkv_plan_create(&a));
    CHECK_OK(pkv_plan_create(&b));
    for (int r = 0; r < 6; r++) {
        pkv_plan_options o = options_for(kRoutes[r], p.page_size);
        o.parallelism = 132;
        p.kv_dtype = 0;
        CHECK_OK(pkv_plan_step(g_ctx, &p, &t, &o, a));
        p.kv_dtype = r % 2 ? PKV_DTYPE_FP8_E5M2 : PKV_DTYPE_FP8_E4M3;
        CHECK_OK(pkv_plan_step(g_ctx, &p, &t, &o, b));
        const pkv_counters *ca = pkv_plan_counters(a), *cb = pkv_plan_counters(b);
        CHECK_MSG(cb->kv_bytes * 2 == ca->kv_bytes && ca->kv_bytes > 0, "%s: fp8 KV bytes %lld, fp16 %lld",
                  pkv_route_name(kRoutes[r]), (long long)cb->kv_bytes, (long long)ca->kv_bytes);
        CHECK(cb->qo_bytes == ca->qo_bytes && cb->tasks == ca->tasks && cb->merge_state_bytes == ca->merge_state_bytes);
        CHECK(pkv_plan_workspace_size(a) == pkv_plan_workspace_size(b));
        CHECK_OK(pkv_plan_validate(b, lens));
        double ta[PKV_COST_TERMS], tb[PKV_COST_TERMS];
        CHECK_OK(pkv_cost_terms(a, ta));
        CHECK_OK(pkv_cost_terms(b, tb));
        CHECK_MSG(fabs(tb[PKV_TERM_TOKEN_MB] * 2.0 - ta[PKV_TERM_TOKEN_MB]) < 1e-15 &&
                      fabs(tb[PKV_TERM_LONGEST_MB] * 2.0 - ta[PKV_TERM_LONGEST_MB]) < 1e-12 &&
                      tb[PKV_TERM_MB] < ta[PKV_TERM_MB],
                  "%s: the cost terms of an fp8 plan do not halve the KV MB", pkv_route_name(kRoutes[r]));
    }
    /* with a cost model, auto weighs the fp8 step's bytes (its plan is one of the candidates, planned) */
    pkv_cost_model m;
    pkv_cost_model_default(&m, 132, 4000.0, 3.0);
    pkv_lab_caps caps;
    CHECK_OK(pkv_lab_context_caps(g_ctx, &caps));
    caps.parallelism = 132;
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    CHECK_OK(pkv_lab_plan_step_caps(&caps, &m, &p, &t, &o, b));
    CHECK_OK(pkv_plan_validate(b, lens));
    CHECK(pkv_plan_counters(b)->kv_bytes * 2 == pkv_plan_counters(a)->kv_bytes);
    pkv_plan_free(a);
    pkv_plan_free(b);
}

/* Elements of o and lse NaN exactly where the reference's are; the others within the tolerance.  Returns the
 * NaN elements of o. */
static int64_t check_nan_pattern(const pkv_test_case *tc, const char *label) {
    int64_t nan_o = 0, mism = 0;
    double num = 0.0, den = 0.0, lerr = 0.0;
    for (int64_t e = 0; e < tc->q_elems; e++) {
        const double x = pkv_test_to_float(tc->o[e], tc->problem.dtype), r = tc->o_ref[e];
        if (isnan(r) != isnan(x)) mism++;
        if (isnan(r)) {
            nan_o++;
            continue;
        }
        num += (x - r) * (x - r);
        den += r * r;
    }
    for (int64_t e = 0; e < tc->lse_elems; e++) {
        const double x = tc->lse[e], r = tc->lse_ref[e];
        if (isnan(r) != isnan(x)) mism++;
        else if (isfinite(r)) lerr = fmax(lerr, fabs(x - r) / fmax(1.0, fabs(r)));
    }
    const double tol = tc->problem.dtype == PKV_DTYPE_BF16 ? PKV_TEST_TOL_O_BF16 : PKV_TEST_TOL_O_FP16;
    CHECK_MSG(mism == 0, "%s: %lld elements NaN on one side only", label, (long long)mism);
    CHECK_MSG(sqrt(num / fmax(den, 1e-300)) < tol && lerr < PKV_TEST_TOL_LSE, "%s: the other outputs off", label);
    return nan_o;
}

/* A NaN code in one attended token: o NaN for every query head of its KV head in its row (lse too for K), the
 * rest exact, on every route. */
static void test_nan(pkv_rng *rng) {
    for (int c = 0; c < 8; c++) {
        pkv_problem p = shape_of(rng, 64, c % 2 ? 16 : 3, c % 2 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD,
                                 c < 4 ? PKV_DTYPE_FP8_E4M3 : PKV_DTYPE_FP8_E5M2, PKV_DTYPE_FP16);
        p.num_kv_heads = 2;
        p.num_qo_heads = 8;
        const int32_t lens[3] = {150, 300, 77};
        pkv_test_case tc;
        CHECK(pkv_test_case_build_kv(rng, &p, 3, lens, 0.2, 1, c % 2, &tc));
        const int in_v = c % 4 >= 2;
        const int64_t at = pkv_test_kv_at(&tc, 1, 211, 1) + 5; /* row 1, token 211, KV head 1, element 5 */
        ((uint8_t *)(in_v ? tc.v_cache : tc.k_cache))[at] = c % 2 ? 0xff : PKV_TEST_NAN_FP8;
        CHECK_OK(pkv_test_case_reference(&tc));
        for (size_t r = 0; r < sizeof kRoutes / sizeof kRoutes[0]; r++) {
            const pkv_plan_options o = options_for(kRoutes[r], p.page_size);
            pkv_plan *plan = NULL;
            CHECK_OK(pkv_plan_create(&plan));
            CHECK_OK(pkv_plan_step(g_ctx, &tc.problem, &tc.table, &o, plan));
            pkv_test_poison(&tc);
            CHECK_OK(pkv_test_run(g_ctx, plan, &tc));
            char label[96];
            snprintf(label, sizeof label, "NaN in %s, %s", in_v ? "V" : "K", pkv_route_name(kRoutes[r]));
            const int64_t nan_o = check_nan_pattern(&tc, label);
            /* K: every element of the 4 query heads of KV head 1 in row 1; V: element 5 of each */
            CHECK_MSG(nan_o == (in_v ? 4 : 4 * 64), "%s: %lld NaN outputs", label, (long long)nan_o);
            const float *lse = tc.lse + 8 + 4; /* row 1, query heads 4..7 */
            CHECK_MSG(in_v ? isfinite(lse[0]) && isfinite(lse[3]) : isnan(lse[0]) && isnan(lse[3]), "%s: lse", label);
            pkv_plan_free(plan);
        }
        pkv_test_case_free(&tc);
    }
}

/* ---- append and copy -------------------------------------------------------------------------------- */
static uint8_t fp8_max_code(pkv_dtype kv) { return kv == PKV_DTYPE_FP8_E5M2 ? 0x7b : 0x7e; }

/* The expected code of a new value: float(value) / scale, to the nearest fp8 (saturating, NaN kept). */
static uint8_t expected_code(uint16_t bits, pkv_dtype dtype, pkv_dtype kv, float scale) {
    const float f = dtype == PKV_DTYPE_BF16 ? pkv_bf16_to_float(bits) : pkv_half_to_float(bits);
    return pkv_float_to_fp8(f / scale, kv == PKV_DTYPE_FP8_E5M2);
}

/* Appends tokens of random values with out-of-range ones, infinities and NaNs mixed in, reads every slot
 * back, then decodes the grown cache against the reference. */
static void test_append(pkv_rng *rng) {
    int slots = 0, saturated = 0;
    for (int c = 0; c < 16; c++) {
        const pkv_dtype kv = c % 2 ? PKV_DTYPE_FP8_E5M2 : PKV_DTYPE_FP8_E4M3;
        const pkv_dtype dt = (c / 2) % 2 ? PKV_DTYPE_BF16 : PKV_DTYPE_FP16;
        const int heads = (c / 4) % 2, flashinfer = (c / 8) % 2;
        pkv_problem p = shape_of(rng, c % 3 == 0 ? 128 : 64, c % 3 == 0 ? 16 : c % 3 == 1 ? 1 : 5,
                                 (c / 2) % 2 ? PKV_LAYOUT_HND : PKV_LAYOUT_NHD, kv, dt);
        const int32_t B = 3, hkv = p.num_kv_heads, d = p.head_dim;
        int32_t lens[3];
        for (int i = 0; i < B; i++) lens[i] = (int32_t)pkv_rng_uniform_int(rng, 1, 90);
        pkv_test_case tc; /* the pool, its table and scales; its data is replaced below */
        CHECK(pkv_test_case_build_kv(rng, &p, B, lens, 0.3, 1, heads, &tc));
        /* every token of every row appended (the ragged form, or FlashInfer's), values in [-1, 1] times a
         * factor that sends some beyond the format's range, and specials */
        const int32_t n = lens[0] + lens[1] + lens[2];
        const int64_t te = (int64_t)hkv * d;
        uint16_t *k = (uint16_t *)malloc((size_t)(n * te) * 2), *v = (uint16_t *)malloc((size_t)(n * te) * 2);
        int32_t aptr[4] = {0, lens[0], lens[0] + lens[1], n}, *bidx = malloc((size_t)n * 4), *pos = malloc((size_t)n * 4);
        const float big = kv == PKV_DTYPE_FP8_E5M2 ? 60000.0f : 500.0f;
        for (int32_t tok = 0; tok < n; tok++)
            for (int64_t e = 0; e < te; e++) {
                const int h = (int)(e / d);
                const float ks = pkv_test_kv_scale(&tc, h, 0), vs = pkv_test_kv_scale(&tc, h, 1);
                const double u = pkv_rng_uniform01(rng);
                float kf = (float)(2.0 * pkv_rng_uniform01(rng) - 1.0), vf = (float)(2.0 * pkv_rng_uniform01(rng) - 1.0);
                if (u < 0.05) kf *= big * ks, vf *= big * vs;  /* beyond the range after the division */
                k[tok * te + e] = pkv_test_from_float(kf, dt);
                v[tok * te + e] = pkv_test_from_float(vf, dt);
                if (u > 0.995) k[tok * te + e] = dt == PKV_DTYPE_BF16 ? 0xff80 : 0xfc00; /* -inf */
                if (u > 0.99 && u <= 0.995) v[tok * te + e] = pkv_test_nan_bits(dt);
            }
        for (int32_t i = 0, tok = 0; i < B; i++)
            for (int32_t t = 0; t < lens[i]; t++, tok++) bidx[tok] = i, pos[tok] = t;
        pkv_append_tensors a = {0};
        a.k = k, a.v = v, a.k_cache = tc.k_cache, a.v_cache = tc.v_cache;
        a.kv_indptr = tc.kv_indptr, a.kv_page_indices = tc.kv_page_indices, a.seq_lens = tc.seq_lens;
        a.k_scale = tc.k_scale, a.v_scale = tc.v_scale, a.k_head_scales = tc.k_head_scales, a.v_head_scales = tc.v_head_scales;
        if (flashinfer) a.batch_indices = bidx, a.positions = pos;
        else a.append_indptr = aptr;
        CHECK_OK(pkv_append_kv(g_ctx, &tc.problem, B, n, &a, NULL));
        int64_t bad = 0;
        const uint8_t *kc = (const uint8_t *)tc.k_cache, *vc = (const uint8_t *)tc.v_cache;
        for (int32_t tok = 0; tok < n; tok++)
            for (int32_t h = 0; h < hkv; h++) {
                const int64_t at = pkv_test_kv_at(&tc, bidx[tok], pos[tok], h);
                for (int32_t e = 0; e < d; e++) {
                    const uint16_t kb = k[tok * te + h * d + e], vb = v[tok * te + h * d + e];
                    const uint8_t ke = expected_code(kb, dt, kv, pkv_test_kv_scale(&tc, h, 0));
                    const uint8_t ve = expected_code(vb, dt, kv, pkv_test_kv_scale(&tc, h, 1));
                    bad += kc[at + e] != ke || vc[at + e] != ve;
                    /* saturation: the largest finite of the sign, read back exactly as it */
                    const float kq = pkv_test_to_float(kb, dt) / pkv_test_kv_scale(&tc, h, 0);
                    if (fabsf(kq) >= (kv == PKV_DTYPE_FP8_E5M2 ? 57344.0f : 448.0f) && !isnan(kq)) {
                        saturated++;
                        bad += (kc[at + e] & 0x7f) != fp8_max_code(kv) || (kc[at + e] >> 7) != (kq < 0.0f);
                        bad += fabsf(pkv_fp8_to_float(kc[at + e], kv == PKV_DTYPE_FP8_E5M2)) !=
                               (kv == PKV_DTYPE_FP8_E5M2 ? 57344.0f : 448.0f);
                    }
                    if (isnan(pkv_test_to_float(vb, dt)))
                        bad += !isnan(pkv_fp8_to_float(vc[at + e], kv == PKV_DTYPE_FP8_E5M2));
                    slots++;
                }
            }
        CHECK_MSG(bad == 0, "append case %d (%s, %s q, %s scales, %s form): %lld slots differ", c,
                  kv == PKV_DTYPE_FP8_E5M2 ? "e5m2" : "e4m3", dt == PKV_DTYPE_BF16 ? "bf16" : "fp16",
                  heads ? "per-head" : "per-tensor", flashinfer ? "FlashInfer" : "ragged", (long long)bad);
        /* decode over the appended cache, with the NaNs and infinities taken out again (finite data) */
        for (int32_t tok = 0; tok < n; tok++)
            for (int32_t h = 0; h < hkv; h++) {
                const int64_t at = pkv_test_kv_at(&tc, bidx[tok], pos[tok], h);
                for (int32_t e = 0; e < d; e++) {
                    uint8_t *kb = (uint8_t *)tc.k_cache + at + e, *vb = (uint8_t *)tc.v_cache + at + e;
                    if (isnan(pkv_fp8_to_float(*kb, kv == PKV_DTYPE_FP8_E5M2)) || (*kb & 0x7f) == fp8_max_code(kv))
                        *kb = 0x21;
                    if (isnan(pkv_fp8_to_float(*vb, kv == PKV_DTYPE_FP8_E5M2))) *vb = 0x22;
                }
            }
        CHECK_OK(pkv_test_case_reference(&tc));
        const pkv_plan_options o = options_for(PKV_ROUTE_WORKQUEUE, p.page_size);
        run_checked(&tc, &o, NULL, "decode after append");
        /* a copy of whole one-byte pages, into a dense pool and into an interleaved one */
        const int32_t src = tc.kv_page_indices[0];
        int32_t dst = -1;
        for (int32_t pg = 0; pg < tc.problem.num_pages && dst < 0; pg++) {
            bool used = false;
            for (int32_t j = 0; j < tc.kv_indptr[B]; j++) used |= tc.kv_page_indices[j] == pg;
            if (!used) dst = pg;
        }
        const int64_t page = (int64_t)p.page_size * te;
        if (dst >= 0) {
            const pkv_page_copy cp = {src, dst};
            CHECK_OK(pkv_copy_pages(g_ctx, &tc.problem, &cp, 1, tc.k_cache, tc.v_cache, 0, NULL));
            CHECK(memcmp(kc + dst * page, kc + src * page, (size_t)page) == 0 &&
                  memcmp(vc + dst * page, vc + src * page, (size_t)page) == 0);
            int64_t stride = 0;
            uint8_t *il = (uint8_t *)pkv_test_interleave(&tc, 32, &stride);
            CHECK(stride == 2 * page + 32);
            CHECK_OK(pkv_copy_pages(g_ctx, &tc.problem, &cp, 1, il, il + page, stride, NULL));
            CHECK(memcmp(il + dst * stride, kc + src * page, (size_t)page) == 0 &&
                  memcmp(il + dst * stride + page, vc + src * page, (size_t)page) == 0 &&
                  il[dst * stride + 2 * page] == PKV_TEST_NAN_FP8); /* the padding untouched */
            free(il);
        }
        free(k), free(v), free(bidx), free(pos);
        pkv_test_case_free(&tc);
    }
    CHECK(saturated > 0);
    printf("append: %d slots read back (%d saturated)\n", slots, saturated);
}

/* ---- bad inputs ---------------------------------------------------------------------------------------- */
static void test_errors(void) {
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_qo_heads = 4, p.num_kv_heads = 2, p.head_dim = 64, p.page_size = 4, p.num_pages = 4;
    int32_t indptr[2] = {0, 2}, indices[2] = {1, 3}, lens[1] = {6};
    const pkv_page_table t = {1, indptr, indices, lens};
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    size_t ws_bytes = 0;
    /* problems: every entry point refuses them alike */
    pkv_problem bad = p;
    bad.kv_dtype = PKV_DTYPE_FP8_E4M3, bad.dtype = PKV_DTYPE_FP32;
    CHECK_FAILS(pkv_plan_step(g_ctx, &bad, &t, NULL, plan), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_check_page_table(&bad, &t), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_workspace_size(g_ctx, &bad, 4, NULL, &ws_bytes), PKV_ERR_INVALID_ARGUMENT);
    pkv_plan_options ho;
    pkv_plan_options_default(&ho);
    ho.parallelism = 4;
    CHECK_FAILS(pkv_plan_step_host(&bad, &t, &ho, plan), PKV_ERR_INVALID_ARGUMENT);
    bad = p, bad.dtype = PKV_DTYPE_FP8_E5M2;
    CHECK_FAILS(pkv_plan_step(g_ctx, &bad, &t, NULL, plan), PKV_ERR_INVALID_ARGUMENT);
    bad = p, bad.kv_dtype = PKV_DTYPE_FP32;
    CHECK_FAILS(pkv_plan_step(g_ctx, &bad, &t, NULL, plan), PKV_ERR_UNSUPPORTED_DTYPE);
    bad.kv_dtype = (pkv_dtype)99;
    CHECK_FAILS(pkv_plan_step(g_ctx, &bad, &t, NULL, plan), PKV_ERR_UNSUPPORTED_DTYPE);
    bad.kv_dtype = PKV_DTYPE_BF16; /* bf16 caches beside fp16 q */
    CHECK_FAILS(pkv_plan_step(g_ctx, &bad, &t, NULL, plan), PKV_ERR_UNSUPPORTED_DTYPE);
    bad.dtype = PKV_DTYPE_BF16; /* kv_dtype = dtype: caches of dtype */
    CHECK_OK(pkv_plan_step(g_ctx, &bad, &t, NULL, plan));
    CHECK_OK(pkv_check_page_table(&bad, &t));
    bad.kv_dtype = PKV_DTYPE_FP16; /* 0: of dtype, bf16 here */
    CHECK_OK(pkv_plan_step(g_ctx, &bad, &t, NULL, plan));

    /* run: scales */
    uint16_t q[4 * 64], o[4 * 64];
    float lse[4];
    uint8_t kc[4 * 4 * 2 * 64], vc[4 * 4 * 2 * 64];
    for (int e = 0; e < 4 * 64; e++) q[e] = 0x3c00;
    memset(kc, 0x30, sizeof kc), memset(vc, 0x31, sizeof vc);
    p.kv_dtype = PKV_DTYPE_FP8_E4M3;
    CHECK_OK(pkv_plan_step(g_ctx, &p, &t, NULL, plan));
    CHECK_OK(pkv_check_page_table(&p, &t));
    CHECK_OK(pkv_workspace_size(g_ctx, &p, 4, NULL, &ws_bytes));
    const size_t wsb = pkv_plan_workspace_size(plan);
    CHECK(wsb <= ws_bytes);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    float heads[2] = {0.5f, 0.25f}, bad_heads[2] = {0.5f, NAN};
    pkv_tensors x = {.q = q, .k_cache = kc, .v_cache = vc, .kv_page_indices = indices, .o = o, .lse = lse};
    CHECK_OK(pkv_run(g_ctx, plan, ws, wsb, &x, NULL));
    const float bad_scales[] = {NAN, INFINITY, -INFINITY, -1.0f, -1e-30f};
    for (int i = 0; i < 5; i++) {
        x.k_scale = bad_scales[i];
        CHECK_FAILS(pkv_run(g_ctx, plan, ws, wsb, &x, NULL), PKV_ERR_INVALID_ARGUMENT);
        x.k_scale = 0.0f, x.v_scale = bad_scales[i];
        CHECK_FAILS(pkv_run(g_ctx, plan, ws, wsb, &x, NULL), PKV_ERR_INVALID_ARGUMENT);
        x.v_scale = 0.0f;
    }
    x.k_head_scales = heads;
    CHECK_OK(pkv_run(g_ctx, plan, ws, wsb, &x, NULL));
    x.k_scale = 1.0f; /* 1 beside per-head scales: accepted */
    CHECK_OK(pkv_run(g_ctx, plan, ws, wsb, &x, NULL));
    x.k_scale = 2.0f; /* two sources of one scale */
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, wsb, &x, NULL), PKV_ERR_INVALID_ARGUMENT);
    x.k_scale = 0.0f;
    x.v_head_scales = bad_heads;
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, wsb, &x, NULL), PKV_ERR_INVALID_ARGUMENT);
    bad_heads[1] = 0.0f;
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, wsb, &x, NULL), PKV_ERR_INVALID_ARGUMENT);
    bad_heads[1] = -2.0f;
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, wsb, &x, NULL), PKV_ERR_INVALID_ARGUMENT);
    bad_heads[1] = INFINITY;
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, wsb, &x, NULL), PKV_ERR_INVALID_ARGUMENT);
    x.v_head_scales = (const float *)(const void *)((const char *)heads + 1);
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, wsb, &x, NULL), PKV_ERR_INVALID_ARGUMENT);
    x.v_head_scales = heads;
    CHECK_OK(pkv_run(g_ctx, plan, ws, wsb, &x, NULL));
    /* a cache of dtype takes no scales */
    pkv_problem f16 = p;
    f16.kv_dtype = 0;
    CHECK_OK(pkv_plan_step(g_ctx, &f16, &t, NULL, plan));
    uint16_t kc16[4 * 4 * 2 * 64], vc16[4 * 4 * 2 * 64];
    for (size_t e = 0; e < sizeof kc16 / 2; e++) kc16[e] = vc16[e] = 0x3800;
    pkv_tensors y = {.q = q, .k_cache = kc16, .v_cache = vc16, .kv_page_indices = indices, .o = o, .lse = lse};
    y.k_scale = 1.0f, y.v_scale = 0.0f;
    CHECK_OK(pkv_run(g_ctx, plan, ws, pkv_plan_workspace_size(plan), &y, NULL));
    y.k_scale = 0.5f;
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, pkv_plan_workspace_size(plan), &y, NULL), PKV_ERR_INVALID_ARGUMENT);
    y.k_scale = 0.0f, y.v_head_scales = heads;
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, pkv_plan_workspace_size(plan), &y, NULL), PKV_ERR_INVALID_ARGUMENT);
    y.v_head_scales = NULL, y.k_cache = (const char *)kc16 + 1; /* 2-byte elements keep their alignment */
    CHECK_FAILS(pkv_run(g_ctx, plan, ws, pkv_plan_workspace_size(plan), &y, NULL), PKV_ERR_INVALID_ARGUMENT);

    /* append: the same scale rules; nothing written when refused */
    uint16_t k[2 * 64], v[2 * 64];
    for (int e = 0; e < 2 * 64; e++) k[e] = v[e] = 0x3c00;
    pkv_append_tensors a = {0};
    a.k = k, a.v = v, a.k_cache = kc, a.v_cache = vc, a.kv_indptr = indptr, a.kv_page_indices = indices, a.seq_lens = lens;
    uint8_t before[sizeof kc];
    memcpy(before, kc, sizeof kc);
    for (int i = 0; i < 5; i++) {
        a.v_scale = bad_scales[i];
        CHECK_FAILS(pkv_append_kv(g_ctx, &p, 1, 1, &a, NULL), PKV_ERR_INVALID_ARGUMENT);
    }
    a.v_scale = 0.0f;
    a.k_head_scales = bad_heads;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 1, 1, &a, NULL), PKV_ERR_INVALID_ARGUMENT);
    a.k_head_scales = heads, a.k_scale = 3.0f;
    CHECK_FAILS(pkv_append_kv(g_ctx, &p, 1, 1, &a, NULL), PKV_ERR_INVALID_ARGUMENT);
    CHECK_MSG(memcmp(before, kc, sizeof kc) == 0, "a refused append wrote into the cache");
    a.k_scale = 0.0f;
    CHECK_OK(pkv_append_kv(g_ctx, &p, 1, 1, &a, NULL));
    /* token 5 = page 3, slot 1; KV head 1's 1.0 / 0.25 = 4.0, e4m3 0x48 */
    CHECK(kc[3 * 512 + 1 * 128 + 64] == 0x48 && kc[3 * 512 + 1 * 128] == pkv_float_to_fp8(2.0f, 0));
    a.k_head_scales = NULL, a.k_scale = 0.5f;
    CHECK_FAILS(pkv_append_kv(g_ctx, &f16, 1, 1, &a, NULL), PKV_ERR_INVALID_ARGUMENT); /* scales on fp16 */
    bad = p, bad.dtype = PKV_DTYPE_FP32;
    CHECK_FAILS(pkv_append_kv(g_ctx, &bad, 1, 1, &a, NULL), PKV_ERR_INVALID_ARGUMENT);
    /* copies of fp8 pages: one-byte alignment, and the problem checked */
    const pkv_page_copy cp = {1, 0};
    CHECK_OK(pkv_copy_pages(g_ctx, &p, &cp, 1, kc + 0, vc + 0, 0, NULL));
    CHECK(memcmp(kc, kc + 512, 512) == 0);
    CHECK_FAILS(pkv_copy_pages(g_ctx, &bad, &cp, 1, kc, vc, 0, NULL), PKV_ERR_INVALID_ARGUMENT);
    CHECK_FAILS(pkv_copy_pages(g_ctx, &p, &cp, 1, kc, vc, 511, NULL), PKV_ERR_INVALID_ARGUMENT);
    /* the reference refuses scales on a cache of dtype */
    double oref[4 * 64], lref[4];
    CHECK_STATUS(pkv_reference_kv(&f16, &t, q, kc16, vc16, 0.5f, 0.0f, NULL, NULL, oref, lref), PKV_ERR_INVALID_ARGUMENT);
    free(ws);
    pkv_plan_free(plan);
}

int main(void) {
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 2;
    CHECK_OK(pkv_context_create(&cfg, &g_ctx));
    if (!g_ctx) return pkv_test_finish("test_kv_fp8");
    pkv_rng rng;
    pkv_rng_seed(&rng, 20260638);
    test_errors();
    test_counters(&rng);
    test_sweep(&rng);
    test_layouts(&rng);
    test_nan(&rng);
    test_append(&rng);
    printf("decode runs checked: %d; worst relative L2 of o: fp16 %.3g, bf16 %.3g\n", g_runs, g_worst[0], g_worst[1]);
    pkv_context_free(g_ctx);
    return pkv_test_finish("test_kv_fp8");
}
