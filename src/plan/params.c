/* params.c - the step's parameters: the wave P the planner fills, from the backend's capabilities
 * and the step's rows; the split count S and each row's chunk of the rectangular routes; the work
 * queue's chunk; a sliding window's row lengths.
 *
 * Split rules (P = parallelism x ctas_per_unit, the number of tasks the device runs in one wave;
 * chunks are whole pages, at least min_chunk_tokens long, at most max_splits per (row, KV head)):
 *   single     S = 1 for every row.
 *   split      S = ceil(P / (nonempty_rows x Hkv)) (floor when every non-empty row has the same page
 *              count: one wave), capped so the longest row's chunks stay at least
 *              min_chunk_tokens long; row i uses chunk_i = max(ceil(pages_i / S), min_chunk) pages
 *              and ceil(pages_i / chunk_i) <= S splits (the rest of its grid column exits early).
 *   bucketed   rows grouped by floor(log2(N)); each bucket is planned as `split` on its own.
 *   workqueue  one chunk size c for the whole step: the smallest c >= min_chunk such that
 *              sum_i ceil(pages_i / c) x Hkv <= P (one wave); if even c = max pages does not fit,
 *              no row is split.
 * The wave (plan_resolve_params): P grows to PKV_RAGGED_WAVES waves of resident tasks for ragged
 * batches of >= PKV_RAGGED_MANY_PAIRS (row, KV head) pairs; for even batches of more pairs than one
 * wave, to the waves that fill best when each pair is split 1..PKV_EVEN_MAX_SPLIT ways; and to one
 * wave of every resident CTA where the backend gathers the pages row by row under a kernel of small
 * tiles (PKV_SMALL_TILE_RESIDENT resident CTAs per unit or more).
 */
#include "plan_internal.h"

#include <limits.h>

/* Tasks per parallel unit: the wave the planner fills (the backend's default) and the tasks the device
 * holds resident (CUDA: CTAs per SM of the kernel that runs this problem, read at d = 128 for d <= 128;
 * the lighter kernel for G <= PKV_CAPS_GROUP_SPLIT may hold more than the other, for 16-bit and fp8
 * caches alike). */
static bool heavy_kernel(const pkv_problem *p) {
    return p->num_qo_heads > PKV_CAPS_GROUP_SPLIT * p->num_kv_heads;
}
static int32_t resident_ctas(const pkv_backend_caps *caps, const pkv_problem *p) {
    const int32_t light = caps->resident[1][0]; /* d = 128, G <= PKV_CAPS_GROUP_SPLIT */
    if (light > 0 && !heavy_kernel(p) && p->head_dim <= 128) return light;
    return caps->ctas_per_unit;
}

/* The exact residency of the kernel that runs the problem at its head dim (CUDA: the occupancy API),
 * else resident_ctas. */
static int32_t resident_exact(const pkv_backend_caps *caps, const pkv_problem *p) {
    const int di = pkv_caps_dim_index(p->head_dim);
    const int gi = heavy_kernel(p);
    if (di >= 0 && caps->resident[di][gi] > 0) return caps->resident[di][gi];
    return resident_ctas(caps, p);
}

plan_caps plan_caps_for(const pkv_backend_caps *caps, const pkv_problem *p) {
    plan_caps pc;
    pc.parallelism = caps->parallelism;
    pc.per_unit = caps->ctas_per_unit;
    pc.resident = resident_ctas(caps, p);
    pc.resident_x = resident_exact(caps, p);
    /* the largest power of two that divides the page size, against the backend's threshold (a rule of the
     * ring kernel's cp.async fill, which fp8 caches never run) */
    pc.row_gathered = caps->row_gather_below > 0 && (p->page_size & -p->page_size) < caps->row_gather_below &&
                      !pkv_dtype_is_fp8(p->kv_dtype);
    return pc;
}

/* Resident task slots the planner's waves count: parallelism x the larger of the CTAs per unit (at least
 * per_unit) and the kernel's exact residency. */
int64_t plan_resident_slots(int64_t parallelism, int64_t per_unit, int64_t resident, int64_t resident_x) {
    const int64_t r = resident > per_unit ? resident : per_unit;
    return parallelism * (resident_x > r ? resident_x : r);
}

/* The step's tallies: non-empty rows, tokens, longest and shortest non-empty row, raggedness. */
static void tally_rows(const pkv_page_table *table, plan_params *pp) {
    int64_t nonempty = 0, total = 0, max_len = 0, min_len = INT64_MAX;
    for (int32_t i = 0; i < table->batch_size; i++) {
        int32_t n = table->seq_lens[i];
        nonempty += n > 0;
        total += n;
        if (n > max_len) max_len = n;
        if (n > 0 && n < min_len) min_len = n;
    }
    pp->nonempty = nonempty;
    pp->total = total;
    pp->max_len = max_len;
    pp->min_len = nonempty ? min_len : 0;
    pp->ragged = nonempty > 0 && PKV_RAGGED_DEN * max_len * nonempty > PKV_RAGGED_NUM * total;
}

