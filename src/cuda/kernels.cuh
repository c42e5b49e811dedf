// kernels.cuh - the kernel files' interface to the launcher (launch.cu): each family's instances by dtype and
// head dim as plain function pointers, their dynamic shared memory, and the sm_90 ring kernel's layout
// constants the host needs as well.  Each .cu file is a device module of its own: a template instance can
// be launched (and configured) from another file only through its host stub's address, which these
// functions hand out.
#pragma once

#include "decode_common.cuh"
#include "pkv_cuda.h"

namespace pkv {

using decode_fn = void (*)(decode_params);
struct tma_maps {
    CUtensorMap k, v;
};
using tma_fn = void (*)(decode_params, tma_maps);
using merge_fn = void (*)(merge_params);

// ---- the sm_90 ring kernel (decode_tma.cu) ----
constexpr int kMaxStages = PKV_TUNING_MAX_STAGES;  // the deepest ring per warp (tma_stages' upper bound)
constexpr uint32_t kBoxBytes = 16 * 64 * 2;        // one box: 16 token rows of 128 bytes
constexpr int kChunkTokens = PKV_TMA_CHUNK_TOKENS; // pages of 8, 24, 40, ... tokens: a tensor copy per 8 tokens
// How a step's ring is filled: the template parameter TM of the ring kernel and decode_params.copy_mode,
// numbered as docs/kernel-notes.md numbers them (mode 2, cp.async into token-major rows, is retired).
enum copy_mode : int {
    kCopyTile = 0,   // pages that are multiples of 16 tokens: a tensor copy per tensor and tile (lane 0)
    kCopyChunks = 1, // pages of 8, 24, 40, ... at d <= 128: a tensor copy per tensor and 8-token chunk
    kCopyAsync = 3   // the other page sizes: cp.async from every lane into the tile's boxes
};
// Tokens per copy for a page size: a whole 16-token tile when pages are multiples of 16, else the
// largest power of two that divides the page size, so that no copy crosses a page.
__host__ __device__ constexpr int tma_chunk_tokens(int page_size) {
    return page_size % kTileTokens == 0 ? kTileTokens : page_size & -page_size;
}
// Shared memory of the kernel: 1024 bytes of alignment slack and `stages` stages of 2 x d/64 boxes per
// warp; after the tile loops the same bytes hold the warps' outputs for finish_task.
constexpr int kSwizzleAlign = 1024;
constexpr int tma_smem_bytes(int d, int stages) {
    return kSwizzleAlign + kWarps * stages * 2 * (d / 64) * (int)kBoxBytes;
}
// The fewest stages per warp: at d = 256 a stage (16 KiB of K and V) is twice d = 128's, and one stage
// per warp is what keeps the register kernel's 2 CTAs per SM resident (2 stages: 129 KiB, one CTA);
// a warp then issues its next tile after its math on the current one, with 8 warps per SM in turn.
constexpr int tma_min_stages(int d) {
    return d > 128 ? 1 : 2;
}

// ---- each family's instances (nullptr: none for that head dim, copy mode or head count) ----
// the cache's element type apart from q and o: the same 16-bit type, or fp8 in either encoding
enum kv_kind : int { kKvSame = 0, kKvE4M3 = 1, kKvE5M2 = 2 };
// heads in M, G <= 16 (decode_heads_in_m.cu), and its dynamic shared memory in bytes
decode_fn heads_in_m_kernel(pkv_dtype dtype, kv_kind kv, int head_dim);
int heads_in_m_smem_bytes(int head_dim);
// heads in N, G <= 8 (decode_heads_in_n.cu)
decode_fn heads_in_n_kernel(pkv_dtype dtype, kv_kind kv, int head_dim);
int heads_in_n_smem_bytes(int head_dim);
// the sm_90 ring kernel (decode_tma.cu): n_tiles 1 (G <= 8) or 2 (G 9..16, d <= 128), mode a copy_mode
// (kCopyChunks at d <= 128 only); its dynamic shared memory is tma_smem_bytes(head_dim, stages)
tma_fn tma_kernel(pkv_dtype dtype, int head_dim, int n_tiles, int mode);
// the merge kernels (merge.cu): per_head, a CTA per (merge, query head), else a CTA per merge
merge_fn merge_kernel_of(pkv_dtype dtype, int head_dim, bool per_head);

} // namespace pkv
