/* cpu_backend.c - the CPU backend: executes a plan's tasks and merges, phase by phase, on a small
 * persistent pthread pool.  It never decides a schedule; it runs exactly the lists the planner made,
 * so every route is exercised on a machine without a GPU.
 *
 * A task (row, KV head, [tok_begin, tok_end)) reads its K and V pages in place through
 * kv_page_indices[page_base + tok / page_size] with the layout's strides (no repacking), converts a
 * block of tokens to fp32 once (an fp8 cache is dequantized there: float(code) x the KV head's scale)
 * and applies it to all G query heads of the KV head (query head h = kv_head * G + j), with an online
 * softmax (running max m, running sum l, rescaled numerators).
 * It writes either the final o (dtype, round to nearest even) and lse (natural log), or the partial
 * state of its slot in the workspace:
 *   state_o  fp32 [num_state_slots, G, d]     at workspace + plan->off_state_o  (normalised o_s)
 *   state_ml fp32 [num_state_slots, G, 2]     at workspace + plan->off_state_ml (running max m_s, sum l_s)
 * A merge combines its slots in slot order: M = max_s m_s, w_s = l_s exp(m_s - M), o = sum_s w_s o_s /
 * sum_s w_s, lse = M + ln sum_s w_s.  Weighing by l_s itself keeps each piece's token mass exact at any
 * score: folded into one float lse_s = m_s + ln l_s it would round away once |m_s| >> ln l_s.
 *
 * Every output element is computed by one thread in a fixed order, so a plan's result is bitwise
 * identical run after run, whatever the number of threads.  Threads pull task (or merge) indices
 * from an atomic counter; the calling thread works too.  Nothing is allocated in run: the per-thread
 * scratch (sized for G <= 16 and d <= 256) is made once at init. */
#define _POSIX_C_SOURCE 200809L

#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CPU_MAX_HEAD_DIM 256
#define CPU_TOKEN_BLOCK 32 /* tokens converted to fp32 and scored together */
#define CPU_MAX_THREADS 256

/* ---- fp16 / bf16 / fp8 loads ------------------------------------------------------------------- */
static float half_table[65536]; /* fp16 bit pattern -> float, filled once from pkv_half_to_float */
static float fp8_table[2][256]; /* fp8 code -> float, [0] e4m3, [1] e5m2, from pkv_fp8_to_float */
static pthread_once_t half_loads_once = PTHREAD_ONCE_INIT;

/* x86-64 CPUs with F16C convert 8 halves per instruction (vcvtph2ps, exact like the table, so the results
 * are bitwise the same either way; PKV_CPU_NO_F16C=1 uses the table): fp16 steps 2.0-2.4x faster than
 * with the table on a 2-core AMD EPYC (pkv bench, split route, B4_homo8K and B1_N8192, medians of 5);
 * chosen once at run time, so one build runs on any x86-64. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define PKV_CPU_F16C 1
static bool use_f16c;

/* CPUID.1:ECX has F16C (bit 29) and AVX (28), and the OS saves the YMM registers (OSXSAVE, bit 27, and
 * XCR0's SSE and AVX state bits) - by hand: clang 14's __builtin_cpu_supports does not know "f16c" */
static bool cpu_has_f16c(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned int need = (1u << 27) | (1u << 28) | (1u << 29);
    if ((c & need) != need) return false;
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 6u) == 6u;
}

__attribute__((target("avx,f16c"))) static void load_half_f16c(float *dst, const uint16_t *src, int32_t n) {
    int32_t e = 0;
    for (; e + 8 <= n; e += 8)
        _mm256_storeu_ps(dst + e, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + e))));
    for (; e < n; e++) dst[e] = half_table[src[e]];
}
#endif

/* Once per process: the table, and whether load_row converts by F16C instead. */
static void half_loads_init(void) {
    for (uint32_t h = 0; h < 65536u; h++) half_table[h] = pkv_half_to_float((uint16_t)h);
    for (uint32_t c = 0; c < 256u; c++) {
        fp8_table[0][c] = pkv_fp8_to_float((uint8_t)c, 0);
        fp8_table[1][c] = pkv_fp8_to_float((uint8_t)c, 1);
    }
#ifdef PKV_CPU_F16C
    use_f16c = cpu_has_f16c() && pkv_tuning_env_cpu_f16c(); /* PKV_TUNING cpu_f16c (tuning.c) */
#endif
}

