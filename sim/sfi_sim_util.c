/* Small helpers shared by sfi-sim's commands. */
#include <config.h>

#include "sfi_sim_util.h"

#include <errno.h>
#include <stdlib.h>

int sfi_sim_parse_size(const char *s, int kilo, int64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || v < 0)
        return -1;
    long long mul = 1;
    if (kilo && (*end == 'K' || *end == 'k'))
        mul = 1024, end++;
    else if (kilo && (*end == 'M' || *end == 'm'))
        mul = 1024 * 1024, end++;
    if (*end || v > INT64_MAX / mul)
        return -1;
    *out = (int64_t)(v * mul);
    return 0;
}
