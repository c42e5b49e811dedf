// task.cuh - a decode CTA's task, from start to end, shared by the three kernel families: reading it
// (load_task: a rectangular route's (row, KV head, split) from the grid position, a work queue's entry, a
// graph-stable step's by the claim rules, or the fused route's empty rows, which it writes itself), and
// writing its result (finish_task: the warps' outputs combined into o and lse or a partial state, and in the
// fused route the last task of a split merging it).  Also the shared memory the warps' outputs take.
#pragma once

#include "claim.cuh"
#include "merge.cuh"

namespace pkv {

// Shared memory: the warps' outputs for the final combine (fp32 [warp][GP][D + 4], m and l [warp][GP]),
// then q (halves [GP][D + 32]) for the d = 256 heads-in-M kernel; GP: the heads a CTA holds, 8 or 16.  (The
// heads-in-N register kernel's instances reserve the q part too, unused: it keeps q in registers.)
template <int D, int GP> constexpr int smem_out_floats() {
    return kWarps * GP * (D + 4) + 2 * kWarps * GP;
}
template <int D, int GP> constexpr int smem_floats() {
    return smem_out_floats<D, GP>() + (D > 128 ? GP * (D + 32) / 2 : 0);
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
            merge_one<T, D, 1>(m.row, m.kv_head, m.first_slot, m.count, p.state_o, p.state_ml, p.o, p.o_stride,
                               p.lse, p.num_qo_heads, p.group);
            return false;
        }
        task_of(p.tasks[idx], ti);
    }
    pdl_launch_dependents();
    pdl_wait();
    return true;
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
    PKV_TL_MARK(0, 0, p.timeline);
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
            // l = 0: a warp with no tokens; a NaN l (a NaN score) is kept, so the head's output is NaN
            wgt[w] = sm_l[w * GP + j] != 0.f ? exp2f(sm_m[w * GP + j] - M) : 0.f;
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
        const int64_t qh = (int64_t)ti.row * p.num_qo_heads + (int64_t)ti.head * G + j;
        if (ti.slot < 0) {
            uint4 pk;
            pk.x = tr::pack(out[0], out[1]);
            pk.y = tr::pack(out[2], out[3]);
            pk.z = tr::pack(out[4], out[5]);
            pk.w = tr::pack(out[6], out[7]);
            T *orow = static_cast<T *>(p.o) + ti.row * p.o_stride; // o's rows may be apart
            *reinterpret_cast<uint4 *>(orow + ((int64_t)ti.head * G + j) * D + d) = pk;
            if (p.lse && d == 0) p.lse[qh] = (M + log2f(L)) * kLn2;
        } else {
            float *dst = p.state_o + ((int64_t)ti.slot * G + j) * D + d;
            *reinterpret_cast<float4 *>(dst) = make_float4(out[0], out[1], out[2], out[3]);
            *reinterpret_cast<float4 *>(dst + 4) = make_float4(out[4], out[5], out[6], out[7]);
            if (d == 0) reinterpret_cast<float2 *>(p.state_ml)[(int64_t)ti.slot * G + j] = make_float2(M, L);
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
        PKV_TL_MARK(0, 1, p.timeline);
        if (last) {
            __threadfence();
            merge_one<T, D, KB>(fm.row, fm.kv_head, fm.first_slot, fm.count, p.state_o, p.state_ml, p.o, p.o_stride,
                                p.lse, p.num_qo_heads, G);
        }
    }
}

} // namespace pkv
