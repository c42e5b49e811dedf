// decode_heads_in_n.cu - the heads-in-N register kernel: GQA decode attention over the page tables for
// G <= 8, every head dim (64, 128, 256).  It is the G <= 8 kernel of sm_80-89 GPUs (and of sm_90 where the
// ring kernel does not run: tma=0, a build without sm_90 code), and of fp8 caches (e4m3, e5m2) at G <= 8 on
// every GPU: 16-byte loads of two 8-element chunks (q, and O^T's rows, in the matching head-dim order),
// widened in registers where the mma takes them (register_tiles.cuh), the K scale on the scores and the V
// scale on the output.  Its last measurements, and those of every
// other variant tried: docs/kernel-notes.md.
//
// The heads-in-M kernel's loads (register_tiles.cuh) with the operands swapped: S^T = K Q^T and
// O^T = V^T P^T, tokens and head dims in M, the G heads in N (8 columns).  The accumulator is then 16 x 8
// per 16 head dims (32 registers at d = 128 instead of 64, q 16 instead of 32) and each 16-token tile takes
// 8 + 8 mma instead of 16 + 16, which leaves room for 3 CTAs per SM at d <= 128; P^T reaches the B
// fragment by one movmatrix.trans per 8 tokens (heads_in_n.cuh).  Its K loads for the next tile are issued
// right after S, and V loads right after O, so a tile is always in flight while a warp computes.
//
// Thread (g, c) loads the same K and V chunks as the heads-in-M kernel.  S^T (tokens x heads): A = K with
// a = {K[g].x, K[g+8].x, K[g].y, K[g+8].y} per k-step, B = q of head g, so the C fragment holds
// tokens g, g+8 x heads 2c, 2c+1.  P^T is packed per 8 tokens and transposed by movmatrix into the
// B fragment (tokens 2c, 2c+1 | 8+2c, 9+2c x head g), which matches the V tokens of the thread.
// O^T (head dims x heads): A = V^T from byte permutes; m-tile (u, mp) row g is head dim
// v_chunk_dim(u, g) + 2mp (16-bit caches: (g + 8u) * 8 + 2mp), row g + 8 the dim after it.
#include "heads_in_n.cuh"
#include "kernels.cuh"
#include "register_tiles.cuh"
#include "task.cuh"

#include <type_traits>