/* dst [n] fp32 <- src [n] fp16 or bf16 */
static void load_row(float *dst, const uint16_t *src, int32_t n, pkv_dtype dtype) {
    if (dtype == PKV_DTYPE_BF16) {
        for (int32_t e = 0; e < n; e++) {
            uint32_t bits = (uint32_t)src[e] << 16;
            memcpy(&dst[e], &bits, sizeof bits);
        }
        return;
    }
#ifdef PKV_CPU_F16C
    if (use_f16c) {
        load_half_f16c(dst, src, n);
        return;
    }
#endif
    for (int32_t e = 0; e < n; e++) dst[e] = half_table[src[e]];
}

/* dst [n] fp32 <- n cache elements from element `at` of base (the problem's kv_dtype): fp16 / bf16 as they
 * are, fp8 dequantized as float(code) x scale */
static void load_kv_row(float *dst, const void *base, int64_t at, int32_t n, pkv_dtype kv_dtype, float scale) {
    if (pkv_dtype_is_fp8(kv_dtype)) {
        const uint8_t *src = (const uint8_t *)base + at;
        const float *table = fp8_table[kv_dtype == PKV_DTYPE_FP8_E5M2];
        for (int32_t e = 0; e < n; e++) dst[e] = table[src[e]] * scale;
        return;
    }
    load_row(dst, (const uint16_t *)base + at, n, kv_dtype);
}

/* dst [n] fp16 or bf16 <- src [n] fp32 * factor (round to nearest even) */
static void store_row(uint16_t *dst, const float *src, float factor, int32_t n, pkv_dtype dtype) {
    if (dtype == PKV_DTYPE_BF16)
        for (int32_t e = 0; e < n; e++) dst[e] = pkv_float_to_bf16(src[e] * factor);
    else
        for (int32_t e = 0; e < n; e++) dst[e] = pkv_float_to_half(src[e] * factor);
}

/* Dot product of two fp32 rows of d elements (d a multiple of 8), 8 partial sums in a fixed order. */
static float dot_row(const float *a, const float *b, int32_t d) {
    float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int32_t e = 0; e < d; e += 8)
        for (int32_t r = 0; r < 8; r++) part[r] += a[e + r] * b[e + r];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

/* ---- per-thread scratch and the pool ---------------------------------------------------------- */
typedef struct cpu_scratch {
    float q[PKV_MAX_GROUP * CPU_MAX_HEAD_DIM];        // q of the G heads [G, d]
    float acc[PKV_MAX_GROUP * CPU_MAX_HEAD_DIM];      // running numerators [G, d]
    float kv[CPU_TOKEN_BLOCK * CPU_MAX_HEAD_DIM];     // K, then V, of one token block [T, d]
    float p[PKV_MAX_GROUP * CPU_TOKEN_BLOCK];         // scores, then weights [G, T]
    float m[PKV_MAX_GROUP], l[PKV_MAX_GROUP];         // running max and sum per head
} cpu_scratch;

typedef enum cpu_job_kind { CPU_JOB_TASKS = 0, CPU_JOB_MERGES = 1 } cpu_job_kind;

typedef struct cpu_job {
    cpu_job_kind kind;
    const pkv_plan *plan;
    const pkv_tensors *tensors;
    char *workspace;
    int32_t begin, count; /* tasks or merges [begin, begin + count) */
} cpu_job;

typedef struct cpu_pool cpu_pool;

typedef struct cpu_worker {
    cpu_pool *pool;
    int32_t index; /* 1..num_threads-1; the calling thread is 0 */
} cpu_worker;

struct cpu_pool {
    int32_t num_threads;
    int32_t num_started;       /* workers created */
    pthread_t *threads;        /* [num_threads - 1] */
    cpu_worker *workers;       /* [num_threads - 1] */
    cpu_scratch *scratch;      /* [num_threads] */
    pthread_mutex_t mutex;     /* guards job, generation, pending, stop */
    pthread_cond_t wake;       /* a new job or stop */
    pthread_cond_t done;       /* pending reached 0 */
    pthread_mutex_t run_lock;  /* one run at a time on a context */
    uint64_t generation;
    int32_t pending;           /* workers still on the current job */
    bool stop;
    cpu_job job;
    atomic_int_fast32_t next;  /* next index of the current job */
};