/* An even batch with more (row, KV head) pairs than one wave: unsplit, the last wave of resident tasks R
 * may run nearly empty (512 pairs on 396 resident CTAs: 1.3 waves in the time of 2).  Split each pair
 * S = 1..PKV_EVEN_MAX_SPLIT ways and keep the S whose last wave is fullest (a larger S only when fuller by
 * more than 1 / PKV_EVEN_FULLER_DIV); P becomes those waves of R. */
static void even_batch_waves(int64_t units, int64_t R, plan_params *pp) {
    int64_t best_waves = pkv_ceil_div(units, R), best_num = units, best_den = best_waves * R;
    for (int64_t S = 2; S <= PKV_EVEN_MAX_SPLIT; S++) {
        const int64_t w = pkv_ceil_div(units * S, R);
        if (units * S * best_den > best_num * w * R + best_num * w * R / PKV_EVEN_FULLER_DIV) {
            best_waves = w;
            best_num = units * S;
            best_den = w * R;
        }
    }
    if (best_num != units) pp->P = best_waves * R;
}

/* The planner's parameters for a step: P (tasks per wave), chunk bounds and forced values.  Ragged
 * batches of >= PKV_RAGGED_MANY_PAIRS pairs get PKV_RAGGED_WAVES waves of resident tasks, so that more,
 * smaller tasks let the hardware scheduler even out the load; fewer ragged pairs keep one wave (one wave
 * of every resident CTA under a kernel of small tiles); even batches keep one wave unless they overflow
 * it (even_batch_waves). */
void plan_resolve_params(const pkv_plan_options *opts, int32_t parallelism, const plan_caps *pc,
                         const pkv_problem *problem, const pkv_page_table *table, plan_params *pp) {
    const int32_t per_unit = opts->ctas_per_unit > 0 ? opts->ctas_per_unit : pc->per_unit;
    const int32_t resident = pc->resident < per_unit ? per_unit : pc->resident, resident_x = pc->resident_x;
    const bool planner_wave = opts->ctas_per_unit <= 0; /* the wave is the planner's to choose */
    pp->P = (int64_t)parallelism * per_unit;
    pp->P_bucketed = 0;
    pp->slots = plan_resident_slots(parallelism, per_unit, resident, resident_x);
    const int32_t min_tokens = opts->min_chunk_tokens > 0 ? opts->min_chunk_tokens : PKV_DEFAULT_MIN_CHUNK_TOKENS;
    pp->min_chunk_pages = (int32_t)pkv_ceil_div(min_tokens, problem->page_size);
    pp->max_splits = opts->max_splits > 0 ? opts->max_splits : PKV_DEFAULT_MAX_SPLITS;
    pp->forced_splits = opts->num_splits;
    pp->forced_chunk = opts->chunk_pages;
    tally_rows(table, pp);
    const int64_t units = pp->nonempty * problem->num_kv_heads;
    const bool many_ragged = pp->ragged && units >= PKV_RAGGED_MANY_PAIRS;
    if (planner_wave && pp->ragged) {
        if (many_ragged)
            pp->P = (int64_t)parallelism * resident * PKV_RAGGED_WAVES;
        else if (units >= PKV_SMALL_TILE_MIN_PAIRS && resident_x >= PKV_SMALL_TILE_RESIDENT)
            /* a kernel of small tiles needs them all in flight: one wave of the resident tasks.  Not for
             * the bucketed baseline, whose phases each fill the wave. */
            pp->P_bucketed = pp->P, pp->P = (int64_t)parallelism * resident_x;
    } else if (planner_wave && units > pp->P) {
        even_batch_waves(units, (int64_t)parallelism * resident, pp);
    }
    if (planner_wave && pc->row_gathered && resident_x >= PKV_SMALL_TILE_RESIDENT && !many_ragged &&
        pp->P < (int64_t)parallelism * resident_x)
        /* pages gathered row by row (the backend's row_gather_below) by a kernel of small tiles: the wave
         * counts every resident CTA, for the memory requests in flight.  Ragged batches of many pairs keep
         * their waves of the resident tasks. */
        pp->P = (int64_t)parallelism * resident_x;
}

/* S for a set of rows under the `split` rule (rows NULL: all rows of the step, whose tallies are in pp).
 * Rows of one page count split into at most one wave (floor), where ceil would put up to pairs - 1
 * tasks past it; ragged rows keep ceil: one more split shortens the longest row's chunks. */
int32_t plan_choose_splits(const plan_params *pp, const pkv_problem *p, const int32_t *lens, const int32_t *rows,
                           int32_t nrows) {
    if (pp->forced_splits > 0) return pp->forced_splits < pp->max_splits ? pp->forced_splits : pp->max_splits;
    int64_t nonempty = 0;
    int32_t max_pages = 0, min_pages = INT32_MAX;
    if (!rows) {
        nonempty = pp->nonempty;
        max_pages = pkv_row_pages(p, (int32_t)pp->max_len);
        min_pages = pkv_row_pages(p, (int32_t)pp->min_len);
    } else {
        for (int32_t k = 0; k < nrows; k++) {
            int32_t n = lens[rows[k]];
            if (n > 0) nonempty++;
            int32_t pg = pkv_row_pages(p, n);
            if (pg > max_pages) max_pages = pg;
            if (n > 0 && pg < min_pages) min_pages = pg;
        }
    }
    if (nonempty == 0) return 1;
    const int64_t pairs = nonempty * p->num_kv_heads;
    int64_t s = min_pages == max_pages ? pp->P / pairs : pkv_ceil_div(pp->P, pairs);
    int64_t by_len = pkv_ceil_div(max_pages, pp->min_chunk_pages);
    if (s > by_len) s = by_len;
    if (s > pp->max_splits) s = pp->max_splits;
    return s < 1 ? 1 : (int32_t)s;
}

