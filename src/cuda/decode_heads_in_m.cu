// decode_heads_in_m.cu - the heads-in-M register kernel: GQA decode attention over the page tables, the
// G <= 16 query heads of a KV head in the M dimension of the mma (16 rows), every head dim (64, 128, 256).
// It is the kernel for G 9..16 on sm_80-89 (and wherever the sm_90 ring kernel does not run: G 9..16 at
// d = 256, tma=0); G <= 8 runs heads in N (decode_heads_in_n.cu).  Its last measurements, and those of
// every other variant tried: docs/kernel-notes.md.
//
// One CTA (4 warps) per task: a (row, KV head, token range).  Each warp walks 16-token tiles of the
// range (tile w, w+4, ...), reads K and V straight from their pages with 16-byte loads (no shared
// memory staging, register_tiles.cuh), and runs both products on tensor cores (mma.sync m16n8k16, fp32
// accumulators) with the G query heads of the KV head in M, so each K,V byte is loaded once for all G
// heads.  The reduction dimensions are permuted so that every fragment comes from a thread's own 16-byte
// loads:
//   S = Q K^T:  thread (g = lane/4, c = lane%4) loads token g's chunks i*4+c (8 halves each); the
//              same permutation applied to Q makes them the B fragments directly.
//   O = P V:    thread g loads the 8-half chunks g, g+8, ... of tokens 2c, 2c+1, 8+2c, 9+2c; the
//              output column n of n-block (u, e) is head-dim (n + 8u) * 8 + e.
// Online softmax in the log2 domain per warp; warps combine through shared memory at the end; the CTA
// writes o/lse directly (unsplit row) or a partial state (o_s normalised, lse_s natural log): task.cuh.
// It is also the kernel of fp8 caches at G 9..16 (KV = kv_e4m3 or kv_e5m2): the same chunks read with
// 8-byte loads and widened to T in registers where the mma takes them (register_tiles.cuh); the K scale
// multiplies the scores and the V scale the output, so the products run on the stored values.
#include "kernels.cuh"
#include "register_tiles.cuh"
#include "task.cuh"

