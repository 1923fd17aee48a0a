/* The project's one pseudo-random generator: splitmix64 (Steele, Lea and
 * Flood, "Fast splittable pseudorandom number generators", 2014), a 64-bit
 * state advanced by a constant and mixed. Fixed and portable (no libc
 * rand()), so a seed gives the same numbers on every host: random-weight
 * checkpoints, bootstrap resamples, synthetic streams and workloads.
 *
 * Not used where a stream is pinned by published numbers: the golden-digest
 * suite's inputs (ref/sfi_golden.c's LCG) and sfi-gpu check's seeded cases
 * (gpu/cmd_check.c) keep the generators their digests and tolerances were
 * established with. */
#ifndef SFI_RNG_H
#define SFI_RNG_H

#include <stdint.h>

/* The next 64 random bits; advances *state. Any state value is valid. */
uint64_t sfi_rng_next(uint64_t *state);

/* Uniform in [0, 1) with 53 random bits (exact in double). */
double sfi_rng_uniform(uint64_t *state);

#endif
