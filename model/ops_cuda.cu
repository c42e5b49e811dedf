// ops_cuda.cu - the layer ops on the CUDA backend (pkv_model.h): the GEMMs through cuBLAS (bf16 in and out,
// fp32 accumulation), the element-wise ops as small kernels with the CPU implementation's rounding points.
#include "ops_internal.h"

#include "pkv_lab.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <math.h>

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
__device__ __forceinline__ uint16_t to_bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

cudaStream_t stream_of(const pkv_ops *ops) { return static_cast<cudaStream_t>(ops->stream); }

pkv_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return pkv_lab_fail(PKV_ERR_CUDA, "%s: launch failed: %s", op, cudaGetErrorString(e));
    return PKV_OK;
}

__global__ void embed_kernel(const uint16_t *table, int32_t vocab, int32_t hidden, const int32_t *tokens,
                             uint16_t *out) {
    int32_t t = tokens[blockIdx.x];
    t = t < 0 ? 0 : t >= vocab ? vocab - 1 : t;
    const uint16_t *src = table + (int64_t)t * hidden;
    uint16_t *dst = out + (int64_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// A row's RMSNorm from each thread's share of its sum of squares (fp32, over the elements the thread strides): the
// CTA's sum (warp shuffles, then one warp over the warps' sums), then out = w * bf16(x * r) over the same elements.
__device__ void rmsnorm_row(const uint16_t *xr, float ss, const uint16_t *w, int32_t n, float eps, uint16_t *outr) {
    __shared__ float part[kThreads / 32];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (threadIdx.x == 0) part[0] = ss;
    }
    __syncthreads();
    const float r = 1.0f / sqrtf(part[0] / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += kThreads) outr[i] = to_bf(bf(w[i]) * bf(to_bf(bf(xr[i]) * r)));
}

// A CTA per row.
__global__ void rmsnorm_kernel(const uint16_t *x, const uint16_t *w, int32_t n, float eps, uint16_t *out) {
    const uint16_t *xr = x + (int64_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += kThreads) ss += bf(xr[i]) * bf(xr[i]);
    rmsnorm_row(xr, ss, w, n, eps, out + (int64_t)blockIdx.x * n);
}

// The residual add and the next RMSNorm in one pass: a CTA per row writes x += y (rounded) and normalizes the sum,
// each thread over the same elements in the same order as add_kernel then rmsnorm_kernel (the same bits; the norm
// reads back only the elements the thread wrote).
__global__ void add_rmsnorm_kernel(uint16_t *x, const uint16_t *y, const uint16_t *w, int32_t n, float eps,
                                   uint16_t *out) {
    uint16_t *xr = x + (int64_t)blockIdx.x * n;
    const uint16_t *yr = y + (int64_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += kThreads) {
        const uint16_t v = to_bf(bf(xr[i]) + bf(yr[i]));
        xr[i] = v;
        ss += bf(v) * bf(v);
    }
    rmsnorm_row(xr, ss, w, n, eps, out + (int64_t)blockIdx.x * n);
}

__global__ void add_kernel(uint16_t *x, const uint16_t *y, int64_t count) {
    for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < count; i += (int64_t)gridDim.x * kThreads)
        x[i] = to_bf(bf(x[i]) + bf(y[i]));
}

// A CTA per (row, head of q or k); inv_freq [d / 2] from pkv_rope_inv_freq.
__global__ void rope_kernel(uint16_t *qkv, const int32_t *positions, int32_t heads, int32_t d, int64_t row,
                            const float *inv_freq) {
    const int32_t b = blockIdx.x / heads, h = blockIdx.x % heads, half = d / 2;
    uint16_t *v = qkv + b * row + (int64_t)h * d;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float ang = (float)positions[b] * inv_freq[i];
        const float c = bf(to_bf(cosf(ang))), s = bf(to_bf(sinf(ang)));
        const float x1 = bf(v[i]), x2 = bf(v[i + half]);
        v[i] = to_bf(bf(to_bf(x1 * c)) + bf(to_bf(-x2 * s)));
        v[i + half] = to_bf(bf(to_bf(x2 * c)) + bf(to_bf(x1 * s)));
    }
}

__global__ void silu_mul_kernel(const uint16_t *gu, int32_t mlp, uint16_t *out) {
    const uint16_t *g = gu + (int64_t)blockIdx.y * 2 * mlp, *u = g + mlp;
    for (int i = blockIdx.x * kThreads + threadIdx.x; i < mlp; i += gridDim.x * kThreads) {
        const float gv = bf(g[i]);
        out[(int64_t)blockIdx.y * mlp + i] = to_bf(bf(to_bf(gv / (1.0f + expf(-gv)))) * bf(u[i]));
    }
}

