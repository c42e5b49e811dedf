/* rng.c - splitmix64, the library's one deterministic random number generator (anchors.md).
 *
 * The same seed gives the same sequence on every platform: only 64-bit unsigned integer arithmetic
 * (which wraps modulo 2^64 by definition), and one exact power-of-two scaling for uniform01. */
#include "pkv_lab.h"

void pkv_rng_seed(pkv_rng *r, uint64_t seed) {
    if (r) r->state = seed;
}

uint64_t pkv_rng_next(pkv_rng *r) {
    r->state += UINT64_C(0x9E3779B97F4A7C15);
    uint64_t z = r->state;
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* lo + next() % (hi - lo + 1), as anchors.md defines it (modulo bias included, on purpose: it is
 * part of the definition).  The span is computed in unsigned arithmetic so that any lo <= hi works;
 * the full int64 range (span 2^64) takes next() as is.  hi < lo returns lo without drawing. */
int64_t pkv_rng_uniform_int(pkv_rng *r, int64_t lo, int64_t hi) {
    if (hi < lo) return lo;
    uint64_t span = (uint64_t)hi - (uint64_t)lo + 1u; /* 0 means 2^64 */
    uint64_t x = pkv_rng_next(r);
    uint64_t offset = span == 0 ? x : x % span;
    uint64_t value = (uint64_t)lo + offset; /* wraps back into [lo, hi] */
    /* Convert without implementation-defined behaviour for values above INT64_MAX. */
    if (value <= (uint64_t)INT64_MAX) return (int64_t)value;
    return -(int64_t)(UINT64_MAX - value) - 1;
}

/* The top 53 bits as a double in [0, 1): exact, since 53 bits fit a double's mantissa. */
double pkv_rng_uniform01(pkv_rng *r) {
    return (double)(pkv_rng_next(r) >> 11) * 0x1.0p-53;
}
