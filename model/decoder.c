/* decoder.c - a Llama-style decoder around the attention engine (pkv_model.h): weights, a KV pool per layer
 * over the page manager's page ids, exact prefill, decode steps, timing by part. */
#include "pkv_model.h"

#include "ops_internal.h"
#include "pkv_lab.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the device's table holds at a batch position: the request whose ids it has, their count, and that
 * request's length when they were sent (cow: this step's extend copied the request's last page). */
typedef struct table_slot {
    int32_t req, np, len, cow;
} table_slot;

typedef struct layer_w {
    uint16_t *attn_norm, *wqkv, *wo, *mlp_norm, *wgu, *wd;
    void *k_cache, *v_cache; /* [num_pages, page_size, Hkv, d] of the pools' type (bf16, or fp8 codes) */
} layer_w;

struct pkv_decoder {
    pkv_context *ctx;
    pkv_ops *ops;
    bool cuda;
    pkv_decoder_config cfg;
    pkv_model_shape s;
    pkv_page_pool *pool;
    pkv_problem prob;  /* kv_dtype 0 (bf16 pools) or fp8 */
    size_t kv_elem;    /* the pools' element bytes */
    float kv_scale;    /* an fp8 pool's k_scale = v_scale (1 otherwise) */
    pkv_plan *plan;
    uint16_t *embed, *final_norm, *lm_head;
    layer_w *layers;
    float *inv_freq;
    int64_t qkv_row;                                   /* (Hq + 2 Hkv) d */
    uint16_t *x, *h, *qkv, *attn, *tmp, *gu, *act, *logits; /* [max_batch, ...] activations */
    int32_t *b_tokens, *b_positions, *b_next;           /* backend memory [max_batch] */
    int32_t *b_indptr, *b_lens, *b_aptr, *b_aindptr, *b_alens; /* attention table, append table */
    int32_t *b_indices, *b_aindices;                    /* backend memory, b_cap / ab_cap entries */
    int64_t b_cap, ab_cap;
    int32_t *h_indptr, *h_lens, *h_indices;             /* host copies of the attention table */
    int64_t h_cap;
    int32_t *pages;                                     /* a request's pages (host) */
    int64_t pages_cap;
    /* the decode steps' page table, kept between steps: batch position i's ids at b_slots[i x S ...) */
    int32_t S;                                          /* pages per row: ceil(max_len / page_size) */
    table_slot *slots;                                  /* host [max_batch] */
    int32_t *b_slots, *b_sindptr, *h_sindptr;           /* backend [max_batch x S]; the rows' offsets i x S */
    /* a decode step's inputs, staged for one upload: [lengths B | positions B | tokens B | (index, id) pairs of the
     * ids that changed]; host (page-locked on CUDA) and backend, stage_cap int32 each */
    int32_t *h_stage, *b_stage;
    int64_t stage_cap;
    pkv_page_copy *copies;                              /* host [max_batch]: the step's copy-on-write copies */
    const int32_t *attn_indices;                        /* the page ids attention reads this forward */
    void *ws;                                           /* plain plans' workspace (grown as a plan needs) */
    size_t ws_cap;
    void *step_ws;                                      /* the workspace of this forward's plan: ws or a bucket's */
    size_t step_ws_cap;
    double busy_us;                                     /* time inside backend calls (CALL) since cleared */
    /* cfg.graphs: per batch bucket k (rows min(2^k, max_batch)), the graph of its whole step, the workspace its
     * graph-stable plans are uploaded into, and how far it got: 0 never run, 1 run op by op once, 2 captured, 3 op
     * by op for good (its capture failed); graph_sig[k]: the launch signature of the plan it was captured with */
    int32_t nbuckets;
    uint8_t *bucket_state;
    void **graphs;                                      /* [nbuckets] */
    uint64_t *graph_sig;                                /* [nbuckets] */
    void **bucket_ws;                                   /* [nbuckets] */
    size_t *bucket_ws_cap;
    pkv_decoder_times last;
};

/* ---- backend memory ---------------------------------------------------------------------------------- */
static pkv_status balloc(pkv_decoder *d, size_t bytes, void *out) {
    void **p = (void **)out;
    if (d->cuda) return pkv_dev_malloc(d->ctx, bytes ? bytes : 16, p);
    *p = calloc(1, bytes ? bytes : 16);
    return *p ? PKV_OK : pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: cannot allocate %zu bytes", bytes);
}
static void bfree(pkv_decoder *d, void *p) {
    if (!p) return;
    if (d->cuda) pkv_dev_free(d->ctx, p);
    else free(p);
}
static pkv_status bput(pkv_decoder *d, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return PKV_OK;
    if (d->cuda) return pkv_dev_copy_h2d(d->ctx, dst, src, bytes);
    memcpy(dst, src, bytes);
    return PKV_OK;
}
static pkv_status bget(pkv_decoder *d, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return PKV_OK;
    if (d->cuda) return pkv_dev_copy_d2h(d->ctx, dst, src, bytes);
    memcpy(dst, src, bytes);
    return PKV_OK;
}
/* Grows a backend int32 array to hold n entries. */
static pkv_status bgrow(pkv_decoder *d, int32_t **p, int64_t *cap, int64_t n) {
    if (n <= *cap) return PKV_OK;
    bfree(d, *p);
    *p = NULL;
    *cap = 0;
    const int64_t c = n * 2;
    pkv_status st = balloc(d, (size_t)c * sizeof(int32_t), p);
    if (st == PKV_OK) *cap = c;
    return st;
}

#define TRY(expr)                         \
    do {                                  \
        const pkv_status st_ = (expr);    \
        if (st_ != PKV_OK) return st_;    \
    } while (0)

/* A timing mark of the ops (none while a graph is captured). */
#define MARK(part) TRY(d->ops->capturing ? PKV_OK : pkv_ops_mark(d->ops, (part)))

/* A call into the backend (an op, an append, a run, a copy), its time added to d->busy_us: on the CPU backend
 * the call computes before it returns, so that time is the backend's and the step's host time leaves it
 * out; on CUDA the call only queues work, and its time is host time. */
#define CALL(expr)                                   \
    do {                                             \
        const double c0_ = pkv_wall_us();            \
        const pkv_status st_ = (expr);               \
        d->busy_us += pkv_wall_us() - c0_;           \
        if (st_ != PKV_OK) return st_;               \
    } while (0)

void pkv_decoder_config_default(pkv_decoder_config *c, const pkv_model_shape *shape) {
    memset(c, 0, sizeof *c);
    if (shape) c->shape = *shape;
    c->page_size = 16;
    c->num_pages = 4096;
    c->max_batch = 128;
    c->max_requests = 1024;
    c->max_len = 32768;
    c->seed = 1;
    c->route = PKV_ROUTE_AUTO;
}

