/* test_plan.c - the planner and the plan validator, without running attention:
 *   (a) coverage: thousands of random batches on every route; each plan validates and obeys the
 *       route's rules (launches, merges, slots, counters, workspace bound);
 *   (b) planted bugs: one-field mutations of valid plans that pkv_plan_validate must reject;
 *   (c) the B8 bimodal anchor step (anchor-steps.txt) on the paper shape;
 *   (d) one plan object reused for a bigger, a smaller and a bigger batch again;
 *   (e) pkv_block_table_to_csr conversions and its errors;
 *   (f) planning for given capabilities (pkv_plan_step_caps): the context's plans, the host's, and the
 *       capabilities' residency in the plan;
 *   (g) incremental steps: a plan reused over random step sequences equals, field for field, a fresh plan of
 *       each step, and many of those steps were patched rather than emitted;
 *   (h) plans in a backend's blob memory (simulated): never rewritten while an upload from them is pending. */
#include "persistentkv.h"
#include "internal.h"
#include "pkv_lab.h"
#include "pkv_test.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int32_t bucket_of(int32_t n) {
    int32_t b = 0;
    for (uint32_t x = (uint32_t)n; x; x >>= 1) b++;
    return b;
}

static int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* A batch: lengths and the CSR table (page ids optional). */
typedef struct batch {
    int32_t B;
    int32_t *lens;    // [B]
    int32_t *indptr;  // [B + 1]
    int32_t *pages;   // [indptr[B]] or NULL
    pkv_page_table table;
} batch;

static void batch_free(batch *b) {
    free(b->lens);
    free(b->indptr);
    free(b->pages);
    memset(b, 0, sizeof *b);
}

/* Fills indptr (each row ceil(len / ps) pages, plus one spare page when spare is set for the row
 * by the rng) and, when with_pages, identity page ids; sets problem->num_pages. */
static void batch_make(batch *b, const int32_t *lens, int32_t B, pkv_problem *problem, pkv_rng *rng,
                       bool with_pages) {
    memset(b, 0, sizeof *b);
    b->B = B;
    b->lens = (int32_t *)malloc((size_t)(B + 1) * sizeof(int32_t));
    b->indptr = (int32_t *)malloc((size_t)(B + 1) * sizeof(int32_t));
    b->indptr[0] = 0;
    for (int32_t i = 0; i < B; i++) {
        b->lens[i] = lens[i];
        int64_t pages = ceil_div64(lens[i], problem->page_size);
        if (rng && pkv_rng_uniform01(rng) < 0.1) pages++;
        b->indptr[i + 1] = b->indptr[i] + (int32_t)pages;
    }
    problem->num_pages = b->indptr[B];
    if (with_pages) {
        b->pages = (int32_t *)malloc((size_t)(b->indptr[B] + 1) * sizeof(int32_t));
        for (int32_t j = 0; j < b->indptr[B]; j++) b->pages[j] = b->indptr[B] - 1 - j;
    }
    b->table.batch_size = B;
    b->table.kv_indptr = b->indptr;
    b->table.kv_page_indices = b->pages;
    b->table.seq_lens = b->lens;
}

/* ---- (a) the rules every plan obeys ---------------------------------------------------------------- */
static int rules_failed = 0; /* plans with at least one broken rule (printed for the first few) */

#define RULE(cond, ...)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (rules_failed < 12) {                                                               \
                fprintf(stderr, "case %d (%s): rule failed: %s: ", case_id, pkv_route_name(route), #cond); \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fputc('\n', stderr);                                                               \
            }                                                                                      \
            ok = false;                                                                            \
        }                                                                                          \
    } while (0)

/* The planner's P (src/plan/params.c): parallelism x ctas_per_unit (2 without a context), and, when
 * ctas_per_unit is not forced and the batch is ragged (longest row > 1.25 x the mean) with at least
 * 128 (row, KV head) pairs, 4 waves. */
static int64_t effective_wave(const batch *b, int32_t hkv, const pkv_plan_options *opts) {
    int64_t P = (int64_t)opts->parallelism * (opts->ctas_per_unit > 0 ? opts->ctas_per_unit : 2);
    int64_t nonempty = 0, total = 0, max_len = 0;
    for (int32_t i = 0; i < b->B; i++) {
        nonempty += b->lens[i] > 0;
        total += b->lens[i];
        if (b->lens[i] > max_len) max_len = b->lens[i];
    }
    if (opts->ctas_per_unit <= 0 && nonempty > 0 && 4 * max_len * nonempty > 5 * total) {
        if (nonempty * hkv >= 128) P *= 4; /* resident = wave without a context */
    } else if (opts->ctas_per_unit <= 0 && nonempty * hkv > P) {
        /* even batch over one wave: the split S in 1..4 whose last wave is fullest (a larger S only
         * when its fill is more than 5% better), P = its waves */
        const int64_t u = nonempty * hkv;
        double best_fill = (double)u / (double)(ceil_div64(u, P) * P);
        int64_t waves = 1; /* unsplit: P stays */
        for (int64_t S = 2; S <= 4; S++) {
            const int64_t w = ceil_div64(u * S, P);
            const double fill = (double)(u * S) / (double)(w * P);
            if (fill > best_fill * 1.05 + 1e-12) {
                best_fill = fill;
                waves = w;
            }
        }
        P *= waves;
    }
    return P;
}

/* An even batch just over one wave is split so that its waves are full: 64 rows x 8 KV heads on
 * 100 units x 2 = 200 resident tasks fill 3 waves to 85% unsplit, 4 waves of 1600 to 96% when each
 * pair is split 3 ways. */
static void test_even_batch_waves(void) {
    int32_t lens[64];
    for (int i = 0; i < 64; i++) lens[i] = 8192;
    pkv_problem pb;
    pkv_problem_default(&pb);
    batch b;
    batch_make(&b, lens, 64, &pb, NULL, true);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.parallelism = 100;
    opts.route = PKV_ROUTE_AUTO;
    CHECK_OK(pkv_plan_step_host(&pb, &b.table, &opts, plan));
    CHECK(pkv_plan_route(plan) == PKV_ROUTE_FUSED);
    CHECK(pkv_plan_counters(plan)->tasks == 64 * 8 * 3);
    opts.parallelism = 132; /* 512 pairs on 264: 97% full unsplit, stays single */
    CHECK_OK(pkv_plan_step_host(&pb, &b.table, &opts, plan));
    CHECK(pkv_plan_route(plan) == PKV_ROUTE_SINGLE);
    CHECK(pkv_plan_counters(plan)->tasks == 64 * 8);
    pkv_plan_free(plan);
    batch_free(&b);
}

/* The split route fills at most one wave when the rows have one page count (rows of 32K + 1 tokens:
 * 16 chunks per (row, KV head), not 17), and keeps ceil(P / pairs) splits for ragged rows. */
static void test_split_wave(void) {
    pkv_problem pb;
    pkv_problem_default(&pb); /* Hkv 8, page 16 */
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.parallelism = 132; /* P = 264 */
    opts.route = PKV_ROUTE_SPLIT;
    const int32_t even[2] = {32769, 32769}, ragged[2] = {32769, 20000}, one[1] = {32769};
    const struct {
        const int32_t *lens;
        int32_t B;
        int64_t tasks;
    } cases[] = {{even, 2, 2 * 8 * 16}, {ragged, 2, 2 * 8 * 17}, {one, 1, 8 * 33}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        batch b;
        batch_make(&b, cases[k].lens, cases[k].B, &pb, NULL, false);
        CHECK_OK(pkv_plan_step_host(&pb, &b.table, &opts, plan));
        CHECK_MSG(pkv_plan_counters(plan)->tasks == cases[k].tasks, "split case %zu: %lld tasks, expected %lld", k,
                  (long long)pkv_plan_counters(plan)->tasks, (long long)cases[k].tasks);
        batch_free(&b);
    }
    pkv_plan_free(plan);
}

/* The rectangular routes' contract with the CUDA kernels, which do not read the task list: CTA (row
 * record r, KV head h, split s < num_splits) computes its tokens and slot from the row record alone
 * (src/cuda/decode.cu, load_task): a = tok_begin - tok_begin % page_size, [s > 0 ? a + s chunk :
 * tok_begin, min(a + (s + 1) chunk, seq_len)), slot slot_base + h num_splits + s when split.  The
 * phase's tasks must be exactly those, rows in the phase's order, splits outer, heads inner.  NULL: it
 * holds; else what broke. */
static const char *rect_contract(const pkv_plan *plan) {
    const pkv_route route = pkv_plan_route(plan);
    if (route != PKV_ROUTE_SINGLE && route != PKV_ROUTE_SPLIT && route != PKV_ROUTE_BUCKETED) return NULL;
    static char why[200];
    const pkv_problem *pr = &plan->problem;
    const int32_t hkv = pr->num_kv_heads, ps = pr->page_size;
    const pkv_phase *phases = pkv_plan_phases(plan);
    const pkv_row_sched *rows = pkv_plan_rows(plan);
    const pkv_task *tasks = pkv_plan_tasks(plan);
    for (int32_t k = 0; k < pkv_plan_num_phases(plan); k++) {
        const pkv_phase *ph = &phases[k];
        int32_t t = ph->task_begin;
        for (int32_t r = ph->row_begin; r < ph->row_end; r++) {
            const pkv_row_sched *rs = &rows[r];
            if (rs->num_splits > ph->grid_splits) return "a row has more splits than its phase's grid";
            const int32_t a = rs->tok_begin - rs->tok_begin % ps;
            for (int32_t s = 0; s < rs->num_splits; s++)
                for (int32_t h = 0; h < hkv; h++, t++) {
                    const int32_t tb = s > 0 ? a + s * rs->chunk_tokens : rs->tok_begin;
                    const int32_t te = a + (s + 1) * rs->chunk_tokens < rs->seq_len ? a + (s + 1) * rs->chunk_tokens
                                                                                      : rs->seq_len;
                    const int32_t slot = rs->num_splits > 1 ? rs->slot_base + h * rs->num_splits + s : -1;
                    if (t >= ph->task_end) return "a phase has fewer tasks than its rows' splits";
                    const pkv_task *x = &tasks[t];
                    if (x->row != rs->row || x->kv_head != h || x->tok_begin != tb || x->tok_end != te ||
                        x->state_slot != slot || x->page_base != rs->page_base || tb >= te) {
                        snprintf(why, sizeof why, "row %d head %d split %d: task [%d, %d) slot %d, the kernel's [%d, %d) slot %d",
                                 rs->row, h, s, x->tok_begin, x->tok_end, x->state_slot, tb, te, slot);
                        return why;
                    }
                }
        }
        if (t != ph->task_end) return "a phase has tasks beyond its rows' splits";
    }
    return NULL;
}

