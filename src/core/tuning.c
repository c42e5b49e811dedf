/* tuning.c - the one place the library reads its environment: PKV_TUNING, its tuning switches, and
 * PKV_POLICY, a calibrated cost model.  Both are read when a context is created (pkv_context_create),
 * parsed into the context's pkv_tuning (tuning.h); the backends read that struct.  A key this parser does
 * not know, a key without a value, a value out of range or a key given twice fails the context's
 * creation with PKV_ERR_INVALID_ARGUMENT and a message naming the key: a typo must not silently run
 * (and measure) the default.
 *
 *   PKV_TUNING=key=value,key=value,...   (no spaces; a value runs to the next comma)
 *
 * The defaults are what the library runs; every key exists to reach a path the defaults do not take on
 * the machine at hand (tests, sanitizers, A/B runs), never to choose a variant that measured slower:
 *
 *   tma=0|1              default 1.  0: the register kernels where sm_90 would run the shared-memory ring
 *                        kernel (tensor copies, cp.async).  They are the only decode kernels of sm_80-89 GPUs
 *                        and of builds without sm_90 code; this is how a Hopper tests and sanitizes them.
 *   tma_stages=N         default 0 (the device's: per head dim, the most stages per warp that keep as many
 *                        CTAs per SM resident as the register kernel the planner counts).  1..6 forces the
 *                        ring's depth, raised to the head dim's minimum and cut to what fits the device: the
 *                        ring's wrap at other depths (tests) and the depth A/B of docs/kernel-notes.md v8.
 *   merge=auto|head|row  default auto (the merges' width picks the kernel, per plan and per graph-stable step).
 *                        head: a CTA per (merge, query head) for every plan; row: a CTA per merge.  Each
 *                        kernel is the default for some shapes only; forcing one tests it on every shape.
 *   merge_wide_at=N      default 2.  auto's rule: per head from N dependent batches of state loads per
 *                        thread of the per-merge kernel (kernel-notes v13d moved it from 3); N >= 1.
 *   claim_sms=N          default: the device's SMs (at most 256).  Graph-stable steps deal their tasks over N
 *                        SMs, 1..256.  Below the device's count an SM is dealt more tasks than it gets CTAs,
 *                        so the CTAs that wait for unclaimed tasks must find and run them: the only way to
 *                        test that path on an idle GPU.
 *   pageable_upload=0|1  default 0.  1: plans planned on the context keep their blob in malloc's memory and
 *                        their uploads copy straight from it, the path taken when page-locked memory (plans'
 *                        blobs, staging) is refused (a locked-memory limit).
 *   pdl=0|1              default 1.  0: no programmatic dependent launch at all, not even of the merge kernel
 *                        after the decode kernel (pkv_context_config.pdl = 0 keeps that one): the launch
 *                        order of GPUs and builds without sm_90 code, on a Hopper.
 *   cpu_f16c=0|1         default 1.  0: the CPU backend converts fp16 by its table, the path of CPUs without
 *                        F16C (the two must give the same bits).  Chosen once per process, by the
 *                        PKV_TUNING of the first CPU context (pkv_tuning_env_cpu_f16c).
 *   timeline_out=PATH    default none.  Dev builds (cmake -DPKV_TIMELINE=ON) only, else an error: the per-CTA
 *                        times of the context's last decode and merge launches, written as CSV to PATH when
 *                        the context is freed (dev/probes/05_b1_timeline.sh).  PATH holds no comma.
 *
 *   PKV_POLICY=FILE      its own variable: a `pkv calibrate` policy for auto's cost model (context.c).
 *
 * The variables before PKV_TUNING (PKV_NO_PDL, PKV_DECODE_TMA, PKV_MERGE_KERNEL, ... ) are gone, most with
 * the variants they chose (docs/kernel-notes.md, "Retired from the library (issue 33)"); the five still
 * needed became the keys above.  They are no longer read. */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pkv_tuning_default(pkv_tuning *t) {
    memset(t, 0, sizeof *t);
    t->tma = true;
    t->tma_stages = 0;
    t->merge = PKV_TUNING_MERGE_AUTO;
    t->merge_wide_at = 2;
    t->claim_sms = 0;
    t->pageable_upload = false;
    t->pdl = true;
    t->cpu_f16c = true;
}

typedef enum { KEY_BOOL, KEY_INT, KEY_MERGE, KEY_PATH } key_kind;
typedef enum {
    K_TMA,
    K_TMA_STAGES,
    K_MERGE,
    K_MERGE_WIDE_AT,
    K_CLAIM_SMS,
    K_PAGEABLE_UPLOAD,
    K_PDL,
    K_CPU_F16C,
    K_TIMELINE_OUT,
    NKEYS
} key_id;
typedef struct {
    const char *name;
    key_kind kind;
    int32_t lo, hi; /* KEY_INT: the accepted range */
} key_spec;

static const key_spec keys[NKEYS] = {
    [K_TMA] = {"tma", KEY_BOOL, 0, 1},
    [K_TMA_STAGES] = {"tma_stages", KEY_INT, 1, PKV_TUNING_MAX_STAGES},
    [K_MERGE] = {"merge", KEY_MERGE, 0, 0},
    [K_MERGE_WIDE_AT] = {"merge_wide_at", KEY_INT, 1, INT32_MAX},
    [K_CLAIM_SMS] = {"claim_sms", KEY_INT, 1, PKV_CLAIM_SMS},
    [K_PAGEABLE_UPLOAD] = {"pageable_upload", KEY_BOOL, 0, 1},
    [K_PDL] = {"pdl", KEY_BOOL, 0, 1},
    [K_CPU_F16C] = {"cpu_f16c", KEY_BOOL, 0, 1},
    [K_TIMELINE_OUT] = {"timeline_out", KEY_PATH, 0, 0},
};
#define KEY_LIST "tma, tma_stages, merge, merge_wide_at, claim_sms, pageable_upload, pdl, cpu_f16c, timeline_out"

