/* qsort comparators, ascending, one per element type the project sorts.
 * Floats: NaN compares equal to everything (callers sort finite values). */
#ifndef SFI_SORT_H
#define SFI_SORT_H

int sfi_cmp_i32(const void *a, const void *b); /* int32_t */
int sfi_cmp_f32(const void *a, const void *b); /* float */
int sfi_cmp_f64(const void *a, const void *b); /* double */

#endif
