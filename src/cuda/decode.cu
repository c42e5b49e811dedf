// decode.cu - the GQA decode attention kernel over native page tables, and the merge kernel.
//
// One CTA (4 warps) per task: a (row, KV head, token range).  Each warp walks 16-token tiles of the
// range (tile w, w+4, ...), reads K and V straight from their pages with 16-byte loads (no shared
// memory staging), and runs both products on tensor cores (mma.sync m16n8k16, fp32 accumulators)
// with the G query heads of the KV head in the M dimension (G <= 8: rows 0-7; G <= 16: all rows),
// so each K,V byte is loaded once for all G heads.  The reduction dimensions are permuted so that
// every fragment comes from a thread's own 16-byte loads:
//   S = Q K^T:  thread (g = lane/4, c = lane%4) loads token g's chunks i*4+c (8 halves each); the
//              same permutation applied to Q makes them the B fragments directly.
//   O = P V:    thread g loads the 8-half chunks g, g+8, ... of tokens 2c, 2c+1, 8+2c, 9+2c; the
//              output column n of n-block (u, e) is head-dim (n + 8u) * 8 + e.
// Online softmax in the log2 domain per warp; warps combine through shared memory at the end; the
// CTA writes o/lse directly (unsplit row) or a partial state (o_s normalised, lse_s natural log).
//
// For G <= 8 (every head dim) a second kernel (decode_kernel_n8) swaps the operands: S^T = K Q^T and
// O^T = V^T P^T, tokens and head dims in M, the G heads in N (8 columns).  The accumulator is then
// 16 x 8 per 16 head dims (32 registers at d = 128 instead of 64, q 16 instead of 32) and each
// 16-token tile takes 8 + 8 mma instead of 16 + 16, which leaves room for 3 CTAs per SM; P^T
// reaches the B fragment by one movmatrix.trans per 8 tokens.  Its K loads for the next tile are
// issued right after S, and V loads right after O, so a tile is always in flight while a warp
// computes.
//
// On sm_90, for G <= 16 at d = 64/128 and G <= 8 at d = 256 with page sizes that are multiples of 16,
// a third kernel (decode_kernel_tma) runs the heads-in-N math with K and V brought into shared memory
// by TMA tensor copies (one per tensor and 16-token tile, issued by one lane into a per-warp ring) and
// read with ldmatrix, so the warps issue only the math (v8; PKV_DECODE_TMA=0 runs the register
// kernels).  At d = 64/128 it also takes pages of 8, 24, 40, ... tokens: a tile in chunks of 8 tokens,
// one copy per chunk and tensor, each issued by its own lane (v14; PKV_TMA_CHUNKED); and the other page
// sizes (1, 2, 4, 12, ...; at d = 256 every size not a multiple of 16) with its ring filled by cp.async
// from every lane, 16 bytes per instruction, into the whole tile's swizzled boxes (v15, v16;
// PKV_DECODE_CPASYNC), on every grid (PKV_CPASYNC_LAYOUT=rows: into v14's token-major rows, d <= 128
// only, on grids of more than 2 CTAs per SM).
//
// Every kernel takes a logits soft cap (a compile-time path picked once per CTA) and tasks that start
// anywhere (a sliding window's first token): the register kernels look up each token's page, the
// tensor-copy kernel starts its tiles on 16-token boundaries and masks the tokens before the start.
//
// The merge kernels combine the partial states of a (row, KV head) online (running max and sum, as
// the decode's softmax) in a fixed order (deterministic): a CTA per merge, or a CTA per (merge, query
// head) whose thread groups combine interleaved subsets of the states and then each other.
//
// Last measured: see docs/kernel-notes.md (H200).
#include "cuda_common.cuh"
#include "pkv_cuda.h"

#include <cuda.h> // CUtensorMap (the tensor-copy kernel); the encoder comes from the runtime entry point

#include <float.h>
#include <math.h>
#ifdef PKV_TIMELINE
#include <stdio.h>
#endif

namespace pkv {

struct decode_params {
    const void *q;            // [B, Hq, D], rows q_stride elements apart
    const void *k;            // pages, NHD or HND
    const void *v;
    const int32_t *page_indices;
    void *o;                  // [B, Hq, D], rows o_stride elements apart
    int64_t q_stride, o_stride;
    float *lse;               // [B, Hq] or NULL
    float *state_o;           // [slots, G, D]
    float *state_lse;         // [slots, G]
    const pkv_task *tasks;    // this phase's tasks (workqueue)
    const pkv_row_sched *rows;// this phase's rows (rectangular routes)
    pkv_row_sched row0;       // a one-row phase's schedule by value (one_row): no dependent read first
    int32_t one_row;
    int64_t stride_page, stride_head, stride_tok;
    float scale_log2;         // sm_scale * log2(e)
    float cap_log2, cap_scale; // logits soft cap c > 0: c * log2(e) and sm_scale / c; cap_log2 0: none
    int32_t num_qo_heads, group, page_size, page_shift; // page_shift < 0: page_size not a power of 2
    int32_t rect;
    int32_t stages;           // the tensor-copy kernel: stages of each warp's ring (tma_min_stages..kMaxStages)
    int32_t copy_mode;        // and how it fills them: 0 a tensor copy per tile, 1 per chunk, 2 cp.async by lane
                              // (token-major rows), 3 cp.async by lane into mode 0's boxes
    int32_t num_pages;        // the pools' pages (cp.async reads no page id outside [0, num_pages))
    // fused route: the last task of a split (row, KV head) merges it; CTAs past num_tasks fill empty rows
    int32_t fused, num_tasks, num_split_merges;
    const pkv_merge *merges;
    int32_t *counters;
    // graph-stable plans: the step's task count (in the uploaded plan); CTAs at or past it exit
    const int32_t *task_count;
    int32_t graph_first;      // steps of at most this many tasks run them in the grid's first CTAs

    // graph-stable plans, tasks claimed by SM (claim_task): the claim words (PKV_COUNTS_*, task_count's
    // array), the SMs the tasks are dealt over and the most tasks claimed this way (a resident wave);
    // claim NULL: the spread or first-CTAs order
    int32_t *claim;
    int32_t claim_sms, claim_max, claim_mul;
};

struct merge_params {
    const pkv_merge *merges;  // this phase's merges
    const float *state_o;
    const float *state_lse;
    void *o;
    float *lse;
    int64_t o_stride;
    int32_t num_qo_heads, group;
    const int32_t *merge_count; // graph-stable plans: the step's merge count; CTAs of merges past it exit
    int32_t *claim;             // graph-stable plans that claim tasks by SM: the words claim_reset zeroes
    int32_t claim_sms;
    int32_t graph_adapt;        // graph-stable plans: narrow steps merge one CTA per merge (merge_wide)
    int32_t wide_at;            // merge_wide's threshold
};

// Dev builds only (cmake -DPKV_TIMELINE=ON; dev/probe_timeline.sh): thread 0 of every CTA records
// its SM and %globaltimer at entry and exit, per kernel kind (0 decode, 1 merge), last launch wins.
#ifdef PKV_TIMELINE
constexpr int kTimelineCap = 32768;
__device__ unsigned long long tl_rec[2][kTimelineCap][3];
__device__ unsigned long long tl_mark[2][kTimelineCap][2]; // two points inside a CTA (0: unset)
__device__ unsigned int tl_count[2];
__device__ __forceinline__ unsigned long long tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
struct tl_scope {
    int kind;
    unsigned int cta;
    unsigned long long t0;
    __device__ explicit tl_scope(int k) : kind(k) {
        cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        t0 = threadIdx.x == 0 ? tl_now() : 0;
    }
    __device__ ~tl_scope() {
        if (threadIdx.x != 0 || cta >= (unsigned)kTimelineCap) return;
        unsigned int smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        tl_rec[kind][cta][0] = t0;
        tl_rec[kind][cta][1] = tl_now();
        tl_rec[kind][cta][2] = smid;
        if (cta == 0) tl_count[kind] = gridDim.x * gridDim.y * gridDim.z;
    }
};
#define PKV_TL_SCOPE(kind) tl_scope tl_scope_(kind)
// thread 0 records %globaltimer as point k of its CTA (decode: the tile loop done, the arrival;
// merge: the dependency wait returned, the states combined)
#define PKV_TL_MARK(kind, k)                                                                                  \
    do {                                                                                                      \
        const unsigned int c_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);               \
        if (threadIdx.x == 0 && c_ < (unsigned)kTimelineCap) tl_mark[kind][c_][k] = tl_now();                 \
    } while (0)
#else
#define PKV_TL_MARK(kind, k) \
    do {                     \
    } while (0)
#define PKV_TL_SCOPE(kind) \
    do {                   \
    } while (0)
#endif

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLn2 = 0.6931471805599453f;

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
// approximate exp2 and divide; e^2y = inf gives 1, 0 gives -1).  (Written as c log2(e) x tanh: the
// form s sm_scale log2(e) x tanh(y) / y moved the uncapped body's V loads in ptxas' schedule.)  CAP is a compile-time path: each kernel
// picks its body once (cap_log2 > 0), since a branch per score kept the V fragment loads behind the
// softmax and cost the uncapped path up to 23% on long tasks (kernel-notes v10).
template <bool CAP> __device__ __forceinline__ float score_log2(const decode_params &p, float s) {
    if constexpr (CAP) {
        const float y = s * p.cap_scale, y2 = y * y;
        const float t_y = fmaf(y2, fmaf(y2, fmaf(y2, -17.f / 315.f, 2.f / 15.f), -1.f / 3.f), 1.f); // tanh(y) / y
        const float ex = 1.f - __fdividef(2.f, 1.f + exp2f(y * 2.8853900817779268f)); // e^2y = 2^(2y log2 e)
        return p.cap_log2 * (fabsf(y) < 0.125f ? y * t_y : ex);
    }
    return s * p.scale_log2;
}

// Merging partial states.  A thread owns one float4 column of one head's output and combines a
// subset of the merge's states (slots first + s0, s0 + stride, ...) online, as the decode's softmax:
// each batch of KB states is loaded with its lse values (clamped addresses, no branch between the
// loads, so a batch is one round trip: with a branch per state the loads of a 32-way merge ran one
// after another, 18 us on the H200), then the running max, sum and weighted sum are rescaled.
// L1-bypassing loads: in the fused route the states were written by other CTAs of the same launch.
constexpr int kMergeBatch = 16;

struct merge_acc {
    float4 a; // sum of exp(lse_s - M) * o_s
    float M;  // running max of lse_s (-inf: no state yet)
    float L;  // sum of exp(lse_s - M)
};

template <int D, int KB>
__device__ __forceinline__ merge_acc merge_accumulate(const float *state_o, const float *state_lse, int64_t first,
                                                      int count, int s0, int stride, int G, int j, int col) {
    merge_acc r = {make_float4(0.f, 0.f, 0.f, 0.f), -INFINITY, 0.f};
    for (; s0 < count; s0 += KB * stride) {
        float4 o[KB];
        float w[KB];
#pragma unroll
        for (int k = 0; k < KB; k++) {
            const int64_t s = first + min(s0 + k * stride, count - 1);
            o[k] = __ldcg(reinterpret_cast<const float4 *>(state_o + (s * G + j) * D) + col);
            w[k] = __ldcg(state_lse + s * G + j);
        }
        float mb = r.M;
#pragma unroll
        for (int k = 0; k < KB; k++) mb = fmaxf(mb, w[k]); // clamped duplicates do not change the max
        const float f = __expf(r.M - mb);                   // 0 on the first batch (M = -inf, mb finite)
        r.a = make_float4(r.a.x * f, r.a.y * f, r.a.z * f, r.a.w * f);
        r.L *= f;
#pragma unroll
        for (int k = 0; k < KB; k++) {
            const float wk = s0 + k * stride < count ? __expf(w[k] - mb) : 0.f;
            r.L += wk;
            r.a.x += wk * o[k].x;
            r.a.y += wk * o[k].y;
            r.a.z += wk * o[k].z;
            r.a.w += wk * o[k].w;
        }
        r.M = mb;
    }
    return r;
}

// Writes one float4 column of merged query head h of row: o = a / L, lse = M + ln L (no state: o = 0,
// lse = -inf).
template <typename T, int D>
__device__ __forceinline__ void merge_write(const merge_acc &r, int32_t row, int32_t h, int col, void *o_out,
                                            int64_t o_stride, float *lse_out, int32_t num_qo_heads) {
    using tr = dtype_traits<T>;
    const float inv = r.L > 0.f ? 1.f / r.L : 0.f;
    uint2 pk;
    pk.x = tr::pack(r.a.x * inv, r.a.y * inv);
    pk.y = tr::pack(r.a.z * inv, r.a.w * inv);
    *reinterpret_cast<uint2 *>(static_cast<T *>(o_out) + row * o_stride + (int64_t)h * D + col * 4) = pk;
    if (lse_out && col == 0) lse_out[(int64_t)row * num_qo_heads + h] = r.L > 0.f ? r.M + logf(r.L) : -INFINITY;
}

// Combines the states of one merge in slot order with the whole CTA, a thread per (head, float4
// column), and writes o and lse; count 0 writes the empty row (o = 0, lse = -inf).
template <typename T, int D, int KB>
__device__ __forceinline__ void merge_one(int32_t row, int32_t kv_head, int64_t first, int32_t count,
                                          const float *state_o, const float *state_lse, void *o_out,
                                          int64_t o_stride, float *lse_out, int32_t num_qo_heads, int G) {
    for (int idx = threadIdx.x; idx < G * (D / 4); idx += kThreads) {
        const int j = idx / (D / 4), col = idx % (D / 4);
        const merge_acc r = merge_accumulate<D, KB>(state_o, state_lse, first, count, 0, 1, G, j, col);
        merge_write<T, D>(r, row, kv_head * G + j, col, o_out, o_stride, lse_out, num_qo_heads);
    }
}