static bool check_rules(int case_id, const pkv_problem *pb, const batch *b, const pkv_plan_options *opts,
                        const pkv_plan *plan) {
    bool ok = true;
    const pkv_route route = pkv_plan_route(plan);
    const int32_t B = b->B, hkv = pb->num_kv_heads, G = pb->num_qo_heads / hkv, d = pb->head_dim;
    const int64_t P = effective_wave(b, hkv, opts);

    const char *why = NULL;
    pkv_status vst = pkv_test_validate(plan, b->lens, &why);
    RULE(vst == PKV_OK, "validate: %s", why ? why : "?");
    const char *rc = rect_contract(plan);
    RULE(rc == NULL, "the rect kernels' contract: %s", rc);

    int64_t total = 0, nonempty = 0, empty = 0;
    for (int32_t i = 0; i < B; i++) {
        total += b->lens[i];
        if (b->lens[i] > 0)
            nonempty++;
        else
            empty++;
    }
    if (opts->route == PKV_ROUTE_AUTO) { /* single for even batches that fill a wave, else a work-queue route */
        int64_t max_len = 0;
        for (int32_t i = 0; i < B; i++) max_len = b->lens[i] > max_len ? b->lens[i] : max_len;
        const bool even = 4 * max_len * nonempty <= 5 * total;
        const pkv_route want = nonempty * hkv >= P ? (even ? PKV_ROUTE_SINGLE : PKV_ROUTE_WORKQUEUE)
                               : nonempty == 1 && max_len >= 4096 ? PKV_ROUTE_WORKQUEUE
                                                                   : PKV_ROUTE_FUSED;
        RULE(route == want, "auto picked %s (want %s) for %lld rows x %d KV heads, wave %lld", pkv_route_name(route),
             pkv_route_name(want), (long long)nonempty, hkv, (long long)P);
    }
    else
        RULE(route == opts->route, "route %d", (int)route);

    const int32_t nt = pkv_plan_num_tasks(plan), nm = pkv_plan_num_merges(plan), nph = pkv_plan_num_phases(plan);
    const pkv_task *tasks = pkv_plan_tasks(plan);
    const pkv_merge *merges = pkv_plan_merges(plan);
    const pkv_phase *phases = pkv_plan_phases(plan);
    const pkv_counters *c = pkv_plan_counters(plan);

    /* tasks per (row, KV head); tasks never empty, page_base = indptr[row] */
    int32_t *per_rh = (int32_t *)calloc((size_t)B * (size_t)hkv + 1, sizeof(int32_t));
    int64_t split_tasks = 0;
    bool any_split = false;
    for (int32_t k = 0; k < nt; k++) {
        const pkv_task *t = &tasks[k];
        RULE(t->tok_end > t->tok_begin, "task %d empty [%d, %d)", k, t->tok_begin, t->tok_end);
        if (t->row < 0 || t->row >= B || t->kv_head < 0 || t->kv_head >= hkv) {
            RULE(false, "task %d row/head out of range", k);
            continue;
        }
        RULE(t->page_base == b->indptr[t->row], "task %d page_base %d", k, t->page_base);
        RULE(t->state_slot >= -1 && t->state_slot < pkv_plan_num_state_slots(plan), "task %d slot %d", k,
             t->state_slot);
        per_rh[(int64_t)t->row * hkv + t->kv_head]++;
        if (t->state_slot >= 0) split_tasks++;
    }
    int64_t expected_merges = 0;
    for (int32_t i = 0; i < B; i++)
        for (int32_t h = 0; h < hkv; h++) {
            int32_t n = per_rh[(int64_t)i * hkv + h];
            if (n != 1) expected_merges++;
            if (n > 1) any_split = true;
            RULE((n == 0) == (b->lens[i] == 0), "row %d head %d: %d tasks for %d tokens", i, h, n, b->lens[i]);
        }
    /* merges only for split rows (count = their tasks) and empty rows (count 0) */
    RULE(nm == expected_merges, "%d merges, expected %lld", nm, (long long)expected_merges);
    for (int32_t m = 0; m < nm; m++) {
        const pkv_merge *mg = &merges[m];
        if (mg->row < 0 || mg->row >= B || mg->kv_head < 0 || mg->kv_head >= hkv) {
            RULE(false, "merge %d row/head out of range", m);
            continue;
        }
        int32_t n = per_rh[(int64_t)mg->row * hkv + mg->kv_head];
        RULE(mg->count == n && n != 1, "merge %d counts %d for %d tasks", m, mg->count, n);
        RULE((mg->count == 0) == (b->lens[mg->row] == 0), "merge %d count %d for length %d", m, mg->count,
             b->lens[mg->row]);
        if (mg->count > 0)
            RULE(mg->first_slot >= 0 && mg->first_slot + mg->count <= pkv_plan_num_state_slots(plan),
                 "merge %d slots [%d, +%d)", m, mg->first_slot, mg->count);
    }

    /* counters */
    int64_t launches = 0;
    for (int32_t k = 0; k < nph; k++) {
        if (route == PKV_ROUTE_FUSED) { /* one launch runs the tasks, the merges and the empty rows */
            int32_t empties = 0;
            for (int32_t m = phases[k].merge_begin; m < phases[k].merge_end; m++) empties += merges[m].count == 0;
            launches += phases[k].task_end > phases[k].task_begin || empties > 0;
            continue;
        }
        launches += phases[k].task_end > phases[k].task_begin;
        launches += phases[k].merge_end > phases[k].merge_begin;
    }
    RULE(c->launches == launches, "launches %lld, phases say %lld", (long long)c->launches, (long long)launches);
    RULE(c->tasks == nt, "tasks counter");
    RULE(c->merges == nm, "merges counter");
    RULE(c->total_tokens == total, "total_tokens %lld != %lld", (long long)c->total_tokens, (long long)total);
    RULE(c->kv_bytes == total * hkv * d * 2 * 2, "kv_bytes %lld != %lld", (long long)c->kv_bytes,
         (long long)(total * hkv * d * 2 * 2));
    RULE(c->merge_state_bytes == 2 * split_tasks * G * (d + 1) * 4, "merge_state_bytes");
    RULE(c->qo_bytes == (int64_t)B * pb->num_qo_heads * (d * 2 * 2 + 4), "qo_bytes");
    RULE(pkv_plan_num_rows(plan) == B, "%d rows for B %d", pkv_plan_num_rows(plan), B);
    RULE(pkv_plan_batch_size(plan) == B, "batch size");

    /* route rules */
    if (route == PKV_ROUTE_SINGLE) {
        RULE(pkv_plan_num_state_slots(plan) == 0, "single has %d state slots", pkv_plan_num_state_slots(plan));
        RULE(split_tasks == 0, "single has split tasks");
        RULE(nph == 1, "single has %d phases", nph);
        RULE(nt == nonempty * hkv, "single has %d tasks for %lld rows", nt, (long long)nonempty);
        RULE(c->launches == (nt > 0) + (empty > 0), "single launches %lld, empty rows %lld", (long long)c->launches,
             (long long)empty);
    }
    if (route == PKV_ROUTE_FUSED)
        RULE(c->launches == (nt > 0 || empty > 0), "fused launches %lld", (long long)c->launches);
    if (route == PKV_ROUTE_WORKQUEUE || route == PKV_ROUTE_FUSED) { /* the same task list */
        RULE(nph == 1 && phases[0].grid_splits == 0, "workqueue phases");
        if (any_split && route == PKV_ROUTE_WORKQUEUE)
            RULE(c->launches == 2, "workqueue with splits launches %lld", (long long)c->launches);
        for (int32_t k = 1; k < nt; k++)
            if (tasks[k].tok_end - tasks[k].tok_begin > tasks[k - 1].tok_end - tasks[k - 1].tok_begin) {
                RULE(false, "workqueue task %d longer than task %d", k, k - 1);
                break;
            }
        if (any_split && opts->chunk_pages <= 0) RULE(nt <= P, "workqueue made %d tasks for a wave of %lld", nt, (long long)P);
        if (any_split && opts->chunk_pages <= 0) { /* and the chunk is the smallest that fits (brute force) */
            const int32_t ps = pb->page_size;
            int64_t chunk = 0, max_pages = 0;
            for (int32_t k = 0; k < nt; k++) {
                const int64_t pg = (tasks[k].tok_end - tasks[k].tok_begin + ps - 1) / ps;
                chunk = pg > chunk ? pg : chunk;
            }
            for (int32_t i = 0; i < B; i++) {
                const int64_t pg = (b->lens[i] + ps - 1) / ps;
                max_pages = pg > max_pages ? pg : max_pages;
            }
            const int64_t min_chunk = ((opts->min_chunk_tokens > 0 ? opts->min_chunk_tokens : 128) + ps - 1) / ps;
            const int64_t max_splits = opts->max_splits > 0 ? opts->max_splits : 256;
            int64_t lo = (max_pages + max_splits - 1) / max_splits;
            lo = lo > min_chunk ? lo : min_chunk;
            if (chunk > lo) {
                int64_t count = 0;
                for (int32_t i = 0; i < B; i++) count += ((b->lens[i] + ps - 1) / ps + chunk - 2) / (chunk - 1);
                RULE(count * hkv > P, "workqueue chunk %lld pages: %lld would also fit the wave of %lld", (long long)chunk,
                     (long long)(chunk - 1), (long long)P);
            }
        }
    }
    if (route == PKV_ROUTE_SPLIT) {
        RULE(nph == 1, "split has %d phases", nph);
        const pkv_row_sched *rows = pkv_plan_rows(plan);
        for (int32_t r = 0; r < pkv_plan_num_rows(plan); r++)
            RULE(rows[r].num_splits <= phases[0].grid_splits, "row %d has %d splits, grid %d", rows[r].row,
                 rows[r].num_splits, phases[0].grid_splits);
    }
    if (route == PKV_ROUTE_BUCKETED) {
        bool seen[34] = {false};
        int32_t nb = 0;
        for (int32_t i = 0; i < B; i++)
            if (!seen[bucket_of(b->lens[i])]) {
                seen[bucket_of(b->lens[i])] = true;
                nb++;
            }
        RULE(nph == nb, "bucketed has %d phases for %d buckets", nph, nb);
        const pkv_row_sched *rows = pkv_plan_rows(plan);
        bool all_split = nph > 0;
        for (int32_t k = 0; k < nph; k++) {
            const pkv_phase *ph = &phases[k];
            for (int32_t r = ph->row_begin; r < ph->row_end; r++) {
                RULE(bucket_of(rows[r].seq_len) == bucket_of(rows[ph->row_begin].seq_len), "phase %d mixes buckets", k);
                RULE(rows[r].num_splits <= ph->grid_splits, "row %d has %d splits, grid %d", rows[r].row,
                     rows[r].num_splits, ph->grid_splits);
            }
            bool has_split = false;
            for (int32_t t = ph->task_begin; t < ph->task_end; t++) has_split |= tasks[t].state_slot >= 0;
            all_split &= has_split;
        }
        if (all_split) RULE(c->launches == 2 * nph, "bucketed launches %lld for %d buckets", (long long)c->launches, nph);
    }

    free(per_rh);
    if (!ok) rules_failed++;
    return ok;
}

/* The plan's workspace is within pkv_workspace_size for the same options and max_batch = B. */
static int bound_failed = 0;

static bool check_workspace_bound(int case_id, const pkv_problem *pb, int32_t B, const pkv_plan_options *opts,
                                  const pkv_plan *plan) {
    size_t bound = 0;
    pkv_status st = pkv_workspace_size(NULL, pb, B, opts, &bound);
    bool ok = st == PKV_OK && pkv_plan_workspace_size(plan) <= bound;
    if (!ok && bound_failed++ < 6)
        fprintf(stderr,
                "case %d (%s, options route %s): workspace %zu > bound %zu (status %d; B %d Hkv %d G %d d %d, "
                "parallelism %d x %d, num_splits %d, chunk_pages %d, max_splits %d; plan: %d tasks, %d merges, "
                "%d state slots, %d phases)\n",
                case_id, pkv_route_name(pkv_plan_route(plan)), pkv_route_name(opts->route),
                pkv_plan_workspace_size(plan), bound, (int)st, B, pb->num_kv_heads,
                pb->num_qo_heads / pb->num_kv_heads, pb->head_dim, opts->parallelism, opts->ctas_per_unit,
                opts->num_splits, opts->chunk_pages, opts->max_splits, pkv_plan_num_tasks(plan),
                pkv_plan_num_merges(plan), pkv_plan_num_state_slots(plan), pkv_plan_num_phases(plan));
    return ok;
}

