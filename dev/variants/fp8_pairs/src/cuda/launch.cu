// launch.cu - the decode side's host half: which kernel runs a step (heads in N or M on registers, or the
// sm_90 ring kernel and its copy mode), how it is launched (launch configuration, programmatic dependent
// launch), the run of a plan's phases (run_phases: decode launches, then merges), the ring's set-up per
// device (stages per warp, shared-memory limits) and its tensor maps, and the kernel name the tests and the
// benchmark records check.  The kernels themselves are in decode_heads_in_m.cu, decode_heads_in_n.cu,
// decode_tma.cu and merge.cu (kernels.cuh).
#include "kernels.cuh"
#include "launch.cuh"
#include "merge.cuh" // merge_wide

#include <float.h>
#include <initializer_list>
#include <math.h>

namespace pkv {
namespace {

// ---- the register kernels ------------------------------------------------------------------------
// Heads in N for G <= 8, heads in M (16 rows) for G 9..16; both read 16-bit and fp8 caches.
enum kernel_kind { kHeadsInN, kHeadsInM };
kv_kind kv_of(const pkv_problem &pr) {
    return pr.kv_dtype == PKV_DTYPE_FP8_E4M3 ? kKvE4M3 : pr.kv_dtype == PKV_DTYPE_FP8_E5M2 ? kKvE5M2 : kKvSame;
}
kernel_kind kernel_for(int32_t group) { return group > 8 ? kHeadsInM : kHeadsInN; }
// Heads in N reads an fp8 cache by 16-byte loads, which need pages 16-byte aligned: a page stride of 8 mod 16
// bytes (allowed: a multiple of 8 elements) takes heads in M, whose fp8 loads are 8 bytes.
kernel_kind kernel_for(int32_t group, kv_kind kv, int64_t stride_page) {
    return kv != kKvSame && stride_page % 16 != 0 ? kHeadsInM : kernel_for(group);
}

const pkv_dtype kDtypes[] = {PKV_DTYPE_FP16, PKV_DTYPE_BF16};
const int kHeadDims[PKV_TMA_HEAD_DIMS] = {64, 128, 256};

// The register kernel of a kind and its dynamic shared memory (bytes).
decode_fn register_kernel(kernel_kind kind, pkv_dtype dtype, int head_dim, int *smem_bytes, kv_kind kv = kKvSame) {
    if (kind == kHeadsInM) {
        *smem_bytes = heads_in_m_smem_bytes(head_dim);
        return heads_in_m_kernel(dtype, kv, head_dim);
    }
    *smem_bytes = heads_in_n_smem_bytes(head_dim);
    return heads_in_n_kernel(dtype, kv, head_dim);
}

// Every register kernel instance's dynamic shared-memory limit raised to what it takes.
cudaError_t register_set_attrs() {
    for (pkv_dtype dt : kDtypes)
        for (int d : kHeadDims)
            for (kernel_kind k : {kHeadsInN, kHeadsInM})
                for (kv_kind kv : {kKvSame, kKvE4M3, kKvE5M2}) {
                    int smem = 0;
                    const decode_fn f = register_kernel(k, dt, d, &smem, kv);
                    const cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
                    if (e != cudaSuccess) return e;
                }
    return cudaSuccess;
}

// CTAs of a register kernel (fp16) resident per SM on the current device; 0 on error.
int register_resident(kernel_kind kind, int head_dim) {
    int n = 0, smem = 0;
    const decode_fn f = register_kernel(kind, PKV_DTYPE_FP16, head_dim, &smem);
    return f && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kThreads, smem) == cudaSuccess ? n : 0;
}

// ---- launches --------------------------------------------------------------------------------------
// A launch configuration; pdl: a programmatic dependent of the kernel before it on the stream (its CTAs
// may be scheduled while that kernel drains; every kernel here reads and writes the step's memory only
// after griddepcontrol.wait, i.e. after that kernel has completed).
struct launch_cfg {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    launch_cfg(dim3 grid, int smem, cudaStream_t stream, bool pdl) {
        cfg.gridDim = grid;
        cfg.blockDim = dim3(kThreads);
        cfg.dynamicSmemBytes = (size_t)smem;
        cfg.stream = stream;
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
    }
    // launches kernel(args...) with this configuration: the launch's error, else the last one (no such
    // instance: cudaErrorInvalidValue)
    template <typename... Params, typename... Args> cudaError_t launch(void (*kernel)(Params...), Args &&...args) {
        if (!kernel) return cudaErrorInvalidValue;
        const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
        return e != cudaSuccess ? e : cudaGetLastError();
    }
};

// ---- the sm_90 ring kernel's set-up per device -----------------------------------------------------
// cuTensorMapEncodeTiled from the driver, through the runtime's entry point (no link against libcuda).
using encode_tiled_fn = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
encode_tiled_fn g_encode_tiled = nullptr;
const int kCopyModes[] = {kCopyTile, kCopyChunks, kCopyAsync};

// CTAs of the ring kernel (fp16, whole-tile copies) resident per SM with `stages` stages; 0 on error.
int tma_resident(int head_dim, int n_tiles, int stages) {
    int n = 0;
    const tma_fn f = tma_kernel(PKV_DTYPE_FP16, head_dim, n_tiles, kCopyTile);
    return f && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kThreads, tma_smem_bytes(head_dim, stages)) ==
                    cudaSuccess
               ? n
               : 0;
}
// The largest static shared memory of the instances (both dtypes, every copy mode) at (head_dim, n_tiles):
// *static_bytes becomes the larger of it and itself.
cudaError_t tma_static_bytes(int head_dim, int n_tiles, size_t *static_bytes) {
    for (int mode : kCopyModes)
        for (pkv_dtype dt : kDtypes) {
            const tma_fn f = tma_kernel(dt, head_dim, n_tiles, mode);
            if (!f) continue;
            cudaFuncAttributes fa;
            const cudaError_t e = cudaFuncGetAttributes(&fa, f);
            if (e != cudaSuccess) return e;
            if (fa.sharedSizeBytes > *static_bytes) *static_bytes = fa.sharedSizeBytes;
        }
    return cudaSuccess;
}
// Raises the dynamic shared-memory limit of those instances to `bytes`.
cudaError_t tma_raise_limit(int head_dim, int n_tiles, int bytes) {
    for (int mode : kCopyModes)
        for (pkv_dtype dt : kDtypes) {
            const tma_fn f = tma_kernel(dt, head_dim, n_tiles, mode);
            if (!f) continue;
            const cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
            if (e != cudaSuccess) return e;
        }
    return cudaSuccess;
}
// The most stages (from lo to max_stages) that keep `want` CTAs of the n_tiles instance resident; 0: none.
int tma_stages_for(int head_dim, int n_tiles, int lo, int max_stages, int want) {
    int stages = 0;
    for (int s = lo; s <= max_stages; s++)
        if (tma_resident(head_dim, n_tiles, s) >= want) stages = s;
    return stages;
}