// Graph-stable plans whose decode claims tasks by SM (decode_params.claim): the merge kernel's first
// CTA, once the decode grid has completed, sets the claim's words back to zero for the next launch (not
// the counts), before anything that could make it exit.
__device__ __forceinline__ void claim_reset(int32_t *w, int32_t nsm) {
    if (!w || blockIdx.x != 0) return;
    pdl_wait();
    for (int32_t i = PKV_COUNTS_CLAIMED + (int32_t)threadIdx.x; i < PKV_COUNTS_SM + nsm; i += (int32_t)blockDim.x)
        if (i <= PKV_COUNTS_CURSOR || i >= PKV_COUNTS_SM) w[i] = 0; // the step's counts and widest merge stay
}

// Whether a step's merges are wide enough for one CTA per (merge, query head) rather than one per merge:
// the per-merge CTA walks G x D / 4 columns in ceil(G D / 4 / kThreads) passes, each ceil(widest /
// kMergeBatch) dependent batches of state loads; from wide_at such round trips in a row the per-head
// grid wins (pkv_cuda_launch_opts.merge_wide_at; docs/kernel-notes.md v5, v13d).  The plain plans'
// choice, and graph-stable steps' (the widest merge is in the uploaded counts; v13d).
__host__ __device__ constexpr bool merge_wide(int d, int group, int widest, int wide_at) {
    return ((group * (d / 4) + kThreads - 1) / kThreads) * ((widest + kMergeBatch - 1) / kMergeBatch) >= wide_at;
}

// One CTA merges merge blockIdx.x whole (past a graph-stable step's merge count: nothing).
template <typename T, int D> __device__ __forceinline__ void merge_whole(const merge_params &p) {
    if (p.merge_count && (int32_t)blockIdx.x >= *p.merge_count) return;
    const pkv_merge m = p.merges[blockIdx.x]; // the plan's (uploaded before): read before the wait
    pdl_launch_dependents();
    pdl_wait(); // the partial states come from the previous launch
    PKV_TL_MARK(1, 0);
    merge_one<T, D, kMergeBatch>(m.row, m.kv_head, m.first_slot, m.count, p.state_o, p.state_lse, p.o, p.o_stride,
                                 p.lse, p.num_qo_heads, p.group);
}

// The earlier merge kernel, one CTA per merge (PKV_MERGE_KERNEL=row, for A/B runs).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) merge_kernel_row(const merge_params p) {
    PKV_TL_SCOPE(1);
    claim_reset(p.claim, p.claim_sms);
    merge_whole<T, D>(p);
}

// The merge kernel: one CTA per (merge, query head), so a step's merges spread over merges x G CTAs
// instead of one CTA per (row, KV head) walking G heads (a 33-way merge of 4 heads took 6.5 us on
// 8 CTAs).  Threads (grp, col): col = a float4 of the head dim, grp = one of kThreads / (D / 4)
// interleaved subsets of the states, each combined online (one round trip for up to 16 states per
// subset: 64 at d = 128); the subsets combine through shared memory in a fixed order
// (deterministic).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) merge_kernel(const merge_params p) {
    static_assert(kThreads % (D / 4) == 0, "state groups");
    constexpr int NG = kThreads / (D / 4);
    __shared__ float4 part_sm[NG][D / 4];
    __shared__ float m_sm[NG], l_sm[NG];
    PKV_TL_SCOPE(1);
    const int G = p.group;
    claim_reset(p.claim, p.claim_sms);
    if (p.graph_adapt && !merge_wide(D, G, p.merge_count[PKV_COUNTS_WIDEST - PKV_COUNTS_MERGES], p.wide_at)) {
        // a graph-stable step of narrow merges (unless PKV_GRAPH_MERGE=head): the grid's first n CTAs run a
        // merge each, whole, as merge_kernel_row does; the rest exit (the same branch for the whole CTA)
        merge_whole<T, D>(p);
        return;
    }
    if (p.merge_count && (int32_t)(blockIdx.x / G) >= *p.merge_count) return; // before any barrier: whole CTA
    const pkv_merge m = p.merges[blockIdx.x / G]; // the plan's (uploaded before): read before the wait
    const int j = blockIdx.x % G;
    const int grp = threadIdx.x / (D / 4), col = threadIdx.x % (D / 4);
    pdl_launch_dependents(); // a dependent waits for this grid's completion before it reads o
    pdl_wait(); // the partial states come from the previous launch
    PKV_TL_MARK(1, 0);
    merge_acc r = merge_accumulate<D, kMergeBatch>(p.state_o, p.state_lse, m.first_slot, m.count, grp, NG, G, j, col);
    part_sm[grp][col] = r.a;
    if (col == 0) {
        m_sm[grp] = r.M;
        l_sm[grp] = r.L;
    }
    __syncthreads();
    PKV_TL_MARK(1, 1);
    if (grp == 0) {
        float M = m_sm[0];
#pragma unroll
        for (int g2 = 1; g2 < NG; g2++) M = fmaxf(M, m_sm[g2]);
        r = {make_float4(0.f, 0.f, 0.f, 0.f), M, 0.f};
#pragma unroll
        for (int g2 = 0; g2 < NG; g2++) {
            const float f = l_sm[g2] > 0.f ? __expf(m_sm[g2] - M) : 0.f; // a subset without states adds nothing
            const float4 b = part_sm[g2][col];
            r.L += f * l_sm[g2];
            r.a.x += f * b.x;
            r.a.y += f * b.y;
            r.a.z += f * b.z;
            r.a.w += f * b.w;
        }
        merge_write<T, D>(r, m.row, m.kv_head * G + j, col, p.o, p.o_stride, p.lse, p.num_qo_heads);
    }
}

// Shared memory: the warps' outputs for the final combine (fp32 [warp][GP][D + 4], m and l
// [warp][GP]), then q (halves [GP][D + 32]) for the d = 256 instance of the M kernel.
template <int D, bool G16> constexpr int smem_out_floats() {
    return kWarps * (G16 ? 16 : 8) * (D + 4) + 2 * kWarps * (G16 ? 16 : 8);
}
template <int D, bool G16> constexpr int smem_floats() {
    return smem_out_floats<D, G16>() + (D > 128 ? (G16 ? 16 : 8) * (D + 32) / 2 : 0);
}

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

// A graph-stable CTA's candidate task entry and the step's task count, as volatile loads so that both
// are issued before either is used (a plain load of the entry, used only past the count's test, may be
// moved after it, making the two round trips dependent again).  The entry is plan data, read-only
// while a grid runs; the count shares its array with the claim words, so it is an ordinary load.
__device__ __forceinline__ pkv_task ld_task(const pkv_task *t) {
    const int32_t *w = reinterpret_cast<const int32_t *>(t);
    int32_t v[7];
#pragma unroll
    for (int i = 0; i < 7; i++) asm volatile("ld.global.s32 %0, [%1];" : "=r"(v[i]) : "l"(w + i));
    return pkv_task{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
}

__device__ __forceinline__ int32_t ld_count(const int32_t *c) {
    int32_t v;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(c));
    return v;
}

__device__ __forceinline__ uint32_t sm_id() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}

// ---- graph-stable plans: tasks claimed by SM ---------------------------------------------------------
// A graph-stable grid holds more CTAs than most steps have tasks, and the block scheduler, free to
// place the surplus CTAs anywhere, gave 8-12 SMs three of a one-wave step's tasks where a plain grid
// gives each SM one or two (docs/kernel-notes.md v13).  So when the step's n tasks are more than one
// per SM and fit one resident wave, a CTA takes its task by the SM it landed on: the k-th CTA to arrive
// on SM s (a counter per SM) runs task k x nsm + r(s) if that is below n, so SM s gets tasks r(s),
// r(s) + nsm, ... - as even as a plain grid.  r(s) = s x claim_mul mod nsm deals the tasks of a round
// to SMs far apart in %smid order (the host picks claim_mul as the inverse of a stride near nsm / 8),
// so that the SMs left with one task less are spread over the GPCs rather than all in the last one
// (H200: 256 tasks dealt in %smid order ran 3% longer than a plain grid, 264 did not).  A task can lose
// its CTA (an SM that got fewer CTAs than it was dealt tasks: other kernels on it, fewer SMs than nsm),
// so every CTA that claimed none while tasks were still unclaimed takes an arrival ticket, and those among the grid's last n arrivals wait until every task is claimed (then
// exit) or every CTA has arrived: then the SM counts are final, each of them lists the same unclaimed
// tasks in (SM, k) order and runs the one a shared cursor hands it.  The last n arrivals hold at least
// as many CTAs without a task as there are unclaimed tasks, and fewer than n <= the resident slots wait,
// so a slot is always free for the CTAs still to come.  On a GPU with nothing else running every SM
// gets its CTAs at the launch and every task is claimed within one round trip; CTAs that find every
// task claimed leave at once.  The words are read after the dependency wait (the previous launch on this
// workspace has completed) and zeroed by the merge kernel once this grid has completed.
__device__ __forceinline__ bool claim_task(const decode_params &p, int32_t n, task_info &ti) {
    __shared__ pkv_task s_task;
    __shared__ int32_t s_state;
    __shared__ uint16_t s_miss[PKV_CLAIM_SMS]; // unclaimed tasks per SM (at most a resident wave, < 2^16)
    int32_t *w = p.claim;
    const int32_t nsm = p.claim_sms, grid = (int32_t)gridDim.x;
    auto rank = [&](uint32_t s) { return (int32_t)((uint64_t)s * (uint32_t)p.claim_mul % (uint32_t)nsm); };
    // %smid read once: a preempted CTA can resume on another SM, and the counter it takes and the task
    // it derives must name the same SM (a CTA that read it twice claimed one task twice and left one
    // unclaimed under time-sliced processes on the H200; reading it once only costs balance there)
    const uint32_t sm = sm_id();
    const bool dealt = sm < (uint32_t)nsm;
    const int32_t r = dealt ? rank(sm) : 0;
    // thread 0: the SM's first two tasks, read before the dependency wait (the plan's, uploaded before)
    pkv_task c0 = {}, c1 = {};
    if (threadIdx.x == 0 && dealt) {
        if (r < n) c0 = p.tasks[r];
        if (r + nsm < n) c1 = p.tasks[r + nsm];
    }
    pdl_launch_dependents();
    pdl_wait();
    if (threadIdx.x == 0) {
        int32_t state = -1; // >= 0: the claimed task; -1: nothing to run; -2: wait for unclaimed tasks
        const int32_t claimed = __ldcg(w + PKV_COUNTS_CLAIMED);
        const int32_t k = dealt ? atomicAdd(w + PKV_COUNTS_SM + sm, 1) : INT32_MAX;
        const int64_t task = (int64_t)k * nsm + r;
        if (task < n) {
            s_task = k == 0 ? c0 : k == 1 ? c1 : p.tasks[task];
            __threadfence(); // the SM's count before the claim and the ticket
            atomicAdd(w + PKV_COUNTS_CLAIMED, 1);
            atomicAdd(w + PKV_COUNTS_ARRIVED, 1);
            state = (int32_t)task;
        } else if (claimed < n) {
            __threadfence();
            if (atomicAdd(w + PKV_COUNTS_ARRIVED, 1) >= grid - n) {
                // one of the last n arrivals: every task claimed, or every CTA arrived (counts final)?
                const volatile int32_t *vc = w + PKV_COUNTS_CLAIMED, *va = w + PKV_COUNTS_ARRIVED;
                while (*vc < n && *va < grid) __nanosleep(256);
                if (*vc < n) state = -2;
            }
        }
        s_state = state;
    }
    __syncthreads();
    const int32_t state = s_state;
    if (state >= 0) {
        task_of(s_task, ti);
        return true;
    }
    if (state == -1) return false;
    // every CTA has arrived: the unclaimed tasks in (SM, k) order, the same list in every waiting CTA
    __threadfence();
    auto want = [&](int32_t s) { return rank(s) < n ? (n - 1 - rank(s)) / nsm + 1 : 0; }; // tasks r(s) + k nsm < n
    for (int32_t s = threadIdx.x; s < nsm; s += kThreads) {
        const int32_t got = __ldcg(w + PKV_COUNTS_SM + s);
        s_miss[s] = (uint16_t)(want(s) > got ? want(s) - got : 0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t o = atomicAdd(w + PKV_COUNTS_CURSOR, 1), task = -1;
        for (int32_t s = 0; s < nsm && task < 0; s++) {
            if (o < s_miss[s]) task = (want(s) - s_miss[s] + o) * nsm + rank(s);
            else o -= s_miss[s];
        }
        if (task >= 0) s_task = p.tasks[task];
        s_state = task;
    }
    __syncthreads();
    if (s_state < 0) return false;
    task_of(s_task, ti);
    return true;
}

// Reads the CTA's task.  false: nothing to compute (an empty split, which exits before reading any
// KV, or an empty row of the fused route, which this call writes).
template <typename T, int D>
__device__ __forceinline__ bool load_task(const decode_params &p, task_info &ti) {
    ti.merge_idx = -1;
    if (p.rect) {
        // d = 256 reads the schedule (its heads-in-N kernel sits at 255 registers; the select spills)
        const pkv_row_sched rs = D <= 128 && p.one_row ? p.row0 : p.rows[blockIdx.x];
        const int32_t s = blockIdx.z;
        if (s >= rs.num_splits) return false;
        ti.row = rs.row;
        ti.head = blockIdx.y;
        // splits cut [a, seq_len) from the page that holds a window's first token (else a = 0), so only
        // the first split's first tile is partial; the first split starts at the window
        const int32_t a = rs.tok_begin - (p.page_shift >= 0 ? rs.tok_begin & (p.page_size - 1) : rs.tok_begin % p.page_size);
        ti.tb = s > 0 ? a + s * rs.chunk_tokens : rs.tok_begin;
        ti.te = min(a + (s + 1) * rs.chunk_tokens, rs.seq_len);
        ti.slot = rs.num_splits > 1 ? rs.slot_base + ti.head * rs.num_splits + s : -1;
        ti.page_base = rs.page_base;
    } else {
        int32_t idx = (int32_t)blockIdx.x;
        if (p.task_count) {
            // a graph-stable plan's grid holds more CTAs than the step has tasks: the rest exit at once.
            // At most graph_first tasks (one per SM or fewer) run in the grid's first n CTAs, each CTA's
            // entry loaded with the count, not after it (one round trip before the page ids, as in a
            // plain work queue; the plan holds an entry per CTA of the grid, those past n unused); more
            // are claimed by SM (claim_task) or spread evenly over the grid (CTA b runs task
            // floor(b n / grid) when that floor steps up at b)
            const pkv_task mine = ld_task(p.tasks + idx);
            const int32_t n = ld_count(p.task_count);
            if (p.claim && n > p.claim_sms && n <= p.claim_max) return claim_task(p, n, ti);
            if (n <= p.graph_first) {
                if (idx >= n) return false;
                task_of(mine, ti);
            } else {
                const int64_t g = gridDim.x;
                const int32_t lo = (int32_t)((int64_t)idx * n / g), hi = (int32_t)((int64_t)(idx + 1) * n / g);
                if (hi == lo) return false;
                task_of(p.tasks[lo], ti);
            }
            pdl_launch_dependents();
            pdl_wait();
            return true;
        }
        if (p.fused && (int32_t)blockIdx.x >= p.num_tasks) {
            pdl_launch_dependents();
            pdl_wait(); // o of the kernel before (a programmatic dependent of it) is not ours to write yet
            const pkv_merge m = p.merges[p.num_split_merges + (blockIdx.x - p.num_tasks)]; // count 0: o = 0, lse = -inf
            merge_one<T, D, 1>(m.row, m.kv_head, m.first_slot, m.count, p.state_o, p.state_lse, p.o, p.o_stride,
                               p.lse, p.num_qo_heads, p.group);
            return false;
        }
        task_of(p.tasks[idx], ti);
    }
    pdl_launch_dependents();
    pdl_wait();
    return true;
}

// Page ids of a tile's tokens (K: base + 8j + g; V: base + {2c, 2c+1, 8+2c, 9+2c}); -1 past the
// range, so those K/V slots are never read.
__device__ __forceinline__ void tile_pages(const decode_params &p, const task_info &ti, int ntiles, int tile, int g,
                                           int c, int32_t (&kp)[2], int32_t (&vp)[4]) {
    const int base = ti.tb + tile * 16;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int tok = base + 8 * j + g;
        kp[j] = (tile < ntiles && tok < ti.te) ? token_page(p, ti.page_base, tok) : -1;
    }
#pragma unroll
    for (int qv = 0; qv < 4; qv++) {
        const int tok = base + (qv >> 1) * 8 + 2 * c + (qv & 1);
        vp[qv] = (tile < ntiles && tok < ti.te) ? token_page(p, ti.page_base, tok) : -1;
    }
}