// (value, index): the larger value wins, NaN above all (torch.argmax), the lower index on a tie.
__device__ __forceinline__ bool beats(float v, int32_t i, float bv, int32_t bi) {
    const bool vn = v != v, bn = bv != bv;
    if (vn != bn) return vn;
    if (!vn && v != bv) return v > bv;
    return i < bi;
}

__global__ void argmax_kernel(const uint16_t *logits, int32_t vocab, int32_t *tokens) {
    __shared__ float sv[kThreads / 32];
    __shared__ int32_t si[kThreads / 32];
    const uint16_t *r = logits + (int64_t)blockIdx.x * vocab;
    float bv = -INFINITY;
    int32_t bi = vocab;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const float v = bf(r[i]);
        if (beats(v, i, bv, bi)) bv = v, bi = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (beats(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v0 = sv[0];
        int32_t i0 = si[0];
        for (int k = 1; k < kThreads / 32; k++)
            if (beats(sv[k], si[k], v0, i0)) v0 = sv[k], i0 = si[k];
        tokens[blockIdx.x] = i0 < vocab ? i0 : 0;
    }
}

__global__ void fill_kernel(uint16_t *p, int64_t count, float lo, float hi, uint64_t seed) {
    for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < count; i += (int64_t)gridDim.x * kThreads)
        p[i] = to_bf(__fmaf_rn(hi - lo, pkv_fill_u(seed, (uint64_t)i), lo));
}

__global__ void fill_fp8_kernel(uint8_t *p, int64_t count, float lo, float hi, uint64_t seed, int e5m2,
                                float inv_scale) {
    for (int64_t i = blockIdx.x * (int64_t)kThreads + threadIdx.x; i < count; i += (int64_t)gridDim.x * kThreads) {
        const float v = bf(to_bf(__fmaf_rn(hi - lo, pkv_fill_u(seed, (uint64_t)i), lo)));
        p[i] = __nv_cvt_float_to_fp8(v * inv_scale, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
    }
}

__global__ void scatter_kernel(int32_t *dst, const int32_t *pairs, int32_t n) {
    for (int32_t k = blockIdx.x * kThreads + threadIdx.x; k < n; k += gridDim.x * kThreads) dst[pairs[2 * k]] = pairs[2 * k + 1];
}

} // namespace

extern "C" pkv_status pkv_cuda_op_scatter_i32(pkv_ops *ops, int32_t *dst, const int32_t *pairs, int32_t n) {
    if (n == 0) return PKV_OK;
    const int32_t blocks = (n + kThreads - 1) / kThreads;
    scatter_kernel<<<blocks < 1024 ? blocks : 1024, kThreads, 0, stream_of(ops)>>>(dst, pairs, n);
    return launched("scatter_i32");
}

extern "C" pkv_status pkv_cuda_ops_host_alloc(pkv_ops *ops, size_t bytes, void **out) {
    (void)ops;
    const cudaError_t e = cudaHostAlloc(out, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *out = nullptr;
        return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "ops: cannot allocate %zu bytes of page-locked memory: %s", bytes,
                            cudaGetErrorString(e));
    }
    return PKV_OK;
}

extern "C" void pkv_cuda_ops_host_free(pkv_ops *ops, void *p) {
    (void)ops;
    cudaFreeHost(p);
}

extern "C" pkv_status pkv_cuda_ops_upload(pkv_ops *ops, void *dst, const void *src, size_t bytes) {
    const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_of(ops));
    if (e != cudaSuccess)
        return pkv_lab_fail(PKV_ERR_CUDA, "ops: upload of %zu bytes: %s", bytes, cudaGetErrorString(e));
    return PKV_OK;
}

extern "C" pkv_status pkv_cuda_op_fill_uniform(pkv_ops *ops, uint16_t *p, int64_t count, float lo, float hi,
                                               uint64_t seed) {
    if (count == 0) return PKV_OK;
    const int64_t blocks = (count + kThreads - 1) / kThreads;
    fill_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), kThreads, 0, stream_of(ops)>>>(p, count, lo, hi, seed);
    return launched("fill_uniform");
}

