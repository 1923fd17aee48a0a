/* The comparison policies of sfi(7) PEER METHODS -- full KV, oracle top-K,
 * StreamingLLM, H2O, SnapKV, Quest, LFPS, Kascade, FASA -- and SFI with its
 * trigger variants, as ONE list used by every tool: the trace analyzer
 * (sim/sfi_analyze.c), the cost model (sim/sfi_cost.c) and the evaluation
 * inside the forward pass (sfi-ref eval). One name table, one parser, one
 * place for each default (sfi_policy_config_default), one budget.
 *
 * HOW TO DRIVE A POLICY (real q and K, e.g. inside the forward pass)
 *
 *   sfi_policy *p;
 *   sfi_policy_create(kind, &cfg, &shape, max_ctx, calib, &p, err);
 *   per request:
 *     sfi_policy_reset(p);
 *     after the prefill, per layer l (optional, but H2O, SnapKV, LFPS and
 *     SFI are defined on the prompt; without it they fall back to a proxy
 *     that sfi_policy_proxy_note names):
 *       sfi_policy_prompt_run(p, l, &(sfi_policy_prompt){n_prompt, n_tail,
 *                             q_tail, k, colsum, B}, err);
 *     The prompt's last position is decode step 0 (its token comes from
 *     the dense prefill), so after sfi_policy_prompt_run the next
 *     sfi_policy_run is step 1; without it the first run is step 0.
 *     At decode step t, per layer l in order 0..n_layers-1:
 *       sfi_policy_step in = {.step = t, .n_ctx = n, .budget = B,
 *                             .prev_trigger = x_{t-1} ends a sentence,
 *                             .q = roped queries [n_heads][head_dim],
 *                             .k = layer l's key cache [n][n_kv][head_dim]};
 *       sfi_policy_run(p, l, &in, sets, &available, &slow, err);
 *       per KV head h: sfi_policy_set_indices(&sets[h], idx, &n_idx)
 *       gives the ascending positions to attend to (sets[h].dense: all).
 *
 * The budget B is positions per KV head per step, everything included
 * (sink, recent, selection, Kascade's and Quest's dense layers excepted,
 * where their papers attend densely); sfi_budget_positions turns a budget
 * spec ("6%", "0.06", "2308", "sfi") into B for a context: the analyzer,
 * the simulator and the evaluation harness all call it. A policy computes
 * from q and K whatever attention its own rule observes (LFPS's weights
 * over its final set, H2O's over its kept set, Kascade's and the oracle's
 * exact top-k, SFI's dense logits at slow steps); the caller does not feed
 * attention back.
 *
 * Kascade's reuse layers take the mapped anchor head's set of the same
 * step: from this object when it ran the anchor layer at this step (the
 * forward pass runs layers in order), else recomputed through the step's
 * layer_qk / layer_obs callbacks (the analyzer runs layers on threads).
 *
 * TRACE-DRIVEN USE (the analyzer on traces without q/K snapshots): a step
 * gives obs, per KV head the top-M positions and probabilities of the
 * step's dense attention plus the tail mass outside them, instead of q/k.
 * Quest and FASA then cannot act (available = 0); the others run their rule
 * on the recorded attention, with the proxies sfi_policy_proxy_note names
 * (H2O, SnapKV, LFPS without a prompt observation use the first decode
 * step's attention in its place).
 *
 * Calibration (Kascade's anchors and head map, FASA's dominant chunks)
 * comes from data separate from what is evaluated: sfi_policy_calib, built
 * by sfi_policy_calibrator from a calibration text (sfi-ref calibrate) and
 * stored as JSON (also in a trace's meta key "peer_calibration").
 *
 * Each policy's rule, the paper's and the remaining differences are in
 * sfi-sim-analyze(1), POLICIES. Not thread-safe: one object per thread. */
#ifndef SFI_POLICIES_H
#define SFI_POLICIES_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_params.h"
#include "sfi_state.h"
#include "sfi_policy_calib.h"

