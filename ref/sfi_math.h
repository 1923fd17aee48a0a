/* Deterministic float32 math of the reference (method.md section 6): own
 * exp/log (fixed range reduction + polynomial, no libm), and reductions with
 * one documented order. Max ulp errors are stated next to each function by
 * its implementation and checked in tests/. */
#ifndef SFI_MATH_H
#define SFI_MATH_H

#include <stddef.h>

float sfi_expf(float x);
float sfi_logf(float x);
float sfi_sqrtf(float x);   /* correctly rounded (IEEE sqrt) */

/* Sum of a[i]*b[i], i ascending, single float accumulator. */
float sfi_dot(const float *a, const float *b, size_t n);
/* Sum of a[i], i ascending, single float accumulator. */
float sfi_sum(const float *a, size_t n);
/* Max over a[0..n) (n >= 1); NaN is not expected and propagates. */
float sfi_max(const float *a, size_t n);
/* In place: x[i] = exp(x[i] - max) / sum, sum in ascending order. */
void sfi_softmax(float *x, size_t n);

#endif