// K of tokens base + 8j + g: the 16-byte chunks i*4 + c.  V of tokens base + {2c, 2c+1, 8+2c, 9+2c}:
// the chunks g + 8u.  Zeros where the page id is -1.
template <typename T, int D>
__device__ __forceinline__ void load_k(const decode_params &p, const T *kbase, int base, int head, int g, int c,
                                       const int32_t (&kp)[2], uint4 (&kr)[2][D / 32]) {
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (kp[j] >= 0) {
            const T *src = kbase + page_offset(p, kp[j], base + 8 * j + g, head);
#pragma unroll
            for (int i = 0; i < D / 32; i++) kr[j][i] = ldg_nc_v4(src + (i * 4 + c) * 8);
        } else {
#pragma unroll
            for (int i = 0; i < D / 32; i++) kr[j][i] = make_uint4(0, 0, 0, 0);
        }
    }
}
template <typename T, int D>
__device__ __forceinline__ void load_v(const decode_params &p, const T *vbase, int base, int head, int g, int c,
                                       const int32_t (&vp)[4], uint4 (&vr)[4][D / 64]) {
#pragma unroll
    for (int qv = 0; qv < 4; qv++) {
        if (vp[qv] >= 0) {
            const T *src = vbase + page_offset(p, vp[qv], base + (qv >> 1) * 8 + 2 * c + (qv & 1), head);
#pragma unroll
            for (int u = 0; u < D / 64; u++) vr[qv][u] = ldg_nc_v4(src + (g + 8 * u) * 8);
        } else {
#pragma unroll
            for (int u = 0; u < D / 64; u++) vr[qv][u] = make_uint4(0, 0, 0, 0);
        }
    }
}

// After every warp wrote its output (sm_o [warp][GP][D + 4], unnormalised), m and l (log2 domain):
// combines the warps, writes o/lse (unsplit row) or the partial state, and in the fused route the
// last task of a split (row, KV head) merges it (slot order: deterministic) and resets the counter,
// loading the states in batches of KB (32 where the kernel's register cap leaves room: one round
// trip after the arrival for merges of up to 32 states).
template <typename T, int D, int GP, int KB>
__device__ __forceinline__ void finish_task(const decode_params &p, const float *smem, const task_info &ti, int G) {
    using tr = dtype_traits<T>;
    const float *sm_o = smem;
    const float *sm_m = smem + kWarps * GP * (D + 4);
    const float *sm_l = sm_m + kWarps * GP;
    // the fused route's merge entry, read while the warps combine (not after the arrival)
    const bool fused_split = p.fused && ti.slot >= 0;
    PKV_TL_MARK(0, 0);
    const pkv_merge fm = fused_split ? p.merges[ti.merge_idx] : pkv_merge{};
    __syncthreads();
    const int groups = G * (D / 8); // 8 outputs per thread step
    for (int idx = threadIdx.x; idx < groups; idx += kThreads) {
        const int j = idx / (D / 8), d = (idx % (D / 8)) * 8;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < kWarps; w++) M = fmaxf(M, sm_m[w * GP + j]);
        float wgt[kWarps], L = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; w++) {
            wgt[w] = sm_l[w * GP + j] > 0.f ? exp2f(sm_m[w * GP + j] - M) : 0.f;
            L += wgt[w] * sm_l[w * GP + j];
        }
        const float inv = 1.f / L;
        float out[8];
#pragma unroll
        for (int x = 0; x < 8; x++) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < kWarps; w++) v += wgt[w] * sm_o[(w * GP + j) * (D + 4) + d + x];
            out[x] = v * inv;
        }
        const float lse_nat = (M + log2f(L)) * kLn2;
        const int64_t qh = (int64_t)ti.row * p.num_qo_heads + (int64_t)ti.head * G + j;
        if (ti.slot < 0) {
            uint4 pk;
            pk.x = tr::pack(out[0], out[1]);
            pk.y = tr::pack(out[2], out[3]);
            pk.z = tr::pack(out[4], out[5]);
            pk.w = tr::pack(out[6], out[7]);
            T *orow = static_cast<T *>(p.o) + ti.row * p.o_stride; // o's rows may be apart
            *reinterpret_cast<uint4 *>(orow + ((int64_t)ti.head * G + j) * D + d) = pk;
            if (p.lse && d == 0) p.lse[qh] = lse_nat;
        } else {
            float *dst = p.state_o + ((int64_t)ti.slot * G + j) * D + d;
            *reinterpret_cast<float4 *>(dst) = make_float4(out[0], out[1], out[2], out[3]);
            *reinterpret_cast<float4 *>(dst + 4) = make_float4(out[4], out[5], out[6], out[7]);
            if (d == 0) p.state_lse[(int64_t)ti.slot * G + j] = lse_nat;
        }
    }
    if (fused_split) {
        __shared__ int last;
        __threadfence(); // this thread's state writes, visible device-wide before the arrival
        __syncthreads();
        if (threadIdx.x == 0) {
            const int prev = atomicAdd(p.counters + ti.merge_idx, 1);
            last = prev == fm.count - 1;
            if (last) p.counters[ti.merge_idx] = 0;
        }
        __syncthreads();
        PKV_TL_MARK(0, 1);
        if (last) {
            __threadfence();
            merge_one<T, D, KB>(fm.row, fm.kv_head, fm.first_slot, fm.count, p.state_o, p.state_lse, p.o, p.o_stride,
                                p.lse, p.num_qo_heads, G);
        }
    }
}

// ---- heads in M: any G up to 16, every head dim ---------------------------------------------------
template <typename T, int D, bool G16, bool CAP>
__device__ __forceinline__ void decode_m_body(const decode_params &p, const task_info &ti, float *smem) {
    constexpr int KC = D / 32; // K chunks of 8 halves per thread per token
    constexpr int VC = D / 64; // V chunks per thread per token
    constexpr int NB = D / 8;  // n-blocks of the output
    constexpr int GP = G16 ? 16 : 8;
    using tr = dtype_traits<T>;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int32_t head = ti.head, tb = ti.tb, te = ti.te;

    // ---- q of the G heads: registers for d <= 128 (loads in flight with the first tile's), shared
    // memory for d = 256 (registers go to the 16 x 256 accumulator); smem rows padded by 64 bytes
    // against bank conflicts: sm_q [GP][D + 32] halves.
    constexpr bool kQInRegs = D <= 128;
    const int G = p.group;
    const T *qbase = static_cast<const T *>(p.q) + ti.row * p.q_stride + (int64_t)head * G * D;
    uint4 qra[kQInRegs ? KC : 1], qrb[kQInRegs ? KC : 1];
    T *sm_q = reinterpret_cast<T *>(smem + smem_out_floats<D, G16>());
    if constexpr (kQInRegs) {
#pragma unroll
        for (int i = 0; i < KC; i++) {
            qra[i] = g < G ? *reinterpret_cast<const uint4 *>(qbase + g * D + (i * 4 + c) * 8) : make_uint4(0, 0, 0, 0);
            qrb[i] = (G16 && g + 8 < G) ? *reinterpret_cast<const uint4 *>(qbase + (g + 8) * D + (i * 4 + c) * 8)
                                        : make_uint4(0, 0, 0, 0);
        }
    } else {
        for (int idx = threadIdx.x; idx < GP * (D / 8); idx += kThreads) {
            const int j = idx / (D / 8), d = (idx % (D / 8)) * 8;
            *reinterpret_cast<uint4 *>(sm_q + j * (D + 32) + d) =
                j < G ? *reinterpret_cast<const uint4 *>(qbase + j * D + d) : make_uint4(0, 0, 0, 0);
        }
        __syncthreads();
    }
    const T *qa_row = sm_q + g * (D + 32), *qb_row = sm_q + (g + 8) * (D + 32);

    const T *kbase = static_cast<const T *>(p.k);
    const T *vbase = static_cast<const T *>(p.v);
    float acc[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; nb++) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    const int ntiles = (te - tb + 15) >> 4;
    // Page ids loaded one tile ahead, so the K/V loads of a tile never wait on a page-table read.
    int32_t kpage[2], vpage[4];
    tile_pages(p, ti, ntiles, warp, g, c, kpage, vpage);
    for (int tile = warp; tile < ntiles; tile += kWarps) {
        const int base = tb + tile * 16;
        uint4 kr[2][KC], vr[4][VC];
        load_k<T, D>(p, kbase, base, head, g, c, kpage, kr);
        load_v<T, D>(p, vbase, base, head, g, c, vpage, vr);
        tile_pages(p, ti, ntiles, tile + kWarps, g, c, kpage, vpage); // in flight with this tile
        // ---- S = Q K^T for the two 8-token halves of the tile
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int i = 0; i < KC; i++) {
            uint4 qa, qb;
            if constexpr (kQInRegs) {
                qa = qra[i];
                qb = qrb[i];
            } else {
                qa = *reinterpret_cast<const uint4 *>(qa_row + (i * 4 + c) * 8);
                qb = G16 ? *reinterpret_cast<const uint4 *>(qb_row + (i * 4 + c) * 8) : make_uint4(0, 0, 0, 0);
            }
            const uint32_t a0[4] = {qa.x, qb.x, qa.y, qb.y}, a1[4] = {qa.z, qb.z, qa.w, qb.w};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                mma_16816<T>(s[j], a0, kr[j][i].x, kr[j][i].y);
                mma_16816<T>(s[j], a1, kr[j][i].z, kr[j][i].w);
            }
        }
        // ---- online softmax (log2 domain); rows g (s[.][0..1]) and g+8 (s[.][2..3])
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const bool valid = base + 8 * j + 2 * c + x < te;
                s[j][x] = valid ? score_log2<CAP>(p, s[j][x]) : -INFINITY;
                s[j][2 + x] = valid ? score_log2<CAP>(p, s[j][2 + x]) : -INFINITY;
                mx0 = fmaxf(mx0, s[j][x]);
                mx1 = fmaxf(mx1, s[j][2 + x]);
            }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1); // finite: the tile has a valid token
        const float al0 = exp2f(m0 - n0), al1 = exp2f(m1 - n1);
        m0 = n0;
        m1 = n1;
        float pr[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            pr[j][0] = exp2f(s[j][0] - n0);
            pr[j][1] = exp2f(s[j][1] - n0);
            pr[j][2] = exp2f(s[j][2] - n1);
            pr[j][3] = exp2f(s[j][3] - n1);
        }
        l0 = l0 * al0 + (pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1]);
        l1 = l1 * al1 + (pr[0][2] + pr[0][3] + pr[1][2] + pr[1][3]);
        // ---- O = O * alpha + P V
        const uint32_t a[4] = {tr::pack(pr[0][0], pr[0][1]), tr::pack(pr[0][2], pr[0][3]), tr::pack(pr[1][0], pr[1][1]),
                               tr::pack(pr[1][2], pr[1][3])};
