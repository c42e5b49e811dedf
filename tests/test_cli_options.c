/* test_cli_options.c - the pkv tool's option parsers (tools/options.h) on their own: chosen command
 * lines (good, help, each kind of bad value), messages cut to any room given (nothing written past it),
 * then random command lines from a dictionary of the options, values at and past their bounds and
 * random bytes: every answer one of the three codes, a message exactly when refused, argv untouched,
 * the same answer twice, what a bench parse lets through accepted by the library, and the same answers
 * from two threads at once (the parsers are reentrant).  PKV_CLI_OPTIONS_CASES=N sets the random cases. */
#include "options.h"
#include "pkv_test.h"

#include <float.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define MAX_ARGS 16
#define ARG_CAP 200
#define DEFAULT_CASES 200000
#define THREAD_CASES 2000

typedef struct cmdline {
    int argc;
    char *argv[MAX_ARGS];
    char buf[MAX_ARGS][ARG_CAP];
} cmdline;

static void set_args(cmdline *c, const char *const *args) {
    c->argc = 0;
    for (; *args && c->argc < MAX_ARGS; args++) {
        snprintf(c->buf[c->argc], ARG_CAP, "%s", *args);
        c->argv[c->argc] = c->buf[c->argc];
        c->argc++;
    }
}

/* Parses c with parser k (0 bench, 1 trace, 2 check, 3 calibrate, 4 decode) into err (cap bytes). */
#define NPARSERS 5
static bench_opts bench_o[2]; /* 16 KiB each: one per thread of the threaded part */
static cli_parse_status parse(int k, const cmdline *c, char *err, size_t cap, int slot) {
    char **argv = (char **)c->argv;
    trace_opts t;
    check_opts ch;
    calibrate_opts ca;
    decode_opts de;
    switch (k) {
    case 0: return bench_options_parse(c->argc, argv, &bench_o[slot], err, cap);
    case 1: return trace_options_parse(c->argc, argv, &t, err, cap);
    case 2: return check_options_parse(c->argc, argv, &ch, err, cap);
    case 3: return calibrate_options_parse(c->argc, argv, &ca, err, cap);
    default: return decode_options_parse(c->argc, argv, &de, err, cap);
    }
}

static cli_parse_status parse_args(int k, const char *const *args, char *err, size_t cap) {
    cmdline c;
    set_args(&c, args);
    return parse(k, &c, err, cap, 0);
}

#define EXPECT(k, want, needle, ...)                                                                      \
    do {                                                                                                  \
        const char *const args_[] = {__VA_ARGS__, NULL};                                                  \
        char err_[CLI_ERR_CAP];                                                                           \
        const cli_parse_status st_ = parse_args(k, args_, err_, sizeof err_);                             \
        CHECK_MSG(st_ == (want) && strstr(err_, needle) != NULL, "%s: status %d, message '%s'", #__VA_ARGS__, \
                  (int)st_, err_);                                                                        \
    } while (0)