/* Chunk (pages) of one row under S splits. */
int32_t plan_row_chunk_pages(const plan_params *pp, int32_t pages, int32_t S) {
    if (pages <= 0) return 1; /* an empty row: no split (a large min_chunk_tokens x page_size would overflow) */
    int64_t c = pkv_ceil_div(pages, S);
    if (S > 1 && c < pp->min_chunk_pages) c = pp->min_chunk_pages;
    if (pages > 0 && c > pages) c = pages;
    if (c < 1) c = 1;
    return (int32_t)c;
}

/* Workqueue chunk: smallest c with sum ceil(pages_i / c) x Hkv <= P.  The per-row passes vectorise
 * (PKV_VECTOR_CLONES). */
PKV_VECTOR_CLONES
static int32_t workqueue_chunk(const plan_params *pp, const pkv_problem *p, const int32_t *lens, int32_t B) {
    const int32_t max_pages = pkv_row_pages(p, (int32_t)pp->max_len);
    if (max_pages == 0) return 1;
    int32_t lo_cap = (int32_t)pkv_ceil_div(max_pages, pp->max_splits); /* respect max_splits */
    if (pp->forced_chunk > 0) {
        int32_t c = pp->forced_chunk > lo_cap ? pp->forced_chunk : lo_cap;
        return c < max_pages ? c : max_pages;
    }
    int32_t lo = pp->min_chunk_pages > lo_cap ? pp->min_chunk_pages : lo_cap;
    if (lo >= max_pages) return max_pages;
    int32_t hi = max_pages;
    /* cost(hi) = the non-empty rows may exceed P (many rows): then no split at all. */
    if (pp->nonempty * p->num_kv_heads > pp->P) return max_pages;
    /* divisions by reciprocal (exact, see policy.c, candidate_terms) */
    const int64_t budget = pp->P / p->num_kv_heads;
    const double inv_ps = 1.0 / p->page_size, ps_up = p->page_size - 0.5;
    /* bounds from sum(pages) / c <= cost(c) <= sum(pages) / c + rows (one O(B) pass for the pages
     * total, then fewer passes of the search): cost(c) <= budget needs c >= sum / budget and holds
     * once c >= sum / (budget - rows) */
    int64_t sum_pages = 0;
    for (int32_t i = 0; i < B; i++) sum_pages += (int64_t)((lens[i] + ps_up) * inv_ps);
    const int64_t lo_sum = pkv_ceil_div(sum_pages, budget > 0 ? budget : 1);
    if (lo_sum > lo) lo = lo_sum < hi ? (int32_t)lo_sum : hi;
    if (budget > pp->nonempty) {
        const int64_t hi_sum = pkv_ceil_div(sum_pages, budget - pp->nonempty);
        if (hi_sum < hi && hi_sum >= lo) hi = (int32_t)hi_sum;
    }
    /* each count is a branch-free int32 pass the compiler vectorises: mid >= sum / budget, so the
     * count stays below budget + B, and a row's pages fit in int32 (the indptr does) */
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        const double inv_mid = 1.0 / mid, mid_up = mid - 0.5;
        int32_t cost = 0;
        for (int32_t i = 0; i < B; i++) {
            const double pages = (double)(int32_t)((lens[i] + ps_up) * inv_ps);
            cost += (int32_t)((pages + mid_up) * inv_mid);
        }
        if (cost <= budget)
            hi = (int32_t)mid;
        else
            lo = (int32_t)mid + 1;
    }
    return lo;
}

/* The cloned function stays file-local: an ifunc resolver of a function with external linkage would be
 * exported from the shared library whatever its visibility. */
int32_t plan_workqueue_chunk(const plan_params *pp, const pkv_problem *p, const int32_t *lens, int32_t B) {
    return workqueue_chunk(pp, p, lens, B);
}

/* Under a sliding window a row is planned from the start of the page that holds its first attended
 * token (its splits then start on page boundaries, so the tensor-copy kernel's 16-token tiles of every
 * split but the first are whole; the first task starts at the window, emit.c emit_row): each row's
 * length from there (lens) and, when starts is given, that page-aligned start. */
void plan_window_lengths(const pkv_problem *p, const pkv_page_table *t, int32_t *lens, int32_t *starts) {
    for (int32_t i = 0; i < t->batch_size; i++) {
        const int32_t s = pkv_page_floor(p, pkv_row_start(p, t->seq_lens[i]));
        lens[i] = t->seq_lens[i] - s;
        if (starts) starts[i] = s;
    }
}
