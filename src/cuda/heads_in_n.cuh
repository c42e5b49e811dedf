// heads_in_n.cuh - the math both heads-in-N kernels share (the register kernel, decode_heads_in_n.cu, and
// the sm_90 ring kernel, decode_tma.cu), where the G <= 8 query heads of a KV head are the N of the mma and
// tokens and head dims its M: one tile's online softmax over S^T, handing P^T to O^T = V^T P^T as B
// fragments by movmatrix, and a warp's end (its output, m and l into shared memory for finish_task).
#pragma once

#include "decode_common.cuh"

namespace pkv {

// The online softmax of one 16-token tile in the heads-in-N kernels (register and tensor-copy), log2
// domain, per head column: S^T = s + s2 (two accumulators) holds tokens g (s[0..1]) and g + 8 (s[2..3]) of
// heads 2c and 2c + 1; v0/v1: those tokens are in the range (scores by score_log2).  Updates the running
// max and sum of the two heads and returns their rescale factors and P^T as the B fragments of
// O^T = V^T P^T.
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
// unnormalised output (acc[mt][0..1] = O of the two heads at dim dim0(mt), acc[mt][2..3] at
// dim0(mt) + DSTEP), m and l to shared memory ([warp][GP][D + 4], then m and l [warp][GP]) for finish_task.
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

} // namespace pkv
