// decode_tma.cu - the sm_90 ring kernel: heads-in-N decode attention with K and V brought into shared
// memory by the copy engines instead of loaded by the warps.  It runs on sm_90 for G <= 8 at d = 64/128/256
// and G 9..16 at d = 64/128 (two n-tiles of heads), every page size; elsewhere (sm_80-89, G 9..16 at
// d = 256, tma=0) the register kernels run.  Its last measurements, and those of every variant tried:
// docs/kernel-notes.md (v8, v9, v14-v18).
//
// The math is the heads-in-N kernel's (S^T = K Q^T, O^T = V^T P^T, tokens and head dims in M, the G heads
// in N; heads_in_n.cuh), but no warp loads K or V itself: each warp keeps a ring of S stages in shared
// memory (a 16-token tile of K and of V per stage) with one mbarrier per stage, filled in one of three
// ways (kernels.cuh copy_mode, chosen per step by the page size):
//   kCopyTile (pages that are multiples of 16 tokens; tiles start on 16-token boundaries, a window's first
//     tile before its start, so a tile never crosses a page): lane 0 issues one TMA tensor copy per tensor
//     (16 tokens x d, landing as d/64 boxes of 16 rows of 128 bytes, 128-byte swizzle) from tensor maps
//     over the K and V page pools (launch.cu encode_pool: NHD and HND differ only in the strides);
//   kCopyChunks (pages of 8, 24, 40, ... tokens at d = 64/128): a tile in chunks of 8 tokens, one tensor
//     copy per chunk and tensor, each issued by its own lane, landing token-major;
//   kCopyAsync (the other page sizes: 1, 2, 4, 12, ...; at d = 256 every size not a multiple of 16): every
//     lane fills the tile's swizzled boxes by cp.async, 16 bytes per instruction.
// The fragments come from ldmatrix (K as the A operand of S^T; V by ldmatrix.trans as the A operand of
// O^T), so a tile costs the warp a handful of issue slots for its loads instead of 16 global loads, their
// addresses and the byte permutes.  The NT = 2 instance at d = 64 is compiled for 4 CTAs per SM, the
// heads-in-M register kernel's residency there, which the planner's waves assume.
#include "heads_in_n.cuh"
#include "kernels.cuh"
#include "task.cuh"