static void test_coverage(void) {
    static const int32_t kv_heads[] = {1, 2, 4, 8, 32}, page_sizes[] = {1, 16, 64, 256}, dims[] = {64, 128, 256},
                         pars[] = {2, 8, 132}, ctas[] = {0, 1, 2, 4};
    const int cases = 3000;
    pkv_rng rng;
    pkv_rng_seed(&rng, 20260701);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    int32_t lens[64];
    int route_count[PKV_ROUTE_COUNT_] = {0}, good = 0, within_bound = 0;
    for (int case_id = 0; case_id < cases; case_id++) {
        pkv_problem pb;
        pkv_problem_default(&pb);
        pb.num_kv_heads = kv_heads[pkv_rng_uniform_int(&rng, 0, 4)];
        pb.num_qo_heads = pb.num_kv_heads * (int32_t)pkv_rng_uniform_int(&rng, 1, 16);
        pb.page_size = page_sizes[pkv_rng_uniform_int(&rng, 0, 3)];
        pb.head_dim = dims[pkv_rng_uniform_int(&rng, 0, 2)];
        pb.dtype = pkv_rng_uniform01(&rng) < 0.5 ? PKV_DTYPE_FP16 : PKV_DTYPE_BF16;
        int32_t B = (int32_t)pkv_rng_uniform_int(&rng, 0, 64);
        double shape = pkv_rng_uniform01(&rng);
        int32_t same = (int32_t)pkv_rng_uniform_int(&rng, 1, 70000);
        for (int32_t i = 0; i < B; i++) {
            double u = pkv_rng_uniform01(&rng);
            if (shape < 0.1)
                lens[i] = same; /* homogeneous batch */
            else if (u < 0.1)
                lens[i] = 0;
            else if (u < 0.2)
                lens[i] = 1;
            else if (u < 0.5)
                lens[i] = (int32_t)pkv_rng_uniform_int(&rng, 2, 3000);
            else
                lens[i] = (int32_t)pkv_rng_uniform_int(&rng, 2, 70000);
        }
        batch b;
        batch_make(&b, lens, B, &pb, &rng, pkv_rng_uniform01(&rng) < 0.1);
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = (pkv_route)pkv_rng_uniform_int(&rng, 0, PKV_ROUTE_COUNT_ - 1);
        opts.parallelism = pars[pkv_rng_uniform_int(&rng, 0, 2)];
        opts.ctas_per_unit = ctas[pkv_rng_uniform_int(&rng, 0, 3)];
        if (pkv_rng_uniform01(&rng) < 0.2) opts.num_splits = (int32_t)pkv_rng_uniform_int(&rng, 1, 64);
        if (pkv_rng_uniform01(&rng) < 0.2) opts.chunk_pages = (int32_t)pkv_rng_uniform_int(&rng, 1, 512);
        if (pkv_rng_uniform01(&rng) < 0.15) opts.min_chunk_tokens = (int32_t)pkv_rng_uniform_int(&rng, 1, 4096);
        if (pkv_rng_uniform01(&rng) < 0.15) opts.max_splits = (int32_t)pkv_rng_uniform_int(&rng, 1, 64);
        pkv_status st = pkv_plan_step_host(&pb, &b.table, &opts, plan);
        CHECK_MSG(st == PKV_OK, "case %d: pkv_plan_host: %s", case_id, pkv_last_error());
        if (st == PKV_OK) {
            route_count[pkv_plan_route(plan)]++;
            good += check_rules(case_id, &pb, &b, &opts, plan);
            within_bound += check_workspace_bound(case_id, &pb, B, &opts, plan);
        }
        batch_free(&b);
    }
    CHECK_MSG(good == cases, "%d of %d random plans broke a rule", cases - good, cases);
    CHECK_MSG(within_bound == cases, "%d of %d random plans need more workspace than pkv_workspace_size says",
              cases - within_bound, cases);
    for (int r = 1; r < PKV_ROUTE_COUNT_; r++)
        CHECK_MSG(route_count[r] > cases / 10, "route %s planned only %d times", pkv_route_name((pkv_route)r),
                  route_count[r]);
    printf("coverage: %d random batches, %d obeyed every rule, %d within the workspace bound; plans per route:", cases,
           good, within_bound);
    for (int r = 1; r < PKV_ROUTE_COUNT_; r++) printf(" %s %d", pkv_route_name((pkv_route)r), route_count[r]);
    printf("\n");
    pkv_plan_free(plan);
}

/* ---- (b) planted bugs ------------------------------------------------------------------------------ */
typedef struct plan_snapshot {
    pkv_task *tasks;
    pkv_merge *merges;
    pkv_phase *phases;
    int32_t num_tasks, num_merges, num_phases, num_state_slots;
    pkv_counters counters;
} plan_snapshot;

static void snapshot_take(plan_snapshot *s, const pkv_plan *p) {
    s->tasks = (pkv_task *)malloc(((size_t)p->num_tasks + 1) * sizeof(pkv_task));
    s->merges = (pkv_merge *)malloc(((size_t)p->num_merges + 1) * sizeof(pkv_merge));
    s->phases = (pkv_phase *)malloc(((size_t)p->num_phases + 1) * sizeof(pkv_phase));
    memcpy(s->tasks, p->tasks, (size_t)p->num_tasks * sizeof(pkv_task));
    memcpy(s->merges, p->merges, (size_t)p->num_merges * sizeof(pkv_merge));
    memcpy(s->phases, p->phases, (size_t)p->num_phases * sizeof(pkv_phase));
    s->num_tasks = p->num_tasks;
    s->num_merges = p->num_merges;
    s->num_phases = p->num_phases;
    s->num_state_slots = p->num_state_slots;
    s->counters = p->counters;
}

static void snapshot_restore(const plan_snapshot *s, pkv_plan *p) {
    memcpy(p->tasks, s->tasks, (size_t)s->num_tasks * sizeof(pkv_task));
    memcpy(p->merges, s->merges, (size_t)s->num_merges * sizeof(pkv_merge));
    memcpy(p->phases, s->phases, (size_t)s->num_phases * sizeof(pkv_phase));
    p->num_tasks = s->num_tasks;
    p->num_merges = s->num_merges;
    p->num_phases = s->num_phases;
    p->num_state_slots = s->num_state_slots;
    p->counters = s->counters;
}

static void snapshot_free(plan_snapshot *s) {
    free(s->tasks);
    free(s->merges);
    free(s->phases);
}

static int mutations_tried = 0;

/* Validates the mutated plan (must fail with a message), then restores it (must pass again). */
static void expect_rejected(pkv_plan *plan, const plan_snapshot *snap, const int32_t *lens, const char *route,
                            const char *what, int32_t index) {
    const char *why = NULL;
    pkv_status st = pkv_test_validate(plan, lens, &why);
    CHECK_MSG(st != PKV_OK, "%s: mutation '%s' at %d was not detected", route, what, index);
    CHECK_MSG(st == PKV_OK || (why && why[0]), "%s: mutation '%s' rejected without a message", route, what);
    mutations_tried++;
    snapshot_restore(snap, plan);
    CHECK_MSG(pkv_test_validate(plan, lens, &why) == PKV_OK, "%s: restored plan invalid: %s", route, why);
}

static void mutate_plan(pkv_plan *plan, const int32_t *lens, const char *route) {
    plan_snapshot snap;
    snapshot_take(&snap, plan);
    const int32_t nt = plan->num_tasks, nm = plan->num_merges, hkv = plan->problem.num_kv_heads;
    const int32_t B = plan->batch_size;
    pkv_task *T = plan->tasks;
    /* task indices to mutate: first, middle, last, the first split task and the first whole-row task */
    int32_t picks[5] = {0, nt / 2, nt - 1, -1, -1};
    for (int32_t k = 0; k < nt; k++) {
        if (picks[3] < 0 && T[k].state_slot >= 0) picks[3] = k;
        if (picks[4] < 0 && T[k].state_slot < 0) picks[4] = k;
    }
    for (int pi = 0; pi < 5; pi++) {
        int32_t k = picks[pi];
        if (k < 0 || k >= nt) continue;
        T[k].tok_end += 1;
        expect_rejected(plan, &snap, lens, route, "tok_end += 1", k);
        T[k].tok_end -= 1;
        expect_rejected(plan, &snap, lens, route, "tok_end -= 1", k);
        T[k].tok_begin -= 1;
        expect_rejected(plan, &snap, lens, route, "tok_begin -= 1", k);
        T[k].tok_begin += 1;
        expect_rejected(plan, &snap, lens, route, "tok_begin += 1", k);
        if (hkv > 1) {
            T[k].kv_head = (T[k].kv_head + 1) % hkv;
            expect_rejected(plan, &snap, lens, route, "kv_head changed", k);
        }
        if (B > 1) {
            T[k].row = (T[k].row + 1) % B;
            expect_rejected(plan, &snap, lens, route, "row changed", k);
        }
        if (T[k].state_slot >= 0) {
            T[k].state_slot = -1;
            expect_rejected(plan, &snap, lens, route, "split task writes o directly", k);
            T[k].state_slot = plan->num_state_slots;
            expect_rejected(plan, &snap, lens, route, "slot out of range", k);
            /* swap slots with another split task of the same (row, head), then of another one */
            for (int32_t j = 0; j < nt; j++) {
                if (j == k || T[j].state_slot < 0 || T[j].row != T[k].row || T[j].kv_head != T[k].kv_head) continue;
                int32_t s = T[j].state_slot;
                T[j].state_slot = T[k].state_slot;
                T[k].state_slot = s;
                expect_rejected(plan, &snap, lens, route, "slots swapped within a row", k);
                break;
            }
            for (int32_t j = 0; j < nt; j++) {
                if (T[j].state_slot < 0 || (T[j].row == T[k].row && T[j].kv_head == T[k].kv_head)) continue;
                int32_t s = T[j].state_slot;
                T[j].state_slot = T[k].state_slot;
                T[k].state_slot = s;
                expect_rejected(plan, &snap, lens, route, "slots swapped between rows", k);
                break;
            }
        } else {
            T[k].state_slot = 0;
            expect_rejected(plan, &snap, lens, route, "whole-row task writes a partial state", k);
        }
        /* a duplicate of another task in place of this one */
        int32_t other = (k + 1) % nt;
        if (other != k) {
            T[k] = T[other];
            expect_rejected(plan, &snap, lens, route, "task replaced by a duplicate", k);
        }
        /* the task dropped from the list (last task moved into its place) */
        T[k] = T[nt - 1];
        plan->num_tasks = nt - 1;
        plan->phases[plan->num_phases - 1].task_end -= 1;
        plan->counters.tasks -= 1;
        expect_rejected(plan, &snap, lens, route, "task dropped", k);
    }
    /* a phase that forgets its last task */
    if (nt > 0) {
        for (int32_t ph = 0; ph < plan->num_phases; ph++) {
            if (plan->phases[ph].task_end == plan->phases[ph].task_begin) continue;
            plan->phases[ph].task_end -= 1;
            expect_rejected(plan, &snap, lens, route, "phase task_end -= 1", ph);
        }
    }
    /* a split task moved into the next phase (bucketed) */
    for (int32_t ph = 0; ph + 1 < plan->num_phases; ph++) {
        const pkv_phase *a = &plan->phases[ph];
        if (a->task_end > a->task_begin && T[a->task_end - 1].state_slot >= 0) {
            plan->phases[ph].task_end -= 1;
            plan->phases[ph + 1].task_begin -= 1;
            expect_rejected(plan, &snap, lens, route, "split task moved to the next phase", ph);
        }
    }
    /* merges */
    for (int32_t m = 0; m < nm; m++) {
        pkv_merge *M = &plan->merges[m];
        M->count += 1;
        expect_rejected(plan, &snap, lens, route, "merge count += 1", m);
        if (M->count > 0) {
            M->count -= 1;
            expect_rejected(plan, &snap, lens, route, "merge count -= 1", m);
            M->first_slot += 1;
            expect_rejected(plan, &snap, lens, route, "merge first_slot += 1", m);
        }
        if (B > 1) {
            M->row = (M->row + 1) % B;
            expect_rejected(plan, &snap, lens, route, "merge row changed", m);
        }
        if (m == 0 || m == nm - 1) {
            plan->merges[m] = plan->merges[nm - 1];
            plan->num_merges = nm - 1;
            plan->phases[plan->num_phases - 1].merge_end -= 1;
            expect_rejected(plan, &snap, lens, route, "merge dropped", m);
        }
        if (m > 4 && m < nm - 2) m += nm / 8; /* a sample is enough on long lists */
    }
    /* counters */
    plan->counters.kv_bytes += 2;
    expect_rejected(plan, &snap, lens, route, "kv_bytes counter", 0);
    plan->counters.tasks += 1;
    expect_rejected(plan, &snap, lens, route, "tasks counter", 0);
    plan->counters.merge_state_bytes += 4;
    expect_rejected(plan, &snap, lens, route, "merge_state_bytes counter", 0);
    snapshot_free(&snap);
}