extern "C" pkv_status pkv_cuda_op_fill_uniform_fp8(pkv_ops *ops, uint8_t *p, int64_t count, float lo, float hi,
                                                   uint64_t seed, int e5m2, float inv_scale) {
    if (count == 0) return PKV_OK;
    const int64_t blocks = (count + kThreads - 1) / kThreads;
    fill_fp8_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), kThreads, 0, stream_of(ops)>>>(p, count, lo, hi, seed,
                                                                                               e5m2, inv_scale);
    return launched("fill_uniform_fp8");
}

extern "C" pkv_status pkv_cuda_ops_init(pkv_ops *ops) {
    if (!ops->stream) { // a stream of the ops' own: a graph cannot be captured on the legacy default stream
        cudaStream_t st = nullptr;
        if (cudaStreamCreate(&st) != cudaSuccess) {
            cudaGetLastError();
            return pkv_lab_fail(PKV_ERR_CUDA, "ops: cannot create a stream");
        }
        ops->stream = st;
        ops->own_stream = true;
    }
    cublasHandle_t h = nullptr;
    const cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        pkv_cuda_ops_release(ops);
        return pkv_lab_fail(PKV_ERR_CUDA, "cublasCreate failed (status %d)", (int)s);
    }
    if (cublasSetStream(h, stream_of(ops)) != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        pkv_cuda_ops_release(ops);
        return pkv_lab_fail(PKV_ERR_CUDA, "cublasSetStream failed");
    }
    ops->blas = h;
    return PKV_OK;
}

extern "C" void pkv_cuda_ops_release(pkv_ops *ops) {
    if (ops->blas) cublasDestroy(static_cast<cublasHandle_t>(ops->blas));
    ops->blas = nullptr;
    for (int k = 0; k < PKV_MAX_MARKS; k++) {
        if (ops->event[k]) cudaEventDestroy(static_cast<cudaEvent_t>(ops->event[k]));
        ops->event[k] = nullptr;
    }
    if (ops->own_stream) {
        cudaStreamSynchronize(stream_of(ops));
        cudaStreamDestroy(stream_of(ops));
        ops->stream = nullptr;
        ops->own_stream = false;
    }
    cudaGetLastError(); // nothing to report from a release
}

// Captures this thread's work only (ThreadLocal): another thread's use of the legacy stream is no error here.
extern "C" pkv_status pkv_cuda_ops_capture_begin(pkv_ops *ops) {
    const cudaError_t e = cudaStreamBeginCapture(stream_of(ops), cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return pkv_lab_fail(PKV_ERR_CUDA, "ops: cannot begin a graph capture: %s", cudaGetErrorString(e));
    }
    return PKV_OK;
}

extern "C" pkv_status pkv_cuda_ops_capture_end(pkv_ops *ops, void **graph) {
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_of(ops), &g);
    cudaGraphExec_t x = nullptr;
    if (e == cudaSuccess) e = cudaGraphInstantiate(&x, g, 0);
    if (g) cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return pkv_lab_fail(PKV_ERR_CUDA, "ops: graph capture failed: %s", cudaGetErrorString(e));
    }
    *graph = x;
    return PKV_OK;
}

extern "C" pkv_status pkv_cuda_ops_graph_launch(pkv_ops *ops, void *graph) {
    const cudaError_t e = cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream_of(ops));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return pkv_lab_fail(PKV_ERR_CUDA, "ops: graph launch failed: %s", cudaGetErrorString(e));
    }
    return PKV_OK;
}

extern "C" void pkv_cuda_ops_graph_free(void *graph) {
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
    cudaGetLastError();
}

extern "C" pkv_status pkv_cuda_ops_mark(pkv_ops *ops, int k) {
    if (!ops->event[k]) {
        cudaEvent_t e = nullptr;
        if (cudaEventCreate(&e) != cudaSuccess) return pkv_lab_fail(PKV_ERR_CUDA, "cannot create a timing event");
        ops->event[k] = e;
    }
    if (cudaEventRecord(static_cast<cudaEvent_t>(ops->event[k]), stream_of(ops)) != cudaSuccess)
        return pkv_lab_fail(PKV_ERR_CUDA, "cannot record a timing event");
    return PKV_OK;
}

extern "C" pkv_status pkv_cuda_ops_elapsed(pkv_ops *ops, int k, double *us) {
    float ms = 0.0f;
    const cudaError_t e = cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(ops->event[k]),
                                               static_cast<cudaEvent_t>(ops->event[k + 1]));
    if (e != cudaSuccess) return pkv_lab_fail(PKV_ERR_CUDA, "timing: %s", cudaGetErrorString(e));
    *us = 1e3 * ms;
    return PKV_OK;
}

