/* ops_cuda_stub.c - the CUDA ops in a build without CUDA: unavailable, never faked. */
#include "ops_internal.h"

#include "pkv_lab.h"

#define NO_CUDA pkv_lab_fail(PKV_ERR_BACKEND_UNAVAILABLE, "this build has no CUDA backend")

pkv_status pkv_cuda_ops_init(pkv_ops *ops) { (void)ops; return NO_CUDA; }
void pkv_cuda_ops_release(pkv_ops *ops) { (void)ops; }
pkv_status pkv_cuda_ops_capture_begin(pkv_ops *ops) { (void)ops; return NO_CUDA; }
pkv_status pkv_cuda_ops_capture_end(pkv_ops *ops, void **graph) {
    (void)ops, (void)graph;
    return NO_CUDA;
}
pkv_status pkv_cuda_ops_graph_launch(pkv_ops *ops, void *graph) {
    (void)ops, (void)graph;
    return NO_CUDA;
}
void pkv_cuda_ops_graph_free(void *graph) { (void)graph; }
pkv_status pkv_cuda_ops_synchronize(pkv_ops *ops) { (void)ops; return NO_CUDA; }
pkv_status pkv_cuda_op_embed(pkv_ops *ops, const uint16_t *table, int32_t vocab, int32_t hidden, const int32_t *tokens,
                             int32_t B, uint16_t *out) {
    (void)ops, (void)table, (void)vocab, (void)hidden, (void)tokens, (void)B, (void)out;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_rmsnorm(pkv_ops *ops, const uint16_t *x, const uint16_t *w, int32_t B, int32_t n, float eps,
                               uint16_t *out) {
    (void)ops, (void)x, (void)w, (void)B, (void)n, (void)eps, (void)out;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_add_rmsnorm(pkv_ops *ops, uint16_t *x, const uint16_t *y, const uint16_t *w, int32_t B, int32_t n,
                                   float eps, uint16_t *out) {
    (void)ops, (void)x, (void)y, (void)w, (void)B, (void)n, (void)eps, (void)out;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_add(pkv_ops *ops, uint16_t *x, const uint16_t *y, int64_t count) {
    (void)ops, (void)x, (void)y, (void)count;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_gemm(pkv_ops *ops, const uint16_t *x, int64_t x_stride, const uint16_t *W, int32_t B, int32_t N,
                            int32_t K, uint16_t *y, int64_t y_stride) {
    (void)ops, (void)x, (void)x_stride, (void)W, (void)B, (void)N, (void)K, (void)y, (void)y_stride;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_rope(pkv_ops *ops, uint16_t *qkv, const int32_t *positions, int32_t B, int32_t q_heads,
                            int32_t kv_heads, int32_t head_dim, const float *inv_freq) {
    (void)ops, (void)qkv, (void)positions, (void)B, (void)q_heads, (void)kv_heads, (void)head_dim, (void)inv_freq;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_silu_mul(pkv_ops *ops, const uint16_t *gu, int32_t B, int32_t mlp, uint16_t *out) {
    (void)ops, (void)gu, (void)B, (void)mlp, (void)out;
    return NO_CUDA;
}
pkv_status pkv_cuda_ops_mark(pkv_ops *ops, int k) {
    (void)ops, (void)k;
    return NO_CUDA;
}
pkv_status pkv_cuda_ops_elapsed(pkv_ops *ops, int k, double *us) {
    (void)ops, (void)k, (void)us;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_fill_uniform(pkv_ops *ops, uint16_t *p, int64_t count, float lo, float hi, uint64_t seed) {
    (void)ops, (void)p, (void)count, (void)lo, (void)hi, (void)seed;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_scatter_i32(pkv_ops *ops, int32_t *dst, const int32_t *pairs, int32_t n) {
    (void)ops, (void)dst, (void)pairs, (void)n;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_argmax(pkv_ops *ops, const uint16_t *logits, int32_t B, int32_t vocab, int32_t *tokens) {
    (void)ops, (void)logits, (void)B, (void)vocab, (void)tokens;
    return NO_CUDA;
}
pkv_status pkv_cuda_ops_host_alloc(pkv_ops *ops, size_t bytes, void **out) {
    (void)ops, (void)bytes;
    *out = NULL;
    return NO_CUDA;
}
void pkv_cuda_ops_host_free(pkv_ops *ops, void *p) { (void)ops, (void)p; }
pkv_status pkv_cuda_ops_upload(pkv_ops *ops, void *dst, const void *src, size_t bytes) {
    (void)ops, (void)dst, (void)src, (void)bytes;
    return NO_CUDA;
}
pkv_status pkv_cuda_op_fill_uniform_fp8(pkv_ops *ops, uint8_t *p, int64_t count, float lo, float hi, uint64_t seed,
                                        int e5m2, float inv_scale) {
    (void)ops, (void)p, (void)count, (void)lo, (void)hi, (void)seed, (void)e5m2, (void)inv_scale;
    return NO_CUDA;
}