/* ------------------------------------------------------------------ */
/* The one list of policies                                            */

typedef enum {
    SFI_POLICY_FULL = 0,   /* dense every step */
    SFI_POLICY_ORACLE,     /* exact top-B of the step's dense attention */
    SFI_POLICY_STREAMING,  /* sink n_sink + recent B - n_sink */
    SFI_POLICY_H2O,        /* heavy hitters by accumulated attention (prompt
                              included) + recent h2o_recent_frac*B; evicted
                              positions never return */
    SFI_POLICY_SNAPKV,     /* prompt compressed once from the observation
                              window (last snapkv_window prompt queries,
                              max-pooled); window + generated tokens kept */
    SFI_POLICY_QUEST,      /* pages of quest_page tokens, top floor(B/page)
                              pages by the min/max key bound; the first
                              quest_dense_layers layers dense */
    SFI_POLICY_LFPS,       /* decayed vertical/slash tables seeded from the
                              last lfps_s prompt queries, candidates above
                              a*mean/kurtosis, expansion, exact top-B */
    SFI_POLICY_KASCADE,    /* layer 0 dense, exact top-B in anchor layers,
                              reuse layers take a mapped anchor head's set */
    SFI_POLICY_FASA,       /* top-B by the score on N_tip dominant RoPE
                              frequency chunks */
    SFI_POLICY_SFI,        /* sink + recent + Selector(K = B - n_sink -
                              n_recent), slow at step 0, after a boundary
                              token or after T_max steps */
    SFI_POLICY_TMAX,       /* SFI state, slow every T_max steps only */
    SFI_POLICY_INTERVAL,   /* SFI state, slow every `interval` steps */
    SFI_POLICY_BOUNDARY,   /* SFI state, slow after boundary tokens only */
    SFI_POLICY_N_KINDS
} sfi_policy_kind;

#define SFI_POLICY_ALL ((1u << SFI_POLICY_N_KINDS) - 1u)

const char *sfi_policy_kind_name(sfi_policy_kind k);
/* One line for --help and `sfi-sim presets`. */
const char *sfi_policy_kind_help(sfi_policy_kind k);
SFI_NODISCARD sfi_status sfi_policy_kind_parse(const char *name, sfi_policy_kind *k,
                                               sfi_error *err);
/* Comma-separated names ("all" = every kind) into mask bits (1u << kind).
 * Unknown names are errors naming the name. */
SFI_NODISCARD sfi_status sfi_policy_parse_list(const char *list, unsigned *mask, sfi_error *err);
/* The SFI kinds (sfi, tmax, interval, boundary): slow and fast steps by a
 * trigger policy of ref/sfi_state.h. */
int sfi_policy_has_slow_steps(sfi_policy_kind k);
/* Their trigger kind (SFI_TRIG_ALWAYS for full, SFI_TRIG_NEVER otherwise). */
sfi_trigger_kind sfi_policy_trigger_kind(sfi_policy_kind k);
/* Quest and FASA: no set without real q and K. */
int sfi_policy_needs_qk(sfi_policy_kind k);

/* ------------------------------------------------------------------ */
/* Parameters: one place for each default                              */

typedef struct {
    sfi_params prm;           /* n_sink, n_recent, T_max, Selector knobs */
    int interval;             /* INTERVAL: steps between slow steps [16] */
    float h2o_recent_frac;    /* H2O: recent share of B [0.5] (the paper's
                                 equal heavy/recent split) */
    int snapkv_window;        /* SnapKV: observation window [32] */
    int snapkv_pool;          /* SnapKV: max-pool radius, kernel 2r+1 [3] */
    int quest_page;           /* Quest: tokens per page [16] */
    int quest_dense_layers;   /* Quest: first layers left dense [2] */
    float lfps_r;             /* LFPS: decay [0.95] */
    float lfps_a;             /* LFPS: threshold factor [0.2] */
    int lfps_s;               /* LFPS: prompt queries seeding the tables [32] */
    int lfps_keep;            /* LFPS: first tokens always kept [4] */
    float lfps_sink_share;    /* LFPS: sink bypass above this share [0.85] */
    float lfps_cand;          /* cost model: LFPS candidates as a share of
                                 the context; 0 = the paper's table [0] */
    int kascade_anchors;      /* Kascade: anchor layers besides the dense
                                 layer 0; 0 = ceil(5 * n_layers / 36), the
                                 paper's 5 for 32- and 36-layer models [0] */
    int kascade_calib_k;      /* Kascade: top-k of the calibration [64] */
    int fasa_tip;             /* FASA: dominant chunks per head; 0 = a
                                 quarter of head_dim/2 (16 of 64) [0] */
    int fasa_calib_k;         /* FASA: top-K of the agreement test [256] */
} sfi_policy_config;

