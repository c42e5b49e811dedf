/* ops_internal.h - the ops object and the CUDA implementation's entry points (ops_cuda.cu; in a build
 * without CUDA, ops_cuda_stub.c refuses them). */
#ifndef PKV_OPS_INTERNAL_H
#define PKV_OPS_INTERNAL_H

#include "pkv_model.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PKV_MAX_MARKS 4096

struct pkv_ops {
    pkv_context *ctx;
    bool cuda;
    void *stream; /* cudaStream_t */
    bool own_stream; /* made by the ops (pkv_ops_create given NULL on CUDA); destroyed with them */
    bool capturing;  /* between pkv_ops_capture_begin and _end */
    void *blas;   /* cublasHandle_t */
    /* pkv_ops_mark: the marks of the current step (CUDA events, created on first use; CPU times) */
    int nmarks;
    int part[PKV_MAX_MARKS];
    void *event[PKV_MAX_MARKS];
    double wall[PKV_MAX_MARKS];
};
pkv_status pkv_cuda_ops_mark(pkv_ops *ops, int k);
pkv_status pkv_cuda_ops_elapsed(pkv_ops *ops, int k, double *us); /* from mark k to mark k + 1 */

/* The monotonic clock, microseconds (the CPU ops' timing and the decoder's host time). */
double pkv_wall_us(void);

pkv_status pkv_cuda_ops_init(pkv_ops *ops); /* makes ops->stream when it is NULL (own_stream) */
pkv_status pkv_cuda_ops_capture_begin(pkv_ops *ops);
pkv_status pkv_cuda_ops_capture_end(pkv_ops *ops, void **graph);
pkv_status pkv_cuda_ops_graph_launch(pkv_ops *ops, void *graph);
void pkv_cuda_ops_graph_free(void *graph);
void pkv_cuda_ops_release(pkv_ops *ops);
pkv_status pkv_cuda_ops_synchronize(pkv_ops *ops);
pkv_status pkv_cuda_op_embed(pkv_ops *ops, const uint16_t *table, int32_t vocab, int32_t hidden, const int32_t *tokens,
                             int32_t B, uint16_t *out);
pkv_status pkv_cuda_op_rmsnorm(pkv_ops *ops, const uint16_t *x, const uint16_t *w, int32_t B, int32_t n, float eps,
                               uint16_t *out);
pkv_status pkv_cuda_op_add(pkv_ops *ops, uint16_t *x, const uint16_t *y, int64_t count);
pkv_status pkv_cuda_op_add_rmsnorm(pkv_ops *ops, uint16_t *x, const uint16_t *y, const uint16_t *w, int32_t B, int32_t n,
                                   float eps, uint16_t *out);
pkv_status pkv_cuda_op_gemm(pkv_ops *ops, const uint16_t *x, int64_t x_stride, const uint16_t *W, int32_t B, int32_t N,
                            int32_t K, uint16_t *y, int64_t y_stride);
pkv_status pkv_cuda_op_rope(pkv_ops *ops, uint16_t *qkv, const int32_t *positions, int32_t B, int32_t q_heads,
                            int32_t kv_heads, int32_t head_dim, const float *inv_freq);
pkv_status pkv_cuda_op_silu_mul(pkv_ops *ops, const uint16_t *gu, int32_t B, int32_t mlp, uint16_t *out);
#ifdef __CUDACC__
#define PKV_HOST_DEVICE __host__ __device__
#else
#define PKV_HOST_DEVICE
#endif
/* The hash behind pkv_op_fill_uniform: u in [0, 1) for (seed, i); the value fmaf(hi - lo, u, lo) (one
 * rounding, the same on host and device). */
static inline PKV_HOST_DEVICE float pkv_fill_u(uint64_t seed, uint64_t i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}
pkv_status pkv_cuda_op_fill_uniform(pkv_ops *ops, uint16_t *p, int64_t count, float lo, float hi, uint64_t seed);
pkv_status pkv_cuda_op_fill_uniform_fp8(pkv_ops *ops, uint8_t *p, int64_t count, float lo, float hi, uint64_t seed,
                                        int e5m2, float inv_scale);
pkv_status pkv_cuda_op_scatter_i32(pkv_ops *ops, int32_t *dst, const int32_t *pairs, int32_t n);
pkv_status pkv_cuda_ops_host_alloc(pkv_ops *ops, size_t bytes, void **out);
void pkv_cuda_ops_host_free(pkv_ops *ops, void *p);
pkv_status pkv_cuda_ops_upload(pkv_ops *ops, void *dst, const void *src, size_t bytes);
pkv_status pkv_cuda_op_argmax(pkv_ops *ops, const uint16_t *logits, int32_t B, int32_t vocab, int32_t *tokens);

#ifdef __cplusplus
}
#endif

#endif
