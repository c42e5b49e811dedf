/* fuzz_policy.c - the policy file reader (pkv_cost_model_load, the file PKV_POLICY names) on arbitrary
 * bytes.  What must hold: a file is loaded or refused with PKV_ERR_PARSE / PKV_ERR_IO and a message; a
 * loaded model is one a context accepts (pkv_context_set_cost_model), predicts a number or +inf for a
 * plan's terms (never NaN: no model choice hangs on it), and round-trips: saved and loaded again, then
 * saved again, the two files are the same bytes. */
#include "persistentkv.h"
#include "pkv_lab.h"
#include "fuzz_util.h"

#include <math.h>

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    *n = buf ? fread(buf, 1, 1 << 16, f) : 0;
    fclose(f);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static pkv_context *ctx;
    if (!ctx) {
        pkv_context_config cc;
        pkv_context_config_default(&cc);
        cc.backend = PKV_BACKEND_CPU;
        cc.num_threads = 1;
        if (pkv_context_create(&cc, &ctx) != PKV_OK) abort();
    }
    const char *path = fuzz_write_temp("policy", data, size);
    if (!path) return 0;
    pkv_cost_model m;
    const pkv_status st = pkv_cost_model_load(path, &m);
    if (st != PKV_OK) {
        FUZZ_CHECK(st == PKV_ERR_PARSE || st == PKV_ERR_IO, "status %d: %s", (int)st, pkv_last_error());
        FUZZ_CHECK(strstr(pkv_last_error(), path) != NULL, "message without the file: %s", pkv_last_error());
        return 0;
    }
    FUZZ_CHECK(m.parallelism > 0, "parallelism %d", m.parallelism);
    FUZZ_CHECK(pkv_context_set_cost_model(ctx, &m) == PKV_OK, "a loaded model refused: %s", pkv_last_error());
    FUZZ_CHECK(pkv_context_set_cost_model(ctx, NULL) == PKV_OK, "clearing the model");
    /* a plan's terms: one wave of short tasks, and many waves of long ones */
    double t[PKV_COST_TERMS];
    pkv_cost_fill_terms(t, 2, 50.0, 0.5, 0.01, 64, 264, 48.0, 5.12e-4, 0, 1);
    FUZZ_CHECK(!isnan(pkv_cost_predict(&m, t)), "NaN prediction");
    pkv_cost_fill_terms(t, 1, 5000.0, 20.0, 0.0, 4096, 264, 4900.0, 5.12e-4, 1, 0);
    FUZZ_CHECK(!isnan(pkv_cost_predict(&m, t)), "NaN prediction");
    char a[600], b2[600];
    snprintf(a, sizeof a, "%s.a", path);
    snprintf(b2, sizeof b2, "%s.b", path);
    pkv_cost_model m2;
    FUZZ_CHECK(pkv_cost_model_save(&m, a) == PKV_OK, "save: %s", pkv_last_error());
    FUZZ_CHECK(pkv_cost_model_load(a, &m2) == PKV_OK, "a saved model does not load: %s", pkv_last_error());
    FUZZ_CHECK(pkv_cost_model_save(&m2, b2) == PKV_OK, "save: %s", pkv_last_error());
    size_t na = 0, nb = 0;
    char *fa = slurp(a, &na), *fb = slurp(b2, &nb);
    FUZZ_CHECK(fa && fb && na == nb && memcmp(fa, fb, na) == 0, "saving a loaded model changed it:\n%.*s\nthen\n%.*s",
               (int)na, fa ? fa : "", (int)nb, fb ? fb : "");
    free(fa), free(fb);
    remove(a), remove(b2);
    return 0;
}