static void chosen(void) {
    const char *const none[] = {NULL};
    char err[CLI_ERR_CAP];
    for (int k = 0; k < NPARSERS; k++) CHECK(parse_args(k, none, err, sizeof err) == CLI_PARSE_GO_ON && err[0] == '\0');
    for (int k = 0; k < NPARSERS; k++) EXPECT(k, CLI_PARSE_HELP, "", "--help");
    for (int k = 0; k < NPARSERS; k++) EXPECT(k, CLI_PARSE_BAD, "unknown option", "--nope");
    for (int k = 0; k < NPARSERS; k++) EXPECT(k, CLI_PARSE_BAD, "unexpected argument", "stray");
    CHECK(cli_parse_exit_code(CLI_PARSE_GO_ON) == -1 && cli_parse_exit_code(CLI_PARSE_HELP) == 0 &&
          cli_parse_exit_code(CLI_PARSE_BAD) == 2);
    /* bench: numbers at and past their bounds, lists, shapes the library refuses, workloads */
    EXPECT(0, CLI_PARSE_GO_ON, "", "--backend", "cpu", "--lens", "0,1,1073741824", "--reps", "1000000");
    EXPECT(0, CLI_PARSE_BAD, "[1, 1000000]", "--reps", "4294967297");
    EXPECT(0, CLI_PARSE_BAD, "[1, 1000000]", "--reps", "99999999999999999999999999");
    EXPECT(0, CLI_PARSE_BAD, "expects an integer", "--reps", "");
    EXPECT(0, CLI_PARSE_BAD, "needs a value", "--reps");
    EXPECT(0, CLI_PARSE_BAD, "--threads", "--threads", "0");
    EXPECT(0, CLI_PARSE_GO_ON, "", "--trace", "zipf", "--seed", "18446744073709551615");
    EXPECT(0, CLI_PARSE_BAD, "--seed", "--seed", "18446744073709551616");
    EXPECT(0, CLI_PARSE_BAD, "--seed", "--seed", "-1");
    EXPECT(0, CLI_PARSE_BAD, "--soft-cap", "--soft-cap", "1e39"); /* past float: not cast */
    EXPECT(0, CLI_PARSE_BAD, "finite", "--rotate-gib", "nan");
    EXPECT(0, CLI_PARSE_BAD, "head_dim 96", "--shape", "32:8:96");
    EXPECT(0, CLI_PARSE_BAD, "unknown shape", "--shape", "123456:1:128");
    EXPECT(0, CLI_PARSE_BAD, "above the supported maximum", "--shape", "99999:99999:128");
    EXPECT(0, CLI_PARSE_BAD, "unknown shape", "--shape", "32:8:");
    EXPECT(0, CLI_PARSE_BAD, "at least 0", "--lens", "10,-5");
    EXPECT(0, CLI_PARSE_BAD, "2^30", "--lens", "5000000000");
    EXPECT(0, CLI_PARSE_BAD, "length 2", "--lens", "5,");
    EXPECT(0, CLI_PARSE_BAD, "page table", "--page-size", "1", "--lens", "1073741824,1073741824");
    EXPECT(0, CLI_PARSE_BAD, "give one", "--anchor", "all", "--lens", "5");
    EXPECT(0, CLI_PARSE_BAD, "--set-seeds applies to --heldout-set", "--set-seeds", "2");
    EXPECT(0, CLI_PARSE_GO_ON, "", "--heldout-set", "--set-seeds", "2", "--set-batches", "1,4096");
    EXPECT(0, CLI_PARSE_BAD, "--set-batches", "--heldout-set", "--set-batches", "1,4097");
    EXPECT(0, CLI_PARSE_GO_ON, "", "--calibration-set", "--set-batches", "1,2,8,128");
    EXPECT(0, CLI_PARSE_BAD, "--set-seeds", "--calibration-set", "--set-seeds", "2");
    EXPECT(0, CLI_PARSE_BAD, "--set-batches", "--trace", "uniform", "--set-batches", "4");
    EXPECT(0, CLI_PARSE_BAD, "unknown anchor", "--anchor", "B3_nope");
    EXPECT(0, CLI_PARSE_GO_ON, "", "--graph-max-batch", "pow2", "--route", "workqueue");
    EXPECT(0, CLI_PARSE_BAD, "unknown route", "--route", "sideways");
    /* bench: the cache's type and an fp8 cache's scale */
    EXPECT(0, CLI_PARSE_GO_ON, "", "--kv-dtype", "fp8_e4m3", "--kv-scale", "0.05");
    EXPECT(0, CLI_PARSE_GO_ON, "", "--dtype", "bf16", "--kv-dtype", "fp8_e5m2");
    EXPECT(0, CLI_PARSE_GO_ON, "", "--dtype", "fp8", "--kv-dtype", "fp8_e5m2", "--kv-scale", "3e38");
    EXPECT(0, CLI_PARSE_GO_ON, "", "--dtype", "bf16", "--kv-dtype", "bf16");
    EXPECT(0, CLI_PARSE_BAD, "fp8_e4m3 or fp8_e5m2, got 'fp4'", "--kv-dtype", "fp4");
    EXPECT(0, CLI_PARSE_BAD, "--dtype takes fp16, bf16 or fp8", "--dtype", "fp8_e5m2");
    EXPECT(0, CLI_PARSE_BAD, "holds q's type", "--kv-dtype", "bf16");
    EXPECT(0, CLI_PARSE_BAD, "holds q's type", "--shape", "d256", "--kv-dtype", "fp16");
    EXPECT(0, CLI_PARSE_BAD, "give one", "--dtype", "fp8", "--kv-dtype", "fp16");
    EXPECT(0, CLI_PARSE_BAD, "positive scale", "--dtype", "fp8", "--kv-scale", "-1");
    EXPECT(0, CLI_PARSE_BAD, "positive scale", "--dtype", "fp8", "--kv-scale", "0");
    EXPECT(0, CLI_PARSE_BAD, "positive scale", "--dtype", "fp8", "--kv-scale", "1e-50"); /* 0 as a float */
    EXPECT(0, CLI_PARSE_BAD, "positive scale", "--dtype", "fp8", "--kv-scale", "1e39");  /* past float */
    EXPECT(0, CLI_PARSE_BAD, "finite", "--dtype", "fp8", "--kv-scale", "nan");
    EXPECT(0, CLI_PARSE_BAD, "applies to an fp8 cache", "--kv-scale", "2");
    {
        const char *const fp8[] = {"--dtype", "fp8", "--kv-scale", "0.25", NULL};
        CHECK(parse_args(0, fp8, err, sizeof err) == CLI_PARSE_GO_ON && bench_o[0].prob.dtype == PKV_DTYPE_FP16 &&
              bench_o[0].prob.kv_dtype == PKV_DTYPE_FP8_E4M3 && bench_o[0].kv_scale == 0.25f);
        const char *const same[] = {"--shape", "d64", "--kv-dtype", "bf16", NULL}; /* q's type: kv_dtype 0 */
        CHECK(parse_args(0, same, err, sizeof err) == CLI_PARSE_GO_ON && bench_o[0].prob.dtype == PKV_DTYPE_BF16 &&
              bench_o[0].prob.kv_dtype == 0 && bench_o[0].kv_scale == 1.0f);
    }
    /* decode: the KV pools' type, an fp8 pool's scale, the fp8 comparison */
    EXPECT(4, CLI_PARSE_GO_ON, "", "--kv-dtype", "fp8_e4m3", "--kv-scale", "0.05");
    EXPECT(4, CLI_PARSE_GO_ON, "", "--kv-dtype", "bf16");
    EXPECT(4, CLI_PARSE_GO_ON, "", "--kv-compare", "fp8_e5m2", "--kv-scale", "2", "--max-new", "4");
    EXPECT(4, CLI_PARSE_BAD, "bf16, fp8_e4m3 (or fp8) or fp8_e5m2, got 'fp4'", "--kv-dtype", "fp4");
    EXPECT(4, CLI_PARSE_BAD, "the model is bf16", "--kv-dtype", "fp16");
    EXPECT(4, CLI_PARSE_BAD, "positive scale", "--kv-dtype", "fp8", "--kv-scale", "0");
    EXPECT(4, CLI_PARSE_BAD, "positive scale", "--kv-dtype", "fp8", "--kv-scale", "-2");
    EXPECT(4, CLI_PARSE_BAD, "positive scale", "--kv-dtype", "fp8", "--kv-scale", "1e39");
    EXPECT(4, CLI_PARSE_BAD, "finite", "--kv-dtype", "fp8", "--kv-scale", "inf");
    EXPECT(4, CLI_PARSE_BAD, "applies to an fp8 KV cache", "--kv-scale", "2");
    EXPECT(4, CLI_PARSE_BAD, "applies to an fp8 KV cache", "--kv-dtype", "bf16", "--kv-scale", "2");
    EXPECT(4, CLI_PARSE_BAD, "--kv-compare takes", "--kv-compare", "bf16");
    EXPECT(4, CLI_PARSE_BAD, "--kv-dtype does not apply", "--kv-compare", "fp8", "--kv-dtype", "fp8_e5m2");
    EXPECT(4, CLI_PARSE_BAD, "--trace does not apply to --kv-compare", "--kv-compare", "fp8", "--trace", "zipf");
    EXPECT(4, CLI_PARSE_BAD, "--prefill does not apply", "--kv-compare", "fp8", "--prefill", "exact");
    {
        const char *const args[] = {"--kv-dtype", "fp8", "--kv-scale", "0.25", NULL};
        decode_opts de;
        CHECK(parse_args(4, args, err, sizeof err) == CLI_PARSE_GO_ON);
        cmdline c;
        set_args(&c, args);
        CHECK(decode_options_parse(c.argc, c.argv, &de, err, sizeof err) == CLI_PARSE_GO_ON &&
              de.kv_dtype == PKV_DTYPE_FP8_E4M3 && de.kv_scale == 0.25f && de.kv_compare == 0);
        const char *const cmp[] = {"--kv-compare", "fp8_e5m2", NULL};
        set_args(&c, cmp);
        CHECK(decode_options_parse(c.argc, c.argv, &de, err, sizeof err) == CLI_PARSE_GO_ON && de.kv_dtype == 0 &&
              de.kv_compare == PKV_DTYPE_FP8_E5M2 && de.kv_scale == 1.0f && de.exact_prefill);
        const char *const none[] = {NULL};
        set_args(&c, none);
        CHECK(decode_options_parse(c.argc, c.argv, &de, err, sizeof err) == CLI_PARSE_GO_ON && de.kv_dtype == 0 &&
              de.kv_compare == 0 && de.kv_scale == 1.0f && de.graphs == -1);
        /* --graphs: off 0, on 1 (pkv_decoder_config.graphs); not given -1 (on where the backend is CUDA) */
        static const char *const modes[] = {"off", "on"};
        static const int32_t want[] = {0, 1};
        for (int m = 0; m < 2; m++) {
            const char *const g[] = {"--graphs", modes[m], NULL};
            set_args(&c, g);
            CHECK(decode_options_parse(c.argc, c.argv, &de, err, sizeof err) == CLI_PARSE_GO_ON && de.graphs == want[m]);
        }
    }
    EXPECT(4, CLI_PARSE_BAD, "--graphs takes on or off", "--graphs", "step");
    /* the last value of a repeated option */
    {
        const char *const args[] = {"--reps", "3", "--reps", "5", NULL};
        CHECK(parse_args(0, args, err, sizeof err) == CLI_PARSE_GO_ON && bench_o[0].reps == 5);
    }
    /* trace, check, calibrate */
    EXPECT(1, CLI_PARSE_BAD, "--in", "--in", "t.csv", "--family", "zipf");
    EXPECT(1, CLI_PARSE_BAD, "[0, 0.9]", "--holes", "0.95");
    EXPECT(1, CLI_PARSE_BAD, "--show", "--show", "-2");
    EXPECT(1, CLI_PARSE_BAD, "needs a path", "--out", "");
    EXPECT(2, CLI_PARSE_BAD, "--count", "--count", "0");
    EXPECT(2, CLI_PARSE_BAD, "unknown backend", "--backend", "tpu");
    EXPECT(3, CLI_PARSE_GO_ON, "", "--backend", "cpu", "--reps", "2");
    EXPECT(3, CLI_PARSE_BAD, "--reps", "--reps", "0");
    EXPECT(3, CLI_PARSE_BAD, "comma-separated paths", "--from-json", "a.json,,b.json");
    EXPECT(3, CLI_PARSE_BAD, "--policy needs --evaluate", "--policy", "p");
    EXPECT(3, CLI_PARSE_BAD, "live calibration", "--from-json", "a.json", "--json", "b.json");
    EXPECT(3, CLI_PARSE_BAD, "--evaluate needs a model", "--evaluate", "a.json");
    EXPECT(3, CLI_PARSE_GO_ON, "", "--policy", "p", "--evaluate", "a.json,b.json", "--replay-auto");
    /* a NULL in argv */
    {
        cmdline c;
        const char *const args[] = {"--reps", "2", NULL};
        set_args(&c, args);
        c.argv[1] = NULL;
        CHECK(parse(0, &c, err, sizeof err, 0) == CLI_PARSE_BAD);
    }
}

