/* pkv_model.h - the transformer layers around the attention engine, for the end-to-end decode loop
 * (`pkv decode`): model shapes, bf16 weights, and the layer ops of a Llama-style decoder (embedding,
 * RMSNorm, the projections as GEMMs, RoPE, SwiGLU, greedy sampling) on either backend of a context.
 *
 * Not part of the serving library: a server brings its own model.  This is what the benchmark and the
 * check against Hugging Face transformers drive the library with.  The ops keep the rounding points of
 * transformers' LlamaForCausalLM in bf16 (every op's result rounded to bf16; RMSNorm's normalised value
 * rounded before the weight multiplies it; RoPE's two products rounded before their sum), so the loop
 * and transformers can agree token for token.
 *
 * Tensors are in the context's backend memory (host on the CPU backend, device on CUDA), row-major,
 * bf16 (uint16_t bits) unless said otherwise.  CUDA ops are queued on the ops' stream and return at once;
 * CPU ops compute before they return. */
#ifndef PKV_MODEL_H
#define PKV_MODEL_H

#include "persistentkv.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A Llama-style decoder's shape. */
typedef struct pkv_model_shape {
    char name[32];
    int32_t layers, hidden, q_heads, kv_heads, head_dim, mlp, vocab;
    double rope_theta, rms_eps;
} pkv_model_shape;

/* The shapes by name: "llama3-8b" (the default of `pkv decode`), "qwen2.5-32b", "llama3.1-70b",
 * "hf-small" (the transformers check: 4 layers, hidden 1024, 16 / 4 heads of 64) and "tiny" (the CPU
 * tests).  Returns PKV_ERR_INVALID_ARGUMENT with the list for another name. */
pkv_status pkv_model_shape_named(const char *name, pkv_model_shape *out);
/* Refuses shapes the ops or the attention engine cannot run (with the reason). */
pkv_status pkv_model_shape_check(const pkv_model_shape *s);

/* The ops of one backend: a cuBLAS handle and a stream on CUDA, nothing on the CPU. */
typedef struct pkv_ops pkv_ops;
/* stream: a cudaStream_t on the CUDA backend (NULL: the ops make a stream of their own, which synchronizes with
 * the legacy default stream as any blocking stream does, and destroy it with themselves); ignored on the CPU. */
pkv_status pkv_ops_create(pkv_context *ctx, void *stream, pkv_ops **out);
void pkv_ops_free(pkv_ops *ops); /* accepts NULL */
/* The ops' stream (a cudaStream_t; NULL on the CPU): where the library's calls that go with the ops are queued. */
void *pkv_ops_stream(const pkv_ops *ops);
/* CUDA graphs of the ops' stream (PKV_ERR_UNSUPPORTED on the CPU): pkv_ops_capture_begin starts capturing what
 * this thread queues on the ops' stream (nothing runs until a replay), pkv_ops_capture_end stops and
 * instantiates it (*graph; a capture that failed part way is ended and freed, and its error returned),
 * pkv_ops_graph_launch queues one replay, pkv_ops_graph_free frees a graph (NULL accepted).  pkv_ops_mark is
 * refused while capturing (a captured event would time nothing). */
pkv_status pkv_ops_capture_begin(pkv_ops *ops);
pkv_status pkv_ops_capture_end(pkv_ops *ops, void **graph);
pkv_status pkv_ops_graph_launch(pkv_ops *ops, void *graph);
void pkv_ops_graph_free(pkv_ops *ops, void *graph);

/* out[b, :] = table[tokens[b], :]; tokens int32 in [0, vocab) (the CUDA op clamps an id outside). */
pkv_status pkv_op_embed(pkv_ops *ops, const uint16_t *table, int32_t vocab, int32_t hidden, const int32_t *tokens,
                        int32_t B, uint16_t *out);
/* RMSNorm of each row: out = w * bf16(x / sqrt(mean(x^2) + eps)), the mean in fp32. */
pkv_status pkv_op_rmsnorm(pkv_ops *ops, const uint16_t *x, const uint16_t *w, int32_t B, int32_t n, double eps,
                          uint16_t *out);
/* x += y elementwise (the residual stream), count elements. */
pkv_status pkv_op_add(pkv_ops *ops, uint16_t *x, const uint16_t *y, int64_t count);
/* x += y over [B, n], then out = rmsnorm(x) as pkv_op_rmsnorm: the two ops in one pass, the same bits. */
pkv_status pkv_op_add_rmsnorm(pkv_ops *ops, uint16_t *x, const uint16_t *y, const uint16_t *w, int32_t B, int32_t n,
                              double eps, uint16_t *out);
