/* policy.c - route choice for PKV_ROUTE_AUTO.  Without a cost model, the auto rule; with one, each
 * candidate route's cost terms for this step, computed without building its plan (one O(B) pass for
 * all four), and the candidate of lowest predicted time.  pkv_plan_route_terms exposes the same terms
 * so tests compare them with pkv_cost_terms of the built plans.
 *
 *   auto       with a cost model, the candidate of lowest predicted time; else the rule of auto_rule
 *              (single for even batches that fill a wave, the work queue for ragged ones that do and
 *              for one long row, fused otherwise).
 */
#include "plan_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The candidate routes whose terms the policy computes, in the order of candidate_terms' output. */
enum { TC_SINGLE, TC_SPLIT, TC_WORKQUEUE, TC_FUSED, TC_COUNT };
static const pkv_route term_routes[TC_COUNT] = {PKV_ROUTE_SINGLE, PKV_ROUTE_SPLIT, PKV_ROUTE_WORKQUEUE, PKV_ROUTE_FUSED};

/* The auto rule (no cost model set):
 *   single     when the non-empty rows fill a wave (rows x Hkv >= P) and the batch is even; a ragged
 *              batch that large goes to the work queue instead, whose longest-first task order
 *              balances it;
 *   workqueue  for one non-empty row of >= PKV_AUTO_LONG_ROW_TOKENS tokens: its merge kernel (launched
 *              early with PDL) beats the fused route's merge by the last CTA;
 *   fused      otherwise (one launch). */
pkv_route plan_auto_rule(const plan_params *pp, const pkv_problem *p) {
    if (pp->nonempty * p->num_kv_heads >= pp->P) return pp->ragged ? PKV_ROUTE_WORKQUEUE : PKV_ROUTE_SINGLE;
    if (pp->nonempty == 1 && pp->max_len >= PKV_AUTO_LONG_ROW_TOKENS) return PKV_ROUTE_WORKQUEUE;
    return PKV_ROUTE_FUSED;
}

/* Per-route tallies of candidate_terms: tasks, split tasks, the largest merge, the longest task. */
typedef struct route_tally {
    int64_t tasks, split_tasks, max_count, longest;
} route_tally;

/* Under a sliding window a row of n planned tokens (from the start of the page that holds its window's
 * first token, plan_window_lengths) attends to its last min(n, window) of them: its first task is `off`
 * tokens shorter than its chunk, off = n - window when n > window, else 0 (window 0: none). */
static inline int32_t window_offset(int32_t n, int32_t window) {
    return window > 0 && n > window ? n - window : 0;
}

/* The longest task of a row of n planned tokens in chunks of c tokens whose first chunk is off tokens
 * shorter: the first chunk, or the second (a full chunk, or the row's rest when it has two). */
static inline int32_t row_longest(int32_t n, int32_t c, int32_t off) {
    const int32_t first = (c < n ? c : n) - off;
    const int32_t rest = n > c ? n - c : 0, second = rest < c ? rest : c;
    return first > second ? first : second;
}

/* The work queue's tallies at chunks of wq_tokens: chunks per row and the longest task (a windowed
 * row's first chunk starts at its window); its largest merge follows from the longest row.  A
 * branch-free int32 pass the compiler vectorises (a row's splits are at most max_splits, so the sums
 * stay below 2^31). */
