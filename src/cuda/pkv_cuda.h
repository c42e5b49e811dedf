/* pkv_cuda.h - entry points between the CUDA backend's host glue and its kernels. */
#ifndef PKV_CUDA_H
#define PKV_CUDA_H

#include <cuda_runtime.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Raises the dynamic shared-memory limit of every decode kernel instance (once per device). */
cudaError_t pkv_cuda_decode_init_attributes(void);
/* Launches every phase of an uploaded plan on the stream (attention, then merge with PDL);
 * allow_n8: the heads-in-N kernel for G <= 8 and d <= 128 (else heads in M everywhere);
 * deep_max_ctas: heads-in-N grids of at most this many CTAs run the two-tiles-in-flight variant. */
cudaError_t pkv_cuda_decode_run(const pkv_plan *plan, void *workspace, const pkv_tensors *t, cudaStream_t stream,
                                int use_pdl, int allow_n8, int32_t deep_max_ctas);
/* CTAs of the kernel that runs (group, head_dim) resident per SM (fp16; 0 on error). */
int pkv_cuda_decode_resident_ctas(int32_t group, int32_t head_dim, int allow_n8);

#ifdef __cplusplus
}
#endif

#endif
