// append.cu - the append-KV kernel (pkv_append_kv) and the page-copy kernel (pkv_copy_pages, copy-on-write).
//
// Append: the step's new K and V ([num_tokens, Hkv, d] each, tokens k_token_stride / v_token_stride elements
// apart) into their slots of the pages.  One work item is one 16-byte vector (8 elements) of one (token, K or
// V, KV head): items are numbered token-major, then K/V, then head, then vector, so consecutive threads write
// consecutive 16 bytes of a head's d values (and, in NHD, of consecutive heads): full 32-byte sectors, as a
// pure copy writes them.  A grid-stride loop over the items with 256 threads per CTA.  Each item finds its
// token's slot itself - FlashInfer's form reads batch_indices and positions, the ragged form searches
// append_indptr (log B cached loads), the decode form is row = token - from the rows' lengths (seq_lens, or
// kv_indptr and kv_last_page_len).  An item whose row, position or page id is out of range is skipped: the
// kernel never writes outside the pools (the host cannot check device-side indices without a sync; the CPU
// backend checks them and reports).  Nothing is allocated and the launch depends only on its arguments, so a
// CUDA graph can capture it (a replay appends the same number of tokens).
//
// An fp8 cache (pkv_problem.kv_dtype): the same items, each 8 values converted to fp32, divided by the
// tensor's scale (or its KV head's, from the per-head arrays in device memory) and stored as 8 fp8 codes
// (one 8-byte store) by cvt.rn.satfinite - round to nearest even, a quotient beyond the largest finite
// stored as the largest finite of its sign, NaN as NaN: the CPU backend's pkv_float_to_fp8.
//
// Copy: up to PKV_MAX_PAGE_COPIES whole pages per launch, the list in the launch's parameters (no upload, so
// the copies can be captured too): CTA (copy, K or V, part) copies its part of the page with 16-byte loads
// and stores; a page is bytes to it (fp16, bf16 or fp8 elements alike).
//
// Last measured: not yet on a GPU (bench/compare_flashinfer.py --append times it against FlashInfer's
// append_paged_kv_cache and a pure write of the same bytes).
#include "cuda_common.cuh"
#include "pkv_cuda.h"

#include <cuda_fp8.h>

namespace pkv {
namespace {

constexpr int kAppendThreads = 256;
constexpr int kAppendMaxCtas = 8192; // the grid-stride loop covers the rest
constexpr int kCopyThreads = 256;
constexpr int kCopyParts = 8; // CTAs per page half (K or V)

struct append_params {
    const uint16_t *k, *v;
    int64_t k_stride, v_stride; // elements per token
    void *k_cache, *v_cache;    // fp16 / bf16, or fp8 codes
    int64_t page_stride, head_stride, token_stride; // elements of the cache
    const int32_t *indptr, *indices, *last_page_len, *seq_lens, *batch_indices, *positions, *append_indptr;
    int32_t batch_size, num_tokens, hkv, vecs, page_size;
    int64_t num_pages;
    float k_scale, v_scale; // fp8 caches: the divisors, per tensor
    const float *k_scales, *v_scales; // fp8 caches: per KV head (device memory), or NULL
    int32_t bf16;           // fp8 caches: k and v are bf16 (else fp16)
};

__device__ __forceinline__ int64_t row_length(const append_params &a, int32_t row, int32_t npages) {
    if (a.seq_lens) return a.seq_lens[row];
    return npages > 0 ? (int64_t)(npages - 1) * a.page_size + a.last_page_len[row] : 0;
}

// The element offset in the pools of item i's 8 values (token tok, K or V: *is_v, KV head h, vector vec), or
// -1 when its row, position or page id is out of range.
__device__ __forceinline__ int64_t item_slot(const append_params &a, int64_t i, int32_t *tok_out, int32_t *is_v_out,
                                             int32_t *h_out, int32_t *vec_out) {
    const int32_t vec = (int32_t)(i % a.vecs);
    int64_t r = i / a.vecs;
    const int32_t h = (int32_t)(r % a.hkv);
    r /= a.hkv;
    const int32_t is_v = (int32_t)(r & 1), tok = (int32_t)(r >> 1);
    *tok_out = tok, *is_v_out = is_v, *h_out = h, *vec_out = vec;
    int32_t row;
    int64_t pos;
    if (a.batch_indices) {
        row = a.batch_indices[tok];
        if (row < 0 || row >= a.batch_size) return -1;
        pos = a.positions[tok];
    } else {
        if (a.append_indptr) { // the row r with append_indptr[r] <= tok < append_indptr[r + 1]
            int32_t lo = 0, hi = a.batch_size;
            while (hi - lo > 1) {
                const int32_t mid = lo + (hi - lo) / 2;
                if (a.append_indptr[mid] <= tok) lo = mid;
                else hi = mid;
            }
            row = lo;
        } else {
            row = tok;
        }
        const int32_t npages = a.indptr[row + 1] - a.indptr[row];
        const int64_t n = a.append_indptr ? a.append_indptr[row + 1] - a.append_indptr[row] : 1;
        const int64_t k = a.append_indptr ? tok - a.append_indptr[row] : 0;
        pos = row_length(a, row, npages) - n + k;
    }
    const int32_t base = a.indptr[row], npages = a.indptr[row + 1] - base;
    if (pos < 0 || pos >= (int64_t)npages * a.page_size) return -1;
    const int32_t page = a.indices[base + pos / a.page_size];
    if (page < 0 || page >= a.num_pages) return -1;
    return (int64_t)page * a.page_stride + (int64_t)h * a.head_stride + (pos % a.page_size) * a.token_stride +
           (int64_t)vec * 8;
}

// The item's 8 new values (16 bytes of k or v).
__device__ __forceinline__ uint4 item_values(const append_params &a, int32_t tok, int32_t is_v, int32_t h,
                                             int32_t vec) {
    const int64_t d = (int64_t)a.vecs * 8;
    const uint16_t *src = is_v ? a.v + (int64_t)tok * a.v_stride : a.k + (int64_t)tok * a.k_stride;
    return ldg_nc_v4(src + h * d + (int64_t)vec * 8);
}

// Two values of a 32-bit word of fp16 or bf16 as floats.
__device__ __forceinline__ float2 pair_to_float2(uint32_t w, int32_t bf16) {
    if (bf16) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w));
    return __half22float2(*reinterpret_cast<const __half2 *>(&w));
}