PKV_VECTOR_CLONES
static route_tally workqueue_tally(const plan_params *pp, const int32_t *lens, int32_t B, int64_t wq_tokens,
                                   int32_t window) {
    const double wq_up = (double)wq_tokens - 0.5, inv_wq = 1.0 / (double)wq_tokens;
    const int32_t c = wq_tokens < INT32_MAX ? (int32_t)wq_tokens : INT32_MAX;
    int32_t wt = 0, wst = 0, lmax = 0;
    for (int32_t i = 0; i < B; i++) {
        const int32_t n = lens[i];
        const int32_t ns = (int32_t)(((double)n + wq_up) * inv_wq); /* 0 for an empty row */
        wt += ns;
        wst += ns > 1 ? ns : 0;
        const int32_t l = row_longest(n, c, window_offset(n, window));
        lmax = l > lmax ? l : lmax;
    }
    route_tally r;
    r.tasks = wt, r.split_tasks = wst;
    const int64_t ns_max = pkv_ceil_div(pp->max_len, wq_tokens);
    r.max_count = ns_max > 1 ? ns_max : 0;
    r.longest = lmax;
    return r;
}

/* The split route's tallies under S splits: chunk = max(ceil(pages / S), min_chunk) pages, at most the
 * row (at least 1).  A branch-free int32 pass, as workqueue_tally. */
PKV_VECTOR_CLONES
static route_tally split_tally(const plan_params *pp, const pkv_problem *p, const int32_t *lens, int32_t B, int32_t S) {
    route_tally r;
    const int32_t window = p->window;
    if (S == 1) { /* the split route is the single route: a row's one task is its attended tokens */
        r.tasks = pp->nonempty, r.split_tasks = 0, r.max_count = 0;
        r.longest = window > 0 && pp->max_len > window ? window : pp->max_len;
        return r;
    }
    const double inv_ps = 1.0 / p->page_size, inv_S = 1.0 / S;
    const double ps_up = p->page_size - 0.5, S_up = S - 0.5;
    const int32_t mc = pp->min_chunk_pages, ps = p->page_size;
    int32_t st = 0, sst = 0, cmax = 0, lmax = 0;
    for (int32_t i = 0; i < B; i++) {
        const int32_t n = lens[i];
        const int32_t pages = (int32_t)(((double)n + ps_up) * inv_ps);
        int32_t cp = (int32_t)(((double)pages + S_up) * inv_S);
        cp = cp < mc ? mc : cp;
        cp = cp > pages ? pages : cp;
        cp = cp < 1 ? 1 : cp;
        /* ceil(pages / cp) <= S: a float quotient, then one correction each way */
        int32_t ns = (int32_t)((double)pages / (double)cp);
        ns += ns * cp < pages;
        ns -= ((ns - 1) * cp >= pages) & (ns > 0);
        const int32_t split = ns > 1 ? ns : 0;
        st += ns;
        sst += split;
        cmax = split > cmax ? split : cmax;
        /* chunks of cp pages when the row has more (then cp x ps < n < 2^31), else the row */
        const int32_t c = cp < pages ? (int32_t)((uint32_t)cp * (uint32_t)ps) : n;
        const int32_t l = row_longest(n, c, window_offset(n, window));
        lmax = l > lmax ? l : lmax;
    }
    r.tasks = st, r.split_tasks = sst, r.max_count = cmax, r.longest = lmax;
    return r;
}

/* The tokens the rows attend to: their planned lengths, less a sliding window's offsets. */
static int64_t attended_tokens(const plan_params *pp, const int32_t *lens, int32_t B, int32_t window) {
    if (window <= 0) return pp->total;
    int64_t total = 0;
    for (int32_t i = 0; i < B; i++) total += lens[i] - window_offset(lens[i], window);
    return total;
}

/* The cost-model terms of the candidate routes for this step without building their plans: the
 * same rules as the emitters, one O(B) pass for all four (the work queue's chunk searched once, or
 * given: wq_chunk_pages > 0).  Divisions by a per-step constant go through a double reciprocal:
 * floor((n + 0.5) / c) is exact for n, c < 2^31, since n / c's fractional part is a multiple of 1 / c
 * > the rounding error.  tests/test_cost checks the terms against pkv_cost_terms of the built plans. */
