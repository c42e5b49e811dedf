/* test_model.c - the model layer ops (model/pkv_model.h): the CPU ops against float64 formulas on fresh
 * random data (within one bf16 rounding), their edge cases and refusals; then, where a GPU is visible,
 * the CUDA ops against the CPU ops on the same inputs (the CPU part runs everywhere). */
#include "pkv_lab.h"
#include "pkv_model.h"
#include "pkv_test.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static float bf(uint16_t b) { return pkv_bf16_to_float(b); }

static uint16_t *random_bf16(pkv_rng *rng, int64_t n, double scale) {
    uint16_t *p = (uint16_t *)malloc((size_t)n * 2);
    for (int64_t i = 0; p && i < n; i++)
        p[i] = pkv_float_to_bf16((float)(scale * bf(pkv_test_random_value(rng, PKV_DTYPE_BF16))));
    return p;
}

/* |a - b| within `ulps` bf16 steps of b's magnitude (plus a floor for values near 0). */
static bool near_bf16(double a, double b, double ulps) {
    return fabs(a - b) <= ulps * fmax(fabs(b), 1e-3) / 128.0;
}

static void cpu_ops(pkv_ops *ops, pkv_rng *rng) {
    enum { B = 5, N = 96, K = 80, HQ = 4, HKV = 2, D = 64, V = 300 };
    /* embed: rows copied exactly; a token outside the vocabulary refused */
    uint16_t *table = random_bf16(rng, (int64_t)V * K, 1.0), *out = (uint16_t *)malloc((size_t)B * K * 2);
    int32_t tokens[B] = {0, 299, 17, 17, 150};
    CHECK_OK(pkv_op_embed(ops, table, V, K, tokens, B, out));
    for (int b = 0; b < B; b++) CHECK(memcmp(out + b * K, table + (int64_t)tokens[b] * K, K * 2) == 0);
    tokens[2] = V;
    CHECK_STATUS(pkv_op_embed(ops, table, V, K, tokens, B, out), PKV_ERR_INVALID_ARGUMENT);
    tokens[2] = -1;
    CHECK_STATUS(pkv_op_embed(ops, table, V, K, tokens, B, out), PKV_ERR_INVALID_ARGUMENT);

    /* rmsnorm against the formula in float64 */
    uint16_t *x = random_bf16(rng, (int64_t)B * K, 3.0), *w = random_bf16(rng, K, 1.0);
    CHECK_OK(pkv_op_rmsnorm(ops, x, w, B, K, 1e-6, out));
    int bad = 0;
    for (int b = 0; b < B; b++) {
        double ss = 0;
        for (int i = 0; i < K; i++) ss += (double)bf(x[b * K + i]) * bf(x[b * K + i]);
        const double r = 1.0 / sqrt(ss / K + 1e-6);
        for (int i = 0; i < K; i++) bad += !near_bf16(bf(out[b * K + i]), bf(w[i]) * bf(x[b * K + i]) * r, 2.0);
    }
    CHECK_MSG(bad == 0, "rmsnorm: %d values off by more than two bf16 roundings", bad);

    /* gemm against float64, with row strides */
    uint16_t *W = random_bf16(rng, (int64_t)N * K, 1.0), *xs = random_bf16(rng, (int64_t)B * (K + 8), 1.0);
    uint16_t *y = (uint16_t *)calloc((size_t)B * (N + 4), 2);
    CHECK_OK(pkv_op_gemm(ops, xs, K + 8, W, B, N, K, y, N + 4));
    double num = 0, den = 0;
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)bf(xs[b * (K + 8) + k]) * bf(W[n * K + k]);
            num += (bf(y[b * (N + 4) + n]) - acc) * (bf(y[b * (N + 4) + n]) - acc);
            den += acc * acc;
        }
    CHECK_MSG(sqrt(num / den) < 4e-3, "gemm: relative L2 error %.3g", sqrt(num / den));
    CHECK(y[N] == 0 && y[N + 3] == 0); /* nothing written between rows */
    CHECK_STATUS(pkv_op_gemm(ops, xs, K - 1, W, B, N, K, y, 0), PKV_ERR_INVALID_ARGUMENT);

    /* rope: position 0 leaves q and k as they are and never touches v; other positions match the formula */
    const int64_t row = (HQ + 2 * HKV) * D;
    uint16_t *qkv = random_bf16(rng, (int64_t)B * row, 1.0), *orig = (uint16_t *)malloc((size_t)B * row * 2);
    memcpy(orig, qkv, (size_t)B * row * 2);
    float inv[D / 2];
    pkv_rope_inv_freq(500000.0, D, inv);
    CHECK(inv[0] == 1.0f && inv[D / 2 - 1] < inv[1]);
    const int32_t pos[B] = {0, 1, 7, 4096, 131071};
    CHECK_OK(pkv_op_rope(ops, qkv, pos, B, HQ, HKV, D, inv));
    CHECK(memcmp(qkv, orig, (size_t)row * 2) == 0);
    bad = 0;
    for (int b = 1; b < B; b++) {
        CHECK(memcmp(qkv + b * row + (HQ + HKV) * D, orig + b * row + (HQ + HKV) * D, HKV * D * 2) == 0);
        for (int h = 0; h < HQ + HKV; h++)
            for (int i = 0; i < D / 2; i++) {
                const double a = (double)pos[b] * inv[i], c = cos(a), s = sin(a);
                const double x1 = bf(orig[b * row + h * D + i]), x2 = bf(orig[b * row + h * D + i + D / 2]);
                bad += !near_bf16(bf(qkv[b * row + h * D + i]), x1 * c - x2 * s, 6.0) &&
                       fabs(bf(qkv[b * row + h * D + i]) - (x1 * c - x2 * s)) > 2e-2;
                bad += !near_bf16(bf(qkv[b * row + h * D + i + D / 2]), x2 * c + x1 * s, 6.0) &&
                       fabs(bf(qkv[b * row + h * D + i + D / 2]) - (x2 * c + x1 * s)) > 2e-2;
            }
    }
    CHECK_MSG(bad == 0, "rope: %d values off the formula", bad);

    /* silu_mul against float64 */
    uint16_t *gu = random_bf16(rng, (int64_t)B * 2 * N, 4.0), *act = (uint16_t *)malloc((size_t)B * N * 2);
    CHECK_OK(pkv_op_silu_mul(ops, gu, B, N, act));
    bad = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++) {
            const double g = bf(gu[b * 2 * N + i]), u = bf(gu[b * 2 * N + N + i]);
            bad += !near_bf16(bf(act[b * N + i]), g / (1 + exp(-g)) * u, 2.0);
        }
    CHECK_MSG(bad == 0, "silu_mul: %d values off", bad);

    /* add: the residual stream, rounded once */
    uint16_t *a0 = random_bf16(rng, 64, 2.0), *a1 = random_bf16(rng, 64, 2.0), *a2 = (uint16_t *)malloc(128);
    memcpy(a2, a0, 128);
    CHECK_OK(pkv_op_add(ops, a2, a1, 64));
    bad = 0;
    for (int i = 0; i < 64; i++) bad += a2[i] != pkv_float_to_bf16(bf(a0[i]) + bf(a1[i]));
    CHECK(bad == 0);
    /* add_rmsnorm: the same bits as add, then rmsnorm (2 rows of 32) */
    uint16_t *w32 = random_bf16(rng, 32, 1.0), *n1 = (uint16_t *)malloc(128), *n2 = (uint16_t *)malloc(128);
    memcpy(a2, a0, 128);
    CHECK_OK(pkv_op_add_rmsnorm(ops, a2, a1, w32, 2, 32, 1e-5, n1));
    uint16_t a3[64];
    memcpy(a3, a0, 128);
    CHECK_OK(pkv_op_add(ops, a3, a1, 64));
    CHECK_OK(pkv_op_rmsnorm(ops, a3, w32, 2, 32, 1e-5, n2));
    CHECK(memcmp(a2, a3, 128) == 0 && memcmp(n1, n2, 128) == 0);
    CHECK_STATUS(pkv_op_add_rmsnorm(ops, a2, NULL, w32, 2, 32, 1e-5, n1), PKV_ERR_INVALID_ARGUMENT);
    free(w32), free(n1), free(n2);

    /* argmax: the first of equal maxima, NaN above all */
    uint16_t *lg = random_bf16(rng, (int64_t)3 * V, 1.0);
    lg[10] = lg[20] = pkv_float_to_bf16(5.0f);         /* row 0: a tie, the first wins */
    lg[V + 299] = pkv_float_to_bf16(9.0f);             /* row 1: the last index */
    lg[2 * V + 5] = lg[2 * V + 9] = (uint16_t)0x7fc0u; /* row 2: NaN wins, the first one */
    int32_t am[3];
    CHECK_OK(pkv_op_argmax(ops, lg, 3, V, am));
    CHECK_MSG(am[0] == 10 && am[1] == 299 && am[2] == 5, "argmax: %d %d %d", am[0], am[1], am[2]);
    CHECK_STATUS(pkv_op_argmax(ops, NULL, 3, V, am), PKV_ERR_INVALID_ARGUMENT);

    free(table), free(out), free(x), free(w), free(W), free(xs), free(y), free(qkv), free(orig), free(gu);
    free(act), free(a0), free(a1), free(a2), free(lg);
}