extern "C" pkv_status pkv_cuda_ops_synchronize(pkv_ops *ops) {
    const cudaError_t e = cudaStreamSynchronize(stream_of(ops));
    if (e != cudaSuccess) return pkv_lab_fail(PKV_ERR_CUDA, "ops: %s", cudaGetErrorString(e));
    return PKV_OK;
}

extern "C" pkv_status pkv_cuda_op_embed(pkv_ops *ops, const uint16_t *table, int32_t vocab, int32_t hidden,
                                        const int32_t *tokens, int32_t B, uint16_t *out) {
    if (B == 0) return PKV_OK;
    embed_kernel<<<B, kThreads, 0, stream_of(ops)>>>(table, vocab, hidden, tokens, out);
    return launched("embed");
}

extern "C" pkv_status pkv_cuda_op_rmsnorm(pkv_ops *ops, const uint16_t *x, const uint16_t *w, int32_t B, int32_t n,
                                          float eps, uint16_t *out) {
    if (B == 0) return PKV_OK;
    rmsnorm_kernel<<<B, kThreads, 0, stream_of(ops)>>>(x, w, n, eps, out);
    return launched("rmsnorm");
}

extern "C" pkv_status pkv_cuda_op_add_rmsnorm(pkv_ops *ops, uint16_t *x, const uint16_t *y, const uint16_t *w,
                                              int32_t B, int32_t n, float eps, uint16_t *out) {
    if (B == 0) return PKV_OK;
    add_rmsnorm_kernel<<<B, kThreads, 0, stream_of(ops)>>>(x, y, w, n, eps, out);
    return launched("add_rmsnorm");
}

extern "C" pkv_status pkv_cuda_op_add(pkv_ops *ops, uint16_t *x, const uint16_t *y, int64_t count) {
    if (count == 0) return PKV_OK;
    const int64_t blocks = (count + kThreads - 1) / kThreads;
    add_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), kThreads, 0, stream_of(ops)>>>(x, y, count);
    return launched("add");
}

extern "C" pkv_status pkv_cuda_op_gemm(pkv_ops *ops, const uint16_t *x, int64_t x_stride, const uint16_t *W, int32_t B,
                                       int32_t N, int32_t K, uint16_t *y, int64_t y_stride) {
    if (B == 0) return PKV_OK;
    // column-major: y^T [N, B] = (W as K x N)^T [N, K] . (x as K x B)
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t s = cublasGemmEx(static_cast<cublasHandle_t>(ops->blas), CUBLAS_OP_T, CUBLAS_OP_N, N, B, K,
                                          &alpha, W, CUDA_R_16BF, K, x, CUDA_R_16BF, (int)x_stride, &beta, y,
                                          CUDA_R_16BF, (int)y_stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return pkv_lab_fail(PKV_ERR_CUDA, "gemm [%d x %d] x [%d x %d]^T: cublasGemmEx failed (status %d)", B, K, N, K,
                            (int)s);
    return PKV_OK;
}

extern "C" pkv_status pkv_cuda_op_rope(pkv_ops *ops, uint16_t *qkv, const int32_t *positions, int32_t B,
                                       int32_t q_heads, int32_t kv_heads, int32_t head_dim, const float *inv_freq) {
    if (B == 0) return PKV_OK;
    const int32_t heads = q_heads + kv_heads;
    rope_kernel<<<(unsigned)(B * heads), 64, 0, stream_of(ops)>>>(
        qkv, positions, heads, head_dim, (int64_t)(q_heads + 2 * kv_heads) * head_dim, inv_freq);
    return launched("rope");
}

extern "C" pkv_status pkv_cuda_op_silu_mul(pkv_ops *ops, const uint16_t *gu, int32_t B, int32_t mlp, uint16_t *out) {
    if (B == 0) return PKV_OK;
    const int32_t bx = (mlp + kThreads - 1) / kThreads;
    silu_mul_kernel<<<dim3((unsigned)(bx < 64 ? bx : 64), (unsigned)B), kThreads, 0, stream_of(ops)>>>(gu, mlp, out);
    return launched("silu_mul");
}

extern "C" pkv_status pkv_cuda_op_argmax(pkv_ops *ops, const uint16_t *logits, int32_t B, int32_t vocab,
                                         int32_t *tokens) {
    if (B == 0) return PKV_OK;
    argmax_kernel<<<B, kThreads, 0, stream_of(ops)>>>(logits, vocab, tokens);
    return launched("argmax");
}