namespace pkv {

// An fp8 cache's chunks come two per 16-byte load (register_tiles.cuh: K always, V where D / 64 is even), q
// loaded in K's order; a 16-bit cache keeps the 16-byte chunk loads of the heads-in-M kernel's order.
template <typename T, typename KV, int D> struct n8_pairs {
    static constexpr bool k = kv_traits<T, KV>::fp8;
    static constexpr bool v = k && D % 128 == 0;
};

// The mma's type: q's, or fp16 for a bf16 q over an fp8 cache.  Every e4m3 and e5m2 value is a float16 value,
// so the cache widens to fp16 by one conversion (e4m3) or byte permute (e5m2) per pair, where bf16 takes
// three more (through float); q is brought to fp16 once per task (q_bf16_to_f16) and P^T is packed in fp16,
// whose 11-bit mantissa holds the softmax weights at least as closely as bf16 down to 2^-14.
template <typename T, typename KV>
using n8_math_t = std::conditional_t<kv_traits<T, KV>::fp8 && std::is_same<T, __nv_bfloat16>::value, __half, T>;

// A bf16 q (the warp's chunks of the KV head's G heads) rewritten in place as fp16 values of q x 2^-e, e chosen
// from the largest |q| of the warp so that it lands in [2^14, 2^15): exact for every element within 2^28 of
// that maximum (fp16's normal range), well inside fp16 however large or small q is.  Returns 2^e, which the
// caller folds into the K scale.  A q with no finite nonzero maximum keeps e = 0 (zeros stay zeros, NaN and
// infinity stay themselves).
template <int KC> __device__ __forceinline__ float q_bf16_to_f16(uint4 (&qr)[KC]) {
    float mx = 0.f;
#pragma unroll
    for (int i = 0; i < KC; i++) {
        const uint32_t w[4] = {qr[i].x, qr[i].y, qr[i].z, qr[i].w};
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const float2 f = dtype_traits<__nv_bfloat16>::unpack(w[x]);
            mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
    }
#pragma unroll
    for (int sh = 1; sh < 32; sh <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
    int e = 0;
    if (mx > 0.f && mx <= 3.0e38f) e = min(max(ilogbf(mx) - 14, -120), 120);
    const float down = ldexpf(1.f, -e);
#pragma unroll
    for (int i = 0; i < KC; i++) {
        uint32_t w[4] = {qr[i].x, qr[i].y, qr[i].z, qr[i].w};
#pragma unroll
        for (int x = 0; x < 4; x++) {
            const float2 f = dtype_traits<__nv_bfloat16>::unpack(w[x]);
            w[x] = dtype_traits<__half>::pack(f.x * down, f.y * down);
        }
        qr[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    return ldexpf(1.f, e);
}

// One 16-token tile of the heads-in-N kernel: S^T from kr, the online softmax, O^T from vr.  The
// buffers are refilled with the tile at next_base (pages kpage/vpage; -1 pages load zeros, no
// memory): K right after S, V right after O, so a tile is in flight while the warp computes.  An fp8
// cache's chunks are widened here, where the mma takes them, and its K scale multiplies the scores.
template <typename T, int D, bool CAP, typename KV>
__device__ __forceinline__ void n8_tile(const decode_params &p, int head, int g, int c, int base, int te, int next_base,
                                        float kscale, const uint4 (&qr)[D / 32], kv_chunk<T, KV> (&kr)[2][D / 32],
                                        kv_chunk<T, KV> (&vr)[4][D / 64], const int32_t (&kpage)[2],
                                        const int32_t (&vpage)[4], float (&acc)[D / 16][4], float &ma, float &mb,
                                        float &la, float &lb) {
    constexpr int KC = D / 32;
    constexpr int VC = D / 64;
    // ---- S^T = K Q^T: two accumulators (x/y and z/w halves of each chunk) for a shorter chain
    float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < KC; i++) {
        const uint4 k0 = widen<T, KV>(kr[0][i]), k1 = widen<T, KV>(kr[1][i]);
        const uint32_t a0[4] = {k0.x, k1.x, k0.y, k1.y};
        const uint32_t a1[4] = {k0.z, k1.z, k0.w, k1.w};
        mma_16816<T>(s, a0, qr[i].x, qr[i].y);
        mma_16816<T>(s2, a1, qr[i].z, qr[i].w);
    }
    load_k<T, D, KV, n8_pairs<T, KV, D>::k>(p, p.k, next_base, head, g, c, kpage, kr);
    if constexpr (kv_traits<T, KV>::fp8) {
#pragma unroll
        for (int x = 0; x < 4; x++) {
            s[x] *= kscale;
            s2[x] *= kscale;
        }
    }
    float ala, alb;
    uint32_t b0, b1;
    n8_softmax<T, CAP>(s, s2, base + g < te, base + 8 + g < te, p, ma, mb, la, lb, ala, alb, b0, b1);
    // ---- O^T = O^T * alpha + V^T P^T
#pragma unroll
    for (int u = 0; u < VC; u++) {
        const uint4 x0 = widen<T, KV>(vr[0][u]), x1 = widen<T, KV>(vr[1][u]), x2 = widen<T, KV>(vr[2][u]),
                    x3 = widen<T, KV>(vr[3][u]);
        const uint32_t *w0 = reinterpret_cast<const uint32_t *>(&x0);
        const uint32_t *w1 = reinterpret_cast<const uint32_t *>(&x1);
        const uint32_t *w2 = reinterpret_cast<const uint32_t *>(&x2);
        const uint32_t *w3 = reinterpret_cast<const uint32_t *>(&x3);
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
    load_v<T, D, KV, n8_pairs<T, KV, D>::v>(p, p.v, next_base, head, g, c, vpage, vr);
}

// One task's tiles, softmax and output.  Each warp keeps DEPTH tiles in flight while it computes: one for
// a 16-bit cache (3 CTAs per SM at d <= 128), two for an fp8 cache at d <= 128, whose tile is half the
// bytes and, in its stored form, half the registers - the same bytes in flight per warp as a 16-bit
// cache (at d = 256 one fp8 tile is already as many bytes as a 16-bit tile at d = 128, and two spill).
template <typename T, int D, bool CAP, typename KV>
__device__ __forceinline__ void decode_n8_body(const decode_params &p, const task_info &ti, float *smem) {
    constexpr int KC = D / 32;
    constexpr int VC = D / 64;
    constexpr int MT = VC * 4; // m-tiles of O^T
    constexpr int GP = 8;
    constexpr bool kFp8 = kv_traits<T, KV>::fp8;
    using M = n8_math_t<T, KV>; // the mma's type
    constexpr int DEPTH = kFp8 && D <= 128 ? 2 : 1;
    constexpr int STEP = DEPTH * kWarps; // tiles between a buffer's tile and the one it loads next

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int32_t head = ti.head, tb = ti.tb, te = ti.te;
    const int G = p.group;
    const T *qbase = static_cast<const T *>(p.q) + ti.row * p.q_stride + (int64_t)head * G * D;
    uint4 qr[KC];
#pragma unroll
    for (int i = 0; i < KC; i++)
        qr[i] = g < G ? *reinterpret_cast<const uint4 *>(qbase + g * D + k_chunk_dim<n8_pairs<T, KV, D>::k>(i, c))
                     : make_uint4(0, 0, 0, 0);
    float qscale = 1.f;
    if constexpr (!std::is_same<M, T>::value) qscale = q_bf16_to_f16<KC>(qr);
    const float kscale = !kFp8 ? 1.f : (p.k_scales ? p.k_scales[head] : p.k_scale) * qscale;

    float acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f; // heads 2c and 2c + 1

    const int ntiles = (te - tb + 15) >> 4;
    // buffer b holds tile t = warp + b * kWarps (+ STEP per round); its pages are those of t + STEP
    int32_t kpa[DEPTH][2], vpa[DEPTH][4];
    kv_chunk<T, KV> kra[DEPTH][2][KC], vra[DEPTH][4][VC];
#pragma unroll
    for (int b = 0; b < DEPTH; b++) {
        const int t = warp + b * kWarps;
        tile_pages(p, ti, ntiles, t, g, c, kpa[b], vpa[b]);
        load_k<T, D, KV, n8_pairs<T, KV, D>::k>(p, p.k, tb + t * 16, head, g, c, kpa[b], kra[b]);
        load_v<T, D, KV, n8_pairs<T, KV, D>::v>(p, p.v, tb + t * 16, head, g, c, vpa[b], vra[b]);
        tile_pages(p, ti, ntiles, t + STEP, g, c, kpa[b], vpa[b]);
    }
    for (int tile = warp; tile < ntiles; tile += STEP) {
#pragma unroll
        for (int b = 0; b < DEPTH; b++) {
            const int t = tile + b * kWarps;
            if (b > 0 && t >= ntiles) break; // warp-uniform: this round's last tiles are past the range
            const int base = tb + t * 16;
            n8_tile<M, D, CAP, KV>(p, head, g, c, base, te, base + STEP * 16, kscale, qr, kra[b], vra[b], kpa[b],
                                   vpa[b], acc, ma, mb, la, lb);
            tile_pages(p, ti, ntiles, t + 2 * STEP, g, c, kpa[b], vpa[b]);
        }
    }
    if constexpr (kFp8) { // the V scale on the unnormalised output, before the warps' combine
        const float vscale = p.v_scales ? p.v_scales[head] : p.v_scale;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) acc[mt][0] *= vscale, acc[mt][1] *= vscale, acc[mt][2] *= vscale, acc[mt][3] *= vscale;
    }
    // ---- this warp's output: O[head][dim] = acc (see the m-tile layout above)
    n8_warp_out<D, GP, MT, 1>(smem, warp, 0, g, c, acc, ma, mb, la, lb,
                              [g](int mt) { return v_chunk_dim<n8_pairs<T, KV, D>::v>(mt >> 2, g) + 2 * (mt & 3); });
    finish_task<T, D, GP, 16>(p, smem, ti, G); // batches of 16: the 3-CTA register cap, no spills at d = 256
}

template <typename T, int D, typename KV>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 3 : 2) decode_kernel_n(const decode_params p) {
    extern __shared__ float smem[];
    PKV_TL_SCOPE(0, p.timeline);
    task_info ti;
    if (!load_task<T, D>(p, ti)) return;
    if (p.cap_log2 > 0.f) decode_n8_body<T, D, true, KV>(p, ti, smem);
    else decode_n8_body<T, D, false, KV>(p, ti, smem);
}

template <typename T, typename KV> static decode_fn heads_in_n_of(int head_dim) {
    switch (head_dim) {
    case 64: return decode_kernel_n<T, 64, KV>;
    case 128: return decode_kernel_n<T, 128, KV>;
    case 256: return decode_kernel_n<T, 256, KV>;
    }
    return nullptr;
}

template <typename T> static decode_fn heads_in_n_kv(kv_kind kv, int head_dim) {
    switch (kv) {
    case kKvSame: return heads_in_n_of<T, T>(head_dim);
    case kKvE4M3: return heads_in_n_of<T, kv_e4m3>(head_dim);
    case kKvE5M2: return heads_in_n_of<T, kv_e5m2>(head_dim);
    }
    return nullptr;
}

decode_fn heads_in_n_kernel(pkv_dtype dtype, kv_kind kv, int head_dim) {
    return dtype == PKV_DTYPE_FP16 ? heads_in_n_kv<__half>(kv, head_dim) : heads_in_n_kv<__nv_bfloat16>(kv, head_dim);
}

int heads_in_n_smem_bytes(int head_dim) {
    switch (head_dim) {
    case 64: return (int)(smem_floats<64, 8>() * sizeof(float));
    case 128: return (int)(smem_floats<128, 8>() * sizeof(float));
    case 256: return (int)(smem_floats<256, 8>() * sizeof(float));
    }
    return 0;
}

} // namespace pkv