/* The weights' sizes in elements, in the order of the weights file. */
static int64_t w_qkv(const pkv_model_shape *s) { return (int64_t)(s->q_heads + 2 * s->kv_heads) * s->head_dim * s->hidden; }
static int64_t w_o(const pkv_model_shape *s) { return (int64_t)s->hidden * s->q_heads * s->head_dim; }
static int64_t w_gu(const pkv_model_shape *s) { return (int64_t)2 * s->mlp * s->hidden; }
static int64_t w_d(const pkv_model_shape *s) { return (int64_t)s->hidden * s->mlp; }

/* transformers' initializer_range 0.02, as a uniform of that standard deviation; norms at 1. */
#define W_HALF_RANGE 0.034641f
/* The pools' values before any append (what a synthetic prefill leaves): about a key's spread. */
#define KV_HALF_RANGE 2.0f

pkv_status pkv_decoder_create(pkv_context *ctx, const pkv_decoder_config *cfg, pkv_decoder **out) {
    if (!ctx || !cfg || !out) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "decoder: NULL argument");
    *out = NULL;
    TRY(pkv_model_shape_check(&cfg->shape));
    const bool fp8 = cfg->kv_dtype == PKV_DTYPE_FP8_E4M3 || cfg->kv_dtype == PKV_DTYPE_FP8_E5M2;
    if (!fp8 && cfg->kv_dtype != 0 && cfg->kv_dtype != PKV_DTYPE_BF16)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT,
                            "decoder: KV pools of dtype %d: bf16 (the model's), fp8_e4m3 or fp8_e5m2", (int)cfg->kv_dtype);
    if (!(cfg->kv_scale >= 0.0f && cfg->kv_scale <= 3.4e38f) || (!fp8 && cfg->kv_scale != 0.0f && cfg->kv_scale != 1.0f))
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT,
                            "decoder: KV scale %g (positive and finite, and for an fp8 pool only)", (double)cfg->kv_scale);
    if (cfg->page_size < 1 || cfg->page_size > 256 || cfg->num_pages < 1 || cfg->num_pages > INT32_MAX ||
        cfg->max_batch < 1 || cfg->max_requests < 1 || cfg->max_len < 1 || cfg->max_len > (1 << 30))
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "decoder: page size, pages, batch or requests out of range");
    pkv_decoder *d = (pkv_decoder *)calloc(1, sizeof *d);
    if (!d) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    d->ctx = ctx;
    d->cfg = *cfg;
    d->s = cfg->shape;
    d->cuda = pkv_context_backend(ctx) == PKV_BACKEND_CUDA;
    const pkv_model_shape *s = &d->s;
    pkv_status st = pkv_ops_create(ctx, NULL, &d->ops);
    if (st == PKV_OK) st = pkv_page_pool_create(cfg->num_pages, cfg->page_size, cfg->max_requests, &d->pool);
    if (st == PKV_OK) st = pkv_plan_create(&d->plan);
    pkv_problem_default(&d->prob);
    d->prob.num_qo_heads = s->q_heads;
    d->prob.num_kv_heads = s->kv_heads;
    d->prob.head_dim = s->head_dim;
    d->prob.page_size = cfg->page_size;
    d->prob.num_pages = cfg->num_pages;
    d->prob.layout = PKV_LAYOUT_NHD;
    d->prob.dtype = PKV_DTYPE_BF16;
    d->prob.kv_dtype = fp8 ? cfg->kv_dtype : (pkv_dtype)0;
    d->kv_elem = fp8 ? 1 : 2;
    d->kv_scale = cfg->kv_scale > 0.0f ? cfg->kv_scale : 1.0f;
    d->qkv_row = (int64_t)(s->q_heads + 2 * s->kv_heads) * s->head_dim;
    const int64_t B = cfg->max_batch, H = s->hidden, V = s->vocab;
    const int64_t pool_elems = cfg->num_pages * cfg->page_size * s->kv_heads * s->head_dim;
    d->layers = (layer_w *)calloc((size_t)s->layers, sizeof(layer_w));
    if (!d->layers && st == PKV_OK) st = pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    uint64_t seed = cfg->seed;
    const float a = W_HALF_RANGE;
#define ALLOC_FILL(ptr, n, lo, hi)                                                                    \
    if (st == PKV_OK) st = balloc(d, (size_t)(n) * 2, &(ptr));                                       \
    if (st == PKV_OK) st = pkv_op_fill_uniform(d->ops, (ptr), (n), (lo), (hi), seed++)
    ALLOC_FILL(d->embed, V * H, -a, a);
    for (int32_t l = 0; l < s->layers; l++) {
        layer_w *w = &d->layers[l];
        ALLOC_FILL(w->attn_norm, H, 1.0f, 1.0f);
        ALLOC_FILL(w->wqkv, w_qkv(s), -a, a);
        ALLOC_FILL(w->wo, w_o(s), -a, a);
        ALLOC_FILL(w->mlp_norm, H, 1.0f, 1.0f);
        ALLOC_FILL(w->wgu, w_gu(s), -a, a);
        ALLOC_FILL(w->wd, w_d(s), -a, a);
        if (fp8) {
            void **pools[2] = {&w->k_cache, &w->v_cache};
            for (int k = 0; k < 2; k++) {
                if (st == PKV_OK) st = balloc(d, (size_t)pool_elems, pools[k]);
                if (st == PKV_OK)
                    st = pkv_op_fill_uniform_fp8(d->ops, (uint8_t *)*pools[k], pool_elems, -KV_HALF_RANGE, KV_HALF_RANGE,
                                                 seed++, cfg->kv_dtype, d->kv_scale);
            }
        } else {
            ALLOC_FILL(w->k_cache, pool_elems, -KV_HALF_RANGE, KV_HALF_RANGE);
            ALLOC_FILL(w->v_cache, pool_elems, -KV_HALF_RANGE, KV_HALF_RANGE);
        }
    }
    ALLOC_FILL(d->final_norm, H, 1.0f, 1.0f);
    ALLOC_FILL(d->lm_head, V * H, -a, a);
