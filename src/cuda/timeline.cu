// timeline.cu - per-CTA timelines, host side (dev builds with cmake -DPKV_TIMELINE=ON; timeline.cuh): the
// device buffer the kernels record into and its dump as CSV when a context is freed (tuning timeline_out).
// Empty in other builds.
#include "timeline.cuh"

#ifdef PKV_TIMELINE
#include "cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>

namespace pkv {

static timeline_buf *g_timeline = nullptr; // one per process, on the device of the first context

timeline_buf *timeline_device() { return g_timeline; }

bool timeline_init() {
    if (g_timeline) return true;
    void *p = nullptr;
    if (cudaMalloc(&p, sizeof(timeline_buf)) != cudaSuccess || cudaMemset(p, 0, sizeof(timeline_buf)) != cudaSuccess) {
        if (p) cudaFree(p);
        cudaGetLastError();
        return false;
    }
    g_timeline = static_cast<timeline_buf *>(p);
    return true;
}

// Writes the recorded CTAs of the last decode and merge launches as CSV (kind, cta, sm, start_ns, end_ns,
// mark0_ns, mark1_ns: the PKV_TL_MARK points, 0 where none was recorded); 0 on success.
int timeline_dump(const char *path) {
    if (!g_timeline) return -1;
    timeline_buf *h = static_cast<timeline_buf *>(malloc(sizeof(timeline_buf)));
    if (!h) return -1;
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(h, g_timeline, sizeof(timeline_buf), cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h);
        return -1;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        free(h);
        return -1;
    }
    fprintf(f, "kind,cta,sm,start_ns,end_ns,mark0_ns,mark1_ns\n");
    for (int k = 0; k < 2; k++)
        for (unsigned int i = 0; i < h->count[k] && i < (unsigned)kTimelineCap; i++)
            fprintf(f, "%s,%u,%llu,%llu,%llu,%llu,%llu\n", k ? "merge" : "decode", i, h->rec[k][i][2], h->rec[k][i][0],
                    h->rec[k][i][1], h->mark[k][i][0], h->mark[k][i][1]);
    free(h);
    return fclose(f) == 0 ? 0 : -1;
}

} // namespace pkv
#endif