void sfi_policy_config_default(sfi_policy_config *c);
/* "key=value" for the fields above or any sfi_params key. */
SFI_NODISCARD sfi_status sfi_policy_config_set(sfi_policy_config *c, const char *kv,
                                               sfi_error *err);
/* Keys and one-line descriptions, for --help. */
size_t sfi_policy_config_key_count(void);
const char *sfi_policy_config_key_name(size_t i);
const char *sfi_policy_config_key_help(size_t i);
/* "NAME" or "NAME:key=value,key=value" (sfi-sim sweep's policy specs): a
 * key is a config key, or the part after the policy's prefix
 * ("quest:page=32" sets quest_page, "lfps:cand=0.03" lfps_cand). */
SFI_NODISCARD sfi_status sfi_policy_spec_parse(const char *spec, sfi_policy_kind *kind,
                                               sfi_policy_config *c, sfi_error *err);
/* The derived defaults for a model shape. */
int sfi_policy_kascade_anchors(const sfi_policy_config *c, int n_layers);
int sfi_policy_fasa_tip(const sfi_policy_config *c, int head_dim);
/* LFPS's expected candidate share of a context of n positions: lfps_cand
 * when set, else the paper's measurements (4.6% at 8K falling to 1.7% at
 * 128K) interpolated in log n and held beyond. */
double sfi_policy_lfps_cand_share(const sfi_policy_config *c, int n);

/* ------------------------------------------------------------------ */
/* The one budget                                                      */

/* Positions per KV head per step, sink and recent included. Exactly one
 * of: ratio > 0 (a share of the context), positions > 0 (a count), or
 * neither: SFI's own fast set at its parameters, n_sink + K + n_recent. */
typedef struct {
    double ratio;
    int positions;
} sfi_budget;

/* "6%", "0.06" (a share in (0,1)), "2308" (a count >= 1) or "sfi". */
SFI_NODISCARD sfi_status sfi_budget_parse(const char *s, sfi_budget *b, sfi_error *err);
/* B for a context of n_ctx cached positions: round(ratio * n_ctx), the
 * count, or n_sink + K + n_recent; clipped to [1, n_ctx]. */
int sfi_budget_positions(const sfi_budget *b, const sfi_params *prm, int n_ctx);
/* Writes the spec back ("6%", "2308", "sfi") into buf. */
void sfi_budget_format(const sfi_budget *b, char *buf, size_t n);
/* SFI's split of a budget B: n_sink as configured, recent = min(n_recent,
 * (B - n_sink) / 2), K = B - n_sink - recent, each at least 1 (below
 * B = n_sink + 2 the set exceeds B). When B >= n_ctx_max (the largest
 * context the run reaches) recent = B - n_sink and K = 1: sink and recent
 * then cover every position. At "sfi" (B = n_sink + K + n_recent) this
 * gives back n_recent and K. */
void sfi_budget_sfi_split(const sfi_params *prm, int B, int n_ctx_max, int *n_recent, int *K);

/* ------------------------------------------------------------------ */
/* Steps and sets                                                      */

typedef struct {
    int n_layers, n_heads, n_kv_heads, head_dim;
} sfi_policy_shape;

/* One step's dense attention of one KV head as a full-level trace records
 * it (query heads of the group pooled by the recorder or loader). */