#undef ALLOC_FILL
    float inv[128];
    pkv_rope_inv_freq(s->rope_theta, s->head_dim, inv);
    if (st == PKV_OK) st = balloc(d, sizeof(float) * (size_t)s->head_dim / 2, &d->inv_freq);
    if (st == PKV_OK) st = bput(d, d->inv_freq, inv, sizeof(float) * (size_t)s->head_dim / 2);
    const int64_t mlp = s->mlp, qd = (int64_t)s->q_heads * s->head_dim;
    if (st == PKV_OK) st = balloc(d, (size_t)(B * H * 2), &d->x);
    if (st == PKV_OK) st = balloc(d, (size_t)(B * H * 2), &d->h);
    if (st == PKV_OK) st = balloc(d, (size_t)(B * d->qkv_row * 2), &d->qkv);
    if (st == PKV_OK) st = balloc(d, (size_t)(B * qd * 2), &d->attn);
    if (st == PKV_OK) st = balloc(d, (size_t)(B * H * 2), &d->tmp);
    if (st == PKV_OK) st = balloc(d, (size_t)(B * 2 * mlp * 2), &d->gu);
    if (st == PKV_OK) st = balloc(d, (size_t)(B * mlp * 2), &d->act);
    if (st == PKV_OK) st = balloc(d, (size_t)(B * V * 2), &d->logits);
    if (st == PKV_OK) st = balloc(d, (size_t)B * 4, &d->b_tokens);
    if (st == PKV_OK) st = balloc(d, (size_t)B * 4, &d->b_positions);
    if (st == PKV_OK) st = balloc(d, (size_t)B * 4, &d->b_next);
    if (st == PKV_OK) st = balloc(d, (size_t)(B + 1) * 4, &d->b_indptr);
    if (st == PKV_OK) st = balloc(d, (size_t)B * 4, &d->b_lens);
    if (st == PKV_OK) st = balloc(d, (size_t)(B + 1) * 4, &d->b_aptr);
    if (st == PKV_OK) st = balloc(d, (size_t)(B + 1) * 4, &d->b_aindptr);
    if (st == PKV_OK) st = balloc(d, (size_t)B * 4, &d->b_alens);
    d->S = (int32_t)(((int64_t)cfg->max_len + cfg->page_size - 1) / cfg->page_size);
    if ((int64_t)d->S * B > INT32_MAX && st == PKV_OK)
        st = pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "decoder: max_batch x pages per row above 2^31");
    d->stage_cap = 3 * B + 2 * (int64_t)B * d->S;
    if (st == PKV_OK) st = balloc(d, (size_t)B * d->S * 4, &d->b_slots);
    if (st == PKV_OK) st = balloc(d, (size_t)(B + 1) * 4, &d->b_sindptr);
    if (st == PKV_OK) st = balloc(d, (size_t)d->stage_cap * 4, &d->b_stage);
    if (st == PKV_OK) st = pkv_ops_host_alloc(d->ops, (size_t)d->stage_cap * 4, (void **)&d->h_stage);
    while (((int64_t)1 << d->nbuckets) < B) d->nbuckets++;
    d->nbuckets++;
    d->bucket_state = (uint8_t *)calloc((size_t)d->nbuckets, 1);
    d->graphs = (void **)calloc((size_t)d->nbuckets, sizeof(void *));
    d->graph_sig = (uint64_t *)calloc((size_t)d->nbuckets, sizeof(uint64_t));
    d->bucket_ws = (void **)calloc((size_t)d->nbuckets, sizeof(void *));
    d->bucket_ws_cap = (size_t *)calloc((size_t)d->nbuckets, sizeof(size_t));
    if (st == PKV_OK && (!d->bucket_state || !d->graphs || !d->graph_sig || !d->bucket_ws || !d->bucket_ws_cap))
        st = pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    if (st == PKV_OK && cfg->graphs != 0 && cfg->graphs != 1)
        st = pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "decoder: graphs %d (0 or 1)", cfg->graphs);
    if (st == PKV_OK && cfg->graphs && cfg->route != PKV_ROUTE_AUTO && cfg->route != PKV_ROUTE_WORKQUEUE)
        st = pkv_lab_fail(PKV_ERR_UNSUPPORTED,
                          "decoder: whole steps in graphs plan graph-stable steps, whose route is the work queue "
                          "(route auto or workqueue, not %d)", (int)cfg->route);
    d->slots = (table_slot *)malloc((size_t)B * sizeof(table_slot));
    d->copies = (pkv_page_copy *)malloc((size_t)B * sizeof(pkv_page_copy));
    d->h_indptr = (int32_t *)malloc((size_t)(B + 1) * 4);
    d->h_sindptr = (int32_t *)malloc((size_t)(B + 1) * 4);
    d->h_lens = (int32_t *)malloc((size_t)B * 4);
    if (st == PKV_OK && (!d->h_indptr || !d->h_sindptr || !d->h_lens || !d->slots || !d->copies))
        st = pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    if (st == PKV_OK) {
        for (int64_t i = 0; i <= B; i++) d->h_sindptr[i] = (int32_t)(i * d->S); /* the strided rows */
        st = bput(d, d->b_sindptr, d->h_sindptr, (size_t)(B + 1) * 4);
        for (int64_t i = 0; i < B; i++) d->slots[i] = (table_slot){-1, 0, 0, 0};
        /* every id valid before any step writes it: page 0 (never read past a row's length) */
        if (st == PKV_OK) st = pkv_op_fill_uniform(d->ops, (uint16_t *)d->b_slots, (int64_t)B * d->S * 2, 0.0f, 0.0f, 0);
    }
    if (st == PKV_OK) st = pkv_ops_synchronize(d->ops);
    if (st != PKV_OK) {
        pkv_decoder_free(d);
        return st;
    }
    *out = d;
    return PKV_OK;
}

void pkv_decoder_free(pkv_decoder *d) {
    if (!d) return;
    if (d->layers)
        for (int32_t l = 0; l < d->s.layers; l++) {
            layer_w *w = &d->layers[l];
            bfree(d, w->attn_norm), bfree(d, w->wqkv), bfree(d, w->wo), bfree(d, w->mlp_norm);
            bfree(d, w->wgu), bfree(d, w->wd), bfree(d, w->k_cache), bfree(d, w->v_cache);
        }
    free(d->layers);
    if (d->graphs)
        for (int32_t k = 0; k < d->nbuckets; k++) pkv_ops_graph_free(d->ops, d->graphs[k]);
    free(d->graphs), free(d->graph_sig), free(d->bucket_state);
    if (d->bucket_ws)
        for (int32_t k = 0; k < d->nbuckets; k++) bfree(d, d->bucket_ws[k]);
    free(d->bucket_ws), free(d->bucket_ws_cap);
    void *bufs[] = {d->embed, d->final_norm, d->lm_head, d->inv_freq, d->x, d->h, d->qkv, d->attn, d->tmp, d->gu,
                    d->act, d->logits, d->b_tokens, d->b_positions, d->b_next, d->b_indptr, d->b_lens, d->b_aptr,
                    d->b_aindptr, d->b_alens, d->b_indices, d->b_aindices, d->ws, d->b_slots, d->b_sindptr,
                    d->b_stage};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) bfree(d, bufs[i]);
    free(d->h_indptr), free(d->h_lens), free(d->h_indices), free(d->pages);
    free(d->slots), free(d->copies), free(d->h_sindptr);
    pkv_ops_host_free(d->ops, d->h_stage);
    pkv_plan_free(d->plan);
    pkv_page_pool_free(d->pool);
    pkv_ops_free(d->ops);
    free(d);
}

