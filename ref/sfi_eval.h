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
 *
 * Captured mass: at every scored step and layer, each query head's dense
 * softmax over the whole context (the step's real query and keys) summed
 * over the positions its KV head attended; 1 where the step attended
 * densely. It checks the selection (the oracle's top-B of the pooled
 * attention captures the most of any set of B positions), but it is not
 * the output error: renormalising over a high-scoring subset of a nearly
 * flat attention (the small model's layer 0) biases the output towards
 * those positions' values, so a policy with less mass can be closer to full
 * KV (see sfi-ref-eval(1)).
 */
#ifndef SFI_EVAL_H
#define SFI_EVAL_H

#include <stdint.h>
#include <stdio.h>
#include "sfi_error.h"
#include "sfi_policies.h"
#include "sfi_qwen3.h"

#define SFI_EVAL_MAX_BUDGETS 32
#define SFI_EVAL_MAX_THREADS 64
/* Every peer and SFI (its trigger variants on request). */
#define SFI_EVAL_DEFAULT_POLICIES                                                               \
    (SFI_POLICY_ALL & ~((1u << SFI_POLICY_TMAX) | (1u << SFI_POLICY_INTERVAL) |                   \
                        (1u << SFI_POLICY_BOUNDARY)))

typedef struct {
    int n_prefix;               /* L (8192) */
    int n_tokens;               /* N scored tokens (512) */
    double shares[SFI_EVAL_MAX_BUDGETS]; /* retained shares in (0, 1] */
    int n_shares;               /* default 2%, 4%, 6%, 12%, 27% */
    unsigned policies;          /* mask (1u << sfi_policy_kind); full KV is always run, as
                                   the reference, and has no row; default
                                   SFI_EVAL_DEFAULT_POLICIES */
    sfi_policy_config cfg;      /* every policy's knobs, SFI's sfi_params included */
    const sfi_policy_calib *calib; /* Kascade/FASA (NULL: stand-ins, see sfi_eval.c) */
    const uint8_t *is_trigger;  /* SFI's trigger set [n_trigger_vocab], may be NULL */
    int32_t n_trigger_vocab;
    sfi_backend backend;        /* blas when built in, else scalar */
    int n_boot;                 /* bootstrap resamples of the NLL delta (1000) */
    double conf;                /* two-sided interval level (0.95) */
    uint64_t seed;              /* bootstrap seed (1) */
    FILE *progress;             /* a line per run, may be NULL */
    int n_threads;              /* runs in parallel; 0: one per online CPU */
} sfi_eval_opts;

void sfi_eval_opts_default(sfi_eval_opts *o);

/* Parses "2%,4%,0.06" (a share in (0, 1] or a percentage in (0, 100]) into
 * o->shares, ascending as given. */
SFI_NODISCARD sfi_status sfi_eval_parse_shares(const char *list, sfi_eval_opts *o, sfi_error *err);

/* B for a share: sfi_budget_positions at the run's context L + N. */
int sfi_eval_budget(double share, int n_prefix, int n_tokens);

/* SFI at budget B for a run whose context reaches n_ctx_max:
 * sfi_budget_sfi_split (n_sink as configured, recent = min(n_recent,
 * (B - n_sink) / 2), K = B - n_sink - recent, at least 1 each; when
 * B >= n_ctx_max recent = B - n_sink and K = 1, so that sink and recent
 * cover the context at every step: positions written after a slow step
 * would otherwise leave a short window before the next selection). */
void sfi_eval_sfi_split(const sfi_params *prm, int B, int n_ctx_max, int *n_recent, int *K);

/* One policy at one budget. */
typedef struct {
    sfi_policy_kind kind;
    double share;               /* requested */
    int budget;                 /* B */
    double retained;            /* mean over steps, layers, KV heads of |set| / n_ctx */
    double mass;                /* captured attention: mean over steps, layers and query
                                   heads of the step's dense attention mass that falls on
                                   the positions the head attended (1 at a dense step) */
    double nll, ppl;            /* mean NLL (nats) of the N tokens, exp(nll) */
    double dnll;                /* nll - full KV's */
    double dnll_lo, dnll_hi;    /* bootstrap percentile interval of dnll over tokens */
    double top1;                /* share of steps whose argmax equals full KV's */
    double kl;                  /* mean KL(full || policy), nats */
    double kl_max;              /* largest per-token KL */
    double slow_fraction;       /* SFI: slow steps among the N; -1 for the others */
    const char *proxy;          /* the proxy the policy had to use, or NULL */
    double seconds, cpu_seconds; /* wall clock, CPU time of its thread */
    int n_anchors;              /* Kascade: its plan's anchor layers */
    int anchors[64];
} sfi_eval_row;

typedef struct {
    int n_prefix, n_tokens;
    double full_nll, full_ppl;
    double full_seconds;
    double prefill_seconds, prefill_cpu_seconds;
    double seconds, cpu_seconds;      /* the whole evaluation (process CPU time) */
    int n_threads;                    /* runs in parallel */
    int n_rows;
    sfi_eval_row *rows;               /* budget-major, policies in kind order */
    int n_kascade_anchors;            /* Kascade's plan at the last budget */
    int kascade_anchors[64];
} sfi_eval_result;

/* A peer policy as the harness runs it: an sfi_policy for all layers of a
 * model (exposed for tests: hand-made steps in, positions out). It sees
 * what the policy's interface gives (ref/sfi_policies.h): the prompt
 * observation, then at each step and layer the real query and the layer's
 * cached keys. */
typedef struct sfi_eval_policy sfi_eval_policy;

/* kind: a peer (not full KV or an SFI kind, which the harness runs through
 * the decode loop). calib: Kascade's and FASA's (must outlive the policy;
 * Kascade needs one). */
SFI_NODISCARD sfi_status sfi_eval_policy_create(sfi_policy_kind kind, const sfi_policy_config *cfg,
                                                int n_layers, int n_heads, int n_kv_heads,
                                                int head_dim, int max_ctx,
                                                const sfi_policy_calib *calib,
                                                sfi_eval_policy **out, sfi_error *err);
void sfi_eval_policy_free(sfi_eval_policy *p);
/* The prompt of layer `layer` (before the first step). */
SFI_NODISCARD sfi_status sfi_eval_policy_prompt(sfi_eval_policy *p, int layer,
                                                const sfi_policy_prompt *pr, sfi_error *err);
/* The proxy note (sfi_policy_proxy_note) and Kascade's anchors. */
const char *sfi_eval_policy_proxy(const sfi_eval_policy *p);
int sfi_eval_policy_anchors(const sfi_eval_policy *p, int *anchors, int max);

/* One layer of one step. Layers of a step go in order (Kascade's reuse
 * layers take the anchor layer's set of the same step). */
typedef struct {
    int layer, step;          /* step: 1, 2, ... after the prompt (0 without one) */
    int n_ctx;                /* cached positions, the current token's included */
    int budget;               /* B */
    int prev_trigger;         /* the fed token ends a sentence */
    const float *q;           /* [n_heads][head_dim], roped */
    const float *k;           /* the layer's cache [n_ctx][n_kv_heads][head_dim] */
} sfi_eval_layer_step;

/* Writes, per KV head h, the ascending positions attended at
 * (*idx)[h * max_ctx ..] and their count (*n_idx)[h] (0: the head attends
 * to nothing, its output is zero); valid until the next call. When budget
 * >= n_ctx every position is attended (see above). */
SFI_NODISCARD sfi_status sfi_eval_policy_sets(sfi_eval_policy *p, const sfi_eval_layer_step *ls,
                                              const int32_t **idx, const int **n_idx,
                                              sfi_error *err);

/* tokens: the text's ids, n_text >= n_prefix + n_tokens + 1. */
SFI_NODISCARD sfi_status sfi_eval_run(const sfi_qwen3 *m, const sfi_eval_opts *o,
                                      const int32_t *tokens, int n_text, sfi_eval_result *res,
                                      sfi_error *err);
void sfi_eval_result_free(sfi_eval_result *r);

#endif
