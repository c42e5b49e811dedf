// register_tiles.cuh - the register kernels' K and V reads (heads in M and heads in N): a warp's 16-token
// tile straight from the pages into registers with 16-byte loads, no shared memory, each thread loading
// the chunks its own mma fragments need (the permutation is described in decode_heads_in_m.cu), and the
// tile's page ids, which the kernels look up a tile ahead.
#pragma once

#include "decode_common.cuh"

namespace pkv {

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

} // namespace pkv
