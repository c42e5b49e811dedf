// check_pages.cu - bounds mode (pkv_context_config.check_pages): before a run's decode launches, one kernel
// reads every page id the plan's tasks will read - pages tok_begin / page_size .. (tok_end - 1) / page_size
// of each task's row, the ids every decode kernel looks up - and traps on the first outside [0, num_pages),
// its (row, KV head, page of the row, id) recorded through the fault record's mapped host address so the host
// can report it after the trap.  The decode kernels stay as they are: off costs nothing (no launch, no
// register or instruction in them), on costs one small launch that reads the page table.
#include "cuda_common.cuh"
#include "launch.cuh"

#include <stdio.h> // printf of the fault

namespace pkv {

namespace {

constexpr int kCheckThreads = 128;
constexpr unsigned kCheckMaxCtas = 1024;

__device__ __noinline__ void page_fault(int32_t *fault, const pkv_task &t, int32_t page, int32_t id) {
    volatile int32_t *f = fault;
    if (atomicCAS(fault + PKV_FAULT_STATE, 0, 1) == 0) {
        f[PKV_FAULT_ROW] = t.row;
        f[PKV_FAULT_HEAD] = t.kv_head;
        f[PKV_FAULT_PAGE] = page;
        f[PKV_FAULT_ID] = id;
        __threadfence_system();
        f[PKV_FAULT_STATE] = 2;
        __threadfence_system();
        printf("persistentkv: page id %d (row %d, KV head %d, page %d of the row) is outside the pool\n", id,
               t.row, t.kv_head, page);
    } else {
        while (f[PKV_FAULT_STATE] != 2) {} // the first fault's record is out before anyone traps
    }
    __trap();
}

// A CTA per task (grid-stride): its threads read the task's page ids.  task_count: a graph-stable plan's
// count in the workspace (NULL: num_tasks).
__global__ void __launch_bounds__(kCheckThreads)
check_pages_kernel(const pkv_task *tasks, int32_t num_tasks, const int32_t *task_count, const int32_t *page_indices,
                   int32_t page_size, int32_t num_pages, int32_t *fault) {
    const int32_t n = task_count ? *task_count : num_tasks;
    for (int32_t k = blockIdx.x; k < n; k += gridDim.x) {
        const pkv_task t = tasks[k];
        if (t.tok_end <= t.tok_begin) continue;
        const int32_t first = t.tok_begin / page_size, last = (t.tok_end - 1) / page_size;
        for (int32_t j = first + (int32_t)threadIdx.x; j <= last; j += kCheckThreads) {
            const int32_t id = page_indices[t.page_base + j];
            if ((uint32_t)id >= (uint32_t)num_pages) page_fault(fault, t, j, id);
        }
    }
}

} // namespace

cudaError_t check_pages_launch(const pkv_plan *plan, const char *ws_dev, const int32_t *page_indices,
                               cudaStream_t stream, int32_t *fault) {
    const bool graph = plan->graph_tasks > 0;
    const int32_t cap = graph ? plan->graph_tasks : plan->num_tasks;
    if (cap <= 0) return cudaSuccess;
    const unsigned grid = (unsigned)cap < kCheckMaxCtas ? (unsigned)cap : kCheckMaxCtas;
    const pkv_problem &pr = plan->problem;
    const int32_t num_pages = pr.num_pages < INT32_MAX ? (int32_t)pr.num_pages : INT32_MAX;
    check_pages_kernel<<<grid, kCheckThreads, 0, stream>>>(
        reinterpret_cast<const pkv_task *>(ws_dev + plan->off_tasks), plan->num_tasks,
        graph ? reinterpret_cast<const int32_t *>(ws_dev + plan->off_counts) + PKV_COUNTS_TASKS : nullptr,
        page_indices, pr.page_size, num_pages, fault);
    return cudaGetLastError();
}

} // namespace pkv