/* y[B, N] = x[B, K] W^T, W [N, K] as a torch Linear's weight; fp32 accumulation, y rounded to bf16.
 * x and y rows are x_stride / y_stride elements apart (0: K / N). */
pkv_status pkv_op_gemm(pkv_ops *ops, const uint16_t *x, int64_t x_stride, const uint16_t *W, int32_t B, int32_t N,
                       int32_t K, uint16_t *y, int64_t y_stride);
/* The rotary embedding's inverse frequencies, host memory [d / 2]: 1 / theta^(2i / d) in fp32, as
 * transformers' Llama computes them at its creation. */
void pkv_rope_inv_freq(double theta, int32_t head_dim, float *out);
/* Rotary embedding in place on the q and k parts of each row of a fused QKV output [B, (Hq + 2 Hkv) d]
 * (rotate-half form, as transformers' Llama): positions int32 [B], inv_freq fp32 [d / 2] (backend memory)
 * from pkv_rope_inv_freq; the angle of pair i at position p is p x inv_freq[i] in fp32, its cos and sin
 * rounded to bf16. */
pkv_status pkv_op_rope(pkv_ops *ops, uint16_t *qkv, const int32_t *positions, int32_t B, int32_t q_heads,
                       int32_t kv_heads, int32_t head_dim, const float *inv_freq);
/* out[B, mlp] = bf16(silu(g)) * u, gu [B, 2 mlp] holding g then u in each row. */
pkv_status pkv_op_silu_mul(pkv_ops *ops, const uint16_t *gu, int32_t B, int32_t mlp, uint16_t *out);
/* Greedy sampling: tokens[b] = the first index of the largest logit of row b (int32 out). */
pkv_status pkv_op_argmax(pkv_ops *ops, const uint16_t *logits, int32_t B, int32_t vocab, int32_t *tokens);
/* Host memory for pkv_ops_upload's sources: page-locked on CUDA (so that the copy runs while the host goes on),
 * plain on the CPU.  pkv_ops_host_free accepts NULL. */
pkv_status pkv_ops_host_alloc(pkv_ops *ops, size_t bytes, void **out);
void pkv_ops_host_free(pkv_ops *ops, void *p);
/* Queues a copy of bytes from host memory src (pkv_ops_host_alloc's) to backend memory dst on the ops' stream,
 * ordered before the ops queued after it; the CPU copies at once.  src must stay as it is until the copy has
 * run (pkv_ops_synchronize, or a synchronous copy back that follows it). */
pkv_status pkv_ops_upload(pkv_ops *ops, void *dst, const void *src, size_t bytes);
/* dst[pairs[2k]] = pairs[2k + 1] for k < n (int32, backend memory): the step's changed page ids. */
pkv_status pkv_op_scatter_i32(pkv_ops *ops, int32_t *dst, const int32_t *pairs, int32_t n);
/* Fills count bf16 values with lo + (hi - lo) u, u uniform in [0, 1) from a hash of (seed, index): the same
 * values on both backends (lo == hi: a constant). */
pkv_status pkv_op_fill_uniform(pkv_ops *ops, uint16_t *p, int64_t count, float lo, float hi, uint64_t seed);
/* The same values (each rounded to bf16 first) as count one-byte codes of an fp8 cache: the code of value / scale
 * (dtype PKV_DTYPE_FP8_E4M3 or _E5M2; nearest even, saturating, as pkv_append_kv quantizes), so that code x scale
 * is about the value.  The same codes on both backends. */
pkv_status pkv_op_fill_uniform_fp8(pkv_ops *ops, uint8_t *p, int64_t count, float lo, float hi, uint64_t seed,
                                   pkv_dtype dtype, float scale);
/* Timing by part: pkv_ops_mark(ops, part) says that the work queued from now on is of that part (a CUDA
 * event on the ops' stream, or the wall clock on the CPU); pkv_ops_take_times waits for the work, adds
 * each interval's time to its part (microseconds, out[PKV_PARTS]) and starts over.  Part -1 closes the
 * last interval without opening one. */
