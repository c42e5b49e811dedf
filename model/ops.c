/* ops.c - model shapes and the layer ops (pkv_model.h): the CPU implementation, and the dispatch to the
 * CUDA one (ops_cuda.cu) for CUDA contexts. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "pkv_model.h"

#include "ops_internal.h"
#include "pkv_lab.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const pkv_model_shape kShapes[] = {
    {"llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0, 1e-5},
    {"qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064, 1000000.0, 1e-6},
    {"llama3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 500000.0, 1e-5},
    {"hf-small", 4, 1024, 16, 4, 64, 2816, 32000, 10000.0, 1e-6},
    {"tiny", 2, 256, 8, 2, 64, 512, 1000, 10000.0, 1e-6},
};

pkv_status pkv_model_shape_named(const char *name, pkv_model_shape *out) {
    if (!name || !out) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "name and out must not be NULL");
    for (size_t i = 0; i < sizeof kShapes / sizeof kShapes[0]; i++)
        if (strcmp(name, kShapes[i].name) == 0) {
            *out = kShapes[i];
            return PKV_OK;
        }
    return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT,
                        "unknown model '%s' (llama3-8b, qwen2.5-32b, llama3.1-70b, hf-small, tiny)", name);
}

pkv_status pkv_model_shape_check(const pkv_model_shape *s) {
    if (!s) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "shape is NULL");
    if (s->layers < 1 || s->hidden < 1 || s->mlp < 1 || s->vocab < 1 || s->q_heads < 1 || s->kv_heads < 1)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "model %s: layers, hidden, mlp, vocab and heads must be positive",
                            s->name);
    if (s->hidden % 8 || s->mlp % 8)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "model %s: hidden and mlp must be multiples of 8", s->name);
    if (!(s->rope_theta > 1.0) || !(s->rms_eps > 0.0))
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "model %s: rope_theta must be > 1 and rms_eps > 0", s->name);
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_qo_heads = s->q_heads;
    p.num_kv_heads = s->kv_heads;
    p.head_dim = s->head_dim;
    p.dtype = PKV_DTYPE_BF16;
    p.num_pages = 1;
    const int32_t indptr[1] = {0};
    const pkv_page_table empty = {0, indptr, NULL, NULL};
    if (pkv_check_page_table(&p, &empty) != PKV_OK)
        return pkv_lab_fail(PKV_ERR_UNSUPPORTED, "model %s: its attention is not one the library runs: %s", s->name,
                            pkv_last_error());
    return PKV_OK;
}

static inline float bf(uint16_t b) { return pkv_bf16_to_float(b); }
static inline uint16_t to_bf(float f) { return pkv_float_to_bf16(f); }

pkv_status pkv_ops_create(pkv_context *ctx, void *stream, pkv_ops **out) {
    if (!ctx || !out) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "context and out must not be NULL");
    *out = NULL;
    pkv_ops *ops = (pkv_ops *)calloc(1, sizeof *ops);
    if (!ops) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate the ops");
    ops->ctx = ctx;
    ops->cuda = pkv_context_backend(ctx) == PKV_BACKEND_CUDA;
    ops->stream = stream;
    if (ops->cuda) {
        const pkv_status st = pkv_cuda_ops_init(ops);
        if (st != PKV_OK) {
            free(ops);
            return st;
        }
    }
    *out = ops;
    return PKV_OK;
}

void pkv_ops_free(pkv_ops *ops) {
    if (!ops) return;
    if (ops->cuda) pkv_cuda_ops_release(ops);
    free(ops);
}

void *pkv_ops_stream(const pkv_ops *ops) { return ops ? ops->stream : NULL; }

pkv_status pkv_ops_capture_begin(pkv_ops *ops) {
    if (!ops) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "ops is NULL");
    if (!ops->cuda) return pkv_lab_fail(PKV_ERR_UNSUPPORTED, "CUDA graphs need the CUDA backend");
    if (ops->capturing) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "the ops' stream is already being captured");
    const pkv_status st = pkv_cuda_ops_capture_begin(ops);
    ops->capturing = st == PKV_OK;
    return st;
}

pkv_status pkv_ops_capture_end(pkv_ops *ops, void **graph) {
    if (!ops || !graph) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "ops and graph must not be NULL");
    *graph = NULL;
    if (!ops->capturing) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "the ops' stream is not being captured");
    ops->capturing = false;
    return pkv_cuda_ops_capture_end(ops, graph);
}

pkv_status pkv_ops_graph_launch(pkv_ops *ops, void *graph) {
    if (!ops || !graph) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "ops and graph must not be NULL");
    if (!ops->cuda) return pkv_lab_fail(PKV_ERR_UNSUPPORTED, "CUDA graphs need the CUDA backend");
    return pkv_cuda_ops_graph_launch(ops, graph);
}

void pkv_ops_graph_free(pkv_ops *ops, void *graph) {
    if (ops && ops->cuda && graph) pkv_cuda_ops_graph_free(graph);
}

double pkv_wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

pkv_status pkv_ops_mark(pkv_ops *ops, int part) {
    if (!ops) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "ops is NULL");
    if (ops->capturing) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "no timing marks inside a captured graph");
    if (ops->nmarks == PKV_MAX_MARKS) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "more than %d marks", PKV_MAX_MARKS);
    const int k = ops->nmarks;
    ops->part[k] = part;
    if (ops->cuda) {
        const pkv_status st = pkv_cuda_ops_mark(ops, k);
        if (st != PKV_OK) return st;
    } else {
        ops->wall[k] = pkv_wall_us();
    }
    ops->nmarks++;
    return PKV_OK;
}

pkv_status pkv_ops_take_times(pkv_ops *ops, double out[PKV_PARTS]) {
    if (!ops || !out) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "ops and out must not be NULL");
    for (int p = 0; p < PKV_PARTS; p++) out[p] = 0.0;
    pkv_status st = pkv_ops_synchronize(ops);
    for (int k = 0; st == PKV_OK && k + 1 < ops->nmarks; k++) {
        if (ops->part[k] < 0 || ops->part[k] >= PKV_PARTS) continue;
        double us = 0.0;
        if (ops->cuda) st = pkv_cuda_ops_elapsed(ops, k, &us);
        else us = ops->wall[k + 1] - ops->wall[k];
        out[ops->part[k]] += us;
    }
    ops->nmarks = 0;
    return st;
}

pkv_status pkv_ops_synchronize(pkv_ops *ops) {
    if (!ops) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "ops is NULL");
    return ops->cuda ? pkv_cuda_ops_synchronize(ops) : PKV_OK;
}

#define OPS_CHECK(cond, ...) \
    do {                     \
        if (!(cond)) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)

pkv_status pkv_op_embed(pkv_ops *ops, const uint16_t *table, int32_t vocab, int32_t hidden, const int32_t *tokens,
                        int32_t B, uint16_t *out) {
    OPS_CHECK(ops && table && tokens && out, "embed: NULL argument");
    OPS_CHECK(vocab > 0 && hidden > 0 && B >= 0, "embed: bad sizes");
    if (ops->cuda) return pkv_cuda_op_embed(ops, table, vocab, hidden, tokens, B, out);
    for (int32_t b = 0; b < B; b++) {
        OPS_CHECK(tokens[b] >= 0 && tokens[b] < vocab, "embed: token %d of row %d is not in [0, %d)", tokens[b], b,
                  vocab);
        memcpy(out + (int64_t)b * hidden, table + (int64_t)tokens[b] * hidden, (size_t)hidden * 2);
    }
    return PKV_OK;
}

pkv_status pkv_op_rmsnorm(pkv_ops *ops, const uint16_t *x, const uint16_t *w, int32_t B, int32_t n, double eps,
                          uint16_t *out) {
    OPS_CHECK(ops && x && w && out, "rmsnorm: NULL argument");
    OPS_CHECK(B >= 0 && n > 0 && eps > 0, "rmsnorm: bad sizes");
    if (ops->cuda) return pkv_cuda_op_rmsnorm(ops, x, w, B, n, (float)eps, out);
    for (int32_t b = 0; b < B; b++) {
        const uint16_t *xr = x + (int64_t)b * n;
        float ss = 0.0f;
        for (int32_t i = 0; i < n; i++) ss += bf(xr[i]) * bf(xr[i]);
        const float r = 1.0f / sqrtf(ss / (float)n + (float)eps);
        for (int32_t i = 0; i < n; i++) out[(int64_t)b * n + i] = to_bf(bf(w[i]) * bf(to_bf(bf(xr[i]) * r)));
    }
    return PKV_OK;
}

pkv_status pkv_op_add(pkv_ops *ops, uint16_t *x, const uint16_t *y, int64_t count) {
    OPS_CHECK(ops && x && y && count >= 0, "add: bad argument");
    if (ops->cuda) return pkv_cuda_op_add(ops, x, y, count);
    for (int64_t i = 0; i < count; i++) x[i] = to_bf(bf(x[i]) + bf(y[i]));
    return PKV_OK;
}

pkv_status pkv_op_add_rmsnorm(pkv_ops *ops, uint16_t *x, const uint16_t *y, const uint16_t *w, int32_t B, int32_t n,
                              double eps, uint16_t *out) {
    OPS_CHECK(ops && x && y && w && out, "add_rmsnorm: NULL argument");
    OPS_CHECK(B >= 0 && n > 0 && eps > 0, "add_rmsnorm: bad sizes");
    if (ops->cuda) return pkv_cuda_op_add_rmsnorm(ops, x, y, w, B, n, (float)eps, out);
    const pkv_status st = pkv_op_add(ops, x, y, (int64_t)B * n);
    return st != PKV_OK ? st : pkv_op_rmsnorm(ops, x, w, B, n, eps, out);
}

pkv_status pkv_op_gemm(pkv_ops *ops, const uint16_t *x, int64_t x_stride, const uint16_t *W, int32_t B, int32_t N,
                       int32_t K, uint16_t *y, int64_t y_stride) {
    OPS_CHECK(ops && x && W && y, "gemm: NULL argument");
    OPS_CHECK(B >= 0 && N > 0 && K > 0, "gemm: bad sizes");
    if (x_stride == 0) x_stride = K;
    if (y_stride == 0) y_stride = N;
    OPS_CHECK(x_stride >= K && y_stride >= N, "gemm: row strides below the row sizes");
    if (ops->cuda) return pkv_cuda_op_gemm(ops, x, x_stride, W, B, N, K, y, y_stride);
    float *xf = (float *)malloc((size_t)K * sizeof(float));
    if (!xf) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "gemm: out of memory");
    for (int32_t b = 0; b < B; b++) {
        for (int32_t k = 0; k < K; k++) xf[k] = bf(x[b * x_stride + k]);
        for (int32_t n = 0; n < N; n++) {
            const uint16_t *wr = W + (int64_t)n * K;
            float acc = 0.0f;
            for (int32_t k = 0; k < K; k++) acc += xf[k] * bf(wr[k]);
            y[b * y_stride + n] = to_bf(acc);
        }
    }
    free(xf);
    return PKV_OK;
}

void pkv_rope_inv_freq(double theta, int32_t head_dim, float *out) {
    for (int32_t i = 0; i < head_dim / 2; i++) out[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)head_dim);
}

pkv_status pkv_op_rope(pkv_ops *ops, uint16_t *qkv, const int32_t *positions, int32_t B, int32_t q_heads,
                       int32_t kv_heads, int32_t head_dim, const float *inv_freq) {
    OPS_CHECK(ops && qkv && positions && inv_freq, "rope: NULL argument");
    OPS_CHECK(B >= 0 && q_heads > 0 && kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0, "rope: bad sizes");
    if (ops->cuda) return pkv_cuda_op_rope(ops, qkv, positions, B, q_heads, kv_heads, head_dim, inv_freq);
    const int32_t half = head_dim / 2, heads = q_heads + kv_heads;
    const int64_t row = (int64_t)(q_heads + 2 * kv_heads) * head_dim;
    for (int32_t b = 0; b < B; b++) {
        for (int32_t i = 0; i < half; i++) {
            const float ang = (float)positions[b] * inv_freq[i];
            const float c = bf(to_bf(cosf(ang))), s = bf(to_bf(sinf(ang)));
            for (int32_t h = 0; h < heads; h++) {
                uint16_t *v = qkv + b * row + (int64_t)h * head_dim;
                const float x1 = bf(v[i]), x2 = bf(v[i + half]);
                v[i] = to_bf(bf(to_bf(x1 * c)) + bf(to_bf(-x2 * s)));
                v[i + half] = to_bf(bf(to_bf(x2 * c)) + bf(to_bf(x1 * s)));
            }
        }
    }
    return PKV_OK;
}

pkv_status pkv_op_silu_mul(pkv_ops *ops, const uint16_t *gu, int32_t B, int32_t mlp, uint16_t *out) {
    OPS_CHECK(ops && gu && out && B >= 0 && mlp > 0, "silu_mul: bad argument");
    if (ops->cuda) return pkv_cuda_op_silu_mul(ops, gu, B, mlp, out);
    for (int32_t b = 0; b < B; b++)
        for (int32_t i = 0; i < mlp; i++) {
            const float g = bf(gu[(int64_t)b * 2 * mlp + i]), u = bf(gu[(int64_t)b * 2 * mlp + mlp + i]);
            out[(int64_t)b * mlp + i] = to_bf(bf(to_bf(g / (1.0f + expf(-g)))) * u);
        }
    return PKV_OK;
}

pkv_status pkv_op_fill_uniform(pkv_ops *ops, uint16_t *p, int64_t count, float lo, float hi, uint64_t seed) {
    OPS_CHECK(ops && p && count >= 0 && lo <= hi, "fill_uniform: bad argument");
    if (ops->cuda) return pkv_cuda_op_fill_uniform(ops, p, count, lo, hi, seed);
    for (int64_t i = 0; i < count; i++) p[i] = to_bf(fmaf(hi - lo, pkv_fill_u(seed, (uint64_t)i), lo));
    return PKV_OK;
}

pkv_status pkv_op_fill_uniform_fp8(pkv_ops *ops, uint8_t *p, int64_t count, float lo, float hi, uint64_t seed,
                                   pkv_dtype dtype, float scale) {
    OPS_CHECK(ops && p && count >= 0 && lo <= hi && (dtype == PKV_DTYPE_FP8_E4M3 || dtype == PKV_DTYPE_FP8_E5M2) &&
                  scale > 0.0f && isfinite(scale),
              "fill_uniform_fp8: bad argument");
    const int e5m2 = dtype == PKV_DTYPE_FP8_E5M2;
    const float inv = 1.0f / scale;
    if (ops->cuda) return pkv_cuda_op_fill_uniform_fp8(ops, p, count, lo, hi, seed, e5m2, inv);
    for (int64_t i = 0; i < count; i++)
        p[i] = pkv_float_to_fp8(bf(to_bf(fmaf(hi - lo, pkv_fill_u(seed, (uint64_t)i), lo))) * inv, e5m2);
    return PKV_OK;
}

pkv_status pkv_ops_host_alloc(pkv_ops *ops, size_t bytes, void **out) {
    OPS_CHECK(ops && out, "host_alloc: bad argument");
    *out = NULL;
    if (ops->cuda) return pkv_cuda_ops_host_alloc(ops, bytes ? bytes : 16, out);
    *out = malloc(bytes ? bytes : 16);
    return *out ? PKV_OK : pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "ops: cannot allocate %zu bytes", bytes);
}

void pkv_ops_host_free(pkv_ops *ops, void *p) {
    if (!ops || !p) return;
    if (ops->cuda) pkv_cuda_ops_host_free(ops, p);
    else free(p);
}

pkv_status pkv_ops_upload(pkv_ops *ops, void *dst, const void *src, size_t bytes) {
    OPS_CHECK(ops && ((dst && src) || bytes == 0), "upload: bad argument");
    if (bytes == 0) return PKV_OK;
    if (ops->cuda) return pkv_cuda_ops_upload(ops, dst, src, bytes);
    memcpy(dst, src, bytes);
    return PKV_OK;
}

pkv_status pkv_op_scatter_i32(pkv_ops *ops, int32_t *dst, const int32_t *pairs, int32_t n) {
    OPS_CHECK(ops && dst && (pairs || n == 0) && n >= 0, "scatter_i32: bad argument");
    if (ops->cuda) return pkv_cuda_op_scatter_i32(ops, dst, pairs, n);
    for (int32_t k = 0; k < n; k++) dst[pairs[2 * k]] = pairs[2 * k + 1];
    return PKV_OK;
}

pkv_status pkv_op_argmax(pkv_ops *ops, const uint16_t *logits, int32_t B, int32_t vocab, int32_t *tokens) {
    OPS_CHECK(ops && logits && tokens && B >= 0 && vocab > 0, "argmax: bad argument");
    if (ops->cuda) return pkv_cuda_op_argmax(ops, logits, B, vocab, tokens);
    for (int32_t b = 0; b < B; b++) {
        int32_t best = 0;
        float bv = bf(logits[(int64_t)b * vocab]);
        for (int32_t i = 1; i < vocab; i++) {
            const float v = bf(logits[(int64_t)b * vocab + i]);
            if (v > bv || (isnan(v) && !isnan(bv))) best = i, bv = v; /* NaN wins, as torch.argmax */
        }
        tokens[b] = best;
    }
    return PKV_OK;
}