/* A message cut to the room given: NUL-terminated inside it, nothing written past it. */
static void small_rooms(void) {
    const char *const args[] = {"--shape", "32:8:96", NULL};
    for (size_t cap = 0; cap < 40; cap++) {
        char buf[64];
        memset(buf, 'x', sizeof buf);
        const cli_parse_status st = parse_args(0, args, cap ? buf : NULL, cap);
        bool untouched = true;
        for (size_t i = cap; i < sizeof buf; i++) untouched &= buf[i] == 'x';
        CHECK_MSG(st == CLI_PARSE_BAD && untouched && (cap == 0 || strlen(buf) < cap), "room %zu", cap);
    }
}

/* ---- random command lines ------------------------------------------------------------------------- */
static const char *const options[] = {
    "--backend", "--route", "--threads", "--shape", "--dtype", "--layout", "--page-size", "--trace", "--seed",
    "--batch", "--requests", "--steps", "--step", "--trace-file", "--anchor", "--lens", "--reps", "--warmup",
    "--wall-reps", "--rotate-gib", "--no-check", "--per-step", "--json", "--quiet", "--ctas-per-unit",
    "--min-chunk", "--explain", "--policy", "--calibrate-out", "--calibration-set", "--heldout-set",
    "--set-batches", "--set-seeds", "--parallelism", "--kv-interleaved", "--window", "--soft-cap",
    "--behind-producer", "--pdl", "--graph-max-batch", "--graph-tasks", "--family", "--holes", "--in", "--out",
    "--show", "--count", "--max-len", "--from-json", "--evaluate", "--replay-auto", "--help", "--",
    "--model", "--layers", "--prefill", "--prompts", "--weights", "--max-new", "--pages", "--out-tokens",
    "--kv-dtype", "--kv-scale", "--kv-compare"};
