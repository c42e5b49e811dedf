/* test_append_cuda.c - pkv_append_kv and pkv_copy_pages on the CUDA backend.  Skips (77) without a GPU.
 *
 * Each case runs the same operations on a CUDA context (device copies) and on a CPU context (host copies)
 * - prompts appended in the ragged form, decode steps appending one token per row in the decode form and
 * in FlashInfer's (batch_indices, positions), forks whose copy-on-write pages are copied by pkv_copy_pages,
 * rollbacks - both caches starting with the same NaN poison, and checks: the device caches equal the host
 * caches bitwise (every appended token and nothing else written; test_append checks the CPU's against the
 * tokens themselves), and decode attention on the GPU after the appends equals the float64 reference on
 * the grown cache.  Shapes: Hkv 1/2/8, d 64/128/256, pages of 1, 3, 8, 16, 64 and 256 tokens, NHD and HND,
 * fp16 and bf16.  Then a CUDA graph that captured one decode-form append is replayed for later steps with
 * new K/V and a new table in the same buffers; and the CUDA backend's own errors (misalignment).
 * fp8 caches (e4m3, e5m2; fp16 and bf16 sources; per-tensor scales, and per-KV-head scales in two cases;
 * values beyond the range, infinities and NaNs mixed in): the GPU's quantizing append and page copies against
 * the CPU backend's, code for code (NaN codes compared as NaN), then the appended caches decoded on both
 * backends with the same scales and compared output for output.
 * PKV_TEST_CASES=N sets the number of random cases (default 24). */
#include "persistentkv.h"
#include "pkv_lab.h"
#include "pkv_test.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

enum { MAXR = 8, MAXLEN = 600 };

typedef struct dev_arrays { /* device copies of one append's inputs */
    void *k, *v;
    int32_t *indptr, *indices, *last, *lens, *bidx, *pos, *aptr;
} dev_arrays;

static pkv_context *g_gpu, *g_cpu;

static void *dev_copy(const void *src, size_t bytes) {
    void *p = NULL;
    if (pkv_dev_malloc(g_gpu, bytes ? bytes : 16, &p) != PKV_OK) return NULL;
    if (src && bytes) pkv_dev_copy_h2d(g_gpu, p, src, bytes);
    return p;
}

typedef struct gcase {
    pkv_problem p;
    pkv_page_pool *pool;
    uint16_t *hk, *hv; /* host caches (CPU backend) */
    void *dk, *dv;     /* device caches (CUDA backend) */
    int64_t tok_elems, cache_elems;
    int32_t len[MAXR];
    bool live[MAXR];
} gcase;

/* The same append on both backends: rows' last n[i] tokens, fresh random K/V.  form 0 ragged, 1 decode,
 * 2 FlashInfer's. */