// Stages per warp of the ring kernel at head_dim on the current device, for G <= 8 (stages_out[0]) and
// G 9..16 (stages_out[1], d <= 128): the most that keep as many CTAs resident as the register kernel it
// replaces (the planner's waves assume that count); 0: the register kernel runs.  Deeper rings where a grid
// leaves room for them measured slower on the long single requests (docs/kernel-notes.md v8).  Kept per
// context (pkv_cuda_launch_opts), so contexts on different GPU models do not share it.  *max_out: the most
// stages whose ring fits the device's shared memory per CTA (the dynamic limit is raised to that ring;
// tma_stages is clamped to it).  Before sm_90 nothing is set and both are 0: the ring of kMaxStages is
// larger than an A100's or an RTX GPU's opt-in shared memory, and raising a kernel's limit past it fails
// (which made the whole context fail there).
cudaError_t tma_setup(int head_dim, int cc_major, size_t smem_optin, int32_t stages_out[2], int32_t *max_out) {
    stages_out[0] = stages_out[1] = *max_out = 0;
    if (cc_major < 9) return cudaSuccess; // tensor copies are sm_90's: the register kernels run there
    const bool two_tiles = head_dim <= 128; // G 9..16 runs the ring at d <= 128 only
    size_t static_bytes = 0;
    cudaError_t e = tma_static_bytes(head_dim, 1, &static_bytes);
    if (two_tiles && e == cudaSuccess) e = tma_static_bytes(head_dim, 2, &static_bytes);
    if (e != cudaSuccess) return e;
    const int lo = tma_min_stages(head_dim);
    int max_stages = kMaxStages;
    while (max_stages >= lo && (size_t)tma_smem_bytes(head_dim, max_stages) + static_bytes > smem_optin) max_stages--;
    if (max_stages < lo) return cudaSuccess;
    e = tma_raise_limit(head_dim, 1, tma_smem_bytes(head_dim, max_stages));
    if (two_tiles && e == cudaSuccess) e = tma_raise_limit(head_dim, 2, tma_smem_bytes(head_dim, max_stages));
    if (e != cudaSuccess) return e;
    stages_out[0] = tma_stages_for(head_dim, 1, lo, max_stages, register_resident(kHeadsInN, head_dim));
    if (two_tiles) stages_out[1] = tma_stages_for(head_dim, 2, lo, max_stages, register_resident(kHeadsInM, head_dim));
    *max_out = max_stages;
    return cudaSuccess;
}