static const char *const values[] = {
    "", "0", "1", "-1", "2", "16", "256", "257", "1024", "1025", "65536", "1048576", "2147483647", "2147483648",
    "-2147483649", "4294967297", "9223372036854775807", "9223372036854775808", "18446744073709551616",
    "99999999999999999999999999999", "1e39", "-0", "0.5", "0.9", "nan", "inf", "-inf", "0x10", " 7", "7 ",
    "all", "pow2", "cpu", "cuda", "best", "auto", "single", "workqueue", "fused", "paper", "d64", "g16",
    "32:8:128", "48:4:64", "30:8:128", "32:8:96", "99999:1:64", "1:1:1", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp4", "1e-50", "nhd", "hnd",
    "zipf", "bimodal", "uniform", "B8_bimodal", "B64_homo32K", "300,0,1,2000", "10,-5", "5,,6", ",", "5,",
    "1073741824,1073741824,1073741824", "1,4,16", "a.json", "a.json,b.json", "x", "--reps"};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void random_cmdline(cmdline *c) {
    c->argc = (int)(next_rand() % MAX_ARGS);
    const int n_opt = (int)(sizeof options / sizeof options[0]), n_val = (int)(sizeof values / sizeof values[0]);
    for (int i = 0; i < c->argc; i++) {
        const uint64_t r = next_rand();
        if (r % 16 == 0) { /* random bytes, a long run of digits or commas now and then */
            const int len = (int)(next_rand() % (ARG_CAP - 1));
            const char fill = "9,-:x"[next_rand() % 5];
            for (int j = 0; j < len; j++) c->buf[i][j] = r % 32 == 0 ? (char)(1 + next_rand() % 255) : fill;
            c->buf[i][len] = '\0';
        } else {
            snprintf(c->buf[i], ARG_CAP, "%s", i % 2 == 0 ? options[r % (uint64_t)n_opt] : values[r % (uint64_t)n_val]);
        }
        c->argv[i] = c->buf[i];
    }
}