#pragma unroll
        for (int u = 0; u < VC; u++) {
            const uint32_t *v0 = reinterpret_cast<const uint32_t *>(&vr[0][u]);
            const uint32_t *v1 = reinterpret_cast<const uint32_t *>(&vr[1][u]);
            const uint32_t *v2 = reinterpret_cast<const uint32_t *>(&vr[2][u]);
            const uint32_t *v3 = reinterpret_cast<const uint32_t *>(&vr[3][u]);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int nb = u * 8 + e;
                const unsigned sel = (e & 1) ? 0x7632u : 0x5410u;
                const uint32_t b0 = __byte_perm(v0[e >> 1], v1[e >> 1], sel);
                const uint32_t b1 = __byte_perm(v2[e >> 1], v3[e >> 1], sel);
                acc[nb][0] *= al0;
                acc[nb][1] *= al0;
                acc[nb][2] *= al1;
                acc[nb][3] *= al1;
                mma_16816<T>(acc[nb], a, b0, b1);
            }
        }
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

    // ---- this warp's output: sm_o [warp][GP][D + 4], sm_m / sm_l [warp][GP]
    {
        float *sm_m = smem + kWarps * GP * (D + 4);
        float *sm_l = sm_m + kWarps * GP;
        float *wo = smem + warp * GP * (D + 4);
#pragma unroll
        for (int u = 0; u < VC; u++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int nb = u * 8 + e;
                const int d0 = (2 * c + 8 * u) * 8 + e, d1 = (2 * c + 1 + 8 * u) * 8 + e;
                wo[g * (D + 4) + d0] = acc[nb][0];
                wo[g * (D + 4) + d1] = acc[nb][1];
                if (G16) {
                    wo[(g + 8) * (D + 4) + d0] = acc[nb][2];
                    wo[(g + 8) * (D + 4) + d1] = acc[nb][3];
                }
            }
        if (c == 0) {
            sm_m[warp * GP + g] = m0;
            sm_l[warp * GP + g] = l0;
            if (G16) {
                sm_m[warp * GP + g + 8] = m1;
                sm_l[warp * GP + g + 8] = l1;
            }
        }
    }
    finish_task<T, D, GP, D == 128 ? 32 : 16>(p, smem, ti, G); // 16: no more registers at d = 64, none left at 256
}

template <typename T, int D, bool G16>
__global__ void __launch_bounds__(kThreads, 2) decode_kernel(const decode_params p) {
    extern __shared__ float smem[];
    PKV_TL_SCOPE(0);
    task_info ti;
    if (!load_task<T, D>(p, ti)) return;
    if (p.cap_log2 > 0.f) decode_m_body<T, D, G16, true>(p, ti, smem);
    else decode_m_body<T, D, G16, false>(p, ti, smem);
}

// ---- heads in N: G <= 8, every head dim ----------------------------------------------------------------
// Thread (g, c) loads the same K and V chunks as above.  S^T (tokens x heads): A = K with
// a = {K[g].x, K[g+8].x, K[g].y, K[g+8].y} per k-step, B = q of head g, so the C fragment holds
// tokens g, g+8 x heads 2c, 2c+1.  P^T is packed per 8 tokens and transposed by movmatrix into the
// B fragment (tokens 2c, 2c+1 | 8+2c, 9+2c x head g), which matches the V tokens of the thread.
// O^T (head dims x heads): A = V^T from byte permutes; m-tile (u, mp) row g is head dim
// (g + 8u) * 8 + 2mp, row g + 8 the dim after it.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// The online softmax of one 16-token tile in the heads-in-N kernels (register and tensor-copy), log2
// domain, per head column: S^T = s + s2 (two accumulators) holds tokens g (s[0..1]) and g + 8 (s[2..3]) of
// heads 2c and 2c + 1; v0/v1: those tokens are in the range (scores by score_log2).  Updates the running max and sum of the two
// heads and returns their rescale factors and P^T as the B fragments of O^T = V^T P^T.
template <typename T, bool CAP>
__device__ __forceinline__ void n8_softmax(const float (&s)[4], const float (&s2)[4], bool v0, bool v1,
                                           const decode_params &p, float &ma, float &mb, float &la, float &lb, float &ala,
                                           float &alb, uint32_t &b0, uint32_t &b1) {
    using tr = dtype_traits<T>;
    const float x0 = v0 ? score_log2<CAP>(p, s[0] + s2[0]) : -INFINITY;
    const float x1 = v0 ? score_log2<CAP>(p, s[1] + s2[1]) : -INFINITY;
    const float x2 = v1 ? score_log2<CAP>(p, s[2] + s2[2]) : -INFINITY;
    const float x3 = v1 ? score_log2<CAP>(p, s[3] + s2[3]) : -INFINITY;
    float mxa = fmaxf(x0, x2), mxb = fmaxf(x1, x3);
#pragma unroll
    for (int sh = 4; sh < 32; sh <<= 1) {
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, sh));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, sh));
    }
    const float na = fmaxf(ma, mxa), nb = fmaxf(mb, mxb); // finite: every tile has a token in the range
    ala = exp2f(ma - na);
    alb = exp2f(mb - nb);
    ma = na;
    mb = nb;
    const float p0 = exp2f(x0 - na), p1 = exp2f(x1 - nb), p2 = exp2f(x2 - na), p3 = exp2f(x3 - nb);
    la = la * ala + (p0 + p2);
    lb = lb * alb + (p1 + p3);
    b0 = movmatrix_trans(tr::pack(p0, p1));
    b1 = movmatrix_trans(tr::pack(p2, p3));
}

// A heads-in-N warp's end: sums l of heads h0 + 2c and h0 + 2c + 1 over its lanes and writes its
// unnormalised output (acc[mt][0..1] = O of the two heads at dim dim0(mt), acc[mt][2..3] at dim0(mt) + DSTEP),
// m and l to shared memory ([warp][GP][D + 4], then m and l [warp][GP]) for finish_task.
template <int D, int GP, int MT, int DSTEP, typename DimOf>
__device__ __forceinline__ void n8_warp_out(float *smem, int warp, int h0, int g, int c, const float (&acc)[MT][4],
                                            float ma, float mb, float la, float lb, DimOf dim0) {
#pragma unroll
    for (int sh = 4; sh < 32; sh <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, sh);
        lb += __shfl_xor_sync(0xffffffffu, lb, sh);
    }
    float *sm_m = smem + kWarps * GP * (D + 4);
    float *sm_l = sm_m + kWarps * GP;
    float *wo = smem + (warp * GP + h0) * (D + 4);
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int d0 = dim0(mt);
        wo[(2 * c) * (D + 4) + d0] = acc[mt][0];
        wo[(2 * c + 1) * (D + 4) + d0] = acc[mt][1];
        wo[(2 * c) * (D + 4) + d0 + DSTEP] = acc[mt][2];
        wo[(2 * c + 1) * (D + 4) + d0 + DSTEP] = acc[mt][3];
    }
    if (g == 0) {
        sm_m[warp * GP + h0 + 2 * c] = ma;
        sm_m[warp * GP + h0 + 2 * c + 1] = mb;
        sm_l[warp * GP + h0 + 2 * c] = la;
        sm_l[warp * GP + h0 + 2 * c + 1] = lb;
    }
}

// One 16-token tile of the heads-in-N kernel: S^T from kr, the online softmax, O^T from vr.  The
// buffers are refilled with the tile at next_base (pages kpage/vpage; -1 pages load zeros, no
// memory): K right after S, V right after O, so a tile is in flight while the warp computes.
template <typename T, int D, bool CAP>
__device__ __forceinline__ void n8_tile(const decode_params &p, const T *kbase, const T *vbase, int head, int g, int c,
                                        int base, int te, int next_base, const uint4 (&qr)[D / 32],
                                        uint4 (&kr)[2][D / 32], uint4 (&vr)[4][D / 64], const int32_t (&kpage)[2],
                                        const int32_t (&vpage)[4], float (&acc)[D / 16][4], float &ma, float &mb,
                                        float &la, float &lb) {
    constexpr int KC = D / 32;
    constexpr int VC = D / 64;
    // ---- S^T = K Q^T: two accumulators (x/y and z/w halves of each chunk) for a shorter chain
    float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < KC; i++) {
        const uint32_t a0[4] = {kr[0][i].x, kr[1][i].x, kr[0][i].y, kr[1][i].y};
        const uint32_t a1[4] = {kr[0][i].z, kr[1][i].z, kr[0][i].w, kr[1][i].w};
        mma_16816<T>(s, a0, qr[i].x, qr[i].y);
        mma_16816<T>(s2, a1, qr[i].z, qr[i].w);
    }
    load_k<T, D>(p, kbase, next_base, head, g, c, kpage, kr);
    float ala, alb;
    uint32_t b0, b1;
    n8_softmax<T, CAP>(s, s2, base + g < te, base + 8 + g < te, p, ma, mb, la, lb, ala, alb, b0, b1);
    // ---- O^T = O^T * alpha + V^T P^T
#pragma unroll
    for (int u = 0; u < VC; u++) {
        const uint32_t *w0 = reinterpret_cast<const uint32_t *>(&vr[0][u]);
        const uint32_t *w1 = reinterpret_cast<const uint32_t *>(&vr[1][u]);
        const uint32_t *w2 = reinterpret_cast<const uint32_t *>(&vr[2][u]);
        const uint32_t *w3 = reinterpret_cast<const uint32_t *>(&vr[3][u]);
#pragma unroll
        for (int mp = 0; mp < 4; mp++) {
            const int mt = u * 4 + mp;
            const uint32_t a[4] = {__byte_perm(w0[mp], w1[mp], 0x5410u), __byte_perm(w0[mp], w1[mp], 0x7632u),
                                   __byte_perm(w2[mp], w3[mp], 0x5410u), __byte_perm(w2[mp], w3[mp], 0x7632u)};
            acc[mt][0] *= ala;
            acc[mt][1] *= alb;
            acc[mt][2] *= ala;
            acc[mt][3] *= alb;
            mma_16816<T>(acc[mt], a, b0, b1);
        }
    }
    load_v<T, D>(p, vbase, next_base, head, g, c, vpage, vr);
}

// NB = 1: one tile in flight per warp, 3 CTAs per SM (every grid larger than two CTAs per SM).
// NB = 2: two tiles in flight per warp in two register buffers (tiles w, w + 4 | w + 8, w + 12 ...),
// page ids two tiles ahead per buffer; ~2 CTAs per SM, for grids that leave the third slot empty
// anyway (single requests and small batches), where a warp's round trips are the step's length.
template <typename T, int D, int NB, bool CAP>
__device__ __forceinline__ void decode_n8_body(const decode_params &p, const task_info &ti, float *smem) {
    static_assert(NB == 1 || (NB == 2 && D <= 128), "one tile in flight per warp, or two at d <= 128");
    constexpr int KC = D / 32;
    constexpr int VC = D / 64;
    constexpr int MT = VC * 4; // m-tiles of O^T
    constexpr int GP = 8;
    constexpr int STEP = NB * kWarps; // tiles between a buffer's uses

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int32_t head = ti.head, tb = ti.tb, te = ti.te;
    const int G = p.group;
    const T *qbase = static_cast<const T *>(p.q) + ti.row * p.q_stride + (int64_t)head * G * D;
    uint4 qr[KC];
#pragma unroll
    for (int i = 0; i < KC; i++)
        qr[i] = g < G ? *reinterpret_cast<const uint4 *>(qbase + g * D + (i * 4 + c) * 8) : make_uint4(0, 0, 0, 0);

    const T *kbase = static_cast<const T *>(p.k);
    const T *vbase = static_cast<const T *>(p.v);
    float acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f; // heads 2c and 2c + 1

    const int ntiles = (te - tb + 15) >> 4;
    int32_t kpa[2], vpa[4];
    uint4 kra[2][KC], vra[4][VC];
    tile_pages(p, ti, ntiles, warp, g, c, kpa, vpa);
    load_k<T, D>(p, kbase, tb + warp * 16, head, g, c, kpa, kra);
    load_v<T, D>(p, vbase, tb + warp * 16, head, g, c, vpa, vra);
    if constexpr (NB == 1) {
        tile_pages(p, ti, ntiles, warp + kWarps, g, c, kpa, vpa);
        for (int tile = warp; tile < ntiles; tile += kWarps) {
            const int base = tb + tile * 16;
            n8_tile<T, D, CAP>(p, kbase, vbase, head, g, c, base, te, base + kWarps * 16, qr, kra, vra, kpa, vpa, acc, ma,
                          mb, la, lb);
            tile_pages(p, ti, ntiles, tile + 2 * kWarps, g, c, kpa, vpa);
        }
    } else {
        int32_t kpb[2], vpb[4];
        uint4 krb[2][KC], vrb[4][VC];
        tile_pages(p, ti, ntiles, warp + kWarps, g, c, kpb, vpb);
        load_k<T, D>(p, kbase, tb + (warp + kWarps) * 16, head, g, c, kpb, krb);
        load_v<T, D>(p, vbase, tb + (warp + kWarps) * 16, head, g, c, vpb, vrb);
        tile_pages(p, ti, ntiles, warp + STEP, g, c, kpa, vpa);
        tile_pages(p, ti, ntiles, warp + STEP + kWarps, g, c, kpb, vpb);
        for (int tile = warp; tile < ntiles; tile += STEP) {
            const int base = tb + tile * 16;
            n8_tile<T, D, CAP>(p, kbase, vbase, head, g, c, base, te, base + STEP * 16, qr, kra, vra, kpa, vpa, acc, ma,
                          mb, la, lb);
            tile_pages(p, ti, ntiles, tile + 2 * STEP, g, c, kpa, vpa);
            if (tile + kWarps < ntiles) { // warp-uniform
                const int bb = base + kWarps * 16;
                n8_tile<T, D, CAP>(p, kbase, vbase, head, g, c, bb, te, bb + STEP * 16, qr, krb, vrb, kpb, vpb, acc, ma,
                              mb, la, lb);
                tile_pages(p, ti, ntiles, tile + kWarps + 2 * STEP, g, c, kpb, vpb);
            }
        }
    }
    // ---- this warp's output: O[head][dim] = acc (see the m-tile layout above)
    n8_warp_out<D, GP, MT, 1>(smem, warp, 0, g, c, acc, ma, mb, la, lb,
                              [g](int mt) { return (g + 8 * (mt >> 2)) * 8 + 2 * (mt & 3); });
    finish_task<T, D, GP, NB == 2 ? 32 : 16>(p, smem, ti, G); // 16: the 3-CTA register cap, no spills at d = 256
}