// ---- the ring kernel's tensor maps ----------------------------------------------------------------
// A tensor map over a page pool: {dim % 64, token in page, dim / 64, KV head, page} (NHD and HND differ
// in the strides only), one box of 64 x 16 x d/64 per tile: a tile's K (or V) is one copy, laid out as
// d/64 boxes of 16 rows of 128 bytes.  L2 promotion of 128 bytes: with 256 the two 128-byte halves of a
// token's head vector were promoted each, which read more L2 sectors and made long steps slower.
// Pages of 8, 24, 40, ... tokens (kCopyChunks): {dim % 64, dim / 64, token in page, KV head, page} with a
// box of 64 x d/64 x hb, hb the largest power of two dividing the page size (8): a chunk of hb tokens lands
// token-major (each token's d/64 rows of 128 bytes together), so the chunks stack into the tile's 16 token
// rows.
bool encode_pool(CUtensorMap *map, const void *pool, const pkv_problem &pr, const pkv_kv_strides &st) {
    const cuuint64_t H = (cuuint64_t)pr.head_dim / 64, P = (cuuint64_t)pr.page_size, tok = (cuuint64_t)st.token * 2;
    const cuuint32_t hb = (cuuint32_t)tma_chunk_tokens(pr.page_size);
    const bool chunked = hb < (cuuint32_t)kTileTokens; // dims 1 and 2 (token in page, dim / 64) trade places
    const cuuint64_t dims[5] = {64, chunked ? H : P, chunked ? P : H, (cuuint64_t)pr.num_kv_heads,
                                (cuuint64_t)pr.num_pages};
    const cuuint64_t strides[4] = {chunked ? 128 : tok, chunked ? tok : 128, (cuuint64_t)st.head * 2,
                                   (cuuint64_t)st.page * 2};
    const cuuint32_t box[5] = {64, chunked ? (cuuint32_t)H : (cuuint32_t)kTileTokens, chunked ? hb : (cuuint32_t)H, 1,
                               1},
                     elem[5] = {1, 1, 1, 1, 1};
    return g_encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 5, const_cast<void *>(pool), dims, strides, box, elem,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Whether a step runs the ring kernel (sm_90 with tma on; G <= 8 at d = 64/128/256, G 9..16 at d = 64/128
// where tma_setup gave that instance stages), its stages per warp (*stages) and its copy mode (*mode):
// pages that are multiples of 16 by a tensor copy per tile, pages of 8, 24, 40, ... at d = 64/128 by a
// tensor copy per 8-token chunk, the others (and those at d = 256) by cp.async from every lane.  False: the
// register kernel runs.  The tensor-copy modes encode tensor maps; the last maps are kept per thread (same
// pools and shape: no re-encoding per step).
bool tma_maps_for(const pkv_plan *plan, const pkv_tensors *t, const pkv_kv_strides &st, const pkv_cuda_launch_opts &o,
                  tma_maps *maps, int32_t *stages, int32_t *mode) {
    const pkv_problem &pr = plan->problem;
    const int idx = pr.head_dim == 64 ? 0 : pr.head_dim == 128 ? 1 : pr.head_dim == 256 ? 2 : -1;
    const int nt = plan->group > 8 ? 1 : 0;
    const int chunk = tma_chunk_tokens(pr.page_size);
    if (chunk == kTileTokens) *mode = kCopyTile;
    else if (chunk >= kChunkTokens && pr.head_dim <= 128) *mode = kCopyChunks;
    else *mode = kCopyAsync;
    if (!o.tma || idx < 0 || plan->group > 16 || kv_of(pr) != kKvSame || (*mode != kCopyAsync && !g_encode_tiled) ||
        pr.num_pages <= 0 || pr.num_pages > INT32_MAX)
        return false;
    const int32_t dflt = o.tma_default_stages[idx][nt];
    const int lo = tma_min_stages(pr.head_dim);
    if (dflt < lo) return false;
    *stages = o.tma_stages > 0 ? min(max(o.tma_stages, lo), o.tma_max_stages[idx]) : dflt;
    if (*mode == kCopyAsync) return true; // cp.async: no maps
    struct cache_entry {
        const void *k, *v;
        int32_t d, page_size, hkv, layout;
        int64_t num_pages, page_stride;
        bool ok;
        tma_maps maps;
    };
    static thread_local cache_entry last = {};
    if (last.k != t->k_cache || last.v != t->v_cache || last.d != pr.head_dim || last.page_size != pr.page_size ||
        last.hkv != pr.num_kv_heads || last.layout != (int32_t)pr.layout || last.num_pages != pr.num_pages ||
        last.page_stride != st.page) {
        last.page_stride = st.page;
        last.k = t->k_cache;
        last.v = t->v_cache;
        last.d = pr.head_dim;
        last.page_size = pr.page_size;
        last.hkv = pr.num_kv_heads;
        last.layout = (int32_t)pr.layout;
        last.num_pages = pr.num_pages;
        last.ok = encode_pool(&last.maps.k, t->k_cache, pr, st) && encode_pool(&last.maps.v, t->v_cache, pr, st);
    }
    if (last.ok) *maps = last.maps;
    return last.ok;
}

// ---- a plan's launches --------------------------------------------------------------------------------
// The merge kernel of a plan: a CTA per (merge, query head) when a CTA per merge would take merge_wide_at
// (2) or more dependent batches of state loads per thread (ceil(G x D / 4 / threads) columns x
// ceil(count / 16)); for narrower merges the per-merge kernel is shorter (docs/kernel-notes.md v7, v13d).
// tuning merge=head|row forces one.
bool merge_per_head(const pkv_plan *plan, const pkv_cuda_launch_opts &o) {
    if (o.merge_kernel != PKV_TUNING_MERGE_AUTO) return o.merge_kernel == PKV_TUNING_MERGE_HEAD;
    return merge_wide(plan->problem.head_dim, plan->group, plan->max_merge_count, o.merge_wide_at);
}

cudaError_t launch_merge(const pkv_plan *plan, const merge_params &p, int32_t n, cudaStream_t stream, bool pdl,
                         bool per_head) {
    launch_cfg lc(dim3(per_head ? (unsigned)n * (unsigned)p.group : (unsigned)n), 0, stream, pdl);
    return lc.launch(merge_kernel_of(plan->problem.dtype, plan->problem.head_dim, per_head), p);
}

// The decode kernel over a grid of tasks: the ring kernel when the step has its set-up (maps: p.stages and
// p.copy_mode set with them), else the register kernel of the plan's kind.
cudaError_t launch_tasks(const pkv_plan *plan, const decode_params &p, dim3 grid, cudaStream_t stream,
                         const pkv_cuda_launch_opts &o, const tma_maps *maps) {
    const pkv_dtype dt = plan->problem.dtype;
    const int d = plan->problem.head_dim;
    if (maps)
        return launch_cfg(grid, tma_smem_bytes(d, p.stages), stream, o.entry_pdl)
            .launch(tma_kernel(dt, d, p.group <= 8 ? 1 : 2, p.copy_mode), p, *maps);
    int smem = 0;
    const kv_kind kv = kv_of(plan->problem);
    const decode_fn f = register_kernel(kernel_for(plan->group, kv, p.stride_page), dt, d, &smem, kv);
    return launch_cfg(grid, smem, stream, o.entry_pdl).launch(f, p);
}

// A graph-stable plan (the work queue): the grids are the plan's capacities and the counts are read from
// the workspace, so the launches are the same for every step of the same capacities.
cudaError_t run_graph_stable(const pkv_plan *plan, const decode_params &base, const merge_params &mbase,
                             const char *ws_dev, cudaStream_t stream, const pkv_cuda_launch_opts &o,
                             const tma_maps *maps) {
    const int32_t *counts = reinterpret_cast<const int32_t *>(ws_dev + plan->off_counts);
    decode_params p = base;
    p.rect = 0;
    p.tasks = reinterpret_cast<const pkv_task *>(ws_dev + plan->off_tasks);
    p.task_count = counts;
    p.graph_first = o.graph_first;
    p.claim = const_cast<int32_t *>(counts);
    p.claim_sms = o.claim_sms;
    p.claim_mul = o.claim_mul;
    // a grid of at least every resident slot: on an idle GPU each SM gets a CTA per slot at the launch, and
    // no SM is dealt more tasks (ceil(n / SMs)) than it has slots
    p.claim_max = plan->graph_tasks >= plan->slots ? (int32_t)plan->slots : 0;
    const cudaError_t e = launch_tasks(plan, p, dim3((unsigned)plan->graph_tasks), stream, o, maps);
    if (e != cudaSuccess) return e;
    merge_params m = mbase;
    m.merges = reinterpret_cast<const pkv_merge *>(ws_dev + plan->off_merges);
    m.merge_count = counts + PKV_COUNTS_MERGES;
    m.claim = p.claim;
    m.claim_sms = p.claim_sms;
    // the per-head merge kernel's grid whatever the step's widest merge; its first CTAs merge a narrow step
    // one merge each, the choice a plain plan makes at launch (merge=head: per head; merge=row: per merge)
    m.graph_adapt = o.merge_kernel == PKV_TUNING_MERGE_AUTO;
    return launch_merge(plan, m, plan->graph_merges, stream, o.use_pdl, o.merge_kernel != PKV_TUNING_MERGE_ROW);
}

// Every phase of a plan: its decode launch (a rectangular grid of rows x KV heads x splits, or a work queue
// of tasks, fused or not), then its merge launch unless the decode merges itself (fused route).
cudaError_t run_phases(const pkv_plan *plan, const decode_params &base, const merge_params &mbase,
                       const char *ws_dev, cudaStream_t stream, const pkv_cuda_launch_opts &o, const tma_maps *maps) {
    if (plan->graph_tasks > 0) return run_graph_stable(plan, base, mbase, ws_dev, stream, o, maps);
    for (int32_t k = 0; k < plan->num_phases; k++) {
        const pkv_phase &ph = plan->phases[k];
        const bool fused = plan->route == PKV_ROUTE_FUSED;
        if (ph.task_end > ph.task_begin || (fused && ph.merge_end > ph.merge_begin)) {
            decode_params p = base;
            dim3 grid;
            if (plan->route == PKV_ROUTE_WORKQUEUE || plan->route == PKV_ROUTE_FUSED) {
                p.rect = 0;
                p.tasks = reinterpret_cast<const pkv_task *>(ws_dev + plan->off_tasks) + ph.task_begin;
                grid = dim3((unsigned)(ph.task_end - ph.task_begin));
                if (plan->route == PKV_ROUTE_FUSED) {
                    int32_t split_merges = 0;
                    while (ph.merge_begin + split_merges < ph.merge_end &&
                           plan->merges[ph.merge_begin + split_merges].count > 0)
                        split_merges++;
                    p.fused = 1;
                    p.num_tasks = ph.task_end - ph.task_begin;
                    p.num_split_merges = split_merges;
                    p.merges = reinterpret_cast<const pkv_merge *>(ws_dev + plan->off_merges) + ph.merge_begin;
                    p.counters = reinterpret_cast<int32_t *>(const_cast<char *>(ws_dev) + plan->off_counters) +
                                 ph.merge_begin;
                    grid = dim3((unsigned)(p.num_tasks + (ph.merge_end - ph.merge_begin - split_merges)));
                }
            } else {
                p.rect = 1;
                p.rows = reinterpret_cast<const pkv_row_sched *>(ws_dev + plan->off_rows) + ph.row_begin;
                // one row (single requests, a bucket of one): its schedule travels in the parameters,
                // so a CTA's first reads are its page ids and q instead of a read of the schedule
                p.one_row = ph.row_end - ph.row_begin == 1;
                if (p.one_row) p.row0 = plan->rows[ph.row_begin];
                grid = dim3((unsigned)(ph.row_end - ph.row_begin), (unsigned)plan->problem.num_kv_heads,
                            (unsigned)ph.grid_splits);
            }
            const cudaError_t e = launch_tasks(plan, p, grid, stream, o, maps);
            if (e != cudaSuccess) return e;
        }
        if (!fused && ph.merge_end > ph.merge_begin) {
            merge_params m = mbase;
            m.merges = reinterpret_cast<const pkv_merge *>(ws_dev + plan->off_merges) + ph.merge_begin;
            const cudaError_t e = launch_merge(plan, m, ph.merge_end - ph.merge_begin, stream,
                                               o.use_pdl && ph.task_end > ph.task_begin, merge_per_head(plan, o));
            if (e != cudaSuccess) return e;
        }
    }
    return cudaSuccess;
}

} // namespace

cudaError_t decode_init_attributes(int cc_major, size_t smem_optin, int32_t tma_stages[PKV_TMA_HEAD_DIMS][2],
                                   int32_t tma_max_stages[PKV_TMA_HEAD_DIMS], int *sm90_code) {
    for (int k = 0; k < PKV_TMA_HEAD_DIMS; k++) tma_stages[k][0] = tma_stages[k][1] = tma_max_stages[k] = 0;
    *sm90_code = 0;
    cudaError_t e = register_set_attrs();
    // The kernels that run here were compiled for a virtual architecture of at least 9.0 only where the
    // build had sm_90 code (or PTX) for this device: a build of compute_80 PTX alone is JIT-compiled on an
    // sm_90 GPU with the ring kernel's body and the PDL instructions compiled out, so there the register
    // kernels run and the merge launches without PDL, as on sm_80-89.
    cudaFuncAttributes fa;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, tma_kernel(PKV_DTYPE_FP16, 128, 1, kCopyTile));
    if (e == cudaSuccess) // (a PTX version of 0: no record of one, SASS built for this device)
        *sm90_code = cc_major >= 9 && fa.binaryVersion >= 90 && (fa.ptxVersion >= 90 || fa.ptxVersion == 0);
    const int tma_cc = *sm90_code ? cc_major : 8;
    for (int k = 0; k < PKV_TMA_HEAD_DIMS && e == cudaSuccess; k++)
        e = tma_setup(kHeadDims[k], tma_cc, smem_optin, tma_stages[k], &tma_max_stages[k]);
    if (e == cudaSuccess && !g_encode_tiled) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            g_encode_tiled = reinterpret_cast<encode_tiled_fn>(fn);
        else
            cudaGetLastError(); // no encoder: the shapes that need tensor maps run the register kernel
    }