static void test_mutations(void) {
    static const int32_t lens[] = {0, 1, 500, 3000, 7000, 16, 17, 12000, 129, 0, 2048};
    const int32_t B = (int32_t)(sizeof lens / sizeof lens[0]);
    pkv_problem pb;
    pkv_problem_default(&pb);
    pb.num_qo_heads = 8;
    pb.num_kv_heads = 2;
    batch b;
    batch_make(&b, lens, B, &pb, NULL, true);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    for (int r = PKV_ROUTE_SINGLE; r < PKV_ROUTE_COUNT_; r++) {
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = (pkv_route)r;
        opts.parallelism = 16;
        CHECK_OK(pkv_plan_step_host(&pb, &b.table, &opts, plan));
        const char *why = NULL;
        CHECK_MSG(pkv_test_validate(plan, lens, &why) == PKV_OK, "%s: %s", pkv_route_name((pkv_route)r), why);
        if (r != PKV_ROUTE_SINGLE)
            CHECK_MSG(pkv_plan_num_state_slots(plan) > 0, "%s plan has no split", pkv_route_name((pkv_route)r));
        if (r == PKV_ROUTE_BUCKETED) CHECK(pkv_plan_num_phases(plan) > 2);
        mutate_plan(plan, lens, pkv_route_name((pkv_route)r));
    }
    /* NULL arguments */
    const char *why = NULL;
    CHECK_STATUS(pkv_test_validate(NULL, lens, &why), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_test_validate(plan, NULL, &why), PKV_ERR_NULL_POINTER);
    printf("mutations: %d planted bugs tried\n", mutations_tried);
    pkv_plan_free(plan);
    batch_free(&b);
}

/* ---- (c) the B8 bimodal anchor step -------------------------------------------------------------- */
static void test_anchor_b8_bimodal(void) {
    static const int32_t lens[] = {910, 539, 29200, 1006, 553, 839, 567, 27555};
    pkv_problem pb;
    pkv_problem_default(&pb); /* paper shape: Hq 32, Hkv 8, d 128, page 16, fp16 */
    batch b;
    batch_make(&b, lens, 8, &pb, NULL, true);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.parallelism = 132;
    opts.ctas_per_unit = 2;
    int64_t total = 0;
    for (int i = 0; i < 8; i++) total += lens[i];
    CHECK(total == 61169);
    for (int r = PKV_ROUTE_AUTO; r < PKV_ROUTE_COUNT_; r++) {
        opts.route = (pkv_route)r;
        CHECK_OK(pkv_plan_step_host(&pb, &b.table, &opts, plan));
        const char *why = NULL;
        CHECK_MSG(pkv_test_validate(plan, lens, &why) == PKV_OK, "%s", why);
        const pkv_counters *c = pkv_plan_counters(plan);
        CHECK(c->kv_bytes == total * 8 * 128 * 2 * 2);
        CHECK(c->kv_bytes == 250548224); /* anchor-steps.txt: kv_MB = 250.55 */
        switch (r) {
        case PKV_ROUTE_AUTO:
            CHECK(pkv_plan_route(plan) == PKV_ROUTE_WORKQUEUE || pkv_plan_route(plan) == PKV_ROUTE_FUSED);
            break;
        case PKV_ROUTE_SINGLE:
            CHECK(c->launches == 1);
            CHECK(c->tasks == 64);
            break;
        case PKV_ROUTE_SPLIT: CHECK(c->launches == 2); break;
        case PKV_ROUTE_BUCKETED: {
            /* buckets floor(log2 N) + 1: 10 (six short rows) and 15 (two long rows), both split */
            CHECK(pkv_plan_num_phases(plan) == 2);
            int32_t nonempty_buckets = 0;
            for (int32_t k = 0; k < pkv_plan_num_phases(plan); k++) {
                const pkv_phase *ph = &pkv_plan_phases(plan)[k];
                nonempty_buckets += ph->row_end > ph->row_begin;
                CHECK(ph->merge_end > ph->merge_begin);
            }
            CHECK(nonempty_buckets == 2);
            CHECK_MSG(c->launches == 2 * nonempty_buckets, "bucketed launches %lld", (long long)c->launches);
            break;
        }
        case PKV_ROUTE_WORKQUEUE:
            CHECK_MSG(c->launches == 2, "workqueue launches %lld", (long long)c->launches);
            CHECK(c->tasks <= 264);
            CHECK(c->tasks > 64);
            break;
        case PKV_ROUTE_FUSED:
            CHECK_MSG(c->launches == 1, "fused launches %lld", (long long)c->launches);
            CHECK(c->tasks <= 264);
            CHECK(c->tasks > 64);
            break;
        default: CHECK_MSG(false, "route %d not covered by the anchor test", r); break;
        }
    }
    pkv_plan_free(plan);
    batch_free(&b);
}

/* ---- (d) plan reuse ---------------------------------------------------------------------------------- */
static bool plans_equal(const pkv_plan *a, const pkv_plan *b) {
    if (a->num_tasks != b->num_tasks || a->num_merges != b->num_merges || a->num_phases != b->num_phases ||
        a->num_rows != b->num_rows || a->num_state_slots != b->num_state_slots || a->route != b->route ||
        a->workspace_bytes != b->workspace_bytes)
        return false;
    if (memcmp(&a->counters, &b->counters, sizeof a->counters) != 0) return false;
    if (a->num_tasks && memcmp(a->tasks, b->tasks, (size_t)a->num_tasks * sizeof(pkv_task)) != 0) return false;
    if (a->num_merges && memcmp(a->merges, b->merges, (size_t)a->num_merges * sizeof(pkv_merge)) != 0) return false;
    if (a->num_rows && memcmp(a->rows, b->rows, (size_t)a->num_rows * sizeof(pkv_row_sched)) != 0) return false;
    return memcmp(a->phases, b->phases, (size_t)a->num_phases * sizeof(pkv_phase)) == 0;
}

/* Extreme options on the rectangular routes: a min_chunk_tokens of INT32_MAX with an empty row once
 * made that row's chunk (min_chunk pages x page size) overflow int32 (found by test_fuzz's predecessor
 * under UBSan); every row record's chunk must stay a positive token count. */
static void test_extreme_options(void) {
    pkv_problem pb;
    pkv_problem_default(&pb);
    pb.page_size = 13;
    const int32_t lens[3] = {0, 500, 7};
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    for (int route = PKV_ROUTE_SINGLE; route <= PKV_ROUTE_BUCKETED; route++)
        for (int k = 0; k < 3; k++) {
            batch b;
            batch_make(&b, lens, 3, &pb, NULL, false);
            pkv_plan_options o;
            pkv_plan_options_default(&o);
            o.route = (pkv_route)route;
            o.parallelism = 132;
            o.min_chunk_tokens = k == 0 ? INT32_MAX : k == 1 ? INT32_MAX - 12 : 1;
            o.num_splits = k == 2 ? INT32_MAX : 4; /* forced splits: a huge min chunk does not reduce S */
            CHECK_OK(pkv_plan_step_host(&pb, &b.table, &o, plan));
            const pkv_row_sched *rows = pkv_plan_rows(plan);
            for (int32_t r = 0; r < pkv_plan_num_rows(plan); r++)
                CHECK_MSG(rows[r].chunk_tokens >= 1 && rows[r].chunk_tokens <= 500 + 13,
                          "%s, min chunk %d: row %d chunk %d tokens", pkv_route_name((pkv_route)route), o.min_chunk_tokens,
                          rows[r].row, rows[r].chunk_tokens);
            const char *why = NULL;
            CHECK_MSG(pkv_test_validate(plan, lens, &why) == PKV_OK, "%s", why);
            batch_free(&b);
        }
    pkv_plan_free(plan);
}

static void test_plan_reuse(void) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 7);
    int32_t big[64], small[3] = {5000, 0, 1};
    for (int i = 0; i < 64; i++) big[i] = (int32_t)pkv_rng_uniform_int(&rng, 0, 40000);
    pkv_problem pb;
    pkv_problem_default(&pb);
    pkv_problem pb_big = pb, pb_small = pb;
    batch bb, bs;
    batch_make(&bb, big, 64, &pb_big, NULL, true);
    batch_make(&bs, small, 3, &pb_small, NULL, true);
    pkv_plan *reused = NULL, *fresh = NULL;
    CHECK_OK(pkv_plan_create(&reused));
    for (int r = PKV_ROUTE_AUTO; r < PKV_ROUTE_COUNT_; r++) {
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = (pkv_route)r;
        opts.parallelism = 132;
        opts.num_splits = r == PKV_ROUTE_SPLIT ? 9 : 0;
        const batch *seq[3] = {&bb, &bs, &bb};
        const pkv_problem *pbs[3] = {&pb_big, &pb_small, &pb_big};
        for (int s = 0; s < 3; s++) {
            CHECK_OK(pkv_plan_step_host(pbs[s], &seq[s]->table, &opts, reused));
            const char *why = NULL;
            CHECK_MSG(pkv_test_validate(reused, seq[s]->lens, &why) == PKV_OK, "reuse %s step %d: %s",
                      pkv_route_name((pkv_route)r), s, why);
            CHECK_OK(pkv_plan_create(&fresh));
            CHECK_OK(pkv_plan_step_host(pbs[s], &seq[s]->table, &opts, fresh));
            CHECK_MSG(plans_equal(reused, fresh), "reused plan differs from a fresh one (%s, step %d)",
                      pkv_route_name((pkv_route)r), s);
            CHECK(pkv_plan_batch_size(reused) == seq[s]->B);
            pkv_plan_free(fresh);
            fresh = NULL;
        }
    }
    /* a failed plan call leaves a usable plan object behind for the next call */
    int32_t bad_lens[2] = {5, -1};
    int32_t bad_indptr[3] = {0, 1, 2};
    pkv_page_table bad = {2, bad_indptr, NULL, bad_lens};
    CHECK_STATUS(pkv_plan_step_host(&pb_small, &bad, NULL, reused), PKV_ERR_NEGATIVE_LENGTH);
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.parallelism = 8;
    CHECK_OK(pkv_plan_step_host(&pb_small, &bs.table, &opts, reused));
    CHECK(pkv_test_validate(reused, bs.lens, NULL) == PKV_OK);

    /* the planner through a CPU context uses its parallelism and ctas_per_unit */
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 3;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cfg, &ctx));
    if (ctx) {
        CHECK(pkv_context_parallelism(ctx) == 3);
        pkv_plan_options_default(&opts);
        opts.route = PKV_ROUTE_WORKQUEUE;
        CHECK_OK(pkv_plan_step(ctx, &pb_small, &bs.table, &opts, reused));
        CHECK(pkv_test_validate(reused, bs.lens, NULL) == PKV_OK);
        CHECK_MSG(pkv_plan_num_tasks(reused) <= 4 * 3 * 4 || pkv_plan_num_state_slots(reused) == 0, "%d tasks",
                  pkv_plan_num_tasks(reused)); /* at most 4 waves of 3 threads x 4 */
        size_t bound = 0;
        CHECK_OK(pkv_workspace_size(ctx, &pb_small, 3, &opts, &bound));
        CHECK(pkv_plan_workspace_size(reused) <= bound);
        pkv_context_free(ctx);
    }
    pkv_plan_free(reused);
    batch_free(&bb);
    batch_free(&bs);
}