template <typename T, int D, int NB>
__global__ void __launch_bounds__(kThreads, NB == 1 && D <= 128 ? 3 : 2) decode_kernel_n8(const decode_params p) {
    extern __shared__ float smem[];
    PKV_TL_SCOPE(0);
    task_info ti;
    if (!load_task<T, D>(p, ti)) return;
    if (p.cap_log2 > 0.f) decode_n8_body<T, D, NB, true>(p, ti, smem);
    else decode_n8_body<T, D, NB, false>(p, ti, smem);
}

// ---- heads in N, K and V through shared memory by tensor copies (sm_90) --------------------------------
// For G <= 8 at d = 64/128/256 and G 9..16 at d = 64/128 (two n-tiles of heads), page sizes that are
// multiples of 16 (tiles start on 16-token boundaries, a window's first tile before its start, so a
// 16-token tile never crosses a page).  The NT = 2 instance at d = 64 is compiled for 4 CTAs per SM, the
// heads-in-M register kernel's residency there (the planner's waves assume it; for 3 it took 140
// registers, and tma_setup gave it no ring): 128 registers, no spills; H200 4-5% faster than the
// register kernel over the anchors at G 12 and 16 (v16).
// The math is the heads-in-N kernel's (S^T = K Q^T, O^T = V^T P^T, tokens and head dims in M, the G
// heads in N), but no warp loads K or V itself: each warp
// keeps a ring of S stages in shared memory (a 16-token tile of K and of V per stage) with one mbarrier
// per stage, and its lane 0 fills a stage with one TMA tensor copy per tensor (16 tokens x d, landing as
// d/64 boxes of 16 rows of 128 bytes, 128-byte swizzle) from tensor maps over the K and V page pools
// (encode_pool: NHD and HND differ only in the strides).  The fragments come from ldmatrix (K as the A operand
// of S^T; V by ldmatrix.trans as the A operand of O^T), so a tile costs the warp a handful of issue
// slots for its loads instead of 16 global loads, their addresses and the byte permutes (v7: ~600
// instructions per tile per warp, the warps issue-bound on single requests).
struct tma_maps {
    CUtensorMap k, v;
};
constexpr int kMaxStages = 6;
constexpr uint32_t kBoxBytes = 16 * 64 * 2; // one box: 16 token rows of 128 bytes
// Tokens per copy for a page size: a whole 16-token tile when pages are multiples of 16, else the
// largest power of two that divides the page size (1..8: the chunked kernel, TM), so no copy crosses a page.
__host__ __device__ constexpr int tma_chunk_tokens(int page_size) {
    return page_size % 16 == 0 ? 16 : page_size & -page_size;
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

// Shared memory of the kernel: 1024 bytes of alignment slack and S stages of 2 x d/64 boxes per warp;
// after the tile loops the same bytes hold the warps' outputs for finish_task.
template <int D> constexpr int tma_smem_bytes(int stages) {
    return 1024 + kWarps * stages * 2 * (D / 64) * (int)kBoxBytes;
}
// The fewest stages per warp: at d = 256 a stage (16 KiB of K and V) is twice d = 128's, and one stage
// per warp is what keeps the register kernel's 2 CTAs per SM resident (2 stages: 129 KiB, one CTA);
// a warp then issues its next tile after its math on the current one, with 8 warps per SM in turn.
template <int D> constexpr int tma_min_stages() {
    return D > 128 ? 1 : 2;
}

// NT: n-tiles of 8 heads (G <= 8 NT).  NT = 2 (G 9..16, d <= 128) shares each K and V fragment between
// the two n-tiles, with twice the accumulators (2 CTAs per SM, as the heads-in-M kernel it replaces).
template <typename T, int D, int NT, bool CAP, int TM>
__device__ __forceinline__ void decode_tma_body(const decode_params &p, const tma_maps &maps, const task_info &ti,
                                                float *smem, uint64_t (&bars)[kWarps][kMaxStages]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int H = D / 64;  // boxes per tensor per tile
    constexpr int KS = D / 16; // k-steps of S^T, m-tiles of O^T
    constexpr int GP = 8 * NT;
    constexpr uint32_t kTileBytes = 2 * H * kBoxBytes;
    static_assert(NT == 1 || (NT == 2 && D <= 128), "16 heads at d <= 128");
    // TM 1 and 2 write token-major rows (TOKM), TM 0 and 3 the tile's d/64 boxes; TM 2 and 3 fill by cp.async
    constexpr bool TOKM = TM == 1 || TM == 2, CPA = TM >= 2;
    static_assert(!TOKM || D <= 128, "token-major rows at d <= 128 (at d = 256 their ldmatrix rows would conflict 4-way)");
    static_assert(smem_out_floats<D, NT == 2>() * 4 <= kWarps * tma_min_stages<D>() * (int)kTileBytes,
                  "outputs fit in the smallest ring");

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int32_t head = ti.head, tb = ti.tb, te = ti.te;
    const int G = p.group;
    const int S = p.stages;
    unsigned char *sbase = reinterpret_cast<unsigned char *>(smem);
    sbase += (1024u - (smem_addr(sbase) & 1023u)) & 1023u;
    const uint32_t ring = smem_addr(sbase) + (uint32_t)(warp * S) * kTileBytes;
    const uint32_t bar0 = smem_addr(&bars[warp][0]);
    // Tiles start on 16-token boundaries, so none crosses a page; a sliding window's first token need
    // not be on one (the tokens of the first tile before tb are masked like those past te).
    const int32_t t0 = tb & ~15;
    const int ntiles = (te - t0 + 15) >> 4;
    const int nmine = ntiles > warp ? (ntiles - warp + kWarps - 1) / kWarps : 0; // tiles warp, warp + 4, ...

    // TM 1 (pages not a multiple of 16 tokens): a tile is 16 / hb chunks of hb tokens, hb the largest power
    // of two dividing the page size (1..8), so no chunk crosses a page; lane j loads chunk j's page id and
    // issues its copies, and chunks wholly outside [tb, te) are not read (their rows are masked like the
    // rows past te).  TM 2: the same lookups with hb = 1 (lane j: token j), the copies from every lane
    // (issue_cpa; TM 3 likewise).  TM 0: lane 0 does both for the tile's one page.
    const int hb = TM == 1 ? (p.page_size & -p.page_size) : CPA ? 1 : 16, nchunk = 16 / hb;
    // TM: this lane's chunk of the warp's it-th tile - its first token, and whether it meets [tb, te)
    // (TM 1's copies follow this test, not the page id, so a page id the caller left negative is read as
    // zeros by the tensor copy, as in the whole-tile path, and the stage's byte count still completes;
    // TM 2 and 3 zero-fill such a page id's token instead)
    auto chunk_tok = [&](int it) -> int32_t { return t0 + (warp + it * kWarps) * 16 + lane * hb; };
    auto chunk_in = [&](int32_t tok) { return lane < nchunk && tok + hb > tb && tok < te; };
    auto tile_at = [&](int it, int32_t &page, int32_t &off) {
        const int32_t tok = TM != 0 ? chunk_tok(it) : t0 + (warp + it * kWarps) * 16;
        if (TM != 0 && !chunk_in(tok)) {
            page = CPA ? -1 : 0, off = 0; // cp.async: a token not read (its rows are zero-filled)
            return;
        }
        page = token_page(p, ti.page_base, tok);
        off = token_in_page(p, tok);
    };
    // a stage's copies: lane 0 for the tile's one page, or (TM) every lane for its chunk of tile `it`
    // (lane 0 counts the bytes of the chunks that meet [tb, te))
    auto issue_tile = [&](int stage, int32_t page, int32_t off) {
        const uint32_t dst = ring + (uint32_t)stage * kTileBytes, bar = bar0 + 8u * (uint32_t)stage;
        mbar_expect_tx(bar, kTileBytes);
        tma_load_tile(dst, &maps.k, off, head, page, bar);
        tma_load_tile(dst + H * kBoxBytes, &maps.v, off, head, page, bar);
    };
    auto issue_chunks = [&](int stage, int it, int32_t page, int32_t off) {
        const uint32_t dst = ring + (uint32_t)stage * kTileBytes, bar = bar0 + 8u * (uint32_t)stage;
        const int32_t base = t0 + (warp + it * kWarps) * 16;
        const int jlo = max(tb - base, 0) / hb, jhi = min((te - base + hb - 1) / hb, nchunk);
        if (lane == 0) mbar_expect_tx(bar, (uint32_t)(jhi - jlo) * (uint32_t)hb * (uint32_t)(D * 2 * 2));
        __syncwarp();
        if (chunk_in(chunk_tok(it))) {
            const uint32_t at = dst + (uint32_t)(lane * hb * D * 2);
            tma_load_chunk(at, &maps.k, off, head, page, bar);
            tma_load_chunk(at + H * kBoxBytes, &maps.v, off, head, page, bar);
        }
    };
    // TM 2 and 3 (cp.async): every lane copies 16 bytes at a time, lanes along a token's head vector (CH
    // chunks of 16 bytes per token, TPL tokens per instruction: whole 128-byte lines per warp request),
    // into the swizzled rows the ldmatrix side reads (TM 2: token-major, TM 3: the boxes of TM 0); token
    // t's page id and offset come from lane t.  A token outside [tb, te) or with a page id outside the
    // pool is zero-filled, not read (so the V rows of the first and last tiles need no zeroing).  Each lane then arrives on the stage's
    // barrier (count 32) when its copies have landed.
    const T *kpool = static_cast<const T *>(p.k), *vpool = static_cast<const T *>(p.v);
    const int64_t hoff = (int64_t)head * p.stride_head;
    auto issue_cpa = [&](int stage, int32_t page, int32_t off) {
        constexpr int CH = 8 * H, TPL = 32 / CH;
        const uint32_t dst = ring + (uint32_t)stage * kTileBytes, bar = bar0 + 8u * (uint32_t)stage;
        const int ch = lane % CH, tsub = lane / CH;
#pragma unroll
        for (int k = 0; k < 16 / TPL; k++) {
            const int t = k * TPL + tsub;
            const int32_t pg = __shfl_sync(0xffffffffu, page, t), of = __shfl_sync(0xffffffffu, off, t);
            const bool ok = (uint32_t)pg < (uint32_t)p.num_pages;
            const int64_t e = ok ? (int64_t)pg * p.stride_page + (int64_t)of * p.stride_tok + hoff + ch * 8 : 0;
            const int row = TOKM ? t * H + (ch >> 3) : t; // 128-byte row in the box (TM 3: box ch / 8)
            const uint32_t at = dst + (uint32_t)((TOKM ? 0 : (ch >> 3) * (int)kBoxBytes) + row * 128 +
                                                 (((ch & 7) ^ (row & 7)) << 4));
            cp_async_16(at, kpool + e, ok);
            cp_async_16(at + H * kBoxBytes, vpool + e, ok);
        }
        cp_async_arrive(bar);
    };
    int32_t npage = 0, noff = 0; // lane 0 (TM: lane j, chunk j): the next tile to issue (it + S)
    if (lane == 0 && nmine > 0) {
        for (int s = 0; s < S; s++) mbar_init(bar0 + 8u * s, CPA ? 32 : 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        if constexpr (TM == 0) {
            int32_t pg[kMaxStages], of[kMaxStages]; // the first S page ids in flight together
#pragma unroll
            for (int s = 0; s < kMaxStages; s++)
                if (s < S && s < nmine) tile_at(s, pg[s], of[s]);
#pragma unroll
            for (int s = 0; s < kMaxStages; s++)
                if (s < S && s < nmine) issue_tile(s, pg[s], of[s]);
            if (S < nmine) tile_at(S, npage, noff);
        }
    }
    __syncwarp();
    if constexpr (TM != 0) { // every lane, once the barriers are initialised
        if (nmine > 0) {
            int32_t pg[kMaxStages], of[kMaxStages];
#pragma unroll
            for (int s = 0; s < kMaxStages; s++)
                if (s < S && s < nmine) tile_at(s, pg[s], of[s]);
#pragma unroll
            for (int s = 0; s < kMaxStages; s++)
                if (s < S && s < nmine) {
                    if constexpr (CPA) issue_cpa(s, pg[s], of[s]);
                    else issue_chunks(s, s, pg[s], of[s]);
                }
            if (S < nmine) tile_at(S, npage, noff);
        }
        __syncwarp();
    }

    // q of the G heads as the B operand of S^T (n-tile nt: head 8 nt + g): b0 = q[h][16 ks + 2c, +1],
    // b1 = q[h][16 ks + 8 + 2c, +1]
    uint32_t qb[NT][KS][2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int h = 8 * nt + g;
        const T *qrow = static_cast<const T *>(p.q) + ti.row * p.q_stride + ((int64_t)head * G + h) * D;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            qb[nt][ks][0] = h < G ? *reinterpret_cast<const uint32_t *>(qrow + 16 * ks + 2 * c) : 0u;
            qb[nt][ks][1] = h < G ? *reinterpret_cast<const uint32_t *>(qrow + 16 * ks + 8 + 2 * c) : 0u;
        }
    }
    // ldmatrix row addresses inside a box (row = token, 128 bytes; 16-byte chunk j stored at j ^ (row & 7)).
    // Matrix mi = lane / 8, row r = lane % 8.  K (A of S^T, tokens x dims): matrices (t0-7, d0-7),
    // (t8-15, d0-7), (t0-7, d8-15), (t8-15, d8-15) of a k-step.  V (.trans, A of O^T, dims x tokens):
    // (t0-7, d0-7), (t0-7, d8-15), (t8-15, d0-7), (t8-15, d8-15) of an m-tile.
    // A tensor's tile is H boxes of 16 rows (dims 64h..64h+63 of token t in row 16h + t).
    // TOKM: token t's dims 64h..64h+63 are 128-byte row t H + h of the tile (its chunks land token-major), so
    // the swizzle's row bits are (t H + h) & 7 = ((t H) & 7) ^ h for H <= 2: the offsets below are for h = 0
    // and tm_at adds h (2-way ldmatrix conflicts at H = 2; measured as fast as the box layout, v8).
    uint32_t koff[4], voff[4];
    {
        const int mi = lane >> 3, r = lane & 7;
        const int krow = r + (mi & 1) * 8, vrow = r + (mi >> 1) * 8;
        const int kr = TOKM ? krow * H : krow, vr = TOKM ? vrow * H : vrow;
#pragma unroll
        for (int q4 = 0; q4 < 4; q4++) {
            koff[q4] = (uint32_t)(kr * 128 + (((2 * q4 + (mi >> 1)) ^ (TOKM ? kr & 7 : r)) << 4));
            voff[q4] = (uint32_t)(vr * 128 + (((2 * q4 + (mi & 1)) ^ (TOKM ? vr & 7 : r)) << 4));
        }
    }
    // TOKM: the ldmatrix address of dims 64h.. (h = k-step / 4 or m-tile / 4) from an h = 0 offset
    auto tm_at = [](uint32_t tile, uint32_t off, int h) -> uint32_t {
        return tile + ((off ^ ((uint32_t)h << 4)) + (uint32_t)h * 128u);
    };

    float acc[NT][KS][4];
    float ma[NT], mb[NT], la[NT], lb[NT]; // heads 8 nt + 2c and 8 nt + 2c + 1
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int mt = 0; mt < KS; mt++) acc[nt][mt][0] = acc[nt][mt][1] = acc[nt][mt][2] = acc[nt][mt][3] = 0.f;
        ma[nt] = mb[nt] = -INFINITY;
        la[nt] = lb[nt] = 0.f;
    }

    int stage = 0;
    uint32_t phase = 0;
    for (int it = 0; it < nmine; it++) {
        const int base = t0 + (warp + it * kWarps) * 16;
        const uint32_t sk = ring + (uint32_t)stage * kTileBytes, sv = sk + H * kBoxBytes;
        mbar_wait(bar0 + 8u * (uint32_t)stage, phase);
        if (!CPA && (base < tb || base + 16 > te)) {
            // a task's first tile (before a window's start) or last tile (past te): V rows outside
            // [tb, te) hold other tokens (or garbage) and would reach O through 0 x NaN; zero them (K's
            // are masked out of the softmax): rows [0, r0) and [r1, 16), nz of them
            const int r0 = max(tb - base, 0), r1 = min(te - base, 16), nz = r0 + 16 - r1;
            unsigned char *v = sbase + (size_t)(warp * S + stage) * kTileBytes + H * kBoxBytes;
            for (int i = lane; i < H * nz * 8; i += 32) {
                const int h = i / (nz * 8), k = (i / 8) % nz, ch = i & 7;
                const int rr = k < r0 ? k : r1 + (k - r0);
                unsigned char *at = TOKM ? v + (rr * H + h) * 128 + ch * 16 : v + h * kBoxBytes + rr * 128 + ch * 16;
                *reinterpret_cast<uint4 *>(at) = make_uint4(0, 0, 0, 0);
            }
            // these generic-proxy stores before the tensor copy that refills the stage (a window's
            // first tile is warp 0's stage 0, refilled S tiles later)
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
        }
        // ---- S^T = K Q^T (two accumulators per n-tile for a shorter chain)
        float s[NT][4], s2[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = s2[nt][0] = s2[nt][1] = s2[nt][2] =
                                           s2[nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            uint32_t a[4];
            if constexpr (TOKM) ldsm_x4(a, tm_at(sk, koff[ks & 3], ks >> 2));
            else ldsm_x4(a, sk + (ks >> 2) * kBoxBytes + koff[ks & 3]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mma_16816<T>((ks & 1) ? s2[nt] : s[nt], a, qb[nt][ks][0], qb[nt][ks][1]);
        }
        float ala[NT], alb[NT];
        uint32_t b0[NT], b1[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            n8_softmax<T, CAP>(s[nt], s2[nt], base + g >= tb && base + g < te, base + 8 + g >= tb && base + 8 + g < te, p,
                          ma[nt], mb[nt], la[nt],
                          lb[nt], ala[nt], alb[nt], b0[nt], b1[nt]);
        // ---- O^T = O^T * alpha + V^T P^T
#pragma unroll
        for (int mt = 0; mt < KS; mt++) {
            uint32_t a[4];
            if constexpr (TOKM) ldsm_x4_trans(a, tm_at(sv, voff[mt & 3], mt >> 2));
            else ldsm_x4_trans(a, sv + (mt >> 2) * kBoxBytes + voff[mt & 3]);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                acc[nt][mt][0] *= ala[nt];
                acc[nt][mt][1] *= alb[nt];
                acc[nt][mt][2] *= ala[nt];
                acc[nt][mt][3] *= alb[nt];
                mma_16816<T>(acc[nt][mt], a, b0[nt], b1[nt]);
            }
        }
        // ---- refill this stage with tile it + S (every lane is done reading it)
        __syncwarp();
        if constexpr (TM != 0) {
            if (it + S < nmine) {
                if constexpr (CPA) issue_cpa(stage, npage, noff);
                else issue_chunks(stage, it + S, npage, noff);
                if (it + S + 1 < nmine) tile_at(it + S + 1, npage, noff);
            }
        } else if (lane == 0 && it + S < nmine) {
            issue_tile(stage, npage, noff);
            if (it + S + 1 < nmine) tile_at(it + S + 1, npage, noff);
        }
        if (++stage == S) {
            stage = 0;
            phase ^= 1u;
        }
    }
    // ---- this warp's output over the rings (every warp is done with them):
    // acc[nt][mt] = O[head 8 nt + 2c | + 1][dim 16 mt + g | + 8]
    __syncthreads();
    float *out = reinterpret_cast<float *>(sbase);
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
        n8_warp_out<D, GP, KS, 8>(out, warp, 8 * nt, g, c, acc[nt], ma[nt], mb[nt], la[nt], lb[nt],
                                  [g](int mt) { return 16 * mt + g; });
    finish_task<T, D, GP, 16>(p, out, ti, G);
#endif
}

template <typename T, int D, int NT, int TM = 0>
__global__ void __launch_bounds__(kThreads, D > 128 || (NT == 2 && D > 64) ? 2 : D <= 64 ? 4 : 3)
    decode_kernel_tma(const decode_params p, const __grid_constant__ tma_maps maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ float smem[];
    __shared__ __align__(8) uint64_t bars[kWarps][kMaxStages];
    PKV_TL_SCOPE(0);
    task_info ti;
    if (!load_task<T, D>(p, ti)) return;
    if (p.cap_log2 > 0.f) decode_tma_body<T, D, NT, true, TM>(p, maps, ti, smem, bars);
    else decode_tma_body<T, D, NT, false, TM>(p, maps, ti, smem, bars);
#endif
}

// ---- host side ------------------------------------------------------------------------------------
// Which decode kernel runs a problem: heads in N for G <= 8 (unless the heads-in-M kernel is forced,
// to compare the two), else heads in M with 16 rows; the heads-in-N kernel's two-tiles-in-flight
// variant (d <= 128, off unless PKV_DECODE_DEEP=1) is picked per launch from the grid size (run_phases).
enum kernel_kind { kHeadsInN, kHeadsInNDeep, kHeadsInM8, kHeadsInM16 };
static kernel_kind kernel_for(int32_t group, bool allow_n8) {
    if (group > 8) return kHeadsInM16;
    return allow_n8 ? kHeadsInN : kHeadsInM8;
}

using decode_fn = void (*)(decode_params);

// The kernel instance of a kind and its dynamic shared memory (bytes).
template <typename T, int D> static decode_fn kernel_of(kernel_kind kind, int *smem_bytes) {
    *smem_bytes = (int)((kind == kHeadsInM16 ? smem_floats<D, true>() : smem_floats<D, false>()) * sizeof(float));
    switch (kind) {
    case kHeadsInN: return decode_kernel_n8<T, D, 1>;
    case kHeadsInNDeep:
        if constexpr (D <= 128) return decode_kernel_n8<T, D, 2>;
        return decode_kernel_n8<T, D, 1>;
    case kHeadsInM16: return decode_kernel<T, D, true>;
    default: return decode_kernel<T, D, false>;
    }
}

template <typename T, int D> static cudaError_t set_attrs_d() {
    const kernel_kind kinds[] = {kHeadsInN, kHeadsInNDeep, kHeadsInM8, kHeadsInM16};
    for (kernel_kind k : kinds) {
        int smem = 0;
        const decode_fn f = kernel_of<T, D>(k, &smem);
        cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <typename T> static cudaError_t set_attrs_t() {
    cudaError_t e = set_attrs_d<T, 64>();
    if (e == cudaSuccess) e = set_attrs_d<T, 128>();
    if (e == cudaSuccess) e = set_attrs_d<T, 256>();
    return e;
}

// A launch configuration; pdl: a programmatic dependent of the kernel before it on the stream (its CTAs
// may be scheduled while that kernel drains; every kernel here reads and writes the step's memory only
// after griddepcontrol.wait, i.e. after that kernel has completed).
struct launch_cfg {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    launch_cfg(dim3 grid, int smem, cudaStream_t stream, bool pdl) {
        cfg.gridDim = grid;
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = (size_t)smem;
        cfg.stream = stream;
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
    }
    // launches kernel(args...) with this configuration: the launch's error, else the last one
    template <typename... Params, typename... Args> cudaError_t launch(void (*kernel)(Params...), Args &&...args) {
        const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
        return e != cudaSuccess ? e : cudaGetLastError();
    }
};

template <typename T, int D>
static cudaError_t launch_decode(kernel_kind kind, const decode_params &p, dim3 grid, cudaStream_t stream, bool pdl) {
    int smem = 0;
    const decode_fn f = kernel_of<T, D>(kind, &smem);
    return launch_cfg(grid, smem, stream, pdl).launch(f, p);
}

// The tensor-copy kernel of copy mode TM on a grid: two n-tiles of heads for G > 8 (d <= 128).
template <typename T, int D, int TM>
static cudaError_t launch_tma_mode(launch_cfg &lc, const decode_params &p, const tma_maps &maps) {
    if (p.group <= 8) return lc.launch(decode_kernel_tma<T, D, 1, TM>, p, maps);
    if constexpr (D > 128) return cudaErrorInvalidValue;
    else return lc.launch(decode_kernel_tma<T, D, 2, TM>, p, maps);
}
// The tensor-copy kernel of the step's copy mode (p.copy_mode, set by tma_maps_for with the maps and stages;
// modes 1 and 2 exist at d <= 128 only).
template <typename T, int D>
static cudaError_t launch_decode_tma(const decode_params &p, const tma_maps &maps, dim3 grid, cudaStream_t stream,
                                     bool pdl) {
    launch_cfg lc(grid, tma_smem_bytes<D>(p.stages), stream, pdl);
    switch (p.copy_mode) {
    case 0: return launch_tma_mode<T, D, 0>(lc, p, maps);
    case 3: return launch_tma_mode<T, D, 3>(lc, p, maps);
    }
    if constexpr (D <= 128) {
        if (p.copy_mode == 1) return launch_tma_mode<T, D, 1>(lc, p, maps); // token-major maps (tma_maps_for)
        if (p.copy_mode == 2) return launch_tma_mode<T, D, 2>(lc, p, maps); // cp.async (no maps)
    }
    return cudaErrorInvalidValue;
}

template <typename T, int D> static int resident_ctas_d(kernel_kind kind) {
    int n = 0, smem = 0;
    const decode_fn f = kernel_of<T, D>(kind, &smem);
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kThreads, smem) == cudaSuccess ? n : 0;
}

// ---- the tensor-copy kernel's host side ----
// cuTensorMapEncodeTiled from the driver, through the runtime's entry point (no link against libcuda).
using encode_tiled_fn = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static encode_tiled_fn g_encode_tiled = nullptr;
template <typename T, int D, int NT> static int tma_resident(int stages) {
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel_tma<T, D, NT>, kThreads,
                                                         tma_smem_bytes<D>(stages)) == cudaSuccess
               ? n
               : 0;
}
// The copy modes (TM) instantiated at head dim D, in turn: 0, then 1 and 2 (token-major rows) at d <= 128,
// then 3 at every d; -1 after the last.
constexpr int next_copy_mode(int tm, int d) {
    return tm == 0 ? (d <= 128 ? 1 : 3) : tm == 1 ? 2 : tm == 2 ? 3 : -1;
}
// The static shared memory of both dtypes' instances (and those of the other copy modes): *static_bytes
// becomes the larger of it and itself.
template <int D, int NT, int TM = 0> static cudaError_t tma_static_bytes(size_t *static_bytes) {
    cudaFuncAttributes fh, fb;
    cudaError_t e = cudaFuncGetAttributes(&fh, decode_kernel_tma<__half, D, NT, TM>);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fb, decode_kernel_tma<__nv_bfloat16, D, NT, TM>);
    if (e == cudaSuccess) {
        if (fh.sharedSizeBytes > *static_bytes) *static_bytes = fh.sharedSizeBytes;
        if (fb.sharedSizeBytes > *static_bytes) *static_bytes = fb.sharedSizeBytes;
    }
    if constexpr (next_copy_mode(TM, D) > 0)
        if (e == cudaSuccess) e = tma_static_bytes<D, NT, next_copy_mode(TM, D)>(static_bytes);
    return e;
}
// Raises the dynamic shared-memory limit of both dtypes' instances (and those of the other copy modes) to
// `bytes`.
template <int D, int NT, int TM = 0> static cudaError_t tma_raise_limit(int bytes) {
    cudaError_t e = cudaFuncSetAttribute(decode_kernel_tma<__half, D, NT, TM>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(decode_kernel_tma<__nv_bfloat16, D, NT, TM>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if constexpr (next_copy_mode(TM, D) > 0)
        if (e == cudaSuccess) e = tma_raise_limit<D, NT, next_copy_mode(TM, D)>(bytes);
    return e;
}
// The most stages (from lo to max_stages) that keep `want` CTAs of the NT instance resident; 0: none.
template <int D, int NT> static int tma_stages_for(int lo, int max_stages, int want) {
    int stages = 0;
    for (int s = lo; s <= max_stages; s++)
        if (tma_resident<__half, D, NT>(s) >= want) stages = s;
    return stages;
}

// Stages per warp of the tensor-copy kernel at head dim D on the current device, for G <= 8
// (stages_out[0]) and G 9..16 (stages_out[1], d <= 128): the most that keep as many CTAs resident as the
// register kernel it replaces (the planner's waves assume that count); 0: the register kernel runs.  More stages where a grid leaves room for them (single requests, 3 instead of 2 at
// d = 128) measured 1-2% slower on the long ones and 3% faster on B1_N8192 only (docs/kernel-notes.md
// v8).  Kept per context (pkv_cuda_launch_opts), so contexts on different GPU models do not share it.
// *max_out: the most stages whose ring fits the device's shared memory per CTA (the dynamic limit is
// raised to that ring; PKV_TMA_STAGES is clamped to it).  Before sm_90 nothing is set and both are 0:
// the ring of kMaxStages is larger than an A100's or an RTX GPU's opt-in shared memory, and raising a
// kernel's limit past it fails (which made the whole context fail there).
template <int D>
static cudaError_t tma_setup(int cc_major, size_t smem_optin, int32_t stages_out[2], int32_t *max_out) {
    stages_out[0] = stages_out[1] = *max_out = 0;
    if (cc_major < 9) return cudaSuccess; // tensor copies are sm_90's: the register kernels run there
    size_t static_bytes = 0;
    cudaError_t e = tma_static_bytes<D, 1>(&static_bytes);
    if constexpr (D <= 128)
        if (e == cudaSuccess) e = tma_static_bytes<D, 2>(&static_bytes);
    if (e != cudaSuccess) return e;
    constexpr int lo = tma_min_stages<D>();
    int max_stages = kMaxStages;
    while (max_stages >= lo && (size_t)tma_smem_bytes<D>(max_stages) + static_bytes > smem_optin) max_stages--;
    if (max_stages < lo) return cudaSuccess;
    e = tma_raise_limit<D, 1>(tma_smem_bytes<D>(max_stages));
    if constexpr (D <= 128)
        if (e == cudaSuccess) e = tma_raise_limit<D, 2>(tma_smem_bytes<D>(max_stages));
    if (e != cudaSuccess) return e;
    stages_out[0] = tma_stages_for<D, 1>(lo, max_stages, resident_ctas_d<__half, D>(kHeadsInN));
    if constexpr (D <= 128) stages_out[1] = tma_stages_for<D, 2>(lo, max_stages, resident_ctas_d<__half, D>(kHeadsInM16));
    *max_out = max_stages;
    return cudaSuccess;
}

// A tensor map over a page pool: {dim % 64, token in page, dim / 64, KV head, page} (NHD and HND differ
// in the strides only), one box of 64 x 16 x d/64 per tile: a tile's K (or V) is one copy, laid out as
// d/64 boxes of 16 rows of 128 bytes.  L2 promotion of 128 bytes: with 256 the two 128-byte halves of a
// token's head vector were promoted each, 17% more L2 sectors read and 2-5% longer long steps (H200).
// Pages not a multiple of 16 tokens (the chunked kernel): {dim % 64, dim / 64, token in page, KV head,
// page} with a box of 64 x d/64 x hb, hb the largest power of two dividing the page size: a chunk of hb
// tokens lands token-major (each token's d/64 rows of 128 bytes together), so chunks of any size stack
// into the tile's 16 token rows.
static bool encode_pool(CUtensorMap *map, const void *pool, const pkv_problem &pr, const pkv_kv_strides &st) {
    const cuuint64_t H = (cuuint64_t)pr.head_dim / 64, P = (cuuint64_t)pr.page_size, tok = (cuuint64_t)st.token * 2;
    const cuuint32_t hb = (cuuint32_t)tma_chunk_tokens(pr.page_size);
    const bool chunked = hb < 16; // dims 1 and 2 (token in page, dim / 64) trade places
    const cuuint64_t dims[5] = {64, chunked ? H : P, chunked ? P : H, (cuuint64_t)pr.num_kv_heads,
                                (cuuint64_t)pr.num_pages};
    const cuuint64_t strides[4] = {chunked ? 128 : tok, chunked ? tok : 128, (cuuint64_t)st.head * 2,
                                   (cuuint64_t)st.page * 2};
    const cuuint32_t box[5] = {64, chunked ? (cuuint32_t)H : 16, chunked ? hb : (cuuint32_t)H, 1, 1},
                     elem[5] = {1, 1, 1, 1, 1};
    return g_encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 5, const_cast<void *>(pool), dims, strides, box, elem,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// How a step's shape runs the shared-memory ring kernel (sm_90, G <= 8 with heads in N at d = 64/128/256
// or G 9..16 where tma_setup gave it stages (d = 64/128)), its stages per warp (*stages) and its copies
// (*mode): pages that are multiples of 16 by a tensor copy per tile (0); other page sizes at d = 64/128 by
// a tensor copy per chunk (1) when the chunks have at least o.tma_chunk_min tokens, else (and at d = 256)
// by cp.async from every lane when o.cp_async - into the boxes of mode 0 (3, o.cp_async_tiles, the
// default) or into token-major rows (2, d <= 128 only).  False: the register kernel runs.  Modes 0 and 1 encode
// tensor maps; the last maps are kept per thread (same pools and shape: no re-encoding per step).
static bool tma_maps_for(const pkv_plan *plan, const pkv_tensors *t, const pkv_kv_strides &st,
                         const pkv_cuda_launch_opts &o, tma_maps *maps, int32_t *stages, int32_t *mode) {
    const pkv_problem &pr = plan->problem;
    const int idx = pr.head_dim == 64 ? 0 : pr.head_dim == 128 ? 1 : pr.head_dim == 256 ? 2 : -1;
    const int nt = plan->group > 8 ? 1 : 0;
    const int chunk = tma_chunk_tokens(pr.page_size);
    if (chunk == 16) *mode = 0;
    else if (o.tma_chunk_min > 0 && chunk >= o.tma_chunk_min && pr.head_dim <= 128) *mode = 1;
    else *mode = !o.cp_async ? -1 : o.cp_async_tiles ? 3 : pr.head_dim <= 128 ? 2 : -1; // token-major: d <= 128
    if (!o.tma || !o.allow_n8 || idx < 0 || plan->group > 16 || *mode < 0 || (*mode < 2 && !g_encode_tiled) ||
        pr.num_pages <= 0 || pr.num_pages > INT32_MAX)
        return false;
    const int32_t dflt = o.tma_default_stages[idx][nt];
    const int lo = pr.head_dim > 128 ? tma_min_stages<256>() : tma_min_stages<128>();
    if (dflt < lo) return false;
    *stages = o.tma_stages > 0 ? min(max(o.tma_stages, lo), o.tma_max_stages[idx]) : dflt;
    if (*mode >= 2) return true; // cp.async: no maps
    struct cache_entry {
        const void *k, *v;
        int32_t d, page_size, hkv, layout;
        int64_t num_pages, page_stride;
        bool ok;
        tma_maps maps;
    };
    static thread_local cache_entry last = {};
    if (last.k != t->k_cache || last.v != t->v_cache || last.d != pr.head_dim || last.page_size != pr.page_size ||
        last.hkv != pr.num_kv_heads || last.layout != (int32_t)pr.layout || last.num_pages != pr.num_pages ||
        last.page_stride != st.page) {
        last.page_stride = st.page;
        last.k = t->k_cache;
        last.v = t->v_cache;
        last.d = pr.head_dim;
        last.page_size = pr.page_size;
        last.hkv = pr.num_kv_heads;
        last.layout = (int32_t)pr.layout;
        last.num_pages = pr.num_pages;
        last.ok = encode_pool(&last.maps.k, t->k_cache, pr, st) && encode_pool(&last.maps.v, t->v_cache, pr, st);
    }
    if (last.ok) *maps = last.maps;
    return last.ok;
}

template <typename T, int D>
static cudaError_t launch_merge(const merge_params &p, int32_t n, cudaStream_t stream, bool pdl, bool per_head) {
    launch_cfg lc(dim3(per_head ? (unsigned)n * (unsigned)p.group : (unsigned)n), 0, stream, pdl);
    return per_head ? lc.launch(merge_kernel<T, D>, p) : lc.launch(merge_kernel_row<T, D>, p);
}

// The merge kernel of a plan: a CTA per (merge, query head) when a CTA per merge would take
// merge_wide_at (2) or more dependent batches of state loads per thread (ceil(G x D / 4 / threads)
// columns x ceil(count / 16)); for narrower merges the per-merge kernel is shorter (H200, kernel v7,
// split route: B1_N2048 11.6 vs 12.1 us, B4_homo8K 43.6 vs 45.5; with a CTA per head B1_N8192 18.8 vs
// 19.2, B1_N65536 74.4 vs 75.4; v13d, work queue: B1_N8192's 2 batches 17.3 vs 17.9).
template <int D> static bool merge_per_head(const pkv_plan *plan, const pkv_cuda_launch_opts &o) {
    if (o.merge_kernel != 0) return o.merge_kernel == 1;
    return merge_wide(D, plan->group, plan->max_merge_count, o.merge_wide_at);
}

// The smallest grid whose ring is filled by cp.async in copy mode `mode` (smaller ones run the register
// kernels): every grid for the fill into the whole-tile boxes (mode 3; on the H200, grids of up to 2 CTAs
// per SM at page size 1 against the register kernels: best route over the anchors 0.2% faster at d = 128,
// 1% at d = 64 - single requests of 64K-128K tokens 7-10%, B1_N8192 2-3% slower -, 4-5% at d = 256; v16,
// v17); o.cp_async_min_ctas for v15's token-major rows (mode 2, PKV_CPASYNC_LAYOUT=rows), where grids of
// up to 2 CTAs per SM measured 0-8% slower that way.
static int64_t cp_async_min_ctas(const pkv_cuda_launch_opts &o, int mode) {
    return mode == 3 ? 0 : o.cp_async_min_ctas;
}

// The decode kernel over a grid of tasks: the tensor-copy kernel when the step has maps (filled by cp.async:
// on grids of at least cp_async_min_ctas), else the register kernel of the plan's kind (a grid that
// leaves the third resident slot of every SM empty runs the two-tiles-in-flight variant when it is on).
template <typename T, int D>
static cudaError_t launch_tasks(const decode_params &p, dim3 grid, kernel_kind base_kind, cudaStream_t stream,
                                const pkv_cuda_launch_opts &o, const tma_maps *maps) {
    const int64_t ctas = (int64_t)grid.x * grid.y * grid.z;
    if (maps && (p.copy_mode < 2 || ctas >= cp_async_min_ctas(o, p.copy_mode))) // p.stages set with the maps
        return launch_decode_tma<T, D>(p, *maps, grid, stream, o.entry_pdl);
    const kernel_kind kind = base_kind == kHeadsInN && ctas <= o.deep_max_ctas ? kHeadsInNDeep : base_kind;
    return launch_decode<T, D>(kind, p, grid, stream, o.entry_pdl);
}

template <typename T, int D>
static cudaError_t run_phases(const pkv_plan *plan, const decode_params &base, const merge_params &mbase,
                              const char *ws_dev, cudaStream_t stream, const pkv_cuda_launch_opts &o,
                              const tma_maps *maps) {
    const kernel_kind base_kind = kernel_for(plan->group, o.allow_n8 != 0);
    if (plan->graph_tasks > 0) {
        // graph-stable (the work queue): the grids are the plan's capacities and the counts are read
        // from the workspace, so the launches are the same for every step of the same capacities
        const int32_t *counts = reinterpret_cast<const int32_t *>(ws_dev + plan->off_counts);
        decode_params p = base;
        p.rect = 0;
        p.tasks = reinterpret_cast<const pkv_task *>(ws_dev + plan->off_tasks);
        p.task_count = counts;
        p.graph_first = o.graph_first;
        if (o.claim_sms > 0) {
            p.claim = const_cast<int32_t *>(counts);
            p.claim_sms = o.claim_sms;
            p.claim_mul = o.claim_mul;
            // a grid of at least every resident slot: on an idle GPU each SM gets a CTA per slot at the
            // launch, and no SM is dealt more tasks (ceil(n / SMs)) than it has slots
            p.claim_max = plan->graph_tasks >= plan->slots ? (int32_t)plan->slots : 0;
        }
        const cudaError_t e = launch_tasks<T, D>(p, dim3((unsigned)plan->graph_tasks), base_kind, stream, o, maps);
        if (e != cudaSuccess) return e;
        merge_params m = mbase;
        m.merges = reinterpret_cast<const pkv_merge *>(ws_dev + plan->off_merges);
        m.merge_count = counts + PKV_COUNTS_MERGES;
        m.claim = p.claim;
        m.claim_sms = p.claim_sms;
        // the per-head merge kernel's grid whatever the step's widest merge; its first CTAs merge a narrow
        // step one merge each, the choice a plain plan makes at launch (PKV_GRAPH_MERGE=head: per head)
        m.graph_adapt = o.graph_merge_adapt && o.merge_kernel == 0;
        return launch_merge<T, D>(m, plan->graph_merges, stream, o.use_pdl, o.merge_kernel != 2);
    }
    for (int32_t k = 0; k < plan->num_phases; k++) {
        const pkv_phase &ph = plan->phases[k];
        const bool fused = plan->route == PKV_ROUTE_FUSED;
        if (ph.task_end > ph.task_begin || (fused && ph.merge_end > ph.merge_begin)) {
            decode_params p = base;
            dim3 grid;
            if (plan->route == PKV_ROUTE_WORKQUEUE || plan->route == PKV_ROUTE_FUSED) {
                p.rect = 0;
                p.tasks = reinterpret_cast<const pkv_task *>(ws_dev + plan->off_tasks) + ph.task_begin;
                grid = dim3((unsigned)(ph.task_end - ph.task_begin));
                if (plan->route == PKV_ROUTE_FUSED) {
                    int32_t split_merges = 0;
                    while (ph.merge_begin + split_merges < ph.merge_end &&
                           plan->merges[ph.merge_begin + split_merges].count > 0)
                        split_merges++;
                    p.fused = 1;
                    p.num_tasks = ph.task_end - ph.task_begin;
                    p.num_split_merges = split_merges;
                    p.merges = reinterpret_cast<const pkv_merge *>(ws_dev + plan->off_merges) + ph.merge_begin;
                    p.counters = reinterpret_cast<int32_t *>(const_cast<char *>(ws_dev) + plan->off_counters) +
                                 ph.merge_begin;
                    grid = dim3((unsigned)(p.num_tasks + (ph.merge_end - ph.merge_begin - split_merges)));
                }
            } else {
                p.rect = 1;
                p.rows = reinterpret_cast<const pkv_row_sched *>(ws_dev + plan->off_rows) + ph.row_begin;
                // one row (single requests, a bucket of one): its schedule travels in the parameters,
                // so a CTA's first reads are its page ids and q instead of a read of the schedule
                p.one_row = ph.row_end - ph.row_begin == 1;
                if (p.one_row) p.row0 = plan->rows[ph.row_begin];
                grid = dim3((unsigned)(ph.row_end - ph.row_begin), (unsigned)plan->problem.num_kv_heads,
                            (unsigned)ph.grid_splits);
            }
            const cudaError_t e = launch_tasks<T, D>(p, grid, base_kind, stream, o, maps);
            if (e != cudaSuccess) return e;
        }
        if (!fused && ph.merge_end > ph.merge_begin) {
            merge_params m = mbase;
            m.merges = reinterpret_cast<const pkv_merge *>(ws_dev + plan->off_merges) + ph.merge_begin;
            cudaError_t e = launch_merge<T, D>(m, ph.merge_end - ph.merge_begin, stream,
                                               o.use_pdl && ph.task_end > ph.task_begin,
                                               merge_per_head<D>(plan, o));
            if (e != cudaSuccess) return e;
        }
    }
    return cudaSuccess;
}

template <typename T>
static cudaError_t run_t(const pkv_plan *plan, const decode_params &p, const merge_params &m, const char *ws,
                         cudaStream_t stream, const pkv_cuda_launch_opts &o, const tma_maps *maps) {
    switch (plan->problem.head_dim) {
    case 64: return run_phases<T, 64>(plan, p, m, ws, stream, o, maps);
    case 128: return run_phases<T, 128>(plan, p, m, ws, stream, o, maps);
    case 256: return run_phases<T, 256>(plan, p, m, ws, stream, o, maps);
    }
    return cudaErrorInvalidValue;
}

} // namespace pkv

extern "C" cudaError_t pkv_cuda_decode_init_attributes(int cc_major, size_t smem_optin,
                                                       int32_t tma_stages[PKV_TMA_HEAD_DIMS][2],
                                                       int32_t tma_max_stages[PKV_TMA_HEAD_DIMS], int *sm90_code) {
    for (int k = 0; k < PKV_TMA_HEAD_DIMS; k++) tma_stages[k][0] = tma_stages[k][1] = tma_max_stages[k] = 0;
    *sm90_code = 0;
    cudaError_t e = pkv::set_attrs_t<__half>();
    if (e == cudaSuccess) e = pkv::set_attrs_t<__nv_bfloat16>();
    // The kernels that run here were compiled for a virtual architecture of at least 9.0 only where the
    // build had sm_90 code (or PTX) for this device: a build of compute_80 PTX alone is JIT-compiled on an
    // sm_90 GPU with the tensor-copy kernel's body and the PDL instructions compiled out, so there the
    // register kernels run and the merge launches without PDL, as on sm_80-89.
    cudaFuncAttributes fa;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, pkv::decode_kernel_tma<__half, 128, 1>);
    if (e == cudaSuccess) // (a PTX version of 0: no record of one, SASS built for this device)
        *sm90_code = cc_major >= 9 && fa.binaryVersion >= 90 && (fa.ptxVersion >= 90 || fa.ptxVersion == 0);
    const int tma_cc = *sm90_code ? cc_major : 8;
    if (e == cudaSuccess) e = pkv::tma_setup<64>(tma_cc, smem_optin, tma_stages[0], &tma_max_stages[0]);
    if (e == cudaSuccess) e = pkv::tma_setup<128>(tma_cc, smem_optin, tma_stages[1], &tma_max_stages[1]);
    if (e == cudaSuccess) e = pkv::tma_setup<256>(tma_cc, smem_optin, tma_stages[2], &tma_max_stages[2]);
    if (e == cudaSuccess && !pkv::g_encode_tiled) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            pkv::g_encode_tiled = reinterpret_cast<pkv::encode_tiled_fn>(fn);
        else
            cudaGetLastError(); // no encoder: the shapes that need tensor maps run the register kernel
    }
    return e;
}