/* What a bench parse that goes on lets through, as the rest of pkv bench relies on it. */
static bool bench_sane(const bench_opts *o) {
    const int32_t indptr[1] = {0};
    const pkv_page_table empty = {0, indptr, NULL, NULL};
    bool ok = o->nroutes >= 1 && o->nroutes <= BENCH_MAX_ROUTES && o->nlens >= 0 && o->nlens <= BENCH_MAX_LENS &&
              pkv_check_page_table(&o->prob, &empty) == PKV_OK && (o->reps == BENCH_DEFAULT || o->reps >= 1) &&
              o->set_seeds >= 1 && o->set_seeds <= BENCH_HELDOUT_SEEDS && o->cc.num_threads >= 0 &&
              o->kv_scale > 0.0f && o->kv_scale <= FLT_MAX && (cli_kv_is_fp8(&o->prob) || o->kv_scale == 1.0f);
    int64_t pages = 0;
    for (int i = 0; i < o->nlens; i++) {
        ok &= o->lens[i] >= 0 && o->lens[i] <= BENCH_MAX_LEN;
        pages += (o->lens[i] + o->prob.page_size - 1) / o->prob.page_size;
    }
    return ok && pages <= INT32_MAX && (o->workload != BENCH_WORKLOAD_LENS || o->nlens >= 1);
}

