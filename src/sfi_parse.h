/* Numbers from text (command-line values, KEY=VALUE files), one contract
 * for every command: the whole string is one decimal number (strtol's
 * syntax: optional leading white space and sign), nothing after it, no
 * overflow, inside the caller's range. On failure the output is untouched
 * and the caller says which option and what range, in its own words. */
#ifndef SFI_PARSE_H
#define SFI_PARSE_H

#include <stdint.h>

/* An integer in [lo, hi] (lo <= hi, both within int). Returns 0 or -1. */
int sfi_parse_int(const char *s, int lo, int hi, int *out);

/* A non-negative integer up to UINT64_MAX (a seed): no minus sign.
 * Returns 0 or -1. */
int sfi_parse_u64(const char *s, uint64_t *out);

#endif
