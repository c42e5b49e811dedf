// claim.cuh - the graph-stable plans' work claim.  A graph-stable plan launches fixed grids (so that one
// captured CUDA graph replays every step); the step's task count is read from the workspace, and a CTA finds
// its task by the rules in task.cuh: steps of at most one task per SM run in the grid's first CTAs, steps
// of up to a resident wave claim their tasks by the SM each CTA lands on (claim_task, below), larger ones
// spread over the grid.  The merge kernel's first CTA resets the claim's words for the next launch
// (claim_reset).
#pragma once

#include "decode_common.cuh"

namespace pkv {

// A graph-stable CTA's candidate task entry and the step's task count, as volatile loads so that both
// are issued before either is used (a plain load of the entry, used only past the count's test, may be
// moved after it, making the two round trips dependent again).  The entry is plan data, read-only
// while a grid runs; the count shares its array with the claim words, so it is an ordinary load.
__device__ __forceinline__ pkv_task ld_task(const pkv_task *t) {
    const int32_t *w = reinterpret_cast<const int32_t *>(t);
    int32_t v[7];
#pragma unroll
    for (int i = 0; i < 7; i++) asm volatile("ld.global.s32 %0, [%1];" : "=r"(v[i]) : "l"(w + i));
    return pkv_task{v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
}

__device__ __forceinline__ int32_t ld_count(const int32_t *c) {
    int32_t v;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(c));
    return v;
}

// ---- graph-stable plans: tasks claimed by SM ---------------------------------------------------------
// A graph-stable grid holds more CTAs than most steps have tasks, and the block scheduler, free to
// place the surplus CTAs anywhere, gave 8-12 SMs three of a one-wave step's tasks where a plain grid
// gives each SM one or two (docs/kernel-notes.md v13).  So when the step's n tasks are more than one
// per SM and fit one resident wave, a CTA takes its task by the SM it landed on: the k-th CTA to arrive
// on SM s (a counter per SM) runs task k x nsm + r(s) if that is below n, so SM s gets tasks r(s),
// r(s) + nsm, ... - as even as a plain grid.  r(s) = s x claim_mul mod nsm deals the tasks of a round
// to SMs far apart in %smid order (the host picks claim_mul as the inverse of a stride near nsm / 8),
// so that the SMs left with one task less are spread over the GPCs rather than all in the last one
// (docs/kernel-notes.md v13b).  A task can lose its CTA (an SM that got fewer CTAs than it was dealt
// tasks: other kernels on it, fewer SMs than nsm), so every CTA that claimed none while tasks were still
// unclaimed takes an arrival ticket, and those among the grid's last n arrivals wait until every task is
// claimed (then exit) or every CTA has arrived: then the SM counts are final, each of them lists the
// same unclaimed tasks in (SM, k) order and runs the one a shared cursor hands it.  The last n arrivals
// hold at least as many CTAs without a task as there are unclaimed tasks, and fewer than n <= the
// resident slots wait, so a slot is always free for the CTAs still to come.  On a GPU with nothing else
// running every SM gets its CTAs at the launch and every task is claimed within one round trip; CTAs
// that find every task claimed leave at once.  The words are read after the dependency wait (the
// previous launch on this workspace has completed) and zeroed by the merge kernel once this grid has
// completed.
__device__ __forceinline__ bool claim_task(const decode_params &p, int32_t n, task_info &ti) {
    __shared__ pkv_task s_task;
    __shared__ int32_t s_state;
    __shared__ uint16_t s_miss[PKV_CLAIM_SMS]; // unclaimed tasks per SM (at most a resident wave, < 2^16)
    int32_t *w = p.claim;
    const int32_t nsm = p.claim_sms, grid = (int32_t)gridDim.x;
    auto rank = [&](uint32_t s) { return (int32_t)((uint64_t)s * (uint32_t)p.claim_mul % (uint32_t)nsm); };
    // %smid read once: a preempted CTA can resume on another SM, and the counter it takes and the task
    // it derives must name the same SM (a CTA that read it twice claimed one task twice and left one
    // unclaimed under time-sliced processes, kernel-notes v13b; reading it once only costs balance there)
    const uint32_t sm = sm_id();
    const bool dealt = sm < (uint32_t)nsm;
    const int32_t r = dealt ? rank(sm) : 0;
    // thread 0: the SM's first two tasks, read before the dependency wait (the plan's, uploaded before)
    pkv_task c0 = {}, c1 = {};
    if (threadIdx.x == 0 && dealt) {
        if (r < n) c0 = p.tasks[r];
        if (r + nsm < n) c1 = p.tasks[r + nsm];
    }
    pdl_launch_dependents();
    pdl_wait();
    if (threadIdx.x == 0) {
        int32_t state = -1; // >= 0: the claimed task; -1: nothing to run; -2: wait for unclaimed tasks
        const int32_t claimed = __ldcg(w + PKV_COUNTS_CLAIMED);
        const int32_t k = dealt ? atomicAdd(w + PKV_COUNTS_SM + sm, 1) : INT32_MAX;
        const int64_t task = (int64_t)k * nsm + r;
        if (task < n) {
            s_task = k == 0 ? c0 : k == 1 ? c1 : p.tasks[task];
            __threadfence(); // the SM's count before the claim and the ticket
            atomicAdd(w + PKV_COUNTS_CLAIMED, 1);
            atomicAdd(w + PKV_COUNTS_ARRIVED, 1);
            state = (int32_t)task;
        } else if (claimed < n) {
            __threadfence();
            if (atomicAdd(w + PKV_COUNTS_ARRIVED, 1) >= grid - n) {
                // one of the last n arrivals: every task claimed, or every CTA arrived (counts final)?
                const volatile int32_t *vc = w + PKV_COUNTS_CLAIMED, *va = w + PKV_COUNTS_ARRIVED;
                while (*vc < n && *va < grid) __nanosleep(256);
                if (*vc < n) state = -2;
            }
        }
        s_state = state;
    }
    __syncthreads();
    const int32_t state = s_state;
    if (state >= 0) {
        task_of(s_task, ti);
        return true;
    }
    if (state == -1) return false;
    // every CTA has arrived: the unclaimed tasks in (SM, k) order, the same list in every waiting CTA
    __threadfence();
    auto want = [&](int32_t s) { return rank(s) < n ? (n - 1 - rank(s)) / nsm + 1 : 0; }; // tasks r(s) + k nsm < n
    for (int32_t s = threadIdx.x; s < nsm; s += kThreads) {
        const int32_t got = __ldcg(w + PKV_COUNTS_SM + s);
        s_miss[s] = (uint16_t)(want(s) > got ? want(s) - got : 0);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t o = atomicAdd(w + PKV_COUNTS_CURSOR, 1), task = -1;
        for (int32_t s = 0; s < nsm && task < 0; s++) {
            if (o < s_miss[s]) task = (want(s) - s_miss[s] + o) * nsm + rank(s);
            else o -= s_miss[s];
        }
        if (task >= 0) s_task = p.tasks[task];
        s_state = task;
    }
    __syncthreads();
    if (s_state < 0) return false;
    task_of(s_task, ti);
    return true;
}

// Reads the CTA's task.  false: nothing to compute (an empty split, which exits before reading any

// Graph-stable plans whose decode claims tasks by SM (decode_params.claim): the merge kernel's first
// CTA, once the decode grid has completed, sets the claim's words back to zero for the next launch (not
// the counts), before anything that could make it exit.
__device__ __forceinline__ void claim_reset(int32_t *w, int32_t nsm) {
    if (!w || blockIdx.x != 0) return;
    pdl_wait();
    for (int32_t i = PKV_COUNTS_CLAIMED + (int32_t)threadIdx.x; i < PKV_COUNTS_SM + nsm; i += (int32_t)blockDim.x)
        if (i <= PKV_COUNTS_CURSOR || i >= PKV_COUNTS_SM) w[i] = 0; // the step's counts and widest merge stay
}

} // namespace pkv