#ifdef PKV_TIMELINE
    if (e == cudaSuccess && !timeline_init()) e = cudaErrorMemoryAllocation;
#endif
    return e;
}

int decode_resident_ctas(int32_t group, int32_t head_dim) { return register_resident(kernel_for(group), head_dim); }

cudaError_t decode_run(const pkv_plan *plan, void *workspace, const pkv_tensors *t, cudaStream_t stream,
                       const pkv_cuda_launch_opts *opts) {
    const pkv_problem &pr = plan->problem;
    if (pr.head_dim != 64 && pr.head_dim != 128 && pr.head_dim != 256) return cudaErrorInvalidValue;
    const pkv_kv_strides st = pkv_kv_strides_run(&pr, t);
    char *ws = static_cast<char *>(workspace);
    decode_params p = {};
    p.q = t->q;
    p.k = t->k_cache;
    p.v = t->v_cache;
    p.page_indices = t->kv_page_indices;
    p.o = t->o;
    p.q_stride = pkv_row_stride(&pr, t->q_row_stride);
    p.o_stride = pkv_row_stride(&pr, t->o_row_stride);
    p.lse = t->lse;
    p.state_o = reinterpret_cast<float *>(ws + plan->off_state_o);
    p.state_ml = reinterpret_cast<float *>(ws + plan->off_state_ml);
    p.stride_page = st.page;
    p.stride_head = st.head;
    p.stride_tok = st.token;
    p.k_scale = pkv_scale_or_one(t->k_scale);
    p.v_scale = pkv_scale_or_one(t->v_scale);
    p.k_scales = t->k_head_scales;
    p.v_scales = t->v_head_scales;
    const float sm_scale = pkv_problem_scale(&pr), cap = pr.logits_soft_cap;
    p.scale_log2 = sm_scale * kLog2e;
    // a cap so large that sm_scale / c is below the normal floats (or c log2(e) overflows) is the
    // uncapped score to float precision (c tanh(x / c) = x - x^3 / 3c^2 ...): run uncapped; a tiny one's
    // sm_scale / c is clamped, not infinite (0 x inf)
    if (cap > 0.0f && isfinite(cap * kLog2e) && sm_scale / cap >= FLT_MIN) {
        p.cap_log2 = fmaxf(cap * kLog2e, FLT_MIN); // normal: > 0 under ftz too
        p.cap_scale = fminf(sm_scale / cap, 3.0e38f);
    }
    p.num_qo_heads = pr.num_qo_heads;
    p.group = plan->group;
    p.page_size = pr.page_size;
    p.page_shift = (pr.page_size & (pr.page_size - 1)) == 0 ? __builtin_ctz((unsigned)pr.page_size) : -1;
    merge_params m = {};
    m.state_o = p.state_o;
    m.state_ml = p.state_ml;
    m.o = t->o;
    m.o_stride = p.o_stride;
    m.lse = t->lse;
    m.num_qo_heads = pr.num_qo_heads;
    m.group = plan->group;
    m.wide_at = opts->merge_wide_at;
#ifdef PKV_TIMELINE
    p.timeline = m.timeline = timeline_device();
#endif
    p.num_pages = pr.num_pages < INT32_MAX ? (int32_t)pr.num_pages : INT32_MAX;
    tma_maps maps = {};
    const tma_maps *mp = tma_maps_for(plan, t, st, *opts, &maps, &p.stages, &p.copy_mode) ? &maps : nullptr;
    if (opts->fault) {
        const cudaError_t e = check_pages_launch(plan, ws, t->kv_page_indices, stream, opts->fault);
        if (e != cudaSuccess) return e;
    }
    return run_phases(plan, p, m, ws, stream, *opts, mp);
}

// The decode kernel a run of the plan launches with these tensors (the same choice as decode_run): a static
// name, for the tests and the benchmark's records.
const char *decode_kernel_name(const pkv_plan *plan, const pkv_tensors *t, const pkv_cuda_launch_opts *opts) {
    const pkv_problem &pr = plan->problem;
    tma_maps maps;
    int32_t stages = 0, mode = 0;
    const pkv_kv_strides st = pkv_kv_strides_run(&pr, t);
    if (tma_maps_for(plan, t, st, *opts, &maps, &stages, &mode)) {
        if (mode == kCopyAsync) return "cp.async copies (into tiles)";
        static_assert(kChunkTokens == 8, "the chunked mode's name");
        if (mode == kCopyChunks) return "tensor copies in chunks of 8";
        return "tensor copies";
    }
    const bool n = kernel_for(plan->group, kv_of(pr), st.page) == kHeadsInN;
    if (kv_of(pr) != kKvSame) return n ? "registers, heads in N, fp8 cache" : "registers, heads in M, fp8 cache";
    return n ? "registers, heads in N" : "registers, heads in M";
}

} // namespace pkv