extern "C" int pkv_cuda_decode_resident_ctas(int32_t group, int32_t head_dim, int allow_n8) {
    const pkv::kernel_kind kind = pkv::kernel_for(group, allow_n8 != 0);
    switch (head_dim) {
    case 64: return pkv::resident_ctas_d<__half, 64>(kind);
    case 128: return pkv::resident_ctas_d<__half, 128>(kind);
    case 256: return pkv::resident_ctas_d<__half, 256>(kind);
    }
    return 0;
}

extern "C" cudaError_t pkv_cuda_decode_run(const pkv_plan *plan, void *workspace, const pkv_tensors *t,
                                           cudaStream_t stream, const pkv_cuda_launch_opts *opts) {
    const pkv_problem &pr = plan->problem;
    const pkv_kv_strides st = pkv_kv_strides_run(&pr, t);
    char *ws = static_cast<char *>(workspace);
    pkv::decode_params p = {};
    p.q = t->q;
    p.k = t->k_cache;
    p.v = t->v_cache;
    p.page_indices = t->kv_page_indices;
    p.o = t->o;
    p.q_stride = pkv_row_stride(&pr, t->q_row_stride);
    p.o_stride = pkv_row_stride(&pr, t->o_row_stride);
    p.lse = t->lse;
    p.state_o = reinterpret_cast<float *>(ws + plan->off_state_o);
    p.state_lse = reinterpret_cast<float *>(ws + plan->off_state_lse);
    p.stride_page = st.page;
    p.stride_head = st.head;
    p.stride_tok = st.token;
    const float log2e = 1.4426950408889634f, sm_scale = pkv_problem_scale(&pr), cap = pr.logits_soft_cap;
    p.scale_log2 = sm_scale * log2e;
    // a cap so large that sm_scale / c is below the normal floats (or c log2(e) overflows) is the
    // uncapped score to float precision (c tanh(x / c) = x - x^3 / 3c^2 ...): run uncapped; a tiny one's
    // sm_scale / c is clamped, not infinite (0 x inf)
    if (cap > 0.0f && isfinite(cap * log2e) && sm_scale / cap >= FLT_MIN) {
        p.cap_log2 = fmaxf(cap * log2e, FLT_MIN); // normal: > 0 under ftz too
        p.cap_scale = fminf(sm_scale / cap, 3.0e38f);
    }
    p.num_qo_heads = pr.num_qo_heads;
    p.group = plan->group;
    p.page_size = pr.page_size;
    p.page_shift = (pr.page_size & (pr.page_size - 1)) == 0 ? __builtin_ctz((unsigned)pr.page_size) : -1;
    pkv::merge_params m = {};
    m.state_o = p.state_o;
    m.state_lse = p.state_lse;
    m.o = t->o;
    m.o_stride = p.o_stride;
    m.lse = t->lse;
    m.num_qo_heads = pr.num_qo_heads;
    m.group = plan->group;
    m.wide_at = opts->merge_wide_at;
    p.num_pages = pr.num_pages < INT32_MAX ? (int32_t)pr.num_pages : INT32_MAX;
    pkv::tma_maps maps = {};
    const pkv::tma_maps *mp =
        pkv::tma_maps_for(plan, t, st, *opts, &maps, &p.stages, &p.copy_mode) ? &maps : nullptr;
    if (pr.dtype == PKV_DTYPE_FP16)
        return pkv::run_t<__half>(plan, p, m, ws, stream, *opts, mp);
    return pkv::run_t<__nv_bfloat16>(plan, p, m, ws, stream, *opts, mp);
}

