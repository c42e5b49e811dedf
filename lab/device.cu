// device.cu - the lab's device helpers for the pkv tool, benchmarks and tests (pkv_lab.h): memory, random
// fill, the ceilings measured in the same run (streaming read, pages floor, launch latency), event timing
// of plans and CUDA graphs.  Public API only: plans run through pkv_run.
#include "pkv_lab.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

// Records a failing CUDA call with file and line as the thread's last error and returns PKV_ERR_CUDA.
#define LAB_CUDA_TRY(ctx, call)                                                                        \
    do {                                                                                               \
        (void)(ctx);                                                                                   \
        cudaError_t err_ = (call);                                                                     \
        if (err_ != cudaSuccess)                                                                       \
            return pkv_lab_fail(PKV_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,              \
                                cudaGetErrorString(err_));                                             \
    } while (0)

namespace {

// A 16-byte load that bypasses L1 (the streaming reads of the ceilings).
__device__ __forceinline__ uint4 ldg_nc_v4(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

// Programmatic dependent launch (sm_90): lets the kernels queued behind this one start; a no-op before sm_90.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A late producer: its dependents may start now (griddepcontrol.launch_dependents); it writes after delay_ns.
__device__ __forceinline__ void start_dependents_then_wait(int64_t delay_ns) {
    pdl_launch_dependents();
    uint64_t t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    while ((int64_t)(t1 - t0) < delay_ns);
}

__global__ void copy_late_kernel(uint32_t *dst, const uint32_t *src, int64_t n, int64_t delay_ns) {
    start_dependents_then_wait(delay_ns);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

__global__ void fill_random_kernel(uint16_t *dst, int64_t n, uint64_t seed, int bf16, int64_t delay_ns) {
    if (delay_ns > 0) start_dependents_then_wait(delay_ns);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (uint64_t)i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float f = (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f; // [-1, 1)
        if (bf16) {
            __nv_bfloat16 b = __float2bfloat16_rn(f);
            dst[i] = *reinterpret_cast<uint16_t *>(&b);
        } else {
            __half h = __float2half_rn(f);
            dst[i] = *reinterpret_cast<uint16_t *>(&h);
        }
    }
}

// fp8 codes of uniform values in [-1, 1) times inv_scale (nearest even, saturating, as pkv_float_to_fp8); a value
// that rounds to zero takes the smallest code of its sign, so no code is zero.
__global__ void fill_random_fp8_kernel(uint8_t *dst, int64_t n, uint64_t seed, int e5m2, float inv_scale) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (uint64_t)i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float f = (float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
        const uint8_t c = __nv_cvt_float_to_fp8(f * inv_scale, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
        dst[i] = (c & 0x7fu) ? c : (uint8_t)(c | 1u);
    }
}

// Busy-waits about `ns` nanoseconds so that the launches queued behind it are off the host's clock.
__global__ void spin_kernel(int64_t ns) {
    uint64_t t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        uint64_t t1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        if ((int64_t)(t1 - t0) >= ns) break;
    }
}

__global__ void empty_kernel() {}

// A stand-in for the kernel that writes q before an attention step (RoPE, a projection's epilogue):
// q[i] ^= x over the whole q tensor (x = 0: q keeps its values).  trigger: it lets a programmatic
// dependent be scheduled from its start (griddepcontrol.launch_dependents), as PDL-aware kernels do;
// else the dependent is scheduled as its CTAs exit.
__global__ void producer_kernel(uint32_t *q, int64_t n32, uint32_t x, int trigger) {
    if (trigger) pdl_launch_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n32; i += (int64_t)gridDim.x * blockDim.x)
        q[i] ^= x;
}

__global__ void read_kernel(const uint4 *__restrict__ src, int64_t n16, uint32_t *sink) {
    uint32_t x = 0;
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = ldg_nc_v4(src + i), b = ldg_nc_v4(src + i + stride);
        uint4 c = ldg_nc_v4(src + i + 2 * stride), d = ldg_nc_v4(src + i + 3 * stride);
        x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        uint4 a = ldg_nc_v4(src + i);
        x ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (x == 0x12345678u) *sink = x; // keeps the loads alive
}

// Reads whole pages: item i < 2 x npages is page pages[i / 2] of K (even i) or V (odd i), page_vec
// 16-byte vectors each; a warp per item, eight loads in flight per lane.
__global__ void gather_kernel(const int32_t *__restrict__ pages, int32_t npages, const uint4 *__restrict__ k,
                              const uint4 *__restrict__ v, int64_t page_vec, uint32_t *sink) {
    uint32_t x = 0;
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t it = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; it < 2 * (int64_t)npages; it += warps) {
        const uint4 *src = ((it & 1) ? v : k) + (int64_t)__ldg(pages + (it >> 1)) * page_vec;
        int64_t i = lane;
        for (; i + 7 * 32 < page_vec; i += 8 * 32) {
            uint4 r[8];
#pragma unroll
            for (int u = 0; u < 8; u++) r[u] = ldg_nc_v4(src + i + u * 32);
#pragma unroll
            for (int u = 0; u < 8; u++) x ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
        }
        for (; i < page_vec; i += 32) {
            const uint4 a = ldg_nc_v4(src + i);
            x ^= a.x ^ a.y ^ a.z ^ a.w;
        }
    }
    if (x == 0x12345678u) *sink = x; // keeps the loads alive
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

constexpr int64_t kSpinNs = 30000;

// Times reps runs the way every step is timed here: CUDA events around each run on the default stream,
// the runs queued in batches of 16 behind a spin so that the host's enqueueing is off the clock.
// enqueue(r) queues run r and returns PKV_OK or why it could not; samples_us[r] is run r's time;
// what names the runs in errors.
template <typename Enqueue>
pkv_status time_runs(pkv_context *ctx, int32_t reps, const char *what, Enqueue enqueue, double *samples_us) {
    std::vector<cudaEvent_t> ev(2 * (size_t)reps);
    for (auto &e : ev) LAB_CUDA_TRY(ctx, cudaEventCreate(&e));
    pkv_status result = PKV_OK;
    for (int32_t r = 0; r < reps && result == PKV_OK; r++) {
        if (r % 16 == 0) {
            spin_kernel<<<1, 1>>>(kSpinNs * 4);
            if (cudaGetLastError() != cudaSuccess) result = pkv_lab_fail(PKV_ERR_CUDA, "spin launch failed");
        }
        cudaEventRecord(ev[2 * r], nullptr);
        if (result == PKV_OK) result = enqueue(r);
        cudaEventRecord(ev[2 * r + 1], nullptr);
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess && result == PKV_OK)
        result = pkv_lab_fail(PKV_ERR_CUDA, "%s failed: %s", what, cudaGetErrorString(e));
    for (int32_t r = 0; r < reps && result == PKV_OK; r++) {
        float ms = 0;
        e = cudaEventElapsedTime(&ms, ev[2 * r], ev[2 * r + 1]);
        if (e != cudaSuccess) result = pkv_lab_fail(PKV_ERR_CUDA, "event timing failed: %s", cudaGetErrorString(e));
        samples_us[r] = ms * 1000.0;
    }
    for (auto &x : ev) cudaEventDestroy(x);
    return result;
}

// Times one kernel like a step (time_runs) at three grid sizes - 2, 4 and 8 CTAs per SM, each capped at
// max_grid - and writes the best of the three medians over reps.  launch(grid, r) enqueues run r; what
// names it in errors.
template <typename Launch>
pkv_status best_median_over_grids(pkv_context *ctx, int32_t reps, int64_t max_grid, const char *what, Launch launch,
                                  double *median_us) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const int grids[3] = {sms * 2, sms * 4, sms * 8};
    double best = 1e30;
    std::vector<double> t(reps);
    for (int gi = 0; gi < 3; gi++) {
        const int grid = (int)std::min<int64_t>(grids[gi], max_grid);
        const pkv_status st = time_runs(
            ctx, reps, what,
            [&](int32_t r) {
                launch(grid, r);
                return cudaGetLastError() == cudaSuccess ? PKV_OK : pkv_lab_fail(PKV_ERR_CUDA, "%s launch failed", what);
            },
            t.data());
        if (st != PKV_OK) return st;
        best = std::min(best, median(t));
    }
    *median_us = best;
    return PKV_OK;
}

} // namespace