static void append_both(gcase *c, pkv_rng *rng, const int32_t *rows, int32_t b, const int32_t *n, int form) {
    static int32_t indices[MAXR * MAXLEN], bidx[MAXR * MAXLEN], pos[MAXR * MAXLEN];
    int32_t indptr[MAXR + 1], last[MAXR], lens[MAXR], aptr[MAXR + 1];
    CHECK_OK(pkv_page_pool_table(c->pool, rows, b, indptr, indices, MAXR * MAXLEN, last, lens));
    int32_t total = 0;
    aptr[0] = 0;
    for (int32_t i = 0; i < b; i++) {
        for (int32_t j = 0; j < n[i]; j++) bidx[total + j] = i, pos[total + j] = lens[i] - n[i] + j;
        total += n[i];
        aptr[i + 1] = total;
    }
    const size_t kv_bytes = (size_t)total * c->tok_elems * 2;
    uint16_t *k = (uint16_t *)malloc(kv_bytes + 16), *v = (uint16_t *)malloc(kv_bytes + 16);
    for (int64_t e = 0; e < (int64_t)total * c->tok_elems; e++)
        k[e] = pkv_test_random_value(rng, c->p.dtype), v[e] = pkv_test_random_value(rng, c->p.dtype);
    dev_arrays d = {dev_copy(k, kv_bytes), dev_copy(v, kv_bytes), dev_copy(indptr, (size_t)(b + 1) * 4),
                    dev_copy(indices, (size_t)indptr[b] * 4), dev_copy(last, (size_t)b * 4), dev_copy(lens, (size_t)b * 4),
                    dev_copy(bidx, (size_t)total * 4), dev_copy(pos, (size_t)total * 4), dev_copy(aptr, (size_t)(b + 1) * 4)};
    pkv_append_tensors h = {0}, g = {0};
    h.k = k, h.v = v, h.k_cache = c->hk, h.v_cache = c->hv, h.kv_indptr = indptr, h.kv_page_indices = indices;
    g.k = d.k, g.v = d.v, g.k_cache = c->dk, g.v_cache = c->dv, g.kv_indptr = d.indptr, g.kv_page_indices = d.indices;
    if (form == 0) h.append_indptr = aptr, h.seq_lens = lens, g.append_indptr = d.aptr, g.seq_lens = d.lens;
    else if (form == 1) h.kv_last_page_len = last, g.kv_last_page_len = d.last;
    else h.batch_indices = bidx, h.positions = pos, g.batch_indices = d.bidx, g.positions = d.pos;
    CHECK_OK(pkv_append_kv(g_cpu, &c->p, b, total, &h, NULL));
    const pkv_status st = pkv_append_kv(g_gpu, &c->p, b, total, &g, NULL);
    CHECK_MSG(st == PKV_OK, "GPU append form %d: %s", form, pkv_last_error());
    CHECK_OK(pkv_dev_synchronize(g_gpu));
    void *all[] = {d.k, d.v, d.indptr, d.indices, d.last, d.lens, d.bidx, d.pos, d.aptr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pkv_dev_free(g_gpu, all[i]);
    free(k), free(v);
}

/* Extends request r by one token on both, executing a copy-on-write on both. */
static void extend_both(gcase *c, int32_t r, int32_t n) {
    pkv_page_copy cp;
    CHECK_OK(pkv_request_extend(c->pool, r, n, &cp));
    if (cp.src_page >= 0) {
        CHECK_OK(pkv_copy_pages(g_cpu, &c->p, &cp, 1, c->hk, c->hv, 0, NULL));
        CHECK_OK(pkv_copy_pages(g_gpu, &c->p, &cp, 1, c->dk, c->dv, 0, NULL));
    }
    c->len[r] += n;
}

static int64_t caches_differ(gcase *c) {
    uint16_t *back = (uint16_t *)malloc((size_t)c->cache_elems * 2);
    int64_t bad = 0;
    for (int kv = 0; kv < 2; kv++) {
        CHECK_OK(pkv_dev_copy_d2h(g_gpu, back, kv ? c->dv : c->dk, (size_t)c->cache_elems * 2));
        const uint16_t *h = kv ? c->hv : c->hk;
        for (int64_t e = 0; e < c->cache_elems; e++) bad += back[e] != h[e];
    }
    free(back);
    return bad;
}

/* GPU decode on the grown cache against the float64 reference. */
static void decode_check(gcase *c, pkv_rng *rng, const char *label) {
    int32_t rows[MAXR], b = 0;
    for (int32_t r = 0; r < MAXR; r++)
        if (c->live[r]) rows[b++] = r;
    static int32_t indices[MAXR * MAXLEN];
    int32_t indptr[MAXR + 1], lens[MAXR];
    CHECK_OK(pkv_page_pool_table(c->pool, rows, b, indptr, indices, MAXR * MAXLEN, NULL, lens));
    pkv_page_table t = {b, indptr, indices, lens};
    const int64_t qn = (int64_t)b * c->p.num_qo_heads * c->p.head_dim;
    uint16_t *q = (uint16_t *)malloc((size_t)qn * 2), *o = (uint16_t *)malloc((size_t)qn * 2);
    double *oref = (double *)malloc((size_t)qn * 8), *lref = (double *)malloc((size_t)b * c->p.num_qo_heads * 8);
    for (int64_t e = 0; e < qn; e++) q[e] = pkv_test_random_value(rng, c->p.dtype);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    pkv_status st = pkv_plan_step(g_gpu, &c->p, &t, &opts, plan);
    CHECK_MSG(st == PKV_OK, "%s: plan: %s", label, pkv_last_error());
    const size_t wsb = pkv_plan_workspace_size(plan);
    void *ws = NULL, *dq = dev_copy(q, (size_t)qn * 2), *dind = dev_copy(indices, (size_t)indptr[b] * 4), *dout = NULL;
    pkv_dev_malloc(g_gpu, wsb ? wsb : 16, &ws);
    pkv_dev_malloc(g_gpu, (size_t)qn * 2, &dout);
    pkv_tensors tt = {.q = dq, .k_cache = c->dk, .v_cache = c->dv, .kv_page_indices = (const int32_t *)dind, .o = dout};
    if (st == PKV_OK) {
        st = pkv_run(g_gpu, plan, ws, wsb, &tt, NULL);
        CHECK_MSG(st == PKV_OK, "%s: run: %s", label, pkv_last_error());
    }
    CHECK_OK(pkv_dev_copy_d2h(g_gpu, o, dout, (size_t)qn * 2));
    CHECK_OK(pkv_reference(&c->p, &t, q, c->hk, c->hv, oref, lref));
    double num = 0, den = 0;
    for (int64_t e = 0; e < qn; e++) {
        const double x = pkv_test_to_float(o[e], c->p.dtype), dd = x - oref[e];
        num += dd * dd, den += oref[e] * oref[e];
    }
    const double rel = sqrt(num) / (den > 0 ? sqrt(den) : 1e-30), tol = c->p.dtype == PKV_DTYPE_BF16 ? 1.5e-2 : 2e-3;
    CHECK_MSG(rel < tol, "%s: GPU decode after append rel_l2 %.2e (tol %.1e)", label, rel, tol);
    pkv_plan_free(plan);
    pkv_dev_free(g_gpu, ws), pkv_dev_free(g_gpu, dq), pkv_dev_free(g_gpu, dind), pkv_dev_free(g_gpu, dout);
    free(q), free(o), free(oref), free(lref);
}

static void gcase_init(gcase *c, int32_t hkv, int32_t d, int32_t ps, pkv_layout layout, pkv_dtype dt) {
    memset(c, 0, sizeof *c);
    pkv_problem_default(&c->p);
    c->p.num_kv_heads = hkv, c->p.num_qo_heads = hkv * 4, c->p.head_dim = d, c->p.page_size = ps;
    c->p.layout = layout, c->p.dtype = dt;
    c->p.num_pages = (MAXR * MAXLEN) / ps + 2 * MAXR;
    c->tok_elems = (int64_t)hkv * d;
    c->cache_elems = c->p.num_pages * ps * c->tok_elems;
    c->hk = (uint16_t *)malloc((size_t)c->cache_elems * 2);
    c->hv = (uint16_t *)malloc((size_t)c->cache_elems * 2);
    for (int64_t e = 0; e < c->cache_elems; e++) c->hk[e] = c->hv[e] = pkv_test_nan_bits(dt);
    c->dk = dev_copy(c->hk, (size_t)c->cache_elems * 2);
    c->dv = dev_copy(c->hv, (size_t)c->cache_elems * 2);
    CHECK_OK(pkv_page_pool_create(c->p.num_pages, ps, MAXR, &c->pool));
}

static void gcase_free(gcase *c) {
    pkv_page_pool_free(c->pool);
    pkv_dev_free(g_gpu, c->dk), pkv_dev_free(g_gpu, c->dv);
    free(c->hk), free(c->hv);
}

static void run_case(pkv_rng *rng, int32_t hkv, int32_t d, int32_t ps, pkv_layout layout, pkv_dtype dt) {
    gcase c;
    gcase_init(&c, hkv, d, ps, layout, dt);
    char label[128];
    snprintf(label, sizeof label, "Hkv=%d d=%d page=%d %s %s", hkv, d, ps, layout ? "HND" : "NHD", dt ? "bf16" : "fp16");
    int32_t rows[MAXR], n[MAXR], b = (int32_t)pkv_rng_uniform_int(rng, 1, 5);
    for (int32_t r = 0; r < b; r++) {
        n[r] = (int32_t)pkv_rng_uniform_int(rng, 0, 300);
        CHECK_OK(pkv_request_create(c.pool, r, n[r]));
        c.len[r] = n[r], c.live[r] = true, rows[r] = r;
    }
    append_both(&c, rng, rows, b, n, 0);
    for (int32_t step = 0; step < 24; step++) {
        if (step % 7 == 3) /* fork row 0 */
            for (int32_t dst = 0; dst < MAXR; dst++)
                if (!c.live[dst] && c.live[0]) {
                    CHECK_OK(pkv_request_fork(c.pool, 0, dst));
                    c.len[dst] = c.len[0], c.live[dst] = true;
                    break;
                }
        if (step % 11 == 10 && c.len[0] > 2) {
            CHECK_OK(pkv_request_truncate(c.pool, 0, c.len[0] - 2));
            c.len[0] -= 2;
        }
        b = 0;
        for (int32_t r = 0; r < MAXR; r++)
            if (c.live[r] && c.len[r] < MAXLEN - 1) extend_both(&c, r, 1), rows[b] = r, n[b++] = 1;
        append_both(&c, rng, rows, b, n, 1 + step % 2);
    }
    const int64_t bad = caches_differ(&c);
    CHECK_MSG(bad == 0, "%s: %lld cache elements differ between the GPU and the CPU", label, (long long)bad);
    decode_check(&c, rng, label);
    gcase_free(&c);
}

/* A graph captured around one decode-form append, replayed for later steps (same B, new K/V and table in
 * the same device buffers). */
static void test_graph(pkv_rng *rng) {
    gcase c;
    gcase_init(&c, 8, 128, 16, PKV_LAYOUT_NHD, PKV_DTYPE_FP16);
    enum { B = 6 };
    int32_t rows[B];
    for (int32_t r = 0; r < B; r++) {
        rows[r] = r;
        CHECK_OK(pkv_request_create(c.pool, r, (int32_t)pkv_rng_uniform_int(rng, 1, 100)));
    }
    static int32_t indices[MAXR * MAXLEN];
    int32_t indptr[B + 1], last[B];
    const size_t kv_bytes = (size_t)B * c.tok_elems * 2;
    uint16_t *k = (uint16_t *)malloc(kv_bytes), *v = (uint16_t *)malloc(kv_bytes);
    void *dk = dev_copy(NULL, kv_bytes), *dv = dev_copy(NULL, kv_bytes), *dindptr = dev_copy(NULL, sizeof indptr),
         *dind = dev_copy(NULL, sizeof indices), *dlast = dev_copy(NULL, sizeof last);
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream) == cudaSuccess);
    pkv_append_tensors g = {0}, h = {0};
    g.k = dk, g.v = dv, g.k_cache = c.dk, g.v_cache = c.dv, g.kv_indptr = (const int32_t *)dindptr;
    g.kv_page_indices = (const int32_t *)dind, g.kv_last_page_len = (const int32_t *)dlast;
    h.k = k, h.v = v, h.k_cache = c.hk, h.v_cache = c.hv, h.kv_indptr = indptr, h.kv_page_indices = indices;
    h.kv_last_page_len = last;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    for (int32_t step = 0; step < 8; step++) {
        for (int32_t r = 0; r < B; r++) extend_both(&c, r, 1);
        CHECK_OK(pkv_page_pool_table(c.pool, rows, B, indptr, indices, MAXR * MAXLEN, last, NULL));
        for (int64_t e = 0; e < (int64_t)B * c.tok_elems; e++)
            k[e] = pkv_test_random_value(rng, c.p.dtype), v[e] = pkv_test_random_value(rng, c.p.dtype);
        CHECK_OK(pkv_dev_copy_h2d(g_gpu, dk, k, kv_bytes));
        CHECK_OK(pkv_dev_copy_h2d(g_gpu, dv, v, kv_bytes));
        CHECK_OK(pkv_dev_copy_h2d(g_gpu, dindptr, indptr, sizeof indptr));
        CHECK_OK(pkv_dev_copy_h2d(g_gpu, dind, indices, (size_t)indptr[B] * 4));
        CHECK_OK(pkv_dev_copy_h2d(g_gpu, dlast, last, sizeof last));
        CHECK_OK(pkv_append_kv(g_cpu, &c.p, B, B, &h, NULL));
        if (step == 0) {
            CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
            const pkv_status st = pkv_append_kv(g_gpu, &c.p, B, B, &g, stream);
            CHECK_MSG(st == PKV_OK, "append under capture: %s", pkv_last_error());
            CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
            CHECK(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
        }
        CHECK(exec && cudaGraphLaunch(exec, stream) == cudaSuccess);
        CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    }
    const int64_t bad = caches_differ(&c);
    CHECK_MSG(bad == 0, "graph replay: %lld cache elements differ from the CPU's", (long long)bad);
    /* the CUDA backend's own check: 16-byte alignment */
    g.k = (const char *)dk + 2;
    CHECK_STATUS(pkv_append_kv(g_gpu, &c.p, B, B, &g, NULL), PKV_ERR_INVALID_ARGUMENT);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    void *all[] = {dk, dv, dindptr, dind, dlast};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pkv_dev_free(g_gpu, all[i]);
    free(k), free(v);
    gcase_free(&c);
}

