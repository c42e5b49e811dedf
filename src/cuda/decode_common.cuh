// decode_common.cuh - what every decode and merge kernel file shares: the launch parameters, the CTA's
// shape, page addressing, a score's scaling into the online softmax's log2 domain, and the PTX wrappers of
// the sm_90 ring kernel and the heads-in-N kernels (shared-memory addresses, mbarriers, bulk tensor copies,
// cp.async arrivals, ldmatrix, movmatrix).  Generic helpers (mma, 16-byte loads, cp.async, PDL) are in
// cuda_common.cuh.
#pragma once

#include "cuda_common.cuh"
#include "timeline.cuh"

#include <cuda.h> // CUtensorMap

#include <math.h>

namespace pkv {

constexpr int kWarps = 4; // a CTA: 4 warps
constexpr int kThreads = kWarps * 32;
constexpr int kTileTokens = 16; // a warp's unit of work: 16 tokens (the M or N of one mma)
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

struct decode_params {
    const void *q;            // [B, Hq, D], rows q_stride elements apart
    const void *k;            // pages, NHD or HND
    const void *v;
    const int32_t *page_indices;
    void *o;                  // [B, Hq, D], rows o_stride elements apart
    int64_t q_stride, o_stride;
    float *lse;               // [B, Hq] or NULL
    float *state_o;           // [slots, G, D]
    float *state_ml;          // [slots, G, 2]: each state's running max (log2 units) and sum
    const pkv_task *tasks;    // this phase's tasks (workqueue)
    const pkv_row_sched *rows;// this phase's rows (rectangular routes)
    pkv_row_sched row0;       // a one-row phase's schedule by value (one_row): no dependent read first
    int32_t one_row;
    int64_t stride_page, stride_head, stride_tok;
    float scale_log2;         // sm_scale * log2(e)
    // fp8 KV caches: real value = stored value x scale, per tensor (k_scale, v_scale) or per KV head
    // (k_scales, v_scales: device arrays [Hkv], NULL for per tensor); 1 for 16-bit caches
    float k_scale, v_scale;
    const float *k_scales, *v_scales;
    float cap_log2, cap_scale; // logits soft cap c > 0: c * log2(e) and sm_scale / c; cap_log2 0: none
    int32_t num_qo_heads, group, page_size, page_shift; // page_shift < 0: page_size not a power of 2
    int32_t rect;
    int32_t stages;           // the tensor-copy kernel: stages of each warp's ring (tma_min_stages..kMaxStages)
    int32_t copy_mode;        // and how it fills them (kernels.cuh copy_mode)
    int32_t num_pages;        // the pools' pages (cp.async reads no page id outside [0, num_pages))
    // fused route: the last task of a split (row, KV head) merges it; CTAs past num_tasks fill empty rows
    int32_t fused, num_tasks, num_split_merges;
    const pkv_merge *merges;
    int32_t *counters;
    // graph-stable plans: the step's task count (in the uploaded plan); CTAs at or past it exit
    const int32_t *task_count;
    int32_t graph_first;      // steps of at most this many tasks run them in the grid's first CTAs