extern "C" {

pkv_status pkv_dev_malloc(pkv_context *ctx, size_t bytes, void **ptr) {
    if (!ptr) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "ptr is NULL");
    *ptr = nullptr;
    LAB_CUDA_TRY(ctx, cudaMalloc(ptr, bytes ? bytes : 1));
    return PKV_OK;
}
pkv_status pkv_dev_free(pkv_context *ctx, void *ptr) {
    if (ptr) LAB_CUDA_TRY(ctx, cudaFree(ptr));
    return PKV_OK;
}
// The copies and the memset return when they are done on the device: a pageable cudaMemcpy to the
// device may return once the source is staged, and cudaMemset once it is queued, and neither orders
// against a non-blocking stream (a graph replay's) that reads the buffer next.
pkv_status pkv_dev_copy_h2d(pkv_context *ctx, void *dst, const void *src, size_t bytes) {
    if (!bytes) return PKV_OK;
    LAB_CUDA_TRY(ctx, cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    LAB_CUDA_TRY(ctx, cudaDeviceSynchronize());
    return PKV_OK;
}
pkv_status pkv_dev_copy_d2h(pkv_context *ctx, void *dst, const void *src, size_t bytes) {
    if (bytes) LAB_CUDA_TRY(ctx, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return PKV_OK;
}
pkv_status pkv_dev_memset(pkv_context *ctx, void *dst, int value, size_t bytes) {
    if (!bytes) return PKV_OK;
    LAB_CUDA_TRY(ctx, cudaMemset(dst, value, bytes));
    LAB_CUDA_TRY(ctx, cudaDeviceSynchronize());
    return PKV_OK;
}
pkv_status pkv_dev_synchronize(pkv_context *ctx) {
    LAB_CUDA_TRY(ctx, cudaDeviceSynchronize());
    return PKV_OK;
}

pkv_status pkv_dev_fill_random(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, uint64_t seed) {
    if (dtype != PKV_DTYPE_FP16 && dtype != PKV_DTYPE_BF16)
        return pkv_lab_fail(PKV_ERR_UNSUPPORTED_DTYPE, "pkv_dev_fill_random writes fp16 or bf16, not dtype %d", (int)dtype);
    if (count <= 0) return PKV_OK;
    fill_random_kernel<<<1024, 256>>>(static_cast<uint16_t *>(dst), count, seed, dtype == PKV_DTYPE_BF16, 0);
    LAB_CUDA_TRY(ctx, cudaGetLastError());
    LAB_CUDA_TRY(ctx, cudaDeviceSynchronize());
    return PKV_OK;
}

pkv_status pkv_dev_fill_random_fp8(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, float scale,
                                   uint64_t seed) {
    if (dtype != PKV_DTYPE_FP8_E4M3 && dtype != PKV_DTYPE_FP8_E5M2)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "an fp8 fill takes PKV_DTYPE_FP8_E4M3 or _E5M2, not %d", (int)dtype);
    if (!(scale > 0.0f && scale <= FLT_MAX))
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "an fp8 fill's scale is positive and finite, not %g", (double)scale);
    if (count <= 0) return PKV_OK;
    fill_random_fp8_kernel<<<1024, 256>>>(static_cast<uint8_t *>(dst), count, seed, dtype == PKV_DTYPE_FP8_E5M2,
                                          1.0f / scale);
    LAB_CUDA_TRY(ctx, cudaGetLastError());
    LAB_CUDA_TRY(ctx, cudaDeviceSynchronize());
    return PKV_OK;
}