/* ---- one task ----------------------------------------------------------------------------------- */
static void run_task(const cpu_job *job, int32_t k, cpu_scratch *sc) {
    const pkv_plan *plan = job->plan;
    const pkv_problem *p = &plan->problem;
    const pkv_tensors *t = job->tensors;
    const pkv_task *task = &plan->tasks[k];
    const int32_t G = plan->group, d = p->head_dim, hq = p->num_qo_heads, ps = p->page_size;
    const pkv_dtype dtype = p->dtype, kv_dtype = pkv_kv_dtype(p);
    const float scale = pkv_problem_scale(p), cap = p->logits_soft_cap;
    /* an fp8 cache's scales for this KV head (a cache of dtype has none: 1) */
    const float k_scale = t->k_head_scales ? t->k_head_scales[task->kv_head] : pkv_scale_or_one(t->k_scale);
    const float v_scale = t->v_head_scales ? t->v_head_scales[task->kv_head] : pkv_scale_or_one(t->v_scale);
    const pkv_kv_strides kvs = pkv_kv_strides_run(p, t);
    const int32_t h0 = task->kv_head * G; /* first query head of the group */

    float *state_o = NULL, *state_ml = NULL;
    if (task->state_slot >= 0) {
        state_o = (float *)(job->workspace + plan->off_state_o) + (int64_t)task->state_slot * G * d;
        state_ml = (float *)(job->workspace + plan->off_state_ml) + (int64_t)task->state_slot * G * 2;
    }
    uint16_t *o16 = (uint16_t *)t->o + task->row * pkv_row_stride(p, t->o_row_stride) + (int64_t)h0 * d;
    float *lse_out = t->lse ? t->lse + (int64_t)task->row * hq + h0 : NULL; // lse [B, Hq]

    if (task->tok_end <= task->tok_begin) { /* neutral state, read no KV (the planner makes none) */
        for (int32_t j = 0; j < G; j++) {
            if (state_o) {
                memset(state_o + (int64_t)j * d, 0, (size_t)d * sizeof(float));
                state_ml[2 * j] = -INFINITY;
                state_ml[2 * j + 1] = 0.0f;
            } else {
                memset(o16 + (int64_t)j * d, 0, (size_t)d * sizeof(uint16_t));
                if (lse_out) lse_out[j] = -INFINITY;
            }
        }
        return;
    }

    const uint16_t *q16 = (const uint16_t *)t->q + task->row * pkv_row_stride(p, t->q_row_stride) + (int64_t)h0 * d;
    for (int32_t j = 0; j < G; j++) {
        load_row(sc->q + (int64_t)j * d, q16 + (int64_t)j * d, d, dtype);
        sc->m[j] = -INFINITY;
        sc->l[j] = 0.0f;
    }
    memset(sc->acc, 0, (size_t)G * (size_t)d * sizeof(float));

    const int32_t *pages = t->kv_page_indices + task->page_base;
    const int64_t head_off = (int64_t)task->kv_head * kvs.head;

    for (int32_t tok0 = task->tok_begin; tok0 < task->tok_end; tok0 += CPU_TOKEN_BLOCK) {
        const int32_t nt = task->tok_end - tok0 < CPU_TOKEN_BLOCK ? task->tok_end - tok0 : CPU_TOKEN_BLOCK;
        /* K rows of the block, then the scores p[j, x] = scale * q_j . k_x */
        for (int32_t x = 0; x < nt; x++) {
            const int32_t tok = tok0 + x;
            const int64_t at = (int64_t)pages[tok / ps] * kvs.page + head_off + (int64_t)(tok % ps) * kvs.token;
            load_kv_row(sc->kv + (int64_t)x * d, t->k_cache, at, d, kv_dtype, k_scale);
        }
        for (int32_t j = 0; j < G; j++)
            for (int32_t x = 0; x < nt; x++)
                sc->p[j * CPU_TOKEN_BLOCK + x] = scale * dot_row(sc->q + (int64_t)j * d, sc->kv + (int64_t)x * d, d);
        if (cap > 0.0f) /* logits soft-capping */
            for (int32_t j = 0; j < G; j++)
                for (int32_t x = 0; x < nt; x++) {
                    float *s = &sc->p[j * CPU_TOKEN_BLOCK + x];
                    *s = cap * tanhf(*s / cap);
                }
        /* V rows of the block */
        for (int32_t x = 0; x < nt; x++) {
            const int32_t tok = tok0 + x;
            const int64_t at = (int64_t)pages[tok / ps] * kvs.page + head_off + (int64_t)(tok % ps) * kvs.token;
            load_kv_row(sc->kv + (int64_t)x * d, t->v_cache, at, d, kv_dtype, v_scale);
        }
        /* online softmax: new max, rescale the running sum and numerators once per block */
        for (int32_t j = 0; j < G; j++) {
            float *pj = sc->p + j * CPU_TOKEN_BLOCK;
            float block_max = pj[0];
            for (int32_t x = 1; x < nt; x++)
                if (pj[x] > block_max) block_max = pj[x];
            const float m_new = block_max > sc->m[j] ? block_max : sc->m[j];
            const float alpha = sc->m[j] == -INFINITY ? 0.0f : expf(sc->m[j] - m_new);
            float sum = 0.0f;
            for (int32_t x = 0; x < nt; x++) {
                pj[x] = expf(pj[x] - m_new);
                sum += pj[x];
            }
            sc->l[j] = sc->l[j] * alpha + sum;
            sc->m[j] = m_new;
            float *acc = sc->acc + (int64_t)j * d;
            if (alpha != 1.0f)
                for (int32_t e = 0; e < d; e++) acc[e] *= alpha;
            for (int32_t x = 0; x < nt; x++) {
                const float w = pj[x];
                const float *v = sc->kv + (int64_t)x * d;
                for (int32_t e = 0; e < d; e++) acc[e] += w * v[e];
            }
        }
    }

    for (int32_t j = 0; j < G; j++) {
        const float inv_l = 1.0f / sc->l[j];
        const float *acc = sc->acc + (int64_t)j * d;
        if (state_o) {
            float *so = state_o + (int64_t)j * d;
            for (int32_t e = 0; e < d; e++) so[e] = acc[e] * inv_l;
            state_ml[2 * j] = sc->m[j];
            state_ml[2 * j + 1] = sc->l[j];
        } else {
            store_row(o16 + (int64_t)j * d, acc, inv_l, d, dtype);
            if (lse_out) lse_out[j] = sc->m[j] + logf(sc->l[j]);
        }
    }
}