static void candidate_terms(const plan_params *pp, const pkv_problem *p, const int32_t *lens, int32_t B,
                            int32_t wq_chunk_pages, double t[TC_COUNT][PKV_COST_TERMS]) {
    const int64_t hkv = p->num_kv_heads, G = p->num_qo_heads / hkv, d = p->head_dim;
    const int64_t es = (int64_t)pkv_dtype_size(p->dtype), kv_es = (int64_t)pkv_kv_elem_size(p); /* q/o, K/V */
    const int32_t S = plan_choose_splits(pp, p, lens, NULL, B);
    const int32_t wq_pages = wq_chunk_pages > 0 ? wq_chunk_pages : plan_workqueue_chunk(pp, p, lens, B);
    const int64_t tokens = attended_tokens(pp, lens, B, p->window), empty = B - pp->nonempty;
    const int64_t nonempty = pp->nonempty;
    route_tally r[2]; /* split, work queue */
    r[1] = workqueue_tally(pp, lens, B, (int64_t)wq_pages * p->page_size, p->window);
    r[0] = split_tally(pp, p, lens, B, S);
    for (int k = 0; k < 2; k++) r[k].tasks *= hkv, r[k].split_tasks *= hkv;
    const int64_t kv = tokens * hkv * d * kv_es * 2, qo = (int64_t)B * p->num_qo_heads * (d * es * 2 + 4);
    const double token_mb = (double)(d * kv_es * 2) / 1e6, merge_mb_per_state = (double)G * (d + 1.0) * 4.0 / 1e6;
    for (int k = 0; k < TC_COUNT; k++) {
        const route_tally *x = &r[k == TC_SPLIT ? 0 : 1];
        int64_t ntasks, nsplit, maxc, lng, launches;
        if (k == TC_SINGLE) {
            ntasks = nonempty * hkv, nsplit = 0, maxc = 0;
            lng = p->window > 0 && pp->max_len > p->window ? p->window : pp->max_len;
        } else {
            ntasks = x->tasks, nsplit = x->split_tasks, maxc = x->max_count, lng = x->longest;
        }
        const int64_t merges = nsplit > 0 || empty > 0;
        if (k == TC_FUSED)
            launches = (ntasks > 0 || empty > 0) ? 1 : 0;
        else
            launches = (ntasks > 0) + merges;
        const int64_t ms = 2 * nsplit * G * (d + 1) * 4;
        pkv_cost_fill_terms(t[k], launches, (double)(kv + qo + ms) / 1e6, (double)lng * token_mb,
                            (double)maxc * merge_mb_per_state, ntasks, pp->slots, (double)kv / 1e6, token_mb,
                            k == TC_SINGLE || k == TC_SPLIT, k == TC_FUSED);
    }
}

/* The waves the policy weighs: the planner's wave P and, when the step has fewer (row, KV head) pairs
 * than resident task slots (splitting decides its length), P is one wave (not the waves of many ragged
 * pairs), at least two non-empty rows and nothing forced, one wave of every resident slot (the kernel's
 * exact residency per unit).  A single row keeps the planner's wave: more tasks per unit give more
 * states per merge, a cost the model does not see.  Returns the count. */
static int candidate_waves(const plan_params *pp, const pkv_plan_options *opts, int32_t parallelism,
                           const plan_caps *pc, int64_t hkv, int64_t waves[PKV_MAX_WAVE_CANDIDATES]) {
    int n = 0;
    waves[n++] = pp->P;
    const int64_t units = pp->nonempty * hkv;
    if (opts->ctas_per_unit <= 0 && pp->forced_splits <= 0 && pp->forced_chunk <= 0 && units < pp->slots &&
        pp->P <= pp->slots && pp->nonempty >= 2) {
        const int64_t full = (int64_t)parallelism * pc->resident_x;
        if (full != pp->P && full > 0) waves[n++] = full;
    }
    return n;
}

/* Auto with a cost model: each candidate's predicted time from its terms (O(B) each, no plan built), the
 * lowest wins; ties keep the earlier candidate.  Candidates: the four routes at the planner's wave, and
 * the split, work-queue and fused routes at the other wave of candidate_waves (single does not depend on
 * the wave).  The rule's route is kept when no prediction is finite. */