enum { PKV_PART_ATTENTION, PKV_PART_APPEND, PKV_PART_GEMM, PKV_PART_OTHER, PKV_PART_GRAPHED, PKV_PARTS };
pkv_status pkv_ops_mark(pkv_ops *ops, int part);
pkv_status pkv_ops_take_times(pkv_ops *ops, double out[PKV_PARTS]);
/* Waits for the ops queued so far (CUDA); a no-op on the CPU. */
pkv_status pkv_ops_synchronize(pkv_ops *ops);

/* ---- the decoder: the model's layers around the attention engine, over the page manager's pages ---------
 * Weights in the context's backend memory (random, or loaded from a file), a KV pool per layer indexed by
 * the page manager's page ids (the same ids in every layer, as vLLM's block tables), and per step: each
 * live request's next token through every layer (RMSNorm, the fused QKV GEMM, RoPE, the step's K and V
 * appended into its pages, attention by one pkv_plan_step reused by every layer and one pkv_run per layer
 * reading q in place from the QKV output, the O GEMM, the SwiGLU MLP), the final norm, the LM head and the
 * greedy token.  A request's prompt is prefilled exactly (its tokens as rows of the same engine, row i
 * attending to tokens 0..i: quadratic reads, for prompts of up to a few thousand tokens) or, for decode
 * benchmarks of long contexts, synthetically (its K and V in every layer filled with random values, no
 * model output: the decode steps that follow read and write real bytes, the tokens are not a model's).
 * The step's page table stays on the device between steps, a row of max_len / page_size ids per batch
 * position: a step plans from the rows' lengths alone (the manager's pages are valid by construction) and
 * uploads only what changed (a page the step added or copied, or a whole row where another request took the
 * position), so its host cost is O(B), not O(pages).  A request changed between steps outside the decoder
 * (truncated, extended through pkv_decoder_pool) has its row sent whole at the next step, which sees its length
 * move by other than the step's token; changes that leave its length as it was are not seen. */
typedef struct pkv_decoder_config {
    pkv_model_shape shape;
    int32_t page_size;     /* tokens per page (16) */
    int64_t num_pages;     /* pages per layer's pool: the most tokens in flight / page_size, at least */
    int32_t max_batch;     /* most requests decoded in one step (and most prompt tokens prefilled at once) */
    int32_t max_requests;  /* request ids in [0, max_requests) */
    int32_t max_len;       /* a request's most tokens (its row of the step's page table holds that many pages) */
    uint64_t seed;         /* the random weights' */
    pkv_route route;       /* attention's route (AUTO: the library's policy) */
    /* The KV pools' element type: 0 or PKV_DTYPE_BF16 (the model's), or PKV_DTYPE_FP8_E4M3 / _E5M2: one byte an
     * element, each K and V value quantized as the append writes it (nearest even, saturating) and dequantized as
     * attention reads it, real value = stored x kv_scale (the per-tensor k_scale = v_scale of every layer). */
    pkv_dtype kv_dtype;
    float kv_scale;        /* 0: 1.0; an fp8 pool's only */
    /* 1: each decode step one CUDA graph replay, attention included, one graph per batch bucket (B rounded up to a
     * power of two, at most max_batch; the rows past B are padding: length 0, nothing appended, their outputs
     * dropped).  Attention is planned graph-stable (pkv_plan_options.graph_max_batch = the bucket's rows: the work
     * queue, so route AUTO or WORKQUEUE, else PKV_ERR_UNSUPPORTED at creation), each step's plan uploaded into its
     * bucket's own workspace before the replay: the host queues one plan upload, one input upload and one launch a
     * step.  A bucket's first step runs op by op (and is timed by part), its second captures the graph, every later
     * one replays it; attention's time is then inside the replay (graphed_us).  A bucket whose capture fails runs op
     * by op from then on (its steps report graphed_us 0).  On the CPU backend the steps run op
     * by op over the same padded rows and plans (the path CI tests); the append takes the B rows there.  0: every op
     * launched by itself, B rows, attention by the policy's route. */
    int32_t graphs;
} pkv_decoder_config;

typedef struct pkv_decoder pkv_decoder;

/* Time of the last step by part, microseconds: the device parts by CUDA events on the CUDA backend, by wall
 * time on the CPU; step_us the step's wall time.  host_us is the host's work of the step (monotonic clock),
 * the sum of its parts:
 *   host_extend_us  each request's token (pkv_request_extend)
 *   host_table_us   the rows' lengths and positions, and the page ids that changed (the step's table)
 *   host_plan_us    pkv_plan_step
 *   host_stage_us   the step's inputs, changed ids and plan handed to the backend (copies queued)
 *   host_launch_us  the step's device work queued: copy-on-write copies, the scatter, every layer's ops,
 *                   append and pkv_run (on CUDA the calls' own time; on the CPU backend, whose calls compute
 *                   before they return, only the decoder's work between them)
 * The CPU backend's computing (attention, GEMMs, append, copies) is never in host_us. */
