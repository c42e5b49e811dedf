// merge.cu - the merge kernels: each combines the partial states of a step's split (row, KV head) pairs
// online (running max and sum, as the decode's softmax; merge.cuh) in slot order (deterministic) and writes
// o and lse.  Two grids: a CTA per (merge, query head), whose thread groups combine interleaved subsets of
// the states and then each other, and a CTA per merge; the launcher picks one per plan by the merges' width
// (merge_wide), and a graph-stable step, whose grid is fixed, runs narrow steps one merge per CTA inside the
// per-head grid.  Their last measurements: docs/kernel-notes.md (v3, v5, v7, v13d).
#include "claim.cuh"
#include "kernels.cuh"
#include "merge.cuh"

namespace pkv {

// One CTA merges merge blockIdx.x whole (past a graph-stable step's merge count: nothing).
template <typename T, int D> __device__ __forceinline__ void merge_whole(const merge_params &p) {
    if (p.merge_count && (int32_t)blockIdx.x >= *p.merge_count) return;
    const pkv_merge m = p.merges[blockIdx.x]; // the plan's (uploaded before): read before the wait
    pdl_launch_dependents();
    pdl_wait(); // the partial states come from the previous launch
    PKV_TL_MARK(1, 0, p.timeline);
    merge_one<T, D, kMergeBatch>(m.row, m.kv_head, m.first_slot, m.count, p.state_o, p.state_ml, p.o, p.o_stride,
                                 p.lse, p.num_qo_heads, p.group);
}

// A CTA per merge: the kernel for narrow merges (few dependent batches of state loads per CTA), where a CTA
// per (merge, query head) would launch G times the CTAs for little work each (kernel-notes v7, v13d).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) merge_kernel_row(const merge_params p) {
    PKV_TL_SCOPE(1, p.timeline);
    claim_reset(p.claim, p.claim_sms);
    merge_whole<T, D>(p);
}

// A CTA per (merge, query head), so a step's wide merges spread over merges x G CTAs instead of one CTA per
// (row, KV head) walking G heads (kernel-notes v5).  Threads (grp, col): col = a float4 of the head dim,
// grp = one of kThreads / (D / 4) interleaved subsets of the states, each combined online (one round trip
// for up to 16 states per subset: 64 at d = 128); the subsets combine through shared memory in a fixed
// order (deterministic).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) merge_kernel_head(const merge_params p) {
    static_assert(kThreads % (D / 4) == 0, "state groups");
    constexpr int NG = kThreads / (D / 4);
    __shared__ float4 part_sm[NG][D / 4];
    __shared__ float m_sm[NG], l_sm[NG];
    PKV_TL_SCOPE(1, p.timeline);
    const int G = p.group;
    claim_reset(p.claim, p.claim_sms);
    if (p.graph_adapt && !merge_wide(D, G, p.merge_count[PKV_COUNTS_WIDEST - PKV_COUNTS_MERGES], p.wide_at)) {
        // a graph-stable step of narrow merges (unless merge=head forces this grid): the grid's first n CTAs run
        // a merge each, whole, as merge_kernel_row does; the rest exit (the same branch for the whole CTA)
        merge_whole<T, D>(p);
        return;
    }
    if (p.merge_count && (int32_t)(blockIdx.x / G) >= *p.merge_count) return; // before any barrier: whole CTA
    const pkv_merge m = p.merges[blockIdx.x / G]; // the plan's (uploaded before): read before the wait
    const int j = blockIdx.x % G;
    const int grp = threadIdx.x / (D / 4), col = threadIdx.x % (D / 4);
    pdl_launch_dependents(); // a dependent waits for this grid's completion before it reads o
    pdl_wait(); // the partial states come from the previous launch
    PKV_TL_MARK(1, 0, p.timeline);
    merge_acc r = merge_accumulate<D, kMergeBatch>(p.state_o, p.state_ml, m.first_slot, m.count, grp, NG, G, j, col);
    part_sm[grp][col] = r.a;
    if (col == 0) {
        m_sm[grp] = r.M;
        l_sm[grp] = r.L;
    }
    __syncthreads();
    PKV_TL_MARK(1, 1, p.timeline);
    if (grp == 0) {
        float M = m_sm[0];
#pragma unroll
        for (int g2 = 1; g2 < NG; g2++) M = fmaxf(M, m_sm[g2]);
        r = {make_float4(0.f, 0.f, 0.f, 0.f), M, 0.f};
#pragma unroll
        for (int g2 = 0; g2 < NG; g2++) {
            // a subset without states adds nothing; one with a NaN sum makes the head NaN
            const float f = l_sm[g2] != 0.f ? exp2f(m_sm[g2] - M) : 0.f;
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

template <typename T> static merge_fn merge_of(int head_dim, bool per_head) {
    switch (head_dim) {
    case 64: return per_head ? merge_kernel_head<T, 64> : merge_kernel_row<T, 64>;
    case 128: return per_head ? merge_kernel_head<T, 128> : merge_kernel_row<T, 128>;
    case 256: return per_head ? merge_kernel_head<T, 256> : merge_kernel_row<T, 256>;
    }
    return nullptr;
}

merge_fn merge_kernel_of(pkv_dtype dtype, int head_dim, bool per_head) {
    return dtype == PKV_DTYPE_FP16 ? merge_of<__half>(head_dim, per_head) : merge_of<__nv_bfloat16>(head_dim, per_head);
}

} // namespace pkv
