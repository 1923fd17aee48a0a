/* Managed sparse state (sfi(7) MANAGED STATE) and trigger policies
 * (section 3, plus the comparison policies the simulator and analyzer use). */
#ifndef SFI_STATE_H
#define SFI_STATE_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_params.h"
#include "sfi_selector.h"

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
    SFI_TRIG_ALWAYS, SFI_TRIG_NEVER,
    SFI_TRIG_CUSTOM /* a caller's function (sfi_trigger_policy_init_custom) */
} sfi_trigger_kind;

struct sfi_trigger_policy;
/* A plugged-in policy: returns the reason of a slow step, or
 * SFI_REASON_NONE for a fast one, for step tp->step (>= 1; step 0 is
 * always slow FIRST) given x_{t-1}. tp->since_slow is the number of steps
 * since the last slow step, not counting this one. */
typedef sfi_step_reason (*sfi_trigger_fn)(const struct sfi_trigger_policy *tp,
                                          int32_t prev_token, void *ctx);

typedef struct sfi_trigger_policy {
    sfi_trigger_kind kind;
    int T_max;                    /* for SFI and TMAX */
    int interval;                 /* for INTERVAL */
    const uint8_t *is_trigger;    /* [n_vocab], for SFI and BOUNDARY */
    int32_t n_vocab;
    int step;                     /* next decode step index */
    int since_slow;               /* steps since the last slow step */
    sfi_trigger_fn custom;        /* for CUSTOM */
    void *custom_ctx;
} sfi_trigger_policy;

SFI_NODISCARD sfi_status sfi_trigger_policy_parse(const char *name, sfi_trigger_kind *kind,
                                                  sfi_error *err);
const char *sfi_trigger_kind_name(sfi_trigger_kind k);
void sfi_trigger_policy_init(sfi_trigger_policy *tp, sfi_trigger_kind kind,
                             const sfi_params *prm, const uint8_t *is_trigger,
                             int32_t n_vocab, int interval);
/* A policy whose decisions (after step 0) come from fn(tp, prev, ctx). */
void sfi_trigger_policy_init_custom(sfi_trigger_policy *tp, sfi_trigger_fn fn, void *ctx);
/* Kind of the next step; prev_token is x_{t-1} (ignored at step 0).
 * Advances the policy's counters. Rules, with d = steps since the last
 * slow step counting this one (since_slow + 1):
 *   step 0: slow, FIRST, for every policy (never included);
 *   sfi: slow TRIGGER if prev_token is a trigger, else slow TMAX if
 *        d >= T_max (so with no triggers, slow at 0, T_max, 2 T_max, ...);
 *   tmax: TMAX rule only; boundary: TRIGGER rule only;
 *   interval: slow INTERVAL when d >= interval; always: slow ALWAYS;
 *   never: fast. T_max < 1 or interval < 1 disables that rule; a token
 *   outside 0..n_vocab-1 (or no is_trigger table) is not a trigger. */
sfi_step_kind sfi_trigger_next(sfi_trigger_policy *tp, int32_t prev_token,
                               sfi_step_reason *reason);

/* Per layer and KV head selected sets, plus the derived sink/recent/J. */
typedef struct {
    int n_layers, n_kv_heads, K;
    int32_t *selected;   /* [n_layers][n_kv_heads][K], ascending positions */
    int *n_selected;     /* [n_layers][n_kv_heads] */
} sfi_state;

SFI_NODISCARD sfi_status sfi_state_init(sfi_state *st, int n_layers, int n_kv_heads, int K,
                                        sfi_error *err);
void sfi_state_free(sfi_state *st);

/* The K-entry slot of (layer, kv_head); its first
 * n_selected[layer * n_kv_heads + kv_head] entries are the set. */
int32_t *sfi_state_selected(const sfi_state *st, int layer, int kv_head);

/* The slow-step (and prefill) update of one layer: runs the Selector on in
 * (in->n_kv_heads must equal st->n_kv_heads, prm->K <= st->K) and stores
 * its sets. On error the layer's previous sets are kept. A fast step
 * changes nothing here: only n_ctx grows, which slides the recent window
 * (sfi_state_candidates, sfi_state_fast_set). */
SFI_NODISCARD sfi_status sfi_state_slow_update(sfi_state *st, const sfi_params *prm, int layer,
                                               const sfi_selector_input *in,
                                               sfi_selector_detail *detail, sfi_error *err);

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