/* ---- (e) block tables ------------------------------------------------------------------------------- */
static void test_block_table(void) {
    /* B 4, max_pages 4, page size 16; lengths 0, 17, 64, 1 -> 0, 2, 4, 1 pages */
    const int32_t table[4 * 4] = {90, 91, 92, 93, 10, 11, -5, -5, 20, 21, 22, 23, 30, 77, 77, 77};
    const int32_t lens[4] = {0, 17, 64, 1};
    int32_t indptr[5] = {-1, -1, -1, -1, -1}, idx[16];
    memset(idx, 0xff, sizeof idx);
    CHECK_OK(pkv_block_table_to_csr(table, 4, 4, lens, 16, indptr, idx, 16));
    const int32_t want_indptr[5] = {0, 0, 2, 6, 7}, want_idx[7] = {10, 11, 20, 21, 22, 23, 30};
    CHECK(memcmp(indptr, want_indptr, sizeof want_indptr) == 0);
    CHECK(memcmp(idx, want_idx, sizeof want_idx) == 0);
    CHECK(idx[7] == -1); /* nothing written past the last page */
    /* the result is a valid page table */
    pkv_problem pb;
    pkv_problem_default(&pb);
    pb.num_pages = 100;
    pkv_page_table t = {4, indptr, idx, lens};
    CHECK_OK(pkv_check_page_table(&pb, &t));
    /* exact capacity works, one less fails */
    CHECK_OK(pkv_block_table_to_csr(table, 4, 4, lens, 16, indptr, idx, 7));
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, 4, lens, 16, indptr, idx, 6), PKV_ERR_INVALID_ARGUMENT);
    CHECK(pkv_last_error()[0] != '\0');
    /* page size 1: one page per token */
    const int32_t lens1[2] = {3, 2};
    const int32_t table1[2 * 3] = {5, 6, 7, 8, 9, 99};
    CHECK_OK(pkv_block_table_to_csr(table1, 2, 3, lens1, 1, indptr, idx, 16));
    CHECK(indptr[0] == 0 && indptr[1] == 3 && indptr[2] == 5);
    CHECK(idx[0] == 5 && idx[2] == 7 && idx[3] == 8 && idx[4] == 9);
    /* empty batch */
    indptr[0] = -1;
    CHECK_OK(pkv_block_table_to_csr(table, 0, 4, lens, 16, indptr, idx, 0));
    CHECK(indptr[0] == 0);
    /* errors */
    const int32_t long_lens[4] = {0, 17, 65, 1}; /* 65 tokens need 5 pages of 16 */
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, 4, long_lens, 16, indptr, idx, 16), PKV_ERR_LENGTH_EXCEEDS_PAGES);
    CHECK(pkv_last_error()[0] != '\0');
    const int32_t neg_lens[4] = {0, -17, 64, 1};
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, 4, neg_lens, 16, indptr, idx, 16), PKV_ERR_NEGATIVE_LENGTH);
    CHECK_STATUS(pkv_block_table_to_csr(NULL, 4, 4, lens, 16, indptr, idx, 16), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, 4, NULL, 16, indptr, idx, 16), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, 4, lens, 16, NULL, idx, 16), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, 4, lens, 16, indptr, NULL, 16), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_block_table_to_csr(table, -1, 4, lens, 16, indptr, idx, 16), PKV_ERR_BATCH_SIZE);
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, -1, lens, 16, indptr, idx, 16), PKV_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, 4, lens, 0, indptr, idx, 16), PKV_ERR_PAGE_SIZE);
    CHECK_STATUS(pkv_block_table_to_csr(table, 4, 4, lens, 257, indptr, idx, 16), PKV_ERR_PAGE_SIZE);
}

/* An empty batch on a plan never used before, each route and window on and off: a plan (no tasks) that
 * validates.  The planner's first use of its scratch used to offset a NULL buffer by B = 0, which UBSan
 * reports (the fuzz_plan run in CI found it). */
static void test_empty_batch_fresh_plan(void) {
    const int32_t indptr[1] = {0}, lens[1] = {0}, ids[1] = {0};
    for (int w = 0; w < 2; w++) {
        for (int r = PKV_ROUTE_AUTO; r < PKV_ROUTE_COUNT_; r++) {
            pkv_problem pb;
            pkv_problem_default(&pb);
            pb.window = w ? 64 : 0;
            pkv_page_table t = {0, indptr, ids, lens};
            pkv_plan_options opts;
            pkv_plan_options_default(&opts);
            opts.route = (pkv_route)r;
            opts.parallelism = 132;
            pkv_plan *plan = NULL;
            CHECK_OK(pkv_plan_create(&plan));
            CHECK_OK(pkv_plan_step_host(&pb, &t, &opts, plan));
            const char *why = NULL;
            CHECK_MSG(pkv_test_validate(plan, lens, &why) == PKV_OK, "empty batch, route %d: %s", r, why);
            CHECK(pkv_plan_num_tasks(plan) == 0);
            pkv_plan_free(plan);
        }
    }
}

/* ---- route names -------------------------------------------------------------------------------------- */
static void test_route_names(void) {
    for (int r = 0; r < PKV_ROUTE_COUNT_; r++) {
        pkv_route parsed = PKV_ROUTE_COUNT_;
        CHECK_OK(pkv_route_parse(pkv_route_name((pkv_route)r), &parsed));
        CHECK(parsed == (pkv_route)r);
    }
    CHECK(strcmp(pkv_route_name(PKV_ROUTE_WORKQUEUE), "workqueue") == 0);
    CHECK(strcmp(pkv_route_name((pkv_route)42), "unknown") == 0);
}

/* A sliding window: the plan of a windowed step is the plan of its attended lengths with every task
 * and row shifted to the window's start (same route, slots, merges and counters), and it covers
 * exactly [max(0, n - W), n) of each row. */
static void test_window(void) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 4096);
    pkv_plan *pw = NULL, *pe = NULL;
    CHECK_OK(pkv_plan_create(&pw));
    CHECK_OK(pkv_plan_create(&pe));
    int32_t lens[40], eff[40];
    static const int32_t windows[] = {1, 7, 16, 100, 4096, 70000};
    for (int case_id = 0; case_id < 400; case_id++) {
        pkv_problem pb;
        pkv_problem_default(&pb);
        pb.num_kv_heads = 1 << pkv_rng_uniform_int(&rng, 0, 3);
        pb.num_qo_heads = pb.num_kv_heads * (int32_t)pkv_rng_uniform_int(&rng, 1, 8);
        pb.page_size = (int32_t)pkv_rng_uniform_int(&rng, 0, 1) ? 16 : (int32_t)pkv_rng_uniform_int(&rng, 1, 64);
        int32_t B = (int32_t)pkv_rng_uniform_int(&rng, 1, 40);
        for (int32_t i = 0; i < B; i++)
            lens[i] = pkv_rng_uniform01(&rng) < 0.1 ? 0 : (int32_t)pkv_rng_uniform_int(&rng, 1, 40000);
        batch b;
        batch_make(&b, lens, B, &pb, &rng, false);
        pkv_problem pw_prob = pb;
        pw_prob.window = windows[pkv_rng_uniform_int(&rng, 0, 5)];
        /* a windowed row is planned from the page that holds its first attended token (aligned
         * split boundaries): its plan is that of the row from there, shifted, with the first task of
         * each (row, KV head) starting at the window */
        int64_t attended = 0;
        for (int32_t i = 0; i < B; i++) {
            const int32_t s0 = pkv_row_start(&pw_prob, lens[i]);
            eff[i] = lens[i] - (s0 - s0 % pb.page_size);
            attended += lens[i] - s0;
        }
        pkv_page_table te = b.table;
        te.seq_lens = eff;
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = (pkv_route)pkv_rng_uniform_int(&rng, 0, PKV_ROUTE_COUNT_ - 1);
        opts.parallelism = pkv_rng_uniform01(&rng) < 0.5 ? 132 : 8;
        CHECK_OK(pkv_plan_step_host(&pw_prob, &b.table, &opts, pw));
        CHECK_OK(pkv_plan_step_host(&pb, &te, &opts, pe));
        const char *why = NULL;
        CHECK_MSG(pkv_test_validate(pw, lens, &why) == PKV_OK, "window case %d (W %d, %s): %s", case_id,
                  pw_prob.window, pkv_route_name(opts.route), why);
        const char *rc = rect_contract(pw);
        CHECK_MSG(rc == NULL, "window case %d (W %d, %s): the rect kernels' contract: %s", case_id, pw_prob.window,
                  pkv_route_name(opts.route), rc);
        const int32_t nt = pkv_plan_num_tasks(pw);
        CHECK_MSG(pkv_plan_route(pw) == pkv_plan_route(pe) && nt == pkv_plan_num_tasks(pe) &&
                      pkv_plan_num_merges(pw) == pkv_plan_num_merges(pe) &&
                      pkv_plan_num_state_slots(pw) == pkv_plan_num_state_slots(pe),
                  "window case %d: the windowed plan is not the aligned lengths' plan", case_id);
        const pkv_task *tw = pkv_plan_tasks(pw), *tq = pkv_plan_tasks(pe);
        bool same = nt == pkv_plan_num_tasks(pe);
        for (int32_t k = 0; same && k < nt; k++) {
            const int32_t s0 = pkv_row_start(&pw_prob, lens[tw[k].row]), a = s0 - s0 % pb.page_size;
            same = tw[k].row == tq[k].row && tw[k].kv_head == tq[k].kv_head && tw[k].state_slot == tq[k].state_slot &&
                   tw[k].merge == tq[k].merge && tw[k].page_base == tq[k].page_base &&
                   tw[k].tok_begin == (tq[k].tok_begin == 0 ? s0 : tq[k].tok_begin + a) &&
                   tw[k].tok_end == tq[k].tok_end + a;
            /* every split but a row's first starts on a page boundary */
            same = same && (tw[k].tok_begin == s0 || tw[k].tok_begin % pb.page_size == 0);
        }
        CHECK_MSG(same, "window case %d: tasks differ from the aligned lengths' plan shifted to the window", case_id);
        const pkv_counters *cw = pkv_plan_counters(pw), *ce = pkv_plan_counters(pe);
        const int64_t tok_bytes = (int64_t)pb.num_kv_heads * pb.head_dim * 2 * 2;
        CHECK(cw->kv_bytes == attended * tok_bytes && cw->total_tokens == attended && cw->launches == ce->launches);
        const pkv_row_sched *rw = pkv_plan_rows(pw);
        for (int32_t r = 0; r < pkv_plan_num_rows(pw); r++)
            CHECK(rw[r].tok_begin == pkv_row_start(&pw_prob, lens[rw[r].row]) && rw[r].seq_len == lens[rw[r].row]);
        batch_free(&b);
    }
    /* a negative window is refused */
    pkv_problem bad;
    pkv_problem_default(&bad);
    bad.window = -1;
    int32_t one = 5, ip[2] = {0, 1};
    pkv_page_table t1 = {1, ip, NULL, &one};
    bad.num_pages = 1;
    CHECK_STATUS(pkv_plan_step_host(&bad, &t1, NULL, pw), PKV_ERR_INVALID_ARGUMENT);
    pkv_plan_free(pw);
    pkv_plan_free(pe);
}

/* Graph-stable plans: every step of a batch up to graph_max_batch (lengths 0 to 100K, windows) plans
 * on the same layout, workspace and grids (so the same signature), valid, within the grid, with the
 * counts the kernels read; pkv_workspace_size gives that workspace; the errors. */