// Two values / scale as two fp8 codes (low byte: the first), round to nearest even, saturating.
template <__nv_fp8_interpretation_t kFormat>
__device__ __forceinline__ uint32_t quantize_pair(uint32_t w, int32_t bf16, float scale) {
    float2 f = pair_to_float2(w, bf16);
    f.x = __fdiv_rn(f.x, scale);
    f.y = __fdiv_rn(f.y, scale);
    return (uint32_t)__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, kFormat);
}

// How an item's 8 values (KV head h) land in the cache at element offset dst: as they are (a cache of their
// type), or divided by the tensor's or the head's scale as 8 fp8 codes.
struct store_same {
    __device__ __forceinline__ void operator()(const append_params &a, int64_t dst, int32_t is_v, int32_t,
                                               uint4 val) const {
        *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(is_v ? a.v_cache : a.k_cache) + dst) = val;
    }
};
template <__nv_fp8_interpretation_t kFormat> struct store_fp8 {
    __device__ __forceinline__ void operator()(const append_params &a, int64_t dst, int32_t is_v, int32_t h,
                                               uint4 val) const {
        const float *heads = is_v ? a.v_scales : a.k_scales;
        const float scale = heads ? heads[h] : is_v ? a.v_scale : a.k_scale;
        uint2 out;
        out.x = quantize_pair<kFormat>(val.x, a.bf16, scale) | (quantize_pair<kFormat>(val.y, a.bf16, scale) << 16);
        out.y = quantize_pair<kFormat>(val.z, a.bf16, scale) | (quantize_pair<kFormat>(val.w, a.bf16, scale) << 16);
        *reinterpret_cast<uint2 *>(static_cast<uint8_t *>(is_v ? a.v_cache : a.k_cache) + dst) = out;
    }
};

template <typename Store> __global__ void __launch_bounds__(kAppendThreads) append_kernel(const append_params a) {
    const int64_t total = (int64_t)a.num_tokens * 2 * a.hkv * a.vecs;
    for (int64_t i = (int64_t)blockIdx.x * kAppendThreads + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * kAppendThreads) {
        int32_t tok, is_v, h, vec;
        const int64_t dst = item_slot(a, i, &tok, &is_v, &h, &vec);
        if (dst < 0) continue;
        Store()(a, dst, is_v, h, item_values(a, tok, is_v, h, vec));
    }
}

struct copy_params {
    uint8_t *k_cache, *v_cache;
    int64_t page_stride, page_vecs; // bytes from page to page; 16-byte vectors in a page
    pkv_page_copy copies[PKV_MAX_PAGE_COPIES];
};

__global__ void __launch_bounds__(kCopyThreads) copy_kernel(const copy_params c) {
    const pkv_page_copy cp = c.copies[blockIdx.x];
    uint8_t *cache = blockIdx.y ? c.v_cache : c.k_cache;
    const uint4 *src = reinterpret_cast<const uint4 *>(cache + (int64_t)cp.src_page * c.page_stride);
    uint4 *dst = reinterpret_cast<uint4 *>(cache + (int64_t)cp.dst_page * c.page_stride);
    for (int64_t e = (int64_t)blockIdx.z * kCopyThreads + threadIdx.x; e < c.page_vecs;
         e += (int64_t)kCopyParts * kCopyThreads)
        dst[e] = src[e];
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} // namespace
} // namespace pkv