// The decode kernel a run of the plan launches with these tensors (the same choice as
// pkv_cuda_decode_run): a static name, for the tests and the benchmark's records.
extern "C" const char *pkv_cuda_decode_kernel_name(const pkv_plan *plan, const pkv_tensors *t,
                                                   const pkv_cuda_launch_opts *opts) {
    const pkv_problem &pr = plan->problem;
    pkv::tma_maps maps;
    int32_t stages = 0, mode = 0;
    if (pkv::tma_maps_for(plan, t, pkv_kv_strides_run(&pr, t), *opts, &maps, &stages, &mode)) {
        if (mode == 2)
            return pkv::cp_async_min_ctas(*opts, mode) > 0
                       ? "cp.async copies (registers on grids of up to 2 CTAs per SM)"
                       : "cp.async copies";
        if (mode == 3) return "cp.async copies (into tiles)";
        switch (pkv::tma_chunk_tokens(pr.page_size)) {
        case 16: return "tensor copies";
        case 8: return "tensor copies in chunks of 8";
        case 4: return "tensor copies in chunks of 4";
        case 2: return "tensor copies in chunks of 2";
        default: return "tensor copies in chunks of 1";
        }
    }
    // the two-tiles variant exists at d <= 128 only (kernel_of)
    if (pkv::kernel_for(plan->group, opts->allow_n8 != 0) == pkv::kHeadsInN)
        return opts->deep_max_ctas > 0 && pr.head_dim <= 128
                   ? "registers, heads in N (two tiles in flight on small grids)"
                   : "registers, heads in N";
    return "registers, heads in M";
}

