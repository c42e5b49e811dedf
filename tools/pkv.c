/* pkv.c - the PersistentKV command-line tool: `pkv trace`, `pkv bench`, `pkv check`. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: pkv <command> [options]\n\n"
               "commands:\n"
               "  trace   generate, show or write a decode trace (workloads.md families)\n"
               "  bench   replay a trace, the anchor steps or one step on a backend and route; Markdown + JSON\n"
               "  check   every route against the float64 reference on random problems\n"
               "  calibrate  fit the cost model of the auto route and write a policy file\n"
               "  decode  the end-to-end decode loop through a model's layers (continuous batching)\n\n"
               "`pkv <command> --help` lists each command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("pkv %d.%d.%d\n", PKV_VERSION_MAJOR, PKV_VERSION_MINOR, PKV_VERSION_PATCH);
        return 0;
    }
    if (strcmp(argv[1], "bench") == 0) return cmd_bench(argc - 2, argv + 2);
    if (strcmp(argv[1], "check") == 0) return cmd_check(argc - 2, argv + 2);
    if (strcmp(argv[1], "trace") == 0) return cmd_trace(argc - 2, argv + 2);
    if (strcmp(argv[1], "calibrate") == 0) return cmd_calibrate(argc - 2, argv + 2);
    if (strcmp(argv[1], "decode") == 0) return cmd_decode(argc - 2, argv + 2);
    fprintf(stderr, "pkv: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
