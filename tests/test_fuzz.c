/* test_fuzz.c - the public API under random, often wrong, input (CPU backend, fixed seeds).
 *
 * Each case draws a problem (every head dim, G 1..16, pages 1..64, windows, soft caps, both dtypes, fp8 caches
 * (e4m3, e5m2: random per-tensor or per-KV-head scales when run) and both layouts), a batch of up to 12 rows with a scattered pool, and plan options (every route, forced
 * splits, chunks, waves and parallelism, graph-stable capacities, often absurd); one case in four then breaks one thing
 * (a shape field, a length, an indptr entry, a page id, the pool size, the batch size) to an edge value: -1, 0,
 * INT32_MIN, INT32_MAX or a small number.  What must hold: pkv_plan_step never crashes and either fails with a status
 * and a message or returns a plan that pkv_plan_validate accepts and that honours the counters' invariants; one plan in
 * four runs on the CPU backend and matches the float64 reference (a third of those with K and V interleaved per page in
 * one buffer; a bad page stride is refused first).  Arrays are always as large as the table they belong to says
 * (kv_indptr is the length of kv_page_indices by contract); everything else may lie.  A sanitizer build
 * (-DPKV_SANITIZE=ON) turns any out-of-bounds access or undefined behaviour into a failure; this test found an int
 * overflow in the chunk of an empty row under a huge min_chunk_tokens (UBSan). PKV_FUZZ_CASES=N sets the number of
 * cases (default 4000, 1000 with PKV_TEST_SANITIZE=1).  Its coverage-guided sibling is fuzz/fuzz_plan.c. */
#include "persistentkv.h"
#include "pkv_test.h"
#include "pkv_lab.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_B 12
#define MAX_IDS 4096

static pkv_rng rng;
static int64_t ri(int64_t lo, int64_t hi) { return pkv_rng_uniform_int(&rng, lo, hi); }
static int one_in(int n) { return ri(0, n - 1) == 0; }
static int32_t edge(void) {
    switch (ri(0, 7)) {
    case 0: return -1;
    case 1: return 0;
    case 2: return INT32_MAX;
    case 3: return INT32_MIN;
    case 4: return (int32_t)ri(-5, 5);
    default: return (int32_t)ri(0, 3000);
    }
}