pkv_status pkv_dev_fill_random_late(pkv_context *ctx, void *dst, int64_t count, pkv_dtype dtype, uint64_t seed,
                                    int64_t delay_ns) {
    if (!dst || count <= 0 || delay_ns <= 0)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "a late fill needs a buffer, a count and a delay");
    if (dtype != PKV_DTYPE_FP16 && dtype != PKV_DTYPE_BF16)
        return pkv_lab_fail(PKV_ERR_UNSUPPORTED_DTYPE, "a late fill writes fp16 or bf16, not dtype %d", (int)dtype);
    fill_random_kernel<<<1, 256>>>(static_cast<uint16_t *>(dst), count, seed, dtype == PKV_DTYPE_BF16, delay_ns);
    LAB_CUDA_TRY(ctx, cudaGetLastError());
    return PKV_OK;
}

pkv_status pkv_dev_copy_late(pkv_context *ctx, void *dst, const void *src, size_t bytes, int64_t delay_ns) {
    if (!dst || !src || bytes == 0 || bytes % 4 != 0 || delay_ns <= 0)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "a late copy needs buffers, a multiple of 4 bytes and a delay");
    copy_late_kernel<<<1, 256>>>(static_cast<uint32_t *>(dst), static_cast<const uint32_t *>(src),
                                 (int64_t)(bytes / 4), delay_ns);
    LAB_CUDA_TRY(ctx, cudaGetLastError());
    return PKV_OK;
}

