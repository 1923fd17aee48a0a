/* Quality inside the forward pass (sfi-ref eval): every policy at equal
 * budget on real text, teacher-forced.
 *
 * The text's first L tokens are prefilled once (sfi_decode_prefix_build);
 * every run (full KV, then each policy at each budget) starts from a copy
 * of that prefix. Step s = 1..N feeds token L+s-1 and is scored on its
 * prediction of token L+s, so every scored prediction comes from a step
 * whose attention the policy restricted (the prefill's own prediction of
 * token L is dense for everyone and not scored); the text needs L+N+1
 * tokens.
 *
 * At each step, in every layer, each KV head of a policy attends only to
 * the positions the policy chose for it, with the step's real query and the
 * cached keys (the attend hook of the forward pass). Full KV is the
 * reference: per token, NLL = -log p(target), KL(full || policy) over the
 * vocabulary, top-1 agreement of the argmax with full KV's.
 *
 * Budget: a retained share s gives B = round(s * (L + N)) positions per KV
 * head per step (at least 1, at most L + N), sink and recent included, the
 * same B for every policy and step; so s = 1 covers the whole context at
 * every step and every policy is then full KV exactly. At a step whose
 * context fits in B (n_ctx <= B) a peer policy is still stepped (its state
 * goes on) but every position is attended: there is nothing to choose, and
 * a rule that would drop positions anyway (a threshold, whole pages) does
 * not get to waste a budget that holds them all. How each policy
 * spends B is documented at its kind in ref/sfi_policies.h; SFI's split is
 * sfi_eval_sfi_split's. A step that is dense (full KV, SFI's slow steps,
 * Kascade's layer 0) attends to every position: the mean retained share
 * reports what each policy really read.
 */
#ifndef SFI_EVAL_H
#define SFI_EVAL_H

#include <stdint.h>
#include <stdio.h>
#include "sfi_error.h"
#include "sfi_policies.h"
#include "sfi_qwen3.h"

#define SFI_EVAL_MAX_BUDGETS 32

typedef struct {
    int n_prefix;               /* L (8192) */
    int n_tokens;               /* N scored tokens (512) */
    double shares[SFI_EVAL_MAX_BUDGETS]; /* retained shares in (0, 1] */
    int n_shares;               /* default 2%, 4%, 6%, 12%, 27% */
    unsigned policies;          /* mask (1u << sfi_peer_kind); full KV is always run, as
                                   the reference, and has no row */
    sfi_peer_config cfg;        /* every policy's knobs, SFI's sfi_params included */
    const uint8_t *is_trigger;  /* SFI's trigger set [n_trigger_vocab], may be NULL */
    int32_t n_trigger_vocab;
    sfi_backend backend;        /* blas when built in, else scalar */
    int n_boot;                 /* bootstrap resamples of the NLL delta (1000) */
    double conf;                /* two-sided interval level (0.95) */
    uint64_t seed;              /* bootstrap seed (1) */
    FILE *progress;             /* a line per run, may be NULL */
} sfi_eval_opts;

void sfi_eval_opts_default(sfi_eval_opts *o);

/* Parses "2%,4%,0.06" (a share in (0, 1] or a percentage in (0, 100]) into
 * o->shares, ascending as given. */
sfi_status sfi_eval_parse_shares(const char *list, sfi_eval_opts *o, sfi_error *err);

/* B for a share (see above). */
int sfi_eval_budget(double share, int n_prefix, int n_tokens);

/* SFI at budget B for a run whose context reaches n_ctx_max: n_sink as
 * configured, recent = min(n_recent, (B - n_sink) / 2), K = B - n_sink -
 * recent (at least 1 each; below B = n_sink + 2 the set is larger than B,
 * and the retained share says so). The fast set sink U recent U selected
 * then holds at most B positions. When B >= n_ctx_max the budget covers
 * every position the run will hold and recent = B - n_sink, K = 1: sink and
 * recent then cover the context at every step, J stays empty (a split
 * with a short recent window would not cover it: positions written after a
 * slow step leave the window before the next selection). */
