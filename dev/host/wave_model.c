/* wave_model.c - the cost model's predicted mean step time of the work queue at 2, 3 and 4 tasks
 * per SM (--ctas-per-unit) on the rows of dev/probes/06_wave_on_ragged_traces.sh, beside the times that sweep measured
 * (bench/results/probes/h200_sweep_wave.txt): does the model rank the wave sizes as the GPU does?
 * Host plans for 132 SMs with the device's resident CTAs per SM (3 at d = 128, 4 at d = 64) as the
 * slots term, seed 20260623, steps 0..15.
 *   cc -O2 -I include dev/host/wave_model.c -o wave_model -L build -lpersistentkv -lm -Wl,-rpath,build
 *   ./wave_model bench/results/h200.policy */
#include "dev_plan.h"
#include "persistentkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct spec {
    const char *shape, *family;
    int B, hq, hkv, d;
    pkv_dtype dt;
    int resident;
} spec;

int main(int argc, char **argv) {
    pkv_cost_model m;
    if (argc < 2 || pkv_cost_model_load(argv[1], &m) != PKV_OK) {
        fprintf(stderr, "usage: wave_model POLICY\n");
        return 2;
    }
    static const spec specs[] = {
        {"paper", "bimodal", 8, 32, 8, 128, PKV_DTYPE_FP16, 3},  {"paper", "zipf", 8, 32, 8, 128, PKV_DTYPE_FP16, 3},
        {"paper", "uniform", 8, 32, 8, 128, PKV_DTYPE_FP16, 3},  {"paper", "bucketed", 8, 32, 8, 128, PKV_DTYPE_FP16, 3},
        {"paper", "bimodal", 4, 32, 8, 128, PKV_DTYPE_FP16, 3},  {"paper", "zipf", 16, 32, 8, 128, PKV_DTYPE_FP16, 3},
        {"d64", "bimodal", 32, 14, 2, 64, PKV_DTYPE_BF16, 4},    {"d64", "bimodal", 8, 14, 2, 64, PKV_DTYPE_BF16, 4},
        {"g8", "bimodal", 8, 64, 8, 128, PKV_DTYPE_FP16, 3},
    };
    pkv_plan *plan = NULL;
    if (pkv_plan_create(&plan) != PKV_OK) return 1;
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        const spec *sp = &specs[si];
        pkv_problem p;
        pkv_problem_default(&p);
        p.num_qo_heads = sp->hq, p.num_kv_heads = sp->hkv, p.head_dim = sp->d, p.dtype = sp->dt;
        p.num_pages = 1 << 30;
        pkv_trace_family f;
        pkv_trace_config c;
        pkv_trace *t = NULL;
        if (pkv_trace_family_parse(sp->family, &f) != PKV_OK) return 1;
        pkv_trace_config_default(&c, f);
        c.seed = 20260623;
        c.max_active = sp->B;
        c.num_requests = 3 * sp->B;
        if (pkv_trace_generate(&c, &t) != PKV_OK) return 1;
        printf("%-6s %-9s B%-3d", sp->shape, sp->family, sp->B);
        for (int cpu = 2; cpu <= 4; cpu++) {
            double sum = 0;
            int n = 0;
            for (int s = 0; s < 16 && s < pkv_trace_num_steps(t); s++) {
                const int got = dev_plan_trace_step(&p, t, s, PKV_ROUTE_WORKQUEUE, cpu, plan);
                if (got < 0) return 2;
                if (got == 0) continue;
                double terms[PKV_COST_TERMS];
                if (pkv_cost_terms(plan, terms) != PKV_OK) return 2;
                terms[PKV_TERM_SLOTS] = 132.0 * sp->resident; /* the device's residency, not the host plan's 2 */
                sum += pkv_cost_predict(&m, terms), n++;
            }
            printf("  cpu=%d %7.1f", cpu, n ? sum / n : 0.0);
        }
        printf("  (predicted mean us)\n");
        pkv_trace_free(t);
    }
    pkv_plan_free(plan);
    return 0;
}
