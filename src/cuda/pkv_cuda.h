/* pkv_cuda.h - entry points between the CUDA backend's host glue and its kernels. */
#ifndef PKV_CUDA_H
#define PKV_CUDA_H

#include <cuda_runtime.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Head dims of the tensor-copy kernel (d = 64, 128, 256: index 0, 1, 2). */
#define PKV_TMA_HEAD_DIMS 3
/* Raises the dynamic shared-memory limit of every decode kernel instance on the current device (compute
 * capability cc_major, opt-in shared memory per block smem_optin bytes) and writes the tensor-copy
 * kernel's default stages per warp there, per head dim for G <= 8 and G 9..16 (0: the register kernel
 * runs), and the most that fit per head dim, for the context's pkv_cuda_launch_opts.  *sm90_code: the
 * kernels that run on this device were compiled for sm_90 (tensor copies and PDL are in them); 0 on
 * older GPUs and where only older PTX was built (then both stay off). */
cudaError_t pkv_cuda_decode_init_attributes(int cc_major, size_t smem_optin,
                                            int32_t tma_stages[PKV_TMA_HEAD_DIMS][2],
                                            int32_t tma_max_stages[PKV_TMA_HEAD_DIMS], int *sm90_code);
/* How the kernels run (fixed per context, from the device and the PKV_* variables). */
typedef struct pkv_cuda_launch_opts {
    int use_pdl;           /* programmatic dependent launch of the merge kernel (sm_90) */
    int entry_pdl;         /* and of the decode kernels: scheduled while the kernel before them drains (sm_90) */
    int allow_n8;          /* the heads-in-N kernel for G <= 8 (else heads in M everywhere) */
    int merge_kernel;      /* 0: by the merges' width; 1: a CTA per (merge, query head); 2: a CTA per merge */
    int32_t merge_wide_at; /* by the width: a CTA per head from this many dependent state-load batches per
                            * CTA per merge (decode.cu merge_wide; PKV_MERGE_WIDE_AT) */
    int32_t deep_max_ctas; /* heads-in-N grids of at most this many CTAs run the two-tiles-in-flight variant */
    int tma;               /* sm_90: K/V through shared memory by tensor copies where the shape allows (decode.cu) */
    int32_t tma_chunk_min; /* and for pages not a multiple of 16 tokens at d <= 128 in chunks of the largest power
                            * of two dividing the page size, when that is at least this many tokens (8; 0: never) */
    int cp_async;          /* and for the other such pages by cp.async copies from every lane (PKV_DECODE_CPASYNC), */
    int32_t cp_async_min_ctas; /* into token-major rows on grids of at least this many CTAs (smaller ones: the
                                * register kernels); into whole-tile boxes on every grid */
    int cp_async_tiles;    /* those copies fill the boxes of whole-tile copies (default), else token-major rows,
                            * d <= 128 only (PKV_CPASYNC_LAYOUT=rows) */
    int32_t tma_stages;    /* the tensor-copy kernel's stages per warp; 0: the default (PKV_TMA_STAGES) */
    int32_t tma_default_stages[PKV_TMA_HEAD_DIMS][2]; /* that default per head dim, G <= 8 | 9..16; 0: registers */
    int32_t tma_max_stages[PKV_TMA_HEAD_DIMS];     /* the most stages that fit this device (PKV_TMA_STAGES clamped) */
    int32_t graph_first;   /* graph-stable plans: steps of at most this many tasks run them in the grid's first
                            * CTAs, more spread over the grid (PKV_GRAPH_SPREAD, PKV_GRAPH_FIRST) */
    int32_t claim_sms;     /* graph-stable plans: up to a resident wave of tasks claimed by SM over this many SMs
                            * (decode.cu; 0: off, PKV_GRAPH_CLAIM=0; PKV_GRAPH_CLAIM_SMS=N for tests) */
    int32_t claim_mul;     /* and the SMs' order in a round of tasks: r(s) = s x claim_mul mod claim_sms */
    int graph_merge_adapt; /* graph-stable plans: steps of narrow merges merge one CTA per merge, as a plain
                            * plan would (PKV_GRAPH_MERGE=head: one per head, whatever the step) */
} pkv_cuda_launch_opts;
/* Launches every phase of an uploaded plan on the stream (attention, then merge). */
cudaError_t pkv_cuda_decode_run(const pkv_plan *plan, void *workspace, const pkv_tensors *t, cudaStream_t stream,
                                const pkv_cuda_launch_opts *opts);
/* The name of the decode kernel a run of the plan launches with these tensors (static storage). */
const char *pkv_cuda_decode_kernel_name(const pkv_plan *plan, const pkv_tensors *t,
                                        const pkv_cuda_launch_opts *opts);
/* The same for a CUDA context (its launch options): PKV_ERR_UNSUPPORTED on another backend. */
pkv_status pkv_cuda_decode_kernel_of(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t,
                                     const char **name);
/* CTAs of the kernel that runs (group, head_dim) resident per SM (fp16; 0 on error). */
int pkv_cuda_decode_resident_ctas(int32_t group, int32_t head_dim, int allow_n8);
#ifdef PKV_TIMELINE
/* Dev builds: the per-CTA times of the last decode and merge launches as CSV (see decode.cu). */
int pkv_cuda_timeline_dump(const char *path);
#endif

#ifdef __cplusplus
}
#endif

#endif
