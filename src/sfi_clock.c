/* Clocks (see sfi_clock.h): clock_gettime, POSIX. */
#include <config.h>

#include "sfi_clock.h"

#include <time.h>

static double seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double sfi_clock_wall(void)
{
    return seconds(CLOCK_MONOTONIC);
}

double sfi_clock_cpu(void)
{
    return seconds(CLOCK_PROCESS_CPUTIME_ID);
}

double sfi_clock_thread_cpu(void)
{
    return seconds(CLOCK_THREAD_CPUTIME_ID);
}