static pkv_status dev_put(pkv_context *ctx, void **ptr, size_t bytes, const void *src) {
    pkv_status st = pkv_dev_malloc(ctx, bytes, ptr);
    if (st == PKV_OK && src) st = pkv_dev_copy_h2d(ctx, *ptr, src, bytes);
    return st;
}

/* The CUDA ops against the CPU ops on the same inputs: bitwise where both round the same fp32 values
 * (embed, add, silu_mul, rope up to the device's cos/sin/exp in rare last-bit cases), within one rounding
 * for rmsnorm (another summation order), and the GEMM within its fp32 accumulation. */
static void cuda_vs_cpu(pkv_ops *cpu, pkv_context *gctx, pkv_rng *rng) {
    pkv_ops *gpu = NULL;
    CHECK_OK(pkv_ops_create(gctx, NULL, &gpu));
    if (!gpu) return;
    enum { B = 7, N = 1000, K = 512, HQ = 8, HKV = 2, D = 128, MLP = 700 };
    const int64_t row = (HQ + 2 * HKV) * D;
    uint16_t *x = random_bf16(rng, (int64_t)B * K, 3.0), *w = random_bf16(rng, K, 1.0);
    uint16_t *W = random_bf16(rng, (int64_t)N * K, 0.1), *qkv = random_bf16(rng, (int64_t)B * row, 1.0);
    uint16_t *gu = random_bf16(rng, (int64_t)B * 2 * MLP, 4.0);
    const int32_t pos[B] = {0, 3, 100, 1000, 5000, 30000, 131000};
    float inv[D / 2];
    pkv_rope_inv_freq(500000.0, D, inv);
    /* CPU results */
    uint16_t *c_norm = malloc((size_t)B * K * 2), *c_y = malloc((size_t)B * N * 2), *c_qkv = malloc((size_t)B * row * 2);
    uint16_t *c_act = malloc((size_t)B * MLP * 2), *c_add = malloc((size_t)B * K * 2);
    int32_t c_am[B], g_am[B];
    memcpy(c_qkv, qkv, (size_t)B * row * 2);
    memcpy(c_add, x, (size_t)B * K * 2);
    CHECK_OK(pkv_op_rmsnorm(cpu, x, w, B, K, 1e-5, c_norm));
    CHECK_OK(pkv_op_gemm(cpu, x, 0, W, B, N, K, c_y, 0));
    CHECK_OK(pkv_op_rope(cpu, c_qkv, pos, B, HQ, HKV, D, inv));
    CHECK_OK(pkv_op_silu_mul(cpu, gu, B, MLP, c_act));
    CHECK_OK(pkv_op_add(cpu, c_add, c_norm, (int64_t)B * K));
    CHECK_OK(pkv_op_argmax(cpu, c_y, B, N, c_am));
    /* add_rmsnorm: x + the norm's output, normalized again (c_add2 the sum, c_norm2 its norm) */
    uint16_t *c_add2 = malloc((size_t)B * K * 2), *c_norm2 = malloc((size_t)B * K * 2);
    memcpy(c_add2, x, (size_t)B * K * 2);
    CHECK_OK(pkv_op_add_rmsnorm(cpu, c_add2, c_norm, w, B, K, 1e-5, c_norm2));
    /* the same on the device */
    void *d_x, *d_w, *d_W, *d_qkv, *d_gu, *d_norm, *d_y, *d_act, *d_pos, *d_inv, *d_am;
    pkv_status st = PKV_OK;
    if (st == PKV_OK) st = dev_put(gctx, &d_x, (size_t)B * K * 2, x);
    if (st == PKV_OK) st = dev_put(gctx, &d_w, (size_t)K * 2, w);
    if (st == PKV_OK) st = dev_put(gctx, &d_W, (size_t)N * K * 2, W);
    if (st == PKV_OK) st = dev_put(gctx, &d_qkv, (size_t)B * row * 2, qkv);
    if (st == PKV_OK) st = dev_put(gctx, &d_gu, (size_t)B * 2 * MLP * 2, gu);
    if (st == PKV_OK) st = dev_put(gctx, &d_norm, (size_t)B * K * 2, NULL);
    if (st == PKV_OK) st = dev_put(gctx, &d_y, (size_t)B * N * 2, NULL);
    if (st == PKV_OK) st = dev_put(gctx, &d_act, (size_t)B * MLP * 2, NULL);
    if (st == PKV_OK) st = dev_put(gctx, &d_pos, sizeof pos, pos);
    if (st == PKV_OK) st = dev_put(gctx, &d_inv, sizeof inv, inv);
    if (st == PKV_OK) st = dev_put(gctx, &d_am, sizeof g_am, NULL);
    CHECK_OK(st);
    if (st != PKV_OK) return;
    CHECK_OK(pkv_op_rmsnorm(gpu, d_x, d_w, B, K, 1e-5, d_norm));
    CHECK_OK(pkv_op_gemm(gpu, d_x, 0, d_W, B, N, K, d_y, 0));
    CHECK_OK(pkv_op_rope(gpu, d_qkv, d_pos, B, HQ, HKV, D, d_inv));
    CHECK_OK(pkv_op_silu_mul(gpu, d_gu, B, MLP, d_act));
    CHECK_OK(pkv_op_add(gpu, d_x, d_norm, (int64_t)B * K));
    CHECK_OK(pkv_op_argmax(gpu, d_y, B, N, d_am));
    CHECK_OK(pkv_ops_synchronize(gpu));
    uint16_t *g = malloc((size_t)B * row * 2);
    int diff = 0, far = 0;
    CHECK_OK(pkv_dev_copy_d2h(gctx, g, d_norm, (size_t)B * K * 2));
    for (int i = 0; i < B * K; i++) diff += g[i] != c_norm[i], far += !near_bf16(bf(g[i]), bf(c_norm[i]), 1.0);
    CHECK_MSG(far == 0, "rmsnorm: %d of %d values differ by more than one rounding (%d differ)", far, B * K, diff);
    CHECK_OK(pkv_dev_copy_d2h(gctx, g, d_x, (size_t)B * K * 2));
    diff = 0;
    for (int i = 0; i < B * K; i++) diff += !near_bf16(bf(g[i]), bf(c_add[i]), 1.0);
    CHECK_MSG(diff == 0, "add: %d values differ", diff);
    CHECK_OK(pkv_dev_copy_d2h(gctx, g, d_y, (size_t)B * N * 2));
    double num = 0, den = 0;
    for (int i = 0; i < B * N; i++) num += (bf(g[i]) - bf(c_y[i])) * (bf(g[i]) - bf(c_y[i])), den += bf(c_y[i]) * bf(c_y[i]);
    CHECK_MSG(sqrt(num / den) < 8e-3, "gemm: relative L2 %.3g against the CPU", sqrt(num / den));
    CHECK_OK(pkv_dev_copy_d2h(gctx, g, d_qkv, (size_t)B * row * 2));
    diff = far = 0;
    for (int i = 0; i < B * row; i++) diff += g[i] != c_qkv[i], far += !near_bf16(bf(g[i]), bf(c_qkv[i]), 2.0);
    CHECK_MSG(far == 0 && diff <= B * row / 100, "rope: %d values differ (%d by more than two roundings)", diff, far);
    CHECK_OK(pkv_dev_copy_d2h(gctx, g, d_act, (size_t)B * MLP * 2));
    diff = 0;
    for (int i = 0; i < B * MLP; i++) diff += !near_bf16(bf(g[i]), bf(c_act[i]), 1.0);
    CHECK_MSG(diff == 0, "silu_mul: %d values differ", diff);
    /* argmax of the device's own logits, against the CPU argmax of those logits */
    int32_t ref_am[B];
    CHECK_OK(pkv_dev_copy_d2h(gctx, g, d_y, (size_t)B * N * 2));
    CHECK_OK(pkv_op_argmax(cpu, g, B, N, ref_am));
    CHECK_OK(pkv_dev_copy_d2h(gctx, g_am, d_am, sizeof g_am));
    CHECK(memcmp(ref_am, g_am, sizeof g_am) == 0);
    /* add_rmsnorm on the device: the same bits as its add then rmsnorm there, and the CPU's within a rounding */
    void *d_x2 = NULL, *d_n2 = NULL, *d_n3 = NULL;
    st = dev_put(gctx, &d_x2, (size_t)B * K * 2, x);
    if (st == PKV_OK) st = dev_put(gctx, &d_n2, (size_t)B * K * 2, NULL);
    if (st == PKV_OK) st = dev_put(gctx, &d_n3, (size_t)B * K * 2, NULL);
    CHECK_OK(st);
    if (st == PKV_OK) {
        CHECK_OK(pkv_op_add_rmsnorm(gpu, d_x2, d_norm, d_w, B, K, 1e-5, d_n2));
        CHECK_OK(pkv_op_rmsnorm(gpu, d_x, d_w, B, K, 1e-5, d_n3)); /* d_x: x + the norm, by the add above */
        CHECK_OK(pkv_ops_synchronize(gpu));
        uint16_t *g2 = malloc((size_t)B * K * 2);
        CHECK_OK(pkv_dev_copy_d2h(gctx, g, d_x2, (size_t)B * K * 2));
        CHECK_OK(pkv_dev_copy_d2h(gctx, g2, d_x, (size_t)B * K * 2));
        CHECK_MSG(memcmp(g, g2, (size_t)B * K * 2) == 0, "add_rmsnorm: the sum differs from add's");
        CHECK_OK(pkv_dev_copy_d2h(gctx, g, d_n2, (size_t)B * K * 2));
        CHECK_OK(pkv_dev_copy_d2h(gctx, g2, d_n3, (size_t)B * K * 2));
        CHECK_MSG(memcmp(g, g2, (size_t)B * K * 2) == 0, "add_rmsnorm: the norm differs from add then rmsnorm");
        far = 0;
        for (int i = 0; i < B * K; i++) far += !near_bf16(bf(g[i]), bf(c_norm2[i]), 1.0);
        CHECK_MSG(far == 0, "add_rmsnorm: %d values differ from the CPU's by more than one rounding", far);
        free(g2);
    }
    void *bufs[] = {d_x, d_w, d_W, d_qkv, d_gu, d_norm, d_y, d_act, d_pos, d_inv, d_am, d_x2, d_n2, d_n3};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) pkv_dev_free(gctx, bufs[i]);
    free(x), free(w), free(W), free(qkv), free(gu), free(c_norm), free(c_y), free(c_qkv), free(c_act), free(c_add);
    free(c_add2), free(c_norm2);
    free(g);
    pkv_ops_free(gpu);
}

