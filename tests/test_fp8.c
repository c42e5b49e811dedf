/* test_fp8.c - the fp8 conversions (e4m3 "fn" and e5m2) the fp8 KV cache will store and read: known codes,
 * every code's round trip, round-to-nearest-even at every midpoint, saturation, NaN, and random floats
 * against a brute-force search over all 256 codes. */
#include "pkv_lab.h"
#include "pkv_test.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

static bool is_nan_code(uint8_t c, int e5m2) {
    return e5m2 ? (c & 0x7f) > 0x7c : (c & 0x7f) == 0x7f;
}

/* The nearest code by brute force (ties to the even code), for a finite float within the range. */
static uint8_t nearest(float x, int e5m2) {
    int best = -1;
    double bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        if (is_nan_code((uint8_t)c, e5m2) || (e5m2 && (c & 0x7f) == 0x7c)) continue;
        const float v = pkv_fp8_to_float((uint8_t)c, e5m2);
        if (v == 0.0f && (signbit(v) != signbit(x))) continue; /* zero keeps x's sign */
        if ((v > 0) != (x > 0) && v != 0.0f) continue;
        const double d = fabs((double)v - (double)x);
        if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
    }
    return (uint8_t)best;
}

int main(void) {
    /* known codes */
    CHECK(pkv_fp8_to_float(0x7e, 0) == 448.0f && pkv_fp8_to_float(0x38, 0) == 1.0f);
    CHECK(pkv_fp8_to_float(0x01, 0) == ldexpf(1.0f, -9) && pkv_fp8_to_float(0x08, 0) == ldexpf(1.0f, -6));
    CHECK(isnan(pkv_fp8_to_float(0x7f, 0)) && isnan(pkv_fp8_to_float(0xff, 0)));
    CHECK(pkv_fp8_to_float(0x80, 0) == 0.0f && signbit(pkv_fp8_to_float(0x80, 0)));
    CHECK(pkv_fp8_to_float(0x3c, 1) == 1.0f && pkv_fp8_to_float(0x7b, 1) == 57344.0f);
    CHECK(isinf(pkv_fp8_to_float(0x7c, 1)) && isnan(pkv_fp8_to_float(0x7d, 1)) && isnan(pkv_fp8_to_float(0xff, 1)));
    CHECK(pkv_fp8_to_float(0x01, 1) == ldexpf(1.0f, -16));
    for (int e5m2 = 0; e5m2 < 2; e5m2++) {
        const uint8_t max_code = e5m2 ? 0x7b : 0x7e;
        const float max = pkv_fp8_to_float(max_code, e5m2);
        /* every finite code round-trips; magnitudes grow with the code */
        int bad = 0;
        for (int c = 0; c < 256; c++) {
            if (is_nan_code((uint8_t)c, e5m2) || (e5m2 && (c & 0x7f) == 0x7c)) continue;
            bad += pkv_float_to_fp8(pkv_fp8_to_float((uint8_t)c, e5m2), e5m2) != c;
            if ((c & 0x7f) > 0)
                bad += !(fabsf(pkv_fp8_to_float((uint8_t)c, e5m2)) > fabsf(pkv_fp8_to_float((uint8_t)(c - 1), e5m2)));
        }
        CHECK_MSG(bad == 0, "e5m2=%d: %d codes do not round-trip or order", e5m2, bad);
        /* midpoints round to the even code, just off them to the nearer */
        bad = 0;
        for (int c = 0; c < max_code; c++) {
            const double a = pkv_fp8_to_float((uint8_t)c, e5m2), b = pkv_fp8_to_float((uint8_t)(c + 1), e5m2);
            const float mid = (float)((a + b) / 2); /* exact in float */
            bad += pkv_float_to_fp8(mid, e5m2) != ((c & 1) ? c + 1 : c);
            bad += pkv_float_to_fp8(nextafterf(mid, 0.0f), e5m2) != c;
            bad += pkv_float_to_fp8(nextafterf(mid, INFINITY), e5m2) != c + 1;
            bad += pkv_float_to_fp8(-mid, e5m2) != (0x80 | ((c & 1) ? c + 1 : c));
        }
        CHECK_MSG(bad == 0, "e5m2=%d: %d midpoints rounded wrongly", e5m2, bad);
        /* saturation and NaN */
        CHECK(pkv_float_to_fp8(1e30f, e5m2) == max_code && pkv_float_to_fp8(-1e30f, e5m2) == (0x80 | max_code));
        CHECK(pkv_float_to_fp8(INFINITY, e5m2) == max_code && pkv_float_to_fp8(-INFINITY, e5m2) == (0x80 | max_code));
        CHECK(pkv_float_to_fp8(nextafterf(max, INFINITY), e5m2) == max_code);
        CHECK(is_nan_code(pkv_float_to_fp8(NAN, e5m2), e5m2));
        CHECK(pkv_float_to_fp8(-0.0f, e5m2) == 0x80 && pkv_float_to_fp8(0.0f, e5m2) == 0x00);
        /* random floats over the whole range against the brute-force nearest code */
        pkv_rng rng;
        pkv_rng_seed(&rng, 8 + (uint64_t)e5m2);
        bad = 0;
        for (int i = 0; i < 20000; i++) {
            const float x = (float)((pkv_rng_uniform01(&rng) * 2 - 1) * ldexp(1.0, (int)pkv_rng_uniform_int(&rng, -20, e5m2 ? 15 : 8)));
            if (!(fabsf(x) < max) || x == 0.0f) continue;
            bad += pkv_float_to_fp8(x, e5m2) != nearest(x, e5m2);
        }
        CHECK_MSG(bad == 0, "e5m2=%d: %d random floats not encoded to their nearest code", e5m2, bad);
    }
    return pkv_test_finish("test_fp8");
}