static void test_graph_stable(void) {
    pkv_rng rng;
    pkv_rng_seed(&rng, 20261201);
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    if (!plan) return;
    const int32_t max_batch = 16;
    for (int shape = 0; shape < 3; shape++) {
        pkv_problem pb;
        pkv_problem_default(&pb);
        if (shape == 1) pb.window = 300;
        if (shape == 2) pb.num_kv_heads = 2, pb.num_qo_heads = 14, pb.page_size = 5; /* G = 7 */
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.parallelism = 132;
        opts.graph_max_batch = max_batch;
        opts.graph_tasks = shape == 2 ? 20 : 0; /* below max_batch x Hkv = 32: raised to it */
        /* host planning: 264 resident slots (2 per unit); 128 pairs: 4 waves, as a ragged batch's */
        const int64_t cap = shape == 2 ? 32 : 4 * 264;
        uint64_t sig = 0;
        size_t ws = 0;
        int steps = 0, valid = 0, same = 0, fit = 0, split = 0;
        for (int step = 0; step < 120; step++) {
            const int32_t B = (int32_t)pkv_rng_uniform_int(&rng, 0, max_batch);
            int32_t lens[16];
            for (int32_t i = 0; i < B; i++) {
                const int64_t kind = pkv_rng_uniform_int(&rng, 0, 3);
                lens[i] = (int32_t)(kind == 0 ? 0 : kind == 1 ? pkv_rng_uniform_int(&rng, 1, 40)
                                            : kind == 2 ? pkv_rng_uniform_int(&rng, 1, 5000)
                                                        : pkv_rng_uniform_int(&rng, 1, 100000));
            }
            batch b;
            batch_make(&b, lens, B, &pb, &rng, true);
            pb.num_pages = 1 << 20; /* the pool is the same for every step (it is in the signature) */
            steps++;
            if (pkv_plan_step_host(&pb, &b.table, &opts, plan) != PKV_OK) {
                CHECK_MSG(0, "graph-stable step %d (B=%d): %s", step, B, pkv_last_error());
                batch_free(&b);
                continue;
            }
            const char *why = NULL;
            valid += pkv_test_validate(plan, b.lens, &why) == PKV_OK;
            if (pkv_test_validate(plan, b.lens, &why) != PKV_OK) printf("  invalid graph-stable plan: %s\n", why);
            if (step == 0) { /* planted bugs in the uploaded words: a wrong widest merge, a claim word not zero */
                int32_t *w = (int32_t *)(void *)((char *)plan->blob + plan->off_counts);
                const int32_t keep = w[PKV_COUNTS_WIDEST];
                w[PKV_COUNTS_WIDEST] = keep + 1;
                CHECK_MSG(pkv_test_validate(plan, b.lens, &why) != PKV_OK, "a wrong widest merge was not detected");
                w[PKV_COUNTS_WIDEST] = keep;
                w[PKV_COUNTS_SM + 3] = 1;
                CHECK_MSG(pkv_test_validate(plan, b.lens, &why) != PKV_OK, "a claim word not zero was not detected");
                w[PKV_COUNTS_SM + 3] = 0;
                CHECK(pkv_test_validate(plan, b.lens, &why) == PKV_OK);
            }
            if (step == 0) sig = pkv_plan_graph_signature(plan), ws = pkv_plan_workspace_size(plan);
            same += sig != 0 && pkv_plan_graph_signature(plan) == sig && pkv_plan_workspace_size(plan) == ws &&
                    pkv_plan_route(plan) == PKV_ROUTE_WORKQUEUE;
            fit += pkv_plan_grid_tasks(plan) == cap && pkv_plan_num_tasks(plan) <= cap;
            if (shape < 2) { /* the default grid: the step is planned as a plain work-queue step */
                const int32_t nt = pkv_plan_num_tasks(plan);
                pkv_plan_options plain = opts;
                plain.graph_max_batch = 0;
                plain.route = PKV_ROUTE_WORKQUEUE;
                CHECK(pkv_plan_step_host(&pb, &b.table, &plain, plan) == PKV_OK && pkv_plan_num_tasks(plan) == nt);
            }
            split += pkv_plan_num_merges(plan) > 0 && pkv_plan_num_tasks(plan) > B * pb.num_kv_heads;
            batch_free(&b);
        }
        CHECK_MSG(valid == steps && same == steps && fit == steps,
                  "shape %d: %d steps, %d valid, %d on the first step's signature and workspace, %d on a grid of %lld",
                  shape, steps, valid, same, fit, (long long)cap);
        CHECK_MSG(split > 10, "shape %d: only %d of %d graph-stable steps split a row", shape, split, steps);
        size_t bound = 0;
        CHECK_OK(pkv_workspace_size(NULL, &pb, max_batch, &opts, &bound));
        CHECK_MSG(bound == ws, "shape %d: pkv_workspace_size %zu, the plans' %zu", shape, bound, ws);
        /* another shape, another signature; a plain plan has none */
        pkv_problem other = pb;
        other.page_size = pb.page_size == 16 ? 32 : 16;
        const int32_t one = 700, indptr[2] = {0, (700 + other.page_size - 1) / other.page_size};
        pkv_page_table t1 = {1, indptr, NULL, &one};
        CHECK_OK(pkv_plan_step_host(&other, &t1, &opts, plan));
        CHECK(pkv_plan_graph_signature(plan) != 0 && pkv_plan_graph_signature(plan) != sig);
        pkv_plan_options plain = opts;
        plain.graph_max_batch = 0;
        CHECK_OK(pkv_plan_step_host(&other, &t1, &plain, plan));
        CHECK(pkv_plan_graph_signature(plan) == 0 && pkv_plan_grid_tasks(plan) == pkv_plan_num_tasks(plan));
    }
    /* errors: a batch above the capacity, a route other than the work queue, a forced chunk that needs
     * more tasks than the grid; a failed step leaves no signature */
    pkv_problem pb;
    pkv_problem_default(&pb);
    pkv_plan_options opts;
    pkv_plan_options_default(&opts);
    opts.parallelism = 132;
    opts.graph_max_batch = 2;
    int32_t lens[3] = {100000, 5, 7}, indptr[4] = {0, 6250, 6251, 6252};
    pb.num_pages = 6252;
    pkv_page_table t = {3, indptr, NULL, lens};
    CHECK_STATUS(pkv_plan_step_host(&pb, &t, &opts, plan), PKV_ERR_BATCH_SIZE);
    CHECK(pkv_plan_graph_signature(plan) == 0);
    t.batch_size = 2;
    opts.route = PKV_ROUTE_SPLIT;
    CHECK_STATUS(pkv_plan_step_host(&pb, &t, &opts, plan), PKV_ERR_UNSUPPORTED);
    opts.route = PKV_ROUTE_WORKQUEUE;
    opts.chunk_pages = 1; /* 6250 chunks x 8 heads */
    CHECK_STATUS(pkv_plan_step_host(&pb, &t, &opts, plan), PKV_ERR_INVALID_ARGUMENT);
    opts.chunk_pages = 0;
    CHECK_OK(pkv_plan_step_host(&pb, &t, &opts, plan));
    CHECK(pkv_plan_num_tasks(plan) <= pkv_plan_grid_tasks(plan) && pkv_plan_graph_signature(plan) != 0);
    size_t bound = 0;
    CHECK_STATUS(pkv_workspace_size(NULL, &pb, 3, &opts, &bound), PKV_ERR_BATCH_SIZE);
    /* the widest machine the options allow (2^16 units x 1024 CTAs, 4 waves: 2^28 tasks) still plans: the
     * default grid holds max_splits tasks per pair, no more; a grid asked for past 2^24 CTAs is refused */
    opts.parallelism = 1 << 16;
    opts.ctas_per_unit = 1024;
    opts.max_splits = 0;
    CHECK_OK(pkv_plan_step_host(&pb, &t, &opts, plan));
    CHECK_MSG(pkv_plan_grid_tasks(plan) == 2 * 8 * 256 && pkv_plan_num_tasks(plan) <= pkv_plan_grid_tasks(plan),
              "the widest machine's graph grid: %d tasks", pkv_plan_grid_tasks(plan));
    CHECK_OK(pkv_workspace_size(NULL, &pb, 2, &opts, &bound));
    CHECK(bound == pkv_plan_workspace_size(plan));
    opts.graph_tasks = (1 << 24) + 1;
    CHECK_STATUS(pkv_plan_step_host(&pb, &t, &opts, plan), PKV_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(pkv_workspace_size(NULL, &pb, 2, &opts, &bound), PKV_ERR_INVALID_ARGUMENT);
    opts.graph_tasks = 1 << 24; /* the largest grid is taken (sized only: its task list would be some 0.5 GB) */
    CHECK_OK(pkv_workspace_size(NULL, &pb, 2, &opts, &bound));
    pkv_plan_free(plan);
}

/* The graph-stable claim's SM order (decode.cu): s -> s x a mod nsm must be a permutation of [0, nsm)
 * for every SM count (else two SMs are dealt the same tasks and others none), and consecutive tasks of a
 * round go to SMs at least nsm / 8 apart (b = a's inverse, the stride). */
static void test_claim_order(void) {
    enum { MAXN = 600 };
    static unsigned char seen[MAXN + 1];
    for (int32_t nsm = 1; nsm <= MAXN; nsm++) {
        const int32_t a = pkv_graph_claim_multiplier(nsm);
        memset(seen, 0, sizeof seen);
        bool perm = a >= 0 && (nsm == 1 || a < nsm);
        for (int32_t s = 0; perm && s < nsm; s++) {
            const int32_t r = (int32_t)((int64_t)s * a % nsm);
            perm = !seen[r];
            seen[r] = 1;
        }
        CHECK_MSG(perm, "claim order for %d SMs (a = %d) is not a permutation", nsm, a);
        if (nsm >= 2) {
            int32_t b = 1;
            while (b < nsm && (int64_t)a * b % nsm != 1) b++;
            CHECK_MSG(b < nsm && b >= (nsm + 7) / 8, "claim stride for %d SMs: %d", nsm, b);
        }
    }
    CHECK(pkv_graph_claim_multiplier(132) == 101); /* 132 SMs: stride 17 */
}

/* ---- (f) capabilities ------------------------------------------------------------------------------ */
/* Whether two plans hold the same schedule: route, lists, counters and workspace. */
static bool same_plan(const pkv_plan *a, const pkv_plan *b) {
    if (pkv_plan_route(a) != pkv_plan_route(b) || pkv_plan_num_tasks(a) != pkv_plan_num_tasks(b) ||
        pkv_plan_num_merges(a) != pkv_plan_num_merges(b) || pkv_plan_num_phases(a) != pkv_plan_num_phases(b) ||
        pkv_plan_num_rows(a) != pkv_plan_num_rows(b) || pkv_plan_num_state_slots(a) != pkv_plan_num_state_slots(b) ||
        pkv_plan_workspace_size(a) != pkv_plan_workspace_size(b) ||
        pkv_plan_graph_signature(a) != pkv_plan_graph_signature(b))
        return false;
    const size_t nt = (size_t)pkv_plan_num_tasks(a), nm = (size_t)pkv_plan_num_merges(a);
    const size_t np = (size_t)pkv_plan_num_phases(a), nr = (size_t)pkv_plan_num_rows(a);
    return (nt == 0 || memcmp(pkv_plan_tasks(a), pkv_plan_tasks(b), nt * sizeof(pkv_task)) == 0) &&
           (nm == 0 || memcmp(pkv_plan_merges(a), pkv_plan_merges(b), nm * sizeof(pkv_merge)) == 0) &&
           (np == 0 || memcmp(pkv_plan_phases(a), pkv_plan_phases(b), np * sizeof(pkv_phase)) == 0) &&
           (nr == 0 || memcmp(pkv_plan_rows(a), pkv_plan_rows(b), nr * sizeof(pkv_row_sched)) == 0) &&
           memcmp(pkv_plan_counters(a), pkv_plan_counters(b), sizeof(pkv_counters)) == 0;
}

static void test_caps(void) {
    pkv_plan *a = NULL, *b = NULL;
    CHECK_OK(pkv_plan_create(&a));
    CHECK_OK(pkv_plan_create(&b));
    pkv_rng rng;
    pkv_rng_seed(&rng, 20261207);
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 5;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cfg, &ctx));
    pkv_cost_model model;
    pkv_cost_model_default(&model, 5, 100, 1);
    pkv_backend_caps host;
    pkv_backend_caps_host(&host);
    int differ = 0;
    for (int k = 0; ctx && k < 300; k++) {
        pkv_problem pb;
        pkv_problem_default(&pb);
        pb.page_size = k % 3 == 0 ? 1 : 16;
        pb.window = k % 5 == 0 ? 3000 : 0;
        int32_t lens[40];
        const int32_t B = (int32_t)pkv_rng_uniform_int(&rng, 0, 40);
        for (int32_t i = 0; i < B; i++) lens[i] = (int32_t)pkv_rng_uniform_int(&rng, 0, 30000);
        batch bt;
        batch_make(&bt, lens, B, &pb, &rng, false);
        pkv_plan_options o;
        pkv_plan_options_default(&o);
        o.route = (pkv_route)pkv_rng_uniform_int(&rng, 0, PKV_ROUTE_COUNT_ - 1);
        if (k % 7 == 1) o.graph_max_batch = 40, o.route = PKV_ROUTE_AUTO;
        const bool with_model = k % 2 == 1;
        CHECK_OK(pkv_context_set_cost_model(ctx, with_model ? &model : NULL));
        /* a context's plans are those of its capabilities */
        CHECK_OK(pkv_plan_step(ctx, &pb, &bt.table, &o, a));
        CHECK_OK(pkv_plan_step_caps(&ctx->caps, with_model ? &model : NULL, &pb, &bt.table, &o, b));
        differ += !same_plan(a, b);
        size_t wa = 0, wb = 1;
        CHECK_OK(pkv_workspace_size(ctx, &pb, 40, &o, &wa));
        CHECK_OK(pkv_workspace_size_caps(&ctx->caps, &pb, 40, &o, &wb));
        differ += wa != wb;
        /* host plans are those of the host capabilities */
        o.parallelism = (int32_t)pkv_rng_uniform_int(&rng, 1, 140);
        CHECK_OK(pkv_plan_step_host(&pb, &bt.table, &o, a));
        CHECK_OK(pkv_plan_step_caps(&host, NULL, &pb, &bt.table, &o, b));
        differ += !same_plan(a, b);
        CHECK_OK(pkv_workspace_size(NULL, &pb, 40, &o, &wa));
        CHECK_OK(pkv_workspace_size_caps(&host, &pb, 40, &o, &wb));
        differ += wa != wb;
        batch_free(&bt);
    }
    CHECK_MSG(differ == 0, "%d plans or workspace sizes differ between a context and its capabilities", differ);
    pkv_context_free(ctx);

    /* a simulated GPU: its residency is the plan's resident slots, its wave the planner's */
    pkv_problem pb;
    pkv_problem_default(&pb); /* d = 128, G = 4 */
    int32_t lens[2] = {20000, 3000};
    batch bt;
    batch_make(&bt, lens, 2, &pb, NULL, false);
    pkv_backend_caps gpu;
    memset(&gpu, 0, sizeof gpu);
    gpu.parallelism = 132;
    gpu.ctas_per_unit = 2;
    gpu.resident[1][0] = 3;
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.route = PKV_ROUTE_WORKQUEUE;
    CHECK_OK(pkv_plan_step_caps(&gpu, NULL, &pb, &bt.table, &o, a));
    double terms[PKV_COST_TERMS];
    CHECK_OK(pkv_cost_terms(a, terms));
    CHECK_MSG(terms[PKV_TERM_SLOTS] == 132.0 * 3, "resident slots %g, expected 396", terms[PKV_TERM_SLOTS]);
    CHECK_MSG(pkv_plan_num_tasks(a) <= 132 * 2 && pkv_plan_num_tasks(a) > 132, "%d tasks for a wave of 264",
              pkv_plan_num_tasks(a));
    pb.head_dim = 256; /* no residency known at d = 256: the wave's 2 per unit */
    CHECK_OK(pkv_plan_step_caps(&gpu, NULL, &pb, &bt.table, &o, a));
    CHECK_OK(pkv_cost_terms(a, terms));
    CHECK(terms[PKV_TERM_SLOTS] == 132.0 * 2);

    /* capabilities out of range fail and leave no runnable plan */
    CHECK_STATUS(pkv_plan_step_caps(NULL, NULL, &pb, &bt.table, &o, a), PKV_ERR_NULL_POINTER);
    CHECK_STATUS(pkv_cost_terms(a, terms), PKV_ERR_INVALID_ARGUMENT);
    pkv_backend_caps bad[5];
    for (int k = 0; k < 5; k++) bad[k] = gpu;
    bad[0].ctas_per_unit = 0;
    bad[1].parallelism = -1;
    bad[2].resident[2][1] = -1;
    bad[3].row_gather_below = -8;
    bad[4].parallelism = PKV_MAX_PARALLELISM + 1;
    for (int k = 0; k < 5; k++) {
        CHECK_OK(pkv_plan_step_caps(&gpu, NULL, &pb, &bt.table, &o, a));
        CHECK_STATUS(pkv_plan_step_caps(&bad[k], NULL, &pb, &bt.table, &o, a), PKV_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(pkv_cost_terms(a, terms), PKV_ERR_INVALID_ARGUMENT);
        size_t ws = 0;
        CHECK_STATUS(pkv_workspace_size_caps(&bad[k], &pb, 2, &o, &ws), PKV_ERR_INVALID_ARGUMENT);
    }
    /* no parallelism in the capabilities nor the options */
    host.parallelism = 0;
    o.parallelism = 0;
    CHECK_STATUS(pkv_plan_step_caps(&host, NULL, &pb, &bt.table, &o, a), PKV_ERR_INVALID_ARGUMENT);
    batch_free(&bt);
    pkv_plan_free(a);
    pkv_plan_free(b);
}

