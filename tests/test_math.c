/* ref/sfi_math: accuracy of the own exp/log/sqrt against libm in double on
 * dense grids of the ranges SFI uses, special values, and the documented
 * reduction orders on hand-computed cases. */
#include <config.h>

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sfi_math.h"
#include "sfi_test_util.h"

static float u2f(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static uint32_t f2u(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* Error of got in ulps of the exact value (the ulp of the binade of
 * |exact|, never below the least subnormal). */
static double ulp_err(float got, double exact)
{
    double a = fabs(exact);
    int e;
    frexp(a, &e);
    double ulp = ldexp(1.0, e - 24);
    if (ulp < ldexp(1.0, -149))
        ulp = ldexp(1.0, -149);
    return fabs((double)got - exact) / ulp;
}

/* Every 61st float of [lo, hi] (by bit pattern, both signs). */
#define STRIDE 61u

START_TEST(expf_accuracy_on_dense_grid)
{
    double worst = 0.0;
    float at = 0.0f;
    unsigned long n = 0;
    /* Negative side [-104, 0] (softmax arguments x - max, the position
     * prior -beta u^p) and positive side [0, 88.72] (SiLU, RoPE). */
    for (uint32_t u = 0x80000000u; u <= 0xc2d00000u; u += STRIDE) {
        float x = u2f(u);
        double err = ulp_err(sfi_expf(x), exp((double)x));
        if (err > worst) {
            worst = err;
            at = x;
        }
        n++;
    }
    for (uint32_t u = 0; u <= 0x42b17217u; u += STRIDE) {
        float x = u2f(u);
        double err = ulp_err(sfi_expf(x), exp((double)x));
        if (err > worst) {
            worst = err;
            at = x;
        }
        n++;
    }
    printf("sfi_expf: max error %.4f ulp at %a over %lu points (bound %.3f)\n", worst, (double)at,
           n, SFI_EXPF_MAX_ULP);
    ck_assert_msg(worst <= SFI_EXPF_MAX_ULP, "sfi_expf error %.4f ulp at %a", worst, (double)at);
    ck_assert_uint_gt(n, 30000000u);
}
END_TEST

START_TEST(logf_accuracy_on_dense_grid)
{
    double worst = 0.0;
    float at = 0.0f;
    unsigned long n = 0;
    /* Every positive finite float: the Selector takes logs of s + eps in
     * [1e-8, 1] and of clipped softmax weights; subnormals included. */
    for (uint32_t u = 1; u < 0x7f800000u; u += STRIDE) {
        float x = u2f(u);
        double err = ulp_err(sfi_logf(x), log((double)x));
        if (err > worst) {
            worst = err;
            at = x;
        }
        n++;
    }
    printf("sfi_logf: max error %.4f ulp at %a over %lu points (bound %.3f)\n", worst, (double)at,
           n, SFI_LOGF_MAX_ULP);
    ck_assert_msg(worst <= SFI_LOGF_MAX_ULP, "sfi_logf error %.4f ulp at %a", worst, (double)at);
}
END_TEST

START_TEST(sqrtf_correctly_rounded)
{
    /* libm's sqrtf is IEEE correctly rounded (a hardware instruction), so
     * ours must match it bit for bit: every 61st positive float. */
    unsigned long bad = 0;
    for (uint32_t u = 1; u < 0x7f800000u; u += 61) {
        float x = u2f(u);
        float a = sfi_sqrtf(x), b = sqrtf(x);
        if (f2u(a) != f2u(b) && bad++ < 5)
            printf("sqrt(%a): %a, libm %a\n", (double)x, (double)a, (double)b);
    }
    ck_assert_uint_eq(bad, 0);
    ck_assert_float_eq(sfi_sqrtf(4.0f), 2.0f);
    ck_assert_float_eq(sfi_sqrtf(128.0f), 11.3137083f); /* sqrt(2^7) = 8 sqrt 2 */
}
END_TEST

START_TEST(special_values)
{
    const float inf = INFINITY;
    /* exp: exact at 0, limits, overflow and underflow thresholds. */
    ck_assert(f2u(sfi_expf(0.0f)) == f2u(1.0f));
    ck_assert(f2u(sfi_expf(-0.0f)) == f2u(1.0f));
    ck_assert(sfi_expf(-inf) == 0.0f);
    ck_assert(sfi_expf(inf) == inf);
    ck_assert(isnan(sfi_expf(NAN)));
    ck_assert(sfi_expf(89.0f) == inf);
    ck_assert(sfi_expf(-104.0f) == 0.0f);
    ck_assert(sfi_expf(-103.0f) > 0.0f); /* a subnormal, not flushed */
    ck_assert(sfi_expf(88.7f) < inf);
    /* log: exact at 1, -inf at zero, NaN below zero. */
    ck_assert(f2u(sfi_logf(1.0f)) == f2u(0.0f));
    ck_assert(sfi_logf(0.0f) == -inf);
    ck_assert(sfi_logf(-0.0f) == -inf);
    ck_assert(isnan(sfi_logf(-1.0f)));
    ck_assert(isnan(sfi_logf(NAN)));
    ck_assert(sfi_logf(inf) == inf);
    ck_assert(sfi_logf(u2f(1)) < -103.0f); /* least subnormal: -149 ln 2 = -103.28 */
    /* sqrt */
    ck_assert(isnan(sfi_sqrtf(-1.0f)));
    ck_assert(sfi_sqrtf(inf) == inf);
    ck_assert(f2u(sfi_sqrtf(-0.0f)) == f2u(-0.0f));
    /* pow shortcuts */
    ck_assert(sfi_powf_pos(0.3f, 1.0f) == 0.3f);
    ck_assert(sfi_powf_pos(0.3f, 2.0f) == 0.3f * 0.3f);
    ck_assert(sfi_powf_pos(0.0f, 0.5f) == 0.0f);
    ck_assert(sfi_powf_pos(0.25f, 0.5f) == 0.5f);
    ck_assert(sfi_powf_pos(4.0f, -1.0f) == 0.25f);
    ck_assert_float_eq_tol(sfi_powf_pos(8.0f, 1.0f / 3.0f), 2.0f, 1e-6f);
}
END_TEST

START_TEST(reductions_are_ascending_single_accumulator)
{
    /* 1e8 + 1 - 1e8 in float: (1e8 + 1) rounds to 1e8, so ascending order
     * gives 0, not 1. A pairwise or reversed order would differ: this pins
     * the documented order. */
    float a[3] = {1e8f, 1.0f, -1e8f};
    ck_assert(sfi_sum(a, 3) == 0.0f);
    float b[3] = {1e8f, -1e8f, 1.0f};
    ck_assert(sfi_sum(b, 3) == 1.0f);
    float ones[3] = {1.0f, 1.0f, 1.0f};
    ck_assert(sfi_dot(a, ones, 3) == 0.0f);
    float c[4] = {1.0f, 2.0f, 3.0f, 4.0f}, d[4] = {0.5f, 0.25f, 2.0f, -1.0f};
    ck_assert(sfi_dot(c, d, 4) == 3.0f); /* 0.5 + 0.5 + 6 - 4, all exact */
    ck_assert(sfi_sum(c, 0) == 0.0f);
    float m[4] = {-3.0f, 7.0f, 7.5f, -INFINITY};
    ck_assert(sfi_max(m, 4) == 7.5f);
    float nn[3] = {1.0f, NAN, 2.0f};
    ck_assert(isnan(sfi_max(nn, 3)));
}
END_TEST

START_TEST(powf_general_path)
{
    /* exp(y log x): the log's error (< 1 ulp of log x) is scaled by y log x
     * in the exponent, so the relative error grows like |y log x| 2^-24
     * plus exp's own; bound it by (|y log x| + 2) 2^-23. */
    const float ys[] = {0.3f, 1.0f / 3.0f, 1.7f, -0.25f, 4.0f, -3.0f};
    for (size_t k = 0; k < sizeof ys / sizeof ys[0]; k++)
        for (uint32_t u = 0x33800000u; u < 0x4b000000u; u += 99991u) { /* 6e-8 .. 8e6 */
            float x = u2f(u);
            double want = pow((double)x, (double)ys[k]);
            if (want > 1e37 || want < 1e-37)
                continue;
            double tol = (fabs((double)ys[k] * log((double)x)) + 2.0) * 0x1p-23;
            float got = sfi_powf_pos(x, ys[k]);
            ck_assert_msg(fabs(got - want) <= tol * want, "pow(%a, %g) = %a, want %a", (double)x,
                          (double)ys[k], (double)got, want);
        }
}
END_TEST

START_TEST(no_fma_contraction)
{
    /* a = b = 1 + 2^-23: a*b = 1 + 2^-22 + 2^-46 rounds to 1 + 2^-22 in
     * float. sfi_dot([1, a], [c, b]) with c = -(1 + 2^-22) is c + a*b: 0
     * with a separately rounded product, 2^-46 if the compiler fused the
     * multiply-add (an FMA). ref/ is built with -ffp-contract=off; this
     * catches a build that lost it (gcc contracts by default on arm64). */
    const float a = 1.0f + 0x1p-23f, c = -(1.0f + 0x1p-22f);
    const float x[2] = {1.0f, a}, y[2] = {c, a};
    ck_assert(sfi_dot(x, y, 2) == 0.0f);
}
END_TEST

START_TEST(softmax_hand_cases)
{
    /* Equal logits: exp(0) = 1 each, sum 4, each exactly 1/4. */
    float x[4] = {2.5f, 2.5f, 2.5f, 2.5f};
    sfi_softmax(x, 4);
    for (int i = 0; i < 4; i++)
        ck_assert(x[i] == 0.25f);
    /* {ln 3, 0}: e = {3, 1} (to exp's accuracy), p = {0.75, 0.25}. */
    float y[2] = {1.09861229f, 0.0f};
    sfi_softmax(y, 2);
    ck_assert_float_eq_tol(y[0], 0.75f, 1e-7f);
    ck_assert_float_eq_tol(y[1], 0.25f, 1e-7f);
    /* -inf is an excluded entry: zero weight; {0, -inf, 0} -> {.5, 0, .5}. */
    float z[3] = {0.0f, -INFINITY, 0.0f};
    sfi_softmax(z, 3);
    ck_assert(z[0] == 0.5f && z[1] == 0.0f && z[2] == 0.5f);
    /* Every entry -inf: defined as all zeros (no mass), not NaN. */
    float w[2] = {-INFINITY, -INFINITY};
    sfi_softmax(w, 2);
    ck_assert(w[0] == 0.0f && w[1] == 0.0f);
    /* Large logits do not overflow: max is subtracted first. */
    float big[2] = {1000.0f, 1000.0f};
    sfi_softmax(big, 2);
    ck_assert(big[0] == 0.5f && big[1] == 0.5f);
    /* Softmax matches double on random inputs to a few ulp and sums to 1. */
    uint64_t st = 42;
    for (int rep = 0; rep < 100; rep++) {
        float v[50];
        double dv[50], mx = -1e30, sum = 0.0;
        for (int i = 0; i < 50; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            v[i] = (float)((double)(st >> 40) / 16777216.0 * 40.0 - 20.0);
            if (v[i] > mx)
                mx = v[i];
        }
        for (int i = 0; i < 50; i++) {
            dv[i] = exp((double)v[i] - mx);
            sum += dv[i];
        }
        sfi_softmax(v, 50);
        float fs = 0.0f;
        for (int i = 0; i < 50; i++) {
            /* 50 float additions: up to ~50 half-ulps of relative error. */
            ck_assert(fabs(v[i] - dv[i] / sum) <= 5e-6 * (dv[i] / sum) + 1e-30);
            fs += v[i];
        }
        ck_assert_float_eq_tol(fs, 1.0f, 1e-5f);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("math");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, expf_accuracy_on_dense_grid);
    tcase_add_test(tc, logf_accuracy_on_dense_grid);
    tcase_add_test(tc, sqrtf_correctly_rounded);
    tcase_add_test(tc, special_values);
    tcase_add_test(tc, reductions_are_ascending_single_accumulator);
    tcase_add_test(tc, softmax_hand_cases);
    tcase_add_test(tc, no_fma_contraction);
    tcase_add_test(tc, powf_general_path);
    suite_add_tcase(s, tc);
    return sfi_test_run_suite(s, CK_FORK_GETENV);
}
