/* Comparison policies of sfi(7) PEER METHODS for the trace analyzer: oracle
 * top-K, full KV, StreamingLLM, H2O, SnapKV, Quest, LFPS, Kascade, FASA and
 * SFI (whose selection is ref/sfi_selector.h's Selector, not a copy).
 *
 * One interface: a policy instance (sfi_peer) covers one layer and all its
 * KV heads; it is fed the layer's steps in order and answers, per KV head,
 * the set of positions that step would attend to at the given budget.
 *
 * What a policy sees of a step is what a full-level trace records: per KV
 * head the top-M positions of the step's dense attention with their
 * probabilities and the mass outside them (sfi_peer_obs), and, where the
 * trace has them, q/K snapshots. Positions outside the top-M are
 * indistinguishable to trace-driven policies; the analyzer counts them with
 * the tail mass spread evenly (see sfi_peer_set_recall).
 *
 * Budget: B positions per KV head per step, everything included (sink,
 * recent, selection); how each policy splits B is documented at its kind.
 * Cost per step is O(M log M + B) per head at most, never O(context) except
 * where stated (SFI's slow steps run the Selector over J; SnapKV ranks the
 * prompt once; snapshot steps).
 */
#ifndef SFI_POLICIES_H
#define SFI_POLICIES_H

#include <stdint.h>
#include "sfi_error.h"
#include "sfi_params.h"

typedef enum {
    SFI_PEER_ORACLE = 0, /* exact top-B of the step's dense attention */
    SFI_PEER_FULL,       /* dense every step */
    SFI_PEER_STREAMING,  /* sink n_sink + recent B - n_sink */
    SFI_PEER_H2O,        /* recent h2o_recent_frac*B + heavy hitters by
                            accumulated (renormalized) attention; evicted
                            positions never return */
    SFI_PEER_SNAPKV,     /* prompt ranking fixed at the first step from the
                            observation (pooled, radius snapkv_pool); keeps
                            the top B - n_recent of it plus recent n_recent */
    SFI_PEER_QUEST,      /* pages of quest_page tokens, top floor(B/page)
                            pages by the min/max key bound (needs q/K
                            snapshots); on trace-only steps the page bound is
                            replaced by the page's largest recorded
                            probability (an upper bound of real Quest) */
    SFI_PEER_LFPS,       /* decayed vertical/slash tables, candidates above
                            a*mean/kurtosis expanded by {-1,0,1,2}, exact
                            top-B inside the candidates */
    SFI_PEER_KASCADE,    /* anchors by DP on a calibration similarity; reuse
                            layers take the mapped anchor head's top-B */
    SFI_PEER_FASA,       /* N_tip RoPE chunks picked by contextual agreement
                            on the first snapshot; top-B by the chunk-restricted
                            score (needs q/K snapshots) */
    SFI_PEER_SFI,        /* sink + recent + Selector(K = B - n_sink - n_recent)
                            refreshed at slow steps (trigger policy of
                            ref/sfi_state.h); slow steps are dense */
    SFI_PEER_N_KINDS
} sfi_peer_kind;

const char *sfi_peer_kind_name(sfi_peer_kind k);
sfi_status sfi_peer_kind_parse(const char *name, sfi_peer_kind *k, sfi_error *err);
/* Parses a comma-separated list ("all" = every kind) into mask bits
 * (1u << kind). Unknown names are errors naming the name. */
sfi_status sfi_peer_set_parse_list(const char *list, unsigned *mask, sfi_error *err);
/* Whether the kind needs q/K snapshots to produce a set. */
int sfi_peer_kind_needs_snapshot(sfi_peer_kind k);

/* One step's dense attention of one KV head as a full-level trace records
 * it (query heads of the group pooled by the recorder). */
typedef struct {
    int n_ctx;            /* cached positions, current token included */
    int n_top;            /* entries (M or fewer) */
    const int32_t *pos;   /* distinct, in [0, n_ctx), probability descending */
    const float *prob;
    float tail;           /* mass outside the entries, >= 0 */
} sfi_peer_obs;

/* Parameters of every policy; sfi_peer_config_default gives sfi(7)'s
 * defaults (in brackets there) and ours. */
