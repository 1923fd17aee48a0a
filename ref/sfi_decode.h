/* The decode loop of sfi(7) DECODE LOOP for one request: prefill (the last
 * W_prefill prompt queries initialize the selected sets through the
 * Selector), then greedy decoding in SFI mode (slow/fast steps decided by a
 * trigger policy) or dense mode (full KV every step, the baseline).
 *
 * Steps: the prefill runs the whole prompt densely and its last position's
 * logits give x_0, so decode step 0 is that dense pass (kind SLOW, reason
 * FIRST); in SFI mode the Selector over the last W_prefill prompt queries
 * then initializes the selected sets. Step t >= 1 feeds x_{t-1} at position
 * n_prompt + t - 1 and is slow or fast by the trigger policy (dense mode:
 * always slow, reason ALWAYS). A slow step refreshes every layer's sets with
 * the Selector over the last W_decode queries.
 *
 * An observer (a struct of callbacks, any of them NULL) sees what happens;
 * the trace recorder implements one. Observers only read: nothing they do
 * changes the generated tokens. */
#ifndef SFI_DECODE_H
#define SFI_DECODE_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_params.h"
#include "sfi_state.h"
#include "sfi_qwen3.h"

typedef enum { SFI_DECODE_SFI = 0, SFI_DECODE_DENSE = 1 } sfi_decode_mode;

const char *sfi_decode_mode_name(sfi_decode_mode m);
/* "sfi" or "dense". */
SFI_NODISCARD sfi_status sfi_decode_mode_parse(const char *s, sfi_decode_mode *m, sfi_error *err);

typedef struct {
    sfi_decode_mode mode;
    sfi_params params;         /* sfi(7) knobs (K, n_recent, ...) */
    sfi_trigger_kind trigger;  /* SFI mode only; default SFI_TRIG_SFI */
    int interval;              /* for SFI_TRIG_INTERVAL */
    const uint8_t *is_trigger; /* [n_trigger_vocab] 0/1, may be NULL (empty set) */
    int32_t n_trigger_vocab;
    int max_new;            /* tokens to generate, >= 1 */
    int32_t stop_token;     /* stop after generating it; -1: never stop early */
    const int *stop_tokens; /* more tokens that stop (e.g. every id of a config's
                                    eos_token_id list); NULL when none */
    int n_stop_tokens;
    sfi_backend backend;
    /* Teacher forcing (NULL: greedy decoding): step t >= 1 feeds
     * forced[t-1] instead of x_{t-1} (the trigger policy sees the fed
     * token); the argmax x_t is still reported. n_forced >= max_new - 1. */
    const int32_t *forced;
    int n_forced;
} sfi_decode_opts;

/* Defaults: SFI mode, sfi_params_default, SFI trigger policy, no trigger
 * tokens, max_new 16, no stop token, scalar backend. */
void sfi_decode_opts_default(sfi_decode_opts *o);

/* What an observer is told. Pointers are valid only during the callback. */
typedef struct {
    const int32_t *prompt; /* [n_prompt] */
    int n_prompt;
    int n_layers, n_heads, n_kv_heads, head_dim;
    const sfi_state *state;   /* selected sets after prefill (SFI mode; NULL in dense) */
    const float *last_logits; /* [vocab] logits of the last prompt position */
    int vocab_size;
} sfi_decode_prefill_info;

typedef struct {
    int step;           /* decode step t = 0, 1, ... */
    sfi_step_kind kind; /* SLOW or FAST (dense mode: SLOW, reason ALWAYS) */
    sfi_step_reason reason;
    int32_t input_token; /* token fed at this step (x_{t-1}, or the last prompt token at t=0) */
    int position;        /* position of the input token */
    int n_ctx;           /* cached positions including the input token's */
    int32_t token;       /* x_t, the generated token */
    const float *logits; /* [vocab] */
    int vocab_size;
    /* Positions the step's attention read, summed over layers and KV heads
     * (a dense layer counts n_ctx per KV head; step 0 is the prefill's last
     * position, dense). */
    int64_t attended;
} sfi_decode_step_info;

/* One layer of a slow step (or of prefill, step == -1) after the Selector
 * ran. */
typedef struct {
    int step; /* -1 for prefill */
    int layer;
    int n_ctx;
    int n_kv_heads, K;
    const int32_t *selected; /* [n_kv_heads][K], ascending; n_selected[h] valid */
    const int *n_selected;   /* [n_kv_heads] */
    int j_begin, j_end;      /* J */
    const float *lambda;     /* [n_kv_heads] lambda* of the Selector */
    /* [n_heads]: for each query head, the dense attention mass (of the
     * step's query; of the last prompt query at prefill) that falls on
     * sink U selected U recent of its KV head. */
    const float *captured_mass;
    int n_heads;
    /* 1 (refresh_delay >= 2, decode slow steps): the sets are pending;
     * they take effect at step + refresh_delay unless another slow step
     * comes first (then they are dropped). 0: in effect from now on. */
    int deferred;
} sfi_decode_slow_layer_info;

/* Dense attention probabilities of one layer at one decode step t (step 0:
 * the prefill's last query over the prompt, reported after on_prefill),
 * computed only when the observer asks (want_attention), on fast steps
 * too. */