int main(void) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 20261206);
    pkv_model_shape s;
    CHECK_OK(pkv_model_shape_named("llama3-8b", &s));
    CHECK(s.hidden == 4096 && s.q_heads == 32 && s.kv_heads == 8 && s.head_dim == 128 && s.mlp == 14336 &&
          s.layers == 32);
    CHECK_OK(pkv_model_shape_check(&s));
    static const char *names[] = {"qwen2.5-32b", "llama3.1-70b", "hf-small", "tiny"};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(pkv_model_shape_named(names[i], &s));
        CHECK_OK(pkv_model_shape_check(&s));
    }
    CHECK_STATUS(pkv_model_shape_named("gpt5", &s), PKV_ERR_INVALID_ARGUMENT);
    s.head_dim = 96;
    CHECK_STATUS(pkv_model_shape_check(&s), PKV_ERR_UNSUPPORTED);

    pkv_context_config cc;
    pkv_context_config_default(&cc);
    cc.backend = PKV_BACKEND_CPU;
    cc.num_threads = 1;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cc, &ctx));
    pkv_ops *ops = NULL;
    CHECK_OK(pkv_ops_create(ctx, NULL, &ops));
    if (ops) cpu_ops(ops, &rng);
    if (pkv_cuda_available()) {
        cc.backend = PKV_BACKEND_CUDA;
        pkv_context *gctx = NULL;
        CHECK_OK(pkv_context_create(&cc, &gctx));
        if (gctx && ops) cuda_vs_cpu(ops, gctx, &rng);
        pkv_context_free(gctx);
    } else {
        printf("SKIP (part): no CUDA device: the CUDA ops against the CPU ops not run\n");
    }
    pkv_ops_free(ops);
    pkv_context_free(ctx);
    return pkv_test_finish("test_model");
}
