/* half.c - fp16 / bf16 <-> fp32 conversions (round to nearest even), portable C. */
#include "internal.h"

#include <string.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t pkv_float_to_half(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
    if (ax < 0x38800000u) {                                  /* subnormal or zero in fp16 */
        if (ax < 0x33000000u) return (uint16_t)sign;         /* below half the smallest subnormal */
        uint32_t mant = (ax & 0x007fffffu) | 0x00800000u;
        int shift = 126 - (int)(ax >> 23); /* value / 2^-24 = mant >> shift, shift in [14, 24] */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t e = ((ax >> 23) - 112u) << 10;
    uint32_t m = (ax >> 13) & 0x3ffu;
    uint32_t h = e | m;
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float pkv_half_to_float(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0) return bits_f32(sign);
        float v = (float)m * (1.0f / 16777216.0f); /* m * 2^-24 */
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t pkv_float_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}

float pkv_bf16_to_float(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* ---- fp8 (OCP 8-bit floats): e4m3 ("fn": no infinities, S.1111.111 the only NaN, largest 448) and e5m2
 * (IEEE-like: infinities and NaNs at exponent 31, largest finite 57344) ----------------------------------- */
float pkv_fp8_to_float(uint8_t v, int e5m2) {
    const uint32_t sign = (uint32_t)(v & 0x80u) << 24;
    const int ebits = e5m2 ? 5 : 4, mbits = 7 - ebits, bias = e5m2 ? 15 : 7;
    const uint32_t e = (uint32_t)(v & 0x7fu) >> mbits, m = (uint32_t)v & ((1u << mbits) - 1u);
    if (!e5m2 && e == 15 && m == 7) return bits_f32(sign | 0x7fc00000u);
    if (e5m2 && e == 31) return bits_f32(sign | (m ? 0x7fc00000u : 0x7f800000u));
    if (e == 0) { /* subnormal: m x 2^(1 - bias - mbits), exact in float */
        const float mag = (float)m * bits_f32((uint32_t)(127 + 1 - bias - mbits) << 23);
        return sign ? -mag : mag;
    }
    return bits_f32(sign | ((e - (uint32_t)bias + 127u) << 23) | (m << (23 - mbits)));
}

uint8_t pkv_float_to_fp8(float f, int e5m2) {
    const uint32_t x = f32_bits(f), ax = x & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    const uint8_t max_code = e5m2 ? 0x7bu : 0x7eu; /* the largest finite magnitude */
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu); /* NaN (e5m2: 0x7f is a NaN too) */
    const uint32_t mbits = e5m2 ? 2u : 3u, bias = e5m2 ? 15u : 7u;
    /* fp8 codes of one sign are contiguous in magnitude (subnormals, then each exponent's mantissas), so a
     * rounding carry into the next exponent, or from the subnormals into the first normal, is right */
    uint32_t code;
    if (ax >= (127u + 1u - bias) << 23) { /* an fp8 normal: drop 23 - mbits mantissa bits, to nearest even */
        const uint32_t drop = 23u - mbits;
        const uint32_t r = ax + ((1u << (drop - 1u)) - 1u) + ((ax >> drop) & 1u);
        code = (r >> drop) - ((127u - bias) << mbits); /* infinities land far above max_code */
    } else if ((ax >> 23) == 0) { /* zero or a float subnormal: far below the smallest fp8 subnormal */
        code = 0;
    } else { /* an fp8 subnormal: |f| / 2^(1 - bias - mbits), to nearest even */
        const uint32_t e = ax >> 23, mant = (ax & 0x7fffffu) | 0x800000u; /* |f| = mant x 2^(e - 150) */
        const uint32_t shift = 151u - bias - mbits - e;                   /* >= 24 - mbits */
        if (shift > 25u) {
            code = 0; /* below a quarter of the smallest subnormal */
        } else {
            const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
            code = q + (rem > half || (rem == half && (q & 1u)));
        }
    }
    return (uint8_t)(sign | (code > max_code ? max_code : code)); /* saturate, infinities included */
}