typedef struct {
    int step;
    int layer;
    sfi_step_kind kind;
    int n_heads, n_ctx;
    const float *probs; /* [n_heads][n_ctx] */
} sfi_decode_attention_info;

/* A layer's real (roped) query and its key/value cache, in forward order:
 * every prompt position's (step -1, except the prompt's last position,
 * which is decode step 0) and every later step's; and once the run has
 * ended, per layer, final = 1 with q NULL and the whole cache. Not told
 * for the prompt of a shared prefix (sfi_decode_run_prefix). */
typedef struct {
    int step;     /* decode step; -1: a prompt position before the last */
    int position; /* the query's position (n_ctx - 1) */
    int layer, n_ctx;
    int final;
    const float *q;     /* [n_heads][head_dim]; NULL when final */
    const float *k, *v; /* the layer's cache [n_ctx][n_kv_heads][head_dim] */
} sfi_decode_qk_info;

/* Callbacks return SFI_OK to go on; anything else stops the run with that
 * status (the callback fills err). */
typedef struct {
    void *user;
    int want_attention; /* nonzero: call on_attention every step and layer */
    sfi_status (*on_prefill)(void *user, const sfi_decode_prefill_info *info, sfi_error *err);
    sfi_status (*on_step)(void *user, const sfi_decode_step_info *info, sfi_error *err);
    sfi_status (*on_slow_layer)(void *user, const sfi_decode_slow_layer_info *info, sfi_error *err);
    sfi_status (*on_attention)(void *user, const sfi_decode_attention_info *info, sfi_error *err);
    int want_qk; /* nonzero: call on_qk */
    sfi_status (*on_qk)(void *user, const sfi_decode_qk_info *info, sfi_error *err);
} sfi_decode_observer;

typedef struct {
    int n_generated;
    int32_t *ids;             /* [n_generated] */
    sfi_step_kind *kinds;     /* [n_generated] */
    sfi_step_reason *reasons; /* [n_generated] */
    int n_slow;
    double slow_fraction; /* n_slow / n_generated */
    /* SHA-256 over: mode, prompt ids, every step's kind, reason, token and
     * logits (f32 little-endian bits), and in SFI mode the selected sets
     * after every slow step and prefill (with refresh_delay = d >= 2: the
     * sets of decode slow step t when they take effect, before step t +
     * d's record; dropped sets are not hashed). */
    unsigned char digest[32];
    char digest_hex[65];
    double prefill_seconds, decode_seconds;         /* wall clock */
    double prefill_cpu_seconds, decode_cpu_seconds; /* CPU time of the process */
} sfi_decode_result;

/* A prompt prefilled once (densely, through the backend) and shared by
 * several runs (sfi-ref eval runs every policy from one): the KV cache of
 * the n_prompt positions, the roped queries of the last n_queries positions
 * of every layer (the Selector's prefill window; position p in slot
 * p % n_queries), and the logits of the last position. */
typedef struct {
    int32_t *prompt; /* [n_prompt] */
    int n_prompt;
    sfi_backend backend;
    sfi_kv_cache kv; /* kv.n == n_prompt */
    int n_queries;
    float *qhist;                /* [layer][n_queries][n_heads*head_dim] */
    float *logits;               /* [vocab] */
    double seconds, cpu_seconds; /* wall clock and process CPU time of the prefill */
} sfi_decode_prefix;

/* Prefills prompt[0..n_prompt) into out (capacity: KV positions to
 * allocate, >= n_prompt; n_queries >= 1 is clipped to n_prompt). */
SFI_NODISCARD sfi_status sfi_decode_prefix_build(const sfi_qwen3 *m, sfi_backend be,
                                                 const int32_t *prompt, int n_prompt, int capacity,
                                                 int n_queries, sfi_decode_prefix *out,
                                                 sfi_error *err);
void sfi_decode_prefix_free(sfi_decode_prefix *p);

/* Runs one request. prompt must be non-empty and n_prompt + max_new must
 * not exceed the model's max_position_embeddings. obs may be NULL.
 * res is filled on success (free with sfi_decode_result_free). */
SFI_NODISCARD sfi_status sfi_decode_run(const sfi_qwen3 *m, const sfi_decode_opts *o,
                                        const int32_t *prompt, int n_prompt,
                                        const sfi_decode_observer *obs, sfi_decode_result *res,
                                        sfi_error *err);
void sfi_decode_result_free(sfi_decode_result *res);

/* sfi_decode_run from a prefix instead of prefilling: the same steps, the
 * same digest and observer calls as sfi_decode_run on pre->prompt (bit
 * for bit when the backend is the prefix's), and pre is not modified.
 * pre->n_queries must cover the Selector's prefill window
 * (min(W_prefill, n_prompt)). prefill_seconds is the prefix's. */
SFI_NODISCARD sfi_status sfi_decode_run_prefix(const sfi_qwen3 *m, const sfi_decode_opts *o,
                                               const sfi_decode_prefix *pre,
                                               const sfi_decode_observer *obs,
                                               sfi_decode_result *res, sfi_error *err);

#endif