pkv_page_pool *pkv_decoder_pool(pkv_decoder *d) { return d ? d->pool : NULL; }
int64_t pkv_decoder_kv_bytes(const pkv_decoder *d) {
    if (!d) return 0;
    return (int64_t)d->s.layers * 2 * d->cfg.num_pages * d->cfg.page_size * d->s.kv_heads * d->s.head_dim *
           (int64_t)d->kv_elem;
}
const pkv_plan *pkv_decoder_plan(const pkv_decoder *d) { return d ? d->plan : NULL; }
const int32_t *pkv_decoder_table(const pkv_decoder *d, int32_t *stride) {
    if (stride) *stride = d ? d->S : 0;
    return d ? d->b_slots : NULL;
}

pkv_status pkv_decoder_load_weights(pkv_decoder *d, const char *path) {
    if (!d || !path) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "decoder: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f) return pkv_lab_fail(PKV_ERR_IO, "%s: cannot open", path);
    char magic[4];
    int32_t dims[7];
    const pkv_model_shape *s = &d->s;
    const int32_t want[7] = {s->layers, s->hidden, s->q_heads, s->kv_heads, s->head_dim, s->mlp, s->vocab};
    if (fread(magic, 1, 4, f) != 4 || memcmp(magic, "PKVW", 4) != 0 || fread(dims, 4, 7, f) != 7) {
        fclose(f);
        return pkv_lab_fail(PKV_ERR_PARSE, "%s: not a weights file (PKVW header)", path);
    }
    if (memcmp(dims, want, sizeof want) != 0) {
        fclose(f);
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT,
                            "%s: shape %d layers, hidden %d, heads %d/%d of %d, mlp %d, vocab %d is not model %s's",
                            path, dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], s->name);
    }
    const int64_t H = s->hidden;
    int64_t biggest = (int64_t)s->vocab * H;
    if (w_gu(s) > biggest) biggest = w_gu(s);
    uint16_t *buf = (uint16_t *)malloc((size_t)biggest * 2);
    pkv_status st = buf ? PKV_OK : pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
#define READ(dst, n)                                                                                      \
    if (st == PKV_OK && fread(buf, 2, (size_t)(n), f) != (size_t)(n))                                    \
        st = pkv_lab_fail(PKV_ERR_PARSE, "%s: ends early (%s)", path, #dst);                             \
    if (st == PKV_OK) st = bput(d, (dst), buf, (size_t)(n) * 2)
    READ(d->embed, (int64_t)s->vocab * H);
    for (int32_t l = 0; l < s->layers; l++) {
        layer_w *w = &d->layers[l];
        READ(w->attn_norm, H);
        READ(w->wqkv, w_qkv(s));
        READ(w->wo, w_o(s));
        READ(w->mlp_norm, H);
        READ(w->wgu, w_gu(s));
        READ(w->wd, w_d(s));
    }
    READ(d->final_norm, H);
    READ(d->lm_head, (int64_t)s->vocab * H);
#undef READ
    if (st == PKV_OK && fgetc(f) != EOF) st = pkv_lab_fail(PKV_ERR_PARSE, "%s: longer than the model's weights", path);
    free(buf);
    fclose(f);
    return st;
}

/* The model over R rows already embedded in x at positions (backend int32 [R]): every layer (the step's K and V
 * appended by the append table in the backend arrays, attention by d->plan over the attention table), then
 * the final norm, the LM head and the greedy token of the rows [out_row, out_row + out_n). */
typedef struct append_table {
    int32_t rows;
    const int32_t *indptr, *indices, *lens, *aptr; /* backend memory; aptr NULL: the decode form */
} append_table;

/* Room in the workspace for d->plan. */
/* The plain plans' workspace, grown to what the plan needs, as this forward's. */
static pkv_status ensure_ws(pkv_decoder *d) {
    const size_t need = pkv_plan_workspace_size(d->plan);
    if (need > d->ws_cap) {
        bfree(d, d->ws);
        d->ws = NULL;
        d->ws_cap = 0;
        TRY(balloc(d, need, &d->ws));
        d->ws_cap = need;
    }
    d->step_ws = d->ws;
    d->step_ws_cap = d->ws_cap;
    return PKV_OK;
}

/* Bucket k's workspace as this step's (cfg.graphs): allocated at the bucket's first step, for any
 * graph-stable plan of its rows (a graph captured over it replays every later step's plan, so it never moves). */
static pkv_status bucket_ws(pkv_decoder *d, int32_t k, const pkv_plan_options *opts, int32_t Bs) {
    if (!d->bucket_ws[k]) {
        size_t need = 0;
        TRY(pkv_workspace_size(d->ctx, &d->prob, Bs, opts, &need));
        TRY(balloc(d, need, &d->bucket_ws[k]));
        d->bucket_ws_cap[k] = need;
    }
    if (pkv_plan_workspace_size(d->plan) > d->bucket_ws_cap[k])
        return pkv_lab_fail(PKV_ERR_WORKSPACE_TOO_SMALL, "decoder: a graph-stable plan above its bucket's workspace");
    d->step_ws = d->bucket_ws[k];
    d->step_ws_cap = d->bucket_ws_cap[k];
    return PKV_OK;
}

/* Layer l up to its attention: RMSNorm (after layer l - 1's MLP output, left in tmp, is added to the residual
 * stream: one pass), the QKV GEMM, RoPE, and the rows' K and V appended (at: the append's table, atok tokens; the
 * activations' R rows). */