typedef struct {
    int n_ctx;            /* cached positions, current token included */
    int n_top;            /* entries (M or fewer) */
    const int32_t *pos;   /* distinct, in [0, n_ctx), probability descending */
    const float *prob;
    float tail;           /* mass outside the entries, >= 0 */
} sfi_policy_obs;

/* What the prompt showed, per layer: the roped queries of the last n_tail
 * prompt positions [n_tail][n_heads][head_dim] (oldest first), the layer's
 * keys [n_prompt][n_kv_heads][head_dim], and (optional) H2O's accumulated
 * attention colsum[n_heads][n_prompt]: the sum over all prompt queries of
 * their causal softmax (sfi_policy_colsum_add builds it). Without colsum
 * H2O accumulates over the tail queries only (a noted proxy). */
typedef struct {
    int n_prompt;
    int n_tail;
    const float *q_tail;
    const float *k;
    const float *colsum;
    int budget;           /* B at the prompt's last position (SFI's prefill
                             Selector); 0 = n_sink + K + n_recent */
} sfi_policy_prompt;

/* Adds one prompt query's attention (q [n_heads][head_dim] at position
 * n_ctx - 1 over keys [n_ctx][n_kv][head_dim]) to colsum[n_heads][stride]. */
void sfi_policy_colsum_add(const sfi_policy_shape *s, const float *q, const float *k,
                           int n_ctx, float *colsum, int stride);

typedef struct {
    int step;                  /* decode step within the request, from 0 */
    int n_ctx;
    int budget;                /* B for this step (sfi_budget_positions) */
    int prev_trigger;          /* token x_{t-1} ends a sentence (t >= 1) */
    /* The next step is slow too, or there is none: SFI may skip the
     * Selector (same sets, less work). 0 when unknown. */
    int next_unused;
    /* Real path: q [n_heads][head_dim] roped, k [>= n_ctx][n_kv][head_dim]
     * of this layer. When both are set the policy uses them. */
    const float *q;
    const float *k;
    /* Trace path: obs [n_kv_heads] of this layer; qobs (optional)
     * [n_kv_heads][q_per_kv] the query heads' records (SFI's Selector
     * takes them as window queries). */
    const sfi_policy_obs *obs;
    const sfi_policy_obs *qobs;
    int q_per_kv;
    /* Kascade's reuse layers, when this object did not run the anchor
     * layer at this step: that layer's q and k (real path) or obs. */
    int (*layer_qk)(void *ctx, int layer, const float **q, const float **k);
    const sfi_policy_obs *(*layer_obs)(void *ctx, int layer, int kv_head);
    void *layer_ctx;
} sfi_policy_step;

/* A policy's set for one KV head at one step: [0, sink_end) and
 * [recent_begin, n_ctx) plus the positions marked in bits (a bitmap over
 * positions; only bits below recent_begin count), plus n_virtual positions
 * that are not among the step's trace entries (trace path only: identities
 * unknown, e.g. oracle top-B with B > M). size counts everything once.
 * dense: the step attended to all positions (full KV, SFI slow steps,
 * Kascade's layer 0, Quest's dense layers). */
typedef struct {
    int n_ctx;
    int dense;
    int sink_end;
    int recent_begin;
    const uint64_t *bits;
    int n_virtual;
    int size;
} sfi_policy_set;

static inline int sfi_policy_set_contains(const sfi_policy_set *s, int32_t pos)
{
    if (s->dense || pos < s->sink_end || pos >= s->recent_begin)
        return 1;
    return s->bits ? (int)((s->bits[pos >> 6] >> (pos & 63)) & 1u) : 0;
}

/* The set's named positions, ascending, into idx (room for n_ctx); *n
 * their count (virtual members are not named). */
void sfi_policy_set_indices(const sfi_policy_set *s, int32_t *idx, int *n);

/* Attention-mass recall of the set against obs: the entries' mass inside
 * the set plus the tail spread evenly over the positions outside the
 * entries (*lo: entries only, the tail counted as missed). *n_in: entries
 * inside. top_k: also counts how many of the first top_k entries are
 * inside (*n_in_top), the overlap with the oracle top set. */
