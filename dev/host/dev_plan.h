/* dev_plan.h - shared by the dev/ tools: a trace step planned on the host as the H200 would plan it. */
#ifndef PKV_DEV_PLAN_H
#define PKV_DEV_PLAN_H

#include "persistentkv.h"

#include <stdlib.h>

/* Plans step s of t with `route` for 132 SMs (host plan; the page table's indptr from the lengths,
 * no page ids); ctas_per_unit <= 0: the planner's wave.  1: planned, 0: an empty step, -1: error. */
static int dev_plan_trace_step(const pkv_problem *p, const pkv_trace *t, int32_t s, pkv_route route,
                               int32_t ctas_per_unit, pkv_plan *plan) {
    const int32_t *ids, *lens;
    const int32_t B = pkv_trace_step(t, s, &ids, &lens);
    if (B <= 0) return 0;
    int32_t *indptr = (int32_t *)malloc((size_t)(B + 1) * sizeof(int32_t));
    if (!indptr) return -1;
    indptr[0] = 0;
    for (int i = 0; i < B; i++) indptr[i + 1] = indptr[i] + (lens[i] + p->page_size - 1) / p->page_size;
    pkv_page_table tab = {B, indptr, NULL, lens};
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.parallelism = 132;
    o.ctas_per_unit = ctas_per_unit;
    o.route = route;
    const pkv_status st = pkv_plan_step_host(p, &tab, &o, plan);
    free(indptr);
    return st == PKV_OK ? 1 : -1;
}

#endif