static pkv_status layer_pre(pkv_decoder *d, int32_t l, int32_t R, const append_table *at, int32_t atok,
                            const int32_t *positions) {
    const pkv_model_shape *s = &d->s;
    const int64_t H = s->hidden, qd = (int64_t)s->q_heads * s->head_dim, kvd = (int64_t)s->kv_heads * s->head_dim;
    pkv_ops *o = d->ops;
    const layer_w *w = &d->layers[l];
    MARK(PKV_PART_OTHER);
    if (l == 0) CALL(pkv_op_rmsnorm(o, d->x, w->attn_norm, R, (int32_t)H, s->rms_eps, d->h));
    else CALL(pkv_op_add_rmsnorm(o, d->x, d->tmp, w->attn_norm, R, (int32_t)H, s->rms_eps, d->h));
    MARK(PKV_PART_GEMM);
    CALL(pkv_op_gemm(o, d->h, 0, w->wqkv, R, (int32_t)d->qkv_row, (int32_t)H, d->qkv, 0));
    MARK(PKV_PART_OTHER);
    CALL(pkv_op_rope(o, d->qkv, positions, R, s->q_heads, s->kv_heads, s->head_dim, d->inv_freq));
    MARK(PKV_PART_APPEND);
    pkv_append_tensors a;
    memset(&a, 0, sizeof a);
    a.k = d->qkv + qd;
    a.v = d->qkv + qd + kvd;
    a.k_token_stride = a.v_token_stride = d->qkv_row;
    a.k_cache = w->k_cache;
    a.v_cache = w->v_cache;
    a.kv_indptr = at->indptr;
    a.kv_page_indices = at->indices;
    a.seq_lens = at->lens;
    a.append_indptr = at->aptr;
    a.k_scale = a.v_scale = d->kv_scale; /* an fp8 pool's (a bf16 one takes 1) */
    CALL(pkv_append_kv(d->ctx, &d->prob, at->rows, atok, &a, pkv_ops_stream(o)));
    return PKV_OK;
}

/* Layer l's attention: the plan's rows, q read in place from the QKV output. */
static pkv_status layer_attention(pkv_decoder *d, int32_t l) {
    const layer_w *w = &d->layers[l];
    MARK(PKV_PART_ATTENTION);
    pkv_tensors t;
    memset(&t, 0, sizeof t);
    t.q = d->qkv;
    t.q_row_stride = d->qkv_row;
    t.k_cache = w->k_cache;
    t.v_cache = w->v_cache;
    t.kv_page_indices = d->attn_indices;
    t.o = d->attn;
    t.k_scale = t.v_scale = d->kv_scale;
    CALL(pkv_run(d->ctx, d->plan, d->step_ws, d->step_ws_cap, &t, pkv_ops_stream(d->ops)));
    return PKV_OK;
}

/* Layer l after its attention: the O GEMM, the residual and RMSNorm, the SwiGLU MLP; its output is left in tmp, for
 * the next layer's (or the head's) norm to add to the residual stream. */
static pkv_status layer_post(pkv_decoder *d, int32_t l, int32_t R) {
    const pkv_model_shape *s = &d->s;
    const int64_t H = s->hidden, qd = (int64_t)s->q_heads * s->head_dim;
    pkv_ops *o = d->ops;
    const layer_w *w = &d->layers[l];
    MARK(PKV_PART_GEMM);
    CALL(pkv_op_gemm(o, d->attn, 0, w->wo, R, (int32_t)H, (int32_t)qd, d->tmp, 0));
    MARK(PKV_PART_OTHER);
    CALL(pkv_op_add_rmsnorm(o, d->x, d->tmp, w->mlp_norm, R, (int32_t)H, s->rms_eps, d->h));
    MARK(PKV_PART_GEMM);
    CALL(pkv_op_gemm(o, d->h, 0, w->wgu, R, 2 * s->mlp, (int32_t)H, d->gu, 0));
    MARK(PKV_PART_OTHER);
    CALL(pkv_op_silu_mul(o, d->gu, R, s->mlp, d->act));
    MARK(PKV_PART_GEMM);
    CALL(pkv_op_gemm(o, d->act, 0, w->wd, R, (int32_t)H, s->mlp, d->tmp, 0));
    return PKV_OK;
}

/* The last layer's residual, the final norm, the LM head and the greedy tokens of rows [out_row, out_row + out_n)
 * (the other rows' residual is not needed again). */
static pkv_status model_head(pkv_decoder *d, int32_t out_row, int32_t out_n) {
    const pkv_model_shape *s = &d->s;
    const int64_t H = s->hidden;
    pkv_ops *o = d->ops;
    MARK(PKV_PART_OTHER);
    CALL(pkv_op_add_rmsnorm(o, d->x + (int64_t)out_row * H, d->tmp + (int64_t)out_row * H, d->final_norm, out_n,
                            (int32_t)H, s->rms_eps, d->h));
    MARK(PKV_PART_GEMM);
    CALL(pkv_op_gemm(o, d->h, 0, d->lm_head, out_n, s->vocab, (int32_t)H, d->logits, 0));
    MARK(PKV_PART_OTHER);
    CALL(pkv_op_argmax(o, d->logits, out_n, s->vocab, d->b_next));
    return PKV_OK;
}

/* Every layer over R rows (the append's table at, R tokens), then the head over out_n rows from out_row (none
 * when out_n is 0). */
static pkv_status forward(pkv_decoder *d, int32_t R, const append_table *at, const int32_t *positions, int32_t out_row,
                          int32_t out_n) {
    TRY(ensure_ws(d));
    for (int32_t l = 0; l < d->s.layers; l++) {
        TRY(layer_pre(d, l, R, at, R, positions));
        TRY(layer_attention(d, l));
        TRY(layer_post(d, l, R));
    }
    if (out_n > 0) TRY(model_head(d, out_row, out_n));
    MARK(-1);
    return PKV_OK;
}

/* The rows a decode step of B requests stages and runs: in graphs (cfg.graphs) its batch bucket's, B rounded up to
 * a power of two, at most max_batch (*bucket: the bucket's index); else B (*bucket -1). */
static int32_t step_rows(const pkv_decoder *d, int32_t B, int32_t *bucket) {
    *bucket = -1;
    if (!d->cfg.graphs) return B;
    int32_t k = 0;
    while (((int64_t)1 << k) < B) k++;
    *bucket = k;
    return ((int64_t)1 << k) < d->cfg.max_batch ? (int32_t)1 << k : d->cfg.max_batch;
}

/* A whole decode step over bucket k's Bs rows (B live; at: the append's table): the embedding, every layer with its
 * attention, the head. */
static pkv_status whole_step(pkv_decoder *d, int32_t Bs, const append_table *at, const int32_t *positions,
                             const int32_t *tokens) {
    MARK(PKV_PART_OTHER);
    CALL(pkv_op_embed(d->ops, d->embed, d->s.vocab, d->s.hidden, tokens, Bs, d->x));
    for (int32_t l = 0; l < d->s.layers; l++) {
        TRY(layer_pre(d, l, Bs, at, at->rows, positions));
        TRY(layer_attention(d, l));
        TRY(layer_post(d, l, Bs));
    }
    return model_head(d, 0, Bs);
}