/* ---- one merge ---------------------------------------------------------------------------------- */
static void run_merge(const cpu_job *job, int32_t k, cpu_scratch *sc) {
    const pkv_plan *plan = job->plan;
    const pkv_problem *p = &plan->problem;
    const pkv_tensors *t = job->tensors;
    const pkv_merge *mg = &plan->merges[k];
    const int32_t G = plan->group, d = p->head_dim, hq = p->num_qo_heads;
    const int32_t h0 = mg->kv_head * G;
    uint16_t *o16 = (uint16_t *)t->o + mg->row * pkv_row_stride(p, t->o_row_stride) + (int64_t)h0 * d;
    float *lse_out = t->lse ? t->lse + (int64_t)mg->row * hq + h0 : NULL; // lse [B, Hq]
    const float *state_o = mg->count > 0 ? (const float *)(job->workspace + plan->off_state_o) : NULL;
    const float *state_ml = mg->count > 0 ? (const float *)(job->workspace + plan->off_state_ml) : NULL;

    for (int32_t j = 0; j < G; j++) {
        /* M over the states that hold tokens (a neutral state, l = 0, weighs nothing); a state whose sum is NaN
         * (a NaN score: a NaN in an attended K) makes the head's o and lse NaN, as an unsplit task's are */
        float M = -INFINITY;
        bool nan_state = false;
        for (int32_t s = 0; s < mg->count; s++) {
            const float *ml = state_ml + ((int64_t)(mg->first_slot + s) * G + j) * 2;
            if (isnan(ml[1])) nan_state = true;
            else if (ml[1] > 0.0f && ml[0] > M) M = ml[0];
        }
        if (nan_state) {
            const float nan = NAN;
            for (int32_t e = 0; e < d; e++) sc->acc[e] = nan;
            store_row(o16 + (int64_t)j * d, sc->acc, 1.0f, d, p->dtype);
            if (lse_out) lse_out[j] = nan;
            continue;
        }
        if (M == -INFINITY) { /* empty row (count 0) or only neutral states */
            memset(o16 + (int64_t)j * d, 0, (size_t)d * sizeof(uint16_t));
            if (lse_out) lse_out[j] = -INFINITY;
            continue;
        }
        float L = 0.0f;
        float *acc = sc->acc;
        memset(acc, 0, (size_t)d * sizeof(float));
        for (int32_t s = 0; s < mg->count; s++) {
            const int64_t slot_head = (int64_t)(mg->first_slot + s) * G + j;
            const float *ml = state_ml + slot_head * 2;
            if (!(ml[1] > 0.0f)) continue;
            const float w = ml[1] * expf(ml[0] - M);
            L += w;
            const float *os = state_o + slot_head * d;
            for (int32_t e = 0; e < d; e++) acc[e] += w * os[e];
        }
        store_row(o16 + (int64_t)j * d, acc, 1.0f / L, d, p->dtype);
        if (lse_out) lse_out[j] = M + logf(L);
    }
}