typedef struct {
    sfi_params prm;           /* n_sink, n_recent, T_max, Selector knobs */
    float h2o_recent_frac;    /* 0.5 */
    int snapkv_pool;          /* max-pool radius (kernel 2r+1 = 7): 3 */
    int quest_page;           /* 16 */
    float lfps_r;             /* decay 0.95 */
    float lfps_a;             /* threshold factor 0.2 */
    float lfps_sink_share;    /* 0.85 */
    float lfps_prune;         /* |Phi| below this is dropped (1e-7): keeps
                                 the tables O(touched) instead of O(context) */
    int kascade_anchors;      /* anchor layers incl. layer 0: 4 */
    int fasa_tip;             /* chunks kept: 16 (of head_dim/2) */
    int fasa_calib_k;         /* top-K of the agreement test: 64 */
} sfi_peer_config;

void sfi_peer_config_default(sfi_peer_config *c);
/* "key=value" for the fields above (h2o_recent_frac=0.5, ...) or any
 * sfi_params key. */
sfi_status sfi_peer_config_set(sfi_peer_config *c, const char *kv, sfi_error *err);

/* A policy's set for one KV head at one step: [0, sink_end) and
 * [recent_begin, n_ctx) plus the positions marked in bits (a bitmap over
 * positions; only bits below recent_begin count), plus n_virtual positions
 * that are not among the step's trace entries (identities unknown, e.g.
 * oracle top-B with B > M). size counts everything once. dense: the step
 * attended to all positions (full KV, SFI slow steps). mean_v: the policy
 * replaces this head's output by the mean value vector (LFPS sink heads);
 * the set is still the one it computed. */
typedef struct {
    int n_ctx;
    int dense;
    int sink_end;
    int recent_begin;
    const uint64_t *bits;
    int n_virtual;
    int size;
    int mean_v;
} sfi_peer_set;

static inline int sfi_peer_set_contains(const sfi_peer_set *s, int32_t pos)
{
    if (s->dense || pos < s->sink_end || pos >= s->recent_begin)
        return 1;
    return s->bits ? (int)((s->bits[pos >> 6] >> (pos & 63)) & 1u) : 0;
}

/* Attention-mass recall of the set against obs: the entries' mass inside
 * the set plus the tail spread evenly over the positions outside the
 * entries (*lo: entries only, the tail counted as missed). *n_in: entries
 * inside. top_k: also counts how many of the first top_k entries are
 * inside (*n_in_top), the overlap with the oracle top set. */
double sfi_peer_set_recall(const sfi_peer_set *s, const sfi_peer_obs *o,
                           int top_k, double *lo, int *n_in, int *n_in_top);

/* What a step hands every policy of one layer. */
typedef struct sfi_peer_step sfi_peer_step;
struct sfi_peer_step {
    int step;                  /* decode step within the request, from 0 */
    int n_ctx;
    int prev_trigger;          /* token x_{t-1} ends a sentence (t >= 1) */
    int budget;                /* B for this step */
    /* The next step is slow too, or there is none (the trace says so): a
     * selection made now would never be used, so SFI skips its Selector
     * (same sets, less work). 0 when unknown. */
    int next_unused;
    const sfi_peer_obs *obs;   /* [n_kv_heads] this layer */
    /* Optional (NULL when absent): the records of the query heads,
     * [n_kv_heads][q_per_kv] (query head h*q_per_kv + g). SFI's Selector
     * then takes them as its q_per_kv window queries. */
    const sfi_peer_obs *qobs;
    int q_per_kv;
    /* The same step's obs of another layer (Kascade); may be NULL when
     * there is no Kascade policy. */
    const sfi_peer_obs *(*layer_obs)(void *ctx, int layer, int kv_head);
    void *layer_obs_ctx;
    /* Optional snapshots (NULL when absent): q[n_heads][head_dim],
     * k[n_ctx][n_kv_heads][head_dim] (the cache of this layer). */
    const float *q;
    const float *k;
};

/* Kascade's plan for a model: anchor flags and, per (layer, kv head), the
 * anchor layer and head it reuses (itself at anchors). */