double sfi_policy_set_recall(const sfi_policy_set *s, const sfi_policy_obs *o,
                             int top_k, double *lo, int *n_in, int *n_in_top);

/* ------------------------------------------------------------------ */
/* Policy instances                                                    */

typedef struct sfi_policy sfi_policy;

/* A policy for a model of the given shape (head_dim may be 0 for purely
 * trace-driven use) and at most max_ctx positions. calib: Kascade and FASA
 * (may be NULL: Kascade then plans from the first steps it sees and FASA
 * calibrates on its first step, both noted as proxies); kept by reference,
 * must outlive the policy. Per-layer state is allocated when a layer is
 * first used. */
SFI_NODISCARD sfi_status sfi_policy_create(sfi_policy_kind kind, const sfi_policy_config *cfg,
                                           const sfi_policy_shape *shape, int max_ctx,
                                           const sfi_policy_calib *calib, sfi_policy **out,
                                           sfi_error *err);
void sfi_policy_free(sfi_policy *p);
/* Starts a new request (forgets all state; the calibration stays). */
void sfi_policy_reset(sfi_policy *p);
sfi_policy_kind sfi_policy_get_kind(const sfi_policy *p);

/* The prompt of layer `layer` (after prefill, before step 0). */
SFI_NODISCARD sfi_status sfi_policy_prompt_run(sfi_policy *p, int layer,
                                               const sfi_policy_prompt *pr, sfi_error *err);

/* One step of one layer; sets[n_kv_heads] describe the sets and stay valid
 * until this layer's next step. *available = 0 when the policy cannot act
 * (Quest/FASA without q and K: sets not written). *slow (may be NULL): the
 * SFI kinds' step kind. */
SFI_NODISCARD sfi_status sfi_policy_run(sfi_policy *p, int layer, const sfi_policy_step *st,
                                        sfi_policy_set *sets, int *available, int *slow,
                                        sfi_error *err);

/* NULL when the policy ran its paper's rule on what it was given; else a
 * short text naming the proxy it used (e.g. "prompt attention: first
 * decode step's"), for reports. */
const char *sfi_policy_proxy_note(const sfi_policy *p);

/* Kascade: the anchor layers in use (n_anchors entries, ascending). */
int sfi_policy_kascade_anchor_list(const sfi_policy *p, int *anchors, int max);

/* LFPS internals, for tests: a table value (which = 0 vertical by
 * position, 1 slash by offset from the current position) of KV head kvh
 * in layer `layer`; the candidate count of the last step; 0 otherwise. */
double sfi_policy_lfps_table(const sfi_policy *p, int layer, int kvh, int which, int idx);
int sfi_policy_lfps_candidates(const sfi_policy *p, int layer, int kvh);
/* LFPS's table statistics: mean over n entries and kurtosis
 * sum d^4 / (sum d^2)^2 (d = entry - mean; 0 when all equal). */
void sfi_policy_lfps_moments(const double *tab, int n, double *mean, double *kurt);

/* Quest's page bound: per page of `page` positions of kv head kvh, the
 * elementwise min/max of the keys, score = sum_d max(q_d*min_d, q_d*max_d),
 * pooled by max over the query heads of the group. scores[n_pages]. */
void sfi_policy_quest_scores(const float *q, const float *k, int n_ctx, int n_heads,
                             int n_kv_heads, int head_dim, int kvh, int page, float *scores);

/* FASA's score of every position for one KV head: the dot product
 * restricted to the chunks in tip (chunk c = dims c and c + head_dim/2,
 * the rotate-half RoPE pairing of Qwen3/HF), summed over the group's
 * query heads. out[n_ctx]. */
void sfi_policy_fasa_scores(const float *q, const float *k, int n_ctx, int n_heads,
                            int n_kv_heads, int head_dim, int kvh, const int *tip, int n_tip,
                            float *out);

#endif
