/* The engine against the reference: per-request digests computed exactly
 * as sfi-ref's decode loop computes them (from the engine's per-step
 * readback), and a comparison with sfi_decode_run on the CPU (one thread
 * per request): generated ids, step kinds and reasons, the selected sets
 * of every slow step and layer, and the logits of every step. Used by
 * `sfi-gpu run --check` and by the end-to-end cases of `sfi-gpu check`. */
#ifndef SFI_GPU_VERIFY_H
#define SFI_GPU_VERIFY_H

#include <stdint.h>
#include <stdio.h>

#include "sfi_decode.h"
#include "sfi_error.h"
#include "sfi_gpu_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sfi_gpu_verify sfi_gpu_verify;

/* For B requests (prompts as given to the engine) decoded in mode (its
 * name goes into the digest). keep: also keep every step's logits and
 * selected sets for sfi_gpu_verify_reference. */
sfi_status sfi_gpu_verify_new(int B, int max_new, int vocab, const int32_t *const *prompts,
                              const int *n_prompt, sfi_decode_mode mode, int keep,
                              sfi_gpu_verify **out, sfi_error *err);
void sfi_gpu_verify_free(sfi_gpu_verify *v);
/* The observer to hand to sfi_gpu_engine_run. */
const sfi_gpu_observer *sfi_gpu_verify_observer(sfi_gpu_verify *v);
/* Request b's digest (after the run), as sfi-ref run prints it. */
sfi_status sfi_gpu_verify_digest(sfi_gpu_verify *v, int b, char hex[65], sfi_error *err);

/* What the comparison found for one request. */
typedef struct {
    int ran; /* the reference ran (else err says why) */
    char err[256];
    char ref_digest[65];
    int first_diff;     /* first step whose id, kind or reason differs; -1 none */
    double max_rel;     /* max over steps of max|gpu - ref| / max|ref| of the logits */
    int first_over_tol; /* first step over tol, -1 none */
    int sel_sets, sel_sets_equal, sel_missing;
    long sel_positions, sel_positions_differ;
    int digest_equal;
} sfi_gpu_verify_report;

/* Runs sfi_decode_run for every request with opts (their mode, params,
 * trigger, stop token and max_new must be the engine's), compares as
 * above with logits tolerance tol (relative to the step's largest |logit|),
 * writes one line per request to log and fills rep[B]. Returns the number
 * of requests that fail: any id/kind/reason difference, a missing slow
 * step, logits over tol, or with exact also a differing digest or
 * selected set. */
int sfi_gpu_verify_reference(sfi_gpu_verify *v, const sfi_qwen3 *m, const sfi_decode_opts *opts,
                             const sfi_gpu_run_result *res, int exact, double tol, FILE *log,
                             sfi_gpu_verify_report *rep);

/* Two engine runs of the same requests against each other (sfi-gpu run
 * --check-tp: --tp N against --tp 1), both verifiers made with keep: ids,
 * step kinds and reasons must be equal, every step's logits within tol
 * (max |b - a| over the step's max |a|); the selected sets of slow steps
 * are compared and counted (reduction order differs across GPUs, so a
 * near-tie may fall the other way: reported, not failed). One line per
 * request to log, rep[B] filled (ref_digest: b's digest); returns the
 * number of requests that fail. */
int sfi_gpu_verify_compare(sfi_gpu_verify *a, const sfi_gpu_run_result *ra, sfi_gpu_verify *b,
                           const sfi_gpu_run_result *rb, double tol, const char *name_a,
                           const char *name_b, FILE *log, sfi_gpu_verify_report *rep);

#ifdef __cplusplus
}
#endif
#endif
