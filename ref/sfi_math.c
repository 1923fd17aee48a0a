/* Deterministic float32 math of the reference (sfi(7) BIT-EXACT REFERENCE).
 *
 * Why our own exp/log: libm implementations differ between glibc versions,
 * musl, macOS and CUDA, and may use FMA; the reference must give the same
 * bits everywhere. The algorithms below use only IEEE-754 binary32 +, -, *,
 * / (each correctly rounded), integer bit manipulation and float<->int
 * conversions, evaluated in the order written (-ffp-contract=off, C11
 * FLT_EVAL_METHOD 0 on x86-64 SSE and arm64), so every compiler and
 * optimisation level produces the same result.
 *
 * sfi_expf and sfi_logf follow FreeBSD msun's e_expf.c and e_logf.c
 * (argument reduction and minimax coefficients), rewritten for float-only
 * evaluation without the float_t widening. Their notice:
 *   Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
 *   Developed at SunPro, a Sun Microsystems, Inc. business.
 *   Permission to use, copy, modify, and distribute this software is freely
 *   granted, provided that this notice is preserved.
 * Accuracy, measured by tests/test_math.c against libm in double: see
 * SFI_EXPF_MAX_ULP / SFI_LOGF_MAX_ULP in sfi_math.h. */
#include <config.h>

#include "sfi_math.h"

#include <float.h>
#include <stdint.h>
#include <string.h>

/* x87 (FLT_EVAL_METHOD 2) would evaluate float expressions in extended
 * precision and break bit-exactness: refuse to build rather than differ. */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "ref/ needs FLT_EVAL_METHOD 0 (x86: compile with -msse2 -mfpmath=sse)"
#endif

static uint32_t f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* y * 2^k for y in [0.5, 2) and any k, one rounding at most (only when the
 * result is subnormal): the intermediate scalings are exact. */
static float scale2(float y, int k)
{
    if (k > 127) {
        y *= u2f(0x7f000000u); /* 2^127 */
        k -= 127;
        if (k > 127)
            k = 127; /* overflows to inf below, as it should */
    } else if (k < -126) {
        y *= u2f(0x0c800000u); /* 2^-102, exact: y * 2^-102 is still normal */
        k += 102;
        if (k < -126)
            k = -126; /* the product below underflows to 0, one rounding */
    }
    return y * u2f((uint32_t)(0x7f + k) << 23);
}

float sfi_expf(float x)
{
    static const float ln2hi = 6.9314575195e-1f;  /* 0x3f317200, 16 bits: k*ln2hi exact */
    static const float ln2lo = 1.4286067653e-6f;  /* 0x35bfbe8e */
    static const float invln2 = 1.4426950216e+0f; /* 0x3fb8aa3b */
    /* |x*(exp(x)+1)/(exp(x)-1) - (2 + P1 x^2 + P2 x^4)| < 2^-27.74 on
     * [-0.34568, 0.34568] (Remez). */
    static const float P1 = 1.6666625440e-1f;
    static const float P2 = -2.7667332906e-3f;

    uint32_t hx = f2u(x);
    int sign = (int)(hx >> 31);
    hx &= 0x7fffffffu;
    if (hx > 0x7f800000u)
        return x + x;                   /* NaN */
    if (hx >= 0x42aeac50u) {            /* |x| >= 87.33655 or inf */
        if (!sign && hx >= 0x42b17218u) /* x >= 88.722839: overflow */
            return u2f(0x7f800000u);
        if (sign && hx >= 0x42cff1b5u) /* x <= -103.972084: below half the least subnormal */
            return 0.0f;
    }
    float hi, lo;
    int k;
    if (hx > 0x3eb17218u) {   /* |x| > ln2/2: reduce x = k ln2 + r, |r| <= ln2/2 */
        if (hx > 0x3f851592u) /* |x| > 1.5 ln2: k = nearest integer of x/ln2 */
            k = (int)(invln2 * x + (sign ? -0.5f : 0.5f));
        else
            k = sign ? -1 : 1;
        hi = x - (float)k * ln2hi;
        lo = (float)k * ln2lo;
        x = hi - lo;
    } else if (hx > 0x39000000u) { /* 2^-14 < |x| <= ln2/2 */
        k = 0;
        hi = x;
        lo = 0.0f;
    } else {
        return 1.0f + x; /* exp(x) = 1 + x to within half an ulp */
    }
    float xx = x * x;
    float c = x - xx * (P1 + xx * P2);
    float y = 1.0f + ((x * c / (2.0f - c) - lo) + hi);
    if (k == 0)
        return y;
    return scale2(y, k);
}

