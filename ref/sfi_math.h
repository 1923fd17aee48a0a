/* Deterministic float32 math of the reference (sfi(7) BIT-EXACT REFERENCE): own
 * exp/log (fixed range reduction + polynomial, no libm), and reductions with
 * one documented order. Max ulp errors are stated next to each function by
 * its implementation and checked in tests/. */
#ifndef SFI_MATH_H
#define SFI_MATH_H

#include <stddef.h>

/* Max error in ulps of the result against the exact value (libm's exp/log
 * in double), measured once exhaustively (every float of the range) and
 * rechecked by tests/test_math.c on a dense grid (every 61st float of the
 * range SFI uses); the test fails if an error exceeds these bounds. */
#define SFI_EXPF_MAX_ULP 0.911 /* measured on every float of [-104, 89]: 0.9101 */
#define SFI_LOGF_MAX_ULP 0.835 /* measured on every positive finite float: 0.8348 */

/* e^x; +inf above 88.7228, 0 below -103.972, NaN propagates. */
float sfi_expf(float x);
/* Natural log; -inf at +-0, NaN below 0, +inf at +inf. */
float sfi_logf(float x);
/* Correctly rounded (IEEE sqrt) without libm: checked against sqrtf on
 * every non-negative float once, and on a grid by tests/test_math.c. */
float sfi_sqrtf(float x);
/* x^y for x >= 0 as used by the Selector: y == 1 gives x exactly, y == 2
 * x*x, y == 0.5 sfi_sqrtf(x), y == -1 1/x, y == 0 1; x == 0 gives 0 for
 * y > 0 (and +inf for y < 0); otherwise sfi_expf(y * sfi_logf(x)). */
float sfi_powf_pos(float x, float y);

/* Sum of a[i]*b[i], i ascending, single float accumulator. */
float sfi_dot(const float *a, const float *b, size_t n);
/* Sum of a[i], i ascending, single float accumulator. */
float sfi_sum(const float *a, size_t n);
/* Max over a[0..n) (n >= 1); NaN is not expected and propagates. */
float sfi_max(const float *a, size_t n);
/* In place: m = sfi_max(x); e[i] = sfi_expf(x[i] - m); sum = e[0] + e[1]
 * + ... ascending in one float; x[i] = e[i] / sum (a division per entry,
 * not a multiplication by 1/sum). -inf entries give 0; if every entry is
 * -inf the result is all zeros. n == 0 does nothing. */
void sfi_softmax(float *x, size_t n);

#endif