/* fp8 caches: the quantizing append and the page copy, GPU against CPU. */
static void test_fp8(pkv_rng *rng) {
    for (int c = 0; c < 8; c++) {
        pkv_problem p;
        pkv_problem_default(&p);
        p.num_kv_heads = c % 3 == 0 ? 8 : 2, p.num_qo_heads = p.num_kv_heads * 4, p.head_dim = c % 2 ? 128 : 64;
        p.page_size = c % 4 == 0 ? 1 : c % 4 == 1 ? 3 : 16;
        p.layout = (pkv_layout)(c % 2), p.dtype = (pkv_dtype)((c / 2) % 2);
        p.kv_dtype = c < 4 ? PKV_DTYPE_FP8_E4M3 : PKV_DTYPE_FP8_E5M2;
        const int e5m2 = p.kv_dtype == PKV_DTYPE_FP8_E5M2;
        enum { B = 4, LEN = 70 };
        const int32_t pages_per_row = (LEN + p.page_size - 1) / p.page_size;
        p.num_pages = (int64_t)B * pages_per_row + 3;
        const int64_t te = (int64_t)p.num_kv_heads * p.head_dim, cache = p.num_pages * p.page_size * te;
        static int32_t indices[B * LEN], bidx[B * LEN], pos[B * LEN];
        int32_t indptr[B + 1], lens[B];
        for (int32_t i = 0; i <= B; i++) indptr[i] = i * pages_per_row;
        for (int32_t j = 0; j < B * pages_per_row; j++) indices[j] = j + 3; /* pages 0..2 stay unused */
        for (int32_t i = 0; i < B; i++) lens[i] = LEN;
        const int32_t n = B * LEN;
        for (int32_t t = 0; t < n; t++) bidx[t] = t % B, pos[t] = t / B;
        uint16_t *k = (uint16_t *)malloc((size_t)(n * te) * 2), *v = (uint16_t *)malloc((size_t)(n * te) * 2);
        const float ks = (float)(0.01 + pkv_rng_uniform01(rng)), vs = c % 3 ? 0.0f : 0.5f;
        /* cases 3 and 7: per-KV-head scales for K and V (host arrays for the CPU, device copies for the GPU) */
        const int per_head = c % 4 == 3;
        float khs[8], vhs[8];
        for (int hh = 0; hh < 8; hh++) khs[hh] = ks * (0.5f + 0.25f * (float)hh), vhs[hh] = 0.3f + 0.1f * (float)hh;
        void *dkhs = dev_copy(khs, sizeof khs), *dvhs = dev_copy(vhs, sizeof vhs);
        const float big = e5m2 ? 80000.0f : 600.0f;
        for (int64_t e = 0; e < n * te; e++) {
            const double u = pkv_rng_uniform01(rng);
            float kf = (float)(2.0 * pkv_rng_uniform01(rng) - 1.0), vf = (float)(2.0 * pkv_rng_uniform01(rng) - 1.0);
            if (u < 0.05) kf *= big * ks, vf *= big * (vs > 0.0f ? vs : 1.0f);
            k[e] = pkv_test_from_float(kf, p.dtype), v[e] = pkv_test_from_float(vf, p.dtype);
            /* odd cases: NaN codes too, in row 0's tokens only (rows 1.. stay finite for the decode check) */
            if (c % 2 && (e / te) % B == 0 && u > 0.995) k[e] = pkv_test_nan_bits(p.dtype);
        }
        uint8_t *hk = (uint8_t *)malloc((size_t)cache), *hv = (uint8_t *)malloc((size_t)cache);
        memset(hk, PKV_TEST_NAN_FP8, (size_t)cache), memset(hv, PKV_TEST_NAN_FP8, (size_t)cache);
        void *dk = dev_copy(hk, (size_t)cache), *dv = dev_copy(hv, (size_t)cache);
        void *dkk = dev_copy(k, (size_t)(n * te) * 2), *dvv = dev_copy(v, (size_t)(n * te) * 2);
        void *dindptr = dev_copy(indptr, sizeof indptr), *dind = dev_copy(indices, sizeof indices);
        void *dbidx = dev_copy(bidx, sizeof bidx), *dpos = dev_copy(pos, sizeof pos), *dlens = dev_copy(lens, sizeof lens);
        pkv_append_tensors h = {0}, g = {0};
        h.k = k, h.v = v, h.k_cache = hk, h.v_cache = hv, h.kv_indptr = indptr, h.kv_page_indices = indices;
        h.seq_lens = lens, h.batch_indices = bidx, h.positions = pos, h.k_scale = ks, h.v_scale = vs;
        if (per_head) h.k_scale = h.v_scale = 0.0f, h.k_head_scales = khs, h.v_head_scales = vhs;
        g = h;
        if (per_head) g.k_head_scales = (const float *)dkhs, g.v_head_scales = (const float *)dvhs;
        g.k = dkk, g.v = dvv, g.k_cache = dk, g.v_cache = dv, g.kv_indptr = (const int32_t *)dindptr;
        g.kv_page_indices = (const int32_t *)dind, g.seq_lens = (const int32_t *)dlens;
        g.batch_indices = (const int32_t *)dbidx, g.positions = (const int32_t *)dpos;
        CHECK_OK(pkv_append_kv(g_cpu, &p, B, n, &h, NULL));
        pkv_status st = pkv_append_kv(g_gpu, &p, B, n, &g, NULL);
        CHECK_MSG(st == PKV_OK, "fp8 append on the GPU: %s", pkv_last_error());
        const pkv_page_copy cp[2] = {{3, 0}, {4, 2}};
        CHECK_OK(pkv_copy_pages(g_cpu, &p, cp, 2, hk, hv, 0, NULL));
        st = pkv_copy_pages(g_gpu, &p, cp, 2, dk, dv, 0, NULL);
        CHECK_MSG(st == PKV_OK, "fp8 page copy on the GPU: %s", pkv_last_error());
        uint8_t *back = (uint8_t *)malloc((size_t)cache);
        int64_t bad = 0;
        for (int kv = 0; kv < 2; kv++) {
            CHECK_OK(pkv_dev_copy_d2h(g_gpu, back, kv ? dv : dk, (size_t)cache));
            const uint8_t *hh = kv ? hv : hk;
            for (int64_t e = 0; e < cache; e++)
                if (back[e] != hh[e])
                    bad += !(isnan(pkv_fp8_to_float(back[e], e5m2)) && isnan(pkv_fp8_to_float(hh[e], e5m2)));
        }
        CHECK_MSG(bad == 0, "fp8 case %d (%s, %s source, page %d, %s scales): %lld codes differ between the GPU and "
                  "the CPU", c, e5m2 ? "e5m2" : "e4m3", p.dtype == PKV_DTYPE_BF16 ? "bf16" : "fp16", p.page_size,
                  per_head ? "per-head" : "per-tensor", (long long)bad);
        /* the appended caches decoded on both backends with the same scales: the GPU's fp8 kernel against the
         * CPU's, output for output (a NaN code in K makes its KV head's query heads NaN on both) */
        const int64_t qn = (int64_t)B * p.num_qo_heads * p.head_dim;
        uint16_t *q = (uint16_t *)malloc((size_t)qn * 2), *o_cpu = (uint16_t *)malloc((size_t)qn * 2),
                 *o_gpu = (uint16_t *)malloc((size_t)qn * 2);
        for (int64_t e = 0; e < qn; e++) q[e] = pkv_test_from_float((float)(2.0 * pkv_rng_uniform01(rng) - 1.0), p.dtype);
        void *dq = dev_copy(q, (size_t)qn * 2), *dout = dev_copy(NULL, (size_t)qn * 2);
        pkv_plan *pc = NULL, *pg = NULL;
        CHECK_OK(pkv_plan_create(&pc));
        CHECK_OK(pkv_plan_create(&pg));
        const pkv_page_table t = {B, indptr, indices, lens};
        CHECK_OK(pkv_plan_step(g_cpu, &p, &t, NULL, pc));
        st = pkv_plan_step(g_gpu, &p, &t, NULL, pg);
        CHECK_MSG(st == PKV_OK, "fp8 decode plan on the GPU: %s", pkv_last_error());
        const size_t wsc_bytes = pkv_plan_workspace_size(pc) + 64, wsg_bytes = pkv_plan_workspace_size(pg) + 256;
        void *wsc = malloc(wsc_bytes), *wsg = dev_copy(NULL, wsg_bytes);
        pkv_tensors xc = {.q = q, .k_cache = hk, .v_cache = hv, .kv_page_indices = indices, .o = o_cpu,
                          .k_scale = ks, .v_scale = vs};
        pkv_tensors xg = {.q = dq, .k_cache = dk, .v_cache = dv, .kv_page_indices = (const int32_t *)dind,
                          .o = dout, .k_scale = ks, .v_scale = vs};
        if (per_head) {
            xc.k_scale = xc.v_scale = xg.k_scale = xg.v_scale = 0.0f;
            xc.k_head_scales = khs, xc.v_head_scales = vhs;
            xg.k_head_scales = (const float *)dkhs, xg.v_head_scales = (const float *)dvhs;
        }
        CHECK_OK(pkv_run(g_cpu, pc, wsc, wsc_bytes, &xc, NULL));
        st = st == PKV_OK ? pkv_run(g_gpu, pg, wsg, wsg_bytes, &xg, NULL) : st;
        CHECK_MSG(st == PKV_OK, "fp8 decode on the GPU: %s", pkv_last_error());
        if (st == PKV_OK) {
            CHECK_OK(pkv_dev_copy_d2h(g_gpu, o_gpu, dout, (size_t)qn * 2));
            int64_t nan_diff = 0, nans = 0;
            double num = 0, den = 0;
            for (int64_t e = 0; e < qn; e++) {
                const double a = pkv_test_to_float(o_gpu[e], p.dtype), b = pkv_test_to_float(o_cpu[e], p.dtype);
                if (isnan(a) || isnan(b)) {
                    nan_diff += isnan(a) != isnan(b), nans++;
                    continue;
                }
                num += (a - b) * (a - b), den += b * b;
            }
            const double rel = den > 0 ? sqrt(num / den) : sqrt(num), tol = p.dtype == PKV_DTYPE_BF16 ? 1.5e-2 : 2e-3;
            /* odd cases: row 0 attends to NaN codes in every KV head, so exactly its outputs are NaN */
            const int64_t want_nans = c % 2 ? (int64_t)p.num_qo_heads * p.head_dim : 0;
            CHECK_MSG(nan_diff == 0 && rel < tol && nans == want_nans && den > 0,
                      "fp8 case %d (%s, %s q, page %d, d %d, G 4): decode GPU vs CPU rel L2 %.2e, NaN in one only %lld, "
                      "NaN %lld", c, e5m2 ? "e5m2" : "e4m3", p.dtype == PKV_DTYPE_BF16 ? "bf16" : "fp16", p.page_size,
                      p.head_dim, rel, (long long)nan_diff, (long long)nans);
        }
        pkv_plan_free(pc), pkv_plan_free(pg);
        free(q), free(o_cpu), free(o_gpu), free(wsc);
        void *all[] = {dk, dv, dkk, dvv, dindptr, dind, dbidx, dpos, dlens, dkhs, dvhs, wsg, dq, dout};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pkv_dev_free(g_gpu, all[i]);
        free(k), free(v), free(hk), free(hv), free(back);
    }
}