/* The validator is O((tasks + merges) log) in a plan's size: it once looked each split (row, KV head)'s
 * merge up by scanning every merge, O(B x Hkv x merges) (fuzz_plan: 53 rows x 384 KV heads took 0.2 s in
 * Release).  512 rows x 256 KV heads, every pair split in 4: 131072 merges, ~10^10 steps of the old scan;
 * now well under a second even under the sanitizers. */
static void test_validate_large(void) {
    enum { B = 512 };
    pkv_problem p;
    pkv_problem_default(&p);
    p.num_kv_heads = 256, p.num_qo_heads = 512, p.page_size = 16;
    int32_t *lens = malloc(B * sizeof *lens), *indptr = malloc((B + 1) * sizeof *indptr);
    if (!lens || !indptr) return;
    indptr[0] = 0;
    for (int32_t i = 0; i < B; i++) lens[i] = 64 + 16 * (i % 7), indptr[i + 1] = indptr[i] + (lens[i] + 15) / 16;
    p.num_pages = indptr[B];
    pkv_page_table t = {B, indptr, NULL, lens};
    pkv_plan_options o;
    pkv_plan_options_default(&o);
    o.route = PKV_ROUTE_SPLIT, o.parallelism = 132, o.num_splits = 4, o.min_chunk_tokens = 16;
    pkv_plan *plan = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    CHECK_OK(pkv_plan_step_host(&p, &t, &o, plan));
    CHECK(pkv_plan_num_merges(plan) == B * 256);
    const clock_t t0 = clock();
    const char *why = NULL;
    CHECK_MSG(pkv_test_validate(plan, lens, &why) == PKV_OK, "%s", why);
    const double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK_MSG(s < 5.0, "validating %d merges took %.2f s", pkv_plan_num_merges(plan), s);
    /* a merge listed twice is still found at this size */
    pkv_merge *m = (pkv_merge *)pkv_plan_merges(plan);
    const pkv_merge keep = m[B * 256 - 1];
    m[B * 256 - 1] = m[B * 128];
    CHECK(pkv_plan_validate(plan, lens) == PKV_ERR_INVALID_ARGUMENT && strstr(pkv_last_error(), "merged twice"));
    m[B * 256 - 1] = keep;
    pkv_plan_free(plan);
    free(lens);
    free(indptr);
}

/* ---- (g) incremental steps --------------------------------------------------------------------------- */
/* Whether plan a (reused from step to step, so often patched over its last emission) is b (planned from scratch
 * on a new plan object), field for field: every list, the bytes the device reads (tasks, rows, merges and
 * their zeroed arrival counters, a graph-stable plan's counts), the layout, counters and graph fields. */
static bool identical_plans(const pkv_plan *a, const pkv_plan *b, const char **what) {
#define SAME(f)                       \
    if (a->f != b->f) {               \
        *what = #f;                   \
        return false;                 \
    }
    SAME(batch_size) SAME(route) SAME(group) SAME(num_tasks) SAME(num_rows) SAME(num_merges) SAME(num_phases)
    SAME(num_state_slots) SAME(max_merge_count) SAME(slots) SAME(blob_bytes) SAME(off_tasks) SAME(off_rows)
    SAME(off_merges) SAME(off_counters) SAME(off_state_o) SAME(off_state_ml) SAME(workspace_bytes) SAME(graph_tasks)
    SAME(graph_merges) SAME(off_counts) SAME(graph_signature)
#undef SAME
    *what = "counters";
    if (memcmp(&a->counters, &b->counters, sizeof a->counters) != 0) return false;
    *what = "phases";
    if (a->num_phases && memcmp(a->phases, b->phases, (size_t)a->num_phases * sizeof(pkv_phase)) != 0) return false;
    *what = "tasks";
    if (a->num_tasks && memcmp(a->tasks, b->tasks, (size_t)a->num_tasks * sizeof(pkv_task)) != 0) return false;
    *what = "rows";
    if (a->num_rows && memcmp(a->rows, b->rows, (size_t)a->num_rows * sizeof(pkv_row_sched)) != 0) return false;
    *what = "merges and arrival counters";
    const size_t mbytes = (size_t)a->num_merges * (sizeof(pkv_merge) + sizeof(int32_t));
    if (mbytes && memcmp((const char *)a->blob + a->off_merges, (const char *)b->blob + b->off_merges, mbytes) != 0)
        return false;
    *what = "graph counts";
    if (a->graph_tasks > 0 && memcmp((const char *)a->blob + a->off_counts, (const char *)b->blob + b->off_counts,
                                     PKV_COUNTS_WORDS * sizeof(int32_t)) != 0)
        return false;
    *what = "";
    return true;
}

/* Sequences of decode steps on one reused plan, each compared with a fresh plan of the same step: rows a token
 * longer (most steps), rolled back, crossing chunk and page boundaries, replaced by other requests, entering and
 * leaving the batch; compact tables (page bases move) and strided ones; sliding windows, fp8 caches, graph-stable
 * plans, forced options, a cost model, every route; a failed step in the middle.  Many steps must have been
 * patched (plan->last_patched), on the rectangular and the work-queue kinds, under windows and with page bases
 * that moved. */
