/* fuzz_plan.c - the planner and the plan validator under arbitrary problems, page tables and options.
 *
 * The input's bytes (fuzz_util.h: zeros once they run out) pick, mostly within the documented ranges and
 * sometimes past them: where the plan is made (a CPU context; no context; or simulated device capabilities
 * with a cost model, so the policy's route choice runs), the problem (every head dim, G 1..16 (17),
 * pages 1..256, windows, soft caps, dtypes, fp8 caches (kv_dtype e4m3 / e5m2), layouts, up to 512 KV heads), a
 * batch of up to 256 rows with
 * their lengths, a scattered page pool (or no page ids: a schedule only), every plan option, and then
 * perhaps one field broken to an edge value.  What must hold:
 *   - pkv_plan_step (and its host and capabilities variants) never crashes: a plan, or a status with a
 *     message;
 *   - a plan passes pkv_plan_validate against the lengths it was planned for, its counters match the
 *     attended tokens, and its workspace fits pkv_workspace_size's bound for that batch;
 *   - for an explicit single, split, work-queue or fused route, the policy's fast cost terms
 *     (pkv_plan_route_terms, no plan built) equal pkv_cost_terms of the built plan;
 *   - a small plan on the CPU context runs and matches the float64 reference (fp16/bf16 q; caches of q's dtype, or
 *     fp8 codes with random per-tensor or per-KV-head scales).
 * The validator is linear, so problems up to 256 rows x 512 KV heads are validated (capped at 2^19
 * attended tokens x KV heads to keep an input in milliseconds). */
#include "persistentkv.h"
#include "internal.h"
#include "pkv_lab.h"
#include "fuzz_util.h"

#include <math.h>

#define MAX_B 256
#define MAX_IDS (1 << 16)
#define MAX_HEAD_TOKENS (1 << 19) /* sum of the attended tokens x Hkv */

static int32_t edge(fuzz_bytes *b) {
    switch (fuzz_u8(b) % 6) {
    case 0: return -1;
    case 1: return 0;
    case 2: return INT32_MAX;
    case 3: return INT32_MIN;
    case 4: return (int32_t)fuzz_range(b, -5, 5);
    default: return fuzz_i32(b);
    }
}

/* An option field: usually 0 (the planner chooses), else a small value, else anything. */
static int32_t option(fuzz_bytes *b, int32_t small_max) {
    const uint8_t c = fuzz_u8(b);
    if (c < 160) return 0;
    if (c < 240) return (int32_t)fuzz_range(b, 1, small_max);
    return edge(b);
}

static int attended(const pkv_problem *p, int32_t n) { return p->window > 0 && n > p->window ? p->window : n; }