typedef struct pkv_decoder_times {
    /* graphed_us: the replayed graph of a step in CUDA graphs (every op of the step, attention included) */
    double attention_us, append_us, gemm_us, other_us, graphed_us, host_us, step_us;
    double host_extend_us, host_table_us, host_plan_us, host_stage_us, host_launch_us;
} pkv_decoder_times;

void pkv_decoder_config_default(pkv_decoder_config *c, const pkv_model_shape *shape);
/* Allocates weights (random, seeded), pools and buffers on the context's backend. */
pkv_status pkv_decoder_create(pkv_context *ctx, const pkv_decoder_config *cfg, pkv_decoder **out);
void pkv_decoder_free(pkv_decoder *d); /* accepts NULL */
/* Replaces the weights by a file's: "PKVW" magic, then int32 layers, hidden, q_heads, kv_heads, head_dim,
 * mlp, vocab (checked against the shape), then bf16 tensors in transformers' Llama order - embed [V, H];
 * per layer input_layernorm [H], q_proj, k_proj, v_proj ([.., H] each), o_proj [H, Hq d],
 * post_attention_layernorm [H], gate_proj, up_proj [M, H], down_proj [H, M]; norm [H]; lm_head [V, H]. */
pkv_status pkv_decoder_load_weights(pkv_decoder *d, const char *path);
pkv_page_pool *pkv_decoder_pool(pkv_decoder *d);
/* The KV pools' bytes, every layer's K and V together: layers x 2 x num_pages x page_size x kv_heads x head_dim x
 * the element's size (2, or 1 for an fp8 pool). */
int64_t pkv_decoder_kv_bytes(const pkv_decoder *d);
/* The plan of the last step (or prefill chunk). */
const pkv_plan *pkv_decoder_plan(const pkv_decoder *d);
/* The decode steps' page table (backend memory): batch position i's page ids at [i x *stride, ...), as many as
 * its request held at the last step. */
const int32_t *pkv_decoder_table(const pkv_decoder *d, int32_t *stride);
/* A new request: prompt tokens host int32 [n] (n >= 1), prefilled exactly; *first_token gets the greedy
 * token after the prompt (its logits into logits_out [vocab] when not NULL, host floats). */
pkv_status pkv_decoder_prefill(pkv_decoder *d, int32_t req, const int32_t *prompt, int32_t n, int32_t *first_token,
                               float *logits_out);
/* A new request of n tokens whose K and V are whatever its pages hold in every layer: random values from
 * the decoder's creation (uniform in [-2, 2), an fp8 pool's quantized by its scale), or an earlier request's (decode benchmarks of long contexts, no model compute). */
pkv_status pkv_decoder_prefill_synthetic(pkv_decoder *d, int32_t req, int32_t n);
/* One decode step of requests reqs [B] (live, distinct): tokens host int32 [B] are their inputs; next
 * (host int32 [B]) gets the greedy tokens, logits_out (host floats [B, vocab], or NULL) the logits.  A step
 * that fails has grown its requests by the token it did not decode (truncate or release them). */
pkv_status pkv_decoder_step(pkv_decoder *d, const int32_t *reqs, const int32_t *tokens, int32_t B, int32_t *next,
                            float *logits_out);
/* The host half of a decode step alone, for benchmarks of the host path (bench/bench_decode_host.c): the
 * requests grow by a token and the step's table, plan and inputs are made and staged as pkv_decoder_step
 * makes them, and the changed ids scattered into the device table (which keeps it right for later steps),
 * but no other device work runs: no copy-on-write copy, no model op, append or attention (the new tokens
 * have no K and V).  Its times (host parts) in pkv_decoder_last_times. */
pkv_status pkv_decoder_step_host(pkv_decoder *d, const int32_t *reqs, const int32_t *tokens, int32_t B);
void pkv_decoder_last_times(const pkv_decoder *d, pkv_decoder_times *t);
/* Frees a request's pages. */
pkv_status pkv_decoder_release(pkv_decoder *d, int32_t req);

#ifdef __cplusplus
}
#endif

#endif /* PKV_MODEL_H */