pkv_status pkv_dev_get_info(pkv_context *ctx, pkv_dev_info *info) {
    if (!info) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "info is NULL");
    memset(info, 0, sizeof *info);
    int dev = 0;
    LAB_CUDA_TRY(ctx, cudaGetDevice(&dev));
    cudaDeviceProp p;
    LAB_CUDA_TRY(ctx, cudaGetDeviceProperties(&p, dev));
    snprintf(info->name, sizeof info->name, "%.127s", p.name);
    info->sms = p.multiProcessorCount;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->l2_bytes = p.l2CacheSize;
    info->mem_bytes = (int64_t)p.totalGlobalMem;
    size_t mem_free = 0, mem_total = 0;
    LAB_CUDA_TRY(ctx, cudaMemGetInfo(&mem_free, &mem_total));
    info->mem_free_bytes = (int64_t)mem_free;
    LAB_CUDA_TRY(ctx, cudaRuntimeGetVersion(&info->runtime_version));
    LAB_CUDA_TRY(ctx, cudaDriverGetVersion(&info->driver_version));
    return PKV_OK;
}

pkv_status pkv_dev_time_plan(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                             const pkv_tensors *base, const int32_t *const *page_sets, int32_t nsets, int32_t warmup,
                             int32_t reps, double *samples_us) {
    if (!plan || !base || !samples_us || (nsets > 0 && !page_sets))
        return pkv_lab_fail(PKV_ERR_NULL_POINTER, "plan, tensors, page sets and samples must not be NULL");
    if (reps <= 0) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "reps must be positive");
    pkv_tensors t = *base;
    pkv_status st = pkv_plan_upload(ctx, plan, ws, ws_bytes, nullptr);
    if (st != PKV_OK) return st;
    for (int32_t r = 0; r < warmup; r++) {
        if (nsets > 0) t.kv_page_indices = page_sets[r % nsets];
        st = pkv_run(ctx, plan, ws, ws_bytes, &t, nullptr);
        if (st != PKV_OK) return st;
    }
    return time_runs(
        ctx, reps, "timed runs",
        [&](int32_t r) {
            if (nsets > 0) t.kv_page_indices = page_sets[(warmup + r) % nsets];
            return pkv_run(ctx, plan, ws, ws_bytes, &t, nullptr);
        },
        samples_us);
}