int main(void) {
    if (!pkv_cuda_available()) PKV_TEST_SKIP("no CUDA device (or a build without CUDA)");
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CUDA;
    CHECK_OK(pkv_context_create(&cfg, &g_gpu));
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 2;
    CHECK_OK(pkv_context_create(&cfg, &g_cpu));
    if (!g_gpu || !g_cpu) return pkv_test_finish("test_append_cuda");
    pkv_rng rng;
    pkv_rng_seed(&rng, 3536);
    static const int32_t hkvs[] = {1, 2, 8}, dims[] = {64, 128, 256}, pss[] = {1, 3, 8, 16, 64, 256};
    const int cases = getenv("PKV_TEST_CASES") ? atoi(getenv("PKV_TEST_CASES")) : 24;
    for (int i = 0; i < cases; i++)
        run_case(&rng, hkvs[pkv_rng_uniform_int(&rng, 0, 2)], dims[pkv_rng_uniform_int(&rng, 0, 2)],
                 pss[i % 6], (pkv_layout)(i % 2), (pkv_dtype)((i / 2) % 2));
    test_graph(&rng);
    test_fp8(&rng);
    printf("append on the GPU: %d cases, a graph replay and 8 fp8 cases against the CPU backend\n", cases);
    pkv_context_free(g_gpu);
    pkv_context_free(g_cpu);
    return pkv_test_finish("test_append_cuda");
}