typedef struct {
    int n_layers, n_kv_heads;
    uint8_t *is_anchor;      /* [n_layers] */
    int *src_layer;          /* [n_layers] */
    int *src_head;           /* [n_layers][n_kv_heads] */
    double score;            /* summed similarity of the plan */
} sfi_peer_kascade_plan;

/* Anchor choice by dynamic programming: layer 0 is an anchor, n_anchors in
 * all (clipped to n_layers); layer b reuses the closest anchor a <= b;
 * maximizes sum_b sim[a(b)][b] (sim is n_layers x n_layers, row = anchor;
 * sim[a][a] is taken as 1). Ties keep the earlier anchor. anchors[] gets
 * the chosen layers ascending; returns the summed similarity. */
double sfi_peer_kascade_dp(const double *sim, int n_layers, int n_anchors, int *anchors);

/* Builds the plan from calibration steps: calib[s][layer][kv_head] obs.
 * sim(a->b, g->h) = min over steps of (mass of b/h inside a/g's top-k) /
 * (mass of b/h inside its own top-k); head map = argmax over g; layer
 * sim = mean over h of the best g. k = top_k entries. */
sfi_status sfi_peer_kascade_plan_build(const sfi_peer_obs *calib, int n_steps,
                                       int n_layers, int n_kv_heads, int top_k,
                                       int n_anchors, sfi_peer_kascade_plan *plan,
                                       sfi_error *err);
void sfi_peer_kascade_plan_free(sfi_peer_kascade_plan *plan);

/* Quest's page bound: per page of `page` positions of kv head kvh, the
 * elementwise min/max of the keys, score = sum_d max(q_d*min_d, q_d*max_d),
 * pooled by max over the query heads of the group. scores[n_pages]. */
void sfi_peer_quest_scores(const float *q, const float *k, int n_ctx, int n_heads,
                           int n_kv_heads, int head_dim, int kvh, int page,
                           float *scores);

/* FASA calibration for one KV head: chunk c covers dims (c, c + d/2) (the
 * rotate-half RoPE pairing of Qwen3/HF). For every chunk, the top-k of the
 * single-chunk score is compared with the full-head top-k (overlap count);
 * the n_tip best chunks (ties: lower chunk) are written ascending to tip.
 * Scores sum over the group's query heads. */
sfi_status sfi_peer_fasa_calibrate(const float *q, const float *k, int n_ctx,
                                   int n_heads, int n_kv_heads, int head_dim,
                                   int kvh, int top_k, int n_tip, int *tip,
                                   sfi_error *err);

typedef struct sfi_peer sfi_peer;

/* A policy instance for layer `layer` of a model with n_layers layers,
 * n_kv_heads KV heads (n_heads, head_dim for snapshots; 0 when the trace
 * has none) and at most max_ctx positions. plan: Kascade only (may be NULL
 * otherwise; copied by reference, must outlive the peer). */
sfi_status sfi_peer_create(sfi_peer_kind kind, const sfi_peer_config *cfg,
                           int layer, int n_layers, int n_kv_heads, int n_heads,
                           int head_dim, int max_ctx,
                           const sfi_peer_kascade_plan *plan, sfi_peer **out,
                           sfi_error *err);
void sfi_peer_free(sfi_peer *p);
/* Starts a new request (forgets all state). */
void sfi_peer_reset(sfi_peer *p);
sfi_peer_kind sfi_peer_get_kind(const sfi_peer *p);

/* Feeds one step; sets[kvh] describe the step's sets and stay valid until
 * the next call. *available = 0 when the policy cannot act on this step
 * (Quest/FASA without snapshots: sets are then not written). SFI: *slow
 * (may be NULL) tells whether the step was slow. */
sfi_status sfi_peer_step_run(sfi_peer *p, const sfi_peer_step *st, sfi_peer_set *sets,
                             int *available, int *slow, sfi_error *err);

/* LFPS's table value (which = 0 vertical by position, 1 slash by offset
 * from the current position) of head kvh, for tests; 0 for other kinds. */
double sfi_peer_lfps_table(const sfi_peer *p, int kvh, int which, int idx);

#endif
