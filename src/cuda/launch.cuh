// launch.cuh - the launcher's entry points (launch.cu), behind the C entry points of cuda_backend.cu
// (pkv_cuda.h says what each does).
#pragma once

#include "pkv_cuda.h"

namespace pkv {

cudaError_t decode_init_attributes(int cc_major, size_t smem_optin, int32_t tma_stages[PKV_TMA_HEAD_DIMS][2],
                                   int32_t tma_max_stages[PKV_TMA_HEAD_DIMS], int *sm90_code);
int decode_resident_ctas(int32_t group, int32_t head_dim);
cudaError_t decode_run(const pkv_plan *plan, void *workspace, const pkv_tensors *t, cudaStream_t stream,
                       const pkv_cuda_launch_opts *opts);
// Bounds mode: checks every page id the plan's tasks read against the pool, trapping on one outside it
// (check_pages.cu); queued on the stream before the decode launches.
cudaError_t check_pages_launch(const pkv_plan *plan, const char *ws_dev, const int32_t *page_indices,
                               cudaStream_t stream, int32_t *fault);
const char *decode_kernel_name(const pkv_plan *plan, const pkv_tensors *t, const pkv_cuda_launch_opts *opts);

} // namespace pkv
