/* splitmix64 (see sfi_rng.h). */
#include <config.h>

#include "sfi_rng.h"

uint64_t sfi_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double sfi_rng_uniform(uint64_t *state)
{
    return (double)(sfi_rng_next(state) >> 11) * 0x1.0p-53;
}
