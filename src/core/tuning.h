/* tuning.h - the library's tuning switches: one environment variable, PKV_TUNING=key=value,key=value,
 * parsed once per context at its creation (tuning.c, whose top comment documents every key) into a
 * pkv_tuning stored on the context.  Backends read the context's struct, never the environment. */
#ifndef PKV_TUNING_H
#define PKV_TUNING_H

#include "persistentkv.h"

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PKV_TUNING_PATH_MAX 1024 /* bytes of a path (timeline_out, PKV_POLICY), its terminating zero included */
#define PKV_TUNING_MAX_STAGES 6  /* tma_stages: the deepest ring the tensor-copy kernel has room for (src/cuda) */

/* merge=: which merge kernel the CUDA backend launches */
typedef enum pkv_tuning_merge {
    PKV_TUNING_MERGE_AUTO = 0, /* chosen per plan (and per graph-stable step) by the merges' width */
    PKV_TUNING_MERGE_HEAD = 1, /* a CTA per (merge, query head) */
    PKV_TUNING_MERGE_ROW = 2   /* a CTA per merge */
} pkv_tuning_merge;

typedef struct pkv_tuning {
    bool tma;                  /* tma: the sm_90 shared-memory ring kernel where the shape allows (else registers) */
    int32_t tma_stages;        /* tma_stages: that ring's stages per warp; 0: the device's default */
    pkv_tuning_merge merge;    /* merge */
    int32_t merge_wide_at;     /* merge_wide_at: dependent state-load batches from which a merge is "wide" */
    int32_t claim_sms;         /* claim_sms: SMs the graph-stable claim deals tasks over; 0: the device's */
    bool pageable_upload;      /* pageable_upload: plan uploads straight from the plan's pageable memory */
    bool pdl;                  /* pdl: programmatic dependent launch where the device has it */
    bool cpu_f16c;             /* cpu_f16c: the CPU backend converts fp16 by F16C where the CPU has it */
    char timeline_out[PKV_TUNING_PATH_MAX]; /* timeline_out: dev builds' per-CTA timeline CSV; "": none */
    char policy[PKV_TUNING_PATH_MAX];       /* PKV_POLICY (its own variable): the policy file; "": none */
} pkv_tuning;

/* The defaults: what a process without PKV_TUNING runs. */
void pkv_tuning_default(pkv_tuning *t);
/* Parses PKV_TUNING's text (NULL or "": nothing) over t's current values.  Unknown keys, keys without a
 * value, values out of range and keys given twice fail with PKV_ERR_INVALID_ARGUMENT and a message (on
 * ctx, or thread-locally when ctx is NULL) that names the key; t is then left partly updated. */
pkv_status pkv_tuning_parse(pkv_context *ctx, const char *text, pkv_tuning *t);
/* The defaults, then the process environment's PKV_TUNING and PKV_POLICY (context creation). */
pkv_status pkv_tuning_from_env(pkv_context *ctx, pkv_tuning *t);
/* cpu_f16c of the process environment's PKV_TUNING (true where it does not parse: context creation has
 * already failed then).  The CPU backend chooses its fp16 loads once per process, not per context. */
bool pkv_tuning_env_cpu_f16c(void);

#ifdef __cplusplus
}
#endif

#endif /* PKV_TUNING_H */