/* A decode step's model work as one graph (cfg.graphs): B live rows padded to bucket k's Bs, attention from the
 * step's graph-stable plan, already uploaded into the bucket's workspace (host_step).  The bucket's first step runs
 * op by op, its second is captured (nothing runs while it is) and launched, every later one replays - while the
 * plan's launch signature is the one captured (else the bucket is captured again).  A bucket whose capture fails
 * runs op by op from then on (the step that failed too: nothing ran while capturing). */
static pkv_status launch_graphed(pkv_decoder *d, int32_t B, int32_t Bs, int32_t k) {
    const int32_t *lens = d->b_stage, *positions = lens + Bs, *tokens = positions + Bs;
    /* the append over the padded rows on CUDA (its kernel skips a row of length 0, so a graph has one launch
     * whatever B is); the CPU's append refuses such a row, and nothing there is captured: the B rows */
    const append_table at = {d->cuda ? Bs : B, d->b_sindptr, d->b_slots, lens, NULL};
    uint8_t *state = &d->bucket_state[k];
    void **g = &d->graphs[k];
    const uint64_t sig = pkv_plan_graph_signature(d->plan);
    if (*state == 2 && d->graph_sig[k] != sig) { /* another launch: the graph would not replay this plan */
        pkv_ops_graph_free(d->ops, *g);
        *g = NULL;
        *state = 1;
    }
    if (d->cuda && *state == 1) {
        const pkv_status bs = pkv_ops_capture_begin(d->ops);
        const pkv_status ps = bs == PKV_OK ? whole_step(d, Bs, &at, positions, tokens) : bs;
        void *graph = NULL;
        const pkv_status es = bs == PKV_OK ? pkv_ops_capture_end(d->ops, &graph) : bs; /* ends it whatever the step did */
        if (ps == PKV_OK && es == PKV_OK) {
            *g = graph;
            d->graph_sig[k] = sig;
            *state = 2;
        } else {
            pkv_ops_graph_free(d->ops, graph);
            *state = 3;
        }
    }
    if (*state == 2) {
        MARK(PKV_PART_GRAPHED);
        CALL(pkv_ops_graph_launch(d->ops, *g));
    } else {
        TRY(whole_step(d, Bs, &at, positions, tokens));
    }
    MARK(-1);
    if (d->cuda && *state == 0) *state = 1;
    return PKV_OK;
}

/* The greedy tokens (and logits, as floats) of the last forward's out_n rows, to the host. */
static pkv_status results(pkv_decoder *d, int32_t out_n, int32_t *next, float *logits_out) {
    TRY(bget(d, next, d->b_next, (size_t)out_n * 4));
    if (!logits_out) return PKV_OK;
    const int64_t n = (int64_t)out_n * d->s.vocab;
    uint16_t *h = (uint16_t *)malloc((size_t)n * 2);
    if (!h) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    pkv_status st = bget(d, h, d->logits, (size_t)n * 2);
    for (int64_t i = 0; st == PKV_OK && i < n; i++) logits_out[i] = pkv_bf16_to_float(h[i]);
    free(h);
    return st;
}

/* The last step's times: the device parts from the ops' marks, the host parts as given (h: its host_*
 * fields), host_us their sum. */
static void finish_times(pkv_decoder *d, double t0, const pkv_decoder_times *h) {
    double parts[PKV_PARTS];
    if (pkv_ops_take_times(d->ops, parts) != PKV_OK) memset(parts, 0, sizeof parts);
    pkv_decoder_times *t = &d->last;
    *t = *h;
    t->attention_us = parts[PKV_PART_ATTENTION];
    t->append_us = parts[PKV_PART_APPEND];
    t->gemm_us = parts[PKV_PART_GEMM];
    t->other_us = parts[PKV_PART_OTHER];
    t->graphed_us = parts[PKV_PART_GRAPHED];
    t->host_us = h->host_extend_us + h->host_table_us + h->host_plan_us + h->host_stage_us + h->host_launch_us;
    t->step_us = pkv_wall_us() - t0;
}

/* A request id that starts over (created, or freed): no batch position keeps its ids. */
static void forget(pkv_decoder *d, int32_t req) {
    for (int32_t i = 0; i < d->cfg.max_batch; i++)
        if (d->slots[i].req == req) d->slots[i] = (table_slot){-1, 0, 0, 0};
}

void pkv_decoder_last_times(const pkv_decoder *d, pkv_decoder_times *t) {
    if (d && t) *t = d->last;
}

/* The host half of a decode step (h: its host_* times): a token's room for each request (the copy-on-write
 * copies it hands out in d->copies, *ncopies), the rows' lengths and the page ids that changed, the plan, and
 * the step's inputs and plan on their way to the backend (queued; *npairs: the changed ids).  A failure leaves
 * the requests grown by the token. */
