/* fuzz_cli_options.c - the pkv tool's option parsers (tools/options.h) on arbitrary command lines.  The
 * input: its first byte picks the subcommand (bench, trace, check, calibrate, decode), the second the size of the
 * message buffer (1..256: a message is cut to any size without writing past it), the rest is argv split at
 * NUL bytes.  What must hold: the answer is one of the three codes, with a message exactly when refused;
 * argv is not written; a second parse gives the same answer and message; what a bench parse lets through is
 * what pkv bench relies on (a problem the library accepts, lengths in range, a page count that fits int32, an
 * fp8 cache's scale positive and finite). */
#include "options.h"
#include "fuzz_util.h"

#include <float.h>

#define MAX_ARGS 64

static cli_parse_status parse(int cmd, int argc, char **argv, char *err, size_t cap, bench_opts *b) {
    trace_opts t;
    check_opts c;
    calibrate_opts k;
    decode_opts d;
    switch (cmd) {
    case 0: return bench_options_parse(argc, argv, b, err, cap);
    case 1: return trace_options_parse(argc, argv, &t, err, cap);
    case 2: return check_options_parse(argc, argv, &c, err, cap);
    case 3: return calibrate_options_parse(argc, argv, &k, err, cap);
    default: return decode_options_parse(argc, argv, &d, err, cap);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int cmd = data[0] % 5;
    const size_t cap = 1 + data[1] % 256;
    /* argv: the rest split at NUL bytes, into a copy the parse must leave as it is */
    char *text = (char *)malloc(size - 2 + 1), *copy = (char *)malloc(size - 2 + 1);
    if (!text || !copy) return 0;
    memcpy(text, data + 2, size - 2);
    text[size - 2] = '\0';
    memcpy(copy, text, size - 1);
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    for (size_t at = 0; at < size - 2 && argc < MAX_ARGS;) {
        argv[argc++] = text + at;
        at += strlen(text + at) + 1;
    }
    argv[argc] = NULL;
    char *const *argv_before = argv;
    char *saved[MAX_ARGS + 1];
    memcpy(saved, argv, sizeof(char *) * (size_t)(argc + 1));
    char *err = (char *)malloc(cap), *err2 = (char *)malloc(cap); /* exactly cap: ASan sees a write past it */
    bench_opts *b = (bench_opts *)malloc(sizeof *b), *b2 = (bench_opts *)malloc(sizeof *b2);
    if (!err || !err2 || !b || !b2) return 0;
    const cli_parse_status st = parse(cmd, argc, argv, err, cap, b);
    const cli_parse_status st2 = parse(cmd, argc, argv, err2, cap, b2);
    FUZZ_CHECK(st == CLI_PARSE_GO_ON || st == CLI_PARSE_HELP || st == CLI_PARSE_BAD, "status %d", (int)st);
    FUZZ_CHECK(st == st2 && strcmp(err, err2) == 0, "two parses differ: %d '%s' / %d '%s'", (int)st, err, (int)st2, err2);
    FUZZ_CHECK((st == CLI_PARSE_BAD) == (err[0] != '\0') || cap == 1, "status %d with message '%s'", (int)st, err);
    FUZZ_CHECK(strlen(err) < cap, "message of %zu bytes in a buffer of %zu", strlen(err), cap);
    FUZZ_CHECK(argv == argv_before && memcmp(saved, argv, sizeof(char *) * (size_t)(argc + 1)) == 0 &&
                   memcmp(text, copy, size - 1) == 0,
               "the parse wrote into argv");
    if (cmd == 0 && st == CLI_PARSE_GO_ON) {
        const int32_t indptr[1] = {0};
        const pkv_page_table empty = {0, indptr, NULL, NULL};
        FUZZ_CHECK(pkv_check_page_table(&b->prob, &empty) == PKV_OK, "bench let a bad problem through: %s",
                   pkv_last_error());
        FUZZ_CHECK(b->nroutes >= 1 && b->nroutes <= BENCH_MAX_ROUTES && b->nlens >= 0 && b->nlens <= BENCH_MAX_LENS,
                   "routes %d, lengths %d", b->nroutes, b->nlens);
        FUZZ_CHECK(b->cc.num_threads >= 0 && (b->reps == BENCH_DEFAULT || b->reps >= 1), "threads %d, reps %d",
                   b->cc.num_threads, b->reps);
        /* an fp8 cache's scale as pkv_tensors takes it (positive, finite); 1 for a cache of q's type */
        FUZZ_CHECK(b->kv_scale > 0.0f && b->kv_scale <= FLT_MAX && (cli_kv_is_fp8(&b->prob) || b->kv_scale == 1.0f),
                   "kv_scale %g with kv_dtype %d", (double)b->kv_scale, (int)b->prob.kv_dtype);
        int64_t pages = 0;
        for (int i = 0; i < b->nlens; i++) {
            FUZZ_CHECK(b->lens[i] >= 0 && b->lens[i] <= BENCH_MAX_LEN, "length %d", b->lens[i]);
            pages += (b->lens[i] + b->prob.page_size - 1) / b->prob.page_size;
        }
        FUZZ_CHECK(pages <= INT32_MAX, "%lld pages", (long long)pages);
        FUZZ_CHECK(b->workload != BENCH_WORKLOAD_LENS || b->nlens >= 1, "--lens without lengths");
    }
    free(text), free(copy), free(err), free(err2), free(b), free(b2);
    return 0;
}