pkv_status pkv_dev_time_plan_behind(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                                    const pkv_tensors *base, const int32_t *const *page_sets, int32_t nsets,
                                    int32_t warmup, int32_t reps, int trigger, double *producer_us, double *pair_us) {
    if (!plan || !base || !producer_us || !pair_us || (nsets > 0 && !page_sets))
        return pkv_lab_fail(PKV_ERR_NULL_POINTER, "plan, tensors, page sets and outputs must not be NULL");
    if (reps <= 0) return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "reps must be positive");
    const pkv_problem *pr = pkv_plan_problem(plan);
    if (base->q_row_stride != 0 && base->q_row_stride != (int64_t)pr->num_qo_heads * pr->head_dim)
        return pkv_lab_fail(PKV_ERR_UNSUPPORTED, "the producer writes a dense q: q_row_stride must be 0 here");
    const int64_t n32 = (int64_t)pkv_plan_batch_size(plan) * pr->num_qo_heads * pr->head_dim / 2;
    int dev = 0, sms = 0;
    LAB_CUDA_TRY(ctx, cudaGetDevice(&dev));
    LAB_CUDA_TRY(ctx, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const unsigned grid = (unsigned)std::max<int64_t>(1, std::min<int64_t>(2 * (int64_t)sms, (n32 + 255) / 256));
    uint32_t *q = static_cast<uint32_t *>(const_cast<void *>(base->q));
    pkv_tensors t = *base;
    pkv_status st = pkv_plan_upload(ctx, plan, ws, ws_bytes, nullptr);
    for (int32_t r = 0; r < warmup && st == PKV_OK; r++) {
        if (nsets > 0) t.kv_page_indices = page_sets[r % nsets];
        producer_kernel<<<grid, 256>>>(q, n32, 0u, trigger);
        st = pkv_run(ctx, plan, ws, ws_bytes, &t, nullptr);
    }
    if (st != PKV_OK) return st;
    // pass 0: the producer alone; pass 1: the producer, then the step (events around the pair)
    std::vector<double> samples[2] = {std::vector<double>(reps), std::vector<double>(reps)};
    for (int pass = 0; pass < 2 && st == PKV_OK; pass++)
        st = time_runs(
            ctx, reps, "timed runs behind a producer",
            [&](int32_t r) {
                if (nsets > 0) t.kv_page_indices = page_sets[(warmup + r) % nsets];
                producer_kernel<<<grid, 256>>>(q, n32, 0u, trigger);
                if (cudaGetLastError() != cudaSuccess) return pkv_lab_fail(PKV_ERR_CUDA, "producer launch failed");
                return pass == 1 ? pkv_run(ctx, plan, ws, ws_bytes, &t, nullptr) : PKV_OK;
            },
            samples[pass].data());
    if (st == PKV_OK) {
        *producer_us = median(samples[0]);
        *pair_us = median(samples[1]);
    }
    return st;
}

pkv_status pkv_dev_time_read(pkv_context *ctx, const void *buf, size_t buf_bytes, size_t bytes, int32_t reps,
                             double *median_us) {
    if (!buf || !median_us) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "buffer and output must not be NULL");
    bytes &= ~(size_t)15;
    if (bytes == 0 || bytes > buf_bytes)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "read of %zu bytes from a %zu-byte buffer", bytes, buf_bytes);
    uint32_t *sink = nullptr;
    LAB_CUDA_TRY(ctx, cudaMalloc(&sink, sizeof(uint32_t)));
    const size_t windows = std::max<size_t>(1, buf_bytes / bytes);
    const int64_t n16 = (int64_t)(bytes / 16);
    const pkv_status st = best_median_over_grids(
        ctx, reps, (n16 + 255) / 256, "read",
        [&](int grid, int32_t r) {
            const char *src = static_cast<const char *>(buf) + ((size_t)r % windows) * bytes;
            read_kernel<<<grid, 256>>>(reinterpret_cast<const uint4 *>(src), n16, sink);
        },
        median_us);
    cudaFree(sink);
    return st;
}

pkv_status pkv_dev_time_gather(pkv_context *ctx, const void *k, const void *v, size_t page_bytes,
                               const int32_t *const *page_sets, int32_t nsets, int32_t npages, int32_t reps,
                               double *median_us) {
    if (!k || !v || !page_sets || !median_us) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "pools, page sets and output must not be NULL");
    if (nsets <= 0 || npages <= 0 || reps <= 0 || page_bytes == 0 || page_bytes % 16 != 0)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT, "gather of %d pages of %zu bytes, %d sets, %d reps", npages,
                        page_bytes, nsets, reps);
    uint32_t *sink = nullptr;
    LAB_CUDA_TRY(ctx, cudaMalloc(&sink, sizeof(uint32_t)));
    const pkv_status st = best_median_over_grids(
        ctx, reps, (2 * (int64_t)npages + 7) / 8 /* 8 warps per CTA, a warp per page */, "gather",
        [&](int grid, int32_t r) {
            gather_kernel<<<grid, 256>>>(page_sets[r % nsets], npages, static_cast<const uint4 *>(k),
                                         static_cast<const uint4 *>(v), (int64_t)(page_bytes / 16), sink);
        },
        median_us);
    cudaFree(sink);
    return st;
}