/* ---- the pool ----------------------------------------------------------------------------------- */
static void work_on(cpu_pool *pool, const cpu_job *job, cpu_scratch *sc) {
    for (;;) {
        int_fast32_t i = atomic_fetch_add_explicit(&pool->next, 1, memory_order_relaxed);
        if (i >= job->count) break;
        if (job->kind == CPU_JOB_TASKS)
            run_task(job, job->begin + (int32_t)i, sc);
        else
            run_merge(job, job->begin + (int32_t)i, sc);
    }
}

static void *worker_main(void *arg) {
    cpu_worker *w = (cpu_worker *)arg;
    cpu_pool *pool = w->pool;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mutex);
        while (!pool->stop && pool->generation == seen) pthread_cond_wait(&pool->wake, &pool->mutex);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->mutex);
            return NULL;
        }
        seen = pool->generation;
        cpu_job job = pool->job;
        pthread_mutex_unlock(&pool->mutex);

        work_on(pool, &job, &pool->scratch[w->index]);

        pthread_mutex_lock(&pool->mutex);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->mutex);
    }
}

/* Runs job over all threads and returns when every index is done. */
static void dispatch(cpu_pool *pool, const cpu_job *job) {
    if (job->count <= 0) return;
    if (pool->num_started == 0 || job->count == 1) {
        atomic_store(&pool->next, 0);
        work_on(pool, job, &pool->scratch[0]);
        return;
    }
    pthread_mutex_lock(&pool->mutex);
    pool->job = *job;
    atomic_store(&pool->next, 0);
    pool->pending = pool->num_started;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);

    work_on(pool, job, &pool->scratch[0]);

    pthread_mutex_lock(&pool->mutex);
    while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->mutex);
    pthread_mutex_unlock(&pool->mutex);
}

static void pool_destroy(cpu_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    pool->stop = true;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int32_t i = 0; i < pool->num_started; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    pthread_mutex_destroy(&pool->run_lock);
    free(pool->threads);
    free(pool->workers);
    free(pool->scratch);
    free(pool);
}

/* ---- backend operations ------------------------------------------------------------------------- */
static pkv_status cpu_supports(pkv_context *ctx, const pkv_problem *p) {
    if (p->dtype != PKV_DTYPE_FP16 && p->dtype != PKV_DTYPE_BF16)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_DTYPE, "the CPU backend runs fp16 and bf16, not dtype %d", (int)p->dtype);
    if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED_HEAD_DIM, "the CPU backend runs head dims 64, 128, 256, not %d",
                        p->head_dim);
    if (p->num_kv_heads <= 0 || p->num_qo_heads % p->num_kv_heads != 0)
        return pkv_fail(ctx, PKV_ERR_HEAD_GROUP, "num_qo_heads %d is not a multiple of num_kv_heads %d",
                        p->num_qo_heads, p->num_kv_heads);
    if (p->num_qo_heads / p->num_kv_heads > PKV_MAX_GROUP)
        return pkv_fail(ctx, PKV_ERR_UNSUPPORTED, "the CPU backend runs G <= %d, not %d", PKV_MAX_GROUP,
                        p->num_qo_heads / p->num_kv_heads);
    return PKV_OK;
}

/* Every page a task reads must be a valid id: the run's page indices are the caller's memory and
 * may differ from the table the plan checked.  O(pages x Hkv), no allocation. */
static pkv_status check_task_pages(pkv_context *ctx, const pkv_plan *plan, const int32_t *page_indices) {
    const int32_t ps = plan->problem.page_size;
    const int64_t num_pages = plan->problem.num_pages;
    for (int32_t k = 0; k < plan->num_tasks; k++) {
        const pkv_task *task = &plan->tasks[k];
        if (task->tok_end <= task->tok_begin) continue;
        for (int32_t j = task->tok_begin / ps; j <= (task->tok_end - 1) / ps; j++) {
            const int32_t pg = page_indices[task->page_base + j];
            if (pg < 0 || (int64_t)pg >= num_pages) {
                if (!ctx->has_page_fault) {
                    ctx->page_fault = (pkv_page_fault){task->row, task->kv_head, j, pg};
                    ctx->has_page_fault = true;
                }
                return pkv_fail(ctx, PKV_ERR_PAGE_OUT_OF_RANGE,
                                "kv_page_indices[%d] = %d (row %d, KV head %d, page %d of the row) is outside [0, %lld)",
                                task->page_base + j, pg, task->row, task->kv_head, j, (long long)num_pages);
            }
        }
    }
    return PKV_OK;
}

