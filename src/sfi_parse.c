/* Numbers from text (see sfi_parse.h). */
#include <config.h>

#include "sfi_parse.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

_Static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "strtoull is 64-bit");

int sfi_parse_int(const char *s, int lo, int hi, int *out)
{
    assert(lo <= hi);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

int sfi_parse_u64(const char *s, uint64_t *out)
{
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '-')
        return -1; /* strtoull would wrap "-1" to 2^64 - 1 */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p || *end || errno)
        return -1;
    *out = (uint64_t)v;
    return 0;
}
