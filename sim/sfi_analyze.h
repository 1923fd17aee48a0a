/* The trace analyzer's engine: replays a full-level trace's steps through
 * the comparison policies of ref/sfi_policies.h at one budget and measures
 * attention-mass recall, overlap with the oracle top set, output error
 * (where q/K/V snapshots exist), SFI's slow-step statistics and the
 * support stability (Jaccard of consecutive top sets within a sentence vs
 * across a boundary).
 *
 * Where a step has the query and key snapshots the policies run on them
 * (their real rules) and recall and overlap are exact (the step's dense
 * attention computed from q and K); elsewhere the policies run on the
 * top-M records and recall spreads the tail mass evenly. With a prompt
 * observation (sfi_analyze_source.prompt) the first step of a request is
 * the prompt's last position: the policies see the prompt and are measured
 * from the second step on.
 *
 * The engine reads steps through a source (callbacks), so a trace file, a
 * test's hand-made steps and the benchmark's generator look the same.
 * Layers are independent except for Kascade's calibration (done first), so
 * worker threads take whole layers. */
#ifndef SFI_ANALYZE_H
#define SFI_ANALYZE_H

#include <stdint.h>
#include <stdio.h>
#include "sfi_error.h"
#include "sfi_policies.h"

typedef struct {
    int n_layers, n_kv_heads;
    int n_heads, head_dim;       /* for snapshots; 0 when there are none */
    int n_steps;                 /* all requests' decode steps, in order */
    int n_seq;                   /* requests */
    const int *seq_begin;        /* [n_seq + 1]: request r is steps
                                    [seq_begin[r], seq_begin[r+1]) */
    const int32_t *n_ctx;        /* [n_steps] cached positions, current incl. */
    const uint8_t *trigger;      /* [n_steps] the token chosen at this step
                                    ends a sentence (is in T_trig) */
    int max_ctx;                 /* >= every n_ctx */
    int max_top;                 /* >= every entry count */
    /* Fills *o for (step, layer, kv head). pos_buf/prob_buf (max_top
     * entries) are the caller's, for sources that generate entries; a
     * source holding arrays may point o at its own memory. Thread-safe.
     * Returns 0, or -1 with a message in err. */
    int (*get)(void *ctx, int step, int layer, int kvh, sfi_policy_obs *o, int32_t *pos_buf,
               float *prob_buf, sfi_error *err);
    /* Optional (NULL = none): the record of query head qh (0..n_heads-1)
     * when the trace keeps query-head records; q_per_kv = n_heads /
     * n_kv_heads, max_top_q >= every such entry count. SFI's Selector then
     * sees the group's query heads as its window queries. */
    int (*get_q)(void *ctx, int step, int layer, int qh, sfi_policy_obs *o, int32_t *pos_buf,
                 float *prob_buf, sfi_error *err);
    int q_per_kv, max_top_q;
    /* Optional (NULL = no snapshots): the q/K/V of (step, layer) or 0 when
     * that step has none. q[n_heads][head_dim], k and v
     * [>= n_ctx][n_kv_heads][head_dim] (v may be NULL: no output error). */
    int (*snapshot)(void *ctx, int step, int layer, const float **q, const float **k,
                    const float **v);
    /* Optional (NULL = none): what request seq's prompt showed layer
     * `layer` (sfi_policy_prompt); 0 when absent. */
    int (*prompt)(void *ctx, int seq, int layer, sfi_policy_prompt *pr);
    void *ctx;
} sfi_analyze_source;

typedef struct {
    unsigned policies;           /* mask of 1u << sfi_policy_kind */
    sfi_policy_config cfg;
    sfi_budget budget;           /* B per step (sfi_budget_positions) */
    int n_threads;               /* >= 1 */
    /* Kascade and FASA's calibration (NULL: Kascade falls back to the
     * first kascade_calib_steps steps of request 0, FASA to each request's
     * first step -- both measured on what they are evaluated on, and
     * reported as proxies). */
    const sfi_policy_calib *calib;
    int kascade_calib_steps;     /* 16 */
    int stab_k;                  /* top set size of the stability measure;
                                    0 = min(B, entries) */
    int keep_jaccard;            /* keep every Jaccard value (distributions) */
    int records_only;            /* ignore snapshots and the prompt observation:
                                    every policy on the top-M records, with
                                    its proxies (to compare with the real
                                    rules on the same trace) */
} sfi_analyze_opts;

void sfi_analyze_opts_default(sfi_analyze_opts *o);

#define SFI_ANALYZE_SINCE_MAX 256

typedef struct {
    int used;                    /* asked for */
    int available;               /* produced sets on at least one step */
    const char *proxy;           /* the policy's proxy note, or NULL */
    double n;                    /* (head, step) pairs measured */
    double recall, recall_lo, overlap, ratio; /* sums; divide by n */
    double n_err, out_err;       /* layer-steps with snapshots; sum */
    double cand;                 /* LFPS: candidates / context, summed */
    double exact;                /* (head, step) pairs measured on q/K */
    /* SFI only */
    double n_slow, n_steps;      /* layer-steps */
    double fast_n, fast_recall;
    double since_n[SFI_ANALYZE_SINCE_MAX + 1], since_recall[SFI_ANALYZE_SINCE_MAX + 1];
    double before_n, before_recall, after_n, after_recall;
} sfi_analyze_policy;

typedef struct {
    int n_layers;
    sfi_analyze_policy pol[SFI_POLICY_N_KINDS];
    double *layer_recall;        /* [kind][layer] sums */
    double *layer_n;             /* [kind][layer] */
    /* Stability: per layer sums and counts, plus (keep_jaccard) values. */
    double *jw_sum, *ja_sum;     /* [layer] within / across */
    long *jw_n, *ja_n;
    float **jw, **ja;            /* [layer][...] values when kept */
    double budget_sum, ctx_sum, n_steps; /* for the mean budget ratio */
    int kascade_anchors[64];
    int n_kascade_anchors;
    int kascade_proxy;           /* planned from the trace itself */
} sfi_analyze_result;

/* Runs every requested policy over the source. Result arrays are malloc'd
 * (free with sfi_analyze_result_free). */
SFI_NODISCARD sfi_status sfi_analyze_run(const sfi_analyze_source *src, const sfi_analyze_opts *opt,
                                         sfi_analyze_result *res, sfi_error *err);
void sfi_analyze_result_free(sfi_analyze_result *res);

/* Quantile q in [0,1] of v[0..n) (sorts v in place); NaN when n == 0. */
double sfi_analyze_quantile(float *v, long n, double q);

#endif
