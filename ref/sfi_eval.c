/* sfi-ref eval's harness; see sfi_eval.h.
 *
 * Runs: the prefix is prefilled once; full KV, then every (budget, policy)
 * pair, each from a copy of the prefix's cache. SFI runs through the decode
 * loop itself (sfi_decode_run_prefix with teacher forcing: the same
 * slow/fast steps, Selector and fast sets as sfi-ref run); every other
 * policy is an sfi_peer of ref/sfi_policies.h (one instance per layer)
 * asked at each step and layer for its sets, which the attend hook then
 * attends to.
 *
 * What a peer sees of a step: the real query and the layer's cached keys
 * (q/K snapshots), and, for the kinds whose rule reads attention weights
 * (oracle, H2O, SnapKV, LFPS, Kascade), the step's dense attention of the
 * layer pooled over each KV head's query heads (mean), every position
 * ranked (an sfi_peer_obs with n_top = n_ctx and no tail). Kascade's plan
 * is built per budget from the last KASCADE_CALIB prompt queries (the
 * minimum over them, as method.md section 8 says).
 *
 * Metrics use sfi_math's exp/log (no libm): log-softmax in float with a
 * double sum, KL and means accumulated in double. */
#include <config.h>

#include "sfi_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sfi_decode.h"
#include "sfi_math.h"
#include "sfi_state.h"

#define KASCADE_CALIB 16
#define EVAL_MAX_KV_HEADS 1024

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void sfi_eval_opts_default(sfi_eval_opts *o)
{
    memset(o, 0, sizeof *o);
    o->n_prefix = 8192;
    o->n_tokens = 512;
    static const double def[] = {0.02, 0.04, 0.06, 0.12, 0.27};
    o->n_shares = (int)(sizeof def / sizeof def[0]);
    memcpy(o->shares, def, sizeof def);
    o->policies = (1u << SFI_PEER_N_KINDS) - 1;
    sfi_peer_config_default(&o->cfg);
    o->backend = sfi_backend_available(SFI_BACKEND_BLAS) ? SFI_BACKEND_BLAS : SFI_BACKEND_SCALAR;
    o->n_boot = 1000;
    o->conf = 0.95;
    o->seed = 1;
}

sfi_status sfi_eval_parse_shares(const char *list, sfi_eval_opts *o, sfi_error *err)
{
    double v[SFI_EVAL_MAX_BUDGETS];
    int n = 0;
    const char *p = list;
    if (!*p)
        return sfi_error_set(err, SFI_EINVAL, "budgets: empty list");
    while (*p) {
        char *end;
        double x = strtod(p, &end);
        int pct = *end == '%';
        if (pct)
            end++;
        if (end == p || (*end && *end != ',') || !(x > 0.0) || x > (pct ? 100.0 : 1.0))
            return sfi_error_set(err, SFI_EINVAL,
                                 "budgets '%s': expected comma-separated shares in (0, 1] or "
                                 "percentages in (0, 100]%%",
                                 list);
        if (n == SFI_EVAL_MAX_BUDGETS)
            return sfi_error_set(err, SFI_EINVAL, "budgets '%s': more than %d", list,
                                 SFI_EVAL_MAX_BUDGETS);
        v[n++] = pct ? x / 100.0 : x;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p)
            return sfi_error_set(err, SFI_EINVAL, "budgets '%s': trailing comma", list);
    }
    memcpy(o->shares, v, sizeof(double) * (size_t)n);
    o->n_shares = n;
    return SFI_OK;
}

int sfi_eval_budget(double share, int n_prefix, int n_tokens)
{
    double ctx = (double)n_prefix + n_tokens;
    double b = share * ctx + 0.5;
    if (!(b >= 1.0))
        return 1;
    if (b >= ctx)
        return (int)ctx;
    return (int)b;
}

void sfi_eval_sfi_split(const sfi_params *prm, int B, int n_ctx_max, int *n_recent, int *K)
{
    int r = (B - prm->n_sink) / 2;
    if (r > prm->n_recent)
        r = prm->n_recent;
    if (B >= n_ctx_max)
        r = B - prm->n_sink;
    if (r < 1)
        r = 1;
    int k = B - prm->n_sink - r;
    if (k < 1)
        k = 1;
    *n_recent = r;
    *K = k;
}