namespace pkv {

// One task on the ring.  NT: n-tiles of 8 heads (G <= 8 NT).  NT = 2 (G 9..16, d <= 128) shares each K and
// V fragment between the two n-tiles, with twice the accumulators.  TM: the copy mode (kernels.cuh).
// About 250 lines as one function: the ring's issue helpers (lambdas), its prologue, the tile loop and the
// refill share a dozen per-warp values (ring and barrier addresses, the tile range, the next tile's page
// id), and the three copy modes differ only in a few `if constexpr` branches; split into functions those
// values would be passed around by reference for the same code.
template <typename T, int D, int NT, bool CAP, int TM>
__device__ __forceinline__ void decode_tma_body(const decode_params &p, const tma_maps &maps, const task_info &ti,
                                                float *smem, uint64_t (&bars)[kWarps][kMaxStages]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int H = D / 64;  // boxes per tensor per tile
    constexpr int KS = D / 16; // k-steps of S^T, m-tiles of O^T
    constexpr int GP = 8 * NT;
    constexpr uint32_t kTileBytes = 2 * H * kBoxBytes;
    static_assert(NT == 1 || (NT == 2 && D <= 128), "16 heads at d <= 128");
    // kCopyChunks writes token-major rows (TOKM), the other modes the tile's d/64 boxes; kCopyAsync fills by
    // cp.async (CPA)
    constexpr bool TOKM = TM == kCopyChunks, CPA = TM == kCopyAsync;
    static_assert(!TOKM || D <= 128, "token-major rows at d <= 128 (at d = 256 their ldmatrix rows would conflict 4-way)");
    static_assert(smem_out_floats<D, 8 * NT>() * 4 <= kWarps * tma_min_stages(D) * (int)kTileBytes,
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

    // kCopyChunks: a tile is 16 / hb chunks of hb tokens, hb the largest power of two dividing the page size
    // (the launcher runs this mode where that is kChunkTokens, 8), so no chunk crosses a page; lane j loads
    // chunk j's page id and issues its copies, and chunks wholly outside [tb, te) are not read (their rows
    // are masked like the rows past te).  kCopyAsync: the same lookups with hb = 1 (lane j: token j), the
    // copies from every lane (issue_cpa).  kCopyTile: lane 0 does both for the tile's one page.
    const int hb = TM == kCopyChunks ? (p.page_size & -p.page_size) : CPA ? 1 : 16, nchunk = 16 / hb;
    // TM != kCopyTile: this lane's chunk of the warp's it-th tile - its first token, and whether it meets
    // [tb, te) (kCopyChunks' copies follow this test, not the page id, so a page id the caller left negative
    // is read as zeros by the tensor copy, as in the whole-tile path, and the stage's byte count still
    // completes; kCopyAsync zero-fills such a page id's token instead)
    auto chunk_tok = [&](int it) -> int32_t { return t0 + (warp + it * kWarps) * 16 + lane * hb; };
    auto chunk_in = [&](int32_t tok) { return lane < nchunk && tok + hb > tb && tok < te; };
    auto tile_at = [&](int it, int32_t &page, int32_t &off) {
        const int32_t tok = TM != kCopyTile ? chunk_tok(it) : t0 + (warp + it * kWarps) * 16;
        if (TM != kCopyTile && !chunk_in(tok)) {
            page = CPA ? -1 : 0, off = 0; // cp.async: a token not read (its rows are zero-filled)
            return;
        }
        page = token_page(p, ti.page_base, tok);
        off = token_in_page(p, tok);
    };
    // a stage's copies: lane 0 for the tile's one page, or (kCopyChunks) every lane for its chunk of tile
    // `it` (lane 0 counts the bytes of the chunks that meet [tb, te))
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
    // kCopyAsync: every lane copies 16 bytes at a time, lanes along a token's head vector (CH chunks of 16
    // bytes per token, TPL tokens per instruction: whole 128-byte lines per warp request), into the swizzled
    // boxes the ldmatrix side reads (those of kCopyTile); token t's page id and offset come from lane t.  A
    // token outside [tb, te) or with a page id outside the pool is zero-filled, not read (so the V rows of
    // the first and last tiles need no zeroing).  Each lane then arrives on the stage's barrier (count 32)
    // when its copies have landed.
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
            const int row = t; // 128-byte row t of box ch / 8
            const uint32_t at =
                dst + (uint32_t)((ch >> 3) * (int)kBoxBytes + row * 128 + (((ch & 7) ^ (row & 7)) << 4));
            cp_async_16(at, kpool + e, ok);
            cp_async_16(at + H * kBoxBytes, vpool + e, ok);
        }
        cp_async_arrive(bar);
    };
    int32_t npage = 0, noff = 0; // lane 0 (other modes: lane j, chunk j): the next tile to issue (it + S)
    if (lane == 0 && nmine > 0) {
        for (int s = 0; s < S; s++) mbar_init(bar0 + 8u * s, CPA ? 32 : 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        if constexpr (TM == kCopyTile) {
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
    if constexpr (TM != kCopyTile) { // every lane, once the barriers are initialised
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
    // and tm_at adds h (2-way ldmatrix conflicts at H = 2, which kernel-notes v8 measured as fast as the box
    // layout).
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
        if constexpr (TM != kCopyTile) {
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

// The body is compiled for sm_90 only: a build of older PTX JIT-compiled on an sm_90 GPU has an empty
// kernel, and the launcher runs the register kernels there (launch.cu, sm90_code).
template <typename T, int D, int NT, int TM>
__global__ void __launch_bounds__(kThreads, D > 128 || (NT == 2 && D > 64) ? 2 : D <= 64 ? 4 : 3)
    decode_kernel_tma(const decode_params p, const __grid_constant__ tma_maps maps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ float smem[];
    __shared__ __align__(8) uint64_t bars[kWarps][kMaxStages];
    PKV_TL_SCOPE(0, p.timeline);
    task_info ti;
    if (!load_task<T, D>(p, ti)) return;
    if (p.cap_log2 > 0.f) decode_tma_body<T, D, NT, true, TM>(p, maps, ti, smem, bars);
    else decode_tma_body<T, D, NT, false, TM>(p, maps, ti, smem, bars);
#endif
}

// The instances: every copy mode at d = 64/128 for one and two n-tiles, tiles and cp.async at d = 256 (one
// n-tile); nullptr for the others.
template <typename T, int D, int NT> static tma_fn tma_of_mode(int mode) {
    switch (mode) {
    case kCopyTile: return decode_kernel_tma<T, D, NT, kCopyTile>;
    case kCopyAsync: return decode_kernel_tma<T, D, NT, kCopyAsync>;
    case kCopyChunks:
        if constexpr (D <= 128) return decode_kernel_tma<T, D, NT, kCopyChunks>;
        return nullptr;
    }
    return nullptr;
}
template <typename T> static tma_fn tma_of(int head_dim, int n_tiles, int mode) {
    if (n_tiles == 1) {
        switch (head_dim) {
        case 64: return tma_of_mode<T, 64, 1>(mode);
        case 128: return tma_of_mode<T, 128, 1>(mode);
        case 256: return tma_of_mode<T, 256, 1>(mode);
        }
    } else if (n_tiles == 2) {
        switch (head_dim) {
        case 64: return tma_of_mode<T, 64, 2>(mode);
        case 128: return tma_of_mode<T, 128, 2>(mode);
        }
    }
    return nullptr;
}

tma_fn tma_kernel(pkv_dtype dtype, int head_dim, int n_tiles, int mode) {
    return dtype == PKV_DTYPE_FP16 ? tma_of<__half>(head_dim, n_tiles, mode)
                                   : tma_of<__nv_bfloat16>(head_dim, n_tiles, mode);
}

} // namespace pkv
