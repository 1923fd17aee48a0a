/* The golden-digest suite of the reference core: a fixed list of seeded
 * cases (exp/log/sqrt, softmax, dense/sparse/prefill attention, the
 * Selector with every intermediate, state and trigger policies), each
 * reduced to the SHA-256 of its outputs' bits. The same digests on every
 * compiler, optimisation level and host prove the reference bit-exact;
 * tests/golden/ref_core.sha256 pins them and `sfi-ref digest --suite`
 * prints them. */
#ifndef SFI_GOLDEN_H
#define SFI_GOLDEN_H

#include "sfi_digest.h"
#include "sfi_error.h"

/* Called once per case, in a fixed order, with the case's name and its
 * digest (lowercase hex). */
typedef void (*sfi_golden_emit)(const char *name, const char *hex, void *ctx);

/* Runs every case. Stops at the first failure (which would be a bug: the
 * inputs are valid), with err naming the case. */
SFI_NODISCARD sfi_status sfi_golden_suite(sfi_golden_emit emit, void *ctx, sfi_error *err);

#endif