pkv_route plan_policy_choose(const pkv_cost_model *model, const pkv_plan_options *opts, int32_t parallelism,
                             const plan_caps *pc, const pkv_problem *problem, const int32_t *lens, int32_t B,
                             plan_params *pp, int32_t *wq_chunk) {
    int64_t waves[PKV_MAX_WAVE_CANDIDATES];
    const int nwaves = candidate_waves(pp, opts, parallelism, pc, problem->num_kv_heads, waves);
    static const int pref[TC_COUNT] = {TC_SINGLE, TC_FUSED, TC_SPLIT, TC_WORKQUEUE}; /* ties: the simpler */
    double best_us = INFINITY;
    int64_t best_P = pp->P;
    pkv_route route = plan_auto_rule(pp, problem);
    for (int w = 0; w < nwaves; w++) {
        plan_params pw = *pp;
        pw.P = waves[w];
        const int32_t chunk = plan_workqueue_chunk(&pw, problem, lens, B);
        double t[TC_COUNT][PKV_COST_TERMS];
        candidate_terms(&pw, problem, lens, B, chunk, t);
        for (int k = w == 0 ? 0 : 1; k < TC_COUNT; k++) {
            if (!pkv_cost_candidate(t[pref[k]], parallelism)) continue;
            const double us = pkv_cost_predict(model, t[pref[k]]);
            if (us < best_us) { /* false for NaN */
                best_us = us;
                route = term_routes[pref[k]];
                best_P = waves[w];
                *wq_chunk = chunk;
            }
        }
    }
    pp->P = best_P;
    return route;
}

pkv_status pkv_plan_route_terms(const pkv_backend_caps *caps, const pkv_problem *problem, const pkv_page_table *table,
                                const pkv_plan_options *opts, double terms[PKV_COST_TERMS]) {
    if (!caps) return pkv_fail(NULL, PKV_ERR_NULL_POINTER, "capabilities are NULL");
    pkv_status st = pkv_check_problem(NULL, problem);
    if (st == PKV_OK) st = pkv_check_table(NULL, problem, table, false);
    if (st != PKV_OK) return st;
    const int32_t parallelism = opts && opts->parallelism > 0 ? opts->parallelism : caps->parallelism;
    if (!opts || !terms || parallelism <= 0)
        return pkv_fail(NULL, PKV_ERR_INVALID_ARGUMENT, "options with a parallelism and terms are needed");
    if (opts->route == PKV_ROUTE_AUTO || opts->route == PKV_ROUTE_BUCKETED || opts->route < 0 || opts->route >= PKV_ROUTE_COUNT_)
        return pkv_fail(NULL, PKV_ERR_UNSUPPORTED, "terms without a plan exist for single, split, workqueue and fused");
    pkv_page_table windowed = *table; /* a sliding window: each row's attended tokens */
    int32_t *wl = NULL;
    if (problem->window > 0 && table->batch_size > 0) {
        wl = (int32_t *)malloc((size_t)table->batch_size * sizeof *wl);
        if (!wl) return pkv_fail(NULL, PKV_ERR_OUT_OF_MEMORY, "cannot allocate the window's row lengths");
        plan_window_lengths(problem, table, wl, NULL);
        windowed.seq_lens = wl;
    }
    const plan_caps pc = plan_caps_for(caps, problem);
    plan_params pp;
    plan_resolve_params(opts, parallelism, &pc, problem, &windowed, &pp);
    double t[TC_COUNT][PKV_COST_TERMS];
    candidate_terms(&pp, problem, windowed.seq_lens, table->batch_size, -1, t);
    free(wl);
    int k = 0;
    while (term_routes[k] != opts->route) k++;
    memcpy(terms, t[k], sizeof t[k]);
    return PKV_OK;
}