/* Runs the plan on the CPU context and compares with the float64 reference (as tests/test_fuzz.c). */
static void run_and_compare(pkv_context *ctx, const pkv_plan *plan, const pkv_problem *p, const pkv_page_table *t,
                            uint64_t seed, uint8_t scale_kind) {
    const size_t d = (size_t)p->head_dim, B = (size_t)t->batch_size, rows = B * (size_t)p->num_qo_heads;
    const size_t pool = (size_t)p->num_pages * (size_t)p->page_size * (size_t)p->num_kv_heads * d;
    const int fp8 = pkv_dtype_is_fp8(p->kv_dtype);
    const size_t es = fp8 ? 1 : 2;
    float heads[2][512];
    pkv_test_case tc = {.problem = *p, .table = *t, .batch_size = t->batch_size};
    tc.q_elems = (int64_t)(rows * d), tc.kv_elems = (int64_t)pool, tc.lse_elems = (int64_t)rows;
    tc.q = malloc(rows * d * 2), tc.k_cache = malloc(pool * es + 1), tc.v_cache = malloc(pool * es + 1);
    tc.o = malloc(rows * d * 2), tc.lse = malloc(rows * sizeof(float));
    tc.o_ref = malloc(rows * d * sizeof(double)), tc.lse_ref = malloc(rows * sizeof(double));
    const size_t ws_bytes = pkv_plan_workspace_size(plan);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    if (tc.q && tc.k_cache && tc.v_cache && tc.o && tc.lse && tc.o_ref && tc.lse_ref && ws) {
        pkv_rng rng;
        pkv_rng_seed(&rng, seed);
        for (size_t z = 0; z < rows * d; z++) tc.q[z] = pkv_test_random_value(&rng, p->dtype);
        if (!fp8) {
            for (size_t z = 0; z < pool; z++)
                tc.k_cache[z] = pkv_test_random_value(&rng, p->dtype), tc.v_cache[z] = pkv_test_random_value(&rng, p->dtype);
        } else { /* codes of magnitude up to 2 with random signs, and the scales: per tensor (0 = 1) or per head */
            uint8_t *k8 = (uint8_t *)tc.k_cache, *v8 = (uint8_t *)tc.v_cache;
            for (size_t z = 0; z < pool; z++)
                k8[z] = (uint8_t)pkv_rng_uniform_int(&rng, 0, 0x40) | (uint8_t)(pkv_rng_next(&rng) & 0x80),
                v8[z] = (uint8_t)pkv_rng_uniform_int(&rng, 0, 0x40) | (uint8_t)(pkv_rng_next(&rng) & 0x80);
            if ((scale_kind & 1) && p->num_kv_heads <= 512) {
                for (int32_t h = 0; h < p->num_kv_heads; h++)
                    heads[0][h] = (float)(0.01 + pkv_rng_uniform01(&rng)), heads[1][h] = (float)(0.01 + pkv_rng_uniform01(&rng));
                tc.k_head_scales = heads[0], tc.v_head_scales = heads[1];
            } else {
                tc.k_scale = scale_kind & 2 ? 0.0f : (float)(0.01 + pkv_rng_uniform01(&rng));
                tc.v_scale = scale_kind & 4 ? 0.0f : (float)(0.01 + pkv_rng_uniform01(&rng));
            }
        }
        pkv_test_poison(&tc);
        const pkv_tensors x = {.q = tc.q, .k_cache = tc.k_cache, .v_cache = tc.v_cache,
                               .kv_page_indices = t->kv_page_indices, .o = tc.o, .lse = tc.lse,
                               .k_scale = tc.k_scale, .v_scale = tc.v_scale, .k_head_scales = tc.k_head_scales,
                               .v_head_scales = tc.v_head_scales};
        const pkv_status st = pkv_run(ctx, plan, ws, ws_bytes, &x, NULL);
        FUZZ_CHECK(st == PKV_OK, "run of a valid %s plan failed: %s", pkv_route_name(pkv_plan_route(plan)),
                   pkv_last_error());
        FUZZ_CHECK(pkv_test_case_reference(&tc) == PKV_OK, "reference: %s", pkv_last_error());
        const double rel = pkv_test_rel_l2(&tc), lerr = pkv_test_lse_err(&tc);
        const double tol = p->dtype == PKV_DTYPE_BF16 ? PKV_TEST_TOL_O_BF16 : PKV_TEST_TOL_O_FP16;
        FUZZ_CHECK(pkv_test_unwritten(&tc) == 0 && rel < tol && lerr < PKV_TEST_TOL_LSE,
                   "%s, kv_dtype %d, B %d, d %d, G %d, page %d, window %d, cap %g: rel L2 %.3g, lse error %.3g, "
                   "%lld unwritten",
                   pkv_route_name(pkv_plan_route(plan)), (int)p->kv_dtype, t->batch_size, p->head_dim,
                   p->num_qo_heads / p->num_kv_heads,
                   p->page_size, p->window, (double)p->logits_soft_cap, rel, lerr, (long long)pkv_test_unwritten(&tc));
    }
    free(tc.q), free(tc.k_cache), free(tc.v_cache), free(tc.o), free(tc.lse), free(tc.o_ref), free(tc.lse_ref);
    free(ws);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static pkv_context *ctx;
    static pkv_plan *plan;
    static int32_t lens[MAX_B], indptr[MAX_B + 1], ids[MAX_IDS];
    if (!ctx) {
        pkv_context_config cc;
        pkv_context_config_default(&cc);
        cc.backend = PKV_BACKEND_CPU;
        cc.num_threads = 2;
        if (pkv_context_create(&cc, &ctx) != PKV_OK || pkv_plan_create(&plan) != PKV_OK) abort();
    }
    fuzz_bytes b = {data, size, 0};
    const int where = fuzz_u8(&b) % 3; /* 0: the CPU context, 1: no context, 2: simulated capabilities */
    const uint8_t shape = fuzz_u8(&b);

    pkv_problem p;
    pkv_problem_default(&p);
    p.num_kv_heads = (int32_t)(shape & 1 ? fuzz_range(&b, 1, 512) : fuzz_range(&b, 1, 4));
    p.num_qo_heads = p.num_kv_heads * (int32_t)fuzz_range(&b, 1, shape & 2 ? 17 : 16);
    p.head_dim = (int32_t[]){64, 128, 256, 128}[fuzz_u8(&b) % 4];
    p.page_size = (int32_t)fuzz_range(&b, 1, 256);
    p.window = shape & 4 ? (int32_t)fuzz_range(&b, 1, 4096) : 0;
    p.logits_soft_cap = shape & 8 ? (float)fuzz_range(&b, 1, 60) : 0.0f;
    p.sm_scale = shape & 16 ? (float)fuzz_range(&b, 1, 100) / 100.0f : 0.0f;
    const uint8_t types = fuzz_u8(&b);
    p.dtype = (pkv_dtype)(types % 3);
    /* the caches: of dtype (0, or dtype itself), or fp8 */
    p.kv_dtype = (pkv_dtype[]){(pkv_dtype)0, PKV_DTYPE_FP8_E4M3, PKV_DTYPE_FP8_E5M2, p.dtype}[(types >> 4) % 4];
    p.layout = (pkv_layout)(fuzz_u8(&b) % 2);

    const int32_t max_b = shape & 32 ? MAX_B : 12;
    int32_t B = (int32_t)fuzz_range(&b, 0, max_b);
    int64_t head_tokens = 0, total = 0;
    indptr[0] = 0;
    for (int32_t i = 0; i < B; i++) {
        const uint8_t c = fuzz_u8(&b);
        int32_t n = c < 24 ? 0 : c < 48 ? 1 : c < 64 ? (int32_t)fuzz_range(&b, 0, 1 << 20) : (int32_t)fuzz_range(&b, 0, 3000);
        int64_t need = ((int64_t)n + p.page_size - 1) / p.page_size + fuzz_u8(&b) % 3;
        if (total + need > MAX_IDS || head_tokens + (int64_t)attended(&p, n) * p.num_kv_heads > MAX_HEAD_TOKENS)
            n = 0, need = 0;
        head_tokens += (int64_t)attended(&p, n) * p.num_kv_heads;
        lens[i] = n;
        total += need;
        indptr[i + 1] = (int32_t)total;
    }
    int64_t pool = total + fuzz_range(&b, 0, 64);
    if (pool == 0) pool = 1;
    pkv_rng rng;
    pkv_rng_seed(&rng, fuzz_u64(&b));
    for (int64_t k = 0; k < total; k++) ids[k] = (int32_t)pkv_rng_uniform_int(&rng, 0, pool - 1);
    pkv_page_table t = {B, indptr, fuzz_u8(&b) < 32 ? NULL : ids, lens};

    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.route = (pkv_route)(fuzz_u8(&b) % (PKV_ROUTE_COUNT_ + 1)); /* one past the last: refused */
    o.parallelism = option(&b, 264);
    o.ctas_per_unit = option(&b, 8);
    o.num_splits = option(&b, 64);
    o.chunk_pages = option(&b, 64);
    o.min_chunk_tokens = option(&b, 4096);
    o.max_splits = option(&b, 512);
    o.graph_max_batch = option(&b, MAX_B + 4);
    o.graph_tasks = option(&b, 4096);
    if (where != 0 && o.parallelism == 0) o.parallelism = (int32_t)fuzz_range(&b, 1, 264);

    /* one field broken to an edge value (arrays stay as large as the table says: kv_indptr within ids) */
    const uint8_t broken = fuzz_u8(&b);
    if (broken < 64) {
        const int32_t i = B > 0 ? (int32_t)fuzz_range(&b, 0, B - 1) : 0;
        switch (broken % 14) {
        case 0: p.num_kv_heads = edge(&b); break;
        case 1: p.num_qo_heads = edge(&b); break;
        case 2: p.head_dim = edge(&b); break;
        case 3: p.page_size = edge(&b); break;
        case 4: p.window = edge(&b); break;
        case 5: p.logits_soft_cap = (float)edge(&b) * (fuzz_u8(&b) & 1 ? 1e30f : 1.0f); break;
        case 6: p.sm_scale = (float)edge(&b) * 1e29f; break;
        case 7:
            if (fuzz_u8(&b) & 1) p.kv_dtype = (pkv_dtype)edge(&b);
            else p.dtype = (pkv_dtype)edge(&b);
            break;
        case 8: p.layout = (pkv_layout)edge(&b); break;
        case 9: if (B > 0) lens[i] = edge(&b); break;
        case 10: if (B > 0) indptr[i + 1] = (int32_t)fuzz_range(&b, 0, MAX_IDS); break;
        case 11: if (total > 0) ids[fuzz_range(&b, 0, total - 1)] = edge(&b); break;
        case 12: pool = edge(&b); break;
        default: t.batch_size = (int32_t[]){-1, INT32_MIN, INT32_MAX, PKV_MAX_BATCH + 1, 0}[fuzz_u8(&b) % 5]; break;
        }
    }
    p.num_pages = pool;

    pkv_backend_caps caps;
    pkv_cost_model model;
    const pkv_cost_model *use_model = NULL;
    if (where == 2) {
        caps.parallelism = (int32_t)fuzz_range(&b, 0, 300);
        caps.ctas_per_unit = (int32_t)fuzz_range(&b, 1, 8);
        for (int di = 0; di < 3; di++)
            for (int gi = 0; gi < 2; gi++) caps.resident[di][gi] = (int32_t)fuzz_range(&b, 0, 8);
        caps.row_gather_below = (int32_t[]){0, 8, 16, 0}[fuzz_u8(&b) % 4];
        if (fuzz_u8(&b) & 1) {
            pkv_cost_model_default(&model, caps.parallelism > 0 ? caps.parallelism : 132,
                                   (double)fuzz_range(&b, 100, 8000), (double)fuzz_range(&b, 1, 10));
            model.coef[PKV_COEF_P] = (double[]){0, 1, 2, 3, 4, 6, 16, 3}[fuzz_u8(&b) % 8];
            use_model = &model;
        }
    } else if (where == 0) {
        caps = ctx->caps;
    } else {
        pkv_backend_caps_host(&caps);
    }

    pkv_status st;
    if (where == 0) st = pkv_plan_step(ctx, &p, &t, &o, plan);
    else if (where == 1) st = pkv_plan_step_host(&p, &t, &o, plan);
    else st = pkv_plan_step_caps(&caps, use_model, &p, &t, &o, plan);
    if (st != PKV_OK) {
        FUZZ_CHECK(st > PKV_OK && st <= PKV_ERR_BATCH_SIZE, "unknown status %d", (int)st);
        FUZZ_CHECK(pkv_last_error()[0] != '\0', "status %d without a message", (int)st);
        return 0;
    }

    const pkv_status vs = pkv_plan_validate(plan, lens);
    FUZZ_CHECK(vs == PKV_OK, "invalid %s plan (B %d, Hkv %d, G %d, page %d, window %d): %s",
               pkv_route_name(pkv_plan_route(plan)), t.batch_size, p.num_kv_heads, p.num_qo_heads / p.num_kv_heads,
               p.page_size, p.window, pkv_last_error());
    const pkv_counters *cn = pkv_plan_counters(plan);
    int64_t tokens = 0;
    for (int32_t i = 0; i < t.batch_size; i++) tokens += attended(&p, lens[i]);
    FUZZ_CHECK(cn->total_tokens == tokens && cn->tasks == pkv_plan_num_tasks(plan) &&
                   cn->kv_bytes == tokens * p.num_kv_heads * p.head_dim * 2 * (int64_t)pkv_kv_elem_size(&p),
               "counters: %lld tokens of %lld, kv bytes %lld", (long long)cn->total_tokens, (long long)tokens,
               (long long)cn->kv_bytes);

    /* the workspace bound of any batch of this size covers this plan */
    size_t bound = 0;
    const pkv_status bs = pkv_workspace_size_caps(&caps, &p, t.batch_size, &o, &bound);
    FUZZ_CHECK(bs == PKV_OK && bound >= pkv_plan_workspace_size(plan), "workspace %zu above the bound %zu (%s)",
               pkv_plan_workspace_size(plan), bound, bs == PKV_OK ? "" : pkv_last_error());

    /* the policy's fast terms of an explicit route are the built plan's */
    if ((o.route == PKV_ROUTE_SINGLE || o.route == PKV_ROUTE_SPLIT || o.route == PKV_ROUTE_WORKQUEUE ||
         o.route == PKV_ROUTE_FUSED) && o.graph_max_batch <= 0) {
        double a[PKV_COST_TERMS], f[PKV_COST_TERMS];
        FUZZ_CHECK(pkv_cost_terms(plan, a) == PKV_OK, "terms: %s", pkv_last_error());
        FUZZ_CHECK(pkv_plan_route_terms(&caps, &p, &t, &o, f) == PKV_OK, "fast terms: %s", pkv_last_error());
        for (int j = 0; j < PKV_COST_TERMS; j++)
            FUZZ_CHECK(fabs(a[j] - f[j]) <= 1e-9 * (1 + fabs(a[j])),
                       "%s term %d: plan %.9g, fast %.9g (B %d, Hkv %d, G %d, page %d, window %d)",
                       pkv_route_name(o.route), j, a[j], f[j], t.batch_size, p.num_kv_heads,
                       p.num_qo_heads / p.num_kv_heads, p.page_size, p.window);
    }

    /* small plans of the CPU context run against the reference */
    const int64_t pool_elems = p.num_pages * p.page_size * p.num_kv_heads * p.head_dim;
    if (where == 0 && t.kv_page_indices && t.batch_size > 0 && p.dtype != PKV_DTYPE_FP32 && p.sm_scale <= 1.0f &&
        pool_elems <= (1 << 20) && tokens * p.num_qo_heads * p.head_dim <= (1 << 20) &&
        pkv_plan_workspace_size(plan) <= ((size_t)64 << 20))
        run_and_compare(ctx, plan, &p, &t, (uint64_t)size * 2654435761u + b.at, types);
    return 0;
}
