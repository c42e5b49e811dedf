/* ops_internal.h - the ops object and the CUDA implementation's entry points (ops_cuda.cu; in a build
 * without CUDA, ops_cuda_stub.c refuses them). */
#ifndef PKV_OPS_INTERNAL_H
#define PKV_OPS_INTERNAL_H

#include "pkv_model.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

struct pkv_ops {
    pkv_context *ctx;
    bool cuda;
    void *stream; /* cudaStream_t */
    void *blas;   /* cublasHandle_t */
};

pkv_status pkv_cuda_ops_init(pkv_ops *ops);
void pkv_cuda_ops_release(pkv_ops *ops);
pkv_status pkv_cuda_ops_synchronize(pkv_ops *ops);
pkv_status pkv_cuda_op_embed(pkv_ops *ops, const uint16_t *table, int32_t vocab, int32_t hidden, const int32_t *tokens,
                             int32_t B, uint16_t *out);
pkv_status pkv_cuda_op_rmsnorm(pkv_ops *ops, const uint16_t *x, const uint16_t *w, int32_t B, int32_t n, float eps,
                               uint16_t *out);
pkv_status pkv_cuda_op_add(pkv_ops *ops, uint16_t *x, const uint16_t *y, int64_t count);
pkv_status pkv_cuda_op_gemm(pkv_ops *ops, const uint16_t *x, int64_t x_stride, const uint16_t *W, int32_t B, int32_t N,
                            int32_t K, uint16_t *y, int64_t y_stride);
pkv_status pkv_cuda_op_rope(pkv_ops *ops, uint16_t *qkv, const int32_t *positions, int32_t B, int32_t q_heads,
                            int32_t kv_heads, int32_t head_dim, const float *inv_freq);
pkv_status pkv_cuda_op_silu_mul(pkv_ops *ops, const uint16_t *gu, int32_t B, int32_t mlp, uint16_t *out);
pkv_status pkv_cuda_op_argmax(pkv_ops *ops, const uint16_t *logits, int32_t B, int32_t vocab, int32_t *tokens);

#ifdef __cplusplus
}
#endif

#endif
