/* pkv_cuda.h - entry points between the CUDA backend's host glue (cuda_backend.cu, which defines them) and
 * its kernels' launcher (launch.cu). */
#ifndef PKV_CUDA_H
#define PKV_CUDA_H

#include <cuda_runtime.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Head dims of the tensor-copy kernel (d = 64, 128, 256: index 0, 1, 2). */
#define PKV_TMA_HEAD_DIMS 3
/* Pages whose largest power-of-two divisor is this many tokens (8, 24, 40, ...) take a tensor copy per chunk
 * of that many tokens on sm_90 at d = 64/128; pages of fewer (1, 2, 4, 12, ...) are gathered row by row by
 * cp.async (the planner's row_gather_below): tensor copies of smaller chunks measured slower
 * (docs/kernel-notes.md v14, v15). */
#define PKV_TMA_CHUNK_TOKENS 8
/* Raises the dynamic shared-memory limit of every decode kernel instance on the current device (compute
 * capability cc_major, opt-in shared memory per block smem_optin bytes) and writes the tensor-copy
 * kernel's default stages per warp there, per head dim for G <= 8 and G 9..16 (0: the register kernel
 * runs), and the most that fit per head dim, for the context's pkv_cuda_launch_opts.  *sm90_code: the
 * kernels that run on this device were compiled for sm_90 (tensor copies and PDL are in them); 0 on
 * older GPUs and where only older PTX was built (then both stay off). */
cudaError_t pkv_cuda_decode_init_attributes(int cc_major, size_t smem_optin,
                                            int32_t tma_stages[PKV_TMA_HEAD_DIMS][2],
                                            int32_t tma_max_stages[PKV_TMA_HEAD_DIMS], int *sm90_code);
/* How the kernels run: fixed per context, from the device and the context's tuning (PKV_TUNING, tuning.c). */
typedef struct pkv_cuda_launch_opts {
    int use_pdl;           /* programmatic dependent launch of the merge kernel (sm_90; tuning pdl) */
    int entry_pdl;         /* and of the decode kernels: scheduled while the kernel before them drains (sm_90) */
    int merge_kernel;      /* pkv_tuning_merge: by the merges' width (auto), a CTA per (merge, query head), or
                            * a CTA per merge (tuning merge) */
    int32_t merge_wide_at; /* by the width: a CTA per head from this many dependent state-load batches per
                            * CTA per merge (merge.cuh merge_wide; tuning merge_wide_at) */
    int tma;               /* sm_90: K/V through shared memory (tensor copies, cp.async) where the shape allows
                            * (launch.cu tma_maps_for; tuning tma) */
    int32_t tma_stages;    /* the tensor-copy kernel's stages per warp; 0: the default (tuning tma_stages) */
    int32_t tma_default_stages[PKV_TMA_HEAD_DIMS][2]; /* that default per head dim, G <= 8 | 9..16; 0: registers */
    int32_t tma_max_stages[PKV_TMA_HEAD_DIMS];     /* the most stages that fit this device (tma_stages clamped) */
    int32_t graph_first;   /* graph-stable plans: steps of at most this many tasks (the device's SMs) run them
                            * in the grid's first CTAs; more are claimed by SM or spread over the grid */
    int32_t claim_sms;     /* graph-stable plans: up to a resident wave of tasks claimed by SM over this many SMs
                            * (claim.cuh; the device's, or tuning claim_sms for tests) */
    int32_t claim_mul;     /* and the SMs' order in a round of tasks: r(s) = s x claim_mul mod claim_sms */
    int32_t *fault;        /* bounds mode (pkv_context_config.check_pages): the fault record's device address;
                            * NULL: off */
} pkv_cuda_launch_opts;

/* Bounds mode's fault record, PKV_FAULT_WORDS int32: the state (0 none, 1 being written, 2 written) and the
 * first fault's row, KV head, place in the row's pages and page id. */
enum { PKV_FAULT_STATE, PKV_FAULT_ROW, PKV_FAULT_HEAD, PKV_FAULT_PAGE, PKV_FAULT_ID, PKV_FAULT_WORDS };
/* Launches every phase of an uploaded plan on the stream (attention, then merge). */
cudaError_t pkv_cuda_decode_run(const pkv_plan *plan, void *workspace, const pkv_tensors *t, cudaStream_t stream,
                                const pkv_cuda_launch_opts *opts);
/* The name of the decode kernel a run of the plan launches with these tensors (static storage). */
const char *pkv_cuda_decode_kernel_name(const pkv_plan *plan, const pkv_tensors *t,
                                        const pkv_cuda_launch_opts *opts);
/* The same for a CUDA context (its launch options): PKV_ERR_UNSUPPORTED on another backend. */
pkv_status pkv_cuda_decode_kernel_of(pkv_context *ctx, const pkv_plan *plan, const pkv_tensors *t,
                                     const char **name);
/* CTAs of the register kernel that runs (group, head_dim) resident per SM (fp16; 0 on error): heads in N
 * for G <= 8, heads in M for G 9..16. */
int pkv_cuda_decode_resident_ctas(int32_t group, int32_t head_dim);

/* The append and page-copy kernels (append.cu) on the current device: pkv_append_kv's and pkv_copy_pages's
 * arguments as checked by append.c; the CUDA backend's own checks (16-byte alignment) here. */
pkv_status pkv_cuda_append(pkv_context *ctx, const pkv_problem *p, int32_t batch_size, int32_t num_tokens,
                           const pkv_append_tensors *t, void *stream);
pkv_status pkv_cuda_copy_pages(pkv_context *ctx, const pkv_problem *p, const pkv_page_copy *copies, int32_t count,
                               void *k_cache, void *v_cache, int64_t page_stride, void *stream);

#ifdef __cplusplus
}
#endif

#endif