static void test_incremental(void) {
    const bool quick = getenv("PKV_TEST_SANITIZE") && atoi(getenv("PKV_TEST_SANITIZE")) > 0;
    const int sequences = quick ? 120 : 600, steps = 40;
    static const int32_t kv_heads[] = {1, 2, 4, 8}, page_sizes[] = {1, 7, 16, 64}, groups[] = {1, 4, 8};
    pkv_rng rng;
    pkv_rng_seed(&rng, 36036);
    pkv_plan *inc = NULL;
    CHECK_OK(pkv_plan_create(&inc));
    int64_t planned = 0, patched = 0, failures = 0, patched_rect = 0, patched_wq = 0, patched_graph = 0,
            patched_window = 0, patched_moved = 0;
    int64_t route_steps[PKV_ROUTE_COUNT_] = {0};
    enum { MAXB = 160 };
    int32_t lens[MAXB], indptr[MAXB + 1];
    pkv_cost_model model;
    pkv_cost_model_default(&model, 132, 3000.0, 3.0);
    for (int q = 0; q < sequences && failures < 5; q++) {
        pkv_problem pb;
        pkv_problem_default(&pb);
        pb.num_kv_heads = kv_heads[pkv_rng_uniform_int(&rng, 0, 3)];
        pb.num_qo_heads = pb.num_kv_heads * groups[pkv_rng_uniform_int(&rng, 0, 2)];
        pb.page_size = page_sizes[pkv_rng_uniform_int(&rng, 0, 3)];
        pb.head_dim = pkv_rng_uniform01(&rng) < 0.5 ? 128 : 64;
        pb.dtype = PKV_DTYPE_BF16;
        if (pkv_rng_uniform01(&rng) < 0.2) pb.kv_dtype = PKV_DTYPE_FP8_E4M3;
        if (pkv_rng_uniform01(&rng) < 0.25) pb.window = (int32_t)pkv_rng_uniform_int(&rng, 1, 700);
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = (pkv_route)pkv_rng_uniform_int(&rng, 0, PKV_ROUTE_COUNT_ - 1);
        opts.parallelism = pkv_rng_uniform01(&rng) < 0.5 ? 132 : (int32_t)pkv_rng_uniform_int(&rng, 2, 64);
        const double u = pkv_rng_uniform01(&rng);
        if (u < 0.15) opts.num_splits = (int32_t)pkv_rng_uniform_int(&rng, 1, 8);
        else if (u < 0.3) opts.chunk_pages = (int32_t)pkv_rng_uniform_int(&rng, 1, 40);
        else if (u < 0.4) opts.min_chunk_tokens = (int32_t)pkv_rng_uniform_int(&rng, 1, 300);
        const bool graph = pkv_rng_uniform01(&rng) < 0.15;
        if (graph) {
            opts.route = pkv_rng_uniform01(&rng) < 0.5 ? PKV_ROUTE_AUTO : PKV_ROUTE_WORKQUEUE;
            opts.graph_max_batch = MAXB;
            opts.chunk_pages = 0;
        }
        const bool with_model = opts.route == PKV_ROUTE_AUTO && pkv_rng_uniform01(&rng) < 0.5;
        const bool strided = pkv_rng_uniform01(&rng) < 0.5;
        const int32_t max_len = pkv_rng_uniform01(&rng) < 0.5 ? 400 : 3000, room = max_len + 64;
        int32_t B = (int32_t)pkv_rng_uniform_int(&rng, 0, pkv_rng_uniform01(&rng) < 0.7 ? 24 : MAXB);
        for (int32_t i = 0; i < B; i++) lens[i] = (int32_t)pkv_rng_uniform_int(&rng, 0, max_len);
        pkv_lab_caps caps = {opts.parallelism, 2, {{4, 0}, {3, 2}, {2, 1}}, pkv_rng_uniform01(&rng) < 0.3 ? 32 : 0};
        for (int k = 0; k < steps && failures < 5; k++) {
            /* the step's lengths: most rows a token longer; now and then a rollback, a row replaced, rows entering
             * or leaving */
            const double e = pkv_rng_uniform01(&rng);
            if (e < 0.05 && B < MAXB) {
                const int32_t at = (int32_t)pkv_rng_uniform_int(&rng, 0, B);
                memmove(lens + at + 1, lens + at, (size_t)(B - at) * sizeof *lens);
                lens[at] = (int32_t)pkv_rng_uniform_int(&rng, 1, max_len);
                B++;
            } else if (e < 0.1 && B > 0) {
                const int32_t at = (int32_t)pkv_rng_uniform_int(&rng, 0, B - 1);
                memmove(lens + at, lens + at + 1, (size_t)(B - at - 1) * sizeof *lens);
                B--;
            } else if (e < 0.15 && B > 0) {
                lens[pkv_rng_uniform_int(&rng, 0, B - 1)] = (int32_t)pkv_rng_uniform_int(&rng, 0, max_len);
            } else if (e < 0.2) {
                const int32_t back = (int32_t)pkv_rng_uniform_int(&rng, 1, 20);
                for (int32_t i = 0; i < B; i++) lens[i] = lens[i] > back ? lens[i] - back : lens[i];
            } else if (e > 0.3) {
                for (int32_t i = 0; i < B; i++) lens[i] += lens[i] < room - 1;
            } /* else: the same lengths again */
            indptr[0] = 0;
            for (int32_t i = 0; i < B; i++)
                indptr[i + 1] = strided ? (i + 1) * (int32_t)ceil_div64(room, pb.page_size)
                                        : indptr[i] + (int32_t)ceil_div64(lens[i], pb.page_size);
            pb.num_pages = indptr[B] > 0 ? indptr[B] : 1;
            const pkv_page_table t = {B, indptr, NULL, lens};
            if (k == steps / 2 && B > 0) { /* a step that fails leaves a plan the next step can reuse */
                lens[0] = -lens[0] - 1;
                CHECK_STATUS(pkv_lab_plan_step_caps(&caps, NULL, &pb, &t, &opts, inc), PKV_ERR_NEGATIVE_LENGTH);
                lens[0] = -lens[0] - 1;
            }
            const pkv_cost_model *m = with_model ? &model : NULL;
            const pkv_status st = pkv_lab_plan_step_caps(&caps, m, &pb, &t, &opts, inc);
            pkv_plan *fresh = NULL;
            CHECK_OK(pkv_plan_create(&fresh));
            const pkv_status sf = pkv_lab_plan_step_caps(&caps, m, &pb, &t, &opts, fresh);
            CHECK_MSG(st == sf, "sequence %d step %d: status %d incremental, %d fresh", q, k, (int)st, (int)sf);
            if (st == PKV_OK && sf == PKV_OK) {
                planned++;
                route_steps[inc->route]++;
                const char *what = "";
                const bool same = identical_plans(inc, fresh, &what);
                CHECK_MSG(same, "sequence %d step %d (%s, B %d, %s): the reused plan's %s differ from a fresh plan's", q,
                          k, pkv_route_name(inc->route), B, inc->last_patched ? "patched" : "emitted", what);
                failures += !same;
                const char *why = NULL;
                CHECK_MSG(pkv_test_validate(inc, lens, &why) == PKV_OK, "sequence %d step %d: %s", q, k, why);
                if (inc->last_patched) {
                    patched++;
                    patched_rect += inc->memo_kind == PKV_MEMO_RECT;
                    patched_wq += inc->memo_kind == PKV_MEMO_WORKQUEUE;
                    patched_graph += inc->graph_tasks > 0;
                    patched_window += pb.window > 0;
                    patched_moved += !strided;
                }
            }
            pkv_plan_free(fresh);
        }
    }
    printf("incremental: %lld steps planned, %lld patched (rect %lld, work queue %lld, graph-stable %lld, windowed "
           "%lld, page bases moving %lld); per route:",
           (long long)planned, (long long)patched, (long long)patched_rect, (long long)patched_wq,
           (long long)patched_graph, (long long)patched_window, (long long)patched_moved);
    for (int r = 1; r < PKV_ROUTE_COUNT_; r++) printf(" %s %lld", pkv_route_name((pkv_route)r), (long long)route_steps[r]);
    printf("\n");
    CHECK_MSG(patched * 4 > planned, "only %lld of %lld steps were patched", (long long)patched, (long long)planned);
    CHECK(patched_rect > 50 && patched_wq > 50 && patched_graph > 20 && patched_window > 20 && patched_moved > 20);
    pkv_plan_free(inc);
}

/* ---- (h) blobs in a backend's memory ----------------------------------------------------------------- */
/* A backend's blob memory (pkv_blob_ops) simulated on the host: "uploading" a plan marks its blob busy and
 * remembers a checksum of its bytes; the "device" runs a busy blob's upload at random, or when the planner
 * waits for it.  A blob must never change while busy (the planner writes only blobs whose uploads have run), and
 * every blob given out must come back. */
enum { FAKE_BLOBS = 64 };
static struct fake_blob {
    void *p;
    size_t bytes; /* checked while busy */
    bool busy;
    uint64_t sum;
} fake[FAKE_BLOBS];
static int fake_allocs, fake_frees, fake_waits, fake_written_busy;

static uint64_t fake_sum(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}
static struct fake_blob *fake_of(const void *p) {
    for (int i = 0; i < FAKE_BLOBS; i++)
        if (fake[i].p && fake[i].p == p) return &fake[i];
    return NULL;
}
static void fake_run(struct fake_blob *f) { /* the upload runs: the bytes it read must be those queued */
    if (!f->busy) return;
    fake_written_busy += fake_sum(f->p, f->bytes) != f->sum;
    f->busy = false;
}
static void *fake_alloc(size_t bytes) {
    for (int i = 0; i < FAKE_BLOBS; i++)
        if (!fake[i].p) {
            fake[i] = (struct fake_blob){malloc(bytes), 0, false, 0};
            fake_allocs += fake[i].p != NULL;
            return fake[i].p;
        }
    return NULL;
}
static void fake_free(void *blob) {
    struct fake_blob *f = fake_of(blob);
    if (!f) return;
    fake_run(f);
    free(f->p);
    f->p = NULL;
    fake_frees++;
}
static pkv_status fake_busy(pkv_context *ctx, void *blob, bool wait, bool *busy) {
    (void)ctx;
    struct fake_blob *f = fake_of(blob);
    CHECK(f != NULL);
    if (f && wait && f->busy) {
        fake_waits++;
        fake_run(f);
    }
    *busy = f && f->busy;
    return PKV_OK;
}
static const pkv_blob_ops fake_ops = {fake_alloc, fake_free, fake_busy};

static void test_backend_blobs(void) {
    pkv_context_config cfg;
    pkv_context_config_default(&cfg);
    cfg.backend = PKV_BACKEND_CPU;
    cfg.num_threads = 4;
    pkv_context *ctx = NULL;
    CHECK_OK(pkv_context_create(&cfg, &ctx));
    if (!ctx) return;
    const pkv_backend_ops *real = ctx->ops;
    pkv_backend_ops ops = *real;
    ops.blob = &fake_ops;
    ctx->ops = &ops;
    pkv_rng rng;
    pkv_rng_seed(&rng, 3636);
    pkv_problem pb;
    pkv_problem_default(&pb);
    pb.num_qo_heads = 32, pb.num_kv_heads = 8, pb.page_size = 16;
    enum { B_MAX = 96, STEPS = 3000 };
    int32_t lens[B_MAX], indptr[B_MAX + 1];
    for (int32_t i = 0; i < B_MAX; i++) lens[i] = (int32_t)pkv_rng_uniform_int(&rng, 1, 2000);
    for (int32_t i = 0; i <= B_MAX; i++) indptr[i] = i * 200;
    pb.num_pages = B_MAX * 200;
    pkv_plan *plan = NULL, *fresh = NULL;
    CHECK_OK(pkv_plan_create(&plan));
    int patched = 0, swaps = 0;
    for (int k = 0; k < STEPS; k++) {
        const int32_t B = k < STEPS / 2 ? 40 : B_MAX; /* the second half grows the blobs */
        for (int32_t i = 0; i < B; i++) lens[i] += 1;
        if (k % 16 == 15)
            for (int32_t i = 0; i < B; i++) lens[i] -= 16;
        const pkv_page_table t = {B, indptr, NULL, lens};
        pkv_plan_options opts;
        pkv_plan_options_default(&opts);
        opts.route = (pkv_route)(k / 100 % PKV_ROUTE_COUNT_);
        void *before = plan->blob;
        CHECK_OK(pkv_plan_step(ctx, &pb, &t, &opts, plan));
        swaps += before && plan->blob != before && plan->num_spares > 0 && plan->blob_spare[plan->num_spares - 1] == before;
        patched += plan->last_patched;
        CHECK(plan->blob_ops == &fake_ops);
        CHECK_OK(pkv_plan_create(&fresh));
        CHECK_OK(pkv_plan_step(ctx, &pb, &t, &opts, fresh));
        const char *what = "";
        CHECK_MSG(identical_plans(plan, fresh, &what), "step %d: the plan's %s differ from a fresh plan's", k, what);
        pkv_plan_free(fresh);
        /* the upload of this step, queued; the device runs some of the queued ones */
        struct fake_blob *f = fake_of(plan->blob);
        CHECK(f != NULL);
        if (f && pkv_rng_uniform01(&rng) < 0.7) {
            f->busy = true;
            f->bytes = plan->blob_bytes;
            f->sum = fake_sum(plan->blob, plan->blob_bytes);
        }
        for (int i = 0; i < FAKE_BLOBS; i++)
            if (fake[i].p && fake[i].busy && pkv_rng_uniform01(&rng) < 0.15) fake_run(&fake[i]);
    }
    pkv_plan_free(plan);
    printf("backend blobs: %d steps, %d patched, %d planned into another blob, %d waits; %d blobs given, %d back\n",
           STEPS, patched, swaps, fake_waits, fake_allocs, fake_frees);
    CHECK_MSG(fake_written_busy == 0, "%d blobs changed while an upload from them was pending", fake_written_busy);
    CHECK_MSG(fake_allocs == fake_frees, "%d blobs given, %d freed", fake_allocs, fake_frees);
    CHECK(patched > STEPS / 10 && swaps > STEPS / 10 && fake_waits > 10);
    ctx->ops = real;
    pkv_context_free(ctx);
}

int main(void) {
    test_backend_blobs();
    test_incremental();
    test_empty_batch_fresh_plan();
    test_validate_large();
    test_claim_order();
    test_caps();
    test_route_names();
    test_window();
    test_graph_stable();
    test_block_table();
    test_anchor_b8_bimodal();
    test_even_batch_waves();
    test_split_wave();
    test_plan_reuse();
    test_extreme_options();
    test_mutations();
    test_coverage();
    return pkv_test_finish("test_plan");
}