extern "C" pkv_status pkv_cuda_append(pkv_context *ctx, const pkv_problem *p, int32_t batch_size, int32_t num_tokens,
                                      const pkv_append_tensors *t, void *stream) {
    using namespace pkv;
    const int64_t tok_elems = (int64_t)p->num_kv_heads * p->head_dim;
    const int64_t ks = t->k_token_stride > 0 ? t->k_token_stride : tok_elems;
    const int64_t vs = t->v_token_stride > 0 ? t->v_token_stride : tok_elems;
    const pkv_kv_strides st = pkv_kv_strides_of(p);
    const int64_t ps = t->kv_page_stride > 0 ? t->kv_page_stride : st.page;
    const pkv_dtype kv_dtype = pkv_kv_dtype(p);
    const int64_t ps_bytes = ps * (int64_t)pkv_dtype_size(kv_dtype);
    if (!aligned16(t->k) || !aligned16(t->v) || !aligned16(t->k_cache) || !aligned16(t->v_cache) || ks % 8 || vs % 8 ||
        ps_bytes % 16)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "pkv_append_kv: the CUDA backend needs k, v and the caches 16-byte aligned, the token strides "
                        "multiples of 8 (%lld, %lld) and the page stride of 16 bytes (%lld elements)",
                        (long long)ks, (long long)vs, (long long)ps);
    append_params a;
    a.k = static_cast<const uint16_t *>(t->k);
    a.v = static_cast<const uint16_t *>(t->v);
    a.k_stride = ks;
    a.v_stride = vs;
    a.k_cache = t->k_cache;
    a.v_cache = t->v_cache;
    a.page_stride = ps;
    a.head_stride = st.head;
    a.token_stride = st.token;
    a.indptr = t->kv_indptr;
    a.indices = t->kv_page_indices;
    a.last_page_len = t->kv_last_page_len;
    a.seq_lens = t->seq_lens;
    a.batch_indices = t->batch_indices;
    a.positions = t->positions;
    a.append_indptr = t->append_indptr;
    a.batch_size = batch_size;
    a.num_tokens = num_tokens;
    a.hkv = p->num_kv_heads;
    a.vecs = p->head_dim / 8;
    a.page_size = p->page_size;
    a.num_pages = p->num_pages;
    a.k_scale = pkv_scale_or_one(t->k_scale);
    a.v_scale = pkv_scale_or_one(t->v_scale);
    a.k_scales = t->k_head_scales;
    a.v_scales = t->v_head_scales;
    a.bf16 = p->dtype == PKV_DTYPE_BF16;
    const int64_t total = (int64_t)num_tokens * 2 * a.hkv * a.vecs;
    const int64_t want = (total + kAppendThreads - 1) / kAppendThreads;
    const int ctas = (int)(want < kAppendMaxCtas ? want : kAppendMaxCtas);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (kv_dtype == PKV_DTYPE_FP8_E4M3)
        append_kernel<store_fp8<__NV_E4M3>><<<ctas, kAppendThreads, 0, s>>>(a);
    else if (kv_dtype == PKV_DTYPE_FP8_E5M2)
        append_kernel<store_fp8<__NV_E5M2>><<<ctas, kAppendThreads, 0, s>>>(a);
    else
        append_kernel<store_same><<<ctas, kAppendThreads, 0, s>>>(a);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return pkv_fail(ctx, PKV_ERR_CUDA, "append launch failed: %s", cudaGetErrorString(e));
    return PKV_OK;
}

extern "C" pkv_status pkv_cuda_copy_pages(pkv_context *ctx, const pkv_problem *p, const pkv_page_copy *copies,
                                          int32_t count, void *k_cache, void *v_cache, int64_t page_stride,
                                          void *stream) {
    using namespace pkv;
    const int64_t es = (int64_t)pkv_kv_elem_size(p);
    const int64_t page_elems = (int64_t)p->num_kv_heads * p->head_dim * p->page_size;
    const int64_t ps = page_stride > 0 ? page_stride : page_elems;
    if (!aligned16(k_cache) || !aligned16(v_cache) || (ps * es) % 16)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "pkv_copy_pages: the CUDA backend needs the caches 16-byte aligned and the page stride a "
                        "multiple of 16 bytes (%lld elements of %lld bytes)",
                        (long long)ps, (long long)es);
    copy_params c;
    c.k_cache = static_cast<uint8_t *>(k_cache);
    c.v_cache = static_cast<uint8_t *>(v_cache);
    c.page_stride = ps * es;
    c.page_vecs = page_elems * es / 16;
    for (int32_t i = 0; i < count; i++) c.copies[i] = copies[i];
    copy_kernel<<<dim3((unsigned)count, 2, kCopyParts), kCopyThreads, 0, static_cast<cudaStream_t>(stream)>>>(c);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return pkv_fail(ctx, PKV_ERR_CUDA, "page copy launch failed: %s", cudaGetErrorString(e));
    return PKV_OK;
}