void sfi_eval_sfi_split(const sfi_params *prm, int B, int n_ctx_max, int *n_recent, int *K);

/* One policy at one budget. */
typedef struct {
    sfi_peer_kind kind;
    double share;               /* requested */
    int budget;                 /* B */
    double retained;            /* mean over steps, layers, KV heads of |set| / n_ctx */
    double nll, ppl;            /* mean NLL (nats) of the N tokens, exp(nll) */
    double dnll;                /* nll - full KV's */
    double dnll_lo, dnll_hi;    /* bootstrap percentile interval of dnll over tokens */
    double top1;                /* share of steps whose argmax equals full KV's */
    double kl;                  /* mean KL(full || policy), nats */
    double kl_max;              /* largest per-token KL */
    double slow_fraction;       /* SFI: slow steps among the N; -1 for the others */
    double seconds, cpu_seconds;
} sfi_eval_row;

typedef struct {
    int n_prefix, n_tokens;
    double full_nll, full_ppl;
    double full_seconds;
    double prefill_seconds, prefill_cpu_seconds;
    double seconds, cpu_seconds;      /* the whole evaluation */
    int n_rows;
    sfi_eval_row *rows;               /* budget-major, policies in kind order */
    int n_kascade_anchors;            /* Kascade's plan at the last budget */
    int kascade_anchors[64];
} sfi_eval_result;

/* A peer policy as the harness runs it, one instance for all layers of a
 * model (exposed for tests: hand-made steps in, positions out). What it
 * hands the sfi_peer of a layer at a step: the real query, the layer's
 * cached keys, and, for the kinds that read attention weights
 * (sfi_eval_kind_reads_attention: oracle, H2O, SnapKV, LFPS, Kascade), the
 * step's dense attention pooled over each KV head's query heads (mean),
 * every position ranked. */
typedef struct sfi_eval_policy sfi_eval_policy;

int sfi_eval_kind_reads_attention(sfi_peer_kind k);

/* kind: a peer (not full KV or SFI, which the harness runs itself). plan:
 * Kascade's (must outlive the policy), else ignored. */
sfi_status sfi_eval_policy_create(sfi_peer_kind kind, const sfi_peer_config *cfg, int n_layers,
                                  int n_heads, int n_kv_heads, int head_dim, int max_ctx,
                                  const sfi_peer_kascade_plan *plan, sfi_eval_policy **out,
                                  sfi_error *err);
void sfi_eval_policy_free(sfi_eval_policy *p);

/* One layer of one step. Layers of a step go in order (Kascade's reuse
 * layers read the anchor layer's attention of the same step). */
typedef struct {
    int layer, step;          /* step: 0, 1, ... within the run */
    int n_ctx;                /* cached positions, the current token's included */
    int budget;               /* B */
    int prev_trigger;         /* the fed token ends a sentence */
    const float *q;           /* [n_heads][head_dim], roped */
    const float *k;           /* the layer's cache [n_ctx][n_kv_heads][head_dim] */
    const float *probs;       /* [n_heads][n_ctx] dense attention, or NULL when the
                                 kind does not read it */
} sfi_eval_layer_step;

/* Writes, per KV head h, the ascending positions attended at
 * (*idx)[h * max_ctx ..], their count (*n_idx)[h] (0: the head attends to
 * nothing, its output is zero) and (*mean_v)[h] (the head outputs the mean
 * value vector of its set instead: LFPS's sink heads); valid until the
 * next call. When budget >= n_ctx every position is attended (see above). */
sfi_status sfi_eval_policy_sets(sfi_eval_policy *p, const sfi_eval_layer_step *ls,
                                const int32_t **idx, const int **n_idx, const uint8_t **mean_v,
                                sfi_error *err);

/* tokens: the text's ids, n_text >= n_prefix + n_tokens + 1. */
sfi_status sfi_eval_run(const sfi_qwen3 *m, const sfi_eval_opts *o, const int32_t *tokens,
                        int n_text, sfi_eval_result *res, sfi_error *err);
void sfi_eval_result_free(sfi_eval_result *r);

#endif
