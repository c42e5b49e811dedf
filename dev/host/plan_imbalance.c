/* plan_imbalance.c - the longest task over the mean task of the work queue's plans for 132 SMs on
 * held-out trace steps (seed 20260623, every 4th step): in a one-wave plan the longest chunk sets
 * the step.  Host plans (2 resident CTAs per SM).
 *   cc -O2 -I include dev/host/plan_imbalance.c -o plan_imbalance -L build -lpersistentkv -Wl,-rpath,build */
#include "dev_plan.h"
#include "persistentkv.h"

#include <stdio.h>
#include <stdlib.h>

int main(void) {
    static const char *const fams[] = {"uniform", "bimodal", "zipf", "bucketed"};
    static const int Bs[] = {4, 8, 16, 32};
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_pages = 1 << 30;
    pkv_plan *plan = NULL;
    if (pkv_plan_create(&plan) != PKV_OK) return 1;
    for (int fi = 0; fi < 4; fi++)
        for (int bi = 0; bi < 4; bi++) {
            pkv_trace_family f;
            pkv_trace_config c;
            pkv_trace *t = NULL;
            if (pkv_trace_family_parse(fams[fi], &f) != PKV_OK) return 1;
            pkv_trace_config_default(&c, f);
            c.seed = 20260623;
            c.max_active = Bs[bi];
            c.num_requests = 3 * Bs[bi];
            if (pkv_trace_generate(&c, &t) != PKV_OK) return 1;
            double sum_ratio = 0;
            int n = 0;
            for (int s = 0; s < pkv_trace_num_steps(t); s += 4) {
                const int got = dev_plan_trace_step(&p, t, s, PKV_ROUTE_WORKQUEUE, 0, plan);
                if (got < 0) return 2;
                if (got == 0) continue;
                const pkv_task *tk = pkv_plan_tasks(plan);
                const int nt = pkv_plan_num_tasks(plan);
                double mx = 0, tot = 0;
                for (int k = 0; k < nt; k++) {
                    const double l = tk[k].tok_end - tk[k].tok_begin;
                    tot += l;
                    mx = l > mx ? l : mx;
                }
                if (nt > 0) sum_ratio += mx / (tot / nt), n++;
            }
            printf("%-8s B%-3d work-queue tasks: longest / mean %.2f (mean over %d steps)\n", fams[fi], Bs[bi],
                   n ? sum_ratio / n : 0.0, n);
            pkv_trace_free(t);
        }
    pkv_plan_free(plan);
    return 0;
}