    // graph-stable plans, tasks claimed by SM (claim.cuh): the claim words (PKV_COUNTS_*, task_count's
    // array), the SMs the tasks are dealt over and the most tasks claimed this way (a resident wave);
    // steps of more tasks spread them over the grid
    int32_t *claim;
    int32_t claim_sms, claim_max, claim_mul;
#ifdef PKV_TIMELINE
    timeline_buf *timeline;
#endif
};

struct merge_params {
    const pkv_merge *merges;  // this phase's merges
    const float *state_o;
    const float *state_ml;
    void *o;
    float *lse;
    int64_t o_stride;
    int32_t num_qo_heads, group;
    const int32_t *merge_count; // graph-stable plans: the step's merge count; CTAs of merges past it exit
    int32_t *claim;             // graph-stable plans: the claim words claim_reset zeroes
    int32_t claim_sms;
    int32_t graph_adapt;        // graph-stable plans: narrow steps merge one CTA per merge (merge_wide)
    int32_t wide_at;            // merge_wide's threshold
#ifdef PKV_TIMELINE
    timeline_buf *timeline;
#endif
};

// One CTA's work item.  slot >= 0: a split of a row (partial state); merge_idx: the fused route's merge.
struct task_info {
    int32_t row, head, tb, te, slot, page_base, merge_idx;
};

__device__ __forceinline__ void task_of(const pkv_task &t, task_info &ti) {
    ti.row = t.row;
    ti.head = t.kv_head;
    ti.tb = t.tok_begin;
    ti.te = t.tok_end;
    ti.slot = t.state_slot;
    ti.page_base = t.page_base;
    ti.merge_idx = t.merge;
}

// Page id of a row's token (one read of the page table), the token's place in its page, and the element
// offset of that token's head vector inside the K or V pool.
__device__ __forceinline__ int32_t token_page(const decode_params &p, int32_t page_base, int32_t tok) {
    const int32_t page_slot = p.page_shift >= 0 ? tok >> p.page_shift : tok / p.page_size;
    return __ldg(p.page_indices + page_base + page_slot);
}
__device__ __forceinline__ int32_t token_in_page(const decode_params &p, int32_t tok) {
    return p.page_shift >= 0 ? (tok & (p.page_size - 1)) : tok % p.page_size;
}
__device__ __forceinline__ int64_t page_offset(const decode_params &p, int32_t page, int32_t tok, int32_t head) {
    const int32_t off = token_in_page(p, tok);
    return (int64_t)page * p.stride_page + (int64_t)head * p.stride_head + (int64_t)off * p.stride_tok;
}

// A raw score q.k in the log2 domain of the online softmax: s * sm_scale * log2(e), or with a logits
// soft cap c (Gemma-2) c * log2(e) * tanh(y), y = s * sm_scale / c.  tanh(y): below |y| = 1/8 its
// Taylor polynomial to y^7 (truncation < 2e-9, no cancellation, so a large cap, where every y is small,
// keeps the scores' precision), else 1 - 2 / (1 + e^2y) from one exp2 (relative error < 3e-6 under the
// approximate exp2 and divide; e^2y = inf gives 1, 0 gives -1).  (Written as c log2(e) x tanh: the form
// s sm_scale log2(e) x tanh(y) / y moved the uncapped body's V loads in ptxas' schedule.)  CAP is a
// compile-time path: each kernel picks its body once (cap_log2 > 0), since a branch per score kept the V
// fragment loads behind the softmax in the uncapped path (docs/kernel-notes.md v10).
constexpr float kTanhTaylorBelow = 0.125f;            // |y| under which the Taylor polynomial is used
constexpr float kTwoLog2e = 2.8853900817779268f;      // e^2y = 2^(2y log2 e)
template <bool CAP> __device__ __forceinline__ float score_log2(const decode_params &p, float s) {
    if constexpr (CAP) {
        const float y = s * p.cap_scale, y2 = y * y;
        const float t_y = fmaf(y2, fmaf(y2, fmaf(y2, -17.f / 315.f, 2.f / 15.f), -1.f / 3.f), 1.f); // tanh(y) / y
        const float ex = 1.f - __fdividef(2.f, 1.f + exp2f(y * kTwoLog2e));
        return p.cap_log2 * (fabsf(y) < kTanhTaylorBelow ? y * t_y : ex);
    }
    return s * p.scale_log2;
}

// ---- PTX wrappers ---------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t sm_id() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}

// The transpose of an 8 x 8 matrix of 16-bit values held one pair per lane (the heads-in-N kernels' P^T).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

__device__ __forceinline__ uint32_t smem_addr(const void *ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// One box of a tensor map at {0, c1 = token in page, 0, c3 = KV head, c4 = page} (every dim of the head
// vector, 16 tokens) into shared memory (1024-byte aligned for the swizzle); its bytes complete the
// transaction count of bar.
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap *map, int tok, int head, int page,
                                              uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3, %4, %5, %6}], [%7];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(tok), "r"(0), "r"(head), "r"(page), "r"(bar)
                 : "memory");
}
// The chunked kernel's box (every dim of hb tokens, token-major) at {0, 0, off = token in page, head, page}.
__device__ __forceinline__ void tma_load_chunk(uint32_t dst, const CUtensorMap *map, int off, int head, int page,
                                               uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3, %4, %5, %6}], [%7];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(0), "r"(0), "r"(off), "r"(head), "r"(page), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
// An arrival on bar once this thread's earlier cp.async copies have landed (counted in the barrier's init).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

} // namespace pkv
