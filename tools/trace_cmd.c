/* trace_cmd.c - `pkv trace`: generates a trace of a workloads.md family (or reads a trace file),
 * prints its summary and steps, and writes it as a trace file. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void usage(void) {
    printf("usage: pkv trace [options]\n"
           "  --family NAME      uniform, bimodal (default), zipf, bucketed, homogeneous\n"
           "  --seed S           (default 20260623, the first held-out seed)\n"
           "  --batch B          max_active rows per step (family default: 8, bucketed 1)\n"
           "  --requests N       requests (default: family's, or 3 x B when --batch is given)\n"
           "  --steps N          stop after N steps (default: the family's)\n"
           "  --page-size N      (default 16)\n"
           "  --holes F          fraction of unused pages in the pool (default 0)\n"
           "  --in PATH          read a trace file instead of generating\n"
           "  --out PATH         write the trace file\n"
           "  --show N           print the first N steps (default 8; 0 for none, -1 for all)\n");
}

int cmd_trace(int argc, char **argv) {
    static const char *const known[] = {"--family", "--seed", "--batch", "--requests", "--steps", "--page-size",
                                        "--holes", "--in", "--out", "--show", "--help!", NULL};
    if (cli_flag(argc, argv, "--help")) {
        usage();
        return 0;
    }
    if (!cli_check_options(argc, argv, known, "trace")) return 2;
    pkv_trace *t = NULL;
    const char *in = cli_opt(argc, argv, "--in");
    if (in) {
        if (pkv_trace_read(in, &t) != PKV_OK) {
            fprintf(stderr, "pkv trace: %s\n", pkv_last_error());
            return 1;
        }
    } else {
        pkv_trace_config c;
        if (!cli_trace_config(argc, argv, "--family", "trace", &c)) return 2;
        c.max_steps = cli_opt_range(argc, argv, "--steps", c.max_steps, 0, INT32_MAX);
        c.hole_fraction = cli_opt_double(argc, argv, "--holes", c.hole_fraction);
        if (pkv_trace_generate(&c, &t) != PKV_OK) {
            fprintf(stderr, "pkv trace: %s\n", pkv_last_error());
            return 2;
        }
    }
    const pkv_trace_config *c = pkv_trace_get_config(t);
    int32_t ns = pkv_trace_num_steps(t);
    int64_t tokens = 0, rows = 0;
    for (int32_t s = 0; s < ns; s++) {
        const int32_t *ids, *lens;
        int32_t b = pkv_trace_step(t, s, &ids, &lens);
        rows += b;
        for (int32_t i = 0; i < b; i++) tokens += lens[i];
    }
    printf("trace %s seed %llu: %d requests, max_active %d, %d steps, %lld rows, %.1f M tokens attended, "
           "%lld pages of %d tokens, checksum %016llx\n",
           pkv_trace_family_name(c->family), (unsigned long long)c->seed, pkv_trace_num_requests(t), c->max_active, ns,
           (long long)rows, tokens / 1e6, (long long)pkv_trace_num_pages(t), c->page_size,
           (unsigned long long)pkv_trace_checksum(t));
    int64_t show = cli_opt_int(argc, argv, "--show", 8);
    if (show < 0 || show > ns) show = ns;
    for (int32_t s = 0; s < show; s++) {
        const int32_t *ids, *lens;
        int32_t b = pkv_trace_step(t, s, &ids, &lens);
        printf("step %d: B=%d lens=", s, b);
        for (int32_t i = 0; i < b; i++) printf("%s%d", i ? "," : "", lens[i]);
        printf("\n");
    }
    const char *out = cli_opt(argc, argv, "--out");
    int rc = 0;
    if (out) {
        if (pkv_trace_write(t, out) != PKV_OK) {
            fprintf(stderr, "pkv trace: %s\n", pkv_last_error());
            rc = 1;
        } else {
            printf("wrote %s\n", out);
        }
    }
    pkv_trace_free(t);
    return rc;
}
