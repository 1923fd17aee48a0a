/* Managed sparse state (method.md section 2) and trigger policies
 * (section 3, plus the comparison policies the simulator and analyzer use). */
#ifndef SFI_STATE_H
#define SFI_STATE_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_params.h"

typedef enum { SFI_STEP_PREFILL = 0, SFI_STEP_SLOW = 1, SFI_STEP_FAST = 2 } sfi_step_kind;

typedef enum {
    SFI_REASON_NONE = 0,     /* fast step */
    SFI_REASON_FIRST = 1,    /* step 0 of decoding */
    SFI_REASON_TRIGGER = 2,  /* previous token is in T_trig */
    SFI_REASON_TMAX = 3,     /* T_max steps since the last slow step */
    SFI_REASON_INTERVAL = 4, /* fixed-interval policy */
    SFI_REASON_ALWAYS = 5,   /* always-slow (full KV) policy */
    SFI_REASON_PROMPT = 6    /* prefill */
} sfi_step_reason;

const char *sfi_step_kind_name(sfi_step_kind k);
const char *sfi_step_reason_name(sfi_step_reason r);

/* Trigger policy: decides the kind of decode step t from the previous
 * token. Implementations: sfi (boundary + T_max), tmax (T_max only),
 * boundary (boundary only, never T_max), interval (every N steps), always
 * (every step slow), never (only step 0 slow). */
typedef enum {
    SFI_TRIG_SFI = 0, SFI_TRIG_TMAX, SFI_TRIG_BOUNDARY, SFI_TRIG_INTERVAL,
    SFI_TRIG_ALWAYS, SFI_TRIG_NEVER
} sfi_trigger_kind;

typedef struct {
    sfi_trigger_kind kind;
    int T_max;                    /* for SFI and TMAX */
    int interval;                 /* for INTERVAL */
    const uint8_t *is_trigger;    /* [n_vocab], for SFI and BOUNDARY */
    int32_t n_vocab;
    int step;                     /* next decode step index */
    int since_slow;               /* steps since the last slow step */
} sfi_trigger_policy;

sfi_status sfi_trigger_policy_parse(const char *name, sfi_trigger_kind *kind, sfi_error *err);
const char *sfi_trigger_kind_name(sfi_trigger_kind k);
void sfi_trigger_policy_init(sfi_trigger_policy *tp, sfi_trigger_kind kind,
                             const sfi_params *prm, const uint8_t *is_trigger,
                             int32_t n_vocab, int interval);
/* Kind of the next step; prev_token is x_{t-1} (ignored at step 0).
 * Advances the policy's counters. */
sfi_step_kind sfi_trigger_next(sfi_trigger_policy *tp, int32_t prev_token,
                               sfi_step_reason *reason);

/* Per layer and KV head selected sets, plus the derived sink/recent/J. */
typedef struct {
    int n_layers, n_kv_heads, K;
    int32_t *selected;   /* [n_layers][n_kv_heads][K], ascending positions */
    int *n_selected;     /* [n_layers][n_kv_heads] */
} sfi_state;

sfi_status sfi_state_init(sfi_state *st, int n_layers, int n_kv_heads, int K, sfi_error *err);
void sfi_state_free(sfi_state *st);

/* J for a cache of n_ctx positions (current token included):
 * [n_sink, n_ctx - n_recent) clipped; empty when j_end <= j_begin. */
void sfi_state_candidates(const sfi_params *prm, int n_ctx, int *j_begin, int *j_end);

/* The fast-step index set of (layer, kv_head) for a cache of n_ctx
 * positions: sink U selected U recent, ascending, no duplicates (selected
 * entries that fell into the sliding recent window counted once). Writes
 * at most n_sink + K + n_recent entries; returns the count in *n. */
void sfi_state_fast_set(const sfi_state *st, const sfi_params *prm, int layer,
                        int kv_head, int n_ctx, int32_t *idx, int *n);

#endif