float sfi_logf(float x)
{
    static const float ln2_hi = 6.9313812256e-01f; /* 0x3f317180 */
    static const float ln2_lo = 9.0580006145e-06f; /* 0x3717f7d1 */
    /* |(log(1+s)-log(1-s))/s - Lg(s)| < 2^-34.24 on [0, 0.1716] */
    static const float Lg1 = 0.66666662693f; /* 0xaaaaaa.0p-24 */
    static const float Lg2 = 0.40000972152f; /* 0xccce13.0p-25 */
    static const float Lg3 = 0.28498786688f; /* 0x91e9ee.0p-25 */
    static const float Lg4 = 0.24279078841f; /* 0xf89e26.0p-26 */

    uint32_t ix = f2u(x);
    int k = 0;
    if (ix < 0x00800000u || (ix >> 31)) { /* x < 2^-126, or negative */
        if ((ix << 1) == 0)
            return -u2f(0x7f800000u); /* log(+-0) = -inf */
        if (ix >> 31)
            return (ix << 1) > 0xff000000u ? x + x : u2f(0x7fc00000u); /* log(<0) = NaN */
        k -= 25;               /* subnormal: scale up exactly */
        x *= u2f(0x4c000000u); /* 2^25 */
        ix = f2u(x);
    } else if (ix >= 0x7f800000u) {
        return x + x; /* +inf or NaN */
    } else if (ix == 0x3f800000u) {
        return 0.0f;
    }
    /* x = 2^k * m with m in [sqrt(2)/2, sqrt(2)) */
    ix += 0x3f800000u - 0x3f3504f3u;
    k += (int)(ix >> 23) - 0x7f;
    ix = (ix & 0x007fffffu) + 0x3f3504f3u;
    x = u2f(ix);

    float f = x - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float w = z * z;
    float t1 = w * (Lg2 + w * Lg4);
    float t2 = z * (Lg1 + w * Lg3);
    float R = t2 + t1;
    float hfsq = 0.5f * f * f;
    float dk = (float)k;
    return (((s * (hfsq + R) + dk * ln2_lo) - hfsq) + f) + dk * ln2_hi;
}

/* Correctly rounded square root without libm or a sqrt instruction:
 * a reciprocal-square-root estimate refined by Newton steps in double
 * gives a float candidate within a fraction of an ulp; the candidate is
 * then proven (or moved) by exact tests: y is the correctly rounded root
 * iff the midpoints m- (to the float below) and m+ (to the float above)
 * satisfy m-^2 < x < m+^2. The midpoints have at most 25 significant bits,
 * so their squares (at most 50 bits) are exact in double, and x is exact
 * in double: the tests are exact, and the result does not depend on the
 * estimate (a tie m^2 == x is impossible: the square of an odd 25-bit
 * integer needs more than 24 bits). */
float sfi_sqrtf(float x)
{
    uint32_t ix = f2u(x);
    if ((ix & 0x7fffffffu) == 0)
        return x; /* +-0 */
    if (ix > 0x7f800000u)
        return (ix << 1) > 0xff000000u ? x + x : u2f(0x7fc00000u); /* NaN, negative */
    if (ix == 0x7f800000u)
        return x;
    const double d = (double)x; /* exact, also for subnormal x */
    uint64_t b;
    memcpy(&b, &d, 8);
    b = 0x5fe6eb50c7b537a9ull - (b >> 1); /* 1/sqrt(d) to about 3.5% */
    double r;
    memcpy(&r, &b, 8);
    const double hd = 0.5 * d;
    for (int i = 0; i < 3; i++) /* error 3.5e-2 -> 1.8e-3 -> 5e-6 -> 4e-11 */
        r = r * (1.5 - (hd * r) * r);
    float y = (float)(d * r);
    /* sqrt of a positive float is a normal float in [2^-75, 2^64]: the
     * neighbours y(u-1), y(u+1) exist. */
    for (;;) {
        uint32_t u = f2u(y);
        double up = ((double)y + (double)u2f(u + 1)) * 0.5;
        if (up * up < d) {
            y = u2f(u + 1);
            continue;
        }
        double dn = ((double)y + (double)u2f(u - 1)) * 0.5;
        if (dn * dn > d) {
            y = u2f(u - 1);
            continue;
        }
        return y;
    }
}

float sfi_dot(const float *a, const float *b, size_t n)
{
    float acc = 0.0f;
    for (size_t i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

float sfi_sum(const float *a, size_t n)
{
    float acc = 0.0f;
    for (size_t i = 0; i < n; i++)
        acc += a[i];
    return acc;
}

float sfi_max(const float *a, size_t n)
{
    float m = a[0];
    for (size_t i = 1; i < n; i++)
        if (a[i] > m || a[i] != a[i]) /* once m is NaN it stays NaN */
            m = a[i];
    return m;
}

void sfi_softmax(float *x, size_t n)
{
    if (n == 0)
        return;
    float m = sfi_max(x, n);
    if (m == -u2f(0x7f800000u)) { /* every entry -inf: no mass anywhere */
        for (size_t i = 0; i < n; i++)
            x[i] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = sfi_expf(x[i] - m);
        sum += x[i];
    }
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] / sum;
}

float sfi_powf_pos(float x, float y)
{
    if (y == 1.0f)
        return x;
    if (x == 0.0f)
        return y > 0.0f ? 0.0f : u2f(0x7f800000u);
    if (y == 0.0f)
        return 1.0f;
    if (y == 2.0f)
        return x * x;
    if (y == 0.5f)
        return sfi_sqrtf(x);
    if (y == -1.0f)
        return 1.0f / x;
    return sfi_expf(y * sfi_logf(x));
}