/* An integer that is the whole of s (decimal), in [lo, hi]. */
static bool parse_int(const char *s, int32_t lo, int32_t hi, int32_t *out) {
    if (!*s) return false;
    char *end = NULL;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
    *out = (int32_t)v;
    return true;
}

/* Applies key k with value v (a zero-terminated copy) to t. */
static pkv_status apply(pkv_context *ctx, key_id k, const char *v, pkv_tuning *t) {
    const key_spec *ks = &keys[k];
    int32_t n = 0;
    switch (ks->kind) {
    case KEY_BOOL:
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "PKV_TUNING: %s=%.100s: the value must be 0 or 1", ks->name,
                            v);
        n = v[0] == '1';
        break;
    case KEY_INT:
        if (!parse_int(v, ks->lo, ks->hi, &n))
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                            "PKV_TUNING: %s=%.100s: the value must be an integer in [%d, %d]", ks->name, v, (int)ks->lo,
                            (int)ks->hi);
        break;
    case KEY_MERGE:
        if (strcmp(v, "auto") == 0) n = PKV_TUNING_MERGE_AUTO;
        else if (strcmp(v, "head") == 0) n = PKV_TUNING_MERGE_HEAD;
        else if (strcmp(v, "row") == 0) n = PKV_TUNING_MERGE_ROW;
        else
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                            "PKV_TUNING: %s=%.100s: the value must be auto, head or row", ks->name, v);
        break;
    case KEY_PATH:
#ifdef PKV_TIMELINE
        if (!*v || strlen(v) >= sizeof t->timeline_out)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "PKV_TUNING: %s: the path must have 1 to %d bytes",
                            ks->name, (int)sizeof t->timeline_out - 1);
        break;
#else
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                        "PKV_TUNING: %s needs a build with per-CTA timelines (cmake -DPKV_TIMELINE=ON)", ks->name);
#endif
    }
    switch (k) {
    case K_TMA: t->tma = n != 0; break;
    case K_TMA_STAGES: t->tma_stages = n; break;
    case K_MERGE: t->merge = (pkv_tuning_merge)n; break;
    case K_MERGE_WIDE_AT: t->merge_wide_at = n; break;
    case K_CLAIM_SMS: t->claim_sms = n; break;
    case K_PAGEABLE_UPLOAD: t->pageable_upload = n != 0; break;
    case K_PDL: t->pdl = n != 0; break;
    case K_CPU_F16C: t->cpu_f16c = n != 0; break;
    case K_TIMELINE_OUT: snprintf(t->timeline_out, sizeof t->timeline_out, "%s", v); break;
    case NKEYS: break;
    }
    return PKV_OK;
}

pkv_status pkv_tuning_parse(pkv_context *ctx, const char *text, pkv_tuning *t) {
    if (!text) return PKV_OK;
    bool seen[NKEYS] = {false};
    const char *s = text;
    while (*s) {
        const char *end = strchr(s, ',');
        const size_t len = end ? (size_t)(end - s) : strlen(s);
        char item[PKV_TUNING_PATH_MAX + 32];
        if (len == 0)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                            "PKV_TUNING: an empty item in \"%.200s\" (key=value,key=value)", text);
        if (len >= sizeof item)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "PKV_TUNING: an item of %zu bytes (\"%.40s...\")", len, s);
        memcpy(item, s, len);
        item[len] = '\0';
        char *eq = strchr(item, '=');
        if (eq) *eq = '\0';
        int k = 0;
        while (k < NKEYS && strcmp(keys[k].name, item) != 0) k++;
        if (k == NKEYS)
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "PKV_TUNING: unknown key \"%.100s\" (keys: " KEY_LIST ")",
                            item);
        if (!eq) return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "PKV_TUNING: %s has no value (%s=VALUE)", item, item);
        if (seen[k]) return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "PKV_TUNING: %s is given twice", item);
        seen[k] = true;
        const pkv_status st = apply(ctx, (key_id)k, eq + 1, t);
        if (st != PKV_OK) return st;
        if (!end) break;
        s = end + 1;
        if (!*s) /* a trailing comma: an empty last item */
            return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT,
                            "PKV_TUNING: an empty item in \"%.200s\" (key=value,key=value)", text);
    }
    return PKV_OK;
}

pkv_status pkv_tuning_from_env(pkv_context *ctx, pkv_tuning *t) {
    pkv_tuning_default(t);
    const pkv_status st = pkv_tuning_parse(ctx, getenv("PKV_TUNING"), t);
    if (st != PKV_OK) return st;
    const char *policy = getenv("PKV_POLICY"); /* unset or empty: no policy file */
    if (policy && strlen(policy) >= sizeof t->policy)
        return pkv_fail(ctx, PKV_ERR_INVALID_ARGUMENT, "PKV_POLICY: the path must have fewer than %d bytes",
                        (int)sizeof t->policy);
    if (policy) snprintf(t->policy, sizeof t->policy, "%s", policy);
    return PKV_OK;
}

bool pkv_tuning_env_cpu_f16c(void) {
    pkv_tuning t;
    pkv_tuning_default(&t);
    return pkv_tuning_parse(NULL, getenv("PKV_TUNING"), &t) == PKV_OK ? t.cpu_f16c : true;
}