int main(void) {
    /* PKV_FUZZ_CASES=N, else 4000 (1000 under the sanitizers: PKV_TEST_SANITIZE=1, scripts/sanitize.sh) */
    const char *env = getenv("PKV_FUZZ_CASES"), *san = getenv("PKV_TEST_SANITIZE");
    const int cases = env ? atoi(env) : san && atoi(san) > 0 ? 1000 : 4000;
    pkv_rng_seed(&rng, 20261201);
    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = PKV_BACKEND_CPU;
    cc.num_threads = 2;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cc, &ctx));
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    if (!ctx || !plan) return 1;
    int planned = 0, refused = 0, ran = 0, graph_planned = 0;
    int32_t lens[MAX_B], indptr[MAX_B + 1], ids[MAX_IDS];
    for (int c = 0; c < cases; c++) {
        pkv_problem p;
        pkv_problem_default(&p);
        p.num_kv_heads = (int32_t)ri(1, 4);
        p.num_qo_heads = p.num_kv_heads * (int32_t)ri(1, 16);
        p.head_dim = (int32_t[]){64, 128, 256}[ri(0, 2)];
        p.page_size = (int32_t)ri(1, 64);
        p.window = one_in(3) ? (int32_t)ri(1, 500) : 0;
        p.logits_soft_cap = one_in(3) ? (float)ri(1, 60) : 0.0f;
        p.dtype = one_in(2) ? PKV_DTYPE_FP16 : PKV_DTYPE_BF16;
        p.kv_dtype = one_in(3) ? (one_in(2) ? PKV_DTYPE_FP8_E4M3 : PKV_DTYPE_FP8_E5M2) : (pkv_dtype)0;
        p.layout = one_in(2) ? PKV_LAYOUT_NHD : PKV_LAYOUT_HND;
        int64_t pool = ri(1, 300);
        const int32_t B = (int32_t)ri(0, MAX_B);
        for (int32_t k = 0; k < MAX_IDS; k++) ids[k] = (int32_t)ri(0, pool - 1); /* the whole array is ids */
        int32_t total = 0;
        indptr[0] = 0;
        for (int32_t i = 0; i < B; i++) {
            lens[i] = (int32_t)ri(0, 600);
            int32_t need = (lens[i] + p.page_size - 1) / p.page_size + (int32_t)ri(0, 2);
            if (total + need > MAX_IDS) need = 0, lens[i] = 0;
            for (int32_t k = 0; k < need; k++) ids[total + k] = (int32_t)ri(0, pool - 1);
            total += need;
            indptr[i + 1] = total;
        }
        pkv_page_table t = {B, indptr, ids, lens};
        pkv_plan_options o;
        pkv_plan_options_default(&o);
        o.route = (pkv_route)ri(0, PKV_ROUTE_COUNT_ - 1);
        if (one_in(3)) o.parallelism = one_in(2) ? 132 : edge();
        if (one_in(4)) o.num_splits = edge();
        if (one_in(4)) o.chunk_pages = edge();
        if (one_in(4)) o.min_chunk_tokens = edge();
        if (one_in(4)) o.max_splits = edge();
        if (one_in(4)) o.ctas_per_unit = edge();
        if (one_in(4)) o.graph_max_batch = one_in(2) ? edge() : (int32_t)ri(0, MAX_B + 2); /* graph-stable */
        if (one_in(6)) o.graph_tasks = edge();
        const bool broken = one_in(4);
        if (broken) {
            const int32_t i = B > 0 ? (int32_t)ri(0, B - 1) : 0;
            switch (ri(0, 13)) {
            case 0: p.num_kv_heads = edge(); break;
            case 1: p.num_qo_heads = edge(); break;
            case 2: p.head_dim = edge(); break;
            case 3: p.page_size = edge(); break; /* the pages of the table no longer fit, or overflow */
            case 4: p.window = edge(); break;
            case 5: p.logits_soft_cap = (float)edge() * (one_in(2) ? 1e30f : 1.0f); break;
            case 6: p.sm_scale = (float)edge() * 1e29f; break;
            case 7:
                if (one_in(2)) p.kv_dtype = (pkv_dtype)edge();
                else p.dtype = (pkv_dtype)edge();
                break;
            case 8: p.layout = (pkv_layout)edge(); break;
            case 9: if (B > 0) lens[i] = edge(); break;
            case 10: if (B > 0) indptr[i + 1] = (int32_t)ri(0, MAX_IDS); break; /* within the array */
            case 11: if (total > 0) ids[ri(0, total - 1)] = edge(); break;
            case 12: pool = edge(); break;
            default: /* a batch larger than the arrays only where the library refuses it by size */
                t.batch_size = (int32_t[]){-1, INT32_MIN, INT32_MAX, (1 << 20) + 1, 0}[ri(0, 4)];
                if (one_in(2)) t.batch_size = (int32_t)ri(0, B);
                break;
            }
        }
        p.num_pages = pool;
        const pkv_status st = pkv_plan_step(ctx, &p, &t, &o, plan);
        if (st != PKV_OK) {
            refused++;
            CHECK_MSG(pkv_last_error()[0] != '\0', "case %d: status %d without a message", c, (int)st);
            continue;
        }
        planned++;
        graph_planned += pkv_plan_graph_signature(plan) != 0;
        const char *why = NULL;
        CHECK_MSG(pkv_test_validate(plan, lens, &why) == PKV_OK, "case %d (%s): invalid plan: %s", c,
                  pkv_route_name(pkv_plan_route(plan)), why);
        const pkv_counters *cn = pkv_plan_counters(plan);
        int64_t attended = 0;
        for (int32_t i = 0; i < t.batch_size; i++)
            attended += lens[i] - (p.window > 0 && lens[i] > p.window ? lens[i] - p.window : 0);
        CHECK_MSG(cn->total_tokens == attended && cn->tasks == pkv_plan_num_tasks(plan) && cn->launches >= 0 &&
                      cn->kv_bytes == attended * p.num_kv_heads * p.head_dim * 2 * (int64_t)pkv_test_kv_size(&p),
                  "case %d: counters (tokens %lld of %lld, kv bytes %lld)", c, (long long)cn->total_tokens,
                  (long long)attended, (long long)cn->kv_bytes);
        if (!one_in(4)) continue;
        /* run it on the CPU and compare with the float64 reference: a test case (test_util.h) over this
         * step's table, with its own data and outputs */
        const size_t d = (size_t)p.head_dim, rows = (size_t)(t.batch_size > 0 ? t.batch_size : 1) * p.num_qo_heads;
        const size_t pool_elems = (size_t)p.num_pages * (size_t)p.page_size * (size_t)p.num_kv_heads * d;
        if (pool_elems > ((size_t)48 << 20)) continue;
        if (pkv_plan_workspace_size(plan) > ((size_t)512 << 20))
            continue; /* a graph-stable grid for thousands of rows */
        pkv_test_case tc = {.problem = p, .table = t, .batch_size = t.batch_size};
        tc.q_elems = (int64_t)(rows * d), tc.kv_elems = (int64_t)pool_elems, tc.lse_elems = (int64_t)rows;
        const size_t es = pkv_test_kv_size(&p); /* bytes of a cache element */
        tc.q = malloc(rows * d * 2), tc.k_cache = malloc(pool_elems * es + 1), tc.v_cache = malloc(pool_elems * es + 1);
        tc.o = malloc(rows * d * 2), tc.lse = malloc(rows * sizeof(float));
        tc.o_ref = malloc(rows * d * sizeof(double)), tc.lse_ref = malloc(rows * sizeof(double));
        const size_t ws_bytes = pkv_plan_workspace_size(plan);
        void *ws = malloc(ws_bytes ? ws_bytes : 1);
        if (!tc.q || !tc.k_cache || !tc.v_cache || !tc.o || !tc.lse || !tc.o_ref || !tc.lse_ref || !ws) return 1;
        for (size_t z = 0; z < rows * d; z++) tc.q[z] = pkv_test_random_value(&rng, p.dtype);
        float heads[2][4];
        if (es == 2) {
            for (size_t z = 0; z < pool_elems; z++)
                tc.k_cache[z] = pkv_test_random_value(&rng, p.dtype), tc.v_cache[z] = pkv_test_random_value(&rng, p.dtype);
        } else { /* fp8 codes up to 2 in magnitude, random signs; scales per tensor (0: 1.0) or per KV head */
            uint8_t *k8 = (uint8_t *)tc.k_cache, *v8 = (uint8_t *)tc.v_cache;
            for (size_t z = 0; z < pool_elems; z++)
                k8[z] = (uint8_t)(ri(0, 0x40) | (ri(0, 1) << 7)), v8[z] = (uint8_t)(ri(0, 0x40) | (ri(0, 1) << 7));
            if (one_in(2) && p.num_kv_heads <= 4) {
                for (int32_t h = 0; h < p.num_kv_heads; h++)
                    heads[0][h] = (float)ri(1, 1000) / 997.0f, heads[1][h] = (float)ri(1, 1000) / 997.0f;
                tc.k_head_scales = heads[0], tc.v_head_scales = heads[1];
            } else {
                tc.k_scale = one_in(3) ? 0.0f : (float)ri(1, 1000) / 997.0f;
                tc.v_scale = one_in(3) ? 0.0f : (float)ri(1, 1000) / 997.0f;
            }
        }
        pkv_test_poison(&tc);
        pkv_tensors x = {.q = tc.q, .k_cache = tc.k_cache, .v_cache = tc.v_cache, .kv_page_indices = ids, .o = tc.o,
                         .lse = tc.lse, .k_scale = tc.k_scale, .v_scale = tc.v_scale, .k_head_scales = tc.k_head_scales,
                         .v_head_scales = tc.v_head_scales};
        /* a page stride that is neither 0 nor at least one page is refused */
        const size_t dense = (size_t)p.page_size * (size_t)p.num_kv_heads * d;
        x.kv_page_stride = one_in(2) ? -1 - ri(0, 5) : (int64_t)ri(1, (int64_t)dense - 1);
        CHECK_MSG(pkv_run(ctx, plan, ws, ws_bytes, &x, NULL) == PKV_ERR_INVALID_ARGUMENT,
                  "case %d: page stride %lld ran", c, (long long)x.kv_page_stride);
        x.kv_page_stride = 0;
        /* and so is a row stride of q or o below one row (the rows would overlap) */
        const int64_t row = (int64_t)p.num_qo_heads * p.head_dim, bad_row = one_in(2) ? -1 - ri(0, 5) : ri(1, row - 1);
        *(one_in(2) ? &x.q_row_stride : &x.o_row_stride) = bad_row;
        CHECK_MSG(pkv_run(ctx, plan, ws, ws_bytes, &x, NULL) == PKV_ERR_INVALID_ARGUMENT,
                  "case %d: row stride %lld ran", c, (long long)bad_row);
        x.q_row_stride = x.o_row_stride = 0;
        /* one run in three reads K and V interleaved per page in one buffer ([pages, 2, page]) */
        char *kv = NULL;
        if (one_in(3) && (kv = malloc(pool_elems * 2 * es)) != NULL) {
            for (int64_t pg = 0; pg < p.num_pages; pg++) {
                memcpy(kv + (size_t)pg * 2 * dense * es, (const char *)tc.k_cache + (size_t)pg * dense * es, dense * es);
                memcpy(kv + ((size_t)pg * 2 + 1) * dense * es, (const char *)tc.v_cache + (size_t)pg * dense * es,
                       dense * es);
            }
            x.k_cache = kv, x.v_cache = kv + dense * es, x.kv_page_stride = (int64_t)(2 * dense);
        }
        const pkv_status rs = pkv_run(ctx, plan, ws, ws_bytes, &x, NULL);
        CHECK_MSG(rs == PKV_OK, "case %d: run failed: %s", c, pkv_last_error());
        free(kv);
        CHECK_OK(pkv_test_case_reference(&tc));
        /* compared where float32 scores are well conditioned (an sm_scale of 1e29 makes the softmax
         * one-hot on differences below float precision) and there are rows */
        if (rs == PKV_OK && t.batch_size > 0 && p.sm_scale <= 1.0f) {
            ran++;
            const double rel = pkv_test_rel_l2(&tc), lerr = pkv_test_lse_err(&tc);
            const double tol = p.dtype == PKV_DTYPE_BF16 ? PKV_TEST_TOL_O_BF16 : PKV_TEST_TOL_O_FP16;
            CHECK_MSG(
                pkv_test_unwritten(&tc) == 0 && rel < tol && lerr < PKV_TEST_TOL_LSE,
                "case %d (%s, B %d, d %d, G %d, page %d, window %d, cap %g, scale %g): rel L2 %.3g, lse error %.3g, "
                "%lld unwritten",
                c, pkv_route_name(pkv_plan_route(plan)), t.batch_size, p.head_dim, p.num_qo_heads / p.num_kv_heads,
                p.page_size, p.window, (double)p.logits_soft_cap, (double)p.sm_scale, rel, lerr,
                (long long)pkv_test_unwritten(&tc));
        }
        free(tc.q), free(tc.k_cache), free(tc.v_cache), free(tc.o), free(tc.lse), free(tc.o_ref), free(tc.lse_ref);
        free(ws);
    }
    printf("fuzz: %d cases, %d planned (%d graph-stable), %d refused with a message, %d run and checked\n", cases,
           planned, graph_planned, refused, ran);
    CHECK_MSG(graph_planned > 0 || cases < 200, "no graph-stable plan in %d cases", cases);
    CHECK(planned > cases / 4 && refused > cases / 20 && ran > cases / 40); /* the mix exercises both sides */
    pkv_plan_free(plan);
    pkv_context_free(ctx);
    printf("test_fuzz: %d passed, %d failed\n", pkv_test_passed, pkv_test_failed);
    return pkv_test_failed ? 1 : 0;
}
