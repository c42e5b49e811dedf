/* trace_cmd.c - `pkv trace`: generates a trace of a workloads.md family (or reads a trace file),
 * prints its summary and steps, and writes it as a trace file. */
#include "cli.h"
#include "options.h"

#include <stdlib.h>
#include <string.h>

int cmd_trace(int argc, char **argv) {
    trace_opts o;
    char err[CLI_ERR_CAP];
    const cli_parse_status ps = trace_options_parse(argc, argv, &o, err, sizeof err);
    if (ps == CLI_PARSE_HELP) trace_usage(stdout);
    if (ps == CLI_PARSE_BAD) fprintf(stderr, "pkv trace: %s\n", err);
    if (ps != CLI_PARSE_GO_ON) return cli_parse_exit_code(ps);
    pkv_trace *t = NULL;
    if (o.in && pkv_trace_read(o.in, &t) != PKV_OK) {
        fprintf(stderr, "pkv trace: %s\n", pkv_last_error());
        return 1;
    }
    if (!o.in && pkv_trace_generate(&o.config, &t) != PKV_OK) {
        fprintf(stderr, "pkv trace: %s\n", pkv_last_error());
        return 2;
    }
    /* the file first: a path that cannot be written fails before anything is printed */
    if (o.out && pkv_trace_write(t, o.out) != PKV_OK) {
        fprintf(stderr, "pkv trace: %s\n", pkv_last_error());
        pkv_trace_free(t);
        return 1;
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
    int64_t show = o.show;
    if (show < 0 || show > ns) show = ns;
    for (int32_t s = 0; s < show; s++) {
        const int32_t *ids, *lens;
        int32_t b = pkv_trace_step(t, s, &ids, &lens);
        printf("step %d: B=%d lens=", s, b);
        for (int32_t i = 0; i < b; i++) printf("%s%d", i ? "," : "", lens[i]);
        printf("\n");
    }
    if (o.out) printf("wrote %s\n", o.out);
    pkv_trace_free(t);
    return 0;
}