namespace pkv {

// One task's tiles, softmax and output (G <= 16 heads in the mma's 16 rows).  About 160 lines as one
// function: the q fragments, the accumulators and the page ids looked up a tile ahead live across the
// tile loop, which reads top to bottom as the mma sequence it is; split into helpers they would be passed
// by reference through force-inlined calls for the same code.
template <typename T, int D, bool CAP, typename KV>
__device__ __forceinline__ void decode_m_body(const decode_params &p, const task_info &ti, float *smem) {
    constexpr int KC = D / 32; // K chunks of 8 halves per thread per token
    constexpr int VC = D / 64; // V chunks per thread per token
    constexpr int NB = D / 8;  // n-blocks of the output
    constexpr int GP = 16;
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
    T *sm_q = reinterpret_cast<T *>(smem + smem_out_floats<D, GP>());
    if constexpr (kQInRegs) {
#pragma unroll
        for (int i = 0; i < KC; i++) {
            qra[i] = g < G ? *reinterpret_cast<const uint4 *>(qbase + g * D + (i * 4 + c) * 8) : make_uint4(0, 0, 0, 0);
            qrb[i] = g + 8 < G ? *reinterpret_cast<const uint4 *>(qbase + (g + 8) * D + (i * 4 + c) * 8)
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

    constexpr bool kFp8 = kv_traits<T, KV>::fp8;
    const float kscale = !kFp8 ? 1.f : p.k_scales ? p.k_scales[head] : p.k_scale;
    const float vscale = !kFp8 ? 1.f : p.v_scales ? p.v_scales[head] : p.v_scale;
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
        kv_chunk<T, KV> kr[2][KC], vr[4][VC];
        load_k<T, D, KV>(p, p.k, base, head, g, c, kpage, kr);
        load_v<T, D, KV>(p, p.v, base, head, g, c, vpage, vr);
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
                qb = *reinterpret_cast<const uint4 *>(qb_row + (i * 4 + c) * 8);
            }
            const uint32_t a0[4] = {qa.x, qb.x, qa.y, qb.y}, a1[4] = {qa.z, qb.z, qa.w, qb.w};
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint4 k = widen<T, KV>(kr[j][i]);
                mma_16816<T>(s[j], a0, k.x, k.y);
                mma_16816<T>(s[j], a1, k.z, k.w);
            }
        }
        // ---- online softmax (log2 domain); rows g (s[.][0..1]) and g+8 (s[.][2..3])
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const bool valid = base + 8 * j + 2 * c + x < te;
                if constexpr (kFp8) {
                    s[j][x] *= kscale;
                    s[j][2 + x] *= kscale;
                }
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
            const uint4 w0 = widen<T, KV>(vr[0][u]), w1 = widen<T, KV>(vr[1][u]), w2 = widen<T, KV>(vr[2][u]),
                        w3 = widen<T, KV>(vr[3][u]);
            const uint32_t *v0 = reinterpret_cast<const uint32_t *>(&w0);
            const uint32_t *v1 = reinterpret_cast<const uint32_t *>(&w1);
            const uint32_t *v2 = reinterpret_cast<const uint32_t *>(&w2);
            const uint32_t *v3 = reinterpret_cast<const uint32_t *>(&w3);
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
                wo[g * (D + 4) + d0] = acc[nb][0] * vscale;
                wo[g * (D + 4) + d1] = acc[nb][1] * vscale;
                wo[(g + 8) * (D + 4) + d0] = acc[nb][2] * vscale;
                wo[(g + 8) * (D + 4) + d1] = acc[nb][3] * vscale;
            }
        if (c == 0) {
            sm_m[warp * GP + g] = m0;
            sm_l[warp * GP + g] = l0;
            sm_m[warp * GP + g + 8] = m1;
            sm_l[warp * GP + g + 8] = l1;
        }
    }
    finish_task<T, D, GP, D == 128 ? 32 : 16>(p, smem, ti, G); // 16: no more registers at d = 64, none left at 256
}

template <typename T, int D, typename KV>
__global__ void __launch_bounds__(kThreads, 2) decode_kernel_m(const decode_params p) {
    extern __shared__ float smem[];
    PKV_TL_SCOPE(0, p.timeline);
    task_info ti;
    if (!load_task<T, D>(p, ti)) return;
    if (p.cap_log2 > 0.f) decode_m_body<T, D, true, KV>(p, ti, smem);
    else decode_m_body<T, D, false, KV>(p, ti, smem);
}

template <typename T, typename KV> static decode_fn heads_in_m_of(int head_dim) {
    switch (head_dim) {
    case 64: return decode_kernel_m<T, 64, KV>;
    case 128: return decode_kernel_m<T, 128, KV>;
    case 256: return decode_kernel_m<T, 256, KV>;
    }
    return nullptr;
}

template <typename T> static decode_fn heads_in_m_kv(kv_kind kv, int head_dim) {
    switch (kv) {
    case kKvSame: return heads_in_m_of<T, T>(head_dim);
    case kKvE4M3: return heads_in_m_of<T, kv_e4m3>(head_dim);
    case kKvE5M2: return heads_in_m_of<T, kv_e5m2>(head_dim);
    }
    return nullptr;
}

decode_fn heads_in_m_kernel(pkv_dtype dtype, kv_kind kv, int head_dim) {
    return dtype == PKV_DTYPE_FP16 ? heads_in_m_kv<__half>(kv, head_dim) : heads_in_m_kv<__nv_bfloat16>(kv, head_dim);
}

int heads_in_m_smem_bytes(int head_dim) {
    switch (head_dim) {
    case 64: return (int)(smem_floats<64, 16>() * sizeof(float));
    case 128: return (int)(smem_floats<128, 16>() * sizeof(float));
    case 256: return (int)(smem_floats<256, 16>() * sizeof(float));
    }
    return 0;
}

} // namespace pkv