static pkv_status cpu_run(pkv_context *ctx, const pkv_plan *plan, void *workspace, size_t ws_bytes,
                          const pkv_tensors *t, void *stream) {
    cpu_pool *pool = (cpu_pool *)ctx->backend_state;
    if (plan->num_tasks > 0) {
        pkv_status st = check_task_pages(ctx, plan, t->kv_page_indices);
        if (st == PKV_OK) st = pkv_check_head_scales(ctx, &plan->problem, t->k_head_scales, t->v_head_scales, "pkv_run");
        if (st != PKV_OK) return st;
    }
    pthread_mutex_lock(&pool->run_lock);
    cpu_job job;
    job.plan = plan;
    job.tensors = t;
    job.workspace = (char *)workspace;
    for (int32_t ph = 0; ph < plan->num_phases; ph++) {
        const pkv_phase *phase = &plan->phases[ph];
        job.kind = CPU_JOB_TASKS;
        job.begin = phase->task_begin;
        job.count = phase->task_end - phase->task_begin;
        dispatch(pool, &job);
        job.kind = CPU_JOB_MERGES;
        job.begin = phase->merge_begin;
        job.count = phase->merge_end - phase->merge_begin;
        dispatch(pool, &job);
    }
    pthread_mutex_unlock(&pool->run_lock);
    return PKV_OK;
}

static void cpu_destroy(pkv_context *ctx) {
    pool_destroy((cpu_pool *)ctx->backend_state);
    ctx->backend_state = NULL;
}

static const pkv_backend_ops cpu_ops = {
    .name = "cpu",
    .run = cpu_run,
    .upload = NULL,
    .supports = cpu_supports,
    .destroy = cpu_destroy,
    .append = pkv_cpu_append,
    .copy_pages = pkv_cpu_copy_pages,
};

pkv_status pkv_cpu_backend_init(pkv_context *ctx, int32_t num_threads) {
    if (num_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        num_threads = n > 0 ? (int32_t)(n < CPU_MAX_THREADS ? n : CPU_MAX_THREADS) : 1;
    }
    if (num_threads > CPU_MAX_THREADS) num_threads = CPU_MAX_THREADS;
    pthread_once(&half_loads_once, half_loads_init);

    cpu_pool *pool = (cpu_pool *)calloc(1, sizeof *pool);
    if (!pool) return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot allocate the CPU thread pool");
    pool->num_threads = num_threads;
    const int32_t nw = num_threads - 1;
    pool->threads = (pthread_t *)calloc((size_t)(nw > 0 ? nw : 1), sizeof *pool->threads);
    pool->workers = (cpu_worker *)calloc((size_t)(nw > 0 ? nw : 1), sizeof *pool->workers);
    pool->scratch = (cpu_scratch *)calloc((size_t)num_threads, sizeof *pool->scratch);
    if (!pool->threads || !pool->workers || !pool->scratch) {
        free(pool->threads);
        free(pool->workers);
        free(pool->scratch);
        free(pool);
        return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot allocate the CPU thread pool's scratch");
    }
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pthread_mutex_init(&pool->run_lock, NULL);
    atomic_init(&pool->next, 0);
    for (int32_t i = 0; i < nw; i++) {
        pool->workers[i].pool = pool;
        pool->workers[i].index = i + 1;
        if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->workers[i]) != 0) {
            pool_destroy(pool);
            return pkv_fail(ctx, PKV_ERR_OUT_OF_MEMORY, "cannot start CPU worker thread %d of %d", i + 1, nw);
        }
        pool->num_started++;
    }
    ctx->backend_state = pool;
    ctx->ops = &cpu_ops;
    ctx->caps.parallelism = num_threads;
    ctx->caps.ctas_per_unit = 4;
    snprintf(ctx->device_name, sizeof ctx->device_name, "cpu (%d thread%s)", (int)num_threads,
             num_threads == 1 ? "" : "s");
    return PKV_OK;
}
