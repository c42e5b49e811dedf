/* consumer.c - a program outside the project, built against an installed PersistentKV (by
 * find_package(PersistentKV) and by pkg-config; tests/install/test_install.sh): one decode step on
 * the CPU backend, paged and ragged, checked against its own float64 reference, then a page id
 * out of range, which must be refused with its status and a message. */
#include <persistentkv.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define B 3
#define HQ 8
#define HKV 2
#define D 64
#define PAGE 16

static uint32_t rng = 12345u;
static float uniform(void) { /* [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / (float)(1u << 23) - 1.0f;
}
/* fp16 bits of f (round to nearest even; |f| < 2, normal or subnormal), and back: the consumer's own. */
static uint16_t to_half(float f) {
    const uint16_t sign = f < 0 ? 0x8000u : 0u;
    double a = fabs((double)f);
    if (a < ldexp(1.0, -24) / 2) return sign;
    int e;
    const double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    int exp = e - 1 + 15;           /* the biased exponent of a normal fp16 */
    double scaled = exp > 0 ? ldexp(a, 10 - (e - 1)) - 1024.0 : ldexp(a, 24); /* mantissa units */
    double r = nearbyint(scaled);   /* ties to even in the default rounding mode */
    if (exp <= 0) return (uint16_t)(sign | (uint16_t)r);
    if (r >= 1024.0) r -= 1024.0, exp++;
    (void)m;
    return (uint16_t)(sign | (uint16_t)(exp << 10) | (uint16_t)r);
}
static double from_half(uint16_t h) {
    const int exp = (h >> 10) & 31, man = h & 1023;
    const double a = exp ? ldexp(1024.0 + man, exp - 25) : ldexp((double)man, -24);
    return h & 0x8000u ? -a : a;
}

/* The definition in double (NHD pages, default scale 1 / sqrt(D) as a float). */
static void reference(const int32_t *lens, const int32_t *indptr, const int32_t *pages, const uint16_t *q,
                      const uint16_t *k, const uint16_t *v, double *o, double *lse) {
    const double scale = (double)(float)(1.0 / sqrt((double)D));
    double s[512];
    for (int i = 0; i < B; i++)
        for (int h = 0; h < HQ; h++) {
            const int g = h / (HQ / HKV), n = lens[i];
            double mx = -INFINITY, sum = 0.0;
            for (int t = 0; t < n; t++) {
                const size_t at = (((size_t)pages[indptr[i] + t / PAGE] * PAGE + (size_t)(t % PAGE)) * HKV + (size_t)g) * D;
                double dot = 0.0;
                for (int e = 0; e < D; e++) dot += from_half(q[((size_t)i * HQ + (size_t)h) * D + (size_t)e]) * from_half(k[at + (size_t)e]);
                s[t] = scale * dot;
                mx = fmax(mx, s[t]);
            }
            double *out = o + ((size_t)i * HQ + (size_t)h) * D;
            for (int e = 0; e < D; e++) out[e] = 0.0;
            for (int t = 0; t < n; t++) {
                const size_t at = (((size_t)pages[indptr[i] + t / PAGE] * PAGE + (size_t)(t % PAGE)) * HKV + (size_t)g) * D;
                const double w = exp(s[t] - mx);
                sum += w;
                for (int e = 0; e < D; e++) out[e] += w * from_half(v[at + (size_t)e]);
            }
            for (int e = 0; e < D; e++) out[e] /= sum;
            lse[i * HQ + h] = mx + log(sum);
        }
}

static int fail(const char *what, pkv_status s, const pkv_context *ctx) {
    fprintf(stderr, "consumer: %s: %s (%s)\n", what, pkv_status_string(s), pkv_last_error());
    return 1;
}

int main(void) {
    const uint32_t want = PKV_VERSION_MAJOR * 10000 + PKV_VERSION_MINOR * 100 + PKV_VERSION_PATCH;
    if (pkv_version() != want) {
        fprintf(stderr, "consumer: header %u, library %u\n", want, pkv_version());
        return 1;
    }
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 2;
    pkv_context *ctx = NULL;
    pkv_status s = pkv_context_create(&cfg, &ctx);
    if (s != PKV_OK) return fail("pkv_context_create", s, NULL);

    /* rows of 1, 37 and 300 tokens on pages taken from a pool in a scrambled order */
    const int32_t seq_lens[B] = {1, 37, 300};
    int32_t indptr[B + 1] = {0};
    for (int i = 0; i < B; i++) indptr[i + 1] = indptr[i] + (seq_lens[i] + PAGE - 1) / PAGE;
    const int32_t npages = indptr[B], pool = npages + 5;
    int32_t pages[64];
    for (int i = 0; i < npages; i++) pages[i] = (int32_t)((7 * i + 3) % pool); /* 7 and pool coprime */

    pkv_problem p;
    pkv_problem_default(&p);
    p.num_qo_heads = HQ;
    p.num_kv_heads = HKV;
    p.head_dim = D;
    p.page_size = PAGE;
    p.num_pages = pool;
    const size_t nq = (size_t)B * HQ * D, nkv = (size_t)pool * PAGE * HKV * D;
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2), *o = malloc(nq * 2);
    float *lse = malloc((size_t)B * HQ * sizeof(float));
    double *o_ref = malloc(nq * sizeof(double)), *lse_ref = malloc((size_t)B * HQ * sizeof(double));
    if (!q || !k || !v || !o || !lse || !o_ref || !lse_ref) return fail("malloc", PKV_ERR_OUT_OF_MEMORY, NULL);
    for (size_t i = 0; i < nq; i++) q[i] = to_half(uniform());
    for (size_t i = 0; i < nkv; i++) k[i] = to_half(uniform()), v[i] = to_half(uniform());
    for (size_t i = 0; i < nq; i++) o[i] = 0x7e00; /* NaN: every output must be written */

    pkv_page_table t = {B, indptr, pages, seq_lens};
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    pkv_plan *plan = NULL;
    if ((s = pkv_plan_create(&plan)) != PKV_OK) return fail("pkv_plan_create", s, ctx);
    if ((s = pkv_plan_step(ctx, &p, &t, &opts, plan)) != PKV_OK) return fail("pkv_plan_step", s, ctx);
    const size_t ws_bytes = pkv_plan_workspace_size(plan);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    pkv_tensors x = {.q = q, .k_cache = k, .v_cache = v, .kv_page_indices = pages, .o = o, .lse = lse};
    if ((s = pkv_run(ctx, plan, ws, ws_bytes, &x, NULL)) != PKV_OK) return fail("pkv_run", s, ctx);
    reference(seq_lens, indptr, pages, q, k, v, o_ref, lse_ref);
    double err = 0.0, norm = 0.0, lse_err = 0.0;
    for (size_t i = 0; i < nq; i++) {
        const double d = from_half(o[i]) - o_ref[i];
        err += d * d;
        norm += o_ref[i] * o_ref[i];
    }
    for (int i = 0; i < B * HQ; i++) lse_err = fmax(lse_err, fabs((double)lse[i] - lse_ref[i]));
    const double rel = sqrt(err / norm);
    if (!(rel < 2e-3) || !(lse_err < 1e-3)) {
        fprintf(stderr, "consumer: relative L2 error %.3g, lse error %.3g\n", rel, lse_err);
        return 1;
    }

    const char *route = pkv_route_name(pkv_plan_route(plan));

    /* a page id past the pool: refused with its status and a message, nothing run */
    pages[npages - 1] = pool;
    s = pkv_plan_step(ctx, &p, &t, &opts, plan);
    if (s != PKV_ERR_PAGE_OUT_OF_RANGE || pkv_last_error()[0] == 0) {
        fprintf(stderr, "consumer: a page id out of range gave %s\n", pkv_status_string(s));
        return 1;
    }
    printf("consumer: ok (PersistentKV %u.%u.%u, %s route on %s; relative L2 error %.2e; a bad page id: %s)\n",
           pkv_version() / 10000, pkv_version() / 100 % 100, pkv_version() % 100, route,
           pkv_context_device_name(ctx), rel, pkv_status_string(s));
    free(ws);
    pkv_plan_free(plan);
    pkv_context_free(ctx);
    free(q), free(k), free(v), free(o), free(lse), free(o_ref), free(lse_ref);
    return 0;
}