#ifdef PKV_TIMELINE
// Writes the recorded CTAs of the last decode and merge launches as CSV (kind, cta, sm, start_ns,
// end_ns, mark0_ns, mark1_ns: the PKV_TL_MARK points, 0 where none was recorded); 0 on success.
extern "C" int pkv_cuda_timeline_dump(const char *path) {
    static unsigned long long rec[2][pkv::kTimelineCap][3], mark[2][pkv::kTimelineCap][2];
    unsigned int count[2];
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(rec, pkv::tl_rec, sizeof rec) != cudaSuccess ||
        cudaMemcpyFromSymbol(mark, pkv::tl_mark, sizeof mark) != cudaSuccess ||
        cudaMemcpyFromSymbol(count, pkv::tl_count, sizeof count) != cudaSuccess)
        return -1;
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "kind,cta,sm,start_ns,end_ns,mark0_ns,mark1_ns\n");
    for (int k = 0; k < 2; k++)
        for (unsigned int i = 0; i < count[k] && i < (unsigned)pkv::kTimelineCap; i++)
            fprintf(f, "%s,%u,%llu,%llu,%llu,%llu,%llu\n", k ? "merge" : "decode", i, rec[k][i][2], rec[k][i][0],
                    rec[k][i][1], mark[k][i][0], mark[k][i][1]);
    return fclose(f) == 0 ? 0 : -1;
}
#endif
