/* Replays token streams through a trigger policy of ref/sfi_state.h for a
 * batch of B requests decoded together, and counts, for every batch step,
 * how many of the B requests took a slow step. The cost model then prices
 * each count once (sfi_cost_step), so replay is a tight loop of
 * sfi_trigger_next calls.
 *
 * Streams: the decode tokens of a trace's requests (or a synthetic stream),
 * concatenated into one ring of n tokens; request r of the batch starts at
 * offset r * n / B and wraps around, so B requests see different text.
 *
 * Stagger: under continuous batching the requests of a batch are at
 * different points of their decode. Request r has already decoded
 * r * stagger / B steps (the tokens before its offset, not counted) when
 * the replayed window starts, so T_max and interval phases differ between
 * requests. stagger = 0 starts every request at its step 0 together. */
#ifndef SFI_REPLAY_H
#define SFI_REPLAY_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_params.h"
#include "sfi_state.h"

typedef struct {
    const int32_t *tokens;     /* ring of decode tokens */
    int64_t n;                 /* >= 1 */
    const uint8_t *is_trigger; /* [n_vocab] trigger set (sfi(7) TRIGGERS) */
    int32_t n_vocab;
} sfi_replay_stream;

typedef struct {
    int batch;
    int64_t steps;      /* batch steps replayed */
    int64_t *hist;      /* [batch + 1]: batch steps with n slow requests */
    int64_t slow;       /* slow request-steps */
    int64_t reasons[8]; /* request-steps by sfi_step_reason */
    int32_t *timeline;  /* n slow of the first n_timeline batch steps */
    int64_t n_timeline;
} sfi_replay_result;

/* Replays `steps` batch steps of `batch` requests under trigger policy
 * `kind` (T_max from prm, interval for SFI_TRIG_INTERVAL), requests
 * staggered as above. Keeps the n_slow of the first `timeline` steps (0:
 * none). */
SFI_NODISCARD sfi_status sfi_replay_run(const sfi_replay_stream *in, sfi_trigger_kind kind,
                                        const sfi_params *prm, int interval, int batch,
                                        int64_t stagger, int64_t steps, int64_t timeline,
                                        sfi_replay_result *out, sfi_error *err);
void sfi_replay_result_free(sfi_replay_result *r);

/* A deterministic synthetic stream for when no trace is at hand: tokens 0
 * (word) and 1 (boundary, the only trigger), sentence lengths drawn from a
 * geometric distribution of the given mean from a fixed seed. *tokens is
 * malloc'd [n]; *is_trigger is malloc'd [2]. */
SFI_NODISCARD sfi_status sfi_replay_synthetic(int64_t n, double mean_sentence, uint64_t seed,
                                              int32_t **tokens, uint8_t **is_trigger,
                                              sfi_error *err);

#endif
