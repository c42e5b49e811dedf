// merge.cuh - the online-softmax state and its merge, device side: combining the partial states of a split
// (row, KV head) in slot order (deterministic).  A state is o_s normalised plus its running max m_s (log2
// units, as the decode's softmax) and sum l_s, kept apart: folded into one float lse_s = m_s + log2 l_s, the
// piece's token mass would round away once |m_s| >> log2 l_s (very large scores), and the merge weighs each
// piece by it.  Used by the merge kernels (merge.cu) and by the decode kernels' fused route, whose last task
// of a split merges it (task.cuh), and the width rule that picks a merge kernel (merge_wide, also on the host).
#pragma once

#include "decode_common.cuh"

namespace pkv {

// Merging partial states.  A thread owns one float4 column of one head's output and combines a
// subset of the merge's states (slots first + s0, s0 + stride, ...) online, as the decode's softmax:
// each batch of KB states is loaded with its (m, l) pairs (clamped addresses, no branch between the
// loads, so a batch is one round trip: with a branch per state the loads of a 32-way merge ran one
// after another, docs/kernel-notes.md v3), then the running max, sum and weighted sum are rescaled.
// L1-bypassing loads: in the fused route the states were written by other CTAs of the same launch.
constexpr int kMergeBatch = 16;

struct merge_acc {
    float4 a; // sum of l_s 2^(m_s - M) o_s
    float M;  // running max of m_s, log2 units (-inf: no state yet)
    float L;  // sum of l_s 2^(m_s - M)
};

template <int D, int KB>
__device__ __forceinline__ merge_acc merge_accumulate(const float *state_o, const float *state_ml, int64_t first,
                                                      int count, int s0, int stride, int G, int j, int col) {
    merge_acc r = {make_float4(0.f, 0.f, 0.f, 0.f), -INFINITY, 0.f};
    for (; s0 < count; s0 += KB * stride) {
        float4 o[KB];
        float2 ml[KB];
#pragma unroll
        for (int k = 0; k < KB; k++) {
            const int64_t s = first + min(s0 + k * stride, count - 1);
            o[k] = __ldcg(reinterpret_cast<const float4 *>(state_o + (s * G + j) * D) + col);
            ml[k] = __ldcg(reinterpret_cast<const float2 *>(state_ml) + s * G + j);
        }
        float mb = r.M;
#pragma unroll
        for (int k = 0; k < KB; k++) mb = fmaxf(mb, ml[k].x); // clamped duplicates do not change the max
        const float f = exp2f(r.M - mb);                      // 0 on the first batch (M = -inf, mb finite)
        r.a = make_float4(r.a.x * f, r.a.y * f, r.a.z * f, r.a.w * f);
        r.L *= f;
#pragma unroll
        for (int k = 0; k < KB; k++) {
            const float wk = s0 + k * stride < count ? ml[k].y * exp2f(ml[k].x - mb) : 0.f;
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

// Writes one float4 column of merged query head h of row: o = a / L, lse = (M + log2 L) ln 2 (no state: o = 0,
// lse = -inf).
template <typename T, int D>
__device__ __forceinline__ void merge_write(const merge_acc &r, int32_t row, int32_t h, int col, void *o_out,
                                            int64_t o_stride, float *lse_out, int32_t num_qo_heads) {
    using tr = dtype_traits<T>;
    const float inv = r.L != 0.f ? 1.f / r.L : 0.f; // a NaN sum (a NaN state) makes o and lse NaN
    uint2 pk;
    pk.x = tr::pack(r.a.x * inv, r.a.y * inv);
    pk.y = tr::pack(r.a.z * inv, r.a.w * inv);
    *reinterpret_cast<uint2 *>(static_cast<T *>(o_out) + row * o_stride + (int64_t)h * D + col * 4) = pk;
    if (lse_out && col == 0)
        lse_out[(int64_t)row * num_qo_heads + h] = r.L != 0.f ? (r.M + log2f(r.L)) * kLn2 : -INFINITY;
}

// Combines the states of one merge in slot order with the whole CTA, a thread per (head, float4
// column), and writes o and lse; count 0 writes the empty row (o = 0, lse = -inf).
template <typename T, int D, int KB>
__device__ __forceinline__ void merge_one(int32_t row, int32_t kv_head, int64_t first, int32_t count,
                                          const float *state_o, const float *state_ml, void *o_out,
                                          int64_t o_stride, float *lse_out, int32_t num_qo_heads, int G) {
    for (int idx = threadIdx.x; idx < G * (D / 4); idx += kThreads) {
        const int j = idx / (D / 4), col = idx % (D / 4);
        const merge_acc r = merge_accumulate<D, KB>(state_o, state_ml, first, count, 0, 1, G, j, col);
        merge_write<T, D>(r, row, kv_head * G + j, col, o_out, o_stride, lse_out, num_qo_heads);
    }
}

// Whether a step's merges are wide enough for one CTA per (merge, query head) rather than one per merge:
// the per-merge CTA walks G x D / 4 columns in ceil(G D / 4 / kThreads) passes, each ceil(widest /
// kMergeBatch) dependent batches of state loads; from wide_at such round trips in a row the per-head
// grid wins (pkv_cuda_launch_opts.merge_wide_at; docs/kernel-notes.md v5, v13d).  The plain plans'
// choice, and graph-stable steps' (the widest merge is in the uploaded counts; v13d).
__host__ __device__ constexpr bool merge_wide(int d, int group, int widest, int wide_at) {
    return ((group * (d / 4) + kThreads - 1) / kThreads) * ((widest + kMergeBatch - 1) / kMergeBatch) >= wide_at;
}

} // namespace pkv
