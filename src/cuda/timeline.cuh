// timeline.cuh - per-CTA timelines, dev builds only (cmake -DPKV_TIMELINE=ON, PKV_TUNING=timeline_out=FILE;
// dev/probes/05_b1_timeline.sh): thread 0 of every CTA records its SM and %globaltimer at its entry and exit, per
// kernel kind (0 decode, 1 merge), and two points inside (PKV_TL_MARK); the last launch of each kind wins.
// The records live in one device buffer (timeline.cu) whose address travels in the kernels' parameters:
// each .cu file is a device module of its own, so a __device__ array would be one copy per file.  In other
// builds the macros are empty and the parameters have no such field.
#pragma once

#include <stdint.h>

namespace pkv {

#ifdef PKV_TIMELINE
constexpr int kTimelineCap = 32768; // CTAs recorded per kernel kind
struct timeline_buf {
    unsigned long long rec[2][kTimelineCap][3];  // [kind][cta]: start ns, end ns, SM
    unsigned long long mark[2][kTimelineCap][2]; // [kind][cta]: two points inside the CTA (0: unset)
    unsigned int count[2];                       // [kind]: CTAs of the last launch
};

__device__ __forceinline__ unsigned long long tl_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
struct tl_scope {
    timeline_buf *tl;
    int kind;
    unsigned int cta;
    unsigned long long t0;
    __device__ tl_scope(timeline_buf *buf, int k) : tl(buf), kind(k) {
        cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        t0 = threadIdx.x == 0 ? tl_now() : 0;
    }
    __device__ ~tl_scope() {
        if (!tl || threadIdx.x != 0 || cta >= (unsigned)kTimelineCap) return;
        unsigned int smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        tl->rec[kind][cta][0] = t0;
        tl->rec[kind][cta][1] = tl_now();
        tl->rec[kind][cta][2] = smid;
        if (cta == 0) tl->count[kind] = gridDim.x * gridDim.y * gridDim.z;
    }
};
#define PKV_TL_SCOPE(kind, buf) tl_scope tl_scope_((buf), (kind))
// thread 0 records %globaltimer as point k of its CTA (decode: the tile loop done, the arrival; merge: the
// dependency wait returned, the states combined)
#define PKV_TL_MARK(kind, k, buf)                                                                             \
    do {                                                                                                      \
        const unsigned int c_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);               \
        if ((buf) && threadIdx.x == 0 && c_ < (unsigned)kTimelineCap) (buf)->mark[kind][c_][k] = tl_now();    \
    } while (0)

// The device buffer (allocated by timeline_init on the current device; NULL before or if that failed).
timeline_buf *timeline_device();
// Allocates it once per process (context creation); false when the allocation fails.
bool timeline_init();
// Writes the last decode and merge launches' records as CSV to path (context teardown); 0 on success.
int timeline_dump(const char *path);
#else
#define PKV_TL_SCOPE(kind, buf) \
    do {                        \
    } while (0)
#define PKV_TL_MARK(kind, k, buf) \
    do {                          \
    } while (0)
#endif

} // namespace pkv