static pkv_status host_step(pkv_decoder *d, const int32_t *reqs, const int32_t *tokens, int32_t B, int32_t Bs,
                            int32_t bucket, int32_t *ncopies_out, int32_t *npairs_out, pkv_decoder_times *h) {
    const double t0 = pkv_wall_us();
    int32_t *ncopies = ncopies_out; /* kept current: the copies handed out must run even if a later row fails */
    *ncopies = 0;
    for (int32_t i = 0; i < B; i++) {
        TRY(pkv_request_extend(d->pool, reqs[i], 1, &d->copies[*ncopies]));
        d->slots[i].cow = d->copies[*ncopies].src_page >= 0; /* a forked request's shared partial page: its copy */
        *ncopies += d->slots[i].cow;
    }
    const double t1 = pkv_wall_us();
    h->host_extend_us = t1 - t0;
    /* the rows' lengths and positions, and the ids that changed at each batch position since the last step: a
     * page the step added, the last page too where the step copied it, the whole row where another request
     * took the position or where the request's length is not the last step's plus one (it was changed
     * outside the steps) */
    int32_t *lens = d->h_stage, *positions = lens + Bs, *pairs = positions + 2 * Bs;
    const int32_t ps = d->cfg.page_size;
    const double inv_ps = 1.0 / ps;
    int32_t npairs = 0;
    for (int32_t i = 0; i < B; i++) {
        table_slot *t = &d->slots[i];
        int32_t len = 0;
        TRY(pkv_request_length(d->pool, reqs[i], &len));
        /* a request holds ceil(len / page_size) pages (the page manager's invariant); the division exact by
         * the reciprocal (len < 2^31) */
        int32_t np = (int32_t)(((double)len + (ps - 0.5)) * inv_ps);
        if (np > d->S)
            return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "decoder step: request %d holds %d pages, above max_len's %d",
                                reqs[i], np, d->S);
        int32_t first = 0; /* the first id to send */
        if (t->req == reqs[i] && len == t->len + 1 && !t->cow) first = t->np < np ? t->np : np;
        else if (t->req == reqs[i] && len == t->len + 1) first = t->np - 1 > 0 ? t->np - 1 : 0;
        if (first < np) {
            /* the ids into the upper half of this row's room, then spread into (index, id) pairs in place (pair
             * j is written after id j is read, and never over an id not read yet) */
            int32_t *dst = pairs + 2 * (int64_t)npairs + (int64_t)(np - first);
            TRY(pkv_request_pages_from(d->pool, reqs[i], first, dst, np - first, &np));
            for (int32_t j = 0; j < np - first; j++) {
                const int32_t id = dst[j];
                pairs[2 * (int64_t)(npairs + j)] = i * d->S + first + j;
                pairs[2 * (int64_t)(npairs + j) + 1] = id;
            }
            npairs += np - first;
        }
        t->req = reqs[i];
        t->np = np;
        t->len = len;
        lens[i] = len;
        positions[i] = len - 1;
    }
    *npairs_out = npairs;
    const double t2 = pkv_wall_us();
    h->host_table_us = t2 - t1;
    const pkv_page_table table = {B, d->h_sindptr, NULL, lens}; /* the manager's ids: valid by construction */
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.route = d->cfg.route;
    if (d->cfg.graphs) opts.graph_max_batch = Bs; /* the bucket's rows: one launch signature for all its steps */
    TRY(pkv_plan_step(d->ctx, &d->prob, &table, &opts, d->plan));
    const double t3 = pkv_wall_us();
    h->host_plan_us = t3 - t2;
    /* the tokens beside the lengths, positions and changes: one upload; the plan's own (pkv_run would make it
     * at the first layer) */
    memcpy(positions + Bs, tokens, (size_t)B * 4);
    for (int32_t i = B; i < Bs; i++) lens[i] = positions[i] = positions[Bs + i] = 0; /* padding rows (cfg.graphs) */
    TRY(d->cfg.graphs ? bucket_ws(d, bucket, &opts, Bs) : ensure_ws(d));
    TRY(pkv_plan_upload(d->ctx, d->plan, d->step_ws, d->step_ws_cap, pkv_ops_stream(d->ops)));
    TRY(pkv_ops_upload(d->ops, d->b_stage, d->h_stage, (size_t)(3 * (int64_t)Bs + 2 * (int64_t)npairs) * 4));
    h->host_stage_us = pkv_wall_us() - t3;
    return PKV_OK;
}

/* The decode step's first device work, queued (the CPU backend computes it here): the copy-on-write copies in
 * every layer (fresh pages, each written once; the sources are pages other requests still hold). */
static pkv_status launch_copies(pkv_decoder *d, int32_t ncopies) {
    for (int32_t l = 0; l < d->s.layers; l++)
        for (int32_t k = 0; k < ncopies; k += PKV_MAX_PAGE_COPIES) {
            const int32_t n = ncopies - k < PKV_MAX_PAGE_COPIES ? ncopies - k : PKV_MAX_PAGE_COPIES;
            CALL(pkv_copy_pages(d->ctx, &d->prob, d->copies + k, n, d->layers[l].k_cache, d->layers[l].v_cache, 0,
                                pkv_ops_stream(d->ops)));
        }
    return PKV_OK;
}

/* The changed ids scattered into the step's table (Bs: the staged rows). */
static pkv_status launch_scatter(pkv_decoder *d, int32_t Bs, int32_t npairs) {
    CALL(pkv_op_scatter_i32(d->ops, d->b_slots, d->b_stage + 3 * (int64_t)Bs, npairs));
    return PKV_OK;
}

/* The rest of the decode step's device work: the embedding, every layer (the decode form of the append: token
 * i the last of row i, over the same strided table). */
static pkv_status launch_model(pkv_decoder *d, int32_t B, int32_t Bs, int32_t bucket) {
    d->attn_indices = d->b_slots;
    if (bucket >= 0) return launch_graphed(d, B, Bs, bucket);
    const int32_t *lens = d->b_stage, *positions = lens + B, *tokens = positions + B;
    const append_table at = {B, d->b_sindptr, d->b_slots, lens, NULL};
    CALL(pkv_op_embed(d->ops, d->embed, d->s.vocab, d->s.hidden, tokens, B, d->x));
    return forward(d, B, &at, positions, 0, B);
}

/* After a step that failed: the device's table may lack ids the positions' records count as sent, so the next
 * step sends these rows whole. */
static void forget_rows(pkv_decoder *d, int32_t B) {
    for (int32_t i = 0; i < B; i++) d->slots[i] = (table_slot){-1, 0, 0, 0};
}

static pkv_status check_step(const pkv_decoder *d, const int32_t *reqs, const int32_t *tokens, int32_t B) {
    if (!d || !reqs || !tokens) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "decoder step: NULL argument");
    if (B < 1 || B > d->cfg.max_batch)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "decoder step: %d requests, not in [1, %d]", B, d->cfg.max_batch);
    return PKV_OK;
}

pkv_status pkv_decoder_step(pkv_decoder *d, const int32_t *reqs, const int32_t *tokens, int32_t B, int32_t *next,
                            float *logits_out) {
    TRY(check_step(d, reqs, tokens, B));
    if (!next) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "decoder step: NULL argument");
    pkv_decoder_times h;
    memset(&h, 0, sizeof h);
    const double t0 = pkv_wall_us();
    int32_t ncopies = 0, npairs = 0, bucket = -1;
    const int32_t Bs = step_rows(d, B, &bucket);
    pkv_status st = host_step(d, reqs, tokens, B, Bs, bucket, &ncopies, &npairs, &h);
    const double t1 = pkv_wall_us();
    d->busy_us = 0.0;
    const pkv_status cs = launch_copies(d, ncopies); /* those handed out, even when the step failed after them */
    if (st == PKV_OK) st = cs;
    if (st == PKV_OK) st = launch_scatter(d, Bs, npairs);
    if (st == PKV_OK) st = launch_model(d, B, Bs, bucket);
    h.host_launch_us = pkv_wall_us() - t1 - (d->cuda ? 0.0 : d->busy_us);
    if (st == PKV_OK) st = results(d, B, next, logits_out);
    if (st != PKV_OK) {
        pkv_ops_synchronize(d->ops); /* the staged inputs are rewritten by the next step */
        forget_rows(d, B);
    }
    finish_times(d, t0, &h);
    return st;
}

