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
/* stream: a cudaStream_t on the CUDA backend (NULL: the default stream); ignored on the CPU. */
pkv_status pkv_ops_create(pkv_context *ctx, void *stream, pkv_ops **out);
void pkv_ops_free(pkv_ops *ops); /* accepts NULL */

/* out[b, :] = table[tokens[b], :]; tokens int32 in [0, vocab) (the CUDA op clamps an id outside). */
pkv_status pkv_op_embed(pkv_ops *ops, const uint16_t *table, int32_t vocab, int32_t hidden, const int32_t *tokens,
                        int32_t B, uint16_t *out);
/* RMSNorm of each row: out = w * bf16(x / sqrt(mean(x^2) + eps)), the mean in fp32. */
pkv_status pkv_op_rmsnorm(pkv_ops *ops, const uint16_t *x, const uint16_t *w, int32_t B, int32_t n, double eps,
                          uint16_t *out);
/* x += y elementwise (the residual stream), count elements. */
pkv_status pkv_op_add(pkv_ops *ops, uint16_t *x, const uint16_t *y, int64_t count);
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
/* Waits for the ops queued so far (CUDA); a no-op on the CPU. */
pkv_status pkv_ops_synchronize(pkv_ops *ops);

#ifdef __cplusplus
}
#endif

#endif /* PKV_MODEL_H */