void sfi_eval_result_free(sfi_eval_result *r)
{
    if (!r)
        return;
    free(r->rows);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- */

typedef struct {
    const sfi_qwen3 *m;
    const sfi_model_config *c;
    const sfi_eval_opts *o;
    const int32_t *tok;
    int L, N, V, nl, nh, nkv, hd, cap;
    sfi_decode_prefix pre;
    sfi_kv_cache work;
    /* full KV */
    float *full_lp;        /* [N][V] */
    int32_t *full_arg;     /* [N] */
    double *full_nll;      /* [N] */
    /* one run */
    float *logits, *lp;    /* [V] */
    double *nll, *kl;      /* [N] */
    uint8_t *agree;        /* [N] */
    int64_t attended, attend_den;
    int n_slow;
    sfi_error *err;
} ectx;

static void log_softmax(const float *x, int n, float *lp)
{
    float mx = sfi_max(x, (size_t)n);
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += (double)sfi_expf(x[i] - mx);
    float lse = mx + sfi_logf((float)s);
    for (int i = 0; i < n; i++)
        lp[i] = x[i] - lse;
}

/* Scores step s (1..N) of the current run from its logits. */
static void score(ectx *e, int s, const float *logits)
{
    int t = s - 1;
    log_softmax(logits, e->V, e->lp);
    e->nll[t] = -(double)e->lp[e->tok[e->L + s]];
    const float *lf = e->full_lp + (size_t)t * e->V;
    double kl = 0.0;
    for (int i = 0; i < e->V; i++) {
        double d = (double)lf[i] - (double)e->lp[i];
        if (d != 0.0)
            kl += (double)sfi_expf(lf[i]) * d;
    }
    e->kl[t] = kl > 0.0 ? kl : 0.0;
    e->agree[t] = sfi_argmax(logits, e->V) == e->full_arg[t];
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile bootstrap of the mean of d[0..n): R resamples of n tokens
 * drawn with replacement. */
static sfi_status bootstrap(const double *d, int n, int R, double conf, uint64_t seed,
                            double *lo, double *hi, sfi_error *err)
{
    if (R < 1 || n < 1) {
        *lo = *hi = NAN;
        return SFI_OK;
    }
    double *means = malloc(sizeof(double) * (size_t)R);
    if (!means)
        return sfi_error_set(err, SFI_ENOMEM, "bootstrap: out of memory");
    uint64_t st = seed;
    for (int r = 0; r < R; r++) {
        double s = 0.0;
        for (int i = 0; i < n; i++) {
            double u = (double)(splitmix64(&st) >> 11) * (1.0 / 9007199254740992.0);
            int k = (int)(u * n);
            s += d[k < n ? k : n - 1];
        }
        means[r] = s / n;
    }
    qsort(means, (size_t)R, sizeof(double), cmp_double);
    double a = (1.0 - conf) / 2.0;
    int il = (int)(a * R), ih = (int)((1.0 - a) * R + 0.999999) - 1;
    if (il < 0)
        il = 0;
    if (ih > R - 1)
        ih = R - 1;
    if (ih < il)
        ih = il;
    *lo = means[il];
    *hi = means[ih];
    free(means);
    return SFI_OK;
}

/* ---------------------------------------------------------------- */
/* Full KV                                                            */

static sfi_status run_full(ectx *e)
{
    sfi_status rc = sfi_kv_cache_copy(&e->work, &e->pre.kv, e->err);
    for (int s = 1; s <= e->N && !rc; s++) {
        rc = sfi_qwen3_step(e->m, e->o->backend, &e->work, e->tok[e->L + s - 1], NULL, NULL,
                            e->logits, e->err);
        if (rc)
            break;
        int t = s - 1;
        float *lp = e->full_lp + (size_t)t * e->V;
        log_softmax(e->logits, e->V, lp);
        e->full_nll[t] = -(double)lp[e->tok[e->L + s]];
        e->full_arg[t] = sfi_argmax(e->logits, e->V);
    }
    return rc;
}

/* ---------------------------------------------------------------- */
/* SFI through the decode loop                                        */

static sfi_status sfi_on_step(void *user, const sfi_decode_step_info *si, sfi_error *err)
{
    (void)err;
    ectx *e = user;
    if (si->step < 1)
        return SFI_OK;
    score(e, si->step, si->logits);
    e->attended += si->attended;
    e->attend_den += (int64_t)si->n_ctx * e->nkv * e->nl;
    if (si->kind == SFI_STEP_SLOW)
        e->n_slow++;
    return SFI_OK;
}

static sfi_status run_sfi(ectx *e, int B)
{
    sfi_decode_opts o;
    sfi_decode_opts_default(&o);
    o.mode = SFI_DECODE_SFI;
    o.params = e->o->cfg.prm;
    sfi_eval_sfi_split(&e->o->cfg.prm, B, e->L + e->N, &o.params.n_recent, &o.params.K);
    o.trigger = SFI_TRIG_SFI;
    o.is_trigger = e->o->is_trigger;
    o.n_trigger_vocab = e->o->n_trigger_vocab;
    o.max_new = e->N + 1;
    o.stop_token = -1;
    o.backend = e->o->backend;
    o.forced = e->tok + e->L;
    o.n_forced = e->N;
    sfi_decode_observer obs = {.user = e, .on_step = sfi_on_step};
    sfi_decode_result res;
    sfi_status rc = sfi_decode_run_prefix(e->m, &o, &e->pre, &obs, &res, e->err);
    if (rc == SFI_OK)
        sfi_decode_result_free(&res);
    return rc;
}

/* ---------------------------------------------------------------- */
/* Peers of ref/sfi_policies.h                                        */

typedef struct {
    float p;
    int32_t i;
} pv;

static int cmp_pv_desc(const void *a, const void *b)
{
    const pv *x = a, *y = b;
    if (x->p > y->p) return -1;
    if (x->p < y->p) return 1;
    return (x->i > y->i) - (x->i < y->i);
}

int sfi_eval_kind_reads_attention(sfi_peer_kind k)
{
    return k == SFI_PEER_ORACLE || k == SFI_PEER_H2O || k == SFI_PEER_SNAPKV ||
           k == SFI_PEER_LFPS || k == SFI_PEER_KASCADE;
}

struct sfi_eval_policy {
    sfi_peer_kind kind;
    int nl, nh, nkv, hd, cap;
    int n_sink;
    sfi_peer **peers;       /* [nl] */
    sfi_peer_obs *obs;      /* [nl][nkv] of the current step */
    int32_t *obs_pos;       /* [nl][nkv][cap] */
    float *obs_prob;
    pv *sortbuf;            /* [cap] */
    int32_t *idx;           /* [nkv][cap] */
    int *n_idx;             /* [nkv] */
    uint8_t *mean_v;        /* [nkv] */
    sfi_peer_set *sets;     /* [nkv] */
};

void sfi_eval_policy_free(sfi_eval_policy *p)
{
    if (!p)
        return;
    if (p->peers)
        for (int l = 0; l < p->nl; l++)
            sfi_peer_free(p->peers[l]);
    free(p->peers);
    free(p->obs);
    free(p->obs_pos);
    free(p->obs_prob);
    free(p->sortbuf);
    free(p->idx);
    free(p->n_idx);
    free(p->mean_v);
    free(p->sets);
    free(p);
}

sfi_status sfi_eval_policy_create(sfi_peer_kind kind, const sfi_peer_config *cfg, int n_layers,
                                  int n_heads, int n_kv_heads, int head_dim, int max_ctx,
                                  const sfi_peer_kascade_plan *plan, sfi_eval_policy **out,
                                  sfi_error *err)
{
    *out = NULL;
    if (kind == SFI_PEER_SFI || kind == SFI_PEER_FULL || (unsigned)kind >= SFI_PEER_N_KINDS)
        return sfi_error_set(err, SFI_EINVAL, "eval policy: %s is not a peer policy",
                             sfi_peer_kind_name(kind));
    if (n_layers < 1 || n_kv_heads < 1 || n_kv_heads > EVAL_MAX_KV_HEADS || n_heads < 1 ||
        n_heads % n_kv_heads || head_dim < 1 || max_ctx < 1)
        return sfi_error_set(err, SFI_EINVAL, "eval policy: bad shape (%d layers, %d/%d heads, "
                             "head_dim %d, context %d)", n_layers, n_heads, n_kv_heads,
                             head_dim, max_ctx);
    sfi_eval_policy *p = calloc(1, sizeof *p);
    if (!p)
        return sfi_error_set(err, SFI_ENOMEM, "eval policy: out of memory");
    p->kind = kind;
    p->nl = n_layers;
    p->nh = n_heads;
    p->nkv = n_kv_heads;
    p->hd = head_dim;
    p->cap = max_ctx;
    p->n_sink = cfg->prm.n_sink;
    size_t cap = (size_t)max_ctx;
    p->peers = calloc((size_t)n_layers, sizeof *p->peers);
    p->obs = calloc((size_t)n_layers * n_kv_heads, sizeof *p->obs);
    p->sortbuf = malloc(sizeof(pv) * cap);
    p->idx = malloc(sizeof(int32_t) * (size_t)n_kv_heads * cap);
    p->n_idx = calloc((size_t)n_kv_heads, sizeof(int));
    p->mean_v = calloc((size_t)n_kv_heads, 1);
    p->sets = calloc((size_t)n_kv_heads, sizeof *p->sets);
    int ok = p->peers && p->obs && p->sortbuf && p->idx && p->n_idx && p->mean_v && p->sets;
    if (ok && sfi_eval_kind_reads_attention(kind)) {
        p->obs_pos = malloc(sizeof(int32_t) * (size_t)n_layers * n_kv_heads * cap);
        p->obs_prob = malloc(sizeof(float) * (size_t)n_layers * n_kv_heads * cap);
        ok = p->obs_pos && p->obs_prob;
    }
    if (!ok) {
        sfi_eval_policy_free(p);
        return sfi_error_set(err, SFI_ENOMEM, "eval policy %s: out of memory",
                             sfi_peer_kind_name(kind));
    }
    for (int l = 0; l < n_layers; l++) {
        sfi_status rc = sfi_peer_create(kind, cfg, l, n_layers, n_kv_heads, n_heads, head_dim,
                                        max_ctx, kind == SFI_PEER_KASCADE ? plan : NULL,
                                        &p->peers[l], err);
        if (rc) {
            sfi_eval_policy_free(p);
            return rc;
        }
    }
    *out = p;
    return SFI_OK;
}

/* The pooled (mean over the KV head's query heads), ranked attention of
 * one KV head from probabilities probs[nh][n] (rows of length ld). */
static void make_obs(pv *buf, int nh, int nkv, int h, const float *probs, size_t ld, int n,
                     sfi_peer_obs *o, int32_t *pos, float *prob)
{
    int G = nh / nkv;
    for (int j = 0; j < n; j++) {
        float s = 0.0f;
        for (int g = 0; g < G; g++)
            s += probs[(size_t)(h * G + g) * ld + j];
        buf[j].p = s / (float)G;
        buf[j].i = j;
    }
    qsort(buf, (size_t)n, sizeof(pv), cmp_pv_desc);
    for (int j = 0; j < n; j++) {
        pos[j] = buf[j].i;
        prob[j] = buf[j].p;
    }
    o->n_ctx = n;
    o->n_top = n;
    o->pos = pos;
    o->prob = prob;
    o->tail = 0.0f;
}

static const sfi_peer_obs *layer_obs(void *ctx, int layer, int kv_head)
{
    sfi_eval_policy *p = ctx;
    if (layer < 0 || layer >= p->nl || kv_head < 0 || kv_head >= p->nkv)
        return NULL;
    return &p->obs[(size_t)layer * p->nkv + kv_head];
}

static void set_dense(sfi_peer_set *s, int n_ctx)
{
    memset(s, 0, sizeof *s);
    s->n_ctx = n_ctx;
    s->dense = 1;
    s->recent_begin = n_ctx;
    s->size = n_ctx;
}

/* Positions of a set, ascending, into idx; returns the count. */
static int set_positions(const sfi_peer_set *s, int n_ctx, int32_t *idx)
{
    int n = 0;
    if (s->dense) {
        for (int j = 0; j < n_ctx; j++)
            idx[n++] = j;
        return n;
    }
    int se = s->sink_end < n_ctx ? s->sink_end : n_ctx;
    int rb = s->recent_begin < n_ctx ? s->recent_begin : n_ctx;
    if (rb < se)
        rb = se;
    for (int j = 0; j < se; j++)
        idx[n++] = j;
    if (s->bits)
        for (int w = se >> 6; rb > se && w <= (rb - 1) >> 6; w++) {
            uint64_t b = s->bits[w];
            while (b) {
                int j = (w << 6) + __builtin_ctzll(b);
                b &= b - 1;
                if (j >= se && j < rb)
                    idx[n++] = j;
            }
        }
    for (int j = rb; j < n_ctx; j++)
        idx[n++] = j;
    return n;
}

sfi_status sfi_eval_policy_sets(sfi_eval_policy *p, const sfi_eval_layer_step *ls,
                                const int32_t **idx, const int **n_idx, const uint8_t **mean_v,
                                sfi_error *err)
{
    int layer = ls->layer, n_ctx = ls->n_ctx, nkv = p->nkv;
    if (layer < 0 || layer >= p->nl || n_ctx < 1 || n_ctx > p->cap || ls->budget < 1 ||
        !ls->q || !ls->k || (sfi_eval_kind_reads_attention(p->kind) && !ls->probs))
        return sfi_error_set(err, SFI_EINVAL, "eval policy %s: bad step (layer %d, context %d, "
                             "budget %d)", sfi_peer_kind_name(p->kind), layer, n_ctx,
                             ls->budget);
    if (ls->probs)
        for (int h = 0; h < nkv; h++) {
            size_t i = (size_t)layer * nkv + h;
            make_obs(p->sortbuf, p->nh, nkv, h, ls->probs, (size_t)n_ctx, n_ctx, &p->obs[i],
                     p->obs_pos + i * p->cap, p->obs_prob + i * p->cap);
        }
    sfi_peer_step st;
    memset(&st, 0, sizeof st);
    st.step = ls->step;
    st.n_ctx = n_ctx;
    st.prev_trigger = ls->prev_trigger;
    st.budget = ls->budget;
    st.obs = ls->probs ? &p->obs[(size_t)layer * nkv] : NULL;
    st.layer_obs = layer_obs;
    st.layer_obs_ctx = p;
    st.q = ls->q;
    st.k = ls->k;
    int avail = 1;
    sfi_status rc = sfi_peer_step_run(p->peers[layer], &st, p->sets, &avail, NULL, err);
    if (rc)
        return sfi_error_prefix(err, "policy %s, layer %d, step %d", sfi_peer_kind_name(p->kind),
                                layer, ls->step);
    if (!avail)
        return sfi_error_set(err, SFI_EINVAL, "policy %s: no set at layer %d, step %d",
                             sfi_peer_kind_name(p->kind), layer, ls->step);
    if (ls->budget >= n_ctx)
        for (int h = 0; h < nkv; h++)
            set_dense(&p->sets[h], n_ctx);
    for (int h = 0; h < nkv; h++) {
        const sfi_peer_set *s = &p->sets[h];
        if (s->n_virtual > 0)
            return sfi_error_set(err, SFI_EINVAL,
                                 "policy %s: %d positions of unknown identity at layer %d",
                                 sfi_peer_kind_name(p->kind), s->n_virtual, layer);
        p->n_idx[h] = set_positions(s, n_ctx, p->idx + (size_t)h * p->cap);
        p->mean_v[h] = (uint8_t)(s->mean_v != 0);
    }
    *idx = p->idx;
    *n_idx = p->n_idx;
    *mean_v = p->mean_v;
    return SFI_OK;
}

/* The harness's side of a peer run. */
typedef struct {
    ectx *e;
    sfi_eval_policy *pol;
    int budget, step, prev_trigger;
    float *logits_l;        /* [nh][cap] */
    float *dense_out;       /* [nh*hd] */
} pctx;

static sfi_status peer_attend(void *user, int layer, const float *q, const sfi_kv_cache *kv,
                              int n_ctx, float *out, sfi_error *err)
{
    pctx *p = user;
    ectx *e = p->e;
    int nkv = e->nkv, G = e->nh / nkv, hd = e->hd;
    sfi_status rc;
    int have_dense = 0;
    if (sfi_eval_kind_reads_attention(p->pol->kind)) {
        rc = sfi_qwen3_attn_dense(e->m, e->o->backend, layer, q, kv, n_ctx, p->dense_out,
                                  p->logits_l, err);
        if (rc)
            return rc;
        have_dense = 1;
        for (int h = 0; h < e->nh; h++)
            sfi_softmax(p->logits_l + (size_t)h * n_ctx, (size_t)n_ctx);
    }
    sfi_eval_layer_step ls = {.layer = layer, .step = p->step, .n_ctx = n_ctx,
                              .budget = p->budget, .prev_trigger = p->prev_trigger, .q = q,
                              .k = sfi_kv_k(kv, layer), .probs = have_dense ? p->logits_l : NULL};
    const int32_t *idx;
    const int *n_idx;
    const uint8_t *mean_v;
    if ((rc = sfi_eval_policy_sets(p->pol, &ls, &idx, &n_idx, &mean_v, err)))
        return rc;
    int all = 1;
    const int32_t *ix[EVAL_MAX_KV_HEADS];
    int nn[EVAL_MAX_KV_HEADS];
    static const int32_t zero = 0;
    for (int h = 0; h < nkv; h++) {
        e->attended += n_idx[h];
        all = all && n_idx[h] == n_ctx && !mean_v[h];
        /* An empty set attends to nothing: its heads' output is zero (a
         * dummy position keeps the sparse call well formed; its output is
         * dropped below). */
        ix[h] = n_idx[h] ? idx + (size_t)h * e->cap : &zero;
        nn[h] = n_idx[h] ? n_idx[h] : 1;
    }
    e->attend_den += (int64_t)n_ctx * nkv;
    if (all) {
        if (have_dense) {
            memcpy(out, p->dense_out, (size_t)e->nh * hd * sizeof(float));
            return SFI_OK;
        }
        return sfi_qwen3_attn_dense(e->m, e->o->backend, layer, q, kv, n_ctx, out, NULL, err);
    }
    if ((rc = sfi_qwen3_attn_sparse(e->m, e->o->backend, layer, q, kv, n_ctx, ix, nn, out, err)))
        return rc;
    const float *V = sfi_kv_v(kv, layer);
    for (int h = 0; h < nkv; h++) {
        float *og = out + (size_t)h * G * hd;
        if (!n_idx[h]) {
            memset(og, 0, (size_t)G * hd * sizeof(float));
        } else if (mean_v[h]) {
            /* LFPS sink head: the mean value vector over its set */
            for (int c = 0; c < hd; c++) {
                float s = 0.0f;
                for (int i = 0; i < n_idx[h]; i++)
                    s += V[((size_t)ix[h][i] * nkv + h) * hd + c];
                s /= (float)n_idx[h];
                for (int g = 0; g < G; g++)
                    og[(size_t)g * hd + c] = s;
            }
        }
    }
    return SFI_OK;
}

/* Kascade's plan at budget B from the last prompt queries' dense
 * attention (top_k = B). */
static sfi_status kascade_plan(ectx *e, int B, sfi_peer_kascade_plan *plan)
{
    int S = e->pre.n_queries < KASCADE_CALIB ? e->pre.n_queries : KASCADE_CALIB;
    int L = e->nl, H = e->nkv;
    size_t n = (size_t)S * L * H;
    sfi_peer_obs *cal = malloc(sizeof *cal * n);
    int32_t *pos = malloc(sizeof(int32_t) * n * e->L);
    float *prob = malloc(sizeof(float) * n * e->L);
    float *probs = malloc(sizeof(float) * (size_t)e->nh * e->L);
    float *out = malloc(sizeof(float) * (size_t)e->nh * e->hd);
    pv *buf = malloc(sizeof(pv) * (size_t)e->L);
    sfi_status rc = SFI_OK;
    if (!cal || !pos || !prob || !probs || !out || !buf) {
        rc = sfi_error_set(e->err, SFI_ENOMEM, "kascade: out of memory for calibration");
        goto out;
    }
    size_t qd = (size_t)e->nh * e->hd;
    for (int s = 0; s < S && !rc; s++) {
        int qp = e->L - S + s;  /* query position; it sees qp + 1 keys */
        for (int l = 0; l < L && !rc; l++) {
            const float *q = e->pre.qhist + ((size_t)l * e->pre.n_queries +
                                             (size_t)(qp % e->pre.n_queries)) * qd;
            rc = sfi_qwen3_attn_dense(e->m, e->o->backend, l, q, &e->pre.kv, qp + 1, out, probs,
                                      e->err);
            for (int h = 0; h < e->nh && !rc; h++)
                sfi_softmax(probs + (size_t)h * (qp + 1), (size_t)(qp + 1));
            for (int h = 0; h < H && !rc; h++) {
                size_t i = ((size_t)s * L + l) * H + h;
                make_obs(buf, e->nh, H, h, probs, (size_t)(qp + 1), qp + 1, &cal[i],
                         pos + i * e->L, prob + i * e->L);
            }
        }
    }
    if (!rc)
        rc = sfi_peer_kascade_plan_build(cal, S, L, H, B, e->o->cfg.kascade_anchors, plan,
                                         e->err);
out:
    free(cal);
    free(pos);
    free(prob);
    free(probs);
    free(out);
    free(buf);
    return rc;
}

static sfi_status run_peer(ectx *e, sfi_peer_kind kind, int B, sfi_eval_result *res)
{
    pctx p;
    memset(&p, 0, sizeof p);
    p.e = e;
    p.budget = B;
    p.logits_l = malloc(sizeof(float) * (size_t)e->nh * e->cap);
    p.dense_out = malloc(sizeof(float) * (size_t)e->nh * e->hd);
    sfi_peer_kascade_plan plan;
    memset(&plan, 0, sizeof plan);
    sfi_status rc = SFI_OK;
    if (!p.logits_l || !p.dense_out) {
        rc = sfi_error_set(e->err, SFI_ENOMEM, "policy %s: out of memory",
                           sfi_peer_kind_name(kind));
        goto out;
    }
    if (kind == SFI_PEER_KASCADE) {
        if ((rc = kascade_plan(e, B, &plan)))
            goto out;
        res->n_kascade_anchors = 0;
        for (int l = 0; l < e->nl && res->n_kascade_anchors < 64; l++)
            if (plan.is_anchor[l])
                res->kascade_anchors[res->n_kascade_anchors++] = l;
    }
    if ((rc = sfi_eval_policy_create(kind, &e->o->cfg, e->nl, e->nh, e->nkv, e->hd, e->cap,
                                     &plan, &p.pol, e->err)))
        goto out;
    if ((rc = sfi_kv_cache_copy(&e->work, &e->pre.kv, e->err)))
        goto out;
    for (int s = 1; s <= e->N && !rc; s++) {
        int32_t in = e->tok[e->L + s - 1];
        p.step = s - 1;
        p.prev_trigger = e->o->is_trigger && in >= 0 && in < e->o->n_trigger_vocab &&
                         e->o->is_trigger[in];
        rc = sfi_qwen3_step(e->m, e->o->backend, &e->work, in, peer_attend, &p, e->logits,
                            e->err);
        if (!rc)
            score(e, s, e->logits);
    }
out:
    sfi_eval_policy_free(p.pol);
    sfi_peer_kascade_plan_free(&plan);
    free(p.logits_l);
    free(p.dense_out);
    return rc;
}

/* ---------------------------------------------------------------- */

/* ---------------------------------------------------------------- */

static void ectx_free(ectx *e)
{
    sfi_decode_prefix_free(&e->pre);
    sfi_kv_cache_free(&e->work);
    free(e->full_lp);
    free(e->full_arg);
    free(e->full_nll);
    free(e->logits);
    free(e->lp);
    free(e->nll);
    free(e->kl);
    free(e->agree);
}

sfi_status sfi_eval_run(const sfi_qwen3 *m, const sfi_eval_opts *o, const int32_t *tokens,
                        int n_text, sfi_eval_result *res, sfi_error *err)
{
    memset(res, 0, sizeof *res);
    const sfi_model_config *c = sfi_qwen3_config(m);
    if (o->n_prefix < 1 || o->n_tokens < 1)
        return sfi_error_set(err, SFI_EINVAL, "eval: prefix %d and tokens %d must be >= 1",
                             o->n_prefix, o->n_tokens);
    if ((long)o->n_prefix + o->n_tokens + 1 > n_text)
        return sfi_error_set(err, SFI_ERANGE,
                             "eval: the text has %d tokens; a prefix of %d and %d scored "
                             "tokens need %ld",
                             n_text, o->n_prefix, o->n_tokens,
                             (long)o->n_prefix + o->n_tokens + 1);
    if ((long)o->n_prefix + o->n_tokens > c->max_position_embeddings)
        return sfi_error_set(err, SFI_ERANGE,
                             "eval: prefix %d + %d tokens exceeds the model's "
                             "max_position_embeddings %d",
                             o->n_prefix, o->n_tokens, c->max_position_embeddings);
    if (o->n_shares < 1 || o->n_shares > SFI_EVAL_MAX_BUDGETS)
        return sfi_error_set(err, SFI_EINVAL, "eval: %d budgets (1..%d)", o->n_shares,
                             SFI_EVAL_MAX_BUDGETS);
    for (int i = 0; i < o->n_shares; i++)
        if (!(o->shares[i] > 0.0 && o->shares[i] <= 1.0))
            return sfi_error_set(err, SFI_EINVAL, "eval: budget share %g outside (0, 1]",
                                 o->shares[i]);
    if (o->n_boot < 0 || !(o->conf > 0.0 && o->conf < 1.0))
        return sfi_error_set(err, SFI_EINVAL, "eval: bootstrap %d resamples at level %g",
                             o->n_boot, o->conf);
    if (c->num_key_value_heads > EVAL_MAX_KV_HEADS)
        return sfi_error_set(err, SFI_EUNSUPPORTED, "eval: %d KV heads (up to %d)",
                             c->num_key_value_heads, EVAL_MAX_KV_HEADS);
    sfi_status rc = sfi_params_validate(&o->cfg.prm, err);
    if (rc)
        return rc;
    for (int i = 0; i < o->n_prefix + o->n_tokens + 1; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return sfi_error_set(err, SFI_ERANGE,
                                 "eval: token %d (id %d) outside the vocabulary [0, %d)", i,
                                 (int)tokens[i], c->vocab_size);
    /* full KV is the reference every row is compared with, not a row */
    unsigned mask = o->policies & ((1u << SFI_PEER_N_KINDS) - 1) & ~(1u << SFI_PEER_FULL);

    double t0 = now_s(), c0 = cpu_s();
    ectx e;
    memset(&e, 0, sizeof e);
    e.m = m;
    e.c = c;
    e.o = o;
    e.tok = tokens;
    e.L = o->n_prefix;
    e.N = o->n_tokens;
    e.V = c->vocab_size;
    e.nl = c->num_hidden_layers;
    e.nh = c->num_attention_heads;
    e.nkv = c->num_key_value_heads;
    e.hd = c->head_dim;
    e.cap = e.L + e.N;
    e.err = err;
    size_t N = (size_t)e.N, V = (size_t)e.V;
    e.full_lp = malloc(sizeof(float) * N * V);
    e.full_arg = malloc(sizeof(int32_t) * N);
    e.full_nll = malloc(sizeof(double) * N);
    e.logits = malloc(sizeof(float) * V);
    e.lp = malloc(sizeof(float) * V);
    e.nll = malloc(sizeof(double) * N);
    e.kl = malloc(sizeof(double) * N);
    e.agree = malloc(N);
    int n_kinds = 0;
    for (int k = 0; k < SFI_PEER_N_KINDS; k++)
        n_kinds += (mask >> k) & 1u;
    res->rows = calloc((size_t)o->n_shares * (n_kinds ? n_kinds : 1), sizeof *res->rows);
    double *delta = malloc(sizeof(double) * N);
    if (!e.full_lp || !e.full_arg || !e.full_nll || !e.logits || !e.lp || !e.nll || !e.kl ||
        !e.agree || !res->rows || !delta) {
        rc = sfi_error_set(err, SFI_ENOMEM, "eval: out of memory (%d tokens x vocabulary %d)",
                           e.N, e.V);
        goto fail;
    }
    res->n_prefix = e.L;
    res->n_tokens = e.N;
    if ((rc = sfi_kv_cache_init(&e.work, c, e.cap, err)))
        goto fail;
    {
        int nq = o->cfg.prm.W_prefill > o->cfg.prm.W_decode ? o->cfg.prm.W_prefill
                                                            : o->cfg.prm.W_decode;
        if (nq < KASCADE_CALIB)
            nq = KASCADE_CALIB;
        if (o->progress)
            fprintf(o->progress, "eval: prefilling %d tokens (%s backend)\n", e.L,
                    sfi_backend_name(o->backend));
        if ((rc = sfi_decode_prefix_build(m, o->backend, tokens, e.L, e.L, nq, &e.pre, err)))
            goto fail;
    }
    res->prefill_seconds = e.pre.seconds;
    res->prefill_cpu_seconds = e.pre.cpu_seconds;
    double ts = now_s();
    if ((rc = run_full(&e)))
        goto fail;
    res->full_seconds = now_s() - ts;
    double fs = 0.0;
    for (int t = 0; t < e.N; t++)
        fs += e.full_nll[t];
    res->full_nll = fs / e.N;
    res->full_ppl = (double)sfi_expf((float)res->full_nll);
    if (o->progress)
        fprintf(o->progress, "eval: prefill %.1f s; full KV: NLL %.4f, perplexity %.3f (%.1f s)\n",
                res->prefill_seconds, res->full_nll, res->full_ppl, res->full_seconds);

    for (int b = 0; b < o->n_shares; b++) {
        int B = sfi_eval_budget(o->shares[b], e.L, e.N);
        for (int k = 0; k < SFI_PEER_N_KINDS; k++) {
            if (!((mask >> k) & 1u))
                continue;
            sfi_eval_row *r = &res->rows[res->n_rows];
            r->kind = (sfi_peer_kind)k;
            r->share = o->shares[b];
            r->budget = B;
            e.attended = e.attend_den = 0;
            e.n_slow = 0;
            double r0 = now_s(), rc0 = cpu_s();
            if (k == SFI_PEER_SFI) {
                rc = run_sfi(&e, B);
            } else {
                rc = run_peer(&e, (sfi_peer_kind)k, B, res);
            }
            if (rc) {
                sfi_error_prefix(err, "%s at budget %g", sfi_peer_kind_name((sfi_peer_kind)k),
                                 o->shares[b]);
                goto fail;
            }
            r->seconds = now_s() - r0;
            r->cpu_seconds = cpu_s() - rc0;
            double sn = 0.0, sk = 0.0, kmax = 0.0;
            int agree = 0;
            for (int t = 0; t < e.N; t++) {
                sn += e.nll[t];
                sk += e.kl[t];
                if (e.kl[t] > kmax)
                    kmax = e.kl[t];
                agree += e.agree[t];
                delta[t] = e.nll[t] - e.full_nll[t];
            }
            r->nll = sn / e.N;
            r->ppl = (double)sfi_expf((float)r->nll);
            r->dnll = r->nll - res->full_nll;
            r->kl = sk / e.N;
            r->kl_max = kmax;
            r->top1 = (double)agree / e.N;
            r->retained = e.attend_den ? (double)e.attended / (double)e.attend_den : 1.0;
            r->slow_fraction = k == SFI_PEER_SFI ? (double)e.n_slow / e.N : -1.0;
            if ((rc = bootstrap(delta, e.N, o->n_boot, o->conf, o->seed, &r->dnll_lo,
                                &r->dnll_hi, err)))
                goto fail;
            res->n_rows++;
            if (o->progress)
                fprintf(o->progress,
                        "eval: %-9s budget %5.1f%% (B %d): retained %.4f, NLL %.4f (%+.4f), "
                        "KL %.5f, top-1 %.3f (%.1f s)\n",
                        sfi_peer_kind_name(r->kind), 100.0 * r->share, B, r->retained, r->nll,
                        r->dnll, r->kl, r->top1, r->seconds);
        }
    }
    res->seconds = now_s() - t0;
    res->cpu_seconds = cpu_s() - c0;
    free(delta);
    ectx_free(&e);
    return SFI_OK;
fail:
    free(delta);
    ectx_free(&e);
    sfi_eval_result_free(res);
    return rc;
}