pkv_status pkv_decoder_step_host(pkv_decoder *d, const int32_t *reqs, const int32_t *tokens, int32_t B) {
    TRY(check_step(d, reqs, tokens, B));
    pkv_decoder_times h;
    memset(&h, 0, sizeof h);
    const double t0 = pkv_wall_us();
    int32_t ncopies = 0, npairs = 0, bucket = -1;
    const int32_t Bs = step_rows(d, B, &bucket);
    pkv_status st = host_step(d, reqs, tokens, B, Bs, bucket, &ncopies, &npairs, &h);
    const double t1 = pkv_wall_us();
    d->busy_us = 0.0;
    if (st == PKV_OK) st = launch_scatter(d, Bs, npairs);
    h.host_launch_us = pkv_wall_us() - t1 - (d->cuda ? 0.0 : d->busy_us);
    const pkv_status ss = pkv_ops_synchronize(d->ops);
    if (st == PKV_OK) st = ss;
    if (st != PKV_OK) forget_rows(d, B);
    finish_times(d, t0, &h);
    return st;
}

pkv_status pkv_decoder_prefill(pkv_decoder *d, int32_t req, const int32_t *prompt, int32_t n, int32_t *first_token,
                               float *logits_out) {
    if (!d || !prompt || !first_token) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "decoder prefill: NULL argument");
    if (n < 1) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "decoder prefill: a prompt of %d tokens", n);
    for (int32_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= d->s.vocab)
            return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "decoder prefill: token %d (%d) not in [0, %d)", i,
                                prompt[i], d->s.vocab);
    const double t0 = pkv_wall_us();
    TRY(pkv_request_create(d->pool, req, n));
    forget(d, req);
    int32_t np = 0;
    pkv_status st = pkv_request_pages(d->pool, req, NULL, 0, &np);
    if (st == PKV_OK && np > d->pages_cap) {
        free(d->pages);
        d->pages = (int32_t *)malloc((size_t)np * sizeof(int32_t));
        d->pages_cap = d->pages ? np : 0;
        if (!d->pages) st = pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    }
    if (st == PKV_OK) st = pkv_request_pages(d->pool, req, d->pages, d->pages_cap, &np);
    /* the request's pages in backend memory: the append's table (one row) */
    if (st == PKV_OK) st = bgrow(d, &d->b_aindices, &d->ab_cap, np);
    if (st == PKV_OK) st = bput(d, d->b_aindices, d->pages, (size_t)np * 4);
    const int32_t ps = d->cfg.page_size, C = d->cfg.max_batch;
    int32_t *positions = (int32_t *)malloc((size_t)C * 4);
    if (!positions && st == PKV_OK) st = pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
    double host_us = 0.0;
    /* the prompt in chunks of up to max_batch rows: row i attends to tokens 0..i of the request */
    for (int32_t j = 0; st == PKV_OK && j < n; j += C) {
        const double h0 = pkv_wall_us();
        const int32_t R = n - j < C ? n - j : C;
        int64_t total = 0;
        d->h_indptr[0] = 0;
        for (int32_t r = 0; r < R; r++) {
            d->h_lens[r] = j + r + 1;
            positions[r] = j + r;
            total += (d->h_lens[r] + ps - 1) / ps;
            d->h_indptr[r + 1] = (int32_t)total;
        }
        if (total > d->h_cap) {
            free(d->h_indices);
            d->h_indices = (int32_t *)malloc((size_t)total * 2 * sizeof(int32_t));
            d->h_cap = d->h_indices ? total * 2 : 0;
            if (!d->h_indices) {
                st = pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "decoder: out of memory");
                break;
            }
        }
        for (int32_t r = 0; r < R; r++)
            memcpy(d->h_indices + d->h_indptr[r], d->pages, (size_t)(d->h_indptr[r + 1] - d->h_indptr[r]) * 4);
        const pkv_page_table table = {R, d->h_indptr, d->h_indices, d->h_lens};
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = d->cfg.route;
        st = pkv_plan_step(d->ctx, &d->prob, &table, &opts, d->plan);
        host_us += pkv_wall_us() - h0;
        /* the append: one row, the request as long as j + R tokens, its last R tokens */
        const int32_t aindptr[2] = {0, (j + R + ps - 1) / ps}, alens[1] = {j + R}, aptr[2] = {0, R};
        if (st == PKV_OK) st = bgrow(d, &d->b_indices, &d->b_cap, total);
        if (st == PKV_OK) st = bput(d, d->b_indices, d->h_indices, (size_t)total * 4);
        if (st == PKV_OK) st = bput(d, d->b_positions, positions, (size_t)R * 4);
        if (st == PKV_OK) st = bput(d, d->b_tokens, prompt + j, (size_t)R * 4);
        if (st == PKV_OK) st = bput(d, d->b_aindptr, aindptr, sizeof aindptr);
        if (st == PKV_OK) st = bput(d, d->b_alens, alens, sizeof alens);
        if (st == PKV_OK) st = bput(d, d->b_aptr, aptr, sizeof aptr);
        const append_table at = {1, d->b_aindptr, d->b_aindices, d->b_alens, d->b_aptr};
        d->attn_indices = d->b_indices;
        const bool last = j + R == n;
        if (st == PKV_OK) st = pkv_op_embed(d->ops, d->embed, d->s.vocab, d->s.hidden, d->b_tokens, R, d->x);
        if (st == PKV_OK) st = forward(d, R, &at, d->b_positions, R - 1, last ? 1 : 0);
        if (st == PKV_OK) st = pkv_ops_synchronize(d->ops);
    }
    free(positions);
    if (st == PKV_OK) st = results(d, 1, first_token, logits_out);
    pkv_decoder_times h;
    memset(&h, 0, sizeof h);
    h.host_plan_us = host_us; /* the chunks' tables and plans */
    finish_times(d, t0, &h);
    if (st != PKV_OK) pkv_request_free(d->pool, req);
    return st;
}

pkv_status pkv_decoder_prefill_synthetic(pkv_decoder *d, int32_t req, int32_t n) {
    if (!d) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "decoder: NULL argument");
    TRY(pkv_request_create(d->pool, req, n));
    forget(d, req);
    return PKV_OK;
}

pkv_status pkv_decoder_release(pkv_decoder *d, int32_t req) {
    if (!d) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "decoder: NULL argument");
    forget(d, req);
    return pkv_request_free(d->pool, req);
}
