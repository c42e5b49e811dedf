// register_tiles.cuh - the register kernels' K and V reads (heads in M and heads in N): a warp's 16-token
// tile straight from the pages into registers with 16-byte loads, no shared memory, each thread loading
// the chunks its own mma fragments need (the permutation is described in decode_heads_in_m.cu), and the
// tile's page ids, which the kernels look up a tile ahead.  fp8 caches (e4m3, e5m2) are read in the same
// pattern with 8-byte loads, 8 elements each, held as loaded and widened in registers to the mma's 16-bit
// type where the mma takes them.
#pragma once

#include "decode_common.cuh"

#include <cuda_fp8.h>

#include <type_traits>

namespace pkv {

// The element type of a cache: T itself (fp16, bf16), or fp8 in one of its two encodings, read as bytes.
struct kv_e4m3 {};
struct kv_e5m2 {};
template <typename T, typename KV> struct kv_traits {
    static constexpr bool fp8 = false;
    using elem = T;
};
template <typename T> struct kv_traits<T, kv_e4m3> {
    static constexpr bool fp8 = true;
    using elem = uint8_t;
};
template <typename T> struct kv_traits<T, kv_e5m2> {
    static constexpr bool fp8 = true;
    using elem = uint8_t;
};

// Two fp8 values (the low 16 bits of w, element 0 in the low byte) as a pair of T (element 0 in the low
// half).  Exact: every e4m3 and e5m2 value, NaN and (e5m2) infinities included, is a float16 and a bfloat16
// value.  e5m2 is the high byte of the float16 of the same value, so a byte permute widens it; e4m3 takes
// the hardware conversion where there is one (sm_89 and newer) and cuda_fp8.h's arithmetic before that.
template <typename KV> __device__ __forceinline__ uint32_t fp8x2_to_half2(uint32_t w);
template <> __device__ __forceinline__ uint32_t fp8x2_to_half2<kv_e5m2>(uint32_t w) {
    return __byte_perm(w, 0u, 0x1404u);
}
template <> __device__ __forceinline__ uint32_t fp8x2_to_half2<kv_e4m3>(uint32_t w) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
template <typename T, typename KV> __device__ __forceinline__ uint32_t fp8x2_to(uint32_t w) {
    const uint32_t h = fp8x2_to_half2<KV>(w);
    if constexpr (std::is_same<T, __half>::value) {
        return h;
    } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
        const __nv_bfloat162 b = __float22bfloat162_rn(f);
        return *reinterpret_cast<const uint32_t *>(&b);
    }
}
// 8 fp8 values (8 bytes) as the 8 T values of one 16-byte chunk of a 16-bit cache.
template <typename T, typename KV> __device__ __forceinline__ uint4 widen_fp8x8(uint2 x) {
    return make_uint4(fp8x2_to<T, KV>(x.x), fp8x2_to<T, KV>(x.x >> 16), fp8x2_to<T, KV>(x.y),
                      fp8x2_to<T, KV>(x.y >> 16));
}
// One 8-element chunk of a cache as it is stored: 16 bytes of a 16-bit cache, 8 bytes of an fp8 one.  The
// kernels keep the tiles in flight in this form and widen a chunk where an mma takes it, so a load never
// waits on the conversion and an fp8 tile in flight holds half the registers of a 16-bit one.
template <typename T, typename KV> using kv_chunk = std::conditional_t<kv_traits<T, KV>::fp8, uint2, uint4>;
template <typename T, typename KV> __device__ __forceinline__ kv_chunk<T, KV> load_chunk8(const void *base, int64_t off) {
    if constexpr (kv_traits<T, KV>::fp8) {
        return ldg_nc_v2(static_cast<const uint8_t *>(base) + off);
    } else {
        return ldg_nc_v4(static_cast<const T *>(base) + off);
    }
}
// A stored chunk as the 8 T values of the mma's fragments.
template <typename T, typename KV> __device__ __forceinline__ uint4 widen(const kv_chunk<T, KV> &x) {
    if constexpr (kv_traits<T, KV>::fp8) {
        return widen_fp8x8<T, KV>(x);
    } else {
        return x;
    }
}
template <typename T, typename KV> __device__ __forceinline__ kv_chunk<T, KV> zero_chunk() {
    if constexpr (kv_traits<T, KV>::fp8) {
        return make_uint2(0, 0);
    } else {
        return make_uint4(0, 0, 0, 0);
    }
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

// The head dims a thread's chunks hold.  K (and q, which must match): chunk i of thread (g, c) is dims
// (i * 4 + c) * 8 .. + 7, or with PAIRS ((i >> 1) * 4 + c) * 16 + (i & 1) * 8 .. + 7, so that chunks 2i and
// 2i + 1 are 16 contiguous bytes of an fp8 row and one 16-byte load brings both.  V: chunk u of thread g is
// dims (g + 8u) * 8 .. + 7, or with PAIRS (g + 8 (u >> 1)) * 16 + (u & 1) * 8 .. + 7 (needs D / 64 even).
// Any such assignment is exact: S sums over every dim whichever thread holds it, and O^T's rows follow V's.
template <bool PAIRS> __device__ __forceinline__ int k_chunk_dim(int i, int c) {
    return PAIRS ? ((i >> 1) * 4 + c) * 16 + (i & 1) * 8 : (i * 4 + c) * 8;
}
template <bool PAIRS> __device__ __forceinline__ int v_chunk_dim(int u, int g) {
    return PAIRS ? (g + 8 * (u >> 1)) * 16 + (u & 1) * 8 : (g + 8 * u) * 8;
}
// Two stored fp8 chunks of PAIRS from one 16-byte load.
__device__ __forceinline__ void load_fp8_pair(const void *base, int64_t off, uint2 &lo, uint2 &hi) {
    const uint4 x = ldg_nc_v4(static_cast<const uint8_t *>(base) + off);
    lo = make_uint2(x.x, x.y);
    hi = make_uint2(x.z, x.w);
}

// K of tokens base + 8j + g: the chunks k_chunk_dim(i, c).  V of tokens base + {2c, 2c+1, 8+2c, 9+2c}: the
// chunks v_chunk_dim(u, g).  Zeros where the page id is -1.  Stored form (kv_chunk): widen() before the mma.
// PAIRS (fp8 caches only): two chunks per 16-byte load, the same bytes in half the load instructions.
template <typename T, int D, typename KV = T, bool PAIRS = false>
__device__ __forceinline__ void load_k(const decode_params &p, const void *kbase, int base, int head, int g, int c,
                                       const int32_t (&kp)[2], kv_chunk<T, KV> (&kr)[2][D / 32]) {
    static_assert(!PAIRS || kv_traits<T, KV>::fp8, "chunk pairs are 16-byte loads of fp8 chunks");
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (kp[j] >= 0) {
            const int64_t off = page_offset(p, kp[j], base + 8 * j + g, head);
            if constexpr (PAIRS) {
#pragma unroll
                for (int i = 0; i < D / 32; i += 2)
                    load_fp8_pair(kbase, off + k_chunk_dim<true>(i, c), kr[j][i], kr[j][i + 1]);
            } else {
#pragma unroll
                for (int i = 0; i < D / 32; i++) kr[j][i] = load_chunk8<T, KV>(kbase, off + k_chunk_dim<false>(i, c));
            }
        } else {
#pragma unroll
            for (int i = 0; i < D / 32; i++) kr[j][i] = zero_chunk<T, KV>();
        }
    }
}
template <typename T, int D, typename KV = T, bool PAIRS = false>
__device__ __forceinline__ void load_v(const decode_params &p, const void *vbase, int base, int head, int g, int c,
                                       const int32_t (&vp)[4], kv_chunk<T, KV> (&vr)[4][D / 64]) {
    static_assert(!PAIRS || (kv_traits<T, KV>::fp8 && D % 128 == 0), "V chunk pairs: fp8, D / 64 even");
#pragma unroll
    for (int qv = 0; qv < 4; qv++) {
        if (vp[qv] >= 0) {
            const int64_t off = page_offset(p, vp[qv], base + (qv >> 1) * 8 + 2 * c + (qv & 1), head);
            if constexpr (PAIRS) {
#pragma unroll
                for (int u = 0; u < D / 64; u += 2)
                    load_fp8_pair(vbase, off + v_chunk_dim<true>(u, g), vr[qv][u], vr[qv][u + 1]);
            } else {
#pragma unroll
                for (int u = 0; u < D / 64; u++) vr[qv][u] = load_chunk8<T, KV>(vbase, off + v_chunk_dim<false>(u, g));
            }
        } else {
#pragma unroll
            for (int u = 0; u < D / 64; u++) vr[qv][u] = zero_chunk<T, KV>();
        }
    }
}

} // namespace pkv