static void random_cases(int cases) {
    int answers[3] = {0, 0, 0}, bad_cases = 0;
    for (int n = 0; n < cases; n++) {
        cmdline c, copy;
        random_cmdline(&c);
        copy = c;
        for (int k = 0; k < NPARSERS; k++) {
            char err[CLI_ERR_CAP], err2[CLI_ERR_CAP];
            const cli_parse_status st = parse(k, &c, err, sizeof err, 0);
            const cli_parse_status st2 = parse(k, &c, err2, sizeof err2, 0);
            bool ok = (st == CLI_PARSE_GO_ON || st == CLI_PARSE_HELP || st == CLI_PARSE_BAD) && st == st2 &&
                      strcmp(err, err2) == 0 && (st == CLI_PARSE_BAD) == (err[0] != '\0');
            if (k == 0 && st == CLI_PARSE_GO_ON) ok &= bench_sane(&bench_o[0]);
            for (int i = 0; i < c.argc; i++) ok &= c.argv[i] == copy.argv[i] && strcmp(c.buf[i], copy.buf[i]) == 0;
            if (!ok && bad_cases++ < 5) {
                fprintf(stderr, "case %d parser %d: status %d / %d, '%s' / '%s'; argv:", n, k, (int)st, (int)st2, err,
                        err2);
                for (int i = 0; i < c.argc; i++) fprintf(stderr, " '%.40s'", c.argv[i]);
                fprintf(stderr, "\n");
            }
            if (st >= 0 && st <= 2) answers[st]++;
        }
    }
    CHECK_MSG(bad_cases == 0, "%d of %d random command lines answered wrongly", bad_cases, cases);
    printf("random command lines: %d x %d parsers: %d go on, %d help, %d refused\n", cases, NPARSERS, answers[0], answers[1],
           answers[2]);
}

/* ---- two threads at once --------------------------------------------------------------------------- */
typedef struct thread_job {
    int slot;
    cmdline *lines;
    char (*errs)[NPARSERS][CLI_ERR_CAP];
    int mismatches;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *j = (thread_job *)arg;
    for (int n = 0; n < THREAD_CASES; n++)
        for (int k = 0; k < NPARSERS; k++) {
            char err[CLI_ERR_CAP];
            parse(k, &j->lines[n], err, sizeof err, j->slot);
            j->mismatches += strcmp(err, j->errs[n][k]) != 0;
        }
    return NULL;
}

static void threads(void) {
    static cmdline lines[THREAD_CASES];
    static char errs[THREAD_CASES][NPARSERS][CLI_ERR_CAP];
    for (int n = 0; n < THREAD_CASES; n++) {
        random_cmdline(&lines[n]);
        for (int k = 0; k < NPARSERS; k++) parse(k, &lines[n], errs[n][k], CLI_ERR_CAP, 0);
    }
    thread_job jobs[2] = {{0, lines, errs, 0}, {1, lines, errs, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, thread_main, &jobs[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK_MSG(jobs[0].mismatches == 0 && jobs[1].mismatches == 0, "messages differ across threads: %d, %d",
              jobs[0].mismatches, jobs[1].mismatches);
}

int main(void) {
    const char *env = getenv("PKV_CLI_OPTIONS_CASES");
    const int cases = env && atoi(env) > 0 ? atoi(env) : DEFAULT_CASES;
    chosen();
    small_rooms();
    random_cases(cases);
    threads();
    printf("test_cli_options: %d passed, %d failed\n", pkv_test_passed, pkv_test_failed);
    return pkv_test_failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