pkv_status pkv_dev_launch_latency(pkv_context *ctx, double *empty_us, double *graph_us) {
    if (!empty_us || !graph_us) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "outputs must not be NULL");
    cudaStream_t s;
    LAB_CUDA_TRY(ctx, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    LAB_CUDA_TRY(ctx, cudaEventCreate(&a));
    LAB_CUDA_TRY(ctx, cudaEventCreate(&b));
    const int n = 2000;
    for (int i = 0; i < 100; i++) empty_kernel<<<1, 32, 0, s>>>();
    LAB_CUDA_TRY(ctx, cudaStreamSynchronize(s));
    std::vector<double> per;
    for (int rep = 0; rep < 5; rep++) {
        spin_kernel<<<1, 1, 0, s>>>(kSpinNs * 100); // the host queues all launches meanwhile
        cudaEventRecord(a, s);
        for (int i = 0; i < n; i++) empty_kernel<<<1, 32, 0, s>>>();
        cudaEventRecord(b, s);
        LAB_CUDA_TRY(ctx, cudaStreamSynchronize(s));
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        per.push_back(ms * 1000.0 / n);
    }
    *empty_us = median(per);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    LAB_CUDA_TRY(ctx, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    empty_kernel<<<1, 32, 0, s>>>();
    LAB_CUDA_TRY(ctx, cudaStreamEndCapture(s, &g));
    LAB_CUDA_TRY(ctx, cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 100; i++) cudaGraphLaunch(ge, s);
    LAB_CUDA_TRY(ctx, cudaStreamSynchronize(s));
    per.clear();
    for (int rep = 0; rep < 5; rep++) {
        spin_kernel<<<1, 1, 0, s>>>(kSpinNs * 100);
        cudaEventRecord(a, s);
        for (int i = 0; i < n; i++) cudaGraphLaunch(ge, s);
        cudaEventRecord(b, s);
        LAB_CUDA_TRY(ctx, cudaStreamSynchronize(s));
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        per.push_back(ms * 1000.0 / n);
    }
    *graph_us = median(per);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    return PKV_OK;
}

struct pkv_dev_graph {
    cudaStream_t stream; // non-blocking: a replay orders itself after the default stream's work (queued)
    cudaEvent_t queued;
    cudaGraphExec_t exec;
    uint64_t signature;
};

pkv_status pkv_dev_graph_capture(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes,
                                 const pkv_tensors *t, void **graph) {
    if (!graph) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "graph output is NULL");
    *graph = nullptr;
    pkv_dev_graph *h = static_cast<pkv_dev_graph *>(calloc(1, sizeof(pkv_dev_graph)));
    if (!h) return pkv_lab_fail(PKV_ERR_OUT_OF_MEMORY, "cannot allocate a graph handle");
    h->signature = pkv_plan_graph_signature(plan);
    if (cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking) != cudaSuccess) {
        free(h);
        return pkv_lab_fail(PKV_ERR_CUDA, "cannot create the graph's stream");
    }
    if (cudaEventCreateWithFlags(&h->queued, cudaEventDisableTiming) != cudaSuccess) {
        pkv_dev_graph_free(h);
        return pkv_lab_fail(PKV_ERR_CUDA, "cannot create the graph's event");
    }
    pkv_status st = pkv_plan_upload(ctx, plan, ws, ws_bytes, h->stream);
    if (st == PKV_OK && cudaStreamSynchronize(h->stream) != cudaSuccess) st = pkv_lab_fail(PKV_ERR_CUDA, "upload failed");
    cudaGraph_t g = nullptr;
    if (st == PKV_OK && cudaStreamBeginCapture(h->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        st = pkv_lab_fail(PKV_ERR_CUDA, "cannot begin capture");
    if (st == PKV_OK) {
        pkv_status rs = pkv_run(ctx, plan, ws, ws_bytes, t, h->stream);
        cudaError_t e = cudaStreamEndCapture(h->stream, &g);
        if (rs != PKV_OK)
            st = rs;
        else if (e != cudaSuccess)
            st = pkv_lab_fail(PKV_ERR_CUDA, "capture failed: %s", cudaGetErrorString(e));
    }
    if (st == PKV_OK && cudaGraphInstantiate(&h->exec, g, 0) != cudaSuccess)
        st = pkv_lab_fail(PKV_ERR_CUDA, "graph instantiation failed");
    if (g) cudaGraphDestroy(g);
    if (st != PKV_OK) {
        pkv_dev_graph_free(h);
        return st;
    }
    *graph = h;
    return PKV_OK;
}

pkv_status pkv_dev_graph_replay(pkv_context *ctx, void *graph, const pkv_plan *plan, void *ws, size_t ws_bytes) {
    pkv_dev_graph *h = static_cast<pkv_dev_graph *>(graph);
    if (!h || !plan) return pkv_lab_fail(PKV_ERR_NULL_POINTER, "graph or plan is NULL");
    const uint64_t sig = pkv_plan_graph_signature(plan);
    if (sig == 0 || sig != h->signature)
        return pkv_lab_fail(PKV_ERR_INVALID_ARGUMENT,
                        "the plan's launches are not the captured ones (graph signature %llx, captured %llx)",
                        (unsigned long long)sig, (unsigned long long)h->signature);
    // after what the caller queued on the default stream (its inputs, a poisoned output), as a replay
    // on that stream would be; the stream is non-blocking, so nothing orders it otherwise
    if (cudaEventRecord(h->queued, cudaStreamLegacy) != cudaSuccess || cudaStreamWaitEvent(h->stream, h->queued, 0) != cudaSuccess)
        return pkv_lab_fail(PKV_ERR_CUDA, "cannot order the replay after the default stream");
    pkv_status st = pkv_plan_upload(ctx, plan, ws, ws_bytes, h->stream);
    if (st != PKV_OK) return st;
    if (cudaGraphLaunch(h->exec, h->stream) != cudaSuccess) return pkv_lab_fail(PKV_ERR_CUDA, "graph launch failed");
    cudaError_t e = cudaStreamSynchronize(h->stream);
    if (e != cudaSuccess) return pkv_lab_fail(PKV_ERR_CUDA, "graph replay failed: %s", cudaGetErrorString(e));
    return PKV_OK;
}

pkv_status pkv_dev_graph_run(pkv_context *ctx, const pkv_plan *plan, void *ws, size_t ws_bytes, const pkv_tensors *t,
                             int32_t replays) {
    void *graph = nullptr;
    pkv_status st = pkv_dev_graph_capture(ctx, plan, ws, ws_bytes, t, &graph);
    if (st != PKV_OK) return st;
    pkv_dev_graph *h = static_cast<pkv_dev_graph *>(graph);
    for (int32_t r = 0; st == PKV_OK && r < replays; r++)
        if (cudaGraphLaunch(h->exec, h->stream) != cudaSuccess) st = pkv_lab_fail(PKV_ERR_CUDA, "graph launch failed");
    if (st == PKV_OK && cudaStreamSynchronize(h->stream) != cudaSuccess)
        st = pkv_lab_fail(PKV_ERR_CUDA, "graph replay failed");
    pkv_dev_graph_free(graph);
    return st;
}

void pkv_dev_graph_free(void *graph) {
    pkv_dev_graph *h = static_cast<pkv_dev_graph *>(graph);
    if (!h) return;
    if (h->exec) cudaGraphExecDestroy(h->exec);
    if (h->queued) cudaEventDestroy(h->queued);
    if (h->stream) cudaStreamDestroy(h->stream);
    free(h);
}

} // extern "C"
